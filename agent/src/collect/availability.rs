//! Which figures exist: from which probes are attached, what the window's figures can be
//! trusted for. Owned by `collect`, beside the window it qualifies; every layer above (the
//! diagnosis, the reports, the exporter) reads it from here.

use stormwatch_common::net::NetIfKey;

use crate::probes::{ProbeStatus, futex, locks, net, sched};

/// Which figures can be trusted, from which probes are attached.
#[derive(Clone, Copy, Debug, Default)]
pub struct Availability {
    /// sched_switch: switches, migrations, on-CPU time.
    pub switch: bool,
    /// Off-CPU time and run-queue latency: sched_switch as tp_btf where the kernel keeps
    /// `sched_info`, else with sched_wakeup + sched_wakeup_new.
    pub wakeup: bool,
    /// sched_waking, sched_wakeup and sched_wakeup_new as tp_btf: wake-ups told local or remote.
    pub wake_kinds: bool,
    /// sys_enter_futex + sys_exit_futex.
    pub futex: bool,
    /// lock:contention_begin + contention_end.
    pub locks: bool,
    /// The network probes.
    pub net: NetAvailability,
    /// `sched_switch` can blame run-queue waits on what held the CPU (always, or on demand).
    pub runq_blame: bool,
}

impl Availability {
    pub const ALL: Self = Self {
        switch: true,
        wakeup: true,
        wake_kinds: true,
        futex: true,
        locks: true,
        net: NetAvailability::ALL,
        runq_blame: true,
    };

    /// From the probes' status; `waits_from_switch`: [`crate::probes::Probes::waits_from_switch`].
    pub fn from_status(status: &[ProbeStatus], waits_from_switch: bool) -> Self {
        let attached = |tp: &str| status.iter().any(|s| s.tracepoint == tp && s.attached());
        let switch = attached(sched::SWITCH);
        Self {
            switch,
            wakeup: switch
                && (waits_from_switch || attached(sched::WAKEUP) && attached(sched::WAKEUP_NEW)),
            wake_kinds: switch
                && attached(sched::WAKEUP)
                && attached(sched::WAKEUP_NEW)
                && attached(sched::WAKING),
            futex: attached(futex::ENTER) && attached(futex::EXIT),
            locks: attached(locks::BEGIN) && attached(locks::END),
            net: NetAvailability::from_status(status),
            runq_blame: false,
        }
    }
}

/// Which network figures can be trusted, from which probes are attached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetAvailability {
    /// The transmit and receive hooks: per-container packets and bytes.
    pub cgroup: bool,
    pub tcp_retransmits: bool,
    /// `net_dev_start_xmit`: interface transmit figures.
    pub tx: bool,
    /// `netif_receive_skb`: interface receive figures.
    pub rx: bool,
    /// `kfree_skb`: drops.
    pub drops: bool,
}

impl NetAvailability {
    pub const ALL: Self = Self {
        cgroup: true,
        tcp_retransmits: true,
        tx: true,
        rx: true,
        drops: true,
    };

    pub fn from_status(status: &[ProbeStatus]) -> Self {
        let attached = |tp: &str| status.iter().any(|s| s.tracepoint == tp && s.attached());
        Self {
            cgroup: net::CONTAINER_PROBES.iter().all(|p| attached(p)),
            tcp_retransmits: attached(net::RETRANSMIT),
            tx: attached(net::XMIT),
            rx: attached(net::RECEIVE),
            drops: attached(net::KFREE_SKB),
        }
    }

    pub fn any(&self) -> bool {
        self.cgroup || self.tcp_retransmits || self.tx || self.rx || self.drops
    }
}

/// The key the probes use for an interface (namespace inodes fit in 32 bits: they come from
/// the kernel's proc inode allocator).
pub fn iface_key(netns: u64, ifindex: u32) -> NetIfKey {
    NetIfKey {
        netns: netns as u32,
        ifindex,
    }
}
