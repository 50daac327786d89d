//! Another stormwatch on this node. Two agents attach every probe twice: every context switch,
//! wake-up and packet pays for both, and neither knows. Probes are node-wide whatever namespace
//! an agent runs in, so this looks node-wide too, two ways:
//!
//! - the kernel's list of BPF maps (`BPF_MAP_GET_NEXT_ID`, which needs `CAP_SYS_ADMIN`): an
//!   agent that loaded its probes holds one `CGROUP_SCHED`, `CGROUP_FUTEX` and `CGROUP_LOCKS`
//!   map each, whatever it attached, for as long as it runs (maps are freed with the last
//!   descriptor; the agent pins nothing);
//! - the processes this agent can see (`/proc`: the host's with the host's PID namespace, a
//!   DaemonSet pod's with `hostPID`): a `stormwatch` running `run`, `trace` or `diagnose`.
//!
//! Neither is complete on its own (a pod with only CAP_BPF and CAP_PERFMON and its own PID
//! namespace sees neither), so the finding says what it could look at.

use std::collections::BTreeSet;

use stormwatch_common::maps;

/// The maps that every loaded stormwatch object has, one each.
const SIGNATURE: [&str; 3] = [maps::CGROUP_SCHED, maps::CGROUP_FUTEX, maps::CGROUP_LOCKS];

/// Subcommands that keep probes attached.
const ATTACHING: [&str; 3] = ["run", "trace", "diagnose"];

/// What was found of other agents.
#[derive(Debug, Default, PartialEq)]
pub struct OtherAgents {
    /// Loaded stormwatch objects in the kernel (not this process's: looked at before loading),
    /// `None` where the kernel's map list cannot be read.
    pub loaded: Option<usize>,
    /// Other `stormwatch` processes that attach probes: pid and command line.
    pub processes: Vec<(u32, String)>,
}

impl OtherAgents {
    /// Looks now; call before this process loads its own probes.
    pub fn find() -> Self {
        Self {
            loaded: loaded_objects(),
            processes: processes(std::process::id()),
        }
    }

    /// Whether another agent was found.
    pub fn any(&self) -> bool {
        self.loaded.is_some_and(|n| n > 0) || !self.processes.is_empty()
    }

    /// One sentence: what was found, or that nothing was and where it looked.
    pub fn describe(&self) -> String {
        let procs: Vec<String> = self
            .processes
            .iter()
            .map(|(pid, cmd)| format!("pid {pid} `{cmd}`"))
            .collect();
        match (self.loaded, procs.is_empty()) {
            (Some(0), true) => "none (the kernel's BPF maps and /proc looked at)".to_owned(),
            (None, true) => "none seen in /proc (the kernel's BPF maps need CAP_SYS_ADMIN to \
                             list: an agent in another PID namespace would not be seen)"
                .to_owned(),
            (Some(n), true) => format!(
                "{n} other stormwatch probe set(s) loaded in the kernel (their processes are \
                 not visible here): {} agents pay for the same probes",
                n + 1
            ),
            (loaded, false) => {
                let n = loaded.unwrap_or(0).max(procs.len());
                format!(
                    "{}: {} agents pay for the same probes",
                    procs.join(", "),
                    n + 1
                )
            }
        }
    }
}

/// How many stormwatch objects are loaded: the fewest of the signature maps found by name.
fn loaded_objects() -> Option<usize> {
    let mut counts = [0_usize; SIGNATURE.len()];
    for info in aya::maps::loaded_maps() {
        // The first error is EPERM without CAP_SYS_ADMIN: the list cannot be read.
        let info = info.ok()?;
        if let Some(i) = info
            .name_as_str()
            .and_then(|name| SIGNATURE.iter().position(|s| *s == name))
        {
            counts[i] += 1;
        }
    }
    counts.into_iter().min()
}

/// Other visible `stormwatch` processes that attach probes (not `own`).
fn processes(own: u32) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let pids: BTreeSet<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|pid| *pid != own)
        .collect();
    pids.into_iter()
        .filter_map(|pid| {
            let comm = crate::files::kernel_text(format!("/proc/{pid}/comm"))?;
            if comm.trim_end() != "stormwatch" {
                return None;
            }
            let cmdline = crate::files::kernel_bytes(format!("/proc/{pid}/cmdline"))?;
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            attaches(&args).then(|| (pid, args.join(" ")))
        })
        .collect()
}

/// Whether a stormwatch command line keeps probes attached: its subcommand is one that does
/// (global flags such as `--log-level info` may come first).
fn attaches(args: &[String]) -> bool {
    let mut rest = args.iter().skip(1);
    while let Some(arg) = rest.next() {
        if arg == "--log-level" {
            rest.next();
        } else if !arg.starts_with('-') {
            return ATTACHING.contains(&arg.as_str());
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_owned).collect()
    }

    #[test]
    fn subcommands_that_attach_are_told_from_the_rest() {
        assert!(attaches(&args("stormwatch run --listen 127.0.0.1:1")));
        assert!(attaches(&args(
            "/usr/bin/stormwatch --log-level info diagnose"
        )));
        assert!(attaches(&args("stormwatch trace --json")));
        assert!(!attaches(&args("stormwatch check")));
        assert!(!attaches(&args("stormwatch run-something")));
        assert!(!attaches(&args("stormwatch --help")));
    }

    #[test]
    fn the_description_says_what_was_looked_at() {
        let none = OtherAgents {
            loaded: Some(0),
            processes: vec![],
        };
        assert!(!none.any());
        assert!(none.describe().starts_with("none"));
        let blind = OtherAgents {
            loaded: None,
            processes: vec![],
        };
        assert!(!blind.any());
        assert!(
            blind.describe().contains("CAP_SYS_ADMIN"),
            "{}",
            blind.describe()
        );
        let one = OtherAgents {
            loaded: Some(1),
            processes: vec![(42, "stormwatch run".into())],
        };
        assert!(one.any());
        assert_eq!(
            one.describe(),
            "pid 42 `stormwatch run`: 2 agents pay for the same probes"
        );
        let hidden = OtherAgents {
            loaded: Some(1),
            processes: vec![],
        };
        assert!(hidden.any());
        assert!(
            hidden.describe().contains("2 agents"),
            "{}",
            hidden.describe()
        );
    }
}
