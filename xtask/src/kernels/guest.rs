//! The guest: the shell script it runs (each step's output, exit status and times into a
//! directory the host reads afterwards; the kernel's BTF hidden before the first step that
//! wants it so), and booting it under virtme-ng ([`Guest`]).

use std::{
    collections::HashMap,
    fmt::Write as _,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use super::{Kernel, Phase, Run, Step};
use crate::say;

/// How long one step may take in the guest before it is killed (and fails).
pub(super) const STEP_TIMEOUT_SECONDS: u32 = 300;

/// Where the guest finds the kernel's BTF copied before it is hidden, and the empty file.
pub(super) const BTF_COPY: &str = "/tmp/vmlinux.btf";
pub(super) const BTF_EMPTY: &str = "/tmp/empty.btf";

/// `s` quoted for sh: in single quotes, each `'` in it as `'\''`.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Set in the guests: their timings are emulation's (tests/src/corpus.rs reads it).
const EMULATED_ENV: &str = "STORMWATCH_TEST_EMULATED";

/// Set in the guests when the host built the corpus's Go programs for them (tests/src/corpus.rs
/// reads it).
const GO_PROGRAMS_ENV: &str = "STORMWATCH_TEST_GO_PROGRAMS";

/// The guest's script: each step's output, status and times into `out`.
pub(super) fn script(
    steps: &[Step],
    agent_bin: &Path,
    bins: &HashMap<String, PathBuf>,
    foreign_btf: &Path,
    go_programs: Option<&Path>,
    out: &Path,
) -> Result<String> {
    let mut s = String::new();
    let out_q = sh_quote(&out.display().to_string());
    writeln!(s, "#!/bin/sh")?;
    writeln!(
        s,
        "# Written by `cargo xtask` (xtask/src/kernels/guest.rs): one guest's steps."
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
    if let Some(dir) = go_programs {
        writeln!(
            s,
            "export {GO_PROGRAMS_ENV}={}",
            sh_quote(&dir.display().to_string())
        )?;
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{Expect, matrix::agent, test};

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
            None,
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
        assert!(!s.contains("STORMWATCH_TEST_GO_PROGRAMS"), "{s}");
        // The host's builds of the Go programs, where a step runs them.
        let with_go = script(
            &steps,
            Path::new("/b/stormwatch"),
            &bins,
            Path::new("/k/foreign.btf"),
            Some(Path::new("/k/go")),
            Path::new("/o"),
        )
        .unwrap();
        assert!(
            with_go
                .find("export STORMWATCH_TEST_GO_PROGRAMS='/k/go'")
                .unwrap()
                < with_go.find("step 0").unwrap(),
            "{with_go}"
        );
        let missing = vec![test(Phase::Btf, "nope", "x")];
        assert!(
            script(
                &missing,
                Path::new("/b"),
                &bins,
                Path::new("/f"),
                None,
                Path::new("/o")
            )
            .is_err()
        );
    }
}
