//! Judging a guest once it is gone: each step's output, exit status and times as its script
//! wrote them, against what the step must show ([`Expect`]; `check`'s report read line by line),
//! and the facts every step relies on; the reports as a table ([`summary`]).

use std::{fmt::Write as _, path::Path, process::ExitStatus, time::Duration};

use anyhow::{Context as _, Result, bail};

use super::{Kernel, Phase, Step, guest::STEP_TIMEOUT_SECONDS};

/// What a step must show.
#[derive(Clone, Copy, Debug)]
pub enum Expect {
    /// The test ran and passed: exit 0 and "1 passed" (a filter that matched nothing fails).
    TestPasses,
    /// `check` with every probe, the scheduler's, the contention end's and the network's as
    /// tp_btf: a tp_btf program the verifier refuses falls back to its classic tracepoint, which
    /// every other step would pass (seen: a network program's spill of an undefined register).
    CheckAllTpBtf,
    /// `check` with the kernel's BTF hidden: the scheduler and futex probes attached as classic
    /// tracepoints, exit 0, and what is lost listed (none of it what the storm needs).
    CheckClassicWithoutBtf,
    /// `check --btf FILE` refused the file (exit 1, a FAIL BTF line containing the text).
    CheckRefusesBtf(&'static str),
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
    // The Go storm's sampler: perf events on each CPU's clock, with or without BTF.
    let go_sampler_attached = || -> Result<()> {
        let what = "sampler Go on-CPU";
        let l = find(what).with_context(|| format!("no `{what}` line"))?;
        if l.level != "ok" || !l.detail.starts_with("attached to ") {
            bail!("{what}: {} {} (wanted: attached)", l.level, l.detail);
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
            for p in SCHED_PROBES.iter().chain(&[
                "probe sched:sched_waking",
                "probe lock:contention_end",
                "probe net:net_dev_start_xmit",
                "probe net:netif_receive_skb",
                "probe skb:kfree_skb",
                "probe tcp:tcp_retransmit_skb",
            ]) {
                attached_as(p, "tp_btf")?;
            }
            go_sampler_attached()?;
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
            go_sampler_attached()?;
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

/// What one guest did, read from `out` once it is gone: what every step relies on (see
/// [`guest_setup_errors`]; the kernel's BTF hidden if a step wanted it so), and each step's
/// output, exit status and times (`<i>.out`, `.rc`, `.start`, `.end`), judged.
pub(super) fn report(
    kernel: &Kernel,
    steps: &[Step],
    out: &Path,
    status: &ExitStatus,
    console: &Path,
    boot_to_end: Duration,
) -> GuestReport {
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_default();
    let mut setup_errors = guest_setup_errors(out, status, console);
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
    GuestReport {
        kernel: kernel.clone(),
        uname: read("uname").trim().to_owned(),
        boot_to_end,
        outcomes,
        setup_errors,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    const CHECK_OK: &str = "\
ok    kernel                                 6.1.0-50-amd64
ok    BTF                                    /sys/kernel/btf/vmlinux (100642 types)
ok    probe sched:sched_switch               attached as tp_btf
ok    probe sched:sched_wakeup               attached as tp_btf
ok    probe sched:sched_wakeup_new           attached as tp_btf
ok    probe sched:sched_waking               attached as tp_btf
ok    probe syscalls:sys_enter_futex         attached as tracepoint
ok    probe lock:contention_end              attached as tp_btf
ok    probe net:net_dev_start_xmit           attached as tp_btf
ok    probe net:netif_receive_skb            attached as tp_btf
ok    probe skb:kfree_skb                    attached as tp_btf
ok    probe tcp:tcp_retransmit_skb           attached as tp_btf
ok    sampler Go on-CPU                      attached to 2 CPUs' clocks at 99 Hz
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
        // A network program refused as tp_btf and attached as its classic fallback.
        let fell_back = CHECK_OK.replace(
            "net:net_dev_start_xmit           attached as tp_btf",
            "net:net_dev_start_xmit           attached as tracepoint (tp_btf failed: …)",
        );
        let e = judge(Expect::CheckAllTpBtf, 0, &fell_back).unwrap_err();
        assert!(format!("{e}").contains("net_dev_start_xmit"), "{e}");
        // The Go sampler refused its perf events: a warning, and not what the guest must show.
        let no_sampler = CHECK_OK.replace(
            "ok    sampler Go on-CPU                      attached to 2 CPUs' clocks at 99 Hz",
            "warn  sampler Go on-CPU                      not attached: EACCES",
        );
        let e = judge(Expect::CheckAllTpBtf, 0, &no_sampler).unwrap_err();
        assert!(format!("{e}").contains("sampler Go on-CPU"), "{e}");
        let e = judge(
            Expect::CheckAllTpBtf,
            0,
            &CHECK_OK.replace("ok    sampler Go on-CPU", "ok    sampler X"),
        )
        .unwrap_err();
        assert!(
            format!("{e}").contains("no `sampler Go on-CPU` line"),
            "{e}"
        );
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
}
