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

    pub fn extend(&mut self, other: &Census) {
        for (tgid, o) in &other.processes {
            let p = self.processes.entry(*tgid).or_default();
            p.dumps += o.dumps;
            p.waiting += o.waiting;
        }
        for (tid, c) in &other.threads {
            *self.threads.entry(*tid).or_default() += *c;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.processes.is_empty()
    }
}

/// One dump taken, or why not.
#[derive(Debug)]
struct Taken {
    tgid: u32,
    result: Result<Vec<(u32, Waiting)>, attach::AttachError>,
}

/// Takes thread dumps of the JVMs it is asked about, on a thread of its own (started at the
/// first ask), at most one a process per `every`; a JVM that cannot be attached (gone, `-Xrs`,
/// attach disabled, refused) is not asked again.
#[derive(Debug)]
pub struct ThreadDumps {
    every: Duration,
    worker: Option<(mpsc::Sender<u32>, mpsc::Receiver<Taken>)>,
    pending: HashSet<u32>,
    last: HashMap<u32, Instant>,
    refused: HashSet<u32>,
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
            taken: 0,
            failed: 0,
        }
    }

    /// Asks for a dump of process `tgid` unless one is under way, one was asked less than
    /// `every` ago, or the process cannot be attached.
    pub fn ask(&mut self, tgid: u32, now: Instant) {
        if self.refused.contains(&tgid) || self.pending.contains(&tgid) {
            return;
        }
        // Ticks an interval apart may read a hair under it apart.
        let due = self.every.mul_f64(0.9);
        if self
            .last
            .get(&tgid)
            .is_some_and(|t| now.saturating_duration_since(*t) < due)
        {
            return;
        }
        let (tx, _) = self.worker.get_or_insert_with(spawn);
        if tx.send(tgid).is_ok() {
            self.pending.insert(tgid);
            self.last.insert(tgid, now);
        }
    }

    /// The dumps finished since the last call, added to `census`.
    pub fn collect(&mut self, census: &mut Census) {
        let Some((_, rx)) = &self.worker else { return };
        while let Ok(t) = rx.try_recv() {
            self.pending.remove(&t.tgid);
            match t.result {
                Ok(threads) => {
                    self.taken += 1;
                    census.add(t.tgid, &threads);
                }
                Err(e) => {
                    self.failed += 1;
                    if self.refused.insert(t.tgid) {
                        log::info!("no thread dump of JVM {}: {e}", t.tgid);
                    }
                }
            }
        }
    }

    /// Forgets processes that are gone.
    pub fn retain(&mut self, alive: impl Fn(u32) -> bool) {
        self.last.retain(|p, _| alive(*p));
        self.refused.retain(|p| alive(*p));
    }
}

fn spawn() -> (mpsc::Sender<u32>, mpsc::Receiver<Taken>) {
    let (ask_tx, ask_rx) = mpsc::channel::<u32>();
    let (done_tx, done_rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("jvm-dumps".into())
        .spawn(move || {
            for tgid in ask_rx {
                let result = census_of(tgid);
                if done_tx.send(Taken { tgid, result }).is_err() {
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
mod tests {
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
