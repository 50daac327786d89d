//! The scheduler probe family: `sched_switch`, `sched_wakeup`, `sched_wakeup_new`,
//! `sched_waking`. Where `sched_switch` times the waits itself ([`waits_from_switch`]), the
//! wake-up programs only tell wake-ups local or remote, and may be attached on demand
//! ([`WakeKinds`]).

use std::collections::HashMap;

use aya::Ebpf;
use stormwatch_common::{RunqBlameKey, RunqBlameValue, SchedStats, globals, maps, programs};

use super::{
    AttachKind, Gone, IDLE_READS_BEFORE_EVICTION, IdleKeys, KernelFacts, Loaded, ProbeFamily,
    ProbeStatus, ReadsPart, RunqBlame, RunqBlameTier, SlotDirectory, WakeKinds, attach_btf_only,
    attach_preferring_btf, btf_offsets, busiest_first, load_btf, pointer_path,
    read_per_cpu_hash_with, remove_per_cpu_keys, tracepoint_offsets,
};
use crate::counters::Counters as _;

pub const SWITCH: &str = "sched:sched_switch";
pub const WAKEUP: &str = "sched:sched_wakeup";
pub const WAKEUP_NEW: &str = "sched:sched_wakeup_new";
/// Only for telling local from remote wake-ups (the waker's CPU); tp_btf only.
pub const WAKING: &str = "sched:sched_waking";

/// (tracepoint, tp_btf program, classic program)
const PROGRAMS: [(&str, &str, &str); 3] = [
    (
        SWITCH,
        programs::SCHED_SWITCH_BTF,
        programs::SCHED_SWITCH_TP,
    ),
    (
        WAKEUP,
        programs::SCHED_WAKEUP_BTF,
        programs::SCHED_WAKEUP_TP,
    ),
    (
        WAKEUP_NEW,
        programs::SCHED_WAKEUP_NEW_BTF,
        programs::SCHED_WAKEUP_NEW_TP,
    ),
];

/// The tp_btf programs that tell wake-ups local or remote where `sched_switch` times the
/// waits itself (see [`WakeKinds`]): (tracepoint, program), in the order they attach (and the
/// reverse of the order they detach). `sched_waking` first: from the moment `sched_wakeup` runs,
/// every wake-up it sees has had its waker's CPU recorded, and none uses a waker recorded
/// before the programs were last detached.
pub const WAKE_KIND_PROGRAMS: [(&str, &str); 3] = [
    (WAKING, programs::SCHED_WAKING_BTF),
    (WAKEUP, programs::SCHED_WAKEUP_BTF),
    (WAKEUP_NEW, programs::SCHED_WAKEUP_NEW_BTF),
];

/// The status notes of a wake-kind program loaded for [`WakeKinds::OnDemand`].
pub const ON_DEMAND_DETACHED: &str =
    "loaded, attached on demand (wake_kinds = \"on-demand\"): while a lock storm is found";
pub const ON_DEMAND_ATTACHED: &str = "attached on demand, while a lock storm is found";

/// Whether `sched_switch` alone times the run-queue wait and the off-CPU time: attached as
/// tp_btf on a kernel whose BTF has `task_struct.sched_info` (the wait as the kernel sums it).
pub fn waits_from_switch(facts: &KernelFacts, status: &[ProbeStatus]) -> bool {
    facts.sched_info
        && status
            .iter()
            .any(|s| s.tracepoint == SWITCH && s.kind == Some(AttachKind::TpBtf))
}

/// The scheduler family, with what it keeps between reads: the cgroups in direct slots, the
/// run-queue blame's switch and its idle pairs.
pub struct SchedProbes {
    wake_kinds: WakeKinds,
    /// When the switch program blames run-queue waits (`None`: never).
    blame_tier: Option<RunqBlameTier>,
    /// The globals made blaming possible (`HAVE_RUNQ_BLAME`): the offsets were found.
    blame_globals: bool,
    /// The switch program's run-queue blame, and whether it is on.
    pub(super) blame: RunqBlame,
    /// The cgroups in direct slots (`SCHED_SLOTS`).
    slots: SlotDirectory,
    idle_blame_pairs: IdleKeys<RunqBlameKey>,
}

impl SchedProbes {
    pub fn new(wake_kinds: WakeKinds, blame_tier: Option<RunqBlameTier>) -> Self {
        Self {
            wake_kinds,
            blame_tier,
            blame_globals: false,
            blame: RunqBlame::default(),
            slots: SlotDirectory::new(maps::SCHED_SLOT_DIR, maps::SCHED_SLOTS),
            idle_blame_pairs: IdleKeys::new(IDLE_READS_BEFORE_EVICTION),
        }
    }

    /// Turns the switch program's run-queue blame on (a new epoch) or off.
    pub(super) fn turn_blame(&mut self, ebpf: &mut Ebpf, on: bool) -> anyhow::Result<()> {
        if !self.blame.available || on == (self.blame.epoch != 0) {
            return Ok(());
        }
        let epoch = if on {
            self.blame.last_epoch.wrapping_add(1).max(1)
        } else {
            0
        };
        super::tiers::set_epoch(ebpf, maps::RUNQ_BLAME_ON, epoch)?;
        if on {
            self.blame.last_epoch = epoch;
        }
        self.blame.epoch = epoch;
        Ok(())
    }
}

/// The scheduler's part of a snapshot.
#[derive(Clone, Debug, Default)]
pub struct SchedPart {
    pub cgroups: HashMap<u64, SchedStats>,
    /// Per cgroup, its on-CPU time on each CPU (index = CPU number): which CPUs it ran on.
    pub oncpu_by_cpu: HashMap<u64, Vec<u64>>,
    /// Run-queue waits by (victim, culprit), while the switch program blames them.
    pub runq_blame: HashMap<RunqBlameKey, RunqBlameValue>,
}

impl SchedPart {
    /// Drops a removed cgroup (as victim or culprit of a blamed wait too), so that the next
    /// window does not subtract from it.
    pub fn forget_cgroup(&mut self, id: u64) {
        self.cgroups.remove(&id);
        self.oncpu_by_cpu.remove(&id);
        self.runq_blame
            .retain(|k, _| k.victim != id && k.culprit != id);
    }
}

impl ReadsPart for SchedProbes {
    type Part = SchedPart;

    fn read(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<SchedPart> {
        let (cgroups, oncpu_by_cpu) = read_cgroups(ebpf, &mut self.slots)?;
        let runq_blame = if self.blame.available {
            read_blame(ebpf)?
        } else {
            HashMap::new()
        };
        Ok(SchedPart {
            cgroups,
            oncpu_by_cpu,
            runq_blame,
        })
    }

    /// Removed cgroups' figures and blame pairs (as victim or culprit), then the pairs whose
    /// time has not moved for [`IDLE_READS_BEFORE_EVICTION`] reads, so that the bounded map
    /// holds the pairs of now (not a loss: a pair that comes back counts from zero).
    fn forget(&mut self, ebpf: &mut Ebpf, gone: &Gone, part: &mut SchedPart) {
        if !gone.cgroups.is_empty() {
            self.slots.release(ebpf, |id| gone.cgroup(id));
            remove_per_cpu_keys::<u64, SchedStats>(ebpf, maps::CGROUP_SCHED, gone.cgroups);
            if self.blame.available {
                forget_blame(ebpf, gone.cgroups);
            }
        }
        for id in gone.cgroups {
            part.forget_cgroup(*id);
        }
        if self.blame.available {
            let idle = self
                .idle_blame_pairs
                .idle(part.runq_blame.iter().map(|(k, v)| (*k, v.ns)));
            forget_blame_pairs(ebpf, &idle);
            for k in &idle {
                part.runq_blame.remove(k);
            }
        }
    }
}

impl ProbeFamily for SchedProbes {
    fn name(&self) -> &'static str {
        "scheduler"
    }

    /// Blaming is possible where the family's globals allowed it, the switch times the waits,
    /// and the options ask for it at some time.
    fn settle(&mut self, _ebpf: &mut Ebpf, loaded: &Loaded) {
        self.blame = RunqBlame {
            available: self.blame_globals && loaded.waits_from_switch && self.blame_tier.is_some(),
            on_demand: self.blame_tier == Some(RunqBlameTier::OnDemand),
            ..RunqBlame::default()
        };
    }

    fn globals(&mut self, facts: &KernelFacts) -> Vec<(&'static str, u32)> {
        let mut values = btf_offsets(
            facts,
            &[
                (globals::TASK_PID_OFFSET, "task_struct", &["pid"]),
                (
                    globals::TASK_STATE_OFFSET,
                    "task_struct",
                    &["__state", "state"],
                ),
                (globals::TASK_NVCSW_OFFSET, "task_struct", &["nvcsw"]),
                (globals::TASK_NIVCSW_OFFSET, "task_struct", &["nivcsw"]),
                (
                    globals::TASK_EXIT_STATE_OFFSET,
                    "task_struct",
                    &["exit_state"],
                ),
            ],
        );
        let have_offsets = values.len() == 5;
        values.push((globals::HAVE_TASK_OFFSETS, u32::from(have_offsets)));
        // The CPU a task is queued on: `task_struct.cpu` where the kernel keeps it there
        // (THREAD_INFO_IN_TASK, e.g. x86-64), else in `thread_info`.
        if let Some(btf) = &facts.btf {
            let cpu = btf.member_offset("task_struct", "cpu").or_else(|_| {
                let ti = btf.member_offset("task_struct", "thread_info")?;
                Ok::<_, super::btf::BtfError>(ti + btf.member_offset("thread_info", "cpu")?)
            });
            match cpu {
                Ok(off) => values.push((globals::TASK_CPU_OFFSET, off)),
                Err(err) => log::warn!("task_struct cpu: {err}; wake-ups are not told apart"),
            }
            // The run queue's clock for the times stamped, by direct loads instead of a helper
            // call: all or nothing (the task's cgroup id path is set for every family, by
            // `shared_globals`).
            values.extend(pointer_path(
                btf,
                &[
                    (
                        globals::TASK_CFS_RQ_OFFSET,
                        "task_struct",
                        &["se", "cfs_rq"],
                    ),
                    (globals::CFS_RQ_RQ_OFFSET, "cfs_rq", &["rq"]),
                    (globals::RQ_CLOCK_OFFSET, "rq", &["clock"]),
                ],
                globals::HAVE_RQ_CLOCK,
            ));
            // The thread's run-queue wait as the kernel sums it (CONFIG_SCHED_INFO): with it,
            // `sched_switch` alone has the run-queue wait and the off-CPU time, and the
            // wake-up programs are needed only to tell wake-ups local or remote.
            // (`facts.sched_info`: both are in BTF, and `--waits-from-wakeups` did not say no.)
            if facts.sched_info {
                values.extend(pointer_path(
                    btf,
                    &[
                        (
                            globals::TASK_RUN_DELAY_OFFSET,
                            "task_struct",
                            &["sched_info", "run_delay"],
                        ),
                        (
                            globals::TASK_PCOUNT_OFFSET,
                            "task_struct",
                            &["sched_info", "pcount"],
                        ),
                    ],
                    globals::HAVE_SCHED_INFO,
                ));
                // Run-queue blame: the incoming thread's `last_queued` (when its wait began),
                // whether it is a kernel thread, and its cgroup (the shared path): all or
                // nothing.
                let blame = pointer_path(
                    btf,
                    &[
                        (
                            globals::TASK_LAST_QUEUED_OFFSET,
                            "task_struct",
                            &["sched_info", "last_queued"],
                        ),
                        (globals::TASK_FLAGS_OFFSET, "task_struct", &["flags"]),
                    ],
                    globals::HAVE_RUNQ_BLAME,
                );
                if super::load::shared_globals(facts).is_empty() {
                    log::info!("no task cgroup path in BTF: run-queue waits are not blamed");
                } else {
                    self.blame_globals = !blame.is_empty();
                    values.extend(blame);
                }
            } else {
                log::info!(
                    "no task_struct.sched_info in BTF (or --waits-from-wakeups): the run-queue \
                     wait is timed from wake-ups"
                );
            }
            // On-CPU time as the scheduler charges it; without it the probes fall back to the
            // clock, which also counts time the hypervisor stole from the vCPU.
            match btf.offset_of("task_struct", &["se", "sum_exec_runtime"]) {
                Ok(off) => values.push((globals::TASK_RUNTIME_OFFSET, off)),
                Err(err) => log::warn!(
                    "task_struct se.sum_exec_runtime: {err}; on-CPU time falls back to the clock"
                ),
            }
        }
        values.extend(tracepoint_offsets(&[
            (
                globals::TP_SWITCH_NEXT_PID_OFFSET,
                "sched",
                "sched_switch",
                "next_pid",
            ),
            (
                globals::TP_SWITCH_PREV_STATE_OFFSET,
                "sched",
                "sched_switch",
                "prev_state",
            ),
            (
                globals::TP_WAKEUP_PID_OFFSET,
                "sched",
                "sched_wakeup",
                "pid",
            ),
        ]));
        values
    }

    fn attach(&mut self, ebpf: &mut Ebpf, facts: &KernelFacts) -> Vec<ProbeStatus> {
        // tp_btf needs the task_struct offsets as well as BTF itself.
        let have_offsets = facts.task_offsets;
        let [switch, wakeups @ ..] = &PROGRAMS;
        let (tracepoint, btf_prog, tp_prog) = *switch;
        let switch = attach_preferring_btf(
            ebpf,
            facts,
            tracepoint,
            have_offsets.then_some(btf_prog),
            tp_prog,
        );
        // The wake-ups attach as the switch did, or not at all: the two kinds keep different
        // clocks (the run queue's with tp_btf, `bpf_ktime_get_ns()` with classic tracepoints)
        // and hand wake-ups over differently (task storage, `PENDING_WAKEUPS`), so a family
        // half of each would compute intervals across two clocks or never see its wake-ups.
        // Without the switch, no wake-up program is attached: the waits they begin end at a
        // switch-in only the switch program sees (classic wake-ups would fill
        // `PENDING_WAKEUPS` for nothing).
        let switch_kind = switch.kind;
        let why_classic = switch.note.clone();
        let mut status = vec![switch];
        let without_switch = || format!("needs {SWITCH}, which is not attached");
        // Where the switch times the waits, the wake-up programs only tell wake-ups local or
        // remote, and may wait to be asked for.
        let on_demand = self.wake_kinds == WakeKinds::OnDemand && waits_from_switch(facts, &status);
        for &(tracepoint, btf_prog, tp_prog) in wakeups {
            status.push(match (switch_kind, &facts.aya_btf) {
                (None, _) => ProbeStatus {
                    tracepoint,
                    kind: None,
                    note: Some(without_switch()),
                },
                (Some(AttachKind::TpBtf), Some(aya_btf)) if on_demand => {
                    load_on_demand(ebpf, aya_btf, tracepoint, btf_prog)
                }
                (Some(AttachKind::TpBtf), _) => {
                    attach_btf_only(ebpf, facts, tracepoint, btf_prog, |err| {
                        format!(
                            "tp_btf failed ({}); not attached as a classic tracepoint beside a \
                             tp_btf sched_switch",
                            super::one_line(&err)
                        )
                    })
                }
                (Some(AttachKind::Tracepoint), _) => {
                    let mut classic = attach_preferring_btf(ebpf, facts, tracepoint, None, tp_prog);
                    if classic.attached() {
                        // Classic because the switch is: its reason is theirs.
                        classic.note = why_classic
                            .as_ref()
                            .map(|why| format!("as sched_switch: {why}"));
                    }
                    classic
                }
            });
        }
        // Local and remote wake-ups are told apart only where `sched_wakeup` reaches the
        // thread's task storage (tp_btf); with classic tracepoints there are no wake-up kinds.
        let wakeup_btf = status.iter().any(|s| {
            s.tracepoint == WAKEUP && (s.kind == Some(AttachKind::TpBtf) || s.on_demand())
        });
        status.push(match (&facts.aya_btf, wakeup_btf) {
            _ if switch_kind.is_none() => ProbeStatus {
                tracepoint: WAKING,
                kind: None,
                note: Some(without_switch()),
            },
            (Some(btf), true) if on_demand => {
                load_on_demand(ebpf, btf, WAKING, programs::SCHED_WAKING_BTF)
            }
            (Some(_), true) => {
                attach_btf_only(ebpf, facts, WAKING, programs::SCHED_WAKING_BTF, |err| {
                    super::one_line(&err)
                })
            }
            _ => ProbeStatus {
                tracepoint: WAKING,
                kind: None,
                note: Some(
                    "needs sched_wakeup as tp_btf; wake-ups are not told local or remote"
                        .to_owned(),
                ),
            },
        });
        status
    }
}

/// Each (victim, culprit) pair's run-queue wait so far, summed over CPUs (`RUNQ_BLAME`).
fn read_blame(ebpf: &Ebpf) -> anyhow::Result<HashMap<RunqBlameKey, RunqBlameValue>> {
    super::read_per_cpu_hash(ebpf, maps::RUNQ_BLAME, RunqBlameValue::ZERO, |t, v| {
        t.ns = t.ns.wrapping_add(v.ns)
    })
}

/// Deletes the given pairs (idle ones).
fn forget_blame_pairs(ebpf: &mut Ebpf, pairs: &[RunqBlameKey]) {
    if pairs.is_empty() {
        return;
    }
    remove_per_cpu_keys::<RunqBlameKey, RunqBlameValue>(ebpf, maps::RUNQ_BLAME, pairs);
}

/// Deletes the pairs of removed cgroups, as victim or as culprit.
fn forget_blame(ebpf: &mut Ebpf, cgroups: &[u64]) {
    super::remove_per_cpu_matching::<RunqBlameKey, RunqBlameValue>(ebpf, maps::RUNQ_BLAME, |k| {
        cgroups.contains(&k.victim) || cgroups.contains(&k.culprit)
    });
}

/// Reads `CGROUP_SCHED` and the placed cgroups' direct slots: each cgroup's figures summed
/// over CPUs and its on-CPU time on each CPU (which CPUs it ran on). Then places the cgroups
/// that have no slot yet, those that switch most first.
#[allow(clippy::type_complexity)]
fn read_cgroups(
    ebpf: &mut Ebpf,
    slots: &mut SlotDirectory,
) -> anyhow::Result<(HashMap<u64, SchedStats>, HashMap<u64, Vec<u64>>)> {
    let mut by_cpu: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut totals = read_per_cpu_hash_with(ebpf, maps::CGROUP_SCHED, |id: &u64, per_cpu| {
        add_per_cpu(&mut by_cpu, *id, per_cpu)
    })?;
    let busiest = busiest_first(
        totals
            .iter()
            .map(|(id, s)| (*id, s.voluntary_switches + s.involuntary_switches)),
    );
    slots.merge_each_cpu(ebpf, busiest, |id, per_cpu: &[SchedStats]| {
        let slot = add_per_cpu(&mut by_cpu, id, per_cpu);
        totals.entry(id).or_insert(SchedStats::ZERO).add(&slot);
    })?;
    Ok((totals, by_cpu))
}

/// Adds one place's per-CPU figures of cgroup `id` (its hash entry's, or its slot's) to its
/// on-CPU time by CPU; returns their sum.
fn add_per_cpu(by_cpu: &mut HashMap<u64, Vec<u64>>, id: u64, per_cpu: &[SchedStats]) -> SchedStats {
    let cpus = by_cpu.entry(id).or_insert_with(|| vec![0; per_cpu.len()]);
    if cpus.len() < per_cpu.len() {
        cpus.resize(per_cpu.len(), 0);
    }
    let mut total = SchedStats::ZERO;
    for (cpu, v) in per_cpu.iter().enumerate() {
        cpus[cpu] += v.oncpu_ns;
        total.add(v);
    }
    total
}

/// Loads a wake-kind program for [`WakeKinds::OnDemand`], without attaching it.
fn load_on_demand(
    ebpf: &mut Ebpf,
    btf: &aya::Btf,
    tracepoint: &'static str,
    program: &str,
) -> ProbeStatus {
    let (_, event) = tracepoint.split_once(':').expect("category:event");
    ProbeStatus {
        tracepoint,
        kind: None,
        note: Some(match load_btf(ebpf, program, event, btf) {
            Ok(_) => ON_DEMAND_DETACHED.to_owned(),
            Err(err) => format!(
                "tp_btf failed ({}); wake-ups are not told local or remote",
                super::one_line(&err)
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroups_hash_and_slot_figures_add_up_per_cpu() {
        let mut by_cpu = HashMap::new();
        let stats = |switches: u64, oncpu_ns: u64| SchedStats {
            voluntary_switches: switches,
            oncpu_ns,
            ..SchedStats::ZERO
        };
        let hash = add_per_cpu(&mut by_cpu, 7, &[stats(3, 100), stats(0, 0)]);
        let slot = add_per_cpu(&mut by_cpu, 7, &[stats(1, 10), stats(5, 50)]);
        assert_eq!(hash.voluntary_switches + slot.voluntary_switches, 9);
        assert_eq!(hash.oncpu_ns + slot.oncpu_ns, 160);
        assert_eq!(by_cpu[&7], vec![110, 50]);
    }
}
