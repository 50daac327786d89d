//! `diagnose --json`'s document as the tests read it: typed, so that a field the agent renames
//! or drops fails where the document is parsed, with its name, not as a `null` deep inside an
//! assertion. Only what tests read is declared (serde skips the rest); a figure the agent could
//! not compute is `null` in JSON (a NaN), so figures are `Option<f64>`.

use std::collections::BTreeMap;

use serde::Deserialize;

/// The document `diagnose --json` prints.
#[derive(Clone, Debug, Deserialize)]
pub struct Diagnosis {
    pub findings: Vec<Finding>,
    pub checked: Checked,
}

/// One finding about one container.
#[derive(Clone, Debug, Deserialize)]
pub struct Finding {
    pub kind: String,
    pub severity: String,
    pub cgroup: String,
    pub summary: String,
    pub evidence: BTreeMap<String, Option<f64>>,
    pub context: BTreeMap<String, String>,
    pub recommendations: Vec<String>,
}

impl Finding {
    /// `context[key]`, when the finding has it.
    pub fn context(&self, key: &str) -> Option<&str> {
        self.context.get(key).map(String::as_str)
    }

    /// Whether one of its recommendations says `words`.
    pub fn recommends(&self, words: &str) -> bool {
        self.recommendations.iter().any(|r| r.contains(words))
    }
}

/// What `diagnose` checked.
#[derive(Clone, Debug, Deserialize)]
pub struct Checked {
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
