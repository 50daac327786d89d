//! Kernel lock contention: `lock:contention_begin` / `contention_end` (tp_btf where possible).
//! Per cgroup: wait count and time by lock kind; per contended call site (a kernel stack), the
//! same, for the agent to symbolize.
//!
//! As in the kernel's own `perf lock contention` BPF program, a spinning waiter's start time
//! lives in a per-CPU slot (it cannot sleep or migrate while it spins) and a sleeping waiter's
//! in a per-thread slot. A mutex reports `MUTEX|SPIN` before optimistic spinning and `MUTEX`
//! again before it sleeps, with one `contention_end`: the first begin's time is kept.

use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map, tracepoint},
    maps::{LruHashMap, PerCpuArray, PerCpuHashMap, StackTrace},
    programs::{BtfTracePointContext, TracePointContext, tracing::StackIdContext as _},
};
use stormwatch_common::{
    LockInflight, LockSiteKey, LockSiteValue, LockStats, ProbeError, lcb, lock_kind, lock_kind_of,
};

use crate::shared::{BPF_ANY, count_error, global_u32, per_cpu_slot};

const MAX_CGROUPS: u32 = 4096;
const MAX_SLEEPERS: u32 = 65536;
const MAX_SITES: u32 = 4096;
const MAX_STACKS: u32 = 4096;

#[map(name = "CGROUP_LOCKS")]
static CGROUP_LOCKS: PerCpuHashMap<u64, LockStats> =
    PerCpuHashMap::with_max_entries(MAX_CGROUPS, 0);

/// Spinning waiters, one per CPU.
#[map(name = "LOCK_SPINNING")]
static LOCK_SPINNING: PerCpuArray<LockInflight> = PerCpuArray::with_max_entries(1, 0);

/// Sleeping waiters, by thread id.
#[map(name = "LOCK_SLEEPING")]
static LOCK_SLEEPING: LruHashMap<u32, LockInflight> = LruHashMap::with_max_entries(MAX_SLEEPERS, 0);

/// Per CPU: exact counts and maxima without atomics.
#[map(name = "LOCK_SITES")]
static LOCK_SITES: PerCpuHashMap<LockSiteKey, LockSiteValue> =
    PerCpuHashMap::with_max_entries(MAX_SITES, 0);

#[map(name = "LOCK_STACKS")]
static LOCK_STACKS: StackTrace = StackTrace::with_max_entries(MAX_STACKS, 0);

#[unsafe(no_mangle)]
static TP_LOCK_ADDR_OFFSET: u32 = 8;
#[unsafe(no_mangle)]
static TP_LOCK_FLAGS_OFFSET: u32 = 16;

/// BPF_F_FAST_STACK_CMP: compare stacks by hash only; a collision merges two sites, which the
/// per-site figures tolerate better than a stack map that fills up with near-duplicates.
const BPF_F_FAST_STACK_CMP: u64 = 1 << 9;

/// Whether a contention spins on this CPU (spinlocks, rwlocks) rather than possibly sleeping.
#[inline(always)]
fn spins(flags: u32) -> bool {
    flags & lcb::SPIN != 0 && flags & (lcb::MUTEX | lcb::RT | lcb::PERCPU) == 0
}

#[btf_tracepoint(function = "contention_begin")]
pub fn lock_contention_begin_btf(ctx: BtfTracePointContext) -> i32 {
    // TP_PROTO(void *lock, unsigned int flags)
    let lock: u64 = ctx.arg(0);
    let flags: u64 = ctx.arg(1);
    let stack_id = ctx.get_stackid(&LOCK_STACKS, BPF_F_FAST_STACK_CMP);
    begin(
        lock,
        flags as u32,
        stack_id.map(|id| id as i32).unwrap_or(-1),
    );
    0
}

#[btf_tracepoint(function = "contention_end")]
pub fn lock_contention_end_btf(ctx: BtfTracePointContext) -> i32 {
    let lock: u64 = ctx.arg(0);
    end(lock);
    0
}

#[tracepoint]
pub fn lock_contention_begin_tp(ctx: TracePointContext) -> i32 {
    // SAFETY: bounds-checked reads from the tracepoint record.
    let fields = unsafe {
        (
            ctx.read_at::<u64>(global_u32(&TP_LOCK_ADDR_OFFSET) as usize),
            ctx.read_at::<u32>(global_u32(&TP_LOCK_FLAGS_OFFSET) as usize),
        )
    };
    if let (Ok(lock), Ok(flags)) = fields {
        let stack_id = ctx.get_stackid(&LOCK_STACKS, BPF_F_FAST_STACK_CMP);
        begin(lock, flags, stack_id.map(|id| id as i32).unwrap_or(-1));
    }
    0
}

#[tracepoint]
pub fn lock_contention_end_tp(ctx: TracePointContext) -> i32 {
    // SAFETY: a bounds-checked read from the tracepoint record.
    if let Ok(lock) = unsafe { ctx.read_at::<u64>(global_u32(&TP_LOCK_ADDR_OFFSET) as usize) } {
        end(lock);
    }
    0
}

#[inline(always)]
fn begin(lock: u64, flags: u32, stack_id: i32) {
    if stack_id < 0 {
        count_error(ProbeError::LockStackFailed);
    }
    // SAFETY: a helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let waiter = LockInflight {
        lock,
        start_ns: now,
        flags,
        stack_id,
    };
    if spins(flags) {
        let Some(slot) = LOCK_SPINNING.get_ptr_mut(0) else {
            return;
        };
        // SAFETY: this CPU's slot; a spinner does not migrate.
        let slot = unsafe { &mut *slot };
        if slot.lock != 0 {
            // A nested contention (in an interrupt) replaces the outer one, whose end will then
            // not match and be counted as unpaired.
            count_error(ProbeError::LockUnpairedEnd);
        }
        *slot = waiter;
        return;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    if let Some(existing) = LOCK_SLEEPING.get_ptr(&tid) {
        // SAFETY: a valid map value pointer.
        if unsafe { (*existing).lock } == lock {
            // The mutex's second begin (before sleeping): keep the first.
            return;
        }
    }
    if LOCK_SLEEPING.insert(&tid, &waiter, BPF_ANY).is_err() {
        count_error(ProbeError::LockInflightFull);
    }
}

#[inline(always)]
fn end(lock: u64) {
    // SAFETY: a helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let mut waiter = None;
    if let Some(slot) = LOCK_SPINNING.get_ptr_mut(0) {
        // SAFETY: this CPU's slot.
        let slot = unsafe { &mut *slot };
        if slot.lock == lock && lock != 0 {
            waiter = Some(*slot);
            slot.lock = 0;
        }
    }
    if waiter.is_none() {
        let tid = bpf_get_current_pid_tgid() as u32;
        if let Some(w) = LOCK_SLEEPING.get_ptr(&tid) {
            // SAFETY: a valid map value pointer, copied before the delete.
            let w = unsafe { *w };
            if w.lock == lock {
                waiter = Some(w);
                let _ = LOCK_SLEEPING.remove(&tid);
            }
        }
    }
    let Some(w) = waiter else {
        count_error(ProbeError::LockUnpairedEnd);
        return;
    };
    if now < w.start_ns {
        return;
    }
    let waited = now - w.start_ns;
    let kind = lock_kind_of(w.flags);
    // SAFETY: a helper with no preconditions.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    if let Some(stats) = per_cpu_slot(
        &CGROUP_LOCKS,
        &cgroup_id,
        &LockStats::ZERO,
        ProbeError::CgroupMapFull,
    ) {
        // SAFETY: this CPU's slot. `kind` < COUNT by construction; the check is for the
        // verifier.
        let stats = unsafe { &mut *stats };
        if kind < lock_kind::COUNT {
            stats.count[kind] += 1;
            stats.wait_ns[kind] += waited;
        }
    }
    if w.stack_id >= 0 {
        let key = LockSiteKey {
            cgroup_id,
            stack_id: w.stack_id as u32,
            kind: kind as u32,
        };
        let zero = LockSiteValue {
            count: 0,
            wait_ns: 0,
            max_wait_ns: 0,
        };
        if let Some(v) = per_cpu_slot(&LOCK_SITES, &key, &zero, ProbeError::LockSiteFull) {
            // SAFETY: this CPU's slot.
            let v = unsafe { &mut *v };
            v.count += 1;
            v.wait_ns += waited;
            if waited > v.max_wait_ns {
                v.max_wait_ns = waited;
            }
        }
    }
}
