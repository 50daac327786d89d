//! Each family's user-space half of a tick: what it reads besides the snapshot (the samples'
//! ring, the Go uprobes' bursts, the kernel's stacks and interface records) and the names it
//! keeps for the windows. The pipeline steps every stage the same way ([`Stage`]): it observes
//! a window once taken, keeps in step after the snapshot forgot what is gone, tells the sizes of
//! its caches, and drops the names no window needs.

use std::{
    collections::{HashMap, HashSet},
    time::Instant,
};

use stormwatch_common::{
    LOCK_SITE_UNWALKED,
    net::{NetIfInfo, NetIfKey},
};

use crate::{
    collect::{GoMutexFigures, Snapshot, Window},
    identity::{CgroupResolver, netns::NetnsOwners},
    memory::CacheSize,
    netinfo::inventory::SeenInterface,
    probes::{Probes, demand::GoBursts, locks, net::NetPart},
    symbolize::{
        CallSite, KernelSymbolizer,
        handoffs::{HandoffNamer, HandoffSide},
    },
};

/// Kernel stacks the lock probe keeps (`MAX_STACKS` of `ebpf-probes/kernel/src/locks.rs`): the
/// call sites named by stack id are at most these.
const MAX_KERNEL_STACKS: usize = 4096;
/// The most process names kept for the windows (past it, they start over).
const MAX_PROCESS_NAMES: usize = 65_536;

/// What a stage sees of one tick.
pub(super) struct Tick<'a> {
    pub probes: &'a mut Probes,
    /// The snapshot the window starts at.
    pub previous: &'a Snapshot,
    /// The snapshot the window ends at (the next tick's `previous`).
    pub snapshot: &'a mut Snapshot,
    pub window: &'a mut Window,
}

/// What a stage sees once the latest snapshot forgot what is gone.
pub(super) struct AfterForget<'a> {
    pub probes: &'a mut Probes,
    pub window: &'a Window,
    pub resolver: &'a CgroupResolver,
    /// Cgroups removed at this tick, now forgotten.
    pub gone: &'a [u64],
}

/// A family's user-space half of a tick.
pub(super) trait Stage {
    /// Once the window is taken: reads what the family keeps besides the snapshot, and names
    /// what the window holds of it.
    fn observe(&mut self, tick: &mut Tick);
    /// Once the latest snapshot forgot what is gone: keeps in step with it.
    fn after_forget(&mut self, _after: &mut AfterForget) {}
    /// The sizes of its caches.
    fn cache_sizes(&self) -> Vec<CacheSize>;
    /// Drops the names no window in use still needs (`keep_tgid`: a process some window
    /// names).
    fn forget_names(&mut self, _keep_tgid: &dyn Fn(u32) -> bool) {}
}

/// The stages, in the order a tick observes them: the Go uprobes' burst before the futex
/// samples are drained (the burst's samples are named in its window).
pub(super) struct Stages {
    pub go_mutex: GoMutexStage,
    pub pg_lock: PgLockStage,
    pub futex: FutexStage,
    pub locks: LockStage,
    pub net: NetStage,
}

impl Stages {
    pub fn new(call_site_lines: bool, host_netns: Option<u64>) -> Self {
        Self {
            go_mutex: GoMutexStage::default(),
            pg_lock: PgLockStage,
            futex: FutexStage {
                handoffs: HandoffNamer::new(call_site_lines),
                process_names: HashMap::new(),
            },
            locks: LockStage {
                call_sites: HashMap::new(),
                symbolizer: KernelSymbolizer::new(),
            },
            net: NetStage {
                interfaces: HashMap::new(),
                owners: NetnsOwners::new(host_netns),
            },
        }
    }

    /// Every stage, in its order.
    pub fn all(&mut self) -> [&mut dyn Stage; 5] {
        let Stages {
            go_mutex,
            pg_lock,
            futex,
            locks,
            net,
        } = self;
        [go_mutex, pg_lock, futex, locks, net]
    }

    /// Every stage, to read.
    pub fn each(&self) -> [&dyn Stage; 5] {
        let Stages {
            go_mutex,
            pg_lock,
            futex,
            locks,
            net,
        } = self;
        [go_mutex, pg_lock, futex, locks, net]
    }
}

/// Go's `sync.Mutex`: names the on-CPU sampler's new samples (in the mutex's code or not) and
/// adds them to their cgroups' figures, every tick; finds Go binaries among the processes new
/// to the futex probes, and runs a uprobe burst when the on-demand policy says one is due.
#[derive(Default)]
pub(super) struct GoMutexStage {
    /// Whether the uprobes were wanted at the last tick.
    watched: bool,
    /// When they run a burst: the on-demand policy's.
    bursts: GoBursts,
    /// The sampled processes' mutex code.
    code: crate::symbolize::gocode::GoCodeNamer,
}

impl GoMutexStage {
    /// The sampler's samples since the last tick, named and added: the snapshot's Go part and
    /// the window's figures taken anew.
    fn add_cpu_samples(&mut self, tick: &mut Tick) {
        let (ebpf, families) = tick.probes.families_mut();
        let sampler = &mut families.go_mutex.cpu;
        if !sampler.attached() {
            return;
        }
        let new = match sampler.read_new(ebpf) {
            Ok(new) => new,
            Err(e) => {
                log::warn!("cannot read the Go on-CPU samples: {e:#}");
                return;
            }
        };
        self.code.retain(|t| sampler.watches(t));
        if new.is_empty() {
            return;
        }
        for (key, n) in new {
            let frames = (key.frames as usize).min(key.ips.len());
            let mutex = self.code.is_mutex(key.tgid, &key.ips[..frames]);
            sampler.add(key.cgroup_id, n, if mutex { n } else { 0 });
        }
        tick.snapshot.go_mutex = families.go_mutex.part();
        tick.window.retake_go_mutex(tick.previous, tick.snapshot);
    }
}

impl Stage for GoMutexStage {
    /// Looks for Go binaries among the processes new to the futex probes (every process's when
    /// the futex probes have just been attached), and runs a burst when one is due: its
    /// counts, the snapshot's Go part, are the window's (with the time the uprobes were
    /// attached).
    fn observe(&mut self, tick: &mut Tick) {
        self.add_cpu_samples(tick);
        let window = &mut *tick.window;
        let tgids: Vec<u32> = window
            .hot_futexes
            .keys()
            .map(|k| k.tgid)
            .chain(window.handoff_threads.values().map(|t| t.tgid))
            .collect::<HashSet<u32>>()
            .into_iter()
            .collect();
        let watch = tick
            .probes
            .find_go_mutexes(self.watched.then_some(&tgids[..]));
        self.watched = watch.watching;
        if !self.bursts.due(watch, Instant::now()) {
            return;
        }
        let (ebpf, families) = tick.probes.families_mut();
        let Some(span) = families.go_mutex.burst(ebpf) else {
            return;
        };
        tick.snapshot.go_mutex = families.go_mutex.part();
        window.retake_go_mutex(tick.previous, tick.snapshot);
        for (id, w) in &window.cgroups {
            let g = w.go_mutex;
            if g != GoMutexFigures::ZERO {
                log::debug!(
                    "Go mutex burst of {span:?}: cgroup {id}: {} lockSlow, {} unlockSlow",
                    g.contended_locks,
                    g.handing_unlocks
                );
            }
        }
    }

    fn cache_sizes(&self) -> Vec<CacheSize> {
        self.code.cache_sizes().to_vec()
    }
}

/// PostgreSQL's lock waits: every tick, the processes new on the node are looked at, and the
/// uprobes attached to the PostgreSQL binaries among theirs (detached from those no process
/// runs any longer). The waits are in the snapshot; nothing is named.
pub(super) struct PgLockStage;

impl Stage for PgLockStage {
    fn observe(&mut self, tick: &mut Tick) {
        let (ebpf, families) = tick.probes.families_mut();
        families.pg_lock.find(ebpf);
    }

    fn cache_sizes(&self) -> Vec<CacheSize> {
        Vec::new()
    }
}

/// The futex family's names: the call sites of sampled hand-offs, and the processes with hot
/// futexes.
pub(super) struct FutexStage {
    /// Pairs and names the futex probes' sampled hand-offs.
    handoffs: HandoffNamer,
    /// Process names (`/proc/<tgid>/comm`) of processes with hot futexes, kept after they exit
    /// so that a window that includes them can still name them.
    pub process_names: HashMap<u32, String>,
}

impl Stage for FutexStage {
    fn observe(&mut self, tick: &mut Tick) {
        self.name_handoffs(tick.probes, tick.window);
        if self.process_names.len() > MAX_PROCESS_NAMES {
            self.process_names.clear();
        }
        for key in tick.window.hot_futexes.keys() {
            if let std::collections::hash_map::Entry::Vacant(e) = self.process_names.entry(key.tgid)
                && let Some(comm) = crate::files::kernel_text(format!("/proc/{}/comm", key.tgid))
            {
                e.insert(comm.trim_end().to_owned());
            }
        }
    }

    fn cache_sizes(&self) -> Vec<CacheSize> {
        let mut sizes = self.handoffs.cache_sizes();
        sizes.push(CacheSize::entries(
            "process_names",
            self.process_names.len(),
            MAX_PROCESS_NAMES,
        ));
        sizes
    }

    fn forget_names(&mut self, keep_tgid: &dyn Fn(u32) -> bool) {
        self.process_names.retain(|tgid, _| keep_tgid(*tgid));
    }
}

impl FutexStage {
    /// Names the call sites of the hand-offs sampled since the last tick, into `window`.
    fn name_handoffs(&mut self, probes: &mut Probes, window: &mut Window) {
        let futex = &mut probes.families_mut().1.futex;
        if !futex.samples_handoffs() {
            return;
        }
        let sides: Vec<HandoffSide> = futex
            .drain_samples()
            .iter()
            .map(HandoffSide::from)
            .collect();
        if !sides.is_empty() {
            for (id, sites) in self.handoffs.name(sides) {
                window.handoff_sites.entry(id).or_default().add(&sites);
            }
        }
        // At every collection, samples or not: what was read for a process goes when it exits.
        self.handoffs.retain_processes(crate::files::process_alive);
    }
}

/// The kernel locks' names: contended call sites by stack id (stable while the probes are
/// loaded).
pub(super) struct LockStage {
    pub call_sites: HashMap<u32, CallSite>,
    symbolizer: KernelSymbolizer,
}

impl Stage for LockStage {
    fn observe(&mut self, tick: &mut Tick) {
        let ids: HashSet<u32> = tick
            .window
            .lock_sites
            .keys()
            .map(|k| k.stack_id)
            .filter(|id| *id != LOCK_SITE_UNWALKED && !self.call_sites.contains_key(id))
            .collect();
        for id in ids {
            let Some(frames) = locks::stack(tick.probes.ebpf(), id) else {
                continue;
            };
            let symbols = self.symbolizer.symbolize(&frames);
            if let Some(site) = crate::symbolize::call_site(&symbols) {
                self.call_sites.insert(id, site);
            }
        }
        self.symbolizer.release();
    }

    fn cache_sizes(&self) -> Vec<CacheSize> {
        vec![
            self.symbolizer.cache_size(),
            CacheSize::entries(
                "kernel_call_sites",
                self.call_sites.len(),
                MAX_KERNEL_STACKS,
            ),
        ]
    }
}

/// The network's names: the interfaces the probes saw (what the kernel said each is when
/// they first saw it), and whose each network namespace is (told to the receive probe).
pub(super) struct NetStage {
    interfaces: HashMap<NetIfKey, NetIfInfo>,
    owners: NetnsOwners,
}

impl Stage for NetStage {
    fn observe(&mut self, _tick: &mut Tick) {}

    /// Keeps the kernel's interface records current — read only when a new interface carried
    /// traffic, or after cgroups were removed (their namespaces' entries go with them) — and
    /// tells the receive probe whose each namespace is.
    fn after_forget(&mut self, tick: &mut AfterForget) {
        let new = !tick.gone.is_empty()
            || tick
                .window
                .net_ifaces
                .keys()
                .any(|k| !self.interfaces.contains_key(k));
        if new {
            self.interfaces = crate::probes::net::read_iface_info(tick.probes.ebpf());
        }
        let active: Vec<u64> = tick
            .window
            .net_ifaces
            .keys()
            .map(|k| u64::from(k.netns))
            .collect();
        self.track_owners(tick.probes, tick.resolver, active);
    }

    fn cache_sizes(&self) -> Vec<CacheSize> {
        Vec::new()
    }
}

impl NetStage {
    /// Tells the receive probe which container each network namespace belongs to; `active`:
    /// the namespaces that carried traffic since the last call.
    pub fn track_owners(
        &mut self,
        probes: &mut Probes,
        resolver: &CgroupResolver,
        active: impl IntoIterator<Item = u64>,
    ) {
        let senders = probes.netns_senders();
        let owners = self.owners.decide(resolver.root(), active, &senders, |id| {
            resolver.path(id).map(str::to_owned)
        });
        probes.set_netns_owners(&owners, self.owners.nobodys());
    }

    /// The interfaces the probes saw, by (namespace inode, ifindex): the kernel's record of
    /// each, with its MTU at its last packet (from `latest`, the latest snapshot's part).
    pub fn seen(&self, latest: &NetPart) -> HashMap<NetIfKey, SeenInterface> {
        self.interfaces
            .iter()
            .map(|(k, info)| {
                let mtu = latest.ifaces.get(k).map_or(0, |s| s.mtu);
                (*k, SeenInterface::from_kernel(info, mtu))
            })
            .collect()
    }
}
