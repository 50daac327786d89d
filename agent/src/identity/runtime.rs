//! Which language runtime a process runs, and the CPU count it sized itself from — read from the
//! process, never guessed: its executable (the Go build info), its mappings (HotSpot's
//! `libjvm.so`, .NET's `libcoreclr.so`), its environment and command line, and its threads'
//! names.
//!
//! The diagnosis needs it twice. Runtimes park their idle threads on futexes and wake them as
//! work arrives (Go's Ms, HotSpot's compiler, GC and service threads): those hand-offs carry
//! work, not a lock, and must not make a lock storm. And a runtime that sized its pools from the
//! node's CPUs rather than the container's runs more threads than it can use.
//!
//! Everything is read through `/proc/<pid>`, which names the container's own files whatever the
//! mount namespace. Reads are best effort: what cannot be read is `None`.

use std::{collections::HashMap, path::Path};

/// The language runtime of a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Runtime {
    /// A Go program, with the toolchain version from its build info (`go1.26.8`) when found.
    Go { version: Option<String> },
    /// HotSpot (OpenJDK and its builds).
    Jvm,
    /// .NET (CoreCLR).
    DotNet,
    /// Anything else: C, C++, Rust, …
    Native,
}

impl Runtime {
    pub fn name(&self) -> &'static str {
        match self {
            Runtime::Go { .. } => "go",
            Runtime::Jvm => "jvm",
            Runtime::DotNet => "dotnet",
            Runtime::Native => "native",
        }
    }
}

/// A CPU count a runtime sizes itself from, and where it was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuSetting {
    /// The setting as a user would write it: `GOMAXPROCS`, `-XX:ActiveProcessorCount`,
    /// `DOTNET_PROCESSOR_COUNT`, Redis's `io-threads`, or `CPUs the process may run on` when
    /// nothing sets it.
    pub name: &'static str,
    pub value: u32,
    /// `environment`, `command line`, `affinity` (the runtime's default), or `threads` (a
    /// server's threads, named by the setting).
    pub source: &'static str,
}

/// What stormwatch knows of one process's runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessRuntime {
    pub tgid: u32,
    /// The process's name (`comm`).
    pub comm: String,
    pub runtime: Runtime,
    /// The CPU count the runtime sizes its pools from, when it can be told from the process.
    /// `None` where the runtime reads the container's CPU limit itself (Go 1.25 and later,
    /// HotSpot with container support, .NET) and nothing overrides it.
    pub cpus: Option<CpuSetting>,
    /// HotSpot: its GC worker threads (`GC Thread#N`) — the pool it sized from its CPU count.
    pub gc_threads: Option<u32>,
    /// Threads of the process.
    pub threads: Option<u32>,
    /// The native server it is, where it sizes a pool of its own ([`Server`]); `cpus` then
    /// holds that pool's setting.
    pub server: Option<Server>,
}

/// A native server that sizes a pool of its own from a setting, which its threads (or worker
/// processes) tell: how many there are, and how they wait for work. Its command line cannot
/// always say (Redis rewrites its process title; nginx's count is in its configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    /// Redis's I/O threads (`io-threads`, 6.0 and later, named `io_thd_1`…): they and the
    /// main thread spin-wait for each other.
    Redis,
    /// memcached's worker threads (`-t`, named `mc-worker`): each an event loop over the
    /// connections it was dealt.
    Memcached,
    /// nginx's worker processes (`worker_processes`), each an event loop; read from the
    /// master process, whose children they are.
    Nginx,
}

impl Server {
    /// Whether its pool's threads spin while they wait, so that more of them than CPUs only
    /// take turns whatever the load, rather than sleep in an event loop until work comes.
    pub fn spins(self) -> bool {
        matches!(self, Server::Redis)
    }

    /// The server a process named `comm` with command line `args` is, if any: nginx only as
    /// its master (`nginx: master process …`), which the workers' count is read from.
    fn of(comm: &str, args: &[String]) -> Option<Self> {
        match comm {
            "redis-server" => Some(Server::Redis),
            "memcached" => Some(Server::Memcached),
            "nginx"
                if args
                    .first()
                    .is_some_and(|a| a.starts_with("nginx: master process")) =>
            {
                Some(Server::Nginx)
            }
            _ => None,
        }
    }

    /// Its pool's setting, counted from the process at `proc` (its `/proc/<pid>`): `None` for
    /// a Redis without I/O threads, or a pool that could not be counted.
    fn setting(self, proc: &Path) -> Option<CpuSetting> {
        let (name, value, source) = match self {
            // The main thread does I/O too: `io-threads 4` starts three.
            Server::Redis => match count_threads_named(proc, "io_thd_") {
                0 => return None,
                io => ("io-threads", io + 1, "threads"),
            },
            Server::Memcached => ("-t", count_threads_named(proc, "mc-worker"), "threads"),
            Server::Nginx => (
                "worker_processes",
                count_children(proc, "nginx: worker process"),
                "worker processes",
            ),
        };
        (value > 0).then_some(CpuSetting {
            name,
            value,
            source,
        })
    }
}

/// Reads a process's runtime; `None` when the process is gone or cannot be read.
pub fn read(tgid: u32) -> Option<ProcessRuntime> {
    let proc = Path::new("/proc").join(tgid.to_string());
    let comm = crate::files::kernel_text(proc.join("comm"))?
        .trim_end()
        .to_owned();
    let maps = crate::files::kernel_text(proc.join("maps")).unwrap_or_default();
    let environ = crate::files::kernel_bytes(proc.join("environ")).unwrap_or_default();
    let cmdline = crate::files::kernel_bytes(proc.join("cmdline")).unwrap_or_default();
    let runtime = if maps_name(&maps, "libjvm.so") {
        Runtime::Jvm
    } else if maps_name(&maps, "libcoreclr.so") {
        Runtime::DotNet
    } else {
        match go_buildinfo(&proc.join("exe")).and_then(|b| go_version(&b)) {
            Some(version) => Runtime::Go { version },
            None => Runtime::Native,
        }
    };
    let status = crate::files::kernel_text(proc.join("status")).unwrap_or_default();
    let threads = status_field(&status, "Threads:").and_then(|v| v.parse().ok());
    let affinity = status_field(&status, "Cpus_allowed_list:").and_then(count_cpu_list);
    let env = nul_separated(&environ);
    let args = nul_separated(&cmdline);
    let gc_threads = (runtime == Runtime::Jvm).then(|| count_threads_named(&proc, "GC Thread#"));
    let server = (runtime == Runtime::Native)
        .then(|| Server::of(&comm, &args))
        .flatten();
    let cpus = match (&runtime, server) {
        (Runtime::Native, Some(s)) => s.setting(&proc),
        (Runtime::Native, None) => None,
        _ => cpu_setting(&runtime, &env, &args, affinity),
    };
    Some(ProcessRuntime {
        tgid,
        comm,
        runtime,
        cpus,
        gc_threads,
        threads,
        server,
    })
}

/// The CPU count a runtime sizes itself from, as far as the process says.
fn cpu_setting(
    runtime: &Runtime,
    env: &[String],
    args: &[String],
    affinity: Option<u32>,
) -> Option<CpuSetting> {
    let env_value = |key: &str| {
        env.iter()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.trim().parse::<u32>().ok())
            .filter(|v| *v > 0)
    };
    match runtime {
        Runtime::Go { version } => {
            if let Some(v) = env_value("GOMAXPROCS") {
                return Some(CpuSetting {
                    name: "GOMAXPROCS",
                    value: v,
                    source: "environment",
                });
            }
            // Before Go 1.25 GOMAXPROCS defaults to the CPUs the process may run on, whatever
            // the CPU limit; from 1.25 on the runtime reads the limit itself.
            let reads_limit = version
                .as_deref()
                .and_then(go_minor)
                .is_some_and(|m| m >= 25);
            (!reads_limit).then_some(())?;
            Some(CpuSetting {
                name: "GOMAXPROCS",
                value: affinity?,
                source: "affinity",
            })
        }
        Runtime::Jvm => args.iter().find_map(|a| {
            let v = a.strip_prefix("-XX:ActiveProcessorCount=")?.parse().ok()?;
            Some(CpuSetting {
                name: "-XX:ActiveProcessorCount",
                value: v,
                source: "command line",
            })
        }),
        Runtime::DotNet => env_value("DOTNET_PROCESSOR_COUNT").map(|v| CpuSetting {
            name: "DOTNET_PROCESSOR_COUNT",
            value: v,
            source: "environment",
        }),
        Runtime::Native => None,
    }
}

/// Process `tgid`'s runtime if it is a native server that sizes a pool of its own ([`Server`])
/// and says how big: such pools wait without futex hand-offs (Redis's I/O threads spin,
/// memcached's and nginx's event loops sleep in `epoll_wait`), so none brings the process to
/// the diagnosis, which looks at a cgroup's processes for them instead. Only the name (and,
/// for a process named like a server, the command line) is read of any other process.
pub fn sized_server(tgid: u32) -> Option<ProcessRuntime> {
    let proc = Path::new("/proc").join(tgid.to_string());
    let comm = crate::files::kernel_text(proc.join("comm"))?;
    if !SERVERS.contains(&comm.trim_end()) {
        return None;
    }
    let cmdline = crate::files::kernel_bytes(proc.join("cmdline")).unwrap_or_default();
    Server::of(comm.trim_end(), &nul_separated(&cmdline))?;
    read(tgid).filter(|p| p.server.is_some() && p.cpus.is_some())
}

/// The names ([`Server::of`]) of the native servers whose pools are read.
const SERVERS: [&str; 3] = ["redis-server", "memcached", "nginx"];

/// Whether a thread of `runtime` named `comm` is one of the runtime's own service threads: they
/// sleep until the runtime has work for them (a compilation, a collection, a signal, a
/// reference to process) and are woken for it — hand-offs of work, never of the application's
/// lock. HotSpot names them (17 and later; `comm` keeps 15 bytes): these prefixes are its own.
/// Go's threads are all Ms of the scheduler and are told apart by the runtime, not the name.
pub fn is_service_thread(runtime: &Runtime, comm: &str) -> bool {
    const HOTSPOT: [&str; 19] = [
        "VM Thread",
        "VM Periodic Tas",
        "Reference Handl",
        "Finalizer",
        "Signal Dispatch",
        "Service Thread",
        "Monitor Deflati",
        "C1 CompilerThre",
        "C2 CompilerThre",
        "Sweeper thread",
        "Common-Cleaner",
        "Notification Th",
        "Attach Listener",
        "GC Thread#",
        "G1 Main Marker",
        "G1 Conc#",
        "G1 Refine#",
        "G1 Service",
        "VM Thread#",
    ];
    match runtime {
        Runtime::Jvm => HOTSPOT.iter().any(|p| comm.starts_with(p)),
        _ => false,
    }
}

/// Whether the runtime parks all its threads itself, so that every futex hand-off the kernel sees
/// is the scheduler's, not a lock's. Go: a goroutine blocked on a `sync.Mutex` is parked by the
/// Go scheduler and never reaches the kernel; the futex calls are its Ms (OS threads) sleeping
/// when they find no goroutine to run and being woken when one becomes runnable.
pub fn parks_in_its_scheduler(runtime: &Runtime) -> bool {
    matches!(runtime, Runtime::Go { .. })
}

/// The most processes, and threads, [`RuntimeCache`] keeps: it keeps those of the diagnosis
/// window's hand-offs, this many at most.
pub const MAX_ENTRIES: usize = 65_536;

/// A cache of process runtimes by tgid (a tgid's runtime cannot change without an exec, which
/// keeps the tgid; the comm tells an exec apart and re-reads).
#[derive(Default)]
pub struct RuntimeCache {
    by_tgid: HashMap<u32, Option<ProcessRuntime>>,
    /// Thread names, by tid (read once; `None`: gone before it was read).
    comms: HashMap<u32, Option<String>>,
}

impl RuntimeCache {
    pub fn process(&mut self, tgid: u32) -> Option<&ProcessRuntime> {
        self.by_tgid
            .entry(tgid)
            .or_insert_with(|| read(tgid))
            .as_ref()
    }

    /// The name of thread `tid` of process `tgid`.
    pub fn thread_name(&mut self, tgid: u32, tid: u32) -> Option<&str> {
        self.comms
            .entry(tid)
            .or_insert_with(|| {
                crate::files::kernel_text(format!("/proc/{tgid}/task/{tid}/comm"))
                    .map(|c| c.trim_end().to_owned())
            })
            .as_deref()
    }

    /// Forgets processes and threads not in `alive` (tgid, tid) pairs, and all of them past
    /// [`MAX_ENTRIES`] (read again when next seen).
    pub fn retain(
        &mut self,
        tgids: &std::collections::HashSet<u32>,
        tids: &std::collections::HashSet<u32>,
    ) {
        self.by_tgid.retain(|t, _| tgids.contains(t));
        self.comms.retain(|t, _| tids.contains(t));
        if self.by_tgid.len() > MAX_ENTRIES {
            self.by_tgid.clear();
        }
        if self.comms.len() > MAX_ENTRIES {
            self.comms.clear();
        }
    }

    /// The processes and thread names it keeps.
    pub fn cache_sizes(&self) -> [crate::memory::CacheSize; 2] {
        use crate::memory::CacheSize;
        [
            CacheSize::entries("process_runtimes", self.by_tgid.len(), MAX_ENTRIES),
            CacheSize::entries("thread_names", self.comms.len(), MAX_ENTRIES),
        ]
    }
}

pub(crate) fn maps_name(maps: &str, library: &str) -> bool {
    maps.lines().any(|l| {
        l.rsplit('/')
            .next()
            .is_some_and(|f| f == library || f.starts_with(&format!("{library}.")))
    })
}

fn nul_separated(bytes: &[u8]) -> Vec<String> {
    bytes
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(str::trim)
}

fn count_cpu_list(list: &str) -> Option<u32> {
    crate::identity::limits::parse_cpu_list(list).map(|c| c.len() as u32)
}

/// How many of the children of the process at `proc` (its `/proc/<pid>`: those its main thread
/// started, as a server's master starts its workers) have a command line starting with
/// `title`; 0 when they cannot be read.
fn count_children(proc: &Path, title: &str) -> u32 {
    let (Some(pid), Some(all)) = (proc.file_name(), proc.parent()) else {
        return 0;
    };
    let Some(children) = crate::files::kernel_text(proc.join("task").join(pid).join("children"))
    else {
        return 0;
    };
    children
        .split_whitespace()
        .filter(|child| {
            crate::files::kernel_bytes(all.join(child).join("cmdline"))
                .is_some_and(|c| c.starts_with(title.as_bytes()))
        })
        .count() as u32
}

/// How many of the process's threads (`proc`: its `/proc/<pid>`) have a name starting with
/// `prefix`; 0 when its tasks cannot be read.
pub(crate) fn count_threads_named(proc: &Path, prefix: &str) -> u32 {
    let Ok(tasks) = std::fs::read_dir(proc.join("task")) else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter(|t| {
            crate::files::kernel_text(t.path().join("comm")).is_some_and(|c| c.starts_with(prefix))
        })
        .count() as u32
}

/// The Go build info's magic, at the start of an executable's `.go.buildinfo` section.
const GO_BUILDINFO_MAGIC: &[u8] = b"\xff Go buildinf:";

/// The `.go.buildinfo` section of an ELF executable (every Go program's since Go 1.13; kept by
/// `strip`, which removes symbols, not section headers); `None` for any other file.
/// The `.go.buildinfo` section of the executable at `exe`, `None` for one that has none. Only
/// the ELF headers and that section are read, not the whole binary (a static binary can be
/// hundreds of MiB).
pub(crate) fn go_buildinfo(exe: &std::path::Path) -> Option<Vec<u8>> {
    use object::{Object as _, ObjectSection as _};
    let cache = object::ReadCache::new(std::fs::File::open(exe).ok()?);
    let file = object::File::parse(&cache).ok()?;
    let section = file.section_by_name(".go.buildinfo")?;
    section.data().ok().map(<[u8]>::to_vec)
}

/// `Some(version)` when `section` is a Go build info: the toolchain version (inline since Go
/// 1.18: a varint length and the string, 32 bytes after the magic), `Some(None)` for an older
/// layout that points elsewhere; `None` when it is not one.
pub fn go_version(section: &[u8]) -> Option<Option<String>> {
    if !section.starts_with(GO_BUILDINFO_MAGIC) {
        return None;
    }
    let header = section.get(..32)?;
    let flags = header[15];
    if flags & 2 == 0 {
        return Some(None);
    }
    let rest = &section[32..];
    let (len, used) = uvarint(rest)?;
    let version = rest.get(used..used + usize::try_from(len).ok()?)?;
    Some(
        std::str::from_utf8(version)
            .ok()
            .filter(|v| v.starts_with("go"))
            .map(str::to_owned),
    )
}

fn uvarint(b: &[u8]) -> Option<(u64, usize)> {
    let mut x = 0u64;
    for (i, byte) in b.iter().take(10).enumerate() {
        x |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((x, i + 1));
        }
    }
    None
}

/// `go1.24.3` → 24 (Go 1 only).
pub fn go_minor(version: &str) -> Option<u32> {
    let rest = version.strip_prefix("go1.")?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `/proc` of one server process (`pid`) with threads named `threads` and children with
    /// command lines `children`, written under a temporary directory.
    fn fake_proc(pid: u32, threads: &[&str], children: &[&str]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let proc = root.path().join(pid.to_string());
        for (i, comm) in threads.iter().enumerate() {
            let task = proc.join("task").join((pid + i as u32).to_string());
            std::fs::create_dir_all(&task).unwrap();
            std::fs::write(task.join("comm"), format!("{comm}\n")).unwrap();
        }
        let kids: Vec<String> = (0..children.len())
            .map(|i| (pid + 100 + i as u32).to_string())
            .collect();
        std::fs::write(
            proc.join("task").join(pid.to_string()).join("children"),
            kids.iter().map(|k| format!("{k} ")).collect::<String>(),
        )
        .unwrap();
        for (kid, cmdline) in kids.iter().zip(children) {
            let dir = root.path().join(kid);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cmdline"), format!("{cmdline}\0\0\0")).unwrap();
        }
        root
    }

    /// Each server's pool is counted from what names it: Redis's `io_thd_` threads and its main
    /// thread, memcached's `mc-worker` threads, nginx's master's children that are workers
    /// (not its cache manager); an nginx worker, or a Redis without I/O threads, is no sized
    /// server.
    #[test]
    fn servers_pools_are_counted_from_their_threads_and_workers() {
        let args = |a: &str| vec![a.to_owned()];
        let redis = fake_proc(
            10,
            &[
                "redis-server",
                "io_thd_1",
                "io_thd_2",
                "io_thd_3",
                "bio_close_file",
            ],
            &[],
        );
        let server = Server::of("redis-server", &args("redis-server *:6379")).unwrap();
        assert!(server.spins());
        assert_eq!(
            server.setting(&redis.path().join("10")),
            Some(CpuSetting {
                name: "io-threads",
                value: 4,
                source: "threads"
            })
        );
        let plain = fake_proc(11, &["redis-server", "bio_close_file"], &[]);
        assert_eq!(server.setting(&plain.path().join("11")), None);

        let mc = fake_proc(
            20,
            &[
                "memcached",
                "mc-worker",
                "mc-worker",
                "mc-worker",
                "mc-lrumaint",
            ],
            &[],
        );
        let server = Server::of("memcached", &args("memcached")).unwrap();
        assert!(!server.spins());
        assert_eq!(
            server.setting(&mc.path().join("20")),
            Some(CpuSetting {
                name: "-t",
                value: 3,
                source: "threads"
            })
        );

        let nginx = fake_proc(
            30,
            &["nginx"],
            &[
                "nginx: worker process",
                "nginx: worker process",
                "nginx: cache manager process",
            ],
        );
        let master = args("nginx: master process /usr/sbin/nginx -c /etc/nginx/nginx.conf");
        let server = Server::of("nginx", &master).unwrap();
        assert_eq!(
            server.setting(&nginx.path().join("30")),
            Some(CpuSetting {
                name: "worker_processes",
                value: 2,
                source: "worker processes"
            })
        );
        assert_eq!(Server::of("nginx", &args("nginx: worker process")), None);
        assert_eq!(Server::of("postgres", &args("postgres")), None);
    }

    fn buildinfo(version: &str) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(GO_BUILDINFO_MAGIC);
        b.push(8); // pointer size
        b.push(2); // flags: inline strings
        b.extend_from_slice(&[0; 16]);
        b.push(version.len() as u8);
        b.extend_from_slice(version.as_bytes());
        b.extend_from_slice(&[0; 8]);
        b
    }

    #[test]
    fn the_go_version_comes_from_the_build_info() {
        assert_eq!(
            go_version(&buildinfo("go1.26.8")),
            Some(Some("go1.26.8".to_owned()))
        );
        assert_eq!(go_version(b"\x7fELF not go at all"), None);
        let mut old = buildinfo("go1.16");
        old[15] = 0;
        assert_eq!(
            go_version(&old),
            Some(None),
            "a pre-1.18 layout: Go, version unknown"
        );
        assert_eq!(go_minor("go1.24.3"), Some(24));
        assert_eq!(go_minor("go1.25rc1"), Some(25));
        assert_eq!(go_minor("devel"), None);
    }

    /// This test binary holds the build info's magic as data (the constant above): only the
    /// section counts.
    #[test]
    fn this_test_binary_is_native() {
        let me = read(std::process::id()).expect("this process");
        assert_eq!(me.runtime, Runtime::Native);
        assert!(me.threads.is_some_and(|t| t >= 1));
    }

    /// A real Go program, built here with the installed toolchain when there is one.
    #[test]
    fn a_go_program_is_go_with_its_version() {
        let Ok(out) = std::process::Command::new("go")
            .arg("env")
            .arg("GOROOT")
            .output()
        else {
            panic!("the Go toolchain is needed for this test (cargo xtask setup installs it)");
        };
        let goroot = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        // The toolchain's own `go` binary is a Go program.
        let exe = std::path::PathBuf::from(format!("{goroot}/bin/go"));
        let v = go_version(&go_buildinfo(&exe).expect("a .go.buildinfo section"))
            .expect("Go build info")
            .expect("a version");
        assert!(v.starts_with("go1."), "{v}");
        assert!(go_buildinfo(std::path::Path::new("/proc/self/exe")).is_none());
    }

    #[test]
    fn settings_are_read_where_the_runtime_reads_them() {
        let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        let go = |v: &str| Runtime::Go {
            version: Some(v.to_owned()),
        };
        assert_eq!(
            cpu_setting(&go("go1.26.8"), &s(&["GOMAXPROCS=16"]), &[], Some(2)),
            Some(CpuSetting {
                name: "GOMAXPROCS",
                value: 16,
                source: "environment"
            })
        );
        assert_eq!(
            cpu_setting(&go("go1.26.8"), &[], &[], Some(64)),
            None,
            "Go 1.25+ reads the CPU limit itself"
        );
        assert_eq!(
            cpu_setting(&go("go1.22.1"), &[], &[], Some(64)).map(|c| (c.value, c.source)),
            Some((64, "affinity"))
        );
        assert_eq!(
            cpu_setting(
                &Runtime::Jvm,
                &[],
                &s(&["java", "-XX:ActiveProcessorCount=32", "Main"]),
                None
            )
            .map(|c| c.value),
            Some(32)
        );
        assert_eq!(
            cpu_setting(
                &Runtime::DotNet,
                &s(&["DOTNET_PROCESSOR_COUNT=8"]),
                &[],
                None
            )
            .map(|c| c.name),
            Some("DOTNET_PROCESSOR_COUNT")
        );
        assert!(is_service_thread(&Runtime::Jvm, "C2 CompilerThre"));
        assert!(is_service_thread(&Runtime::Jvm, "G1 Refine#0"));
        assert!(!is_service_thread(&Runtime::Jvm, "pool-1-thread-1"));
        assert!(!is_service_thread(&Runtime::Native, "VM Thread"));
    }
}
