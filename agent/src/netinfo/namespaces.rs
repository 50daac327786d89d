//! The network namespaces of the host: the host's own, each process's (that is, each
//! container's), and the named ones under `/run/netns`; which container each belongs to.

use super::netlink::Rtnl;

use std::{
    collections::{BTreeSet, HashMap},
    os::{fd::AsFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
};

/// Named namespaces (`ip netns add`), and Docker's.
const NAMED_NETNS_DIRS: [&str; 3] = ["/run/netns", "/var/run/netns", "/var/run/docker/netns"];
/// Namespaces read at the same time.
const PARALLEL_READS: usize = 8;

/// A network namespace and how to enter it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetnsRef {
    /// The namespace's inode (`stat -L /proc/<pid>/ns/net`), as the probes key it.
    pub inode: u64,
    /// A file that `setns` can open: `/proc/<pid>/ns/net` or a bind mount under `/run/netns`.
    pub path: PathBuf,
    /// The `ip netns` (or Docker) name, when it has one.
    pub name: Option<String>,
    /// The host's namespace (that of pid 1, or this process's when pid 1's cannot be read).
    pub host: bool,
    /// A process in it, when there is one.
    pub pid: Option<u32>,
    /// Cgroup v2 paths (relative to the root) of the processes in it; empty for the host's,
    /// where every service runs.
    pub cgroups: BTreeSet<String>,
}

/// The cgroup v2 path of a process, from `/proc/<pid>/cgroup` (`0::/path`).
pub fn v2_cgroup_of(proc_cgroup: &str) -> Option<String> {
    proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim_end().to_owned())
        .filter(|p| !p.is_empty())
}

/// The initial pid namespace's inode (`PROC_PID_INIT_INO`, fixed since Linux 3.8).
const PID_NS_INIT_INO: u64 = 0xEFFF_FFFC;

/// The host's network namespace inode: `known` when the kernel fixes it (`NET_NS_INIT_INO`,
/// from BTF); else, in the host's pid namespace, pid 1's — or this process's own where pid 1
/// cannot be inspected (a sandbox's init), since a host process is on the host's network. In
/// a container on an older kernel it is unknown: pid 1 there is the container's.
pub fn host_inode(known: Option<u64>) -> Option<u64> {
    let ino = |path: &str| std::fs::metadata(path).map(|m| m.ino());
    known.or_else(|| {
        (ino("/proc/self/ns/pid").ok() == Some(PID_NS_INIT_INO))
            .then(|| {
                ino("/proc/1/ns/net")
                    .or_else(|_| ino("/proc/self/ns/net"))
                    .ok()
            })
            .flatten()
    })
}

/// The inode in a `/proc/<pid>/ns/net` link's text, `net:[4026531840]`.
fn netns_inode_of_link(link: &str) -> Option<u64> {
    link.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()
}

/// Every network namespace reachable from `/proc` and the named-namespace directories,
/// grouped by inode; `host` (from [`host_inode`]) is marked as the host's.
pub fn discover(host: Option<u64>) -> Vec<NetnsRef> {
    let mut by_inode: HashMap<u64, NetnsRef> = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let path = entry.path().join("ns/net");
            // The link's text (`net:[<inode>]`) rather than a stat through it: following the
            // link makes the kernel build a path to the namespace's file, per process, per walk.
            let Some(inode) = std::fs::read_link(&path)
                .ok()
                .as_deref()
                .and_then(|l| l.to_str())
                .and_then(netns_inode_of_link)
            else {
                continue;
            };
            let is_host = Some(inode) == host;
            let ns = by_inode.entry(inode).or_insert_with(|| NetnsRef {
                inode,
                path: path.clone(),
                name: None,
                host: is_host,
                pid: Some(pid),
                cgroups: BTreeSet::new(),
            });
            if !is_host
                && let Some(cg) = crate::files::kernel_text(entry.path().join("cgroup"))
                    .as_deref()
                    .and_then(v2_cgroup_of)
            {
                ns.cgroups.insert(cg);
            }
        }
    }
    for dir in NAMED_NETNS_DIRS {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            // A bind-mounted nsfs file; anything else in the directory is not a namespace.
            if meta.dev() == std::fs::metadata(dir).map(|m| m.dev()).unwrap_or(0) {
                continue;
            }
            let inode = meta.ino();
            let name = entry.file_name().to_string_lossy().into_owned();
            by_inode
                .entry(inode)
                .and_modify(|ns| {
                    ns.name.get_or_insert_with(|| name.clone());
                })
                .or_insert_with(|| NetnsRef {
                    inode,
                    path: path.clone(),
                    name: Some(name.clone()),
                    host: Some(inode) == host,
                    pid: None,
                    cgroups: BTreeSet::new(),
                });
        }
    }
    let mut all: Vec<NetnsRef> = by_inode.into_values().collect();
    all.sort_by_key(|n| (!n.host, n.inode));
    all
}

/// Runs `f` in a thread that has joined the namespace at `path` (without `setns` when it is
/// this process's own).
fn in_netns<T: Send>(path: &Path, f: impl FnOnce() -> T + Send) -> Result<T, String> {
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = std::fs::File::open(path)
                .map_err(|e| format!("{}: {e} (the namespace went away)", path.display()))?;
            let own = std::fs::metadata("/proc/thread-self/ns/net").map(|m| m.ino());
            if file.metadata().map(|m| m.ino()).ok() == own.ok() {
                return Ok(f());
            }
            // setns changes only this thread, which ends with this closure.
            use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};
            if let Err(err) =
                move_into_link_name_space(file.as_fd(), Some(LinkNameSpaceType::Network))
            {
                return Err(if err == rustix::io::Errno::PERM {
                    "reading another network namespace's links and routes means entering it, \
                     which needs CAP_SYS_ADMIN"
                        .to_owned()
                } else {
                    format!("setns({}): {err}", path.display())
                });
            }
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| Err("the namespace reader panicked".to_owned()))
    })
}

/// The ids the namespace at `observer` gives the namespaces at `others`, in order (`None`
/// for one it has given no id, or that went away); see [`Rtnl::nsid_of`].
pub(crate) fn nsids_in(observer: &Path, others: &[&Path]) -> Result<Vec<Option<i32>>, String> {
    in_netns(observer, || {
        let mut rtnl = Rtnl::open().map_err(|e| format!("{e}"))?;
        Ok(others
            .iter()
            .map(|path| {
                let file = std::fs::File::open(path).ok()?;
                rtnl.nsid_of(file.as_fd()).ok().flatten()
            })
            .collect())
    })?
}

/// Runs `f` on every namespace, a few at a time, in order.
pub(crate) fn each_netns<T: Send>(
    namespaces: &[NetnsRef],
    f: impl Fn(&NetnsRef) -> T + Sync,
) -> Vec<Result<T, String>> {
    let mut out = Vec::with_capacity(namespaces.len());
    for chunk in namespaces.chunks(PARALLEL_READS) {
        let results: Vec<Result<T, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|ns| {
                    let f = &f;
                    s.spawn(move || in_netns(&ns.path, || f(ns)))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("the namespace reader panicked".to_owned()))
                })
                .collect()
        });
        out.extend(results);
    }
    out
}

/// The cgroup all of a namespace's processes share (a pod's cgroup for its containers), by
/// path components; `None` when it is the root or there are none.
pub fn common_cgroup(paths: &[String]) -> Option<String> {
    let mut iter = paths.iter();
    let first: Vec<&str> = iter.next()?.split('/').filter(|c| !c.is_empty()).collect();
    let mut common = first.len();
    for p in iter {
        let comps: Vec<&str> = p.split('/').filter(|c| !c.is_empty()).collect();
        common = common.min(
            first
                .iter()
                .zip(comps.iter())
                .take_while(|(a, b)| a == b)
                .count(),
        );
    }
    (common > 0).then(|| format!("/{}", first[..common].join("/")))
}

/// The id of the cgroup `paths` share (the inode of its directory under `cgroup_root`), when
/// they share one below the root.
pub fn cgroup_id(cgroup_root: &Path, paths: &[String]) -> Option<u64> {
    let path = common_cgroup(paths)?;
    let dir = cgroup_root.join(path.trim_start_matches('/'));
    Some(std::fs::metadata(dir).ok()?.ino())
}

/// The inode of this process's network namespace (its own is always readable).
pub fn own_inode() -> Option<u64> {
    std::fs::metadata("/proc/self/ns/net").ok().map(|m| m.ino())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_netns_link_names_the_inode_a_stat_through_it_finds() {
        assert_eq!(netns_inode_of_link("net:[4026531840]"), Some(4026531840));
        assert_eq!(netns_inode_of_link("mnt:[4026531840]"), None);
        assert_eq!(netns_inode_of_link("net:[x]"), None);
        let link = std::fs::read_link("/proc/self/ns/net").expect("our own netns link");
        let stat = std::fs::metadata("/proc/self/ns/net").expect("stat through it");
        assert_eq!(
            netns_inode_of_link(link.to_str().expect("text")),
            Some(stat.ino())
        );
    }
}
