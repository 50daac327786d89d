//! Why each hand-off of a lock storm costs what it does, from measured figures only: the
//! storm's finding reads it for its evidence, its explanation and its first recommendation.

use std::collections::BTreeMap;

use super::{Facts, Thresholds};
use crate::symbolize::handoffs::PairStats;

/// Why each hand-off of a storm costs what it does: where the wake-ups come from, how far the
/// threads spread, the hypervisor under them, steal, and how the pools were sized. Each part
/// comes from measured figures only; an unknown figure leaves its part out.
pub(super) struct HandOffCost<'a> {
    remote_share: Option<f64>,
    /// Most wake-ups come from another CPU.
    remote_high: bool,
    cpus_used: Option<u32>,
    /// The threads ran on more CPUs than the container may use at once.
    spread_high: bool,
    /// `Some(None)`: bare metal; `None`: the host is not known.
    hypervisor: Option<Option<&'a str>>,
    pub(super) steal_share: Option<f64>,
    /// As many threads as the node has CPUs, on a node far larger than the container.
    pub(super) node_sized: bool,
    /// From the sampled hand-offs: the mean time from a wake to its waiter's return, and the
    /// share that crossed CPUs.
    sampled: Option<(f64, f64)>,
}

impl<'a> HandOffCost<'a> {
    pub(super) fn of(f: &'a Facts, t: &Thresholds, threads: f64, allowed: f64) -> Self {
        let host_cpus = f64::from(f.host_cpus.max(1));
        Self {
            remote_share: f.remote_wakeup_share,
            remote_high: f
                .remote_wakeup_share
                .is_some_and(|r| r >= t.storm_high_remote_wakeup_share),
            cpus_used: f.cpus_used,
            spread_high: f.cpus_used.is_some_and(|c| f64::from(c) > allowed.ceil()),
            hypervisor: f.host.as_ref().map(|h| h.hypervisor.as_deref()),
            steal_share: f.host.as_ref().and_then(|h| h.steal_share),
            node_sized: threads >= host_cpus
                && host_cpus >= t.storm_node_sized_min_host_per_allowed_cpu * allowed,
            sampled: f.sites.as_ref().and_then(|s| {
                let total = s.total();
                Some((
                    PairStats::mean_s(total.wake_to_return_ns, total.handoffs)?,
                    PairStats::share(total.crossed_cpus, total.handoffs)?,
                ))
            }),
        }
    }

    pub(super) fn evidence(&self, f: &Facts, threads: f64, e: &mut BTreeMap<&'static str, f64>) {
        if let Some(r) = self.remote_share {
            e.insert("remote_wakeup_share", r);
        }
        if let Some(c) = self.cpus_used {
            e.insert("cpus_used", f64::from(c));
        }
        e.insert(
            "threads_per_host_cpu",
            threads / f64::from(f.host_cpus.max(1)),
        );
        if let Some(s) = self.steal_share {
            e.insert("steal_share", s);
        }
    }

    /// What an inter-processor interrupt costs here, for the sentences that name it.
    fn vm_exit(&self) -> Option<String> {
        match self.hypervisor? {
            Some("unknown") => Some("usually a VM exit in this guest".to_owned()),
            Some(h) => Some(format!("usually a VM exit in this {h} guest")),
            None => None,
        }
    }

    /// Appends the explanation to a storm's summary.
    pub(super) fn explain(
        &self,
        f: &Facts,
        threads: f64,
        allowed: f64,
        t: &Thresholds,
        s: &mut String,
    ) {
        use std::fmt::Write as _;
        if let Some(r) = self.remote_share {
            let _ = write!(
                s,
                "; {:.0}% of its wake-ups come from another CPU",
                100.0 * r
            );
            if self.remote_high {
                s.push_str(", an inter-processor interrupt each");
                if let Some(exit) = self.vm_exit() {
                    let _ = write!(s, ", {exit}");
                }
            }
        }
        if let Some((wake, crossed)) = self.sampled {
            let _ = write!(
                s,
                "; a sampled hand-off takes {:.0} µs from the wake to the waiter running again \
                 ({:.0}% of them across CPUs)",
                wake * 1e6,
                100.0 * crossed
            );
        }
        if let Some(c) = self.cpus_used {
            let _ = write!(
                s,
                "; its threads ran on {c} CPU{}",
                if c == 1 { "" } else { "s" }
            );
            if self.spread_high {
                let _ = write!(s, ", more than the {allowed:.1} it may use at once");
            }
        }
        if let Some(steal) = self
            .steal_share
            .filter(|s| *s >= t.storm_significant_steal_share)
        {
            let _ = write!(
                s,
                "; the hypervisor took {:.0}% of the host's CPU time (steal)",
                100.0 * steal
            );
        }
        if self.node_sized {
            let _ = write!(
                s,
                "; {threads:.0} threads for the node's {} CPUs ({:.1} per node CPU) but {allowed:.1} \
                 usable: its pools look sized from the node's CPU count, not the container's",
                f.host_cpus,
                threads / f64::from(f.host_cpus.max(1)),
            );
        }
    }

    /// What `perf top`'s `_raw_spin_unlock_irqrestore` stands for in a guest: where its
    /// samples pile up, against the spinlock wait measured here.
    pub(super) fn perf_signature(&self, f: &Facts, handoffs_per_cpu_second: f64) -> Option<String> {
        let guest = match self.hypervisor? {
            Some(h) if h != "unknown" => format!("this {h} guest"),
            Some(_) => "this guest".to_owned(),
            None => return None,
        };
        let wakes = handoffs_per_cpu_second * f.allowed_cpus();
        Some(format!(
            "If `perf top` shows `_raw_spin_unlock_irqrestore` hot here, read it as the wake-ups, \
             not a contended spinlock: in {guest} perf samples by timer interrupt unless the \
             vCPU's PMU delivers NMIs, and such samples land where interrupts are re-enabled, at \
             the end of each wake-up (try_to_wake_up) — {wakes:.0} hand-offs a second here, each \
             a wake-up — while the kernel's own lock:contention_* tracepoints measured {:.2}% of \
             a CPU spinning on kernel locks.",
            100.0 * f.spin_wait_per_second()
        ))
    }

    /// Pinning, first of the recommendations when the hand-offs cross many CPUs.
    pub(super) fn pinning(&self, n: u64) -> Option<String> {
        if !(self.remote_high && self.spread_high) {
            return None;
        }
        let remote = 100.0 * self.remote_share?;
        let used = self.cpus_used?;
        let exit = self
            .vm_exit()
            .map(|e| format!(" ({e})"))
            .unwrap_or_default();
        Some(format!(
            "Pin the container to {n} dedicated CPU(s): {remote:.0}% of its wake-ups cross CPUs \
             and its threads ran on {used} CPUs, so each lock hand-off pays an inter-processor \
             interrupt{exit}; pinned, the hand-offs stay within {n} CPU(s) that share caches."
        ))
    }
}
