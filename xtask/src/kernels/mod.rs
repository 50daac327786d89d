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
//!
//! Here: the entry points ([`matrix()`], [`named`]) and one guest's run from start to report
//! ([`run_guest`]). The rest by job: [`fetch`](mod@fetch) the kernels, [`matrix`](mod@matrix)
//! the steps, [`guest`] the script the guest runs and its boot, [`judge`](mod@judge) the results.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{cargo, say};

mod fetch;
mod guest;
mod judge;
mod matrix;

pub use fetch::{Kernel, SERIES, download_deb, fetch, fetch_all, fetch_arch, kernels_dir};
use guest::script;
pub use guest::{Guest, sh_quote};
pub(crate) use judge::judge;
pub use judge::{Expect, GuestReport, guest_setup_errors, summary};
use matrix::agent;
pub use matrix::{Phase, Run, Step, matrix_steps, test};

/// How long one guest may run in all.
const GUEST_TIMEOUT: Duration = Duration::from_secs(25 * 60);

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

/// Boots `kernel` and runs `steps` in it; judges them once the guest is gone.
/// The tests that run the corpus's Go programs (tests/corpus/{gomutex,httpserver,httpload}).
fn runs_go(step: &Step) -> bool {
    match &step.run {
        Run::Test { binary, test } => {
            ["gocpu", "goclock", "callsites", "soak"].contains(&binary.as_str())
                || (binary == "corpus" && test.starts_with("go-"))
        }
        Run::Agent(_) => false,
    }
}

/// Builds the corpus's Go programs on the host into `dir` when a step runs them: the guest sees
/// the host's files read-only and runs on emulated CPUs, where `go build` cannot write its cache
/// and would take minutes. The tests find them through `STORMWATCH_TEST_GO_PROGRAMS`.
fn go_programs_for(steps: &[Step], dir: &Path) -> Result<Option<PathBuf>> {
    if !steps.iter().any(runs_go) {
        return Ok(None);
    }
    std::fs::create_dir_all(dir)?;
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/corpus")
        .canonicalize()
        .context("tests/corpus")?;
    // The one list of them, and how they are built: the tests' script.
    let status = Command::new("sh")
        .arg(source.join("build-go.sh"))
        .arg(dir)
        .status()
        .context("running tests/corpus/build-go.sh (the Go toolchain on PATH)")?;
    if !status.success() {
        bail!(
            "tests/corpus/build-go.sh {} failed: {status}",
            dir.display()
        );
    }
    say(&format!(
        "the corpus's Go programs: built for the guest in {}",
        dir.display()
    ));
    Ok(Some(dir.to_owned()))
}

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
    // Each guest its own copy: the kernels' guests run at once (see `matrix`).
    let foreign = work.join("foreign.btf");
    std::fs::copy("/sys/kernel/btf/vmlinux", &foreign)
        .context("copying the host's BTF (another kernel's) for the guests")?;
    let go_programs = go_programs_for(steps, &work.join("go"))?;
    let script_path = work.join("guest.sh");
    std::fs::write(
        &script_path,
        script(
            steps,
            agent_bin,
            bins,
            &foreign,
            go_programs.as_deref(),
            &out,
        )?,
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
    Ok(judge::report(
        kernel,
        steps,
        &out,
        &status,
        &work.join("console.log"),
        boot_to_end,
    ))
}

/// The matrix: every kernel, every step; fails when any step fails on any kernel.
pub fn matrix(agent_bin: &Path) -> Result<()> {
    let kernels = fetch_all()?;
    let bins = test_binaries()?;
    let steps = matrix_steps();
    let started = Instant::now();
    // The kernels' guests at once: each runs its vCPUs on one host thread (see `run_guest`),
    // so two of them use this 2-vCPU machine's CPUs as one alone leaves one idle, and the
    // matrix takes the time of its slower kernel rather than of both (it was ~11 of CI's 90
    // minutes).
    let reports = std::thread::scope(|scope| {
        let runs: Vec<_> = kernels
            .iter()
            .map(|k| scope.spawn(|| run_kernel(k, &steps, agent_bin, &bins)))
            .collect();
        runs.into_iter()
            .map(|r| r.join().expect("a kernel's guest thread panicked"))
            .collect::<Result<Vec<_>>>()
    })?;
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

/// One kernel's guest, booted once more if it died before its last step (seen once on 6.12
/// under emulation, with nothing on its console): the first run's summary printed, the second
/// judged. A kernel our probes crash dies twice and fails.
fn run_kernel(
    k: &Kernel,
    steps: &[Step],
    agent_bin: &Path,
    bins: &HashMap<String, PathBuf>,
) -> Result<GuestReport> {
    let report = run_guest(k, steps, agent_bin, bins)?;
    let died = report
        .setup_errors
        .iter()
        .any(|e| e.starts_with("the guest ended before its last step"));
    if !died {
        return Ok(report);
    }
    println!("{}", summary(std::slice::from_ref(&report)));
    say(&format!(
        "{}: the guest died before its last step; booting it once more",
        k.package
    ));
    run_guest(k, steps, agent_bin, bins)
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
