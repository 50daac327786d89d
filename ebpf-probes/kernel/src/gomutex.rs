//! Go's `sync.Mutex`, which the futex probes cannot see: a goroutine that waits for one parks in
//! Go's own scheduler, and the futex calls of a Go program are its idle threads'. The agent
//! attaches these uprobes to the entries of the mutex's slow paths in the Go binaries of the
//! processes it watches while the futex probes are attached (`agent/src/probes/gomutex.rs`):
//!
//! - `lockSlow` is entered by a `Lock` whose fast path found the mutex held (it then spins, and
//!   parks the goroutine if the mutex stays held);
//! - `unlockSlow` by an `Unlock` that found waiters (or a woken or starving flag) to hand on.
//!
//! Each entry is counted per cgroup (`GO_MUTEX_CALLS`), and a sample of them — at most one per
//! `GO_SAMPLE_INTERVAL_NS` per CPU — written to the hand-off ring buffer with the registers and
//! the top of the goroutine's stack, for the agent to name the code that took the mutex (the
//! frame above `sync.(*Mutex).Lock`). Entry probes only: a return probe rewrites the return
//! address on a stack that Go's runtime may move.
//!
//! A uprobe is a breakpoint trap: on a contended mutex, taken millions of times a second, it
//! slows the program several-fold while attached. The agent therefore attaches these in short
//! bursts (see the agent's module) and reports rates over the time they were attached.
//!
//! What the mutex costs the CPUs is sampled apart, all the time: `go_oncpu` runs on each CPU's
//! clock ([`stormwatch_common::GO_ONCPU_HZ`] times a second, a `perf_event` program) and, when
//! the thread it interrupted belongs to a Go process the agent reads (`GO_ONCPU_TGIDS`), counts
//! the sample by the top of its user stack (Go keeps frame pointers). The agent names the
//! frames and counts the samples in the mutex's code against all of the process's.

use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, generated::bpf_get_stack},
    macros::{map, perf_event, uprobe},
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap},
    programs::{PerfEventContext, ProbeContext},
};
use stormwatch_common::{
    GO_ONCPU_FRAMES, GoMutexCalls, GoOnCpuKey, HandoffSampler, ProbeError, handoff_side,
};

use crate::{
    handoff::{self, go_receiver},
    shared::{global_u32, per_cpu_slot},
};

/// Cgroups with Go mutex contention at once; the agent deletes removed cgroups' entries.
const MAX_CGROUPS: u32 = 1024;

#[map(name = "GO_MUTEX_CALLS")]
static GO_MUTEX_CALLS: PerCpuHashMap<u64, GoMutexCalls> =
    PerCpuHashMap::with_max_entries(MAX_CGROUPS, 0);

/// The shortest time between two samples on one CPU (the agent's node-wide budget while the
/// uprobes are attached, which is in short bursts).
#[unsafe(no_mangle)]
static GO_SAMPLE_INTERVAL_NS: u32 = 0;

/// 1 while the agent counts: it is set after the uprobes are attached and cleared before they
/// are detached (detaching takes a grace period), so that what is counted is of a span the
/// agent knows to the microsecond.
#[map(name = "GO_MUTEX_ON")]
static GO_MUTEX_ON: Array<u32> = Array::with_max_entries(1, 0);

#[map(name = "GO_MUTEX_SAMPLER")]
static GO_MUTEX_SAMPLER: PerCpuArray<HandoffSampler> = PerCpuArray::with_max_entries(1, 0);

/// Go processes sampled at once (the agent's, bounded by it).
const MAX_ONCPU_TGIDS: u32 = 4096;
/// Distinct (cgroup, process, stack) sampled; the agent deletes an exited process's entries.
const MAX_ONCPU_STACKS: u32 = 16_384;
/// `BPF_F_USER_STACK`.
const USER_STACK: u64 = 1 << 8;

#[map(name = "GO_ONCPU_TGIDS")]
static GO_ONCPU_TGIDS: HashMap<u32, u32> = HashMap::with_max_entries(MAX_ONCPU_TGIDS, 0);

#[map(name = "GO_ONCPU")]
static GO_ONCPU: PerCpuHashMap<GoOnCpuKey, u64> =
    PerCpuHashMap::with_max_entries(MAX_ONCPU_STACKS, 0);

/// One tick of a CPU's clock: counted by the top of the user stack of a watched Go process's
/// thread it interrupted (in user or kernel mode: the user stack is the one the thread entered
/// the kernel from), nothing otherwise.
#[perf_event]
pub fn go_oncpu(ctx: PerfEventContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: a plain lookup; the value is not kept.
    if unsafe { GO_ONCPU_TGIDS.get(&tgid) }.is_none() {
        return 0;
    }
    let mut key = GoOnCpuKey {
        // SAFETY: a helper with no preconditions.
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        tgid,
        frames: 0,
        ips: [0; GO_ONCPU_FRAMES],
    };
    let size = core::mem::size_of::<[u64; GO_ONCPU_FRAMES]>() as u32;
    // SAFETY: the buffer is the key's own array, `size` bytes long.
    let n = unsafe {
        bpf_get_stack(
            ctx.as_ptr(),
            key.ips.as_mut_ptr() as *mut core::ffi::c_void,
            size,
            USER_STACK,
        )
    };
    if n > 0 {
        key.frames = (n as u32) / 8;
    }
    if let Some(v) = per_cpu_slot(&GO_ONCPU, &key, &0u64, ProbeError::GoOnCpuFull) {
        // SAFETY: this CPU's value; a perf_event program does not nest on one CPU.
        unsafe { *v += 1 };
    }
    0
}

#[uprobe]
pub fn go_mutex_lock_slow(ctx: ProbeContext) -> u32 {
    entered(&ctx, handoff_side::GO_LOCK);
    0
}

#[uprobe]
pub fn go_mutex_unlock_slow(ctx: ProbeContext) -> u32 {
    entered(&ctx, handoff_side::GO_UNLOCK);
    0
}

#[inline(always)]
fn entered(ctx: &ProbeContext, side: u32) {
    if !handoff::enabled() || GO_MUTEX_ON.get(0).copied() != Some(1) {
        return;
    }
    // SAFETY: a helper with no preconditions.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    let zero = GoMutexCalls {
        lock_slow: 0,
        unlock_slow: 0,
    };
    if let Some(calls) = per_cpu_slot(
        &GO_MUTEX_CALLS,
        &cgroup_id,
        &zero,
        ProbeError::CgroupMapFull,
    ) {
        // SAFETY: this CPU's value; a uprobe handler does not nest on one CPU.
        let calls = unsafe { &mut *calls };
        if side == handoff_side::GO_LOCK {
            calls.lock_slow += 1;
        } else {
            calls.unlock_slow += 1;
        }
    }
    let (sample_id, _) = handoff::take_turn(&GO_MUTEX_SAMPLER, global_u32(&GO_SAMPLE_INTERVAL_NS));
    if sample_id == 0 {
        return;
    }
    let ctx = ctx.as_ptr() as *const u8;
    // Not paired with another side: the id only says which CPU's turn it was.
    handoff::write(
        0,
        cgroup_id,
        go_receiver(ctx),
        side,
        handoff::probe_regs(ctx),
        |_| {},
    );
}
