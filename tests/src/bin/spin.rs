//! `spin --threads N --seconds S`: N CPU-bound threads, no locks, for S seconds. Then the main
//! thread joins them and prints one JSON line:
//! `{"pid":…,"ops":…,"nvcsw":…,"nivcsw":…,"utime_seconds":…,"stime_seconds":…,
//!   "run_delay_seconds":…,"timeslices":…}`
//! with the counters and CPU time from `getrusage(RUSAGE_SELF)`, which covers the exited
//! threads, and the run-queue wait and time slices of every thread from its schedstat.

#[path = "../workload_common.rs"]
mod common;

fn main() {
    let args = common::parse_args("spin");
    common::run_rounds(&args, |sink| *sink = common::burn(1000, *sink));
}
