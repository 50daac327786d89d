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
    Log2Histogram, SchedStats,
    net::{CgroupNetStats, NetDirStats, NetDropKey, NetDropStats, NetIfKey, NetIfStats},
};

use crate::probes::{Probes, futex, locks, net, sched};

/// Cumulative counters: added across CPUs and windows, subtracted between snapshots.
pub trait Counters: Copy + PartialEq {
    const ZERO: Self;
    fn add(&mut self, other: &Self);
    /// `self - then`, or `None` when a counter went backwards (the entry was removed and
    /// re-created between the snapshots, so `self` alone is the change).
    fn since(&self, then: &Self) -> Option<Self>;
}

impl Counters for Log2Histogram {
    const ZERO: Self = Log2Histogram::ZERO;
    fn add(&mut self, o: &Self) {
        self.count += o.count;
        self.sum_ns += o.sum_ns;
        for (t, b) in self.buckets.iter_mut().zip(o.buckets.iter()) {
            *t += b;
        }
    }
    fn since(&self, then: &Self) -> Option<Self> {
        let mut d = Log2Histogram::ZERO;
        d.count = self.count.checked_sub(then.count)?;
        d.sum_ns = self.sum_ns.checked_sub(then.sum_ns)?;
        for b in 0..LOG2_BUCKETS {
            d.buckets[b] = self.buckets[b].checked_sub(then.buckets[b])?;
        }
        Some(d)
    }
}

impl Counters for SchedStats {
    const ZERO: Self = SchedStats::ZERO;
    fn add(&mut self, o: &Self) {
        self.voluntary_switches += o.voluntary_switches;
        self.involuntary_switches += o.involuntary_switches;
        self.migrations += o.migrations;
        self.oncpu_ns += o.oncpu_ns;
        self.offcpu_ns += o.offcpu_ns;
        self.runq.add(&o.runq);
    }
    fn since(&self, t: &Self) -> Option<Self> {
        Some(SchedStats {
            voluntary_switches: self.voluntary_switches.checked_sub(t.voluntary_switches)?,
            involuntary_switches: self
                .involuntary_switches
                .checked_sub(t.involuntary_switches)?,
            migrations: self.migrations.checked_sub(t.migrations)?,
            oncpu_ns: self.oncpu_ns.checked_sub(t.oncpu_ns)?,
            offcpu_ns: self.offcpu_ns.checked_sub(t.offcpu_ns)?,
            runq: self.runq.since(&t.runq)?,
        })
    }
}

impl Counters for FutexStats {
    const ZERO: Self = FutexStats::ZERO;
    fn add(&mut self, o: &Self) {
        self.wakes += o.wakes;
        self.woken += o.woken;
        self.timeouts += o.timeouts;
        self.eagain += o.eagain;
        self.wait.add(&o.wait);
    }
    fn since(&self, t: &Self) -> Option<Self> {
        Some(FutexStats {
            wakes: self.wakes.checked_sub(t.wakes)?,
            woken: self.woken.checked_sub(t.woken)?,
            timeouts: self.timeouts.checked_sub(t.timeouts)?,
            eagain: self.eagain.checked_sub(t.eagain)?,
            wait: self.wait.since(&t.wait)?,
        })
    }
}

impl Counters for LockStats {
    const ZERO: Self = LockStats::ZERO;
    fn add(&mut self, o: &Self) {
        for k in 0..self.count.len() {
            self.count[k] += o.count[k];
            self.wait_ns[k] += o.wait_ns[k];
        }
    }
    fn since(&self, t: &Self) -> Option<Self> {
        let mut d = LockStats::ZERO;
        for k in 0..self.count.len() {
            d.count[k] = self.count[k].checked_sub(t.count[k])?;
            d.wait_ns[k] = self.wait_ns[k].checked_sub(t.wait_ns[k])?;
        }
        Some(d)
    }
}

/// `max_wait_ns` is a maximum since attach, not a counter: a window carries the latest.
impl Counters for HotFutexValue {
    const ZERO: Self = HotFutexValue {
        waits: 0,
        wait_ns: 0,
        max_wait_ns: 0,
        comm: [0; 16],
    };
    fn add(&mut self, o: &Self) {
        self.waits += o.waits;
        self.wait_ns += o.wait_ns;
        self.max_wait_ns = self.max_wait_ns.max(o.max_wait_ns);
        if self.comm[0] == 0 {
            self.comm = o.comm;
        }
    }
    fn since(&self, t: &Self) -> Option<Self> {
        Some(HotFutexValue {
            waits: self.waits.checked_sub(t.waits)?,
            wait_ns: self.wait_ns.checked_sub(t.wait_ns)?,
            max_wait_ns: self.max_wait_ns,
            comm: self.comm,
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

impl Counters for CgroupNetStats {
    const ZERO: Self = CgroupNetStats::ZERO;
    fn add(&mut self, o: &Self) {
        self.tx_packets += o.tx_packets;
        self.tx_bytes += o.tx_bytes;
        self.rx_packets += o.rx_packets;
        self.rx_bytes += o.rx_bytes;
        self.tx_gso_packets += o.tx_gso_packets;
        self.rx_gso_packets += o.rx_gso_packets;
        self.tcp_retransmits += o.tcp_retransmits;
        for b in 0..self.tx_len.len() {
            self.tx_len[b] += o.tx_len[b];
            self.rx_len[b] += o.rx_len[b];
        }
    }
    fn since(&self, t: &Self) -> Option<Self> {
        let mut d = CgroupNetStats {
            tx_packets: self.tx_packets.checked_sub(t.tx_packets)?,
            tx_bytes: self.tx_bytes.checked_sub(t.tx_bytes)?,
            rx_packets: self.rx_packets.checked_sub(t.rx_packets)?,
            rx_bytes: self.rx_bytes.checked_sub(t.rx_bytes)?,
            tx_gso_packets: self.tx_gso_packets.checked_sub(t.tx_gso_packets)?,
            rx_gso_packets: self.rx_gso_packets.checked_sub(t.rx_gso_packets)?,
            tcp_retransmits: self.tcp_retransmits.checked_sub(t.tcp_retransmits)?,
            ..CgroupNetStats::ZERO
        };
        for b in 0..self.tx_len.len() {
            d.tx_len[b] = self.tx_len[b].checked_sub(t.tx_len[b])?;
            d.rx_len[b] = self.rx_len[b].checked_sub(t.rx_len[b])?;
        }
        Some(d)
    }
}

impl Counters for NetDirStats {
    const ZERO: Self = NetDirStats::ZERO;
    fn add(&mut self, o: &Self) {
        self.packets += o.packets;
        self.bytes += o.bytes;
        self.gso_packets += o.gso_packets;
        self.gso_segments += o.gso_segments;
        self.fragments += o.fragments;
        self.ptb += o.ptb;
        for (t, b) in self.len.iter_mut().zip(o.len.iter()) {
            *t += b;
        }
    }
    fn since(&self, t: &Self) -> Option<Self> {
        let mut d = NetDirStats {
            packets: self.packets.checked_sub(t.packets)?,
            bytes: self.bytes.checked_sub(t.bytes)?,
            gso_packets: self.gso_packets.checked_sub(t.gso_packets)?,
            gso_segments: self.gso_segments.checked_sub(t.gso_segments)?,
            fragments: self.fragments.checked_sub(t.fragments)?,
            ptb: self.ptb.checked_sub(t.ptb)?,
            ..NetDirStats::ZERO
        };
        for b in 0..self.len.len() {
            d.len[b] = self.len[b].checked_sub(t.len[b])?;
        }
        Some(d)
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

impl Counters for NetDropStats {
    const ZERO: Self = NetDropStats { packets: 0 };
    fn add(&mut self, o: &Self) {
        self.packets += o.packets;
    }
    fn since(&self, t: &Self) -> Option<Self> {
        Some(NetDropStats {
            packets: self.packets.checked_sub(t.packets)?,
        })
    }
}

/// Cumulative counters at one instant. Counters start at zero when the probes attach, so a
/// key seen for the first time contributes everything it has.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub taken_at: Instant,
    pub sched: HashMap<u64, SchedStats>,
    pub futex: HashMap<u64, FutexStats>,
    pub locks: HashMap<u64, LockStats>,
    pub hot_futexes: HashMap<HotFutexKey, HotFutexValue>,
    pub lock_sites: HashMap<LockSiteKey, LockSiteValue>,
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
            futex: HashMap::new(),
            locks: HashMap::new(),
            hot_futexes: HashMap::new(),
            lock_sites: HashMap::new(),
            net: HashMap::new(),
            net_ifaces: HashMap::new(),
            net_drops: HashMap::new(),
        }
    }

    pub fn read(probes: &Probes) -> anyhow::Result<Self> {
        let ebpf = probes.ebpf();
        Ok(Self {
            taken_at: Instant::now(),
            sched: sched::read(ebpf)?,
            futex: futex::read(ebpf)?,
            locks: locks::read(ebpf)?,
            hot_futexes: futex::read_hot(ebpf)?,
            lock_sites: locks::read_sites(ebpf)?,
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

    /// Drops a removed cgroup, so that the next window does not subtract from it.
    pub fn forget_cgroup(&mut self, id: u64) {
        self.sched.remove(&id);
        self.futex.remove(&id);
        self.locks.remove(&id);
        self.net.remove(&id);
        self.hot_futexes.retain(|k, _| k.cgroup_id != id);
        self.lock_sites.retain(|k, _| k.cgroup_id != id);
    }
}

/// The figures of one cgroup over a window; each part is zero when nothing happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupWindow {
    pub sched: SchedStats,
    pub futex: FutexStats,
    pub locks: LockStats,
    pub net: CgroupNetStats,
}

impl CgroupWindow {
    pub const ZERO: Self = Self {
        sched: SchedStats::ZERO,
        futex: FutexStats::ZERO,
        locks: LockStats::ZERO,
        net: CgroupNetStats::ZERO,
    };
}

/// Per-key deltas between two snapshots, accumulated over one or more intervals.
#[derive(Clone, Debug)]
pub struct Window {
    pub duration: Duration,
    pub cgroups: HashMap<u64, CgroupWindow>,
    pub hot_futexes: HashMap<HotFutexKey, HotFutexValue>,
    pub lock_sites: HashMap<LockSiteKey, LockSiteValue>,
    /// Interfaces that handled packets in the window.
    pub net_ifaces: HashMap<NetIfKey, NetIfStats>,
    pub net_drops: HashMap<NetDropKey, NetDropStats>,
}

/// The non-zero changes of each key from `before` to `after`.
fn deltas<K: Copy + Eq + Hash, V: Counters>(
    before: &HashMap<K, V>,
    after: &HashMap<K, V>,
) -> impl Iterator<Item = (K, V)> {
    after.iter().filter_map(move |(k, now)| {
        let d = match before.get(k) {
            Some(then) => now.since(then).unwrap_or(*now),
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
            net_ifaces: HashMap::new(),
            net_drops: HashMap::new(),
        }
    }

    /// The change from `before` to `after`.
    pub fn between(before: &Snapshot, after: &Snapshot) -> Self {
        let mut cgroups: HashMap<u64, CgroupWindow> = HashMap::new();
        for (id, d) in deltas(&before.sched, &after.sched) {
            cgroups.entry(id).or_insert(CgroupWindow::ZERO).sched = d;
        }
        for (id, d) in deltas(&before.futex, &after.futex) {
            cgroups.entry(id).or_insert(CgroupWindow::ZERO).futex = d;
        }
        for (id, d) in deltas(&before.locks, &after.locks) {
            cgroups.entry(id).or_insert(CgroupWindow::ZERO).locks = d;
        }
        for (id, d) in deltas(&before.net, &after.net) {
            cgroups.entry(id).or_insert(CgroupWindow::ZERO).net = d;
        }
        Self {
            duration: after.taken_at.saturating_duration_since(before.taken_at),
            cgroups,
            hot_futexes: deltas(&before.hot_futexes, &after.hot_futexes)
                .filter(|(_, v)| v.waits > 0)
                .collect(),
            lock_sites: deltas(&before.lock_sites, &after.lock_sites)
                .filter(|(_, v)| v.count > 0)
                .collect(),
            // The MTU alone changes nothing: only interfaces that handled packets.
            net_ifaces: deltas(&before.net_ifaces, &after.net_ifaces)
                .filter(|(_, v)| v.tx.packets + v.rx.packets > 0)
                .collect(),
            net_drops: deltas(&before.net_drops, &after.net_drops).collect(),
        }
    }

    /// Adds a later, adjacent window to this one.
    pub fn extend(&mut self, later: &Window) {
        self.duration += later.duration;
        for (id, w) in &later.cgroups {
            let e = self.cgroups.entry(*id).or_insert(CgroupWindow::ZERO);
            e.sched.add(&w.sched);
            e.futex.add(&w.futex);
            e.locks.add(&w.locks);
            e.net.add(&w.net);
        }
        add_all(&mut self.hot_futexes, &later.hot_futexes);
        add_all(&mut self.lock_sites, &later.lock_sites);
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
    fn a_regressed_counter_counts_from_zero() {
        let t0 = Instant::now();
        let mut a = Snapshot::empty(t0);
        a.sched.insert(1, stats(10, 2, &[]));
        let mut b = Snapshot::empty(t0);
        b.sched.insert(1, stats(3, 0, &[]));
        assert_eq!(
            Window::between(&a, &b).cgroups[&1].sched.voluntary_switches,
            3
        );
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
