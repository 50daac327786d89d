//! Shared by the workload binaries (`src/bin/*.rs` include it with `#[path]`): argument parsing,
//! the process's own resource usage, and the one JSON line each workload prints at the end.
//! std and libc only, so the workloads stay plain processes with nothing hidden in them.

#![allow(dead_code)]

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

/// `--threads N --seconds S [--sleep-ms MS] [--fifo 1] [--futex 1] [--inside I] [--outside O]`.
pub struct Args {
    pub threads: usize,
    pub seconds: f64,
    /// sleeper: how long each nap is.
    pub sleep_ms: u64,
    /// sleeper: `--fifo 1` makes its threads SCHED_FIFO.
    pub fifo: bool,
    /// sleeper: `--futex 1` naps in FUTEX_WAIT with a timeout instead of nanosleep.
    pub futex: bool,
    /// mutex_storm: iterations of work inside the critical section.
    pub inside: u32,
    /// mutex_storm: iterations of work outside it.
    pub outside: u32,
}

pub fn parse_args(program: &str) -> Args {
    let mut args = Args {
        threads: 1,
        seconds: 1.0,
        sleep_ms: 10,
        fifo: false,
        futex: false,
        inside: 0,
        outside: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .unwrap_or_else(|| usage(program, &format!("{flag} needs a value")));
        match flag.as_str() {
            "--threads" => args.threads = parse(program, &flag, &value),
            "--seconds" => args.seconds = parse(program, &flag, &value),
            "--sleep-ms" => args.sleep_ms = parse(program, &flag, &value),
            "--fifo" => args.fifo = parse::<u8>(program, &flag, &value) != 0,
            "--futex" => args.futex = parse::<u8>(program, &flag, &value) != 0,
            "--inside" => args.inside = parse(program, &flag, &value),
            "--outside" => args.outside = parse(program, &flag, &value),
            _ => usage(program, &format!("unknown flag {flag}")),
        }
    }
    if args.threads == 0 || !args.seconds.is_finite() || args.seconds <= 0.0 {
        usage(program, "--threads and --seconds must be positive");
    }
    args
}

fn parse<T: std::str::FromStr>(program: &str, flag: &str, value: &str) -> T {
    value
        .parse()
        .unwrap_or_else(|_| usage(program, &format!("bad value for {flag}: {value}")))
}

fn usage(program: &str, why: &str) -> ! {
    eprintln!(
        "{program}: {why}\nusage: {program} --threads N --seconds S [--sleep-ms MS] [--fifo 1] [--inside I] [--outside O]"
    );
    std::process::exit(2);
}

/// The process's own figures from `getrusage(RUSAGE_SELF)`: the kernel's totals over every
/// thread, live or exited.
pub struct Usage {
    pub nvcsw: u64,
    pub nivcsw: u64,
    pub utime: f64,
    pub stime: f64,
}

pub fn rusage_self() -> Usage {
    // SAFETY: getrusage fills the struct we pass; all-zero is a valid `rusage`.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a `rusage`.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    assert_eq!(rc, 0, "getrusage: {}", std::io::Error::last_os_error());
    let secs = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    Usage {
        nvcsw: ru.ru_nvcsw as u64,
        nivcsw: ru.ru_nivcsw as u64,
        utime: secs(ru.ru_utime),
        stime: secs(ru.ru_stime),
    }
}

/// Waits until this process has a single thread left in /proc/self/task.
///
/// `JoinHandle::join` returns when the thread has cleared its tid (in `mm_release`), which is
/// before the kernel folds its `nvcsw`/`nivcsw` and CPU time into the process totals and
/// unlists it. A thread gone from /proc/self/task has been folded in, and its only switch left
/// is its final one, which neither getrusage nor the agent counts. Taking getrusage after this
/// means no joined thread can still add switches that getrusage misses.
pub fn wait_until_single_threaded() {
    for _ in 0..5000 {
        let n = std::fs::read_dir("/proc/self/task")
            .map(|d| d.count())
            .unwrap_or(0);
        if n <= 1 {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("threads still listed in /proc/self/task 5 s after they were joined");
}

/// The calling thread's run-queue figures from /proc/thread-self/schedstat (the kernel's
/// `sched_info`): time spent runnable but waiting for a CPU, and how many times it got one.
#[derive(Clone, Copy)]
pub struct SchedInfo {
    pub run_delay_ns: u64,
    pub timeslices: u64,
    /// `se.nr_migrations` from /proc/thread-self/sched (CONFIG_SCHED_DEBUG), when there.
    pub migrations: Option<u64>,
}

impl Default for SchedInfo {
    /// No threads yet: zero of everything.
    fn default() -> Self {
        Self {
            run_delay_ns: 0,
            timeslices: 0,
            migrations: Some(0),
        }
    }
}

impl SchedInfo {
    pub fn of_this_thread() -> Self {
        let text = std::fs::read_to_string("/proc/thread-self/schedstat")
            .expect("reading /proc/thread-self/schedstat");
        // "<on-CPU ns> <run-queue wait ns> <timeslices>"
        let f: Vec<u64> = text
            .split_whitespace()
            .map(|v| v.parse().expect("schedstat field"))
            .collect();
        let migrations = std::fs::read_to_string("/proc/thread-self/sched")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("se.nr_migrations"))
                    .and_then(|l| l.split(':').nth(1))
                    .and_then(|v| v.trim().parse().ok())
            });
        Self {
            run_delay_ns: f[1],
            timeslices: f[2],
            migrations,
        }
    }

    pub fn add(self, other: Self) -> Self {
        Self {
            run_delay_ns: self.run_delay_ns + other.run_delay_ns,
            timeslices: self.timeslices + other.timeslices,
            migrations: self.migrations.zip(other.migrations).map(|(a, b)| a + b),
        }
    }
}

/// Prints the one JSON line: pid, the extra fields (already JSON-encoded values), then the
/// process's rusage, taken after every worker thread is gone, and the run-queue figures of
/// the workers (`workers`, each read by the worker itself as its last act) plus the main
/// thread's.
pub fn report(extra: &[(&str, String)], workers: SchedInfo) {
    wait_until_single_threaded();
    let u = rusage_self();
    let sched = workers.add(SchedInfo::of_this_thread());
    let mut line = format!("{{\"pid\":{}", std::process::id());
    for (k, v) in extra {
        line.push_str(&format!(",\"{k}\":{v}"));
    }
    line.push_str(&format!(
        ",\"nvcsw\":{},\"nivcsw\":{},\"utime_seconds\":{:.6},\"stime_seconds\":{:.6},\
         \"run_delay_seconds\":{:.9},\"timeslices\":{},\"nr_migrations\":{}}}",
        u.nvcsw,
        u.nivcsw,
        u.utime,
        u.stime,
        sched.run_delay_ns as f64 / 1e9,
        sched.timeslices,
        sched
            .migrations
            .map_or_else(|| "null".to_owned(), |m| m.to_string())
    ));
    println!("{line}");
}

/// Makes the calling thread SCHED_FIFO at priority 1: when it wakes up it preempts any
/// SCHED_OTHER thread at once, as latency-critical threads (audio, control loops) are set up.
pub fn set_fifo() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler(0 = this thread, a policy, a valid sched_param).
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A little CPU work the optimiser cannot remove.
#[inline(never)]
pub fn burn(iterations: u32, seed: u64) -> u64 {
    let mut x = seed | 1;
    for _ in 0..iterations {
        x = std::hint::black_box(
            x.wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407),
        );
    }
    x
}

/// `args.threads` threads, each calling `round` in a loop until `args.seconds` have passed;
/// then the threads are joined and the JSON line printed, with the rounds made as `ops`.
/// `round` is given a value of its thread's, which starts at the thread's index (what `round`
/// computes goes there, so that it is not optimized away).
pub fn run_rounds(args: &Args, round: impl Fn(&mut u64) + Copy + Send + 'static) {
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..args.threads)
        .map(|i| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut ops = 0u64;
                let mut value = i as u64;
                while !stop.load(Ordering::Relaxed) {
                    round(&mut value);
                    ops += 1;
                }
                std::hint::black_box(value);
                (ops, SchedInfo::of_this_thread())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(args.seconds));
    stop.store(true, Ordering::Relaxed);
    let (mut ops, mut sched) = (0, SchedInfo::default());
    for w in workers {
        let (o, s) = w.join().expect("worker panicked");
        ops += o;
        sched = sched.add(s);
    }
    report(&[("ops", ops.to_string())], sched);
}
