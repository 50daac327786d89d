//! The CPUs' switch caches (`SCHED_CACHE`): per CPU, the one cgroup whose switch-outs it
//! credits without a hash lookup. Reading the scheduler figures merges them with
//! `CGROUP_SCHED`; which cgroup each CPU caches is chosen at each read.

use std::{
    collections::HashMap,
    sync::atomic::{Ordering, fence},
};

use aya::{
    Ebpf,
    maps::{PerCpuArray, PerCpuValues},
};
use stormwatch_common::{SchedCache, SchedStats, maps};

use super::super::{read_per_cpu_hash_with, remove_per_cpu_keys};
use crate::counters::Counters as _;

/// What the agent keeps between reads about the CPUs' switch caches (`SCHED_CACHE`: per CPU,
/// the one cgroup whose switch-outs it credits without a hash lookup; see
/// [`stormwatch_common::SchedCache`]).
#[derive(Debug, Default)]
pub struct SwitchCaches {
    /// Per CPU, the cgroup last asked for in `SCHED_CACHE_WANT` (0: none).
    wanted: Vec<u64>,
    /// Per CPU, the cgroup its cache held at the last read (0: none).
    held: Vec<u64>,
    /// Per cgroup, per CPU: its switch-outs there as of the last read (cache and map together).
    switches: HashMap<u64, Vec<u64>>,
    /// Removed cgroups whose `CGROUP_SCHED` entries wait until no cache holds them: a flush
    /// into a deleted entry would make it again.
    forgetting: Vec<u64>,
}

/// Reads that found a flush between them before one did not.
const CACHE_READ_ATTEMPTS: usize = 32;

/// A CPU's cache moves to another cgroup when that one switched out there at least this many
/// times since the last read, and more than twice as often as the cached one: a cache that
/// follows every change of the busiest cgroup would flush at every read.
const CACHE_MIN_SWITCHES: u64 = 1_000;

/// Reads `CGROUP_SCHED` and the CPUs' switch caches: each cgroup's per-CPU slots summed with the
/// caches that hold it (the counters only grow), and its on-CPU time on each CPU (which CPUs it
/// ran on). Then asks each CPU's cache for the cgroup that switches out most there.
#[allow(clippy::type_complexity)]
pub(super) fn read(
    ebpf: &mut Ebpf,
    caches: &mut SwitchCaches,
) -> anyhow::Result<(HashMap<u64, SchedStats>, HashMap<u64, Vec<u64>>)> {
    let Merged {
        held,
        mut totals,
        mut by_cpu,
        mut switches,
    } = read_merged(&mut KernelMaps(ebpf))?;
    caches.forgetting.retain(|id| {
        totals.remove(id);
        by_cpu.remove(id);
        switches.remove(id);
        if held.contains(id) {
            return true;
        }
        remove_per_cpu_keys::<u64, SchedStats>(ebpf, maps::CGROUP_SCHED, &[*id]);
        false
    });
    // A cache that holds a removed cgroup is given up, never kept.
    let keep: Vec<u64> = held
        .iter()
        .map(|id| {
            if caches.forgetting.contains(id) {
                0
            } else {
                *id
            }
        })
        .collect();
    let want = choose_caches(&keep, &caches.switches, &switches);
    caches.switches = switches;
    caches.held = held;
    caches.ask(ebpf, want)?;
    Ok((totals, by_cpu))
}

/// The two maps a read of the scheduler figures merges: the kernel's, or a simulation in the
/// tests that flushes caches in the middle of a read.
pub(super) trait SwitchMaps {
    /// Each CPU's `SCHED_CACHE` slot, in CPU order (one copy of each).
    fn caches(&mut self) -> anyhow::Result<Vec<SchedCache>>;
    /// `CGROUP_SCHED`: each cgroup's per-CPU slots, folded by [`Figures::add_cgroup`].
    fn cgroups(&mut self, figures: &mut Figures) -> anyhow::Result<()>;
}

/// The kernel's maps.
struct KernelMaps<'a>(&'a Ebpf);

impl SwitchMaps for KernelMaps<'_> {
    fn caches(&mut self) -> anyhow::Result<Vec<SchedCache>> {
        read_caches(self.0)
    }

    fn cgroups(&mut self, figures: &mut Figures) -> anyhow::Result<()> {
        figures.totals =
            read_per_cpu_hash_with(self.0, maps::CGROUP_SCHED, |id: &u64, per_cpu| {
                figures.add_cgroup(*id, per_cpu)
            })?;
        Ok(())
    }
}

/// Per cgroup: its figures summed over CPUs, its on-CPU time on each CPU, its switch-outs on
/// each CPU.
#[derive(Debug, Default)]
pub(super) struct Figures {
    pub(super) totals: HashMap<u64, SchedStats>,
    pub(super) by_cpu: HashMap<u64, Vec<u64>>,
    pub(super) switches: HashMap<u64, Vec<u64>>,
}

impl Figures {
    /// Takes one cgroup's per-CPU `CGROUP_SCHED` slots into `by_cpu` and `switches`; returns
    /// their sum (for `totals`).
    pub(super) fn add_cgroup(&mut self, id: u64, per_cpu: &[SchedStats]) -> SchedStats {
        self.by_cpu
            .insert(id, per_cpu.iter().map(|v| v.oncpu_ns).collect());
        self.switches
            .insert(id, per_cpu.iter().map(switch_count).collect());
        let mut total = SchedStats::ZERO;
        per_cpu.iter().for_each(|v| total.add(v));
        total
    }
}

/// A read with the caches merged in, and which cgroup each CPU's cache held.
#[derive(Debug)]
pub(super) struct Merged {
    pub(super) held: Vec<u64>,
    pub(super) totals: HashMap<u64, SchedStats>,
    pub(super) by_cpu: HashMap<u64, Vec<u64>>,
    pub(super) switches: HashMap<u64, Vec<u64>>,
}

/// Reads the caches, `CGROUP_SCHED`, the caches again (the copy merged), and the caches a third
/// time, and merges the copy when no CPU's generation moved or was odd across the three: the
/// reader's half of a seqlock (the probes' `flush` is the writer's). A flush that came between
/// two reads, or fell inside the copy of one CPU's slot (whose generation is copied before its
/// figures), changes the third read's generation, so no flushed figures are ever counted twice
/// or not at all. The fences keep this CPU's loads of each read (done by the kernel, in the
/// syscall) after those of the read before, on weakly ordered CPUs too; the probes order their
/// stores ([`stormwatch_common::globals::FLUSH_WITH_BARRIERS`]).
pub(super) fn read_merged(maps: &mut impl SwitchMaps) -> anyhow::Result<Merged> {
    let mut before = maps.caches()?;
    for _ in 0..CACHE_READ_ATTEMPTS {
        fence(Ordering::SeqCst);
        let mut figures = Figures::default();
        maps.cgroups(&mut figures)?;
        fence(Ordering::SeqCst);
        let copy = maps.caches()?;
        fence(Ordering::SeqCst);
        let after = maps.caches()?;
        if !unchanged(&before, &copy) || !unchanged(&copy, &after) {
            // A flush came between (or was under way): its figures may be in both reads of the
            // map and the cache, or in neither. The last read is the next one's first.
            before = after;
            std::thread::yield_now();
            continue;
        }
        merge_caches(&copy, &mut figures);
        return Ok(Merged {
            held: copy.iter().map(|c| c.cgroup_id).collect(),
            totals: figures.totals,
            by_cpu: figures.by_cpu,
            switches: figures.switches,
        });
    }
    anyhow::bail!(
        "the CPUs' switch caches were flushed during each of {CACHE_READ_ATTEMPTS} reads of \
         {}",
        maps::CGROUP_SCHED
    )
}

fn switch_count(v: &SchedStats) -> u64 {
    v.voluntary_switches + v.involuntary_switches
}

fn read_caches(ebpf: &Ebpf) -> anyhow::Result<Vec<SchedCache>> {
    let map = ebpf
        .map(maps::SCHED_CACHE)
        .ok_or_else(|| anyhow::anyhow!("map {} missing from the object", maps::SCHED_CACHE))?;
    let values = PerCpuArray::<_, SchedCache>::try_from(map)?.get(&0, 0)?;
    Ok(values.iter().copied().collect())
}

/// Whether no flush came between two reads of the caches, nor was under way at either.
pub(super) fn unchanged(before: &[SchedCache], after: &[SchedCache]) -> bool {
    before.len() == after.len()
        && before
            .iter()
            .zip(after)
            .all(|(b, a)| b.generation == a.generation && a.generation % 2 == 0)
}

/// Adds each CPU's cache to the figures of the cgroup it holds.
pub(super) fn merge_caches(caches: &[SchedCache], figures: &mut Figures) {
    let cpus = caches.len();
    for (cpu, cache) in caches.iter().enumerate() {
        if cache.cgroup_id == 0 {
            continue;
        }
        let id = cache.cgroup_id;
        figures
            .totals
            .entry(id)
            .or_insert(SchedStats::ZERO)
            .add(&cache.stats);
        figures.by_cpu.entry(id).or_insert_with(|| vec![0; cpus])[cpu] += cache.stats.oncpu_ns;
        figures.switches.entry(id).or_insert_with(|| vec![0; cpus])[cpu] +=
            switch_count(&cache.stats);
    }
}

/// Per CPU, the cgroup its cache should hold: the one that switched out there most since the
/// last read, when that is at least [`CACHE_MIN_SWITCHES`] and more than twice what the held
/// one did; else the held one.
pub(super) fn choose_caches(
    held: &[u64],
    then: &HashMap<u64, Vec<u64>>,
    now: &HashMap<u64, Vec<u64>>,
) -> Vec<u64> {
    let grew = |id: u64, cpu: usize| -> u64 {
        let now = now.get(&id).and_then(|v| v.get(cpu)).copied().unwrap_or(0);
        let then = then.get(&id).and_then(|v| v.get(cpu)).copied().unwrap_or(0);
        now.saturating_sub(then)
    };
    held.iter()
        .enumerate()
        .map(|(cpu, &held)| {
            let busiest = now
                .keys()
                .map(|&id| (grew(id, cpu), id))
                .max()
                .filter(|&(n, _)| n >= CACHE_MIN_SWITCHES);
            match busiest {
                Some((n, id)) if id != held && (held == 0 || n > 2 * grew(held, cpu)) => id,
                _ => held,
            }
        })
        .collect()
}

impl SwitchCaches {
    /// Writes `want` to `SCHED_CACHE_WANT` when it differs from what was last asked.
    fn ask(&mut self, ebpf: &mut Ebpf, want: Vec<u64>) -> anyhow::Result<()> {
        if want == self.wanted {
            return Ok(());
        }
        let map = ebpf.map_mut(maps::SCHED_CACHE_WANT).ok_or_else(|| {
            anyhow::anyhow!("map {} missing from the object", maps::SCHED_CACHE_WANT)
        })?;
        let mut array = PerCpuArray::<_, u64>::try_from(map)?;
        array.set(0, PerCpuValues::try_from(want.clone())?, 0)?;
        self.wanted = want;
        Ok(())
    }
}

/// Forgets removed cgroups: their `CGROUP_SCHED` entries are deleted now, or, for one a CPU's
/// cache holds, once no cache does (its caches are given up now; its figures are left out of
/// every read meanwhile).
pub(super) fn forget(
    ebpf: &mut Ebpf,
    caches: &mut SwitchCaches,
    cgroups: &[u64],
) -> anyhow::Result<()> {
    let (held, now): (Vec<u64>, Vec<u64>) = cgroups.iter().partition(|id| {
        caches.wanted.contains(id) || caches.held.contains(id) || caches.forgetting.contains(id)
    });
    remove_per_cpu_keys::<u64, SchedStats>(ebpf, maps::CGROUP_SCHED, &now);
    if held.is_empty() {
        return Ok(());
    }
    let want = caches
        .wanted
        .iter()
        .map(|id| if held.contains(id) { 0 } else { *id })
        .collect();
    for id in held {
        if !caches.forgetting.contains(&id) {
            caches.forgetting.push(id);
        }
    }
    caches.ask(ebpf, want)
}
