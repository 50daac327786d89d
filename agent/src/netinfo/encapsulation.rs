//! What each kind of link adds to the packets it carries: the encapsulation table.

use std::net::IpAddr;

use serde::Serialize;

/// A tunnel's attributes that decide its overhead, from its link's `IFLA_INFO_DATA`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TunnelAttrs {
    /// The remote endpoint, when the tunnel has a single one (not a multicast group).
    pub remote: Option<IpAddr>,
    /// An IPv6 endpoint (remote, local or group): the outer header is IPv6.
    pub ipv6: bool,
    /// GRE options on the transmit side: key, checksum, sequence number.
    pub gre_key: bool,
    pub gre_checksum: bool,
    pub gre_sequence: bool,
    /// ip6tnl / ip6gre add the 8-byte encapsulation-limit destination option (the limit is set
    /// and not turned off with `encaplimit none`).
    pub encap_limit: bool,
    /// Foo-over-UDP or GUE around ipip, sit and GRE.
    pub udp_encap: UdpEncap,
    /// The lower device, from the kind's own attribute (`IFLA_VXLAN_LINK`, `IFLA_GRE_LINK`,
    /// `IFLA_IPTUN_LINK`).
    pub lower: Option<u32>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UdpEncap {
    #[default]
    None,
    Fou,
    Gue,
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
pub fn encapsulation(kind: &str, t: &TunnelAttrs) -> Result<Option<Encapsulation>, String> {
    let v6 = t.ipv6;
    let remote = t.remote.map(|r| r.to_string());
    let ip = |v6: bool| if v6 { 40 } else { 20 };
    let ip_name = |v6: bool| if v6 { "IPv6" } else { "IPv4" };
    // GRE: 4 bytes of base header, and 4 more for each of key, checksum and sequence number
    // on the transmit side.
    let gre_opts = || -> (u32, String) {
        let opts: Vec<&str> = [
            (t.gre_key, "key"),
            (t.gre_checksum, "checksum"),
            (t.gre_sequence, "sequence"),
        ]
        .into_iter()
        .filter(|(set, _)| *set)
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
        if t.encap_limit {
            (8, " + 8 encapsulation-limit option")
        } else {
            (0, "")
        }
    };
    // Foo-over-UDP / GUE on ipip, sit and gre: a UDP header (+4 for GUE's own).
    let fou = || -> (u32, &'static str) {
        match t.udp_encap {
            UdpEncap::Fou => (8, " + 8 UDP (FOU)"),
            UdpEncap::Gue => (12, " + 8 UDP + 4 GUE"),
            UdpEncap::None => (0, ""),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(ip: &str) -> TunnelAttrs {
        let remote: IpAddr = ip.parse().unwrap();
        TunnelAttrs {
            remote: Some(remote),
            ipv6: remote.is_ipv6(),
            ..TunnelAttrs::default()
        }
    }

    #[test]
    fn encapsulation_overheads_by_kind() {
        let none = TunnelAttrs::default();
        let v6_group = TunnelAttrs {
            ipv6: true,
            ..TunnelAttrs::default()
        };
        let fou = TunnelAttrs {
            udp_encap: UdpEncap::Fou,
            ..TunnelAttrs::default()
        };
        let limit = TunnelAttrs {
            encap_limit: true,
            ..TunnelAttrs::default()
        };
        let key_csum = TunnelAttrs {
            gre_key: true,
            gre_checksum: true,
            ..TunnelAttrs::default()
        };
        let seq = TunnelAttrs {
            gre_sequence: true,
            ..TunnelAttrs::default()
        };
        let cases: &[(&str, &TunnelAttrs, Option<u32>)] = &[
            ("vxlan", &remote("10.0.0.2"), Some(50)),
            ("vxlan", &remote("fd00::2"), Some(70)),
            ("vxlan", &v6_group, Some(70)),
            ("geneve", &remote("10.0.0.2"), Some(50)),
            ("geneve", &remote("fd00::2"), Some(70)),
            ("wireguard", &none, Some(60)),
            ("ipip", &remote("10.0.0.2"), Some(20)),
            ("ipip", &fou, Some(28)),
            ("sit", &none, Some(20)),
            ("ip6tnl", &limit, Some(48)),
            ("ip6tnl", &none, Some(40)),
            ("gre", &none, Some(24)),
            ("gre", &key_csum, Some(32)),
            ("gretap", &seq, Some(42)),
            ("ip6gre", &none, Some(44)),
            ("ip6gretap", &limit, Some(66)),
        ];
        for (kind, attrs, want) in cases {
            let got = encapsulation(kind, attrs).unwrap().map(|e| e.overhead);
            assert_eq!(got, *want, "{kind} {attrs:?}");
        }
        for plain in [
            "veth", "bridge", "physical", "loopback", "macvlan", "vlan", "bond",
        ] {
            assert_eq!(encapsulation(plain, &none), Ok(None), "{plain}");
        }
        for unknown in ["xfrm", "vti", "erspan", "mystery"] {
            assert!(encapsulation(unknown, &none).is_err(), "{unknown}");
        }
        let e = encapsulation("vxlan", &remote("10.0.0.2"))
            .unwrap()
            .unwrap();
        assert_eq!(e.remote.as_deref(), Some("10.0.0.2"));
        assert!(!e.outer_ipv6);
        assert!(e.breakdown.contains("8 VXLAN"));
    }
}
