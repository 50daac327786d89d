//! `mutex_storm --threads N --seconds S [--inside I] [--outside O]`: N threads hammer one
//! `std::sync::Mutex<u64>` (futex based on Linux) with a tiny critical section (I iterations
//! of work) and a little CPU work outside it (O iterations), for S seconds.
//! Then the main thread joins them and prints one JSON line:
//! `{"pid":…,"mutex_addr":"0x…","ops":…,"nvcsw":…,"nivcsw":…,"utime_seconds":…,"stime_seconds":…,
//!   "run_delay_seconds":…,"timeslices":…}`
//! with the counters from `getrusage(RUSAGE_SELF)`, which covers the exited threads, and the
//! run-queue wait and time slices of every thread from its schedstat.
//!
//! With more threads than CPUs, the work outside the lock keeps threads runnable long enough to
//! be preempted (involuntary switches), and a thread preempted while holding the lock makes the
//! others sleep in `futex_wait` (voluntary switches): both counts end up in the thousands.

#[path = "../workload_common.rs"]
mod common;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use common::SchedInfo;

/// Default iterations of work inside the lock per operation (a few hundred ns): longer than
/// the mutex's brief spin before it sleeps, so contention ends in `futex_wait`.
const INSIDE_WORK: u32 = 300;
/// Default iterations of work outside the lock per operation (a few hundred ns).
const OUTSIDE_WORK: u32 = 300;

fn main() {
    let args = common::parse_args("mutex_storm");
    let inside = if args.inside > 0 {
        args.inside
    } else {
        INSIDE_WORK
    };
    let outside = if args.outside > 0 {
        args.outside
    } else {
        OUTSIDE_WORK
    };
    let mutex = Arc::new(Mutex::new(0u64));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..args.threads)
        .map(|i| {
            let mutex = Arc::clone(&mutex);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut sink = i as u64;
                while !stop.load(Ordering::Relaxed) {
                    {
                        let mut guard = mutex.lock().unwrap();
                        *guard += 1;
                        if inside > 0 {
                            sink = common::burn(inside, sink);
                        }
                    }
                    sink = common::burn(outside, sink);
                }
                std::hint::black_box(sink);
                SchedInfo::of_this_thread()
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(args.seconds));
    stop.store(true, Ordering::Relaxed);
    let mut sched = SchedInfo::default();
    for w in workers {
        sched = sched.add(w.join().expect("worker panicked"));
    }
    let ops = *mutex.lock().unwrap();
    let addr = format!("\"{:#x}\"", Arc::as_ptr(&mutex) as usize);
    common::report(&[("mutex_addr", addr), ("ops", ops.to_string())], sched);
}
