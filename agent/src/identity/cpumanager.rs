//! The kubelet's CPU manager: which policy the node runs, and which CPUs it gave containers
//! for themselves, from its checkpoint file (`/var/lib/kubelet/cpu_manager_state`):
//!
//! ```json
//! {"policyName":"static","defaultCpuSet":"0,5-7","entries":{"<pod uid>":{"<container>":"1-4"}},"checksum":1}
//! ```
//!
//! Under the `static` policy a container of a Guaranteed pod with an integer CPU request gets
//! CPUs of its own (an entry); the others share the default set. Under `none` (the kubelet's
//! default) no container is pinned. The file is the kubelet's own record, read as it is: a
//! node without it (no kubelet, or the agent cannot read it) has no policy known, and the
//! advice then says what pinning needs on any node.

use std::{collections::HashMap, path::Path};

use serde::Deserialize;

use super::limits::parse_cpu_list;

/// Where the kubelet keeps its CPU manager checkpoint by default (`--root-dir`).
pub const DEFAULT_STATE_FILE: &str = "/var/lib/kubelet/cpu_manager_state";
/// The same file through the host's init process: where the agent runs in a pod with the
/// host's pids (`hostPID` and `SYS_PTRACE`, as for naming call sites: deploy/README.md), the
/// host's file without mounting the kubelet's directory (which holds the pods' secrets). On the
/// host it is the same file.
pub const HOST_STATE_FILE: &str = "/proc/1/root/var/lib/kubelet/cpu_manager_state";

/// The node's CPU manager, as its checkpoint says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CpuManagerState {
    /// `none` or `static` (or a policy named later).
    pub policy: String,
    /// The CPUs assigned to containers for themselves: pod UID → container name → CPUs.
    pub exclusive: HashMap<String, HashMap<String, Vec<u32>>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Checkpoint {
    policy_name: String,
    #[serde(default)]
    entries: HashMap<String, HashMap<String, String>>,
}

impl CpuManagerState {
    /// Parses the checkpoint's JSON; `None` when it is not one. An entry whose CPU list does
    /// not parse is left out.
    pub fn parse(text: &str) -> Option<Self> {
        let c: Checkpoint = serde_json::from_str(text).ok()?;
        let exclusive = c
            .entries
            .into_iter()
            .map(|(pod, containers)| {
                let cpus = containers
                    .into_iter()
                    .filter_map(|(name, list)| Some((name, parse_cpu_list(&list)?)))
                    .collect();
                (pod, cpus)
            })
            .collect();
        Some(Self {
            policy: c.policy_name,
            exclusive,
        })
    }

    /// Reads and parses the checkpoint at `path`; `None` where it is missing or unreadable.
    pub fn read(path: &Path) -> Option<Self> {
        Self::parse(&crate::files::read_text(path, crate::files::Kind::Config).ok()?)
    }

    /// The first of `paths` that reads as a checkpoint.
    pub fn read_first(paths: &[std::path::PathBuf]) -> Option<Self> {
        paths.iter().find_map(|p| Self::read(p))
    }

    /// The CPUs the kubelet gave a container of pod `pod_uid` for itself, when its cgroup's
    /// effective cpuset (`cpuset`) is one of that pod's exclusive assignments.
    pub fn exclusive_cpus(&self, pod_uid: &str, cpuset: &[u32]) -> Option<&[u32]> {
        self.exclusive
            .get(pod_uid)?
            .values()
            .find(|cpus| cpus.as_slice() == cpuset)
            .map(Vec::as_slice)
    }
}

/// What the facts say of a container's CPUs being pinned, and of the node's policy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CpuPinning {
    /// The node's CPU manager policy, where its checkpoint could be read.
    pub node_policy: Option<String>,
    /// The CPUs the kubelet's static policy gave this container for itself.
    pub exclusive_cpus: Option<Vec<u32>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATIC: &str = r#"{"policyName":"static","defaultCpuSet":"0,5-7","entries":{"8d2c1e5a-1111-2222-3333-444455556666":{"app":"1-4","sidecar":"x"}},"checksum":2937458321}"#;
    const NONE: &str = r#"{"policyName":"none","defaultCpuSet":"","checksum":1353318690}"#;

    #[test]
    fn reads_the_kubelets_checkpoint() {
        let s = CpuManagerState::parse(STATIC).expect("a checkpoint");
        assert_eq!(s.policy, "static");
        let pod = "8d2c1e5a-1111-2222-3333-444455556666";
        assert_eq!(s.exclusive[pod]["app"], vec![1, 2, 3, 4]);
        assert!(
            !s.exclusive[pod].contains_key("sidecar"),
            "a list that does not parse is left out"
        );
        assert_eq!(
            s.exclusive_cpus(pod, &[1, 2, 3, 4]),
            Some(&[1, 2, 3, 4][..])
        );
        assert_eq!(
            s.exclusive_cpus(pod, &[0, 5, 6, 7]),
            None,
            "the shared pool"
        );
        assert_eq!(s.exclusive_cpus("other-pod", &[1, 2, 3, 4]), None);

        let n = CpuManagerState::parse(NONE).expect("a checkpoint");
        assert_eq!(n.policy, "none");
        assert!(n.exclusive.is_empty());
        assert_eq!(CpuManagerState::parse("not json"), None);
        assert_eq!(
            CpuManagerState::parse("{}"),
            None,
            "no policy, no checkpoint"
        );

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cpu_manager_state");
        std::fs::write(&file, STATIC).unwrap();
        assert_eq!(CpuManagerState::read(&file), Some(s));
        assert_eq!(CpuManagerState::read(&dir.path().join("missing")), None);
        assert_eq!(
            CpuManagerState::read_first(&[dir.path().join("missing"), file]),
            CpuManagerState::parse(STATIC)
        );
    }
}
