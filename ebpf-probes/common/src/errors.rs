//! What the probes could not record, by kind: the indices of `PROBE_ERRORS`, counted by the
//! kernel's `shared.rs` (`count_error`) for every family but the network's (which has its own,
//! [`crate::net::NetProbeError`]); read by the agent's `probes/mod.rs`.

/// What the probes could not record, as indices into the `PROBE_ERRORS` per-CPU array. Each is
/// documented for users in agent/CLI.md ("Lost events").
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeError {
    /// A cgroup could not get a slot in `CGROUP_SCHED`, `CGROUP_FUTEX` or `CGROUP_LOCKS` (the map
    /// is full): that event's figures are lost.
    CgroupMapFull = 0,
    /// The kernel refused a thread's scheduler task storage (busy on this CPU, or out of memory):
    /// that switch's intervals are not credited. Its switches are not lost: the next switch-out
    /// counts them from the thread's own counters.
    TaskStorageBusy = 1,
    /// Reading a `task_struct` field failed.
    TaskRead = 2,
    /// The kernel refused a thread's futex task storage at a call's entry: that call is not
    /// timed (and its exit is then also counted as unpaired).
    FutexStorageBusy = 3,
    /// A futex call ended whose entry we did not see (it began before attach, or its entry was
    /// lost as `futex_storage_busy`).
    FutexUnpairedExit = 4,
    /// A hot-futex entry could not be created (`HOT_FUTEXES` full).
    HotFutexFull = 5,
    /// The kernel refused a thread's lock task storage at `contention_begin`: that wait is not
    /// timed (its end is then also counted as unpaired).
    LockStorageBusy = 6,
    /// A `contention_end` without its `contention_begin` (nested or before attach).
    LockUnpairedEnd = 7,
    /// A contended call site's stack could not be taken or stored.
    LockStackFailed = 8,
    /// A contended call site could not be recorded (`LOCK_SITES` full).
    LockSiteFull = 9,
    /// Classic tracepoints only: a wake-up could not be kept until its thread's switch-out
    /// (`PENDING_WAKEUPS` full): that wake's off-CPU and run-queue time are not credited.
    PendingWakeupFull = 10,
    /// A thread's hand-off entry could not be created (`HANDOFF_THREADS` full): its part in
    /// hand-offs is not told apart (the cgroup's futex figures still count it).
    HandoffThreadsFull = 11,
    /// A sampled side of a hand-off could not be written (the ring buffer was full) or its
    /// stack could not be read: that hand-off names no call site.
    HandoffSampleLost = 12,
    /// A run-queue wait's share could not be added to `RUNQ_BLAME` (the map is full): that
    /// part of the wait is blamed on no one.
    RunqBlameFull = 13,
    /// An on-CPU sample of a Go process could not be counted (`GO_ONCPU` is full): the
    /// process's share of samples in its mutex's code is then of fewer samples.
    GoOnCpuFull = 14,
}

impl ProbeError {
    pub const COUNT: u32 = 15;
    pub const ALL: [ProbeError; Self::COUNT as usize] = [
        Self::CgroupMapFull,
        Self::TaskStorageBusy,
        Self::TaskRead,
        Self::FutexStorageBusy,
        Self::FutexUnpairedExit,
        Self::HotFutexFull,
        Self::LockStorageBusy,
        Self::LockUnpairedEnd,
        Self::LockStackFailed,
        Self::LockSiteFull,
        Self::PendingWakeupFull,
        Self::HandoffThreadsFull,
        Self::HandoffSampleLost,
        Self::RunqBlameFull,
        Self::GoOnCpuFull,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Self::CgroupMapFull => "cgroup_map_full",
            Self::TaskStorageBusy => "task_storage_busy",
            Self::TaskRead => "task_read",
            Self::FutexStorageBusy => "futex_storage_busy",
            Self::FutexUnpairedExit => "futex_unpaired_exit",
            Self::HotFutexFull => "hot_futex_full",
            Self::LockStorageBusy => "lock_storage_busy",
            Self::LockUnpairedEnd => "lock_unpaired_end",
            Self::LockStackFailed => "lock_stack_failed",
            Self::LockSiteFull => "lock_site_full",
            Self::PendingWakeupFull => "pending_wakeup_full",
            Self::HandoffThreadsFull => "handoff_threads_full",
            Self::HandoffSampleLost => "handoff_sample_lost",
            Self::RunqBlameFull => "runq_blame_full",
            Self::GoOnCpuFull => "go_oncpu_full",
        }
    }
}
