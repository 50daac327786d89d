//! What the exporter shows: per-cgroup running totals (the sum of every window's deltas since
//! a cgroup was first seen, so each counter is cumulative and monotonic), bounded in number,
//! with removed cgroups kept for a grace period; and the agent's own figures.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::{Duration, Instant},
};

use stormwatch_common::FutexStats;

use crate::{
    collect::{Availability, CgroupWindow, Window},
    diagnose::{Finding, Severity},
    host::Host,
    identity::{
        limits::{CpuCounters, Limits},
        workload::Identity,
    },
    probes::ProbeStatus,
};

pub use super::labels::Labels;

/// One exported cgroup: its series are keyed by its path, so a cgroup re-created under the same
/// path (a new id) continues the same series instead of duplicating them.
#[derive(Clone, Debug)]
pub struct Series {
    /// The id now (or last) behind the path.
    pub cgroup_id: u64,
    pub labels: Labels,
    /// Everything since the cgroup was first seen.
    pub totals: CgroupWindow,
    /// The resource context at the cgroup's last active tick (throttling since the agent
    /// started, or since the cgroup was created).
    pub limits: Option<Limits>,
    /// When the cgroup was found removed; its series go after the grace period.
    pub removed_at: Option<Instant>,
    /// Throttling of the earlier cgroups of this path (a re-created cgroup's cgroupfs counters
    /// start from zero): added, so that the counters stay monotonic.
    pub throttled_base: CpuCounters,
    /// Run-queue wait blamed, in seconds, by culprit label ([`blame_label`]): at most
    /// [`MAX_NAMED_CULPRITS`] other containers by path, the rest as `other`.
    pub blame: BTreeMap<String, f64>,
}

/// Other containers a container's run-queue wait may be blamed on by name in `/metrics`: a
/// window's largest culprits are named while fewer than this many are, and keep their series;
/// the rest add to `other` (bounded cardinality, counters that only grow).
pub const MAX_NAMED_CULPRITS: usize = 5;

/// How many of a window's largest culprits may get a name of their own.
pub const TOP_CULPRITS_PER_WINDOW: usize = 3;

/// The `culprit` label of a blamed wait: `self`, `kernel`, `idle`, `stolen`, `unseen`, or the
/// other cgroup's path (`None`: a cgroup whose path is not known, exported as `other`).
pub fn blame_label(victim: u64, culprit: u64, paths: &HashMap<u64, String>) -> Option<String> {
    use stormwatch_common::culprit as c;
    Some(
        match culprit {
            x if x == victim => "self",
            c::KERNEL => "kernel",
            c::IDLE => "idle",
            c::STOLEN => "stolen",
            c::UNSEEN => "unseen",
            other => return paths.get(&other).cloned(),
        }
        .to_owned(),
    )
}

/// The labels that are not another cgroup's path.
const FIXED_CULPRITS: [&str; 6] = ["self", "kernel", "idle", "stolen", "unseen", "other"];

impl Series {
    /// Adds a window's blamed waits of this container: the window's largest other culprits
    /// (its first [`TOP_CULPRITS_PER_WINDOW`]) by path while fewer than
    /// [`MAX_NAMED_CULPRITS`] are named, those named before by path, the rest as `other`.
    fn add_blame(&mut self, id: u64, pairs: &[(u64, u64)], paths: &HashMap<u64, String>) {
        let mut mine: Vec<(String, f64)> = pairs
            .iter()
            .map(|&(culprit, ns)| {
                let label = blame_label(id, culprit, paths).unwrap_or_else(|| "other".to_owned());
                (label, ns as f64 / 1e9)
            })
            .collect();
        mine.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let mut ranked = 0;
        for (label, secs) in mine {
            let fixed = FIXED_CULPRITS.contains(&label.as_str());
            let label = if fixed || self.blame.contains_key(&label) {
                label
            } else {
                ranked += 1;
                let named = self
                    .blame
                    .keys()
                    .filter(|l| !FIXED_CULPRITS.contains(&l.as_str()))
                    .count();
                if ranked <= TOP_CULPRITS_PER_WINDOW && named < MAX_NAMED_CULPRITS {
                    label
                } else {
                    "other".to_owned()
                }
            };
            *self.blame.entry(label).or_insert(0.0) += secs;
        }
    }

    pub fn has_futex_figures(&self) -> bool {
        self.totals.futex != FutexStats::ZERO
    }

    /// Periods throttled since the agent started (or the path's first cgroup was created).
    pub fn throttled_periods(&self) -> Option<u64> {
        let now = self.limits.as_ref()?.counters.throttled_periods?;
        Some(self.throttled_base.throttled_periods.unwrap_or(0) + now)
    }

    /// Seconds throttled, likewise.
    pub fn throttled_seconds(&self) -> Option<f64> {
        let now = self.limits.as_ref()?.counters.throttled_seconds?;
        Some(self.throttled_base.throttled_seconds.unwrap_or(0.0) + now)
    }
}

/// What one tick brings.
pub struct Tick<'a> {
    pub window: &'a Window,
    /// Paths of the cgroups seen (including ones removed since, until forgotten).
    pub paths: &'a HashMap<u64, String>,
    pub identities: &'a HashMap<u64, Identity>,
    /// Limits of the cgroups active in the window that still exist.
    pub limits: &'a HashMap<u64, Limits>,
    pub now: Instant,
}

/// Per-cgroup running totals, at most `max_cgroups` of them.
#[derive(Debug)]
pub struct Cgroups {
    max_cgroups: usize,
    grace: Duration,
    /// By path relative to the v2 root: the exposition's order.
    series: BTreeMap<String, Series>,
    /// Live ids → path.
    ids: HashMap<u64, String>,
    /// Live ids refused for want of room: counted once each, admitted when room frees up.
    refused: HashSet<u64>,
    /// Cgroups refused because `max_cgroups` were tracked.
    pub dropped_total: u64,
    /// Cgroups with figures whose path could not be known (removed before it was resolved).
    pub unresolved_total: u64,
}

impl Cgroups {
    pub fn new(max_cgroups: usize, grace: Duration) -> Self {
        Self {
            max_cgroups,
            grace,
            series: BTreeMap::new(),
            ids: HashMap::new(),
            refused: HashSet::new(),
            dropped_total: 0,
            unresolved_total: 0,
        }
    }

    pub fn max_cgroups(&self) -> usize {
        self.max_cgroups
    }

    /// Exported series by path.
    pub fn series(&self) -> &BTreeMap<String, Series> {
        &self.series
    }

    /// Series of removed cgroups still in their grace period.
    pub fn removed(&self) -> usize {
        self.series
            .values()
            .filter(|s| s.removed_at.is_some())
            .count()
    }

    /// Whether a live id is exported.
    pub fn tracks(&self, id: u64) -> bool {
        self.ids.contains_key(&id)
    }

    /// Adds a tick's deltas, admits new cgroups while there is room, and retires the series of
    /// cgroups that `alive` says are gone once their grace period is over.
    pub fn apply(&mut self, tick: &Tick, alive: impl Fn(u64) -> bool) {
        let mut ids: Vec<(&u64, &CgroupWindow)> = tick.window.cgroups.iter().collect();
        // Admission in id order (ids are inode numbers: roughly creation order), so that which
        // cgroups are refused when there is no room does not depend on hash order.
        ids.sort_unstable_by_key(|(id, _)| **id);
        let blame = tick.window.blame_by_victim();
        for (&id, delta) in ids {
            let path = match self.ids.get(&id) {
                Some(path) => path.clone(),
                None => {
                    let Some(path) = tick.paths.get(&id) else {
                        self.unresolved_total += 1;
                        continue;
                    };
                    if !self.series.contains_key(path) && self.series.len() >= self.max_cgroups {
                        if self.refused.insert(id) {
                            self.dropped_total += 1;
                            // Counted always; logged at the 1st, 2nd, 4th, 8th… refusal.
                            if self.dropped_total.is_power_of_two() {
                                log::warn!(
                                    "not exporting cgroup {path}: {} cgroups tracked already \
                                     (max_cgroups); {} refused so far \
                                     (stormwatch_cgroups_dropped_total)",
                                    self.series.len(),
                                    self.dropped_total
                                );
                            }
                        }
                        continue;
                    }
                    self.refused.remove(&id);
                    self.ids.insert(id, path.clone());
                    path.clone()
                }
            };
            let series = self.series.entry(path).or_insert_with(|| Series {
                cgroup_id: id,
                labels: Labels::default(),
                totals: CgroupWindow::ZERO,
                limits: None,
                removed_at: None,
                throttled_base: CpuCounters::default(),
                blame: BTreeMap::new(),
            });
            // A path taken over by a new id (re-created cgroup) continues its series.
            if series.cgroup_id != id {
                if let Some(old) = series.limits.take() {
                    series.throttled_base.add(&old.counters);
                }
                series.cgroup_id = id;
            }
            series.removed_at = None;
            series.totals.add(delta);
            if let Some(pairs) = blame.get(&id) {
                series.add_blame(id, pairs, tick.paths);
            }
            if let Some(identity) = tick.identities.get(&id) {
                series.labels = Labels::of(Some(identity));
            }
            if let Some(limits) = tick.limits.get(&id) {
                series.limits = Some(limits.clone());
            }
        }

        let gone: Vec<u64> = self.ids.keys().copied().filter(|id| !alive(*id)).collect();
        for id in gone {
            if let Some(path) = self.ids.remove(&id)
                && let Some(series) = self.series.get_mut(&path)
                && series.cgroup_id == id
            {
                series.removed_at.get_or_insert(tick.now);
            }
        }
        let grace = self.grace;
        self.series.retain(|_, s| {
            s.removed_at
                .is_none_or(|at| tick.now.saturating_duration_since(at) < grace)
        });
        self.refused.retain(|id| alive(*id));
    }
}

/// A histogram of durations with fixed buckets (seconds).
#[derive(Clone, Debug)]
pub struct DurationHistogram {
    /// Upper bounds, ascending; `+Inf` is implied.
    pub bounds: &'static [f64],
    /// Observations per bucket (not cumulative); one more than `bounds`, for `+Inf`.
    pub counts: Vec<u64>,
    pub sum_seconds: f64,
}

impl DurationHistogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum_seconds: 0.0,
        }
    }

    pub fn observe(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        let i = self
            .bounds
            .iter()
            .position(|b| s <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum_seconds += s;
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// Buckets of `stormwatch_collection_duration_seconds`.
pub const COLLECTION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

pub use crate::probes::ProgramStats;

/// A finding of the last diagnosis, shown as `stormwatch_finding{…} 1` while it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct ActiveFinding {
    pub kind: &'static str,
    pub severity: &'static str,
    pub cgroup: String,
    pub labels: Labels,
    /// A lock storm's named call sites: (`waiter` or `waker`, the site), of the pair with the
    /// most sampled hand-offs, and that pair's share of them.
    pub call_sites: Vec<(&'static str, String)>,
    pub call_site_share: f64,
}

impl ActiveFinding {
    pub fn new(f: &Finding, identity: Option<&Identity>) -> Self {
        let (call_sites, call_site_share) = match &f.lock_pair {
            Some(p) => (
                vec![("waiter", p.waiter.clone()), ("waker", p.waker.clone())],
                p.share,
            ),
            None => (Vec::new(), 0.0),
        };
        Self {
            kind: f.kind.as_str(),
            severity: severity_name(f.severity),
            cgroup: f.cgroup.clone(),
            labels: Labels::of(identity),
            call_sites,
            call_site_share,
        }
    }
}

pub fn severity_name(s: Severity) -> &'static str {
    match s {
        Severity::Info => "info",
        Severity::Warning => "warning",
        Severity::Critical => "critical",
    }
}

pub const SEVERITIES: [&str; 3] = ["info", "warning", "critical"];

/// Everything `/metrics` shows. The collection loop owns the updates; the renderer reads it.
#[derive(Debug)]
pub struct Exporter {
    pub cgroups: Cgroups,
    /// Which figures exist (from which probes are attached); none before attach.
    pub avail: Availability,
    pub probes: Vec<ProbeStatus>,
    pub lost_events: Vec<(&'static str, u64)>,
    pub programs: Vec<ProgramStats>,
    pub bpf_stats_enabled: bool,
    /// Export the latency histograms' buckets (the config's `histograms`).
    pub histograms: bool,
    pub findings: Vec<ActiveFinding>,
    pub collection_errors: u64,
    /// JVM thread dumps taken, and attempts that failed, since the agent started.
    pub jvm_thread_dumps: (u64, u64),
    pub collection_duration: DurationHistogram,
    pub last_collection_unix_seconds: Option<f64>,
    /// The previous rendering: how long it took and how large it was.
    pub render_seconds: f64,
    pub exposition_bytes: usize,
    /// Per-interface figures, drops and the MTU inventory.
    pub network: super::network::NetworkSeries,
    /// The host, read once at start; `None` before.
    pub host: Option<Host>,
    /// CPU time the hypervisor stole from the host since boot (`/proc/stat`), at the last
    /// collection; `None` when it could not be read.
    pub host_steal_seconds: Option<f64>,
    /// Connections the HTTP server closed to stay within `http_max_connections`: it counts,
    /// the rendering reads.
    pub http_shed: std::sync::Arc<super::server::Shed>,
    /// The sizes of the agent's caches at the last collection.
    pub caches: Vec<crate::memory::CacheSize>,
}

impl Exporter {
    pub fn new(max_cgroups: usize, grace: Duration) -> Self {
        Self {
            cgroups: Cgroups::new(max_cgroups, grace),
            avail: Availability::default(),
            probes: Vec::new(),
            lost_events: Vec::new(),
            programs: Vec::new(),
            bpf_stats_enabled: false,
            histograms: true,
            findings: Vec::new(),
            collection_errors: 0,
            jvm_thread_dumps: (0, 0),
            collection_duration: DurationHistogram::new(COLLECTION_BUCKETS),
            last_collection_unix_seconds: None,
            render_seconds: 0.0,
            exposition_bytes: 0,
            network: super::network::NetworkSeries::default(),
            host: None,
            host_steal_seconds: None,
            http_shed: std::sync::Arc::default(),
            caches: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(switches: u64) -> CgroupWindow {
        let mut w = CgroupWindow::ZERO;
        w.sched.voluntary_switches = switches;
        w.sched.runq.record(1500);
        w
    }

    struct World {
        paths: HashMap<u64, String>,
        identities: HashMap<u64, Identity>,
        limits: HashMap<u64, Limits>,
        alive: HashSet<u64>,
    }

    impl World {
        fn new() -> Self {
            Self {
                paths: HashMap::new(),
                identities: HashMap::new(),
                limits: HashMap::new(),
                alive: HashSet::new(),
            }
        }
        fn add(&mut self, id: u64, path: &str) {
            self.paths.insert(id, path.to_owned());
            self.alive.insert(id);
        }
        fn tick(&self, c: &mut Cgroups, deltas: &[(u64, u64)], now: Instant) {
            let mut window = Window::empty();
            for (id, n) in deltas {
                window.cgroups.insert(*id, delta(*n));
            }
            let tick = Tick {
                window: &window,
                paths: &self.paths,
                identities: &self.identities,
                limits: &self.limits,
                now,
            };
            c.apply(&tick, |id| self.alive.contains(&id));
        }
    }

    fn switches(c: &Cgroups, path: &str) -> u64 {
        c.series()[path].totals.sched.voluntary_switches
    }

    #[test]
    fn blamed_waits_name_a_containers_largest_culprits_and_the_rest_as_other() {
        use stormwatch_common::{RunqBlameKey, RunqBlameValue, culprit};
        let mut w = World::new();
        let cgroups = [
            (1, "/victim"),
            (2, "/a"),
            (3, "/b"),
            (4, "/c"),
            (5, "/d"),
            (6, "/e"),
            (7, "/f"),
        ];
        for (id, path) in cgroups {
            w.add(id, path);
        }
        let mut c = Cgroups::new(10, Duration::from_secs(60));
        let tick = |c: &mut Cgroups, pairs: &[(u64, u64)]| {
            let mut window = Window::empty();
            window.cgroups.insert(1, delta(1));
            for &(culprit, ms) in pairs {
                window.runq_blame.insert(
                    RunqBlameKey { victim: 1, culprit },
                    RunqBlameValue { ns: ms * 1_000_000 },
                );
            }
            // Another victim's pairs are not this one's.
            window.runq_blame.insert(
                RunqBlameKey {
                    victim: 2,
                    culprit: 1,
                },
                RunqBlameValue { ns: 7_000_000_000 },
            );
            let tick = Tick {
                window: &window,
                paths: &w.paths,
                identities: &w.identities,
                limits: &w.limits,
                now: Instant::now(),
            };
            c.apply(&tick, |id| w.alive.contains(&id));
        };
        // The window's three largest others are named (`/a`, `/c`, `/d`); `/b`, fourth, and a
        // cgroup whose path is not known are `other`; its own threads are `self`.
        tick(
            &mut c,
            &[
                (2, 1000),
                (3, 100),
                (4, 500),
                (5, 400),
                (1, 500),
                (culprit::KERNEL, 250),
                (99, 1000),
            ],
        );
        // Named ones keep their series; two more may be named (`/e`, `/f`); then no more: `/b`
        // stays `other` although it is the largest of this window.
        tick(
            &mut c,
            &[(6, 200), (7, 100), (2, 1000), (culprit::IDLE, 1000)],
        );
        tick(&mut c, &[(3, 3000), (4, 1000)]);
        let blame = &c.series()["/victim"].blame;
        let got: Vec<(&str, f64)> = blame
            .iter()
            .map(|(k, v)| (k.as_str(), (v * 1e6).round() / 1e6))
            .collect();
        assert_eq!(
            got,
            vec![
                ("/a", 2.0),
                ("/c", 1.5),
                ("/d", 0.4),
                ("/e", 0.2),
                ("/f", 0.1),
                ("idle", 1.0),
                ("kernel", 0.25),
                ("other", 4.1),
                ("self", 0.5),
            ]
        );
    }

    #[test]
    fn totals_are_cumulative_from_the_first_delta() {
        let mut w = World::new();
        w.add(1, "/a");
        w.identities.insert(
            1,
            Identity {
                namespace: Some("shop".into()),
                pod: Some("web-1".into()),
                container: Some("app".into()),
                ..Identity::default()
            },
        );
        let mut c = Cgroups::new(10, Duration::from_secs(60));
        let t0 = Instant::now();
        w.tick(&mut c, &[(1, 5)], t0);
        w.tick(&mut c, &[], t0 + Duration::from_secs(1));
        w.tick(&mut c, &[(1, 7)], t0 + Duration::from_secs(2));
        assert_eq!(switches(&c, "/a"), 12);
        assert_eq!(c.series()["/a"].totals.sched.runq.count, 2);
        assert_eq!(c.series()["/a"].labels.pod, "web-1");
        assert!(c.tracks(1));
    }

    #[test]
    fn removed_cgroups_stay_for_the_grace_period_then_go() {
        let mut w = World::new();
        w.add(1, "/a");
        w.add(2, "/b");
        let mut c = Cgroups::new(10, Duration::from_secs(60));
        let t0 = Instant::now();
        w.tick(&mut c, &[(1, 1), (2, 1)], t0);
        // /a goes; its last delta arrives in the tick that finds it gone.
        w.alive.remove(&1);
        w.tick(&mut c, &[(1, 4)], t0 + Duration::from_secs(1));
        assert_eq!(switches(&c, "/a"), 5, "the final increase is kept");
        assert!(c.series()["/a"].removed_at.is_some());
        assert_eq!(c.removed(), 1);
        w.tick(&mut c, &[], t0 + Duration::from_secs(60));
        assert!(
            c.series().contains_key("/a"),
            "still within the grace period"
        );
        w.tick(&mut c, &[], t0 + Duration::from_secs(62));
        assert!(!c.series().contains_key("/a"));
        assert!(c.series().contains_key("/b"));
    }

    #[test]
    fn a_recreated_cgroup_continues_its_series() {
        let mut w = World::new();
        w.add(1, "/a");
        let throttled = |periods, seconds| Limits {
            counters: CpuCounters {
                throttled_periods: Some(periods),
                throttled_seconds: Some(seconds),
                ..CpuCounters::default()
            },
            ..Limits::default()
        };
        w.limits.insert(1, throttled(10, 2.0));
        let mut c = Cgroups::new(10, Duration::from_secs(60));
        let t0 = Instant::now();
        w.tick(&mut c, &[(1, 3)], t0);
        w.alive.remove(&1);
        w.tick(&mut c, &[], t0 + Duration::from_secs(1));
        w.add(9, "/a");
        w.limits.insert(9, throttled(1, 0.5));
        w.tick(&mut c, &[(9, 2)], t0 + Duration::from_secs(2));
        let s = &c.series()["/a"];
        assert_eq!(
            s.throttled_periods(),
            Some(11),
            "the first cgroup's 10, then 1"
        );
        assert_eq!(s.throttled_seconds(), Some(2.5));
        assert_eq!(
            s.totals.sched.voluntary_switches, 5,
            "monotonic across re-creation"
        );
        assert_eq!(s.cgroup_id, 9);
        assert!(s.removed_at.is_none());
        assert_eq!(c.series().len(), 1, "never two series for one path");
    }

    #[test]
    fn the_cap_refuses_new_cgroups_and_counts_each_once() {
        let mut w = World::new();
        for id in 1..=4 {
            w.add(id, &format!("/c{id}"));
        }
        let mut c = Cgroups::new(2, Duration::from_secs(0));
        let t0 = Instant::now();
        w.tick(&mut c, &[(1, 1), (2, 1), (3, 1), (4, 1)], t0);
        assert_eq!(c.series().len(), 2);
        assert!(c.series().contains_key("/c1") && c.series().contains_key("/c2"));
        assert_eq!(c.dropped_total, 2);
        w.tick(&mut c, &[(3, 1), (4, 1)], t0 + Duration::from_secs(1));
        assert_eq!(c.dropped_total, 2, "a refused cgroup is counted once");
        // Room frees up: a refused cgroup is admitted, counting from then.
        w.alive.remove(&1);
        w.tick(&mut c, &[], t0 + Duration::from_secs(2));
        w.tick(&mut c, &[(3, 6)], t0 + Duration::from_secs(3));
        assert_eq!(switches(&c, "/c3"), 6);
        assert_eq!(c.series().len(), 2);
    }

    #[test]
    fn unresolved_cgroups_are_counted_not_exported() {
        let w = World::new();
        let mut c = Cgroups::new(10, Duration::from_secs(60));
        w.tick(&mut c, &[(77, 1)], Instant::now());
        assert!(c.series().is_empty());
        assert_eq!(c.unresolved_total, 1);
    }

    #[test]
    fn duration_histogram_buckets() {
        let mut h = DurationHistogram::new(COLLECTION_BUCKETS);
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(1));
        h.observe(Duration::from_secs(9));
        assert_eq!(h.counts[0], 2, "bounds are inclusive");
        assert_eq!(h.counts[COLLECTION_BUCKETS.len()], 1);
        assert_eq!(h.count(), 3);
        assert!((h.sum_seconds - 9.0015).abs() < 1e-9);
    }
}
