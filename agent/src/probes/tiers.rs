//! The tiers of programs the daemon attaches on demand: loaded (verified) at start, attached
//! and detached as [`super::demand`] decides, each in the one order of [`Tier::ALL`].

use super::*;

/// When a tier of probes that the daemon attaches on demand is attached: the wake-up programs
/// ([`WakeKinds`]), the futex programs ([`FutexTier`]) or the per-packet network programs
/// ([`NetPacketTier`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case", try_from = "String")]
pub enum AttachWhen {
    /// With every other probe (`trace`, `diagnose`).
    #[default]
    Always,
    /// Loaded (verified) at start, attached only while the daemon asks for them.
    OnDemand,
}

/// From a config file's string, naming the valid values when it is none of them (a value of
/// another type is refused as "expected a string").
impl TryFrom<String> for AttachWhen {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        match s.as_str() {
            "always" => Ok(Self::Always),
            "on-demand" => Ok(Self::OnDemand),
            _ => Err(format!("`{s}` is not one of \"on-demand\", \"always\"")),
        }
    }
}

/// When the programs that tell wake-ups local or remote (`sched_waking`, `sched_wakeup`,
/// `sched_wakeup_new`) are attached. They run at every wake-up of every thread on the node, and
/// are most of the scheduler probes' cost on a switch-heavy load; the figures the rest of the
/// agent exports do not need them where the kernel keeps `sched_info` (tp_btf). On demand
/// ([`Probes::set`] with [`Tier::WakeKinds`]) the daemon asks while it finds a lock storm,
/// whose hand-offs they explain. Where the wake-up programs time the run-queue wait (no
/// `sched_info`, classic tracepoints), they are always attached instead.
pub type WakeKinds = AttachWhen;

/// When the futex programs (`syscalls:sys_{enter,exit}_futex*`) are attached. Any attached
/// `syscalls:` tracepoint puts every thread of the node on the kernel's syscall slow path (12%
/// more per system call, measured), so the daemon attaches them on demand
/// ([`Probes::set`] with [`Tier::Futex`]): while a cgroup's scheduler figures show what a lock
/// storm needs.
pub type FutexTier = AttachWhen;

/// When the per-packet network programs (`net:net_dev_start_xmit`, `net:netif_receive_skb`)
/// are attached. They run for every packet of every interface — about 0.4 µs per packet each
/// way here, several percent of a loopback Redis request — where the drop and retransmit
/// programs run only for what went wrong. On demand ([`Probes::set`]) the daemon asks while a
/// network namespace shows packets that did not fit (the kernel's fragmentation and ICMP
/// counters, drops for being too big).
pub type NetPacketTier = AttachWhen;

/// When `sched_switch` blames run-queue waits on what held the CPU ([`RunqBlame`]): a ring of
/// each CPU's last runs written and walked at every switch, so a cost on the hottest program.
/// On demand the daemon asks while a container's threads wait for CPUs
/// (`runqueue_saturation`); `trace` and `diagnose` blame from the start.
pub type RunqBlameTier = AttachWhen;

/// The run-queue blame step of `sched_switch` ([`Tier::RunqBlame`]): not a program of its own
/// (a second program on the hottest tracepoint would cost its dispatch on every switch) but a
/// switch the agent turns with `RUNQ_BLAME_ON`, whose value is an epoch raised at each turn
/// on, so that no CPU blames a wait on runs kept before the last turn off.
#[derive(Debug, Default)]
pub struct RunqBlame {
    /// The switch program can blame (tp_btf with `sched_info` and the task's cgroup path).
    pub available: bool,
    /// Turned on and off by the on-demand controller; else on from the start when available.
    pub on_demand: bool,
    /// The epoch written while on; 0 while off.
    pub epoch: u32,
    /// The last epoch used.
    pub last_epoch: u32,
}
/// A tier of programs the daemon attaches on demand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// The wake-up programs that tell wake-ups local or remote.
    WakeKinds = 0,
    /// The futex syscall programs.
    Futex = 1,
    /// The transmit and receive programs.
    NetPackets = 2,
    /// The run-queue blame step of the switch program ([`RunqBlame`]).
    RunqBlame = 3,
}

impl Tier {
    /// Every tier, in the one order that every per-tier array follows.
    pub const ALL: [Tier; 4] = [
        Tier::WakeKinds,
        Tier::Futex,
        Tier::NetPackets,
        Tier::RunqBlame,
    ];
    pub const COUNT: usize = Tier::ALL.len();

    /// The (tracepoint, program) pairs of the tier.
    pub fn programs(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Tier::WakeKinds => &sched::WAKE_KIND_PROGRAMS,
            Tier::Futex => &futex::PROGRAMS,
            Tier::NetPackets => &net::PACKET_PROGRAMS,
            Tier::RunqBlame => &[],
        }
    }

    /// Its place in [`Tier::ALL`] and in every per-tier array.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// How the daemon's messages name the tier ("the futex probes").
    pub fn name(self) -> &'static str {
        match self {
            Tier::WakeKinds => "wake-up",
            Tier::Futex => "futex",
            Tier::NetPackets => "per-packet network",
            Tier::RunqBlame => "run-queue blame",
        }
    }
}

impl Probes {
    /// Whether the programs of `tier` wait to be attached on demand.
    pub fn on_demand(&self, tier: Tier) -> bool {
        if tier == Tier::RunqBlame {
            let blame = &self.families.sched.blame;
            return blame.available && blame.on_demand;
        }
        !self.tiers[tier.index()].is_empty()
    }

    /// Whether the on-demand programs of `tier` are attached now.
    pub fn tier_attached(&self, tier: Tier) -> bool {
        if tier == Tier::RunqBlame {
            return self.families.sched.blame.epoch != 0;
        }
        self.tiers[tier.index()].iter().any(|p| p.link.is_some())
    }

    /// Whether `sched_switch` can blame run-queue waits (now, or when asked).
    pub fn can_blame_runqueue(&self) -> bool {
        self.families.sched.blame.available
    }

    /// Whether `sched_switch` blames run-queue waits now.
    pub fn blames_runqueue(&self) -> bool {
        self.families.sched.blame.epoch != 0
    }

    /// Detaches the on-demand programs of `tier` for good (after an error), their status
    /// saying `why`.
    pub fn abandon(&mut self, tier: Tier, why: &str) {
        let _ = self.set(tier, false);
        if tier == Tier::RunqBlame {
            let blame = &mut self.families.sched.blame;
            blame.on_demand = false;
            blame.available = false;
            return;
        }
        abandon(&mut self.tiers[tier.index()], &mut self.status, why);
    }

    /// Attaches (`on`) or detaches the programs of `tier` loaded to be attached on demand, and
    /// updates their status; nothing when they are not on demand. On an error the programs
    /// attached so far stay so, and their status says it. Before the futex programs attach,
    /// their attach epoch is raised, so that a call whose entry was seen before the last
    /// detach is never paired with an exit seen now (it is counted as unpaired instead).
    pub fn set(&mut self, tier: Tier, on: bool) -> anyhow::Result<()> {
        if tier == Tier::RunqBlame {
            return self.families.sched.turn_blame(&mut self.ebpf, on);
        }
        if tier == Tier::Futex && on && !self.tier_attached(tier) {
            self.families.futex.raise_epoch(&mut self.ebpf)?;
        }
        let notes = match tier {
            Tier::WakeKinds => (sched::ON_DEMAND_ATTACHED, sched::ON_DEMAND_DETACHED),
            Tier::Futex => (futex::ON_DEMAND_ATTACHED, futex::ON_DEMAND_DETACHED),
            Tier::NetPackets => (net::ON_DEMAND_ATTACHED, net::ON_DEMAND_DETACHED),
            Tier::RunqBlame => unreachable!("turned above"),
        };
        set_tier(
            &mut self.ebpf,
            &mut self.tiers[tier.index()],
            &mut self.status,
            on,
            notes,
            self.check_attach,
        )
    }
}

/// The globals of the kernel crate's shared code, whichever families load: from a task to its
/// cgroup v2 id (`task->cgroups->dfl_cgrp->kn->id`), which the scheduler, futex and lock probes
/// read by loads rather than a helper call (`shared::task_cgroup_id`).
/// Writes the one u32 slot of the array map `map`: an on-demand tier's epoch (the futex
/// probes' attach epoch, the run-queue blame's switch).
pub(super) fn set_epoch(ebpf: &mut Ebpf, map: &str, value: u32) -> anyhow::Result<()> {
    let mut slot: aya::maps::Array<_, u32> = ebpf
        .map_mut(map)
        .ok_or_else(|| anyhow::anyhow!("map {map} missing"))?
        .try_into()?;
    slot.set(0, &value, 0)?;
    Ok(())
}

/// A program loaded at start and attached only on demand.
#[derive(Debug)]
pub(super) struct OnDemand {
    pub(super) tracepoint: &'static str,
    pub(super) program: &'static str,
    pub(super) link: Option<OnDemandLink>,
}

/// The link of an on-demand program while it is attached.
#[derive(Debug)]
pub(super) enum OnDemandLink {
    Btf(BtfTracePointLinkId),
    Classic(TracePointLinkId),
}

/// Attaches (`on`) or detaches a tier of on-demand programs — in their order, detached in the
/// reverse — and sets their status with the tier's (attached, detached) notes. On an error the
/// programs attached so far stay so, and their status says it.
pub(super) fn set_tier(
    ebpf: &mut Ebpf,
    tier: &mut [OnDemand],
    status: &mut [ProbeStatus],
    on: bool,
    (attached, detached): (&str, &str),
    check_attach: bool,
) -> anyhow::Result<()> {
    let order: Vec<usize> = if on {
        (0..tier.len()).collect()
    } else {
        (0..tier.len()).rev().collect()
    };
    for i in order {
        let OnDemand {
            tracepoint,
            program,
            link,
        } = &mut tier[i];
        if on == link.is_some() {
            continue;
        }
        let prog = ebpf
            .program_mut(program)
            .ok_or_else(|| anyhow::anyhow!("program {program} missing from the object"))?;
        let kind = match (link.take(), prog) {
            (Some(OnDemandLink::Btf(id)), aya::programs::Program::BtfTracePoint(p)) => {
                p.detach(id)?;
                AttachKind::TpBtf
            }
            (Some(OnDemandLink::Classic(id)), aya::programs::Program::TracePoint(p)) => {
                p.detach(id)?;
                AttachKind::Tracepoint
            }
            (None, aya::programs::Program::BtfTracePoint(p)) => {
                let id = p.attach()?;
                let (_, event) = tracepoint.split_once(':').expect("category:event");
                if check_attach && let Err(err) = check_attached_to(p, event) {
                    let _ = p.detach(id);
                    return Err(err.context("the BTF file is not the running kernel's"));
                }
                *link = Some(OnDemandLink::Btf(id));
                AttachKind::TpBtf
            }
            (None, aya::programs::Program::TracePoint(p)) => {
                let (category, event) = tracepoint.split_once(':').expect("category:event");
                *link = Some(OnDemandLink::Classic(p.attach(category, event)?));
                AttachKind::Tracepoint
            }
            (_, other) => {
                anyhow::bail!("{program}: unexpected program type {:?}", other.prog_type())
            }
        };
        if let Some(s) = status.iter_mut().find(|s| s.tracepoint == *tracepoint) {
            (s.kind, s.note) = if on {
                (Some(kind), Some(attached.to_owned()))
            } else {
                (None, Some(detached.to_owned()))
            };
        }
    }
    Ok(())
}

/// Forgets a tier's programs after an error, their status saying `why`.
pub(super) fn abandon(tier: &mut Vec<OnDemand>, status: &mut [ProbeStatus], why: &str) {
    for p in tier.drain(..) {
        if let Some(s) = status.iter_mut().find(|s| s.tracepoint == p.tracepoint) {
            (s.kind, s.note) = (None, Some(format!("attaching on demand failed: {why}")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tier_has_its_place_in_the_one_order() {
        for (i, tier) in Tier::ALL.into_iter().enumerate() {
            assert_eq!(tier.index(), i, "{}", tier.name());
        }
    }

    #[test]
    fn tiers_are_named_as_the_logs_have_them() {
        // The pod test looks for "<name> probes on demand:" in the logs to see a refusal.
        assert_eq!(Tier::WakeKinds.name(), "wake-up");
        assert_eq!(Tier::Futex.name(), "futex");
        assert_eq!(Tier::NetPackets.name(), "per-packet network");
        assert_eq!(Tier::RunqBlame.name(), "run-queue blame");
    }
}
