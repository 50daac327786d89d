//! User call sites: a futex call's user stack — the registers it entered the kernel with and the
//! top of its stack, as the futex probes sampled them — unwound with the binaries' own
//! call-frame information (`.eh_frame`, as `perf --call-graph dwarf` does: libc and a JVM keep
//! no frame pointers, so a frame-pointer walk skips the function that called the lock), then
//! named: ELF symbols and, where present, DWARF lines (blazesym), and a JVM's perf map for its
//! compiled Java code. Every file is read through `/proc/<pid>/root`, so a container's own
//! binaries are the ones used.
//!
//! The site of a stack is its first frame outside the lock machinery (libc's locking and futex
//! code, a JVM's parking code and `java.util.concurrent.locks`, a language runtime's own
//! scheduler), with the machinery frame it called (`pthread_mutex_lock`, `ReentrantLock.lock`).
//! A stack that cannot be named says why, and what would make it nameable.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer,
    source::{Elf, Source},
};
use framehop::{
    ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder as _,
    x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64},
};

use crate::memory::CacheSize;

/// Whether this build unwinds the user stacks of the machine it runs on (the kernel programs
/// sample hand-offs only then).
pub const UNWINDS_THIS_ARCH: bool = cfg!(target_arch = "x86_64");

/// Frames unwound per stack at most: the site is near the top.
const MAX_FRAMES: usize = 24;
/// How long a process's view (mappings, modules) is trusted before it is read again.
const VIEW_TTL: Duration = Duration::from_secs(30);

// The bounds of what the symbolizer keeps (issue 45: a node that runs jobs for weeks must not
// grow the agent). A process's view goes when the process exits (at the next collection) or,
// past `MAX_PROCESSES`, when it is the least recently sampled; an ELF file's sections go when
// no view maps the file any more (after `UNUSED_FILE_TTL`, or at once when room is needed);
// a name or a line goes with its file. Measured under churn of JVMs, Go programs and native
// lock storms beside a node's own builds: before, the call-frame sections of every binary
// sampled in the last minute were held at once (43 MiB at the peak; rustc's alone is 7 MiB).

/// The most processes whose view (mappings, unwinding modules, perf map) is kept.
pub const MAX_PROCESSES: usize = 256;
/// The most (file, address) names kept, and likewise `file:line`s (past it, they start over).
pub const MAX_NAMES: usize = 100_000;
/// The most files blazesym is asked about before it is dropped with what it parsed of them.
pub const MAX_SYMBOLIZER_FILES: usize = 64;
/// How long blazesym keeps what it parsed: a file with new addresses to name (a compiler's,
/// say) is parsed at most once in this time, not at every collection; and what it parsed (the
/// symbol tables of every file asked about: 20 MiB and more under churn beside compilers, when
/// it was kept a minute) is not held much longer than the collection that needed it.
const SYMBOLIZER_TTL: Duration = Duration::from_secs(10);

/// One process as the unwinder sees it.
struct ProcessView {
    root: PathBuf,
    mappings: Vec<Mapping>,
    unwinder: UnwinderX86_64<Bytes>,
    cache: CacheX86_64,
    runtime: Runtime,
    /// The pid the process has in its own namespace (its perf map's name).
    ns_pid: u32,
    perf_map: PerfMap,
    read_at: Instant,
    /// When a stack of it was last named.
    used: Instant,
}

/// Unwinds and names user stacks, caching what it read of each process and file, within the
/// bounds above.
#[derive(Default)]
pub struct UserSymbolizer {
    /// Look up each site's `file:line` in its binary's DWARF (the one-off commands; the daemon
    /// names functions only: a binary's DWARF can be far larger than the daemon).
    lines: bool,
    /// Each (file, address)'s `file:line`, as answered once.
    line_cache: HashMap<(FileKey, u64), Option<String>>,
    /// blazesym, and when it was made: it keeps what it parsed of each file, by path, so it is
    /// dropped [`SYMBOLIZER_TTL`] after (or past [`MAX_SYMBOLIZER_FILES`] paths).
    symbolizer: Option<(Symbolizer, Instant)>,
    /// The paths blazesym was asked about since it was made (it keeps each parsed, by path).
    symbolizer_paths: HashSet<PathBuf>,
    processes: HashMap<u32, ProcessView>,
    files: FileCache,
    /// Each (file, address)'s name and `file:line`, as answered once.
    names: HashMap<(FileKey, u64), Option<Named>>,
}

/// A symbol's name and, where DWARF has it, its `file:line`.
type Named = (String, Option<String>);

/// One sampled stack: the registers the futex call entered the kernel with, and the bytes of
/// its stack from `sp` up.
pub struct StackSample<'a> {
    pub tgid: u32,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub stack: &'a [u8],
}

impl UserSymbolizer {
    /// `lines`: also each site's `file:line`, from DWARF.
    pub fn new(lines: bool) -> Self {
        Self {
            lines,
            ..Self::default()
        }
    }

    /// Forgets processes that are gone (not in `live`), and with them what was read for them
    /// alone: files no live process maps (after `UNUSED_FILE_TTL`), their names and lines;
    /// and blazesym with what it parsed, once it is `SYMBOLIZER_TTL` old (it keeps files per
    /// path, and a path is per process: `/proc/<pid>/root/…`; names are kept by file, so a
    /// process that runs a known binary asks it nothing), so that a daemon's memory follows
    /// the processes it names, not every process it ever named. Called at every collection.
    pub fn retain(&mut self, live: impl Fn(u32) -> bool) {
        self.processes.retain(|tgid, _| live(*tgid));
        self.files.evict(0, Instant::now());
        self.forget_unread_files();
        if self
            .symbolizer
            .as_ref()
            .is_some_and(|(_, made)| made.elapsed() >= SYMBOLIZER_TTL)
        {
            self.symbolizer = None;
            self.symbolizer_paths.clear();
        }
    }

    /// Drops the names and lines of files no longer kept, and all of them past [`MAX_NAMES`].
    fn forget_unread_files(&mut self) {
        let files = &self.files.files;
        self.names.retain(|(f, _), _| files.contains_key(f));
        self.line_cache.retain(|(f, _), _| files.contains_key(f));
        if self.names.len() > MAX_NAMES {
            self.names.clear();
        }
        if self.line_cache.len() > MAX_NAMES {
            self.line_cache.clear();
        }
    }

    /// The sizes of its caches, for the agent's own metrics.
    pub fn cache_sizes(&self) -> [CacheSize; 5] {
        let perf_maps: u64 = self.processes.values().map(|p| p.perf_map.bytes()).sum();
        [
            CacheSize {
                name: "user_processes",
                entries: self.processes.len() as u64,
                max_entries: Some(MAX_PROCESSES as u64),
                bytes: Some(perf_maps),
                max_bytes: None,
            },
            CacheSize {
                name: "elf_files",
                entries: self.files.files.len() as u64,
                max_entries: Some(MAX_FILES as u64),
                bytes: Some(self.files.bytes),
                max_bytes: Some(MAX_ELF_BYTES),
            },
            CacheSize {
                name: "symbol_names",
                entries: self.names.len() as u64,
                max_entries: Some(MAX_NAMES as u64),
                bytes: None,
                max_bytes: None,
            },
            CacheSize {
                name: "source_lines",
                entries: self.line_cache.len() as u64,
                max_entries: Some(MAX_NAMES as u64),
                bytes: None,
                max_bytes: None,
            },
            CacheSize {
                name: "symbolizer_files",
                entries: self.symbolizer_paths.len() as u64,
                max_entries: Some(MAX_SYMBOLIZER_FILES as u64),
                bytes: None,
                max_bytes: None,
            },
        ]
    }

    /// The call site of a sampled stack, and a hint for what would name more of it.
    pub fn site(&mut self, sample: &StackSample<'_>) -> (UserSite, Option<String>) {
        let (site, hint, _) = self.site_and_stack(sample);
        (site, hint)
    }

    /// [`Self::site`], with the stack from the site's frame out (its callers, outermost
    /// last), or every frame unwound where no frame is the site; empty where nothing was
    /// unwound. The machinery inside the site is the site's `lock_function`.
    pub fn site_and_stack(
        &mut self,
        sample: &StackSample<'_>,
    ) -> (UserSite, Option<String>, Vec<Frame>) {
        let Some(mut frames) = self.frames(sample) else {
            let why = if Path::new(&format!("/proc/{}", sample.tgid)).exists() {
                "its /proc/<pid>/maps cannot be read here (naming needs CAP_SYS_PTRACE)"
            } else {
                "the process is not visible here: it exited, or it is in another pid namespace \
                 (naming needs the host's pids: hostPID)"
            };
            return (UserSite::unnamed(why), None, Vec::new());
        };
        let runtime = self
            .processes
            .get(&sample.tgid)
            .map_or(Runtime::Native, |p| p.runtime);
        let (mut site, hint, at) = pick_site_at(&frames, runtime);
        if self.lines
            && let Some(i) = at
        {
            site.location = self.line_of(&frames[i]);
            frames[i].location = site.location.clone();
        }
        if site.function.is_none() {
            log::debug!("tgid {}: unnamed site, frames {frames:?}", sample.tgid);
        }
        // Hints name the process, by its pid here and in its own namespace.
        let hint = hint.map(|h| {
            let ns_pid = self
                .processes
                .get(&sample.tgid)
                .map_or(sample.tgid, |p| p.ns_pid);
            let comm = crate::files::kernel_text(format!("/proc/{}/comm", sample.tgid))
                .map(|c| c.trim_end().to_owned())
                .unwrap_or_default();
            format!(
                "pid {} ({comm}, pid {ns_pid} in its namespace): {}",
                sample.tgid,
                h.replace("<pid>", &ns_pid.to_string())
            )
        });
        if let Some(i) = at {
            frames.drain(..i);
        }
        (site, hint, frames)
    }

    /// The named frames of a sampled stack, innermost first.
    pub fn frames(&mut self, sample: &StackSample<'_>) -> Option<Vec<Frame>> {
        self.refresh(sample.tgid, sample.ip)?;
        let view = self.processes.get_mut(&sample.tgid)?;
        let stack = sample.stack;
        let sp = sample.sp;
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            let off = addr.checked_sub(sp).ok_or(())? as usize;
            let bytes = stack.get(off..off + 8).ok_or(())?;
            Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| ())?))
        };
        let regs = UnwindRegsX86_64::new(sample.ip, sample.sp, sample.bp);
        let mut addrs: Vec<FrameAddress> = Vec::new();
        let mut iter = view
            .unwinder
            .iter_frames(sample.ip, regs, &mut view.cache, &mut read_stack);
        while addrs.len() < MAX_FRAMES {
            match iter.next() {
                Ok(Some(a)) => addrs.push(a),
                _ => break,
            }
        }
        let runtime = view.runtime;
        let mut frames = Vec::with_capacity(addrs.len());
        for a in addrs {
            let lookup = a.address_for_lookup();
            let mapping = self.processes.get(&sample.tgid)?.mapping(lookup).cloned();
            let frame = match mapping {
                Some(m) if m.path.is_some() => self.name_in_file(sample.tgid, &m, lookup),
                Some(_) | None => {
                    let view = self.processes.get_mut(&sample.tgid)?;
                    view.reload_perf_map();
                    let name = view.perf_map.lookup(lookup).map(java_name);
                    Frame {
                        name,
                        location: None,
                        module: Some("JIT".to_owned()),
                        lookup: None,
                    }
                }
            };
            let jit = frame.module.as_deref() == Some("JIT");
            frames.push(frame);
            // A JVM's compiled frames keep no frame pointer unless it is told to: past the first
            // of them, a walk would read a register as a frame pointer.
            if jit
                && matches!(
                    runtime,
                    Runtime::Jvm {
                        frame_pointers: false
                    }
                )
            {
                break;
            }
        }
        Some(frames)
    }

    fn name_in_file(&mut self, tgid: u32, m: &Mapping, addr: u64) -> Frame {
        let view = &self.processes[&tgid];
        let rel = m.path.as_deref().unwrap_or("").trim_start_matches('/');
        let path = view.root.join(rel);
        let module = m
            .path
            .as_deref()
            .and_then(|p| p.rsplit('/').next())
            .map(str::to_owned);
        let svma = addr.wrapping_sub(m.bias);
        let Some(file) = m.file else {
            return Frame {
                name: None,
                location: None,
                module,
                lookup: None,
            };
        };
        let key = (file, svma);
        if !self.names.contains_key(&key) {
            let symbolizer = self.symbolizer_for(&path);
            // ELF symbols only: DWARF (a debug link can lead to a file of hundreds of MB) is
            // read for the site's frame alone, and only where lines are wanted (`line_of`).
            let mut elf = Elf::new(&path);
            elf.debug_syms = false;
            let named =
                match symbolizer.symbolize_single(&Source::Elf(elf), Input::VirtOffset(svma)) {
                    Ok(Symbolized::Sym(sym)) => Some((sym.name.to_string(), None)),
                    _ => None,
                };
            self.names.insert(key, named);
        }
        let named = self.names[&key].clone();
        Frame {
            name: named.as_ref().map(|(n, _)| n.clone()),
            location: named.and_then(|(_, l)| l),
            module,
            lookup: Some(Lookup {
                path,
                file,
                addr: svma,
            }),
        }
    }

    /// A frame's `file:line` from its binary's DWARF (or the debug file it links to).
    fn line_of(&mut self, frame: &Frame) -> Option<String> {
        let lookup = frame.lookup.as_ref()?;
        let key = (lookup.file, lookup.addr);
        if let Some(line) = self.line_cache.get(&key) {
            return line.clone();
        }
        let (path, addr) = (lookup.path.clone(), lookup.addr);
        let symbolizer = self.symbolizer_for(&path);
        let line = match symbolizer
            .symbolize_single(&Source::Elf(Elf::new(&path)), Input::VirtOffset(addr))
        {
            Ok(Symbolized::Sym(sym)) => sym.code_info.as_ref().and_then(|ci| {
                let file = Path::new(&ci.file).file_name()?.to_string_lossy();
                Some(format!("{file}:{}", ci.line?))
            }),
            _ => None,
        };
        self.line_cache.insert(key, line.clone());
        line
    }

    /// blazesym, to be asked about `path`: made anew when it was asked about
    /// [`MAX_SYMBOLIZER_FILES`] others since it was made (it keeps each file it parsed, by
    /// path).
    fn symbolizer_for(&mut self, path: &Path) -> &mut Symbolizer {
        if !self.symbolizer_paths.contains(path) {
            if self.symbolizer_paths.len() >= MAX_SYMBOLIZER_FILES {
                self.symbolizer = None;
                self.symbolizer_paths.clear();
            }
            self.symbolizer_paths.insert(path.to_owned());
        }
        &mut self
            .symbolizer
            .get_or_insert_with(|| (Symbolizer::new(), Instant::now()))
            .0
    }

    /// Reads the process's view again when it is new, old, or does not map `ip`; marks it
    /// used. Past [`MAX_PROCESSES`], the least recently used view is dropped first.
    fn refresh(&mut self, tgid: u32, ip: u64) -> Option<()> {
        let now = Instant::now();
        if let Some(p) = self.processes.get_mut(&tgid) {
            p.used = now;
            if p.read_at.elapsed() < VIEW_TTL && p.mapping(ip).is_some() {
                return Some(());
            }
        }
        // The old view's files stay mapped while the new one is read (most are the same).
        let old = self.processes.remove(&tgid);
        while self.processes.len() >= MAX_PROCESSES {
            let Some(lru) = self
                .processes
                .iter()
                .min_by_key(|(_, p)| p.used)
                .map(|(t, _)| *t)
            else {
                break;
            };
            self.processes.remove(&lru);
        }
        let processes = &mut self.processes;
        let view = ProcessView::read(tgid, &mut self.files, |files, bytes| {
            make_room(processes, files, bytes, now)
        });
        drop(old);
        let mut view = view?;
        view.used = now;
        self.processes.insert(tgid, view);
        Some(())
    }
}

impl ProcessView {
    /// Reads a process's view, its files through `files` (`make_room` frees room for one).
    fn read(
        tgid: u32,
        files: &mut FileCache,
        mut make_room: impl FnMut(&mut FileCache, u64) -> bool,
    ) -> Option<Self> {
        use std::os::unix::fs::MetadataExt as _;
        let now = Instant::now();
        let proc = PathBuf::from(format!("/proc/{tgid}"));
        let maps = crate::files::kernel_text(proc.join("maps"))?;
        let root = proc.join("root");
        let cmdline = crate::files::kernel_bytes(proc.join("cmdline")).unwrap_or_default();
        let status = crate::files::kernel_text(proc.join("status")).unwrap_or_default();
        let ns_pid = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|v| v.split_whitespace().last()?.parse().ok())
            .unwrap_or(tgid);
        let mut mappings = Vec::new();
        let mut unwinder = UnwinderX86_64::new();
        let mut jvm = false;
        let mut go = false;
        for line in maps.lines() {
            let Some(m) = parse_maps_line(line) else {
                continue;
            };
            if !m.exec {
                continue;
            }
            let Some(path) = m.path.filter(|p| p.starts_with('/')) else {
                mappings.push(Mapping {
                    range: m.range,
                    path: None,
                    file: None,
                    bias: 0,
                });
                continue;
            };
            jvm |= path.ends_with("/libjvm.so");
            let in_root = root.join(path.trim_start_matches('/'));
            let file = std::fs::metadata(&in_root).ok().and_then(|md| {
                let key = (md.dev(), md.ino(), md.mtime());
                Some((key, files.get(key, &in_root, now, &mut make_room)?))
            });
            let Some((key, file)) = file else {
                mappings.push(Mapping {
                    range: m.range,
                    path: Some(path.to_owned()),
                    file: None,
                    bias: 0,
                });
                continue;
            };
            go |= file.is_go;
            let Some(bias) = bias_of(&file.segments, m.offset, m.range.start) else {
                continue;
            };
            unwinder.add_module(Module::new(
                path.to_owned(),
                m.range.clone(),
                bias,
                ExplicitModuleSectionInfo {
                    base_svma: 0,
                    text_svma: file.text.clone(),
                    got_svma: file.got.clone(),
                    eh_frame_svma: file.eh_frame.as_ref().map(|(r, _)| r.clone()),
                    eh_frame: file.eh_frame.as_ref().map(|(_, d)| d.clone()),
                    eh_frame_hdr_svma: file.eh_frame_hdr.as_ref().map(|(r, _)| r.clone()),
                    eh_frame_hdr: file.eh_frame_hdr.as_ref().map(|(_, d)| d.clone()),
                    ..Default::default()
                },
            ));
            mappings.push(Mapping {
                range: m.range,
                path: Some(path.to_owned()),
                file: Some(key),
                bias,
            });
        }
        let runtime = if jvm {
            Runtime::Jvm {
                frame_pointers: cmdline
                    .split(|b| *b == 0)
                    .any(|a| a == b"-XX:+PreserveFramePointer"),
            }
        } else if go {
            Runtime::Go
        } else {
            Runtime::Native
        };
        Some(Self {
            root,
            mappings,
            unwinder,
            cache: CacheX86_64::new(),
            runtime,
            ns_pid,
            perf_map: PerfMap::default(),
            read_at: now,
            used: now,
        })
    }

    fn mapping(&self, addr: u64) -> Option<&Mapping> {
        self.mappings.iter().find(|m| m.range.contains(&addr))
    }

    /// Reads the perf map again if it changed (a JVM rewrites it at `jcmd Compiler.perfmap`).
    fn reload_perf_map(&mut self) {
        let path = self.root.join(format!("tmp/perf-{}.map", self.ns_pid));
        let stamp = std::fs::metadata(&path)
            .ok()
            .and_then(|md| Some((md.len(), md.modified().ok()?)));
        if stamp == self.perf_map.stamp {
            return;
        }
        let entries = crate::files::read_text(&path, crate::files::Kind::PerfMap)
            .map(|t| parse_perf_map(&t))
            .unwrap_or_default();
        self.perf_map = PerfMap { entries, stamp };
    }
}

/// Makes room for `bytes` of sections in `files`: drops the files no view maps, then the least
/// recently used views (and the files only they mapped) until it fits. Whether it fits.
fn make_room(
    processes: &mut HashMap<u32, ProcessView>,
    files: &mut FileCache,
    bytes: u64,
    now: Instant,
) -> bool {
    files.evict(bytes, now);
    if files.fits(bytes) {
        return true;
    }
    let mut views: Vec<(Instant, u32)> = processes.iter().map(|(t, p)| (p.used, *t)).collect();
    views.sort_unstable();
    for (_, tgid) in views {
        processes.remove(&tgid);
        files.evict(bytes, now);
        if files.fits(bytes) {
            return true;
        }
    }
    false
}

mod files;
mod maps;
mod site;

pub use self::files::{MAX_ELF_BYTES, MAX_FILES};
pub use self::site::{Frame, Lookup, UserSite, WaitKind, wait_kind};
use self::{
    files::{Bytes, FileCache, FileKey},
    maps::{Mapping, PerfMap, bias_of, parse_maps_line, parse_perf_map},
    site::{Runtime, java_name, pick_site_at},
};

#[cfg(test)]
mod tests;
