//! The lock-storm rule: its figures, the candidate test the daemon attaches the futex probes on,
//! the finding and why its hand-offs cost what they do.

use std::collections::BTreeMap;

use super::{Facts, Finding, Kind, Severity, Thresholds, defaults, limits_evidence};
use super::{
    handoff_cost::HandOffCost,
    lock_sites::{name_the_lock, sites_evidence, top_pair},
    node_advice::{PIN_FEWER_STEPS, PIN_STEPS, node_sizing, pin_on_this_node},
};
use crate::collect::log2_quantile_ns;
use crate::symbolize::handoffs::HandoffSites;

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
    /// Hand-offs of work, likewise: to threads that woke no one, and on shared words, to waits
    /// the thread did not hand on (a condition signalled by a producer).
    pub work_handoffs_per_cpu_second: f64,
    /// Threads judged by their part (waited and woke) because their process parks them on
    /// words of their own ([`crate::diagnose::Handoffs::own_word_threads`]).
    pub own_word_threads: u32,
    /// JVM thread dumps taken in the window ([`crate::identity::jvm`]): how many, the threads
    /// each found waiting for a lock and for work (means over the dumps), and the threads
    /// whose waits the dumps judged instead of their part.
    pub jvm_thread_dumps: u32,
    pub jvm_threads_waiting_for_a_lock: f64,
    pub jvm_threads_waiting_for_work: f64,
    pub dump_judged_threads: u32,
    pub futex_blocked_share: f64,
    pub futex_timeout_share: f64,
    pub runnable_per_cpu: f64,
    /// The hand-off rate the container must reach: the saturated or the convoy threshold.
    pub required_handoffs_per_cpu_second: f64,
    /// Inside a quota: the CPUs the container wanted ([`Facts::cpus_wanted`]).
    pub cpus_wanted: Option<f64>,
    /// The lock's hand-offs per second of CPU the container used.
    pub handoffs_per_cpu_second_used: f64,
    /// A convoy its spent quota binds before its lock does ([`QuotaBound`]): not a storm.
    pub quota_bound: Option<QuotaBound>,
    /// Of the sampled hand-offs whose waiter's code says what it waited for, the share that
    /// waited for a condition (work), not a lock (`condition_wait_share`); `None` with fewer
    /// than `STORM_MIN_KINDED_SAMPLES` of them.
    pub condition_wait_share: Option<f64>,
    /// What the lock costs the threads: of their time, the share spent waiting for it (the
    /// lock's queued threads over all the threads, at most 1). The severity follows it.
    pub lock_wait_share: f64,
    /// The gate whose figure lies nearest its line, when one lies within
    /// `storm_near_line_factor` of it either side: the verdict rests on it.
    pub near_line: Option<NearLine>,
    /// A storm: every gate passed, none near its line, not bound by its quota first; or, with
    /// a figure near its line, the lock costs the threads at least
    /// `storm_critical_lock_wait_share` of their time.
    pub lock_storm: bool,
    /// Near a line: every gate passed or failed within `storm_near_line_factor` of its line,
    /// at least one within it, not bound by its quota first, and the lock costs the threads
    /// less than `storm_critical_lock_wait_share` of their time. Runs of the same program fall
    /// on either side of such a line, so the finding says `possible` and what would decide it.
    pub possible: bool,
}

/// A storm gate's figure near its line ([`StormFigures::near_line`]).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct NearLine {
    /// What the figure is, in words.
    pub gate: &'static str,
    pub value: f64,
    pub line: f64,
    /// Whether the figure passed the gate.
    pub passed: bool,
    /// Whether the lock's cost may settle a verdict near this line: not near the
    /// condition-wait share's, which says whether the waits are for a lock at all.
    pub cost_decides: bool,
}

/// The condition-wait share's gate, in words.
const CONDITION_GATE: &str = "share of sampled hand-offs waiting in a condition wait";

/// One numeric gate of the lock's queue: its figure, its line and which side passes.
struct Gate {
    what: &'static str,
    value: f64,
    line: f64,
    at_least: bool,
    passed: bool,
}

impl Gate {
    fn at_least(what: &'static str, value: f64, line: f64) -> Self {
        Self {
            what,
            value,
            line,
            at_least: true,
            passed: value >= line,
        }
    }

    fn below(what: &'static str, value: f64, line: f64, passed: bool) -> Self {
        Self {
            what,
            value,
            line,
            at_least: false,
            passed,
        }
    }

    /// How many times over its line the figure is on the passing side (> 1 passes, < 1
    /// fails); infinite where the line or the figure is zero on the passing side.
    fn margin(&self) -> f64 {
        let (num, den) = if self.at_least {
            (self.value, self.line)
        } else {
            (self.line, self.value)
        };
        if den <= 0.0 { f64::INFINITY } else { num / den }
    }
}

/// Of the sampled hand-offs whose waiter waited in code that says what for (a lock or a
/// condition: [`crate::symbolize::user::wait_kind`]), the share that waited for a condition;
/// `None` without hand-off samples or with too few such ones to judge.
pub fn condition_wait_share(sites: Option<&HandoffSites>) -> Option<f64> {
    let (lock, condition) = sites?.by_wait_kind();
    let known = lock + condition;
    (known >= defaults::STORM_MIN_KINDED_SAMPLES).then(|| condition as f64 / known as f64)
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
        let required = required_handoffs_per_cpu_second(t, runnable_per_cpu);
        let per_dump = |n: u32| f64::from(n) / f64::from(f.handoffs.jvm_dumps.max(1));
        let mut s = Self {
            threads_per_cpu: threads / allowed,
            queued_threads_per_cpu: f.queued_threads() / allowed,
            handoffs_per_cpu_second: f.handoffs_per_second() / allowed,
            handoff_threads: f.handoffs.lock_threads,
            runtime_handoffs_per_cpu_second: f.runtime_handoffs_per_second() / allowed,
            work_handoffs_per_cpu_second: f.futex_per_second(f.handoffs.work_waits as f64)
                / allowed,
            own_word_threads: f.handoffs.own_word_threads,
            jvm_thread_dumps: f.handoffs.jvm_dumps,
            jvm_threads_waiting_for_a_lock: per_dump(f.handoffs.jvm_lock_waiting),
            jvm_threads_waiting_for_work: per_dump(f.handoffs.jvm_work_waiting),
            dump_judged_threads: f.handoffs.dump_judged_threads,
            futex_blocked_share: f.futex_blocked_share().unwrap_or(0.0),
            futex_timeout_share: f.futex.timeouts as f64 / f.futex.wait.count as f64,
            runnable_per_cpu,
            required_handoffs_per_cpu_second: required,
            cpus_wanted: f.cpus_wanted(),
            handoffs_per_cpu_second_used: f.handoffs_per_second() / f.oncpu_cores().max(1e-9),
            quota_bound: None,
            condition_wait_share: condition_wait_share(f.sites.as_ref()),
            lock_wait_share: (f.queued_threads() / threads).clamp(0.0, 1.0),
            near_line: None,
            lock_storm: false,
            possible: false,
        };
        // The thread count is the program's configuration, not a measured rate: a gate, but
        // never "near" its line.
        let threads_ok = s.threads_per_cpu >= t.storm_min_threads_per_cpu;
        let gates = s.gates(t);
        let queue = threads_ok && gates.iter().all(|g| g.passed);
        let factor = t.storm_near_line_factor.max(1.0);
        let near = gates
            .iter()
            .filter(|g| {
                let m = g.margin();
                m >= 1.0 / factor && m < factor
            })
            .min_by(|a, b| a.margin().ln().abs().total_cmp(&b.margin().ln().abs()));
        let within = gates.iter().all(|g| g.passed || g.margin() >= 1.0 / factor);
        s.near_line = near.map(|g| NearLine {
            gate: g.what,
            value: g.value,
            line: g.line,
            passed: g.passed,
            cost_decides: g.what != CONDITION_GATE,
        });
        let candidate = threads_ok && within;
        s.quota_bound = candidate.then(|| QuotaBound::of(f, t, &s)).flatten();
        // Near a line the cost decides: threads that spend most of their time waiting for the
        // lock are in a storm whichever side of a line one figure fell (a JVM monitor's storm
        // hands off 120–190 times a second per CPU against 100, its threads queued nearly all
        // the time); below that the verdict is only possible.
        let decisive = s.lock_wait_share >= t.storm_critical_lock_wait_share
            && s.near_line.is_none_or(|n| n.cost_decides);
        let judged = candidate && s.quota_bound.is_none();
        s.lock_storm = judged
            && match s.near_line {
                None => queue,
                Some(_) => decisive,
            };
        s.possible = judged && s.near_line.is_some() && !decisive;
        Some(s)
    }

    /// The lock's queue's numeric gates, each against its line.
    fn gates(&self, t: &Thresholds) -> Vec<Gate> {
        let mut gates = vec![
            Gate::at_least(
                "threads queued for the lock per CPU",
                self.queued_threads_per_cpu,
                t.storm_min_queued_threads_per_cpu,
            ),
            Gate::at_least(
                "futex share of the threads' sleep",
                self.futex_blocked_share,
                t.storm_min_futex_blocked_share,
            ),
            Gate::below(
                "share of futex waits timed out",
                self.futex_timeout_share,
                t.storm_max_timeout_share,
                self.futex_timeout_share <= t.storm_max_timeout_share,
            ),
            Gate::at_least(
                "lock hand-offs per second per CPU",
                self.handoffs_per_cpu_second,
                self.required_handoffs_per_cpu_second,
            ),
        ];
        if let Some(c) = self.condition_wait_share {
            gates.push(Gate::below(
                CONDITION_GATE,
                c,
                defaults::STORM_MAX_CONDITION_WAIT_SHARE,
                c < defaults::STORM_MAX_CONDITION_WAIT_SHARE,
            ));
        }
        gates
    }
}

/// A verdict on one gate of a runtime's own figures (Go's goroutines waiting for a mutex, a
/// JVM's virtual threads handed a lock): the gate passed, or, within `storm_near_line_factor`
/// of its line on either side, the lock's cost (`lock_wait_share` against
/// `storm_critical_lock_wait_share`) decides, and where it does not the verdict is possible.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OneGate {
    pub near: Option<NearLine>,
    pub lock_storm: bool,
    pub possible: bool,
}

impl OneGate {
    pub fn judge(
        gate: &'static str,
        value: f64,
        line: f64,
        lock_wait_share: f64,
        t: &Thresholds,
    ) -> Self {
        let passed = value >= line;
        let near = NearLine::of(gate, value, line, t);
        let decisive = lock_wait_share >= t.storm_critical_lock_wait_share;
        Self {
            near,
            lock_storm: if near.is_some() { decisive } else { passed },
            possible: near.is_some() && !decisive,
        }
    }
}

impl NearLine {
    /// One gate's figure against its line, when it lies within `storm_near_line_factor` of
    /// it either side (the lock's cost may then decide).
    pub fn of(gate: &'static str, value: f64, line: f64, t: &Thresholds) -> Option<Self> {
        let factor = t.storm_near_line_factor.max(1.0);
        let margin = if line > 0.0 {
            value / line
        } else {
            f64::INFINITY
        };
        (margin >= 1.0 / factor && margin < factor).then_some(Self {
            gate,
            value,
            line,
            passed: value >= line,
            cost_decides: true,
        })
    }

    /// The figure against its line, in words: "lock hand-offs per second per CPU 1108 against
    /// a line of 1000".
    pub fn words(&self) -> String {
        format!(
            "near a line: {} {} against a line of {}",
            self.gate,
            figure(self.value),
            figure(self.line)
        )
    }

    /// What would settle a verdict that rests on this line.
    pub fn what_decides(&self) -> String {
        format!(
            "Not yet decided: the verdict rests on one figure near its line ({} {} against {}), \
             and runs of the same program fall on either side of such a line. What decides it: \
             the same load with fewer threads (as many as the usable CPUs) or the lock made \
             uncontended — if that does clearly more work per second (≥ 1.15×), the lock limits \
             the program; a longer window (`diagnose --duration`) also steadies the figure.",
            self.gate,
            figure(self.value),
            figure(self.line)
        )
    }
}

/// A figure to as many digits as it needs: shares to two decimals, rates to whole numbers.
pub(super) fn figure(v: f64) -> String {
    if v.abs() < 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.0}")
    }
}

/// A lock's queue that its quota, not its lock, holds back: a convoy inside a quota it has
/// spent. Three things, each measured over the window:
///
/// - the quota is spent: it ran out in at least `QUOTA_BOUND_MIN_THROTTLED_SHARE` of the
///   periods the container ran in (the kernel counts only those, so a container that started
///   or stopped inside the window is judged on the periods it ran, where the quota's share
///   used over the whole window would call it unspent);
/// - the threads run one at a time: the container wanted at most
///   `storm_serial_max_cpus_wanted` CPUs ([`Facts::cpus_wanted`]) — the holder, and a little
///   work outside the lock. Its waiters sleep; nothing spins or bounces the lock word between
///   CPUs. Such a convoy would use about one CPU if the quota let it, and a quota below that
///   binds first: a lock per thread leaves the CPU work per operation, and so the work done in
///   the quota, as it is;
/// - its hand-offs are cheap beside its work: at most
///   `storm_quota_bound_max_handoffs_per_cpu_second_used` per second of CPU used, so the
///   futex calls and switches of the hand-offs cost a small share of the quota.
///
/// Threads that contend while they run (a spinning monitor, a short section whose lock word
/// moves between CPUs) want every CPU and are lock-bound inside any quota; a serialized storm
/// that hands off so often that its hand-offs eat the quota is lock-bound too. Not told apart:
/// a convoy whose threads do much work outside the lock, in parallel (it wants more than one
/// CPU, and is called a storm inside a quota that may still bind first).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct QuotaBound {
    pub quota: f64,
    pub cpus_wanted: f64,
}

impl QuotaBound {
    pub fn of(f: &Facts, t: &Thresholds, s: &StormFigures) -> Option<Self> {
        let quota = f.quota_cores?;
        let spent = f.throttled_share()? >= defaults::QUOTA_BOUND_MIN_THROTTLED_SHARE;
        let cpus_wanted = s.cpus_wanted?;
        (spent
            && cpus_wanted <= t.storm_serial_max_cpus_wanted
            && s.handoffs_per_cpu_second_used
                <= t.storm_quota_bound_max_handoffs_per_cpu_second_used)
            .then_some(Self { quota, cpus_wanted })
    }
}

/// The hand-off rate per allowed CPU a storm needs, given the threads running or queued for a
/// CPU per allowed CPU: `storm_min_handoffs_per_cpu_second` when they keep the CPUs saturated
/// (`storm_saturated_runnable_per_cpu`); below that, the same rate per CPU's worth of threads
/// that want to run — a container that keeps half its CPUs busy must hand off twice as often
/// per CPU — up to `storm_min_convoy_handoffs_per_cpu_second` for a container near idle, where
/// parked threads woken at the rate work arrives look much like a convoy. The two regimes meet
/// at the saturation line: a convoy just short of it needs what one just past it does, not ten
/// times more (a step there split one convoy's runs, 976–1,193 hand-offs/s per CPU at
/// 0.99–1.00 runnable per CPU, between verdicts: tests/CORPUS.md).
pub fn required_handoffs_per_cpu_second(t: &Thresholds, runnable_per_cpu: f64) -> f64 {
    let saturated = t.storm_min_handoffs_per_cpu_second;
    if runnable_per_cpu >= t.storm_saturated_runnable_per_cpu {
        return saturated;
    }
    if runnable_per_cpu <= 0.0 {
        return t.storm_min_convoy_handoffs_per_cpu_second;
    }
    (saturated * t.storm_saturated_runnable_per_cpu / runnable_per_cpu).clamp(
        saturated,
        t.storm_min_convoy_handoffs_per_cpu_second.max(saturated),
    )
}

/// Whether a container's scheduler figures alone — what `sched_switch` sees, no futex probe —
/// show what a lock storm needs: the daemon attaches the futex probes for such a container
/// (`futex_probes = "on-demand"`). Each condition is implied by the storm rule's: as many
/// threads per CPU; at least as many threads per CPU off the CPU (blocked or queued for it) as
/// queued for hand-offs (a waiter is off the CPU until it runs again); and at least as many
/// voluntary switches per CPU as the hand-offs the rule requires (a waiter woken from a futex
/// wait blocked first), at the rule's rate for how busy the container keeps its CPUs
/// ([`required_handoffs_per_cpu_second`]). A busy I/O server with many threads can
/// still look like this (its switches are not futex hand-offs); then the futex probes attach
/// and the rule, with their figures, says it is not a storm.
pub fn lock_storm_candidate(f: &Facts, t: &Thresholds) -> bool {
    let Some(threads) = f.threads else {
        return false;
    };
    let allowed = f.allowed_cpus();
    let required = required_handoffs_per_cpu_second(t, f.runnable_threads() / allowed);
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
/// - only a lock's hand-offs count, here and in the rate below: where the process's threads
///   queue on shared words, the waits a thread handed on (it woke the word it had waited on,
///   as each contender of a glibc mutex or rwlock does when it lets go); where they park on
///   words of their own (a JVM), the waits of threads that both waited for hand-offs and made
///   them. Not the waits of workers of a pool waiting for work, woken on a condition's word
///   by a producer, nor those of threads a runtime parks itself and wakes for work: a
///   Go program's threads (its Ms: a goroutine blocked on a `sync.Mutex` is parked by the Go
///   scheduler and never reaches the kernel, so every futex hand-off of a Go program is its
///   scheduler's), and a JVM's named service threads (compiler, GC, reference handler, …) —
///   told by the process's runtime (its build info, `libjvm.so`) and the threads' names
///   ([`crate::identity::runtime`]);
/// - their time off the CPU goes to futex waits, not to I/O or sleeps
///   (`storm_min_futex_blocked_share`), and few waits time out (`storm_max_timeout_share`);
/// - the hand-offs are frequent: per allowed CPU, `storm_min_handoffs_per_cpu_second` when the
///   container keeps its CPUs saturated (running or queued for a CPU); when its CPUs sit partly
///   idle, that rate per CPU's worth of threads that want to run, up to
///   `storm_min_convoy_handoffs_per_cpu_second` near idle
///   ([`required_handoffs_per_cpu_second`]) — a convoy, where every release wakes a parked
///   waiter, against a pool waiting for work at the rate work arrives;
/// - the sampled hand-offs' waiters, where their code says what they waited for, mostly waited
///   for a lock, not in a condition wait (`STORM_MAX_CONDITION_WAIT_SHARE`,
///   `condition_wait_share`): a pool's workers reacquire its queue's mutex inside their
///   condition wait and hand it on, so that mutex is hot in any busy pool, but the producer
///   feeding the pool limits its work, not the mutex;
/// - not a convoy that its spent quota binds before its lock does ([`QuotaBound`]): one thread
///   running at a time, cheap hand-offs, a quota below the CPU the convoy would use. That is
///   `cpu_throttling`'s, which names the convoy.
///
/// Not judged: the CPU busy share (a convoy leaves the CPUs idle, a storm in a quota is
/// throttled) and the futex wait share of wall time (throttling and run-queue waits dilute it).
/// The thresholds were
/// chosen from a corpus of real workloads on both sides (tests/tests/corpus.rs, tests/CORPUS.md).
///
/// This is the finding of `figures`, a storm or a possible one (the rule's entry point,
/// `rules::lock_storm`, decides between it and a Go program's storm).
pub fn kernel_lock_storm(f: &Facts, t: &Thresholds, figures: StormFigures) -> Option<Finding> {
    let storm = Storm::of(f, t, figures)?;
    let spin = f.spin_wait_per_second();
    let severity = if storm.figures.possible {
        Severity::Info
    } else if storm.figures.lock_wait_share >= t.storm_critical_lock_wait_share
        || spin >= t.storm_significant_spin_wait
    {
        Severity::Critical
    } else {
        Severity::Warning
    };
    let mut e = storm.evidence(f);
    let summary = storm.summary(f, t, &mut e);
    let mut recs = storm.recommendations(f, t);
    if let Some(near) = storm.figures.near_line.filter(|_| storm.figures.possible) {
        recs.insert(0, near.what_decides());
    }
    let mut found = Finding::new(Kind::LockStorm, severity, f.owner(), summary, e, recs);
    found.context.insert(
        "verdict",
        if storm.figures.possible {
            "possible"
        } else {
            "storm"
        }
        .to_owned(),
    );
    if let Some(pair) = f.sites.as_ref().and_then(top_pair) {
        found.name_lock_pair(pair);
    }
    if let Some(host) = &f.host {
        found.context.insert(
            "hypervisor",
            host.hypervisor.clone().unwrap_or_else(|| "none".to_owned()),
        );
    }
    Some(found)
}

/// A storm found, with what its finding is made of.
struct Storm<'a> {
    figures: StormFigures,
    threads: f64,
    allowed: f64,
    /// The share of the quota's periods throttled, when it is significant.
    throttled: Option<f64>,
    cost: HandOffCost<'a>,
}

impl<'a> Storm<'a> {
    fn of(f: &'a Facts, t: &Thresholds, figures: StormFigures) -> Option<Self> {
        let threads = f.threads? as f64;
        let allowed = f.allowed_cpus();
        Some(Self {
            figures,
            threads,
            allowed,
            throttled: f
                .throttled_share()
                .filter(|s| *s >= t.throttling_min_throttled_share),
            cost: HandOffCost::of(f, t, threads, allowed),
        })
    }

    /// The figures the rule used, and the ones that explain the storm.
    fn evidence(&self, f: &Facts) -> BTreeMap<&'static str, f64> {
        let figures = &self.figures;
        let mut e = BTreeMap::new();
        e.insert("queued_threads_per_cpu", figures.queued_threads_per_cpu);
        e.insert("handoffs_per_cpu_second", figures.handoffs_per_cpu_second);
        e.insert(
            "required_handoffs_per_cpu_second",
            figures.required_handoffs_per_cpu_second,
        );
        e.insert("futex_blocked_share", figures.futex_blocked_share);
        e.insert("lock_wait_share", figures.lock_wait_share);
        if let Some(near) = figures.near_line {
            e.insert("near_line_value", near.value);
            e.insert("near_line", near.line);
        }
        e.insert("runnable_per_cpu", figures.runnable_per_cpu);
        if let Some(w) = figures.cpus_wanted {
            e.insert("cpus_wanted", w);
            e.insert(
                "handoffs_per_cpu_second_used",
                figures.handoffs_per_cpu_second_used,
            );
        }
        e.insert("futex_wait_share", f.futex_wait_share().unwrap_or(0.0));
        e.insert("futex_waiting_threads", f.futex_waiting_threads());
        e.insert("futex_waits_per_second", f.futex_waits_per_second());
        e.insert("futex_timeout_share", figures.futex_timeout_share);
        if f.futex.wait.count > 0 {
            e.insert(
                "futex_mean_wait_seconds",
                f.futex.wait.sum_ns as f64 / 1e9 / f.futex.wait.count as f64,
            );
        }
        if let Some(p99) = log2_quantile_ns(&f.futex.wait, 0.99) {
            e.insert("futex_p99_wait_seconds", p99 as f64 / 1e9);
        }
        e.insert(
            "voluntary_switches_per_cpu_second",
            f.voluntary_switches_per_cpu_second(),
        );
        e.insert("runnable_threads", f.runnable_threads());
        e.insert("oncpu_cores", f.oncpu_cores());
        e.insert(
            "kernel_spin_wait_seconds_per_second",
            f.spin_wait_per_second(),
        );
        e.insert("migrations_per_second", f.migrations_per_second());
        limits_evidence(f, &mut e);
        self.cost.evidence(f, self.threads, &mut e);
        if let Some(sites) = &f.sites {
            sites_evidence(sites, &mut e);
        }
        e
    }

    /// What to do, most effective first.
    fn recommendations(&self, f: &Facts, t: &Thresholds) -> Vec<String> {
        let (threads, allowed) = (self.threads, self.allowed);
        let n = allowed.ceil().max(1.0) as u64;
        let mut recs = Vec::new();
        if let Some(pin) = self.cost.pinning(n) {
            recs.push(pin_on_this_node(f, n, pin, PIN_STEPS));
        } else if f.migrations_per_second() / allowed >= t.storm_high_migrations_per_second {
            let pin = format!(
                "Pin the container to fewer, dedicated CPUs: threads move between CPUs {:.0} \
                 times per second, and every lock hand-off then crosses caches.",
                f.migrations_per_second()
            );
            recs.push(pin_on_this_node(f, n, pin, PIN_FEWER_STEPS));
        }
        if let (Some(share), Some(q)) = (self.throttled, f.quota_cores) {
            recs.push(format!(
                "Size the runtimes to the quota, not the node: {threads:.0} threads take turns \
                 on one lock inside a {q:.2}-CPU quota, and a thread throttled while it holds \
                 the lock (its quota ran out in {:.0}% of its periods) stalls every waiter until \
                 the next period. Raising the limit shortens the stalls; fewer threads end the \
                 queue.",
                100.0 * share
            ));
        }
        recs.push(if self.cost.node_sized || self.throttled.is_some() {
            node_sizing(threads, f.host_cpus, n)
        } else {
            format!(
                "Size thread pools and runtimes to the {allowed:.0} CPU(s) really available \
                 instead of running {threads:.0} threads: JVM -XX:ActiveProcessorCount={n} and \
                 explicit pool sizes; Go GOMAXPROCS={n}; fewer worker threads in \
                 thread-per-request servers."
            )
        });
        let spin = f.spin_wait_per_second();
        if spin >= t.storm_significant_spin_wait {
            recs.push(format!(
                "Kernel spinlock hand-offs cost {:.1}% of a CPU (the \
                 `_raw_spin_unlock_irqrestore` signature in perf top): fewer CPUs contending for \
                 the same futex hash buckets and run queues helps; see kernel_lock_sites in \
                 `stormwatch trace --json`.",
                100.0 * spin
            ));
        }
        if let Some(perf) = self
            .cost
            .perf_signature(f, self.figures.handoffs_per_cpu_second)
        {
            recs.push(perf);
        }
        if let Some(steal) = self
            .cost
            .steal_share
            .filter(|s| *s >= t.storm_significant_steal_share)
        {
            recs.push(format!(
                "The hypervisor took {:.0}% of the host's CPU time (steal): a vCPU descheduled \
                 while its thread holds the lock stalls every waiter. Ask for vCPUs that are not \
                 overcommitted (dedicated or pinned), or move to a less loaded host.",
                100.0 * steal
            ));
        }
        recs.push(
            "Caveat: pinning to fewer CPUs hurts runtimes that size their pools from the host's \
             CPU count (older JVMs, GOMAXPROCS before Go 1.25, many native thread pools): set \
             the CPU count explicitly when you pin."
                .to_owned(),
        );
        recs.push(name_the_lock(f.sites.as_ref()));
        recs
    }

    /// The one-paragraph account; adds the quota's figures to `e`.
    fn summary(&self, f: &Facts, t: &Thresholds, e: &mut BTreeMap<&'static str, f64>) -> String {
        let (threads, allowed, figures) = (self.threads, self.allowed, &self.figures);
        let head = match figures.near_line.filter(|_| figures.possible) {
            Some(near) => format!("possible lock storm ({})", near.words()),
            None => "lock storm".to_owned(),
        };
        let mut summary = format!(
            "{head}: {threads:.0} threads on {allowed:.1} usable CPU(s) hand a lock to one \
             another through the kernel {:.0} times/s per CPU, with {:.1} threads per CPU \
             queued for it on average: about {:.0}% of the threads' time is spent waiting for \
             this lock; {:.0}% of their time off the CPU is futex waits",
            figures.handoffs_per_cpu_second,
            figures.queued_threads_per_cpu,
            100.0 * figures.lock_wait_share,
            100.0 * figures.futex_blocked_share,
        );
        if let Some(near) = figures.near_line.filter(|_| !figures.possible) {
            summary.push_str(&format!(
                " ({}, but a lock that costs the threads that much of their time decides it)",
                near.words()
            ));
        }
        if figures.runnable_per_cpu < t.storm_saturated_runnable_per_cpu {
            summary.push_str(&format!(
                " — a convoy: the CPUs are {:.0}% busy while the lock is passed from one parked \
                 thread to the next",
                100.0 * f.oncpu_cores() / allowed
            ));
        }
        if let (Some(share), Some(q)) = (self.throttled, f.quota_cores) {
            summary.push_str(&format!(
                "; inside a {q:.2}-CPU quota it is throttled in {:.0}% of its periods: \
                 {threads:.0} threads sized for the node's {} CPUs against a fractional quota",
                100.0 * share,
                f.host_cpus
            ));
            e.insert("throttled_period_share", share);
            let used = f.oncpu_cores() / q;
            e.insert("quota_used_share", used);
            summary.push_str(&if used >= defaults::QUOTA_SPENT_SHARE {
                // Spent, yet not a convoy the quota binds first (`QuotaBound`): the lock wastes
                // the quota, by contention while running or by the hand-offs' own cost — or,
                // neither, the quota ran out in under half its periods (no `QuotaBound` then,
                // however cheap the hand-offs), and the quota-first account stands.
                match figures.cpus_wanted {
                    Some(w) if w > t.storm_serial_max_cpus_wanted => format!(
                        "; the lock limits its throughput first: it spends {:.0}% of the \
                         quota with {w:.1} CPUs' worth of threads wanting to run at once, \
                         contending for the lock rather than taking turns on it",
                        100.0 * used
                    ),
                    Some(_)
                        if figures.handoffs_per_cpu_second_used
                            > t.storm_quota_bound_max_handoffs_per_cpu_second_used =>
                    {
                        format!(
                            "; the lock limits its throughput first: it spends {:.0}% of the \
                             quota one thread at a time, and its hand-offs ({:.0} per \
                             CPU-second, a futex wake, a wait and two switches each) take much \
                             of it",
                            100.0 * used,
                            figures.handoffs_per_cpu_second_used
                        )
                    }
                    _ => format!(
                        "; the quota limits its throughput first: it spends {:.0}% of it, and \
                         the lock then decides how much of that is useful work",
                        100.0 * used
                    ),
                }
            } else {
                format!(
                    "; the lock limits its throughput first: {:.0}% of the quota goes unused \
                     while its threads wait for the lock",
                    100.0 * (1.0 - used)
                )
            });
        }
        self.cost.explain(f, threads, allowed, t, &mut summary);
        summary
    }
}
