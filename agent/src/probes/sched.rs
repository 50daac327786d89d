//! The scheduler probe family: `sched_switch`, `sched_wakeup`, `sched_wakeup_new`.

use std::collections::HashMap;

use aya::{
    Ebpf,
    maps::PerCpuHashMap,
    programs::{BtfTracePoint, TracePoint},
};
use stormwatch_common::{SchedStats, globals, maps, programs};

use super::{AttachKind, KernelFacts, ProbeFamily, ProbeStatus, btf_offsets, tracefs};

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
            ],
        );
        let have_offsets = values.len() == 4;
        values.push((globals::HAVE_TASK_OFFSETS, u32::from(have_offsets)));
        for (global, event, field) in [
            (
                globals::TP_SWITCH_NEXT_PID_OFFSET,
                "sched_switch",
                "next_pid",
            ),
            (
                globals::TP_SWITCH_PREV_STATE_OFFSET,
                "sched_switch",
                "prev_state",
            ),
            (globals::TP_WAKEUP_PID_OFFSET, "sched_wakeup", "pid"),
        ] {
            if let Some(off) = tracefs::field_offset("sched", event, field) {
                values.push((global, off));
            }
        }
        values
    }

    fn attach(&self, ebpf: &mut Ebpf, facts: &KernelFacts) -> Vec<ProbeStatus> {
        // tp_btf needs the task_struct offsets as well as BTF itself.
        let have_offsets = facts.btf.is_some()
            && facts
                .btf
                .as_ref()
                .is_some_and(|b| b.member_offset("task_struct", "nvcsw").is_ok());
        PROGRAMS
            .iter()
            .map(|(tracepoint, btf_prog, tp_prog)| {
                let (category, event) = tracepoint.split_once(':').expect("category:event");
                let mut fallback_note = None;
                if let (Some(btf), true) = (&facts.aya_btf, have_offsets) {
                    match attach_btf(ebpf, btf_prog, event, btf) {
                        Ok(()) => {
                            return ProbeStatus {
                                tracepoint,
                                kind: Some(AttachKind::TpBtf),
                                note: None,
                            };
                        }
                        Err(err) => fallback_note = Some(format!("tp_btf failed ({err:#})")),
                    }
                } else if let Some(why) = &facts.btf_error {
                    fallback_note = Some(format!("no tp_btf: {why}"));
                }
                match attach_classic(ebpf, tp_prog, category, event) {
                    Ok(()) => ProbeStatus {
                        tracepoint,
                        kind: Some(AttachKind::Tracepoint),
                        note: fallback_note,
                    },
                    Err(err) => ProbeStatus {
                        tracepoint,
                        kind: None,
                        note: Some(match fallback_note {
                            Some(first) => format!("{first}; tracepoint failed ({err:#})"),
                            None => format!("tracepoint failed ({err:#})"),
                        }),
                    },
                }
            })
            .collect()
    }
}

fn attach_btf(ebpf: &mut Ebpf, program: &str, event: &str, btf: &aya::Btf) -> anyhow::Result<()> {
    let prog: &mut BtfTracePoint = ebpf
        .program_mut(program)
        .ok_or_else(|| anyhow::anyhow!("program {program} missing from the object"))?
        .try_into()?;
    prog.load(event, btf)?;
    prog.attach()?;
    Ok(())
}

fn attach_classic(
    ebpf: &mut Ebpf,
    program: &str,
    category: &str,
    event: &str,
) -> anyhow::Result<()> {
    if !tracefs::tracepoint_exists(category, event) {
        anyhow::bail!("{category}:{event} does not exist (or tracefs is not mounted)");
    }
    let prog: &mut TracePoint = ebpf
        .program_mut(program)
        .ok_or_else(|| anyhow::anyhow!("program {program} missing from the object"))?
        .try_into()?;
    prog.load()?;
    prog.attach(category, event)?;
    Ok(())
}

/// Reads `CGROUP_SCHED`, summing each cgroup's per-CPU slots. The counters only grow.
pub fn read(ebpf: &Ebpf) -> anyhow::Result<HashMap<u64, SchedStats>> {
    let map = ebpf
        .map(maps::CGROUP_SCHED)
        .ok_or_else(|| anyhow::anyhow!("map {} missing", maps::CGROUP_SCHED))?;
    let map = PerCpuHashMap::<_, u64, SchedStats>::try_from(map)?;
    let mut out = HashMap::new();
    for entry in map.iter() {
        let (cgroup_id, per_cpu) = entry?;
        let mut total = SchedStats::ZERO;
        for v in per_cpu.iter() {
            add_sched(&mut total, v);
        }
        out.insert(cgroup_id, total);
    }
    Ok(out)
}

/// Forgets a cgroup's counters (the cgroup was removed).
pub fn forget(ebpf: &mut Ebpf, cgroup_id: u64) {
    if let Some(map) = ebpf.map_mut(maps::CGROUP_SCHED)
        && let Ok(mut map) = PerCpuHashMap::<_, u64, SchedStats>::try_from(map)
    {
        let _ = map.remove(&cgroup_id);
    }
}

pub fn add_sched(total: &mut SchedStats, v: &SchedStats) {
    total.voluntary_switches += v.voluntary_switches;
    total.involuntary_switches += v.involuntary_switches;
    total.migrations += v.migrations;
    total.oncpu_ns += v.oncpu_ns;
    total.offcpu_ns += v.offcpu_ns;
    total.runq.count += v.runq.count;
    total.runq.sum_ns += v.runq.sum_ns;
    for (t, b) in total.runq.buckets.iter_mut().zip(v.runq.buckets.iter()) {
        *t += b;
    }
}
