//! The binaries of one kind that the node's processes run, for the families that put uprobes
//! on a runtime's own code (Go's `sync.Mutex`, PostgreSQL's lock waits).
//!
//! A process is looked at once: its binary (`/proc/<pid>/exe`, which the kernel resolves to a
//! container's own file) by device and inode. A binary is examined once, whatever number of
//! processes run it: found (the family keeps what it learned of it, and what it attached) or
//! passed over. Each is remembered with the processes seen running it and forgotten when none
//! of them lives (what the family kept of it dropped with it: a uprobe's perf events closed).
//! Past the bounds, the processes and binaries passed over are looked at again.

use std::collections::{HashMap, HashSet};

use crate::memory::CacheSize;

/// A binary by device and inode.
pub type FileId = (u64, u64);

/// The most processes remembered as looked at, and binaries as found or passed over.
pub const MAX_PROCESSES: usize = 65_536;
pub const MAX_BINARIES: usize = 4096;

/// A binary found, with the processes seen running it.
#[derive(Debug)]
pub struct Found<B> {
    pub tgids: HashSet<u32>,
    pub binary: B,
}

/// The binaries of one kind found among the processes looked at (`B`: what the family keeps
/// of each), and those passed over.
#[derive(Debug)]
pub struct BinaryFinder<B> {
    found: HashMap<FileId, Found<B>>,
    /// Binaries not of the kind (or that the family could not use), with the processes seen
    /// running them.
    passed: HashMap<FileId, HashSet<u32>>,
    /// Processes already looked at.
    seen: HashSet<u32>,
}

impl<B> Default for BinaryFinder<B> {
    fn default() -> Self {
        Self {
            found: HashMap::new(),
            passed: HashMap::new(),
            seen: HashSet::new(),
        }
    }
}

impl<B> BinaryFinder<B> {
    /// Looks at the processes of `tgids` not looked at yet. One that runs a binary found or
    /// passed over already is remembered with it; for a binary new here, `examine` is asked
    /// (with the process's pid and its `/proc/<pid>/exe` path): `Some` finds it, `None` passes
    /// it over. Past [`MAX_BINARIES`] found, new binaries are passed over unexamined.
    pub fn look_at(
        &mut self,
        tgids: impl IntoIterator<Item = u32>,
        mut examine: impl FnMut(u32, &str) -> Option<B>,
    ) {
        if self.seen.len() >= MAX_PROCESSES || self.passed.len() >= MAX_BINARIES {
            // Only live processes are kept: a node with this many is looked at again.
            self.seen.clear();
            self.passed.clear();
        }
        for tgid in tgids {
            if !self.seen.insert(tgid) {
                continue;
            }
            let Some(id) = crate::files::exe_id(tgid) else {
                continue;
            };
            if let Some(f) = self.found.get_mut(&id) {
                f.tgids.insert(tgid);
                continue;
            }
            if let Some(tgids) = self.passed.get_mut(&id) {
                tgids.insert(tgid);
                continue;
            }
            let examined = if self.found.len() >= MAX_BINARIES {
                None
            } else {
                examine(tgid, &format!("/proc/{tgid}/exe"))
            };
            match examined {
                Some(binary) => {
                    let tgids = HashSet::from([tgid]);
                    self.found.insert(id, Found { tgids, binary });
                }
                None => {
                    self.passed.insert(id, HashSet::from([tgid]));
                }
            }
        }
    }

    /// Forgets the processes `live` says have exited, and the binaries no live process runs.
    pub fn retain_processes(&mut self, live: impl Fn(u32) -> bool) {
        self.seen.retain(|t| live(*t));
        for f in self.found.values_mut() {
            f.tgids.retain(|t| live(*t));
        }
        self.found.retain(|_, f| !f.tgids.is_empty());
        for tgids in self.passed.values_mut() {
            tgids.retain(|t| live(*t));
        }
        self.passed.retain(|_, tgids| !tgids.is_empty());
    }

    /// Forgets every process and binary: they are looked at again.
    pub fn forget_all(&mut self) {
        self.found.clear();
        self.seen.clear();
        self.passed.clear();
    }

    /// Gives up a binary found (the family could not use it after all): passed over from now.
    pub fn pass_over(&mut self, id: FileId) {
        if let Some(f) = self.found.remove(&id) {
            self.passed.insert(id, f.tgids);
        }
    }

    /// The binaries found.
    pub fn found(&self) -> impl Iterator<Item = (&FileId, &Found<B>)> {
        self.found.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.found.is_empty()
    }

    /// The sizes of what it remembers, under the names `[processes seen, binaries found,
    /// binaries passed over]`.
    pub fn cache_sizes(&self, names: [&'static str; 3]) -> [CacheSize; 3] {
        [
            CacheSize::entries(names[0], self.seen.len(), MAX_PROCESSES),
            CacheSize::entries(names[1], self.found.len(), MAX_BINARIES),
            CacheSize::entries(names[2], self.passed.len(), MAX_BINARIES),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> u32 {
        std::process::id()
    }

    #[test]
    fn a_binary_is_examined_once_and_kept_with_its_processes() {
        let mut finder = BinaryFinder::default();
        let mut examined = Vec::new();
        finder.look_at([me()], |tgid, exe| {
            examined.push((tgid, exe.to_owned()));
            Some("kept")
        });
        assert_eq!(examined, [(me(), format!("/proc/{}/exe", me()))]);
        let found: Vec<_> = finder.found().map(|(_, f)| f.binary).collect();
        assert_eq!(found, ["kept"]);
        // Looked at again: not examined again.
        finder.look_at([me()], |_, _| panic!("examined twice"));
        assert!(!finder.is_empty());
        // Its process gone: the binary goes.
        finder.retain_processes(|_| false);
        assert!(finder.is_empty());
        let sizes = finder.cache_sizes(["seen", "found", "passed"]);
        assert!(sizes.iter().all(|s| s.entries == 0), "{sizes:?}");
    }

    #[test]
    fn a_binary_passed_over_or_given_up_is_not_examined_again() {
        let mut finder: BinaryFinder<()> = BinaryFinder::default();
        finder.look_at([me()], |_, _| None);
        assert!(finder.is_empty());
        finder.forget_all();
        finder.look_at([me()], |_, _| Some(()));
        let id = *finder.found().next().expect("found").0;
        finder.pass_over(id);
        assert!(finder.is_empty());
        finder.retain_processes(|_| true);
        finder.look_at([me()], |_, _| panic!("examined again"));
        assert!(finder.is_empty());
    }

    #[test]
    fn a_process_without_a_binary_is_passed_unexamined() {
        let mut finder: BinaryFinder<()> = BinaryFinder::default();
        // No such process: no /proc/<pid>/exe.
        finder.look_at([u32::MAX], |_, _| panic!("examined"));
        assert!(finder.is_empty());
    }
}
