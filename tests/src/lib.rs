//! Helpers for the integration tests: the cgroup v2 hierarchy, throw-away test cgroups,
//! workloads started inside them, and the agent run as a separate process.
//!
//! Tests that need root and BPF call [`require_bpf`] first: it panics with the reason when the
//! agent cannot work here. Nothing is ever skipped silently.

use std::{
    ffi::CString,
    os::unix::{ffi::OsStrExt as _, fs::MetadataExt as _, process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::{
        OnceLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use serde_json::Value;
use stormwatch::identity::mountinfo;

pub mod agent_proc;
pub use agent_proc::{Agent, Finished};
pub mod bpf_maps;
pub mod bpftrace;
pub mod cgroupfs;
pub mod corpus;
pub mod daemon;
pub mod deploy;
pub mod netns;
pub mod prometheus;
pub mod report;
pub mod stats;

// ---- the cgroup v2 hierarchy ----------------------------------------------------------------

/// The cgroup v2 root of this machine (`/sys/fs/cgroup` on pure-v2 hosts, often
/// `/sys/fs/cgroup/unified` on hybrid ones), detected from /proc/self/mountinfo.
pub fn v2_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let mounts = mountinfo::read_self().expect("cannot read /proc/self/mountinfo");
        mountinfo::v2_root(&mounts)
            .expect("no cgroup v2 hierarchy is mounted (no cgroup2 line in /proc/self/mountinfo)")
    })
}

/// A uniquely named cgroup directly under the v2 root, removed (with whatever still runs in it)
/// on drop.
pub struct TestCgroup {
    path: PathBuf,
    rel: String,
    id: u64,
    removed: bool,
}

/// Whether `name` is `<prefix>…-<pid>-<n>` of a test process that is gone: what a run killed
/// half-way leaves behind (its cgroups, its network namespaces).
pub(crate) fn left_by_dead_test(name: &str, prefix: &str) -> bool {
    let mut parts = name.rsplitn(3, '-');
    let (Some(seq), Some(pid), Some(head)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    head.starts_with(prefix)
        && seq.parse::<u64>().is_ok()
        && pid
            .parse::<u32>()
            .is_ok_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
}

impl TestCgroup {
    /// Removes the cgroups of test processes that died without dropping them, with whatever
    /// still runs in them.
    fn remove_stale() {
        let Ok(dir) = std::fs::read_dir(v2_root()) else {
            return;
        };
        for name in dir
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
        {
            if left_by_dead_test(&name, "sw-test-") {
                eprintln!("removing cgroup {name}, left by a test run that died");
                let mut stale = Self {
                    path: v2_root().join(&name),
                    rel: format!("/{name}"),
                    id: 0,
                    removed: false,
                };
                if let Err(e) = stale.try_remove() {
                    eprintln!("{e}");
                }
            }
        }
    }

    pub fn new(name: &str) -> Self {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(Self::remove_stale);
        let dir = format!(
            "sw-test-{name}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let path = v2_root().join(&dir);
        std::fs::create_dir(&path).unwrap_or_else(|e| {
            panic!(
                "cannot create cgroup {}: {e} (the integration tests must run as root)",
                path.display()
            )
        });
        let id = std::fs::metadata(&path)
            .expect("stat of the new cgroup")
            .ino();
        Self {
            path,
            rel: format!("/{dir}"),
            id,
            removed: false,
        }
    }

    /// The full path of the directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path relative to the v2 root, as the agent reports it (`/sw-test-…`).
    pub fn rel_path(&self) -> &str {
        &self.rel
    }

    /// The cgroup id: the inode number of its directory, which is what
    /// `bpf_get_current_cgroup_id()` returns for its tasks.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// All CPU time charged to the cgroup so far (v2 `cpu.stat` `usage_usec`, present without
    /// the cpu controller), in seconds: every thread's, exit paths included.
    pub fn cpu_usage_seconds(&self) -> f64 {
        CpuStat::read(&self.path.join("cpu.stat")).key("usage_usec") / 1e6
    }

    /// Pids currently in the cgroup.
    pub fn procs(&self) -> Vec<i32> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }

    /// Kills what is left in the cgroup and removes it. Panics when it cannot be removed.
    pub fn remove(mut self) {
        if let Err(e) = self.try_remove() {
            panic!("{e}");
        }
    }

    fn try_remove(&mut self) -> Result<(), String> {
        if self.removed {
            return Ok(());
        }
        let kill = self.path.join("cgroup.kill");
        let killed_by_file = kill.exists() && std::fs::write(&kill, "1").is_ok();
        let mut last_err = None;
        for _ in 0..200 {
            if !killed_by_file {
                for pid in self.procs() {
                    // SAFETY: kill(2) on a pid read from the cgroup: nothing else is affected.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            match std::fs::remove_dir(&self.path) {
                Ok(()) => {
                    self.removed = true;
                    return Ok(());
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    self.removed = true;
                    return Ok(());
                }
                Err(e) => last_err = Some(e),
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        Err(format!(
            "cannot remove cgroup {}: {}",
            self.path.display(),
            last_err.map(|e| e.to_string()).unwrap_or_default()
        ))
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        if let Err(e) = self.try_remove() {
            if std::thread::panicking() {
                eprintln!("{e}");
            } else {
                panic!("{e}");
            }
        }
    }
}

/// Spawns `cmd` so that it joins `cgroup` before exec: the child writes "0" to the cgroup's
/// `cgroup.procs` between fork and exec, so everything the program does is counted there (only
/// the few context switches of fork and of the write itself happen in the parent's cgroup).
/// stdout is piped (the workloads print their JSON line there); stderr is inherited.
pub fn run_in_cgroup(cmd: &mut Command, cgroup: &TestCgroup) -> Child {
    join_before_exec(cmd, &cgroup.path().join("cgroup.procs"));
    cmd.stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?} in {}: {e}", cgroup.rel_path()))
}

/// Makes the child of `cmd` write itself into `procs` (a `cgroup.procs` file, of any hierarchy)
/// between fork and exec, so that everything it runs is in that cgroup from its first
/// instruction. May be called for several hierarchies.
pub fn join_before_exec(cmd: &mut Command, procs: &Path) {
    let procs = CString::new(procs.as_os_str().as_bytes()).expect("no NUL in a cgroup path");
    // SAFETY: the closure runs in the child between fork and exec; it only calls
    // async-signal-safe functions (open, write, close) on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let n = libc::write(fd, b"0".as_ptr().cast(), 1);
            let err = std::io::Error::last_os_error();
            libc::close(fd);
            if n != 1 {
                return Err(err);
            }
            Ok(())
        });
    }
}

/// Runs the test workload `bin --threads N --seconds S [extra]` in `cgroup` to its end: its
/// result (`bin` is the test's `env!("CARGO_BIN_EXE_…")`).
pub fn run_workload(
    bin: &str,
    threads: usize,
    seconds: f64,
    extra: &[&str],
    cgroup: &TestCgroup,
) -> Value {
    let child = run_in_cgroup(
        Command::new(bin)
            .args([
                "--threads",
                &threads.to_string(),
                "--seconds",
                &seconds.to_string(),
            ])
            .args(extra),
        cgroup,
    );
    workload_result(child)
}

/// `/proc/<pid>/status`, parsed; `None` once the process is gone.
pub fn process_status(pid: u32) -> Option<procfs_core::process::Status> {
    use procfs_core::FromRead as _;
    procfs_core::process::Status::from_file(format!("/proc/{pid}/status")).ok()
}

/// CPU time a process has used, user and system (utime + stime of `/proc/<pid>/stat`), in
/// seconds; 0 once it is gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which is in parentheses and may contain spaces).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<f64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / hz
}

/// Waits for a workload started by [`run_in_cgroup`] and parses the JSON line it printed.
pub fn workload_result(child: Child) -> Value {
    let out = child.wait_with_output().expect("waiting for the workload");
    assert!(
        out.status.success(),
        "workload failed ({}), stdout: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or("");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("workload printed {text:?}: {e}"))
}

/// A number field of a JSON object, with a clear panic when it is missing or not a number.
pub fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("`{key}` is not a number in {v}"))
}

/// Number of CPUs this process may run on.
pub fn cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// `program` to run pinned to `cpu` at `nice` (`nice` and `taskset` exec it: its output is the
/// program's).
pub fn pinned(cpu: usize, nice: i32, program: &str) -> std::process::Command {
    let mut c = std::process::Command::new("nice");
    c.args([
        "-n",
        &nice.to_string(),
        "taskset",
        "-c",
        &cpu.to_string(),
        program,
    ]);
    c
}

// ---- the agent ------------------------------------------------------------------------------

/// The `target/<profile>/` directory the running binary was built into: a test's lives in its
/// `deps/` (`target/<profile>/deps/<test>-<hash>`), a `src/bin` binary in it.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe
        .parent()
        .expect("a binary has a directory")
        .to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    dir
}

/// The agent binary: `$STORMWATCH_BIN`, else `stormwatch` in the `target/<profile>/` directory
/// this test binary was built into (`target/<profile>/deps/<test>-<hash>`).
pub fn agent_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("STORMWATCH_BIN") {
            let p = PathBuf::from(p);
            assert!(
                p.is_file(),
                "STORMWATCH_BIN={} does not exist (build the agent with \
                 `cargo build --release -p stormwatch`)",
                p.display()
            );
            return p;
        }
        let bin = profile_dir().join("stormwatch");
        assert!(
            bin.is_file(),
            "the agent binary {} does not exist: build it first with \
             `cargo build --release -p stormwatch` (and run the tests with `--release`), \
             or point STORMWATCH_BIN at it",
            bin.display()
        );
        bin
    })
}

/// Runs the agent with `args` to completion (stdout and stderr captured).
pub fn agent_output(args: &[&str]) -> Output {
    Command::new(agent_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", agent_bin().display()))
}

/// Panics, with the reason, unless this process is root and `stormwatch check` says the agent
/// can work here. Tests that need BPF call this first: they fail loudly, never skip.
pub fn require_bpf() {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    let verdict = CHECKED.get_or_init(|| {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("these integration tests need root (cgroups, BPF)".to_owned());
        }
        let out = agent_output(&["check"]);
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "`stormwatch check` says the agent cannot work here ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    });
    if let Err(why) = verdict {
        panic!("BPF is not usable here: {why}");
    }
}

/// Tolerance of on-CPU time against the kernel's CPU time (`getrusage`, `cpu.stat`). The probes
/// credit what the scheduler charged (`se.sum_exec_runtime`), which is what both of those add
/// up, so only edges remain: a thread's slice in progress at attach or detach, and an exiting
/// thread's last instants. Seen within 0.3% on this VM under load, where the wall clock (which
/// also counts time the hypervisor stole from the vCPU) was off by up to 10%.
pub const ONCPU_TOLERANCE: f64 = 0.02;

/// `|got - want| <= tolerance * want`, with both figures in the panic message.
#[track_caller]
pub fn assert_within(what: &str, got: f64, want: f64, tolerance: f64) {
    let diff = (got - want).abs();
    eprintln!(
        "{what}: agent {got}, ground truth {want} ({:+.2}%)",
        100.0 * (got - want) / want.max(f64::MIN_POSITIVE)
    );
    assert!(
        diff <= tolerance * want,
        "{what}: agent reported {got}, ground truth {want}: off by {diff} ({:.2}%), \
         tolerance {:.1}%",
        100.0 * diff / want.max(f64::MIN_POSITIVE),
        100.0 * tolerance
    );
}

/// One reading of a cgroup's `cpu.stat` (v2's, or the v1 `cpu` controller's): the kernel's own
/// counters, for the tests to hold the agent's figures to.
pub struct CpuStat {
    path: PathBuf,
    text: String,
}

impl CpuStat {
    pub fn read(path: &Path) -> Self {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        Self {
            path: path.to_owned(),
            text,
        }
    }

    /// The counter `name` (an exact key: `nr_throttled` is not `nr_throttled_x`).
    pub fn key(&self, name: &str) -> f64 {
        self.text
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == name).then(|| v.trim().parse::<f64>().ok())?
            })
            .unwrap_or_else(|| panic!("no {name} in {}", self.path.display()))
    }

    /// Enforcement periods and the periods in which the quota ran out (`nr_periods`,
    /// `nr_throttled`).
    pub fn periods(&self) -> (f64, f64) {
        (self.key("nr_periods"), self.key("nr_throttled"))
    }

    /// Time the quota held the cgroup's threads back, in seconds (v2 `throttled_usec`, v1
    /// `throttled_time` in nanoseconds).
    pub fn throttled_seconds(&self) -> f64 {
        if self.text.contains("throttled_usec") {
            self.key("throttled_usec") / 1e6
        } else {
            self.key("throttled_time") / 1e9
        }
    }
}

#[cfg(test)]
mod tests {
    use super::left_by_dead_test;

    #[test]
    fn only_a_dead_test_process_leftovers_are_stale() {
        // 4194305 is above the largest pid_max (2^22), so no process has it.
        assert!(left_by_dead_test(
            "sw-test-net-daemon-4194305-5",
            "sw-test-"
        ));
        assert!(left_by_dead_test("sw-a-4194305-14", "sw-"));
        let alive = std::process::id();
        assert!(!left_by_dead_test(&format!("sw-a-{alive}-14"), "sw-"));
        assert!(!left_by_dead_test("sw-a-4194305-14", "sw-test-"));
        assert!(!left_by_dead_test("libpod_parent", "sw-"));
        assert!(!left_by_dead_test("sw-a-x-1", "sw-"));
    }
}
