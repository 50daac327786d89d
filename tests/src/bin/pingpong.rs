//! `pingpong --seconds S`: two threads exchange one byte over two pipes, back and forth, for S
//! seconds: each blocks in `read` until the other writes, so every round trip is two voluntary
//! switches and two wake-ups, tens of thousands of times a second, with no futex and no shared
//! lock. Then the same JSON line as `spin`, with the number of round trips as `ops`.
//! (`--threads` is accepted and ignored: always two.)

#[path = "../workload_common.rs"]
mod common;

use std::{
    fs::File,
    io::{Read as _, Write as _},
    os::fd::FromRawFd as _,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use common::SchedInfo;

fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two-element array we pass.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: two fresh descriptors that nothing else owns.
    unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

fn main() {
    let args = common::parse_args("pingpong");
    let (mut ping_r, mut ping_w) = pipe();
    let (mut pong_r, mut pong_w) = pipe();
    let stop = Arc::new(AtomicBool::new(false));
    let echo = std::thread::spawn(move || {
        let mut b = [0u8; 1];
        // Echo until the other side closes its end (read returns 0) or says stop (byte 1).
        while ping_r.read(&mut b).expect("echo: read") == 1 && b[0] == 0 {
            pong_w.write_all(&b).expect("echo: write");
        }
        SchedInfo::of_this_thread()
    });
    let server = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            let mut b = [0u8; 1];
            while !stop.load(Ordering::Relaxed) {
                ping_w.write_all(&[0]).expect("ping: write");
                pong_r.read_exact(&mut b).expect("ping: read");
                rounds += 1;
            }
            ping_w.write_all(&[1]).expect("ping: write stop");
            (rounds, SchedInfo::of_this_thread())
        })
    };
    std::thread::sleep(Duration::from_secs_f64(args.seconds));
    stop.store(true, Ordering::Relaxed);
    let (rounds, s1) = server.join().expect("ping thread panicked");
    let s2 = echo.join().expect("echo thread panicked");
    common::report(&[("ops", rounds.to_string())], s1.add(s2));
}
