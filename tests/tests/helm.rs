//! The Helm chart (deploy/helm/stormwatch), rendered by the real `helm` (installed by the
//! tests' setup with `go install`):
//!
//! - its default `helm template` is exactly the objects of deploy/daemonset.yaml;
//! - with the PodMonitor, PrometheusRule, dashboard and NetworkPolicy on, the extra objects
//!   are exactly deploy/podmonitor.yaml's, deploy/prometheusrule.yaml's,
//!   deploy/networkpolicy.yaml's, and a ConfigMap holding deploy/grafana's dashboard;
//! - the values people change per cluster land where they should;
//! - `helm lint --strict` passes, and `kubernetes-validate --strict` on the rendered objects.

use std::{collections::BTreeMap, process::Command};

use serde::Deserialize as _;
use serde_yaml_ng::Value;
use stormwatch_tests::{
    daemon::tool,
    deploy::{documents, kubernetes_validate, repo_file},
};

fn helm() -> std::path::PathBuf {
    tool(
        "helm",
        "GOBIN=/usr/local/bin go install helm.sh/helm/v3/cmd/helm@v3.22.0",
    )
}

/// `helm template` of the chart with `--set` values: its text.
fn render_text(set: &[&str]) -> String {
    let mut cmd = Command::new(helm());
    cmd.args(["template", "stormwatch"])
        .arg(repo_file("deploy/helm/stormwatch"))
        .args(["--namespace", "stormwatch"]);
    for s in set {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("running helm template");
    assert!(
        out.status.success(),
        "helm template {set:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

type Objects = BTreeMap<(String, String), Value>;

fn objects(docs: Vec<Value>) -> Objects {
    docs.into_iter()
        .map(|d| {
            let kind = d["kind"].as_str().expect("a kind").to_owned();
            let name = d["metadata"]["name"].as_str().expect("a name").to_owned();
            ((kind, name), d)
        })
        .collect()
}

fn render(set: &[&str]) -> Objects {
    let text = render_text(set);
    objects(
        serde_yaml_ng::Deserializer::from_str(&text)
            .map(|d| Value::deserialize(d).expect("rendered YAML"))
            .filter(|v| !v.is_null())
            .collect(),
    )
}

fn manifest_objects(file: &str) -> Objects {
    objects(documents(&repo_file(&format!("deploy/{file}"))))
}

fn key(kind: &str, name: &str) -> (String, String) {
    (kind.to_owned(), name.to_owned())
}

#[test]
fn the_default_chart_renders_the_manifest() {
    let want = manifest_objects("daemonset.yaml");
    let got = render(&[]);
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "the same objects"
    );
    for (k, w) in &want {
        assert!(
            got[k] == *w,
            "{k:?} differs from deploy/daemonset.yaml:\nchart:\n{}\nmanifest:\n{}",
            serde_yaml_ng::to_string(&got[k]).unwrap(),
            serde_yaml_ng::to_string(w).unwrap()
        );
    }
}

#[test]
fn the_optional_objects_are_the_deploy_files() {
    let got = render(&[
        "podMonitor.enabled=true",
        "prometheusRule.enabled=true",
        "dashboard.enabled=true",
        "networkPolicy.enabled=true",
    ]);
    for (file, kind) in [
        ("podmonitor.yaml", "PodMonitor"),
        ("prometheusrule.yaml", "PrometheusRule"),
        ("networkpolicy.yaml", "NetworkPolicy"),
    ] {
        let want = manifest_objects(file);
        let k = key(kind, "stormwatch");
        assert!(got[&k] == want[&k], "{kind} differs from deploy/{file}");
    }
    let dashboard = &got[&key("ConfigMap", "stormwatch-dashboard")];
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let json: serde_json::Value = serde_json::from_str(
        dashboard["data"]["stormwatch-dashboard.json"]
            .as_str()
            .expect("the dashboard in the ConfigMap"),
    )
    .expect("JSON");
    let file: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_file("deploy/grafana/stormwatch-dashboard.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(json, file, "the ConfigMap holds deploy/grafana's dashboard");
    assert_eq!(
        got.len(),
        8,
        "4 objects of the manifest and 4 optional ones"
    );
}

#[test]
fn per_cluster_values_take_effect() {
    let got = render(&[
        "image.repository=registry.internal/sw",
        "image.tag=1.2.3",
        "maxCgroups=3000",
        "resources.limits.memory=600Mi",
        "tolerations[0].key=dedicated",
        "tolerations[0].operator=Equal",
        "tolerations[0].value=db",
        "tolerations[0].effect=NoSchedule",
        "nodeSelector.kubernetes\\.io/os=linux",
        "seccompProfile.type=Localhost",
        "seccompProfile.localhostProfile=stormwatch.json",
        "config.futexProbes=always",
        "extraConfig=http_max_connections = 16",
        "namespace.create=false",
    ]);
    assert!(
        !got.contains_key(&key("Namespace", "stormwatch")),
        "namespace.create=false renders no Namespace"
    );
    let ds = &got[&key("DaemonSet", "stormwatch")];
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(c["image"], "registry.internal/sw:1.2.3");
    assert_eq!(c["resources"]["limits"]["memory"], "600Mi");
    assert_eq!(
        c["securityContext"]["seccompProfile"]["localhostProfile"],
        "stormwatch.json"
    );
    assert_eq!(c["securityContext"]["seccompProfile"]["type"], "Localhost");
    assert_eq!(pod["tolerations"][0]["key"], "dedicated");
    assert_eq!(pod["tolerations"][0]["effect"], "NoSchedule");
    assert_eq!(pod["nodeSelector"]["kubernetes.io/os"], "linux");
    let config = got[&key("ConfigMap", "stormwatch-config")]["data"]["config.toml"]
        .as_str()
        .expect("config.toml")
        .to_owned();
    for line in [
        "max_cgroups = 3000",
        "futex_probes = \"always\"",
        "http_max_connections = 16",
    ] {
        assert!(
            config.lines().any(|l| l.trim() == line),
            "{line:?} in config.toml:\n{config}"
        );
    }
    // The agent itself accepts what the chart renders.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, &config).unwrap();
    let out = Command::new(stormwatch_tests::agent_bin())
        .args(["run", "--check-config", "--config"])
        .arg(&path)
        .output()
        .expect("stormwatch run --check-config");
    assert!(
        out.status.success(),
        "the rendered config.toml: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let effective = String::from_utf8_lossy(&out.stdout);
    assert!(effective.contains("max_cgroups = 3000"), "{effective}");
    assert!(
        effective.contains("http_max_connections = 16"),
        "{effective}"
    );
}

#[test]
fn the_chart_lints_and_its_objects_validate() {
    let out = Command::new(helm())
        .args(["lint", "--strict"])
        .arg(repo_file("deploy/helm/stormwatch"))
        .output()
        .expect("running helm lint");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "helm lint --strict:\n{text}");
    assert!(text.contains("0 chart(s) failed"), "{text}");

    // Every core object the chart can render (the operator's kinds have no schema here).
    let dir = tempfile::tempdir().unwrap();
    let rendered = dir.path().join("rendered.yaml");
    std::fs::write(
        &rendered,
        render_text(&["dashboard.enabled=true", "networkPolicy.enabled=true"]),
    )
    .unwrap();
    let text = kubernetes_validate(&rendered);
    for kind in [
        "namespace",
        "serviceaccount",
        "configmap/stormwatch-config",
        "configmap/stormwatch-dashboard",
        "daemonset",
        "networkpolicy",
    ] {
        assert!(
            text.contains(&format!("passed for resource {kind}")),
            "{kind}:\n{text}"
        );
    }
    let text = kubernetes_validate(&repo_file("deploy/networkpolicy.yaml"));
    assert!(text.contains("passed for resource networkpolicy/stormwatch"));
}
