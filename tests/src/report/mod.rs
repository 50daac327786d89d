//! The agent's own JSON documents as the tests read them: `trace --json` ([`Trace`]) and
//! `diagnose --json` ([`Diagnosis`]), typed, so that a field the agent renames or drops fails
//! where the document is parsed, with its name, not as a `null` deep inside an assertion.
//!
//! Only what tests read is declared (serde skips the rest). A figure the agent prints as `null`
//! (a missing probe, a NaN) is an `Option`; maps whose keys the agent chooses (evidence, lost
//! events, drop reasons, kernel lock kinds) stay maps.

mod diagnosis;
mod handoffs;
mod network;
mod trace;

use std::collections::BTreeMap;

pub use diagnosis::{Checked, Diagnosis, StormCheck};
pub use handoffs::{GoMutex, GoMutexSite, HandoffPair, LockCallSites, UserSite};
pub use network::{Direction, Interface, Lengths, Namespace, NetworkSummary, Peer, Snmp, Underlay};
pub use trace::{
    Blame, Container, ContextSwitches, Culprit, Futex, HotFutex, KernelLockSite, Latency, Limits,
    LockWait, Probe, Trace, Wakeups,
};

use serde::Deserialize;

/// A window's edges, in seconds since the Unix epoch.
#[derive(Clone, Debug, Deserialize)]
pub struct Window {
    pub start_unix_seconds: f64,
    pub end_unix_seconds: f64,
}

/// The host over the window (`host` of both documents).
#[derive(Clone, Debug, Deserialize)]
pub struct Host {
    pub cpus: u64,
    pub hypervisor: Option<String>,
    pub numa_nodes: Option<u64>,
    pub steal_seconds: Option<f64>,
    pub kernel: String,
}

/// One finding about one container (`findings` of both documents).
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

    /// `evidence[key]`: `None` when the finding has no such figure or it is `null`.
    pub fn evidence(&self, key: &str) -> Option<f64> {
        self.evidence.get(key).copied().flatten()
    }

    /// `evidence[key]`, which the finding must have.
    #[track_caller]
    pub fn figure(&self, key: &str) -> f64 {
        self.evidence(key)
            .unwrap_or_else(|| panic!("no figure `{key}` in the evidence of {self:#?}"))
    }

    /// Whether one of its recommendations says `words`.
    pub fn recommends(&self, words: &str) -> bool {
        self.recommendations.iter().any(|r| r.contains(words))
    }
}

/// The findings of `findings` about the container at `cgroup` of kind `kind`, the first.
pub fn find<'a>(findings: &'a [Finding], kind: &str, cgroup: &str) -> Option<&'a Finding> {
    findings
        .iter()
        .find(|f| f.kind == kind && f.cgroup == cgroup)
}

/// Parses one of the agent's documents, with the text in the panic message when it does not
/// have the declared shape.
#[track_caller]
pub fn parse<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> T {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: {e}\n{text}"))
}
