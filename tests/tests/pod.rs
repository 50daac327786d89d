//! The DaemonSet's pod, run as deploy/daemonset.yaml says, in a real OCI runtime: Debian's
//! podman (rootful) with runc.
//!
//! Everything the runtime is told comes from the manifest, read by `deploy::Pod` (beside the
//! other deploy helpers, in tests/src/deploy.rs): the container's args and env, the
//! capabilities (drop ALL, add what it lists), readOnlyRootFilesystem (and no tmpfs podman
//! would add by itself), no-new-privileges, runAsUser/runAsGroup, hostPID, the hostPath
//! volumes read-only at their mountPaths, the ConfigMap's config.toml as the config file, the
//! resource limits, and the seccomp profile: `RuntimeDefault` is run as
//! deploy/seccomp/stormwatch.json, the equivalent of containerd ≥ 1.7's default (bpf for
//! CAP_BPF holders, perf_event_open for CAP_PERFMON holders); a `Localhost` profile is run as
//! the file of that name in deploy/seccomp/. AppArmor `RuntimeDefault` is podman's default;
//! AppArmor is not enabled on the test machines, so no AppArmor profile applies there.
//!
//! The image holds only the agent (target/release/stormwatch) and the shared libraries `ldd`
//! names — what the Containerfile's runtime stage holds (its distroless base cannot be pulled
//! here: no registry) — imported with `podman import`.
//!
//! Not from the manifest: the metrics port is published on a free loopback port (the pod's IP
//! is not reachable from the host in podman's bridge network), and `--ulimit nofile=1024:1024
//! --ulimit nproc=1024:1024`, because these sandboxes refuse the raised rlimits podman asks for
//! by default.
//!
//! Cgroups: on a hybrid host (v1 controllers, the v2 tree at /sys/fs/cgroup/unified, as on the
//! test machines) the manifest's mount of the host's /sys/fs/cgroup brings the v2 tree along at
//! /sys/fs/cgroup/unified, where the agent finds it from its mountinfo — as it does at
//! /sys/fs/cgroup on a v2-only host. The test does not rewrite the mount for either layout.
//!
//! Checks: /readyz answers 200, every probe is attached (`stormwatch_probe_attached`) but the
//! wake-up probes the ConfigMap attaches on demand, and a busy workload in a fresh cgroup on the
//! host has scheduler series whose figures match the kernel's own (cgroup `cpu.stat` and the
//! workload's getrusage). A lock storm on the host makes the pod attach the wake-up probes, under
//! the same privileges. Another case runs the pod
//! under podman's default seccomp profile (containers-common 0.50: bpf and perf_event_open only
//! with CAP_SYS_ADMIN) and checks that `stormwatch check` names seccomp as the cause, with the
//! fix, and exits non-zero.
//!
//! Nothing is skipped: a missing podman fails the test with how to install it. Needs root.

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use serde_json::Value as Json;
use stormwatch_tests::{
    ONCPU_TOLERANCE, TestCgroup, agent_bin,
    daemon::{
        PACKET_PROBES, all_attached, finding, free_port, http_get, probe_attached, sample,
        sample_with, sum_with, tool, wait_for,
    },
    deploy::{Pod, repo_file},
    netns::{self, Netns, ping_counts},
    num, run_in_cgroup, workload_result,
};

/// The probes the ConfigMap's `wake_kinds = "on-demand"` loads at start and attaches while a
/// lock storm is found.
const WAKE_PROBES: [&str; 3] = [
    "sched:sched_waking",
    "sched:sched_wakeup",
    "sched:sched_wakeup_new",
];

/// The probes the ConfigMap's `futex_probes = "on-demand"` loads at start and attaches while a
/// cgroup's scheduler figures look like a lock storm: those of the futex syscalls this kernel
/// has (the futex2 ones are 6.7+).
fn futex_probes() -> Vec<String> {
    [
        "sys_enter_futex",
        "sys_exit_futex",
        "sys_enter_futex_wait",
        "sys_exit_futex_wait",
        "sys_enter_futex_waitv",
        "sys_exit_futex_waitv",
        "sys_enter_futex_wake",
        "sys_exit_futex_wake",
    ]
    .into_iter()
    .filter(|e| {
        Path::new("/sys/kernel/tracing/events/syscalls")
            .join(e)
            .is_dir()
    })
    .map(|e| format!("syscalls:{e}"))
    .collect()
}

/// Start-up: loading and attaching the probes (the manifest's readiness has 120 s).
const READY_TIMEOUT: Duration = Duration::from_secs(90);

fn repo(file: &str) -> PathBuf {
    repo_file(file)
}

// ---- podman ---------------------------------------------------------------------------------

fn podman() -> Command {
    let mut cmd = Command::new(tool("podman", "apt-get install -y podman"));
    cmd.stdin(Stdio::null());
    cmd
}

fn output(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

#[track_caller]
fn succeed(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn unique(what: &str) -> String {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    format!(
        "sw-{what}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// The shared libraries `ldd` lists for a binary (the loader included), as absolute paths.
fn shared_libraries(bin: &Path) -> Vec<PathBuf> {
    let text = succeed(Command::new("ldd").arg(bin));
    text.lines()
        .filter_map(|l| {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)", "/lib64/ld-linux….so.2 (0x…)",
            // "linux-vdso.so.1 (0x…)" (in the kernel, no file).
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// An image with only the agent and its shared libraries; removed on drop.
struct Image(String);

impl Image {
    fn build() -> Self {
        let bin = agent_bin();
        let root = tempfile::tempdir().expect("a temp dir");
        // This directory becomes the image's `/`: 0755 like any root file system, not the 0700
        // tempfile gives it.
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod the image root");
        let mut files = vec![(bin.to_path_buf(), PathBuf::from("usr/local/bin/stormwatch"))];
        for lib in shared_libraries(bin) {
            let inside = lib.strip_prefix("/").expect("absolute").to_path_buf();
            files.push((lib, inside));
        }
        assert!(files.len() > 1, "the agent is dynamically linked (glibc)");
        for (from, to) in &files {
            let to = root.path().join(to);
            std::fs::create_dir_all(to.parent().expect("a parent")).expect("image directories");
            // Dereferenced: the image has no symlink farm.
            std::fs::copy(from, &to)
                .unwrap_or_else(|e| panic!("copying {} into the image: {e}", from.display()));
        }
        let tar = tempfile::Builder::new()
            .suffix(".tar")
            .tempfile()
            .expect("a temp file for the image");
        succeed(
            Command::new("tar")
                .arg("-C")
                .arg(root.path())
                .arg("-cf")
                .arg(tar.path())
                .arg("."),
        );
        let tag = format!("localhost/{}:pod", unique("stormwatch"));
        succeed(
            podman()
                .args(["import", "--quiet", "--change"])
                .arg(r#"ENTRYPOINT ["/usr/local/bin/stormwatch"]"#)
                .arg(tar.path())
                .arg(&tag),
        );
        Image(tag)
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = podman().args(["rmi", "--force", &self.0]).output();
    }
}

/// A running container, removed on drop.
struct Container {
    name: String,
}

impl Container {
    fn logs(&self) -> String {
        let out = output(podman().args(["logs", &self.name]));
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    fn running(&self) -> bool {
        let out = output(podman().args(["inspect", "--format", "{{.State.Running}}", &self.name]));
        String::from_utf8_lossy(&out.stdout).trim() == "true"
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman()
            .args(["rm", "--force", "--time", "2", &self.name])
            .output();
    }
}

/// The host directories the hostPath volumes name must exist (`type: Directory`); the
/// kubelet's log directories do not on a machine without a kubelet. Created empty for the test
/// and removed after.
struct HostDirs(Vec<PathBuf>);

impl HostDirs {
    fn ensure(pod: &Pod) -> Self {
        let mut created = Vec::new();
        for m in &pod.mounts {
            if m.source.starts_with("/var/log") && !m.source.exists() {
                std::fs::create_dir_all(&m.source)
                    .unwrap_or_else(|e| panic!("creating {}: {e}", m.source.display()));
                created.push(m.source.clone());
            }
        }
        HostDirs(created)
    }
}

impl Drop for HostDirs {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = std::fs::remove_dir(d);
        }
    }
}

// ---- the tests ------------------------------------------------------------------------------

#[test]
fn the_manifest_is_what_this_test_runs() {
    // The premises the pod test relies on, read from the manifest (so a change there is seen).
    let pod = Pod::from_manifest();
    assert_eq!(pod.cap_drop, ["ALL"]);
    assert!(pod.read_only_root, "readOnlyRootFilesystem");
    assert!(pod.no_new_privileges, "allowPrivilegeEscalation: false");
    assert!(
        pod.mounts.iter().all(|m| m.read_only),
        "every volume is mounted read-only: {:?}",
        pod.mounts
    );
    assert!(
        pod.mounts
            .iter()
            .any(|m| m.target == "/sys/fs/cgroup" && m.source == Path::new("/sys/fs/cgroup")),
        "the host's cgroup hierarchy at /sys/fs/cgroup"
    );
    let config = pod
        .args
        .windows(2)
        .find(|w| w[0] == "--config")
        .map(|w| PathBuf::from(&w[1]))
        .expect("run --config FILE");
    assert!(
        pod.mounts
            .iter()
            .any(|m| config.starts_with(&m.target) && m.source.join("config.toml").is_file()),
        "the ConfigMap's config.toml is the file `run --config` reads: {config:?}"
    );
}

/// containers-common's default profile resolved for the manifest's capabilities the way
/// podman and CRI-O resolve it (a rule applies when the bounding set holds every capability
/// of `includes.caps` and none of `excludes.caps`), plus exactly bpf and perf_event_open.
#[test]
fn the_localhost_seccomp_profile_is_the_runtime_default_plus_bpf_and_perf_event_open() {
    const DEFAULT: &str = "/usr/share/containers/seccomp.json";
    let read = |p: &Path| -> Json {
        let text = std::fs::read_to_string(p).unwrap_or_else(|e| {
            panic!(
                "reading {}: {e} (installed with podman: `apt-get install -y podman`)",
                p.display()
            )
        });
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let default = read(Path::new(DEFAULT));
    let ours = read(&repo("deploy/seccomp/stormwatch.json"));
    let pod = Pod::from_manifest();
    let bounding: BTreeSet<String> = pod.cap_add.iter().map(|c| format!("CAP_{c}")).collect();

    let caps = |rule: &Json, key: &str| -> Vec<String> {
        rule[key]["caps"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|c| c.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let added = ["bpf", "perf_event_open"];
    let mut want: Vec<Json> = Vec::new();
    for rule in default["syscalls"].as_array().expect("syscalls") {
        let inc = caps(rule, "includes");
        let exc = caps(rule, "excludes");
        if !inc.iter().all(|c| bounding.contains(c)) || exc.iter().any(|c| bounding.contains(c)) {
            continue;
        }
        let mut rule = rule.clone();
        // Resolved: no capability condition is left for a runtime to evaluate (containerd
        // reads Localhost profiles in the OCI format, which has none).
        for key in ["includes", "excludes"] {
            if let Some(m) = rule[key].as_object_mut() {
                m.remove("caps");
            }
        }
        if rule["action"] != "SCMP_ACT_ALLOW" {
            // The refusal of the two syscalls gives way to the rules allowing them.
            let names = rule["names"].as_array_mut().expect("names");
            names.retain(|n| !added.contains(&n.as_str().unwrap_or("")));
            if names.is_empty() {
                continue;
            }
        }
        want.push(rule);
    }
    let got = ours["syscalls"].as_array().expect("syscalls in ours");
    assert!(got.len() > added.len(), "a whole profile");
    let (resolved, ours_added) = got.split_at(got.len() - added.len());
    assert_eq!(
        resolved,
        want.as_slice(),
        "deploy/seccomp/stormwatch.json is {DEFAULT} resolved for {bounding:?}"
    );
    for (rule, name) in ours_added.iter().zip(added) {
        assert_eq!(rule["names"], serde_json::json!([name]));
        assert_eq!(rule["action"], "SCMP_ACT_ALLOW");
        assert!(
            rule["args"].as_array().is_none_or(|a| a.is_empty()),
            "{name}: no argument condition"
        );
    }
    for key in ["defaultAction", "defaultErrnoRet", "archMap"] {
        assert_eq!(ours[key], default[key], "{key} as in {DEFAULT}");
    }
}

/// The pod, started detached as the manifest says and ready; removed on drop.
struct RunningPod {
    // Dropped in this order: the container, then the image and the host directories.
    container: Container,
    addr: SocketAddr,
    _image: Image,
    _dirs: HostDirs,
}

impl RunningPod {
    fn start(pod: &Pod) -> Self {
        let dirs = HostDirs::ensure(pod);
        let image = Image::build();
        let port = free_port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let name = unique("pod");
        let mut run = podman();
        run.args(["run", "--detach", "--name", &name])
            .args(pod.podman_args(Some(&pod.seccomp)))
            .args([
                "--publish",
                &format!("127.0.0.1:{port}:{}", pod.container_port),
            ])
            .arg(&image.0)
            .args(&pod.args);
        succeed(&mut run);
        let container = Container { name };

        // Ready: the probes are attached.
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if http_get(addr, "/readyz", None).is_ok_and(|r| r.status == 200) {
                break;
            }
            assert!(
                container.running(),
                "the pod exited before it was ready:\n{}",
                container.logs()
            );
            assert!(
                Instant::now() < deadline,
                "not ready after {READY_TIMEOUT:?}:\n{}",
                container.logs()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        RunningPod {
            container,
            addr,
            _image: image,
            _dirs: dirs,
        }
    }

    /// Waits for the survey that attaches the per-packet probes at the first judgement (the
    /// ConfigMap's `net_packet_probes = "on-demand"`): they then stay attached for a diagnosis
    /// window (30 s), when what a test sends is counted.
    fn surveying(&self) {
        wait_for(
            "the per-packet probes' survey",
            Duration::from_secs(40),
            || {
                let logs = self.container.logs();
                assert!(
                    !logs.contains("per-packet network probes on demand:"),
                    "the pod could not attach the per-packet probes:\n{logs}"
                );
                all_attached(&self.metrics(), PACKET_PROBES, 1.0).then_some(())
            },
        );
    }

    fn metrics(&self) -> String {
        let r = http_get(self.addr, "/metrics", None).expect("scraping /metrics");
        assert_eq!(r.status, 200, "{}", r.body);
        r.body
    }

    /// Scrapes until a collection that began at least one interval after `ended` has
    /// published figures for `series`: everything up to `ended` is then in them.
    fn figures_after(&self, ended: f64, series: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let t = self.metrics();
            let stamp = sample(&t, "stormwatch_last_collection_timestamp_seconds");
            // Collections every interval_seconds (5 s): one after the end, then one more.
            if sample(&t, series).is_some() && stamp.is_some_and(|s| s > ended + 5.0) {
                return t;
            }
            let logs = self.container.logs();
            // The ConfigMap's max_cgroups is a premise: on a shared machine other tests' cgroups
            // may fill it first; say so rather than leave a bare "missing".
            let rel = series
                .split_once("cgroup=\"")
                .and_then(|(_, r)| r.split_once('"'))
                .map_or("", |(rel, _)| rel);
            let refused = logs
                .lines()
                .find(|l| l.contains(&format!("not exporting cgroup {rel}:")));
            assert!(
                Instant::now() < deadline,
                "no {series} from the pod{}:\n{t}\nlogs:\n{logs}",
                refused.map_or(String::new(), |l| format!(
                    " — refused by max_cgroups: the host has more cgroups than the ConfigMap \
                     allows (other tests running?): {l}"
                ))
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
}

/// `{namespace="",pod="",container="",cgroup="…"` — a host cgroup's labels, left open.
fn host_cgroup_labels(cgroup: &TestCgroup) -> String {
    format!(
        "{{namespace=\"\",pod=\"\",container=\"\",cgroup=\"{}\"",
        cgroup.rel_path()
    )
}

#[test]
fn the_pod_runs_as_the_manifest_says() {
    stormwatch_tests::require_bpf();
    let pod = Pod::from_manifest();
    let running = RunningPod::start(&pod);
    let text = running.metrics();
    let probes: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("stormwatch_probe_attached{"))
        .collect();
    assert!(!probes.is_empty(), "no stormwatch_probe_attached:\n{text}");
    // The manifest's configuration attaches the wake-up probes (while a lock storm is found),
    // the futex probes (while one looks likely) and the per-packet probes (while packets do not
    // fit, and in surveys) on demand: loaded, and reported so, but not attached while nothing
    // storms.
    let on_demand: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("stormwatch_probe_on_demand{tracepoint=\""))
        .filter_map(|l| l.strip_suffix("\"} 1"))
        .collect();
    let futex = futex_probes();
    let mut expected_on_demand = WAKE_PROBES.to_vec();
    expected_on_demand.extend(futex.iter().map(String::as_str));
    expected_on_demand.extend(PACKET_PROBES);
    let mut seen_on_demand = on_demand.clone();
    seen_on_demand.sort_unstable();
    expected_on_demand.sort_unstable();
    assert_eq!(
        seen_on_demand, expected_on_demand,
        "the wake-up, futex and per-packet probes, loaded under the manifest's privileges, on \
         demand:\n{text}"
    );
    // Asserted at the end, after the figures: a detached probe should not hide them.
    let detached: Vec<String> = probes
        .iter()
        .filter(|l| l.ends_with(" 0"))
        .filter(|l| {
            !on_demand
                .iter()
                .any(|tp| l.contains(&format!("tracepoint=\"{tp}\"")))
        })
        .map(|l| l.to_string())
        .collect();

    // A busy workload in a fresh cgroup on the host: 1 CPU-bound thread for 6 s.
    let cgroup = TestCgroup::new("pod");
    let bins = agent_bin().parent().expect("target dir").to_path_buf();
    let spin = run_in_cgroup(
        Command::new(bins.join("spin")).args(["--threads", "1", "--seconds", "6"]),
        &cgroup,
    );
    let rusage = workload_result(spin);
    let usage_usec = std::fs::read_to_string(cgroup.path().join("cpu.stat"))
        .expect("cpu.stat of the workload's cgroup")
        .lines()
        .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse::<f64>().ok())
        .expect("usage_usec in cpu.stat");

    // Two collections after the workload ended: its whole life is in the figures.
    let labels = host_cgroup_labels(&cgroup);
    let oncpu_series = format!("stormwatch_oncpu_seconds_total{labels}");
    let text = running.figures_after(unix_now(), &oncpu_series);
    let oncpu = sample(&text, &oncpu_series).expect("on-CPU time");
    let kernel_oncpu = usage_usec / 1e6;
    assert!(
        (oncpu - kernel_oncpu).abs() <= ONCPU_TOLERANCE * kernel_oncpu,
        "on-CPU {oncpu} s vs the cgroup's cpu.stat {kernel_oncpu} s"
    );
    let switches: f64 = ["voluntary", "involuntary"]
        .iter()
        .map(|t| {
            let series = format!("stormwatch_context_switches_total{labels},type=\"{t}\"}}");
            sample(&text, &series).unwrap_or_else(|| panic!("{series} in:\n{text}"))
        })
        .sum();
    let rusage_switches = num(&rusage, "nvcsw") + num(&rusage, "nivcsw");
    eprintln!(
        "pod: on-CPU {oncpu:.3} s (cpu.stat {kernel_oncpu:.3} s), switches {switches} \
         (getrusage {rusage_switches})"
    );
    // getrusage counts the process's switches from its fork; the cgroup has them from its
    // joining (just before exec) to its exit, after getrusage.
    assert!(
        (switches - rusage_switches).abs() <= rusage_switches * 0.1 + 20.0,
        "context switches {switches} vs getrusage {rusage_switches}"
    );
    let runq = format!("stormwatch_runqueue_latency_seconds_count{labels}");
    assert!(
        sample(&text, &runq).is_some_and(|n| n > 0.0),
        "{runq} in:\n{text}"
    );

    // The liveness probe's path, after all this.
    let health = http_get(running.addr, "/healthz", None).expect("GET /healthz");
    assert_eq!(health.status, 200, "/healthz: {}", health.body);

    assert!(
        detached.is_empty(),
        "every probe attached under the manifest's privileges; not: {detached:#?}\nlogs:\n{}",
        running.container.logs()
    );
}

/// The manifest's configuration attaches the wake-up probes only while a lock storm is found
/// (`wake_kinds = "on-demand"`): that later attach runs under the pod's capabilities and the
/// runtime's seccomp profile as the start did, and must work there too. A 64-thread mutex storm
/// in a fresh cgroup on the host: the pod must find it, attach `sched_waking` (and the other
/// two), and tell the storm's wake-ups local or remote.
#[test]
fn the_pod_attaches_the_wake_up_probes_when_it_finds_a_lock_storm() {
    stormwatch_tests::require_bpf();
    let pod = Pod::from_manifest();
    let running = RunningPod::start(&pod);
    let text = running.metrics();
    for tp in WAKE_PROBES
        .iter()
        .copied()
        .chain(futex_probes().iter().map(String::as_str))
    {
        assert_eq!(
            probe_attached(&text, tp),
            Some(0.0),
            "{tp} not attached yet:\n{text}"
        );
    }

    let cgroup = TestCgroup::new("pod-storm");
    let labels = host_cgroup_labels(&cgroup);
    let bins = agent_bin().parent().expect("target dir").to_path_buf();
    let mut storm = run_in_cgroup(
        Command::new(bins.join("mutex_storm")).args([
            "--threads",
            "64",
            "--seconds",
            "60",
            "--inside",
            "2000",
            "--outside",
            "2000",
        ]),
        &cgroup,
    );
    let started = Instant::now();
    let rel = cgroup.rel_path();
    let found = |text: &str| finding(text, "lock_storm", rel).is_some();
    // The ConfigMap's window is 30 s, collections every 5 s: found well within the storm.
    let deadline = Duration::from_secs(45);
    loop {
        let text = running.metrics();
        if found(&text) {
            break;
        }
        assert!(
            started.elapsed() < deadline,
            "no lock storm found by the pod within {deadline:?}; its series of the cgroup:\n{}\nlogs:\n{}",
            text.lines()
                .filter(|l| l.contains(&labels) && !l.contains("_bucket"))
                .collect::<Vec<_>>()
                .join("\n"),
            running.container.logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!(
        "the pod found the storm {:?} after it started",
        started.elapsed()
    );
    // Attached at the step that found it (the exposition may lag one collection); a refusal
    // is logged, and the probes stay detached.
    wait_for(
        "the wake-up probes attached on demand in the pod",
        Duration::from_secs(12),
        || {
            let logs = running.container.logs();
            for tier in ["wake-up", "futex"] {
                assert!(
                    !logs.contains(&format!("{tier} probes on demand:")),
                    "the pod could not attach the {tier} probes:\n{logs}"
                );
            }
            all_attached(&running.metrics(), WAKE_PROBES, 1.0).then_some(())
        },
    );
    // The futex probes were attached before the storm could be found (the rule needs their
    // figures), under the same privileges.
    let text = running.metrics();
    for tp in futex_probes() {
        assert_eq!(
            probe_attached(&text, &tp),
            Some(1.0),
            "{tp} attached on demand in the pod once the storm was found:\n{text}"
        );
    }
    let told = wait_for(
        "the storm's wake-ups told local or remote",
        Duration::from_secs(12),
        || {
            sum_with(
                &running.metrics(),
                "stormwatch_wakeups_total",
                &[("cgroup", rel)],
            )
            .filter(|&n| n > 0.0)
        },
    );
    eprintln!("the pod told {told} of the storm's wake-ups local or remote");
    let _ = storm.kill();
    let _ = storm.wait();
}

/// Per-container network series in the pod, under the manifest's privileges: a workload in a
/// fresh cgroup sends a known number of sized pings; the cgroup's sent packets and bytes must
/// be exactly those.
#[test]
fn the_pod_exports_network_series_for_a_workload() {
    stormwatch_tests::require_bpf();
    let pod = Pod::from_manifest();
    let running = RunningPod::start(&pod);
    running.surveying();
    let cgroup = TestCgroup::new("pod-net");
    const PINGS: u32 = 20;
    const PAYLOAD: u32 = 1000;
    let ping = run_in_cgroup(
        Command::new("ping").args([
            "-q",
            "-c",
            &PINGS.to_string(),
            "-i",
            "0.05",
            "-s",
            &PAYLOAD.to_string(),
            "127.0.0.1",
        ]),
        &cgroup,
    );
    let out = ping.wait_with_output().expect("waiting for ping");
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ping failed: {summary}");
    assert!(
        summary.contains(&format!("{PINGS} packets transmitted")),
        "ping sent {PINGS}: {summary}"
    );

    // Sent by the ping's socket: exactly the echo requests, each an IP packet of 20 + 8 +
    // PAYLOAD bytes (the replies are the kernel's, not the cgroup's).
    let labels = host_cgroup_labels(&cgroup);
    let sent =
        |family: &str| format!("stormwatch_network_{family}_total{labels},direction=\"sent\"}}");
    let text = running.figures_after(unix_now(), &sent("packets"));
    let packets = sample(&text, &sent("packets")).expect("packets sent");
    let bytes =
        sample(&text, &sent("bytes")).unwrap_or_else(|| panic!("{} in:\n{text}", sent("bytes")));
    assert_eq!(packets, f64::from(PINGS), "packets sent by {PINGS} pings");
    assert_eq!(
        bytes,
        f64::from(PINGS * (20 + 8 + PAYLOAD)),
        "IP bytes of {PINGS} pings of {PAYLOAD} bytes"
    );
    // The pings went through the host's network namespace, which the pod cannot see (no host
    // pids): the agent must still know it is the host's (the kernel's fixed inode, from BTF)
    // and credit what it receives to no container — not to the first cgroup seen sending there.
    let received = format!("stormwatch_network_packets_total{labels},direction=\"received\"}}");
    assert_eq!(
        sample(&text, &received).unwrap_or(0.0),
        0.0,
        "the host's namespace is no container's: {received} in\n{text}"
    );
}

#[test]
fn the_pod_names_the_interfaces_of_namespaces_it_cannot_enter() {
    stormwatch_tests::require_bpf();
    netns::require_tools();
    let pod = Pod::from_manifest();
    let running = RunningPod::start(&pod);
    // Two namespaces joined by a veth pair with MTUs no default gives. The pod can neither
    // enter them (CAP_SYS_ADMIN) nor see a process in them (its own pid namespace): what it
    // knows of them comes from the kernel's `net_device`s, as its probes saw them.
    let (a, b) = (Netns::new("podinv"), Netns::new("podinv"));
    a.ip(&[
        "link",
        "add",
        "swin0",
        "mtu",
        "1380",
        "type",
        "veth",
        "peer",
        "name",
        "swin1",
        "netns",
        b.name(),
    ]);
    b.ip(&["link", "set", "swin1", "mtu", "1280"]);
    a.ip(&["addr", "add", "10.231.0.1/24", "dev", "swin0"]);
    b.ip(&["addr", "add", "10.231.0.2/24", "dev", "swin1"]);
    a.ip(&["link", "set", "swin0", "up"]);
    b.ip(&["link", "set", "swin1", "up"]);
    running.surveying();
    let out = a.exec(&[
        "ping",
        "-q",
        "-c",
        "5",
        "-i",
        "0.1",
        "-s",
        "500",
        "10.231.0.2",
    ]);
    let (sent, answered) = ping_counts(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(
        (sent, answered),
        (5, 5),
        "the premise: the veth pair carries the pings"
    );

    let ifindex = |ns: &Netns, dev: &str| {
        let out = ns.exec(&["cat", &format!("/sys/class/net/{dev}/ifindex")]);
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let expect = [
        (&a, "swin0", ifindex(&a, "swin0"), 1380.0),
        (&b, "swin1", ifindex(&b, "swin1"), 1280.0),
    ];
    // The MTU inventory is refreshed with each diagnosis step.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = running.metrics();
        let found: Vec<Option<f64>> = expect
            .iter()
            .map(|(ns, name, ifindex, _)| {
                let netns = ns.inode().to_string();
                sample_with(
                    &text,
                    "stormwatch_interface_mtu_bytes",
                    &[
                        ("netns", &netns),
                        ("ifindex", ifindex),
                        ("interface", name),
                        ("kind", "veth"),
                    ],
                )
            })
            .collect();
        if found.iter().all(Option::is_some) {
            for ((_, name, _, mtu), got) in expect.iter().zip(found) {
                assert_eq!(got, Some(*mtu), "{name}'s MTU as the pod exports it");
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pod did not name swin0 and swin1 within a minute (found {found:?}):\n{text}\n\
             logs:\n{}",
            running.container.logs()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn check_names_seccomp_under_the_older_default_profile() {
    stormwatch_tests::require_bpf();
    // The premise: podman's default is containers-common's, where bpf and perf_event_open
    // are allowed only with CAP_SYS_ADMIN (and refused with EPERM otherwise).
    let default: Json = serde_json::from_str(
        &std::fs::read_to_string("/usr/share/containers/seccomp.json")
            .expect("podman's default seccomp profile (apt-get install -y podman)"),
    )
    .expect("JSON");
    let only_sys_admin = default["syscalls"]
        .as_array()
        .expect("syscalls")
        .iter()
        .filter(|r| {
            r["names"]
                .as_array()
                .is_some_and(|n| n.iter().any(|n| n == "bpf"))
        })
        .all(|r| {
            r["action"] != "SCMP_ACT_ALLOW"
                || r["includes"]["caps"] == serde_json::json!(["CAP_SYS_ADMIN"])
        });
    assert!(
        only_sys_admin,
        "premise: the default allows bpf only with CAP_SYS_ADMIN"
    );

    let pod = Pod::from_manifest();
    let _dirs = HostDirs::ensure(&pod);
    let image = Image::build();
    let out = output(
        podman()
            .args(["run", "--rm"])
            .args(pod.podman_args(None))
            .arg(&image.0)
            .arg("check"),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "check must fail under this profile:\n{stdout}{stderr}"
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("FAIL") && l.contains("seccomp"))
        .unwrap_or_else(|| panic!("no FAIL line for seccomp:\n{stdout}{stderr}"));
    for want in [
        "seccomp filter refuses bpf",
        "although the process holds CAP_BPF",
        "perf_event_open",
        "deploy/seccomp/stormwatch.json",
        "containerd >= 1.7",
    ] {
        assert!(line.contains(want), "{want:?} in {line}");
    }
    assert!(
        stdout.contains("ok    privileges"),
        "the capabilities are not the cause:\n{stdout}"
    );

    // The DaemonSet's own command says the same, in one line, instead of an EPERM from the
    // loader (its liveness would otherwise only show a crash loop).
    let out = output(
        podman()
            .args(["run", "--rm"])
            .args(pod.podman_args(None))
            .arg(&image.0)
            .args(&pod.args),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "run must fail under this profile");
    assert!(
        stderr.contains("stormwatch: ") && stderr.contains("seccomp filter refuses bpf"),
        "run names seccomp: {stderr}"
    );
}
