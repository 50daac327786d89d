//! Every exported family, declared once, as data: its name, help, type, unit, labels, when it
//! is absent, and the figure it reads. One loop ([`encode`]) writes them all, and the metric
//! reference in `agent/METRICS.md` is generated from the same table ([`reference()`]; a test fails
//! on any difference), so name, help, type and labels cannot drift between the two.
//!
//! Owns: the table and the encoding loop. Imports the exporter's state (`super::state`,
//! `super::network`) and the helpers that turn figures into samples (`super::metrics`); nothing
//! above `export` imports it but through [`encode`].
//!
//! Adding a figure to `/metrics` is one entry here: a per-cgroup figure is a [`Read::Cgroup`]
//! (or [`Read::CgroupBy`] with one more label) reading the series' totals.

use std::fmt;

use prometheus_client::{
    encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet},
    metrics::MetricType,
};
use stormwatch_common::Log2Histogram;

use super::{
    encode::{
        ProcessFigures, Value, cgroup_labels, counter, duration_histogram, gauge, log2_histogram,
    },
    state::{DurationHistogram, Exporter, Series},
};

/// What the readers see: the exporter's state, and the agent's own process figures (read once
/// per rendering).
pub struct Ctx<'a> {
    pub e: &'a Exporter,
    pub process: Option<ProcessFigures>,
}

/// A family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
    Info,
}

impl Kind {
    fn metric_type(self) -> MetricType {
        match self {
            Kind::Counter => MetricType::Counter,
            Kind::Gauge => MetricType::Gauge,
            Kind::Histogram => MetricType::Histogram,
            Kind::Info => MetricType::Info,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
            Kind::Info => "info",
        }
    }
}

/// The section of the reference a family is listed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Cgroup,
    Finding,
    Interface,
    Host,
    Agent,
}

impl Scope {
    const ALL: [Scope; 5] = [
        Scope::Cgroup,
        Scope::Finding,
        Scope::Interface,
        Scope::Host,
        Scope::Agent,
    ];

    fn title(self) -> &'static str {
        match self {
            Scope::Cgroup => "Per container (cgroup)",
            Scope::Finding => "Findings",
            Scope::Interface => "Per interface (network)",
            Scope::Host => "The host",
            Scope::Agent => "The agent itself",
        }
    }
}

/// One sample's figure.
pub enum Sample<'a> {
    Value(Value),
    /// A log2 latency histogram; `false`: only its `+Inf` bucket, `_sum` and `_count`.
    Log2(&'a Log2Histogram, bool),
    Durations(&'a DurationHistogram),
    Info,
}

/// Receives a family's samples: label values (in the family's `labels` order) and the figure.
pub type Emit<'e, 'a> = dyn FnMut(&[&str], Sample<'a>) -> fmt::Result + 'e;

/// Where a family's figures come from.
pub enum Read {
    /// Per cgroup: one sample (labels: the cgroup's four), or none for that cgroup.
    Cgroup(fn(&Series) -> Option<Value>),
    /// Per cgroup: one sample per value of the family's last label.
    CgroupBy(fn(&Series) -> Vec<(&'static str, Value)>),
    /// Per cgroup: a latency histogram, with its buckets when the config's `histograms` is on.
    CgroupHistogram(fn(&Series) -> Option<&Log2Histogram>),
    /// Anything else: the samples from the whole state.
    Samples(for<'a> fn(&'a Ctx<'a>, &mut Emit<'_, 'a>) -> fmt::Result),
}

/// One exported family.
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    /// The base unit of its figures (in its name, as Prometheus names go), or "".
    pub unit: &'static str,
    pub labels: &'static [&'static str],
    pub scope: Scope,
    /// When the family is written at all (its probe attached, its figure known).
    pub present: fn(&Ctx) -> bool,
    /// When it is absent, or a series of it is, for the reference ("" when always there).
    pub absent: &'static str,
    pub read: Read,
}

const CGROUP: &[&str] = &["namespace", "pod", "container", "cgroup"];
#[cfg(test)]
const IFACE: [&str; 7] = [
    "netns",
    "ifindex",
    "interface",
    "namespace",
    "pod",
    "container",
    "cgroup",
];
/// The most labels a family has.
const MAX_LABELS: usize = 9;

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn always(_: &Ctx) -> bool {
    true
}

use Value::{Float, Int};

/// Every family, in the order of the exposition.
mod cgroup;
mod interface;
mod node;

/// Every family, in the order of the exposition: per cgroup, per interface, then the node's
/// (findings, the host, the agent itself).
pub fn all() -> impl Iterator<Item = &'static Family> {
    cgroup::FAMILIES
        .iter()
        .chain(interface::FAMILIES)
        .chain(node::FAMILIES)
}

/// Writes one sample of a family, its labels named as the family declares them.
fn write(m: &mut MetricEncoder, f: &Family, values: &[&str], sample: Sample) -> fmt::Result {
    debug_assert_eq!(values.len(), f.labels.len(), "{}: label values", f.name);
    let mut buf: [(&str, &str); MAX_LABELS] = [("", ""); MAX_LABELS];
    let n = f.labels.len().min(values.len());
    for (slot, (name, value)) in buf.iter_mut().zip(f.labels.iter().zip(values)) {
        *slot = (name, value);
    }
    let labels: &[(&str, &str)] = &buf[..n];
    match (f.kind, sample) {
        (Kind::Counter, Sample::Value(v)) if n == 0 => match v {
            Int(v) => m.encode_counter::<NoLabelSet, _, f64>(&v, None),
            Float(v) => m.encode_counter::<NoLabelSet, _, f64>(&v, None),
        },
        (Kind::Gauge, Sample::Value(v)) if n == 0 => match v {
            Int(v) => m.encode_gauge(&v),
            Float(v) => m.encode_gauge(&v),
        },
        (Kind::Counter, Sample::Value(v)) => counter(m, &labels, v),
        (Kind::Gauge, Sample::Value(v)) => gauge(m, &labels, v),
        (Kind::Histogram, Sample::Log2(h, buckets)) => log2_histogram(m, &labels, h, buckets),
        (Kind::Histogram, Sample::Durations(h)) => duration_histogram(m, h),
        (Kind::Info, Sample::Info) => m.encode_info(&labels),
        _ => {
            debug_assert!(false, "{}: a sample of another type", f.name);
            Ok(())
        }
    }
}

/// Writes every family present in the state.
pub fn encode(enc: &mut DescriptorEncoder, c: &Ctx) -> fmt::Result {
    for f in all() {
        if !(f.present)(c) {
            continue;
        }
        let mut m = enc.encode_descriptor(f.name, f.help, None, f.kind.metric_type())?;
        match &f.read {
            Read::Cgroup(value) => {
                for (path, s) in c.e.cgroups.series() {
                    if let Some(v) = value(s) {
                        let l = cgroup_labels(path, s);
                        write(
                            &mut m,
                            f,
                            &[l[0].1, l[1].1, l[2].1, l[3].1],
                            Sample::Value(v),
                        )?;
                    }
                }
            }
            Read::CgroupBy(values) => {
                for (path, s) in c.e.cgroups.series() {
                    let l = cgroup_labels(path, s);
                    for (by, v) in values(s) {
                        write(
                            &mut m,
                            f,
                            &[l[0].1, l[1].1, l[2].1, l[3].1, by],
                            Sample::Value(v),
                        )?;
                    }
                }
            }
            Read::CgroupHistogram(h) => {
                for (path, s) in c.e.cgroups.series() {
                    if let Some(h) = h(s) {
                        let l = cgroup_labels(path, s);
                        write(
                            &mut m,
                            f,
                            &[l[0].1, l[1].1, l[2].1, l[3].1],
                            Sample::Log2(h, c.e.histograms),
                        )?;
                    }
                }
            }
            Read::Samples(read) => {
                let mut emit = |values: &[&str], sample: Sample| write(&mut m, f, values, sample);
                read(c, &mut emit)?;
            }
        }
    }
    Ok(())
}

/// The metric reference of `agent/METRICS.md`, generated from [`all`].
pub fn reference() -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for scope in Scope::ALL {
        let _ = write!(
            out,
            "### {}\n\n| family | type | labels | absent when | what it is |\n|---|---|---|---|---|\n",
            scope.title()
        );
        for f in all().filter(|f| f.scope == scope) {
            let labels = if f.labels.is_empty() {
                "(none)".to_owned()
            } else {
                f.labels.join(", ")
            };
            let absent = if f.absent.is_empty() { "—" } else { f.absent };
            let _ = writeln!(
                out,
                "| `{}` | {} | {labels} | {absent} | {} |",
                f.name,
                f.kind.name(),
                f.help.replace('|', "\\|")
            );
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEGIN: &str = "<!-- The reference below is generated from agent/src/export/families.rs \
                         (cargo +stable xtask manifests); do not edit it by hand. -->\n";
    const END: &str = "<!-- End of the generated reference. -->\n";

    /// The reference in METRICS.md is the table's, to the byte: name, type, labels, when
    /// absent and help. `STORMWATCH_BLESS=1` (what `cargo xtask manifests` sets) rewrites it.
    #[test]
    fn the_metric_reference_is_generated_from_the_families() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("METRICS.md");
        let doc = std::fs::read_to_string(&path).expect("METRICS.md");
        let start = doc
            .find(BEGIN)
            .expect("the generated reference's start marker")
            + BEGIN.len();
        let end = doc.find(END).expect("the generated reference's end marker");
        let want = reference();
        if std::env::var_os("STORMWATCH_BLESS").is_some() && doc[start..end] != want {
            let new = format!("{}{want}{}", &doc[..start], &doc[end..]);
            std::fs::write(&path, new).expect("writing METRICS.md");
            return;
        }
        assert!(
            doc[start..end] == want,
            "agent/METRICS.md's reference is not the one the families declare: run `cargo \
             +stable xtask manifests`"
        );
    }

    #[test]
    fn names_are_unique_with_their_units_and_few_labels() {
        let mut names = std::collections::HashSet::new();
        for f in all() {
            assert!(names.insert(f.name), "{} twice", f.name);
            assert!(f.labels.len() <= MAX_LABELS, "{}", f.name);
            if !f.unit.is_empty() {
                assert!(f.name.ends_with(&format!("_{}", f.unit)), "{}", f.name);
            }
            assert!(
                !f.help.is_empty() && f.help.ends_with('.') || f.help.ends_with(')'),
                "{}",
                f.name
            );
            if matches!(f.read, Read::Cgroup(_) | Read::CgroupHistogram(_)) {
                assert_eq!(f.labels, CGROUP, "{}", f.name);
            }
            if matches!(f.read, Read::CgroupBy(_)) {
                assert_eq!(&f.labels[..4], CGROUP, "{}", f.name);
                assert_eq!(f.labels.len(), 5, "{}", f.name);
            }
            if f.scope == Scope::Interface {
                assert_eq!(&f.labels[..7], IFACE, "{}", f.name);
            }
        }
    }
}
