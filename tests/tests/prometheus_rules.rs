//! deploy/rules.yaml (the source) and deploy/prometheusrule.yaml (made from it), checked by
//! Prometheus' own tool, in place, on the files as committed:
//!
//! - `promtool check rules deploy/rules.yaml`;
//! - `promtool test rules deploy/tests/rules_test.yaml`: alerts that must fire, with their
//!   labels and text, and ones that must not (a finding that lasts one diagnosis window, a
//!   finding that flaps);
//! - the CR's `spec` holds exactly the rule file's groups;
//! - the findings' `for:` outlasts one window as the shipped ConfigMap and PodMonitor configure
//!   it, and every finding kind has its alert.
//!
//! Nothing is skipped: a missing promtool fails the test with how to install it.

use std::{path::PathBuf, process::Command};

use stormwatch_tests::{
    daemon::tool,
    deploy::{documents, manifest, repo_file},
};

fn promtool() -> PathBuf {
    tool("promtool", "apt-get install -y prometheus")
}

/// The plain rule file's one document.
fn rule_groups() -> serde_yaml_ng::Value {
    let mut docs = documents(&repo_file("deploy/rules.yaml"));
    assert_eq!(docs.len(), 1, "one document in deploy/rules.yaml");
    docs.remove(0)
}

/// `promtool <args>` run from the repository's root, on the committed files.
fn run_promtool(args: &[&str]) -> String {
    let mut cmd = Command::new(promtool());
    cmd.current_dir(repo_file("")).args(args);
    let out = cmd.output().expect("running promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

#[test]
fn promtool_checks_the_rules() {
    let text = run_promtool(&["check", "rules", "deploy/rules.yaml"]);
    assert!(text.contains("SUCCESS"), "{text}");
}

#[test]
fn promtool_unit_tests_pass() {
    let text = run_promtool(&["test", "rules", "deploy/tests/rules_test.yaml"]);
    assert!(text.contains("SUCCESS"), "{text}");
}

#[test]
fn the_prometheus_rule_holds_the_rule_file() {
    let cr = manifest("prometheusrule.yaml", "PrometheusRule");
    assert_eq!(cr["apiVersion"].as_str(), Some("monitoring.coreos.com/v1"));
    assert_eq!(
        cr["spec"],
        rule_groups(),
        "deploy/prometheusrule.yaml is stale: run `cargo +stable xtask manifests`"
    );
}

/// "1m30s" → 90 (the units Prometheus durations use here).
fn duration_seconds(d: &str) -> f64 {
    let mut total = 0.0;
    let mut number = String::new();
    let mut chars = d.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            number.push(c);
            continue;
        }
        let unit = if c == 'm' && chars.peek() == Some(&'s') {
            chars.next();
            0.001
        } else {
            match c {
                's' => 1.0,
                'm' => 60.0,
                'h' => 3600.0,
                'd' => 86400.0,
                _ => panic!("unit {c:?} in duration {d:?}"),
            }
        };
        total += number.parse::<f64>().expect("a number") * unit;
        number.clear();
    }
    assert!(number.is_empty(), "duration {d:?} ends without a unit");
    total
}

/// The alerts on `stormwatch_finding`, as (kind, `for:` in seconds).
fn finding_alerts() -> Vec<(String, f64)> {
    let rules = rule_groups();
    let groups = rules["groups"].as_sequence().expect("groups");
    groups
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules"))
        .filter(|r| {
            r["expr"]
                .as_str()
                .is_some_and(|e| e.contains("stormwatch_finding{"))
        })
        .map(|r| {
            let name = r["alert"].as_str().expect("an alert");
            let kind = r["labels"]["kind"]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: a kind label"));
            let expr = r["expr"].as_str().expect("expr");
            assert!(
                expr.contains(&format!("kind=\"{kind}\"")),
                "{name} selects its own kind: {expr}"
            );
            assert!(
                r["labels"]["severity"].is_null(),
                "{name}: the severity is the series' own label"
            );
            let annotations = format!("{:?}", r["annotations"]);
            assert!(
                annotations.contains("stormwatch diagnose"),
                "{name}: the runbook points at stormwatch diagnose"
            );
            let for_ = r["for"]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: a `for:`"));
            (kind.to_owned(), duration_seconds(for_))
        })
        .collect()
}

#[test]
fn every_finding_kind_has_an_alert() {
    // The kinds of the agent's diagnosis rules (agent/src/diagnose/mod.rs, `Kind::as_str`).
    let mut want = [
        "lock_storm",
        "cpu_throttling",
        "runqueue_saturation",
        "thread_oversubscription",
        "runtime_sizing",
        "mtu_mismatch",
    ];
    want.sort_unstable();
    let mut got: Vec<String> = finding_alerts().into_iter().map(|(k, _)| k).collect();
    got.sort_unstable();
    assert_eq!(got, want);
}

#[test]
fn a_finding_must_outlast_one_window_to_alert() {
    // What the shipped ConfigMap and PodMonitor configure.
    let config_map = manifest("daemonset.yaml", "ConfigMap");
    let config = config_map["data"]["config.toml"]
        .as_str()
        .expect("config.toml in the ConfigMap");
    let setting = |key: &str| -> f64 {
        config
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once('=')?;
                (k.trim() == key).then(|| v.trim().parse().expect("a number"))
            })
            .unwrap_or_else(|| panic!("{key} in the ConfigMap"))
    };
    let window = setting("diagnosis_window_seconds");
    let interval = setting("interval_seconds");
    let pod_monitor = manifest("podmonitor.yaml", "PodMonitor");
    let scrape = duration_seconds(
        pod_monitor["spec"]["podMetricsEndpoints"][0]["interval"]
            .as_str()
            .expect("the PodMonitor's interval"),
    );
    // A finding is judged every step (a third of the window, at least one interval) and holds
    // while the burst is in the window: at most window + step; a scrape may see it up to one
    // scrape interval longer.
    let step = (window / 3.0).max(interval);
    let longest_flap = window + step + scrape;
    for (kind, for_) in finding_alerts() {
        assert!(
            for_ > longest_flap,
            "{kind}: for {for_} s must outlast one window ({longest_flap} s)"
        );
        assert!(
            for_ <= 2.0 * longest_flap,
            "{kind}: for {for_} s delays a real finding more than needed"
        );
    }
}
