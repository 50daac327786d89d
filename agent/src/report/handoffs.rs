//! The user call sites of a container's sampled futex hand-offs, as `trace --json` shows them:
//! the (waiter site, waker site) pairs with the most sampled hand-offs, and why the hand-offs
//! were slow — the waiter's time from the wake to its return, wake-ups across CPUs, and what the
//! lock's holder did while it held on.

use serde::Serialize;

use crate::collect::GoMutexFigures;
use crate::symbolize::{
    handoffs::{GoMutexSites, HandoffSites, PairStats},
    user::UserSite,
};

use super::TOP_N;

/// Why a set of sampled hand-offs was slow. Means and shares of the sampled hand-offs; `null`
/// where there were none (or no hold on record).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SlowHandoffs {
    /// The waiters' mean wait.
    pub wait_mean_seconds: Option<f64>,
    /// From the wake to the waiter's return from its wait: its wake-up and its wait for a CPU.
    pub wake_to_return_mean_seconds: Option<f64>,
    /// The share whose waiter returned on another CPU than the wake ran on.
    pub crossed_cpu_share: Option<f64>,
    /// Hand-offs whose holder's hold is on record (it had been handed the lock by a wake).
    pub holds: u64,
    /// The holders' mean hold, from their own return from a woken wait to their wake.
    pub hold_mean_seconds: Option<f64>,
    /// The share of holds during which the holder was switched out: at all, involuntarily
    /// (preempted, or its cgroup throttled), or to sleep.
    pub holder_off_cpu_share: Option<f64>,
    pub holder_preempted_share: Option<f64>,
    pub holder_asleep_share: Option<f64>,
    /// The share of the holds' time the holders spent runnable without a CPU.
    pub holder_runnable_share: Option<f64>,
}

impl SlowHandoffs {
    pub fn of(s: &PairStats) -> Self {
        Self {
            wait_mean_seconds: PairStats::mean_s(s.wait_ns, s.handoffs),
            wake_to_return_mean_seconds: PairStats::mean_s(s.wake_to_return_ns, s.handoffs),
            crossed_cpu_share: PairStats::share(s.crossed_cpus, s.handoffs),
            holds: s.holds,
            hold_mean_seconds: PairStats::mean_s(s.hold_ns, s.holds),
            holder_off_cpu_share: PairStats::share(s.holds_off_cpu, s.holds),
            holder_preempted_share: PairStats::share(s.holds_preempted, s.holds),
            holder_asleep_share: PairStats::share(s.holds_asleep, s.holds),
            holder_runnable_share: (s.hold_ns > 0)
                .then(|| (s.hold_run_delay_ns as f64 / s.hold_ns as f64).min(1.0)),
        }
    }
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct HandoffPair {
    /// Where the waiter waited for the lock.
    pub waiter: UserSite,
    /// Where the waker let it go.
    pub waker: UserSite,
    pub sampled_handoffs: u64,
    /// Of the container's sampled hand-offs.
    pub share: f64,
    #[serde(flatten)]
    pub slow: SlowHandoffs,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LockCallSites {
    /// Hand-offs sampled in the window (a sample of them, not their count: the futex figures
    /// count them all).
    pub sampled_handoffs: u64,
    /// Over all of them.
    #[serde(flatten)]
    pub slow: SlowHandoffs,
    /// The pairs with the most sampled hand-offs, most first.
    pub pairs: Vec<HandoffPair>,
    /// What would name the sites that have no name.
    pub hints: Vec<String>,
    /// Go's `sync.Mutex` (goroutines wait for it in Go's scheduler, not in futex waits): where
    /// its uprobes are attached and it was contended.
    pub go_mutex: Option<GoMutexReport>,
}

/// A site of Go mutex slow-path entries, with its share of the sampled ones.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct GoMutexSite {
    pub site: UserSite,
    pub sampled: u64,
    pub share: f64,
}

/// A container's Go `sync.Mutex` contention over the time in the window the uprobes were
/// attached (short bursts: `agent/src/probes/gomutex.rs`).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct GoMutexReport {
    /// How long the uprobes were attached.
    pub probed_seconds: f64,
    /// `Lock` calls that found the mutex held (entries of its `lockSlow`: the goroutine spins,
    /// then parks), all of them in that time, and per second of it.
    pub contended_locks: u64,
    pub contended_locks_per_second: Option<f64>,
    /// `Unlock` calls that found waiters to hand on (entries of `unlockSlow`), likewise.
    pub handing_unlocks: u64,
    pub handing_unlocks_per_second: Option<f64>,
    /// The code that called `Lock` on a held mutex, most sampled first (a sample of the calls).
    pub lock_sites: Vec<GoMutexSite>,
    /// The code that called `Unlock` with waiters, likewise.
    pub unlock_sites: Vec<GoMutexSite>,
}

impl GoMutexReport {
    /// The uprobes' figures of the window with the code its samples named; `None` where they
    /// never watched the container (nothing probed, nothing sampled).
    pub fn of(figures: GoMutexFigures, g: &GoMutexSites) -> Option<Self> {
        if figures.probed_ns == 0 && g.is_empty() {
            return None;
        }
        let sites = |by| {
            let (top, all) = GoMutexSites::top(by, TOP_N);
            top.into_iter()
                .map(|(site, n)| GoMutexSite {
                    site: site.clone(),
                    sampled: n,
                    share: n as f64 / all.max(1) as f64,
                })
                .collect()
        };
        Some(Self {
            probed_seconds: figures.probed_ns as f64 / 1e9,
            contended_locks: figures.contended_locks,
            contended_locks_per_second: figures.contended_locks_per_second(),
            handing_unlocks: figures.handing_unlocks,
            handing_unlocks_per_second: figures.handing_unlocks_per_second(),
            lock_sites: sites(&g.lock_sites),
            unlock_sites: sites(&g.unlock_sites),
        })
    }
}

/// The call sites of a container's sampled hand-offs, with its Go mutexes' figures over the
/// window (`go`) and their sampled code.
pub fn lock_call_sites(sites: Option<&HandoffSites>, go: GoMutexFigures) -> LockCallSites {
    let Some(sites) = sites else {
        return LockCallSites {
            sampled_handoffs: 0,
            slow: SlowHandoffs::of(&PairStats::default()),
            pairs: Vec::new(),
            hints: Vec::new(),
            go_mutex: GoMutexReport::of(go, &GoMutexSites::default()),
        };
    };
    let total = sites.total();
    LockCallSites {
        sampled_handoffs: total.handoffs,
        slow: SlowHandoffs::of(&total),
        pairs: sites
            .top(TOP_N)
            .into_iter()
            .map(|((waiter, waker), s)| HandoffPair {
                waiter: waiter.clone(),
                waker: waker.clone(),
                sampled_handoffs: s.handoffs,
                share: s.handoffs as f64 / total.handoffs.max(1) as f64,
                slow: SlowHandoffs::of(s),
            })
            .collect(),
        hints: sites.hints.iter().cloned().collect(),
        go_mutex: GoMutexReport::of(go, &sites.go_mutex),
    }
}
