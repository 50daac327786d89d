//! The futex probe family: `syscalls:sys_{enter,exit}_futex` and, where the kernel has them
//! (6.7+), the futex2 syscalls `futex_wait`, `futex_waitv` and `futex_wake`.

use std::collections::HashMap;

use aya::Ebpf;
use stormwatch_common::{
    FutexStats, HotFutexKey, HotFutexValue, ThreadHandoff, globals, maps, programs,
};

use super::{
    Gone, IDLE_READS_BEFORE_EVICTION, IdleKeys, KernelFacts, Loaded, ProbeFamily, ProbeStatus,
    ReadsPart, SlotDirectory, attach_classic, read_per_cpu_hash, remove_per_cpu_keys, tracefs,
    tracepoint_offsets,
};
use crate::counters::{Counters as _, UserLoss};

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

/// The futex family, with what it keeps: its attach epoch, the hand-off samples' ring buffer,
/// and which hot futex words have been idle.
pub struct FutexProbes {
    /// Load (verify) the programs at start but attach them only when asked
    /// ([`super::Probes::set`]).
    on_demand: bool,
    /// Sample hand-offs with their user stacks.
    call_sites: bool,
    /// The globals set up sampling (`HAVE_HANDOFF_SAMPLES`).
    sampling: bool,
    /// The sampled hand-offs' ring buffer, where the probes sample them.
    samples: Option<aya::maps::RingBuf<aya::maps::MapData>>,
    /// The attach epoch (`maps::FUTEX_EPOCH`), raised before each attach on demand.
    epoch: u32,
    idle_hot: IdleKeys<HotFutexKey>,
    /// The cgroups in direct slots (`FUTEX_SLOTS`).
    slots: SlotDirectory,
}

impl FutexProbes {
    pub fn new(on_demand: bool, call_sites: bool) -> Self {
        Self {
            on_demand,
            call_sites,
            sampling: false,
            samples: None,
            epoch: 1,
            idle_hot: IdleKeys::new(IDLE_READS_BEFORE_EVICTION),
            slots: SlotDirectory::new(maps::FUTEX_SLOT_DIR, maps::FUTEX_SLOTS),
        }
    }

    /// Whether the probes sample hand-offs (with their user stacks).
    pub fn samples_handoffs(&self) -> bool {
        self.samples.is_some()
    }

    /// The sides of sampled hand-offs written since the last call.
    pub fn drain_samples(&mut self) -> Vec<stormwatch_common::HandoffSample> {
        self.samples.as_mut().map(drain_samples).unwrap_or_default()
    }

    /// Raises the attach epoch before the programs attach on demand, so that a call whose
    /// entry was seen before the last detach is never paired with an exit seen now.
    pub(super) fn raise_epoch(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<()> {
        let next = self.epoch + 1;
        super::tiers::set_epoch(ebpf, maps::FUTEX_EPOCH, next)?;
        self.epoch = next;
        Ok(())
    }
}

/// Whether process `tgid` has exited.
fn exited(tgid: u32) -> bool {
    !crate::files::process_alive(tgid)
}

/// The futex family's part of a snapshot.
#[derive(Clone, Debug, Default)]
pub struct FutexPart {
    pub cgroups: HashMap<u64, FutexStats>,
    pub hot: HashMap<HotFutexKey, HotFutexValue>,
    /// Per thread id: its part in futex hand-offs.
    pub handoff_threads: HashMap<u32, ThreadHandoff>,
}

impl FutexPart {
    /// Drops a removed cgroup: its figures, hot futexes and threads' hand-offs.
    pub fn forget_cgroup(&mut self, id: u64) {
        self.cgroups.remove(&id);
        self.hot.retain(|k, _| k.cgroup_id != id);
        self.handoff_threads.retain(|_, v| v.cgroup_id != id);
    }
}

impl ReadsPart for FutexProbes {
    type Part = FutexPart;

    fn read(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<FutexPart> {
        let mut cgroups = read(ebpf)?;
        self.slots
            .merge_cgroups(ebpf, &mut cgroups, |s| s.wait.count + s.wakes)?;
        Ok(FutexPart {
            cgroups,
            hot: read_hot(ebpf)?,
            handoff_threads: read_handoff_threads(ebpf)?,
        })
    }

    /// Removed cgroups' figures, the hot futexes of processes that have exited and the
    /// hand-offs of threads that have, then the hot futexes idle for
    /// [`IDLE_READS_BEFORE_EVICTION`] reads (the bounded map's eviction, counted as
    /// `hot_futex_idle_evicted`).
    fn forget(&mut self, ebpf: &mut Ebpf, gone: &Gone, part: &mut FutexPart) {
        if !gone.cgroups.is_empty() {
            remove_per_cpu_keys::<u64, FutexStats>(ebpf, maps::CGROUP_FUTEX, gone.cgroups);
            self.slots.release(ebpf, |id| gone.cgroup(id));
        }
        let mut tgids: HashMap<u32, bool> = HashMap::new();
        let doomed_hot: Vec<HotFutexKey> = part
            .hot
            .keys()
            .filter(|k| {
                gone.cgroup(k.cgroup_id) || *tgids.entry(k.tgid).or_insert_with(|| exited(k.tgid))
            })
            .copied()
            .collect();
        forget_hot(ebpf, &doomed_hot);
        // Threads that have exited (an entry that moves belongs to a live thread, so only the
        // still ones are looked up).
        let doomed_threads: Vec<u32> = part
            .handoff_threads
            .iter()
            .filter(|(tid, v)| {
                gone.cgroup(v.cgroup_id)
                    || (!(gone.moved_thread)(**tid)
                        && !std::path::Path::new(&format!("/proc/{}/task/{tid}", v.tgid)).exists())
            })
            .map(|(tid, _)| *tid)
            .collect();
        forget_handoff_threads(ebpf, &doomed_threads);
        for tid in &doomed_threads {
            part.handoff_threads.remove(tid);
        }
        for id in gone.cgroups {
            part.forget_cgroup(*id);
        }
        for k in &doomed_hot {
            part.hot.remove(k);
        }
        let idle = self
            .idle_hot
            .idle(part.hot.iter().map(|(k, v)| (*k, v.waits)));
        let n = forget_hot(ebpf, &idle);
        UserLoss::HotFutexIdleEvicted.add(n as u64);
        for k in &idle {
            part.hot.remove(k);
        }
    }
}

impl ProbeFamily for FutexProbes {
    fn name(&self) -> &'static str {
        "futex"
    }

    /// Keeps the samples' ring buffer open where the globals set up sampling.
    fn settle(&mut self, ebpf: &mut Ebpf, _loaded: &Loaded) {
        if self.sampling {
            self.samples = take_samples(ebpf);
        }
    }

    fn globals(&mut self, facts: &KernelFacts) -> Vec<(&'static str, u32)> {
        let mut values = if self.call_sites {
            sample_globals(facts)
        } else {
            Vec::new()
        };
        self.sampling = values
            .iter()
            .any(|(g, v)| *g == globals::HAVE_HANDOFF_SAMPLES && *v == 1);
        values.extend(tracepoint_offsets(&[
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
        ]));
        values
    }

    fn attach(&mut self, ebpf: &mut Ebpf, _facts: &KernelFacts) -> Vec<ProbeStatus> {
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

/// The hand-off sampler's node-wide budget: sampled wakes per second on the whole node, each
/// with its waiter (see `ebpf-probes/kernel/src/handoff.rs`). Each CPU samples at most one wake
/// per `CPUs / budget` seconds.
pub const SAMPLED_WAKES_PER_SECOND: u32 = 100;

/// The globals of hand-off sampling: the user registers' offsets in `struct pt_regs` and the
/// thread's run-queue wait and switch counts in `task_struct`, from BTF, on an architecture
/// whose stacks the agent unwinds (x86-64); nothing, and no sampling, otherwise.
fn sample_globals(facts: &KernelFacts) -> Vec<(&'static str, u32)> {
    let Some(btf) = &facts.btf else {
        return Vec::new();
    };
    if !cfg!(target_arch = "x86_64") {
        log::info!("hand-off call sites are not sampled on this architecture yet");
        return Vec::new();
    }
    let mut values = super::pointer_path(
        btf,
        &[
            (globals::PT_REGS_IP_OFFSET, "pt_regs", &["ip"]),
            (globals::PT_REGS_SP_OFFSET, "pt_regs", &["sp"]),
            (globals::PT_REGS_BP_OFFSET, "pt_regs", &["bp"]),
            (globals::PT_REGS_AX_OFFSET, "pt_regs", &["ax"]),
            (
                globals::HOLD_RUN_DELAY_OFFSET,
                "task_struct",
                &["sched_info", "run_delay"],
            ),
            (globals::HOLD_NVCSW_OFFSET, "task_struct", &["nvcsw"]),
            (globals::HOLD_NIVCSW_OFFSET, "task_struct", &["nivcsw"]),
        ],
        globals::HAVE_HANDOFF_SAMPLES,
    );
    if values.is_empty() {
        log::info!("no pt_regs or sched_info in BTF: hand-off call sites are not sampled");
        return values;
    }
    let cpus = aya::util::nr_cpus().map(|n| n.get()).unwrap_or(1);
    values.push((
        globals::HANDOFF_SAMPLE_INTERVAL_NS,
        sample_interval_ns(cpus, SAMPLED_WAKES_PER_SECOND),
    ));
    values.push((
        globals::GO_SAMPLE_INTERVAL_NS,
        sample_interval_ns(cpus, super::gomutex::SAMPLES_PER_PROBED_SECOND),
    ));
    values
}

/// The shortest time between two sampled wakes on one CPU, for a node-wide budget.
pub fn sample_interval_ns(cpus: u32, per_second: u32) -> u32 {
    let ns = 1_000_000_000u64 * u64::from(cpus.max(1)) / u64::from(per_second.max(1));
    ns.min(u64::from(u32::MAX)) as u32
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

fn read(ebpf: &Ebpf) -> anyhow::Result<HashMap<u64, FutexStats>> {
    read_per_cpu_hash(ebpf, maps::CGROUP_FUTEX, FutexStats::ZERO, |t, v| t.add(v))
}

fn read_hot(ebpf: &Ebpf) -> anyhow::Result<HashMap<HotFutexKey, HotFutexValue>> {
    read_per_cpu_hash(ebpf, maps::HOT_FUTEXES, HotFutexValue::ZERO, |t, v| {
        t.add(v)
    })
}

/// Each thread's part in hand-offs, by thread id (cumulative since its entry was made).
fn read_handoff_threads(ebpf: &Ebpf) -> anyhow::Result<HashMap<u32, ThreadHandoff>> {
    let map = ebpf
        .map(maps::HANDOFF_THREADS)
        .ok_or_else(|| anyhow::anyhow!("map {} missing from the object", maps::HANDOFF_THREADS))?;
    let map = aya::maps::HashMap::<_, u32, ThreadHandoff>::try_from(map)?;
    // An entry deleted between the key walk and its lookup is simply not there.
    Ok(map.iter().filter_map(Result::ok).collect())
}

/// Deletes the hand-off entries of threads that have exited.
fn forget_handoff_threads(ebpf: &mut Ebpf, tids: &[u32]) {
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

/// Takes the hand-off samples' ring buffer out of the object, for the agent to keep open.
fn take_samples(ebpf: &mut Ebpf) -> Option<aya::maps::RingBuf<aya::maps::MapData>> {
    let map = ebpf.take_map(maps::HANDOFF_SAMPLES)?;
    match aya::maps::RingBuf::try_from(map) {
        Ok(ring) => Some(ring),
        Err(err) => {
            log::warn!("hand-off samples: {err}; call sites are not named");
            None
        }
    }
}

/// The samples in the ring buffer, oldest first (at most a few thousand: the kernel side is
/// rate-limited).
fn drain_samples(
    ring: &mut aya::maps::RingBuf<aya::maps::MapData>,
) -> Vec<stormwatch_common::HandoffSample> {
    let mut out = Vec::new();
    while let Some(item) = ring.next() {
        if item.len() >= size_of::<stormwatch_common::HandoffSample>() {
            // SAFETY: the kernel wrote a whole HandoffSample (its reservation's size); the
            // read is unaligned-safe.
            out.push(unsafe {
                std::ptr::read_unaligned(item.as_ptr().cast::<stormwatch_common::HandoffSample>())
            });
        }
    }
    out
}

/// Deletes hot-futex entries; returns how many were there.
fn forget_hot(ebpf: &mut Ebpf, keys: &[HotFutexKey]) -> usize {
    remove_per_cpu_keys::<HotFutexKey, HotFutexValue>(ebpf, maps::HOT_FUTEXES, keys)
}
