//! Diagnosis: rules over per-container windows → findings an SRE can act on.
//!
//! Rules are pure functions of [`Facts`] (one container's figures over a window, with its
//! resource context) and [`Thresholds`]; no I/O, so they are tested on synthetic windows.

mod facts;
pub mod network;
pub mod rules;
pub mod session;

pub use facts::{
    Culprit, Facts, FactsContext, GoMutexWait, Handoffs, HostFacts, RunqBlame, TopLock,
    VirtualThreadWaits, facts,
};

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::identity::workload::Identity;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    LockStorm,
    CpuThrottling,
    RunqueueSaturation,
    ThreadOversubscription,
    RuntimeSizing,
    MtuMismatch,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::LockStorm => "lock_storm",
            Kind::CpuThrottling => "cpu_throttling",
            Kind::RunqueueSaturation => "runqueue_saturation",
            Kind::ThreadOversubscription => "thread_oversubscription",
            Kind::RuntimeSizing => "runtime_sizing",
            Kind::MtuMismatch => "mtu_mismatch",
        }
    }
}

/// A rule's verdict on one container.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    pub kind: Kind,
    pub severity: Severity,
    pub cgroup_id: u64,
    pub cgroup: String,
    pub summary: String,
    /// The figures the rule used, by name, in base units.
    pub evidence: BTreeMap<&'static str, f64>,
    /// What the rule used that is not a figure, by name (e.g. `hypervisor`: `kvm`, or `none`
    /// on bare metal); a name is absent when it was not known.
    pub context: BTreeMap<&'static str, String>,
    pub recommendations: Vec<String>,
    /// The lock's code, where the finding names it: read by the exporter
    /// (`stormwatch_finding`'s call-site labels); documents show it as the context's
    /// `waiter_site` and `waker_site` and the evidence's `top_pair_share`
    /// (`Finding::name_lock_pair` writes all three).
    #[serde(skip)]
    pub lock_pair: Option<LockPair>,
}

/// The pair of call sites with the most sampled hand-offs (or the Go mutex uprobes' top pair):
/// the code that waits for the lock and the code that hands it on, and the pair's share of the
/// samples.
#[derive(Clone, Debug, PartialEq)]
pub struct LockPair {
    pub waiter: String,
    pub waker: String,
    pub share: f64,
}

/// Thresholds of the rules. Each default is a named constant with the reason for its value in
/// [`rules`]; the config file may override any of them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Thresholds {
    pub storm_min_threads_per_cpu: f64,
    pub storm_min_queued_threads_per_cpu: f64,
    pub storm_min_futex_blocked_share: f64,
    pub storm_min_handoffs_per_cpu_second: f64,
    pub storm_min_convoy_handoffs_per_cpu_second: f64,
    pub storm_saturated_runnable_per_cpu: f64,
    pub storm_serial_max_cpus_wanted: f64,
    pub storm_quota_bound_max_handoffs_per_cpu_second_used: f64,
    pub storm_max_timeout_share: f64,
    pub storm_critical_lock_wait_share: f64,
    pub storm_near_line_factor: f64,
    pub storm_min_virtual_handoffs_per_cpu_second: f64,
    pub go_storm_min_mutex_cpu_share: f64,
    pub go_storm_critical_mutex_cpu_share: f64,
    pub pg_storm_min_waiting_backends_per_cpu: f64,
    pub storm_high_migrations_per_second: f64,
    pub storm_significant_spin_wait: f64,
    pub storm_high_remote_wakeup_share: f64,
    pub storm_significant_steal_share: f64,
    pub storm_node_sized_min_host_per_allowed_cpu: f64,
    pub runtime_min_handoffs_per_cpu_second: f64,
    pub runtime_event_loops_min_per_cpu: f64,
    pub runtime_event_loops_near_line_factor: f64,
    pub runtime_event_loops_min_wakes_per_cpu_second: f64,
    pub runtime_event_loops_max_cpu_seconds_per_wake: f64,
    pub throttling_min_throttled_share: f64,
    pub throttling_critical_throttled_share: f64,
    pub runq_min_mean_seconds: f64,
    pub runq_min_p99_seconds: f64,
    pub runq_critical_mean_seconds: f64,
    pub runq_blame_name_share: f64,
    pub oversubscription_min_runnable_per_cpu: f64,
    pub mtu_min_evidence_events: f64,
    pub mtu_critical_losses: f64,
    pub mtu_jumbo_min_underlay: f64,
    pub mtu_jumbo_max_used_share: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        use rules::defaults::*;
        Self {
            storm_min_threads_per_cpu: STORM_MIN_THREADS_PER_CPU,
            storm_min_queued_threads_per_cpu: STORM_MIN_QUEUED_THREADS_PER_CPU,
            storm_min_futex_blocked_share: STORM_MIN_FUTEX_BLOCKED_SHARE,
            storm_min_handoffs_per_cpu_second: STORM_MIN_HANDOFFS_PER_CPU_SECOND,
            storm_min_convoy_handoffs_per_cpu_second: STORM_MIN_CONVOY_HANDOFFS_PER_CPU_SECOND,
            storm_saturated_runnable_per_cpu: STORM_SATURATED_RUNNABLE_PER_CPU,
            storm_serial_max_cpus_wanted: STORM_SERIAL_MAX_CPUS_WANTED,
            storm_quota_bound_max_handoffs_per_cpu_second_used:
                STORM_QUOTA_BOUND_MAX_HANDOFFS_PER_CPU_SECOND_USED,
            storm_max_timeout_share: STORM_MAX_TIMEOUT_SHARE,
            storm_critical_lock_wait_share: STORM_CRITICAL_LOCK_WAIT_SHARE,
            storm_near_line_factor: STORM_NEAR_LINE_FACTOR,
            storm_min_virtual_handoffs_per_cpu_second: STORM_MIN_VIRTUAL_HANDOFFS_PER_CPU_SECOND,
            go_storm_min_mutex_cpu_share: GO_STORM_MIN_MUTEX_CPU_SHARE,
            go_storm_critical_mutex_cpu_share: GO_STORM_CRITICAL_MUTEX_CPU_SHARE,
            pg_storm_min_waiting_backends_per_cpu: PG_STORM_MIN_WAITING_BACKENDS_PER_CPU,
            storm_high_migrations_per_second: STORM_HIGH_MIGRATIONS_PER_SECOND,
            storm_significant_spin_wait: STORM_SIGNIFICANT_SPIN_WAIT,
            storm_high_remote_wakeup_share: STORM_HIGH_REMOTE_WAKEUP_SHARE,
            storm_significant_steal_share: STORM_SIGNIFICANT_STEAL_SHARE,
            storm_node_sized_min_host_per_allowed_cpu: STORM_NODE_SIZED_MIN_HOST_PER_ALLOWED_CPU,
            runtime_min_handoffs_per_cpu_second: RUNTIME_MIN_HANDOFFS_PER_CPU_SECOND,
            runtime_event_loops_min_per_cpu: RUNTIME_EVENT_LOOPS_MIN_PER_CPU,
            runtime_event_loops_near_line_factor: RUNTIME_EVENT_LOOPS_NEAR_LINE_FACTOR,
            runtime_event_loops_min_wakes_per_cpu_second:
                RUNTIME_EVENT_LOOPS_MIN_WAKES_PER_CPU_SECOND,
            runtime_event_loops_max_cpu_seconds_per_wake:
                RUNTIME_EVENT_LOOPS_MAX_CPU_SECONDS_PER_WAKE,
            throttling_min_throttled_share: THROTTLING_MIN_THROTTLED_SHARE,
            throttling_critical_throttled_share: THROTTLING_CRITICAL_THROTTLED_SHARE,
            runq_min_mean_seconds: RUNQ_MIN_MEAN_SECONDS,
            runq_min_p99_seconds: RUNQ_MIN_P99_SECONDS,
            runq_critical_mean_seconds: RUNQ_CRITICAL_MEAN_SECONDS,
            runq_blame_name_share: RUNQ_BLAME_NAME_SHARE,
            oversubscription_min_runnable_per_cpu: OVERSUBSCRIPTION_MIN_RUNNABLE_PER_CPU,
            mtu_min_evidence_events: network::defaults::MTU_MIN_EVIDENCE_EVENTS,
            mtu_critical_losses: network::defaults::MTU_CRITICAL_LOSSES,
            mtu_jumbo_min_underlay: network::defaults::MTU_JUMBO_MIN_UNDERLAY,
            mtu_jumbo_max_used_share: network::defaults::MTU_JUMBO_MAX_USED_SHARE,
        }
    }
}

/// What a rule judges.
#[derive(Clone, Copy)]
pub enum Judge {
    /// One container's facts, with the whole host's (to name a noisy neighbour).
    Container(fn(&Facts, &[Facts], &Thresholds) -> Option<Finding>),
    /// The network over the window: every namespace's interfaces and what containers sent.
    Network(fn(&network::NetFacts, &Thresholds) -> Vec<Finding>),
}

/// One rule: its kind, what it judges, and the kind whose finding on the same container says
/// all this one would.
pub struct Rule {
    pub kind: Kind,
    pub judge: Judge,
    /// Say nothing where this kind was found on the same container.
    pub quiet_under: Option<Kind>,
}

/// Every rule, the one list: what runs, and what `diagnose` says it checked.
pub static RULES: &[Rule] = &[
    Rule {
        kind: Kind::LockStorm,
        judge: Judge::Container(|f, _, t| rules::lock_storm(f, t)),
        quiet_under: None,
    },
    Rule {
        kind: Kind::CpuThrottling,
        judge: Judge::Container(|f, _, t| rules::cpu_throttling(f, t)),
        quiet_under: None,
    },
    Rule {
        kind: Kind::RunqueueSaturation,
        judge: Judge::Container(rules::runqueue_saturation),
        quiet_under: None,
    },
    // Oversubscription is the early warning; once it is a storm, the storm says it all. A
    // storm only possible (near a line) says nothing for certain, so the threads runnable —
    // measured, not near any line of the storm's — are still said (Tomcat's pool of 200 in the
    // corpus: a possible storm hid 12.8 runnable threads per CPU).
    Rule {
        kind: Kind::ThreadOversubscription,
        judge: Judge::Container(|f, _, t| rules::thread_oversubscription(f, t)),
        quiet_under: Some(Kind::LockStorm),
    },
    Rule {
        kind: Kind::RuntimeSizing,
        judge: Judge::Container(|f, _, t| rules::runtime_sizing(f, t)),
        quiet_under: None,
    },
    Rule {
        kind: Kind::MtuMismatch,
        judge: Judge::Network(network::diagnose_network),
        quiet_under: None,
    },
];

/// Runs every container rule on one container (`all`: the whole host's facts).
pub fn check_all(f: &Facts, all: &[Facts], t: &Thresholds) -> Vec<Finding> {
    let mut out: Vec<Finding> = RULES
        .iter()
        .filter_map(|r| match r.judge {
            Judge::Container(judge) => judge(f, all, t),
            Judge::Network(_) => None,
        })
        .collect();
    // Only a verdict said quiets another: a possible one decides nothing.
    let found: Vec<Kind> = out
        .iter()
        .filter(|x| !x.is_possible())
        .map(|x| x.kind)
        .collect();
    out.retain(|x| {
        !RULES
            .iter()
            .any(|r| r.kind == x.kind && r.quiet_under.is_some_and(|q| found.contains(&q)))
    });
    out
}

/// Runs every network rule over the window's network.
pub fn judge_network(f: &network::NetFacts, t: &Thresholds) -> Vec<Finding> {
    RULES
        .iter()
        .flat_map(|r| match r.judge {
            Judge::Network(judge) => judge(f, t),
            Judge::Container(_) => Vec::new(),
        })
        .collect()
}

/// Runs every rule on every container; findings ranked by severity, then by container.
/// `all` is the whole host's facts, so that a rule can name a noisy neighbour.
pub fn diagnose(all: &[Facts], t: &Thresholds) -> Vec<Finding> {
    let mut findings: Vec<Finding> = all.iter().flat_map(|f| check_all(f, all, t)).collect();
    sort_findings(&mut findings);
    findings
}

/// The order findings are reported in: most severe first, then by kind and container.
pub fn sort_findings(findings: &mut [Finding]) {
    findings.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(a.kind.cmp(&b.kind))
            .then(a.cgroup.cmp(&b.cgroup))
    });
}

/// Online CPUs of the host (see [`crate::host::online_cpus`]).
pub fn host_cpus() -> u32 {
    crate::host::online_cpus()
}

impl Finding {
    /// The one constructor of a finding, for every rule: of `owner` (cgroup id, path), its
    /// context empty until the rule adds to it.
    pub(crate) fn new(
        kind: Kind,
        severity: Severity,
        (cgroup_id, cgroup): (u64, String),
        summary: String,
        evidence: BTreeMap<&'static str, f64>,
        recommendations: Vec<String>,
    ) -> Self {
        Self {
            kind,
            severity,
            cgroup_id,
            cgroup,
            summary,
            evidence,
            context: BTreeMap::new(),
            recommendations,
            lock_pair: None,
        }
    }

    /// Whether the rule said only that its kind is possible (a figure near a line): the
    /// `verdict` in the context, which every rule with such a verdict sets.
    pub fn is_possible(&self) -> bool {
        self.context.get("verdict").is_some_and(|v| v == "possible")
    }

    /// Names the lock's code: the typed pair, and the same in the context (`waiter_site`,
    /// `waker_site`) and the evidence (`top_pair_share`) documents show.
    pub(crate) fn name_lock_pair(&mut self, pair: LockPair) {
        self.context.insert("waiter_site", pair.waiter.clone());
        self.context.insert("waker_site", pair.waker.clone());
        self.evidence.insert("top_pair_share", pair.share);
        self.lock_pair = Some(pair);
    }
}

/// A finding as documents show it (`diagnose --json`, `trace --json`): the rule's verdict with
/// the container's Kubernetes names.
#[derive(Clone, Debug, Serialize)]
pub struct FindingReport {
    pub kind: &'static str,
    pub severity: Severity,
    pub cgroup: String,
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub container: Option<String>,
    pub summary: String,
    pub evidence: BTreeMap<&'static str, f64>,
    /// What the rule used that is not a figure (e.g. `hypervisor`).
    pub context: BTreeMap<&'static str, String>,
    pub recommendations: Vec<String>,
}

impl FindingReport {
    pub fn new(f: &Finding, identity: Option<&Identity>) -> Self {
        let identity = identity.cloned().unwrap_or_default();
        Self {
            kind: f.kind.as_str(),
            severity: f.severity,
            cgroup: f.cgroup.clone(),
            namespace: identity.namespace,
            pod: identity.pod,
            container: identity.container,
            summary: f.summary.clone(),
            evidence: f.evidence.clone(),
            context: f.context.clone(),
            recommendations: f.recommendations.clone(),
        }
    }
}
