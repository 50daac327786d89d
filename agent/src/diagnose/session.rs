//! The diagnosis session: the one engine that `trace`, `diagnose` and `run` all drive.
//!
//! It keeps, for the window the rules judge, each cgroup's figures and the resource context
//! sampled *over that window*: threads (a time-weighted mean of the counts read while the cgroup
//! was active), throttling relative to the window's start, quota and cpuset as last read. The
//! front ends only feed it ticks ([`Session::observe`]) and ask for findings
//! ([`Session::judgement`]) or for the context of a window ([`Session::window_limits`]); none of
//! them computes a rule's input on its own, so the CLI and the daemon cannot disagree.
//!
//! The window is either everything since the session started (`trace`, `diagnose`) or a sliding
//! span (`run`): ticks are gathered into steps, and the window is the last steps that cover the
//! span. The daemon judges each time a step completes, so a condition that starts after any
//! length of calm fills the window within one span and is flagged at the next step.
//!
//! Reading a cgroup's resource context costs file reads, so it is not done every tick for every
//! cgroup: the full limits (five files, `cpu.stat` among them) on a refresh period, the thread
//! count (one small file) when the cgroup's activity changes — it becomes active again, or its
//! switch and futex rates move by more than [`ACTIVITY_CHANGE_FACTOR`] from when the count was
//! last read — and at least every [`THREADS_MAX_AGE`]. A storm that starts in a calm container
//! multiplies its switch rate, so its thread count is re-read in the tick it starts.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    time::{Duration, Instant, SystemTime},
};

use stormwatch_common::net::NetIfKey;

use crate::{
    collect::{CgroupWindow, Window},
    host::{CpuTicks, Host, Steal, read_cpu_ticks, ticks_per_second},
    identity::{
        container::parse_cgroup_path,
        cpumanager::CpuManagerState,
        goclock::{GoClocks, GoEdge},
        jvm::{Census, DUMPS_PER_WINDOW, ThreadDumps},
        limits::{CpuCounters, Limits},
        runtime::RuntimeCache,
    },
    netinfo::{
        NetState, NetWatch,
        inventory::{InventoryCache, SeenInterface},
        namespaces::NetnsRef,
    },
};

use super::{
    Facts, FactsContext, Finding, GoMutexWait, HostFacts, VirtualThreadWaits, diagnose,
    judge_network,
    network::{net_facts, packets_did_not_fit},
    sort_findings,
};

/// The fewest woken waits a second, of a JVM's threads that wait and wake, for it to be
/// asked for thread dumps: the storm rule's least hand-off rate (100 a second per CPU), on one
/// CPU.
const JVM_DUMP_MIN_HANDOFFS_PER_SECOND: f64 = 100.0;

pub struct Session {
    options: SessionOptions,
    /// `None` when the cgroup hierarchy is unknown: then no resource context is reported.
    reader: Option<Box<dyn ResourceReader + Send>>,
    step: Duration,
    steps: VecDeque<Step>,
    current: Step,
    contexts: HashMap<u64, Context>,
    /// Latest cumulative CPU counters of every cgroup, as of the last edge read: read at start
    /// for those that existed then (a cgroup created since counts from zero).
    counters: HashMap<u64, CpuCounters>,
    /// Each cgroup's Go runtimes' clocks as of the last edge read (cgroups with Go processes
    /// only), and what the clocks' reader keeps between reads.
    go: HashMap<u64, GoEdge>,
    go_clocks: GoClocks,
    /// The counters when the session started, for the counters "since the agent started".
    baseline: HashMap<u64, CpuCounters>,
    /// The cgroups active since the last edge read: the ones whose counters can have moved.
    since_edge: HashSet<u64>,
    /// The cgroups with a quota that were active before the last edge read and not since: read
    /// once more, since a quota's period timer counts up to two periods after its cgroup last
    /// ran (the period that sets it idle, and the one that finds it idle).
    quota_tails: HashSet<u64>,
    /// When the last edge read was made.
    last_edge: SystemTime,
    ticks: u64,
    /// The host, read once when the session starts.
    host: Host,
    /// The host's CPU time counters at the last tick, and their unit.
    latest_cpu_ticks: Option<CpuTicks>,
    ticks_per_second: u64,
    /// Limits reads and thread counts done, for the self-metrics and the tests.
    pub limits_reads: u64,
    pub thread_reads: u64,
    /// Cumulative counters read at windows' edges.
    pub edge_reads: u64,
    /// What the network inventory may reuse between diagnosis steps.
    inventory: std::sync::Mutex<InventoryCache>,
    /// The runtimes of the processes seen in hand-offs, and their threads' names.
    runtimes: std::sync::Mutex<RuntimeCache>,
    /// The JVM thread dumps under way (`SessionOptions::jvm_thread_dumps`).
    dumps: ThreadDumps,
    /// The kubelet's CPU manager checkpoint as last read (the first of the options' paths that
    /// reads), and when: read again at most every [`LIMITS_REFRESH_QUOTA`], at a tick.
    cpu_manager: Option<CpuManagerState>,
    cpu_manager_read_at: Option<Instant>,
    /// Whether, and since when, the futex probes are attached.
    futex_watch: FutexWatch,
    /// When the last tick was read.
    last_tick: Option<Instant>,
}

/// Whether the futex probes watch, as the session knows it (the daemon attaches them on
/// demand; `diagnose` and `trace` always).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FutexWatch {
    Always,
    /// Attached at this instant.
    Since(Instant),
    Off,
}

impl Session {
    /// A session that starts now. `existing` are the cgroups that exist now (id, path): their
    /// cumulative throttling is read as the baseline.
    pub fn new<'a>(
        options: SessionOptions,
        reader: Option<Box<dyn ResourceReader + Send>>,
        existing: impl IntoIterator<Item = (u64, &'a str)>,
    ) -> Self {
        let started_at = SystemTime::now();
        // Only the counters, as at every later edge: reading every cgroup's full limits here
        // took long enough in a slow (emulated) guest that the last cgroups' cpu.stat was read
        // a few hundred ms after the stamped start, and a workload that stopped inside the
        // window lost those periods.
        let existing: Vec<(u64, &str)> = existing.into_iter().collect();
        let baseline: HashMap<u64, CpuCounters> = match &reader {
            Some(r) => existing
                .iter()
                .map(|&(id, path)| (id, r.counters(path, &CpuCounters::default(), true, true)))
                .collect(),
            None => HashMap::new(),
        };
        // Go's clocks after every cgroup's counters: the first read of a host looks at every
        // binary it runs, which in an emulated guest took seconds, and the counters read after
        // it lost what was throttled meanwhile.
        let mut go_clocks = GoClocks::default();
        let mut go = HashMap::new();
        if let Some(r) = &reader {
            for &(id, path) in &existing {
                if let Some(edge) = go_clocks.read_cgroup(id, &r.processes(path)) {
                    go.insert(id, edge);
                }
            }
        }
        go_clocks.sweep();
        let step = match options.span {
            Some(span) => (span / 3).max(options.interval),
            None => Duration::MAX,
        };
        Self {
            reader,
            step,
            steps: VecDeque::new(),
            current: Step::new(
                &baseline,
                &go,
                started_at,
                options
                    .network
                    .as_ref()
                    .map(|o| NetWatch::start(o.host_netns)),
            ),
            contexts: HashMap::new(),
            counters: baseline.clone(),
            go,
            go_clocks,
            baseline,
            since_edge: HashSet::new(),
            quota_tails: HashSet::new(),
            last_edge: started_at,
            ticks: 0,
            host: Host::read(),
            latest_cpu_ticks: None,
            ticks_per_second: ticks_per_second(),
            limits_reads: 0,
            thread_reads: 0,
            edge_reads: 0,
            inventory: std::sync::Mutex::new(InventoryCache::new(
                options
                    .network
                    .as_ref()
                    .map_or(Duration::ZERO, |n| n.inventory_max_age),
            )),
            runtimes: std::sync::Mutex::new(RuntimeCache::default()),
            // One dump a tick for a one-off command; a fifth of the window for the daemon's.
            dumps: ThreadDumps::new(match options.span {
                Some(span) => (span / DUMPS_PER_WINDOW).max(options.interval),
                None => options.interval,
            }),
            cpu_manager: None,
            cpu_manager_read_at: None,
            futex_watch: FutexWatch::Always,
            last_tick: None,
            options,
        }
    }

    /// Says whether, and since when, the futex probes are attached: the facts' futex figures
    /// then cover only that part of the window (see [`Facts::futex_seconds`]).
    pub fn set_futex_watch(&mut self, watch: FutexWatch) {
        self.futex_watch = watch;
    }

    pub fn options(&self) -> &SessionOptions {
        &self.options
    }

    /// Adds one tick's window, read at `now`; `path` names the cgroups that still exist.
    /// Returns true when a step completed: time to [`judgement`](Self::judgement).
    pub fn observe<'p>(
        &mut self,
        tick: &Window,
        path: impl Fn(u64) -> Option<&'p str>,
        now: Instant,
    ) -> bool {
        self.ticks += 1;
        self.last_tick = Some(now);
        if self
            .cpu_manager_read_at
            .is_none_or(|t| now.saturating_duration_since(t) >= LIMITS_REFRESH_QUOTA)
        {
            self.cpu_manager = CpuManagerState::read_first(&self.options.cpu_manager_state);
            self.cpu_manager_read_at = Some(now);
        }
        // Read with the tick: the end of this tick's steal, the start of the next step's.
        self.latest_cpu_ticks = read_cpu_ticks();
        let secs = tick.duration.as_secs_f64();
        for (id, w) in &tick.cgroups {
            let Some(p) = path(*id) else { continue };
            let Some(threads) = self.refresh(*id, p, w, secs, now) else {
                continue;
            };
            let t = self.current.threads.entry(*id).or_default();
            t.thread_seconds += threads as f64 * secs;
            t.seconds += secs;
        }
        self.current.window.extend_figures(tick);
        let runtimes = self
            .runtimes
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        name_while_alive(tick, runtimes);
        // The dumps finished first: a JVM whose last dump is done may be asked again.
        self.dumps.collect(&mut self.current.census);
        if self.options.jvm_thread_dumps {
            for tgid in jvms_handing_off(tick, runtimes, JVM_DUMP_MIN_HANDOFFS_PER_SECOND) {
                self.dumps.ask(tgid, now);
            }
        }
        let step_done = self.current.window.duration >= self.step;
        // A window the session judges ends at a completed step, or, without a span, at any
        // tick: the cumulative counters are read there, so that the window's figures are
        // their difference between its own edges.
        if step_done || self.options.span.is_none() {
            self.read_edges(&path, now);
        }
        if !step_done {
            return false;
        }
        let mut next = Step::new(
            &self.counters,
            &self.go,
            self.last_edge,
            self.options
                .network
                .as_ref()
                .map(|o| NetWatch::start(o.host_netns)),
        );
        next.cpu_ticks = self.latest_cpu_ticks;
        let mut done = std::mem::replace(&mut self.current, next);
        done.complete();
        self.steps.push_back(done);
        if let Some(span) = self.options.span {
            while self.steps.len() > 1 {
                let total: Duration = self.steps.iter().map(|s| s.window.duration).sum();
                if total - self.steps[0].window.duration < span {
                    break;
                }
                self.steps.pop_front();
            }
        }
        true
    }

    /// Reads what is due of an active cgroup's context; its thread count for this tick.
    fn refresh(
        &mut self,
        id: u64,
        path: &str,
        w: &CgroupWindow,
        secs: f64,
        now: Instant,
    ) -> Option<u64> {
        let reader = self.reader.as_deref()?;
        let activity = activity(w, secs);
        let tick = self.ticks;
        let ctx = match self.contexts.get_mut(&id) {
            Some(ctx) => {
                if now.saturating_duration_since(ctx.limits_read_at) >= refresh_period(&ctx.limits)
                {
                    ctx.limits = reader.refresh(path, &ctx.limits);
                    ctx.limits.exclusive_cpus =
                        exclusive_cpus(self.cpu_manager.as_ref(), path, &ctx.limits);
                    ctx.limits_read_at = now;
                    ctx.threads_read_at = now;
                    ctx.activity_at_count = activity;
                    self.limits_reads += 1;
                } else if threads_due(ctx, activity, tick, now) {
                    ctx.limits.threads = reader.threads(path);
                    ctx.threads_read_at = now;
                    ctx.activity_at_count = activity;
                    self.thread_reads += 1;
                }
                ctx
            }
            None => {
                self.limits_reads += 1;
                let mut limits = reader.limits(path);
                limits.exclusive_cpus = exclusive_cpus(self.cpu_manager.as_ref(), path, &limits);
                // Later refreshes are spread over the period by id, so that cgroups first seen
                // together are not all re-read in the same tick.
                let period = refresh_period(&limits);
                let stagger = Duration::from_millis(id % period.as_millis().max(1) as u64);
                // Its counters as first read: what it started from if it was created in this
                // step; a cgroup that existed already has its start in `counters`.
                self.counters.entry(id).or_insert(limits.counters);
                let quota_at_edge = limits.cpu_quota_cores.is_some();
                self.contexts.entry(id).or_insert(Context {
                    limits,
                    limits_read_at: now.checked_sub(stagger).unwrap_or(now),
                    threads_read_at: now,
                    activity_at_count: activity,
                    quota_at_edge,
                    last_active: now,
                    last_tick: tick,
                })
            }
        };
        ctx.last_active = now;
        ctx.last_tick = tick;
        self.since_edge.insert(id);
        ctx.limits.threads
    }

    /// The edge read: each cgroup active since the last one has its cumulative counters read
    /// (throttling when it has, or had, a quota; pressure when the options ask for it) and its
    /// threads counted. A cgroup that was not active cannot have been throttled (it ran
    /// nothing) and keeps its counters, but for a quota's periods after it last ran, read at
    /// the one edge more (`quota_tails`).
    fn read_edges<'p>(&mut self, path: &impl Fn(u64) -> Option<&'p str>, now: Instant) {
        self.last_edge = SystemTime::now();
        let Some(reader) = self.reader.as_deref() else {
            self.since_edge.clear();
            return;
        };
        let pressure = self.options.window_pressure;
        let mut active = Vec::with_capacity(self.since_edge.len());
        let tails: Vec<u64> = self
            .quota_tails
            .drain()
            .filter(|id| !self.since_edge.contains(id))
            .collect();
        let ran: Vec<u64> = self.since_edge.drain().collect();
        for &id in &ran {
            if self.contexts.get(&id).is_some_and(|c| c.quota_at_edge) {
                self.quota_tails.insert(id);
            }
        }
        let tail_from = ran.len();
        for (i, id) in ran.into_iter().chain(tails).enumerate() {
            let (Some(p), Some(ctx)) = (path(id), self.contexts.get_mut(&id)) else {
                continue;
            };
            let quota = ctx.limits.cpu_quota_cores.is_some();
            let throttling = quota || ctx.quota_at_edge;
            ctx.quota_at_edge = quota;
            if throttling || pressure {
                let before = ctx.limits.counters;
                ctx.limits.counters = reader.counters(p, &before, throttling, pressure);
                self.edge_reads += 1;
                // A tail whose throttling still moved is read at the next edge too, until it
                // rests: in a 6.1 guest under emulation a workload that stopped inside the
                // window had three periods counted after its one tail read (2026-12-01).
                if i >= tail_from && throttling && moved(&before, &ctx.limits.counters) {
                    self.quota_tails.insert(id);
                }
            }
            // Without a span every tick may end the window: the count is read with it, so the
            // window's mean is of a count at every tick (one small file per active cgroup, for
            // a one-off command). The daemon keeps to re-counts on activity changes.
            if self.options.span.is_none() {
                ctx.limits.threads = reader.threads(p);
                ctx.threads_read_at = now;
                self.thread_reads += 1;
            }
            self.counters.insert(id, ctx.limits.counters);
            active.push((id, p));
        }
        // Go's clock at every edge of an active cgroup (a process's first read is its
        // baseline, so the figure of a window needs both edges), after all the counters: a
        // new binary is looked at once, and the counters must not wait for it.
        // A JVM's virtual threads are read with the edges too (on the dumps' thread, at most
        // once an interval each), whatever the futex probes see: their storms make no futex
        // hand-offs (identity::jvm::vthreads). Their scheduler's counter wherever JVMs may be
        // attached; the JSON dump of what they wait for only where asked.
        let virtual_threads = self.options.jvm_thread_dumps || self.options.jvm_virtual_threads;
        for (id, p) in active {
            let processes = reader.processes(p);
            if let Some(edge) = self.go_clocks.read_cgroup(id, &processes) {
                self.go.insert(id, edge);
            }
            if virtual_threads {
                for &tgid in &processes {
                    self.dumps
                        .ask_virtual(tgid, id, self.options.jvm_virtual_threads, now);
                }
            }
        }
        self.go_clocks.sweep();
    }

    /// The network namespaces found when the current step began (`None` without the network
    /// rules).
    pub fn current_walk(&self) -> Option<&[NetnsRef]> {
        self.current.net.as_ref().map(NetWatch::walk)
    }

    /// Whether a cgroup has figures in the window (its name must be kept until it leaves).
    pub fn contains(&self, id: u64) -> bool {
        self.steps
            .iter()
            .chain([&self.current])
            .any(|s| s.contains(id))
    }

    /// The sizes of its caches: the runtimes of the processes in the window's hand-offs, and
    /// their threads' names.
    pub fn cache_sizes(&self) -> Vec<crate::memory::CacheSize> {
        let mut sizes = self
            .runtimes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .cache_sizes()
            .to_vec();
        sizes.push(self.go_clocks.cache_size());
        sizes
    }

    /// Forgets the context of cgroups that are gone (`alive` false) and no longer in the window.
    pub fn forget(&mut self, alive: impl Fn(u64) -> bool) {
        let gone: HashSet<u64> = self
            .contexts
            .keys()
            .chain(self.counters.keys())
            .copied()
            .filter(|id| !alive(*id))
            .collect();
        for id in gone {
            if !self.contains(id) {
                self.contexts.remove(&id);
                self.counters.remove(&id);
                self.go.remove(&id);
                self.go_clocks.forget_cgroup(id);
                self.baseline.remove(&id);
            }
        }
        // The JVMs asked for dumps that have exited (a stat each, of a few processes).
        self.dumps
            .retain(|pid| std::path::Path::new("/proc").join(pid.to_string()).exists());
    }

    /// The window the rules judge: the completed steps and the one in progress.
    pub fn window(&self) -> Window {
        let mut total = Window::empty();
        for s in self.steps.iter().chain([&self.current]) {
            total.extend(&s.window);
            total
                .cgroups
                .reserve(s.cgroups.len().saturating_sub(total.cgroups.len()));
            for (id, w) in &s.cgroups {
                total.add_cgroup(*id, w);
            }
        }
        total
    }

    /// Each cgroup of `window`'s resource context over the session's window: quota and cpuset
    /// as last read; threads the time-weighted mean of the counts while it was active;
    /// throttling and pressure between the window's edges ([`Session::window_edges`]; a cgroup
    /// created since the first counts from zero). Cgroups whose context was never read are left
    /// out.
    pub fn window_limits(&self, window: &Window) -> HashMap<u64, Limits> {
        let first = self.steps.front().unwrap_or(&self.current);
        let start = &first.counters_at_start;
        window
            .cgroups
            .keys()
            .filter_map(|id| {
                let mut l = self.contexts.get(id)?.limits.clone();
                let t = self
                    .steps
                    .iter()
                    .chain([&self.current])
                    .filter_map(|s| s.threads.get(id))
                    .fold(ThreadTime::default(), |a, t| ThreadTime {
                        thread_seconds: a.thread_seconds + t.thread_seconds,
                        seconds: a.seconds + t.seconds,
                    });
                if t.seconds > 0.0 {
                    l.threads = Some((t.thread_seconds / t.seconds).round() as u64);
                }
                let end = self.counters.get(id).copied().unwrap_or(l.counters);
                l.counters = end.since(start.get(id));
                Some((*id, l))
            })
            .collect()
    }

    /// The wall-clock instants of the window's edges: the edge read its first step began with,
    /// and the last one. The window's counters are the differences between the two reads.
    pub fn window_edges(&self) -> (SystemTime, SystemTime) {
        let first = self.steps.front().unwrap_or(&self.current);
        (first.started_at, self.last_edge)
    }

    /// The latest resource context of the cgroups in `ids` (threads as last counted), with
    /// throttling since the session started: what the daemon exports as gauges and counters.
    pub fn latest_limits<'a>(
        &self,
        ids: impl IntoIterator<Item = &'a u64>,
    ) -> HashMap<u64, Limits> {
        ids.into_iter()
            .filter_map(|id| {
                let mut l = self.contexts.get(id)?.limits.clone();
                l.counters = l.counters.since(self.baseline.get(id));
                Some((*id, l))
            })
            .collect()
    }

    /// The JVM thread dumps of the window's steps.
    fn census(&self) -> Census {
        let mut c = Census::default();
        for s in self.steps.iter().chain([&self.current]) {
            c.extend(&s.census);
        }
        c
    }

    /// JVM thread dumps taken, and attempts that failed, since the session started.
    pub fn jvm_dumps(&self) -> (u64, u64) {
        (self.dumps.taken, self.dumps.failed)
    }

    /// The facts of every cgroup in the window, with their context over the window.
    pub fn facts(&self, window: &Window, paths: &HashMap<u64, String>) -> Vec<Facts> {
        let limits = self.window_limits(window);
        let window_seconds = window.duration.as_secs_f64();
        let futex_seconds = match (self.futex_watch, self.last_tick) {
            (FutexWatch::Always, _) => window_seconds,
            (FutexWatch::Since(t), Some(now)) => now
                .saturating_duration_since(t)
                .as_secs_f64()
                .min(window_seconds),
            _ => 0.0,
        };
        let census = self.census();
        let mut handoffs = tell_handoffs_apart(
            window,
            &mut self
                .runtimes
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            &census,
        );
        if let Some(reader) = self.reader.as_deref() {
            add_sized_servers(window, paths, reader, &mut handoffs);
        }
        super::facts(
            window,
            FactsContext {
                paths,
                limits: &limits,
                host_cpus: self.options.host_cpus,
                host: Some(HostFacts::new(&self.host, self.steal())),
                futex_seconds,
                node_policy: self.cpu_manager.as_ref().map(|s| s.policy.clone()),
                handoffs,
                go_mutex: &|id| self.go_mutex_wait(id),
                jvm_virtual: &|id| VirtualThreadWaits::of(&census, id),
            },
        )
    }

    /// A cgroup's Go runtimes' mutex waits over the window: the clock at the last edge less
    /// at the window's first (from zero for a cgroup whose Go processes were first read
    /// inside it).
    fn go_mutex_wait(&self, id: u64) -> Option<GoMutexWait> {
        let end = self.go.get(&id)?;
        let first = self.steps.front().unwrap_or(&self.current);
        let start = first
            .go_at_start
            .get(&id)
            .map_or(0.0, |s| s.mutex_wait_seconds);
        Some(GoMutexWait {
            wait_seconds: (end.mutex_wait_seconds - start).max(0.0),
            goroutines: end.goroutines,
            gomaxprocs: end.gomaxprocs,
            processes: end.processes,
            seconds: self
                .last_edge
                .duration_since(first.started_at)
                .map_or(0.0, |d| d.as_secs_f64()),
        })
    }

    /// The Go processes whose runtime clocks are read: the ones the on-CPU sampler counts.
    pub fn go_tgids(&self) -> impl Iterator<Item = u32> + '_ {
        self.go_clocks.tgids()
    }

    /// The host, as read when the session started.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// Steal over the window (from the start of its first step to the last tick); `None`
    /// before the first tick or when `/proc/stat` could not be read.
    pub fn steal(&self) -> Option<Steal> {
        let front = self.steps.front().unwrap_or(&self.current);
        Steal::between(
            front.cpu_ticks?,
            self.latest_cpu_ticks?,
            self.ticks_per_second,
        )
    }

    /// The network over the window: the inventory now, and each namespace's kernel counters
    /// since the window began. `None` without the network rules. `seen`: the interfaces the
    /// probes saw ([`crate::pipeline::Pipeline::seen_interfaces`]), the inventory of the
    /// namespaces that cannot be read.
    pub fn network(&self, seen: &HashMap<NetIfKey, SeenInterface>) -> Option<NetState> {
        let front = self.steps.front().unwrap_or(&self.current);
        let mut cache = self
            .inventory
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // A step that has no tick yet, after ticks, began at the latest one (every tick lasts
        // some time): it found the namespaces of this very moment.
        let now = (self.ticks > 0 && self.current.window.duration.is_zero())
            .then_some(self.current.net.as_ref())
            .flatten();
        front.net.as_ref().map(|n| match now {
            Some(fresh) => n.finish_with(fresh.walk(), seen, &mut cache),
            None => n.finish(seen, &mut cache),
        })
    }

    /// Runs every rule over the window (the network rules when `net`, [`Session::network`]'s
    /// state, is given), and what the same window says to the daemon's on-demand tiers: one
    /// assembly of the window and of each cgroup's facts serves all three.
    pub fn judgement(&self, paths: &HashMap<u64, String>, net: Option<&NetState>) -> Judgement {
        let window = self.window();
        if window.duration.is_zero() {
            return Judgement::default();
        }
        let t = &self.options.thresholds;
        let facts = self.facts(&window, paths);
        let storm_candidate = facts
            .iter()
            .any(|f| super::rules::lock_storm_candidate(f, t));
        let mut findings = diagnose(&facts, t);
        let mut misfits = false;
        if let (Some(state), Some(o)) = (net, &self.options.network) {
            let cgroup_id = |path: &str| {
                std::fs::metadata(o.v2_root.join(path.trim_start_matches('/')))
                    .ok()
                    .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            };
            findings.extend(judge_network(
                &net_facts(state, &window, o.avail, cgroup_id),
                t,
            ));
            misfits = packets_did_not_fit(state, &window);
        }
        sort_findings(&mut findings);
        let lock_stacks = window
            .handoff_sites
            .into_iter()
            .filter(|(_, s)| !s.stacks.is_empty())
            .map(|(id, s)| (id, s.stacks))
            .collect();
        Judgement {
            findings,
            storm_candidate,
            packets_did_not_fit: misfits,
            lock_stacks,
            window_end: Some(self.window_edges().1),
            window_duration: window.duration,
        }
    }
}

/// What one judgement of the window found.
#[derive(Debug, Default)]
pub struct Judgement {
    pub findings: Vec<Finding>,
    /// Some container's scheduler figures look like a lock storm's
    /// ([`super::rules::lock_storm_candidate`]): what the futex probes attach on.
    pub storm_candidate: bool,
    /// Packets did not fit somewhere ([`packets_did_not_fit`]): what the per-packet network
    /// probes attach on.
    pub packets_did_not_fit: bool,
    /// Each cgroup's sampled hand-off stacks over the window (those with any): its lock
    /// profile (`report::pprof`).
    pub lock_stacks: HashMap<u64, crate::symbolize::stacks::LockStacks>,
    /// The window's end (wall clock) and length.
    pub window_end: Option<std::time::SystemTime>,
    pub window_duration: std::time::Duration,
}

/// The CPUs the kubelet's checkpoint gave the container at `path` for itself, where its
/// cpuset (in `limits`) is one of its pod's exclusive assignments.
/// Whether a quota's throttling moved between two reads.
fn moved(before: &CpuCounters, after: &CpuCounters) -> bool {
    before.periods != after.periods
        || before.throttled_periods != after.throttled_periods
        || before.throttled_seconds != after.throttled_seconds
}

fn exclusive_cpus(
    state: Option<&CpuManagerState>,
    path: &str,
    limits: &Limits,
) -> Option<Vec<u32>> {
    let pod = parse_cgroup_path(path).pod_uid?;
    let cpuset = limits.cpuset_cpus.as_ref()?;
    state?.exclusive_cpus(&pod, cpuset).map(<[u32]>::to_vec)
}

mod context;
mod handoffs;
mod options;
mod resources;
mod step;

pub use self::context::{
    ACTIVITY_CHANGE_FACTOR, ACTIVITY_CHANGE_FLOOR, LIMITS_REFRESH, LIMITS_REFRESH_QUOTA,
    THREADS_MAX_AGE,
};
pub use self::options::{NetworkOptions, SessionOptions};
pub use self::resources::{ResourceReader, cgroupfs_reader};
use self::{
    context::{Context, activity, refresh_period, threads_due},
    handoffs::{add_sized_servers, jvms_handing_off, name_while_alive, tell_handoffs_apart},
    step::{Step, ThreadTime},
};

#[cfg(test)]
mod tests;
