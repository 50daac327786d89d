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

impl Finding {
    /// The one constructor of a finding, for the rules here and the network's: of `owner`
    /// (cgroup id, path), its context empty until the rule adds to it.
    pub(super) fn new(
        kind: Kind,
        severity: Severity,
        (cgroup_id, cgroup): (u64, String),
        summary: String,
        evidence: BTreeMap<&'static str, f64>,
        recommendations: Vec<String>,
    ) -> Self {
        Self {
            kind,
            severity,
            cgroup_id,
            cgroup,
            summary,
            evidence,
            context: BTreeMap::new(),
            recommendations,
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
    let mut found = Finding::new(
        Kind::LockStorm,
        severity,
        (f.cgroup_id, f.cgroup.clone()),
        summary,
        e,
        recs,
    );
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
    let mut found = Finding::new(
        Kind::RuntimeSizing,
        Severity::Warning,
        (f.cgroup_id, f.cgroup.clone()),
        summary,
        e,
        recs,
    );
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
    Some(Finding::new(
        Kind::CpuThrottling,
        severity,
        (f.cgroup_id, f.cgroup.clone()),
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
    Some(Finding::new(
        Kind::RunqueueSaturation,
        severity,
        (f.cgroup_id, f.cgroup.clone()),
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
    Some(Finding::new(
        Kind::ThreadOversubscription,
        Severity::Warning,
        (f.cgroup_id, f.cgroup.clone()),
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
mod tests {
    use super::*;
    use crate::diagnose::Handoffs;
    use crate::diagnose::{HostFacts, diagnose};
    use crate::identity::limits::CpuCounters;
    use stormwatch_common::{FutexStats, LockStats, Log2Histogram, SchedStats, lock_kind};

    const S: u64 = 1_000_000_000;

    /// A 10 s window of a container on a 2-CPU host.
    fn base(cgroup: &str) -> Facts {
        Facts {
            cgroup_id: cgroup.len() as u64,
            cgroup: cgroup.into(),
            window_seconds: 10.0,
            host_cpus: 2,
            cpuset_cpus: None,
            quota_cores: None,
            threads: Some(4),
            cpu: CpuCounters::default(),
            sched: SchedStats::ZERO,
            futex: FutexStats::ZERO,
            locks: LockStats::ZERO,
            remote_wakeup_share: None,
            cpus_used: None,
            futex_seconds: 10.0,
            host: None,
            handoffs: Handoffs::default(),
            runtimes: Vec::new(),
        }
    }

    fn runq(f: &mut Facts, samples: u64, each_ns: u64) {
        for _ in 0..samples {
            f.sched.runq.record(each_ns);
        }
    }

    /// 32 threads on 2 CPUs, mostly waiting on one mutex: what the mutex storm test runs.
    fn storm() -> Facts {
        let mut f = base("/storm");
        f.threads = Some(32);
        f.sched.oncpu_ns = 19 * S;
        f.sched.voluntary_switches = 400_000;
        f.sched.involuntary_switches = 20_000;
        f.sched.migrations = 30_000;
        f.sched.offcpu_ns = 250 * S;
        runq(&mut f, 1000, 5_000_000); // 5 s queued for a CPU: 1.2 runnable per CPU
        for _ in 0..1000 {
            f.futex.wait.record(240_000_000); // 240 s of waiting in 10 s: 24 threads
        }
        f.futex.wait.count = 300_000;
        // 290,000 of them ended in a wake: 14,500 hand-offs/s per CPU, 11.5 threads per CPU
        // queued for them.
        f.handoffs.lock_waits = 290_000;
        f.handoffs.lock_wait_ns = 230 * S;
        f.locks.count[lock_kind::SPIN] = 50_000;
        f.locks.wait_ns[lock_kind::SPIN] = S / 2;
        f
    }

    /// 32 CPU-bound threads on 2 CPUs, no lock.
    fn cpu_bound() -> Facts {
        let mut f = base("/spin");
        f.threads = Some(32);
        f.sched.oncpu_ns = 20 * S;
        f.sched.involuntary_switches = 20_000;
        runq(&mut f, 20_000, 14_000_000); // 280 s queued: ~28 waiting
        f
    }

    /// Two threads ping-ponging over a pipe: a very high switch rate, no futex.
    fn ping_pong() -> Facts {
        let mut f = base("/pingpong");
        f.threads = Some(2);
        f.sched.oncpu_ns = 15 * S;
        f.sched.voluntary_switches = 3_000_000;
        runq(&mut f, 3_000_000, 3_000);
        f
    }

    fn kinds(fs: &[Finding]) -> Vec<Kind> {
        fs.iter().map(|f| f.kind).collect()
    }

    #[test]
    fn a_mutex_storm_is_a_lock_storm_with_pinning_advice() {
        let t = Thresholds::default();
        let f = lock_storm(&storm(), &t).expect("storm");
        assert_eq!(f.severity, Severity::Critical);
        assert!(f.evidence["futex_wait_share"] > 0.7);
        assert_eq!(f.evidence["handoffs_per_cpu_second"], 14_500.0);
        assert_eq!(f.evidence["queued_threads_per_cpu"], 11.5);
        assert!(
            !f.summary.contains("convoy"),
            "saturated CPUs: {}",
            f.summary
        );
        assert_eq!(f.evidence["threads"], 32.0);
        assert_eq!(f.evidence["allowed_cpus"], 2.0);
        assert!(f.recommendations[0].contains("Pin"), "migrations are high");
        assert!(
            f.recommendations
                .iter()
                .any(|r| r.contains("ActiveProcessorCount=2"))
        );
        assert!(f.recommendations.iter().any(|r| r.starts_with("Caveat")));
        assert!(f.summary.contains("32 threads"));
    }

    /// The storm of the issue: a Java service with 2,000 threads (pools sized from the node)
    /// in a container with a 4-core quota, on a 56-vCPU node; `host` says what is under it.
    fn node_sized_storm(host: Option<HostFacts>, host_cpus: u32) -> Facts {
        let mut f = base("/kubepods/java");
        f.host_cpus = host_cpus;
        f.quota_cores = Some(4.0);
        f.threads = Some(2000);
        f.sched.oncpu_ns = 39 * S;
        f.sched.voluntary_switches = 400_000;
        f.sched.migrations = 1_000;
        runq(&mut f, 1000, 50_000);
        for _ in 0..1000 {
            f.futex.wait.record(16 * S); // 16,000 s of waiting in 10 s: 1,600 threads
        }
        f.futex.wait.count = 400_000;
        f.handoffs.lock_waits = 390_000;
        f.handoffs.lock_wait_ns = 15_000 * S;
        f.sched.offcpu_ns = 17_000 * S;
        f.remote_wakeup_share = Some(0.85);
        f.cpus_used = Some(host_cpus);
        f.host = host;
        f
    }

    fn kvm(steal_share: f64) -> Option<HostFacts> {
        Some(HostFacts {
            hypervisor: Some("kvm".into()),
            steal_share: Some(steal_share),
        })
    }

    #[test]
    fn the_vm_storm_of_the_issue_is_explained() {
        let f = lock_storm(&node_sized_storm(kvm(0.02), 56), &Thresholds::default()).unwrap();
        let s = &f.summary;
        for want in [
            "lock storm: 2000 threads on 4.0 usable CPU(s)",
            "; 85% of its wake-ups come from another CPU, an inter-processor interrupt each, \
             usually a VM exit in this kvm guest",
            "; its threads ran on 56 CPUs, more than the 4.0 it may use at once",
            "; 2000 threads for the node's 56 CPUs (35.7 per node CPU) but 4.0 usable: its pools \
             look sized from the node's CPU count, not the container's",
        ] {
            assert!(s.contains(want), "missing {want:?} in {s:?}");
        }
        assert!(
            !s.contains("steal"),
            "2% steal is not worth a sentence: {s}"
        );
        let pin = &f.recommendations[0];
        assert!(
            pin.starts_with("Pin the container to 4 dedicated CPU(s): 85% of its wake-ups")
                && pin.contains("ran on 56 CPUs")
                && pin.contains("(usually a VM exit in this kvm guest)")
                && pin.contains("static CPU manager policy")
                && pin.contains("Guaranteed"),
            "{pin}"
        );
        let sizing = f
            .recommendations
            .iter()
            .find(|r| r.starts_with("Size the runtimes"))
            .expect("node sizing advice");
        for flag in [
            "not the node's 56",
            "-XX:ActiveProcessorCount=4",
            "-XX:ParallelGCThreads=4",
            "-Djava.util.concurrent.ForkJoinPool.common.parallelism=4",
            "GOMAXPROCS=4",
            "automaxprocs",
        ] {
            assert!(sizing.contains(flag), "missing {flag:?} in {sizing}");
        }
        assert!(!f.recommendations.iter().any(|r| r.contains("(steal)")));
        assert_eq!(f.evidence["remote_wakeup_share"], 0.85);
        assert_eq!(f.evidence["cpus_used"], 56.0);
        assert_eq!(f.evidence["host_cpus"], 56.0);
        assert_eq!(f.evidence["threads_per_host_cpu"], 2000.0 / 56.0);
        assert_eq!(f.evidence["steal_share"], 0.02);
        assert_eq!(f.evidence["allowed_cpus"], 4.0);
        assert_eq!(f.context["hypervisor"], "kvm");
    }

    #[test]
    fn on_bare_metal_a_hand_off_is_an_interrupt_not_a_vm_exit() {
        let metal = Some(HostFacts {
            hypervisor: None,
            steal_share: Some(0.0),
        });
        let f = lock_storm(&node_sized_storm(metal, 24), &Thresholds::default()).unwrap();
        assert!(
            f.summary.contains(
                "85% of its wake-ups come from another CPU, an inter-processor interrupt each;"
            ),
            "{}",
            f.summary
        );
        assert!(!f.summary.contains("VM exit"), "{}", f.summary);
        assert!(!f.recommendations.iter().any(|r| r.contains("VM exit")));
        assert!(f.recommendations[0].starts_with("Pin the container to 4 dedicated CPU(s)"));
        // 24 CPUs is 6 times the 4 allowed: still pools sized from the node.
        assert!(
            f.summary
                .contains("for the node's 24 CPUs (83.3 per node CPU)")
        );
        assert_eq!(f.context["hypervisor"], "none");
        assert_eq!(f.evidence["steal_share"], 0.0);
    }

    #[test]
    fn a_pinned_kvm_guest_with_steal_is_told_about_steal_not_spread() {
        // 32 threads pinned to 4 of 8 vCPUs: few remote wake-ups, no spread, pools not sized
        // from the node (8 < 4 x 4), but the hypervisor steals 8%.
        let mut f = storm();
        f.host_cpus = 8;
        f.cpuset_cpus = Some(4);
        f.sched.oncpu_ns = 38 * S;
        f.sched.voluntary_switches = 800_000;
        f.futex.wait.count = 600_000;
        f.sched.migrations = 0;
        f.remote_wakeup_share = Some(0.1);
        f.cpus_used = Some(4);
        f.host = kvm(0.08);
        let found = lock_storm(&f, &Thresholds::default()).unwrap();
        let s = &found.summary;
        assert!(
            s.contains("; 10% of its wake-ups come from another CPU; its threads ran on 4 CPUs;"),
            "{s}"
        );
        assert!(!s.contains("interrupt") && !s.contains("VM exit"), "{s}");
        assert!(!s.contains("more than the"), "{s}");
        assert!(!s.contains("sized from the node"), "{s}");
        assert!(
            s.ends_with("; the hypervisor took 8% of the host's CPU time (steal)"),
            "{s}"
        );
        assert!(!found.recommendations[0].starts_with("Pin"));
        assert!(
            found
                .recommendations
                .iter()
                .any(|r| r.starts_with("The hypervisor took 8%"))
        );
        assert!(
            found
                .recommendations
                .iter()
                .any(|r| r.starts_with("Size thread pools"))
        );
        assert_eq!(found.context["hypervisor"], "kvm");
    }

    #[test]
    fn without_the_figures_the_explanation_is_left_out() {
        let f = lock_storm(&node_sized_storm(None, 56), &Thresholds::default());
        let mut unknown = node_sized_storm(None, 56);
        unknown.remote_wakeup_share = None;
        unknown.cpus_used = None;
        let g = lock_storm(&unknown, &Thresholds::default()).unwrap();
        for s in [&f.unwrap().summary, &g.summary] {
            assert!(!s.contains("VM exit") && !s.contains("steal"), "{s}");
        }
        assert!(!g.summary.contains("wake-ups") && !g.summary.contains("ran on"));
        assert!(!g.recommendations[0].starts_with("Pin the container to 4 dedicated"));
        for absent in ["remote_wakeup_share", "cpus_used", "steal_share"] {
            assert!(!g.evidence.contains_key(absent), "{absent}");
        }
        assert!(g.context.is_empty());
        // Threads per node CPU and the node sizing need only the thread count and the CPUs.
        assert!(g.summary.contains("pools look sized from the node"));
        // An unknown hypervisor still pays a VM exit per interrupt.
        let mut guest = node_sized_storm(None, 56);
        guest.host = Some(HostFacts {
            hypervisor: Some("unknown".into()),
            steal_share: None,
        });
        let h = lock_storm(&guest, &Thresholds::default()).unwrap();
        assert!(
            h.summary.contains("usually a VM exit in this guest"),
            "{}",
            h.summary
        );
        assert!(!h.evidence.contains_key("steal_share"));
    }

    /// The same kernel figures, but every hand-off made by a runtime's own parked threads (a Go
    /// program's Ms) or to workers that only wait: no lock's queue, no storm. A Go runtime sized
    /// above the CPUs is named instead, with its flag.
    #[test]
    fn hand_offs_of_work_are_not_a_lock() {
        use crate::identity::runtime::{CpuSetting, ProcessRuntime, Runtime};
        let t = Thresholds::default();
        let lock = storm();
        let mut go = storm();
        go.handoffs.runtime_waits = go.handoffs.lock_waits;
        go.handoffs.runtime_wait_ns = go.handoffs.lock_wait_ns;
        go.handoffs.lock_waits = 0;
        go.handoffs.lock_wait_ns = 0;
        assert!(lock_storm(&lock, &t).is_some());
        assert!(lock_storm(&go, &t).is_none(), "a runtime's hand-offs");
        assert!(
            runtime_sizing(&go, &t).is_none(),
            "no runtime known to be sized wrong"
        );
        go.runtimes = vec![ProcessRuntime {
            tgid: 42,
            comm: "server".into(),
            runtime: Runtime::Go {
                version: Some("go1.26.8".into()),
            },
            cpus: Some(CpuSetting {
                name: "GOMAXPROCS",
                value: 16,
                source: "environment",
            }),
            gc_threads: None,
            threads: Some(20),
        }];
        let found = runtime_sizing(&go, &t).expect("sized for 16 CPUs on 2");
        assert!(
            found
                .summary
                .contains("GOMAXPROCS=16 (from its environment)")
                && found.summary.contains("14500 times/s per CPU"),
            "{}",
            found.summary
        );
        assert!(found.recommendations[0].contains("Set GOMAXPROCS=2"));
        let mut right = go.clone();
        right.runtimes[0].cpus.as_mut().unwrap().value = 2;
        assert!(runtime_sizing(&right, &t).is_none(), "sized to the CPUs");
        let mut pool = storm();
        pool.handoffs.waiter_only_waits = pool.handoffs.lock_waits;
        pool.handoffs.waiter_only_wait_ns = pool.handoffs.lock_wait_ns;
        pool.handoffs.lock_waits = 0;
        pool.handoffs.lock_wait_ns = 0;
        let s = StormFigures::of(&pool, &t).unwrap();
        assert!(!s.lock_storm && s.waiter_only_handoffs_per_cpu_second > 14_000.0);
    }

    #[test]
    fn each_storm_condition_is_required() {
        let t = Thresholds::default();
        let mut few_threads = storm();
        few_threads.threads = Some(6);
        assert!(lock_storm(&few_threads, &t).is_none(), "3 threads per CPU");
        let mut slow = storm();
        slow.handoffs.lock_waits = 1000; // 50 hand-offs/s per CPU
        assert!(lock_storm(&slow, &t).is_none(), "slow hand-offs");
        let mut short_queue = storm();
        short_queue.handoffs.lock_wait_ns = 20 * S; // 1 thread per CPU queued
        assert!(lock_storm(&short_queue, &t).is_none(), "short queue");
        let mut io_bound = storm();
        io_bound.sched.offcpu_ns = 1000 * S; // blocked mostly outside futexes
        assert!(lock_storm(&io_bound, &t).is_none(), "I/O-bound");
        // Idle CPUs, threads parked on the queue, woken at the rate work arrives: not a storm;
        // at the rate of a convoy, one.
        let mut pool = storm();
        pool.sched.oncpu_ns = 2 * S;
        pool.sched.runq = Log2Histogram::ZERO;
        pool.handoffs.lock_waits = 10_000; // 500/s per CPU
        assert!(lock_storm(&pool, &t).is_none(), "a pool waiting for work");
        let mut convoy = pool.clone();
        convoy.handoffs.lock_waits = 80_000; // 4,000/s per CPU
        let found = lock_storm(&convoy, &t).expect("a convoy");
        assert!(found.summary.contains("convoy"), "{}", found.summary);
        assert_eq!(found.evidence["required_handoffs_per_cpu_second"], 1000.0);
        let mut polling = storm();
        polling.futex.timeouts = 200_000; // parked with timeouts, not queued on a lock
        assert!(lock_storm(&polling, &t).is_none());
        let mut unknown = storm();
        unknown.threads = None;
        assert!(
            lock_storm(&unknown, &t).is_none(),
            "no thread count, no verdict"
        );
        let mut pinned_low = storm();
        pinned_low.sched.migrations = 0;
        let f = lock_storm(&pinned_low, &t).unwrap();
        assert!(!f.recommendations[0].contains("Pin"));
    }

    #[test]
    fn cpu_bound_threads_are_not_a_storm_but_saturation() {
        let all = [cpu_bound()];
        let found = diagnose(&all, &Thresholds::default());
        assert_eq!(
            kinds(&found),
            [Kind::RunqueueSaturation, Kind::ThreadOversubscription]
        );
        assert_eq!(found[0].severity, Severity::Critical);
        assert!(found[0].summary.contains("runnable threads"));
    }

    #[test]
    fn ping_pong_is_not_a_lock_storm() {
        let found = diagnose(&[ping_pong()], &Thresholds::default());
        assert!(!kinds(&found).contains(&Kind::LockStorm), "{found:?}");
    }

    #[test]
    fn a_storm_is_not_also_reported_as_oversubscription() {
        let mut f = storm();
        f.sched.oncpu_ns = 20 * S;
        runq(&mut f, 10_000, 10_000_000);
        let found = diagnose(&[f], &Thresholds::default());
        assert!(kinds(&found).contains(&Kind::LockStorm));
        assert!(!kinds(&found).contains(&Kind::ThreadOversubscription));
    }

    /// The seed's shape inside a quota: the storm and the throttling both found, the storm's
    /// summary tying them, advice sized to the quota, and no oversubscription finding telling
    /// the user to go and watch futexes.
    #[test]
    fn a_storm_inside_a_quota_is_also_throttling_and_says_so() {
        let mut f = storm();
        f.quota_cores = Some(0.5);
        f.sched.oncpu_ns = 5 * S;
        f.cpu.periods = Some(100);
        f.cpu.throttled_periods = Some(75);
        f.cpu.throttled_seconds = Some(7.5);
        let found = check_all(&f, std::slice::from_ref(&f), &Thresholds::default());
        assert_eq!(
            kinds(&found),
            [
                Kind::LockStorm,
                Kind::CpuThrottling,
                Kind::RunqueueSaturation
            ],
            "{found:?}"
        );
        let storm = &found[0];
        assert!(
            storm.summary.contains("0.50-CPU quota")
                && storm.summary.contains("throttled in 75% of its periods")
                && storm
                    .summary
                    .contains("the quota limits its throughput first"),
            "{}",
            storm.summary
        );
        assert_eq!(storm.evidence["throttled_period_share"], 0.75);
        assert_eq!(storm.evidence["quota_used_share"], 1.0);
        // A convoy in the same quota, leaving most of it unused: the lock comes first.
        let mut convoy = f.clone();
        convoy.sched.oncpu_ns = S;
        let storm = lock_storm(&convoy, &Thresholds::default()).expect("still a storm");
        assert!(
            storm
                .summary
                .contains("the lock limits its throughput first: 80% of the quota"),
            "{}",
            storm.summary
        );
        for flag in ["ActiveProcessorCount=1", "GOMAXPROCS=1"] {
            assert!(
                storm.recommendations.iter().any(|r| r.contains(flag)),
                "{flag}: {:?}",
                storm.recommendations
            );
        }
        assert!(
            !found
                .iter()
                .flat_map(|f| &f.recommendations)
                .any(|r| r.contains("watch futex")),
            "{found:?}"
        );
    }

    /// The futex tier's trigger: the storm's scheduler side, in both regimes; not an idle
    /// pool's occasional wake-ups, nor a pool waking at a queue's modest rate on idle CPUs.
    #[test]
    fn storm_candidates_come_from_scheduler_figures_alone() {
        let t = Thresholds::default();
        let mut f = storm();
        f.futex = FutexStats::ZERO;
        f.futex_seconds = 0.0;
        assert!(lock_storm_candidate(&f, &t), "a saturated storm");
        let mut convoy = f.clone();
        convoy.sched.oncpu_ns = 2 * S;
        convoy.sched.runq = Log2Histogram::ZERO;
        assert!(
            lock_storm_candidate(&convoy, &t),
            "400,000 switches in 10 s: a convoy"
        );
        let mut queue = convoy.clone();
        queue.sched.voluntary_switches = 10_000; // 500/s per CPU on idle CPUs
        assert!(
            !lock_storm_candidate(&queue, &t),
            "a queue at a modest rate"
        );
        let mut idle = f.clone();
        idle.sched.offcpu_ns = 10 * S; // 0.5 threads per CPU off the CPU and woken again
        assert!(!lock_storm_candidate(&idle, &t), "few threads waking");
        let mut few = f;
        few.threads = Some(6);
        assert!(!lock_storm_candidate(&few, &t), "3 threads per CPU");
    }

    #[test]
    fn oversubscription_says_what_the_futex_figures_show() {
        let t = Thresholds::default();
        let mut f = cpu_bound();
        let rec = |f: &Facts| thread_oversubscription(f, &t).unwrap().recommendations[1].clone();
        assert!(rec(&f).starts_with("No futex waits"), "{}", rec(&f));
        f.futex.wait.count = 100;
        f.handoffs.lock_waits = 100;
        f.handoffs.lock_wait_ns = S;
        assert!(
            rec(&f).starts_with("Not a lock storm: 5 futex hand-offs/s per CPU"),
            "{}",
            rec(&f)
        );
        f.futex_seconds = 0.0;
        assert!(rec(&f).contains("not attached"), "{}", rec(&f));
    }

    #[test]
    fn throttling_needs_a_quota_and_stalls() {
        let t = Thresholds::default();
        let mut f = base("/limited");
        f.quota_cores = Some(0.5);
        f.cpu.periods = Some(100);
        f.cpu.throttled_periods = Some(100);
        f.cpu.throttled_seconds = Some(8.6);
        f.sched.oncpu_ns = 5 * S;
        let found = cpu_throttling(&f, &t).unwrap();
        assert_eq!(found.severity, Severity::Critical);
        // Every period throttled is 100%, whatever the throttled time summed over CPUs.
        assert_eq!(found.evidence["throttled_period_share"], 1.0);
        assert_eq!(found.evidence["throttled_runqueue_seconds"], 8.6);
        assert!(
            found
                .summary
                .contains("ran out in 100% of the periods it ran in (100 of 100)"),
            "{}",
            found.summary
        );
        assert_eq!(found.evidence["allowed_cpus"], 0.5);
        f.cpu.throttled_periods = Some(4);
        assert!(cpu_throttling(&f, &t).is_none(), "4% of the periods");
        f.cpu.throttled_periods = Some(10);
        assert_eq!(cpu_throttling(&f, &t).unwrap().severity, Severity::Warning);
        f.quota_cores = None;
        f.cpu.throttled_periods = Some(100);
        assert!(cpu_throttling(&f, &t).is_none());
    }

    #[test]
    fn saturation_names_the_noisy_neighbour() {
        let mut victim = base("/victim");
        victim.threads = Some(1);
        victim.sched.oncpu_ns = S / 10;
        runq(&mut victim, 500, 5_000_000);
        let mut hog = base("/hog");
        hog.sched.oncpu_ns = 19 * S;
        let found =
            runqueue_saturation(&victim, &[victim.clone(), hog], &Thresholds::default()).unwrap();
        assert!(
            found.summary.contains("noisy neighbour: /hog"),
            "{}",
            found.summary
        );
        assert_eq!(found.evidence["neighbour_oncpu_cores"], 1.9);
    }

    #[test]
    fn quiet_containers_have_no_findings() {
        let mut idle = base("/idle");
        idle.threads = Some(200);
        idle.sched.oncpu_ns = S / 100;
        idle.sched.voluntary_switches = 2000;
        runq(&mut idle, 2000, 20_000);
        for _ in 0..2000 {
            idle.futex.wait.record(S); // parked pool: long waits, few of them
        }
        assert!(diagnose(&[idle], &Thresholds::default()).is_empty());
    }

    #[test]
    fn thresholds_come_from_config_by_name() {
        let t: Thresholds = serde_json::from_str(r#"{"storm_min_threads_per_cpu": 8.0}"#).unwrap();
        assert_eq!(t.storm_min_threads_per_cpu, 8.0);
        assert_eq!(t.runq_min_mean_seconds, defaults::RUNQ_MIN_MEAN_SECONDS);
        let err = serde_json::from_str::<Thresholds>(r#"{"storm_min_thread": 8.0}"#).unwrap_err();
        assert!(err.to_string().contains("storm_min_thread"));
    }

    #[test]
    fn allowed_cpus_is_the_tightest_bound() {
        let mut f = base("/x");
        f.host_cpus = 56;
        assert_eq!(f.allowed_cpus(), 56.0);
        f.cpuset_cpus = Some(24);
        assert_eq!(f.allowed_cpus(), 24.0);
        f.quota_cores = Some(4.5);
        assert_eq!(f.allowed_cpus(), 4.5);
    }
}
