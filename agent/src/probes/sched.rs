//! The scheduler probe family: `sched_switch`, `sched_wakeup`, `sched_wakeup_new`.

use std::collections::HashMap;

use aya::Ebpf;
use stormwatch_common::{SchedStats, globals, maps, programs};

use super::{
    KernelFacts, ProbeFamily, ProbeStatus, attach_preferring_btf, btf_offsets, read_per_cpu_hash,
    tracepoint_offsets,
};
use crate::collect::Counters as _;

pub const SWITCH: &str = "sched:sched_switch";
pub const WAKEUP: &str = "sched:sched_wakeup";
pub const WAKEUP_NEW: &str = "sched:sched_wakeup_new";

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

pub struct SchedProbes;

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
        PROGRAMS
            .iter()
            .map(|(tracepoint, btf_prog, tp_prog)| {
                let btf_prog = have_offsets.then_some(*btf_prog);
                attach_preferring_btf(ebpf, facts, tracepoint, btf_prog, tp_prog)
            })
            .collect()
    }
}

/// Reads `CGROUP_SCHED`, summing each cgroup's per-CPU slots. The counters only grow.
pub fn read(ebpf: &Ebpf) -> anyhow::Result<HashMap<u64, SchedStats>> {
    read_per_cpu_hash(ebpf, maps::CGROUP_SCHED, SchedStats::ZERO, |t, v| t.add(v))
}

/// Forgets removed cgroups.
pub fn forget(ebpf: &mut Ebpf, cgroups: &[u64]) {
    for id in cgroups {
        super::remove_per_cpu_keys::<u64, SchedStats>(ebpf, maps::CGROUP_SCHED, |k| k == id);
    }
}
