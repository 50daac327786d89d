//! The pipeline shared by every front end: probes → snapshot → window → identity.
//! `trace`, `diagnose` and the daemon each drive one of these, and feed its windows to one
//! [`crate::diagnose::session::Session`], which owns the resource context and the rules.

use std::{collections::HashMap, time::Instant};

use anyhow::Context as _;
use stormwatch_common::net::NetIfKey;

use crate::{
    collect::{Availability, Snapshot, Window},
    identity::{CgroupResolver, workload::Identities},
    memory::CacheSize,
    netinfo::inventory::SeenInterface,
    probes::{LoadOptions, Probes},
    symbolize::CallSite,
};

mod stages;

use self::stages::{AfterForget, Stages, Tick};

pub struct Pipeline {
    pub probes: Probes,
    pub resolver: CgroupResolver,
    previous: Snapshot,
    /// Paths of every cgroup seen, kept after a cgroup is removed so that a window that
    /// includes it can still name it. Pruned through [`Pipeline::forget_names`].
    paths: HashMap<u64, String>,
    identities: Identities,
    /// Each family's user-space half of a tick ([`stages::Stage`]).
    stages: Stages,
    /// The host's network namespace inode, when known
    /// ([`crate::netinfo::namespaces::host_inode`]).
    pub host_netns: Option<u64>,
}

impl Pipeline {
    pub fn start(options: &LoadOptions, mut resolver: CgroupResolver) -> anyhow::Result<Self> {
        // Every cgroup that exists now, before the probes attach: the diagnosis session reads
        // their cumulative counters as its baseline.
        resolver.walk();
        let mut probes = Probes::load(options).context("loading the eBPF probes")?;
        // The PostgreSQL servers running now, attached to before the first snapshot: a window
        // counts their lock waits from its start (later ones from the tick that finds them).
        {
            let (ebpf, families) = probes.families_mut();
            families.pg_lock.find(ebpf);
        }
        let previous = Snapshot::read(&mut probes).context("reading the probes' maps")?;
        let host_netns = crate::netinfo::namespaces::host_inode(probes.init_netns);
        let mut stages = Stages::new(options.call_site_lines, host_netns);
        // Nothing has been seen sending yet: the processes in each namespace say whose it is.
        stages.net.track_owners(&mut probes, &resolver, []);
        Ok(Self {
            probes,
            resolver,
            previous,
            paths: HashMap::new(),
            identities: Identities::default(),
            stages,
            host_netns,
        })
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
        &self.stages.futex.process_names
    }

    /// Kernel call sites by stack id, symbolized.
    pub fn call_sites(&self) -> &HashMap<u32, CallSite> {
        &self.stages.locks.call_sites
    }

    /// Paths of the cgroups seen so far (including removed ones not yet forgotten).
    pub fn paths(&self) -> &HashMap<u64, String> {
        &self.paths
    }

    /// Reads the maps and returns the window since the previous tick, each family's stage
    /// observing it. Cgroups that were removed and processes that exited are forgotten by the
    /// probes (their last counts are in this window).
    pub fn tick(&mut self) -> anyhow::Result<Window> {
        let mut snapshot = Snapshot::read(&mut self.probes).context("reading the probes' maps")?;
        let mut window = Window::between(&self.previous, &snapshot);
        let ids: std::collections::HashSet<u64> = snapshot.cgroup_ids().copied().collect();
        let active = |id: u64| window.cgroups.get(&id).is_some_and(|w| w.threads_moved());
        let gone: Vec<u64> = self.resolver.refresh(&ids, active).into_iter().collect();
        for id in &ids {
            if let Some(path) = self.resolver.path(*id) {
                self.paths.entry(*id).or_insert_with(|| path.to_owned());
                self.identities.resolve(*id, path);
            }
        }
        let mut tick = Tick {
            probes: &mut self.probes,
            previous: &self.previous,
            snapshot: &mut snapshot,
            window: &mut window,
        };
        for stage in self.stages.all() {
            stage.observe(&mut tick);
        }
        self.previous = snapshot;
        self.previous.forget(&mut self.probes, &gone, |tid| {
            window.handoff_threads.contains_key(&tid)
        });
        let mut after = AfterForget {
            probes: &mut self.probes,
            window: &window,
            resolver: &self.resolver,
            gone: &gone,
        };
        for stage in self.stages.all() {
            stage.after_forget(&mut after);
        }
        Ok(window)
    }

    /// The interfaces the probes saw, by (namespace inode, ifindex): the kernel's record of
    /// each, with its MTU at its last packet (from the latest snapshot).
    pub fn seen_interfaces(&self) -> HashMap<NetIfKey, SeenInterface> {
        self.stages.net.seen(&self.previous.net)
    }

    /// Whether the futex probes sample hand-offs, so that their call sites can be named.
    pub fn names_handoff_sites(&self) -> bool {
        self.probes.samples_handoffs()
    }

    /// The sizes of the pipeline's caches: each stage's, the Go mutex finder's, the
    /// resolver's, and the names it keeps for windows.
    pub fn cache_sizes(&self) -> Vec<CacheSize> {
        let mut sizes: Vec<CacheSize> = self
            .stages
            .each()
            .iter()
            .flat_map(|s| s.cache_sizes())
            .collect();
        sizes.extend(self.probes.families().go_mutex.cache_sizes());
        sizes.extend(self.probes.families().go_mutex.cpu.cache_sizes());
        sizes.extend(self.probes.families().pg_lock.cache_sizes());
        sizes.extend(self.resolver.cache_sizes());
        sizes.push(CacheSize::live("cgroup_paths", self.paths.len()));
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
        for stage in self.stages.all() {
            stage.forget_names(&keep_tgid);
        }
    }
}
