//! The daemon's own cost: `stormwatch run` at the default interval (5 s) with 250, 500, 1,000,
//! 2,000 and 4,000 live cgroups (or the sizes asked for), scraped every 15 s the way Prometheus
//! scrapes (OpenMetrics, gzip). Runs `exporter_bench` (tests/src/bin) once per size and prints
//! a Markdown table: CPU (without and with scrapes), resident memory, the exposition's size,
//! series per cgroup, collection time; then the cost curve: CPU and RSS per cgroup.
//!
//! The daemon runs with its default configuration, but for `max_cgroups` above its default
//! (2,000): a size beyond it gets `max_cgroups` = the size + 100 for the host's own cgroups (a
//! config file with that line only), or the cgroups past 2,000 would be refused, not measured.
//!
//! Each size runs alone, one after the other, never interleaved: the figures are the daemon's
//! CPU time, not a workload's throughput, so other load on the machine lengthens them only
//! through cache and scheduling effects; the table says what the load was.

use std::{collections::HashMap, process::Command};

use anyhow::{Context as _, Result, bail};

use crate::{cargo, root, run_cmd, say};

/// Live cgroups per configuration.
pub const SIZES: [usize; 5] = [250, 500, 1000, 2000, 4000];
/// The agent's default `max_cgroups` (agent/src/config.rs, `DEFAULT_MAX_CGROUPS`).
const AGENT_DEFAULT_MAX_CGROUPS: usize = 2000;
/// Room in `max_cgroups` for the host's own cgroups, beside the benchmark's.
const HOST_CGROUPS_ROOM: usize = 100;
/// Seconds per measured phase (without scrapes, then with): 12 collections and 4 scrapes.
const PHASE_SECONDS: u32 = 60;
/// After every cgroup is tracked: past the first reads of every cgroup's limits.
const WARMUP_SECONDS: u32 = 15;

/// Builds the agent and the benchmark, runs every size of `sizes`, returns the Markdown tables.
pub fn run(sizes: &[usize]) -> Result<String> {
    say("building stormwatch and exporter_bench (release)");
    run_cmd(cargo().args([
        "build",
        "--release",
        "--package",
        "stormwatch",
        "--package",
        "stormwatch-tests",
        "--bin",
        "stormwatch",
        "--bin",
        "exporter_bench",
        "--bin",
        "sleeper",
    ]))?;
    let bench = root().join("target/release/exporter_bench");
    let config_dir = tempfile::tempdir()?;
    let mut rows = Vec::new();
    for &n in sizes {
        let config = (n > AGENT_DEFAULT_MAX_CGROUPS)
            .then(|| -> Result<_> {
                let path = config_dir.path().join(format!("max_cgroups_{n}.toml"));
                let max = n + HOST_CGROUPS_ROOM;
                std::fs::write(&path, format!("max_cgroups = {max}\n"))?;
                Ok(path)
            })
            .transpose()?;
        let load = loadavg();
        say(&format!(
            "daemon with {n} live cgroups ({PHASE_SECONDS} s without scrapes, {PHASE_SECONDS} s \
             with; load average {load})"
        ));
        let mut cmd = Command::new(&bench);
        cmd.args(["--cgroups", &n.to_string()])
            .args(["--seconds", &PHASE_SECONDS.to_string()])
            .args(["--warmup", &WARMUP_SECONDS.to_string()])
            .args(["--interval", "5", "--scrape-every", "15"]);
        if let Some(config) = &config {
            say(&format!(
                "  with max_cgroups = {} (the default is {AGENT_DEFAULT_MAX_CGROUPS})",
                n + HOST_CGROUPS_ROOM
            ));
            cmd.arg("--config").arg(config);
        }
        let out = cmd
            .output()
            .with_context(|| format!("cannot start {}", bench.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        eprint!("{stdout}");
        if !out.status.success() {
            bail!(
                "exporter_bench --cgroups {n} failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let result = parse_result(&stdout)
            .with_context(|| format!("no `result` line from exporter_bench:\n{stdout}"))?;
        rows.push((n, result, load, loadavg()));
    }
    Ok(format!("{}{}", table(&rows), curve(&rows)))
}

/// The `result key=value ...` line.
pub(crate) fn parse_result(stdout: &str) -> Option<HashMap<String, String>> {
    let line = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("result "))?;
    Some(
        line.split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
    )
}

/// The 1-minute load average, as `uptime` shows it.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

type Row = (usize, HashMap<String, String>, String, String);

fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "\n### Daemon: `stormwatch run`, 5 s interval, scraped every 15 s (OpenMetrics, gzip)\n\n\
         | live cgroups | CPU, no scrapes | CPU, with scrapes | RSS (peak) | exposition (OpenMetrics / classic / gzip) | series per cgroup | collection | load avg (before → after) |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for (n, r, before, after) in rows {
        let v = |k: &str| r.get(k).map_or("?", String::as_str);
        out.push_str(&format!(
            "| {n} | {}% | {}% | {} MiB ({} MiB) | {} / {} / {} MiB | {} | {} ms | {before} → {after} |\n",
            v("cpu_idle_pct"),
            v("cpu_scraped_pct"),
            v("rss_mib"),
            v("peak_mib"),
            v("openmetrics_mib"),
            v("classic_mib"),
            v("gzip_mib"),
            v("series_per_cgroup"),
            v("collection_ms"),
        ));
    }
    out
}

/// A `result` field as a number.
fn number(r: &HashMap<String, String>, k: &str) -> Option<f64> {
    r.get(k)?.parse().ok()
}

/// The cost curve: CPU per 1,000 cgroups and RSS per cgroup (the average, and the marginal
/// cost from the size before), each size.
fn curve(rows: &[Row]) -> String {
    let mut out = String::from(
        "\n### Cost per cgroup\n\n\
         | live cgroups | CPU per 1,000 cgroups, no scrapes / with | µs of CPU per cgroup per collection (with scrapes) | RSS per cgroup (RSS / cgroups) | RSS per added cgroup (from the size before) |\n\
         |---|---|---|---|---|\n",
    );
    let mut before: Option<(usize, f64)> = None;
    for (n, r, _, _) in rows {
        let per_k = |k: &str| {
            number(r, k).map_or("?".to_owned(), |pct| {
                format!("{:.3}%", pct * 1000.0 / *n as f64)
            })
        };
        // The share of a CPU over the 5 s interval, per cgroup: µs per collection.
        let us = number(r, "cpu_scraped_pct").map_or("?".to_owned(), |pct| {
            format!("{:.1}", pct / 100.0 * 5.0 * 1e6 / *n as f64)
        });
        let rss = number(r, "rss_mib");
        let average = rss.map_or("?".to_owned(), |m| {
            format!("{:.1} KiB", m * 1024.0 / *n as f64)
        });
        let marginal = match (before, rss) {
            (Some((n0, m0)), Some(m)) if *n > n0 => {
                format!("{:.1} KiB", (m - m0) * 1024.0 / (*n - n0) as f64)
            }
            _ => "—".to_owned(),
        };
        out.push_str(&format!(
            "| {n} | {} / {} | {us} | {average} | {marginal} |\n",
            per_k("cpu_idle_pct"),
            per_k("cpu_scraped_pct"),
        ));
        before = rss.map(|m| (*n, m));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_result_line() {
        let r = parse_result("noise\nresult cgroups=200 cpu_idle_pct=0.41 rss_mib=21.5\n")
            .expect("a result");
        assert_eq!(r["cgroups"], "200");
        assert_eq!(r["cpu_idle_pct"], "0.41");
        assert!(parse_result("no result here\n").is_none());
        let t = table(&[(200, r, "1.0".into(), "2.0".into())]);
        assert!(t.contains("| 200 | 0.41% | ?% | 21.5 MiB (? MiB) |"), "{t}");
    }

    #[test]
    fn the_cost_per_cgroup() {
        let row = |n: usize, idle: &str, scraped: &str, rss: &str| {
            let r = parse_result(&format!(
                "result cgroups={n} cpu_idle_pct={idle} cpu_scraped_pct={scraped} rss_mib={rss}\n"
            ))
            .unwrap();
            (n, r, "0.1".to_owned(), "0.2".to_owned())
        };
        let c = curve(&[
            row(250, "0.200", "0.250", "20.0"),
            row(1000, "0.700", "0.900", "38.0"),
        ]);
        // 0.2% at 250 cgroups is 0.8% per 1,000; 0.25% of 5 s over 250 cgroups is 50 µs.
        assert!(
            c.contains("| 250 | 0.800% / 1.000% | 50.0 | 81.9 KiB | — |"),
            "{c}"
        );
        // (38 - 20) MiB over 750 more cgroups: 24.6 KiB each.
        assert!(
            c.contains("| 1000 | 0.700% / 0.900% | 45.0 | 38.9 KiB | 24.6 KiB |"),
            "{c}"
        );
        let unknown = curve(&[(10, HashMap::new(), String::new(), String::new())]);
        assert!(unknown.contains("| 10 | ? / ? | ? | ? | — |"), "{unknown}");
    }
}
