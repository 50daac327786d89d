//! What a session judges and how: its window, thresholds and sources.

use std::{path::PathBuf, time::Duration};

use crate::collect::NetAvailability;

use super::super::Thresholds;

/// What the session judges and how.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// The sliding window's length; `None`: everything since the session started.
    pub span: Option<Duration>,
    /// The collection interval (the daemon's steps are a third of the span, at least one tick).
    pub interval: Duration,
    pub thresholds: Thresholds,
    pub host_cpus: u32,
    /// Whether the edge reads take each active cgroup's CPU pressure totals too (the window's
    /// pressure figures); throttling is read at the edges whatever this says.
    pub window_pressure: bool,
    /// With the network family: which packet figures exist, and the v2 root (to name a
    /// namespace's cgroup). `None`: no network rules.
    pub network: Option<NetworkOptions>,
    /// Where to read the kubelet's CPU manager checkpoint, the first readable one, with each
    /// window's facts (whether the node pins containers, and which it pinned).
    pub cpu_manager_state: Vec<PathBuf>,
    /// Whether JVMs whose threads hand off through futexes are asked for thread dumps
    /// ([`crate::identity::jvm`]), to tell their threads waiting for a lock from those
    /// waiting for work.
    pub jvm_thread_dumps: bool,
    /// Whether JVMs with virtual threads are also dumped for their lock storms (a JSON thread
    /// dump beside their scheduler's counter, which `jvm_thread_dumps` reads alone:
    /// [`crate::identity::jvm::vthreads`]). Off unless asked: the JSON dump crashed a Temurin
    /// 25.0.3 JVM under load (tests/CORPUS.md).
    pub jvm_virtual_threads: bool,
}

#[derive(Clone, Debug)]
pub struct NetworkOptions {
    pub avail: NetAvailability,
    pub v2_root: PathBuf,
    /// The host's network namespace inode, when known.
    pub host_netns: Option<u64>,
    /// How long the namespaces' links and routes may be reused while no namespace comes or
    /// goes (see [`InventoryCache`](crate::netinfo::inventory::InventoryCache)); zero for a
    /// one-off diagnosis.
    pub inventory_max_age: Duration,
}
