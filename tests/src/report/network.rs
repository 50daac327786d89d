//! The network figures of `trace --json`: interfaces, namespaces, a container's sockets.

use std::collections::BTreeMap;

use serde::Deserialize;

/// An entry of `interfaces`.
#[derive(Clone, Debug, Deserialize)]
pub struct Interface {
    pub name: String,
    /// The network namespace's inode.
    pub netns: u64,
    pub ifindex: u64,
    pub kind: String,
    pub mtu: u64,
    pub encapsulation_overhead: Option<u64>,
    pub underlay: Option<Underlay>,
    pub peer: Option<Peer>,
    pub tx: Option<Direction>,
    pub rx: Option<Direction>,
    /// Drops by reason.
    pub drops: Option<BTreeMap<String, u64>>,
}

impl Interface {
    #[track_caller]
    pub fn tx(&self) -> &Direction {
        self.tx
            .as_ref()
            .unwrap_or_else(|| panic!("no tx figures: {self:#?}"))
    }

    #[track_caller]
    pub fn rx(&self) -> &Direction {
        self.rx
            .as_ref()
            .unwrap_or_else(|| panic!("no rx figures: {self:#?}"))
    }

    /// All its drops, every reason.
    #[track_caller]
    pub fn drops_total(&self) -> u64 {
        self.drops
            .as_ref()
            .unwrap_or_else(|| panic!("no drops on {self:#?}"))
            .values()
            .sum()
    }
}

#[derive(Clone, Debug, Deserialize)]
pub struct Underlay {
    pub name: String,
    pub path_mtu: u64,
}

/// A veth's other end.
#[derive(Clone, Debug, Deserialize)]
pub struct Peer {
    pub netns: u64,
    pub ifindex: u64,
}

/// One direction of one interface.
#[derive(Clone, Debug, Deserialize)]
pub struct Direction {
    pub packets: u64,
    pub gso_packets: u64,
    pub gso_segments: u64,
    pub fragments: u64,
    pub packet_too_big: u64,
    pub lengths: Lengths,
}

/// Packet lengths against the MTU (the MTU counts only where there is one).
#[derive(Clone, Debug, Deserialize)]
pub struct Lengths {
    pub at_mtu: Option<u64>,
    pub over_mtu: Option<u64>,
}

/// An entry of `network_namespaces`.
#[derive(Clone, Debug, Deserialize)]
pub struct Namespace {
    pub netns: u64,
    /// Cgroups of the processes in it.
    pub cgroups: Vec<String>,
    /// `None` when they could not be read at both ends.
    pub counters: Option<Snmp>,
}

/// The namespace's kernel counters over the window (`/proc/net/snmp`).
#[derive(Clone, Debug, Deserialize)]
pub struct Snmp {
    pub fragments_created: Option<u64>,
    pub fragmentation_failures: Option<u64>,
}

/// What a container's sockets sent and received.
#[derive(Clone, Debug, Deserialize)]
pub struct NetworkSummary {
    pub packets_sent: u64,
    pub packets_received: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub gso_packets_sent: u64,
    pub tcp_retransmits: Option<u64>,
}
