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
//! - Go's `sync.Mutex` (uprobes on its slow paths, in bursts): its code named, its contended
//!   `Lock` calls counted against the program's own count, and named by `diagnose`;
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

use stormwatch_tests::{
    Agent, TestCgroup,
    bpftrace::Bpftrace,
    corpus::{Quota, built_programs, go_program},
    daemon::{Daemon, basic, finding, http_get_bytes, sample_with, tool, wait_for, write_file},
    join_before_exec,
    report::{self, Diagnosis, HandoffPair, LockCallSites},
    require_bpf,
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
    let quota = quota.map(|q| Quota::apply(&mut cmd, &cgroup, Some(q)));
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
fn sites(w: &Workload, seconds: u32) -> LockCallSites {
    sites_with(w, seconds, &[])
}

/// [`sites`], with more arguments to `trace`.
fn sites_with(w: &Workload, seconds: u32, extra: &[&str]) -> LockCallSites {
    let seconds = seconds.to_string();
    let mut args = vec![
        "--json",
        "--duration",
        &seconds,
        "--cgroup",
        w.cgroup.rel_path(),
    ];
    args.extend_from_slice(extra);
    let done = Agent::trace(&args).finish();
    let c = done
        .trace
        .container_by_path(w.cgroup.rel_path())
        .unwrap_or_else(|| panic!("{} is not in the document", w.cgroup.rel_path()));
    c.lock_call_sites
        .clone()
        .unwrap_or_else(|| panic!("hand-offs are not sampled here: {c:#?}"))
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

/// Checks there were at least `min_sampled` sampled hand-offs, enough to judge.
#[track_caller]
fn enough_sampled(s: &LockCallSites, min_sampled: u64) {
    let n = s.sampled_handoffs;
    assert!(n >= min_sampled, "only {n} sampled hand-offs: {s:#?}");
}

/// The pair with the most sampled hand-offs, after checking there were enough to judge.
#[track_caller]
fn top_pair(s: &LockCallSites, min_sampled: u64) -> &HandoffPair {
    enough_sampled(s, min_sampled);
    s.pairs
        .first()
        .unwrap_or_else(|| panic!("no pair of sites: {s:#?}"))
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
            top.share >= 0.9,
            "{binary}: the top pair has only part of the hand-offs: {s:#?}"
        );
        let (waiter, waker) = (&top.waiter, &top.waker);
        assert_eq!(
            waiter.function.as_deref(),
            Some("worker"),
            "{binary}: {s:#?}"
        );
        assert_eq!(
            waiter.lock_function.as_deref(),
            Some("pthread_mutex_lock"),
            "{binary}"
        );
        assert_eq!(
            waiter.location.as_deref(),
            Some(lock_line.as_str()),
            "{binary}"
        );
        assert_eq!(waiter.module.as_deref(), Some(binary));
        assert_eq!(
            waker.function.as_deref(),
            Some("worker"),
            "{binary}: {s:#?}"
        );
        assert_eq!(
            waker.location.as_deref(),
            Some(unlock_line.as_str()),
            "{binary}"
        );
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
    let doc: Diagnosis = report::parse("diagnose --json", &out.stdout_text());
    let storm = report::find(&doc.findings, "lock_storm", w.cgroup.rel_path())
        .unwrap_or_else(|| panic!("no lock_storm for lockbench: {doc:#?}"));
    let lock_line = line_of("lockbench.c", "pthread_mutex_lock(&s->lock.mutex)");
    assert_eq!(
        storm.context("waiter_site"),
        Some(format!("`worker` ({lock_line}) via `pthread_mutex_lock`").as_str())
    );
    assert!(storm.evidence("sampled_handoffs").unwrap() >= 10.0);
    assert!(storm.evidence("top_waiter_site_share").unwrap() >= 0.9);
    let recs = &storm.recommendations;
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
    enough_sampled(&s, 10);
    // Both directions are the GIL's hand-offs: a thread waiting in take_gil is handed the GIL
    // by drop_gil; one that dropped it on request waits in drop_gil until take_gil confirms.
    let gil = ["take_gil", "drop_gil"];
    let mut take_from_drop = 0;
    for pair in &s.pairs {
        let (waiter, waker) = (&pair.waiter, &pair.waker);
        for side in [waiter, waker] {
            if let Some(f) = side.function.as_deref() {
                assert!(gil.contains(&f), "{f} is not the GIL's: {s:#?}");
                assert!(
                    side.location
                        .as_deref()
                        .is_some_and(|l| l.starts_with("ceval_gil.h:")),
                    "{s:#?}"
                );
            }
        }
        if waiter.function.as_deref() == Some("take_gil")
            && waker.function.as_deref() == Some("drop_gil")
        {
            take_from_drop += pair.sampled_handoffs;
        }
    }
    let sampled = s.sampled_handoffs;
    assert!(
        take_from_drop * 10 >= sampled * 3,
        "only {take_from_drop} of {sampled} sampled hand-offs wait in take_gil for drop_gil: {s:#?}"
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
    // Most of its contended calls find the word changed before they sleep (EAGAIN): on an AMD
    // 2-vCPU guest 98 woken waits in 4 s against 10,996 (2026-11-28), so 4 s sampled 3–6
    // hand-offs. 10 s sample enough to name the pair.
    let s = sites(&w, 10);
    let top = top_pair(&s, 5);
    assert_eq!(top.waiter.function, None, "{s:#?}");
    assert_eq!(
        top.waiter.unnamed.as_deref(),
        Some("a stripped binary without symbols"),
        "{s:#?}"
    );
    assert!(s.hints.iter().any(|h| h.contains("(sysbench,")), "{s:#?}");
    drop(w);

    // Go parks goroutines in its own scheduler: most futex waits are its idle threads', named
    // as the runtime's. Those of a sync.Mutex's slow path (its waiters and unlockers queue on
    // the runtime's semaphore lock, itself a futex lock) name the function whose mutex it is:
    // `worker` in tests/corpus/gomutex/main.go. No other Go function is named.
    let mut cmd = Command::new(go_program("gomutex"));
    cmd.env("GOMAXPROCS", "8")
        .args(["-goroutines", "256", "-seconds", "60"]);
    let w = start("gomutex", cmd, None);
    std::thread::sleep(Duration::from_secs(1));
    let s = sites(&w, 4);
    let mut named = 0;
    for pair in &s.pairs {
        for site in [&pair.waiter, &pair.waker] {
            match site.function.as_deref() {
                Some(f) => {
                    assert_eq!(f, "main.worker", "{s:#?}");
                    named += pair.sampled_handoffs;
                }
                None => assert!(
                    site.unnamed.as_deref().unwrap().starts_with("Go's runtime"),
                    "{s:#?}"
                ),
            }
        }
    }
    assert!(
        named > 0,
        "the sync.Mutex's function was never named: {s:#?}"
    );
}

/// `file:line` of the line of tests/corpus/`dir`/`file` that holds `needle`, as DWARF names it
/// (the file name alone).
fn go_line(dir: &str, file: &str, needle: &str) -> String {
    let at = line_of(&format!("{dir}/{file}"), needle);
    at.rsplit('/').next().unwrap().to_owned()
}

/// Go's `sync.Mutex`, which the futex path cannot see, from uprobes on its slow paths attached
/// in bursts: the code that calls `Lock` on it held and `Unlock` with waiters, named from
/// tests/corpus/gomutex/main.go, and the calls counted in each burst against bpftrace's, an
/// independent oracle that sees every call with the kernel's clock: the agent logs, on that
/// clock, when each burst's counting surely ran and when it may have (the microseconds of a
/// map update at each edge), and its count must lie between bpftrace's calls in the two. (The program's own count of its
/// contended `Lock` calls equals bpftrace's over a whole run: 10,294 and 10,294, by hand.)
#[test]
fn go_sync_mutex_contention_is_counted_and_its_code_named() {
    require_bpf();
    let program = go_program("gomutex");
    let mut cmd = Command::new(&program);
    // Slow and regular: a holder takes the mutex 1 ms in 2; 8 goroutines take it every
    // millisecond.
    cmd.args(["-hold-ms", "1", "-goroutines", "8", "-seconds", "30"]);
    let w = start("gomutex-holder", cmd, None);
    let pid = w.child.id();
    let probe = |symbol: &str, tag: &str| {
        format!(
            "uprobe:{}:\"internal/sync.(*Mutex).{symbol}\" /pid == {pid}/ {{ \
             printf(\"{tag} %llu\\n\", nsecs); }}",
            program.display()
        )
    };
    let bt = Bpftrace::start(&format!(
        "{} {}",
        probe("lockSlow", "L"),
        probe("unlockSlow", "U")
    ));
    // Two bursts: at the first collection, and 10 s later.
    let done = Agent::trace(&[
        "--json",
        "--duration",
        "12",
        "--cgroup",
        w.cgroup.rel_path(),
        "--log-level",
        "debug",
    ])
    .finish();
    let calls = bt.stop();
    let times = |tag: &str| -> Vec<u64> {
        calls
            .output
            .lines()
            .filter_map(|l| l.strip_prefix(tag)?.trim().parse().ok())
            .collect()
    };
    let (locks, unlocks) = (times("L "), times("U "));
    let bursts: Vec<[u64; 4]> = done
        .stderr
        .iter()
        .filter_map(|l| {
            let rest = l.split_once("Go mutex burst (CLOCK_MONOTONIC ns): ")?.1;
            let n: Vec<u64> = rest
                .split(", ")
                .filter_map(|f| f.rsplit(' ').next()?.parse().ok())
                .collect();
            n.try_into().ok()
        })
        .collect();
    assert_eq!(bursts.len(), 2, "{}", done.stderr.join("\n"));
    let between = |times: &[u64], from: usize, to: usize| -> u64 {
        bursts
            .iter()
            .map(|b| {
                times
                    .iter()
                    .filter(|t| (b[from]..=b[to]).contains(t))
                    .count() as u64
            })
            .sum()
    };
    let c = done
        .trace
        .container_by_path(w.cgroup.rel_path())
        .expect("the workload's cgroup");
    let go = c
        .lock_call_sites
        .as_ref()
        .and_then(|s| s.go_mutex.as_ref())
        .unwrap_or_else(|| panic!("no Go mutex figures: {c:#?}"));
    for (name, counted, times) in [
        ("contended_locks", go.contended_locks, &locks),
        ("handing_unlocks", go.handing_unlocks, &unlocks),
    ] {
        let (surely, maybe) = (between(times, 1, 2), between(times, 0, 3));
        assert!(
            surely <= counted && counted <= maybe,
            "{name}: the agent counted {counted}; bpftrace saw {surely} while it surely counted \
             and {maybe} while it may have: {go:#?}"
        );
        assert!(
            surely >= 100 && maybe - surely <= surely / 10,
            "{name}: {surely}, {maybe}"
        );
    }
    let probed = go.probed_seconds;
    assert!((0.2..0.3).contains(&probed), "two bursts of 0.1 s: {go:#?}");

    let lock = go
        .lock_sites
        .first()
        .unwrap_or_else(|| panic!("no Lock site: {go:#?}"));
    assert_eq!(
        lock.site.function.as_deref(),
        Some("main.lockCounting"),
        "{go:#?}"
    );
    assert_eq!(
        lock.site.location.as_deref(),
        Some(go_line("gomutex", "main.go", "the contended Lock").as_str()),
        "{go:#?}"
    );
    assert_eq!(
        lock.site.lock_function.as_deref(),
        Some("sync.(*Mutex).Lock")
    );
    assert_eq!(
        lock.share, 1.0,
        "every Lock goes through lockCounting: {go:#?}"
    );
    assert!(lock.sampled >= 20, "{go:#?}");
    let unlocks = &go.unlock_sites;
    let holder = go_line("gomutex", "main.go", "the holder hands on");
    assert!(
        unlocks
            .iter()
            .any(|u| u.site.function.as_deref() == Some("main.holder")
                && u.site.location.as_deref() == Some(holder.as_str())),
        "the holder's Unlock hands the mutex on to waiting takers: {go:#?}"
    );
    for u in unlocks {
        let f = u.site.function.as_deref().unwrap_or("");
        assert!(["main.holder", "main.taker"].contains(&f), "{go:#?}");
    }
}

/// A Go mutex storm in a runtime sized for more CPUs than it has: `diagnose`'s runtime_sizing
/// finding names the code that takes the contended `sync.Mutex`, in the program's language.
#[test]
fn diagnose_names_a_go_programs_contended_mutex() {
    require_bpf();
    let mut cmd = Command::new(go_program("gomutex"));
    cmd.env("GOMAXPROCS", "16")
        .args(["-goroutines", "64", "-seconds", "60"]);
    let w = start("gomutex-diagnose", cmd, None);
    std::thread::sleep(Duration::from_secs(2));
    let dir = tempfile::tempdir().unwrap();
    let out = Agent::start(&[
        "diagnose",
        "--json",
        "--duration",
        "6",
        "--pprof",
        dir.path().to_str().unwrap(),
    ])
    .finish_output();
    assert_eq!(out.status.code(), Some(3), "{}", out.stderr.join("\n"));
    let doc: Diagnosis = report::parse("diagnose --json", &out.stdout_text());
    let sizing = report::find(&doc.findings, "runtime_sizing", w.cgroup.rel_path())
        .unwrap_or_else(|| panic!("no runtime_sizing for gomutex: {doc:#?}"));
    let lock = go_line("gomutex", "main.go", "the storm's Lock");
    let unlock = go_line("gomutex", "main.go", "the storm's Unlock");
    assert_eq!(
        sizing.context("waiter_site"),
        Some(format!("`main.worker` ({lock}) via `sync.(*Mutex).Lock`").as_str()),
        "{sizing:#?}"
    );
    assert_eq!(
        sizing.context("waker_site"),
        Some(format!("`main.worker` ({unlock}) via `sync.(*Mutex).Unlock`").as_str()),
        "{sizing:#?}"
    );
    assert!(
        sizing
            .evidence("go_mutex_contended_locks_per_second")
            .unwrap()
            > 1000.0
    );
    assert!(
        sizing
            .recommendations
            .iter()
            .any(|r| r.starts_with("Change the code that takes the sync.Mutex in `main.worker`")),
        "{sizing:#?}"
    );
    // Its lock profile (`diagnose --pprof`): by default the Go mutex's sampled slow paths,
    // `main.worker` first for both sides.
    let file = profile_of(dir.path(), &w);
    let (header, locks) = pprof_top(&file, None);
    assert_eq!(locks[0].0, "main.worker", "{header}{locks:?}");
    assert!(locks[0].1 > 0.9, "{locks:?}");
    assert!(
        header.contains("Type: go_contended_locks"),
        "the default: {header}"
    );
    let (_, unlocks) = pprof_top(&file, Some("go_handing_unlocks"));
    assert_eq!(unlocks[0].0, "main.worker", "{unlocks:?}");
}

/// `run` exports the Go storm's mutex sites while its runtime_sizing finding holds: the
/// `stormwatch_lock_storm_call_site` series of the waiter (`Lock`) and the waker (`Unlock`)
/// sites (no lines in `run`: it reads no DWARF), as `diagnose` names them.
#[test]
fn run_exports_a_go_programs_contended_mutex() {
    require_bpf();
    // The futex probes (and with them the Go mutex bursts, every 10 s) from the start; a
    // diagnosis window longer than the bursts' period, so that every window holds one.
    let daemon = Daemon::start_configured(
        "futex_probes = \"always\"\ninterval_seconds = 1\ndiagnosis_window_seconds = 12\n",
    );
    let mut cmd = Command::new(go_program("gomutex"));
    cmd.env("GOMAXPROCS", "16")
        .args(["-goroutines", "64", "-seconds", "60"]);
    let w = start("gomutex-run", cmd, None);
    let series = |role: &str, site: &str| {
        sample_with(
            &daemon.metrics(),
            "stormwatch_lock_storm_call_site",
            &[
                ("role", role),
                ("site", site),
                ("cgroup", w.cgroup.rel_path()),
            ],
        )
    };
    let share = wait_for(
        "the Go storm's Lock site on /metrics",
        Duration::from_secs(40),
        || series("waiter", "`main.worker` via `sync.(*Mutex).Lock`"),
    );
    assert!(share > 0.9, "main.worker takes the mutex: share {share}");
    assert!(
        series("waker", "`main.worker` via `sync.(*Mutex).Unlock`").is_some(),
        "{}",
        daemon.metrics()
    );
    assert_eq!(
        finding(&daemon.metrics(), "runtime_sizing", w.cgroup.rel_path()),
        Some(1.0)
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
    assert_eq!(s.sampled_handoffs, 0, "{s:#?}");
    assert!(s.pairs.is_empty(), "{s:#?}");
}

/// `go tool pprof -top` of a lock profile (a file or a URL) for `sample_index` (`None`: the
/// profile's default):
/// its comments and header, and its rows as (function, flat share of the total), most first.
fn pprof_top(
    file: impl AsRef<std::ffi::OsStr>,
    sample_index: Option<&str>,
) -> (String, Vec<(String, f64)>) {
    let out = Command::new(tool("go", "the Go toolchain (https://go.dev/dl)"))
        .args(["tool", "pprof", "-top", "-nodecount=20"])
        .args(sample_index.map(|i| format!("-sample_index={i}")))
        .arg(file)
        .output()
        .expect("running go tool pprof");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "go tool pprof failed: {}{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (header, rows) = text
        .split_once("flat  flat%")
        .unwrap_or_else(|| panic!("no rows in:\n{text}"));
    let rows = rows
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let pct = cols.get(1)?.strip_suffix('%')?.parse::<f64>().ok()?;
            Some((cols[5..].join(" "), pct / 100.0))
        })
        .collect();
    (header.to_owned(), rows)
}

/// The profile `--pprof DIR` wrote for the workload's cgroup (named after its path).
fn profile_of(dir: &Path, w: &Workload) -> std::path::PathBuf {
    let file = w
        .cgroup
        .rel_path()
        .trim_start_matches('/')
        .replace('/', "_");
    let path = dir.join(format!("{file}.lock.pb.gz"));
    assert!(
        path.is_file(),
        "no profile {}: {:?}",
        path.display(),
        std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
    );
    path
}

/// The shares of the document's sampled hand-offs by waiter (or waker) function, over its
/// pairs: what a profile's flat shares of `waits` (or `wakes`) are to match.
fn shares_by(s: &LockCallSites, side: &str, function: &str) -> f64 {
    s.pairs
        .iter()
        .filter(|p| {
            let site = match side {
                "waiter" => &p.waiter,
                "waker" => &p.waker,
                _ => panic!("no side {side}"),
            };
            site.function.as_deref() == Some(function)
        })
        .map(|p| p.share)
        .sum()
}

/// Lock profiles in pprof's format, read by a real client (`go tool pprof`): the native storm's
/// and the JVM storm's put the lock's code first, with the shares `trace --json` gives its
/// waiter and waker sites, over the same sampled hand-offs.
#[test]
fn lock_profiles_put_the_locks_code_first_in_go_tool_pprof() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let w = start(
        "pprof-native",
        lockbench("lockbench", &["--threads", "32"]),
        None,
    );
    std::thread::sleep(Duration::from_secs(1));
    let out = dir.path().join("native");
    let s = sites_with(&w, 4, &["--pprof", out.to_str().unwrap()]);
    let file = profile_of(&out, &w);
    top_pair(&s, 20);
    let (header, waits) = pprof_top(&file, Some("waits"));
    assert_eq!(waits[0].0, "worker", "{header}{waits:?}");
    let want = shares_by(&s, "waiter", "worker");
    assert!(
        (waits[0].1 - want).abs() <= 0.01,
        "pprof's flat share {} against the document's {want}: {s:#?}",
        waits[0].1
    );
    assert!(
        header.contains(&format!("Total samples = {} ", s.sampled_handoffs)),
        "the profile counts the document's sampled hand-offs: {header}"
    );
    let (_, wakes) = pprof_top(&file, Some("wakes"));
    assert_eq!(wakes[0].0, "worker", "{wakes:?}");
    assert!((wakes[0].1 - shares_by(&s, "waker", "worker")).abs() <= 0.01);
    // The machinery and the side are labels.
    let tags = Command::new(tool("go", "the Go toolchain"))
        .args(["tool", "pprof", "-tags"])
        .arg(&file)
        .output()
        .unwrap();
    let tags = String::from_utf8_lossy(&tags.stdout);
    assert!(
        tags.contains("pthread_mutex_lock") && tags.contains("waiter"),
        "{tags}"
    );
    drop(w);

    // The JVM's monitor storm, its Java frames named from its perf map.
    let w = start("pprof-jvm", jvm("storm", true), None);
    std::thread::sleep(Duration::from_secs(5));
    let out = dir.path().join("jvm");
    let mut named = None;
    for _ in 0..3 {
        write_perf_map(&w);
        let _ = std::fs::remove_dir_all(&out);
        let s = sites_with(&w, 6, &["--pprof", out.to_str().unwrap()]);
        if top_pair(&s, 10).waiter.function.as_deref() == Some("Corpus.monitorWorker") {
            named = Some(s);
            break;
        }
    }
    let s = named.expect("the JVM's storm named within three perf maps");
    let file = profile_of(&out, &w);
    let (header, waits) = pprof_top(&file, Some("waits"));
    assert_eq!(waits[0].0, "Corpus.monitorWorker", "{header}{waits:?}");
    let want = shares_by(&s, "waiter", "Corpus.monitorWorker");
    assert!(
        (waits[0].1 - want).abs() <= 0.01,
        "{} against {want}: {s:#?}",
        waits[0].1
    );
    assert!(
        header.contains("inlined"),
        "JIT frames say methods may be inlined into them: {header}"
    );
}

/// `run` serves each container's lock profile over its last diagnosis window behind the
/// endpoint's credentials (as `/metrics`: TLS too, where configured — the same gate,
/// tests/tests/endpoint.rs), and `go tool pprof` fetches it by URL: the storm's code first.
#[test]
fn run_serves_lock_profiles_behind_the_endpoints_credentials() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let web = write_file(
        dir.path(),
        "web.yml",
        &format!(
            "basic_auth_users:\n  prometheus: '{}'\n",
            bcrypt::hash("s3cret", 6).unwrap()
        ),
    );
    let config = write_file(
        dir.path(),
        "run.toml",
        "futex_probes = \"always\"\ninterval_seconds = 1\ndiagnosis_window_seconds = 5\n",
    );
    let daemon = Daemon::start(&[
        "--config",
        config.to_str().unwrap(),
        "--web.config.file",
        web.to_str().unwrap(),
    ]);
    let w = start(
        "pprof-run",
        lockbench("lockbench", &["--threads", "32"]),
        None,
    );
    let authorization = basic("prometheus", "s3cret");
    let get = |path: &str, auth: bool| {
        let headers: Vec<(&str, &str)> = if auth {
            vec![("Authorization", authorization.as_str())]
        } else {
            vec![]
        };
        http_get_bytes(daemon.addr, path, &headers).expect("GET")
    };
    assert_eq!(
        get("/debug/pprof/lock", false).status,
        401,
        "no credentials"
    );
    let path = wait_for(
        "the storm's profile in the index",
        Duration::from_secs(30),
        || {
            let r = get("/debug/pprof/lock", true);
            assert_eq!(r.status, 200);
            let index = String::from_utf8_lossy(&r.body).into_owned();
            index
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{}\t", w.cgroup.rel_path())))
                .map(str::to_owned)
        },
    );
    let profile = get(&path, true);
    assert_eq!(profile.status, 200);
    assert_eq!(profile.body[..2], [0x1f, 0x8b], "gzip-compressed");
    assert_eq!(get(&path, false).status, 401, "the profile needs them too");
    // A real client, by URL, with the credentials in it.
    let url = format!("http://prometheus:s3cret@{}{path}", daemon.addr);
    let (header, rows) = pprof_top(&url, Some("waits"));
    assert_eq!(rows[0].0, "worker", "{header}{rows:?}");
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
        // Warm-up: the workers' loops compiled before the perf map is written. The JIT may
        // still recompile them afterwards (a higher tier, deoptimization): their new code is in
        // no map until it is written again — which the hint says, and which names them then.
        std::thread::sleep(Duration::from_secs(5));
        let mut s = None;
        for _ in 0..3 {
            write_perf_map(&w);
            let got = sites(&w, 6);
            let top = top_pair(&got, 10);
            let recompiled = [&top.waiter, &top.waker].iter().any(|side| {
                side.unnamed.as_deref() == Some("JIT-compiled Java code without a perf map entry")
            });
            s = Some(got);
            if !recompiled {
                break;
            }
        }
        let s = s.expect("three tries");
        let top = top_pair(&s, 10);
        assert_eq!(
            top.waiter.function.as_deref(),
            Some(worker),
            "{mode}: {s:#?}"
        );
        assert_eq!(
            top.waker.function.as_deref(),
            Some(worker),
            "{mode}: {s:#?}"
        );
        assert_eq!(top.waiter.module.as_deref(), Some("JIT"));
    }
    // Without frame pointers in its compiled code the Java frames cannot be walked: nothing is
    // named, and the hint says which flag would name them.
    let w = start("jvm-no-frame-pointers", jvm("fair", false), None);
    std::thread::sleep(Duration::from_secs(5));
    write_perf_map(&w);
    let s = sites(&w, 4);
    let top = top_pair(&s, 10);
    assert_eq!(top.waiter.function, None, "{s:#?}");
    assert!(
        s.hints
            .iter()
            .any(|h| h.contains("-XX:+PreserveFramePointer")),
        "{s:#?}"
    );
}

/// The holder's figures over a lockbench whose threads sleep after they let the lock go (so that
/// a woken waiter, not the releaser, takes it next — its hold is then on record — and the
/// holder has a CPU to itself): (asleep share of holds, runnable share of hold time, holds).
fn holder_shares(name: &str, extra: &[&str], quota: Option<f64>) -> (f64, f64, u64) {
    // Critical sections of ~2 ms: the lock is held nearly all the time, so a throttle lands in
    // a hold. Only the holds of sampled hand-offs count (~10 a second in the quota, as many as
    // its throttles; a fifth of them throttled or preempted), and a few 70 ms throttled holds
    // decide the share: 10 s keep a window with none unlikely. (With 0.1 ms sections and 6 s,
    // two runs in eight sampled no throttled hold at all.)
    let mut args = vec!["--threads", "8", "--cs", "1000000", "--sleep-out", "200"];
    args.extend_from_slice(extra);
    let w = start(name, lockbench("lockbench", &args), quota);
    std::thread::sleep(Duration::from_secs(1));
    let s = sites(&w, if quota.is_some() { 10 } else { 6 });
    let holds = s.holds;
    eprintln!(
        "{name}: {} sampled, {holds} holds, asleep {:?}, preempted {:?}, runnable {:?}",
        s.sampled_handoffs,
        s.holder_asleep_share,
        s.holder_preempted_share,
        s.holder_runnable_share
    );
    assert!(holds >= 5, "{name}: only {holds} holds on record: {s:#?}");
    (
        s.holder_asleep_share.unwrap(),
        s.holder_runnable_share.unwrap(),
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
