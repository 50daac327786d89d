//! The manifests in deploy/, read as YAML documents (for the tests that run what they say).

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
