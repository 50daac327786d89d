//! `spin --threads N --seconds S`: N CPU-bound threads, no locks, for S seconds. Then the main
//! thread joins them and prints one JSON line:
//! `{"pid":…,"ops":…,"nvcsw":…,"nivcsw":…,"utime_seconds":…,"stime_seconds":…,
//!   "run_delay_seconds":…,"timeslices":…}`
//! with the counters and CPU time from `getrusage(RUSAGE_SELF)`, which covers the exited
//! threads, and the run-queue wait and time slices of every thread from its schedstat.

#[path = "../workload_common.rs"]
mod common;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use common::SchedInfo;

fn main() {
    let args = common::parse_args("spin");
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..args.threads)
        .map(|i| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut ops = 0u64;
                let mut sink = i as u64;
                while !stop.load(Ordering::Relaxed) {
                    sink = common::burn(1000, sink);
                    ops += 1;
                }
                std::hint::black_box(sink);
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
    common::report(&[("ops", ops.to_string())], sched);
}
