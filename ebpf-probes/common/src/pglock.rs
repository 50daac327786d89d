//! PostgreSQL's heavyweight lock waits: the per-cgroup count and time of the waits between its
//! USDT sites `postgresql:lock__wait__start` and `lock__wait__done`. Written by the kernel's
//! `pglock.rs` (`PG_LOCK_WAITS`); read by the agent's `probes/pglock.rs`.

/// Heavyweight lock waits that ended in one cgroup, on one CPU (cumulative).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PgLockWaits {
    /// Waits that ended (`lock__wait__done` after its backend's `lock__wait__start`).
    pub waits: u64,
    /// Their summed time, start to end.
    pub wait_ns: u64,
}

// SAFETY: a plain #[repr(C)] struct of fixed-width integers with no padding (see the size
// test).
#[cfg(feature = "user")]
unsafe impl aya::Pod for PgLockWaits {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_has_no_padding() {
        assert_eq!(core::mem::size_of::<PgLockWaits>(), 8 * 2);
    }
}
