//! Collection: every interval, read the probes' maps into a [`Snapshot`] of cumulative
//! counters per cgroup id; the difference of two snapshots is a [`Window`]. `trace`, `diagnose`
//! and the exporter all read windows, never the maps, so their figures agree.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use stormwatch_common::{LOG2_BUCKETS, Log2Histogram, SchedStats};

use crate::probes::{Probes, sched};

/// Cumulative counters per cgroup at one instant. Counters start at zero when the probes
/// attach, so a cgroup seen for the first time contributes everything it has.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub taken_at: Instant,
    pub sched: HashMap<u64, SchedStats>,
}

impl Snapshot {
    pub fn empty(taken_at: Instant) -> Self {
        Self {
            taken_at,
            sched: HashMap::new(),
        }
    }

    pub fn read(probes: &Probes) -> anyhow::Result<Self> {
        let taken_at = Instant::now();
        let sched = sched::read(probes.ebpf())?;
        Ok(Self { taken_at, sched })
    }
}

/// The figures of one cgroup over a window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupWindow {
    pub sched: SchedStats,
}

/// Per-cgroup deltas between two snapshots, accumulated over one or more intervals.
#[derive(Clone, Debug)]
pub struct Window {
    pub duration: Duration,
    pub cgroups: HashMap<u64, CgroupWindow>,
}

impl Window {
    pub fn empty() -> Self {
        Self {
            duration: Duration::ZERO,
            cgroups: HashMap::new(),
        }
    }

    /// The change from `before` to `after`. A counter that went backwards (a cgroup's entry was
    /// removed and re-created) counts from zero rather than underflowing.
    pub fn between(before: &Snapshot, after: &Snapshot) -> Self {
        let mut cgroups = HashMap::new();
        for (id, now) in &after.sched {
            let delta = match before.sched.get(id) {
                Some(then) => sched_delta(now, then),
                None => *now,
            };
            if delta != SchedStats::ZERO {
                cgroups.insert(*id, CgroupWindow { sched: delta });
            }
        }
        Self {
            duration: after.taken_at.saturating_duration_since(before.taken_at),
            cgroups,
        }
    }

    /// Adds a later, adjacent window to this one.
    pub fn extend(&mut self, later: &Window) {
        self.duration += later.duration;
        for (id, w) in &later.cgroups {
            let entry = self.cgroups.entry(*id).or_insert(CgroupWindow {
                sched: SchedStats::ZERO,
            });
            sched::add_sched(&mut entry.sched, &w.sched);
        }
    }
}

fn sched_delta(now: &SchedStats, then: &SchedStats) -> SchedStats {
    let regressed = now.voluntary_switches < then.voluntary_switches
        || now.involuntary_switches < then.involuntary_switches
        || now.oncpu_ns < then.oncpu_ns
        || now.runq.count < then.runq.count;
    if regressed {
        return *now;
    }
    let mut runq = Log2Histogram::ZERO;
    runq.count = now.runq.count - then.runq.count;
    runq.sum_ns = now.runq.sum_ns.saturating_sub(then.runq.sum_ns);
    for b in 0..LOG2_BUCKETS {
        runq.buckets[b] = now.runq.buckets[b].saturating_sub(then.runq.buckets[b]);
    }
    SchedStats {
        voluntary_switches: now.voluntary_switches - then.voluntary_switches,
        involuntary_switches: now.involuntary_switches - then.involuntary_switches,
        migrations: now.migrations.saturating_sub(then.migrations),
        oncpu_ns: now.oncpu_ns - then.oncpu_ns,
        offcpu_ns: now.offcpu_ns.saturating_sub(then.offcpu_ns),
        runq,
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
}
