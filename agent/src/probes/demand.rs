//! The on-demand policy: when the daemon attaches each [`Tier`] of programs it loaded but left
//! detached. One controller, fed what each diagnosis judgement asks for ([`Asks`]), attaches and
//! detaches the tiers and returns what it changed; the front end only reports the changes.
//!
//! A tier is attached from a judgement that asks for it until a whole diagnosis window has
//! passed without one that does:
//! - the wake-kind programs while a lock storm is found, so that the windows a storm is judged
//!   on while it lasts have its wake-ups told apart (the share from another CPU, and the
//!   pinning advice that follows from it);
//! - the futex programs while a container's scheduler figures look like a lock storm's (or a
//!   storm is found): the storm rule needs their figures; while they are detached no thread
//!   pays the syscall slow path for them;
//! - the switch program's run-queue blame while a container's threads wait for CPUs
//!   (`runqueue_saturation`), so that the windows it is judged on name who held them;
//! - the per-packet network programs while packets did not fit somewhere
//!   ([`crate::diagnose::network::packets_did_not_fit`]), and for a survey every
//!   `net_packet_survey_seconds`: they show which interfaces and containers.
//!
//! And when Go's `sync.Mutex` uprobes run a burst ([`GoBursts`]), in every front end: while
//! the futex probes watch and Go binaries are known, at once and then every
//! [`BURST_EVERY`].
//!
//! Owns: the policy. Imports the probes' tiers only (it is fed booleans, not the diagnosis),
//! so that the layers below the front ends never look up.

use std::time::{Duration, Instant};

use super::{GoMutexWatch, Probes, Tier};

/// How often a burst of Go's mutex uprobes starts (at the first collection the futex probes
/// watch with Go binaries known, then at the first one at least this long after the last): a
/// burst costs a contended program about 1% at this period (`probes::gomutex`).
pub const BURST_EVERY: Duration = Duration::from_secs(10);

/// When Go's `sync.Mutex` uprobes run a burst: at the first collection the futex probes watch
/// with Go binaries to attach to, then every [`BURST_EVERY`]; a collection at which the futex
/// probes do not watch starts it over (their next watch bursts at once).
#[derive(Debug, Default)]
pub struct GoBursts {
    last: Option<Instant>,
}

impl GoBursts {
    /// Whether a burst starts at the collection at `now`, given what the finder says (and
    /// notes it).
    pub fn due(&mut self, watch: GoMutexWatch, now: Instant) -> bool {
        if !watch.watching {
            self.last = None;
            return false;
        }
        let due = watch.binaries
            && self
                .last
                .is_none_or(|t| now.saturating_duration_since(t) >= BURST_EVERY);
        if due {
            self.last = Some(now);
        }
        due
    }
}

/// What one judgement asks of the tiers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Asks {
    /// A lock storm was found.
    pub storm: bool,
    /// Some container's scheduler figures look like a lock storm's.
    pub storm_candidate: bool,
    /// Packets did not fit somewhere over the window.
    pub packets_did_not_fit: bool,
    /// Some container's threads wait for CPUs (a `runqueue_saturation` finding).
    pub runqueue_wait: bool,
}

/// What the controller did to a tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Steered {
    Attached,
    Detached,
    /// Given up after an error (its status says why): never tried again.
    Abandoned,
}

/// One change, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    pub tier: Tier,
    pub steered: Steered,
    /// For the per-packet tier: attached for a survey, not because packets did not fit.
    pub survey: bool,
}

impl Change {
    /// The daemon's log line for it (`None`: nothing worth a line).
    pub fn message(&self) -> Option<&'static str> {
        Some(match (self.tier, self.steered) {
            (Tier::WakeKinds, Steered::Attached) => {
                "lock storm found: wake-ups are told local or remote until a diagnosis window \
                 passes without one"
            }
            (Tier::WakeKinds, Steered::Detached) => {
                "no lock storm for a diagnosis window: wake-up probes detached"
            }
            (Tier::Futex, Steered::Attached) => {
                "scheduler figures look like a lock storm: futex probes attached until a \
                 diagnosis window passes without"
            }
            (Tier::Futex, Steered::Detached) => {
                "no lock storm candidate for a diagnosis window: futex probes detached"
            }
            (Tier::NetPackets, Steered::Attached) if self.survey => {
                "per-packet network probes attached for a diagnosis window: a survey of the \
                 interfaces and of what containers send"
            }
            (Tier::NetPackets, Steered::Attached) => {
                "packets did not fit somewhere (fragments, \"packet too big\" or drops for size): \
                 per-packet network probes attached until a diagnosis window passes without"
            }
            (Tier::NetPackets, Steered::Detached) => {
                "every packet fitted for a diagnosis window: per-packet network probes detached"
            }
            (Tier::RunqBlame, Steered::Attached) => {
                "threads wait for CPUs: run-queue waits are blamed on what held the CPU until a \
                 diagnosis window passes without"
            }
            (Tier::RunqBlame, Steered::Detached) => {
                "no run-queue saturation for a diagnosis window: run-queue blame turned off"
            }
            (_, Steered::Abandoned) => return None,
        })
    }
}

/// When the per-packet network programs are attached for a survey anyway: at the first judgement,
/// then every `every` (`net_packet_survey_seconds`).
#[derive(Debug)]
struct Survey {
    every: Duration,
    last: Option<Instant>,
}

impl Survey {
    /// Whether a survey starts with the judgement at `now` (and notes it).
    fn due(&mut self, now: Instant) -> bool {
        let due = self
            .last
            .is_none_or(|t| now.saturating_duration_since(t) >= self.every);
        if due {
            self.last = Some(now);
        }
        due
    }
}

/// When the daemon wants a tier attached: from a judgement that asks for it until a whole
/// diagnosis window has passed without one that does.
#[derive(Debug)]
struct Demand {
    /// How long after the last judgement that asked for them they stay attached.
    linger: Duration,
    last_asked: Option<Instant>,
}

impl Demand {
    fn new(linger: Duration) -> Self {
        Self {
            linger,
            last_asked: None,
        }
    }

    /// Takes one judgement (whether it asks for the tier, at `now`); returns whether the
    /// programs should be attached from now on.
    fn judged(&mut self, asks: bool, now: Instant) -> bool {
        if asks {
            self.last_asked = Some(now);
        }
        self.last_asked
            .is_some_and(|t| now.saturating_duration_since(t) < self.linger)
    }
}

/// The on-demand policy of every tier.
#[derive(Debug)]
pub struct Controller {
    /// Per tier (indexed as [`Tier::ALL`]); `None`: not on demand, or given up.
    demands: [Option<Demand>; Tier::COUNT],
    survey: Option<Survey>,
}

impl Controller {
    /// The policy for the tiers `probes` loaded on demand; a tier stays attached a window
    /// (`linger`) after the last judgement that asked for it. `survey_every`: how often the
    /// per-packet tier is attached for a survey (zero: never).
    pub fn new(probes: &Probes, linger: Duration, survey_every: Duration) -> Self {
        Self {
            demands: Tier::ALL.map(|tier| probes.on_demand(tier).then(|| Demand::new(linger))),
            survey: (probes.on_demand(Tier::NetPackets) && !survey_every.is_zero()).then_some(
                Survey {
                    every: survey_every,
                    last: None,
                },
            ),
        }
    }

    /// Takes one judgement's asks at `now`, attaches and detaches the tiers accordingly, and
    /// returns what changed. A tier that fails to attach or detach is given up (its status says
    /// why, `probes.abandon`) and reported as [`Steered::Abandoned`].
    pub fn judged(&mut self, probes: &mut Probes, asks: Asks, now: Instant) -> Vec<Change> {
        let survey = self.survey.as_mut().is_some_and(|s| s.due(now));
        let mut changes = Vec::new();
        for tier in Tier::ALL {
            let (wants, survey) = match tier {
                Tier::WakeKinds => (asks.storm, false),
                Tier::Futex => (asks.storm || asks.storm_candidate, false),
                Tier::NetPackets => (
                    asks.packets_did_not_fit || survey,
                    survey && !asks.packets_did_not_fit,
                ),
                Tier::RunqBlame => (asks.runqueue_wait, false),
            };
            if let Some(steered) = self.steer(probes, tier, wants, now) {
                changes.push(Change {
                    tier,
                    steered,
                    survey,
                });
            }
        }
        changes
    }

    fn steer(
        &mut self,
        probes: &mut Probes,
        tier: Tier,
        asks: bool,
        now: Instant,
    ) -> Option<Steered> {
        let slot = &mut self.demands[tier.index()];
        let demand = slot.as_mut()?;
        let want = demand.judged(asks, now);
        if want == probes.tier_attached(tier) {
            return None;
        }
        Some(match probes.set(tier, want) {
            Ok(()) if want => Steered::Attached,
            Ok(()) => Steered::Detached,
            Err(err) => {
                log::warn!(
                    "{} probes on demand: {err:#}; no longer attached on demand",
                    tier.name()
                );
                probes.abandon(tier, &format!("{err:#}"));
                *slot = None;
                Steered::Abandoned
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_bursts_start_at_once_and_again_after_their_period_while_watched() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let watch = |watching, binaries| GoMutexWatch { watching, binaries };
        let mut b = GoBursts::default();
        assert!(!b.due(watch(true, false), at(0)), "no Go binary yet");
        assert!(b.due(watch(true, true), at(1)), "the first with binaries");
        assert!(!b.due(watch(true, true), at(10)));
        assert!(
            b.due(watch(true, true), at(11)),
            "BURST_EVERY after the last"
        );
        assert!(
            !b.due(watch(false, true), at(12)),
            "the futex probes stopped"
        );
        assert!(b.due(watch(true, true), at(13)), "watched again: at once");
    }

    #[test]
    fn surveys_start_at_once_and_come_back_after_their_period() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut s = Survey {
            every: Duration::from_secs(600),
            last: None,
        };
        assert!(s.due(at(5)), "the first judgement surveys");
        assert!(!s.due(at(10)));
        assert!(!s.due(at(604)));
        assert!(s.due(at(605)), "600 s after the last one");
        assert!(!s.due(at(700)));
    }

    #[test]
    fn wake_kinds_are_wanted_from_a_storm_until_a_window_without_one() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut d = Demand::new(Duration::from_secs(30));
        assert!(!d.judged(false, at(0)), "no storm yet");
        assert!(d.judged(true, at(5)), "a storm: attach");
        assert!(d.judged(false, at(20)), "the window still has the storm");
        assert!(d.judged(true, at(30)), "still storming");
        assert!(d.judged(false, at(59)), "29 s since the last storm found");
        assert!(
            !d.judged(false, at(60)),
            "a whole window without one: detach"
        );
        assert!(d.judged(true, at(61)), "a new storm attaches again");
    }

    #[test]
    fn every_change_that_is_not_a_failure_has_its_line() {
        for tier in Tier::ALL {
            for steered in [Steered::Attached, Steered::Detached] {
                for survey in [false, true] {
                    let line = Change {
                        tier,
                        steered,
                        survey,
                    }
                    .message()
                    .expect("a line");
                    assert!(
                        line.contains("probes")
                            || line.contains("wake-ups")
                            || line.contains("blame"),
                        "{line}"
                    );
                }
            }
        }
        assert_eq!(
            Change {
                tier: Tier::Futex,
                steered: Steered::Abandoned,
                survey: false
            }
            .message(),
            None,
            "a failure is logged where it happens"
        );
    }
}
