//! Loading and attaching the eBPF probes, with per-probe degradation: a probe whose tracepoint
//! or program type is missing is reported and left out; the rest of the agent carries on.
//!
//! Each probe family (scheduler today; futex, locks and network later) is a [`ProbeFamily`]:
//! a name, what it needs from the kernel, how to attach, and how its maps turn into figures.

pub mod batch;
pub mod btf;
pub mod futex;
pub mod locks;
pub mod net;
pub mod sched;
pub mod tracefs;

use std::{collections::HashMap, fmt, hash::Hash};

use aya::{
    Ebpf, EbpfLoader, Pod,
    maps::{PerCpuArray, PerCpuHashMap},
    programs::{BtfTracePoint, TracePoint},
};
use stormwatch_common::{ProbeError as KernelProbeError, maps};
use thiserror::Error;

use self::btf::{Btf, VMLINUX_BTF};

/// The compiled probes, built by `build.rs` from `ebpf-probes/kernel`.
static PROBES_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/stormwatch"));

#[derive(Debug, Error)]
pub enum LoadError {
    #[error("cannot load the eBPF object")]
    Object(#[source] Box<aya::EbpfError>),
    #[error("no probe could be attached")]
    NothingAttached,
}

/// How a program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttachKind {
    /// BTF-enabled raw tracepoint: the cheapest kind, needs kernel BTF.
    TpBtf,
    /// Classic tracepoint via tracefs: the fallback.
    Tracepoint,
    /// A `cgroup_skb` program on the cgroup v2 root (multi-attach).
    CgroupSkb,
}

impl fmt::Display for AttachKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::TpBtf => "tp_btf",
            Self::Tracepoint => "tracepoint",
            Self::CgroupSkb => "cgroup_skb",
        })
    }
}

/// What became of one probe (one tracepoint).
#[derive(Clone, Debug, serde::Serialize)]
pub struct ProbeStatus {
    /// `category:event`, e.g. `sched:sched_switch`.
    pub tracepoint: &'static str,
    /// How it is attached, or `None` when it is not.
    pub kind: Option<AttachKind>,
    /// Why it is not attached, or why it fell back.
    pub note: Option<String>,
}

impl ProbeStatus {
    pub fn attached(&self) -> bool {
        self.kind.is_some()
    }
}

/// What a family needs from the running kernel, for `load` and for `stormwatch check`.
pub struct KernelFacts {
    /// The kernel's BTF, as aya needs it to load tp_btf programs.
    pub aya_btf: Option<aya::Btf>,
    /// The same BTF, for our own offset lookups.
    pub btf: Option<Btf>,
    /// Why BTF is unusable, when it is.
    pub btf_error: Option<String>,
    /// Whether the `task_struct` offsets the scheduler probes need were found (kept after
    /// `btf` is dropped).
    pub task_offsets: bool,
}

impl KernelFacts {
    pub fn probe() -> Self {
        let aya_btf = aya::Btf::from_sys_fs();
        let btf = Btf::from_file(VMLINUX_BTF);
        match (aya_btf, btf) {
            (Ok(a), Ok(b)) => Self {
                aya_btf: Some(a),
                task_offsets: b.member_offset("task_struct", "nvcsw").is_ok(),
                btf: Some(b),
                btf_error: None,
            },
            (a, b) => Self {
                aya_btf: None,
                btf: None,
                task_offsets: false,
                btf_error: Some(match (a.err(), b.err()) {
                    (Some(e), _) => format!("{VMLINUX_BTF}: {e}"),
                    (_, Some(e)) => format!("{e}"),
                    _ => "unusable".to_owned(),
                }),
            },
        }
    }
}

/// A probe family: a name, the globals it needs set before load, and how it attaches.
pub trait ProbeFamily {
    fn name(&self) -> &'static str;
    /// Read-only globals to set before load (name, value). Errors name what is missing.
    fn globals(&self, facts: &KernelFacts) -> Vec<(&'static str, u32)>;
    /// Loads and attaches the family's programs, one status per tracepoint.
    fn attach(&self, ebpf: &mut Ebpf, facts: &KernelFacts) -> Vec<ProbeStatus>;
}

/// The loaded probes. Dropping this detaches everything.
pub struct Probes {
    ebpf: Ebpf,
    pub status: Vec<ProbeStatus>,
}

/// A probe family, as named on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Family {
    /// Context switches, run-queue latency, on/off-CPU time, migrations.
    Sched,
    /// Futex waits and wakes, hot futex words.
    Futex,
    /// Kernel lock contention by kind and call site.
    Locks,
    /// Packets per interface against the MTU, per-container traffic, drops, TCP retransmits.
    Net,
    /// Empty programs on sched_switch and sched_wakeup: the overhead benchmark's floor.
    #[value(hide = true)]
    EmptySched,
}

impl Family {
    /// What the agent runs by default: every real family.
    pub const DEFAULT: [Family; 4] = [Family::Sched, Family::Futex, Family::Locks, Family::Net];
}

/// Options for [`Probes::load`].
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Use classic tracepoints even where tp_btf would work (for testing the fallback and for
    /// measuring both).
    pub force_tracepoints: bool,
    pub families: Vec<Family>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            force_tracepoints: false,
            families: Family::DEFAULT.to_vec(),
        }
    }
}

impl Probes {
    pub fn load(options: &LoadOptions) -> Result<Self, LoadError> {
        raise_memlock_rlimit();
        tracefs::ensure_mounted();
        let mut facts = KernelFacts::probe();
        if options.force_tracepoints {
            facts.aya_btf = None;
            facts.btf_error = Some("tp_btf disabled by --force-tracepoints".to_owned());
        }
        let families: Vec<Box<dyn ProbeFamily>> = options
            .families
            .iter()
            .map(|f| -> Box<dyn ProbeFamily> {
                match f {
                    Family::Sched => Box::new(sched::SchedProbes),
                    Family::Futex => Box::new(futex::FutexProbes),
                    Family::Locks => Box::new(locks::LockProbes),
                    Family::Net => Box::new(net::NetProbes),
                    Family::EmptySched => Box::new(EmptySchedProbes),
                }
            })
            .collect();

        // Globals must all be set before the single load of the object. Names come from the
        // shared crate; a missing one is set to 0 and the family that needs it degrades.
        let values: Vec<(&'static str, u32)> =
            families.iter().flat_map(|f| f.globals(&facts)).collect();
        // Our parse of the kernel's BTF is only for offsets: free it before the loader works.
        // The loader reuses aya's parse (kernel BTF is several MB; three copies at once would
        // set the agent's peak memory).
        facts.btf = None;
        let mut loader = EbpfLoader::new();
        if let Some(btf) = &facts.aya_btf {
            loader.btf(btf);
        }
        for (name, value) in &values {
            loader.override_global(name, value, true);
        }
        let cpus = aya::util::nr_cpus().map(|n| n.get()).unwrap_or(1);
        for (map, entries) in per_cpu_map_sizes(cpus) {
            loader.map_max_entries(map, entries);
        }
        let mut ebpf = loader
            .load(PROBES_OBJECT)
            .map_err(|e| LoadError::Object(Box::new(e)))?;

        let mut status = Vec::new();
        for family in &families {
            let family_status = family.attach(&mut ebpf, &facts);
            for s in &family_status {
                match (&s.kind, &s.note) {
                    (Some(kind), _) => log::debug!("{} attached ({kind})", s.tracepoint),
                    (None, note) => log::warn!(
                        "{} probe {} not attached: {}",
                        family.name(),
                        s.tracepoint,
                        note.as_deref().unwrap_or("unknown reason")
                    ),
                }
            }
            status.extend(family_status);
        }
        if !status.iter().any(ProbeStatus::attached) {
            return Err(LoadError::NothingAttached);
        }
        drop(facts);
        // Parsing the kernel's BTF (several MB, for the loader and tp_btf) is the agent's
        // largest allocation and it is over now: give the memory back to the system instead of
        // keeping it in the allocator for the agent's lifetime.
        #[cfg(target_env = "gnu")]
        // SAFETY: malloc_trim has no preconditions.
        unsafe {
            libc::malloc_trim(0);
        }
        Ok(Self { ebpf, status })
    }

    pub fn is_attached(&self, tracepoint: &str) -> bool {
        self.status
            .iter()
            .any(|s| s.tracepoint == tracepoint && s.attached())
    }

    pub fn ebpf(&self) -> &Ebpf {
        &self.ebpf
    }

    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    /// Forgets what the probes keep about removed cgroups.
    pub fn forget_cgroups(&mut self, cgroups: &[u64]) {
        if cgroups.is_empty() {
            return;
        }
        sched::forget(&mut self.ebpf, cgroups);
        locks::forget(&mut self.ebpf, cgroups);
        futex::forget(&mut self.ebpf, |k| cgroups.contains(&k.cgroup_id), cgroups);
        net::forget(&mut self.ebpf, cgroups);
    }

    /// Forgets the hot futexes of processes that have exited.
    pub fn forget_processes(&mut self, exited: impl Fn(u32) -> bool) {
        futex::forget(&mut self.ebpf, |k| exited(k.tgid), &[]);
    }

    /// Events the probes could not record, by kind, summed over CPUs.
    pub fn probe_errors(&self) -> Vec<(&'static str, u64)> {
        let kinds = KernelProbeError::ALL.iter().map(|k| (*k as u32, k.name()));
        let mut out = read_counters(&self.ebpf, maps::PROBE_ERRORS, kinds);
        out.extend(net::errors(&self.ebpf));
        out
    }
}

/// Kernel memory each per-CPU map may take. Per-CPU hash maps are preallocated for every
/// possible CPU: `CGROUP_SCHED` at its 4096-entry default is 312 B × 4096 × CPUs — 71 MiB on a
/// 56-CPU host. A node agent must not take that, so capacity shrinks with the CPU count; what
/// does not fit is counted (`cgroup_map_full`, `hot_futex_update`, `lock_site_full`).
pub const PER_CPU_MAP_BUDGET_BYTES: u64 = 16 << 20;
/// No map is made smaller than this many entries, whatever the CPU count.
const PER_CPU_MAP_MIN_ENTRIES: u32 = 512;

/// `(map, max_entries)` for each per-CPU hash map, given the number of possible CPUs.
pub fn per_cpu_map_sizes(cpus: u32) -> Vec<(&'static str, u32)> {
    use std::mem::size_of;
    use stormwatch_common::{
        FutexStats, HotFutexKey, HotFutexValue, LockSiteKey, LockSiteValue, LockStats, SchedStats,
    };
    // (map, default entries, bytes per entry per CPU: the value; keys are stored once)
    let maps = [
        (maps::CGROUP_SCHED, 4096, size_of::<SchedStats>()),
        (maps::CGROUP_FUTEX, 4096, size_of::<FutexStats>()),
        (maps::CGROUP_LOCKS, 4096, size_of::<LockStats>()),
        (
            maps::HOT_FUTEXES,
            8192,
            size_of::<HotFutexValue>() + size_of::<HotFutexKey>() / cpus.max(1) as usize,
        ),
        (
            maps::LOCK_SITES,
            4096,
            size_of::<LockSiteValue>() + size_of::<LockSiteKey>() / cpus.max(1) as usize,
        ),
        (
            stormwatch_common::net::maps::CGROUP_NET,
            4096,
            size_of::<stormwatch_common::net::CgroupNetStats>(),
        ),
        (
            stormwatch_common::net::maps::NET_IFACES,
            4096,
            size_of::<stormwatch_common::net::NetIfStats>()
                + size_of::<stormwatch_common::net::NetIfKey>() / cpus.max(1) as usize,
        ),
        (
            stormwatch_common::net::maps::NET_DROPS,
            4096,
            size_of::<stormwatch_common::net::NetDropStats>()
                + size_of::<stormwatch_common::net::NetDropKey>() / cpus.max(1) as usize,
        ),
    ];
    maps.into_iter()
        .map(|(name, default, per_cpu_bytes)| {
            let fit = PER_CPU_MAP_BUDGET_BYTES / (per_cpu_bytes as u64 * u64::from(cpus.max(1)));
            let entries = fit.clamp(u64::from(PER_CPU_MAP_MIN_ENTRIES), default);
            (name, entries as u32)
        })
        .collect()
}

/// The benchmark floor: empty tp_btf programs on `sched_switch` and `sched_wakeup`.
struct EmptySchedProbes;

impl ProbeFamily for EmptySchedProbes {
    fn name(&self) -> &'static str {
        "empty (benchmark floor)"
    }

    fn globals(&self, _facts: &KernelFacts) -> Vec<(&'static str, u32)> {
        Vec::new()
    }

    fn attach(&self, ebpf: &mut Ebpf, facts: &KernelFacts) -> Vec<ProbeStatus> {
        use stormwatch_common::programs::{BENCH_EMPTY_SWITCH, BENCH_EMPTY_WAKEUP};
        [
            (sched::SWITCH, BENCH_EMPTY_SWITCH),
            (sched::WAKEUP, BENCH_EMPTY_WAKEUP),
        ]
        .into_iter()
        .map(|(tracepoint, program)| {
            let (_, event) = tracepoint.split_once(':').expect("category:event");
            let result = match &facts.aya_btf {
                Some(btf) => attach_btf(ebpf, program, event, btf),
                None => Err(anyhow::anyhow!("no kernel BTF")),
            };
            ProbeStatus {
                tracepoint,
                kind: result.is_ok().then_some(AttachKind::TpBtf),
                note: result.err().map(|e| format!("{e:#}")),
            }
        })
        .collect()
    }
}

/// Sets the globals of one family from BTF offsets: `(global, struct, [member names])`.
pub(crate) fn btf_offsets(
    facts: &KernelFacts,
    wanted: &[(&'static str, &str, &[&str])],
) -> Vec<(&'static str, u32)> {
    wanted
        .iter()
        .filter_map(|(global, strukt, members)| {
            let btf = facts.btf.as_ref()?;
            match btf.first_member_offset(strukt, members) {
                Ok(off) => Some((*global, off)),
                Err(err) => {
                    log::warn!("{global}: {err}");
                    None
                }
            }
        })
        .collect()
}

/// The kernel accounts BPF maps to memory cgroups since 5.11; older kernels charge
/// RLIMIT_MEMLOCK. Raising it may be refused (as in some containers); that is harmless on a
/// kernel that does not use it, so a failure is only logged.
fn raise_memlock_rlimit() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit with a valid pointer.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) } != 0 {
        log::debug!(
            "could not raise RLIMIT_MEMLOCK ({}); fine on kernels >= 5.11",
            std::io::Error::last_os_error()
        );
    }
}

/// Reads named slots of a per-CPU counter array, each summed over CPUs; nothing when the map
/// is missing (its family is not in the object).
pub(crate) fn read_counters(
    ebpf: &Ebpf,
    map: &str,
    slots: impl Iterator<Item = (u32, &'static str)>,
) -> Vec<(&'static str, u64)> {
    let Some(array) = ebpf
        .map(map)
        .and_then(|m| PerCpuArray::<_, u64>::try_from(m).ok())
    else {
        return Vec::new();
    };
    slots
        .map(|(index, name)| {
            let total = array
                .get(&index, 0)
                .map(|values| values.iter().sum())
                .unwrap_or(0);
            (name, total)
        })
        .collect()
}

/// Reads a per-CPU hash map into one value per key, folding the CPUs' values with `fold`.
pub(crate) fn read_per_cpu_hash<K, V>(
    ebpf: &Ebpf,
    name: &str,
    zero: V,
    fold: impl Fn(&mut V, &V),
) -> anyhow::Result<HashMap<K, V>>
where
    K: Pod + Eq + Hash,
    V: Pod,
{
    let map = ebpf
        .map(name)
        .ok_or_else(|| anyhow::anyhow!("map {name} missing from the object"))?;
    let map = PerCpuHashMap::<_, K, V>::try_from(map)?;
    // A few syscalls per map instead of two per key; key by key where the kernel cannot.
    match batch::read_per_cpu_hash(aya::maps::IterableMap::map(&map), zero, &fold) {
        Err(batch::BatchError::Unsupported) => {}
        read => return Ok(read?),
    }
    let mut out = HashMap::new();
    for entry in map.iter() {
        let (key, per_cpu) = entry?;
        let mut total = zero;
        for v in per_cpu.iter() {
            fold(&mut total, v);
        }
        out.insert(key, total);
    }
    Ok(out)
}

/// Removes the keys matching `gone` from a per-CPU hash map.
pub(crate) fn remove_per_cpu_keys<K, V>(ebpf: &mut Ebpf, name: &str, gone: impl Fn(&K) -> bool)
where
    K: Pod,
    V: Pod,
{
    let Some(map) = ebpf.map_mut(name) else {
        return;
    };
    let Ok(mut map) = PerCpuHashMap::<_, K, V>::try_from(map) else {
        return;
    };
    let doomed: Vec<K> = map
        .keys()
        .filter_map(Result::ok)
        .filter(|k| gone(k))
        .collect();
    for key in doomed {
        let _ = map.remove(&key);
    }
}

/// Loads and attaches a tp_btf program.
pub(crate) fn attach_btf(
    ebpf: &mut Ebpf,
    program: &str,
    event: &str,
    btf: &aya::Btf,
) -> anyhow::Result<()> {
    let prog: &mut BtfTracePoint = ebpf
        .program_mut(program)
        .ok_or_else(|| anyhow::anyhow!("program {program} missing from the object"))?
        .try_into()?;
    prog.load(event, btf)?;
    prog.attach()?;
    Ok(())
}

/// Loads (once) and attaches a classic tracepoint program; a program may be attached to
/// several tracepoints with alike records.
pub(crate) fn attach_classic(
    ebpf: &mut Ebpf,
    program: &str,
    category: &str,
    event: &str,
) -> anyhow::Result<()> {
    if !tracefs::tracepoint_exists(category, event) {
        anyhow::bail!("{category}:{event} does not exist (or tracefs is not mounted)");
    }
    let prog: &mut TracePoint = ebpf
        .program_mut(program)
        .ok_or_else(|| anyhow::anyhow!("program {program} missing from the object"))?
        .try_into()?;
    if prog.fd().is_err() {
        prog.load()?;
    }
    prog.attach(category, event)?;
    Ok(())
}

/// Attaches one tracepoint, preferring tp_btf (when `btf_program` is given and the kernel has
/// BTF) and falling back to the classic tracepoint.
pub(crate) fn attach_preferring_btf(
    ebpf: &mut Ebpf,
    facts: &KernelFacts,
    tracepoint: &'static str,
    btf_program: Option<&str>,
    classic_program: &str,
) -> ProbeStatus {
    let (category, event) = tracepoint.split_once(':').expect("category:event");
    let mut fallback_note = None;
    if let Some(btf_program) = btf_program {
        match &facts.aya_btf {
            Some(btf) => match attach_btf(ebpf, btf_program, event, btf) {
                Ok(()) => {
                    return ProbeStatus {
                        tracepoint,
                        kind: Some(AttachKind::TpBtf),
                        note: None,
                    };
                }
                Err(err) => fallback_note = Some(format!("tp_btf failed ({err:#})")),
            },
            None => {
                fallback_note = facts
                    .btf_error
                    .as_ref()
                    .map(|why| format!("no tp_btf: {why}"))
            }
        }
    }
    match attach_classic(ebpf, classic_program, category, event) {
        Ok(()) => ProbeStatus {
            tracepoint,
            kind: Some(AttachKind::Tracepoint),
            note: fallback_note,
        },
        Err(err) => ProbeStatus {
            tracepoint,
            kind: None,
            note: Some(match fallback_note {
                Some(first) => format!("{first}; tracepoint failed ({err:#})"),
                None => format!("tracepoint failed ({err:#})"),
            }),
        },
    }
}

/// Offsets of tracepoint record fields, as globals: `(global, category, event, field)`.
pub(crate) fn tracepoint_offsets(
    wanted: &[(&'static str, &str, &str, &str)],
) -> Vec<(&'static str, u32)> {
    wanted
        .iter()
        .filter_map(|(global, category, event, field)| {
            tracefs::field_offset(category, event, field).map(|off| (*global, off))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_cpu_maps_shrink_with_the_cpu_count() {
        let small = per_cpu_map_sizes(2);
        assert!(small.iter().all(|(_, n)| *n >= 4096), "{small:?}");
        let big = per_cpu_map_sizes(56);
        let sched = big
            .iter()
            .find(|(m, _)| *m == maps::CGROUP_SCHED)
            .unwrap()
            .1;
        assert!((PER_CPU_MAP_MIN_ENTRIES..4096).contains(&sched), "{sched}");
        let bytes = u64::from(sched) * 312 * 56;
        assert!(bytes <= PER_CPU_MAP_BUDGET_BYTES, "{bytes}");
        let huge = per_cpu_map_sizes(1024);
        let sched = huge
            .iter()
            .find(|(m, _)| *m == maps::CGROUP_SCHED)
            .unwrap()
            .1;
        assert_eq!(sched, PER_CPU_MAP_MIN_ENTRIES, "never below the floor");
    }
}
