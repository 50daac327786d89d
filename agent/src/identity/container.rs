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
mod tests;
