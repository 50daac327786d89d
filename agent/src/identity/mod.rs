//! Identity: which cgroup a cgroup id names.
//!
//! In cgroup v2 the id that `bpf_get_current_cgroup_id()` returns is the inode number of the
//! cgroup's directory in the v2 hierarchy. That hierarchy is at `/sys/fs/cgroup` on a pure-v2
//! host and usually at `/sys/fs/cgroup/unified` on a hybrid one; the mount table says which.
//! The id → path map is a cache: it is re-walked only when an unknown id shows up (at most once
//! per refresh), and ids whose directory is gone are forgotten.

pub mod container;
pub mod kubelet;
pub mod limits;
pub mod mountinfo;
pub mod netns;
pub mod workload;

use std::{
    collections::{HashMap, HashSet},
    os::unix::fs::MetadataExt,
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
    let mountinfo =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(CgroupError::MountInfo)?;
    v2_root_from_mountinfo(&mountinfo).ok_or(CgroupError::NoV2Hierarchy)
}

/// The cgroup id → path cache.
pub struct CgroupResolver {
    root: PathBuf,
    paths: HashMap<u64, String>,
    last_walk: Option<Instant>,
}

impl CgroupResolver {
    pub fn new(root: PathBuf) -> Self {
        Self {
            root,
            paths: HashMap::new(),
            last_walk: None,
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

    /// Checks the ids in `ids`: a known id whose directory is gone (or now has another inode)
    /// is forgotten, and an unknown id makes one walk of the hierarchy. Returns the ids that
    /// are gone. Callers pass ids read before this call, so a cgroup that exists is always
    /// found by the walk. Cost: one stat per known id, one walk only when something is new.
    pub fn refresh<'a>(&mut self, ids: impl IntoIterator<Item = &'a u64>) -> HashSet<u64> {
        let mut gone = HashSet::new();
        let mut missing = Vec::new();
        for &id in ids {
            match self.paths.get(&id) {
                Some(rel) => {
                    let full = self.root.join(rel.trim_start_matches('/'));
                    if std::fs::metadata(full).map(|m| m.ino()).ok() != Some(id) {
                        self.paths.remove(&id);
                        gone.insert(id);
                    }
                }
                None => missing.push(id),
            }
        }
        if !missing.is_empty() {
            self.walk();
            gone.extend(
                missing
                    .into_iter()
                    .filter(|id| !self.paths.contains_key(id)),
            );
        }
        gone
    }

    /// When the hierarchy was last walked.
    pub fn last_walk(&self) -> Option<Instant> {
        self.last_walk
    }

    /// Walks the whole hierarchy, replacing the cache: ids of removed cgroups are dropped.
    pub fn walk(&mut self) {
        let mut paths = HashMap::new();
        let mut stack = vec![(self.root.clone(), String::from("/"))];
        while let Some((dir, rel)) = stack.pop() {
            let Ok(meta) = std::fs::metadata(&dir) else {
                continue;
            };
            paths.insert(meta.ino(), rel.clone());
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
                    stack.push((entry.path(), child_rel));
                }
            }
        }
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
        assert!(r.refresh(&[a]).is_empty());
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
        assert_eq!(r.refresh(&[a, b, u64::MAX]), HashSet::from([b, u64::MAX]));
        assert_eq!(r.path(b), None);
        assert_eq!(r.path(a), Some("/a.slice"));
    }
}
