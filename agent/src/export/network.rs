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

use std::collections::{BTreeMap, HashMap, HashSet};

use stormwatch_common::net::{NetDirStats, NetDropKey, NetIfKey, NetIfStats, len_bucket};

use super::labels::Labels;
use crate::{collect::Window, netinfo::inventory::Namespace};

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
    pub(super) interfaces: BTreeMap<NetIfKey, NetIfStats>,
    /// Per (interface, reason).
    pub(super) drops: BTreeMap<NetDropKey, u64>,
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

    pub(super) fn labels<'a>(
        &'a self,
        key: &NetIfKey,
        ifindex: &'a str,
        netns: &'a str,
    ) -> IfaceLabels<'a> {
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

pub(super) fn directions(s: &NetIfStats) -> [(&'static str, &NetDirStats); 2] {
    [("sent", &s.tx), ("received", &s.rx)]
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
        collect::Availability,
        export::{metrics::Renderer, state::Exporter},
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
