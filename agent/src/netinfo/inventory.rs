//! The MTU inventory: every network namespace of the host (the host's, each process's — that
//! is, each container's —, and the named ones under `/run/netns`), each of its interfaces with
//! its kind, MTU and the encapsulation overhead its kind implies, the underlay each tunnel
//! sends through, the uplink (default route) and the routes that set an MTU; and the
//! namespace's kernel counters ([`super::snmp`]).
//!
//! Each namespace is read once (namespaces are grouped by inode) over rtnetlink: the agent's own
//! directly (no capability needed), any other from a short-lived thread that joins it with
//! `setns(2)` — which takes CAP_SYS_ADMIN: without it, those namespaces' interfaces are known
//! only from the probes (the MTU on their packets) and their counters from
//! `/proc/<pid>/net/snmp`.

use std::{collections::HashMap, path::Path};

use netlink_packet_route::{AddressFamily, link::LinkLayerType};
use serde::Serialize;

use stormwatch_common::net::{NetIfInfo, NetIfKey};

pub use super::encapsulation::Encapsulation;
use super::{
    encapsulation::{TunnelAttrs, encapsulation},
    links::{Link, kind_from, kind_of, link_type, links_from},
    namespaces::{NetnsRef, discover, each_netns, nsids_in},
    netlink::Rtnl,
    routes::{Route, default_route, route_from},
    snmp::Snmp,
};

/// The calling thread's namespace's counters.
fn read_snmp_here() -> Option<Snmp> {
    let snmp = crate::files::kernel_text("/proc/thread-self/net/snmp")?;
    let snmp6 = crate::files::kernel_text("/proc/thread-self/net/snmp6");
    Some(Snmp::from_texts(&snmp, snmp6.as_deref()))
}

/// A process's namespace's counters, read from outside it (`/proc/<pid>/net` shows the
/// process's namespace; no capability needed).
fn read_snmp_of(pid: u32) -> Option<Snmp> {
    let snmp = crate::files::kernel_text(format!("/proc/{pid}/net/snmp"))?;
    let snmp6 = crate::files::kernel_text(format!("/proc/{pid}/net/snmp6"));
    Some(Snmp::from_texts(&snmp, snmp6.as_deref()))
}

/// Every namespace's counters now, by inode (for the start of a window): through a process in
/// it when there is one, else from inside it.
pub fn snmp_snapshot(namespaces: &[NetnsRef]) -> HashMap<u64, Snmp> {
    let (with_pid, named): (Vec<&NetnsRef>, Vec<&NetnsRef>) =
        namespaces.iter().partition(|ns| ns.pid.is_some());
    let named: Vec<NetnsRef> = named.into_iter().cloned().collect();
    with_pid
        .into_iter()
        .filter_map(|ns| Some((ns.inode, read_snmp_of(ns.pid?)?)))
        .chain(
            named
                .iter()
                .zip(each_netns(&named, |_| read_snmp_here()))
                .filter_map(|(ns, r)| Some((ns.inode, r.ok()??))),
        )
        .collect()
}

/// A route that sets an MTU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RouteMtu {
    pub destination: String,
    pub device: Option<String>,
    pub table: Option<String>,
    pub mtu: u32,
}

/// Where a tunnel's packets go once encapsulated, and the largest packet that path takes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Underlay {
    pub name: String,
    pub ifindex: u32,
    pub mtu: u32,
    /// The MTU the route to the remote sets, when it sets one.
    pub route_mtu: Option<u32>,
    /// The smaller of the two: the largest outer packet that leaves without fragmentation.
    pub path_mtu: u32,
    /// How it was found: `link` (the tunnel's lower device), `route to <remote>`, or
    /// `default route`.
    pub found_by: String,
}

/// A veth's other end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Peer {
    pub netns: u64,
    pub ifindex: u32,
    pub name: String,
}

/// One interface of one namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Interface {
    pub name: String,
    pub ifindex: u32,
    pub kind: String,
    pub mtu: u32,
    /// Bytes its kind adds to each packet: 0 for plain devices, `null` when unknown.
    pub encapsulation_overhead: Option<u32>,
    /// The tunnel's encapsulation, for tunnels.
    pub encapsulation: Option<Encapsulation>,
    /// Why the overhead is unknown, when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encapsulation_note: Option<String>,
    /// A tunnel's underlay.
    pub underlay: Option<Underlay>,
    /// A veth's other end (in this or another namespace).
    pub peer: Option<Peer>,
    pub master: Option<String>,
    pub operstate: Option<String>,
    /// Carries this namespace's default route.
    pub uplink: bool,
}

/// One namespace, read in full.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Namespace {
    pub inode: u64,
    pub name: Option<String>,
    pub host: bool,
    pub pid: Option<u32>,
    pub cgroups: Vec<String>,
    pub uplink: Option<String>,
    /// The uplink's MTU, or the default route's `mtu` when smaller.
    pub uplink_mtu: Option<u32>,
    pub route_mtus: Vec<RouteMtu>,
    pub interfaces: Vec<Interface>,
    /// The kernel's counters now.
    #[serde(skip)]
    pub snmp: Option<Snmp>,
    /// What could not be read.
    pub error: Option<String>,
}

impl Namespace {
    pub fn interface(&self, ifindex: u32) -> Option<&Interface> {
        self.interfaces.iter().find(|i| i.ifindex == ifindex)
    }

    /// A label for messages: `host`, `netns <name>`, or `netns <inode> (pid <pid>)`.
    pub fn label(&self) -> String {
        match (&self.name, self.host, self.pid) {
            (_, true, _) => "host".to_owned(),
            (Some(n), _, _) => format!("netns {n}"),
            (None, _, Some(pid)) => format!("netns {} (pid {pid})", self.inode),
            (None, _, None) => format!("netns {}", self.inode),
        }
    }
}

/// What is read inside one namespace.
struct Raw {
    links: Result<Vec<Link>, String>,
    routes: Vec<Route>,
    /// `route get fibmatch <remote>` of each tunnel with a remote, by remote.
    remote_routes: HashMap<String, Route>,
    snmp: Option<Snmp>,
}

/// Reads the calling thread's namespace over rtnetlink.
fn read_here() -> Raw {
    let mut rtnl = match Rtnl::open() {
        Ok(r) => r,
        Err(e) => {
            return Raw {
                links: Err(format!("{e}")),
                routes: Vec::new(),
                remote_routes: HashMap::new(),
                snmp: read_snmp_here(),
            };
        }
    };
    let messages = rtnl.links();
    let names: HashMap<u32, String> = messages
        .iter()
        .flatten()
        .flat_map(|m| {
            m.attributes.iter().filter_map(|a| match a {
                netlink_packet_route::link::LinkAttribute::IfName(n) => {
                    Some((m.header.index, n.clone()))
                }
                _ => None,
            })
        })
        .collect();
    let links = messages
        .map(|m| links_from(&m))
        .map_err(|e| format!("reading the links: {e}"));
    let mut routes = Vec::new();
    // IPv6 may be disabled: then there is nothing to add.
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        if let Ok(messages) = rtnl.routes(family) {
            routes.extend(messages.iter().filter_map(|m| route_from(m, &names)));
        }
    }
    let mut remote_routes = HashMap::new();
    if let Ok(links) = &links {
        for l in links {
            let kind = kind_of(l);
            if let Ok(Some(e)) = encapsulation(&kind, &l.tunnel)
                && let Some(remote) = l.tunnel.remote
                && let Some(key) = e.remote
                && !remote_routes.contains_key(&key)
                && let Ok(Some(m)) = rtnl.route_to(remote)
                && let Some(r) = route_from(&m, &names)
            {
                remote_routes.insert(key, r);
            }
        }
    }
    Raw {
        links,
        routes,
        remote_routes,
        snmp: read_snmp_here(),
    }
}

/// Builds a namespace's inventory from what was read in it (pure).
fn assemble(ns: &NetnsRef, raw: Raw) -> Namespace {
    let links = match raw.links {
        Ok(l) => l,
        Err(e) => {
            return Namespace {
                inode: ns.inode,
                name: ns.name.clone(),
                host: ns.host,
                pid: ns.pid,
                cgroups: ns.cgroups.iter().cloned().collect(),
                snmp: raw.snmp,
                error: Some(e),
                ..Namespace::default()
            };
        }
    };
    let by_name: HashMap<&str, &Link> = links.iter().map(|l| (l.name.as_str(), l)).collect();
    let default = default_route(&raw.routes);
    let uplink = default.and_then(|r| r.dev.clone());
    let uplink_mtu = default.and_then(|r| {
        let dev = by_name.get(r.dev.as_deref()?)?;
        Some(r.mtu.map_or(dev.mtu, |m| m.min(dev.mtu)))
    });
    let underlay_of = |e: &Encapsulation, l: &Link| -> Option<Underlay> {
        let (dev_name, route_mtu, found_by) = if let Some(r) =
            e.remote.as_ref().and_then(|rem| raw.remote_routes.get(rem))
        {
            (
                r.dev.clone()?,
                r.mtu,
                format!("route to {}", e.remote.as_deref().unwrap_or("?")),
            )
        } else if let Some(lower) = l.link.as_ref().filter(|n| by_name.contains_key(n.as_str())) {
            (lower.clone(), None, "link".to_owned())
        } else {
            (
                uplink.clone()?,
                default.and_then(|r| r.mtu),
                "default route".to_owned(),
            )
        };
        let dev = by_name.get(dev_name.as_str())?;
        if dev.ifindex == l.ifindex {
            return None;
        }
        Some(Underlay {
            name: dev.name.clone(),
            ifindex: dev.ifindex,
            mtu: dev.mtu,
            route_mtu,
            path_mtu: route_mtu.map_or(dev.mtu, |m| m.min(dev.mtu)),
            found_by,
        })
    };
    let interfaces = links
        .iter()
        .map(|l| {
            let kind = kind_of(l);
            let (overhead, encap, note) = match encapsulation(&kind, &l.tunnel) {
                Ok(None) => (Some(0), None, None),
                Ok(Some(e)) => (Some(e.overhead), Some(e), None),
                Err(why) => (None, None, Some(why)),
            };
            let underlay = encap.as_ref().and_then(|e| underlay_of(e, l));
            // A veth whose peer is in this namespace names it.
            let peer = (kind == "veth" && l.link_netnsid.is_none())
                .then(|| l.link.as_ref().and_then(|n| by_name.get(n.as_str())))
                .flatten()
                .map(|p| Peer {
                    netns: ns.inode,
                    ifindex: p.ifindex,
                    name: p.name.clone(),
                });
            Interface {
                name: l.name.clone(),
                ifindex: l.ifindex,
                kind,
                mtu: l.mtu,
                encapsulation_overhead: overhead,
                encapsulation: encap,
                encapsulation_note: note,
                underlay,
                peer,
                master: l.master.clone(),
                operstate: l.operstate.clone(),
                uplink: uplink.as_deref() == Some(l.name.as_str()),
            }
        })
        .collect();
    let route_mtus = raw
        .routes
        .iter()
        .filter_map(|r| {
            Some(RouteMtu {
                destination: r.dst.clone(),
                device: r.dev.clone(),
                table: r.table.clone(),
                mtu: r.mtu?,
            })
        })
        .collect();
    Namespace {
        inode: ns.inode,
        name: ns.name.clone(),
        host: ns.host,
        pid: ns.pid,
        cgroups: ns.cgroups.iter().cloned().collect(),
        uplink,
        uplink_mtu,
        route_mtus,
        interfaces,
        snmp: raw.snmp,
        error: None,
    }
}

/// Pairs veths whose peers are in other namespaces. A veth names its peer's index
/// (`link_index`) and the peer's namespace by an id that means something only in its own
/// namespace (`link_netnsid`); the peer is a veth elsewhere whose own `link_index` is this
/// one's index. When several namespaces hold such a veth — namespaces made alike, as a test
/// harness or a runtime makes them, have both ends at index 2 — `nsids(observer, candidates)`
/// asks the veth's namespace which ids it gives the candidates' namespaces, and the candidate
/// whose id is the veth's `link_netnsid` is its peer. A pair that stays ambiguous, or whose
/// question goes unanswered, is left unpaired: no peer rather than a wrong one.
pub fn pair_veths(
    namespaces: &mut [Namespace],
    links: &HashMap<u64, Vec<Link>>,
    nsids: impl Fn(u64, &[u64]) -> Option<Vec<Option<i32>>>,
) {
    let mut found: Vec<(usize, usize, Peer)> = Vec::new();
    for (ni, ns) in namespaces.iter().enumerate() {
        let Some(ns_links) = links.get(&ns.inode) else {
            continue;
        };
        for l in ns_links
            .iter()
            .filter(|l| l.info_kind.as_deref() == Some("veth"))
        {
            let (Some(netnsid), Some(peer_index)) = (l.link_netnsid, l.link_index) else {
                continue;
            };
            let mut candidates: Vec<(u64, &Link)> = links
                .iter()
                .filter(|(inode, _)| **inode != ns.inode)
                .flat_map(|(inode, ls)| ls.iter().map(move |p| (*inode, p)))
                .filter(|(_, p)| {
                    p.info_kind.as_deref() == Some("veth")
                        && p.link_netnsid.is_some()
                        && p.ifindex == peer_index
                        && p.link_index == Some(l.ifindex)
                })
                .collect();
            if candidates.len() > 1 {
                let inodes: Vec<u64> = candidates.iter().map(|(inode, _)| *inode).collect();
                let ids = nsids(ns.inode, &inodes).unwrap_or_default();
                candidates = candidates
                    .into_iter()
                    .zip(ids)
                    .filter(|(_, id)| *id == Some(netnsid))
                    .map(|(c, _)| c)
                    .collect();
            }
            if let [(inode, p)] = candidates[..]
                && let Some(ii) = ns.interfaces.iter().position(|i| i.ifindex == l.ifindex)
            {
                found.push((
                    ni,
                    ii,
                    Peer {
                        netns: inode,
                        ifindex: p.ifindex,
                        name: p.name.clone(),
                    },
                ));
            }
        }
    }
    for (ni, ii, peer) in found {
        namespaces[ni].interfaces[ii].peer = Some(peer);
    }
}

/// An interface as the probes saw it: what the kernel's `net_device` said when they first saw
/// it (name, kind, link type) and its MTU at its last packet. The inventory of the namespaces
/// the agent cannot read over rtnetlink: entering another namespace takes CAP_SYS_ADMIN, and
/// without the host's pid namespace most of them are not even visible in `/proc`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenInterface {
    pub name: String,
    pub kind: String,
    pub mtu: u32,
}

impl SeenInterface {
    /// From the probes' record and the MTU at the last packet: the kind as [`kind_of`] names a
    /// link read over rtnetlink (the link type's name for devices without a kind).
    pub fn from_kernel(info: &NetIfInfo, mtu: u32) -> Self {
        let text = |b: &[u8]| {
            let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
            String::from_utf8_lossy(&b[..end]).into_owned()
        };
        let kind = text(&info.kind);
        Self {
            name: text(&info.name),
            kind: kind_from(
                Some(kind.as_str()).filter(|k| !k.is_empty()),
                &link_type(LinkLayerType::from(info.link_type)),
            ),
            mtu,
        }
    }

    fn interface(&self, ifindex: u32) -> Interface {
        // Only kinds that add nothing have a known overhead without the link's attributes: a
        // tunnel's depends on its outer IP version and options, read over rtnetlink.
        let (overhead, note) = match encapsulation(&self.kind, &TunnelAttrs::default()) {
            Ok(None) => (Some(0), None),
            Ok(Some(_)) => (
                None,
                Some(
                    "a tunnel's overhead depends on its attributes, read over rtnetlink in its \
                     namespace"
                        .to_owned(),
                ),
            ),
            Err(why) => (None, Some(why)),
        };
        Interface {
            name: self.name.clone(),
            ifindex,
            kind: self.kind.clone(),
            mtu: self.mtu,
            encapsulation_overhead: overhead,
            encapsulation_note: note,
            ..Interface::default()
        }
    }
}

/// Why a namespace's interfaces are the probes' view.
const SEEN_ONLY: &str = "interfaces as the probes saw them (those that carried traffic: name, \
                         kind, MTU); links, routes and tunnels need rtnetlink inside the namespace";

/// Adds what the probes saw in namespaces that could not be read: `seen` by (namespace inode,
/// ifindex); `host` the host's namespace inode when known.
pub fn add_seen(
    out: &mut Vec<Namespace>,
    seen: &HashMap<NetIfKey, SeenInterface>,
    host: Option<u64>,
) {
    let mut by_netns: std::collections::BTreeMap<u64, Vec<Interface>> = Default::default();
    for (k, i) in seen {
        by_netns
            .entry(u64::from(k.netns))
            .or_default()
            .push(i.interface(k.ifindex));
    }
    for (inode, mut interfaces) in by_netns {
        interfaces.sort_by_key(|i| i.ifindex);
        match out.iter_mut().find(|ns| ns.inode == inode) {
            // Read over rtnetlink: that is the whole truth.
            Some(ns) if ns.error.is_none() => {}
            Some(ns) => {
                ns.interfaces = interfaces;
                let why = ns.error.take().unwrap_or_default();
                ns.error = Some(format!("{why}; {SEEN_ONLY}"));
            }
            None => out.push(Namespace {
                inode,
                host: Some(inode) == host,
                interfaces,
                error: Some(format!(
                    "no process of it is visible to the agent; {SEEN_ONLY}"
                )),
                ..Namespace::default()
            }),
        }
    }
    out.sort_by_key(|n| (!n.host, n.inode));
}

/// The full inventory: every namespace, read once each.
pub fn collect(namespaces: &[NetnsRef]) -> Vec<Namespace> {
    let raws = each_netns(namespaces, |_| read_here());
    let mut links_by_ns: HashMap<u64, Vec<Link>> = HashMap::new();
    let mut out = Vec::with_capacity(namespaces.len());
    for (ns, raw) in namespaces.iter().zip(raws) {
        match raw {
            Ok(raw) => {
                if let Ok(l) = &raw.links {
                    links_by_ns.insert(ns.inode, l.clone());
                }
                out.push(assemble(ns, raw));
            }
            // The namespace cannot be entered (no CAP_SYS_ADMIN), or it went away: what is
            // known without entering it — its counters — and why the rest is missing.
            Err(e) => {
                log::debug!("network namespace {}: {e}", ns.inode);
                let snmp = ns.pid.and_then(read_snmp_of);
                if snmp.is_some() || !e.contains("went away") {
                    out.push(assemble(
                        ns,
                        Raw {
                            links: Err(e),
                            routes: Vec::new(),
                            remote_routes: HashMap::new(),
                            snmp,
                        },
                    ));
                }
            }
        }
    }
    let paths: HashMap<u64, &Path> = namespaces
        .iter()
        .map(|n| (n.inode, n.path.as_path()))
        .collect();
    pair_veths(&mut out, &links_by_ns, |observer, candidates| {
        let others: Vec<&Path> = candidates
            .iter()
            .map(|c| paths.get(c).copied())
            .collect::<Option<_>>()?;
        nsids_in(paths.get(&observer)?, &others)
            .inspect_err(|e| log::debug!("network namespace {observer}: {e}"))
            .ok()
    });
    out
}

/// Links and routes of every namespace, kept for up to `max_age` while the set of namespaces
/// stays the same (the daemon re-reads its inventory at every diagnosis step: entering each
/// pod's namespace over rtnetlink every few seconds is most of its network cost, for MTUs that
/// change once in a pod's life). The namespaces' processes and counters are always current.
/// With a zero `max_age` nothing is kept.
#[derive(Debug, Default)]
pub struct InventoryCache {
    max_age: std::time::Duration,
    read: Option<(std::time::Instant, Vec<u64>, Vec<Namespace>)>,
}

impl InventoryCache {
    pub fn new(max_age: std::time::Duration) -> Self {
        Self {
            max_age,
            read: None,
        }
    }

    /// [`collect`], or the last one with today's processes and counters.
    pub fn collect(&mut self, namespaces: &[NetnsRef]) -> Vec<Namespace> {
        let inodes: Vec<u64> = namespaces.iter().map(|n| n.inode).collect();
        if let Some((at, read_inodes, read)) = &self.read
            && at.elapsed() < self.max_age
            && *read_inodes == inodes
        {
            let snmp = snmp_snapshot(namespaces);
            return read
                .iter()
                .zip(namespaces)
                .map(|(ns, now)| Namespace {
                    name: now.name.clone(),
                    pid: now.pid,
                    cgroups: now.cgroups.iter().cloned().collect(),
                    snmp: snmp.get(&ns.inode).copied(),
                    ..ns.clone()
                })
                .collect();
        }
        let out = collect(namespaces);
        // `collect` gives one entry per namespace, in order, except those that went away
        // meanwhile: then it is not worth keeping.
        if !self.max_age.is_zero() && out.len() == namespaces.len() {
            self.read = Some((std::time::Instant::now(), inodes, out.clone()));
        }
        out
    }
}

/// The network namespaces over a window: their counters at the start; at the end, the full
/// inventory and the counters' change.
pub struct NetWatch {
    /// The host's namespace inode, when known (see [`super::namespaces::host_inode`]).
    host: Option<u64>,
    start: HashMap<u64, Snmp>,
    /// The namespaces found at the start: those whose counters could not be read then have no
    /// change to report; and another window that ends at that very moment reuses them (a walk
    /// of `/proc` per process is the costly part).
    walk: Vec<NetnsRef>,
}

/// Opaque in debug output: its namespaces' handles say nothing read.
impl std::fmt::Debug for NetWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NetWatch")
    }
}

/// The inventory at the end of a window, and each namespace's counters over it.
pub struct NetState {
    pub namespaces: Vec<Namespace>,
    pub snmp: HashMap<u64, Snmp>,
}

impl NetWatch {
    pub fn start(host: Option<u64>) -> Self {
        let namespaces = discover(host);
        Self {
            host,
            start: snmp_snapshot(&namespaces),
            walk: namespaces,
        }
    }

    /// The namespaces found when this window started.
    pub fn walk(&self) -> &[NetnsRef] {
        &self.walk
    }

    /// `seen`: the interfaces the probes saw, for the namespaces that cannot be read; `cache`
    /// what may be reused of the last inventory.
    pub fn finish(
        &self,
        seen: &HashMap<NetIfKey, SeenInterface>,
        cache: &mut InventoryCache,
    ) -> NetState {
        self.finish_with(&discover(self.host), seen, cache)
    }

    /// [`finish`](Self::finish) with the namespaces found now (`walk`: found by a window that
    /// starts at this moment).
    pub fn finish_with(
        &self,
        walk: &[NetnsRef],
        seen: &HashMap<NetIfKey, SeenInterface>,
        cache: &mut InventoryCache,
    ) -> NetState {
        let mut namespaces = cache.collect(walk);
        add_seen(&mut namespaces, seen, self.host);
        let snmp = namespaces
            .iter()
            .filter_map(|ns| {
                let now = ns.snmp?;
                let change = match self.start.get(&ns.inode) {
                    Some(then) => now.since(then),
                    // Created during the window: its counters started at zero.
                    None if !self.walk.iter().any(|w| w.inode == ns.inode) => now,
                    None => return None,
                };
                Some((ns.inode, change))
            })
            .collect();
        NetState { namespaces, snmp }
    }
}

#[cfg(test)]
mod tests;
