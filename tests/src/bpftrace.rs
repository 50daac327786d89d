//! An independent tracer for ground truth: a bpftrace script run next to the agent.
//!
//! [`Bpftrace::start`] returns once bpftrace says it is attaching its probes (its
//! `Attaching N probes...` line); [`Bpftrace::stop`] sends SIGINT to *its* pid (never by name),
//! waits for it, and parses the maps it prints at exit (`@name: value` and `@name[key]: value`,
//! one per line).

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader, Read as _},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// How long bpftrace may take to compile and load a script.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(60);

/// A running bpftrace.
pub struct Bpftrace {
    child: Child,
    stdout: Option<JoinHandle<Vec<String>>>,
    stderr: Option<JoinHandle<String>>,
    script: String,
}

/// The maps bpftrace printed at exit: `@name` or `@name[key]` → the printed value.
#[derive(Debug)]
pub struct Maps {
    pub entries: BTreeMap<String, String>,
    /// Everything bpftrace printed, for panic messages.
    pub output: String,
}

impl Maps {
    /// A numeric map entry (`@sum`, `@count[4]`…), or `None` when bpftrace printed none (maps
    /// that were never updated are not printed).
    pub fn get(&self, name: &str) -> Option<i64> {
        self.entries.get(name).map(|v| {
            v.trim().parse().unwrap_or_else(|e| {
                panic!(
                    "bpftrace map {name} is not an integer ({v:?}: {e}); output:\n{}",
                    self.output
                )
            })
        })
    }

    /// A numeric map entry that must be there.
    #[track_caller]
    pub fn require(&self, name: &str) -> i64 {
        self.get(name).unwrap_or_else(|| {
            panic!(
                "bpftrace printed no {name}: it saw no event at all; output:\n{}",
                self.output
            )
        })
    }
}

impl Bpftrace {
    /// Starts `bpftrace -e script`; panics with its output if it exits or stays silent.
    pub fn start(script: &str) -> Self {
        Self::spawn(script, false)
    }

    /// As [`Bpftrace::start`], but user-space stacks print as bare addresses, for a caller that
    /// names them itself. bpftrace resolves every address of every stack at exit: 4 s for a
    /// 10-s profile of a Go program here, and over 30 s once in CI (2026-12-02) — not exiting
    /// within the wait. Unresolved, it exits in a fraction of a second.
    pub fn start_with_raw_user_stacks(script: &str) -> Self {
        Self::spawn(script, true)
    }

    fn spawn(script: &str, raw_user_stacks: bool) -> Self {
        let mut command = Command::new("bpftrace");
        if raw_user_stacks {
            command.env("BPFTRACE_NO_USER_SYMBOLS", "1");
        }
        let mut child = command
            .arg("-e")
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start bpftrace (is it installed?): {e}"));
        let out = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        let stdout = std::thread::spawn(move || {
            let mut lines = Vec::new();
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if line.starts_with("Attaching") {
                    let _ = tx.send(());
                }
                lines.push(line);
            }
            lines
        });
        let mut err = child.stderr.take().expect("piped stderr");
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        let mut bt = Self {
            child,
            stdout: Some(stdout),
            stderr: Some(stderr),
            script: script.to_owned(),
        };
        let deadline = Instant::now() + ATTACH_TIMEOUT;
        loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(()) => break,
                Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {
                    if let Ok(Some(status)) = bt.child.try_wait() {
                        let (out, err) = bt.collect();
                        panic!(
                            "bpftrace exited ({status}) before attaching; script:\n{}\n\
                             stdout:\n{}\nstderr:\n{err}",
                            bt.script,
                            out.join("\n")
                        );
                    }
                }
                Err(_) => {
                    bt.kill();
                    let (out, err) = bt.collect();
                    panic!(
                        "bpftrace did not print `Attaching` within {ATTACH_TIMEOUT:?}; \
                         stdout:\n{}\nstderr:\n{err}",
                        out.join("\n")
                    );
                }
            }
        }
        // "Attaching" is printed just before the probes are attached, one by one: give the
        // attachment a moment so that nothing the caller starts next is missed.
        std::thread::sleep(Duration::from_millis(500));
        bt
    }

    fn collect(&mut self) -> (Vec<String>, String) {
        let out = self
            .stdout
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        let err = self
            .stderr
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        (out, err)
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops bpftrace with SIGINT (to its own pid) and parses the maps it prints.
    pub fn stop(self) -> Maps {
        self.try_stop().unwrap_or_else(|hung| panic!("{hung}"))
    }

    /// As [`Bpftrace::stop`], but a bpftrace that does not exit in time is an `Err` (it is
    /// killed; what it printed is in the message), for a caller that measures again: bpftrace
    /// 0.17 with `usdt:` probes hung past 30 s after SIGINT twice in a dozen runs here
    /// (2026-12-02, with and without load), cause not found.
    pub fn try_stop(mut self) -> Result<Maps, String> {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) on our own child's pid, which has not been reaped yet.
        unsafe { libc::kill(pid, libc::SIGINT) };
        // Detaching its probes and printing its maps took over 30 s once in an emulated 6.12
        // guest (the kernel matrix, 2026-11-29): a longer wait there.
        let wait = if crate::corpus::timings_are_real() {
            30
        } else {
            120
        };
        let deadline = Instant::now() + Duration::from_secs(wait);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("waiting for bpftrace") {
                break status;
            }
            if Instant::now() > deadline {
                let state = hung_state(pid);
                self.kill();
                let (out, err) = self.collect();
                return Err(format!(
                    "bpftrace did not exit within {wait} s of SIGINT; stdout:\n{}\nstderr:\n{err}\n\
                     its state:\n{state}",
                    out.join("\n")
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let (out, err) = self.collect();
        let output = format!("{}\n(stderr:)\n{err}", out.join("\n"));
        assert!(
            status.success(),
            "bpftrace failed ({status}); output:\n{output}"
        );
        let entries = parse_maps(&out);
        Ok(Maps { entries, output })
    }
}

/// How many windows a test measures at most when bpftrace hangs on SIGINT ([`measured`]).
pub const WINDOWS_WHEN_HUNG: usize = 3;

/// Runs `window` — one measurement with its own bpftrace, stopped with
/// [`Bpftrace::try_stop`] — and again when bpftrace hung, up to [`WINDOWS_WHEN_HUNG`] windows
/// in all, saying so: the oracle's fault, not the agent's. bpftrace 0.17 hung past 30 s after
/// SIGINT in about one window in eight of the tests whose agent ends its own window at the
/// same moment (2026-12-02: `pglock` by hand and in a CI run, `gocpu` in two CI runs; never in
/// a loop of the test alone).
pub fn measured<T>(mut window: impl FnMut() -> Result<T, String>) -> T {
    let mut hung = Vec::new();
    while hung.len() < WINDOWS_WHEN_HUNG {
        match window() {
            Ok(t) => return t,
            Err(e) => {
                eprintln!("bpftrace hung; measuring again: {e}");
                hung.push(e);
            }
        }
    }
    panic!(
        "bpftrace hung in {WINDOWS_WHEN_HUNG} windows out of {WINDOWS_WHEN_HUNG}:\n{}",
        hung.join("\n---\n")
    )
}

/// One `stormwatch diagnose --json` window of `seconds`, and bpftrace (`start`ed once the
/// agent's probes are attached, the window's start) over as much of it as it can cover,
/// stopped at its end: the agent's report and bpftrace's maps, or `Err` when bpftrace hung
/// (for [`measured`]).
pub fn diagnose_beside(
    seconds: u32,
    start: impl FnOnce() -> Bpftrace,
) -> Result<(serde_json::Value, Maps), String> {
    let duration = seconds.to_string();
    let agent = crate::Agent::start(&["diagnose", "--duration", &duration, "--json"]);
    let window = Instant::now();
    let oracle = start();
    std::thread::sleep(Duration::from_secs(u64::from(seconds)).saturating_sub(window.elapsed()));
    let printed = oracle.try_stop();
    let out = agent.finish_output();
    let printed = printed?;
    let report = serde_json::from_str(&out.stdout_text()).expect("diagnose --json");
    Ok((report, printed))
}

/// What a bpftrace that does not exit is doing, for the failure's message: each thread's
/// state, kernel stack and signal masks, and its user stacks when gdb is there.
fn hung_state(pid: libc::pid_t) -> String {
    let mut s = String::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default();
    for task in tasks {
        let read = |f: &str| std::fs::read_to_string(task.join(f)).unwrap_or_default();
        let status: Vec<String> = read("status")
            .lines()
            .filter(|l| {
                ["Name", "State", "Sig", "ShdPnd"]
                    .iter()
                    .any(|k| l.starts_with(k))
            })
            .map(str::to_owned)
            .collect();
        s += &format!(
            "{}: {}; wchan {}\n{}\n",
            task.display(),
            status.join("; "),
            read("wchan"),
            read("stack")
        );
    }
    if let Ok(out) = Command::new("gdb")
        .args([
            "-p",
            &pid.to_string(),
            "-batch",
            "-ex",
            "thread apply all bt 12",
        ])
        .stdin(Stdio::null())
        .output()
    {
        s += &String::from_utf8_lossy(&out.stdout);
    }
    s
}

impl Drop for Bpftrace {
    fn drop(&mut self) {
        // Only when a test panicked before stop(): do not leave bpftrace attached.
        if self.stdout.is_some() {
            self.kill();
        }
    }
}

/// `@name: value` and `@name[key]: value` lines (single-line values only).
pub fn parse_maps(lines: &[String]) -> BTreeMap<String, String> {
    lines
        .iter()
        .filter(|l| l.starts_with('@'))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(": ")?;
            Some((name.to_owned(), value.trim().to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hung_window_is_measured_again() {
        let mut tries = 0;
        let got = measured(|| {
            tries += 1;
            if tries < WINDOWS_WHEN_HUNG {
                Err(format!("hung {tries}"))
            } else {
                Ok(tries)
            }
        });
        assert_eq!(got, WINDOWS_WHEN_HUNG);
    }

    #[test]
    #[should_panic(expected = "bpftrace hung in 3 windows out of 3")]
    fn windows_that_all_hang_fail_the_test() {
        measured(|| Err::<(), _>("hung".to_owned()));
    }

    #[test]
    fn parses_scalar_and_keyed_maps() {
        let lines: Vec<String> = [
            "Attaching 2 probes...",
            "",
            "@count: 2532",
            "@sum: 81971154293",
            "@by_kind[4]: 17",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let m = parse_maps(&lines);
        assert_eq!(m["@count"], "2532");
        assert_eq!(m["@sum"], "81971154293");
        assert_eq!(m["@by_kind[4]"], "17");
        assert_eq!(m.len(), 3);
    }
}
