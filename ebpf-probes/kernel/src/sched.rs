//! Scheduler probes: context switches, run-queue latency, on/off-CPU time and migrations,
//! aggregated per cgroup (the v2 cgroup id) in a per-CPU hash map.
//!
//! Each thread's intervals are credited when the thread leaves a CPU: at that moment it is
//! `current`, so `bpf_get_current_cgroup_id()` names its cgroup without chasing
//! `task->cgroups->dfl_cgrp->kn->id` through four kernel pointers on the hottest path there is.
//! Wake-ups and switch-ins only stamp times into the thread's scratch state.
//!
//! Context switches are not inferred from the tracepoint's arguments: the thread's own
//! `nvcsw`/`nivcsw` counters are read at each switch-out and the difference from the previous
//! switch-out is added. That is exactly what the kernel counted (`/proc/<pid>/status`,
//! `getrusage`), including the cases the `preempt`/`prev_state` arguments misreport (a blocking
//! task with a signal pending is counted voluntary but traced as running).

use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_kernel,
    },
    macros::{btf_tracepoint, map, tracepoint},
    maps::{LruHashMap, PerCpuHashMap},
    programs::{BtfTracePointContext, TracePointContext},
};
use stormwatch_common::{
    ProbeError, SchedStats, TASK_DEAD, TASK_HAS_LAST_CPU, TASK_HAS_RUNQ_PENDING,
    TASK_HAS_SWITCH_BASELINE, TaskState,
};

use crate::shared::{BPF_ANY, BPF_NOEXIST, EEXIST, count_error, global_u32, per_cpu_slot};

/// Default capacities; the agent may resize both before load.
const MAX_CGROUPS: u32 = 4096;
const MAX_TASKS: u32 = 65536;

#[map(name = "CGROUP_SCHED")]
static CGROUP_SCHED: PerCpuHashMap<u64, SchedStats> =
    PerCpuHashMap::with_max_entries(MAX_CGROUPS, 0);

#[map(name = "TASKS")]
static TASKS: LruHashMap<u32, TaskState> = LruHashMap::with_max_entries(MAX_TASKS, 0);

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
const TP_STATE_EXITING: u32 = 0x10 | 0x20;

/// What the switch-out of `prev` needs to know about it.
struct Prev {
    /// `(nvcsw, nivcsw)` read from the task, when the offsets are known.
    counters: Option<(u64, u64)>,
    /// Whether the task stays runnable (preempted), for when counters cannot decide.
    runnable: bool,
    /// The task is exiting and the kernel has already folded its counters into its process's
    /// totals (`exit_state` is set in `exit_notify`, before `release_task`): its switches from
    /// here on, including the final one, are in no total anyone can read.
    dead: bool,
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
    let state: u32 = typed(prev, global_u32(&TASK_STATE_OFFSET));
    let exit_state: u32 = typed(prev, global_u32(&TASK_EXIT_STATE_OFFSET));
    let prev = Prev {
        counters: Some((
            typed(prev, global_u32(&TASK_NVCSW_OFFSET)),
            typed(prev, global_u32(&TASK_NIVCSW_OFFSET)),
        )),
        // As `__schedule` decides: voluntary when not preempted and not runnable.
        runnable: preempt & 0xff != 0 || state == 0,
        dead: state & TASK_DEAD != 0 || exit_state != 0,
    };
    on_switch(prev, next_tid);
    0
}

#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup_btf(ctx: BtfTracePointContext) -> i32 {
    let task: *const u8 = ctx.arg(0);
    on_wakeup(typed(task, global_u32(&TASK_PID_OFFSET)));
    0
}

#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn sched_wakeup_new_btf(ctx: BtfTracePointContext) -> i32 {
    let task: *const u8 = ctx.arg(0);
    on_wakeup(typed(task, global_u32(&TASK_PID_OFFSET)));
    0
}

/// A field of a BTF-typed kernel pointer (tp_btf arguments), loaded directly.
#[inline(always)]
fn typed<T: Copy>(base: *const u8, offset: u32) -> T {
    // SAFETY: `base` is a BTF-typed task_struct pointer from the tracepoint's arguments and
    // `offset` a field of task_struct found in the running kernel's BTF; the verifier checks
    // the access against the type and makes the load fault-tolerant.
    unsafe { core::ptr::read_volatile(base.wrapping_add(offset as usize) as *const T) }
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
    let mut dead = state & TP_STATE_EXITING != 0 && state & TP_STATE_PREEMPTED == 0;
    let counters = if global_u32(&HAVE_TASK_OFFSETS) == 1 {
        // SAFETY: a helper with no preconditions; `current` is `prev` during sched_switch.
        let task = unsafe { bpf_get_current_task() } as *const u8;
        dead |= read_task_u32(task, global_u32(&TASK_EXIT_STATE_OFFSET)) != 0;
        read_task_counters(task)
    } else {
        None
    };
    let prev = Prev {
        counters,
        runnable: state == 0 || state & TP_STATE_PREEMPTED != 0,
        dead,
    };
    on_switch(prev, next_tid);
    0
}

#[tracepoint(category = "sched", name = "sched_wakeup")]
pub fn sched_wakeup_tp(ctx: TracePointContext) -> i32 {
    if let Some(tid) = tp_read_u32(&ctx, global_u32(&TP_WAKEUP_PID_OFFSET)) {
        on_wakeup(tid);
    }
    0
}

#[tracepoint(category = "sched", name = "sched_wakeup_new")]
pub fn sched_wakeup_new_tp(ctx: TracePointContext) -> i32 {
    if let Some(tid) = tp_read_u32(&ctx, global_u32(&TP_WAKEUP_PID_OFFSET)) {
        on_wakeup(tid);
    }
    0
}

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
fn read_task_u64(task: *const u8, offset: u32) -> Option<u64> {
    // SAFETY: as in read_task_u32.
    match unsafe { bpf_probe_read_kernel(task.wrapping_add(offset as usize) as *const u64) } {
        Ok(v) => Some(v),
        Err(_) => {
            count_error(ProbeError::TaskRead);
            None
        }
    }
}

/// The task's `(nvcsw, nivcsw)`: the kernel's own voluntary and involuntary switch counts.
#[inline(always)]
fn read_task_counters(task: *const u8) -> Option<(u64, u64)> {
    let nvcsw = read_task_u64(task, global_u32(&TASK_NVCSW_OFFSET))?;
    let nivcsw = read_task_u64(task, global_u32(&TASK_NIVCSW_OFFSET))?;
    Some((nvcsw, nivcsw))
}

/// The per-CPU stats slot of the current cgroup, created on first use.
#[inline(always)]
fn current_cgroup_stats() -> Option<*mut SchedStats> {
    // SAFETY: a helper with no preconditions.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    per_cpu_slot(
        &CGROUP_SCHED,
        &cgroup_id,
        &SchedStats::ZERO,
        ProbeError::CgroupMapFull,
    )
}

#[inline(always)]
fn on_switch(prev: Prev, next_tid: u32) {
    // SAFETY: helpers with no preconditions.
    let (now, cpu, prev_tid) = unsafe {
        (
            bpf_ktime_get_ns(),
            bpf_get_smp_processor_id(),
            bpf_get_current_pid_tgid() as u32,
        )
    };
    // During sched_switch `current` is still `prev`. tid 0 is a CPU's idle task.
    if prev_tid != 0 {
        switch_out(now, cpu, prev_tid, prev);
    }
    if next_tid != 0 {
        switch_in(now, next_tid);
    }
}

#[inline(always)]
fn switch_out(now: u64, cpu: u32, tid: u32, prev: Prev) {
    let Some(stats) = current_cgroup_stats() else {
        return;
    };
    // SAFETY: a per-CPU map value of this CPU; sched_switch does not nest on one CPU.
    let stats = unsafe { &mut *stats };

    // An exiting thread's last switches are not counted: the kernel has already folded its
    // counters into the process totals (getrusage) before them, and nobody can read them
    // afterwards. Its time on the CPU is still credited.
    if prev.dead {
        if let Some(st) = TASKS.get_ptr_mut(&tid) {
            // SAFETY: a valid map value pointer.
            let st = unsafe { &*st };
            credit_intervals(stats, st, now, cpu);
        }
        let _ = TASKS.remove(&tid);
        return;
    }

    let still_runnable;
    match TASKS.get_ptr_mut(&tid) {
        Some(st) => {
            // SAFETY: a valid map value pointer.
            let st = unsafe { &mut *st };
            match prev.counters {
                Some((nvcsw, nivcsw)) if st.flags & TASK_HAS_SWITCH_BASELINE != 0 => {
                    let voluntary = nvcsw.wrapping_sub(st.nvcsw);
                    let involuntary = nivcsw.wrapping_sub(st.nivcsw);
                    stats.voluntary_switches += voluntary;
                    stats.involuntary_switches += involuntary;
                    still_runnable = involuntary != 0 && voluntary == 0;
                }
                _ => still_runnable = count_by_state(stats, prev.runnable),
            }
            credit_intervals(stats, st, now, cpu);
            st.flags = TASK_HAS_LAST_CPU;
            if let Some((nvcsw, nivcsw)) = prev.counters {
                st.nvcsw = nvcsw;
                st.nivcsw = nivcsw;
                st.flags |= TASK_HAS_SWITCH_BASELINE;
            }
            st.last_cpu = cpu;
            st.oncpu_since = 0;
            st.offcpu_pending_ns = 0;
            st.runq_pending_ns = 0;
            if still_runnable {
                st.queued_since = now;
                st.blocked_since = 0;
            } else {
                st.blocked_since = now;
                st.queued_since = 0;
            }
        }
        None => {
            still_runnable = count_by_state(stats, prev.runnable);
            let (nvcsw, nivcsw) = prev.counters.unwrap_or((0, 0));
            let baseline = if prev.counters.is_some() {
                TASK_HAS_SWITCH_BASELINE
            } else {
                0
            };
            let st = TaskState {
                blocked_since: if still_runnable { 0 } else { now },
                queued_since: if still_runnable { now } else { 0 },
                nvcsw,
                nivcsw,
                last_cpu: cpu,
                flags: baseline | TASK_HAS_LAST_CPU,
                ..TaskState::ZERO
            };
            if TASKS.insert(&tid, &st, BPF_ANY).is_err() {
                count_error(ProbeError::TaskMapUpdate);
            }
        }
    }
}

/// Without a counter baseline (a thread's first switch-out since attach, or no BTF), the
/// switch is classified from the tracepoint: involuntary when the thread stays runnable.
/// Returns whether it does.
#[inline(always)]
fn count_by_state(stats: &mut SchedStats, runnable: bool) -> bool {
    if runnable {
        stats.involuntary_switches += 1;
    } else {
        stats.voluntary_switches += 1;
    }
    runnable
}

/// Credits the intervals that ended since the thread last left a CPU.
#[inline(always)]
fn credit_intervals(stats: &mut SchedStats, st: &TaskState, now: u64, cpu: u32) {
    if st.oncpu_since != 0 && now > st.oncpu_since {
        stats.oncpu_ns += now - st.oncpu_since;
    }
    stats.offcpu_ns += st.offcpu_pending_ns;
    if st.flags & TASK_HAS_RUNQ_PENDING != 0 {
        stats.runq.record(st.runq_pending_ns);
    }
    if st.flags & TASK_HAS_LAST_CPU != 0 && st.last_cpu != cpu {
        stats.migrations += 1;
    }
}

#[inline(always)]
fn switch_in(now: u64, tid: u32) {
    match TASKS.get_ptr_mut(&tid) {
        Some(st) => {
            // SAFETY: a valid map value pointer.
            let st = unsafe { &mut *st };
            if st.queued_since != 0 && now > st.queued_since {
                st.runq_pending_ns = now - st.queued_since;
                st.flags |= TASK_HAS_RUNQ_PENDING;
            }
            st.queued_since = 0;
            // A block whose wake-up we missed is not credited as off-CPU time.
            st.blocked_since = 0;
            st.oncpu_since = now;
        }
        None => {
            let st = TaskState {
                oncpu_since: now,
                ..TaskState::ZERO
            };
            if TASKS.insert(&tid, &st, BPF_ANY).is_err() {
                count_error(ProbeError::TaskMapUpdate);
            }
        }
    }
}

#[inline(always)]
fn on_wakeup(tid: u32) {
    if tid == 0 {
        return;
    }
    // SAFETY: a helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    match TASKS.get_ptr_mut(&tid) {
        Some(st) => {
            // SAFETY: a valid map value pointer.
            let st = unsafe { &mut *st };
            // Only a thread we saw block is queued by this wake-up; a wake-up that finds the
            // thread still on its CPU (it had not yet switched out) changes nothing.
            if st.blocked_since != 0 {
                if now > st.blocked_since {
                    st.offcpu_pending_ns += now - st.blocked_since;
                }
                st.blocked_since = 0;
                st.queued_since = now;
            }
        }
        None => {
            // Blocked since before attach (or new): its run-queue wait starts now.
            let st = TaskState {
                queued_since: now,
                ..TaskState::ZERO
            };
            // EEXIST: a switch on another CPU created it meanwhile, which is fine.
            if let Err(err) = TASKS.insert(&tid, &st, BPF_NOEXIST)
                && err != -EEXIST
            {
                count_error(ProbeError::TaskMapUpdate);
            }
        }
    }
}
