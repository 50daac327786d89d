//! Sampled hand-offs: both sides of a futex hand-off (and Go's `sync.Mutex` slow paths), each with
//! the user registers and the top of the user stack to unwind. Written by the kernel's `handoff.rs`
//! (for `futex.rs` and `gomutex.rs`) to the `HANDOFF_SAMPLES` ring buffer; drained by the agent's
//! `probes/futex.rs`, paired and named by `symbolize/handoffs.rs`.

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

/// One side of a sampled hand-off, with the user registers and stack to unwind it by: the
/// record of the `HANDOFF_SAMPLES` ring buffer. The two sides share `head.sample_id`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HandoffSample {
    pub head: HandoffHead,
    /// The top of the user stack, from `head.sp` up: `head.stack_len` bytes of it were read.
    pub stack: [u8; HANDOFF_STACK_BYTES],
}

/// What a [`HandoffSample`] says besides its stack bytes: which side of which hand-off it is,
/// its figures, and the user registers its stack is unwound from. A header of its own so that
/// the agent keeps it as it is when it cuts the stack to what was read.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HandoffHead {
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
    /// Bytes of the sample's `stack` read (0 when none could be).
    pub stack_len: u32,
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

// SAFETY (all): plain #[repr(C)] structs of fixed-width integers with no padding (see the
// size tests).
#[cfg(feature = "user")]
mod user {
    unsafe impl aya::Pod for super::HandoffSample {}
    unsafe impl aya::Pod for super::PendingWakeKey {}
    unsafe impl aya::Pod for super::PendingWake {}
    unsafe impl aya::Pod for super::HandoffSampler {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};

    #[test]
    fn layouts_have_no_padding() {
        assert_eq!(size_of::<HandoffHead>(), 8 * 10 + 4 * 8);
        assert_eq!(
            size_of::<HandoffSample>(),
            size_of::<HandoffHead>() + HANDOFF_STACK_BYTES
        );
        assert_eq!(size_of::<PendingWakeKey>(), 8 * 2);
        assert_eq!(size_of::<PendingWake>(), 8 * 2 + 4 * 2);
        assert_eq!(size_of::<HandoffSampler>(), 8 * 3);
    }

    /// The kernel writes a sample into the ring buffer field by field and the agent reads it
    /// back whole: every field's offset is pinned, not only the size.
    #[test]
    fn handoff_sample_offsets_are_pinned() {
        let offsets = [
            ("sample_id", offset_of!(HandoffSample, head.sample_id), 0),
            ("cgroup_id", offset_of!(HandoffSample, head.cgroup_id), 8),
            ("uaddr", offset_of!(HandoffSample, head.uaddr), 16),
            ("ip", offset_of!(HandoffSample, head.ip), 24),
            ("sp", offset_of!(HandoffSample, head.sp), 32),
            ("bp", offset_of!(HandoffSample, head.bp), 40),
            ("wait_ns", offset_of!(HandoffSample, head.wait_ns), 48),
            (
                "wake_to_return_ns",
                offset_of!(HandoffSample, head.wake_to_return_ns),
                56,
            ),
            ("hold_ns", offset_of!(HandoffSample, head.hold_ns), 64),
            (
                "hold_run_delay_ns",
                offset_of!(HandoffSample, head.hold_run_delay_ns),
                72,
            ),
            ("hold_nvcsw", offset_of!(HandoffSample, head.hold_nvcsw), 80),
            (
                "hold_nivcsw",
                offset_of!(HandoffSample, head.hold_nivcsw),
                84,
            ),
            ("tgid", offset_of!(HandoffSample, head.tgid), 88),
            ("tid", offset_of!(HandoffSample, head.tid), 92),
            ("side", offset_of!(HandoffSample, head.side), 96),
            ("cpu", offset_of!(HandoffSample, head.cpu), 100),
            ("waker_cpu", offset_of!(HandoffSample, head.waker_cpu), 104),
            ("stack_len", offset_of!(HandoffSample, head.stack_len), 108),
            ("stack", offset_of!(HandoffSample, stack), 112),
        ];
        for (field, got, want) in offsets {
            assert_eq!(got, want, "offset of {field}");
        }
        assert_eq!(size_of::<HandoffSample>(), 112 + HANDOFF_STACK_BYTES);
        assert_eq!(align_of::<HandoffSample>(), 8);
    }
}
