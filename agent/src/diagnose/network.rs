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
    netinfo::{
        inventory::{Namespace, NetState},
        namespaces::common_cgroup,
    },
    probes::net::{MTU_DROP_REASONS, drop_reason_name},
    report::network::{NetAvailability, iface_key},
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
mod tests {
    use super::*;
    use crate::netinfo::snmp::Snmp;
    use stormwatch_common::net::{NetDropKey, NetDropStats};

    #[test]
    fn per_packet_probes_are_wanted_where_packets_did_not_fit() {
        let state = |snmp: Snmp| NetState {
            namespaces: Vec::new(),
            snmp: HashMap::from([(7, snmp)]),
        };
        let quiet = Window::empty();
        assert!(!packets_did_not_fit(&state(Snmp::default()), &quiet));
        // A port unreachable sent for a datagram to a closed port is no MTU sign.
        let unreachable_sent = Snmp {
            icmp_unreachable_sent: Some(3),
            fragments_created: Some(0),
            ..Snmp::default()
        };
        assert!(!packets_did_not_fit(&state(unreachable_sent), &quiet));
        for sign in [
            Snmp {
                fragments_created: Some(2),
                ..Snmp::default()
            },
            Snmp {
                reassembly_fragments: Some(2),
                ..Snmp::default()
            },
            Snmp {
                fragmentation_failures: Some(1),
                ..Snmp::default()
            },
            Snmp {
                icmp_unreachable_received: Some(1),
                ..Snmp::default()
            },
            Snmp {
                icmp6_packet_too_big_sent: Some(1),
                ..Snmp::default()
            },
        ] {
            assert!(packets_did_not_fit(&state(sign), &quiet), "{sign:?}");
        }
        // Drops for another reason (2: the first that is a drop, never a size) are no sign.
        let mut dropped = Window::empty();
        dropped.net_drops.insert(
            NetDropKey {
                netns: 7,
                ifindex: 2,
                reason: 2,
                _pad: 0,
            },
            NetDropStats { packets: 5 },
        );
        assert!(!packets_did_not_fit(&state(Snmp::default()), &dropped));
    }

    fn iface(name: &str, kind: &str, mtu: u32) -> IfaceFacts {
        IfaceFacts {
            name: name.into(),
            ifindex: 2,
            kind: kind.into(),
            mtu,
            tunnel_overhead: None,
            underlay: None,
            peer: None,
            packets_at_mtu: Some(0),
        }
    }

    fn tunnel(name: &str, mtu: u32, overhead: u32, underlay_mtu: u32) -> IfaceFacts {
        IfaceFacts {
            tunnel_overhead: Some(overhead),
            underlay: Some(UnderlayFacts {
                name: "eth0".into(),
                path_mtu: underlay_mtu,
            }),
            ..iface(name, "vxlan", mtu)
        }
    }

    fn node(interfaces: Vec<IfaceFacts>, counters: MtuCounters) -> NetnsFacts {
        NetnsFacts {
            inode: 100,
            label: "host".into(),
            host: true,
            container: None,
            uplink: Some("eth0".into()),
            interfaces,
            counters,
        }
    }

    /// A node with a VXLAN (50 bytes of headers) at `overlay` over an uplink eth0 at `underlay`.
    fn vxlan_node(overlay: u32, underlay: u32, counters: MtuCounters) -> NetnsFacts {
        node(
            vec![
                iface("eth0", "physical", underlay),
                tunnel("vxlan0", overlay, 50, underlay),
            ],
            counters,
        )
    }

    fn pod(mtu: u32, counters: MtuCounters) -> NetnsFacts {
        let mut eth0 = iface("eth0", "veth", mtu);
        eth0.peer = Some((100, 7));
        NetnsFacts {
            inode: 200,
            label: "netns 200 (pid 9)".into(),
            host: false,
            container: Some((55, "/kubepods/pod1".into())),
            uplink: Some("eth0".into()),
            interfaces: vec![iface("lo", "loopback", 65536), eth0],
            counters,
        }
    }

    const QUIET: MtuCounters = MtuCounters {
        fragments_created: 0,
        fragmentation_failures: 0,
        reassembly_failures: 0,
        ptb_sent: 0,
        ptb_received: 0,
        mtu_drops: 0,
    };
    const FRAGMENTING: MtuCounters = MtuCounters {
        fragments_created: 400,
        ..QUIET
    };
    const LOSING: MtuCounters = MtuCounters {
        fragmentation_failures: 30,
        ptb_sent: 30,
        ..QUIET
    };
    const FEW_FRAGMENTS: MtuCounters = MtuCounters {
        fragments_created: 4,
        ..QUIET
    };

    /// (case, namespaces, expected findings as (owner, severity, container_mtu or overlay_mtu))
    type Case = (&'static str, Vec<NetnsFacts>, Vec<(&'static str, Severity)>);

    fn cases() -> Vec<Case> {
        let eth0 = iface("eth0", "physical", 1500);
        // A VXLAN as large as its underlay: always a finding about the host, how grave
        // depending on the traffic.
        let overlay_as_large_as_underlay = [
            (
                "overlay = underlay, fragments seen",
                FRAGMENTING,
                Severity::Warning,
            ),
            (
                "overlay = underlay, packets lost",
                LOSING,
                Severity::Critical,
            ),
            (
                "overlay = underlay, no traffic yet: still wrong",
                QUIET,
                Severity::Warning,
            ),
            (
                "a few fragments are not enough to call it in use",
                FEW_FRAGMENTS,
                Severity::Warning,
            ),
        ]
        .map(|(case, counters, severity)| {
            (
                case,
                vec![vxlan_node(1500, 1500, counters)],
                vec![("host", severity)],
            )
        });
        overlay_as_large_as_underlay
            .into_iter()
            .chain([
                (
                    "overlay = underlay - 50: right",
                    vec![vxlan_node(1450, 1500, FRAGMENTING)],
                    vec![],
                ),
                (
                    "wireguard at 1420 over 1500: right",
                    vec![node(
                        vec![eth0.clone(), tunnel("wg0", 1420, 60, 1500)],
                        QUIET,
                    )],
                    vec![],
                ),
                (
                    "pods at 1450 on a 9000 underlay: jumbo unused (overlay and pod)",
                    vec![vxlan_node(1450, 9000, QUIET), pod(1450, QUIET)],
                    vec![("/kubepods/pod1", Severity::Info), ("host", Severity::Info)],
                ),
                (
                    "overlay at 8950 on 9000: right",
                    vec![vxlan_node(8950, 9000, QUIET), pod(8950, QUIET)],
                    vec![],
                ),
                (
                    "pod 1500 behind a correct 1450 overlay, PTB seen: the pod is wrong",
                    vec![
                        vxlan_node(
                            1450,
                            1500,
                            MtuCounters {
                                ptb_sent: 200,
                                ..QUIET
                            },
                        ),
                        pod(1500, QUIET),
                    ],
                    vec![("/kubepods/pod1", Severity::Warning)],
                ),
                (
                    "pod 1500 behind a correct overlay, no sign: no finding (may stay on the node)",
                    vec![vxlan_node(1450, 1500, QUIET), pod(1500, QUIET)],
                    vec![],
                ),
                (
                    "pod 9000 on a 1500 host without tunnels, packets lost",
                    vec![node(vec![eth0.clone()], QUIET), pod(9000, LOSING)],
                    vec![("/kubepods/pod1", Severity::Critical)],
                ),
                (
                    "pod 1500 on a 1500 host without tunnels",
                    vec![node(vec![eth0.clone()], FRAGMENTING), pod(1500, QUIET)],
                    vec![],
                ),
                (
                    "docker at 1500 on a 9001 host: jumbo unused",
                    vec![
                        node(vec![iface("eth0", "physical", 9001)], QUIET),
                        pod(1500, QUIET),
                    ],
                    vec![("/kubepods/pod1", Severity::Info)],
                ),
                (
                    "unknown underlay: nothing to judge",
                    vec![node(
                        vec![IfaceFacts {
                            underlay: None,
                            ..tunnel("vxlan0", 1500, 50, 1500)
                        }],
                        LOSING,
                    )],
                    vec![],
                ),
            ])
            .collect()
    }

    #[test]
    fn the_rule_table() {
        let t = Thresholds::default();
        for (case, namespaces, want) in cases() {
            let facts = NetFacts {
                window_seconds: 10.0,
                namespaces,
            };
            let got: Vec<(String, Severity)> = diagnose_network(&facts, &t)
                .into_iter()
                .map(|f| {
                    assert_eq!(f.kind, Kind::MtuMismatch);
                    (f.cgroup, f.severity)
                })
                .collect();
            let want: Vec<(String, Severity)> =
                want.into_iter().map(|(o, s)| (o.to_owned(), s)).collect();
            assert_eq!(got, want, "{case}");
        }
    }

    #[test]
    fn an_overlay_finding_carries_its_evidence_and_the_fix() {
        let facts = NetFacts {
            window_seconds: 10.0,
            namespaces: vec![vxlan_node(1500, 1500, LOSING)],
        };
        let f = diagnose_network(&facts, &Thresholds::default()).remove(0);
        assert_eq!(f.evidence["overlay_mtu"], 1500.0);
        assert_eq!(f.evidence["underlay_mtu"], 1500.0);
        assert_eq!(f.evidence["encapsulation_overhead"], 50.0);
        assert_eq!(f.evidence["allowed_mtu"], 1450.0);
        assert_eq!(f.evidence["excess_bytes"], 50.0);
        assert_eq!(f.evidence["fragmentation_failures"], 30.0);
        assert_eq!(f.evidence["packet_too_big_sent"], 30.0);
        assert_eq!(f.evidence["netns"], 100.0);
        assert!(f.summary.contains("vxlan0"), "{}", f.summary);
        assert!(f.summary.contains("1550"), "{}", f.summary);
        assert!(f.recommendations[0].contains("mtu 1450"));
        assert!(f.recommendations[0].contains("veth_mtu"));
        assert!(f.recommendations[0].contains("AWS_VPC_ENI_MTU"));
        assert_eq!((f.cgroup_id, f.cgroup.as_str()), (0, "host"));
    }

    #[test]
    fn a_pod_finding_names_the_path_and_its_container() {
        let facts = NetFacts {
            window_seconds: 10.0,
            namespaces: vec![vxlan_node(1450, 1500, LOSING), pod(1500, QUIET)],
        };
        let f = diagnose_network(&facts, &Thresholds::default()).remove(0);
        assert_eq!(f.cgroup_id, 55);
        assert_eq!(f.evidence["container_mtu"], 1500.0);
        assert_eq!(f.evidence["allowed_mtu"], 1450.0);
        assert!(f.summary.contains("vxlan0"), "{}", f.summary);
        assert!(f.recommendations[0].contains("1450"));
    }

    #[test]
    fn thresholds_move_the_verdict() {
        let facts = NetFacts {
            window_seconds: 10.0,
            namespaces: vec![vxlan_node(1450, 1500, FEW_FRAGMENTS), pod(1500, QUIET)],
        };
        assert!(diagnose_network(&facts, &Thresholds::default()).is_empty());
        let t = Thresholds {
            mtu_min_evidence_events: 3.0,
            ..Thresholds::default()
        };
        assert_eq!(diagnose_network(&facts, &t).len(), 1);
    }

    #[test]
    fn common_cgroups() {
        let v = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            common_cgroup(&v(&["/kubepods/pod1/c1", "/kubepods/pod1/c2"])),
            Some("/kubepods/pod1".into())
        );
        assert_eq!(common_cgroup(&v(&["/a/b"])), Some("/a/b".into()));
        assert_eq!(common_cgroup(&v(&["/a", "/b"])), None);
        assert_eq!(common_cgroup(&v(&["/"])), None);
        assert_eq!(common_cgroup(&[]), None);
    }
}
