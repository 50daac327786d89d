//! What PostgreSQL's lock-wait uprobes cost (`cargo +stable xtask bench --pg-lock-only`): a
//! storm on one row — 16 pgbench connections updating the same row of `pgbench_accounts`, the
//! server in a cgroup of its own, the load from outside it — its transactions per second with
//! no tracer, with `stormwatch run` as deployed (default configuration: two uprobes on the
//! server's `postgresql:lock__wait__start`/`done` sites, each wait two breakpoint traps), and
//! with the same daemon told not to attach them (`postgres_lock_waits = false`). The difference
//! between the last two is what the uprobes cost.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    bench::{Tracer, Workload, bench, stormwatch_run_with},
    bench_common::stormwatch_run,
    bench_ordinary::Server,
    say,
};

/// Connections updating the one row: 8 per CPU here, a storm the rule calls (tests/CORPUS.md).
const CLIENTS: u32 = 16;

/// The newest PostgreSQL's `name` binary under /usr/lib/postgresql.
fn postgres_bin(name: &str) -> Result<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .context("PostgreSQL is not installed (apt-get install postgresql)")?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin").join(name);
            bin.is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .with_context(|| format!("no PostgreSQL {name} under /usr/lib/postgresql"))
}

/// `bin` run as the `postgres` user, whom the server must run as.
fn as_postgres(bin: &Path) -> Command {
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid=postgres",
        "--regid=postgres",
        "--clear-groups",
        "--",
    ])
    .arg(bin);
    c
}

fn status_ok(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// A PostgreSQL server on a socket in its own directory, durability off, its table made.
struct Postgres {
    _server: Server,
    dir: tempfile::TempDir,
}

impl Postgres {
    fn start() -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("stormwatch-bench-pg-")
            .tempdir()?;
        status_ok(
            Command::new("chown")
                .arg("postgres:postgres")
                .arg(dir.path()),
        )?;
        let data = dir.path().join("data");
        status_ok(
            as_postgres(&postgres_bin("initdb")?)
                .arg("-D")
                .arg(&data)
                .args(["--auth=trust", "-U", "postgres", "--no-sync"]),
        )?;
        let server = Server::start(
            "postgres",
            as_postgres(&postgres_bin("postgres")?)
                .arg("-D")
                .arg(&data)
                .arg("-k")
                .arg(dir.path())
                .args(["-c", "listen_addresses=", "-c", "fsync=off"])
                .args(["-c", "synchronous_commit=off", "-c", "full_page_writes=off"]),
        )?;
        let pg = Self {
            _server: server,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !Command::new("pg_isready")
            .arg("-q")
            .arg("-h")
            .arg(pg.dir.path())
            .status()
            .is_ok_and(|s| s.success())
        {
            if Instant::now() > deadline {
                bail!("PostgreSQL did not start within 30 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        status_ok(pg.pgbench().args(["-i", "-s", "1", "-q", "postgres"]))?;
        std::fs::write(
            pg.dir.path().join("update.sql"),
            "\\set aid 1\nUPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;\n",
        )?;
        Ok(pg)
    }

    fn pgbench(&self) -> Command {
        let mut c = Command::new("pgbench");
        c.arg("-h").arg(self.dir.path()).args(["-U", "postgres"]);
        c
    }

    /// The hot row's transactions per second over `seconds`.
    fn hot_row(&self, seconds: u32) -> Result<f64> {
        let out = self
            .pgbench()
            .args(["-n", "-c", &CLIENTS.to_string(), "-j", "2", "-T"])
            .arg(seconds.to_string())
            .arg("-f")
            .arg(self.dir.path().join("update.sql"))
            .arg("postgres")
            .stdin(Stdio::null())
            .output()
            .context("cannot run pgbench (apt-get install postgresql-client)")?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!("pgbench failed ({}): {text}", out.status);
        }
        tps(&text).with_context(|| format!("no tps in pgbench's output: {text}"))
    }
}

/// pgbench's `tps = N (without initial connection time)`.
fn tps(report: &str) -> Option<f64> {
    report.lines().find_map(|l| {
        l.strip_prefix("tps = ")?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

pub fn run(bin: &Path, rounds: u32, seconds: u32) -> Result<String> {
    say("starting PostgreSQL");
    let pg = Postgres::start()?;
    let workload = Workload {
        shown: format!(
            "PostgreSQL storm on one row (`pgbench -c {CLIENTS}`, one `UPDATE` of one row of \
             pgbench_accounts; the server in a cgroup of its own)"
        ),
        unit: "transactions/s",
        run: Box::new(move |seconds| pg.hot_row(seconds)),
    };
    bench(
        bin,
        "PostgreSQL hot row",
        &workload,
        vec![
            Tracer {
                name: "none",
                start: None,
            },
            Tracer {
                name: "stormwatch run (default configuration: the lock-wait uprobes attached)",
                start: Some(stormwatch_run()),
            },
            Tracer {
                name: "stormwatch run, postgres_lock_waits = false (no uprobes)",
                start: Some(stormwatch_run_with("postgres_lock_waits = false\n")),
            },
        ],
        rounds,
        seconds,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_pgbenchs_rate() {
        let report = "number of failed transactions: 0 (0.000%)\n\
                      latency average = 3.051 ms\n\
                      initial connection time = 21.342 ms\n\
                      tps = 5243.721164 (without initial connection time)\n";
        assert_eq!(tps(report), Some(5243.721164));
        assert_eq!(tps("latency average = 3 ms\n"), None);
    }
}
