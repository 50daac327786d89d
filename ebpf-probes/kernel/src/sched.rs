//! Scheduler probes: context switches, run-queue latency, on/off-CPU time and migrations,
//! aggregated per cgroup (the v2 cgroup id) in a per-CPU hash map.
//!
//! Each thread's intervals are credited when the thread leaves a CPU, to its cgroup then. With
//! tp_btf the cgroup id is read from the outgoing task itself (`prev->cgroups->dfl_cgrp->kn->id`,
//! four direct loads the verifier checks against BTF): measured, about 30 ns less per switch than
//! `bpf_get_current_cgroup_id()`, a helper call that walks the same pointers under
//! `rcu_read_lock`. Classic tracepoints use the helper (`current` is `prev` there).
//!
//! The run-queue wait and the blocked time, with tp_btf where the kernel keeps `sched_info`
//! (`HAVE_SCHED_INFO`): from the outgoing thread's `sched_info.run_delay`, which the kernel grew
//! by the wait that ended at the thread's switch-in (see [`waits_from_sched_info`]); no program
//! runs per wake-up for them, and the wake-up programs, where attached, only tell local from
//! remote ([`mark_wakeup`]). Otherwise wake-ups stamp the wake-up time into the thread's scratch
//! state ([`apply_wakeup`]) and the waits are timed from it.
//!
//! The times stamped (switch-in, block, wake-up) are, with tp_btf, the run queue's own clock
//! (`rq->clock`, reached from the task as `task->se.cfs_rq->rq`; three direct loads): the clock
//! the scheduler itself keeps the run-queue wait in (`/proc/<pid>/schedstat`'s run_delay), just
//! updated under the run queue's lock at every switch and wake-up. Calling
//! `bpf_ktime_get_ns()` instead costs about 60 ns per call on the 2-vCPU VM this was measured on,
//! twice per switch and wake-up. The run queue clocks of all CPUs are one clock where the
//! kernel marks `sched_clock` stable (every x86 with an invariant TSC); classic tracepoints, and
//! kernels whose BTF lacks the path, use `bpf_ktime_get_ns()`.
//!
//! Context switches are not inferred from the tracepoint's arguments: the thread's own
//! `nvcsw`/`nivcsw` counters are read at each switch-out and the difference from the previous
//! switch-out is added. That is exactly what the kernel counted (`/proc/<pid>/status`,
//! `getrusage`), including the cases the `preempt`/`prev_state` arguments misreport (a blocking
//! task with a signal pending is counted voluntary but traced as running).

use aya_ebpf::{
    bindings::task_struct,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_kernel,
    },
    macros::{btf_map, btf_tracepoint, map, tracepoint},
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap},
    programs::{BtfTracePointContext, TracePointContext},
};
use stormwatch_common::{
    ON_CPU_HAS_RUNTIME, OnCpu, ProbeError, RUNQ_RUNS, Run, RunRing, RunqBlameKey, RunqBlameValue,
    SchedStats, TASK_HAS_LAST_CPU, TASK_HAS_RUN_DELAY, TASK_HAS_RUNTIME_BASELINE,
    TASK_HAS_SWITCH_BASELINE, TASK_HAS_WAKER, TASK_SEEN, TASK_WAKE_KNOWN, TASK_WAKE_REMOTE,
    TASK_WOKEN, TaskState,
};

use stormwatch_common::culprit;

use crate::shared::{
    BPF_NOEXIST, TaskStorage, count_error, current_task, follow, global_u32, per_cpu_slot, placed,
    task_cgroup_id, typed,
};

/// Default capacities; the agent sets the cgroup map's before load.
const MAX_CGROUPS: u32 = 4096;
/// Wake-ups pending until their thread's switch-out, classic tracepoints only: at most one per
/// runnable thread that has not run yet.
const MAX_PENDING_WAKEUPS: u32 = 16384;

/// Preallocated: inserting into a non-preallocated per-CPU hash from `sched_switch` fails
/// often (seen: 719 failed inserts in 2 s of thread churn, the allocator's cache not being
/// refilled in that context). The agent sizes it to at least `max_cgroups`.
#[map(name = "CGROUP_SCHED")]
static CGROUP_SCHED: PerCpuHashMap<u64, SchedStats> =
    PerCpuHashMap::with_max_entries(MAX_CGROUPS, 0);

/// The cgroups the agent placed in direct slots (`stormwatch_common::slots`), and their figures:
/// a placed cgroup's switch-outs are credited there, two inlined array loads instead of a hash
/// lookup (about a third of the switch program's own time when measured against the hash).
#[map(name = "SCHED_SLOT_DIR")]
static SCHED_SLOT_DIR: Array<u64> = Array::with_max_entries(stormwatch_common::slots::SLOTS, 0);

#[map(name = "SCHED_SLOTS")]
static SCHED_SLOTS: PerCpuArray<SchedStats> =
    PerCpuArray::with_max_entries(stormwatch_common::slots::SLOTS, 0);

#[btf_map(name = "TASKS")]
static TASKS: TaskStorage<TaskState> = TaskStorage::new();

#[map(name = "ON_CPU")]
static ON_CPU: PerCpuArray<OnCpu> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "PENDING_WAKEUPS")]
static PENDING_WAKEUPS: HashMap<u32, u64> = HashMap::with_max_entries(MAX_PENDING_WAKEUPS, 0);

/// (victim, culprit) pairs: containers waiting times what held their CPUs. Preallocated, as
/// `CGROUP_SCHED` is, for the same reason (inserts from `sched_switch`); the agent sizes it to
/// the host's CPUs (`probes::sizing`) and deletes the pairs of removed cgroups and idle ones.
const MAX_BLAME_PAIRS: u32 = 4096;

#[map(name = "RUNQ_BLAME")]
static RUNQ_BLAME: PerCpuHashMap<RunqBlameKey, RunqBlameValue> =
    PerCpuHashMap::with_max_entries(MAX_BLAME_PAIRS, 0);

#[map(name = "RUNQ_RUNS")]
static RUNQ_RUNS_MAP: PerCpuArray<RunRing> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "RUNQ_BLAME_ON")]
static RUNQ_BLAME_ON: Array<u32> = Array::with_max_entries(1, 0);

#[unsafe(no_mangle)]
static TASK_LAST_QUEUED_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_FLAGS_OFFSET: u32 = 0;
/// 1 when the offsets above, the task's cgroup path and `sched_info` are set (tp_btf).
#[unsafe(no_mangle)]
static HAVE_RUNQ_BLAME: u32 = 0;
/// `task_struct.flags`: a kernel thread.
const PF_KTHREAD: u32 = 0x0020_0000;

#[unsafe(no_mangle)]
static TASK_PID_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_STATE_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_NVCSW_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_NIVCSW_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_EXIT_STATE_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_CPU_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_RUNTIME_OFFSET: u32 = 0;
/// `task_struct.se.cfs_rq`, `cfs_rq.rq`, `rq.clock`: from a task to its run queue's clock.
#[unsafe(no_mangle)]
static TASK_CFS_RQ_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static CFS_RQ_RQ_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static RQ_CLOCK_OFFSET: u32 = 0;
/// 1 when the three offsets above are set.
#[unsafe(no_mangle)]
static HAVE_RQ_CLOCK: u32 = 0;
/// `task_struct.sched_info.run_delay` and `.pcount`; `HAVE_SCHED_INFO` is 1 when both are set
/// (and the switch is tp_btf).
#[unsafe(no_mangle)]
static TASK_RUN_DELAY_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_PCOUNT_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static HAVE_SCHED_INFO: u32 = 0;
#[unsafe(no_mangle)]
static TP_SWITCH_NEXT_PID_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TP_WAKEUP_PID_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TP_SWITCH_PREV_STATE_OFFSET: u32 = 0;
/// 1 when the `TASK_*_OFFSET` globals are set (the kernel has BTF).
#[unsafe(no_mangle)]
static HAVE_TASK_OFFSETS: u32 = 0;

/// In the classic `sched_switch` record, `prev_state` carries `TASK_REPORT_MAX` (0x100 since
/// 4.14) when the task was preempted, and `EXIT_ZOMBIE`/`EXIT_DEAD` (0x20/0x10) on its final
/// switch.
const TP_STATE_PREEMPTED: u32 = 0x100;
/// `exit_state` (and the classic record's `prev_state`) of a thread reaped at once: its
/// counters were folded into its process's totals before its final switch.
const EXIT_DEAD: u32 = 0x10;

/// A value that may be unknown, written either way: `value` is zero when `known` is false.
///
/// Not an `Option`: the payload of a `None` is never written, and LLVM may still load it ahead
/// of the test of the discriminant (a load it knows to be harmless). Kernels before 6.3 refuse
/// any read of stack the program never wrote, even one whose value is then unused: 6.1's
/// verifier rejected the classic `sched_switch` program for the `None` runtime it spilled
/// ("invalid read from stack R10 off=-136 size=8"). Every field here is always written.
#[derive(Clone, Copy)]
struct Known<T: Copy> {
    known: bool,
    value: T,
}

impl<T: Copy> Known<T> {
    #[inline(always)]
    const fn some(value: T) -> Self {
        Self { known: true, value }
    }

    /// Unknown, with `zero` written in place of the value.
    #[inline(always)]
    const fn none(zero: T) -> Self {
        Self {
            known: false,
            value: zero,
        }
    }
}

/// What the switch-out of `prev` needs to know about it.
struct Prev {
    /// The outgoing thread (`current`), as a BTF pointer task storage accepts.
    task: *mut task_struct,
    /// Its thread id (0: a CPU's idle task).
    tid: u32,
    /// `(nvcsw, nivcsw)` read from the task, when the offsets are known.
    counters: Known<(u64, u64)>,
    /// `se.sum_exec_runtime` read from the task, when the offset is known.
    runtime: Known<u64>,
    /// Whether the task stays runnable (preempted), for when counters cannot decide.
    runnable: bool,
    /// The task is exiting and the kernel has already folded its counters into its process's
    /// totals: `exit_state` is `EXIT_DEAD`, set in `exit_notify` for a thread that is reaped at
    /// once (`release_task` → `__exit_signal`), before its final switch. Its switches from here
    /// on, the final one included, are in no total anyone can read. A zombie (`EXIT_ZOMBIE`: a
    /// process's leader, waited for by its parent) is not dead in this sense: its counters are
    /// read when it is reaped (`wait_task_zombie` adds the leader's own `nvcsw`, final switch
    /// included, to the parent's children totals), so its switches are counted as any other.
    dead: bool,
    /// Classic tracepoints: the thread's wake-up time kept in `PENDING_WAKEUPS`, looked up
    /// here because the classic `sched_wakeup` cannot reach the thread's task storage.
    classic: bool,
    /// Its cgroup v2 id (`bpf_get_current_cgroup_id()`'s answer).
    cgroup_id: u64,
    /// Its `sched_info`, where the kernel keeps one and BTF gives its offsets (tp_btf).
    sched_info: Known<SchedInfo>,
}

/// A thread's `sched_info` at its switch-out. At `sched_switch` the kernel has already added
/// the wait that ended at the thread's switch-in (`sched_info_arrive`, in the switch that put
/// it on this CPU) and not yet anything of this switch (`sched_info_depart` runs after the
/// tracepoint).
#[derive(Clone, Copy)]
struct SchedInfo {
    /// `run_delay`: the thread's time on run queues, waiting for a CPU, since it was created.
    run_delay: u64,
    /// `pcount`: how many times it went on a CPU.
    pcount: u64,
}

impl SchedInfo {
    const ZERO: Self = Self {
        run_delay: 0,
        pcount: 0,
    };
}

// ---- entry points: tp_btf (preferred) -------------------------------------------------------

#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch_btf(ctx: BtfTracePointContext) -> i32 {
    // TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next, ...)
    let preempt: u64 = ctx.arg(0);
    let prev: *const u8 = ctx.arg(1);
    let next: *const u8 = ctx.arg(2);
    // Direct loads from the BTF-typed task pointers: the verifier checks each against
    // task_struct and makes it a fault-tolerant load, at a fraction of a helper call's cost
    // (this is the hottest path there is: measured, five bpf_probe_read_kernel calls per switch
    // cost more than the rest of the program).
    let next_tid: u32 = typed(next, global_u32(&TASK_PID_OFFSET));
    let runtime_offset = global_u32(&TASK_RUNTIME_OFFSET);
    let (prev_runtime, next_runtime) = if runtime_offset == 0 {
        (Known::none(0), Known::none(0))
    } else {
        (
            Known::some(typed::<u64>(prev, runtime_offset)),
            Known::some(typed::<u64>(next, runtime_offset)),
        )
    };
    let state: u32 = typed(prev, global_u32(&TASK_STATE_OFFSET));
    let exit_state: u32 = typed(prev, global_u32(&TASK_EXIT_STATE_OFFSET));
    let prev = Prev {
        // The tracepoint's own pointer and a direct load: no helper calls for what the
        // arguments already give.
        task: prev as *mut task_struct,
        tid: typed(prev, global_u32(&TASK_PID_OFFSET)),
        counters: Known::some((
            typed(prev, global_u32(&TASK_NVCSW_OFFSET)),
            typed(prev, global_u32(&TASK_NIVCSW_OFFSET)),
        )),
        runtime: prev_runtime,
        // As `__schedule` decides: voluntary when not preempted and not runnable.
        runnable: preempt & 0xff != 0 || state == 0,
        dead: exit_state & EXIT_DEAD != 0,
        classic: false,
        cgroup_id: task_cgroup_id(prev),
        sched_info: if global_u32(&HAVE_SCHED_INFO) == 1 {
            Known::some(SchedInfo {
                run_delay: typed(prev, global_u32(&TASK_RUN_DELAY_OFFSET)),
                pcount: typed(prev, global_u32(&TASK_PCOUNT_OFFSET)),
            })
        } else {
            Known::none(SchedInfo::ZERO)
        },
    };
    let now = rq_clock(prev.task as *const u8);
    on_switch(now, prev, next_tid, next_runtime);
    if global_u32(&HAVE_RUNQ_BLAME) == 1 {
        blame(now, prev_runtime, next, next_tid, next_runtime);
    }
    0
}

/// Where the waker runs: only `sched_waking` is sure to fire on the waker's CPU (a wake-up onto
/// an idle or far CPU is finished there, and `sched_wakeup` then fires on the wakee's CPU).
#[btf_tracepoint(function = "sched_waking")]
pub fn sched_waking_btf(ctx: BtfTracePointContext) -> i32 {
    let task: *mut task_struct = ctx.arg(0);
    match TASKS.get_or_create(task) {
        Some(st) => {
            // SAFETY: a helper with no preconditions.
            st.waker_cpu = unsafe { bpf_get_smp_processor_id() };
            st.flags |= TASK_HAS_WAKER;
        }
        None => count_error(ProbeError::TaskStorageBusy),
    }
    0
}

#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup_btf(ctx: BtfTracePointContext) -> i32 {
    let task: *mut task_struct = ctx.arg(0);
    wakeup_btf(task, false);
    0
}

#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn sched_wakeup_new_btf(ctx: BtfTracePointContext) -> i32 {
    let task: *mut task_struct = ctx.arg(0);
    wakeup_btf(task, true);
    0
}

/// A wake-up seen with the thread's `task_struct`: its state is updated in place. A new
/// thread's wake-up (`wake_up_new_task`) runs on the parent's CPU and has no `sched_waking`.
#[inline(always)]
fn wakeup_btf(task: *mut task_struct, new: bool) {
    // SAFETY: a helper with no preconditions.
    let this_cpu = unsafe { bpf_get_smp_processor_id() };
    let sched_info = global_u32(&HAVE_SCHED_INFO) == 1;
    // The clock of the run queue the thread was just put on, updated by this wake-up: only
    // where the wake-up's time is not in the thread's `sched_info`.
    let now = if sched_info {
        0
    } else {
        rq_clock(task as *const u8)
    };
    let cpu_offset = global_u32(&TASK_CPU_OFFSET);
    let queued_on: u32 = typed(task as *const u8, cpu_offset);
    let Some(st) = TASKS.get_or_create(task) else {
        count_error(ProbeError::TaskStorageBusy);
        return;
    };
    let waker_cpu = if cpu_offset == 0 {
        None
    } else if new {
        Some(this_cpu)
    } else if st.flags & TASK_HAS_WAKER != 0 {
        Some(st.waker_cpu)
    } else {
        None
    };
    st.flags &= !TASK_HAS_WAKER;
    let remote = waker_cpu.map(|w| w != queued_on);
    if sched_info {
        mark_wakeup(st, remote);
    } else {
        apply_wakeup(st, now, remote);
    }
}

/// With `sched_info`, a wake-up only says of which kind it was: its time and the wait it began
/// are the kernel's (`run_delay`). Marked: the wake-up that ends a block we saw, and the first of
/// a thread we never saw switch out (a new thread, whose first wait `pcount` = 1 identifies). A
/// later one found the thread already queued or running.
#[inline(always)]
fn mark_wakeup(st: &mut TaskState, remote: Option<bool>) {
    let ends_block = st.flags & TASK_SEEN != 0 && st.blocked_since != 0;
    let first = st.flags & TASK_SEEN == 0;
    if st.flags & TASK_WOKEN != 0 || !(ends_block || first) {
        return;
    }
    set_woken(st, remote);
}

/// Marks the thread woken, of kind `remote` when known, in place of any earlier mark.
#[inline(always)]
fn set_woken(st: &mut TaskState, remote: Option<bool>) {
    st.flags &= !(TASK_WOKEN | TASK_WAKE_KNOWN | TASK_WAKE_REMOTE);
    st.flags |= TASK_WOKEN;
    if let Some(remote) = remote {
        st.flags |= TASK_WAKE_KNOWN;
        if remote {
            st.flags |= TASK_WAKE_REMOTE;
        }
    }
}

/// A wake-up at `now`, of kind `remote` when known: a thread we saw block is queued from now
/// on; a wake-up that finds the thread still on its CPU (it had not yet switched out) changes
/// nothing; a thread we never saw (blocked since before attach, or new) is queued from now on.
#[inline(always)]
fn apply_wakeup(st: &mut TaskState, now: u64, remote: Option<bool>) {
    if st.flags & TASK_SEEN == 0 {
        *st = TaskState {
            queued_since: now,
            flags: TASK_SEEN,
            ..TaskState::ZERO
        };
    } else if st.blocked_since != 0 {
        if now > st.blocked_since {
            st.offcpu_pending_ns += now - st.blocked_since;
        }
        st.blocked_since = 0;
        st.queued_since = now;
    } else {
        return;
    }
    set_woken(st, remote);
}

/// The clock of a BTF-typed task's run queue (`task->se.cfs_rq->rq->clock`), or
/// `bpf_ktime_get_ns()` where the kernel's BTF lacks that path. See the module's documentation.
#[inline(always)]
fn rq_clock(task: *const u8) -> u64 {
    if global_u32(&HAVE_RQ_CLOCK) != 1 {
        // SAFETY: a helper with no preconditions.
        return unsafe { bpf_ktime_get_ns() };
    }
    let rq = follow(
        task,
        &[
            global_u32(&TASK_CFS_RQ_OFFSET),
            global_u32(&CFS_RQ_RQ_OFFSET),
        ],
    );
    typed(rq, global_u32(&RQ_CLOCK_OFFSET))
}

// ---- entry points: classic tracepoints (kernels without BTF for tp_btf) ---------------------

#[tracepoint(category = "sched", name = "sched_switch")]
pub fn sched_switch_tp(ctx: TracePointContext) -> i32 {
    let (Some(next_tid), Some(state)) = (
        tp_read_u32(&ctx, global_u32(&TP_SWITCH_NEXT_PID_OFFSET)),
        tp_read_u32(&ctx, global_u32(&TP_SWITCH_PREV_STATE_OFFSET)),
    ) else {
        return 0;
    };
    let mut dead = state & EXIT_DEAD != 0 && state & TP_STATE_PREEMPTED == 0;
    let (counters, runtime) = if global_u32(&HAVE_TASK_OFFSETS) == 1 {
        // SAFETY: a helper with no preconditions; `current` is `prev` during sched_switch.
        let task = unsafe { bpf_get_current_task() } as *const u8;
        dead |= read_task_u32(task, global_u32(&TASK_EXIT_STATE_OFFSET)) & EXIT_DEAD != 0;
        let runtime_offset = global_u32(&TASK_RUNTIME_OFFSET);
        let runtime = if runtime_offset == 0 {
            Known::none(0)
        } else {
            read_task_u64(task, runtime_offset)
        };
        (read_task_counters(task), runtime)
    } else {
        (Known::none((0, 0)), Known::none(0))
    };
    let prev = Prev {
        task: current_task(),
        tid: bpf_get_current_pid_tgid() as u32,
        counters,
        runtime,
        runnable: state == 0 || state & TP_STATE_PREEMPTED != 0,
        dead,
        classic: true,
        // SAFETY: a helper with no preconditions; `current` is `prev` during sched_switch.
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        sched_info: Known::none(SchedInfo::ZERO),
    };
    // The record names the incoming thread by id only: its runtime is not read here, the
    // outgoing thread's baseline in its task storage is used instead.
    // SAFETY: a helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    on_switch(now, prev, next_tid, Known::none(0));
    0
}

#[tracepoint(category = "sched", name = "sched_wakeup")]
pub fn sched_wakeup_tp(ctx: TracePointContext) -> i32 {
    wakeup_tp(&ctx);
    0
}

#[tracepoint(category = "sched", name = "sched_wakeup_new")]
pub fn sched_wakeup_new_tp(ctx: TracePointContext) -> i32 {
    wakeup_tp(&ctx);
    0
}

/// A wake-up seen by thread id only: kept until the thread's next switch-out, which applies it.
/// The first wake-up since that switch-out wins (NOEXIST): a later one found the thread
/// already queued or running.
#[inline(always)]
fn wakeup_tp(ctx: &TracePointContext) {
    let Some(tid) = tp_read_u32(ctx, global_u32(&TP_WAKEUP_PID_OFFSET)) else {
        return;
    };
    if tid == 0 {
        return;
    }
    // SAFETY: a helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if let Err(err) = PENDING_WAKEUPS.insert(&tid, &now, BPF_NOEXIST)
        && err != -EEXIST
    {
        count_error(ProbeError::PendingWakeupFull);
    }
}

const EEXIST: i32 = 17;

// ---- the logic shared by both flavours ------------------------------------------------------

#[inline(always)]
fn tp_read_u32(ctx: &TracePointContext, offset: u32) -> Option<u32> {
    // SAFETY: the offset comes from the tracepoint's format file; read_at bounds-checks.
    match unsafe { ctx.read_at::<u32>(offset as usize) } {
        Ok(v) => Some(v),
        Err(_) => {
            count_error(ProbeError::TaskRead);
            None
        }
    }
}

#[inline(always)]
fn read_task_u32(task: *const u8, offset: u32) -> u32 {
    // SAFETY: bpf_probe_read_kernel tolerates any address; the offset comes from BTF.
    match unsafe { bpf_probe_read_kernel(task.wrapping_add(offset as usize) as *const u32) } {
        Ok(v) => v,
        Err(_) => {
            count_error(ProbeError::TaskRead);
            0
        }
    }
}

#[inline(always)]
fn read_task_u64(task: *const u8, offset: u32) -> Known<u64> {
    // SAFETY: as in read_task_u32.
    match unsafe { bpf_probe_read_kernel(task.wrapping_add(offset as usize) as *const u64) } {
        Ok(v) => Known::some(v),
        Err(_) => {
            count_error(ProbeError::TaskRead);
            Known::none(0)
        }
    }
}

/// The task's `(nvcsw, nivcsw)`: the kernel's own voluntary and involuntary switch counts.
#[inline(always)]
fn read_task_counters(task: *const u8) -> Known<(u64, u64)> {
    let nvcsw = read_task_u64(task, global_u32(&TASK_NVCSW_OFFSET));
    let nivcsw = read_task_u64(task, global_u32(&TASK_NIVCSW_OFFSET));
    if nvcsw.known && nivcsw.known {
        Known::some((nvcsw.value, nivcsw.value))
    } else {
        Known::none((0, 0))
    }
}

/// The per-CPU stats slot of a cgroup, created on first use.
#[inline(always)]
fn cgroup_stats(cgroup_id: u64) -> Option<*mut SchedStats> {
    per_cpu_slot(
        &CGROUP_SCHED,
        &cgroup_id,
        &SchedStats::ZERO,
        ProbeError::CgroupMapFull,
    )
}

/// Where this CPU credits a switch-out of `cgroup_id`: its direct slot when the agent placed it
/// in one, else its `CGROUP_SCHED` entry.
#[inline(always)]
fn switch_stats(cgroup_id: u64) -> Option<*mut SchedStats> {
    placed(&SCHED_SLOT_DIR, &SCHED_SLOTS, cgroup_id).or_else(|| cgroup_stats(cgroup_id))
}

/// When the outgoing thread went on this CPU, by the clock and by its own runtime.
#[derive(Clone, Copy)]
struct Since {
    /// The clock at its switch-in (0: not seen).
    ns: u64,
    /// Its `se.sum_exec_runtime` at its switch-in, when read.
    runtime: Known<u64>,
}

#[inline(always)]
fn on_switch(now: u64, prev: Prev, next_tid: u32, next_runtime: Known<u64>) {
    // SAFETY: a helper with no preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let prev_tid = prev.tid;
    let Some(on_cpu) = ON_CPU.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot; sched_switch does not nest on one CPU.
    let on_cpu = unsafe { &mut *on_cpu };
    // During sched_switch `current` is still `prev`. tid 0 is a CPU's idle task.
    if prev_tid != 0 {
        let since = if on_cpu.tid == prev_tid {
            Since {
                ns: on_cpu.since_ns,
                runtime: if on_cpu.flags & ON_CPU_HAS_RUNTIME != 0 {
                    Known::some(on_cpu.since_runtime_ns)
                } else {
                    Known::none(0)
                },
            }
        } else {
            Since {
                ns: 0,
                runtime: Known::none(0),
            }
        };
        switch_out(now, cpu, prev_tid, since, prev);
    }
    on_cpu.tid = next_tid;
    on_cpu.since_ns = now;
    if next_runtime.known {
        on_cpu.since_runtime_ns = next_runtime.value;
        on_cpu.flags = ON_CPU_HAS_RUNTIME;
    } else {
        on_cpu.flags = 0;
    }
}

#[inline(always)]
fn switch_out(now: u64, cpu: u32, tid: u32, since: Since, prev: Prev) {
    let oncpu_since = since.ns;
    let Some(stats) = switch_stats(prev.cgroup_id) else {
        return;
    };
    // SAFETY: a per-CPU map value of this CPU; sched_switch does not nest on one CPU.
    let stats = unsafe { &mut *stats };
    let Some(st) = TASKS.get_or_create(prev.task) else {
        // Only this switch's intervals are lost: its switch counts are in the thread's own
        // counters, which the next switch-out reads.
        count_error(ProbeError::TaskStorageBusy);
        return;
    };
    if prev.classic {
        take_pending_wakeup(st, tid, oncpu_since);
    }

    // An exiting thread's last switches are not counted: the kernel has already folded its
    // counters into the process totals (getrusage) before them, and nobody can read them
    // afterwards. Its time on the CPU is still credited. Its storage goes with its task_struct.
    let oncpu = on_cpu_time(st, now, since, prev.runtime);
    let ended = if prev.sched_info.known {
        waits_from_sched_info(st, oncpu_since, prev.sched_info.value)
    } else {
        waits_from_stamps(st, oncpu_since)
    };
    if prev.dead {
        credit_intervals(stats, st, oncpu, cpu, oncpu_since, ended);
        *st = TaskState::ZERO;
        return;
    }

    let (nvcsw, nivcsw) = prev.counters.value;
    let still_runnable = if prev.counters.known && st.flags & TASK_HAS_SWITCH_BASELINE != 0 {
        let voluntary = nvcsw.wrapping_sub(st.nvcsw);
        let involuntary = nivcsw.wrapping_sub(st.nivcsw);
        stats.voluntary_switches += voluntary;
        stats.involuntary_switches += involuntary;
        involuntary != 0 && voluntary == 0
    } else {
        // Without a counter baseline (a thread's first switch-out since attach, or no BTF),
        // the switch is classified from the tracepoint.
        count_by_state(stats, prev.runnable)
    };
    // A thread not seen before (fresh storage is zeros) has only its time on this CPU to credit.
    credit_intervals(stats, st, oncpu, cpu, oncpu_since, ended);
    let mut flags = TASK_SEEN | TASK_HAS_LAST_CPU | (st.flags & TASK_HAS_WAKER);
    if prev.counters.known {
        st.nvcsw = nvcsw;
        st.nivcsw = nivcsw;
        flags |= TASK_HAS_SWITCH_BASELINE;
    }
    if prev.sched_info.known {
        st.run_delay = prev.sched_info.value.run_delay;
        st.pcount = prev.sched_info.value.pcount as u32;
        flags |= TASK_HAS_RUN_DELAY;
    }
    if prev.classic && prev.runtime.known {
        st.runtime_ns = prev.runtime.value;
        flags |= TASK_HAS_RUNTIME_BASELINE;
    }
    st.flags = flags;
    st.last_cpu = cpu;
    st.offcpu_pending_ns = 0;
    if still_runnable {
        st.queued_since = now;
        st.blocked_since = 0;
    } else {
        st.blocked_since = now;
        st.queued_since = 0;
    }
}

/// Classic tracepoints: applies the thread's wake-up kept by `sched_wakeup_tp`, if it came
/// between its last switch-out and its switch-in (a later one found it running).
#[inline(always)]
fn take_pending_wakeup(st: &mut TaskState, tid: u32, oncpu_since: u64) {
    // SAFETY: the value is copied before the entry is deleted.
    let Some(woken_at) = (unsafe { PENDING_WAKEUPS.get(&tid) }).copied() else {
        return;
    };
    let _ = PENDING_WAKEUPS.remove(&tid);
    if oncpu_since == 0 || woken_at <= oncpu_since {
        apply_wakeup(st, woken_at, None);
    }
}

/// Without a counter baseline, the switch is classified from the tracepoint: involuntary when
/// the thread stays runnable. Returns whether it does.
#[inline(always)]
fn count_by_state(stats: &mut SchedStats, runnable: bool) -> bool {
    if runnable {
        stats.involuntary_switches += 1;
    } else {
        stats.voluntary_switches += 1;
    }
    runnable
}

/// The outgoing thread's time on this CPU since its switch-in: what the scheduler charged it
/// (`se.sum_exec_runtime` now minus at the switch-in, or minus at its last switch-out on
/// classic tracepoints, which is the same as it accrues only on a CPU). That excludes time the
/// hypervisor stole from the vCPU, as `cpu.stat` and `getrusage` do; the clock does not (seen:
/// +10% against `getrusage` on this 2-vCPU VM under load). The clock is used only when the
/// runtime cannot be read (no BTF) or, on classic tracepoints, for a thread's first interval.
#[inline(always)]
fn on_cpu_time(st: &TaskState, now: u64, since: Since, runtime: Known<u64>) -> u64 {
    if runtime.known && since.runtime.known {
        runtime.value.saturating_sub(since.runtime.value)
    } else if runtime.known && st.flags & TASK_HAS_RUNTIME_BASELINE != 0 {
        runtime.value.saturating_sub(st.runtime_ns)
    } else {
        now.saturating_sub(since.ns)
    }
}

/// The intervals before the thread's switch-in that ended with it, where they are known.
#[derive(Clone, Copy)]
struct Ended {
    /// The run-queue wait that ended at the switch-in.
    wait: Known<u64>,
    /// The time blocked before that wait (the time between its last switch-out and its wake-up).
    offcpu: Known<u64>,
}

impl Ended {
    /// Nothing known.
    const NONE: Self = Self {
        wait: Known::none(0),
        offcpu: Known::none(0),
    };
}

/// With `sched_info`: the kernel's `run_delay` grew by exactly the wait that ended at the
/// thread's switch-in since its last switch-out, when one switch-in (`pcount`) lies between. The
/// blocked time is the rest of the time it was off the CPU, when it had blocked there. A thread
/// we never saw leave a CPU has a known wait only on its first time on one (a thread created
/// since: all its waiting was for that one).
#[inline(always)]
fn waits_from_sched_info(st: &TaskState, oncpu_since: u64, info: SchedInfo) -> Ended {
    if st.flags & TASK_HAS_RUN_DELAY == 0 {
        return if info.pcount == 1 {
            Ended {
                wait: Known::some(info.run_delay),
                offcpu: Known::none(0),
            }
        } else {
            Ended::NONE
        };
    }
    if (info.pcount as u32).wrapping_sub(st.pcount) != 1 {
        // A switch-out we did not see (or a switch-in the kernel did not count) lies between.
        return Ended::NONE;
    }
    let wait = info.run_delay.wrapping_sub(st.run_delay);
    Ended {
        wait: Known::some(wait),
        offcpu: if oncpu_since != 0 && st.blocked_since != 0 {
            Known::some(
                oncpu_since
                    .saturating_sub(st.blocked_since)
                    .saturating_sub(wait),
            )
        } else {
            Known::none(0)
        },
    }
}

/// Without `sched_info`: from the times the wake-up programs and the last switch-out stamped.
/// A block whose wake-up we missed is not credited as off-CPU time.
#[inline(always)]
fn waits_from_stamps(st: &TaskState, oncpu_since: u64) -> Ended {
    if oncpu_since == 0 {
        return Ended::NONE;
    }
    Ended {
        wait: if st.queued_since != 0 && oncpu_since >= st.queued_since {
            Known::some(oncpu_since - st.queued_since)
        } else {
            Known::none(0)
        },
        offcpu: if st.blocked_since == 0 {
            Known::some(st.offcpu_pending_ns)
        } else {
            Known::none(0)
        },
    }
}

/// Credits the intervals that ended since the thread last left a CPU: its time on this CPU
/// (`oncpu`, from [`on_cpu_time`]), and those [`Ended`] with its switch-in: the off-CPU time
/// and the run-queue wait (by wake-up kind when it was a wake-up).
#[inline(always)]
fn credit_intervals(
    stats: &mut SchedStats,
    st: &TaskState,
    oncpu: u64,
    cpu: u32,
    oncpu_since: u64,
    ended: Ended,
) {
    if oncpu_since != 0 {
        stats.oncpu_ns += oncpu;
    }
    if ended.offcpu.known {
        stats.offcpu_ns += ended.offcpu.value;
    }
    if ended.wait.known {
        let waited = ended.wait.value;
        stats.runq.record(waited);
        if st.flags & (TASK_WOKEN | TASK_WAKE_KNOWN) == TASK_WOKEN | TASK_WAKE_KNOWN {
            if st.flags & TASK_WAKE_REMOTE != 0 {
                stats.wake_remote.record(waited);
            } else {
                stats.wake_local.record(waited);
            }
        }
    }
    if st.flags & TASK_HAS_LAST_CPU != 0 && st.last_cpu != cpu {
        stats.migrations += 1;
    }
}

// ---- run-queue blame -------------------------------------------------------------------------

/// While the agent asks (`RUNQ_BLAME_ON`), splits each run-queue wait that ends at this switch
/// by what held this CPU meanwhile. The wait is the kernel's own: from the incoming thread's
/// `sched_info.last_queued` (stamped by `sched_info_enqueue` when it was put on this CPU's run
/// queue, in this run queue's clock; cleared by `sched_info_arrive` only after this tracepoint)
/// to now. What held the CPU is this CPU's ring of its last runs ([`RunRing`]), each closed at
/// its switch-out here: its task's cgroup, a kernel thread or the idle task, less the time the
/// task was not charged for (stolen). A wait that began on another CPU and was migrated here
/// has its earlier part in `run_delay` already (`sched_info_dequeue`): only the part on this
/// CPU is blamed, and the agent reads the rest as the difference.
#[inline(always)]
fn blame(
    now: u64,
    prev_runtime: Known<u64>,
    next: *const u8,
    next_tid: u32,
    next_runtime: Known<u64>,
) {
    let epoch = match RUNQ_BLAME_ON.get(0) {
        Some(e) if *e != 0 => *e,
        _ => return,
    };
    let Some(ring) = RUNQ_RUNS_MAP.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot; sched_switch does not nest on one CPU.
    let ring = unsafe { &mut *ring };
    if ring.epoch != epoch {
        ring.epoch = epoch;
        ring.head = 0;
        ring.len = 0;
        ring.current_valid = 0;
    }
    if ring.current_valid == 1 {
        let len = now.saturating_sub(ring.current_start);
        let charged = if prev_runtime.known && ring.current_culprit != culprit::IDLE {
            prev_runtime.value.saturating_sub(ring.current_runtime)
        } else {
            len
        };
        let stolen = len.saturating_sub(charged);
        // A run of the same culprit right after the newest (two threads of one container
        // taking turns) extends it: the ring keeps changes of hands, so it reaches further back.
        let newest = (ring.head.wrapping_sub(1) as usize) & (RUNQ_RUNS - 1);
        let last = &mut ring.runs[newest];
        if ring.len > 0 && last.culprit == ring.current_culprit && last.end == ring.current_start {
            last.end = now;
            last.stolen += stolen;
        } else {
            let idx = (ring.head as usize) & (RUNQ_RUNS - 1);
            ring.runs[idx] = Run {
                start: ring.current_start,
                end: now,
                stolen,
                culprit: ring.current_culprit,
            };
            ring.head = ring.head.wrapping_add(1);
            if ring.len < RUNQ_RUNS as u32 {
                ring.len += 1;
            }
        }
    }
    let who = if next_tid == 0 {
        culprit::IDLE
    } else if typed::<u32>(next, global_u32(&TASK_FLAGS_OFFSET)) & PF_KTHREAD != 0 {
        culprit::KERNEL
    } else {
        task_cgroup_id(next)
    };
    ring.current_valid = 1;
    ring.current_start = now;
    ring.current_runtime = next_runtime.value;
    ring.current_culprit = who;
    if who == culprit::IDLE || who == culprit::KERNEL {
        return;
    }
    let queued: u64 = typed(next, global_u32(&TASK_LAST_QUEUED_OFFSET));
    if queued == 0 || queued >= now {
        return;
    }
    blame_wait(ring, who, queued, now);
}

/// Credits `victim`'s wait since `queued` to the runs of `ring` it overlaps, newest first; what
/// began before the oldest run kept is [`culprit::UNSEEN`].
#[inline(always)]
fn blame_wait(ring: &RunRing, victim: u64, queued: u64, now: u64) {
    let head = ring.head;
    let len = ring.len;
    // The newest run ends now (it was closed at this switch), so each run's overlap begins at
    // the later of its start and `queued` and ends at its end; runs are contiguous.
    let mut covered = now;
    let mut i: u32 = 0;
    while i < RUNQ_RUNS as u32 {
        if i >= len {
            break;
        }
        let idx = (head.wrapping_sub(1 + i) as usize) & (RUNQ_RUNS - 1);
        let run = ring.runs[idx];
        if run.end <= queued {
            covered = queued;
            break;
        }
        let from = if run.start > queued {
            run.start
        } else {
            queued
        };
        let overlap = run.end.saturating_sub(from);
        let run_len = run.end.saturating_sub(run.start);
        let stolen = if overlap >= run_len {
            run.stolen
        } else if run_len < (1 << 32) {
            // Both below 2^32 ns: the product fits (BPF has no 128-bit multiply).
            run.stolen * overlap / run_len
        } else {
            // A run over 4 s: its share in 1/1024ths.
            run.stolen / 1024 * (overlap * 1024 / run_len)
        };
        add_blame(victim, run.culprit, overlap.saturating_sub(stolen));
        add_blame(victim, culprit::STOLEN, stolen);
        covered = from;
        i += 1;
    }
    if covered > queued {
        add_blame(victim, culprit::UNSEEN, covered - queued);
    }
}

#[inline(always)]
fn add_blame(victim: u64, culprit: u64, ns: u64) {
    if ns == 0 {
        return;
    }
    let key = RunqBlameKey { victim, culprit };
    if let Some(v) = RUNQ_BLAME.get_ptr_mut(&key) {
        // SAFETY: this CPU's value; sched_switch does not nest on one CPU.
        unsafe { (*v).ns += ns };
        return;
    }
    if RUNQ_BLAME
        .insert(&key, &RunqBlameValue { ns }, BPF_NOEXIST)
        .is_err()
    {
        count_error(ProbeError::RunqBlameFull);
    }
}
