//! Network probes.
//!
//! - Per interface (network namespace inode + ifindex), each direction: packets and IP-level
//!   bytes as the device handles them, IP packet lengths against the device's MTU (a bucket
//!   just below it, one at it, one above it), GSO/GRO super-packets counted apart, IPv4/IPv6
//!   fragments and ICMP "fragmentation needed" / ICMPv6 "packet too big" messages.
//!   Transmit: `net:net_dev_start_xmit` (every packet handed to a driver, after the qdisc).
//!   Receive: `net:netif_receive_skb` (every packet entering the stack from a device,
//!   after GRO).
//! - Drops by reason and interface: `skb:kfree_skb`.
//! - Per cgroup, from the same two hooks: what its sockets send (`skb->sk`'s cgroup,
//!   `sk->sk_cgrp_data.cgroup->kn->id`) and what the interfaces of its network namespace
//!   receive; and TCP retransmits from `tcp:tcp_retransmit_skb` (the socket's cgroup too: the
//!   timer that retransmits runs in no task of the container). Tracepoints only: CAP_BPF and
//!   CAP_PERFMON, where cgroup_skb programs need CAP_NET_ADMIN.
//!
//! Struct offsets come from the running kernel's BTF, set by the agent as read-only globals;
//! without them (`HAVE_NET_OFFSETS` 0) the tracing programs record nothing.

use aya_ebpf::{
    helpers::{bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes},
    macros::{btf_tracepoint, map, tracepoint},
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap},
    programs::{BtfTracePointContext, TracePointContext},
};
use stormwatch_common::net::{
    CgroupNetStats, ETH_P_IP_BE, ETH_P_IPV6_BE, NOBODYS_NETNS_SLOTS, NetDirStats, NetDropKey,
    NetDropStats, NetIfInfo, NetIfKey, NetIfStats, NetProbeError, NetSenderKey, NetnsOwner,
    classify_ipv4, classify_ipv6, is_ptb, len_bucket, len_bucket_of, netns_owner_slot,
};

use crate::shared::{
    BPF_NOEXIST, CGROUP_KN_OFFSET, KERNFS_NODE_ID_OFFSET, count_in, global_u32, per_cpu_slot_or,
    placed, rdonly_cast, typed,
};
use stormwatch_common::slots::SLOTS;

const MAX_CGROUPS: u32 = 4096;
/// Interfaces of the host and every container's namespace: two per pod (a veth pair) plus
/// the host's own. The agent shrinks it on hosts with many CPUs (a per-CPU memory budget).
const MAX_IFACES: u32 = 4096;
const MAX_DROP_KEYS: u32 = 4096;
/// One per pod, and then some.
const MAX_NETNS: u32 = 4096;
/// A few containers per pod.
const MAX_SENDERS: u32 = 16384;

#[map(name = "CGROUP_NET")]
static CGROUP_NET: PerCpuHashMap<u64, CgroupNetStats> =
    PerCpuHashMap::with_max_entries(MAX_CGROUPS, 0);

#[map(name = "NET_IFACES")]
static NET_IFACES: PerCpuHashMap<NetIfKey, NetIfStats> =
    PerCpuHashMap::with_max_entries(MAX_IFACES, 0);

/// The cgroups and interfaces the agent placed in direct slots (`stormwatch_common::slots`),
/// and their figures.
#[map(name = "NET_CG_SLOT_DIR")]
static NET_CG_SLOT_DIR: Array<u64> = Array::with_max_entries(SLOTS, 0);

#[map(name = "NET_CG_SLOTS")]
static NET_CG_SLOTS: PerCpuArray<CgroupNetStats> = PerCpuArray::with_max_entries(SLOTS, 0);

#[map(name = "NET_IF_SLOT_DIR")]
static NET_IF_SLOT_DIR: Array<u64> = Array::with_max_entries(SLOTS, 0);

#[map(name = "NET_IF_SLOTS")]
static NET_IF_SLOTS: PerCpuArray<NetIfStats> = PerCpuArray::with_max_entries(SLOTS, 0);

#[map(name = "NET_DROP_DIR")]
static NET_DROP_DIR: Array<u64> = Array::with_max_entries(SLOTS, 0);

#[map(name = "NET_DROP_SLOTS")]
static NET_DROP_SLOTS: PerCpuArray<NetDropStats> = PerCpuArray::with_max_entries(SLOTS, 0);

/// This CPU's figures of a cgroup: its direct slot, else its `CGROUP_NET` entry (created).
#[inline(always)]
fn cgroup_net(cgroup: u64) -> Option<*mut CgroupNetStats> {
    placed(&NET_CG_SLOT_DIR, &NET_CG_SLOTS, cgroup).or_else(|| {
        slot(
            &CGROUP_NET,
            &cgroup,
            &CgroupNetStats::ZERO,
            NetProbeError::CgroupMapFull,
        )
    })
}

/// What each interface in `NET_IFACES` is (name, kind, link type), written when the probes
/// first see it: no other way gives the agent the names of interfaces in namespaces it may not
/// enter.
#[map(name = "NET_IFINFO")]
static NET_IFINFO: HashMap<NetIfKey, NetIfInfo> = HashMap::with_max_entries(MAX_IFACES, 0);

#[map(name = "NET_DROPS")]
static NET_DROPS: PerCpuHashMap<NetDropKey, NetDropStats> =
    PerCpuHashMap::with_max_entries(MAX_DROP_KEYS, 0);

/// Network namespace inode → the cgroup its received traffic belongs to (written by the agent:
/// namespaces whose processes all belong to one container or pod).
#[map(name = "NETNS_CGROUP")]
static NETNS_CGROUP: HashMap<u32, u64> = HashMap::with_max_entries(MAX_NETNS, 0);

/// Owners the agent placed in direct slots (`maps::NETNS_OWNER_SLOTS`).
#[map(name = "NETNS_OWNER_SLOTS")]
static NETNS_OWNER_SLOTS: Array<NetnsOwner> = Array::with_max_entries(SLOTS, 0);

/// The cgroup whose traffic a namespace's received packets are: its owner's direct slot, one
/// inlined array load, else its `NETNS_CGROUP` entry (a hash and a bucket walk, and in a
/// server's traffic cache lines that the packets between have evicted). A slot matches only
/// whole (see `NetnsOwner`): a zero word in either half sends the lookup to the hash.
#[inline(always)]
fn netns_owner(netns: u32) -> Option<u64> {
    if let Some(o) = NETNS_OWNER_SLOTS.get(netns_owner_slot(netns))
        && netns != 0
        && o.netns == netns
        && o.cgroup != 0
    {
        return Some(o.cgroup);
    }
    // SAFETY: a map lookup; the value is a plain u64.
    unsafe { NETNS_CGROUP.get(&netns) }
        .copied()
        .filter(|c| *c != 0)
}

/// The namespaces nobody owns, whatever sends from them (`maps::NET_NOBODYS`).
#[map(name = "NET_NOBODYS")]
static NET_NOBODYS: Array<u32> = Array::with_max_entries(NOBODYS_NETNS_SLOTS, 0);

/// Whether `netns` belongs to no container (the host's or the agent's): two inlined array
/// loads, where a `NETNS_CGROUP` lookup is a hash and a bucket walk on every received packet.
#[inline(always)]
fn nobodys(netns: u32) -> bool {
    let mut i = 0;
    while i < NOBODYS_NETNS_SLOTS {
        if NET_NOBODYS.get(i).is_some_and(|n| *n == netns) {
            return true;
        }
        i += 1;
    }
    false
}

/// (namespace, cgroup) pairs seen sending: what the agent decides owners from.
#[map(name = "NET_SENDERS")]
static NET_SENDERS: HashMap<NetSenderKey, u8> = HashMap::with_max_entries(MAX_SENDERS, 0);

#[map(name = "NET_ERRORS")]
static NET_ERRORS: PerCpuArray<u64> = PerCpuArray::with_max_entries(NetProbeError::COUNT, 0);

#[unsafe(no_mangle)]
static HAVE_NET_OFFSETS: u32 = 0;
#[unsafe(no_mangle)]
static SKB_LEN_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SKB_HEAD_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SKB_DATA_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SKB_END_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SKB_NETWORK_HEADER_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SKB_PROTOCOL_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SKB_DEV_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SHINFO_GSO_SIZE_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SHINFO_GSO_SEGS_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static DEV_MTU_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static DEV_IFINDEX_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static DEV_NET_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static NET_INUM_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static DEV_NAME_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static DEV_TYPE_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static DEV_LINK_OPS_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static LINK_OPS_KIND_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SKB_SK_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SOCK_FAMILY_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SOCK_STATE_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SOCK_SOCKET_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SOCKET_FILE_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SOCK_CGROUP_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TP_XMIT_SKB_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TP_RECEIVE_SKB_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TP_KFREE_SKB_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TP_KFREE_REASON_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TP_RETRANSMIT_SK_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TP_RETRANSMIT_SKB_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static RETRANSMIT_HAS_ERR: u32 = 0;
#[unsafe(no_mangle)]
static TP_RETRANSMIT_ERR_OFFSET: u32 = 0;
/// `stormwatch_common::kfuncs::globals`: 1 when `rdonly_cast` is the kernel's kfunc, and the
/// BTF ids of the structs read through it.
#[unsafe(no_mangle)]
static HAVE_RDONLY_CAST: u32 = 0;
#[unsafe(no_mangle)]
static SKB_SHARED_INFO_BTF_ID: u32 = 0;
#[unsafe(no_mangle)]
static IPHDR_BTF_ID: u32 = 0;
#[unsafe(no_mangle)]
static UDPHDR_BTF_ID: u32 = 0;

/// `SKB_CONSUMED` and `SKB_NOT_DROPPED_YET`: not drops.
const FIRST_DROP_REASON: u32 = 2;
/// `skb->network_header` when it was never set (`(typeof(network_header))~0U`).
const HEADER_UNSET: u16 = 0xffff;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
/// `sk_state` of the mini sockets that are not full `struct sock`s.
const TCP_TIME_WAIT: u8 = 6;
const TCP_NEW_SYN_RECV: u8 = 12;

#[inline(always)]
fn count_error(kind: NetProbeError) {
    count_in(&NET_ERRORS, kind as u32);
}

/// The per-CPU slot of `key`, created (from `zero`) on first use; `None` (counted) when full.
#[inline(always)]
fn slot<K, V>(map: &PerCpuHashMap<K, V>, key: &K, zero: &V, full: NetProbeError) -> Option<*mut V> {
    per_cpu_slot_or(map, key, zero, || count_error(full))
}

/// Reads a `T` at `base + offset` in kernel memory.
#[inline(always)]
fn read<T>(base: u64, offset: u32) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel tolerates any address; offsets come from BTF.
    unsafe { bpf_probe_read_kernel((base + offset as u64) as *const T) }.ok()
}

/// How a program reads kernel struct fields: tp_btf programs load them directly (their
/// arguments are BTF-typed pointers, and the offsets are constants to the verifier, which checks
/// each load against the kernel's types: a few nanoseconds instead of a helper call each);
/// classic tracepoints only have addresses, read with `bpf_probe_read_kernel`.
trait Fields {
    fn get<T: Copy>(base: u64, offset: u32) -> Option<T>;

    /// The GSO size and segments in the packet's shared info (`skb_shinfo(skb)`, at
    /// `shinfo`), (0, 0) when unread.
    #[inline(always)]
    fn gso(shinfo: u64) -> (u16, u16) {
        gso_probed(shinfo)
    }

    /// The bytes at the packet's IPv4 header.
    #[inline(always)]
    fn head4(l3: u64, protocol: u16) -> Head4 {
        Head4::read(l3, protocol)
    }
}

/// Whether the agent made `rdonly_cast` the kernel's kfunc (Linux 6.2+): the shared info and
/// the packet's headers are then read with direct loads, as typed pointers' fields are. The
/// two helper calls it saves were half of what a packet cost the transmit program (177 ns a
/// run against 88 without them, AMD VM; issue #43).
#[inline(always)]
fn have_cast() -> bool {
    global_u32(&HAVE_RDONLY_CAST) == 1
}

/// [`Fields::gso`] with `bpf_probe_read_kernel`.
#[inline(always)]
fn gso_probed(shinfo: u64) -> (u16, u16) {
    let (size_at, segs_at) = (
        global_u32(&SHINFO_GSO_SIZE_OFFSET),
        global_u32(&SHINFO_GSO_SEGS_OFFSET),
    );
    // Adjacent in every kernel so far: one read for both (the verifier drops the other arm).
    if segs_at == size_at + 2 {
        match read::<[u16; 2]>(shinfo, size_at) {
            Some([size, segs]) => (size, segs),
            None => (0, 0),
        }
    } else {
        (
            read::<u16>(shinfo, size_at).unwrap_or(0),
            read::<u16>(shinfo, segs_at).unwrap_or(0),
        )
    }
}

/// `bpf_probe_read_kernel`.
struct Probed;

impl Fields for Probed {
    #[inline(always)]
    fn get<T: Copy>(base: u64, offset: u32) -> Option<T> {
        read(base, offset)
    }
}

/// Direct loads from BTF-typed pointers (the verifier turns them into fault-tolerant loads).
struct Typed;

impl Fields for Typed {
    #[inline(always)]
    fn get<T: Copy>(base: u64, offset: u32) -> Option<T> {
        if base == 0 {
            return None;
        }
        // SAFETY: `base` is a BTF-typed kernel pointer and `offset` a field of its type, from
        // BTF; the verifier checks the access against the type and makes it fault-tolerant.
        Some(unsafe { core::ptr::read_volatile((base + offset as u64) as *const T) })
    }

    /// A load that faults reads 0, as a failed helper read gives (0, 0).
    #[inline(always)]
    fn gso(shinfo: u64) -> (u16, u16) {
        if !have_cast() {
            return gso_probed(shinfo);
        }
        let s = rdonly_cast(shinfo, global_u32(&SKB_SHARED_INFO_BTF_ID));
        (
            typed::<u16>(s, global_u32(&SHINFO_GSO_SIZE_OFFSET)),
            typed::<u16>(s, global_u32(&SHINFO_GSO_SEGS_OFFSET)),
        )
    }

    #[inline(always)]
    fn head4(l3: u64, protocol: u16) -> Head4 {
        if !have_cast() {
            return Head4::read(l3, protocol);
        }
        Head4::cast(l3, protocol)
    }
}

#[inline(always)]
fn have_offsets() -> bool {
    global_u32(&HAVE_NET_OFFSETS) == 1
}

// ---- per interface --------------------------------------------------------------------------

#[btf_tracepoint(function = "net_dev_start_xmit")]
pub fn net_dev_xmit_btf(ctx: BtfTracePointContext) -> i32 {
    // TP_PROTO(const struct sk_buff *skb, const struct net_device *dev)
    let skb: u64 = ctx.arg(0);
    let dev: u64 = ctx.arg(1);
    on_packet::<Typed>(skb, dev, true);
    0
}

#[tracepoint]
pub fn net_dev_xmit_tp(ctx: TracePointContext) -> i32 {
    if let Some(skb) = tp_read_u64(&ctx, global_u32(&TP_XMIT_SKB_OFFSET)) {
        on_packet_of::<Probed>(skb, true);
    }
    0
}

#[btf_tracepoint(function = "netif_receive_skb")]
pub fn net_receive_btf(ctx: BtfTracePointContext) -> i32 {
    // TP_PROTO(struct sk_buff *skb)
    let skb: u64 = ctx.arg(0);
    on_packet_of::<Typed>(skb, false);
    0
}

#[tracepoint]
pub fn net_receive_tp(ctx: TracePointContext) -> i32 {
    if let Some(skb) = tp_read_u64(&ctx, global_u32(&TP_RECEIVE_SKB_OFFSET)) {
        on_packet_of::<Probed>(skb, false);
    }
    0
}

#[inline(always)]
fn tp_read_u64(ctx: &TracePointContext, offset: u32) -> Option<u64> {
    // 0: the agent found no such field (the fallback is then not attached).
    if offset == 0 {
        return None;
    }
    // SAFETY: the offset comes from the tracepoint's format file; read_at bounds-checks.
    match unsafe { ctx.read_at::<u64>(offset as usize) } {
        Ok(v) => Some(v),
        Err(_) => {
            count_error(NetProbeError::KernelRead);
            None
        }
    }
}

/// A packet whose device is `skb->dev`.
#[inline(always)]
fn on_packet_of<F: Fields>(skb: u64, tx: bool) {
    if !have_offsets() {
        return;
    }
    match F::get::<u64>(skb, global_u32(&SKB_DEV_OFFSET)) {
        Some(dev) if dev != 0 => on_packet::<F>(skb, dev, tx),
        _ => count_error(NetProbeError::KernelRead),
    }
}

/// The key of a device: its namespace's inode and its index.
#[inline(always)]
fn iface_key<F: Fields>(dev: u64) -> Option<NetIfKey> {
    let ifindex = F::get::<u32>(dev, global_u32(&DEV_IFINDEX_OFFSET))?;
    let net = F::get::<u64>(dev, global_u32(&DEV_NET_OFFSET))?;
    let netns = F::get::<u32>(net, global_u32(&NET_INUM_OFFSET))?;
    Some(NetIfKey { netns, ifindex })
}

/// Records what a newly seen interface is. Once per interface (and again after the agent
/// forgets it), so `bpf_probe_read_kernel` is no cost here; a device renamed after its first
/// packet keeps the name it had then, which the agent corrects where it can read the namespace.
#[inline(always)]
fn note_iface(dev: u64, key: &NetIfKey) {
    let mut info = NetIfInfo::ZERO;
    if let Some(name) = read::<[u8; 16]>(dev, global_u32(&DEV_NAME_OFFSET)) {
        info.name = name;
    }
    info.link_type = read::<u16>(dev, global_u32(&DEV_TYPE_OFFSET)).unwrap_or(0);
    if let Some(ops) = read::<u64>(dev, global_u32(&DEV_LINK_OPS_OFFSET))
        && ops != 0
        && let Some(kind) = read::<u64>(ops, global_u32(&LINK_OPS_KIND_OFFSET))
        && kind != 0
    {
        // SAFETY: a kernel string, read with the helper that bounds it by the buffer.
        let _ = unsafe { bpf_probe_read_kernel_str_bytes(kind as *const u8, &mut info.kind) };
    }
    let _ = NET_IFINFO.insert(key, &info, BPF_NOEXIST);
}

/// How many bytes at an IPv4 header one read takes: the header without options and the first
/// four of what follows (a transport header's ports; ICMP's type and code).
const HEAD4_LEN: usize = 24;

/// The bytes at a packet's IPv4 header, read once for the interface's figures and the
/// container's: every `bpf_probe_read_kernel` a packet saves is ~10 ns (issue #43's
/// measurements). Every field is always written: it is kept across calls, and the verifier
/// refuses a spill of an undefined register (kernels before 6.3 any read of unwritten stack).
#[derive(Clone, Copy)]
struct Head4 {
    bytes: [u8; HEAD4_LEN],
    /// How many of `bytes` were read: `HEAD4_LEN`, 20 when only the header could be (the end
    /// of a buffer on a page that is not mapped), 0 when it is not an IPv4 packet.
    read: u32,
}

impl Head4 {
    const NONE: Self = Self {
        bytes: [0; HEAD4_LEN],
        read: 0,
    };

    #[inline(always)]
    fn read(l3: u64, protocol: u16) -> Self {
        if protocol != ETH_P_IP_BE {
            return Self::NONE;
        }
        if let Some(bytes) = read::<[u8; HEAD4_LEN]>(l3, 0) {
            return Self {
                bytes,
                read: HEAD4_LEN as u32,
            };
        }
        let Some(h) = read::<[u8; 20]>(l3, 0) else {
            return Self::NONE;
        };
        let mut bytes = [0; HEAD4_LEN];
        put(&mut bytes, 0, &h);
        Self { bytes, read: 20 }
    }

    /// [`Head4::read`] with direct loads through `rdonly_cast`: the bytes the probes use
    /// (version and header length, identification, flags and fragment offset, protocol, source
    /// address) from `struct iphdr`, and the four after a header without options from
    /// `struct udphdr` (ports; ICMP's type and code are its first two bytes). A load that faults
    /// reads 0, which tells the same as a failed read: version 0 is no IPv4 header, port 0 no
    /// tunnel's, ICMP type 0 no "fragmentation needed".
    #[inline(always)]
    fn cast(l3: u64, protocol: u16) -> Self {
        if protocol != ETH_P_IP_BE {
            return Self::NONE;
        }
        let ip = rdonly_cast(l3, global_u32(&IPHDR_BTF_ID));
        let mut bytes = [0; HEAD4_LEN];
        bytes[0] = typed::<u8>(ip, 0);
        put(&mut bytes, 4, &typed::<u16>(ip, 4).to_ne_bytes());
        put(&mut bytes, 6, &typed::<u16>(ip, 6).to_ne_bytes());
        bytes[9] = typed::<u8>(ip, 9);
        put(&mut bytes, 12, &typed::<u32>(ip, 12).to_ne_bytes());
        if bytes[0] & 0x0f != 5 {
            // Options: `pair` reads the transport header where it is.
            return Self { bytes, read: 20 };
        }
        let l4 = rdonly_cast(l3 + 20, global_u32(&UDPHDR_BTF_ID));
        put(&mut bytes, 20, &typed::<u16>(l4, 0).to_ne_bytes());
        put(&mut bytes, 22, &typed::<u16>(l4, 2).to_ne_bytes());
        Self {
            bytes,
            read: HEAD4_LEN as u32,
        }
    }

    /// The IPv4 header, when read and it is one.
    #[inline(always)]
    fn header(&self) -> Option<&[u8; 20]> {
        if self.read < 20 || self.bytes[0] >> 4 != 4 {
            return None;
        }
        // SAFETY: the first 20 of the 24 bytes.
        Some(unsafe { &*(self.bytes.as_ptr() as *const [u8; 20]) })
    }

    /// The two bytes at `at` from the header's start (`at` + 2 ≤ 24: an offset into a
    /// transport header behind a header without options), from what was read or else read now.
    #[inline(always)]
    fn pair(&self, l3: u64, at: u32) -> Option<[u8; 2]> {
        if self.read as usize == HEAD4_LEN && at == 20 {
            Some([self.bytes[20], self.bytes[21]])
        } else if self.read as usize == HEAD4_LEN && at == 22 {
            Some([self.bytes[22], self.bytes[23]])
        } else {
            read::<[u8; 2]>(l3, at)
        }
    }
}

/// Copies `from` into `bytes` at `at` (a constant: the verifier sees fixed stack offsets).
#[inline(always)]
fn put<const N: usize>(bytes: &mut [u8; HEAD4_LEN], at: usize, from: &[u8; N]) {
    let mut i = 0;
    while i < N {
        bytes[at + i] = from[i];
        i += 1;
    }
}

/// What the IP header says: (fragment, ICMP packet too big).
#[inline(always)]
fn inspect_ip(l3: u64, protocol: u16, head: &Head4) -> (bool, bool) {
    if protocol == ETH_P_IP_BE {
        let Some(h) = head.header() else {
            return (false, false);
        };
        let c = classify_ipv4(h);
        let ptb = c.icmp
            && match head.pair(l3, c.l4_offset) {
                Some(icmp) => is_ptb(false, icmp[0], icmp[1]),
                None => false,
            };
        (c.fragment, ptb)
    } else if protocol == ETH_P_IPV6_BE {
        let Some(next) = read::<u8>(l3, 6) else {
            return (false, false);
        };
        let c = classify_ipv6(next);
        let ptb = c.icmp
            && match read::<u8>(l3, c.l4_offset) {
                Some(t) => is_ptb(true, t, 0),
                None => false,
            };
        (c.fragment, ptb)
    } else {
        (false, false)
    }
}

#[inline(always)]
fn on_packet<F: Fields>(skb: u64, dev: u64, tx: bool) {
    if !have_offsets() {
        return;
    }
    let Some(key) = iface_key::<F>(dev) else {
        count_error(NetProbeError::KernelRead);
        return;
    };
    let (Some(mtu), Some(len), Some(head), Some(data), Some(end), Some(protocol)) = (
        F::get::<u32>(dev, global_u32(&DEV_MTU_OFFSET)),
        F::get::<u32>(skb, global_u32(&SKB_LEN_OFFSET)),
        F::get::<u64>(skb, global_u32(&SKB_HEAD_OFFSET)),
        F::get::<u64>(skb, global_u32(&SKB_DATA_OFFSET)),
        F::get::<u32>(skb, global_u32(&SKB_END_OFFSET)),
        F::get::<u16>(skb, global_u32(&SKB_PROTOCOL_OFFSET)),
    ) else {
        count_error(NetProbeError::KernelRead);
        return;
    };
    // skb_shinfo(skb): the shared info sits at head + end.
    let (gso_size, gso_segs) = F::gso(head + end as u64);

    // On receive, the device has pulled its link-layer header: data is the IP header. On
    // transmit, data is the link-layer header and the IP header is at head + network_header.
    let mut l3 = data;
    let mut l3_len = len;
    if tx {
        if let Some(nh) = F::get::<u16>(skb, global_u32(&SKB_NETWORK_HEADER_OFFSET))
            && nh != HEADER_UNSET
        {
            let at = head + nh as u64;
            if at >= data && at - data <= len as u64 {
                l3 = at;
                l3_len = len - (at - data) as u32;
            }
        }
    }
    let head = F::head4(l3, protocol);
    let (fragment, ptb) = inspect_ip(l3, protocol, &head);

    let placed_or_hashed = placed(&NET_IF_SLOT_DIR, &NET_IF_SLOTS, key.packed())
        .or_else(|| NET_IFACES.get_ptr_mut(&key));
    let stats = match placed_or_hashed {
        Some(stats) => stats,
        None => {
            note_iface(dev, &key);
            let Some(stats) = slot(
                &NET_IFACES,
                &key,
                &NetIfStats::ZERO,
                NetProbeError::IfaceMapFull,
            ) else {
                return;
            };
            stats
        }
    };
    // SAFETY: this CPU's slot.
    let stats = unsafe { &mut *stats };
    stats.mtu = mtu;
    let d: &mut NetDirStats = if tx { &mut stats.tx } else { &mut stats.rx };
    d.packets += 1;
    d.bytes += l3_len as u64;
    if gso_size != 0 {
        d.gso_packets += 1;
        d.gso_segments += if gso_segs == 0 { 1 } else { gso_segs as u64 };
    } else {
        let b = len_bucket_of(l3_len, mtu);
        if b < len_bucket::COUNT {
            d.len[b] += 1;
        }
    }
    if fragment {
        d.fragments += 1;
    }
    if ptb {
        d.ptb += 1;
    }

    let owner = if tx {
        sender::<F>(skb).map(|(sk, cgroup)| {
            learn_sender::<F>(key.netns, sk, cgroup);
            cgroup
        })
    } else if nobodys(key.netns) {
        None
    } else {
        netns_owner(key.netns)
    };
    if let Some(cgroup) = owner {
        on_container_packet(
            cgroup,
            l3,
            &head,
            l3_len,
            protocol,
            gso_size as u32,
            gso_segs as u32,
            tx,
        );
    }
}

// ---- drops ----------------------------------------------------------------------------------

#[btf_tracepoint(function = "kfree_skb")]
pub fn net_kfree_skb_btf(ctx: BtfTracePointContext) -> i32 {
    // TP_PROTO(struct sk_buff *skb, void *location, enum skb_drop_reason reason, ...)
    let skb: u64 = ctx.arg(0);
    let reason: u64 = ctx.arg(2);
    on_drop::<Typed>(skb, reason as u32);
    0
}

#[tracepoint]
pub fn net_kfree_skb_tp(ctx: TracePointContext) -> i32 {
    let (skb_at, reason_at) = (
        global_u32(&TP_KFREE_SKB_OFFSET),
        global_u32(&TP_KFREE_REASON_OFFSET),
    );
    if skb_at == 0 || reason_at == 0 {
        return 0;
    }
    // SAFETY: bounds-checked reads from the tracepoint record.
    let fields = unsafe {
        (
            ctx.read_at::<u64>(skb_at as usize),
            ctx.read_at::<u32>(reason_at as usize),
        )
    };
    match fields {
        (Ok(skb), Ok(reason)) => on_drop::<Probed>(skb, reason),
        _ => count_error(NetProbeError::KernelRead),
    }
    0
}

#[inline(always)]
fn on_drop<F: Fields>(skb: u64, reason: u32) {
    if reason < FIRST_DROP_REASON || !have_offsets() {
        return;
    }
    // `skb->dev` shares its word with `dev_scratch` once a socket has queued the packet: a
    // value that is no device pointer fails the reads (a helper's read returns an error; a
    // typed load, fault-tolerant, reads 0, and a namespace pointer of 0 is no key) and the
    // drop counts without interface, the same either way.
    let iface = match F::get::<u64>(skb, global_u32(&SKB_DEV_OFFSET)) {
        Some(dev) if dev != 0 => iface_key::<F>(dev),
        _ => None,
    }
    .unwrap_or(NetIfKey {
        netns: 0,
        ifindex: 0,
    });
    let key = NetDropKey {
        netns: iface.netns,
        ifindex: iface.ifindex,
        reason,
        _pad: 0,
    };
    let placed_or_hashed = placed(&NET_DROP_DIR, &NET_DROP_SLOTS, key.packed()).or_else(|| {
        slot(
            &NET_DROPS,
            &key,
            &NetDropStats { packets: 0 },
            NetProbeError::DropMapFull,
        )
    });
    if let Some(v) = placed_or_hashed {
        // SAFETY: this CPU's slot.
        unsafe { (*v).packets += 1 };
    }
}

// ---- per cgroup -----------------------------------------------------------------------------

#[btf_tracepoint(function = "tcp_retransmit_skb")]
pub fn net_tcp_retransmit_btf(ctx: BtfTracePointContext) -> i32 {
    // TP_PROTO(const struct sock *sk, const struct sk_buff *skb[, int err])
    let sk: u64 = ctx.arg(0);
    let skb: u64 = ctx.arg(1);
    // The read-only global is known to the verifier: without the argument, the read of it is
    // dead code and never checked.
    // A failed retransmission (the device refused it: RetransSegs and TCPRetransFail both count
    // it) is left out, as kernels without `err` leave it out by firing for the sent ones only.
    if global_u32(&RETRANSMIT_HAS_ERR) == 1 {
        let err: u64 = ctx.arg(2);
        if err as i32 != 0 {
            return 0;
        }
    }
    on_retransmit(sk, skb);
    0
}

#[tracepoint]
pub fn net_tcp_retransmit_tp(ctx: TracePointContext) -> i32 {
    let err_offset = global_u32(&TP_RETRANSMIT_ERR_OFFSET);
    if err_offset != 0 {
        // SAFETY: a bounds-checked read from the tracepoint record.
        match unsafe { ctx.read_at::<i32>(err_offset as usize) } {
            Ok(0) => {}
            Ok(_) => return 0,
            Err(_) => {
                count_error(NetProbeError::KernelRead);
                return 0;
            }
        }
    }
    if let (Some(sk), Some(skb)) = (
        tp_read_u64(&ctx, global_u32(&TP_RETRANSMIT_SK_OFFSET)),
        tp_read_u64(&ctx, global_u32(&TP_RETRANSMIT_SKB_OFFSET)),
    ) {
        on_retransmit(sk, skb);
    }
    0
}

#[inline(always)]
fn on_retransmit(sk: u64, skb: u64) {
    if !have_offsets() {
        return;
    }
    // tcp_skb_pcount(): the segments the skb carries, in its shared info's gso_segs.
    let segs = match (
        read::<u64>(skb, global_u32(&SKB_HEAD_OFFSET)),
        read::<u32>(skb, global_u32(&SKB_END_OFFSET)),
    ) {
        (Some(head), Some(end)) => {
            read::<u16>(head + end as u64, global_u32(&SHINFO_GSO_SEGS_OFFSET)).unwrap_or(1)
        }
        _ => 1,
    };
    let segs = if segs == 0 { 1 } else { segs as u64 };
    let id = sock_cgroup_id::<Probed>(sk);
    let Some(id) = id else {
        count_error(NetProbeError::SocketCgroup);
        return;
    };
    if let Some(s) = cgroup_net(id) {
        // SAFETY: this CPU's slot.
        unsafe { (*s).tcp_retransmits += segs };
    }
}

// ---- per container --------------------------------------------------------------------------
//
// Traffic is the container's when its sockets send it (`skb->sk` at the transmit hook names the
// socket; its cgroup is the container's), and when it arrives at the interfaces of a network
// namespace that belongs to the container (the agent writes `NETNS_CGROUP`): on receive the
// socket is not known yet at any tracepoint. Both need only CAP_BPF and CAP_PERFMON, where the
// cgroup_skb programs that used to count this need CAP_NET_ADMIN.
//
// An IP packet counts once, as its sender made it: not again as the outer packet of a tunnel
// (IP-in-IP, GRE, ESP, and UDP to the VXLAN, Geneve and WireGuard ports), and a fragmented one
// once, by its first fragment, with the bytes of all its fragments' payloads.

/// UDP destination ports of encapsulations: VXLAN (IANA and Linux's historical default), Geneve,
/// WireGuard.
const TUNNEL_UDP_PORTS: [u16; 4] = [4789, 8472, 6081, 51820];
/// IP protocols that carry another IP packet (or an encrypted one).
const IPPROTO_IPIP: u8 = 4;
const IPPROTO_IPV6: u8 = 41;
const IPPROTO_GRE: u8 = 47;
const IPPROTO_ESP: u8 = 50;

/// What the container-level figures need from an IP header.
struct IpPacket {
    /// IP header length: where the transport header starts.
    ip_len: u32,
    l4_protocol: u8,
    fragment: Fragment,
}

/// Where a packet stands in fragmentation.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fragment {
    Whole,
    /// The first fragment, and the packet's identity (IP id and a word of the source address).
    First(FragId),
    Later(FragId),
}

#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
struct FragId {
    id: u32,
    source: u32,
}

/// The last first fragment seen on this CPU, per direction, and whether it was counted: the
/// fragments of a packet leave one after the other on the CPU that fragments it, and arrive
/// in a row on the CPU that receives them, so the later ones follow the first one's verdict
/// (a tunnel's outer packet is only recognizable by its first fragment's UDP header).
#[repr(C)]
#[derive(Clone, Copy)]
struct FragState {
    id: FragId,
    counted: u32,
    _pad: u32,
}

#[map(name = "NET_FRAG_STATE")]
static NET_FRAG_STATE: PerCpuArray<FragState> = PerCpuArray::with_max_entries(2, 0);

/// Parses the IP header at `l3`: `None` for what is not IP.
#[inline(always)]
fn ip_packet(l3: u64, protocol: u16, head: &Head4) -> Option<IpPacket> {
    if protocol == ETH_P_IP_BE {
        let h = head.header()?;
        let c = classify_ipv4(h);
        let offset = ((h[6] as u16 & 0x1f) << 8) | h[7] as u16;
        let id = FragId {
            id: ((h[4] as u32) << 8) | h[5] as u32,
            source: u32::from_ne_bytes([h[12], h[13], h[14], h[15]]),
        };
        Some(IpPacket {
            ip_len: c.l4_offset,
            l4_protocol: c.protocol,
            fragment: match (c.fragment, offset) {
                (false, _) => Fragment::Whole,
                (true, 0) => Fragment::First(id),
                (true, _) => Fragment::Later(id),
            },
        })
    } else if protocol == ETH_P_IPV6_BE {
        let next = read::<u8>(l3, 6)?;
        if next != 44 {
            return Some(IpPacket {
                ip_len: 40,
                l4_protocol: next,
                fragment: Fragment::Whole,
            });
        }
        // The fragment header right after the fixed header: next header, reserved, offset and
        // flags, identification.
        let frag = read::<[u8; 8]>(l3, 40)?;
        let source = read::<u32>(l3, 20)?;
        let offset = ((frag[2] as u16) << 5) | (frag[3] as u16 >> 3);
        let id = FragId {
            id: u32::from_ne_bytes([frag[4], frag[5], frag[6], frag[7]]),
            source,
        };
        Some(IpPacket {
            ip_len: 48,
            l4_protocol: frag[0],
            fragment: if offset == 0 {
                Fragment::First(id)
            } else {
                Fragment::Later(id)
            },
        })
    } else {
        None
    }
}

/// Whether a packet (whole or first fragment) is a tunnel's outer packet.
#[inline(always)]
fn is_tunnel_outer(l3: u64, head: &Head4, p: &IpPacket) -> bool {
    match p.l4_protocol {
        IPPROTO_IPIP | IPPROTO_IPV6 | IPPROTO_GRE | IPPROTO_ESP => true,
        // An IPv6 header is never in `head` (its `read` is 0): the pair is read.
        IPPROTO_UDP => match head.pair(l3, p.ip_len + 2) {
            Some(port) => TUNNEL_UDP_PORTS.contains(&(((port[0] as u16) << 8) | port[1] as u16)),
            None => false,
        },
        _ => false,
    }
}

/// The IP + TCP/UDP header length of a packet, for the segments of a GSO/GRO super-packet.
#[inline(always)]
fn header_len(l3: u64, p: &IpPacket) -> Option<u32> {
    match p.l4_protocol {
        IPPROTO_TCP => {
            let off = read::<u8>(l3, p.ip_len + 12)?;
            Some(p.ip_len + (off >> 4) as u32 * 4)
        }
        IPPROTO_UDP => Some(p.ip_len + 8),
        _ => None,
    }
}

#[inline(always)]
fn add_len(hist: &mut [u64; len_bucket::COUNT], len: u32, n: u64) {
    let b = len_bucket_of(len, 0);
    if b < len_bucket::COUNT {
        hist[b] += n;
    }
}

/// `sock_cgroup_ptr(&sk->sk_cgrp_data)->kn->id`: the cgroup v2 id of the socket (that of the
/// process that created it), what `bpf_skb_cgroup_id()` returns for its packets.
#[inline(always)]
fn sock_cgroup_id<F: Fields>(sk: u64) -> Option<u64> {
    let cgroup = F::get::<u64>(sk, global_u32(&SOCK_CGROUP_OFFSET)).filter(|c| *c != 0)?;
    let kn = F::get::<u64>(cgroup, global_u32(&CGROUP_KN_OFFSET)).filter(|kn| *kn != 0)?;
    F::get::<u64>(kn, global_u32(&KERNFS_NODE_ID_OFFSET))
}

/// The socket that sends `skb` and its cgroup, when it is a full IPv4/IPv6 socket (request and
/// time-wait sockets are smaller structs without `sk_cgrp_data`).
#[inline(always)]
fn sender<F: Fields>(skb: u64) -> Option<(u64, u64)> {
    let sk = F::get::<u64>(skb, global_u32(&SKB_SK_OFFSET)).filter(|sk| *sk != 0)?;
    let family = F::get::<u16>(sk, global_u32(&SOCK_FAMILY_OFFSET))?;
    let state = F::get::<u8>(sk, global_u32(&SOCK_STATE_OFFSET))?;
    if (family != AF_INET && family != AF_INET6)
        || state == TCP_TIME_WAIT
        || state == TCP_NEW_SYN_RECV
    {
        return None;
    }
    match sock_cgroup_id::<F>(sk) {
        Some(id) => Some((sk, id)),
        None => {
            count_error(NetProbeError::SocketCgroup);
            None
        }
    }
}

/// The last (namespace, cgroup) this CPU learned, so that a stream of packets costs one
/// comparison, not a map update each.
#[map(name = "NET_LAST_SENDER")]
static NET_LAST_SENDER: PerCpuArray<NetSenderKey> = PerCpuArray::with_max_entries(1, 0);

/// Notes that a process of `cgroup` sends from namespace `netns` — a socket with a file, that
/// is, not one of the kernel's own (ICMP replies, TCP resets and neighbour discovery go out on
/// kernel sockets that carry the cgroup of whoever created the namespace) — and, when nobody
/// owns the namespace yet, makes its traffic this cgroup's at once; the agent settles the owner
/// (the cgroup all its senders share) at its next collection.
#[inline(always)]
fn learn_sender<F: Fields>(netns: u32, sk: u64, cgroup: u64) {
    let key = NetSenderKey {
        netns,
        _pad: 0,
        cgroup,
    };
    let Some(last) = NET_LAST_SENDER.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot.
    if unsafe { *last == key } {
        return;
    }
    let is_user_socket = F::get::<u64>(sk, global_u32(&SOCK_SOCKET_OFFSET))
        .filter(|socket| *socket != 0)
        .and_then(|socket| Probed::get::<u64>(socket, global_u32(&SOCKET_FILE_OFFSET)))
        .is_some_and(|file| file != 0);
    if !is_user_socket {
        return;
    }
    // SAFETY: this CPU's slot.
    unsafe { *last = key };
    let _ = NET_SENDERS.insert(&key, &0, BPF_NOEXIST);
    let _ = NETNS_CGROUP.insert(&netns, &cgroup, BPF_NOEXIST);
}

/// What one packet at an interface adds to a container's figures.
#[inline(always)]
fn on_container_packet(
    cgroup: u64,
    l3: u64,
    head: &Head4,
    len: u32,
    protocol: u16,
    gso_size: u32,
    gso_segs: u32,
    tx: bool,
) {
    let Some(p) = ip_packet(l3, protocol, head) else {
        return;
    };
    let state = NET_FRAG_STATE.get_ptr_mut(if tx { 0 } else { 1 });
    match p.fragment {
        Fragment::Whole => {
            if is_tunnel_outer(l3, head, &p) {
                return;
            }
        }
        Fragment::First(id) => {
            let outer = is_tunnel_outer(l3, head, &p);
            if let Some(state) = state {
                // SAFETY: this CPU's slot.
                unsafe {
                    *state = FragState {
                        id,
                        counted: u32::from(!outer),
                        _pad: 0,
                    }
                };
            }
            if outer {
                return;
            }
        }
        Fragment::Later(id) => {
            // The rest of a packet whose first fragment was counted: its payload, so that the
            // bytes are the packet's as its sender made it.
            // SAFETY: this CPU's slot.
            let counted = state.is_some_and(|s| unsafe { (*s).id == id && (*s).counted == 1 });
            if counted
                && len > p.ip_len
                && let Some(s) = cgroup_net(cgroup)
            {
                // SAFETY: this CPU's slot.
                let s = unsafe { &mut *s };
                let payload = (len - p.ip_len) as u64;
                if tx {
                    s.tx_bytes += payload;
                } else {
                    s.rx_bytes += payload;
                }
            }
            return;
        }
    }
    // A GSO/GRO super-packet: all its segments but the last carry gso_size bytes of payload
    // (GRO merges only segments of the first one's size, the last may be shorter).
    let mut packets: u64 = 1;
    let mut bytes: u64 = len as u64;
    let mut full: u64 = 0;
    let mut full_len: u32 = 0;
    let mut last_len: u32 = len;
    let mut histogram = true;
    if gso_size != 0 {
        let segs = if gso_segs == 0 { 1 } else { gso_segs };
        packets = segs as u64;
        match header_len(l3, &p) {
            Some(h) if len > h && (len - h) > (segs - 1) * gso_size => {
                full = (segs - 1) as u64;
                full_len = gso_size + h;
                last_len = len - (segs - 1) * gso_size;
                bytes = len as u64 + full * h as u64;
            }
            _ => {
                count_error(NetProbeError::GsoHeaderUnknown);
                histogram = false;
            }
        }
    }
    let Some(s) = cgroup_net(cgroup) else {
        return;
    };
    // SAFETY: this CPU's slot.
    let s = unsafe { &mut *s };
    let (hist, gso) = if tx {
        s.tx_packets += packets;
        s.tx_bytes += bytes;
        (&mut s.tx_len, &mut s.tx_gso_packets)
    } else {
        s.rx_packets += packets;
        s.rx_bytes += bytes;
        (&mut s.rx_len, &mut s.rx_gso_packets)
    };
    if gso_size != 0 {
        *gso += 1;
    }
    if histogram {
        if full != 0 {
            add_len(hist, full_len, full);
        }
        add_len(hist, last_len, 1);
    }
}
