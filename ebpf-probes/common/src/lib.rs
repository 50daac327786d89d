//! The ABI shared by the eBPF probes (`stormwatch-ebpf`) and the agent.
//!
//! Every type here is `#[repr(C)]`, made of fixed-width integers only and laid out without
//! implicit padding, so that both sides agree on it byte for byte. Map names are constants:
//! the agent never retypes them as strings. The size tests at the bottom catch layout drift.
#![no_std]

/// Map names, as the kernel object declares them.
pub mod maps {
    /// Per-CPU hash: cgroup id (u64) → [`crate::SchedStats`].
    pub const CGROUP_SCHED: &str = "CGROUP_SCHED";
    /// LRU hash: thread id (u32) → [`crate::TaskState`], the per-thread scratch state.
    pub const TASKS: &str = "TASKS";
    /// Per-CPU array: [`crate::ProbeError`] index → count of events the probes could not record.
    pub const PROBE_ERRORS: &str = "PROBE_ERRORS";
}

/// Read-only globals the agent fills in before load. The eBPF programs read them with
/// `read_volatile` so the compiler cannot fold the placeholder zeros; the verifier sees the
/// frozen values and drops dead branches.
pub mod globals {
    /// `offsetof(struct task_struct, pid)`, from the running kernel's BTF.
    pub const TASK_PID_OFFSET: &str = "TASK_PID_OFFSET";
    /// `offsetof(struct task_struct, __state)` (`state` before 5.14).
    pub const TASK_STATE_OFFSET: &str = "TASK_STATE_OFFSET";
    /// `offsetof(struct task_struct, nvcsw)`.
    pub const TASK_NVCSW_OFFSET: &str = "TASK_NVCSW_OFFSET";
    /// `offsetof(struct task_struct, nivcsw)`.
    pub const TASK_NIVCSW_OFFSET: &str = "TASK_NIVCSW_OFFSET";
    /// Classic tracepoint fallback: offset of `next_pid` in the `sched_switch` record.
    pub const TP_SWITCH_NEXT_PID_OFFSET: &str = "TP_SWITCH_NEXT_PID_OFFSET";
    /// Classic tracepoint fallback: offset of `pid` in the `sched_wakeup` record.
    pub const TP_WAKEUP_PID_OFFSET: &str = "TP_WAKEUP_PID_OFFSET";
    /// Classic tracepoint fallback: offset of `prev_state` in the `sched_switch` record.
    pub const TP_SWITCH_PREV_STATE_OFFSET: &str = "TP_SWITCH_PREV_STATE_OFFSET";
    /// 1 when the `TASK_*_OFFSET` globals hold real offsets (the kernel has BTF).
    pub const HAVE_TASK_OFFSETS: &str = "HAVE_TASK_OFFSETS";
}

/// Program names, as the kernel object declares them (the function names).
pub mod programs {
    pub const SCHED_SWITCH_BTF: &str = "sched_switch_btf";
    pub const SCHED_WAKEUP_BTF: &str = "sched_wakeup_btf";
    pub const SCHED_WAKEUP_NEW_BTF: &str = "sched_wakeup_new_btf";
    pub const SCHED_SWITCH_TP: &str = "sched_switch_tp";
    pub const SCHED_WAKEUP_TP: &str = "sched_wakeup_tp";
    pub const SCHED_WAKEUP_NEW_TP: &str = "sched_wakeup_new_tp";
}

/// Number of log2 buckets in a latency histogram. Bucket `b` counts values `v` (in ns) with
/// `bit_length(v) == b`, i.e. `2^(b-1) <= v < 2^b`; bucket 0 counts zeros. The last bucket also
/// takes everything larger: `2^(LOG2_BUCKETS-2)` ns is about 1.07 s.
pub const LOG2_BUCKETS: usize = 32;

/// The bucket of a value in ns: its bit length, clamped to the last bucket.
#[inline(always)]
pub const fn log2_bucket(value_ns: u64) -> usize {
    let bits = (u64::BITS - value_ns.leading_zeros()) as usize;
    if bits >= LOG2_BUCKETS {
        LOG2_BUCKETS - 1
    } else {
        bits
    }
}

/// A log2 histogram of nanosecond values, with its count and exact sum.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Log2Histogram {
    pub count: u64,
    pub sum_ns: u64,
    pub buckets: [u64; LOG2_BUCKETS],
}

impl Log2Histogram {
    pub const ZERO: Self = Self {
        count: 0,
        sum_ns: 0,
        buckets: [0; LOG2_BUCKETS],
    };

    #[inline(always)]
    pub fn record(&mut self, value_ns: u64) {
        self.count += 1;
        self.sum_ns += value_ns;
        let b = log2_bucket(value_ns);
        // The bound check keeps the verifier happy; `log2_bucket` never exceeds it.
        if b < LOG2_BUCKETS {
            self.buckets[b] += 1;
        }
    }
}

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
    /// Time on a CPU, credited when the thread is switched out.
    pub oncpu_ns: u64,
    /// Time blocked (switched out not runnable, until woken), credited when the thread next
    /// leaves the CPU.
    pub offcpu_ns: u64,
    /// Run-queue latency: from wake-up (or preemption) until the thread is back on a CPU.
    pub runq: Log2Histogram,
}

impl SchedStats {
    pub const ZERO: Self = Self {
        voluntary_switches: 0,
        involuntary_switches: 0,
        migrations: 0,
        oncpu_ns: 0,
        offcpu_ns: 0,
        runq: Log2Histogram::ZERO,
    };
}

/// `TaskState::flags`: the `nvcsw`/`nivcsw` fields hold the thread's counters as of its last
/// switch-out, so the next switch-out can count exactly what the kernel counted.
pub const TASK_HAS_SWITCH_BASELINE: u32 = 1 << 0;
/// `TaskState::flags`: `runq_pending_ns` holds a run-queue latency not yet credited.
pub const TASK_HAS_RUNQ_PENDING: u32 = 1 << 1;
/// `TaskState::flags`: `last_cpu` is valid.
pub const TASK_HAS_LAST_CPU: u32 = 1 << 2;

/// Per-thread scratch state. Intervals are credited to the thread's cgroup when the thread
/// leaves the CPU, because only then is it `current`, and `bpf_get_current_cgroup_id()` names its
/// cgroup without reading kernel structures.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskState {
    /// When the thread last went on a CPU (0: unknown).
    pub oncpu_since: u64,
    /// When the thread blocked (0: not blocked, or unknown).
    pub blocked_since: u64,
    /// When the thread became runnable without a CPU (0: not queued, or unknown).
    pub queued_since: u64,
    /// Blocked time that ended with a wake-up and is not yet credited.
    pub offcpu_pending_ns: u64,
    /// Run-queue latency measured at the last switch-in, not yet credited.
    pub runq_pending_ns: u64,
    /// `task_struct::nvcsw` at the last switch-out.
    pub nvcsw: u64,
    /// `task_struct::nivcsw` at the last switch-out.
    pub nivcsw: u64,
    pub last_cpu: u32,
    pub flags: u32,
}

impl TaskState {
    pub const ZERO: Self = Self {
        oncpu_since: 0,
        blocked_since: 0,
        queued_since: 0,
        offcpu_pending_ns: 0,
        runq_pending_ns: 0,
        nvcsw: 0,
        nivcsw: 0,
        last_cpu: 0,
        flags: 0,
    };
}

/// What the probes could not record, as indices into the `PROBE_ERRORS` per-CPU array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeError {
    /// A cgroup could not get a slot in `CGROUP_SCHED` (the map is full).
    CgroupMapFull = 0,
    /// A thread could not get a slot in `TASKS`.
    TaskMapUpdate = 1,
    /// Reading a `task_struct` field failed.
    TaskRead = 2,
}

impl ProbeError {
    pub const COUNT: u32 = 3;
    pub const ALL: [ProbeError; Self::COUNT as usize] =
        [Self::CgroupMapFull, Self::TaskMapUpdate, Self::TaskRead];

    pub const fn name(self) -> &'static str {
        match self {
            Self::CgroupMapFull => "cgroup_map_full",
            Self::TaskMapUpdate => "task_map_update",
            Self::TaskRead => "task_read",
        }
    }
}

/// `TASK_DEAD` in `task_struct::__state`: the thread's final switch.
pub const TASK_DEAD: u32 = 0x0080;

#[cfg(feature = "user")]
mod user {
    use super::{SchedStats, TaskState};
    // SAFETY: plain #[repr(C)] structs of u64/u32 with no padding (see the size tests).
    unsafe impl aya::Pod for SchedStats {}
    // SAFETY: as above.
    unsafe impl aya::Pod for TaskState {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_padding() {
        assert_eq!(size_of::<Log2Histogram>(), 8 * (2 + LOG2_BUCKETS));
        assert_eq!(size_of::<SchedStats>(), 8 * 5 + size_of::<Log2Histogram>());
        assert_eq!(size_of::<TaskState>(), 8 * 7 + 4 * 2);
    }

    #[test]
    fn log2_buckets_are_bit_lengths() {
        assert_eq!(log2_bucket(0), 0);
        assert_eq!(log2_bucket(1), 1);
        assert_eq!(log2_bucket(2), 2);
        assert_eq!(log2_bucket(3), 2);
        assert_eq!(log2_bucket(4), 3);
        assert_eq!(log2_bucket(1023), 10);
        assert_eq!(log2_bucket(1024), 11);
        assert_eq!(log2_bucket(u64::MAX), LOG2_BUCKETS - 1);
        assert_eq!(log2_bucket(1 << 40), LOG2_BUCKETS - 1);
    }

    #[test]
    fn histogram_records_count_sum_and_bucket() {
        let mut h = Log2Histogram::ZERO;
        h.record(1500);
        h.record(1500);
        h.record(3);
        assert_eq!(h.count, 3);
        assert_eq!(h.sum_ns, 3003);
        assert_eq!(h.buckets[11], 2);
        assert_eq!(h.buckets[2], 1);
    }
}
