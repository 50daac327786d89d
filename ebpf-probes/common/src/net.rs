//! The network family: per-interface packet lengths against the MTU, per-container traffic,
//! drops by reason and TCP retransmits: its names, globals and types, in a module of its own.
//!
//! Written by the kernel's `net.rs`; read by the agent's `probes/net.rs` and `netinfo`, reported by
//! `report/network.rs` and `diagnose/network.rs`, exported by `export/network.rs`.

/// Map names, as the kernel object declares them.
pub mod maps {
    /// Per-CPU hash: cgroup id (u64) → [`super::CgroupNetStats`].
    pub const CGROUP_NET: &str = "CGROUP_NET";
    /// Per-CPU hash: [`super::NetIfKey`] → [`super::NetIfStats`].
    pub const NET_IFACES: &str = "NET_IFACES";
    /// Array of [`crate::slots::SLOTS`] u64: the cgroups placed in `NET_CG_SLOTS` (0:
    /// free), written by the agent (see [`crate::slots`]).
    pub const NET_CG_SLOT_DIR: &str = "NET_CG_SLOT_DIR";
    /// Per-CPU array of [`crate::slots::SLOTS`] [`super::CgroupNetStats`]: the placed
    /// cgroups' figures, beside their `CGROUP_NET` entries.
    pub const NET_CG_SLOTS: &str = "NET_CG_SLOTS";
    /// Array of [`crate::slots::SLOTS`] u64: the interfaces ([`super::NetIfKey::packed`])
    /// placed in `NET_IF_SLOTS` (0: free), written by the agent.
    pub const NET_IF_SLOT_DIR: &str = "NET_IF_SLOT_DIR";
    /// Per-CPU array of [`crate::slots::SLOTS`] [`super::NetIfStats`]: the placed
    /// interfaces' figures, beside their `NET_IFACES` entries.
    pub const NET_IF_SLOTS: &str = "NET_IF_SLOTS";
    /// Array of [`crate::slots::SLOTS`] u64: the drop keys ([`super::NetDropKey::packed`])
    /// placed in `NET_DROP_SLOTS` (0: free), written by the agent.
    pub const NET_DROP_SLOT_DIR: &str = "NET_DROP_DIR";
    /// Per-CPU array of [`crate::slots::SLOTS`] [`super::NetDropStats`]: the placed keys'
    /// drops, beside their `NET_DROPS` entries.
    pub const NET_DROP_SLOTS: &str = "NET_DROP_SLOTS";
    /// Hash: [`super::NetIfKey`] → [`super::NetIfInfo`], written when an interface is
    /// first seen.
    pub const NET_IFINFO: &str = "NET_IFINFO";
    /// Per-CPU hash: [`super::NetDropKey`] → [`super::NetDropStats`].
    pub const NET_DROPS: &str = "NET_DROPS";
    /// Hash: network namespace inode (u32) → cgroup id (u64) its received traffic is
    /// counted for; written by the agent.
    pub const NETNS_CGROUP: &str = "NETNS_CGROUP";
    /// Array of [`crate::slots::SLOTS`] [`super::NetnsOwner`]: owners of `NETNS_CGROUP`
    /// that the agent placed in direct slots (at [`super::netns_owner_slot`]), which the
    /// receive hook reads with one inlined load before it hashes (`agent/src/probes/net.rs`,
    /// `OwnerSlots`, says how an entry is written and cleared).
    pub const NETNS_OWNER_SLOTS: &str = "NETNS_OWNER_SLOTS";
    /// Array of [`super::NOBODYS_NETNS_SLOTS`] u32: the namespace inodes that belong to no
    /// container whatever sends from them (the host's, the agent's own; 0: unset), written by
    /// the agent with `NETNS_CGROUP`'s owners. The receive hook skips its `NETNS_CGROUP`
    /// lookup for them (most of a node's received packets: its uplink and the host ends of its
    /// pods' veth pairs).
    pub const NET_NOBODYS: &str = "NET_NOBODYS";
    /// Hash: [`super::NetSenderKey`] → 0: which cgroups' processes send from which
    /// namespaces (the transmit hook notes them; the agent decides owners from them).
    pub const NET_SENDERS: &str = "NET_SENDERS";
    /// Per-CPU array: [`super::NetProbeError`] index → events the probes could not record.
    pub const NET_ERRORS: &str = "NET_ERRORS";
}

/// How many namespaces `NET_NOBODYS` holds: the host's and the agent's own.
pub const NOBODYS_NETNS_SLOTS: u32 = 2;

/// A namespace's owner in its direct slot (`maps::NETNS_OWNER_SLOTS`): all zeros when free.
/// Two words; the agent only ever writes a free slot whole or clears a placed one to zeros,
/// at least a collection interval apart, so a program's two loads see either one entry, or a
/// zero word that matches nothing (the hook then asks `NETNS_CGROUP`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetnsOwner {
    pub netns: u32,
    pub _pad: u32,
    pub cgroup: u64,
}

impl NetnsOwner {
    pub const FREE: Self = Self {
        netns: 0,
        _pad: 0,
        cgroup: 0,
    };
}

/// The one slot of `NETNS_OWNER_SLOTS` where namespace `netns`'s owner may be placed.
#[inline(always)]
pub const fn netns_owner_slot(netns: u32) -> u32 {
    crate::slots::slot_of(netns as u64)
}

/// Read-only globals: struct offsets from the running kernel's BTF, tracepoint record
/// offsets for the classic fallback.
pub mod globals {
    /// 1 when every `*_OFFSET` global below that comes from BTF is set.
    pub const HAVE_NET_OFFSETS: &str = "HAVE_NET_OFFSETS";
    /// `sk_buff`: `len`, `head`, `data`, `end`, `network_header`, `protocol`, `dev`.
    pub const SKB_LEN_OFFSET: &str = "SKB_LEN_OFFSET";
    pub const SKB_HEAD_OFFSET: &str = "SKB_HEAD_OFFSET";
    pub const SKB_DATA_OFFSET: &str = "SKB_DATA_OFFSET";
    pub const SKB_END_OFFSET: &str = "SKB_END_OFFSET";
    pub const SKB_NETWORK_HEADER_OFFSET: &str = "SKB_NETWORK_HEADER_OFFSET";
    pub const SKB_PROTOCOL_OFFSET: &str = "SKB_PROTOCOL_OFFSET";
    pub const SKB_DEV_OFFSET: &str = "SKB_DEV_OFFSET";
    /// `skb_shared_info`: `gso_size`, `gso_segs` (the struct sits at `skb->head + skb->end`).
    pub const SHINFO_GSO_SIZE_OFFSET: &str = "SHINFO_GSO_SIZE_OFFSET";
    pub const SHINFO_GSO_SEGS_OFFSET: &str = "SHINFO_GSO_SEGS_OFFSET";
    /// `net_device`: `mtu`, `ifindex`, and `nd_net.net` (the `struct net *`).
    pub const DEV_MTU_OFFSET: &str = "DEV_MTU_OFFSET";
    pub const DEV_IFINDEX_OFFSET: &str = "DEV_IFINDEX_OFFSET";
    pub const DEV_NET_OFFSET: &str = "DEV_NET_OFFSET";
    /// `net.ns.inum`: the network namespace's inode number.
    pub const NET_INUM_OFFSET: &str = "NET_INUM_OFFSET";
    /// `net_device`: `name`, `type`, `rtnl_link_ops`; `rtnl_link_ops`: `kind`.
    pub const DEV_NAME_OFFSET: &str = "DEV_NAME_OFFSET";
    pub const DEV_TYPE_OFFSET: &str = "DEV_TYPE_OFFSET";
    pub const DEV_LINK_OPS_OFFSET: &str = "DEV_LINK_OPS_OFFSET";
    pub const LINK_OPS_KIND_OFFSET: &str = "LINK_OPS_KIND_OFFSET";
    /// `sk_buff.sk`: the socket that sends the packet.
    pub const SKB_SK_OFFSET: &str = "SKB_SK_OFFSET";
    /// `sock.__sk_common.skc_family` and `.skc_state`: only full IPv4/IPv6 sockets count.
    pub const SOCK_FAMILY_OFFSET: &str = "SOCK_FAMILY_OFFSET";
    pub const SOCK_STATE_OFFSET: &str = "SOCK_STATE_OFFSET";
    /// `sock.sk_socket` and `socket.file`: a socket of a process has a file; the kernel's own
    /// sockets (ICMP, TCP control, neighbour discovery) do not.
    pub const SOCK_SOCKET_OFFSET: &str = "SOCK_SOCKET_OFFSET";
    pub const SOCKET_FILE_OFFSET: &str = "SOCKET_FILE_OFFSET";
    /// `sock.sk_cgrp_data.cgroup`, then `cgroup.kn`, `kernfs_node.id` (shared with the
    /// scheduler probes): a socket's cgroup v2 id.
    pub const SOCK_CGROUP_OFFSET: &str = "SOCK_CGROUP_OFFSET";
    pub use crate::globals::{CGROUP_KN_OFFSET, KERNFS_NODE_ID_OFFSET};
    /// Classic tracepoints: `skbaddr` of `net_dev_start_xmit` and `netif_receive_skb`.
    pub const TP_XMIT_SKB_OFFSET: &str = "TP_XMIT_SKB_OFFSET";
    pub const TP_RECEIVE_SKB_OFFSET: &str = "TP_RECEIVE_SKB_OFFSET";
    /// Classic `skb:kfree_skb`: `skbaddr` and `reason`.
    pub const TP_KFREE_SKB_OFFSET: &str = "TP_KFREE_SKB_OFFSET";
    pub const TP_KFREE_REASON_OFFSET: &str = "TP_KFREE_REASON_OFFSET";
    /// Classic `tcp:tcp_retransmit_skb`: `skaddr` and `skbaddr`.
    pub const TP_RETRANSMIT_SK_OFFSET: &str = "TP_RETRANSMIT_SK_OFFSET";
    pub const TP_RETRANSMIT_SKB_OFFSET: &str = "TP_RETRANSMIT_SKB_OFFSET";
    /// 1 when `tcp_retransmit_skb` passes `err` as its third argument (since 6.14 it also
    /// fires for retransmissions that failed; only successful ones are counted, as the
    /// kernel's `RetransSegs` does).
    pub const RETRANSMIT_HAS_ERR: &str = "RETRANSMIT_HAS_ERR";
    /// Classic `tcp:tcp_retransmit_skb`: `err`, or 0 when the record has no such field.
    pub const TP_RETRANSMIT_ERR_OFFSET: &str = "TP_RETRANSMIT_ERR_OFFSET";
}

/// Program names (the function names).
pub mod programs {
    pub const XMIT_BTF: &str = "net_dev_xmit_btf";
    pub const XMIT_TP: &str = "net_dev_xmit_tp";
    pub const RECEIVE_BTF: &str = "net_receive_btf";
    pub const RECEIVE_TP: &str = "net_receive_tp";
    pub const KFREE_SKB_BTF: &str = "net_kfree_skb_btf";
    pub const KFREE_SKB_TP: &str = "net_kfree_skb_tp";
    pub const RETRANSMIT_BTF: &str = "net_tcp_retransmit_btf";
    pub const RETRANSMIT_TP: &str = "net_tcp_retransmit_tp";
}

/// Buckets of a packet-length histogram. Lengths are of the IP packet (L3: what the MTU
/// bounds). Buckets `0..LOG2_COUNT` are powers of two from 64 bytes; when the MTU is known,
/// the last three take precedence: just below the MTU, exactly the MTU, and above it.
pub mod len_bucket {
    /// `<= 64`, `<= 128`, …, `<= 16384`, and `> 16384` (never above the MTU when it is known).
    pub const LOG2_COUNT: usize = 10;
    /// `mtu - NEAR_MTU_WIDTH < len < mtu`.
    pub const NEAR_MTU: usize = 10;
    /// `len == mtu`: full-size packets.
    pub const AT_MTU: usize = 11;
    /// `len > mtu` without GSO: should not exist on transmit; on receive, sent by a peer with
    /// a larger MTU.
    pub const OVER_MTU: usize = 12;
    pub const COUNT: usize = 13;
    /// The width of the "near the MTU" bucket: 80 bytes, the largest common encapsulation
    /// overhead (WireGuard over IPv6), so that packets that would fit a smaller overlay MTU
    /// but not this one land in it.
    pub const NEAR_MTU_WIDTH: u32 = 80;
    /// The upper edge of log2 bucket `b` (inclusive); the last one is open-ended.
    pub const fn log2_upper(b: usize) -> Option<u32> {
        if b + 1 >= LOG2_COUNT {
            None
        } else {
            Some(64 << b)
        }
    }
}

/// The bucket of an L3 length; `mtu` 0 means unknown (plain log2 buckets).
#[inline(always)]
pub const fn len_bucket_of(len: u32, mtu: u32) -> usize {
    if mtu != 0 {
        if len == mtu {
            return len_bucket::AT_MTU;
        }
        if len > mtu {
            return len_bucket::OVER_MTU;
        }
        if len + len_bucket::NEAR_MTU_WIDTH > mtu {
            return len_bucket::NEAR_MTU;
        }
    }
    if len <= 64 {
        return 0;
    }
    // 65..=128 → 1, 129..=256 → 2, …: the bit length of len - 1, less 6.
    let b = (u32::BITS - (len - 1).leading_zeros()) as usize - 6;
    if b >= len_bucket::LOG2_COUNT {
        len_bucket::LOG2_COUNT - 1
    } else {
        b
    }
}

/// One direction of one interface. `packets` and `bytes` count what the device handles: a
/// GSO/GRO super-packet counts once (as the device's own counters do), and is also counted
/// in `gso_packets`/`gso_segments`, never in the length histogram.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetDirStats {
    pub packets: u64,
    /// IP-level bytes (from the network header on).
    pub bytes: u64,
    pub gso_packets: u64,
    pub gso_segments: u64,
    /// IPv4 fragments (MF set or a fragment offset) and IPv6 packets with a fragment header.
    pub fragments: u64,
    /// ICMP "fragmentation needed" (type 3 code 4) and ICMPv6 "packet too big" (type 2).
    pub ptb: u64,
    /// Lengths of the packets that are not GSO/GRO super-packets, by [`len_bucket`].
    pub len: [u64; len_bucket::COUNT],
}

impl NetDirStats {
    pub const ZERO: Self = Self {
        packets: 0,
        bytes: 0,
        gso_packets: 0,
        gso_segments: 0,
        fragments: 0,
        ptb: 0,
        len: [0; len_bucket::COUNT],
    };
}

/// An interface: the inode of its network namespace and its index there.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetIfKey {
    pub netns: u32,
    pub ifindex: u32,
}

impl NetIfKey {
    /// The key in one word, as the interface slots' directory holds it: 0 for no interface
    /// (a namespace inode is never 0).
    #[inline(always)]
    pub const fn packed(&self) -> u64 {
        ((self.netns as u64) << 32) | self.ifindex as u64
    }

    /// The key [`NetIfKey::packed`] made.
    pub const fn unpacked(word: u64) -> Self {
        Self {
            netns: (word >> 32) as u32,
            ifindex: word as u32,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetIfStats {
    pub tx: NetDirStats,
    pub rx: NetDirStats,
    /// The MTU at the last packet (not a counter).
    pub mtu: u32,
    pub _pad: u32,
}

impl NetIfStats {
    pub const ZERO: Self = Self {
        tx: NetDirStats::ZERO,
        rx: NetDirStats::ZERO,
        mtu: 0,
        _pad: 0,
    };
}

/// What the kernel's `struct net_device` says an interface is, recorded by the probes when
/// they first see it: the inventory of namespaces the agent cannot enter (that takes
/// CAP_SYS_ADMIN) or cannot even see (no host pid namespace).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetIfInfo {
    /// `dev->name`, NUL-padded.
    pub name: [u8; 16],
    /// `dev->rtnl_link_ops->kind` (`veth`, `vxlan`, ...), NUL-padded; empty for devices
    /// no link type created (physical NICs, loopback).
    pub kind: [u8; 16],
    /// `dev->type`: the ARPHRD_* link-layer type.
    pub link_type: u16,
    pub _pad: [u8; 6],
}

impl NetIfInfo {
    pub const ZERO: Self = Self {
        name: [0; 16],
        kind: [0; 16],
        link_type: 0,
        _pad: [0; 6],
    };
}

/// Drops of one reason (`enum skb_drop_reason`) at one interface; `netns` and `ifindex` are
/// 0 when the packet named no device.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetDropKey {
    pub netns: u32,
    pub ifindex: u32,
    pub reason: u32,
    pub _pad: u32,
}

impl NetDropKey {
    /// The key in one word, as the drops' slot directory holds it, when its index is below
    /// 2^24 and its reason below 2^8 (the core's reasons; a subsystem's carry high bits); 0
    /// otherwise: such a key is never placed, and counts in `NET_DROPS` alone. Never 0 for a
    /// drop (its reason is at least 2).
    #[inline(always)]
    pub const fn packed(&self) -> u64 {
        if self.ifindex >= 1 << 24 || self.reason >= 1 << 8 {
            return 0;
        }
        ((self.netns as u64) << 32) | ((self.ifindex as u64) << 8) | self.reason as u64
    }

    /// The key [`NetDropKey::packed`] made.
    pub const fn unpacked(word: u64) -> Self {
        Self {
            netns: (word >> 32) as u32,
            ifindex: ((word >> 8) & 0xff_ffff) as u32,
            reason: (word & 0xff) as u32,
            _pad: 0,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetDropStats {
    pub packets: u64,
}

/// One cgroup's traffic (what its sockets send and receive), on one CPU. GSO/GRO
/// super-packets count as their segments in `*_packets` and in the histograms, and once in
/// `*_gso_packets`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupNetStats {
    pub tx_packets: u64,
    /// IP-level bytes of the packets on the wire (a super-packet's headers count once per
    /// segment).
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_gso_packets: u64,
    pub rx_gso_packets: u64,
    /// Segments retransmitted by the cgroup's TCP sockets (`tcp:tcp_retransmit_skb`, each
    /// skb counted as the segments it carries, as the kernel's `RetransSegs` does).
    pub tcp_retransmits: u64,
    /// Packet lengths (L3) by [`len_bucket`] (log2 buckets only: no MTU here).
    pub tx_len: [u64; len_bucket::COUNT],
    pub rx_len: [u64; len_bucket::COUNT],
}

impl CgroupNetStats {
    pub const ZERO: Self = Self {
        tx_packets: 0,
        tx_bytes: 0,
        rx_packets: 0,
        rx_bytes: 0,
        tx_gso_packets: 0,
        rx_gso_packets: 0,
        tcp_retransmits: 0,
        tx_len: [0; len_bucket::COUNT],
        rx_len: [0; len_bucket::COUNT],
    };
}

/// A cgroup whose processes send from a network namespace.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetSenderKey {
    pub netns: u32,
    pub _pad: u32,
    pub cgroup: u64,
}

/// What the network probes could not record, as indices into `NET_ERRORS`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetProbeError {
    /// `CGROUP_NET` is full.
    CgroupMapFull = 0,
    /// `NET_IFACES` is full.
    IfaceMapFull = 1,
    /// `NET_DROPS` is full.
    DropMapFull = 2,
    /// Reading an `sk_buff`, `net_device` or `sock` field failed.
    KernelRead = 3,
    /// A GSO packet's header length could not be parsed: its bytes count the header once
    /// and its segments are left out of the length histogram.
    GsoHeaderUnknown = 4,
    /// A retransmit on a socket whose cgroup could not be read.
    SocketCgroup = 5,
}

impl NetProbeError {
    pub const COUNT: u32 = 6;
    pub const ALL: [NetProbeError; Self::COUNT as usize] = [
        Self::CgroupMapFull,
        Self::IfaceMapFull,
        Self::DropMapFull,
        Self::KernelRead,
        Self::GsoHeaderUnknown,
        Self::SocketCgroup,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Self::CgroupMapFull => "net_cgroup_map_full",
            Self::IfaceMapFull => "net_iface_map_full",
            Self::DropMapFull => "net_drop_map_full",
            Self::KernelRead => "net_kernel_read",
            Self::GsoHeaderUnknown => "net_gso_header_unknown",
            Self::SocketCgroup => "net_socket_cgroup",
        }
    }
}

/// Ethernet protocol numbers as `sk_buff::protocol` holds them (big-endian), read as a
/// little-endian u16.
pub const ETH_P_IP_BE: u16 = 0x0008;
pub const ETH_P_IPV6_BE: u16 = 0xdd86;

/// What an IP header says about MTU trouble, from its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpClass {
    pub fragment: bool,
    /// Whether the packet carries ICMP(v6) at `l4_offset` (and is not a non-first fragment).
    pub icmp: bool,
    /// Offset of the L4 header from the IP header, when known.
    pub l4_offset: u32,
    /// The IP protocol / IPv6 next header.
    pub protocol: u8,
}

/// Classifies an IPv4 header (at least 20 bytes).
#[inline(always)]
pub const fn classify_ipv4(h: &[u8; 20]) -> IpClass {
    let ihl = (h[0] & 0x0f) as u32 * 4;
    let frag = ((h[6] as u16) << 8) | h[7] as u16;
    // MF (0x2000) or a non-zero offset (0x1fff).
    let fragment = frag & 0x3fff != 0;
    let first = frag & 0x1fff == 0;
    IpClass {
        fragment,
        icmp: h[9] == 1 && first,
        l4_offset: ihl,
        protocol: h[9],
    }
}

/// Classifies an IPv6 fixed header (the first 40 bytes; only `next header` is read). Only
/// a fragment header or ICMPv6 directly after the fixed header are recognized.
#[inline(always)]
pub const fn classify_ipv6(next_header: u8) -> IpClass {
    IpClass {
        fragment: next_header == 44,
        icmp: next_header == 58,
        l4_offset: 40,
        protocol: next_header,
    }
}

/// ICMP "destination unreachable / fragmentation needed" or ICMPv6 "packet too big".
#[inline(always)]
pub const fn is_ptb(ipv6: bool, icmp_type: u8, icmp_code: u8) -> bool {
    if ipv6 {
        icmp_type == 2
    } else {
        icmp_type == 3 && icmp_code == 4
    }
}

// SAFETY (all): plain #[repr(C)] structs of fixed-width integers with no padding (see the
// size tests).
#[cfg(feature = "user")]
mod user {
    unsafe impl aya::Pod for super::NetIfKey {}
    unsafe impl aya::Pod for super::NetIfStats {}
    unsafe impl aya::Pod for super::NetIfInfo {}
    unsafe impl aya::Pod for super::NetDropKey {}
    unsafe impl aya::Pod for super::NetDropStats {}
    unsafe impl aya::Pod for super::CgroupNetStats {}
    unsafe impl aya::Pod for super::NetSenderKey {}
    unsafe impl aya::Pod for super::NetnsOwner {}
}

#[cfg(test)]
mod tests {
    use super::{NetDropKey, NetIfKey};

    #[test]
    fn slot_words_round_trip_and_oversized_drop_keys_are_never_placed() {
        let iface = NetIfKey {
            netns: 0xefff_fff9,
            ifindex: 7,
        };
        assert_eq!(NetIfKey::unpacked(iface.packed()), iface);
        let drop = NetDropKey {
            netns: 0xefff_fff9,
            ifindex: 0xff_fffe,
            reason: 77,
            _pad: 0,
        };
        assert_eq!(NetDropKey::unpacked(drop.packed()), drop);
        let nowhere = NetDropKey {
            netns: 0,
            ifindex: 0,
            reason: 2,
            _pad: 0,
        };
        assert_eq!(NetDropKey::unpacked(nowhere.packed()), nowhere);
        assert_ne!(nowhere.packed(), 0);
        for big in [
            NetDropKey {
                ifindex: 1 << 24,
                ..drop
            },
            NetDropKey {
                reason: 0x1_0002,
                ..drop
            },
        ] {
            assert_eq!(big.packed(), 0, "{big:?}");
        }
    }

    use super::*;

    #[test]
    fn lengths_land_in_log2_buckets_below_the_mtu() {
        assert_eq!(len_bucket_of(0, 0), 0);
        assert_eq!(len_bucket_of(64, 0), 0);
        assert_eq!(len_bucket_of(65, 0), 1);
        assert_eq!(len_bucket_of(128, 0), 1);
        assert_eq!(len_bucket_of(129, 0), 2);
        assert_eq!(len_bucket_of(1024, 0), 4);
        assert_eq!(len_bucket_of(1025, 0), 5);
        assert_eq!(len_bucket_of(16384, 0), 8);
        assert_eq!(len_bucket_of(16385, 0), 9);
        assert_eq!(len_bucket_of(65535, 0), 9);
        assert_eq!(len_bucket_of(u32::MAX, 0), 9);
        for b in 0..len_bucket::LOG2_COUNT {
            match len_bucket::log2_upper(b) {
                Some(upper) => {
                    assert_eq!(len_bucket_of(upper, 0), b);
                    assert_eq!(len_bucket_of(upper + 1, 0), b + 1);
                }
                None => assert_eq!(b, len_bucket::LOG2_COUNT - 1),
            }
        }
    }

    #[test]
    fn the_mtu_has_its_own_buckets() {
        let mtu = 1500;
        assert_eq!(len_bucket_of(1500, mtu), len_bucket::AT_MTU);
        assert_eq!(len_bucket_of(1501, mtu), len_bucket::OVER_MTU);
        assert_eq!(len_bucket_of(9000, mtu), len_bucket::OVER_MTU);
        assert_eq!(len_bucket_of(1499, mtu), len_bucket::NEAR_MTU);
        assert_eq!(len_bucket_of(1421, mtu), len_bucket::NEAR_MTU);
        assert_eq!(
            len_bucket_of(1420, mtu),
            5,
            "mtu - 80 is below the near bucket"
        );
        assert_eq!(len_bucket_of(1450, 1450), len_bucket::AT_MTU);
        assert_eq!(len_bucket_of(84, 1500), 1);
        // A tiny MTU: everything at or near it.
        assert_eq!(len_bucket_of(60, 68), len_bucket::NEAR_MTU);
    }

    fn ipv4(frag_off: u16, protocol: u8, ihl: u8) -> [u8; 20] {
        let mut h = [0u8; 20];
        h[0] = 0x40 | ihl;
        h[6] = (frag_off >> 8) as u8;
        h[7] = frag_off as u8;
        h[9] = protocol;
        h
    }

    #[test]
    fn ipv4_fragments_and_icmp_are_recognized() {
        let df = 0x4000;
        let plain = classify_ipv4(&ipv4(df, 17, 5));
        assert!(!plain.fragment && !plain.icmp);
        assert_eq!(plain.l4_offset, 20);
        let first = classify_ipv4(&ipv4(0x2000, 1, 5));
        assert!(
            first.fragment && first.icmp,
            "first fragment of an ICMP packet"
        );
        let later = classify_ipv4(&ipv4(0x00b9, 1, 5));
        assert!(
            later.fragment && !later.icmp,
            "a later fragment has no ICMP header"
        );
        let last = classify_ipv4(&ipv4(0x00b9, 17, 5));
        assert!(last.fragment);
        let options = classify_ipv4(&ipv4(0, 1, 6));
        assert!(options.icmp && !options.fragment);
        assert_eq!(options.l4_offset, 24);
    }

    #[test]
    fn ipv6_and_ptb() {
        assert!(classify_ipv6(44).fragment);
        assert!(classify_ipv6(58).icmp);
        assert!(!classify_ipv6(6).fragment && !classify_ipv6(6).icmp);
        assert!(is_ptb(false, 3, 4));
        assert!(!is_ptb(false, 3, 3), "port unreachable");
        assert!(!is_ptb(false, 0, 0));
        assert!(is_ptb(true, 2, 0));
        assert!(!is_ptb(true, 1, 4));
    }

    #[test]
    fn net_layouts_have_no_padding() {
        let buckets = 8 * len_bucket::COUNT;
        assert_eq!(size_of::<NetDirStats>(), 8 * 6 + buckets);
        assert_eq!(size_of::<NetIfKey>(), 4 * 2);
        assert_eq!(
            size_of::<NetIfStats>(),
            2 * size_of::<NetDirStats>() + 4 * 2
        );
        assert_eq!(size_of::<NetIfInfo>(), 16 * 2 + 8);
        assert_eq!(size_of::<NetDropKey>(), 4 * 4);
        assert_eq!(size_of::<NetDropStats>(), 8);
        assert_eq!(size_of::<CgroupNetStats>(), 8 * 7 + 2 * buckets);
        assert_eq!(size_of::<NetSenderKey>(), 16);
        assert_eq!(size_of::<NetnsOwner>(), 16);
    }
}
