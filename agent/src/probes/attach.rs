//! Attaching programs: as tp_btf where the kernel allows, else as classic tracepoints, each
//! with a status saying how it is attached or why not.

use super::*;

/// How a program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttachKind {
    /// BTF-enabled raw tracepoint: the cheapest kind, needs kernel BTF.
    TpBtf,
    /// Classic tracepoint via tracefs: the fallback.
    Tracepoint,
}

impl fmt::Display for AttachKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::TpBtf => "tp_btf",
            Self::Tracepoint => "tracepoint",
        })
    }
}

/// What became of one probe (one tracepoint).
#[derive(Clone, Debug, serde::Serialize)]
pub struct ProbeStatus {
    /// `category:event`, e.g. `sched:sched_switch`.
    pub tracepoint: &'static str,
    /// How it is attached, or `None` when it is not.
    pub kind: Option<AttachKind>,
    /// Why it is not attached, or why it fell back.
    pub note: Option<String>,
}

impl ProbeStatus {
    pub fn attached(&self) -> bool {
        self.kind.is_some()
    }

    /// Loaded at start and attached only while asked for ([`WakeKinds::OnDemand`]).
    pub fn on_demand(&self) -> bool {
        matches!(
            self.note.as_deref(),
            Some(
                sched::ON_DEMAND_DETACHED
                    | sched::ON_DEMAND_ATTACHED
                    | futex::ON_DEMAND_DETACHED
                    | futex::ON_DEMAND_ATTACHED
                    | net::ON_DEMAND_DETACHED
                    | net::ON_DEMAND_ATTACHED
            )
        )
    }
}

/// Loads and attaches a tp_btf program.
pub(crate) fn attach_btf(
    ebpf: &mut Ebpf,
    program: &str,
    event: &str,
    btf: &aya::Btf,
) -> anyhow::Result<()> {
    load_btf(ebpf, program, event, btf)?.attach()?;
    Ok(())
}

/// Loads a tp_btf program (the verifier checks it now), to attach now or later.
pub(crate) fn load_btf<'a>(
    ebpf: &'a mut Ebpf,
    program: &str,
    event: &str,
    btf: &aya::Btf,
) -> anyhow::Result<&'a mut BtfTracePoint> {
    let prog: &mut BtfTracePoint = ebpf
        .program_mut(program)
        .ok_or_else(|| anyhow::anyhow!("program {program} missing from the object"))?
        .try_into()?;
    prog.load(event, btf)?;
    Ok(prog)
}

/// Loads (verifies) a classic tracepoint program without attaching it; nothing when it is loaded
/// already (one program may serve several tracepoints).
pub(crate) fn load_classic(ebpf: &mut Ebpf, program: &str) -> anyhow::Result<()> {
    let p: &mut aya::programs::TracePoint = ebpf
        .program_mut(program)
        .ok_or_else(|| anyhow::anyhow!("program {program} missing from the object"))?
        .try_into()?;
    if p.fd().is_err() {
        p.load()?;
    }
    Ok(())
}

/// Attaches a tp_btf program with no classic fallback; `why` words the note when it fails.
pub(crate) fn attach_btf_only(
    ebpf: &mut Ebpf,
    btf: &aya::Btf,
    tracepoint: &'static str,
    program: &str,
    why: impl FnOnce(anyhow::Error) -> String,
) -> ProbeStatus {
    let (_, event) = tracepoint.split_once(':').expect("category:event");
    match attach_btf(ebpf, program, event, btf) {
        Ok(()) => ProbeStatus {
            tracepoint,
            kind: Some(AttachKind::TpBtf),
            note: None,
        },
        Err(err) => ProbeStatus {
            tracepoint,
            kind: None,
            note: Some(why(err)),
        },
    }
}

/// Loads (once) and attaches a classic tracepoint program; a program may be attached to
/// several tracepoints with alike records.
pub(crate) fn attach_classic(
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
    if prog.fd().is_err() {
        prog.load()?;
    }
    prog.attach(category, event)?;
    Ok(())
}

/// Attaches one tracepoint, preferring tp_btf (when `btf_program` is given and the kernel has
/// BTF) and falling back to the classic tracepoint.
pub(crate) fn attach_preferring_btf(
    ebpf: &mut Ebpf,
    facts: &KernelFacts,
    tracepoint: &'static str,
    btf_program: Option<&str>,
    classic_program: &str,
) -> ProbeStatus {
    let (category, event) = tracepoint.split_once(':').expect("category:event");
    let mut fallback_note = None;
    if let Some(btf_program) = btf_program {
        match &facts.aya_btf {
            Some(btf) => {
                let status = attach_btf_only(ebpf, btf, tracepoint, btf_program, |err| {
                    format!("tp_btf failed ({err:#})")
                });
                if status.kind.is_some() {
                    return status;
                }
                fallback_note = status.note;
            }
            None => {
                fallback_note = facts
                    .btf_error
                    .as_ref()
                    .map(|why| format!("no tp_btf: {why}"))
            }
        }
    }
    match attach_classic(ebpf, classic_program, category, event) {
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
}
