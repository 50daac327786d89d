//! The code that takes a contended lock, named from sampled hand-offs (`lock_call_sites` in
//! `trace --json`, the `lock_storm` finding of `diagnose`), against programs whose lock is known
//! from their source:
//!
//! - lockbench (tests/corpus/lockbench.c), built with and without frame pointers: its threads
//!   wait in `worker` at the line that calls `pthread_mutex_lock` and hand on at the line that
//!   calls `pthread_mutex_unlock`;
//! - CPython (the interpreter of this machine, a program nobody here wrote), threads in pure
//!   Python: the GIL, taken in `take_gil` and handed on in `drop_gil` (Python/ceval_gil.h);
//! - the JVM (tests/corpus/Corpus.java): a fair `ReentrantLock` and a `synchronized` monitor,
//!   named from the JVM's perf map when it keeps frame pointers, and otherwise unnamed with the
//!   flag that would name them;
//! - a stripped binary (Debian's sysbench) and Go's runtime, which must not be misnamed; and
//!   lock-free CPU-bound work, which names nothing;
//! - the holder's part: a holder made to sleep while it holds the lock, or throttled by a
//!   quota, raises the share of holds it spent switched out.

use std::{
    os::unix::process::CommandExt as _,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;
use stormwatch_tests::{
    Agent, TestCgroup,
    corpus::{Quota, built_programs},
    daemon::tool,
    join_before_exec, require_bpf,
};

/// A workload in a cgroup of its own, killed (with its process group) on drop.
struct Workload {
    cgroup: TestCgroup,
    child: std::process::Child,
    _quota: Option<Quota>,
}

impl Drop for Workload {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group this child leads.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

fn start(name: &str, mut cmd: Command, quota: Option<f64>) -> Workload {
    let cgroup = TestCgroup::new(&format!("callsites-{name}"));
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    let quota = quota.map(|q| Quota::apply(&mut cmd, &cgroup, q));
    join_before_exec(&mut cmd, &cgroup.path().join("cgroup.procs"));
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
    Workload {
        cgroup,
        child,
        _quota: quota,
    }
}

/// `trace --json` of the workload's cgroup for `seconds`: its `lock_call_sites`.
fn sites(w: &Workload, seconds: u32) -> Value {
    let seconds = seconds.to_string();
    let done = Agent::trace(&[
        "--json",
        "--duration",
        &seconds,
        "--cgroup",
        w.cgroup.rel_path(),
    ])
    .finish();
    let c = done.report["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["cgroup"] == w.cgroup.rel_path()))
        .unwrap_or_else(|| panic!("{} is not in the document", w.cgroup.rel_path()))
        .clone();
    assert!(
        c["lock_call_sites"].is_object(),
        "hand-offs are not sampled here: {}",
        c["lock_call_sites"]
    );
    c["lock_call_sites"].clone()
}

fn lockbench(binary: &str, args: &[&str]) -> Command {
    let mut c = Command::new(built_programs().join(binary));
    c.args(["--lock", "mutex", "--seconds", "60"]).args(args);
    c
}

/// The line of `source` (under tests/corpus) that holds `needle`, as `file:line`.
fn line_of(source: &str, needle: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(source);
    let text = std::fs::read_to_string(&path).expect("the corpus source");
    let hits: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(needle))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(hits.len(), 1, "{needle} in {source}: lines {hits:?}");
    format!("{source}:{}", hits[0])
}

/// The pair with the most sampled hand-offs, after checking there were enough to judge.
#[track_caller]
fn top_pair(s: &Value, min_sampled: u64) -> &Value {
    let n = s["sampled_handoffs"].as_u64().expect("sampled_handoffs");
    assert!(n >= min_sampled, "only {n} sampled hand-offs: {s:#}");
    &s["pairs"][0]
}

#[test]
fn native_lock_sites_are_named_with_and_without_frame_pointers() {
    require_bpf();
    let lock_line = line_of("lockbench.c", "pthread_mutex_lock(&s->lock.mutex)");
    let unlock_line = line_of("lockbench.c", "pthread_mutex_unlock(&s->lock.mutex)");
    for binary in ["lockbench", "lockbench-nofp"] {
        let w = start(binary, lockbench(binary, &["--threads", "32"]), None);
        std::thread::sleep(Duration::from_secs(1));
        let s = sites(&w, 4);
        let top = top_pair(&s, 20);
        assert!(
            top["share"].as_f64().unwrap() >= 0.9,
            "{binary}: the top pair has only part of the hand-offs: {s:#}"
        );
        let (waiter, waker) = (&top["waiter"], &top["waker"]);
        assert_eq!(waiter["function"], "worker", "{binary}: {s:#}");
        assert_eq!(waiter["lock_function"], "pthread_mutex_lock", "{binary}");
        assert_eq!(waiter["location"], lock_line.as_str(), "{binary}");
        assert_eq!(waiter["module"], binary);
        assert_eq!(waker["function"], "worker", "{binary}: {s:#}");
        assert_eq!(waker["location"], unlock_line.as_str(), "{binary}");
    }
}

#[test]
fn diagnose_names_the_lock_in_the_storm_finding() {
    require_bpf();
    let w = start(
        "diagnose",
        lockbench("lockbench", &["--threads", "32"]),
        None,
    );
    std::thread::sleep(Duration::from_secs(2));
    let out = Agent::start(&["diagnose", "--json", "--duration", "6"]).finish_output();
    // Exit 3: findings.
    assert_eq!(out.status.code(), Some(3), "{}", out.stderr.join("\n"));
    let doc: Value = serde_json::from_str(&out.stdout_text()).expect("diagnose --json");
    let findings = doc["findings"].as_array().expect("findings");
    let storm = findings
        .iter()
        .find(|f| f["kind"] == "lock_storm" && f["cgroup"] == w.cgroup.rel_path())
        .unwrap_or_else(|| panic!("no lock_storm for lockbench: {doc:#}"));
    let lock_line = line_of("lockbench.c", "pthread_mutex_lock(&s->lock.mutex)");
    assert_eq!(
        storm["context"]["waiter_site"],
        format!("`worker` ({lock_line}) via `pthread_mutex_lock`").as_str()
    );
    assert!(storm["evidence"]["sampled_handoffs"].as_f64().unwrap() >= 10.0);
    assert!(storm["evidence"]["top_waiter_site_share"].as_f64().unwrap() >= 0.9);
    let recs: Vec<&str> = storm["recommendations"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        recs.iter()
            .any(|r| r.starts_with("Change the code that takes the lock")
                && r.contains(&format!("`worker` ({lock_line})"))),
        "{recs:#?}"
    );
}

#[test]
fn a_third_party_interpreter_names_its_own_lock() {
    require_bpf();
    // CPython's GIL: every pure-Python thread takes it in take_gil and hands it on in drop_gil
    // (Python/ceval_gil.h). The machine's own interpreter, with its symbols.
    let python = tool("python3", "the machine's CPython (pyenv)");
    let mut cmd = Command::new(python);
    cmd.args([
        "-c",
        "import threading\n\
         def spin():\n    x = 0\n    while True:\n        x += 1\n\
         ts = [threading.Thread(target=spin, daemon=True) for _ in range(16)]\n\
         [t.start() for t in ts]\n\
         import time; time.sleep(60)\n",
    ]);
    let w = start("cpython", cmd, None);
    std::thread::sleep(Duration::from_secs(1));
    let s = sites(&w, 6);
    top_pair(&s, 10);
    // Both directions are the GIL's hand-offs: a thread waiting in take_gil is handed the GIL
    // by drop_gil; one that dropped it on request waits in drop_gil until take_gil confirms.
    let gil = ["take_gil", "drop_gil"];
    let mut take_from_drop = 0;
    for pair in s["pairs"].as_array().unwrap() {
        let (waiter, waker) = (&pair["waiter"], &pair["waker"]);
        for side in [waiter, waker] {
            if let Some(f) = side["function"].as_str() {
                assert!(gil.contains(&f), "{f} is not the GIL's: {s:#}");
                assert!(
                    side["location"]
                        .as_str()
                        .is_some_and(|l| l.starts_with("ceval_gil.h:")),
                    "{s:#}"
                );
            }
        }
        if waiter["function"] == "take_gil" && waker["function"] == "drop_gil" {
            take_from_drop += pair["sampled_handoffs"].as_u64().unwrap();
        }
    }
    let sampled = s["sampled_handoffs"].as_u64().unwrap();
    assert!(
        take_from_drop * 10 >= sampled * 3,
        "only {take_from_drop} of {sampled} sampled hand-offs wait in take_gil for drop_gil: {s:#}"
    );
}

#[test]
fn a_stripped_binary_and_gos_runtime_are_not_misnamed() {
    require_bpf();
    // sysbench from Debian has no symbol for its own functions: its lock cannot be named, and
    // the finding must say so rather than name a neighbouring exported symbol.
    let sysbench = tool("sysbench", "apt-get install sysbench");
    let mut cmd = Command::new(sysbench);
    cmd.args([
        "mutex",
        "--threads=32",
        "--mutex-num=1",
        "--mutex-locks=1000000000",
        "--time=60",
        "run",
    ]);
    let w = start("sysbench", cmd, None);
    std::thread::sleep(Duration::from_secs(1));
    let s = sites(&w, 4);
    let top = top_pair(&s, 5);
    assert_eq!(top["waiter"]["function"], Value::Null, "{s:#}");
    assert_eq!(
        top["waiter"]["unnamed"], "a stripped binary without symbols",
        "{s:#}"
    );
    assert!(
        s["hints"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h.as_str().unwrap().contains("(sysbench,")),
        "{s:#}"
    );
    drop(w);

    // Go parks goroutines in its own scheduler: most futex waits are its idle threads', named
    // as the runtime's. Those of a sync.Mutex's slow path (its waiters and unlockers queue on
    // the runtime's semaphore lock, itself a futex lock) name the function whose mutex it is:
    // `worker` in tests/corpus/gomutex/main.go. No other Go function is named.
    let mut cmd = Command::new(built_programs().join("gomutex"));
    cmd.env("GOMAXPROCS", "8")
        .args(["-goroutines", "256", "-seconds", "60"]);
    let w = start("gomutex", cmd, None);
    std::thread::sleep(Duration::from_secs(1));
    let s = sites(&w, 4);
    let mut named = 0;
    for pair in s["pairs"].as_array().unwrap() {
        for side in ["waiter", "waker"] {
            let site = &pair[side];
            match site["function"].as_str() {
                Some(f) => {
                    assert_eq!(f, "main.worker", "{s:#}");
                    named += pair["sampled_handoffs"].as_u64().unwrap();
                }
                None => assert!(
                    site["unnamed"]
                        .as_str()
                        .unwrap()
                        .starts_with("Go's runtime"),
                    "{s:#}"
                ),
            }
        }
    }
    assert!(
        named > 0,
        "the sync.Mutex's function was never named: {s:#}"
    );
}

#[test]
fn lock_free_cpu_bound_work_names_nothing() {
    require_bpf();
    let mut cmd = Command::new(tool("stress-ng", "apt-get install stress-ng"));
    cmd.args(["--cpu", "4", "-t", "60"]);
    let w = start("cpu-bound", cmd, None);
    std::thread::sleep(Duration::from_secs(1));
    let s = sites(&w, 3);
    assert_eq!(s["sampled_handoffs"], 0, "{s:#}");
    assert_eq!(s["pairs"], Value::Array(Vec::new()));
}

fn jvm(mode: &str, preserve_frame_pointers: bool) -> Command {
    let mut c = Command::new(tool("java", "apt-get install openjdk-17-jre-headless"));
    if preserve_frame_pointers {
        c.arg("-XX:+PreserveFramePointer");
    }
    c.arg("-cp")
        .arg(built_programs())
        .args(["Corpus", mode, "16", "60"]);
    c
}

/// Asks the JVM of `w` to write its perf map (`jcmd <pid> Compiler.perfmap`), as the finding's
/// hint says to.
fn write_perf_map(w: &Workload) {
    let jcmd = tool("jcmd", "apt-get install openjdk-17-jdk-headless");
    let status = Command::new(jcmd)
        .arg(w.child.id().to_string())
        .arg("Compiler.perfmap")
        .stdout(Stdio::null())
        .status()
        .expect("running jcmd");
    assert!(status.success(), "jcmd Compiler.perfmap failed: {status}");
}

#[test]
fn jvm_lock_sites_are_named_from_its_perf_map() {
    require_bpf();
    for (mode, worker) in [
        ("fair", "Corpus.fairLockWorker"),
        ("storm", "Corpus.monitorWorker"),
    ] {
        let w = start(&format!("jvm-{mode}"), jvm(mode, true), None);
        // Warm-up: the workers' loops compiled before the perf map is written.
        std::thread::sleep(Duration::from_secs(5));
        write_perf_map(&w);
        let s = sites(&w, 6);
        let top = top_pair(&s, 10);
        assert_eq!(top["waiter"]["function"], worker, "{mode}: {s:#}");
        assert_eq!(top["waker"]["function"], worker, "{mode}: {s:#}");
        assert_eq!(top["waiter"]["module"], "JIT");
    }
    // Without frame pointers in its compiled code the Java frames cannot be walked: nothing is
    // named, and the hint says which flag would name them.
    let w = start("jvm-no-frame-pointers", jvm("fair", false), None);
    std::thread::sleep(Duration::from_secs(5));
    write_perf_map(&w);
    let s = sites(&w, 4);
    let top = top_pair(&s, 10);
    assert_eq!(top["waiter"]["function"], Value::Null, "{s:#}");
    assert!(
        s["hints"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h.as_str().unwrap().contains("-XX:+PreserveFramePointer")),
        "{s:#}"
    );
}

/// The holder's figures over a lockbench whose threads sleep after they let the lock go (so that
/// a woken waiter, not the releaser, takes it next — its hold is then on record — and the
/// holder has a CPU to itself): (asleep share of holds, runnable share of hold time, holds).
fn holder_shares(name: &str, extra: &[&str], quota: Option<f64>) -> (f64, f64, u64) {
    let mut args = vec!["--threads", "8", "--cs", "100000", "--sleep-out", "200"];
    args.extend_from_slice(extra);
    let w = start(name, lockbench("lockbench", &args), quota);
    std::thread::sleep(Duration::from_secs(1));
    let s = sites(&w, 6);
    let holds = s["holds"].as_u64().unwrap_or(0);
    eprintln!(
        "{name}: {} sampled, {holds} holds, asleep {}, preempted {}, runnable {}",
        s["sampled_handoffs"],
        s["holder_asleep_share"],
        s["holder_preempted_share"],
        s["holder_runnable_share"]
    );
    assert!(holds >= 5, "{name}: only {holds} holds on record: {s:#}");
    (
        s["holder_asleep_share"].as_f64().unwrap(),
        s["holder_runnable_share"].as_f64().unwrap(),
        holds,
    )
}

#[test]
fn the_holder_off_cpu_shares_rise_when_it_sleeps_or_is_throttled_holding_the_lock() {
    require_bpf();
    let (asleep_base, runnable_base, _) = holder_shares("holder-base", &[], None);
    let (asleep, _, _) = holder_shares("holder-sleeps", &["--sleep-in-cs", "500"], None);
    let (_, runnable, _) = holder_shares("holder-throttled", &[], Some(0.3));
    assert!(
        asleep_base <= 0.2,
        "a holder that never sleeps slept in {asleep_base} of its holds"
    );
    assert!(
        asleep >= 0.8,
        "a holder that sleeps in every critical section slept in only {asleep} of its holds"
    );
    // Throttled, a holder waits out the rest of the period holding the lock: its run-queue
    // wait (throttled time counts as runnable) becomes most of the holds' time.
    assert!(
        runnable >= 0.3 && runnable >= runnable_base + 0.2,
        "throttled to 0.3 CPU, the holder was runnable without a CPU for {runnable} of its \
         holds' time (unthrottled: {runnable_base})"
    );
}
