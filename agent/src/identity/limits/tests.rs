use super::*;

use crate::identity::mountinfo::fixtures::{HYBRID, PURE_V2};

/// Inside a privileged container on a hybrid host: subtree bind mounts first, then the
/// host's hierarchy mounted under /host.
const CONTAINER_HYBRID: &str = "\
40 30 0:28 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
41 30 0:32 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct
42 30 0:32 / /host/sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
";

fn roots(layout: &CgroupLayout) -> Vec<(&str, &str)> {
    let mut v: Vec<_> = layout
        .v1_roots
        .iter()
        .filter_map(|(c, p)| Some((c.as_str(), p.to_str()?)))
        .collect();
    v.sort();
    v
}

#[test]
fn layout_from_hybrid_mountinfo() {
    let layout = CgroupLayout::from_mountinfo(HYBRID).expect("has v2");
    assert_eq!(layout.v2_root, PathBuf::from("/sys/fs/cgroup/unified"));
    assert_eq!(
        roots(&layout),
        vec![
            ("cpu", "/sys/fs/cgroup/cpu,cpuacct"),
            ("cpuacct", "/sys/fs/cgroup/cpu,cpuacct"),
            ("cpuset", "/sys/fs/cgroup/cpuset"),
            ("memory", "/sys/fs/cgroup/memory"),
            ("net_cls", "/sys/fs/cgroup/net_cls,net_prio"),
            ("net_prio", "/sys/fs/cgroup/net_cls,net_prio"),
            ("pids", "/sys/fs/cgroup/pids"),
        ]
    );
}

#[test]
fn layout_from_pure_v2_mountinfo() {
    let layout = CgroupLayout::from_mountinfo(PURE_V2).expect("has v2");
    assert_eq!(layout.v2_root, PathBuf::from("/sys/fs/cgroup"));
    assert!(layout.v1_roots.is_empty());
}

#[test]
fn layout_prefers_hierarchy_root_mounts() {
    let layout = CgroupLayout::from_mountinfo(CONTAINER_HYBRID).expect("has v2");
    assert_eq!(
        layout.v1_roots.get("cpu"),
        Some(&PathBuf::from("/host/sys/fs/cgroup/cpu,cpuacct"))
    );
}

#[test]
fn layout_needs_v2() {
    let v1_only = "35 30 0:32 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
    assert!(matches!(
        CgroupLayout::from_mountinfo(v1_only),
        Err(CgroupError::NoV2Hierarchy)
    ));
    assert!(CgroupLayout::from_mountinfo("").is_err());
    // Truncated cgroup lines are skipped, not a panic.
    let odd = format!("{PURE_V2}1 2 - cgroup\n1 - cgroup x rw,cpu\n - cgroup cgroup rw,cpu\n");
    let layout = CgroupLayout::from_mountinfo(&odd).expect("has v2");
    assert!(layout.v1_roots.is_empty());
}

#[test]
fn cpu_max() {
    assert_eq!(parse_cpu_max("150000 100000\n"), Some(1.5));
    assert_eq!(parse_cpu_max("50000 100000"), Some(0.5));
    assert_eq!(parse_cpu_max("max 100000\n"), None);
    assert_eq!(parse_cpu_max("100000 0"), None);
    assert_eq!(parse_cpu_max("100000"), None);
    assert_eq!(parse_cpu_max("-1 100000"), None);
    assert_eq!(parse_cpu_max("1 2 3"), None);
    assert_eq!(parse_cpu_max(""), None);
}

#[test]
fn cfs_quota() {
    assert_eq!(parse_cfs_quota("200000\n", "100000\n"), Some(2.0));
    assert_eq!(parse_cfs_quota("-1\n", "100000\n"), None);
    assert_eq!(parse_cfs_quota("50000", "0"), None);
    assert_eq!(parse_cfs_quota("x", "100000"), None);
    assert_eq!(parse_cfs_quota("50000", ""), None);
}

#[test]
fn cpu_lists() {
    assert_eq!(
        parse_cpu_list("0-3,8,10-11\n"),
        Some(vec![0, 1, 2, 3, 8, 10, 11])
    );
    assert_eq!(parse_cpu_list("5"), Some(vec![5]));
    assert_eq!(parse_cpu_list("3,1-2,2"), Some(vec![1, 2, 3]));
    for bad in [
        "",
        "\n",
        "3-1",
        "0-",
        "-1",
        "a",
        "0,,1",
        "0-3:2",
        "1-2-3",
        "0-4294967295",
        "99999999999",
        "+1",
    ] {
        assert_eq!(parse_cpu_list(bad), None, "{bad:?}");
    }
    // Many overlapping full ranges: rejected without building a huge list.
    let many = ["0-65535"; 10].join(",");
    assert_eq!(parse_cpu_list(&many), None);
    assert_eq!(parse_cpu_list("0-65535").map(|v| v.len()), Some(65_536));
}

#[test]
fn counts_and_numbers() {
    assert_eq!(count_ids("1\n2\n3\n"), Some(3));
    assert_eq!(count_ids(""), Some(0));
    assert_eq!(count_ids("1\nx\n"), None);
    assert_eq!(parse_u64("42\n"), Some(42));
    assert_eq!(parse_u64("max"), None);
}

#[test]
fn cpu_stat_keys() {
    let v2 = "usage_usec 100\nnr_periods 10\nnr_throttled 3\nthrottled_usec 2500000\n";
    assert_eq!(flat_keyed(v2, "nr_throttled"), Some(3));
    assert_eq!(flat_keyed(v2, "throttled_usec"), Some(2_500_000));
    assert_eq!(flat_keyed(v2, "nr_bursts"), None);
    assert_eq!(flat_keyed("nr_throttled x\n", "nr_throttled"), None);
    assert_eq!(flat_keyed("nr_throttled\n", "nr_throttled"), None);
    // Exact key match: nr_throttled is not a prefix match for nr_throttled_x.
    assert_eq!(flat_keyed("nr_throttled_x 5\n", "nr_throttled"), None);
}

#[test]
fn pressure() {
    let text = "some avg10=1.50 avg60=0.75 avg300=0.10 total=123456\n\
                full avg10=0.25 avg60=0.00 avg300=0.00 total=789\n";
    let p = parse_pressure(text);
    assert_eq!(
        p.some,
        Some(PressureLine {
            avg10: 1.5,
            avg60: 0.75,
            avg300: 0.1,
            total_usec: 123_456
        })
    );
    assert_eq!(p.full.map(|l| (l.avg10, l.total_usec)), Some((0.25, 789)));
    // Pre-5.13 kernels: no full line for CPU.
    let p = parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n");
    assert!(p.some.is_some() && p.full.is_none());
    for bad in [
        "some avg10=1.0 avg60=1.0 total=5",
        "some avg10=nan avg60=1.0 avg300=1.0 total=5",
        "some avg10=1.0 avg60=1.0 avg300=1.0 total=-5",
        "some avg10=101 avg60=1.0 avg300=1.0 total=5",
        "some avg10 avg60=1.0 avg300=1.0 total=5",
    ] {
        assert_eq!(parse_pressure(bad), Pressure::default(), "{bad}");
    }
}

fn write_files(dir: &Path, files: &[(&str, &str)]) {
    std::fs::create_dir_all(dir).expect("mkdir");
    for (name, text) in files {
        std::fs::write(dir.join(name), text).expect("write");
    }
}

const REL: &str = "/kubepods.slice/kubepods-burstable.slice/cri-containerd-x.scope";

#[test]
fn reads_a_v2_tree() {
    let tmp = tempfile::tempdir().expect("a temp dir");
    let layout = CgroupLayout {
        v2_root: tmp.path().to_path_buf(),
        v1_roots: HashMap::new(),
    };
    write_files(
        &tmp.path().join(REL.trim_start_matches('/')),
        &[
            ("cgroup.procs", "1\n"),
            ("cpu.max", "150000 100000\n"),
            ("cpuset.cpus.effective", "0-3,8,10-11\n"),
            ("pids.current", "42\n"),
            ("cgroup.threads", "1\n2\n"),
            (
                "cpu.stat",
                "usage_usec 9\nnr_periods 10\nnr_throttled 3\nthrottled_usec 2500000\n",
            ),
            (
                "cpu.pressure",
                "some avg10=1.50 avg60=0.75 avg300=0.10 total=123456\n\
                 full avg10=0.25 avg60=0.00 avg300=0.00 total=789\n",
            ),
        ],
    );
    let want = Limits {
        cpu_quota_cores: Some(1.5),
        ancestor_quota: None,
        cpuset_cpus: Some(vec![0, 1, 2, 3, 8, 10, 11]),
        threads: Some(42),
        exclusive_cpus: None,
        counters: CpuCounters {
            periods: Some(10),
            throttled_periods: Some(3),
            throttled_seconds: Some(2.5),
            cpu_pressure_some_seconds: Some(0.123456),
            cpu_pressure_full_seconds: Some(0.000789),
        },
    };
    assert_eq!(read_limits(&layout, REL), want);
    // Same path without the leading slash.
    assert_eq!(read_limits(&layout, REL.trim_start_matches('/')), want);
    assert_eq!(
        read_cpu_pressure(&layout, REL).some.map(|l| l.total_usec),
        Some(123_456)
    );

    // Unlimited quota, malformed cpuset, no pids controller: those are None / fall back.
    write_files(
        &tmp.path().join(REL.trim_start_matches('/')),
        &[
            ("cpu.max", "max 100000\n"),
            ("cpuset.cpus.effective", "zz\n"),
        ],
    );
    std::fs::remove_file(
        tmp.path()
            .join(REL.trim_start_matches('/'))
            .join("pids.current"),
    )
    .expect("rm");
    let got = read_limits(&layout, REL);
    assert_eq!(got.cpu_quota_cores, None);
    assert_eq!(got.cpuset_cpus, None);
    assert_eq!(got.threads, Some(2), "falls back to cgroup.threads");

    // A missing cgroup, and a path that tries to leave the hierarchy.
    assert_eq!(read_limits(&layout, "/gone.scope"), Limits::default());
    assert_eq!(read_limits(&layout, "/../../etc"), Limits::default());
}

/// The quotas above a container, on v2 and on v1's `cpu` controller: the tightest one is
/// kept with the cgroup that sets it; the root and the container's own are not among them.
#[test]
fn reads_the_tightest_quota_above_the_container() {
    let tmp = tempfile::tempdir().expect("a temp dir");
    let layout = CgroupLayout {
        v2_root: tmp.path().to_path_buf(),
        v1_roots: HashMap::new(),
    };
    let rel = REL.trim_start_matches('/');
    write_files(tmp.path(), &[("cpu.max", "100000 100000\n")]);
    write_files(
        &tmp.path().join("kubepods.slice"),
        &[("cpu.max", "300000 100000\n")],
    );
    write_files(
        &tmp.path().join("kubepods.slice/kubepods-burstable.slice"),
        &[("cpu.max", "max 100000\n")],
    );
    write_files(&tmp.path().join(rel), &[("cpu.max", "400000 100000\n")]);
    let got = read_limits(&layout, REL);
    assert_eq!(got.cpu_quota_cores, Some(4.0));
    assert_eq!(
        got.ancestor_quota,
        Some(AncestorQuota {
            cores: 3.0,
            cgroup: "/kubepods.slice".into()
        }),
        "the root's file is not a quota; the unlimited slice is skipped"
    );
    write_files(
        &tmp.path().join("kubepods.slice/kubepods-burstable.slice"),
        &[("cpu.max", "150000 100000\n")],
    );
    assert_eq!(
        refresh_limits(&layout, REL, &got).ancestor_quota,
        Some(AncestorQuota {
            cores: 1.5,
            cgroup: "/kubepods.slice/kubepods-burstable.slice".into()
        })
    );

    // v1's cpu controller (a hybrid host): the same walk over cfs_quota_us / cfs_period_us.
    let v1 = tempfile::tempdir().expect("a temp dir");
    let layout = CgroupLayout {
        v2_root: v1.path().join("unified"),
        v1_roots: HashMap::from([("cpu".to_owned(), v1.path().join("cpu"))]),
    };
    write_files(&layout.v2_root.join(rel), &[("cgroup.procs", "1\n")]);
    write_files(
        &v1.path().join("cpu/kubepods.slice"),
        &[
            ("cpu.cfs_quota_us", "50000\n"),
            ("cpu.cfs_period_us", "100000\n"),
        ],
    );
    write_files(
        &v1.path().join("cpu").join(rel),
        &[
            ("cpu.cfs_quota_us", "-1\n"),
            ("cpu.cfs_period_us", "100000\n"),
        ],
    );
    let got = read_limits(&layout, REL);
    assert_eq!(got.cpu_quota_cores, None);
    assert_eq!(
        got.ancestor_quota,
        Some(AncestorQuota {
            cores: 0.5,
            cgroup: "/kubepods.slice".into()
        })
    );
    assert_eq!(read_limits(&layout, "/top.scope").ancestor_quota, None);
}

#[test]
fn reads_a_hybrid_tree() {
    let tmp = tempfile::tempdir().expect("a temp dir");
    let v2_root = tmp.path().join("unified");
    let cpu_root = tmp.path().join("cpu,cpuacct");
    let cpuset_root = tmp.path().join("cpuset");
    let layout = CgroupLayout {
        v2_root: v2_root.clone(),
        v1_roots: HashMap::from([
            ("cpu".to_owned(), cpu_root.clone()),
            ("cpuacct".to_owned(), cpu_root.clone()),
            ("cpuset".to_owned(), cpuset_root.clone()),
        ]),
    };
    let rel = REL.trim_start_matches('/');
    // The unified hierarchy only tracks membership: no cpu controller files there.
    write_files(
        &v2_root.join(rel),
        &[
            ("cgroup.procs", "7\n"),
            ("cgroup.threads", "7\n8\n9\n"),
            ("cpu.stat", "usage_usec 100\nuser_usec 60\nsystem_usec 40\n"),
        ],
    );
    write_files(
        &cpu_root.join(rel),
        &[
            ("cpu.cfs_quota_us", "50000\n"),
            ("cpu.cfs_period_us", "100000\n"),
            (
                "cpu.stat",
                "nr_periods 5\nnr_throttled 2\nthrottled_time 1500000000\n",
            ),
            ("tasks", "7\n8\n9\n"),
        ],
    );
    write_files(
        &cpuset_root.join(rel),
        &[("cpuset.effective_cpus", "0-1\n")],
    );
    assert_eq!(
        read_limits(&layout, REL),
        Limits {
            cpu_quota_cores: Some(0.5),
            ancestor_quota: None,
            cpuset_cpus: Some(vec![0, 1]),
            threads: Some(3),
            exclusive_cpus: None,
            counters: CpuCounters {
                periods: Some(5),
                throttled_periods: Some(2),
                throttled_seconds: Some(1.5),
                cpu_pressure_some_seconds: None,
                cpu_pressure_full_seconds: None,
            },
        }
    );

    // Unlimited v1 quota, and a cgroup present only in v1: threads from `tasks`.
    write_files(&cpu_root.join(rel), &[("cpu.cfs_quota_us", "-1\n")]);
    std::fs::remove_dir_all(v2_root.join(rel)).expect("rm");
    let got = read_limits(&layout, REL);
    assert_eq!(got.cpu_quota_cores, None);
    assert_eq!(got.threads, Some(3));
    assert_eq!(got.counters.throttled_periods, Some(2));
    // A refresh carries the counters over; an edge read takes them, throttling only when
    // asked (the cgroup has a quota).
    write_files(
        &cpu_root.join(rel),
        &[(
            "cpu.stat",
            "nr_periods 9\nnr_throttled 7\nthrottled_time 3000000000\n",
        )],
    );
    let carried = refresh_limits(&layout, REL, &got);
    assert_eq!(carried.counters.throttled_periods, Some(2));
    assert_eq!(carried.counters.throttled_seconds, Some(1.5));
    let skipped = read_cpu_counters(&layout, REL, &carried.counters, false, false);
    assert_eq!(skipped, carried.counters);
    let read = read_cpu_counters(&layout, REL, &carried.counters, true, false);
    assert_eq!(read.throttled_periods, Some(7));
    assert_eq!(read.periods, Some(9));
    assert_eq!(read.throttled_seconds, Some(3.0));
}

#[test]
fn counters_over_a_window_are_the_difference_of_its_edges() {
    let at = |p, t, s| CpuCounters {
        periods: Some(p),
        throttled_periods: Some(t),
        throttled_seconds: Some(s),
        cpu_pressure_some_seconds: Some(s * 2.0),
        cpu_pressure_full_seconds: None,
    };
    let w = at(90, 80, 9.5).since(Some(&at(20, 10, 1.0)));
    assert_eq!(w.periods, Some(70));
    assert_eq!(w.throttled_periods, Some(70));
    assert_eq!(w.throttled_seconds, Some(8.5));
    assert_eq!(w.cpu_pressure_some_seconds, Some(17.0));
    assert_eq!(w.cpu_pressure_full_seconds, None, "unknown at both edges");
    assert_eq!(w.throttled_period_share(), Some(1.0));
    // Created inside the window: counts from zero. Went down: a new cgroup at the path.
    assert_eq!(at(5, 2, 0.5).since(None).throttled_periods, Some(2));
    assert_eq!(
        at(5, 2, 0.5)
            .since(Some(&at(50, 20, 5.0)))
            .throttled_periods,
        Some(2)
    );
    let mut sum = at(1, 1, 1.0);
    sum.add(&at(2, 2, 2.0));
    assert_eq!(sum, at(3, 3, 3.0));
}

#[test]
fn edge_reads_take_only_what_they_are_asked_for() {
    let tmp = tempfile::tempdir().expect("a temp dir");
    let layout = CgroupLayout {
        v2_root: tmp.path().to_path_buf(),
        v1_roots: HashMap::new(),
    };
    let dir = tmp.path().join("a");
    write_files(
        &dir,
        &[
            (
                "cpu.stat",
                "nr_periods 10\nnr_throttled 3\nthrottled_usec 2500000\n",
            ),
            (
                "cpu.pressure",
                "some avg10=1.50 avg60=0 avg300=0 total=2000000\n",
            ),
        ],
    );
    let before = CpuCounters {
        periods: Some(1),
        throttled_periods: Some(1),
        throttled_seconds: Some(0.1),
        cpu_pressure_some_seconds: Some(0.5),
        cpu_pressure_full_seconds: None,
    };
    let no_throttling = read_cpu_counters(&layout, "/a", &before, false, true);
    assert_eq!(no_throttling.throttled_periods, Some(1), "carried over");
    assert_eq!(no_throttling.cpu_pressure_some_seconds, Some(2.0));
    let both = read_cpu_counters(&layout, "/a", &before, true, false);
    assert_eq!(both.periods, Some(10));
    assert_eq!(both.throttled_periods, Some(3));
    assert_eq!(both.cpu_pressure_some_seconds, Some(0.5), "carried over");
}
