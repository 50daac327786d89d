//! Sampled hand-offs: both sides of a futex hand-off — the wake that let a lock go and the wait
//! it ended — with each side's user registers and the top of its user stack, for the agent to
//! unwind (with the binaries' call-frame information: libc and a JVM keep no frame pointers, so
//! a kernel frame-pointer walk would skip the very function that called the lock) and name.
//!
//! - A wake is chosen at its entry, at most one per `HANDOFF_SAMPLE_INTERVAL_NS` per CPU, so
//!   that the cost is bounded whatever the storm's rate; between turns a CPU reads the clock
//!   once every `CLOCK_EVERY` wakes. At its exit,
//!   if it woke anyone, its word is kept in `PENDING_WAKES` with its entry's time and its own
//!   side is written; if it woke nobody, the CPU's turn is given back.
//! - The waiter: the first thread to return from a wait on that word (in that cgroup) that began
//!   before the wake did takes the pending entry and writes its side, with its wait, the time
//!   from the wake to its return, and whether it returned on another CPU.
//! - The holder: every woken wait's return stamps the thread's futex task storage with the time
//!   and its run-queue wait and switch counts; a sampled wake reads them back, so its side says
//!   how long the waker held on since it was handed the lock, and whether it was switched out
//!   (preempted or throttled, or asleep) meanwhile. A wake clears the stamp: a thread that took
//!   the lock without waiting has no hold on record.
//!
//! Nothing here runs for calls that are neither a chosen wake nor a woken wait, apart from the
//! rate limit's per-CPU decrement per wake.

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_task_pt_regs,
    },
    macros::map,
    maps::{Array, LruHashMap, PerCpuArray, RingBuf},
};
use stormwatch_common::{
    FutexInflight, HANDOFF_STACK_BYTES, HandoffHead, HandoffSample, HandoffSampler, PendingWake,
    PendingWakeKey, ProbeError, handoff_side,
};

use crate::shared::{count_error, current_task, global_u32, typed};

/// Words with a sampled wake whose waiter has not returned. Bounded by the sampling rate; an
/// entry whose waiter never returns is replaced by the next sampled wake on its word, or evicted
/// (LRU) by newer ones.
const MAX_PENDING: u32 = 4096;

/// 2 MiB: at the agent's default budget (100 sampled wakes a second on the whole node, two
/// records each) a second and a half of samples between two of its reads.
const SAMPLES_BYTES: u32 = 2 << 20;

/// Wakes a CPU lets pass between two reads of the clock while it is not its turn to sample:
/// a storm's wakes (millions a second, most waking nobody) pay a per-CPU decrement, not a clock
/// read. A turn comes at most this many wakes late.
const CLOCK_EVERY: u64 = 16;

#[map(name = "HANDOFF_SAMPLES")]
static HANDOFF_SAMPLES: RingBuf = RingBuf::with_byte_size(SAMPLES_BYTES, 0);

#[map(name = "PENDING_WAKES")]
static PENDING_WAKES: LruHashMap<PendingWakeKey, PendingWake> =
    LruHashMap::with_max_entries(MAX_PENDING, 0);

/// When the latest sampled wake that woke a waiter began (one slot, written ~100 times a
/// second on the whole node, read by every woken wait): a wait that began after it cannot be
/// that wake's waiter, so most woken waits skip the pending-word lookup.
#[map(name = "LAST_SAMPLED_WAKE")]
static LAST_SAMPLED_WAKE: Array<u64> = Array::with_max_entries(1, 0);

#[map(name = "HANDOFF_SAMPLER")]
static HANDOFF_SAMPLER: PerCpuArray<HandoffSampler> = PerCpuArray::with_max_entries(1, 0);

#[unsafe(no_mangle)]
static PT_REGS_IP_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static PT_REGS_SP_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static PT_REGS_BP_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static PT_REGS_AX_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static HOLD_RUN_DELAY_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static HOLD_NVCSW_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static HOLD_NIVCSW_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static HAVE_HANDOFF_SAMPLES: u32 = 0;
#[unsafe(no_mangle)]
static HANDOFF_SAMPLE_INTERVAL_NS: u32 = 0;

#[inline(always)]
pub fn enabled() -> bool {
    global_u32(&HAVE_HANDOFF_SAMPLES) == 1
}

/// At a wake's entry: whether to sample it, as `(sample id, now)` (an id of 0: not sampled).
/// Only a task-storage write: most wakes wake nobody (glibc wakes on every unlock of a mutex
/// that was contended, waiters or not), so the word is kept for its waiter only at the exit of
/// a wake that woke one, and a wake that woke nobody gives its turn back.
#[inline(always)]
pub fn choose_wake(uaddr: u64) -> (u64, u64) {
    if !enabled() || uaddr == 0 {
        return (0, 0);
    }
    take_turn(&HANDOFF_SAMPLER, global_u32(&HANDOFF_SAMPLE_INTERVAL_NS))
}

/// Whether this CPU may sample now, by `sampler`'s rate limit (a sample per `interval_ns` at
/// most): `(sample id, now)`, an id of 0 when it may not.
#[inline(always)]
pub fn take_turn(sampler: &PerCpuArray<HandoffSampler>, interval_ns: u32) -> (u64, u64) {
    let Some(sampler) = sampler.get_ptr_mut(0) else {
        return (0, 0);
    };
    // SAFETY: this CPU's slot; syscall entries do not nest on one CPU.
    let sampler = unsafe { &mut *sampler };
    if sampler.skip > 0 {
        sampler.skip -= 1;
        return (0, 0);
    }
    // SAFETY: a helper with no preconditions. (The coarse clock would be cheaper, but tracing
    // programs may not read it.)
    let now = unsafe { bpf_ktime_get_ns() };
    if now < sampler.next_ns {
        sampler.skip = CLOCK_EVERY - 1;
        return (0, 0);
    }
    sampler.next_ns = now + u64::from(interval_ns);
    sampler.seq += 1;
    // SAFETY: a helper with no preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    (
        (u64::from(cpu) << 40) | (sampler.seq & ((1 << 40) - 1)),
        now,
    )
}

/// At a wake's exit: `woke` waiters were woken. For a sampled wake that woke one, keeps its
/// word for the waiter and writes the waker's side; one that woke nobody gives its turn back.
/// Ends the thread's hold either way.
///
/// A woken waiter that returns before its waker's exit (microseconds later, against the
/// waiter's own wake-up, switch-in and return) misses the entry, which the next waiter on the
/// word to return then takes; the sites stay those of the word's waiters and wakers.
#[inline(always)]
pub fn wake_exit(call: &mut FutexInflight, cgroup_id: u64, woke: bool) {
    let held_since = call.held_since_ns;
    call.held_since_ns = 0;
    if call.sample_id == 0 {
        return;
    }
    let sample_id = call.sample_id;
    call.sample_id = 0;
    if !woke {
        if let Some(sampler) = HANDOFF_SAMPLER.get_ptr_mut(0) {
            // SAFETY: this CPU's slot (perhaps not the entry's CPU: then that one waits its
            // turn and this one samples sooner; the budget still holds on the whole).
            unsafe {
                (*sampler).next_ns = 0;
                (*sampler).skip = CLOCK_EVERY - 1;
            }
        }
        return;
    }
    let pending = PendingWake {
        sample_id,
        // The wake's entry (`start_ns` of a sampled wake).
        at_ns: call.start_ns,
        cpu: (sample_id >> 40) as u32,
        _pad: 0,
    };
    let key = PendingWakeKey {
        cgroup_id,
        uaddr: call.uaddr,
    };
    if PENDING_WAKES.insert(&key, &pending, 0).is_err() {
        return;
    }
    if let Some(last) = LAST_SAMPLED_WAKE.get_ptr_mut(0) {
        // SAFETY: one u64 slot; a racing writer leaves one of two recent times, either of which
        // only decides whether a waiter looks.
        unsafe { *last = pending.at_ns };
    }
    let task = current_task() as *const u8;
    // SAFETY: a helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let (hold_ns, run_delay, nvcsw, nivcsw) = if held_since != 0 && now > held_since {
        (
            now - held_since,
            typed::<u64>(task, global_u32(&HOLD_RUN_DELAY_OFFSET))
                .wrapping_sub(call.held_run_delay),
            typed::<u64>(task, global_u32(&HOLD_NVCSW_OFFSET)).wrapping_sub(call.held_nvcsw),
            typed::<u64>(task, global_u32(&HOLD_NIVCSW_OFFSET)).wrapping_sub(call.held_nivcsw),
        )
    } else {
        (0, 0, 0, 0)
    };
    write(
        sample_id,
        cgroup_id,
        call.uaddr,
        handoff_side::WAKER,
        task_regs(),
        |s| {
            s.hold_ns = hold_ns;
            s.hold_run_delay_ns = run_delay;
            s.hold_nvcsw = nvcsw as u32;
            s.hold_nivcsw = nivcsw as u32;
        },
    );
}

/// At a woken wait's return (`now`) by `task`, the current one: stamps the thread's hold, and
/// writes the waiter's side if a sampled wake on its word began after its wait did.
#[inline(always)]
pub fn woken_wait_exit(
    call: &mut FutexInflight,
    task: *const u8,
    cgroup_id: u64,
    now: u64,
    waited: u64,
) {
    if !enabled() {
        return;
    }
    call.held_since_ns = now;
    call.held_run_delay = typed::<u64>(task, global_u32(&HOLD_RUN_DELAY_OFFSET));
    call.held_nvcsw = typed::<u64>(task, global_u32(&HOLD_NVCSW_OFFSET));
    call.held_nivcsw = typed::<u64>(task, global_u32(&HOLD_NIVCSW_OFFSET));
    if call.uaddr == 0 {
        return;
    }
    let last = LAST_SAMPLED_WAKE.get(0).copied().unwrap_or(0);
    if last < call.start_ns {
        // No sampled wake began while this thread waited.
        return;
    }
    let key = PendingWakeKey {
        cgroup_id,
        uaddr: call.uaddr,
    };
    // SAFETY: the value is copied out at once.
    let Some(pending) = (unsafe { PENDING_WAKES.get(&key) }).copied() else {
        return;
    };
    if pending.at_ns < call.start_ns || pending.at_ns > now {
        // A wake that began before this wait did cannot have ended it.
        return;
    }
    // Only one waiter takes it: the first whose delete succeeds.
    if PENDING_WAKES.remove(&key).is_err() {
        return;
    }
    write(
        pending.sample_id,
        cgroup_id,
        call.uaddr,
        handoff_side::WAITER,
        task_regs(),
        |s| {
            s.wait_ns = waited;
            s.wake_to_return_ns = now - pending.at_ns;
            s.waker_cpu = pending.cpu;
        },
    );
}

/// User registers: instruction, stack and frame pointers.
#[derive(Clone, Copy)]
pub struct Regs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// The current thread's user registers (as it entered the kernel), read from its BTF-typed
/// `pt_regs`.
#[inline(always)]
fn task_regs() -> Regs {
    // SAFETY: the current task, a BTF pointer.
    let regs = (unsafe { bpf_task_pt_regs(current_task()) }) as *const u8;
    Regs {
        ip: typed::<u64>(regs, global_u32(&PT_REGS_IP_OFFSET)),
        sp: typed::<u64>(regs, global_u32(&PT_REGS_SP_OFFSET)),
        bp: typed::<u64>(regs, global_u32(&PT_REGS_BP_OFFSET)),
    }
}

/// A probe context's `pt_regs` field at `offset` (a context pointer may only be loaded from
/// at a constant offset, so it is read with a helper).
#[inline(always)]
fn ctx_reg(ctx: *const u8, offset: &u32) -> u64 {
    // SAFETY: `ctx` points at the probe's `struct pt_regs`, and `offset` is a field of it (BTF);
    // the helper tolerates any address.
    unsafe {
        aya_ebpf::helpers::bpf_probe_read_kernel(
            ctx.wrapping_add(global_u32(offset) as usize) as *const u64
        )
    }
    .unwrap_or(0)
}

/// A uprobe's user registers, from its context.
#[inline(always)]
pub fn probe_regs(ctx: *const u8) -> Regs {
    Regs {
        ip: ctx_reg(ctx, &PT_REGS_IP_OFFSET),
        sp: ctx_reg(ctx, &PT_REGS_SP_OFFSET),
        bp: ctx_reg(ctx, &PT_REGS_BP_OFFSET),
    }
}

/// The receiver of the Go method a uprobe stopped at the entry of: its first argument, in
/// `ax` under Go's register ABI (amd64).
#[inline(always)]
pub fn go_receiver(ctx: *const u8) -> u64 {
    ctx_reg(ctx, &PT_REGS_AX_OFFSET)
}

/// Writes one side: the fields every side has, then `fill`'s, then the user registers from
/// `regs` and the top of the user stack (4 KiB, or 1 KiB, or 256 bytes
/// where the stack ends sooner).
#[inline(always)]
pub fn write(
    sample_id: u64,
    cgroup_id: u64,
    uaddr: u64,
    side: u32,
    regs: Regs,
    fill: impl FnOnce(&mut HandoffHead),
) {
    let Some(mut entry) = HANDOFF_SAMPLES.reserve::<HandoffSample>(0) else {
        count_error(ProbeError::HandoffSampleLost);
        return;
    };
    // SAFETY: the reservation is exclusive and sized for a HandoffSample; every field of its
    // head is written below before submit (the stack bytes past `stack_len` are not read).
    let sample = unsafe { &mut *entry.as_mut_ptr() };
    let s = &mut sample.head;
    let pid_tgid = bpf_get_current_pid_tgid();
    s.sample_id = sample_id;
    s.cgroup_id = cgroup_id;
    s.uaddr = uaddr;
    s.wait_ns = 0;
    s.wake_to_return_ns = 0;
    s.hold_ns = 0;
    s.hold_run_delay_ns = 0;
    s.hold_nvcsw = 0;
    s.hold_nivcsw = 0;
    s.tgid = (pid_tgid >> 32) as u32;
    s.tid = pid_tgid as u32;
    s.side = side;
    // SAFETY: a helper with no preconditions.
    s.cpu = unsafe { bpf_get_smp_processor_id() };
    s.waker_cpu = 0;
    fill(s);
    s.ip = regs.ip;
    s.sp = regs.sp;
    s.bp = regs.bp;
    s.stack_len = 0;
    let sp = s.sp as *const u8;
    let dst = sample.stack.as_mut_ptr() as *mut core::ffi::c_void;
    for len in [HANDOFF_STACK_BYTES, 1024, 256] {
        // SAFETY: `dst` has HANDOFF_STACK_BYTES bytes; the helper tolerates any user address.
        let ret = unsafe {
            aya_ebpf::helpers::generated::bpf_probe_read_user(dst, len as u32, sp.cast())
        };
        if ret == 0 {
            s.stack_len = len as u32;
            break;
        }
    }
    if s.stack_len == 0 {
        count_error(ProbeError::HandoffSampleLost);
    }
    entry.submit(0);
}
