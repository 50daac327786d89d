//! Go's `sync.Mutex` uprobes (`ebpf-probes/kernel/src/gomutex.rs`): loaded with the hand-off
//! sampler, attached to the Go binaries of watched processes while the futex probes are
//! attached, and detached with them.
//!
//! A uprobe is on a file, not a process: one attach per binary (by device and inode) covers
//! every process that runs it, in any container. Binaries are found through
//! `/proc/<pid>/exe` (the kernel resolves the link to the container's own file). A binary is
//! Go's mutex when its symbol table has the slow paths: `internal/sync.(*Mutex).lockSlow` and
//! `unlockSlow` (Go 1.24 and later; `sync.(*Mutex)…` before). A stripped Go binary has none,
//! and is left alone.

use std::{
    collections::{HashMap, HashSet},
    os::unix::fs::MetadataExt as _,
    path::Path,
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

use super::map_io::read_per_cpu_hash;

/// The slow paths' symbols, newest Go first: (lock, unlock).
const SLOW_PATHS: [(&str, &str); 2] = [
    (
        "internal/sync.(*Mutex).lockSlow",
        "internal/sync.(*Mutex).unlockSlow",
    ),
    ("sync.(*Mutex).lockSlow", "sync.(*Mutex).unlockSlow"),
];

/// A binary by device and inode.
type FileId = (u64, u64);

/// The uprobes on Go binaries, and what was learned of each process and binary.
#[derive(Debug, Default)]
pub struct GoMutexProbes {
    /// Both programs loaded (verified): uprobes can be attached.
    loaded: bool,
    /// The attached binaries, each with its links (program, link).
    attached: HashMap<FileId, Vec<(&'static str, UProbeLinkId)>>,
    /// Binaries that are not Go's with the slow paths (or could not be attached to).
    passed: HashSet<FileId>,
    /// Processes already looked at.
    seen: HashSet<u32>,
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
        let mut load = |name: &str| -> anyhow::Result<()> {
            let p: &mut UProbe = ebpf
                .program_mut(name)
                .ok_or_else(|| anyhow::anyhow!("program {name} missing from the object"))?
                .try_into()?;
            p.load()?;
            Ok(())
        };
        let loaded = match load(programs::GO_MUTEX_LOCK_SLOW)
            .and_then(|()| load(programs::GO_MUTEX_UNLOCK_SLOW))
        {
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

    /// Binaries attached now.
    pub fn attached(&self) -> usize {
        self.attached.len()
    }

    /// Attaches to the binaries of `tgids` not looked at yet that are Go's with the slow paths.
    pub fn watch(&mut self, ebpf: &mut Ebpf, tgids: impl IntoIterator<Item = u32>) {
        if !self.loaded {
            return;
        }
        for tgid in tgids {
            if !self.seen.insert(tgid) {
                continue;
            }
            let exe = format!("/proc/{tgid}/exe");
            let Ok(md) = std::fs::metadata(&exe) else {
                continue;
            };
            let id = (md.dev(), md.ino());
            if self.attached.contains_key(&id) || self.passed.contains(&id) {
                continue;
            }
            let Some((lock, unlock)) = slow_path_offsets(Path::new(&exe)) else {
                self.passed.insert(id);
                continue;
            };
            match attach(ebpf, &exe, lock, unlock) {
                Ok(links) => {
                    log::info!(
                        "Go sync.Mutex probes attached to {} (pid {tgid})",
                        std::fs::read_link(&exe)
                            .map(|p| p.display().to_string())
                            .unwrap_or(exe)
                    );
                    self.attached.insert(id, links);
                }
                Err(e) => {
                    log::warn!("cannot attach the Go sync.Mutex probes to pid {tgid}: {e:#}");
                    self.passed.insert(id);
                }
            }
        }
    }

    /// Every process on the node (`/proc`).
    pub fn watch_all(&mut self, ebpf: &mut Ebpf) {
        let tgids: Vec<u32> = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        self.watch(ebpf, tgids);
    }

    /// Detaches every binary, and forgets what was looked at (it is looked at again when the
    /// probes are wanted again: binaries and processes change meanwhile).
    pub fn detach_all(&mut self, ebpf: &mut Ebpf) {
        for (_, links) in self.attached.drain() {
            for (program, link) in links {
                if let Some(Ok(p)) = ebpf.program_mut(program).map(<&mut UProbe>::try_from)
                    && let Err(e) = p.detach(link)
                {
                    log::warn!("cannot detach {program}: {e}");
                }
            }
        }
        self.seen.clear();
        self.passed.clear();
    }

    /// Forgets exited processes (their binaries stay attached: others may run them).
    pub fn retain_processes(&mut self, live: impl Fn(u32) -> bool) {
        self.seen.retain(|t| live(*t));
    }
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
                for (program, link) in links {
                    if let Some(Ok(p)) = ebpf.program_mut(program).map(<&mut UProbe>::try_from) {
                        let _ = p.detach(link);
                    }
                }
                return Err(e.into());
            }
        }
    }
    Ok(links)
}

/// Each cgroup's slow-path entries so far (summed over the CPUs).
pub fn read_calls(ebpf: &Ebpf) -> anyhow::Result<HashMap<u64, GoMutexCalls>> {
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
pub fn forget(ebpf: &mut Ebpf, cgroups: &[u64]) {
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
