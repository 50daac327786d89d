//! tracefs: where classic tracepoints live, and their record formats.

use std::path::PathBuf;

pub const TRACEFS: &str = "/sys/kernel/tracing";
const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";

/// The directory holding `events/`, if tracefs is mounted at either usual place.
pub fn root() -> Option<PathBuf> {
    [TRACEFS, DEBUGFS_TRACING]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("events").is_dir())
}

/// Mounts tracefs at /sys/kernel/tracing if it is mounted nowhere. Failure is not fatal: tp_btf
/// programs do not need it, and the classic-tracepoint probes report their own failure.
pub fn ensure_mounted() {
    if root().is_some() {
        return;
    }
    if let Err(err) = rustix::mount::mount(
        "tracefs",
        TRACEFS,
        "tracefs",
        rustix::mount::MountFlags::empty(),
        None,
    ) {
        log::debug!("could not mount tracefs at {TRACEFS}: {err}");
    }
}

/// Whether `category:name` exists as a classic tracepoint.
pub fn tracepoint_exists(category: &str, name: &str) -> bool {
    root().is_some_and(|r| r.join("events").join(category).join(name).is_dir())
}

/// The byte offset of `field` in the record of tracepoint `category:name`.
pub fn field_offset(category: &str, name: &str, field: &str) -> Option<u32> {
    let path = root()?
        .join("events")
        .join(category)
        .join(name)
        .join("format");
    parse_field_offset(&crate::files::kernel_text(&path)?, field)
}

/// Finds `field:<type> <field>;\toffset:N;` in a tracepoint format file.
pub fn parse_field_offset(format: &str, field: &str) -> Option<u32> {
    format.lines().find_map(|line| {
        let line = line.trim();
        let decl = line.strip_prefix("field:")?;
        let (decl, rest) = decl.split_once(';')?;
        // The declaration's last word is the field name, possibly with an array suffix.
        let name = decl.split_whitespace().last()?;
        let name = name.split('[').next()?;
        if name != field {
            return None;
        }
        let offset = rest.trim().strip_prefix("offset:")?;
        offset.split(';').next()?.trim().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHED_SWITCH: &str = "name: sched_switch
ID: 316
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prev_prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;
\tfield:char next_comm[16];\toffset:40;\tsize:16;\tsigned:0;
\tfield:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;
\tfield:int next_prio;\toffset:60;\tsize:4;\tsigned:1;
";

    #[test]
    fn finds_fields_by_exact_name() {
        assert_eq!(parse_field_offset(SCHED_SWITCH, "next_pid"), Some(56));
        assert_eq!(parse_field_offset(SCHED_SWITCH, "prev_pid"), Some(24));
        assert_eq!(parse_field_offset(SCHED_SWITCH, "prev_state"), Some(32));
        assert_eq!(parse_field_offset(SCHED_SWITCH, "prev_comm"), Some(8));
        assert_eq!(parse_field_offset(SCHED_SWITCH, "pid"), None);
        assert_eq!(parse_field_offset("", "pid"), None);
    }
}
