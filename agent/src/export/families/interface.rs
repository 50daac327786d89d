//! The per-interface families: traffic each way, sizes against the MTU, drops by reason, and
//! the MTU inventory.

use std::fmt;

use stormwatch_common::net::NetIfKey;

use super::{Ctx, Emit, Family, Kind, Read, Sample, Scope, always};
use crate::{
    export::{
        encode::Value::Int,
        network::{InterfaceInfo, NetworkSeries, directions, sizes_against_mtu},
    },
    probes::net::drop_reason_name,
};

/// The labels of the inventory's families: the interface's, and its kind.
const IFACE_KIND: &[&str] = &[
    "netns",
    "ifindex",
    "interface",
    "namespace",
    "pod",
    "container",
    "cgroup",
    "kind",
];

/// The per-interface families, in the order of the exposition.
pub static FAMILIES: &[Family] = &[
    // ---- per interface ----
    iface_dir_family(
        "stormwatch_interface_packets",
        "Packets the interface handled, by direction (a GSO/GRO super-packet counts once, as the \
         device's own counters do).",
        "",
        |c, emit| each_direction(c, emit, |d| d.packets),
    ),
    iface_dir_family(
        "stormwatch_interface_bytes",
        "IP-level bytes the interface handled, by direction.",
        "bytes",
        |c, emit| each_direction(c, emit, |d| d.bytes),
    ),
    iface_dir_family(
        "stormwatch_interface_gso_packets",
        "GSO (sent) and GRO (received) super-packets at the interface.",
        "",
        |c, emit| each_direction(c, emit, |d| d.gso_packets),
    ),
    iface_dir_family(
        "stormwatch_interface_gso_segments",
        "Segments the interface's GSO/GRO super-packets carried.",
        "",
        |c, emit| each_direction(c, emit, |d| d.gso_segments),
    ),
    iface_dir_family(
        "stormwatch_interface_fragments",
        "IPv4 and IPv6 fragments at the interface, by direction.",
        "",
        |c, emit| each_direction(c, emit, |d| d.fragments),
    ),
    iface_dir_family(
        "stormwatch_interface_packet_too_big",
        "ICMP \"fragmentation needed\" and ICMPv6 \"packet too big\" messages at the interface, \
         by direction.",
        "",
        |c, emit| each_direction(c, emit, |d| d.ptb),
    ),
    Family {
        name: "stormwatch_interface_packets_by_size",
        help: "Packets that are not GSO/GRO super-packets, by direction and IP length against \
               the interface's MTU: below_mtu (more than 80 bytes under it), near_mtu (within \
               80 bytes under it), at_mtu, above_mtu (received from a peer with a larger MTU; \
               sent: should not exist).",
        kind: Kind::Counter,
        unit: "",
        labels: &[
            "netns",
            "ifindex",
            "interface",
            "namespace",
            "pod",
            "container",
            "cgroup",
            "direction",
            "size",
        ],
        scope: Scope::Interface,
        present: |c| c.e.avail.net.tx || c.e.avail.net.rx,
        absent: "as `stormwatch_interface_packets`",
        read: Read::Samples(|c, emit| {
            let n = &c.e.network;
            for k in interface_keys(n) {
                let Some(s) = n.interfaces.get(&k.0) else {
                    continue;
                };
                let l = n.labels(&k.0, &k.1, &k.2);
                for (dir, d) in directions(s) {
                    if !direction_probed(c, dir) {
                        continue;
                    }
                    for (size, v) in sizes_against_mtu(d) {
                        emit(
                            &[
                                l[0].1, l[1].1, l[2].1, l[3].1, l[4].1, l[5].1, l[6].1, dir, size,
                            ],
                            Sample::Value(Int(v)),
                        )?;
                    }
                }
            }
            Ok(())
        }),
    },
    Family {
        name: "stormwatch_interface_drops",
        help: "Packets the kernel dropped, by interface and reason (enum skb_drop_reason); netns \
               and interface are empty when the packet named no device.",
        kind: Kind::Counter,
        unit: "",
        labels: &[
            "netns",
            "ifindex",
            "interface",
            "namespace",
            "pod",
            "container",
            "cgroup",
            "reason",
        ],
        scope: Scope::Interface,
        present: |c| c.e.avail.net.drops,
        absent: "the drop probe is not attached; a reason not seen",
        read: Read::Samples(|c, emit| {
            let n = &c.e.network;
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
                let l = n.labels(&key, &ifindex, &netns);
                emit(
                    &[
                        l[0].1,
                        l[1].1,
                        l[2].1,
                        l[3].1,
                        l[4].1,
                        l[5].1,
                        l[6].1,
                        reason.as_str(),
                    ],
                    Sample::Value(Int(*v)),
                )?;
            }
            Ok(())
        }),
    },
    // The inventory: every interface netlink reported (idle ones included), else the MTU the
    // probes saw on the interface's last packet.
    Family {
        name: "stormwatch_interface_mtu_bytes",
        help: "The interface's MTU (kind: veth, vxlan, physical…; empty when only the probes saw \
               it).",
        kind: Kind::Gauge,
        unit: "bytes",
        labels: IFACE_KIND,
        scope: Scope::Interface,
        present: always,
        absent: "an interface neither in the inventory nor seen by the probes",
        read: Read::Samples(|c, emit| {
            let n = &c.e.network;
            for k in interface_keys(n) {
                let (kind, mtu) = match (n.inventory.get(&k.0), n.interfaces.get(&k.0)) {
                    (Some(i), _) => (i.kind.as_str(), i.mtu),
                    (None, Some(s)) if s.mtu != 0 => ("", s.mtu),
                    _ => continue,
                };
                let l = n.labels(&k.0, &k.1, &k.2);
                emit(
                    &[l[0].1, l[1].1, l[2].1, l[3].1, l[4].1, l[5].1, l[6].1, kind],
                    Sample::Value(Int(u64::from(mtu))),
                )?;
            }
            Ok(())
        }),
    },
    inventory_family(
        "stormwatch_interface_encapsulation_overhead_bytes",
        "Bytes the interface's kind adds to each packet it carries (0 for plain devices; absent \
         when unknown, as for IPsec).",
        |c, emit| each_inventoried(c, emit, |i| i.encapsulation_overhead),
    ),
    inventory_family(
        "stormwatch_interface_underlay_path_mtu_bytes",
        "For a tunnel: the largest outer packet its underlay carries (the underlay device's MTU, \
         or its route's when smaller). A tunnel's MTU should be at most this less its \
         encapsulation overhead.",
        |c, emit| each_inventoried(c, emit, |i| i.underlay_path_mtu),
    ),
];

/// Every interface with figures or in the inventory, with its ifindex and netns as text.
fn interface_keys(n: &NetworkSeries) -> Vec<(NetIfKey, String, String)> {
    n.interfaces
        .keys()
        .chain(n.inventory.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|k| (*k, k.ifindex.to_string(), k.netns.to_string()))
        .collect()
}

fn direction_probed(c: &Ctx, dir: &str) -> bool {
    if dir == "sent" {
        c.e.avail.net.tx
    } else {
        c.e.avail.net.rx
    }
}

const fn iface_dir_family(
    name: &'static str,
    help: &'static str,
    unit: &'static str,
    read: for<'a> fn(&'a Ctx<'a>, &mut Emit<'_, 'a>) -> fmt::Result,
) -> Family {
    Family {
        name,
        help,
        kind: Kind::Counter,
        unit,
        labels: &[
            "netns",
            "ifindex",
            "interface",
            "namespace",
            "pod",
            "container",
            "cgroup",
            "direction",
        ],
        scope: Scope::Interface,
        present: |c| c.e.avail.net.tx || c.e.avail.net.rx,
        absent: "the interface probes are not attached; a direction not probed; an interface \
                 without traffic",
        read: Read::Samples(read),
    }
}

fn each_direction<'a>(
    c: &'a Ctx<'a>,
    emit: &mut Emit<'_, 'a>,
    value: fn(&stormwatch_common::net::NetDirStats) -> u64,
) -> fmt::Result {
    let n = &c.e.network;
    for k in interface_keys(n) {
        let Some(s) = n.interfaces.get(&k.0) else {
            continue;
        };
        let l = n.labels(&k.0, &k.1, &k.2);
        for (dir, d) in directions(s) {
            if direction_probed(c, dir) {
                emit(
                    &[l[0].1, l[1].1, l[2].1, l[3].1, l[4].1, l[5].1, l[6].1, dir],
                    Sample::Value(Int(value(d))),
                )?;
            }
        }
    }
    Ok(())
}

const fn inventory_family(
    name: &'static str,
    help: &'static str,
    read: for<'a> fn(&'a Ctx<'a>, &mut Emit<'_, 'a>) -> fmt::Result,
) -> Family {
    Family {
        name,
        help,
        kind: Kind::Gauge,
        unit: "bytes",
        labels: IFACE_KIND,
        scope: Scope::Interface,
        present: always,
        absent: "an interface not in the inventory, or the figure unknown",
        read: Read::Samples(read),
    }
}

fn each_inventoried<'a>(
    c: &'a Ctx<'a>,
    emit: &mut Emit<'_, 'a>,
    value: fn(&InterfaceInfo) -> Option<u32>,
) -> fmt::Result {
    let n = &c.e.network;
    for k in interface_keys(n) {
        if let Some(i) = n.inventory.get(&k.0)
            && let Some(v) = value(i)
        {
            let l = n.labels(&k.0, &k.1, &k.2);
            emit(
                &[
                    l[0].1,
                    l[1].1,
                    l[2].1,
                    l[3].1,
                    l[4].1,
                    l[5].1,
                    l[6].1,
                    i.kind.as_str(),
                ],
                Sample::Value(Int(u64::from(v))),
            )?;
        }
    }
    Ok(())
}
