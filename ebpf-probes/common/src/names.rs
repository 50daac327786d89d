//! The names of the kernel object's maps, read-only globals and programs (the network family's are
//! in [`crate::net`]): the agent finds them by these constants, never by retyped strings.

/// Map names, as the kernel object declares them.
pub mod maps {
    /// Per-CPU hash: cgroup id (u64) → [`crate::SchedStats`].
    pub const CGROUP_SCHED: &str = "CGROUP_SCHED";
    /// Task storage: thread → [`crate::TaskState`], the per-thread scratch state. Kept in the
    /// thread's own `task_struct`: never evicted, freed with the thread.
    pub const TASKS: &str = "TASKS";
    /// Per-CPU array (one slot): [`crate::OnCpu`], which thread runs on this CPU since when.
    pub const ON_CPU: &str = "ON_CPU";
    /// Array of [`crate::slots::SLOTS`] u64: the cgroups placed in `SCHED_SLOTS` (0: free),
    /// written by the agent.
    pub const SCHED_SLOT_DIR: &str = "SCHED_SLOT_DIR";
    /// Per-CPU array of [`crate::slots::SLOTS`] [`crate::SchedStats`]: the placed cgroups'
    /// switch-outs. A cgroup's figures are its `CGROUP_SCHED` values plus its slot's.
    pub const SCHED_SLOTS: &str = "SCHED_SLOTS";
    /// Hash: thread id (u32) → wake-up time (u64), for the classic-tracepoint fallback only,
    /// whose `sched_wakeup` names the thread by id and cannot reach its task storage. Consumed
    /// at the thread's next switch-out.
    pub const PENDING_WAKEUPS: &str = "PENDING_WAKEUPS";
    /// Per-CPU hash: [`crate::RunqBlameKey`] → [`crate::RunqBlameValue`], run-queue waits split
    /// by what held the CPU meanwhile (written while `RUNQ_BLAME_ON` is non-zero).
    pub const RUNQ_BLAME: &str = "RUNQ_BLAME";
    /// Per-CPU array (one slot): [`crate::RunRing`], the CPU's last runs.
    pub const RUNQ_RUNS: &str = "RUNQ_RUNS";
    /// Array (one u32): 0 while the switch program blames no wait; else the blame epoch, which
    /// the agent raises each time it turns the blame on.
    pub const RUNQ_BLAME_ON: &str = "RUNQ_BLAME_ON";
    /// Per-CPU array: [`crate::ProbeError`] index → count of events the probes could not record.
    pub const PROBE_ERRORS: &str = "PROBE_ERRORS";
    /// Per-CPU hash: cgroup id (u64) → [`crate::FutexStats`].
    pub const CGROUP_FUTEX: &str = "CGROUP_FUTEX";
    /// Array of [`crate::slots::SLOTS`] u64: the cgroups placed in `FUTEX_SLOTS` (0: free),
    /// written by the agent (see [`crate::slots`]).
    pub const FUTEX_SLOT_DIR: &str = "FUTEX_SLOT_DIR";
    /// Per-CPU array of [`crate::slots::SLOTS`] [`crate::FutexStats`]: the placed cgroups'
    /// figures, beside their `CGROUP_FUTEX` entries.
    pub const FUTEX_SLOTS: &str = "FUTEX_SLOTS";
    /// Per-CPU hash: [`crate::HotFutexKey`] → [`crate::HotFutexValue`], the bounded top-N
    /// source; the agent deletes the entries of exited processes and idle ones.
    pub const HOT_FUTEXES: &str = "HOT_FUTEXES";
    /// Task storage: thread → [`crate::FutexInflight`], the futex syscall in progress.
    pub const FUTEX_INFLIGHT: &str = "FUTEX_INFLIGHT";
    /// Hash: thread id (u32) → [`crate::ThreadHandoff`], each thread's part in futex hand-offs
    /// (written only by the thread's own futex exits); the agent deletes exited threads.
    pub const HANDOFF_THREADS: &str = "HANDOFF_THREADS";
    /// Array (one slot): u32, the futex probes' attach epoch. The agent raises it before each
    /// attach of the on-demand futex probes; an entry kept in an earlier epoch (its exit ran
    /// while the probes were detached) is then never paired with a later exit.
    pub const FUTEX_EPOCH: &str = "FUTEX_EPOCH";
    /// Ring buffer of [`crate::HandoffSample`]s: both sides of the hand-offs sampled (a wake
    /// chosen at its entry, at most one per [`crate::globals::HANDOFF_SAMPLE_INTERVAL_NS`] per
    /// CPU, and the first waiter on its word to return from a wait after it began).
    pub const HANDOFF_SAMPLES: &str = "HANDOFF_SAMPLES";
    /// Hash: [`crate::PendingWakeKey`] → [`crate::PendingWake`], a sampled wake whose waiter
    /// has not returned yet (taken by that waiter, or replaced by the word's next sampled wake).
    pub const PENDING_WAKES: &str = "PENDING_WAKES";
    /// Per-CPU array (one slot): [`crate::HandoffSampler`], the rate limit of wake samples.
    pub const HANDOFF_SAMPLER: &str = "HANDOFF_SAMPLER";
    /// Per-CPU hash: cgroup id (u64) → [`crate::GoMutexCalls`], the entries of Go's
    /// `sync.Mutex` slow paths (uprobes the agent attaches to Go binaries).
    pub const GO_MUTEX_CALLS: &str = "GO_MUTEX_CALLS";
    /// Array (one u32): 1 while the agent counts Go mutex calls (the uprobes are attached a
    /// little before and detached a little after: the count is of this span exactly).
    pub const GO_MUTEX_ON: &str = "GO_MUTEX_ON";
    /// Per-CPU array (one slot): [`crate::HandoffSampler`], the rate limit of Go mutex samples.
    pub const GO_MUTEX_SAMPLER: &str = "GO_MUTEX_SAMPLER";
    /// Hash: tgid (u32) → 1, the Go processes the on-CPU sampler counts (written by the agent:
    /// those whose runtime clocks it reads).
    pub const GO_ONCPU_TGIDS: &str = "GO_ONCPU_TGIDS";
    /// Per-CPU hash: [`crate::GoOnCpuKey`] → u64 samples (cumulative).
    pub const GO_ONCPU: &str = "GO_ONCPU";
    /// LRU hash: thread id (u32) → u64, when its PostgreSQL lock wait began
    /// (`bpf_ktime_get_ns`), until the wait ends.
    pub const PG_LOCK_WAITING: &str = "PG_LOCK_WAITING";
    /// Per-CPU hash: cgroup id (u64) → [`crate::PgLockWaits`], PostgreSQL's heavyweight lock
    /// waits that ended.
    pub const PG_LOCK_WAITS: &str = "PG_LOCK_WAITS";
    /// Per-CPU hash: cgroup id (u64) → [`crate::LockStats`].
    pub const CGROUP_LOCKS: &str = "CGROUP_LOCKS";
    /// Array of [`crate::slots::SLOTS`] u64: the cgroups placed in `LOCK_SLOTS` (0: free),
    /// written by the agent (see [`crate::slots`]).
    pub const LOCK_SLOT_DIR: &str = "LOCK_SLOT_DIR";
    /// Per-CPU array of [`crate::slots::SLOTS`] [`crate::LockStats`]: the placed cgroups'
    /// figures, beside their `CGROUP_LOCKS` entries.
    pub const LOCK_SLOTS: &str = "LOCK_SLOTS";
    /// Per-CPU hash: [`crate::LockSiteKey`] → [`crate::LockSiteValue`], contended call sites;
    /// the agent deletes the entries of gone cgroups and idle ones.
    pub const LOCK_SITES: &str = "LOCK_SITES";
    /// Stack trace map of the contended call sites (ids reused on hash collisions).
    pub const LOCK_STACKS: &str = "LOCK_STACKS";
    /// Task storage: thread → [`crate::LockInflight`], a sleeping lock's contention in progress.
    pub const LOCK_SLEEPING: &str = "LOCK_SLEEPING";
    /// Per-CPU array (one slot): [`crate::LockCpu`], a spinning contention in progress and the
    /// CPU's stack-walk budget.
    pub const LOCK_SPINNING: &str = "LOCK_SPINNING";
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
    /// `offsetof(struct task_struct, exit_state)`.
    pub const TASK_EXIT_STATE_OFFSET: &str = "TASK_EXIT_STATE_OFFSET";
    /// `offsetof(struct task_struct, se.sum_exec_runtime)`: the CPU time the scheduler charged
    /// the thread (what `getrusage` and the cgroup's `cpu.stat` add up).
    pub const TASK_RUNTIME_OFFSET: &str = "TASK_RUNTIME_OFFSET";
    /// Classic tracepoint fallback: offset of `next_pid` in the `sched_switch` record.
    pub const TP_SWITCH_NEXT_PID_OFFSET: &str = "TP_SWITCH_NEXT_PID_OFFSET";
    /// Classic tracepoint fallback: offset of `pid` in the `sched_wakeup` record.
    pub const TP_WAKEUP_PID_OFFSET: &str = "TP_WAKEUP_PID_OFFSET";
    /// Classic tracepoint fallback: offset of `prev_state` in the `sched_switch` record.
    pub const TP_SWITCH_PREV_STATE_OFFSET: &str = "TP_SWITCH_PREV_STATE_OFFSET";
    /// 1 when the `TASK_*_OFFSET` globals hold real offsets (the kernel has BTF).
    pub const HAVE_TASK_OFFSETS: &str = "HAVE_TASK_OFFSETS";
    /// `offsetof(struct task_struct, cpu)` (or `thread_info.cpu`): the CPU whose run queue a
    /// woken thread was put on.
    pub const TASK_CPU_OFFSET: &str = "TASK_CPU_OFFSET";
    /// `task_struct.cgroups` and `css_set.dfl_cgrp`: from a task to its cgroup v2 (`struct cgroup`).
    pub const TASK_CGROUPS_OFFSET: &str = "TASK_CGROUPS_OFFSET";
    pub const CSS_SET_DFL_CGRP_OFFSET: &str = "CSS_SET_DFL_CGRP_OFFSET";
    /// `cgroup.kn` and `kernfs_node.id`: from a `struct cgroup` to its id.
    pub const CGROUP_KN_OFFSET: &str = "CGROUP_KN_OFFSET";
    pub const KERNFS_NODE_ID_OFFSET: &str = "KERNFS_NODE_ID_OFFSET";
    /// 1 when the four offsets above are set: a task's cgroup id can be read from its
    /// `task_struct` with direct loads.
    pub const HAVE_TASK_CGROUP_OFFSETS: &str = "HAVE_TASK_CGROUP_OFFSETS";
    /// `task_struct.se.cfs_rq`, `cfs_rq.rq`, `rq.clock`: from a task to its run queue's clock
    /// (needs CONFIG_FAIR_GROUP_SCHED, for `cfs_rq.rq`).
    pub const TASK_CFS_RQ_OFFSET: &str = "TASK_CFS_RQ_OFFSET";
    pub const CFS_RQ_RQ_OFFSET: &str = "CFS_RQ_RQ_OFFSET";
    pub const RQ_CLOCK_OFFSET: &str = "RQ_CLOCK_OFFSET";
    /// 1 when the three offsets above are set.
    pub const HAVE_RQ_CLOCK: &str = "HAVE_RQ_CLOCK";
    /// `task_struct.sched_info.run_delay` and `.pcount` (CONFIG_SCHED_INFO): the time the
    /// thread has waited on run queues, and how often it went on a CPU, as the kernel counts
    /// them (`/proc/<pid>/schedstat`).
    pub const TASK_RUN_DELAY_OFFSET: &str = "TASK_RUN_DELAY_OFFSET";
    pub const TASK_PCOUNT_OFFSET: &str = "TASK_PCOUNT_OFFSET";
    /// 1 when the two offsets above are set: the run-queue wait and the off-CPU time come from
    /// `sched_switch` alone, and the wake-up programs only tell wake-ups local or remote.
    pub const HAVE_SCHED_INFO: &str = "HAVE_SCHED_INFO";
    /// `task_struct.sched_info.last_queued` (when the thread was put on its run queue, 0 when
    /// not queued) and `task_struct.flags`; `HAVE_RUNQ_BLAME` is 1 when both are set, with the
    /// task's cgroup path and `sched_info`: the switch program can blame run-queue waits.
    pub const TASK_LAST_QUEUED_OFFSET: &str = "TASK_LAST_QUEUED_OFFSET";
    pub const TASK_FLAGS_OFFSET: &str = "TASK_FLAGS_OFFSET";
    pub const HAVE_RUNQ_BLAME: &str = "HAVE_RUNQ_BLAME";
    /// `sys_enter_futex`: offsets of `uaddr` and `op`.
    pub const TP_FUTEX_UADDR_OFFSET: &str = "TP_FUTEX_UADDR_OFFSET";
    pub const TP_FUTEX_OP_OFFSET: &str = "TP_FUTEX_OP_OFFSET";
    /// `sys_enter_futex_wait` / `sys_enter_futex_wake`: offset of `uaddr`.
    pub const TP_FUTEX2_UADDR_OFFSET: &str = "TP_FUTEX2_UADDR_OFFSET";
    /// `sys_enter_futex_waitv`: offsets of `waiters` and `nr_futexes`.
    pub const TP_FUTEX_WAITV_WAITERS_OFFSET: &str = "TP_FUTEX_WAITV_WAITERS_OFFSET";
    pub const TP_FUTEX_WAITV_NR_OFFSET: &str = "TP_FUTEX_WAITV_NR_OFFSET";
    /// `sys_exit_*`: offset of `ret`.
    pub const TP_SYS_EXIT_RET_OFFSET: &str = "TP_SYS_EXIT_RET_OFFSET";
    /// `struct pt_regs`: the user instruction, stack and frame pointers a thread entered the
    /// kernel with (x86-64: `ip`, `sp`, `bp`), from BTF; and the thread's `sched_info.run_delay`,
    /// `nvcsw`, `nivcsw`. `HAVE_HANDOFF_SAMPLES` is 1 when all are set and the agent samples
    /// hand-offs (it can unwind this architecture's stacks).
    pub const PT_REGS_IP_OFFSET: &str = "PT_REGS_IP_OFFSET";
    pub const PT_REGS_SP_OFFSET: &str = "PT_REGS_SP_OFFSET";
    pub const PT_REGS_BP_OFFSET: &str = "PT_REGS_BP_OFFSET";
    /// `offsetof(struct pt_regs, ax)`: a Go function's first argument (its receiver) in Go's
    /// register ABI, for the `sync.Mutex` uprobes.
    pub const PT_REGS_AX_OFFSET: &str = "PT_REGS_AX_OFFSET";
    /// The shortest time between two Go mutex samples on one CPU, in ns.
    pub const GO_SAMPLE_INTERVAL_NS: &str = "GO_SAMPLE_INTERVAL_NS";
    pub const HOLD_RUN_DELAY_OFFSET: &str = "HOLD_RUN_DELAY_OFFSET";
    pub const HOLD_NVCSW_OFFSET: &str = "HOLD_NVCSW_OFFSET";
    pub const HOLD_NIVCSW_OFFSET: &str = "HOLD_NIVCSW_OFFSET";
    pub const HAVE_HANDOFF_SAMPLES: &str = "HAVE_HANDOFF_SAMPLES";
    /// The shortest time between two sampled wakes on one CPU (ns; the agent sets it to the
    /// node-wide budget times the CPU count).
    pub const HANDOFF_SAMPLE_INTERVAL_NS: &str = "HANDOFF_SAMPLE_INTERVAL_NS";
    /// `lock:contention_begin` / `contention_end`: offsets of `lock_addr`, `flags` and `ret`.
    pub const TP_LOCK_ADDR_OFFSET: &str = "TP_LOCK_ADDR_OFFSET";
    pub const TP_LOCK_FLAGS_OFFSET: &str = "TP_LOCK_FLAGS_OFFSET";
}

/// Program names, as the kernel object declares them (the function names).
pub mod programs {
    pub const SCHED_SWITCH_BTF: &str = "sched_switch_btf";
    pub const SCHED_WAKEUP_BTF: &str = "sched_wakeup_btf";
    pub const SCHED_WAKEUP_NEW_BTF: &str = "sched_wakeup_new_btf";
    pub const SCHED_WAKING_BTF: &str = "sched_waking_btf";
    pub const SCHED_SWITCH_TP: &str = "sched_switch_tp";
    pub const SCHED_WAKEUP_TP: &str = "sched_wakeup_tp";
    pub const SCHED_WAKEUP_NEW_TP: &str = "sched_wakeup_new_tp";
    pub const FUTEX_ENTER: &str = "futex_enter";
    pub const FUTEX_EXIT: &str = "futex_exit";
    pub const FUTEX_WAIT_ENTER: &str = "futex_wait_enter";
    pub const FUTEX_WAITV_ENTER: &str = "futex_waitv_enter";
    pub const FUTEX_WAKE_ENTER: &str = "futex_wake_enter";
    pub const LOCK_BEGIN_BTF: &str = "lock_contention_begin_btf";
    pub const LOCK_END_BTF: &str = "lock_contention_end_btf";
    pub const LOCK_BEGIN_TP: &str = "lock_contention_begin_tp";
    pub const LOCK_END_TP: &str = "lock_contention_end_tp";
    /// Uprobes at the entries of Go's `sync.Mutex` slow paths (`lockSlow`, `unlockSlow`).
    pub const GO_MUTEX_LOCK_SLOW: &str = "go_mutex_lock_slow";
    pub const GO_MUTEX_UNLOCK_SLOW: &str = "go_mutex_unlock_slow";
    /// The on-CPU sampler of watched Go processes (a `perf_event` program on the CPU clock).
    pub const GO_ONCPU: &str = "go_oncpu";
    /// Uprobes at PostgreSQL's USDT sites `postgresql:lock__wait__start` and `…done`.
    pub const PG_LOCK_WAIT_START: &str = "pg_lock_wait_start";
    pub const PG_LOCK_WAIT_DONE: &str = "pg_lock_wait_done";
    pub const BENCH_EMPTY_SWITCH: &str = "bench_empty_switch";
    pub const BENCH_EMPTY_WAKEUP: &str = "bench_empty_wakeup";
    pub const BENCH_EMPTY_WAKEUP_NEW: &str = "bench_empty_wakeup_new";
    pub const BENCH_EMPTY_WAKING: &str = "bench_empty_waking";
    pub const BENCH_EMPTY_XMIT: &str = "bench_empty_xmit";
    pub const BENCH_EMPTY_RECEIVE: &str = "bench_empty_receive";
    pub const BENCH_EMPTY_KFREE_SKB: &str = "bench_empty_kfree_skb";
    pub const BENCH_EMPTY_LOCK_BEGIN: &str = "bench_empty_lock_begin";
    pub const BENCH_EMPTY_LOCK_END: &str = "bench_empty_lock_end";
    pub const BENCH_EMPTY_FUTEX_ENTER: &str = "bench_empty_futex_enter";
    pub const BENCH_EMPTY_FUTEX_EXIT: &str = "bench_empty_futex_exit";
}
