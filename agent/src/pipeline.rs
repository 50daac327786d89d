//! The pipeline shared by every front end: probes → snapshot → window → identity.
//! `trace` and (later) `diagnose` and the daemon each drive one of these.

use std::{collections::HashMap, time::Instant};

use anyhow::Context as _;

use crate::{
    collect::{Snapshot, Window},
    identity::CgroupResolver,
    probes::{LoadOptions, Probes, sched},
    report::SchedAvailability,
};

pub struct Pipeline {
    pub probes: Probes,
    pub resolver: CgroupResolver,
    previous: Snapshot,
    /// Paths of every cgroup seen, kept after a cgroup is removed so that a window that
    /// includes it can still name it. Pruned by the caller through [`Pipeline::forget_paths`].
    paths: HashMap<u64, String>,
}

impl Pipeline {
    pub fn start(options: &LoadOptions, resolver: CgroupResolver) -> anyhow::Result<Self> {
        let probes = Probes::load(options).context("loading the eBPF probes")?;
        let previous = Snapshot::read(&probes).context("reading the probes' maps")?;
        Ok(Self {
            probes,
            resolver,
            previous,
            paths: HashMap::new(),
        })
    }

    pub fn availability(&self) -> SchedAvailability {
        SchedAvailability::from_status(&self.probes.status)
    }

    pub fn started_at(&self) -> Instant {
        self.previous.taken_at
    }

    /// Reads the maps and returns the window since the previous tick. Cgroups that were removed
    /// are forgotten by the probes (their last counts are in this window).
    pub fn tick(&mut self) -> anyhow::Result<Window> {
        let snapshot = Snapshot::read(&self.probes).context("reading the probes' maps")?;
        let window = Window::between(&self.previous, &snapshot);
        let gone = self.resolver.refresh(snapshot.sched.keys());
        for id in snapshot.sched.keys() {
            if let Some(path) = self.resolver.path(*id) {
                self.paths.entry(*id).or_insert_with(|| path.to_owned());
            }
        }
        self.previous = snapshot;
        for id in &gone {
            sched::forget(self.probes.ebpf_mut(), *id);
            self.previous.sched.remove(id);
        }
        Ok(window)
    }

    /// Paths of the cgroups seen so far (including removed ones not yet forgotten).
    pub fn paths(&self) -> &HashMap<u64, String> {
        &self.paths
    }

    /// Drops remembered paths of cgroups that no longer exist and that `keep` does not need.
    pub fn forget_paths(&mut self, keep: impl Fn(u64) -> bool) {
        let resolver = &self.resolver;
        self.paths
            .retain(|id, _| keep(*id) || resolver.path(*id).is_some());
    }
}
