//! Writing figures as samples: counters and gauges of either number type, log2 latency
//! histograms with the exported bucket edges, duration histograms, the cgroup labels, and the
//! agent's own process figures. Below the family table, which writes every sample through it.

use std::fmt;

use prometheus_client::encoding::{EncodeLabelSet, MetricEncoder, NoLabelSet};
use stormwatch_common::Log2Histogram;

use super::state::{DurationHistogram, Series};
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
        let stat = crate::files::kernel_text("/proc/self/stat")?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
