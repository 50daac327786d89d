//! `xtask bare-check`, a step of `xtask test`: the install lists proven on a bare system.
//!
//! A clean checkout on a used machine does not prove the lists of xtask/src/setup.rs and
//! xtask/src/cross.rs: what an earlier install left on the machine hides a name missing from
//! them (CI built ring's C for arm64 with headers that no list installed, and a fresh machine
//! failed there: issue #40). So, on every run:
//!
//! - A pristine Debian root, `target/bare/root`, made afresh by mmdebstrap (`minbase`) from the
//!   host's own Debian sources (its release, `-updates` and `-security`, as apt reads them) and
//!   its apt options for reaching them, and the CAs its administrator added
//!   (/usr/local/share/ca-certificates: a proxy's, a company's), without which nothing in the
//!   root could download over HTTPS on this network.
//! - In it only what a fresh machine of this kind has before the project's setup runs, as far
//!   as the README's commands rely on it: [`FRESH_MACHINE`], the one place that says what and
//!   why. Rust is rustup's own install of `stable` (the host's rustup binary run as
//!   `rustup-init` in the root, with the root's own ~/.rustup and ~/.cargo): the pinned
//!   nightly, its components and bpf-linker come from the project's setup, in the root.
//! - A copy of the worktree's sources (what git tracks, and new files it does not ignore: what
//!   a clone would have once they are committed; never `target/`), and in it, as a user would:
//!   the README's first command, `cargo +stable xtask diagnose --duration 2` (the probes load
//!   into the running kernel through the root's /sys and /proc), then `cargo +stable xtask
//!   build --target <triple>` for each cross target. The project's setup installs what they
//!   need, apt-get in the root.
//! - The tests' lists (`setup::TEST_PACKAGES`, `setup::ARM64_GUEST_PACKAGES`): resolved in the
//!   root before the builds (`apt-get install --simulate`, seconds: an unknown or
//!   uninstallable name fails before the builds' minutes), and installed after them (as
//!   `setup::packages` does; about 40 s from the `.deb` cache), so that nothing they bring can
//!   stand in for a package missing from the build's lists. The root's policy-rc.d keeps their
//!   daemons (redis-server) from starting in it on the host's network. The tests' PyPI and Go
//!   tools are not installed in the root: they need the tests' python3 and Go.
//!
//! Nothing is kept between runs but downloaded `.deb` files (`target/bare/debs`), which change
//! nothing about what is installed; never a build: a cached compile of ring would not notice
//! missing headers.
//!
//! Mounts: each command in the root runs in a mount namespace of its own (`unshare --mount`,
//! private propagation) where /proc, /sys, /dev and the `.deb` cache are mounted for it. The
//! namespace and every mount in it end with the command's last process, however it ends (done,
//! failed, Ctrl-C; if xtask alone is killed, the command runs on to its end in it), and the
//! host's namespace never has them: `rm -rf target` meets empty directories, even during a
//! run, and there is nothing to unmount. The root is removed
//! only while the host's mount table has nothing under it ([`remove_root`]), should someone
//! have mounted something there by hand.

use std::{
    collections::BTreeMap,
    fs::File,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    cross,
    kernels::sh_quote,
    root, run_cmd, say,
    setup::{self, output},
};

/// What a fresh machine has before the project's setup runs.
#[derive(Clone, Copy, Debug)]
pub enum Fresh {
    /// A Debian package, installed when the root is made.
    Package(&'static str),
    /// rustup, installed as rustup.rs installs it, with this toolchain (minimal profile).
    Rustup(&'static str),
}

impl std::fmt::Display for Fresh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fresh::Package(p) => write!(f, "{p}"),
            Fresh::Rustup(t) => write!(f, "rustup with the {t} toolchain"),
        }
    }
}

/// What a fresh machine of the kind the README addresses has before the project's setup runs
/// (Debian 12 with a developer's basics: rustup with the stable toolchain, gcc, g++, make, git,
/// curl, ca-certificates, python3 with pip, Go), as far as the README's build commands rely on
/// it, and what they rely on it for. The rest of those basics is left out, and the root proves
/// that the build does without it: g++, make, curl (nothing the build runs uses them), git (the
/// root gets a copy of the sources, not a clone), python3 and Go (the tests' PyPI and Go tools,
/// which are not installed in the root).
pub const FRESH_MACHINE: &[(Fresh, &str)] = &[
    (
        Fresh::Rustup("stable"),
        "`cargo +stable` builds xtask; rustup installs the pinned nightly for the child cargo",
    ),
    (
        Fresh::Package("ca-certificates"),
        "rustup and cargo download over HTTPS",
    ),
    (
        Fresh::Package("gcc"),
        "rustc links host binaries with `cc`; build scripts compile C (ring)",
    ),
    (
        Fresh::Package("libc6-dev"),
        "the C library's headers and start files: gcc only recommends it, and links nothing \
         without it",
    ),
];

/// The host's apt options that say how it reaches its package source; the root gets them too
/// (a proxy, an archive snapshot older than its Release files' Valid-Until).
const APT_OPTIONS: &[&str] = &[
    "Acquire::http::Proxy",
    "Acquire::https::Proxy",
    "Acquire::Check-Valid-Until",
    "Acquire::Check-Date",
];

/// The host's environment variables that say how it reaches the network (a proxy); the
/// commands in the root get them too. Nothing else of the host's environment is passed.
const NETWORK_ENV: &[&str] = &[
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
];

/// Where the sources are copied in the root (the user's clone).
const SOURCES: &str = "/root/stormwatch";
/// Where the host's rustup binary is put in the root, named as rustup.rs's installer.
const RUSTUP_INIT: &str = "/tmp/rustup-init";

/// Mounts /proc, /sys, /dev and the `.deb` cache into the root `$1`, in the mount namespace of
/// `unshare --mount` (private: nothing propagates to the host's), then runs the rest of the
/// arguments chrooted in it. Arguments: root, cache, command….
const IN_ROOT: &str = r#"root=$1 debs=$2; shift 2
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mount --bind "$debs" "$root/var/cache/apt/archives"
exec chroot "$root" "$@""#;

/// `target/bare`: the root, the `.deb` cache, the steps' logs.
pub fn bare_dir() -> PathBuf {
    root().join("target/bare")
}

/// `xtask bare-check`: makes the root afresh and runs the steps in it; on success the root is
/// removed (the `.deb` cache kept), on failure it is kept for a look, the failed step's log
/// named. Returns the agents it built for the other targets ([`crate::cross::TARGETS`]),
/// copied out of the root first: `xtask test` checks them in their guests rather than build
/// them a second time (five minutes of CI's ninety).
pub fn check() -> Result<Vec<PathBuf>> {
    let started = Instant::now();
    let dir = bare_dir();
    let root_fs = dir.join("root");
    let debs = dir.join("debs");
    let logs = dir.join("logs");
    remove_root(&root_fs)?;
    let _ = std::fs::remove_dir_all(&logs);
    for d in [&debs, &logs] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let made = Instant::now();
    make_root(&root_fs, &debs, &logs.join("0-mmdebstrap.log"))?;
    // Debian's way to keep a package's daemon from starting where it is installed (exit 101:
    // "action forbidden"), as in any chroot: the root shares the host's network.
    let policy = root_fs.join("usr/sbin/policy-rc.d");
    std::fs::write(&policy, "#!/bin/sh\nexit 101\n")
        .and_then(|()| {
            std::fs::set_permissions(&policy, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        })
        .with_context(|| format!("writing {}", policy.display()))?;
    let sources = copy_sources(&root_fs)?;
    let rustup = host_rustup()?;
    std::fs::copy(&rustup, root_fs.join(RUSTUP_INIT.trim_start_matches('/')))
        .with_context(|| format!("copying {} into the root", rustup.display()))?;
    say(&format!(
        "bare root: made in {} s ({sources} files of sources in {SOURCES}, {} as {RUSTUP_INIT})",
        made.elapsed().as_secs(),
        rustup.display()
    ));
    let bare = Root {
        dir: root_fs.clone(),
        debs,
        logs,
    };
    let mut times = Vec::new();
    for (i, step) in steps().iter().enumerate() {
        let took = bare.run(i + 1, step)?;
        times.push(format!("{} {} s", step.name, took.as_secs()));
    }
    let mut built = Vec::new();
    for t in crate::cross::TARGETS {
        let relative = Path::new("target")
            .join(t.triple)
            .join("release/stormwatch");
        let from = root_fs
            .join(SOURCES.trim_start_matches('/'))
            .join(&relative);
        let to = root().join(&relative);
        std::fs::create_dir_all(to.parent().expect("a file in a directory"))?;
        std::fs::copy(&from, &to)
            .with_context(|| format!("copying {} out of the root", from.display()))?;
        say(&format!(
            "bare root: the agent it built for {} is {}",
            t.triple,
            to.display()
        ));
        built.push(to);
    }
    remove_root(&root_fs)?;
    say(&format!(
        "bare root: the install lists hold on a bare {} in {} s ({})",
        codename()?,
        started.elapsed().as_secs(),
        times.join(", ")
    ));
    Ok(built)
}

/// One command run in the root, as the user would run it.
struct Step {
    /// What the user would type, the name the step is reported by.
    name: String,
    /// Its working directory in the root.
    cwd: &'static str,
    argv: Vec<String>,
}

fn steps() -> Vec<Step> {
    let mut steps = Vec::new();
    for (what, _) in FRESH_MACHINE {
        if let Fresh::Rustup(toolchain) = what {
            steps.push(Step {
                name: format!("rustup-init (toolchain {toolchain})"),
                cwd: "/root",
                argv: [
                    RUSTUP_INIT,
                    "-y",
                    "--no-modify-path",
                    "--profile",
                    "minimal",
                    "--default-toolchain",
                    toolchain,
                ]
                .map(String::from)
                .to_vec(),
            });
        }
    }
    // The tests' lists resolved first: seconds, where the builds take minutes.
    let tests_packages = || {
        setup::TEST_PACKAGES
            .iter()
            .chain(setup::ARM64_GUEST_PACKAGES)
            .map(|(name, _)| name.to_string())
    };
    steps.push(Step {
        name: "apt-get install --simulate <the tests' packages>".to_owned(),
        cwd: "/root",
        argv: [
            "sh",
            "-c",
            "apt-get update -q && exec apt-get install --simulate -q --no-install-recommends \"$@\"",
            "sh",
        ]
        .map(String::from)
        .into_iter()
        .chain(tests_packages())
        .collect(),
    });
    let user = |args: &str| Step {
        name: format!("cargo +stable xtask {args}"),
        cwd: SOURCES,
        argv: ["cargo", "+stable", "xtask"]
            .into_iter()
            .chain(args.split(' '))
            .map(String::from)
            .collect(),
    };
    steps.push(user("diagnose --duration 2"));
    for t in cross::TARGETS {
        steps.push(user(&format!("build --target {}", t.triple)));
    }
    // Installed last, as `setup::packages` installs them: nothing they bring can stand in for
    // a package missing from the build's lists.
    steps.push(Step {
        name: "apt-get install <the tests' packages>".to_owned(),
        cwd: "/root",
        argv: [
            "env",
            "DEBIAN_FRONTEND=noninteractive",
            "apt-get",
            "install",
            "-y",
            "-q",
            "--no-install-recommends",
        ]
        .map(String::from)
        .into_iter()
        .chain(tests_packages())
        .collect(),
    });
    steps
}

/// The root and what is mounted into it.
struct Root {
    dir: PathBuf,
    debs: PathBuf,
    logs: PathBuf,
}

impl Root {
    /// Runs `step` in the root, its output into the logs; fails naming the step, with the
    /// log's errors and its end shown.
    fn run(&self, n: usize, step: &Step) -> Result<Duration> {
        let log_path = self.logs.join(format!("{n}-{}.log", slug(&step.name)));
        say(&format!(
            "bare root: `{}` (output in {})",
            step.name,
            log_path.display()
        ));
        let log =
            File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "--"])
            .args(["sh", "-euc", IN_ROOT, "sh"])
            .arg(&self.dir)
            .arg(&self.debs)
            // The root's own environment, as a login on the fresh machine has it.
            .args(["env", "-i", "-C", step.cwd])
            .args(root_env())
            .args(&step.argv)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let started = Instant::now();
        let status = cmd.status().context("cannot start unshare")?;
        let took = started.elapsed();
        if !status.success() {
            show_failure(&log_path);
            bail!(
                "bare root: `{}` failed ({status}) after {} s; its output: {}; the root is \
                 kept: {}",
                step.name,
                took.as_secs(),
                log_path.display(),
                self.dir.display()
            );
        }
        say(&format!(
            "bare root: `{}` passed in {} s",
            step.name,
            took.as_secs()
        ));
        Ok(took)
    }
}

/// A step's name as a file name: its words, joined by `-`.
fn slug(name: &str) -> String {
    name.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

/// The environment of the commands in the root: a root login's, rustup's bin directory on the
/// PATH (what `. ~/.cargo/env` adds), and the host's proxy variables.
fn root_env() -> Vec<String> {
    let mut env = [
        "HOME=/root",
        "USER=root",
        "LOGNAME=root",
        "LANG=C.UTF-8",
        "PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        // As on the machines the project runs on, and stricter than rustup's default: a
        // toolchain the setup forgot fails instead of being installed behind its back.
        "RUSTUP_AUTO_INSTALL=0",
    ]
    .map(String::from)
    .to_vec();
    for var in NETWORK_ENV {
        if let Ok(value) = std::env::var(var) {
            env.push(format!("{var}={value}"));
        }
    }
    env
}

/// Prints what a failed step's log says: its error lines, then its last lines.
fn show_failure(log: &Path) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail_from = lines.len().saturating_sub(25);
    let mut errors: Vec<&str> = lines[..tail_from]
        .iter()
        .copied()
        .filter(|l| l.contains("error:") || l.contains("fatal error") || l.starts_with("E: "))
        .collect();
    errors.dedup();
    if !errors.is_empty() {
        eprintln!("--- errors in {}:", log.display());
        for l in errors.iter().take(12) {
            eprintln!("{l}");
        }
    }
    eprintln!("--- the end of {}:", log.display());
    for l in &lines[tail_from..] {
        eprintln!("{l}");
    }
    eprintln!("---");
}

/// The host's Debian release (`VERSION_CODENAME` of /etc/os-release).
fn codename() -> Result<String> {
    let text = std::fs::read_to_string("/etc/os-release").context("reading /etc/os-release")?;
    text.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_owned())
        .filter(|v| !v.is_empty())
        .context("no VERSION_CODENAME in /etc/os-release")
}

/// The host's Debian sources of `codename`, its `-updates` and `-security`, as one-line
/// entries (`deb URI SUITE COMPONENTS`), from `apt-get indextargets` lines `URI SUITE
/// COMPONENT`; fails if one of the three suites is missing.
fn debian_sources(codename: &str, indextargets: &str) -> Result<Vec<String>> {
    let suites = [
        codename.to_owned(),
        format!("{codename}-updates"),
        format!("{codename}-security"),
    ];
    let mut components: BTreeMap<(usize, &str), Vec<&str>> = BTreeMap::new();
    for line in indextargets.lines() {
        let mut words = line.split_whitespace();
        let (Some(uri), Some(suite), Some(component)) = (words.next(), words.next(), words.next())
        else {
            continue;
        };
        let Some(rank) = suites.iter().position(|s| s == suite) else {
            continue;
        };
        let list = components.entry((rank, uri)).or_default();
        if !list.contains(&component) {
            list.push(component);
        }
    }
    for (rank, suite) in suites.iter().enumerate() {
        if !components.keys().any(|(r, _)| *r == rank) {
            bail!("the host's apt sources have no Debian {suite}: the bare root is made from them");
        }
    }
    Ok(components
        .into_iter()
        .map(|((rank, uri), comps)| format!("deb {uri} {} {}", suites[rank], comps.join(" ")))
        .collect())
}

/// The host's Debian sources (`apt-get indextargets` of Debian's Packages files; the index is
/// refreshed once if it has none, as on a machine that never ran `apt-get update`).
fn host_sources(codename: &str) -> Result<Vec<String>> {
    let read = || {
        output(Command::new("apt-get").args([
            "indextargets",
            "--format",
            "$(REPO_URI) $(RELEASE) $(COMPONENT)",
            "Identifier: Packages",
            "Target-Of: deb",
            "Origin: Debian",
        ]))
    };
    match debian_sources(codename, &read()?) {
        Ok(sources) => Ok(sources),
        Err(_) => {
            run_cmd(Command::new("apt-get").args(["update", "-q"]))?;
            debian_sources(codename, &read()?)
        }
    }
}

/// `--aptopt`s: the host's settings of [`APT_OPTIONS`], as `apt-config dump` prints them.
fn host_apt_options() -> Result<Vec<String>> {
    let dump = output(Command::new("apt-config").arg("dump"))?;
    Ok(dump
        .lines()
        .filter(|l| {
            l.split_once(' ')
                .is_some_and(|(key, _)| APT_OPTIONS.iter().any(|o| o.eq_ignore_ascii_case(key)))
        })
        .map(|l| format!("--aptopt={l}"))
        .collect())
}

/// Makes the pristine root with mmdebstrap, in a mount namespace of its own too (it mounts
/// /proc, /sys and /dev into the root while it installs); its output into `log`.
fn make_root(root_fs: &Path, debs: &Path, log: &Path) -> Result<()> {
    setup::packages(&[setup::MMDEBSTRAP])?;
    let codename = codename()?;
    let sources = host_sources(&codename)?;
    let include: Vec<&str> = FRESH_MACHINE
        .iter()
        .filter_map(|(what, _)| match what {
            Fresh::Package(p) => Some(*p),
            Fresh::Rustup(_) => None,
        })
        .collect();
    for (what, why) in FRESH_MACHINE {
        say(&format!("bare root: a fresh machine has {what}: {why}"));
    }
    say(&format!(
        "bare root: mmdebstrap --variant=minbase {codename} {} from {} (output in {})",
        root_fs.display(),
        sources.join(", "),
        log.display()
    ));
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--", "mmdebstrap"])
        .args(["--mode=root", "--variant=minbase"])
        .arg(format!("--include={}", include.join(",")))
        .args(host_apt_options()?)
        // The .deb cache, mounted where apt downloads (in this mount namespace only) before
        // the first download and unmounted after the last install; nothing in it removed (the
        // essential stage's downloads, the cleanup's apt cache). Not copied in and out: it
        // grows to ~430 MB.
        .args([
            "--skip=download/empty",
            "--skip=essential/unlink",
            "--skip=cleanup/apt/cache",
        ])
        .arg("--setup-hook=mkdir -p \"$1/var/cache/apt/archives\"")
        .arg(format!(
            "--setup-hook=mount --bind {} \"$1/var/cache/apt/archives\"",
            sh_quote(&debs.display().to_string())
        ))
        .arg("--customize-hook=umount \"$1/var/cache/apt/archives\"");
    // The host's own CAs, in before ca-certificates is configured (which adds them).
    let local_cas = Path::new("/usr/local/share/ca-certificates");
    if local_cas.is_dir() {
        cmd.arg("--setup-hook=mkdir -p \"$1/usr/local/share/ca-certificates\"")
            .arg(format!(
                "--setup-hook=sync-in {} /usr/local/share/ca-certificates/",
                local_cas.display()
            ));
    }
    cmd.arg(&codename).arg(root_fs).args(&sources);
    let log_file = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    cmd.stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file);
    let status = cmd.status().context("cannot start unshare")?;
    if !status.success() {
        show_failure(log);
        bail!(
            "bare root: mmdebstrap failed ({status}); its output: {}",
            log.display()
        );
    }
    Ok(())
}

/// Copies the worktree's sources into the root: what git tracks (as the worktree has it) and
/// the files it neither tracks nor ignores. Returns how many files.
fn copy_sources(root_fs: &Path) -> Result<usize> {
    let listed = output(Command::new("git").current_dir(root()).args([
        "ls-files",
        "-z",
        "--cached",
        "--others",
        "--exclude-standard",
    ]))?;
    let dest = root_fs.join(SOURCES.trim_start_matches('/'));
    let mut copied = 0;
    for rel in listed.split('\0').filter(|p| !p.is_empty()) {
        let from = root().join(rel);
        // Tracked but deleted in the worktree: not in the copy either.
        let Ok(meta) = from.symlink_metadata() else {
            continue;
        };
        let to = dest.join(rel);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        if meta.file_type().is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from)?, &to)
                .with_context(|| format!("copying the link {}", from.display()))?;
        } else if meta.is_file() {
            std::fs::copy(&from, &to).with_context(|| format!("copying {}", from.display()))?;
        } else {
            continue;
        }
        copied += 1;
    }
    Ok(copied)
}

/// The host's rustup binary (the one on the PATH, which `cargo +stable` ran through).
fn host_rustup() -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("rustup"))
        .find(|p| p.is_file())
        .context("no rustup on the PATH: the bare root's Rust is the host's rustup's install")
}

/// The mount points under `dir` in `mountinfo` (/proc/self/mountinfo's format; its octal
/// escapes undone).
fn mounts_under(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| p.starts_with(dir))
        .collect()
}

fn unescape_mountinfo(s: &str) -> String {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Removes the root, refusing while anything is mounted under it in this mount namespace:
/// removing would go down into the mounts (a bind mount of /dev is the host's /dev).
fn remove_root(root_fs: &Path) -> Result<()> {
    if root_fs.symlink_metadata().is_err() {
        return Ok(());
    }
    let canonical = root_fs
        .canonicalize()
        .with_context(|| format!("resolving {}", root_fs.display()))?;
    let mountinfo =
        std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    let mounted = mounts_under(&mountinfo, &canonical);
    if !mounted.is_empty() {
        let shown: Vec<String> = mounted.iter().map(|p| p.display().to_string()).collect();
        bail!(
            "refusing to remove {}: mounted under it: {} (unmount them: umount -R <each>)",
            canonical.display(),
            shown.join(", ")
        );
    }
    say(&format!("bare root: removing {}", canonical.display()));
    std::fs::remove_dir_all(&canonical).with_context(|| format!("removing {}", canonical.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sources_are_the_three_suites_with_their_components() {
        let targets = "http://deb.debian.org/debian/ bookworm main\n\
                       http://deb.debian.org/debian/ bookworm contrib\n\
                       http://deb.debian.org/debian/ bookworm main\n\
                       http://deb.debian.org/debian/ trixie main\n\
                       http://deb.debian.org/debian-security/ bookworm-security main\n\
                       http://deb.debian.org/debian/ bookworm-updates main\n";
        assert_eq!(
            debian_sources("bookworm", targets).unwrap(),
            [
                "deb http://deb.debian.org/debian/ bookworm main contrib",
                "deb http://deb.debian.org/debian/ bookworm-updates main",
                "deb http://deb.debian.org/debian-security/ bookworm-security main",
            ]
        );
        let no_security = "http://deb.debian.org/debian/ bookworm main\n\
                           http://deb.debian.org/debian/ bookworm-updates main\n";
        let err = debian_sources("bookworm", no_security).unwrap_err();
        assert!(err.to_string().contains("bookworm-security"), "{err}");
    }

    #[test]
    fn mounts_under_the_root_are_found_escaped_or_not() {
        let mountinfo = "\
22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
90 22 0:5 / /w/target/bare/root/dev rw - devtmpfs udev rw
91 22 0:6 / /w/target/bare/root\\040x/proc rw - proc proc rw
92 22 0:7 / /w/target/bare/rootfs rw - tmpfs tmpfs rw
93 22 0:8 / /w/target/bare rw - tmpfs tmpfs rw";
        assert_eq!(
            mounts_under(mountinfo, Path::new("/w/target/bare/root")),
            [PathBuf::from("/w/target/bare/root/dev")]
        );
        assert_eq!(
            mounts_under(mountinfo, Path::new("/w/target/bare/root x")),
            [PathBuf::from("/w/target/bare/root x/proc")]
        );
        assert!(mounts_under(mountinfo, Path::new("/elsewhere")).is_empty());
    }

    #[test]
    fn a_step_runs_the_readme_commands_after_the_fresh_machine_and_the_lists() {
        let names: Vec<String> = steps().into_iter().map(|s| s.name).collect();
        assert_eq!(names[0], "rustup-init (toolchain stable)");
        assert!(names[1].starts_with("apt-get install --simulate"));
        assert_eq!(names[2], "cargo +stable xtask diagnose --duration 2");
        assert_eq!(
            names[3],
            "cargo +stable xtask build --target aarch64-unknown-linux-gnu"
        );
        assert_eq!(names[4], "apt-get install <the tests' packages>");
        assert_eq!(slug(&names[2]), "cargo-stable-xtask-diagnose-duration-2");
        assert_eq!(names.len(), 5);
    }
}
