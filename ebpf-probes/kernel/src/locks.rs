//! Kernel lock contention: `lock:contention_begin` / `contention_end` (tp_btf where possible).
//! Per cgroup: wait count and time by lock kind; per contended call site (a kernel stack), the
//! same, for the agent to symbolize.
//!
//! As in the kernel's own `perf lock contention` BPF program, a spinning waiter's start time
//! lives in a per-CPU slot (it cannot sleep or migrate while it spins: no per-thread state at
//! all) and a sleeping waiter's in the thread's task storage (a thread waits for one lock at a
//! time; the slot cannot be evicted). A mutex reports `MUTEX|SPIN` before optimistic spinning
//! and `MUTEX` again before it sleeps, with one `contention_end`: the first begin's time is kept.
//!
//! Call sites: the kernel stack, taken at `contention_end` (which fires in the same function as
//! `contention_begin`: the lock's slow path, so the stack is the same) and only for waits of at
//! least [`SITE_MIN_WAIT_NS`]. The stack walk is by far the costliest part of these probes
//! (1.5–3 µs a walk, where the rest of `contention_end` costs 40–100 ns), more than most
//! spinlock waits last; taken for every contention, it would make a storm of short spinlock
//! waits cost the node more than the waits themselves. Every contention still counts in its
//! cgroup's figures; the call-site list is of the waits that lasted at least that long. And
//! each CPU walks at most 1,000 stacks a second (a second's worth at once:
//! `stormwatch_common::stack_walk_allowed`): in a storm of long waits (a `flock` storm on two
//! CPUs makes 11,000 a second on each) the rest are counted, exactly, under
//! [`LOCK_SITE_UNWALKED`] instead of a stack, so that the walks cost at most about 0.3% of a
//! CPU and the agent says how many long waits its call sites cover. `get_stackid` with
//! `BPF_F_REUSE_STACKID`, so that a hash collision replaces the old stack instead of failing;
//! the per-site figures keep the id, and the agent reads each site's stack in the window it
//! appears. Stacks are cut at
//! [`STACK_DEPTH`] frames, as `perf lock contention` cuts them (at 8 after skipping 4): enough to
//! reach the call site.

use aya_ebpf::{
    btf_maps::StackTrace,
    helpers::bpf_ktime_get_ns,
    macros::{btf_map, btf_tracepoint, map, tracepoint},
    maps::{Array, PerCpuArray, PerCpuHashMap},
    programs::{BtfTracePointContext, TracePointContext, tracing::StackIdContext as _},
};
use stormwatch_common::{
    LOCK_SITE_UNWALKED, LockCpu, LockInflight, LockSiteKey, LockSiteValue, LockStats, ProbeError,
    lcb, lock_kind, lock_kind_of, stack_walk_allowed,
};

use crate::shared::{
    TaskStorage, count_error, current_task, global_u32, per_cpu_slot, placed, task_cgroup_id,
};

const MAX_CGROUPS: u32 = 4096;
const MAX_SITES: u32 = 4096;
const MAX_STACKS: usize = 4096;
/// Frames kept per stack, innermost first: the tracing frames (our program, `bpf_trace_run2`),
/// the lock's slow path and lock function (a few frames), then the call site the agent names
/// (the first frame outside locking code) and its callers.
const STACK_DEPTH: usize = 12;
/// The shortest wait whose call site is taken (10 µs; see the module's documentation). The
/// agent names it in its output from the shared crate.
const SITE_MIN_WAIT_NS: u64 = stormwatch_common::LOCK_SITE_MIN_WAIT_NS;

/// Preallocated, as `CGROUP_SCHED` (contentions happen in scheduler paths too); the agent sizes
/// it to at least `max_cgroups`.
#[map(name = "CGROUP_LOCKS")]
static CGROUP_LOCKS: PerCpuHashMap<u64, LockStats> =
    PerCpuHashMap::with_max_entries(MAX_CGROUPS, 0);

/// The cgroups the agent placed in direct slots (`stormwatch_common::slots`), and their figures.
#[map(name = "LOCK_SLOT_DIR")]
static LOCK_SLOT_DIR: Array<u64> = Array::with_max_entries(stormwatch_common::slots::SLOTS, 0);

#[map(name = "LOCK_SLOTS")]
static LOCK_SLOTS: PerCpuArray<LockStats> =
    PerCpuArray::with_max_entries(stormwatch_common::slots::SLOTS, 0);

/// Spinning waiters, one per CPU, and each CPU's stack-walk budget.
#[map(name = "LOCK_SPINNING")]
static LOCK_SPINNING: PerCpuArray<LockCpu> = PerCpuArray::with_max_entries(1, 0);

/// Sleeping waiters, in their task storage.
#[btf_map(name = "LOCK_SLEEPING")]
static LOCK_SLEEPING: TaskStorage<LockInflight> = TaskStorage::new();

/// Per CPU: exact counts and maxima without atomics.
#[map(name = "LOCK_SITES")]
static LOCK_SITES: PerCpuHashMap<LockSiteKey, LockSiteValue> =
    PerCpuHashMap::with_max_entries(MAX_SITES, 0);

#[btf_map(name = "LOCK_STACKS")]
static LOCK_STACKS: StackTrace<MAX_STACKS, 0, STACK_DEPTH> = StackTrace::new();

#[unsafe(no_mangle)]
static TP_LOCK_ADDR_OFFSET: u32 = 8;
#[unsafe(no_mangle)]
static TP_LOCK_FLAGS_OFFSET: u32 = 16;

/// BPF_F_FAST_STACK_CMP: compare stacks by hash only. BPF_F_REUSE_STACKID: on a collision the
/// bucket takes the new stack instead of the call failing (without it, 4,409 failures in 150 s
/// of thread churn); a site whose stack was replaced is then symbolized as the newer one, which
/// the agent avoids by reading each site's stack when the site first appears.
const STACK_FLAGS: u64 = (1 << 9) | (1 << 10);

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
    begin(lock, flags as u32);
    0
}

#[btf_tracepoint(function = "contention_end")]
pub fn lock_contention_end_btf(ctx: BtfTracePointContext) -> i32 {
    let lock: u64 = ctx.arg(0);
    end(lock, || ctx.get_stackid(&LOCK_STACKS, STACK_FLAGS));
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
        begin(lock, flags);
    }
    0
}

#[tracepoint]
pub fn lock_contention_end_tp(ctx: TracePointContext) -> i32 {
    // SAFETY: a bounds-checked read from the tracepoint record.
    if let Ok(lock) = unsafe { ctx.read_at::<u64>(global_u32(&TP_LOCK_ADDR_OFFSET) as usize) } {
        end(lock, || ctx.get_stackid(&LOCK_STACKS, STACK_FLAGS));
    }
    0
}

#[inline(always)]
fn begin(lock: u64, flags: u32) {
    // SAFETY: a helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let waiter = LockInflight {
        lock,
        start_ns: now,
        flags,
        _pad: 0,
    };
    if spins(flags) {
        let Some(slot) = LOCK_SPINNING.get_ptr_mut(0) else {
            return;
        };
        // SAFETY: this CPU's slot; a spinner does not migrate.
        let slot = unsafe { &mut (*slot).spinning };
        if slot.lock != 0 {
            // A nested contention (in an interrupt) replaces the outer one, whose end will then
            // not match and be counted as unpaired.
            count_error(ProbeError::LockUnpairedEnd);
        }
        *slot = waiter;
        return;
    }
    let Some(slot) = LOCK_SLEEPING.get_or_create(current_task()) else {
        count_error(ProbeError::LockStorageBusy);
        return;
    };
    if slot.lock == lock {
        // The mutex's second begin (before sleeping): keep the first.
        return;
    }
    *slot = waiter;
}

/// `stack_id` takes the current kernel stack's id in `LOCK_STACKS`, called only for a wait long
/// enough to have its call site taken.
#[inline(always)]
fn end(lock: u64, stack_id: impl FnOnce() -> Result<core::ffi::c_long, i32>) {
    // SAFETY: a helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // One helper call for the task, whose storage a sleeper's start is in and whose cgroup
    // every contention is counted in.
    let task = current_task();
    let mut waiter = None;
    let Some(cpu) = LOCK_SPINNING.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot, which no other program on this CPU runs over meanwhile (a
    // contention in an interrupt finishes before the interrupted program resumes).
    let cpu = unsafe { &mut *cpu };
    let slot = &mut cpu.spinning;
    if slot.lock == lock && lock != 0 {
        waiter = Some(*slot);
        slot.lock = 0;
    }
    if waiter.is_none()
        && let Some(slot) = LOCK_SLEEPING.get(task)
        && slot.lock == lock
        && lock != 0
    {
        waiter = Some(*slot);
        slot.lock = 0;
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
    let cgroup_id = task_cgroup_id(task as *const u8);
    let placed_or_hashed = placed(&LOCK_SLOT_DIR, &LOCK_SLOTS, cgroup_id).or_else(|| {
        per_cpu_slot(
            &CGROUP_LOCKS,
            &cgroup_id,
            &LockStats::ZERO,
            ProbeError::CgroupMapFull,
        )
    });
    if let Some(stats) = placed_or_hashed {
        // SAFETY: this CPU's slot. `kind` < COUNT by construction; the check is for the
        // verifier.
        let stats = unsafe { &mut *stats };
        if kind < lock_kind::COUNT {
            stats.count[kind] += 1;
            stats.wait_ns[kind] += waited;
        }
    }
    if waited < SITE_MIN_WAIT_NS {
        return;
    }
    let stack_id = match stack_walk_allowed(cpu.walk_tat_ns, now) {
        Some(next) => {
            cpu.walk_tat_ns = next;
            let Ok(id) = stack_id() else {
                count_error(ProbeError::LockStackFailed);
                return;
            };
            id as u32
        }
        None => LOCK_SITE_UNWALKED,
    };
    let key = LockSiteKey {
        cgroup_id,
        stack_id,
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
