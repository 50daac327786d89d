//! What an adversary or a careless hand gives the agent: devices and FIFOs as files, absurd
//! numbers, signals, a second agent. Each gets one clear line and a fitting exit status, or the
//! agent keeps working, with its memory bounded; and the docs' examples say what the agent says.

use std::{
    ffi::CString,
    process::{Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use stormwatch_tests::{
    agent_bin, agent_output,
    daemon::{Daemon, write_file},
    report::{self, Diagnosis},
    require_bpf,
};

/// Runs the agent to its end and returns its exit status, stderr, stdout, the largest resident
/// set it reached (KiB, from the kernel's rusage of the reaped child) and how long it ran.
struct Ran {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    max_rss_kib: i64,
    took: Duration,
}

fn run(args: &[&str]) -> Ran {
    use std::os::unix::process::ExitStatusExt as _;
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let started = Instant::now();
    // Reaped by wait4 below, which also gives its resource usage.
    #[allow(clippy::zombie_processes)]
    let child = Command::new(agent_bin())
        .args(args)
        .env_remove("STORMWATCH_LOG")
        .env_remove("STORMWATCH_INTERVAL")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("the agent starts");
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child, with valid pointers.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32, "wait4");
    Ran {
        status: ExitStatus::from_raw(status),
        stdout: std::fs::read_to_string(out).unwrap(),
        stderr: std::fs::read_to_string(err).unwrap(),
        max_rss_kib: usage.ru_maxrss,
        took: started.elapsed(),
    }
}

/// A refusal: exit `code`, one `stormwatch:` line on stderr that contains `says`, at once,
/// without reading much.
#[track_caller]
fn refused(args: &[&str], code: i32, says: &str) -> Ran {
    let ran = run(args);
    assert_eq!(
        ran.status.code(),
        Some(code),
        "stormwatch {args:?}: exit {} expected, got {}; stderr: {}",
        code,
        ran.status,
        ran.stderr
    );
    let lines: Vec<&str> = ran.stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "stormwatch {args:?}: one line: {}",
        ran.stderr
    );
    assert!(
        lines[0].starts_with("stormwatch:") && lines[0].contains(says),
        "stormwatch {args:?}: the line should say {says:?}: {}",
        lines[0]
    );
    assert!(
        ran.took < Duration::from_secs(10),
        "stormwatch {args:?} took {:?}",
        ran.took
    );
    // Unbounded, /dev/zero grew the agent to 24 GB; a refusal reads nothing of it.
    assert!(
        ran.max_rss_kib < 100 * 1024,
        "stormwatch {args:?} reached {} KiB",
        ran.max_rss_kib
    );
    ran
}

fn mkfifo(path: &std::path::Path) {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

#[test]
fn devices_fifos_and_directories_are_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    let fifo = fifo.to_str().unwrap();
    let d = dir.path().to_str().unwrap();
    refused(
        &["run", "--config", "/dev/zero", "--check-config"],
        1,
        "cannot read config file /dev/zero: a character device, not a regular file",
    );
    refused(
        &["run", "--web.config.file", "/dev/zero", "--check-config"],
        1,
        "cannot read web config file /dev/zero: a character device",
    );
    refused(
        &["run", "--btf", "/dev/zero", "--check-config"],
        1,
        "btf_file: cannot read BTF file /dev/zero: a character device",
    );
    // A FIFO with no writer: a blocking open would wait for ever.
    refused(
        &["run", "--config", fifo],
        1,
        "a FIFO, not a regular file (expected a config file)",
    );
    refused(
        &["run", "--config", d],
        1,
        "a directory, not a regular file",
    );
    // A config file as large as no config is.
    let big = write_file(dir.path(), "big.toml", &"#".repeat(2 << 20));
    refused(
        &["run", "--config", big.to_str().unwrap(), "--check-config"],
        1,
        "larger than 1 MiB",
    );
}

#[test]
fn check_refuses_a_device_as_btf_in_its_report() {
    require_bpf();
    let ran = run(&["check", "--btf", "/dev/zero"]);
    assert_eq!(ran.status.code(), Some(1), "{}", ran.stdout);
    assert!(
        ran.stdout
            .lines()
            .any(|l| l.starts_with("FAIL  BTF") && l.contains("a character device, not a regular")),
        "{}",
        ran.stdout
    );
    assert!(ran.max_rss_kib < 200 * 1024, "{} KiB", ran.max_rss_kib);
}

#[test]
fn check_config_reads_every_file_it_names() {
    refused(
        &["run", "--btf", "/nonexistent", "--check-config"],
        1,
        "btf_file: cannot read BTF file /nonexistent",
    );
    let dir = tempfile::tempdir().unwrap();
    let config = write_file(dir.path(), "c.toml", "btf_file = \"missing.btf\"\n");
    refused(
        &[
            "run",
            "--config",
            config.to_str().unwrap(),
            "--check-config",
        ],
        1,
        "missing.btf",
    );
}

#[test]
fn absurd_numbers_are_refused_with_the_bound() {
    refused(
        &["run", "--interval", "1e-9", "--check-config"],
        2,
        "must be at least 1",
    );
    let dir = tempfile::tempdir().unwrap();
    let config = write_file(dir.path(), "c.toml", "interval_seconds = 1e-9\n");
    refused(
        &[
            "run",
            "--config",
            config.to_str().unwrap(),
            "--check-config",
        ],
        1,
        "interval_seconds must be at least 1",
    );
    refused(&["trace", "--interval", "0.001"], 2, "must be at least 0.1");
    refused(
        &["diagnose", "--duration", "-1"],
        2,
        "'-1' for '--duration <SECS>': must be greater than zero",
    );
    refused(&["trace", "--cgroup", ""], 2, "an empty path");
}

#[test]
fn a_large_max_cgroups_says_what_it_costs() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_file(dir.path(), "c.toml", "max_cgroups = 1000000\n");
    let ran = run(&[
        "run",
        "--config",
        config.to_str().unwrap(),
        "--check-config",
    ]);
    assert!(ran.status.success(), "{}", ran.stderr);
    let cpus = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    // The possible CPUs the per-CPU maps are allocated for: "0-1" on this VM.
    let possible: u32 = cpus
        .trim()
        .split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<u32>().unwrap() - a.parse::<u32>().unwrap() + 1,
            None => 1,
        })
        .sum();
    for text in [&ran.stdout, &ran.stderr] {
        assert!(
            text.contains("max_cgroups = 1000000 preallocates")
                && text.contains(&format!("on this node's {possible} possible CPUs")),
            "{text}"
        );
    }
    // Each cgroup past the maps' fit costs a SchedStats and a LockStats on every CPU.
    let per_cgroup = std::mem::size_of::<stormwatch_common::SchedStats>()
        + std::mem::size_of::<stormwatch_common::LockStats>();
    let mib: f64 = ran
        .stdout
        .split("preallocates ")
        .nth(1)
        .and_then(|t| t.split(" MiB").next())
        .and_then(|n| n.parse().ok())
        .expect("a figure in MiB");
    let least = 1e6 * per_cgroup as f64 * f64::from(possible) / f64::from(1 << 20);
    assert!(
        mib >= least && mib < least * 1.2,
        "{mib} MiB against at least {least}"
    );
    // The default says nothing on stderr.
    let ran = run(&["run", "--check-config"]);
    assert!(
        ran.status.success() && ran.stderr.is_empty(),
        "{}",
        ran.stderr
    );
}

#[test]
fn sighup_is_logged_and_the_daemon_keeps_serving() {
    require_bpf();
    let daemon = Daemon::start(&[]);
    daemon.signal(libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        daemon.get("/healthz").is_ok_and(|r| r.status == 200),
        "the daemon should survive SIGHUP"
    );
    let (status, _, lines) = daemon.stop_logged(libc::SIGTERM);
    assert_eq!(status.code(), Some(0), "{lines:?}");
    assert!(
        lines.iter().any(|l| l.contains("SIGHUP: ignored")),
        "{lines:?}"
    );
}

#[test]
fn an_interrupted_diagnose_says_so_and_exits_130() {
    require_bpf();
    let mut child = Command::new(agent_bin())
        .args(["diagnose", "--duration", "30", "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Until it watches (its first stderr line), then Ctrl-C.
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    std::io::BufRead::read_line(&mut err, &mut first).unwrap();
    assert!(first.contains("watching this host"), "{first}");
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{rest}");
    assert!(rest.contains("interrupted after"), "{rest}");
    let report: Diagnosis = report::parse("diagnose --json", &String::from_utf8_lossy(&out.stdout));
    assert!(report.checked.interrupted);
    assert!(report.checked.duration_seconds < 30.0);
}

#[test]
fn a_second_agent_on_the_node_is_named() {
    require_bpf();
    let first = Daemon::start(&[]);
    let pid = first.child.id();
    let check = agent_output(&["check"]);
    let check = String::from_utf8_lossy(&check.stdout);
    let line = check
        .lines()
        .find(|l| l.contains("other agents"))
        .unwrap_or_else(|| panic!("no `other agents` line:\n{check}"));
    assert!(
        line.starts_with("warn") && line.contains(&format!("pid {pid} ")),
        "{line}"
    );
    let second = Daemon::start(&[]);
    let (_, _, lines) = second.stop_logged(libc::SIGTERM);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("another stormwatch agent is attached")
                && l.contains(&format!("pid {pid} "))),
        "{lines:?}"
    );
    let (status, _) = first.stop(libc::SIGTERM);
    assert!(status.success());
    // Gone: no longer named (other agents on this machine, if any, may still be).
    let check = agent_output(&["check"]);
    let check = String::from_utf8_lossy(&check.stdout);
    let line = check
        .lines()
        .find(|l| l.contains("other agents"))
        .unwrap_or_else(|| panic!("no `other agents` line:\n{check}"));
    assert!(!line.contains(&format!("pid {pid} ")), "{line}");
}

#[test]
fn deploy_readme_setpriv_example_is_what_the_agent_says() {
    require_bpf();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("deploy/README.md")).unwrap();
    let mut lines = doc.lines();
    let example = lines
        .find(|l| l.starts_with("$ setpriv "))
        .expect("the setpriv example");
    let said = lines.next().expect("what the example prints");
    let words: Vec<&str> = example
        .trim_start_matches("$ ")
        .split_whitespace()
        .collect();
    let at = words.iter().position(|w| *w == "stormwatch").unwrap();
    let out = Command::new(words[0])
        .args(&words[1..at])
        .arg(agent_bin())
        .args(&words[at + 1..])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), said);
}
