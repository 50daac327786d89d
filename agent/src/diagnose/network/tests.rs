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
