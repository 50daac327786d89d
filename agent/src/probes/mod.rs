//! Loading and attaching the eBPF probes, with per-probe degradation: a probe whose tracepoint
//! or program type is missing is reported and left out; the rest of the agent carries on.
//!
//! Each probe family (scheduler, futex, kernel locks, network, Go mutexes) is one object that
//! keeps its state ([`family`]): what it needs from the kernel, how it attaches, its part of
//! the snapshot and what it forgets; [`Probes`] loops over them. What adding a family touches
//! is listed in [`family`].

pub mod attach;
pub mod batch;
pub mod binaries;
pub mod btf;
pub mod demand;
pub mod family;
pub mod futex;
pub mod gocpu;
pub mod gomutex;
pub mod kfuncs;
pub mod load;
pub mod locks;
pub mod map_io;
pub mod neighbours;
pub mod net;
pub mod pglock;
pub mod sched;
pub mod sizing;
pub mod slots;
pub mod stapsdt;
pub mod tiers;
pub mod tracefs;

use std::{
    cell::RefCell,
    collections::HashMap,
    fmt,
    hash::Hash,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader, Pod,
    maps::{PerCpuArray, PerCpuHashMap, PerCpuValues},
    programs::{
        BtfTracePoint, TracePoint, tp_btf::BtfTracePointLinkId, trace_point::TracePointLinkId,
    },
};
use stormwatch_common::{ProbeError as KernelProbeError, globals, maps};
use thiserror::Error;

use self::btf::{Btf, VMLINUX_BTF};
use crate::counters::UserLoss;

use self::tiers::OnDemand;
pub use self::{
    attach::{AttachKind, ProbeStatus},
    family::{Families, Gone, Loaded, ProbeFamily, ReadsPart},
    gomutex::{GoMutexPart, GoMutexWatch},
    load::{Family, KernelFacts, LoadError, LoadOptions},
    map_io::{IDLE_READS_BEFORE_EVICTION, IdleKeys, ProgramStats},
    sizing::{CGROUP_MAP_MIN_ENTRIES, PER_CPU_MAP_BUDGET_BYTES, per_cpu_map_sizes},
    slots::{SlotDirectory, busiest_first},
    tiers::{AttachWhen, FutexTier, NetPacketTier, RunqBlame, RunqBlameTier, Tier, WakeKinds},
};
pub(crate) use self::{
    attach::{
        attach_btf, attach_btf_only, attach_classic, attach_preferring_btf, load_btf, load_classic,
    },
    load::{btf_offsets, pointer_path, tracepoint_offsets},
    map_io::{
        read_counters, read_per_cpu_hash, read_per_cpu_hash_with, remove_per_cpu_keys,
        remove_per_cpu_matching,
    },
};

/// Reads a BTF file and checks that it can be what the probes need: a blob both our index and
/// aya's parser read whole, with the kernel's `struct task_struct` (an empty file, a truncated
/// one or a module's split BTF is refused). Whether it is the *running* kernel's is known only
/// at attach (`check_attached_to`). The error names the file.
pub fn read_btf(path: &Path) -> Result<(Btf, aya::Btf), String> {
    let shown = path.display();
    let btf = Btf::from_file(path).map_err(|e| match e {
        btf::BtfError::Read { source, .. } => source.about("BTF file", path),
        e => format!("{shown}: {e}"),
    })?;
    if !btf.has_struct("task_struct") {
        return Err(format!(
            "{shown}: no struct task_struct: not the BTF of a kernel (vmlinux)"
        ));
    }
    let aya_btf = aya::Btf::parse(btf.bytes(), aya::Endianness::default())
        .map_err(|e| format!("{shown}: {e}"))?;
    Ok((btf, aya_btf))
}

/// One line for a probe's note: an error's chain, with a verifier log cut to its verdict (the
/// last line before its statistics). The whole log goes to the debug log.
pub fn one_line(err: &anyhow::Error) -> String {
    let full = format!("{err:#}");
    let Some((head, log)) = full.split_once("Verifier output:") else {
        return full.split_whitespace().collect::<Vec<_>>().join(" ");
    };
    log::debug!("verifier output: {log}");
    let verdict = log
        .lines()
        .map(str::trim)
        .rfind(|l| {
            !l.is_empty()
                && !l.starts_with("verification time")
                && !l.starts_with("stack depth")
                && !l.starts_with("processed ")
                && !l.starts_with(':')
                && !l.starts_with(')')
        })
        .unwrap_or("(no verifier message)");
    let head = head.trim().trim_end_matches('.');
    format!("{head}; the verifier says: {verdict}")
}

/// The loaded probes. Dropping this detaches everything.
pub struct Probes {
    ebpf: Ebpf,
    pub status: Vec<ProbeStatus>,
    /// The run-queue wait and the off-CPU time come from `sched_switch` alone (tp_btf with
    /// `sched_info`): the wake-up programs only tell wake-ups local or remote.
    pub waits_from_switch: bool,
    /// The programs of each [`Tier`] loaded but attached only on demand ([`Probes::set`]).
    tiers: [Vec<OnDemand>; Tier::COUNT],
    /// The families, each with its state.
    families: Families,
    /// The host's network namespace inode where the kernel fixes it (`NET_NS_INIT_INO`, from
    /// BTF: 6.18 and later).
    pub init_netns: Option<u64>,
    /// The BTF came from a file the user gave: each on-demand tp_btf attach is checked
    /// (`check_attached_to`) as the first ones were.
    check_attach: bool,
}

/// Whether the kernel attached tp_btf program `prog` to `event`. The type id aya takes from a
/// BTF file names a `btf_trace_<event>` there, and the kernel resolves it in its own BTF: in a
/// file of another build the same id may name another tracepoint. The kernel's own name for
/// the link's tracepoint is in its fdinfo (`tp_name`, Linux 5.8 and later).
pub(crate) fn check_attached_to(prog: &BtfTracePoint, event: &str) -> anyhow::Result<()> {
    let id = prog.info()?.id();
    let mut found = None;
    for entry in std::fs::read_dir("/proc/self/fdinfo")?.flatten() {
        let Some(text) = crate::files::kernel_text(entry.path()) else {
            continue;
        };
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
        };
        if field("prog_id:").and_then(|v| v.parse::<u32>().ok()) != Some(id) {
            continue;
        }
        if let Some(tp) = field("tp_name:") {
            if tp == event {
                return Ok(());
            }
            found = Some(tp);
        }
    }
    match found {
        Some(other) => anyhow::bail!("its btf_trace_{event} is btf_trace_{other} in this kernel"),
        None => {
            anyhow::bail!("cannot confirm where the kernel attached {event} (no tp_name in fdinfo)")
        }
    }
}

/// Why a probe with a tp_btf program is a classic tracepoint: no usable BTF, or BTF without
/// the offsets its tp_btf program needs.
pub(crate) fn no_tp_btf(facts: &KernelFacts) -> String {
    match &facts.btf_error {
        Some(why) => format!("no tp_btf: {why}"),
        None if facts.aya_btf.is_none() => "no tp_btf".to_owned(),
        None => format!(
            "no tp_btf: {} lacks the task_struct offsets it needs",
            facts.btf_path.display()
        ),
    }
}

impl Probes {
    pub fn is_attached(&self, tracepoint: &str) -> bool {
        self.status
            .iter()
            .any(|s| s.tracepoint == tracepoint && s.attached())
    }

    /// The object and the families, for reading and forgetting each family's part of a
    /// snapshot.
    pub fn families_mut(&mut self) -> (&mut Ebpf, &mut Families) {
        (&mut self.ebpf, &mut self.families)
    }

    pub fn ebpf(&self) -> &Ebpf {
        &self.ebpf
    }

    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    /// Whether the futex probes sample hand-offs (with their user stacks).
    pub fn samples_handoffs(&self) -> bool {
        self.families.futex.samples_handoffs()
    }

    /// Whether the futex probes watch every process now: attached for good, or on demand and
    /// attached.
    pub fn futex_watching(&self) -> bool {
        if self.on_demand(Tier::Futex) {
            self.tier_attached(Tier::Futex)
        } else {
            self.is_attached(futex::EXIT)
        }
    }

    /// Looks for Go binaries among the processes of `tgids` (every process when `None`) while
    /// the futex probes watch, and forgets them all when they do not. Whether the uprobes are
    /// wanted now (the futex probes watch), and whether there are Go binaries to attach them
    /// to; when to run a burst is the on-demand policy's ([`demand::GoBursts`]).
    pub fn find_go_mutexes(&mut self, tgids: Option<&[u32]>) -> GoMutexWatch {
        if !self.families.go_mutex.loaded() {
            return GoMutexWatch::default();
        }
        if !self.futex_watching() {
            self.families.go_mutex.forget_all();
            return GoMutexWatch::default();
        }
        self.families
            .go_mutex
            .retain_processes(crate::files::process_alive);
        match tgids {
            Some(t) => self.families.go_mutex.watch(t.iter().copied()),
            None => self.families.go_mutex.watch_all(),
        }
        GoMutexWatch {
            watching: true,
            binaries: self.families.go_mutex.has_binaries(),
        }
    }

    /// The families, to read (what each keeps).
    pub fn families(&self) -> &Families {
        &self.families
    }

    /// Tells the network receive probe which container each network namespace belongs to
    /// (namespace inode → cgroup id, 0 for nobody's) and which namespaces no container can
    /// own, when it is attached.
    pub fn set_netns_owners(&mut self, owners: &HashMap<u32, u64>, nobodys: &[u32]) {
        if self.is_attached(net::RECEIVE)
            && let Err(e) =
                net::set_netns_owners(&mut self.ebpf, &mut self.families.net, owners, nobodys)
        {
            log::warn!("cannot tell the receive probe the namespaces' owners: {e:#}");
        }
    }

    /// The (namespace, cgroup) pairs the transmit probe saw sending.
    pub fn netns_senders(&self) -> Vec<stormwatch_common::net::NetSenderKey> {
        if self.is_attached(net::RECEIVE) {
            net::read_senders(&self.ebpf)
        } else {
            Vec::new()
        }
    }

    /// Events the probes could not record, by kind, summed over CPUs; then what the agent
    /// itself skipped or pruned ([`UserLoss`]).
    pub fn probe_errors(&self) -> Vec<(&'static str, u64)> {
        let kinds = KernelProbeError::ALL.iter().map(|k| (*k as u32, k.name()));
        let mut out = read_counters(&self.ebpf, maps::PROBE_ERRORS, kinds);
        out.extend(net::errors(&self.ebpf));
        out.extend(UserLoss::ALL.iter().map(|l| (l.name(), l.total())));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verifier_log_is_cut_to_its_verdict() {
        let err = anyhow::anyhow!(
            "the BPF_PROG_LOAD syscall returned Permission denied (os error 13). Verifier \
             output: reg type unsupported for arg#0 function sched_switch_tp#80\n    0: \
             R1=ctx(off=0,imm=0) R10=fp0\n    232: (79) r3 = *(u64 *)(r10 -136)\n    invalid \
             read from stack R10 off=-136 size=8\n    verification time 3653 usec\n    stack \
             depth 104+0\n    processed 109 insns (limit 1000000)\n    : Permission denied \
             (os error 13)"
        )
        .context("tracepoint");
        assert_eq!(
            one_line(&err),
            "tracepoint: the BPF_PROG_LOAD syscall returned Permission denied (os error 13); \
             the verifier says: invalid read from stack R10 off=-136 size=8"
        );
        let plain = anyhow::anyhow!("no such\n tracepoint");
        assert_eq!(one_line(&plain), "no such tracepoint");
    }
}
