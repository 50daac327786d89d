//! `futex_calls`: futex calls whose outcome is known, counted from their own return values.
//!
//! In order: `--wakes N` FUTEX_WAKE calls on a word nobody waits on (each returns 0); `--eagain
//! N` FUTEX_WAIT calls whose expected value is not the word's (each returns EAGAIN at once);
//! `--timeouts N` FUTEX_WAIT calls of 1 ms on a word nobody wakes (each returns ETIMEDOUT); then
//! a second thread waits `--woken N` times on a word the main thread wakes with FUTEX_WAKE,
//! retrying while the waiter is not yet queued (a wake that finds nobody returns 0). All
//! private futexes, as pthread and JVM locks use.
//!
//! Prints one JSON line: the calls made by class, the wake calls' summed return values
//! (`woken`) and the waits' returns by outcome, beside the usual scheduler figures.

#[path = "../workload_common.rs"]
mod common;

use std::{
    ptr,
    sync::atomic::{AtomicU32, AtomicU64, Ordering},
};

use common::SchedInfo;

const WAIT: i32 = libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG;
const WAKE: i32 = libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG;

/// `futex(word, op, val, timeout)`: the return value, or minus errno.
fn futex(word: &AtomicU32, op: i32, val: u32, timeout: Option<&libc::timespec>) -> i64 {
    let timeout = timeout.map_or(ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a live, aligned u32 for the whole call; the remaining arguments are
    // unused by FUTEX_WAIT and FUTEX_WAKE.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            op,
            val,
            timeout,
            ptr::null::<u32>(),
            0u32,
        )
    };
    if r == -1 {
        -i64::from(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        r
    }
}

#[derive(Default)]
struct Tally {
    wait_calls: u64,
    wake_calls: u64,
    woken: u64,
    returned_zero: u64,
    eagain: u64,
    timeouts: u64,
}

impl Tally {
    fn wait(&mut self, ret: i64) {
        self.wait_calls += 1;
        match ret {
            0 => self.returned_zero += 1,
            r if r == -i64::from(libc::EAGAIN) => self.eagain += 1,
            r if r == -i64::from(libc::ETIMEDOUT) => self.timeouts += 1,
            r => panic!("unexpected futex wait return {r}"),
        }
    }

    fn wake(&mut self, ret: i64) {
        assert!(ret >= 0, "futex wake failed: {ret}");
        self.wake_calls += 1;
        self.woken += ret as u64;
    }
}

fn flag(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a count"))
}

fn main() {
    let wakes = flag("--wakes", 200);
    let eagain = flag("--eagain", 300);
    let timeouts = flag("--timeouts", 20);
    let woken = flag("--woken", 100);
    let mut tally = Tally::default();

    let nobody = AtomicU32::new(0);
    for _ in 0..wakes {
        tally.wake(futex(&nobody, WAKE, 1, None));
    }
    let one = AtomicU32::new(1);
    for _ in 0..eagain {
        tally.wait(futex(&one, WAIT, 0, None));
    }
    let ms = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1_000_000,
    };
    for _ in 0..timeouts {
        tally.wait(futex(&one, WAIT, 1, Some(&ms)));
    }

    // The waiter's results come back through atomics (no channel or join: both would make
    // futex calls of their own).
    static WORD: AtomicU32 = AtomicU32::new(0);
    static WAITER_ZERO: AtomicU64 = AtomicU64::new(0);
    static WAITER_CALLS: AtomicU64 = AtomicU64::new(0);
    let waiter = std::thread::spawn(move || {
        for _ in 0..woken {
            let ret = futex(&WORD, WAIT, 0, None);
            assert_eq!(ret, 0, "the waiter's wait should return when woken");
            WAITER_CALLS.fetch_add(1, Ordering::SeqCst);
            WAITER_ZERO.fetch_add(1, Ordering::SeqCst);
        }
    });
    for _ in 0..woken {
        loop {
            let ret = futex(&WORD, WAKE, 1, None);
            tally.wake(ret);
            if ret == 1 {
                break;
            }
            std::thread::yield_now();
        }
    }
    // Not joined (a join may wait on a futex): the waiter's last count, then `report` waits
    // until the process is single-threaded by reading /proc.
    drop(waiter);
    while WAITER_CALLS.load(Ordering::SeqCst) < woken {
        std::thread::yield_now();
    }
    let waiter_calls = WAITER_CALLS.load(Ordering::SeqCst);
    common::report(
        &[
            ("wait_calls", (tally.wait_calls + waiter_calls).to_string()),
            ("wake_calls", tally.wake_calls.to_string()),
            ("woken", tally.woken.to_string()),
            ("eagain", tally.eagain.to_string()),
            ("timeouts", tally.timeouts.to_string()),
            ("waiter_calls", waiter_calls.to_string()),
            (
                "waits_returned_zero",
                (tally.returned_zero + WAITER_ZERO.load(Ordering::SeqCst)).to_string(),
            ),
        ],
        SchedInfo::default(),
    );
}
