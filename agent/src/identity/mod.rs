//! Identity: which cgroup a cgroup id names.
//!
//! In cgroup v2 the id that `bpf_get_current_cgroup_id()` returns is the inode number of the
//! cgroup's directory in the v2 hierarchy. That hierarchy is at `/sys/fs/cgroup` on a pure-v2
//! host and usually at `/sys/fs/cgroup/unified` on a hybrid one; the mount table says which.
//! The id → path map is a cache: it is re-walked only when an unknown id shows up (at most once
//! per refresh), and ids whose directory is gone are forgotten.
//!
//! Telling that a cgroup is gone costs a stat of its directory, so it is not done for every
//! cgroup every tick. The root's `cgroup.stat` (live and dying descendants: one small file)
//! says whether any cgroup was created or removed since the last tick; when it changed, every
//! cgroup with figures is checked, so a removal is noticed at the next tick. Otherwise only idle
//! cgroups are checked: a cgroup whose figures moved in the window was there during it, and a
//! removed cgroup has no threads left to move them. An idle one is checked every tick for the
//! first [`IDLE_CHECK_RECENT`] ticks of calm (when removal is likely: its processes just
//! exited), then every [`IDLE_CHECK_EVERY`] ticks, spread over the ticks by id; this also
//! catches what the counts miss (a removal and a creation between two ticks, the removed
//! cgroup freed by then).

pub mod container;
pub mod cpumanager;
pub mod goclock;
pub mod jvm;
pub mod kubelet;
pub mod limits;
pub mod mountinfo;
pub mod netns;
pub mod runtime;
pub mod workload;

use std::{
    collections::{HashMap, HashSet},
    os::unix::fs::{DirEntryExt, MetadataExt},
    path::{Path, PathBuf},
    time::Instant,
};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CgroupError {
    #[error("no cgroup v2 hierarchy is mounted (looked for cgroup2 in /proc/self/mountinfo)")]
    NoV2Hierarchy,
    #[error("cannot read /proc/self/mountinfo")]
    MountInfo(#[source] std::io::Error),
    #[error("{path} is not a cgroup directory in the v2 hierarchy at {root}")]
    NotACgroup { path: String, root: String },
}

/// Finds the mount point of the cgroup v2 hierarchy in a mountinfo text (see
/// [`mountinfo::v2_root`]).
pub fn v2_root_from_mountinfo(text: &str) -> Option<PathBuf> {
    mountinfo::v2_root(&mountinfo::parse(text))
}

pub fn find_v2_root() -> Result<PathBuf, CgroupError> {
    let mountinfo = crate::identity::mountinfo::read_text().map_err(CgroupError::MountInfo)?;
    v2_root_from_mountinfo(&mountinfo).ok_or(CgroupError::NoV2Hierarchy)
}

/// A cgroup that went idle is checked every tick for this many ticks.
pub const IDLE_CHECK_RECENT: u64 = 3;
/// After that, an idle cgroup is checked once every this many ticks.
pub const IDLE_CHECK_EVERY: u64 = 6;
/// Ids a walk did not find are remembered up to this many (then the memory starts over).
const UNRESOLVABLE_MAX: usize = 65_536;

/// The cgroup id → path cache.
pub struct CgroupResolver {
    root: PathBuf,
    paths: HashMap<u64, String>,
    last_walk: Option<Instant>,
    /// Refreshes so far (the tick count of the idle checks).
    refreshes: u64,
    /// Known ids by the refresh in which their figures last moved.
    last_active: HashMap<u64, u64>,
    /// Ids with figures that a walk made after reading them did not find: removed (ids are
    /// never reused), so a later figure for them makes no walk again.
    unresolvable: HashSet<u64>,
    /// The root's `cgroup.stat` at the last refresh.
    hierarchy_stat: Option<String>,
    /// Stats of cgroup directories made by refreshes (for the tests and the benchmark).
    pub checks: u64,
}

impl CgroupResolver {
    pub fn new(root: PathBuf) -> Self {
        Self {
            root,
            paths: HashMap::new(),
            last_walk: None,
            refreshes: 0,
            last_active: HashMap::new(),
            unresolvable: HashSet::new(),
            hierarchy_stat: None,
            checks: 0,
        }
    }

    pub fn discover() -> Result<Self, CgroupError> {
        Ok(Self::new(find_v2_root()?))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Every cgroup known since the last walk: (id, path relative to the v2 root).
    pub fn known(&self) -> impl Iterator<Item = (u64, &str)> {
        self.paths.iter().map(|(id, p)| (*id, p.as_str()))
    }

    /// The path of a cgroup relative to the v2 root, `/` for the root itself.
    pub fn path(&self, id: u64) -> Option<&str> {
        self.paths.get(&id).map(String::as_str)
    }

    /// Checks the ids in `ids` (every id with figures; `active` says whose figures moved in
    /// the window just read): an unknown id makes one walk of the hierarchy, and a known id
    /// whose idle check is due (see the module's documentation) is forgotten when its directory
    /// is gone (or now has another inode). Returns the ids that are gone. Callers pass ids read
    /// before this call, so a cgroup that exists is always found by the walk.
    pub fn refresh<'a>(
        &mut self,
        ids: impl IntoIterator<Item = &'a u64>,
        active: impl Fn(u64) -> bool,
    ) -> HashSet<u64> {
        self.refreshes += 1;
        let tick = self.refreshes;
        let hierarchy_stat = crate::files::kernel_text(self.root.join("cgroup.stat"));
        let hierarchy_changed = hierarchy_stat != self.hierarchy_stat;
        self.hierarchy_stat = hierarchy_stat;
        let mut gone = HashSet::new();
        let mut missing = Vec::new();
        let mut unchecked = Vec::new();
        for &id in ids {
            if !self.paths.contains_key(&id) {
                if self.unresolvable.contains(&id) {
                    gone.insert(id);
                } else {
                    missing.push(id);
                }
                continue;
            }
            let due = if active(id) {
                self.last_active.insert(id, tick);
                hierarchy_changed
            } else {
                let idle_for = tick - *self.last_active.entry(id).or_insert(tick);
                hierarchy_changed
                    || idle_for <= IDLE_CHECK_RECENT
                    || id.wrapping_add(tick) % IDLE_CHECK_EVERY == 0
            };
            if !due {
                unchecked.push(id);
                continue;
            }
            self.checks += 1;
            if !self.exists(id) {
                self.paths.remove(&id);
                self.last_active.remove(&id);
                gone.insert(id);
            }
        }
        if !missing.is_empty() {
            self.walk();
            // The walk replaced the cache: what it did not find is gone, checked or not.
            for id in unchecked {
                if !self.paths.contains_key(&id) {
                    self.last_active.remove(&id);
                    gone.insert(id);
                }
            }
            if self.unresolvable.len() + missing.len() > UNRESOLVABLE_MAX {
                self.unresolvable.clear();
            }
            for id in missing {
                if self.paths.contains_key(&id) {
                    self.last_active.insert(id, tick);
                } else {
                    self.unresolvable.insert(id);
                    gone.insert(id);
                }
            }
        }
        gone
    }

    /// Whether the directory of a known id is still there with that inode.
    fn exists(&self, id: u64) -> bool {
        let Some(rel) = self.paths.get(&id) else {
            return false;
        };
        let full = self.root.join(rel.trim_start_matches('/'));
        std::fs::metadata(full).map(|m| m.ino()).ok() == Some(id)
    }

    /// The sizes of its caches: the live cgroups' paths (and their last activity), and the ids
    /// no walk found.
    pub fn cache_sizes(&self) -> [crate::memory::CacheSize; 2] {
        use crate::memory::CacheSize;
        [
            CacheSize::live("cgroup_ids", self.paths.len()),
            CacheSize::entries(
                "cgroup_ids_unresolvable",
                self.unresolvable.len(),
                UNRESOLVABLE_MAX,
            ),
        ]
    }

    /// When the hierarchy was last walked.
    pub fn last_walk(&self) -> Option<Instant> {
        self.last_walk
    }

    /// Walks the whole hierarchy, replacing the cache: ids of removed cgroups are dropped.
    /// A directory's inode comes with its entry in the parent's listing (cgroupfs gives the
    /// cgroup id there as it does to stat), so only the root is stat'ed.
    pub fn walk(&mut self) {
        let mut paths = HashMap::with_capacity(self.paths.len());
        if let Ok(meta) = std::fs::metadata(&self.root) {
            paths.insert(meta.ino(), String::from("/"));
            let mut stack = vec![(self.root.clone(), String::from("/"))];
            while let Some((dir, rel)) = stack.pop() {
                let Ok(entries) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for entry in entries.flatten() {
                    // Cgroup directories are real directories; control files are not.
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        let name = entry.file_name().to_string_lossy().into_owned();
                        let child_rel = if rel == "/" {
                            format!("/{name}")
                        } else {
                            format!("{rel}/{name}")
                        };
                        paths.insert(entry.ino(), child_rel.clone());
                        stack.push((entry.path(), child_rel));
                    }
                }
            }
        }
        let paths_known = &paths;
        self.last_active
            .retain(|id, _| paths_known.contains_key(id));
        self.paths = paths;
        self.last_walk = Some(Instant::now());
    }

    /// Resolves a user-given cgroup: an absolute path inside the v2 mount, or a path relative
    /// to the v2 root (with or without a leading `/`). Returns (id, relative path).
    pub fn lookup_user_path(&self, given: &str) -> Result<(u64, String), CgroupError> {
        let given_path = Path::new(given);
        let full = if given_path.starts_with(&self.root) {
            given_path.to_path_buf()
        } else {
            self.root.join(given.trim_start_matches('/'))
        };
        let not_a_cgroup = || CgroupError::NotACgroup {
            path: given.to_owned(),
            root: self.root.display().to_string(),
        };
        let meta = std::fs::metadata(&full).map_err(|_| not_a_cgroup())?;
        // Every v2 cgroup directory has cgroup.procs; a plain directory elsewhere does not.
        if !meta.is_dir() || !full.join("cgroup.procs").exists() {
            return Err(not_a_cgroup());
        }
        let rel = full.strip_prefix(&self.root).map_err(|_| not_a_cgroup())?;
        let rel = format!("/{}", rel.display());
        let rel = if rel == "/" {
            rel
        } else {
            rel.trim_end_matches('/').to_owned()
        };
        Ok((meta.ino(), rel))
    }
}

/// Whether `path` is `ancestor` or lies under it (both relative to the v2 root).
pub fn is_within(path: &str, ancestor: &str) -> bool {
    ancestor == "/"
        || path == ancestor
        || path
            .strip_prefix(ancestor)
            .is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    use mountinfo::fixtures::{HYBRID, PURE_V2};

    #[test]
    fn finds_the_v2_root_on_hybrid_and_pure_hosts() {
        assert_eq!(
            v2_root_from_mountinfo(HYBRID),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            v2_root_from_mountinfo(PURE_V2),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(v2_root_from_mountinfo("garbage\n\n - \n"), None);
    }

    #[test]
    fn within_matches_whole_components() {
        assert!(is_within("/kubepods.slice/pod1", "/kubepods.slice"));
        assert!(is_within("/kubepods.slice", "/kubepods.slice"));
        assert!(!is_within("/kubepods.slice2", "/kubepods.slice"));
        assert!(is_within("/anything", "/"));
    }

    /// A fake hierarchy in a temporary directory: directory inodes stand in for cgroup ids,
    /// exactly as on a real v2 mount.
    #[test]
    fn walks_resolves_and_forgets() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir_all(root.join("a.slice/b.scope")).unwrap();
        std::fs::write(root.join("a.slice/cgroup.procs"), "").unwrap();
        let ino = |p: &str| std::fs::metadata(root.join(p)).unwrap().ino();
        let (a, b) = (ino("a.slice"), ino("a.slice/b.scope"));
        let mut r = CgroupResolver::new(root.to_path_buf());
        assert!(r.refresh(&[a], |_| false).is_empty());
        assert_eq!(r.path(a), Some("/a.slice"));
        assert_eq!(r.path(b), Some("/a.slice/b.scope"));
        assert_eq!(r.path(ino("")), Some("/"));
        assert_eq!(
            r.lookup_user_path("a.slice").unwrap(),
            (a, "/a.slice".into())
        );
        let abs = root.join("a.slice").display().to_string();
        assert_eq!(r.lookup_user_path(&abs).unwrap().0, a);
        assert!(
            r.lookup_user_path("/a.slice/b.scope").is_err(),
            "no cgroup.procs"
        );
        assert!(r.lookup_user_path("/nope").is_err());
        std::fs::remove_dir_all(root.join("a.slice/b.scope")).unwrap();
        assert_eq!(
            r.refresh(&[a, b, u64::MAX], |_| false),
            HashSet::from([b, u64::MAX])
        );
        assert_eq!(r.path(b), None);
        assert_eq!(r.path(a), Some("/a.slice"));
    }

    /// Which ids a refresh stats: while the hierarchy's counts stay the same, none that moved,
    /// an idle one for a few ticks after it went quiet and then once every [`IDLE_CHECK_EVERY`]
    /// ticks; every one when the counts change. A removed cgroup is forgotten at the first
    /// check after its removal, and an id no walk finds makes no second walk.
    #[test]
    fn checks_only_idle_cgroups_and_forgets_removed_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        for d in ["x.scope", "y.scope", "z.scope"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let ino = |p: &str| std::fs::metadata(root.join(p)).unwrap().ino();
        let (x, y, z) = (ino("x.scope"), ino("y.scope"), ino("z.scope"));
        let mut r = CgroupResolver::new(root.to_path_buf());
        r.walk();
        let all = [x, y, z];
        for _ in 0..10 {
            assert!(r.refresh(&all, |_| true).is_empty());
        }
        assert_eq!(r.checks, 0, "cgroups whose threads moved are not stat'ed");

        // x is removed: its threads are gone first, so it is idle in the next window.
        std::fs::remove_dir_all(root.join("x.scope")).unwrap();
        let checks = r.checks;
        assert_eq!(r.refresh(&all, |id| id != x), HashSet::from([x]));
        assert_eq!(r.checks, checks + 1);
        assert_eq!(r.path(x), None);

        // y goes quiet: checked in each of its first IDLE_CHECK_RECENT idle ticks, then once
        // every IDLE_CHECK_EVERY ticks.
        let live = [y, z];
        let checks = r.checks;
        for _ in 0..IDLE_CHECK_RECENT {
            assert!(r.refresh(&live, |id| id == z).is_empty());
        }
        assert_eq!(r.checks, checks + IDLE_CHECK_RECENT);
        let checks = r.checks;
        for _ in 0..4 * IDLE_CHECK_EVERY {
            assert!(r.refresh(&live, |id| id == z).is_empty());
        }
        assert_eq!(r.checks, checks + 4);

        // Removed after a long calm: forgotten within IDLE_CHECK_EVERY ticks.
        std::fs::remove_dir_all(root.join("y.scope")).unwrap();
        let found = (0..IDLE_CHECK_EVERY).find(|_| r.refresh(&live, |id| id == z).contains(&y));
        assert!(found.is_some(), "y not found removed");
        assert_eq!(r.path(y), None);

        // A change of the hierarchy's counts makes every cgroup checked, those that moved too.
        std::fs::write(root.join("cgroup.stat"), "nr_descendants 2\n").unwrap();
        let checks = r.checks;
        assert!(r.refresh(&[z], |_| true).is_empty());
        assert_eq!(r.checks, checks + 1);
        assert!(r.refresh(&[z], |_| true).is_empty());
        assert_eq!(r.checks, checks + 1, "unchanged counts: no check");

        // An unknown id makes a walk, which also finds that z (not checked: it moved) is gone;
        // an id that walk did not find makes no second walk.
        std::fs::remove_dir_all(root.join("z.scope")).unwrap();
        assert_eq!(
            r.refresh(&[z, u64::MAX], |_| true),
            HashSet::from([z, u64::MAX])
        );
        let walked = r.last_walk();
        assert_eq!(r.refresh(&[u64::MAX], |_| true), HashSet::from([u64::MAX]));
        assert_eq!(
            r.last_walk(),
            walked,
            "no second walk for an id no walk found"
        );
    }
}
