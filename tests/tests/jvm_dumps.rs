//! JVM thread dumps (agent/src/identity/jvm.rs: HotSpot's attach mechanism, as `jstack` uses
//! it) against JVMs whose threads' waits are known from their source (tests/corpus/Corpus.java):
//!
//! - `convoy`: 32 threads take one non-fair `ReentrantLock` around a long section: its threads
//!   wait for the lock and nothing else;
//! - `queue`: a pool of 200 workers fed 20,000 tasks a second by one producer: its workers wait
//!   in the queue's `take` for work.
//!
//! The threads are named by the kernel (`/proc/<pid>/task/<tid>/comm`), not by the dump, so a
//! thread the dump's ids put on the wrong host thread fails the test; and a JVM that must not be
//! signalled (`-Xrs`, attach disabled) must neither die nor print a dump. End to end, `diagnose`
//! must take dumps of the pool and judge its workers by them (no `lock_storm`), and take none
//! with `--no-jvm-thread-dumps`.

use std::{
    collections::HashMap,
    io::Read as _,
    os::unix::process::CommandExt as _,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use serde_json::Value;
use stormwatch::identity::jvm::{
    Waiting,
    attach::{AttachError, thread_dump},
    census_of,
};
use stormwatch_tests::{
    TestCgroup, agent_output, corpus::built_programs, daemon::tool, require_bpf, run_in_cgroup,
};

/// A JVM running a Corpus.java mode, killed (with its process group) on drop.
struct Jvm {
    child: Child,
    pid: u32,
}

impl Jvm {
    /// `java [jvm_flags] Corpus <args>`, behind `wrapper` (e.g. `unshare …`) when given: then
    /// the JVM is the wrapper's child, found by its parent.
    fn start(
        wrapper: &[&str],
        jvm_flags: &[&str],
        args: &[&str],
        cgroup: Option<&TestCgroup>,
    ) -> Self {
        let java = tool("java", "apt-get install openjdk-17-jre-headless");
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&java);
                c
            }
            None => Command::new(&java),
        };
        cmd.args(jvm_flags)
            .arg("-cp")
            .arg(built_programs())
            .arg("Corpus")
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        let child = match cgroup {
            Some(cg) => run_in_cgroup(&mut cmd, cg),
            None => cmd.stdout(Stdio::piped()).spawn().expect("starting java"),
        };
        let mut pid = child.id();
        if !wrapper.is_empty() {
            let children = Path::new("/proc")
                .join(pid.to_string())
                .join("task")
                .join(pid.to_string())
                .join("children");
            for _ in 0..100 {
                let text = std::fs::read_to_string(&children).unwrap_or_default();
                if let Some(c) = text.split_whitespace().next() {
                    pid = c.parse().expect("a child's pid");
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            assert_ne!(pid, child.id(), "{wrapper:?} started no child");
        }
        // Past the JVM's start-up: its threads are running the mode.
        std::thread::sleep(Duration::from_secs(3));
        Self { child, pid }
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().expect("waitpid").is_none()
    }
}

impl Drop for Jvm {
    fn drop(&mut self) {
        // SAFETY: kill(2) of the process group this test started.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// Each thread's name, as the kernel has it.
fn names(pid: u32) -> HashMap<u32, String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("the JVM's tasks")
        .flatten()
        .filter_map(|e| {
            let tid = e.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            Some((tid, comm.trim_end().to_owned()))
        })
        .collect()
}

/// Over `dumps` dumps of `jvm`: of the threads whose kernel name starts with `prefix`, how
/// many were found waiting for a lock and for work, and how many found waiting had another
/// name or no thread of the JVM at all.
fn census(jvm: &Jvm, prefix: &str, dumps: u32) -> (u32, u32, u32) {
    let (mut lock, mut work, mut stray) = (0, 0, 0);
    for _ in 0..dumps {
        let found = census_of(jvm.pid).unwrap_or_else(|e| panic!("dump of {}: {e}", jvm.pid));
        let names = names(jvm.pid);
        for (tid, w) in found {
            match names.get(&tid) {
                Some(n) if n.starts_with(prefix) => match w {
                    Waiting::Lock => lock += 1,
                    Waiting::Work => work += 1,
                },
                Some(_) => {}
                None => stray += 1,
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    (lock, work, stray)
}

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "these tests attach to JVMs and create cgroups: run them as root"
    );
}

#[test]
fn a_locks_waiters_and_a_pools_workers_are_told_apart() {
    require_root();
    let convoy = Jvm::start(&[], &[], &["convoy", "32", "60"], None);
    let pool = Jvm::start(&[], &[], &["queue", "200", "60", "20000"], None);
    // The convoy's 32 workers (`Thread-N`) hold or wait for the lock: ~31 parked on it.
    let (lock, work, stray) = census(&convoy, "Thread-", 3);
    eprintln!("convoy: {lock} found waiting for the lock, {work} for work, {stray} unknown");
    assert_eq!(
        stray, 0,
        "a thread id the JVM's dump gave is none of its threads"
    );
    assert!(
        lock >= 3 * 24,
        "the convoy's waiters found waiting for its lock: {lock} of 3 dumps"
    );
    assert!(
        work * 20 <= lock,
        "convoy workers found waiting for work: {work} against {lock}"
    );
    // The pool's 200 workers (`pool-1-thread-N`) wait in the queue's take, the producer
    // rarely (its queue is never full at this rate).
    let (lock, work, stray) = census(&pool, "pool-1-thread-", 3);
    eprintln!("pool: {lock} found waiting for a lock, {work} for work, {stray} unknown");
    assert_eq!(stray, 0);
    assert!(
        work >= 3 * 150,
        "the pool's idle workers found waiting for work: {work}"
    );
    assert!(
        lock * 20 <= work,
        "pool workers found waiting for a lock: {lock} against {work}"
    );
}

#[test]
fn a_jvm_in_a_pid_namespace_of_its_own_is_dumped_by_its_host_threads() {
    require_root();
    // As in a container: the JVM is pid 1 of its namespace, its threads' ids there are not the
    // host's, and its attach socket is named by its own pid.
    let convoy = Jvm::start(
        &["unshare", "--pid", "--fork", "--mount-proc"],
        &[],
        &["convoy", "32", "60"],
        None,
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", convoy.pid)).unwrap();
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("NSpid:") && l.ends_with("\t1")),
        "the JVM is not pid 1 of a namespace of its own:\n{status}"
    );
    let (lock, work, stray) = census(&convoy, "Thread-", 2);
    eprintln!("convoy in its namespace: {lock} lock, {work} work, {stray} unknown");
    assert_eq!(stray, 0, "a namespace's thread id was taken for a host one");
    assert!(
        lock >= 2 * 24,
        "its waiters found waiting for the lock: {lock}"
    );
}

#[test]
fn a_process_that_must_not_be_signalled_is_not() {
    require_root();
    // A process that does not catch SIGQUIT (here `sleep`; a JVM not HotSpot): the signal
    // would kill it.
    let mut sleeper = Command::new("sleep")
        .arg("30")
        .process_group(0)
        .spawn()
        .expect("sleep");
    match thread_dump(sleeper.id(), Duration::from_secs(1)) {
        Err(AttachError::NoQuitHandler(pid)) => assert_eq!(pid, sleeper.id()),
        other => panic!("a process without a SIGQUIT handler: {other:?}"),
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(sleeper.try_wait().unwrap().is_none(), "it was killed");
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    // -Xrs: HotSpot catches no SIGQUIT, and opens its attach socket at start instead: it is
    // dumped through it, and lives on.
    let mut xrs = Jvm::start(&[], &["-Xrs"], &["timers", "2", "30"], None);
    let dump = thread_dump(xrs.pid, Duration::from_secs(2)).expect("a dump through its socket");
    assert!(dump.contains("Full thread dump"), "{dump}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(xrs.alive(), "the JVM with -Xrs died");
    // Attach disabled: SIGQUIT would print a thread dump on its standard output instead.
    let mut off = Jvm::start(
        &[],
        &["-XX:+DisableAttachMechanism"],
        &["timers", "2", "4"],
        None,
    );
    match thread_dump(off.pid, Duration::from_secs(2)) {
        Err(AttachError::Disabled(pid)) => assert_eq!(pid, off.pid),
        other => panic!("a JVM with attach disabled: {other:?}"),
    }
    let status = off.child.wait().expect("the JVM's end");
    assert!(
        status.success(),
        "the JVM with attach disabled ended with {status}"
    );
    let mut out = String::new();
    off.child
        .stdout
        .take()
        .expect("piped")
        .read_to_string(&mut out)
        .unwrap();
    assert!(
        !out.contains("Full thread dump"),
        "it was signalled:\n{out}"
    );
    assert!(
        out.contains("\"mode\":\"timers\""),
        "its result line: {out}"
    );
    // No trigger file is left behind in either's working directory (this test's).
    let cwd = std::env::current_dir().unwrap();
    for pid in [xrs.pid, off.pid] {
        let trigger = cwd.join(format!(".attach_pid{pid}"));
        assert!(
            !trigger.exists(),
            "a trigger file was left: {}",
            trigger.display()
        );
    }
}

/// `checked.lock_storm`'s entry of `cgroup` in a `diagnose --json` document.
fn checked_storm<'a>(doc: &'a Value, cgroup: &TestCgroup) -> &'a Value {
    doc["checked"]["lock_storm"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["cgroup"] == cgroup.rel_path()))
        .unwrap_or_else(|| {
            panic!(
                "no checked.lock_storm entry for {}: {doc}",
                cgroup.rel_path()
            )
        })
}

/// `diagnose --json` with `args`: its document. Its exit status says whether it found
/// something; the document is what is judged.
fn diagnose_json(args: &[&str]) -> Value {
    let out = agent_output(&[&["diagnose", "--json"], args].concat());
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "diagnose's JSON: {e}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn diagnose_judges_a_jvm_pools_workers_by_their_dumps() {
    require_bpf();
    let cgroup = TestCgroup::new("jvm-dumps");
    let _pool = Jvm::start(&[], &[], &["queue", "200", "60", "20000"], Some(&cgroup));
    let doc = diagnose_json(&["--duration", "5"]);
    let c = checked_storm(&doc, &cgroup);
    eprintln!("with dumps: {c}");
    let dumps = c["jvm_thread_dumps"].as_u64().unwrap();
    assert!(dumps >= 3, "dumps of the pool in a 5-s window: {dumps}");
    assert!(
        c["jvm_threads_waiting_for_work"].as_f64().unwrap() >= 150.0,
        "the pool's workers found waiting for work, per dump: {c}"
    );
    assert!(c["jvm_threads_waiting_for_a_lock"].as_f64().unwrap() < 10.0);
    assert!(c["dump_judged_threads"].as_u64().unwrap() >= 150);
    assert_eq!(c["lock_storm"], false);
    // Without dumps nothing is asked of the JVM.
    let doc = diagnose_json(&["--duration", "3", "--no-jvm-thread-dumps"]);
    let c = checked_storm(&doc, &cgroup);
    eprintln!("without dumps: {c}");
    assert_eq!(c["jvm_thread_dumps"], 0, "{c}");
    assert_eq!(c["dump_judged_threads"], 0, "{c}");
}
