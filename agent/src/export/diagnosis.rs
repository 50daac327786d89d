//! The diagnosis rules over a sliding window of the last ticks.
//!
//! Ticks are gathered into steps (a third of the window, at least one tick); the window is the
//! last steps covering at least the window's length. The rules run each time a step completes,
//! so findings appear and clear within a step of the condition. Memory: a few windows of
//! per-cgroup figures (the hot-futex and lock-site details, which the rules do not use, are
//! left out).

use std::{
    collections::{HashMap, VecDeque},
    time::Duration,
};

use crate::{
    cli::diagnose::facts,
    collect::Window,
    diagnose::{Finding, Thresholds, diagnose},
    identity::limits::Limits,
};

/// Throttling counters of a cgroup (since the agent started), at some instant.
type Throttling = (Option<u64>, Option<f64>);

struct Step {
    window: Window,
    /// Each cgroup's throttling counters when the step began.
    throttling_at_start: HashMap<u64, Throttling>,
}

impl Step {
    fn new(latest: &HashMap<u64, Limits>) -> Self {
        Self {
            window: Window::empty(),
            throttling_at_start: latest
                .iter()
                .map(|(id, l)| (*id, (l.throttled_periods, l.throttled_seconds)))
                .collect(),
        }
    }
}

pub struct SlidingDiagnosis {
    span: Duration,
    step: Duration,
    steps: VecDeque<Step>,
    current: Step,
}

impl SlidingDiagnosis {
    pub fn new(span: Duration, interval: Duration) -> Self {
        Self {
            span,
            step: (span / 3).max(interval),
            steps: VecDeque::new(),
            // The first step starts with the agent: its throttling baseline is zero.
            current: Step::new(&HashMap::new()),
        }
    }

    /// Adds a tick's window; `latest` is each cgroup's latest limits (throttling since the
    /// agent started), read at the end of the tick. True when a step completed: time to
    /// [`judge`](Self::judge).
    pub fn push(&mut self, tick: &Window, latest: &HashMap<u64, Limits>) -> bool {
        // Only the per-cgroup figures: the rules use nothing else.
        let mut light = Window::empty();
        light.duration = tick.duration;
        light.cgroups = tick.cgroups.clone();
        self.current.window.extend(&light);
        if self.current.window.duration < self.step {
            return false;
        }
        // The end of this step is the start of the next.
        let done = std::mem::replace(&mut self.current, Step::new(latest));
        self.steps.push_back(done);
        while self.steps.len() > 1 {
            let total: Duration = self.steps.iter().map(|s| s.window.duration).sum();
            if total - self.steps[0].window.duration < self.span {
                break;
            }
            self.steps.pop_front();
        }
        true
    }

    /// Whether a cgroup has figures in the window (its name must be kept until it leaves).
    pub fn contains(&self, id: u64) -> bool {
        self.steps
            .iter()
            .chain([&self.current])
            .any(|s| s.window.cgroups.contains_key(&id))
    }

    /// The completed steps as one window.
    pub fn window(&self) -> Window {
        let mut total = Window::empty();
        for s in &self.steps {
            total.extend(&s.window);
        }
        total
    }

    /// Each cgroup of the window's limits, with throttling made relative to the window's start.
    pub fn window_limits(
        &self,
        window: &Window,
        latest: &HashMap<u64, Limits>,
    ) -> HashMap<u64, Limits> {
        let start = self.steps.front().map(|s| &s.throttling_at_start);
        window
            .cgroups
            .keys()
            .filter_map(|id| {
                let mut l = latest.get(id)?.clone();
                let (periods, seconds) = start
                    .and_then(|s| s.get(id))
                    .copied()
                    .unwrap_or((None, None));
                l.throttled_periods = l
                    .throttled_periods
                    .map(|p| p.saturating_sub(periods.unwrap_or(0)));
                l.throttled_seconds = l
                    .throttled_seconds
                    .map(|s| (s - seconds.unwrap_or(0.0)).max(0.0));
                Some((*id, l))
            })
            .collect()
    }

    /// Runs the rules over the window.
    pub fn judge(
        &self,
        paths: &HashMap<u64, String>,
        latest: &HashMap<u64, Limits>,
        host_cpus: u32,
        thresholds: &Thresholds,
    ) -> Vec<Finding> {
        let window = self.window();
        if window.duration.is_zero() {
            return Vec::new();
        }
        let limits = self.window_limits(&window, latest);
        diagnose(&facts(&window, paths, &limits, host_cpus), thresholds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::CgroupWindow;

    fn tick(id: u64, secs: u64, switches: u64) -> Window {
        let mut w = Window::empty();
        w.duration = Duration::from_secs(secs);
        let mut c = CgroupWindow::ZERO;
        c.sched.voluntary_switches = switches;
        w.cgroups.insert(id, c);
        w
    }

    #[test]
    fn the_window_slides_by_steps() {
        let mut d = SlidingDiagnosis::new(Duration::from_secs(30), Duration::from_secs(5));
        let none = HashMap::new();
        let mut completed = 0;
        for i in 0..12 {
            if d.push(&tick(1, 5, i), &none) {
                completed += 1;
            }
        }
        // 60 s in 10 s steps: six steps completed, the last three (30 s) kept.
        assert_eq!(completed, 6);
        let w = d.window();
        assert_eq!(w.duration, Duration::from_secs(30));
        assert_eq!(w.cgroups[&1].sched.voluntary_switches, (6..12).sum::<u64>());
        assert!(d.contains(1));
        assert!(!d.contains(2));
    }

    #[test]
    fn throttling_is_relative_to_the_window() {
        let mut d = SlidingDiagnosis::new(Duration::from_secs(2), Duration::from_secs(1));
        let limits = |p: u64, s: f64| {
            HashMap::from([(
                1,
                Limits {
                    throttled_periods: Some(p),
                    throttled_seconds: Some(s),
                    ..Limits::default()
                },
            )])
        };
        d.push(&tick(1, 1, 1), &limits(10, 1.0));
        d.push(&tick(1, 1, 1), &limits(15, 1.5));
        d.push(&tick(1, 1, 1), &limits(40, 4.0));
        let latest = limits(70, 7.0);
        d.push(&tick(1, 1, 1), &latest);
        // Steps of 1 s; the window is the last two, which began when the counters were 15.
        let w = d.window();
        assert_eq!(w.duration, Duration::from_secs(2));
        let l = &d.window_limits(&w, &latest)[&1];
        assert_eq!(l.throttled_periods, Some(55));
        assert!((l.throttled_seconds.unwrap() - 5.5).abs() < 1e-9);
    }
}
