//! Bad input and missing privileges: one clear `stormwatch:` line on stderr and a non-zero
//! exit, never a panic or a usage block; and `check` as root.

use std::process::{Command, Output};

use stormwatch_tests::{agent_bin, agent_output, require_bpf};

/// The one stderr line of a failed run, after checking the failure's shape.
#[track_caller]
fn one_error_line(out: &Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "{what}: should fail, exited {}; stderr: {stderr}",
        out.status
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
        "{what}: panicked: {stderr}"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{what}: exactly one line on stderr expected, got {}:\n{stderr}",
        lines.len()
    );
    let line = lines[0].trim();
    assert!(
        line.starts_with("stormwatch:") && line.len() > "stormwatch:".len(),
        "{what}: the line should start `stormwatch:` and say something: {line:?}"
    );
    assert!(
        stdout.trim().is_empty(),
        "{what}: nothing on stdout expected, got: {stdout}"
    );
    line.to_owned()
}

#[track_caller]
fn usage_error(args: &[&str]) -> String {
    let out = agent_output(args);
    let line = one_error_line(&out, &format!("stormwatch {args:?}"));
    assert_eq!(
        out.status.code(),
        Some(2),
        "usage errors exit with 2: stormwatch {args:?} exited {}: {line}",
        out.status
    );
    line
}

#[test]
fn unknown_flag_is_a_usage_error() {
    let line = usage_error(&["trace", "--bogus-flag"]);
    assert!(line.contains("--bogus-flag"), "names the flag: {line}");
}

#[test]
fn zero_duration_is_a_usage_error() {
    let line = usage_error(&["trace", "--json", "--duration", "0"]);
    assert!(line.contains("duration") || line.contains('0'), "{line}");
}

#[test]
fn negative_interval_is_a_usage_error() {
    usage_error(&["trace", "--json", "--interval", "-1"]);
    // With `=`, the value cannot be taken for a flag: the value itself must be refused.
    let line = usage_error(&["trace", "--json", "--interval=-1"]);
    assert!(line.contains("interval") || line.contains("-1"), "{line}");
}

#[test]
fn nonexistent_cgroup_is_refused_before_tracing() {
    require_bpf();
    let out = agent_output(&[
        "trace",
        "--json",
        "--duration",
        "1",
        "--cgroup",
        "/nonexistent-xyz",
    ]);
    let line = one_error_line(&out, "trace --cgroup /nonexistent-xyz");
    assert!(
        line.contains("/nonexistent-xyz"),
        "names the cgroup: {line}"
    );
}

/// Runs the agent under `setpriv` with the given options (as root).
fn under_setpriv(setpriv_args: &[&str], args: &[&str]) -> Output {
    Command::new("setpriv")
        .args(setpriv_args)
        .arg("--")
        .arg(agent_bin())
        .args(args)
        .output()
        .expect("cannot run setpriv (util-linux)")
}

/// The capabilities named as missing: what follows "missing" in the line.
fn named_missing(line: &str) -> &str {
    let at = line
        .find("missing")
        .unwrap_or_else(|| panic!("the line should say what is missing: {line}"));
    &line[at..]
}

const TRACE: &[&str] = &["trace", "--json", "--duration", "1"];

#[test]
fn without_any_capability_names_cap_bpf_and_cap_perfmon() {
    require_bpf();
    // As root, an empty bounding set and inheritable set leave the exec'd program with no
    // capabilities at all (CapEff 0), like an unprivileged user.
    let out = under_setpriv(&["--bounding-set=-all", "--inh-caps=-all"], TRACE);
    let line = one_error_line(&out, "trace without capabilities");
    let missing = named_missing(&line);
    assert!(
        missing.contains("CAP_BPF") && missing.contains("CAP_PERFMON"),
        "both capabilities named as missing: {line}"
    );
    // The same as an unprivileged user.
    let out = under_setpriv(
        &[
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ],
        TRACE,
    );
    let line = one_error_line(&out, "trace as nobody");
    let missing = named_missing(&line);
    assert!(
        missing.contains("CAP_BPF") && missing.contains("CAP_PERFMON"),
        "both capabilities named as missing: {line}"
    );
    // `check` fails too (its report is on stdout; the exit status says it cannot work).
    let out = under_setpriv(&["--bounding-set=-all", "--inh-caps=-all"], &["check"]);
    assert!(
        !out.status.success(),
        "check without capabilities must fail: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn without_cap_bpf_names_only_cap_bpf() {
    require_bpf();
    // Root also has CAP_SYS_ADMIN, which the kernel accepts in place of CAP_BPF and
    // CAP_PERFMON; so to lack only CAP_BPF, both CAP_BPF and CAP_SYS_ADMIN are dropped.
    let out = under_setpriv(
        &["--bounding-set=-bpf,-sys_admin", "--inh-caps=-all"],
        TRACE,
    );
    let line = one_error_line(&out, "trace without CAP_BPF");
    let missing = named_missing(&line);
    assert!(
        missing.contains("CAP_BPF"),
        "CAP_BPF named as missing: {line}"
    );
    assert!(
        !missing.contains("CAP_PERFMON"),
        "CAP_PERFMON is there and must not be named as missing: {line}"
    );
}

#[test]
fn cap_sys_admin_stands_in_for_cap_bpf() {
    require_bpf();
    // Only CAP_BPF dropped: root still has CAP_SYS_ADMIN, which the kernel accepts for bpf(),
    // so the agent can work and must not refuse.
    let out = under_setpriv(&["--bounding-set=-bpf", "--inh-caps=-all"], &["check"]);
    assert!(
        out.status.success(),
        "check with CAP_SYS_ADMIN but without CAP_BPF should pass ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn check_lines(args: &[&str], kind: &str) {
    require_bpf();
    let out = agent_output(args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stormwatch {args:?} as root should exit 0 ({}):\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stdout.contains("FAIL"), "no FAIL line: {stdout}");
    // Every probe this agent has attaches on this kernel (the scheduler ones as `kind`; others,
    // such as syscall tracepoints, may only have one way to attach).
    // With classic tracepoints forced, `sched_waking` (which tells remote wake-ups from local
    // ones through the woken thread's task storage, out of reach of the classic records) is
    // left out, and says why.
    for l in stdout.lines().filter(|l| l.contains(" probe ")) {
        let tp_btf_only = kind == "tracepoint"
            && l.contains("probe sched:sched_waking ")
            && l.contains("not attached: needs sched_wakeup as tp_btf");
        assert!(
            l.contains("attached as") || tp_btf_only,
            "probe not attached: {l}\n{stdout}"
        );
    }
    // The Go storm's on-CPU sampler, on every CPU's clock.
    let cpus = stormwatch_tests::cpus();
    assert!(
        stdout.lines().any(|l| l.starts_with("ok ")
            && l.contains("sampler Go on-CPU ")
            && l.contains(&format!("attached to {cpus} CPUs' clocks"))),
        "a line saying the Go on-CPU sampler is attached to {cpus} CPUs:\n{stdout}"
    );
    for tp in [
        "sched:sched_switch",
        "sched:sched_wakeup",
        "sched:sched_wakeup_new",
    ] {
        let wanted = format!("attached as {kind}");
        assert!(
            stdout
                .lines()
                .any(|l| l.contains(&format!("probe {tp} ")) && l.contains(&wanted)),
            "a line saying probe {tp} {wanted}:\n{stdout}"
        );
    }
}

#[test]
fn check_as_root_attaches_every_probe_as_tp_btf() {
    check_lines(&["check"], "tp_btf");
}

#[test]
fn check_with_forced_tracepoints_attaches_classic_tracepoints() {
    check_lines(&["check", "--force-tracepoints"], "tracepoint");
}

/// `--btf FILE`: a copy of the kernel's own BTF (what a node would give a pod that cannot read
/// /sys/kernel/btf) attaches every scheduler probe as tp_btf, and `check` names the file.
#[test]
fn check_with_a_copy_of_the_kernels_btf_attaches_as_tp_btf() {
    require_bpf();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let copy = dir.path().join("vmlinux.btf");
    std::fs::copy("/sys/kernel/btf/vmlinux", &copy).expect("copying the kernel's BTF");
    let copy = copy.to_str().expect("a UTF-8 path");
    check_lines(&["check", "--btf", copy], "tp_btf");
    let out = agent_output(&["check", "--btf", copy]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let btf = stdout
        .lines()
        .find(|l| l.contains(" BTF "))
        .unwrap_or_else(|| panic!("a BTF line:\n{stdout}"));
    assert!(
        btf.starts_with("ok") && btf.contains(copy) && btf.contains("given with --btf"),
        "{btf}"
    );
}

/// An empty or truncated BTF file is not BTF: `check` fails on a `FAIL BTF` line naming it, and
/// `trace` refuses it in one line, before attaching anything.
#[test]
fn an_empty_or_truncated_btf_file_is_refused() {
    require_bpf();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let empty = dir.path().join("empty.btf");
    std::fs::write(&empty, b"").unwrap();
    let truncated = dir.path().join("truncated.btf");
    let kernel = std::fs::read("/sys/kernel/btf/vmlinux").expect("the kernel's BTF");
    std::fs::write(&truncated, &kernel[..kernel.len() / 2]).unwrap();
    for file in [&empty, &truncated] {
        let file = file.to_str().expect("a UTF-8 path");
        let out = agent_output(&["check", "--btf", file]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "check --btf {file}:\n{stdout}");
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("FAIL") && l.contains(" BTF ") && l.contains(file)),
            "a FAIL BTF line naming {file}:\n{stdout}"
        );
        assert!(
            !stdout
                .lines()
                .any(|l| l.starts_with("ok") && l.contains(" BTF ")),
            "no ok BTF line:\n{stdout}"
        );
        let out = agent_output(&["trace", "--json", "--duration", "1", "--btf", file]);
        let line = one_error_line(&out, &format!("trace --btf {file}"));
        assert!(line.contains(file), "names the file: {line}");
    }
}

/// Where neither the kernel's BTF nor the scheduler's tracepoints can be reached (the agent in a
/// mount namespace of its own, /dev/null over the BTF file and an empty tmpfs over tracefs'
/// `sched` events), the lock-storm diagnosis cannot run: `check` fails (exit 1), on `FAIL` lines
/// for the missing scheduler probes and for what is lost with them, naming the rules; the
/// probes that did attach still say so.
#[test]
fn check_fails_and_says_what_is_lost_without_the_scheduler_probes() {
    require_bpf();
    let hide = "mount --bind /dev/null /sys/kernel/btf/vmlinux && \
                for d in /sys/kernel/tracing/events/sched /sys/kernel/debug/tracing/events/sched; \
                do if [ -d \"$d\" ]; then mount -t tmpfs none \"$d\" || exit 1; fi; done && \
                exec \"$0\" check";
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", hide])
        .arg(agent_bin())
        .output()
        .expect("running unshare");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "check without the scheduler probes must fail:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |start: &str, has: &[&str]| {
        stdout
            .lines()
            .any(|l| l.starts_with(start) && has.iter().all(|h| l.contains(h)))
    };
    assert!(
        line("FAIL", &["probe sched:sched_switch ", "not attached"]),
        "{stdout}"
    );
    assert!(
        line(
            "FAIL",
            &["probe sched:sched_wakeup ", "needs sched:sched_switch"]
        ),
        "{stdout}"
    );
    assert!(
        line("FAIL", &["lost", "context switches", "lock_storm"]),
        "{stdout}"
    );
    assert!(
        line(
            "FAIL",
            &["lost", "run-queue latency", "runqueue_saturation"]
        ),
        "{stdout}"
    );
    assert!(
        line(
            "ok",
            &["probe syscalls:sys_enter_futex ", "attached as tracepoint"]
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("verdict: stormwatch cannot run here"),
        "{stdout}"
    );
}
