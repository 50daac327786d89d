use std::{collections::BTreeSet, path::PathBuf};

use super::*;
use crate::netinfo::encapsulation::TunnelAttrs;
use crate::netinfo::namespaces::{host_inode, v2_cgroup_of};

fn l(ifindex: u32, name: &str, mtu: u32, kind: Option<&str>) -> Link {
    Link {
        ifindex,
        name: name.into(),
        mtu,
        link_type: if ifindex == 1 { "loopback" } else { "ether" }.into(),
        info_kind: kind.map(str::to_owned),
        ..Link::default()
    }
}

/// lo; a veth whose peer is in another namespace; a VXLAN with a remote; the uplink; a
/// veth pair within the namespace (one end in a bridge); flannel.1 (VXLAN over eth0).
fn links() -> Vec<Link> {
    let peer_elsewhere = Link {
        link_index: Some(7),
        link_netnsid: Some(0),
        ..l(2, "ulA", 1500, Some("veth"))
    };
    let overlay = Link {
        tunnel: TunnelAttrs {
            remote: Some("10.200.0.2".parse().unwrap()),
            ..TunnelAttrs::default()
        },
        ..l(3, "ovA", 1500, Some("vxlan"))
    };
    let va = Link {
        link: Some("vb".into()),
        link_index: Some(6),
        master: Some("br0".into()),
        ..l(5, "va", 1500, Some("veth"))
    };
    let vb = Link {
        link: Some("va".into()),
        link_index: Some(5),
        ..l(6, "vb", 1500, Some("veth"))
    };
    let flannel = Link {
        link: Some("eth0".into()),
        link_index: Some(4),
        ..l(8, "flannel.1", 8951, Some("vxlan"))
    };
    vec![
        l(1, "lo", 65536, None),
        peer_elsewhere,
        overlay,
        l(4, "eth0", 9001, None),
        va,
        vb,
        flannel,
    ]
}

fn route(dst: &str, dev: &str, table: Option<&str>, mtu: Option<u32>) -> Route {
    Route {
        dst: dst.into(),
        dev: Some(dev.into()),
        table: table.map(str::to_owned),
        mtu,
        ipv6: false,
    }
}

fn routes() -> Vec<Route> {
    vec![
        route("default", "eth0", Some("main"), None),
        route("10.99.0.0/16", "ulA", Some("main"), Some(1400)),
        route("default", "wg0", Some("51820"), None),
        route("127.0.0.1", "lo", Some("local"), None),
        route("10.1.0.0/16", "ulA", None, Some(1300)),
    ]
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
        links: Ok(links()),
        routes: routes(),
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
    let veth = |ifindex, name: &str, peer| Link {
        link_index: Some(peer),
        link_netnsid: Some(0),
        ..l(ifindex, name, 1500, Some("veth"))
    };
    let a = vec![veth(2, "ulA", 7)];
    let b = vec![veth(7, "ulB", 2), veth(2, "other", 9)];
    let mk = |inode, links: &[Link]| {
        let mut r = raw(None);
        r.links = Ok(links.to_vec());
        assemble(&netns(inode), r)
    };
    let mut all = vec![mk(10, &a), mk(20, &b)];
    let links = HashMap::from([(10, a), (20, b)]);
    pair_veths(&mut all, &links, |_, _| {
        panic!("a unique pair needs no namespace ids")
    });
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

/// Two pairs of namespaces made alike (both ends at index 2): only the namespace ids each
/// veth's namespace gives the others tell which is whose peer.
#[test]
fn alike_veth_pairs_are_told_apart_by_namespace_ids() {
    let veth = |name: &str, netnsid| Link {
        link_index: Some(2),
        link_netnsid: Some(netnsid),
        ..l(2, name, 1500, Some("veth"))
    };
    // 10 ↔ 20 and 30 ↔ 40; in each namespace its peer's id is 0 (10's peer) or 1.
    let links = HashMap::from([
        (10, vec![veth("a0", 0)]),
        (20, vec![veth("b0", 0)]),
        (30, vec![veth("a1", 1)]),
        (40, vec![veth("b1", 1)]),
    ]);
    let peer_of = HashMap::from([(10, 20), (20, 10), (30, 40), (40, 30)]);
    let id_of = HashMap::from([(10, 0), (20, 0), (30, 1), (40, 1)]);
    let mk = |inode: u64| {
        let mut r = raw(None);
        r.links = Ok(links[&inode].clone());
        assemble(&netns(inode), r)
    };
    let mut all: Vec<Namespace> = [10, 20, 30, 40].into_iter().map(mk).collect();
    // Each namespace has an id for its peer only (as the kernel assigns them).
    let nsids = |observer: u64, candidates: &[u64]| {
        Some(
            candidates
                .iter()
                .map(|c| (peer_of[&observer] == *c).then_some(id_of[&observer]))
                .collect(),
        )
    };
    pair_veths(&mut all, &links, nsids);
    for ns in &all {
        let peer = ns.interfaces[0].peer.as_ref().expect("paired");
        assert_eq!(peer.netns, peer_of[&ns.inode], "{ns:?}");
    }

    // Unanswered (the namespace cannot be entered): no peer rather than a guess.
    let mut all: Vec<Namespace> = [10, 20, 30, 40].into_iter().map(mk).collect();
    pair_veths(&mut all, &links, |_, _| None);
    assert!(all.iter().all(|ns| ns.interfaces[0].peer.is_none()));
}

/// `ARPHRD_*` from `linux/if_arp.h`, as the kernel's `dev->type` holds them.
const ARPHRD_ETHER: u16 = 1;
const ARPHRD_LOOPBACK: u16 = 772;
const ARPHRD_NONE: u16 = 0xfffe;

fn seen(name: &str, kind: &str, link_type: u16, mtu: u32) -> SeenInterface {
    let mut info = NetIfInfo::ZERO;
    info.name[..name.len()].copy_from_slice(name.as_bytes());
    info.kind[..kind.len()].copy_from_slice(kind.as_bytes());
    info.link_type = link_type;
    SeenInterface::from_kernel(&info, mtu)
}

#[test]
fn the_kernels_record_names_kinds_like_rtnetlink() {
    assert_eq!(
        seen("eth0", "veth", ARPHRD_ETHER, 1450),
        SeenInterface {
            name: "eth0".into(),
            kind: "veth".into(),
            mtu: 1450
        }
    );
    assert_eq!(seen("lo", "", ARPHRD_LOOPBACK, 65536).kind, "loopback");
    assert_eq!(seen("ens5", "", ARPHRD_ETHER, 9001).kind, "physical");
    assert_eq!(
        seen("wg0", "wireguard", ARPHRD_NONE, 1420).kind,
        "wireguard"
    );
    // Other link types by rtnetlink's name for them, as `kind_of` gives it.
    assert_eq!(seen("sit0", "", 776, 1480).kind, "sit");
    // A full 15-character name (IFNAMSIZ with its NUL).
    assert_eq!(seen("abcdefghijklmno", "", 1, 1500).name, "abcdefghijklmno");
}

#[test]
fn what_the_probes_saw_fills_namespaces_that_could_not_be_read() {
    let key = |netns, ifindex| NetIfKey { netns, ifindex };
    let seen_map = HashMap::from([
        (key(7, 2), seen("ulA", "veth", ARPHRD_ETHER, 1500)),
        (key(8, 3), seen("flannel.1", "vxlan", ARPHRD_ETHER, 1450)),
        (key(8, 1), seen("lo", "", ARPHRD_LOOPBACK, 65536)),
        (key(9, 2), seen("eth0", "veth", ARPHRD_ETHER, 1450)),
    ]);
    let readable = assemble(&netns(7), raw(None));
    let mut unreadable = raw(None);
    unreadable.links = Err("entering it needs CAP_SYS_ADMIN".into());
    let mut out = vec![readable.clone(), assemble(&netns(9), unreadable)];
    add_seen(&mut out, &seen_map, Some(8));
    // Read over rtnetlink: untouched.
    assert_eq!(out.iter().find(|n| n.inode == 7), Some(&readable));
    // The host's (known by inode), not visible at all: first, from the probes.
    assert_eq!(out[0].inode, 8);
    assert!(out[0].host);
    let names: Vec<&str> = out[0].interfaces.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["lo", "flannel.1"]);
    let tunnel = &out[0].interfaces[1];
    assert_eq!(
        tunnel.encapsulation_overhead, None,
        "outer IP version unknown"
    );
    assert!(tunnel.encapsulation_note.is_some());
    assert_eq!(out[0].interfaces[0].encapsulation_overhead, Some(0));
    assert!(
        out[0]
            .error
            .as_deref()
            .unwrap()
            .contains("no process of it")
    );
    // Could not be entered: the reason stays, the probes' interfaces are added.
    let pod = out.iter().find(|n| n.inode == 9).unwrap();
    assert!(!pod.host);
    assert_eq!(pod.interfaces.len(), 1);
    assert_eq!(
        (pod.interfaces[0].name.as_str(), pod.interfaces[0].mtu),
        ("eth0", 1450)
    );
    let why = pod.error.as_deref().unwrap();
    assert!(why.starts_with("entering it needs CAP_SYS_ADMIN; interfaces as the probes"));
}

#[test]
fn the_cache_reuses_links_while_the_namespaces_stay() {
    let host: Vec<NetnsRef> = discover(host_inode(None))
        .into_iter()
        .filter(|n| n.host)
        .collect();
    let mut cache = InventoryCache::new(std::time::Duration::from_secs(60));
    let first = cache.collect(&host);
    let read_at = |c: &InventoryCache| c.read.as_ref().map(|r| r.0);
    let at = read_at(&cache).expect("kept");
    let second = cache.collect(&host);
    assert_eq!(
        read_at(&cache),
        Some(at),
        "the same namespaces: not re-read"
    );
    assert_eq!(first[0].interfaces, second[0].interfaces);
    assert!(second[0].snmp.is_some(), "the counters are read every time");
    // Another set of namespaces: read again.
    assert!(cache.collect(&[]).is_empty());
    assert_ne!(read_at(&cache), Some(at));
    // A one-off diagnosis keeps nothing.
    let mut none = InventoryCache::new(std::time::Duration::ZERO);
    none.collect(&host);
    assert!(none.read.is_none());
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
    // Reads this machine over rtnetlink (no capability needed for the agent's own
    // namespace); a failure here is the environment's, and must show.
    let all = discover(host_inode(None));
    let host = all.iter().find(|n| n.host).expect("the host's namespace");
    assert!(host.cgroups.is_empty());
    let read = collect(std::slice::from_ref(host));
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].error, None);
    assert!(read[0].interfaces.iter().any(|i| i.kind == "loopback"));
    assert!(read[0].snmp.and_then(|s| s.fragments_created).is_some());
}
