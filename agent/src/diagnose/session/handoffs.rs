//! Telling a lock's hand-offs from a runtime's and from workers waiting for work, per cgroup,
//! from each thread's part in the window's hand-offs and the words its process waits on.

use std::collections::{HashMap, HashSet};

use crate::{
    collect::Window,
    diagnose::Handoffs,
    identity::{
        jvm::{Census, WaitCounts},
        runtime::{
            ProcessRuntime, Runtime, RuntimeCache, is_service_thread, parks_in_its_scheduler,
            sized_server,
        },
    },
};

use super::ResourceReader;

/// Reads the runtime of each process in `tick`'s hand-offs, and its threads' names, the first
/// time they are seen: while they live. Read at the end of the window instead, a process that
/// exited inside it (a job, a short JVM) had no runtime and no thread names, so its runtime's
/// own service threads counted as a lock's queue.
pub(super) fn name_while_alive(tick: &Window, cache: &mut RuntimeCache) {
    for (tid, t) in &tick.handoff_threads {
        if t.woken_waits == 0 && t.wakes == 0 {
            continue;
        }
        // A runtime that parks its threads itself (Go) is judged by the process alone.
        let names_matter = cache
            .process(t.tgid)
            .is_some_and(|p| !parks_in_its_scheduler(&p.runtime));
        if names_matter {
            cache.thread_name(t.tgid, *tid);
        }
    }
}

/// The JVMs in `tick`'s hand-offs whose threads that both waited for a hand-off and made one
/// (not HotSpot's service threads) were woken at least `min_per_second` times a second: those
/// whose threads' waits a thread dump can tell apart ([`crate::identity::jvm`]), where there
/// are enough of them to matter (the storm rule asks 100 a second per CPU at the least; a JVM
/// that hands off less is not worth a safepoint). Uses the runtimes [`name_while_alive`] read.
pub(super) fn jvms_handing_off(
    tick: &Window,
    cache: &mut RuntimeCache,
    min_per_second: f64,
) -> HashSet<u32> {
    let mut woken: HashMap<u32, u64> = HashMap::new();
    for (tid, t) in &tick.handoff_threads {
        if t.woken_waits == 0 || t.wakes == 0 {
            continue;
        }
        if cache
            .process(t.tgid)
            .is_none_or(|p| p.runtime != Runtime::Jvm)
        {
            continue;
        }
        if cache
            .thread_name(t.tgid, *tid)
            .is_some_and(|name| is_service_thread(&Runtime::Jvm, name))
        {
            continue;
        }
        *woken.entry(t.tgid).or_default() += t.woken_waits;
    }
    let least = min_per_second * tick.duration.as_secs_f64();
    woken
        .into_iter()
        .filter(|&(_, n)| n as f64 >= least)
        .map(|(tgid, _)| tgid)
        .collect()
}

/// The processes (by cgroup and process id) that park their threads on words of their own:
/// at least half of their futex waits, in the window, are on words only one thread waited on
/// (a JVM's per-thread park events, a Go M's note, `parking_lot`'s thread parkers). Their locks
/// hand off by one thread waking another's word, so whether a thread handed on the word it
/// waited on says nothing there. Counted in waits, not their time: a JVM's idle GC and
/// compiler threads wait long on shared monitors, while its lock's queue parks thousands of
/// times a second on per-thread words. Judged from the hot-futex words
/// ([`Window::process_words`]); a process with none on record is not in the set.
pub(super) fn parks_on_own_words(window: &Window) -> HashSet<(u64, u32)> {
    window
        .process_words
        .iter()
        .filter(|(_, w)| w.waits > 0 && 2 * w.own_word_waits >= w.waits)
        .map(|(k, _)| *k)
        .collect()
}

/// Splits each cgroup's hand-offs in `window` by the part their threads played (see
/// [`Handoffs`]): a thread of a runtime that parks its threads itself (Go), or one of a
/// runtime's named service threads (HotSpot's), is the runtime's. Otherwise, where the
/// process's threads queue on shared words, a thread's woken waits that it handed on (it woke
/// the word it had waited on: `relay_waits`) are a lock's, the rest are waits for work (a
/// condition variable's, signalled by a producer); where they park on words of their own
/// ([`parks_on_own_words`]), a thread that both waited for hand-offs and made them is a lock's,
/// and one that only waited is a worker waiting for work. A JVM's thread that thread dumps
/// (`census`) found waiting is judged by them instead: its woken waits are a lock's in the
/// share of those dumps that found it waiting for a lock (a thread never found waiting, in its
/// process's share). Returns, per cgroup, the split and
/// the processes involved. Uses the runtimes and names read while the window was observed
/// ([`name_while_alive`]), reads those of any not yet seen, and forgets those no longer in the
/// window.
pub(super) fn tell_handoffs_apart(
    window: &Window,
    cache: &mut RuntimeCache,
    census: &Census,
) -> HashMap<u64, (Handoffs, Vec<ProcessRuntime>)> {
    let mut out: HashMap<u64, (Handoffs, Vec<ProcessRuntime>)> = HashMap::new();
    let mut seen: HashMap<u64, HashSet<u32>> = HashMap::new();
    let own_words = parks_on_own_words(window);
    for (tid, t) in &window.handoff_threads {
        if t.woken_waits == 0 {
            continue;
        }
        let runtime = cache.process(t.tgid).map(|p| p.runtime.clone());
        let (h, procs) = out.entry(t.cgroup_id).or_default();
        let dumped = census
            .processes
            .get(&t.tgid)
            .filter(|p| p.waiting.lock + p.waiting.work > 0);
        if seen.entry(t.cgroup_id).or_default().insert(t.tgid) {
            if let Some(p) = cache.process(t.tgid) {
                procs.push(p.clone());
            }
            if let Some(d) = dumped {
                h.jvm_dumps += d.dumps;
                h.jvm_lock_waiting += d.waiting.lock;
                h.jvm_work_waiting += d.waiting.work;
            }
        }
        let runtime_thread = runtime.as_ref().is_some_and(|r| {
            parks_in_its_scheduler(r)
                || cache
                    .thread_name(t.tgid, *tid)
                    .is_some_and(|name| is_service_thread(r, name))
        });
        if runtime_thread {
            h.runtime_waits += t.woken_waits;
            h.runtime_wait_ns += t.woken_wait_ns;
            continue;
        }
        let dump_share = dumped.and_then(|p| {
            census
                .threads
                .get(tid)
                .and_then(WaitCounts::lock_share)
                .or_else(|| p.waiting.lock_share())
        });
        let (lock_waits, lock_ns) = if let Some(share) = dump_share {
            h.dump_judged_threads += 1;
            (
                (t.woken_waits as f64 * share).round() as u64,
                (t.woken_wait_ns as f64 * share).round() as u64,
            )
        } else if own_words.contains(&(t.cgroup_id, t.tgid)) {
            h.own_word_threads += 1;
            if t.wakes > 0 {
                (t.woken_waits, t.woken_wait_ns)
            } else {
                (0, 0)
            }
        } else {
            // A wait is credited as handed on at the wake that follows it, which may fall in
            // the next window: at most the window's woken waits.
            (
                t.relay_waits.min(t.woken_waits),
                t.relay_wait_ns.min(t.woken_wait_ns),
            )
        };
        if lock_waits > 0 {
            h.lock_waits += lock_waits;
            h.lock_wait_ns += lock_ns;
            h.lock_threads += 1;
        }
        h.work_waits += t.woken_waits - lock_waits;
        h.work_wait_ns += t.woken_wait_ns - lock_ns;
    }
    let tgids: HashSet<u32> = window.handoff_threads.values().map(|t| t.tgid).collect();
    let tids: HashSet<u32> = window.handoff_threads.keys().copied().collect();
    cache.retain(&tgids, &tids);
    for (_, procs) in out.values_mut() {
        procs.sort_by_key(|p| p.tgid);
    }
    out
}

/// Adds to each cgroup's processes (`out`, from [`tell_handoffs_apart`]) its native servers
/// that size a pool themselves ([`sized_server`]: Redis's I/O threads, memcached's and nginx's
/// event loops). Their threads spin, or sleep in `epoll_wait`, instead of parking on futexes,
/// so no hand-off brings them; each cgroup of the window with a path has its processes listed
/// once a window, and only their names read but for such a server.
pub(super) fn add_sized_servers(
    window: &Window,
    paths: &HashMap<u64, String>,
    reader: &dyn ResourceReader,
    out: &mut HashMap<u64, (Handoffs, Vec<ProcessRuntime>)>,
) {
    add_sized_servers_with(window, paths, reader, out, sized_server);
}

/// [`add_sized_servers`], with `server` reading a process (the tests stand in for `/proc`).
pub(super) fn add_sized_servers_with(
    window: &Window,
    paths: &HashMap<u64, String>,
    reader: &dyn ResourceReader,
    out: &mut HashMap<u64, (Handoffs, Vec<ProcessRuntime>)>,
    server: impl Fn(u32) -> Option<ProcessRuntime>,
) {
    for id in window.cgroups.keys() {
        let Some(path) = paths.get(id) else { continue };
        for tgid in reader.processes(path) {
            let known = out
                .get(id)
                .is_some_and(|(_, procs)| procs.iter().any(|p| p.tgid == tgid));
            if known {
                continue;
            }
            if let Some(p) = server(tgid) {
                let procs = &mut out.entry(*id).or_default().1;
                procs.push(p);
                procs.sort_by_key(|p| p.tgid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use stormwatch_common::{HotFutexKey, HotFutexValue, ThreadHandoff};

    use super::*;

    /// A process id no process has (pid_max is at most 2^22), so that no runtime is read.
    const TGID: u32 = 4_000_001;

    fn word(w: &mut Window, uaddr: u64, waits: u64, shared: bool) {
        w.hot_futexes.insert(
            HotFutexKey {
                cgroup_id: 7,
                uaddr,
                tgid: TGID,
                _pad: 0,
            },
            HotFutexValue {
                waits,
                wait_ns: waits * 1_000,
                shared: u32::from(shared),
                ..HotFutexValue::ZERO
            },
        );
        w.process_words = crate::collect::process_words(&w.hot_futexes);
    }

    fn thread(w: &mut Window, tid: u32, waits: u64, wakes: u64, relayed: u64) {
        w.handoff_threads.insert(
            tid,
            ThreadHandoff {
                cgroup_id: 7,
                tgid: TGID,
                woken_waits: waits,
                woken_wait_ns: waits * 1_000,
                wakes,
                relay_waits: relayed,
                relay_wait_ns: relayed * 1_000,
                ..ThreadHandoff::ZERO
            },
        );
    }

    /// A pool on shared words: a producer that only wakes; workers woken on the condition's
    /// word, 1 in 10 of whose waits was on the queue's mutex and handed on.
    fn pool(shared: bool) -> Window {
        let mut w = Window::empty();
        word(&mut w, 0x10, 9_000, shared);
        word(&mut w, 0x20, 1_000, shared);
        thread(&mut w, 1, 0, 500, 0);
        for tid in 2..6 {
            thread(&mut w, tid, 100, 20, 10);
        }
        w
    }

    #[test]
    fn on_shared_words_only_the_waits_a_thread_handed_on_are_a_locks() {
        let out = tell_handoffs_apart(
            &pool(true),
            &mut RuntimeCache::default(),
            &Census::default(),
        );
        let (h, _) = &out[&7];
        assert_eq!(
            (h.lock_waits, h.lock_wait_ns, h.lock_threads),
            (40, 40_000, 4)
        );
        assert_eq!((h.work_waits, h.work_wait_ns), (360, 360_000));
        assert_eq!(h.own_word_threads, 0);
        // Credited at the next wake, a relay may outrun the window's woken waits: at most
        // those.
        let mut w = pool(true);
        thread(&mut w, 9, 2, 5, 3);
        let out = tell_handoffs_apart(&w, &mut RuntimeCache::default(), &Census::default());
        assert_eq!(out[&7].0.lock_waits, 42);
        assert_eq!(out[&7].0.work_waits, 360);
    }

    #[test]
    fn on_words_of_their_own_threads_that_wait_and_wake_are_a_locks() {
        // Most wait time on words one thread waited on (a JVM's park events): whether a
        // thread woke its own word says nothing, so its part decides.
        let w = pool(false);
        assert_eq!(parks_on_own_words(&w), HashSet::from([(7, TGID)]));
        let out = tell_handoffs_apart(&w, &mut RuntimeCache::default(), &Census::default());
        let (h, _) = &out[&7];
        assert_eq!((h.lock_waits, h.lock_threads, h.work_waits), (400, 4, 0));
        assert_eq!(h.own_word_threads, 4);
        // Half the waits on shared words is enough to judge by the words.
        let mut half = Window::empty();
        word(&mut half, 0x10, 500, true);
        word(&mut half, 0x20, 499, false);
        assert!(parks_on_own_words(&half).is_empty());
        word(&mut half, 0x30, 2, false);
        assert_eq!(parks_on_own_words(&half).len(), 1);
    }

    #[test]
    fn a_jvms_threads_are_judged_by_what_its_dumps_found_them_waiting_for() {
        use crate::identity::jvm::Waiting;
        // Workers on words of their own that also wake one another: by their part, a lock's.
        let w = pool(false);
        let by_part = tell_handoffs_apart(&w, &mut RuntimeCache::default(), &Census::default());
        assert_eq!(by_part[&7].0.lock_threads, 4);
        // Dumps found workers 2 and 3 parked on the queue's condition, worker 4 on a lock half
        // the time; worker 5 was never found waiting, so it takes its process's share (of 6
        // waits found, 1 for a lock).
        let mut census = Census::default();
        census.add(
            TGID,
            &[(2, Waiting::Work), (3, Waiting::Work), (4, Waiting::Lock)],
        );
        census.add(
            TGID,
            &[(2, Waiting::Work), (3, Waiting::Work), (4, Waiting::Work)],
        );
        let out = tell_handoffs_apart(&w, &mut RuntimeCache::default(), &census);
        let (h, _) = &out[&7];
        let share_of_5: f64 = 100.0 / 6.0;
        assert_eq!(h.lock_waits, 50 + share_of_5.round() as u64);
        assert_eq!(
            h.lock_wait_ns,
            50_000 + (share_of_5 * 1_000.0).round() as u64
        );
        assert_eq!(h.lock_waits + h.work_waits, 400);
        assert_eq!((h.lock_threads, h.dump_judged_threads), (2, 4));
        assert_eq!(h.own_word_threads, 0);
        assert_eq!(
            (h.jvm_dumps, h.jvm_lock_waiting, h.jvm_work_waiting),
            (2, 1, 5)
        );
        // A process whose dumps found no thread waiting is judged as before.
        let mut idle = Census::default();
        idle.add(TGID, &[]);
        let out = tell_handoffs_apart(&w, &mut RuntimeCache::default(), &idle);
        assert_eq!(out[&7].0, by_part[&7].0);
    }
}
