//! The kernel lock contention family: `lock:contention_begin` / `contention_end`, and the
//! symbolization of contended call sites against /proc/kallsyms.

use std::collections::HashMap;

use aya::{Ebpf, maps::StackTraceMap};
use stormwatch_common::{LockSiteKey, LockSiteValue, LockStats, globals, maps, programs};

use super::{
    Gone, IDLE_READS_BEFORE_EVICTION, IdleKeys, KernelFacts, ProbeFamily, ProbeStatus, ReadsPart,
    SlotDirectory, attach_preferring_btf, read_per_cpu_hash, remove_per_cpu_keys,
    tracepoint_offsets,
};
use crate::counters::{Counters as _, UserLoss};

pub const BEGIN: &str = "lock:contention_begin";
pub const END: &str = "lock:contention_end";

/// The kernel lock family, with which contended call sites have been idle.
pub struct LockProbes {
    idle_sites: IdleKeys<LockSiteKey>,
    /// The cgroups in direct slots (`LOCK_SLOTS`).
    slots: SlotDirectory,
}

impl Default for LockProbes {
    fn default() -> Self {
        Self {
            idle_sites: IdleKeys::new(IDLE_READS_BEFORE_EVICTION),
            slots: SlotDirectory::new(maps::LOCK_SLOT_DIR, maps::LOCK_SLOTS),
        }
    }
}

/// The kernel locks' part of a snapshot.
#[derive(Clone, Debug, Default)]
pub struct LockPart {
    pub cgroups: HashMap<u64, LockStats>,
    pub sites: HashMap<LockSiteKey, LockSiteValue>,
}

impl LockPart {
    /// Drops a removed cgroup: its figures and call sites.
    pub fn forget_cgroup(&mut self, id: u64) {
        self.cgroups.remove(&id);
        self.sites.retain(|k, _| k.cgroup_id != id);
    }
}

impl ReadsPart for LockProbes {
    type Part = LockPart;

    fn read(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<LockPart> {
        let mut cgroups = read(ebpf)?;
        self.slots
            .merge_cgroups(ebpf, &mut cgroups, |s| s.count.iter().sum())?;
        Ok(LockPart {
            cgroups,
            sites: read_sites(ebpf)?,
        })
    }

    /// Removed cgroups' figures and call sites, then the call sites idle for
    /// [`IDLE_READS_BEFORE_EVICTION`] reads (the bounded map's eviction, counted as
    /// `lock_site_idle_evicted`).
    fn forget(&mut self, ebpf: &mut Ebpf, gone: &Gone, part: &mut LockPart) {
        if !gone.cgroups.is_empty() {
            remove_per_cpu_keys::<u64, LockStats>(ebpf, maps::CGROUP_LOCKS, gone.cgroups);
            self.slots.release(ebpf, |id| gone.cgroup(id));
        }
        let doomed: Vec<LockSiteKey> = part
            .sites
            .keys()
            .filter(|k| gone.cgroup(k.cgroup_id))
            .copied()
            .collect();
        forget_sites(ebpf, &doomed);
        for id in gone.cgroups {
            part.forget_cgroup(*id);
        }
        let idle = self
            .idle_sites
            .idle(part.sites.iter().map(|(k, v)| (*k, v.count)));
        let n = forget_sites(ebpf, &idle);
        UserLoss::LockSiteIdleEvicted.add(n as u64);
        for k in &idle {
            part.sites.remove(k);
        }
    }
}

impl ProbeFamily for LockProbes {
    fn name(&self) -> &'static str {
        "kernel locks"
    }

    fn globals(&mut self, _facts: &KernelFacts) -> Vec<(&'static str, u32)> {
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

    fn attach(&mut self, ebpf: &mut Ebpf, facts: &KernelFacts) -> Vec<ProbeStatus> {
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

fn read(ebpf: &Ebpf) -> anyhow::Result<HashMap<u64, LockStats>> {
    read_per_cpu_hash(ebpf, maps::CGROUP_LOCKS, LockStats::ZERO, |t, v| t.add(v))
}

fn read_sites(ebpf: &Ebpf) -> anyhow::Result<HashMap<LockSiteKey, LockSiteValue>> {
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

/// Deletes contended call sites; returns how many were there.
fn forget_sites(ebpf: &mut Ebpf, keys: &[LockSiteKey]) -> usize {
    remove_per_cpu_keys::<LockSiteKey, LockSiteValue>(ebpf, maps::LOCK_SITES, keys)
}
