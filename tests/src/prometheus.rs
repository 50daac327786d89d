//! A real Prometheus server (Debian's `prometheus`) for the tests: it scrapes what a test
//! says, every second, with its storage in a temp dir; killed (and the directory removed) on
//! drop.

use std::{
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use serde_json::Value;

use crate::daemon::{free_port, http_get, tool, url_encode, wait_for, write_file};

pub struct Prometheus {
    child: Child,
    pub addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Scrapes `target` over plain HTTP as job `stormwatch`.
    pub fn start(target: SocketAddr) -> Self {
        Self::start_with(&format!(
            "  - job_name: stormwatch\n    static_configs:\n      - targets: ['{target}']\n"
        ))
    }

    /// Runs with the scrape configs `scrape_configs` (YAML list items, indented by two
    /// spaces). `files` are written into the server's directory first (certificates, password
    /// files); `{dir}` in the scrape configs is that directory.
    pub fn start_with_files(scrape_configs: &str, files: &[(&str, &[u8])]) -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        for (name, bytes) in files {
            std::fs::write(dir.path().join(name), bytes).expect("writing a Prometheus file");
        }
        Self::run(dir, scrape_configs)
    }

    pub fn start_with(scrape_configs: &str) -> Self {
        Self::run(tempfile::tempdir().expect("a temp dir"), scrape_configs)
    }

    fn run(dir: tempfile::TempDir, scrape_configs: &str) -> Self {
        let bin = tool("prometheus", "apt-get install -y prometheus");
        let scrape_configs = scrape_configs.replace("{dir}", &dir.path().display().to_string());
        let config = write_file(
            dir.path(),
            "prometheus.yml",
            &format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n{scrape_configs}"
            ),
        );
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("prometheus.log");
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start prometheus: {e}"));
        let mut prometheus = Self { child, addr, dir };
        wait_for("Prometheus to be ready", Duration::from_secs(30), || {
            if let Ok(Some(status)) = prometheus.child.try_wait() {
                panic!("prometheus exited ({status}):\n{}", prometheus.log());
            }
            http_get(prometheus.addr, "/-/ready", None)
                .ok()
                .filter(|r| r.status == 200)
        });
        prometheus
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The `data.result` of an instant query.
    pub fn query(&self, promql: &str) -> Vec<Value> {
        let path = format!("/api/v1/query?query={}", url_encode(promql));
        let r = http_get(self.addr, &path, None)
            .unwrap_or_else(|e| panic!("querying Prometheus for {promql}: {e}"));
        let v: Value = serde_json::from_str(&r.body)
            .unwrap_or_else(|e| panic!("Prometheus answered {} {:?}: {e}", r.status, r.body));
        assert_eq!(v["status"], "success", "query {promql}: {v}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The targets' health and last scrape error (`/api/v1/targets`), as (job, health, error).
    pub fn targets(&self) -> Vec<(String, String, String)> {
        let r = http_get(self.addr, "/api/v1/targets", None).expect("GET /api/v1/targets");
        let v: Value = serde_json::from_str(&r.body).expect("targets JSON");
        v["data"]["activeTargets"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                let s = |k: &str| t[k].as_str().unwrap_or_default().to_owned();
                (
                    t["labels"]["job"].as_str().unwrap_or_default().to_owned(),
                    s("health"),
                    s("lastError"),
                )
            })
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of one series of an instant query's result.
pub fn value_of(series: &Value) -> f64 {
    series["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no value in {series}"))
}
