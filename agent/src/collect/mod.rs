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
    Log2Histogram, SchedStats, ThreadHandoff,
    net::{CgroupNetStats, NetDropKey, NetDropStats, NetIfKey, NetIfStats},
};

mod availability;

pub use self::availability::{Availability, NetAvailability, iface_key};
pub use crate::counters::Counters;
use crate::{
    counters::UserLoss,
    probes::{Probes, futex, locks, net},
};

/// Cumulative counters at one instant. Counters start at zero when the probes attach, so a
/// key seen for the first time contributes everything it has.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub taken_at: Instant,
    pub sched: HashMap<u64, SchedStats>,
    /// Per cgroup, its on-CPU time on each CPU (index = CPU number): which CPUs it ran on.
    pub oncpu_by_cpu: HashMap<u64, Vec<u64>>,
    pub futex: HashMap<u64, FutexStats>,
    pub locks: HashMap<u64, LockStats>,
    pub hot_futexes: HashMap<HotFutexKey, HotFutexValue>,
    pub lock_sites: HashMap<LockSiteKey, LockSiteValue>,
    /// Per thread id: its part in futex hand-offs.
    pub handoff_threads: HashMap<u32, ThreadHandoff>,
    /// Per cgroup: what its sockets sent and received.
    pub net: HashMap<u64, CgroupNetStats>,
    /// Per interface (namespace inode, ifindex).
    pub net_ifaces: HashMap<NetIfKey, NetIfStats>,
    /// Drops by interface and reason.
    pub net_drops: HashMap<NetDropKey, NetDropStats>,
}

impl Snapshot {
    pub fn empty(taken_at: Instant) -> Self {
        Self {
            taken_at,
            sched: HashMap::new(),
            oncpu_by_cpu: HashMap::new(),
            futex: HashMap::new(),
            locks: HashMap::new(),
            hot_futexes: HashMap::new(),
            lock_sites: HashMap::new(),
            handoff_threads: HashMap::new(),
            net: HashMap::new(),
            net_ifaces: HashMap::new(),
            net_drops: HashMap::new(),
        }
    }

    pub fn read(probes: &mut Probes) -> anyhow::Result<Self> {
        let (sched, oncpu_by_cpu) = probes.read_sched()?;
        let ebpf = probes.ebpf();
        Ok(Self {
            taken_at: Instant::now(),
            sched,
            oncpu_by_cpu,
            futex: futex::read(ebpf)?,
            locks: locks::read(ebpf)?,
            hot_futexes: futex::read_hot(ebpf)?,
            lock_sites: locks::read_sites(ebpf)?,
            handoff_threads: futex::read_handoff_threads(ebpf)?,
            net: net::read(ebpf)?,
            net_ifaces: net::read_ifaces(ebpf)?,
            net_drops: net::read_drops(ebpf)?,
        })
    }

    /// Every cgroup id with figures.
    pub fn cgroup_ids(&self) -> impl Iterator<Item = &u64> {
        self.sched
            .keys()
            .chain(self.futex.keys())
            .chain(self.locks.keys())
            .chain(self.net.keys())
    }

    /// Forgets, in the probes' maps and in this (latest) snapshot alike, so that the next window
    /// counts a re-created entry from zero: the `gone` cgroups (each map entry deleted by key),
    /// the hot futexes of processes that have exited, and the hot futexes and call sites idle
    /// for many reads (the bounded maps' eviction, counted).
    pub fn forget(&mut self, probes: &mut Probes, gone: &[u64]) {
        probes.forget_cgroups(gone);
        let exited = |tgid: u32| !std::path::Path::new(&format!("/proc/{tgid}")).exists();
        let mut tgids: HashMap<u32, bool> = HashMap::new();
        let doomed_hot: Vec<HotFutexKey> = self
            .hot_futexes
            .keys()
            .filter(|k| {
                gone.contains(&k.cgroup_id)
                    || *tgids.entry(k.tgid).or_insert_with(|| exited(k.tgid))
            })
            .copied()
            .collect();
        let doomed_sites: Vec<LockSiteKey> = self
            .lock_sites
            .keys()
            .filter(|k| gone.contains(&k.cgroup_id))
            .copied()
            .collect();
        probes.forget_hot_futexes(&doomed_hot);
        probes.forget_lock_sites(&doomed_sites);
        // Threads that have exited (an entry that moves belongs to a live thread, so only the
        // still ones are looked up).
        let doomed_threads: Vec<u32> = self
            .handoff_threads
            .iter()
            .filter(|(tid, v)| {
                gone.contains(&v.cgroup_id)
                    || !std::path::Path::new(&format!("/proc/{}/task/{tid}", v.tgid)).exists()
            })
            .map(|(tid, _)| *tid)
            .collect();
        futex::forget_handoff_threads(probes.ebpf_mut(), &doomed_threads);
        for tid in &doomed_threads {
            self.handoff_threads.remove(tid);
        }
        for id in gone {
            self.forget_cgroup(*id);
        }
        for k in &doomed_hot {
            self.hot_futexes.remove(k);
        }
        let (idle_hot, idle_sites) = probes.evict_idle(&self.hot_futexes, &self.lock_sites);
        for k in &idle_hot {
            self.hot_futexes.remove(k);
        }
        for k in &idle_sites {
            self.lock_sites.remove(k);
        }
    }

    /// Drops a removed cgroup, so that the next window does not subtract from it.
    pub fn forget_cgroup(&mut self, id: u64) {
        self.sched.remove(&id);
        self.oncpu_by_cpu.remove(&id);
        self.futex.remove(&id);
        self.locks.remove(&id);
        self.net.remove(&id);
        self.hot_futexes.retain(|k, _| k.cgroup_id != id);
        self.lock_sites.retain(|k, _| k.cgroup_id != id);
        self.handoff_threads.retain(|_, v| v.cgroup_id != id);
    }
}

/// The figures of one cgroup over a window; each part is zero when nothing happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupWindow {
    pub sched: SchedStats,
    pub futex: FutexStats,
    pub locks: LockStats,
    pub net: CgroupNetStats,
    /// The CPUs the cgroup's threads ran on in the window.
    pub cpus: CpuSet,
}

impl CgroupWindow {
    pub const ZERO: Self = Self {
        sched: SchedStats::ZERO,
        futex: FutexStats::ZERO,
        locks: LockStats::ZERO,
        net: CgroupNetStats::ZERO,
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
            cpus,
        } = later;
        self.sched.add(sched);
        self.futex.add(futex);
        self.locks.add(locks);
        self.net.add(net);
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
fn cpus_used(before: &Snapshot, after: &Snapshot) -> Vec<(u64, CpuSet)> {
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
        }
    }

    /// The change from `before` to `after`.
    pub fn between(before: &Snapshot, after: &Snapshot) -> Self {
        let mut regressions = 0;
        // Sized once: growing a map of thousands of these (over a kilobyte each) costs copies
        // and fresh pages at every collection.
        let mut cgroups: HashMap<u64, CgroupWindow> = HashMap::with_capacity(after.sched.len());
        for (id, d) in deltas(&before.sched, &after.sched, &mut regressions) {
            cgroups.entry(id).or_insert(CgroupWindow::ZERO).sched = d;
        }
        for (id, d) in deltas(&before.futex, &after.futex, &mut regressions) {
            cgroups.entry(id).or_insert(CgroupWindow::ZERO).futex = d;
        }
        for (id, d) in deltas(&before.locks, &after.locks, &mut regressions) {
            cgroups.entry(id).or_insert(CgroupWindow::ZERO).locks = d;
        }
        for (id, d) in deltas(&before.net, &after.net, &mut regressions) {
            cgroups.entry(id).or_insert(CgroupWindow::ZERO).net = d;
        }
        for (id, cpus) in cpus_used(before, after) {
            cgroups.entry(id).or_insert(CgroupWindow::ZERO).cpus = cpus;
        }
        let hot_futexes = deltas(&before.hot_futexes, &after.hot_futexes, &mut regressions)
            .filter(|(_, v)| v.waits > 0)
            .collect();
        let lock_sites = deltas(&before.lock_sites, &after.lock_sites, &mut regressions)
            .filter(|(_, v)| v.count > 0)
            .collect();
        let handoff_threads = deltas(
            &before.handoff_threads,
            &after.handoff_threads,
            &mut regressions,
        )
        .filter(|(_, v)| v.woken_waits + v.wakes > 0)
        .collect();
        // The MTU alone changes nothing: only interfaces that handled packets.
        let net_ifaces = deltas(&before.net_ifaces, &after.net_ifaces, &mut regressions)
            .filter(|(_, v)| v.tx.packets + v.rx.packets > 0)
            .collect();
        let net_drops = deltas(&before.net_drops, &after.net_drops, &mut regressions).collect();
        if regressions > 0 {
            log::debug!("{regressions} counter(s) went backwards; their change is skipped");
            UserLoss::CounterRegression.add(regressions);
        }
        Self {
            duration: after.taken_at.saturating_duration_since(before.taken_at),
            cgroups,
            hot_futexes,
            lock_sites,
            handoff_threads,
            net_ifaces,
            net_drops,
            counter_regressions: regressions,
        }
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
        add_all(&mut self.net_ifaces, &later.net_ifaces);
        add_all(&mut self.net_drops, &later.net_drops);
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
mod tests {
    use super::*;
    use stormwatch_common::log2_bucket;

    fn hist(values: &[u64]) -> Log2Histogram {
        let mut h = Log2Histogram::ZERO;
        for v in values {
            h.record(*v);
        }
        h
    }

    #[test]
    fn quantile_is_the_upper_edge_of_its_bucket() {
        // 90 values of 1000 ns (bucket 10: 512..=1023), 10 of 100 µs (bucket 17).
        let mut values = vec![1000; 90];
        values.extend([100_000; 10]);
        let h = hist(&values);
        assert_eq!(log2_quantile_ns(&h, 0.5), Some(1023));
        assert_eq!(log2_quantile_ns(&h, 0.9), Some(1023));
        assert_eq!(log2_quantile_ns(&h, 0.91), Some((1 << 17) - 1));
        assert_eq!(log2_quantile_ns(&h, 0.99), Some((1 << 17) - 1));
        // Every recorded value is within (upper/2, upper] of its bucket's upper edge.
        for v in [1u64, 2, 3, 1000, 1024, 100_000, 1 << 29] {
            let upper = bucket_upper_ns(log2_bucket(v));
            assert!(v <= upper && upper < 2 * v, "{v} -> {upper}");
        }
    }

    /// Only what a cgroup's own threads do counts as their moving: received traffic and a
    /// socket that outlived its cgroup do not keep a removed cgroup alive.
    #[test]
    fn threads_moved_leaves_network_figures_out() {
        let mut w = CgroupWindow::ZERO;
        assert!(!w.threads_moved());
        w.net.rx_packets = 10;
        assert!(!w.threads_moved(), "network figures alone");
        let mut s = w;
        s.sched.voluntary_switches = 1;
        assert!(s.threads_moved());
        let mut f = w;
        f.futex.wakes = 1;
        assert!(f.threads_moved());
        let mut l = w;
        l.locks.count[0] = 1;
        assert!(l.threads_moved());
    }

    #[test]
    fn quantile_of_nothing_is_none_and_zeros_are_zero() {
        assert_eq!(log2_quantile_ns(&Log2Histogram::ZERO, 0.5), None);
        assert_eq!(log2_quantile_ns(&hist(&[0, 0, 0]), 0.99), Some(0));
    }

    #[test]
    fn overflow_bucket_reports_its_lower_edge() {
        let h = hist(&[u64::MAX]);
        assert_eq!(log2_quantile_ns(&h, 0.5), Some(1 << (LOG2_BUCKETS - 2)));
    }

    fn stats(vol: u64, invol: u64, runq: &[u64]) -> SchedStats {
        SchedStats {
            voluntary_switches: vol,
            involuntary_switches: invol,
            migrations: 1,
            oncpu_ns: 10 * vol,
            offcpu_ns: 5,
            runq: hist(runq),
            ..SchedStats::ZERO
        }
    }

    #[test]
    fn window_is_the_difference_and_new_cgroups_count_whole() {
        let t0 = Instant::now();
        let mut before = Snapshot::empty(t0);
        before.sched.insert(1, stats(10, 2, &[100]));
        let mut after = Snapshot::empty(t0 + Duration::from_secs(1));
        after.sched.insert(1, stats(15, 3, &[100, 5000]));
        after.sched.insert(2, stats(4, 0, &[]));
        let w = Window::between(&before, &after);
        assert_eq!(w.duration, Duration::from_secs(1));
        let one = &w.cgroups[&1].sched;
        assert_eq!(one.voluntary_switches, 5);
        assert_eq!(one.involuntary_switches, 1);
        assert_eq!(one.oncpu_ns, 50);
        assert_eq!(one.runq.count, 1);
        assert_eq!(one.runq.sum_ns, 5000);
        assert_eq!(one.runq.buckets[log2_bucket(5000)], 1);
        assert_eq!(w.cgroups[&2].sched.voluntary_switches, 4);
    }

    #[test]
    fn unchanged_cgroups_are_left_out_and_windows_add_up() {
        let t0 = Instant::now();
        let mut a = Snapshot::empty(t0);
        a.sched.insert(1, stats(10, 2, &[100]));
        let mut b = a.clone();
        b.taken_at = t0 + Duration::from_secs(1);
        let mut c = b.clone();
        c.taken_at = t0 + Duration::from_secs(2);
        c.sched.insert(1, stats(12, 2, &[100, 7]));
        let w_ab = Window::between(&a, &b);
        assert!(w_ab.cgroups.is_empty());
        let mut total = w_ab.clone();
        total.extend(&Window::between(&b, &c));
        assert_eq!(total.duration, Duration::from_secs(2));
        assert_eq!(total.cgroups[&1], Window::between(&a, &c).cgroups[&1]);
    }

    #[test]
    fn a_regressed_counter_is_counted_and_skipped_not_re_added() {
        let t0 = Instant::now();
        let mut a = Snapshot::empty(t0);
        a.sched.insert(1, stats(10, 2, &[]));
        a.sched.insert(2, stats(1, 0, &[]));
        let mut b = Snapshot::empty(t0);
        // Cgroup 1 went backwards in one word only; cgroup 2 moved forward.
        let mut one = stats(10, 2, &[]);
        one.migrations = 0;
        b.sched.insert(1, one);
        b.sched.insert(2, stats(4, 0, &[]));
        let before = UserLoss::CounterRegression.total();
        let w = Window::between(&a, &b);
        assert_eq!(w.counter_regressions, 1);
        assert!(
            !w.cgroups.contains_key(&1),
            "no figure for the regressed key"
        );
        assert_eq!(w.cgroups[&2].sched.voluntary_switches, 3);
        // Process-wide (other tests may add theirs meanwhile).
        assert!(UserLoss::CounterRegression.total() > before);
        // From the regressed value on, the key counts normally again.
        let mut c = Snapshot::empty(t0);
        let mut later = one;
        later.voluntary_switches += 5;
        c.sched.insert(1, later);
        let w = Window::between(&b, &c);
        assert_eq!(w.counter_regressions, 0);
        assert_eq!(w.cgroups[&1].sched.voluntary_switches, 5);
        let mut total = Window::empty();
        total.extend(&Window::between(&a, &b));
        total.extend(&w);
        assert_eq!(total.counter_regressions, 1);
    }

    #[test]
    fn cpus_used_are_the_cpus_whose_oncpu_time_moved() {
        let t0 = Instant::now();
        let mut a = Snapshot::empty(t0);
        a.oncpu_by_cpu.insert(1, vec![100, 0, 50, 0]);
        let mut b = Snapshot::empty(t0);
        b.oncpu_by_cpu.insert(1, vec![100, 10, 70, 0]);
        b.oncpu_by_cpu.insert(2, vec![0, 0, 0, 5]);
        let w = Window::between(&a, &b);
        assert_eq!(w.cgroups[&1].cpus_used(), 2);
        assert_eq!(w.cgroups[&2].cpus_used(), 1);
        // Over two windows, distinct CPUs, not a sum.
        let mut c = b.clone();
        c.oncpu_by_cpu.insert(1, vec![200, 20, 70, 0]);
        let mut total = w.clone();
        total.extend(&Window::between(&b, &c));
        assert_eq!(total.cgroups[&1].cpus_used(), 3);
    }

    #[test]
    fn remote_share_is_of_the_wakeups_whose_kind_is_known() {
        let mut c = CgroupWindow::ZERO;
        assert_eq!(c.remote_wakeup_share(), None);
        for _ in 0..3 {
            c.sched.wake_remote.record(1000);
        }
        c.sched.wake_local.record(10);
        assert_eq!(c.wakeups(), 4);
        assert_eq!(c.remote_wakeup_share(), Some(0.75));
    }

    fn hot(waits: u64, wait_ns: u64, max: u64) -> HotFutexValue {
        HotFutexValue {
            waits,
            wait_ns,
            max_wait_ns: max,
            comm: *b"java\0\0\0\0\0\0\0\0\0\0\0\0",
        }
    }

    #[test]
    fn futex_and_lock_figures_join_the_cgroup_window() {
        let t0 = Instant::now();
        let mut a = Snapshot::empty(t0);
        let mut b = Snapshot::empty(t0 + Duration::from_secs(1));
        let mut f = FutexStats::ZERO;
        f.wait.record(1000);
        f.wakes = 3;
        b.futex.insert(5, f);
        let mut l = LockStats::ZERO;
        l.count[0] = 2;
        l.wait_ns[0] = 900;
        a.locks.insert(5, l);
        l.count[0] = 7;
        l.wait_ns[0] = 1900;
        b.locks.insert(5, l);
        let w = Window::between(&a, &b);
        let c = &w.cgroups[&5];
        assert_eq!(c.futex.wait.count, 1);
        assert_eq!(c.futex.wakes, 3);
        assert_eq!(c.locks.count[0], 5);
        assert_eq!(c.locks.wait_ns[0], 1000);
        assert_eq!(c.sched, SchedStats::ZERO);
    }

    #[test]
    fn hot_futexes_without_new_waits_are_not_activity() {
        let key = HotFutexKey {
            cgroup_id: 1,
            uaddr: 0x1000,
            tgid: 42,
            _pad: 0,
        };
        let t0 = Instant::now();
        let mut a = Snapshot::empty(t0);
        a.hot_futexes.insert(key, hot(10, 500, 90));
        let mut b = a.clone();
        assert!(Window::between(&a, &b).hot_futexes.is_empty());
        b.hot_futexes.insert(key, hot(14, 900, 200));
        let w = Window::between(&a, &b);
        assert_eq!(w.hot_futexes[&key].waits, 4);
        assert_eq!(w.hot_futexes[&key].wait_ns, 400);
        assert_eq!(w.hot_futexes[&key].max_wait_ns, 200);
        let mut total = Window::empty();
        total.extend(&w);
        total.extend(&w);
        assert_eq!(total.hot_futexes[&key].waits, 8);
        assert_eq!(total.hot_futexes[&key].max_wait_ns, 200);
    }

    #[test]
    fn forgetting_a_cgroup_drops_all_its_keys() {
        let mut a = Snapshot::empty(Instant::now());
        a.sched.insert(1, stats(1, 1, &[]));
        a.futex.insert(1, FutexStats::ZERO);
        a.hot_futexes.insert(
            HotFutexKey {
                cgroup_id: 1,
                uaddr: 1,
                tgid: 1,
                _pad: 0,
            },
            hot(1, 1, 1),
        );
        a.sched.insert(2, stats(1, 1, &[]));
        a.forget_cgroup(1);
        assert_eq!(a.cgroup_ids().copied().collect::<Vec<_>>(), [2]);
        assert!(a.hot_futexes.is_empty());
    }
}
