//! Cgroups that come and go during a trace: created after it started, given a short workload,
//! removed before it ended. The final report must still have them, with their figures, and the
//! trace must not fail.
//!
//! Ground truth is again the workload's own getrusage (see `sched_accuracy.rs`) and CPU time
//! (`ONCPU_TOLERANCE`). The short-lived workload switches only a few hundred times, so besides 2% the switch
//! counts get a slack of a few switches per cause, each of which getrusage sees and the cgroup
//! rightly does not, or the other way round:
//! - the forked child's switches before it has joined the cgroup (its write to `cgroup.procs`
//!   can sleep): in getrusage, not in the cgroup (seen: voluntary one below, every run);
//! - an exiting thread preempted after the kernel folded its counters into the process totals
//!   (`release_task` → `proc_invalidate_siblings_dcache` → `cond_resched`, seen with bpftrace):
//!   a real involuntary switch in the cgroup that getrusage can no longer see, at most one or
//!   two per thread (seen: 0 to 10 over 32 threads);
//! - the main thread's switches after its getrusage call (printing, exiting).
//!
//! So: 2% of getrusage, plus 5, plus one per worker thread.

use std::{process::Command, time::Duration};

use serde_json::Value;
use stormwatch_tests::{
    Agent, ONCPU_TOLERANCE, TestCgroup, assert_within, num, report::Container, require_bpf,
    run_in_cgroup, workload_result,
};

/// Worker threads of each workload.
const THREADS: &str = "32";

fn check_figures(what: &str, c: &Container, truth: &Value) {
    eprintln!("{what}: reported {c:?}\n  workload {truth}");
    let sw = c.switches();
    for (kind, got, field) in [
        ("voluntary", sw.voluntary, "nvcsw"),
        ("involuntary", sw.involuntary, "nivcsw"),
    ] {
        let want = num(truth, field);
        let slack = 0.02 * want + 5.0 + THREADS.parse::<f64>().unwrap();
        assert_within(
            &format!("{what}: {kind} switches"),
            got as f64,
            want,
            slack / want.max(1.0),
        );
    }
    assert_within(
        &format!("{what}: on-CPU seconds"),
        c.oncpu(),
        num(truth, "utime_seconds") + num(truth, "stime_seconds"),
        ONCPU_TOLERANCE,
    );
}

#[test]
fn removed_cgroups_keep_their_figures_in_the_report() {
    require_bpf();
    // Ticks every 0.5 s: the long-lived cgroup is seen alive at several ticks, so the agent has
    // resolved its path before it goes; the short-lived one may vanish between two ticks, and
    // then only its id can be reported.
    let mut agent = Agent::trace(&["--json", "--duration", "6", "--interval", "0.5"]);

    let long_lived = TestCgroup::new("life-long");
    let (long_id, long_path) = (long_lived.id(), long_lived.rel_path().to_owned());
    let child = run_in_cgroup(
        Command::new(env!("CARGO_BIN_EXE_mutex_storm")).args([
            "--threads",
            THREADS,
            "--seconds",
            "2",
        ]),
        &long_lived,
    );
    let long_truth = workload_result(child);
    long_lived.remove();
    assert!(
        !std::path::Path::new(&format!(
            "{}{long_path}",
            stormwatch_tests::v2_root().display()
        ))
        .exists()
    );

    let short_lived = TestCgroup::new("life-short");
    let (short_id, short_path) = (short_lived.id(), short_lived.rel_path().to_owned());
    let child = run_in_cgroup(
        Command::new(env!("CARGO_BIN_EXE_mutex_storm")).args([
            "--threads",
            THREADS,
            "--seconds",
            "0.4",
        ]),
        &short_lived,
    );
    let short_truth = workload_result(child);
    short_lived.remove();

    // Let the agent tick at least twice after the removals before the trace ends.
    std::thread::sleep(Duration::from_millis(1200));
    agent.assert_still_tracing("the removals");
    let done = agent.finish();
    let errors: Vec<&String> = done
        .stderr
        .iter()
        .filter(|l| l.to_lowercase().contains("error"))
        .collect();
    assert!(errors.is_empty(), "the trace reported errors: {errors:?}");

    let long = done
        .trace
        .container_by_id(long_id)
        .unwrap_or_else(|| panic!("removed cgroup {long_path} (id {long_id}) not in the report"));
    assert_eq!(
        long.cgroup.as_deref(),
        Some(long_path.as_str()),
        "a cgroup that lived across several ticks is reported with its path"
    );
    check_figures("long-lived removed cgroup", long, &long_truth);

    let short = done
        .trace
        .container_by_id(short_id)
        .unwrap_or_else(|| panic!("removed cgroup {short_path} (id {short_id}) not in the report"));
    assert!(
        short.cgroup.as_ref().is_none_or(|p| *p == short_path),
        "the short-lived cgroup is reported with its own path or none: {short:?}"
    );
    check_figures("short-lived removed cgroup", short, &short_truth);
}
