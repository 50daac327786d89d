//! What each thread of a HotSpot thread dump is waiting for: a lock, or work.
//!
//! A parked thread's dump names the object it parked for (`- parking to wait for <…> (a
//! java.util.concurrent.locks.ReentrantLock$NonfairSync)`: the thread's `parkBlocker`), a
//! thread blocked on a monitor the monitor (`- waiting to lock <…>`), and a thread in
//! `Object.wait` the object it waits on (`- waiting on <…>`). These say what the kernel cannot:
//! a JVM parks each thread on a futex word of its own, so the kernel sees a pool's worker
//! woken by a producer's `signal` and a lock's waiter woken by the holder's `unlock` alike.

/// What a dumped thread was waiting for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waiting {
    /// A lock: a monitor's entry, or parked on a lock's synchronizer (`ReentrantLock`'s,
    /// `ReentrantReadWriteLock`'s, a `Semaphore`'s, a `StampedLock`).
    Lock,
    /// Work or an event: a condition (`Condition.await`, `Object.wait`), a queue's hand-off, a
    /// future, a latch, an idle fork-join worker.
    Work,
}

/// One thread of a dump.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpedThread {
    /// The thread's id in the JVM's PID namespace (`nid=0x…`).
    pub nid: u32,
    /// What it waited for; `None` when running, sleeping, or parked for something the dump
    /// does not name (a blocker of a class not known here, no blocker at all).
    pub waiting: Option<Waiting>,
}

/// Park blockers that are locks (the class's name ends with one of these).
const LOCK_BLOCKERS: &[&str] = &[
    "locks.ReentrantLock$NonfairSync",
    "locks.ReentrantLock$FairSync",
    "locks.ReentrantReadWriteLock$NonfairSync",
    "locks.ReentrantReadWriteLock$FairSync",
    "java.util.concurrent.Semaphore$NonfairSync",
    "java.util.concurrent.Semaphore$FairSync",
    "locks.StampedLock",
];

/// Park blockers that are waits for work or an event.
const WORK_BLOCKERS: &[&str] = &[
    // A `Condition`: a queue's `notEmpty`/`notFull`, any `await`.
    "$ConditionObject",
    // `SynchronousQueue` (a cached pool's hand-off) and `LinkedTransferQueue`, JDK 17 and 21.
    "java.util.concurrent.SynchronousQueue$TransferStack",
    "java.util.concurrent.SynchronousQueue$TransferQueue",
    "java.util.concurrent.SynchronousQueue$Transferer",
    "java.util.concurrent.LinkedTransferQueue",
    "java.util.concurrent.LinkedTransferQueue$DualNode",
    // An idle fork-join worker (the common pool, virtual threads' carriers).
    "java.util.concurrent.ForkJoinPool",
    "java.util.concurrent.CountDownLatch$Sync",
    "java.util.concurrent.FutureTask",
    "java.util.concurrent.CompletableFuture$Signaller",
    "java.util.concurrent.Phaser$QNode",
    "java.util.concurrent.Exchanger",
];

/// Parses a thread dump (`jstack`'s, or the attach mechanism's `threaddump`).
pub fn parse(text: &str) -> Vec<DumpedThread> {
    let mut threads = Vec::new();
    let mut current: Option<DumpedThread> = None;
    // Whether the current thread's top frame has been passed: only what it waits for there
    // counts (a `- waiting on` further down is a monitor the thread holds).
    let mut decided = false;
    let mut frames = 0;
    for line in text.lines() {
        if line.starts_with('"') {
            threads.extend(current.take());
            current = nid(line).map(|nid| DumpedThread { nid, waiting: None });
            decided = false;
            frames = 0;
            continue;
        }
        let Some(t) = current.as_mut() else { continue };
        let l = line.trim_start();
        if decided {
            continue;
        }
        if let Some(rest) = l.strip_prefix("- parking to wait for") {
            t.waiting = class(rest).and_then(blocker_kind);
            // A lock: unless it is a queue's, taken inside the queue's take (below).
            if t.waiting == Some(Waiting::Work) {
                decided = true;
            }
        } else if l.starts_with("- waiting to lock") || l.starts_with("- waiting to re-lock") {
            t.waiting = Some(Waiting::Lock);
            decided = true;
        } else if l.starts_with("- waiting on") {
            t.waiting = Some(Waiting::Work);
            decided = true;
        } else if let Some(frame) = l.strip_prefix("at ") {
            frames += 1;
            if t.waiting == Some(Waiting::Lock) {
                // Parked on a lock: a queue's own, taken inside its `take` or `poll` by a worker
                // waiting for work, counts with the wait for work, as a mutex reacquired inside
                // a condition wait does (Tomcat's 200 workers queue on `LinkedBlockingQueue`'s
                // take lock, 2–22 at a time, while its poller limits the work).
                if is_queue_take(frame) {
                    t.waiting = Some(Waiting::Work);
                    decided = true;
                } else if frames > 10 {
                    decided = true;
                }
            } else if let Some(kind) = frame_kind(frame) {
                // A parked thread whose blocker said nothing: the frames say what parked it.
                t.waiting = Some(kind);
                decided = true;
            } else if frames > 8 {
                decided = true;
            }
        }
    }
    threads.extend(current);
    threads
}

/// `nid=0x1a2b` of a thread's header line.
fn nid(header: &str) -> Option<u32> {
    let hex = header
        .split_whitespace()
        .find_map(|w| w.strip_prefix("nid=0x"))?;
    u32::from_str_radix(hex, 16).ok()
}

/// `(a java.util.concurrent.locks.ReentrantLock$NonfairSync)` → the class name.
fn class(rest: &str) -> Option<&str> {
    let inner = rest.split_once("(a ")?.1;
    Some(inner.split_once(')').map_or(inner, |(c, _)| c).trim())
}

/// What a park blocker's class says the thread waits for.
pub(super) fn blocker_kind(class: &str) -> Option<Waiting> {
    if LOCK_BLOCKERS.iter().any(|s| class.ends_with(s)) {
        Some(Waiting::Lock)
    } else if WORK_BLOCKERS.iter().any(|s| class.ends_with(s)) {
        Some(Waiting::Work)
    } else {
        None
    }
}

/// Whether a frame is a blocking queue's take (`LinkedBlockingQueue.take`, `ArrayBlockingQueue.poll`,
/// `LinkedBlockingDeque.takeFirst`, `ScheduledThreadPoolExecutor$DelayedWorkQueue.take`, a
/// subclass such as Tomcat's `TaskQueue.take`): a consumer waiting for work.
pub(super) fn is_queue_take(frame: &str) -> bool {
    let method = frame.split_once('(').map_or(frame, |(m, _)| m);
    let Some((class, name)) = method.rsplit_once('.') else {
        return false;
    };
    let simple = class.rsplit(['.', '$']).next().unwrap_or(class);
    (simple.ends_with("Queue") || simple.ends_with("Deque"))
        && matches!(
            name,
            "take" | "poll" | "takeFirst" | "takeLast" | "pollFirst" | "pollLast"
        )
}

/// What a frame of a parked thread says it waits for, where its blocker did not: a condition's
/// `await`, or a synchronizer's `acquire` (a lock built on `AbstractQueuedSynchronizer`).
pub(super) fn frame_kind(frame: &str) -> Option<Waiting> {
    let method = frame.split_once('(').map_or(frame, |(m, _)| m);
    if method.contains("$ConditionObject.await") {
        Some(Waiting::Work)
    } else if method.starts_with("java.util.concurrent.locks.AbstractQueuedSynchronizer.acquire")
        || method.starts_with("java.util.concurrent.locks.AbstractQueuedLongSynchronizer.acquire")
    {
        Some(Waiting::Lock)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Excerpts of OpenJDK 17's dumps of tests/corpus/Corpus.java's modes (`jstack`, 2026-11-30).
    const DUMP: &str = r#"2026-11-30 17:38:06
Full thread dump OpenJDK 64-Bit Server VM (17.0.15+6-Debian-1deb12u1 mixed mode, sharing):

Threads class SMR info:
_java_thread_list=0x00007fa2f0002e70, length=46, elements={
0x00007fa388017ed0, 0x00007fa3880f83c0
}

"main" #1 prio=5 os_prio=0 cpu=36.72ms elapsed=4.22s tid=0x00007fa388017ed0 nid=0x45a2 waiting on condition  [0x00007fa38c5fe000]
   java.lang.Thread.State: TIMED_WAITING (sleeping)
	at java.lang.Thread.sleep(java.base@17.0.15/Native Method)
	at Corpus.main(Corpus.java:283)

"Finalizer" #3 daemon prio=8 os_prio=0 cpu=0.12ms elapsed=4.20s tid=0x00007f1bf40f97c0 nid=0x4718 in Object.wait()  [0x00007f1bd0481000]
   java.lang.Thread.State: WAITING (on object monitor)
	at java.lang.Object.wait(java.base@17.0.15/Native Method)
	- waiting on <0x000000069dc007c0> (a java.lang.ref.ReferenceQueue$Lock)
	at java.lang.ref.ReferenceQueue.remove(java.base@17.0.15/ReferenceQueue.java:155)
	- locked <0x000000069dc007c0> (a java.lang.ref.ReferenceQueue$Lock)

"Thread-9" #21 prio=5 os_prio=0 cpu=137.17ms elapsed=4.17s tid=0x00007fa388141ee0 nid=0x45bd waiting on condition  [0x00007fa3063fd000]
   java.lang.Thread.State: WAITING (parking)
	at jdk.internal.misc.Unsafe.park(java.base@17.0.15/Native Method)
	- parking to wait for  <0x000000069ec04f80> (a java.util.concurrent.locks.ReentrantLock$NonfairSync)
	at java.util.concurrent.locks.LockSupport.park(java.base@17.0.15/LockSupport.java:211)
	at java.util.concurrent.locks.AbstractQueuedSynchronizer.acquire(java.base@17.0.15/AbstractQueuedSynchronizer.java:715)

"Thread-3" #15 prio=5 os_prio=0 cpu=140.75ms elapsed=4.33s tid=0x00007f2a0815b7d0 nid=0x461c waiting for monitor entry  [0x00007f29e05fd000]
   java.lang.Thread.State: BLOCKED (on object monitor)
	at Corpus.monitorWorker(Corpus.java:58)
	- waiting to lock <0x000000069ecdc6e8> (a java.lang.Object)
	at Corpus.lambda$main$2(Corpus.java:170)

"pool-1-thread-9" #20 prio=5 os_prio=0 cpu=173.65ms elapsed=4.28s tid=0x00007fc50c1286b0 nid=0x4537 waiting on condition  [0x00007fc4d93fd000]
   java.lang.Thread.State: WAITING (parking)
	at jdk.internal.misc.Unsafe.park(java.base@17.0.15/Native Method)
	- parking to wait for  <0x000000069ec0b6a0> (a java.util.concurrent.locks.AbstractQueuedSynchronizer$ConditionObject)
	at java.util.concurrent.locks.LockSupport.park(java.base@17.0.15/LockSupport.java:341)
	at java.util.concurrent.LinkedBlockingQueue.take(java.base@17.0.15/LinkedBlockingQueue.java:435)
	- locked <0x000000069ec0b6b0> (a java.lang.Object)

"fair-7" #19 prio=5 os_prio=0 cpu=1.0ms elapsed=4.28s tid=0x00007fc50c1286b1 nid=0x4540 waiting on condition  [0x00007fc4d93fd001]
   java.lang.Thread.State: WAITING (parking)
	at jdk.internal.misc.Unsafe.park(java.base@17.0.15/Native Method)
	- parking to wait for  <0x000000069ec0b6a1> (a java.util.concurrent.locks.ReentrantLock$FairSync)

"custom" #22 prio=5 os_prio=0 cpu=1.0ms elapsed=4.28s tid=0x00007fc50c1286b2 nid=0x4541 waiting on condition  [0x00007fc4d93fd002]
   java.lang.Thread.State: WAITING (parking)
	at jdk.internal.misc.Unsafe.park(java.base@17.0.15/Native Method)
	- parking to wait for  <0x000000069ec0b6a2> (a com.example.MyLock$Sync)
	at java.util.concurrent.locks.LockSupport.park(java.base@17.0.15/LockSupport.java:211)
	at java.util.concurrent.locks.AbstractQueuedSynchronizer.acquire(java.base@17.0.15/AbstractQueuedSynchronizer.java:715)

"bare-park" #23 prio=5 os_prio=0 cpu=1.0ms elapsed=4.28s tid=0x00007fc50c1286b3 nid=0x4542 waiting on condition  [0x00007fc4d93fd003]
   java.lang.Thread.State: WAITING (parking)
	at jdk.internal.misc.Unsafe.park(java.base@17.0.15/Native Method)
	at java.util.concurrent.locks.LockSupport.park(java.base@17.0.15/LockSupport.java:371)
	at Corpus.handoff(Corpus.java:90)

"http-nio-8080-exec-7" #40 daemon prio=5 os_prio=0 cpu=1.0ms elapsed=4.28s tid=0x00007fc50c1286b4 nid=0x4543 waiting on condition  [0x00007fc4d93fd004]
   java.lang.Thread.State: WAITING (parking)
	at jdk.internal.misc.Unsafe.park(java.base@17.0.15/Native Method)
	- parking to wait for  <0x000000069ec0b6a4> (a java.util.concurrent.locks.ReentrantLock$NonfairSync)
	at java.util.concurrent.locks.LockSupport.park(java.base@17.0.15/LockSupport.java:211)
	at java.util.concurrent.locks.AbstractQueuedSynchronizer.acquire(java.base@17.0.15/AbstractQueuedSynchronizer.java:715)
	at java.util.concurrent.locks.AbstractQueuedSynchronizer.acquireInterruptibly(java.base@17.0.15/AbstractQueuedSynchronizer.java:938)
	at java.util.concurrent.locks.ReentrantLock$Sync.lockInterruptibly(java.base@17.0.15/ReentrantLock.java:153)
	at java.util.concurrent.locks.ReentrantLock.lockInterruptibly(java.base@17.0.15/ReentrantLock.java:372)
	at java.util.concurrent.LinkedBlockingQueue.take(java.base@17.0.15/LinkedBlockingQueue.java:433)
	at org.apache.tomcat.util.threads.TaskQueue.take(TaskQueue.java:156)

"VM Thread" os_prio=0 cpu=1.47ms elapsed=4.21s tid=0x00007fa3880f2b20 nid=0x45a8 runnable

JNI global refs: 9, weak refs: 0
"#;

    #[test]
    fn each_thread_is_told_by_what_it_waits_for() {
        let got: Vec<(u32, Option<Waiting>)> =
            parse(DUMP).iter().map(|t| (t.nid, t.waiting)).collect();
        assert_eq!(
            got,
            vec![
                (0x45a2, None),                // sleeping
                (0x4718, Some(Waiting::Work)), // Object.wait
                (0x45bd, Some(Waiting::Lock)), // ReentrantLock
                (0x461c, Some(Waiting::Lock)), // monitor entry
                (0x4537, Some(Waiting::Work)), // a queue's condition
                (0x4540, Some(Waiting::Lock)), // a fair ReentrantLock
                (0x4541, Some(Waiting::Lock)), // an unknown synchronizer, by its acquire
                (0x4542, None),                // parked with no blocker
                (0x4543, Some(Waiting::Work)), // a queue's lock, inside its take
                (0x45a8, None),                // a VM thread
            ]
        );
    }

    #[test]
    fn only_the_top_frames_wait_counts() {
        // The monitor a thread holds further down ("- waiting on" of a frame below a park
        // would be a bug in the dump; a held lock is "- locked") must not decide it.
        let dump = "\"w\" #1 nid=0x10 waiting on condition\n   java.lang.Thread.State: WAITING (parking)\n\tat jdk.internal.misc.Unsafe.park(Native Method)\n\t- parking to wait for  <0x1> (a java.util.concurrent.locks.AbstractQueuedSynchronizer$ConditionObject)\n\tat Foo.bar(Foo.java:1)\n\t- waiting to lock <0x2> (a java.lang.Object)\n";
        assert_eq!(parse(dump)[0].waiting, Some(Waiting::Work));
    }

    #[test]
    fn blockers_are_told_by_class() {
        for (class, kind) in [
            (
                "java.util.concurrent.locks.ReentrantReadWriteLock$NonfairSync",
                Some(Waiting::Lock),
            ),
            (
                "java.util.concurrent.Semaphore$FairSync",
                Some(Waiting::Lock),
            ),
            (
                "java.util.concurrent.locks.StampedLock",
                Some(Waiting::Lock),
            ),
            ("java.util.concurrent.ForkJoinPool", Some(Waiting::Work)),
            (
                "java.util.concurrent.SynchronousQueue$TransferStack",
                Some(Waiting::Work),
            ),
            (
                "java.util.concurrent.CountDownLatch$Sync",
                Some(Waiting::Work),
            ),
            ("com.example.Unknown", None),
        ] {
            assert_eq!(blocker_kind(class), kind, "{class}");
        }
    }

    #[test]
    fn a_queues_take_is_told_from_other_frames() {
        for (frame, take) in [
            (
                "java.util.concurrent.LinkedBlockingQueue.take(java.base@17.0.15/LinkedBlockingQueue.java:433)",
                true,
            ),
            (
                "java.util.concurrent.ArrayBlockingQueue.poll(java.base@17/ArrayBlockingQueue.java:1)",
                true,
            ),
            (
                "java.util.concurrent.LinkedBlockingDeque.takeFirst(LinkedBlockingDeque.java:1)",
                true,
            ),
            (
                "java.util.concurrent.ScheduledThreadPoolExecutor$DelayedWorkQueue.take(x)",
                true,
            ),
            (
                "org.apache.tomcat.util.threads.TaskQueue.take(TaskQueue.java:156)",
                true,
            ),
            (
                "java.util.concurrent.LinkedBlockingQueue.put(LinkedBlockingQueue.java:1)",
                false,
            ),
            ("com.example.Cache.take(Cache.java:1)", false),
            (
                "java.util.concurrent.locks.ReentrantLock.lock(ReentrantLock.java:1)",
                false,
            ),
        ] {
            assert_eq!(is_queue_take(frame), take, "{frame}");
        }
    }
}
