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

/// Loads and attaches a tp_btf program against the facts' BTF; with a BTF file the user gave,
/// checks that the kernel attached it where asked ([`check_attached_to`]).
pub(crate) fn attach_btf(
    ebpf: &mut Ebpf,
    program: &str,
    event: &str,
    facts: &KernelFacts,
) -> anyhow::Result<()> {
    let Some(btf) = &facts.aya_btf else {
        anyhow::bail!(
            "no tp_btf: {}",
            facts.btf_error.as_deref().unwrap_or("no kernel BTF")
        );
    };
    if let Some(why) = facts.btf_mismatch.borrow().as_ref() {
        anyhow::bail!("{why}");
    }
    let prog = match load_btf(ebpf, program, event, btf) {
        Ok(prog) => prog,
        // The kernel refused the type id aya took from the file: it names no tracepoint (or
        // another kind of type) in the running kernel's BTF.
        Err(err) if facts.btf_external && format!("{err:#}").contains("attach_btf_id") => {
            let why = format!(
                "{} is not the running kernel's BTF: {}",
                facts.btf_path.display(),
                one_line(&err)
            );
            facts.btf_mismatch.borrow_mut().get_or_insert(why.clone());
            anyhow::bail!(why);
        }
        Err(err) => return Err(err),
    };
    let link = prog.attach()?;
    if facts.btf_external
        && let Err(err) = check_attached_to(prog, event)
    {
        let _ = prog.detach(link);
        let why = format!(
            "{} is not the running kernel's BTF: {err}",
            facts.btf_path.display()
        );
        facts.btf_mismatch.borrow_mut().get_or_insert(why.clone());
        anyhow::bail!(why);
    }
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

/// Loads (verifies) uprobe programs without attaching them: a family's uprobes are attached
/// later, to the binaries it finds.
pub(crate) fn load_uprobes(ebpf: &mut Ebpf, programs: &[&str]) -> anyhow::Result<()> {
    for name in programs {
        let p: &mut aya::programs::UProbe = ebpf
            .program_mut(name)
            .ok_or_else(|| anyhow::anyhow!("program {name} missing from the object"))?
            .try_into()?;
        p.load()?;
    }
    Ok(())
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
    facts: &KernelFacts,
    tracepoint: &'static str,
    program: &str,
    why: impl FnOnce(anyhow::Error) -> String,
) -> ProbeStatus {
    let (_, event) = tracepoint.split_once(':').expect("category:event");
    match attach_btf(ebpf, program, event, facts) {
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
    let fallback_note = match btf_program {
        Some(btf_program) if facts.aya_btf.is_some() => {
            let status = attach_btf_only(ebpf, facts, tracepoint, btf_program, |err| {
                format!("tp_btf failed: {}", one_line(&err))
            });
            if status.kind.is_some() || facts.btf_mismatch.borrow().is_some() {
                // Attached; or the BTF file is another kernel's, and the classic program
                // would read that kernel's offsets: the load fails instead.
                return status;
            }
            status.note
        }
        _ => Some(no_tp_btf(facts)),
    };
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
                Some(first) => format!("{first}; tracepoint failed: {}", one_line(&err)),
                None => format!("tracepoint failed: {}", one_line(&err)),
            }),
        },
    }
}
