//! The kernel lock contention family: `lock:contention_begin` / `contention_end`, and the
//! symbolization of contended call sites against /proc/kallsyms.

use std::collections::HashMap;

use aya::{Ebpf, maps::StackTraceMap};
use stormwatch_common::{LockSiteKey, LockSiteValue, LockStats, globals, maps, programs};

use super::{
    KernelFacts, ProbeFamily, ProbeStatus, attach_preferring_btf, read_per_cpu_hash,
    remove_per_cpu_keys, tracepoint_offsets,
};
use crate::counters::Counters as _;

pub const BEGIN: &str = "lock:contention_begin";
pub const END: &str = "lock:contention_end";

pub struct LockProbes;

impl ProbeFamily for LockProbes {
    fn name(&self) -> &'static str {
        "kernel locks"
    }

    fn globals(&self, _facts: &KernelFacts) -> Vec<(&'static str, u32)> {
        tracepoint_offsets(&[
            (
                globals::TP_LOCK_ADDR_OFFSET,
                "lock",
                "contention_begin",
                "lock_addr",
            ),
            (
                globals::TP_LOCK_FLAGS_OFFSET,
                "lock",
                "contention_begin",
                "flags",
            ),
        ])
    }

    fn attach(&self, ebpf: &mut Ebpf, facts: &KernelFacts) -> Vec<ProbeStatus> {
        // End first: a begin without its end would fill the in-flight slots.
        let end = attach_preferring_btf(
            ebpf,
            facts,
            END,
            Some(programs::LOCK_END_BTF),
            programs::LOCK_END_TP,
        );
        let begin = if end.attached() {
            attach_preferring_btf(
                ebpf,
                facts,
                BEGIN,
                Some(programs::LOCK_BEGIN_BTF),
                programs::LOCK_BEGIN_TP,
            )
        } else {
            ProbeStatus {
                tracepoint: BEGIN,
                kind: None,
                note: Some(format!("needs {END}, which is not attached")),
            }
        };
        vec![begin, end]
    }
}

pub fn read(ebpf: &Ebpf) -> anyhow::Result<HashMap<u64, LockStats>> {
    read_per_cpu_hash(ebpf, maps::CGROUP_LOCKS, LockStats::ZERO, |t, v| t.add(v))
}

pub fn read_sites(ebpf: &Ebpf) -> anyhow::Result<HashMap<LockSiteKey, LockSiteValue>> {
    let zero = LockSiteValue {
        count: 0,
        wait_ns: 0,
        max_wait_ns: 0,
    };
    read_per_cpu_hash(ebpf, maps::LOCK_SITES, zero, |t, v| t.add(v))
}

/// The kernel addresses of a stack, innermost first.
pub fn stack(ebpf: &Ebpf, stack_id: u32) -> Option<Vec<u64>> {
    let map = StackTraceMap::try_from(ebpf.map(maps::LOCK_STACKS)?).ok()?;
    let trace = map.get(&stack_id, 0).ok()?;
    Some(trace.frames().iter().map(|f| f.ip).collect())
}

/// Forgets removed cgroups (by key).
pub fn forget(ebpf: &mut Ebpf, cgroups: &[u64]) {
    remove_per_cpu_keys::<u64, LockStats>(ebpf, maps::CGROUP_LOCKS, cgroups);
}

/// Deletes contended call sites; returns how many were there.
pub fn forget_sites(ebpf: &mut Ebpf, keys: &[LockSiteKey]) -> usize {
    remove_per_cpu_keys::<LockSiteKey, LockSiteValue>(ebpf, maps::LOCK_SITES, keys)
}
