//! The network series of `/metrics`: per container (what its sockets send, what its network
//! namespace receives, TCP retransmits), per interface (packets and bytes each way, sizes
//! against the MTU with GSO/GRO super-packets apart, fragments, ICMP "packet too big", drops
//! by reason) and the MTU inventory (each interface's MTU, its encapsulation overhead and its
//! underlay's path MTU).
//!
//! Cardinality is bounded by the probes' maps: an interface has a series only while the
//! kernel-side map keeps it (`NET_IFACES`, at most 4096 entries, fewer on many-CPU hosts), and
//! drops are keyed by (interface, reason) in `NET_DROPS` (at most 4096); per-container series
//! follow the exporter's `max_cgroups`. See agent/METRICS.md for the label sets.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fmt,
};

use prometheus_client::{encoding::DescriptorEncoder, metrics::MetricType};
use stormwatch_common::net::{NetDirStats, NetDropKey, NetIfKey, NetIfStats, len_bucket};

use super::{
    metrics::{Value, counter, gauge, per_cgroup},
    state::{Exporter, Labels},
};
use crate::{collect::Window, netinfo::inventory::Namespace, probes::net::drop_reason_name};

/// Whose a network namespace is: the container (or pod) cgroup its traffic is counted for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    pub cgroup: String,
    pub labels: Labels,
}

/// What the inventory says about one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterfaceInfo {
    pub name: String,
    pub kind: String,
    pub mtu: u32,
    /// Bytes its kind adds to each packet: 0 for plain devices, `None` when unknown.
    pub encapsulation_overhead: Option<u32>,
    /// A tunnel's underlay path MTU.
    pub underlay_path_mtu: Option<u32>,
}

/// The network part of the exporter's state.
#[derive(Debug, Default)]
pub struct NetworkSeries {
    /// Per interface, everything since the agent started (or the interface was first seen).
    interfaces: BTreeMap<NetIfKey, NetIfStats>,
    /// Per (interface, reason).
    drops: BTreeMap<NetDropKey, u64>,
    /// Network namespace inode → owner.
    owners: HashMap<u32, Owner>,
    /// The last inventory, by (namespace inode, ifindex).
    pub(crate) inventory: BTreeMap<NetIfKey, InterfaceInfo>,
}

impl NetworkSeries {
    /// Adds a window's interface and drop deltas, and forgets the interfaces the probes no
    /// longer keep (`live`: the keys in the kernel-side map now; their namespace is gone).
    pub fn apply(
        &mut self,
        window: &Window,
        live: &HashSet<NetIfKey>,
        owners: HashMap<u32, Owner>,
    ) {
        use crate::collect::Counters as _;
        for (k, d) in &window.net_ifaces {
            self.interfaces.entry(*k).or_insert(NetIfStats::ZERO).add(d);
        }
        for (k, d) in &window.net_drops {
            *self.drops.entry(*k).or_default() += d.packets;
        }
        let had: HashSet<u32> = self.interfaces.keys().map(|k| k.netns).collect();
        self.interfaces.retain(|k, _| live.contains(k));
        let netns: HashSet<u32> = live.iter().map(|k| k.netns).collect();
        // A namespace the probes forgot is gone: so is its inventory, until the next read.
        self.inventory
            .retain(|k, _| !had.contains(&k.netns) || netns.contains(&k.netns));
        self.drops
            .retain(|k, _| k.netns == 0 || netns.contains(&k.netns));
        self.owners = owners;
    }

    /// Replaces the inventory.
    pub fn set_inventory(&mut self, namespaces: &[Namespace]) {
        self.inventory = inventory_of(namespaces);
    }

    fn labels<'a>(&'a self, key: &NetIfKey, ifindex: &'a str, netns: &'a str) -> IfaceLabels<'a> {
        let owner = self.owners.get(&key.netns);
        let name = self
            .inventory
            .get(key)
            .map(|i| i.name.as_str())
            .unwrap_or_default();
        let o = |f: fn(&Owner) -> &str| owner.map(f).unwrap_or_default();
        [
            ("netns", netns),
            ("ifindex", ifindex),
            ("interface", name),
            ("namespace", o(|o| o.labels.namespace.as_str())),
            ("pod", o(|o| o.labels.pod.as_str())),
            ("container", o(|o| o.labels.container.as_str())),
            ("cgroup", o(|o| o.cgroup.as_str())),
        ]
    }
}

type IfaceLabels<'a> = [(&'static str, &'a str); 7];

/// Each interface's inventory entry, by its probe key.
pub fn inventory_of(namespaces: &[Namespace]) -> BTreeMap<NetIfKey, InterfaceInfo> {
    namespaces
        .iter()
        .flat_map(|ns| {
            ns.interfaces.iter().map(move |i| {
                (
                    NetIfKey {
                        netns: ns.inode as u32,
                        ifindex: i.ifindex,
                    },
                    InterfaceInfo {
                        name: i.name.clone(),
                        kind: i.kind.clone(),
                        mtu: i.mtu,
                        encapsulation_overhead: i.encapsulation_overhead,
                        underlay_path_mtu: i.underlay.as_ref().map(|u| u.path_mtu),
                    },
                )
            })
        })
        .collect()
}

/// Packets that are not GSO/GRO super-packets, by length against the interface's MTU.
pub fn sizes_against_mtu(d: &NetDirStats) -> [(&'static str, u64); 4] {
    let below: u64 = d.len[..len_bucket::LOG2_COUNT].iter().sum();
    [
        ("below_mtu", below),
        ("near_mtu", d.len[len_bucket::NEAR_MTU]),
        ("at_mtu", d.len[len_bucket::AT_MTU]),
        ("above_mtu", d.len[len_bucket::OVER_MTU]),
    ]
}

fn directions(s: &NetIfStats) -> [(&'static str, &NetDirStats); 2] {
    [("sent", &s.tx), ("received", &s.rx)]
}

/// Encodes the per-container network families (part of the per-cgroup families).
pub fn encode_cgroups(enc: &mut DescriptorEncoder, e: &Exporter) -> fmt::Result {
    use MetricType::Counter;
    use Value::Int;
    let a = e.avail.net;
    let series = e.cgroups.series();
    if a.cgroup {
        for (name, help, value) in [
            (
                "stormwatch_network_packets",
                "IP packets of the cgroup, by direction: sent by its sockets, received by the \
                 interfaces of its network namespace (a GSO/GRO super-packet counts as its \
                 segments; a fragmented packet once).",
                (|n| (n.tx_packets, n.rx_packets))
                    as fn(&stormwatch_common::net::CgroupNetStats) -> (u64, u64),
            ),
            (
                "stormwatch_network_bytes",
                "IP bytes of the cgroup's packets, by direction (headers counted per segment).",
                |n| (n.tx_bytes, n.rx_bytes),
            ),
            (
                "stormwatch_network_gso_packets",
                "GSO super-packets the cgroup's sockets sent and GRO super-packets its namespace \
                 received (each also counted as its segments in stormwatch_network_packets).",
                |n| (n.tx_gso_packets, n.rx_gso_packets),
            ),
        ] {
            let mut m = enc.encode_descriptor(name, help, None, Counter)?;
            for (path, s) in series {
                let n = &s.totals.net;
                if *n == stormwatch_common::net::CgroupNetStats::ZERO {
                    continue;
                }
                let base = super::metrics::cgroup_labels(path, s);
                let (sent, received) = value(n);
                counter(&mut m, &(base, [("direction", "sent")]), Int(sent))?;
                counter(&mut m, &(base, [("direction", "received")]), Int(received))?;
            }
        }
    }
    if a.tcp_retransmits {
        per_cgroup(
            enc,
            e,
            "stormwatch_tcp_retransmits",
            "TCP segments the cgroup's sockets retransmitted (as the kernel's RetransSegs counts).",
            Counter,
            |s| (s.totals.net.tcp_retransmits != 0).then_some(Int(s.totals.net.tcp_retransmits)),
        )?;
    }
    Ok(())
}

/// Encodes the per-interface families and the MTU inventory.
pub fn encode_interfaces(enc: &mut DescriptorEncoder, e: &Exporter) -> fmt::Result {
    use MetricType::{Counter, Gauge};
    use Value::Int;
    let a = e.avail.net;
    let n = &e.network;
    let keys: Vec<(NetIfKey, String, String)> = n
        .interfaces
        .keys()
        .chain(n.inventory.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|k| (*k, k.ifindex.to_string(), k.netns.to_string()))
        .collect();
    fn labels<'a>(n: &'a NetworkSeries, k: &'a (NetIfKey, String, String)) -> IfaceLabels<'a> {
        n.labels(&k.0, &k.1, &k.2)
    }
    let traffic = |k: &NetIfKey| n.interfaces.get(k);
    let dir_ok = |d: &str| if d == "sent" { a.tx } else { a.rx };

    type DirValue = fn(&NetDirStats) -> u64;
    let families: [(&str, &str, DirValue); 6] = [
        (
            "stormwatch_interface_packets",
            "Packets the interface handled, by direction (a GSO/GRO super-packet counts once, \
             as the device's own counters do).",
            |d| d.packets,
        ),
        (
            "stormwatch_interface_bytes",
            "IP-level bytes the interface handled, by direction.",
            |d| d.bytes,
        ),
        (
            "stormwatch_interface_gso_packets",
            "GSO (sent) and GRO (received) super-packets at the interface.",
            |d| d.gso_packets,
        ),
        (
            "stormwatch_interface_gso_segments",
            "Segments the interface's GSO/GRO super-packets carried.",
            |d| d.gso_segments,
        ),
        (
            "stormwatch_interface_fragments",
            "IPv4 and IPv6 fragments at the interface, by direction.",
            |d| d.fragments,
        ),
        (
            "stormwatch_interface_packet_too_big",
            "ICMP \"fragmentation needed\" and ICMPv6 \"packet too big\" messages at the \
             interface, by direction.",
            |d| d.ptb,
        ),
    ];
    if a.tx || a.rx {
        for (name, help, value) in families {
            let mut m = enc.encode_descriptor(name, help, None, Counter)?;
            for k in &keys {
                let Some(s) = traffic(&k.0) else { continue };
                for (dir, d) in directions(s) {
                    if dir_ok(dir) {
                        counter(&mut m, &(labels(n, k), [("direction", dir)]), Int(value(d)))?;
                    }
                }
            }
        }
        let mut m = enc.encode_descriptor(
            "stormwatch_interface_packets_by_size",
            "Packets that are not GSO/GRO super-packets, by direction and IP length against \
             the interface's MTU: below_mtu (more than 80 bytes under it), near_mtu (within 80 \
             bytes under it), at_mtu, above_mtu (received from a peer with a larger MTU; sent: \
             should not exist).",
            None,
            Counter,
        )?;
        for k in &keys {
            let Some(s) = traffic(&k.0) else { continue };
            for (dir, d) in directions(s) {
                if !dir_ok(dir) {
                    continue;
                }
                for (size, v) in sizes_against_mtu(d) {
                    counter(
                        &mut m,
                        &(labels(n, k), [("direction", dir), ("size", size)]),
                        Int(v),
                    )?;
                }
            }
        }
    }
    if a.drops {
        let mut m = enc.encode_descriptor(
            "stormwatch_interface_drops",
            "Packets the kernel dropped, by interface and reason (enum skb_drop_reason); \
             netns and interface are empty when the packet named no device.",
            None,
            Counter,
        )?;
        for (k, v) in &n.drops {
            let key = NetIfKey {
                netns: k.netns,
                ifindex: k.ifindex,
            };
            let (ifindex, netns) = if k.netns == 0 {
                (String::new(), String::new())
            } else {
                (k.ifindex.to_string(), k.netns.to_string())
            };
            let reason = drop_reason_name(k.reason);
            counter(
                &mut m,
                &(
                    n.labels(&key, &ifindex, &netns),
                    [("reason", reason.as_str())],
                ),
                Int(*v),
            )?;
        }
    }

    // The inventory: every interface netlink reported (idle ones included), else the MTU the
    // probes saw on the interface's last packet.
    let mut m = enc.encode_descriptor(
        "stormwatch_interface_mtu_bytes",
        "The interface's MTU (kind: veth, vxlan, physical…; empty when only the probes saw it).",
        None,
        Gauge,
    )?;
    for k in &keys {
        let (kind, mtu) = match (n.inventory.get(&k.0), traffic(&k.0)) {
            (Some(i), _) => (i.kind.as_str(), i.mtu),
            (None, Some(s)) if s.mtu != 0 => ("", s.mtu),
            _ => continue,
        };
        gauge(
            &mut m,
            &(labels(n, k), [("kind", kind)]),
            Int(u64::from(mtu)),
        )?;
    }
    type Inventoried = fn(&InterfaceInfo) -> Option<u32>;
    let inventoried: [(&str, &str, Inventoried); 2] = [
        (
            "stormwatch_interface_encapsulation_overhead_bytes",
            "Bytes the interface's kind adds to each packet it carries (0 for plain devices; \
             absent when unknown, as for IPsec).",
            |i| i.encapsulation_overhead,
        ),
        (
            "stormwatch_interface_underlay_path_mtu_bytes",
            "For a tunnel: the largest outer packet its underlay carries (the underlay device's \
             MTU, or its route's when smaller). A tunnel's MTU should be at most this less its \
             encapsulation overhead.",
            |i| i.underlay_path_mtu,
        ),
    ];
    for (name, help, value) in inventoried {
        let mut m = enc.encode_descriptor(name, help, None, Gauge)?;
        for k in &keys {
            if let Some(i) = n.inventory.get(&k.0)
                && let Some(v) = value(i)
            {
                gauge(
                    &mut m,
                    &(labels(n, k), [("kind", i.kind.as_str())]),
                    Int(u64::from(v)),
                )?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{Arc, Mutex},
        time::Duration,
    };

    use stormwatch_common::net::NetDropStats;

    use super::*;
    use crate::{
        export::{metrics::Renderer, state::Exporter},
        report::Availability,
    };

    fn stats(tx_packets: u64, at_mtu: u64, mtu: u32) -> NetIfStats {
        let mut s = NetIfStats::ZERO;
        s.tx.packets = tx_packets;
        s.tx.bytes = tx_packets * 100;
        s.tx.len[len_bucket::AT_MTU] = at_mtu;
        s.tx.len[2] = tx_packets - at_mtu;
        s.rx.packets = 3;
        s.mtu = mtu;
        s
    }

    #[test]
    fn interfaces_are_labelled_with_their_namespaces_owner_and_forgotten_with_it() {
        let pod = NetIfKey {
            netns: 7,
            ifindex: 2,
        };
        let host = NetIfKey {
            netns: 1,
            ifindex: 4,
        };
        let mut e = Exporter::new(10, Duration::from_secs(60));
        e.avail = Availability::ALL;
        let mut window = Window::empty();
        window.net_ifaces.insert(pod, stats(10, 4, 1450));
        window.net_ifaces.insert(host, stats(5, 0, 9001));
        window.net_drops.insert(
            NetDropKey {
                netns: 7,
                ifindex: 2,
                reason: 2,
                _pad: 0,
            },
            NetDropStats { packets: 6 },
        );
        let owner = Owner {
            cgroup: "/kubepods/pod1/c1".into(),
            labels: Labels {
                namespace: "shop".into(),
                pod: "web-1".into(),
                container: "app".into(),
            },
        };
        let live = HashSet::from([pod, host]);
        e.network
            .apply(&window, &live, HashMap::from([(7, owner.clone())]));
        e.network.apply(&window, &live, HashMap::from([(7, owner)]));
        e.network.inventory.insert(
            pod,
            InterfaceInfo {
                name: "eth0".into(),
                kind: "veth".into(),
                mtu: 1450,
                encapsulation_overhead: Some(0),
                underlay_path_mtu: None,
            },
        );
        let e = Arc::new(Mutex::new(e));
        let text = Renderer::new(Arc::clone(&e)).openmetrics();
        let pod_labels = "netns=\"7\",ifindex=\"2\",interface=\"eth0\",namespace=\"shop\",\
                          pod=\"web-1\",container=\"app\",cgroup=\"/kubepods/pod1/c1\"";
        for want in [
            format!("stormwatch_interface_packets_total{{{pod_labels},direction=\"sent\"}} 20"),
            format!("stormwatch_interface_packets_total{{{pod_labels},direction=\"received\"}} 6"),
            format!(
                "stormwatch_interface_packets_by_size_total{{{pod_labels},direction=\"sent\",\
                 size=\"at_mtu\"}} 8"
            ),
            format!(
                "stormwatch_interface_packets_by_size_total{{{pod_labels},direction=\"sent\",\
                 size=\"below_mtu\"}} 12"
            ),
            format!("stormwatch_interface_mtu_bytes{{{pod_labels},kind=\"veth\"}} 1450"),
            format!(
                "stormwatch_interface_encapsulation_overhead_bytes{{{pod_labels},kind=\"veth\"}} 0"
            ),
            // Not in the inventory: the MTU the probes saw, no name, no kind, no owner.
            "stormwatch_interface_mtu_bytes{netns=\"1\",ifindex=\"4\",interface=\"\",\
             namespace=\"\",pod=\"\",container=\"\",cgroup=\"\",kind=\"\"} 9001"
                .to_owned(),
        ] {
            assert!(text.contains(&want), "missing {want:?} in:\n{text}");
        }
        assert!(
            text.contains("stormwatch_interface_drops_total{netns=\"7\",ifindex=\"2\""),
            "{text}"
        );
        // The pod's namespace is gone: its interface and drops go with it.
        e.lock()
            .unwrap()
            .network
            .apply(&Window::empty(), &HashSet::from([host]), HashMap::new());
        let text = Renderer::new(e).openmetrics();
        assert!(!text.contains("netns=\"7\""), "{text}");
        assert!(text.contains("netns=\"1\""));
    }

    #[test]
    fn sizes_against_the_mtu_fold_the_log2_buckets_below_it() {
        let mut d = NetDirStats::ZERO;
        d.len[0] = 1;
        d.len[5] = 2;
        d.len[len_bucket::NEAR_MTU] = 3;
        d.len[len_bucket::AT_MTU] = 4;
        d.len[len_bucket::OVER_MTU] = 5;
        assert_eq!(
            sizes_against_mtu(&d),
            [
                ("below_mtu", 3),
                ("near_mtu", 3),
                ("at_mtu", 4),
                ("above_mtu", 5)
            ]
        );
    }
}
