//! The counter types the probes produce and every layer above reads: cumulative counters that
//! are added across CPUs and windows and subtracted between snapshots. Below both `probes` (which
//! folds per-CPU values) and `collect` (which takes differences).
//!
//! Most of the kernel's value structs are `#[repr(C)]` runs of `u64` counters and nothing else;
//! for those, adding and subtracting is done once, word by word (`all_u64_counters!`). The
//! few with a field that is not a counter (a maximum, a name, an MTU) say so in their own impl.
//!
//! Also here: what the agent itself had to drop or chose to forget, next to the kernel's
//! lost-event counters (see [`UserLoss`]).

use std::sync::atomic::{AtomicU64, Ordering};

use stormwatch_common::{
    FutexStats, HotFutexValue, LockSiteValue, LockStats, Log2Histogram, PgLockWaits,
    RunqBlameValue, SchedStats, ThreadHandoff,
    net::{CgroupNetStats, NetDirStats, NetDropStats, NetIfStats},
};

/// Cumulative counters: added across CPUs and windows, subtracted between snapshots.
pub trait Counters: Copy + PartialEq {
    const ZERO: Self;
    fn add(&mut self, other: &Self);
    /// `self - then`, or `None` when a counter went backwards.
    fn since(&self, then: &Self) -> Option<Self>;
}

/// A value struct made only of `u64` counters.
///
/// # Safety
/// The type must be `#[repr(C)]` (or transparent) and consist of `u64`s only (arrays of them
/// included), so that it is exactly `size_of::<Self>() / 8` initialised `u64` words.
unsafe trait AllU64: Copy {}

fn words<T: AllU64>(v: &T) -> &[u64] {
    const { assert!(size_of::<T>().is_multiple_of(8) && align_of::<T>() == 8) };
    // SAFETY: `AllU64` guarantees the value is a run of initialised u64s, aligned.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u64>(), size_of::<T>() / 8) }
}

fn words_mut<T: AllU64>(v: &mut T) -> &mut [u64] {
    const { assert!(size_of::<T>().is_multiple_of(8) && align_of::<T>() == 8) };
    // SAFETY: as in `words`; every bit pattern is a valid u64.
    unsafe { std::slice::from_raw_parts_mut((v as *mut T).cast::<u64>(), size_of::<T>() / 8) }
}

fn add_words<T: AllU64>(into: &mut T, other: &T) {
    for (t, o) in words_mut(into).iter_mut().zip(words(other)) {
        *t = t.wrapping_add(*o);
    }
}

fn since_words<T: AllU64>(now: &T, then: &T) -> Option<T> {
    let mut d = *now;
    for (d, t) in words_mut(&mut d).iter_mut().zip(words(then)) {
        *d = d.checked_sub(*t)?;
    }
    Some(d)
}

/// Implements [`Counters`] word by word for structs that are only `u64` counters.
macro_rules! all_u64_counters {
    ($($t:ty),* $(,)?) => {$(all_u64_counters!($t => <$t>::ZERO);)*};
    ($t:ty => $zero:expr) => {
        // SAFETY: each listed type is a #[repr(C)] struct of u64 fields and u64 arrays only (see
        // the layout tests in stormwatch-common and `all_u64_types_are_only_words` below).
        unsafe impl AllU64 for $t {}
        impl Counters for $t {
            const ZERO: Self = $zero;
            fn add(&mut self, other: &Self) {
                add_words(self, other);
            }
            fn since(&self, then: &Self) -> Option<Self> {
                since_words(self, then)
            }
        }
    };
}

all_u64_counters!(
    Log2Histogram,
    SchedStats,
    FutexStats,
    LockStats,
    CgroupNetStats,
    NetDirStats,
    RunqBlameValue,
);

all_u64_counters!(NetDropStats => NetDropStats { packets: 0 });

all_u64_counters!(GoMutexFigures);

all_u64_counters!(PgLockWaits => PgLockWaits { waits: 0, wait_ns: 0 });

/// A cgroup's Go `sync.Mutex` contention as its uprobes counted it (`probes::gomutex`), in
/// bursts: the entries of the mutex's slow paths while they were attached, and for how long.
/// Cumulative like every counter here; a window's are rates over its `probed_ns`, never totals
/// of the window.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GoMutexFigures {
    /// How long the uprobes were attached while the cgroup had Go mutex contention on record
    /// (every burst since its first contended `Lock`).
    pub probed_ns: u64,
    /// `Lock` calls that found the mutex held (`lockSlow`).
    pub contended_locks: u64,
    /// `Unlock` calls that had waiters (or flags) to hand on (`unlockSlow`).
    pub handing_unlocks: u64,
    /// On-CPU samples of the cgroup's Go processes whose clocks are read, all the time (not in
    /// bursts: `probes::gocpu`), and those of them in the mutex's code.
    pub cpu_samples: u64,
    pub mutex_cpu_samples: u64,
}

impl GoMutexFigures {
    pub const ZERO: Self = Self {
        probed_ns: 0,
        contended_locks: 0,
        handing_unlocks: 0,
        cpu_samples: 0,
        mutex_cpu_samples: 0,
    };

    /// The share of the on-CPU samples in the mutex's code, with the samples it is of; `None`
    /// without samples.
    pub fn mutex_cpu_share(&self) -> Option<(f64, u64)> {
        (self.cpu_samples > 0).then(|| {
            (
                self.mutex_cpu_samples as f64 / self.cpu_samples as f64,
                self.cpu_samples,
            )
        })
    }

    /// Contended `Lock` calls per second of the time the uprobes were attached.
    pub fn contended_locks_per_second(&self) -> Option<f64> {
        (self.probed_ns > 0).then(|| self.contended_locks as f64 * 1e9 / self.probed_ns as f64)
    }

    /// Handing `Unlock` calls per second of the time the uprobes were attached.
    pub fn handing_unlocks_per_second(&self) -> Option<f64> {
        (self.probed_ns > 0).then(|| self.handing_unlocks as f64 * 1e9 / self.probed_ns as f64)
    }
}

/// `max_wait_ns` is a maximum since attach, not a counter: a window carries the latest. `comm`
/// is the first waiter's name.
/// A thread's hand-off counters; its cgroup and process are the latest ones, not counters.
impl Counters for ThreadHandoff {
    const ZERO: Self = ThreadHandoff::ZERO;
    fn add(&mut self, o: &Self) {
        let ThreadHandoff {
            cgroup_id,
            woken_waits,
            woken_wait_ns,
            wakes,
            relay_waits,
            relay_wait_ns,
            tgid,
            _pad,
        } = *o;
        self.woken_waits += woken_waits;
        self.woken_wait_ns += woken_wait_ns;
        self.wakes += wakes;
        self.relay_waits += relay_waits;
        self.relay_wait_ns += relay_wait_ns;
        if cgroup_id != 0 {
            self.cgroup_id = cgroup_id;
            self.tgid = tgid;
        }
    }
    fn since(&self, t: &Self) -> Option<Self> {
        Some(ThreadHandoff {
            woken_waits: self.woken_waits.checked_sub(t.woken_waits)?,
            woken_wait_ns: self.woken_wait_ns.checked_sub(t.woken_wait_ns)?,
            wakes: self.wakes.checked_sub(t.wakes)?,
            relay_waits: self.relay_waits.checked_sub(t.relay_waits)?,
            relay_wait_ns: self.relay_wait_ns.checked_sub(t.relay_wait_ns)?,
            ..*self
        })
    }
}

/// `tid` and `shared` are properties of the word, not counters: added (across CPUs), a word
/// is shared when either side is, or when different threads made the two sides' entries.
impl Counters for HotFutexValue {
    const ZERO: Self = HotFutexValue::ZERO;
    fn add(&mut self, o: &Self) {
        self.waits += o.waits;
        self.wait_ns += o.wait_ns;
        self.max_wait_ns = self.max_wait_ns.max(o.max_wait_ns);
        if self.comm[0] == 0 {
            self.comm = o.comm;
        }
        if self.tid != 0 && o.tid != 0 && self.tid != o.tid {
            self.shared = 1;
        }
        self.shared |= o.shared;
        if self.tid == 0 {
            self.tid = o.tid;
        }
    }
    fn since(&self, t: &Self) -> Option<Self> {
        Some(HotFutexValue {
            waits: self.waits.checked_sub(t.waits)?,
            wait_ns: self.wait_ns.checked_sub(t.wait_ns)?,
            ..*self
        })
    }
}

/// As for [`HotFutexValue`], `max_wait_ns` is a maximum since attach.
impl Counters for LockSiteValue {
    const ZERO: Self = LockSiteValue {
        count: 0,
        wait_ns: 0,
        max_wait_ns: 0,
    };
    fn add(&mut self, o: &Self) {
        self.count += o.count;
        self.wait_ns += o.wait_ns;
        self.max_wait_ns = self.max_wait_ns.max(o.max_wait_ns);
    }
    fn since(&self, t: &Self) -> Option<Self> {
        Some(LockSiteValue {
            count: self.count.checked_sub(t.count)?,
            wait_ns: self.wait_ns.checked_sub(t.wait_ns)?,
            max_wait_ns: self.max_wait_ns,
        })
    }
}

/// `mtu` is the MTU at the latest packet, not a counter: a window carries the latest (a
/// non-zero one: CPUs that never saw the interface hold 0).
impl Counters for NetIfStats {
    const ZERO: Self = NetIfStats::ZERO;
    fn add(&mut self, o: &Self) {
        self.tx.add(&o.tx);
        self.rx.add(&o.rx);
        if o.mtu != 0 {
            self.mtu = o.mtu;
        }
    }
    fn since(&self, t: &Self) -> Option<Self> {
        Some(NetIfStats {
            tx: self.tx.since(&t.tx)?,
            rx: self.rx.since(&t.rx)?,
            mtu: self.mtu,
            _pad: 0,
        })
    }
}

/// What the agent itself dropped or forgot, beside the kernel's lost-event counters. Counted
/// process-wide and reported with them (`lost_events`, `stormwatch_lost_events_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UserLoss {
    /// A key's counters went backwards between two snapshots without the agent having removed
    /// it: that key's change in that window is unknown, and is skipped rather than guessed.
    CounterRegression,
    /// Hot-futex entries deleted because no wait touched them for many windows (their figures
    /// were reported while they moved; this keeps the bounded map from filling with old words).
    HotFutexIdleEvicted,
    /// Contended call sites deleted because idle for many windows (as above).
    LockSiteIdleEvicted,
}

impl UserLoss {
    pub const ALL: [UserLoss; 3] = [
        Self::CounterRegression,
        Self::HotFutexIdleEvicted,
        Self::LockSiteIdleEvicted,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Self::CounterRegression => "counter_regression",
            Self::HotFutexIdleEvicted => "hot_futex_idle_evicted",
            Self::LockSiteIdleEvicted => "lock_site_idle_evicted",
        }
    }

    fn counter(self) -> &'static AtomicU64 {
        static COUNTS: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];
        &COUNTS[self as usize]
    }

    pub fn add(self, n: u64) {
        self.counter().fetch_add(n, Ordering::Relaxed);
    }

    pub fn total(self) -> u64 {
        self.counter().load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_mutex_figures_add_up_and_rate_over_the_probed_time() {
        let mut a = GoMutexFigures {
            probed_ns: 100_000_000,
            contended_locks: 300,
            handing_unlocks: 600,
            cpu_samples: 900,
            mutex_cpu_samples: 90,
        };
        let b = GoMutexFigures {
            probed_ns: 100_000_000,
            contended_locks: 100,
            handing_unlocks: 200,
            cpu_samples: 100,
            mutex_cpu_samples: 60,
        };
        a.add(&b);
        assert_eq!(a.contended_locks, 400);
        assert_eq!(a.contended_locks_per_second(), Some(2000.0));
        assert_eq!(a.handing_unlocks_per_second(), Some(4000.0));
        // The sampler's share is of all the samples added: 150 of 1,000.
        assert_eq!(a.mutex_cpu_share(), Some((0.15, 1000)));
        assert_eq!(
            a.since(&b),
            Some(GoMutexFigures {
                probed_ns: 100_000_000,
                contended_locks: 300,
                handing_unlocks: 600,
                cpu_samples: 900,
                mutex_cpu_samples: 90,
            })
        );
        assert_eq!(GoMutexFigures::ZERO.mutex_cpu_share(), None);
        // Never probed: no rate, rather than a rate of zero.
        assert_eq!(GoMutexFigures::ZERO.contended_locks_per_second(), None);
        // Probed and quiet: a rate of zero.
        let quiet = GoMutexFigures {
            probed_ns: 1,
            ..GoMutexFigures::ZERO
        };
        assert_eq!(quiet.contended_locks_per_second(), Some(0.0));
    }

    #[test]
    fn all_u64_types_are_only_words() {
        // A field that is not a u64 would make the size differ from the words counted by hand.
        assert_eq!(words(&SchedStats::ZERO).len(), 5 + 3 * (2 + 32));
        assert_eq!(words(&LockStats::ZERO).len(), 2 * 7);
        assert_eq!(words(&FutexStats::ZERO).len(), 6 + 2 + 32);
        assert_eq!(words(&GoMutexFigures::ZERO).len(), 5);
    }

    #[test]
    fn add_and_since_are_word_by_word() {
        let mut a = SchedStats::ZERO;
        a.voluntary_switches = 5;
        a.runq.record(1000);
        a.wake_remote.record(7);
        let mut b = a;
        b.add(&a);
        assert_eq!(b.voluntary_switches, 10);
        assert_eq!(b.runq.count, 2);
        assert_eq!(b.wake_remote.sum_ns, 14);
        assert_eq!(b.since(&a), Some(a));
        assert_eq!(a.since(&a), Some(SchedStats::ZERO));
    }

    #[test]
    fn any_word_going_backwards_is_a_regression() {
        let mut a = LockStats::ZERO;
        a.count[3] = 4;
        let mut b = a;
        b.wait_ns[6] = 9;
        assert!(b.since(&a).is_some());
        b.count[3] = 3;
        assert_eq!(b.since(&a), None);
    }

    #[test]
    fn maxima_and_names_are_not_summed() {
        let a = LockSiteValue {
            count: 2,
            wait_ns: 10,
            max_wait_ns: 8,
        };
        let mut b = a;
        b.add(&a);
        assert_eq!((b.count, b.wait_ns, b.max_wait_ns), (4, 20, 8));
        assert_eq!(b.since(&a).map(|d| (d.count, d.max_wait_ns)), Some((2, 8)));
    }

    #[test]
    fn a_word_is_shared_when_two_threads_waited_on_it_on_any_cpus() {
        let on = |tid, shared| HotFutexValue {
            waits: 1,
            wait_ns: 5,
            tid,
            shared,
            ..HotFutexValue::ZERO
        };
        // Per CPU: the same thread on two CPUs (and a CPU without the word) is one waiter.
        let mut one = HotFutexValue::ZERO;
        for v in [on(7, 0), HotFutexValue::ZERO, on(7, 0)] {
            one.add(&v);
        }
        assert_eq!((one.waits, one.tid, one.shared), (2, 7, 0));
        // Two threads, each alone on its CPU; or a CPU that saw two.
        let mut two = on(7, 0);
        two.add(&on(8, 0));
        assert_eq!(two.shared, 1);
        let mut seen = on(7, 0);
        seen.add(&on(7, 1));
        assert_eq!(seen.shared, 1);
        // A window's change keeps what the word is.
        assert_eq!(
            two.since(&on(7, 0)).map(|d| (d.waits, d.shared)),
            Some((1, 1))
        );
    }

    #[test]
    fn a_threads_handed_on_waits_are_counters() {
        let a = ThreadHandoff {
            woken_waits: 3,
            relay_waits: 2,
            relay_wait_ns: 40,
            ..ThreadHandoff::ZERO
        };
        let mut b = a;
        b.add(&a);
        assert_eq!((b.relay_waits, b.relay_wait_ns), (4, 80));
        assert_eq!(b.since(&a).map(|d| d.relay_wait_ns), Some(40));
        b.relay_waits = 1;
        assert_eq!(b.since(&a), None);
    }
}
