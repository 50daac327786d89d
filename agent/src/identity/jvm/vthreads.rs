//! A JVM's virtual threads, as the JVM accounts for them: what each waits for (the JSON thread
//! dump of JDK 21 and later, which lists them; a platform thread dump does not) and how often
//! its scheduler has mounted one (the scheduler's own counters).
//!
//! The kernel sees neither. A virtual thread that finds a lock held parks in the JVM: its
//! continuation is unmounted and its carrier (a platform thread of the scheduler's fork-join
//! pool) runs another. The carriers stay busy, so the futex probes see almost nothing: 15
//! hand-offs per CPU-second in a JVM whose 256 virtual threads share one `ReentrantLock` and
//! do 2.2× less work than with a lock each (tests/CORPUS.md, "Virtual threads"). And what the
//! dump finds them waiting for is not the lock's cost on its own: virtual threads are not
//! preempted, so every unmounted one waits where it last blocked, and a lock nearly always
//! free still holds all but the running few in its queue (253 of 256 in a program the lock
//! does not slow down at all). What tells the lock's cost is how often it is handed on — each
//! hand-off an unpark, a park and a remount on a carrier — which the scheduler counts.

use serde::Deserialize;

use super::dump::{Waiting, blocker_kind, frame_kind, is_queue_take};

/// The virtual-thread scheduler's counters, as `jcmd <pid> Thread.vthread_scheduler` prints
/// them (its `ForkJoinPool`'s `toString`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scheduler {
    /// Carriers it may run at once.
    pub parallelism: u32,
    /// Tasks (virtual threads' continuations) its carriers ran from another carrier's queue,
    /// or from outside: cumulative. A virtual thread handed a lock is unparked onto the
    /// queue of the carrier that released it and mostly run by another.
    pub steals: u64,
    /// Tasks queued: by carriers, and from outside the pool.
    pub tasks: u64,
    pub submissions: u64,
}

/// Reads `…ForkJoinPool@7f5a08a7[Running, parallelism = 2, size = 2, active = 2, running = 0,
/// steals = 2754612, tasks = 1, submissions = 0]`.
pub fn parse_scheduler(text: &str) -> Option<Scheduler> {
    let inner = text.split_once("ForkJoinPool@")?.1;
    let inner = inner.split_once('[')?.1.split_once(']')?.0;
    let mut s = Scheduler::default();
    let mut seen = 0;
    for field in inner.split(',') {
        let Some((name, value)) = field.split_once('=') else {
            continue;
        };
        let value = value.trim();
        match name.trim() {
            "parallelism" => s.parallelism = value.parse().ok()?,
            "steals" => s.steals = value.parse().ok()?,
            "tasks" => s.tasks = value.parse().ok()?,
            "submissions" => s.submissions = value.parse().ok()?,
            _ => continue,
        }
        seen += 1;
    }
    (seen == 4).then_some(s)
}

/// What one JSON thread dump found the JVM's virtual threads doing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VirtualCensus {
    /// Virtual threads listed.
    pub threads: u32,
    /// On a carrier.
    pub mounted: u32,
    /// Ready, waiting for a carrier.
    pub runnable: u32,
    /// Waiting for a lock: a monitor's entry (`BLOCKED`), or parked on a lock's synchronizer.
    pub lock: u32,
    /// Waiting for work or an event: a condition, a queue, a future, a sleep.
    pub work: u32,
    /// The lock the most wait for, when any does.
    pub top_lock: Option<LockWaiters>,
}

/// The virtual threads waiting for one lock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockWaiters {
    /// The lock's object, as the dump names it (`java.util.concurrent.locks.ReentrantLock$NonfairSync@7b836878`).
    pub object: String,
    pub waiters: u32,
    /// The code that takes it: the first frame of its first waiter outside the JDK.
    pub site: Option<String>,
}

#[derive(Deserialize)]
struct Document {
    #[serde(rename = "threadDump")]
    thread_dump: Dump,
}

#[derive(Deserialize)]
struct Dump {
    #[serde(rename = "threadContainers", default)]
    containers: Vec<Container>,
}

#[derive(Deserialize)]
struct Container {
    #[serde(default)]
    threads: Vec<Thread>,
}

#[derive(Deserialize)]
struct Thread {
    #[serde(rename = "virtual", default)]
    is_virtual: bool,
    #[serde(default)]
    state: Option<String>,
    #[serde(rename = "parkBlocker", default)]
    park_blocker: Option<Blocker>,
    #[serde(rename = "blockedOn", default)]
    blocked_on: Option<String>,
    #[serde(default)]
    carrier: Option<String>,
    #[serde(default)]
    stack: Vec<String>,
}

#[derive(Deserialize)]
struct Blocker {
    #[serde(default)]
    object: Option<String>,
}

/// Reads a JSON thread dump (`Thread.dump_to_file -format=json`); `None` when it is not one.
pub fn parse_json(text: &str) -> Option<VirtualCensus> {
    let doc: Document = serde_json::from_str(text).ok()?;
    let mut c = VirtualCensus::default();
    let mut locks: std::collections::HashMap<String, LockWaiters> = Default::default();
    for t in doc
        .thread_dump
        .containers
        .iter()
        .flat_map(|c| &c.threads)
        .filter(|t| t.is_virtual)
    {
        c.threads += 1;
        if t.carrier.is_some() {
            c.mounted += 1;
            continue;
        }
        let frames: Vec<&str> = t.stack.iter().map(|f| without_module(f)).collect();
        let (waiting, object) = match t.state.as_deref() {
            Some("RUNNABLE") => {
                c.runnable += 1;
                continue;
            }
            Some("BLOCKED") => (Some(Waiting::Lock), t.blocked_on.clone()),
            _ => {
                let object = t.park_blocker.as_ref().and_then(|b| b.object.clone());
                let class = object.as_deref().map(|o| o.split('@').next().unwrap_or(o));
                let mut kind = class.and_then(blocker_kind);
                if kind == Some(Waiting::Lock) && frames.iter().take(12).any(|f| is_queue_take(f)) {
                    // A queue's own lock, taken inside its take: waiting for work.
                    kind = Some(Waiting::Work);
                }
                let kind = kind
                    .or_else(|| frames.iter().take(12).find_map(|f| frame_kind(f)))
                    .unwrap_or(Waiting::Work);
                (Some(kind), object)
            }
        };
        match waiting {
            Some(Waiting::Lock) => {
                c.lock += 1;
                let site = frames
                    .iter()
                    .find(|f| !is_jdk_frame(f))
                    .map(|f| (*f).to_owned());
                let key = object.unwrap_or_else(|| site.clone().unwrap_or_default());
                let entry = locks.entry(key.clone()).or_insert_with(|| LockWaiters {
                    object: key,
                    waiters: 0,
                    site,
                });
                entry.waiters += 1;
            }
            _ => c.work += 1,
        }
    }
    c.top_lock = locks
        .into_values()
        .max_by(|a, b| a.waiters.cmp(&b.waiters).then(b.object.cmp(&a.object)));
    Some(c)
}

/// A frame without its module (`java.base/java.lang.Thread.sleep(Thread.java:540)` →
/// `java.lang.Thread.sleep(Thread.java:540)`).
fn without_module(frame: &str) -> &str {
    let method = frame.split_once('(').map_or(frame, |(m, _)| m);
    match method.find('/') {
        Some(i) => &frame[i + 1..],
        None => frame,
    }
}

/// A frame of the JDK's own classes.
fn is_jdk_frame(frame: &str) -> bool {
    ["java.", "javax.", "jdk.", "sun.", "com.sun."]
        .iter()
        .any(|p| frame.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedulers_counters_are_read() {
        // `jcmd <pid> Thread.vthread_scheduler` of Temurin 25.0.3, tests/corpus/VirtualThreads.java.
        let text = "14213:\njava.util.concurrent.ForkJoinPool@7f5a08a7[Running, parallelism = 2, \
                    size = 2, active = 2, running = 0, steals = 2754612, tasks = 1, \
                    submissions = 0]\n";
        assert_eq!(
            parse_scheduler(text),
            Some(Scheduler {
                parallelism: 2,
                steals: 2_754_612,
                tasks: 1,
                submissions: 0
            })
        );
        assert_eq!(
            parse_scheduler("14213:\nUnknown diagnostic command\n"),
            None
        );
        assert_eq!(parse_scheduler("ForkJoinPool@1[steals = x]"), None);
    }

    /// Excerpts of Temurin 25.0.3's JSON dumps of tests/corpus/VirtualThreads.java's modes
    /// (`lock`, `monitor`, `queue`), 2026-11-30: two virtual threads parked on the lock, one
    /// mounted, one blocked on a monitor, one in a queue's `take`, one sleeping, a carrier and
    /// `main` (platform threads: not counted).
    const DUMP: &str = r#"{"threadDump": {"processId": "9722", "time": "2026-11-30T21:10:48.614533867Z", "runtimeVersion": "25.0.3+9-LTS",
 "threadContainers": [
  {"container": "<root>", "parent": null, "owner": null, "threadCount": "264", "threads": [
   {"tid": "3", "time": "2026-11-30T21:10:48.639560864Z", "name": "main", "state": "TIMED_WAITING", "stack": ["java.base/java.lang.Thread.sleepNanos0(Native Method)", "java.base/java.lang.Thread.sleepNanos(Thread.java:509)", "java.base/java.lang.Thread.sleep(Thread.java:540)", "VtLock.main(VtLock.java:21)"]},
   {"tid": "22", "time": "2026-11-30T21:10:48.659235198Z", "virtual": true, "name": "", "state": "WAITING", "parkBlocker": {"object": "java.util.concurrent.locks.ReentrantLock$NonfairSync@7b836878"}, "stack": ["java.base/java.lang.VirtualThread.park(VirtualThread.java:742)", "java.base/java.lang.System$1.parkVirtualThread(System.java:2285)", "java.base/java.util.concurrent.locks.LockSupport.park(LockSupport.java:221)", "java.base/java.util.concurrent.locks.AbstractQueuedSynchronizer.acquire(AbstractQueuedSynchronizer.java:790)", "java.base/java.util.concurrent.locks.AbstractQueuedSynchronizer.acquire(AbstractQueuedSynchronizer.java:1030)", "java.base/java.util.concurrent.locks.ReentrantLock$Sync.lock(ReentrantLock.java:154)", "java.base/java.util.concurrent.locks.ReentrantLock.lock(ReentrantLock.java:323)", "VtLock.lambda$main$0(VtLock.java:14)", "java.base/java.lang.VirtualThread.run(VirtualThread.java:460)"]},
   {"tid": "24", "time": "2026-11-30T21:10:48.659457059Z", "virtual": true, "name": "", "state": "WAITING", "parkBlocker": {"object": "java.util.concurrent.locks.ReentrantLock$NonfairSync@7b836878"}, "stack": ["java.base/java.lang.VirtualThread.park(VirtualThread.java:742)", "java.base/java.lang.System$1.parkVirtualThread(System.java:2285)", "java.base/java.util.concurrent.locks.LockSupport.park(LockSupport.java:221)", "java.base/java.util.concurrent.locks.AbstractQueuedSynchronizer.acquire(AbstractQueuedSynchronizer.java:790)", "java.base/java.util.concurrent.locks.AbstractQueuedSynchronizer.acquire(AbstractQueuedSynchronizer.java:1030)", "java.base/java.util.concurrent.locks.ReentrantLock$Sync.lock(ReentrantLock.java:154)", "java.base/java.util.concurrent.locks.ReentrantLock.lock(ReentrantLock.java:323)", "VtLock.lambda$main$0(VtLock.java:14)", "java.base/java.lang.VirtualThread.run(VirtualThread.java:460)"]},
   {"tid": "67", "time": "2026-11-30T21:10:48.678480352Z", "virtual": true, "name": "", "state": "RUNNABLE", "stack": ["java.base/java.util.concurrent.locks.ReentrantLock.lock(ReentrantLock.java:323)", "VtLock.lambda$main$0(VtLock.java:14)", "java.base/java.lang.VirtualThread.run(VirtualThread.java:460)"], "carrier": "23"},
   {"tid": "68", "time": "2026-11-30T21:21:42.204554503Z", "virtual": true, "name": "vt-0", "state": "BLOCKED", "blockedOn": "java.lang.Object@c36e8e", "stack": ["VirtualThreads.monitor(VirtualThreads.java:101)", "VirtualThreads.lambda$main$2(VirtualThreads.java:57)", "java.base/java.lang.VirtualThread.run(VirtualThread.java:460)"]},
   {"tid": "69", "time": "2026-11-30T21:21:46.319286347Z", "virtual": true, "name": "vt-0", "state": "WAITING", "parkBlocker": {"object": "java.util.concurrent.locks.AbstractQueuedSynchronizer$ConditionObject@411ba443"}, "stack": ["java.base/java.lang.VirtualThread.park(VirtualThread.java:742)", "java.base/java.lang.System$1.parkVirtualThread(System.java:2285)", "java.base/java.util.concurrent.locks.LockSupport.park(LockSupport.java:367)", "java.base/java.util.concurrent.locks.AbstractQueuedSynchronizer$ConditionNode.block(AbstractQueuedSynchronizer.java:520)", "java.base/java.util.concurrent.ForkJoinPool.unmanagedBlock(ForkJoinPool.java:4364)", "java.base/java.util.concurrent.ForkJoinPool.managedBlock(ForkJoinPool.java:4310)", "java.base/java.util.concurrent.locks.AbstractQueuedSynchronizer$ConditionObject.await(AbstractQueuedSynchronizer.java:1752)", "java.base/java.util.concurrent.LinkedBlockingQueue.take(LinkedBlockingQueue.java:435)", "VirtualThreads.consume(VirtualThreads.java:114)", "VirtualThreads.lambda$main$3(VirtualThreads.java:58)", "java.base/java.lang.VirtualThread.run(VirtualThread.java:460)"]},
   {"tid": "70", "time": "2026-11-30T21:10:48.639560864Z", "virtual": true, "name": "", "state": "TIMED_WAITING", "stack": ["java.base/java.lang.VirtualThread.parkNanos(VirtualThread.java:792)", "java.base/java.lang.VirtualThread.sleepNanos(VirtualThread.java:1116)", "java.base/java.lang.Thread.sleep(Thread.java:540)", "Sl.lambda$main$0(Sl.java:1)"]},
   {"tid": "71", "time": "2026-11-30T21:10:48.679560864Z", "virtual": true, "name": "", "state": "RUNNABLE", "stack": ["Sl.lambda$main$0(Sl.java:1)"]}
  ]},
  {"container": "ForkJoinPool-1/jdk.internal.vm.SharedThreadContainer@6d7901f8", "parent": "<root>", "owner": null, "threadCount": "2", "threads": [
   {"tid": "23", "time": "2026-11-30T21:10:48.730820397Z", "name": "ForkJoinPool-1-worker-1", "state": "RUNNABLE", "stack": ["java.base/jdk.internal.vm.Continuation.run(Continuation.java:254)", "java.base/java.lang.VirtualThread.runContinuation(VirtualThread.java:297)"]}
  ]}
 ]}}"#;

    #[test]
    fn a_json_dump_tells_what_each_virtual_thread_waits_for() {
        let c = parse_json(DUMP).expect("a JSON dump");
        assert_eq!(
            (c.threads, c.mounted, c.runnable, c.lock, c.work),
            (7, 1, 1, 3, 2),
            "{c:?}"
        );
        assert_eq!(
            c.top_lock,
            Some(LockWaiters {
                object: "java.util.concurrent.locks.ReentrantLock$NonfairSync@7b836878".into(),
                waiters: 2,
                site: Some("VtLock.lambda$main$0(VtLock.java:14)".into()),
            })
        );
        assert_eq!(parse_json("12345:\nUnknown diagnostic command"), None);
        assert_eq!(
            parse_json(r#"{"threadDump": {"threadContainers": []}}"#),
            Some(VirtualCensus::default())
        );
    }

    #[test]
    fn frames_lose_their_module() {
        assert_eq!(
            without_module("java.base/java.lang.Thread.sleep(Thread.java:540)"),
            "java.lang.Thread.sleep(Thread.java:540)"
        );
        assert_eq!(
            without_module("app@1.0/com.example.Svc.run(Svc.java:3)"),
            "com.example.Svc.run(Svc.java:3)"
        );
        assert_eq!(
            without_module("VtLock.main(VtLock.java:21)"),
            "VtLock.main(VtLock.java:21)"
        );
        assert!(is_jdk_frame("java.lang.Thread.sleep(Thread.java:540)"));
        assert!(!is_jdk_frame("VtLock.main(VtLock.java:21)"));
    }
}
