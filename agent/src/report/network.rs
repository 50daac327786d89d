//! The network parts of the `trace` report: the `network` object of each container, and the
//! `interfaces` and `network_namespaces` lists at the top of the document.
//!
//! As everywhere in the report, a figure whose probe is not attached is `null`, never zero.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use stormwatch_common::net::{
    CgroupNetStats, NetDirStats, NetDropKey, NetDropStats, NetIfKey, NetIfStats, len_bucket,
};

use crate::{
    collect::{NetAvailability, Window, iface_key},
    netinfo::{
        inventory::{Encapsulation, Namespace, Peer, RouteMtu, Underlay},
        snmp::Snmp,
    },
    probes::net,
};

/// A container's traffic: what its sockets sent and received (IP packets; GSO/GRO
/// super-packets count as the packets they carry).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct NetworkSummary {
    pub packets_sent: u64,
    pub packets_received: u64,
    /// IP-level bytes (link-layer headers not included).
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Packet sizes (IP length).
    pub packet_sizes: PacketSizes,
    /// Super-packets handed to the stack as one (GSO on send, GRO on receive).
    pub gso_packets_sent: u64,
    pub gro_packets_received: u64,
    /// TCP segments its sockets retransmitted and handed to the device: the kernel's
    /// `RetransSegs` less `TCPRetransFail` (a retransmission the device refused, counted by
    /// both, is not one the network saw; kernels before the tracepoint's `err` argument fire
    /// it for the sent ones only). `null` when that probe is not attached.
    pub tcp_retransmits: Option<u64>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PacketSizes {
    pub sent: LengthHistogram,
    pub received: LengthHistogram,
}

/// A packet-length histogram: its non-empty buckets, with the MTU's when it is known.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LengthHistogram {
    pub count: u64,
    /// The upper edge of the bucket holding the median / 99th percentile (the true value is
    /// at most this, and above the previous bucket's edge). `null` without packets.
    pub p50_bytes: Option<u32>,
    pub p99_bytes: Option<u32>,
    /// With the MTU known: packets just below it (within 80 bytes), exactly at it, and above it
    /// (not GSO/GRO: those are counted apart).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub near_mtu: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at_mtu: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub over_mtu: Option<u64>,
    pub buckets: Vec<LengthBucket>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LengthBucket {
    /// Inclusive bounds in bytes; `max` is `null` for the open-ended last bucket.
    pub min: u32,
    pub max: Option<u32>,
    pub count: u64,
}

/// The bounds of bucket `b` for an MTU (0: unknown).
pub fn bucket_bounds(b: usize, mtu: u32) -> (u32, Option<u32>) {
    let near_from = mtu.saturating_sub(len_bucket::NEAR_MTU_WIDTH - 1);
    match b {
        len_bucket::NEAR_MTU => (near_from, Some(mtu.saturating_sub(1))),
        len_bucket::AT_MTU => (mtu, Some(mtu)),
        len_bucket::OVER_MTU => (mtu.saturating_add(1), None),
        b => {
            let min = if b == 0 {
                0
            } else {
                len_bucket::log2_upper(b - 1).map_or(0, |u| u + 1)
            };
            let max = len_bucket::log2_upper(b);
            if mtu == 0 {
                (min, max)
            } else {
                // Below the MTU's own buckets.
                let cap = near_from.saturating_sub(1);
                (min, Some(max.map_or(cap, |m| m.min(cap))))
            }
        }
    }
}

/// Summarizes a histogram's counts (by [`len_bucket`]) for an MTU (0: unknown).
pub fn length_histogram(counts: &[u64; len_bucket::COUNT], mtu: u32) -> LengthHistogram {
    let count: u64 = counts.iter().sum();
    // Buckets in length order: the log2 ones, then near, at, over the MTU.
    let order: Vec<usize> = (0..len_bucket::COUNT).collect();
    let quantile = |q: f64| -> Option<u32> {
        if count == 0 {
            return None;
        }
        let rank = ((q * count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for &b in &order {
            seen += counts[b];
            if seen >= rank {
                let (min, max) = bucket_bounds(b, mtu);
                return Some(max.unwrap_or(min));
            }
        }
        None
    };
    let buckets = order
        .iter()
        .filter(|b| counts[**b] > 0)
        .map(|&b| {
            let (min, max) = bucket_bounds(b, mtu);
            LengthBucket {
                min,
                max,
                count: counts[b],
            }
        })
        .collect();
    let known = |b: usize| (mtu != 0).then_some(counts[b]);
    LengthHistogram {
        count,
        p50_bytes: quantile(0.5),
        p99_bytes: quantile(0.99),
        near_mtu: known(len_bucket::NEAR_MTU),
        at_mtu: known(len_bucket::AT_MTU),
        over_mtu: known(len_bucket::OVER_MTU),
        buckets,
    }
}

/// A container's `network` object, or `null` when the transmit and receive hooks are not both attached.
pub fn network_summary(n: &CgroupNetStats, avail: NetAvailability) -> Option<NetworkSummary> {
    avail.cgroup.then(|| NetworkSummary {
        packets_sent: n.tx_packets,
        packets_received: n.rx_packets,
        bytes_sent: n.tx_bytes,
        bytes_received: n.rx_bytes,
        packet_sizes: PacketSizes {
            sent: length_histogram(&n.tx_len, 0),
            received: length_histogram(&n.rx_len, 0),
        },
        gso_packets_sent: n.tx_gso_packets,
        gro_packets_received: n.rx_gso_packets,
        tcp_retransmits: avail.tcp_retransmits.then_some(n.tcp_retransmits),
    })
}

/// One direction of one interface.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct DirectionReport {
    /// Packets as the device handled them: a GSO/GRO super-packet counts once, as in the
    /// device's own counters.
    pub packets: u64,
    /// IP-level bytes.
    pub bytes: u64,
    pub gso_packets: u64,
    /// The packets those super-packets carry.
    pub gso_segments: u64,
    /// IPv4 fragments and IPv6 packets with a fragment header.
    pub fragments: u64,
    /// ICMP "fragmentation needed" and ICMPv6 "packet too big".
    pub packet_too_big: u64,
    /// Lengths of the packets that are not super-packets, against the MTU.
    pub lengths: LengthHistogram,
}

fn direction(d: &NetDirStats, mtu: u32) -> DirectionReport {
    DirectionReport {
        packets: d.packets,
        bytes: d.bytes,
        gso_packets: d.gso_packets,
        gso_segments: d.gso_segments,
        fragments: d.fragments,
        packet_too_big: d.ptb,
        lengths: length_histogram(&d.len, mtu),
    }
}

/// An entry of the `interfaces` list.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct InterfaceReport {
    pub name: String,
    /// The network namespace's inode (`stat -L /proc/<pid>/ns/net`).
    pub netns: u64,
    pub netns_name: Option<String>,
    pub host_netns: bool,
    pub ifindex: u32,
    /// physical, loopback, veth, bridge, vxlan, geneve, wireguard, ipip, gre, …
    pub kind: String,
    pub mtu: u32,
    /// Bytes its kind adds to each packet (0 for plain devices; `null` when unknown).
    pub encapsulation_overhead: Option<u32>,
    pub encapsulation: Option<Encapsulation>,
    pub underlay: Option<Underlay>,
    pub peer: Option<Peer>,
    pub uplink: bool,
    pub tx: Option<DirectionReport>,
    pub rx: Option<DirectionReport>,
    /// Drops at this interface by reason (`enum skb_drop_reason` names).
    pub drops: Option<BTreeMap<String, u64>>,
}

/// An entry of the `network_namespaces` list.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct NamespaceReport {
    pub netns: u64,
    pub name: Option<String>,
    pub host: bool,
    /// Cgroups of the processes in it (none listed for the host's).
    pub cgroups: Vec<String>,
    pub uplink: Option<String>,
    pub uplink_mtu: Option<u32>,
    pub route_mtus: Vec<RouteMtu>,
    /// The kernel's own counters over the window (`/proc/net/snmp`, `snmp6`); `null` when
    /// they could not be read at both ends.
    pub counters: Option<Snmp>,
    pub error: Option<String>,
}

/// Drops of the window by interface, with reason names.
pub fn drops_by_interface(window: &Window) -> HashMap<NetIfKey, BTreeMap<String, u64>> {
    let mut out: HashMap<NetIfKey, BTreeMap<String, u64>> = HashMap::new();
    for (k, v) in &window.net_drops {
        add_drop(&mut out, k, v);
    }
    out
}

fn add_drop(out: &mut HashMap<NetIfKey, BTreeMap<String, u64>>, k: &NetDropKey, v: &NetDropStats) {
    if v.packets == 0 {
        return;
    }
    let key = NetIfKey {
        netns: k.netns,
        ifindex: k.ifindex,
    };
    *out.entry(key)
        .or_default()
        .entry(net::drop_reason_name(k.reason))
        .or_default() += v.packets;
}

/// The `interfaces` list: every interface of every namespace, with the window's figures.
pub fn interfaces(
    namespaces: &[Namespace],
    window: &Window,
    avail: NetAvailability,
) -> Vec<InterfaceReport> {
    let drops = drops_by_interface(window);
    let mut out = Vec::new();
    for ns in namespaces {
        for i in &ns.interfaces {
            let key = iface_key(ns.inode, i.ifindex);
            let stats = window
                .net_ifaces
                .get(&key)
                .copied()
                .unwrap_or(NetIfStats::ZERO);
            // The MTU the probes saw (the kernel's, at the last packet), else the inventory's.
            let mtu = if stats.mtu != 0 { stats.mtu } else { i.mtu };
            out.push(InterfaceReport {
                name: i.name.clone(),
                netns: ns.inode,
                netns_name: ns.name.clone(),
                host_netns: ns.host,
                ifindex: i.ifindex,
                kind: i.kind.clone(),
                mtu: i.mtu,
                encapsulation_overhead: i.encapsulation_overhead,
                encapsulation: i.encapsulation.clone(),
                underlay: i.underlay.clone(),
                peer: i.peer.clone(),
                uplink: i.uplink,
                tx: avail.tx.then(|| direction(&stats.tx, mtu)),
                rx: avail.rx.then(|| direction(&stats.rx, mtu)),
                drops: avail
                    .drops
                    .then(|| drops.get(&key).cloned().unwrap_or_default()),
            });
        }
    }
    out
}

/// The `network_namespaces` list, with each namespace's counters over the window.
pub fn namespaces(namespaces: &[Namespace], snmp: &HashMap<u64, Snmp>) -> Vec<NamespaceReport> {
    namespaces
        .iter()
        .map(|ns| NamespaceReport {
            netns: ns.inode,
            name: ns.name.clone(),
            host: ns.host,
            cgroups: ns.cgroups.clone(),
            uplink: ns.uplink.clone(),
            uplink_mtu: ns.uplink_mtu,
            route_mtus: ns.route_mtus.clone(),
            counters: snmp.get(&ns.inode).copied(),
            error: ns.error.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netinfo::inventory::Interface;
    use stormwatch_common::net::len_bucket_of;

    fn hist(lengths: &[u32], mtu: u32) -> [u64; len_bucket::COUNT] {
        let mut h = [0; len_bucket::COUNT];
        for l in lengths {
            h[len_bucket_of(*l, mtu)] += 1;
        }
        h
    }

    #[test]
    fn bucket_bounds_cover_every_length_once() {
        for mtu in [0u32, 68, 1280, 1450, 1500, 9000, 65536] {
            for len in (0..70_000).step_by(7).chain([mtu.saturating_sub(80), mtu]) {
                let b = len_bucket_of(len, mtu);
                let (min, max) = bucket_bounds(b, mtu);
                assert!(
                    min <= len && max.is_none_or(|m| len <= m),
                    "mtu {mtu}: {len} in bucket {b} = {min}..={max:?}"
                );
            }
        }
        assert_eq!(
            bucket_bounds(len_bucket::NEAR_MTU, 1500),
            (1421, Some(1499))
        );
        assert_eq!(bucket_bounds(5, 1500), (1025, Some(1420)));
        assert_eq!(bucket_bounds(5, 0), (1025, Some(2048)));
        assert_eq!(bucket_bounds(9, 0), (16385, None));
    }

    #[test]
    fn histograms_name_the_mtu_buckets_and_quantiles() {
        let h = length_histogram(&hist(&[60, 1500, 1500, 1500, 1450, 70], 1500), 1500);
        assert_eq!(h.count, 6);
        assert_eq!(h.at_mtu, Some(3));
        assert_eq!(h.near_mtu, Some(1));
        assert_eq!(h.over_mtu, Some(0));
        assert_eq!(h.p50_bytes, Some(1499), "3rd of 6: the near-MTU bucket");
        assert_eq!(h.p99_bytes, Some(1500));
        assert_eq!(
            h.buckets,
            [
                LengthBucket {
                    min: 0,
                    max: Some(64),
                    count: 1
                },
                LengthBucket {
                    min: 65,
                    max: Some(128),
                    count: 1
                },
                LengthBucket {
                    min: 1421,
                    max: Some(1499),
                    count: 1
                },
                LengthBucket {
                    min: 1500,
                    max: Some(1500),
                    count: 3
                },
            ]
        );
        let none = length_histogram(&[0; len_bucket::COUNT], 0);
        assert_eq!((none.count, none.p50_bytes), (0, None));
        assert_eq!(none.at_mtu, None, "no MTU, no MTU buckets");
        let json = serde_json::to_value(&none).unwrap();
        assert!(json.get("at_mtu").is_none());
    }

    #[test]
    fn container_network_is_null_without_its_probes() {
        let mut n = CgroupNetStats::ZERO;
        n.tx_packets = 10;
        n.rx_packets = 9;
        n.tx_bytes = 1000;
        n.tcp_retransmits = 2;
        n.tx_len[len_bucket_of(100, 0)] = 10;
        let s = network_summary(&n, NetAvailability::ALL).unwrap();
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["packets_sent"], 10);
        assert_eq!(v["packets_received"], 9);
        assert_eq!(v["bytes_sent"], 1000);
        assert_eq!(v["tcp_retransmits"], 2);
        assert_eq!(v["packet_sizes"]["sent"]["p50_bytes"], 128);
        let no_tcp = NetAvailability {
            tcp_retransmits: false,
            ..NetAvailability::ALL
        };
        assert_eq!(network_summary(&n, no_tcp).unwrap().tcp_retransmits, None);
        assert_eq!(network_summary(&n, NetAvailability::default()), None);
    }

    fn namespace() -> Namespace {
        Namespace {
            inode: 4026532000,
            name: Some("swa".into()),
            host: false,
            pid: None,
            cgroups: vec!["/pod".into()],
            uplink: None,
            uplink_mtu: None,
            route_mtus: Vec::new(),
            interfaces: vec![Interface {
                name: "ovA".into(),
                ifindex: 3,
                kind: "vxlan".into(),
                mtu: 1500,
                encapsulation_overhead: Some(50),
                encapsulation: None,
                encapsulation_note: None,
                underlay: None,
                peer: None,
                master: None,
                operstate: None,
                uplink: false,
            }],
            snmp: None,
            error: None,
        }
    }

    #[test]
    fn interfaces_join_the_windows_figures_by_namespace_and_index() {
        let ns = namespace();
        let mut w = Window::empty();
        let key = iface_key(ns.inode, 3);
        let mut s = NetIfStats::ZERO;
        s.mtu = 1500;
        s.tx.packets = 5;
        s.tx.fragments = 2;
        s.tx.len[len_bucket::AT_MTU] = 4;
        s.tx.gso_packets = 1;
        s.tx.gso_segments = 40;
        w.net_ifaces.insert(key, s);
        w.net_drops.insert(
            NetDropKey {
                netns: key.netns,
                ifindex: 3,
                reason: 2,
                _pad: 0,
            },
            NetDropStats { packets: 7 },
        );
        let list = interfaces(std::slice::from_ref(&ns), &w, NetAvailability::ALL);
        let v = serde_json::to_value(&list).unwrap();
        let i = &v[0];
        assert_eq!(i["name"], "ovA");
        assert_eq!(i["netns"], 4026532000u64);
        assert_eq!(i["encapsulation_overhead"], 50);
        assert_eq!(i["tx"]["packets"], 5);
        assert_eq!(i["tx"]["fragments"], 2);
        assert_eq!(i["tx"]["gso_segments"], 40);
        assert_eq!(i["tx"]["lengths"]["at_mtu"], 4);
        assert_eq!(i["rx"]["packets"], 0);
        assert_eq!(i["drops"]["NOT_SPECIFIED"], 7);
        let partial = NetAvailability {
            tx: true,
            ..NetAvailability::default()
        };
        let v = serde_json::to_value(interfaces(&[ns], &w, partial)).unwrap();
        assert!(v[0]["rx"].is_null());
        assert!(v[0]["drops"].is_null());
        assert_eq!(v[0]["tx"]["packets"], 5);
    }

    #[test]
    fn namespaces_carry_their_window_counters() {
        let ns = namespace();
        let snmp = HashMap::from([(
            ns.inode,
            Snmp {
                fragments_created: Some(40),
                ..Snmp::default()
            },
        )]);
        let v = serde_json::to_value(namespaces(std::slice::from_ref(&ns), &snmp)).unwrap();
        assert_eq!(v[0]["counters"]["fragments_created"], 40);
        assert_eq!(v[0]["cgroups"][0], "/pod");
        let v = serde_json::to_value(namespaces(&[ns], &HashMap::new())).unwrap();
        assert!(v[0]["counters"].is_null());
    }
}
