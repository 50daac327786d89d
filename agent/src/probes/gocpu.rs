//! The on-CPU sampler of the Go processes whose runtime clocks the agent reads
//! (`ebpf-probes/kernel/src/gomutex.rs`, `go_oncpu`): what a Go program's `sync.Mutex` costs
//! its CPUs.
//!
//! The runtime's clock ([`crate::identity::goclock`]) says how many goroutines wait for a
//! mutex, not what their waiting costs: a goroutine parked on a mutex gives its P to another
//! goroutine, and where the program has more work than CPUs (64 goroutines on 2 CPUs), the CPUs
//! stay busy with work whatever the queue (tests/CORPUS.md, "What the lock costs the CPU").
//! Where the mutex limits the work, the CPUs spin and queue for it in the runtime instead. So
//! each CPU's clock interrupts it [`GO_ONCPU_HZ`] times a second (a `perf_event` program, one
//! per CPU, attached for the agent's life), and a sample of a watched Go process is counted by
//! its cgroup, process and the top of its user stack. The pipeline's Go stage names the frames
//! (`symbolize::gocode`) and adds each key's new samples to its cgroup's figures here: all of
//! them, and those in the mutex's code. What the runtime does for the mutex on its own stack
//! (parking the goroutine, scheduling another) is not on the goroutine's stack and is not
//! counted: the share is a lower bound.
//!
//! Exact counts of samples; a share of N samples is an estimate whose spread is about
//! `sqrt(p(1-p)/N)`.

use std::collections::{HashMap, HashSet};

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, PerCpuHashMap},
    programs::{
        PerfEvent,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
};
use stormwatch_common::{GO_ONCPU_HZ, GoOnCpuKey, maps, programs};

use super::map_io::read_per_cpu_hash;

/// Processes watched at once (the kernel map's bound).
const MAX_TGIDS: usize = 4096;

/// A cgroup's samples of its watched Go processes, cumulative.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GoCpuSamples {
    /// Every sample of the processes.
    pub samples: u64,
    /// Those with a frame in the mutex's code.
    pub mutex: u64,
}

/// The sampler: attached once, told which processes to count, read at each collection.
#[derive(Debug, Default)]
pub struct GoCpuSampler {
    /// What attaching it gave: the CPUs it samples, or why it does not (`None`: not tried, the
    /// futex family was not chosen).
    outcome: Option<Result<usize, String>>,
    watched: HashSet<u32>,
    /// Each key's count at the last read (summed over CPUs).
    last: HashMap<GoOnCpuKey, u64>,
    /// Per cgroup, cumulative.
    cgroups: HashMap<u64, GoCpuSamples>,
}

impl GoCpuSampler {
    /// Loads the program and attaches it to every online CPU's clock; a sampler that cannot
    /// (no perf events here) counts nothing, and says so once.
    pub fn attach(ebpf: &mut Ebpf) -> Self {
        let outcome = match attach(ebpf) {
            Ok(n) => {
                log::info!("Go on-CPU sampler attached to {n} CPUs at {GO_ONCPU_HZ} Hz");
                Ok(n)
            }
            Err(e) => {
                log::info!("Go on-CPU sampler not attached: {e:#}");
                Err(format!("{e:#}"))
            }
        };
        Self {
            outcome: Some(outcome),
            ..Self::default()
        }
    }

    pub fn attached(&self) -> bool {
        matches!(self.outcome, Some(Ok(_)))
    }

    /// The CPUs it samples, or why it does not; `None` where it was not tried.
    pub fn outcome(&self) -> Option<Result<usize, &str>> {
        self.outcome
            .as_ref()
            .map(|o| o.as_ref().map(|n| *n).map_err(String::as_str))
    }

    /// Whether `tgid` is counted.
    pub fn watches(&self, tgid: u32) -> bool {
        self.watched.contains(&tgid)
    }

    /// Counts the processes of `tgids` (the Go processes whose clocks are read) from now on,
    /// and no others.
    pub fn watch(&mut self, ebpf: &mut Ebpf, tgids: impl IntoIterator<Item = u32>) {
        if !self.attached() {
            return;
        }
        let wanted: HashSet<u32> = tgids.into_iter().take(MAX_TGIDS).collect();
        let Some(map) = ebpf.map_mut(maps::GO_ONCPU_TGIDS) else {
            return;
        };
        let Ok(mut map) = BpfHashMap::<_, u32, u32>::try_from(map) else {
            return;
        };
        self.watched.retain(|t| {
            let keep = wanted.contains(t);
            if !keep {
                let _ = map.remove(t);
            }
            keep
        });
        for tgid in wanted {
            if !self.watched.contains(&tgid) && map.insert(&tgid, &1u32, 0).is_ok() {
                self.watched.insert(tgid);
            }
        }
    }

    /// The samples since the last read, by key; the keys of processes no longer watched are
    /// deleted (nothing counts them any more).
    pub fn read_new(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<Vec<(GoOnCpuKey, u64)>> {
        if !self.attached() {
            return Ok(Vec::new());
        }
        let now: HashMap<GoOnCpuKey, u64> =
            read_per_cpu_hash(ebpf, maps::GO_ONCPU, 0u64, |t, v| *t += *v)?;
        let mut new = Vec::new();
        let mut stale = Vec::new();
        for (key, count) in now {
            if !self.watched.contains(&key.tgid) {
                stale.push(key);
                continue;
            }
            let last = self.last.entry(key).or_insert(0);
            if count > *last {
                new.push((key, count - *last));
            }
            *last = count;
        }
        if !stale.is_empty()
            && let Some(map) = ebpf.map_mut(maps::GO_ONCPU)
            && let Ok(mut map) = PerCpuHashMap::<_, GoOnCpuKey, u64>::try_from(map)
        {
            for key in stale {
                let _ = map.remove(&key);
                self.last.remove(&key);
            }
        }
        Ok(new)
    }

    /// Adds a cgroup's new samples, `mutex` of them in the mutex's code.
    pub fn add(&mut self, cgroup: u64, samples: u64, mutex: u64) {
        let c = self.cgroups.entry(cgroup).or_default();
        c.samples += samples;
        c.mutex += mutex;
    }

    /// Every cgroup with samples, cumulative.
    pub fn cgroups(&self) -> impl Iterator<Item = (u64, GoCpuSamples)> + '_ {
        self.cgroups.iter().map(|(id, s)| (*id, *s))
    }

    /// Forgets a removed cgroup (its processes' keys go when they stop being watched).
    pub fn forget_cgroup(&mut self, id: u64) {
        self.cgroups.remove(&id);
    }

    /// The sizes of what it remembers.
    pub fn cache_sizes(&self) -> [crate::memory::CacheSize; 2] {
        use crate::memory::CacheSize;
        [
            CacheSize::entries("go_oncpu_processes", self.watched.len(), MAX_TGIDS),
            CacheSize::live("go_oncpu_stacks", self.last.len()),
        ]
    }
}

fn attach(ebpf: &mut Ebpf) -> anyhow::Result<usize> {
    let program: &mut PerfEvent = ebpf
        .program_mut(programs::GO_ONCPU)
        .ok_or_else(|| anyhow::anyhow!("program {} missing from the object", programs::GO_ONCPU))?
        .try_into()?;
    program.load()?;
    let cpus = aya::util::online_cpus().map_err(|(_, e)| e)?;
    let mut n = 0;
    for cpu in cpus {
        program.attach(
            PerfEventConfig::Software(SoftwareEvent::CpuClock),
            PerfEventScope::AllProcessesOneCpu { cpu },
            SamplePolicy::Frequency(GO_ONCPU_HZ),
            false,
        )?;
        n += 1;
    }
    Ok(n)
}
