//! The futex probe family: `syscalls:sys_{enter,exit}_futex` and, where the kernel has them
//! (6.7+), the futex2 syscalls `futex_wait`, `futex_waitv` and `futex_wake`.

use std::collections::HashMap;

use aya::Ebpf;
use stormwatch_common::{
    FutexStats, HotFutexKey, HotFutexValue, ThreadHandoff, globals, maps, programs,
};

use super::{
    KernelFacts, ProbeFamily, ProbeStatus, attach_classic, read_per_cpu_hash, remove_per_cpu_keys,
    tracefs, tracepoint_offsets,
};
use crate::counters::Counters as _;

/// (tracepoint, program). Exits share one program: all `sys_exit_*` records are alike.
pub const PROGRAMS: [(&str, &str); 8] = [
    ("syscalls:sys_enter_futex", programs::FUTEX_ENTER),
    ("syscalls:sys_exit_futex", programs::FUTEX_EXIT),
    ("syscalls:sys_enter_futex_wait", programs::FUTEX_WAIT_ENTER),
    ("syscalls:sys_exit_futex_wait", programs::FUTEX_EXIT),
    (
        "syscalls:sys_enter_futex_waitv",
        programs::FUTEX_WAITV_ENTER,
    ),
    ("syscalls:sys_exit_futex_waitv", programs::FUTEX_EXIT),
    ("syscalls:sys_enter_futex_wake", programs::FUTEX_WAKE_ENTER),
    ("syscalls:sys_exit_futex_wake", programs::FUTEX_EXIT),
];

pub const ENTER: &str = "syscalls:sys_enter_futex";
pub const EXIT: &str = "syscalls:sys_exit_futex";

/// The status notes of a futex program loaded for [`super::FutexTier::OnDemand`].
pub const ON_DEMAND_DETACHED: &str = "loaded, attached on demand (futex_probes = \"on-demand\"): \
     while a cgroup's scheduler figures look like a lock storm";
pub const ON_DEMAND_ATTACHED: &str =
    "attached on demand, while a cgroup's scheduler figures look like a lock storm";

pub struct FutexProbes {
    /// Load (verify) the programs at start but attach them only when asked
    /// ([`super::Probes::set`]).
    pub on_demand: bool,
}

impl ProbeFamily for FutexProbes {
    fn name(&self) -> &'static str {
        "futex"
    }

    fn globals(&self, _facts: &KernelFacts) -> Vec<(&'static str, u32)> {
        tracepoint_offsets(&[
            (
                globals::TP_FUTEX_UADDR_OFFSET,
                "syscalls",
                "sys_enter_futex",
                "uaddr",
            ),
            (
                globals::TP_FUTEX_OP_OFFSET,
                "syscalls",
                "sys_enter_futex",
                "op",
            ),
            (
                globals::TP_FUTEX2_UADDR_OFFSET,
                "syscalls",
                "sys_enter_futex_wait",
                "uaddr",
            ),
            (
                globals::TP_FUTEX_WAITV_WAITERS_OFFSET,
                "syscalls",
                "sys_enter_futex_waitv",
                "waiters",
            ),
            (
                globals::TP_FUTEX_WAITV_NR_OFFSET,
                "syscalls",
                "sys_enter_futex_waitv",
                "nr_futexes",
            ),
            (
                globals::TP_SYS_EXIT_RET_OFFSET,
                "syscalls",
                "sys_exit_futex",
                "ret",
            ),
        ])
    }

    fn attach(&self, ebpf: &mut Ebpf, _facts: &KernelFacts) -> Vec<ProbeStatus> {
        let mut status = Vec::new();
        for (tracepoint, program) in PROGRAMS {
            let (category, event) = tracepoint.split_once(':').expect("category:event");
            // The futex2 syscalls are optional (6.7+): absent ones are not a degradation.
            let optional = event.contains("futex_wait") || event.contains("futex_wake");
            if optional && !tracefs::tracepoint_exists(category, event) {
                continue;
            }
            if self.on_demand {
                status.push(load_on_demand(ebpf, tracepoint, program));
                continue;
            }
            // Without its exit an entry would leak; without its entry an exit does nothing.
            status.push(match attach_classic(ebpf, program, category, event) {
                Ok(()) => ProbeStatus {
                    tracepoint,
                    kind: Some(super::AttachKind::Tracepoint),
                    note: None,
                },
                Err(err) => ProbeStatus {
                    tracepoint,
                    kind: None,
                    note: Some(super::one_line(&err)),
                },
            });
        }
        status
    }
}

/// Loads (verifies) a program to be attached on demand: a program the kernel refuses is found
/// at start, not when a storm needs it.
fn load_on_demand(ebpf: &mut Ebpf, tracepoint: &'static str, program: &str) -> ProbeStatus {
    let loaded = super::load_classic(ebpf, program);
    ProbeStatus {
        tracepoint,
        kind: None,
        note: Some(match loaded {
            Ok(()) => ON_DEMAND_DETACHED.to_owned(),
            Err(err) => super::one_line(&err),
        }),
    }
}

pub fn read(ebpf: &Ebpf) -> anyhow::Result<HashMap<u64, FutexStats>> {
    read_per_cpu_hash(ebpf, maps::CGROUP_FUTEX, FutexStats::ZERO, |t, v| t.add(v))
}

pub fn read_hot(ebpf: &Ebpf) -> anyhow::Result<HashMap<HotFutexKey, HotFutexValue>> {
    let zero = HotFutexValue {
        waits: 0,
        wait_ns: 0,
        max_wait_ns: 0,
        comm: [0; 16],
    };
    read_per_cpu_hash(ebpf, maps::HOT_FUTEXES, zero, |t, v| t.add(v))
}

/// Each thread's part in hand-offs, by thread id (cumulative since its entry was made).
pub fn read_handoff_threads(ebpf: &Ebpf) -> anyhow::Result<HashMap<u32, ThreadHandoff>> {
    let map = ebpf
        .map(maps::HANDOFF_THREADS)
        .ok_or_else(|| anyhow::anyhow!("map {} missing from the object", maps::HANDOFF_THREADS))?;
    let map = aya::maps::HashMap::<_, u32, ThreadHandoff>::try_from(map)?;
    // An entry deleted between the key walk and its lookup is simply not there.
    Ok(map.iter().filter_map(Result::ok).collect())
}

/// Deletes the hand-off entries of threads that have exited.
pub fn forget_handoff_threads(ebpf: &mut Ebpf, tids: &[u32]) {
    let Some(map) = ebpf.map_mut(maps::HANDOFF_THREADS) else {
        return;
    };
    let Ok(mut map) = aya::maps::HashMap::<_, u32, ThreadHandoff>::try_from(map) else {
        return;
    };
    for tid in tids {
        let _ = map.remove(tid);
    }
}

/// Forgets removed cgroups (by key).
pub fn forget(ebpf: &mut Ebpf, cgroups: &[u64]) {
    remove_per_cpu_keys::<u64, FutexStats>(ebpf, maps::CGROUP_FUTEX, cgroups);
}

/// Deletes hot-futex entries; returns how many were there.
pub fn forget_hot(ebpf: &mut Ebpf, keys: &[HotFutexKey]) -> usize {
    remove_per_cpu_keys::<HotFutexKey, HotFutexValue>(ebpf, maps::HOT_FUTEXES, keys)
}
