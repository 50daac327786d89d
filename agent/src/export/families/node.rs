//! The node's families: the diagnosis' findings, the host, and the agent itself.

use super::{Family, Kind, Read, Sample, Scope, always, secs};
use crate::export::{
    encode::Value::{Float, Int},
    server::DROP_REASONS,
    state::SEVERITIES,
};

/// The node's families, in the order of the exposition.
pub static FAMILIES: &[Family] = &[
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
    Family {
        name: "stormwatch_lock_storm_call_site",
        help: "While a lock_storm finding holds: the code where its lock is waited for \
               (role=waiter) and handed on (role=waker), of the pair of sites with the most \
               sampled hand-offs; the value is that pair's share of them. While a \
               runtime_sizing finding of a Go program holds and its goroutines contend on a \
               sync.Mutex: the code that calls Lock on it held (waiter) and Unlock with \
               waiters (waker), the value the Lock site's share of the sampled calls. Two \
               series per finding at most.",
        kind: Kind::Gauge,
        unit: "",
        labels: &["role", "site", "namespace", "pod", "container", "cgroup"],
        scope: Scope::Finding,
        present: always,
        absent: "no lock_storm (or runtime_sizing with a contended Go sync.Mutex) holds, or its \
                 hand-offs are not sampled (no BTF, not x86-64, the futex probes not attached) \
                 or none was sampled",
        read: Read::Samples(|c, emit| {
            for f in &c.e.findings {
                // A Go program's storm and its runtime sizing name the same sites: once, the
                // storm's (one series per role and site in an exposition).
                let named_by_storm = f.kind != "lock_storm"
                    && c.e.findings.iter().any(|o| {
                        o.kind == "lock_storm" && o.cgroup == f.cgroup && !o.call_sites.is_empty()
                    });
                if named_by_storm {
                    continue;
                }
                for (role, site) in &f.call_sites {
                    emit(
                        &[
                            role,
                            site.as_str(),
                            f.labels.namespace.as_str(),
                            f.labels.pod.as_str(),
                            f.labels.container.as_str(),
                            f.cgroup.as_str(),
                        ],
                        Sample::Value(Float(f.call_site_share)),
                    )?;
                }
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
        name: "stormwatch_jvm_thread_dumps",
        help: "Thread dumps the agent asked of JVMs (jvm_thread_dumps: while the futex probes \
               are attached, of JVMs whose threads hand off; of JVMs with virtual threads, their \
               scheduler's counter, with a JSON dump where jvm_virtual_threads asks), by result: taken, or failed (the JVM \
               could not be attached, and is not asked again; the log says why).",
        kind: Kind::Counter,
        unit: "",
        labels: &["result"],
        scope: Scope::Agent,
        present: always,
        absent: "",
        read: Read::Samples(|c, emit| {
            let (taken, failed) = c.e.jvm_thread_dumps;
            emit(&["taken"], Sample::Value(Int(taken)))?;
            emit(&["failed"], Sample::Value(Int(failed)))
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
    // ---- the agent's caches (issue 45): one block, kept together ----
    Family {
        name: "stormwatch_agent_cache_entries",
        help: "Entries in each of the agent's caches of what the node runs (processes, \
               binaries, threads, call sites, cgroups): each forgets what is gone, and keeps at \
               most stormwatch_agent_cache_max_entries.",
        kind: Kind::Gauge,
        unit: "",
        labels: &["cache"],
        scope: Scope::Agent,
        present: always,
        absent: "",
        read: Read::Samples(|c, emit| {
            for s in &c.e.caches {
                emit(&[s.name], Sample::Value(Int(s.entries)))?;
            }
            Ok(())
        }),
    },
    Family {
        name: "stormwatch_agent_cache_max_entries",
        help: "The most entries each of the agent's caches keeps.",
        kind: Kind::Gauge,
        unit: "",
        labels: &["cache"],
        scope: Scope::Agent,
        present: always,
        absent: "a cache of what is alive, bound by it alone (cgroup_paths: the cgroups that \
                 exist or are in the diagnosis window)",
        read: Read::Samples(|c, emit| {
            for s in &c.e.caches {
                if let Some(max) = s.max_entries {
                    emit(&[s.name], Sample::Value(Int(max)))?;
                }
            }
            Ok(())
        }),
    },
    Family {
        name: "stormwatch_agent_cache_bytes",
        help: "Bytes held by the entries of the agent's caches whose entries are large: ELF \
               call-frame sections (elf_files), JVM perf maps (user_processes), sampled stacks \
               waiting for their pair (handoff_sides_pending).",
        kind: Kind::Gauge,
        unit: "bytes",
        labels: &["cache"],
        scope: Scope::Agent,
        present: always,
        absent: "a cache whose bytes are not counted",
        read: Read::Samples(|c, emit| {
            for s in &c.e.caches {
                if let Some(bytes) = s.bytes {
                    emit(&[s.name], Sample::Value(Int(bytes)))?;
                }
            }
            Ok(())
        }),
    },
    Family {
        name: "stormwatch_agent_cache_max_bytes",
        help: "The most bytes a cache keeps, where its bound is in bytes.",
        kind: Kind::Gauge,
        unit: "bytes",
        labels: &["cache"],
        scope: Scope::Agent,
        present: always,
        absent: "a cache bound by its entries alone",
        read: Read::Samples(|c, emit| {
            for s in &c.e.caches {
                if let Some(max) = s.max_bytes {
                    emit(&[s.name], Sample::Value(Int(max)))?;
                }
            }
            Ok(())
        }),
    },
    // ---- end of the agent's caches ----
    Family {
        name: "stormwatch_http_connections_dropped",
        help: "Connections the metrics endpoint closed to stay within http_max_connections, by \
               reason: evicted (an idle connection, with no request in flight and no response \
               still moving, of the client address holding the most, closed to make room for a \
               new one), refused (a new connection closed at once: every slot, the probe slots \
               too, had a request in flight), probe_only (a connection on a slot reserved for \
               /healthz and /readyz asked for another path: answered 503).",
        kind: Kind::Counter,
        unit: "",
        labels: &["reason"],
        scope: Scope::Agent,
        present: always,
        absent: "",
        read: Read::Samples(|c, emit| {
            let totals = c.e.http_shed.totals();
            for (reason, n) in DROP_REASONS.iter().zip(totals) {
                emit(&[reason], Sample::Value(Int(n)))?;
            }
            Ok(())
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
