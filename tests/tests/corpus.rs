//! The lock-storm verdict on real workloads that stormwatch did not write (see
//! `stormwatch_tests::corpus`): each case must get its verdict, and the premise that makes it
//! lock-bound or not is checked against what the kernel says its threads did — never against
//! the agent's own figures.

use stormwatch::diagnose::rules::defaults;
use stormwatch_tests::{
    corpus::{self, Case, Expect, LOCK_BOUND_GAIN, NO_CLEAR_GAIN, Outcome, case},
    require_bpf,
};

/// Runs a case and checks its verdict; returns the outcome for premise checks.
#[track_caller]
fn judged(name: &str) -> (Case, Outcome) {
    judged_given(name, |_, _| {})
}

/// Runs a case, checks `premise` (whether it is lock-bound, from its counterfactual) before
/// its verdict: when the premise does not hold the verdict expected is not known to be right,
/// and the test says so rather than blame the agent. Then as [`judged`].
#[track_caller]
fn judged_given(name: &str, premise: impl FnOnce(&Case, &Outcome)) -> (Case, Outcome) {
    require_bpf();
    let case = case(name);
    let o = corpus::run(&case, false);
    let line = corpus::describe(&case, &o);
    eprintln!("{line}");
    premise(&case, &o);
    assert_eq!(
        o.lock_storm,
        case.expect == Expect::LockStorm,
        "wrong verdict: {line}; finding: {:?}",
        o.storm_finding
    );
    (case, o)
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

#[track_caller]
fn assert_convoy(case: &Case, o: &Outcome) {
    assert_threads_queue_on_futexes(case, o);
    assert!(
        o.kernel.cpu_cores < 0.75 * o.allowed,
        "premise of {}: a convoy leaves the CPUs partly idle; the cgroup used {:.2} of {} CPUs",
        case.name,
        o.kernel.cpu_cores,
        o.allowed
    );
    let summary = o.storm_finding.as_ref().map(|f| f["summary"].to_string());
    assert!(
        summary.as_deref().is_some_and(|s| s.contains("convoy")),
        "the storm's summary should say it is a convoy: {summary:?}"
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

#[track_caller]
fn assert_quota_storm(case: &Case, o: &Outcome) {
    assert_threads_take_turns_on_futexes(case, o);
    assert_throttled(case, o);
    // Findings compose: the storm and the throttling, tied in the storm's summary, and no
    // advice to go and look for a lock the futex figures already show.
    assert!(
        o.kinds.iter().any(|k| k == "cpu_throttling"),
        "a storm inside a quota is also cpu_throttling: {:?}",
        o.kinds
    );
    let f = o.storm_finding.as_ref().expect("checked above");
    let summary = f["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains("quota") && summary.contains("throttled"),
        "the storm's summary should tie it to the quota: {summary}"
    );
    let recs = f["recommendations"].to_string();
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
    if gain <= NO_CLEAR_GAIN && lock_bound_as_observed(case, o) {
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

#[test]
fn sysbench_mutex_storm_is_a_lock_storm() {
    judged_given("sysbench-mutex-storm", |c, o| {
        assert_counterfactual_agrees(c, o);
        assert_threads_queue_on_futexes(c, o);
    });
}

#[test]
fn futex_lock_pi_convoy_is_a_lock_storm() {
    let (c, o) = judged("lock-pi-convoy");
    assert_convoy(&c, &o);
}

#[test]
fn jvm_fair_lock_convoy_is_a_lock_storm() {
    let (c, o) = judged("jvm-fair-lock-convoy");
    assert_convoy(&c, &o);
}

#[test]
fn jvm_synchronized_storm_is_a_lock_storm() {
    judged_given("jvm-synchronized-storm", |c, o| {
        assert_counterfactual_agrees(c, o);
        assert_threads_queue_on_futexes(c, o);
    });
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
        .and_then(|f| f["summary"].as_str().map(str::to_owned))
        .unwrap_or_default();
    assert!(
        summary.contains("the Go runtime counts") && summary.contains("goroutines waiting"),
        "the storm is told from the Go runtime's clock: {summary}"
    );
    // The code that takes the mutex, from the uprobes' samples: gomutex's `worker`.
    let site = o
        .storm_finding
        .as_ref()
        .and_then(|f| f["context"]["waiter_site"].as_str().map(str::to_owned))
        .unwrap_or_default();
    assert!(
        site.starts_with("`main.worker`") && site.ends_with("via `sync.(*Mutex).Lock`"),
        "the storm names the code that takes the mutex: {site:?}"
    );
}

/// Its lock's counterfactual (a mutex per goroutine) does ≥ 1.15× the work: lock-bound, though
/// fewer goroutines would not help (2 do 0.85×: tests/CORPUS.md). The runtime's sizing for a
/// bigger node (GOMAXPROCS=16 on 2 CPUs) is named too, with the value to set.
#[test]
fn go_mutex_storm_is_a_lock_storm_by_the_go_runtimes_clock() {
    let (_, o) = judged_given("go-mutex-storm", assert_lock_bound);
    assert_go_storm(&o);
    let sizing = o.findings_of("runtime_sizing");
    assert!(
        sizing.iter().any(|f| f["summary"]
            .as_str()
            .is_some_and(|s| s.contains("GOMAXPROCS=16"))
            && f["recommendations"].to_string().contains("GOMAXPROCS=2")),
        "the runtime's sizing is named, with the value to set: {:?}",
        o.kinds
    );
}

#[test]
fn go_mutex_per_goroutine_is_not_a_lock_storm() {
    judged("go-mutex-per-goroutine");
}

#[test]
fn go_mutex_with_a_tiny_critical_section_is_a_lock_storm() {
    let (_, o) = judged_given("go-mutex-tiny-cs", assert_lock_bound);
    assert_go_storm(&o);
}

// go-mutex-long-outside is a named miss, not a test (tests/CORPUS.md, "Go storms by the
// runtime's clock"): called a storm, though its counterfactual did 0.97–1.09× in the harness
// (1.29× by hand on 4-s runs before): the lock does not limit it.

/// Goroutines waiting for work on a sync.Cond wait in the Go scheduler as a mutex's waiters
/// do, but the runtime does not count a condition's waits as a mutex's: only the queue's
/// mutex, taken briefly around each task, is.
#[test]
fn go_pool_waiting_on_a_condition_is_not_a_lock_storm() {
    judged_given("go-cond-pool-64", assert_not_lock_bound);
}

#[test]
fn busy_go_pool_waiting_on_a_condition_is_not_a_lock_storm() {
    judged_given("go-cond-pool-busy", assert_not_lock_bound);
}

#[test]
fn mutex_storm_inside_a_cfs_quota_is_a_lock_storm_and_throttling() {
    let (c, o) = judged_given("quota-mutex-storm", assert_counterfactual_agrees);
    assert_quota_storm(&c, &o);
}

#[test]
fn jvm_storm_inside_a_cfs_quota_is_a_lock_storm_and_throttling() {
    let (c, o) = judged_given("quota-jvm-storm", assert_counterfactual_agrees);
    assert_quota_storm(&c, &o);
}

#[test]
fn cpu_oversubscription_is_not_a_lock_storm() {
    let (c, o) = judged("cpu-oversubscription");
    assert!(
        o.kernel.runnable >= 4.0 * o.allowed,
        "premise of {}: ≥ {} threads runnable, the kernel saw {:.1}",
        c.name,
        4.0 * o.allowed,
        o.kernel.runnable
    );
    assert!(
        o.kinds
            .iter()
            .any(|k| k == "runqueue_saturation" || k == "thread_oversubscription"),
        "oversubscribed CPUs are flagged as such: {:?}",
        o.kinds
    );
}

/// Semaphore-heavy but not lock-bound: glibc's sem_wait takes the count without sleeping
/// while there is one, and the kernel shows the threads runnable, not queued in futex waits.
#[test]
fn stress_ng_semaphore_is_oversubscription_not_a_lock_storm() {
    let (c, o) = judged("stress-ng-semaphore");
    assert!(
        o.kernel.runnable >= 4.0 * o.allowed && o.kernel.futex_sleeping < o.allowed,
        "premise of {}: runnable threads ({:.1}), few asleep in futex waits ({:.1})",
        c.name,
        o.kernel.runnable,
        o.kernel.futex_sleeping
    );
}

#[test]
fn cpu_bound_work_inside_a_quota_is_throttling_not_a_lock_storm() {
    let (c, o) = judged("quota-cpu-bound");
    assert_throttled(&c, &o);
    assert!(
        o.kinds.iter().any(|k| k == "cpu_throttling"),
        "{:?}",
        o.kinds
    );
}

/// The hard negative for "threads asleep in futex waits": the kernel shows most of the pool
/// there, but every wait ends in its timeout.
#[test]
fn jvm_idle_pool_on_timers_is_not_a_lock_storm() {
    let (c, o) = judged("jvm-idle-pool-on-timers");
    assert_threads_queue_on_futexes(&c, &o);
}

/// The other hard negative: 64 workers asleep on the queue's condition, idle CPUs, woken at
/// the rate tasks arrive.
#[test]
fn jvm_queue_at_a_modest_rate_is_not_a_lock_storm() {
    let (c, o) = judged("jvm-queue-modest-rate");
    assert_threads_queue_on_futexes(&c, &o);
    assert!(
        o.kernel.cpu_cores < 0.25 * o.allowed,
        "premise of {}: a modest rate leaves the CPUs idle; used {:.2}",
        c.name,
        o.kernel.cpu_cores
    );
}

#[test]
fn futex_calls_without_waiters_are_not_a_lock_storm() {
    let (c, o) = judged("futex-no-waiters");
    assert!(
        o.kernel.futex_sleeping < o.allowed,
        "premise of {}: its futex waits return at once, so the kernel has few threads asleep \
         in them: {:.1}",
        c.name,
        o.kernel.futex_sleeping
    );
}

#[test]
fn stress_ng_futex_waker_and_waiter_are_not_a_lock_storm() {
    let (c, o) = judged("stress-ng-futex");
    assert!(
        o.kernel.threads < 4.0 * o.allowed,
        "premise of {}: a few threads ({:.1})",
        c.name,
        o.kernel.threads
    );
}

#[test]
fn two_thread_handoff_is_not_a_lock_storm() {
    let (c, o) = judged("jvm-two-thread-handoff");
    assert!(
        o.kernel.futex_sleeping >= 1.0,
        "premise of {}: the JVM's own threads sleep in futex waits too ({:.1}), so what rules \
         it out is how few threads queue for the hand-offs",
        c.name,
        o.kernel.futex_sleeping
    );
}

#[test]
fn hackbench_messaging_is_not_a_lock_storm() {
    let (c, o) = judged("hackbench-messaging");
    assert!(
        o.kernel.other_sleeping >= 2.0 * o.allowed,
        "premise of {}: its threads sleep in socket reads, not futexes ({:.1} elsewhere, {:.1} \
         in futex)",
        c.name,
        o.kernel.other_sleeping,
        o.kernel.futex_sleeping
    );
}

#[test]
fn redis_under_load_is_not_a_lock_storm() {
    let (c, o) = judged("redis-under-load");
    assert!(
        o.kernel.cpu_cores >= 0.3,
        "premise of {}: redis-benchmark keeps the server busy ({:.2} CPUs)",
        c.name,
        o.kernel.cpu_cores
    );
}

// ---- held out (but for the two lockbench tuning cases): each case's premise is whether it is
// lock-bound, measured by its counterfactual run ----------------------------------------------

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
    if gain < LOCK_BOUND_GAIN && lock_bound_as_observed(case, o) {
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

/// A short critical section on busy CPUs: the lock word and the futex wake-ups cost the most,
/// and the kernel shows most threads runnable (just woken), few asleep at any instant.
#[test]
fn lockbench_short_critical_section_on_busy_cpus_is_a_lock_storm() {
    judged_given("lockbench-short-cs-storm", assert_lock_bound);
}

/// A long critical section on busy CPUs: a convoy, nearly every thread asleep on the mutex,
/// its threads keeping the allowed CPUs just about saturated (running + queued for a CPU ≈ 1
/// per CPU). In the tuning split since it showed the step the rule had at that line (a
/// hand-off rate of 100/s per CPU on one side, 1,000 on the other: 8 of 10 runs right); the
/// rate required now falls smoothly to the saturated one (tests/CORPUS.md).
#[test]
fn lockbench_long_critical_section_on_busy_cpus_is_a_lock_storm() {
    judged_given("lockbench-long-cs-storm", |c, o| {
        assert_lock_bound(c, o);
        assert_threads_queue_on_futexes(c, o);
    });
}

/// Another runtime's convoy near the saturation line, held out from that choice: the JVM's
/// non-fair ReentrantLock around a long section, its waiters parked by `LockSupport.park`
/// (each on a futex of its own) and unparked by the releaser.
#[test]
fn jvm_long_critical_section_convoy_is_a_lock_storm() {
    judged_given("jvm-long-cs-convoy", |c, o| {
        assert_lock_bound(c, o);
        assert_threads_queue_on_futexes(c, o);
    });
}

/// The same with a section ten times longer: a tenth of the hand-offs, below the 1,000 per
/// second per CPU the rule once asked of any container short of saturation.
#[test]
fn jvm_longer_critical_section_convoy_is_a_lock_storm() {
    judged_given("jvm-longer-cs-convoy", |c, o| {
        assert_lock_bound(c, o);
        assert_threads_queue_on_futexes(c, o);
    });
}

/// In the tuning split: the quota storm the thresholds for storms inside quotas may be chosen
/// on.
///
/// Under the kernel matrix's software emulation both vCPUs run on one host thread, so no two
/// threads ever run at once, and the figure that tells a storm whose threads contend while they
/// run from a convoy the quota binds first — the CPUs the container wanted, its CPU time plus
/// its run queues' throttled time — is the emulator's, not the program's: this storm read
/// 1.06–1.35 in guests (2026-11-28; 1.92 on the host), the convoy 1.11 (1.03). Nor can the
/// guest ground the storm in its counterfactual (`corpus::timings_are_real`). There the test
/// asks what the kernel decides: the threads' turns on the futex, the quota run out (cpu.max),
/// `cpu_throttling`, and a verdict that is the storm or the quota-bound convoy as that figure
/// falls on the rule's line.
#[test]
fn lockbench_short_critical_section_inside_a_quota_is_a_lock_storm_and_throttling() {
    const NAME: &str = "quota-lockbench-short-cs-storm";
    if !corpus::timings_are_real() {
        require_bpf();
        let c = case(NAME);
        let o = corpus::run(&c, false);
        let line = corpus::describe(&c, &o);
        eprintln!("{line}");
        let wanted = o.figure("cpus_wanted");
        if wanted > defaults::STORM_SERIAL_MAX_CPUS_WANTED {
            assert!(o.lock_storm, "wrong verdict: {line}");
            assert_quota_storm(&c, &o);
        } else {
            eprintln!(
                "{NAME}: {wanted:.2} CPUs wanted under emulation, at most the rule's line of \
                 {}: the quota-bound convoy's verdict",
                defaults::STORM_SERIAL_MAX_CPUS_WANTED
            );
            assert_threads_take_turns_on_futexes(&c, &o);
            assert_throttled(&c, &o);
            assert!(!o.lock_storm, "wrong verdict: {line}");
            assert_throttling_names_the_convoy(&c, &o);
        }
        return;
    }
    let (c, o) = judged_given(NAME, assert_lock_bound);
    assert_quota_storm(&c, &o);
}

/// The hard negative inside a quota: the kernel shows nearly every thread asleep on the mutex,
/// handing it on thousands of times a second, yet the lock is not what limits the work. The
/// serialized section could use a whole CPU, the quota grants half of one: with a lock per
/// thread the program does the same work per second. Throttling, not a lock storm.
///
/// In the tuning split of the rule for convoys inside a spent quota (`QuotaBound`): it was
/// built with this case and the JVM's in view (tests/CORPUS.md), after both were missed as
/// held-out cases of the rule before it.
#[test]
fn lockbench_long_critical_section_inside_a_quota_is_quota_bound() {
    assert_quota_bound_convoy("quota-lockbench-long-cs");
}

/// The same shape in another runtime: the JVM's slower convoy inside the 0.5-CPU quota. Its
/// counterfactual (a ReentrantLock per thread) does 1.01–1.07× the work through the harness.
/// Tuning, as the one above.
#[test]
fn jvm_convoy_inside_a_quota_is_quota_bound() {
    assert_quota_bound_convoy("quota-jvm-longer-cs-convoy");
}

/// Held out from that rule: a convoy across four processes on one process-shared mutex.
#[test]
fn process_shared_convoy_inside_a_quota_is_quota_bound() {
    assert_quota_bound_convoy("quota-shared-long-cs");
}

/// Held out: a section a tenth as long, so ten times the hand-offs, still quota-bound (a lock
/// per thread did 1.03× and 1.05× by hand).
#[test]
fn medium_critical_section_inside_a_quota_is_quota_bound() {
    assert_quota_bound_convoy("quota-medium-cs");
}

/// Held out: storms of other locks inside the same quota, lock-bound (by hand a lock per
/// thread did 2.3–2.4× and 3.8–4.4× the work).
#[test]
fn adaptive_mutex_inside_a_quota_is_a_lock_storm_and_throttling() {
    let (c, o) = judged_given("quota-adaptive-mutex", assert_lock_bound);
    assert_quota_storm(&c, &o);
}

#[test]
fn rwlock_writers_inside_a_quota_are_a_lock_storm_and_throttling() {
    let (c, o) = judged_given("quota-rwlock-writers", assert_lock_bound);
    assert_quota_storm(&c, &o);
}

/// The share of a program's work the agent's own probes took while it was judged (its work
/// per second alone, before the agent attached, against its work while judged) at which the
/// premise measured alone no longer describes what was judged.
const OBSERVER_COST: f64 = 0.15;

/// Whether the agent's probes took `OBSERVER_COST` or more of the program's work while judged
/// (its work per second as judged against alone, before the agent attached) and its
/// counterfactual, measured alone, does `LOCK_BOUND_GAIN` or more of the work as judged: then
/// the program as observed is lock-bound, whatever it is alone, and `lock_storm` is the truth
/// about what was judged (the agent's own cost is issue #43's defect); says so when it is.
/// Never under emulation (the timings are not the program's).
fn lock_bound_as_observed(c: &Case, o: &Outcome) -> bool {
    let (Some(judged), Some(alone), Some(counterfactual)) = (
        o.work_per_second,
        o.alone_work_per_second,
        o.counterfactual_work_per_second,
    ) else {
        return false;
    };
    let observed = corpus::timings_are_real()
        && judged <= (1.0 - OBSERVER_COST) * alone
        && counterfactual >= LOCK_BOUND_GAIN * judged;
    if observed {
        eprintln!(
            "{}: the agent's probes took {:.0}% of its work while judged ({judged:.0}/s \
             against {alone:.0}/s alone); its counterfactual does {:.2}× the work as judged, \
             so the program as observed is lock-bound (issue #43: the probes' per-event cost)",
            c.name,
            100.0 * (1.0 - judged / alone),
            counterfactual / judged
        );
    }
    observed
}

/// A convoy inside a quota that binds first: the premise (not lock-bound, the threads asleep
/// on the lock, the quota running out), no `lock_storm`, and `cpu_throttling` saying the
/// threads take turns on a lock and the quota binds before it does.
///
/// Unless the agent's probes changed the program it judged: every hand-off runs the futex and
/// scheduler probes inside the quota, and where they cost the program `OBSERVER_COST` of its
/// work or more (quota-medium-cs on an AMD EPYC guest, where BPF calls are dearer: 30–36%,
/// against 5% on Intel), the lock's hand-offs, made dearer by them, bind before the quota
/// does. Then the counterfactual (a lock per thread: no futex calls, so no probes' cost to
/// speak of) measured alone against the program as judged decides: at `LOCK_BOUND_GAIN` or
/// more, the program as observed is lock-bound and `lock_storm` is the truth about it — the
/// agent's own cost is the defect, issue #43, and the test says so. Never under emulation
/// (the timings are not the program's).
#[track_caller]
fn assert_quota_bound_convoy(name: &str) {
    require_bpf();
    let c = case(name);
    let o = corpus::run(&c, false);
    let line = corpus::describe(&c, &o);
    eprintln!("{line}");
    assert_threads_queue_on_futexes(&c, &o);
    assert_throttled(&c, &o);
    // Whether it is lock-bound alone is asked only where the agent judged the program much as
    // it runs alone: a program its probes changed is judged by the premise below, as observed.
    if lock_bound_as_observed(&c, &o) {
        assert!(
            o.lock_storm,
            "{}: lock-bound as observed, yet no lock_storm: {line}",
            c.name
        );
        return;
    }
    assert_not_lock_bound(&c, &o);
    assert!(
        !o.lock_storm,
        "wrong verdict: {line}; finding: {:?}",
        o.storm_finding
    );
    assert_throttling_names_the_convoy(&c, &o);
}

/// A quota-bound convoy's `cpu_throttling` finding says the quota binds before the lock does.
#[track_caller]
fn assert_throttling_names_the_convoy(c: &Case, o: &Outcome) {
    let throttling = *o
        .findings_of("cpu_throttling")
        .first()
        .unwrap_or_else(|| panic!("{}: what limits it is the quota: {:?}", c.name, o.kinds));
    let summary = throttling["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains("so the quota binds before the lock does"),
        "{}: the throttling finding names the convoy: {summary}",
        c.name
    );
}

#[test]
fn pthread_rwlock_writers_are_a_lock_storm() {
    judged_given("lockbench-rwlock-writers", assert_lock_bound);
}

/// glibc's adaptive mutex spins a while before it sleeps: the storm burns CPU in the spin as
/// well as in futex hand-offs.
#[test]
fn adaptive_spinning_mutex_is_a_lock_storm() {
    judged_given("lockbench-adaptive-mutex", assert_lock_bound);
}

/// One lock, four processes: the futex is keyed on the shared page, not on one process's
/// memory.
#[test]
fn process_shared_mutex_is_a_lock_storm() {
    judged_given("lockbench-process-shared-mutex", assert_lock_bound);
}

/// A Go server with no lock in its handler, its runtime sized for a bigger node: GOMAXPROCS=16
/// on 2 CPUs. The Ms the runtime parks and wakes sleep in futex waits, but there is no lock to
/// make uncontended; what the kernel's view must not be mistaken for is a storm, and what it
/// costs is the runtime's sizing. That cost is asserted as the CPU time the server spends per
/// request, against GOMAXPROCS=2 under the same load (1.36–1.45× measured): its requests per
/// second are not the measure, since the load generator shares the 2 CPUs and how the
/// scheduler splits them between the two drew 0.88–1.66× (a CI run failed at 0.88×).
#[test]
fn go_http_server_with_gomaxprocs_above_the_cpus_is_runtime_sizing_not_a_lock_storm() {
    let (c, o) = judged_given("go-http-gomaxprocs-16", |c, o| {
        // Printed, not asserted: requests per second are not the measure here (above).
        if !counterfactual_left_out(c) {
            gain(c, o);
        }
    });
    assert!(
        o.kinds.iter().any(|k| k == "runtime_sizing"),
        "a runtime sized above the CPUs is a runtime_sizing finding naming GOMAXPROCS: {:?}",
        o.kinds
    );
    if counterfactual_left_out(&c) {
        return;
    }
    let ratios = corpus::cpu_per_work_ratios(&c, 3);
    let ratio = corpus::median(ratios.clone());
    eprintln!(
        "{}: CPU per request at GOMAXPROCS=16 over GOMAXPROCS=2: ×{ratio:.2} (median of {ratios:.2?})",
        c.name
    );
    assert!(
        ratio >= 1.1,
        "premise of {}: GOMAXPROCS=16 should spend ≥ 1.1× the CPU per request GOMAXPROCS=2 \
         does, it spent {ratio:.2}× (median of {ratios:.2?})",
        c.name
    );
}

/// A small pool inside a large runtime: the JVM's own threads are many (≥ 4 per CPU), the pool
/// that hands work through its queue is 2 workers and a producer. Cut to the allowed CPUs (a
/// producer and 1 worker) it does less work per second, not more: not lock-bound.
#[test]
fn jvm_small_pool_is_not_a_lock_storm() {
    let (c, o) = judged_given("jvm-small-pool", assert_not_lock_bound);
    assert!(
        o.kernel.threads >= 4.0 * o.allowed,
        "premise of {}: the runtime has ≥ {} threads, the kernel saw {:.1}",
        c.name,
        4.0 * o.allowed,
        o.kernel.threads
    );
}

/// A JVM executor of 200 workers (a servlet container's default pool) fed short tasks by one
/// producer as fast as its bounded queue takes them (held out): 200 workers hand the queue's
/// lock to one another through the kernel, and 2 workers do 1.32–1.39× their work (measured
/// 2026-11-28, tests/CORPUS.md), so it is lock-bound and a storm. Its neighbours of the same
/// shape that are not — 64 CPU-bound workers, 200 workers at a fixed rate — are today's misses,
/// named in tests/CORPUS.md.
#[test]
fn jvm_pool_of_200_fed_as_fast_as_its_queue_takes_is_a_lock_storm() {
    judged_given("jvm-busy-pool-200", assert_lock_bound);
}

/// A pool of workers waiting on a condition variable for what one producer makes: its queue's
/// mutex is hot (each woken worker reacquires it inside its condition wait, and many hand it
/// on), but the producer limits the work: 2 workers do about what 64 do.
#[test]
fn condvar_pool_fed_by_one_producer_is_not_a_lock_storm() {
    judged_given("condvar-pool-64", assert_not_lock_bound);
}

/// Node's libuv pool under ~100 µs crypto tasks: the same shape, in a real runtime (issue #41:
/// `lock_storm` critical in 3 of 3 runs before the condition waits were told apart). Its
/// counterfactual, a pool of 2, measures what the thread count costs, which is not only a
/// lock's: on the AMD guest it did 1.09–1.34× (median 1.22×, fresh-clone CI of 2026-11-28,
/// tests/CORPUS.md) where issue #41 measured 0.95–0.99× — with ~4 threads runnable per CPU.
/// The premise asked is [`assert_not_lock_bound_or_oversubscribed`].
#[test]
fn node_libuv_pool_with_short_tasks_is_not_a_lock_storm() {
    judged_given(
        "node-libuv-pool-100us",
        assert_not_lock_bound_or_oversubscribed,
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
        gain <= NO_CLEAR_GAIN || o.kinds.iter().any(|k| k == "thread_oversubscription"),
        "premise of {}: its counterfactual ({:?}) did {gain:.2}× the work per second, more \
         than {NO_CLEAR_GAIN}×: the thread count costs, which the agent should then name \
         (thread_oversubscription); it found {:?}",
        case.name,
        case.counterfactual,
        o.kinds,
    );
}

/// The same pool under ~400 µs tasks (held out: issue #41 saw a verdict flip at its line).
/// Its premise is asked as "not clearly lock-bound" (its counterfactual below
/// `LOCK_BOUND_GAIN`), not "clearly not": a pool of 2 did 0.98–1.29× its work across five
/// pairs in one fresh-clone CI run on the AMD guest (median 1.13×, 2026-11-28, tests/CORPUS.md)
/// — its event loop, not a lock, sets the work, and the pairs' spread is the two programs
/// sharing 2 CPUs. A `lock_storm` verdict stays wrong for it; none or possible is asked.
#[test]
fn node_libuv_pool_with_longer_tasks_is_not_a_lock_storm() {
    judged_given("node-libuv-pool-400us", assert_not_clearly_lock_bound);
}

#[track_caller]
fn assert_not_clearly_lock_bound(case: &Case, o: &Outcome) {
    if counterfactual_left_out(case) {
        return;
    }
    let gain = gain(case, o);
    assert!(
        gain < LOCK_BOUND_GAIN,
        "premise of {}: not clearly lock-bound, so its counterfactual ({:?}) should do less \
         than {LOCK_BOUND_GAIN}× the work per second; it did {gain:.2}× ({:.0}/s against {:.0}/s)",
        case.name,
        case.counterfactual,
        o.counterfactual_work_per_second.unwrap_or(f64::NAN),
        o.alone_work_per_second.unwrap_or(f64::NAN),
    );
}
