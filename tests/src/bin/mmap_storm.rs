//! `mmap_storm --threads N --seconds S`: N threads of one process map a small anonymous region,
//! touch it and unmap it, in a tight loop, for S seconds. Then the same JSON line as `spin`,
//! with the number of map/unmap rounds as `ops`.
//!
//! `mmap` and `munmap` change the process's address space, so each takes the process's
//! `mmap_lock` (an rw_semaphore) for write (`vm_mmap_pgoff` → `mmap_write_lock_killable`,
//! `__vm_munmap` → `mmap_write_lock_killable`): all N threads queue on that one semaphore, and
//! with more threads than CPUs the holder is often preempted, so the others sleep in
//! `rwsem_down_write_slowpath`, which reports `lock:contention_begin` with `LCB_F_WRITE`.
//! The touch in between faults a page in under the VMA lock (not `mmap_lock`), so the
//! contention stays on the write side.

#[path = "../workload_common.rs"]
mod common;

/// Size of each mapping: a few pages, so the work per round is the lock, not page clearing.
const MAP_BYTES: usize = 4 * 4096;

fn main() {
    let args = common::parse_args("mmap_storm");
    common::run_rounds(&args, |_| {
        // SAFETY: a fresh private anonymous mapping, written within its bounds and unmapped
        // before the next round; nothing else refers to it.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                MAP_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert!(
                p != libc::MAP_FAILED,
                "mmap: {}",
                std::io::Error::last_os_error()
            );
            std::ptr::write_volatile(p.cast::<u8>(), 1);
            assert_eq!(
                libc::munmap(p, MAP_BYTES),
                0,
                "munmap: {}",
                std::io::Error::last_os_error()
            );
        }
    });
}
