//! What the agent needs from the kernel's permission checks, and naming what is missing.

use thiserror::Error;

pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

#[derive(Debug, Error)]
#[error("stormwatch needs CAP_BPF and CAP_PERFMON (or root); missing: {}", .missing.join(", "))]
pub struct MissingCapabilities {
    pub missing: Vec<&'static str>,
}

/// The effective capability set, from `CapEff` in /proc/self/status.
pub fn effective_caps() -> Option<u64> {
    parse_cap_eff(&std::fs::read_to_string("/proc/self/status").ok()?)
}

pub fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

/// Checks a capability set: CAP_BPF and CAP_PERFMON (5.8+), or CAP_SYS_ADMIN alone, which
/// kernels before 5.8 require and later ones still accept.
pub fn check(caps: u64) -> Result<(), MissingCapabilities> {
    let has = |cap: u32| caps & (1 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    let mut missing = Vec::new();
    if !has(CAP_BPF) {
        missing.push("CAP_BPF");
    }
    if !has(CAP_PERFMON) {
        missing.push("CAP_PERFMON");
    }
    Err(MissingCapabilities { missing })
}

/// Fails early, with what is missing, instead of an EPERM from deep inside the loader.
pub fn require() -> Result<(), MissingCapabilities> {
    check(effective_caps().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_what_is_missing() {
        let bpf = 1 << CAP_BPF;
        let perfmon = 1 << CAP_PERFMON;
        assert!(check(bpf | perfmon).is_ok());
        assert!(check(1 << CAP_SYS_ADMIN).is_ok());
        assert_eq!(check(bpf).unwrap_err().missing, ["CAP_PERFMON"]);
        assert_eq!(check(perfmon).unwrap_err().missing, ["CAP_BPF"]);
        let none = check(0).unwrap_err();
        assert_eq!(
            none.to_string(),
            "stormwatch needs CAP_BPF and CAP_PERFMON (or root); missing: CAP_BPF, CAP_PERFMON"
        );
    }

    #[test]
    fn parses_cap_eff() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(parse_cap_eff(status), Some(0x1ff_ffff_ffff));
        assert_eq!(parse_cap_eff("nothing"), None);
    }
}
