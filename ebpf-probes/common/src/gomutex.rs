//! Go's `sync.Mutex`: the per-cgroup count of its slow paths' entries, and the on-CPU samples of
//! the Go processes the agent reads. Written by the kernel's `gomutex.rs` (`GO_MUTEX_CALLS`, its
//! samples [`crate::HandoffSample`]s; `GO_ONCPU`); read by the agent's `probes/gomutex.rs`.

/// Entries of Go's `sync.Mutex` slow paths in one cgroup, on one CPU (cumulative).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GoMutexCalls {
    /// `lockSlow`: a `Lock` that found the mutex held.
    pub lock_slow: u64,
    /// `unlockSlow`: an `Unlock` that found waiters (or flags) to hand on.
    pub unlock_slow: u64,
}

/// User frames kept per on-CPU sample: the function running and its callers, enough to reach
/// `lockSlow` from what it runs (`procyield` ← `runtime_doSpin` ← `lockSlow`; `lock2` ←
/// `semacquire1` ← `runtime_SemacquireMutex` ← `lockSlow`).
pub const GO_ONCPU_FRAMES: usize = 6;

/// Samples per second and CPU of the on-CPU sampler (the CPU clock), an odd rate that no
/// periodic work of a program keeps step with.
pub const GO_ONCPU_HZ: u64 = 99;

/// One on-CPU sample's key: where a watched Go process was running when the CPU clock fired.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GoOnCpuKey {
    pub cgroup_id: u64,
    pub tgid: u32,
    /// User frames in `ips` (0: the user stack could not be read).
    pub frames: u32,
    /// The user stack, innermost first (the instruction interrupted, or the one the thread
    /// entered the kernel from), then return addresses.
    pub ips: [u64; GO_ONCPU_FRAMES],
}

// SAFETY (all): plain #[repr(C)] structs of fixed-width integers with no padding (see the
// size tests).
#[cfg(feature = "user")]
mod user {
    unsafe impl aya::Pod for super::GoMutexCalls {}
    unsafe impl aya::Pod for super::GoOnCpuKey {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_padding() {
        assert_eq!(size_of::<GoMutexCalls>(), 8 * 2);
        assert_eq!(size_of::<GoOnCpuKey>(), 8 + 4 + 4 + 8 * GO_ONCPU_FRAMES);
    }
}
