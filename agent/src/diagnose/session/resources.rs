//! Where the session reads a cgroup's resource context: cgroupfs on a host, synthetic cgroups
//! in the tests.

use crate::identity::limits::{
    CgroupLayout, CpuCounters, Limits, read_cpu_counters, read_limits, read_processes,
    read_threads, refresh_limits,
};

/// Where the session reads a cgroup's resource context. The only I/O of the engine, behind a
/// trait so that the engine is tested with synthetic cgroups.
pub trait ResourceReader {
    /// Quota, cpuset, threads, cumulative throttling and pressure of the cgroup at `path`
    /// (relative to the v2 root).
    fn limits(&self, path: &str) -> Limits;
    /// The same, read again knowing `previous` (a reader may then skip what cannot have
    /// changed).
    fn refresh(&self, path: &str, _previous: &Limits) -> Limits {
        self.limits(path)
    }
    /// Only the thread count: cheap enough to read whenever activity changes.
    fn threads(&self, path: &str) -> Option<u64>;
    /// The cumulative CPU counters at a window's edge: throttling when `throttling` (the
    /// cgroup has a quota), pressure when `pressure`; the rest carried over from `previous`.
    fn counters(
        &self,
        path: &str,
        previous: &CpuCounters,
        throttling: bool,
        pressure: bool,
    ) -> CpuCounters;
    /// The processes in the cgroup (their Go runtimes' clocks are read at the edges).
    fn processes(&self, _path: &str) -> Vec<u32> {
        Vec::new()
    }
}

impl ResourceReader for CgroupLayout {
    fn limits(&self, path: &str) -> Limits {
        read_limits(self, path)
    }
    fn refresh(&self, path: &str, previous: &Limits) -> Limits {
        refresh_limits(self, path, previous)
    }
    fn threads(&self, path: &str) -> Option<u64> {
        read_threads(self, path)
    }
    fn counters(
        &self,
        path: &str,
        previous: &CpuCounters,
        throttling: bool,
        pressure: bool,
    ) -> CpuCounters {
        read_cpu_counters(self, path, previous, throttling, pressure)
    }
    fn processes(&self, path: &str) -> Vec<u32> {
        read_processes(self, path)
    }
}

/// The host's cgroupfs as the session's reader; `None` (logged) when the hierarchies cannot
/// be told, and then no resource context is reported.
pub fn cgroupfs_reader() -> Option<Box<dyn ResourceReader + Send>> {
    match CgroupLayout::discover() {
        Ok(layout) => Some(Box::new(layout)),
        Err(err) => {
            log::warn!("no resource limits: {err}");
            None
        }
    }
}
