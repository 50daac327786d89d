//! The `mtu_mismatch` rule. Unlike the other rules it works on interface-level facts, not on
//! one container's figures: the MTUs of the namespaces' interfaces, what their tunnels add, the
//! underlay they send through, and what the kernel did with packets that did not fit
//! (fragments, ICMP "packet too big", drops).
//!
//! The rule is pure: [`NetFacts`] are built from the inventory and the window by
//! [`net_facts`], and tested on synthetic ones.

use std::collections::{BTreeMap, HashMap};

use stormwatch_common::net::len_bucket;

use super::{Finding, Kind, Severity, Thresholds};
use crate::{
    collect::Window,
    collect::{NetAvailability, iface_key},
    netinfo::{
        inventory::{Namespace, NetState},
        namespaces::common_cgroup,
    },
    probes::net::{MTU_DROP_REASONS, drop_reason_name},
};

/// Default thresholds, with the reason for each value.
pub mod defaults {
    /// Fragments and "packet too big" messages in the namespace over the window before a
    /// mismatch counts as hitting traffic: one odd UDP sender with large datagrams makes a few;
    /// a mismatch in use fragments (or bounces) every full-size packet, hundreds a second.
    pub const MTU_MIN_EVIDENCE_EVENTS: f64 = 10.0;
    /// Packets lost to the mismatch (fragmentation impossible with DF set, failed
    /// reassemblies, drops for being too big) that make it critical: each is a packet that
    /// will never arrive however often it is retried — the MTU black hole.
    pub const MTU_CRITICAL_LOSSES: f64 = 1.0;
    /// An underlay MTU at or above this is jumbo: no Ethernet framing variant below it exists
    /// (baby giants for MPLS or QinQ stay under 2000), and jumbo settings are 4000 and more
    /// (usually 9000, 9001 on AWS, 8896 on GCP).
    pub const MTU_JUMBO_MIN_UNDERLAY: f64 = 4000.0;
    /// Jumbo frames count as unused when the overlay or container MTU is at most this share of
    /// what the underlay allows: at 1450 on 9000, each packet carries a sixth of what it could,
    /// and bulk transfers pay six times the per-packet CPU.
    pub const MTU_JUMBO_MAX_USED_SHARE: f64 = 0.5;
}

/// What the kernel did in one namespace over the window with packets that did not fit.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MtuCounters {
    /// Fragments made (`FragCreates`), IPv4 and IPv6.
    pub fragments_created: u64,
    /// Packets that had to be fragmented and could not be (`FragFails`): dropped.
    pub fragmentation_failures: u64,
    /// `ReasmFails`: fragments that never made a whole packet.
    pub reassembly_failures: u64,
    /// ICMP "fragmentation needed" / ICMPv6 "packet too big" sent and received.
    pub ptb_sent: u64,
    pub ptb_received: u64,
    /// Drops for being too big (`PKT_TOO_BIG`, fragment reassembly reasons).
    pub mtu_drops: u64,
}

impl MtuCounters {
    /// Signs that packets met a smaller MTU: fragments and "packet too big".
    pub fn signs(&self) -> u64 {
        self.fragments_created + self.ptb_sent + self.ptb_received + self.losses()
    }

    /// Packets lost because they were too big.
    pub fn losses(&self) -> u64 {
        self.fragmentation_failures + self.reassembly_failures + self.mtu_drops
    }

    fn add(&mut self, o: &Self) {
        self.fragments_created += o.fragments_created;
        self.fragmentation_failures += o.fragmentation_failures;
        self.reassembly_failures += o.reassembly_failures;
        self.ptb_sent += o.ptb_sent;
        self.ptb_received += o.ptb_received;
        self.mtu_drops += o.mtu_drops;
    }
}

/// A tunnel's underlay, as far as the rule cares.
#[derive(Clone, Debug, PartialEq)]
pub struct UnderlayFacts {
    pub name: String,
    /// The largest outer packet that leaves without fragmentation: the underlay device's
    /// MTU, or the route's when smaller.
    pub path_mtu: u32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct IfaceFacts {
    pub name: String,
    pub ifindex: u32,
    pub kind: String,
    pub mtu: u32,
    /// Encapsulation overhead of a tunnel (`None` for plain devices and unknown kinds).
    pub tunnel_overhead: Option<u32>,
    pub underlay: Option<UnderlayFacts>,
    /// A veth's other end: (namespace inode, ifindex).
    pub peer: Option<(u64, u32)>,
    /// Full-size packets sent (exactly the MTU), when the transmit probe is attached.
    pub packets_at_mtu: Option<u64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct NetnsFacts {
    pub inode: u64,
    /// `host`, `netns <name>`, `netns <inode> (pid <pid>)`.
    pub label: String,
    pub host: bool,
    /// The container (cgroup id, path) the namespace belongs to: the common cgroup of its
    /// processes, when that is not the root.
    pub container: Option<(u64, String)>,
    /// The interface of the default route.
    pub uplink: Option<String>,
    pub interfaces: Vec<IfaceFacts>,
    pub counters: MtuCounters,
}

impl NetnsFacts {
    fn iface(&self, name: &str) -> Option<&IfaceFacts> {
        self.interfaces.iter().find(|i| i.name == name)
    }

    fn owner(&self) -> (u64, String) {
        match &self.container {
            Some((id, path)) => (*id, path.clone()),
            None => (0, self.label.clone()),
        }
    }
}

/// The host's network facts over a window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NetFacts {
    pub window_seconds: f64,
    pub namespaces: Vec<NetnsFacts>,
}

/// Builds the facts from the inventory at the end of the window, the namespaces' counters
/// over it, and the probes' window. `cgroup_id` resolves a cgroup path to its id.
pub fn net_facts(
    state: &NetState,
    window: &Window,
    avail: NetAvailability,
    cgroup_id: impl Fn(&str) -> Option<u64>,
) -> NetFacts {
    // MTU drops by namespace.
    let mut mtu_drops: HashMap<u32, u64> = HashMap::new();
    for (k, v) in &window.net_drops {
        if MTU_DROP_REASONS.contains(&drop_reason_name(k.reason).as_str()) {
            *mtu_drops.entry(k.netns).or_default() += v.packets;
        }
    }
    let namespaces = state
        .namespaces
        .iter()
        .map(|ns: &Namespace| {
            let snmp = state.snmp.get(&ns.inode).copied().unwrap_or_default();
            let (mut ptb_sent, mut ptb_received) = (0, 0);
            let interfaces = ns
                .interfaces
                .iter()
                .map(|i| {
                    let stats = window.net_ifaces.get(&iface_key(ns.inode, i.ifindex));
                    if let Some(s) = stats {
                        ptb_sent += s.tx.ptb;
                        ptb_received += s.rx.ptb;
                    }
                    IfaceFacts {
                        name: i.name.clone(),
                        ifindex: i.ifindex,
                        kind: i.kind.clone(),
                        mtu: i.mtu,
                        tunnel_overhead: i.encapsulation.as_ref().map(|e| e.overhead),
                        underlay: i.underlay.as_ref().map(|u| UnderlayFacts {
                            name: u.name.clone(),
                            path_mtu: u.path_mtu,
                        }),
                        peer: i.peer.as_ref().map(|p| (p.netns, p.ifindex)),
                        packets_at_mtu: avail
                            .tx
                            .then(|| stats.map_or(0, |s| s.tx.len[len_bucket::AT_MTU])),
                    }
                })
                .collect();
            // Without the interface probes, the IPv6 "packet too big" counters still tell.
            if !avail.tx {
                ptb_sent = snmp.icmp6_packet_too_big_sent.unwrap_or(0);
            }
            if !avail.rx {
                ptb_received = snmp.icmp6_packet_too_big_received.unwrap_or(0);
            }
            let container = if ns.host {
                None
            } else {
                common_cgroup(&ns.cgroups).and_then(|p| Some((cgroup_id(&p)?, p)))
            };
            NetnsFacts {
                inode: ns.inode,
                label: ns.label(),
                host: ns.host,
                container,
                uplink: ns.uplink.clone(),
                interfaces,
                counters: MtuCounters {
                    fragments_created: snmp.fragments_created.unwrap_or(0),
                    fragmentation_failures: snmp.fragmentation_failures.unwrap_or(0),
                    reassembly_failures: snmp.reassembly_failures.unwrap_or(0),
                    ptb_sent,
                    ptb_received,
                    mtu_drops: mtu_drops.get(&(ns.inode as u32)).copied().unwrap_or(0),
                },
            }
        })
        .collect();
    NetFacts {
        window_seconds: window.duration.as_secs_f64(),
        namespaces,
    }
}

/// The largest packet a tunnel takes without fragmenting its outer packets.
fn tunnel_allows(i: &IfaceFacts) -> Option<(u32, u32, &UnderlayFacts)> {
    let overhead = i.tunnel_overhead.filter(|o| *o > 0)?;
    let u = i.underlay.as_ref()?;
    Some((u.path_mtu.saturating_sub(overhead), overhead, u))
}

/// The CNI settings that set these MTUs.
const CNI_MTU_SETTINGS: &str = "Calico `veth_mtu` in the calico-config ConfigMap (or \
    FelixConfiguration vxlanMTU / ipipMTU / wireguardMTU), Flannel `MTU` in net-conf.json (it \
    otherwise derives it from the underlay interface), Cilium `mtu` in the cilium-config \
    ConfigMap, AWS VPC CNI `AWS_VPC_ENI_MTU` (and `POD_MTU`), Weave `WEAVE_MTU`, Docker `mtu` \
    in daemon.json; running pods keep their old MTU until they are recreated";

fn counters_evidence(c: &MtuCounters, e: &mut BTreeMap<&'static str, f64>) {
    e.insert("fragments_created", c.fragments_created as f64);
    e.insert("fragmentation_failures", c.fragmentation_failures as f64);
    e.insert("reassembly_failures", c.reassembly_failures as f64);
    e.insert("packet_too_big_sent", c.ptb_sent as f64);
    e.insert("packet_too_big_received", c.ptb_received as f64);
    e.insert("mtu_drops", c.mtu_drops as f64);
}

fn counters_text(c: &MtuCounters) -> String {
    format!(
        "{} fragments, {} packets too big to fragment, {} failed reassemblies, {} ICMP \
         \"packet too big\" sent / {} received, {} drops for size",
        c.fragments_created,
        c.fragmentation_failures,
        c.reassembly_failures,
        c.ptb_sent,
        c.ptb_received,
        c.mtu_drops
    )
}

/// The severity of a mismatch given what it did: losses are critical; fragments and "packet
/// too big" (traffic still flows, at a cost) a warning; with no sign at all, `quiet`.
fn graded(c: &MtuCounters, t: &Thresholds, quiet: Option<Severity>) -> Option<Severity> {
    if c.losses() as f64 >= t.mtu_critical_losses {
        Some(Severity::Critical)
    } else if c.signs() as f64 >= t.mtu_min_evidence_events {
        Some(Severity::Warning)
    } else {
        quiet
    }
}

/// An overlay (tunnel) whose MTU plus its encapsulation exceeds what its underlay carries, or
/// that leaves most of a jumbo underlay unused.
fn overlay_findings(ns: &NetnsFacts, window_seconds: f64, t: &Thresholds) -> Vec<Finding> {
    let mut out = Vec::new();
    for i in &ns.interfaces {
        let Some((allowed, overhead, u)) = tunnel_allows(i) else {
            continue;
        };
        let mut e = BTreeMap::new();
        e.insert("overlay_mtu", f64::from(i.mtu));
        e.insert("underlay_mtu", f64::from(u.path_mtu));
        e.insert("encapsulation_overhead", f64::from(overhead));
        e.insert("allowed_mtu", f64::from(allowed));
        e.insert("netns", ns.inode as f64);
        e.insert("ifindex", f64::from(i.ifindex));
        if let Some(n) = i.packets_at_mtu {
            e.insert("packets_at_mtu", n as f64);
        }
        if i.mtu > allowed {
            // A misconfigured tunnel is wrong whether or not traffic hit it yet.
            let Some(severity) = graded(&ns.counters, t, Some(Severity::Warning)) else {
                continue;
            };
            counters_evidence(&ns.counters, &mut e);
            e.insert("excess_bytes", f64::from(i.mtu - allowed));
            out.push(Finding::new(
                Kind::MtuMismatch,
                severity,
                ns.owner(),
                format!(
                    "{} ({}, MTU {}) in {}: with {overhead} bytes of encapsulation its \
                     full-size packets leave as {} bytes, more than the {} that {} carries, so \
                     packets over {allowed} bytes are fragmented or dropped ({} in {:.0}s)",
                    i.name,
                    i.kind,
                    i.mtu,
                    ns.label,
                    i.mtu + overhead,
                    u.path_mtu,
                    u.name,
                    counters_text(&ns.counters),
                    window_seconds,
                ),
                e,
                vec![
                    format!(
                        "Lower {}'s MTU to {allowed} (= {} − {overhead}): `ip link set dev {} \
                         mtu {allowed}` in {} fixes it now; make it permanent where the CNI \
                         sets it: {CNI_MTU_SETTINGS}.",
                        i.name, u.path_mtu, i.name, ns.label
                    ),
                    format!(
                        "Or raise the underlay MTU to at least {} on {} and every hop of the \
                         path (jumbo frames), if the network supports it.",
                        i.mtu + overhead,
                        u.name
                    ),
                    "Until then, TCP survives on PMTU discovery only where ICMP \"packet too \
                     big\" gets through; UDP and tunnels in tunnels lose packets \
                     (fragments are dropped whole when one is lost)."
                        .to_owned(),
                ],
            ));
        } else if f64::from(u.path_mtu) >= t.mtu_jumbo_min_underlay
            && f64::from(i.mtu) <= t.mtu_jumbo_max_used_share * f64::from(allowed)
        {
            e.insert("unused_bytes", f64::from(allowed - i.mtu));
            out.push(Finding::new(
                Kind::MtuMismatch,
                Severity::Info,
                ns.owner(),
                format!(
                    "{} ({}, MTU {}) in {}: its underlay {} carries {} bytes (jumbo frames), \
                     {allowed} after the {overhead}-byte encapsulation, but packets are cut to \
                     {}",
                    i.name, i.kind, i.mtu, ns.label, u.name, u.path_mtu, i.mtu
                ),
                e,
                vec![format!(
                    "Raise the overlay MTU to {allowed} (= {} − {overhead}) — and the pods' MTU \
                     with it — for fewer, larger packets: {CNI_MTU_SETTINGS}.",
                    u.path_mtu
                )],
            ));
        }
    }
    out
}

/// What a container's traffic meets once it leaves through its uplink's peer namespace: the
/// tunnels there (each allows its underlay's MTU less its overhead, and at most its own MTU),
/// or, without tunnels, that namespace's uplink. Also the jumbo underlay MTU, if any.
struct Path {
    /// The largest packet that passes: at most the tunnel's own MTU too.
    allowed: u32,
    /// What the underlay would take after encapsulation (for jumbo frames unused).
    underlay_allows: u32,
    through: String,
    underlay_mtu: u32,
    overhead: u32,
}

fn path_from(node: &NetnsFacts) -> Option<Path> {
    let tunnels = node.interfaces.iter().filter_map(|i| {
        let (allowed, overhead, u) = tunnel_allows(i)?;
        Some(Path {
            allowed: allowed.min(i.mtu),
            underlay_allows: allowed,
            through: format!("{} ({} over {}, {})", i.name, i.kind, u.name, node.label),
            underlay_mtu: u.path_mtu,
            overhead,
        })
    });
    if let Some(p) = tunnels.min_by_key(|p| p.allowed) {
        return Some(p);
    }
    let up = node.iface(node.uplink.as_deref()?)?;
    Some(Path {
        allowed: up.mtu,
        underlay_allows: up.mtu,
        through: format!("{} (uplink of {})", up.name, node.label),
        underlay_mtu: up.mtu,
        overhead: 0,
    })
}

/// A container whose MTU exceeds what its traffic's path allows (with signs of it), or leaves
/// most of a jumbo path unused.
fn container_findings(
    ns: &NetnsFacts,
    all: &[NetnsFacts],
    window_seconds: f64,
    t: &Thresholds,
) -> Option<Finding> {
    if ns.host {
        return None;
    }
    let up = ns.iface(ns.uplink.as_deref()?)?;
    // A container's own tunnels are judged as overlays.
    if up.tunnel_overhead.is_some_and(|o| o > 0) {
        return None;
    }
    let (peer_ns, _) = up.peer?;
    let node = all
        .iter()
        .find(|n| n.inode == peer_ns && n.inode != ns.inode)?;
    let path = path_from(node)?;
    let mut c = ns.counters;
    c.add(&node.counters);
    let mut e = BTreeMap::new();
    e.insert("container_mtu", f64::from(up.mtu));
    e.insert("allowed_mtu", f64::from(path.allowed));
    e.insert("underlay_mtu", f64::from(path.underlay_mtu));
    e.insert("encapsulation_overhead", f64::from(path.overhead));
    e.insert("netns", ns.inode as f64);
    e.insert("node_netns", node.inode as f64);
    if up.mtu > path.allowed {
        // Without signs the container's traffic may never take that path (traffic between
        // containers of one node does not): no finding.
        let severity = graded(&c, t, None)?;
        counters_evidence(&c, &mut e);
        e.insert("excess_bytes", f64::from(up.mtu - path.allowed));
        return Some(Finding::new(
            Kind::MtuMismatch,
            severity,
            ns.owner(),
            format!(
                "{} in {} has MTU {}, but its traffic leaves through {}, which takes at most \
                 {} ({} there and in the container in {:.0}s)",
                up.name,
                ns.label,
                up.mtu,
                path.through,
                path.allowed,
                counters_text(&c),
                window_seconds
            ),
            e,
            vec![format!(
                "Set the container MTU to {} so that its packets fit the path once \
                 encapsulated: {CNI_MTU_SETTINGS}.",
                path.allowed
            )],
        ));
    }
    if f64::from(path.underlay_mtu) >= t.mtu_jumbo_min_underlay
        && f64::from(up.mtu) <= t.mtu_jumbo_max_used_share * f64::from(path.underlay_allows)
    {
        e.insert("unused_bytes", f64::from(path.underlay_allows - up.mtu));
        e.insert("underlay_allows_mtu", f64::from(path.underlay_allows));
        return Some(Finding::new(
            Kind::MtuMismatch,
            Severity::Info,
            ns.owner(),
            format!(
                "{} in {} has MTU {}, while the underlay of its path through {} would take {} \
                 (jumbo frames unused)",
                up.name, ns.label, up.mtu, path.through, path.underlay_allows
            ),
            e,
            vec![format!(
                "Raise the container MTU to {} (with the overlay's, if it is lower) for fewer, \
                 larger packets: {CNI_MTU_SETTINGS}.",
                path.underlay_allows
            )],
        ));
    }
    None
}

/// Whether, over a window, packets did not fit somewhere on the host, by what is counted
/// without the per-packet probes: the namespaces' own counters (fragments made or received for
/// reassembly, fragmentation or reassembly failures, ICMP destination-unreachable received —
/// `/proc/net/snmp` does not split IPv4's "fragmentation needed" from the other codes — and
/// ICMPv6 "packet too big" either way) and drops for size. The daemon attaches the per-packet
/// probes on demand ([`crate::probes::NetPacketTier`]) while this holds: they show which
/// interfaces and containers the packets were. Unreachables *sent* are left out: a host answers
/// every UDP datagram to a closed port with one, and a "fragmentation needed" it sends comes
/// with a fragmentation failure, counted.
pub fn packets_did_not_fit(state: &NetState, window: &Window) -> bool {
    let counted = state.snmp.values().any(|s| {
        [
            s.fragments_created,
            s.fragmentation_failures,
            s.reassembly_fragments,
            s.reassembly_failures,
            s.icmp_unreachable_received,
            s.icmp6_packet_too_big_sent,
            s.icmp6_packet_too_big_received,
        ]
        .iter()
        .any(|v| v.unwrap_or(0) > 0)
    });
    counted
        || window.net_drops.iter().any(|(k, v)| {
            v.packets > 0 && MTU_DROP_REASONS.contains(&drop_reason_name(k.reason).as_str())
        })
}

/// Runs `mtu_mismatch` over the host's network facts.
pub fn diagnose_network(f: &NetFacts, t: &Thresholds) -> Vec<Finding> {
    let mut out = Vec::new();
    for ns in &f.namespaces {
        out.extend(overlay_findings(ns, f.window_seconds, t));
        out.extend(container_findings(ns, &f.namespaces, f.window_seconds, t));
    }
    out.sort_by(|a, b| b.severity.cmp(&a.severity).then(a.cgroup.cmp(&b.cgroup)));
    out
}

#[cfg(test)]
mod tests;
