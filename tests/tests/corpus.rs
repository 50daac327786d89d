//! The lock-storm verdict on real workloads that stormwatch did not write (see
//! `stormwatch_tests::corpus`): one test of each case, made from its row — its verdict, and the
//! premise that makes it lock-bound or not, checked against what the kernel says its threads
//! did or against its counterfactual run — never against the agent's own figures. A named miss
//! is listed, ignored, with its reason.

use libtest_mimic::{Arguments, Failed, Trial};
use stormwatch::diagnose::rules::defaults;
use stormwatch_tests::{
    corpus::{self, Case, Check, Expect, LOCK_BOUND_GAIN, NO_CLEAR_GAIN, NO_COST, Outcome, Split},
    require_bpf,
};

fn main() {
    let args = Arguments::from_args();
    let trials = corpus::cases()
        .into_iter()
        .map(|case| {
            let kind = match case.split {
                Split::Tuning => "tuning",
                Split::HeldOut => "held out",
            };
            let name = case.name;
            let miss = case.miss;
            let trial = Trial::test(name, move || judge(&case)).with_kind(kind);
            match miss {
                Some(why) => {
                    let listed = args.filter.as_deref().is_none_or(|f| {
                        if args.exact {
                            name == f
                        } else {
                            name.contains(f)
                        }
                    });
                    if listed && !args.list {
                        eprintln!("{name}: a named miss, ignored: {why}");
                    }
                    trial.with_ignored_flag(true)
                }
                None => trial,
            }
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}

/// Runs a case and asks what its row says: its premise checks, its verdict ([`Case::expect`],
/// unless a check decides the verdict for this run), then its findings' checks. A panic is the
/// test's failure, with its message.
fn judge(case: &Case) -> Result<(), Failed> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        require_bpf();
        let o = corpus::run(case, false);
        let line = corpus::describe(case, &o);
        eprintln!("{line}");
        if let Some((judged, alone, counterfactual)) = observed_lock_bound(&o) {
            eprintln!(
                "{}: the agent's probes took {:.0}% of its work while judged ({judged:.0}/s \
                 against {alone:.0}/s alone); its counterfactual does {:.2}× the work as \
                 judged, so the program as observed is lock-bound (issue #43: the probes' \
                 per-event cost)",
                case.name,
                100.0 * (1.0 - judged / alone),
                counterfactual / judged
            );
        }
        for check in case.checks {
            premise(*check, case, &o);
        }
        let decided = case
            .checks
            .iter()
            .any(|c| decides_verdict(*c, case, &o, &line));
        if !decided {
            assert_eq!(
                o.lock_storm,
                case.expect == Expect::LockStorm,
                "wrong verdict: {line}; finding: {:?}",
                o.storm_finding
            );
        }
        for check in case.checks {
            findings(*check, case, &o);
        }
    }))
    .map_err(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("the test panicked");
        Failed::from(message)
    })
}

/// The premise part of `check`: what must hold for the expected verdict to be the truth.
fn premise(check: Check, case: &Case, o: &Outcome) {
    use corpus::Check::*;
    match check {
        LockBound => assert_lock_bound(case, o),
        NotLockBound => assert_not_lock_bound(case, o),
        NotLockBoundOrOversubscribed => assert_not_lock_bound_or_oversubscribed(case, o),
        NoCostlierPerWorkOrOversubscribed => {
            if !counterfactual_left_out(case) {
                gain(case, o);
                assert_no_costlier_per_work_or_oversubscribed(case, o);
            }
        }
        StormByConstruction => assert_counterfactual_agrees(case, o),
        ThreadsQueueOnFutexes => assert_threads_queue_on_futexes(case, o),
        ThreadsTakeTurnsOnFutexes => assert_threads_take_turns_on_futexes(case, o),
        Throttled => assert_throttled(case, o),
        CpusPartlyIdle => assert!(
            o.kernel.cpu_cores < 0.75 * o.allowed,
            "premise of {}: a convoy leaves the CPUs partly idle; the cgroup used {:.2} of {} CPUs",
            case.name,
            o.kernel.cpu_cores,
            o.allowed
        ),
        AtLeast(figure, amount) => {
            let (seen, bar) = (figure.of(&o.kernel), amount.given(o.allowed));
            assert!(
                seen >= bar,
                "premise of {}: the kernel should show {figure:?} ≥ {bar:.2} ({amount:?}), saw \
                 {seen:.2}",
                case.name
            );
        }
        Below(figure, amount) => {
            let (seen, bar) = (figure.of(&o.kernel), amount.given(o.allowed));
            assert!(
                seen < bar,
                "premise of {}: the kernel should show {figure:?} < {bar:.2} ({amount:?}), saw \
                 {seen:.2}",
                case.name
            );
        }
        QuotaBoundConvoy => {
            // Whether it is lock-bound alone is asked only where the agent judged the program
            // much as it runs alone: a program its probes changed is judged as observed.
            if !lock_bound_as_observed(o) {
                assert_not_lock_bound(case, o);
            }
        }
        CpuPerWorkOverCounterfactual(_) => {
            // Printed, not asserted: requests per second are not the measure here (see
            // `findings`).
            if !counterfactual_left_out(case) {
                gain(case, o);
            }
        }
        SummarySays(_)
        | FindingOf(_)
        | QuotaStorm
        | GoStorm
        | VirtualStorm
        | SizingNamed { .. } => {}
        VerdictByCpusWantedUnderEmulation => {}
    }
}

/// Whether `check` decides this run's verdict itself (and asks it), in place of
/// [`Case::expect`].
fn decides_verdict(check: Check, case: &Case, o: &Outcome, line: &str) -> bool {
    match check {
        Check::QuotaBoundConvoy if lock_bound_as_observed(o) => {
            assert!(
                o.lock_storm,
                "{}: lock-bound as observed, yet no lock_storm: {line}",
                case.name
            );
            true
        }
        Check::VerdictByCpusWantedUnderEmulation if !corpus::timings_are_real() => {
            verdict_by_cpus_wanted(case, o, line);
            true
        }
        _ => false,
    }
}

/// What the findings must say, once the verdict is right.
fn findings(check: Check, case: &Case, o: &Outcome) {
    match check {
        Check::SummarySays(words) => {
            let summary = o.storm_finding.as_ref().map(|f| f.summary.clone());
            assert!(
                summary.as_deref().is_some_and(|s| s.contains(words)),
                "the storm's summary should say {words:?}: {summary:?}"
            );
        }
        Check::FindingOf(kinds) => assert!(
            o.kinds.iter().any(|k| kinds.contains(&k.as_str())),
            "{}: a finding of {kinds:?} expected: {:?}",
            case.name,
            o.kinds
        ),
        // Only where the storm was called: under emulation the verdict may be the quota-bound
        // convoy's (`VerdictByCpusWantedUnderEmulation`); elsewhere the verdict asked it.
        Check::QuotaStorm if o.lock_storm => assert_quota_storm_findings(o),
        Check::GoStorm => assert_go_storm(o),
        Check::VirtualStorm => assert_virtual_storm(o),
        Check::SizingNamed { setting, advice } => {
            let sizing = o.findings_of("runtime_sizing");
            assert!(
                sizing
                    .iter()
                    .any(|f| f.summary.contains(setting) && f.recommends(advice)),
                "the runtime's sizing is named ({setting}), with the value to set ({advice}): \
                 {:?}",
                o.kinds
            );
        }
        Check::QuotaBoundConvoy if !lock_bound_as_observed(o) => {
            assert_throttling_names_the_convoy(case, o)
        }
        Check::CpuPerWorkOverCounterfactual(bar) => assert_cpu_per_work(case, o, bar),
        _ => {}
    }
}

/// Premise of a lock-bound case: by the kernel's own account, at least twice as many threads
/// per allowed CPU asleep in futex waits as the CPUs could run.
#[track_caller]
fn assert_threads_queue_on_futexes(case: &Case, o: &Outcome) {
    assert!(
        o.kernel.futex_sleeping >= 2.0 * o.allowed,
        "premise of {}: the kernel should show ≥ {:.1} threads asleep in futex waits, saw {:.1}",
        case.name,
        2.0 * o.allowed,
        o.kernel.futex_sleeping
    );
}

/// Premise of a quota case: by `cpu.stat`, its quota ran out in at least a quarter of its
/// periods.
#[track_caller]
fn assert_throttled(case: &Case, o: &Outcome) {
    let throttled = o
        .kernel
        .throttled_share
        .expect("a quota case reads its throttling");
    assert!(
        throttled >= 0.25,
        "premise of {}: the quota should run out in ≥ 25% of its periods (cpu.stat), saw {:.0}%",
        case.name,
        100.0 * throttled
    );
}

/// Premise of a storm inside a quota, in the kernel's words: its threads take turns asleep on
/// the lock. Not the mean asleep in futex waits that [`assert_threads_queue_on_futexes`] asks
/// on free CPUs: a waiter the lock is handed to wakes runnable and, the quota spent, stays
/// runnable until the next period, and a throttled cgroup's threads stand frozen in that state
/// for most of each period — quota-rwlock-writers showed 0.7–2.6 threads asleep in futex waits
/// on average, found asleep at all in only 6–14% of the samples, 29–31 of its 33 threads
/// runnable (tests/CORPUS.md; 0.7 against the 1.0 asked failed a CI run, 2026-11-26). What the
/// throttling cannot hide is what the threads did between the samples: they gave up their CPU
/// of their own accord at least once a second each on average (`voluntary_ctxt_switches`),
/// and when the kernel finds them asleep they queue in futex waits, two or more at once.
#[track_caller]
fn assert_threads_take_turns_on_futexes(case: &Case, o: &Outcome) {
    let k = &o.kernel;
    assert!(
        k.voluntary_switches_per_second >= k.threads,
        "premise of {}: each of its {:.0} threads should sleep at least once a second, the kernel \
         counted {:.0} sleeps/s",
        case.name,
        k.threads,
        k.voluntary_switches_per_second
    );
    assert!(
        k.futex_peak >= 2.0,
        "premise of {}: the kernel should find threads queued in futex waits, two or more at \
         once; at most {:.0}",
        case.name,
        k.futex_peak
    );
}

/// A storm inside a quota, once its verdict is right: the findings compose — the storm and the
/// throttling, tied in the storm's summary, and no advice to go and look for a lock the futex
/// figures already show.
#[track_caller]
fn assert_quota_storm_findings(o: &Outcome) {
    assert!(
        o.kinds.iter().any(|k| k == "cpu_throttling"),
        "a storm inside a quota is also cpu_throttling: {:?}",
        o.kinds
    );
    let f = o.storm_finding.as_ref().expect("a storm's finding");
    let summary = &f.summary;
    assert!(
        summary.contains("quota") && summary.contains("throttled"),
        "the storm's summary should tie it to the quota: {summary}"
    );
    let recs = f.recommendations.join("\n");
    assert!(
        recs.contains("ActiveProcessorCount=1") && recs.contains("GOMAXPROCS=1"),
        "the storm's advice should size the runtimes to the quota's 1 CPU: {recs}"
    );
    assert!(
        !o.kinds.iter().any(|k| k == "thread_oversubscription"),
        "a storm is not also reported as oversubscription (whose advice is to watch futexes): \
         {:?}",
        o.kinds
    );
}

/// The tuning storms that now run a counterfactual (sysbench cut to the allowed CPUs, the JVM
/// storm with a monitor per thread) were storms by construction before the corpus had
/// counterfactuals; their runs must not contradict that: the counterfactual does more than
/// [`NO_CLEAR_GAIN`]× the work. Measured (tests/CORPUS.md): sysbench 1.8–7× by hand on busy
/// CPUs and 6.3–7.3× inside the 0.5-CPU quota, the JVM 1.4× on busy CPUs and, inside the quota
/// with its threads cut to one, 1.25× (median of five pairs, 1.11–1.91) — the JVM's not always
/// clear of the held-out cases' [`LOCK_BOUND_GAIN`] bar, so that bar is not asked here.
///
/// Under emulation (the kernel matrix's guests) the comparison means nothing
/// (`corpus::timings_are_real`), and is left out there, saying so.
#[track_caller]
fn assert_counterfactual_agrees(case: &Case, o: &Outcome) {
    if counterfactual_left_out(case) {
        return;
    }
    let gain = gain(case, o);
    // As `assert_lock_bound`: a program the agent's probes changed is judged as observed (the
    // JVM monitor storm on AMD: 1.00× alone in a CI run, 22% of its work taken while judged,
    // its counterfactual 1.27× the work as judged).
    if gain <= NO_CLEAR_GAIN && lock_bound_as_observed(o) {
        return;
    }
    assert!(
        gain > NO_CLEAR_GAIN,
        "premise of {}: a storm, so its counterfactual ({:?}) should do more than \
         {NO_CLEAR_GAIN}× the work per second; it did {gain:.2}× ({:.0}/s against {:.0}/s)",
        case.name,
        case.counterfactual,
        o.counterfactual_work_per_second.unwrap_or(f64::NAN),
        o.alone_work_per_second.unwrap_or(f64::NAN),
    );
}

/// The Go runtime parks goroutines itself: a goroutine blocked on a `sync.Mutex` waits in the
/// Go scheduler and never reaches the kernel, whose futex hand-offs are the runtime's Ms
/// parked and woken for work. The storm is judged by the runtime's own clock of its
/// goroutines' mutex waits, and its finding says so; the code that takes the mutex is named
/// from the mutex uprobes where they sampled it.
#[track_caller]
fn assert_go_storm(o: &Outcome) {
    let summary = o
        .storm_finding
        .as_ref()
        .map(|f| f.summary.clone())
        .unwrap_or_default();
    assert!(
        summary.contains("the Go runtime counts") && summary.contains("goroutines waiting"),
        "the storm is told from the Go runtime's clock: {summary}"
    );
    // …and from what the mutex costs the CPUs: a share of the on-CPU samples, stated.
    let share = o
        .storm_finding
        .as_ref()
        .and_then(|f| f.evidence.get("go_mutex_cpu_share").copied().flatten());
    assert!(
        share.is_some_and(|s| s >= 0.05)
            && summary.contains("of the Go processes' CPU is spent in the mutex's code"),
        "the storm states what the mutex costs the CPUs ({share:?}): {summary}"
    );
    // The code that takes the mutex, from the uprobes' samples: gomutex's `worker`.
    let site = o
        .storm_finding
        .as_ref()
        .and_then(|f| f.context("waiter_site").map(str::to_owned))
        .unwrap_or_default();
    assert!(
        site.starts_with("`main.worker`") && site.ends_with("via `sync.(*Mutex).Lock`"),
        "the storm names the code that takes the mutex: {site:?}"
    );
}

/// A virtual-thread storm: told from the JVM's figures, its lock and code named
/// (tests/corpus/VirtualThreads.java's `locked`).
#[track_caller]
fn assert_virtual_storm(o: &Outcome) {
    let f = o.storm_finding.as_ref();
    let summary = f.map(|f| f.summary.clone()).unwrap_or_default();
    assert!(
        summary.starts_with("lock storm of virtual threads") && summary.contains("hands a lock on"),
        "the storm is told from the JVM's own figures: {summary}"
    );
    let lock = f.and_then(|f| f.context("lock")).unwrap_or_default();
    let site = f.and_then(|f| f.context("lock_site")).unwrap_or_default();
    assert!(
        lock.starts_with("java.util.concurrent.locks.ReentrantLock$NonfairSync@")
            && site.starts_with("VirtualThreads.locked(VirtualThreads.java:"),
        "the storm names the lock and its code: {lock:?} at {site:?}"
    );
}

// The bars, and how a premise near one is measured again: `corpus::LOCK_BOUND_GAIN`,
// `corpus::NO_CLEAR_GAIN`, `corpus::premise_gains`.

#[track_caller]
fn gain(case: &Case, o: &Outcome) -> f64 {
    let gain = o
        .counterfactual_gain()
        .unwrap_or_else(|| panic!("{} measured no counterfactual", case.name));
    eprintln!(
        "{}: counterfactual {:?} does {gain:.2}× the work per second (median of {:.2?})",
        case.name, case.counterfactual, o.premise_gains
    );
    gain
}

/// Whether the counterfactual was left out because the timings are not the program's (the
/// kernel matrix's emulated guests: see [`assert_counterfactual_agrees`]); says so when it was.
fn counterfactual_left_out(case: &Case) -> bool {
    let out = !corpus::timings_are_real();
    if out {
        eprintln!(
            "{}: counterfactual not run: an emulated guest's timings are not the program's",
            case.name
        );
    }
    out
}

#[track_caller]
fn assert_lock_bound(case: &Case, o: &Outcome) {
    if counterfactual_left_out(case) {
        return;
    }
    let gain = gain(case, o);
    if gain < LOCK_BOUND_GAIN && lock_bound_as_observed(o) {
        return;
    }
    assert!(
        gain >= LOCK_BOUND_GAIN,
        "premise of {}: lock-bound, so its counterfactual ({:?}) should do ≥ {LOCK_BOUND_GAIN}× \
         the work per second; it did {gain:.2}× ({:.0}/s against {:.0}/s)",
        case.name,
        case.counterfactual,
        o.counterfactual_work_per_second.unwrap_or(f64::NAN),
        o.alone_work_per_second.unwrap_or(f64::NAN),
    );
}

#[track_caller]
fn assert_not_lock_bound(case: &Case, o: &Outcome) {
    if counterfactual_left_out(case) {
        return;
    }
    let gain = gain(case, o);
    assert!(
        gain <= NO_CLEAR_GAIN,
        "premise of {}: not lock-bound, so its counterfactual ({:?}) should do no more than \
         {NO_CLEAR_GAIN}× the work per second; it did {gain:.2}× ({:.0}/s against {:.0}/s)",
        case.name,
        case.counterfactual,
        o.counterfactual_work_per_second.unwrap_or(f64::NAN),
        o.alone_work_per_second.unwrap_or(f64::NAN),
    );
}

/// The share of a program's work the agent's own probes took while it was judged (its work
/// per second alone, before the agent attached, against its work while judged) at which the
/// premise measured alone no longer describes what was judged.
const OBSERVER_COST: f64 = 0.15;

/// When the agent's probes took `OBSERVER_COST` or more of the program's work while judged
/// (its work per second as judged against alone, before the agent attached) and its
/// counterfactual, measured alone, does `LOCK_BOUND_GAIN` or more of the work as judged: the
/// three figures (judged, alone, counterfactual). Then the program as observed is lock-bound,
/// whatever it is alone, and `lock_storm` is the truth about what was judged (the agent's own
/// cost is issue #43's defect); [`judge`] says so once per run. Never under emulation (the
/// timings are not the program's).
fn observed_lock_bound(o: &Outcome) -> Option<(f64, f64, f64)> {
    let (Some(judged), Some(alone), Some(counterfactual)) = (
        o.work_per_second,
        o.alone_work_per_second,
        o.counterfactual_work_per_second,
    ) else {
        return None;
    };
    (corpus::timings_are_real()
        && judged <= (1.0 - OBSERVER_COST) * alone
        && counterfactual >= LOCK_BOUND_GAIN * judged)
        .then_some((judged, alone, counterfactual))
}

/// Whether the program as observed is lock-bound ([`observed_lock_bound`]).
fn lock_bound_as_observed(o: &Outcome) -> bool {
    observed_lock_bound(o).is_some()
}

/// A quota-bound convoy's `cpu_throttling` finding says the quota binds before the lock does.
#[track_caller]
fn assert_throttling_names_the_convoy(c: &Case, o: &Outcome) {
    let throttling = *o
        .findings_of("cpu_throttling")
        .first()
        .unwrap_or_else(|| panic!("{}: what limits it is the quota: {:?}", c.name, o.kinds));
    let summary = &throttling.summary;
    assert!(
        summary.contains("so the quota binds before the lock does"),
        "{}: the throttling finding names the convoy: {summary}",
        c.name
    );
}

/// A pool whose workers wait on a condition variable for work: fewer threads doing clearly
/// more (above `NO_CLEAR_GAIN`) is the cost of the thread count — too many runnable threads
/// for the CPUs, which the agent must then name (`thread_oversubscription`: ≥ 2 runnable per
/// CPU) — not a lock's queue; `judged_given` still refuses a `lock_storm` verdict.
#[track_caller]
fn assert_not_lock_bound_or_oversubscribed(case: &Case, o: &Outcome) {
    if counterfactual_left_out(case) {
        return;
    }
    let gain = gain(case, o);
    assert!(
        gain <= NO_CLEAR_GAIN || names_thread_cost(o),
        "premise of {}: its counterfactual ({:?}) did {gain:.2}× the work per second, more \
         than {NO_CLEAR_GAIN}×: the thread count costs, which the agent should then name \
         (thread_oversubscription, or runtime_sizing); it found {:?}",
        case.name,
        case.counterfactual,
        o.kinds,
    );
}

/// Whether the agent names the thread count's cost: too many threads runnable for the CPUs, or
/// a runtime sized for more CPUs than the container has, whose extra threads the workers' waits
/// wake.
fn names_thread_cost(o: &Outcome) -> bool {
    o.kinds
        .iter()
        .any(|k| k == "thread_oversubscription" || k == "runtime_sizing")
}

/// The CPU time per unit of work the case's program spends over its counterfactual's: the
/// median of the pairs of runs that settle it among the check's bars (`interval`: three at
/// least, `PAIRS_NEAR_A_BAR` at most), and the pairs' ratios (printed).
fn cpu_per_work_ratio(
    case: &Case,
    o: &Outcome,
    interval: impl Fn(f64) -> usize,
) -> (f64, Vec<f64>) {
    let ratios = corpus::cpu_per_work_ratios(case, o, interval);
    let ratio = corpus::median(ratios.clone());
    eprintln!(
        "{}: CPU per unit of work over its counterfactual's: ×{ratio:.2} (median of {ratios:.2?})",
        case.name
    );
    (ratio, ratios)
}

/// A server loaded from outside its cgroup (`Check::NoCostlierPerWorkOrOversubscribed`): its
/// thread count costs it no more than [`NO_CLEAR_GAIN`]× the CPU per unit of work its
/// counterfactual (fewer threads) spends, in the median of the pairs of runs
/// that settle it (three to five, on the bars its outcome turns on), or the agent names
/// that cost as the case with work per second does; and where it costs no more than
/// [`NO_COST`]×, no `runtime_sizing` finding says it does (one near its count's line,
/// `possible`, says only what would decide it).
fn assert_no_costlier_per_work_or_oversubscribed(case: &Case, o: &Outcome) {
    let names = names_thread_cost(o);
    let said: Vec<_> = o
        .findings_of("runtime_sizing")
        .into_iter()
        .filter(|f| f.context("verdict") != Some("possible"))
        .collect();
    // The bars the outcome turns on: the pairs settle which side of them the median lies.
    let bars: Vec<f64> = [(!said.is_empty(), NO_COST), (!names, NO_CLEAR_GAIN)]
        .into_iter()
        .filter_map(|(turns, bar)| turns.then_some(bar))
        .collect();
    let (ratio, ratios) = cpu_per_work_ratio(case, o, |r| corpus::bars_exceeded(&bars, r));
    assert!(
        ratio <= NO_CLEAR_GAIN || names,
        "premise of {}: it spent {ratio:.2}× the CPU per unit of work its counterfactual ({:?}) \
         does (median of {ratios:.2?}), more than {NO_CLEAR_GAIN}×: the thread count costs, \
         which the agent should then name (thread_oversubscription, or runtime_sizing); it \
         found {:?}",
        case.name,
        case.counterfactual,
        o.kinds,
    );
    assert!(
        ratio > NO_COST || said.is_empty(),
        "{}: it spent {ratio:.2}× the CPU per unit of work its counterfactual ({:?}) does \
         (median of {ratios:.2?}), no more than {NO_COST}×, yet runtime_sizing says its sizing \
         costs it: {:?}",
        case.name,
        case.counterfactual,
        said.iter().map(|f| &f.summary).collect::<Vec<_>>(),
    );
}

/// `quota-lockbench-short-cs-storm` under the kernel matrix's software emulation
/// (`Check::VerdictByCpusWantedUnderEmulation`): both vCPUs run on one host thread, so no two
/// threads ever run at once, and the figure that tells a storm whose threads contend while they
/// run from a convoy the quota binds first — the CPUs the container wanted, its CPU time plus
/// its run queues' throttled time — is the emulator's, not the program's: this storm read
/// 1.06–1.35 in guests (2026-11-28; 1.92 on the host), the convoy 1.11 (1.03). Nor can the
/// guest ground the storm in its counterfactual (`corpus::timings_are_real`). There the test
/// asks what the kernel decides — the threads' turns on the futex and the quota run out, asked
/// as premises — and the verdict that figure gives on the rule's line, with `cpu_throttling`
/// naming the convoy when it is the convoy's.
#[track_caller]
fn verdict_by_cpus_wanted(case: &Case, o: &Outcome, line: &str) {
    let wanted = o.figure(|f| f.cpus_wanted);
    if wanted > defaults::STORM_SERIAL_MAX_CPUS_WANTED {
        assert!(o.lock_storm, "wrong verdict: {line}");
    } else {
        eprintln!(
            "{}: {wanted:.2} CPUs wanted under emulation, at most the rule's line of {}: the \
             quota-bound convoy's verdict",
            case.name,
            defaults::STORM_SERIAL_MAX_CPUS_WANTED
        );
        assert!(!o.lock_storm, "wrong verdict: {line}");
        assert_throttling_names_the_convoy(case, o);
    }
}

/// A Go server with no lock in its handler, its runtime sized for a bigger node (GOMAXPROCS=16
/// on 2 CPUs): the Ms the runtime parks and wakes sleep in futex waits, but there is no lock to
/// make uncontended; what the kernel's view must not be mistaken for is a storm, and what it
/// costs is the runtime's sizing. That cost is asserted as the CPU time the server spends per
/// request, against its counterfactual (GOMAXPROCS=2) under the same load (1.36–1.45×
/// measured): its requests per second are not the measure, since the load generator shares the
/// 2 CPUs and how the scheduler splits them between the two drew 0.88–1.66× (a CI run failed at
/// 0.88×). Not under emulation (the timings are not the program's).
#[track_caller]
fn assert_cpu_per_work(case: &Case, o: &Outcome, bar: f64) {
    if counterfactual_left_out(case) {
        return;
    }
    let (ratio, ratios) = cpu_per_work_ratio(case, o, |r| usize::from(r >= bar));
    assert!(
        ratio >= bar,
        "premise of {}: it should spend ≥ {bar}× the CPU per unit of work its counterfactual \
         ({:?}) does, it spent {ratio:.2}× (median of {ratios:.2?})",
        case.name,
        case.counterfactual
    );
}
