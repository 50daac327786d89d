//! Run-queue latency: an overloaded cgroup waits far longer for a CPU than an idle-ish one.
//!
//! Both workloads run at the same time under the same trace. The overloaded one has 4 × CPUs
//! busy threads, so each runnable thread waits behind the others for slices at a time. The
//! idle-ish one sleeps 10 ms in a loop as a SCHED_FIFO thread, so when it wakes it preempts a
//! busy thread at once.
//!
//! Why SCHED_FIFO: on a kernel with HZ=250 and preempt=none (lazy wake-up preemption of fair
//! tasks, as on this test VM), a woken SCHED_OTHER thread on busy CPUs waits for the running
//! thread's slice or the next tick, up to 4 ms, which is the same order as an overloaded
//! thread's wait for a few slices: there the two medians are a few × apart, not 10 ×, whatever
//! the agent does. A latency-critical (real-time) sleeper is the idle-ish cgroup that is
//! guaranteed to be served promptly on any kernel.
//!
//! Ground truth: each thread's own `sched_info` from /proc/thread-self/schedstat, the kernel's
//! count of time slices and its total time runnable-but-waiting (run_delay), which is what the
//! agent's run-queue latency measures (wake-up or preemption to running).

use std::process::Command;

use stormwatch_tests::{
    Agent, TestCgroup, assert_within, cpus, num, pinned,
    report::{self, Finding},
    require_bpf, run_in_cgroup, workload_result,
};

#[test]
fn overloaded_cgroup_waits_far_longer_than_idle_one() {
    overloaded_and_idle(&[]);
}

/// The same, the waits timed from the wake-up programs (as on kernels without `sched_info`)
/// instead of taken from the kernel's run_delay.
#[test]
fn overloaded_cgroup_waits_far_longer_than_idle_one_timed_from_wakeups() {
    overloaded_and_idle(&["--waits-from-wakeups"]);
}

fn overloaded_and_idle(extra: &[&str]) {
    require_bpf();
    let busy = TestCgroup::new("runq-busy");
    let idle = TestCgroup::new("runq-idle");
    let seconds = 3.0;
    let threads = (4 * cpus()).to_string();
    let mut agent = Agent::trace(&[&["--json", "--duration", "5"], extra].concat());
    let spin = run_in_cgroup(
        Command::new(env!("CARGO_BIN_EXE_spin")).args([
            "--threads",
            &threads,
            "--seconds",
            &seconds.to_string(),
        ]),
        &busy,
    );
    let sleeper = run_in_cgroup(
        Command::new(env!("CARGO_BIN_EXE_sleeper")).args([
            "--threads",
            "1",
            "--seconds",
            &seconds.to_string(),
            "--sleep-ms",
            "10",
            "--fifo",
            "1",
        ]),
        &idle,
    );
    let spin_truth = workload_result(spin);
    let sleeper_truth = workload_result(sleeper);
    agent.assert_still_tracing("the workloads");
    let done = agent.finish();

    let busy_q = done.trace.container(&busy).runqueue();
    let idle_q = done.trace.container(&idle).runqueue();
    eprintln!(
        "run queue: busy ({threads} threads on {} CPUs) {busy_q:?}; idle (sleeper, {} wake-ups) \
         {idle_q:?};\n  spin {spin_truth}\n  sleeper {sleeper_truth}",
        cpus(),
        sleeper_truth["ops"],
    );
    for (name, q) in [("busy", busy_q), ("idle", idle_q)] {
        assert!(
            q.count >= 50,
            "{name} cgroup: at least 50 run-queue samples expected: {q:?}"
        );
    }
    let (busy_p50, idle_p50) = (
        busy_q.p50_seconds.expect("busy p50_seconds"),
        idle_q.p50_seconds.expect("idle p50_seconds"),
    );
    assert!(
        busy_p50 >= 10.0 * idle_p50,
        "run-queue p50 of the overloaded cgroup ({busy_p50} s) should be at least 10 × that of \
         the idle-ish one ({idle_p50} s)"
    );
    // Every sleep ends with a wake-up and a wait in the run queue: the idle cgroup's sample
    // count is at least its number of sleeps (the agent may see a few more switches).
    assert!(
        idle_q.count as f64 >= num(&sleeper_truth, "ops"),
        "idle cgroup: {} run-queue samples for {} wake-ups",
        idle_q.count,
        sleeper_truth["ops"]
    );
    // Against the kernel's own sched_info: one sample per time slice (give or take the few of
    // the forked child before it joined its cgroup, and of each thread after it read its
    // schedstat), and for the busy cgroup the same total wait, within 5%: a thread preempted
    // after reading its schedstat, just before exiting, adds a wait the workload did not see,
    // at most a few slices per thread.
    //
    // No such check on the idle cgroup's total: its waits are µs long, and the kernel's
    // run_delay under-counts those (when a wake-up preempts, the scheduler skips its next clock
    // update, so the wait is measured with a stale clock). With tp_btf the agent reads that
    // same run-queue clock, with classic tracepoints `bpf_ktime_get_ns()`, so how far the two
    // agree on µs waits depends on the attach kind.
    assert_within(
        "busy cgroup: run-queue samples vs time slices",
        busy_q.count as f64,
        num(&spin_truth, "timeslices"),
        0.02,
    );
    assert_within(
        "idle cgroup: run-queue samples vs time slices",
        idle_q.count as f64,
        num(&sleeper_truth, "timeslices"),
        0.05,
    );
    assert_within(
        "busy cgroup: run-queue wait (s) vs run_delay",
        busy_q.sum_seconds,
        num(&spin_truth, "run_delay_seconds"),
        0.05,
    );
}

/// Run-queue blame: a sleeper and a spinner in two cgroups, both pinned to one CPU. Every time
/// the sleeper wakes, the spinner holds that CPU: its waits are blamed on the spinner's cgroup.
/// The sleeper runs at nice 19 beside two spinning threads, so that it waits milliseconds,
/// past `runqueue_saturation`'s line, and the finding must name the spinner. Ground truth is
/// the setup itself (nothing else of ours runs on that CPU) and the kernel's own `run_delay` of
/// the sleeper's thread, which the blamed seconds add up to.
#[test]
fn a_sleepers_wait_is_blamed_on_the_spinner_sharing_its_cpu() {
    require_bpf();
    let spinner = TestCgroup::new("runq-blame-spin");
    let sleeper_cg = TestCgroup::new("runq-blame-sleep");
    let (cpu, seconds) = (pinned_cpu(), 3.0);
    let mut agent = Agent::trace(&["--json", "--duration", "10"]);
    let busy_before = cpu_busy_seconds(cpu);
    let spin = run_in_cgroup(
        pinned(cpu, 0, env!("CARGO_BIN_EXE_spin")).args([
            "--threads",
            "2",
            "--seconds",
            &seconds.to_string(),
        ]),
        &spinner,
    );
    let sleeper = run_in_cgroup(
        pinned(cpu, 19, env!("CARGO_BIN_EXE_sleeper")).args([
            "--threads",
            "1",
            "--seconds",
            &seconds.to_string(),
            "--sleep-ms",
            "1",
        ]),
        &sleeper_cg,
    );
    let spin_truth = workload_result(spin);
    let truth = workload_result(sleeper);
    // What else held that CPU meanwhile (the hypervisor's steal included), by the kernel's
    // count: its busy time less the two workloads' CPU time. The host is quiet in CI, yet a
    // busy hypervisor or a kernel worker can still take a part of it.
    let elsewhere = (cpu_busy_seconds(cpu)
        - busy_before
        - ["utime_seconds", "stime_seconds"]
            .iter()
            .map(|k| num(&spin_truth, k) + num(&truth, k))
            .sum::<f64>())
    .max(0.0);
    agent.assert_still_tracing("the workloads");
    let done = agent.finish();

    let blame = done.trace.container(&sleeper_cg).blame();
    eprintln!(
        "sleeper on CPU {cpu} beside a spinner: blame {blame:?}; truth {truth}; \
         the CPU busy elsewhere {elsewhere:.3} s"
    );
    let wait = blame.wait_seconds;
    let top = blame.others.first();
    assert_eq!(
        top.map(|c| c.cgroup.as_str()),
        Some(spinner.rel_path()),
        "the spinner's cgroup is the first other culprit: {blame:?}"
    );
    // Every wait that the CPU's other work did not explain is the spinner's: at least 90% of
    // it. And what the agent blamed on anything but the spinner is no more than that other
    // work (plus a tenth of the wait: the sleeper's own wake-ups, the root cgroup's agent).
    let on_spinner = top.expect("a culprit").seconds;
    let share = on_spinner / (wait - elsewhere).max(f64::EPSILON);
    assert!(
        share >= 0.9,
        "the sleeper's wait less the CPU's other work ({elsewhere:.3} s) is blamed on the \
         spinner for {:.1}% of it, at least 90% expected: {blame:?}",
        share * 100.0
    );
    assert!(
        wait - on_spinner <= elsewhere + 0.1 * wait,
        "{:.3} s of the wait blamed on others than the spinner, while the CPU ran other work \
         for {elsewhere:.3} s: {blame:?}",
        wait - on_spinner
    );
    // The blamed seconds are the sleeper's run-queue wait, as the kernel sums it: its thread's
    // run_delay, read by the thread itself at its end (a few waits of its process's start
    // before it joined the cgroup and after the read are not in both).
    assert_within(
        "sleeper: blamed wait (s) vs its run_delay",
        wait,
        num(&truth, "run_delay_seconds"),
        0.05,
    );
    let findings = &done.trace.findings;
    let finding = report::find(findings, "runqueue_saturation", sleeper_cg.rel_path())
        .unwrap_or_else(|| panic!("no runqueue_saturation for the sleeper: {findings:#?}"));
    assert_eq!(
        finding.context("runqueue_culprit"),
        Some(spinner.rel_path()),
        "the finding names the spinner: {finding:#?}"
    );
    let figure = finding.figure("runqueue_top_culprit_share");
    assert!(
        figure >= 0.9 * (1.0 - elsewhere / wait),
        "the finding's top culprit share {figure:.3}, with the CPU's other work {elsewhere:.3} s \
         of a {wait:.3} s wait"
    );
}

/// The same sleeper alone on its CPU: nobody else was put on it, so no container is named for
/// its waits, and what the host's own processes held it for is a trifle per wake-up.
#[test]
fn a_sleeper_alone_on_its_cpu_blames_no_container() {
    require_bpf();
    let sleeper_cg = TestCgroup::new("runq-blame-alone");
    let (cpu, seconds) = (pinned_cpu(), 2.0);
    let mut agent = Agent::trace(&["--json", "--duration", "4"]);
    let busy_before = cpu_busy_seconds(cpu);
    let sleeper = run_in_cgroup(
        pinned(cpu, 19, env!("CARGO_BIN_EXE_sleeper")).args([
            "--threads",
            "1",
            "--seconds",
            &seconds.to_string(),
            "--sleep-ms",
            "1",
        ]),
        &sleeper_cg,
    );
    let truth = workload_result(sleeper);
    // The premise: nothing else kept that CPU busy (the host quiet, as CI keeps it).
    let others_busy = cpu_busy_seconds(cpu)
        - busy_before
        - num(&truth, "utime_seconds")
        - num(&truth, "stime_seconds");
    assert!(
        others_busy < 0.05 * seconds,
        "premise: CPU {cpu} is quiet but for the sleeper; others kept it busy {others_busy:.3} s \
         of {seconds} s (is something else running on this host?)"
    );
    agent.assert_still_tracing("the sleeper");
    let done = agent.finish();
    let blame = done.trace.container(&sleeper_cg).blame();
    eprintln!("sleeper alone on CPU {cpu}: blame {blame:?}; truth {truth}");
    assert!(
        blame.wait_seconds > 0.0,
        "its wake-ups waited, and were blamed: {blame:?}"
    );
    // The host's own processes (the root cgroup: this test, the agent) still take that CPU
    // for microseconds now and then; no container does, and no wake-up waits long for it.
    let others = |keep: &dyn Fn(&str) -> bool| -> f64 {
        blame
            .others
            .iter()
            .filter(|c| keep(&c.cgroup))
            .map(|c| c.seconds)
            .sum()
    };
    let containers = others(&|path| path != "/");
    assert!(
        containers < 0.01 * seconds,
        "other containers blamed for {containers} s of the sleeper's {seconds} s on a CPU \
         nobody else was put on: {blame:?}"
    );
    let per_wakeup = others(&|_| true) / num(&truth, "ops");
    assert!(
        per_wakeup < 100e-6,
        "{:.1} µs per wake-up behind other cgroups: a tenth of runqueue_saturation's line \
         (1 ms) at most on a quiet CPU",
        per_wakeup * 1e6
    );
    let about: Vec<&Finding> = done
        .trace
        .findings
        .iter()
        .filter(|f| f.kind == "runqueue_saturation" && f.cgroup == sleeper_cg.rel_path())
        .collect();
    assert!(
        about.is_empty(),
        "a quiet CPU's sleeper is not saturated: {about:?}"
    );
}

/// Seconds CPU `cpu` was not idle since boot (`/proc/stat`: all but idle and iowait).
fn cpu_busy_seconds(cpu: usize) -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let name = format!("cpu{cpu}");
    let ticks: Vec<f64> = stat
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in /proc/stat"))
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest times are in user already).
    let busy: f64 = ticks.iter().take(8).sum::<f64>() - ticks[3] - ticks[4];
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    busy / hz
}

/// The CPU the blame tests pin their workloads to: the last one (the first takes most of the
/// host's own work).
fn pinned_cpu() -> usize {
    cpus() - 1
}
