//! Overhead benchmarks: a workload's throughput with each tracer attached, against none,
//! interleaved over rounds so that drift on the machine hits every configuration alike.
//!
//! - scheduler: `stress-ng --switch 2` (a pure context-switch load, the probes' worst case),
//!   against empty tp_btf programs on the same tracepoints (the floor), stormwatch's scheduler
//!   probes, all of stormwatch's probes, and a bpftrace script doing comparable work;
//! - futex: `stress-ng --futex 2`, against stormwatch's futex and lock probes and a bpftrace
//!   script timing futex waits per cgroup.
//!
//! Results are printed as a Markdown table; the README carries the last run.

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{build_release, say};

/// Starts a tracer, given the stormwatch binary and the measurement's length in seconds.
type Starter = Box<dyn Fn(&Path, u32) -> Result<Running>>;

/// A tracer configuration: how to start it, or `None` for no tracing.
struct Tracer {
    name: &'static str,
    start: Option<Starter>,
}

struct Running {
    child: Child,
}

impl Running {
    fn stop(mut self) -> Result<Option<u64>> {
        let rss = peak_rss_kib(self.child.id());
        // SIGINT: stormwatch detaches and exits; bpftrace prints its maps and exits.
        interrupt(self.child.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.child.try_wait()?.is_some() {
                break;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(rss)
    }
}

fn interrupt(pid: u32) {
    let _ = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status();
}

/// VmHWM (peak resident set) of a process, in KiB.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    use procfs_core::FromRead as _;
    procfs_core::process::Status::from_file(format!("/proc/{pid}/status"))
        .ok()?
        .vmhwm
}

/// Starts a command and waits until a line on its stderr (or stdout) contains `ready`.
fn start_until(mut cmd: Command, ready: &'static str, on_stdout: bool) -> Result<Running> {
    cmd.stdin(Stdio::null());
    if on_stdout {
        cmd.stdout(Stdio::piped()).stderr(Stdio::null());
    } else {
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    }
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {shown}"))?;
    let stream: Box<dyn std::io::Read + Send> = if on_stdout {
        Box::new(child.stdout.take().expect("piped"))
    } else {
        Box::new(child.stderr.take().expect("piped"))
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if !sent && line.contains(ready) {
                let _ = tx.send(());
                sent = true;
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs(60)).is_err() {
        let _ = child.kill();
        bail!("{shown} did not become ready");
    }
    Ok(Running { child })
}

fn stormwatch(probes: &'static str) -> Starter {
    Box::new(move |bin: &Path, seconds: u32| {
        let mut cmd = Command::new(bin);
        cmd.args([
            "trace",
            "--json",
            "--interval",
            "1",
            "--duration",
            &(seconds + 30).to_string(),
            "--probes",
            probes,
        ]);
        start_until(cmd, "tracing with", false)
    })
}

fn bpftrace(script: &'static str) -> Starter {
    Box::new(move |_bin: &Path, _seconds: u32| {
        let mut cmd = Command::new("bpftrace");
        cmd.args(["-e", script]);
        start_until(cmd, "Attaching", true)
    })
}

/// What bpftrace users write for the same figures: switches per cgroup and a run-queue
/// latency histogram per cgroup.
const BPFTRACE_SCHED: &str = r#"
tracepoint:sched:sched_wakeup,tracepoint:sched:sched_wakeup_new { @qt[args->pid] = nsecs; }
tracepoint:sched:sched_switch {
  @switches[cgroup] = count();
  if (args->prev_state == 0) { @qt[args->prev_pid] = nsecs; }
  $t = @qt[args->next_pid];
  if ($t) { @runq[cgroup] = hist(nsecs - $t); delete(@qt[args->next_pid]); }
}
"#;

/// Futex wait time per cgroup, as a bpftrace user would measure it.
const BPFTRACE_FUTEX: &str = r#"
tracepoint:syscalls:sys_enter_futex /(args->op & 0x7f) == 0 || (args->op & 0x7f) == 9/ {
  @start[tid] = nsecs;
}
tracepoint:syscalls:sys_exit_futex /@start[tid]/ {
  @wait_ns[cgroup] = sum(nsecs - @start[tid]); @waits[cgroup] = count(); delete(@start[tid]);
}
"#;

/// Runs `stress-ng --<stressor> 2` for `seconds` and returns bogo ops per second (real time).
fn stress(stressor: &str, seconds: u32) -> Result<f64> {
    let yaml = tempfile::Builder::new()
        .prefix("stormwatch-bench-")
        .suffix(".yaml")
        .tempfile()
        .context("cannot create a temporary file for stress-ng's report")?;
    let status = Command::new("stress-ng")
        .args([
            &format!("--{stressor}"),
            "2",
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

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn bench(
    bin: &Path,
    title: &str,
    stressor: &str,
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
            let ops = stress(stressor, seconds)?;
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
        "\n{title}: `stress-ng --{stressor} 2`, {rounds} interleaved rounds of {seconds} s\n\n\
         | tracer | bogo ops/s (median) | ratio to none | loss | ratio per round (min–max) | \
         tracer peak RSS |\n\
         |---|---:|---:|---:|---:|---:|\n"
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

pub fn run(rounds: u32, seconds: u32) -> Result<()> {
    let bin: PathBuf = build_release()?;
    let sched = bench(
        &bin,
        "Scheduler probes",
        "switch",
        vec![
            Tracer {
                name: "none",
                start: None,
            },
            Tracer {
                name: "empty tp_btf sched_switch + sched_wakeup (floor)",
                start: Some(stormwatch("empty-sched")),
            },
            Tracer {
                name: "stormwatch --probes sched",
                start: Some(stormwatch("sched")),
            },
            Tracer {
                name: "stormwatch, all probes",
                start: Some(stormwatch("sched,futex,locks,net")),
            },
            Tracer {
                name: "bpftrace: switches + run-queue histogram per cgroup",
                start: Some(bpftrace(BPFTRACE_SCHED)),
            },
        ],
        rounds,
        seconds,
    )?;
    let futex = bench(
        &bin,
        "Futex and lock probes",
        "futex",
        vec![
            Tracer {
                name: "none",
                start: None,
            },
            Tracer {
                name: "stormwatch --probes futex,locks",
                start: Some(stormwatch("futex,locks")),
            },
            Tracer {
                name: "bpftrace: futex wait time per cgroup",
                start: Some(bpftrace(BPFTRACE_FUTEX)),
            },
        ],
        rounds,
        seconds,
    )?;
    println!("{sched}{futex}");
    println!("{}", crate::bench_daemon::run()?);
    Ok(())
}
