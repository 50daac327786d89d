//! Pod and container names from the kubelet's log layout, without API credentials.
//!
//! The cgroup path gives a pod UID and a container ID; people think in namespaces, pod names
//! and container names. The kubelet writes both on disk for its log handling:
//!
//! - `/var/log/pods/<namespace>_<pod-name>_<pod-uid>/<container-name>/<restart>.log`
//! - `/var/log/containers/<pod-name>_<namespace>_<container-name>-<container-id>.log`, a
//!   symlink to the file above.
//!
//! Namespaces, pod names and container names are DNS labels or subdomains, which cannot contain
//! `_`, so `_` separates fields unambiguously; but container names may contain `-`, so the
//! container ID is split off at the *last* `-`, and only when what follows is a full container
//! ID. Anything that does not parse stays unknown: a missing name is better than a wrong one.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use serde::Serialize;

use super::container::{is_container_id, normalize_pod_uid};

/// Where the kubelet keeps pod log directories by default.
pub const DEFAULT_PODS_DIR: &str = "/var/log/pods";
/// Where the kubelet keeps the per-container log symlinks by default.
pub const DEFAULT_CONTAINERS_DIR: &str = "/var/log/containers";

/// The names of a pod and one of its containers, as far as the kubelet's files tell.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct PodNames {
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub container: Option<String>,
}

/// A `/var/log/pods` directory name: `<namespace>_<pod-name>_<pod-uid>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLogDir {
    pub namespace: String,
    pub pod: String,
    pub pod_uid: String,
}

/// A `/var/log/containers` file name: `<pod-name>_<namespace>_<container-name>-<id>.log`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerLogName {
    pub pod: String,
    pub namespace: String,
    pub container: String,
    pub container_id: String,
}

/// Parses a `/var/log/pods` directory name. The UID must have a pod UID's shape, so that an
/// unrelated directory is not taken for a pod.
pub fn parse_pod_log_dir(name: &str) -> Option<PodLogDir> {
    let mut fields = name.split('_');
    let (namespace, pod, uid) = (fields.next()?, fields.next()?, fields.next()?);
    if fields.next().is_some() || !is_name(namespace) || !is_name(pod) || uid.contains('_') {
        return None;
    }
    // The directory already uses the dashed form; normalising only validates it.
    let pod_uid = normalize_pod_uid(uid).filter(|u| u == uid)?;
    Some(PodLogDir {
        namespace: namespace.to_owned(),
        pod: pod.to_owned(),
        pod_uid,
    })
}

/// Parses a `/var/log/containers` symlink name, from the right: the container ID is what
/// follows the last `-` (it must be a full container ID); the rest is `pod_namespace_container`.
pub fn parse_container_log_name(name: &str) -> Option<ContainerLogName> {
    let stem = name.strip_suffix(".log")?;
    let (rest, container_id) = stem.rsplit_once('-')?;
    if !is_container_id(container_id) {
        return None;
    }
    let mut fields = rest.split('_');
    let (pod, namespace, container) = (fields.next()?, fields.next()?, fields.next()?);
    if fields.next().is_some() || !is_name(pod) || !is_name(namespace) || !is_name(container) {
        return None;
    }
    Some(ContainerLogName {
        pod: pod.to_owned(),
        namespace: namespace.to_owned(),
        container: container.to_owned(),
        container_id: container_id.to_owned(),
    })
}

/// Kubernetes object names here are DNS-1123 labels or subdomains: lowercase alphanumerics,
/// `-` and `.`, starting and ending with an alphanumeric, at most 253 characters. Checking the
/// charset keeps stray files (`.tmp`, editor backups) from becoming names.
fn is_name(s: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !s.is_empty()
        && s.len() <= 253
        && s.bytes().all(|b| alnum(b) || b == b'-' || b == b'.')
        && s.bytes().next().is_some_and(alnum)
        && s.bytes().last().is_some_and(alnum)
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct PodRecord {
    namespace: String,
    pod: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ContainerRecord {
    namespace: String,
    pod: String,
    container: String,
    /// From the symlink's target (`.../<ns>_<pod>_<uid>/<container>/N.log`) when readable and
    /// consistent with the symlink's own name; pod names are reused (StatefulSets), UIDs not.
    pod_uid: Option<String>,
}

/// A snapshot of the kubelet's log layout: pod UID → (namespace, pod), container ID →
/// container name. Rescan to pick up new pods; it is two directory listings.
#[derive(Debug, Clone, Default)]
pub struct KubeletNames {
    pods: HashMap<String, PodRecord>,
    containers: HashMap<String, ContainerRecord>,
}

impl KubeletNames {
    /// Reads both directories, best effort: a missing or unreadable directory (not a
    /// Kubernetes node, no host /var/log mounted) or entry contributes nothing.
    pub fn scan(pods_dir: &Path, containers_dir: &Path) -> KubeletNames {
        let mut names = KubeletNames::default();
        for (name, _) in dir_entries(pods_dir) {
            if let Some(dir) = parse_pod_log_dir(&name) {
                names.pods.insert(
                    dir.pod_uid,
                    PodRecord {
                        namespace: dir.namespace,
                        pod: dir.pod,
                    },
                );
            }
        }
        for (name, path) in dir_entries(containers_dir) {
            let Some(log) = parse_container_log_name(&name) else {
                continue;
            };
            let pod_uid = std::fs::read_link(&path)
                .ok()
                .and_then(|target| pod_uid_from_log_target(&target, &log));
            names.containers.insert(
                log.container_id,
                ContainerRecord {
                    namespace: log.namespace,
                    pod: log.pod,
                    container: log.container,
                    pod_uid,
                },
            );
        }
        names
    }

    /// Scans the kubelet's default directories.
    pub fn scan_default() -> KubeletNames {
        Self::scan(
            Path::new(DEFAULT_PODS_DIR),
            Path::new(DEFAULT_CONTAINERS_DIR),
        )
    }

    /// Whether the scan found nothing (not a node, or logs not visible to the agent).
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty() && self.containers.is_empty()
    }

    /// Names for a pod UID (namespace and pod) and a container ID (container name).
    ///
    /// When both are given, the container's record must agree with the pod (same UID when the
    /// symlink target says it, same namespace and pod name otherwise); if not, the container's
    /// names are dropped rather than mixed with the pod's. There is deliberately no fallback
    /// such as "the pod's only container": the pod's sandbox (pause) container has a cgroup
    /// of its own and no log, so that guess would name it wrongly.
    pub fn names(&self, pod_uid: Option<&str>, container_id: Option<&str>) -> PodNames {
        let pod = pod_uid.and_then(|uid| self.pods.get(uid));
        let container = container_id
            .and_then(|id| self.containers.get(id))
            .filter(|c| match (pod_uid, &c.pod_uid, pod) {
                (Some(uid), Some(c_uid), _) => uid == c_uid,
                (Some(_), None, Some(p)) => p.namespace == c.namespace && p.pod == c.pod,
                // Container IDs are unique on a node: its record names its own pod.
                (Some(_), None, None) | (None, _, _) => true,
            });
        let (namespace, pod_name) = match (pod, container) {
            (Some(p), _) => (Some(p.namespace.clone()), Some(p.pod.clone())),
            (None, Some(c)) => (Some(c.namespace.clone()), Some(c.pod.clone())),
            (None, None) => (None, None),
        };
        PodNames {
            namespace,
            pod: pod_name,
            container: container.map(|c| c.container.clone()),
        }
    }
}

/// The entries of a directory as (UTF-8 name, path); non-UTF-8 names cannot be Kubernetes names
/// and are skipped.
fn dir_entries(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
        .collect()
}

/// The pod UID from a symlink target, `/var/log/pods/<ns>_<pod>_<uid>/<container>/<n>.log`
/// (absolute or relative), if the target agrees with the symlink's own name.
fn pod_uid_from_log_target(target: &Path, log: &ContainerLogName) -> Option<String> {
    let container_dir = target.parent()?;
    if container_dir.file_name()?.to_str()? != log.container {
        return None;
    }
    let dir = parse_pod_log_dir(container_dir.parent()?.file_name()?.to_str()?)?;
    (dir.namespace == log.namespace && dir.pod == log.pod).then_some(dir.pod_uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID_A: &str = "4a1f0c2b9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f21";
    const ID_B: &str = "b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90a1";
    const ID_C: &str = "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00";
    const UID_1: &str = "7f2e4a1c-8b3d-4f5e-9a6b-1c2d3e4f5a6b";
    const UID_2: &str = "11111111-2222-4333-8444-555555555555";

    #[test]
    fn parses_pod_dirs() {
        assert_eq!(
            parse_pod_log_dir(&format!("kube-system_coredns-5d78c9869d-x2x9k_{UID_1}")),
            Some(PodLogDir {
                namespace: "kube-system".into(),
                pod: "coredns-5d78c9869d-x2x9k".into(),
                pod_uid: UID_1.into(),
            })
        );
        // Static pod: 32-hex UID.
        assert!(
            parse_pod_log_dir("kube-system_etcd-node1_5a3b9f0e6c1d2e7f8a9b0c1d2e3f4a5b").is_some()
        );
        // Pod names may contain dots (DNS subdomains).
        assert!(parse_pod_log_dir(&format!("default_web.v2-0_{UID_1}")).is_some());
        for bad in [
            String::new(),
            "default_web".into(),
            format!("default_web_{UID_1}_extra"),
            "default_web_not-a-uid".into(),
            format!("_web_{UID_1}"),
            format!("Default_web_{UID_1}"),
            format!("default_web_{}", UID_1.replace('-', "_")),
        ] {
            assert_eq!(parse_pod_log_dir(&bad), None, "{bad}");
        }
    }

    #[test]
    fn parses_container_log_names_from_the_right() {
        assert_eq!(
            parse_container_log_name(&format!(
                "coredns-5d78c9869d-x2x9k_kube-system_coredns-{ID_A}.log"
            )),
            Some(ContainerLogName {
                pod: "coredns-5d78c9869d-x2x9k".into(),
                namespace: "kube-system".into(),
                container: "coredns".into(),
                container_id: ID_A.into(),
            })
        );
        // A container name with dashes: the ID is only what follows the last dash.
        let parsed =
            parse_container_log_name(&format!("web-0_shop_istio-proxy-sidecar-{ID_B}.log"));
        assert_eq!(
            parsed.map(|p| (p.container, p.container_id)),
            Some(("istio-proxy-sidecar".to_owned(), ID_B.to_owned()))
        );
        for bad in [
            String::new(),
            ".log".into(),
            "-.log".into(),
            format!("web-0_shop_app-{ID_A}"),
            format!("web-0_shop_app-{ID_A}.log.1"),
            format!("web-0_shop_app{ID_A}.log"),
            format!("web-0_shop_app-{}.log", &ID_A[1..]),
            format!("web-0_shop-{ID_A}.log"),
            format!("web-0_shop_a_b-{ID_A}.log"),
            format!("web-0__app-{ID_A}.log"),
            format!("web-0_shop_-{ID_A}.log"),
        ] {
            assert_eq!(parse_container_log_name(&bad), None, "{bad}");
        }
    }

    /// Lays out what the kubelet writes for one container.
    fn add_container(root: &Path, ns: &str, pod: &str, uid: &str, container: &str, id: &str) {
        let pod_dir = root.join("pods").join(format!("{ns}_{pod}_{uid}"));
        let log = pod_dir.join(container).join("0.log");
        std::fs::create_dir_all(log.parent().expect("has parent")).expect("mkdir");
        std::fs::write(&log, "").expect("write log");
        std::os::unix::fs::symlink(
            &log,
            root.join("containers")
                .join(format!("{pod}_{ns}_{container}-{id}.log")),
        )
        .expect("symlink");
    }

    #[test]
    fn scans_and_looks_up_by_uid_and_id() {
        let tmp = tempfile::tempdir().expect("a temp dir");
        let root = tmp.path();
        std::fs::create_dir_all(root.join("containers")).expect("mkdir");
        add_container(root, "shop", "web-0", UID_1, "app", ID_A);
        add_container(root, "shop", "web-0", UID_1, "istio-proxy", ID_B);
        // A pod recreated under the same name (StatefulSet) has another UID.
        add_container(root, "shop", "web-1", UID_2, "app", ID_C);
        // Noise the scan must ignore.
        std::fs::create_dir_all(root.join("pods/lost+found")).expect("mkdir");
        std::fs::write(root.join("containers/README"), "").expect("write");

        let names = KubeletNames::scan(&root.join("pods"), &root.join("containers"));
        assert!(!names.is_empty());
        let named = |ns: &str, pod: &str, c: Option<&str>| PodNames {
            namespace: Some(ns.into()),
            pod: Some(pod.into()),
            container: c.map(str::to_owned),
        };
        assert_eq!(
            names.names(Some(UID_1), Some(ID_B)),
            named("shop", "web-0", Some("istio-proxy"))
        );
        // Pod-level cgroup, or the sandbox (pause) container, which has no log.
        assert_eq!(names.names(Some(UID_1), None), named("shop", "web-0", None));
        let pause = "9".repeat(64);
        assert_eq!(
            names.names(Some(UID_1), Some(&pause)),
            named("shop", "web-0", None)
        );
        // Container only: its own record names the pod.
        assert_eq!(
            names.names(None, Some(ID_C)),
            named("shop", "web-1", Some("app"))
        );
        // A container that the logs place in another pod is not given a name.
        assert_eq!(
            names.names(Some(UID_1), Some(ID_C)),
            named("shop", "web-0", None)
        );
        // Unknown everything.
        assert_eq!(
            names.names(Some("33333333-2222-4333-8444-555555555555"), None),
            PodNames::default()
        );
        assert_eq!(names.names(None, None), PodNames::default());
    }

    #[test]
    fn container_without_a_readable_target_is_still_named() {
        let tmp = tempfile::tempdir().expect("a temp dir");
        let root = tmp.path();
        std::fs::create_dir_all(root.join("containers")).expect("mkdir");
        // Dangling symlink whose target points at a pods dir we cannot see (agent container
        // mounting only /var/log/containers).
        std::os::unix::fs::symlink(
            "/nonexistent/x",
            root.join("containers")
                .join(format!("api-7d9f_prod_server-{ID_A}.log")),
        )
        .expect("symlink");
        let names = KubeletNames::scan(&root.join("pods"), &root.join("containers"));
        assert_eq!(
            names.names(Some(UID_1), Some(ID_A)),
            PodNames {
                namespace: Some("prod".into()),
                pod: Some("api-7d9f".into()),
                container: Some("server".into()),
            }
        );
    }

    #[test]
    fn missing_dirs_give_nothing() {
        let tmp = tempfile::tempdir().expect("a temp dir");
        let names = KubeletNames::scan(
            &tmp.path().join("no-pods"),
            &tmp.path().join("no-containers"),
        );
        assert!(names.is_empty());
        assert_eq!(names.names(Some(UID_1), Some(ID_A)), PodNames::default());
    }
}
