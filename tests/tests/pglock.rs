//! PostgreSQL's heavyweight lock waits (`stormwatch::probes::pglock`, the PostgreSQL storm's
//! queue), as `diagnose --json` reads them (`checked.postgres_lock_storm[]`), against
//! bpftrace's own USDT probes at the same two sites (`usdt:…postgresql:lock__wait__start` and
//! `…done`, which raise the sites' semaphores as the agent's uprobes do — the kernel refuses
//! two uprobes at one site that disagree on it, so both attaching is itself checked), filtered
//! to the server's cgroup, over the agent's window:
//!
//! - 16 connections updating one of two rows: backends queue on the rows' locks;
//! - a row for each connection: no row is waited for.

use std::{
    io::{BufRead as _, BufReader},
    os::unix::process::CommandExt as _,
    process::{Child, Stdio},
    sync::mpsc,
    time::Duration,
};

use serde_json::Value;
use stormwatch_tests::{
    Agent, TestCgroup,
    bpftrace::{Bpftrace, diagnose_beside, measured},
    corpus::{pgbench, postgres_bin, postgres_server},
    join_before_exec, require_bpf,
};

/// The judged window.
const SECONDS: u32 = 10;

/// A PostgreSQL server in a cgroup of its own, loaded by pgbench from outside it; both stopped
/// on drop.
struct Server {
    cgroup: TestCgroup,
    server: Child,
    load: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.load.kill();
        let _ = self.load.wait();
        // SIGINT: the server's fast shutdown, its backends with it.
        // SAFETY: kill(2) on our own child's pid, not reaped yet.
        unsafe { libc::kill(self.server.id() as libc::pid_t, libc::SIGINT) };
        let _ = self.server.wait();
    }
}

/// The server under load, once pgbench has reported a second of transactions.
fn start(name: &str, clients: u32, hot_rows: u32, own_rows: bool) -> Server {
    let cgroup = TestCgroup::new(&format!("pglock-{name}"));
    let dir = tempfile::tempdir().expect("a scratch directory");
    let mut server = postgres_server(dir.path());
    server.stdout(Stdio::null()).stderr(Stdio::null());
    join_before_exec(&mut server, &cgroup.path().join("cgroup.procs"));
    let server = server.spawn().expect("starting PostgreSQL");
    let mut load = pgbench(dir.path(), clients, hot_rows, own_rows);
    load.stdin(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    let mut load = load.spawn().expect("starting pgbench");
    let out = load.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if line.starts_with("progress:") {
                let _ = tx.send(());
            }
        }
    });
    let server = Server {
        cgroup,
        server,
        load,
        _dir: dir,
    };
    rx.recv_timeout(Duration::from_secs(60))
        .expect("pgbench reported no transactions within 60 s");
    server
}

/// bpftrace's view of the window: waits that ended, their summed time (ns), and how long it
/// counted (ns).
struct Oracle {
    waits: i64,
    wait_ns: i64,
    span_ns: i64,
}

/// The agent's PostgreSQL figures of the server's cgroup over one `diagnose` window (`None`:
/// it saw no lock wait there), and bpftrace's over as much of the same window as it can
/// cover: started once the agent's probes are attached, stopped at its end; measured again
/// when bpftrace hangs on SIGINT ([`measured`]).
fn figures(s: &Server) -> (Option<Value>, Oracle) {
    measured(|| window(s))
}

fn window(s: &Server) -> Result<(Option<Value>, Oracle), String> {
    let bin = postgres_bin("postgres");
    let bin = bin.display();
    let id = s.cgroup.id();
    let (report, printed) = diagnose_beside(SECONDS, || {
        Bpftrace::start(&format!(
            "BEGIN {{ @start = nsecs; }}
         usdt:{bin}:postgresql:lock__wait__start /cgroup == {id}/ {{ @s[tid] = nsecs; }}
         usdt:{bin}:postgresql:lock__wait__done /cgroup == {id} && @s[tid]/ {{
             @waits = count(); @wait_ns = sum(nsecs - @s[tid]); delete(@s[tid]);
         }}
         END {{ @span_ns = nsecs - @start; clear(@s); delete(@start); }}"
        ))
    })?;
    let mine = report["checked"]["postgres_lock_storm"]
        .as_array()
        .expect("checked.postgres_lock_storm")
        .iter()
        .find(|c| c["cgroup"].as_str() == Some(s.cgroup.rel_path()))
        .cloned();
    let oracle = Oracle {
        waits: printed.get("@waits").unwrap_or(0),
        wait_ns: printed.get("@wait_ns").unwrap_or(0),
        span_ns: printed.require("@span_ns"),
    };
    Ok((mine, oracle))
}

#[test]
fn a_hot_rows_lock_waits_are_the_ones_bpftrace_counts() {
    require_bpf();
    let s = start("hot", 16, 2, false);
    let (mine, oracle) = figures(&s);
    let mine = mine.unwrap_or_else(|| {
        panic!(
            "the agent saw no PostgreSQL lock wait in {}; bpftrace counted {} waits",
            s.cgroup.rel_path(),
            oracle.waits
        )
    });
    let span = oracle.span_ns as f64 / 1e9;
    let (rate, waiting) = (
        oracle.waits as f64 / span,
        oracle.wait_ns as f64 / 1e9 / span,
    );
    let my_rate = mine["waits_per_second"].as_f64().expect("waits_per_second");
    let my_waiting = mine["waiting_backends"].as_f64().expect("waiting_backends");
    eprintln!(
        "agent: {my_rate:.0} waits/s, {my_waiting:.2} backends waiting; bpftrace over {span:.1} \
         s: {rate:.0} waits/s, {waiting:.2} waiting"
    );
    assert!(
        oracle.waits >= 1000,
        "bpftrace counted {} waits: the rows are not contended enough to judge",
        oracle.waits
    );
    // The two windows differ by bpftrace's start (after the agent's) and the load moves from
    // one second to the next; the mean wait, a ratio of the two figures, moves less.
    for (what, agent, bpftrace, tolerance) in [
        ("waits per second", my_rate, rate, 0.15),
        ("backends waiting", my_waiting, waiting, 0.20),
        ("mean wait (s)", my_waiting / my_rate, waiting / rate, 0.15),
    ] {
        assert!(
            (agent - bpftrace).abs() <= tolerance * bpftrace,
            "{what}: the agent read {agent:.6}, bpftrace {bpftrace:.6} (±{:.0}% allowed)",
            100.0 * tolerance
        );
    }
}

#[test]
fn rows_of_their_own_wait_for_nothing() {
    require_bpf();
    let s = start("own", 16, 2, true);
    let (mine, oracle) = figures(&s);
    let span = oracle.span_ns as f64 / 1e9;
    let waiting = oracle.wait_ns as f64 / 1e9 / span;
    let my_waiting = mine.as_ref().map_or(0.0, |m| {
        m["waiting_backends"].as_f64().expect("waiting_backends")
    });
    eprintln!(
        "agent: {my_waiting:.4} backends waiting ({:?}); bpftrace: {} waits, {waiting:.4} waiting",
        mine.as_ref().map(|m| &m["waits"]),
        oracle.waits
    );
    // A row of each connection's own: what waits there is the table's growth (the relation
    // extension lock), a few a second at most, and both say so.
    assert!(
        my_waiting < 0.05 && waiting < 0.05,
        "the agent read {my_waiting:.4} backends waiting, bpftrace {waiting:.4}: rows of their \
         own should wait for (almost) nothing"
    );
    if let Some(m) = &mine {
        assert_eq!(
            m["lock_storm"].as_bool(),
            Some(false),
            "no storm without a shared row: {m}"
        );
    }
}

#[test]
fn without_postgres_lock_waits_no_uprobe_counts() {
    require_bpf();
    let s = start("hot", 16, 2, false);
    let out = Agent::start(&[
        "diagnose",
        "--duration",
        "4",
        "--json",
        "--no-postgres-lock-waits",
    ])
    .finish_output();
    let report: Value = serde_json::from_str(&out.stdout_text()).expect("diagnose --json");
    let checked = report["checked"]["postgres_lock_storm"]
        .as_array()
        .expect("checked.postgres_lock_storm");
    assert!(
        checked.is_empty(),
        "--no-postgres-lock-waits, yet PostgreSQL figures: {checked:?}"
    );
    // The same server, the same hot row, seen with the uprobes: the empty list above is the
    // flag's doing, not a storm that did not happen.
    let (mine, oracle) = figures(&s);
    assert!(
        mine.is_some() && oracle.waits >= 1000,
        "the hot row waited: the agent {mine:?}, bpftrace {} waits",
        oracle.waits
    );
}
