//! What a JVM's own threads wait for, asked of the JVM: thread dumps through HotSpot's attach
//! mechanism ([`attach`]), each thread told waiting for a lock or for work ([`dump`]); a JVM's
//! virtual threads and its scheduler's counters ([`vthreads`]: read, not yet judged).
//!
//! The kernel sees a JVM park every thread on a futex word of its own, and a pool's worker
//! woken by the producer that queued its work is, to the futex probes, one thread waking
//! another's word, as a lock's holder hands the lock to its next waiter. The dump tells them
//! apart by the object each thread is parked for. It costs the JVM a safepoint (every Java
//! thread stopped for the dump: a few milliseconds for hundreds of threads), so it is taken
//! only of JVMs whose threads hand off through futexes while the futex probes watch, at most
//! [`DUMPS_PER_WINDOW`] a window, on a thread of its own so a slow JVM never holds a tick up.

pub mod attach;
pub mod dump;
pub mod vthreads;

use std::{
    collections::{HashMap, HashSet},
    sync::mpsc,
    time::{Duration, Instant},
};

pub use dump::Waiting;

/// The most dumps of one JVM a diagnosis window takes (`run`'s sliding window: one every fifth
/// of it; `diagnose` and `trace`: one a tick).
pub const DUMPS_PER_WINDOW: u32 = 5;

/// How long a JVM that said it had no virtual threads is left before it is asked again.
pub const NO_VIRTUAL_AGAIN: Duration = Duration::from_secs(30);

/// The most processes whose kind is remembered (past it, all are read again).
const MAX_PROCESSES: usize = 65_536;

/// How long the attach listener may take to start, and each read of a dump.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(3);

/// Of one thread, the dumps that found it waiting for a lock and for work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitCounts {
    pub lock: u32,
    pub work: u32,
}

impl WaitCounts {
    /// The share of the dumps that found it waiting which found it waiting for a lock; `None`
    /// when none found it waiting.
    pub fn lock_share(&self) -> Option<f64> {
        let n = self.lock + self.work;
        (n > 0).then(|| f64::from(self.lock) / f64::from(n))
    }
}

impl std::ops::AddAssign for WaitCounts {
    fn add_assign(&mut self, o: Self) {
        self.lock += o.lock;
        self.work += o.work;
    }
}

/// Of one process, the dumps taken and what they found its threads waiting for, all together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessDumps {
    pub dumps: u32,
    pub waiting: WaitCounts,
}

/// The thread dumps taken of JVMs over some time: of each process, how many and what they
/// found, and what each thread (by the host's thread id) was found waiting for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Census {
    pub processes: HashMap<u32, ProcessDumps>,
    pub threads: HashMap<u32, WaitCounts>,
    /// Of each JVM with virtual threads (by process id), what its readings found.
    pub virtual_threads: HashMap<u32, VirtualProcess>,
}

/// One reading of a JVM's virtual threads: its scheduler's counter, then, where asked, a JSON
/// dump (`None`: not asked — the dump can crash a JDK 25 JVM, the counter cannot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VirtualReading {
    /// When the counter was read.
    pub at: Instant,
    pub scheduler: vthreads::Scheduler,
    pub census: Option<vthreads::VirtualCensus>,
}

/// A JVM's virtual threads over some readings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VirtualProcess {
    /// The cgroup it was read in.
    pub cgroup: u64,
    /// The scheduler's continuations run, at the first and the last reading.
    pub first: (Instant, u64),
    pub last: (Instant, u64),
    pub parallelism: u32,
    /// JSON dumps read, and over them all: virtual threads listed, those waiting for a lock,
    /// those waiting for work
    pub dumps: u32,
    pub threads: u64,
    pub lock: u64,
    pub work: u64,
    /// …and ready, waiting for a carrier (a virtual thread just unparked, or just started).
    pub runnable: u64,
    /// Waiters found of each lock that was a dump's most waited for, by its object, with
    /// its code.
    pub locks: HashMap<String, (u64, Option<String>)>,
}

impl VirtualProcess {
    fn of(cgroup: u64, r: &VirtualReading) -> Self {
        let mut p = Self {
            cgroup,
            first: (r.at, r.scheduler.steals),
            last: (r.at, r.scheduler.steals),
            parallelism: r.scheduler.parallelism,
            dumps: 0,
            threads: 0,
            lock: 0,
            work: 0,
            runnable: 0,
            locks: HashMap::new(),
        };
        if let Some(census) = &r.census {
            p.add_dump(census);
        }
        p
    }

    fn add_dump(&mut self, c: &vthreads::VirtualCensus) {
        self.dumps += 1;
        self.threads += u64::from(c.threads);
        self.lock += u64::from(c.lock);
        self.work += u64::from(c.work);
        self.runnable += u64::from(c.runnable);
        if let Some(top) = &c.top_lock {
            let e = self
                .locks
                .entry(top.object.clone())
                .or_insert((0, top.site.clone()));
            e.0 += u64::from(top.waiters);
        }
    }

    fn merge(&mut self, o: &Self) {
        if o.first.0 < self.first.0 {
            self.first = o.first;
        }
        if o.last.0 > self.last.0 {
            self.last = o.last;
        }
        self.parallelism = self.parallelism.max(o.parallelism);
        self.dumps += o.dumps;
        self.threads += o.threads;
        self.lock += o.lock;
        self.work += o.work;
        self.runnable += o.runnable;
        for (k, (n, site)) in &o.locks {
            let e = self.locks.entry(k.clone()).or_insert((0, site.clone()));
            e.0 += n;
        }
    }

    /// Continuations run per second between the first reading and the last; `None` with
    /// one reading (or a counter that went back: another JVM under the same pid).
    pub fn runs_per_second(&self) -> Option<f64> {
        let secs = self
            .last
            .0
            .saturating_duration_since(self.first.0)
            .as_secs_f64();
        let runs = self.last.1.checked_sub(self.first.1)?;
        (secs > 0.0).then(|| runs as f64 / secs)
    }
}

impl Census {
    /// Adds one dump of process `tgid`.
    pub fn add(&mut self, tgid: u32, threads: &[(u32, Waiting)]) {
        let p = self.processes.entry(tgid).or_default();
        p.dumps += 1;
        for &(tid, w) in threads {
            let one = match w {
                Waiting::Lock => WaitCounts { lock: 1, work: 0 },
                Waiting::Work => WaitCounts { lock: 0, work: 1 },
            };
            p.waiting += one;
            *self.threads.entry(tid).or_default() += one;
        }
    }

    /// Adds one reading of the virtual threads of process `tgid`, in `cgroup`.
    pub fn add_virtual(&mut self, tgid: u32, cgroup: u64, r: &VirtualReading) {
        self.merge_virtual(tgid, VirtualProcess::of(cgroup, r));
    }

    fn merge_virtual(&mut self, tgid: u32, p: VirtualProcess) {
        match self.virtual_threads.entry(tgid) {
            std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().merge(&p),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(p);
            }
        }
    }

    pub fn extend(&mut self, other: &Census) {
        for (tgid, o) in &other.processes {
            let p = self.processes.entry(*tgid).or_default();
            p.dumps += o.dumps;
            p.waiting += o.waiting;
        }
        for (tid, c) in &other.threads {
            *self.threads.entry(*tid).or_default() += *c;
        }
        for (tgid, v) in &other.virtual_threads {
            self.merge_virtual(*tgid, v.clone());
        }
    }

    pub fn is_empty(&self) -> bool {
        self.processes.is_empty() && self.virtual_threads.is_empty()
    }
}

/// What is asked of a JVM: a thread dump of its platform threads, or a reading of its virtual
/// threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Ask {
    Platform,
    /// In this cgroup; with the JSON dump, or the scheduler's counter alone.
    Virtual {
        cgroup: u64,
        dump: bool,
    },
}

impl Ask {
    /// Its kind, the same whatever the cgroup and the dump.
    fn kind(self) -> Self {
        match self {
            Ask::Virtual { .. } => Ask::Virtual {
                cgroup: 0,
                dump: false,
            },
            k => k,
        }
    }
}

/// The dumps' thread: what to ask, and what it took.
type Worker = (mpsc::Sender<(u32, Ask)>, mpsc::Receiver<Taken>);

/// What a JVM answered.
#[derive(Debug)]
enum Answer {
    Platform(Vec<(u32, Waiting)>),
    /// `None`: it has no virtual threads.
    Virtual(Option<VirtualReading>),
}

/// One dump taken, or why not.
#[derive(Debug)]
struct Taken {
    tgid: u32,
    ask: Ask,
    result: Result<Answer, attach::AttachError>,
}

/// Takes thread dumps of the JVMs it is asked about, on a thread of its own (started at the
/// first ask), at most one a process per `every`; a JVM that cannot be attached (gone, `-Xrs`,
/// attach disabled, refused) is not asked again.
#[derive(Debug)]
pub struct ThreadDumps {
    every: Duration,
    worker: Option<Worker>,
    pending: HashSet<(u32, Ask)>,
    last: HashMap<(u32, Ask), Instant>,
    refused: HashSet<(u32, Ask)>,
    /// Whether each process asked about for its virtual threads is a JVM (read once from its
    /// mappings: `libjvm.so`), and when a JVM last said it had none.
    jvms: HashMap<u32, bool>,
    no_virtual: HashMap<u32, Instant>,
    /// Dumps taken, and attempts that failed (each failure is logged once per process).
    pub taken: u64,
    pub failed: u64,
}

impl ThreadDumps {
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            worker: None,
            pending: HashSet::new(),
            last: HashMap::new(),
            refused: HashSet::new(),
            jvms: HashMap::new(),
            no_virtual: HashMap::new(),
            taken: 0,
            failed: 0,
        }
    }

    /// Asks for a dump of process `tgid` unless one is under way, one was asked less than
    /// `every` ago, or the process cannot be attached.
    pub fn ask(&mut self, tgid: u32, now: Instant) {
        self.ask_for(tgid, Ask::Platform, now);
    }

    /// Asks for a reading of the virtual threads of process `tgid` (in `cgroup`) if it is a
    /// JVM, on the same terms: a JVM without virtual threads answers at the cost of reading
    /// its threads' names, and is asked again only after [`NO_VIRTUAL_AGAIN`]; one that
    /// cannot tell (before JDK 21) is not asked again. `dump`: with the JSON thread dump
    /// (what the virtual threads wait for), not only the scheduler's counter.
    pub fn ask_virtual(&mut self, tgid: u32, cgroup: u64, dump: bool, now: Instant) {
        if self.jvms.len() >= MAX_PROCESSES {
            self.jvms.clear();
        }
        let jvm = *self.jvms.entry(tgid).or_insert_with(|| maps_jvm(tgid));
        let lately_none = self
            .no_virtual
            .get(&tgid)
            .is_some_and(|t| now.saturating_duration_since(*t) < NO_VIRTUAL_AGAIN);
        if jvm && !lately_none {
            self.ask_for(tgid, Ask::Virtual { cgroup, dump }, now);
        }
    }

    fn ask_for(&mut self, tgid: u32, ask: Ask, now: Instant) {
        let key = (tgid, ask.kind());
        if self.refused.contains(&key) || self.pending.contains(&key) {
            return;
        }
        // Ticks an interval apart may read a hair under it apart.
        let due = self.every.mul_f64(0.9);
        if self
            .last
            .get(&key)
            .is_some_and(|t| now.saturating_duration_since(*t) < due)
        {
            return;
        }
        let (tx, _) = self.worker.get_or_insert_with(spawn);
        if tx.send((tgid, ask)).is_ok() {
            self.pending.insert(key);
            self.last.insert(key, now);
        }
    }

    /// The dumps finished since the last call, added to `census`.
    pub fn collect(&mut self, census: &mut Census) {
        let Some((_, rx)) = &self.worker else { return };
        while let Ok(t) = rx.try_recv() {
            let key = (t.tgid, t.ask.kind());
            self.pending.remove(&key);
            match t.result {
                Ok(Answer::Platform(threads)) => {
                    self.taken += 1;
                    census.add(t.tgid, &threads);
                }
                Ok(Answer::Virtual(Some(reading))) => {
                    self.taken += 1;
                    if let Ask::Virtual { cgroup, .. } = t.ask {
                        census.add_virtual(t.tgid, cgroup, &reading);
                    }
                }
                Ok(Answer::Virtual(None)) => {
                    self.no_virtual.insert(t.tgid, Instant::now());
                }
                Err(e) => {
                    self.failed += 1;
                    if self.refused.insert(key) {
                        log::info!("no thread dump of JVM {}: {e}", t.tgid);
                    }
                }
            }
        }
    }

    /// Forgets processes that are gone.
    pub fn retain(&mut self, alive: impl Fn(u32) -> bool) {
        self.last.retain(|(p, _), _| alive(*p));
        self.refused.retain(|(p, _)| alive(*p));
        self.jvms.retain(|p, _| alive(*p));
        self.no_virtual.retain(|p, _| alive(*p));
    }
}

fn spawn() -> Worker {
    let (ask_tx, ask_rx) = mpsc::channel::<(u32, Ask)>();
    let (done_tx, done_rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("jvm-dumps".into())
        .spawn(move || {
            for (tgid, ask) in ask_rx {
                let result = match ask {
                    Ask::Platform => census_of(tgid).map(Answer::Platform),
                    Ask::Virtual { dump, .. } => virtual_reading(tgid, dump).map(Answer::Virtual),
                };
                if done_tx.send(Taken { tgid, ask, result }).is_err() {
                    break;
                }
            }
        });
    if let Err(e) = spawned {
        log::warn!("cannot start the JVM thread-dump thread: {e}");
    }
    (ask_tx, done_rx)
}

/// One dump of `tgid`: each thread found waiting, by its host thread id.
pub fn census_of(tgid: u32) -> Result<Vec<(u32, Waiting)>, attach::AttachError> {
    let text = attach::thread_dump(tgid, ATTACH_TIMEOUT)?;
    let host = host_tids(tgid);
    Ok(dump::parse(&text)
        .into_iter()
        .filter_map(|t| {
            let w = t.waiting?;
            let tid = match &host {
                Some(map) => *map.get(&t.nid)?,
                None => t.nid,
            };
            Some((tid, w))
        })
        .collect())
}

/// A reading of `tgid`'s virtual threads: the scheduler's counter, then, with `dump`, a JSON
/// dump; `None` for a JVM without virtual threads (no thread of its virtual-thread
/// scheduler's, named `VirtualThread-…`, which the first virtual thread starts). The counter
/// is the scheduler's `toString`, printed by Java code in the JVM (no handshake with its
/// threads); the JSON dump snapshots every virtual thread in a handshake that can crash JDK 25
/// while they mount and unmount (JDK-8364343, tests/CORPUS.md).
pub fn virtual_reading(
    tgid: u32,
    dump: bool,
) -> Result<Option<VirtualReading>, attach::AttachError> {
    if !has_virtual_threads(tgid)? {
        return Ok(None);
    }
    let unreadable = |what: &str| attach::AttachError::Refused {
        pid: tgid,
        status: format!("{what} not understood"),
    };
    let text = attach::jcmd(tgid, ATTACH_TIMEOUT, "Thread.vthread_scheduler")?;
    let at = Instant::now();
    let scheduler =
        vthreads::parse_scheduler(&text).ok_or_else(|| unreadable("Thread.vthread_scheduler"))?;
    let census = if dump {
        let text = attach::virtual_thread_dump(tgid, ATTACH_TIMEOUT)?;
        Some(vthreads::parse_json(&text).ok_or_else(|| unreadable("the JSON thread dump"))?)
    } else {
        None
    };
    Ok(Some(VirtualReading {
        at,
        scheduler,
        census,
    }))
}

/// Whether `tgid` maps HotSpot (`libjvm.so`): read once a process.
fn maps_jvm(tgid: u32) -> bool {
    crate::files::kernel_text(format!("/proc/{tgid}/maps"))
        .is_some_and(|maps| super::runtime::maps_name(&maps, "libjvm.so"))
}

/// Whether a thread of `tgid` is its virtual-thread scheduler's (`VirtualThread-unparker`,
/// `VirtualThread-unblocker`).
fn has_virtual_threads(tgid: u32) -> Result<bool, attach::AttachError> {
    let proc = std::path::Path::new("/proc").join(tgid.to_string());
    if !proc.join("task").is_dir() {
        return Err(attach::AttachError::Gone(tgid));
    }
    Ok(super::runtime::count_threads_named(&proc, "VirtualThread-") > 0)
}

/// The host's thread id of each of the process's threads by its id in the process's PID
/// namespace; `None` when the process is in the agent's namespace (the ids are the same).
fn host_tids(tgid: u32) -> Option<HashMap<u32, u32>> {
    let task = std::path::Path::new("/proc")
        .join(tgid.to_string())
        .join("task");
    let status = crate::files::kernel_text(
        std::path::Path::new("/proc")
            .join(tgid.to_string())
            .join("status"),
    )?;
    if attach::ns_pid(&status).is_none_or(|ns| ns == tgid) {
        return None;
    }
    let mut map = HashMap::new();
    for entry in std::fs::read_dir(task).ok()?.flatten() {
        let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        if let Some(ns) = crate::files::kernel_text(entry.path().join("status"))
            .as_deref()
            .and_then(attach::ns_pid)
        {
            map.insert(ns, tid);
        }
    }
    Some(map)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn a_census_counts_each_threads_dumps() {
        let mut c = Census::default();
        c.add(10, &[(11, Waiting::Lock), (12, Waiting::Work)]);
        c.add(10, &[(11, Waiting::Lock), (12, Waiting::Lock)]);
        let mut total = Census::default();
        total.extend(&c);
        total.extend(&c);
        assert_eq!(total.processes[&10].dumps, 4);
        assert_eq!(
            total.processes[&10].waiting,
            WaitCounts { lock: 6, work: 2 }
        );
        assert_eq!(total.threads[&11], WaitCounts { lock: 4, work: 0 });
        assert_eq!(total.threads[&12].lock_share(), Some(0.5));
        assert_eq!(WaitCounts::default().lock_share(), None);
    }

    /// A reading of a JVM of 256 virtual threads, `lock` of them waiting for a lock.
    pub(crate) fn reading(
        at: Instant,
        steals: u64,
        lock: u32,
        top: Option<(&str, u32)>,
    ) -> VirtualReading {
        VirtualReading {
            at,
            scheduler: vthreads::Scheduler {
                parallelism: 2,
                steals,
                tasks: 0,
                submissions: 0,
            },
            census: Some(vthreads::VirtualCensus {
                threads: 256,
                mounted: 2,
                runnable: 0,
                lock,
                work: 254 - lock,
                top_lock: top.map(|(object, waiters)| vthreads::LockWaiters {
                    object: object.into(),
                    waiters,
                    site: Some("A.run(A.java:1)".into()),
                }),
            }),
        }
    }

    #[test]
    fn virtual_readings_add_up_over_steps() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut step1 = Census::default();
        step1.add_virtual(10, 7, &reading(t0, 1_000, 250, Some(("L@1", 250))));
        step1.add_virtual(10, 7, &reading(t0 + s, 5_000, 248, Some(("L@1", 248))));
        let mut step2 = Census::default();
        step2.add_virtual(10, 7, &reading(t0 + 3 * s, 13_000, 0, None));
        let mut window = Census::default();
        window.extend(&step2);
        window.extend(&step1);
        let p = &window.virtual_threads[&10];
        assert_eq!((p.cgroup, p.dumps, p.threads, p.lock), (7, 3, 768, 498));
        assert_eq!(p.first, (t0, 1_000));
        assert_eq!(p.last, (t0 + 3 * s, 13_000));
        assert_eq!(p.runs_per_second(), Some(4_000.0));
        assert_eq!(p.locks["L@1"].0, 498);
        assert!(!window.is_empty());
        // One reading: no rate.
        let mut one = Census::default();
        one.add_virtual(11, 7, &reading(t0, 9, 1, None));
        assert_eq!(one.virtual_threads[&11].runs_per_second(), None);
        // The counter alone (no dump asked): a rate, and nothing found waiting.
        let mut counted = Census::default();
        for (i, steals) in [(0, 100), (2, 900)] {
            let mut r = reading(t0 + i * s, steals, 0, None);
            r.census = None;
            counted.add_virtual(12, 8, &r);
        }
        let p = &counted.virtual_threads[&12];
        assert_eq!((p.cgroup, p.dumps, p.threads), (8, 0, 0));
        assert_eq!(p.runs_per_second(), Some(400.0));
    }

    #[test]
    fn a_process_is_asked_at_most_once_an_interval() {
        let mut d = ThreadDumps::new(Duration::from_secs(5));
        let t0 = Instant::now();
        // A process id no process has: the dump fails, and the process is not asked again.
        d.ask(4_000_001, t0);
        d.ask(4_000_001, t0);
        assert_eq!(d.pending.len(), 1);
        let mut c = Census::default();
        let deadline = Instant::now() + Duration::from_secs(5);
        while d.failed == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
            d.collect(&mut c);
        }
        assert_eq!((d.taken, d.failed), (0, 1));
        assert!(c.is_empty());
        d.ask(4_000_001, t0 + Duration::from_secs(10));
        assert!(d.pending.is_empty(), "a refused process is not asked again");
    }
}
