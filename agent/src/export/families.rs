//! Every exported family, declared once, as data: its name, help, type, unit, labels, when it
//! is absent, and the figure it reads. One loop ([`encode`]) writes them all, and the metric
//! reference in `agent/METRICS.md` is generated from the same table ([`reference`]; a test fails
//! on any difference), so name, help, type and labels cannot drift between the two.
//!
//! Owns: the table and the encoding loop. Imports the exporter's state (`super::state`,
//! `super::network`) and the helpers that turn figures into samples (`super::metrics`); nothing
//! above `export` imports it but through [`encode`].
//!
//! Adding a figure to `/metrics` is one entry here: a per-cgroup figure is a [`Read::Cgroup`]
//! (or [`Read::CgroupBy`] with one more label) reading the series' totals.

use std::fmt;

use prometheus_client::{
    encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet},
    metrics::MetricType,
};
use stormwatch_common::{Log2Histogram, lock_kind, net::NetIfKey};

use super::{
    metrics::{
        ProcessFigures, Value, cgroup_labels, counter, duration_histogram, gauge, log2_histogram,
    },
    network::{InterfaceInfo, NetworkSeries, directions, sizes_against_mtu},
    state::{DurationHistogram, Exporter, SEVERITIES, Series},
};
use crate::probes::net::drop_reason_name;

/// What the readers see: the exporter's state, and the agent's own process figures (read once
/// per rendering).
pub struct Ctx<'a> {
    pub e: &'a Exporter,
    pub process: Option<ProcessFigures>,
}

/// A family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
    Info,
}

impl Kind {
    fn metric_type(self) -> MetricType {
        match self {
            Kind::Counter => MetricType::Counter,
            Kind::Gauge => MetricType::Gauge,
            Kind::Histogram => MetricType::Histogram,
            Kind::Info => MetricType::Info,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
            Kind::Info => "info",
        }
    }
}

/// The section of the reference a family is listed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Cgroup,
    Finding,
    Interface,
    Host,
    Agent,
}

impl Scope {
    const ALL: [Scope; 5] = [
        Scope::Cgroup,
        Scope::Finding,
        Scope::Interface,
        Scope::Host,
        Scope::Agent,
    ];

    fn title(self) -> &'static str {
        match self {
            Scope::Cgroup => "Per container (cgroup)",
            Scope::Finding => "Findings",
            Scope::Interface => "Per interface (network)",
            Scope::Host => "The host",
            Scope::Agent => "The agent itself",
        }
    }
}

/// One sample's figure.
pub enum Sample<'a> {
    Value(Value),
    /// A log2 latency histogram; `false`: only its `+Inf` bucket, `_sum` and `_count`.
    Log2(&'a Log2Histogram, bool),
    Durations(&'a DurationHistogram),
    Info,
}

/// Receives a family's samples: label values (in the family's `labels` order) and the figure.
pub type Emit<'e, 'a> = dyn FnMut(&[&str], Sample<'a>) -> fmt::Result + 'e;

/// Where a family's figures come from.
pub enum Read {
    /// Per cgroup: one sample (labels: the cgroup's four), or none for that cgroup.
    Cgroup(fn(&Series) -> Option<Value>),
    /// Per cgroup: one sample per value of the family's last label.
    CgroupBy(fn(&Series) -> Vec<(&'static str, Value)>),
    /// Per cgroup: a latency histogram, with its buckets when the config's `histograms` is on.
    CgroupHistogram(fn(&Series) -> Option<&Log2Histogram>),
    /// Anything else: the samples from the whole state.
    Samples(for<'a> fn(&'a Ctx<'a>, &mut Emit<'_, 'a>) -> fmt::Result),
}

/// One exported family.
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    /// The base unit of its figures (in its name, as Prometheus names go), or "".
    pub unit: &'static str,
    pub labels: &'static [&'static str],
    pub scope: Scope,
    /// When the family is written at all (its probe attached, its figure known).
    pub present: fn(&Ctx) -> bool,
    /// When it is absent, or a series of it is, for the reference ("" when always there).
    pub absent: &'static str,
    pub read: Read,
}

const CGROUP: &[&str] = &["namespace", "pod", "container", "cgroup"];
#[cfg(test)]
const IFACE: [&str; 7] = [
    "netns",
    "ifindex",
    "interface",
    "namespace",
    "pod",
    "container",
    "cgroup",
];
/// The most labels a family has.
const MAX_LABELS: usize = 9;

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn always(_: &Ctx) -> bool {
    true
}

use Value::{Float, Int};

/// Every family, in the order of the exposition.
pub static FAMILIES: &[Family] = &[
    // ---- per cgroup: the scheduler ----
    Family {
        name: "stormwatch_context_switches",
        help: "Context switches of the cgroup's tasks, by type: voluntary (the task blocked) or \
               involuntary (it was preempted).",
        kind: Kind::Counter,
        unit: "",
        labels: &["namespace", "pod", "container", "cgroup", "type"],
        scope: Scope::Cgroup,
        present: |c| c.e.avail.switch,
        absent: "the switch probe is not attached",
        read: Read::CgroupBy(|s| {
            let sched = &s.totals.sched;
            vec![
                ("voluntary", Int(sched.voluntary_switches)),
                ("involuntary", Int(sched.involuntary_switches)),
            ]
        }),
    },
    Family {
        name: "stormwatch_migrations",
        help: "Migrations of the cgroup's tasks from one CPU to another.",
        kind: Kind::Counter,
        unit: "",
        labels: CGROUP,
        scope: Scope::Cgroup,
        present: |c| c.e.avail.switch,
        absent: "the switch probe is not attached",
        read: Read::Cgroup(|s| Some(Int(s.totals.sched.migrations))),
    },
    Family {
        name: "stormwatch_oncpu_seconds",
        help: "Time the cgroup's tasks spent on a CPU.",
        kind: Kind::Counter,
        unit: "seconds",
        labels: CGROUP,
        scope: Scope::Cgroup,
        present: |c| c.e.avail.switch,
        absent: "the switch probe is not attached",
        read: Read::Cgroup(|s| Some(Float(secs(s.totals.sched.oncpu_ns)))),
    },
    Family {
        name: "stormwatch_offcpu_seconds",
        help: "Time the cgroup's tasks spent off CPU, blocked or sleeping, until woken.",
        kind: Kind::Counter,
        unit: "seconds",
        labels: CGROUP,
        scope: Scope::Cgroup,
        present: |c| c.e.avail.wakeup,
        absent: "the wake-up probe is not attached",
        read: Read::Cgroup(|s| Some(Float(secs(s.totals.sched.offcpu_ns)))),
    },
    Family {
        name: "stormwatch_runqueue_latency_seconds",
        help: "Time from a task's wake-up to its running on a CPU (run-queue latency).",
        kind: Kind::Histogram,
        unit: "seconds",
        labels: CGROUP,
        scope: Scope::Cgroup,
        present: |c| c.e.avail.wakeup,
        absent: "the wake-up probe is not attached; only `+Inf`, `_sum` and `_count` with \
                 `histograms = false`",
        read: Read::CgroupHistogram(|s| Some(&s.totals.sched.runq)),
    },
    Family {
        name: "stormwatch_wakeups",
        help: "Wake-ups of the cgroup's tasks, by kind: local (the waker ran on the CPU the task \
               was queued on) or remote (another CPU: an inter-processor interrupt, a VM exit on \
               most hypervisors). Counted while the wake-up probes are attached (with \
               wake_kinds = \"on-demand\", while a lock storm is found).",
        kind: Kind::Counter,
        unit: "",
        labels: &["namespace", "pod", "container", "cgroup", "kind"],
        scope: Scope::Cgroup,
        present: |c| c.e.avail.wake_kinds,
        absent: "the wake-up kind probes are not attached (on demand)",
        read: Read::CgroupBy(|s| {
            let sched = &s.totals.sched;
            vec![
                ("local", Int(sched.wake_local.count)),
                ("remote", Int(sched.wake_remote.count)),
            ]
        }),
    },
    // ---- per cgroup: futexes ----
    Family {
        name: "stormwatch_futex_waits",
        help: "Futex wait calls of the cgroup's tasks (FUTEX_WAIT, WAIT_BITSET, LOCK_PI, \
               futex_wait(v)).",
        kind: Kind::Counter,
        unit: "",
        labels: CGROUP,
        scope: Scope::Cgroup,
        present: |c| c.e.avail.futex,
        absent: "the futex probes are not attached (on demand); a cgroup without futex events",
        read: Read::Cgroup(|s| {
            s.has_futex_figures()
                .then_some(Int(s.totals.futex.wait.count))
        }),
    },
    Family {
        name: "stormwatch_futex_wait_seconds",
        help: "Time the cgroup's tasks spent in futex waits, summed over tasks.",
        kind: Kind::Counter,
        unit: "seconds",
        labels: CGROUP,
        scope: Scope::Cgroup,
        present: |c| c.e.avail.futex,
        absent: "as `stormwatch_futex_waits`",
        read: Read::Cgroup(|s| {
            s.has_futex_figures()
                .then_some(Float(secs(s.totals.futex.wait.sum_ns)))
        }),
    },
    Family {
        name: "stormwatch_futex_wakes",
        help: "Futex wake calls of the cgroup's tasks.",
        kind: Kind::Counter,
        unit: "",
        labels: CGROUP,
        scope: Scope::Cgroup,
        present: |c| c.e.avail.futex,
        absent: "as `stormwatch_futex_waits`",
        read: Read::Cgroup(|s| s.has_futex_figures().then_some(Int(s.totals.futex.wakes))),
    },
    Family {
        name: "stormwatch_futex_timeouts",
        help: "Futex waits of the cgroup's tasks that ended in a timeout.",
        kind: Kind::Counter,
        unit: "",
        labels: CGROUP,
        scope: Scope::Cgroup,
        present: |c| c.e.avail.futex,
        absent: "as `stormwatch_futex_waits`",
        read: Read::Cgroup(|s| {
            s.has_futex_figures()
                .then_some(Int(s.totals.futex.timeouts))
        }),
    },
    // Not `stormwatch_futex_wait_seconds`: that name's `_total` is the counter above. Without
    // buckets its sum and count would repeat the two counters above: left out then.
    Family {
        name: "stormwatch_futex_wait_duration_seconds",
        help: "Duration of single futex waits.",
        kind: Kind::Histogram,
        unit: "seconds",
        labels: CGROUP,
        scope: Scope::Cgroup,
        present: |c| c.e.avail.futex && c.e.histograms,
        absent: "as `stormwatch_futex_waits`, and with `histograms = false`",
        read: Read::CgroupHistogram(|s| s.has_futex_figures().then_some(&s.totals.futex.wait)),
    },
    // ---- per cgroup: kernel locks ----
    Family {
        name: "stormwatch_kernel_lock_wait_seconds",
        help: "Time the cgroup's tasks waited for contended kernel locks, by lock kind.",
        kind: Kind::Counter,
        unit: "seconds",
        labels: &["namespace", "pod", "container", "cgroup", "lock"],
        scope: Scope::Cgroup,
        present: |c| c.e.avail.locks,
        absent: "the lock probes are not attached; a kind's series appears with its first \
                 contended wait",
        read: Read::CgroupBy(|s| lock_kinds(s, |l, k| Float(secs(l.wait_ns[k])))),
    },
    Family {
        name: "stormwatch_kernel_lock_waits",
        help: "Contended kernel lock acquisitions of the cgroup's tasks, by lock kind.",
        kind: Kind::Counter,
        unit: "",
        labels: &["namespace", "pod", "container", "cgroup", "lock"],
        scope: Scope::Cgroup,
        present: |c| c.e.avail.locks,
        absent: "as `stormwatch_kernel_lock_wait_seconds`",
        read: Read::CgroupBy(|s| lock_kinds(s, |l, k| Int(l.count[k]))),
    },
    // ---- per cgroup: resource context. Gauges describe live cgroups only; throttling
    // counters stay with the other counters through the grace period. ----
    Family {
        name: "stormwatch_threads",
        help: "Tasks (threads) in the cgroup (pids.current), read every 60 s (every 10 s with a \
               CPU quota).",
        kind: Kind::Gauge,
        unit: "",
        labels: CGROUP,
        scope: Scope::Cgroup,
        present: always,
        absent: "a removed cgroup; a count that could not be read",
        read: Read::Cgroup(|s| live(s)?.threads.map(Int)),
    },
    Family {
        name: "stormwatch_cpu_quota_cores",
        help: "CPU quota (cpu.max) in cores; absent when unlimited.",
        kind: Kind::Gauge,
        unit: "",
        labels: CGROUP,
        scope: Scope::Cgroup,
        present: always,
        absent: "no quota; a removed cgroup",
        read: Read::Cgroup(|s| live(s)?.cpu_quota_cores.map(Float)),
    },
    Family {
        name: "stormwatch_cpuset_cpus",
        help: "CPUs in the cgroup's effective cpuset.",
        kind: Kind::Gauge,
        unit: "",
        labels: CGROUP,
        scope: Scope::Cgroup,
        present: always,
        absent: "a cpuset that could not be read; a removed cgroup",
        read: Read::Cgroup(|s| {
            let cpus = live(s)?.cpuset_cpus.as_ref()?;
            Some(Int(cpus.len() as u64))
        }),
    },
    Family {
        name: "stormwatch_cpu_throttled_periods",
        help: "CFS periods in which the cgroup was throttled by its quota, since the agent \
               started (or since the cgroup was created).",
        kind: Kind::Counter,
        unit: "",
        labels: CGROUP,
        scope: Scope::Cgroup,
        present: always,
        absent: "counters that could not be read",
        read: Read::Cgroup(|s| s.throttled_periods().map(Int)),
    },
    Family {
        name: "stormwatch_cpu_throttled_seconds",
        help: "Time the cgroup was throttled by its quota, since the agent started (or since the \
               cgroup was created).",
        kind: Kind::Counter,
        unit: "seconds",
        labels: CGROUP,
        scope: Scope::Cgroup,
        present: always,
        absent: "counters that could not be read",
        read: Read::Cgroup(|s| s.throttled_seconds().map(Float)),
    },
    // ---- per cgroup: the network ----
    Family {
        name: "stormwatch_network_packets",
        help: "IP packets of the cgroup, by direction: sent by its sockets, received by the \
               interfaces of its network namespace (a GSO/GRO super-packet counts as its \
               segments; a fragmented packet once).",
        kind: Kind::Counter,
        unit: "",
        labels: &["namespace", "pod", "container", "cgroup", "direction"],
        scope: Scope::Cgroup,
        present: |c| c.e.avail.net.cgroup,
        absent: "the socket probes are not attached; a cgroup without traffic",
        read: Read::CgroupBy(|s| net_directions(s, |n| (n.tx_packets, n.rx_packets))),
    },
    Family {
        name: "stormwatch_network_bytes",
        help: "IP bytes of the cgroup's packets, by direction (headers counted per segment).",
        kind: Kind::Counter,
        unit: "bytes",
        labels: &["namespace", "pod", "container", "cgroup", "direction"],
        scope: Scope::Cgroup,
        present: |c| c.e.avail.net.cgroup,
        absent: "as `stormwatch_network_packets`",
        read: Read::CgroupBy(|s| net_directions(s, |n| (n.tx_bytes, n.rx_bytes))),
    },
    Family {
        name: "stormwatch_network_gso_packets",
        help: "GSO super-packets the cgroup's sockets sent and GRO super-packets its namespace \
               received (each also counted as its segments in stormwatch_network_packets).",
        kind: Kind::Counter,
        unit: "",
        labels: &["namespace", "pod", "container", "cgroup", "direction"],
        scope: Scope::Cgroup,
        present: |c| c.e.avail.net.cgroup,
        absent: "as `stormwatch_network_packets`",
        read: Read::CgroupBy(|s| net_directions(s, |n| (n.tx_gso_packets, n.rx_gso_packets))),
    },
    Family {
        name: "stormwatch_tcp_retransmits",
        help: "TCP segments the cgroup's sockets retransmitted (as the kernel's RetransSegs \
               counts).",
        kind: Kind::Counter,
        unit: "",
        labels: CGROUP,
        scope: Scope::Cgroup,
        present: |c| c.e.avail.net.tcp_retransmits,
        absent: "the retransmit probe is not attached; a cgroup without retransmits",
        read: Read::Cgroup(|s| {
            (s.totals.net.tcp_retransmits != 0).then_some(Int(s.totals.net.tcp_retransmits))
        }),
    },
    // ---- per interface ----
    iface_dir_family(
        "stormwatch_interface_packets",
        "Packets the interface handled, by direction (a GSO/GRO super-packet counts once, as the \
         device's own counters do).",
        "",
        |c, emit| each_direction(c, emit, |d| d.packets),
    ),
    iface_dir_family(
        "stormwatch_interface_bytes",
        "IP-level bytes the interface handled, by direction.",
        "bytes",
        |c, emit| each_direction(c, emit, |d| d.bytes),
    ),
    iface_dir_family(
        "stormwatch_interface_gso_packets",
        "GSO (sent) and GRO (received) super-packets at the interface.",
        "",
        |c, emit| each_direction(c, emit, |d| d.gso_packets),
    ),
    iface_dir_family(
        "stormwatch_interface_gso_segments",
        "Segments the interface's GSO/GRO super-packets carried.",
        "",
        |c, emit| each_direction(c, emit, |d| d.gso_segments),
    ),
    iface_dir_family(
        "stormwatch_interface_fragments",
        "IPv4 and IPv6 fragments at the interface, by direction.",
        "",
        |c, emit| each_direction(c, emit, |d| d.fragments),
    ),
    iface_dir_family(
        "stormwatch_interface_packet_too_big",
        "ICMP \"fragmentation needed\" and ICMPv6 \"packet too big\" messages at the interface, \
         by direction.",
        "",
        |c, emit| each_direction(c, emit, |d| d.ptb),
    ),
    Family {
        name: "stormwatch_interface_packets_by_size",
        help: "Packets that are not GSO/GRO super-packets, by direction and IP length against \
               the interface's MTU: below_mtu (more than 80 bytes under it), near_mtu (within \
               80 bytes under it), at_mtu, above_mtu (received from a peer with a larger MTU; \
               sent: should not exist).",
        kind: Kind::Counter,
        unit: "",
        labels: &[
            "netns",
            "ifindex",
            "interface",
            "namespace",
            "pod",
            "container",
            "cgroup",
            "direction",
            "size",
        ],
        scope: Scope::Interface,
        present: |c| c.e.avail.net.tx || c.e.avail.net.rx,
        absent: "as `stormwatch_interface_packets`",
        read: Read::Samples(|c, emit| {
            let n = &c.e.network;
            for k in interface_keys(n) {
                let Some(s) = n.interfaces.get(&k.0) else {
                    continue;
                };
                let l = n.labels(&k.0, &k.1, &k.2);
                for (dir, d) in directions(s) {
                    if !direction_probed(c, dir) {
                        continue;
                    }
                    for (size, v) in sizes_against_mtu(d) {
                        emit(
                            &[
                                l[0].1, l[1].1, l[2].1, l[3].1, l[4].1, l[5].1, l[6].1, dir, size,
                            ],
                            Sample::Value(Int(v)),
                        )?;
                    }
                }
            }
            Ok(())
        }),
    },
    Family {
        name: "stormwatch_interface_drops",
        help: "Packets the kernel dropped, by interface and reason (enum skb_drop_reason); netns \
               and interface are empty when the packet named no device.",
        kind: Kind::Counter,
        unit: "",
        labels: &[
            "netns",
            "ifindex",
            "interface",
            "namespace",
            "pod",
            "container",
            "cgroup",
            "reason",
        ],
        scope: Scope::Interface,
        present: |c| c.e.avail.net.drops,
        absent: "the drop probe is not attached; a reason not seen",
        read: Read::Samples(|c, emit| {
            let n = &c.e.network;
            for (k, v) in &n.drops {
                let key = NetIfKey {
                    netns: k.netns,
                    ifindex: k.ifindex,
                };
                let (ifindex, netns) = if k.netns == 0 {
                    (String::new(), String::new())
                } else {
                    (k.ifindex.to_string(), k.netns.to_string())
                };
                let reason = drop_reason_name(k.reason);
                let l = n.labels(&key, &ifindex, &netns);
                emit(
                    &[
                        l[0].1,
                        l[1].1,
                        l[2].1,
                        l[3].1,
                        l[4].1,
                        l[5].1,
                        l[6].1,
                        reason.as_str(),
                    ],
                    Sample::Value(Int(*v)),
                )?;
            }
            Ok(())
        }),
    },
    // The inventory: every interface netlink reported (idle ones included), else the MTU the
    // probes saw on the interface's last packet.
    Family {
        name: "stormwatch_interface_mtu_bytes",
        help: "The interface's MTU (kind: veth, vxlan, physical…; empty when only the probes saw \
               it).",
        kind: Kind::Gauge,
        unit: "bytes",
        labels: &[
            "netns",
            "ifindex",
            "interface",
            "namespace",
            "pod",
            "container",
            "cgroup",
            "kind",
        ],
        scope: Scope::Interface,
        present: always,
        absent: "an interface neither in the inventory nor seen by the probes",
        read: Read::Samples(|c, emit| {
            let n = &c.e.network;
            for k in interface_keys(n) {
                let (kind, mtu) = match (n.inventory.get(&k.0), n.interfaces.get(&k.0)) {
                    (Some(i), _) => (i.kind.as_str(), i.mtu),
                    (None, Some(s)) if s.mtu != 0 => ("", s.mtu),
                    _ => continue,
                };
                let l = n.labels(&k.0, &k.1, &k.2);
                emit(
                    &[l[0].1, l[1].1, l[2].1, l[3].1, l[4].1, l[5].1, l[6].1, kind],
                    Sample::Value(Int(u64::from(mtu))),
                )?;
            }
            Ok(())
        }),
    },
    inventory_family(
        "stormwatch_interface_encapsulation_overhead_bytes",
        "Bytes the interface's kind adds to each packet it carries (0 for plain devices; absent \
         when unknown, as for IPsec).",
        |c, emit| each_inventoried(c, emit, |i| i.encapsulation_overhead),
    ),
    inventory_family(
        "stormwatch_interface_underlay_path_mtu_bytes",
        "For a tunnel: the largest outer packet its underlay carries (the underlay device's MTU, \
         or its route's when smaller). A tunnel's MTU should be at most this less its \
         encapsulation overhead.",
        |c, emit| each_inventoried(c, emit, |i| i.underlay_path_mtu),
    ),
    // ---- findings ----
    Family {
        name: "stormwatch_findings",
        help: "Findings of the diagnosis rules over the sliding window, by severity.",
        kind: Kind::Gauge,
        unit: "",
        labels: &["severity"],
        scope: Scope::Finding,
        present: always,
        absent: "",
        read: Read::Samples(|c, emit| {
            for severity in SEVERITIES {
                let n =
                    c.e.findings
                        .iter()
                        .filter(|f| f.severity == severity)
                        .count();
                emit(&[severity], Sample::Value(Int(n as u64)))?;
            }
            Ok(())
        }),
    },
    Family {
        name: "stormwatch_finding",
        help: "1 while a diagnosis rule holds for a cgroup over the sliding window (see \
               stormwatch diagnose for the evidence).",
        kind: Kind::Gauge,
        unit: "",
        labels: &[
            "kind",
            "severity",
            "namespace",
            "pod",
            "container",
            "cgroup",
        ],
        scope: Scope::Finding,
        present: always,
        absent: "the rule does not hold",
        read: Read::Samples(|c, emit| {
            for f in &c.e.findings {
                emit(
                    &[
                        f.kind,
                        f.severity,
                        f.labels.namespace.as_str(),
                        f.labels.pod.as_str(),
                        f.labels.container.as_str(),
                        f.cgroup.as_str(),
                    ],
                    Sample::Value(Int(1)),
                )?;
            }
            Ok(())
        }),
    },
    // ---- the host ----
    Family {
        name: "stormwatch_host",
        help: "The host: hypervisor (kvm, xen, hyperv, vmware, ...; unknown when a hypervisor \
               does not say which; none on bare metal) and kernel release.",
        kind: Kind::Info,
        unit: "",
        labels: &["hypervisor", "kernel"],
        scope: Scope::Host,
        present: |c| c.e.host.is_some(),
        absent: "before the host is read",
        read: Read::Samples(|c, emit| {
            let Some(h) = &c.e.host else { return Ok(()) };
            emit(
                &[h.hypervisor.as_deref().unwrap_or("none"), h.kernel.as_str()],
                Sample::Info,
            )
        }),
    },
    Family {
        name: "stormwatch_host_cpus",
        help: "Online CPUs of the host.",
        kind: Kind::Gauge,
        unit: "",
        labels: &[],
        scope: Scope::Host,
        present: |c| c.e.host.is_some(),
        absent: "before the host is read",
        read: Read::Samples(|c, emit| match &c.e.host {
            Some(h) => emit(&[], Sample::Value(Int(u64::from(h.cpus)))),
            None => Ok(()),
        }),
    },
    Family {
        name: "stormwatch_host_numa_nodes",
        help: "Online NUMA nodes of the host.",
        kind: Kind::Gauge,
        unit: "",
        labels: &[],
        scope: Scope::Host,
        present: |c| c.e.host.as_ref().is_some_and(|h| h.numa_nodes.is_some()),
        absent: "the NUMA nodes could not be read",
        read: Read::Samples(
            |c, emit| match c.e.host.as_ref().and_then(|h| h.numa_nodes) {
                Some(n) => emit(&[], Sample::Value(Int(u64::from(n)))),
                None => Ok(()),
            },
        ),
    },
    Family {
        name: "stormwatch_host_steal_seconds",
        help: "CPU time the hypervisor gave to others while the host's vCPUs had work (steal, \
               from /proc/stat), summed over CPUs, since the host booted.",
        kind: Kind::Counter,
        unit: "seconds",
        labels: &[],
        scope: Scope::Host,
        present: |c| c.e.host_steal_seconds.is_some(),
        absent: "/proc/stat could not be read",
        read: Read::Samples(|c, emit| match c.e.host_steal_seconds {
            Some(s) => emit(&[], Sample::Value(Float(s))),
            None => Ok(()),
        }),
    },
    // ---- the agent itself ----
    Family {
        name: "stormwatch_build",
        help: "The agent's version.",
        kind: Kind::Info,
        unit: "",
        labels: &["version"],
        scope: Scope::Agent,
        present: always,
        absent: "",
        read: Read::Samples(|_, emit| emit(&[env!("CARGO_PKG_VERSION")], Sample::Info)),
    },
    Family {
        name: "stormwatch_probe_attached",
        help: "1 when the probe on this tracepoint is attached (kind: tp_btf or tracepoint), 0 \
               when not.",
        kind: Kind::Gauge,
        unit: "",
        labels: &["tracepoint", "kind"],
        scope: Scope::Agent,
        present: always,
        absent: "",
        read: Read::Samples(|c, emit| {
            for p in &c.e.probes {
                let kind = p.kind.map(|k| k.to_string()).unwrap_or_default();
                emit(
                    &[p.tracepoint, kind.as_str()],
                    Sample::Value(Int(u64::from(p.attached()))),
                )?;
            }
            Ok(())
        }),
    },
    Family {
        name: "stormwatch_probe_on_demand",
        help: "1 for a probe loaded at start and attached only while needed: the wake-up probes \
               while a lock storm is found (wake_kinds = \"on-demand\"), the futex probes while a \
               cgroup's scheduler figures look like a lock storm (futex_probes = \"on-demand\"), \
               the per-packet network probes while packets do not fit and in surveys \
               (net_packet_probes = \"on-demand\").",
        kind: Kind::Gauge,
        unit: "",
        labels: &["tracepoint"],
        scope: Scope::Agent,
        present: always,
        absent: "a probe that is always attached",
        read: Read::Samples(|c, emit| {
            for p in c.e.probes.iter().filter(|p| p.on_demand()) {
                emit(&[p.tracepoint], Sample::Value(Int(1)))?;
            }
            Ok(())
        }),
    },
    Family {
        name: "stormwatch_bpf_stats_enabled",
        help: "1 when the kernel's BPF run-time statistics are on (else the program run counters \
               stand still).",
        kind: Kind::Gauge,
        unit: "",
        labels: &[],
        scope: Scope::Agent,
        present: always,
        absent: "",
        read: Read::Samples(|c, emit| {
            emit(&[], Sample::Value(Int(u64::from(c.e.bpf_stats_enabled))))
        }),
    },
    Family {
        name: "stormwatch_bpf_program_runs",
        help: "Runs of each of the agent's BPF programs, from the kernel's BPF statistics.",
        kind: Kind::Counter,
        unit: "",
        labels: &["program"],
        scope: Scope::Agent,
        present: always,
        absent: "",
        read: Read::Samples(|c, emit| {
            for p in &c.e.programs {
                emit(&[p.program.as_str()], Sample::Value(Int(p.runs)))?;
            }
            Ok(())
        }),
    },
    Family {
        name: "stormwatch_bpf_program_run_seconds",
        help: "Time spent running each of the agent's BPF programs, from the kernel's BPF \
               statistics.",
        kind: Kind::Counter,
        unit: "seconds",
        labels: &["program"],
        scope: Scope::Agent,
        present: always,
        absent: "",
        read: Read::Samples(|c, emit| {
            for p in &c.e.programs {
                emit(&[p.program.as_str()], Sample::Value(Float(secs(p.run_ns))))?;
            }
            Ok(())
        }),
    },
    Family {
        name: "stormwatch_lost_events",
        help: "Events the probes could not record, by reason, since they were attached.",
        kind: Kind::Counter,
        unit: "",
        labels: &["reason"],
        scope: Scope::Agent,
        present: always,
        absent: "",
        read: Read::Samples(|c, emit| {
            for (reason, n) in &c.e.lost_events {
                emit(&[reason], Sample::Value(Int(*n)))?;
            }
            Ok(())
        }),
    },
    Family {
        name: "stormwatch_collection_errors",
        help: "Collections that failed (reading the probes' maps); the next collection covers \
               the gap.",
        kind: Kind::Counter,
        unit: "",
        labels: &[],
        scope: Scope::Agent,
        present: always,
        absent: "",
        read: Read::Samples(|c, emit| emit(&[], Sample::Value(Int(c.e.collection_errors)))),
    },
    Family {
        name: "stormwatch_collection_duration_seconds",
        help: "Time one collection took (reading the maps, naming cgroups, reading limits, \
               diagnosis).",
        kind: Kind::Histogram,
        unit: "seconds",
        labels: &[],
        scope: Scope::Agent,
        present: always,
        absent: "",
        read: Read::Samples(|c, emit| emit(&[], Sample::Durations(&c.e.collection_duration))),
    },
    Family {
        name: "stormwatch_last_collection_timestamp_seconds",
        help: "Unix time of the last collection.",
        kind: Kind::Gauge,
        unit: "seconds",
        labels: &[],
        scope: Scope::Agent,
        present: |c| c.e.last_collection_unix_seconds.is_some(),
        absent: "before the first collection",
        read: Read::Samples(|c, emit| match c.e.last_collection_unix_seconds {
            Some(t) => emit(&[], Sample::Value(Float(t))),
            None => Ok(()),
        }),
    },
    Family {
        name: "stormwatch_render_duration_seconds",
        help: "Time the previous rendering of this exposition took.",
        kind: Kind::Gauge,
        unit: "seconds",
        labels: &[],
        scope: Scope::Agent,
        present: always,
        absent: "",
        read: Read::Samples(|c, emit| emit(&[], Sample::Value(Float(c.e.render_seconds)))),
    },
    Family {
        name: "stormwatch_exposition_bytes",
        help: "Size of the previous rendering of this exposition (OpenMetrics text).",
        kind: Kind::Gauge,
        unit: "bytes",
        labels: &[],
        scope: Scope::Agent,
        present: always,
        absent: "",
        read: Read::Samples(|c, emit| emit(&[], Sample::Value(Int(c.e.exposition_bytes as u64)))),
    },
    Family {
        name: "process_cpu_seconds",
        help: "CPU time the agent's process used, user and system (/proc/self/stat).",
        kind: Kind::Counter,
        unit: "seconds",
        labels: &[],
        scope: Scope::Agent,
        present: |c| c.process.is_some(),
        absent: "/proc/self could not be read",
        read: Read::Samples(|c, emit| match &c.process {
            Some(p) => emit(&[], Sample::Value(Float(p.cpu_seconds))),
            None => Ok(()),
        }),
    },
    Family {
        name: "process_resident_memory_bytes",
        help: "The agent's resident memory (/proc/self/stat); BPF maps are charged to its memory \
               cgroup, not counted here.",
        kind: Kind::Gauge,
        unit: "bytes",
        labels: &[],
        scope: Scope::Agent,
        present: |c| c.process.is_some(),
        absent: "/proc/self could not be read",
        read: Read::Samples(|c, emit| match &c.process {
            Some(p) => emit(&[], Sample::Value(Int(p.resident_bytes))),
            None => Ok(()),
        }),
    },
    Family {
        name: "process_open_fds",
        help: "File descriptors the agent's process holds (BPF maps, programs and links among \
               them).",
        kind: Kind::Gauge,
        unit: "",
        labels: &[],
        scope: Scope::Agent,
        present: |c| c.process.is_some(),
        absent: "/proc/self could not be read",
        read: Read::Samples(|c, emit| match &c.process {
            Some(p) => emit(&[], Sample::Value(Int(p.open_fds))),
            None => Ok(()),
        }),
    },
    Family {
        name: "stormwatch_cgroups_tracked",
        help: "Cgroups exported, including removed ones in their grace period.",
        kind: Kind::Gauge,
        unit: "",
        labels: &[],
        scope: Scope::Agent,
        present: always,
        absent: "",
        read: Read::Samples(|c, emit| {
            emit(&[], Sample::Value(Int(c.e.cgroups.series().len() as u64)))
        }),
    },
    Family {
        name: "stormwatch_cgroups_removed",
        help: "Removed cgroups whose series are kept for the grace period.",
        kind: Kind::Gauge,
        unit: "",
        labels: &[],
        scope: Scope::Agent,
        present: always,
        absent: "",
        read: Read::Samples(|c, emit| emit(&[], Sample::Value(Int(c.e.cgroups.removed() as u64)))),
    },
    Family {
        name: "stormwatch_cgroups_max",
        help: "The most cgroups exported at once (max_cgroups).",
        kind: Kind::Gauge,
        unit: "",
        labels: &[],
        scope: Scope::Agent,
        present: always,
        absent: "",
        read: Read::Samples(|c, emit| {
            emit(&[], Sample::Value(Int(c.e.cgroups.max_cgroups() as u64)))
        }),
    },
    Family {
        name: "stormwatch_cgroups_dropped",
        help: "Cgroups not exported because max_cgroups were already tracked.",
        kind: Kind::Counter,
        unit: "",
        labels: &[],
        scope: Scope::Agent,
        present: always,
        absent: "",
        read: Read::Samples(|c, emit| emit(&[], Sample::Value(Int(c.e.cgroups.dropped_total)))),
    },
    Family {
        name: "stormwatch_cgroups_unresolved",
        help: "Cgroups with figures not exported because they were removed before their path \
               could be read.",
        kind: Kind::Counter,
        unit: "",
        labels: &[],
        scope: Scope::Agent,
        present: always,
        absent: "",
        read: Read::Samples(|c, emit| emit(&[], Sample::Value(Int(c.e.cgroups.unresolved_total)))),
    },
];

/// A live cgroup's limits (gauges describe live cgroups only).
fn live(s: &Series) -> Option<&crate::identity::limits::Limits> {
    s.removed_at.is_none().then_some(())?;
    s.limits.as_ref()
}

/// A kind's series appears with its first contended wait.
fn lock_kinds(
    s: &Series,
    value: fn(&stormwatch_common::LockStats, usize) -> Value,
) -> Vec<(&'static str, Value)> {
    let l = &s.totals.locks;
    lock_kind::NAMES
        .iter()
        .enumerate()
        .filter(|(k, _)| l.count[*k] != 0)
        .map(|(k, kind)| (*kind, value(l, k)))
        .collect()
}

/// Sent and received, for a cgroup with traffic.
fn net_directions(
    s: &Series,
    value: fn(&stormwatch_common::net::CgroupNetStats) -> (u64, u64),
) -> Vec<(&'static str, Value)> {
    let n = &s.totals.net;
    if *n == stormwatch_common::net::CgroupNetStats::ZERO {
        return Vec::new();
    }
    let (sent, received) = value(n);
    vec![("sent", Int(sent)), ("received", Int(received))]
}

/// Every interface with figures or in the inventory, with its ifindex and netns as text.
fn interface_keys(n: &NetworkSeries) -> Vec<(NetIfKey, String, String)> {
    n.interfaces
        .keys()
        .chain(n.inventory.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|k| (*k, k.ifindex.to_string(), k.netns.to_string()))
        .collect()
}

fn direction_probed(c: &Ctx, dir: &str) -> bool {
    if dir == "sent" {
        c.e.avail.net.tx
    } else {
        c.e.avail.net.rx
    }
}

const fn iface_dir_family(
    name: &'static str,
    help: &'static str,
    unit: &'static str,
    read: for<'a> fn(&'a Ctx<'a>, &mut Emit<'_, 'a>) -> fmt::Result,
) -> Family {
    Family {
        name,
        help,
        kind: Kind::Counter,
        unit,
        labels: &[
            "netns",
            "ifindex",
            "interface",
            "namespace",
            "pod",
            "container",
            "cgroup",
            "direction",
        ],
        scope: Scope::Interface,
        present: |c| c.e.avail.net.tx || c.e.avail.net.rx,
        absent: "the interface probes are not attached; a direction not probed; an interface \
                 without traffic",
        read: Read::Samples(read),
    }
}

fn each_direction<'a>(
    c: &'a Ctx<'a>,
    emit: &mut Emit<'_, 'a>,
    value: fn(&stormwatch_common::net::NetDirStats) -> u64,
) -> fmt::Result {
    let n = &c.e.network;
    for k in interface_keys(n) {
        let Some(s) = n.interfaces.get(&k.0) else {
            continue;
        };
        let l = n.labels(&k.0, &k.1, &k.2);
        for (dir, d) in directions(s) {
            if direction_probed(c, dir) {
                emit(
                    &[l[0].1, l[1].1, l[2].1, l[3].1, l[4].1, l[5].1, l[6].1, dir],
                    Sample::Value(Int(value(d))),
                )?;
            }
        }
    }
    Ok(())
}

const fn inventory_family(
    name: &'static str,
    help: &'static str,
    read: for<'a> fn(&'a Ctx<'a>, &mut Emit<'_, 'a>) -> fmt::Result,
) -> Family {
    Family {
        name,
        help,
        kind: Kind::Gauge,
        unit: "bytes",
        labels: &[
            "netns",
            "ifindex",
            "interface",
            "namespace",
            "pod",
            "container",
            "cgroup",
            "kind",
        ],
        scope: Scope::Interface,
        present: always,
        absent: "an interface not in the inventory, or the figure unknown",
        read: Read::Samples(read),
    }
}

fn each_inventoried<'a>(
    c: &'a Ctx<'a>,
    emit: &mut Emit<'_, 'a>,
    value: fn(&InterfaceInfo) -> Option<u32>,
) -> fmt::Result {
    let n = &c.e.network;
    for k in interface_keys(n) {
        if let Some(i) = n.inventory.get(&k.0)
            && let Some(v) = value(i)
        {
            let l = n.labels(&k.0, &k.1, &k.2);
            emit(
                &[
                    l[0].1,
                    l[1].1,
                    l[2].1,
                    l[3].1,
                    l[4].1,
                    l[5].1,
                    l[6].1,
                    i.kind.as_str(),
                ],
                Sample::Value(Int(u64::from(v))),
            )?;
        }
    }
    Ok(())
}

/// Writes one sample of a family, its labels named as the family declares them.
fn write(m: &mut MetricEncoder, f: &Family, values: &[&str], sample: Sample) -> fmt::Result {
    debug_assert_eq!(values.len(), f.labels.len(), "{}: label values", f.name);
    let mut buf: [(&str, &str); MAX_LABELS] = [("", ""); MAX_LABELS];
    let n = f.labels.len().min(values.len());
    for (slot, (name, value)) in buf.iter_mut().zip(f.labels.iter().zip(values)) {
        *slot = (name, value);
    }
    let labels: &[(&str, &str)] = &buf[..n];
    match (f.kind, sample) {
        (Kind::Counter, Sample::Value(v)) if n == 0 => match v {
            Int(v) => m.encode_counter::<NoLabelSet, _, f64>(&v, None),
            Float(v) => m.encode_counter::<NoLabelSet, _, f64>(&v, None),
        },
        (Kind::Gauge, Sample::Value(v)) if n == 0 => match v {
            Int(v) => m.encode_gauge(&v),
            Float(v) => m.encode_gauge(&v),
        },
        (Kind::Counter, Sample::Value(v)) => counter(m, &labels, v),
        (Kind::Gauge, Sample::Value(v)) => gauge(m, &labels, v),
        (Kind::Histogram, Sample::Log2(h, buckets)) => log2_histogram(m, &labels, h, buckets),
        (Kind::Histogram, Sample::Durations(h)) => duration_histogram(m, h),
        (Kind::Info, Sample::Info) => m.encode_info(&labels),
        _ => {
            debug_assert!(false, "{}: a sample of another type", f.name);
            Ok(())
        }
    }
}

/// Writes every family present in the state.
pub fn encode(enc: &mut DescriptorEncoder, c: &Ctx) -> fmt::Result {
    for f in FAMILIES {
        if !(f.present)(c) {
            continue;
        }
        let mut m = enc.encode_descriptor(f.name, f.help, None, f.kind.metric_type())?;
        match &f.read {
            Read::Cgroup(value) => {
                for (path, s) in c.e.cgroups.series() {
                    if let Some(v) = value(s) {
                        let l = cgroup_labels(path, s);
                        write(
                            &mut m,
                            f,
                            &[l[0].1, l[1].1, l[2].1, l[3].1],
                            Sample::Value(v),
                        )?;
                    }
                }
            }
            Read::CgroupBy(values) => {
                for (path, s) in c.e.cgroups.series() {
                    let l = cgroup_labels(path, s);
                    for (by, v) in values(s) {
                        write(
                            &mut m,
                            f,
                            &[l[0].1, l[1].1, l[2].1, l[3].1, by],
                            Sample::Value(v),
                        )?;
                    }
                }
            }
            Read::CgroupHistogram(h) => {
                for (path, s) in c.e.cgroups.series() {
                    if let Some(h) = h(s) {
                        let l = cgroup_labels(path, s);
                        write(
                            &mut m,
                            f,
                            &[l[0].1, l[1].1, l[2].1, l[3].1],
                            Sample::Log2(h, c.e.histograms),
                        )?;
                    }
                }
            }
            Read::Samples(read) => {
                let mut emit = |values: &[&str], sample: Sample| write(&mut m, f, values, sample);
                read(c, &mut emit)?;
            }
        }
    }
    Ok(())
}

/// The metric reference of `agent/METRICS.md`, generated from [`FAMILIES`].
pub fn reference() -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for scope in Scope::ALL {
        let _ = write!(
            out,
            "### {}\n\n| family | type | labels | absent when | what it is |\n|---|---|---|---|---|\n",
            scope.title()
        );
        for f in FAMILIES.iter().filter(|f| f.scope == scope) {
            let labels = if f.labels.is_empty() {
                "(none)".to_owned()
            } else {
                f.labels.join(", ")
            };
            let absent = if f.absent.is_empty() { "—" } else { f.absent };
            let _ = writeln!(
                out,
                "| `{}` | {} | {labels} | {absent} | {} |",
                f.name,
                f.kind.name(),
                f.help.replace('|', "\\|")
            );
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEGIN: &str = "<!-- The reference below is generated from agent/src/export/families.rs \
                         (cargo +stable xtask manifests); do not edit it by hand. -->\n";
    const END: &str = "<!-- End of the generated reference. -->\n";

    /// The reference in METRICS.md is the table's, to the byte: name, type, labels, when
    /// absent and help. `STORMWATCH_BLESS=1` (what `cargo xtask manifests` sets) rewrites it.
    #[test]
    fn the_metric_reference_is_generated_from_the_families() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("METRICS.md");
        let doc = std::fs::read_to_string(&path).expect("METRICS.md");
        let start = doc
            .find(BEGIN)
            .expect("the generated reference's start marker")
            + BEGIN.len();
        let end = doc.find(END).expect("the generated reference's end marker");
        let want = reference();
        if std::env::var_os("STORMWATCH_BLESS").is_some() && doc[start..end] != want {
            let new = format!("{}{want}{}", &doc[..start], &doc[end..]);
            std::fs::write(&path, new).expect("writing METRICS.md");
            return;
        }
        assert!(
            doc[start..end] == want,
            "agent/METRICS.md's reference is not the one the families declare: run `cargo \
             +stable xtask manifests`"
        );
    }

    #[test]
    fn names_are_unique_with_their_units_and_few_labels() {
        let mut names = std::collections::HashSet::new();
        for f in FAMILIES {
            assert!(names.insert(f.name), "{} twice", f.name);
            assert!(f.labels.len() <= MAX_LABELS, "{}", f.name);
            if !f.unit.is_empty() {
                assert!(f.name.ends_with(&format!("_{}", f.unit)), "{}", f.name);
            }
            assert!(
                !f.help.is_empty() && f.help.ends_with('.') || f.help.ends_with(')'),
                "{}",
                f.name
            );
            if matches!(f.read, Read::Cgroup(_) | Read::CgroupHistogram(_)) {
                assert_eq!(f.labels, CGROUP, "{}", f.name);
            }
            if matches!(f.read, Read::CgroupBy(_)) {
                assert_eq!(&f.labels[..4], CGROUP, "{}", f.name);
                assert_eq!(f.labels.len(), 5, "{}", f.name);
            }
            if f.scope == Scope::Interface {
                assert_eq!(&f.labels[..7], IFACE, "{}", f.name);
            }
        }
    }
}
