//! Container identity from a cgroup path alone.
//!
//! Every container runtime and both kubelet cgroup drivers leave a recognisable trace in the
//! cgroup path of a container: the runtime's scope prefix (`cri-containerd-`, `crio-`,
//! `docker-`, `libpod-`), the pod's UID and its QoS class. Reading them from the path needs no
//! runtime socket and no API credentials, and works the same for a path the eBPF side reports
//! (via the cgroup id → path resolver) as for one a user types.
//!
//! The path is untrusted text (a user argument, a directory name anyone with delegation can
//! create), so parsing never panics and is deliberately conservative: a component is only a
//! container ID when it has the exact shape runtimes generate (64 lowercase hex characters),
//! and a pod UID only when it has the shape the API server or kubelet generates. Anything else
//! yields `None`, which the report shows as unknown rather than as a wrong name.
//!
//! Nesting (kind, k3d, Docker-in-Docker, a kubelet under `containerd.service`) is handled by
//! letting the innermost container win: a pod inside a kind node container is that pod, not the
//! node container.

use serde::Serialize;

/// Which runtime made the cgroup, as far as the path tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    Containerd,
    CriO,
    Docker,
    Podman,
    /// A plain systemd service or scope (`/system.slice/nginx.service`, a login session).
    Systemd,
    /// The host, or a path that says nothing about its runtime. The kubelet's cgroupfs driver
    /// names containers by their bare ID whatever the runtime is, so such containers have an ID
    /// but runtime `None`: the path does not say, and we do not guess.
    #[default]
    None,
}

/// The pod's Kubernetes QoS class, named as in `status.qosClass`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// What a cgroup path says about the container (or pod, or service) in it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct ContainerIdentity {
    pub runtime: Runtime,
    /// The runtime's full container ID (64 lowercase hex characters).
    pub container_id: Option<String>,
    /// The Kubernetes pod UID, with dashes (the systemd driver's underscores are converted
    /// back), so it matches `metadata.uid` and the kubelet's `/var/log/pods` names.
    pub pod_uid: Option<String>,
    pub qos: Option<QosClass>,
    /// Set for a conmon monitor scope (`crio-conmon-<id>.scope`, `libpod-conmon-<id>.scope`):
    /// the ID of the container conmon supervises. Conmon's own CPU use is not the container's,
    /// so `container_id` stays `None` for it; this says whose monitor it is.
    pub conmon_for: Option<String>,
}

/// Parses a cgroup path (relative to the cgroup v2 root, or a v1 hierarchy's path as in
/// `/proc/<pid>/cgroup`) into what it says about containers, pods and services.
///
/// Never panics; unknown shapes give `ContainerIdentity::default()` (host, nothing known).
pub fn parse_cgroup_path(path: &str) -> ContainerIdentity {
    let mut state = State::default();
    for component in path.split('/').filter(|c| !c.is_empty()) {
        state.feed(component);
    }
    state.finish()
}

/// Whether `s` has the shape of a runtime-generated container ID: exactly 64 lowercase hex
/// characters. containerd (CRI), CRI-O, Docker, podman and nerdctl all generate such IDs;
/// accepting less would let a random path component (a service name, a short hex word such as
/// `cafe`) pass for a container.
pub fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Normalises a pod UID as it appears in a cgroup name (`1234abcd_5678_...` under the systemd
/// driver, `1234abcd-5678-...` under cgroupfs) to the API's dashed form, or `None` if it is not
/// a UID. Accepted shapes: a UUID (8-4-4-4-12 hex, what the API server assigns) and 32 hex
/// characters (the MD5 the kubelet uses as the UID of a static pod).
pub fn normalize_pod_uid(raw: &str) -> Option<String> {
    let dashed: String = raw
        .chars()
        .map(|c| if c == '_' { '-' } else { c })
        .collect();
    let is_hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    let groups: Vec<&str> = dashed.split('-').collect();
    let uuid = groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && is_hex(g));
    let static_pod = dashed.len() == 32 && is_hex(&dashed);
    (uuid || static_pod).then_some(dashed)
}

/// Runtime scope prefixes. Each conmon prefix comes before its runtime's plain prefix, so
/// `crio-conmon-<id>` is not read as a CRI-O container with ID `conmon-<id>`. The boolean marks
/// conmon monitor scopes.
const SCOPE_PREFIXES: &[(&str, Runtime, bool)] = &[
    // containerd with the systemd cgroup driver (CRI plugin).
    ("cri-containerd-", Runtime::Containerd, false),
    // nerdctl (containerd's Docker-compatible CLI) with the systemd driver.
    ("nerdctl-", Runtime::Containerd, false),
    ("crio-conmon-", Runtime::CriO, true),
    ("crio-", Runtime::CriO, false),
    ("docker-", Runtime::Docker, false),
    ("libpod-conmon-", Runtime::Podman, true),
    ("libpod-", Runtime::Podman, false),
];

/// The runtime prefixes that appear in the `slice:prefix:id` form (see `State::feed`).
const COLON_PREFIXES: &[(&str, Runtime)] = &[
    ("cri-containerd", Runtime::Containerd),
    ("crio", Runtime::CriO),
    ("docker", Runtime::Docker),
    ("libpod", Runtime::Podman),
];

/// Unit types that own a cgroup in systemd. Slices only group other units, so a process is
/// never "in" a slice as its service; they are left out on purpose.
const UNIT_SUFFIXES: &[&str] = &[".service", ".scope", ".socket", ".mount", ".swap"];

/// What the previous component was, for QoS inference in the cgroupfs layout (where the pod
/// directory's name does not carry the class; its parent does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Previous {
    #[default]
    Other,
    KubepodsRoot,
    Qos(QosClass),
    /// `docker`: Docker's cgroupfs driver puts containers at `/docker/<id>`.
    DockerParent,
}

#[derive(Debug, Default)]
struct State {
    identity: ContainerIdentity,
    /// Inside a kubepods hierarchy (QoS and pod components are only recognised there).
    in_kubepods: bool,
    previous: Previous,
    /// A plain systemd unit was seen and no container or pod encloses it.
    systemd_unit: bool,
}

impl State {
    fn feed(&mut self, component: &str) {
        let previous = std::mem::take(&mut self.previous);

        // The systemd-driver path as created by a runtime that could not reach systemd (seen
        // under `containerd.service` in nested and rootless setups): the cgroup parent in
        // containerd's "slice:prefix:name" notation is used literally as one directory name.
        if let Some((slice, runtime, id)) = split_colon_form(component) {
            if let Some(pod) = pod_slice(slice) {
                self.enter_pod(pod, previous);
            }
            self.set_container(runtime, id, false);
            return;
        }

        if is_kubepods_root(component) {
            // A new kubepods hierarchy: whatever enclosed it (a kind or k3d node container,
            // a service) is the node, not the workload.
            self.identity = ContainerIdentity::default();
            self.systemd_unit = false;
            self.in_kubepods = true;
            self.previous = Previous::KubepodsRoot;
            return;
        }

        if self.in_kubepods && self.identity.pod_uid.is_none() {
            if let Some(qos) = qos_component(component) {
                self.identity.qos = Some(qos);
                self.previous = Previous::Qos(qos);
                return;
            }
            if let Some(pod) = pod_component(component) {
                self.enter_pod(pod, previous);
                return;
            }
        }

        if let Some((runtime, id, conmon)) = container_component(component, previous) {
            self.set_container(runtime, id, conmon);
            return;
        }

        // Cgroups below a container (`libpod-<id>.scope/container`, systemd running inside the
        // container) still belong to that container; a unit only counts when nothing encloses
        // it.
        if self.identity.container_id.is_none()
            && self.identity.conmon_for.is_none()
            && self.identity.pod_uid.is_none()
            && UNIT_SUFFIXES.iter().any(|s| {
                component
                    .strip_suffix(s)
                    .is_some_and(|stem| !stem.is_empty())
            })
        {
            self.systemd_unit = true;
        }

        self.previous = match component {
            "docker" => Previous::DockerParent,
            _ => Previous::Other,
        };
    }

    fn enter_pod(&mut self, pod: PodSlice, previous: Previous) {
        let qos = match (pod.qos, previous) {
            (Some(q), _) => Some(q),
            (None, Previous::KubepodsRoot) => Some(QosClass::Guaranteed),
            (None, Previous::Qos(q)) => Some(q),
            (None, Previous::Other | Previous::DockerParent) => self.identity.qos,
        };
        self.identity = ContainerIdentity {
            pod_uid: Some(pod.uid),
            qos,
            ..ContainerIdentity::default()
        };
        self.systemd_unit = false;
    }

    fn set_container(&mut self, runtime: Runtime, id: &str, conmon: bool) {
        self.identity.runtime = runtime;
        if conmon {
            self.identity.container_id = None;
            self.identity.conmon_for = Some(id.to_owned());
        } else {
            self.identity.container_id = Some(id.to_owned());
            self.identity.conmon_for = None;
        }
        self.systemd_unit = false;
    }

    fn finish(mut self) -> ContainerIdentity {
        if self.systemd_unit && self.identity.runtime == Runtime::None {
            self.identity.runtime = Runtime::Systemd;
        }
        self.identity
    }
}

/// `kubepods` (cgroupfs), `kubepods.slice` (systemd), and the same under a kubelet
/// `--cgroup-root` such as kind's `/kubelet`: `kubelet-kubepods.slice`.
fn is_kubepods_root(component: &str) -> bool {
    let stem = component.strip_suffix(".slice").unwrap_or(component);
    stem == "kubepods" || (component.ends_with(".slice") && stem.ends_with("-kubepods"))
}

/// `burstable` / `besteffort` (cgroupfs) or `kubepods-burstable.slice` (systemd, possibly with
/// a cgroup-root prefix: `kubelet-kubepods-burstable.slice`).
fn qos_component(component: &str) -> Option<QosClass> {
    let last = match component.strip_suffix(".slice") {
        Some(stem) => {
            let (parent, last) = stem.rsplit_once('-')?;
            if !is_kubepods_root(&format!("{parent}.slice")) {
                return None;
            }
            last
        }
        None => component,
    };
    match last {
        "burstable" => Some(QosClass::Burstable),
        "besteffort" => Some(QosClass::BestEffort),
        _ => None,
    }
}

struct PodSlice {
    uid: String,
    /// The class as the systemd slice name spells it; `None` for cgroupfs `pod<uid>` names.
    qos: Option<QosClass>,
}

/// `pod<uid>` (cgroupfs) or `kubepods[-<qos>]-pod<uid_with_underscores>.slice` (systemd).
fn pod_component(component: &str) -> Option<PodSlice> {
    if component.ends_with(".slice") {
        return pod_slice(component);
    }
    let uid = normalize_pod_uid(component.strip_prefix("pod")?)?;
    Some(PodSlice { uid, qos: None })
}

fn pod_slice(component: &str) -> Option<PodSlice> {
    let stem = component.strip_suffix(".slice")?;
    let (parent, pod) = stem.rsplit_once('-')?;
    let uid = normalize_pod_uid(pod.strip_prefix("pod")?)?;
    let qos = if is_kubepods_root(&format!("{parent}.slice")) {
        QosClass::Guaranteed
    } else {
        qos_component(&format!("{parent}.slice"))?
    };
    Some(PodSlice {
        uid,
        qos: Some(qos),
    })
}

/// `kubepods-burstable-pod<uid>.slice:cri-containerd:<id>`.
fn split_colon_form(component: &str) -> Option<(&str, Runtime, &str)> {
    let mut parts = component.split(':');
    let (slice, prefix, id) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !is_container_id(id) {
        return None;
    }
    let runtime = COLON_PREFIXES
        .iter()
        .find(|(p, _)| *p == prefix)
        .map(|(_, r)| *r)?;
    Some((slice, runtime, id))
}

/// A container's own cgroup: `<prefix><id>.scope` (systemd drivers), `<prefix><id>` (CRI-O
/// and podman with cgroupfs), or a bare `<id>` (kubelet cgroupfs driver, `/docker/<id>`).
fn container_component(component: &str, previous: Previous) -> Option<(Runtime, &str, bool)> {
    let name = component.strip_suffix(".scope").unwrap_or(component);
    for (prefix, runtime, conmon) in SCOPE_PREFIXES {
        if let Some(id) = name.strip_prefix(prefix) {
            // A prefix with something else after it (`docker-compose.scope`) is not a
            // container; it may still be a plain unit.
            return is_container_id(id).then_some((*runtime, id, *conmon));
        }
    }
    if component != name || !is_container_id(name) {
        return None;
    }
    // A bare ID names its runtime only through Docker's own parent directory; under the
    // kubelet's cgroupfs driver every runtime uses the bare ID.
    let runtime = match previous {
        Previous::DockerParent => Runtime::Docker,
        _ => Runtime::None,
    };
    Some((runtime, name, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4a1f0c2b9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f21";
    const ID2: &str = "b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90a1";
    /// A kind / k3d node container, seen from the host.
    const NODE: &str = "0d9a6c3f1b2e4a5d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a392817161514131211";
    const UID: &str = "7f2e4a1c-8b3d-4f5e-9a6b-1c2d3e4f5a6b";
    const UID_: &str = "7f2e4a1c_8b3d_4f5e_9a6b_1c2d3e4f5a6b";
    /// Static pods (kubeadm's kube-apiserver, etcd) get the MD5 of their manifest as UID.
    const STATIC_UID: &str = "5a3b9f0e6c1d2e7f8a9b0c1d2e3f4a5b";

    fn ident(
        runtime: Runtime,
        container_id: Option<&str>,
        pod_uid: Option<&str>,
        qos: Option<QosClass>,
    ) -> ContainerIdentity {
        ContainerIdentity {
            runtime,
            container_id: container_id.map(str::to_owned),
            pod_uid: pod_uid.map(str::to_owned),
            qos,
            conmon_for: None,
        }
    }

    fn conmon(
        runtime: Runtime,
        of: &str,
        pod_uid: Option<&str>,
        qos: Option<QosClass>,
    ) -> ContainerIdentity {
        ContainerIdentity {
            conmon_for: Some(of.to_owned()),
            ..ident(runtime, None, pod_uid, qos)
        }
    }

    #[test]
    fn constants_have_the_real_shapes() {
        for id in [ID, ID2, NODE] {
            assert!(is_container_id(id), "{id}");
        }
        assert_eq!(normalize_pod_uid(UID_).as_deref(), Some(UID));
        assert_eq!(normalize_pod_uid(STATIC_UID).as_deref(), Some(STATIC_UID));
    }

    #[test]
    fn real_world_path_shapes() {
        use QosClass::*;
        use Runtime as R;
        let table: Vec<(String, ContainerIdentity)> = vec![
            // kubelet systemd driver + containerd (kubeadm default since 1.22, EKS AL2023):
            // Burstable pod.
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope"
                ),
                ident(R::Containerd, Some(ID), Some(UID), Some(Burstable)),
            ),
            // kubelet systemd driver + containerd: BestEffort pod.
            (
                format!(
                    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope"
                ),
                ident(R::Containerd, Some(ID), Some(UID), Some(BestEffort)),
            ),
            // kubelet systemd driver + containerd: Guaranteed pods sit directly under
            // kubepods.slice (Kubernetes docs, "Pod QoS" / node allocatable cgroup layout).
            (
                format!("/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope"),
                ident(R::Containerd, Some(ID), Some(UID), Some(Guaranteed)),
            ),
            // kubelet systemd driver: the pod-level cgroup itself (no container).
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
                ),
                ident(R::None, None, Some(UID), Some(Burstable)),
            ),
            // kubelet systemd driver: the QoS-level slice.
            (
                "/kubepods.slice/kubepods-besteffort.slice".to_owned(),
                ident(R::None, None, None, Some(BestEffort)),
            ),
            // kubelet systemd driver: the kubepods root (node allocatable).
            ("/kubepods.slice".to_owned(), ContainerIdentity::default()),
            // kubeadm static pod (kube-apiserver): UID is a 32-hex manifest hash.
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_UID}.slice/cri-containerd-{ID}.scope"
                ),
                ident(R::Containerd, Some(ID), Some(STATIC_UID), Some(Burstable)),
            ),
            // kubelet cgroupfs driver + Docker (dockershim era, EKS AL2 docs): the runtime is
            // not in the path.
            (
                format!("/kubepods/burstable/pod{UID}/{ID}"),
                ident(R::None, Some(ID), Some(UID), Some(Burstable)),
            ),
            // kubelet cgroupfs driver: Guaranteed pod directly under /kubepods.
            (
                format!("/kubepods/pod{UID}/{ID}"),
                ident(R::None, Some(ID), Some(UID), Some(Guaranteed)),
            ),
            // GKE Container-Optimized OS (cgroupfs driver + containerd), BestEffort; also
            // k3s's default cgroupfs layout.
            (
                format!("/kubepods/besteffort/pod{UID}/{ID}"),
                ident(R::None, Some(ID), Some(UID), Some(BestEffort)),
            ),
            // Hybrid host, v1 `cpu,cpuacct` line of /proc/<pid>/cgroup (kubelet cgroupfs).
            (
                format!("/kubepods/besteffort/pod{UID}/{ID}/"),
                ident(R::None, Some(ID), Some(UID), Some(BestEffort)),
            ),
            // kubelet cgroupfs driver: pod-level directory.
            (
                format!("/kubepods/burstable/pod{UID}"),
                ident(R::None, None, Some(UID), Some(Burstable)),
            ),
            // CRI-O with the systemd driver (OpenShift / RHCOS).
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{ID}.scope"
                ),
                ident(R::CriO, Some(ID), Some(UID), Some(Burstable)),
            ),
            // CRI-O's conmon monitor scope next to the container: not the container.
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-conmon-{ID}.scope"
                ),
                conmon(R::CriO, ID, Some(UID), Some(Burstable)),
            ),
            // CRI-O with the cgroupfs driver (cgroup_manager = "cgroupfs" in crio.conf).
            (
                format!("/kubepods/besteffort/pod{UID}/crio-{ID}"),
                ident(R::CriO, Some(ID), Some(UID), Some(BestEffort)),
            ),
            // kubelet systemd driver + Docker (dockershim / cri-dockerd with systemd cgroups).
            (
                format!(
                    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/docker-{ID}.scope"
                ),
                ident(R::Docker, Some(ID), Some(UID), Some(BestEffort)),
            ),
            // Docker standalone, systemd cgroup driver (default on cgroup v2 hosts).
            (
                format!("/system.slice/docker-{ID}.scope"),
                ident(R::Docker, Some(ID), None, None),
            ),
            // Docker standalone, cgroupfs driver.
            (
                format!("/docker/{ID}"),
                ident(R::Docker, Some(ID), None, None),
            ),
            // Docker-in-Docker (cgroupfs): the inner container wins.
            (
                format!("/docker/{ID}/docker/{ID2}"),
                ident(R::Docker, Some(ID2), None, None),
            ),
            // Rootless Docker (dockerd-rootless with systemd cgroups).
            (
                format!(
                    "/user.slice/user-1000.slice/user@1000.service/user.slice/docker-{ID}.scope"
                ),
                ident(R::Docker, Some(ID), None, None),
            ),
            // nerdctl (containerd) with the systemd driver.
            (
                format!("/system.slice/nerdctl-{ID}.scope"),
                ident(R::Containerd, Some(ID), None, None),
            ),
            // Podman rootful, systemd cgroup manager.
            (
                format!("/machine.slice/libpod-{ID}.scope"),
                ident(R::Podman, Some(ID), None, None),
            ),
            // Podman on cgroup v2 with crun: the payload in a `container` child cgroup.
            (
                format!("/machine.slice/libpod-{ID}.scope/container"),
                ident(R::Podman, Some(ID), None, None),
            ),
            // Podman's conmon monitor scope.
            (
                format!("/machine.slice/libpod-conmon-{ID}.scope"),
                conmon(R::Podman, ID, None, None),
            ),
            // Podman rootless (user systemd instance).
            (
                format!(
                    "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"
                ),
                ident(R::Podman, Some(ID), None, None),
            ),
            // Podman pod (`podman pod create`): the podman pod ID is not a Kubernetes UID.
            (
                format!("/machine.slice/machine-libpod_pod_{ID2}.slice/libpod-{ID}.scope"),
                ident(R::Podman, Some(ID), None, None),
            ),
            // Podman with the cgroupfs manager.
            (
                format!("/libpod_parent/libpod-{ID}"),
                ident(R::Podman, Some(ID), None, None),
            ),
            // kind (v2 node image, kubelet --cgroup-root=/kubelet), seen from the host: the pod
            // inside the kind node container wins over the node container.
            (
                format!(
                    "/system.slice/docker-{NODE}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope"
                ),
                ident(R::Containerd, Some(ID), Some(UID), Some(BestEffort)),
            ),
            // kind, seen inside the node's cgroup namespace; Guaranteed pod.
            (
                format!(
                    "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope"
                ),
                ident(R::Containerd, Some(ID), Some(UID), Some(Guaranteed)),
            ),
            // kind node container's own system cgroups: that is the node container.
            (
                format!("/system.slice/docker-{NODE}.scope/system.slice/containerd.service"),
                ident(R::Docker, Some(NODE), None, None),
            ),
            // Older kind on a v1 host (Docker cgroupfs outside, kubelet cgroupfs inside).
            (
                format!("/docker/{NODE}/kubelet/kubepods/burstable/pod{UID}/{ID}"),
                ident(R::None, Some(ID), Some(UID), Some(Burstable)),
            ),
            // k3d (k3s in Docker, systemd driver outside, cgroupfs kubelet inside).
            (
                format!("/system.slice/docker-{NODE}.scope/kubepods/besteffort/pod{UID}/{ID}"),
                ident(R::None, Some(ID), Some(UID), Some(BestEffort)),
            ),
            // containerd with SystemdCgroup=true when runc cannot reach systemd (nested or
            // rootless nodes): the "slice:prefix:id" parent used literally as a directory.
            (
                format!(
                    "/system.slice/containerd.service/kubepods-burstable-pod{UID_}.slice:cri-containerd:{ID}"
                ),
                ident(R::Containerd, Some(ID), Some(UID), Some(Burstable)),
            ),
            // Amazon ECS on EC2 (cgroupfs): /ecs/<task id>/<container id>.
            (
                format!("/ecs/{STATIC_UID}/{ID}"),
                ident(R::None, Some(ID), None, None),
            ),
            // A plain systemd service.
            (
                "/system.slice/nginx.service".to_owned(),
                ident(R::Systemd, None, None, None),
            ),
            // The container runtimes' own daemons are plain services too.
            (
                "/system.slice/containerd.service".to_owned(),
                ident(R::Systemd, None, None, None),
            ),
            // A login session scope and PID 1's scope.
            (
                "/user.slice/user-1000.slice/session-2.scope".to_owned(),
                ident(R::Systemd, None, None, None),
            ),
            (
                "/init.scope".to_owned(),
                ident(R::Systemd, None, None, None),
            ),
            // A delegated subtree below a service (e.g. a service managing its own cgroups).
            (
                "/system.slice/buildkitd.service/worker-1".to_owned(),
                ident(R::Systemd, None, None, None),
            ),
            // The root and a bare slice: the host.
            ("/".to_owned(), ContainerIdentity::default()),
            ("/system.slice".to_owned(), ContainerIdentity::default()),
        ];
        assert!(table.len() >= 25);
        for (path, want) in &table {
            assert_eq!(&parse_cgroup_path(path), want, "{path}");
        }
    }

    #[test]
    fn random_components_are_not_container_ids() {
        let none = ContainerIdentity::default();
        let systemd = ident(Runtime::Systemd, None, None, None);
        // A prefix followed by something that is not an ID is just a unit.
        assert_eq!(
            parse_cgroup_path("/system.slice/docker-cafe.scope"),
            systemd
        );
        assert_eq!(
            parse_cgroup_path("/system.slice/docker-compose@web.service"),
            systemd
        );
        assert_eq!(
            parse_cgroup_path("/system.slice/crio-conmon-.scope"),
            systemd
        );
        // Wrong length, wrong case, non-hex.
        assert_eq!(parse_cgroup_path(&format!("/docker/{}", &ID[1..])), none);
        assert_eq!(
            parse_cgroup_path(&format!("/docker/{}", ID.to_uppercase())),
            none
        );
        assert_eq!(parse_cgroup_path(&format!("/docker/{ID}0")), none);
        assert_eq!(parse_cgroup_path(&format!("/docker/{}g", &ID[1..])), none);
        // A pod directory with something else below it: pod known, no container.
        assert_eq!(
            parse_cgroup_path(&format!("/kubepods/burstable/pod{UID}/not-a-container")),
            ident(Runtime::None, None, Some(UID), Some(QosClass::Burstable))
        );
        // A pod-like name outside kubepods is not a pod.
        assert_eq!(parse_cgroup_path(&format!("/somewhere/pod{UID}")), none);
        // A malformed UID is not a pod UID.
        assert_eq!(
            parse_cgroup_path(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podxyz.slice"
            ),
            ident(Runtime::None, None, None, Some(QosClass::Burstable))
        );
        // Colon form with an unknown runtime or a bad ID.
        assert_eq!(
            parse_cgroup_path(&format!("/x/kubepods-pod{UID_}.slice:runq:{ID}")),
            none
        );
        assert_eq!(
            parse_cgroup_path(&format!("/x/kubepods-pod{UID_}.slice:cri-containerd:abc")),
            none
        );
    }

    #[test]
    fn pod_uids() {
        assert_eq!(normalize_pod_uid(UID).as_deref(), Some(UID));
        assert_eq!(
            normalize_pod_uid("7f2e4a1c_8b3d_4f5e_9a6b_1c2d3e4f5a6"),
            None
        );
        assert_eq!(
            normalize_pod_uid("7f2e4a1c-8b3d-4f5e-9a6b1-c2d3e4f5a6b"),
            None
        );
        assert_eq!(
            normalize_pod_uid("zf2e4a1c-8b3d-4f5e-9a6b-1c2d3e4f5a6b"),
            None
        );
        assert_eq!(normalize_pod_uid(""), None);
        assert_eq!(normalize_pod_uid("----"), None);
    }

    #[test]
    fn odd_inputs_do_not_panic() {
        let long = "a/".repeat(10_000);
        let inputs = [
            "",
            "/",
            "//",
            ":::",
            "::",
            "a:b:c:d",
            ".slice",
            "-.slice",
            "kubepods-.slice",
            "kubepods.slice/-.slice",
            "kubepods.slice/kubepods-pod.slice",
            "kubepods/pod",
            "kubepods/burstable/pod-",
            ".scope",
            "docker-.scope",
            "é/ü/漢字/🦀.scope",
            "\0/\u{7f}",
            "kubepods-burstable-pod_____.slice:cri-containerd:",
            long.as_str(),
        ];
        for input in inputs {
            let _ = parse_cgroup_path(input);
        }
    }
}
