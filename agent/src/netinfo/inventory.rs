//! The MTU inventory: every network namespace of the host (the host's, each process's — that
//! is, each container's —, and the named ones under `/run/netns`), each of its interfaces with
//! its kind, MTU and the encapsulation overhead its kind implies, the underlay each tunnel
//! sends through, the uplink (default route) and the routes that set an MTU; and the
//! namespace's kernel counters ([`super::snmp`]).
//!
//! Each namespace is read once (namespaces are grouped by inode), from a short-lived thread
//! that joins it with `setns(2)`: `/proc/thread-self/net/*` then shows that namespace, and the
//! `ip -d -j` commands it starts (iproute2's JSON, no netlink code here) inherit it.

use std::{collections::HashMap, process::Command};

use serde::Serialize;
use serde_json::Value;

use super::{
    namespaces::{NetnsRef, discover, each_netns},
    snmp::Snmp,
};

/// The calling thread's namespace's counters.
fn read_snmp_here() -> Option<Snmp> {
    let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp").ok()?;
    let snmp6 = std::fs::read_to_string("/proc/thread-self/net/snmp6").ok();
    Some(Snmp::from_texts(&snmp, snmp6.as_deref()))
}

/// Every namespace's counters now, by inode (for the start of a window).
pub fn snmp_snapshot(namespaces: &[NetnsRef]) -> HashMap<u64, Snmp> {
    namespaces
        .iter()
        .zip(each_netns(namespaces, |_| read_snmp_here()))
        .filter_map(|(ns, r)| Some((ns.inode, r.ok()??)))
        .collect()
}

// ---- interfaces -----------------------------------------------------------------------------

/// One link as `ip -d -j link show` prints it (only what the inventory uses).
#[derive(Clone, Debug, PartialEq)]
pub struct Link {
    pub ifindex: u32,
    pub name: String,
    pub mtu: u32,
    pub link_type: String,
    /// `linkinfo.info_kind` (`veth`, `vxlan`, …); none for physical devices and loopback.
    pub info_kind: Option<String>,
    /// `linkinfo.info_data`: the kind's attributes (a tunnel's remote, flags…).
    pub info_data: Value,
    /// `link`: the lower device (or, for a veth, the peer) by name, when in this namespace.
    pub link: Option<String>,
    /// `link_index`: the lower device's (peer's) index, possibly in another namespace.
    pub link_index: Option<u32>,
    /// The lower device (peer) is in another namespace.
    pub link_other_netns: bool,
    pub master: Option<String>,
    pub operstate: Option<String>,
}

fn as_u32(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|n| u32::try_from(n).ok())
}

/// Parses `ip -d -j link show`.
pub fn parse_links(json: &str) -> Result<Vec<Link>, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| format!("ip link JSON: {e}"))?;
    let arr = v.as_array().ok_or("ip link JSON is not a list")?;
    Ok(arr
        .iter()
        .filter_map(|l| {
            let info = &l["linkinfo"];
            Some(Link {
                ifindex: as_u32(&l["ifindex"])?,
                name: l["ifname"].as_str()?.to_owned(),
                mtu: as_u32(&l["mtu"])?,
                link_type: l["link_type"].as_str().unwrap_or("").to_owned(),
                info_kind: info["info_kind"].as_str().map(str::to_owned),
                info_data: info["info_data"].clone(),
                link: l["link"].as_str().map(str::to_owned),
                link_index: as_u32(&l["link_index"]),
                link_other_netns: !l["link_netnsid"].is_null(),
                master: l["master"].as_str().map(str::to_owned),
                operstate: l["operstate"].as_str().map(str::to_owned),
            })
        })
        .collect())
}

/// The kind of a link: its `info_kind`, else `loopback` or `physical` (a driver's device
/// without rtnetlink kind: a NIC, virtio-net, ENA…).
pub fn kind_of(link: &Link) -> String {
    match (&link.info_kind, link.link_type.as_str()) {
        (Some(k), _) => k.clone(),
        (None, "loopback") => "loopback".to_owned(),
        (None, "ether") => "physical".to_owned(),
        (None, "none") => "other".to_owned(),
        (None, t) => t.to_owned(),
    }
}

/// What a tunnel adds to every packet it carries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Encapsulation {
    /// Bytes added to each inner IP packet: an inner packet of `mtu` bytes becomes an outer
    /// one of `mtu + overhead`.
    pub overhead: u32,
    /// The outer header is IPv6.
    pub outer_ipv6: bool,
    /// How the figure adds up.
    pub breakdown: String,
    /// The tunnel's remote endpoint, when it has a single one.
    #[serde(skip)]
    pub remote: Option<String>,
}

/// The encapsulation overhead a link's kind implies: `Ok(None)` for kinds that do not
/// encapsulate (0 bytes), `Ok(Some)` for tunnels, `Err` when the kind's overhead cannot be told
/// from its attributes (IPsec, whose overhead depends on the cipher; kinds we do not know).
pub fn encapsulation(kind: &str, info: &Value) -> Result<Option<Encapsulation>, String> {
    let s = |k: &str| info[k].as_str().filter(|v| !v.is_empty() && *v != "any");
    let set = |k: &str| !info[k].is_null() && info[k] != Value::Bool(false);
    let v6 = s("remote6").is_some() || s("local6").is_some() || s("group6").is_some();
    let remote = s("remote6").or(s("remote")).map(str::to_owned);
    let ip = |v6: bool| if v6 { 40 } else { 20 };
    let ip_name = |v6: bool| if v6 { "IPv6" } else { "IPv4" };
    // GRE: 4 bytes of base header, and 4 more for each of key, checksum and sequence number
    // on the transmit side.
    let gre_opts = || -> (u32, String) {
        let opts: Vec<&str> = [("okey", "key"), ("ocsum", "checksum"), ("oseq", "sequence")]
            .into_iter()
            .filter(|(k, _)| set(k))
            .map(|(_, n)| n)
            .collect();
        let extra = 4 * opts.len() as u32;
        let text = if opts.is_empty() {
            String::new()
        } else {
            format!(" + {extra} ({})", opts.join(", "))
        };
        (extra, text)
    };
    // ip6tnl and ip6gre add an 8-byte destination option carrying the tunnel encapsulation
    // limit unless it is turned off (`encaplimit none`).
    let encap_limit = || -> (u32, &'static str) {
        if !info["encap_limit"].is_null() && !set("ip6_tnl_f_ign_encap_limit") {
            (8, " + 8 encapsulation-limit option")
        } else {
            (0, "")
        }
    };
    // Foo-over-UDP / GUE on ipip, sit and gre: a UDP header (+4 for GUE's own).
    let fou = || -> (u32, &'static str) {
        match info["encap_type"].as_str() {
            Some("fou") => (8, " + 8 UDP (FOU)"),
            Some("gue") => (12, " + 8 UDP + 4 GUE"),
            _ => (0, ""),
        }
    };
    let tunnel = |overhead: u32, outer_ipv6: bool, breakdown: String| {
        Ok(Some(Encapsulation {
            overhead,
            outer_ipv6,
            breakdown,
            remote: remote.clone(),
        }))
    };
    match kind {
        // No encapsulation: the packet leaves as it is (VLAN tags live in the Ethernet header,
        // outside the MTU).
        "loopback" | "physical" | "veth" | "bridge" | "bond" | "team" | "macvlan" | "macvtap"
        | "ipvlan" | "ipvtap" | "vlan" | "dummy" | "ifb" | "tun" | "tap" | "vrf" | "nlmon"
        | "netkit" | "openvswitch" | "bareudp" | "other" => Ok(None),
        // VXLAN: outer IP + 8 UDP + 8 VXLAN + the inner Ethernet header (14): 50 over IPv4,
        // 70 over IPv6 (RFC 7348).
        "vxlan" => tunnel(
            ip(v6) + 30,
            v6,
            format!(
                "{} outer {} + 8 UDP + 8 VXLAN + 14 inner Ethernet",
                ip(v6),
                ip_name(v6)
            ),
        ),
        // Geneve: like VXLAN, plus variable options (multiples of 4; OVN adds 8): at least 50
        // over IPv4, 70 over IPv6 (RFC 8926).
        "geneve" => tunnel(
            ip(v6) + 30,
            v6,
            format!(
                "{} outer {} + 8 UDP + 8 Geneve + 14 inner Ethernet (at least: options add more)",
                ip(v6),
                ip_name(v6)
            ),
        ),
        // WireGuard: outer IP + 8 UDP + 16 message header + 16 Poly1305 tag: 60 over IPv4,
        // 80 over IPv6. The endpoints' family is not in the link attributes: IPv4 is assumed.
        "wireguard" => tunnel(
            60,
            false,
            "20 outer IPv4 + 8 UDP + 16 WireGuard header + 16 authentication tag (80 over IPv6)"
                .to_owned(),
        ),
        // IP in IP (RFC 2003): one outer IPv4 header.
        "ipip" => {
            let (f, ft) = fou();
            tunnel(20 + f, false, format!("20 outer IPv4{ft}"))
        }
        // IPv6 in IPv4 (RFC 4213).
        "sit" => {
            let (f, ft) = fou();
            tunnel(20 + f, false, format!("20 outer IPv4 (IPv6 in IPv4){ft}"))
        }
        // IPv4/IPv6 in IPv6 (RFC 2473).
        "ip6tnl" => {
            let (e, et) = encap_limit();
            tunnel(40 + e, true, format!("40 outer IPv6{et}"))
        }
        // GRE (RFC 2784/2890): outer IPv4 + 4 GRE (+4 per option).
        "gre" => {
            let (o, ot) = gre_opts();
            let (f, ft) = fou();
            tunnel(24 + o + f, false, format!("20 outer IPv4 + 4 GRE{ot}{ft}"))
        }
        // GRE carrying Ethernet: + the inner Ethernet header.
        "gretap" => {
            let (o, ot) = gre_opts();
            let (f, ft) = fou();
            tunnel(
                38 + o + f,
                false,
                format!("20 outer IPv4 + 4 GRE{ot} + 14 inner Ethernet{ft}"),
            )
        }
        "ip6gre" => {
            let (o, ot) = gre_opts();
            let (e, et) = encap_limit();
            tunnel(44 + o + e, true, format!("40 outer IPv6 + 4 GRE{ot}{et}"))
        }
        "ip6gretap" => {
            let (o, ot) = gre_opts();
            let (e, et) = encap_limit();
            tunnel(
                58 + o + e,
                true,
                format!("40 outer IPv6 + 4 GRE{ot} + 14 inner Ethernet{et}"),
            )
        }
        "xfrm" | "vti" | "vti6" => Err(format!(
            "{kind}: IPsec overhead depends on the cipher and mode (ESP adds roughly 50-80 bytes)"
        )),
        other => Err(format!("{other}: encapsulation overhead unknown")),
    }
}

/// A route (only what the inventory uses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub dst: String,
    pub dev: Option<String>,
    pub table: Option<String>,
    /// The route's `mtu` metric, when it sets one.
    pub mtu: Option<u32>,
    pub ipv6: bool,
}

/// Parses `ip -j -d route show …` / `ip -j route get fibmatch …`.
pub fn parse_routes(json: &str, ipv6: bool) -> Vec<Route> {
    let Ok(Value::Array(routes)) = serde_json::from_str::<Value>(json) else {
        return Vec::new();
    };
    routes
        .iter()
        .filter_map(|r| {
            let dev = r["dev"]
                .as_str()
                .or_else(|| r["nexthops"][0]["dev"].as_str())
                .map(str::to_owned);
            let mtu = r["metrics"].as_array().and_then(|ms| {
                ms.iter().find_map(|m| match &m["mtu"] {
                    v @ Value::Number(_) => as_u32(v),
                    // `mtu lock 1400` prints {"mtu": {"lock": true, "value": 1400}}? Be lenient.
                    Value::Object(o) => o.get("value").and_then(as_u32),
                    _ => None,
                })
            });
            Some(Route {
                dst: r["dst"].as_str()?.to_owned(),
                dev,
                table: r["table"].as_str().map(str::to_owned),
                mtu,
                ipv6,
            })
        })
        .collect()
}

/// The default route of the main table, IPv4 first.
pub fn default_route(routes: &[Route]) -> Option<&Route> {
    let main = |r: &&Route| matches!(r.table.as_deref(), None | Some("main"));
    let default = |v6: bool| {
        routes
            .iter()
            .filter(main)
            .find(|r| r.dst == "default" && r.ipv6 == v6 && r.dev.is_some())
    };
    default(false).or_else(|| default(true))
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
#[derive(Clone, Debug, PartialEq, Serialize)]
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
#[derive(Clone, Debug, PartialEq, Serialize)]
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

/// Runs `ip <args>` (in the calling thread's namespace) and returns its stdout.
fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip` (install iproute2): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What is read inside one namespace.
struct Raw {
    links: Result<Vec<Link>, String>,
    routes: Vec<Route>,
    /// `route get fibmatch <remote>` of each tunnel with a remote, by remote.
    remote_routes: HashMap<String, Route>,
    snmp: Option<Snmp>,
}

fn read_here() -> Raw {
    let links = ip(&["-d", "-j", "link", "show"]).and_then(|j| parse_links(&j));
    let mut routes = ip(&["-j", "-d", "route", "show", "table", "all"])
        .map(|j| parse_routes(&j, false))
        .unwrap_or_default();
    // IPv6 may be disabled: then there is nothing to add.
    routes.extend(
        ip(&["-6", "-j", "-d", "route", "show", "table", "all"])
            .map(|j| parse_routes(&j, true))
            .unwrap_or_default(),
    );
    let mut remote_routes = HashMap::new();
    if let Ok(links) = &links {
        for l in links {
            let kind = kind_of(l);
            if let Ok(Some(e)) = encapsulation(&kind, &l.info_data)
                && let Some(remote) = e.remote
                && !remote_routes.contains_key(&remote)
            {
                let family = if e.outer_ipv6 { "-6" } else { "-4" };
                if let Ok(j) = ip(&[family, "-j", "route", "get", "fibmatch", &remote])
                    && let Some(r) = parse_routes(&j, e.outer_ipv6).into_iter().next()
                {
                    remote_routes.insert(remote, r);
                }
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
                uplink: None,
                uplink_mtu: None,
                route_mtus: Vec::new(),
                interfaces: Vec::new(),
                snmp: raw.snmp,
                error: Some(e),
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
            let (overhead, encap, note) = match encapsulation(&kind, &l.info_data) {
                Ok(None) => (Some(0), None, None),
                Ok(Some(e)) => (Some(e.overhead), Some(e), None),
                Err(why) => (None, None, Some(why)),
            };
            let underlay = encap.as_ref().and_then(|e| underlay_of(e, l));
            // A veth whose peer is in this namespace names it.
            let peer = (kind == "veth" && !l.link_other_netns)
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

/// Pairs veths whose peers are in other namespaces: a veth names its peer's index
/// (`link_index`) but not its namespace; the peer is the veth there whose own `link_index` is
/// this one's index. Ambiguous pairs are left unpaired.
pub fn pair_veths(namespaces: &mut [Namespace], links: &HashMap<u64, Vec<Link>>) {
    let mut found: Vec<(usize, usize, Peer)> = Vec::new();
    for (ni, ns) in namespaces.iter().enumerate() {
        let Some(ns_links) = links.get(&ns.inode) else {
            continue;
        };
        for l in ns_links
            .iter()
            .filter(|l| l.info_kind.as_deref() == Some("veth") && l.link_other_netns)
        {
            let Some(peer_index) = l.link_index else {
                continue;
            };
            let candidates: Vec<(u64, &Link)> = links
                .iter()
                .filter(|(inode, _)| **inode != ns.inode)
                .flat_map(|(inode, ls)| ls.iter().map(move |p| (*inode, p)))
                .filter(|(_, p)| {
                    p.info_kind.as_deref() == Some("veth")
                        && p.link_other_netns
                        && p.ifindex == peer_index
                        && p.link_index == Some(l.ifindex)
                })
                .collect();
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
            // The namespace went away, or cannot be entered.
            Err(e) => {
                log::debug!("network namespace {}: {e}", ns.inode);
            }
        }
    }
    pair_veths(&mut out, &links_by_ns);
    out
}

/// The network namespaces over a window: their counters at the start; at the end, the full
/// inventory and the counters' change.
pub struct NetWatch {
    start: HashMap<u64, Snmp>,
    /// Namespaces that existed at the start (those whose counters could not be read then have
    /// no change to report).
    existed: std::collections::HashSet<u64>,
}

/// The inventory at the end of a window, and each namespace's counters over it.
pub struct NetState {
    pub namespaces: Vec<Namespace>,
    pub snmp: HashMap<u64, Snmp>,
}

impl NetWatch {
    pub fn start() -> Self {
        let namespaces = discover();
        Self {
            start: snmp_snapshot(&namespaces),
            existed: namespaces.iter().map(|n| n.inode).collect(),
        }
    }

    pub fn finish(&self) -> NetState {
        let namespaces = collect(&discover());
        let snmp = namespaces
            .iter()
            .filter_map(|ns| {
                let now = ns.snmp?;
                let change = match self.start.get(&ns.inode) {
                    Some(then) => now.since(then),
                    // Created during the window: its counters started at zero.
                    None if !self.existed.contains(&ns.inode) => now,
                    None => return None,
                };
                Some((ns.inode, change))
            })
            .collect();
        NetState { namespaces, snmp }
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeSet, path::PathBuf};

    use super::*;
    use crate::netinfo::namespaces::v2_cgroup_of;
    use serde_json::json;

    const LINKS: &str = r#"[
      {"ifindex":1,"ifname":"lo","mtu":65536,"link_type":"loopback","operstate":"UNKNOWN"},
      {"ifindex":2,"link_index":7,"ifname":"ulA","mtu":1500,"link_type":"ether",
       "link_netnsid":0,"operstate":"UP","linkinfo":{"info_kind":"veth"}},
      {"ifindex":3,"ifname":"ovA","mtu":1500,"link_type":"ether","operstate":"UNKNOWN",
       "linkinfo":{"info_kind":"vxlan","info_data":{"id":42,"remote":"10.200.0.2",
       "local":"10.200.0.1","port":4789,"df":"unset"}}},
      {"ifindex":4,"ifname":"eth0","mtu":9001,"link_type":"ether","operstate":"UP"},
      {"ifindex":5,"ifname":"va","link":"vb","mtu":1500,"link_type":"ether","master":"br0",
       "linkinfo":{"info_kind":"veth","info_slave_kind":"bridge"}},
      {"ifindex":6,"ifname":"vb","link":"va","mtu":1500,"link_type":"ether",
       "linkinfo":{"info_kind":"veth"}},
      {"ifindex":8,"ifname":"flannel.1","link":"eth0","mtu":8951,"link_type":"ether",
       "linkinfo":{"info_kind":"vxlan","info_data":{"id":1,"local":"10.0.0.5","link":"eth0"}}},
      {"ifname":"broken"}
    ]"#;

    #[test]
    fn links_parse_with_their_kinds() {
        let links = parse_links(LINKS).unwrap();
        assert_eq!(links.len(), 7, "entries without index or MTU are skipped");
        let kinds: Vec<String> = links.iter().map(kind_of).collect();
        assert_eq!(
            kinds,
            [
                "loopback", "veth", "vxlan", "physical", "veth", "veth", "vxlan"
            ]
        );
        assert!(links[1].link_other_netns);
        assert_eq!(links[1].link_index, Some(7));
        assert_eq!(links[4].link.as_deref(), Some("vb"));
        assert_eq!(links[4].master.as_deref(), Some("br0"));
        assert_eq!(links[2].info_data["remote"], "10.200.0.2");
        assert!(parse_links("not json").is_err());
        assert!(parse_links("{}").is_err());
    }

    #[test]
    fn encapsulation_overheads_by_kind() {
        let none = json!(null);
        let cases: &[(&str, Value, Option<u32>)] = &[
            ("vxlan", json!({"remote": "10.0.0.2"}), Some(50)),
            ("vxlan", json!({"remote6": "fd00::2"}), Some(70)),
            ("vxlan", json!({"group6": "ff05::100"}), Some(70)),
            ("geneve", json!({"remote": "10.0.0.2"}), Some(50)),
            ("geneve", json!({"remote6": "fd00::2"}), Some(70)),
            ("wireguard", none.clone(), Some(60)),
            ("ipip", json!({"remote": "10.0.0.2"}), Some(20)),
            ("ipip", json!({"encap_type": "fou"}), Some(28)),
            ("sit", none.clone(), Some(20)),
            ("ip6tnl", json!({"encap_limit": 4}), Some(48)),
            (
                "ip6tnl",
                json!({"encap_limit": 4, "ip6_tnl_f_ign_encap_limit": true}),
                Some(40),
            ),
            ("ip6tnl", none.clone(), Some(40)),
            ("gre", none.clone(), Some(24)),
            ("gre", json!({"okey": "0.0.0.5", "ocsum": true}), Some(32)),
            ("gre", json!({"ikey": "0.0.0.5"}), Some(24)),
            ("gretap", json!({"oseq": true}), Some(42)),
            ("ip6gre", none.clone(), Some(44)),
            ("ip6gretap", json!({"encap_limit": 4}), Some(66)),
        ];
        for (kind, info, want) in cases {
            let got = encapsulation(kind, info).unwrap().map(|e| e.overhead);
            assert_eq!(got, *want, "{kind} {info}");
        }
        for plain in [
            "veth", "bridge", "physical", "loopback", "macvlan", "vlan", "bond",
        ] {
            assert_eq!(encapsulation(plain, &none), Ok(None), "{plain}");
        }
        for unknown in ["xfrm", "vti", "erspan", "mystery"] {
            assert!(encapsulation(unknown, &none).is_err(), "{unknown}");
        }
        let e = encapsulation("vxlan", &json!({"remote": "any", "local": "10.0.0.1"}))
            .unwrap()
            .unwrap();
        assert_eq!(e.remote, None, "`any` is no remote");
        assert!(!e.outer_ipv6);
        assert!(e.breakdown.contains("8 VXLAN"));
    }

    const ROUTES: &str = r#"[
      {"type":"unicast","dst":"default","gateway":"192.0.2.1","dev":"eth0","table":"main","flags":[]},
      {"type":"unicast","dst":"10.99.0.0/16","dev":"ulA","table":"main","flags":[],"metrics":[{"mtu":1400}]},
      {"type":"unicast","dst":"default","dev":"wg0","table":"51820","flags":[]},
      {"type":"local","dst":"127.0.0.1","dev":"lo","table":"local","flags":[]},
      {"dst":"10.1.0.0/16","nexthops":[{"dev":"ulA"}],"metrics":[{"mtu":{"lock":true,"value":1300}}]}
    ]"#;

    #[test]
    fn routes_default_route_and_route_mtus() {
        let routes = parse_routes(ROUTES, false);
        assert_eq!(routes.len(), 5);
        assert_eq!(routes[1].mtu, Some(1400));
        assert_eq!(routes[4].dev.as_deref(), Some("ulA"));
        assert_eq!(routes[4].mtu, Some(1300));
        assert_eq!(default_route(&routes).unwrap().dev.as_deref(), Some("eth0"));
        let v6 = parse_routes(r#"[{"dst":"default","dev":"eth1","table":"main"}]"#, true);
        assert_eq!(default_route(&v6).unwrap().dev.as_deref(), Some("eth1"));
        let only_other_table =
            parse_routes(r#"[{"dst":"default","dev":"wg0","table":"51820"}]"#, false);
        assert_eq!(default_route(&only_other_table), None);
        assert!(parse_routes("", false).is_empty());
    }

    fn netns(inode: u64) -> NetnsRef {
        NetnsRef {
            inode,
            path: PathBuf::from("/proc/1/ns/net"),
            name: Some("swa".into()),
            host: false,
            pid: None,
            cgroups: BTreeSet::from(["/pod".to_owned()]),
        }
    }

    fn raw(remote_mtu: Option<u32>) -> Raw {
        let mut remote_routes = HashMap::new();
        remote_routes.insert(
            "10.200.0.2".to_owned(),
            Route {
                dst: "10.200.0.0/24".into(),
                dev: Some("ulA".into()),
                table: None,
                mtu: remote_mtu,
                ipv6: false,
            },
        );
        Raw {
            links: parse_links(LINKS),
            routes: parse_routes(ROUTES, false),
            remote_routes,
            snmp: None,
        }
    }

    #[test]
    fn a_namespace_is_assembled_with_underlays_and_uplink() {
        let ns = assemble(&netns(7), raw(None));
        assert_eq!(ns.uplink.as_deref(), Some("eth0"));
        assert_eq!(ns.uplink_mtu, Some(9001));
        assert_eq!(ns.label(), "netns swa");
        let ov = ns.interfaces.iter().find(|i| i.name == "ovA").unwrap();
        assert_eq!(ov.encapsulation_overhead, Some(50));
        let u = ov.underlay.as_ref().unwrap();
        assert_eq!((u.name.as_str(), u.mtu, u.path_mtu), ("ulA", 1500, 1500));
        assert_eq!(u.found_by, "route to 10.200.0.2");
        // flannel.1 has no remote: its lower device.
        let fl = ns
            .interfaces
            .iter()
            .find(|i| i.name == "flannel.1")
            .unwrap();
        let fu = fl.underlay.as_ref().unwrap();
        assert_eq!(
            (fu.name.as_str(), fu.mtu, fu.found_by.as_str()),
            ("eth0", 9001, "link")
        );
        let va = ns.interfaces.iter().find(|i| i.name == "va").unwrap();
        assert_eq!(va.peer.as_ref().unwrap().name, "vb");
        assert_eq!(va.encapsulation_overhead, Some(0));
        assert!(
            ns.interfaces
                .iter()
                .find(|i| i.name == "eth0")
                .unwrap()
                .uplink
        );
        assert_eq!(
            ns.route_mtus,
            [
                RouteMtu {
                    destination: "10.99.0.0/16".into(),
                    device: Some("ulA".into()),
                    table: Some("main".into()),
                    mtu: 1400
                },
                RouteMtu {
                    destination: "10.1.0.0/16".into(),
                    device: Some("ulA".into()),
                    table: None,
                    mtu: 1300
                }
            ]
        );
        // A route MTU on the way to the remote lowers the path.
        let ns = assemble(&netns(7), raw(Some(1400)));
        let ov = ns.interfaces.iter().find(|i| i.name == "ovA").unwrap();
        let u = ov.underlay.as_ref().unwrap();
        assert_eq!((u.route_mtu, u.path_mtu), (Some(1400), 1400));
    }

    #[test]
    fn unreadable_links_leave_an_error() {
        let mut r = raw(None);
        r.links = Err("cannot run `ip`".into());
        let ns = assemble(&netns(7), r);
        assert!(ns.interfaces.is_empty());
        assert_eq!(ns.error.as_deref(), Some("cannot run `ip`"));
    }

    #[test]
    fn veths_pair_across_namespaces_by_mutual_index() {
        let a = r#"[{"ifindex":2,"link_index":7,"ifname":"ulA","mtu":1500,"link_type":"ether",
                     "link_netnsid":0,"linkinfo":{"info_kind":"veth"}}]"#;
        let b = r#"[{"ifindex":7,"link_index":2,"ifname":"ulB","mtu":1500,"link_type":"ether",
                     "link_netnsid":0,"linkinfo":{"info_kind":"veth"}},
                    {"ifindex":2,"link_index":9,"ifname":"other","mtu":1500,"link_type":"ether",
                     "link_netnsid":1,"linkinfo":{"info_kind":"veth"}}]"#;
        let mk = |inode, json: &str| {
            let mut r = raw(None);
            r.links = parse_links(json);
            assemble(&netns(inode), r)
        };
        let mut all = vec![mk(10, a), mk(20, b)];
        let links = HashMap::from([(10, parse_links(a).unwrap()), (20, parse_links(b).unwrap())]);
        pair_veths(&mut all, &links);
        assert_eq!(
            all[0].interfaces[0].peer,
            Some(Peer {
                netns: 20,
                ifindex: 7,
                name: "ulB".into()
            })
        );
        assert_eq!(all[1].interfaces[0].peer.as_ref().unwrap().netns, 10);
        assert_eq!(all[1].interfaces[1].peer, None, "index 9 exists nowhere");
    }

    #[test]
    fn cgroup_lines() {
        assert_eq!(
            v2_cgroup_of("0::/kubepods/pod1/c\n"),
            Some("/kubepods/pod1/c".into())
        );
        assert_eq!(
            v2_cgroup_of("12:cpu,cpuacct:/x\n0::/system.slice/a.service\n"),
            Some("/system.slice/a.service".into())
        );
        assert_eq!(v2_cgroup_of("3:memory:/x\n"), None);
    }

    #[test]
    fn the_hosts_namespace_is_found_and_read() {
        // Reads this machine: /proc and `ip` exist wherever the agent runs; a failure here is
        // the environment's, and must show.
        let all = discover();
        let host = all.iter().find(|n| n.host).expect("the host's namespace");
        assert!(host.cgroups.is_empty());
        let read = collect(std::slice::from_ref(host));
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].error, None);
        assert!(read[0].interfaces.iter().any(|i| i.kind == "loopback"));
        assert!(read[0].snmp.and_then(|s| s.fragments_created).is_some());
    }
}
