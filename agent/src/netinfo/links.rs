//! The links of a namespace, from rtnetlink (`RTM_GETLINK`): what the inventory uses of each.

use std::{collections::HashMap, net::IpAddr};

use netlink_packet_core::{DefaultNla, Nla as _};
use netlink_packet_route::link::{
    GreEncapType, GreIOFlags, InfoData, InfoGeneve, InfoGre, InfoGre6, InfoIpTunnel, InfoVxlan,
    Ip6TunnelFlags, LinkAttribute, LinkInfo, LinkLayerType, LinkMessage, TunnelEncapType,
};

use super::encapsulation::{TunnelAttrs, UdpEncap};

/// `IFLA_GRE_FLAGS`, which the route crate leaves undecoded for ip6gre.
const IFLA_GRE_FLAGS: u16 = 13;
/// `IP6_TNL_F_IGN_ENCAP_LIMIT`.
const IGNORE_ENCAP_LIMIT: u32 = 0x1;

/// One link (only what the inventory uses).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Link {
    pub ifindex: u32,
    pub name: String,
    pub mtu: u32,
    /// The link layer: `ether`, `loopback`, `none`…
    pub link_type: String,
    /// The rtnetlink kind (`veth`, `vxlan`, …); none for physical devices and loopback.
    pub info_kind: Option<String>,
    /// A tunnel's attributes.
    pub tunnel: TunnelAttrs,
    /// The lower device (or, for a veth, the peer) by name, when in this namespace.
    pub link: Option<String>,
    /// The lower device's (peer's) index, possibly in another namespace.
    pub link_index: Option<u32>,
    /// The lower device (peer) is in another namespace: that namespace's id as this one
    /// knows it (`IFLA_LINK_NETNSID`; ids are per observing namespace, see
    /// [`super::netlink::Rtnl::nsid_of`]).
    pub link_netnsid: Option<i32>,
    pub master: Option<String>,
    pub operstate: Option<String>,
}

/// The kind of a link: its rtnetlink kind, else `loopback` or `physical` (a driver's device
/// without rtnetlink kind: a NIC, virtio-net, ENA…).
pub fn kind_of(link: &Link) -> String {
    kind_from(link.info_kind.as_deref(), &link.link_type)
}

/// The kind of a link from its rtnetlink kind (`IFLA_INFO_KIND`, or the kernel's
/// `rtnl_link_ops->kind`) and its link-layer type's name ([`link_type`]).
pub fn kind_from(info_kind: Option<&str>, link_type: &str) -> String {
    match (info_kind, link_type) {
        (Some(k), _) => k.to_owned(),
        (None, "loopback") => "loopback".to_owned(),
        (None, "ether") => "physical".to_owned(),
        (None, "none") => "other".to_owned(),
        (None, t) => t.to_owned(),
    }
}

/// The name of a link-layer type (`ARPHRD_*`, as `dev->type` and rtnetlink's header give it).
pub fn link_type(t: LinkLayerType) -> String {
    match t {
        LinkLayerType::Ether => "ether".to_owned(),
        LinkLayerType::Loopback => "loopback".to_owned(),
        LinkLayerType::None => "none".to_owned(),
        other => format!("{other:?}").to_lowercase(),
    }
}

fn gre_output(t: &mut TunnelAttrs, flags: GreIOFlags) {
    t.gre_key = flags.contains(GreIOFlags::Key);
    t.gre_checksum = flags.contains(GreIOFlags::Checksum);
    t.gre_sequence = flags.contains(GreIOFlags::Seq);
}

fn gre_encap(t: GreEncapType) -> UdpEncap {
    match t {
        GreEncapType::Fou => UdpEncap::Fou,
        GreEncapType::Gue => UdpEncap::Gue,
        _ => UdpEncap::None,
    }
}

fn remote(t: &mut TunnelAttrs, ip: IpAddr) {
    if !ip.is_unspecified() && !ip.is_multicast() {
        t.remote = Some(ip);
    }
    t.ipv6 |= ip.is_ipv6();
}

fn u32_of(nla: &DefaultNla) -> Option<u32> {
    let mut buf = [0u8; 4];
    (nla.value_len() == 4).then(|| {
        nla.emit_value(&mut buf);
        u32::from_ne_bytes(buf)
    })
}

/// What a link's `IFLA_INFO_DATA` says about its encapsulation.
pub fn tunnel_attrs(data: &InfoData) -> TunnelAttrs {
    let mut t = TunnelAttrs::default();
    match data {
        InfoData::Vxlan(attrs) => {
            for a in attrs {
                match a {
                    InfoVxlan::Group(ip) => remote(&mut t, IpAddr::V4(*ip)),
                    InfoVxlan::Group6(ip) => remote(&mut t, IpAddr::V6(*ip)),
                    InfoVxlan::Local6(_) => t.ipv6 = true,
                    InfoVxlan::Link(i) if *i != 0 => t.lower = Some(*i),
                    _ => {}
                }
            }
        }
        InfoData::Geneve(attrs) => {
            for a in attrs {
                match a {
                    InfoGeneve::Remote(ip) => remote(&mut t, IpAddr::V4(*ip)),
                    InfoGeneve::Remote6(ip) => remote(&mut t, IpAddr::V6(*ip)),
                    InfoGeneve::Local6(_) => t.ipv6 = true,
                    _ => {}
                }
            }
        }
        InfoData::GreTun(attrs) | InfoData::GreTap(attrs) => {
            for a in attrs {
                match a {
                    InfoGre::Remote(ip) => remote(&mut t, IpAddr::V4(*ip)),
                    InfoGre::OFlags(f) => gre_output(&mut t, *f),
                    InfoGre::EncapType(e) => t.udp_encap = gre_encap(*e),
                    InfoGre::Link(i) if *i != 0 => t.lower = Some(*i),
                    _ => {}
                }
            }
        }
        InfoData::GreTun6(attrs) | InfoData::GreTap6(attrs) => {
            t.ipv6 = true;
            let mut limit = false;
            let mut ignored = false;
            for a in attrs {
                match a {
                    InfoGre6::Remote(ip) => remote(&mut t, IpAddr::V6(*ip)),
                    InfoGre6::OFlags(f) => gre_output(&mut t, *f),
                    InfoGre6::EncapLimit(_) => limit = true,
                    InfoGre6::Link(i) if *i != 0 => t.lower = Some(*i),
                    InfoGre6::Other(nla) if nla.kind() == IFLA_GRE_FLAGS => {
                        ignored = u32_of(nla).is_some_and(|f| f & IGNORE_ENCAP_LIMIT != 0);
                    }
                    _ => {}
                }
            }
            t.encap_limit = limit && !ignored;
        }
        InfoData::IpTunnel(attrs) => {
            let mut limit = false;
            let mut ignored = false;
            for a in attrs {
                match a {
                    InfoIpTunnel::Remote(ip) => remote(&mut t, *ip),
                    InfoIpTunnel::Local(ip) => t.ipv6 |= ip.is_ipv6(),
                    InfoIpTunnel::EncapLimit(_) => limit = true,
                    InfoIpTunnel::Ipv6Flags(f) => {
                        ignored = f.contains(Ip6TunnelFlags::IgnEncapLimit);
                    }
                    InfoIpTunnel::EncapType(TunnelEncapType::Fou) => t.udp_encap = UdpEncap::Fou,
                    InfoIpTunnel::EncapType(TunnelEncapType::Gue) => t.udp_encap = UdpEncap::Gue,
                    InfoIpTunnel::Link(i) if *i != 0 => t.lower = Some(*i),
                    _ => {}
                }
            }
            t.encap_limit = limit && !ignored;
        }
        _ => {}
    }
    t
}

/// The links of one namespace, with their lower devices and masters named.
pub fn links_from(messages: &[LinkMessage]) -> Vec<Link> {
    let names: HashMap<u32, String> = messages
        .iter()
        .filter_map(|m| {
            m.attributes.iter().find_map(|a| match a {
                LinkAttribute::IfName(n) => Some((m.header.index, n.clone())),
                _ => None,
            })
        })
        .collect();
    messages
        .iter()
        .filter_map(|m| {
            let mut l = Link {
                ifindex: m.header.index,
                link_type: link_type(m.header.link_layer_type),
                ..Link::default()
            };
            let mut mtu = None;
            let mut master = None;
            for a in &m.attributes {
                match a {
                    LinkAttribute::IfName(n) => l.name = n.clone(),
                    LinkAttribute::Mtu(v) => mtu = Some(*v),
                    LinkAttribute::Link(i) => l.link_index = Some(*i),
                    LinkAttribute::LinkNetNsId(id) => l.link_netnsid = Some(*id),
                    LinkAttribute::Controller(i) => master = Some(*i),
                    LinkAttribute::OperState(s) => {
                        l.operstate = Some(format!("{s:?}").to_uppercase());
                    }
                    LinkAttribute::LinkInfo(infos) => {
                        for info in infos {
                            match info {
                                LinkInfo::Kind(k) => l.info_kind = Some(k.to_string()),
                                LinkInfo::Data(d) => l.tunnel = tunnel_attrs(d),
                                _ => {}
                            }
                        }
                    }
                    _ => {}
                }
            }
            l.mtu = mtu?;
            if l.name.is_empty() {
                return None;
            }
            // The lower device: the generic IFLA_LINK (a device without one reports its own
            // index there), else the kind's own attribute. A peer in another namespace may have
            // the same index as this end.
            if l.link_netnsid.is_none() && l.link_index.is_none_or(|i| i == l.ifindex) {
                l.link_index = l.tunnel.lower;
            }
            if l.link_netnsid.is_none() {
                l.link = l.link_index.and_then(|i| names.get(&i).cloned());
            }
            l.master = master.and_then(|i| names.get(&i).cloned());
            Some(l)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use netlink_packet_route::link::InfoKind;

    use super::*;

    fn link(index: u32, name: &str, mtu: u32, extra: Vec<LinkAttribute>) -> LinkMessage {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.header.link_layer_type = LinkLayerType::Ether;
        m.attributes = vec![
            LinkAttribute::IfName(name.to_owned()),
            LinkAttribute::Mtu(mtu),
        ];
        m.attributes.extend(extra);
        m
    }

    #[test]
    fn links_have_their_kinds_peers_masters_and_tunnels() {
        let mut lo = link(1, "lo", 65536, vec![]);
        lo.header.link_layer_type = LinkLayerType::Loopback;
        let veth_other_ns = link(
            2,
            "ulA",
            1500,
            vec![
                // The peer may have this end's index, in its own namespace.
                LinkAttribute::Link(2),
                LinkAttribute::LinkNetNsId(0),
                LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Veth)]),
            ],
        );
        let vxlan = link(
            3,
            "ovA",
            1500,
            vec![LinkAttribute::LinkInfo(vec![
                LinkInfo::Kind(InfoKind::Vxlan),
                LinkInfo::Data(InfoData::Vxlan(vec![
                    InfoVxlan::Id(42),
                    InfoVxlan::Group(Ipv4Addr::new(10, 200, 0, 2)),
                    InfoVxlan::Local(Ipv4Addr::new(10, 200, 0, 1)),
                    InfoVxlan::Link(4),
                ])),
            ])],
        );
        let eth0 = link(4, "eth0", 9001, vec![]);
        let va = link(
            5,
            "va",
            1500,
            vec![
                LinkAttribute::Link(6),
                LinkAttribute::Controller(8),
                LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Veth)]),
            ],
        );
        let br = link(
            8,
            "br0",
            1500,
            vec![LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
                InfoKind::Bridge,
            )])],
        );
        let mut no_mtu = LinkMessage::default();
        no_mtu.header.index = 9;
        no_mtu.attributes = vec![LinkAttribute::IfName("broken".into())];
        let links = links_from(&[lo, veth_other_ns, vxlan, eth0, va, br, no_mtu]);
        assert_eq!(links.len(), 6, "a link without an MTU is skipped");
        let kinds: Vec<String> = links.iter().map(kind_of).collect();
        assert_eq!(
            kinds,
            ["loopback", "veth", "vxlan", "physical", "veth", "bridge"]
        );
        assert_eq!(links[1].link_netnsid, Some(0));
        assert_eq!(
            (links[1].link_index, links[1].link.as_deref()),
            (Some(2), None),
            "a peer in another namespace is not named"
        );
        assert_eq!(links[2].tunnel.remote, Some("10.200.0.2".parse().unwrap()));
        assert_eq!(
            links[2].link.as_deref(),
            Some("eth0"),
            "the VXLAN's lower device"
        );
        assert_eq!(links[4].master.as_deref(), Some("br0"));
    }

    #[test]
    fn tunnel_attributes_decide_the_overhead_inputs() {
        let multicast = tunnel_attrs(&InfoData::Vxlan(vec![InfoVxlan::Group(Ipv4Addr::new(
            239, 1, 1, 1,
        ))]));
        assert_eq!(multicast.remote, None, "a group is no single remote");
        let gre = tunnel_attrs(&InfoData::GreTun(vec![
            InfoGre::OFlags(GreIOFlags::Key | GreIOFlags::Checksum),
            InfoGre::IFlags(GreIOFlags::Seq),
            InfoGre::EncapType(GreEncapType::Gue),
        ]));
        assert!(
            gre.gre_key && gre.gre_checksum && !gre.gre_sequence,
            "{gre:?}"
        );
        assert_eq!(gre.udp_encap, UdpEncap::Gue);
        let ip6 = tunnel_attrs(&InfoData::IpTunnel(vec![
            InfoIpTunnel::Remote("fd00::2".parse().unwrap()),
            InfoIpTunnel::EncapLimit(4),
        ]));
        assert!(ip6.ipv6 && ip6.encap_limit);
        let ip6_none = tunnel_attrs(&InfoData::IpTunnel(vec![
            InfoIpTunnel::EncapLimit(4),
            InfoIpTunnel::Ipv6Flags(Ip6TunnelFlags::IgnEncapLimit),
        ]));
        assert!(!ip6_none.encap_limit, "`encaplimit none`");
    }
}
