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
    metrics::MetricType,
    registry::Registry,
};
use stormwatch_common::{Log2Histogram, lock_kind};

use super::{
    Rendered,
    state::{DurationHistogram, Exporter, SEVERITIES, Series},
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
struct ProcessFigures {
    cpu_seconds: f64,
    resident_bytes: u64,
    open_fds: u64,
}

impl ProcessFigures {
    fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        Self::parse(
            &stat,
            rustix::param::clock_ticks_per_second(),
            rustix::param::page_size() as u64,
            std::fs::read_dir("/proc/self/fd").ok()?.count() as u64,
        )
    }

    /// `stat` is /proc/<pid>/stat, parsed by procfs-core: utime and stime (clock ticks), rss
    /// (pages).
    fn parse(stat: &str, ticks_per_second: u64, page_size: u64, open_fds: u64) -> Option<Self> {
        use procfs_core::FromRead as _;
        let stat = procfs_core::process::Stat::from_read(stat.as_bytes()).ok()?;
        Some(Self {
            cpu_seconds: (stat.utime + stat.stime) as f64 / ticks_per_second.max(1) as f64,
            resident_bytes: stat.rss * page_size,
            open_fds,
        })
    }
}

/// A number a counter or gauge can show.
#[derive(Clone, Copy)]
pub(super) enum Value {
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
fn log2_histogram(
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

fn duration_histogram(m: &mut MetricEncoder, h: &DurationHistogram) -> fmt::Result {
    let buckets: Vec<(f64, u64)> = h
        .bounds
        .iter()
        .copied()
        .chain([f64::INFINITY])
        .zip(h.counts.iter().copied())
        .collect();
    m.encode_histogram::<NoLabelSet>(h.sum_seconds, h.count(), &buckets, None)
}

/// Encodes one per-cgroup family over the series `value` has a figure for.
pub(super) fn per_cgroup(
    enc: &mut DescriptorEncoder,
    e: &Exporter,
    name: &str,
    help: &str,
    metric_type: MetricType,
    value: impl Fn(&Series) -> Option<Value>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, metric_type)?;
    for (path, s) in e.cgroups.series() {
        if let Some(v) = value(s) {
            let labels = cgroup_labels(path, s);
            match metric_type {
                MetricType::Counter => counter(&mut m, &labels, v)?,
                _ => gauge(&mut m, &labels, v)?,
            }
        }
    }
    Ok(())
}

/// Encodes one per-cgroup counter family with one series per value of the label `by`.
fn per_cgroup_by<const N: usize>(
    enc: &mut DescriptorEncoder,
    e: &Exporter,
    name: &str,
    help: &str,
    by: &str,
    values: impl Fn(&Series) -> [(&'static str, u64); N],
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (path, s) in e.cgroups.series() {
        let base = cgroup_labels(path, s);
        for (value, n) in values(s) {
            counter(&mut m, &(base, [(by, value)]), Value::Int(n))?;
        }
    }
    Ok(())
}

fn encode_cgroups(enc: &mut DescriptorEncoder, e: &Exporter) -> fmt::Result {
    use MetricType::{Counter, Gauge, Histogram};
    use Value::{Float, Int};
    let a = e.avail;
    let series = e.cgroups.series();

    if a.switch {
        per_cgroup_by(
            enc,
            e,
            "stormwatch_context_switches",
            "Context switches of the cgroup's tasks, by type: voluntary (the task blocked) or \
             involuntary (it was preempted).",
            "type",
            |s| {
                let sched = &s.totals.sched;
                [
                    ("voluntary", sched.voluntary_switches),
                    ("involuntary", sched.involuntary_switches),
                ]
            },
        )?;
        per_cgroup(
            enc,
            e,
            "stormwatch_migrations",
            "Migrations of the cgroup's tasks from one CPU to another.",
            Counter,
            |s| Some(Int(s.totals.sched.migrations)),
        )?;
        per_cgroup(
            enc,
            e,
            "stormwatch_oncpu_seconds",
            "Time the cgroup's tasks spent on a CPU.",
            Counter,
            |s| Some(Float(secs(s.totals.sched.oncpu_ns))),
        )?;
    }
    if a.wakeup {
        per_cgroup(
            enc,
            e,
            "stormwatch_offcpu_seconds",
            "Time the cgroup's tasks spent off CPU, blocked or sleeping, until woken.",
            Counter,
            |s| Some(Float(secs(s.totals.sched.offcpu_ns))),
        )?;
        let mut m = enc.encode_descriptor(
            "stormwatch_runqueue_latency_seconds",
            "Time from a task's wake-up to its running on a CPU (run-queue latency).",
            None,
            Histogram,
        )?;
        for (path, s) in series {
            log2_histogram(
                &mut m,
                &cgroup_labels(path, s),
                &s.totals.sched.runq,
                e.histograms,
            )?;
        }
    }
    if a.wake_kinds {
        per_cgroup_by(
            enc,
            e,
            "stormwatch_wakeups",
            "Wake-ups of the cgroup's tasks, by kind: local (the waker ran on the CPU the task \
             was queued on) or remote (another CPU: an inter-processor interrupt, a VM exit on \
             most hypervisors). Counted while the wake-up probes are attached (with \
             wake_kinds = \"on-demand\", while a lock storm is found).",
            "kind",
            |s| {
                let sched = &s.totals.sched;
                [
                    ("local", sched.wake_local.count),
                    ("remote", sched.wake_remote.count),
                ]
            },
        )?;
    }
    if a.futex {
        per_cgroup(
            enc,
            e,
            "stormwatch_futex_waits",
            "Futex wait calls of the cgroup's tasks (FUTEX_WAIT, WAIT_BITSET, LOCK_PI, futex_wait(v)).",
            Counter,
            |s| {
                s.has_futex_figures()
                    .then_some(Int(s.totals.futex.wait.count))
            },
        )?;
        per_cgroup(
            enc,
            e,
            "stormwatch_futex_wait_seconds",
            "Time the cgroup's tasks spent in futex waits, summed over tasks.",
            Counter,
            |s| {
                s.has_futex_figures()
                    .then_some(Float(secs(s.totals.futex.wait.sum_ns)))
            },
        )?;
        per_cgroup(
            enc,
            e,
            "stormwatch_futex_wakes",
            "Futex wake calls of the cgroup's tasks.",
            Counter,
            |s| s.has_futex_figures().then_some(Int(s.totals.futex.wakes)),
        )?;
        per_cgroup(
            enc,
            e,
            "stormwatch_futex_timeouts",
            "Futex waits of the cgroup's tasks that ended in a timeout.",
            Counter,
            |s| {
                s.has_futex_figures()
                    .then_some(Int(s.totals.futex.timeouts))
            },
        )?;
        // Not `stormwatch_futex_wait_seconds`: that name's `_total` is the counter above.
        // Without buckets its sum and count would repeat the two counters above: left out.
        if e.histograms {
            let mut m = enc.encode_descriptor(
                "stormwatch_futex_wait_duration_seconds",
                "Duration of single futex waits.",
                None,
                Histogram,
            )?;
            for (path, s) in series.iter().filter(|(_, s)| s.has_futex_figures()) {
                log2_histogram(&mut m, &cgroup_labels(path, s), &s.totals.futex.wait, true)?;
            }
        }
    }
    if a.locks {
        for (name, help, wait) in [
            (
                "stormwatch_kernel_lock_wait_seconds",
                "Time the cgroup's tasks waited for contended kernel locks, by lock kind.",
                true,
            ),
            (
                "stormwatch_kernel_lock_waits",
                "Contended kernel lock acquisitions of the cgroup's tasks, by lock kind.",
                false,
            ),
        ] {
            let mut m = enc.encode_descriptor(name, help, None, Counter)?;
            for (path, s) in series {
                let base = cgroup_labels(path, s);
                let l = &s.totals.locks;
                // A kind's series appears with its first contended wait.
                for (k, kind) in lock_kind::NAMES.iter().enumerate() {
                    if l.count[k] == 0 {
                        continue;
                    }
                    let v = if wait {
                        Float(secs(l.wait_ns[k]))
                    } else {
                        Int(l.count[k])
                    };
                    counter(&mut m, &(base, [("lock", *kind)]), v)?;
                }
            }
        }
    }

    // Resource context. Gauges describe live cgroups only; throttling counters stay with the
    // other counters through the grace period.
    let live = |s: &Series| s.removed_at.is_none();
    per_cgroup(
        enc,
        e,
        "stormwatch_threads",
        "Tasks (threads) in the cgroup (pids.current), read every 60 s (every 10 s with a CPU quota).",
        Gauge,
        |s| {
            live(s)
                .then(|| s.limits.as_ref()?.threads.map(Int))
                .flatten()
        },
    )?;
    per_cgroup(
        enc,
        e,
        "stormwatch_cpu_quota_cores",
        "CPU quota (cpu.max) in cores; absent when unlimited.",
        Gauge,
        |s| {
            live(s)
                .then(|| s.limits.as_ref()?.cpu_quota_cores.map(Float))
                .flatten()
        },
    )?;
    per_cgroup(
        enc,
        e,
        "stormwatch_cpuset_cpus",
        "CPUs in the cgroup's effective cpuset.",
        Gauge,
        |s| {
            live(s)
                .then(|| {
                    let cpus = s.limits.as_ref()?.cpuset_cpus.as_ref()?;
                    Some(Int(cpus.len() as u64))
                })
                .flatten()
        },
    )?;
    per_cgroup(
        enc,
        e,
        "stormwatch_cpu_throttled_periods",
        "CFS periods in which the cgroup was throttled by its quota, since the agent started \
         (or since the cgroup was created).",
        Counter,
        |s| s.throttled_periods().map(Int),
    )?;
    per_cgroup(
        enc,
        e,
        "stormwatch_cpu_throttled_seconds",
        "Time the cgroup was throttled by its quota, since the agent started (or since the \
         cgroup was created).",
        Counter,
        |s| s.throttled_seconds().map(Float),
    )?;
    Ok(())
}

fn encode_findings(enc: &mut DescriptorEncoder, e: &Exporter) -> fmt::Result {
    let mut m = enc.encode_descriptor(
        "stormwatch_findings",
        "Findings of the diagnosis rules over the sliding window, by severity.",
        None,
        MetricType::Gauge,
    )?;
    for severity in SEVERITIES {
        let n = e.findings.iter().filter(|f| f.severity == severity).count();
        gauge(&mut m, &[("severity", severity)], Value::Int(n as u64))?;
    }
    let mut m = enc.encode_descriptor(
        "stormwatch_finding",
        "1 while a diagnosis rule holds for a cgroup over the sliding window \
         (see stormwatch diagnose for the evidence).",
        None,
        MetricType::Gauge,
    )?;
    for f in &e.findings {
        let labels = [
            ("kind", f.kind),
            ("severity", f.severity),
            ("namespace", f.labels.namespace.as_str()),
            ("pod", f.labels.pod.as_str()),
            ("container", f.labels.container.as_str()),
            ("cgroup", f.cgroup.as_str()),
        ];
        gauge(&mut m, &labels, Value::Int(1))?;
    }
    Ok(())
}

/// The host's context: what it is (info), its CPUs, and the steal counter.
fn encode_host(enc: &mut DescriptorEncoder, e: &Exporter) -> fmt::Result {
    if let Some(h) = &e.host {
        let mut m = enc.encode_descriptor(
            "stormwatch_host",
            "The host: hypervisor (kvm, xen, hyperv, vmware, ...; unknown when a hypervisor does \
             not say which; none on bare metal) and kernel release.",
            None,
            MetricType::Info,
        )?;
        m.encode_info(&[
            ("hypervisor", h.hypervisor.as_deref().unwrap_or("none")),
            ("kernel", h.kernel.as_str()),
        ])?;
        let mut m = enc.encode_descriptor(
            "stormwatch_host_cpus",
            "Online CPUs of the host.",
            None,
            MetricType::Gauge,
        )?;
        m.encode_gauge(&u64::from(h.cpus))?;
        if let Some(nodes) = h.numa_nodes {
            let mut m = enc.encode_descriptor(
                "stormwatch_host_numa_nodes",
                "Online NUMA nodes of the host.",
                None,
                MetricType::Gauge,
            )?;
            m.encode_gauge(&u64::from(nodes))?;
        }
    }
    if let Some(steal) = e.host_steal_seconds {
        let mut m = enc.encode_descriptor(
            "stormwatch_host_steal_seconds",
            "CPU time the hypervisor gave to others while the host's vCPUs had work (steal, \
             from /proc/stat), summed over CPUs, since the host booted.",
            None,
            MetricType::Counter,
        )?;
        m.encode_counter::<NoLabelSet, _, f64>(&steal, None)?;
    }
    Ok(())
}

fn encode_self(enc: &mut DescriptorEncoder, e: &Exporter) -> fmt::Result {
    use MetricType::{Counter, Gauge};
    use Value::{Float, Int};
    let mut m = enc.encode_descriptor(
        "stormwatch_build",
        "The agent's version.",
        None,
        MetricType::Info,
    )?;
    m.encode_info(&[("version", env!("CARGO_PKG_VERSION"))])?;

    let mut m = enc.encode_descriptor(
        "stormwatch_probe_attached",
        "1 when the probe on this tracepoint is attached (kind: tp_btf or tracepoint), 0 when not.",
        None,
        Gauge,
    )?;
    for p in &e.probes {
        let kind = p.kind.map(|k| k.to_string()).unwrap_or_default();
        let labels = [("tracepoint", p.tracepoint), ("kind", kind.as_str())];
        gauge(&mut m, &labels, Int(u64::from(p.attached())))?;
    }
    let mut m = enc.encode_descriptor(
        "stormwatch_probe_on_demand",
        "1 for a probe loaded at start and attached only while needed: the wake-up probes while a \
         lock storm is found (wake_kinds = \"on-demand\"), the futex probes while a cgroup's \
         scheduler figures look like a lock storm (futex_probes = \"on-demand\"), the per-packet \
         network probes while packets do not fit and in surveys (net_packet_probes = \
         \"on-demand\").",
        None,
        Gauge,
    )?;
    for p in e.probes.iter().filter(|p| p.on_demand()) {
        gauge(&mut m, &[("tracepoint", p.tracepoint)], Int(1))?;
    }

    let mut m = enc.encode_descriptor(
        "stormwatch_bpf_stats_enabled",
        "1 when the kernel's BPF run-time statistics are on (else the program run counters stand still).",
        None,
        Gauge,
    )?;
    m.encode_gauge(&u64::from(e.bpf_stats_enabled))?;
    let mut m = enc.encode_descriptor(
        "stormwatch_bpf_program_runs",
        "Runs of each of the agent's BPF programs, from the kernel's BPF statistics.",
        None,
        Counter,
    )?;
    for p in &e.programs {
        counter(&mut m, &[("program", p.program.as_str())], Int(p.runs))?;
    }
    let mut m = enc.encode_descriptor(
        "stormwatch_bpf_program_run_seconds",
        "Time spent running each of the agent's BPF programs, from the kernel's BPF statistics.",
        None,
        Counter,
    )?;
    for p in &e.programs {
        counter(
            &mut m,
            &[("program", p.program.as_str())],
            Float(secs(p.run_ns)),
        )?;
    }

    let mut m = enc.encode_descriptor(
        "stormwatch_lost_events",
        "Events the probes could not record, by reason, since they were attached.",
        None,
        Counter,
    )?;
    for (reason, n) in &e.lost_events {
        counter(&mut m, &[("reason", *reason)], Int(*n))?;
    }

    let mut m = enc.encode_descriptor(
        "stormwatch_collection_errors",
        "Collections that failed (reading the probes' maps); the next collection covers the gap.",
        None,
        Counter,
    )?;
    m.encode_counter::<NoLabelSet, _, f64>(&e.collection_errors, None)?;
    let mut m = enc.encode_descriptor(
        "stormwatch_collection_duration_seconds",
        "Time one collection took (reading the maps, naming cgroups, reading limits, diagnosis).",
        None,
        MetricType::Histogram,
    )?;
    duration_histogram(&mut m, &e.collection_duration)?;
    if let Some(t) = e.last_collection_unix_seconds {
        let mut m = enc.encode_descriptor(
            "stormwatch_last_collection_timestamp_seconds",
            "Unix time of the last collection.",
            None,
            Gauge,
        )?;
        m.encode_gauge(&t)?;
    }
    let mut m = enc.encode_descriptor(
        "stormwatch_render_duration_seconds",
        "Time the previous rendering of this exposition took.",
        None,
        Gauge,
    )?;
    m.encode_gauge(&e.render_seconds)?;
    let mut m = enc.encode_descriptor(
        "stormwatch_exposition_bytes",
        "Size of the previous rendering of this exposition (OpenMetrics text).",
        None,
        Gauge,
    )?;
    m.encode_gauge(&(e.exposition_bytes as u64))?;

    if let Some(p) = ProcessFigures::read() {
        let mut m = enc.encode_descriptor(
            "process_cpu_seconds",
            "CPU time the agent's process used, user and system (/proc/self/stat).",
            None,
            Counter,
        )?;
        m.encode_counter::<NoLabelSet, _, f64>(&p.cpu_seconds, None)?;
        let mut m = enc.encode_descriptor(
            "process_resident_memory_bytes",
            "The agent's resident memory (/proc/self/stat); BPF maps are charged to its \
             memory cgroup, not counted here.",
            None,
            Gauge,
        )?;
        m.encode_gauge(&p.resident_bytes)?;
        let mut m = enc.encode_descriptor(
            "process_open_fds",
            "File descriptors the agent's process holds (BPF maps, programs and links among \
             them).",
            None,
            Gauge,
        )?;
        m.encode_gauge(&p.open_fds)?;
    }

    let c = &e.cgroups;
    for (name, help, v) in [
        (
            "stormwatch_cgroups_tracked",
            "Cgroups exported, including removed ones in their grace period.",
            c.series().len(),
        ),
        (
            "stormwatch_cgroups_removed",
            "Removed cgroups whose series are kept for the grace period.",
            c.removed(),
        ),
        (
            "stormwatch_cgroups_max",
            "The most cgroups exported at once (max_cgroups).",
            c.max_cgroups(),
        ),
    ] {
        let mut m = enc.encode_descriptor(name, help, None, Gauge)?;
        m.encode_gauge(&(v as u64))?;
    }
    for (name, help, v) in [
        (
            "stormwatch_cgroups_dropped",
            "Cgroups not exported because max_cgroups were already tracked.",
            c.dropped_total,
        ),
        (
            "stormwatch_cgroups_unresolved",
            "Cgroups with figures not exported because they were removed before their path \
             could be read.",
            c.unresolved_total,
        ),
    ] {
        let mut m = enc.encode_descriptor(name, help, None, Counter)?;
        m.encode_counter::<NoLabelSet, _, f64>(&v, None)?;
    }
    Ok(())
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
        encode_cgroups(&mut enc, &e)?;
        super::network::encode_cgroups(&mut enc, &e)?;
        super::network::encode_interfaces(&mut enc, &e)?;
        encode_findings(&mut enc, &e)?;
        encode_host(&mut enc, &e)?;
        encode_self(&mut enc, &e)
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
        // A command with spaces and a parenthesis, as /proc shows it (the whole line of a 6.18
        // kernel: utime 250, stime 50, rss 2000 pages).
        let stat = "4242 (stormwatch (x) y) S 1 4242 4242 0 -1 4194560 2361 0 0 0 \
                    250 50 0 0 20 0 3 0 12345 104857600 2000 18446744073709551615 \
                    94645393670144 94645393690025 140728777893168 0 0 0 0 0 0 0 0 0 17 0 0 0 0 \
                    0 0 94645393706032 94645393707648 94645601714176 140728777898692 \
                    140728777898712 140728777898712 140728777900011 0\n";
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
