//! What every probe family is: one object that keeps its own state, with the same verbs for
//! each — its globals before the load, its attach, what it keeps of the object once loaded
//! ([`ProbeFamily`]); its part of the snapshot read at each collection, and what it forgets
//! when cgroups, processes or threads are gone ([`ReadsPart`]). [`super::Probes`] loops over
//! them ([`Families`]); `collect`'s snapshot has one part per family.
//!
//! # What adding a family touches
//!
//! 1. Its kernel programs: `ebpf-probes/kernel/src/<family>.rs`.
//! 2. Its ABI types: `ebpf-probes/common/src/<family>.rs`, its maps' and programs' names in
//!    `names.rs`.
//! 3. Its probes module, `agent/src/probes/<family>.rs`: the family object ([`ProbeFamily`],
//!    [`ReadsPart`]) and its snapshot part; a field of [`Families`] (built in `Probes::load`)
//!    and, if it can be asked for by name, a variant of [`Family`]. The compiler then asks for
//!    it wherever the families are listed: `Families::chosen`, the snapshot's read and
//!    forget. A per-cgroup map is sized in `sizing.rs`.
//! 4. Its part in `collect`: a field of `Snapshot` and its deltas in `Window::between` (both
//!    destructure every part, so a part left out does not compile); its per-cgroup figures, a
//!    field of `CgroupWindow` (summed by the one `add`, which names every field).
//! 5. Its user-space stage, if it reads more than its maps or names what it sees:
//!    `agent/src/pipeline/stages.rs`.
//! 6. Its metric rows: `agent/src/export/families/`.
//! 7. Its rule, if it judges: `agent/src/diagnose/rules/`, listed in `diagnose::RULES`.
//! 8. Its test against an oracle: `tests/tests/`.

use aya::Ebpf;

use super::{Family, KernelFacts, ProbeStatus, futex, gomutex, locks, net, pglock, sched};

/// A probe family: a name, the globals it needs set before load, how it attaches, and what it
/// keeps of the loaded object.
pub trait ProbeFamily {
    fn name(&self) -> &'static str;
    /// Read-only globals to set before load (name, value). A family records here what it
    /// decided (sampling on, blame possible) for [`ProbeFamily::settle`]; errors name what is
    /// missing.
    fn globals(&mut self, facts: &KernelFacts) -> Vec<(&'static str, u32)>;
    /// Loads and attaches the family's programs, one status per tracepoint.
    fn attach(&mut self, ebpf: &mut Ebpf, facts: &KernelFacts) -> Vec<ProbeStatus>;
    /// Once every family attached: takes what the family keeps of the object (a ring buffer),
    /// given what attached.
    fn settle(&mut self, _ebpf: &mut Ebpf, _loaded: &Loaded) {}
}

/// What the load settled, for each family's [`ProbeFamily::settle`].
pub struct Loaded<'a> {
    pub status: &'a [ProbeStatus],
    /// `sched_switch` alone times the run-queue wait ([`sched::waits_from_switch`]).
    pub waits_from_switch: bool,
}

/// A family whose maps make one part of the snapshot: read whole at each collection, and
/// forgotten in part — in the kernel's maps and in the latest snapshot's part alike, so that
/// the next window counts a re-created entry from zero.
pub trait ReadsPart {
    /// Its cumulative figures at one instant.
    type Part;
    fn read(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<Self::Part>;
    /// Forgets what is `gone`, and what its bounded maps hold idle (counted as lost where the
    /// family counts it), in the maps and in `part`.
    fn forget(&mut self, ebpf: &mut Ebpf, gone: &Gone, part: &mut Self::Part);
}

/// What is gone at a collection, for [`ReadsPart::forget`].
pub struct Gone<'a> {
    /// Removed cgroups.
    pub cgroups: &'a [u64],
    /// Whether a thread's entry moved in the window that ended at the snapshot (it is alive,
    /// so it is not looked up).
    pub moved_thread: &'a dyn Fn(u32) -> bool,
}

impl Gone<'_> {
    pub fn cgroup(&self, id: u64) -> bool {
        self.cgroups.contains(&id)
    }
}

/// The families that keep state, each configured for its tier. Every one's maps are in the
/// object whether it attached or not (an unattached family's read nothing), so every one makes
/// a part of the snapshot; the load attaches those asked for (`Families::chosen`).
pub struct Families {
    pub sched: sched::SchedProbes,
    pub futex: futex::FutexProbes,
    pub locks: locks::LockProbes,
    pub net: net::NetProbes,
    /// Go's `sync.Mutex` uprobes: loaded with the futex family's hand-off sampler.
    pub go_mutex: gomutex::GoMutexProbes,
    /// PostgreSQL's lock-wait uprobes: loaded with the futex family.
    pub pg_lock: pglock::PgLockProbes,
}

impl Families {
    /// The families asked for, in the order asked, and the benchmark's empty ones among them
    /// (from `empties`, in the same order); each at most once.
    pub(super) fn chosen<'a>(
        &'a mut self,
        which: &[Family],
        empties: &'a mut [super::load::EmptyProbes],
    ) -> Vec<&'a mut dyn ProbeFamily> {
        let Families {
            sched,
            futex,
            locks,
            net,
            go_mutex: _,
            pg_lock: _,
        } = self;
        let mut sched = Some(sched as &mut dyn ProbeFamily);
        let mut futex = Some(futex as &mut dyn ProbeFamily);
        let mut locks = Some(locks as &mut dyn ProbeFamily);
        let mut net = Some(net as &mut dyn ProbeFamily);
        let mut empties = empties.iter_mut();
        which
            .iter()
            .filter_map(|f| match f {
                Family::Sched => sched.take(),
                Family::Futex => futex.take(),
                Family::Locks => locks.take(),
                Family::Net => net.take(),
                Family::EmptySched | Family::EmptyNet | Family::EmptyLocks | Family::EmptyFutex => {
                    empties.next().map(|e| e as &mut dyn ProbeFamily)
                }
            })
            .collect()
    }
}
