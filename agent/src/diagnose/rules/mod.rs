//! The rules. Each is a pure function of one container's [`Facts`] (and, for naming a noisy
//! neighbour, the host's), returning a finding or nothing.

use std::collections::BTreeMap;

mod gostorm;
mod handoff_cost;
mod lock_sites;
mod node_advice;
mod pgstorm;
mod runtime;
mod storm;
mod vtstorm;

pub use self::{
    gostorm::GoStormFigures,
    pgstorm::PgStormFigures,
    runtime::runtime_sizing,
    storm::{QuotaBound, StormFigures, lock_storm_candidate, required_handoffs_per_cpu_second},
    vtstorm::{VirtualRemountFigures, VirtualStormFigures},
};
use super::{Facts, Finding, Kind, LockPair, RunqBlame, Severity, Thresholds};
use crate::collect::log2_quantile_ns;

/// Default thresholds, with the reason for each value.
pub mod defaults {
    /// "Far more threads than usable CPUs": with fewer than 4 per CPU, a waiting thread's CPU
    /// is not what the others wait for, and the hand-off cost stays bounded. (The corpus's
    /// 2-thread hand-off has 11 threads per CPU counting the JVM's own: the queue gate below is
    /// what rules it out, not this one.)
    pub const STORM_MIN_THREADS_PER_CPU: f64 = 4.0;
    /// Threads queued for a hand-off, per allowed CPU: the time in futex waits that ended in a
    /// wake, per second of window (Little's law). Twice the CPUs means the lock's queue, not
    /// the CPUs, holds most of the threads. Measured on the corpus: lock storms 5.8 (Go, whose
    /// runtime parks its Ms) to 53 (a storm inside a 0.5-CPU quota); a 2-thread JVM hand-off
    /// 0.9, stress-ng's futex stressor 1.0.
    pub const STORM_MIN_QUEUED_THREADS_PER_CPU: f64 = 2.0;
    /// Of the threads' time off the CPU (blocked, or waiting for a CPU), the part in futex
    /// waits: the threads wait for each other, not for I/O or timers they sleep on. Corpus:
    /// storms 0.76–1.0; servers blocked in epoll or reads, and CPU-bound threads, 0.
    pub const STORM_MIN_FUTEX_BLOCKED_SHARE: f64 = 0.5;
    /// Hand-offs (waits that ended in a wake) per second per allowed CPU while the container
    /// keeps its CPUs saturated (see `STORM_SATURATED_RUNNABLE_PER_CPU`): a lock taken so often
    /// that threads queue for it while others wait for a CPU. Corpus: a JVM `synchronized`
    /// storm 271–295 (the monitor spins first, so few acquisitions reach the kernel), Go 480,
    /// pthread mutex storms 940–980; every case that is not lock-bound hands off 0 here, or
    /// has CPUs to spare.
    pub const STORM_MIN_HANDOFFS_PER_CPU_SECOND: f64 = 100.0;
    /// The most hand-offs per second per allowed CPU required when the CPUs are not saturated:
    /// a convoy. When every release wakes a parked waiter, the CPUs go idle while the lock is
    /// passed through the kernel, so busy CPUs cannot be required — but idle CPUs with parked
    /// threads are also what a pool waiting for work looks like. Below saturation the rule asks
    /// the saturated rate per CPU's worth of threads that want to run (`storm.rs`,
    /// `required_handoffs_per_cpu_second`), and this much for a container near idle: a convoy
    /// hands the lock on as fast as the kernel can wake the next waiter (corpus: futex lock-pi
    /// 2,900–4,700 per CPU at 0.2 runnable per CPU, a fair ReentrantLock 23,000–47,000 at
    /// 0.6), a queue at the rate work arrives (corpus, 500 tasks/s at 0.02 runnable per CPU:
    /// 46 per CPU among threads that both wait and wake, 250 counting every woken wait).
    pub const STORM_MIN_CONVOY_HANDOFFS_PER_CPU_SECOND: f64 = 1000.0;
    /// The container keeps at least its allowed CPUs' worth of threads running or runnable
    /// (on-CPU time plus run-queue wait per second, per allowed CPU): it would use more CPU
    /// than it may, so a lock taken even a hundred times a second per CPU stalls work. Chosen
    /// over on-CPU time alone because a storm throttled by its quota, or sharing its CPUs with
    /// a neighbour, is saturated with little CPU time of its own.
    pub const STORM_SATURATED_RUNNABLE_PER_CPU: f64 = 1.0;
    /// A container that has spent its quota and wanted at most this many CPUs runs its lock's
    /// queue one thread at a time: the holder, plus a quarter of a CPU for the work its
    /// threads do outside the lock. Such a convoy would use about one CPU if the quota let
    /// it; inside a smaller quota the quota binds first, and a lock per thread does the same
    /// work. Measured in a 0.5-CPU quota on 2 CPUs (tests/CORPUS.md): convoys 1.01–1.05 CPUs
    /// wanted, storms whose threads contend while they run (spinning, a lock word's cache line
    /// passed between CPUs) 1.6–1.9.
    pub const STORM_SERIAL_MAX_CPUS_WANTED: f64 = 1.25;
    /// …unless its hand-offs themselves eat the quota: a hand-off costs a futex wake, a futex
    /// wait and two context switches, 2–5 µs of CPU (sysbench in a 0.5-CPU quota spends 45% of
    /// it in futex calls at 103,000 hand-offs/s: 2.2 µs each). 20,000 hand-offs per second of
    /// CPU used cost 4–10% of it: a lock made uncontended would give back less than a tenth of
    /// the quota. Above it, a serialized storm still spends its quota on the lock (sysbench:
    /// 207,000; a lock per thread does 0.9–1.3× the work, one thread 6.4×).
    pub const STORM_QUOTA_BOUND_MAX_HANDOFFS_PER_CPU_SECOND_USED: f64 = 20_000.0;
    /// A quota that ran out in at least half the periods the container ran in is spent: a
    /// convoy inside it is held back by it period after period (the corpus's quota convoys:
    /// 100%).
    pub const QUOTA_BOUND_MIN_THROTTLED_SHARE: f64 = 0.5;
    /// At most half of the waits may end in a timeout: threads parked with a timeout (idle
    /// pools polling for work) time out; threads queued on a lock are woken by its release.
    pub const STORM_MAX_TIMEOUT_SHARE: f64 = 0.5;
    /// At least half of the sampled hand-offs whose waiter's code says what it waited for
    /// waited for a condition (`pthread_cond_wait`, `uv_cond_wait`, `Object.wait`, a blocking
    /// queue's `take`), not a lock: the threads queue for work, and the mutex a condition wait
    /// reacquires is taken inside it. A pool fed by a producer (an event loop, an acceptor) does
    /// as much work with 2 threads as with 64, however hot its queue's mutex (tests/CORPUS.md:
    /// a libuv pool, 87% of its sampled hand-offs in `uv_cond_wait`, 0.94× with 2 threads);
    /// lock storms wait in `pthread_mutex_lock`, monitor entry or `ReentrantLock.lock`.
    pub const STORM_MAX_CONDITION_WAIT_SHARE: f64 = 0.5;
    /// Sampled hand-offs whose waiter's code says what it waited for, before that share is
    /// judged: at the sampler's default budget (100 a second on the node) a storm has hundreds
    /// in a window; 20 keep one unlucky sample from deciding.
    pub const STORM_MIN_KINDED_SAMPLES: u64 = 20;
    /// A storm is critical when its threads spend at least half their time waiting for the
    /// lock (the lock's queued threads over all the threads: `StormFigures::lock_wait_share`):
    /// the severity follows what the lock costs them, not how often it is handed on (issue
    /// #41: 228 hand-offs per CPU-second was as critical as 36,000). Corpus: the short-section
    /// pthread storm 0.67, the adaptive mutex 0.72, the convoy 0.97, the rwlock writers 0.46
    /// (they spin in user space first). The line matches the 8 queued threads per CPU it
    /// replaced at the corpus's 16 threads per CPU.
    pub const STORM_CRITICAL_LOCK_WAIT_SHARE: f64 = 0.5;
    /// A Go program's mutex is a storm only where it costs the CPUs: at least this share of
    /// its processes' on-CPU samples in the mutex's code (`probes::gocpu`). Chosen on the
    /// tuning half: go-mutex-storm reads about 18% (its mutex made per-goroutine does 1.8×),
    /// its counterfactual 0; the line is a quarter of the storm's figure, as the figure is a
    /// lower bound (the runtime's parking on its own stack and the inlined fast path's cache
    /// misses are not in it). Goroutines waiting for a mutex cost nothing where their Ps find
    /// other work: the clock alone called a program whose lock costs 0.7% a storm
    /// (tests/CORPUS.md, "What the lock costs the CPU").
    pub const GO_STORM_MIN_MUTEX_CPU_SHARE: f64 = 0.05;
    /// PostgreSQL backends waiting for a heavyweight lock (a row, a transaction id), per usable
    /// CPU, for a PostgreSQL storm (`PgStormFigures`): the mean over the window, from the
    /// server's own lock-wait sites. Chosen on the tuning half: postgres-two-hot-rows (16
    /// connections on two rows; a row each does 1.32–1.53×) read 1.66–1.81 in five corpus
    /// runs, its counterfactual (a row each) 0.00. A queue is not all of the cost: the same
    /// rows by hand read 0.77 at 1.2× (one clean run), and 32 connections over four rows 1.23
    /// at 1.05–1.10× (not lock-bound), so no line parts those two; at 1.0 the second lies in
    /// the band (×1.25: `possible`) and the first under it, while the storm's corpus readings
    /// lie above it and the calm ones far below (32 connections over 100 rows, which gain
    /// nothing from a row each, 0.02 by bpftrace). Not the kernel rule's queue line (2): on it
    /// the tuning storm was only `possible` in all five runs.
    pub const PG_STORM_MIN_WAITING_BACKENDS_PER_CPU: f64 = 1.0;
    /// …and is critical, or decides a verdict near a line, at a quarter of the CPUs or more.
    pub const GO_STORM_CRITICAL_MUTEX_CPU_SHARE: f64 = 0.25;
    /// The fewest on-CPU samples (about one CPU-second at the sampler's rate) a share is
    /// judged on.
    pub const GO_STORM_MIN_CPU_SAMPLES: u64 = 100;
    /// How near a figure must be to a storm gate's line, as a factor either side of it, for
    /// the verdict to be `possible` rather than said: one convoy's hand-off rate spread over
    /// 976–1,193 per CPU-second across ten runs against its line of 1,000, and a libuv pool's
    /// over 60–137 against 100 — within ×1.25 of a line a run falls on either side of it.
    pub const STORM_NEAR_LINE_FACTOR: f64 = 1.25;
    /// What one hand-off of a lock between virtual threads costs a carrier (an unpark, a park
    /// and a remount, per continuation the scheduler counts), at the least: measured on the
    /// tuning storms of tests/CORPUS.md ("Virtual threads"), 54% of 2 CPUs lost over 1.5 M
    /// remounts a second, 11% over 0.32 M (AMD EPYC, JDK 25): about 0.7 µs.
    pub const VIRTUAL_HANDOFF_CPU_SECONDS: f64 = 0.7e-6;
    /// …and at the most: the same storms on an Intel Xeon VM lost 63% of 2 CPUs over
    /// 0.62–0.66 M a second, 31% over 0.23 M — 1.9–2.7 µs each (2026-12-01,
    /// tests/CORPUS.md). A finding states the hand-offs' cost between the two.
    pub const VIRTUAL_HANDOFF_CPU_SECONDS_HIGH: f64 = 2.7e-6;
    /// Virtual threads handed a lock, per usable CPU and second, for a JVM's virtual-thread
    /// storm (`VirtualStormFigures`): the rate at which the hand-offs cost 5% of the CPUs at
    /// [`VIRTUAL_HANDOFF_CPU_SECONDS`] each, the least measured (a storm is called where even
    /// the cheapest hand-offs cost that much) — the cost line of Go's storm
    /// ([`GO_STORM_MIN_MUTEX_CPU_SHARE`]). The first line (1,000, between the tuning storm's
    /// 260,000–770,000 and the calm program's 9–37) called the JDK's HTTP server a storm in 2
    /// of 3 runs (jvm-virtual-http: 2 platform threads serve it at 0.76–1.09× its CPU a
    /// request) and, at a tenth of the work a request, a critical one at 11,900–12,600 per
    /// CPU-second, 7 of its 11 virtual threads queued on a JDK monitor (2026-12-01): queues
    /// whose hand-offs cost under 1% of the CPUs.
    pub const STORM_MIN_VIRTUAL_HANDOFFS_PER_CPU_SECOND: f64 =
        GO_STORM_MIN_MUTEX_CPU_SHARE / VIRTUAL_HANDOFF_CPU_SECONDS;
    /// Migrations per second per allowed CPU above which pinning is worth recommending: each
    /// migration moves the lock's cache lines and the thread's working set.
    pub const STORM_HIGH_MIGRATIONS_PER_SECOND: f64 = 50.0;
    /// Kernel spinlock wait, in seconds per second (0.01 = 1% of a CPU spinning): the
    /// `_raw_spin_unlock_irqrestore` signature of futex hash-bucket and run-queue lock hand-offs.
    pub const STORM_SIGNIFICANT_SPIN_WAIT: f64 = 0.01;
    /// Half of the container's wake-ups sent from another CPU than the woken thread's: most
    /// hand-offs then pay an inter-processor interrupt (in a guest, usually a VM exit), so how
    /// far the threads spread over CPUs, not the lock alone, sets the cost of each hand-off. A
    /// storm pinned to one CPU is near 0.
    pub const STORM_HIGH_REMOTE_WAKEUP_SHARE: f64 = 0.5;
    /// 5% of the host's CPU time stolen by the hypervisor: vCPUs are descheduled often enough
    /// that a lock holder preempted on its vCPU (lock-holder preemption) stalls every waiter.
    pub const STORM_SIGNIFICANT_STEAL_SHARE: f64 = 0.05;
    /// Pools look sized from the node when the container runs at least as many threads as the
    /// node has CPUs, and the node has at least 4 times the CPUs the container may use: pools
    /// sized from the container's CPUs would be 4 times smaller.
    pub const STORM_NODE_SIZED_MIN_HOST_PER_ALLOWED_CPU: f64 = 4.0;
    /// A runtime sized for more CPUs than the container may use is a problem worth a finding
    /// once its scheduler hands work between its parked threads at least this often per second
    /// per allowed CPU (the storm's saturated hand-off rate): each such hand-off is a futex wake
    /// and a context switch, paid for threads that cannot run at once anyway. Or when the
    /// container keeps its CPUs saturated (`STORM_SATURATED_RUNNABLE_PER_CPU`).
    pub const RUNTIME_MIN_HANDOFFS_PER_CPU_SECOND: f64 = 100.0;
    /// A server whose pool is of event loops (memcached's `-t`, nginx's `worker_processes`)
    /// is named once it runs at least twice as many as the container's CPUs: under load each
    /// loop takes the requests ready on its own connections per wake-up, so at twice the CPUs
    /// each carries at most half the requests a wake-up that as many loops as CPUs would.
    /// Both servers' documentation advise no more than the CPU cores. Chosen from that, not
    /// fitted: the corpus's two such tuning cases run 32 per CPU (tests/CORPUS.md).
    pub const RUNTIME_EVENT_LOOPS_MIN_PER_CPU: f64 = 2.0;
    /// …and said only `possible` while the count lies within this factor above that line:
    /// there the cost follows the CPU kind, not the count. memcached's default of 4 workers on
    /// 2 CPUs (twice the CPUs, on the line) spent 1.09–1.25× the CPU a request of 2 workers on
    /// the AMD VM and 1.00× on the Intel one (pairs 1.08, 1.00, 1.00), where 8 per CPU cost
    /// 1.17–1.58× on both servers (tests/CORPUS.md). The factor is the storms' band
    /// (`STORM_NEAR_LINE_FACTOR`): no measured count lies between 2 and 8 per CPU to draw it on.
    pub const RUNTIME_EVENT_LOOPS_NEAR_LINE_FACTOR: f64 = 1.25;
    /// …and while it costs: its threads wake at least this often per second per allowed CPU
    /// (`voluntary_switches`; near the line, where only `possible` is said, this or its CPUs
    /// saturated is enough)…
    pub const RUNTIME_EVENT_LOOPS_MIN_WAKES_PER_CPU_SECOND: f64 = 5_000.0;
    /// …for at most this much CPU a wake-up: a wake and its context switches then weigh on
    /// each request. memcached with 64 workers on 2 CPUs woke 48,000–56,000 times/s per CPU
    /// for 10–11 µs each (2 workers: 5,400–6,100 for 74–82 µs), nginx with 64 workers
    /// 17,000–18,000 for 20–21 µs (2 workers: 8,700–9,400 for 31–33 µs), by hand
    /// (2026-12-01, AMD guest): the lines sit a factor of 2.5 or more from the tuning cases.
    pub const RUNTIME_EVENT_LOOPS_MAX_CPU_SECONDS_PER_WAKE: f64 = 50e-6;
    /// Share of the quota's periods in which it ran out: in 5% of its periods (one in twenty)
    /// the container stands stalled until the period ends, enough to show in tail latency.
    pub const THROTTLING_MIN_THROTTLED_SHARE: f64 = 0.05;
    /// A container inside a quota that runs at least this share of it has spent its quota: more
    /// CPU would be used, so the quota limits its throughput before anything else does. Below
    /// it, CPU time it may use goes unused, and what holds it back is elsewhere (its lock).
    pub const QUOTA_SPENT_SHARE: f64 = 0.9;
    /// A quarter of its periods end in a stall by its own quota.
    pub const THROTTLING_CRITICAL_THROTTLED_SHARE: f64 = 0.25;
    /// Mean run-queue wait of 1 ms: an idle or right-sized host serves wake-ups in tens of
    /// microseconds; a millisecond on average means threads regularly wait for a CPU.
    pub const RUNQ_MIN_MEAN_SECONDS: f64 = 0.001;
    /// A run-queue wait's culprit is named when another container held the CPUs for at least
    /// this share of the blamed wait: the largest part, if not the whole.
    pub const RUNQ_BLAME_NAME_SHARE: f64 = 0.25;
    /// p99 of 20 ms: a request served by such a wake-up misses typical latency budgets.
    pub const RUNQ_MIN_P99_SECONDS: f64 = 0.020;
    /// Mean of 10 ms: more than a scheduler slice; threads wait longer than they run.
    pub const RUNQ_CRITICAL_MEAN_SECONDS: f64 = 0.010;
    /// Twice as many threads runnable on average as CPUs allowed: half of them always wait.
    pub const OVERSUBSCRIPTION_MIN_RUNNABLE_PER_CPU: f64 = 2.0;
    /// Run-queue samples a window needs before its latency is judged.
    pub const RUNQ_MIN_SAMPLES: u64 = 100;
}

/// The lock-storm rule: the kernel's ([`StormFigures`]: threads handing a lock to one another
/// through futexes), a Go program's ([`GoStormFigures`]: goroutines queued on a `sync.Mutex`
/// in the Go scheduler, out of the kernel's sight, by the runtime's own clock) and a JVM's
/// virtual threads' ([`VirtualStormFigures`]: a lock handed from one to the next through the
/// JVM's scheduler, by its own count) and a PostgreSQL server's ([`PgStormFigures`]: backends
/// queued on its heavyweight locks, by its own lock-wait sites). A storm said by any is the
/// finding, the kernel's first; a `possible` one only where none says storm. Last, virtual
/// threads counted but not dumped ([`VirtualRemountFigures`]): at most a `possible` storm.
pub fn lock_storm(f: &Facts, t: &Thresholds) -> Option<Finding> {
    let kernel = StormFigures::of(f, t).filter(|s| s.lock_storm || s.possible);
    let go = GoStormFigures::of(f, t).filter(|g| g.lock_storm || g.possible);
    let virtual_threads = VirtualStormFigures::of(f, t).filter(|v| v.lock_storm || v.possible);
    let postgres = PgStormFigures::of(f, t).filter(|p| p.lock_storm || p.possible);
    let kernel_storm = kernel.as_ref().is_some_and(|k| k.lock_storm);
    if !kernel_storm {
        // A storm the runtime's own figures say, before a possible one of the kernel's.
        if go.as_ref().is_some_and(|g| g.lock_storm) {
            return gostorm::go_lock_storm(f, t);
        }
        if virtual_threads.as_ref().is_some_and(|v| v.lock_storm) {
            return vtstorm::virtual_lock_storm(f, t);
        }
        if postgres.as_ref().is_some_and(|p| p.lock_storm) {
            return pgstorm::postgres_lock_storm(f, t);
        }
    }
    match kernel {
        Some(k) => storm::kernel_lock_storm(f, t, k),
        None if go.is_some() => gostorm::go_lock_storm(f, t),
        None if virtual_threads.is_some() => vtstorm::virtual_lock_storm(f, t),
        None => {
            pgstorm::postgres_lock_storm(f, t).or_else(|| vtstorm::unread_virtual_lock_storm(f, t))
        }
    }
}

fn limits_evidence(f: &Facts, e: &mut BTreeMap<&'static str, f64>) {
    e.insert("allowed_cpus", f.allowed_cpus());
    e.insert("host_cpus", f64::from(f.host_cpus));
    if let Some(c) = f.cpuset_cpus {
        e.insert("cpuset_cpus", f64::from(c));
    }
    if let Some(q) = f.quota_cores {
        e.insert("cpu_quota_cores", q);
    }
    if let Some(a) = f.binding_ancestor_quota() {
        e.insert("ancestor_cpu_quota_cores", a.cores);
    }
    if let Some(n) = f.threads {
        e.insert("threads", n as f64);
    }
}

/// CFS throttling that stalls the container.
///
/// Judged on the share of the quota's enforcement periods in which the quota ran out (the
/// kernel's `nr_throttled` against `nr_periods`, both over the window): the share of time the
/// container stands stalled at the end of a period. The throttled time the kernel also reports
/// is summed over the CPUs whose run queues were throttled, so it is given as what it is, never
/// as a share of wall time.
pub fn cpu_throttling(f: &Facts, t: &Thresholds) -> Option<Finding> {
    let quota = f.quota_cores?;
    let share = f.throttled_share()?;
    if share < t.throttling_min_throttled_share {
        return None;
    }
    let severity = if share >= t.throttling_critical_throttled_share {
        Severity::Critical
    } else {
        Severity::Warning
    };
    let (periods, throttled) = (f.cpu.periods?, f.cpu.throttled_periods?);
    let mut e = BTreeMap::new();
    e.insert("throttled_period_share", share);
    e.insert("throttled_periods", throttled as f64);
    e.insert("periods", periods as f64);
    let held_back = f.cpu.throttled_seconds;
    if let Some(s) = held_back {
        e.insert("throttled_runqueue_seconds", s);
    }
    e.insert("oncpu_cores", f.oncpu_cores());
    e.insert("runnable_threads", f.runnable_threads());
    if let Some(w) = f.cpus_wanted() {
        e.insert("cpus_wanted", w);
    }
    limits_evidence(f, &mut e);
    let convoy = StormFigures::of(f, t).and_then(|s| s.quota_bound.map(|q| (s, q)));
    let mut summary = format!(
        "CPU throttling: its {quota:.2}-core quota ran out in {:.0}% of the periods it ran in \
         ({throttled} of {periods}){}, using {:.2} cores",
        100.0 * share,
        held_back
            .map(|s| format!(
                ", holding its threads back {s:.1} s in all (summed over the CPUs they were \
                 throttled on)"
            ))
            .unwrap_or_default(),
        f.oncpu_cores()
    );
    let mut recs = Vec::new();
    if let Some((s, q)) = convoy {
        e.insert("queued_threads_per_cpu", s.queued_threads_per_cpu);
        e.insert(
            "handoffs_per_cpu_second_used",
            s.handoffs_per_cpu_second_used,
        );
        summary.push_str(&format!(
            "; its threads take turns on a lock ({:.1} per CPU queued for it), one running at a \
             time: it wants {:.2} CPUs, so the quota binds before the lock does (its hand-offs, \
             {:.0} per CPU-second, cost little of it)",
            s.queued_threads_per_cpu, q.cpus_wanted, s.handoffs_per_cpu_second_used
        ));
        recs.push(format!(
            "Its threads take turns on one lock: a quota of up to ~{:.1} CPUs raises its \
             throughput, more does not (the lock then limits it); to go further, shorten the \
             critical section or split the lock (`stormwatch trace --json` names the call \
             sites).",
            q.cpus_wanted.max(1.0)
        ));
    }
    Some(Finding::new(
        Kind::CpuThrottling,
        severity,
        f.owner(),
        summary,
        e,
        recs.into_iter()
            .chain([
            format!(
                "Raise the CPU limit above {quota:.2} cores, or remove it and rely on requests: \
                 the quota is spent early in each period and the rest of the period stalls."
            ),
            format!(
                "Size thread pools to the quota ({} CPU(s)): many threads burn a quota in a \
                 fraction of the period.",
                quota.ceil().max(1.0) as u64
            ),
            ])
            .collect(),
    ))
}

/// Long run-queue waits: from the container's own oversubscription, or a noisy neighbour.
pub fn runqueue_saturation(f: &Facts, all: &[Facts], t: &Thresholds) -> Option<Finding> {
    let runq = &f.sched.runq;
    if runq.count < defaults::RUNQ_MIN_SAMPLES {
        return None;
    }
    let mean = f.runq_mean_seconds()?;
    let p99 = log2_quantile_ns(runq, 0.99).map(|ns| ns as f64 / 1e9)?;
    if mean < t.runq_min_mean_seconds && p99 < t.runq_min_p99_seconds {
        return None;
    }
    let severity = if mean >= t.runq_critical_mean_seconds {
        Severity::Critical
    } else {
        Severity::Warning
    };
    let allowed = f.allowed_cpus();
    let runnable = f.runnable_threads();
    let mut e = BTreeMap::new();
    e.insert("runqueue_mean_seconds", mean);
    e.insert("runqueue_p99_seconds", p99);
    e.insert("runnable_threads", runnable);
    e.insert("oncpu_cores", f.oncpu_cores());
    limits_evidence(f, &mut e);

    let blame = f.runq_blame.as_ref().filter(|b| b.wait_seconds > 0.0);
    if let Some(b) = blame {
        blame_evidence(b, &mut e);
    }
    // Who held the CPUs while these threads waited, where the switch program blamed the
    // waits: the other container that did most, when it did enough to name.
    let culprit = blame
        .and_then(RunqBlame::top_other)
        .filter(|(_, share)| *share >= t.runq_blame_name_share);
    // Its own threads made it wait: more runnable than it may use, or (blamed) most of the
    // wait behind its own threads, as when they are pinned to fewer CPUs than it may use.
    let own_blamed = blame.filter(|b| b.own_share() >= 0.5 && culprit.is_none());
    let mut context = Vec::new();
    let mut recs = Vec::new();
    let waits = format!(
        "run-queue saturation: threads wait {:.2} ms on average (p99 ≤ {:.1} ms) for a CPU",
        mean * 1e3,
        p99 * 1e3
    );
    let mut summary = if runnable > allowed {
        recs.push(format!(
            "The container keeps {runnable:.1} threads runnable on {allowed:.1} usable CPU(s): \
             give it more CPUs or run fewer busy threads."
        ));
        format!("{waits}; {runnable:.1} runnable threads on {allowed:.1} usable CPU(s)")
    } else if let Some(b) = own_blamed {
        recs.push(
            "Its threads queue behind one another on the CPUs they run on, fewer than the \
             container may use: check their CPU affinity (taskset, a runtime's or library's \
             pinning), or run fewer busy threads."
                .to_owned(),
        );
        format!(
            "{waits}, {:.0}% of it behind its own threads: {runnable:.1} runnable take turns on \
             fewer than the {allowed:.1} CPU(s) it may use",
            b.own_share() * 100.0
        )
    } else {
        format!("{waits} although the container keeps only {runnable:.1} runnable")
    };
    let own = runnable > allowed || own_blamed.is_some();
    if let Some((c, share)) = culprit {
        context.push(("runqueue_culprit", c.cgroup.clone()));
        summary.push_str(&format!(
            "; {} held the CPU for {:.0}% of the wait",
            c.cgroup,
            share * 100.0
        ));
        recs.push(format!(
            "Separate it from {}, which held the CPUs while this container's threads waited: \
             give one of them dedicated CPUs (cpuset / static CPU manager policy) or limit its \
             CPU.",
            c.cgroup
        ));
    } else if let Some(b) = blame.filter(|_| own_blamed.is_none()) {
        summary.push_str(&format!("; {}", blame_sentence(b)));
    } else if !own {
        // Not blamed (the switch program could not, or was not asked to): the neighbour that
        // used most CPU, named as such.
        let neighbour = all
            .iter()
            .filter(|o| o.cgroup_id != f.cgroup_id)
            .max_by(|a, b| a.oncpu_cores().total_cmp(&b.oncpu_cores()));
        let host_busy: f64 = all.iter().map(Facts::oncpu_cores).sum();
        if let Some(n) = neighbour.filter(|n| n.oncpu_cores() > 0.25 * f64::from(f.host_cpus)) {
            e.insert("neighbour_oncpu_cores", n.oncpu_cores());
            e.insert("host_oncpu_cores", host_busy);
            summary.push_str(&format!(
                "; noisy neighbour: {} uses {:.2} of the host's {} CPUs (by CPU use: the waits \
                 were not blamed)",
                n.cgroup,
                n.oncpu_cores(),
                f.host_cpus
            ));
            recs.push(format!(
                "Separate it from {}: give one of them dedicated CPUs (cpuset / static CPU \
                 manager policy) or limit the neighbour's CPU.",
                n.cgroup
            ));
        }
    }
    recs.push(
        "Check the host's CPU allocation: requests that sum above the node's CPUs, or \
         burstable pods without limits, produce exactly this."
            .to_owned(),
    );
    let mut finding = Finding::new(
        Kind::RunqueueSaturation,
        severity,
        f.owner(),
        summary,
        e,
        recs,
    );
    finding.context.extend(context);
    Some(finding)
}

/// The blame's figures as evidence: the seconds blamed and each holder's share of them.
fn blame_evidence(b: &RunqBlame, e: &mut BTreeMap<&'static str, f64>) {
    let share = |s: f64| s / b.wait_seconds;
    e.insert("runqueue_blamed_seconds", b.wait_seconds);
    e.insert("runqueue_own_share", share(b.own_seconds));
    e.insert(
        "runqueue_others_share",
        share(b.others.iter().map(|c| c.seconds).sum()),
    );
    e.insert("runqueue_kernel_share", share(b.kernel_seconds));
    e.insert("runqueue_idle_share", share(b.idle_seconds));
    e.insert("runqueue_stolen_share", share(b.stolen_seconds));
    e.insert("runqueue_unseen_share", share(b.unseen_seconds));
    if let Some((_, s)) = b.top_other() {
        e.insert("runqueue_top_culprit_share", s);
    }
}

/// What held the CPUs most while the threads waited, when no other container did enough to be
/// named: one clause.
fn blame_sentence(b: &RunqBlame) -> String {
    let others: f64 = b.others.iter().map(|c| c.seconds).sum();
    let parts = [
        (b.own_seconds, "its own threads"),
        (others, "other containers"),
        (b.kernel_seconds, "kernel threads"),
        (b.idle_seconds, "idle CPUs waking up"),
        (
            b.stolen_seconds,
            "time stolen by the hypervisor (or interrupts)",
        ),
        (b.unseen_seconds, "runs too far back to attribute"),
    ];
    let (secs, what) = parts
        .into_iter()
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .expect("six parts");
    format!(
        "{:.0}% of the wait was behind {what}",
        secs / b.wait_seconds * 100.0
    )
}

/// Far more threads runnable than CPUs allowed, before it becomes a storm.
pub fn thread_oversubscription(f: &Facts, t: &Thresholds) -> Option<Finding> {
    let allowed = f.allowed_cpus();
    let runnable = f.runnable_threads();
    if runnable < t.oversubscription_min_runnable_per_cpu * allowed {
        return None;
    }
    let mut e = BTreeMap::new();
    e.insert("runnable_threads", runnable);
    e.insert("runnable_per_cpu", runnable / allowed);
    if let Some(m) = f.runq_mean_seconds() {
        e.insert("runqueue_mean_seconds", m);
    }
    e.insert(
        "involuntary_switches_per_second",
        f.sched.involuntary_switches as f64 / f.window_seconds.max(1e-9),
    );
    limits_evidence(f, &mut e);
    Some(Finding::new(
        Kind::ThreadOversubscription,
        Severity::Warning,
        f.owner(),
        format!(
            "thread oversubscription: {runnable:.1} threads runnable on average on \
             {allowed:.1} usable CPU(s)"
        ),
        e,
        vec![
            format!(
                "Run about {} busy threads: size pools and runtimes to the CPUs really \
                 available (JVM -XX:ActiveProcessorCount, Go GOMAXPROCS, worker counts).",
                allowed.ceil().max(1.0) as u64
            ),
            lock_context(f, t),
        ],
    ))
}

/// What the futex figures say about a lock behind an oversubscription: measured, never a
/// suggestion to go and look for what the probes already show.
fn lock_context(f: &Facts, t: &Thresholds) -> String {
    if !f.futex_watched() {
        return "The futex probes were not attached in this window (they attach when the \
                scheduler figures look like a lock storm); `stormwatch trace` shows futex waits \
                now."
            .to_owned();
    }
    match StormFigures::of(f, t) {
        None => "No futex waits: the threads do not queue on a lock; they queue for the CPUs."
            .to_owned(),
        Some(s) if s.quota_bound.is_some() => format!(
            "Its threads take turns on a lock ({:.1} per CPU queued for it, {:.0} hand-offs/s \
             per CPU), one running at a time: the quota binds before the lock does \
             (cpu_throttling), so it is not a lock storm.",
            s.queued_threads_per_cpu, s.handoffs_per_cpu_second
        ),
        Some(s) => format!(
            "Not a lock storm: {:.0} futex hand-offs/s per CPU (a storm needs {:.0}) with {:.1} \
             threads per CPU queued for them (a storm needs {:.1}).",
            s.handoffs_per_cpu_second,
            s.required_handoffs_per_cpu_second,
            s.queued_threads_per_cpu,
            t.storm_min_queued_threads_per_cpu
        ),
    }
}

#[cfg(test)]
mod tests;
