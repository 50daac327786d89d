//! `stormwatch diagnose`: watch the host for a while, then print what is wrong and what to do,
//! ranked by severity — or say that nothing was found, and what was checked.

use std::{io::Write as _, time::Duration};

use serde::Serialize;

use crate::{
    diagnose::{
        FindingReport, RULES, Thresholds, host_cpus,
        rules::{
            GoStormFigures, PgStormFigures, StormFigures, VirtualRemountFigures,
            VirtualStormFigures,
        },
    },
    engine::{Clock, Engine, EngineOptions},
    host::HostReport,
    identity::CgroupResolver,
    privileges,
    probes::LoadOptions,
    report::WindowEdges,
};

use super::DiagnoseArgs;

/// Exit status when findings were reported (0: none; 1: error; 2: bad usage).
pub const EXIT_FINDINGS: u8 = 3;
/// Exit status when interrupted (Ctrl-C) before the duration was up: what was seen so far is
/// printed, but a script must not take it for a clean pass (128 + SIGINT, as a shell says).
pub const EXIT_INTERRUPTED: u8 = 130;

#[derive(Debug, Serialize)]
pub struct DiagnoseReport {
    /// The host over the window: CPUs, hypervisor, NUMA nodes, steal, kernel.
    pub host: HostReport,
    pub findings: Vec<FindingReport>,
    pub checked: Checked,
}

#[derive(Debug, Serialize)]
pub struct Checked {
    pub duration_seconds: f64,
    /// Interrupted before `--duration` was up: the window is shorter than asked, and the exit
    /// status is 130 whatever was found.
    pub interrupted: bool,
    /// The window's edges (see `trace --json`'s `window`).
    pub window: WindowEdges,
    pub containers: usize,
    pub host_cpus: u32,
    pub rules: Vec<&'static str>,
    /// Probes attached, of those tried.
    pub probes_attached: usize,
    pub probes_total: usize,
    /// The lock-storm rule's figures for the containers with the most futex hand-offs (at most
    /// `STORM_FIGURES_SHOWN`), storm or not: why a container was, or was not, flagged.
    pub lock_storm: Vec<StormCheck>,
    /// The Go lock-storm figures (the Go runtime's own mutex-wait clock) of the containers
    /// with Go processes whose clock was read, most goroutines waiting first (at most
    /// `STORM_FIGURES_SHOWN`).
    pub go_lock_storm: Vec<GoStormCheck>,
    /// The virtual-thread lock-storm figures (the JVM's own: its scheduler's remounts and its
    /// JSON thread dumps) of the containers with JVMs whose virtual threads were read, most
    /// hand-offs first (at most `STORM_FIGURES_SHOWN`).
    pub virtual_lock_storm: Vec<VirtualStormCheck>,
    /// The remounts of the containers whose JVMs' virtual threads were counted but not dumped
    /// (the JSON dump is off unless asked), most first (at most `STORM_FIGURES_SHOWN`): at or
    /// over the hand-off line, a `possible` virtual-thread storm.
    pub virtual_remounts: Vec<VirtualRemountCheck>,
    /// The PostgreSQL lock-storm figures (its own lock-wait sites) of the containers whose
    /// backends waited for a heavyweight lock, most waiting first (at most
    /// `STORM_FIGURES_SHOWN`).
    pub postgres_lock_storm: Vec<PgStormCheck>,
}

/// How many containers' lock-storm figures `checked.lock_storm` lists.
const STORM_FIGURES_SHOWN: usize = 10;

/// A rule's figures for one container, flagged or not.
#[derive(Debug, Serialize)]
pub struct RuleCheck<F> {
    pub cgroup: String,
    #[serde(flatten)]
    pub figures: F,
}

pub type StormCheck = RuleCheck<StormFigures>;
pub type GoStormCheck = RuleCheck<GoStormFigures>;
pub type VirtualStormCheck = RuleCheck<VirtualStormFigures>;
pub type VirtualRemountCheck = RuleCheck<VirtualRemountFigures>;
pub type PgStormCheck = RuleCheck<PgStormFigures>;

/// The figures `of` gives for the containers, largest `key` first, at most
/// `STORM_FIGURES_SHOWN` of them.
fn top_checks<F>(
    facts: &[crate::diagnose::Facts],
    of: impl Fn(&crate::diagnose::Facts) -> Option<F>,
    key: impl Fn(&F) -> f64,
) -> Vec<RuleCheck<F>> {
    let mut checks: Vec<RuleCheck<F>> = facts
        .iter()
        .filter_map(|f| {
            of(f).map(|figures| RuleCheck {
                cgroup: f.cgroup.clone(),
                figures,
            })
        })
        .collect();
    checks.sort_by(|a, b| key(&b.figures).total_cmp(&key(&a.figures)));
    checks.truncate(STORM_FIGURES_SHOWN);
    checks
}

pub async fn run(args: DiagnoseArgs) -> anyhow::Result<u8> {
    privileges::require()?;
    let resolver = CgroupResolver::discover()?;
    let interval = Duration::from_secs(1);
    // The whole duration is the window the rules judge.
    let options = EngineOptions {
        load: LoadOptions {
            btf_file: args.btf.clone(),
            call_sites: !args.no_call_sites,
            postgres_lock_waits: !args.no_postgres_lock_waits,
            ..LoadOptions::default()
        },
        span: None,
        interval,
        thresholds: Thresholds::default(),
        packet_survey: Duration::ZERO,
        jvm_thread_dumps: !args.no_jvm_thread_dumps,
        jvm_virtual_threads: args.jvm_virtual_threads,
    };
    let mut engine = Engine::start(resolver, options, |_| {})?;
    let duration = Duration::from_secs_f64(args.duration);
    let (attached, total) = engine.probes_attached();
    eprintln!(
        "stormwatch: watching this host for {:.0}s ({attached}/{total} probes attached)",
        duration.as_secs_f64(),
    );
    let mut clock = Clock::new(engine.pipeline.started_at(), interval, Some(duration));
    let interrupted = loop {
        let interrupted = clock.wait().await;
        engine.tick()?;
        // The whole run is the window, and the report names what it held: nothing is
        // forgotten.
        if clock.over(interrupted) {
            break interrupted;
        }
    };
    let findings = engine.judge().judgement.findings;
    let (pipeline, session) = (&engine.pipeline, &engine.session);
    let window = session.window();
    let limits = session.window_limits(&window);
    let ctx = crate::report::ReportContext::of(pipeline, &limits);
    if let Some(dir) = &args.pprof {
        let rows = crate::report::containers(&window, &ctx, |_, _| true);
        super::write_lock_profiles(dir, pipeline, &window, &rows)?;
    }
    let facts = session.facts(&window, pipeline.paths());
    let thresholds = &session.options().thresholds;
    let storm_checks = top_checks(
        &facts,
        |f| StormFigures::of(f, thresholds),
        |s| s.handoffs_per_cpu_second,
    );
    let go_checks = top_checks(
        &facts,
        |f| GoStormFigures::of(f, thresholds),
        |g| g.waiting_goroutines,
    );
    let virtual_checks = top_checks(
        &facts,
        |f| VirtualStormFigures::of(f, thresholds),
        |v| v.lock_handoffs_per_second,
    );
    let remount_checks = top_checks(
        &facts,
        |f| VirtualRemountFigures::of(f, thresholds),
        |v| v.remounts_per_second,
    );
    let postgres_checks = top_checks(
        &facts,
        |f| PgStormFigures::of(f, thresholds),
        |p| p.waiting_backends,
    );
    let report = DiagnoseReport {
        host: HostReport::new(session.host(), session.steal()),
        findings: findings
            .iter()
            .map(|f| FindingReport::new(f, ctx.identities.get(&f.cgroup_id)))
            .collect(),
        checked: Checked {
            duration_seconds: window.duration.as_secs_f64(),
            interrupted,
            window: WindowEdges::new(session.window_edges()),
            containers: facts.len(),
            host_cpus: host_cpus(),
            rules: RULES.iter().map(|r| r.kind.as_str()).collect(),
            probes_attached: attached,
            probes_total: total,
            lock_storm: storm_checks,
            go_lock_storm: go_checks,
            virtual_lock_storm: virtual_checks,
            virtual_remounts: remount_checks,
            postgres_lock_storm: postgres_checks,
        },
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        print_human(&mut out, &report)?;
    }
    Ok(if interrupted {
        eprintln!(
            "stormwatch: interrupted after {:.0}s of {:.0}s: the report covers only that (exit \
             status {EXIT_INTERRUPTED})",
            report.checked.duration_seconds,
            duration.as_secs_f64()
        );
        EXIT_INTERRUPTED
    } else if report.findings.is_empty() {
        0
    } else {
        EXIT_FINDINGS
    })
}

fn print_human(out: &mut impl std::io::Write, r: &DiagnoseReport) -> std::io::Result<()> {
    let c = &r.checked;
    if c.interrupted {
        write!(out, "INTERRUPTED: ")?;
    }
    if r.findings.is_empty() {
        writeln!(
            out,
            "No problems found in {:.0}s on {} containers/cgroups ({} CPUs){}",
            c.duration_seconds,
            c.containers,
            c.host_cpus,
            if c.interrupted {
                ", before the duration was up."
            } else {
                "."
            }
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
    print_host(out, &r.host)?;
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
        for (k, v) in &f.context {
            writeln!(out, "     {k:<40} {v}")?;
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

/// One line: what the host is, as the findings' explanations refer to it.
fn print_host(out: &mut impl std::io::Write, h: &HostReport) -> std::io::Result<()> {
    let virt = match &h.hypervisor {
        Some(v) => format!("{v} guest"),
        None => "no hypervisor detected".to_owned(),
    };
    let nodes = h
        .numa_nodes
        .map(|n| format!(", {n} NUMA node(s)"))
        .unwrap_or_default();
    let steal = h
        .steal_seconds
        .map(|s| format!(", {s:.2} s of CPU time stolen"))
        .unwrap_or_default();
    writeln!(
        out,
        "host: {virt}, {} CPUs{nodes}{steal}, kernel {}",
        h.cpus, h.kernel
    )
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
