//! Per-container resource context read from cgroupfs: CPU quota, cpuset, thread count,
//! throttling and CPU pressure.
//!
//! Scheduler figures only mean something next to the limits they run under: 200 ms of run-queue
//! delay is a different story in a container throttled by a 0.5-core quota than in one with
//! 64 CPUs to itself. These are all plain files in the cgroup's directory.
//!
//! On a pure cgroup v2 host everything is in the v2 directory. On a hybrid host the `cpu`,
//! `cpuacct` and `cpuset` controllers usually stay on their v1 hierarchies (e.g.
//! `/sys/fs/cgroup/cpu,cpuacct`), while the unified (v2) hierarchy only tracks membership, so
//! each value is read from the v2 file if it has one and otherwise from the v1 controller's
//! file at the same relative path (systemd and the kubelet create the same path in every
//! hierarchy). A controller is attached to at most one hierarchy, so a value never has two
//! competing sources.
//!
//! A missing, unreadable or malformed file gives `None`, never a default number: "no quota"
//! and "we could not tell" are both `None` for the quota, and the report must not invent
//! either.

use std::{
    collections::HashMap,
    path::{Component, Path, PathBuf},
};

use serde::Serialize;

use super::{CgroupError, mountinfo};

/// Resource context of one cgroup.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Limits {
    /// CFS bandwidth quota in cores (quota / period); `None` when unlimited or unknown.
    pub cpu_quota_cores: Option<f64>,
    /// The tightest CFS quota of the cgroups above this one (its parent's, the pod's, a
    /// slice's), where one has any: the kernel enforces every quota up the tree, so a parent's
    /// tighter `cpu.max` binds the container though its own says more — and a runtime that
    /// sizes itself from its own cgroup's quota misses it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ancestor_quota: Option<AncestorQuota>,
    /// The CPUs the cgroup may run on (effective cpuset), ascending.
    pub cpuset_cpus: Option<Vec<u32>>,
    /// Threads (tasks) in the cgroup: the whole subtree when the pids controller reports it
    /// (`pids.current`), otherwise only the threads directly in this cgroup (`cgroup.threads`,
    /// v1 `tasks`), which is the same for a container's leaf cgroup.
    pub threads: Option<u64>,
    /// The CPUs the kubelet's static CPU manager gave this container for itself: its checkpoint
    /// names them for the container's pod and the cgroup's effective cpuset is that assignment.
    /// Not read from the cgroup: the session sets it from the checkpoint it reads
    /// ([`crate::identity::cpumanager`]); `None` where the node's policy pins nothing, its
    /// checkpoint cannot be read, or the cgroup is no pinned container.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exclusive_cpus: Option<Vec<u32>>,
    /// Cumulative CPU bandwidth and pressure counters, since the cgroup was created (a
    /// window's figures are their differences between its edges: see [`CpuCounters::since`]).
    #[serde(flatten)]
    pub counters: CpuCounters,
}

/// A CFS quota set on a cgroup above a container's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AncestorQuota {
    /// Quota / period, in cores.
    pub cores: f64,
    /// The cgroup that sets it (relative to the hierarchy's root, with a leading `/`).
    pub cgroup: String,
}

/// The cumulative counters of a cgroup's CPU bandwidth control and CPU pressure, since the
/// cgroup was created. The kernel only ever adds to them, so what happened in a window is the
/// difference of two reads, one at each edge of the window: a read anywhere else (a refresh
/// period that does not fall on the window's edges) gives a figure of some other span.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct CpuCounters {
    /// Enforcement periods (`nr_periods`): the periods of the quota in which the cgroup had
    /// threads that wanted a CPU.
    pub periods: Option<u64>,
    /// Periods in which the quota ran out (`nr_throttled`).
    pub throttled_periods: Option<u64>,
    /// Time the cgroup's run queues were throttled, summed over the CPUs they were throttled
    /// on (v1 `throttled_time`, v2 `throttled_usec`): on N CPUs, up to N seconds per second.
    pub throttled_seconds: Option<f64>,
    /// PSI: time in which some of the cgroup's threads waited for a CPU (`some total=`).
    pub cpu_pressure_some_seconds: Option<f64>,
    /// PSI: time in which all its non-idle threads waited for a CPU (`full total=`).
    pub cpu_pressure_full_seconds: Option<f64>,
}

impl CpuCounters {
    /// What the counters say happened between `start` (the earlier read; `None`: the cgroup was
    /// created after it, so it counts from zero) and `self`. A counter unknown at either edge
    /// is unknown over the window; a counter that went down (a cgroup removed and created again
    /// under the same path) counts from zero.
    pub fn since(&self, start: Option<&CpuCounters>) -> CpuCounters {
        let Self {
            periods,
            throttled_periods,
            throttled_seconds,
            cpu_pressure_some_seconds,
            cpu_pressure_full_seconds,
        } = *self;
        let zero = CpuCounters {
            periods: Some(0),
            throttled_periods: Some(0),
            throttled_seconds: Some(0.0),
            cpu_pressure_some_seconds: Some(0.0),
            cpu_pressure_full_seconds: Some(0.0),
        };
        let s = start.unwrap_or(&zero);
        let int = |now: Option<u64>, then: Option<u64>| {
            let (now, then) = (now?, then?);
            Some(if now >= then { now - then } else { now })
        };
        let float = |now: Option<f64>, then: Option<f64>| {
            let (now, then) = (now?, then?);
            Some(if now >= then { now - then } else { now })
        };
        CpuCounters {
            periods: int(periods, s.periods),
            throttled_periods: int(throttled_periods, s.throttled_periods),
            throttled_seconds: float(throttled_seconds, s.throttled_seconds),
            cpu_pressure_some_seconds: float(
                cpu_pressure_some_seconds,
                s.cpu_pressure_some_seconds,
            ),
            cpu_pressure_full_seconds: float(
                cpu_pressure_full_seconds,
                s.cpu_pressure_full_seconds,
            ),
        }
    }

    /// Adds `other`'s counts to these (a path's cgroups one after another). Unknown stays
    /// unknown only where both are.
    pub fn add(&mut self, other: &CpuCounters) {
        let CpuCounters {
            periods,
            throttled_periods,
            throttled_seconds,
            cpu_pressure_some_seconds,
            cpu_pressure_full_seconds,
        } = *other;
        fn sum<T: std::ops::Add<Output = T> + Copy>(a: &mut Option<T>, b: Option<T>) {
            *a = match (*a, b) {
                (Some(x), Some(y)) => Some(x + y),
                (x, y) => x.or(y),
            };
        }
        sum(&mut self.periods, periods);
        sum(&mut self.throttled_periods, throttled_periods);
        sum(&mut self.throttled_seconds, throttled_seconds);
        sum(
            &mut self.cpu_pressure_some_seconds,
            cpu_pressure_some_seconds,
        );
        sum(
            &mut self.cpu_pressure_full_seconds,
            cpu_pressure_full_seconds,
        );
    }

    /// Of the periods in which the cgroup wanted a CPU, the share in which its quota ran out:
    /// "throttled in N% of its periods".
    pub fn throttled_period_share(&self) -> Option<f64> {
        let (periods, throttled) = (self.periods?, self.throttled_periods?);
        (periods > 0).then(|| throttled as f64 / periods as f64)
    }
}

/// Where the cgroup hierarchies are mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLayout {
    /// The unified (v2) hierarchy: `/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` in hybrid mode.
    pub v2_root: PathBuf,
    /// v1 controller name → mount point of its hierarchy. Co-mounted controllers share one
    /// (`cpu` and `cpuacct` → `/sys/fs/cgroup/cpu,cpuacct`). Empty on a pure v2 host.
    pub v1_roots: HashMap<String, PathBuf>,
}

/// The v1 controllers, as they appear in a cgroup v1 mount's super options. Other options
/// (`rw`, `xattr`, `name=systemd`, `release_agent=...`) are not controllers.
const V1_CONTROLLERS: &[&str] = &[
    "blkio",
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "freezer",
    "hugetlb",
    "memory",
    "misc",
    "net_cls",
    "net_prio",
    "perf_event",
    "pids",
    "rdma",
];

impl CgroupLayout {
    /// Reads the layout from this process's mount table.
    pub fn discover() -> Result<Self, CgroupError> {
        let mountinfo = crate::identity::mountinfo::read_text().map_err(CgroupError::MountInfo)?;
        Self::from_mountinfo(&mountinfo)
    }

    /// Parses a `/proc/<pid>/mountinfo` text. The v2 root is chosen exactly as the cgroup id
    /// resolver chooses it, so relative paths from the resolver line up. For v1, a mount of the
    /// hierarchy's root (`/` in the mountinfo root field) is preferred over bind mounts of a
    /// subtree (as seen inside containers), then the shortest mount point.
    pub fn from_mountinfo(text: &str) -> Result<Self, CgroupError> {
        let mounts = mountinfo::parse(text);
        let v2_root = mountinfo::v2_root(&mounts).ok_or(CgroupError::NoV2Hierarchy)?;
        // controller → (mounts the hierarchy root, mount point)
        let mut best: HashMap<String, (bool, PathBuf)> = HashMap::new();
        for m in mounts.iter().filter(|m| m.fs_type == "cgroup") {
            let candidate = (m.is_root(), m.mount_point.clone());
            for controller in m
                .super_options
                .iter()
                .filter(|o| V1_CONTROLLERS.contains(&o.as_str()))
            {
                let better = best.get(controller).is_none_or(|(is_root, path)| {
                    (
                        candidate.0,
                        std::cmp::Reverse(candidate.1.as_os_str().len()),
                    ) > (*is_root, std::cmp::Reverse(path.as_os_str().len()))
                });
                if better {
                    best.insert(controller.clone(), candidate.clone());
                }
            }
        }
        Ok(Self {
            v2_root,
            v1_roots: best.into_iter().map(|(c, (_, p))| (c, p)).collect(),
        })
    }

    fn v1_dir(&self, controller: &str, rel: &Path) -> Option<PathBuf> {
        self.v1_roots.get(controller).map(|root| root.join(rel))
    }
}

/// Reads the resource context of the cgroup at `rel_path` (relative to the hierarchy roots,
/// as the cgroup id resolver gives it). Best effort; see the module docs for the rules.
pub fn read_limits(layout: &CgroupLayout, rel_path: &str) -> Limits {
    read(layout, rel_path, None)
}

/// Reads the resource context again, as [`read_limits`], except the cumulative counters, which
/// are carried over from `previous`: a window's counters are read at its edges
/// ([`read_cpu_counters`]), and `cpu.stat` is the costly file (reading it flushes the cgroup's
/// per-CPU statistics under a global lock; seen as a tenth of the daemon's CPU time with 1,000
/// cgroups), so it is not read again between them.
pub fn refresh_limits(layout: &CgroupLayout, rel_path: &str, previous: &Limits) -> Limits {
    read(layout, rel_path, Some(previous))
}

fn read(layout: &CgroupLayout, rel_path: &str, previous: Option<&Limits>) -> Limits {
    let Some(rel) = safe_relative(rel_path) else {
        return Limits::default();
    };
    let v2 = layout.v2_root.join(&rel);
    let v2_file = |name: &str| read_file(&v2.join(name));
    let v1_file = |controller: &str, name: &str| {
        layout
            .v1_dir(controller, &rel)
            .and_then(|dir| read_file(&dir.join(name)))
    };

    let cpu_quota_cores = quota_of(layout, &rel);
    // Every cgroup above, up to (not including) the root, which has no quota.
    let ancestor_quota = rel
        .ancestors()
        .skip(1)
        .filter(|a| !a.as_os_str().is_empty())
        .filter_map(|a| {
            Some(AncestorQuota {
                cores: quota_of(layout, a)?,
                cgroup: format!("/{}", a.display()),
            })
        })
        .min_by(|a, b| a.cores.total_cmp(&b.cores));

    let cpuset_cpus = v2_file("cpuset.cpus.effective")
        .and_then(|t| parse_cpu_list(&t))
        .or_else(|| parse_cpu_list(&v1_file("cpuset", "cpuset.effective_cpus")?));

    let threads = v2_file("pids.current")
        .and_then(|t| parse_u64(&t))
        .or_else(|| parse_u64(&v1_file("pids", "pids.current")?))
        .or_else(|| count_ids(&v2_file("cgroup.threads")?))
        .or_else(|| count_ids(&v1_file("cpu", "tasks")?));

    // A first read takes the counters too; a refresh carries them over: they are read at the
    // edges of the windows that judge them ([`read_cpu_counters`]), not on a refresh period.
    let counters = match previous {
        Some(p) => p.counters,
        None => counters_of(layout, &rel, None, true, true),
    };

    Limits {
        cpu_quota_cores,
        ancestor_quota,
        cpuset_cpus,
        threads,
        exclusive_cpus: None,
        counters,
    }
}

/// The CFS quota of the cgroup at `rel`, in cores: v2 `cpu.max`, else v1 `cpu.cfs_quota_us`
/// over `cpu.cfs_period_us`; `None` when unlimited or unknown.
fn quota_of(layout: &CgroupLayout, rel: &Path) -> Option<f64> {
    read_file(&layout.v2_root.join(rel).join("cpu.max"))
        .and_then(|t| parse_cpu_max(&t))
        .or_else(|| {
            let dir = layout.v1_dir("cpu", rel)?;
            parse_cfs_quota(
                &read_file(&dir.join("cpu.cfs_quota_us"))?,
                &read_file(&dir.join("cpu.cfs_period_us"))?,
            )
        })
}

/// Reads a cgroup's cumulative CPU counters at a window's edge: the throttling counters from
/// `cpu.stat` when `throttling` (only a cgroup with a quota throttles, and reading `cpu.stat`
/// flushes the cgroup's per-CPU statistics under a global lock), the pressure totals from
/// `cpu.pressure` when `pressure`. What is not read is carried over from `previous`.
pub fn read_cpu_counters(
    layout: &CgroupLayout,
    rel_path: &str,
    previous: &CpuCounters,
    throttling: bool,
    pressure: bool,
) -> CpuCounters {
    match safe_relative(rel_path) {
        Some(rel) => counters_of(layout, &rel, Some(previous), throttling, pressure),
        None => CpuCounters::default(),
    }
}

fn counters_of(
    layout: &CgroupLayout,
    rel: &Path,
    previous: Option<&CpuCounters>,
    throttling: bool,
    pressure: bool,
) -> CpuCounters {
    let mut c = previous.copied().unwrap_or_default();
    let v2 = layout.v2_root.join(rel);
    if throttling {
        // v2 cpu.stat exists even without the cpu controller, but then has no throttling
        // keys; hence the per-key fallback to the v1 controller's file.
        let v2_stat = read_file(&v2.join("cpu.stat"));
        let v1_stat = layout
            .v1_dir("cpu", rel)
            .and_then(|dir| read_file(&dir.join("cpu.stat")));
        let v2_key = |key: &str| v2_stat.as_deref().and_then(|t| flat_keyed(t, key));
        let v1_key = |key: &str| v1_stat.as_deref().and_then(|t| flat_keyed(t, key));
        c.periods = v2_key("nr_periods").or_else(|| v1_key("nr_periods"));
        c.throttled_periods = v2_key("nr_throttled").or_else(|| v1_key("nr_throttled"));
        c.throttled_seconds = v2_key("throttled_usec")
            .map(|us| us as f64 / 1e6)
            .or_else(|| v1_key("throttled_time").map(|ns| ns as f64 / 1e9));
    }
    if pressure {
        let p = read_file(&v2.join("cpu.pressure"))
            .map(|t| parse_pressure(&t))
            .unwrap_or_default();
        c.cpu_pressure_some_seconds = p.some.map(|l| l.total_usec as f64 / 1e6);
        c.cpu_pressure_full_seconds = p.full.map(|l| l.total_usec as f64 / 1e6);
    }
    c
}

/// Reads only the thread count of the cgroup at `rel_path` (as in [`read_limits`]): cheap
/// enough to sample every interval.
pub fn read_threads(layout: &CgroupLayout, rel_path: &str) -> Option<u64> {
    let rel = safe_relative(rel_path)?;
    let v2 = layout.v2_root.join(&rel);
    let v1 = |controller: &str, name: &str| {
        layout
            .v1_dir(controller, &rel)
            .and_then(|dir| read_file(&dir.join(name)))
    };
    read_file(&v2.join("pids.current"))
        .and_then(|t| parse_u64(&t))
        .or_else(|| parse_u64(&v1("pids", "pids.current")?))
        .or_else(|| count_ids(&read_file(&v2.join("cgroup.threads"))?))
        .or_else(|| count_ids(&v1("cpu", "tasks")?))
}

/// The processes (thread-group ids) in the cgroup at `rel_path`: its v2 `cgroup.procs`, or the
/// v1 `cpu` hierarchy's (the same path, as kubelet places a pod). Empty when neither can be
/// read.
pub fn read_processes(layout: &CgroupLayout, rel_path: &str) -> Vec<u32> {
    let Some(rel) = safe_relative(rel_path) else {
        return Vec::new();
    };
    read_file(&layout.v2_root.join(&rel).join("cgroup.procs"))
        .or_else(|| read_file(&layout.v1_dir("cpu", &rel)?.join("cgroup.procs")))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Reads the cgroup's full CPU pressure record (all averages and the stall totals, which a
/// caller can difference over its own window). v2 only: v1 has no PSI.
pub fn read_cpu_pressure(layout: &CgroupLayout, rel_path: &str) -> Pressure {
    safe_relative(rel_path)
        .and_then(|rel| read_file(&layout.v2_root.join(rel).join("cpu.pressure")))
        .map(|t| parse_pressure(&t))
        .unwrap_or_default()
}

/// The relative path as a `Path` that cannot leave the hierarchy (no `..`), or `None`.
fn safe_relative(rel_path: &str) -> Option<PathBuf> {
    let rel = Path::new(rel_path.trim_start_matches('/'));
    rel.components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        .then(|| rel.to_path_buf())
}

/// Reading a PSI file with PSI disabled fails with EOPNOTSUPP; that, like a missing file, is
/// just "no value".
fn read_file(path: &Path) -> Option<String> {
    crate::files::kernel_text(path)
}

/// v2 `cpu.max`: `"<quota> <period>"` in µs, `quota` = `max` when unlimited → cores, or
/// `None` for unlimited or malformed.
pub fn parse_cpu_max(text: &str) -> Option<f64> {
    let mut fields = text.split_whitespace();
    let (quota, period) = (fields.next()?, fields.next()?);
    if fields.next().is_some() {
        return None;
    }
    let period: u64 = period.parse().ok().filter(|&p| p > 0)?;
    let quota: u64 = quota.parse().ok().filter(|&q| q > 0)?;
    Some(quota as f64 / period as f64)
}

/// v1 `cpu.cfs_quota_us` and `cpu.cfs_period_us` → cores, `None` for -1 (unlimited) or
/// malformed.
pub fn parse_cfs_quota(quota_text: &str, period_text: &str) -> Option<f64> {
    let quota: i64 = quota_text.trim().parse().ok().filter(|&q| q > 0)?;
    let period: u64 = period_text.trim().parse().ok().filter(|&p| p > 0)?;
    Some(quota as f64 / period as f64)
}

/// Highest CPU number accepted in a CPU list. Linux configures at most 8192 CPUs today; the
/// margin only exists to reject absurd input (`0-4294967295`) before allocating for it.
const MAX_CPU: u32 = 65_535;

/// A kernel CPU list (`0-3,8,10-11`) → sorted, de-duplicated CPU numbers. An empty list is
/// `None`: an effective cpuset is never empty for a cgroup that can hold tasks.
pub fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim) {
        let (low, high) = match part.split_once('-') {
            Some((low, high)) => (parse_cpu(low)?, parse_cpu(high)?),
            None => (parse_cpu(part)?, parse_cpu(part)?),
        };
        if low > high {
            return None;
        }
        cpus.extend(low..=high);
        if cpus.len() > 4 * (MAX_CPU as usize + 1) {
            // Far more entries than distinct CPUs can exist: not a kernel-written list.
            return None;
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

fn parse_cpu(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok().filter(|&n| n <= MAX_CPU)
}

/// A single-number file (`pids.current`).
pub fn parse_u64(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// The number of ids in a one-id-per-line file (`cgroup.threads`, `tasks`). Any line that is
/// not a number makes the whole count unknown.
pub fn count_ids(text: &str) -> Option<u64> {
    let mut count = 0u64;
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        line.parse::<u32>().ok()?;
        count += 1;
    }
    Some(count)
}

/// The value of `key` in a flat-keyed file (`cpu.stat`: `key value` per line).
pub fn flat_keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        (fields.next()? == key).then(|| fields.next()?.parse().ok())?
    })
}

/// One line of a PSI file.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PressureLine {
    /// Share of time stalled (%) over the last 10, 60 and 300 seconds.
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    /// Total stall time since the cgroup was created, in microseconds.
    pub total_usec: u64,
}

/// A PSI file (`cpu.pressure`): the `some` and `full` lines. `full` is absent for CPU before
/// Linux 5.13.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Pressure {
    pub some: Option<PressureLine>,
    pub full: Option<PressureLine>,
}

/// Parses `some avg10=0.12 avg60=0.05 avg300=0.01 total=123456` and the `full` line. A line
/// missing a field or with a bad value is `None`.
pub fn parse_pressure(text: &str) -> Pressure {
    let mut pressure = Pressure::default();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let slot = match fields.next() {
            Some("some") => &mut pressure.some,
            Some("full") => &mut pressure.full,
            _ => continue,
        };
        *slot = parse_pressure_fields(fields);
    }
    pressure
}

fn parse_pressure_fields<'a>(fields: impl Iterator<Item = &'a str>) -> Option<PressureLine> {
    let (mut avg10, mut avg60, mut avg300, mut total) = (None, None, None, None);
    for field in fields {
        let (key, value) = field.split_once('=')?;
        let share = || {
            value
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && (0.0..=100.0).contains(v))
        };
        match key {
            "avg10" => avg10 = Some(share()?),
            "avg60" => avg60 = Some(share()?),
            "avg300" => avg300 = Some(share()?),
            "total" => total = Some(value.parse::<u64>().ok()?),
            _ => {}
        }
    }
    Some(PressureLine {
        avg10: avg10?,
        avg60: avg60?,
        avg300: avg300?,
        total_usec: total?,
    })
}

#[cfg(test)]
mod tests;
