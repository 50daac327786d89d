use std::sync::{Arc, Mutex};

use super::*;
use crate::diagnose::Thresholds;

/// A cgroupfs of synthetic cgroups: path → limits and processes, with a count of reads.
#[derive(Default)]
struct Fake {
    cgroups: Mutex<HashMap<String, Limits>>,
    processes: Mutex<HashMap<String, Vec<u32>>>,
    reads: Mutex<Vec<&'static str>>,
}

impl Fake {
    fn set(&self, path: &str, l: Limits) {
        self.cgroups.lock().unwrap().insert(path.to_owned(), l);
    }
}

impl ResourceReader for Arc<Fake> {
    fn limits(&self, path: &str) -> Limits {
        self.reads.lock().unwrap().push("limits");
        self.cgroups
            .lock()
            .unwrap()
            .get(path)
            .cloned()
            .unwrap_or_default()
    }
    fn threads(&self, path: &str) -> Option<u64> {
        self.reads.lock().unwrap().push("threads");
        self.cgroups.lock().unwrap().get(path)?.threads
    }
    fn counters(
        &self,
        path: &str,
        previous: &CpuCounters,
        throttling: bool,
        pressure: bool,
    ) -> CpuCounters {
        self.reads.lock().unwrap().push("counters");
        let now = self
            .cgroups
            .lock()
            .unwrap()
            .get(path)
            .map(|l| l.counters)
            .unwrap_or_default();
        let mut c = *previous;
        if throttling {
            c.periods = now.periods;
            c.throttled_periods = now.throttled_periods;
            c.throttled_seconds = now.throttled_seconds;
        }
        if pressure {
            c.cpu_pressure_some_seconds = now.cpu_pressure_some_seconds;
            c.cpu_pressure_full_seconds = now.cpu_pressure_full_seconds;
        }
        c
    }
    fn processes(&self, path: &str) -> Vec<u32> {
        self.processes
            .lock()
            .unwrap()
            .get(path)
            .cloned()
            .unwrap_or_default()
    }
}

fn tick(secs: u64, cgroups: &[(u64, u64)]) -> Window {
    let mut w = Window::empty();
    w.duration = Duration::from_secs(secs);
    for (id, switches) in cgroups {
        let mut c = CgroupWindow::ZERO;
        c.sched.voluntary_switches = *switches;
        w.cgroups.insert(*id, c);
    }
    w
}

fn options(span: Option<u64>, interval: u64) -> SessionOptions {
    SessionOptions {
        span: span.map(Duration::from_secs),
        interval: Duration::from_secs(interval),
        thresholds: Thresholds::default(),
        host_cpus: 2,
        window_pressure: span.is_none(),
        network: None,
        cpu_manager_state: vec!["/nonexistent/cpu_manager_state".into()],
        jvm_thread_dumps: false,
        jvm_virtual_threads: false,
    }
}

fn threads(n: u64) -> Limits {
    Limits {
        threads: Some(n),
        ..Limits::default()
    }
}

fn path(id: u64) -> Option<&'static str> {
    match id {
        1 => Some("a"),
        2 => Some("b"),
        _ => None,
    }
}

#[test]
fn the_facts_carry_the_host_over_the_window() {
    let fake = Arc::new(Fake::default());
    fake.set("a", threads(2));
    let mut s = Session::new(options(None, 1), Some(Box::new(fake)), []);
    assert_eq!(
        s.steal(),
        None,
        "no tick yet: no window to measure steal over"
    );
    s.observe(&tick(1, &[(1, 10)]), path, Instant::now());
    let steal = s.steal().expect("steal between the start and the tick");
    assert!(steal.seconds >= 0.0 && steal.share.is_none_or(|x| (0.0..=1.0).contains(&x)));
    let paths = HashMap::from([(1, "a".to_owned())]);
    let facts = s.facts(&s.window(), &paths);
    let host = facts[0].host.as_ref().expect("the host context");
    assert_eq!(host.hypervisor, s.host().hypervisor);
}

/// The kubelet's CPU manager checkpoint is read with the facts: the node's policy for every
/// container, and the CPUs of its own for a container of a pod it pinned (by the pod UID in its
/// cgroup path, and its cpuset being that pod's assignment).
#[test]
fn the_facts_say_which_containers_the_kubelet_pinned() {
    const POD: &str = "8d2c1e5a-1111-2222-3333-444455556666";
    let pinned = format!(
        "kubepods.slice/kubepods-pod{}.slice/cri-containerd-{}.scope",
        POD.replace('-', "_"),
        "a".repeat(64)
    );
    let shared = format!(
        "kubepods.slice/kubepods-pod{}.slice/cri-containerd-{}.scope",
        POD.replace('-', "_"),
        "b".repeat(64)
    );
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("cpu_manager_state");
    std::fs::write(
        &state,
        format!(
            r#"{{"policyName":"static","defaultCpuSet":"0,5-7","entries":{{"{POD}":{{"app":"1-4"}}}},"checksum":1}}"#
        ),
    )
    .unwrap();
    let fake = Arc::new(Fake::default());
    let cpuset = |cpus: Vec<u32>| Limits {
        cpuset_cpus: Some(cpus),
        ..threads(2)
    };
    fake.set(&pinned, cpuset(vec![1, 2, 3, 4]));
    fake.set(&shared, cpuset(vec![0, 5, 6, 7]));
    let mut opts = options(None, 1);
    opts.host_cpus = 8;
    opts.cpu_manager_state = vec![dir.path().join("missing"), state];
    let mut s = Session::new(opts, Some(Box::new(fake)), []);
    let paths = HashMap::from([(1, pinned), (2, shared)]);
    s.observe(
        &tick(1, &[(1, 10), (2, 10)]),
        |id| paths.get(&id).map(String::as_str),
        Instant::now(),
    );
    let facts = s.facts(&s.window(), &paths);
    let of = |id: u64| {
        &facts
            .iter()
            .find(|f| f.cgroup_id == id)
            .unwrap()
            .cpu_pinning
    };
    assert_eq!(of(1).node_policy.as_deref(), Some("static"));
    assert_eq!(of(1).exclusive_cpus, Some(vec![1, 2, 3, 4]));
    assert_eq!(of(2).node_policy.as_deref(), Some("static"));
    assert_eq!(of(2).exclusive_cpus, None, "the shared pool is not its own");
    // The same in the limits the daemon exports (`stormwatch_cpu_exclusive_cpus`).
    let latest = s.latest_limits([&1, &2]);
    assert_eq!(latest[&1].exclusive_cpus, Some(vec![1, 2, 3, 4]));
    assert_eq!(latest[&2].exclusive_cpus, None);

    // No checkpoint: no policy known, nothing pinned by the kubelet.
    let facts = {
        let fake = Arc::new(Fake::default());
        let mut s = Session::new(options(None, 1), Some(Box::new(fake)), []);
        s.observe(&tick(1, &[(1, 10)]), path, Instant::now());
        s.facts(&s.window(), &HashMap::from([(1, "a".to_owned())]))
    };
    assert_eq!(
        facts[0].cpu_pinning,
        crate::identity::cpumanager::CpuPinning::default()
    );
}

#[test]
fn the_window_slides_by_steps() {
    let fake = Arc::new(Fake::default());
    let mut s = Session::new(options(Some(30), 5), Some(Box::new(fake)), []);
    let t0 = Instant::now();
    let mut completed = 0;
    for i in 0..12 {
        let now = t0 + Duration::from_secs(5 * (i + 1));
        if s.observe(&tick(5, &[(1, i)]), path, now) {
            completed += 1;
        }
    }
    // 60 s in 10 s steps: six steps completed, the last three (30 s) kept.
    assert_eq!(completed, 6);
    let w = s.window();
    assert_eq!(w.duration, Duration::from_secs(30));
    assert_eq!(w.cgroups[&1].sched.voluntary_switches, (6..12).sum::<u64>());
    assert!(s.contains(1));
    assert!(!s.contains(2));
}

#[test]
fn a_storm_after_long_calm_is_counted_in_the_tick_it_starts() {
    let fake = Arc::new(Fake::default());
    fake.set("a", threads(2));
    let mut s = Session::new(options(Some(30), 5), Some(Box::new(fake.clone())), []);
    let t0 = Instant::now();
    let mut now = t0;
    // Ten minutes of calm: one busy thread, steady switch rate.
    for _ in 0..120 {
        now += Duration::from_secs(5);
        s.observe(&tick(5, &[(1, 500)]), path, now);
    }
    let reads_before = fake.reads.lock().unwrap().len();
    // At most one re-count a minute while calm, plus the limits refreshes.
    assert!(
        reads_before <= 25,
        "{reads_before} reads in 10 calm minutes"
    );
    // The storm: 64 threads, switch rate up 100x.
    fake.set("a", threads(66));
    let mut flagged_threads = Vec::new();
    for _ in 0..6 {
        now += Duration::from_secs(5);
        s.observe(&tick(5, &[(1, 50_000)]), path, now);
        let w = s.window();
        flagged_threads.push(s.window_limits(&w)[&1].threads.unwrap());
    }
    // Re-counted at once; after a span (30 s) the window mean is the storm's count.
    assert!(flagged_threads[0] > 2, "{flagged_threads:?}");
    assert_eq!(*flagged_threads.last().unwrap(), 66, "{flagged_threads:?}");
}

#[test]
fn threads_are_a_time_weighted_mean_over_the_window() {
    let fake = Arc::new(Fake::default());
    fake.set("a", threads(10));
    let mut s = Session::new(options(None, 1), Some(Box::new(fake.clone())), []);
    let t0 = Instant::now();
    s.observe(&tick(1, &[(1, 100)]), path, t0 + Duration::from_secs(1));
    fake.set("a", threads(40));
    // Activity x100: re-counted.
    s.observe(&tick(3, &[(1, 30_000)]), path, t0 + Duration::from_secs(4));
    let w = s.window();
    // (10 * 1 + 40 * 3) / 4 = 32.5 → 33
    assert_eq!(s.window_limits(&w)[&1].threads, Some(33));
}

#[test]
fn throttling_is_relative_to_the_window_and_new_cgroups_count_from_zero() {
    let fake = Arc::new(Fake::default());
    let quota = |p: u64, secs: f64| Limits {
        cpu_quota_cores: Some(0.5),
        counters: CpuCounters {
            periods: Some(2 * p),
            throttled_periods: Some(p),
            throttled_seconds: Some(secs),
            ..CpuCounters::default()
        },
        ..Limits::default()
    };
    fake.set("a", quota(100, 10.0));
    // "a" existed at start; "b" is created later, with counters from zero.
    let mut s = Session::new(
        options(Some(20), 10),
        Some(Box::new(fake.clone())),
        [(1, "a")],
    );
    let t0 = Instant::now();
    fake.set("a", quota(110, 11.0));
    fake.set("b", quota(5, 0.5));
    s.observe(
        &tick(10, &[(1, 1), (2, 1)]),
        path,
        t0 + Duration::from_secs(10),
    );
    let w = s.window();
    let l = s.window_limits(&w);
    assert_eq!(l[&1].counters.throttled_periods, Some(10));
    assert_eq!(l[&2].counters.throttled_periods, Some(5));
    // Two more steps: the window (20 s) starts after the first one.
    fake.set("a", quota(130, 13.0));
    s.observe(&tick(10, &[(1, 1)]), path, t0 + Duration::from_secs(20));
    fake.set("a", quota(170, 17.0));
    s.observe(&tick(10, &[(1, 1)]), path, t0 + Duration::from_secs(30));
    let w = s.window();
    let l = s.window_limits(&w);
    assert_eq!(w.duration, Duration::from_secs(20));
    assert_eq!(l[&1].counters.throttled_periods, Some(60));
    assert!((l[&1].counters.throttled_seconds.unwrap() - 6.0).abs() < 1e-9);
    // Since the session started, for the exported counters.
    assert_eq!(
        s.latest_limits([&1])[&1].counters.throttled_periods,
        Some(70)
    );
}

/// The counters of a window are read at its edges, not on the limits' refresh period: a
/// one-off window of a few seconds, ending between two refreshes, still counts every
/// period throttled up to its last tick, and every pressure second.
#[test]
fn a_windows_counters_are_read_at_its_edges() {
    let fake = Arc::new(Fake::default());
    let at = |t: u64| Limits {
        cpu_quota_cores: Some(0.5),
        ancestor_quota: None,
        cpuset_cpus: None,
        threads: Some(32),
        exclusive_cpus: None,
        counters: CpuCounters {
            periods: Some(1000 + 10 * t),
            throttled_periods: Some(500 + 10 * t),
            throttled_seconds: Some(50.0 + 1.5 * t as f64),
            cpu_pressure_some_seconds: Some(7.0 + 0.9 * t as f64),
            cpu_pressure_full_seconds: Some(3.0 + 0.5 * t as f64),
        },
    };
    fake.set("a", at(0));
    let mut s = Session::new(options(None, 1), Some(Box::new(fake.clone())), [(1, "a")]);
    let t0 = Instant::now();
    for t in 1..=6 {
        fake.set("a", at(t));
        s.observe(&tick(1, &[(1, 100)]), path, t0 + Duration::from_secs(t));
    }
    let w = s.window();
    let c = s.window_limits(&w)[&1].counters;
    assert_eq!(c.periods, Some(60));
    assert_eq!(c.throttled_periods, Some(60));
    assert_eq!(c.throttled_period_share(), Some(1.0));
    assert!((c.throttled_seconds.unwrap() - 9.0).abs() < 1e-9);
    assert!((c.cpu_pressure_some_seconds.unwrap() - 5.4).abs() < 1e-9);
    assert!((c.cpu_pressure_full_seconds.unwrap() - 3.0).abs() < 1e-9);
    let (start, end) = s.window_edges();
    assert!(start <= end);

    // A sliding window (the daemon's) reads them when a step completes, and is judged
    // then: its figures are those of the steps it holds, however the refreshes fall.
    fake.set("a", at(0));
    let mut s = Session::new(
        options(Some(6), 1),
        Some(Box::new(fake.clone())),
        [(1, "a")],
    );
    let mut judged = 0;
    for t in 1..=8 {
        fake.set("a", at(t));
        let done = s.observe(&tick(1, &[(1, 100)]), path, t0 + Duration::from_secs(t));
        if done {
            let w = s.window();
            let c = s.window_limits(&w)[&1].counters;
            assert_eq!(
                c.throttled_periods,
                Some(10 * w.duration.as_secs()),
                "at {t} s, over {:?}",
                w.duration
            );
            judged += 1;
        }
    }
    assert_eq!(judged, 4, "a step every 2 s");
}

/// A quota's period timer counts a period or two after its cgroup last ran (the one that
/// finds it idle): the edge after its last activity reads them, and the one after that no more.
#[test]
fn a_quotas_periods_after_its_cgroup_stopped_are_read_until_they_rest() {
    let fake = Arc::new(Fake::default());
    let at = |periods: u64| Limits {
        cpu_quota_cores: Some(0.5),
        counters: CpuCounters {
            periods: Some(periods),
            throttled_periods: Some(periods.min(30)),
            throttled_seconds: Some(0.0),
            ..CpuCounters::default()
        },
        ..Limits::default()
    };
    fake.set("a", at(0));
    let mut s = Session::new(options(None, 1), Some(Box::new(fake.clone())), [(1, "a")]);
    let t0 = Instant::now();
    fake.set("a", at(10));
    s.observe(&tick(1, &[(1, 100)]), path, t0 + Duration::from_secs(1));
    // It stopped in that tick; its timer went on for two periods.
    fake.set("a", at(12));
    s.observe(&tick(1, &[]), path, t0 + Duration::from_secs(2));
    let counters = |s: &Session| s.window_limits(&s.window())[&1].counters;
    assert_eq!(counters(&s).periods, Some(12));
    // Its throttling moved at that read, so the next edge reads it again: three more periods
    // counted late (a timer firing late in a slow guest).
    fake.set("a", at(15));
    s.observe(&tick(1, &[]), path, t0 + Duration::from_secs(3));
    assert_eq!(counters(&s).periods, Some(15));
    // Unmoved at that read: at rest, not read again (its counters cannot move).
    s.observe(&tick(1, &[]), path, t0 + Duration::from_secs(4));
    assert_eq!(counters(&s).periods, Some(15));
    let reads = fake.reads.lock().unwrap().len();
    s.observe(&tick(1, &[]), path, t0 + Duration::from_secs(5));
    assert_eq!(fake.reads.lock().unwrap().len(), reads);
    assert_eq!(counters(&s).periods, Some(15));
}

#[test]
fn gone_cgroups_are_forgotten_once_out_of_the_window() {
    let fake = Arc::new(Fake::default());
    fake.set("a", threads(1));
    let mut s = Session::new(options(Some(10), 5), Some(Box::new(fake)), []);
    let t0 = Instant::now();
    s.observe(&tick(5, &[(1, 1)]), path, t0 + Duration::from_secs(5));
    s.forget(|_| false);
    assert!(s.contains(1), "still in the window");
    assert!(!s.latest_limits([&1]).is_empty());
    for i in 2..6 {
        s.observe(&tick(5, &[]), path, t0 + Duration::from_secs(5 * i));
    }
    s.forget(|_| false);
    assert!(!s.contains(1));
    assert!(s.latest_limits([&1]).is_empty());
}

fn native(tgid: u32, comm: &str) -> crate::identity::runtime::ProcessRuntime {
    crate::identity::runtime::ProcessRuntime {
        tgid,
        comm: comm.into(),
        runtime: crate::identity::runtime::Runtime::Native,
        cpus: None,
        gc_threads: None,
        threads: None,
        server: None,
    }
}

/// A spinning server's process is added to its cgroup's, once, from the cgroup's process
/// list; other processes, and cgroups of the window without a path, bring nothing.
#[test]
fn servers_that_spin_are_found_in_their_cgroups_processes() {
    let w = tick(1, &[(7, 1), (8, 1), (9, 1)]);
    let paths = HashMap::from([(7, "/a".to_owned()), (8, "/b".to_owned())]);
    let fake = Arc::new(Fake::default());
    fake.processes.lock().unwrap().extend([
        ("/a".to_owned(), vec![100, 101, 102]),
        ("/b".to_owned(), vec![200]),
    ]);
    // Process 100 came with the hand-offs already; 101 is the server; the rest are not.
    let mut out = HashMap::from([(
        7,
        (
            crate::diagnose::Handoffs::default(),
            vec![native(100, "redis-server")],
        ),
    )]);
    let asked = std::cell::RefCell::new(Vec::new());
    handoffs::add_sized_servers_with(&w, &paths, &fake, &mut out, |tgid| {
        asked.borrow_mut().push(tgid);
        (tgid == 101).then(|| native(101, "redis-server"))
    });
    let tgids = |id: u64| out[&id].1.iter().map(|p| p.tgid).collect::<Vec<_>>();
    assert_eq!(tgids(7), [100, 101]);
    assert!(!out.contains_key(&8), "no server in /b");
    assert!(!out.contains_key(&9), "no path, not looked at");
    let mut asked = asked.into_inner();
    asked.sort_unstable();
    assert_eq!(
        asked,
        [101, 102, 200],
        "a process the hand-offs brought is not read again"
    );
}
