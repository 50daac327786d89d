//! The lock storm of a JVM's virtual threads: a lock handed from one virtual thread to the next
//! through the JVM's scheduler, judged from the JVM's own figures
//! ([`crate::identity::jvm::vthreads`]).
//!
//! The kernel rule ([`super::lock_storm`]) cannot see it: a virtual thread that finds the lock
//! held parks in the JVM and its carrier runs another, so the carriers stay busy and make no
//! futex hand-offs. Nor does the number waiting judge it, as it judges Go's: virtual threads are
//! not preempted, so with a lock in their loop nearly all of them wait in its queue whether or
//! not it costs anything. What costs is each hand-off — an unpark, a park and a remount on a
//! carrier — and the JVM's scheduler counts the remounts: over the window, in the share of the
//! parked virtual threads that wait for a lock, they are the locks' hand-offs.
//!
//! And the lock must be what limits them: where more virtual threads are ready for a carrier
//! than parked on the lock, the carriers have work without the lock's waiters (`carrier_bound`),
//! as a Go goroutine parked on a mutex leaves its P to another with work.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    Facts, Finding, Kind, Severity, Thresholds, limits_evidence,
    storm::{NearLine, OneGate},
};

/// The gate near whose line the verdict is `possible`, in words.
const GATE: &str = "virtual threads handed a lock per CPU-second";

/// The figures the virtual-thread storm judges, for every container whose JVMs' virtual
/// threads were read: with a finding they are its evidence, without one they say why not
/// (`diagnose --json` prints them under `checked.virtual_lock_storm`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VirtualStormFigures {
    /// JVMs read, and the JSON dumps of them.
    pub processes: u32,
    pub dumps: u32,
    /// Virtual threads a dump found, on average; of them, parked for a lock, for work, and
    /// ready for a carrier.
    pub virtual_threads: f64,
    pub waiting_for_a_lock: f64,
    pub waiting_for_work: f64,
    pub waiting_for_a_carrier: f64,
    /// …waiting for a lock per CPU the container may use: the queue's gate.
    pub waiting_for_a_lock_per_cpu: f64,
    /// Continuations the JVMs' schedulers ran per second.
    pub remounts_per_second: f64,
    /// The remounts in the share of the virtual threads off their carriers that are parked on
    /// a lock: an estimate of the locks' hand-offs.
    pub lock_handoffs_per_second: f64,
    /// …per CPU the container may use: the hand-off gate.
    pub lock_handoffs_per_cpu_second: f64,
    /// What the hand-offs cost the usable CPUs at the least, estimated at
    /// [`VIRTUAL_HANDOFF_CPU_SECONDS`](super::defaults::VIRTUAL_HANDOFF_CPU_SECONDS) each (the
    /// gate's line is 5% of them).
    pub handoff_cpu_share: f64,
    /// …and at the most, at
    /// [`VIRTUAL_HANDOFF_CPU_SECONDS_HIGH`](super::defaults::VIRTUAL_HANDOFF_CPU_SECONDS_HIGH)
    /// each (what a hand-off cost on the other CPU kind measured), at most all of them.
    pub handoff_cpu_share_high: f64,
    /// What the lock costs the virtual threads: the share of their time parked on a lock (the
    /// ones found waiting for one over all found). The severity follows it.
    pub lock_wait_share: f64,
    /// The lock most waited for, and its code.
    pub top_lock: Option<String>,
    pub top_lock_site: Option<String>,
    /// The hand-off gate's figure, when it lies within `storm_near_line_factor` of its line.
    pub near_line: Option<NearLine>,
    /// More of its virtual threads waited for a carrier than for a lock: the CPUs, not the
    /// lock, limit them, and the lock is not judged a storm (a virtual thread parked on it
    /// leaves its carrier to one of those ready, as a Go goroutine leaves its P).
    pub carrier_bound: bool,
    pub lock_storm: bool,
    /// Near the line, and the lock costs less than `storm_critical_lock_wait_share`.
    pub possible: bool,
}

impl VirtualStormFigures {
    /// `None` for a container with no JVM whose virtual threads were dumped.
    pub fn of(f: &Facts, t: &Thresholds) -> Option<Self> {
        let v = f.jvm_virtual.as_ref().filter(|v| v.dumps > 0)?;
        let allowed = f.allowed_cpus();
        let handoffs = v.lock_handoffs_per_second();
        let per_cpu = handoffs / allowed;
        let lock_wait_share = if v.threads > 0.0 {
            (v.waiting_for_a_lock / v.threads).clamp(0.0, 1.0)
        } else {
            0.0
        };
        // Both gates: the lock's queue (the other rules' line), then its hand-offs, near whose
        // line the lock's cost decides.
        let queued = v.waiting_for_a_lock / allowed >= t.storm_min_queued_threads_per_cpu;
        // The lock limits them only where its queue is the longer one: with more virtual
        // threads ready for a carrier than parked on the lock, the carriers have work without
        // the lock's waiters, and a lock made uncontended would move them to the carriers'
        // queue. An HTTP server with a virtual thread per request queued 5 on a JDK monitor
        // and 30 for a carrier, where 2 platform threads spent 0.76–1.09× its CPU a request
        // (jvm-virtual-http, tests/CORPUS.md).
        let carrier_bound = v.waiting_for_a_carrier >= v.waiting_for_a_lock;
        let judged = queued && !carrier_bound;
        let verdict = OneGate::judge(
            GATE,
            per_cpu,
            t.storm_min_virtual_handoffs_per_cpu_second,
            lock_wait_share,
            t,
        );
        let near = verdict.near.filter(|_| judged);
        let cpu_shares = handoff_cpu_shares(per_cpu);
        Some(Self {
            processes: v.processes,
            dumps: v.dumps,
            virtual_threads: v.threads,
            waiting_for_a_lock: v.waiting_for_a_lock,
            waiting_for_work: v.waiting_for_work,
            waiting_for_a_carrier: v.waiting_for_a_carrier,
            waiting_for_a_lock_per_cpu: v.waiting_for_a_lock / allowed,
            remounts_per_second: v.runs_per_second,
            lock_handoffs_per_second: handoffs,
            lock_handoffs_per_cpu_second: per_cpu,
            handoff_cpu_share: cpu_shares.0,
            handoff_cpu_share_high: cpu_shares.1,
            lock_wait_share,
            top_lock: v.top_lock.as_ref().map(|l| l.object.clone()),
            top_lock_site: v.top_lock.as_ref().and_then(|l| l.site.clone()),
            near_line: near,
            carrier_bound,
            lock_storm: judged && verdict.lock_storm,
            possible: judged && verdict.possible,
        })
    }
}

/// A JVM's virtual-thread storm: at least `storm_min_queued_threads_per_cpu` virtual threads
/// per usable CPU parked on a lock, more than wait for a carrier, handed it at least
/// `storm_min_virtual_handoffs_per_cpu_second` times per usable CPU a second. Near that line
/// the lock's cost decides (`storm_critical_lock_wait_share` of the virtual threads' time: a
/// storm), or the verdict is `possible`.
pub fn virtual_lock_storm(f: &Facts, t: &Thresholds) -> Option<Finding> {
    let v = VirtualStormFigures::of(f, t)?;
    if !v.lock_storm && !v.possible {
        return None;
    }
    let allowed = f.allowed_cpus();
    let severity = if v.possible {
        Severity::Info
    } else if v.lock_wait_share >= t.storm_critical_lock_wait_share {
        Severity::Critical
    } else {
        Severity::Warning
    };
    let head = match v.near_line.filter(|_| v.possible) {
        Some(near) => format!("possible lock storm of virtual threads ({})", near.words()),
        None => "lock storm of virtual threads".to_owned(),
    };
    let mut summary = format!(
        "{head}: the JVM's dumps find {:.0} of its {:.0} virtual threads parked on a lock on \
         average — {:.1} per usable CPU ({allowed:.1}): about {:.0}% of the virtual threads' \
         time is spent waiting for a lock — and its scheduler hands a lock on about {:.0} times a \
         second, {:.0} per usable CPU, each an unpark, a park and a remount on a carrier: at \
         {:.1}–{:.1} µs each (what one cost on the CPU kinds measured), {:.0}–{:.0}% of the \
         usable CPUs. The kernel sees none of it: the carriers stay busy",
        v.waiting_for_a_lock,
        v.virtual_threads,
        v.waiting_for_a_lock_per_cpu,
        100.0 * v.lock_wait_share,
        v.lock_handoffs_per_second,
        v.lock_handoffs_per_cpu_second,
        super::defaults::VIRTUAL_HANDOFF_CPU_SECONDS * 1e6,
        super::defaults::VIRTUAL_HANDOFF_CPU_SECONDS_HIGH * 1e6,
        100.0 * v.handoff_cpu_share,
        100.0 * v.handoff_cpu_share_high,
    );
    if let Some(object) = &v.top_lock {
        summary.push_str(&format!("; the lock most waited for is {object}"));
        if let Some(site) = &v.top_lock_site {
            summary.push_str(&format!(", taken at {site}"));
        }
    }
    let mut e = BTreeMap::new();
    e.insert("jvm_virtual_threads", v.virtual_threads);
    e.insert(
        "jvm_virtual_threads_waiting_for_a_lock",
        v.waiting_for_a_lock,
    );
    e.insert(
        "jvm_virtual_thread_remounts_per_second",
        v.remounts_per_second,
    );
    e.insert(
        "jvm_virtual_lock_handoffs_per_cpu_second",
        v.lock_handoffs_per_cpu_second,
    );
    e.insert("jvm_virtual_handoff_cpu_share", v.handoff_cpu_share);
    e.insert(
        "jvm_virtual_handoff_cpu_share_high",
        v.handoff_cpu_share_high,
    );
    e.insert("jvm_virtual_thread_dumps", f64::from(v.dumps));
    e.insert("lock_wait_share", v.lock_wait_share);
    if let Some(near) = v.near_line {
        e.insert("near_line_value", near.value);
        e.insert("near_line", near.line);
    }
    e.insert("oncpu_cores", f.oncpu_cores());
    limits_evidence(f, &mut e);
    let mut recs = Vec::new();
    if let Some(near) = v.near_line.filter(|_| v.possible) {
        recs.push(near.what_decides());
    }
    let at = v
        .top_lock_site
        .as_deref()
        .map(|s| format!(" (taken at {s})"))
        .unwrap_or_default();
    recs.push(format!(
        "Make the critical section shorter or the lock less shared{at}: {:.0} virtual threads \
         queue on it and each hand-off costs a carrier a park and a remount. Split what it \
         guards (per key, per shard), use a concurrent structure or atomics, or give the \
         contended work to a few platform threads that the virtual threads hand it to.",
        v.waiting_for_a_lock
    ));
    recs.push(
        "Profile the lock: `jcmd <pid> Thread.dump_to_file -format=json <file>` lists each \
         virtual thread's stack and the lock it is parked on; JFR's `jdk.ThreadPark` events \
         (threshold 0) time the waits."
            .to_owned(),
    );
    let mut found = Finding::new(Kind::LockStorm, severity, f.owner(), summary, e, recs);
    found.context.insert(
        "verdict",
        if v.possible { "possible" } else { "storm" }.to_owned(),
    );
    found
        .context
        .insert("runtime", "jvm-virtual-threads".to_owned());
    if let Some(object) = v.top_lock {
        found.context.insert("lock", object);
    }
    if let Some(site) = v.top_lock_site {
        found.context.insert("lock_site", site);
    }
    Some(found)
}

/// What `per_cpu_second` hand-offs a usable CPU-second cost it, at the least and at the most: at
/// what one cost on the CPU kinds measured (an unpark, a park and a remount), at most all of it.
fn handoff_cpu_shares(per_cpu_second: f64) -> (f64, f64) {
    (
        (per_cpu_second * super::defaults::VIRTUAL_HANDOFF_CPU_SECONDS).min(1.0),
        (per_cpu_second * super::defaults::VIRTUAL_HANDOFF_CPU_SECONDS_HIGH).min(1.0),
    )
}

/// The figures of a container whose JVMs' virtual threads were counted but not dumped (the
/// JSON dump is off unless asked: it can crash a JDK 25 JVM, tests/CORPUS.md): their
/// schedulers' remounts alone, which bound a lock's hand-offs from above (`diagnose --json`
/// prints them under `checked.virtual_remounts`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VirtualRemountFigures {
    /// JVMs read.
    pub processes: u32,
    /// Continuations the JVMs' schedulers ran per second, and per CPU the container may use.
    pub remounts_per_second: f64,
    pub remounts_per_cpu_second: f64,
    /// The hand-off gate's line (`storm_min_virtual_handoffs_per_cpu_second`): were every
    /// remount a lock's hand-off, it is where they would cost 5% of the usable CPUs.
    pub line: f64,
    /// What the remounts cost the usable CPUs at the least and at the most, at what a lock's
    /// hand-off cost on the CPU kinds measured (an unpark, a park and a remount).
    pub remount_cpu_share: f64,
    pub remount_cpu_share_high: f64,
    /// At or over the line: a possible storm, which what the virtual threads wait for decides.
    pub possible: bool,
}

impl VirtualRemountFigures {
    /// `None` for a container with no JVM whose virtual threads were counted, or whose were
    /// also dumped ([`VirtualStormFigures`] judges those).
    pub fn of(f: &Facts, t: &Thresholds) -> Option<Self> {
        let v = f
            .jvm_virtual
            .as_ref()
            .filter(|v| v.dumps == 0 && v.processes > 0)?;
        let per_cpu = v.runs_per_second / f.allowed_cpus();
        let cpu_shares = handoff_cpu_shares(per_cpu);
        Some(Self {
            processes: v.processes,
            remounts_per_second: v.runs_per_second,
            remounts_per_cpu_second: per_cpu,
            line: t.storm_min_virtual_handoffs_per_cpu_second,
            remount_cpu_share: cpu_shares.0,
            remount_cpu_share_high: cpu_shares.1,
            possible: per_cpu >= t.storm_min_virtual_handoffs_per_cpu_second,
        })
    }
}

/// A possible lock storm of a JVM's virtual threads, where they were counted but not dumped:
/// their scheduler remounts them at least `storm_min_virtual_handoffs_per_cpu_second` times per
/// usable CPU a second. Never more than `possible`: a virtual thread handed a lock and one
/// handed work are remounted alike, and only the JSON dump tells which they wait for.
pub fn unread_virtual_lock_storm(f: &Facts, t: &Thresholds) -> Option<Finding> {
    let v = VirtualRemountFigures::of(f, t).filter(|v| v.possible)?;
    let allowed = f.allowed_cpus();
    let summary = format!(
        "possible lock storm of virtual threads: the JVM's scheduler mounted its virtual \
         threads on their carriers about {:.0} times a second, {:.0} per usable CPU \
         ({allowed:.1}) — {:.1}× the {:.0} at which a lock's hand-offs (an unpark, a park and a \
         remount each: {:.1}–{:.1} µs on the CPU kinds measured) cost 5% of the usable CPUs; \
         were they all a lock's, {:.0}–{:.0}% of them. Whether they are a lock's hand-offs or \
         virtual threads woken for work or started is not read: what each waits for is in the \
         JVM's JSON thread dump, which is taken only where asked (it can crash a JDK 25 JVM \
         while its virtual threads mount and unmount, JDK-8364343). The kernel sees none of \
         it: the carriers stay busy",
        v.remounts_per_second,
        v.remounts_per_cpu_second,
        v.remounts_per_cpu_second / v.line,
        v.line,
        super::defaults::VIRTUAL_HANDOFF_CPU_SECONDS * 1e6,
        super::defaults::VIRTUAL_HANDOFF_CPU_SECONDS_HIGH * 1e6,
        100.0 * v.remount_cpu_share,
        100.0 * v.remount_cpu_share_high,
    );
    let mut e = BTreeMap::new();
    e.insert(
        "jvm_virtual_thread_remounts_per_second",
        v.remounts_per_second,
    );
    e.insert(
        "jvm_virtual_thread_remounts_per_cpu_second",
        v.remounts_per_cpu_second,
    );
    e.insert("jvm_virtual_remount_cpu_share", v.remount_cpu_share);
    e.insert(
        "jvm_virtual_remount_cpu_share_high",
        v.remount_cpu_share_high,
    );
    e.insert("near_line_value", v.remounts_per_cpu_second);
    e.insert("near_line", v.line);
    e.insert("oncpu_cores", f.oncpu_cores());
    limits_evidence(f, &mut e);
    let recs = vec![
        "What decides it: what the virtual threads are parked on. `stormwatch diagnose \
         --jvm-virtual-threads` reads it from the JVM's JSON thread dump and judges the storm, \
         naming the lock and the code that takes it — at a risk to a JDK 25 JVM under this \
         load (JDK-8364343); or take one dump by hand (`jcmd <pid> Thread.dump_to_file \
         -format=json <file>`) and count the virtual threads whose `parkBlocker` is one lock."
            .to_owned(),
        "Where it is a lock: make its critical section shorter or the lock less shared (split \
         what it guards, use a concurrent structure or atomics); each hand-off costs a carrier \
         a park and a remount."
            .to_owned(),
    ];
    let mut found = Finding::new(Kind::LockStorm, Severity::Info, f.owner(), summary, e, recs);
    found.context.insert("verdict", "possible".to_owned());
    found
        .context
        .insert("runtime", "jvm-virtual-threads".to_owned());
    Some(found)
}
