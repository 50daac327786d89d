//! `stormwatch check`: can the agent work on this host? One line per requirement and per probe,
//! then what the diagnosis loses with the probes that are missing, then a verdict; the exit
//! status is non-zero when it cannot work, or when the lock-storm diagnosis cannot run.

use std::fmt::Write as _;

use crate::{
    collect::Availability,
    identity::find_v2_root,
    privileges,
    probes::{
        AttachKind, KernelFacts, LoadError, LoadOptions, ProbeStatus, Probes, futex, sched, tracefs,
    },
};

use super::CheckArgs;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    Ok,
    Warn,
    Fail,
}

struct Line {
    level: Level,
    what: String,
    detail: String,
}

/// What the agent cannot do without some probes: the figures and the rules they feed.
#[derive(Debug, PartialEq)]
pub struct Loss {
    /// The figures that are missing (null in every report).
    pub figures: &'static str,
    /// The probes they need, as `check` names them.
    pub needs: &'static str,
    /// The diagnosis rules that cannot run (or run without this evidence).
    pub rules: &'static [&'static str],
    /// Whether the lock-storm diagnosis, what the agent is for, cannot run without them.
    pub essential: bool,
}

/// What is lost with the probes `avail` says are missing; `task_offsets`: whether the BTF gave
/// the `task_struct` offsets (the thread's own switch counters and runtime).
pub fn losses(avail: &Availability, task_offsets: bool) -> Vec<Loss> {
    let mut out = Vec::new();
    if avail.switch && !task_offsets {
        out.push(Loss {
            figures: "the kernel's own switch counts and on-CPU time (nvcsw, nivcsw, \
                      se.sum_exec_runtime): switches are told voluntary or not from the \
                      tracepoint's prev_state, on-CPU time is the clock's (with time the \
                      hypervisor stole)",
            needs: "the task_struct offsets of the kernel's BTF (--btf FILE)",
            rules: &[],
            essential: false,
        });
    }
    if !avail.switch {
        out.push(Loss {
            figures: "context switches, on-CPU time, migrations",
            needs: sched::SWITCH,
            rules: &["lock_storm", "thread_oversubscription", "runtime_sizing"],
            essential: true,
        });
    }
    if !avail.wakeup {
        out.push(Loss {
            figures: "run-queue latency, off-CPU time",
            needs: "sched:sched_switch (tp_btf with sched_info), else sched:sched_wakeup and \
                    sched:sched_wakeup_new",
            rules: &[
                "lock_storm",
                "runqueue_saturation",
                "thread_oversubscription",
                "runtime_sizing",
            ],
            essential: true,
        });
    }
    if !avail.futex {
        out.push(Loss {
            figures: "futex waits, wakes, hand-offs and hot futex words",
            needs: "syscalls:sys_enter_futex and syscalls:sys_exit_futex",
            rules: &["lock_storm", "runtime_sizing"],
            essential: true,
        });
    }
    if avail.switch && !avail.wake_kinds {
        out.push(Loss {
            figures: "wake-ups told local or remote",
            needs: "sched:sched_waking, sched:sched_wakeup and sched:sched_wakeup_new as tp_btf",
            rules: &[],
            essential: false,
        });
    }
    if avail.wakeup && !avail.runq_blame {
        out.push(Loss {
            figures: "run-queue waits blamed on what held the CPU (runqueue_saturation names \
                      the busiest neighbour by CPU use instead)",
            needs: "sched:sched_switch as tp_btf, with sched_info.last_queued and the task's \
                    cgroup in BTF",
            rules: &[],
            essential: false,
        });
    }
    if !avail.locks {
        out.push(Loss {
            figures: "kernel lock contention by kind and call site",
            needs: "lock:contention_begin and lock:contention_end",
            rules: &[],
            essential: false,
        });
    }
    let net = &avail.net;
    if !(net.cgroup && net.tx && net.rx && net.drops && net.tcp_retransmits) {
        out.push(Loss {
            figures: if net.any() {
                "part of the network figures (see the net probes above)"
            } else {
                "network figures: per-container traffic, packets against the MTU, drops, \
                 retransmits"
            },
            needs: "the net and skb probes",
            rules: if net.any() { &[] } else { &["mtu_mismatch"] },
            essential: false,
        });
    }
    out
}

fn add(lines: &mut Vec<Line>, level: Level, what: &str, detail: String) {
    lines.push(Line {
        level,
        what: what.to_owned(),
        detail,
    })
}

/// Runs the checks, prints them, returns whether the agent can work here.
pub fn run(args: &CheckArgs) -> bool {
    let mut lines = Vec::new();
    let host = check_host(&mut lines, args);
    let attached_any = check_probes(&mut lines, args, &host);
    report(&lines, host.privileged && attached_any)
}

/// What the host checks found that the probes' check needs.
struct HostChecks {
    privileged: bool,
    task_offsets: bool,
    /// The index of the BTF's line (replaced when the loader refuses the file).
    btf_line: usize,
}

/// The kernel, the privileges and seccomp, the BTF, cgroup v2, tracefs and the scheduler's
/// tracepoints.
fn check_host(lines: &mut Vec<Line>, args: &CheckArgs) -> HostChecks {
    let release = crate::files::kernel_text("/proc/sys/kernel/osrelease")
        .map_or_else(|| "unknown".to_owned(), |s| s.trim().to_owned());
    add(lines, Level::Ok, "kernel", release);

    let caps = privileges::effective_caps();
    let mut privileged = match privileges::check(&caps) {
        Ok(()) => {
            add(
                lines,
                Level::Ok,
                "privileges",
                "CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN)".into(),
            );
            true
        }
        Err(e) => {
            add(lines, Level::Fail, "privileges", e.to_string());
            false
        }
    };

    // With the capabilities, a seccomp filter (a container runtime's default profile) may
    // still refuse the syscalls: name it, since the loader would only say EPERM.
    let seccomp = privileges::seccomp(&caps);
    match seccomp.refusal() {
        Some(refusal) => {
            add(lines, Level::Fail, "seccomp", refusal.to_string());
            privileged = false;
        }
        None => add(lines, Level::Ok, "seccomp", seccomp.describe()),
    }

    // The BTF the probes will use, read and checked as the loader reads it.
    let facts = KernelFacts::probe(args.btf.as_deref());
    let task_offsets = facts.task_offsets;
    let btf_line = lines.len();
    match (&facts.btf_error, facts.btf_external) {
        (None, _) => add(
            lines,
            Level::Ok,
            "BTF",
            format!(
                "{} ({} types{})",
                facts.btf_path.display(),
                facts.btf.as_ref().map_or(0, |b| b.type_count()),
                if facts.btf_external {
                    ", given with --btf"
                } else {
                    ""
                }
            ),
        ),
        // A file the user named must be usable: the probes are not loaded without it.
        (Some(why), true) => add(lines, Level::Fail, "BTF", why.clone()),
        (Some(why), false) => add(
            lines,
            Level::Warn,
            "BTF",
            format!(
                "{why}: no tp_btf probes and no struct offsets (the probes below say what that \
                 costs; --btf FILE gives this kernel's BTF from elsewhere)"
            ),
        ),
    }
    drop(facts);

    match find_v2_root() {
        Ok(root) => add(lines, Level::Ok, "cgroup v2", root.display().to_string()),
        Err(e) => add(lines, Level::Fail, "cgroup v2", e.to_string()),
    }

    tracefs::ensure_mounted();
    match tracefs::root() {
        Some(root) => add(lines, Level::Ok, "tracefs", root.display().to_string()),
        None => add(
            lines,
            Level::Warn,
            "tracefs",
            "not mounted; classic tracepoint fallback unavailable".into(),
        ),
    }
    for tp in [sched::SWITCH, sched::WAKEUP, sched::WAKEUP_NEW] {
        let (cat, name) = tp.split_once(':').expect("category:event");
        if tracefs::tracepoint_exists(cat, name) {
            add(
                lines,
                Level::Ok,
                &format!("tracepoint {tp}"),
                "exists".into(),
            );
        } else {
            add(
                lines,
                Level::Warn,
                &format!("tracepoint {tp}"),
                "not found in tracefs".into(),
            );
        }
    }

    // Before this process loads its own probes, which would count as one.
    let others = crate::probes::neighbours::OtherAgents::find();
    add(
        lines,
        if others.any() { Level::Warn } else { Level::Ok },
        "other agents",
        others.describe(),
    );

    HostChecks {
        privileged,
        task_offsets,
        btf_line,
    }
}

/// Loads and attaches every probe, then detaches them: the real test of the program types;
/// what the diagnosis loses without those that fail. Returns whether any attached.
fn check_probes(lines: &mut Vec<Line>, args: &CheckArgs, host: &HostChecks) -> bool {
    let (privileged, task_offsets, btf_line) = (host.privileged, host.task_offsets, host.btf_line);
    let mut attached_any = false;
    if privileged {
        let options = LoadOptions {
            force_tracepoints: args.force_tracepoints,
            btf_file: args.btf.clone(),
            ..LoadOptions::default()
        };
        match Probes::load(&options) {
            Ok(probes) => {
                let avail = Availability {
                    runq_blame: probes.can_blame_runqueue(),
                    ..Availability::from_status(&probes.status, probes.waits_from_switch)
                };
                let essential = essential_probes(probes.waits_from_switch);
                for s in &probes.status {
                    attached_any |= s.attached();
                    let level = match s.kind {
                        Some(_) => Level::Ok,
                        None if essential.contains(&s.tracepoint) => Level::Fail,
                        None => Level::Warn,
                    };
                    add(
                        lines,
                        level,
                        &format!("probe {}", s.tracepoint),
                        describe(s),
                    );
                }
                // The Go storm's cost: perf events on each CPU's clock, which a seccomp
                // profile or `perf_event_paranoid` may refuse where tracepoints attach.
                match probes.families().go_mutex.cpu.outcome() {
                    Some(Ok(cpus)) => add(
                        lines,
                        Level::Ok,
                        "sampler Go on-CPU",
                        format!(
                            "attached to {cpus} CPUs' clocks at {} Hz",
                            stormwatch_common::GO_ONCPU_HZ
                        ),
                    ),
                    Some(Err(why)) => add(
                        lines,
                        Level::Warn,
                        "sampler Go on-CPU",
                        format!(
                            "not attached: {why}; a Go mutex's queue is then at most a \
                             possible lock storm (its CPU cost unknown)"
                        ),
                    ),
                    None => {}
                }
                let lost = losses(&avail, task_offsets);
                if lost.is_empty() {
                    add(
                        lines,
                        Level::Ok,
                        "diagnosis",
                        "every figure and every rule has its probes".into(),
                    );
                }
                for l in &lost {
                    let rules = if l.rules.is_empty() {
                        String::new()
                    } else {
                        format!("; rules without them: {}", l.rules.join(", "))
                    };
                    add(
                        lines,
                        if l.essential {
                            Level::Fail
                        } else {
                            Level::Warn
                        },
                        "lost",
                        format!("{} (needs {}){rules}", l.figures, l.needs),
                    );
                }
            }
            Err(LoadError::Btf(why)) => {
                lines[btf_line] = Line {
                    level: Level::Fail,
                    what: "BTF".into(),
                    detail: why,
                };
                add(
                    lines,
                    Level::Fail,
                    "probes",
                    "not loaded: the BTF file is refused".into(),
                );
            }
            Err(e) => add(
                lines,
                Level::Fail,
                "probes",
                format!("{:#}", anyhow::Error::from(e)),
            ),
        }
    } else {
        add(
            lines,
            Level::Fail,
            "probes",
            "not tried: fix the privileges or seccomp first".into(),
        );
    }

    attached_any
}

/// Prints every line and the verdict; whether stormwatch can run here.
fn report(lines: &[Line], privileged_and_attached: bool) -> bool {
    let failed = lines.iter().any(|l| l.level == Level::Fail);
    let can_work = privileged_and_attached && !failed;
    let mut out = String::new();
    for l in lines {
        let tag = match l.level {
            Level::Ok => "ok  ",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        };
        let _ = writeln!(out, "{tag}  {:<38} {}", l.what, l.detail);
    }
    let degraded = lines.iter().any(|l| l.level == Level::Warn);
    let verdict = match (can_work, degraded) {
        (true, false) => "stormwatch can run here with every probe",
        (true, true) => "stormwatch can run here, without what is marked warn",
        (false, _) => "stormwatch cannot run here: fix the lines marked FAIL",
    };
    let _ = writeln!(out, "verdict: {verdict}");
    print!("{out}");
    can_work
}

/// The probes without which the lock-storm diagnosis cannot run: the switch, the futex calls,
/// and the wake-ups where they time the waits (not where `sched_switch` does, with
/// `sched_info`).
fn essential_probes(waits_from_switch: bool) -> Vec<&'static str> {
    let mut out = vec![sched::SWITCH, futex::ENTER, futex::EXIT];
    if !waits_from_switch {
        out.extend([sched::WAKEUP, sched::WAKEUP_NEW]);
    }
    out
}

/// A probe's line: how it is attached and, when not as tp_btf, why; or why it is not.
fn describe(s: &ProbeStatus) -> String {
    match (s.kind, &s.note) {
        (Some(kind), None) => format!("attached as {kind}"),
        (Some(AttachKind::TpBtf), Some(note)) => format!("attached as tp_btf ({note})"),
        (Some(kind), Some(note)) => format!("attached as {kind} ({note})"),
        (None, note) => format!(
            "not attached: {}",
            note.as_deref().unwrap_or("unknown reason")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_lost_with_every_probe() {
        assert!(losses(&Availability::ALL, true).is_empty());
    }

    #[test]
    fn the_storm_diagnosis_is_lost_without_the_switch_or_the_futex_calls() {
        let without_switch = Availability {
            switch: false,
            wakeup: false,
            wake_kinds: false,
            ..Availability::ALL
        };
        let lost = losses(&without_switch, true);
        assert!(lost.iter().any(|l| l.essential && l.needs == sched::SWITCH));
        assert!(
            lost.iter()
                .filter(|l| l.essential)
                .all(|l| l.rules.contains(&"lock_storm")),
            "{lost:?}"
        );
        // The wake kinds are not listed apart from the switch they need.
        assert!(!lost.iter().any(|l| l.figures.contains("local or remote")));

        let without_futex = Availability {
            futex: false,
            ..Availability::ALL
        };
        let lost = losses(&without_futex, true);
        assert_eq!(lost.len(), 1, "{lost:?}");
        assert!(lost[0].essential && lost[0].rules.contains(&"lock_storm"));
    }

    #[test]
    fn classic_tracepoints_lose_only_what_needs_tp_btf() {
        // A kernel whose BTF the agent cannot read: the scheduler and futex probes classic,
        // the network probes (which need struct offsets) missing.
        let classic = Availability {
            wake_kinds: false,
            net: Default::default(),
            runq_blame: false,
            ..Availability::ALL
        };
        let lost = losses(&classic, false);
        assert!(lost.iter().all(|l| !l.essential), "{lost:?}");
        assert_eq!(lost.len(), 4, "{lost:?}");
        assert!(lost.iter().any(|l| l.rules == ["mtu_mismatch"]));
        assert!(lost.iter().any(|l| l.figures.contains("prev_state")));
        assert!(lost.iter().any(|l| l.figures.contains("blamed")));
        // With the offsets (classic tracepoints forced on a kernel with BTF), the switch
        // counts are the kernel's own.
        assert_eq!(losses(&classic, true).len(), 3);
    }

    #[test]
    fn a_probe_line_never_says_attached_and_failed() {
        let fell_back = ProbeStatus {
            tracepoint: sched::WAKEUP,
            kind: Some(AttachKind::Tracepoint),
            note: Some("as sched_switch: no tp_btf: /x: not a BTF blob".into()),
        };
        assert_eq!(
            describe(&fell_back),
            "attached as tracepoint (as sched_switch: no tp_btf: /x: not a BTF blob)"
        );
        let missing = ProbeStatus {
            tracepoint: sched::WAKEUP,
            kind: None,
            note: Some("needs sched:sched_switch, which is not attached".into()),
        };
        assert!(describe(&missing).starts_with("not attached: "));
        assert!(essential_probes(false).contains(&sched::WAKEUP));
        assert!(!essential_probes(true).contains(&sched::WAKEUP));
    }
}
