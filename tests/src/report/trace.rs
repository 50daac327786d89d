//! `trace --json`'s document: the window's figures per container.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::TestCgroup;

use super::{Finding, Host, Interface, LockCallSites, Namespace, NetworkSummary, Window};

/// The document `trace --json` prints.
#[derive(Clone, Debug, Deserialize)]
pub struct Trace {
    pub window: Window,
    pub host: Host,
    /// `null` without the network family.
    pub interfaces: Option<Vec<Interface>>,
    pub network_namespaces: Option<Vec<Namespace>>,
    /// Busiest first.
    pub containers: Vec<Container>,
    /// What the diagnosis rules found over the same window.
    pub findings: Vec<Finding>,
    /// Each probe, and how it is attached.
    pub probes: Vec<Probe>,
    /// Events the probes could not record, by reason, since attach.
    pub lost_events: BTreeMap<String, u64>,
}

/// One probe (one tracepoint) and how it is attached.
#[derive(Clone, Debug, Deserialize)]
pub struct Probe {
    pub tracepoint: String,
    /// `tp_btf`, `tracepoint`, …; `None` when it is not attached.
    pub kind: Option<String>,
}

/// One cgroup's figures over the window. A figure whose probe is not attached is `None`.
#[derive(Clone, Debug, Deserialize)]
pub struct Container {
    /// Relative to the v2 root; `None` when the cgroup was removed before it was resolved.
    pub cgroup: Option<String>,
    pub cgroup_id: u64,
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub container: Option<String>,
    pub runtime: String,
    pub container_id: Option<String>,
    /// `None` once the cgroup is gone.
    pub limits: Option<Limits>,
    pub context_switches: Option<ContextSwitches>,
    pub migrations: Option<u64>,
    pub oncpu_seconds: Option<f64>,
    pub offcpu_seconds: Option<f64>,
    pub runqueue_latency: Option<Latency>,
    pub wakeups: Option<Wakeups>,
    pub cpus_used: Option<u64>,
    pub futex: Option<Futex>,
    /// Kernel lock waits by kind (`mutex`, `rwsem_write`, …).
    pub kernel_locks: Option<BTreeMap<String, LockWait>>,
    pub hot_futexes: Option<Vec<HotFutex>>,
    pub kernel_lock_sites: Option<Vec<KernelLockSite>>,
    pub kernel_lock_waits_unwalked: Option<LockWait>,
    pub lock_call_sites: Option<LockCallSites>,
    pub network: Option<NetworkSummary>,
    pub runqueue_blame: Option<Blame>,
}

/// Resource context over the window; each figure `None` where unknown or unlimited.
#[derive(Clone, Debug, Deserialize)]
pub struct Limits {
    pub threads: Option<u64>,
    pub periods: Option<u64>,
    pub throttled_periods: Option<u64>,
    pub throttled_seconds: Option<f64>,
}

#[derive(Clone, Copy, Debug, Deserialize)]
pub struct ContextSwitches {
    pub voluntary: u64,
    pub involuntary: u64,
}

impl ContextSwitches {
    pub fn total(&self) -> u64 {
        self.voluntary + self.involuntary
    }
}

/// Run-queue latency: log2 buckets' upper edges for the quantiles (`None` without samples).
#[derive(Clone, Copy, Debug, Deserialize)]
pub struct Latency {
    pub count: u64,
    pub sum_seconds: f64,
    pub p50_seconds: Option<f64>,
}

#[derive(Clone, Copy, Debug, Deserialize)]
pub struct Wakeups {
    pub count: u64,
    pub remote: u64,
    pub remote_share: Option<f64>,
    pub local_runqueue_p50_seconds: Option<f64>,
    pub remote_runqueue_p50_seconds: Option<f64>,
}

#[derive(Clone, Copy, Debug, Deserialize)]
pub struct Futex {
    pub waits: u64,
    pub wait_seconds: f64,
    pub wakes: u64,
    pub woken: u64,
    pub timeouts: u64,
    pub eagain: u64,
}

#[derive(Clone, Copy, Debug, Deserialize)]
pub struct LockWait {
    pub count: u64,
    pub wait_seconds: f64,
}

/// A futex word waited on long.
#[derive(Clone, Debug, Deserialize)]
pub struct HotFutex {
    pub tgid: u64,
    pub comm: String,
    /// `0x…`.
    pub uaddr: String,
    pub waits: u64,
}

/// A kernel call site that waited for a lock.
#[derive(Clone, Debug, Deserialize)]
pub struct KernelLockSite {
    pub function: String,
    pub lock_function: Option<String>,
    pub kind: String,
    pub count: u64,
    pub wait_seconds: f64,
    pub max_wait_seconds: f64,
}

/// The container's run-queue wait split by what held the CPUs meanwhile.
#[derive(Clone, Debug, Deserialize)]
pub struct Blame {
    pub wait_seconds: f64,
    /// The container's own threads held the CPU.
    pub own_seconds: f64,
    /// Kernel threads held it.
    pub kernel_seconds: f64,
    /// The CPU was idle, yet to wake up.
    pub idle_seconds: f64,
    /// The hypervisor (or interrupts accounted apart) had the CPU.
    pub stolen_seconds: f64,
    /// Began before the oldest run the CPU remembered.
    pub unseen_seconds: f64,
    /// Other cgroups that held the CPU, most first.
    pub others: Vec<Culprit>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Culprit {
    /// Its path, or `cgroup id N` for one not followed.
    pub cgroup: String,
    pub seconds: f64,
}

/// The figures a test needs: panics, with the container, when the agent printed `null`.
impl Container {
    #[track_caller]
    fn need<'a, T>(&'a self, what: &str, figure: &'a Option<T>) -> &'a T {
        figure
            .as_ref()
            .unwrap_or_else(|| panic!("`{what}` is null: {self:#?}"))
    }

    #[track_caller]
    pub fn switches(&self) -> ContextSwitches {
        *self.need("context_switches", &self.context_switches)
    }

    #[track_caller]
    pub fn oncpu(&self) -> f64 {
        *self.need("oncpu_seconds", &self.oncpu_seconds)
    }

    #[track_caller]
    pub fn offcpu(&self) -> f64 {
        *self.need("offcpu_seconds", &self.offcpu_seconds)
    }

    #[track_caller]
    pub fn migrations(&self) -> u64 {
        *self.need("migrations", &self.migrations)
    }

    #[track_caller]
    pub fn futex(&self) -> &Futex {
        self.need("futex", &self.futex)
    }

    #[track_caller]
    pub fn runqueue(&self) -> &Latency {
        self.need("runqueue_latency", &self.runqueue_latency)
    }

    #[track_caller]
    pub fn blame(&self) -> &Blame {
        self.need("runqueue_blame", &self.runqueue_blame)
    }

    #[track_caller]
    pub fn limits(&self) -> &Limits {
        self.need("limits", &self.limits)
    }
}

impl Trace {
    /// The entry of the cgroup at `rel_path` (relative to the v2 root, e.g. `/sw-test-…`).
    pub fn container_by_path(&self, rel_path: &str) -> Option<&Container> {
        self.containers
            .iter()
            .find(|c| c.cgroup.as_deref() == Some(rel_path))
    }

    /// The entry of the cgroup with this id.
    pub fn container_by_id(&self, id: u64) -> Option<&Container> {
        self.containers.iter().find(|c| c.cgroup_id == id)
    }

    /// The entry of a test cgroup, found by path; panics with the report's cgroups otherwise.
    #[track_caller]
    pub fn container(&self, cgroup: &TestCgroup) -> &Container {
        self.container_by_path(cgroup.rel_path())
            .unwrap_or_else(|| {
                panic!(
                    "cgroup {} (id {}) is not in the report; it has: {}",
                    cgroup.rel_path(),
                    cgroup.id(),
                    self.cgroups()
                )
            })
    }

    /// The report's cgroups, for a panic message.
    pub fn cgroups(&self) -> String {
        let seen: Vec<String> = self
            .containers
            .iter()
            .map(|c| format!("{:?} (id {})", c.cgroup, c.cgroup_id))
            .collect();
        seen.join(", ")
    }

    /// How the probe of `tracepoint` is attached (`None`: not attached); panics when the
    /// report does not list it.
    #[track_caller]
    pub fn probe_kind(&self, tracepoint: &str) -> Option<&str> {
        self.probes
            .iter()
            .find(|p| p.tracepoint == tracepoint)
            .unwrap_or_else(|| {
                panic!(
                    "probe {tracepoint} missing from the report: {:?}",
                    self.probes
                )
            })
            .kind
            .as_deref()
    }

    /// The interfaces of the network namespace `netns`; panics without the network family.
    #[track_caller]
    pub fn interfaces_of(&self, netns: u64) -> Vec<&Interface> {
        self.interfaces
            .as_ref()
            .expect("no `interfaces` list (the network family is not on)")
            .iter()
            .filter(|i| i.netns == netns)
            .collect()
    }

    /// The interface `name` of `netns`.
    #[track_caller]
    pub fn interface(&self, netns: u64, name: &str) -> &Interface {
        self.interfaces_of(netns)
            .into_iter()
            .find(|i| i.name == name)
            .unwrap_or_else(|| {
                panic!(
                    "no interface {name} in netns {netns}: {:#?}",
                    self.interfaces
                )
            })
    }

    /// The network namespace `netns`.
    #[track_caller]
    pub fn namespace(&self, netns: u64) -> &Namespace {
        self.network_namespaces
            .as_ref()
            .expect("no `network_namespaces` list (the network family is not on)")
            .iter()
            .find(|n| n.netns == netns)
            .unwrap_or_else(|| panic!("netns {netns} not in {:#?}", self.network_namespaces))
    }
}
