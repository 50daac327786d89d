//! A lock storm's sampled hand-offs in its finding: the call sites in its evidence and
//! context, and the recommendation that names the lock's code.

use std::collections::BTreeMap;

use crate::{
    diagnose::LockPair,
    symbolize::handoffs::{HandoffSites, PairStats},
};

/// The storm's call sites in its evidence: how many hand-offs were sampled, the top waiter
/// site's share of them, and why they were slow (means and shares of the sampled hand-offs).
pub(super) fn sites_evidence(sites: &HandoffSites, e: &mut BTreeMap<&'static str, f64>) {
    let total = sites.total();
    if total.handoffs == 0 {
        return;
    }
    e.insert("sampled_handoffs", total.handoffs as f64);
    if let Some((_, top)) = sites.top_waiters(1).first() {
        e.insert(
            "top_waiter_site_share",
            top.handoffs as f64 / total.handoffs as f64,
        );
    }
    let mut put = |name, v: Option<f64>| {
        if let Some(v) = v {
            e.insert(name, v);
        }
    };
    put(
        "handoff_wake_to_return_mean_seconds",
        PairStats::mean_s(total.wake_to_return_ns, total.handoffs),
    );
    put(
        "handoff_crossed_cpu_share",
        PairStats::share(total.crossed_cpus, total.handoffs),
    );
    put(
        "holder_off_cpu_share",
        PairStats::share(total.holds_off_cpu, total.holds),
    );
    put(
        "holder_preempted_share",
        PairStats::share(total.holds_preempted, total.holds),
    );
    put(
        "holder_asleep_share",
        PairStats::share(total.holds_asleep, total.holds),
    );
}

/// The pair of sites with the most sampled hand-offs, by name, and its share of them.
pub(super) fn top_pair(sites: &HandoffSites) -> Option<LockPair> {
    let total = sites.total().handoffs;
    let ((waiter, waker), top) = sites.top(1).into_iter().next()?;
    (total > 0).then(|| LockPair {
        waiter: waiter.describe(),
        waker: waker.describe(),
        share: top.handoffs as f64 / total as f64,
    })
}

/// The recommendation that names the lock: the code that waits for it and the code that hands
/// it on, from the sampled hand-offs, with why the hand-offs are slow; or what would name it.
pub(super) fn name_the_lock(sites: Option<&HandoffSites>) -> String {
    let Some(sites) = sites.filter(|s| s.total().handoffs > 0) else {
        return "Name the contended lock: `stormwatch trace --json` lists the futex words these \
                waits are on, per process (hot_futexes), and the call sites of sampled \
                hand-offs (lock_call_sites) where the kernel has BTF and the agent can read the \
                processes; a JVM thread dump, a Go mutex profile or `perf lock contention` names \
                the code that takes it."
            .to_owned();
    };
    let total = sites.total();
    let Some(((waiter, waker), top)) = sites.top(1).into_iter().next() else {
        return String::new();
    };
    let share = 100.0 * top.handoffs as f64 / total.handoffs as f64;
    let mut s = if waiter.function.is_some() {
        format!(
            "Change the code that takes the lock: {share:.0}% of {} sampled hand-offs wait in \
             {} and are handed on from {}.",
            total.handoffs,
            waiter.describe(),
            waker.describe()
        )
    } else {
        format!(
            "The lock could not be named: {share:.0}% of {} sampled hand-offs wait in {}.",
            total.handoffs,
            waiter.describe()
        )
    };
    if let Some(why) = why_slow(&total) {
        s.push(' ');
        s.push_str(&why);
    }
    for hint in &sites.hints {
        s.push_str(&format!(" To name more: {hint}."));
    }
    s
}

/// Why the sampled hand-offs are slow, in words, from the split of their time.
fn why_slow(t: &PairStats) -> Option<String> {
    let wake = PairStats::mean_s(t.wake_to_return_ns, t.handoffs)?;
    let mut s = format!(
        "Each hand-off takes {:.0} µs from the wake to the waiter running again ({:.0}% cross \
         CPUs)",
        wake * 1e6,
        100.0 * PairStats::share(t.crossed_cpus, t.handoffs).unwrap_or(0.0)
    );
    if let (Some(off), Some(pre), Some(asleep)) = (
        PairStats::share(t.holds_off_cpu, t.holds),
        PairStats::share(t.holds_preempted, t.holds),
        PairStats::share(t.holds_asleep, t.holds),
    ) {
        s.push_str(&format!(
            "; the holder was switched out while it held the lock in {:.0}% of {} holds \
             (preempted or throttled {:.0}%, asleep {:.0}%)",
            100.0 * off,
            t.holds,
            100.0 * pre,
            100.0 * asleep
        ));
    }
    s.push('.');
    Some(s)
}
