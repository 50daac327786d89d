//! Go's `sync.Mutex`: the per-cgroup count of its slow paths' entries. Written by the kernel's
//! `gomutex.rs` (`GO_MUTEX_CALLS`; its samples are [`crate::HandoffSample`]s); read by the agent's
//! `probes/gomutex.rs`.

/// Entries of Go's `sync.Mutex` slow paths in one cgroup, on one CPU (cumulative).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GoMutexCalls {
    /// `lockSlow`: a `Lock` that found the mutex held.
    pub lock_slow: u64,
    /// `unlockSlow`: an `Unlock` that found waiters (or flags) to hand on.
    pub unlock_slow: u64,
}

// SAFETY (all): plain #[repr(C)] structs of fixed-width integers with no padding (see the
// size tests).
#[cfg(feature = "user")]
mod user {
    unsafe impl aya::Pod for super::GoMutexCalls {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_padding() {
        assert_eq!(size_of::<GoMutexCalls>(), 8 * 2);
    }
}
