//! Project tasks: `cargo +stable xtask <task>` works on a fresh machine, before the pinned
//! toolchain exists; every task first installs whatever is missing (idempotently, saying what it
//! does), then runs.
//!
//! Child cargo processes are started through the rustup proxy with `RUSTUP_TOOLCHAIN` removed,
//! so that `rust-toolchain.toml` (the pinned nightly) applies to them even when xtask itself was
//! started with `+stable`.

mod arm64;
mod bare;
mod bench;
mod bench_common;
mod bench_daemon;
mod bench_ordinary;
mod bench_pglock;
mod bench_programs;
mod big_node;
mod cross;
mod imports;
mod kernels;
mod manifests;
mod setup;

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "stormwatch project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what is missing: the pinned toolchain, LLVM 22, bpf-linker, the test tools, the
    /// cross builds' compilers and C libraries, the kernels of the kernel matrix.
    Setup,
    /// Install what building needs, then build the release binary: for this host, or with
    /// `--target aarch64-unknown-linux-gnu` for arm64 (a cross linker from Debian, and the
    /// standard library built from rust-src: the pinned nightly has no arm64 rust-std).
    Build {
        /// A target triple other than the host's.
        #[arg(long, value_parser = cross::TARGETS.map(|t| t.triple))]
        target: Option<String>,
    },
    /// Install what building needs (not the test tools), build the release binary, and
    /// diagnose this host.
    Diagnose {
        /// Seconds to watch.
        #[arg(long, default_value = "10")]
        duration: u32,
    },
    /// Set up, then run every test: the import graph, formatting, clippy, the docs, unit tests,
    /// the arm64 build, the install lists proven on a bare system (`bare-check`), the
    /// integration tests, then the kernel matrix (Debian's 6.1 and 6.12 in guests) and the
    /// arm64 agent's `check` in arm64 guests.
    Test,
    /// Prove the install lists on a bare system: a pristine Debian root under `target/bare/`,
    /// made afresh, with only what a fresh machine has, in which the README's commands run
    /// (`diagnose --duration 2`, the arm64 build) and the tests' Debian packages install
    /// (xtask/src/bare.rs). `xtask test` runs it too; ~13 min on 2 busy CPUs.
    BareCheck,
    /// Print the agent's and xtask's module import graphs; fail on a circle (`xtask test`
    /// checks it too).
    Imports,
    /// Set up, then run the kernel matrix: Debian's 6.1 and 6.12 LTS kernels in guests.
    KernelMatrix,
    /// Set up, then boot one kernel of the matrix in a guest (only cgroup v2, under emulation)
    /// and run `stormwatch check` and the named integration tests in it.
    Guest {
        /// The kernel series: 6.1 or 6.12 (the newest image of it in the package index).
        #[arg(long, value_parser = ["6.1", "6.12"])]
        kernel: String,
        /// A test to run, as `BINARY::NAME` (the test NAME of tests/tests/BINARY.rs); repeatable.
        #[arg(long = "test", value_name = "BINARY::NAME")]
        tests: Vec<String>,
        /// Hide the kernel's BTF (an empty file over /sys/kernel/btf/vmlinux) first.
        #[arg(long)]
        hide_btf: bool,
    },
    /// Set up, build the arm64 agent, then boot Debian's arm64 kernel in an arm64 guest (QEMU,
    /// software emulation, a busybox initramfs) and run the agent's `check` in it.
    Arm64Check {
        /// The kernel series: 6.1 or 6.12 (the newest arm64 image of it in the package index);
        /// given twice, both guests boot at once, as `xtask test` boots them.
        #[arg(long, value_parser = ["6.1", "6.12"], default_value = "6.12")]
        kernel: Vec<String>,
        /// An arm64 agent already built (`xtask build --target aarch64-unknown-linux-gnu`, or
        /// the bare root's of `xtask test`) to check instead of building one.
        #[arg(long, value_name = "PATH")]
        agent: Option<PathBuf>,
    },
    /// Set up, then measure the daemon's memory on a node with many CPUs: a guest with that
    /// many vCPUs (emulated) runs `stormwatch run` with the ConfigMap's config and N live
    /// cgroups, and its RSS, the memory charged to its cgroup and each BPF map's `memlock` are
    /// printed beside the pod's memory sizing formula (deploy/README.md), mismatches flagged.
    /// A benchmark, not a test; slow (a 96-vCPU guest takes ~10 min to boot on 2 CPUs).
    BigNode {
        /// The guest's vCPUs (its possible CPUs, which the per-CPU maps are allocated for).
        #[arg(long, default_value = "96")]
        cpus: u32,
        /// Live cgroups, a sleeper in each.
        #[arg(long, default_value = "1000")]
        cgroups: u32,
        /// The guest's memory (QEMU's -m).
        #[arg(long, default_value = "4G")]
        memory: String,
        /// Seconds per measured phase (without scrapes, then with).
        #[arg(long, default_value = "30")]
        seconds: u32,
        /// The kernel series: 6.1 or 6.12.
        #[arg(long, default_value = "6.12", value_parser = ["6.1", "6.12"])]
        kernel: String,
        /// No guest: judge the output of the last guest with as many vCPUs again (after a
        /// change of the formula).
        #[arg(long)]
        again: bool,
        /// The futex probes always attached (not on demand) and every sleeper in FUTEX_WAIT:
        /// `CGROUP_FUTEX` with every cgroup in it, as in a storm on a busy node.
        #[arg(long)]
        futex: bool,
    },
    /// Regenerate the deploy/ files made from others (the PrometheusRule from
    /// deploy/rules.yaml); the tests fail while they are stale.
    Manifests,
    /// Set up, then run the lock-storm corpus repeatedly: how often each case gets its verdict
    /// (a benchmark of stability, not part of the tests; prints the table of agent/DIAGNOSIS.md).
    Corpus {
        /// Runs per case.
        #[arg(long, default_value = "10")]
        repeat: u32,
        /// Run each case beside a `stress-ng --cpu 1`.
        #[arg(long)]
        noise: bool,
        /// Also ask `stormwatch run` for its verdict on each run (about 35 s more per run):
        /// a column says in how many it agreed with `diagnose`.
        #[arg(long)]
        run: bool,
        /// Only these cases (by name; repeatable).
        #[arg(long = "case")]
        cases: Vec<String>,
    },
    /// Set up, then measure the probes' overhead (not part of the tests).
    Bench {
        /// Interleaved rounds per configuration.
        #[arg(long, default_value = "5")]
        rounds: u32,
        /// Seconds per measurement.
        #[arg(long, default_value = "10")]
        seconds: u32,
        /// Only the daemon's cost at 250 / 500 / 1,000 / 2,000 / 4,000 live cgroups, and per
        /// cgroup (no probe benchmarks).
        #[arg(long)]
        daemon_only: bool,
        /// The live cgroups of the daemon's cost, comma-separated (with `--daemon-only`, or in
        /// the full bench), e.g. `--daemon-cgroups 50,100` for a short smoke run.
        #[arg(long, value_delimiter = ',', default_values_t = bench_daemon::SIZES)]
        daemon_cgroups: Vec<usize>,
        /// Only the realistic workload: a lock storm's throughput with and without
        /// `stormwatch run`.
        #[arg(long, conflicts_with = "daemon_only")]
        lock_storm_only: bool,
        /// Only the kernel-lock storm (`stress-ng --flock 4`): its throughput with no tracer,
        /// the empty programs on the contention tracepoints, the lock probes and the daemon.
        #[arg(long, conflicts_with_all = ["daemon_only", "lock_storm_only"])]
        kernel_lock_storm_only: bool,
        /// Only the Go mutex storm: its throughput with the daemon, the futex tier with and
        /// without call sites (with them, Go's sync.Mutex uprobes in bursts).
        #[arg(long, conflicts_with_all = ["daemon_only", "lock_storm_only"])]
        go_mutex_only: bool,
        /// Only PostgreSQL's storm on one row: its throughput with no tracer and with the
        /// daemon with and without the lock-wait uprobes (`postgres_lock_waits`).
        #[arg(long, conflicts_with_all = ["daemon_only", "lock_storm_only", "go_mutex_only"])]
        pg_lock_only: bool,
        /// Only the futex stressor's table (futex and lock probes against bpftrace).
        #[arg(long, conflicts_with_all = ["daemon_only", "lock_storm_only"])]
        futex_only: bool,
        /// Only the switch storm's table (the floor, the scheduler probes, all probes, the
        /// daemon, bpftrace).
        #[arg(long, conflicts_with_all = ["daemon_only", "lock_storm_only", "futex_only"])]
        sched_only: bool,
        /// Only what each BPF program costs per run (the kernel's run-time statistics) under
        /// the switch storm, the futex stressor, UDP over loopback and a kernel-lock storm,
        /// stormwatch's against the empty program on the same hook (the floor) and bpftrace;
        /// `--programs net` (or `sched`, `futex`, `locks`, comma-separated) runs only those
        /// workloads.
        #[arg(
            long,
            num_args = 0..,
            value_delimiter = ',',
            conflicts_with_all = ["daemon_only", "lock_storm_only", "futex_only", "sched_only"]
        )]
        programs: Option<Vec<bench_programs::Workload>>,
        /// Runs per tracer of the per-program table (`--programs`, and the full bench).
        #[arg(long, default_value = "3")]
        repeats: u32,
        /// Only the ordinary workloads (Redis SET/GET, one system call, HTTP at a fixed rate)
        /// with `stormwatch run` as deployed against none, nothing storming.
        #[arg(long, conflicts_with_all = ["daemon_only", "lock_storm_only", "futex_only", "sched_only", "programs"])]
        ordinary: bool,
    },
}

fn main() -> ExitCode {
    STARTED.get_or_init(std::time::Instant::now);
    let cli = Cli::parse();
    let result = match cli.task {
        Task::Setup => setup::tests()
            .and_then(|()| cross::packages())
            .and_then(|()| kernels::fetch_all().map(drop)),
        Task::Build { target } => setup::build().and_then(|()| match target {
            None => build_release().map(|bin| println!("{}", bin.display())),
            Some(t) => cross::build(cross::target(&t).expect("clap allows only known targets"))
                .map(|bin| println!("{}", bin.display())),
        }),
        Task::Diagnose { duration } => setup::build().and_then(|()| diagnose(duration)),
        Task::Test => setup::tests()
            .and_then(|()| kernels::fetch_all().map(drop))
            .and_then(|()| test()),
        Task::KernelMatrix => setup::tests()
            .and_then(|()| kernels::fetch_all().map(drop))
            .and_then(|()| build_release())
            .and_then(|bin| kernels::matrix(&bin)),
        Task::Guest {
            kernel,
            tests,
            hide_btf,
        } => setup::tests().and_then(|()| {
            let series = kernels::SERIES
                .into_iter()
                .find(|s| *s == kernel)
                .expect("clap allows only the matrix's series");
            build_release().and_then(|bin| kernels::named(&bin, series, &tests, hide_btf))
        }),
        Task::Arm64Check { kernel, agent } => arm64_check(&kernel, agent),
        Task::BigNode {
            cpus,
            cgroups,
            memory,
            seconds,
            kernel,
            again,
            futex,
        } => setup::tests().and_then(|()| {
            let series = kernels::SERIES
                .into_iter()
                .find(|s| *s == kernel)
                .expect("clap allows only the matrix's series");
            let options = big_node::Options {
                cpus,
                memory: memory.leak(),
                cgroups,
                seconds,
                futex,
                again,
            };
            big_node::run(series, options)
        }),
        Task::BareCheck => bare::check().map(drop),
        Task::Manifests => manifests::run(),
        Task::Imports => imports::run(true),
        Task::Corpus {
            repeat,
            noise,
            run,
            cases,
        } => setup::tests().and_then(|()| corpus(repeat, noise, run, &cases)),
        Task::Bench {
            rounds,
            seconds,
            daemon_only,
            lock_storm_only,
            kernel_lock_storm_only,
            go_mutex_only,
            pg_lock_only,
            futex_only,
            sched_only,
            programs,
            repeats,
            ordinary,
            daemon_cgroups,
        } => setup::tests().and_then(|()| {
            if ordinary {
                bench_ordinary::run(rounds, seconds).map(|table| println!("{table}"))
            } else if let Some(workloads) = programs {
                build_release()
                    .and_then(|bin| bench_programs::run(&bin, seconds, repeats, &workloads))
                    .map(|table| println!("{table}"))
            } else if daemon_only {
                bench_daemon::run(&daemon_cgroups).map(|table| println!("{table}"))
            } else if lock_storm_only {
                build_release()
                    .and_then(|bin| bench::lock_storm(&bin, rounds, seconds))
                    .map(|table| println!("{table}"))
            } else if kernel_lock_storm_only {
                build_release()
                    .and_then(|bin| bench::kernel_lock_storm(&bin, rounds, seconds))
                    .map(|table| println!("{table}"))
            } else if go_mutex_only {
                build_release()
                    .and_then(|bin| bench::go_mutex_storm(&bin, rounds, seconds))
                    .map(|table| println!("{table}"))
            } else if pg_lock_only {
                build_release()
                    .and_then(|bin| bench_pglock::run(&bin, rounds, seconds))
                    .map(|table| println!("{table}"))
            } else if futex_only {
                build_release()
                    .and_then(|bin| bench::futex(&bin, rounds, seconds))
                    .map(|table| println!("{table}"))
            } else if sched_only {
                build_release()
                    .and_then(|bin| bench::sched(&bin, rounds, seconds))
                    .map(|table| println!("{table}"))
            } else {
                bench::run(rounds, seconds, repeats, &daemon_cgroups)
            }
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root (xtask's parent directory).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// `cargo` through the rustup proxy, in the workspace, on the pinned toolchain.
pub fn cargo() -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root());
    for var in [
        "RUSTUP_TOOLCHAIN",
        "RUSTC",
        "RUSTDOC",
        "CARGO",
        "RUSTC_WRAPPER",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

pub fn run_cmd(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {shown}"))?;
    if !status.success() {
        bail!("{shown} failed: {status}");
    }
    Ok(())
}

/// Prints one line of what xtask does, with the seconds since it started (CI has a time budget:
/// the lines say where it goes).
pub fn say(msg: &str) {
    let since = STARTED.get_or_init(std::time::Instant::now).elapsed();
    eprintln!("xtask: [{:>5} s] {msg}", since.as_secs());
}

/// When xtask started (its first line).
static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

fn build_release() -> Result<PathBuf> {
    say("building stormwatch (release)");
    run_cmd(cargo().args(["build", "--release", "--package", "stormwatch"]))?;
    Ok(root().join("target/release/stormwatch"))
}

/// `xtask arm64-check`: the build's tools and the guest's, the arm64 agent (`agent`, or built
/// now), its `check` in a guest of each of `kernels`' series.
fn arm64_check(kernels: &[String], agent: Option<PathBuf>) -> Result<()> {
    setup::build()?;
    setup::arm64_guest()?;
    let series: Vec<&'static str> = kernels::SERIES
        .into_iter()
        .filter(|s| kernels.iter().any(|k| k == s))
        .collect();
    let bin = match agent {
        Some(bin) => bin,
        None => {
            let target =
                cross::target("aarch64-unknown-linux-gnu").expect("a target of cross::TARGETS");
            cross::build(target)?
        }
    };
    arm64::check(&bin, &series)
}

fn corpus(repeat: u32, noise: bool, run: bool, cases: &[String]) -> Result<()> {
    build_release()?;
    say(&format!(
        "running the lock-storm corpus, {repeat} run(s) per case{}",
        if noise {
            ", beside stress-ng --cpu 1"
        } else {
            ""
        }
    ));
    let mut cmd = cargo();
    cmd.args([
        "run",
        "--quiet",
        "--release",
        "--package",
        "stormwatch-tests",
        "--bin",
        "corpus",
        "--",
        "--repeat",
        &repeat.to_string(),
    ]);
    if noise {
        cmd.arg("--noise");
    }
    if run {
        cmd.arg("--run");
    }
    for c in cases {
        cmd.args(["--case", c]);
    }
    run_cmd(&mut cmd)
}

fn diagnose(duration: u32) -> Result<()> {
    let bin = build_release()?;
    say(&format!(
        "running `stormwatch diagnose --duration {duration}`"
    ));
    let status = Command::new(&bin)
        .args(["diagnose", "--duration", &duration.to_string()])
        .status()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    // diagnose exits 3 when it found problems: that is a result, not a failure of the task.
    match status.code() {
        Some(0 | 3) => Ok(()),
        _ => bail!("stormwatch diagnose failed: {status}"),
    }
}

/// `xtask test`'s checks and builds on the host: clippy, the docs, the unit tests, then the
/// release agent the integration tests run (returned).
fn host_checks_and_builds() -> Result<PathBuf> {
    // Clippy and unit tests on the default members: everything but the eBPF crate, which only
    // builds for the bpf target (agent/build.rs builds it, and its errors fail that build).
    say("running clippy (warnings are errors)");
    run_cmd(cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"]))?;
    // The docs of the crates with documentation to read (the tests crate and the eBPF crate
    // are not): a broken intra-doc link or a stale reference fails the tests, as clippy does.
    say("building the docs (warnings are errors)");
    run_cmd(cargo().env("RUSTDOCFLAGS", "-D warnings").args([
        "doc",
        "--no-deps",
        "--package",
        "stormwatch",
        "--package",
        "stormwatch-common",
        "--package",
        "xtask",
    ]))?;
    say("running unit tests");
    run_cmd(cargo().args([
        "test",
        "--package",
        "stormwatch",
        "--package",
        "stormwatch-common",
        "--package",
        "xtask",
    ]))?;
    build_release()
}

fn test() -> Result<()> {
    say("checking the module import graphs (no circle)");
    imports::run(false)?;
    say("checking formatting (cargo fmt --check)");
    run_cmd(cargo().args(["fmt", "--all", "--", "--check"]))?;
    // The install lists on a bare system: what this host has from earlier runs hides a name
    // missing from them, which only a fresh machine would find (issue #40). Its steps build the
    // arm64 agent with its eBPF programs (nodes are more and more arm64) as the README says
    // (`xtask build --target`, which checks the binary's and the object's ELF machines): that
    // agent, copied out, is the one checked in the arm64 guests below.
    //
    // It runs beside the host's own builds (clippy, docs, unit tests, the release build),
    // which time nothing: each leaves the CPUs partly idle where the other downloads, unpacks
    // or links on one thread. Never beside the integration tests, whose timings are real, nor
    // beside the kernel matrix, whose emulated guests then ran past their windows (2026-12-03).
    let (bare, builds) = std::thread::scope(|scope| {
        let bare = scope.spawn(bare::check);
        let builds = host_checks_and_builds();
        (
            bare.join().expect("the bare check's thread panicked"),
            builds,
        )
    });
    let bin = builds?;
    let cross_bins = bare?;
    // The integration tests run the release binary built above, as users do (cargo does not
    // build another package's binary for a test crate). They load BPF and time real workloads
    // on 2 CPUs: one at a time, so that one test's workload is not another's noisy neighbour.
    say("running integration tests against the kernel (as root, one at a time)");
    run_cmd(cargo().args([
        "test",
        "--release",
        "--package",
        "stormwatch-tests",
        // Every test binary runs even after one fails: a failure names all that fail.
        "--no-fail-fast",
        "--",
        "--test-threads=1",
    ]))?;
    // The same agent and tests against Debian's 6.1 and 6.12 LTS kernels, in guests under
    // emulation, with only cgroup v2 (`cargo +stable xtask kernel-matrix` runs this alone).
    kernels::matrix(&bin)?;
    // The arm64 agent's `check` in arm64 guests of both kernels (`xtask arm64-check`).
    setup::arm64_guest()?;
    for arm64_bin in &cross_bins {
        arm64::check(arm64_bin, &kernels::SERIES)?;
    }
    Ok(())
}
