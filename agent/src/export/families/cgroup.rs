//! The per-container (cgroup) families: the scheduler, futexes, kernel locks, the resource
//! context and the container's network traffic.

use stormwatch_common::lock_kind;

use super::{CGROUP, Family, Kind, Read, Sample, Scope, always, secs};
use crate::export::{
    encode::Value::{self, Float, Int},
    state::Series,
};

/// The per-cgroup families, in the order of the exposition.
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
        name: "stormwatch_runqueue_wait_blamed_seconds",
        help: "Run-queue wait of the cgroup's tasks, by what held the CPU while they waited: \
               `self` (its own tasks), another cgroup by path (a window's three largest, \
               at most five per cgroup; the rest add to `other`), `kernel` (kernel threads), `idle` (an idle CPU yet to wake), \
               `stolen` (the hypervisor, or interrupts the kernel accounts apart), `unseen` \
               (began before the runs the CPU remembers). Counted while the switch program \
               blames waits (with runqueue_blame = \"on-demand\", while a container's threads \
               wait for CPUs).",
        kind: Kind::Counter,
        unit: "seconds",
        labels: &["namespace", "pod", "container", "cgroup", "culprit"],
        scope: Scope::Cgroup,
        present: |c| c.e.avail.runq_blame,
        absent: "the switch program cannot blame (no BTF, classic tracepoints, no sched_info); \
                 a cgroup whose waits were not blamed",
        read: Read::Samples(|c, emit| {
            for (path, s) in c.e.cgroups.series() {
                let l = super::cgroup_labels(path, s);
                for (culprit, secs) in &s.blame {
                    emit(
                        &[l[0].1, l[1].1, l[2].1, l[3].1, culprit],
                        Sample::Value(Float(*secs)),
                    )?;
                }
            }
            Ok(())
        }),
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
    // ---- per cgroup: PostgreSQL's heavyweight locks ----
    Family {
        name: "stormwatch_postgres_lock_wait_seconds",
        help: "Time the cgroup's PostgreSQL backends waited for heavyweight locks (rows, \
               transactions, relations), by the server's lock-wait sites; counted as each wait \
               ends.",
        kind: Kind::Counter,
        unit: "seconds",
        labels: CGROUP,
        scope: Scope::Cgroup,
        present: always,
        absent: "a cgroup whose PostgreSQL backends have not waited for a lock since it was \
                 first seen (the probes attach to PostgreSQL binaries with the lock-wait sites, \
                 with the futex family)",
        read: Read::Cgroup(|s| {
            let w = &s.totals.pg_lock;
            (w.waits > 0).then(|| Float(secs(w.wait_ns)))
        }),
    },
    Family {
        name: "stormwatch_postgres_lock_waits",
        help: "Heavyweight lock waits of the cgroup's PostgreSQL backends that ended.",
        kind: Kind::Counter,
        unit: "",
        labels: CGROUP,
        scope: Scope::Cgroup,
        present: always,
        absent: "as `stormwatch_postgres_lock_wait_seconds`",
        read: Read::Cgroup(|s| {
            let w = &s.totals.pg_lock;
            (w.waits > 0).then_some(Int(w.waits))
        }),
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
        name: "stormwatch_cpu_ancestor_quota_cores",
        help: "The tightest CPU quota (cpu.max) of the cgroups above this one (its pod's, a \
               slice's), in cores: the kernel enforces it too, so where it is below the \
               cgroup's own quota and cpuset it is the limit that binds; absent when no cgroup \
               above has a quota.",
        kind: Kind::Gauge,
        unit: "",
        labels: CGROUP,
        scope: Scope::Cgroup,
        present: always,
        absent: "no quota above; a removed cgroup",
        read: Read::Cgroup(|s| live(s)?.ancestor_quota.as_ref().map(|a| Float(a.cores))),
    },
    Family {
        name: "stormwatch_cpu_exclusive_cpus",
        help: "CPUs the kubelet's static CPU manager gave the container for itself (its \
               checkpoint, /var/lib/kubelet/cpu_manager_state, matched with the cgroup's \
               cpuset whenever that is read): the container is pinned; absent where the \
               node's policy pins nothing or the container shares the node's pool.",
        kind: Kind::Gauge,
        unit: "",
        labels: CGROUP,
        scope: Scope::Cgroup,
        present: always,
        absent: "not pinned by the kubelet; no checkpoint read; a removed cgroup",
        read: Read::Cgroup(|s| {
            let cpus = live(s)?.exclusive_cpus.as_ref()?;
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
        help: "TCP segments the cgroup's sockets retransmitted and handed to the device (the \
               kernel's RetransSegs less TCPRetransFail).",
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
