//! The metric families: the exporter's state encoded with prometheus-client, in the OpenMetrics
//! text format (see [`super::classic`] for the Prometheus text format).
//!
//! Names have the `stormwatch_` prefix and base units (seconds); counters end in `_total`
//! (prometheus-client appends it to the family name); every family has help text. Per-cgroup
//! families carry `namespace`, `pod`, `container` (empty when unknown) and `cgroup` (the path
//! relative to the cgroup v2 root). No pid, tid or address labels.

use std::{
    fmt,
    sync::{Arc, Mutex, PoisonError},
    time::Instant,
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, MetricEncoder, NoLabelSet},
    registry::Registry,
};
use stormwatch_common::Log2Histogram;

use super::{
    Rendered,
    state::{DurationHistogram, Exporter, Series},
};
use crate::collect::bucket_upper_ns;

/// The log2 buckets whose upper edges (2^b - 1 ns) are the `le` edges of the exported
/// latency histograms (run-queue latency and futex wait), chosen for what each range means:
///
/// - 16.4 µs (2^14 - 1 ns): run-queue, the task ran at once (the wake-up's own cost); futex,
///   a hand-over while the waker was still spinning;
/// - 131 µs (2^17): a short wait behind a running task; a brief critical section;
/// - 1.05 ms (2^20): the mean the diagnosis starts to flag; a lock held for long;
/// - 4.19 ms (2^22): about one scheduler slice (EEVDF: 0.75 ms × (1 + log2 CPUs), 3 ms at
///   8 CPUs and more): waiting behind others;
/// - 16.8 ms (2^24): several slices, an overloaded CPU; a frame or request budget;
/// - 134 ms (2^27): over a CFS period (100 ms), the mark of quota throttling; a blocked
///   request;
/// - 1.07 s (2^30): a stall; beyond it (`+Inf`) idle waits such as condition variables.
///
/// Eight series per histogram instead of the 22 of every log2 edge from 1 µs: 16 fewer per
/// cgroup and both histograms. Each edge is still the upper edge of a log2 bucket, so the
/// cumulative counts stay exact (values are integer nanoseconds and bucket `b` holds
/// `2^(b-1) ..= 2^b - 1`); the diagnosis keeps the full resolution.
pub const EXPORTED_BUCKETS: [usize; 7] = [14, 17, 20, 22, 24, 27, 30];

/// `le` edges and per-bucket (not cumulative) counts of a log2 histogram, for
/// [`MetricEncoder::encode_histogram`], which accumulates them: each exported edge gathers
/// the log2 buckets from the previous edge up to itself, `+Inf` the rest.
pub fn histogram_buckets(h: &Log2Histogram) -> Vec<(f64, u64)> {
    let mut out = Vec::with_capacity(EXPORTED_BUCKETS.len() + 1);
    let mut from = 0;
    for b in EXPORTED_BUCKETS {
        out.push((
            bucket_upper_ns(b) as f64 / 1e9,
            h.buckets[from..=b].iter().sum(),
        ));
        from = b + 1;
    }
    out.push((f64::INFINITY, h.buckets[from..].iter().sum()));
    out
}

type CgroupLabels<'a> = [(&'static str, &'a str); 4];

pub(super) fn cgroup_labels<'a>(path: &'a str, s: &'a Series) -> CgroupLabels<'a> {
    [
        ("namespace", s.labels.namespace.as_str()),
        ("pod", s.labels.pod.as_str()),
        ("container", s.labels.container.as_str()),
        ("cgroup", path),
    ]
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// The agent's own process, as the kernel accounts it: the standard `process_*` figures that
/// every Prometheus client library exports, read at each rendering.
pub struct ProcessFigures {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub open_fds: u64,
}

impl ProcessFigures {
    pub(super) fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        Self::parse(
            &stat,
            rustix::param::clock_ticks_per_second(),
            rustix::param::page_size() as u64,
            std::fs::read_dir("/proc/self/fd").ok()?.count() as u64,
        )
    }

    /// `stat` is /proc/<pid>/stat: fields after the command's closing parenthesis, from the
    /// state (field 3): utime is field 14, stime 15, rss (pages) 24.
    fn parse(stat: &str, ticks_per_second: u64, page_size: u64, open_fds: u64) -> Option<Self> {
        let rest = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        let ticks = field(14)? + field(15)?;
        Some(Self {
            cpu_seconds: ticks as f64 / ticks_per_second.max(1) as f64,
            resident_bytes: field(24)? * page_size,
            open_fds,
        })
    }
}

/// A number a counter or gauge can show.
#[derive(Clone, Copy)]
pub enum Value {
    Int(u64),
    Float(f64),
}

pub(super) fn counter(
    m: &mut MetricEncoder,
    labels: &impl EncodeLabelSet,
    v: Value,
) -> fmt::Result {
    let mut e = m.encode_family(labels)?;
    match v {
        Value::Int(v) => e.encode_counter::<NoLabelSet, _, f64>(&v, None),
        Value::Float(v) => e.encode_counter::<NoLabelSet, _, f64>(&v, None),
    }
}

pub(super) fn gauge(m: &mut MetricEncoder, labels: &impl EncodeLabelSet, v: Value) -> fmt::Result {
    let mut e = m.encode_family(labels)?;
    match v {
        Value::Int(v) => e.encode_gauge(&v),
        Value::Float(v) => e.encode_gauge(&v),
    }
}

/// A latency histogram; with `buckets` false, only its `+Inf` bucket, `_sum` and `_count` (the
/// mean stays computable, at three series).
pub(super) fn log2_histogram(
    m: &mut MetricEncoder,
    labels: &impl EncodeLabelSet,
    h: &Log2Histogram,
    with_buckets: bool,
) -> fmt::Result {
    let mut buckets = histogram_buckets(h);
    if !with_buckets {
        let total = buckets.iter().map(|(_, n)| n).sum();
        buckets = vec![(f64::INFINITY, total)];
    }
    // The count is the buckets' sum: the `+Inf` bucket and `_count` always agree, even when a
    // map read caught a probe between its count and bucket updates.
    let count = buckets.iter().map(|(_, n)| n).sum();
    m.encode_family(labels)?
        .encode_histogram::<NoLabelSet>(secs(h.sum_ns), count, &buckets, None)
}

pub(super) fn duration_histogram(m: &mut MetricEncoder, h: &DurationHistogram) -> fmt::Result {
    let buckets: Vec<(f64, u64)> = h
        .bounds
        .iter()
        .copied()
        .chain([f64::INFINITY])
        .zip(h.counts.iter().copied())
        .collect();
    m.encode_histogram::<NoLabelSet>(h.sum_seconds, h.count(), &buckets, None)
}

/// The registry's one collector: the exporter's state, read at each rendering.
struct StateCollector(Arc<Mutex<Exporter>>);

impl fmt::Debug for StateCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StateCollector")
    }
}

impl Collector for StateCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let e = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let ctx = super::families::Ctx {
            e: &e,
            process: ProcessFigures::read(),
        };
        super::families::encode(&mut enc, &ctx)
    }
}

/// Renders the exposition in OpenMetrics, at most once per collection (when the first scrape
/// after it asks, see [`super::server::Shared`]); scrapes serve the result (in the format and
/// encoding each asks for, see [`Rendered`]).
pub struct Renderer {
    registry: Registry,
    exporter: Arc<Mutex<Exporter>>,
}

impl Renderer {
    pub fn new(exporter: Arc<Mutex<Exporter>>) -> Self {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(StateCollector(Arc::clone(&exporter))));
        Self { registry, exporter }
    }

    /// The OpenMetrics text of the current state.
    pub fn openmetrics(&self) -> String {
        let hint = self
            .exporter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .exposition_bytes;
        // Sized from the previous rendering, so that the text is not copied as it grows.
        let mut text = String::with_capacity(hint + hint / 32 + 4096);
        if let Err(err) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            // Only our own encoding can fail (a String never does): keep what was written
            // whole, so that the scrape still gets an exposition.
            log::error!("encoding the metrics failed: {err}");
            let end = text.rfind('\n').map_or(0, |i| i + 1);
            text.truncate(end);
            text.push_str("# EOF\n");
        }
        text
    }

    pub fn render(&self) -> Rendered {
        let started = Instant::now();
        let openmetrics = self.openmetrics();
        let mut e = self.exporter.lock().unwrap_or_else(PoisonError::into_inner);
        e.render_seconds = started.elapsed().as_secs_f64();
        e.exposition_bytes = openmetrics.len();
        Rendered::new(openmetrics)
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, time::Duration};

    use super::*;
    use crate::export::classic;
    use crate::{
        collect::{CgroupWindow, Window},
        export::state::{ActiveFinding, Labels, ProgramStats, Tick},
        identity::{limits::Limits, workload::Identity},
        probes::{AttachKind, ProbeStatus},
        report::Availability,
    };
    use stormwatch_common::lock_kind;

    fn exporter() -> Arc<Mutex<Exporter>> {
        let mut e = Exporter::new(10, Duration::from_secs(60));
        e.avail = Availability::ALL;
        e.probes = vec![
            ProbeStatus {
                tracepoint: "sched:sched_switch",
                kind: Some(AttachKind::TpBtf),
                note: None,
            },
            ProbeStatus {
                tracepoint: "lock:contention_begin",
                kind: None,
                note: Some("missing".into()),
            },
            ProbeStatus {
                tracepoint: "sched:sched_waking",
                kind: None,
                note: Some(crate::probes::sched::ON_DEMAND_DETACHED.into()),
            },
        ];
        e.lost_events = vec![("map_full", 3)];
        e.programs = vec![ProgramStats {
            program: "sched_switch".into(),
            runs: 10,
            run_ns: 2_000,
        }];
        let mut w = CgroupWindow::ZERO;
        w.sched.voluntary_switches = 7;
        w.sched.involuntary_switches = 2;
        w.sched.oncpu_ns = 1_500_000_000;
        w.sched.runq.record(0);
        w.sched.runq.record(1500);
        w.sched.runq.record(3_000_000_000);
        w.futex.wait.record(2000);
        w.locks.count[lock_kind::MUTEX] = 4;
        w.locks.wait_ns[lock_kind::MUTEX] = 8000;
        let mut window = Window::empty();
        window.cgroups.insert(1, w);
        window.cgroups.insert(2, CgroupWindow::ZERO);
        let paths = HashMap::from([
            (1, "/kubepods/pod\"x\\y".to_owned()),
            (2, "/system.slice/a.service".to_owned()),
        ]);
        let identities = HashMap::from([(
            1,
            Identity {
                namespace: Some("shop".into()),
                pod: Some("web-1".into()),
                container: Some("app".into()),
                ..Identity::default()
            },
        )]);
        let limits = HashMap::from([(
            1,
            Limits {
                cpu_quota_cores: Some(1.5),
                cpuset_cpus: Some(vec![0, 1]),
                threads: Some(12),
                counters: crate::identity::limits::CpuCounters {
                    throttled_periods: Some(3),
                    throttled_seconds: Some(0.25),
                    ..Default::default()
                },
            },
        )]);
        let tick = Tick {
            window: &window,
            paths: &paths,
            identities: &identities,
            limits: &limits,
            now: std::time::Instant::now(),
        };
        e.cgroups.apply(&tick, |_| true);
        e.findings = vec![ActiveFinding {
            kind: "lock_storm",
            severity: "critical",
            cgroup: "/kubepods/pod\"x\\y".into(),
            labels: Labels {
                namespace: "shop".into(),
                pod: "web-1".into(),
                container: "app".into(),
            },
        }];
        Arc::new(Mutex::new(e))
    }

    #[test]
    fn process_figures_from_proc_stat() {
        // A command with spaces and a parenthesis, as /proc shows it.
        let stat = "4242 (stormwatch (x) y) S 1 4242 4242 0 -1 4194560 2361 0 0 0 \
                    250 50 0 0 20 0 3 0 12345 104857600 2000 18446744073709551615";
        let p = ProcessFigures::parse(stat, 100, 4096, 17).unwrap();
        assert_eq!(p.cpu_seconds, 3.0);
        assert_eq!(p.resident_bytes, 2000 * 4096);
        assert_eq!(p.open_fds, 17);
        assert!(ProcessFigures::parse("garbage", 100, 4096, 0).is_none());
        let live = ProcessFigures::read().expect("this process's own figures");
        assert!(live.resident_bytes > 0 && live.open_fds > 0);
    }

    #[test]
    fn buckets_are_exact_at_the_chosen_log2_edges() {
        let mut h = Log2Histogram::ZERO;
        for v in [
            0,
            5,
            16_383,
            16_384,
            131_071,
            131_072,
            (1 << 20) - 1,
            (1 << 22) - 1,
            1 << 22,
            (1 << 27) - 1,
            (1 << 30) - 1,
            1 << 30,
            1 << 40,
        ] {
            h.record(v);
        }
        let b = histogram_buckets(&h);
        let edges: Vec<f64> = b.iter().map(|(le, _)| *le).collect();
        assert_eq!(
            edges,
            [
                16_383e-9,
                131_071e-9,
                1_048_575e-9,
                4_194_303e-9,
                16_777_215e-9,
                134_217_727e-9,
                1_073_741_823e-9,
                f64::INFINITY
            ]
        );
        let counts: Vec<u64> = b.iter().map(|(_, n)| *n).collect();
        // 0, 5, 16383 | 16384, 131071 | 131072, 2^20-1 | 2^22-1 | 2^22 | 2^27-1 | 2^30-1 | 2^30, 2^40
        assert_eq!(counts, [3, 2, 2, 1, 1, 1, 1, 2]);
        assert_eq!(counts.iter().sum::<u64>(), h.count);
    }

    #[test]
    fn the_histograms_switch() {
        let e = exporter();
        let on = Renderer::new(Arc::clone(&e)).openmetrics();
        let runq = "stormwatch_runqueue_latency_seconds_bucket{le=";
        let futex = "stormwatch_futex_wait_duration_seconds";
        // Two cgroups with run-queue figures, eight buckets each; one with futex figures.
        assert_eq!(on.matches(runq).count(), 16, "{on}");
        assert_eq!(on.matches(&format!("{futex}_bucket{{")).count(), 8);
        assert!(on.contains("stormwatch_runqueue_latency_seconds_bucket{le=\"0.016777215\""));

        e.lock().unwrap().histograms = false;
        let off = Renderer::new(Arc::clone(&e)).openmetrics();
        assert!(!off.contains(futex), "{off}");
        let buckets: Vec<&str> = off.lines().filter(|l| l.starts_with(runq)).collect();
        assert_eq!(buckets.len(), 2, "only +Inf per cgroup: {buckets:?}");
        assert!(
            buckets
                .iter()
                .all(|l| l.starts_with(&format!("{runq}\"+Inf\"")))
        );
        // The mean stays computable, and the counters of futex waits stay.
        for kept in [
            "stormwatch_runqueue_latency_seconds_sum{",
            "stormwatch_runqueue_latency_seconds_count{namespace=\"shop\",pod=\"web-1\",\
             container=\"app\",cgroup=\"/kubepods/pod\\\"x\\\\y\"} 3",
            "stormwatch_futex_waits_total{namespace=\"shop\"",
            "stormwatch_futex_wait_seconds_total{namespace=\"shop\"",
        ] {
            assert!(off.contains(kept), "missing {kept:?} in:\n{off}");
        }
        let series = |t: &str| t.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(series(&on) - series(&off), 2 * 7 + 8 + 2, "{off}");
    }

    #[test]
    fn exposition_has_every_family_and_escapes_labels() {
        let r = Renderer::new(exporter());
        let text = r.openmetrics();
        assert!(text.ends_with("# EOF\n"), "{text}");
        let want = [
            "# TYPE stormwatch_context_switches counter",
            "stormwatch_context_switches_total{namespace=\"shop\",pod=\"web-1\",container=\"app\",\
             cgroup=\"/kubepods/pod\\\"x\\\\y\",type=\"voluntary\"} 7",
            "stormwatch_context_switches_total{namespace=\"\",pod=\"\",container=\"\",\
             cgroup=\"/system.slice/a.service\",type=\"involuntary\"} 0",
            "stormwatch_oncpu_seconds_total{namespace=\"shop\",pod=\"web-1\",container=\"app\",\
             cgroup=\"/kubepods/pod\\\"x\\\\y\"} 1.5",
            "# TYPE stormwatch_runqueue_latency_seconds histogram",
            "stormwatch_runqueue_latency_seconds_count{namespace=\"shop\",pod=\"web-1\",\
             container=\"app\",cgroup=\"/kubepods/pod\\\"x\\\\y\"} 3",
            "stormwatch_runqueue_latency_seconds_sum{namespace=\"shop\",pod=\"web-1\",\
             container=\"app\",cgroup=\"/kubepods/pod\\\"x\\\\y\"} 3.0000015",
            "stormwatch_runqueue_latency_seconds_bucket{le=\"+Inf\",namespace=\"shop\"",
            "stormwatch_futex_waits_total{namespace=\"shop\"",
            "stormwatch_futex_wait_duration_seconds_bucket{le=\"0.000016383\",namespace=\"shop\"",
            "stormwatch_kernel_lock_wait_seconds_total{namespace=\"shop\",pod=\"web-1\",\
             container=\"app\",cgroup=\"/kubepods/pod\\\"x\\\\y\",lock=\"mutex\"} 0.000008",
            "stormwatch_kernel_lock_waits_total{namespace=\"shop\",pod=\"web-1\",\
             container=\"app\",cgroup=\"/kubepods/pod\\\"x\\\\y\",lock=\"mutex\"} 4",
            "stormwatch_threads{namespace=\"shop\",pod=\"web-1\",container=\"app\",\
             cgroup=\"/kubepods/pod\\\"x\\\\y\"} 12",
            "stormwatch_cpu_quota_cores{namespace=\"shop\"",
            "stormwatch_cpuset_cpus{namespace=\"shop\",pod=\"web-1\",container=\"app\",\
             cgroup=\"/kubepods/pod\\\"x\\\\y\"} 2",
            "stormwatch_cpu_throttled_periods_total{namespace=\"shop\"",
            "stormwatch_cpu_throttled_seconds_total{namespace=\"shop\"",
            "stormwatch_findings{severity=\"critical\"} 1",
            "stormwatch_finding{kind=\"lock_storm\",severity=\"critical\",namespace=\"shop\"",
            "# TYPE stormwatch_build info",
            "stormwatch_build_info{version=\"",
            "stormwatch_probe_attached{tracepoint=\"sched:sched_switch\",kind=\"tp_btf\"} 1",
            "stormwatch_probe_attached{tracepoint=\"lock:contention_begin\",kind=\"\"} 0",
            "stormwatch_probe_attached{tracepoint=\"sched:sched_waking\",kind=\"\"} 0",
            "stormwatch_probe_on_demand{tracepoint=\"sched:sched_waking\"} 1",
            "stormwatch_bpf_program_runs_total{program=\"sched_switch\"} 10",
            "stormwatch_bpf_program_run_seconds_total{program=\"sched_switch\"} 0.000002",
            "stormwatch_lost_events_total{reason=\"map_full\"} 3",
            "stormwatch_collection_errors_total 0",
            "stormwatch_collection_duration_seconds_count 0",
            "stormwatch_cgroups_tracked 2",
            "stormwatch_cgroups_dropped_total 0",
        ];
        for w in want {
            assert!(text.contains(w), "missing {w:?} in:\n{text}");
        }
        // Futex figures only for cgroups that had futex events; lock kinds only when contended.
        assert!(!text.contains("stormwatch_futex_waits_total{namespace=\"\""));
        assert!(!text.contains("lock=\"spin\""));
        // Every family has help text.
        let types = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
        let helps = text.lines().filter(|l| l.starts_with("# HELP ")).count();
        assert_eq!(types, helps);
        for l in text.lines().filter(|l| l.starts_with("# HELP ")) {
            assert!(l.split(' ').count() > 3, "help text: {l}");
        }
    }

    #[test]
    fn the_host_series() {
        let e = exporter();
        let text = Renderer::new(Arc::clone(&e)).openmetrics();
        assert!(
            !text.contains("stormwatch_host"),
            "nothing before the host is read"
        );
        {
            let mut e = e.lock().unwrap();
            e.host = Some(crate::host::Host {
                cpus: 56,
                hypervisor: Some("kvm".into()),
                numa_nodes: Some(2),
                kernel: "6.18.0-1-amd64".into(),
            });
            e.host_steal_seconds = Some(12.34);
        }
        let text = Renderer::new(Arc::clone(&e)).openmetrics();
        for want in [
            "# TYPE stormwatch_host info",
            "stormwatch_host_info{hypervisor=\"kvm\",kernel=\"6.18.0-1-amd64\"} 1",
            "stormwatch_host_cpus 56",
            "stormwatch_host_numa_nodes 2",
            "# TYPE stormwatch_host_steal_seconds counter",
            "stormwatch_host_steal_seconds_total 12.34",
        ] {
            assert!(text.contains(want), "missing {want:?} in:\n{text}");
        }
        let classic = classic::from_openmetrics(&text);
        assert!(classic.contains("# TYPE stormwatch_host_info gauge"));
        assert!(classic.contains("# TYPE stormwatch_host_steal_seconds_total counter"));
        {
            let mut e = e.lock().unwrap();
            e.host.as_mut().unwrap().hypervisor = None;
            e.host.as_mut().unwrap().numa_nodes = None;
        }
        let text = Renderer::new(e).openmetrics();
        assert!(text.contains("stormwatch_host_info{hypervisor=\"none\","));
        assert!(!text.contains("stormwatch_host_numa_nodes"));
    }

    /// Every family the exporter writes, on a fixed state with every figure (cgroups, findings,
    /// the host, the network, the agent's own): the exposition, in both formats, is compared
    /// byte for byte with the one kept in `testdata/` — a change of name, help, type, label or
    /// value anywhere shows. The agent's process figures (read from /proc at each rendering)
    /// are left out. `STORMWATCH_BLESS=1` rewrites the files after an intended change.
    #[test]
    fn the_exposition_is_the_golden_one() {
        use crate::export::network::{InterfaceInfo, Owner};
        use std::collections::HashSet;
        use stormwatch_common::net::{NetDropKey, NetDropStats, NetIfKey, NetIfStats, len_bucket};
        let e = exporter();
        {
            let mut e = e.lock().unwrap();
            e.host = Some(crate::host::Host {
                cpus: 56,
                hypervisor: Some("kvm".into()),
                numa_nodes: Some(2),
                kernel: "6.18.0-1-amd64".into(),
            });
            e.host_steal_seconds = Some(12.34);
            let pod = NetIfKey {
                netns: 7,
                ifindex: 2,
            };
            let mut s = NetIfStats::ZERO;
            s.tx.packets = 10;
            s.tx.bytes = 1000;
            s.tx.len[len_bucket::AT_MTU] = 4;
            s.tx.len[2] = 6;
            s.rx.packets = 3;
            s.mtu = 1450;
            let mut window = Window::empty();
            window.net_ifaces.insert(pod, s);
            window.net_drops.insert(
                NetDropKey {
                    netns: 7,
                    ifindex: 2,
                    reason: 2,
                    _pad: 0,
                },
                NetDropStats { packets: 6 },
            );
            let owner = Owner {
                cgroup: "/kubepods/pod1/c1".into(),
                labels: Labels {
                    namespace: "shop".into(),
                    pod: "web-1".into(),
                    container: "app".into(),
                },
            };
            e.network
                .apply(&window, &HashSet::from([pod]), HashMap::from([(7, owner)]));
            e.network.inventory.insert(
                pod,
                InterfaceInfo {
                    name: "eth0".into(),
                    kind: "vxlan".into(),
                    mtu: 1450,
                    encapsulation_overhead: Some(50),
                    underlay_path_mtu: Some(1500),
                },
            );
        }
        let om = Renderer::new(e).openmetrics();
        let keep = |t: &str| {
            t.lines()
                .filter(|l| !l.contains("process_"))
                .map(|l| format!("{l}\n"))
                .collect::<String>()
        };
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/export/testdata");
        for (file, text) in [
            ("metrics.openmetrics.golden", keep(&om)),
            (
                "metrics.classic.golden",
                keep(&classic::from_openmetrics(&om)),
            ),
        ] {
            let path = dir.join(file);
            if std::env::var_os("STORMWATCH_BLESS").is_some() {
                std::fs::write(&path, &text).unwrap();
            }
            let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
                panic!("{}: {e} (STORMWATCH_BLESS=1 writes it)", path.display())
            });
            if text != want {
                let first = text
                    .lines()
                    .zip(want.lines())
                    .position(|(a, b)| a != b)
                    .unwrap_or(text.lines().count().min(want.lines().count()));
                panic!(
                    "{file} differs from the exposition at line {}: got {:?}, want {:?}",
                    first + 1,
                    text.lines().nth(first),
                    want.lines().nth(first)
                );
            }
        }
    }

    #[test]
    fn missing_probes_mean_missing_families_not_zeros() {
        let e = exporter();
        e.lock().unwrap().avail = Availability {
            switch: true,
            ..Availability::default()
        };
        let text = Renderer::new(e).openmetrics();
        assert!(text.contains("stormwatch_context_switches_total"));
        assert!(!text.contains("stormwatch_runqueue_latency_seconds"));
        assert!(!text.contains("stormwatch_wakeups"));
        assert!(!text.contains("stormwatch_futex"));
        assert!(!text.contains("stormwatch_kernel_lock"));
    }
}
