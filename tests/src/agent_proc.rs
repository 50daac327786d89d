//! The agent as a process (`trace` or `diagnose`): started and returned once its probes are
//! attached; its pid, memory and output lines (with the time each arrived) visible while it
//! runs; at the end either its JSON document, typed ([`Agent::finish`]), or its raw output
//! ([`Agent::finish_output`]). The one wrapper every test uses.

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex, mpsc},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{TestCgroup, agent_bin, report::Trace};

/// Starting a workload and joining its threads takes a moment: a trace of a workload lasts
/// this much longer than the workload — two seconds, eight under the kernel matrix's
/// emulation, where a 3-s workload of 32 threads outlasted a 5-s trace (its figures 17–23%
/// short, 2026-11-28; [`Agent::finish`] now says so when it happens).
pub fn trace_margin_seconds() -> f64 {
    if crate::corpus::timings_are_real() {
        2.0
    } else {
        8.0
    }
}

/// How long the agent may take to load and attach its probes.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(60);

/// What `trace` and `diagnose` print on stderr once their probes are attached.
const READY_MARKERS: [&str; 2] = ["tracing with", "watching this host"];

/// A line of output and when the test received it.
pub type Line = (Instant, String);

/// A running `stormwatch <args>` (`trace` or `diagnose`).
pub struct Agent {
    child: Child,
    args: Vec<String>,
    stdout: Arc<Mutex<Vec<Line>>>,
    stdout_thread: Option<JoinHandle<()>>,
    stderr: Option<JoinHandle<Vec<String>>>,
    /// When a workload the agent must have traced whole ended ([`Agent::assert_still_tracing`]).
    covers: Option<std::time::SystemTime>,
}

/// What a finished `trace --json` left.
pub struct Finished {
    pub status: ExitStatus,
    pub stderr: Vec<String>,
    /// The document, typed.
    pub trace: Trace,
    /// The same document, untyped: for the few tests that check its raw shape.
    pub json: Value,
}

/// What a finished agent left.
pub struct AgentOutput {
    pub status: ExitStatus,
    pub stdout: Vec<Line>,
    pub stderr: Vec<String>,
}

impl AgentOutput {
    /// stdout as one string.
    pub fn stdout_text(&self) -> String {
        let mut s = String::new();
        for (_, l) in &self.stdout {
            s.push_str(l);
            s.push('\n');
        }
        s
    }
}

impl Agent {
    /// Starts the agent and returns once it says its probes are attached; panics if it exits
    /// first or stays silent.
    pub fn start(args: &[&str]) -> Self {
        let mut cmd = Command::new(agent_bin());
        cmd.args(args);
        Self::start_command(cmd, args)
    }

    /// [`Agent::start`], the agent out of reach of the kernel's BTF: in a mount namespace of its
    /// own (`unshare --mount`, private propagation: the host's mounts are untouched) where
    /// /dev/null is mounted over /sys/kernel/btf/vmlinux — what a pod sees that does not mount
    /// /sys/kernel/btf. The kernel itself keeps its BTF (the verifier uses it).
    pub fn start_without_kernel_btf(args: &[&str]) -> Self {
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg("mount --bind /dev/null /sys/kernel/btf/vmlinux && exec \"$0\" \"$@\"")
            .arg(agent_bin())
            .args(args);
        Self::start_command(cmd, args)
    }

    fn start_command(mut cmd: Command, args: &[&str]) -> Self {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", agent_bin().display()));
        let out = child.stdout.take().expect("piped stdout");
        let lines: Arc<Mutex<Vec<Line>>> = Arc::default();
        let sink = Arc::clone(&lines);
        let stdout_thread = std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                sink.lock().unwrap().push((Instant::now(), line));
            }
        });
        let err = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        let stderr = std::thread::spawn(move || {
            let mut lines = Vec::new();
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if READY_MARKERS.iter().any(|m| line.contains(m)) {
                    let _ = tx.send(());
                }
                lines.push(line);
            }
            lines
        });
        let mut agent = Self {
            child,
            args: args.iter().map(|s| s.to_string()).collect(),
            stdout: lines,
            stdout_thread: Some(stdout_thread),
            stderr: Some(stderr),
            covers: None,
        };
        let deadline = Instant::now() + ATTACH_TIMEOUT;
        loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(()) => return agent,
                Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {
                    if let Ok(Some(status)) = agent.child.try_wait() {
                        let stderr = agent.stderr.take().unwrap().join().unwrap_or_default();
                        panic!(
                            "stormwatch {:?} exited ({status}) before tracing; stderr:\n{}",
                            agent.args,
                            stderr.join("\n")
                        );
                    }
                }
                Err(_) => {
                    let _ = agent.child.kill();
                    let _ = agent.child.wait();
                    let stderr = agent.stderr.take().unwrap().join().unwrap_or_default();
                    panic!(
                        "stormwatch {:?} did not say it was attached within {ATTACH_TIMEOUT:?}; \
                         stderr:\n{}",
                        agent.args,
                        stderr.join("\n")
                    );
                }
            }
        }
    }

    /// `stormwatch trace <args>`, once it says it is tracing (the probes are attached and the
    /// counters' baseline is taken).
    pub fn trace(args: &[&str]) -> Self {
        let mut all = vec!["trace"];
        all.extend_from_slice(args);
        Self::start(&all)
    }

    /// `trace --json` long enough for a workload of `workload_seconds` started right after it:
    /// of `cgroup` only when one is given, with `--force-tracepoints` when asked.
    pub fn trace_workload(
        workload_seconds: f64,
        cgroup: Option<&TestCgroup>,
        force_tracepoints: bool,
    ) -> Self {
        let force: &[&str] = if force_tracepoints {
            &["--force-tracepoints"]
        } else {
            &[]
        };
        Self::trace_workload_with(workload_seconds, cgroup, force)
    }

    /// As [`Agent::trace_workload`], with `extra` arguments for `trace`.
    pub fn trace_workload_with(
        workload_seconds: f64,
        cgroup: Option<&TestCgroup>,
        extra: &[&str],
    ) -> Self {
        let duration = format!("{}", workload_seconds + trace_margin_seconds());
        let mut args = vec!["--json", "--duration", &duration];
        if let Some(cgroup) = cgroup {
            args.extend(["--cgroup", cgroup.rel_path()]);
        }
        args.extend(extra);
        Self::trace(&args)
    }

    /// Panics unless the agent is still running: called right after a workload exits, it
    /// proves the agent covered the workload's whole life (it started before the workload did).
    #[track_caller]
    pub fn assert_still_tracing(&mut self, what: &str) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "the agent ended ({status}) before {what} did: the test must give it a longer \
                 --duration"
            );
        }
        // Alive is not enough: its window may have ended while it writes its report.
        self.covers = Some(std::time::SystemTime::now());
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Its resident set size (VmRSS) in KiB, `None` once it has exited.
    pub fn rss_kib(&self) -> Option<u64> {
        crate::process_status(self.pid())?.vmrss
    }

    /// The stdout lines received so far.
    pub fn lines_so_far(&self) -> Vec<Line> {
        self.stdout.lock().unwrap().clone()
    }

    /// Waits for the agent to exit (it must have a --duration), checks that it succeeded, and
    /// parses the JSON document it printed (`trace --json`).
    pub fn finish(self) -> Finished {
        let args = self.args.clone();
        let covers = self.covers;
        let out = self.finish_output();
        let stdout = out.stdout_text();
        assert!(
            out.status.success(),
            "stormwatch {args:?} failed ({}); stderr:\n{}\nstdout:\n{stdout}",
            out.status,
            out.stderr.join("\n")
        );
        let json: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
            panic!("stormwatch {args:?} printed no JSON document ({e}):\n{stdout}")
        });
        let trace: Trace = serde_json::from_value(json.clone()).unwrap_or_else(|e| {
            panic!("stormwatch {args:?} printed a document of another shape ({e}):\n{stdout}")
        });
        if let Some(covers) = covers {
            let end = trace.window.end_unix_seconds;
            let ended = covers
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_secs_f64();
            assert!(
                end >= ended,
                "stormwatch {args:?}: its window ended {:.2} s before the workload did: the test \
                 must give it a longer --duration",
                ended - end
            );
        }
        Finished {
            status: out.status,
            stderr: out.stderr,
            trace,
            json,
        }
    }

    /// Waits for the agent to exit (it must have a --duration) and returns what it printed.
    pub fn finish_output(mut self) -> AgentOutput {
        let status = self.child.wait().expect("waiting for stormwatch");
        if let Some(t) = self.stdout_thread.take() {
            let _ = t.join();
        }
        let stderr = self.stderr.take().unwrap().join().unwrap_or_default();
        let stdout = std::mem::take(&mut *self.stdout.lock().unwrap());
        AgentOutput {
            status,
            stdout,
            stderr,
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // Only when a test panicked before finish(): do not leave the agent running.
        if self.stderr.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
