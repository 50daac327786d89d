//! The kernel's own IP and ICMP counters of a network namespace (`/proc/net/snmp`,
//! `/proc/net/snmp6`, read from inside the namespace): fragmentation and reassembly, and the
//! ICMP messages that carry path-MTU information. These are the kernel's truth; no probe
//! needs to re-count them.
//!
//! Not procfs-core's `Snmp` and `Snmp6`, which the agent has at hand: they leave out the
//! `IcmpMsg` section (the destination-unreachable messages counted here), and fail the whole
//! file when one of the counters they know is not in a kernel's list, where here a missing
//! counter is one `None` and the rest stands.

use std::collections::HashMap;

use serde::Serialize;

/// The counters of one namespace at one instant (or, after [`Snmp::since`], over a window).
/// `None` where the file or the line is missing (IPv6 disabled, an old kernel).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Snmp {
    /// `Ip: FragCreates` + `Ip6FragCreates`: fragments this namespace made.
    pub fragments_created: Option<u64>,
    /// `Ip: FragOKs` + `Ip6FragOKs`: packets it fragmented.
    pub packets_fragmented: Option<u64>,
    /// `Ip: FragFails` + `Ip6FragFails`: packets it had to fragment and could not (DF set,
    /// or IPv6, which routers never fragment): each is dropped, usually with an ICMP
    /// "fragmentation needed" / "packet too big" to the sender.
    pub fragmentation_failures: Option<u64>,
    /// `Ip: ReasmReqds` + `Ip6ReasmReqds`: fragments received for reassembly.
    pub reassembly_fragments: Option<u64>,
    /// `Ip: ReasmFails` + `Ip6ReasmFails`: reassemblies that failed (lost fragments, timeouts).
    pub reassembly_failures: Option<u64>,
    /// `IcmpMsg: OutType3` / `InType3`: ICMP destination-unreachable messages (all codes:
    /// `/proc/net/snmp` does not split "fragmentation needed" from the others; the interface
    /// probes do).
    pub icmp_unreachable_sent: Option<u64>,
    pub icmp_unreachable_received: Option<u64>,
    /// `Icmp6OutPktTooBigs` / `Icmp6InPktTooBigs`: exactly the ICMPv6 "packet too big".
    pub icmp6_packet_too_big_sent: Option<u64>,
    pub icmp6_packet_too_big_received: Option<u64>,
}

/// `/proc/net/snmp`: pairs of lines, `Proto: Name Name…` then `Proto: value value…`.
pub fn parse_snmp(text: &str) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    let mut lines = text.lines();
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        let (Some((proto, names)), Some((proto2, values))) =
            (names.split_once(':'), values.split_once(':'))
        else {
            continue;
        };
        if proto != proto2 {
            continue;
        }
        for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
            // Some fields are signed (MaxConn -1); they are not counters we use.
            if let Ok(v) = v.parse::<u64>() {
                out.insert(format!("{proto}.{n}"), v);
            }
        }
    }
    out
}

/// `/proc/net/snmp6`: one `Name value` per line.
pub fn parse_snmp6(text: &str) -> HashMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (n, v) = (it.next()?, it.next()?);
            Some((n.to_owned(), v.parse().ok()?))
        })
        .collect()
}

fn sum(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    }
}

impl Snmp {
    /// From the texts of `/proc/net/snmp` and (when IPv6 is on) `/proc/net/snmp6`.
    pub fn from_texts(snmp: &str, snmp6: Option<&str>) -> Self {
        let v4 = parse_snmp(snmp);
        let v6 = snmp6.map(parse_snmp6).unwrap_or_default();
        let g4 = |k: &str| v4.get(k).copied();
        let g6 = |k: &str| v6.get(k).copied();
        // IcmpMsg lists only the types seen so far: a missing type is a zero once the line
        // exists at all (the Ip line always does).
        let icmp_msg = |k: &str| g4(k).or(g4("Ip.FragCreates").map(|_| 0));
        Self {
            fragments_created: sum(g4("Ip.FragCreates"), g6("Ip6FragCreates")),
            packets_fragmented: sum(g4("Ip.FragOKs"), g6("Ip6FragOKs")),
            fragmentation_failures: sum(g4("Ip.FragFails"), g6("Ip6FragFails")),
            reassembly_fragments: sum(g4("Ip.ReasmReqds"), g6("Ip6ReasmReqds")),
            reassembly_failures: sum(g4("Ip.ReasmFails"), g6("Ip6ReasmFails")),
            icmp_unreachable_sent: icmp_msg("IcmpMsg.OutType3"),
            icmp_unreachable_received: icmp_msg("IcmpMsg.InType3"),
            icmp6_packet_too_big_sent: g6("Icmp6OutPktTooBigs"),
            icmp6_packet_too_big_received: g6("Icmp6InPktTooBigs"),
        }
    }

    /// The change from `then` to `self`. A counter that went backwards (the namespace was
    /// recreated with the same inode) counts from zero; one missing at either end is `None`.
    pub fn since(&self, then: &Snmp) -> Snmp {
        let d = |now: Option<u64>, then: Option<u64>| -> Option<u64> {
            let now = now?;
            Some(match then {
                Some(t) if t <= now => now - t,
                _ => now,
            })
        };
        Snmp {
            fragments_created: d(self.fragments_created, then.fragments_created),
            packets_fragmented: d(self.packets_fragmented, then.packets_fragmented),
            fragmentation_failures: d(self.fragmentation_failures, then.fragmentation_failures),
            reassembly_fragments: d(self.reassembly_fragments, then.reassembly_fragments),
            reassembly_failures: d(self.reassembly_failures, then.reassembly_failures),
            icmp_unreachable_sent: d(self.icmp_unreachable_sent, then.icmp_unreachable_sent),
            icmp_unreachable_received: d(
                self.icmp_unreachable_received,
                then.icmp_unreachable_received,
            ),
            icmp6_packet_too_big_sent: d(
                self.icmp6_packet_too_big_sent,
                then.icmp6_packet_too_big_sent,
            ),
            icmp6_packet_too_big_received: d(
                self.icmp6_packet_too_big_received,
                then.icmp6_packet_too_big_received,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SNMP: &str = "\
Ip: Forwarding DefaultTTL InReceives InHdrErrors InAddrErrors ForwDatagrams InUnknownProtos InDiscards InDelivers OutRequests OutDiscards OutNoRoutes ReasmTimeout ReasmReqds ReasmOKs ReasmFails FragOKs FragFails FragCreates OutTransmits
Ip: 1 64 61 0 0 30 0 0 31 61 0 0 30 38 19 2 20 30 40 61
Icmp: InMsgs InErrors InCsumErrors InDestUnreachs OutMsgs OutDestUnreachs
Icmp: 30 0 0 30 30 30
IcmpMsg: InType3 OutType3 OutType8
IcmpMsg: 30 31 5
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens
Tcp: 1 200 120000 -1 0
";

    const SNMP6: &str = "\
Ip6InReceives                   	12
Ip6FragOKs                      	1
Ip6FragFails                    	4
Ip6FragCreates                  	3
Ip6ReasmReqds                   	6
Ip6ReasmFails                   	1
Icmp6InPktTooBigs               	2
Icmp6OutPktTooBigs              	7
";

    #[test]
    fn parses_both_files_and_adds_ipv4_and_ipv6() {
        let s = Snmp::from_texts(SNMP, Some(SNMP6));
        assert_eq!(s.fragments_created, Some(43));
        assert_eq!(s.packets_fragmented, Some(21));
        assert_eq!(s.fragmentation_failures, Some(34));
        assert_eq!(s.reassembly_fragments, Some(44));
        assert_eq!(s.reassembly_failures, Some(3));
        assert_eq!(s.icmp_unreachable_sent, Some(31));
        assert_eq!(s.icmp_unreachable_received, Some(30));
        assert_eq!(s.icmp6_packet_too_big_sent, Some(7));
        assert_eq!(s.icmp6_packet_too_big_received, Some(2));
        let raw = parse_snmp(SNMP);
        assert_eq!(raw["Ip.ReasmTimeout"], 30);
        assert!(!raw.contains_key("Tcp.MaxConn"), "-1 is no counter");
    }

    #[test]
    fn missing_ipv6_and_unseen_icmp_types() {
        let no_icmp = SNMP.replace("IcmpMsg: InType3 OutType3 OutType8\nIcmpMsg: 30 31 5\n", "");
        let s = Snmp::from_texts(&no_icmp, None);
        assert_eq!(s.fragments_created, Some(40));
        assert_eq!(
            s.icmp_unreachable_sent,
            Some(0),
            "no IcmpMsg line yet: none sent"
        );
        assert_eq!(s.icmp6_packet_too_big_sent, None, "IPv6 off: unknown");
        let nothing = Snmp::from_texts("", None);
        assert_eq!(nothing, Snmp::default());
        assert_eq!(
            Snmp::from_texts("garbage\n", Some("x y\n")),
            Snmp::default()
        );
    }

    #[test]
    fn deltas_count_from_zero_after_a_reset() {
        let then = Snmp::from_texts(SNMP, Some(SNMP6));
        let mut now = then;
        now.fragments_created = Some(50);
        now.reassembly_failures = Some(1);
        now.icmp6_packet_too_big_sent = None;
        let d = now.since(&then);
        assert_eq!(d.fragments_created, Some(7));
        assert_eq!(
            d.reassembly_failures,
            Some(1),
            "went backwards: counts from zero"
        );
        assert_eq!(d.icmp6_packet_too_big_sent, None);
        assert_eq!(d.fragmentation_failures, Some(0));
        let from_nothing = now.since(&Snmp::default());
        assert_eq!(from_nothing.fragments_created, Some(50));
    }
}
