//! The lock storm of a Go program: goroutines queued on a `sync.Mutex`, judged from the Go
//! runtime's own clock of their waits ([`crate::identity::goclock`]).
//!
//! The kernel rule ([`super::lock_storm`]) cannot see it: a goroutine that finds the mutex held
//! spins, then parks in the Go scheduler, and its thread runs another goroutine; the futex
//! hand-offs the kernel sees are the scheduler's own (idle Ms parked and woken), which say
//! nothing of the mutex. What the runtime counts does: the time goroutines spent parked on
//! `sync.Mutex` and `RWMutex`, which over a window is the mean number of goroutines waiting for
//! one. Waits for work — a channel receive, a `sync.Cond`, a `WaitGroup`, network I/O — are
//! not in it, so a pool of goroutines waiting for work is never its storm.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    Facts, Finding, Kind, LockPair, Severity, Thresholds, limits_evidence,
    node_advice::{PIN_FEWER_STEPS, pin_on_this_node},
    runtime::go_mutex_named,
    storm::{NearLine, OneGate},
};

/// The Go storm's gate, in words.
const GATE: &str = "goroutines waiting for a sync.Mutex per CPU";

/// The figures the Go storm judges, for every container whose Go runtimes' clock was read:
/// with a finding they are its evidence, without one they say why not (`diagnose --json`
/// prints them under `checked.go_lock_storm`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GoStormFigures {
    /// Go processes read.
    pub processes: u32,
    /// Goroutines their runtimes hold (an upper bound of the live ones).
    pub goroutines: u64,
    pub gomaxprocs: Option<u32>,
    /// Goroutines waiting for a `sync.Mutex`/`RWMutex` on average over the window.
    pub waiting_goroutines: f64,
    /// …per CPU the container may use: the gate.
    pub waiting_goroutines_per_cpu: f64,
    /// What the lock costs the goroutines: the share of their time spent waiting for it (the
    /// waiting ones over all the runtime holds, so at least this). The severity follows it.
    pub lock_wait_share: f64,
    /// The gate's figure, when it lies within `storm_near_line_factor` of its line.
    pub near_line: Option<NearLine>,
    pub lock_storm: bool,
    /// Near the line, and the lock costs less than `storm_critical_lock_wait_share`.
    pub possible: bool,
}

impl GoStormFigures {
    /// `None` for a container with no Go process whose clock could be read.
    pub fn of(f: &Facts, t: &Thresholds) -> Option<Self> {
        let g = f.go_mutex?;
        let allowed = f.allowed_cpus();
        let waiting = g.waiting();
        let per_cpu = waiting / allowed;
        let lock_wait_share = if g.goroutines > 0 {
            (waiting / g.goroutines as f64).clamp(0.0, 1.0)
        } else {
            0.0
        };
        // The queue gate of the kernel rule, in goroutines: twice the CPUs queued for one
        // mutex means the mutex, not the CPUs, holds most of the work.
        let verdict = OneGate::judge(
            GATE,
            per_cpu,
            t.storm_min_queued_threads_per_cpu,
            lock_wait_share,
            t,
        );
        Some(Self {
            processes: g.processes,
            goroutines: g.goroutines,
            gomaxprocs: g.gomaxprocs,
            waiting_goroutines: waiting,
            waiting_goroutines_per_cpu: per_cpu,
            lock_wait_share,
            near_line: verdict.near,
            lock_storm: verdict.lock_storm,
            possible: verdict.possible,
        })
    }
}

/// A Go program's lock storm: on average at least `storm_min_queued_threads_per_cpu`
/// goroutines per usable CPU parked on a `sync.Mutex` or `RWMutex`, by the runtime's own clock.
/// Near that line, the lock's cost decides (`storm_critical_lock_wait_share` of the
/// goroutines' time: a storm), or the verdict is `possible`. The code that takes the mutex is
/// named from the mutex uprobes' samples where they ran.
pub fn go_lock_storm(f: &Facts, t: &Thresholds) -> Option<Finding> {
    let figures = GoStormFigures::of(f, t)?;
    if !figures.lock_storm && !figures.possible {
        return None;
    }
    let allowed = f.allowed_cpus();
    let n = allowed.ceil().max(1.0) as u64;
    let severity = if figures.possible {
        Severity::Info
    } else if figures.lock_wait_share >= t.storm_critical_lock_wait_share {
        Severity::Critical
    } else {
        Severity::Warning
    };
    let head = match figures.near_line.filter(|_| figures.possible) {
        Some(near) => format!("possible lock storm ({})", near.words()),
        None => "lock storm".to_owned(),
    };
    let mut summary = format!(
        "{head}: the Go runtime counts {:.1} goroutines waiting for a sync.Mutex or RWMutex on \
         average — {:.1} per usable CPU ({allowed:.1}) — of the {} it holds: at least {:.0}% \
         of the goroutines' time is spent waiting for a mutex. The kernel sees none of it: the \
         goroutines wait in the Go scheduler, not in futex calls",
        figures.waiting_goroutines,
        figures.waiting_goroutines_per_cpu,
        figures.goroutines,
        100.0 * figures.lock_wait_share,
    );
    let mut e = BTreeMap::new();
    e.insert("go_mutex_waiting_goroutines", figures.waiting_goroutines);
    e.insert(
        "go_mutex_waiting_goroutines_per_cpu",
        figures.waiting_goroutines_per_cpu,
    );
    e.insert("go_goroutines", figures.goroutines as f64);
    e.insert("lock_wait_share", figures.lock_wait_share);
    if let Some(p) = figures.gomaxprocs {
        e.insert("gomaxprocs", f64::from(p));
    }
    if let Some(near) = figures.near_line {
        e.insert("near_line_value", near.value);
        e.insert("near_line", near.line);
    }
    e.insert("oncpu_cores", f.oncpu_cores());
    e.insert("migrations_per_second", f.migrations_per_second());
    limits_evidence(f, &mut e);
    let mut recs = Vec::new();
    if let Some(near) = figures.near_line.filter(|_| figures.possible) {
        recs.push(near.what_decides());
    }
    let named = go_mutex_named(f);
    match &named {
        Some(g) => {
            summary.push_str("; ");
            summary.push_str(&g.clause);
            recs.push(g.recommendation.clone());
            e.insert("go_mutex_contended_locks_per_second", g.per_second);
        }
        None => recs.push(
            "Name the mutex: the program's mutex profile (`runtime.SetMutexProfileFraction`, \
             then `go tool pprof` on /debug/pprof/mutex) shows where the waits are; \
             `stormwatch diagnose` names the code that takes it where it can read the \
             process and its binary keeps its symbols."
                .to_owned(),
        ),
    }
    recs.push(format!(
        "Make the critical section shorter or the mutex less shared: {:.0} goroutines queued \
         on it means it serializes the work. Split what it guards (per key, per shard), use \
         sync.RWMutex for data mostly read, or atomics for counters.",
        figures.waiting_goroutines
    ));
    if let Some(p) = figures.gomaxprocs.filter(|p| u64::from(*p) > n) {
        recs.push(format!(
            "GOMAXPROCS is {p} on {allowed:.1} usable CPU(s): set GOMAXPROCS={n} (Go 1.25 and \
             later read the CPU limit themselves). More Ms than CPUs contend for the mutex \
             while others hold a CPU the holder needs."
        ));
    }
    if f.migrations_per_second() / allowed >= t.storm_high_migrations_per_second {
        let pin = format!(
            "Pin the container to fewer, dedicated CPUs: its threads move between CPUs {:.0} \
             times per second, and the mutex's cache line with them.",
            f.migrations_per_second()
        );
        recs.push(pin_on_this_node(f, n, pin, PIN_FEWER_STEPS));
    }
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
    found.context.insert("runtime", "go".to_owned());
    if let Some(g) = named {
        found.name_lock_pair(LockPair {
            waiter: g.lock_site,
            waker: g.unlock_site,
            share: g.top_share,
        });
    }
    Some(found)
}
