//! What every benchmark shares: starting a tracer (stormwatch as `trace` or as `run`, or
//! bpftrace with a script doing comparable work) and waiting until it is attached, stopping it
//! with its peak memory, a free port, and the median. The benchmark modules import it; it
//! imports none of them.

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

/// Builds the corpus's Go program tests/corpus/`program` (GOPATH mode: it has no module) into
/// the temporary directory, and returns its path.
pub(crate) fn go_corpus_program(program: &str) -> Result<PathBuf> {
    let out = std::env::temp_dir().join(format!("stormwatch-bench-{program}"));
    let status = Command::new("go")
        .args(["build", "-o"])
        .arg(&out)
        .arg(".")
        .current_dir(crate::root().join("tests/corpus").join(program))
        .env("GO111MODULE", "off")
        .status()
        .context("cannot run go build")?;
    if !status.success() {
        bail!("go build of tests/corpus/{program} failed: {status}");
    }
    Ok(out)
}

/// Starts a tracer, given the stormwatch binary and the measurement's length in seconds.
pub(crate) type Starter = Box<dyn Fn(&Path, u32) -> Result<Running>>;

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
pub(crate) fn start_until(
    mut cmd: Command,
    ready: &'static str,
    on_stdout: bool,
) -> Result<Running> {
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
    stormwatch_with(probes, &[])
}

/// `stormwatch trace --probes <probes>` with `extra` arguments.
pub(crate) fn stormwatch_with(probes: &'static str, extra: &'static [&'static str]) -> Starter {
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
        ])
        .args(extra);
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

/// The median (the mean of the middle two for an even count; NaN of nothing). The tests'
/// (`tests/src/stats.rs`) is the upper of the middle two instead, and xtask does not depend on
/// that crate: the benchmarks keep this one.
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// `stormwatch run` as deployed: default configuration (5 s interval, every probe), serving
/// on a free port.
pub(crate) fn stormwatch_run() -> Starter {
    Box::new(|bin: &Path, _seconds: u32| start_run(bin, free_port()?))
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
pub(crate) fn run_command(bin: &Path, port: u16) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(["run", "--listen", &format!("127.0.0.1:{port}")]);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }
}
