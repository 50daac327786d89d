//! `thread_churn --threads N --seconds S`: for S seconds, N threads at a time each take one
//! shared `std::sync::Mutex` a few hundred times and exit, and are replaced at once: thousands
//! of short-lived threads a second contending on a mutex. Then the same JSON line as
//! `mutex_storm`, whose `getrusage(RUSAGE_SELF)` covers every exited thread, with the number of
//! threads started as `threads_started`.

#[path = "../workload_common.rs"]
mod common;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use common::SchedInfo;

/// Lock acquisitions per thread: short lives, but each with real contention.
const OPS_PER_THREAD: u32 = 200;

fn main() {
    let args = common::parse_args("thread_churn");
    let deadline = Instant::now() + Duration::from_secs_f64(args.seconds);
    let mutex = Arc::new(Mutex::new(0u64));
    let mut started = 0u64;
    let mut sched = SchedInfo::default();
    while Instant::now() < deadline {
        let batch: Vec<_> = (0..args.threads)
            .map(|i| {
                let mutex = Arc::clone(&mutex);
                std::thread::spawn(move || {
                    let mut sink = i as u64;
                    for _ in 0..OPS_PER_THREAD {
                        let mut guard = mutex.lock().unwrap();
                        *guard += 1;
                        sink = common::burn(50, sink);
                        drop(guard);
                        sink = common::burn(50, sink);
                    }
                    std::hint::black_box(sink);
                    SchedInfo::of_this_thread()
                })
            })
            .collect();
        started += batch.len() as u64;
        for t in batch {
            sched = sched.add(t.join().expect("worker panicked"));
        }
    }
    let ops = *mutex.lock().unwrap();
    common::report(
        &[
            ("ops", ops.to_string()),
            ("threads_started", started.to_string()),
        ],
        sched,
    );
}
