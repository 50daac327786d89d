//! What the agent needs from the kernel's permission checks, and naming what is missing:
//! capabilities, and a seccomp filter that lets `bpf(2)` and `perf_event_open(2)` through.

use caps::{CapSet, Capability, CapsHashSet};
use thiserror::Error;

#[derive(Debug, Error)]
#[error("stormwatch needs CAP_BPF and CAP_PERFMON (or root); missing: {}", .missing.join(", "))]
pub struct MissingCapabilities {
    pub missing: Vec<&'static str>,
}

/// Why the probes cannot be loaded, found before the loader fails deep inside with an EPERM.
#[derive(Debug, Error)]
pub enum Refused {
    #[error(transparent)]
    Capabilities(#[from] MissingCapabilities),
    #[error("{0}")]
    Seccomp(SeccompRefusal),
}

/// The effective capability set (capget(2)); empty when it cannot be read.
pub fn effective_caps() -> CapsHashSet {
    caps::read(None, CapSet::Effective).unwrap_or_default()
}

/// Checks a capability set: CAP_BPF and CAP_PERFMON (5.8+), or CAP_SYS_ADMIN alone, which
/// kernels before 5.8 require and later ones still accept.
pub fn check(caps: &CapsHashSet) -> Result<(), MissingCapabilities> {
    let has = |cap| caps.contains(&cap);
    if has(Capability::CAP_SYS_ADMIN) || (has(Capability::CAP_BPF) && has(Capability::CAP_PERFMON))
    {
        return Ok(());
    }
    let mut missing = Vec::new();
    if !has(Capability::CAP_BPF) {
        missing.push("CAP_BPF");
    }
    if !has(Capability::CAP_PERFMON) {
        missing.push("CAP_PERFMON");
    }
    Err(MissingCapabilities { missing })
}

/// Fails early, with what is missing, instead of an EPERM from deep inside the loader: the
/// capabilities first, then a seccomp filter that refuses the syscalls the capabilities allow.
pub fn require() -> Result<(), Refused> {
    let caps = effective_caps();
    check(&caps)?;
    match seccomp(&caps).refusal() {
        Some(r) => Err(Refused::Seccomp(r)),
        None => Ok(()),
    }
}

// ---- seccomp ---------------------------------------------------------------------------------

/// The process's seccomp state, from `Seccomp:` and `Seccomp_filters:` in /proc/self/status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeccompStatus {
    /// 0: none, 1: strict, 2: filter.
    pub mode: u32,
    /// Filters stacked on the process (kernel ≥ 5.9 shows the count).
    pub filters: Option<u32>,
}

pub fn parse_seccomp_status(status: &str) -> Option<SeccompStatus> {
    let field = |name: &str| {
        status.lines().find_map(|l| {
            let v = l.strip_prefix(name)?.strip_prefix(':')?;
            v.trim().parse::<u32>().ok()
        })
    };
    Some(SeccompStatus {
        mode: field("Seccomp")?,
        filters: field("Seccomp_filters"),
    })
}

/// A syscall the probes need, and the capability with which the kernel allows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syscall {
    /// Maps, programs, BTF, links: CAP_BPF.
    Bpf,
    /// The perf events classic tracepoints attach through: CAP_PERFMON.
    PerfEventOpen,
}

impl Syscall {
    pub const ALL: [Syscall; 2] = [Syscall::Bpf, Syscall::PerfEventOpen];

    pub fn name(self) -> &'static str {
        match self {
            Syscall::Bpf => "bpf",
            Syscall::PerfEventOpen => "perf_event_open",
        }
    }

    pub fn capability(self) -> Capability {
        match self {
            Syscall::Bpf => Capability::CAP_BPF,
            Syscall::PerfEventOpen => Capability::CAP_PERFMON,
        }
    }

    /// Calls the syscall with arguments the kernel itself refuses before any permission
    /// check — `bpf` with an unknown command (EINVAL), `perf_event_open` without an attribute
    /// (EFAULT) — so that nothing is created, and an EPERM (or ENOSYS, the usual default of a
    /// profile) can only come from a seccomp filter or an LSM in front of the kernel.
    /// Returns the errno.
    ///
    /// Raw `syscall(2)` on purpose: neither rustix nor nix wraps `bpf(2)` or
    /// `perf_event_open(2)`, and aya's wrappers are private to aya and only ever pass valid
    /// attributes, which would create the very objects this trial must not create.
    fn trial_errno(self) -> i32 {
        let ret = match self {
            // SAFETY: a null attribute of size 0: the kernel reads no memory, and an unknown
            // command creates nothing.
            Syscall::Bpf => unsafe {
                libc::syscall(
                    libc::SYS_bpf,
                    u32::MAX as libc::c_long,
                    std::ptr::null::<u8>(),
                    0u32,
                )
            },
            // SAFETY: a null attribute: the kernel fails to copy it (EFAULT) before it looks
            // at anything else; no event is created.
            Syscall::PerfEventOpen => unsafe {
                libc::syscall(
                    libc::SYS_perf_event_open,
                    std::ptr::null::<u8>(),
                    -1 as libc::c_int,
                    -1 as libc::c_int,
                    -1 as libc::c_int,
                    0 as libc::c_ulong,
                )
            },
        };
        if ret >= 0 {
            // Cannot happen with these arguments; a descriptor would be closed, but none is
            // ever returned. Treat as allowed.
            0
        } else {
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
        }
    }
}

/// How one syscall fared in the trial.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trial {
    pub syscall: Syscall,
    pub errno: i32,
    /// Whether the effective set holds the capability the kernel wants for it.
    pub has_capability: bool,
}

/// What stands in front of the kernel for the syscalls the probes need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeccompReport {
    pub status: Option<SeccompStatus>,
    pub trials: Vec<Trial>,
}

/// A syscall refused before the kernel's own checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blocker {
    /// The process has a seccomp filter: it is the cause.
    Seccomp,
    /// No seccomp filter: an LSM (SELinux, AppArmor, lockdown) refused it.
    Lsm,
}

/// The syscalls refused, and by what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeccompRefusal {
    pub blocker: Blocker,
    pub refused: Vec<Trial>,
}

/// Where the profile that allows the probes' syscalls is shipped.
pub const LOCALHOST_PROFILE: &str = "deploy/seccomp/stormwatch.json";

impl std::fmt::Display for SeccompRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what: Vec<String> = self
            .refused
            .iter()
            .map(|t| {
                let errno = match t.errno {
                    libc::EPERM => "EPERM".to_owned(),
                    libc::EACCES => "EACCES".to_owned(),
                    libc::ENOSYS => "ENOSYS".to_owned(),
                    e => std::io::Error::from_raw_os_error(e).to_string(),
                };
                format!(
                    "{} ({errno}) although the process holds {}",
                    t.syscall.name(),
                    t.syscall.capability()
                )
            })
            .collect();
        let what = what.join(" and ");
        match self.blocker {
            Blocker::Seccomp => write!(
                f,
                "the process's seccomp filter refuses {what}: the container runtime's default \
                 profile allows them only with CAP_SYS_ADMIN (as containers-common 0.50's does: \
                 Debian 12's podman, CRI-O of that lineage, containerd before 1.7). Fix: run \
                 the pod with the Localhost seccomp profile {LOCALHOST_PROFILE} (the runtime \
                 default plus exactly bpf and perf_event_open) installed on the node, or on a \
                 runtime whose default allows bpf to CAP_BPF and perf_event_open to \
                 CAP_PERFMON holders (containerd >= 1.7)"
            ),
            Blocker::Lsm => write!(
                f,
                "{what} refused before the kernel's own checks, and not by seccomp (the \
                 process has no filter): an LSM (SELinux, AppArmor, lockdown) refuses them; \
                 see the audit log"
            ),
        }
    }
}

impl SeccompReport {
    /// Whether something in front of the kernel refuses a syscall, and what. The trial calls
    /// are ones the kernel answers with EINVAL/EFAULT, so EPERM, EACCES or ENOSYS is a refusal
    /// by a filter — a seccomp filter when the process has one (the usual errnos of runtime
    /// profiles are EPERM and ENOSYS), an LSM otherwise. Only for syscalls whose capability
    /// the process holds: without it, kernels before 6.4 answer `bpf` with EPERM themselves
    /// (`unprivileged_bpf_disabled`), and the missing capability is the cause to name.
    pub fn refusal(&self) -> Option<SeccompRefusal> {
        let refused: Vec<Trial> = self
            .trials
            .iter()
            .filter(|t| t.has_capability)
            .filter(|t| matches!(t.errno, libc::EPERM | libc::EACCES | libc::ENOSYS))
            .copied()
            .collect();
        if refused.is_empty() {
            return None;
        }
        let filtered = self.status.is_some_and(|s| s.mode != 0);
        Some(SeccompRefusal {
            blocker: if filtered {
                Blocker::Seccomp
            } else {
                Blocker::Lsm
            },
            refused,
        })
    }

    /// The state in one line, for `stormwatch check`.
    pub fn describe(&self) -> String {
        match self.status {
            None => "Seccomp: not in /proc/self/status".into(),
            Some(SeccompStatus { mode: 0, .. }) => "no seccomp filter".into(),
            Some(s) => {
                let filters = s
                    .filters
                    .map(|n| format!(" ({n} filter{})", if n == 1 { "" } else { "s" }))
                    .unwrap_or_default();
                let mode = if s.mode == 1 { "strict" } else { "filter" };
                let reached = self
                    .trials
                    .iter()
                    .all(|t| !matches!(t.errno, libc::EPERM | libc::EACCES | libc::ENOSYS));
                let verdict = if reached {
                    "bpf and perf_event_open reach the kernel"
                } else {
                    "whether it lets bpf and perf_event_open through cannot be told without \
                     the capabilities"
                };
                format!("seccomp {mode} mode{filters}; {verdict}")
            }
        }
    }
}

/// The process's seccomp state and a harmless trial of each syscall the probes need.
pub fn seccomp(caps: &CapsHashSet) -> SeccompReport {
    let status =
        crate::files::kernel_text("/proc/self/status").and_then(|s| parse_seccomp_status(&s));
    let trials = Syscall::ALL
        .iter()
        .map(|&syscall| Trial {
            syscall,
            errno: syscall.trial_errno(),
            has_capability: caps.contains(&syscall.capability())
                || caps.contains(&Capability::CAP_SYS_ADMIN),
        })
        .collect();
    SeccompReport { status, trials }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(caps: &[Capability]) -> CapsHashSet {
        caps.iter().copied().collect()
    }

    #[test]
    fn names_what_is_missing() {
        use Capability::{CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN};
        assert!(check(&set(&[CAP_BPF, CAP_PERFMON])).is_ok());
        assert!(check(&set(&[CAP_SYS_ADMIN])).is_ok());
        assert_eq!(
            check(&set(&[CAP_BPF])).unwrap_err().missing,
            ["CAP_PERFMON"]
        );
        assert_eq!(
            check(&set(&[CAP_PERFMON])).unwrap_err().missing,
            ["CAP_BPF"]
        );
        let none = check(&set(&[])).unwrap_err();
        assert_eq!(
            none.to_string(),
            "stormwatch needs CAP_BPF and CAP_PERFMON (or root); missing: CAP_BPF, CAP_PERFMON"
        );
    }

    #[test]
    fn parses_seccomp_status() {
        let status = "Name:\tx\nSeccomp:\t2\nSeccomp_filters:\t1\nSpeculation_Store_Bypass:\tx\n";
        assert_eq!(
            parse_seccomp_status(status),
            Some(SeccompStatus {
                mode: 2,
                filters: Some(1)
            })
        );
        // Kernels before 5.9 have no filter count.
        assert_eq!(
            parse_seccomp_status("Seccomp:\t0\n"),
            Some(SeccompStatus {
                mode: 0,
                filters: None
            })
        );
        assert_eq!(parse_seccomp_status("Name:\tx\n"), None);
    }

    fn report(mode: u32, bpf_errno: i32, perf_errno: i32, has_caps: bool) -> SeccompReport {
        SeccompReport {
            status: Some(SeccompStatus {
                mode,
                filters: Some(u32::from(mode == 2)),
            }),
            trials: vec![
                Trial {
                    syscall: Syscall::Bpf,
                    errno: bpf_errno,
                    has_capability: has_caps,
                },
                Trial {
                    syscall: Syscall::PerfEventOpen,
                    errno: perf_errno,
                    has_capability: has_caps,
                },
            ],
        }
    }

    #[test]
    fn diagnoses_who_refuses() {
        use libc::{EFAULT, EINVAL, ENOSYS, EPERM};
        // (mode, bpf errno, perf_event_open errno, caps) → (blocker, refused syscalls)
        type Want = Option<(Blocker, &'static [&'static str])>;
        let cases: &[(u32, i32, i32, bool, Want)] = &[
            // The kernel's own answers to the trial calls: nothing in front.
            (0, EINVAL, EFAULT, true, None),
            (2, EINVAL, EFAULT, true, None),
            // Debian podman / CRI-O default profile: both need CAP_SYS_ADMIN there.
            (
                2,
                EPERM,
                EPERM,
                true,
                Some((Blocker::Seccomp, &["bpf", "perf_event_open"])),
            ),
            // A profile whose default action answers ENOSYS.
            (2, ENOSYS, EFAULT, true, Some((Blocker::Seccomp, &["bpf"]))),
            (
                2,
                EINVAL,
                EPERM,
                true,
                Some((Blocker::Seccomp, &["perf_event_open"])),
            ),
            // No filter, yet refused before the kernel's checks: an LSM.
            (0, EPERM, EFAULT, true, Some((Blocker::Lsm, &["bpf"]))),
            // Without the capability the kernel may answer EPERM itself: not diagnosed here
            // (the missing capability is named instead).
            (2, EPERM, EPERM, false, None),
        ];
        for &(mode, bpf, perf, caps, ref want) in cases {
            let got = report(mode, bpf, perf, caps).refusal();
            let got = got.map(|r| {
                let names: Vec<&str> = r.refused.iter().map(|t| t.syscall.name()).collect();
                (r.blocker, names)
            });
            let want = want.map(|(b, names)| (b, names.to_vec()));
            assert_eq!(got, want, "mode {mode}, errnos {bpf}/{perf}");
        }
    }

    #[test]
    fn the_seccomp_diagnosis_names_cause_and_fix() {
        let r = report(2, libc::EPERM, libc::EFAULT, true)
            .refusal()
            .unwrap();
        let text = r.to_string();
        for want in [
            "seccomp filter refuses bpf",
            "bpf (EPERM) although the process holds CAP_BPF",
            LOCALHOST_PROFILE,
            "containerd >= 1.7",
        ] {
            assert!(text.contains(want), "{want:?} in {text}");
        }
        assert!(!text.contains("perf_event_open (")); // only what was refused
        let lsm = report(0, libc::EPERM, libc::EFAULT, true)
            .refusal()
            .unwrap();
        assert!(lsm.to_string().contains("LSM"), "{lsm}");
        assert!(!lsm.to_string().contains(LOCALHOST_PROFILE), "{lsm}");
    }

    #[test]
    fn the_trial_calls_reach_the_kernel_here() {
        // Whatever the privileges, the kernel answers the trial calls itself (EINVAL, EFAULT)
        // when nothing filters them; test runners have no seccomp filter.
        let r = seccomp(&effective_caps());
        assert_eq!(
            r.status.map(|s| s.mode),
            Some(0),
            "premise: the unit tests run without a seccomp filter"
        );
        let errnos: Vec<i32> = r.trials.iter().map(|t| t.errno).collect();
        assert_eq!(errnos, [libc::EINVAL, libc::EFAULT]);
        assert_eq!(r.refusal(), None, "{r:?}");
    }
}
