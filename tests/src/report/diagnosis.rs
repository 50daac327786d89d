//! `diagnose --json`'s document.

use serde::Deserialize;

use super::{Finding, Host};

/// The document `diagnose --json` prints.
#[derive(Clone, Debug, Deserialize)]
pub struct Diagnosis {
    pub host: Host,
    pub findings: Vec<Finding>,
    pub checked: Checked,
}

/// What `diagnose` checked.
#[derive(Clone, Debug, Deserialize)]
pub struct Checked {
    /// Interrupted (SIGINT) before `--duration` was up.
    pub interrupted: bool,
    pub duration_seconds: f64,
    pub host_cpus: u64,
    /// The rules it ran.
    pub rules: Vec<String>,
    /// The lock-storm rule's figures for the containers with the most futex hand-offs.
    pub lock_storm: Vec<StormCheck>,
}

/// The lock-storm rule's figures for one container, flagged or not.
#[derive(Clone, Debug, Deserialize)]
pub struct StormCheck {
    pub cgroup: String,
    pub handoffs_per_cpu_second: Option<f64>,
    pub required_handoffs_per_cpu_second: Option<f64>,
    pub queued_threads_per_cpu: Option<f64>,
    pub futex_blocked_share: Option<f64>,
    pub futex_timeout_share: Option<f64>,
    pub runnable_per_cpu: Option<f64>,
    /// Inside a quota: the CPUs the container wanted.
    pub cpus_wanted: Option<f64>,
    pub handoffs_per_cpu_second_used: Option<f64>,
    /// Of those, the hand-offs of the runtime's own threads (a JVM's service threads, …).
    pub runtime_handoffs_per_cpu_second: Option<f64>,
    /// Threads queued on the lock.
    pub handoff_threads: u64,
}

impl Diagnosis {
    /// The findings about the container at `cgroup` (its path under the v2 root).
    pub fn findings_about(&self, cgroup: &str) -> Vec<Finding> {
        self.findings
            .iter()
            .filter(|f| f.cgroup == cgroup)
            .cloned()
            .collect()
    }

    /// The lock-storm rule's figures for the container at `cgroup`, when it had futex waits.
    pub fn storm_figures(&self, cgroup: &str) -> Option<StormCheck> {
        self.checked
            .lock_storm
            .iter()
            .find(|c| c.cgroup == cgroup)
            .cloned()
    }
}
