//! Go's own clock of the time its goroutines wait for a `sync.Mutex`, read from outside the
//! process with no probe.
//!
//! A Go program's goroutines wait for a contended `sync.Mutex` (or `RWMutex`) in the Go
//! scheduler, not in the kernel: the mutex parks the goroutine on a runtime semaphore and the
//! thread (M) runs another. The kernel sees a few futex sleeps of idle Ms, whatever the storm;
//! uprobes on the mutex's slow paths count calls but trap on each (they are attached in short
//! bursts, `probes/gomutex.rs`). The runtime keeps the figure itself: since Go 1.20 it adds up
//! the time goroutines spend parked on `sync.Mutex` and `RWMutex` in
//! `runtime.sched.totalMutexWaitTime` (it times one goroutine in eight and scales: what
//! `runtime/metrics` exports in `/sync/mutex/wait/total:seconds`). Read at a window's two
//! edges, its difference over the window's length is the mean number of goroutines waiting
//! for a mutex (Little's law).
//!
//! Where: `runtime.sched`'s address from the binary's symbol table, the field's offset in
//! `runtime.schedt` from its DWARF (the layout changes between Go releases), and the 8 bytes
//! read through `/proc/<pid>/mem` (ptrace access to the process, as for naming call sites).
//! `runtime.allglen` (every goroutine the runtime holds, the dead ones it keeps for reuse
//! included) bounds how many goroutines there are. A stripped binary (`-ldflags=-s -w`), a Go
//! before 1.20, or a process that cannot be read gives nothing.

use crate::files::{exe_id, exe_load_bias as load_bias};
use std::{
    collections::{HashMap, HashSet},
    io::Read as _,
    os::unix::fs::FileExt as _,
    path::Path,
    sync::Arc,
};

use gimli::{EndianSlice, RunTimeEndian};
use object::{Object as _, ObjectSection as _, ObjectSegment as _, ObjectSymbol as _};

/// The most Go processes tracked, and processes passed over per cgroup; past it, no new Go
/// process is tracked until others exit, and the cgroup's further processes are looked at
/// again at its next edge read.
pub const MAX_ENTRIES: usize = 65_536;

/// A binary by device and inode.
pub type FileId = (u64, u64);

/// Where a Go binary keeps the figures, as addresses in the binary (before a PIE's load bias).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoLayout {
    /// `runtime.sched.totalMutexWaitTime`'s value.
    pub mutex_wait: u64,
    /// Where the runtime keeps its own locks' waits (Go 1.22 and later), which
    /// `runtime/metrics` adds to the mutexes' in `/sync/mutex/wait/total:seconds`. Not the
    /// program's mutexes: read only so that the runtime's published figure can be checked
    /// against ours (tests/tests/goclock.rs).
    pub runtime_locks: Option<RuntimeLockClock>,
    /// `runtime.allglen`.
    pub allglen: u64,
    /// `runtime.gomaxprocs`, when the symbol is there.
    pub gomaxprocs: Option<u64>,
    /// A position-independent executable: the addresses move with where it is loaded.
    pub pie: bool,
    /// The lowest address of its loadable segments (a PIE's bias is its mapping's start less
    /// this, page-aligned).
    pub first_vaddr: u64,
}

/// The runtime's own locks' wait clock: `sched.totalRuntimeLockWaitTime` (the Ms that have
/// exited) plus each live M's `mLockProfile.waitTime`, the Ms listed from `runtime.allm`
/// through `m.alllink` (what `runtime.totalMutexWaitTimeNanos` adds up).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuntimeLockClock {
    /// `sched.totalRuntimeLockWaitTime`'s value.
    pub exited: u64,
    /// `runtime.allm`: the first M.
    pub allm: u64,
    /// `alllink`'s offset in `runtime.m`.
    pub alllink: u64,
    /// `mLockProfile.waitTime`'s value's offset in `runtime.m`.
    pub wait: u64,
}

/// The most Ms walked in one read (a Go program has one per thread it ever ran Go code on).
const MAX_MS: usize = 100_000;

/// One read of a Go process's figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoReading {
    /// Cumulative time its goroutines waited for `sync.Mutex`/`RWMutex`, in nanoseconds.
    pub mutex_wait_ns: u64,
    /// Cumulative time its Ms waited for the runtime's own locks, where the binary has the
    /// clock ([`GoLayout::runtime_locks`]).
    pub runtime_lock_wait_ns: Option<u64>,
    /// Goroutines the runtime holds (an upper bound of the live ones).
    pub goroutines: u64,
    pub gomaxprocs: Option<u32>,
}

/// Finds the layout in a Go binary's bytes: `None` for anything else, a Go before 1.20, or a
/// binary stripped of its symbols or DWARF.
pub fn layout_of(data: &[u8]) -> Option<GoLayout> {
    let file = object::File::parse(data).ok()?;
    let mut sched = None;
    let mut allglen = None;
    let mut gomaxprocs = None;
    let mut allm = None;
    for sym in file.symbols() {
        match sym.name() {
            Ok("runtime.sched") => sched = Some(sym.address()),
            Ok("runtime.allm") => allm = Some(sym.address()),
            Ok("runtime.allglen") => allglen = Some(sym.address()),
            Ok("runtime.gomaxprocs") => gomaxprocs = Some(sym.address()),
            _ => {}
        }
    }
    let (offset, runtime_locks) = mutex_wait_offsets(&file)?;
    let first_vaddr = file.segments().map(|s| s.address()).min().unwrap_or(0);
    let sched = sched?;
    Some(GoLayout {
        mutex_wait: sched + offset,
        runtime_locks: runtime_locks.zip(allm).map(|(o, allm)| RuntimeLockClock {
            exited: sched + o.exited,
            allm,
            alllink: o.alllink,
            wait: o.wait,
        }),
        allglen: allglen?,
        gomaxprocs,
        pie: file.kind() == object::ObjectKind::Dynamic,
        first_vaddr,
    })
}

/// A section's bytes, inflated when the section is compressed (Go compresses its DWARF with
/// zlib).
fn section_bytes(file: &object::File<'_>, name: &str) -> Option<Vec<u8>> {
    let section = file.section_by_name(name)?;
    let compressed = section.compressed_data().ok()?;
    match compressed.format {
        object::CompressionFormat::None => Some(compressed.data.to_vec()),
        object::CompressionFormat::Zlib => {
            let mut out = Vec::with_capacity(compressed.uncompressed_size as usize);
            flate2::read::ZlibDecoder::new(compressed.data)
                .read_to_end(&mut out)
                .ok()?;
            Some(out)
        }
        _ => None,
    }
}

/// Offsets of the runtime's own locks' clock ([`RuntimeLockClock`]): `exited` in
/// `runtime.schedt`, the others in `runtime.m`.
struct RuntimeLockOffsets {
    exited: u64,
    alllink: u64,
    wait: u64,
}

/// `totalMutexWaitTime`'s offset in `runtime.schedt` (plus its `v` field's, inside the atomic
/// wrapper), and the runtime's own locks' clock where the runtime has it, from the DWARF.
fn mutex_wait_offsets(file: &object::File<'_>) -> Option<(u64, Option<RuntimeLockOffsets>)> {
    let endian = if file.is_little_endian() {
        RunTimeEndian::Little
    } else {
        RunTimeEndian::Big
    };
    let sections: HashMap<&str, Vec<u8>> = [
        ".debug_info",
        ".debug_abbrev",
        ".debug_line",
        ".debug_str",
        ".debug_line_str",
        ".debug_str_offsets",
        ".debug_addr",
    ]
    .into_iter()
    .filter_map(|name| Some((name, section_bytes(file, name)?)))
    .collect();
    let dwarf = gimli::Dwarf::load(|id| -> Result<_, gimli::Error> {
        let bytes = sections.get(id.name()).map_or(&[][..], Vec::as_slice);
        Ok(EndianSlice::new(bytes, endian))
    })
    .ok()?;
    let mut units = dwarf.units();
    while let Ok(Some(header)) = units.next() {
        let Ok(unit) = dwarf.unit(header) else {
            continue;
        };
        if let Some(off) = member_offset(&dwarf, &unit, "runtime.schedt", "totalMutexWaitTime") {
            let member = |s: &str, m: &str| member_offset(&dwarf, &unit, s, m);
            let runtime_locks = (|| {
                Some(RuntimeLockOffsets {
                    exited: member("runtime.schedt", "totalRuntimeLockWaitTime")?,
                    alllink: member("runtime.m", "alllink")?,
                    wait: member("runtime.m", "mLockProfile")?
                        + member("runtime.mLockProfile", "waitTime")?,
                })
            })();
            return Some((off, runtime_locks));
        }
    }
    None
}

/// In `unit`, the offset of `member` in the structure `name`, plus that of the field `v` of
/// the member's own type when it is a structure (Go's `atomic.Int64`).
fn member_offset<R: gimli::Reader>(
    dwarf: &gimli::Dwarf<R>,
    unit: &gimli::Unit<R>,
    name: &str,
    member: &str,
) -> Option<u64> {
    let mut entries = unit.entries();
    while let Ok(Some(entry)) = entries.next_dfs() {
        if entry.tag() != gimli::DW_TAG_structure_type || !named(dwarf, unit, entry, name) {
            continue;
        }
        let mut tree = unit.entries_tree(Some(entry.offset())).ok()?;
        let root = tree.root().ok()?;
        let mut children = root.children();
        while let Ok(Some(child)) = children.next() {
            let e = child.entry();
            if e.tag() != gimli::DW_TAG_member || !named(dwarf, unit, e, member) {
                continue;
            }
            let base = data_member_location(e)?;
            let inner = match e.attr_value(gimli::DW_AT_type) {
                Some(gimli::AttributeValue::UnitRef(ty)) => value_field_offset(unit, ty),
                _ => None,
            };
            return Some(base + inner.unwrap_or(0));
        }
        return None;
    }
    None
}

/// The offset of the field `v` in the structure at `ty` (Go's atomic integers wrap their value
/// in one), `None` when `ty` is not such a structure.
fn value_field_offset<R: gimli::Reader>(
    unit: &gimli::Unit<R>,
    ty: gimli::UnitOffset<R::Offset>,
) -> Option<u64> {
    let mut tree = unit.entries_tree(Some(ty)).ok()?;
    let root = tree.root().ok()?;
    if root.entry().tag() != gimli::DW_TAG_structure_type {
        return None;
    }
    let mut children = root.children();
    while let Ok(Some(child)) = children.next() {
        let e = child.entry();
        let is_v = matches!(
            e.attr_value(gimli::DW_AT_name),
            Some(gimli::AttributeValue::String(s)) if s.to_slice().ok().as_deref() == Some(b"v")
        );
        if e.tag() == gimli::DW_TAG_member && is_v {
            return data_member_location(e);
        }
    }
    None
}

fn data_member_location<R: gimli::Reader>(e: &gimli::DebuggingInformationEntry<R>) -> Option<u64> {
    e.attr_value(gimli::DW_AT_data_member_location)?
        .udata_value()
}

fn named<R: gimli::Reader>(
    dwarf: &gimli::Dwarf<R>,
    unit: &gimli::Unit<R>,
    e: &gimli::DebuggingInformationEntry<R>,
    name: &str,
) -> bool {
    let Some(attr) = e.attr_value(gimli::DW_AT_name) else {
        return false;
    };
    dwarf
        .attr_string(unit, attr)
        .ok()
        .and_then(|s| s.to_slice().ok().map(|b| b.as_ref() == name.as_bytes()))
        .unwrap_or(false)
}

/// Reads a process's figures at `layout`: `None` when the process is gone or its memory
/// cannot be read.
pub fn read_process(tgid: u32, layout: &GoLayout, exe: FileId) -> Option<GoReading> {
    let proc = Path::new("/proc").join(tgid.to_string());
    let bias = if layout.pie {
        load_bias(&proc, exe, layout.first_vaddr)?
    } else {
        0
    };
    let mem = std::fs::File::open(proc.join("mem")).ok()?;
    let read_u64 = |addr: u64| {
        let mut b = [0u8; 8];
        mem.read_exact_at(&mut b, addr.wrapping_add(bias)).ok()?;
        Some(u64::from_ne_bytes(b))
    };
    let mutex_wait_ns = read_u64(layout.mutex_wait)?;
    // The runtime's own locks' clock, as `totalMutexWaitTimeNanos` adds it up: a pointer
    // read as 0 ends the walk (a PIE's pointers are run-time addresses, not biased).
    let runtime_lock_wait_ns = layout.runtime_locks.and_then(|c| {
        let read_at = |addr: u64| {
            let mut b = [0u8; 8];
            mem.read_exact_at(&mut b, addr).ok()?;
            Some(u64::from_ne_bytes(b))
        };
        let mut total = read_u64(c.exited)?;
        let mut m = read_u64(c.allm)?;
        for _ in 0..MAX_MS {
            if m == 0 {
                return Some(total);
            }
            total = total.wrapping_add(read_at(m + c.wait)?);
            m = read_at(m + c.alllink)?;
        }
        None
    });
    let goroutines = read_u64(layout.allglen)?;
    let gomaxprocs = layout.gomaxprocs.and_then(|a| {
        let mut b = [0u8; 4];
        mem.read_exact_at(&mut b, a.wrapping_add(bias)).ok()?;
        Some(u32::from_ne_bytes(b))
    });
    // The runtime adds non-negative amounts; a negative value would be a misread.
    (mutex_wait_ns <= i64::MAX as u64).then_some(GoReading {
        mutex_wait_ns,
        runtime_lock_wait_ns: runtime_lock_wait_ns.filter(|n| *n <= i64::MAX as u64),
        goroutines,
        gomaxprocs,
    })
}

/// The Go clocks of a container's processes, at one edge: the cumulative mutex wait since the
/// processes were first seen, and the goroutines now.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GoEdge {
    /// Seconds the container's goroutines waited for a `sync.Mutex`/`RWMutex`, counted from
    /// when each process was first read (what a process waited before that is not in it).
    pub mutex_wait_seconds: f64,
    /// Goroutines the runtimes hold now (an upper bound of the live ones).
    pub goroutines: u64,
    /// The largest `GOMAXPROCS` among them.
    pub gomaxprocs: Option<u32>,
    /// Go processes read now.
    pub processes: u32,
}

/// What a process was last read at.
#[derive(Debug)]
struct Tracked {
    exe: FileId,
    layout: Arc<GoLayout>,
    last_wait_ns: u64,
}

/// What is kept of one cgroup between edge reads.
#[derive(Debug, Default)]
struct CgroupClock {
    /// Its cumulative wait, seconds, since its Go processes were first read.
    total: f64,
    /// Whether a Go process with the figures was ever read in it.
    go: bool,
    /// Its Go processes read at the last edge.
    seen: HashSet<u32>,
    /// Its processes that are not Go's with the figures (by pid and binary: a pid reused by
    /// another binary is looked at again).
    passed: HashMap<u32, FileId>,
}

/// The layouts of the binaries seen, each Go process's last reading, and each cgroup's
/// processes passed over; bounded by what is alive (each edge read keeps of a cgroup only the
/// processes still in it, [`GoClocks::sweep`] the binaries some process still runs, and a
/// removed cgroup goes whole).
#[derive(Debug, Default)]
pub struct GoClocks {
    binaries: HashMap<FileId, Option<Arc<GoLayout>>>,
    processes: HashMap<u32, Tracked>,
    cgroups: HashMap<u64, CgroupClock>,
}

impl GoClocks {
    /// Reads the Go processes among `tgids` (a cgroup's), adding what each waited since its
    /// last read to the cgroup's cumulative figure. `None` while no Go process with the
    /// figures was ever read in the cgroup.
    pub fn read_cgroup(&mut self, cgroup: u64, tgids: &[u32]) -> Option<GoEdge> {
        let mut clock = self.cgroups.remove(&cgroup).unwrap_or_default();
        let mut edge = GoEdge::default();
        let mut now: HashSet<u32> = HashSet::new();
        let mut passed: HashMap<u32, FileId> = HashMap::new();
        let mut added_ns = 0u64;
        let mut read = 0u32;
        for &tgid in tgids {
            let Some(exe) = exe_id(tgid) else { continue };
            if clock.passed.get(&tgid) == Some(&exe) {
                passed.insert(tgid, exe);
                continue;
            }
            let known = self.processes.get(&tgid).filter(|t| t.exe == exe);
            if known.is_none() && self.processes.len() >= MAX_ENTRIES {
                continue;
            }
            let layout = match known {
                Some(t) => t.layout.clone(),
                None => match self.layout(tgid, exe) {
                    Some(l) => l,
                    None => {
                        if passed.len() < MAX_ENTRIES {
                            passed.insert(tgid, exe);
                        }
                        continue;
                    }
                },
            };
            let Some(r) = read_process(tgid, &layout, exe) else {
                // Still in the cgroup: a read that fails once keeps its last reading, so that
                // the next one counts from it (dropping it would lose what was waited between).
                if known_now(&self.processes, tgid, exe) {
                    now.insert(tgid);
                }
                continue;
            };
            match self.processes.get_mut(&tgid).filter(|t| t.exe == exe) {
                Some(t) => {
                    added_ns += r.mutex_wait_ns.saturating_sub(t.last_wait_ns);
                    t.last_wait_ns = r.mutex_wait_ns;
                }
                None => {
                    self.processes.insert(
                        tgid,
                        Tracked {
                            exe,
                            layout,
                            last_wait_ns: r.mutex_wait_ns,
                        },
                    );
                }
            }
            now.insert(tgid);
            read += 1;
            edge.processes += 1;
            edge.goroutines += r.goroutines;
            edge.gomaxprocs = edge.gomaxprocs.max(r.gomaxprocs);
        }
        for gone in clock.seen.difference(&now) {
            self.processes.remove(gone);
        }
        clock.go |= read > 0;
        clock.total += added_ns as f64 / 1e9;
        clock.seen = now;
        clock.passed = passed;
        edge.mutex_wait_seconds = clock.total;
        let go = clock.go;
        self.cgroups.insert(cgroup, clock);
        go.then_some(edge)
    }

    /// The Go processes read at the last edge reads, in every cgroup.
    pub fn tgids(&self) -> impl Iterator<Item = u32> + '_ {
        self.processes.keys().copied()
    }

    /// Forgets the binaries no process remembered runs (once per edge read, after the
    /// cgroups': a Go binary with its last process, one passed over with its last pid).
    pub fn sweep(&mut self) {
        let used: HashSet<FileId> = self
            .processes
            .values()
            .map(|t| t.exe)
            .chain(
                self.cgroups
                    .values()
                    .flat_map(|c| c.passed.values().copied()),
            )
            .collect();
        self.binaries.retain(|id, _| used.contains(id));
    }

    /// Forgets a cgroup that is gone.
    pub fn forget_cgroup(&mut self, cgroup: u64) {
        if let Some(c) = self.cgroups.remove(&cgroup) {
            for tgid in c.seen {
                self.processes.remove(&tgid);
            }
        }
    }

    /// How many processes and binaries are remembered (the caches' sizes).
    pub fn len(&self) -> usize {
        self.processes.len()
            + self.binaries.len()
            + self.cgroups.values().map(|c| c.passed.len()).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its size for the agent's own metrics (`stormwatch_agent_cache_*`).
    pub fn cache_size(&self) -> crate::memory::CacheSize {
        crate::memory::CacheSize::live("go_clocks", self.len())
    }

    fn layout(&mut self, tgid: u32, exe: FileId) -> Option<Arc<GoLayout>> {
        self.binaries
            .entry(exe)
            .or_insert_with(|| {
                // Only Go binaries are parsed: the build info section says so cheaply.
                let path = Path::new("/proc").join(tgid.to_string()).join("exe");
                crate::identity::runtime::go_buildinfo(&path)?;
                let data = std::fs::read(&path).ok()?;
                layout_of(&data).map(Arc::new)
            })
            .clone()
    }
}

/// Whether `tgid` is tracked, running `exe`.
fn known_now(processes: &HashMap<u32, Tracked>, tgid: u32, exe: FileId) -> bool {
    processes.get(&tgid).is_some_and(|t| t.exe == exe)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test binary itself is not Go: no layout.
    #[test]
    fn a_binary_that_is_not_go_has_no_layout() {
        let data = std::fs::read("/proc/self/exe").unwrap();
        assert_eq!(layout_of(&data), None);
    }

    /// A cgroup of processes that are not Go's has no figure, and what is kept of it is what
    /// it runs: its processes passed over while they are in it, their binary while one is.
    #[test]
    fn what_is_kept_is_what_the_cgroups_run() {
        let me = std::process::id();
        let mut clocks = GoClocks::default();
        assert_eq!(clocks.read_cgroup(7, &[me]), None);
        clocks.sweep();
        assert_eq!(clocks.len(), 2, "the process passed over, and its binary");
        // Looked at once: the second read passes it over from what was kept.
        assert_eq!(clocks.read_cgroup(7, &[me]), None);
        assert_eq!(clocks.len(), 2);
        // Gone from the cgroup: forgotten, and its binary with the sweep.
        assert_eq!(clocks.read_cgroup(7, &[]), None);
        clocks.sweep();
        assert!(clocks.is_empty(), "{clocks:?}");
        // A pid that is not alive is skipped.
        assert_eq!(clocks.read_cgroup(8, &[u32::MAX - 1]), None);
        clocks.forget_cgroup(7);
        clocks.forget_cgroup(8);
        assert!(clocks.is_empty() && clocks.cgroups.is_empty());
    }
}
