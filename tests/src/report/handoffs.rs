//! `lock_call_sites` of a container in `trace --json`: where its sampled futex hand-offs waited
//! and woke, and Go's `sync.Mutex`.

use serde::Deserialize;

/// A container's sampled hand-offs.
#[derive(Clone, Debug, Deserialize)]
pub struct LockCallSites {
    pub sampled_handoffs: u64,
    /// Hand-offs whose holder's hold is on record.
    pub holds: u64,
    pub holder_preempted_share: Option<f64>,
    pub holder_asleep_share: Option<f64>,
    pub holder_runnable_share: Option<f64>,
    /// Most sampled first.
    pub pairs: Vec<HandoffPair>,
    /// What would name the sites that have no name.
    pub hints: Vec<String>,
    pub go_mutex: Option<GoMutex>,
}

/// A (waiter site, waker site) pair.
#[derive(Clone, Debug, Deserialize)]
pub struct HandoffPair {
    pub waiter: UserSite,
    pub waker: UserSite,
    pub sampled_handoffs: u64,
    /// Of the container's sampled hand-offs.
    pub share: f64,
}

/// A site in the program's own code; `function` is `None` when it could not be named
/// (`unnamed` says why).
#[derive(Clone, Debug, Deserialize)]
pub struct UserSite {
    pub function: Option<String>,
    pub lock_function: Option<String>,
    /// `file:line`.
    pub location: Option<String>,
    pub module: Option<String>,
    pub unnamed: Option<String>,
}

/// Go's `sync.Mutex` over the time its uprobes were attached.
#[derive(Clone, Debug, Deserialize)]
pub struct GoMutex {
    pub probed_seconds: f64,
    pub contended_locks: u64,
    pub handing_unlocks: u64,
    pub lock_sites: Vec<GoMutexSite>,
    pub unlock_sites: Vec<GoMutexSite>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct GoMutexSite {
    pub site: UserSite,
    pub sampled: u64,
    pub share: f64,
}
