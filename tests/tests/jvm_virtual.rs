//! A JVM's virtual threads, read from the JVM itself (agent/src/identity/jvm/vthreads.rs)
//! against tests/corpus/VirtualThreads.java, whose waits and counterfactuals are known:
//!
//! - `lock 256 … 200 200`: 256 virtual threads take one `ReentrantLock` around a short section
//!   and do as much outside it: lock-bound (with a lock each they do about twice the work);
//! - `lock 256 … 20 2000`: the same lock around a tenth of the section and ten times the work
//!   outside: not lock-bound (a lock each does the same work).
//!
//! What this asks is what tests/CORPUS.md ("Virtual threads") says of the two readings: a JSON
//! dump finds nearly every virtual thread of *both* programs parked on the lock (they are not
//! preempted, so the lock's queue holds all but the running few whether or not it is
//! contended), while the scheduler's count of continuations run tells them apart by orders of
//! magnitude. Each program's counterfactual is run in the test, so that a program that is not
//! what this says fails as such.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use stormwatch::identity::jvm::{
    attach::{jcmd, virtual_thread_dump},
    vthreads::{VirtualCensus, parse_json, parse_scheduler},
};

/// The `bin` directory of a JDK of 21 or later under /usr/lib/jvm (Temurin 25 on this
/// machine kind, beside Debian's OpenJDK 17).
fn jdk21() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/jvm")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let release = std::fs::read_to_string(e.path().join("release")).ok()?;
                let version = release
                    .lines()
                    .find_map(|l| l.strip_prefix("JAVA_VERSION=\""))?;
                let major: u32 = version.split(['.', '"']).next()?.parse().ok()?;
                let bin = e.path().join("bin");
                (major >= 21 && bin.join("javac").is_file()).then_some((major, bin))
            })
            .collect();
        found.sort();
        found.pop().map(|(_, bin)| bin).expect(
            "no JDK of 21 or later under /usr/lib/jvm (virtual threads need one; this machine \
             kind has Temurin 25 there)",
        )
    })
}

fn classes() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a directory for the classes");
        let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
        // Corpus.java's work and progress lines too, from the source path.
        let status = Command::new(jdk21().join("javac"))
            .args(["-encoding", "UTF-8", "-d"])
            .arg(dir.path())
            .arg("-sourcepath")
            .arg(&corpus)
            .arg(corpus.join("VirtualThreads.java"))
            .status()
            .expect("running javac");
        assert!(
            status.success(),
            "javac VirtualThreads.java failed: {status}"
        );
        dir
    })
    .path()
}

/// `java VirtualThreads <mode> 256 60 <inside> <outside>`, killed on drop.
struct Program(Child);

impl Program {
    fn start(mode: &str, inside: u32, outside: u32) -> Self {
        let child = Command::new(jdk21().join("java"))
            .arg("-cp")
            .arg(classes())
            .args(["VirtualThreads", mode, "256", "60"])
            .args([inside.to_string(), outside.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting java");
        Self(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Its work per second over `seconds`, from its progress lines, after `settle` seconds.
    fn work_per_second(&mut self, settle: u64, seconds: u64) -> f64 {
        use std::io::BufRead as _;
        let out = self.0.stdout.take().expect("the program's output");
        let mut lines = std::io::BufReader::new(out).lines();
        let read = |line: String| -> (f64, f64) {
            let v: serde_json::Value = serde_json::from_str(&line).expect("a progress line");
            (v["ops"].as_f64().unwrap(), v["seconds"].as_f64().unwrap())
        };
        let mut first = None;
        for line in lines.by_ref() {
            let (ops, s) = read(line.expect("a line"));
            match first {
                None if s >= settle as f64 => first = Some((ops, s)),
                Some((o0, s0)) if s >= s0 + seconds as f64 => return (ops - o0) / (s - s0),
                _ => {}
            }
        }
        panic!("the program stopped printing its progress")
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Continuations the scheduler ran per second, over `seconds`.
fn runs_per_second(pid: u32, seconds: f64) -> f64 {
    let read = || {
        let text = jcmd(pid, Duration::from_secs(5), "Thread.vthread_scheduler")
            .unwrap_or_else(|e| panic!("Thread.vthread_scheduler of {pid}: {e}"));
        let s = parse_scheduler(&text).unwrap_or_else(|| panic!("not the scheduler: {text}"));
        (s, Instant::now())
    };
    let (a, t0) = read();
    assert!(a.parallelism >= 1, "{a:?}");
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let (b, t1) = read();
    (b.steals - a.steals) as f64 / (t1 - t0).as_secs_f64()
}

fn dumps(pid: u32, n: usize) -> Vec<VirtualCensus> {
    (0..n)
        .map(|_| {
            let text = virtual_thread_dump(pid, Duration::from_secs(5))
                .unwrap_or_else(|e| panic!("JSON dump of {pid}: {e}"));
            std::thread::sleep(Duration::from_millis(200));
            parse_json(&text).expect("a JSON thread dump")
        })
        .collect()
}

/// One program's readings: its work per second with one lock and with a lock each, the
/// continuations its scheduler ran per second, and three JSON dumps.
struct Observed {
    work: f64,
    alone: f64,
    runs: f64,
    dumps: Vec<VirtualCensus>,
}

fn observe(inside: u32, outside: u32) -> Observed {
    let mut shared = Program::start("lock", inside, outside);
    let work = shared.work_per_second(2, 3);
    let runs = runs_per_second(shared.pid(), 2.0);
    let dumps = dumps(shared.pid(), 3);
    drop(shared);
    let alone = Program::start("ownlock", inside, outside).work_per_second(2, 3);
    Observed {
        work,
        alone,
        runs,
        dumps,
    }
}

#[test]
fn the_scheduler_tells_a_locks_cost_where_the_dumps_cannot() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "attaching to JVMs: run as root"
    );
    // Premises: the first program is lock-bound, the second not (a lock each, alone).
    let storm = observe(200, 200);
    let calm = observe(20, 2000);
    let (storm_work, storm_alone, storm_runs) = (storm.work, storm.alone, storm.runs);
    let (calm_work, calm_alone, calm_runs) = (calm.work, calm.alone, calm.runs);
    eprintln!(
        "storm: {storm_work:.0}/s, a lock each {storm_alone:.0}/s, {storm_runs:.0} runs/s; \
         calm: {calm_work:.0}/s, a lock each {calm_alone:.0}/s, {calm_runs:.0} runs/s"
    );
    assert!(
        storm_alone >= 1.5 * storm_work,
        "the storm is lock-bound: a lock each did {storm_alone:.0}/s against {storm_work:.0}/s"
    );
    assert!(
        calm_alone <= 1.1 * calm_work,
        "the calm program is not lock-bound: a lock each did {calm_alone:.0}/s against \
         {calm_work:.0}/s"
    );
    // The dumps: all 256 listed, nearly all parked on the one lock in both programs, its code
    // named.
    for (name, ds) in [("storm", &storm.dumps), ("calm", &calm.dumps)] {
        for d in ds {
            assert_eq!(d.threads, 256, "{name}: {d:?}");
            let top = d.top_lock.as_ref().expect("a lock waited for");
            assert!(
                top.waiters >= 230 && top.object.contains("ReentrantLock"),
                "{name}: {top:?}"
            );
            assert!(
                top.site
                    .as_deref()
                    .is_some_and(|s| s.starts_with("VirtualThreads.locked(")),
                "{name}: the lock's code: {top:?}"
            );
        }
    }
    // The scheduler: the storm hands the lock on (a remount each) at least a hundred times as
    // often as the calm program.
    assert!(
        storm_runs >= 100.0 * calm_runs.max(1.0),
        "continuations run per second: storm {storm_runs:.0}, calm {calm_runs:.0}"
    );
}
