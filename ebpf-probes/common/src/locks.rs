//! The kernel lock contention family: per-cgroup waits by lock kind and the contended call sites.
//! Written by the kernel's `locks.rs` (`CGROUP_LOCKS`, `LOCK_SITES`, `LOCK_SLEEPING`,
//! `LOCK_SPINNING`); read by the agent's `probes/locks.rs`, which names the sites.

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

/// What `contention_end` keeps per CPU: the spinning waiter in progress, and the state of the
/// CPU's stack-walk budget ([`LOCK_STACK_WALK_INTERVAL_NS`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockCpu {
    pub spinning: LockInflight,
    /// The budget's theoretical arrival time (the generic cell rate algorithm): a walk is
    /// allowed when this is at most [`LOCK_STACK_WALK_BURST_NS`] ahead of now, and each walk
    /// moves it [`LOCK_STACK_WALK_INTERVAL_NS`] on from the later of itself and now.
    pub walk_tat_ns: u64,
}

/// The shortest kernel-lock wait whose call site the probes take (a kernel stack walk, which
/// costs more than most spinlock waits last): 10 µs. Every wait counts in its cgroup's figures.
pub const LOCK_SITE_MIN_WAIT_NS: u64 = 10_000;

/// Each CPU walks at most one kernel stack per this many ns on average (1,000 a second): a
/// walk costs 2–3 µs (issue #43's measurements), so a storm of long waits spends at most
/// about 0.3% of each CPU naming its call sites. Waits past the budget still count, in their
/// cgroup's figures and under [`LOCK_SITE_UNWALKED`].
pub const LOCK_STACK_WALK_INTERVAL_NS: u64 = 1_000_000;

/// How far ahead of the average rate a CPU may walk: bursts of up to 1,000 walks
/// (`LOCK_STACK_WALK_BURST_NS / LOCK_STACK_WALK_INTERVAL_NS`, a second's worth) are walked in
/// full, so that a contention of a few seconds at under twice the rate is sited in full.
pub const LOCK_STACK_WALK_BURST_NS: u64 = 1_000_000_000;

/// The stack id under which a cgroup's long waits (at least [`LOCK_SITE_MIN_WAIT_NS`]) whose
/// stack was not walked are counted: the CPU's walk budget was spent. Never a real stack id
/// (those are below the stack map's 4,096 entries).
pub const LOCK_SITE_UNWALKED: u32 = u32::MAX;

/// Whether a CPU whose budget state is `tat` may walk a stack at `now`, and the state after.
/// Kept out of the probe so that it can be tested here.
#[inline(always)]
pub const fn stack_walk_allowed(tat: u64, now: u64) -> Option<u64> {
    if tat > now + LOCK_STACK_WALK_BURST_NS {
        return None;
    }
    let from = if tat > now { tat } else { now };
    Some(from + LOCK_STACK_WALK_INTERVAL_NS)
}

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

// SAFETY (all): plain #[repr(C)] structs of fixed-width integers with no padding (see the
// size tests).
#[cfg(feature = "user")]
mod user {
    unsafe impl aya::Pod for super::LockStats {}
    unsafe impl aya::Pod for super::LockInflight {}
    unsafe impl aya::Pod for super::LockCpu {}
    unsafe impl aya::Pod for super::LockSiteKey {}
    unsafe impl aya::Pod for super::LockSiteValue {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_padding() {
        assert_eq!(size_of::<LockStats>(), 8 * 2 * lock_kind::COUNT);
        assert_eq!(size_of::<LockInflight>(), 8 * 2 + 4 * 2);
        assert_eq!(size_of::<LockCpu>(), size_of::<LockInflight>() + 8);
        assert_eq!(size_of::<LockSiteKey>(), 8 + 4 * 2);
        assert_eq!(size_of::<LockSiteValue>(), 8 * 3);
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
    fn stack_walks_keep_to_their_budget() {
        let burst = LOCK_STACK_WALK_BURST_NS / LOCK_STACK_WALK_INTERVAL_NS;
        // A CPU that never walked may walk a burst at once, then one per interval.
        let now = 1_000_000_000;
        let mut tat = 0;
        let mut walked = 0;
        for _ in 0..10 * burst {
            if let Some(next) = stack_walk_allowed(tat, now) {
                tat = next;
                walked += 1;
            }
        }
        assert_eq!(walked, burst + 1, "a burst at one instant");
        // Long waits every 100 µs (10,000 a second) for a second: the burst's remainder is
        // spent, then 1,000 a second.
        let mut t = now;
        let mut walked_later = 0;
        for _ in 0..10_000 {
            t += 100_000;
            if let Some(next) = stack_walk_allowed(tat, t) {
                tat = next;
                walked_later += 1;
            }
        }
        let per_second = 1_000_000_000 / LOCK_STACK_WALK_INTERVAL_NS;
        assert!(
            walked_later >= per_second - 1 && walked_later <= per_second + 1,
            "{walked_later} walks in a second at {per_second} a second"
        );
        // Below the rate every wait is walked: 500 a second.
        let mut tat = 0;
        let mut t = now;
        for _ in 0..1_000 {
            t += 2 * LOCK_STACK_WALK_INTERVAL_NS;
            tat = stack_walk_allowed(tat, t).expect("below the budget's rate");
        }
    }
}
