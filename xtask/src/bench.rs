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
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{build_release, cargo, root, run_cmd, say};

/// Starts a tracer, given the stormwatch binary and the measurement's length in seconds.
pub(crate) type Starter = Box<dyn Fn(&Path, u32) -> Result<Running>>;

/// A tracer configuration: how to start it, or `None` for no tracing.
struct Tracer {
    name: &'static str,
    start: Option<Starter>,
}

pub(crate) struct Running {
    child: Child,
}

impl Running {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn stop(mut self) -> Result<Option<u64>> {
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

pub(crate) fn stormwatch(probes: &'static str) -> Starter {
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

pub(crate) fn bpftrace(script: &'static str) -> Starter {
    Box::new(move |_bin: &Path, _seconds: u32| {
        let mut cmd = Command::new("bpftrace");
        cmd.args(["-e", script]);
        start_until(cmd, "Attaching", true)
    })
}

/// What bpftrace users write for the same figures: switches per cgroup and a run-queue
/// latency histogram per cgroup.
pub(crate) const BPFTRACE_SCHED: &str = r#"
tracepoint:sched:sched_wakeup,tracepoint:sched:sched_wakeup_new { @qt[args->pid] = nsecs; }
tracepoint:sched:sched_switch {
  @switches[cgroup] = count();
  if (args->prev_state == 0) { @qt[args->prev_pid] = nsecs; }
  $t = @qt[args->next_pid];
  if ($t) { @runq[cgroup] = hist(nsecs - $t); delete(@qt[args->next_pid]); }
}
"#;

/// Futex wait time per cgroup, as a bpftrace user would measure it.
pub(crate) const BPFTRACE_FUTEX: &str = r#"
tracepoint:syscalls:sys_enter_futex /(args->op & 0x7f) == 0 || (args->op & 0x7f) == 9/ {
  @start[tid] = nsecs;
}
tracepoint:syscalls:sys_exit_futex /@start[tid]/ {
  @wait_ns[cgroup] = sum(nsecs - @start[tid]); @waits[cgroup] = count(); delete(@start[tid]);
}
"#;

/// Empty programs on the futex syscall's tracepoints: what attaching there costs by itself
/// (every thread's every system call takes the kernel's slow path while they are attached).
pub(crate) const BPFTRACE_EMPTY_FUTEX: &str = r#"
tracepoint:syscalls:sys_enter_futex { }
tracepoint:syscalls:sys_exit_futex { }
"#;

/// Empty programs on the two tracepoints the network probes count packets at: their floor.
pub(crate) const BPFTRACE_EMPTY_NET: &str = r#"
tracepoint:net:net_dev_start_xmit { }
tracepoint:net:netif_receive_skb { }
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

pub(crate) fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// A measured workload: what the table calls it and its unit, and how to run it for a number
/// of seconds, returning its throughput in that unit.
struct Workload {
    shown: String,
    unit: &'static str,
    run: Box<dyn Fn(u32) -> Result<f64>>,
}

fn stress_ng(stressor: &'static str) -> Workload {
    Workload {
        shown: format!("`stress-ng --{stressor} 2`"),
        unit: "bogo ops/s",
        run: Box::new(move |seconds| stress(stressor, seconds)),
    }
}

fn bench(
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

pub fn run(rounds: u32, seconds: u32, repeats: u32) -> Result<()> {
    let bin: PathBuf = build_release()?;
    let sched = sched(&bin, rounds, seconds)?;
    let futex = futex(&bin, rounds, seconds)?;
    let storm = lock_storm(&bin, rounds, seconds)?;
    let programs = crate::bench_programs::run(&bin, seconds, repeats, &[])?;
    let ordinary = crate::bench_ordinary::run(rounds, seconds)?;
    println!("{sched}{futex}{storm}{programs}{ordinary}");
    println!("{}", crate::bench_daemon::run()?);
    Ok(())
}

/// The switch storm with the floor, the scheduler probes, all probes, the daemon and bpftrace.
pub fn sched(bin: &Path, rounds: u32, seconds: u32) -> Result<String> {
    bench(
        bin,
        "Scheduler probes",
        &stress_ng("switch"),
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
        &stress_ng("futex"),
        vec![
            Tracer {
                name: "none",
                start: None,
            },
            Tracer {
                name: "empty programs on sys_enter/exit_futex (floor, bpftrace)",
                start: Some(bpftrace(BPFTRACE_EMPTY_FUTEX)),
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
                name: "bpftrace: futex wait time per cgroup",
                start: Some(bpftrace(BPFTRACE_FUTEX)),
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
        vec![
            Tracer {
                name: "none",
                start: None,
            },
            Tracer {
                name: "stormwatch run (default configuration)",
                start: Some(stormwatch_run()),
            },
        ],
        rounds,
        seconds,
    )
}

/// Runs the lock storm for `seconds`; its acquisitions per second (its own count, over the
/// time it ran).
fn mutex_storm(storm: &Path, seconds: u32) -> Result<f64> {
    let out = Command::new(storm)
        .args(["--threads", &STORM_THREADS.to_string()])
        .args(["--seconds", &seconds.to_string()])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot start {}", storm.display()))?;
    if !out.status.success() {
        bail!("{} failed: {}", storm.display(), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let ops = json_number(&stdout, "ops")
        .with_context(|| format!("no \"ops\" in mutex_storm's output: {stdout}"))?;
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

/// `stormwatch run` as deployed: default configuration (5 s interval, every probe), serving
/// on a free port.
pub(crate) fn stormwatch_run() -> Starter {
    Box::new(|bin: &Path, _seconds: u32| start_run(bin, free_port()?))
}

/// The default configuration but for the futex tier, attached from the start: the switch
/// storm's worst case (the tier is what a storm attaches, and the daemon otherwise attaches it
/// only after its first judgement, part of the way into a round).
const FUTEX_TIER_ALWAYS: &str = "futex_probes = \"always\"\n";

/// `stormwatch run` with a configuration file holding `config` (TOML).
fn stormwatch_run_with(config: &'static str) -> Starter {
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

/// A free port on 127.0.0.1.
pub(crate) fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("no free port")?
        .port())
}

/// `stormwatch run` with its default configuration, serving on 127.0.0.1:`port`.
pub(crate) fn start_run(bin: &Path, port: u16) -> Result<Running> {
    start_until(run_command(bin, port), "serving http://", false)
}

/// The command line of `stormwatch run` serving on 127.0.0.1:`port`.
fn run_command(bin: &Path, port: u16) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(["run", "--listen", &format!("127.0.0.1:{port}")]);
    cmd
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

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }
}
