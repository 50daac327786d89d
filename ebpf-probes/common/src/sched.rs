//! The scheduler family: per-cgroup context switches, run-queue latency, on/off-CPU time and
//! migrations, and the per-thread and per-CPU state behind them. Written by the kernel's `sched.rs`
//! (`CGROUP_SCHED` and its direct slots `SCHED_SLOTS`, `TASKS`, `ON_CPU`); read by the agent's
//! `probes/sched.rs`, which adds each placed cgroup's slot to its `CGROUP_SCHED` figures.

use crate::histogram::Log2Histogram;

/// Scheduler figures of one cgroup on one CPU, summed over CPUs by the agent. All counters only
/// grow; the agent turns them into per-window deltas.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedStats {
    /// Switches where the thread gave up the CPU (it blocked): the kernel's `nvcsw`.
    pub voluntary_switches: u64,
    /// Switches where the thread was preempted while runnable: the kernel's `nivcsw`.
    pub involuntary_switches: u64,
    /// Times a thread resumed on a different CPU than the one it last ran on.
    pub migrations: u64,
    /// Time on a CPU, credited when the thread is switched out: the scheduler's own charge
    /// (`se.sum_exec_runtime` deltas), so time the hypervisor stole from the vCPU is not in it,
    /// exactly as it is not in `cpu.stat` or `getrusage`.
    pub oncpu_ns: u64,
    /// Time blocked (switched out not runnable, until woken), credited when the thread next
    /// leaves the CPU.
    pub offcpu_ns: u64,
    /// Run-queue latency: from wake-up (or preemption) until the thread is back on a CPU.
    pub runq: Log2Histogram,
    /// Wake-ups where the waker ran on the CPU whose run queue the thread was put on, with the
    /// run-queue latency that followed each.
    pub wake_local: Log2Histogram,
    /// Wake-ups where the waker ran on another CPU than the one the thread was queued on (an
    /// inter-processor interrupt, a VM exit on most hypervisors), with their run-queue latency.
    pub wake_remote: Log2Histogram,
}

impl SchedStats {
    pub const ZERO: Self = Self {
        voluntary_switches: 0,
        involuntary_switches: 0,
        migrations: 0,
        oncpu_ns: 0,
        offcpu_ns: 0,
        runq: Log2Histogram::ZERO,
        wake_local: Log2Histogram::ZERO,
        wake_remote: Log2Histogram::ZERO,
    };
}

/// `TaskState::flags`: the `nvcsw`/`nivcsw` fields hold the thread's counters as of its last
/// switch-out, so the next switch-out can count exactly what the kernel counted.
pub const TASK_HAS_SWITCH_BASELINE: u32 = 1 << 0;
/// `TaskState::flags`: `queued_since` was set by a wake-up (not a preemption), whose kind is
/// [`TASK_WAKE_REMOTE`] (when [`TASK_WAKE_KNOWN`]).
pub const TASK_WOKEN: u32 = 1 << 1;
/// `TaskState::flags`: `last_cpu` is valid.
pub const TASK_HAS_LAST_CPU: u32 = 1 << 2;
/// `TaskState::flags`: the last wake-up came from another CPU than the one it queued on.
pub const TASK_WAKE_REMOTE: u32 = 1 << 3;
/// `TaskState::flags`: the last wake-up's kind is known (`sched_waking` saw the waker's CPU).
pub const TASK_WAKE_KNOWN: u32 = 1 << 4;
/// `TaskState::flags`: `waker_cpu` holds the CPU of the pending wake-up's waker.
pub const TASK_HAS_WAKER: u32 = 1 << 5;
/// `TaskState::flags`: the state was initialised (a fresh task storage is all zeros).
pub const TASK_SEEN: u32 = 1 << 6;
/// `TaskState::flags`: `runtime_ns` holds the thread's `se.sum_exec_runtime` as of its last
/// switch-out (classic tracepoints, which cannot read the incoming thread's).
pub const TASK_HAS_RUNTIME_BASELINE: u32 = 1 << 7;
/// `TaskState::run_delay` and `pcount` hold the thread's `sched_info` as of its last switch-out.
pub const TASK_HAS_RUN_DELAY: u32 = 1 << 8;

/// Per-thread scratch state, in task storage. Intervals are credited to the thread's cgroup when
/// the thread leaves the CPU. When it went on the CPU is not kept here but in the CPU's [`OnCpu`]
/// slot, so that a switch touches only the outgoing thread's state.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskState {
    /// When the thread blocked (0: not blocked, or unknown).
    pub blocked_since: u64,
    /// When the thread became runnable without a CPU (0: not queued, or unknown).
    pub queued_since: u64,
    /// Blocked time that ended with a wake-up and is not yet credited.
    pub offcpu_pending_ns: u64,
    /// `task_struct::nvcsw` at the last switch-out.
    pub nvcsw: u64,
    /// `task_struct::nivcsw` at the last switch-out.
    pub nivcsw: u64,
    /// `task_struct::se.sum_exec_runtime` at the last switch-out (classic tracepoints only).
    pub runtime_ns: u64,
    pub last_cpu: u32,
    pub flags: u32,
    /// The CPU `sched_waking` ran on for the pending wake-up (the waker's).
    pub waker_cpu: u32,
    /// `task_struct::sched_info.pcount` at the last switch-out, its low 32 bits (valid with
    /// [`TASK_HAS_RUN_DELAY`]): how many times the thread had gone on a CPU.
    pub pcount: u32,
    /// `task_struct::sched_info.run_delay` at the last switch-out (valid with
    /// [`TASK_HAS_RUN_DELAY`]).
    pub run_delay: u64,
}

impl TaskState {
    pub const ZERO: Self = Self {
        blocked_since: 0,
        queued_since: 0,
        offcpu_pending_ns: 0,
        nvcsw: 0,
        nivcsw: 0,
        runtime_ns: 0,
        last_cpu: 0,
        flags: 0,
        waker_cpu: 0,
        pcount: 0,
        run_delay: 0,
    };
}

/// Which thread went on this CPU, and when (per CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OnCpu {
    /// `bpf_ktime_get_ns()` at the switch-in.
    pub since_ns: u64,
    /// The thread's `se.sum_exec_runtime` at the switch-in (valid with [`ON_CPU_HAS_RUNTIME`]).
    pub since_runtime_ns: u64,
    pub tid: u32,
    pub flags: u32,
}

/// `OnCpu::flags`: `since_runtime_ns` is valid (tp_btf, which has the incoming task).
pub const ON_CPU_HAS_RUNTIME: u32 = 1 << 0;

/// Who held a CPU while a thread waited in its run queue ([`RunqBlameKey::culprit`]): a cgroup
/// v2 id for a task's time, or one of these. Cgroup ids are kernfs node ids, never 0 and far
/// below these.
pub mod culprit {
    /// The CPU ran its idle task: the thread was queued on an idle CPU that had yet to wake.
    pub const IDLE: u64 = 0;
    /// A kernel thread (`PF_KTHREAD`) held the CPU.
    pub const KERNEL: u64 = u64::MAX;
    /// The run's clock advanced without the task being charged for it (`rq->clock` against
    /// `se.sum_exec_runtime`): time stolen by the hypervisor, or interrupts where the kernel
    /// accounts them apart.
    pub const STOLEN: u64 = u64::MAX - 1;
    /// The wait began before the oldest run this CPU remembers ([`super::RUNQ_RUNS`] runs, or the
    /// blame was turned on meanwhile): not attributed.
    pub const UNSEEN: u64 = u64::MAX - 2;
}

/// How many of a CPU's last runs it keeps to blame a wait on ([`RunRing`]).
pub const RUNQ_RUNS: usize = 128;

/// A thread's run-queue wait on one CPU, split by what held that CPU meanwhile: the key of
/// `RUNQ_BLAME`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RunqBlameKey {
    /// The cgroup v2 id of the thread that waited.
    pub victim: u64,
    /// What held the CPU: a cgroup v2 id, or one of [`culprit`]'s.
    pub culprit: u64,
}

/// Time waited, in ns, summed over the waits that ended on a CPU (per-CPU values).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunqBlameValue {
    pub ns: u64,
}

impl RunqBlameValue {
    pub const ZERO: Self = Self { ns: 0 };
}

/// One stretch of a CPU held by one task, from switch-in to switch-out (run-queue clock).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub start: u64,
    pub end: u64,
    /// Of `end - start`, what the task was not charged for ([`culprit::STOLEN`]).
    pub stolen: u64,
    /// Whose run: a cgroup v2 id or a [`culprit`] constant.
    pub culprit: u64,
}

/// A CPU's last runs (a ring; `runs[(head - 1) % RUNQ_RUNS]` is the newest) and the run in
/// progress, for blaming the waits that end on it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunRing {
    /// The blame epoch these runs belong to (`RUNQ_BLAME_ON`'s value when written): a CPU that
    /// finds another starts over, so no run from before the blame was last turned off is used.
    pub epoch: u32,
    /// Where the next run is written.
    pub head: u32,
    /// How many runs are valid (at most [`RUNQ_RUNS`]).
    pub len: u32,
    /// 1 when the `current_*` fields describe the run in progress.
    pub current_valid: u32,
    pub current_start: u64,
    /// The running task's `se.sum_exec_runtime` at its switch-in.
    pub current_runtime: u64,
    pub current_culprit: u64,
    pub runs: [Run; RUNQ_RUNS],
}

// SAFETY (all): plain #[repr(C)] structs of fixed-width integers with no padding (see the
// size tests).
#[cfg(feature = "user")]
mod user {
    unsafe impl aya::Pod for super::SchedStats {}
    unsafe impl aya::Pod for super::TaskState {}
    unsafe impl aya::Pod for super::OnCpu {}
    unsafe impl aya::Pod for super::RunqBlameKey {}
    unsafe impl aya::Pod for super::RunqBlameValue {}
    unsafe impl aya::Pod for super::RunRing {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_padding() {
        assert_eq!(
            size_of::<SchedStats>(),
            8 * 5 + 3 * size_of::<Log2Histogram>()
        );
        assert_eq!(size_of::<TaskState>(), 8 * 7 + 4 * 4);
        assert_eq!(size_of::<OnCpu>(), 8 * 2 + 4 * 2);
        assert_eq!(size_of::<RunqBlameKey>(), 16);
        assert_eq!(size_of::<RunqBlameValue>(), 8);
        assert_eq!(size_of::<Run>(), 32);
        assert_eq!(size_of::<RunRing>(), 4 * 4 + 8 * 3 + 32 * RUNQ_RUNS);
    }
}
