//! `stormwatch trace`: per-container scheduler figures, as a live table or one JSON document.

use std::{
    collections::BTreeMap,
    io::{IsTerminal as _, Write as _},
    time::Duration,
};

use anyhow::Context as _;

use crate::{
    collect::Window,
    diagnose::{FindingReport, Thresholds},
    engine::{Clock, Engine, EngineOptions, Judged},
    host::HostReport,
    identity::{CgroupResolver, is_within},
    privileges,
    probes::LoadOptions,
    report::{ContainerReport, TraceReport, WindowEdges, containers, network},
};

use super::TraceArgs;

/// Default duration of a `--json` trace.
const DEFAULT_JSON_DURATION: f64 = 10.0;

pub async fn run(args: TraceArgs) -> anyhow::Result<()> {
    privileges::require()?;
    let resolver = CgroupResolver::discover()?;
    // Resolve filters before attaching anything, so a typo fails fast.
    let filters: Vec<String> = args
        .cgroup
        .iter()
        .map(|p| resolver.lookup_user_path(p).map(|(_, rel)| rel))
        .collect::<Result<_, _>>()?;
    let duration = match (args.duration, args.json) {
        (Some(d), _) => Some(Duration::from_secs_f64(d)),
        (None, true) => Some(Duration::from_secs_f64(DEFAULT_JSON_DURATION)),
        (None, false) => None,
    };
    let interval = Duration::from_secs_f64(args.interval);
    let options = EngineOptions {
        load: LoadOptions {
            force_tracepoints: args.force_tracepoints,
            call_sites: !args.no_call_sites,
            postgres_lock_waits: !args.no_postgres_lock_waits,
            waits_from_wakeups: args.waits_from_wakeups,
            runq_blame: (!args.no_runqueue_blame).then_some(crate::probes::RunqBlameTier::Always),
            families: args.probes.clone(),
            btf_file: args.btf.clone(),
            ..LoadOptions::default()
        },
        // The diagnosis session over the whole trace: the JSON document's limits and findings
        // are the same as `diagnose`'s for the same window. The live table shows one interval
        // at a time and no findings: a window of one interval.
        span: (!args.json).then_some(interval),
        interval,
        thresholds: Thresholds::default(),
        packet_survey: Duration::ZERO,
        jvm_thread_dumps: !args.no_jvm_thread_dumps,
        jvm_virtual_threads: args.jvm_virtual_threads,
    };
    let mut engine = Engine::start(resolver, options, |session| {
        if !args.json {
            // No namespace counters to keep for the table.
            session.network = None;
        }
    })?;
    let (attached, total) = engine.probes_attached();
    eprintln!(
        "stormwatch: tracing with {attached}/{total} probes attached{}",
        match duration {
            Some(d) => format!(" for {:.1}s", d.as_secs_f64()),
            None => ", Ctrl-C to stop".to_owned(),
        }
    );

    let keep = |_: u64, path: Option<&str>| {
        filters.is_empty() || path.is_some_and(|p| filters.iter().any(|f| is_within(p, f)))
    };
    let mut total = Window::empty();
    let mut clock = Clock::new(engine.pipeline.started_at(), interval, duration);
    let is_tty = std::io::stdout().is_terminal();
    loop {
        let interrupted = clock.wait().await;
        let window = engine.tick()?.window;
        total.extend(&window);
        if !args.json {
            let limits = engine.session.latest_limits(window.cgroups.keys());
            let rows = containers(
                &window,
                &crate::report::ReportContext::of(&engine.pipeline, &limits),
                keep,
            );
            print_table(
                &rows,
                &window,
                &engine.pipeline.probes.probe_errors(),
                is_tty,
            )?;
        }
        if clock.over(interrupted) {
            break;
        }
        // Names of removed cgroups and exited processes are kept only while the JSON total
        // still needs them.
        if args.json {
            engine.forget(
                |id| total.cgroups.contains_key(&id),
                |tgid| total.hot_futexes.keys().any(|k| k.tgid == tgid),
            );
        } else {
            engine.forget(|_| false, |_| false);
        }
    }
    let (pipeline, session) = (&engine.pipeline, &engine.session);

    if let Some(dir) = &args.pprof {
        let limits = session.window_limits(&total);
        let rows = containers(
            &total,
            &crate::report::ReportContext::of(pipeline, &limits),
            keep,
        );
        super::write_lock_profiles(dir, pipeline, &total, &rows)?;
    }
    if args.json {
        let report = json_report(&engine, &total, keep);
        let mut out = std::io::stdout().lock();
        serde_json::to_writer_pretty(&mut out, &report).context("writing the report")?;
        writeln!(out)?;
    }
    Ok(())
}

/// The JSON document of the whole trace: the window's figures per container, the network,
/// the findings over the same window, and how the probes are attached.
fn json_report(
    engine: &Engine,
    total: &Window,
    keep: impl Fn(u64, Option<&str>) -> bool,
) -> TraceReport {
    let (pipeline, session) = (&engine.pipeline, &engine.session);
    let Judged { net, judgement } = engine.judge();
    let findings = judgement.findings;
    let net_avail = pipeline.availability().net;
    let limits = session.window_limits(total);
    let ctx = crate::report::ReportContext::of(pipeline, &limits);
    TraceReport {
        duration_seconds: total.duration.as_secs_f64(),
        window: WindowEdges::new(session.window_edges()),
        host: HostReport::new(session.host(), session.steal()),
        interfaces: net
            .as_ref()
            .map(|n| network::interfaces(&n.namespaces, total, net_avail)),
        network_namespaces: net
            .as_ref()
            .map(|n| network::namespaces(&n.namespaces, &n.snmp)),
        containers: containers(total, &ctx, &keep),
        findings: findings
            .iter()
            .filter(|f| keep(f.cgroup_id, Some(f.cgroup.as_str())))
            .map(|f| FindingReport::new(f, ctx.identities.get(&f.cgroup_id)))
            .collect(),
        probes: pipeline.probes.status.clone(),
        lost_events: pipeline
            .probes
            .probe_errors()
            .into_iter()
            .collect::<BTreeMap<_, _>>(),
    }
}

/// `namespace/pod/container` when the kubelet names it, else the cgroup path.
pub fn workload_name(r: &ContainerReport) -> String {
    let path = r
        .cgroup
        .clone()
        .unwrap_or_else(|| format!("(removed cgroup {})", r.cgroup_id));
    match (&r.namespace, &r.pod, &r.container) {
        (Some(ns), Some(pod), Some(c)) => format!("{ns}/{pod}/{c}"),
        _ => path,
    }
}

fn fmt_latency(seconds: Option<f64>) -> String {
    match seconds {
        None => "-".to_owned(),
        Some(s) if s >= 1.0 => format!("{s:.2}s"),
        Some(s) if s >= 1e-3 => format!("{:.1}ms", s * 1e3),
        Some(s) => format!("{:.0}us", s * 1e6),
    }
}

/// A top-style table of one interval: rates per second, busiest first. `CPU%` is on-CPU time
/// per second of wall time (200% = two CPUs busy, as in top). `BLOCKED`, `FUTEX s/s` and
/// `KLOCK s/s` are seconds spent waiting per second: the average number of threads waiting.
fn print_table(
    rows: &[ContainerReport],
    window: &Window,
    lost: &[(&'static str, u64)],
    is_tty: bool,
) -> std::io::Result<()> {
    let secs = window.duration.as_secs_f64().max(1e-9);
    let mut out = std::io::stdout().lock();
    if is_tty {
        // Clear the screen and go home, like top.
        write!(out, "\x1b[2J\x1b[H")?;
    }
    writeln!(
        out,
        "stormwatch trace  interval {:.1}s  {} cgroups active",
        window.duration.as_secs_f64(),
        rows.len()
    )?;
    writeln!(
        out,
        "{:>6} {:>7} {:>8} {:>8} {:>7} {:>8} {:>8} {:>8} {:>7} {:>7}  WORKLOAD",
        "CPU%",
        "BLOCKED",
        "VCSW/s",
        "ICSW/s",
        "MIGR/s",
        "RUNQ p50",
        "RUNQ p99",
        "FUTEX/s",
        "FUTEX",
        "KLOCK"
    )?;
    writeln!(
        out,
        "{:>6} {:>7} {:>8} {:>8} {:>7} {:>8} {:>8} {:>8} {:>7} {:>7}",
        "", "threads", "", "", "", "", "", "waits", "s/s", "s/s"
    )?;
    let limit = if is_tty { 40 } else { usize::MAX };
    let rate = |v: Option<u64>| match v {
        Some(v) => format!("{:.0}", v as f64 / secs),
        None => "-".to_owned(),
    };
    let per_sec = |v: Option<f64>| match v {
        Some(v) => format!("{:.2}", v / secs),
        None => "-".to_owned(),
    };
    let pct = |v: Option<f64>| match v {
        Some(v) => format!("{:.1}", 100.0 * v / secs),
        None => "-".to_owned(),
    };
    for r in rows.iter().take(limit) {
        let runq = r.runqueue_latency;
        let klock = r
            .kernel_locks
            .as_ref()
            .map(|k| k.values().map(|w| w.wait_seconds).sum::<f64>());
        writeln!(
            out,
            "{:>6} {:>7} {:>8} {:>8} {:>7} {:>8} {:>8} {:>8} {:>7} {:>7}  {}",
            pct(r.oncpu_seconds),
            per_sec(r.offcpu_seconds),
            rate(r.context_switches.map(|c| c.voluntary)),
            rate(r.context_switches.map(|c| c.involuntary)),
            rate(r.migrations),
            fmt_latency(runq.and_then(|q| q.p50_seconds)),
            fmt_latency(runq.and_then(|q| q.p99_seconds)),
            rate(r.futex.map(|f| f.waits)),
            per_sec(r.futex.map(|f| f.wait_seconds)),
            per_sec(klock),
            workload_name(r),
        )?;
        if let Some(hot) = r.hot_futexes.as_ref().and_then(|h| h.first()) {
            writeln!(
                out,
                "{:>16} hottest futex {} in {} ({}): {} waits, {:.3}s",
                "", hot.uaddr, hot.tgid, hot.comm, hot.waits, hot.wait_seconds
            )?;
        }
        if let Some(site) = r.kernel_lock_sites.as_ref().and_then(|s| s.first()) {
            // The sites hold the walked long waits only: say how many went past the budget.
            let unwalked = r
                .kernel_lock_waits_unwalked
                .as_ref()
                .filter(|u| u.count > 0)
                .map(|u| format!(" (and {} long waits past the stack-walk budget)", u.count))
                .unwrap_or_default();
            writeln!(
                out,
                "{:>16} hottest kernel lock site {} via {} ({}): {} waits, {:.3}s{unwalked}",
                "",
                site.site.function,
                site.site.lock_function.as_deref().unwrap_or("?"),
                site.kind,
                site.count,
                site.wait_seconds
            )?;
        }
    }
    let lost: Vec<String> = lost
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(what, n)| format!("{what}={n}"))
        .collect();
    if !lost.is_empty() {
        writeln!(out, "not recorded since start: {}", lost.join(" "))?;
    }
    if !is_tty {
        writeln!(out)?;
    }
    out.flush()
}
