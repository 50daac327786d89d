//! The `trace` report: a window's figures per cgroup, in the JSON shape scripts rely on.
//!
//! A figure whose probe is not attached is `null`, never zero: a missing probe is better than
//! a wrong number.

pub mod handoffs;
pub mod network;
pub mod pprof;

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use stormwatch_common::{FutexStats, LOCK_SITE_UNWALKED, LockStats, SchedStats, lock_kind};

use crate::{
    collect::{Availability, CgroupWindow, Window, log2_quantile_ns},
    identity::{limits::Limits, workload::Identity},
    probes::ProbeStatus,
    symbolize::CallSite,
};

const NS: f64 = 1e9;
/// Hot futexes and contended call sites listed per container.
pub const TOP_N: usize = 5;

/// A window's edges, in seconds since the Unix epoch (wall clock).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct WindowEdges {
    pub start_unix_seconds: f64,
    pub end_unix_seconds: f64,
}

impl WindowEdges {
    pub fn new((start, end): (std::time::SystemTime, std::time::SystemTime)) -> Self {
        let unix = |t: std::time::SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64())
        };
        Self {
            start_unix_seconds: unix(start),
            end_unix_seconds: unix(end),
        }
    }
}

fn secs(ns: u64) -> f64 {
    ns as f64 / NS
}

#[derive(Clone, Debug, Serialize)]
pub struct TraceReport {
    pub duration_seconds: f64,
    /// The window's edges: when the cumulative counters it differences (throttling, pressure)
    /// were read at its start and at its end.
    pub window: WindowEdges,
    /// The host over the window: CPUs, hypervisor, NUMA nodes, steal, kernel.
    pub host: crate::host::HostReport,
    /// Every interface of the host's and the containers' network namespaces, with MTU,
    /// encapsulation and the window's packet figures; `null` without the network family.
    pub interfaces: Option<Vec<network::InterfaceReport>>,
    /// Each network namespace's uplink, route MTUs and kernel counters over the window; `null`
    /// without the network family.
    pub network_namespaces: Option<Vec<network::NamespaceReport>>,
    pub containers: Vec<ContainerReport>,
    /// What the diagnosis rules found over the same window, in `diagnose --json`'s shape.
    pub findings: Vec<crate::diagnose::FindingReport>,
    /// Each probe, and how it is attached (or why not).
    pub probes: Vec<ProbeStatus>,
    /// Events the probes could not record, by reason, since attach.
    pub lost_events: BTreeMap<&'static str, u64>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ContainerReport {
    /// Path relative to the v2 root; `null` when the cgroup was removed before it was resolved.
    pub cgroup: Option<String>,
    pub cgroup_id: u64,
    /// Kubernetes names, from the kubelet's log layout; `null` when not a pod or not known.
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub container: Option<String>,
    /// containerd, crio, docker, podman, systemd, or none (host, or a path that does not say).
    pub runtime: crate::identity::container::Runtime,
    pub container_id: Option<String>,
    /// Resource context over the window (see [`crate::diagnose::session::Session::window_limits`]);
    /// each field `null` where unknown or unlimited, the whole `null` when the cgroup is gone.
    pub limits: Option<Limits>,
    pub context_switches: Option<ContextSwitches>,
    pub migrations: Option<u64>,
    pub oncpu_seconds: Option<f64>,
    pub offcpu_seconds: Option<f64>,
    pub runqueue_latency: Option<LatencySummary>,
    /// Wake-ups of the container's threads, local or remote (from another CPU than the one the
    /// thread was queued on); `null` without the tp_btf scheduler probes.
    pub wakeups: Option<Wakeups>,
    /// Distinct CPUs the container's threads ran on in the window.
    pub cpus_used: Option<u32>,
    pub futex: Option<FutexSummary>,
    /// Kernel lock waits by kind.
    pub kernel_locks: Option<BTreeMap<&'static str, LockWait>>,
    /// The futex words waited on longest in this window, hottest first.
    pub hot_futexes: Option<Vec<HotFutex>>,
    /// The kernel call sites that waited longest for a lock in this window, from the waits of at
    /// least `LOCK_SITE_MIN_WAIT_NS` (10 µs; shorter ones count in `kernel_locks` only).
    pub kernel_lock_sites: Option<Vec<LockSite>>,
    /// The waits of at least `LOCK_SITE_MIN_WAIT_NS` whose call site was not taken: each CPU
    /// walks at most 1,000 kernel stacks a second (`LOCK_STACK_WALK_INTERVAL_NS`), so in a
    /// storm of long waits `kernel_lock_sites` covers the others only. Zero below that rate.
    pub kernel_lock_waits_unwalked: Option<LockWait>,
    /// Where the container's sampled futex hand-offs waited and woke, in its own code, and why
    /// they were slow; `null` where hand-offs are not sampled (the futex probes not attached, or
    /// a kernel without BTF, or an architecture whose stacks the agent cannot unwind yet).
    pub lock_call_sites: Option<handoffs::LockCallSites>,
    /// What the container's sockets sent and received.
    pub network: Option<network::NetworkSummary>,
    /// The container's run-queue wait split by what held the CPUs meanwhile (its own threads,
    /// other containers by path, kernel threads, idle CPUs, stolen time); `null` where the
    /// switch program cannot blame (no BTF, classic tracepoints, no `sched_info`).
    pub runqueue_blame: Option<crate::diagnose::RunqBlame>,
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct ContextSwitches {
    pub voluntary: u64,
    pub involuntary: u64,
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub sum_seconds: f64,
    /// Upper edge of the log2 bucket holding the median: the true median is at most this and
    /// more than half of it. `null` when there were no samples.
    pub p50_seconds: Option<f64>,
    pub p99_seconds: Option<f64>,
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct Wakeups {
    pub count: u64,
    /// Wake-ups whose waker ran on another CPU than the one the thread was queued on: an
    /// inter-processor interrupt each (a VM exit on most hypervisors).
    pub remote: u64,
    /// `remote / count`; `null` without wake-ups.
    pub remote_share: Option<f64>,
    /// Run-queue latency after local and after remote wake-ups (log2-bucket upper edges, as for
    /// `runqueue_latency`).
    pub local_runqueue_p50_seconds: Option<f64>,
    pub remote_runqueue_p50_seconds: Option<f64>,
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct FutexSummary {
    /// Wait calls (FUTEX_WAIT, WAIT_BITSET, LOCK_PI, LOCK_PI2, WAIT_REQUEUE_PI, futex_wait(v)).
    pub waits: u64,
    /// Time in those calls, summed over threads.
    pub wait_seconds: f64,
    pub wakes: u64,
    /// Waiters woken by FUTEX_WAKE, WAKE_BITSET, WAKE_OP and futex_wake.
    pub woken: u64,
    pub timeouts: u64,
    pub eagain: u64,
    /// Waits that returned 0 (the waiter was woken: a hand-off through the kernel), and the
    /// time in them.
    pub woken_waits: u64,
    pub woken_wait_seconds: f64,
    /// Log2-bucket upper edges, as for run-queue latency.
    pub p50_wait_seconds: Option<f64>,
    pub p99_wait_seconds: Option<f64>,
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct LockWait {
    pub count: u64,
    pub wait_seconds: f64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct HotFutex {
    pub tgid: u32,
    pub comm: String,
    /// The futex word's address in the process, as `0x…`.
    pub uaddr: String,
    pub waits: u64,
    pub wait_seconds: f64,
    /// The longest single wait since the probes attached.
    pub max_wait_seconds: f64,
    /// Whether two or more threads have waited on the word (a lock's or a condition's), or
    /// only one (a runtime parking that thread on a word of its own).
    pub shared: bool,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LockSite {
    #[serde(flatten)]
    pub site: CallSite,
    pub kind: &'static str,
    pub count: u64,
    pub wait_seconds: f64,
    /// The longest single wait since the probes attached.
    pub max_wait_seconds: f64,
}

/// What a report needs besides the window: names and which probes work.
pub struct ReportContext<'a> {
    pub paths: &'a HashMap<u64, String>,
    pub identities: &'a HashMap<u64, Identity>,
    /// Limits over the window, of the cgroups that still exist.
    pub limits: &'a HashMap<u64, Limits>,
    /// Process names by tgid, as seen while the processes lived.
    pub process_names: &'a HashMap<u32, String>,
    /// Call sites by stack id.
    pub call_sites: &'a HashMap<u32, CallSite>,
    pub avail: Availability,
    /// The futex probes sample hand-offs (their user call sites are named).
    pub handoff_sites: bool,
}

impl<'a> ReportContext<'a> {
    /// What a report of windows of `pipeline` needs; `limits` from the diagnosis session
    /// ([`crate::diagnose::session::Session::window_limits`]).
    pub fn of(pipeline: &'a crate::pipeline::Pipeline, limits: &'a HashMap<u64, Limits>) -> Self {
        Self {
            paths: pipeline.paths(),
            identities: pipeline.identities(),
            limits,
            process_names: pipeline.process_names(),
            call_sites: pipeline.call_sites(),
            avail: pipeline.availability(),
            handoff_sites: pipeline.names_handoff_sites(),
        }
    }
}

fn latency(h: &stormwatch_common::Log2Histogram) -> LatencySummary {
    LatencySummary {
        count: h.count,
        sum_seconds: secs(h.sum_ns),
        p50_seconds: log2_quantile_ns(h, 0.50).map(secs),
        p99_seconds: log2_quantile_ns(h, 0.99).map(secs),
    }
}

fn futex_summary(f: &FutexStats) -> FutexSummary {
    FutexSummary {
        waits: f.wait.count,
        wait_seconds: secs(f.wait.sum_ns),
        wakes: f.wakes,
        woken: f.woken,
        timeouts: f.timeouts,
        eagain: f.eagain,
        woken_waits: f.woken_waits,
        woken_wait_seconds: secs(f.woken_wait_ns),
        p50_wait_seconds: log2_quantile_ns(&f.wait, 0.50).map(secs),
        p99_wait_seconds: log2_quantile_ns(&f.wait, 0.99).map(secs),
    }
}

fn lock_waits(l: &LockStats) -> BTreeMap<&'static str, LockWait> {
    lock_kind::NAMES
        .iter()
        .enumerate()
        .map(|(k, name)| {
            (
                *name,
                LockWait {
                    count: l.count[k],
                    wait_seconds: secs(l.wait_ns[k]),
                },
            )
        })
        .collect()
}

fn comm_string(comm: &[u8; 16]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

fn hot_futexes(window: &Window, cgroup_id: u64, ctx: &ReportContext) -> Vec<HotFutex> {
    let mut hot: Vec<_> = window
        .hot_futexes
        .iter()
        .filter(|(k, _)| k.cgroup_id == cgroup_id)
        .collect();
    hot.sort_by(|(ka, a), (kb, b)| {
        b.wait_ns
            .cmp(&a.wait_ns)
            .then(b.waits.cmp(&a.waits))
            .then((ka.tgid, ka.uaddr).cmp(&(kb.tgid, kb.uaddr)))
    });
    hot.into_iter()
        .take(TOP_N)
        .map(|(k, v)| HotFutex {
            tgid: k.tgid,
            comm: ctx
                .process_names
                .get(&k.tgid)
                .cloned()
                .unwrap_or_else(|| comm_string(&v.comm)),
            uaddr: format!("{:#x}", k.uaddr),
            waits: v.waits,
            wait_seconds: secs(v.wait_ns),
            max_wait_seconds: secs(v.max_wait_ns),
            shared: v.shared != 0,
        })
        .collect()
}

/// The cgroup's kernel call sites, and its long waits counted without a stack
/// (`LOCK_SITE_UNWALKED`, of every kind), from one pass over the window's sites.
fn lock_sites(window: &Window, cgroup_id: u64, ctx: &ReportContext) -> (Vec<LockSite>, LockWait) {
    // Several stacks may reduce to the same call site: merge them.
    let mut merged: HashMap<(CallSite, u32), (u64, u64, u64)> = HashMap::new();
    let (mut unwalked, mut unwalked_ns) = (0, 0);
    for (k, v) in window
        .lock_sites
        .iter()
        .filter(|(k, _)| k.cgroup_id == cgroup_id)
    {
        if k.stack_id == LOCK_SITE_UNWALKED {
            unwalked += v.count;
            unwalked_ns += v.wait_ns;
            continue;
        }
        let Some(site) = ctx.call_sites.get(&k.stack_id) else {
            continue;
        };
        let e = merged.entry((site.clone(), k.kind)).or_insert((0, 0, 0));
        e.0 += v.count;
        e.1 += v.wait_ns;
        e.2 = e.2.max(v.max_wait_ns);
    }
    let mut sites: Vec<LockSite> = merged
        .into_iter()
        .map(|((site, kind), (count, wait_ns, max))| LockSite {
            site,
            kind: lock_kind::NAMES
                .get(kind as usize)
                .copied()
                .unwrap_or("other"),
            count,
            wait_seconds: secs(wait_ns),
            max_wait_seconds: secs(max),
        })
        .collect();
    sites.sort_by(|a, b| {
        b.wait_seconds
            .total_cmp(&a.wait_seconds)
            .then(b.count.cmp(&a.count))
            .then(a.site.function.cmp(&b.site.function))
    });
    sites.truncate(TOP_N);
    let unwalked = LockWait {
        count: unwalked,
        wait_seconds: secs(unwalked_ns),
    };
    (sites, unwalked)
}

fn wakeups(w: &CgroupWindow) -> Wakeups {
    let p50 = |h| log2_quantile_ns(h, 0.5).map(secs);
    Wakeups {
        count: w.wakeups(),
        remote: w.sched.wake_remote.count,
        remote_share: w.remote_wakeup_share(),
        local_runqueue_p50_seconds: p50(&w.sched.wake_local),
        remote_runqueue_p50_seconds: p50(&w.sched.wake_remote),
    }
}

pub fn container_report(
    window: &Window,
    cgroup_id: u64,
    w: &CgroupWindow,
    ctx: &ReportContext,
) -> ContainerReport {
    let s: &SchedStats = &w.sched;
    let a = ctx.avail;
    let identity = ctx.identities.get(&cgroup_id).cloned().unwrap_or_default();
    let (kernel_lock_sites, kernel_lock_waits_unwalked) =
        a.locks.then(|| lock_sites(window, cgroup_id, ctx)).unzip();
    ContainerReport {
        cgroup: ctx.paths.get(&cgroup_id).cloned(),
        cgroup_id,
        namespace: identity.namespace,
        pod: identity.pod,
        container: identity.container,
        runtime: identity.runtime,
        container_id: identity.container_id,
        limits: ctx.limits.get(&cgroup_id).cloned(),
        context_switches: a.switch.then_some(ContextSwitches {
            voluntary: s.voluntary_switches,
            involuntary: s.involuntary_switches,
        }),
        migrations: a.switch.then_some(s.migrations),
        oncpu_seconds: a.switch.then_some(secs(s.oncpu_ns)),
        offcpu_seconds: a.wakeup.then_some(secs(s.offcpu_ns)),
        runqueue_latency: a.wakeup.then(|| latency(&s.runq)),
        wakeups: a.wake_kinds.then(|| wakeups(w)),
        cpus_used: a.switch.then_some(w.cpus_used()),
        futex: a.futex.then(|| futex_summary(&w.futex)),
        kernel_locks: a.locks.then(|| lock_waits(&w.locks)),
        hot_futexes: a.futex.then(|| hot_futexes(window, cgroup_id, ctx)),
        kernel_lock_sites,
        kernel_lock_waits_unwalked,
        lock_call_sites: (a.futex && ctx.handoff_sites)
            .then(|| handoffs::lock_call_sites(window.handoff_sites.get(&cgroup_id), w.go_mutex)),
        network: network::network_summary(&w.net, a.net),
        runqueue_blame: a.runq_blame.then(|| {
            let pairs: Vec<(u64, u64)> = window
                .runq_blame
                .iter()
                .filter(|(k, _)| k.victim == cgroup_id)
                .map(|(k, v)| (k.culprit, v.ns))
                .collect();
            crate::diagnose::RunqBlame::of(cgroup_id, &pairs, ctx.paths).unwrap_or_default()
        }),
    }
}

/// The containers of a window, busiest (most on-CPU time, then most switches) first.
pub fn containers(
    window: &Window,
    ctx: &ReportContext,
    keep: impl Fn(u64, Option<&str>) -> bool,
) -> Vec<ContainerReport> {
    let mut rows: Vec<(&u64, &CgroupWindow)> = window
        .cgroups
        .iter()
        .filter(|(id, _)| keep(**id, ctx.paths.get(id).map(String::as_str)))
        .collect();
    rows.sort_by(|(ia, a), (ib, b)| {
        let switches = |s: &SchedStats| s.voluntary_switches + s.involuntary_switches;
        b.sched
            .oncpu_ns
            .cmp(&a.sched.oncpu_ns)
            .then(switches(&b.sched).cmp(&switches(&a.sched)))
            .then(b.futex.wait.sum_ns.cmp(&a.futex.wait.sum_ns))
            .then(ia.cmp(ib))
    });
    rows.into_iter()
        .map(|(id, w)| container_report(window, *id, w, ctx))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use stormwatch_common::{HotFutexKey, HotFutexValue, LockSiteKey, LockSiteValue};

    fn cg(oncpu_ns: u64, vol: u64) -> CgroupWindow {
        let mut w = CgroupWindow::ZERO;
        w.sched.oncpu_ns = oncpu_ns;
        w.sched.voluntary_switches = vol;
        w.sched.involuntary_switches = 1;
        w.sched.runq.record(1500);
        w.futex.wait.record(3000);
        w.futex.wait.record(5000);
        w.futex.wakes = 4;
        w.futex.woken = 2;
        w.locks.count[lock_kind::SPIN] = 3;
        w.locks.wait_ns[lock_kind::SPIN] = 600;
        w
    }

    fn window() -> Window {
        let mut w = Window::empty();
        w.duration = Duration::from_secs(5);
        for (id, on, vol) in [(10, 5, 100), (20, 50, 1), (30, 5, 200)] {
            w.cgroups.insert(id, cg(on, vol));
        }
        for (uaddr, waits, wait_ns) in [(0x10, 5, 500), (0x20, 50, 5000), (0x30, 1, 10)] {
            w.hot_futexes.insert(
                HotFutexKey {
                    cgroup_id: 10,
                    uaddr,
                    tgid: 77,
                    _pad: 0,
                },
                HotFutexValue {
                    waits,
                    wait_ns,
                    max_wait_ns: wait_ns,
                    comm: *b"worker\0\0\0\0\0\0\0\0\0\0",
                    ..HotFutexValue::ZERO
                },
            );
        }
        // Stacks 1 and 2 reduce to one call site; the budget's unwalked waits are no site.
        for (stack_id, count) in [(1, 2), (2, 3), (LOCK_SITE_UNWALKED, 7)] {
            w.lock_sites.insert(
                LockSiteKey {
                    cgroup_id: 10,
                    stack_id,
                    kind: lock_kind::SPIN as u32,
                },
                LockSiteValue {
                    count,
                    wait_ns: 100 * count,
                    max_wait_ns: 100,
                },
            );
        }
        w
    }

    fn site(f: &str) -> CallSite {
        CallSite {
            function: f.into(),
            lock_function: Some("_raw_spin_lock".into()),
        }
    }

    fn with_ctx<T>(avail: Availability, f: impl FnOnce(&ReportContext) -> T) -> T {
        let paths = HashMap::from([(10, "/a".to_owned()), (20, "/b".to_owned())]);
        let names = HashMap::from([(77, "java".to_owned())]);
        // Both stacks reduce to one call site: the report merges them.
        let sites = HashMap::from([
            (1, site("futex_q_lock+0x31")),
            (2, site("futex_q_lock+0x31")),
        ]);
        let identities = HashMap::from([(
            10,
            Identity {
                runtime: crate::identity::container::Runtime::Containerd,
                container_id: Some("c".repeat(64)),
                namespace: Some("shop".into()),
                pod: Some("checkout-1".into()),
                container: Some("server".into()),
                ..Identity::default()
            },
        )]);
        let limits = HashMap::from([(
            10,
            Limits {
                cpu_quota_cores: Some(1.5),
                ancestor_quota: None,
                cpuset_cpus: Some(vec![0, 1]),
                threads: Some(32),
                exclusive_cpus: None,
                counters: crate::identity::limits::CpuCounters {
                    throttled_periods: Some(3),
                    throttled_seconds: Some(0.25),
                    ..Default::default()
                },
            },
        )]);
        f(&ReportContext {
            paths: &paths,
            identities: &identities,
            limits: &limits,
            process_names: &names,
            call_sites: &sites,
            avail,
            handoff_sites: false,
        })
    }

    #[test]
    fn busiest_first_and_filtered() {
        with_ctx(Availability::ALL, |ctx| {
            let rows = containers(&window(), ctx, |_, _| true);
            let ids: Vec<u64> = rows.iter().map(|r| r.cgroup_id).collect();
            assert_eq!(ids, [20, 30, 10]);
            assert_eq!(rows[2].cgroup.as_deref(), Some("/a"));
            assert_eq!(rows[1].cgroup, None);
            let only_a = containers(&window(), ctx, |_, p| p == Some("/a"));
            assert_eq!(only_a.len(), 1);
        });
    }

    #[test]
    fn json_shape_is_the_contract() {
        let v = with_ctx(Availability::ALL, |ctx| {
            let w = window();
            let mut one = cg(2_500_000_000, 3);
            one.sched.migrations = 0;
            one.sched.wake_local.record(1000);
            one.sched.wake_remote.record(3000);
            one.sched.wake_remote.record(3000);
            one.sched.wake_remote.record(3000);
            one.cpus.insert(0);
            one.cpus.insert(3);
            serde_json::to_value(container_report(&w, 10, &one, ctx)).unwrap()
        });
        assert_eq!(v["cgroup"], "/a");
        assert_eq!(v["cgroup_id"], 10);
        assert_eq!(v["namespace"], "shop");
        assert_eq!(v["pod"], "checkout-1");
        assert_eq!(v["container"], "server");
        assert_eq!(v["runtime"], "containerd");
        assert_eq!(v["container_id"], "c".repeat(64));
        assert_eq!(v["limits"]["cpu_quota_cores"], 1.5);
        assert_eq!(v["limits"]["cpuset_cpus"], serde_json::json!([0, 1]));
        assert_eq!(v["limits"]["threads"], 32);
        assert_eq!(v["limits"]["throttled_periods"], 3);
        assert_eq!(v["limits"]["throttled_seconds"], 0.25);
        assert_eq!(v["context_switches"]["voluntary"], 3);
        assert_eq!(v["context_switches"]["involuntary"], 1);
        assert_eq!(v["migrations"], 0);
        assert_eq!(v["oncpu_seconds"], 2.5);
        assert_eq!(v["offcpu_seconds"], 0.0);
        assert_eq!(v["runqueue_latency"]["count"], 1);
        assert_eq!(v["runqueue_latency"]["sum_seconds"], 1.5e-6);
        assert_eq!(v["runqueue_latency"]["p50_seconds"], 2047e-9);
        assert_eq!(v["runqueue_latency"]["p99_seconds"], 2047e-9);
        assert_eq!(v["wakeups"]["count"], 4);
        assert_eq!(v["wakeups"]["remote"], 3);
        assert_eq!(v["wakeups"]["remote_share"], 0.75);
        assert_eq!(v["wakeups"]["local_runqueue_p50_seconds"], 1023e-9);
        assert_eq!(v["wakeups"]["remote_runqueue_p50_seconds"], 4095e-9);
        assert_eq!(v["cpus_used"], 2);
        assert_eq!(v["futex"]["waits"], 2);
        assert_eq!(v["futex"]["wait_seconds"], 8e-6);
        assert_eq!(v["futex"]["wakes"], 4);
        assert_eq!(v["futex"]["p99_wait_seconds"], 8191e-9);
        assert_eq!(v["kernel_locks"]["spin"]["count"], 3);
        assert_eq!(v["kernel_locks"]["spin"]["wait_seconds"], 6e-7);
        assert_eq!(v["kernel_locks"]["mutex"]["count"], 0);
        assert_eq!(v["kernel_locks"]["rwsem_read"]["count"], 0);
        assert_eq!(v["kernel_locks"]["rwsem_write"]["count"], 0);
        let hot = v["hot_futexes"].as_array().unwrap();
        assert_eq!(hot.len(), 3);
        assert_eq!(hot[0]["uaddr"], "0x20");
        assert_eq!(hot[0]["tgid"], 77);
        assert_eq!(hot[0]["comm"], "java", "the live process name wins");
        assert_eq!(hot[0]["waits"], 50);
        assert_eq!(hot[0]["wait_seconds"], 5e-6);
        assert_eq!(hot[2]["uaddr"], "0x30");
        let sites = v["kernel_lock_sites"].as_array().unwrap();
        assert_eq!(sites.len(), 1, "two stacks, one call site");
        assert_eq!(sites[0]["function"], "futex_q_lock+0x31");
        assert_eq!(sites[0]["lock_function"], "_raw_spin_lock");
        assert_eq!(sites[0]["kind"], "spin");
        assert_eq!(sites[0]["count"], 5);
        assert_eq!(v["kernel_lock_waits_unwalked"]["count"], 7);
        assert_eq!(v["kernel_lock_waits_unwalked"]["wait_seconds"], 7e-7);
    }

    #[test]
    fn figures_of_missing_probes_are_null() {
        let partial = Availability {
            switch: true,
            ..Availability::default()
        };
        let v = with_ctx(partial, |ctx| {
            serde_json::to_value(container_report(&window(), 10, &cg(1, 1), ctx)).unwrap()
        });
        assert!(v["offcpu_seconds"].is_null());
        assert!(v["runqueue_latency"].is_null());
        assert!(v["wakeups"].is_null());
        assert!(v["futex"].is_null());
        assert!(v["kernel_locks"].is_null());
        assert!(v["hot_futexes"].is_null());
        assert_eq!(v["context_switches"]["voluntary"], 1);
        let other = with_ctx(partial, |ctx| {
            serde_json::to_value(container_report(&window(), 20, &cg(1, 1), ctx)).unwrap()
        });
        assert!(other["namespace"].is_null(), "no identity: no names");
        assert_eq!(other["runtime"], "none");
        assert!(other["limits"].is_null(), "gone cgroups have no limits");
        let none = with_ctx(Availability::default(), |ctx| {
            container_report(&window(), 10, &cg(1, 1), ctx)
        });
        assert_eq!(none.context_switches, None);
        assert_eq!(none.oncpu_seconds, None);
    }

    #[test]
    fn top_lists_are_bounded() {
        let mut w = window();
        for uaddr in 0..20 {
            w.hot_futexes.insert(
                HotFutexKey {
                    cgroup_id: 10,
                    uaddr: 0x1000 + uaddr,
                    tgid: 1,
                    _pad: 0,
                },
                HotFutexValue {
                    waits: 1,
                    wait_ns: 1,
                    max_wait_ns: 1,
                    comm: [0; 16],
                    ..HotFutexValue::ZERO
                },
            );
        }
        let n = with_ctx(Availability::ALL, |ctx| hot_futexes(&w, 10, ctx).len());
        assert_eq!(n, TOP_N);
    }
}
