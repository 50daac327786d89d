//! The `trace` report: a window's figures per cgroup, in the JSON shape scripts rely on.
//!
//! A figure whose probe is not attached is `null`, never zero: a missing probe is better than
//! a wrong number.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use stormwatch_common::SchedStats;

use crate::{
    collect::{Window, log2_quantile_ns},
    probes::ProbeStatus,
};

const NS: f64 = 1e9;

#[derive(Clone, Debug, Serialize)]
pub struct TraceReport {
    pub duration_seconds: f64,
    pub containers: Vec<ContainerReport>,
    /// Each probe, and how it is attached (or why not).
    pub probes: Vec<ProbeStatus>,
    /// Events the probes could not record, by reason, since attach.
    pub lost_events: BTreeMap<&'static str, u64>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ContainerReport {
    /// Path relative to the v2 root; `null` when the cgroup was removed before it was resolved.
    pub cgroup: Option<String>,
    pub cgroup_id: u64,
    pub context_switches: Option<ContextSwitches>,
    pub migrations: Option<u64>,
    pub oncpu_seconds: Option<f64>,
    pub offcpu_seconds: Option<f64>,
    pub runqueue_latency: Option<LatencySummary>,
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct ContextSwitches {
    pub voluntary: u64,
    pub involuntary: u64,
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub sum_seconds: f64,
    /// Upper edge of the log2 bucket holding the median: the true median is at most this and
    /// more than half of it. `null` when there were no samples.
    pub p50_seconds: Option<f64>,
    pub p99_seconds: Option<f64>,
}

/// Which scheduler figures can be trusted, from which probes are attached.
#[derive(Clone, Copy, Debug, Default)]
pub struct SchedAvailability {
    /// sched_switch: switches, migrations, on-CPU time.
    pub switch: bool,
    /// sched_wakeup + sched_wakeup_new too: off-CPU time and run-queue latency.
    pub wakeup: bool,
}

impl SchedAvailability {
    pub fn from_status(status: &[ProbeStatus]) -> Self {
        let attached = |tp: &str| status.iter().any(|s| s.tracepoint == tp && s.attached());
        let switch = attached(crate::probes::sched::SWITCH);
        Self {
            switch,
            wakeup: switch
                && attached(crate::probes::sched::WAKEUP)
                && attached(crate::probes::sched::WAKEUP_NEW),
        }
    }
}

pub fn container_report(
    cgroup_id: u64,
    cgroup: Option<String>,
    s: &SchedStats,
    avail: SchedAvailability,
) -> ContainerReport {
    let secs = |ns: u64| ns as f64 / NS;
    let runq = LatencySummary {
        count: s.runq.count,
        sum_seconds: secs(s.runq.sum_ns),
        p50_seconds: log2_quantile_ns(&s.runq, 0.50).map(secs),
        p99_seconds: log2_quantile_ns(&s.runq, 0.99).map(secs),
    };
    let sw = avail.switch;
    let wk = avail.wakeup;
    ContainerReport {
        cgroup,
        cgroup_id,
        context_switches: sw.then_some(ContextSwitches {
            voluntary: s.voluntary_switches,
            involuntary: s.involuntary_switches,
        }),
        migrations: sw.then_some(s.migrations),
        oncpu_seconds: sw.then_some(secs(s.oncpu_ns)),
        offcpu_seconds: wk.then_some(secs(s.offcpu_ns)),
        runqueue_latency: wk.then_some(runq),
    }
}

/// The containers of a window, busiest (most on-CPU time, then most switches) first.
pub fn containers(
    window: &Window,
    paths: &HashMap<u64, String>,
    avail: SchedAvailability,
    keep: impl Fn(u64, Option<&str>) -> bool,
) -> Vec<ContainerReport> {
    let mut rows: Vec<(&u64, &SchedStats)> = window
        .cgroups
        .iter()
        .map(|(id, w)| (id, &w.sched))
        .filter(|(id, _)| keep(**id, paths.get(id).map(String::as_str)))
        .collect();
    rows.sort_by(|(ia, a), (ib, b)| {
        let switches = |s: &SchedStats| s.voluntary_switches + s.involuntary_switches;
        b.oncpu_ns
            .cmp(&a.oncpu_ns)
            .then(switches(b).cmp(&switches(a)))
            .then(ia.cmp(ib))
    });
    rows.into_iter()
        .map(|(id, s)| container_report(*id, paths.get(id).cloned(), s, avail))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::CgroupWindow;
    use std::time::Duration;

    fn stats(oncpu_ns: u64, vol: u64) -> SchedStats {
        let mut s = SchedStats::ZERO;
        s.oncpu_ns = oncpu_ns;
        s.voluntary_switches = vol;
        s.involuntary_switches = 1;
        s.runq.record(1500);
        s
    }

    fn window() -> Window {
        let mut w = Window::empty();
        w.duration = Duration::from_secs(5);
        for (id, on, vol) in [(10, 5, 100), (20, 50, 1), (30, 5, 200)] {
            w.cgroups.insert(
                id,
                CgroupWindow {
                    sched: stats(on, vol),
                },
            );
        }
        w
    }

    const ALL: SchedAvailability = SchedAvailability {
        switch: true,
        wakeup: true,
    };

    #[test]
    fn busiest_first_and_filtered() {
        let paths = HashMap::from([(10, "/a".to_owned()), (20, "/b".to_owned())]);
        let rows = containers(&window(), &paths, ALL, |_, _| true);
        let ids: Vec<u64> = rows.iter().map(|r| r.cgroup_id).collect();
        assert_eq!(ids, [20, 30, 10]);
        assert_eq!(rows[2].cgroup.as_deref(), Some("/a"));
        assert_eq!(rows[1].cgroup, None);
        let only_a = containers(&window(), &paths, ALL, |_, p| p == Some("/a"));
        assert_eq!(only_a.len(), 1);
    }

    #[test]
    fn json_shape_is_the_contract() {
        let r = container_report(7, Some("/x".into()), &stats(2_500_000_000, 3), ALL);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["cgroup"], "/x");
        assert_eq!(v["cgroup_id"], 7);
        assert_eq!(v["context_switches"]["voluntary"], 3);
        assert_eq!(v["context_switches"]["involuntary"], 1);
        assert_eq!(v["migrations"], 0);
        assert_eq!(v["oncpu_seconds"], 2.5);
        assert_eq!(v["offcpu_seconds"], 0.0);
        assert_eq!(v["runqueue_latency"]["count"], 1);
        assert_eq!(v["runqueue_latency"]["sum_seconds"], 1.5e-6);
        assert_eq!(v["runqueue_latency"]["p50_seconds"], 2047e-9);
        assert_eq!(v["runqueue_latency"]["p99_seconds"], 2047e-9);
    }

    #[test]
    fn figures_of_missing_probes_are_null() {
        let no_wakeup = SchedAvailability {
            switch: true,
            wakeup: false,
        };
        let v = serde_json::to_value(container_report(7, None, &stats(1, 1), no_wakeup)).unwrap();
        assert!(v["offcpu_seconds"].is_null());
        assert!(v["runqueue_latency"].is_null());
        assert_eq!(v["context_switches"]["voluntary"], 1);
        let none = container_report(7, None, &stats(1, 1), SchedAvailability::default());
        assert_eq!(none.context_switches, None);
        assert_eq!(none.oncpu_seconds, None);
    }
}
