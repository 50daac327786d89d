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
    ops::{Deref, Range},
    path::{Path, PathBuf},
    sync::Arc,
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
use object::{Object as _, ObjectSection as _, ObjectSegment as _};
use serde::Serialize;

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
/// The most ELF files whose sections are kept, mapped by a view or not.
pub const MAX_FILES: usize = 1024;
/// The most bytes of ELF sections (call-frame information) kept over every file: a file that
/// does not fit with the views that use it is not read (its frames are not unwound past).
pub const MAX_ELF_BYTES: u64 = 16 << 20;
/// An ELF file no view maps is kept this long after its last use: a job that runs the same
/// binary again soon after reads it once.
const UNUSED_FILE_TTL: Duration = Duration::from_secs(60);
/// The most (file, address) names kept, and likewise `file:line`s (past it, they start over).
pub const MAX_NAMES: usize = 100_000;
/// The most files blazesym is asked about before it is dropped with what it parsed of them.
pub const MAX_SYMBOLIZER_FILES: usize = 64;
/// How long blazesym keeps what it parsed: a file with new addresses to name (a compiler's,
/// say) is parsed at most once in this time, not at every collection; and what it parsed (the
/// symbol tables of every file asked about: 20 MiB and more under churn beside compilers, when
/// it was kept a minute) is not held much longer than the collection that needed it.
const SYMBOLIZER_TTL: Duration = Duration::from_secs(10);

/// A file by device, inode and modification time: one key for every process and container that
/// maps the same file, whatever the path it has there.
type FileKey = (u64, u64, i64);

/// Where a contended user-space lock is taken or handed on.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct UserSite {
    /// The first function outside the lock machinery (a Java method as `Class.method`), or
    /// `None` when it could not be named (`unnamed` says why).
    pub function: Option<String>,
    /// The machinery frame it called: `pthread_mutex_lock`, `ReentrantLock.lock`, …
    pub lock_function: Option<String>,
    /// `file:line`, where the binary has DWARF lines.
    pub location: Option<String>,
    /// The binary (file name) the function is in, or `JIT` for a JVM's compiled code.
    pub module: Option<String>,
    /// Why the site has no name, and what would give it one.
    pub unnamed: Option<String>,
}

impl UserSite {
    pub(crate) fn unnamed(why: impl Into<String>) -> Self {
        Self {
            function: None,
            lock_function: None,
            location: None,
            module: None,
            unnamed: Some(why.into()),
        }
    }

    /// `function (file:line)` via `lock_function`, or `unnamed: why`, for a line of text. A
    /// JIT-compiled function says that the code may be a method inlined into it: a frame walk
    /// sees one frame where the JIT may have folded several methods (a perf map names the
    /// outermost).
    pub fn describe(&self) -> String {
        match &self.function {
            Some(f) => {
                let mut s = format!("`{f}`");
                if let Some(loc) = &self.location {
                    s.push_str(&format!(" ({loc})"));
                }
                if self.module.as_deref() == Some("JIT") {
                    s.push_str(" (JIT-compiled: methods may be inlined into it)");
                }
                if let Some(l) = &self.lock_function {
                    s.push_str(&format!(" via `{l}`"));
                }
                s
            }
            None => format!(
                "an unnamed site ({})",
                self.unnamed.as_deref().unwrap_or("unknown")
            ),
        }
    }
}

/// One frame, named as far as it can be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub name: Option<String>,
    pub location: Option<String>,
    /// The file name of the binary, or `JIT` (an anonymous executable mapping).
    pub module: Option<String>,
    /// Where its line can be looked up.
    pub lookup: Option<Lookup>,
}

/// Where a frame's name and line are looked up: the file (by its key, and by a path through
/// `/proc/<pid>/root`) and the address in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lookup {
    pub path: PathBuf,
    file: FileKey,
    pub addr: u64,
}

/// A process's runtime, as far as naming its stacks goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Runtime {
    Native,
    /// A HotSpot JVM, and whether it keeps frame pointers in compiled code
    /// (`-XX:+PreserveFramePointer`), without which its compiled frames cannot be walked.
    Jvm {
        frame_pointers: bool,
    },
    Go,
}

/// A byte buffer shared between processes that map the same file (a `Vec`, read into once:
/// `Arc<[u8]>` would copy it).
#[derive(Clone, Debug, Default)]
struct Bytes(Arc<Vec<u8>>);

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

/// What unwinding and naming need of one ELF file, read once per file (by device, inode and
/// modification time).
#[derive(Debug)]
struct ElfFile {
    /// The loadable segments: (file offset, virtual address, file size).
    segments: Vec<(u64, u64, u64)>,
    text: Option<Range<u64>>,
    eh_frame: Option<(Range<u64>, Bytes)>,
    eh_frame_hdr: Option<(Range<u64>, Bytes)>,
    got: Option<Range<u64>>,
    is_go: bool,
}

impl ElfFile {
    /// The bytes of the sections it holds.
    fn bytes(&self) -> u64 {
        [&self.eh_frame, &self.eh_frame_hdr]
            .into_iter()
            .flatten()
            .map(|(_, b)| b.len() as u64)
            .sum()
    }
}

/// An ELF file read, with when it was last mapped by a view being read.
struct CachedFile {
    file: Arc<ElfFile>,
    bytes: u64,
    used: Instant,
}

/// The ELF files read, by key, within [`MAX_FILES`] and [`MAX_ELF_BYTES`].
#[derive(Default)]
struct FileCache {
    files: HashMap<FileKey, CachedFile>,
    bytes: u64,
}

impl FileCache {
    /// Whether a file is mapped by a view (its sections are shared with the view's modules).
    fn mapped(f: &CachedFile) -> bool {
        Arc::strong_count(&f.file) > 1
    }

    /// Drops files no view maps: those unused for [`UNUSED_FILE_TTL`], and the least recently
    /// used others until `need` more bytes and one more file fit.
    fn evict(&mut self, need: u64, now: Instant) {
        let mut unmapped: Vec<(Instant, FileKey)> = self
            .files
            .iter()
            .filter(|(_, f)| !Self::mapped(f))
            .map(|(k, f)| (f.used, *k))
            .collect();
        unmapped.sort_unstable();
        for (used, key) in unmapped {
            let stale = now.saturating_duration_since(used) >= UNUSED_FILE_TTL;
            let full = self.bytes + need > MAX_ELF_BYTES || self.files.len() >= MAX_FILES;
            if !(stale || full) {
                continue;
            }
            if let Some(f) = self.files.remove(&key) {
                self.bytes -= f.bytes;
            }
        }
    }

    fn fits(&self, bytes: u64) -> bool {
        self.bytes + bytes <= MAX_ELF_BYTES && self.files.len() < MAX_FILES
    }

    /// The file at `path` (in a process's root) with this key: from the cache (marked used), or
    /// read and kept when room can be made for its sections (`make_room`), or read without
    /// them and not kept.
    fn get(
        &mut self,
        key: FileKey,
        path: &Path,
        now: Instant,
        make_room: impl FnOnce(&mut Self, u64) -> bool,
    ) -> Option<Arc<ElfFile>> {
        if let Some(f) = self.files.get_mut(&key) {
            f.used = now;
            return Some(f.file.clone());
        }
        let mut kept = false;
        let file = Arc::new(read_elf(path, |size| {
            kept = size <= MAX_ELF_BYTES && make_room(self, size);
            kept
        })?);
        if kept {
            let bytes = file.bytes();
            self.bytes += bytes;
            self.files.insert(
                key,
                CachedFile {
                    file: file.clone(),
                    bytes,
                    used: now,
                },
            );
        } else {
            log::debug!(
                "{}: its call-frame information is not kept (the symbolizer's {} MiB are \
                 taken); unwound by frame pointers",
                path.display(),
                MAX_ELF_BYTES >> 20
            );
        }
        Some(file)
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

/// Reads what unwinding and naming need of an ELF file; its call-frame sections only when
/// `room` says their size fits (else it is unwound through by frame pointers alone).
fn read_elf(path: &Path, room: impl FnOnce(u64) -> bool) -> Option<ElfFile> {
    use std::os::unix::fs::FileExt as _;
    // Only the headers and the sections asked for are read, not the whole file (a JVM's
    // libjvm is 20 MB, a static binary with debug information can be a gigabyte); the
    // sections straight into their buffers (the reader's cache would hold a second copy).
    let file = std::fs::File::open(path).ok()?;
    let cache = object::ReadCache::new(&file);
    let obj = object::File::parse(&cache).ok()?;
    let size: u64 = [".eh_frame", ".eh_frame_hdr"]
        .into_iter()
        .filter_map(|n| obj.section_by_name(n))
        .map(|s| s.size())
        .sum();
    let fits = room(size);
    let section = |name: &str| -> Option<(Range<u64>, Bytes)> {
        let s = obj.section_by_name(name).filter(|_| fits)?;
        let (offset, size) = s.file_range()?;
        let mut bytes = vec![0; usize::try_from(size).ok()?];
        file.read_exact_at(&mut bytes, offset).ok()?;
        Some((s.address()..s.address() + s.size(), Bytes(Arc::new(bytes))))
    };
    let range = |name: &str| {
        obj.section_by_name(name)
            .map(|s| s.address()..s.address() + s.size())
    };
    Some(ElfFile {
        segments: obj
            .segments()
            .map(|s| {
                let (off, size) = s.file_range();
                (off, s.address(), size)
            })
            .collect(),
        text: range(".text"),
        eh_frame: section(".eh_frame"),
        eh_frame_hdr: section(".eh_frame_hdr"),
        got: range(".got"),
        is_go: obj.section_by_name(".go.buildinfo").is_some(),
    })
}

/// An executable mapping of a process.
#[derive(Clone, Debug)]
struct Mapping {
    range: Range<u64>,
    /// The file, as the process names it (`None`: anonymous, e.g. JIT code).
    path: Option<String>,
    /// The file's key, when it could be read.
    file: Option<FileKey>,
    /// Where the file's virtual addresses are in the process: avma = svma + bias.
    bias: u64,
}

/// A JVM's perf map: compiled code's ranges and names.
#[derive(Default)]
struct PerfMap {
    entries: Vec<(u64, u64, String)>,
    /// The file's size and modification time when read.
    stamp: Option<(u64, std::time::SystemTime)>,
}

impl PerfMap {
    /// The bytes its entries hold (about).
    fn bytes(&self) -> u64 {
        self.entries
            .iter()
            .map(|(_, _, n)| (std::mem::size_of::<(u64, u64, String)>() + n.len()) as u64)
            .sum()
    }

    fn lookup(&self, addr: u64) -> Option<&str> {
        let i = self.entries.partition_point(|(start, _, _)| *start <= addr);
        let (start, size, name) = self.entries.get(i.checked_sub(1)?)?;
        (addr < start + size).then_some(name.as_str())
    }
}

/// Parses a perf map (`START SIZE NAME` per line, hexadecimal, with or without `0x`).
fn parse_perf_map(text: &str) -> Vec<(u64, u64, String)> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let mut entries: Vec<(u64, u64, String)> = text
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ' ');
            let start = hex(parts.next()?)?;
            let size = hex(parts.next()?)?;
            Some((start, size, parts.next()?.trim().to_owned()))
        })
        .collect();
    entries.sort_by_key(|e| e.0);
    entries
}

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

/// A line of `/proc/<pid>/maps`.
struct MapsLine<'a> {
    range: Range<u64>,
    exec: bool,
    offset: u64,
    path: Option<&'a str>,
}

fn parse_maps_line(line: &str) -> Option<MapsLine<'_>> {
    let mut parts = line.split_whitespace();
    let (start, end) = parts.next()?.split_once('-')?;
    let perms = parts.next()?;
    let offset = u64::from_str_radix(parts.next()?, 16).ok()?;
    let _dev = parts.next()?;
    let _inode = parts.next()?;
    let path = parts.next();
    Some(MapsLine {
        range: u64::from_str_radix(start, 16).ok()?..u64::from_str_radix(end, 16).ok()?,
        exec: perms.as_bytes().get(2) == Some(&b'x'),
        offset,
        path,
    })
}

/// The load bias of a file mapped at `start` from file offset `offset` (page-aligned): where its
/// virtual addresses are in the process (avma = svma + bias). The mapping holds the segment
/// whose page-aligned file offset is the latest at or before `offset` (an executable segment
/// usually starts inside the page where the read-only one ends, so both "contain" the offset).
fn bias_of(segments: &[(u64, u64, u64)], offset: u64, start: u64) -> Option<u64> {
    const PAGE: u64 = 0xfff;
    let (seg_off, seg_addr, _) = segments
        .iter()
        .filter(|(off, _, size)| off & !PAGE <= offset && offset < off + size.max(&1))
        .max_by_key(|(off, _, _)| *off)?;
    // The mapping starts `seg_off - offset` bytes before the segment.
    let svma = seg_addr.checked_sub(seg_off.checked_sub(offset)?)?;
    Some(start.wrapping_sub(svma))
}

/// A perf-map name as a person reads it: HotSpot's `void pkg.Class.method(args)` → `pkg.Class.method`.
fn java_name(name: &str) -> String {
    let name = name.split_once('(').map_or(name, |(n, _)| n);
    name.rsplit(' ').next().unwrap_or(name).to_owned()
}

/// Symbol fragments of locking and parking code: frames looked through to reach the caller.
fn is_machinery(frame: &Frame, runtime: Runtime) -> bool {
    let module = frame.module.as_deref().unwrap_or("");
    // Named or not (libc's internal functions are in no symbol table a node keeps).
    if module.starts_with("libc.so")
        || module.starts_with("libpthread")
        || module.starts_with("ld-linux")
        || module == "libjvm.so"
    {
        return true;
    }
    let Some(name) = &frame.name else {
        return false;
    };
    // Go: the runtime, and the sync package's slow paths into it (a sync.Mutex's unlocker
    // that finds the runtime's own semaphore lock contended waits on a futex there).
    if runtime == Runtime::Go
        && ["runtime.", "runtime/", "sync.", "internal/sync."]
            .iter()
            .any(|p| name.starts_with(p))
    {
        return true;
    }
    const NATIVE: &[&str] = &[
        "__lll_",
        "pthread_mutex",
        "pthread_rwlock",
        "pthread_cond",
        "___pthread",
        "__pthread",
        "futex",
        "std::sys::sync",
        "std::sync::",
        "parking_lot",
        "lock_api::",
    ];
    // java.util.concurrent whole: its queues, pools and locks all park through LockSupport; the
    // code that called them is the site.
    const JAVA: &[&str] = &[
        "java.util.concurrent.",
        "jdk.internal.misc.Unsafe.",
        "java.lang.Object.wait",
        "java.lang.Thread.sleep",
        "java.lang.invoke.",
    ];
    if module == "JIT" {
        // Stubs and adapters (no `Class.method` shape) are the JVM's own.
        return JAVA.iter().any(|p| name.starts_with(p)) || !name.contains('.');
    }
    NATIVE.iter().any(|p| name.contains(p))
}

/// The site of an unwound stack (innermost frame first): the first frame outside the
/// machinery, with the machinery frame just inside it.
#[cfg(test)]
fn pick_site(frames: &[Frame], runtime: Runtime) -> (UserSite, Option<String>) {
    let (site, hint, _) = pick_site_at(frames, runtime);
    (site, hint)
}

/// [`pick_site`], with the index of the site's frame when it has one.
fn pick_site_at(frames: &[Frame], runtime: Runtime) -> (UserSite, Option<String>, Option<usize>) {
    let mut machinery = Vec::new();
    for (i, frame) in frames.iter().enumerate() {
        if is_machinery(frame, runtime) {
            if let Some(name) = frame.name.as_deref() {
                machinery.push((
                    short_lock_name(name),
                    frame.module.as_deref() == Some("JIT"),
                ));
            }
            continue;
        }
        let inner = deciding_lock_function(&machinery);
        let Some(name) = &frame.name else {
            let why = match (frame.module.as_deref(), runtime) {
                (Some("JIT"), Runtime::Jvm { .. }) => {
                    "JIT-compiled Java code without a perf map entry"
                }
                (Some("JIT"), _) => "code in an anonymous mapping (JIT) without a perf map",
                _ => "a stripped binary without symbols",
            };
            // The machinery it waited in still says what it waited for (`wait_kind`).
            let site = UserSite {
                lock_function: inner,
                ..UserSite::unnamed(why)
            };
            return (site, hint_for(frame, runtime), None);
        };
        return (
            UserSite {
                function: Some(name.clone()),
                lock_function: inner,
                location: frame.location.clone(),
                module: frame.module.clone(),
                unnamed: None,
            },
            None,
            Some(i),
        );
    }
    let why = match runtime {
        Runtime::Go => {
            "Go's runtime parking its own threads (a sync.Mutex wait is not a futex wait)"
        }
        Runtime::Jvm {
            frame_pointers: false,
        } => "the JVM's compiled frames keep no frame pointer",
        _ if frames.last().is_some_and(is_thread_start) => {
            "every frame is lock, runtime or library code, down to the thread's start (a pool's \
             worker waiting in its library's own code)"
        }
        _ => "the stack ended inside the lock code (no call-frame information past it)",
    };
    let hint = match runtime {
        Runtime::Jvm {
            frame_pointers: false,
        } => Some(
            "start the JVM with -XX:+PreserveFramePointer to name the Java code above its locks"
                .to_owned(),
        ),
        _ => None,
    };
    // What it waited in still says what it waited for (`wait_kind`).
    let site = UserSite {
        lock_function: deciding_lock_function(&machinery),
        ..UserSite::unnamed(why)
    };
    (site, hint, None)
}

/// The lock function of a site, from the named machinery frames inside it (innermost first,
/// each with whether it is JIT-compiled code): the outermost, the API the application called
/// (a glibc condition wait that re-takes its mutex is `pthread_cond_wait`), when [`wait_kind`]
/// reads it. Where it does not — a pool's worker whose outermost machinery frames are its
/// thread's start (a JVM's `ThreadPoolExecutor` worker: every frame down to `start_thread` is
/// the JDK's or the JVM's) — the innermost managed (JIT or interpreted) frame it reads:
/// `ConditionObject.await` under a queue's `take` (waiting for work),
/// `AbstractQueuedSynchronizer.acquire` under `ReentrantLock.lock` (waiting for a lock); a
/// queue's `take` with nothing named inside it (compiled, inlined) is either, so neither. Never
/// the native frames under them: HotSpot parks every wait on the thread's own condition
/// variable, so the `pthread_cond_wait` under `Parker::park` says nothing. The lock a JVM
/// condition wait re-takes when signalled (`acquire` called by `await`) is the condition
/// wait's, as glibc's is.
fn deciding_lock_function(machinery: &[(String, bool)]) -> Option<String> {
    let (outermost, _) = machinery.last()?;
    if wait_kind(outermost).is_some() {
        return Some(outermost.clone());
    }
    let mut read = machinery
        .iter()
        .filter(|(n, jit)| *jit && wait_kind(n).is_some())
        .map(|(n, _)| n);
    // A queue's or pool's method with nothing named inside it holds both a lock and a
    // condition wait (C2 inlines `take`'s `lockInterruptibly` and `await` into it, so one name
    // covers both): it says neither.
    let Some(first) = read
        .next()
        .filter(|n| !AMBIGUOUS.iter().any(|a| n.contains(a)))
    else {
        return Some(outermost.clone());
    };
    if first.starts_with("AbstractQueuedSynchronizer.acquire")
        && let Some(wait) = read.next().filter(|n| n.contains(".await"))
    {
        return Some(wait.clone());
    }
    Some(first.clone())
}

/// Managed methods that wait for a lock and for a condition both (a blocking queue's `take`
/// takes its lock, then waits on its condition).
const AMBIGUOUS: &[&str] = &["Queue.take", "Queue.poll", "ThreadPoolExecutor.getTask"];

/// A thread's first frame: where the stack rightly ends.
fn is_thread_start(frame: &Frame) -> bool {
    frame.name.as_deref().is_some_and(|n| {
        ["start_thread", "clone", "clone3", "__clone", "__clone3"].contains(&n)
            || n.starts_with("thread_native_entry")
    })
}

/// What would name a frame that has none.
fn hint_for(frame: &Frame, runtime: Runtime) -> Option<String> {
    match (frame.module.as_deref(), runtime) {
        (Some("JIT"), Runtime::Jvm { .. }) => Some(
            "run `jcmd <pid> Compiler.perfmap` in the container (JDK 17+) to write the JVM's perf \
             map; names then follow within a collection"
                .to_owned(),
        ),
        (Some("JIT"), _) => {
            Some("have the runtime write a perf map (/tmp/perf-<pid>.map)".to_owned())
        }
        _ => Some(
            "keep the binary's symbols (no `strip`), or build it with frame pointers and symbols"
                .to_owned(),
        ),
    }
}

/// What a waiter waited for, from the lock machinery it waited in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitKind {
    /// A lock: a mutex, an rwlock, a JVM monitor's entry, a `java.util.concurrent` lock.
    Lock,
    /// A condition — work to arrive, a signal: a condition variable (its mutex's reacquire
    /// included, which happens inside the wait), `Object.wait`, a blocking queue's `take`.
    Condition,
}

/// What the waiter of a site waited for, from its `lock_function` (the outermost machinery
/// frame that has a name, so the API the application called: a glibc condition wait that
/// reacquires its mutex is `pthread_cond_wait`, a JVM monitor's entry parks through
/// `pthread_cond_wait` inside `ObjectMonitor::enter`, whose callers name it). `None` when the
/// name says neither (a bare `Parker::park`, a raw futex call).
pub fn wait_kind(lock_function: &str) -> Option<WaitKind> {
    const CONDITION: &[&str] = &[
        "cond_wait",
        "cond_timedwait",
        "cond_clockwait",
        "cnd_wait",
        "cnd_timedwait",
        "condition_variable",
        "Condvar::wait",
        "ObjectMonitor::wait",
        "ObjectSynchronizer::wait",
        "MonitorWait",
        "Object.wait",
        ".await",
        "Queue.take",
        "Queue.poll",
        "ThreadPoolExecutor.getTask",
    ];
    const LOCK: &[&str] = &[
        "mutex_lock",
        "mutex_timedlock",
        "mutex_clocklock",
        "rwlock",
        "lll_lock",
        "ObjectMonitor::enter",
        "ObjectMonitor::EnterI",
        "ObjectSynchronizer::enter",
        "monitorenter",
        "monitor_locking",
        "ReentrantLock",
        "ReentrantReadWriteLock",
        "AbstractQueuedSynchronizer.acquire",
        "Mutex::lock",
        "RwLock::",
        "lock_contended",
        "RawMutex::lock",
        "RawRwLock::",
    ];
    if CONDITION.iter().any(|p| lock_function.contains(p)) {
        Some(WaitKind::Condition)
    } else if LOCK.iter().any(|p| lock_function.contains(p)) {
        Some(WaitKind::Lock)
    } else {
        None
    }
}

/// A lock function's name as people call it: `___pthread_mutex_lock` → `pthread_mutex_lock`,
/// `java.util.concurrent.locks.ReentrantLock.lock` → `ReentrantLock.lock`.
fn short_lock_name(name: &str) -> String {
    for package in [
        "java.util.concurrent.locks.",
        "java.util.concurrent.",
        "jdk.internal.misc.",
    ] {
        if let Some(rest) = name.strip_prefix(package) {
            return rest.to_owned();
        }
    }
    // C++: without the parameter list (the last parenthesized group, at the end: Go's
    // `sync.(*Mutex).Lock` keeps its receiver).
    let name = match name.strip_suffix(')') {
        Some(_) => {
            let mut depth = 0;
            let mut cut = name.len();
            for (i, c) in name.char_indices().rev() {
                match c {
                    ')' => depth += 1,
                    '(' => {
                        depth -= 1;
                        if depth == 0 {
                            cut = i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            &name[..cut]
        }
        None => name,
    };
    name.trim_start_matches('_')
        .trim_start_matches("GI_")
        .trim_start_matches('_')
        .to_owned()
}

#[cfg(test)]
mod tests;
