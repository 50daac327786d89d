//! Futex probes: `syscalls:sys_{enter,exit}_futex` and the futex2 syscalls (`futex_wait`,
//! `futex_waitv`, `futex_wake`, 6.7+). Per cgroup: wait calls, wait time (a log2 histogram),
//! wakes and the waiters they woke, timeouts and EAGAIN returns. Per process, the hottest futex
//! words, in a bounded map the agent prunes (it shows the top few; they are never metric labels).
//!
//! A call's start is kept in the thread's task storage from entry to exit (a thread is in at
//! most one syscall at a time, so one slot per thread is all it takes, and it cannot be
//! evicted); the exit credits the current cgroup (the caller's own, since the caller is
//! `current` at syscall exit).
//!
//! These run on every futex call of every thread, so each step is the cheap one: record fields
//! are loaded directly where the layout is the usual one, the clock is read for waits only,
//! the cgroup id is four loads from the current task (as the scheduler probes), and the
//! process's name is read only for a futex word not yet in the map.

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user,
    },
    macros::{btf_map, map, tracepoint},
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap},
    programs::TracePointContext,
};
use stormwatch_common::{
    FutexInflight, FutexStats, HotFutexKey, HotFutexValue, ProbeError, ThreadHandoff, futex_class,
    futex_op_class,
};

use crate::handoff;
use crate::shared::{
    BPF_F_NO_PREALLOC, BPF_NOEXIST, TaskStorage, count_error, current_task, global_u32,
    per_cpu_slot, placed, task_cgroup_id,
};

const MAX_CGROUPS: u32 = 4096;
/// Distinct (cgroup, process, futex word) entries kept. The agent deletes the entries of exited
/// processes and of words idle for a while; an entry that does not fit is counted.
const MAX_HOT_FUTEXES: u32 = 8192;

/// Threads with a hand-off entry. The agent deletes the entries of threads that have exited;
/// one that does not fit is counted.
const MAX_HANDOFF_THREADS: u32 = 16384;

const ETIMEDOUT: i64 = 110;
const EAGAIN: i64 = 11;

/// Not preallocated: kernel memory follows the cgroups that exist, so the capacity can be at
/// least `max_cgroups` on any number of CPUs.
#[map(name = "CGROUP_FUTEX")]
static CGROUP_FUTEX: PerCpuHashMap<u64, FutexStats> =
    PerCpuHashMap::with_max_entries(MAX_CGROUPS, BPF_F_NO_PREALLOC);

/// The cgroups the agent placed in direct slots (`stormwatch_common::slots`), and their figures.
#[map(name = "FUTEX_SLOT_DIR")]
static FUTEX_SLOT_DIR: Array<u64> = Array::with_max_entries(stormwatch_common::slots::SLOTS, 0);

#[map(name = "FUTEX_SLOTS")]
static FUTEX_SLOTS: PerCpuArray<FutexStats> =
    PerCpuArray::with_max_entries(stormwatch_common::slots::SLOTS, 0);

/// The attach epoch, raised by the agent before each attach of the on-demand futex probes
/// (1 when they are always attached). An array lookup with a constant key is inlined by the
/// verifier: two loads per call.
#[map(name = "FUTEX_EPOCH")]
static FUTEX_EPOCH: Array<u32> = Array::with_max_entries(1, 0);

#[inline(always)]
fn epoch() -> u32 {
    FUTEX_EPOCH.get(0).copied().unwrap_or(0).max(1)
}

/// Each thread's part in hand-offs. Only the thread itself writes its entry (at its own futex
/// exits), so plain increments are exact. Not preallocated: memory follows the threads that
/// take part in hand-offs, and only hand-offs (a wait that ended in a wake, a wake that woke)
/// touch it.
#[map(name = "HANDOFF_THREADS")]
static HANDOFF_THREADS: HashMap<u32, ThreadHandoff> =
    HashMap::with_max_entries(MAX_HANDOFF_THREADS, BPF_F_NO_PREALLOC);

#[btf_map(name = "FUTEX_INFLIGHT")]
static FUTEX_INFLIGHT: TaskStorage<FutexInflight> = TaskStorage::new();

// Per CPU, so that counts and the maximum are exact without atomics; not LRU, so that an
// entry cannot vanish between insert and lookup. Full is counted, never silent; the agent
// deletes entries of processes that are gone and of words idle for a while.
#[map(name = "HOT_FUTEXES")]
static HOT_FUTEXES: PerCpuHashMap<HotFutexKey, HotFutexValue> =
    PerCpuHashMap::with_max_entries(MAX_HOT_FUTEXES, 0);

#[unsafe(no_mangle)]
static TP_FUTEX_UADDR_OFFSET: u32 = 16;
#[unsafe(no_mangle)]
static TP_FUTEX_OP_OFFSET: u32 = 24;
#[unsafe(no_mangle)]
static TP_FUTEX2_UADDR_OFFSET: u32 = 16;
#[unsafe(no_mangle)]
static TP_FUTEX_WAITV_WAITERS_OFFSET: u32 = 16;
#[unsafe(no_mangle)]
static TP_FUTEX_WAITV_NR_OFFSET: u32 = 24;
#[unsafe(no_mangle)]
static TP_SYS_EXIT_RET_OFFSET: u32 = 16;

/// The layout the kernel gives every syscall's trace record (`struct syscall_trace_enter`: the
/// 8-byte common header, the syscall number, then each argument as an 8-byte slot from byte 16;
/// `struct syscall_trace_exit`: the return value at 16). The agent still reads each field's
/// offset from the event's format; where it is the usual one the field is loaded directly from
/// the record, a load the verifier checks at a constant offset, instead of by a helper call.
const SYSCALL_ARG0: u32 = 16;
const SYSCALL_ARG1: u32 = 24;

/// The 8-byte field at `offset` (a global the agent set from the format) of the tracepoint's
/// record, loaded directly when `offset` is `usual`.
#[inline(always)]
fn field_u64<const USUAL: u32>(ctx: &TracePointContext, offset: u32) -> Option<u64> {
    if offset == USUAL {
        // SAFETY: the record is at least `USUAL + 8` bytes (the format says the field is
        // there); the verifier checks a context load at a constant offset.
        return Some(unsafe {
            *(ctx.as_ptr() as *const u8)
                .add(USUAL as usize)
                .cast::<u64>()
        });
    }
    // SAFETY: bounds-checked read from the tracepoint record.
    unsafe { ctx.read_at::<u64>(offset as usize) }.ok()
}

#[tracepoint]
pub fn futex_enter(ctx: TracePointContext) -> i32 {
    let (Some(uaddr), Some(op)) = (
        field_u64::<SYSCALL_ARG0>(&ctx, global_u32(&TP_FUTEX_UADDR_OFFSET)),
        field_u64::<SYSCALL_ARG1>(&ctx, global_u32(&TP_FUTEX_OP_OFFSET)),
    ) else {
        return 0;
    };
    enter(uaddr, futex_op_class(op as u32));
    0
}

#[tracepoint]
pub fn futex_wait_enter(ctx: TracePointContext) -> i32 {
    if let Some(uaddr) = field_u64::<SYSCALL_ARG0>(&ctx, global_u32(&TP_FUTEX2_UADDR_OFFSET)) {
        enter(uaddr, futex_class::WAIT);
    }
    0
}

#[tracepoint]
pub fn futex_wake_enter(ctx: TracePointContext) -> i32 {
    if let Some(uaddr) = field_u64::<SYSCALL_ARG0>(&ctx, global_u32(&TP_FUTEX2_UADDR_OFFSET)) {
        enter(uaddr, futex_class::WAKE);
    }
    0
}

/// `struct futex_waitv { u64 val; u64 uaddr; u32 flags; u32 __reserved; }` (uapi, stable).
const FUTEX_WAITV_UADDR: usize = 8;

#[tracepoint]
pub fn futex_waitv_enter(ctx: TracePointContext) -> i32 {
    let (Some(waiters), Some(nr)) = (
        field_u64::<SYSCALL_ARG0>(&ctx, global_u32(&TP_FUTEX_WAITV_WAITERS_OFFSET)),
        field_u64::<SYSCALL_ARG1>(&ctx, global_u32(&TP_FUTEX_WAITV_NR_OFFSET)),
    ) else {
        return 0;
    };
    // A wait on several words cannot be charged to one of them: its time counts for the
    // cgroup, but no single address is named.
    let uaddr = if nr as u32 == 1 {
        // SAFETY: bpf_probe_read_user tolerates any address.
        unsafe { bpf_probe_read_user((waiters as usize + FUTEX_WAITV_UADDR) as *const u64) }
            .unwrap_or(0)
    } else {
        0
    };
    enter(uaddr, futex_class::WAIT);
    0
}

/// Attached to `sys_exit_futex` and to the futex2 exits: all `sys_exit_*` records are alike.
#[tracepoint]
pub fn futex_exit(ctx: TracePointContext) -> i32 {
    if let Some(ret) = field_u64::<SYSCALL_ARG0>(&ctx, global_u32(&TP_SYS_EXIT_RET_OFFSET)) {
        exit(ret as i64);
    }
    0
}

/// Every futex call's entry is kept, those that neither wait nor wake too (as class 0), so that
/// an exit without a kept entry really is one whose entry we did not see. Only a wait reads the
/// clock: nothing else is timed.
#[inline(always)]
fn enter(uaddr: u64, class: u32) {
    let Some(call) = FUTEX_INFLIGHT.get_or_create(current_task()) else {
        count_error(ProbeError::FutexStorageBusy);
        return;
    };
    if class == futex_class::WAIT {
        // SAFETY: a helper with no preconditions.
        call.start_ns = unsafe { bpf_ktime_get_ns() };
    }
    call.uaddr = uaddr;
    call.class = class;
    call.in_flight = epoch();
    call.sample_id = 0;
    if class == futex_class::WAKE {
        let (sample_id, at) = handoff::choose_wake(uaddr);
        call.sample_id = sample_id;
        // A sampled wake's entry time, for its waiter (only waits are otherwise timed).
        if sample_id != 0 {
            call.start_ns = at;
        }
    }
}

#[inline(always)]
fn exit(ret: i64) {
    let task = current_task();
    let Some(slot) = FUTEX_INFLIGHT.get(task) else {
        // No storage at all: the thread's first futex call since attach began before it.
        count_error(ProbeError::FutexUnpairedExit);
        return;
    };
    let call = *slot;
    slot.in_flight = 0;
    if call.in_flight != epoch() {
        // The slot was consumed by the previous exit, or kept before the probes were last
        // detached and attached again: this call's entry was not seen.
        count_error(ProbeError::FutexUnpairedExit);
        return;
    }
    let (now, waited) = if call.class == futex_class::WAIT {
        // SAFETY: a helper with no preconditions.
        let now = unsafe { bpf_ktime_get_ns() };
        if now < call.start_ns {
            count_error(ProbeError::FutexUnpairedExit);
            return;
        }
        (now, now - call.start_ns)
    } else if call.class == 0 {
        return;
    } else {
        (0, 0)
    };
    let cgroup_id = task_cgroup_id(task as *const u8);
    let Some(stats) = placed(&FUTEX_SLOT_DIR, &FUTEX_SLOTS, cgroup_id).or_else(|| {
        per_cpu_slot(
            &CGROUP_FUTEX,
            &cgroup_id,
            &FutexStats::ZERO,
            ProbeError::CgroupMapFull,
        )
    }) else {
        return;
    };
    // SAFETY: this CPU's slot; syscall exits do not nest on one CPU.
    let stats = unsafe { &mut *stats };
    match call.class {
        futex_class::WAIT => {
            stats.wait.record(waited);
            // One helper call for the thread's ids, which its hand-off and its word both key on.
            let pid_tgid = bpf_get_current_pid_tgid();
            if ret == 0 {
                stats.woken_waits += 1;
                stats.woken_wait_ns += waited;
                record_handoff(cgroup_id, pid_tgid, Some(waited), None);
                // Waits on one word in a row add up until the thread wakes that word (a mutex
                // waiter that loses the word to another thread waits again on it).
                if call.uaddr != 0 && slot.relay_uaddr == call.uaddr {
                    slot.relay_waits += 1;
                    slot.relay_wait_ns += waited;
                } else {
                    slot.relay_uaddr = call.uaddr;
                    slot.relay_waits = 1;
                    slot.relay_wait_ns = waited;
                }
                handoff::woken_wait_exit(slot, task as *const u8, cgroup_id, now, waited);
            } else if ret == -ETIMEDOUT {
                stats.timeouts += 1;
            } else if ret == -EAGAIN {
                stats.eagain += 1;
            }
            if call.uaddr != 0 {
                record_hot(cgroup_id, pid_tgid, call.uaddr, waited);
            }
        }
        futex_class::WAKE => {
            stats.wakes += 1;
            let relayed = take_relay(slot, call.uaddr, ret >= 0);
            if ret > 0 {
                stats.woken += ret as u64;
            }
            if ret > 0 || relayed.is_some() {
                record_handoff(cgroup_id, bpf_get_current_pid_tgid(), None, relayed);
            }
            handoff::wake_exit(slot, cgroup_id, ret > 0);
        }
        _ => {
            // Requeues (their count of waiters woken or moved) and FUTEX_UNLOCK_PI (0 on
            // success; glibc calls it only when the lock has waiters): the lock handed on.
            stats.wakes += 1;
            let relayed = take_relay(slot, call.uaddr, ret >= 0);
            if ret >= 0 {
                record_handoff(cgroup_id, bpf_get_current_pid_tgid(), None, relayed);
            }
        }
    }
}

/// At a wake on `uaddr` that succeeded (`ok`): the thread's woken waits on that word not yet
/// handed on, as `(waits, their time)`, cleared. A wake that did not wake anyone counts too: a
/// glibc mutex taken after a wait is always released with a wake, and its wait was the lock's
/// whether or not another thread queued meanwhile.
#[inline(always)]
fn take_relay(slot: &mut FutexInflight, uaddr: u64, ok: bool) -> Option<(u64, u64)> {
    if !ok || uaddr == 0 || slot.relay_uaddr != uaddr || slot.relay_waits == 0 {
        return None;
    }
    let relayed = (slot.relay_waits, slot.relay_wait_ns);
    slot.relay_uaddr = 0;
    slot.relay_waits = 0;
    slot.relay_wait_ns = 0;
    Some(relayed)
}

/// Credits the current thread's part in a hand-off: a wait that ended in a wake (`Some` of its
/// length), or a wake (`None`) — one that woke a waiter, or one that handed on the thread's own
/// waits on its word (`relayed`: see [`take_relay`]).
#[inline(always)]
fn record_handoff(
    cgroup_id: u64,
    pid_tgid: u64,
    woken_wait_ns: Option<u64>,
    relayed: Option<(u64, u64)>,
) {
    let tid = pid_tgid as u32;
    let v = match HANDOFF_THREADS.get_ptr_mut(&tid) {
        Some(v) => v,
        None => {
            let mut zero = ThreadHandoff::ZERO;
            zero.tgid = (pid_tgid >> 32) as u32;
            let _ = HANDOFF_THREADS.insert(&tid, &zero, BPF_NOEXIST);
            match HANDOFF_THREADS.get_ptr_mut(&tid) {
                Some(v) => v,
                None => {
                    count_error(ProbeError::HandoffThreadsFull);
                    return;
                }
            }
        }
    };
    // SAFETY: the entry of the current thread, which only this thread writes.
    let v = unsafe { &mut *v };
    v.cgroup_id = cgroup_id;
    match woken_wait_ns {
        Some(ns) => {
            v.woken_waits += 1;
            v.woken_wait_ns += ns;
        }
        None => v.wakes += 1,
    }
    if let Some((waits, ns)) = relayed {
        v.relay_waits += waits;
        v.relay_wait_ns += ns;
    }
}

/// Credits a wait to its futex word. The process's name is read only for a word not yet in the
/// map.
#[inline(always)]
fn record_hot(cgroup_id: u64, pid_tgid: u64, uaddr: u64, waited: u64) {
    let tid = pid_tgid as u32;
    let key = HotFutexKey {
        cgroup_id,
        uaddr,
        tgid: (pid_tgid >> 32) as u32,
        _pad: 0,
    };
    let v = match HOT_FUTEXES.get_ptr_mut(&key) {
        Some(v) => v,
        None => {
            let zero = HotFutexValue {
                comm: bpf_get_current_comm().unwrap_or([0; 16]),
                tid,
                ..HotFutexValue::ZERO
            };
            let Some(v) = per_cpu_slot(&HOT_FUTEXES, &key, &zero, ProbeError::HotFutexFull) else {
                return;
            };
            v
        }
    };
    // SAFETY: this CPU's slot.
    let v = unsafe { &mut *v };
    v.waits += 1;
    v.wait_ns += waited;
    // Another CPU's slot of an entry made elsewhere starts zeroed: its first waiter is its own.
    if v.tid == 0 {
        v.tid = tid;
    } else if v.tid != tid {
        v.shared = 1;
    }
    if waited > v.max_wait_ns {
        v.max_wait_ns = waited;
    }
}
