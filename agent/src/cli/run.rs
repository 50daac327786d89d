//! `stormwatch run`: the daemon. Keeps the probes attached and serves Prometheus metrics.
//!
//! Threads: the collection loop runs on the main thread (inside `block_on`), which owns the
//! pipeline and is the only one to touch BPF maps; one tokio worker thread serves HTTP. The
//! first scrape after a collection renders the exporter's state (under its lock, which the
//! collection holds only to update that state, not while it reads maps or diagnoses), so a slow
//! collection does not delay a scrape and a scrape never triggers a collection.
//!
//! Start-up order: configuration (bad input fails before anything else), the listening socket
//! (a taken port fails before the probes load), the HTTP server (`/readyz` answers 503 while
//! the probes load), then the probes. SIGTERM or SIGINT: `/readyz` turns 503, the server stops
//! accepting, the loop ends after the collection in progress, the pipeline is dropped (which
//! detaches the probes), exit 0; a watchdog makes sure this takes less than 2 s. SIGHUP is
//! logged and ignored.

use std::{
    collections::HashMap,
    os::fd::OwnedFd,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};

use crate::{
    config::{Config, Flags},
    engine::{Engine, EngineOptions, Ticked},
    export::{
        metrics::Renderer,
        network::Owner,
        server::{self, LockProfiles, Shared},
        state::{ActiveFinding, Exporter, Labels, ProgramStats, Tick},
        web::WebConfig,
    },
    identity::CgroupResolver,
    pipeline::Pipeline,
    privileges,
    probes::{LoadOptions, Tier},
};

use super::RunArgs;

/// How long, after the signal, requests in flight may take to finish.
const DRAIN_TIMEOUT: Duration = Duration::from_millis(500);
/// After a signal, the process exits by itself at the latest after this (plus what the kernel
/// takes to detach the probes as the process exits: about 0.5 s).
const EXIT_WATCHDOG: Duration = Duration::from_millis(1200);

pub fn run(args: RunArgs) -> anyhow::Result<u8> {
    let flags = Flags {
        listen: args.listen,
        interval: args.interval,
        config: args.config.clone(),
        web_config_file: args.web_config_file.clone(),
        btf_file: args.btf.clone(),
    };
    let config = Config::load(&flags, |name| std::env::var(name).ok())?;
    // Before anything starts: a web config that does not load is one line and exit 1.
    let web = Arc::new(match &config.web_config_file {
        Some(path) => WebConfig::load(path)?,
        None => WebConfig::none(),
    });
    // Every file the configuration names is read now: a BTF that does not load is one line
    // and exit 1 here, not after the HTTP server has started.
    if let Some(path) = &config.btf_file {
        crate::probes::read_btf(path).map_err(|e| anyhow::anyhow!("btf_file: {e}"))?;
    }
    let map_memory = MapMemory::of(config.max_cgroups);
    if let Some(warning) = map_memory.warning() {
        log::warn!("{warning}");
    }
    if args.check_config {
        println!(
            "# stormwatch run: effective configuration (flags > environment > file > defaults)"
        );
        println!("# {}", map_memory.describe());
        print!("{}", config.to_toml());
        return Ok(0);
    }
    crate::memory::one_arena();
    // One worker for HTTP; the collection loop runs on this thread in `block_on`.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("stormwatch-http")
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let result = runtime.block_on(daemon(config, web));
    // Do not wait for idle keep-alive connections of scrapers.
    runtime.shutdown_timeout(Duration::from_millis(100));
    result
}

/// What `max_cgroups` costs in kernel memory on this node: the probes' preallocated per-CPU
/// maps grow with it past their fit in the budget, on every possible CPU.
struct MapMemory {
    max_cgroups: usize,
    cpus: u32,
    bytes: u64,
    default_bytes: u64,
}

impl MapMemory {
    fn of(max_cgroups: usize) -> Self {
        let cpus = aya::util::nr_cpus().map_or(1, |n| n.get()) as u32;
        Self {
            max_cgroups,
            cpus,
            bytes: crate::probes::sizing::preallocated_bytes(cpus, max_cgroups),
            default_bytes: crate::probes::sizing::preallocated_bytes(
                cpus,
                crate::config::DEFAULT_MAX_CGROUPS,
            ),
        }
    }

    fn describe(&self) -> String {
        format!(
            "max_cgroups = {} preallocates {:.1} MiB of kernel memory for the probes' per-CPU \
             maps on this node's {} possible CPUs ({:.1} MiB at the default {})",
            self.max_cgroups,
            self.bytes as f64 / f64::from(1 << 20),
            self.cpus,
            self.default_bytes as f64 / f64::from(1 << 20),
            crate::config::DEFAULT_MAX_CGROUPS,
        )
    }

    /// Said when `max_cgroups` costs more than the default does.
    fn warning(&self) -> Option<String> {
        (self.bytes > self.default_bytes).then(|| self.describe())
    }
}

async fn daemon(config: Config, web: Arc<WebConfig>) -> anyhow::Result<u8> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener.local_addr().unwrap_or(config.listen);
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sighup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;

    let interval = Duration::from_secs_f64(config.interval_seconds);
    let mut exporter = Exporter::new(
        config.max_cgroups,
        Duration::from_secs_f64(config.removed_grace_seconds),
    );
    exporter.histograms = config.histograms;
    let shed = Arc::clone(&exporter.http_shed);
    let exporter = Arc::new(Mutex::new(exporter));
    let renderer = Renderer::new(Arc::clone(&exporter));
    let shared = Arc::new(Shared::new(interval, move || renderer.render()));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let scheme = if web.tls() { "https" } else { "http" };
    let server = tokio::spawn(server::serve(
        listener,
        Arc::clone(&shared),
        web,
        config.http_limits(),
        shed,
        async {
            let _ = stop_rx.await;
        },
    ));

    // Signals are handled on the HTTP worker, so that they are seen at once even while this
    // thread is busy (attaching, or a long collection): stop serving, tell the loop, and make
    // sure the process is gone within 2 s.
    let (stopping_tx, mut stopping) = tokio::sync::watch::channel(false);
    let on_signal = Arc::clone(&shared);
    tokio::spawn(async move {
        // SIGHUP (a config reload elsewhere, or a closed terminal) does not stop the daemon.
        let name = loop {
            tokio::select! {
                _ = sigterm.recv() => break "SIGTERM",
                _ = sigint.recv() => break "SIGINT",
                _ = sighup.recv() => log::warn!(
                    "SIGHUP: ignored; the configuration is read at start (restart the agent to \
                     apply a change), the web config file whenever it changes"
                ),
            }
        };
        log::info!("{name}: stopping");
        on_signal.set_ready(false);
        let _ = stop_tx.send(());
        let _ = stopping_tx.send(true);
        tokio::time::sleep(EXIT_WATCHDOG).await;
        // The loop is still in a collection, or detaching takes long: exiting closes every
        // descriptor, which detaches the probes all the same.
        log::warn!("still stopping {EXIT_WATCHDOG:?} after {name}: exiting now");
        std::process::exit(0);
    });

    // Before this process loads its own probes, which would count as one.
    let others = crate::probes::neighbours::OtherAgents::find();
    if others.any() {
        log::warn!(
            "another stormwatch agent is attached on this node: {}",
            others.describe()
        );
    }
    // Loading and attaching blocks this thread for a moment; the worker keeps serving.
    let mut daemon = match Daemon::start(&config, Arc::clone(&exporter), Arc::clone(&shared)) {
        Ok(d) => d,
        Err(err) => {
            server.abort();
            return Err(err);
        }
    };
    shared.publish();
    // (Unless a signal came while attaching: then the loop below ends at once.)
    shared.set_ready(!*stopping.borrow());
    // The loop starts now: /healthz counts from here, whatever the interval.
    shared.ran();
    let (attached, total) = daemon.engine.probes_attached();
    let probes = &daemon.engine.pipeline.probes;
    let tiers: Vec<&str> = Tier::ALL
        .into_iter()
        .filter(|tier| probes.on_demand(*tier))
        .map(Tier::name)
        .collect();
    let on_demand = match tiers.as_slice() {
        [] => String::new(),
        [one] => format!(", the {one} probes on demand"),
        [init @ .., last] => format!(", the {} and {last} probes on demand", init.join(", ")),
    };
    eprintln!(
        "stormwatch: serving {scheme}://{addr}/metrics, collecting every {:.1}s \
         ({attached}/{total} probes attached{on_demand})",
        interval.as_secs_f64()
    );

    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stopping.wait_for(|stop| *stop) => break,
            _ = ticker.tick() => {}
        }
        daemon.collect();
        // A signal that came during the collection: stop now rather than render first.
        if *stopping.borrow() {
            break;
        }
        shared.publish();
        shared.ran();
    }
    let detaching = Instant::now();
    // Detaching waits for an RCU grace period per classic tracepoint (serialized in the
    // kernel): about 50 ms each here, 0.3-0.6 s in all. The server drains meanwhile.
    drop(daemon);
    log::debug!("probes detached in {:?}", detaching.elapsed());
    drain(server).await;
    Ok(0)
}

/// Waits (briefly) for the server to finish the requests in flight.
async fn drain(server: tokio::task::JoinHandle<std::io::Result<()>>) {
    match tokio::time::timeout(DRAIN_TIMEOUT, server).await {
        Ok(Ok(Err(err))) => log::warn!("HTTP server: {err}"),
        Ok(_) => {}
        Err(_) => log::debug!("requests still in flight after {DRAIN_TIMEOUT:?}: dropped"),
    }
}

/// The collection side: the engine and what the endpoint is given.
struct Daemon {
    /// The probes and the diagnosis over a sliding window: the same engine as `diagnose`'s.
    engine: Engine,
    exporter: Arc<Mutex<Exporter>>,
    /// Keeps the kernel's BPF run-time statistics on while the daemon runs.
    _bpf_stats: Option<OwnedFd>,
    /// What the endpoint serves besides the metrics: the lock profiles.
    shared: Arc<Shared>,
}

impl Daemon {
    fn start(
        config: &Config,
        exporter: Arc<Mutex<Exporter>>,
        shared: Arc<Shared>,
    ) -> anyhow::Result<Self> {
        privileges::require()?;
        let resolver = CgroupResolver::discover()?;
        let options = EngineOptions {
            load: LoadOptions {
                max_cgroups: config.max_cgroups,
                wake_kinds: config.wake_kinds,
                futex: config.futex_probes,
                net_packets: config.net_packet_probes,
                runq_blame: Some(config.runqueue_blame),
                btf_file: config.btf_file.clone(),
                call_sites: config.call_sites,
                call_site_lines: false,
                postgres_lock_waits: config.postgres_lock_waits,
                ..LoadOptions::default()
            },
            span: Some(Duration::from_secs_f64(config.diagnosis_window_seconds)),
            interval: Duration::from_secs_f64(config.interval_seconds),
            thresholds: config.thresholds.clone(),
            packet_survey: Duration::from_secs_f64(config.net_packet_survey_seconds.max(0.0)),
            jvm_thread_dumps: config.jvm_thread_dumps,
            jvm_virtual_threads: config.jvm_virtual_threads,
        };
        let engine = Engine::start(resolver, options, |_| {})?;
        let pipeline = &engine.pipeline;
        let bpf_stats = if config.bpf_stats {
            match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
                Ok(fd) => Some(fd),
                Err(err) => {
                    log::warn!(
                        "BPF run-time statistics not enabled ({err}; BPF_ENABLE_STATS needs \
                         CAP_SYS_ADMIN): the program run counters move only if the host sets \
                         kernel.bpf_stats_enabled=1"
                    );
                    None
                }
            }
        } else {
            None
        };
        {
            let mut e = exporter.lock().unwrap_or_else(PoisonError::into_inner);
            e.avail = pipeline.availability();
            e.probes = pipeline.probes.status.clone();
            e.lost_events = pipeline.probes.probe_errors();
            e.programs = pipeline.probes.program_stats();
            e.bpf_stats_enabled = bpf_stats.is_some() || sysctl_bpf_stats();
            e.host_steal_seconds = crate::host::steal_seconds_since_boot();
        }
        {
            let mut e = exporter.lock().unwrap_or_else(PoisonError::into_inner);
            // The host as the session read it: /metrics and the rules describe the same host.
            e.host = Some(engine.session.host().clone());
            // The MTU inventory from the start (then re-read with each diagnosis step), of the
            // namespaces the session's first step just found (the session has the network
            // rules exactly when network probes are attached).
            if let Some(walk) = engine.session.current_walk() {
                e.network
                    .set_inventory(&crate::netinfo::inventory::collect(walk));
            }
        }
        Ok(Self {
            engine,
            exporter,
            _bpf_stats: bpf_stats,
            shared,
        })
    }

    /// One collection. Never fails: a failed map read is counted and logged, and the next
    /// window covers the gap.
    fn collect(&mut self) {
        let started = Instant::now();
        let ticked = self.engine.tick();
        // What the self-metrics show, read before taking the exporter's lock.
        let probes = &self.engine.pipeline.probes;
        let own = OwnFigures {
            lost_events: probes.probe_errors(),
            programs: probes.program_stats(),
            bpf_stats_enabled: self._bpf_stats.is_some() || sysctl_bpf_stats(),
            host_steal_seconds: crate::host::steal_seconds_since_boot(),
        };
        let exporter = Arc::clone(&self.exporter);
        // What this collection's judgement asks of the on-demand probes (None: nothing judged).
        let mut asks = None;
        match ticked {
            Ok(Ticked { window, stepped }) => {
                let engine = &self.engine;
                let p = &engine.pipeline;
                // The diagnosis first, without the exporter's lock: a scrape renders under it,
                // and waits only while the exporter's state is updated.
                let alive = |id: u64| p.resolver.path(id).is_some();
                let limits = engine.session.latest_limits(window.cgroups.keys());
                let ctx = crate::report::ReportContext::of(p, &limits);
                let judged = stepped.then(|| {
                    let judged = engine.judge();
                    let profiles = lock_profiles(&judged.judgement, p.paths(), ctx.identities);
                    (judged, profiles)
                });
                let mut e = exporter.lock().unwrap_or_else(PoisonError::into_inner);
                e.cgroups.apply(
                    &Tick {
                        window: &window,
                        paths: p.paths(),
                        identities: ctx.identities,
                        limits: &limits,
                        now: started,
                    },
                    alive,
                );
                update_network(p, &mut e, &window, ctx.identities);
                if let Some((judged, profiles)) = judged {
                    self.shared.set_profiles(profiles);
                    asks = Some(judged.asks());
                    // The inventory the diagnosis reads is the one the MTU gauges show.
                    if let Some(state) = &judged.net {
                        e.network.set_inventory(&state.namespaces);
                    }
                    e.findings = judged
                        .judgement
                        .findings
                        .iter()
                        .map(|f| ActiveFinding::new(f, ctx.identities.get(&f.cgroup_id)))
                        .collect();
                }
                // Names of removed cgroups are needed only while the diagnosis window has them
                // (the exported series keep their own copy).
                self.engine.forget(|_| false, |_| false);
                // What the caches hold now, past this collection's forgetting.
                e.caches = self.engine.cache_sizes();
                e.jvm_thread_dumps = self.engine.session.jvm_dumps();
                own.set(&mut e, started);
            }
            Err(err) => {
                let mut e = exporter.lock().unwrap_or_else(PoisonError::into_inner);
                e.collection_errors += 1;
                log::warn!("collection failed: {err:#}");
                own.set(&mut e, started);
            }
        }
        if let Some(asks) = asks {
            let changes = self.engine.steer(asks, Instant::now());
            for change in &changes {
                if let Some(line) = change.message() {
                    log::info!("{line}");
                }
            }
            if !changes.is_empty() {
                // Show it (`stormwatch_probe_attached`).
                let mut e = self.exporter.lock().unwrap_or_else(PoisonError::into_inner);
                e.avail = self.engine.pipeline.availability();
                e.probes = self.engine.pipeline.probes.status.clone();
            }
        }
    }
}

/// The daemon's own figures of one collection.
struct OwnFigures {
    lost_events: Vec<(&'static str, u64)>,
    programs: Vec<ProgramStats>,
    bpf_stats_enabled: bool,
    host_steal_seconds: Option<f64>,
}

impl OwnFigures {
    /// Sets them, with the collection's duration (from `started`).
    fn set(self, e: &mut Exporter, started: Instant) {
        e.lost_events = self.lost_events;
        e.programs = self.programs;
        e.bpf_stats_enabled = self.bpf_stats_enabled;
        e.host_steal_seconds = self.host_steal_seconds;
        e.collection_duration.observe(started.elapsed());
        e.last_collection_unix_seconds = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .ok()
            .map(|d| d.as_secs_f64());
    }
}

/// The lock profiles of a judged window, named as the reports name the containers.
fn lock_profiles(
    j: &crate::diagnose::session::Judgement,
    paths: &std::collections::HashMap<u64, String>,
    identities: &std::collections::HashMap<u64, crate::identity::workload::Identity>,
) -> LockProfiles {
    let Some(end) = j.window_end else {
        return LockProfiles::default();
    };
    let mut containers: Vec<(u64, String)> = j
        .lock_stacks
        .keys()
        .map(|&id| {
            let name = identities
                .get(&id)
                .and_then(|i| i.workload_name())
                .or_else(|| paths.get(&id).cloned())
                .unwrap_or_else(|| format!("(removed cgroup {id})"));
            (id, name)
        })
        .collect();
    containers.sort();
    LockProfiles::new(
        end,
        crate::report::pprof::encode_all(
            &containers,
            |id| j.lock_stacks.get(&id).cloned(),
            end,
            j.window_duration,
        ),
    )
}

/// The network series: interface and drop totals, and each namespace's owner.
fn update_network(
    p: &Pipeline,
    e: &mut Exporter,
    window: &crate::collect::Window,
    identities: &HashMap<u64, crate::identity::workload::Identity>,
) {
    if !p.availability().net.any() {
        return;
    }
    let (owners, live) = p.probes.network_keys();
    let owners = owners
        .into_iter()
        .filter_map(|(netns, id)| {
            let cgroup = p.paths().get(&id)?.clone();
            let labels = Labels::of(identities.get(&id));
            Some((netns, Owner { cgroup, labels }))
        })
        .collect();
    e.network.apply(window, &live, owners);
}

/// Whether the host turned BPF statistics on for everyone (`kernel.bpf_stats_enabled`).
fn sysctl_bpf_stats() -> bool {
    crate::files::kernel_text("/proc/sys/kernel/bpf_stats_enabled").is_some_and(|v| v.trim() == "1")
}
