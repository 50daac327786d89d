//! Every cgroup hierarchy of the host (v2 and, on hybrid hosts, the v1 controllers), for tests
//! that create cgroups outside [`crate::TestCgroup`]: a container runtime's nested cgroups, or a
//! v1 cpuset next to a v2 test cgroup.

use std::path::{Path, PathBuf};

use stormwatch::identity::mountinfo::{self, Mount};

/// One mounted cgroup hierarchy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hierarchy {
    pub mount_point: PathBuf,
    /// `None` for cgroup v2; the v1 super options otherwise (`rw,cpuset`, `rw,name=systemd`…).
    pub v1_options: Option<String>,
}

impl Hierarchy {
    /// Whether this is the v1 hierarchy of `controller` (`cpuset`, `cpu`…).
    pub fn has_v1_controller(&self, controller: &str) -> bool {
        self.v1_options
            .as_deref()
            .is_some_and(|o| o.split(',').any(|opt| opt == controller))
    }
}

/// The mounts of the hierarchies' roots, one per hierarchy (several mounts of one hierarchy:
/// the shortest mount point), in mountinfo order.
pub fn hierarchies_of(mounts: &[Mount]) -> Vec<Hierarchy> {
    let mut out: Vec<(&str, Hierarchy)> = Vec::new();
    for m in mounts.iter().filter(|m| m.is_root()) {
        let v1_options = match m.fs_type.as_str() {
            "cgroup2" => None,
            "cgroup" => Some(m.super_options.join(",")),
            _ => continue,
        };
        let h = Hierarchy {
            mount_point: m.mount_point.clone(),
            v1_options,
        };
        match out.iter_mut().find(|(d, _)| *d == m.device) {
            Some((_, seen)) => {
                if h.mount_point.as_os_str().len() < seen.mount_point.as_os_str().len() {
                    *seen = h;
                }
            }
            None => out.push((&m.device, h)),
        }
    }
    out.into_iter().map(|(_, h)| h).collect()
}

/// This host's cgroup hierarchies.
pub fn hierarchies() -> Vec<Hierarchy> {
    hierarchies_of(&mountinfo::read_self().expect("cannot read /proc/self/mountinfo"))
}

/// The mount point of the v1 hierarchy of `controller`, on a hybrid host; `None` on a pure v2
/// host (or when that controller is not mounted as v1).
pub fn v1_root(controller: &str) -> Option<PathBuf> {
    hierarchies()
        .into_iter()
        .find(|h| h.has_v1_controller(controller))
        .map(|h| h.mount_point)
}

/// Removes the cgroup directories in `created` (relative to the hierarchy root `root`, as
/// [`missing_dirs`] lists them), deepest first. Only empty cgroups can be removed (rmdir), so
/// nothing else's cgroup is ever taken away; errors are returned as text for the caller.
pub fn remove_created_dirs(root: &Path, created: &[String]) -> Vec<String> {
    let mut errors = Vec::new();
    // Deepest first.
    let mut dirs: Vec<&String> = created.iter().collect();
    dirs.sort_by_key(|d| std::cmp::Reverse(d.len()));
    for rel in dirs {
        let dir = root.join(rel.trim_start_matches('/'));
        for _ in 0..100 {
            match std::fs::remove_dir(&dir) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                // EBUSY while the last task of a cgroup is still being released.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => {
                    errors.push(format!("rmdir {}: {e}", dir.display()));
                    break;
                }
            }
        }
        if dir.exists() {
            errors.push(format!("{} is still there", dir.display()));
        }
    }
    errors
}

/// The directories `rel` and each of its parents (`/a`, `/a/b`, `/a/b/c`) that do not exist yet
/// under `root`: what a runtime creating `rel` will create.
pub fn missing_dirs(root: &Path, rel: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut path = String::new();
    for part in rel.split('/').filter(|p| !p.is_empty()) {
        path.push('/');
        path.push_str(part);
        if !root.join(path.trim_start_matches('/')).exists() {
            out.push(path.clone());
        }
    }
    out
}

/// One field of a v2 `memory.stat` (`anon 123`, bytes), `None` when it is not there (older
/// kernels lack `percpu`, `kernel`).
pub fn memory_stat_field(stat: &str, key: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_hybrid_hierarchies() {
        let mi = "30 25 0:27 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n\
                  31 30 0:28 / /sys/fs/cgroup/unified rw shared:9 - cgroup2 cgroup2 rw\n\
                  33 30 0:30 / /sys/fs/cgroup/cpuset rw shared:13 - cgroup cgroup rw,cpuset\n\
                  34 30 0:31 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
                  99 30 0:30 /x /mnt/x rw - cgroup cgroup rw,cpuset\n";
        let h = hierarchies_of(&mountinfo::parse(mi));
        assert_eq!(h.len(), 3);
        assert_eq!(h[0].mount_point, PathBuf::from("/sys/fs/cgroup/unified"));
        assert_eq!(h[0].v1_options, None);
        assert!(h[1].has_v1_controller("cpuset"));
        assert!(h[2].has_v1_controller("cpu"));
        assert!(!h[2].has_v1_controller("cpuset"));
    }

    #[test]
    fn memory_stat_fields() {
        let stat = "anon 7340032\nfile 1048576\nkernel 210763776\nkernel_stack 65536\n\
                    percpu 199229440\nsock 0\n";
        assert_eq!(memory_stat_field(stat, "anon"), Some(7_340_032));
        assert_eq!(memory_stat_field(stat, "kernel"), Some(210_763_776));
        assert_eq!(memory_stat_field(stat, "percpu"), Some(199_229_440));
        assert_eq!(memory_stat_field(stat, "shmem"), None);
    }
}
