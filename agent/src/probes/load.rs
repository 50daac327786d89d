//! Loading the probes: what the running kernel offers (its facts), which families to load with
//! which options, and the object's globals set before load. Imports the attach, maps, sizing
//! and tiers jobs of `probes`; nothing of the agent above it.

use super::*;

/// The compiled probes, built by `build.rs` from `ebpf-probes/kernel`.
pub(super) static PROBES_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/stormwatch"));

#[derive(Debug, Error)]
pub enum LoadError {
    #[error("cannot load the eBPF object")]
    Object(#[source] Box<aya::EbpfError>),
    #[error("no probe could be attached")]
    NothingAttached,
    #[error("{0}")]
    Btf(String),
    #[error("cannot prepare the eBPF object: {0}")]
    Kfuncs(String),
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
    /// kernel (`check_attached_to`), and the first that the kernel resolved to another
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

/// `NET_NS_INIT_INO` of `enum init_ns_ino` (uapi `linux/nsfs.h`): the host's network namespace
/// inode on kernels that fix it. Inode numbers are 32-bit, as the probes key them.
pub(super) fn init_netns_inode(btf: &Btf) -> Option<u64> {
    btf.enum_values("init_ns_ino")?
        .into_iter()
        .find(|(name, _)| name == "NET_NS_INIT_INO")
        .map(|(_, v)| u64::from(v as u32))
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
    /// Empty tp_btf programs on the scheduler probes' tracepoints: the benchmark's floor.
    #[value(hide = true)]
    EmptySched,
    /// Empty tp_btf programs on the network probes' per-packet tracepoints.
    #[value(hide = true)]
    EmptyNet,
    /// Empty tp_btf programs on the lock probes' tracepoints.
    #[value(hide = true)]
    EmptyLocks,
    /// Empty classic tracepoint programs on `sys_enter_futex` and `sys_exit_futex`.
    #[value(hide = true)]
    EmptyFutex,
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
    /// Sample hand-offs with their user stacks while the futex probes are attached (the
    /// futex family's `HAVE_HANDOFF_SAMPLES`).
    pub call_sites: bool,
    /// Name each call site's `file:line` too, from the binary's DWARF (the one-off commands;
    /// not the daemon, whose memory must not follow the size of a binary's debug information).
    pub call_site_lines: bool,
    /// Uprobes on PostgreSQL's lock-wait sites, with the futex family.
    pub postgres_lock_waits: bool,
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
    /// When the switch program blames run-queue waits (`None`: never).
    pub runq_blame: Option<super::RunqBlameTier>,
    /// A BTF file to use instead of the kernel's own (`/sys/kernel/btf/vmlinux`): where the
    /// agent cannot read that one (a container without /sys/kernel/btf, a kernel that does not
    /// publish it). It must be the running kernel's BTF (`check_attached_to`).
    pub btf_file: Option<PathBuf>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            force_tracepoints: false,
            call_sites: true,
            call_site_lines: true,
            postgres_lock_waits: true,
            waits_from_wakeups: false,
            families: Family::DEFAULT.to_vec(),
            max_cgroups: CGROUP_MAP_MIN_ENTRIES as usize,
            wake_kinds: WakeKinds::Always,
            futex: FutexTier::Always,
            net_packets: NetPacketTier::Always,
            runq_blame: Some(super::RunqBlameTier::Always),
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
        // With classic tracepoints forced, no tp_btf attach would show a given file to be
        // another kernel's, and its offsets would still be used: it is tried once on the
        // benchmark's empty sched_switch program (below), and refused if the kernel disagrees.
        let mut try_external = None;
        if options.force_tracepoints {
            try_external = facts.aya_btf.take().filter(|_| facts.btf_external);
            facts.btf_error = Some("tp_btf disabled by --force-tracepoints".to_owned());
        }
        if options.waits_from_wakeups {
            facts.sched_info = false;
        }
        let mut families = Families {
            sched: sched::SchedProbes::new(options.wake_kinds, options.runq_blame),
            futex: futex::FutexProbes::new(
                options.futex == FutexTier::OnDemand,
                options.call_sites,
            ),
            locks: locks::LockProbes::default(),
            net: net::NetProbes::new(options.net_packets == NetPacketTier::OnDemand),
            go_mutex: super::gomutex::GoMutexProbes::default(),
            pg_lock: super::pglock::PgLockProbes::default(),
        };
        let mut empties: Vec<EmptyProbes> = options
            .families
            .iter()
            .filter_map(|f| EmptyProbes::of(*f))
            .collect();
        let mut chosen = families.chosen(&options.families, &mut empties);

        // Globals must all be set before the single load of the object. Names come from the
        // shared crate; a missing one is set to 0 and the family that needs it degrades.
        let mut values: Vec<(&'static str, u32)> = shared_globals(&facts);
        for family in chosen.iter_mut() {
            values.extend(family.globals(&facts));
        }
        let cast = facts
            .btf
            .as_ref()
            .and_then(|btf| kfuncs::RdonlyCast::find(btf, !facts.btf_external));
        values.extend(kfuncs::RdonlyCast::globals(cast.as_ref()));
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
        let object = kfuncs::rewrite(PROBES_OBJECT, cast.as_ref()).map_err(LoadError::Kfuncs)?;
        let mut ebpf = loader
            .load(object.bytes())
            .map_err(|e| LoadError::Object(Box::new(e)))?;
        drop(object);
        if let Some(btf) = try_external {
            confirm_btf_file(&mut ebpf, &btf, &facts.btf_path).map_err(LoadError::Btf)?;
        }

        let mut status = Vec::new();
        for family in chosen.iter_mut() {
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
        let loaded = Loaded {
            status: &status,
            waits_from_switch,
        };
        for family in chosen.iter_mut() {
            family.settle(&mut ebpf, &loaded);
        }
        drop(chosen);
        // Go's mutex uprobes go with the futex family's hand-off sampler.
        if families.futex.samples_handoffs() {
            families.go_mutex = super::gomutex::GoMutexProbes::load(&mut ebpf);
        }
        // The Go on-CPU sampler with the futex family (the lock families' judge reads it), all
        // the time: ~100 samples a second per CPU, counted only for the Go processes watched.
        if options.families.contains(&Family::Futex) {
            families.go_mutex.cpu = super::gocpu::GoCpuSampler::attach(&mut ebpf);
            // PostgreSQL's lock waits, which the futex probes cannot see (its backends wait on
            // a latch): attached to the binaries the pipeline finds.
            if options.postgres_lock_waits {
                families.pg_lock = super::pglock::PgLockProbes::load(&mut ebpf);
            }
        }
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
        let tiers = Tier::ALL.map(|tier| loaded_for_later(tier.programs()));
        let init_netns = facts.init_netns;
        let check_attach = facts.btf_external;
        drop(facts);
        // Parsing the kernel's BTF (several MB, for the loader and tp_btf) is the agent's
        // largest allocation and it is over now: give the memory back to the system instead of
        // keeping it in the allocator for the agent's lifetime.
        crate::memory::release_free_memory();
        let mut probes = Self {
            ebpf,
            status,
            waits_from_switch,
            tiers,
            families,
            init_netns,
            check_attach,
        };
        if probes.can_blame_runqueue()
            && options.runq_blame == Some(super::RunqBlameTier::Always)
            && let Err(err) = probes.set(Tier::RunqBlame, true)
        {
            log::warn!("cannot turn the run-queue blame on: {err:#}; waits are not blamed");
            probes.families.sched.blame.available = false;
        }
        Ok(probes)
    }
}

/// The benchmark's floor: empty programs, each on the tracepoint of one of ours
/// (`(tracepoint, program)`), tp_btf except on the system calls' tracepoints (which have no
/// tp_btf form: the futex probes there are classic tracepoints too).
pub(super) struct EmptyProbes(&'static [(&'static str, &'static str)]);

impl EmptyProbes {
    /// The empty programs of a benchmark family; `None` for a real family.
    fn of(family: Family) -> Option<Self> {
        match family {
            Family::EmptySched => Some(Self(EMPTY_SCHED)),
            Family::EmptyNet => Some(Self(EMPTY_NET)),
            Family::EmptyLocks => Some(Self(EMPTY_LOCKS)),
            Family::EmptyFutex => Some(Self(EMPTY_FUTEX)),
            Family::Sched | Family::Futex | Family::Locks | Family::Net => None,
        }
    }
}

/// The scheduler probes' four tracepoints.
const EMPTY_SCHED: &[(&str, &str)] = {
    use stormwatch_common::programs::{
        BENCH_EMPTY_SWITCH, BENCH_EMPTY_WAKEUP, BENCH_EMPTY_WAKEUP_NEW, BENCH_EMPTY_WAKING,
    };
    &[
        (sched::SWITCH, BENCH_EMPTY_SWITCH),
        (sched::WAKEUP, BENCH_EMPTY_WAKEUP),
        (sched::WAKEUP_NEW, BENCH_EMPTY_WAKEUP_NEW),
        (sched::WAKING, BENCH_EMPTY_WAKING),
    ]
};

/// The network probes' per-packet tracepoints and the drops'.
const EMPTY_NET: &[(&str, &str)] = {
    use stormwatch_common::programs::{
        BENCH_EMPTY_KFREE_SKB, BENCH_EMPTY_RECEIVE, BENCH_EMPTY_XMIT,
    };
    &[
        (net::XMIT, BENCH_EMPTY_XMIT),
        (net::RECEIVE, BENCH_EMPTY_RECEIVE),
        (net::KFREE_SKB, BENCH_EMPTY_KFREE_SKB),
    ]
};

/// The lock probes' two tracepoints.
const EMPTY_LOCKS: &[(&str, &str)] = {
    use stormwatch_common::programs::{BENCH_EMPTY_LOCK_BEGIN, BENCH_EMPTY_LOCK_END};
    &[
        (locks::BEGIN, BENCH_EMPTY_LOCK_BEGIN),
        (locks::END, BENCH_EMPTY_LOCK_END),
    ]
};

/// The futex probes' commonest pair (`futex(2)`'s entry and exit); the futex2 calls' are the
/// same kind of hook.
const EMPTY_FUTEX: &[(&str, &str)] = {
    use stormwatch_common::programs::{BENCH_EMPTY_FUTEX_ENTER, BENCH_EMPTY_FUTEX_EXIT};
    &[
        (futex::PROGRAMS[0].0, BENCH_EMPTY_FUTEX_ENTER),
        (futex::PROGRAMS[1].0, BENCH_EMPTY_FUTEX_EXIT),
    ]
};

impl ProbeFamily for EmptyProbes {
    fn name(&self) -> &'static str {
        "empty (benchmark floor)"
    }

    fn globals(&mut self, _facts: &KernelFacts) -> Vec<(&'static str, u32)> {
        Vec::new()
    }

    fn attach(&mut self, ebpf: &mut Ebpf, facts: &KernelFacts) -> Vec<ProbeStatus> {
        self.0
            .iter()
            .map(|&(tracepoint, program)| {
                let (category, event) = tracepoint.split_once(':').expect("category:event");
                let (result, kind) = if category == "syscalls" {
                    let r = attach_classic(ebpf, program, category, event);
                    (r, AttachKind::Tracepoint)
                } else {
                    (attach_btf(ebpf, program, event, facts), AttachKind::TpBtf)
                };
                ProbeStatus {
                    tracepoint,
                    kind: result.is_ok().then_some(kind),
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
pub(super) fn raise_memlock_rlimit() {
    use rustix::process::{Resource, Rlimit, setrlimit};
    let unlimited = Rlimit {
        current: None,
        maximum: None,
    };
    if let Err(err) = setrlimit(Resource::Memlock, unlimited) {
        log::debug!("could not raise RLIMIT_MEMLOCK ({err}); fine on kernels >= 5.11");
    }
}

pub(super) fn shared_globals(facts: &KernelFacts) -> Vec<(&'static str, u32)> {
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

/// Attaches the benchmark's empty `sched_switch` program as tp_btf against a BTF file the user
/// gave, checks where the kernel attached it ([`check_attached_to`]), and detaches it: whether
/// the file is the running kernel's, when no other tp_btf program is to be attached with it.
fn confirm_btf_file(ebpf: &mut Ebpf, btf: &aya::Btf, path: &Path) -> Result<(), String> {
    let refused = |err: anyhow::Error| {
        format!(
            "{} is not the running kernel's BTF: {}",
            path.display(),
            one_line(&err)
        )
    };
    let prog = load_btf(
        ebpf,
        stormwatch_common::programs::BENCH_EMPTY_SWITCH,
        "sched_switch",
        btf,
    )
    .map_err(refused)?;
    let link = prog.attach().map_err(|e| refused(e.into()))?;
    let checked = check_attached_to(prog, "sched_switch");
    let _ = prog.detach(link);
    checked.map_err(refused)
}
