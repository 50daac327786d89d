use super::*;
use stormwatch_common::log2_bucket;

fn hist(values: &[u64]) -> Log2Histogram {
    let mut h = Log2Histogram::ZERO;
    for v in values {
        h.record(*v);
    }
    h
}

#[test]
fn quantile_is_the_upper_edge_of_its_bucket() {
    // 90 values of 1000 ns (bucket 10: 512..=1023), 10 of 100 µs (bucket 17).
    let mut values = vec![1000; 90];
    values.extend([100_000; 10]);
    let h = hist(&values);
    assert_eq!(log2_quantile_ns(&h, 0.5), Some(1023));
    assert_eq!(log2_quantile_ns(&h, 0.9), Some(1023));
    assert_eq!(log2_quantile_ns(&h, 0.91), Some((1 << 17) - 1));
    assert_eq!(log2_quantile_ns(&h, 0.99), Some((1 << 17) - 1));
    // Every recorded value is within (upper/2, upper] of its bucket's upper edge.
    for v in [1u64, 2, 3, 1000, 1024, 100_000, 1 << 29] {
        let upper = bucket_upper_ns(log2_bucket(v));
        assert!(v <= upper && upper < 2 * v, "{v} -> {upper}");
    }
}

/// Only what a cgroup's own threads do counts as their moving: received traffic and a
/// socket that outlived its cgroup do not keep a removed cgroup alive.
#[test]
fn threads_moved_leaves_network_figures_out() {
    let mut w = CgroupWindow::ZERO;
    assert!(!w.threads_moved());
    w.net.rx_packets = 10;
    assert!(!w.threads_moved(), "network figures alone");
    let mut s = w;
    s.sched.voluntary_switches = 1;
    assert!(s.threads_moved());
    let mut f = w;
    f.futex.wakes = 1;
    assert!(f.threads_moved());
    let mut l = w;
    l.locks.count[0] = 1;
    assert!(l.threads_moved());
}

#[test]
fn quantile_of_nothing_is_none_and_zeros_are_zero() {
    assert_eq!(log2_quantile_ns(&Log2Histogram::ZERO, 0.5), None);
    assert_eq!(log2_quantile_ns(&hist(&[0, 0, 0]), 0.99), Some(0));
}

#[test]
fn overflow_bucket_reports_its_lower_edge() {
    let h = hist(&[u64::MAX]);
    assert_eq!(log2_quantile_ns(&h, 0.5), Some(1 << (LOG2_BUCKETS - 2)));
}

fn stats(vol: u64, invol: u64, runq: &[u64]) -> SchedStats {
    SchedStats {
        voluntary_switches: vol,
        involuntary_switches: invol,
        migrations: 1,
        oncpu_ns: 10 * vol,
        offcpu_ns: 5,
        runq: hist(runq),
        ..SchedStats::ZERO
    }
}

#[test]
fn window_is_the_difference_and_new_cgroups_count_whole() {
    let t0 = Instant::now();
    let mut before = Snapshot::empty(t0);
    before.sched.cgroups.insert(1, stats(10, 2, &[100]));
    let mut after = Snapshot::empty(t0 + Duration::from_secs(1));
    after.sched.cgroups.insert(1, stats(15, 3, &[100, 5000]));
    after.sched.cgroups.insert(2, stats(4, 0, &[]));
    let w = Window::between(&before, &after);
    assert_eq!(w.duration, Duration::from_secs(1));
    let one = &w.cgroups[&1].sched;
    assert_eq!(one.voluntary_switches, 5);
    assert_eq!(one.involuntary_switches, 1);
    assert_eq!(one.oncpu_ns, 50);
    assert_eq!(one.runq.count, 1);
    assert_eq!(one.runq.sum_ns, 5000);
    assert_eq!(one.runq.buckets[log2_bucket(5000)], 1);
    assert_eq!(w.cgroups[&2].sched.voluntary_switches, 4);
}

#[test]
fn unchanged_cgroups_are_left_out_and_windows_add_up() {
    let t0 = Instant::now();
    let mut a = Snapshot::empty(t0);
    a.sched.cgroups.insert(1, stats(10, 2, &[100]));
    let mut b = a.clone();
    b.taken_at = t0 + Duration::from_secs(1);
    let mut c = b.clone();
    c.taken_at = t0 + Duration::from_secs(2);
    c.sched.cgroups.insert(1, stats(12, 2, &[100, 7]));
    let w_ab = Window::between(&a, &b);
    assert!(w_ab.cgroups.is_empty());
    let mut total = w_ab.clone();
    total.extend(&Window::between(&b, &c));
    assert_eq!(total.duration, Duration::from_secs(2));
    assert_eq!(total.cgroups[&1], Window::between(&a, &c).cgroups[&1]);
}

#[test]
fn a_regressed_counter_is_counted_and_skipped_not_re_added() {
    let t0 = Instant::now();
    let mut a = Snapshot::empty(t0);
    a.sched.cgroups.insert(1, stats(10, 2, &[]));
    a.sched.cgroups.insert(2, stats(1, 0, &[]));
    let mut b = Snapshot::empty(t0);
    // Cgroup 1 went backwards in one word only; cgroup 2 moved forward.
    let mut one = stats(10, 2, &[]);
    one.migrations = 0;
    b.sched.cgroups.insert(1, one);
    b.sched.cgroups.insert(2, stats(4, 0, &[]));
    let before = UserLoss::CounterRegression.total();
    let w = Window::between(&a, &b);
    assert_eq!(w.counter_regressions, 1);
    assert!(
        !w.cgroups.contains_key(&1),
        "no figure for the regressed key"
    );
    assert_eq!(w.cgroups[&2].sched.voluntary_switches, 3);
    // Process-wide (other tests may add theirs meanwhile).
    assert!(UserLoss::CounterRegression.total() > before);
    // From the regressed value on, the key counts normally again.
    let mut c = Snapshot::empty(t0);
    let mut later = one;
    later.voluntary_switches += 5;
    c.sched.cgroups.insert(1, later);
    let w = Window::between(&b, &c);
    assert_eq!(w.counter_regressions, 0);
    assert_eq!(w.cgroups[&1].sched.voluntary_switches, 5);
    let mut total = Window::empty();
    total.extend(&Window::between(&a, &b));
    total.extend(&w);
    assert_eq!(total.counter_regressions, 1);
}

#[test]
fn cpus_used_are_the_cpus_whose_oncpu_time_moved() {
    let t0 = Instant::now();
    let mut a = Snapshot::empty(t0);
    a.sched.oncpu_by_cpu.insert(1, vec![100, 0, 50, 0]);
    let mut b = Snapshot::empty(t0);
    b.sched.oncpu_by_cpu.insert(1, vec![100, 10, 70, 0]);
    b.sched.oncpu_by_cpu.insert(2, vec![0, 0, 0, 5]);
    let w = Window::between(&a, &b);
    assert_eq!(w.cgroups[&1].cpus_used(), 2);
    assert_eq!(w.cgroups[&2].cpus_used(), 1);
    // Over two windows, distinct CPUs, not a sum.
    let mut c = b.clone();
    c.sched.oncpu_by_cpu.insert(1, vec![200, 20, 70, 0]);
    let mut total = w.clone();
    total.extend(&Window::between(&b, &c));
    assert_eq!(total.cgroups[&1].cpus_used(), 3);
}

#[test]
fn remote_share_is_of_the_wakeups_whose_kind_is_known() {
    let mut c = CgroupWindow::ZERO;
    assert_eq!(c.remote_wakeup_share(), None);
    for _ in 0..3 {
        c.sched.wake_remote.record(1000);
    }
    c.sched.wake_local.record(10);
    assert_eq!(c.wakeups(), 4);
    assert_eq!(c.remote_wakeup_share(), Some(0.75));
}

fn hot(waits: u64, wait_ns: u64, max: u64) -> HotFutexValue {
    HotFutexValue {
        waits,
        wait_ns,
        max_wait_ns: max,
        comm: *b"java\0\0\0\0\0\0\0\0\0\0\0\0",
        ..HotFutexValue::ZERO
    }
}

#[test]
fn futex_and_lock_figures_join_the_cgroup_window() {
    let t0 = Instant::now();
    let mut a = Snapshot::empty(t0);
    let mut b = Snapshot::empty(t0 + Duration::from_secs(1));
    let mut f = FutexStats::ZERO;
    f.wait.record(1000);
    f.wakes = 3;
    b.futex.cgroups.insert(5, f);
    let mut l = LockStats::ZERO;
    l.count[0] = 2;
    l.wait_ns[0] = 900;
    a.locks.cgroups.insert(5, l);
    l.count[0] = 7;
    l.wait_ns[0] = 1900;
    b.locks.cgroups.insert(5, l);
    let w = Window::between(&a, &b);
    let c = &w.cgroups[&5];
    assert_eq!(c.futex.wait.count, 1);
    assert_eq!(c.futex.wakes, 3);
    assert_eq!(c.locks.count[0], 5);
    assert_eq!(c.locks.wait_ns[0], 1000);
    assert_eq!(c.sched, SchedStats::ZERO);
}

#[test]
fn hot_futexes_without_new_waits_are_not_activity() {
    let key = HotFutexKey {
        cgroup_id: 1,
        uaddr: 0x1000,
        tgid: 42,
        _pad: 0,
    };
    let t0 = Instant::now();
    let mut a = Snapshot::empty(t0);
    a.futex.hot.insert(key, hot(10, 500, 90));
    let mut b = a.clone();
    assert!(Window::between(&a, &b).hot_futexes.is_empty());
    b.futex.hot.insert(key, hot(14, 900, 200));
    let w = Window::between(&a, &b);
    assert_eq!(w.hot_futexes[&key].waits, 4);
    assert_eq!(w.hot_futexes[&key].wait_ns, 400);
    assert_eq!(w.hot_futexes[&key].max_wait_ns, 200);
    let mut total = Window::empty();
    total.extend(&w);
    total.extend(&w);
    assert_eq!(total.hot_futexes[&key].waits, 8);
    assert_eq!(total.hot_futexes[&key].max_wait_ns, 200);
}

#[test]
fn forgetting_a_cgroup_drops_all_its_keys() {
    let mut a = Snapshot::empty(Instant::now());
    a.sched.cgroups.insert(1, stats(1, 1, &[]));
    a.futex.cgroups.insert(1, FutexStats::ZERO);
    a.futex.hot.insert(
        HotFutexKey {
            cgroup_id: 1,
            uaddr: 1,
            tgid: 1,
            _pad: 0,
        },
        hot(1, 1, 1),
    );
    a.sched.cgroups.insert(2, stats(1, 1, &[]));
    a.forget_cgroup(1);
    assert_eq!(a.cgroup_ids().copied().collect::<Vec<_>>(), [2]);
    assert!(a.futex.hot.is_empty());
}

/// The Go mutex figures are a part of the snapshot like the others: windowed by the one delta,
/// added through the cgroup's `add`, and taken anew once a burst's counts are read.
#[test]
fn go_mutex_figures_are_windowed_like_every_part() {
    let go = |probed_ns, contended_locks, handing_unlocks| GoMutexFigures {
        probed_ns,
        contended_locks,
        handing_unlocks,
        ..GoMutexFigures::ZERO
    };
    let t0 = Instant::now();
    let mut before = Snapshot::empty(t0);
    before.go_mutex.cgroups.insert(7, go(100, 10, 5));
    let mut after = Snapshot::empty(t0 + Duration::from_secs(1));
    after.go_mutex.cgroups.insert(7, go(100, 10, 5));
    // Between bursts nothing moves: no part for the cgroup.
    let mut w = Window::between(&before, &after);
    assert!(!w.cgroups.contains_key(&7));
    // A burst in the tick: its counts are read into the snapshot, and the window's part is
    // theirs; a cgroup new to the map contributes everything it has.
    after.go_mutex.cgroups.insert(7, go(200, 30, 12));
    after.go_mutex.cgroups.insert(9, go(100, 4, 1));
    w.retake_go_mutex(&before, &after);
    assert_eq!(w.cgroups[&7].go_mutex, go(100, 20, 7));
    assert_eq!(w.cgroups[&9].go_mutex, go(100, 4, 1));
    assert_eq!(
        w.cgroups[&7].go_mutex.contended_locks_per_second(),
        Some(2e8)
    );
    // Two windows add up, as every part does.
    let mut total = w.cgroups[&7];
    total.add(&w.cgroups[&7]);
    assert_eq!(total.go_mutex, go(200, 40, 14));
    // A forgotten cgroup starts from zero.
    after.forget_cgroup(7);
    assert!(!after.go_mutex.cgroups.contains_key(&7));
}
