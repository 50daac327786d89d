//! `futex_parked --threads N --seconds S`: the main thread holds a `std::sync::Mutex` while N
//! threads block on it (each in `futex_wait`), until a line arrives on stdin (or S seconds
//! pass); then it lets go, the threads take the lock in turn and exit. Prints the same JSON
//! line as `mutex_storm`, with `"parked": N`. For tests of what happens to waits that began
//! before a tracer attached.

#[path = "../workload_common.rs"]
mod common;

use std::{
    io::BufRead as _,
    sync::{Arc, Mutex, mpsc},
    time::Duration,
};

use common::SchedInfo;

fn main() {
    let args = common::parse_args("futex_parked");
    let mutex = Arc::new(Mutex::new(0u64));
    let guard = mutex.lock().unwrap();
    let workers: Vec<_> = (0..args.threads)
        .map(|_| {
            let mutex = Arc::clone(&mutex);
            std::thread::spawn(move || {
                *mutex.lock().unwrap() += 1;
                SchedInfo::of_this_thread()
            })
        })
        .collect();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().lock().read_line(&mut line);
        let _ = tx.send(());
    });
    let _ = rx.recv_timeout(Duration::from_secs_f64(args.seconds));
    drop(guard);
    let mut sched = SchedInfo::default();
    for w in workers {
        sched = sched.add(w.join().expect("worker panicked"));
    }
    let ops = *mutex.lock().unwrap();
    common::report(
        &[
            ("parked", args.threads.to_string()),
            ("ops", ops.to_string()),
        ],
        sched,
    );
}
