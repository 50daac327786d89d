//! A step of the session's window: the figures of its ticks, and the edge read it began with.

use std::{collections::HashMap, time::SystemTime};

use crate::{
    collect::{CgroupWindow, Window},
    host::{CpuTicks, read_cpu_ticks},
    identity::{goclock::GoEdge, jvm::Census, limits::CpuCounters},
    netinfo::NetWatch,
};

/// Thread-seconds and seconds of one cgroup in a step: their ratio is its mean thread count.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ThreadTime {
    pub(super) thread_seconds: f64,
    pub(super) seconds: f64,
}

#[derive(Debug)]
pub(super) struct Step {
    /// The per-cgroup and network figures of the step (the hot-futex and lock-site details,
    /// which no rule reads, are left out). Once the step is complete, its per-cgroup figures
    /// move to `cgroups`.
    pub(super) window: Window,
    /// A completed step's per-cgroup figures, sorted by id: a hash map's table is at most 7/8
    /// full and a power of two in size, so with values of over a kilobyte this takes half
    /// the memory or less, for each step the window holds.
    pub(super) cgroups: Vec<(u64, CgroupWindow)>,
    pub(super) threads: HashMap<u64, ThreadTime>,
    /// Each cgroup's cumulative CPU counters when the step began (the edge read that ended
    /// the step before; a cgroup absent here was created since, or never read).
    pub(super) counters_at_start: HashMap<u64, CpuCounters>,
    /// Each cgroup's Go runtimes' clocks when the step began (the same edge read).
    pub(super) go_at_start: HashMap<u64, GoEdge>,
    /// When that edge read was made (wall clock, for documents that state the window's edges).
    pub(super) started_at: SystemTime,
    /// The network namespaces' kernel counters when the step began (network rules only).
    pub(super) net: Option<NetWatch>,
    /// The host's CPU time counters when the step began: steal over the window.
    pub(super) cpu_ticks: Option<CpuTicks>,
    /// The JVM thread dumps that finished in the step.
    pub(super) census: Census,
}

impl Step {
    pub(super) fn new(
        counters: &HashMap<u64, CpuCounters>,
        go: &HashMap<u64, GoEdge>,
        started_at: SystemTime,
        net: Option<NetWatch>,
    ) -> Self {
        Self {
            window: Window::empty(),
            cgroups: Vec::new(),
            threads: HashMap::new(),
            counters_at_start: counters.clone(),
            go_at_start: go.clone(),
            started_at,
            net,
            cpu_ticks: read_cpu_ticks(),
            census: Census::default(),
        }
    }
}

impl Step {
    /// Moves the per-cgroup figures of a completed step into their compact form.
    pub(super) fn complete(&mut self) {
        let mut cgroups: Vec<(u64, CgroupWindow)> = std::mem::take(&mut self.window.cgroups)
            .into_iter()
            .collect();
        cgroups.sort_unstable_by_key(|(id, _)| *id);
        self.cgroups = cgroups;
    }

    pub(super) fn contains(&self, id: u64) -> bool {
        self.window.cgroups.contains_key(&id)
            || self.cgroups.binary_search_by_key(&id, |(k, _)| *k).is_ok()
    }
}
