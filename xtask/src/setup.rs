//! Installs what the build and the tests need, skipping whatever is already there.
//!
//! What building and diagnosing need ([`build`], all that `xtask diagnose` installs):
//! - the pinned nightly with `rust-src` (rustup does not install it by itself when
//!   `RUSTUP_AUTO_INSTALL=0`);
//! - Debian packages: `llvm-22-dev` (bpf-linker links against it);
//! - `bpf-linker` built against LLVM 22, which must match the pinned rustc's LLVM;
//! - tracefs at /sys/kernel/tracing.
//!
//! What the tests and benchmarks add ([`tests`]): the Debian, PyPI and Go tools they use as
//! workloads and independent oracles. The cross builds' packages are their targets' own lists
//! (`cross::TARGETS`), which `xtask build --target` and `xtask setup` install.

use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::{run_cmd, say};

/// Must match rust-toolchain.toml.
pub const TOOLCHAIN: &str = "nightly-2026-06-20";
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

/// Debian packages the build needs: what each is for.
const BUILD_PACKAGES: &[(&str, &str)] = &[
    ("llvm-22-dev", "bpf-linker links against LLVM 22"),
    (
        "libpolly-22-dev",
        "LLVM 22's static libraries reference Polly",
    ),
    ("libzstd-dev", "LLVM 22 is linked with zstd"),
];

/// The bare root's maker (`xtask bare-check`, which installs only it).
pub const MMDEBSTRAP: (&str, &str) = (
    "mmdebstrap",
    "makes the pristine Debian root in which `xtask test` proves these lists (xtask/src/bare.rs)",
);

/// Debian packages the tests and benchmarks add: what each is for.
pub const TEST_PACKAGES: &[(&str, &str)] = &[
    ("stress-ng", "workloads for the tests and the benchmark"),
    ("bpftrace", "an independent measurement for the tests"),
    (
        "bpftool",
        "reads the BPF programs' run-time statistics for `xtask bench` and the probes' maps in the tests",
    ),
    (
        "sysbench",
        "a packaged mutex storm for the lock-storm corpus (tests/tests/corpus.rs)",
    ),
    (
        "linux-perf",
        "perf bench futex/sched workloads for the lock-storm corpus",
    ),
    (
        "redis-server",
        "an I/O-bound server for the lock-storm corpus",
    ),
    ("redis-tools", "redis-benchmark, the corpus server's load"),
    (
        "memcached",
        "a third-party server for the lock-storm corpus (issue #41)",
    ),
    (
        "nginx-light",
        "a third-party server for the lock-storm corpus (issue #41)",
    ),
    (
        "postgresql",
        "a third-party server and its load (pgbench) for the lock-storm corpus",
    ),
    (
        "nodejs",
        "a Node.js service's libuv pool for the lock-storm corpus",
    ),
    (
        "maven",
        "fetches embedded Tomcat's jars from Maven Central for the lock-storm corpus",
    ),
    ("iproute2", "network namespaces for the tests"),
    (
        "openssl",
        "certificates for the metrics endpoint's TLS test",
    ),
    (
        "curl",
        "an HTTPS client for the metrics endpoint's TLS test",
    ),
    ("iputils-ping", "sized pings for the network tests"),
    ("iperf3", "TCP traffic for the network tests and benchmark"),
    (
        "prometheus",
        "a real Prometheus server scrapes the daemon in the tests",
    ),
    ("runc", "runs a real container in the identity tests"),
    ("busybox-static", "the container's root filesystem"),
    (
        "podman",
        "runs the DaemonSet's pod as the manifest says (tests/tests/pod.rs); its \
         containers-common default seccomp profile is the base of deploy/seccomp/",
    ),
    (
        "systemd",
        "systemd-detect-virt: an independent hypervisor detection for the host tests",
    ),
    (
        "qemu-system-x86",
        "runs the kernel matrix's guests (Debian's 6.1 and 6.12 kernels, xtask/src/kernels/)",
    ),
    ("kmod", "virtme-ng loads the guest kernel's modules with it"),
    ("udev", "virtme-ng starts udevd in the guests"),
    MMDEBSTRAP,
];

/// Debian packages the arm64 guest adds (`xtask arm64-check`, xtask/src/arm64.rs): what each
/// is for. The guest's glibc is the cross linker's (`libc6-arm64-cross`, with
/// `gcc-aarch64-linux-gnu`, which the arm64 build installs).
pub const ARM64_GUEST_PACKAGES: &[(&str, &str)] = &[
    (
        "qemu-system-arm",
        "qemu-system-aarch64 runs the arm64 guest (`xtask arm64-check`)",
    ),
    ("cpio", "packs the arm64 guest's initramfs"),
];

/// PyPI packages: (package, command it provides, what it is for).
const PIP_PACKAGES: &[(&str, &str, &str)] = &[
    (
        "kubernetes-validate",
        "kubernetes-validate",
        "validates deploy/ against the Kubernetes schemas",
    ),
    (
        "virtme-ng",
        "vng",
        "boots the kernel matrix's guests with the host's filesystem (xtask/src/kernels/)",
    ),
];

/// Go modules: (module@version, binary, what it is for).
const GO_TOOLS: &[(&str, &str, &str)] = &[(
    "helm.sh/helm/v3/cmd/helm@v3.22.0",
    "helm",
    "renders and lints the Helm chart (deploy/helm/stormwatch)",
)];

/// What building the agent and diagnosing this host need, and nothing else.
pub fn build() -> Result<()> {
    toolchain()?;
    packages(BUILD_PACKAGES)?;
    bpf_linker()?;
    tracefs();
    say("build tools: complete");
    Ok(())
}

/// Everything: the build's tools and the tests' and benchmarks'.
pub fn tests() -> Result<()> {
    build()?;
    packages(TEST_PACKAGES)?;
    pip_packages()?;
    go_tools()?;
    say("test tools: complete");
    Ok(())
}

/// What the arm64 guest needs besides the build's tools: QEMU for arm64, cpio, and dpkg's
/// `arm64` architecture, so that `apt-get download` finds Debian's arm64 kernel and busybox
/// (they are unpacked under `target/kernels/`, never installed).
pub fn arm64_guest() -> Result<()> {
    packages(ARM64_GUEST_PACKAGES)?;
    foreign_architecture("arm64")
}

fn foreign_architecture(arch: &str) -> Result<()> {
    let have = output(Command::new("dpkg").arg("--print-foreign-architectures"))?;
    if have.lines().any(|l| l.trim() == arch) {
        say(&format!("dpkg architecture {arch}: added"));
        return Ok(());
    }
    say(&format!(
        "adding dpkg architecture {arch} (for apt-get download of {arch} packages)"
    ));
    run_cmd(Command::new("dpkg").args(["--add-architecture", arch]))?;
    run_cmd(Command::new("apt-get").args(["update", "-q"]))
}

/// Runs a command to its end and returns its standard output; fails with its standard error.
pub(crate) fn output(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .output()
        .with_context(|| format!("cannot start {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn toolchain() -> Result<()> {
    let installed = output(Command::new("rustup").args(["toolchain", "list"]))?;
    let have = installed
        .lines()
        .any(|l| l.starts_with(&format!("{TOOLCHAIN}-")));
    let components = if have {
        output(Command::new("rustup").args([
            "component",
            "list",
            "--installed",
            "--toolchain",
            TOOLCHAIN,
        ]))?
    } else {
        String::new()
    };
    let complete = ["rust-src", "rustfmt", "clippy"]
        .iter()
        .all(|c| components.lines().any(|l| l.starts_with(c)));
    if have && complete {
        say(&format!("toolchain {TOOLCHAIN}: installed"));
        return Ok(());
    }
    say(&format!(
        "installing toolchain {TOOLCHAIN} with rust-src, rustfmt, clippy"
    ));
    run_cmd(Command::new("rustup").args([
        "toolchain",
        "install",
        TOOLCHAIN,
        "--profile",
        "minimal",
        "--component",
        "rust-src,rustfmt,clippy",
    ]))
}

fn package_installed(name: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", name])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

pub fn packages(wanted: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|(name, _)| !package_installed(name))
        .map(|(name, _)| *name)
        .collect();
    if missing.is_empty() {
        say("Debian packages: all installed");
        return Ok(());
    }
    for (name, why) in wanted.iter().filter(|(n, _)| missing.contains(n)) {
        say(&format!("installing {name} ({why})"));
    }
    run_cmd(Command::new("apt-get").args(["update", "-q"]))?;
    run_cmd(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

fn pip_packages() -> Result<()> {
    for (package, command, why) in PIP_PACKAGES {
        let present = Command::new(command)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if present {
            say(&format!("{package}: installed"));
            continue;
        }
        say(&format!("installing {package} from PyPI ({why})"));
        run_cmd(Command::new("python3").args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            package,
        ]))?;
    }
    Ok(())
}

/// Go tools go to /usr/local/bin, on every PATH (the tests look them up there).
fn go_tools() -> Result<()> {
    for (module, binary, why) in GO_TOOLS {
        let present = Command::new(binary)
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success());
        if present {
            say(&format!("{binary}: installed"));
            continue;
        }
        say(&format!(
            "installing {binary} ({why}): go install {module} (a few minutes, once)"
        ));
        run_cmd(
            Command::new("go")
                .args(["install", module])
                .env("GOBIN", "/usr/local/bin"),
        )?;
    }
    Ok(())
}

/// bpf-linker is installed with `--features llvm-22`; cargo records the features it was built
/// with in ~/.cargo/.crates2.json, which is how we tell a matching build from another.
fn bpf_linker() -> Result<()> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cargo")))
        .context("neither CARGO_HOME nor HOME is set")?;
    let binary = cargo_home.join("bin/bpf-linker");
    let record = std::fs::read_to_string(cargo_home.join(".crates2.json")).unwrap_or_default();
    let built_for_llvm22 = record.split("\"bpf-linker ").nth(1).is_some_and(|entry| {
        let entry = entry.split("\"bpf-linker ").next().unwrap_or(entry);
        entry.split('}').next().unwrap_or("").contains("llvm-22")
    });
    if binary.exists() && built_for_llvm22 {
        say("bpf-linker (LLVM 22): installed");
        return Ok(());
    }
    say("building bpf-linker against LLVM 22 (a few minutes, once)");
    run_cmd(
        Command::new("cargo")
            .args([
                &format!("+{TOOLCHAIN}"),
                "install",
                "--locked",
                "--force",
                "bpf-linker",
                "--no-default-features",
                "--features",
                "llvm-22",
            ])
            // The default llvm-config on Debian 12 is LLVM 14.
            .env("LLVM_PREFIX", LLVM_PREFIX)
            .env_remove("RUSTUP_TOOLCHAIN"),
    )
}

fn tracefs() {
    if std::path::Path::new("/sys/kernel/tracing/events").is_dir() {
        say("tracefs: mounted");
        return;
    }
    say("mounting tracefs at /sys/kernel/tracing");
    let status = Command::new("mount")
        .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
        .status();
    if !status.is_ok_and(|s| s.success()) {
        say("could not mount tracefs: classic tracepoint tests will fail");
    }
}
