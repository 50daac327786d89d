//! The routes of a namespace, from rtnetlink (`RTM_GETROUTE`): the default route (the
//! uplink), the routes that set an MTU, and the route to a tunnel's remote.

use std::{collections::HashMap, net::IpAddr};

use netlink_packet_route::{
    AddressFamily,
    route::{RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteMetric},
};

/// A route (only what the inventory uses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// `default`, or the destination as `ip route` prints it (`10.0.0.0/16`, `10.0.0.1`).
    pub dst: String,
    pub dev: Option<String>,
    /// `main`, `local`, `default`, or the table's number.
    pub table: Option<String>,
    /// The route's `mtu` metric, when it sets one.
    pub mtu: Option<u32>,
    pub ipv6: bool,
}

fn address(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(ip) => Some(IpAddr::V4(*ip)),
        RouteAddress::Inet6(ip) => Some(IpAddr::V6(*ip)),
        _ => None,
    }
}

fn table_name(id: u32) -> String {
    match id {
        254 => "main".to_owned(),
        255 => "local".to_owned(),
        253 => "default".to_owned(),
        n => n.to_string(),
    }
}

/// A route as the inventory uses it; `names` names interfaces by index.
pub fn route_from(m: &RouteMessage, names: &HashMap<u32, String>) -> Option<Route> {
    let ipv6 = match m.header.address_family {
        AddressFamily::Inet => false,
        AddressFamily::Inet6 => true,
        _ => return None,
    };
    let mut destination = None;
    let mut dev = None;
    let mut table = u32::from(m.header.table);
    let mut mtu = None;
    for a in &m.attributes {
        match a {
            RouteAttribute::Destination(d) => destination = address(d),
            RouteAttribute::Oif(i) => dev = Some(*i),
            RouteAttribute::MultiPath(hops) => {
                dev = dev.or(hops.first().map(|h| h.interface_index));
            }
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Metrics(metrics) => {
                mtu = metrics.iter().find_map(|x| match x {
                    RouteMetric::Mtu(v) if *v != 0 => Some(*v),
                    _ => None,
                });
            }
            _ => {}
        }
    }
    let length = m.header.destination_prefix_length;
    let full = if ipv6 { 128 } else { 32 };
    let dst = match destination {
        None if length == 0 => "default".to_owned(),
        None => return None,
        Some(ip) if length == full => ip.to_string(),
        Some(ip) => format!("{ip}/{length}"),
    };
    Some(Route {
        dst,
        dev: dev.and_then(|i| names.get(&i).cloned()),
        table: (table != u32::from(RouteHeader::RT_TABLE_UNSPEC)).then(|| table_name(table)),
        mtu,
        ipv6,
    })
}

/// The default route of the main table, IPv4 first.
pub fn default_route(routes: &[Route]) -> Option<&Route> {
    let main = |r: &&Route| matches!(r.table.as_deref(), None | Some("main"));
    let default = |v6: bool| {
        routes
            .iter()
            .filter(main)
            .find(|r| r.dst == "default" && r.ipv6 == v6 && r.dev.is_some())
    };
    default(false).or_else(|| default(true))
}

#[cfg(test)]
mod tests {
    use netlink_packet_route::route::RouteNextHop;

    use super::*;

    fn message(
        family: AddressFamily,
        dst: Option<(&str, u8)>,
        table: u8,
        extra: Vec<RouteAttribute>,
    ) -> RouteMessage {
        let mut m = RouteMessage::default();
        m.header.address_family = family;
        m.header.table = table;
        if let Some((ip, len)) = dst {
            let ip: IpAddr = ip.parse().unwrap();
            m.header.destination_prefix_length = len;
            m.attributes
                .push(RouteAttribute::Destination(RouteAddress::from(ip)));
        }
        m.attributes.extend(extra);
        m
    }

    #[test]
    fn routes_default_route_and_route_mtus() {
        let names = HashMap::from([(4, "eth0".to_owned()), (2, "ulA".to_owned())]);
        let v4 = AddressFamily::Inet;
        let routes: Vec<Route> = [
            message(v4, None, 254, vec![RouteAttribute::Oif(4)]),
            message(
                v4,
                Some(("10.99.0.0", 16)),
                254,
                vec![
                    RouteAttribute::Oif(2),
                    RouteAttribute::Metrics(vec![RouteMetric::Mtu(1400)]),
                ],
            ),
            message(v4, None, 252, vec![RouteAttribute::Table(51820)]),
            message(v4, Some(("127.0.0.1", 32)), 255, vec![]),
            message(
                v4,
                Some(("10.1.0.0", 16)),
                254,
                vec![RouteAttribute::MultiPath(vec![{
                    let mut hop = RouteNextHop::default();
                    hop.interface_index = 2;
                    hop
                }])],
            ),
        ]
        .iter()
        .filter_map(|m| route_from(m, &names))
        .collect();
        assert_eq!(routes.len(), 5);
        assert_eq!(routes[0].dst, "default");
        assert_eq!(routes[1].mtu, Some(1400));
        assert_eq!(routes[1].dst, "10.99.0.0/16");
        assert_eq!(routes[2].table.as_deref(), Some("51820"));
        assert_eq!(routes[3].dst, "127.0.0.1");
        assert_eq!(routes[3].table.as_deref(), Some("local"));
        assert_eq!(routes[4].dev.as_deref(), Some("ulA"), "first next hop");
        assert_eq!(default_route(&routes).unwrap().dev.as_deref(), Some("eth0"));
        let v6 = [message(
            AddressFamily::Inet6,
            None,
            254,
            vec![RouteAttribute::Oif(4)],
        )];
        let v6: Vec<Route> = v6.iter().filter_map(|m| route_from(m, &names)).collect();
        assert!(v6[0].ipv6);
        assert_eq!(default_route(&v6).unwrap().dev.as_deref(), Some("eth0"));
        let only_other_table: Vec<Route> = routes[2..3].to_vec();
        assert_eq!(default_route(&only_other_table), None);
    }
}
