//! PostgreSQL's heavyweight lock waits (`ebpf-probes/kernel/src/pglock.rs`): uprobes at the
//! USDT sites `postgresql:lock__wait__start` and `lock__wait__done` of the PostgreSQL binaries
//! the agent finds, loaded with the futex family, attached while a process runs the binary.
//!
//! A backend waiting for a row, a transaction id or a relation sleeps on its latch in
//! `epoll_wait`: no futex, no kernel lock, and waits for a client look the same to the kernel.
//! These sites fire only for lock waits, once per wait — a few thousand times a second in a
//! storm on one row — so the uprobes stay attached (no bursts, unlike Go's mutex).
//!
//! Binaries are found through `/proc/<pid>/exe` (the kernel resolves the link to a
//! container's own file), by their SDT notes ([`super::stapsdt`]): a binary with both sites of
//! provider `postgresql` ([`wait_sites`]). A uprobe is on a file: one attach per binary (by
//! device and inode) covers every backend of every server that runs it.
//!
//! Each uprobe is opened with the site's semaphore as its reference counter, as a USDT
//! tracer's are (bpftrace's `usdt:`, `perf probe sdt_…`): the kernel refuses two uprobes at
//! one place that disagree on it ("ref_ctr_offset mismatch"), so without it the agent and an
//! SRE's `bpftrace -e 'usdt:…postgresql:lock__wait__start'` could not both attach. aya's
//! uprobe has no such setting, so these are opened here (`perf_event_open` on the `uprobe`
//! PMU, the program set on the event). Raising the two semaphores changes nothing at the
//! sites (they do not read them, `objdump -d` of Debian's build); it would switch on code that
//! asks `TRACE_POSTGRESQL_LOCK_WAIT_*_ENABLED()` first, of which the lock-wait path has none.

use std::{
    collections::HashMap,
    ffi::CString,
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    path::Path,
};

use aya::{Ebpf, programs::UProbe};
use stormwatch_common::{PgLockWaits, maps, programs};

use super::{binaries::BinaryFinder, map_io::read_per_cpu_hash};

/// The sites' provider and names.
const PROVIDER: &str = "postgresql";
const START: &str = "lock__wait__start";
const DONE: &str = "lock__wait__done";

/// A PostgreSQL binary the uprobes are attached to: the two uprobes' perf events, whose
/// closing (when no live process runs the binary) detaches the programs.
#[derive(Debug)]
struct PgBinary {
    _events: [OwnedFd; 2],
}

/// The PostgreSQL binaries found and attached to, and the processes and binaries passed over.
#[derive(Debug, Default)]
pub struct PgLockProbes {
    /// Both programs loaded (verified): uprobes can be attached.
    loaded: bool,
    /// Binaries with the sites, attached to (those without, or that could not be attached
    /// to, passed over).
    binaries: BinaryFinder<PgBinary>,
}

/// The PostgreSQL lock waits' part of a snapshot: per cgroup, the waits that ended.
#[derive(Clone, Debug, Default)]
pub struct PgLockPart {
    pub cgroups: HashMap<u64, PgLockWaits>,
}

impl PgLockPart {
    pub fn forget_cgroup(&mut self, id: u64) {
        self.cgroups.remove(&id);
    }
}

impl super::ReadsPart for PgLockProbes {
    type Part = PgLockPart;

    /// Nothing without a binary attached to: no uprobe has counted since the last read.
    fn read(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<PgLockPart> {
        if !self.loaded {
            return Ok(PgLockPart::default());
        }
        let cgroups = read_per_cpu_hash(
            ebpf,
            maps::PG_LOCK_WAITS,
            PgLockWaits::default(),
            |t: &mut PgLockWaits, v: &PgLockWaits| {
                t.waits += v.waits;
                t.wait_ns += v.wait_ns;
            },
        )?;
        Ok(PgLockPart { cgroups })
    }

    fn forget(&mut self, ebpf: &mut Ebpf, gone: &super::Gone, part: &mut PgLockPart) {
        for id in gone.cgroups {
            part.forget_cgroup(*id);
        }
        if !self.loaded || gone.cgroups.is_empty() {
            return;
        }
        let Some(map) = ebpf.map_mut(maps::PG_LOCK_WAITS) else {
            return;
        };
        let Ok(mut map) = aya::maps::PerCpuHashMap::<_, u64, PgLockWaits>::try_from(map) else {
            return;
        };
        for id in gone.cgroups {
            let _ = map.remove(id);
        }
    }
}

/// A site to attach to: its file offset and its semaphore's (0: none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Site {
    pub offset: u64,
    pub semaphore_offset: u64,
}

/// A binary's lock-wait sites (start, done); `None` for any other binary.
///
/// PostgreSQL reaches these two sites without checking their semaphores (the
/// `TRACE_POSTGRESQL_LOCK_WAIT_*` macros are bare `nop`s around `WaitOnLock`; only code that
/// asks `…_ENABLED()` first is guarded, and the lock waits do not), so the uprobes fire on
/// every wait whatever the semaphores say.
pub fn wait_sites(path: &Path) -> Option<(Site, Site)> {
    let probes = super::stapsdt::probes(path).ok()?;
    let site = |name: &str| {
        probes
            .iter()
            .find(|p| p.provider == PROVIDER && p.name == name)
            .map(|p| Site {
                offset: p.offset,
                semaphore_offset: p.semaphore_offset,
            })
    };
    Some((site(START)?, site(DONE)?))
}

impl PgLockProbes {
    /// Loads both programs; not loaded (and a log line) when the kernel refuses them.
    pub fn load(ebpf: &mut Ebpf) -> Self {
        let loaded = match super::attach::load_uprobes(
            ebpf,
            &[programs::PG_LOCK_WAIT_START, programs::PG_LOCK_WAIT_DONE],
        ) {
            Ok(()) => true,
            Err(e) => {
                log::info!("PostgreSQL lock-wait probes not loaded: {e:#}");
                false
            }
        };
        Self {
            loaded,
            ..Self::default()
        }
    }

    pub fn loaded(&self) -> bool {
        self.loaded
    }

    /// Forgets exited processes, and detaches from binaries no live process runs; then looks
    /// at every process on the node not looked at yet (`/proc`), and attaches to the
    /// PostgreSQL binaries among theirs.
    pub fn find(&mut self, ebpf: &mut Ebpf) {
        if !self.loaded {
            return;
        }
        self.binaries.retain_processes(crate::files::process_alive);
        self.binaries
            .look_at(crate::files::process_ids(), |tgid, exe| {
                let (start, done) = wait_sites(Path::new(exe))?;
                match attach(ebpf, exe, start, done) {
                    Ok(events) => {
                        log::info!(
                            "PostgreSQL lock-wait sites found in {} (pid {tgid}): attached",
                            std::fs::read_link(exe)
                                .map(|p| p.display().to_string())
                                .unwrap_or_else(|_| exe.to_owned())
                        );
                        Some(PgBinary { _events: events })
                    }
                    Err(e) => {
                        log::warn!(
                            "cannot attach the PostgreSQL lock-wait probes to pid {tgid}: {e:#}"
                        );
                        None
                    }
                }
            });
    }

    /// The sizes of what it remembers.
    pub fn cache_sizes(&self) -> [crate::memory::CacheSize; 3] {
        self.binaries
            .cache_sizes(["pg_processes_seen", "pg_binaries", "pg_binaries_passed"])
    }
}

/// Opens both uprobes on `exe` with the programs set on them.
fn attach(ebpf: &Ebpf, exe: &str, start: Site, done: Site) -> anyhow::Result<[OwnedFd; 2]> {
    let pmu = uprobe_pmu()?;
    let open = |program: &str, site: Site| -> anyhow::Result<OwnedFd> {
        let p: &UProbe = ebpf
            .program(program)
            .ok_or_else(|| anyhow::anyhow!("program {program} missing"))?
            .try_into()?;
        let fd = p.fd()?;
        open_uprobe(pmu, exe, site, fd.as_fd())
            .map_err(|e| anyhow::anyhow!("{program} at {exe}+{:#x}: {e}", site.offset))
    };
    Ok([
        open(programs::PG_LOCK_WAIT_START, start)?,
        open(programs::PG_LOCK_WAIT_DONE, done)?,
    ])
}

/// The `uprobe` PMU's type, for `perf_event_open`.
fn uprobe_pmu() -> anyhow::Result<u32> {
    const PATH: &str = "/sys/bus/event_source/devices/uprobe/type";
    let text = std::fs::read_to_string(PATH)
        .map_err(|e| anyhow::anyhow!("{PATH}: {e} (a kernel without the uprobe PMU)"))?;
    Ok(text.trim().parse()?)
}

/// `struct perf_event_attr` as far as its first version (`PERF_ATTR_SIZE_VER1`, 72 bytes),
/// all a uprobe needs; the kernel takes the size it is given.
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    /// For the uprobe PMU: bit 0 a return probe, bits 32–63 the reference counter's offset.
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    /// The path (a pointer to a C string).
    config1: u64,
    /// The offset in the file.
    config2: u64,
}

/// `PERF_UPROBE_REF_CTR_OFFSET_SHIFT` (kernel/events/core.c).
const REF_CTR_OFFSET_SHIFT: u32 = 32;
/// `_IO('$', 0)` and `_IOW('$', 8, __u32)`.
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;
/// `PERF_FLAG_FD_CLOEXEC`.
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

/// One uprobe at `site` of `path` for every process (pid -1 on CPU 0: a probe event fires on
/// any CPU), with `program` set on it, enabled.
fn open_uprobe(pmu: u32, path: &str, site: Site, program: BorrowedFd) -> std::io::Result<OwnedFd> {
    let path = CString::new(path).map_err(std::io::Error::other)?;
    let attr = PerfEventAttr {
        type_: pmu,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: site.semaphore_offset << REF_CTR_OFFSET_SHIFT,
        sample_period: 1,
        wakeup_events: 1,
        config1: path.as_ptr() as u64,
        config2: site.offset,
        ..PerfEventAttr::default()
    };
    // SAFETY: `attr` is a valid perf_event_attr of the size it states, and the path it points
    // to lives until the call returns; the other arguments are plain integers.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            -1 as libc::pid_t,
            0 as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor the kernel just returned, owned by nothing else.
    let event = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    for (request, arg) in [
        (PERF_EVENT_IOC_SET_BPF, program.as_raw_fd() as libc::c_ulong),
        (PERF_EVENT_IOC_ENABLE, 0),
    ] {
        // SAFETY: ioctls on our own perf event descriptor, with an integer argument.
        if unsafe { libc::ioctl(event.as_raw_fd(), request, arg) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(event)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binary_without_the_sites_has_none() {
        assert_eq!(wait_sites(Path::new("/proc/self/exe")), None);
        assert_eq!(wait_sites(Path::new("/nonexistent")), None);
    }

    #[test]
    fn the_attribute_is_the_kernels_first_version() {
        // PERF_ATTR_SIZE_VER1: config2 ends at byte 72.
        assert_eq!(std::mem::size_of::<PerfEventAttr>(), 72);
    }
}
