//! The scheduler probe family: `sched_switch`, `sched_wakeup`, `sched_wakeup_new`,
//! `sched_waking`. Where `sched_switch` times the waits itself ([`waits_from_switch`]), the
//! wake-up programs only tell wake-ups local or remote, and may be attached on demand
//! ([`WakeKinds`]).

use std::collections::HashMap;

use aya::Ebpf;
use stormwatch_common::{SchedStats, globals, maps, programs};

use super::{
    AttachKind, KernelFacts, ProbeFamily, ProbeStatus, WakeKinds, attach_btf_only,
    attach_preferring_btf, btf_offsets, load_btf, pointer_path, read_per_cpu_hash_with,
    tracepoint_offsets,
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

pub struct SchedProbes {
    pub wake_kinds: WakeKinds,
}

impl ProbeFamily for SchedProbes {
    fn name(&self) -> &'static str {
        "scheduler"
    }

    fn globals(&self, facts: &KernelFacts) -> Vec<(&'static str, u32)> {
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

    fn attach(&self, ebpf: &mut Ebpf, facts: &KernelFacts) -> Vec<ProbeStatus> {
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
        let btf = switch.kind == Some(AttachKind::TpBtf);
        let why_classic = switch.note.clone();
        let mut status = vec![switch];
        // Where the switch times the waits, the wake-up programs only tell wake-ups local or
        // remote, and may wait to be asked for.
        let on_demand = self.wake_kinds == WakeKinds::OnDemand && waits_from_switch(facts, &status);
        for &(tracepoint, btf_prog, tp_prog) in wakeups {
            status.push(match (btf, &facts.aya_btf) {
                (true, Some(aya_btf)) if on_demand => load_on_demand(ebpf, aya_btf, tracepoint, btf_prog),
                (true, Some(aya_btf)) => attach_btf_only(ebpf, aya_btf, tracepoint, btf_prog, |err| {
                    format!(
                        "tp_btf failed ({err:#}); not attached as a classic tracepoint beside a \
                         tp_btf sched_switch"
                    )
                }),
                _ => {
                    let mut classic = attach_preferring_btf(ebpf, facts, tracepoint, None, tp_prog);
                    if classic.note.is_none() {
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
            (Some(btf), true) if on_demand => {
                load_on_demand(ebpf, btf, WAKING, programs::SCHED_WAKING_BTF)
            }
            (Some(btf), true) => {
                attach_btf_only(ebpf, btf, WAKING, programs::SCHED_WAKING_BTF, |err| {
                    format!("{err:#}")
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
            Err(err) => format!("tp_btf failed ({err:#}); wake-ups are not told local or remote"),
        }),
    }
}

/// Reads `CGROUP_SCHED`: each cgroup's per-CPU slots summed (the counters only grow), and its
/// on-CPU time on each CPU (which CPUs it ran on).
#[allow(clippy::type_complexity)]
pub fn read(ebpf: &Ebpf) -> anyhow::Result<(HashMap<u64, SchedStats>, HashMap<u64, Vec<u64>>)> {
    let mut by_cpu = HashMap::new();
    let totals = read_per_cpu_hash_with(ebpf, maps::CGROUP_SCHED, |id: &u64, per_cpu| {
        by_cpu.insert(
            *id,
            per_cpu.iter().map(|v: &SchedStats| v.oncpu_ns).collect(),
        );
        let mut total = SchedStats::ZERO;
        per_cpu.iter().for_each(|v| total.add(v));
        total
    })?;
    Ok((totals, by_cpu))
}

/// Forgets removed cgroups.
pub fn forget(ebpf: &mut Ebpf, cgroups: &[u64]) {
    super::remove_per_cpu_keys::<u64, SchedStats>(ebpf, maps::CGROUP_SCHED, cgroups);
}
