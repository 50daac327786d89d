//! The network probe family.
//!
//! Kernel side (`ebpf-probes/kernel/src/net.rs`): per interface, packet lengths against the MTU
//! on transmit (`net:net_dev_start_xmit`) and receive (`net:netif_receive_skb`), GSO/GRO
//! super-packets apart, fragments and ICMP "packet too big"; drops by reason
//! (`skb:kfree_skb`); per cgroup, what its sockets send (the transmit hook's `skb->sk`), what
//! the interfaces of its network namespace receive ([`set_netns_owners`]), and TCP
//! retransmits (`tcp:tcp_retransmit_skb`).
//!
//! User side: the struct offsets those programs need (from the running kernel's BTF), the
//! drop reason names (`enum skb_drop_reason`), and which container each network namespace
//! belongs to, for the receive hook. What no probe needs to measure (interfaces, MTUs,
//! encapsulation, the kernel's own counters) is read in [`crate::netinfo`].

mod owner_slots;

use std::{collections::HashMap, sync::OnceLock};

use aya::Ebpf;
use stormwatch_common::net::{
    CgroupNetStats, NOBODYS_NETNS_SLOTS, NetDropKey, NetDropStats, NetIfInfo, NetIfKey, NetIfStats,
    NetProbeError, NetSenderKey, globals, maps, programs,
};

use super::{
    AttachKind, Gone, KernelFacts, ProbeFamily, ProbeStatus, ReadsPart, SlotDirectory, attach_btf,
    attach_preferring_btf,
    btf::{Btf, VMLINUX_BTF},
    read_per_cpu_hash, remove_per_cpu_keys, remove_per_cpu_matching, tracefs, tracepoint_offsets,
};
use crate::counters::Counters as _;

pub const XMIT: &str = "net:net_dev_start_xmit";
pub const RECEIVE: &str = "net:netif_receive_skb";
pub const KFREE_SKB: &str = "skb:kfree_skb";
pub const RETRANSMIT: &str = "tcp:tcp_retransmit_skb";
/// What per-container traffic needs: the transmit hook (the sending socket's cgroup) and the
/// receive hook (the receiving namespace's container).
pub const CONTAINER_PROBES: [&str; 2] = [XMIT, RECEIVE];

/// The per-packet programs, each tracepoint's tp_btf and classic one: on demand
/// ([`super::NetPacketTier`]), whichever of them loaded is attached.
pub const PACKET_PROGRAMS: [(&str, &str); 4] = [
    (XMIT, programs::XMIT_BTF),
    (XMIT, programs::XMIT_TP),
    (RECEIVE, programs::RECEIVE_BTF),
    (RECEIVE, programs::RECEIVE_TP),
];

/// The status notes of a per-packet program loaded for [`super::NetPacketTier::OnDemand`].
pub const ON_DEMAND_DETACHED: &str = "loaded, attached on demand (net_packet_probes = \
     \"on-demand\"): while a network namespace shows packets that did not fit its path";
pub const ON_DEMAND_ATTACHED: &str =
    "attached on demand, while a network namespace shows packets that did not fit its path";

/// (global, struct, member path): what the programs read, from BTF. `sk_buff.end` is an offset
/// from `head` on 64-bit kernels (`NET_SKBUFF_DATA_USES_OFFSET`), the only ones we build for.
const BTF_OFFSETS: [(&str, &str, &[&str]); 25] = [
    (globals::SKB_LEN_OFFSET, "sk_buff", &["len"]),
    (globals::SKB_HEAD_OFFSET, "sk_buff", &["head"]),
    (globals::SKB_DATA_OFFSET, "sk_buff", &["data"]),
    (globals::SKB_END_OFFSET, "sk_buff", &["end"]),
    (
        globals::SKB_NETWORK_HEADER_OFFSET,
        "sk_buff",
        &["network_header"],
    ),
    (globals::SKB_PROTOCOL_OFFSET, "sk_buff", &["protocol"]),
    (globals::SKB_DEV_OFFSET, "sk_buff", &["dev"]),
    (globals::SKB_SK_OFFSET, "sk_buff", &["sk"]),
    (
        globals::SOCK_FAMILY_OFFSET,
        "sock",
        &["__sk_common", "skc_family"],
    ),
    (
        globals::SOCK_STATE_OFFSET,
        "sock",
        &["__sk_common", "skc_state"],
    ),
    (
        globals::SHINFO_GSO_SIZE_OFFSET,
        "skb_shared_info",
        &["gso_size"],
    ),
    (
        globals::SHINFO_GSO_SEGS_OFFSET,
        "skb_shared_info",
        &["gso_segs"],
    ),
    (globals::DEV_MTU_OFFSET, "net_device", &["mtu"]),
    (globals::DEV_IFINDEX_OFFSET, "net_device", &["ifindex"]),
    (globals::DEV_NET_OFFSET, "net_device", &["nd_net", "net"]),
    (globals::NET_INUM_OFFSET, "net", &["ns", "inum"]),
    (globals::DEV_NAME_OFFSET, "net_device", &["name"]),
    (globals::DEV_TYPE_OFFSET, "net_device", &["type"]),
    (
        globals::DEV_LINK_OPS_OFFSET,
        "net_device",
        &["rtnl_link_ops"],
    ),
    (globals::LINK_OPS_KIND_OFFSET, "rtnl_link_ops", &["kind"]),
    (globals::SOCK_SOCKET_OFFSET, "sock", &["sk_socket"]),
    (globals::SOCKET_FILE_OFFSET, "socket", &["file"]),
    (
        globals::SOCK_CGROUP_OFFSET,
        "sock",
        &["sk_cgrp_data", "cgroup"],
    ),
    (globals::CGROUP_KN_OFFSET, "cgroup", &["kn"]),
    (globals::KERNFS_NODE_ID_OFFSET, "kernfs_node", &["id"]),
];

/// A tracepoint, its tp_btf and classic programs, and the record fields (global, field) the
/// classic one reads.
type Tracepoint = (
    &'static str,
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

const TRACEPOINTS: [Tracepoint; 4] = [
    (
        XMIT,
        programs::XMIT_BTF,
        programs::XMIT_TP,
        &[(globals::TP_XMIT_SKB_OFFSET, "skbaddr")],
    ),
    (
        RECEIVE,
        programs::RECEIVE_BTF,
        programs::RECEIVE_TP,
        &[(globals::TP_RECEIVE_SKB_OFFSET, "skbaddr")],
    ),
    (
        KFREE_SKB,
        programs::KFREE_SKB_BTF,
        programs::KFREE_SKB_TP,
        &[
            (globals::TP_KFREE_SKB_OFFSET, "skbaddr"),
            (globals::TP_KFREE_REASON_OFFSET, "reason"),
        ],
    ),
    (
        RETRANSMIT,
        programs::RETRANSMIT_BTF,
        programs::RETRANSMIT_TP,
        &[
            (globals::TP_RETRANSMIT_SK_OFFSET, "skaddr"),
            (globals::TP_RETRANSMIT_SKB_OFFSET, "skbaddr"),
        ],
    ),
];

/// What the running kernel's BTF says, looked up once.
struct KernelNet {
    /// The offsets, or what is missing.
    offsets: Result<Vec<(&'static str, u32)>, String>,
    /// `tcp_retransmit_skb` passes `err` (and fires for failed attempts too).
    retransmit_has_err: bool,
    /// `enum skb_drop_reason` values → names without the `SKB_DROP_REASON_` prefix.
    drop_reasons: HashMap<u32, String>,
}

impl KernelNet {
    fn read(btf: &Btf) -> Self {
        let mut missing = Vec::new();
        let mut values = Vec::new();
        for (global, strukt, path) in BTF_OFFSETS {
            match btf.offset_of(strukt, path) {
                Ok(off) => values.push((global, off)),
                Err(e) => missing.push(e.to_string()),
            }
        }
        Self {
            offsets: if missing.is_empty() {
                Ok(values)
            } else {
                Err(missing.join("; "))
            },
            // The prototype's first parameter is the tracing context: (ctx, sk, skb, err).
            retransmit_has_err: btf
                .func_params("btf_trace_tcp_retransmit_skb")
                .is_some_and(|n| n >= 4),
            drop_reasons: drop_reason_names(btf.enum_values("skb_drop_reason").unwrap_or_default()),
        }
    }

    fn without_btf(why: &str) -> Self {
        Self {
            offsets: Err(format!("no kernel BTF for struct offsets: {why}")),
            retransmit_has_err: false,
            drop_reasons: HashMap::new(),
        }
    }
}

static KERNEL_NET: OnceLock<KernelNet> = OnceLock::new();

/// What the kernel's BTF says, from the load's one read of it.
fn kernel_net_of(facts: &KernelFacts) -> &'static KernelNet {
    KERNEL_NET.get_or_init(|| match &facts.btf {
        Some(btf) => KernelNet::read(btf),
        None => KernelNet::without_btf(facts.btf_error.as_deref().unwrap_or("unusable")),
    })
}

/// The same, read now when no probes were loaded in this process (drop reasons named in a
/// test, or before the load).
fn kernel_net() -> &'static KernelNet {
    KERNEL_NET.get_or_init(|| match Btf::from_file(VMLINUX_BTF) {
        Ok(btf) => KernelNet::read(&btf),
        Err(e) => KernelNet::without_btf(&e.to_string()),
    })
}

/// `SKB_DROP_REASON_PKT_TOO_BIG` → `PKT_TOO_BIG`, as the tracepoint prints them.
fn drop_reason_names(values: Vec<(String, u64)>) -> HashMap<u32, String> {
    values
        .into_iter()
        .filter_map(|(name, v)| {
            let short = name.strip_prefix("SKB_DROP_REASON_")?;
            Some((u32::try_from(v).ok()?, short.to_owned()))
        })
        .collect()
}

/// The name of a drop reason: from the kernel's `enum skb_drop_reason`, else `reason_<n>`.
pub fn drop_reason_name(reason: u32) -> String {
    kernel_net()
        .drop_reasons
        .get(&reason)
        .cloned()
        .unwrap_or_else(|| format!("reason_{reason}"))
}

/// Drop reasons that mean a packet was too big for where it had to go (the rest of the drops
/// are reported, but are not MTU evidence).
pub const MTU_DROP_REASONS: [&str; 5] = [
    "PKT_TOO_BIG",
    "FRAG_REASM_TIMEOUT",
    "FRAG_TOO_FAR",
    "DUP_FRAG",
    "SKB_GSO_SEG",
];

pub struct NetProbes {
    /// Load (verify) the per-packet programs at start but attach them only when asked
    /// ([`super::Probes::set`]).
    packets_on_demand: bool,
    /// The cgroups and the interfaces in direct slots (`NET_CG_SLOTS`, `NET_IF_SLOTS`).
    cgroup_slots: SlotDirectory,
    iface_slots: SlotDirectory,
    /// The drop keys in direct slots (`NET_DROP_SLOTS`).
    drop_slots: SlotDirectory,
    /// The namespaces' owners in direct slots (`NETNS_OWNER_SLOTS`).
    owner_slots: owner_slots::OwnerSlots,
}

impl NetProbes {
    pub fn new(packets_on_demand: bool) -> Self {
        Self {
            packets_on_demand,
            cgroup_slots: SlotDirectory::new(maps::NET_CG_SLOT_DIR, maps::NET_CG_SLOTS),
            iface_slots: SlotDirectory::new(maps::NET_IF_SLOT_DIR, maps::NET_IF_SLOTS),
            drop_slots: SlotDirectory::new(maps::NET_DROP_SLOT_DIR, maps::NET_DROP_SLOTS),
            owner_slots: owner_slots::OwnerSlots::default(),
        }
    }
}

/// The network's part of a snapshot.
#[derive(Clone, Debug, Default)]
pub struct NetPart {
    /// Per cgroup: what its sockets sent and received.
    pub cgroups: HashMap<u64, CgroupNetStats>,
    /// Per interface (namespace inode, ifindex).
    pub ifaces: HashMap<NetIfKey, NetIfStats>,
    /// Drops by interface and reason.
    pub drops: HashMap<NetDropKey, NetDropStats>,
}

impl NetPart {
    /// Drops a removed cgroup's figures (its namespaces' interfaces and drops are keyed by
    /// namespace: the family's forget deletes them in the maps).
    pub fn forget_cgroup(&mut self, id: u64) {
        self.cgroups.remove(&id);
    }
}

impl ReadsPart for NetProbes {
    type Part = NetPart;

    /// Each map's figures with its placed keys' slots added; then the keys without a slot
    /// placed, those with the most packets first.
    fn read(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<NetPart> {
        let mut cgroups = read(ebpf)?;
        self.cgroup_slots
            .merge_cgroups(ebpf, &mut cgroups, |s| s.tx_packets + s.rx_packets)?;
        let mut ifaces = read_ifaces(ebpf)?;
        self.iface_slots.merge(
            ebpf,
            &mut ifaces,
            NetIfKey::packed,
            NetIfKey::unpacked,
            |s| s.tx.packets + s.rx.packets,
        )?;
        let mut drops = read_drops(ebpf)?;
        self.drop_slots.merge(
            ebpf,
            &mut drops,
            NetDropKey::packed,
            NetDropKey::unpacked,
            |s| s.packets,
        )?;
        Ok(NetPart {
            cgroups,
            ifaces,
            drops,
        })
    }

    /// Removed cgroups, with their namespaces' interfaces and drops in the maps.
    fn forget(&mut self, ebpf: &mut Ebpf, gone: &Gone, part: &mut NetPart) {
        if gone.cgroups.is_empty() {
            return;
        }
        let gone_netns = forget(ebpf, gone.cgroups);
        self.cgroup_slots.release(ebpf, |id| gone.cgroup(id));
        self.iface_slots.release(ebpf, |key| {
            gone_netns.contains(&NetIfKey::unpacked(key).netns)
        });
        self.drop_slots.release(ebpf, |key| {
            let netns = NetDropKey::unpacked(key).netns;
            netns != 0 && gone_netns.contains(&netns)
        });
        self.owner_slots
            .release(ebpf, |netns| gone_netns.contains(&netns));
        for id in gone.cgroups {
            part.forget_cgroup(*id);
        }
    }
}

impl ProbeFamily for NetProbes {
    fn name(&self) -> &'static str {
        "network"
    }

    fn globals(&mut self, facts: &KernelFacts) -> Vec<(&'static str, u32)> {
        let mut values = tracepoint_offsets(&[
            (
                globals::TP_XMIT_SKB_OFFSET,
                "net",
                "net_dev_start_xmit",
                "skbaddr",
            ),
            (
                globals::TP_RECEIVE_SKB_OFFSET,
                "net",
                "netif_receive_skb",
                "skbaddr",
            ),
            (globals::TP_KFREE_SKB_OFFSET, "skb", "kfree_skb", "skbaddr"),
            (
                globals::TP_KFREE_REASON_OFFSET,
                "skb",
                "kfree_skb",
                "reason",
            ),
            (
                globals::TP_RETRANSMIT_SK_OFFSET,
                "tcp",
                "tcp_retransmit_skb",
                "skaddr",
            ),
            (
                globals::TP_RETRANSMIT_SKB_OFFSET,
                "tcp",
                "tcp_retransmit_skb",
                "skbaddr",
            ),
            (
                globals::TP_RETRANSMIT_ERR_OFFSET,
                "tcp",
                "tcp_retransmit_skb",
                "err",
            ),
        ]);
        let k = kernel_net_of(facts);
        match &k.offsets {
            Ok(offsets) => {
                values.extend(offsets.iter().copied());
                values.push((globals::HAVE_NET_OFFSETS, 1));
            }
            Err(e) => log::warn!("network probes disabled: {e}"),
        }
        values.push((globals::RETRANSMIT_HAS_ERR, u32::from(k.retransmit_has_err)));
        values
    }

    fn attach(&mut self, ebpf: &mut Ebpf, facts: &KernelFacts) -> Vec<ProbeStatus> {
        let mut status = Vec::new();
        let why_not = kernel_net_of(facts).offsets.as_ref().err();
        for (tracepoint, btf_program, classic, fields) in TRACEPOINTS {
            if let Some(why) = why_not {
                status.push(not_attached(tracepoint, why.clone()));
                continue;
            }
            let (category, event) = tracepoint.split_once(':').expect("category:event");
            // The classic fallback reads record fields: without them it would read garbage, so
            // it is only tried when the record has them.
            let classic_ok = fields
                .iter()
                .all(|(_, f)| tracefs::field_offset(category, event, f).is_some());
            if self.packets_on_demand && CONTAINER_PROBES.contains(&tracepoint) {
                status.push(load_on_demand(
                    ebpf,
                    facts,
                    tracepoint,
                    btf_program,
                    classic_ok.then_some(classic),
                ));
                continue;
            }
            if classic_ok {
                status.push(attach_preferring_btf(
                    ebpf,
                    facts,
                    tracepoint,
                    Some(btf_program),
                    classic,
                ));
                continue;
            }
            let result = match &facts.aya_btf {
                Some(_) => attach_btf(ebpf, btf_program, event, facts),
                None => Err(anyhow::anyhow!(
                    "no tp_btf ({}), and the tracepoint record lacks the fields the fallback reads",
                    facts.btf_error.as_deref().unwrap_or("no kernel BTF")
                )),
            };
            status.push(match result {
                Ok(()) => ProbeStatus {
                    tracepoint,
                    kind: Some(AttachKind::TpBtf),
                    note: None,
                },
                Err(e) => not_attached(tracepoint, super::one_line(&e)),
            });
        }
        status
    }
}

/// Loads (verifies) a per-packet program to be attached on demand — tp_btf where it loads, else
/// the classic one — so that a program the kernel refuses is found at start.
fn load_on_demand(
    ebpf: &mut Ebpf,
    facts: &KernelFacts,
    tracepoint: &'static str,
    btf_program: &str,
    classic: Option<&str>,
) -> ProbeStatus {
    let (_, event) = tracepoint.split_once(':').expect("category:event");
    let btf = match &facts.aya_btf {
        Some(btf) => super::load_btf(ebpf, btf_program, event, btf).map(|_| ()),
        None => Err(anyhow::anyhow!(
            "no tp_btf ({})",
            facts.btf_error.as_deref().unwrap_or("no kernel BTF")
        )),
    };
    let loaded = btf.or_else(|btf_err| match classic {
        Some(program) => super::load_classic(ebpf, program).map_err(|e| {
            anyhow::anyhow!(
                "{}; tracepoint failed: {}",
                super::one_line(&btf_err),
                super::one_line(&e)
            )
        }),
        None => Err(btf_err),
    });
    match loaded {
        Ok(()) => not_attached(tracepoint, ON_DEMAND_DETACHED.to_owned()),
        Err(e) => not_attached(tracepoint, super::one_line(&e)),
    }
}

fn not_attached(tracepoint: &'static str, note: String) -> ProbeStatus {
    ProbeStatus {
        tracepoint,
        kind: None,
        note: Some(note),
    }
}

/// Network namespace inode → the cgroup whose traffic the receive hook counts there.
pub fn netns_owners(ebpf: &Ebpf) -> HashMap<u32, u64> {
    let Some(map) = ebpf.map(maps::NETNS_CGROUP) else {
        return HashMap::new();
    };
    let Ok(map) = aya::maps::HashMap::<_, u32, u64>::try_from(map) else {
        return HashMap::new();
    };
    map.iter()
        .filter_map(Result::ok)
        .filter(|(_, cgroup)| *cgroup != 0)
        .collect()
}

/// The interfaces the probes keep figures for now.
pub fn iface_keys(ebpf: &Ebpf) -> std::collections::HashSet<NetIfKey> {
    let Some(map) = ebpf.map(maps::NET_IFACES) else {
        return Default::default();
    };
    let Ok(map) = aya::maps::PerCpuHashMap::<_, NetIfKey, NetIfStats>::try_from(map) else {
        return Default::default();
    };
    map.keys().filter_map(Result::ok).collect()
}

/// The (namespace, cgroup) pairs the transmit hook saw sending.
pub fn read_senders(ebpf: &Ebpf) -> Vec<NetSenderKey> {
    let Some(map) = ebpf.map(maps::NET_SENDERS) else {
        return Vec::new();
    };
    let Ok(map) = aya::maps::HashMap::<_, NetSenderKey, u8>::try_from(map) else {
        return Vec::new();
    };
    map.keys().filter_map(Result::ok).collect()
}

/// Tells the receive hook which container each network namespace's traffic belongs to:
/// `owners` maps namespace inodes to cgroup ids (0: no one's); namespaces not in it are left
/// as they are. `nobodys` are the namespaces no container can own (the host's, the agent's
/// own: at most `NOBODYS_NETNS_SLOTS`), which the hook then does not look up at all. Owners
/// are also placed in direct slots where theirs is free (`owner_slots`).
pub fn set_netns_owners(
    ebpf: &mut Ebpf,
    family: &mut NetProbes,
    owners: &HashMap<u32, u64>,
    nobodys: &[u32],
) -> anyhow::Result<()> {
    let map = ebpf
        .map_mut(maps::NETNS_CGROUP)
        .ok_or_else(|| anyhow::anyhow!("map {} missing from the object", maps::NETNS_CGROUP))?;
    let mut map = aya::maps::HashMap::<_, u32, u64>::try_from(map)?;
    for (netns, cgroup) in owners {
        map.insert(netns, cgroup, 0)?;
    }
    let map = ebpf
        .map_mut(maps::NET_NOBODYS)
        .ok_or_else(|| anyhow::anyhow!("map {} missing from the object", maps::NET_NOBODYS))?;
    let mut map = aya::maps::Array::<_, u32>::try_from(map)?;
    for slot in 0..NOBODYS_NETNS_SLOTS {
        let netns = nobodys.get(slot as usize).copied().unwrap_or(0);
        map.set(slot, &netns, 0)?;
    }
    // After the hash: a slot only ever holds what the hash holds too.
    family.owner_slots.sync(ebpf, owners);
    Ok(())
}

fn read(ebpf: &Ebpf) -> anyhow::Result<HashMap<u64, CgroupNetStats>> {
    read_per_cpu_hash(ebpf, maps::CGROUP_NET, CgroupNetStats::ZERO, |t, v| {
        t.add(v)
    })
}

/// Per-interface figures. The per-CPU values' `mtu` is the last one any CPU saw.
fn read_ifaces(ebpf: &Ebpf) -> anyhow::Result<HashMap<NetIfKey, NetIfStats>> {
    read_per_cpu_hash(ebpf, maps::NET_IFACES, NetIfStats::ZERO, |t, v| t.add(v))
}

/// What each interface the probes saw is, as the kernel described it when they first saw it.
pub fn read_iface_info(ebpf: &Ebpf) -> HashMap<NetIfKey, NetIfInfo> {
    let Some(map) = ebpf.map(maps::NET_IFINFO) else {
        return HashMap::new();
    };
    let Ok(map) = aya::maps::HashMap::<_, NetIfKey, NetIfInfo>::try_from(map) else {
        return HashMap::new();
    };
    map.iter().filter_map(Result::ok).collect()
}

fn read_drops(ebpf: &Ebpf) -> anyhow::Result<HashMap<NetDropKey, NetDropStats>> {
    read_per_cpu_hash(
        ebpf,
        maps::NET_DROPS,
        NetDropStats { packets: 0 },
        |t, v| t.add(v),
    )
}

/// Forgets removed cgroups, and with them (containers come and go with their namespaces) the
/// interfaces and drops of namespaces that no longer exist: those namespaces.
fn forget(ebpf: &mut Ebpf, cgroups: &[u64]) -> Vec<u32> {
    for id in cgroups {
        remove_per_cpu_keys::<u64, CgroupNetStats>(ebpf, maps::CGROUP_NET, &[*id]);
    }
    // A removed container's namespaces: who sends from them and whom they belong to.
    remove_matching::<NetSenderKey, u8>(ebpf, maps::NET_SENDERS, |k| cgroups.contains(&k.cgroup));
    // Their namespaces went with them (a pod's namespace lives as long as its sandbox): their
    // interfaces and drops too. Namespaces that belong to no container (the host's, a node's
    // tunnels) stay; the maps' size bounds them.
    let mut gone: Vec<u32> = Vec::new();
    if let Some(map) = ebpf.map_mut(maps::NETNS_CGROUP)
        && let Ok(mut map) = aya::maps::HashMap::<_, u32, u64>::try_from(map)
    {
        gone = map
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, cgroup)| cgroups.contains(cgroup))
            .map(|(netns, _)| netns)
            .collect();
        for netns in &gone {
            let _ = map.remove(netns);
        }
    }
    if !gone.is_empty() {
        forget_netns(ebpf, |netns| gone.contains(&netns));
    }
    gone
}

/// Forgets the interfaces and drops of network namespaces that no longer exist.
fn forget_netns(ebpf: &mut Ebpf, gone: impl Fn(u32) -> bool) {
    remove_per_cpu_matching::<NetIfKey, NetIfStats>(ebpf, maps::NET_IFACES, |k| gone(k.netns));
    remove_matching::<NetIfKey, NetIfInfo>(ebpf, maps::NET_IFINFO, |k| gone(k.netns));
    remove_per_cpu_matching::<NetDropKey, NetDropStats>(ebpf, maps::NET_DROPS, |k| {
        k.netns != 0 && gone(k.netns)
    });
}

/// Deletes the keys of a (not per-CPU) hash map for which `gone` holds.
fn remove_matching<K: aya::Pod, V: aya::Pod>(
    ebpf: &mut Ebpf,
    name: &str,
    gone: impl Fn(&K) -> bool,
) {
    let Some(Ok(mut map)) = ebpf
        .map_mut(name)
        .map(aya::maps::HashMap::<_, K, V>::try_from)
    else {
        return;
    };
    let doomed: Vec<K> = map
        .keys()
        .filter_map(Result::ok)
        .filter(|k| gone(k))
        .collect();
    for k in doomed {
        let _ = map.remove(&k);
    }
}

/// Events the network probes could not record, by kind, summed over CPUs.
pub fn errors(ebpf: &Ebpf) -> Vec<(&'static str, u64)> {
    let kinds = NetProbeError::ALL.iter().map(|k| (*k as u32, k.name()));
    super::read_counters(ebpf, maps::NET_ERRORS, kinds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_reasons_lose_their_prefix_and_skip_non_drops() {
        let names = drop_reason_names(vec![
            ("SKB_NOT_DROPPED_YET".into(), 0),
            ("SKB_CONSUMED".into(), 1),
            ("SKB_DROP_REASON_NOT_SPECIFIED".into(), 2),
            ("SKB_DROP_REASON_PKT_TOO_BIG".into(), 93),
        ]);
        assert_eq!(names.len(), 2);
        assert_eq!(names[&93], "PKT_TOO_BIG");
        assert_eq!(names[&2], "NOT_SPECIFIED");
    }

    #[test]
    fn the_running_kernel_gives_every_offset_and_reason_name() {
        let k = kernel_net();
        let offsets = k
            .offsets
            .as_ref()
            .expect("every offset from the kernel's BTF");
        assert_eq!(offsets.len(), BTF_OFFSETS.len());
        assert_eq!(drop_reason_name(2), "NOT_SPECIFIED");
        assert!(
            k.drop_reasons.values().any(|n| n == "PKT_TOO_BIG"),
            "6.x kernels name PKT_TOO_BIG"
        );
        assert_eq!(drop_reason_name(1_000_000), "reason_1000000");
    }
}
