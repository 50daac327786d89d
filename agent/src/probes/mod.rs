//! Loading and attaching the eBPF probes, with per-probe degradation: a probe whose tracepoint
//! or program type is missing is reported and left out; the rest of the agent carries on.
//!
//! Each probe family (scheduler, futex, kernel locks, network) is a [`ProbeFamily`]: a name,
//! what it needs from the kernel, how to attach, and how its maps turn into figures.

pub mod batch;
pub mod btf;
pub mod futex;
pub mod locks;
pub mod net;
pub mod sched;
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
use stormwatch_common::{ProbeError as KernelProbeError, SchedStats, globals, maps};
use thiserror::Error;

use stormwatch_common::{HotFutexKey, HotFutexValue, LockSiteKey, LockSiteValue};

use self::btf::{Btf, VMLINUX_BTF};
use crate::counters::UserLoss;

/// The compiled probes, built by `build.rs` from `ebpf-probes/kernel`.
static PROBES_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/stormwatch"));

#[derive(Debug, Error)]
pub enum LoadError {
    #[error("cannot load the eBPF object")]
    Object(#[source] Box<aya::EbpfError>),
    #[error("no probe could be attached")]
    NothingAttached,
    #[error("{0}")]
    Btf(String),
}

/// How a program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttachKind {
    /// BTF-enabled raw tracepoint: the cheapest kind, needs kernel BTF.
    TpBtf,
    /// Classic tracepoint via tracefs: the fallback.
    Tracepoint,
}

impl fmt::Display for AttachKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::TpBtf => "tp_btf",
            Self::Tracepoint => "tracepoint",
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

    /// Loaded at start and attached only while asked for ([`WakeKinds::OnDemand`]).
    pub fn on_demand(&self) -> bool {
        matches!(
            self.note.as_deref(),
            Some(
                sched::ON_DEMAND_DETACHED
                    | sched::ON_DEMAND_ATTACHED
                    | futex::ON_DEMAND_DETACHED
                    | futex::ON_DEMAND_ATTACHED
                    | net::ON_DEMAND_DETACHED
                    | net::ON_DEMAND_ATTACHED
            )
        )
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
    /// Where the BTF is read from: the kernel's own (`/sys/kernel/btf/vmlinux`) or a file the
    /// user gave (`--btf`, `btf_file`).
    pub btf_path: PathBuf,
    /// The BTF is a file the user gave: each tp_btf attach is checked against the running
    /// kernel ([`check_attached_to`]), and the first that the kernel resolved to another
    /// tracepoint is kept here (the load then fails: the file is not this kernel's BTF).
    pub btf_external: bool,
    pub btf_mismatch: RefCell<Option<String>>,
    /// Whether the `task_struct` offsets the scheduler probes need were found (kept after
    /// `btf` is dropped).
    pub task_offsets: bool,
    /// Whether the kernel keeps each thread's run-queue wait (`task_struct.sched_info`,
    /// CONFIG_SCHED_INFO) where BTF finds it: then `sched_switch` alone times the waits.
    pub sched_info: bool,
    /// The inode of the host's network namespace, where the kernel gives it a fixed one
    /// (`NET_NS_INIT_INO`, 6.18 and later): known without seeing any of the host's processes.
    pub init_netns: Option<u64>,
}

impl KernelFacts {
    /// Reads the BTF once — `btf_file`, else the kernel's own: our lookups index the bytes,
    /// aya's loader parses them.
    pub fn probe(btf_file: Option<&Path>) -> Self {
        let (btf_path, btf_external) = match btf_file {
            Some(path) => (path.to_path_buf(), true),
            None => (PathBuf::from(VMLINUX_BTF), false),
        };
        let (btf, aya_btf) = match read_btf(&btf_path) {
            Ok(both) => both,
            Err(why) => {
                return Self {
                    aya_btf: None,
                    btf: None,
                    task_offsets: false,
                    sched_info: false,
                    init_netns: None,
                    btf_error: Some(why),
                    btf_path,
                    btf_external,
                    btf_mismatch: RefCell::new(None),
                };
            }
        };
        Self {
            aya_btf: Some(aya_btf),
            task_offsets: btf.member_offset("task_struct", "nvcsw").is_ok(),
            sched_info: ["run_delay", "pcount"]
                .iter()
                .all(|f| btf.offset_of("task_struct", &["sched_info", f]).is_ok()),
            init_netns: init_netns_inode(&btf),
            btf: Some(btf),
            btf_error: None,
            btf_path,
            btf_external,
            btf_mismatch: RefCell::new(None),
        }
    }
}

/// Reads a BTF file and checks that it can be what the probes need: a blob both our index and
/// aya's parser read whole, with the kernel's `struct task_struct` (an empty file, a truncated
/// one or a module's split BTF is refused). Whether it is the *running* kernel's is known only
/// at attach ([`check_attached_to`]). The error names the file.
pub fn read_btf(path: &Path) -> Result<(Btf, aya::Btf), String> {
    let shown = path.display();
    let btf = Btf::from_file(path).map_err(|e| match e {
        btf::BtfError::Read { source, .. } => format!("cannot read {shown}: {source}"),
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

/// `NET_NS_INIT_INO` of `enum init_ns_ino` (uapi `linux/nsfs.h`): the host's network namespace
/// inode on kernels that fix it. Inode numbers are 32-bit, as the probes key them.
fn init_netns_inode(btf: &Btf) -> Option<u64> {
    btf.enum_values("init_ns_ino")?
        .into_iter()
        .find(|(name, _)| name == "NET_NS_INIT_INO")
        .map(|(_, v)| u64::from(v as u32))
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
    /// The run-queue wait and the off-CPU time come from `sched_switch` alone (tp_btf with
    /// `sched_info`): the wake-up programs only tell wake-ups local or remote.
    pub waits_from_switch: bool,
    /// The programs of each [`Tier`] loaded but attached only on demand ([`Probes::set`]).
    tiers: [Vec<OnDemand>; Tier::COUNT],
    /// The futex probes' attach epoch (`maps::FUTEX_EPOCH`), raised before each attach.
    futex_epoch: u32,
    /// The CPUs' switch caches, as the last read left them.
    switch_caches: sched::SwitchCaches,
    idle_hot_futexes: IdleKeys<HotFutexKey>,
    idle_lock_sites: IdleKeys<LockSiteKey>,
    /// The host's network namespace inode where the kernel fixes it (`NET_NS_INIT_INO`, from
    /// BTF: 6.18 and later).
    pub init_netns: Option<u64>,
    /// The BTF came from a file the user gave: each on-demand tp_btf attach is checked
    /// ([`check_attached_to`]) as the first ones were.
    check_attach: bool,
}

/// Reads after which an entry of a bounded map that has not moved is deleted.
pub const IDLE_READS_BEFORE_EVICTION: u32 = 60;

/// For a bounded map the agent prunes: how many reads in a row each key's count stayed put.
#[derive(Debug)]
pub struct IdleKeys<K> {
    seen: HashMap<K, (u64, u32)>,
    limit: u32,
}

impl<K: Copy + Eq + Hash> IdleKeys<K> {
    pub fn new(limit: u32) -> Self {
        Self {
            seen: HashMap::new(),
            limit,
        }
    }

    /// Takes this read's `(key, count)`s; returns the keys idle for `limit` reads in a row
    /// (forgotten here: the caller deletes them). Keys no longer in the map are forgotten too.
    pub fn idle(&mut self, now: impl Iterator<Item = (K, u64)>) -> Vec<K> {
        let mut next = HashMap::new();
        let mut idle = Vec::new();
        for (key, count) in now {
            let reads = match self.seen.get(&key) {
                Some((was, reads)) if *was == count => reads + 1,
                _ => 0,
            };
            if reads >= self.limit {
                idle.push(key);
            } else {
                next.insert(key, (count, reads));
            }
        }
        self.seen = next;
        idle
    }
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
    /// Ignore the kernel's `sched_info`: the wake-up programs time the waits, as on kernels
    /// without it (for testing that way and measuring both).
    pub waits_from_wakeups: bool,
    pub families: Vec<Family>,
    /// The most cgroups followed: the per-cgroup maps hold at least this many.
    pub max_cgroups: usize,
    /// When the wake-up programs that tell local from remote wake-ups are attached.
    pub wake_kinds: WakeKinds,
    /// When the futex programs are attached.
    pub futex: FutexTier,
    /// When the per-packet network programs are attached.
    pub net_packets: NetPacketTier,
    /// A BTF file to use instead of the kernel's own (`/sys/kernel/btf/vmlinux`): where the
    /// agent cannot read that one (a container without /sys/kernel/btf, a kernel that does not
    /// publish it). It must be the running kernel's BTF ([`check_attached_to`]).
    pub btf_file: Option<PathBuf>,
}

/// When a tier of probes that the daemon attaches on demand is attached: the wake-up programs
/// ([`WakeKinds`]), the futex programs ([`FutexTier`]) or the per-packet network programs
/// ([`NetPacketTier`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttachWhen {
    /// With every other probe (`trace`, `diagnose`).
    #[default]
    Always,
    /// Loaded (verified) at start, attached only while the daemon asks for them.
    OnDemand,
}

/// When the programs that tell wake-ups local or remote (`sched_waking`, `sched_wakeup`,
/// `sched_wakeup_new`) are attached. They run at every wake-up of every thread on the node, and
/// are most of the scheduler probes' cost on a switch-heavy load; the figures the rest of the
/// agent exports do not need them where the kernel keeps `sched_info` (tp_btf). On demand
/// ([`Probes::set_wake_kinds`]) the daemon asks while it finds a lock storm, whose hand-offs
/// they explain. Where the wake-up programs time the run-queue wait (no `sched_info`, classic
/// tracepoints), they are always attached instead.
pub type WakeKinds = AttachWhen;

/// When the futex programs (`syscalls:sys_{enter,exit}_futex*`) are attached. Any attached
/// `syscalls:` tracepoint puts every thread of the node on the kernel's syscall slow path (12%
/// more per system call, measured), so the daemon attaches them on demand
/// ([`Probes::set_futex`]): while a cgroup's scheduler figures show what a lock storm needs.
pub type FutexTier = AttachWhen;

/// When the per-packet network programs (`net:net_dev_start_xmit`, `net:netif_receive_skb`)
/// are attached. They run for every packet of every interface — about 0.4 µs per packet each
/// way here, several percent of a loopback Redis request — where the drop and retransmit
/// programs run only for what went wrong. On demand ([`Probes::set`]) the daemon asks while a
/// network namespace shows packets that did not fit (the kernel's fragmentation and ICMP
/// counters, drops for being too big).
pub type NetPacketTier = AttachWhen;

/// A tier of programs the daemon attaches on demand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// The wake-up programs that tell wake-ups local or remote.
    WakeKinds = 0,
    /// The futex syscall programs.
    Futex = 1,
    /// The transmit and receive programs.
    NetPackets = 2,
}

impl Tier {
    pub const COUNT: usize = 3;

    /// How the daemon's messages name the tier ("the futex probes").
    pub fn name(self) -> &'static str {
        match self {
            Tier::WakeKinds => "wake-up",
            Tier::Futex => "futex",
            Tier::NetPackets => "per-packet network",
        }
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            force_tracepoints: false,
            waits_from_wakeups: false,
            families: Family::DEFAULT.to_vec(),
            max_cgroups: CGROUP_MAP_MIN_ENTRIES as usize,
            wake_kinds: WakeKinds::Always,
            futex: FutexTier::Always,
            net_packets: NetPacketTier::Always,
            btf_file: None,
        }
    }
}

impl Probes {
    pub fn load(options: &LoadOptions) -> Result<Self, LoadError> {
        raise_memlock_rlimit();
        tracefs::ensure_mounted();
        let mut facts = KernelFacts::probe(options.btf_file.as_deref());
        // A BTF file the user named must be usable: running without it would quietly be
        // something else than asked.
        if facts.btf_external
            && let Some(why) = &facts.btf_error
        {
            return Err(LoadError::Btf(why.clone()));
        }
        if options.force_tracepoints {
            facts.aya_btf = None;
            facts.btf_error = Some("tp_btf disabled by --force-tracepoints".to_owned());
        }
        if options.waits_from_wakeups {
            facts.sched_info = false;
        }
        let families: Vec<Box<dyn ProbeFamily>> = options
            .families
            .iter()
            .map(|f| -> Box<dyn ProbeFamily> {
                match f {
                    Family::Sched => Box::new(sched::SchedProbes {
                        wake_kinds: options.wake_kinds,
                    }),
                    Family::Futex => Box::new(futex::FutexProbes {
                        on_demand: options.futex == FutexTier::OnDemand,
                    }),
                    Family::Locks => Box::new(locks::LockProbes),
                    Family::Net => Box::new(net::NetProbes {
                        packets_on_demand: options.net_packets == NetPacketTier::OnDemand,
                    }),
                    Family::EmptySched => Box::new(EmptySchedProbes),
                }
            })
            .collect();

        // Globals must all be set before the single load of the object. Names come from the
        // shared crate; a missing one is set to 0 and the family that needs it degrades.
        let values: Vec<(&'static str, u32)> = shared_globals(&facts)
            .into_iter()
            .chain(families.iter().flat_map(|f| f.globals(&facts)))
            .collect();
        // Our parse of the kernel's BTF is only for offsets: free it before the loader works.
        // The loader reuses aya's parse (kernel BTF is several MB; three copies at once would
        // set the agent's peak memory).
        facts.btf = None;
        let mut loader = EbpfLoader::new();
        // The task-storage maps (per-thread state) have no aya type; the agent never opens them
        // from user space, the kernel programs use them.
        loader.allow_unsupported_maps();
        if let Some(btf) = &facts.aya_btf {
            loader.btf(btf);
        }
        for (name, value) in &values {
            loader.override_global(name, value, true);
        }
        let cpus = aya::util::nr_cpus().map(|n| n.get()).unwrap_or(1);
        for (map, entries) in per_cpu_map_sizes(cpus, options.max_cgroups) {
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
                    (None, Some(note)) if s.on_demand() => log::info!("{} {note}", s.tracepoint),
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
        if let Some(why) = facts.btf_mismatch.take() {
            // Its offsets are another kernel's too: nothing loaded with it can be trusted.
            return Err(LoadError::Btf(why));
        }
        if !status.iter().any(ProbeStatus::attached) {
            return Err(LoadError::NothingAttached);
        }
        let waits_from_switch = sched::waits_from_switch(&facts, &status);
        // The programs the families loaded for later (none unless on demand).
        let loaded_for_later = |programs: &[(&'static str, &'static str)]| -> Vec<OnDemand> {
            programs
                .iter()
                .filter(|(tracepoint, program)| {
                    status
                        .iter()
                        .any(|s| s.tracepoint == *tracepoint && s.on_demand())
                        && ebpf.program(program).is_some_and(|p| p.fd().is_ok())
                })
                .map(|&(tracepoint, program)| OnDemand {
                    tracepoint,
                    program,
                    link: None,
                })
                .collect()
        };
        let tiers = [
            loaded_for_later(&sched::WAKE_KIND_PROGRAMS),
            loaded_for_later(&futex::PROGRAMS),
            loaded_for_later(&net::PACKET_PROGRAMS),
        ];
        let init_netns = facts.init_netns;
        let check_attach = facts.btf_external;
        drop(facts);
        // Parsing the kernel's BTF (several MB, for the loader and tp_btf) is the agent's
        // largest allocation and it is over now: give the memory back to the system instead of
        // keeping it in the allocator for the agent's lifetime.
        crate::memory::release_free_memory();
        Ok(Self {
            ebpf,
            status,
            waits_from_switch,
            tiers,
            futex_epoch: 1,
            switch_caches: sched::SwitchCaches::default(),
            idle_hot_futexes: IdleKeys::new(IDLE_READS_BEFORE_EVICTION),
            idle_lock_sites: IdleKeys::new(IDLE_READS_BEFORE_EVICTION),
            init_netns,
            check_attach,
        })
    }

    /// Whether the programs of `tier` wait to be attached on demand.
    pub fn on_demand(&self, tier: Tier) -> bool {
        !self.tiers[tier as usize].is_empty()
    }

    /// Whether the on-demand programs of `tier` are attached now.
    pub fn tier_attached(&self, tier: Tier) -> bool {
        self.tiers[tier as usize].iter().any(|p| p.link.is_some())
    }

    /// Detaches the on-demand programs of `tier` for good (after an error), their status
    /// saying `why`.
    pub fn abandon(&mut self, tier: Tier, why: &str) {
        let _ = self.set(tier, false);
        abandon(&mut self.tiers[tier as usize], &mut self.status, why);
    }

    /// Attaches (`on`) or detaches the programs of `tier` loaded to be attached on demand, and
    /// updates their status; nothing when they are not on demand. On an error the programs
    /// attached so far stay so, and their status says it. Before the futex programs attach,
    /// their attach epoch is raised, so that a call whose entry was seen before the last
    /// detach is never paired with an exit seen now (it is counted as unpaired instead).
    pub fn set(&mut self, tier: Tier, on: bool) -> anyhow::Result<()> {
        if tier == Tier::Futex && on && !self.tier_attached(tier) {
            let next = self.futex_epoch + 1;
            let mut epoch: aya::maps::Array<_, u32> = self
                .ebpf
                .map_mut(maps::FUTEX_EPOCH)
                .ok_or_else(|| anyhow::anyhow!("map {} missing", maps::FUTEX_EPOCH))?
                .try_into()?;
            epoch.set(0, &next, 0)?;
            self.futex_epoch = next;
        }
        let notes = match tier {
            Tier::WakeKinds => (sched::ON_DEMAND_ATTACHED, sched::ON_DEMAND_DETACHED),
            Tier::Futex => (futex::ON_DEMAND_ATTACHED, futex::ON_DEMAND_DETACHED),
            Tier::NetPackets => (net::ON_DEMAND_ATTACHED, net::ON_DEMAND_DETACHED),
        };
        set_tier(
            &mut self.ebpf,
            &mut self.tiers[tier as usize],
            &mut self.status,
            on,
            notes,
            self.check_attach,
        )
    }

    pub fn is_attached(&self, tracepoint: &str) -> bool {
        self.status
            .iter()
            .any(|s| s.tracepoint == tracepoint && s.attached())
    }

    /// The scheduler figures of every cgroup and its on-CPU time on each CPU
    /// ([`sched::read`]).
    #[allow(clippy::type_complexity)]
    pub fn read_sched(
        &mut self,
    ) -> anyhow::Result<(HashMap<u64, SchedStats>, HashMap<u64, Vec<u64>>)> {
        sched::read(&mut self.ebpf, &mut self.switch_caches)
    }

    pub fn ebpf(&self) -> &Ebpf {
        &self.ebpf
    }

    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    /// Forgets what the probes keep about removed cgroups: their entries in the per-cgroup
    /// maps, deleted by key. (Their hot futexes and call sites are deleted by the caller, who
    /// knows their keys from the last snapshot: see [`Probes::forget_hot_futexes`].)
    pub fn forget_cgroups(&mut self, cgroups: &[u64]) {
        if cgroups.is_empty() {
            return;
        }
        if let Err(err) = sched::forget(&mut self.ebpf, &mut self.switch_caches, cgroups) {
            log::warn!("cannot give up the switch caches of removed cgroups: {err:#}");
        }
        locks::forget(&mut self.ebpf, cgroups);
        futex::forget(&mut self.ebpf, cgroups);
        net::forget(&mut self.ebpf, cgroups);
    }

    /// Tells the network receive probe which container each network namespace belongs to
    /// (namespace inode → cgroup id, 0 for nobody's), when it is attached.
    pub fn set_netns_owners(&mut self, owners: &HashMap<u32, u64>) {
        if self.is_attached(net::RECEIVE)
            && let Err(e) = net::set_netns_owners(&mut self.ebpf, owners)
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

    /// Deletes hot-futex entries (of exited processes, of removed cgroups), by key.
    pub fn forget_hot_futexes(&mut self, keys: &[HotFutexKey]) {
        futex::forget_hot(&mut self.ebpf, keys);
    }

    /// Deletes contended call sites (of removed cgroups), by key.
    pub fn forget_lock_sites(&mut self, keys: &[LockSiteKey]) {
        locks::forget_sites(&mut self.ebpf, keys);
    }

    /// Deletes the hot futexes and call sites whose counts have not moved for
    /// [`IDLE_READS_BEFORE_EVICTION`] reads (given this read's entries), so that these bounded
    /// maps hold what is current; counted as `hot_futex_idle_evicted`/`lock_site_idle_evicted`.
    /// Returns the deleted keys.
    pub fn evict_idle(
        &mut self,
        hot: &HashMap<HotFutexKey, HotFutexValue>,
        sites: &HashMap<LockSiteKey, LockSiteValue>,
    ) -> (Vec<HotFutexKey>, Vec<LockSiteKey>) {
        let idle_hot = self
            .idle_hot_futexes
            .idle(hot.iter().map(|(k, v)| (*k, v.waits)));
        let idle_sites = self
            .idle_lock_sites
            .idle(sites.iter().map(|(k, v)| (*k, v.count)));
        let n = futex::forget_hot(&mut self.ebpf, &idle_hot);
        UserLoss::HotFutexIdleEvicted.add(n as u64);
        let n = locks::forget_sites(&mut self.ebpf, &idle_sites);
        UserLoss::LockSiteIdleEvicted.add(n as u64);
        (idle_hot, idle_sites)
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

/// Kernel memory each preallocated per-CPU map may take. Per-CPU hash maps are preallocated
/// for every possible CPU unless created with `BPF_F_NO_PREALLOC`: `HOT_FUTEXES` at its
/// 8192-entry default is 64 B × 8192 × CPUs. A node agent must not take that on a big host, so
/// the capacity of the preallocated maps shrinks with the CPU count; what does not fit is
/// counted (`hot_futex_full`, `lock_site_full`, …).
pub const PER_CPU_MAP_BUDGET_BYTES: u64 = 16 << 20;
/// No map is made smaller than this many entries, whatever the CPU count.
const PER_CPU_MAP_MIN_ENTRIES: u32 = 512;
/// The per-cgroup maps hold at least this many cgroups (and at least `max_cgroups`).
pub const CGROUP_MAP_MIN_ENTRIES: u32 = 4096;

/// `(map, max_entries)` for each per-CPU hash map, given the number of possible CPUs and the
/// most cgroups the agent is asked to follow. The per-cgroup maps always hold at least
/// `max_cgroups`, whatever the CPU count: `CGROUP_FUTEX` is not preallocated (its memory follows
/// the cgroups that exist) and holds `max(max_cgroups, 4096)`; `CGROUP_SCHED` and
/// `CGROUP_LOCKS` must be preallocated (their programs run where the kernel's allocator cannot
/// refill), so they take the budget's fit but never fewer than `max_cgroups`: on a many-CPU
/// host a large `max_cgroups` costs kernel memory (`CGROUP_SCHED`: 856 B per cgroup per CPU).
pub fn per_cpu_map_sizes(cpus: u32, max_cgroups: usize) -> Vec<(&'static str, u32)> {
    use std::mem::size_of;
    use stormwatch_common::{LockStats, SchedStats, net};
    let cgroups = u32::try_from(max_cgroups)
        .unwrap_or(u32::MAX)
        .max(CGROUP_MAP_MIN_ENTRIES);
    let per_cpu = |value: usize, key: usize| value + key / cpus.max(1) as usize;
    // (map, default entries, bytes per entry per CPU: the value; keys are stored once)
    let preallocated = [
        (
            maps::HOT_FUTEXES,
            8192,
            per_cpu(size_of::<HotFutexValue>(), size_of::<HotFutexKey>()),
        ),
        (
            maps::LOCK_SITES,
            4096,
            per_cpu(size_of::<LockSiteValue>(), size_of::<LockSiteKey>()),
        ),
        (
            net::maps::CGROUP_NET,
            4096,
            size_of::<net::CgroupNetStats>(),
        ),
        (
            net::maps::NET_IFACES,
            4096,
            per_cpu(size_of::<net::NetIfStats>(), size_of::<net::NetIfKey>()),
        ),
        (
            net::maps::NET_DROPS,
            4096,
            per_cpu(size_of::<net::NetDropStats>(), size_of::<net::NetDropKey>()),
        ),
    ];
    let fit = |default: u32, per_cpu_bytes: usize| {
        let fit = PER_CPU_MAP_BUDGET_BYTES / (per_cpu_bytes as u64 * u64::from(cpus.max(1)));
        fit.clamp(u64::from(PER_CPU_MAP_MIN_ENTRIES), u64::from(default)) as u32
    };
    let max_cgroups = u32::try_from(max_cgroups).unwrap_or(u32::MAX);
    [
        (maps::CGROUP_FUTEX, cgroups),
        (
            maps::CGROUP_SCHED,
            fit(4096, size_of::<SchedStats>()).max(max_cgroups),
        ),
        (
            maps::CGROUP_LOCKS,
            fit(4096, size_of::<LockStats>()).max(max_cgroups),
        ),
    ]
    .into_iter()
    .chain(
        preallocated
            .into_iter()
            .map(|(name, default, per_cpu_bytes)| (name, fit(default, per_cpu_bytes))),
    )
    // One entry per interface in NET_IFACES: the same bound.
    .chain(
        preallocated
            .iter()
            .find(|p| p.0 == net::maps::NET_IFACES)
            .map(|&(_, default, per_cpu_bytes)| {
                (net::maps::NET_IFINFO, fit(default, per_cpu_bytes))
            }),
    )
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
        use stormwatch_common::programs::{
            BENCH_EMPTY_SWITCH, BENCH_EMPTY_WAKEUP, BENCH_EMPTY_WAKEUP_NEW, BENCH_EMPTY_WAKING,
        };
        // The same four tracepoints as the scheduler probes.
        [
            (sched::SWITCH, BENCH_EMPTY_SWITCH),
            (sched::WAKEUP, BENCH_EMPTY_WAKEUP),
            (sched::WAKEUP_NEW, BENCH_EMPTY_WAKEUP_NEW),
            (sched::WAKING, BENCH_EMPTY_WAKING),
        ]
        .into_iter()
        .map(|(tracepoint, program)| {
            let (_, event) = tracepoint.split_once(':').expect("category:event");
            let result = attach_btf(ebpf, program, event, facts);
            ProbeStatus {
                tracepoint,
                kind: result.is_ok().then_some(AttachKind::TpBtf),
                note: result.err().map(|e| one_line(&e)),
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
    use rustix::process::{Resource, Rlimit, setrlimit};
    let unlimited = Rlimit {
        current: None,
        maximum: None,
    };
    if let Err(err) = setrlimit(Resource::Memlock, unlimited) {
        log::debug!("could not raise RLIMIT_MEMLOCK ({err}); fine on kernels >= 5.11");
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
    read_per_cpu_hash_with(ebpf, name, |_, per_cpu: &PerCpuValues<V>| {
        let mut total = zero;
        for v in per_cpu.iter() {
            fold(&mut total, v);
        }
        total
    })
}

/// Reads a per-CPU hash map into one value per key, made by `value` from the key's per-CPU
/// values.
pub(crate) fn read_per_cpu_hash_with<K, V, T>(
    ebpf: &Ebpf,
    name: &str,
    mut value: impl FnMut(&K, &PerCpuValues<V>) -> T,
) -> anyhow::Result<HashMap<K, T>>
where
    K: Pod + Eq + Hash,
    V: Pod,
{
    let map = ebpf
        .map(name)
        .ok_or_else(|| anyhow::anyhow!("map {name} missing from the object"))?;
    let map = PerCpuHashMap::<_, K, V>::try_from(map)?;
    // A few syscalls per map instead of two per key; key by key where the kernel cannot.
    match batch::read_per_cpu_hash_with(aya::maps::IterableMap::map(&map), &mut value) {
        Err(batch::BatchError::Unsupported) => {}
        read => return Ok(read?),
    }
    let mut out = HashMap::new();
    for entry in map.iter() {
        let (key, per_cpu) = entry?;
        let v = value(&key, &per_cpu);
        out.insert(key, v);
    }
    Ok(out)
}

/// Removes the keys matching `gone` from a per-CPU hash map (a walk of the whole map: for
/// predicates; to remove known keys, [`remove_per_cpu_keys`]).
pub(crate) fn remove_per_cpu_matching<K, V>(
    ebpf: &mut Ebpf,
    name: &str,
    gone: impl Fn(&K) -> bool,
) -> usize
where
    K: Pod,
    V: Pod,
{
    let Some(mut map) = per_cpu_hash_mut::<K, V>(ebpf, name) else {
        return 0;
    };
    let doomed: Vec<K> = map
        .keys()
        .filter_map(Result::ok)
        .filter(|k| gone(k))
        .collect();
    doomed.iter().filter(|key| map.remove(key).is_ok()).count()
}

/// A per-CPU hash map of the object, to modify; `None` when its family is not in the object.
fn per_cpu_hash_mut<'a, K: Pod, V: Pod>(
    ebpf: &'a mut Ebpf,
    name: &str,
) -> Option<PerCpuHashMap<&'a mut aya::maps::MapData, K, V>> {
    PerCpuHashMap::try_from(ebpf.map_mut(name)?).ok()
}

/// Removes the given keys from a per-CPU hash map, each by key (no walk); returns how many were
/// there.
pub(crate) fn remove_per_cpu_keys<K, V>(ebpf: &mut Ebpf, name: &str, keys: &[K]) -> usize
where
    K: Pod,
    V: Pod,
{
    let Some(mut map) = per_cpu_hash_mut::<K, V>(ebpf, name) else {
        return 0;
    };
    keys.iter().filter(|key| map.remove(key).is_ok()).count()
}

/// Loads and attaches a tp_btf program against the facts' BTF; with a BTF file the user gave,
/// checks that the kernel attached it where asked ([`check_attached_to`]).
pub(crate) fn attach_btf(
    ebpf: &mut Ebpf,
    program: &str,
    event: &str,
    facts: &KernelFacts,
) -> anyhow::Result<()> {
    let Some(btf) = &facts.aya_btf else {
        anyhow::bail!(
            "no tp_btf: {}",
            facts.btf_error.as_deref().unwrap_or("no kernel BTF")
        );
    };
    if let Some(why) = facts.btf_mismatch.borrow().as_ref() {
        anyhow::bail!("{why}");
    }
    let prog = match load_btf(ebpf, program, event, btf) {
        Ok(prog) => prog,
        // The kernel refused the type id aya took from the file: it names no tracepoint (or
        // another kind of type) in the running kernel's BTF.
        Err(err) if facts.btf_external && format!("{err:#}").contains("attach_btf_id") => {
            let why = format!(
                "{} is not the running kernel's BTF: {}",
                facts.btf_path.display(),
                one_line(&err)
            );
            facts.btf_mismatch.borrow_mut().get_or_insert(why.clone());
            anyhow::bail!(why);
        }
        Err(err) => return Err(err),
    };
    let link = prog.attach()?;
    if facts.btf_external
        && let Err(err) = check_attached_to(prog, event)
    {
        let _ = prog.detach(link);
        let why = format!(
            "{} is not the running kernel's BTF: {err}",
            facts.btf_path.display()
        );
        facts.btf_mismatch.borrow_mut().get_or_insert(why.clone());
        anyhow::bail!(why);
    }
    Ok(())
}

/// Whether the kernel attached tp_btf program `prog` to `event`. The type id aya takes from a
/// BTF file names a `btf_trace_<event>` there, and the kernel resolves it in its own BTF: in a
/// file of another build the same id may name another tracepoint. The kernel's own name for
/// the link's tracepoint is in its fdinfo (`tp_name`, Linux 5.8 and later).
pub(crate) fn check_attached_to(prog: &BtfTracePoint, event: &str) -> anyhow::Result<()> {
    let id = prog.info()?.id();
    let mut found = None;
    for entry in std::fs::read_dir("/proc/self/fdinfo")?.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
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

/// Loads a tp_btf program (the verifier checks it now), to attach now or later.
pub(crate) fn load_btf<'a>(
    ebpf: &'a mut Ebpf,
    program: &str,
    event: &str,
    btf: &aya::Btf,
) -> anyhow::Result<&'a mut BtfTracePoint> {
    let prog: &mut BtfTracePoint = ebpf
        .program_mut(program)
        .ok_or_else(|| anyhow::anyhow!("program {program} missing from the object"))?
        .try_into()?;
    prog.load(event, btf)?;
    Ok(prog)
}

/// Loads (verifies) a classic tracepoint program without attaching it; nothing when it is loaded
/// already (one program may serve several tracepoints).
pub(crate) fn load_classic(ebpf: &mut Ebpf, program: &str) -> anyhow::Result<()> {
    let p: &mut aya::programs::TracePoint = ebpf
        .program_mut(program)
        .ok_or_else(|| anyhow::anyhow!("program {program} missing from the object"))?
        .try_into()?;
    if p.fd().is_err() {
        p.load()?;
    }
    Ok(())
}

/// Attaches a tp_btf program with no classic fallback; `why` words the note when it fails.
pub(crate) fn attach_btf_only(
    ebpf: &mut Ebpf,
    facts: &KernelFacts,
    tracepoint: &'static str,
    program: &str,
    why: impl FnOnce(anyhow::Error) -> String,
) -> ProbeStatus {
    let (_, event) = tracepoint.split_once(':').expect("category:event");
    match attach_btf(ebpf, program, event, facts) {
        Ok(()) => ProbeStatus {
            tracepoint,
            kind: Some(AttachKind::TpBtf),
            note: None,
        },
        Err(err) => ProbeStatus {
            tracepoint,
            kind: None,
            note: Some(why(err)),
        },
    }
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
    let fallback_note = match btf_program {
        Some(btf_program) if facts.aya_btf.is_some() => {
            let status = attach_btf_only(ebpf, facts, tracepoint, btf_program, |err| {
                format!("tp_btf failed: {}", one_line(&err))
            });
            if status.kind.is_some() || facts.btf_mismatch.borrow().is_some() {
                // Attached; or the BTF file is another kernel's, and the classic program
                // would read that kernel's offsets: the load fails instead.
                return status;
            }
            status.note
        }
        _ => Some(no_tp_btf(facts)),
    };
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
                Some(first) => format!("{first}; tracepoint failed: {}", one_line(&err)),
                None => format!("tracepoint failed: {}", one_line(&err)),
            }),
        },
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

/// The globals of the kernel crate's shared code, whichever families load: from a task to its
/// cgroup v2 id (`task->cgroups->dfl_cgrp->kn->id`), which the scheduler, futex and lock probes
/// read by loads rather than a helper call (`shared::task_cgroup_id`).
/// A program loaded at start and attached only on demand.
#[derive(Debug)]
struct OnDemand {
    tracepoint: &'static str,
    program: &'static str,
    link: Option<OnDemandLink>,
}

/// The link of an on-demand program while it is attached.
#[derive(Debug)]
enum OnDemandLink {
    Btf(BtfTracePointLinkId),
    Classic(TracePointLinkId),
}

/// Attaches (`on`) or detaches a tier of on-demand programs — in their order, detached in the
/// reverse — and sets their status with the tier's (attached, detached) notes. On an error the
/// programs attached so far stay so, and their status says it.
fn set_tier(
    ebpf: &mut Ebpf,
    tier: &mut [OnDemand],
    status: &mut [ProbeStatus],
    on: bool,
    (attached, detached): (&str, &str),
    check_attach: bool,
) -> anyhow::Result<()> {
    let order: Vec<usize> = if on {
        (0..tier.len()).collect()
    } else {
        (0..tier.len()).rev().collect()
    };
    for i in order {
        let OnDemand {
            tracepoint,
            program,
            link,
        } = &mut tier[i];
        if on == link.is_some() {
            continue;
        }
        let prog = ebpf
            .program_mut(program)
            .ok_or_else(|| anyhow::anyhow!("program {program} missing from the object"))?;
        let kind = match (link.take(), prog) {
            (Some(OnDemandLink::Btf(id)), aya::programs::Program::BtfTracePoint(p)) => {
                p.detach(id)?;
                AttachKind::TpBtf
            }
            (Some(OnDemandLink::Classic(id)), aya::programs::Program::TracePoint(p)) => {
                p.detach(id)?;
                AttachKind::Tracepoint
            }
            (None, aya::programs::Program::BtfTracePoint(p)) => {
                let id = p.attach()?;
                let (_, event) = tracepoint.split_once(':').expect("category:event");
                if check_attach && let Err(err) = check_attached_to(p, event) {
                    let _ = p.detach(id);
                    return Err(err.context("the BTF file is not the running kernel's"));
                }
                *link = Some(OnDemandLink::Btf(id));
                AttachKind::TpBtf
            }
            (None, aya::programs::Program::TracePoint(p)) => {
                let (category, event) = tracepoint.split_once(':').expect("category:event");
                *link = Some(OnDemandLink::Classic(p.attach(category, event)?));
                AttachKind::Tracepoint
            }
            (_, other) => {
                anyhow::bail!("{program}: unexpected program type {:?}", other.prog_type())
            }
        };
        if let Some(s) = status.iter_mut().find(|s| s.tracepoint == *tracepoint) {
            (s.kind, s.note) = if on {
                (Some(kind), Some(attached.to_owned()))
            } else {
                (None, Some(detached.to_owned()))
            };
        }
    }
    Ok(())
}

/// Forgets a tier's programs after an error, their status saying `why`.
fn abandon(tier: &mut Vec<OnDemand>, status: &mut [ProbeStatus], why: &str) {
    for p in tier.drain(..) {
        if let Some(s) = status.iter_mut().find(|s| s.tracepoint == p.tracepoint) {
            (s.kind, s.note) = (None, Some(format!("attaching on demand failed: {why}")));
        }
    }
}

fn shared_globals(facts: &KernelFacts) -> Vec<(&'static str, u32)> {
    let Some(btf) = &facts.btf else {
        return Vec::new();
    };
    pointer_path(
        btf,
        &[
            (globals::TASK_CGROUPS_OFFSET, "task_struct", &["cgroups"]),
            (globals::CSS_SET_DFL_CGRP_OFFSET, "css_set", &["dfl_cgrp"]),
            (globals::CGROUP_KN_OFFSET, "cgroup", &["kn"]),
            (globals::KERNFS_NODE_ID_OFFSET, "kernfs_node", &["id"]),
        ],
        globals::HAVE_TASK_CGROUP_OFFSETS,
    )
}

/// The offsets of fields the probes read together (a chain of pointer loads, or fields of one
/// struct), `(global, struct, member path)` each, and `flag` set to 1, when BTF has every one;
/// nothing when it lacks any (the probes then take their fallback).
pub(crate) fn pointer_path(
    btf: &Btf,
    steps: &[(&'static str, &str, &[&str])],
    flag: &'static str,
) -> Vec<(&'static str, u32)> {
    let offsets: Option<Vec<(&'static str, u32)>> = steps
        .iter()
        .map(|(global, root, path)| btf.offset_of(root, path).ok().map(|off| (*global, off)))
        .collect();
    match offsets {
        Some(mut offsets) => {
            offsets.push((flag, 1));
            offsets
        }
        None => Vec::new(),
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

    fn entries(sizes: &[(&str, u32)], map: &str) -> u32 {
        sizes.iter().find(|(m, _)| *m == map).unwrap().1
    }

    #[test]
    fn cgroup_maps_hold_max_cgroups_on_any_cpu_count() {
        for cpus in [1, 2, 56, 1024] {
            for max_cgroups in [10, 2000, 100_000] {
                let sizes = per_cpu_map_sizes(cpus, max_cgroups);
                for map in [maps::CGROUP_SCHED, maps::CGROUP_FUTEX, maps::CGROUP_LOCKS] {
                    let n = entries(&sizes, map);
                    assert!(n as usize >= max_cgroups, "{map} {n} on {cpus} CPUs");
                    assert!(n >= PER_CPU_MAP_MIN_ENTRIES, "{map} {n}");
                }
                let futex = entries(&sizes, maps::CGROUP_FUTEX);
                assert!(futex >= CGROUP_MAP_MIN_ENTRIES, "not preallocated: {futex}");
            }
        }
    }

    #[test]
    fn preallocated_maps_shrink_with_the_cpu_count() {
        let small = per_cpu_map_sizes(2, 2000);
        assert!(small.iter().all(|(_, n)| *n >= 4096), "{small:?}");
        let hot = entries(&per_cpu_map_sizes(56, 2000), maps::HOT_FUTEXES);
        assert!((PER_CPU_MAP_MIN_ENTRIES..8192).contains(&hot), "{hot}");
        let bytes = u64::from(hot) * 40 * 56;
        assert!(bytes <= PER_CPU_MAP_BUDGET_BYTES, "{bytes}");
        let huge = entries(&per_cpu_map_sizes(1024, 2000), maps::HOT_FUTEXES);
        assert_eq!(huge, PER_CPU_MAP_MIN_ENTRIES, "never below the floor");
    }

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

    #[test]
    fn tiers_are_named_as_the_logs_have_them() {
        // The pod test looks for "<name> probes on demand:" in the logs to see a refusal.
        assert_eq!(Tier::WakeKinds.name(), "wake-up");
        assert_eq!(Tier::Futex.name(), "futex");
        assert_eq!(Tier::NetPackets.name(), "per-packet network");
    }

    #[test]
    fn idle_keys_are_those_unchanged_for_the_limit() {
        let mut idle = IdleKeys::new(2);
        assert!(idle.idle([(1, 5), (2, 7)].into_iter()).is_empty());
        assert!(idle.idle([(1, 5), (2, 8)].into_iter()).is_empty());
        // Key 1 unchanged for its second read in a row after the first: idle now.
        assert_eq!(idle.idle([(1, 5), (2, 9)].into_iter()), vec![1]);
        // Forgotten once reported; a key gone from the map is forgotten too.
        assert!(idle.idle([(2, 9)].into_iter()).is_empty());
        assert_eq!(idle.idle([(2, 9)].into_iter()), vec![2]);
    }
}
