//! deploy/grafana/stormwatch-dashboard.json, proven on real data (no Grafana server can run
//! here, so its queries run on the Prometheus Grafana would ask):
//!
//! - a real Prometheus scrapes a live `stormwatch run` (the node label added as the
//!   PodMonitor adds it) while a lock storm runs inside a CFS quota, beside UDP sent to a closed
//!   port (drops) and TCP connections refused by a full accept queue (SYN retransmits);
//! - every query of every panel, with the variables set as Grafana's "All" sets them (the
//!   dashboard's `allValue` `.*`) and `$__rate_interval` as Grafana computes it for a 1 s
//!   scrape, returns data; the findings panel shows the storm;
//! - every metric a query names is one the exporter exports;
//! - the dashboard is importable: a datasource variable, node / namespace / pod variables with
//!   "All", unique panel ids and grid positions inside the 24 columns.

use std::{
    collections::BTreeSet,
    net::{SocketAddr, UdpSocket},
    os::fd::{FromRawFd as _, OwnedFd},
    time::{Duration, Instant},
};

use serde_json::Value;
use stormwatch_tests::{
    corpus,
    daemon::{Daemon, http_get, wait_for},
    deploy::repo_file,
    prometheus::Prometheus,
    require_bpf,
};

const NODE: &str = "test-node";

fn dashboard() -> Value {
    let path = repo_file("deploy/grafana/stormwatch-dashboard.json");
    let text = std::fs::read_to_string(&path).expect("reading the dashboard");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// Every (panel title, query) of the dashboard.
fn queries(d: &Value) -> Vec<(String, String)> {
    d["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .filter(|p| p["type"] != "row")
        .flat_map(|p| {
            let title = p["title"].as_str().expect("a title").to_owned();
            p["targets"]
                .as_array()
                .unwrap_or_else(|| panic!("{title}: targets"))
                .iter()
                .map(move |t| {
                    let expr = t["expr"].as_str().expect("an expr").to_owned();
                    (title.clone(), expr)
                })
        })
        .collect()
}

/// What Grafana sends for `expr` with every variable on "All" (allValue `.*`) and a 1 s scrape
/// interval ($__rate_interval = 4 × the scrape interval, at least 15 s by Grafana's default).
fn as_grafana_sends(expr: &str) -> String {
    expr.replace("$__rate_interval", "15s")
        .replace("$node", ".*")
        .replace("$namespace", ".*")
        .replace("$pod", ".*")
}

/// The names of each selector by name alternatives (`{__name__=~"a|b|c"}`) in a query.
fn name_alternations(expr: &str) -> Vec<Vec<String>> {
    expr.match_indices("__name__=~\"")
        .map(|(i, m)| {
            let rest = &expr[i + m.len()..];
            let end = rest.find('"').unwrap_or(rest.len());
            rest[..end].split('|').map(str::to_owned).collect()
        })
        .collect()
}

/// Metric names a query reads.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let at_word_start =
            i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        let rest = &expr[i..];
        if at_word_start && (rest.starts_with("stormwatch_") || rest.starts_with("process_")) {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            names.insert(rest[..end].to_owned());
            i += end;
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn the_dashboard_is_importable() {
    assert_eq!(
        name_alternations(r#"min by (pod) ({__name__=~"a_b|c", pod=~"x|y"})"#),
        vec![vec!["a_b".to_owned(), "c".to_owned()]],
        "the names a selector by name alternatives reads"
    );
    let d = dashboard();
    assert!(
        d["title"]
            .as_str()
            .is_some_and(|t| t.contains("stormwatch"))
    );
    assert_eq!(d["uid"], "stormwatch");
    let vars = d["templating"]["list"].as_array().expect("variables");
    let var = |name: &str| {
        vars.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("a {name} variable"))
    };
    assert_eq!(var("datasource")["type"], "datasource");
    assert_eq!(var("datasource")["query"], "prometheus");
    for name in ["node", "namespace", "pod"] {
        let v = var(name);
        assert_eq!(v["type"], "query", "{name}");
        assert_eq!(v["includeAll"], true, "{name}: All");
        assert_eq!(v["multi"], true, "{name}: several at once");
        assert_eq!(v["allValue"], ".*", "{name}: All matches empty labels too");
        assert_eq!(v["datasource"]["uid"], "${datasource}", "{name}");
    }
    let mut seen = BTreeSet::new();
    let panels = d["panels"].as_array().expect("panels");
    for p in panels {
        let g = &p["gridPos"];
        let (x, w) = (g["x"].as_u64().unwrap(), g["w"].as_u64().unwrap());
        assert!(x + w <= 24, "{}: inside the grid", p["title"]);
        if p["type"] != "row" {
            assert_eq!(
                p["datasource"]["uid"], "${datasource}",
                "{}: the datasource variable",
                p["title"]
            );
            assert!(
                p["description"].as_str().is_some_and(|s| s.len() > 20),
                "{}: says what it shows",
                p["title"]
            );
        }
        assert!(
            seen.insert((g["x"].as_u64(), g["y"].as_u64())),
            "{}: overlaps another panel",
            p["title"]
        );
    }
    let titles: Vec<&str> = panels.iter().filter_map(|p| p["title"].as_str()).collect();
    for want in [
        "Findings by kind and pod",
        "Run-queue latency p50 / p99",
        "Futex wait (threads waiting on average)",
        "Kernel lock wait by kind",
        "Packets against the interface MTU",
        "Agent CPU and memory",
    ] {
        assert!(titles.contains(&want), "a panel {want:?}: {titles:?}");
    }
}

/// A listening TCP socket on loopback whose accept queue holds one connection and is never
/// accepted from: further SYNs are dropped and retransmitted by the connecting side.
fn full_accept_queue() -> (OwnedFd, SocketAddr) {
    // SAFETY: plain socket calls on a descriptor this function owns.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0, "socket");
        let owned = OwnedFd::from_raw_fd(fd);
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        addr.sin_family = libc::AF_INET as u16;
        addr.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
        assert_eq!(
            libc::bind(
                fd,
                (&raw const addr).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as u32
            ),
            0,
            "bind"
        );
        assert_eq!(libc::listen(fd, 0), 0, "listen");
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as u32;
        assert_eq!(
            libc::getsockname(fd, (&raw mut addr).cast(), &raw mut len),
            0
        );
        let port = u16::from_be(addr.sin_port);
        (owned, SocketAddr::from(([127, 0, 0, 1], port)))
    }
}

#[test]
fn every_panel_has_data_from_a_live_agent_during_a_lock_storm() {
    require_bpf();
    let d = dashboard();
    // The per-packet panels (packets against the MTU, container traffic) show what the
    // per-packet probes count while attached: throughout here, as `net_packet_probes = "always"`
    // has them (on demand, while packets do not fit and in surveys). Likewise the run-queue
    // blame panel, with `runqueue_blame = "always"` (on demand, while a container's threads
    // wait for CPUs).
    let daemon = Daemon::start_configured(
        "diagnosis_window_seconds = 6\nnet_packet_probes = \"always\"\nrunqueue_blame = \"always\"\n",
    );
    let prometheus = Prometheus::start_with(&format!(
        "  - job_name: stormwatch\n    honor_labels: true\n    static_configs:\n      \
         - targets: ['{}']\n        labels:\n          node: {NODE}\n",
        daemon.addr
    ));

    // A lock storm inside a CFS quota: lock_storm and cpu_throttling, the futex and wake-up
    // probes attached on demand.
    let case = corpus::case("quota-mutex-storm");
    let storm = corpus::start(&case, false);
    let rel = storm.cgroup.rel_path().to_owned();

    // Drops: UDP to a port nobody listens on. Retransmits: connections to a full accept queue.
    let (_listener, full) = full_accept_queue();
    let closed_port = {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap()
    };
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut pending = Vec::new();
    let traffic_until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < traffic_until {
        for _ in 0..20 {
            let _ = udp.send_to(b"nobody listens here", closed_port);
        }
        if pending.len() < 6 {
            pending.push(std::thread::spawn(move || {
                std::net::TcpStream::connect_timeout(&full, Duration::from_secs(4))
            }));
        }
        std::thread::sleep(Duration::from_millis(250));
    }

    // The storm's finding reaches Prometheus.
    let findings = d["panels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["title"] == "Findings by kind and pod")
        .expect("the findings panel");
    let findings_expr = as_grafana_sends(findings["targets"][0]["expr"].as_str().unwrap());
    wait_for(
        "the findings panel to show the lock storm",
        Duration::from_secs(40),
        || {
            prometheus
                .query(&findings_expr)
                .into_iter()
                .find(|s| s["metric"]["kind"] == "lock_storm" && s["metric"]["cgroup"] == *rel)
        },
    );
    // Let every rate have its samples.
    std::thread::sleep(Duration::from_secs(3));

    let node = prometheus.query("count by (node) (stormwatch_build_info)");
    assert!(
        node.iter().any(|s| s["metric"]["node"] == NODE),
        "the node variable's values: {node:?}"
    );
    let mut empty = Vec::new();
    for (title, expr) in queries(&d) {
        let sent = as_grafana_sends(&expr);
        let result = prometheus.query(&sent);
        eprintln!("{title}: {} series for {sent}", result.len());
        if result.is_empty() {
            empty.push(format!("{title}: {sent}"));
        }
    }
    assert!(
        empty.is_empty(),
        "panels without data:\n{}",
        empty.join("\n")
    );
    // The daemon reads `cpu.stat` at its diagnosis steps, not at every collection, so a rate
    // over 15 s is above zero only once two of its reads saw the storm throttled; on a fast
    // machine the lock storm is found before that (seen: rate 0 at the first query).
    let throttled =
        format!("rate(stormwatch_cpu_throttled_seconds_total{{cgroup=\"{rel}\"}}[15s])");
    wait_for(
        "the storm's throttling to show in Prometheus",
        Duration::from_secs(30),
        || {
            prometheus.query(&throttled).into_iter().find(|s| {
                s["value"][1]
                    .as_str()
                    .and_then(|v| v.parse::<f64>().ok())
                    .is_some_and(|v| v > 0.0)
            })
        },
    );

    // Every metric a panel names is exported; of a selector by name alternatives
    // (`__name__=~"a|b"`), which gives data where any of them has series, one is exported and
    // every one is a family of the metric reference (a misspelt name fails either way).
    let reference = std::fs::read_to_string(repo_file("agent/METRICS.md")).unwrap();
    let exposition = daemon.metrics();
    let exported: BTreeSet<&str> = exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    for (title, expr) in queries(&d) {
        let alternations = name_alternations(&expr);
        let alternatives: BTreeSet<String> = alternations.iter().flatten().cloned().collect();
        for name in metric_names(&expr).difference(&alternatives) {
            assert!(
                exported.contains(name.as_str()),
                "{title}: {name} is not exported"
            );
        }
        for names in &alternations {
            assert!(
                names.iter().any(|n| exported.contains(n.as_str())),
                "{title}: none of {names:?} is exported"
            );
            for n in names {
                assert!(
                    reference.contains(&format!("| `{n}` |")),
                    "{title}: {n} is no family of agent/METRICS.md"
                );
            }
        }
    }
    // Every family the live agent exports (the futex and wake-up families attached for the
    // storm, the network ones with traffic) is in the metric reference.
    let openmetrics = http_get(
        daemon.addr,
        "/metrics",
        Some("application/openmetrics-text"),
    )
    .expect("GET /metrics as OpenMetrics")
    .body;
    let families: BTreeSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
        .collect();
    assert!(families.len() >= 50, "{families:?}");
    for f in &families {
        assert!(
            reference.contains(&format!("| `{f}` |")),
            "{f} is exported but not in agent/METRICS.md"
        );
    }
    for p in pending {
        let _ = p.join();
    }
    drop(storm);
}
