//! Telling a lock's hand-offs from a runtime's and from workers waiting for work, per cgroup,
//! from each thread's part in the window's hand-offs.

use std::collections::{HashMap, HashSet};

use crate::{
    collect::Window,
    diagnose::Handoffs,
    identity::runtime::{ProcessRuntime, RuntimeCache, is_service_thread, parks_in_its_scheduler},
};

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

/// Splits each cgroup's hand-offs in `window` by the part their threads played (see
/// [`Handoffs`]): a thread of a runtime that parks its threads itself (Go), or one of a
/// runtime's named service threads (HotSpot's), is the runtime's; a thread that both waited for
/// hand-offs and made them is a lock's; one that only waited is a worker waiting for work.
/// Returns, per cgroup, the split and the processes involved. Uses the runtimes and names read
/// while the window was observed ([`name_while_alive`]), reads those of any not yet seen, and
/// forgets those no longer in the window.
pub(super) fn tell_handoffs_apart(
    window: &Window,
    cache: &mut RuntimeCache,
) -> HashMap<u64, (Handoffs, Vec<ProcessRuntime>)> {
    let mut out: HashMap<u64, (Handoffs, Vec<ProcessRuntime>)> = HashMap::new();
    let mut seen: HashMap<u64, HashSet<u32>> = HashMap::new();
    for (tid, t) in &window.handoff_threads {
        if t.woken_waits == 0 {
            continue;
        }
        let runtime = cache.process(t.tgid).map(|p| p.runtime.clone());
        let (h, procs) = out.entry(t.cgroup_id).or_default();
        if seen.entry(t.cgroup_id).or_default().insert(t.tgid)
            && let Some(p) = cache.process(t.tgid)
        {
            procs.push(p.clone());
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
        } else if t.wakes > 0 {
            h.lock_waits += t.woken_waits;
            h.lock_wait_ns += t.woken_wait_ns;
            h.lock_threads += 1;
        } else {
            h.waiter_only_waits += t.woken_waits;
            h.waiter_only_wait_ns += t.woken_wait_ns;
        }
    }
    let tgids: HashSet<u32> = window.handoff_threads.values().map(|t| t.tgid).collect();
    let tids: HashSet<u32> = window.handoff_threads.keys().copied().collect();
    cache.retain(&tgids, &tids);
    for (_, procs) in out.values_mut() {
        procs.sort_by_key(|p| p.tgid);
    }
    out
}
