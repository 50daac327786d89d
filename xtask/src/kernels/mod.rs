//! The kernel matrix: Debian's 6.1 and 6.12 LTS kernels, each booted in a guest that runs
//! `stormwatch check` and a few integration tests against that kernel.
//!
//! - The kernels: the newest `linux-image-<series>.*-amd64` of each series that the package
//!   index has (the ABI number in the name moves with security updates; `apt-cache policy`
//!   decides), fetched with `apt-get download` and unpacked with `dpkg-deb -x` under
//!   `target/kernels/` (the host's /boot is never touched).
//! - The guests: `vng --disable-kvm -r <vmlinuz>` (virtme-ng) boots the kernel on QEMU with the
//!   host's filesystem read-only (/tmp, /etc, /var… are overlays in the guest's memory), 2 vCPUs
//!   and 2 GiB, and only cgroup v2 (`cgroup_no_v1=all`). Software emulation (TCG), the
//!   vCPUs on one host thread (`Guest::one_host_thread`: why): this machine's
//!   /dev/kvm runs only guest kernels built for its paravirtual hypervisor. Right for correctness,
//!   not for timings: emulation is several times slower than the host, so the steps are those
//!   whose figures are checked against ground truth, not against a rate.
//! - One boot per kernel, two phases: with the kernel's BTF, then with an empty file mounted over
//!   /sys/kernel/btf/vmlinux (what a pod that does not mount /sys/kernel/btf sees; the kernel
//!   itself keeps its BTF). The guest writes each step's output, exit status and times to a
//!   directory it may write (`--rwdir`); the host judges them after the guest is gone.
//!
//! A step that did not run (the guest died, a test binary ran no test) fails like a wrong figure.

use std::{
    collections::HashMap,
    fmt::Write as _,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{cargo, root, run_cmd, say, setup::output};

/// The LTS series of the matrix, as Debian names its kernel images.
pub const SERIES: [&str; 2] = ["6.1", "6.12"];

/// How long one step may take in the guest before it is killed (and fails).
const STEP_TIMEOUT_SECONDS: u32 = 300;
/// How long one guest may run in all.
const GUEST_TIMEOUT: Duration = Duration::from_secs(25 * 60);

/// Where the guest finds the kernel's BTF copied before it is hidden, and the empty file.
const BTF_COPY: &str = "/tmp/vmlinux.btf";
const BTF_EMPTY: &str = "/tmp/empty.btf";

/// A kernel image unpacked under `target/kernels/`.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub series: &'static str,
    pub package: String,
    pub version: String,
    pub vmlinuz: PathBuf,
}

pub fn kernels_dir() -> PathBuf {
    root().join("target/kernels")
}

/// Whether `name` is the plain `arch` image of `series` (not -cloud, -rt, -16k, dbg, unsigned).
fn is_plain_image(series: &str, arch: &str, name: &str) -> bool {
    let Some(rest) = name.strip_prefix(&format!("linux-image-{series}.")) else {
        return false;
    };
    rest.starts_with(|c: char| c.is_ascii_digit())
        && rest.ends_with(&format!("-{arch}"))
        && !["cloud", "-rt-", "dbg", "unsigned"]
            .iter()
            .any(|s| rest.contains(s))
}

/// `(package, candidate version)` from `apt-cache policy` output.
fn parse_policy(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = None;
    for line in text.lines() {
        if !line.starts_with(' ')
            && let Some(name) = line.strip_suffix(':')
        {
            // A foreign architecture's package is `name:arch`.
            let name = name.split(':').next().unwrap_or(name);
            current = Some(name.to_owned());
        } else if let Some(v) = line.trim().strip_prefix("Candidate:")
            && let Some(name) = current.take()
        {
            let v = v.trim();
            if v != "(none)" {
                out.push((name, v.to_owned()));
            }
        }
    }
    out
}

fn version_greater(a: &str, b: &str) -> bool {
    Command::new("dpkg")
        .args(["--compare-versions", a, "gt", b])
        .status()
        .is_ok_and(|s| s.success())
}

/// The newest plain `arch` image of `series` in the package index: `(package, version)`.
fn newest(series: &'static str, arch: &str) -> Result<Option<(String, String)>> {
    let pattern = format!("^linux-image-{}\\.", series.replace('.', "\\."));
    let found = output(Command::new("apt-cache").args(["search", "--names-only", &pattern]))?;
    let names: Vec<String> = found
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| is_plain_image(series, arch, n))
        .map(|n| format!("{n}:{arch}"))
        .collect();
    if names.is_empty() {
        return Ok(None);
    }
    let policy = output(Command::new("apt-cache").arg("policy").args(&names))?;
    let mut best: Option<(String, String)> = None;
    for (name, version) in parse_policy(&policy) {
        if best
            .as_ref()
            .is_none_or(|(_, v)| version_greater(&version, v))
        {
            best = Some((name, version));
        }
    }
    Ok(best)
}

/// The newest amd64 image of `series`, downloaded and unpacked (once); older images of the
/// series left under `target/kernels/` are removed.
pub fn fetch(series: &'static str) -> Result<Kernel> {
    fetch_arch(series, "amd64")
}

/// The `.deb` of `package` (without its architecture) in `debs`, if it was downloaded.
fn deb_of(debs: &Path, package: &str) -> Option<PathBuf> {
    std::fs::read_dir(debs)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with(&format!("{package}_")) && n.ends_with(".deb")
            })
        })
}

/// `package` for `arch`, downloaded into `debs` (`apt-get download`) unless it is there; the
/// package index is refreshed once if the download fails and `refreshed` says it was not yet.
pub fn download_deb(
    debs: &Path,
    package: &str,
    arch: &str,
    refreshed: &mut bool,
) -> Result<PathBuf> {
    std::fs::create_dir_all(debs).with_context(|| format!("creating {}", debs.display()))?;
    if let Some(deb) = deb_of(debs, package) {
        return Ok(deb);
    }
    say(&format!("downloading {package}:{arch} (apt-get download)"));
    let spec = format!("{package}:{arch}");
    let download = || {
        run_cmd(
            Command::new("apt-get")
                .args(["download", "-q", &spec])
                .current_dir(debs),
        )
    };
    if download().is_err() {
        if *refreshed {
            bail!("apt-get download {spec} failed");
        }
        run_cmd(Command::new("apt-get").args(["update", "-q"]))?;
        *refreshed = true;
        download()?;
    }
    deb_of(debs, package).with_context(|| format!("no .deb of {package} after download"))
}

/// The newest `arch` image of `series` (`amd64`, or `arm64` once dpkg has that architecture),
/// downloaded and unpacked (once); older images of the series left under `target/kernels/` are
/// removed.
pub fn fetch_arch(series: &'static str, arch: &str) -> Result<Kernel> {
    let dir = kernels_dir();
    let debs = dir.join("deb");
    let mut refreshed = false;
    let (package, version) = loop {
        match newest(series, arch)? {
            Some(found) => break found,
            None if !refreshed => {
                say(&format!(
                    "no linux-image-{series}.*-{arch} in the package index: apt-get update"
                ));
                run_cmd(Command::new("apt-get").args(["update", "-q"]))?;
                refreshed = true;
            }
            None => bail!("the package index has no linux-image-{series}.*-{arch}"),
        }
    };
    let unpacked = dir.join(&package);
    let vmlinuz = |root: &Path| -> Option<PathBuf> {
        std::fs::read_dir(root.join("boot"))
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
            })
    };
    if let Some(vmlinuz) = vmlinuz(&unpacked) {
        say(&format!("kernel {package} {version}: unpacked"));
        return Ok(Kernel {
            series,
            package,
            version,
            vmlinuz,
        });
    }
    let deb = download_deb(&debs, &package, arch, &mut refreshed)?;
    // Unpacked beside, then renamed: a half-unpacked tree is never taken for a kernel.
    let partial = dir.join(format!("{package}.partial"));
    let _ = std::fs::remove_dir_all(&partial);
    say(&format!("unpacking {} (dpkg-deb -x)", deb.display()));
    run_cmd(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial))?;
    std::fs::rename(&partial, &unpacked)?;
    // Older images of the series: superseded.
    for entry in std::fs::read_dir(&dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let base = name.split('_').next().unwrap_or(&name);
        if base != package && is_plain_image(series, arch, base) {
            say(&format!("removing {name}, superseded by {package}"));
            let path = entry.path();
            let _ = std::fs::remove_dir_all(&path);
        }
    }
    for entry in std::fs::read_dir(&debs)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let base = name.split('_').next().unwrap_or(&name);
        if base != package && is_plain_image(series, arch, base) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    let vmlinuz = vmlinuz(&unpacked).with_context(|| format!("no vmlinuz in {package}"))?;
    Ok(Kernel {
        series,
        package,
        version,
        vmlinuz,
    })
}

/// Every kernel of the matrix, fetched.
pub fn fetch_all() -> Result<Vec<Kernel>> {
    SERIES.iter().map(|s| fetch(s)).collect()
}

/// When a step runs: with the kernel's BTF, or with it hidden.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Btf,
    BtfHidden,
}

/// What a step runs in the guest.
#[derive(Clone, Debug)]
pub enum Run {
    /// `stormwatch <args>`; `{foreign}` in an argument is another kernel's BTF (the host's).
    Agent(Vec<String>),
    /// One test of an integration test binary (`tests/tests/<binary>.rs`), by exact name.
    Test { binary: String, test: String },
}

/// One step of a guest and how its output is judged.
#[derive(Clone, Debug)]
pub struct Step {
    pub name: String,
    pub phase: Phase,
    pub run: Run,
    pub expect: Expect,
}

/// What a step must show.
#[derive(Clone, Copy, Debug)]
pub enum Expect {
    /// The test ran and passed: exit 0 and "1 passed" (a filter that matched nothing fails).
    TestPasses,
    /// `check` with every probe, the scheduler's as tp_btf.
    CheckAllTpBtf,
    /// `check` with the kernel's BTF hidden: the scheduler and futex probes attached as classic
    /// tracepoints, exit 0, and what is lost listed (none of it what the storm needs).
    CheckClassicWithoutBtf,
    /// `check --btf FILE` refused the file (exit 1, a FAIL BTF line containing the text).
    CheckRefusesBtf(&'static str),
}

fn agent(name: &str, phase: Phase, args: &[&str], expect: Expect) -> Step {
    Step {
        name: name.to_owned(),
        phase,
        run: Run::Agent(args.iter().map(|s| s.to_string()).collect()),
        expect,
    }
}

/// A test step: `binary::test`, run in `phase`.
pub fn test(phase: Phase, binary: &str, test: &str) -> Step {
    Step {
        name: format!("{binary}::{test}"),
        phase,
        run: Run::Test {
            binary: binary.to_owned(),
            test: test.to_owned(),
        },
        expect: Expect::TestPasses,
    }
}

/// The matrix's steps, the same on every kernel.
pub fn matrix_steps() -> Vec<Step> {
    use Phase::*;
    vec![
        agent("check", Btf, &["check"], Expect::CheckAllTpBtf),
        // Context switches against the workload's rusage.
        test(
            Btf,
            "sched_accuracy",
            "mutex_storm_switches_match_rusage_tp_btf",
        ),
        // Futex waits, wakes, timeouts and EAGAINs against the calls the workload made.
        test(
            Btf,
            "futex_locks",
            "futex_wakes_timeouts_and_eagain_match_the_calls_made",
        ),
        // The storm verdict with the rule's own thresholds, inside a 0.5-CPU quota: on cpu.max
        // (the guests have only cgroup v2), with its cpu_throttling finding. Threads that
        // contend while they run (a short section): under emulation sysbench's storm hands
        // off 1/200 as often as on the host, a convoy the quota binds first (tests/CORPUS.md).
        test(
            Btf,
            "corpus",
            "lockbench_short_critical_section_inside_a_quota_is_a_lock_storm_and_throttling",
        ),
        // A convoy the quota binds first: throttling, not a storm — the CPUs it wanted read
        // from cpu.max's throttled_usec.
        test(
            Btf,
            "corpus",
            "lockbench_long_critical_section_inside_a_quota_is_quota_bound",
        ),
        // The quiet verdict: CPU-bound work in a quota is throttling, not a lock storm.
        test(
            Btf,
            "corpus",
            "cpu_bound_work_inside_a_quota_is_throttling_not_a_lock_storm",
        ),
        // Throttled periods and time over a window against cpu.stat read at its edges: on
        // cpu.max, which this hybrid host's v1-bound `cpu` controller cannot offer.
        test(
            Btf,
            "throttling",
            "throttling_over_a_window_is_cpu_stat_between_its_edges",
        ),
        // `run`: a storm's finding on /metrics while it lasts, gone after.
        test(Btf, "daemon", "a_lock_storm_is_a_finding_while_it_lasts"),
        // The kernel's BTF hidden from here on.
        agent(
            "check (BTF hidden)",
            BtfHidden,
            &["check"],
            Expect::CheckClassicWithoutBtf,
        ),
        agent(
            "check --btf <copy of the kernel's BTF>",
            BtfHidden,
            &["check", "--btf", BTF_COPY],
            Expect::CheckAllTpBtf,
        ),
        agent(
            "check --btf <empty file>",
            BtfHidden,
            &["check", "--btf", BTF_EMPTY],
            Expect::CheckRefusesBtf("not a BTF blob"),
        ),
        agent(
            "check --btf <another kernel's BTF>",
            BtfHidden,
            &["check", "--btf", "{foreign}"],
            Expect::CheckRefusesBtf("is not the running kernel's BTF"),
        ),
        agent(
            "check --force-tracepoints --btf <another kernel's BTF>",
            BtfHidden,
            &["check", "--force-tracepoints", "--btf", "{foreign}"],
            Expect::CheckRefusesBtf("is not the running kernel's BTF"),
        ),
        test(
            BtfHidden,
            "sched_accuracy",
            "mutex_storm_switches_match_rusage_with_the_kernels_btf_hidden",
        ),
        // And without the scheduler's tracepoints too: the storm diagnosis cannot run, and
        // `check` fails saying what is lost.
        test(
            BtfHidden,
            "cli_errors",
            "check_fails_and_says_what_is_lost_without_the_scheduler_probes",
        ),
    ]
}

/// The integration test binaries, built (release, as the host's tests run them): name → path.
pub fn test_binaries() -> Result<HashMap<String, PathBuf>> {
    let out = cargo()
        .args([
            "test",
            "--release",
            "--package",
            "stormwatch-tests",
            "--no-run",
            "--message-format=json",
        ])
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the integration tests failed: {}", out.status);
    }
    let mut bins = HashMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] == "compiler-artifact"
            && msg["target"]["kind"] == serde_json::json!(["test"])
            && let (Some(name), Some(exe)) =
                (msg["target"]["name"].as_str(), msg["executable"].as_str())
        {
            bins.insert(name.to_owned(), PathBuf::from(exe));
        }
    }
    Ok(bins)
}

pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Set in the guests: their timings are emulation's (tests/src/corpus.rs reads it).
const EMULATED_ENV: &str = "STORMWATCH_TEST_EMULATED";

/// The guest's script: each step's output, status and times into `out`.
fn script(
    steps: &[Step],
    agent_bin: &Path,
    bins: &HashMap<String, PathBuf>,
    foreign_btf: &Path,
    out: &Path,
) -> Result<String> {
    let mut s = String::new();
    let out_q = sh_quote(&out.display().to_string());
    writeln!(s, "#!/bin/sh")?;
    writeln!(
        s,
        "# Written by `cargo xtask` (xtask/src/kernels.rs): one guest's steps."
    )?;
    writeln!(s, "OUT={out_q}")?;
    writeln!(
        s,
        "step() {{ n=$1; shift; date +%s.%N > \"$OUT/$n.start\"; timeout -k 10 \
         {STEP_TIMEOUT_SECONDS} \"$@\" > \"$OUT/$n.out\" 2>&1; echo $? > \"$OUT/$n.rc\"; \
         date +%s.%N > \"$OUT/$n.end\"; }}"
    )?;
    // The host's filesystem is read-only in the guest; /tmp is the guest's own.
    writeln!(s, "cd /tmp")?;
    // Under emulation the programs' speeds are not their own: the tests that compare work per
    // second (the corpus's counterfactuals) leave that comparison out here and say so.
    writeln!(s, "export {EMULATED_ENV}=1")?;
    writeln!(s, "uname -r > \"$OUT/uname\"")?;
    writeln!(s, "cat /proc/self/mountinfo > \"$OUT/mountinfo\"")?;
    writeln!(s, "nproc > \"$OUT/nproc\"")?;
    let mut hidden = false;
    for (i, step) in steps.iter().enumerate() {
        if step.phase == Phase::BtfHidden && !hidden {
            hidden = true;
            writeln!(s, "cp /sys/kernel/btf/vmlinux {BTF_COPY}")?;
            writeln!(s, ": > {BTF_EMPTY}")?;
            writeln!(
                s,
                "mount --bind {BTF_EMPTY} /sys/kernel/btf/vmlinux && echo hidden > \
                 \"$OUT/btf-hidden\""
            )?;
        }
        let cmd: Vec<String> = match &step.run {
            Run::Agent(args) => std::iter::once(agent_bin.display().to_string())
                .chain(
                    args.iter()
                        .map(|a| a.replace("{foreign}", &foreign_btf.display().to_string())),
                )
                .collect(),
            Run::Test { binary, test } => {
                let bin = bins.get(binary).with_context(|| {
                    format!("no integration test binary `{binary}` (tests/tests/{binary}.rs)")
                })?;
                vec![
                    bin.display().to_string(),
                    "--exact".into(),
                    test.clone(),
                    "--test-threads=1".into(),
                    "--nocapture".into(),
                ]
            }
        };
        let quoted: Vec<String> = cmd.iter().map(|a| sh_quote(a)).collect();
        writeln!(s, "step {i} {}", quoted.join(" "))?;
    }
    writeln!(s, "echo done > \"$OUT/finished\"")?;
    Ok(s)
}

/// One line of `check`'s report.
#[derive(Debug, PartialEq)]
struct CheckLine<'a> {
    level: &'a str,
    what: &'a str,
    detail: &'a str,
}

fn check_lines(text: &str) -> Vec<CheckLine<'_>> {
    text.lines()
        .filter_map(|l| {
            let (level, rest) = l.split_once("  ")?;
            let level = level.trim();
            if !["ok", "warn", "FAIL"].contains(&level) {
                return None;
            }
            let rest = rest.trim_start();
            // `what` is padded to 38 columns; it has single spaces inside.
            let (what, detail) = match rest.find("  ") {
                Some(i) => (&rest[..i], rest[i..].trim()),
                None => (rest, ""),
            };
            Some(CheckLine {
                level,
                what: what.trim(),
                detail,
            })
        })
        .collect()
}

const SCHED_PROBES: [&str; 3] = [
    "probe sched:sched_switch",
    "probe sched:sched_wakeup",
    "probe sched:sched_wakeup_new",
];

/// Judges one step's output; `Err` says what is wrong.
pub(crate) fn judge(expect: Expect, rc: i32, text: &str) -> Result<()> {
    let lines = check_lines(text);
    let find = |what: &str| lines.iter().find(|l| l.what == what);
    let attached_as = |what: &str, kind: &str| -> Result<()> {
        let l = find(what).with_context(|| format!("no `{what}` line"))?;
        if l.level != "ok" || !l.detail.starts_with(&format!("attached as {kind}")) {
            bail!(
                "{what}: {} {} (wanted: attached as {kind})",
                l.level,
                l.detail
            );
        }
        Ok(())
    };
    match expect {
        Expect::TestPasses => {
            if rc != 0 {
                bail!("exit status {rc}");
            }
            if !text
                .lines()
                .any(|l| l.starts_with("test result: ok. 1 passed; 0 failed"))
            {
                bail!("the test did not run (no \"test result: ok. 1 passed\")");
            }
        }
        Expect::CheckAllTpBtf => {
            if rc != 0 {
                bail!("check exited {rc}");
            }
            if let Some(l) = lines.iter().find(|l| l.level != "ok") {
                bail!("{} {}: {}", l.level, l.what, l.detail);
            }
            for p in SCHED_PROBES
                .iter()
                .chain(&["probe sched:sched_waking", "probe lock:contention_end"])
            {
                attached_as(p, "tp_btf")?;
            }
            if !lines
                .iter()
                .any(|l| l.what == "diagnosis" && l.level == "ok")
            {
                bail!("no `ok diagnosis` line");
            }
        }
        Expect::CheckClassicWithoutBtf => {
            if rc != 0 {
                bail!("check exited {rc}");
            }
            if let Some(l) = lines.iter().find(|l| l.level == "FAIL") {
                bail!("FAIL {}: {}", l.what, l.detail);
            }
            let btf = find("BTF").context("no BTF line")?;
            if btf.level != "warn" {
                bail!(
                    "BTF line: {} {} (wanted warn: it is hidden)",
                    btf.level,
                    btf.detail
                );
            }
            for p in SCHED_PROBES.iter().chain(&[
                "probe syscalls:sys_enter_futex",
                "probe syscalls:sys_exit_futex",
                "probe lock:contention_end",
            ]) {
                attached_as(p, "tracepoint")?;
            }
            let lost: Vec<&str> = lines
                .iter()
                .filter(|l| l.what == "lost")
                .map(|l| l.detail)
                .collect();
            for wanted in ["prev_state", "local or remote", "mtu_mismatch"] {
                if !lost.iter().any(|l| l.contains(wanted)) {
                    bail!("no `lost` line about {wanted:?}: {lost:?}");
                }
            }
        }
        Expect::CheckRefusesBtf(why) => {
            if rc != 1 {
                bail!("check exited {rc}, not 1");
            }
            let btf = find("BTF").context("no BTF line")?;
            if btf.level != "FAIL" || !btf.detail.contains(why) {
                bail!(
                    "BTF line: {} {} (wanted FAIL …{why}…)",
                    btf.level,
                    btf.detail
                );
            }
        }
    }
    Ok(())
}

/// What became of one step.
#[derive(Debug)]
pub struct Outcome {
    pub step: String,
    pub seconds: Option<f64>,
    pub verdict: Result<(), String>,
    pub output_tail: String,
}

/// What one guest did.
pub struct GuestReport {
    pub kernel: Kernel,
    pub uname: String,
    pub boot_to_end: Duration,
    pub outcomes: Vec<Outcome>,
    /// Facts about the guest that every step relies on (only cgroup v2; the CPUs).
    pub setup_errors: Vec<String>,
}

impl GuestReport {
    pub fn failed(&self) -> bool {
        !self.setup_errors.is_empty() || self.outcomes.iter().any(|o| o.verdict.is_err())
    }
}

/// A guest's size and how long it may run.
#[derive(Clone, Copy, Debug)]
pub struct Guest {
    pub cpus: u32,
    /// QEMU's `-m` (`2G`).
    pub memory: &'static str,
    pub timeout: Duration,
    /// All vCPUs emulated by one host thread (`-accel tcg,thread=single`) instead of one
    /// thread each. With a thread each, Debian's 6.12 panicked in most boots on 2026-11-26
    /// ("Oops: int3" in `ttwu_do_activate`, four boots in five): the kernel patches its
    /// tracepoints' jump sites with a breakpoint while they are enabled or disabled (our probes
    /// attaching and detaching), and, as we read it, another vCPU still ran the breakpoint
    /// after the patch was done: code modified across host threads, which the emulator did not
    /// keep coherent; 6.1 hung so in three boots of four later that day. One thread runs the
    /// vCPUs in turn, each seeing a patch whole. Slower: the matrix's guests, not the big node.
    pub one_host_thread: bool,
}

impl Guest {
    /// Boots `kernel` (`vng --disable-kvm`: software emulation; only cgroup v2) and runs the
    /// shell script `script` in it, `out` writable there; the console into `work`/console.log.
    /// Returns vng's exit status and the time from boot to the guest's end.
    pub fn boot(
        &self,
        kernel: &Kernel,
        work: &Path,
        out: &Path,
        script: &Path,
        what: &str,
    ) -> Result<(std::process::ExitStatus, Duration)> {
        let console = work.join("console.log");
        say(&format!(
            "booting {} ({}) under emulation, {} vCPUs and {} of memory: {what}; console in {}",
            kernel.package,
            kernel.version,
            self.cpus,
            self.memory,
            console.display()
        ));
        let started = Instant::now();
        // vng hands its stdout and stderr to QEMU, which truncates a file: both into one pipe
        // (`2>&1`), read here.
        let mut child = Command::new("sh")
            .args(["-c", "exec \"$@\" 2>&1", "sh", "timeout"])
            .args(["-k", "30", &self.timeout.as_secs().to_string(), "vng"])
            .arg("--disable-kvm")
            // The kernel's messages on the console: a guest that dies says why.
            .arg("--verbose")
            .arg("-r")
            .arg(&kernel.vmlinuz)
            .args(["--cpus", &self.cpus.to_string(), "--memory", self.memory])
            .args(["--append", "cgroup_no_v1=all"])
            .args(
                self.one_host_thread
                    .then_some("--qemu-opts=-accel tcg,thread=single"),
            )
            .arg(format!("--rwdir={}", out.display()))
            .arg("--exec")
            .arg(format!("sh {}", script.display()))
            .current_dir(work)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start vng (virtme-ng)")?;
        let mut log = std::fs::File::create(&console)?;
        if let Some(stdout) = child.stdout.take() {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = writeln!(log, "{line}");
            }
        }
        Ok((child.wait()?, started.elapsed()))
    }
}

/// What is wrong with a guest that every step relies on: it ended before its script's last
/// line (`out`/finished), or it had more than cgroup v2 (`out`/mountinfo).
pub fn guest_setup_errors(
    out: &Path,
    status: &std::process::ExitStatus,
    console: &Path,
) -> Vec<String> {
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_default();
    let mut errors = Vec::new();
    if read("finished").trim() != "done" {
        errors.push(format!(
            "the guest ended before its last step (vng: {status}); see {}",
            console.display()
        ));
    }
    let mountinfo = read("mountinfo");
    let v1: Vec<&str> = mountinfo
        .lines()
        .filter(|l| {
            l.split(" - ")
                .nth(1)
                .is_some_and(|t| t.starts_with("cgroup "))
        })
        .collect();
    if !mountinfo.contains(" - cgroup2 ") || !v1.is_empty() {
        errors.push(format!(
            "the guest should have cgroup v2 only: v1 mounts {v1:?}, cgroup2 mounted: {}",
            mountinfo.contains(" - cgroup2 ")
        ));
    }
    errors
}

/// Boots `kernel` and runs `steps` in it; judges them once the guest is gone.
pub fn run_guest(
    kernel: &Kernel,
    steps: &[Step],
    agent_bin: &Path,
    bins: &HashMap<String, PathBuf>,
) -> Result<GuestReport> {
    let work = kernels_dir().join("runs").join(&kernel.package);
    let out = work.join("out");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&out)?;
    let foreign = kernels_dir().join("foreign.btf");
    std::fs::copy("/sys/kernel/btf/vmlinux", &foreign)
        .context("copying the host's BTF (another kernel's) for the guests")?;
    let script_path = work.join("guest.sh");
    std::fs::write(
        &script_path,
        script(steps, agent_bin, bins, &foreign, &out)?,
    )?;
    let guest = Guest {
        cpus: 2,
        memory: "2G",
        timeout: GUEST_TIMEOUT,
        // Both kernels: 6.1 hung in three boots of four on 2026-11-26 (each time while a
        // test's probes attached: the same cross-thread code patching, we read, that made
        // 6.12 panic), though one thread is slow enough to thin some tests' premises.
        one_host_thread: true,
    };
    let (status, boot_to_end) = guest.boot(
        kernel,
        &work,
        &out,
        &script_path,
        &format!("{} step(s)", steps.len()),
    )?;
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_default();
    let mut setup_errors = guest_setup_errors(&out, &status, &work.join("console.log"));
    if steps.iter().any(|s| s.phase == Phase::BtfHidden) && read("btf-hidden").trim() != "hidden" {
        setup_errors.push("the kernel's BTF could not be hidden in the guest".to_owned());
    }
    let outcomes = steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let text = read(&format!("{i}.out"));
            let rc = read(&format!("{i}.rc")).trim().parse::<i32>().ok();
            let time = |n: &str| read(&format!("{i}.{n}")).trim().parse::<f64>().ok();
            let seconds = time("end").zip(time("start")).map(|(e, s)| e - s);
            let verdict = match rc {
                None => Err("did not run".to_owned()),
                Some(124 | 137) => Err(format!("killed after {STEP_TIMEOUT_SECONDS} s")),
                Some(rc) => judge(step.expect, rc, &text).map_err(|e| format!("{e:#}")),
            };
            let tail: Vec<&str> = text.lines().rev().take(25).collect();
            Outcome {
                step: step.name.clone(),
                seconds,
                verdict,
                output_tail: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
            }
        })
        .collect();
    Ok(GuestReport {
        kernel: kernel.clone(),
        uname: read("uname").trim().to_owned(),
        boot_to_end,
        outcomes,
        setup_errors,
    })
}

/// The reports as a table, and the failures with their output's tail.
pub fn summary(reports: &[GuestReport]) -> String {
    let mut s = String::new();
    for r in reports {
        let _ = writeln!(
            s,
            "{} LTS: {} ({}, uname {}): {:.0} s from boot to the end, under emulation",
            r.kernel.series,
            r.kernel.package,
            r.kernel.version,
            if r.uname.is_empty() { "?" } else { &r.uname },
            r.boot_to_end.as_secs_f64()
        );
        for e in &r.setup_errors {
            let _ = writeln!(s, "  FAIL  {e}");
        }
        for o in &r.outcomes {
            let secs = o
                .seconds
                .map_or_else(|| "    -".to_owned(), |t| format!("{t:5.1}"));
            match &o.verdict {
                Ok(()) => {
                    let _ = writeln!(s, "  ok    {secs} s  {}", o.step);
                }
                Err(why) => {
                    let _ = writeln!(s, "  FAIL  {secs} s  {}: {why}", o.step);
                }
            }
        }
    }
    for r in reports {
        for o in r.outcomes.iter().filter(|o| o.verdict.is_err()) {
            let _ = writeln!(
                s,
                "\n--- {} on {}: the end of its output ---\n{}",
                o.step, r.kernel.package, o.output_tail
            );
        }
    }
    s
}

/// The matrix: every kernel, every step; fails when any step fails on any kernel.
pub fn matrix(agent_bin: &Path) -> Result<()> {
    let kernels = fetch_all()?;
    let bins = test_binaries()?;
    let steps = matrix_steps();
    let started = Instant::now();
    let mut reports = Vec::new();
    for k in &kernels {
        let report = run_guest(k, &steps, agent_bin, &bins)?;
        // A guest that died before its last step (seen once on 6.12 under emulation, with
        // nothing on its console) is booted once more and judged on that run; both are shown.
        // A kernel our probes crash dies twice and fails.
        let died = report
            .setup_errors
            .iter()
            .any(|e| e.starts_with("the guest ended before its last step"));
        if died {
            println!("{}", summary(std::slice::from_ref(&report)));
            say(&format!(
                "{}: the guest died before its last step; booting it once more",
                k.package
            ));
            reports.push(run_guest(k, &steps, agent_bin, &bins)?);
        } else {
            reports.push(report);
        }
    }
    let text = summary(&reports);
    println!("{text}");
    say(&format!(
        "kernel matrix: {} kernel(s) in {:.0} s",
        kernels.len(),
        started.elapsed().as_secs_f64()
    ));
    let failed: Vec<&str> = reports
        .iter()
        .filter(|r| r.failed())
        .map(|r| r.kernel.package.as_str())
        .collect();
    if !failed.is_empty() {
        bail!("the kernel matrix failed on {}", failed.join(", "));
    }
    Ok(())
}

/// `xtask guest`: named integration tests (`binary::test`) in one kernel's guest, after
/// `check`, with the kernel's BTF or without.
pub fn named(
    agent_bin: &Path,
    series: &'static str,
    tests: &[String],
    hide_btf: bool,
) -> Result<()> {
    let kernel = fetch(series)?;
    let bins = test_binaries()?;
    let phase = if hide_btf {
        Phase::BtfHidden
    } else {
        Phase::Btf
    };
    let mut steps = vec![agent(
        "check",
        phase,
        &["check"],
        if hide_btf {
            Expect::CheckClassicWithoutBtf
        } else {
            Expect::CheckAllTpBtf
        },
    )];
    for t in tests {
        let (binary, name) = t
            .split_once("::")
            .with_context(|| format!("`{t}`: give tests as <binary>::<test name>"))?;
        steps.push(test(phase, binary, name));
    }
    let report = run_guest(&kernel, &steps, agent_bin, &bins)?;
    println!("{}", summary(std::slice::from_ref(&report)));
    if report.failed() {
        bail!("a step failed in the guest of {}", kernel.package);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_images_of_the_series() {
        let amd64 = |series, name| is_plain_image(series, "amd64", name);
        assert!(amd64("6.1", "linux-image-6.1.0-50-amd64"));
        assert!(amd64("6.12", "linux-image-6.12.117+deb12-amd64"));
        assert!(!amd64("6.1", "linux-image-6.12.117+deb12-amd64"));
        assert!(!amd64("6.1", "linux-image-6.1.0-50-cloud-amd64"));
        assert!(!amd64("6.1", "linux-image-6.1.0-50-rt-amd64"));
        assert!(!amd64("6.1", "linux-image-6.1.0-50-amd64-dbg"));
        assert!(!amd64("6.12", "linux-image-6.12.117+deb12-amd64-unsigned"));
        assert!(!amd64("6.1", "linux-image-amd64"));
        assert!(!amd64("6.12", "linux-image-6.12.117+deb12-arm64"));
        let arm64 = |series, name| is_plain_image(series, "arm64", name);
        assert!(arm64("6.12", "linux-image-6.12.117+deb12-arm64"));
        assert!(arm64("6.1", "linux-image-6.1.0-50-arm64"));
        assert!(!arm64("6.12", "linux-image-6.12.117+deb12-arm64-16k"));
        assert!(!arm64("6.12", "linux-image-6.12.117+deb12-cloud-arm64"));
        assert!(!arm64("6.12", "linux-image-6.12.117+deb12-amd64"));
    }

    #[test]
    fn candidates_from_apt_cache_policy() {
        let text = "linux-image-6.1.0-48-amd64:\n  Installed: (none)\n  Candidate: 6.1.170-1\n  \
                    Version table:\n     6.1.170-1 500\nlinux-image-6.1.0-50-amd64:\n  \
                    Installed: (none)\n  Candidate: 6.1.176-1\n  Version table:\n     \
                    6.1.176-1 500\n        500 http://deb.debian.org/debian bookworm/main amd64 \
                    Packages\nlinux-image-6.1.0-9-amd64:\n  Installed: (none)\n  Candidate: \
                    (none)\nlinux-image-6.12.117+deb12-arm64:arm64:\n  Installed: (none)\n  \
                    Candidate: 6.12.117-1~deb12u1\n";
        assert_eq!(
            parse_policy(text),
            [
                ("linux-image-6.1.0-48-amd64".into(), "6.1.170-1".into()),
                ("linux-image-6.1.0-50-amd64".into(), "6.1.176-1".into()),
                (
                    "linux-image-6.12.117+deb12-arm64".into(),
                    "6.12.117-1~deb12u1".into()
                )
            ]
        );
    }

    const CHECK_OK: &str = "\
ok    kernel                                 6.1.0-50-amd64
ok    BTF                                    /sys/kernel/btf/vmlinux (100642 types)
ok    probe sched:sched_switch               attached as tp_btf
ok    probe sched:sched_wakeup               attached as tp_btf
ok    probe sched:sched_wakeup_new           attached as tp_btf
ok    probe sched:sched_waking               attached as tp_btf
ok    probe syscalls:sys_enter_futex         attached as tracepoint
ok    probe lock:contention_end              attached as tp_btf
ok    diagnosis                              every figure and every rule has its probes
verdict: stormwatch can run here with every probe
";

    #[test]
    fn check_reports_are_judged_line_by_line() {
        let lines = check_lines(CHECK_OK);
        assert_eq!(
            lines[2],
            CheckLine {
                level: "ok",
                what: "probe sched:sched_switch",
                detail: "attached as tp_btf"
            }
        );
        judge(Expect::CheckAllTpBtf, 0, CHECK_OK).unwrap();
        assert!(judge(Expect::CheckAllTpBtf, 1, CHECK_OK).is_err());
        let classic = CHECK_OK.replace(
            "sched:sched_wakeup               attached as tp_btf",
            "sched:sched_wakeup               attached as tracepoint (as sched_switch: …)",
        );
        let e = judge(Expect::CheckAllTpBtf, 0, &classic).unwrap_err();
        assert!(format!("{e}").contains("sched_wakeup"), "{e}");
        let refused = "FAIL  BTF                                    /tmp/empty.btf: not a BTF \
                       blob: truncated header\nFAIL  probes                                 not \
                       loaded\n";
        judge(Expect::CheckRefusesBtf("not a BTF blob"), 1, refused).unwrap();
        assert!(judge(Expect::CheckRefusesBtf("not a BTF blob"), 0, refused).is_err());
        assert!(judge(Expect::CheckRefusesBtf("is not the running"), 1, refused).is_err());
    }

    #[test]
    fn a_test_that_ran_nothing_fails() {
        let none = "running 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 \
                    measured; 9 filtered out; finished in 0.00s\n";
        assert!(judge(Expect::TestPasses, 0, none).is_err());
        let one = "running 1 test\ntest x ... ok\n\ntest result: ok. 1 passed; 0 failed; 0 \
                   ignored; 0 measured; 8 filtered out; finished in 9.1s\n";
        judge(Expect::TestPasses, 0, one).unwrap();
        assert!(judge(Expect::TestPasses, 101, one).is_err());
    }

    #[test]
    fn the_script_runs_each_step_and_hides_btf_once() {
        let bins = HashMap::from([("sched_accuracy".to_owned(), PathBuf::from("/t/sched"))]);
        let steps = vec![
            agent("check", Phase::Btf, &["check"], Expect::CheckAllTpBtf),
            agent(
                "foreign",
                Phase::BtfHidden,
                &["check", "--btf", "{foreign}"],
                Expect::CheckRefusesBtf("x"),
            ),
            test(Phase::BtfHidden, "sched_accuracy", "a_test"),
        ];
        let s = script(
            &steps,
            Path::new("/b/stormwatch"),
            &bins,
            Path::new("/k/foreign.btf"),
            Path::new("/o"),
        )
        .unwrap();
        assert_eq!(s.matches("mount --bind").count(), 1, "{s}");
        assert!(s.find("step 0").unwrap() < s.find("mount --bind").unwrap());
        assert!(
            s.contains("step 1 '/b/stormwatch' 'check' '--btf' '/k/foreign.btf'"),
            "{s}"
        );
        assert!(s.contains("step 2 '/t/sched' '--exact' 'a_test'"), "{s}");
        assert!(s.find("export STORMWATCH_TEST_EMULATED=1").unwrap() < s.find("step 0").unwrap());
        let missing = vec![test(Phase::Btf, "nope", "x")];
        assert!(
            script(
                &missing,
                Path::new("/b"),
                &bins,
                Path::new("/f"),
                Path::new("/o")
            )
            .is_err()
        );
    }
}
