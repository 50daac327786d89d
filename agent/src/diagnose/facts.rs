//! What the rules judge: one container's figures over a window ([`Facts`]), with its resource
//! context, built once per window from the collected figures ([`facts`]).

use std::collections::HashMap;

use serde::Serialize;
use stormwatch_common::{FutexStats, LockStats, SchedStats, culprit, lock_kind};

use crate::{
    collect::{GoMutexFigures, Window},
    host::{Host, Steal},
    identity::{
        limits::{CpuCounters, Limits},
        runtime::ProcessRuntime,
    },
    symbolize::handoffs::HandoffSites,
};

/// One container's figures over one window, with what bounds it.
#[derive(Clone, Debug)]
pub struct Facts {
    pub cgroup_id: u64,
    /// Path relative to the v2 root.
    pub cgroup: String,
    pub window_seconds: f64,
    /// CPUs on the host (online).
    pub host_cpus: u32,
    /// CPUs in the container's effective cpuset, when known.
    pub cpuset_cpus: Option<u32>,
    /// CFS quota in cores, when limited.
    pub quota_cores: Option<f64>,
    /// The tightest quota above the container, where one is set (a parent's `cpu.max`).
    pub ancestor_quota: Option<crate::identity::limits::AncestorQuota>,
    /// Whether the container is pinned by the kubelet's static CPU manager, and the node's
    /// policy (the session reads the kubelet's checkpoint).
    pub cpu_pinning: crate::identity::cpumanager::CpuPinning,
    /// Threads in the cgroup at the end of the window, when known.
    pub threads: Option<u64>,
    /// The CPU controller's counters over the window (differences between its edges):
    /// enforcement periods, throttled periods and time, pressure.
    pub cpu: CpuCounters,
    pub sched: SchedStats,
    pub futex: FutexStats,
    pub locks: LockStats,
    /// Of the wake-ups of the container's threads, the share sent from another CPU than the
    /// one the thread was queued on (each an inter-processor interrupt), when measured.
    pub remote_wakeup_share: Option<f64>,
    /// Distinct CPUs the container's threads ran on in the window, when measured.
    pub cpus_used: Option<u32>,
    /// Of the window, the seconds the futex probes were attached (the daemon attaches them on
    /// demand): `futex` covers that span, and its rates are per second of it. 0: not watched,
    /// so all-zero futex figures mean nothing was seen, not that nothing happened.
    pub futex_seconds: f64,
    /// The host over the window, when known.
    pub host: Option<HostFacts>,
    /// The futex hand-offs of the window, told apart by who made them (see [`Handoffs`]).
    pub handoffs: Handoffs,
    /// The processes whose threads took part in hand-offs, with their runtimes, and the
    /// native servers that size a pool themselves (Redis's I/O threads, memcached's and
    /// nginx's event loops).
    pub runtimes: Vec<ProcessRuntime>,
    /// The call sites of the window's sampled hand-offs, where they are sampled and there were
    /// any.
    pub sites: Option<HandoffSites>,
    /// Its Go mutexes' contention as the uprobes counted it in the window's bursts (zero where
    /// they never watched it); the code is in `sites`.
    pub go_uprobes: GoMutexFigures,
    /// The container's Go runtimes' own clock of their goroutines' `sync.Mutex` waits over
    /// the window, where it has Go processes whose clock could be read (the session reads it
    /// at the window's edges: [`crate::identity::goclock`]).
    pub go_mutex: Option<GoMutexWait>,
    /// Its PostgreSQL backends' heavyweight lock waits that ended in the window (zero without
    /// a PostgreSQL binary the uprobes attach to: `probes::pglock`).
    pub pg_lock: stormwatch_common::PgLockWaits,
    /// What the container's JVMs say of their virtual threads over the window, where it has
    /// JVMs with virtual threads that could be read ([`crate::identity::jvm::vthreads`]).
    pub jvm_virtual: Option<VirtualThreadWaits>,
    /// The container's run-queue wait split by what held the CPUs while its threads waited,
    /// where the switch program blamed waits in the window (`None`: not blamed, or no wait).
    pub runq_blame: Option<RunqBlame>,
}

/// A container's run-queue wait over a window, split by what held the CPU each wait was on
/// while it lasted (`sched_switch`'s blame, `probes::tiers::RunqBlame`). Seconds; they add up
/// to `wait_seconds`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RunqBlame {
    /// The waits blamed: on the CPUs they ended on (the part of a wait spent queued on another
    /// CPU before a migration is not in it).
    pub wait_seconds: f64,
    /// The container's own threads held the CPU.
    pub own_seconds: f64,
    /// Kernel threads held it.
    pub kernel_seconds: f64,
    /// The CPU was idle: the thread was queued on a CPU that had yet to wake up.
    pub idle_seconds: f64,
    /// The CPU's clock ran without its task being charged: stolen by the hypervisor, or
    /// interrupt time where the kernel accounts it apart.
    pub stolen_seconds: f64,
    /// Began before the oldest run the CPU remembered: not attributed.
    pub unseen_seconds: f64,
    /// Other cgroups that held the CPU, most first.
    pub others: Vec<Culprit>,
}

/// A cgroup that held a CPU while another's threads waited for it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Culprit {
    #[serde(skip)]
    pub cgroup_id: u64,
    /// Its path (relative to the v2 root), or `cgroup id N` for one not followed.
    pub cgroup: String,
    pub seconds: f64,
}

impl RunqBlame {
    /// The victim's blame from its (culprit, ns) pairs of a window
    /// ([`Window::blame_by_victim`]), culprits named by `paths`; `None` without any.
    pub fn of(victim: u64, pairs: &[(u64, u64)], paths: &HashMap<u64, String>) -> Option<Self> {
        let mut b = Self::default();
        for &(culprit, ns) in pairs {
            let secs = ns as f64 / 1e9;
            b.wait_seconds += secs;
            match culprit {
                c if c == victim => b.own_seconds += secs,
                culprit::KERNEL => b.kernel_seconds += secs,
                culprit::IDLE => b.idle_seconds += secs,
                culprit::STOLEN => b.stolen_seconds += secs,
                culprit::UNSEEN => b.unseen_seconds += secs,
                c => b.others.push(Culprit {
                    cgroup_id: c,
                    cgroup: paths
                        .get(&c)
                        .cloned()
                        .unwrap_or_else(|| format!("cgroup id {c}")),
                    seconds: secs,
                }),
            }
        }
        b.others.sort_by(|a, b| {
            b.seconds
                .total_cmp(&a.seconds)
                .then(a.cgroup.cmp(&b.cgroup))
        });
        (!pairs.is_empty()).then_some(b)
    }

    /// The other cgroup that held the CPU most, with its share of the wait.
    pub fn top_other(&self) -> Option<(&Culprit, f64)> {
        let top = self.others.first()?;
        (self.wait_seconds > 0.0).then(|| (top, top.seconds / self.wait_seconds))
    }

    /// The share of the wait the container's own threads caused.
    pub fn own_share(&self) -> f64 {
        if self.wait_seconds > 0.0 {
            self.own_seconds / self.wait_seconds
        } else {
            0.0
        }
    }
}

/// What a container's JVMs say of their virtual threads over a window: their schedulers' count
/// of continuations run, and what their JSON thread dumps found the virtual threads waiting
/// for ([`crate::identity::jvm::vthreads`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct VirtualThreadWaits {
    /// JVMs read.
    pub processes: u32,
    /// Continuations their schedulers ran per second, of the JVMs read at least twice: each a
    /// virtual thread mounted on a carrier after it parked (or first started).
    pub runs_per_second: f64,
    pub dumps: u32,
    /// Virtual threads a dump found, on average (summed over the JVMs); of them, those parked
    /// for a lock, for work or an event, and those ready, waiting for a carrier.
    pub threads: f64,
    pub waiting_for_a_lock: f64,
    pub waiting_for_work: f64,
    pub waiting_for_a_carrier: f64,
    /// The lock the most waited for: its object as the dumps name it, its waiters per dump on
    /// average, and its code (the first frame of a waiter outside the JDK).
    pub top_lock: Option<TopLock>,
}

/// The lock a container's virtual threads wait for the most.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TopLock {
    pub object: String,
    pub waiters: f64,
    pub site: Option<String>,
}

impl VirtualThreadWaits {
    /// Of the virtual threads found off their carriers, the share parked on a lock (the rest
    /// wait for work or an event, or, ready, for a carrier: just unparked, or just started).
    pub fn lock_share(&self) -> f64 {
        let off = self.waiting_for_a_lock + self.waiting_for_work + self.waiting_for_a_carrier;
        if off > 0.0 {
            self.waiting_for_a_lock / off
        } else {
            0.0
        }
    }

    /// The locks' hand-offs per second, estimated: the continuations run, in the share of the
    /// virtual threads off their carriers that are parked on a lock (a virtual thread handed
    /// a lock is unparked and run again; one woken for work, by a timer, or started, is run
    /// the same way).
    pub fn lock_handoffs_per_second(&self) -> f64 {
        self.runs_per_second * self.lock_share()
    }

    /// Of a cgroup's JVMs as `census` read them.
    pub fn of(census: &crate::identity::jvm::Census, cgroup: u64) -> Option<Self> {
        let mut w = Self::default();
        for p in census
            .virtual_threads
            .values()
            .filter(|p| p.cgroup == cgroup)
        {
            w.processes += 1;
            w.runs_per_second += p.runs_per_second().unwrap_or(0.0);
            if p.dumps == 0 {
                continue;
            }
            let n = f64::from(p.dumps);
            w.dumps += p.dumps;
            w.threads += p.threads as f64 / n;
            w.waiting_for_a_lock += p.lock as f64 / n;
            w.waiting_for_work += p.work as f64 / n;
            w.waiting_for_a_carrier += p.runnable as f64 / n;
            let top = p
                .locks
                .iter()
                .max_by(|a, b| a.1.0.cmp(&b.1.0).then(b.0.cmp(a.0)))
                .map(|(object, (waiters, site))| TopLock {
                    object: object.clone(),
                    waiters: *waiters as f64 / n,
                    site: site.clone(),
                });
            if top.as_ref().map(|t| t.waiters) > w.top_lock.as_ref().map(|t| t.waiters) {
                w.top_lock = top;
            }
        }
        (w.processes > 0).then_some(w)
    }
}

/// What a container's Go runtimes say their goroutines waited for `sync.Mutex` and `RWMutex`
/// over a window ([`crate::identity::goclock`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct GoMutexWait {
    /// Seconds of goroutines' waits for a mutex in the window: what each process waited from
    /// its first read on (a process that started inside the window counts from there), so a
    /// lower bound of the window's.
    pub wait_seconds: f64,
    /// Goroutines the runtimes hold at the window's end: the live ones and the exited ones
    /// kept for reuse, so an upper bound of the live ones.
    pub goroutines: u64,
    /// The largest `GOMAXPROCS` among the processes, when read.
    pub gomaxprocs: Option<u32>,
    /// Go processes read at the window's end.
    pub processes: u32,
    /// The seconds between the two edge reads the wait is the difference of.
    pub seconds: f64,
}

impl GoMutexWait {
    /// Goroutines waiting for a mutex on average between the edges (Little's law): a lower
    /// bound.
    pub fn waiting(&self) -> f64 {
        if self.seconds > 0.0 {
            self.wait_seconds / self.seconds
        } else {
            0.0
        }
    }
}

/// A container's futex waits that ended in a wake (hand-offs through the kernel), split by the
/// part their threads played in the window. A lock is handed on by threads that each wait for
/// it and wake the next waiter when they let go — on the lock's word itself, where the threads
/// queue on one (glibc's mutexes, rwlocks and PI futexes): each hands on the word it waited on;
/// a pool waiting for work has workers woken on a condition's word by a producer that never
/// waited there (the workers may also take the queue's mutex: only those waits are a lock's);
/// a runtime parks its idle threads itself and wakes them for work (Go's Ms, HotSpot's
/// compiler, GC and service threads). Only the lock's waits make its queue.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Handoffs {
    /// Woken waits, and their time, of the threads that both waited for hand-offs and made
    /// them, outside a runtime's own parking: the lock's hand-offs and its queue.
    pub lock_waits: u64,
    pub lock_wait_ns: u64,
    /// How many threads those were.
    pub lock_threads: u32,
    /// Woken waits of threads a runtime parks itself (a Go program's Ms, a JVM's service
    /// threads): hand-offs of work by the runtime's scheduler.
    pub runtime_waits: u64,
    pub runtime_wait_ns: u64,
    /// The other woken waits: of threads that only waited (they woke no one), and on shared
    /// words, those the thread did not hand on (a condition's, signalled by a producer):
    /// workers waiting for work.
    pub work_waits: u64,
    pub work_wait_ns: u64,
    /// Threads (not the runtime's) of processes that park their threads on words of their own
    /// (`session::handoffs::parks_on_own_words`): judged by whether they both waited and woke,
    /// as whether they handed on their own word says nothing there.
    pub own_word_threads: u32,
    /// Thread dumps of the cgroup's JVMs over the window ([`crate::identity::jvm`]), and the
    /// threads they found waiting for a lock and for work, summed over the dumps.
    pub jvm_dumps: u32,
    pub jvm_lock_waiting: u32,
    pub jvm_work_waiting: u32,
    /// Threads whose woken waits the dumps split between a lock's and work's (by what the
    /// dumps found them, or their process's threads, waiting for).
    pub dump_judged_threads: u32,
}

/// What the rules know of the host over a window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostFacts {
    /// `kvm`, `xen`, … or `unknown`; `None` on bare metal (see [`crate::host::Host`]).
    pub hypervisor: Option<String>,
    /// Of all the host's CPU time in the window, the part the hypervisor stole; `None` when
    /// `/proc/stat` could not be read or the window was empty.
    pub steal_share: Option<f64>,
}

impl HostFacts {
    pub fn new(host: &Host, steal: Option<Steal>) -> Self {
        Self {
            hypervisor: host.hypervisor.clone(),
            steal_share: steal.and_then(|s| s.share),
        }
    }
}

impl Facts {
    /// The CPUs the container can really use: the smallest of its cpuset, its quota, the
    /// quotas above it and the host.
    pub fn allowed_cpus(&self) -> f64 {
        let mut cpus = f64::from(self.host_cpus.max(1));
        if let Some(set) = self.cpuset_cpus {
            cpus = cpus.min(f64::from(set.max(1)));
        }
        for q in [
            self.quota_cores,
            self.binding_ancestor_quota().map(|a| a.cores),
        ]
        .into_iter()
        .flatten()
        {
            cpus = cpus.min(q.max(0.01));
        }
        cpus
    }

    /// A quota above the container that binds it: tighter than its own quota (or it has none),
    /// its cpuset and the host's CPUs.
    pub fn binding_ancestor_quota(&self) -> Option<&crate::identity::limits::AncestorQuota> {
        let mut others = f64::from(self.host_cpus.max(1));
        if let Some(set) = self.cpuset_cpus {
            others = others.min(f64::from(set.max(1)));
        }
        if let Some(q) = self.quota_cores {
            others = others.min(q);
        }
        self.ancestor_quota.as_ref().filter(|a| a.cores < others)
    }

    /// Whether the container is already held to fewer CPUs than the host's: the kubelet gave
    /// it CPUs of its own, or its cpuset is narrower than the host. The pinned CPUs' count.
    pub fn pinned_cpus(&self) -> Option<u32> {
        if let Some(c) = &self.cpu_pinning.exclusive_cpus {
            return Some(c.len() as u32);
        }
        self.cpuset_cpus.filter(|n| *n < self.host_cpus)
    }

    pub(crate) fn per_second(&self, v: f64) -> f64 {
        v / self.window_seconds.max(1e-9)
    }

    /// Threads off the CPU on average: blocked, or queued for a CPU (Little's law).
    pub fn off_cpu_threads(&self) -> f64 {
        self.per_second((self.sched.offcpu_ns + self.sched.runq.sum_ns) as f64 / 1e9)
    }

    /// A futex figure per second of the span the futex probes watched.
    pub fn futex_per_second(&self, v: f64) -> f64 {
        v / self.futex_seconds.max(1e-9)
    }

    /// The cgroup a finding about these facts is of: its id and path.
    pub fn owner(&self) -> (u64, String) {
        (self.cgroup_id, self.cgroup.clone())
    }

    /// Whether the futex probes watched any of the window.
    pub fn futex_watched(&self) -> bool {
        self.futex_seconds > 0.0
    }

    /// Average number of the container's threads on a CPU or waiting for one (Little's law:
    /// time running plus time queued, per second of window).
    pub fn runnable_threads(&self) -> f64 {
        self.per_second((self.sched.oncpu_ns + self.sched.runq.sum_ns) as f64 / 1e9)
    }

    /// Average number of threads in a futex wait.
    pub fn futex_waiting_threads(&self) -> f64 {
        self.futex_per_second(self.futex.wait.sum_ns as f64 / 1e9)
    }

    /// Share of the threads' time spent in futex waits.
    pub fn futex_wait_share(&self) -> Option<f64> {
        let threads = self.threads? as f64;
        (threads > 0.0).then(|| (self.futex_waiting_threads() / threads).min(1.0))
    }

    /// A lock's hand-offs through the kernel: futex waits that ended in a wake, of threads
    /// that also woke others ([`Handoffs::lock_waits`]), per second.
    pub fn handoffs_per_second(&self) -> f64 {
        self.futex_per_second(self.handoffs.lock_waits as f64)
    }

    /// Average number of threads queued for a lock's hand-off: the time of those waits, per
    /// second (Little's law). Timed-out and EAGAIN waits are left out (an idle thread parked
    /// on a timer is not queued for anything), and so are the waits of threads that only wait
    /// (a pool waiting for work) and of threads a runtime parks itself.
    pub fn queued_threads(&self) -> f64 {
        self.futex_per_second(self.handoffs.lock_wait_ns as f64 / 1e9)
    }

    /// A runtime's own hand-offs (its parked threads woken for work), per second.
    pub fn runtime_handoffs_per_second(&self) -> f64 {
        self.futex_per_second(self.handoffs.runtime_waits as f64)
    }

    /// Of the threads' sleep (time blocked, switched out not runnable, until woken), the part
    /// in futex waits; `None` when they never slept. Measured against sleep only, not against
    /// time runnable or throttled: threads queued behind a quota or for a CPU are not waiting
    /// on a lock, and counting that time would dilute a storm inside a quota (there, most of
    /// the threads' off-CPU time is throttled). A futex wait's time runs until its thread is
    /// back on a CPU, so it can hold the run-queue wait after the wake-up too: capped at 1.
    /// Where the futex probes watched only part of the window, the sleep is taken at its mean
    /// rate over the window for that part.
    pub fn futex_blocked_share(&self) -> Option<f64> {
        let asleep = self.per_second(self.sched.offcpu_ns as f64);
        let futex = self.futex_per_second(self.futex.wait.sum_ns as f64);
        (asleep > 0.0).then(|| (futex / asleep).min(1.0))
    }

    /// Of the quota's enforcement periods in the window (those in which the container wanted
    /// a CPU), the share in which the quota ran out, when the container has a quota.
    pub fn throttled_share(&self) -> Option<f64> {
        self.quota_cores?;
        self.cpu.throttled_period_share()
    }

    pub fn voluntary_switches_per_cpu_second(&self) -> f64 {
        self.per_second(self.sched.voluntary_switches as f64) / self.allowed_cpus()
    }

    pub fn futex_waits_per_second(&self) -> f64 {
        self.futex_per_second(self.futex.wait.count as f64)
    }

    pub fn migrations_per_second(&self) -> f64 {
        self.per_second(self.sched.migrations as f64)
    }

    /// Kernel spinlock wait, in seconds per second.
    pub fn spin_wait_per_second(&self) -> f64 {
        self.per_second(self.locks.wait_ns[lock_kind::SPIN] as f64 / 1e9)
    }

    /// Mean run-queue latency in seconds, when there were samples.
    pub fn runq_mean_seconds(&self) -> Option<f64> {
        let r = &self.sched.runq;
        (r.count > 0).then(|| r.sum_ns as f64 / 1e9 / r.count as f64)
    }

    pub fn oncpu_cores(&self) -> f64 {
        self.per_second(self.sched.oncpu_ns as f64 / 1e9)
    }

    /// How many CPUs a container inside a quota wanted, on average: the CPU time it used plus
    /// the time its quota held its run queues back (the kernel's throttled time, summed over
    /// the CPUs whose run queues were throttled), per second of the window. `None` without a
    /// quota or without the throttled time.
    ///
    /// In a period the container runs until its quota is spent and then stands throttled on
    /// the CPUs where its threads still want to run, so this is the number of CPUs it keeps
    /// busy at once while it may run — where it is throttled in (nearly) every period. A convoy
    /// runs one thread at a time, the holder (measured: 1.01–1.05 CPUs in a 0.5-CPU quota on 2
    /// CPUs, bpftrace's count of its threads on a CPU at once agreeing); threads that contend
    /// while they run keep every CPU busy (1.6–1.9; tests/CORPUS.md).
    pub fn cpus_wanted(&self) -> Option<f64> {
        self.quota_cores?;
        let held_back = self.cpu.throttled_seconds?;
        Some(self.oncpu_cores() + self.per_second(held_back))
    }
}

/// What is known of the window beyond its figures, for [`facts`]: each cgroup's path and
/// resource context over the window, the host, how long the futex probes watched, the node's
/// CPU manager policy, the hand-offs told apart per cgroup (with their processes' runtimes) and
/// each cgroup's Go runtimes' mutex wait.
pub struct FactsContext<'a> {
    pub paths: &'a HashMap<u64, String>,
    pub limits: &'a HashMap<u64, Limits>,
    pub host_cpus: u32,
    pub host: Option<HostFacts>,
    pub futex_seconds: f64,
    pub node_policy: Option<String>,
    pub handoffs: HashMap<u64, (Handoffs, Vec<ProcessRuntime>)>,
    pub go_mutex: &'a dyn Fn(u64) -> Option<GoMutexWait>,
    pub jvm_virtual: &'a dyn Fn(u64) -> Option<VirtualThreadWaits>,
}

/// The facts of every cgroup in `window` with a known path, each built once from the window's
/// figures and `ctx`.
pub fn facts(window: &Window, mut ctx: FactsContext<'_>) -> Vec<Facts> {
    let window_seconds = window.duration.as_secs_f64();
    let blame = window.blame_by_victim();
    window
        .cgroups
        .iter()
        .filter_map(|(id, w)| {
            let path = ctx.paths.get(id)?;
            let l = ctx.limits.get(id);
            let (handoffs, runtimes) = ctx.handoffs.remove(id).unwrap_or_default();
            Some(Facts {
                cgroup_id: *id,
                cgroup: path.clone(),
                window_seconds,
                host_cpus: ctx.host_cpus,
                cpuset_cpus: l
                    .and_then(|l| l.cpuset_cpus.as_ref())
                    .map(|c| c.len() as u32),
                quota_cores: l.and_then(|l| l.cpu_quota_cores),
                ancestor_quota: l.and_then(|l| l.ancestor_quota.clone()),
                cpu_pinning: crate::identity::cpumanager::CpuPinning {
                    node_policy: ctx.node_policy.clone(),
                    exclusive_cpus: l.and_then(|l| l.exclusive_cpus.clone()),
                },
                threads: l.and_then(|l| l.threads),
                cpu: l.map(|l| l.counters).unwrap_or_default(),
                sched: w.sched,
                futex: w.futex,
                locks: w.locks,
                remote_wakeup_share: w.remote_wakeup_share(),
                // A container that ran in the window ran on at least one CPU: none means the
                // switch probe did not see it, not "no CPU".
                cpus_used: Some(w.cpus_used()).filter(|n| *n > 0),
                futex_seconds: ctx.futex_seconds,
                host: ctx.host.clone(),
                handoffs,
                runtimes,
                sites: window.handoff_sites.get(id).cloned(),
                go_uprobes: w.go_mutex,
                go_mutex: (ctx.go_mutex)(*id),
                pg_lock: w.pg_lock,
                jvm_virtual: (ctx.jvm_virtual)(*id),
                runq_blame: blame
                    .get(id)
                    .and_then(|pairs| RunqBlame::of(*id, pairs, ctx.paths)),
            })
        })
        .collect()
}
