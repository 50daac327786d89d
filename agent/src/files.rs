//! Reading a file the agent is given, or reads on its own, with a bound: regular files only, and
//! at most as many bytes as that kind of file can hold.
//!
//! A path named on the command line or in a config file can be anything: `/dev/zero` (read
//! without a bound, it fills the node's memory until the OOM killer stops the agent), a FIFO
//! (opened for reading, it waits for a writer that never comes), a directory. Files the agent
//! reads on its own (`/proc/<pid>/maps`, a JVM's perf map, cgroup files) are regular, but some
//! grow with what a process does. Every read here opens without blocking, refuses what is not
//! a regular file with one line, and stops at a cap that fits the kind of file, failing rather
//! than truncating: a half-read BTF or config is worse than none.

use std::{
    fmt,
    io::{self, Read as _},
    os::unix::fs::OpenOptionsExt as _,
    path::Path,
};

/// What a file is, and so how large it may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A kernel's BTF (`/sys/kernel/btf/vmlinux` or a copy): 5–10 MiB on distribution
    /// kernels; 64 MiB leaves room for any kernel with every option built in.
    Btf,
    /// `stormwatch run`'s TOML config: a few hundred bytes.
    Config,
    /// The endpoint's web config (exporter-toolkit's YAML) and the certificates and keys it
    /// names: a few KiB each, a long chain of certificates at most a few hundred.
    WebConfig,
    /// A file the kernel writes for the agent to read (`/proc`, cgroupfs, sysfs, tracefs): a
    /// process's maps or a thread's status, a cgroup's `cpu.stat`. The largest are the maps of
    /// a process with hundreds of thousands of mappings.
    Kernel,
    /// A JIT's symbol map (`/tmp/perf-<pid>.map`): one line per compiled method, which a JVM
    /// that has run for weeks can make into tens of MiB.
    PerfMap,
}

impl Kind {
    /// The most bytes a file of this kind may have.
    pub const fn cap(self) -> u64 {
        const MIB: u64 = 1 << 20;
        match self {
            Kind::Btf => 64 * MIB,
            Kind::Config => MIB,
            Kind::WebConfig => MIB,
            Kind::Kernel => 64 * MIB,
            Kind::PerfMap => 256 * MIB,
        }
    }

    fn what(self) -> &'static str {
        match self {
            Kind::Btf => "a BTF file",
            Kind::Config => "a config file",
            Kind::WebConfig => "a web config file",
            Kind::Kernel => "a kernel file",
            Kind::PerfMap => "a perf map",
        }
    }
}

/// Why a file was not read.
#[derive(Debug)]
pub enum ReadError {
    /// Opening, inspecting or reading it failed.
    Io(io::Error),
    /// It is not a regular file: a FIFO, a device, a directory, a socket.
    NotRegular { kind: Kind, file_type: &'static str },
    /// It holds more than its kind may.
    TooLarge { kind: Kind },
    /// It is not UTF-8 text (where text was asked for).
    NotText,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Io(e) => e.fmt(f),
            ReadError::NotRegular { kind, file_type } => write!(
                f,
                "{file_type}, not a regular file (expected {})",
                kind.what()
            ),
            ReadError::TooLarge { kind } => write!(
                f,
                "larger than {} MiB, more than {} can be",
                kind.cap() >> 20,
                kind.what()
            ),
            ReadError::NotText => f.write_str("not UTF-8 text"),
        }
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReadError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        ReadError::Io(e)
    }
}

impl ReadError {
    /// One line for `what` (`"config file"`) at `path`: "cannot read config file /x: a FIFO,
    /// not a regular file (expected a config file)".
    pub fn about(&self, what: &str, path: &Path) -> String {
        format!("cannot read {what} {}: {self}", path.display())
    }
}

impl From<ReadError> for io::Error {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Io(e) => e,
            ReadError::NotText => io::Error::new(io::ErrorKind::InvalidData, e.to_string()),
            e => io::Error::other(e.to_string()),
        }
    }
}

fn file_type_name(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt as _;
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Reads a regular file of `kind` whole. Opens without blocking (a FIFO does not wait for a
/// writer), checks the opened file's type (no race with a path swapped after a check), and
/// fails once more than `kind.cap()` bytes arrive.
pub fn read(path: &Path, kind: Kind) -> Result<Vec<u8>, ReadError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(ReadError::NotRegular {
            kind,
            file_type: file_type_name(meta.file_type()),
        });
    }
    let cap = kind.cap();
    // A kernel file says 0 (or 4096) bytes and has more: the size is a hint, not a bound.
    let mut data = Vec::with_capacity(meta.len().min(cap) as usize);
    file.take(cap + 1).read_to_end(&mut data)?;
    if data.len() as u64 > cap {
        return Err(ReadError::TooLarge { kind });
    }
    Ok(data)
}

/// [`read`], as UTF-8 text.
pub fn read_text(path: &Path, kind: Kind) -> Result<String, ReadError> {
    String::from_utf8(read(path, kind)?).map_err(|_| ReadError::NotText)
}

/// [`read_text`] for a file the kernel writes (`/proc`, cgroupfs, sysfs): `None` where it is
/// gone, unreadable or over the bound, as the callers that read such files treat a missing one.
pub fn kernel_text(path: impl AsRef<Path>) -> Option<String> {
    read_text(path.as_ref(), Kind::Kernel).ok()
}

/// [`read`] for a file the kernel writes, as bytes (`/proc/<pid>/cmdline`, `environ`).
pub fn kernel_bytes(path: impl AsRef<Path>) -> Option<Vec<u8>> {
    read(path.as_ref(), Kind::Kernel).ok()
}

/// Whether process `tgid` is alive (its `/proc` entry is there).
pub fn process_alive(tgid: u32) -> bool {
    Path::new("/proc").join(tgid.to_string()).exists()
}

/// Every process on the node now: the numeric entries of `/proc` (none where it cannot be
/// read).
pub fn process_ids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// A process's executable by device and inode (through `/proc/<pid>/exe`, which the kernel
/// resolves to the container's own file).
pub fn exe_id(tgid: u32) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(Path::new("/proc").join(tgid.to_string()).join("exe")).ok()?;
    Some((m.dev(), m.ino()))
}

/// A PIE's load bias: the start of its executable's lowest mapping (in `proc`'s `maps`) less
/// the binary's lowest segment address (page-aligned). The Go figures' reads and samples
/// translate their run-time addresses with it.
pub fn exe_load_bias(proc: &Path, exe: (u64, u64), first_vaddr: u64) -> Option<u64> {
    let maps = kernel_text(proc.join("maps"))?;
    let start = maps
        .lines()
        .filter_map(|line| {
            let mut f = line.split_ascii_whitespace();
            let range = f.next()?;
            let _perms = f.next()?;
            let _offset = f.next()?;
            let _dev = f.next()?;
            let inode: u64 = f.next()?.parse().ok()?;
            (inode == exe.1).then_some(())?;
            u64::from_str_radix(range.split('-').next()?, 16).ok()
        })
        .min()?;
    Some(start.wrapping_sub(first_vaddr & !0xfff))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_is_refused_without_reading_it() {
        let err = read(Path::new("/dev/zero"), Kind::Btf).unwrap_err();
        assert!(matches!(
            err,
            ReadError::NotRegular {
                file_type: "a character device",
                ..
            }
        ));
        assert_eq!(
            err.to_string(),
            "a character device, not a regular file (expected a BTF file)"
        );
    }

    #[test]
    fn a_fifo_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // No writer: a blocking open would wait forever.
        let err = read_text(&fifo, Kind::Config).unwrap_err();
        assert!(matches!(
            err,
            ReadError::NotRegular {
                file_type: "a FIFO",
                ..
            }
        ));
    }

    #[test]
    fn a_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = read(dir.path(), Kind::Config).unwrap_err();
        // Opening a directory read-only succeeds; its type refuses it.
        assert!(matches!(
            err,
            ReadError::NotRegular {
                file_type: "a directory",
                ..
            }
        ));
    }

    #[test]
    fn a_file_over_its_cap_fails_and_one_at_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        let cap = Kind::Config.cap() as usize;
        std::fs::write(&path, vec![b'#'; cap]).unwrap();
        assert_eq!(read(&path, Kind::Config).unwrap().len(), cap);
        std::fs::write(&path, vec![b'#'; cap + 1]).unwrap();
        let err = read(&path, Kind::Config).unwrap_err();
        assert!(matches!(err, ReadError::TooLarge { .. }));
        assert_eq!(
            err.to_string(),
            "larger than 1 MiB, more than a config file can be"
        );
    }

    #[test]
    fn kernel_files_read_past_their_stated_size() {
        // procfs says 0 bytes; the text is there all the same.
        let status = kernel_text("/proc/self/status").expect("/proc/self/status");
        assert_eq!(std::fs::metadata("/proc/self/status").unwrap().len(), 0);
        assert!(status.contains("\nPid:"));
        assert!(kernel_text("/proc/self/no-such-file").is_none());
    }

    #[test]
    fn text_must_be_utf8() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad");
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        assert!(matches!(
            read_text(&path, Kind::Config),
            Err(ReadError::NotText)
        ));
    }
}
