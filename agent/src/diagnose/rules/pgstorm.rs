//! The lock storm of a PostgreSQL server: backends queued on its heavyweight locks — a row
//! every connection updates, the transaction that holds it — judged from the server's own
//! lock-wait sites ([`crate::probes::pglock`]).
//!
//! The kernel rule ([`super::lock_storm`]) cannot see it: a backend that finds a row locked
//! sleeps on its latch in `epoll_wait` until the holder commits, and a backend waiting for its
//! client's next query sleeps in the same call. The sites PostgreSQL puts on either side of the
//! wait can: the waits' summed time over a window is the mean number of backends waiting for a
//! lock (Little's law), the queue the kernel rule counts in futex waits. Its line
//! (`pg_storm_min_waiting_backends_per_cpu`) was drawn on a PostgreSQL tuning case and its
//! counterfactual; the band around it and the severity's share are the kernel rule's.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Facts, Finding, Kind, Severity, Thresholds, limits_evidence, storm::NearLine};

/// The PostgreSQL storm's gate, in words.
const GATE: &str = "PostgreSQL backends waiting for a lock per CPU";

/// The figures the PostgreSQL storm judges, for every container whose PostgreSQL backends
/// waited for a heavyweight lock in the window: with a finding they are its evidence, without
/// one they say why not (`diagnose --json` prints them under `checked.postgres_lock_storm`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PgStormFigures {
    /// Lock waits that ended in the window.
    pub waits: u64,
    pub waits_per_second: f64,
    /// Their mean time, seconds.
    pub mean_wait_seconds: f64,
    /// Backends waiting for a lock on average over the window (the waits' time over the
    /// window's).
    pub waiting_backends: f64,
    /// …per CPU the container may use: the gate.
    pub waiting_backends_per_cpu: f64,
    /// The share of the container's threads' time spent waiting for a lock (the waiting
    /// backends over all its threads, the server's own processes among them, so at least
    /// this); `None` where its threads were not counted. The severity's figure.
    pub lock_wait_share: Option<f64>,
    /// The gate's figure, when it lies within `storm_near_line_factor` of its line.
    pub near_line: Option<NearLine>,
    pub lock_storm: bool,
    pub possible: bool,
}

impl PgStormFigures {
    /// `None` for a container without a PostgreSQL lock wait in the window.
    pub fn of(f: &Facts, t: &Thresholds) -> Option<Self> {
        let w = f.pg_lock;
        if w.waits == 0 {
            return None;
        }
        let seconds = f.window_seconds.max(1e-9);
        let waiting = w.wait_ns as f64 / 1e9 / seconds;
        let per_cpu = waiting / f.allowed_cpus();
        let lock_wait_share = f
            .threads
            .filter(|n| *n > 0)
            .map(|n| (waiting / n as f64).clamp(0.0, 1.0));
        let line = t.pg_storm_min_waiting_backends_per_cpu;
        let near_line = NearLine::of(GATE, per_cpu, line, t);
        let lock_storm = per_cpu >= line && near_line.is_none();
        Some(Self {
            waits: w.waits,
            waits_per_second: w.waits as f64 / seconds,
            mean_wait_seconds: w.wait_ns as f64 / 1e9 / w.waits as f64,
            waiting_backends: waiting,
            waiting_backends_per_cpu: per_cpu,
            lock_wait_share,
            near_line,
            lock_storm,
            possible: near_line.is_some(),
        })
    }
}

/// A PostgreSQL server's lock storm: on average at least
/// `pg_storm_min_waiting_backends_per_cpu` backends per usable CPU waiting for a heavyweight lock, by the server's own lock-wait sites;
/// `possible` near the line. Critical when the waits take at least
/// `storm_critical_lock_wait_share` of the container's threads' time.
pub fn postgres_lock_storm(f: &Facts, t: &Thresholds) -> Option<Finding> {
    let figures = PgStormFigures::of(f, t)?;
    if !figures.lock_storm && !figures.possible {
        return None;
    }
    let allowed = f.allowed_cpus();
    let severity = if figures.possible {
        Severity::Info
    } else if figures
        .lock_wait_share
        .is_some_and(|s| s >= t.storm_critical_lock_wait_share)
    {
        Severity::Critical
    } else {
        Severity::Warning
    };
    let head = match figures.near_line.filter(|_| figures.possible) {
        Some(near) => format!("possible lock storm ({})", near.words()),
        None => "lock storm".to_owned(),
    };
    let share = match (figures.lock_wait_share, f.threads) {
        (Some(s), Some(n)) => format!(
            "; about {:.0}% of its threads' time is spent waiting for a lock (at least: the \
             waiting backends over its {n} threads)",
            100.0 * s
        ),
        _ => String::new(),
    };
    let summary = format!(
        "{head}: PostgreSQL's backends waited for its heavyweight locks (rows, transactions, \
         relations) {:.0} times a second, {:.2} ms on average — {:.1} backends waiting on \
         average, {:.1} per usable CPU ({allowed:.1}){share}. The kernel sees none of it: a \
         backend waits on its latch in epoll_wait, as it waits for its client",
        figures.waits_per_second,
        figures.mean_wait_seconds * 1e3,
        figures.waiting_backends,
        figures.waiting_backends_per_cpu,
    );
    let mut e = BTreeMap::new();
    e.insert("pg_lock_waits_per_second", figures.waits_per_second);
    e.insert("pg_lock_mean_wait_seconds", figures.mean_wait_seconds);
    e.insert("pg_lock_waiting_backends", figures.waiting_backends);
    e.insert(
        "pg_lock_waiting_backends_per_cpu",
        figures.waiting_backends_per_cpu,
    );
    if let Some(s) = figures.lock_wait_share {
        e.insert("lock_wait_share", s);
    }
    if let Some(near) = figures.near_line {
        e.insert("near_line_value", near.value);
        e.insert("near_line", near.line);
    }
    e.insert("oncpu_cores", f.oncpu_cores());
    limits_evidence(f, &mut e);
    let mut recs = Vec::new();
    if let Some(near) = figures.near_line.filter(|_| figures.possible) {
        recs.push(near.what_decides());
    }
    recs.push(
        "Name the lock: `SELECT locktype, relation::regclass, mode, count(*) FROM pg_locks \
         WHERE NOT granted GROUP BY 1, 2, 3` while it happens, and pg_stat_activity's \
         `wait_event_type = 'Lock'` rows give the waiting queries (`pg_blocking_pids()` their \
         holders); `log_lock_waits = on` logs every wait over `deadlock_timeout`."
            .to_owned(),
    );
    recs.push(format!(
        "Make the hot rows less shared: {:.0} backends queued on average means transactions \
         wait for one another's rows. Keep such a transaction short (update the hot row last, \
         just before COMMIT), spread a counter over several rows summed on read, or batch its \
         updates in one writer; more connections only lengthen the queue — a pooler \
         (PgBouncer) with about as many server connections as usable CPUs shortens it.",
        figures.waiting_backends
    ));
    let mut found = Finding::new(Kind::LockStorm, severity, f.owner(), summary, e, recs);
    found.context.insert(
        "verdict",
        if figures.possible {
            "possible"
        } else {
            "storm"
        }
        .to_owned(),
    );
    found.context.insert("runtime", "postgresql".to_owned());
    found
        .context
        .insert("lock", "PostgreSQL heavyweight lock".to_owned());
    Some(found)
}
