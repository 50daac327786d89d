//! Go's `sync.Mutex` uprobes (`ebpf-probes/kernel/src/gomutex.rs`): loaded with the hand-off
//! sampler; while the futex probes are attached, the Go binaries of the processes they see are
//! found, and the uprobes are attached to all of them in short **bursts**: `BURST` every
//! `BURST_EVERY` (the on-demand policy's, `probes::demand`), then detached.
//!
//! Why bursts: a uprobe is a breakpoint trap, and a contended `sync.Mutex` is entered millions
//! of times a second — while attached, the probes cut a Go mutex storm's throughput to a fifth
//! on this 2-vCPU guest (BENCHMARKS.md). A 100 ms burst every 10 s costs the storm about 1%
//! of its time, and the counts it gives are exact for the time the probes were attached; the
//! figures are rates over that time, never totals of the window.
//!
//! A uprobe is on a file, not a process: one attach per binary (by device and inode) covers
//! every process that runs it, in any container. Binaries are found through
//! `/proc/<pid>/exe` (the kernel resolves the link to the container's own file). A binary is
//! Go's mutex when its symbol table has the slow paths: `internal/sync.(*Mutex).lockSlow` and
//! `unlockSlow` (Go 1.24 and later; `sync.(*Mutex)…` before). A stripped Go binary has none,
//! and is left alone.

use std::{
    collections::{HashMap, HashSet},
    path::Path,
    time::{Duration, Instant},
};

use aya::{
    Ebpf,
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeLinkId, UProbeScope},
    },
};
use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
use stormwatch_common::{GoMutexCalls, maps, programs};

use crate::counters::GoMutexFigures;

use super::{binaries::BinaryFinder, map_io::read_per_cpu_hash};

/// How long the uprobes stay attached at a time.
pub const BURST: Duration = Duration::from_millis(100);
/// The node-wide budget of samples (registers and stack) per second while the uprobes are
/// attached: about 100 in a burst.
pub const SAMPLES_PER_PROBED_SECOND: u32 = 1000;

/// What the finder says at a collection: whether the uprobes are wanted (the futex probes
/// watch) and whether there are Go binaries to attach them to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GoMutexWatch {
    pub watching: bool,
    pub binaries: bool,
}

/// The slow paths' symbols, newest Go first: (lock, unlock).
const SLOW_PATHS: [(&str, &str); 2] = [
    (
        "internal/sync.(*Mutex).lockSlow",
        "internal/sync.(*Mutex).unlockSlow",
    ),
    ("sync.(*Mutex).lockSlow", "sync.(*Mutex).unlockSlow"),
];

/// A Go binary's mutex slow paths: the file offsets to attach to (through a live process's
/// `exe` link).
#[derive(Debug)]
struct GoBinary {
    lock: u64,
    unlock: u64,
}

/// The Go binaries found, and what was learned of each process and binary. Each entry goes
/// when its process exits, or the last process that runs its binary does (the futex probes'
/// tier detached, everything goes); past the bounds, the processes and binaries passed over
/// start over (they are looked at again).
#[derive(Debug, Default)]
pub struct GoMutexProbes {
    /// Both programs loaded (verified): uprobes can be attached.
    loaded: bool,
    /// Go binaries with the slow paths (those that could not be attached to passed over).
    binaries: BinaryFinder<GoBinary>,
    /// Per cgroup with Go mutex contention on record: how long the uprobes have been attached
    /// since its first contended `Lock` (the bursts' spans), the time its counts are over.
    probed_ns: HashMap<u64, u64>,
    /// Each contended cgroup's figures as the last burst left them: the kernel's counts move
    /// only while a burst counts, so they are read once, after each burst.
    figures: HashMap<u64, GoMutexFigures>,
    /// The on-CPU sampler of the Go processes whose clocks are read (all the time, not in
    /// bursts): what the mutex costs their CPUs.
    pub cpu: super::gocpu::GoCpuSampler,
}

/// The Go mutexes' part of a snapshot: per cgroup, their contention as the uprobes' bursts
/// counted it.
#[derive(Clone, Debug, Default)]
pub struct GoMutexPart {
    pub cgroups: HashMap<u64, GoMutexFigures>,
}

impl GoMutexPart {
    /// Drops a removed cgroup's figures.
    pub fn forget_cgroup(&mut self, id: u64) {
        self.cgroups.remove(&id);
    }
}

impl super::ReadsPart for GoMutexProbes {
    type Part = GoMutexPart;

    /// The figures as of the last burst, without reading the map: nothing moves it between
    /// bursts (the programs count only while `GO_MUTEX_ON` is set, inside a burst); the
    /// on-CPU samples as the pipeline's Go stage last added them (it names them first).
    fn read(&mut self, _ebpf: &mut Ebpf) -> anyhow::Result<GoMutexPart> {
        Ok(self.part())
    }

    /// Removed cgroups: their entries in the kernel's map, their figures and their probed
    /// time, so that a cgroup id seen again starts from zero on all.
    fn forget(&mut self, ebpf: &mut Ebpf, gone: &super::Gone, part: &mut GoMutexPart) {
        for id in gone.cgroups {
            self.cpu.forget_cgroup(*id);
            if !self.loaded {
                part.forget_cgroup(*id);
            }
        }
        if !self.loaded || gone.cgroups.is_empty() {
            return;
        }
        for id in gone.cgroups {
            self.probed_ns.remove(id);
            self.figures.remove(id);
            part.forget_cgroup(*id);
        }
        forget(ebpf, gone.cgroups);
    }
}

/// The file offsets of a Go binary's mutex slow paths, `None` for any other binary.
pub fn slow_path_offsets(path: &Path) -> Option<(u64, u64)> {
    let file = std::fs::File::open(path).ok()?;
    let cache = object::ReadCache::new(file);
    let elf = object::File::parse(&cache).ok()?;
    // Go's own section: checked before the symbol table is read.
    elf.section_by_name(".gopclntab")
        .or_else(|| elf.section_by_name(".go.buildinfo"))?;
    let mut found: HashMap<&str, u64> = HashMap::new();
    let wanted: HashSet<&str> = SLOW_PATHS.iter().flat_map(|(l, u)| [*l, *u]).collect();
    for sym in elf.symbols() {
        if let Ok(name) = sym.name()
            && let Some(w) = wanted.get(name)
        {
            found.insert(w, sym.address());
        }
    }
    let offset = |addr: u64| -> Option<u64> {
        let section = elf
            .sections()
            .find(|s| s.address() <= addr && addr < s.address() + s.size())?;
        let (section_offset, _) = section.file_range()?;
        match UProbeAttachLocation::from_virtual_address(addr, section.address(), section_offset) {
            Ok(UProbeAttachLocation::AbsoluteOffset(o)) => Some(o),
            _ => None,
        }
    };
    SLOW_PATHS
        .iter()
        .find_map(|(lock, unlock)| Some((offset(*found.get(lock)?)?, offset(*found.get(unlock)?)?)))
}

impl GoMutexProbes {
    /// Loads both programs; `false` (and a log line) when the kernel refuses them.
    pub fn load(ebpf: &mut Ebpf) -> Self {
        let loaded = match super::attach::load_uprobes(
            ebpf,
            &[programs::GO_MUTEX_LOCK_SLOW, programs::GO_MUTEX_UNLOCK_SLOW],
        ) {
            Ok(()) => true,
            Err(e) => {
                log::info!("Go sync.Mutex probes not loaded: {e:#}");
                false
            }
        };
        Self {
            loaded,
            ..Self::default()
        }
    }

    pub fn loaded(&self) -> bool {
        self.loaded
    }

    /// Looks at the processes of `tgids` not looked at yet: those that run a Go binary with
    /// the slow paths are remembered with it.
    pub fn watch(&mut self, tgids: impl IntoIterator<Item = u32>) {
        if !self.loaded {
            return;
        }
        self.binaries.look_at(tgids, |tgid, exe| {
            let (lock, unlock) = slow_path_offsets(Path::new(exe))?;
            log::info!(
                "Go sync.Mutex slow paths found in {} (pid {tgid})",
                std::fs::read_link(exe)
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|_| exe.to_owned())
            );
            Some(GoBinary { lock, unlock })
        });
    }

    /// Every process on the node (`/proc`).
    pub fn watch_all(&mut self) {
        self.watch(crate::files::process_ids());
    }

    /// Forgets every process and binary (they are looked at again when the probes are wanted
    /// again: binaries and processes change meanwhile).
    pub fn forget_all(&mut self) {
        self.binaries.forget_all();
    }

    /// Forgets exited processes, and binaries no live process runs.
    pub fn retain_processes(&mut self, live: impl Fn(u32) -> bool) {
        self.binaries.retain_processes(live);
    }

    /// The sizes of what it remembers.
    pub fn cache_sizes(&self) -> [crate::memory::CacheSize; 3] {
        self.binaries
            .cache_sizes(["go_processes_seen", "go_binaries", "go_binaries_passed"])
    }

    /// Whether it knows Go binaries with the slow paths to attach to.
    pub fn has_binaries(&self) -> bool {
        !self.binaries.is_empty()
    }

    /// Attaches the uprobes to every known Go binary, counts for `BURST`, and detaches them.
    /// Returns the time it counted (`None` when no uprobe could be attached). A binary that
    /// cannot be attached to is given up.
    pub fn burst(&mut self, ebpf: &mut Ebpf) -> Option<Duration> {
        let mut links = Vec::new();
        let mut failed = Vec::new();
        for (id, f) in self.binaries.found() {
            let Some(tgid) = f.tgids.iter().next() else {
                continue;
            };
            let b = &f.binary;
            match attach(ebpf, &format!("/proc/{tgid}/exe"), b.lock, b.unlock) {
                Ok(l) => links.extend(l),
                Err(e) => {
                    log::warn!("cannot attach the Go sync.Mutex probes to pid {tgid}: {e:#}");
                    failed.push(*id);
                }
            }
        }
        for id in failed {
            self.binaries.pass_over(id);
        }
        if links.is_empty() {
            return None;
        }
        // Counted only while GO_MUTEX_ON is 1: a span known to the microsecond, inside the
        // uprobes' (attaching took milliseconds; detaching takes a grace period).
        let on_before = monotonic_ns();
        if let Err(e) = set_on(ebpf, true) {
            log::warn!("cannot start counting Go mutex calls: {e:#}");
            detach(ebpf, links);
            return None;
        }
        let counting = Instant::now();
        let on_after = monotonic_ns();
        std::thread::sleep(BURST);
        let off_before = monotonic_ns();
        let span = counting.elapsed();
        let off = set_on(ebpf, false);
        let off_after = monotonic_ns();
        detach(ebpf, links);
        if let Err(e) = off {
            // The uprobes are detached: nothing more is counted.
            log::warn!("cannot stop counting Go mutex calls: {e:#}");
        }
        // The edges on the kernel's clock (bpf_ktime_get_ns), for a test's oracle: every
        // counted call came between the first and the last, and every call between the middle
        // two was counted.
        log::debug!(
            "Go mutex burst (CLOCK_MONOTONIC ns): counting from {on_before}, surely from \
             {on_after}, surely until {off_before}, at most until {off_after}"
        );
        // The burst's span is every contended cgroup's probed time: each that has an entry now
        // (a contended Lock since its cgroup was last forgotten) was counted over all of it.
        // The one read of the counts per burst: the figures until the next.
        match read_calls(ebpf) {
            Ok(calls) => {
                for id in calls.keys() {
                    *self.probed_ns.entry(*id).or_default() += span.as_nanos() as u64;
                }
                self.figures = calls
                    .into_iter()
                    .map(|(id, c)| {
                        let figures = GoMutexFigures {
                            probed_ns: self.probed_ns.get(&id).copied().unwrap_or(0),
                            contended_locks: c.lock_slow,
                            handing_unlocks: c.unlock_slow,
                            // The sampler's, added by `part`.
                            ..GoMutexFigures::ZERO
                        };
                        (id, figures)
                    })
                    .collect();
            }
            Err(e) => log::warn!("cannot read the Go mutex counts: {e:#}"),
        }
        Some(span)
    }

    /// Each contended cgroup's figures as of the last burst: the kernel's counts of the slow
    /// paths' entries with the time the uprobes were attached.
    pub fn part(&self) -> GoMutexPart {
        let mut cgroups = self.figures.clone();
        for (id, s) in self.cpu.cgroups() {
            let f = cgroups.entry(id).or_insert(GoMutexFigures::ZERO);
            f.cpu_samples = s.samples;
            f.mutex_cpu_samples = s.mutex;
        }
        GoMutexPart { cgroups }
    }
}

/// Starts (`true`) or stops counting Go mutex calls.
fn set_on(ebpf: &mut Ebpf, on: bool) -> anyhow::Result<()> {
    let mut flag: aya::maps::Array<_, u32> = ebpf
        .map_mut(maps::GO_MUTEX_ON)
        .ok_or_else(|| anyhow::anyhow!("map {} missing", maps::GO_MUTEX_ON))?
        .try_into()?;
    flag.set(0, &u32::from(on), 0)?;
    Ok(())
}

/// CLOCK_MONOTONIC in ns: the clock of the kernel's `bpf_ktime_get_ns` and bpftrace's `nsecs`.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn attach(
    ebpf: &mut Ebpf,
    exe: &str,
    lock: u64,
    unlock: u64,
) -> anyhow::Result<Vec<(&'static str, UProbeLinkId)>> {
    let mut links = Vec::new();
    for (program, offset) in [
        (programs::GO_MUTEX_LOCK_SLOW, lock),
        (programs::GO_MUTEX_UNLOCK_SLOW, unlock),
    ] {
        let p: &mut UProbe = ebpf
            .program_mut(program)
            .ok_or_else(|| anyhow::anyhow!("program {program} missing"))?
            .try_into()?;
        match p.attach([offset], exe, UProbeScope::AllProcesses) {
            Ok(link) => links.push((program, link)),
            Err(e) => {
                detach(ebpf, links);
                return Err(e.into());
            }
        }
    }
    Ok(links)
}

fn detach(ebpf: &mut Ebpf, links: Vec<(&'static str, UProbeLinkId)>) {
    for (program, link) in links {
        if let Some(Ok(p)) = ebpf.program_mut(program).map(<&mut UProbe>::try_from)
            && let Err(e) = p.detach(link)
        {
            log::warn!("cannot detach {program}: {e}");
        }
    }
}

/// Each cgroup's slow-path entries so far (summed over the CPUs).
fn read_calls(ebpf: &Ebpf) -> anyhow::Result<HashMap<u64, GoMutexCalls>> {
    read_per_cpu_hash(
        ebpf,
        maps::GO_MUTEX_CALLS,
        GoMutexCalls::default(),
        |t: &mut GoMutexCalls, v: &GoMutexCalls| {
            t.lock_slow += v.lock_slow;
            t.unlock_slow += v.unlock_slow;
        },
    )
}

/// Deletes removed cgroups' entries.
fn forget(ebpf: &mut Ebpf, cgroups: &[u64]) {
    let Some(map) = ebpf.map_mut(maps::GO_MUTEX_CALLS) else {
        return;
    };
    let Ok(mut map) = aya::maps::PerCpuHashMap::<_, u64, GoMutexCalls>::try_from(map) else {
        return;
    };
    for id in cgroups {
        let _ = map.remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binary_that_is_not_go_has_no_slow_paths() {
        assert_eq!(slow_path_offsets(Path::new("/proc/self/exe")), None);
        assert_eq!(slow_path_offsets(Path::new("/nonexistent")), None);
    }
}
