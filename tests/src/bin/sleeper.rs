//! `sleeper --threads N --seconds S [--sleep-ms MS] [--fifo 1] [--futex 1]`: N threads that each
//! sleep MS ms (default 10) in a loop for S seconds, doing next to nothing when awake: an idle-ish
//! workload whose every wake-up is one run-queue latency sample. With `--fifo 1` all its threads are
//! SCHED_FIFO (priority 1), as latency-critical threads are: on busy CPUs they preempt the
//! running thread as soon as they wake instead of waiting for its slice or the next tick. Then
//! the same JSON line as `spin`, with the number of sleeps as `ops`, the wall time the workers
//! spent in their sleep calls as `slept_seconds`, and the wall time the main thread spent
//! waiting for them to finish as `joined_seconds`: between them, an upper bound of the
//! process's time blocked (each call's wall time also holds its run-queue wait after the
//! wake-up and a few µs on the CPU). With `--futex 1` each nap is a FUTEX_WAIT of MS ms on a
//! private word nobody wakes (it times out) instead of a nanosleep: the same wake-ups, but
//! futex calls, so that the agent's futex probes count the process's cgroup.

#[path = "../workload_common.rs"]
mod common;

use std::time::{Duration, Instant};

use common::SchedInfo;

/// FUTEX_WAIT for `nap` on a private word nobody wakes: returns on the timeout.
fn futex_nap(nap: Duration) {
    let word = std::sync::atomic::AtomicU32::new(0);
    let timeout = libc::timespec {
        tv_sec: nap.as_secs() as libc::time_t,
        tv_nsec: nap.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` and `timeout` live for the whole call; FUTEX_WAIT reads only them.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            0u32,
            &timeout as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

fn main() {
    let args = common::parse_args("sleeper");
    let deadline = Instant::now() + Duration::from_secs_f64(args.seconds);
    let nap = Duration::from_millis(args.sleep_ms);
    let futex = args.futex;
    if args.fifo {
        // Before spawning: the workers inherit it, and the main thread is served promptly too.
        common::set_fifo().unwrap_or_else(|e| {
            eprintln!("sleeper: cannot make the process SCHED_FIFO: {e}");
            std::process::exit(1);
        });
    }
    let workers: Vec<_> = (0..args.threads)
        .map(|_| {
            std::thread::spawn(move || {
                let (mut wakeups, mut slept) = (0u64, Duration::ZERO);
                while Instant::now() < deadline {
                    let before = Instant::now();
                    if futex {
                        futex_nap(nap);
                    } else {
                        std::thread::sleep(nap);
                    }
                    slept += before.elapsed();
                    wakeups += 1;
                }
                (wakeups, slept, SchedInfo::of_this_thread())
            })
        })
        .collect();
    let (mut wakeups, mut slept, mut sched) = (0, Duration::ZERO, SchedInfo::default());
    let joining = Instant::now();
    for w in workers {
        let (n, s, info) = w.join().expect("worker panicked");
        wakeups += n;
        slept += s;
        sched = sched.add(info);
    }
    let joined = joining.elapsed();
    common::report(
        &[
            ("ops", wakeups.to_string()),
            ("slept_seconds", format!("{:.6}", slept.as_secs_f64())),
            ("joined_seconds", format!("{:.6}", joined.as_secs_f64())),
        ],
        sched,
    );
}
