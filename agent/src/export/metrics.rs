//! Rendering `/metrics`: the exporter's state encoded with prometheus-client, in the OpenMetrics
//! text format (see [`super::classic`] for the Prometheus text format), every family as
//! [`super::families`] declares it.
//!
//! Names have the `stormwatch_` prefix and base units (seconds); counters end in `_total`
//! (prometheus-client appends it to the family name); every family has help text. Per-cgroup
//! families carry `namespace`, `pod`, `container` (empty when unknown) and `cgroup` (the path
//! relative to the cgroup v2 root). No pid, tid or address labels.

use std::{
    fmt,
    sync::{Arc, Mutex, PoisonError},
    time::Instant,
};

use prometheus_client::{collector::Collector, encoding::DescriptorEncoder, registry::Registry};

use super::{Rendered, encode::ProcessFigures, state::Exporter};

/// The registry's one collector: the exporter's state, read at each rendering.
struct StateCollector(Arc<Mutex<Exporter>>);

impl fmt::Debug for StateCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StateCollector")
    }
}

impl Collector for StateCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let e = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let ctx = super::families::Ctx {
            e: &e,
            process: ProcessFigures::read(),
        };
        super::families::encode(&mut enc, &ctx)
    }
}

/// Renders the exposition in OpenMetrics, at most once per collection (when the first scrape
/// after it asks, see [`super::server::Shared`]); scrapes serve the result (in the format and
/// encoding each asks for, see [`Rendered`]).
pub struct Renderer {
    registry: Registry,
    exporter: Arc<Mutex<Exporter>>,
}

impl Renderer {
    pub fn new(exporter: Arc<Mutex<Exporter>>) -> Self {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(StateCollector(Arc::clone(&exporter))));
        Self { registry, exporter }
    }

    /// The OpenMetrics text of the current state.
    pub fn openmetrics(&self) -> String {
        let hint = self
            .exporter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .exposition_bytes;
        // Sized from the previous rendering, so that the text is not copied as it grows.
        let mut text = String::with_capacity(hint + hint / 32 + 4096);
        if let Err(err) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            // Only our own encoding can fail (a String never does): keep what was written
            // whole, so that the scrape still gets an exposition.
            log::error!("encoding the metrics failed: {err}");
            let end = text.rfind('\n').map_or(0, |i| i + 1);
            text.truncate(end);
            text.push_str("# EOF\n");
        }
        text
    }

    pub fn render(&self) -> Rendered {
        let started = Instant::now();
        let openmetrics = self.openmetrics();
        let mut e = self.exporter.lock().unwrap_or_else(PoisonError::into_inner);
        e.render_seconds = started.elapsed().as_secs_f64();
        e.exposition_bytes = openmetrics.len();
        Rendered::new(openmetrics)
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, time::Duration};

    use super::*;
    use crate::export::classic;
    use crate::{
        collect::Availability,
        collect::{CgroupWindow, Window},
        export::state::{ActiveFinding, Labels, ProgramStats, Tick},
        identity::{limits::Limits, workload::Identity},
        probes::{AttachKind, ProbeStatus},
    };
    use stormwatch_common::lock_kind;

    fn exporter() -> Arc<Mutex<Exporter>> {
        let mut e = Exporter::new(10, Duration::from_secs(60));
        e.avail = Availability::ALL;
        e.probes = vec![
            ProbeStatus {
                tracepoint: "sched:sched_switch",
                kind: Some(AttachKind::TpBtf),
                note: None,
            },
            ProbeStatus {
                tracepoint: "lock:contention_begin",
                kind: None,
                note: Some("missing".into()),
            },
            ProbeStatus {
                tracepoint: "sched:sched_waking",
                kind: None,
                note: Some(crate::probes::sched::ON_DEMAND_DETACHED.into()),
            },
        ];
        e.lost_events = vec![("map_full", 3)];
        e.caches = vec![
            crate::memory::CacheSize {
                name: "elf_files",
                entries: 3,
                max_entries: Some(1024),
                bytes: Some(2_000_000),
                max_bytes: Some(16 << 20),
            },
            crate::memory::CacheSize::entries("thread_names", 12, 65_536),
            crate::memory::CacheSize::live("cgroup_paths", 2),
        ];
        e.programs = vec![ProgramStats {
            program: "sched_switch".into(),
            runs: 10,
            run_ns: 2_000,
        }];
        let mut w = CgroupWindow::ZERO;
        w.sched.voluntary_switches = 7;
        w.sched.involuntary_switches = 2;
        w.sched.oncpu_ns = 1_500_000_000;
        w.sched.runq.record(0);
        w.sched.runq.record(1500);
        w.sched.runq.record(3_000_000_000);
        w.futex.wait.record(2000);
        w.locks.count[lock_kind::MUTEX] = 4;
        w.locks.wait_ns[lock_kind::MUTEX] = 8000;
        let mut window = Window::empty();
        window.cgroups.insert(1, w);
        window.cgroups.insert(2, CgroupWindow::ZERO);
        // Cgroup 1 waited behind cgroup 2 and its own threads.
        for (culprit, ns) in [(2, 250_000_000), (1, 50_000_000)] {
            window.runq_blame.insert(
                stormwatch_common::RunqBlameKey { victim: 1, culprit },
                stormwatch_common::RunqBlameValue { ns },
            );
        }
        let paths = HashMap::from([
            (1, "/kubepods/pod\"x\\y".to_owned()),
            (2, "/system.slice/a.service".to_owned()),
        ]);
        let identities = HashMap::from([(
            1,
            Identity {
                namespace: Some("shop".into()),
                pod: Some("web-1".into()),
                container: Some("app".into()),
                ..Identity::default()
            },
        )]);
        let limits = HashMap::from([(
            1,
            Limits {
                cpu_quota_cores: Some(1.5),
                ancestor_quota: Some(crate::identity::limits::AncestorQuota {
                    cores: 1.0,
                    cgroup: "/kubepods/burstable".into(),
                }),
                cpuset_cpus: Some(vec![0, 1]),
                threads: Some(12),
                exclusive_cpus: Some(vec![0, 1]),
                counters: crate::identity::limits::CpuCounters {
                    throttled_periods: Some(3),
                    throttled_seconds: Some(0.25),
                    ..Default::default()
                },
            },
        )]);
        let tick = Tick {
            window: &window,
            paths: &paths,
            identities: &identities,
            limits: &limits,
            now: std::time::Instant::now(),
        };
        e.cgroups.apply(&tick, |_| true);
        e.findings = vec![ActiveFinding {
            kind: "lock_storm",
            severity: "critical",
            cgroup: "/kubepods/pod\"x\\y".into(),
            labels: Labels {
                namespace: "shop".into(),
                pod: "web-1".into(),
                container: "app".into(),
            },
            call_sites: vec![
                ("waiter", "`Cache.get` via `ReentrantLock.lock`".into()),
                ("waker", "`Cache.get` via `ReentrantLock.unlock`".into()),
            ],
            call_site_share: 0.75,
        }];
        Arc::new(Mutex::new(e))
    }

    /// A Go storm and the runtime sizing of the same program name the same sites: the
    /// exposition has them once (a repeated series is invalid), the storm's.
    #[test]
    fn a_findings_named_lock_pair_is_its_call_sites() {
        use crate::diagnose::{Finding, Kind, LockPair, Severity};
        let mut f = Finding::new(
            Kind::LockStorm,
            Severity::Critical,
            (1, "/a".into()),
            String::new(),
            Default::default(),
            Vec::new(),
        );
        assert!(ActiveFinding::new(&f, None).call_sites.is_empty());
        f.name_lock_pair(LockPair {
            waiter: "`w`".into(),
            waker: "`k`".into(),
            share: 0.6,
        });
        let active = ActiveFinding::new(&f, None);
        assert_eq!(
            active.call_sites,
            vec![("waiter", "`w`".to_owned()), ("waker", "`k`".to_owned())]
        );
        assert_eq!(active.call_site_share, 0.6);
        assert_eq!(f.context["waiter_site"], "`w`");
        assert_eq!(f.evidence["top_pair_share"], 0.6);
    }

    #[test]
    fn a_containers_call_sites_are_one_series_per_role() {
        let e = exporter();
        {
            let mut g = e.lock().unwrap();
            let mut sizing = g.findings[0].clone();
            sizing.kind = "runtime_sizing";
            sizing.severity = "warning";
            sizing.call_site_share = 0.5;
            g.findings.push(sizing);
        }
        let out = Renderer::new(Arc::clone(&e)).openmetrics();
        let sites: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("stormwatch_lock_storm_call_site{"))
            .collect();
        assert_eq!(sites.len(), 2, "{sites:?}");
        assert!(sites.iter().all(|l| l.ends_with(" 0.75")), "{sites:?}");
        // Without the storm, the runtime sizing names them.
        e.lock().unwrap().findings.remove(0);
        let out = Renderer::new(e).openmetrics();
        let sites = out
            .lines()
            .filter(|l| l.starts_with("stormwatch_lock_storm_call_site{"))
            .count();
        assert_eq!(sites, 2);
    }

    #[test]
    fn the_histograms_switch() {
        let e = exporter();
        let on = Renderer::new(Arc::clone(&e)).openmetrics();
        let runq = "stormwatch_runqueue_latency_seconds_bucket{le=";
        let futex = "stormwatch_futex_wait_duration_seconds";
        // Two cgroups with run-queue figures, eight buckets each; one with futex figures.
        assert_eq!(on.matches(runq).count(), 16, "{on}");
        assert_eq!(on.matches(&format!("{futex}_bucket{{")).count(), 8);
        assert!(on.contains("stormwatch_runqueue_latency_seconds_bucket{le=\"0.016777215\""));

        e.lock().unwrap().histograms = false;
        let off = Renderer::new(Arc::clone(&e)).openmetrics();
        assert!(!off.contains(futex), "{off}");
        let buckets: Vec<&str> = off.lines().filter(|l| l.starts_with(runq)).collect();
        assert_eq!(buckets.len(), 2, "only +Inf per cgroup: {buckets:?}");
        assert!(
            buckets
                .iter()
                .all(|l| l.starts_with(&format!("{runq}\"+Inf\"")))
        );
        // The mean stays computable, and the counters of futex waits stay.
        for kept in [
            "stormwatch_runqueue_latency_seconds_sum{",
            "stormwatch_runqueue_latency_seconds_count{namespace=\"shop\",pod=\"web-1\",\
             container=\"app\",cgroup=\"/kubepods/pod\\\"x\\\\y\"} 3",
            "stormwatch_futex_waits_total{namespace=\"shop\"",
            "stormwatch_futex_wait_seconds_total{namespace=\"shop\"",
        ] {
            assert!(off.contains(kept), "missing {kept:?} in:\n{off}");
        }
        let series = |t: &str| t.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(series(&on) - series(&off), 2 * 7 + 8 + 2, "{off}");
    }

    #[test]
    fn exposition_has_every_family_and_escapes_labels() {
        let r = Renderer::new(exporter());
        let text = r.openmetrics();
        assert!(text.ends_with("# EOF\n"), "{text}");
        let want = [
            "# TYPE stormwatch_context_switches counter",
            "stormwatch_context_switches_total{namespace=\"shop\",pod=\"web-1\",container=\"app\",\
             cgroup=\"/kubepods/pod\\\"x\\\\y\",type=\"voluntary\"} 7",
            "stormwatch_context_switches_total{namespace=\"\",pod=\"\",container=\"\",\
             cgroup=\"/system.slice/a.service\",type=\"involuntary\"} 0",
            "stormwatch_oncpu_seconds_total{namespace=\"shop\",pod=\"web-1\",container=\"app\",\
             cgroup=\"/kubepods/pod\\\"x\\\\y\"} 1.5",
            "# TYPE stormwatch_runqueue_latency_seconds histogram",
            "stormwatch_runqueue_latency_seconds_count{namespace=\"shop\",pod=\"web-1\",\
             container=\"app\",cgroup=\"/kubepods/pod\\\"x\\\\y\"} 3",
            "stormwatch_runqueue_latency_seconds_sum{namespace=\"shop\",pod=\"web-1\",\
             container=\"app\",cgroup=\"/kubepods/pod\\\"x\\\\y\"} 3.0000015",
            "stormwatch_runqueue_latency_seconds_bucket{le=\"+Inf\",namespace=\"shop\"",
            "stormwatch_futex_waits_total{namespace=\"shop\"",
            "stormwatch_futex_wait_duration_seconds_bucket{le=\"0.000016383\",namespace=\"shop\"",
            "stormwatch_kernel_lock_wait_seconds_total{namespace=\"shop\",pod=\"web-1\",\
             container=\"app\",cgroup=\"/kubepods/pod\\\"x\\\\y\",lock=\"mutex\"} 0.000008",
            "stormwatch_kernel_lock_waits_total{namespace=\"shop\",pod=\"web-1\",\
             container=\"app\",cgroup=\"/kubepods/pod\\\"x\\\\y\",lock=\"mutex\"} 4",
            "stormwatch_threads{namespace=\"shop\",pod=\"web-1\",container=\"app\",\
             cgroup=\"/kubepods/pod\\\"x\\\\y\"} 12",
            "stormwatch_cpu_quota_cores{namespace=\"shop\"",
            "stormwatch_cpuset_cpus{namespace=\"shop\",pod=\"web-1\",container=\"app\",\
             cgroup=\"/kubepods/pod\\\"x\\\\y\"} 2",
            "stormwatch_cpu_throttled_periods_total{namespace=\"shop\"",
            "stormwatch_cpu_throttled_seconds_total{namespace=\"shop\"",
            "stormwatch_findings{severity=\"critical\"} 1",
            "stormwatch_finding{kind=\"lock_storm\",severity=\"critical\",namespace=\"shop\"",
            "# TYPE stormwatch_build info",
            "stormwatch_build_info{version=\"",
            "stormwatch_probe_attached{tracepoint=\"sched:sched_switch\",kind=\"tp_btf\"} 1",
            "stormwatch_probe_attached{tracepoint=\"lock:contention_begin\",kind=\"\"} 0",
            "stormwatch_probe_attached{tracepoint=\"sched:sched_waking\",kind=\"\"} 0",
            "stormwatch_probe_on_demand{tracepoint=\"sched:sched_waking\"} 1",
            "stormwatch_bpf_program_runs_total{program=\"sched_switch\"} 10",
            "stormwatch_bpf_program_run_seconds_total{program=\"sched_switch\"} 0.000002",
            "stormwatch_lost_events_total{reason=\"map_full\"} 3",
            "stormwatch_jvm_thread_dumps_total{result=\"taken\"} 0",
            "stormwatch_jvm_thread_dumps_total{result=\"failed\"} 0",
            "stormwatch_collection_errors_total 0",
            "stormwatch_collection_duration_seconds_count 0",
            "stormwatch_cgroups_tracked 2",
            "stormwatch_cgroups_dropped_total 0",
        ];
        for w in want {
            assert!(text.contains(w), "missing {w:?} in:\n{text}");
        }
        // Futex figures only for cgroups that had futex events; lock kinds only when contended.
        assert!(!text.contains("stormwatch_futex_waits_total{namespace=\"\""));
        assert!(!text.contains("lock=\"spin\""));
        // Every family has help text.
        let types = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
        let helps = text.lines().filter(|l| l.starts_with("# HELP ")).count();
        assert_eq!(types, helps);
        for l in text.lines().filter(|l| l.starts_with("# HELP ")) {
            assert!(l.split(' ').count() > 3, "help text: {l}");
        }
    }

    #[test]
    fn the_host_series() {
        let e = exporter();
        let text = Renderer::new(Arc::clone(&e)).openmetrics();
        assert!(
            !text.contains("stormwatch_host"),
            "nothing before the host is read"
        );
        {
            let mut e = e.lock().unwrap();
            e.host = Some(crate::host::Host {
                cpus: 56,
                hypervisor: Some("kvm".into()),
                numa_nodes: Some(2),
                kernel: "6.18.0-1-amd64".into(),
            });
            e.host_steal_seconds = Some(12.34);
        }
        let text = Renderer::new(Arc::clone(&e)).openmetrics();
        for want in [
            "# TYPE stormwatch_host info",
            "stormwatch_host_info{hypervisor=\"kvm\",kernel=\"6.18.0-1-amd64\"} 1",
            "stormwatch_host_cpus 56",
            "stormwatch_host_numa_nodes 2",
            "# TYPE stormwatch_host_steal_seconds counter",
            "stormwatch_host_steal_seconds_total 12.34",
        ] {
            assert!(text.contains(want), "missing {want:?} in:\n{text}");
        }
        let classic = classic::from_openmetrics(&text);
        assert!(classic.contains("# TYPE stormwatch_host_info gauge"));
        assert!(classic.contains("# TYPE stormwatch_host_steal_seconds_total counter"));
        {
            let mut e = e.lock().unwrap();
            e.host.as_mut().unwrap().hypervisor = None;
            e.host.as_mut().unwrap().numa_nodes = None;
        }
        let text = Renderer::new(e).openmetrics();
        assert!(text.contains("stormwatch_host_info{hypervisor=\"none\","));
        assert!(!text.contains("stormwatch_host_numa_nodes"));
    }

    /// Every family the exporter writes, on a fixed state with every figure (cgroups, findings,
    /// the host, the network, the agent's own): the exposition, in both formats, is compared
    /// byte for byte with the one kept in `testdata/` — a change of name, help, type, label or
    /// value anywhere shows. The agent's process figures (read from /proc at each rendering)
    /// are left out. `STORMWATCH_BLESS=1` rewrites the files after an intended change.
    #[test]
    fn the_exposition_is_the_golden_one() {
        use crate::export::network::{InterfaceInfo, Owner};
        use std::collections::HashSet;
        use stormwatch_common::net::{NetDropKey, NetDropStats, NetIfKey, NetIfStats, len_bucket};
        let e = exporter();
        {
            let mut e = e.lock().unwrap();
            e.host = Some(crate::host::Host {
                cpus: 56,
                hypervisor: Some("kvm".into()),
                numa_nodes: Some(2),
                kernel: "6.18.0-1-amd64".into(),
            });
            e.host_steal_seconds = Some(12.34);
            let pod = NetIfKey {
                netns: 7,
                ifindex: 2,
            };
            let mut s = NetIfStats::ZERO;
            s.tx.packets = 10;
            s.tx.bytes = 1000;
            s.tx.len[len_bucket::AT_MTU] = 4;
            s.tx.len[2] = 6;
            s.rx.packets = 3;
            s.mtu = 1450;
            let mut window = Window::empty();
            window.net_ifaces.insert(pod, s);
            window.net_drops.insert(
                NetDropKey {
                    netns: 7,
                    ifindex: 2,
                    reason: 2,
                    _pad: 0,
                },
                NetDropStats { packets: 6 },
            );
            let owner = Owner {
                cgroup: "/kubepods/pod1/c1".into(),
                labels: Labels {
                    namespace: "shop".into(),
                    pod: "web-1".into(),
                    container: "app".into(),
                },
            };
            e.network
                .apply(&window, &HashSet::from([pod]), HashMap::from([(7, owner)]));
            e.network.inventory.insert(
                pod,
                InterfaceInfo {
                    name: "eth0".into(),
                    kind: "vxlan".into(),
                    mtu: 1450,
                    encapsulation_overhead: Some(50),
                    underlay_path_mtu: Some(1500),
                },
            );
        }
        let om = Renderer::new(e).openmetrics();
        let keep = |t: &str| {
            t.lines()
                .filter(|l| !l.contains("process_"))
                .map(|l| format!("{l}\n"))
                .collect::<String>()
        };
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/export/testdata");
        for (file, text) in [
            ("metrics.openmetrics.golden", keep(&om)),
            (
                "metrics.classic.golden",
                keep(&classic::from_openmetrics(&om)),
            ),
        ] {
            let path = dir.join(file);
            if std::env::var_os("STORMWATCH_BLESS").is_some() {
                std::fs::write(&path, &text).unwrap();
            }
            let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
                panic!("{}: {e} (STORMWATCH_BLESS=1 writes it)", path.display())
            });
            if text != want {
                let first = text
                    .lines()
                    .zip(want.lines())
                    .position(|(a, b)| a != b)
                    .unwrap_or(text.lines().count().min(want.lines().count()));
                panic!(
                    "{file} differs from the exposition at line {}: got {:?}, want {:?}",
                    first + 1,
                    text.lines().nth(first),
                    want.lines().nth(first)
                );
            }
        }
    }

    #[test]
    fn missing_probes_mean_missing_families_not_zeros() {
        let e = exporter();
        e.lock().unwrap().avail = Availability {
            switch: true,
            ..Availability::default()
        };
        let text = Renderer::new(e).openmetrics();
        assert!(text.contains("stormwatch_context_switches_total"));
        assert!(!text.contains("stormwatch_runqueue_latency_seconds"));
        assert!(!text.contains("stormwatch_wakeups"));
        assert!(!text.contains("stormwatch_futex"));
        assert!(!text.contains("stormwatch_kernel_lock"));
    }
}
