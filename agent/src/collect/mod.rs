//! Collection: every interval, read the probes' maps into a [`Snapshot`] of cumulative
//! counters per cgroup id; the difference of two snapshots is a [`Window`]. `trace`, `diagnose`
//! and the exporter all read windows, never the maps, so their figures agree.

use std::{
    collections::HashMap,
    hash::Hash,
    time::{Duration, Instant},
};

use stormwatch_common::{
    FutexStats, HotFutexKey, HotFutexValue, LOG2_BUCKETS, LockSiteKey, LockSiteValue, LockStats,
    Log2Histogram, PgLockWaits, RunqBlameKey, RunqBlameValue, SchedStats, ThreadHandoff,
    net::{CgroupNetStats, NetDropKey, NetDropStats, NetIfKey, NetIfStats},
};

mod availability;

pub use self::availability::{Availability, NetAvailability, iface_key};
pub use crate::counters::{Counters, GoMutexFigures};
use crate::{
    counters::UserLoss,
    probes::{
        Families, GoMutexPart, Gone, Probes, ReadsPart as _, futex::FutexPart, locks::LockPart,
        net::NetPart, pglock::PgLockPart, sched::SchedPart,
    },
    symbolize::handoffs::HandoffSites,
};

/// Cumulative counters at one instant, one part per probe family (each family reads and
/// forgets its own: [`crate::probes::ReadsPart`]). Counters start at zero when the probes
/// attach, so a key seen for the first time contributes everything it has.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub taken_at: Instant,
    pub sched: SchedPart,
    pub futex: FutexPart,
    pub locks: LockPart,
    pub net: NetPart,
    pub go_mutex: GoMutexPart,
    pub pg_lock: PgLockPart,
}

impl Snapshot {
    pub fn empty(taken_at: Instant) -> Self {
        Self {
            taken_at,
            sched: SchedPart::default(),
            futex: FutexPart::default(),
            locks: LockPart::default(),
            net: NetPart::default(),
            go_mutex: GoMutexPart::default(),
            pg_lock: PgLockPart::default(),
        }
    }

    /// Each family's part. The scheduler's first: the instant is taken after it (its read is
    /// the longest: every cgroup's figures on every CPU).
    pub fn read(probes: &mut Probes) -> anyhow::Result<Self> {
        let (ebpf, families) = probes.families_mut();
        let Families {
            sched,
            futex,
            locks,
            net,
            go_mutex,
            pg_lock,
        } = families;
        let sched = sched.read(ebpf)?;
        Ok(Self {
            taken_at: Instant::now(),
            sched,
            futex: futex.read(ebpf)?,
            locks: locks.read(ebpf)?,
            net: net.read(ebpf)?,
            go_mutex: go_mutex.read(ebpf)?,
            pg_lock: pg_lock.read(ebpf)?,
        })
    }

    /// Drops a removed cgroup from every part, so that the next window does not subtract from
    /// it (what each family's forget does to its part, without the maps).
    pub fn forget_cgroup(&mut self, id: u64) {
        let Snapshot {
            taken_at: _,
            sched,
            futex,
            locks,
            net,
            go_mutex,
            pg_lock,
        } = self;
        sched.forget_cgroup(id);
        futex.forget_cgroup(id);
        locks.forget_cgroup(id);
        net.forget_cgroup(id);
        go_mutex.forget_cgroup(id);
        pg_lock.forget_cgroup(id);
    }

    /// Every cgroup id with figures.
    pub fn cgroup_ids(&self) -> impl Iterator<Item = &u64> {
        self.sched
            .cgroups
            .keys()
            .chain(self.futex.cgroups.keys())
            .chain(self.locks.cgroups.keys())
            .chain(self.net.cgroups.keys())
    }

    /// Forgets, in the probes' maps and in this (latest) snapshot alike, so that the next window
    /// counts a re-created entry from zero: the `gone` cgroups, the processes and threads that
    /// have exited, and what the bounded maps hold idle — each family its own
    /// ([`crate::probes::ReadsPart::forget`]). `moved`: the threads whose hand-off entry moved
    /// in the window that ended at this snapshot (alive, so not looked up).
    pub fn forget(&mut self, probes: &mut Probes, gone: &[u64], moved: impl Fn(u32) -> bool) {
        let gone = Gone {
            cgroups: gone,
            moved_thread: &moved,
        };
        let (ebpf, families) = probes.families_mut();
        let Families {
            sched,
            futex,
            locks,
            net,
            go_mutex,
            pg_lock,
        } = families;
        sched.forget(ebpf, &gone, &mut self.sched);
        locks.forget(ebpf, &gone, &mut self.locks);
        futex.forget(ebpf, &gone, &mut self.futex);
        go_mutex.forget(ebpf, &gone, &mut self.go_mutex);
        pg_lock.forget(ebpf, &gone, &mut self.pg_lock);
        net.forget(ebpf, &gone, &mut self.net);
    }
}

/// The figures of one cgroup over a window; each part is zero when nothing happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupWindow {
    pub sched: SchedStats,
    pub futex: FutexStats,
    pub locks: LockStats,
    pub net: CgroupNetStats,
    /// Its Go mutexes' contention, over the uprobes' bursts in the window.
    pub go_mutex: GoMutexFigures,
    /// Its PostgreSQL backends' heavyweight lock waits that ended in the window.
    pub pg_lock: PgLockWaits,
    /// The CPUs the cgroup's threads ran on in the window.
    pub cpus: CpuSet,
}

impl CgroupWindow {
    pub const ZERO: Self = Self {
        sched: SchedStats::ZERO,
        futex: FutexStats::ZERO,
        locks: LockStats::ZERO,
        net: CgroupNetStats::ZERO,
        go_mutex: GoMutexFigures::ZERO,
        pg_lock: <PgLockWaits as Counters>::ZERO,
        cpus: CpuSet::EMPTY,
    };

    /// Whether the cgroup's own threads did anything in the window (ran, switched, waited on a
    /// futex or a lock). A removed cgroup has no threads left, so it has none of these; network
    /// figures are left out, since a socket keeps the cgroup that created it (and a namespace's
    /// received traffic its owner) after that cgroup is removed.
    pub fn threads_moved(&self) -> bool {
        self.sched != SchedStats::ZERO
            || self.futex != FutexStats::ZERO
            || self.locks != LockStats::ZERO
    }

    /// Adds a later, adjacent window's figures of the same cgroup. Every field is named, so
    /// that a field added to the struct cannot be left out of the sum (the compiler asks for
    /// it here); [`Window`] and the exporter's totals both add through this.
    pub fn add(&mut self, later: &CgroupWindow) {
        let CgroupWindow {
            sched,
            futex,
            locks,
            net,
            go_mutex,
            pg_lock,
            cpus,
        } = later;
        self.sched.add(sched);
        self.futex.add(futex);
        self.locks.add(locks);
        self.net.add(net);
        self.go_mutex.add(go_mutex);
        Counters::add(&mut self.pg_lock, pg_lock);
        self.cpus.union(cpus);
    }

    /// Distinct CPUs the cgroup's threads ran on in the window.
    pub fn cpus_used(&self) -> u32 {
        self.cpus.len()
    }

    /// Wake-ups of the cgroup's threads whose kind is known (local + remote).
    pub fn wakeups(&self) -> u64 {
        self.sched.wake_local.count + self.sched.wake_remote.count
    }

    /// The share of wake-ups that came from another CPU than the one the thread was queued on,
    /// or `None` without wake-ups.
    pub fn remote_wakeup_share(&self) -> Option<f64> {
        let all = self.wakeups();
        (all > 0).then(|| self.sched.wake_remote.count as f64 / all as f64)
    }
}

/// A set of CPU numbers (up to [`CpuSet::MAX_CPUS`]; higher ones are not tracked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuSet([u64; 16]);

impl CpuSet {
    pub const MAX_CPUS: usize = 16 * 64;
    pub const EMPTY: Self = Self([0; 16]);

    pub fn insert(&mut self, cpu: usize) {
        if cpu < Self::MAX_CPUS {
            self.0[cpu / 64] |= 1 << (cpu % 64);
        }
    }

    pub fn union(&mut self, other: &Self) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a |= b;
        }
    }

    pub fn len(&self) -> u32 {
        self.0.iter().map(|w| w.count_ones()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Per cgroup, the CPUs whose on-CPU time for it moved between the snapshots.
fn cpus_used(before: &SchedPart, after: &SchedPart) -> Vec<(u64, CpuSet)> {
    after
        .oncpu_by_cpu
        .iter()
        .filter_map(|(id, now)| {
            let then = before.oncpu_by_cpu.get(id);
            let mut set = CpuSet::EMPTY;
            for (cpu, ns) in now.iter().enumerate() {
                let was = then.and_then(|t| t.get(cpu)).copied().unwrap_or(0);
                if *ns > was {
                    set.insert(cpu);
                }
            }
            (!set.is_empty()).then_some((*id, set))
        })
        .collect()
}

/// Per-key deltas between two snapshots, accumulated over one or more intervals.
#[derive(Clone, Debug)]
pub struct Window {
    pub duration: Duration,
    pub cgroups: HashMap<u64, CgroupWindow>,
    pub hot_futexes: HashMap<HotFutexKey, HotFutexValue>,
    pub lock_sites: HashMap<LockSiteKey, LockSiteValue>,
    /// Per thread id: its part in futex hand-offs in the window (threads with any).
    pub handoff_threads: HashMap<u32, ThreadHandoff>,
    /// Interfaces that handled packets in the window.
    pub net_ifaces: HashMap<NetIfKey, NetIfStats>,
    pub net_drops: HashMap<NetDropKey, NetDropStats>,
    /// Keys skipped because their counters went backwards (also counted process-wide as the
    /// `counter_regression` lost event).
    pub counter_regressions: u64,
    /// Per cgroup: the call sites of its sampled futex hand-offs (named by the pipeline).
    pub handoff_sites: HashMap<u64, HandoffSites>,
    /// Per (cgroup, process): its futex waits, and those on words only one of its threads
    /// waited on, from `hot_futexes` — kept by [`Window::extend_figures`], which drops the
    /// words themselves.
    pub process_words: HashMap<(u64, u32), WordWaits>,
    /// Run-queue waits by (victim, culprit) in the window, while blamed.
    pub runq_blame: HashMap<RunqBlameKey, RunqBlameValue>,
}

/// A process's futex waits over a window, and the part on words of one thread
/// ([`HotFutexValue::shared`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WordWaits {
    pub waits: u64,
    pub own_word_waits: u64,
}

impl WordWaits {
    fn add(&mut self, o: &Self) {
        self.waits += o.waits;
        self.own_word_waits += o.own_word_waits;
    }
}

/// Sums the waits of each process in `hot`.
pub(crate) fn process_words(
    hot: &HashMap<HotFutexKey, HotFutexValue>,
) -> HashMap<(u64, u32), WordWaits> {
    let mut by: HashMap<(u64, u32), WordWaits> = HashMap::new();
    for (k, v) in hot {
        by.entry((k.cgroup_id, k.tgid))
            .or_default()
            .add(&WordWaits {
                waits: v.waits,
                own_word_waits: if v.shared == 0 { v.waits } else { 0 },
            });
    }
    by
}

/// The non-zero changes of each key from `before` to `after`.
///
/// A key seen for the first time contributes everything it has (the agent forgets a key in its
/// previous snapshot whenever it deletes it from a map, so a re-created entry is new). A key
/// whose counters went backwards otherwise is a regression: its change over this window is
/// unknown, so it is skipped and counted in `regressions` (re-adding its whole total would
/// count history a second time).
///
/// An iterator, so that the deltas go straight where they are kept (thousands of kilobyte-sized
/// values: no intermediate copy).
fn deltas<'a, K: Copy + Eq + Hash, V: Counters>(
    before: &'a HashMap<K, V>,
    after: &'a HashMap<K, V>,
    regressions: &'a mut u64,
) -> impl Iterator<Item = (K, V)> + 'a {
    after.iter().filter_map(|(k, now)| {
        let d = match before.get(k) {
            Some(then) => match now.since(then) {
                Some(d) => d,
                None => {
                    *regressions += 1;
                    return None;
                }
            },
            None => *now,
        };
        (d != V::ZERO).then_some((*k, d))
    })
}

/// A cgroup's window in `cgroups`, zero when new.
fn slot(cgroups: &mut HashMap<u64, CgroupWindow>, id: u64) -> &mut CgroupWindow {
    cgroups.entry(id).or_insert(CgroupWindow::ZERO)
}

fn add_all<K: Copy + Eq + Hash, V: Counters>(into: &mut HashMap<K, V>, from: &HashMap<K, V>) {
    for (k, v) in from {
        into.entry(*k).or_insert(V::ZERO).add(v);
    }
}

impl Window {
    pub fn empty() -> Self {
        Self {
            duration: Duration::ZERO,
            cgroups: HashMap::new(),
            hot_futexes: HashMap::new(),
            lock_sites: HashMap::new(),
            handoff_threads: HashMap::new(),
            net_ifaces: HashMap::new(),
            net_drops: HashMap::new(),
            counter_regressions: 0,
            handoff_sites: HashMap::new(),
            process_words: HashMap::new(),
            runq_blame: HashMap::new(),
        }
    }

    /// Takes the Go mutex part of the window anew from `before` to `after`, after `after`'s
    /// was read again (the pipeline runs the uprobes' burst once the rest of the window is
    /// known, and reads its counts then). A key whose counters went backwards was counted as
    /// a regression by [`Window::between`] and is skipped here too: the kernel's counts only
    /// grow, and a cgroup's entry is forgotten in the snapshot whenever it is deleted.
    pub fn retake_go_mutex(&mut self, before: &Snapshot, after: &Snapshot) {
        for w in self.cgroups.values_mut() {
            w.go_mutex = GoMutexFigures::ZERO;
        }
        let mut counted_before = 0;
        for (id, d) in deltas(
            &before.go_mutex.cgroups,
            &after.go_mutex.cgroups,
            &mut counted_before,
        ) {
            self.cgroups
                .entry(id)
                .or_insert(CgroupWindow::ZERO)
                .go_mutex = d;
        }
    }

    /// The change from `before` to `after`, part by part (every part named: one left out
    /// does not compile).
    pub fn between(before: &Snapshot, after: &Snapshot) -> Self {
        let Snapshot {
            taken_at,
            sched,
            futex,
            locks,
            net,
            go_mutex,
            pg_lock,
        } = after;
        let mut regressions = 0;
        let r = &mut regressions;
        // Sized once: growing a map of thousands of these (over a kilobyte each) costs copies
        // and fresh pages at every collection.
        let mut cgroups: HashMap<u64, CgroupWindow> = HashMap::with_capacity(sched.cgroups.len());
        for (id, d) in deltas(&before.sched.cgroups, &sched.cgroups, r) {
            slot(&mut cgroups, id).sched = d;
        }
        for (id, d) in deltas(&before.futex.cgroups, &futex.cgroups, r) {
            slot(&mut cgroups, id).futex = d;
        }
        for (id, d) in deltas(&before.locks.cgroups, &locks.cgroups, r) {
            slot(&mut cgroups, id).locks = d;
        }
        for (id, d) in deltas(&before.net.cgroups, &net.cgroups, r) {
            slot(&mut cgroups, id).net = d;
        }
        for (id, d) in deltas(&before.go_mutex.cgroups, &go_mutex.cgroups, r) {
            slot(&mut cgroups, id).go_mutex = d;
        }
        for (id, d) in deltas(&before.pg_lock.cgroups, &pg_lock.cgroups, r) {
            slot(&mut cgroups, id).pg_lock = d;
        }
        for (id, cpus) in cpus_used(&before.sched, sched) {
            slot(&mut cgroups, id).cpus = cpus;
        }
        let runq_blame = deltas(&before.sched.runq_blame, &sched.runq_blame, r)
            .filter(|(_, v)| v.ns > 0)
            .collect();
        let hot_futexes = deltas(&before.futex.hot, &futex.hot, r)
            .filter(|(_, v)| v.waits > 0)
            .collect();
        let process_words = process_words(&hot_futexes);
        let handoff_threads = deltas(&before.futex.handoff_threads, &futex.handoff_threads, r)
            .filter(|(_, v)| v.woken_waits + v.wakes > 0)
            .collect();
        let lock_sites = deltas(&before.locks.sites, &locks.sites, r)
            .filter(|(_, v)| v.count > 0)
            .collect();
        // The MTU alone changes nothing: only interfaces that handled packets.
        let net_ifaces = deltas(&before.net.ifaces, &net.ifaces, r)
            .filter(|(_, v)| v.tx.packets + v.rx.packets > 0)
            .collect();
        let net_drops = deltas(&before.net.drops, &net.drops, r).collect();
        if regressions > 0 {
            log::debug!("{regressions} counter(s) went backwards; their change is skipped");
            UserLoss::CounterRegression.add(regressions);
        }
        Self {
            duration: taken_at.saturating_duration_since(before.taken_at),
            cgroups,
            hot_futexes,
            lock_sites,
            handoff_threads,
            net_ifaces,
            net_drops,
            counter_regressions: regressions,
            handoff_sites: HashMap::new(),
            process_words,
            runq_blame,
        }
    }

    /// The blamed run-queue waits by victim: its (culprit, ns) pairs, grouped once so that a
    /// reader per cgroup does not scan every pair for each.
    pub fn blame_by_victim(&self) -> HashMap<u64, Vec<(u64, u64)>> {
        let mut by: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
        for (k, v) in &self.runq_blame {
            by.entry(k.victim).or_default().push((k.culprit, v.ns));
        }
        by
    }

    /// Adds a later, adjacent window to this one.
    pub fn extend(&mut self, later: &Window) {
        self.extend_figures(later);
        add_all(&mut self.hot_futexes, &later.hot_futexes);
        add_all(&mut self.lock_sites, &later.lock_sites);
        self.counter_regressions += later.counter_regressions;
    }

    /// Adds one cgroup's figures over a later, adjacent window.
    pub fn add_cgroup(&mut self, id: u64, w: &CgroupWindow) {
        self.cgroups.entry(id).or_insert(CgroupWindow::ZERO).add(w);
    }

    /// Adds a later, adjacent window's per-cgroup, per-thread hand-off and network figures only,
    /// without its hot futexes, call sites and regression count (what the diagnosis rules
    /// read).
    pub fn extend_figures(&mut self, later: &Window) {
        self.duration += later.duration;
        self.cgroups
            .reserve(later.cgroups.len().saturating_sub(self.cgroups.len()));
        for (id, w) in &later.cgroups {
            self.add_cgroup(*id, w);
        }
        add_all(&mut self.handoff_threads, &later.handoff_threads);
        for (k, w) in &later.process_words {
            self.process_words.entry(*k).or_default().add(w);
        }
        add_all(&mut self.net_ifaces, &later.net_ifaces);
        add_all(&mut self.net_drops, &later.net_drops);
        add_all(&mut self.runq_blame, &later.runq_blame);
        for (id, sites) in &later.handoff_sites {
            self.handoff_sites.entry(*id).or_default().add(sites);
        }
    }
}

/// Quantiles of a log2 histogram. A log2 bucket only bounds its values, so the answer is the
/// upper edge of the bucket that holds the quantile: the true value is at most this and more
/// than half of it. The last bucket is open-ended, so for it the answer is its lower edge.
pub fn log2_quantile_ns(h: &Log2Histogram, q: f64) -> Option<u64> {
    let total: u64 = h.buckets.iter().sum();
    if total == 0 {
        return None;
    }
    // The rank of the quantile, 1-based: the smallest rank r with r >= q * total.
    let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
    let mut seen = 0;
    for (b, n) in h.buckets.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return Some(bucket_upper_ns(b));
        }
    }
    Some(bucket_upper_ns(LOG2_BUCKETS - 1))
}

/// The upper edge of bucket `b` in ns (see [`stormwatch_common::log2_bucket`]); for the last,
/// open-ended bucket, its lower edge.
pub fn bucket_upper_ns(b: usize) -> u64 {
    match b {
        0 => 0,
        b if b >= LOG2_BUCKETS - 1 => 1 << (LOG2_BUCKETS - 2),
        b => (1u64 << b) - 1,
    }
}

#[cfg(test)]
mod tests;
