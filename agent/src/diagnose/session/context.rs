//! What the session keeps of one cgroup's resources between reads, and when it reads them again.

use std::time::{Duration, Instant};

use crate::{collect::CgroupWindow, identity::limits::Limits};

/// How often the full limits (quota, cpuset, throttling, pressure) of an active cgroup with a
/// CPU quota are re-read: its throttling counters feed the diagnosis.
pub const LIMITS_REFRESH_QUOTA: Duration = Duration::from_secs(10);
/// Likewise for a cgroup without a quota: cpusets and quotas change rarely.
pub const LIMITS_REFRESH: Duration = Duration::from_secs(60);
/// The thread count of an active cgroup is re-read at least this often.
pub const THREADS_MAX_AGE: Duration = Duration::from_secs(60);
/// A change of a cgroup's activity (switches + futex waits per second) by more than this factor
/// from the rate when its threads were last counted makes the next tick count them again.
pub const ACTIVITY_CHANGE_FACTOR: f64 = 2.0;
/// Changes smaller than this many events per second are noise, whatever the factor (an idle
/// cgroup going from 1 to 3 switches per second has not changed what it is).
pub const ACTIVITY_CHANGE_FLOOR: f64 = 50.0;

/// What the session knows of one cgroup's resources.
#[derive(Clone, Debug)]
pub(super) struct Context {
    /// Latest read: quota, cpuset, pressure, cumulative throttling; `threads` the latest count.
    pub(super) limits: Limits,
    pub(super) limits_read_at: Instant,
    pub(super) threads_read_at: Instant,
    /// Activity (events per second) in the tick whose thread count is in `limits`.
    pub(super) activity_at_count: f64,
    /// Whether it had a quota at the last edge read: its throttling counters may have moved
    /// since, even if the quota is gone now.
    pub(super) quota_at_edge: bool,
    /// When the cgroup was last active (it is re-counted when it becomes active again).
    pub(super) last_active: Instant,
    /// The tick number in which it was last active.
    pub(super) last_tick: u64,
}

/// How often a cgroup's full limits are re-read: more often with a quota, whose throttling
/// counters feed the diagnosis.
pub(super) fn refresh_period(limits: &Limits) -> Duration {
    if limits.cpu_quota_cores.is_some() {
        LIMITS_REFRESH_QUOTA
    } else {
        LIMITS_REFRESH
    }
}

/// Switches and futex waits per second: what changes when a container's threads start fighting.
pub(super) fn activity(w: &CgroupWindow, secs: f64) -> f64 {
    let events = w.sched.voluntary_switches + w.sched.involuntary_switches + w.futex.wait.count;
    events as f64 / secs.max(1e-3)
}

pub(super) fn threads_due(ctx: &Context, activity: f64, tick: u64, now: Instant) -> bool {
    // Active again after a pause: whatever it runs now may be new.
    if ctx.last_tick + 1 < tick {
        return true;
    }
    if now.saturating_duration_since(ctx.threads_read_at) >= THREADS_MAX_AGE {
        return true;
    }
    let (lo, hi) = if activity < ctx.activity_at_count {
        (activity, ctx.activity_at_count)
    } else {
        (ctx.activity_at_count, activity)
    };
    hi - lo > ACTIVITY_CHANGE_FLOOR && hi > ACTIVITY_CHANGE_FACTOR * lo
}
