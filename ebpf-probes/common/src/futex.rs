//! The futex family: per-cgroup wait and wake figures, the hottest futex words, each thread's part
//! in hand-offs, and the call in progress in a thread's task storage. Written by the kernel's
//! `futex.rs` (`CGROUP_FUTEX`, `HOT_FUTEXES`, `HANDOFF_THREADS`, `FUTEX_INFLIGHT`, whose hold and
//! sample fields `handoff.rs` keeps); read by the agent's `probes/futex.rs` and `probes/mod.rs`.

use crate::histogram::Log2Histogram;

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
    /// The thread's hold (see [`HandoffHead::hold_ns`](crate::HandoffHead::hold_ns)): when
    /// its latest woken wait returned (0 when a wake has ended the hold since), and its
    /// run-queue wait and switch counts then.
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

// SAFETY (all): plain #[repr(C)] structs of fixed-width integers with no padding (see the
// size tests).
#[cfg(feature = "user")]
mod user {
    unsafe impl aya::Pod for super::FutexStats {}
    unsafe impl aya::Pod for super::FutexInflight {}
    unsafe impl aya::Pod for super::HotFutexKey {}
    unsafe impl aya::Pod for super::HotFutexValue {}
    unsafe impl aya::Pod for super::ThreadHandoff {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_padding() {
        assert_eq!(size_of::<FutexStats>(), 8 * 6 + size_of::<Log2Histogram>());
        assert_eq!(size_of::<FutexInflight>(), 8 * 2 + 4 * 2 + 8 * 8);
        assert_eq!(size_of::<HotFutexKey>(), 8 * 2 + 4 * 2);
        assert_eq!(size_of::<HotFutexValue>(), 8 * 3 + 16 + 4 * 2);
        assert_eq!(size_of::<ThreadHandoff>(), 8 * 6 + 4 * 2);
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
}
