//! `stormwatch diagnose`: watch the host for a while, then print what is wrong and what to do,
//! ranked by severity — or say that nothing was found, and what was checked.

use std::{
    collections::{BTreeMap, HashMap},
    io::Write as _,
    time::Duration,
};

use serde::Serialize;

use crate::{
    collect::Window,
    diagnose::{
        Facts, Finding, Thresholds, diagnose,
        network::{diagnose_network, net_facts},
    },
    identity::{CgroupResolver, limits::Limits, workload::Identity},
    netinfo::NetWatch,
    pipeline::Pipeline,
    privileges,
    probes::{Family, LoadOptions},
};

use super::DiagnoseArgs;

/// Exit status when findings were reported (0: none; 1: error; 2: bad usage).
pub const EXIT_FINDINGS: u8 = 3;

#[derive(Debug, Serialize)]
pub struct DiagnoseReport {
    pub findings: Vec<FindingReport>,
    pub checked: Checked,
}

#[derive(Debug, Serialize)]
pub struct FindingReport {
    pub kind: &'static str,
    pub severity: crate::diagnose::Severity,
    pub cgroup: String,
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub container: Option<String>,
    pub summary: String,
    pub evidence: BTreeMap<&'static str, f64>,
    pub recommendations: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct Checked {
    pub duration_seconds: f64,
    pub containers: usize,
    pub host_cpus: u32,
    pub rules: Vec<&'static str>,
    /// Probes attached, of those tried.
    pub probes_attached: usize,
    pub probes_total: usize,
}

pub const RULES: [&str; 5] = [
    "lock_storm",
    "cpu_throttling",
    "runqueue_saturation",
    "thread_oversubscription",
    "mtu_mismatch",
];

/// Online CPUs of the host.
pub fn host_cpus() -> u32 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    u32::try_from(n).unwrap_or(1).max(1)
}

/// Builds each active container's facts from a window and its limits over the window.
pub fn facts(
    window: &Window,
    paths: &HashMap<u64, String>,
    limits: &HashMap<u64, Limits>,
    host_cpus: u32,
) -> Vec<Facts> {
    window
        .cgroups
        .iter()
        .filter_map(|(id, w)| {
            let path = paths.get(id)?;
            let l = limits.get(id);
            Some(Facts {
                cgroup_id: *id,
                cgroup: path.clone(),
                window_seconds: window.duration.as_secs_f64(),
                host_cpus,
                cpuset_cpus: l
                    .and_then(|l| l.cpuset_cpus.as_ref())
                    .map(|c| c.len() as u32),
                quota_cores: l.and_then(|l| l.cpu_quota_cores),
                threads: l.and_then(|l| l.threads),
                throttled_periods: l.and_then(|l| l.throttled_periods),
                throttled_seconds: l.and_then(|l| l.throttled_seconds),
                sched: w.sched,
                futex: w.futex,
                locks: w.locks,
            })
        })
        .collect()
}

pub async fn run(args: DiagnoseArgs) -> anyhow::Result<u8> {
    privileges::require()?;
    let resolver = CgroupResolver::discover()?;
    let options = LoadOptions::default();
    let mut pipeline = Pipeline::start(&options, resolver)?;
    // The network namespaces' kernel counters at the start, for `mtu_mismatch`.
    let net_watch = options
        .families
        .contains(&Family::Net)
        .then(NetWatch::start);
    let duration = Duration::from_secs_f64(args.duration);
    eprintln!(
        "stormwatch: watching this host for {:.0}s ({}/{} probes attached)",
        duration.as_secs_f64(),
        pipeline
            .probes
            .status
            .iter()
            .filter(|s| s.attached())
            .count(),
        pipeline.probes.status.len()
    );
    let started = pipeline.started_at();
    let mut total = Window::empty();
    let deadline = tokio::time::Instant::from_std(started + duration);
    let interval = Duration::from_secs(1);
    let mut next = tokio::time::Instant::from_std(started) + interval;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let interrupted = tokio::select! {
            _ = tokio::time::sleep_until(next.min(deadline)) => false,
            _ = &mut ctrl_c => true,
        };
        total.extend(&pipeline.tick()?);
        if interrupted || tokio::time::Instant::now() >= deadline {
            break;
        }
        next += interval;
    }
    let cpus = host_cpus();
    let limits = pipeline.limits_of(&total);
    let all = facts(&total, pipeline.paths(), &limits, cpus);
    let thresholds = Thresholds::default();
    let mut findings = diagnose(&all, &thresholds);
    if let Some(state) = net_watch.as_ref().map(NetWatch::finish) {
        let root = pipeline.resolver.root().to_path_buf();
        let cgroup_id = |path: &str| {
            std::fs::metadata(root.join(path.trim_start_matches('/')))
                .ok()
                .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        };
        let net = net_facts(&state, &total, pipeline.availability().net, cgroup_id);
        findings.extend(diagnose_network(&net, &thresholds));
        findings.sort_by(|a, b| {
            b.severity
                .cmp(&a.severity)
                .then(a.kind.cmp(&b.kind))
                .then(a.cgroup.cmp(&b.cgroup))
        });
    }
    let ctx = pipeline.report_context(&limits);
    let report = DiagnoseReport {
        findings: findings
            .iter()
            .map(|f| finding_report(f, ctx.identities.get(&f.cgroup_id)))
            .collect(),
        checked: Checked {
            duration_seconds: total.duration.as_secs_f64(),
            containers: all.len(),
            host_cpus: cpus,
            rules: RULES.to_vec(),
            probes_attached: pipeline
                .probes
                .status
                .iter()
                .filter(|s| s.attached())
                .count(),
            probes_total: pipeline.probes.status.len(),
        },
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        print_human(&mut out, &report)?;
    }
    Ok(if report.findings.is_empty() {
        0
    } else {
        EXIT_FINDINGS
    })
}

fn finding_report(f: &Finding, identity: Option<&Identity>) -> FindingReport {
    let identity = identity.cloned().unwrap_or_default();
    FindingReport {
        kind: f.kind.as_str(),
        severity: f.severity,
        cgroup: f.cgroup.clone(),
        namespace: identity.namespace,
        pod: identity.pod,
        container: identity.container,
        summary: f.summary.clone(),
        evidence: f.evidence.clone(),
        recommendations: f.recommendations.clone(),
    }
}

fn print_human(out: &mut impl std::io::Write, r: &DiagnoseReport) -> std::io::Result<()> {
    let c = &r.checked;
    if r.findings.is_empty() {
        writeln!(
            out,
            "No problems found in {:.0}s on {} containers/cgroups ({} CPUs).",
            c.duration_seconds, c.containers, c.host_cpus
        )?;
    } else {
        writeln!(
            out,
            "{} finding(s) in {:.0}s on {} containers/cgroups ({} CPUs):",
            r.findings.len(),
            c.duration_seconds,
            c.containers,
            c.host_cpus
        )?;
    }
    for (i, f) in r.findings.iter().enumerate() {
        let who = match (&f.namespace, &f.pod, &f.container) {
            (Some(ns), Some(pod), Some(ct)) => format!("{ns}/{pod}/{ct} ({})", f.cgroup),
            _ => f.cgroup.clone(),
        };
        let severity = serde_json::to_value(f.severity)
            .ok()
            .and_then(|v| v.as_str().map(str::to_uppercase))
            .unwrap_or_default();
        writeln!(out, "\n{}. [{severity}] {} — {who}", i + 1, f.kind)?;
        writeln!(out, "   {}", f.summary)?;
        writeln!(out, "   evidence:")?;
        for (k, v) in &f.evidence {
            writeln!(out, "     {k:<40} {}", fmt_value(*v))?;
        }
        writeln!(out, "   what to do:")?;
        for rec in &f.recommendations {
            writeln!(out, "     - {rec}")?;
        }
    }
    writeln!(
        out,
        "\nchecked: rules {}; probes {}/{} attached",
        c.rules.join(", "),
        c.probes_attached,
        c.probes_total
    )?;
    Ok(())
}

fn fmt_value(v: f64) -> String {
    if v == v.trunc() && v.abs() < 1e12 {
        format!("{v:.0}")
    } else if v.abs() >= 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.6}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_owned()
    }
}
