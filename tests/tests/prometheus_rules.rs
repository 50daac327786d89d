//! deploy/prometheusrule.yaml, checked by Prometheus' own tool.
//!
//! - `promtool check rules` on the rule groups (the CR's `spec`, which is what the Prometheus
//!   operator hands to Prometheus);
//! - `promtool test rules deploy/tests/prometheusrule_test.yaml`: alerts that must fire, with
//!   their labels and text, and ones that must not (a finding that lasts one diagnosis window,
//!   a finding that flaps);
//! - the findings' `for:` outlasts one window as the shipped ConfigMap and PodMonitor configure
//!   it, and every finding kind has its alert.
//!
//! Nothing is skipped: a missing promtool fails the test with how to install it.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use stormwatch_tests::{
    daemon::tool,
    deploy::{manifest, repo_file},
};

fn deploy(file: &str) -> PathBuf {
    repo_file(&format!("deploy/{file}"))
}

fn promtool() -> PathBuf {
    tool("promtool", "apt-get install -y prometheus")
}

/// The CR's rule groups written as a plain rule file, with a copy of the test file beside it
/// (its `rule_files` names the rule file relative to itself).
struct RuleFiles {
    _dir: tempfile::TempDir,
    rules: PathBuf,
    tests: PathBuf,
}

fn rule_files() -> RuleFiles {
    let cr = manifest("prometheusrule.yaml", "PrometheusRule");
    assert_eq!(cr["apiVersion"].as_str(), Some("monitoring.coreos.com/v1"));
    let dir = tempfile::tempdir().expect("a temp dir");
    let rules = dir.path().join("stormwatch.rules.yaml");
    let spec = serde_yaml_ng::to_string(&cr["spec"]).expect("encoding the rule groups");
    std::fs::write(&rules, spec).expect("writing the rule file");
    let tests = dir.path().join("prometheusrule_test.yaml");
    std::fs::copy(deploy("tests/prometheusrule_test.yaml"), &tests)
        .expect("copying deploy/tests/prometheusrule_test.yaml");
    RuleFiles {
        _dir: dir,
        rules,
        tests,
    }
}

fn run_promtool(args: &[&Path]) -> String {
    let mut cmd = Command::new(promtool());
    for a in args {
        cmd.arg(a);
    }
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
    let f = rule_files();
    let text = run_promtool(&[Path::new("check"), Path::new("rules"), &f.rules]);
    assert!(text.contains("SUCCESS"), "{text}");
}

#[test]
fn promtool_unit_tests_pass() {
    let f = rule_files();
    let text = run_promtool(&[Path::new("test"), Path::new("rules"), &f.tests]);
    assert!(text.contains("SUCCESS"), "{text}");
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
    let cr = manifest("prometheusrule.yaml", "PrometheusRule");
    let groups = cr["spec"]["groups"].as_sequence().expect("spec.groups");
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
