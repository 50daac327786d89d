//! The manifests in deploy/, read as YAML documents (for the tests that run what they say),
//! and the DaemonSet's pod translated into what a container runtime (podman) is told.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde::Deserialize as _;
use serde_yaml_ng::Value;

/// A file of the repository, by its path from the root (`deploy/daemonset.yaml`).
pub fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// Every YAML document of a file (empty ones left out).
pub fn documents(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

/// The one document of `kind` in deploy/`file`.
pub fn manifest(file: &str, kind: &str) -> Value {
    let mut found: Vec<Value> = documents(&repo_file(&format!("deploy/{file}")))
        .into_iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect();
    assert_eq!(found.len(), 1, "one {kind} in deploy/{file}");
    found.remove(0)
}

/// `kubernetes-validate --strict` on a manifest: its report, after checking that it passed
/// without an error.
pub fn kubernetes_validate(path: &Path) -> String {
    let validator = crate::daemon::tool("kubernetes-validate", "pip install kubernetes-validate");
    let out = Command::new(validator)
        .arg("--strict")
        .arg(path)
        .output()
        .expect("running kubernetes-validate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && !text.contains("ERROR"),
        "kubernetes-validate --strict {}:\n{text}",
        path.display()
    );
    text
}

// ---- the DaemonSet, for podman --------------------------------------------------------------

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {v:?}"))
}

fn seq(v: &Value) -> &[Value] {
    v.as_sequence().map_or(&[], |s| s.as_slice())
}

/// A mount of the container: a hostPath, or a directory holding the ConfigMap's files.
#[derive(Debug)]
pub struct Mount {
    pub source: PathBuf,
    pub target: String,
    pub read_only: bool,
}

/// What the runtime is told, from deploy/daemonset.yaml.
pub struct Pod {
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cap_add: Vec<String>,
    pub cap_drop: Vec<String>,
    pub read_only_root: bool,
    pub no_new_privileges: bool,
    pub host_pid: bool,
    pub user: String,
    pub container_port: u16,
    pub mounts: Vec<Mount>,
    /// `--memory` and `--cpus` from the limits.
    pub memory_limit_bytes: Option<u64>,
    pub cpu_limit: Option<f64>,
    /// The seccomp profile file the runtime applies.
    pub seccomp: PathBuf,
    /// The config files (ConfigMap data), written under this directory.
    _config_dir: tempfile::TempDir,
}

/// Kubernetes quantities: "256Mi", "64M", "1Gi", "500m" (CPU), "2".
fn quantity(q: &str) -> f64 {
    let (number, factor) = [
        ("Ki", 1024.0),
        ("Mi", 1024.0 * 1024.0),
        ("Gi", 1024.0 * 1024.0 * 1024.0),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("m", 1e-3),
    ]
    .iter()
    .find_map(|(suffix, f)| q.strip_suffix(suffix).map(|n| (n, *f)))
    .unwrap_or((q, 1.0));
    number
        .parse::<f64>()
        .unwrap_or_else(|_| panic!("quantity {q:?}"))
        * factor
}

impl Pod {
    /// The DaemonSet of deploy/daemonset.yaml (its one container), with its ConfigMap written
    /// to files for the config volume.
    pub fn from_manifest() -> Self {
        let docs = documents(&repo_file("deploy/daemonset.yaml"));
        let kind = |k: &str| {
            docs.iter()
                .find(|d| d["kind"].as_str() == Some(k))
                .unwrap_or_else(|| panic!("no {k} in deploy/daemonset.yaml"))
        };
        let daemonset = kind("DaemonSet");
        let pod = &daemonset["spec"]["template"]["spec"];
        let containers = seq(&pod["containers"]);
        assert_eq!(containers.len(), 1, "one container in the pod");
        let c = &containers[0];
        let sc = &c["securityContext"];
        assert_ne!(sc["privileged"].as_bool(), Some(true), "not privileged");

        let args = seq(&c["args"])
            .iter()
            .map(|a| str_of(a, "an arg").to_owned())
            .collect();
        let env = seq(&c["env"])
            .iter()
            .map(|e| {
                (
                    str_of(&e["name"], "env name").to_owned(),
                    str_of(&e["value"], "env value").to_owned(),
                )
            })
            .collect();
        let caps = |list: &str| -> Vec<String> {
            seq(&sc["capabilities"][list])
                .iter()
                .map(|c| str_of(c, "a capability").to_owned())
                .collect()
        };

        // Volumes: hostPath, or a ConfigMap written to files.
        let config_dir = tempfile::tempdir().expect("a temp dir");
        let volumes = seq(&pod["volumes"]);
        let mounts = seq(&c["volumeMounts"])
            .iter()
            .map(|m| {
                let name = str_of(&m["name"], "volumeMount name");
                let volume = volumes
                    .iter()
                    .find(|v| v["name"].as_str() == Some(name))
                    .unwrap_or_else(|| panic!("no volume {name}"));
                let source = if let Some(path) = volume["hostPath"]["path"].as_str() {
                    PathBuf::from(path)
                } else if let Some(cm) = volume["configMap"]["name"].as_str() {
                    let map = docs
                        .iter()
                        .find(|d| {
                            d["kind"].as_str() == Some("ConfigMap")
                                && d["metadata"]["name"].as_str() == Some(cm)
                        })
                        .unwrap_or_else(|| panic!("no ConfigMap {cm} in the manifest"));
                    let dir = config_dir.path().join(name);
                    std::fs::create_dir(&dir).expect("a ConfigMap directory");
                    let data = map["data"].as_mapping().expect("ConfigMap data");
                    for (file, text) in data {
                        std::fs::write(
                            dir.join(str_of(file, "a ConfigMap key")),
                            str_of(text, "a ConfigMap value"),
                        )
                        .expect("writing a ConfigMap file");
                    }
                    dir
                } else {
                    panic!("volume {name}: only hostPath and configMap are run here")
                };
                Mount {
                    source,
                    target: str_of(&m["mountPath"], "mountPath").to_owned(),
                    read_only: m["readOnly"].as_bool().unwrap_or(false),
                }
            })
            .collect();

        let seccomp = match sc["seccompProfile"]["type"].as_str() {
            // containerd >= 1.7's default, which the manifest relies on: the runtime default
            // plus bpf for CAP_BPF and perf_event_open for CAP_PERFMON holders.
            Some("RuntimeDefault") => repo_file("deploy/seccomp/stormwatch.json"),
            Some("Localhost") => repo_file("deploy/seccomp").join(str_of(
                &sc["seccompProfile"]["localhostProfile"],
                "localhostProfile",
            )),
            other => panic!("seccompProfile {other:?}: the pod must have a seccomp profile"),
        };
        let user = match (sc["runAsUser"].as_u64(), sc["runAsGroup"].as_u64()) {
            (Some(u), Some(g)) => format!("{u}:{g}"),
            (Some(u), None) => u.to_string(),
            _ => panic!("runAsUser is set in the manifest"),
        };
        let limits = &c["resources"]["limits"];
        Pod {
            args,
            env,
            cap_add: caps("add"),
            cap_drop: caps("drop"),
            read_only_root: sc["readOnlyRootFilesystem"].as_bool() == Some(true),
            no_new_privileges: sc["allowPrivilegeEscalation"].as_bool() == Some(false),
            host_pid: pod["hostPID"].as_bool() == Some(true),
            user,
            container_port: seq(&c["ports"])
                .iter()
                .find(|p| p["name"].as_str() == Some("metrics"))
                .and_then(|p| p["containerPort"].as_u64())
                .expect("the metrics port") as u16,
            mounts,
            memory_limit_bytes: limits["memory"].as_str().map(|q| quantity(q) as u64),
            cpu_limit: limits["cpu"].as_str().map(quantity),
            seccomp,
            _config_dir: config_dir,
        }
    }

    /// `podman run` arguments for this pod (without the image and its args).
    pub fn podman_args(&self, seccomp: Option<&Path>) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "--ulimit".into(),
            "nofile=1024:1024".into(),
            "--ulimit".into(),
            "nproc=1024:1024".into(),
            "--user".into(),
            self.user.clone(),
        ];
        for c in &self.cap_drop {
            a.extend(["--cap-drop".into(), c.clone()]);
        }
        for c in &self.cap_add {
            a.extend(["--cap-add".into(), c.clone()]);
        }
        if self.read_only_root {
            // Kubernetes adds no tmpfs to a read-only root; podman would (/tmp, /run…).
            a.extend(["--read-only".into(), "--read-only-tmpfs=false".into()]);
        }
        if self.no_new_privileges {
            a.extend(["--security-opt".into(), "no-new-privileges".into()]);
        }
        if self.host_pid {
            a.extend(["--pid".into(), "host".into()]);
        }
        if let Some(seccomp) = seccomp {
            a.extend([
                "--security-opt".into(),
                format!("seccomp={}", seccomp.display()),
            ]);
        }
        if let Some(m) = self.memory_limit_bytes {
            a.extend(["--memory".into(), m.to_string()]);
        }
        if let Some(c) = self.cpu_limit {
            a.extend(["--cpus".into(), c.to_string()]);
        }
        for m in &self.mounts {
            let ro = if m.read_only { ":ro" } else { "" };
            a.extend([
                "--volume".into(),
                format!("{}:{}{ro}", m.source.display(), m.target),
            ]);
        }
        for (k, v) in &self.env {
            a.extend(["--env".into(), format!("{k}={v}")]);
        }
        a
    }
}
