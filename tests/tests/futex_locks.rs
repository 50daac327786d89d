//! Futex and kernel-lock figures against an independent tracer and the workloads themselves.
//!
//! Ground truth for futex waits is a bpftrace script run at the same time as the agent: it
//! times `sys_enter_futex` → `sys_exit_futex` of the test cgroup's wait operations (the same
//! ops the agent counts as waits: WAIT, WAIT_BITSET, LOCK_PI, LOCK_PI2, WAIT_REQUEUE_PI, with
//! the private and clock flags masked off) with the same clock (`ktime_get_ns`). Both tracers
//! attach before the workload starts and the workload has exited before either stops, so they
//! see the very same calls: the figures should agree almost exactly, and 10% leaves room only
//! for a genuinely different way of counting. The mutex storm's Rust `std::sync::Mutex` waits
//! with `FUTEX_WAIT_BITSET|FUTEX_PRIVATE_FLAG`, so the ops mask matters.
//!
//! Ground truth for the hottest futex is the workload: it prints the address of its mutex
//! (whose futex word is the mutex's first field) and its pid.
//!
//! Kernel locks: a workload whose threads all map and unmap memory in one process contends that
//! process's `mmap_lock`, an rw_semaphore taken for write by `mmap` and `munmap` (see
//! `src/bin/mmap_storm.rs`); bpftrace counts and times the write-side contentions on the
//! `lock:contention_begin`/`contention_end` tracepoints in the same way as the agent.

use std::process::Command;

use serde_json::Value;
use stormwatch_tests::{
    Agent, Finished, TestCgroup, assert_within,
    bpftrace::Bpftrace,
    cpus,
    daemon::tool,
    report::{Futex, KernelLockSite},
    require_bpf, run_in_cgroup, run_workload, workload_result,
};

const STORM_THREADS: usize = 32;
const STORM_SECONDS: f64 = 3.0;
/// Iterations of work inside and outside the lock: a critical section long enough (a couple of
/// µs) that waiters give up spinning and sleep in futex_wait, many times a second.
const STORM_WORK: &str = "2000";

/// The futex ops the agent counts as waits (`op & 0x7f`, i.e. FUTEX_CMD_MASK without the
/// private and clock-realtime flags): WAIT 0, LOCK_PI 6, WAIT_BITSET 9, WAIT_REQUEUE_PI 11,
/// LOCK_PI2 13.
const WAIT_OPS_PREDICATE: &str = "((args->op & 0x7f) == 0 || (args->op & 0x7f) == 9 || \
     (args->op & 0x7f) == 6 || (args->op & 0x7f) == 13 || (args->op & 0x7f) == 11)";

/// A bpftrace script summing and counting the futex wait calls of one cgroup, entry to exit.
fn futex_wait_script(cgroup: &TestCgroup) -> String {
    let path = cgroup.path().display();
    format!(
        "tracepoint:syscalls:sys_enter_futex /cgroup == cgroupid(\"{path}\") && \
         {WAIT_OPS_PREDICATE}/ {{ @start[tid] = nsecs; }}\n\
         tracepoint:syscalls:sys_exit_futex /@start[tid]/ {{ \
         @wait_ns = sum(nsecs - @start[tid]); @waits = count(); delete(@start[tid]); }}\n\
         END {{ clear(@start); }}\n"
    )
}

/// Runs the mutex storm in `cgroup` under `agent` and returns its JSON line.
fn run_storm(cgroup: &TestCgroup, seconds: f64) -> Value {
    run_workload(
        env!("CARGO_BIN_EXE_mutex_storm"),
        STORM_THREADS,
        seconds,
        &["--inside", STORM_WORK, "--outside", STORM_WORK],
        cgroup,
    )
}

/// The agent's futex figures of the cgroup.
fn futex_of<'a>(done: &'a Finished, cgroup: &TestCgroup) -> &'a Futex {
    let c = done.trace.container(cgroup);
    c.futex
        .as_ref()
        .unwrap_or_else(|| panic!("futex figures missing or null: {c:#?}"))
}

#[test]
fn mutex_storm_futex_waits_match_bpftrace_and_name_the_mutex() {
    require_bpf();
    let cgroup = TestCgroup::new("futex-storm");
    let bt = Bpftrace::start(&futex_wait_script(&cgroup));
    let mut agent = Agent::trace_workload(STORM_SECONDS, Some(&cgroup), false);
    let truth = run_storm(&cgroup, STORM_SECONDS);
    agent.assert_still_tracing("the mutex storm");
    let maps = bt.stop();
    let done = agent.finish();

    let f = futex_of(&done, &cgroup);
    let (bt_waits, bt_wait_s) = (
        maps.require("@waits") as f64,
        maps.require("@wait_ns") as f64 / 1e9,
    );
    let (waits, wait_s) = (f.waits as f64, f.wait_seconds);
    let c = done.trace.container(&cgroup);
    eprintln!(
        "mutex storm {STORM_THREADS} threads: agent futex waits {waits}, {wait_s} s; \
         bpftrace {bt_waits}, {bt_wait_s} s; workload {truth}\n  futex {f:?}\n  hot {:?}",
        c.hot_futexes
    );
    // The workload's design, not the agent: the comparison must be about many real waits.
    assert!(
        bt_waits >= 500.0 && bt_wait_s >= 1.0,
        "the storm should make threads sleep in futex_wait thousands of times on {} CPUs \
         (bpftrace saw {bt_waits} waits, {bt_wait_s} s): {truth}",
        cpus()
    );
    assert_within("futex wait seconds", wait_s, bt_wait_s, 0.10);
    assert_within("futex waits", waits, bt_waits, 0.10);

    // The hottest futex is the storm's mutex, in the storm's process.
    let hot = c
        .hot_futexes
        .as_ref()
        .and_then(|h| h.first())
        .unwrap_or_else(|| panic!("no hot_futexes in {c:#?}"));
    let mutex_addr = truth["mutex_addr"].as_str().expect("workload's mutex_addr");
    assert_eq!(
        hot.uaddr, mutex_addr,
        "hottest futex should be the workload's mutex {mutex_addr}: {hot:?}"
    );
    assert_eq!(
        Some(hot.tgid),
        truth["pid"].as_u64(),
        "hottest futex's process: {hot:?}"
    );
    assert_eq!(hot.comm, "mutex_storm", "hottest futex's comm: {hot:?}");
    // Nearly every wait of the storm is on its one mutex (the rest: joins at the end).
    assert!(
        hot.waits as f64 >= 0.9 * waits,
        "the mutex should account for nearly all {waits} waits: {hot:?}"
    );
}

/// Every futex call of one cgroup by class and outcome, counted by bpftrace at the syscall
/// tracepoints with the agent's classes: waits (as [`WAIT_OPS_PREDICATE`]) and how many returned
/// ETIMEDOUT or EAGAIN; wake calls (WAKE 1, WAKE_BITSET 10, WAKE_OP 5, and the requeues and
/// UNLOCK_PI: 3, 4, 12, 7) and the waiters the first three report woken.
fn futex_calls_script(cgroup: &TestCgroup) -> String {
    let path = cgroup.path().display();
    format!(
        "tracepoint:syscalls:sys_enter_futex /cgroup == cgroupid(\"{path}\")/ {{ \
         @op[tid] = args->op & 0x7f; @in[tid] = 1; }}\n\
         tracepoint:syscalls:sys_exit_futex /@in[tid]/ {{ $op = @op[tid]; \
         if ($op == 0 || $op == 9 || $op == 6 || $op == 13 || $op == 11) {{ @waits = count(); \
         if (args->ret == -110) {{ @timeouts = count(); }} \
         if (args->ret == -11) {{ @eagain = count(); }} }} \
         if ($op == 1 || $op == 10 || $op == 5 || $op == 3 || $op == 4 || $op == 12 || \
         $op == 7) {{ @wakes = count(); }} \
         if (($op == 1 || $op == 10 || $op == 5) && args->ret > 0) {{ @woken = sum(args->ret); }} \
         delete(@op[tid]); delete(@in[tid]); }}\n\
         END {{ clear(@op); clear(@in); }}\n"
    )
}

/// Wakes, waiters woken, timeouts and EAGAIN returns: a workload whose calls' outcomes are
/// known (`src/bin/futex_calls.rs`) counts them from the return values, and bpftrace counts
/// the cgroup's calls at the same tracepoints. The agent must match bpftrace exactly (both
/// attach before the workload starts and stop after it exits) and see at least every call the
/// workload made (its runtime may add a few of its own, which bpftrace sees too).
#[test]
fn futex_wakes_timeouts_and_eagain_match_the_calls_made() {
    require_bpf();
    let cgroup = TestCgroup::new("futex-calls");
    let bt = Bpftrace::start(&futex_calls_script(&cgroup));
    let mut agent = Agent::trace_workload(2.0, Some(&cgroup), false);
    let child = run_in_cgroup(
        Command::new(env!("CARGO_BIN_EXE_futex_calls")).args([
            "--wakes",
            "200",
            "--eagain",
            "300",
            "--timeouts",
            "20",
            "--woken",
            "100",
        ]),
        &cgroup,
    );
    let truth = workload_result(child);
    agent.assert_still_tracing("the futex calls");
    let maps = bt.stop();
    let done = agent.finish();
    let f = futex_of(&done, &cgroup);
    eprintln!("futex calls: agent {f:?}; workload {truth}; bpftrace {maps:?}");
    // The workload's own counts, from its calls' return values.
    assert_eq!(truth["timeouts"], 20, "{truth}");
    assert_eq!(truth["eagain"], 300, "{truth}");
    assert_eq!(truth["woken"], 100, "{truth}");
    for (agent_field, agent_count, bt_map, workload_field) in [
        ("waits", f.waits, "@waits", "wait_calls"),
        ("wakes", f.wakes, "@wakes", "wake_calls"),
        ("woken", f.woken, "@woken", "woken"),
        ("timeouts", f.timeouts, "@timeouts", "timeouts"),
        ("eagain", f.eagain, "@eagain", "eagain"),
    ] {
        let agent_count = agent_count as f64;
        let bt_count = maps.require(bt_map) as f64;
        let made = truth[workload_field]
            .as_f64()
            .unwrap_or_else(|| panic!("workload's {workload_field}: {truth}"));
        assert_eq!(
            agent_count, bt_count,
            "futex {agent_field}: agent {agent_count}, bpftrace {bt_count} ({f:?})"
        );
        assert!(
            agent_count >= made,
            "futex {agent_field}: agent {agent_count} < the {made} the workload made ({truth})"
        );
    }
}

/// The figures every report must carry about what the probes could not record: each reason a
/// count.
#[test]
fn lost_events_list_every_reason() {
    require_bpf();
    let cgroup = TestCgroup::new("futex-lost");
    let seconds = 2.0;
    let mut agent = Agent::trace_workload(seconds, None, false);
    let truth = run_storm(&cgroup, seconds);
    agent.assert_still_tracing("the mutex storm");
    let done = agent.finish();
    // Typed, every reason is a count (`u64`): one that is not fails the parse in `finish`.
    let lost = &done.trace.lost_events;
    eprintln!("lost_events {lost:?}; storm {truth}");
    let reasons = [
        "cgroup_map_full",
        "counter_regression",
        "futex_storage_busy",
        "futex_unpaired_exit",
        "hot_futex_full",
        "hot_futex_idle_evicted",
        "lock_storage_busy",
        "lock_site_full",
        "lock_site_idle_evicted",
        "lock_stack_failed",
        "lock_unpaired_end",
        "pending_wakeup_full",
        "task_storage_busy",
        "task_read",
    ];
    for r in reasons {
        assert!(
            lost.contains_key(r),
            "lost_events.{r} should be a count: {lost:?}"
        );
    }
    // Other probe families add their own reasons; each must be a count too. (The typed map
    // already refuses a value that is not one when `finish` parses the document; this says
    // so by name.)
    let raw = done.json["lost_events"]
        .as_object()
        .expect("lost_events is an object");
    for (reason, n) in raw {
        assert!(
            n.is_u64(),
            "lost_events.{reason} should be a count: {lost:?}"
        );
    }
    let storm_waits = futex_of(&done, &cgroup).waits as f64;
    assert!(
        storm_waits >= 200.0,
        "premise: the storm should make hundreds of futex waits at least: {storm_waits}"
    );
}

/// Futex waits that began before the probes attached end without an entry the probes saw:
/// each is one `futex_unpaired_exit`. Threads parked on a mutex before the agent starts and
/// released after it attached make at least that many (host-wide, other threads blocked at
/// attach time add theirs; a counter that never moves fails).
#[test]
fn waits_begun_before_attach_are_unpaired_exits() {
    require_bpf();
    let cgroup = TestCgroup::new("futex-parked");
    let parked = 20;
    let mut command = Command::new(env!("CARGO_BIN_EXE_futex_parked"));
    command
        .args(["--threads", &parked.to_string(), "--seconds", "30"])
        .stdin(std::process::Stdio::piped());
    let mut child = run_in_cgroup(&mut command, &cgroup);
    // Let every thread reach its futex wait before the probes attach.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let mut agent = Agent::trace(&["--json", "--duration", "3"]);
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin
            .write_all(b"go\n")
            .expect("release the parked threads");
    }
    let truth = workload_result(child);
    agent.assert_still_tracing("the parked threads");
    let done = agent.finish();
    let lost = &done.trace.lost_events;
    eprintln!("parked {parked}: lost_events {lost:?}; workload {truth}");
    assert_eq!(truth["parked"], parked, "{truth}");
    let unpaired = *lost
        .get("futex_unpaired_exit")
        .unwrap_or_else(|| panic!("no futex_unpaired_exit in {lost:?}"));
    assert!(
        unpaired >= parked,
        "{parked} waits began before attach, yet futex_unpaired_exit is {unpaired}: {lost:?}"
    );
}

/// CPU-bound threads that share nothing: next to no futex waiting.
#[test]
fn spin_workload_shows_next_to_no_futex_waiting() {
    require_bpf();
    let cgroup = TestCgroup::new("futex-spin");
    let seconds = 3.0;
    let threads = 4 * cpus();
    let mut agent = Agent::trace_workload(seconds, Some(&cgroup), false);
    let truth = run_workload(env!("CARGO_BIN_EXE_spin"), threads, seconds, &[], &cgroup);
    agent.assert_still_tracing("the spin workload");
    let done = agent.finish();
    let f = futex_of(&done, &cgroup);
    let (waits, wait_s) = (f.waits as f64, f.wait_seconds);
    let thread_seconds = threads as f64 * seconds;
    eprintln!("spin {threads} threads: futex {f:?}; workload {truth}");
    assert!(
        wait_s < 0.01 * thread_seconds,
        "spin: {wait_s} s of futex wait is not < 1% of its {thread_seconds} thread-seconds"
    );
    // The only futex waits of `spin` are in its thread plumbing: the main thread's
    // pthread_join waits (FUTEX_WAIT on each worker's tid word) for every worker not yet gone,
    // at most one per thread; and glibc's internal locks when threads start and exit at the
    // same moment (malloc arena list, stdio): at most about one more per thread. Plus a few for
    // the runtime's one-time initialisation. Nothing in the loop touches a futex.
    let bound = (2 * threads + 4) as f64;
    assert!(
        waits <= bound,
        "spin: {waits} futex waits for {threads} threads that share no lock (bound {bound})"
    );
}

/// The mmap storm's write-side `mmap_lock` contentions, counted and timed by bpftrace: each
/// `contention_begin` with exactly `LCB_F_WRITE` (4: an rw_semaphore's writer about to sleep)
/// of the cgroup, paired with its thread's `contention_end` on the same lock. `@long_waits`
/// counts those of at least `LOCK_SITE_MIN_WAIT_NS`, the waits whose call site the agent takes.
fn rwsem_write_script(cgroup: &TestCgroup) -> String {
    let path = cgroup.path().display();
    let long = stormwatch_common::LOCK_SITE_MIN_WAIT_NS;
    format!(
        "tracepoint:lock:contention_begin /cgroup == cgroupid(\"{path}\") && args->flags == 4/ \
         {{ @start[tid] = nsecs; @lock[tid] = args->lock_addr; }}\n\
         tracepoint:lock:contention_end /@start[tid] && @lock[tid] == args->lock_addr/ {{ \
         $w = nsecs - @start[tid]; @wait_ns = sum($w); @waits = count(); \
         if ($w >= {long}) {{ @long_waits = count(); }} \
         delete(@start[tid]); delete(@lock[tid]); }}\n\
         END {{ clear(@start); clear(@lock); }}\n"
    )
}

fn mmap_storm_contends_mmap_lock(force_tracepoints: bool) {
    require_bpf();
    let cgroup = TestCgroup::new("mmap-storm");
    let seconds = 2.0;
    // More threads than CPUs: a writer holding mmap_lock is often preempted, and then the
    // others cannot spin on it and sleep in rwsem_down_write_slowpath.
    let threads = 4 * cpus();
    let bt = Bpftrace::start(&rwsem_write_script(&cgroup));
    let mut agent = Agent::trace_workload(seconds, Some(&cgroup), force_tracepoints);
    let truth = run_workload(
        env!("CARGO_BIN_EXE_mmap_storm"),
        threads,
        seconds,
        &[],
        &cgroup,
    );
    agent.assert_still_tracing("the mmap storm");
    let maps = bt.stop();
    let done = agent.finish();
    let how = if force_tracepoints {
        "tracepoint"
    } else {
        "tp_btf"
    };
    for tp in ["lock:contention_begin", "lock:contention_end"] {
        assert_eq!(
            done.trace.probe_kind(tp),
            Some(how),
            "probe {tp} attached as {how}: {:?}",
            done.trace.probes
        );
    }
    let c = done.trace.container(&cgroup);
    let w = c
        .kernel_locks
        .as_ref()
        .and_then(|k| k.get("rwsem_write"))
        .unwrap_or_else(|| panic!("no kernel_locks.rwsem_write: {c:#?}"));
    let sites = &c.kernel_lock_sites;
    let (bt_waits, bt_wait_s) = (
        maps.require("@waits") as f64,
        maps.require("@wait_ns") as f64 / 1e9,
    );
    eprintln!(
        "mmap storm {threads} threads ({how}): agent rwsem_write {w:?}; bpftrace {bt_waits} \
         waits, {bt_wait_s} s; workload {truth}\n  kernel_locks {:?}\n  sites {sites:?}",
        c.kernel_locks
    );
    assert!(
        bt_waits >= 100.0,
        "the mmap storm should contend mmap_lock for write hundreds of times on {} CPUs \
         (bpftrace saw {bt_waits}): {truth}",
        cpus()
    );
    let (count, wait_s) = (w.count as f64, w.wait_seconds);
    assert!(
        count > 0.0 && wait_s > 0.0,
        "rwsem_write figures should be non-zero: {w:?}"
    );
    assert_within("rwsem_write contentions", count, bt_waits, 0.10);
    assert_within("rwsem_write wait seconds", wait_s, bt_wait_s, 0.10);

    // A call site of mmap_lock's write side: a function of the mmap/munmap paths (in this
    // kernel `vm_mmap_pgoff`, `__vm_munmap`; `do_mprotect_pkey` for thread stack guards) that
    // called a `down_write*` function. The stable property: kind rwsem_write, locking function
    // down_write…, and a caller whose name is about mapping memory.
    let sites = sites
        .as_ref()
        .unwrap_or_else(|| panic!("kernel_lock_sites should be a list: {c:#?}"));
    let mm_site = sites.iter().find(|s| {
        let name = s.function.split('+').next().unwrap_or("");
        s.kind == "rwsem_write"
            && s.lock_function
                .as_deref()
                .is_some_and(|l| l.starts_with("down_write"))
            && (name.contains("mmap") || name.contains("munmap") || name.contains("mprotect"))
    });
    assert!(
        mm_site.is_some_and(|s| s.count > 0 && s.wait_seconds > 0.0),
        "kernel_lock_sites should name an mmap/munmap caller of down_write* (rwsem_write): \
         {sites:?}"
    );
    // The call sites cover exactly the waits of at least LOCK_SITE_MIN_WAIT_NS: their
    // rwsem_write counts add up to bpftrace's count of such waits (the storm has only a few
    // write-side sites, all within the list's top entries), and each site's longest wait is
    // at least that long.
    let bt_long = maps.require("@long_waits") as f64;
    let long_s = stormwatch_common::LOCK_SITE_MIN_WAIT_NS as f64 / 1e9;
    let write_sites: Vec<&KernelLockSite> =
        sites.iter().filter(|s| s.kind == "rwsem_write").collect();
    let site_count: f64 = write_sites.iter().map(|s| s.count as f64).sum();
    eprintln!("rwsem_write waits >= {long_s} s: sites {site_count}, bpftrace {bt_long}");
    assert!(
        bt_long >= 50.0,
        "the mmap storm's writers should sleep at least {long_s} s many times \
         (bpftrace saw {bt_long}): {truth}"
    );
    assert_within(
        "rwsem_write site contentions >= 10 us",
        site_count,
        bt_long,
        0.10,
    );
    for s in &write_sites {
        assert!(
            s.max_wait_seconds >= long_s,
            "a call site's longest wait is at least {long_s} s: {s:?}"
        );
    }
}

#[test]
fn mmap_storm_contends_mmap_lock_for_write_tp_btf() {
    mmap_storm_contends_mmap_lock(false);
}

#[test]
fn mmap_storm_contends_mmap_lock_for_write_classic_tracepoints() {
    mmap_storm_contends_mmap_lock(true);
}

/// Every wait of the cgroup on a kernel lock lasting at least `LOCK_SITE_MIN_WAIT_NS`, of any
/// kind, counted by bpftrace, paired as the kernel's `perf lock contention` pairs them: a
/// spinning waiter (`LCB_F_SPIN` without `MUTEX|RT|PERCPU`, 56) on its CPU, a sleeping one on
/// its thread, whose mutex's second begin (before it sleeps) is not a new wait. Keyed by
/// thread alone, a spinlock contended inside a sleeping wait (the percpu rw_semaphore's wait
/// queue lock) would replace the outer wait's start.
fn long_waits_script(cgroup: &TestCgroup) -> String {
    let path = cgroup.path().display();
    let long = stormwatch_common::LOCK_SITE_MIN_WAIT_NS;
    format!(
        "tracepoint:lock:contention_begin /cgroup == cgroupid(\"{path}\")/ {{ \
         $a = (uint64)args->lock_addr; \
         if ((args->flags & 1) && (args->flags & 56) == 0) {{ \
         @spin_start[cpu] = nsecs; @spin_lock[cpu] = $a; }} \
         else if (@lock[tid] != $a) {{ @start[tid] = nsecs; @lock[tid] = $a; }} }}\n\
         tracepoint:lock:contention_end {{ $a = (uint64)args->lock_addr; \
         if (@spin_start[cpu] && @spin_lock[cpu] == $a) {{ \
         $w = nsecs - @spin_start[cpu]; if ($w >= {long}) {{ @long_waits = count(); }} \
         delete(@spin_start[cpu]); delete(@spin_lock[cpu]); }} \
         else if (@start[tid] && @lock[tid] == $a) {{ \
         $v = nsecs - @start[tid]; if ($v >= {long}) {{ @long_waits = count(); }} \
         delete(@start[tid]); delete(@lock[tid]); }} }}\n\
         END {{ clear(@start); clear(@lock); clear(@spin_start); clear(@spin_lock); }}\n"
    )
}

/// A storm of long kernel-lock waits (four `stress-ng --flock` workers on one file: about
/// 11,000 waits of 10 µs or more a second per CPU on a 2-vCPU VM) spends each CPU's stack-walk
/// budget: the call sites cover at most the walks the budget allows
/// (`stormwatch_common::stack_walk_allowed`: 1,000 at once, then 1,000 a second per CPU), and
/// every other long wait is counted in `kernel_lock_waits_unwalked`, so that the two together
/// are every long wait bpftrace saw.
#[test]
fn flock_storm_call_sites_keep_to_the_stack_walk_budget() {
    use stormwatch_common::{LOCK_STACK_WALK_BURST_NS, LOCK_STACK_WALK_INTERVAL_NS};
    require_bpf();
    let cgroup = TestCgroup::new("flock-storm");
    let seconds = 3.0;
    let bt = Bpftrace::start(&long_waits_script(&cgroup));
    let mut agent = Agent::trace_workload(seconds, Some(&cgroup), false);
    let started = std::time::Instant::now();
    let child = run_in_cgroup(
        Command::new(tool("stress-ng", "apt-get install stress-ng")).args([
            "--flock",
            "4",
            "--timeout",
            &format!("{seconds}"),
        ]),
        &cgroup,
    );
    let out = child.wait_with_output().expect("waiting for stress-ng");
    let elapsed = started.elapsed().as_secs_f64();
    assert!(out.status.success(), "stress-ng --flock failed: {out:?}");
    agent.assert_still_tracing("the flock storm");
    let maps = bt.stop();
    let done = agent.finish();
    let c = done.trace.container(&cgroup);
    let bt_long = maps.require("@long_waits") as f64;
    let sites = c
        .kernel_lock_sites
        .as_ref()
        .unwrap_or_else(|| panic!("kernel_lock_sites should be a list: {c:#?}"));
    let unwalked = c
        .kernel_lock_waits_unwalked
        .as_ref()
        .unwrap_or_else(|| panic!("kernel_lock_waits_unwalked should be set: {c:#?}"));
    let walked: f64 = sites.iter().map(|s| s.count as f64).sum();
    // Each CPU walks at most a burst and then one stack per interval, in the workload's life
    // (no wait of the cgroup is long before it starts or after it ends).
    let per_cpu = (LOCK_STACK_WALK_BURST_NS / LOCK_STACK_WALK_INTERVAL_NS) as f64
        + 1.0
        + elapsed * 1e9 / LOCK_STACK_WALK_INTERVAL_NS as f64;
    let budget = per_cpu * cpus() as f64;
    eprintln!(
        "flock storm {elapsed:.2} s: bpftrace {bt_long} long waits; agent sites {walked} ({} \
         sites), unwalked {unwalked:?}; budget {budget}\n  sites {sites:?}",
        sites.len()
    );
    assert!(
        bt_long >= 2.0 * budget,
        "the flock storm should wait 10 µs or more well past the walk budget ({budget}) on {} \
         CPUs; bpftrace saw {bt_long}",
        cpus()
    );
    assert!(
        walked > 0.0 && walked <= budget,
        "the call sites cover the walked waits only, at most {budget}: {walked}"
    );
    assert!(
        unwalked.count > 0 && unwalked.wait_seconds > 0.0,
        "the waits past the budget are counted: {unwalked:?}"
    );
    // Every long wait is in a site or among the unwalked, and the sites hold at most the
    // budget's walks: the unwalked are at least the long waits past the budget, and with the
    // sites listed (the list is cut at its top entries) at most all of them.
    assert_within_bounds(
        "unwalked long waits",
        unwalked.count as f64,
        0.9 * (bt_long - budget),
        1.1 * bt_long - walked,
    );
}

#[track_caller]
fn assert_within_bounds(what: &str, value: f64, low: f64, high: f64) {
    assert!(
        value >= low && value <= high,
        "{what}: {value} should be within [{low}, {high}]"
    );
}
