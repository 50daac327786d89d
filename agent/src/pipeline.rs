//! The pipeline shared by every front end: probes → snapshot → window → identity.
//! `trace`, `diagnose` and the daemon each drive one of these, and feed its windows to one
//! [`crate::diagnose::session::Session`], which owns the resource context and the rules.

use std::{
    collections::{HashMap, HashSet},
    time::Instant,
};

use anyhow::Context as _;
use stormwatch_common::net::{NetIfInfo, NetIfKey};

use crate::{
    collect::{Availability, Snapshot, Window},
    identity::{CgroupResolver, netns::NetnsOwners, workload::Identities},
    memory::CacheSize,
    netinfo::inventory::SeenInterface,
    probes::{LoadOptions, Probes, demand::GoBursts, locks},
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

pub struct Pipeline {
    pub probes: Probes,
    pub resolver: CgroupResolver,
    previous: Snapshot,
    /// Paths of every cgroup seen, kept after a cgroup is removed so that a window that
    /// includes it can still name it. Pruned through [`Pipeline::forget_names`].
    paths: HashMap<u64, String>,
    /// Process names (`/proc/<tgid>/comm`) of processes with hot futexes, kept likewise.
    process_names: HashMap<u32, String>,
    /// Contended call sites by stack id (stack ids are stable while the probes are loaded).
    call_sites: HashMap<u32, CallSite>,
    symbolizer: KernelSymbolizer,
    /// Pairs and names the futex probes' sampled hand-offs.
    handoffs: HandoffNamer,
    /// Whether Go's mutex uprobes were wanted at the last tick.
    go_mutexes_watched: bool,
    /// When they run a burst: the on-demand policy's.
    go_bursts: GoBursts,
    identities: Identities,
    /// The interfaces the network probes saw: what the kernel said each is when they first saw
    /// it.
    interfaces: HashMap<NetIfKey, NetIfInfo>,
    /// The host's network namespace inode, when known
    /// ([`crate::netinfo::namespaces::host_inode`]).
    pub host_netns: Option<u64>,
    netns_owners: NetnsOwners,
}

impl Pipeline {
    pub fn start(options: &LoadOptions, mut resolver: CgroupResolver) -> anyhow::Result<Self> {
        // Every cgroup that exists now, before the probes attach: the diagnosis session reads
        // their cumulative counters as its baseline.
        resolver.walk();
        let mut probes = Probes::load(options).context("loading the eBPF probes")?;
        let previous = Snapshot::read(&mut probes).context("reading the probes' maps")?;
        let host_netns = crate::netinfo::namespaces::host_inode(probes.init_netns);
        let mut pipeline = Self {
            probes,
            resolver,
            previous,
            paths: HashMap::new(),
            process_names: HashMap::new(),
            call_sites: HashMap::new(),
            symbolizer: KernelSymbolizer::new(),
            handoffs: HandoffNamer::new(options.call_site_lines),
            go_mutexes_watched: false,
            go_bursts: GoBursts::default(),
            identities: Identities::default(),
            interfaces: HashMap::new(),
            host_netns,
            netns_owners: NetnsOwners::default(),
        };
        // Nothing has been seen sending yet: the processes in each namespace say whose it is.
        pipeline.track_netns_owners([]);
        Ok(pipeline)
    }

    pub fn availability(&self) -> Availability {
        Availability {
            runq_blame: self.probes.can_blame_runqueue(),
            ..Availability::from_status(&self.probes.status, self.probes.waits_from_switch)
        }
    }

    pub fn started_at(&self) -> Instant {
        self.previous.taken_at
    }

    /// Each cgroup's Kubernetes identity, as resolved so far.
    pub fn identities(&self) -> &HashMap<u64, crate::identity::workload::Identity> {
        self.identities.all()
    }

    /// Process names by tgid, as seen while the processes lived.
    pub fn process_names(&self) -> &HashMap<u32, String> {
        &self.process_names
    }

    /// Kernel call sites by stack id, symbolized.
    pub fn call_sites(&self) -> &HashMap<u32, CallSite> {
        &self.call_sites
    }

    /// Paths of the cgroups seen so far (including removed ones not yet forgotten).
    pub fn paths(&self) -> &HashMap<u64, String> {
        &self.paths
    }

    /// Reads the maps and returns the window since the previous tick. Cgroups that were removed
    /// and processes that exited are forgotten by the probes (their last counts are in this
    /// window).
    pub fn tick(&mut self) -> anyhow::Result<Window> {
        let mut snapshot = Snapshot::read(&mut self.probes).context("reading the probes' maps")?;
        let mut window = Window::between(&self.previous, &snapshot);
        self.burst_go_mutexes(&mut snapshot, &mut window);
        self.name_handoffs(&mut window);
        let ids: HashSet<u64> = snapshot.cgroup_ids().copied().collect();
        let active = |id: u64| window.cgroups.get(&id).is_some_and(|w| w.threads_moved());
        let gone: Vec<u64> = self.resolver.refresh(&ids, active).into_iter().collect();
        for id in &ids {
            if let Some(path) = self.resolver.path(*id) {
                self.paths.entry(*id).or_insert_with(|| path.to_owned());
                self.identities.resolve(*id, path);
            }
        }
        self.name_processes(&window);
        self.resolve_call_sites(&window);
        self.previous = snapshot;
        self.previous.forget(&mut self.probes, &gone, |tid| {
            window.handoff_threads.contains_key(&tid)
        });
        self.note_interfaces(&window, !gone.is_empty());
        self.track_netns_owners(window.net_ifaces.keys().map(|k| u64::from(k.netns)));
        Ok(window)
    }

    /// Tells the receive probe which container each network namespace belongs to; `active`:
    /// the namespaces that carried traffic since the last call.
    fn track_netns_owners(&mut self, active: impl IntoIterator<Item = u64>) {
        let senders = self.probes.netns_senders();
        let resolver = &self.resolver;
        let owners =
            self.netns_owners
                .decide(resolver.root(), self.host_netns, active, &senders, |id| {
                    resolver.path(id).map(str::to_owned)
                });
        self.probes.set_netns_owners(&owners);
    }

    /// The interfaces the probes saw, by (namespace inode, ifindex): the kernel's record of
    /// each, with its MTU at its last packet (from the latest snapshot).
    pub fn seen_interfaces(&self) -> HashMap<NetIfKey, SeenInterface> {
        let mtus = &self.previous.net.ifaces;
        self.interfaces
            .iter()
            .map(|(k, info)| {
                let mtu = mtus.get(k).map_or(0, |s| s.mtu);
                (*k, SeenInterface::from_kernel(info, mtu))
            })
            .collect()
    }

    /// Keeps the kernel's interface records current: they are read only when a new interface
    /// carried traffic, or after cgroups were removed (their namespaces' entries go with them).
    fn note_interfaces(&mut self, window: &Window, forgot: bool) {
        let new = forgot
            || window
                .net_ifaces
                .keys()
                .any(|k| !self.interfaces.contains_key(k));
        if new {
            self.interfaces = crate::probes::net::read_iface_info(self.probes.ebpf());
        }
    }

    fn name_processes(&mut self, window: &Window) {
        if self.process_names.len() > MAX_PROCESS_NAMES {
            self.process_names.clear();
        }
        for key in window.hot_futexes.keys() {
            if let std::collections::hash_map::Entry::Vacant(e) = self.process_names.entry(key.tgid)
                && let Some(comm) = crate::files::kernel_text(format!("/proc/{}/comm", key.tgid))
            {
                e.insert(comm.trim_end().to_owned());
            }
        }
    }

    /// Names the call sites of the hand-offs sampled since the last tick, into `window`.
    fn name_handoffs(&mut self, window: &mut Window) {
        if !self.probes.samples_handoffs() {
            return;
        }
        let sides: Vec<HandoffSide> = self
            .probes
            .drain_handoff_samples()
            .iter()
            .map(HandoffSide::from)
            .collect();
        if !sides.is_empty() {
            for (id, sites) in self.handoffs.name(sides) {
                window.handoff_sites.entry(id).or_default().add(&sites);
            }
        }
        // At every collection, samples or not: what was read for a process goes when it exits.
        self.handoffs
            .retain_processes(|tgid| std::path::Path::new(&format!("/proc/{tgid}")).exists());
    }

    /// Looks for Go binaries among the processes new to the futex probes (every process's when
    /// the futex probes have just been attached), and runs a burst of Go's mutex uprobes when
    /// one is due: its counts, read into `snapshot`, are `window`'s (with the time the uprobes
    /// were attached). Before the hand-off samples are drained: the burst's are named in this
    /// window.
    fn burst_go_mutexes(&mut self, snapshot: &mut Snapshot, window: &mut Window) {
        let tgids: Vec<u32> = window
            .hot_futexes
            .keys()
            .map(|k| k.tgid)
            .chain(window.handoff_threads.values().map(|t| t.tgid))
            .collect::<HashSet<u32>>()
            .into_iter()
            .collect();
        let watch = self
            .probes
            .find_go_mutexes(self.go_mutexes_watched.then_some(&tgids[..]));
        self.go_mutexes_watched = watch.watching;
        if !self.go_bursts.due(watch, Instant::now()) {
            return;
        }
        let Some(span) = self.probes.burst_go_mutexes() else {
            return;
        };
        snapshot.go_mutex = self.probes.go_mutex_part();
        window.retake_go_mutex(&self.previous, snapshot);
        for (id, w) in &window.cgroups {
            let g = w.go_mutex;
            if g != crate::collect::GoMutexFigures::ZERO {
                log::debug!(
                    "Go mutex burst of {span:?}: cgroup {id}: {} lockSlow, {} unlockSlow",
                    g.contended_locks,
                    g.handing_unlocks
                );
            }
        }
    }

    /// Whether the futex probes sample hand-offs, so that their call sites can be named.
    pub fn names_handoff_sites(&self) -> bool {
        self.probes.samples_handoffs()
    }

    fn resolve_call_sites(&mut self, window: &Window) {
        let ids: HashSet<u32> = window
            .lock_sites
            .keys()
            .map(|k| k.stack_id)
            .filter(|id| !self.call_sites.contains_key(id))
            .collect();
        for id in ids {
            let Some(frames) = locks::stack(self.probes.ebpf(), id) else {
                continue;
            };
            let symbols = self.symbolizer.symbolize(&frames);
            if let Some(site) = crate::symbolize::call_site(&symbols) {
                self.call_sites.insert(id, site);
            }
        }
        self.symbolizer.release();
    }

    /// The sizes of the pipeline's caches: the symbolizers', the Go mutex finder's, and the
    /// names it keeps for windows.
    pub fn cache_sizes(&self) -> Vec<CacheSize> {
        let mut sizes = self.handoffs.cache_sizes();
        sizes.extend(self.probes.go_mutex_cache_sizes());
        sizes.push(self.symbolizer.cache_size());
        sizes.extend(self.resolver.cache_sizes());
        sizes.extend([
            CacheSize::entries(
                "kernel_call_sites",
                self.call_sites.len(),
                MAX_KERNEL_STACKS,
            ),
            CacheSize::entries("process_names", self.process_names.len(), MAX_PROCESS_NAMES),
            CacheSize::live("cgroup_paths", self.paths.len()),
        ]);
        sizes
    }

    /// Drops remembered names that no window in use still needs.
    pub fn forget_names(
        &mut self,
        keep_cgroup: impl Fn(u64) -> bool,
        keep_tgid: impl Fn(u32) -> bool,
    ) {
        let resolver = &self.resolver;
        self.paths
            .retain(|id, _| keep_cgroup(*id) || resolver.path(*id).is_some());
        let paths = &self.paths;
        self.identities.retain(|id| paths.contains_key(&id));
        self.process_names.retain(|tgid, _| keep_tgid(*tgid));
    }
}
