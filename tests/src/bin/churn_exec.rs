//! `churn_exec --seconds S [--threads RATE] [--inside I]`: for S seconds, starts about RATE
//! short-lived threads a second (default 2,000), each taking one shared `std::sync::Mutex` a few
//! times around I iterations of work and exiting; every 100 ms it also starts a child process
//! (itself, `--exec-child`) whose *non-leader* thread calls `execve` — the kernel then gives
//! that thread the leader's pid and reaps the old leader (`de_thread`), the case that trips up
//! per-thread state keyed by tid. Every child is waited for.
//!
//! Then one JSON line: `{"pid","threads","children", "nvcsw","nivcsw",…}` where `nvcsw` and
//! `nivcsw` are `getrusage(RUSAGE_SELF)` + `getrusage(RUSAGE_CHILDREN)`: every switch of every
//! thread of this process and of its waited-for children, exited ones included.

#[path = "../workload_common.rs"]
mod common;

use std::{
    ffi::CString,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// Threads started and joined together: enough to contend, few enough to start quickly.
const BATCH: usize = 16;
/// How often a child that execs from a non-leader thread is started.
const EXEC_EVERY: Duration = Duration::from_millis(100);

fn rusage(who: i32) -> (u64, u64) {
    // SAFETY: getrusage fills the struct we pass; all-zero is a valid `rusage`.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a `rusage`.
    let rc = unsafe { libc::getrusage(who, &mut ru) };
    assert_eq!(rc, 0, "getrusage: {}", std::io::Error::last_os_error());
    (ru.ru_nvcsw as u64, ru.ru_nivcsw as u64)
}

/// The child: a second thread execs `/bin/true`; the leader waits (forever: exec ends it).
fn exec_child() -> ! {
    std::thread::spawn(|| {
        let path = CString::new("/bin/true").expect("no NUL");
        let argv = [path.as_ptr(), std::ptr::null()];
        let envp = [std::ptr::null()];
        // SAFETY: NUL-terminated path, argv and envp arrays ending in NULL.
        unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
        eprintln!("execve: {}", std::io::Error::last_os_error());
        std::process::exit(1);
    });
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut seconds, mut rate, mut inside) = (0.0f64, 2000.0f64, 300u32);
    while let Some(flag) = args.next() {
        if flag == "--exec-child" {
            exec_child();
        }
        let value = args.next().unwrap_or_default();
        let bad = || -> ! {
            eprintln!("churn_exec: bad {flag} {value}");
            std::process::exit(2)
        };
        match flag.as_str() {
            "--seconds" => seconds = value.parse().unwrap_or_else(|_| bad()),
            "--threads" => rate = value.parse().unwrap_or_else(|_| bad()),
            "--inside" => inside = value.parse().unwrap_or_else(|_| bad()),
            _ => {
                eprintln!("usage: churn_exec --seconds S [--threads RATE] [--inside I]");
                std::process::exit(2);
            }
        }
    }
    assert!(
        seconds > 0.0 && rate > 0.0,
        "--seconds and --threads must be positive"
    );

    let lock = Arc::new(Mutex::new(0u64));
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(seconds);
    let (mut threads, mut children) = (0u64, 0u64);
    let mut next_exec = started;
    let me = std::env::current_exe().expect("current_exe");
    while Instant::now() < end {
        let handles: Vec<_> = (0..BATCH)
            .map(|i| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for round in 0..4 {
                        let mut v = lock.lock().unwrap_or_else(|e| e.into_inner());
                        *v = v.wrapping_add(common::burn(inside, (i * 4 + round) as u64));
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("a churn thread panicked");
        }
        threads += BATCH as u64;
        if Instant::now() >= next_exec {
            let status = std::process::Command::new(&me)
                .arg("--exec-child")
                .status()
                .expect("starting the exec child");
            assert!(status.success(), "the exec child failed: {status}");
            children += 1;
            next_exec += EXEC_EVERY;
        }
        // Pace to the rate.
        let due = started + Duration::from_secs_f64(threads as f64 / rate);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    common::wait_until_single_threaded();
    let (sv, si) = rusage(libc::RUSAGE_SELF);
    let (cv, ci) = rusage(libc::RUSAGE_CHILDREN);
    println!(
        "{{\"pid\":{},\"threads\":{threads},\"children\":{children},\"nvcsw\":{},\"nivcsw\":{},\
         \"self_nvcsw\":{sv},\"self_nivcsw\":{si},\"children_nvcsw\":{cv},\"children_nivcsw\":{ci}}}",
        std::process::id(),
        sv + cv,
        si + ci
    );
}
