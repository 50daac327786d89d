//! PostgreSQL's heavyweight lock waits, which neither the futex nor the lock probes can see: a
//! backend that finds a row, a transaction id or a relation locked sleeps on its latch, in
//! `epoll_wait`, until the holder's commit wakes it. PostgreSQL marks the wait with two USDT
//! sites, `postgresql:lock__wait__start` and `lock__wait__done`, on either side of its call of
//! `WaitOnLock` (`LockAcquireExtended`); the agent attaches these uprobes at them in the
//! PostgreSQL binaries it finds (`agent/src/probes/pglock.rs`).
//!
//! A site fires once per wait — thousands of times a second in a storm on one row, not the
//! millions of a mutex's entries — so the uprobes stay attached. Each wait's time, from its
//! backend's start to its end, is summed per cgroup (`PG_LOCK_WAITS`) when it ends: over a
//! window, the time of the waits that ended in it. The arguments (the lock's tag) are not
//! read: their locations are the compiler's, different in every build.

use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, uprobe},
    maps::{LruHashMap, PerCpuHashMap},
    programs::ProbeContext,
};
use stormwatch_common::{PgLockWaits, ProbeError};

use crate::shared::per_cpu_slot;

/// Cgroups with PostgreSQL lock waits at once; the agent deletes removed cgroups' entries.
const MAX_CGROUPS: u32 = 1024;
/// Backends waiting at once: far above any server's connections (a wait whose start was
/// evicted is not counted when it ends).
const MAX_WAITING: u32 = 16_384;

#[map(name = "PG_LOCK_WAITING")]
static PG_LOCK_WAITING: LruHashMap<u32, u64> = LruHashMap::with_max_entries(MAX_WAITING, 0);

#[map(name = "PG_LOCK_WAITS")]
static PG_LOCK_WAITS: PerCpuHashMap<u64, PgLockWaits> =
    PerCpuHashMap::with_max_entries(MAX_CGROUPS, 0);

/// A backend begins to wait: its start, by thread. A start left by a wait that never reached
/// `done` (an error raised inside the wait: a deadlock, a lock timeout, a cancel) is replaced
/// by the thread's next.
#[uprobe]
pub fn pg_lock_wait_start(_ctx: ProbeContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: a helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let _ = PG_LOCK_WAITING.insert(&tid, &now, 0);
    0
}

/// The wait ended (the lock granted): its time added to the backend's cgroup. Without a start
/// (the uprobes attached during the wait), nothing.
#[uprobe]
pub fn pg_lock_wait_done(_ctx: ProbeContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: a plain lookup, copied out before the entry is removed.
    let Some(start) = (unsafe { PG_LOCK_WAITING.get(&tid) }).copied() else {
        return 0;
    };
    let _ = PG_LOCK_WAITING.remove(&tid);
    // SAFETY: helpers with no preconditions.
    let (now, cgroup_id) = unsafe { (bpf_ktime_get_ns(), bpf_get_current_cgroup_id()) };
    let zero = PgLockWaits {
        waits: 0,
        wait_ns: 0,
    };
    if let Some(w) = per_cpu_slot(&PG_LOCK_WAITS, &cgroup_id, &zero, ProbeError::CgroupMapFull) {
        // SAFETY: this CPU's value; a uprobe handler does not nest on one CPU.
        let w = unsafe { &mut *w };
        w.waits += 1;
        w.wait_ns += now.saturating_sub(start);
    }
    0
}
