//! The ABI shared by the eBPF probes (`stormwatch-ebpf`) and the agent.
//!
//! Every type here is `#[repr(C)]`, made of fixed-width integers only and laid out without
//! implicit padding, so that both sides agree on it byte for byte. Map names are constants:
//! the agent never retypes them as strings. The size tests at the bottom (`tests`) catch layout
//! drift.
#![no_std]

/// Map names, as the kernel object declares them.
pub mod maps {
    /// Per-CPU hash: cgroup id (u64) → [`crate::SchedStats`].
    pub const CGROUP_SCHED: &str = "CGROUP_SCHED";
    /// Task storage: thread → [`crate::TaskState`], the per-thread scratch state. Kept in the
    /// thread's own `task_struct`: never evicted, freed with the thread.
    pub const TASKS: &str = "TASKS";
    /// Per-CPU array (one slot): [`crate::OnCpu`], which thread runs on this CPU since when.
    pub const ON_CPU: &str = "ON_CPU";
    /// Per-CPU array (one slot): [`crate::SchedCache`], the figures of the one cgroup this CPU
    /// credits without a `CGROUP_SCHED` lookup. A cgroup's figures are its `CGROUP_SCHED`
    /// values plus the cache slots that hold it.
    pub const SCHED_CACHE: &str = "SCHED_CACHE";
    /// Per-CPU array (one slot): u64, the cgroup the agent wants this CPU's [`SCHED_CACHE`] to
    /// hold (0: none). The CPU moves its cache there at its next switch-out.
    pub const SCHED_CACHE_WANT: &str = "SCHED_CACHE_WANT";
    /// Hash: thread id (u32) → wake-up time (u64), for the classic-tracepoint fallback only,
    /// whose `sched_wakeup` names the thread by id and cannot reach its task storage. Consumed
    /// at the thread's next switch-out.
    pub const PENDING_WAKEUPS: &str = "PENDING_WAKEUPS";
    /// Per-CPU array: [`crate::ProbeError`] index → count of events the probes could not record.
    pub const PROBE_ERRORS: &str = "PROBE_ERRORS";
    /// Per-CPU hash: cgroup id (u64) → [`crate::FutexStats`].
    pub const CGROUP_FUTEX: &str = "CGROUP_FUTEX";
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
    /// Per-CPU hash: cgroup id (u64) → [`crate::LockStats`].
    pub const CGROUP_LOCKS: &str = "CGROUP_LOCKS";
    /// Per-CPU hash: [`crate::LockSiteKey`] → [`crate::LockSiteValue`], contended call sites;
    /// the agent deletes the entries of gone cgroups and idle ones.
    pub const LOCK_SITES: &str = "LOCK_SITES";
    /// Stack trace map of the contended call sites (ids reused on hash collisions).
    pub const LOCK_STACKS: &str = "LOCK_STACKS";
    /// Task storage: thread → [`crate::LockInflight`], a sleeping lock's contention in progress.
    pub const LOCK_SLEEPING: &str = "LOCK_SLEEPING";
    /// Per-CPU array (one slot): [`crate::LockInflight`], a spinning contention in progress.
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
    /// 1 when a [`crate::SchedCache`] flush orders its stores with fully ordered atomics: on a
    /// weakly ordered CPU (arm64) whose kernel's JIT has them. 0 on x86, whose stores are seen
    /// in program order anyway.
    pub const FLUSH_WITH_BARRIERS: &str = "FLUSH_WITH_BARRIERS";
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
    pub const BENCH_EMPTY_SWITCH: &str = "bench_empty_switch";
    pub const BENCH_EMPTY_WAKEUP: &str = "bench_empty_wakeup";
    pub const BENCH_EMPTY_WAKEUP_NEW: &str = "bench_empty_wakeup_new";
    pub const BENCH_EMPTY_WAKING: &str = "bench_empty_waking";
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
    pub fn absorb(&mut self, o: &Self) {
        self.count += o.count;
        self.sum_ns += o.sum_ns;
        let mut i = 0;
        while i < LOG2_BUCKETS {
            self.buckets[i] += o.buckets[i];
            i += 1;
        }
    }

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

    /// Adds `o`'s counters to these (a cache flush, in the probes; the agent has its own).
    #[inline(always)]
    pub fn absorb(&mut self, o: &Self) {
        self.voluntary_switches += o.voluntary_switches;
        self.involuntary_switches += o.involuntary_switches;
        self.migrations += o.migrations;
        self.oncpu_ns += o.oncpu_ns;
        self.offcpu_ns += o.offcpu_ns;
        self.runq.absorb(&o.runq);
        self.wake_local.absorb(&o.wake_local);
        self.wake_remote.absorb(&o.wake_remote);
    }
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

/// One CPU's cached cgroup: the switch-outs of `cgroup_id`'s threads on this CPU are credited
/// to `stats` here, an array slot, instead of to the cgroup's `CGROUP_SCHED` entry, a hash
/// lookup (measured: about a third of the switch program's own time). When the agent names
/// another cgroup in `SCHED_CACHE_WANT`, the CPU's next switch-out adds `stats` to the old
/// cgroup's `CGROUP_SCHED` entry and starts the new one from zero: a *flush*. `generation` is
/// raised by one before a flush and by one after it, so it is odd during one and changes with
/// each: a seqlock. The agent reads the slots, then the hash map, then the slots again (the copy
/// it merges), then the slots a third time, and keeps the copy only where each CPU's generation
/// is even and the same in all three reads: no flush came between, nor fell inside the copy
/// (else the flushed figures could be counted twice or not at all).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedCache {
    pub generation: u64,
    /// The cgroup v2 id whose figures `stats` holds (0: none).
    pub cgroup_id: u64,
    pub stats: SchedStats,
}

impl SchedCache {
    pub const ZERO: Self = Self {
        generation: 0,
        cgroup_id: 0,
        stats: SchedStats::ZERO,
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
}

impl ProbeError {
    pub const COUNT: u32 = 13;
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
        }
    }
}

// ---- futex ------------------------------------------------------------------------------

/// `futex(2)` commands, after masking `FUTEX_PRIVATE_FLAG` and `FUTEX_CLOCK_REALTIME`.
pub mod futex_cmd {
    pub const MASK: u32 = 0x7f;
    pub const WAIT: u32 = 0;
    pub const WAKE: u32 = 1;
    pub const REQUEUE: u32 = 3;
    pub const CMP_REQUEUE: u32 = 4;
    pub const WAKE_OP: u32 = 5;
    pub const LOCK_PI: u32 = 6;
    pub const UNLOCK_PI: u32 = 7;
    pub const TRYLOCK_PI: u32 = 8;
    pub const WAIT_BITSET: u32 = 9;
    pub const WAKE_BITSET: u32 = 10;
    pub const WAIT_REQUEUE_PI: u32 = 11;
    pub const CMP_REQUEUE_PI: u32 = 12;
    pub const LOCK_PI2: u32 = 13;
}

/// What a futex call does, as far as the figures are concerned.
pub mod futex_class {
    /// Blocks until woken, timed out or the value differs: its duration is wait time.
    pub const WAIT: u32 = 1;
    /// Wakes waiters; the return value is how many it woke.
    pub const WAKE: u32 = 2;
    /// Wakes or requeues; the return value mixes both, so it is not counted as woken.
    pub const WAKE_OTHER: u32 = 3;
}

/// The class of a `futex(2)` op, or 0 for ops that neither wait nor wake.
#[inline(always)]
pub const fn futex_op_class(op: u32) -> u32 {
    match op & futex_cmd::MASK {
        futex_cmd::WAIT
        | futex_cmd::WAIT_BITSET
        | futex_cmd::LOCK_PI
        | futex_cmd::LOCK_PI2
        | futex_cmd::WAIT_REQUEUE_PI => futex_class::WAIT,
        futex_cmd::WAKE | futex_cmd::WAKE_BITSET | futex_cmd::WAKE_OP => futex_class::WAKE,
        futex_cmd::REQUEUE
        | futex_cmd::CMP_REQUEUE
        | futex_cmd::CMP_REQUEUE_PI
        | futex_cmd::UNLOCK_PI => futex_class::WAKE_OTHER,
        _ => 0,
    }
}

/// Futex figures of one cgroup on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FutexStats {
    /// Wake calls (FUTEX_WAKE, WAKE_BITSET, WAKE_OP, futex_wake, requeues, UNLOCK_PI).
    pub wakes: u64,
    /// Waiters woken, from the return value of FUTEX_WAKE, WAKE_BITSET, WAKE_OP, futex_wake.
    pub woken: u64,
    /// Waits that returned ETIMEDOUT.
    pub timeouts: u64,
    /// Waits that returned EAGAIN at once (the futex word had already changed).
    pub eagain: u64,
    /// Waits that returned 0: the waiter was woken (by a wake, a requeue then a wake, or a PI
    /// unlock that handed it the lock). Counted on the waiter's side, so it covers every kind
    /// of futex and every runtime: each is a hand-off through the kernel.
    pub woken_waits: u64,
    /// Time in those waits, summed over threads: divided by the window, the average number of
    /// threads queued for a hand-off (timed-out and EAGAIN waits left out).
    pub woken_wait_ns: u64,
    /// Wait calls and their durations (from syscall entry to exit).
    pub wait: Log2Histogram,
}

impl FutexStats {
    pub const ZERO: Self = Self {
        wakes: 0,
        woken: 0,
        timeouts: 0,
        eagain: 0,
        woken_waits: 0,
        woken_wait_ns: 0,
        wait: Log2Histogram::ZERO,
    };
}

/// A futex call in progress, in the calling thread's task storage.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FutexInflight {
    /// When a wait began (the clock is read for waits only: nothing else is timed).
    pub start_ns: u64,
    /// The futex word's address (0 when the call names several, as futex_waitv may).
    pub uaddr: u64,
    /// One of [`futex_class`], or 0 for a call that neither waits nor wakes.
    pub class: u32,
    /// The attach epoch (`maps::FUTEX_EPOCH`, at least 1) from the call's entry to its exit,
    /// 0 after the exit: an exit that finds 0, or an earlier epoch, had its entry unseen.
    pub in_flight: u32,
    /// A sampled wake's id, from its entry to its exit (0: not sampled).
    pub sample_id: u64,
    /// The thread's hold (see [`HandoffSample::hold_ns`]): when its latest woken wait returned
    /// (0 when a wake has ended the hold since), and its run-queue wait and switch counts then.
    pub held_since_ns: u64,
    pub held_run_delay: u64,
    pub held_nvcsw: u64,
    pub held_nivcsw: u64,
    /// The thread's woken waits not yet handed on ([`ThreadHandoff::relay_waits`]): the word
    /// of its latest woken wait, and the woken waits (and their time) it has made on that word
    /// in a row since it last woke it. A woken wait on another word starts them over; a wake
    /// on this word credits them and clears them.
    pub relay_uaddr: u64,
    pub relay_waits: u64,
    pub relay_wait_ns: u64,
}

/// A futex word of one process in one cgroup.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HotFutexKey {
    pub cgroup_id: u64,
    pub uaddr: u64,
    pub tgid: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HotFutexValue {
    pub waits: u64,
    pub wait_ns: u64,
    pub max_wait_ns: u64,
    /// The waiting thread's name when the entry was created.
    pub comm: [u8; 16],
    /// The thread that made the entry (on this CPU).
    pub tid: u32,
    /// 1 once another thread has waited on the word (on this CPU): a word several threads
    /// queue on (a lock's, a condition's), not one a runtime parks a single thread on (a JVM's
    /// per-thread park events, a Go M's note). Across CPUs the agent also compares `tid`.
    pub shared: u32,
}

impl HotFutexValue {
    pub const ZERO: Self = Self {
        waits: 0,
        wait_ns: 0,
        max_wait_ns: 0,
        comm: [0; 16],
        tid: 0,
        shared: 0,
    };
}

/// One thread's part in futex hand-offs since its entry was made: the waits of its that ended
/// in a wake, and its wakes that woke a waiter (or handed on a PI lock). A lock's hand-offs
/// are made by threads that do both — each waits for the lock, then wakes the next waiter when
/// it lets go — where a pool waiting for work has threads that only wait and a producer that
/// only wakes.
///
/// The waits the thread *handed on* are told apart (`relay_*`): woken waits on a word that the
/// thread then woke itself, before any woken wait on another word — it waited for the word,
/// was given it, and gave it up on the same word: a lock's queue. A worker woken from a
/// condition variable by a producer waits on the condition's word and wakes, if anyone, on the
/// queue's mutex: its waits for work are not handed on.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadHandoff {
    /// The cgroup the thread was in at its latest counted call.
    pub cgroup_id: u64,
    pub woken_waits: u64,
    pub woken_wait_ns: u64,
    pub wakes: u64,
    /// Woken waits the thread handed on (see above), and their time.
    pub relay_waits: u64,
    pub relay_wait_ns: u64,
    pub tgid: u32,
    pub _pad: u32,
}

impl ThreadHandoff {
    pub const ZERO: Self = Self {
        cgroup_id: 0,
        woken_waits: 0,
        woken_wait_ns: 0,
        wakes: 0,
        relay_waits: 0,
        relay_wait_ns: 0,
        tgid: 0,
        _pad: 0,
    };
}

/// Bytes of user stack a hand-off sample copies, from the stack pointer up: enough for the lock
/// machinery's frames (libc's, a JVM's) and the frames that called it, for the agent to unwind
/// with the binaries' call-frame information.
pub const HANDOFF_STACK_BYTES: usize = 4096;

/// Which side of a hand-off a [`HandoffSample`] is.
pub mod handoff_side {
    /// The thread that woke the waiter (it let the lock go).
    pub const WAKER: u32 = 1;
    /// The first thread to return from a wait on the word after the wake began.
    pub const WAITER: u32 = 2;
    /// A goroutine entering Go's `sync.Mutex` lock slow path (the lock was held: it spins,
    /// then parks in Go's scheduler). Not paired: `sample_id` is 0, `uaddr` the mutex.
    pub const GO_LOCK: u32 = 3;
    /// A goroutine entering Go's `sync.Mutex` unlock slow path (the mutex had waiters, or a
    /// woken or starving flag, to hand on). Not paired, as `GO_LOCK`.
    pub const GO_UNLOCK: u32 = 4;
}

/// Entries of Go's `sync.Mutex` slow paths in one cgroup, on one CPU (cumulative).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GoMutexCalls {
    /// `lockSlow`: a `Lock` that found the mutex held.
    pub lock_slow: u64,
    /// `unlockSlow`: an `Unlock` that found waiters (or flags) to hand on.
    pub unlock_slow: u64,
}

/// One side of a sampled hand-off, with the user registers and stack to unwind it by. The two
/// sides share `sample_id`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HandoffSample {
    pub sample_id: u64,
    pub cgroup_id: u64,
    pub uaddr: u64,
    /// The user instruction, stack and frame pointers of the futex call.
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// The waiter: how long it waited.
    pub wait_ns: u64,
    /// The waiter: from the wake's entry to the waiter's return from its wait (its wake-up and
    /// its wait for a CPU).
    pub wake_to_return_ns: u64,
    /// The waker: its hold, from the return of its own latest woken wait to this wake (0: it
    /// did not wait since its previous wake — it took the lock without waiting — or its task
    /// storage was refused), and in that time its run-queue wait (runnable or throttled) and
    /// its voluntary and involuntary switches.
    pub hold_ns: u64,
    pub hold_run_delay_ns: u64,
    pub hold_nvcsw: u32,
    pub hold_nivcsw: u32,
    pub tgid: u32,
    pub tid: u32,
    /// One of [`handoff_side`].
    pub side: u32,
    pub cpu: u32,
    /// The waiter: the CPU the wake ran on.
    pub waker_cpu: u32,
    /// Bytes of `stack` read (0 when none could be).
    pub stack_len: u32,
    pub stack: [u8; HANDOFF_STACK_BYTES],
}

/// A sampled wake's word: its cgroup and address (the address alone in one process, or in
/// processes that share the mapping at one address, as forked ones do).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PendingWakeKey {
    pub cgroup_id: u64,
    pub uaddr: u64,
}

/// A sampled wake whose waiter has not returned yet.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingWake {
    pub sample_id: u64,
    /// When the wake entered the kernel.
    pub at_ns: u64,
    pub cpu: u32,
    pub _pad: u32,
}

/// A CPU's wake-sampling state: the clock before which it samples no wake, the sequence number
/// of its samples, and how many wakes to let pass before it reads the clock again.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandoffSampler {
    pub next_ns: u64,
    pub seq: u64,
    pub skip: u64,
}

// ---- kernel locks -------------------------------------------------------------------------

/// `lock:contention_begin` flags (include/trace/events/lock.h).
pub mod lcb {
    pub const SPIN: u32 = 1 << 0;
    pub const READ: u32 = 1 << 1;
    pub const WRITE: u32 = 1 << 2;
    pub const RT: u32 = 1 << 3;
    pub const PERCPU: u32 = 1 << 4;
    pub const MUTEX: u32 = 1 << 5;
}

/// Lock kinds, as indices into [`LockStats`].
pub mod lock_kind {
    /// Spinlocks and rwlocks (`LCB_F_SPIN` without a sleeping-lock flag).
    pub const SPIN: usize = 0;
    /// Mutexes, including their optimistic spinning.
    pub const MUTEX: usize = 1;
    pub const RWSEM_READ: usize = 2;
    pub const RWSEM_WRITE: usize = 3;
    /// rt_mutex (and, on PREEMPT_RT, the spinlocks built on it).
    pub const RT: usize = 4;
    /// percpu_rw_semaphore.
    pub const PERCPU: usize = 5;
    /// Anything else (e.g. semaphores, which pass no flags).
    pub const OTHER: usize = 6;
    pub const COUNT: usize = 7;
    pub const NAMES: [&str; COUNT] = [
        "spin",
        "mutex",
        "rwsem_read",
        "rwsem_write",
        "rt",
        "percpu",
        "other",
    ];
}

/// The kind of a contended lock from its `contention_begin` flags.
#[inline(always)]
pub const fn lock_kind_of(flags: u32) -> usize {
    if flags & lcb::PERCPU != 0 {
        lock_kind::PERCPU
    } else if flags & lcb::RT != 0 {
        lock_kind::RT
    } else if flags & lcb::MUTEX != 0 {
        lock_kind::MUTEX
    } else if flags & lcb::SPIN != 0 {
        lock_kind::SPIN
    } else if flags & lcb::READ != 0 {
        lock_kind::RWSEM_READ
    } else if flags & lcb::WRITE != 0 {
        lock_kind::RWSEM_WRITE
    } else {
        lock_kind::OTHER
    }
}

/// Kernel lock waits of one cgroup on one CPU, by [`lock_kind`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockStats {
    pub count: [u64; lock_kind::COUNT],
    pub wait_ns: [u64; lock_kind::COUNT],
}

impl LockStats {
    pub const ZERO: Self = Self {
        count: [0; lock_kind::COUNT],
        wait_ns: [0; lock_kind::COUNT],
    };
}

/// A lock contention in progress: per CPU for spinning locks, per thread for sleeping ones.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockInflight {
    pub lock: u64,
    pub start_ns: u64,
    pub flags: u32,
    pub _pad: u32,
}

/// The shortest kernel-lock wait whose call site the probes take (a kernel stack walk, which
/// costs more than most spinlock waits last): 10 µs. Every wait counts in its cgroup's figures.
pub const LOCK_SITE_MIN_WAIT_NS: u64 = 10_000;

/// A contended call site: a kernel stack, in one cgroup, for one lock kind.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LockSiteKey {
    pub cgroup_id: u64,
    pub stack_id: u32,
    pub kind: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockSiteValue {
    pub count: u64,
    pub wait_ns: u64,
    pub max_wait_ns: u64,
}

// ---- network ----------------------------------------------------------------------------------

/// The network family: per-interface packet lengths against the MTU, per-container traffic,
/// drops by reason and TCP retransmits: its names, globals and types, in a module of its own.
pub mod net {
    /// Map names, as the kernel object declares them.
    pub mod maps {
        /// Per-CPU hash: cgroup id (u64) → [`super::CgroupNetStats`].
        pub const CGROUP_NET: &str = "CGROUP_NET";
        /// Per-CPU hash: [`super::NetIfKey`] → [`super::NetIfStats`].
        pub const NET_IFACES: &str = "NET_IFACES";
        /// Hash: [`super::NetIfKey`] → [`super::NetIfInfo`], written when an interface is
        /// first seen.
        pub const NET_IFINFO: &str = "NET_IFINFO";
        /// Per-CPU hash: [`super::NetDropKey`] → [`super::NetDropStats`].
        pub const NET_DROPS: &str = "NET_DROPS";
        /// Hash: network namespace inode (u32) → cgroup id (u64) its received traffic is
        /// counted for; written by the agent.
        pub const NETNS_CGROUP: &str = "NETNS_CGROUP";
        /// Hash: [`super::NetSenderKey`] → 0: which cgroups' processes send from which
        /// namespaces (the transmit hook notes them; the agent decides owners from them).
        pub const NET_SENDERS: &str = "NET_SENDERS";
        /// Per-CPU array: [`super::NetProbeError`] index → events the probes could not record.
        pub const NET_ERRORS: &str = "NET_ERRORS";
    }

    /// Read-only globals: struct offsets from the running kernel's BTF, tracepoint record
    /// offsets for the classic fallback.
    pub mod globals {
        /// 1 when every `*_OFFSET` global below that comes from BTF is set.
        pub const HAVE_NET_OFFSETS: &str = "HAVE_NET_OFFSETS";
        /// `sk_buff`: `len`, `head`, `data`, `end`, `network_header`, `protocol`, `dev`.
        pub const SKB_LEN_OFFSET: &str = "SKB_LEN_OFFSET";
        pub const SKB_HEAD_OFFSET: &str = "SKB_HEAD_OFFSET";
        pub const SKB_DATA_OFFSET: &str = "SKB_DATA_OFFSET";
        pub const SKB_END_OFFSET: &str = "SKB_END_OFFSET";
        pub const SKB_NETWORK_HEADER_OFFSET: &str = "SKB_NETWORK_HEADER_OFFSET";
        pub const SKB_PROTOCOL_OFFSET: &str = "SKB_PROTOCOL_OFFSET";
        pub const SKB_DEV_OFFSET: &str = "SKB_DEV_OFFSET";
        /// `skb_shared_info`: `gso_size`, `gso_segs` (the struct sits at `skb->head + skb->end`).
        pub const SHINFO_GSO_SIZE_OFFSET: &str = "SHINFO_GSO_SIZE_OFFSET";
        pub const SHINFO_GSO_SEGS_OFFSET: &str = "SHINFO_GSO_SEGS_OFFSET";
        /// `net_device`: `mtu`, `ifindex`, and `nd_net.net` (the `struct net *`).
        pub const DEV_MTU_OFFSET: &str = "DEV_MTU_OFFSET";
        pub const DEV_IFINDEX_OFFSET: &str = "DEV_IFINDEX_OFFSET";
        pub const DEV_NET_OFFSET: &str = "DEV_NET_OFFSET";
        /// `net.ns.inum`: the network namespace's inode number.
        pub const NET_INUM_OFFSET: &str = "NET_INUM_OFFSET";
        /// `net_device`: `name`, `type`, `rtnl_link_ops`; `rtnl_link_ops`: `kind`.
        pub const DEV_NAME_OFFSET: &str = "DEV_NAME_OFFSET";
        pub const DEV_TYPE_OFFSET: &str = "DEV_TYPE_OFFSET";
        pub const DEV_LINK_OPS_OFFSET: &str = "DEV_LINK_OPS_OFFSET";
        pub const LINK_OPS_KIND_OFFSET: &str = "LINK_OPS_KIND_OFFSET";
        /// `sk_buff.sk`: the socket that sends the packet.
        pub const SKB_SK_OFFSET: &str = "SKB_SK_OFFSET";
        /// `sock.__sk_common.skc_family` and `.skc_state`: only full IPv4/IPv6 sockets count.
        pub const SOCK_FAMILY_OFFSET: &str = "SOCK_FAMILY_OFFSET";
        pub const SOCK_STATE_OFFSET: &str = "SOCK_STATE_OFFSET";
        /// `sock.sk_socket` and `socket.file`: a socket of a process has a file; the kernel's own
        /// sockets (ICMP, TCP control, neighbour discovery) do not.
        pub const SOCK_SOCKET_OFFSET: &str = "SOCK_SOCKET_OFFSET";
        pub const SOCKET_FILE_OFFSET: &str = "SOCKET_FILE_OFFSET";
        /// `sock.sk_cgrp_data.cgroup`, then `cgroup.kn`, `kernfs_node.id` (shared with the
        /// scheduler probes): a socket's cgroup v2 id.
        pub const SOCK_CGROUP_OFFSET: &str = "SOCK_CGROUP_OFFSET";
        pub use crate::globals::{CGROUP_KN_OFFSET, KERNFS_NODE_ID_OFFSET};
        /// Classic tracepoints: `skbaddr` of `net_dev_start_xmit` and `netif_receive_skb`.
        pub const TP_XMIT_SKB_OFFSET: &str = "TP_XMIT_SKB_OFFSET";
        pub const TP_RECEIVE_SKB_OFFSET: &str = "TP_RECEIVE_SKB_OFFSET";
        /// Classic `skb:kfree_skb`: `skbaddr` and `reason`.
        pub const TP_KFREE_SKB_OFFSET: &str = "TP_KFREE_SKB_OFFSET";
        pub const TP_KFREE_REASON_OFFSET: &str = "TP_KFREE_REASON_OFFSET";
        /// Classic `tcp:tcp_retransmit_skb`: `skaddr` and `skbaddr`.
        pub const TP_RETRANSMIT_SK_OFFSET: &str = "TP_RETRANSMIT_SK_OFFSET";
        pub const TP_RETRANSMIT_SKB_OFFSET: &str = "TP_RETRANSMIT_SKB_OFFSET";
        /// 1 when `tcp_retransmit_skb` passes `err` as its third argument (since 6.14 it also
        /// fires for retransmissions that failed; only successful ones are counted, as the
        /// kernel's `RetransSegs` does).
        pub const RETRANSMIT_HAS_ERR: &str = "RETRANSMIT_HAS_ERR";
        /// Classic `tcp:tcp_retransmit_skb`: `err`, or 0 when the record has no such field.
        pub const TP_RETRANSMIT_ERR_OFFSET: &str = "TP_RETRANSMIT_ERR_OFFSET";
    }

    /// Program names (the function names).
    pub mod programs {
        pub const XMIT_BTF: &str = "net_dev_xmit_btf";
        pub const XMIT_TP: &str = "net_dev_xmit_tp";
        pub const RECEIVE_BTF: &str = "net_receive_btf";
        pub const RECEIVE_TP: &str = "net_receive_tp";
        pub const KFREE_SKB_BTF: &str = "net_kfree_skb_btf";
        pub const KFREE_SKB_TP: &str = "net_kfree_skb_tp";
        pub const RETRANSMIT_BTF: &str = "net_tcp_retransmit_btf";
        pub const RETRANSMIT_TP: &str = "net_tcp_retransmit_tp";
    }

    /// Buckets of a packet-length histogram. Lengths are of the IP packet (L3: what the MTU
    /// bounds). Buckets `0..LOG2_COUNT` are powers of two from 64 bytes; when the MTU is known,
    /// the last three take precedence: just below the MTU, exactly the MTU, and above it.
    pub mod len_bucket {
        /// `<= 64`, `<= 128`, …, `<= 16384`, and `> 16384` (never above the MTU when it is known).
        pub const LOG2_COUNT: usize = 10;
        /// `mtu - NEAR_MTU_WIDTH < len < mtu`.
        pub const NEAR_MTU: usize = 10;
        /// `len == mtu`: full-size packets.
        pub const AT_MTU: usize = 11;
        /// `len > mtu` without GSO: should not exist on transmit; on receive, sent by a peer with
        /// a larger MTU.
        pub const OVER_MTU: usize = 12;
        pub const COUNT: usize = 13;
        /// The width of the "near the MTU" bucket: 80 bytes, the largest common encapsulation
        /// overhead (WireGuard over IPv6), so that packets that would fit a smaller overlay MTU
        /// but not this one land in it.
        pub const NEAR_MTU_WIDTH: u32 = 80;
        /// The upper edge of log2 bucket `b` (inclusive); the last one is open-ended.
        pub const fn log2_upper(b: usize) -> Option<u32> {
            if b + 1 >= LOG2_COUNT {
                None
            } else {
                Some(64 << b)
            }
        }
    }

    /// The bucket of an L3 length; `mtu` 0 means unknown (plain log2 buckets).
    #[inline(always)]
    pub const fn len_bucket_of(len: u32, mtu: u32) -> usize {
        if mtu != 0 {
            if len == mtu {
                return len_bucket::AT_MTU;
            }
            if len > mtu {
                return len_bucket::OVER_MTU;
            }
            if len + len_bucket::NEAR_MTU_WIDTH > mtu {
                return len_bucket::NEAR_MTU;
            }
        }
        if len <= 64 {
            return 0;
        }
        // 65..=128 → 1, 129..=256 → 2, …: the bit length of len - 1, less 6.
        let b = (u32::BITS - (len - 1).leading_zeros()) as usize - 6;
        if b >= len_bucket::LOG2_COUNT {
            len_bucket::LOG2_COUNT - 1
        } else {
            b
        }
    }

    /// One direction of one interface. `packets` and `bytes` count what the device handles: a
    /// GSO/GRO super-packet counts once (as the device's own counters do), and is also counted
    /// in `gso_packets`/`gso_segments`, never in the length histogram.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct NetDirStats {
        pub packets: u64,
        /// IP-level bytes (from the network header on).
        pub bytes: u64,
        pub gso_packets: u64,
        pub gso_segments: u64,
        /// IPv4 fragments (MF set or a fragment offset) and IPv6 packets with a fragment header.
        pub fragments: u64,
        /// ICMP "fragmentation needed" (type 3 code 4) and ICMPv6 "packet too big" (type 2).
        pub ptb: u64,
        /// Lengths of the packets that are not GSO/GRO super-packets, by [`len_bucket`].
        pub len: [u64; len_bucket::COUNT],
    }

    impl NetDirStats {
        pub const ZERO: Self = Self {
            packets: 0,
            bytes: 0,
            gso_packets: 0,
            gso_segments: 0,
            fragments: 0,
            ptb: 0,
            len: [0; len_bucket::COUNT],
        };
    }

    /// An interface: the inode of its network namespace and its index there.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub struct NetIfKey {
        pub netns: u32,
        pub ifindex: u32,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct NetIfStats {
        pub tx: NetDirStats,
        pub rx: NetDirStats,
        /// The MTU at the last packet (not a counter).
        pub mtu: u32,
        pub _pad: u32,
    }

    impl NetIfStats {
        pub const ZERO: Self = Self {
            tx: NetDirStats::ZERO,
            rx: NetDirStats::ZERO,
            mtu: 0,
            _pad: 0,
        };
    }

    /// What the kernel's `struct net_device` says an interface is, recorded by the probes when
    /// they first see it: the inventory of namespaces the agent cannot enter (that takes
    /// CAP_SYS_ADMIN) or cannot even see (no host pid namespace).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct NetIfInfo {
        /// `dev->name`, NUL-padded.
        pub name: [u8; 16],
        /// `dev->rtnl_link_ops->kind` (`veth`, `vxlan`, ...), NUL-padded; empty for devices
        /// no link type created (physical NICs, loopback).
        pub kind: [u8; 16],
        /// `dev->type`: the ARPHRD_* link-layer type.
        pub link_type: u16,
        pub _pad: [u8; 6],
    }

    impl NetIfInfo {
        pub const ZERO: Self = Self {
            name: [0; 16],
            kind: [0; 16],
            link_type: 0,
            _pad: [0; 6],
        };
    }

    /// Drops of one reason (`enum skb_drop_reason`) at one interface; `netns` and `ifindex` are
    /// 0 when the packet named no device.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub struct NetDropKey {
        pub netns: u32,
        pub ifindex: u32,
        pub reason: u32,
        pub _pad: u32,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct NetDropStats {
        pub packets: u64,
    }

    /// One cgroup's traffic (what its sockets send and receive), on one CPU. GSO/GRO
    /// super-packets count as their segments in `*_packets` and in the histograms, and once in
    /// `*_gso_packets`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct CgroupNetStats {
        pub tx_packets: u64,
        /// IP-level bytes of the packets on the wire (a super-packet's headers count once per
        /// segment).
        pub tx_bytes: u64,
        pub rx_packets: u64,
        pub rx_bytes: u64,
        pub tx_gso_packets: u64,
        pub rx_gso_packets: u64,
        /// Segments retransmitted by the cgroup's TCP sockets (`tcp:tcp_retransmit_skb`, each
        /// skb counted as the segments it carries, as the kernel's `RetransSegs` does).
        pub tcp_retransmits: u64,
        /// Packet lengths (L3) by [`len_bucket`] (log2 buckets only: no MTU here).
        pub tx_len: [u64; len_bucket::COUNT],
        pub rx_len: [u64; len_bucket::COUNT],
    }

    impl CgroupNetStats {
        pub const ZERO: Self = Self {
            tx_packets: 0,
            tx_bytes: 0,
            rx_packets: 0,
            rx_bytes: 0,
            tx_gso_packets: 0,
            rx_gso_packets: 0,
            tcp_retransmits: 0,
            tx_len: [0; len_bucket::COUNT],
            rx_len: [0; len_bucket::COUNT],
        };
    }

    /// A cgroup whose processes send from a network namespace.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub struct NetSenderKey {
        pub netns: u32,
        pub _pad: u32,
        pub cgroup: u64,
    }

    /// What the network probes could not record, as indices into `NET_ERRORS`.
    #[repr(u32)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum NetProbeError {
        /// `CGROUP_NET` is full.
        CgroupMapFull = 0,
        /// `NET_IFACES` is full.
        IfaceMapFull = 1,
        /// `NET_DROPS` is full.
        DropMapFull = 2,
        /// Reading an `sk_buff`, `net_device` or `sock` field failed.
        KernelRead = 3,
        /// A GSO packet's header length could not be parsed: its bytes count the header once
        /// and its segments are left out of the length histogram.
        GsoHeaderUnknown = 4,
        /// A retransmit on a socket whose cgroup could not be read.
        SocketCgroup = 5,
    }

    impl NetProbeError {
        pub const COUNT: u32 = 6;
        pub const ALL: [NetProbeError; Self::COUNT as usize] = [
            Self::CgroupMapFull,
            Self::IfaceMapFull,
            Self::DropMapFull,
            Self::KernelRead,
            Self::GsoHeaderUnknown,
            Self::SocketCgroup,
        ];

        pub const fn name(self) -> &'static str {
            match self {
                Self::CgroupMapFull => "net_cgroup_map_full",
                Self::IfaceMapFull => "net_iface_map_full",
                Self::DropMapFull => "net_drop_map_full",
                Self::KernelRead => "net_kernel_read",
                Self::GsoHeaderUnknown => "net_gso_header_unknown",
                Self::SocketCgroup => "net_socket_cgroup",
            }
        }
    }

    /// Ethernet protocol numbers as `sk_buff::protocol` holds them (big-endian), read as a
    /// little-endian u16.
    pub const ETH_P_IP_BE: u16 = 0x0008;
    pub const ETH_P_IPV6_BE: u16 = 0xdd86;

    /// What an IP header says about MTU trouble, from its first bytes.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct IpClass {
        pub fragment: bool,
        /// Whether the packet carries ICMP(v6) at `l4_offset` (and is not a non-first fragment).
        pub icmp: bool,
        /// Offset of the L4 header from the IP header, when known.
        pub l4_offset: u32,
        /// The IP protocol / IPv6 next header.
        pub protocol: u8,
    }

    /// Classifies an IPv4 header (at least 20 bytes).
    #[inline(always)]
    pub const fn classify_ipv4(h: &[u8; 20]) -> IpClass {
        let ihl = (h[0] & 0x0f) as u32 * 4;
        let frag = ((h[6] as u16) << 8) | h[7] as u16;
        // MF (0x2000) or a non-zero offset (0x1fff).
        let fragment = frag & 0x3fff != 0;
        let first = frag & 0x1fff == 0;
        IpClass {
            fragment,
            icmp: h[9] == 1 && first,
            l4_offset: ihl,
            protocol: h[9],
        }
    }

    /// Classifies an IPv6 fixed header (the first 40 bytes; only `next header` is read). Only
    /// a fragment header or ICMPv6 directly after the fixed header are recognized.
    #[inline(always)]
    pub const fn classify_ipv6(next_header: u8) -> IpClass {
        IpClass {
            fragment: next_header == 44,
            icmp: next_header == 58,
            l4_offset: 40,
            protocol: next_header,
        }
    }

    /// ICMP "destination unreachable / fragmentation needed" or ICMPv6 "packet too big".
    #[inline(always)]
    pub const fn is_ptb(ipv6: bool, icmp_type: u8, icmp_code: u8) -> bool {
        if ipv6 {
            icmp_type == 2
        } else {
            icmp_type == 3 && icmp_code == 4
        }
    }
}

#[cfg(feature = "user")]
mod user {
    use super::*;
    // SAFETY (all): plain #[repr(C)] structs of fixed-width integers with no padding (see the
    // size tests).
    unsafe impl aya::Pod for SchedStats {}
    unsafe impl aya::Pod for TaskState {}
    unsafe impl aya::Pod for OnCpu {}
    unsafe impl aya::Pod for SchedCache {}
    unsafe impl aya::Pod for FutexStats {}
    unsafe impl aya::Pod for FutexInflight {}
    unsafe impl aya::Pod for ThreadHandoff {}
    unsafe impl aya::Pod for HandoffSample {}
    unsafe impl aya::Pod for PendingWakeKey {}
    unsafe impl aya::Pod for PendingWake {}
    unsafe impl aya::Pod for HandoffSampler {}
    unsafe impl aya::Pod for GoMutexCalls {}
    unsafe impl aya::Pod for HotFutexKey {}
    unsafe impl aya::Pod for HotFutexValue {}
    unsafe impl aya::Pod for LockStats {}
    unsafe impl aya::Pod for LockInflight {}
    unsafe impl aya::Pod for LockSiteKey {}
    unsafe impl aya::Pod for LockSiteValue {}
    unsafe impl aya::Pod for net::NetIfKey {}
    unsafe impl aya::Pod for net::NetIfStats {}
    unsafe impl aya::Pod for net::NetIfInfo {}
    unsafe impl aya::Pod for net::NetDropKey {}
    unsafe impl aya::Pod for net::NetDropStats {}
    unsafe impl aya::Pod for net::CgroupNetStats {}
    unsafe impl aya::Pod for net::NetSenderKey {}
}

#[cfg(test)]
mod net_tests {
    use super::net::*;

    #[test]
    fn lengths_land_in_log2_buckets_below_the_mtu() {
        assert_eq!(len_bucket_of(0, 0), 0);
        assert_eq!(len_bucket_of(64, 0), 0);
        assert_eq!(len_bucket_of(65, 0), 1);
        assert_eq!(len_bucket_of(128, 0), 1);
        assert_eq!(len_bucket_of(129, 0), 2);
        assert_eq!(len_bucket_of(1024, 0), 4);
        assert_eq!(len_bucket_of(1025, 0), 5);
        assert_eq!(len_bucket_of(16384, 0), 8);
        assert_eq!(len_bucket_of(16385, 0), 9);
        assert_eq!(len_bucket_of(65535, 0), 9);
        assert_eq!(len_bucket_of(u32::MAX, 0), 9);
        for b in 0..len_bucket::LOG2_COUNT {
            match len_bucket::log2_upper(b) {
                Some(upper) => {
                    assert_eq!(len_bucket_of(upper, 0), b);
                    assert_eq!(len_bucket_of(upper + 1, 0), b + 1);
                }
                None => assert_eq!(b, len_bucket::LOG2_COUNT - 1),
            }
        }
    }

    #[test]
    fn the_mtu_has_its_own_buckets() {
        let mtu = 1500;
        assert_eq!(len_bucket_of(1500, mtu), len_bucket::AT_MTU);
        assert_eq!(len_bucket_of(1501, mtu), len_bucket::OVER_MTU);
        assert_eq!(len_bucket_of(9000, mtu), len_bucket::OVER_MTU);
        assert_eq!(len_bucket_of(1499, mtu), len_bucket::NEAR_MTU);
        assert_eq!(len_bucket_of(1421, mtu), len_bucket::NEAR_MTU);
        assert_eq!(
            len_bucket_of(1420, mtu),
            5,
            "mtu - 80 is below the near bucket"
        );
        assert_eq!(len_bucket_of(1450, 1450), len_bucket::AT_MTU);
        assert_eq!(len_bucket_of(84, 1500), 1);
        // A tiny MTU: everything at or near it.
        assert_eq!(len_bucket_of(60, 68), len_bucket::NEAR_MTU);
    }

    fn ipv4(frag_off: u16, protocol: u8, ihl: u8) -> [u8; 20] {
        let mut h = [0u8; 20];
        h[0] = 0x40 | ihl;
        h[6] = (frag_off >> 8) as u8;
        h[7] = frag_off as u8;
        h[9] = protocol;
        h
    }

    #[test]
    fn ipv4_fragments_and_icmp_are_recognized() {
        let df = 0x4000;
        let plain = classify_ipv4(&ipv4(df, 17, 5));
        assert!(!plain.fragment && !plain.icmp);
        assert_eq!(plain.l4_offset, 20);
        let first = classify_ipv4(&ipv4(0x2000, 1, 5));
        assert!(
            first.fragment && first.icmp,
            "first fragment of an ICMP packet"
        );
        let later = classify_ipv4(&ipv4(0x00b9, 1, 5));
        assert!(
            later.fragment && !later.icmp,
            "a later fragment has no ICMP header"
        );
        let last = classify_ipv4(&ipv4(0x00b9, 17, 5));
        assert!(last.fragment);
        let options = classify_ipv4(&ipv4(0, 1, 6));
        assert!(options.icmp && !options.fragment);
        assert_eq!(options.l4_offset, 24);
    }

    #[test]
    fn ipv6_and_ptb() {
        assert!(classify_ipv6(44).fragment);
        assert!(classify_ipv6(58).icmp);
        assert!(!classify_ipv6(6).fragment && !classify_ipv6(6).icmp);
        assert!(is_ptb(false, 3, 4));
        assert!(!is_ptb(false, 3, 3), "port unreachable");
        assert!(!is_ptb(false, 0, 0));
        assert!(is_ptb(true, 2, 0));
        assert!(!is_ptb(true, 1, 4));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_padding() {
        assert_eq!(size_of::<Log2Histogram>(), 8 * (2 + LOG2_BUCKETS));
        assert_eq!(
            size_of::<SchedStats>(),
            8 * 5 + 3 * size_of::<Log2Histogram>()
        );
        assert_eq!(size_of::<TaskState>(), 8 * 7 + 4 * 4);
        assert_eq!(size_of::<OnCpu>(), 8 * 2 + 4 * 2);
        assert_eq!(size_of::<SchedCache>(), 8 * 2 + size_of::<SchedStats>());
        assert_eq!(size_of::<FutexStats>(), 8 * 6 + size_of::<Log2Histogram>());
        assert_eq!(size_of::<FutexInflight>(), 8 * 2 + 4 * 2 + 8 * 8);
        assert_eq!(size_of::<HotFutexKey>(), 8 * 2 + 4 * 2);
        assert_eq!(size_of::<HotFutexValue>(), 8 * 3 + 16 + 4 * 2);
        assert_eq!(size_of::<ThreadHandoff>(), 8 * 6 + 4 * 2);
        assert_eq!(size_of::<LockStats>(), 8 * 2 * lock_kind::COUNT);
        assert_eq!(size_of::<LockInflight>(), 8 * 2 + 4 * 2);
        assert_eq!(size_of::<LockSiteKey>(), 8 + 4 * 2);
        assert_eq!(size_of::<LockSiteValue>(), 8 * 3);
    }

    #[test]
    fn net_layouts_have_no_padding() {
        use net::*;
        let buckets = 8 * len_bucket::COUNT;
        assert_eq!(size_of::<NetDirStats>(), 8 * 6 + buckets);
        assert_eq!(size_of::<NetIfKey>(), 4 * 2);
        assert_eq!(
            size_of::<NetIfStats>(),
            2 * size_of::<NetDirStats>() + 4 * 2
        );
        assert_eq!(size_of::<NetIfInfo>(), 16 * 2 + 8);
        assert_eq!(size_of::<NetDropKey>(), 4 * 4);
        assert_eq!(size_of::<NetDropStats>(), 8);
        assert_eq!(size_of::<CgroupNetStats>(), 8 * 7 + 2 * buckets);
        assert_eq!(size_of::<NetSenderKey>(), 16);
    }

    #[test]
    fn futex_ops_are_classified_with_flags_masked() {
        const PRIVATE: u32 = 128;
        const CLOCK_REALTIME: u32 = 256;
        assert_eq!(futex_op_class(futex_cmd::WAIT), futex_class::WAIT);
        assert_eq!(futex_op_class(futex_cmd::WAIT | PRIVATE), futex_class::WAIT);
        assert_eq!(
            futex_op_class(futex_cmd::WAIT_BITSET | PRIVATE | CLOCK_REALTIME),
            futex_class::WAIT
        );
        for op in [
            futex_cmd::LOCK_PI,
            futex_cmd::LOCK_PI2,
            futex_cmd::WAIT_REQUEUE_PI,
        ] {
            assert_eq!(futex_op_class(op | PRIVATE), futex_class::WAIT);
        }
        assert_eq!(futex_op_class(futex_cmd::WAKE | PRIVATE), futex_class::WAKE);
        assert_eq!(futex_op_class(futex_cmd::WAKE_OP), futex_class::WAKE);
        assert_eq!(
            futex_op_class(futex_cmd::CMP_REQUEUE),
            futex_class::WAKE_OTHER
        );
        assert_eq!(futex_op_class(futex_cmd::TRYLOCK_PI), 0);
        assert_eq!(futex_op_class(2 /* FUTEX_FD, removed */), 0);
    }

    #[test]
    fn lock_kinds_follow_the_kernels_flags() {
        assert_eq!(lock_kind_of(lcb::SPIN), lock_kind::SPIN);
        assert_eq!(
            lock_kind_of(lcb::SPIN | lcb::READ),
            lock_kind::SPIN,
            "rwlock"
        );
        assert_eq!(
            lock_kind_of(lcb::MUTEX | lcb::SPIN),
            lock_kind::MUTEX,
            "optimistic spin"
        );
        assert_eq!(lock_kind_of(lcb::MUTEX), lock_kind::MUTEX);
        assert_eq!(lock_kind_of(lcb::READ), lock_kind::RWSEM_READ);
        assert_eq!(lock_kind_of(lcb::WRITE), lock_kind::RWSEM_WRITE);
        assert_eq!(lock_kind_of(lcb::RT), lock_kind::RT);
        assert_eq!(lock_kind_of(lcb::PERCPU | lcb::READ), lock_kind::PERCPU);
        assert_eq!(lock_kind_of(0), lock_kind::OTHER);
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
