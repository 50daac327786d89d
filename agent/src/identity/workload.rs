//! A cgroup's workload identity: what its path says (runtime, container ID, pod UID, QoS) and
//! what the kubelet's log layout adds (namespace, pod and container names). Computed once per
//! cgroup id and cached; the kubelet's directories are re-scanned only when a pod UID is not
//! found in the last scan, at most every [`RESCAN_INTERVAL`].

use std::{
    collections::HashMap,
    path::PathBuf,
    time::{Duration, Instant},
};

use serde::Serialize;

use super::{
    container::{QosClass, Runtime, parse_cgroup_path},
    kubelet::{DEFAULT_CONTAINERS_DIR, DEFAULT_PODS_DIR, KubeletNames},
};

/// How often the kubelet's log directories may be re-read for a pod not yet named.
pub const RESCAN_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Identity {
    pub runtime: Runtime,
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
    pub qos: Option<QosClass>,
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub container: Option<String>,
}

impl Identity {
    /// `namespace/pod/container`, where the kubelet names all three.
    pub fn workload_name(&self) -> Option<String> {
        match (&self.namespace, &self.pod, &self.container) {
            (Some(ns), Some(pod), Some(c)) => Some(format!("{ns}/{pod}/{c}")),
            _ => None,
        }
    }
}

/// The id → identity cache.
pub struct Identities {
    pods_dir: PathBuf,
    containers_dir: PathBuf,
    names: KubeletNames,
    scanned_at: Option<Instant>,
    cache: HashMap<u64, Identity>,
}

impl Default for Identities {
    fn default() -> Self {
        Self::new(DEFAULT_PODS_DIR.into(), DEFAULT_CONTAINERS_DIR.into())
    }
}

impl Identities {
    pub fn new(pods_dir: PathBuf, containers_dir: PathBuf) -> Self {
        Self {
            pods_dir,
            containers_dir,
            names: KubeletNames::default(),
            scanned_at: None,
            cache: HashMap::new(),
        }
    }

    fn rescan_if_due(&mut self) {
        if self
            .scanned_at
            .is_none_or(|t| t.elapsed() >= RESCAN_INTERVAL)
        {
            self.names = KubeletNames::scan(&self.pods_dir, &self.containers_dir);
            self.scanned_at = Some(Instant::now());
        }
    }

    /// The identity of cgroup `id` at `path` (relative to the v2 root).
    pub fn resolve(&mut self, id: u64, path: &str) -> &Identity {
        let known = self.cache.get(&id).is_some_and(|i| {
            // Cached unless it is a pod we could not name yet.
            i.pod_uid.is_none() || i.pod.is_some()
        });
        if !known {
            let parsed = parse_cgroup_path(path);
            let mut names = self
                .names
                .names(parsed.pod_uid.as_deref(), parsed.container_id.as_deref());
            if parsed.pod_uid.is_some() && names.pod.is_none() {
                self.rescan_if_due();
                names = self
                    .names
                    .names(parsed.pod_uid.as_deref(), parsed.container_id.as_deref());
            }
            self.cache.insert(
                id,
                Identity {
                    runtime: parsed.runtime,
                    container_id: parsed.container_id,
                    pod_uid: parsed.pod_uid,
                    qos: parsed.qos,
                    namespace: names.namespace,
                    pod: names.pod,
                    container: names.container,
                },
            );
        }
        &self.cache[&id]
    }

    pub fn get(&self, id: u64) -> Option<&Identity> {
        self.cache.get(&id)
    }

    /// Forgets cgroups that `keep` does not need any more.
    pub fn retain(&mut self, keep: impl Fn(u64) -> bool) {
        self.cache.retain(|id, _| keep(*id));
    }

    pub fn all(&self) -> &HashMap<u64, Identity> {
        &self.cache
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_a_kubelet_container_and_leaves_the_host_alone() {
        let base = tempfile::tempdir().unwrap();
        let base = base.path();
        let pods = base.join("pods");
        let containers = base.join("containers");
        let uid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
        let cid = "a".repeat(64);
        std::fs::create_dir_all(pods.join(format!("shop_checkout-7d9f_{uid}/server"))).unwrap();
        std::fs::create_dir_all(&containers).unwrap();
        std::fs::write(
            containers.join(format!("checkout-7d9f_shop_server-{cid}.log")),
            "",
        )
        .unwrap();
        let mut ids = Identities::new(pods, containers);
        let path = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{cid}.scope",
            uid.replace('-', "_")
        );
        let got = ids.resolve(7, &path).clone();
        assert_eq!(got.runtime, Runtime::Containerd);
        assert_eq!(got.container_id.as_deref(), Some(cid.as_str()));
        assert_eq!(got.namespace.as_deref(), Some("shop"));
        assert_eq!(got.pod.as_deref(), Some("checkout-7d9f"));
        assert_eq!(got.container.as_deref(), Some("server"));
        assert_eq!(got.qos, Some(QosClass::Burstable));
        let host = ids.resolve(1, "/").clone();
        assert_eq!(host, Identity::default());
        ids.retain(|id| id == 1);
        assert!(ids.get(7).is_none());
    }
}
