//! One engine for every front end: collection (the pipeline's window of each tick) → judgement
//! (the diagnosis session over its window) → what the window asks of the on-demand probes.
//! `trace`, `diagnose` and `run` are arguments → [`Engine`] → their output (a table or a JSON
//! document, a report, `/metrics`): they differ in the window they judge (one interval, the
//! whole run, a sliding span), how long they run ([`Clock`], or the daemon's loop) and what
//! they print or serve, not in how a tick is taken or judged.

use std::time::{Duration, Instant};

use crate::{
    collect::{NetAvailability, Window},
    diagnose::{
        Kind, Thresholds, host_cpus,
        session::{
            FutexWatch, Judgement, NetworkOptions, Session, SessionOptions, cgroupfs_reader,
        },
    },
    identity::{CgroupResolver, cpumanager},
    memory::CacheSize,
    netinfo::inventory::NetState,
    pipeline::Pipeline,
    probes::{
        LoadOptions, Tier,
        demand::{Asks, Change, Controller, Steered},
    },
};

/// What a front end asks of its engine.
pub struct EngineOptions {
    /// Which probes, and how they load.
    pub load: LoadOptions,
    /// The diagnosis window: sliding over this span (the daemon's diagnosis window, `trace`'s
    /// live table's one interval), or `None`: the whole run.
    pub span: Option<Duration>,
    /// How often the front end ticks.
    pub interval: Duration,
    pub thresholds: Thresholds,
    /// How often the per-packet probes, where on demand, attach for a survey (zero: never).
    pub packet_survey: Duration,
    /// Whether JVMs whose threads hand off through futexes are asked for thread dumps
    /// ([`crate::identity::jvm`]).
    pub jvm_thread_dumps: bool,
    /// Whether JVMs with virtual threads are read for their lock storms (opt-in:
    /// `SessionOptions::jvm_virtual_threads`).
    pub jvm_virtual_threads: bool,
}

/// The probes, the session judging their windows, and when the on-demand probes attach.
pub struct Engine {
    pub pipeline: Pipeline,
    pub session: Session,
    /// When each tier of on-demand probes is attached ([`crate::probes::demand`]); it steers
    /// nothing where every probe attached at load (`trace`, `diagnose`).
    tiers: Controller,
}

/// One tick: the interval's window, and whether the session completed a diagnosis step with
/// it (then [`Engine::judge`] has a new window to judge).
pub struct Ticked {
    pub window: Window,
    pub stepped: bool,
}

/// One judgement of the session's window, with the network state it read for it.
pub struct Judged {
    /// The namespaces' links, routes and seen interfaces (where the network rules run).
    pub net: Option<NetState>,
    pub judgement: Judgement,
}

impl Judged {
    /// What the judgement asks of the on-demand probes.
    pub fn asks(&self) -> Asks {
        Asks {
            storm: self
                .judgement
                .findings
                .iter()
                .any(|f| f.kind == Kind::LockStorm),
            storm_candidate: self.judgement.storm_candidate,
            packets_did_not_fit: self.judgement.packets_did_not_fit,
            runqueue_wait: self
                .judgement
                .findings
                .iter()
                .any(|f| f.kind == Kind::RunqueueSaturation),
        }
    }
}

impl Engine {
    /// Loads and attaches the probes (the cgroups of `resolver` walked first: the session
    /// reads their counters as its baseline) and starts the session over them. `adjust`: a
    /// front end's own changes to the session's options (`trace`'s live table keeps no
    /// namespace counters).
    pub fn start(
        resolver: CgroupResolver,
        options: EngineOptions,
        adjust: impl FnOnce(&mut SessionOptions),
    ) -> anyhow::Result<Self> {
        let mut pipeline = Pipeline::start(&options.load, resolver)?;
        let mut session_options = session_options(
            &pipeline,
            options.span,
            options.interval,
            options.thresholds,
            options.jvm_thread_dumps,
            options.jvm_virtual_threads,
        );
        adjust(&mut session_options);
        let mut session = Session::new(
            session_options,
            cgroupfs_reader(),
            pipeline.resolver.known(),
        );
        // Futex probes on demand are detached now: the session knows their figures are not
        // watched until they attach (`steer`).
        if pipeline.probes.on_demand(Tier::Futex) {
            session.set_futex_watch(FutexWatch::Off);
        }
        watch_go_cpu(&mut pipeline, &session);
        let tiers = Controller::new(
            &pipeline.probes,
            options.span.unwrap_or(options.interval),
            options.packet_survey,
        );
        Ok(Self {
            pipeline,
            session,
            tiers,
        })
    }

    /// Probes attached, of those tried.
    pub fn probes_attached(&self) -> (usize, usize) {
        let status = &self.pipeline.probes.status;
        (status.iter().filter(|s| s.attached()).count(), status.len())
    }

    /// Reads this interval's window and adds it to the session, at the instant it was read.
    pub fn tick(&mut self) -> anyhow::Result<Ticked> {
        let window = self.pipeline.tick()?;
        let resolver = &self.pipeline.resolver;
        let stepped = self
            .session
            .observe(&window, |id| resolver.path(id), Instant::now());
        watch_go_cpu(&mut self.pipeline, &self.session);
        Ok(Ticked { window, stepped })
    }

    /// Judges the session's window: every rule, the network's where its probes are loaded.
    pub fn judge(&self) -> Judged {
        let net = self.session.network(&self.pipeline.seen_interfaces());
        let judgement = self.session.judgement(self.pipeline.paths(), net.as_ref());
        Judged { net, judgement }
    }

    /// Attaches or detaches the on-demand tiers as a judgement `asks`, and tells the session
    /// when the futex probes started or stopped watching. Returns what changed.
    pub fn steer(&mut self, asks: Asks, now: Instant) -> Vec<Change> {
        let changes = self.tiers.judged(&mut self.pipeline.probes, asks, now);
        for change in &changes {
            if change.tier == Tier::Futex {
                self.session.set_futex_watch(match change.steered {
                    Steered::Attached => FutexWatch::Since(now),
                    Steered::Detached | Steered::Abandoned => FutexWatch::Off,
                });
            }
        }
        changes
    }

    /// Forgets what is gone. A sliding session forgets removed cgroups (a whole-run one keeps
    /// them: its window holds them to the end); names are kept while the session holds their
    /// cgroup, or while the caller's output still needs them (`keep_cgroup`, `keep_process`).
    pub fn forget(
        &mut self,
        keep_cgroup: impl Fn(u64) -> bool,
        keep_process: impl Fn(u32) -> bool,
    ) {
        if self.session.options().span.is_some() {
            let resolver = &self.pipeline.resolver;
            self.session.forget(|id| resolver.path(id).is_some());
        }
        let session = &self.session;
        self.pipeline
            .forget_names(|id| session.contains(id) || keep_cgroup(id), keep_process);
    }

    /// What the caches hold now: the pipeline's and the session's.
    pub fn cache_sizes(&self) -> Vec<CacheSize> {
        let mut sizes = self.pipeline.cache_sizes();
        sizes.extend(self.session.cache_sizes());
        sizes
    }
}

/// The diagnosis session's options for a pipeline: the network rules when its probes are
/// loaded. `span`: the sliding window (`None`: the whole run).
fn session_options(
    pipeline: &Pipeline,
    span: Option<Duration>,
    interval: Duration,
    thresholds: Thresholds,
    jvm_thread_dumps: bool,
    jvm_virtual_threads: bool,
) -> SessionOptions {
    let avail = pipeline.availability().net;
    let with_net = avail != NetAvailability::default();
    SessionOptions {
        span,
        interval,
        thresholds,
        jvm_thread_dumps,
        jvm_virtual_threads,
        host_cpus: host_cpus(),
        cpu_manager_state: [cpumanager::DEFAULT_STATE_FILE, cpumanager::HOST_STATE_FILE]
            .map(std::path::PathBuf::from)
            .to_vec(),
        // Pressure over the window is a figure of trace's document; the daemon exports none,
        // so it does not read `cpu.pressure` at every step of every active cgroup.
        window_pressure: span.is_none(),
        network: with_net.then(|| NetworkOptions {
            avail,
            v2_root: pipeline.resolver.root().to_path_buf(),
            host_netns: pipeline.host_netns,
            // A sliding window is the daemon's: it re-reads the inventory at every step.
            inventory_max_age: if span.is_some() {
                INVENTORY_MAX_AGE
            } else {
                Duration::ZERO
            },
        }),
    }
}

/// How long the daemon reuses the namespaces' links and routes while no namespace comes or goes:
/// an MTU changed by hand shows in the inventory within a minute (the probes' per-packet MTU at
/// once).
const INVENTORY_MAX_AGE: Duration = Duration::from_secs(60);

/// The clock of a front end that runs for a duration or until Ctrl-C (`trace`, `diagnose`): a
/// tick every interval from the probes' start, the last at the deadline or at Ctrl-C.
pub struct Clock {
    next: tokio::time::Instant,
    interval: Duration,
    deadline: Option<tokio::time::Instant>,
    ctrl_c: std::pin::Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>>,
}

impl Clock {
    /// Ticks every `interval` from `started`, for `duration` (`None`: until Ctrl-C).
    pub fn new(started: Instant, interval: Duration, duration: Option<Duration>) -> Self {
        let started = tokio::time::Instant::from_std(started);
        Self {
            next: started + interval,
            interval,
            deadline: duration.map(|d| started + d),
            ctrl_c: Box::pin(tokio::signal::ctrl_c()),
        }
    }

    /// Waits for the next tick, or the deadline, or Ctrl-C; returns whether it was Ctrl-C.
    pub async fn wait(&mut self) -> bool {
        let wake = self.deadline.map_or(self.next, |d| self.next.min(d));
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => false,
            _ = &mut self.ctrl_c => true,
        }
    }

    /// After a tick: whether it was the last (Ctrl-C, or the deadline passed); if not, the
    /// next is an interval on.
    pub fn over(&mut self, interrupted: bool) -> bool {
        let over = interrupted
            || self
                .deadline
                .is_some_and(|d| tokio::time::Instant::now() >= d);
        if !over {
            self.next += self.interval;
        }
        over
    }
}

/// Tells the Go on-CPU sampler which processes to count: those whose runtime clocks the
/// session read at its last edge (a process seen first now is sampled from the next window).
fn watch_go_cpu(pipeline: &mut Pipeline, session: &Session) {
    let (ebpf, families) = pipeline.probes.families_mut();
    families.go_mutex.cpu.watch(ebpf, session.go_tgids());
}
