//! The rules. Each is a pure function of one container's [`Facts`] (and, for naming a noisy
//! neighbour, the host's), returning a finding or nothing.

use std::collections::BTreeMap;

use super::{Facts, Finding, Kind, Severity, Thresholds};
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
    /// Hand-offs per second per allowed CPU when the CPUs are not saturated: a convoy. When
    /// every release wakes a parked waiter, the CPUs go idle while the lock is passed through
    /// the kernel, so busy CPUs cannot be required — but idle CPUs with parked threads are
    /// also what a pool waiting for work looks like. What tells them apart is the rate: a
    /// convoy hands the lock on as fast as the kernel can wake the next waiter (corpus:
    /// futex lock-pi 3,900, a fair ReentrantLock 22,900 per CPU), a queue at the rate work
    /// arrives (corpus: 250 per CPU for 500 tasks/s).
    pub const STORM_MIN_CONVOY_HANDOFFS_PER_CPU_SECOND: f64 = 1000.0;
    /// The container keeps at least its allowed CPUs' worth of threads running or runnable
    /// (on-CPU time plus run-queue wait per second, per allowed CPU): it would use more CPU
    /// than it may, so a lock taken even a hundred times a second per CPU stalls work. Chosen
    /// over on-CPU time alone because a storm throttled by its quota, or sharing its CPUs with
    /// a neighbour, is saturated with little CPU time of its own.
    pub const STORM_SATURATED_RUNNABLE_PER_CPU: f64 = 1.0;
    /// At most half of the waits may end in a timeout: threads parked with a timeout (idle
    /// pools polling for work) time out; threads queued on a lock are woken by its release.
    pub const STORM_MAX_TIMEOUT_SHARE: f64 = 0.5;
    /// Eight threads queued per CPU: the service mostly queues on its lock.
    pub const STORM_CRITICAL_QUEUED_THREADS_PER_CPU: f64 = 8.0;
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
    /// p99 of 20 ms: a request served by such a wake-up misses typical latency budgets.
    pub const RUNQ_MIN_P99_SECONDS: f64 = 0.020;
    /// Mean of 10 ms: more than a scheduler slice; threads wait longer than they run.
    pub const RUNQ_CRITICAL_MEAN_SECONDS: f64 = 0.010;
    /// Twice as many threads runnable on average as CPUs allowed: half of them always wait.
    pub const OVERSUBSCRIPTION_MIN_RUNNABLE_PER_CPU: f64 = 2.0;
    /// Run-queue samples a window needs before its latency is judged.
    pub const RUNQ_MIN_SAMPLES: u64 = 100;
}

/// Runs every rule on one container.
pub fn check_all(f: &Facts, all: &[Facts], t: &Thresholds) -> Vec<Finding> {
    let mut out = Vec::new();
    let storm = lock_storm(f, t);
    let is_storm = storm.is_some();
    out.extend(storm);
    out.extend(cpu_throttling(f, t));
    out.extend(runtime_sizing(f, t));
    out.extend(runqueue_saturation(f, all, t));
    // Oversubscription is the early warning; once it is a storm, the storm says it all.
    if !is_storm {
        out.extend(thread_oversubscription(f, t));
    }
    out
}

fn finding(
    f: &Facts,
    kind: Kind,
    severity: Severity,
    summary: String,
    evidence: BTreeMap<&'static str, f64>,
    recommendations: Vec<String>,
) -> Finding {
    Finding {
        kind,
        severity,
        cgroup_id: f.cgroup_id,
        cgroup: f.cgroup.clone(),
        summary,
        evidence,
        context: BTreeMap::new(),
        recommendations,
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
    if let Some(n) = f.threads {
        e.insert("threads", n as f64);
    }
}

/// The figures the lock-storm rule judges, for every container with futex waits: with a
/// finding they are its evidence, without one they say why not (`diagnose --json` prints
/// them under `checked.lock_storm`).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct StormFigures {
    pub threads_per_cpu: f64,
    pub queued_threads_per_cpu: f64,
    pub handoffs_per_cpu_second: f64,
    /// Threads that both waited for hand-offs and made them: the lock's queue is theirs.
    pub handoff_threads: u32,
    /// Hand-offs of a runtime's own parked threads (Go's Ms, a JVM's service threads), per
    /// second per allowed CPU: not a lock's, so not counted above.
    pub runtime_handoffs_per_cpu_second: f64,
    /// Hand-offs to threads that woke no one (workers waiting for work), likewise.
    pub waiter_only_handoffs_per_cpu_second: f64,
    pub futex_blocked_share: f64,
    pub futex_timeout_share: f64,
    pub runnable_per_cpu: f64,
    /// The hand-off rate the container must reach: the saturated or the convoy threshold.
    pub required_handoffs_per_cpu_second: f64,
    pub lock_storm: bool,
}

impl StormFigures {
    /// `None` without a thread count or without futex waits (nothing to judge).
    pub fn of(f: &Facts, t: &Thresholds) -> Option<Self> {
        let threads = f.threads? as f64;
        if !f.futex_watched() || f.futex.wait.count == 0 {
            return None;
        }
        let allowed = f.allowed_cpus();
        let runnable_per_cpu = f.runnable_threads() / allowed;
        let required = if runnable_per_cpu >= t.storm_saturated_runnable_per_cpu {
            t.storm_min_handoffs_per_cpu_second
        } else {
            t.storm_min_convoy_handoffs_per_cpu_second
        };
        let mut s = Self {
            threads_per_cpu: threads / allowed,
            queued_threads_per_cpu: f.queued_threads() / allowed,
            handoffs_per_cpu_second: f.handoffs_per_second() / allowed,
            handoff_threads: f.handoffs.lock_threads,
            runtime_handoffs_per_cpu_second: f.runtime_handoffs_per_second() / allowed,
            waiter_only_handoffs_per_cpu_second: f
                .futex_per_second(f.handoffs.waiter_only_waits as f64)
                / allowed,
            futex_blocked_share: f.futex_blocked_share().unwrap_or(0.0),
            futex_timeout_share: f.futex.timeouts as f64 / f.futex.wait.count as f64,
            runnable_per_cpu,
            required_handoffs_per_cpu_second: required,
            lock_storm: false,
        };
        s.lock_storm = s.threads_per_cpu >= t.storm_min_threads_per_cpu
            && s.queued_threads_per_cpu >= t.storm_min_queued_threads_per_cpu
            && s.futex_blocked_share >= t.storm_min_futex_blocked_share
            && s.futex_timeout_share <= t.storm_max_timeout_share
            && s.handoffs_per_cpu_second >= required;
        Some(s)
    }
}

/// Whether a container's scheduler figures alone — what `sched_switch` sees, no futex probe —
/// show what a lock storm needs: the daemon attaches the futex probes for such a container
/// (`futex_probes = "on-demand"`). Each condition is implied by the storm rule's: as many
/// threads per CPU; at least as many threads per CPU off the CPU (blocked or queued for it) as
/// queued for hand-offs (a waiter is off the CPU until it runs again); and at least as many
/// voluntary switches per CPU as the hand-offs the rule requires (a waiter woken from a futex
/// wait blocked first) — the saturated threshold when the container keeps its CPUs saturated,
/// the convoy threshold otherwise, as the rule chooses. A busy I/O server with many threads can
/// still look like this (its switches are not futex hand-offs); then the futex probes attach
/// and the rule, with their figures, says it is not a storm.
pub fn lock_storm_candidate(f: &Facts, t: &Thresholds) -> bool {
    let Some(threads) = f.threads else {
        return false;
    };
    let allowed = f.allowed_cpus();
    let required = if f.runnable_threads() / allowed >= t.storm_saturated_runnable_per_cpu {
        t.storm_min_handoffs_per_cpu_second
    } else {
        t.storm_min_convoy_handoffs_per_cpu_second
    };
    threads as f64 / allowed >= t.storm_min_threads_per_cpu
        && f.off_cpu_threads() / allowed >= t.storm_min_queued_threads_per_cpu
        && f.voluntary_switches_per_cpu_second() >= required
}

/// A lock storm: threads serialized on futexes, handing the lock to one another through the
/// kernel far more often than the allowed CPUs can absorb. What the kernel says the threads
/// do, each condition required:
///
/// - far more threads than usable CPUs (`storm_min_threads_per_cpu`);
/// - many of them queued for a hand-off at any moment: the time in futex waits that *ended in
///   a wake*, per second and per allowed CPU (`storm_min_queued_threads_per_cpu`). Waits that
///   time out (idle pools on timers) or return EAGAIN at once do not count;
/// - only a lock's hand-offs count, here and in the rate below: the waits of threads that both
///   waited for hand-offs and made them (each waits for the lock, then wakes the next waiter as
///   it lets go). Not the waits of threads that only wait (workers of a pool waiting for work,
///   woken by a producer), nor those of threads a runtime parks itself and wakes for work: a
///   Go program's threads (its Ms: a goroutine blocked on a `sync.Mutex` is parked by the Go
///   scheduler and never reaches the kernel, so every futex hand-off of a Go program is its
///   scheduler's), and a JVM's named service threads (compiler, GC, reference handler, …) —
///   told by the process's runtime (its build info, `libjvm.so`) and the threads' names
///   ([`crate::identity::runtime`]);
/// - their time off the CPU goes to futex waits, not to I/O or sleeps
///   (`storm_min_futex_blocked_share`), and few waits time out (`storm_max_timeout_share`);
/// - the hand-offs are frequent: per allowed CPU, `storm_min_handoffs_per_cpu_second` when the
///   container keeps its CPUs saturated (running or queued for a CPU), or the far higher
///   `storm_min_convoy_handoffs_per_cpu_second` when its CPUs sit partly idle — a convoy,
///   where every release wakes a parked waiter, against a pool waiting for work at the rate
///   work arrives.
///
/// Not judged: the CPU busy share (a convoy leaves the CPUs idle, a storm in a quota is
/// throttled) and the futex wait share of wall time (throttling and run-queue waits dilute it).
/// Nor which futex words the waits are on: the Go runtime parks each M on a word of its own, so
/// a Go mutex storm reaches the kernel spread over as many words as Ms. The thresholds were
/// chosen from a corpus of real workloads on both sides (tests/tests/corpus.rs, tests/CORPUS.md).
pub fn lock_storm(f: &Facts, t: &Thresholds) -> Option<Finding> {
    let figures = StormFigures::of(f, t)?;
    if !figures.lock_storm {
        return None;
    }
    let threads = f.threads? as f64;
    let allowed = f.allowed_cpus();
    let share = f.futex_wait_share().unwrap_or(0.0);
    let timeout_share = figures.futex_timeout_share;
    let vcsw = f.voluntary_switches_per_cpu_second();
    let throttled = f
        .throttled_share()
        .filter(|s| *s >= t.throttling_min_throttled_share);
    let spin = f.spin_wait_per_second();
    let migrations_per_cpu = f.migrations_per_second() / allowed;
    let severity = if figures.queued_threads_per_cpu >= t.storm_critical_queued_threads_per_cpu
        || spin >= t.storm_significant_spin_wait
    {
        Severity::Critical
    } else {
        Severity::Warning
    };
    let mut e = BTreeMap::new();
    e.insert("queued_threads_per_cpu", figures.queued_threads_per_cpu);
    e.insert("handoffs_per_cpu_second", figures.handoffs_per_cpu_second);
    e.insert(
        "required_handoffs_per_cpu_second",
        figures.required_handoffs_per_cpu_second,
    );
    e.insert("futex_blocked_share", figures.futex_blocked_share);
    e.insert("runnable_per_cpu", figures.runnable_per_cpu);
    e.insert("futex_wait_share", share);
    e.insert("futex_waiting_threads", f.futex_waiting_threads());
    e.insert("futex_waits_per_second", f.futex_waits_per_second());
    e.insert("futex_timeout_share", timeout_share);
    if f.futex.wait.count > 0 {
        e.insert(
            "futex_mean_wait_seconds",
            f.futex.wait.sum_ns as f64 / 1e9 / f.futex.wait.count as f64,
        );
    }
    if let Some(p99) = log2_quantile_ns(&f.futex.wait, 0.99) {
        e.insert("futex_p99_wait_seconds", p99 as f64 / 1e9);
    }
    e.insert("voluntary_switches_per_cpu_second", vcsw);
    e.insert("runnable_threads", f.runnable_threads());
    e.insert("oncpu_cores", f.oncpu_cores());
    e.insert("kernel_spin_wait_seconds_per_second", spin);
    e.insert("migrations_per_second", f.migrations_per_second());
    limits_evidence(f, &mut e);
    let cost = HandOffCost::of(f, t, threads, allowed);
    cost.evidence(f, threads, &mut e);
    let n = allowed.ceil().max(1.0) as u64;

    let mut recs = Vec::new();
    if let Some(pin) = cost.pinning(n) {
        recs.push(pin);
    } else if migrations_per_cpu >= t.storm_high_migrations_per_second {
        recs.push(format!(
            "Pin the container to fewer, dedicated CPUs: threads move between CPUs {:.0} times \
             per second, and every lock hand-off then crosses caches. On Kubernetes use the \
             kubelet's static CPU manager policy (Guaranteed pod, integer CPU request); \
             elsewhere a cpuset.",
            f.migrations_per_second()
        ));
    }
    if let (Some(share), Some(q)) = (throttled, f.quota_cores) {
        recs.push(format!(
            "Size the runtimes to the quota, not the node: {threads:.0} threads take turns on \
             one lock inside a {q:.2}-CPU quota, and a thread throttled while it holds the lock \
             (its quota ran out in {:.0}% of its periods) stalls every waiter until the next period. \
             Raising the limit shortens the stalls; fewer threads end the queue.",
            100.0 * share
        ));
    }
    recs.push(if cost.node_sized || throttled.is_some() {
        node_sizing(threads, f.host_cpus, n)
    } else {
        format!(
            "Size thread pools and runtimes to the {allowed:.0} CPU(s) really available instead \
             of running {threads:.0} threads: JVM -XX:ActiveProcessorCount={n} and explicit \
             pool sizes; Go GOMAXPROCS={n}; fewer worker threads in thread-per-request servers."
        )
    });
    if spin >= t.storm_significant_spin_wait {
        recs.push(format!(
            "Kernel spinlock hand-offs cost {:.1}% of a CPU (the `_raw_spin_unlock_irqrestore` \
             signature in perf top): fewer CPUs contending for the same futex hash buckets and \
             run queues helps; see kernel_lock_sites in `stormwatch trace --json`.",
            100.0 * spin
        ));
    }
    if let Some(steal) = cost
        .steal_share
        .filter(|s| *s >= t.storm_significant_steal_share)
    {
        recs.push(format!(
            "The hypervisor took {:.0}% of the host's CPU time (steal): a vCPU descheduled while \
             its thread holds the lock stalls every waiter. Ask for vCPUs that are not \
             overcommitted (dedicated or pinned), or move to a less loaded host.",
            100.0 * steal
        ));
    }
    recs.push(
        "Caveat: pinning to fewer CPUs hurts runtimes that size their pools from the host's \
         CPU count (older JVMs, GOMAXPROCS before Go 1.25, many native thread pools): set the \
         CPU count explicitly when you pin."
            .to_owned(),
    );
    recs.push(
        "Name the contended lock: `stormwatch trace --json` lists the futex words these waits \
         are on, per process (hot_futexes); a JVM thread dump, a Go mutex profile or \
         `perf lock contention` names the code that takes it."
            .to_owned(),
    );
    let mut summary = format!(
        "lock storm: {threads:.0} threads on {allowed:.1} usable CPU(s) hand a lock to one \
         another through the kernel {:.0} times/s per CPU, with {:.1} threads per CPU queued \
         for it on average; {:.0}% of their time off the CPU is futex waits",
        figures.handoffs_per_cpu_second,
        figures.queued_threads_per_cpu,
        100.0 * figures.futex_blocked_share,
    );
    if figures.runnable_per_cpu < t.storm_saturated_runnable_per_cpu {
        summary.push_str(&format!(
            " — a convoy: the CPUs are {:.0}% busy while the lock is passed from one parked \
             thread to the next",
            100.0 * f.oncpu_cores() / allowed
        ));
    }
    if let (Some(share), Some(q)) = (throttled, f.quota_cores) {
        summary.push_str(&format!(
            "; inside a {q:.2}-CPU quota it is throttled in {:.0}% of its periods: {threads:.0} \
             threads sized for the node's {} CPUs against a fractional quota",
            100.0 * share,
            f.host_cpus
        ));
        e.insert("throttled_period_share", share);
        let used = f.oncpu_cores() / q;
        e.insert("quota_used_share", used);
        summary.push_str(&if used >= defaults::QUOTA_SPENT_SHARE {
            format!(
                "; the quota limits its throughput first: it spends {:.0}% of it, and the lock \
                 then decides how much of that is useful work",
                100.0 * used
            )
        } else {
            format!(
                "; the lock limits its throughput first: {:.0}% of the quota goes unused while \
                 its threads wait for the lock",
                100.0 * (1.0 - used)
            )
        });
    }
    cost.explain(f, threads, allowed, t, &mut summary);
    let mut found = finding(f, Kind::LockStorm, severity, summary, e, recs);
    if let Some(host) = &f.host {
        found.context.insert(
            "hypervisor",
            host.hypervisor.clone().unwrap_or_else(|| "none".to_owned()),
        );
    }
    Some(found)
}

/// Why each hand-off of a storm costs what it does: where the wake-ups come from, how far the
/// threads spread, the hypervisor under them, steal, and how the pools were sized. Each part
/// comes from measured figures only; an unknown figure leaves its part out.
struct HandOffCost<'a> {
    remote_share: Option<f64>,
    /// Most wake-ups come from another CPU.
    remote_high: bool,
    cpus_used: Option<u32>,
    /// The threads ran on more CPUs than the container may use at once.
    spread_high: bool,
    /// `Some(None)`: bare metal; `None`: the host is not known.
    hypervisor: Option<Option<&'a str>>,
    steal_share: Option<f64>,
    /// As many threads as the node has CPUs, on a node far larger than the container.
    node_sized: bool,
}

impl<'a> HandOffCost<'a> {
    fn of(f: &'a Facts, t: &Thresholds, threads: f64, allowed: f64) -> Self {
        let host_cpus = f64::from(f.host_cpus.max(1));
        Self {
            remote_share: f.remote_wakeup_share,
            remote_high: f
                .remote_wakeup_share
                .is_some_and(|r| r >= t.storm_high_remote_wakeup_share),
            cpus_used: f.cpus_used,
            spread_high: f.cpus_used.is_some_and(|c| f64::from(c) > allowed.ceil()),
            hypervisor: f.host.as_ref().map(|h| h.hypervisor.as_deref()),
            steal_share: f.host.as_ref().and_then(|h| h.steal_share),
            node_sized: threads >= host_cpus
                && host_cpus >= t.storm_node_sized_min_host_per_allowed_cpu * allowed,
        }
    }

    fn evidence(&self, f: &Facts, threads: f64, e: &mut BTreeMap<&'static str, f64>) {
        if let Some(r) = self.remote_share {
            e.insert("remote_wakeup_share", r);
        }
        if let Some(c) = self.cpus_used {
            e.insert("cpus_used", f64::from(c));
        }
        e.insert(
            "threads_per_host_cpu",
            threads / f64::from(f.host_cpus.max(1)),
        );
        if let Some(s) = self.steal_share {
            e.insert("steal_share", s);
        }
    }

    /// What an inter-processor interrupt costs here, for the sentences that name it.
    fn vm_exit(&self) -> Option<String> {
        match self.hypervisor? {
            Some("unknown") => Some("usually a VM exit in this guest".to_owned()),
            Some(h) => Some(format!("usually a VM exit in this {h} guest")),
            None => None,
        }
    }

    /// Appends the explanation to a storm's summary.
    fn explain(&self, f: &Facts, threads: f64, allowed: f64, t: &Thresholds, s: &mut String) {
        use std::fmt::Write as _;
        if let Some(r) = self.remote_share {
            let _ = write!(
                s,
                "; {:.0}% of its wake-ups come from another CPU",
                100.0 * r
            );
            if self.remote_high {
                s.push_str(", an inter-processor interrupt each");
                if let Some(exit) = self.vm_exit() {
                    let _ = write!(s, ", {exit}");
                }
            }
        }
        if let Some(c) = self.cpus_used {
            let _ = write!(
                s,
                "; its threads ran on {c} CPU{}",
                if c == 1 { "" } else { "s" }
            );
            if self.spread_high {
                let _ = write!(s, ", more than the {allowed:.1} it may use at once");
            }
        }
        if let Some(steal) = self
            .steal_share
            .filter(|s| *s >= t.storm_significant_steal_share)
        {
            let _ = write!(
                s,
                "; the hypervisor took {:.0}% of the host's CPU time (steal)",
                100.0 * steal
            );
        }
        if self.node_sized {
            let _ = write!(
                s,
                "; {threads:.0} threads for the node's {} CPUs ({:.1} per node CPU) but {allowed:.1} \
                 usable: its pools look sized from the node's CPU count, not the container's",
                f.host_cpus,
                threads / f64::from(f.host_cpus.max(1)),
            );
        }
    }

    /// Pinning, first of the recommendations when the hand-offs cross many CPUs.
    fn pinning(&self, n: u64) -> Option<String> {
        if !(self.remote_high && self.spread_high) {
            return None;
        }
        let remote = 100.0 * self.remote_share?;
        let used = self.cpus_used?;
        let exit = self
            .vm_exit()
            .map(|e| format!(" ({e})"))
            .unwrap_or_default();
        Some(format!(
            "Pin the container to {n} dedicated CPU(s): {remote:.0}% of its wake-ups cross CPUs \
             and its threads ran on {used} CPUs, so each lock hand-off pays an inter-processor \
             interrupt{exit}; pinned, the hand-offs stay within {n} CPU(s) that share caches. On \
             Kubernetes: the kubelet's static CPU manager policy with a Guaranteed pod (CPU \
             request = limit = {n}, an integer); elsewhere taskset -c or a cpuset."
        ))
    }
}

/// Sizing advice when the pools were sized from the node: the runtime flags that set the CPU
/// count each runtime sizes its pools from.
fn node_sizing(threads: f64, host_cpus: u32, n: u64) -> String {
    format!(
        "Size the runtimes to the container's {n} CPU(s), not the node's {host_cpus}: \
         {threads:.0} threads on a {host_cpus}-CPU node is what pools sized from the node look \
         like. JVM: -XX:ActiveProcessorCount={n} (GC and JIT threads and the common ForkJoinPool \
         follow it), and where flags or libraries set them, -XX:ParallelGCThreads={n} and \
         -Djava.util.concurrent.ForkJoinPool.common.parallelism={n}; Go: GOMAXPROCS={n} (or \
         go.uber.org/automaxprocs; Go 1.25 and later read the CPU limit); .NET: \
         DOTNET_PROCESSOR_COUNT={n}; OpenMP: OMP_NUM_THREADS={n}; then the application's own \
         pools (executors, request workers)."
    )
}

/// A runtime sized for more CPUs than the container may use, while that costs it: Go's
/// `GOMAXPROCS`, the JVM's active processor count (and the GC pool it sized from it), .NET's
/// processor count — each read from the process (its environment, command line, build info and
/// threads), never guessed. It costs the container when the runtime's scheduler hands work
/// between its parked threads often (`runtime_min_handoffs_per_cpu_second` per allowed CPU),
/// or when the container keeps its CPUs saturated: then more threads than CPUs only take turns.
pub fn runtime_sizing(f: &Facts, t: &Thresholds) -> Option<Finding> {
    let allowed = f.allowed_cpus();
    let n = allowed.ceil().max(1.0) as u32;
    let runtime_rate = f.runtime_handoffs_per_second() / allowed;
    let saturated = f.runnable_threads() / allowed >= t.storm_saturated_runnable_per_cpu;
    if !(saturated || runtime_rate >= t.runtime_min_handoffs_per_cpu_second) {
        return None;
    }
    let mut sized: Vec<String> = Vec::new();
    let mut recs: Vec<String> = Vec::new();
    let mut largest = 0u32;
    for p in &f.runtimes {
        let version = match &p.runtime {
            crate::identity::runtime::Runtime::Go { version } => version.clone(),
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
                    "{what} runs {} = {} (the CPUs it may run on: before Go 1.25 the runtime                      does not read the CPU limit)",
                    c.name, c.value
                ),
                source => format!("{what} runs {}={} (from its {source})", c.name, c.value),
            });
            recs.push(runtime_fix(&p.runtime, c.name, c.source, n));
        } else if let Some(gc) = p.gc_threads.filter(|g| *g > n) {
            largest = largest.max(gc);
            sized.push(format!(
                "{what} runs {gc} GC worker threads: it sized its pools from {gc} or more CPUs"
            ));
            recs.push(format!(
                "Give the JVM the container's CPU count: -XX:ActiveProcessorCount={n} (its GC,                  JIT and ForkJoin pools follow it), or -XX:ParallelGCThreads={n} and                  -XX:ConcGCThreads where they are set by hand; check that container support is                  on (-XX:+UseContainerSupport, the default since JDK 10)."
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
        "runtime sized for {largest} CPUs on {allowed:.1} usable: {}",
        sized.join("; ")
    );
    if runtime_rate > 0.0 {
        summary.push_str(&format!(
            "; its scheduler wakes parked threads {runtime_rate:.0} times/s per CPU to hand work              around (futex hand-offs of work, not of a lock)"
        ));
    }
    if saturated {
        summary.push_str("; the container keeps its CPUs saturated");
    }
    let mut found = finding(f, Kind::RuntimeSizing, Severity::Warning, summary, e, recs);
    found.context.insert(
        "runtimes",
        f.runtimes
            .iter()
            .map(|p| format!("{}:{}", p.tgid, runtime_label(&p.runtime)))
            .collect::<Vec<_>>()
            .join(","),
    );
    Some(found)
}

fn runtime_label(r: &crate::identity::runtime::Runtime) -> &'static str {
    use crate::identity::runtime::Runtime;
    match r {
        Runtime::Go { .. } => "Go",
        Runtime::Jvm => "JVM",
        Runtime::DotNet => ".NET",
        Runtime::Native => "native",
    }
}

fn runtime_fix(r: &crate::identity::runtime::Runtime, name: &str, source: &str, n: u32) -> String {
    use crate::identity::runtime::Runtime;
    match r {
        Runtime::Go { .. } if source == "environment" => format!(
            "Set GOMAXPROCS={n}, or unset it on Go 1.25 and later, which read the container's              CPU limit themselves (older: go.uber.org/automaxprocs): {name} above the CPUs it              may use only adds Ms that park and wake to pass goroutines around."
        ),
        Runtime::Go { .. } => format!(
            "Set GOMAXPROCS={n}, or build with Go 1.25 or later, which reads the container's CPU              limit (older: go.uber.org/automaxprocs)."
        ),
        Runtime::Jvm => format!(
            "Set -XX:ActiveProcessorCount={n} (or remove the flag: with container support the              JVM reads the CPU limit itself); its GC, JIT and ForkJoin pools follow it."
        ),
        Runtime::DotNet => format!(
            "Set DOTNET_PROCESSOR_COUNT={n}, or unset it: .NET reads the container's CPU limit              itself."
        ),
        Runtime::Native => format!("Size the program's pools to {n} CPU(s)."),
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
    limits_evidence(f, &mut e);
    Some(finding(
        f,
        Kind::CpuThrottling,
        severity,
        format!(
            "CPU throttling: its {quota:.2}-core quota ran out in {:.0}% of the periods it ran \
             in ({throttled} of {periods}){}, using {:.2} cores",
            100.0 * share,
            held_back
                .map(|s| format!(
                    ", holding its threads back {s:.1} s in all (summed over the CPUs they \
                     were throttled on)"
                ))
                .unwrap_or_default(),
            f.oncpu_cores()
        ),
        e,
        vec![
            format!(
                "Raise the CPU limit above {quota:.2} cores, or remove it and rely on requests: \
                 the quota is spent early in each period and the rest of the period stalls."
            ),
            format!(
                "Size thread pools to the quota ({} CPU(s)): many threads burn a quota in a \
                 fraction of the period.",
                quota.ceil().max(1.0) as u64
            ),
        ],
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

    let own = runnable > allowed;
    let neighbour = all
        .iter()
        .filter(|o| o.cgroup_id != f.cgroup_id)
        .max_by(|a, b| a.oncpu_cores().total_cmp(&b.oncpu_cores()));
    let host_busy: f64 = all.iter().map(Facts::oncpu_cores).sum();
    let mut recs = Vec::new();
    let summary = if own {
        recs.push(format!(
            "The container keeps {runnable:.1} threads runnable on {allowed:.1} usable CPU(s): \
             give it more CPUs or run fewer busy threads."
        ));
        format!(
            "run-queue saturation: threads wait {:.2} ms on average (p99 ≤ {:.1} ms) for a CPU; \
             {runnable:.1} runnable threads on {allowed:.1} usable CPU(s)",
            mean * 1e3,
            p99 * 1e3
        )
    } else {
        let mut s = format!(
            "run-queue saturation: threads wait {:.2} ms on average (p99 ≤ {:.1} ms) for a CPU \
             although the container keeps only {runnable:.1} runnable",
            mean * 1e3,
            p99 * 1e3
        );
        if let Some(n) = neighbour.filter(|n| n.oncpu_cores() > 0.25 * f64::from(f.host_cpus)) {
            e.insert("neighbour_oncpu_cores", n.oncpu_cores());
            e.insert("host_oncpu_cores", host_busy);
            s.push_str(&format!(
                "; noisy neighbour: {} uses {:.2} of the host's {} CPUs",
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
        s
    };
    recs.push(
        "Check the host's CPU allocation: requests that sum above the node's CPUs, or \
         burstable pods without limits, produce exactly this."
            .to_owned(),
    );
    Some(finding(
        f,
        Kind::RunqueueSaturation,
        severity,
        summary,
        e,
        recs,
    ))
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
    Some(finding(
        f,
        Kind::ThreadOversubscription,
        Severity::Warning,
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
