//! The daemon's own cost: `stormwatch run` at the default interval (5 s) with 200, 1,000 and
//! 2,000 live cgroups, scraped every 15 s the way Prometheus scrapes (OpenMetrics, gzip). Runs
//! `exporter_bench` (tests/src/bin) once per size and prints a Markdown table: CPU (without and
//! with scrapes), resident memory, the exposition's size, series per cgroup, collection time.
//!
//! Each size runs alone, one after the other, never interleaved: the figures are the daemon's
//! CPU time, not a workload's throughput, so other load on the machine lengthens them only
//! through cache and scheduling effects; the table says what the load was.

use std::{collections::HashMap, process::Command};

use anyhow::{Context as _, Result, bail};

use crate::{cargo, root, run_cmd, say};

/// Live cgroups per configuration.
const SIZES: [usize; 3] = [200, 1000, 2000];
/// Seconds per measured phase (without scrapes, then with): 12 collections and 4 scrapes.
const PHASE_SECONDS: u32 = 60;
/// After every cgroup is tracked: past the first reads of every cgroup's limits.
const WARMUP_SECONDS: u32 = 15;

/// Builds the agent and the benchmark, runs every size, returns the Markdown table.
pub fn run() -> Result<String> {
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
    let mut rows = Vec::new();
    for n in SIZES {
        let load = loadavg();
        say(&format!(
            "daemon with {n} live cgroups ({PHASE_SECONDS} s without scrapes, {PHASE_SECONDS} s \
             with; load average {load})"
        ));
        let out = Command::new(&bench)
            .args(["--cgroups", &n.to_string()])
            .args(["--seconds", &PHASE_SECONDS.to_string()])
            .args(["--warmup", &WARMUP_SECONDS.to_string()])
            .args(["--interval", "5", "--scrape-every", "15"])
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
    Ok(table(&rows))
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
}
