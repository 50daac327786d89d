//! The ELF files user stacks are unwound and named with: what is read of each (segments,
//! call-frame sections), shared by every process that maps it, within bounds.

use std::{
    collections::HashMap,
    ops::{Deref, Range},
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use object::{Object as _, ObjectSection as _, ObjectSegment as _};

/// A file by device, inode and modification time: one key for every process and container that
/// maps the same file, whatever the path it has there.
pub(super) type FileKey = (u64, u64, i64);

/// The most ELF files whose sections are kept, mapped by a view or not.
pub const MAX_FILES: usize = 1024;
/// The most bytes of ELF sections (call-frame information) kept over every file: a file that
/// does not fit with the views that use it is not read (its frames are not unwound past).
pub const MAX_ELF_BYTES: u64 = 16 << 20;
/// An ELF file no view maps is kept this long after its last use: a job that runs the same
/// binary again soon after reads it once.
pub(super) const UNUSED_FILE_TTL: Duration = Duration::from_secs(60);

/// A byte buffer shared between processes that map the same file (a `Vec`, read into once:
/// `Arc<[u8]>` would copy it).
#[derive(Clone, Debug, Default)]
pub(super) struct Bytes(pub(super) Arc<Vec<u8>>);

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

/// What unwinding and naming need of one ELF file, read once per file (by device, inode and
/// modification time).
#[derive(Debug)]
pub(super) struct ElfFile {
    /// The loadable segments: (file offset, virtual address, file size).
    pub(super) segments: Vec<(u64, u64, u64)>,
    pub(super) text: Option<Range<u64>>,
    pub(super) eh_frame: Option<(Range<u64>, Bytes)>,
    pub(super) eh_frame_hdr: Option<(Range<u64>, Bytes)>,
    pub(super) got: Option<Range<u64>>,
    pub(super) is_go: bool,
}

impl ElfFile {
    /// The bytes of the sections it holds.
    pub(super) fn bytes(&self) -> u64 {
        [&self.eh_frame, &self.eh_frame_hdr]
            .into_iter()
            .flatten()
            .map(|(_, b)| b.len() as u64)
            .sum()
    }
}

/// An ELF file read, with when it was last mapped by a view being read.
pub(super) struct CachedFile {
    pub(super) file: Arc<ElfFile>,
    pub(super) bytes: u64,
    pub(super) used: Instant,
}

/// The ELF files read, by key, within [`MAX_FILES`] and [`MAX_ELF_BYTES`].
#[derive(Default)]
pub(super) struct FileCache {
    pub(super) files: HashMap<FileKey, CachedFile>,
    pub(super) bytes: u64,
}

impl FileCache {
    /// Whether a file is mapped by a view (its sections are shared with the view's modules).
    pub(super) fn mapped(f: &CachedFile) -> bool {
        Arc::strong_count(&f.file) > 1
    }

    /// Drops files no view maps: those unused for [`UNUSED_FILE_TTL`], and the least recently
    /// used others until `need` more bytes and one more file fit.
    pub(super) fn evict(&mut self, need: u64, now: Instant) {
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

    pub(super) fn fits(&self, bytes: u64) -> bool {
        self.bytes + bytes <= MAX_ELF_BYTES && self.files.len() < MAX_FILES
    }

    /// The file at `path` (in a process's root) with this key: from the cache (marked used), or
    /// read and kept when room can be made for its sections (`make_room`), or read without
    /// them and not kept.
    pub(super) fn get(
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

/// Reads what unwinding and naming need of an ELF file; its call-frame sections only when
/// `room` says their size fits (else it is unwound through by frame pointers alone).
pub(super) fn read_elf(path: &Path, room: impl FnOnce(u64) -> bool) -> Option<ElfFile> {
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
