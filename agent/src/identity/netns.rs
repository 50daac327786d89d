//! Which container a network namespace belongs to: what the network receive probe credits a
//! namespace's received traffic to (the transmit probe knows the sending socket's cgroup; the
//! receive path knows only the namespace).

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    path::Path,
    time::{Duration, Instant},
};

use stormwatch_common::net::NetSenderKey;

use crate::netinfo::namespaces;

/// How often the processes' namespaces are re-read when nothing new shows up: a process moving
/// into an existing namespace (a new container of a running pod) changes nothing until then.
const NETNS_WALK_PERIOD: Duration = Duration::from_secs(60);
/// At most this often otherwise: a storm of new namespaces walks `/proc` once a second, not per
/// namespace.
const NETNS_WALK_MIN_GAP: Duration = Duration::from_secs(1);

/// Decides which container each network namespace belongs to, for the network receive probe: the
/// cgroup shared by everything that is known to live in it — the processes in it (when this
/// process may inspect them: `/proc/<pid>/ns/net` needs ptrace access) and the cgroups whose
/// sockets the transmit hook saw sending from it. The host's namespace and this process's
/// belong to no one.
///
/// `/proc` is walked when a namespace the last walk did not consider carries traffic or sends,
/// and at least once a minute (`NETNS_WALK_PERIOD`): not at every collection (thousands of
/// processes on a busy node).
#[derive(Debug)]
pub struct NetnsOwners {
    /// The host's namespace inode, when known.
    host: Option<u64>,
    /// The namespaces no container can own, whatever sends from them: the host's and this
    /// process's, found once (neither changes while the agent runs).
    nobodys: Vec<u32>,
    /// Namespace inode → cgroup paths of its processes, from the last walk.
    members: HashMap<u64, BTreeSet<String>>,
    /// Namespaces the last walk found or already knew of.
    considered: HashSet<u64>,
    walked_at: Option<Instant>,
}

impl NetnsOwners {
    /// The owners of a host whose namespace inode is `host`, when known.
    pub fn new(host: Option<u64>) -> Self {
        Self {
            host,
            nobodys: [host, namespaces::own_inode()]
                .into_iter()
                .flatten()
                .map(|n| n as u32)
                .collect(),
            members: HashMap::new(),
            considered: HashSet::new(),
            walked_at: None,
        }
    }

    /// Namespace inode → owning cgroup id (0: nobody's), cgroups named under `v2_root`.
    /// `active`: the namespaces that carried traffic since the last call; `senders` the
    /// (namespace, cgroup) pairs the transmit probe saw sending; `path_of` names cgroup ids.
    pub fn decide(
        &mut self,
        v2_root: &Path,
        active: impl IntoIterator<Item = u64>,
        senders: &[NetSenderKey],
        path_of: impl Fn(u64) -> Option<String>,
    ) -> HashMap<u32, u64> {
        let seen: HashSet<u64> = active
            .into_iter()
            .chain(senders.iter().map(|k| u64::from(k.netns)))
            .collect();
        let since = self.walked_at.map(|t| t.elapsed());
        let stale = since.is_none_or(|s| s >= NETNS_WALK_PERIOD);
        let news = seen.iter().any(|n| !self.considered.contains(n));
        if stale || (news && since.is_none_or(|s| s >= NETNS_WALK_MIN_GAP)) {
            self.members.clear();
            self.considered = seen;
            for ns in namespaces::discover(self.host) {
                self.considered.insert(ns.inode);
                // A namespace known only by name (no process seen in it) says nothing yet.
                if !ns.host && !ns.cgroups.is_empty() {
                    self.members.entry(ns.inode).or_default().extend(ns.cgroups);
                }
            }
            self.walked_at = Some(Instant::now());
        }
        let mut members = self.members.clone();
        for key in senders {
            if let Some(path) = path_of(key.cgroup) {
                members
                    .entry(u64::from(key.netns))
                    .or_default()
                    .insert(path);
            }
        }
        let mut owners: HashMap<u32, u64> = members
            .into_iter()
            .filter_map(|(netns, paths)| {
                let paths: Vec<String> = paths.into_iter().collect();
                let owner = namespaces::cgroup_id(v2_root, &paths);
                Some((u32::try_from(netns).ok()?, owner.unwrap_or(0)))
            })
            .collect();
        // 0: nobody's (the kernel never claims a namespace that has an entry). The host's
        // services send from the host's namespace: without this, the first one seen sending
        // would be credited with everything the node receives.
        for nobodys in &self.nobodys {
            owners.insert(*nobodys, 0);
        }
        owners
    }

    /// The namespaces no container can own, whatever sends from them: the host's (when known)
    /// and this process's.
    pub fn nobodys(&self) -> &[u32] {
        &self.nobodys
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use super::*;

    #[test]
    fn the_hosts_namespace_is_nobodys_and_a_senders_is_its_cgroups() {
        // This process's own cgroup (v2), a real directory to name.
        let own = std::fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup");
        let path = namespaces::v2_cgroup_of(&own).expect("a v2 cgroup path");
        let root = super::super::find_v2_root().expect("a v2 hierarchy");
        let inode = std::fs::metadata(root.join(path.trim_start_matches('/')))
            .expect("the cgroup's directory")
            .ino();
        // Namespace inodes no real namespace has.
        let (host, pod) = (7, 8);
        let senders = [
            NetSenderKey {
                netns: host,
                _pad: 0,
                cgroup: 42,
            },
            NetSenderKey {
                netns: pod,
                _pad: 0,
                cgroup: 42,
            },
        ];
        let mut owners = NetnsOwners::new(Some(u64::from(host)));
        let path_of = |id: u64| (id == 42).then(|| path.clone());
        let decided = owners.decide(&root, [], &senders, path_of);
        assert_eq!(decided.get(&host), Some(&0), "the host's: nobody's");
        // A cgroup below the root is an owner; the root itself is nobody.
        let expected = if path == "/" { 0 } else { inode };
        assert_eq!(decided.get(&pod), Some(&expected));
        // Nothing new: no second walk of /proc.
        let walked = owners.walked_at;
        owners.decide(&root, [u64::from(pod)], &senders, path_of);
        assert_eq!(owners.walked_at, walked);
    }

    #[test]
    fn nobodys_namespaces_are_the_hosts_and_our_own_and_the_receive_probe_is_told_them() {
        let own = namespaces::own_inode().expect("this process's namespace") as u32;
        assert_eq!(NetnsOwners::new(Some(7)).nobodys(), [7, own]);
        assert_eq!(NetnsOwners::new(None).nobodys(), [own]);
        // What the probe is told fits the kernel's slots.
        assert!(
            NetnsOwners::new(Some(7)).nobodys().len()
                <= stormwatch_common::net::NOBODYS_NETNS_SLOTS as usize
        );
    }
}
