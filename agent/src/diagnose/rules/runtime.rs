//! The runtime-sizing rule: a Go, JVM or .NET runtime (or a server's own pool: Redis's spinning
//! I/O threads, memcached's and nginx's event loops) sized for more CPUs than the container may
//! use.

use std::collections::BTreeMap;

use super::{Facts, Finding, Kind, LockPair, Severity, Thresholds, limits_evidence};
use crate::identity::runtime::{ProcessRuntime, Runtime, Server};

/// A runtime sized for more CPUs than the container may use, while that costs it: Go's
/// `GOMAXPROCS`, the JVM's active processor count (and the GC pool it sized from it), .NET's
/// processor count — each read from the process (its environment, command line, build info and
/// threads), never guessed. It costs the container when the runtime's scheduler hands work
/// between its parked threads often (`runtime_min_handoffs_per_cpu_second` per allowed CPU),
/// or when the container keeps its CPUs saturated: then more threads than CPUs only take turns.
/// A server's pool of event loops (memcached, nginx) sleeps in `epoll_wait` instead and costs
/// in another way (`EventLoops`): it is named at twice the CPUs or more, while its threads
/// wake often for little work each — as `possible` (info) while its count lies within
/// `runtime_event_loops_near_line_factor` above that line, where the cost follows the CPU
/// kind: the finding then says what would decide it, and needs only the pool busy (its threads
/// waking as often, or keeping its CPUs saturated), whatever each wake-up carries: memcached's
/// 4 workers on 2 CPUs, starved of CPU by their load, woke for 70 µs each and still cost 1.14×
/// the CPU a request of 2 (tests/CORPUS.md).
pub fn runtime_sizing(f: &Facts, t: &Thresholds) -> Option<Finding> {
    let allowed = f.allowed_cpus();
    let n = allowed.ceil().max(1.0) as u32;
    let runtime_rate = f.runtime_handoffs_per_second() / allowed;
    let saturated = f.runnable_threads() / allowed >= t.storm_saturated_runnable_per_cpu;
    let pools_cost = saturated || runtime_rate >= t.runtime_min_handoffs_per_cpu_second;
    let loops = EventLoops::of(f);
    let loops_cost = loops.costs(t);
    // Near the count's line only `possible` is said, so there the loops need only be busy.
    let loops_busy = saturated || loops.busy(t);
    if !(pools_cost || loops_busy) {
        return None;
    }
    let mut sized: Vec<String> = Vec::new();
    let mut recs: Vec<String> = Vec::new();
    let mut largest = 0u32;
    let mut event_loops_named = false;
    // `possible` (never a cost said) when every process named is a pool of event loops near
    // its count's line.
    let mut possible = true;
    let loops_line = t.runtime_event_loops_min_per_cpu * allowed;
    let loops_band = loops_line * t.runtime_event_loops_near_line_factor;
    for p in &f.runtimes {
        let event_loops = p.server.is_some_and(|s| !s.spins());
        let costs = if event_loops {
            p.cpus.as_ref().is_some_and(|c| {
                let count = f64::from(c.value);
                count >= loops_line && (loops_cost || (loops_busy && count < loops_band))
            })
        } else {
            pools_cost
        };
        if !costs {
            continue;
        }
        let version = match &p.runtime {
            Runtime::Go { version } => version.clone(),
            _ => None,
        };
        let what = format!(
            "{} process {} ({}{})",
            runtime_label(&p.runtime),
            p.tgid,
            p.comm,
            version
                .as_deref()
                .map(|v| format!(", {v}"))
                .unwrap_or_default()
        );
        if let Some(c) = p.cpus.as_ref().filter(|c| c.value > n) {
            largest = largest.max(c.value);
            sized.push(match c.source {
                "affinity" => format!(
                    "{what} runs {} = {} (the CPUs it may run on: before Go 1.25 the runtime does not read the CPU limit)",
                    c.name, c.value
                ),
                _ if p.server == Some(Server::Redis) => format!(
                    "{what} runs {} {} (from its threads: the main thread and {} I/O threads, which spin while they wait for each other)",
                    c.name,
                    c.value,
                    c.value.saturating_sub(1)
                ),
                _ if p.server == Some(Server::Memcached) => format!(
                    "{what} runs {} {} (from its threads: {} mc-worker threads, each an event loop over the connections it was dealt)",
                    c.name, c.value, c.value
                ),
                _ if p.server == Some(Server::Nginx) => format!(
                    "{what} runs {} {} (from its worker processes, each an event loop)",
                    c.name, c.value
                ),
                source => format!("{what} runs {}={} (from its {source})", c.name, c.value),
            });
            recs.push(runtime_fix(p, c.source, n));
            event_loops_named |= event_loops;
            possible &= event_loops && f64::from(c.value) < loops_band;
        } else if let Some(gc) = p.gc_threads.filter(|g| *g > n) {
            possible = false;
            largest = largest.max(gc);
            sized.push(format!(
                "{what} runs {gc} GC worker threads: it sized its pools from {gc} or more CPUs"
            ));
            recs.push(format!(
                "Give the JVM the container's CPU count: -XX:ActiveProcessorCount={n} (its GC, JIT and ForkJoin pools follow it), or -XX:ParallelGCThreads={n} and -XX:ConcGCThreads where they are set by hand; check that container support is on (-XX:+UseContainerSupport, the default since JDK 10)."
            ));
        }
    }
    if sized.is_empty() {
        return None;
    }
    let mut e = BTreeMap::new();
    e.insert("runtime_handoffs_per_cpu_second", runtime_rate);
    e.insert("runtime_cpus", f64::from(largest));
    e.insert("runnable_per_cpu", f.runnable_threads() / allowed);
    limits_evidence(f, &mut e);
    let mut summary = format!(
        "{}runtime sized for {largest} CPUs on {allowed:.1} usable: {}",
        if possible { "possible: " } else { "" },
        sized.join("; ")
    );
    if runtime_rate > 0.0 {
        summary.push_str(&format!(
            "; its scheduler wakes parked threads {runtime_rate:.0} times/s per CPU to hand work around (futex hand-offs of work, not of a lock)"
        ));
    }
    if saturated {
        summary.push_str("; the container keeps its CPUs saturated");
    }
    if event_loops_named {
        summary.push_str(&format!(
            "; its threads woke {:.0} times/s per CPU for {:.0} µs of CPU each",
            loops.wakes_per_cpu_second,
            loops.cpu_seconds_per_wake * 1e6
        ));
        if loops_cost {
            summary.push_str(
                ": with more event loops than CPUs each wakes for the few requests ready on its \
                 own connections, where as many loops as CPUs would take several per wake-up",
            );
        }
        e.insert("wakes_per_cpu_second", loops.wakes_per_cpu_second);
        e.insert("cpu_seconds_per_wake", loops.cpu_seconds_per_wake);
    }
    if possible {
        summary.push_str(&format!(
            " (near a line: {:.1} event loops per usable CPU against a line of {:.0}, where \
             what they cost follows the CPU kind — memcached's 4 workers on 2 CPUs spent \
             1.00–1.25× the CPU a request of 2 — so the cost is not said: what decides it is \
             the CPU a request at {n} against now, under the same load)",
            f64::from(largest) / allowed,
            t.runtime_event_loops_min_per_cpu
        ));
    }
    if let Some(a) = f.binding_ancestor_quota() {
        let own = f
            .quota_cores
            .map(|q| format!("its own quota of {q:.1} CPUs"))
            .unwrap_or_else(|| "no quota of its own".to_owned());
        summary.push_str(&format!(
            "; the limit that binds is the quota of {} above the container ({:.1} CPUs), not \
             {own}: a runtime that reads only its own cgroup sizes itself for more",
            a.cgroup, a.cores
        ));
    }
    let go_mutex = go_mutex_named(f);
    if let Some(g) = &go_mutex {
        summary.push_str("; ");
        summary.push_str(&g.clause);
        recs.push(g.recommendation.clone());
        e.insert("go_mutex_contended_locks_per_second", g.per_second);
    }
    let mut found = Finding::new(
        Kind::RuntimeSizing,
        if possible {
            Severity::Info
        } else {
            Severity::Warning
        },
        f.owner(),
        summary,
        e,
        recs,
    );
    found.context.insert(
        "verdict",
        if possible { "possible" } else { "sized" }.into(),
    );
    found.context.insert(
        "runtimes",
        f.runtimes
            .iter()
            .map(|p| format!("{}:{}", p.tgid, runtime_label(&p.runtime)))
            .collect::<Vec<_>>()
            .join(","),
    );
    if let Some(g) = go_mutex {
        found.name_lock_pair(LockPair {
            waiter: g.lock_site,
            waker: g.unlock_site,
            share: g.top_share,
        });
    }
    Some(found)
}

/// A container's Go `sync.Mutex` contention, in words.
pub(super) struct GoMutexWords {
    pub(super) clause: String,
    pub(super) recommendation: String,
    pub(super) per_second: f64,
    /// The top `Lock` site's share of the sampled entries.
    pub(super) top_share: f64,
    pub(super) lock_site: String,
    pub(super) unlock_site: String,
}

/// Go's `sync.Mutex` contention from its uprobes (counted per second of the time they were
/// attached, in bursts), and the code that takes and hands on the mutex most, where a sample
/// named it.
pub(super) fn go_mutex_named(f: &Facts) -> Option<GoMutexWords> {
    use crate::symbolize::handoffs::GoMutexSites;
    let figures = f.go_uprobes;
    if figures.contended_locks == 0 {
        return None;
    }
    let per_second = figures.contended_locks_per_second()?;
    let g = &f.sites.as_ref()?.go_mutex;
    let (locks, sampled) = GoMutexSites::top(&g.lock_sites, 1);
    let (unlocks, _) = GoMutexSites::top(&g.unlock_sites, 1);
    let (lock, n) = locks.first().copied()?;
    let unlock = unlocks.first().map(|(s, _)| s.describe());
    let top_share = n as f64 / sampled.max(1) as f64;
    let mut clause = format!(
        "its goroutines contend on a sync.Mutex: {per_second:.0} Lock calls/s find it held \
         ({:.0} unlocks/s hand it on, over {:.1} s probed); {:.0}% of {sampled} sampled are \
         taken in {}",
        figures.handing_unlocks_per_second().unwrap_or(0.0),
        figures.probed_ns as f64 / 1e9,
        100.0 * top_share,
        lock.describe()
    );
    if let Some(u) = &unlock {
        clause.push_str(&format!(" and handed on from {u}"));
    }
    let recommendation = if lock.function.is_some() {
        format!(
            "Change the code that takes the sync.Mutex in {}: hold it for less, or split what it guards (the waits are in Go's scheduler: `go tool pprof` on the program's mutex profile, runtime.SetMutexProfileFraction, shows their time).",
            lock.describe()
        )
    } else {
        format!(
            "The code that takes the contended sync.Mutex could not be named: {}.",
            lock.describe()
        )
    };
    Some(GoMutexWords {
        clause,
        recommendation,
        per_second,
        top_share,
        lock_site: lock.describe(),
        unlock_site: unlock.unwrap_or_default(),
    })
}

fn runtime_label(r: &Runtime) -> &'static str {
    match r {
        Runtime::Go { .. } => "Go",
        Runtime::Jvm => "JVM",
        Runtime::DotNet => ".NET",
        Runtime::Native => "native",
    }
}

fn runtime_fix(p: &ProcessRuntime, source: &str, n: u32) -> String {
    match (&p.runtime, p.server) {
        (Runtime::Go { .. }, _) if source == "environment" => format!(
            "Set GOMAXPROCS={n}, or unset it on Go 1.25 and later, which read the container's CPU limit themselves (older: go.uber.org/automaxprocs): GOMAXPROCS above the CPUs it may use only adds Ms that park and wake to pass goroutines around."
        ),
        (Runtime::Go { .. }, _) => format!(
            "Set GOMAXPROCS={n}, or build with Go 1.25 or later, which reads the container's CPU limit (older: go.uber.org/automaxprocs)."
        ),
        (Runtime::Jvm, _) => format!(
            "Set -XX:ActiveProcessorCount={n} (or remove the flag: with container support the JVM reads the CPU limit itself); its GC, JIT and ForkJoin pools follow it."
        ),
        (Runtime::DotNet, _) => format!(
            "Set DOTNET_PROCESSOR_COUNT={n}, or unset it: .NET reads the container's CPU limit itself."
        ),
        (Runtime::Native, Some(Server::Redis)) => format!(
            "Set io-threads {} (in redis.conf, or --io-threads): Redis's I/O threads and main thread spin-wait for each other, so threaded I/O pays only where they each have a CPU; Redis advises it from 4 cores on, with a core left over, and finds more than 8 threads seldom help.",
            if n >= 4 { (n - 1).min(8) } else { 1 }
        ),
        (Runtime::Native, Some(Server::Memcached)) => format!(
            "Start memcached with -t {n} (--threads): its documentation finds more threads than CPU cores seldom useful, and each worker is an event loop over the connections it was dealt, so fewer workers take several ready requests per wake-up."
        ),
        (Runtime::Native, Some(Server::Nginx)) => format!(
            "Set worker_processes {n}; in nginx.conf: nginx's documentation advises one worker per CPU core, and each worker is an event loop, so fewer take several ready requests per wake-up (`auto` does not read a CPU quota)."
        ),
        (Runtime::Native, None) => format!("Size the program's pools to {n} CPU(s)."),
    }
}

/// How a container's threads woke over the window: often, for little CPU each, is what a pool
/// of more event loops than CPUs costs (each loop wakes for the requests ready on its own
/// connections; as many loops as CPUs would take several per wake-up, and every wake-up is a
/// context switch in and out).
#[derive(Clone, Copy, Debug, Default)]
struct EventLoops {
    /// Voluntary switches (each a sleep, ended by a wake-up) per second per allowed CPU.
    wakes_per_cpu_second: f64,
    /// The container's CPU time per voluntary switch.
    cpu_seconds_per_wake: f64,
}

impl EventLoops {
    fn of(f: &Facts) -> Self {
        let wakes = f.sched.voluntary_switches as f64;
        if wakes == 0.0 || f.window_seconds <= 0.0 {
            return Self::default();
        }
        Self {
            wakes_per_cpu_second: f.per_second(wakes) / f.allowed_cpus(),
            cpu_seconds_per_wake: f.sched.oncpu_ns as f64 / 1e9 / wakes,
        }
    }

    /// Whether its threads wake often enough to be serving a load: the pool is busy, whatever
    /// each wake-up carries.
    fn busy(&self, t: &Thresholds) -> bool {
        self.wakes_per_cpu_second >= t.runtime_event_loops_min_wakes_per_cpu_second
    }

    fn costs(&self, t: &Thresholds) -> bool {
        self.busy(t) && self.cpu_seconds_per_wake <= t.runtime_event_loops_max_cpu_seconds_per_wake
    }
}
