//! The lock-storm verdict on real workloads that stormwatch did not write (see
//! `stormwatch_tests::corpus`): each case must get its verdict, and the premise that makes it
//! lock-bound or not is checked against what the kernel says its threads did — never against
//! the agent's own figures.

use stormwatch_tests::{
    corpus::{self, Case, Expect, Outcome},
    require_bpf,
};

fn case(name: &str) -> Case {
    corpus::cases()
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no corpus case {name}"))
}

/// Runs a case and checks its verdict; returns the outcome for premise checks.
#[track_caller]
fn judged(name: &str) -> (Case, Outcome) {
    require_bpf();
    let case = case(name);
    let o = corpus::run(&case, false);
    let line = corpus::describe(&case, &o);
    eprintln!("{line}");
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

#[track_caller]
fn assert_quota_storm(case: &Case, o: &Outcome) {
    assert_threads_queue_on_futexes(case, o);
    let throttled = o
        .kernel
        .throttled_share
        .expect("a quota case reads its throttling");
    assert!(
        throttled >= 0.25,
        "premise of {}: the quota should throttle it ≥ 25% of the time (cpu.stat), saw {:.0}%",
        case.name,
        100.0 * throttled
    );
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

#[test]
fn sysbench_mutex_storm_is_a_lock_storm() {
    let (c, o) = judged("sysbench-mutex-storm");
    assert_threads_queue_on_futexes(&c, &o);
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
    let (c, o) = judged("jvm-synchronized-storm");
    assert_threads_queue_on_futexes(&c, &o);
}

/// The Go runtime parks goroutines itself; the kernel sees its Ms (threads) sleeping on futexes
/// and woken for every goroutine hand-off.
#[test]
fn go_mutex_storm_with_gomaxprocs_above_the_cpus_is_a_lock_storm() {
    let (c, o) = judged("go-mutex-storm");
    assert_threads_queue_on_futexes(&c, &o);
}

#[test]
fn mutex_storm_inside_a_cfs_quota_is_a_lock_storm_and_throttling() {
    let (c, o) = judged("quota-mutex-storm");
    assert_quota_storm(&c, &o);
}

#[test]
fn jvm_storm_inside_a_cfs_quota_is_a_lock_storm_and_throttling() {
    let (c, o) = judged("quota-jvm-storm");
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
    let throttled = o
        .kernel
        .throttled_share
        .expect("a quota case reads its throttling");
    assert!(
        throttled >= 0.25,
        "premise of {}: throttled ≥ 25% of the time, cpu.stat says {:.0}%",
        c.name,
        100.0 * throttled
    );
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
