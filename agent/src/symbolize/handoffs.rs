//! The call sites of sampled hand-offs: the two sides of each (the wake that let the lock go and
//! the wait it ended) paired by their sample id, each side's stack named
//! ([`super::user::UserSymbolizer`]), and the pairs counted per cgroup by (waiter site, waker
//! site), with why each hand-off was slow: the waiter's time from the wake to its return, whether
//! it returned on another CPU than the wake ran on, and what the holder did while it held on.
//!
//! The figures are of *sampled* hand-offs (see `ebpf-probes/kernel/src/handoff.rs`: at most a
//! budget of wakes a second on the node): shares and means, never totals of the cgroup's
//! hand-offs, which the futex counters give exactly.
//!
//! Go's `sync.Mutex` ([`GoMutexSites`]) comes through the same ring buffer: samples of its slow
//! paths' entries (uprobes, `ebpf-probes/kernel/src/gomutex.rs`), one side each, not paired,
//! named as the code that called `Lock` or `Unlock`; its counts are added by the pipeline.

use std::{
    collections::{BTreeSet, HashMap},
    time::{Duration, Instant},
};

use serde::Serialize;
use stormwatch_common::{HandoffHead, HandoffSample, handoff_side};

use super::{
    stacks::{Holder, LockStacks, Side, StackValues},
    user::{Frame, StackSample, UserSite, UserSymbolizer, WaitKind, wait_kind},
};
use crate::memory::CacheSize;

/// One side of a sampled hand-off, as read from the ring buffer: its header as the kernel wrote
/// it, and its stack cut to what was read.
#[derive(Clone, Debug)]
pub struct HandoffSide {
    pub head: HandoffHead,
    pub stack: Vec<u8>,
}

impl From<&HandoffSample> for HandoffSide {
    fn from(s: &HandoffSample) -> Self {
        let len = (s.head.stack_len as usize).min(s.stack.len());
        Self {
            head: s.head,
            stack: s.stack[..len].to_vec(),
        }
    }
}

/// Figures of the sampled hand-offs between one waiter site and one waker site.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PairStats {
    /// Sampled hand-offs.
    pub handoffs: u64,
    /// The waiters' waits, summed.
    pub wait_ns: u64,
    /// From each wake to its waiter's return (the wake-up and the waiter's wait for a CPU),
    /// summed.
    pub wake_to_return_ns: u64,
    /// Hand-offs whose waiter returned on another CPU than the wake ran on.
    pub crossed_cpus: u64,
    /// Hand-offs whose holder's hold is known (it was handed the lock by a wake: it returned
    /// from a woken wait since its previous wake).
    pub holds: u64,
    /// Those holds' time, summed, and the part of it the holder spent runnable without a CPU
    /// (preempted, or its cgroup throttled).
    pub hold_ns: u64,
    pub hold_run_delay_ns: u64,
    /// Holds during which the holder was switched out: involuntarily (preempted or throttled),
    /// or because it slept (blocked) while it held on.
    pub holds_preempted: u64,
    pub holds_asleep: u64,
    /// Holds during which it was switched out at all (either way).
    pub holds_off_cpu: u64,
}

impl PairStats {
    pub fn add(&mut self, o: &Self) {
        self.handoffs += o.handoffs;
        self.wait_ns += o.wait_ns;
        self.wake_to_return_ns += o.wake_to_return_ns;
        self.crossed_cpus += o.crossed_cpus;
        self.holds += o.holds;
        self.hold_ns += o.hold_ns;
        self.hold_run_delay_ns += o.hold_run_delay_ns;
        self.holds_preempted += o.holds_preempted;
        self.holds_asleep += o.holds_asleep;
        self.holds_off_cpu += o.holds_off_cpu;
    }

    fn of(waker: &HandoffSide, waiter: &HandoffSide) -> Self {
        let (waker, waiter) = (&waker.head, &waiter.head);
        let hold = waker.hold_ns > 0;
        let preempted = hold && waker.hold_nivcsw > 0;
        let asleep = hold && waker.hold_nvcsw > 0;
        Self {
            handoffs: 1,
            wait_ns: waiter.wait_ns,
            wake_to_return_ns: waiter.wake_to_return_ns,
            crossed_cpus: u64::from(waiter.cpu != waiter.waker_cpu),
            holds: u64::from(hold),
            hold_ns: if hold { waker.hold_ns } else { 0 },
            hold_run_delay_ns: if hold { waker.hold_run_delay_ns } else { 0 },
            holds_preempted: u64::from(preempted),
            holds_asleep: u64::from(asleep),
            holds_off_cpu: u64::from(preempted || asleep),
        }
    }

    /// The mean of a summed time over the hand-offs (or the holds), in seconds.
    pub fn mean_s(sum_ns: u64, n: u64) -> Option<f64> {
        (n > 0).then(|| sum_ns as f64 / n as f64 / 1e9)
    }

    pub fn share(part: u64, n: u64) -> Option<f64> {
        (n > 0).then(|| part as f64 / n as f64)
    }
}

/// The code that entered a cgroup's Go `sync.Mutex` slow paths (`ebpf-probes/kernel/src/gomutex.rs`),
/// by the samples of the uprobes' bursts (`agent/src/probes/gomutex.rs`): names, not figures
/// (the counts of the entries are the window's, [`crate::counters::GoMutexFigures`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GoMutexSites {
    /// Sampled entries of `lockSlow`, by the site that called `Lock`.
    pub lock_sites: HashMap<UserSite, u64>,
    /// Sampled entries of `unlockSlow`, by the site that called `Unlock`.
    pub unlock_sites: HashMap<UserSite, u64>,
}

impl GoMutexSites {
    pub fn add(&mut self, o: &Self) {
        for (k, v) in &o.lock_sites {
            *self.lock_sites.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &o.unlock_sites {
            *self.unlock_sites.entry(k.clone()).or_default() += v;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.lock_sites.is_empty() && self.unlock_sites.is_empty()
    }

    /// The `n` sites with the most samples (ties by name), with the samples of all sites.
    pub fn top(sites: &HashMap<UserSite, u64>, n: usize) -> (Vec<(&UserSite, u64)>, u64) {
        let mut all: Vec<_> = sites.iter().map(|(k, v)| (k, *v)).collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        all.truncate(n);
        (all, sites.values().sum())
    }
}

/// A cgroup's sampled hand-offs by (waiter site, waker site).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HandoffSites {
    pub pairs: HashMap<(UserSite, UserSite), PairStats>,
    /// What would name the sites that have no name (a flag, a perf map).
    pub hints: BTreeSet<String>,
    /// Go's `sync.Mutex`, where its uprobes are attached.
    pub go_mutex: GoMutexSites,
    /// The sampled sides' whole stacks, for lock profiles.
    pub stacks: LockStacks,
}

impl HandoffSites {
    pub fn add(&mut self, other: &Self) {
        for (k, v) in &other.pairs {
            self.pairs.entry(k.clone()).or_default().add(v);
        }
        self.hints.extend(other.hints.iter().cloned());
        self.go_mutex.add(&other.go_mutex);
        self.stacks.add(&other.stacks);
    }

    /// All sampled hand-offs of the cgroup.
    pub fn total(&self) -> PairStats {
        let mut t = PairStats::default();
        for v in self.pairs.values() {
            t.add(v);
        }
        t
    }

    /// The `n` pairs with the most sampled hand-offs (ties by name, for a stable order).
    pub fn top(&self, n: usize) -> Vec<(&(UserSite, UserSite), &PairStats)> {
        let mut all: Vec<_> = self.pairs.iter().collect();
        all.sort_by(|a, b| b.1.handoffs.cmp(&a.1.handoffs).then_with(|| a.0.cmp(b.0)));
        all.truncate(n);
        all
    }

    /// The sampled hand-offs whose waiter waited for a lock, and those whose waiter waited for
    /// a condition (work, a signal), by the machinery it waited in ([`wait_kind`]); hand-offs
    /// whose waiter's machinery says neither are in neither.
    pub fn by_wait_kind(&self) -> (u64, u64) {
        let (mut lock, mut condition) = (0, 0);
        for ((waiter, _), v) in &self.pairs {
            match waiter.lock_function.as_deref().and_then(wait_kind) {
                Some(WaitKind::Lock) => lock += v.handoffs,
                Some(WaitKind::Condition) => condition += v.handoffs,
                None => {}
            }
        }
        (lock, condition)
    }

    /// The waiter sites with the most sampled hand-offs, over every waker site.
    pub fn top_waiters(&self, n: usize) -> Vec<(&UserSite, PairStats)> {
        let mut by: HashMap<&UserSite, PairStats> = HashMap::new();
        for ((waiter, _), v) in &self.pairs {
            by.entry(waiter).or_default().add(v);
        }
        let mut all: Vec<_> = by.into_iter().collect();
        all.sort_by(|a, b| b.1.handoffs.cmp(&a.1.handoffs).then_with(|| a.0.cmp(b.0)));
        all.truncate(n);
        all
    }
}

/// Why a side whose stack the kernel could not read has no site.
const UNREADABLE_STACK: &str = "its stack could not be read";

/// How long one side waits for the other before it is dropped (the two are written at their
/// own threads' exits, usually microseconds apart).
const PAIR_WAIT: Duration = Duration::from_secs(5);
/// The most sides kept waiting for their other side: about four times what the sampler's
/// budget (100 wakes a second on the node) leaves waiting over `PAIR_WAIT`; past it, the oldest
/// are dropped (counted as unpaired).
pub const MAX_PENDING: usize = 2048;

/// Pairs the sides of sampled hand-offs and names their sites.
#[derive(Default)]
pub struct HandoffNamer {
    symbolizer: UserSymbolizer,
    pending: HashMap<u64, (HandoffSide, Instant)>,
    /// Wakes whose waiter never came (a waiter that timed out, or the sample lost).
    pub unpaired: u64,
}

impl HandoffNamer {
    /// `lines`: name each site's `file:line` too (from DWARF).
    pub fn new(lines: bool) -> Self {
        Self {
            symbolizer: UserSymbolizer::new(lines),
            ..Self::default()
        }
    }

    /// Names the pairs completed by `sides`; returns each cgroup's sampled hand-offs.
    pub fn name(&mut self, sides: Vec<HandoffSide>) -> HashMap<u64, HandoffSites> {
        let mut out: HashMap<u64, HandoffSites> = HashMap::new();
        let now = Instant::now();
        for side in sides {
            let kind = side.head.side;
            if kind == handoff_side::GO_LOCK || kind == handoff_side::GO_UNLOCK {
                let (site, hint, frames) = self.go_site_of(&side);
                let sites = out.entry(side.head.cgroup_id).or_default();
                sites.hints.extend(hint);
                let (by, stack_side, v) = if kind == handoff_side::GO_LOCK {
                    let v = StackValues {
                        go_contended_locks: 1,
                        ..StackValues::default()
                    };
                    (&mut sites.go_mutex.lock_sites, Side::Waiter, v)
                } else {
                    let v = StackValues {
                        go_handing_unlocks: 1,
                        ..StackValues::default()
                    };
                    (&mut sites.go_mutex.unlock_sites, Side::Waker, v)
                };
                sites.stacks.record(stack_side, &site, &frames, None, v);
                *by.entry(site).or_default() += 1;
                continue;
            }
            let Some((other, _)) = self.pending.remove(&side.head.sample_id) else {
                self.pending.insert(side.head.sample_id, (side, now));
                continue;
            };
            let (waker, waiter) = if kind == handoff_side::WAKER {
                (side, other)
            } else {
                (other, side)
            };
            if waker.head.side != handoff_side::WAKER || waiter.head.side != handoff_side::WAITER {
                continue;
            }
            let (waiter_site, waiter_hint, waiter_frames) = self.site_of(&waiter);
            let (waker_site, waker_hint, waker_frames) = self.site_of(&waker);
            let sites = out.entry(waiter.head.cgroup_id).or_default();
            sites.hints.extend(waiter_hint);
            sites.hints.extend(waker_hint);
            let stats = PairStats::of(&waker, &waiter);
            let holder = Holder::of(
                stats.holds > 0,
                stats.holds_preempted > 0,
                stats.holds_asleep > 0,
            );
            let wait_ns = waiter.head.wait_ns;
            sites.stacks.record(
                Side::Waiter,
                &waiter_site,
                &waiter_frames,
                holder,
                StackValues {
                    waits: 1,
                    wait_ns,
                    ..StackValues::default()
                },
            );
            sites.stacks.record(
                Side::Waker,
                &waker_site,
                &waker_frames,
                holder,
                StackValues {
                    wakes: 1,
                    woken_wait_ns: wait_ns,
                    ..StackValues::default()
                },
            );
            sites
                .pairs
                .entry((waiter_site, waker_site))
                .or_default()
                .add(&stats);
        }
        let before = self.pending.len();
        self.pending
            .retain(|_, (_, at)| now.duration_since(*at) < PAIR_WAIT);
        if self.pending.len() > MAX_PENDING {
            let mut by_age: Vec<(Instant, u64)> = self
                .pending
                .iter()
                .map(|(id, (_, at))| (*at, *id))
                .collect();
            by_age.sort_unstable();
            for (_, id) in &by_age[..self.pending.len() - MAX_PENDING] {
                self.pending.remove(id);
            }
        }
        self.unpaired += (before - self.pending.len()) as u64;
        out
    }

    fn site_of(&mut self, side: &HandoffSide) -> (UserSite, Option<String>, Vec<Frame>) {
        if side.stack.is_empty() {
            return (UserSite::unnamed(UNREADABLE_STACK), None, Vec::new());
        }
        self.symbolizer.site_and_stack(&StackSample {
            tgid: side.head.tgid,
            ip: side.head.ip,
            sp: side.head.sp,
            bp: side.head.bp,
            stack: &side.stack,
        })
    }

    /// The site of a Go mutex slow path's entry: the uprobe stopped at the function's first
    /// instruction, before its frame is made, so the caller's return address is on top of the
    /// stack and the frame pointer is still the caller's. The walk starts in the caller (at the
    /// call instruction, so that its line is the call's), and the site is named as the code
    /// that called `Lock` (or `Unlock`): Go inlines those into it.
    fn go_site_of(&mut self, side: &HandoffSide) -> (UserSite, Option<String>, Vec<Frame>) {
        let Some(ret) = side
            .stack
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        else {
            return (UserSite::unnamed(UNREADABLE_STACK), None, Vec::new());
        };
        let (mut site, hint, frames) = self.symbolizer.site_and_stack(&StackSample {
            tgid: side.head.tgid,
            ip: ret.saturating_sub(1),
            sp: side.head.sp + 8,
            bp: side.head.bp,
            stack: &side.stack[8..],
        });
        if site.function.is_some() {
            site.lock_function = Some(
                if side.head.side == handoff_side::GO_LOCK {
                    "sync.(*Mutex).Lock"
                } else {
                    "sync.(*Mutex).Unlock"
                }
                .to_owned(),
            );
        }
        (site, hint, frames)
    }

    /// Forgets what it read of processes that are gone.
    pub fn retain_processes(&mut self, live: impl Fn(u32) -> bool) {
        self.symbolizer.retain(live);
    }

    /// The sizes of its caches (the symbolizer's, and the sides waiting for a pair).
    pub fn cache_sizes(&self) -> Vec<CacheSize> {
        let mut sizes = self.symbolizer.cache_sizes().to_vec();
        sizes.push(CacheSize {
            name: "handoff_sides_pending",
            entries: self.pending.len() as u64,
            max_entries: Some(MAX_PENDING as u64),
            bytes: Some(
                self.pending
                    .values()
                    .map(|(s, _)| s.stack.len() as u64)
                    .sum(),
            ),
            max_bytes: None,
        });
        sizes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(f: &str) -> UserSite {
        UserSite {
            function: Some(f.into()),
            lock_function: None,
            location: None,
            module: None,
            unnamed: None,
        }
    }

    #[test]
    fn go_mutex_sites_add_up_and_the_top_ones_lead() {
        let mut a = GoMutexSites::default();
        a.lock_sites.insert(site("main.a"), 3);
        let mut b = GoMutexSites::default();
        b.lock_sites.insert(site("main.a"), 1);
        b.lock_sites.insert(site("main.b"), 2);
        b.unlock_sites.insert(site("main.a"), 5);
        a.add(&b);
        let (top, all) = GoMutexSites::top(&a.lock_sites, 1);
        assert_eq!((top, all), (vec![(&site("main.a"), 4)], 6));
        assert_eq!(a.unlock_sites[&site("main.a")], 5);
        assert!(GoMutexSites::default().is_empty());
        assert!(!a.is_empty());
    }

    #[test]
    fn a_side_keeps_the_samples_head_and_the_stack_read() {
        let mut sample = HandoffSample {
            head: HandoffHead {
                sample_id: 3,
                cgroup_id: 7,
                tgid: 10,
                tid: 11,
                side: handoff_side::WAITER,
                wait_ns: 5,
                sp: 0x7000,
                stack_len: 16,
                ..HandoffHead::default()
            },
            stack: [0xab; stormwatch_common::HANDOFF_STACK_BYTES],
        };
        let side = HandoffSide::from(&sample);
        assert_eq!(side.head, sample.head);
        assert_eq!(side.stack, vec![0xab; 16]);
        // A length past the buffer (never written so) is cut to the buffer.
        sample.head.stack_len = u32::MAX;
        let side = HandoffSide::from(&sample);
        assert_eq!(side.stack.len(), stormwatch_common::HANDOFF_STACK_BYTES);
    }

    #[test]
    fn go_mutex_samples_are_counted_by_side_not_paired() {
        let mut namer = HandoffNamer::new(false);
        let side = |kind: u32| HandoffSide {
            head: HandoffHead {
                cgroup_id: 7,
                // Not a live process: the site is unnamed, and says why.
                tgid: u32::MAX,
                tid: u32::MAX,
                side: kind,
                ip: 0x1000,
                sp: 0x7000,
                ..HandoffHead::default()
            },
            stack: 0x401000u64.to_le_bytes().repeat(4),
        };
        let out = namer.name(vec![
            side(handoff_side::GO_LOCK),
            side(handoff_side::GO_LOCK),
            side(handoff_side::GO_UNLOCK),
        ]);
        let go = &out[&7].go_mutex;
        assert_eq!(go.lock_sites.values().sum::<u64>(), 2);
        assert_eq!(go.unlock_sites.values().sum::<u64>(), 1);
        assert!(out[&7].pairs.is_empty(), "nothing paired");
        assert_eq!(namer.pending.len(), 0, "nothing left waiting for a pair");
        let unnamed = go.lock_sites.keys().next().unwrap();
        assert!(unnamed.function.is_none() && unnamed.unnamed.is_some());
    }
}
