//! The lock storm of a Go program: goroutines queued on a `sync.Mutex`, judged from the Go
//! runtime's own clock of their waits ([`crate::identity::goclock`]) and from what the mutex
//! costs the program's CPUs ([`crate::probes::gocpu`]).
//!
//! The kernel rule ([`super::lock_storm`]) cannot see it: a goroutine that finds the mutex held
//! spins, then parks in the Go scheduler, and its thread runs another goroutine; the futex
//! hand-offs the kernel sees are the scheduler's own (idle Ms parked and woken), which say
//! nothing of the mutex. What the runtime counts does: the time goroutines spent parked on
//! `sync.Mutex` and `RWMutex`, which over a window is the mean number of goroutines waiting for
//! one. Waits for work — a channel receive, a `sync.Cond`, a `WaitGroup`, network I/O — are
//! not in it, so a pool of goroutines waiting for work is never its storm.
//!
//! But a queue is not a cost: a goroutine parked on the mutex gives its P to another goroutine,
//! and a program with more work than CPUs keeps them busy with it whatever the queue (the
//! clock counted 23 goroutines per CPU waiting in a program whose lock costs 0.7% of its CPU
//! and nothing of its work). So the storm needs both: the queue, and the CPUs spent spinning
//! and queueing in the mutex's code — the share of the processes' on-CPU samples there.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    Facts, Finding, Kind, LockPair, Severity, Thresholds,
    defaults::GO_STORM_MIN_CPU_SAMPLES,
    limits_evidence,
    node_advice::{PIN_FEWER_STEPS, pin_on_this_node},
    runtime::go_mutex_named,
    storm::NearLine,
};

/// The Go storm's gates, in words.
const GATE: &str = "goroutines waiting for a sync.Mutex per CPU";
const COST_GATE: &str = "share of the Go processes' CPU in the mutex's code";

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
    /// …per CPU the container may use: the queue's gate.
    pub waiting_goroutines_per_cpu: f64,
    /// The share of the goroutines' time spent waiting for a mutex (the waiting ones over all
    /// the runtime holds, so at least this).
    pub lock_wait_share: f64,
    /// On-CPU samples of the container's Go processes over the window.
    pub cpu_samples: u64,
    /// What the mutex costs the CPUs: the share of those samples in the mutex's code (a lower
    /// bound). `None` under `GO_STORM_MIN_CPU_SAMPLES` samples, or without the sampler. The
    /// cost's gate; the severity follows it.
    pub mutex_cpu_share: Option<f64>,
    /// A gate's figure, when it lies within `storm_near_line_factor` of its line (the queue's
    /// first).
    pub near_line: Option<NearLine>,
    pub lock_storm: bool,
    /// Near a line with a cost under `go_storm_critical_mutex_cpu_share`, or a queue whose cost
    /// could not be read.
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
        let cpu_samples = f.go_uprobes.cpu_samples;
        let mutex_cpu_share = f
            .go_uprobes
            .mutex_cpu_share()
            .filter(|(_, n)| *n >= GO_STORM_MIN_CPU_SAMPLES)
            .map(|(share, _)| share);
        let gate =
            |name, value: f64, line: f64| (value >= line, NearLine::of(name, value, line, t));
        // The queue's gate of the kernel rule, in goroutines: twice the CPUs queued for one
        // mutex means the mutex, not the CPUs, holds most of the work — where it costs them.
        let (queued, queue_near) = gate(GATE, per_cpu, t.storm_min_queued_threads_per_cpu);
        let (lock_storm, possible, near_line) = match mutex_cpu_share {
            Some(share) => {
                let (costs, cost_near) = gate(COST_GATE, share, t.go_storm_min_mutex_cpu_share);
                let near = queue_near.or(cost_near);
                if (!queued && queue_near.is_none()) || (!costs && cost_near.is_none()) {
                    (false, false, near)
                } else if near.is_none() {
                    (true, false, None)
                } else {
                    let decisive = share >= t.go_storm_critical_mutex_cpu_share;
                    (decisive, !decisive, near)
                }
            }
            // A queue whose cost is unknown is only possible.
            None => (false, queued || queue_near.is_some(), queue_near),
        };
        Some(Self {
            processes: g.processes,
            goroutines: g.goroutines,
            gomaxprocs: g.gomaxprocs,
            waiting_goroutines: waiting,
            waiting_goroutines_per_cpu: per_cpu,
            lock_wait_share,
            cpu_samples,
            mutex_cpu_share,
            near_line,
            lock_storm,
            possible,
        })
    }
}

/// A Go program's lock storm: on average at least `storm_min_queued_threads_per_cpu`
/// goroutines per usable CPU parked on a `sync.Mutex` or `RWMutex`, by the runtime's own clock,
/// and at least `go_storm_min_mutex_cpu_share` of its processes' CPU in the mutex's code. Near
/// a line, the cost decides (`go_storm_critical_mutex_cpu_share`: a storm), or the verdict is
/// `possible`, as it is where the cost could not be read. The code that takes the mutex is
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
    } else if figures
        .mutex_cpu_share
        .is_some_and(|s| s >= t.go_storm_critical_mutex_cpu_share)
    {
        Severity::Critical
    } else {
        Severity::Warning
    };
    let head = match (figures.possible, figures.near_line) {
        (true, Some(near)) => format!("possible lock storm ({})", near.words()),
        (true, None) => "possible lock storm (its cost unknown)".to_owned(),
        (false, _) => "lock storm".to_owned(),
    };
    let cost = match figures.mutex_cpu_share {
        Some(share) => format!(
            "about {:.0}% of the Go processes' CPU is spent in the mutex's code, spinning and              queueing for it (at least: {} of {} on-CPU samples)",
            100.0 * share,
            (share * figures.cpu_samples as f64).round(),
            figures.cpu_samples
        ),
        None => format!(
            "what it costs the CPUs is unknown: {} on-CPU samples of the Go processes,              {GO_STORM_MIN_CPU_SAMPLES} needed (the sampler needs perf events)",
            figures.cpu_samples
        ),
    };
    let mut summary = format!(
        "{head}: the Go runtime counts {:.1} goroutines waiting for a sync.Mutex or RWMutex on          average — {:.1} per usable CPU ({allowed:.1}) — of the {} it holds, and {cost}. The          kernel sees none of it: the goroutines wait in the Go scheduler, not in futex calls",
        figures.waiting_goroutines, figures.waiting_goroutines_per_cpu, figures.goroutines,
    );
    let mut e = BTreeMap::new();
    e.insert("go_mutex_waiting_goroutines", figures.waiting_goroutines);
    e.insert(
        "go_mutex_waiting_goroutines_per_cpu",
        figures.waiting_goroutines_per_cpu,
    );
    e.insert("go_goroutines", figures.goroutines as f64);
    e.insert("lock_wait_share", figures.lock_wait_share);
    e.insert("go_cpu_samples", figures.cpu_samples as f64);
    if let Some(share) = figures.mutex_cpu_share {
        e.insert("go_mutex_cpu_share", share);
    }
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
    match figures.near_line.filter(|_| figures.possible) {
        Some(near) => recs.push(near.what_decides()),
        None if figures.possible => recs.push(
            "Not yet decided: goroutines queue on a mutex, but whether it costs the CPUs needs              on-CPU samples of the program (the agent's sampler: perf events, CAP_PERFMON or              CAP_SYS_ADMIN), or its CPU profile (`go tool pprof` on /debug/pprof/profile):              time in sync.(*Mutex).lockSlow and the runtime's semaphore is what the lock costs."
                .to_owned(),
        ),
        None => {}
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
