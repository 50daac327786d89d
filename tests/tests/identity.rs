//! A real container, named as Kubernetes names it: `runc` runs a busybox rootfs in the cgroup
//! layout that the kubelet's systemd cgroup driver and containerd create, and the test writes
//! the kubelet's log layout for it (`/var/log/pods/<ns>_<pod>_<uid>/<container>/0.log` and the
//! `/var/log/containers/<pod>_<ns>_<container>-<id>.log` symlink). The agent must name it
//! (namespace, pod, container, runtime containerd, container ID) and attribute its context
//! switches to it.
//!
//! Ground truth for the switches is the container process's own kernel counters,
//! `voluntary_ctxt_switches` + `nonvoluntary_ctxt_switches` in `/proc/<pid>/status`, read on
//! both sides of the trace: the agent's window starts after the first reading and ends before
//! the last one, and covers the inner pair of readings. So the agent's count must lie between
//! the inner difference and the outer one (give or take a couple of switches: the agent reads a
//! thread's counters at its switch-outs, so a switch in flight at a window edge can fall on
//! either side).

use std::{
    io::Read as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;
use stormwatch_tests::{Agent, TestCgroup, cgroupfs, require_bpf, run_in_cgroup, v2_root};

const NAMESPACE: &str = "sw-test";
const CONTAINER: &str = "busy";

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .expect("reading /dev/urandom");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// A pod UID in the kubelet's shape (a version-4 UUID).
fn random_pod_uid() -> String {
    let h = random_hex(16);
    format!(
        "{}-{}-4{}-8{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

/// Whether runc's systemd cgroup driver can work here: systemd must be PID 1 and running.
fn systemd_is_running() -> bool {
    std::fs::read_to_string("/proc/1/comm").is_ok_and(|c| c.trim() == "systemd")
        && Path::new("/run/systemd/system").is_dir()
}

fn ctxt_switches(pid: u32) -> u64 {
    let status = stormwatch_tests::process_status(pid)
        .unwrap_or_else(|| panic!("reading /proc/{pid}/status of the container process"));
    let (voluntary, involuntary) = (
        status.voluntary_ctxt_switches,
        status.nonvoluntary_ctxt_switches,
    );
    voluntary
        .zip(involuntary)
        .map(|(v, i)| v + i)
        .unwrap_or_else(|| panic!("no context switch counts in /proc/{pid}/status: {status:?}"))
}

/// Everything the test created, undone on drop (also when the test fails): the container, the
/// cgroups runc created and left behind (its parents), the kubelet log files, the bundle.
struct Pod {
    runc_root: PathBuf,
    name: String,
    started: bool,
    /// (hierarchy root, cgroup directories that did not exist before the test).
    created_cgroups: Vec<(PathBuf, Vec<String>)>,
    /// Files and directories created under /var/log, removed deepest first.
    created_logs: Vec<PathBuf>,
    /// The bundle and runc's state; removed when the pod is dropped, after `cleanup`.
    workdir: tempfile::TempDir,
}

impl Pod {
    fn runc(&self) -> Command {
        let mut c = Command::new("runc");
        c.arg("--root").arg(&self.runc_root);
        c.stdin(Stdio::null());
        c
    }

    fn cleanup(&mut self) -> Vec<String> {
        let mut errors = Vec::new();
        if self.started {
            let _ = self
                .runc()
                .args(["kill", &self.name, "KILL"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            match self.runc().args(["delete", "-f", &self.name]).output() {
                Ok(o) if o.status.success() => self.started = false,
                Ok(o) => errors.push(format!(
                    "runc delete -f {}: {}",
                    self.name,
                    String::from_utf8_lossy(&o.stderr)
                )),
                Err(e) => errors.push(format!("runc delete -f {}: {e}", self.name)),
            }
        }
        for (root, dirs) in std::mem::take(&mut self.created_cgroups) {
            errors.extend(cgroupfs::remove_created_dirs(&root, &dirs));
        }
        for p in std::mem::take(&mut self.created_logs).iter().rev() {
            let r = if p.is_dir() && !p.is_symlink() {
                std::fs::remove_dir(p)
            } else {
                std::fs::remove_file(p)
            };
            if let Err(e) = r
                && e.kind() != std::io::ErrorKind::NotFound
            {
                errors.push(format!("removing {}: {e}", p.display()));
            }
        }
        errors
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let errors = self.cleanup();
        if !errors.is_empty() {
            if std::thread::panicking() {
                eprintln!("cleanup: {errors:?}");
            } else {
                panic!("cleanup failed: {errors:?}");
            }
        }
    }
}

/// Creates `dir` and any missing parents, recording each one created in `created`.
fn create_dirs_recorded(dir: &Path, created: &mut Vec<PathBuf>) {
    let mut missing = Vec::new();
    let mut d = Some(dir);
    while let Some(p) = d {
        if p.exists() {
            break;
        }
        missing.push(p.to_path_buf());
        d = p.parent();
    }
    for p in missing.into_iter().rev() {
        std::fs::create_dir(&p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
        created.push(p);
    }
}

#[test]
fn runc_container_in_kubepods_layout_is_named_and_its_switches_attributed() {
    require_bpf();
    let out = Command::new("runc").arg("--version").output();
    assert!(
        out.as_ref().is_ok_and(|o| o.status.success()),
        "runc is needed for this test (apt-get install runc): {out:?}"
    );
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .expect("busybox (busybox-static) is needed for the container's rootfs");

    let uid = random_pod_uid();
    let id = random_hex(32);
    let pod_name = format!("sw-identity-{}", std::process::id());
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let workdir = tempfile::Builder::new()
        .prefix("sw-identity-")
        .tempdir()
        .expect("a temp dir");
    let mut pod = Pod {
        runc_root: workdir.path().join("runc-state"),
        name: format!("sw-identity-{}-{stamp}", std::process::id()),
        started: false,
        created_cgroups: Vec::new(),
        created_logs: Vec::new(),
        workdir,
    };

    // The rootfs: a static busybox and the `sh` link.
    let bundle = pod.workdir.path().join("bundle");
    let bin = bundle.join("rootfs/bin");
    std::fs::create_dir_all(&bin).expect("creating the rootfs");
    std::fs::copy(busybox, bin.join("busybox")).expect("copying busybox into the rootfs");
    std::os::unix::fs::symlink("busybox", bin.join("sh")).expect("symlink sh");
    let spec = Command::new("runc")
        .arg("spec")
        .current_dir(&bundle)
        .output()
        .expect("runc spec");
    assert!(spec.status.success(), "runc spec: {spec:?}");
    let config_path = bundle.join("config.json");
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(&config_path).expect("reading config.json"))
            .expect("runc spec wrote JSON");
    config["process"]["terminal"] = Value::Bool(false);
    // A busy loop in the shell itself (no child processes), so that the one process's
    // /proc/<pid>/status holds every switch of the container.
    config["process"]["args"] =
        serde_json::json!(["/bin/busybox", "sh", "-c", "while :; do :; done"]);

    // The kubelet (systemd cgroup driver) + containerd layout. With systemd running, runc's
    // systemd driver gets containerd's own `slice:prefix:name` notation and systemd creates the
    // nested slices; without systemd (as on this test VM, where PID 1 is not systemd), runc's
    // cgroupfs driver gets the absolute path that systemd would have created, literally.
    let uid_ = uid.replace('-', "_");
    let pod_slice = format!("kubepods-burstable-pod{uid_}.slice");
    let cgroup_rel =
        format!("/kubepods.slice/kubepods-burstable.slice/{pod_slice}/cri-containerd-{id}.scope");
    let systemd = systemd_is_running();
    config["linux"]["cgroupsPath"] = Value::String(if systemd {
        format!("{pod_slice}:cri-containerd:{id}")
    } else {
        cgroup_rel.clone()
    });
    std::fs::write(&config_path, serde_json::to_vec_pretty(&config).unwrap())
        .expect("writing config.json");
    if !systemd {
        for h in cgroupfs::hierarchies() {
            let missing = cgroupfs::missing_dirs(&h.mount_point, &cgroup_rel);
            pod.created_cgroups.push((h.mount_point, missing));
        }
    }

    // The kubelet's log layout, created before the agent starts so its first scan finds it.
    let pods_dir = Path::new("/var/log/pods");
    let containers_dir = Path::new("/var/log/containers");
    let pod_log_dir = pods_dir.join(format!("{NAMESPACE}_{pod_name}_{uid}"));
    let log_file = pod_log_dir.join(CONTAINER).join("0.log");
    let link = containers_dir.join(format!("{pod_name}_{NAMESPACE}_{CONTAINER}-{id}.log"));
    for p in [&pod_log_dir, &link] {
        assert!(
            !p.exists() && !p.is_symlink(),
            "{} exists already: not clobbering it",
            p.display()
        );
    }
    create_dirs_recorded(log_file.parent().unwrap(), &mut pod.created_logs);
    std::fs::write(&log_file, "").expect("creating the container's log file");
    pod.created_logs.push(log_file.clone());
    create_dirs_recorded(containers_dir, &mut pod.created_logs);
    std::os::unix::fs::symlink(&log_file, &link).expect("creating the /var/log/containers link");
    pod.created_logs.push(link.clone());

    // Competition for the CPU, so that the container's busy loop is preempted (involuntary
    // switches) hundreds of times a second instead of owning a CPU undisturbed: a rival and the
    // container share CPU 0 (both pinned there). Left to the balancer, the container's cgroup
    // (one thread, one CPU's worth of weight) often had a CPU to itself: 18 switches in 3 s.
    let rivals = TestCgroup::new("identity-rivals");
    let rival_child = run_in_cgroup(
        Command::new("taskset").args([
            "-c",
            "0",
            env!("CARGO_BIN_EXE_spin"),
            "--threads",
            "1",
            "--seconds",
            "12",
        ]),
        &rivals,
    );

    let mut run = pod.runc();
    if systemd {
        run.arg("--systemd-cgroup");
    }
    // The detached container inherits runc's stdio: a pipe would stay open as long as the
    // container runs, so its stderr goes to a file.
    let runc_log = pod.workdir.path().join("runc-run.stderr");
    let status = run
        .args(["run", "-d", "--bundle"])
        .arg(&bundle)
        .arg(&pod.name)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&runc_log).expect("creating runc's stderr file"))
        .status()
        .expect("runc run");
    pod.started = true;
    assert!(
        status.success(),
        "runc run -d failed ({status}): {}",
        std::fs::read_to_string(&runc_log).unwrap_or_default()
    );
    let state = pod
        .runc()
        .args(["state", &pod.name])
        .output()
        .expect("runc state");
    let state: Value = serde_json::from_slice(&state.stdout)
        .unwrap_or_else(|e| panic!("runc state printed no JSON ({e}): {state:?}"));
    let pid = state["pid"].as_u64().expect("runc state has the pid") as u32;
    let own_cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    assert!(
        own_cgroup.lines().any(|l| l == format!("0::{cgroup_rel}")),
        "the container process should be in {cgroup_rel} of the v2 hierarchy:\n{own_cgroup}"
    );
    assert!(
        v2_root().join(cgroup_rel.trim_start_matches('/')).is_dir(),
        "the container's cgroup in the v2 hierarchy"
    );

    let pinned = Command::new("taskset")
        .args(["-a", "-p", "-c", "0", &pid.to_string()])
        .output()
        .expect("taskset");
    assert!(
        pinned.status.success(),
        "pinning the container to CPU 0: {}",
        String::from_utf8_lossy(&pinned.stderr)
    );
    let outer_before = ctxt_switches(pid);
    let mut agent = Agent::trace(&["--json", "--duration", "5"]);
    let inner_before = ctxt_switches(pid);
    std::thread::sleep(Duration::from_millis(3000));
    let inner_after = ctxt_switches(pid);
    agent.assert_still_tracing("the inner reading of the container's switches");
    let done = agent.finish();
    let outer_after = ctxt_switches(pid);
    drop(rivals);
    let _ = rival_child.wait_with_output();

    let c = done
        .trace
        .container_by_path(&cgroup_rel)
        .unwrap_or_else(|| {
            panic!(
                "the container's cgroup {cgroup_rel} is not in the report: {}",
                done.trace.cgroups()
            )
        });
    let cs = c.switches();
    let got = cs.total() as f64;
    let (lower, upper) = (
        (inner_after - inner_before) as f64,
        (outer_after - outer_before) as f64,
    );
    eprintln!(
        "container {:?}: namespace {:?} pod {:?} container {:?} runtime {} id {:?}; switches \
         {cs:?} = {got}, /proc inner {lower}, outer {upper}",
        c.cgroup, c.namespace, c.pod, c.container, c.runtime, c.container_id
    );
    assert_eq!(c.namespace.as_deref(), Some(NAMESPACE), "namespace: {c:#?}");
    assert_eq!(c.pod.as_deref(), Some(pod_name.as_str()), "pod: {c:#?}");
    assert_eq!(c.container.as_deref(), Some(CONTAINER), "container: {c:#?}");
    assert_eq!(c.runtime, "containerd", "runtime: {c:#?}");
    assert_eq!(
        c.container_id.as_deref(),
        Some(id.as_str()),
        "container_id: {c:#?}"
    );

    // The premise: the container switched measurably inside the trace, so attribution is
    // checked on real events. Sharing one CPU with a rival, the busy loop is preempted every
    // scheduler slice (a few ms): hundreds in 3 s; the floor is far below that.
    assert!(
        lower >= 20.0,
        "the busy loop should be preempted by its rivals ({lower} switches in 3 s): the \
         test's premise"
    );
    let slack = 2.0 + 0.02 * upper;
    assert!(
        got > 0.0 && got >= lower - slack && got <= upper + slack,
        "container's context switches: agent {got}, /proc/{pid}/status says between {lower} \
         (inside the trace) and {upper} (around it), slack {slack}"
    );
    let errors = pod.cleanup();
    assert!(errors.is_empty(), "cleanup failed: {errors:?}");
}
