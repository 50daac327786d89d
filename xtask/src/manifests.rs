//! `cargo xtask manifests`: the files of deploy/ that are made from another one.
//!
//! deploy/rules.yaml (plain rule groups, for any Prometheus) is the source of
//! deploy/prometheusrule.yaml (the same groups in the Prometheus operator's CR). The Helm
//! chart holds copies of the rules and of the Grafana dashboard in its `files/` (Helm reads
//! no file outside the chart). The tests fail when a made file is not what this writes.

use std::path::Path;

use anyhow::{Context as _, Result};

use crate::{root, say};

const PROMETHEUS_RULE_HEADER: &str = "\
# Alerts for the Prometheus operator (monitoring.coreos.com/v1). GENERATED from
# deploy/rules.yaml by `cargo +stable xtask manifests`: edit that file, not this one (its
# comments say why each rule is as it is; tests/tests/prometheus_rules.rs checks both).
#
#   kubectl apply -f deploy/prometheusrule.yaml   # beside deploy/podmonitor.yaml
#
# Your Prometheus resource must select this rule (its ruleSelector / ruleNamespaceSelector;
# kube-prometheus-stack selects `release: <its release name>` by default: add that label).
---
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: stormwatch
  namespace: stormwatch
  labels:
    app.kubernetes.io/name: stormwatch
spec:
";

/// The PrometheusRule for the rule file `rules` (its text): the groups under `spec`, the
/// leading comment block left out (the header points at it).
pub fn prometheus_rule(rules: &str) -> String {
    let mut out = String::from(PROMETHEUS_RULE_HEADER);
    let body = rules
        .lines()
        .skip_while(|l| l.starts_with('#') || l.trim().is_empty());
    for line in body {
        if line.is_empty() {
            out.push('\n');
        } else {
            out.push_str("  ");
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn write_if_changed(path: &Path, text: &str) -> Result<()> {
    let shown = path.strip_prefix(root()).unwrap_or(path).display();
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        say(&format!("{shown} is up to date"));
        return Ok(());
    }
    std::fs::write(path, text).with_context(|| format!("writing {shown}"))?;
    say(&format!("wrote {shown}"));
    Ok(())
}

/// The chart's copies: (source in deploy/, copy in deploy/).
pub const CHART_COPIES: &[(&str, &str)] = &[
    ("rules.yaml", "helm/stormwatch/files/rules.yaml"),
    (
        "grafana/stormwatch-dashboard.json",
        "helm/stormwatch/files/stormwatch-dashboard.json",
    ),
];

pub fn run() -> Result<()> {
    let deploy = root().join("deploy");
    let rules =
        std::fs::read_to_string(deploy.join("rules.yaml")).context("reading deploy/rules.yaml")?;
    write_if_changed(
        &deploy.join("prometheusrule.yaml"),
        &prometheus_rule(&rules),
    )?;
    for (source, copy) in CHART_COPIES {
        let text = std::fs::read_to_string(deploy.join(source))
            .with_context(|| format!("reading deploy/{source}"))?;
        write_if_changed(&deploy.join(copy), &text)?;
    }
    // The metric reference of agent/METRICS.md is generated from the agent's family table by
    // the unit test that checks it, blessed.
    say("regenerating agent/METRICS.md's metric reference from the family table");
    crate::run_cmd(
        crate::cargo()
            .args([
                "test",
                "--quiet",
                "--package",
                "stormwatch",
                "--lib",
                "export::families::tests::the_metric_reference_is_generated_from_the_families",
            ])
            .env("STORMWATCH_BLESS", "1"),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_groups_go_under_spec() {
        let cr = prometheus_rule("# about\n#\n\ngroups:\n  - name: a\n\n    rules: []\n");
        assert!(cr.starts_with("# Alerts for the Prometheus operator"));
        assert!(
            cr.ends_with("spec:\n  groups:\n    - name: a\n\n      rules: []\n"),
            "{cr}"
        );
    }

    /// The committed CR is what the generator makes of the committed rule file.
    #[test]
    fn the_committed_prometheus_rule_is_generated() {
        let deploy = root().join("deploy");
        let rules = std::fs::read_to_string(deploy.join("rules.yaml")).unwrap();
        let cr = std::fs::read_to_string(deploy.join("prometheusrule.yaml")).unwrap();
        assert!(
            cr == prometheus_rule(&rules),
            "deploy/prometheusrule.yaml is stale: run `cargo +stable xtask manifests`"
        );
    }

    #[test]
    fn the_charts_copies_are_current() {
        let deploy = root().join("deploy");
        for (source, copy) in CHART_COPIES {
            let a = std::fs::read_to_string(deploy.join(source)).unwrap();
            let b = std::fs::read_to_string(deploy.join(copy)).unwrap();
            assert!(
                a == b,
                "deploy/{copy} differs from deploy/{source}: run `cargo +stable xtask manifests`"
            );
        }
    }
}
