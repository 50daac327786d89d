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

use aya_ebpf::{
    EbpfContext as _,
    helpers::bpf_get_current_cgroup_id,
    macros::{map, uprobe},
    maps::{Array, PerCpuArray, PerCpuHashMap},
    programs::ProbeContext,
};
use stormwatch_common::{GoMutexCalls, HandoffSampler, ProbeError, handoff_side};

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
