//! `stormwatch check`: can the agent work on this host? One line per requirement, then a
//! verdict; the exit status is non-zero when it cannot.

use std::fmt::Write as _;

use crate::{
    identity::find_v2_root,
    privileges,
    probes::{LoadOptions, Probes, btf::VMLINUX_BTF, tracefs},
};

use super::CheckArgs;

#[derive(Clone, Copy, PartialEq, Eq)]
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

/// Runs the checks, prints them, returns whether the agent can work.
pub fn run(args: &CheckArgs) -> bool {
    let mut lines = Vec::new();
    let mut add = |level, what: &str, detail: String| {
        lines.push(Line {
            level,
            what: what.to_owned(),
            detail,
        })
    };

    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned());
    add(Level::Ok, "kernel", release);

    let caps = privileges::effective_caps();
    let mut privileged = match privileges::check(&caps) {
        Ok(()) => {
            add(
                Level::Ok,
                "privileges",
                "CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN)".into(),
            );
            true
        }
        Err(e) => {
            add(Level::Fail, "privileges", e.to_string());
            false
        }
    };

    // With the capabilities, a seccomp filter (a container runtime's default profile) may
    // still refuse the syscalls: name it, since the loader would only say EPERM.
    let seccomp = privileges::seccomp(&caps);
    match seccomp.refusal() {
        Some(refusal) => {
            add(Level::Fail, "seccomp", refusal.to_string());
            privileged = false;
        }
        None => add(Level::Ok, "seccomp", seccomp.describe()),
    }

    match std::fs::metadata(VMLINUX_BTF) {
        Ok(_) => add(Level::Ok, "BTF", VMLINUX_BTF.into()),
        Err(e) => add(
            Level::Warn,
            "BTF",
            format!("{VMLINUX_BTF}: {e}; classic tracepoints only"),
        ),
    }

    match find_v2_root() {
        Ok(root) => add(Level::Ok, "cgroup v2", root.display().to_string()),
        Err(e) => add(Level::Fail, "cgroup v2", e.to_string()),
    }

    tracefs::ensure_mounted();
    match tracefs::root() {
        Some(root) => add(Level::Ok, "tracefs", root.display().to_string()),
        None => add(
            Level::Warn,
            "tracefs",
            "not mounted; classic tracepoint fallback unavailable".into(),
        ),
    }
    for tp in [
        crate::probes::sched::SWITCH,
        crate::probes::sched::WAKEUP,
        crate::probes::sched::WAKEUP_NEW,
    ] {
        let (cat, name) = tp.split_once(':').expect("category:event");
        if tracefs::tracepoint_exists(cat, name) {
            add(Level::Ok, &format!("tracepoint {tp}"), "exists".into());
        } else {
            add(
                Level::Warn,
                &format!("tracepoint {tp}"),
                "not found in tracefs".into(),
            );
        }
    }

    // The real test of program types: load and attach every probe, then detach.
    let mut attached_any = false;
    if privileged {
        let options = LoadOptions {
            force_tracepoints: args.force_tracepoints,
            ..LoadOptions::default()
        };
        match Probes::load(&options) {
            Ok(probes) => {
                for s in &probes.status {
                    match s.kind {
                        Some(kind) => {
                            attached_any = true;
                            let detail = match &s.note {
                                Some(note) => format!("attached as {kind} ({note})"),
                                None => format!("attached as {kind}"),
                            };
                            add(Level::Ok, &format!("probe {}", s.tracepoint), detail)
                        }
                        None => add(
                            Level::Warn,
                            &format!("probe {}", s.tracepoint),
                            format!(
                                "not attached: {}",
                                s.note.as_deref().unwrap_or("unknown reason")
                            ),
                        ),
                    }
                }
            }
            Err(e) => add(
                Level::Fail,
                "probes",
                format!("{:#}", anyhow::Error::from(e)),
            ),
        }
    } else {
        add(
            Level::Fail,
            "probes",
            "not tried: fix the privileges or seccomp first".into(),
        );
    }

    let can_work = privileged && attached_any && !lines.iter().any(|l| l.level == Level::Fail);
    let mut out = String::new();
    for l in &lines {
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
        (true, true) => "stormwatch can run here, without the probes marked warn",
        (false, _) => "stormwatch cannot run here: fix the lines marked FAIL",
    };
    let _ = writeln!(out, "verdict: {verdict}");
    print!("{out}");
    can_work
}
