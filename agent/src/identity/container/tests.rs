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
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"),
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
            format!("/user.slice/user-1000.slice/user@1000.service/user.slice/docker-{ID}.scope"),
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
            format!("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"),
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
