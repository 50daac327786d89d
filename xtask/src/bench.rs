//! Overhead benchmarks: a workload's throughput with each tracer attached, against none,
//! interleaved over rounds so that drift on the machine hits every configuration alike.
//!
//! - scheduler: `stress-ng --switch 2` (a pure context-switch load, the probes' worst case),
//!   against empty tp_btf programs on the same tracepoints (the floor), stormwatch's scheduler
//!   probes, all of stormwatch's probes, and a bpftrace script doing comparable work;
//! - futex: `stress-ng --futex 2`, against stormwatch's futex and lock probes and a bpftrace
//!   script timing futex waits per cgroup;
//! - a realistic workload: a lock storm (`mutex_storm` from tests/src/bin: threads contending on
//!   one futex-based mutex, as a pthread or JVM monitor storm does) counting its own operations,
//!   against the daemon as deployed (`stormwatch run`, default configuration).
//!
//! - what each BPF program costs per run under the first two (`bench_programs`).
//!
//! Results are printed as a Markdown table; xtask/BENCHMARKS.md carries the last run.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    bench_common::{
        BPFTRACE_FUTEX, BPFTRACE_SCHED, Starter, bpftrace, free_port, go_corpus_program, median,
        run_command, start_until, stormwatch, stormwatch_run,
    },
    build_release, cargo, root, run_cmd, say,
};

/// A tracer configuration: how to start it, or `None` for no tracing.
pub(crate) struct Tracer {
    pub(crate) name: &'static str,
    pub(crate) start: Option<Starter>,
}

/// Runs `stress-ng --<stressor> <instances>` for `seconds` and returns bogo ops per second (real
/// time).
fn stress(stressor: &str, instances: u32, seconds: u32) -> Result<f64> {
    let yaml = tempfile::Builder::new()
        .prefix("stormwatch-bench-")
        .suffix(".yaml")
        .tempfile()
        .context("cannot create a temporary file for stress-ng's report")?;
    let status = Command::new("stress-ng")
        .args([
            &format!("--{stressor}"),
            &instances.to_string(),
            "-t",
            &seconds.to_string(),
            "--metrics-brief",
            "--yaml",
        ])
        .arg(yaml.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("cannot start stress-ng")?;
    if !status.success() {
        bail!("stress-ng --{stressor} failed: {status}");
    }
    let text = std::fs::read_to_string(yaml.path())?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("bogo-ops-per-second-real-time:"))
        .and_then(|v| v.trim().parse().ok())
        .context("no bogo-ops-per-second-real-time in stress-ng's output")
}

struct Row {
    name: &'static str,
    ops: Vec<f64>,
    rss_kib: Vec<u64>,
}

/// A measured workload: what the table calls it and its unit, and how to run it for a number
/// of seconds, returning its throughput in that unit.
pub(crate) struct Workload {
    pub(crate) shown: String,
    pub(crate) unit: &'static str,
    pub(crate) run: Box<dyn Fn(u32) -> Result<f64>>,
}

fn stress_ng(stressor: &'static str, instances: u32) -> Workload {
    Workload {
        shown: format!("`stress-ng --{stressor} {instances}`"),
        unit: "bogo ops/s",
        run: Box::new(move |seconds| stress(stressor, instances, seconds)),
    }
}

pub(crate) fn bench(
    bin: &Path,
    title: &str,
    workload: &Workload,
    tracers: Vec<Tracer>,
    rounds: u32,
    seconds: u32,
) -> Result<String> {
    let mut rows: Vec<Row> = tracers
        .iter()
        .map(|t| Row {
            name: t.name,
            ops: Vec::new(),
            rss_kib: Vec::new(),
        })
        .collect();
    for round in 1..=rounds {
        for (tracer, row) in tracers.iter().zip(rows.iter_mut()) {
            say(&format!("{title}: round {round}/{rounds}, {}", tracer.name));
            let running = match &tracer.start {
                Some(start) => Some(start(bin, seconds)?),
                None => None,
            };
            let ops = (workload.run)(seconds)?;
            if let Some(r) = running
                && let Some(rss) = r.stop()?
            {
                row.rss_kib.push(rss);
            }
            row.ops.push(ops);
        }
    }
    let base = median(&rows[0].ops);
    let mut out = format!(
        "\n{title}: {}, {rounds} interleaved rounds of {seconds} s\n\n\
         | tracer | {} (median) | ratio to none | loss | ratio per round (min–max) | \
         tracer peak RSS |\n\
         |---|---:|---:|---:|---:|---:|\n",
        workload.shown, workload.unit
    );
    for row in &rows {
        let m = median(&row.ops);
        // Each round's ratio to that round's run without a tracer: the spread the noise makes.
        let ratios: Vec<f64> = row
            .ops
            .iter()
            .zip(&rows[0].ops)
            .map(|(o, b)| o / b)
            .collect();
        let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let rss = row
            .rss_kib
            .iter()
            .max()
            .map(|k| format!("{:.1} MiB", *k as f64 / 1024.0))
            .unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "| {} | {:.0} | {:.3} | {:.1}% | {lo:.3}–{hi:.3} | {} |\n",
            row.name,
            m,
            m / base,
            100.0 * (1.0 - m / base),
            rss
        ));
    }
    Ok(out)
}

pub fn run(rounds: u32, seconds: u32, repeats: u32, daemon_cgroups: &[usize]) -> Result<()> {
    let bin: PathBuf = build_release()?;
    let sched = sched(&bin, rounds, seconds)?;
    let futex = futex(&bin, rounds, seconds)?;
    let storm = lock_storm(&bin, rounds, seconds)?;
    let kernel_locks = kernel_lock_storm(&bin, rounds, seconds)?;
    let go_storm = go_mutex_storm(&bin, rounds, seconds)?;
    let programs = crate::bench_programs::run(&bin, seconds, repeats, &[])?;
    let ordinary = crate::bench_ordinary::run(rounds, seconds)?;
    println!("{sched}{futex}{storm}{kernel_locks}{go_storm}{programs}{ordinary}");
    println!("{}", crate::bench_daemon::run(daemon_cgroups)?);
    Ok(())
}

/// The switch storm with the floor, the scheduler probes, all probes, the daemon and bpftrace.
pub fn sched(bin: &Path, rounds: u32, seconds: u32) -> Result<String> {
    bench(
        bin,
        "Scheduler probes",
        &stress_ng("switch", 2),
        vec![
            Tracer {
                name: "none",
                start: None,
            },
            Tracer {
                name: "empty tp_btf programs on the same four tracepoints (floor)",
                start: Some(stormwatch("empty-sched")),
            },
            Tracer {
                name: "stormwatch --probes sched",
                start: Some(stormwatch("sched")),
            },
            Tracer {
                name: "stormwatch trace, all probes",
                start: Some(stormwatch("sched,futex,locks,net")),
            },
            Tracer {
                name: "stormwatch run (default configuration, as deployed)",
                start: Some(stormwatch_run()),
            },
            Tracer {
                name: "stormwatch run, futex tier attached throughout (`futex_probes = \"always\"`)",
                start: Some(stormwatch_run_with(FUTEX_TIER_ALWAYS)),
            },
            Tracer {
                name: "bpftrace: switches + run-queue histogram per cgroup",
                start: Some(bpftrace(BPFTRACE_SCHED)),
            },
        ],
        rounds,
        seconds,
    )
}

/// The futex stressor with the futex and lock probes, the daemon, and bpftrace timing futex
/// waits.
pub fn futex(bin: &Path, rounds: u32, seconds: u32) -> Result<String> {
    bench(
        bin,
        "Futex and lock probes",
        &stress_ng("futex", 2),
        vec![
            Tracer {
                name: "none",
                start: None,
            },
            Tracer {
                name: "empty tracepoint programs on sys_enter/exit_futex (floor)",
                start: Some(stormwatch("empty-futex")),
            },
            Tracer {
                name: "stormwatch --probes futex,locks",
                start: Some(stormwatch("futex,locks")),
            },
            Tracer {
                name: "stormwatch run (default configuration, as deployed)",
                start: Some(stormwatch_run()),
            },
            Tracer {
                name: "stormwatch run, futex tier throughout, hand-offs sampled with their \
                       stacks (`call_sites = true`, the default)",
                start: Some(stormwatch_run_with(FUTEX_TIER_ALWAYS)),
            },
            Tracer {
                name: "stormwatch run, futex tier throughout, no sampling (`call_sites = false`)",
                start: Some(stormwatch_run_with(FUTEX_TIER_NO_CALL_SITES)),
            },
            Tracer {
                name: "bpftrace: futex wait time per cgroup",
                start: Some(bpftrace(BPFTRACE_FUTEX)),
            },
        ],
        rounds,
        seconds,
    )
}

/// The kernel-lock storm (issue #43 item 4): four processes taking and dropping `flock` on one
/// file on 2 CPUs, ~40,000 contentions a second on the file's lock-context spinlock and ~8,000
/// on the file locks' percpu rwsem (`bench_programs`'s `Workload::Locks`, whose per-program
/// table runs the same storm). Its throughput with no tracer, the empty programs on the two
/// contention tracepoints (the floor), the lock probes alone, and the daemon as deployed.
pub fn kernel_lock_storm(bin: &Path, rounds: u32, seconds: u32) -> Result<String> {
    bench(
        bin,
        "Kernel-lock storm",
        &stress_ng("flock", 4),
        vec![
            Tracer {
                name: "none",
                start: None,
            },
            Tracer {
                name: "empty tp_btf programs on contention_begin/end (floor)",
                start: Some(stormwatch("empty-locks")),
            },
            Tracer {
                name: "stormwatch --probes locks",
                start: Some(stormwatch("locks")),
            },
            Tracer {
                name: "stormwatch run (default configuration, as deployed)",
                start: Some(stormwatch_run()),
            },
        ],
        rounds,
        seconds,
    )
}

/// Threads of the lock storm: twice the CPUs of the 2-vCPU machines this is run on, so that a
/// holder is preempted and waiters sleep in the kernel (what makes a storm a storm).
const STORM_THREADS: u32 = 4;

/// The realistic workload's row: a lock storm's own throughput without the agent and with the
/// daemon as deployed.
pub fn lock_storm(bin: &Path, rounds: u32, seconds: u32) -> Result<String> {
    say("building mutex_storm (release)");
    run_cmd(cargo().args([
        "build",
        "--release",
        "--package",
        "stormwatch-tests",
        "--bin",
        "mutex_storm",
    ]))?;
    let storm = root().join("target/release/mutex_storm");
    let workload = Workload {
        shown: format!(
            "lock storm (`mutex_storm --threads {STORM_THREADS}`: one futex-based mutex, \
             a few hundred ns of work inside and outside it)"
        ),
        unit: "lock acquisitions/s",
        run: Box::new(move |seconds| mutex_storm(&storm, seconds)),
    };
    bench(
        bin,
        "Realistic workload",
        &workload,
        call_site_tracers(
            "stormwatch run, futex tier throughout, hand-offs sampled with their stacks (the \
             default `call_sites = true`)",
            "stormwatch run, futex tier throughout, no sampling (`call_sites = false`)",
        ),
        rounds,
        seconds,
    )
}

/// None, the daemon as deployed, and the daemon with the futex tier throughout with call sites
/// (`with`) and without them (`without`): what the call sites cost is the last two's difference.
fn call_site_tracers(with: &'static str, without: &'static str) -> Vec<Tracer> {
    vec![
        Tracer {
            name: "none",
            start: None,
        },
        Tracer {
            name: "stormwatch run (default configuration)",
            start: Some(stormwatch_run()),
        },
        Tracer {
            name: with,
            start: Some(stormwatch_run_with(FUTEX_TIER_ALWAYS)),
        },
        Tracer {
            name: without,
            start: Some(stormwatch_run_with(FUTEX_TIER_NO_CALL_SITES)),
        },
    ]
}

/// GOMAXPROCS of the Go mutex storm: above the 2 CPUs, as a service sized from a node.
const GO_STORM_GOMAXPROCS: &str = "8";

/// A Go `sync.Mutex` storm (tests/corpus/gomutex, 64 goroutines) with the daemon, and with the
/// futex tier throughout with and without call sites: with them, Go's mutex uprobes attach in
/// bursts (100 ms every 10 s; `agent/src/probes/gomutex.rs`), and the difference between the
/// two rows is what they cost.
pub fn go_mutex_storm(bin: &Path, rounds: u32, seconds: u32) -> Result<String> {
    say("building gomutex");
    let gomutex = go_corpus_program("gomutex")?;
    let workload = Workload {
        shown: format!(
            "Go mutex storm (`gomutex -goroutines 64`, GOMAXPROCS={GO_STORM_GOMAXPROCS}: one \
             sync.Mutex, 200 iterations of work inside and outside it)"
        ),
        unit: "lock acquisitions/s",
        run: Box::new(move |seconds| go_storm(&gomutex, seconds)),
    };
    bench(
        bin,
        "Go mutex storm",
        &workload,
        call_site_tracers(
            "stormwatch run, futex tier throughout, call sites (Go's mutex uprobes in bursts)",
            "stormwatch run, futex tier throughout, no call sites (no uprobes)",
        ),
        rounds,
        seconds,
    )
}

/// Runs the Go mutex storm for `seconds`; its acquisitions per second.
fn go_storm(gomutex: &Path, seconds: u32) -> Result<f64> {
    let mut cmd = Command::new(gomutex);
    cmd.args(["-goroutines", "64", "-seconds", &seconds.to_string()])
        .env("GOMAXPROCS", GO_STORM_GOMAXPROCS);
    ops_per_second(cmd, seconds)
}

/// Runs the lock storm for `seconds`; its acquisitions per second (its own count, over the
/// time it ran).
fn mutex_storm(storm: &Path, seconds: u32) -> Result<f64> {
    let mut cmd = Command::new(storm);
    cmd.args(["--threads", &STORM_THREADS.to_string()])
        .args(["--seconds", &seconds.to_string()]);
    ops_per_second(cmd, seconds)
}

/// Runs `cmd`, a storm program that runs for `seconds` and prints its `"ops"` in one JSON line;
/// its operations per second.
fn ops_per_second(mut cmd: Command, seconds: u32) -> Result<f64> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot start {program}"))?;
    if !out.status.success() {
        bail!("{program} failed: {}", out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let ops = json_number(&stdout, "ops")
        .with_context(|| format!("no \"ops\" in {program}'s output: {stdout}"))?;
    Ok(ops / f64::from(seconds))
}

/// A number field of a one-line JSON object (mutex_storm's report).
fn json_number(line: &str, field: &str) -> Option<f64> {
    let rest = line.split_once(&format!("\"{field}\":"))?.1;
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// The default configuration but for the futex tier, attached from the start: the switch
/// storm's worst case (the tier is what a storm attaches, and the daemon otherwise attaches it
/// only after its first judgement, part of the way into a round).
const FUTEX_TIER_ALWAYS: &str = "futex_probes = \"always\"\n";

/// The same without the hand-off sampling: what the call sites cost is the difference.
const FUTEX_TIER_NO_CALL_SITES: &str = "futex_probes = \"always\"\ncall_sites = false\n";

/// `stormwatch run` with a configuration file holding `config` (TOML).
pub(crate) fn stormwatch_run_with(config: &'static str) -> Starter {
    Box::new(move |bin: &Path, _seconds: u32| {
        let path =
            std::env::temp_dir().join(format!("stormwatch-bench-{}.toml", std::process::id()));
        std::fs::write(&path, config)
            .with_context(|| format!("cannot write {}", path.display()))?;
        let mut cmd = run_command(bin, free_port()?);
        cmd.arg("--config").arg(&path);
        start_until(cmd, "serving http://", false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_storm_count() {
        let line = r#"{"pid":12,"mutex_addr":"0x5f","ops":123456,"nvcsw":7}"#;
        assert_eq!(json_number(line, "ops"), Some(123456.0));
        assert_eq!(json_number(line, "nvcsw"), Some(7.0));
        assert_eq!(json_number(line, "missing"), None);
    }
}
