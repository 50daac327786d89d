//! The daemon's configuration (`stormwatch run`): a TOML file, environment variables and flags,
//! merged with the precedence flags > environment > file > defaults.
//!
//! ```toml
//! listen = "0.0.0.0:9847"          # IP:PORT of /metrics, /healthz, /readyz
//! interval_seconds = 5             # how often the probes' maps are read
//! max_cgroups = 2000               # cgroups exported at most; more are counted, not exported
//! removed_grace_seconds = 60       # how long a removed cgroup's series stay
//! diagnosis_window_seconds = 30    # sliding window the diagnosis rules judge
//! bpf_stats = false                # turn on the kernel's BPF run-time statistics (host-wide)
//! histograms = true                # per-cgroup latency histograms (8 buckets each); false: sum and count only
//! wake_kinds = "on-demand"         # wake-ups told local/remote: "on-demand" (while a lock storm is found) or "always"
//! futex_probes = "on-demand"       # futex syscall probes: "on-demand" (while scheduler figures look like a lock storm) or "always"
//! call_sites = true                # while the futex probes are attached, sample hand-offs' user stacks to name a storm's lock
//! jvm_thread_dumps = true          # while they are, ask JVMs whose threads hand off for thread dumps: pools told from locks
//! jvm_virtual_threads = false      # also dump JVMs' virtual threads to judge their lock storms (a JSON dump can crash JDK 25.0.3)
//! postgres_lock_waits = true       # uprobes on PostgreSQL's lock-wait sites in the binaries found running
//! net_packet_probes = "on-demand"  # per-packet network probes: "on-demand" (while packets do not fit an MTU) or "always"
//! net_packet_survey_seconds = 600  # on demand, also attach them for one diagnosis window this often (0: never), from the start
//! web_config_file = "/etc/stormwatch/web.yml"   # TLS and basic auth, exporter-toolkit's format (none by default)
//! http_header_timeout_seconds = 10 # a request's head must arrive within this (idle keep-alive connections close after it)
//! http_request_timeout_seconds = 30   # a request must be answered within this
//! http_idle_timeout_seconds = 30   # a connection that moves no byte for this long is closed
//! http_max_connections = 64        # connections open at once (+2 for health probes); when full, an idle one makes room
//! btf_file = "/var/lib/stormwatch/vmlinux.btf"  # this kernel's BTF, where /sys/kernel/btf/vmlinux cannot be read
//!
//! [thresholds]                     # any of the diagnosis thresholds (see diagnose::Thresholds)
//! runq_min_mean_seconds = 0.002
//! ```
//!
//! Every key is optional; an unknown key is an error that names it. Every error is one line.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};

use crate::{
    diagnose::Thresholds,
    probes::{FutexTier, NetPacketTier, RunqBlameTier, WakeKinds},
};

/// Default address: all interfaces, port 9847 (not a port any common exporter uses; 9090 is
/// Prometheus itself, 9100 the node exporter).
pub const DEFAULT_LISTEN: &str = "0.0.0.0:9847";
pub const DEFAULT_INTERVAL_SECONDS: f64 = 5.0;
pub const DEFAULT_MAX_CGROUPS: usize = 2000;
pub const DEFAULT_REMOVED_GRACE_SECONDS: f64 = 60.0;
pub const DEFAULT_DIAGNOSIS_WINDOW_SECONDS: f64 = 30.0;
pub const DEFAULT_NET_PACKET_SURVEY_SECONDS: f64 = 600.0;
/// A day: surveys rarer than that would leave an interface inventory older than any alert.
const MAX_SURVEY_SECONDS: f64 = 86_400.0;
/// Twice what a scrape needs on a slow link; short enough that a client that trickles its
/// request (or holds a connection open without one) is gone quickly.
pub const DEFAULT_HTTP_HEADER_TIMEOUT_SECONDS: f64 = 10.0;
/// Rendering 2,000 cgroups takes ~0.1 s; 30 s is Prometheus' longest usual scrape timeout.
pub const DEFAULT_HTTP_REQUEST_TIMEOUT_SECONDS: f64 = 30.0;
pub const DEFAULT_HTTP_IDLE_TIMEOUT_SECONDS: f64 = 30.0;
/// Scrapers (an HA pair, a second Prometheus), the kubelet's probes and `curl`s need a few;
/// 64 leaves room and bounds the memory and descriptors any client can take.
pub const DEFAULT_HTTP_MAX_CONNECTIONS: usize = 64;
const MAX_HTTP_CONNECTIONS: u64 = 10_000;
const MAX_HTTP_SECONDS: f64 = 3600.0;

/// Environment variables, between the flags and the file.
pub const ENV_LISTEN: &str = "STORMWATCH_LISTEN";
pub const ENV_INTERVAL: &str = "STORMWATCH_INTERVAL";

/// Bounds of the numeric settings.
/// Each collection reads every probe map and names what is new: ~1 ms per 100 cgroups. Below
/// a second the daemon would spend its CPU collecting what no scrape reads (Prometheus scrapes
/// every 15 s or so); `trace` has its own, lower floor for a live table.
pub const MIN_INTERVAL_SECONDS: f64 = 1.0;
const MAX_INTERVAL_SECONDS: f64 = 3600.0;
const MAX_GRACE_SECONDS: f64 = 86_400.0;
const MAX_WINDOW_SECONDS: f64 = 86_400.0;
const MAX_CGROUPS_LIMIT: u64 = 1_000_000;

/// A strictly positive, finite number of seconds (at most a year): the one validator of every
/// duration given on the command line, in the environment or in the file.
pub fn positive_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !v.is_finite() || v <= 0.0 {
        return Err(format!("must be greater than zero (got `{s}`)"));
    }
    if v > 31_536_000.0 {
        return Err(format!("must be at most a year (got `{s}`)"));
    }
    Ok(v)
}

/// `run`'s collection interval, from the flag or the environment: seconds, at least
/// [`MIN_INTERVAL_SECONDS`].
pub fn run_interval(s: &str) -> Result<f64, String> {
    let v = positive_seconds(s)?;
    if v < MIN_INTERVAL_SECONDS {
        return Err(format!(
            "must be at least {MIN_INTERVAL_SECONDS} (got `{s}`)"
        ));
    }
    Ok(v)
}

/// The effective configuration, and what a config file may say: every key optional (the
/// default where absent), an unknown key refused.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    #[serde(deserialize_with = "listen_address")]
    pub listen: SocketAddr,
    pub interval_seconds: f64,
    pub max_cgroups: usize,
    pub removed_grace_seconds: f64,
    pub diagnosis_window_seconds: f64,
    /// Turn on the kernel's BPF run-time statistics (`BPF_ENABLE_STATS`, needs CAP_SYS_ADMIN;
    /// without it the counters only move if `kernel.bpf_stats_enabled` is set on the host).
    /// Off by default: the statistics are host-wide (every BPF program on the node, not only
    /// ours, pays for two clock reads per run while they are on), and an agent must not change
    /// the host unasked.
    pub bpf_stats: bool,
    /// Export the per-cgroup run-queue latency and futex wait histograms (8 buckets each);
    /// `false` keeps their `_sum`/`_count` figures as counters and drops the buckets: 16 fewer
    /// series per cgroup.
    pub histograms: bool,
    /// When the programs that tell wake-ups local or remote run: on every wake-up of every
    /// thread, they are most of the scheduler probes' cost on a switch-heavy node, and only the
    /// lock storm's explanation (and `stormwatch_wakeups`) needs them. `on-demand` (the default)
    /// attaches them while a lock storm is found; `always` as `trace` and `diagnose` do.
    pub wake_kinds: WakeKinds,
    /// When the futex syscall probes run: any attached `syscalls:` tracepoint puts every
    /// thread of the node on the kernel's syscall slow path (12% more per system call,
    /// measured), whatever the program does. `on-demand` (the default) attaches them while a
    /// cgroup's scheduler figures show what a lock storm needs, until a diagnosis window passes
    /// without it; `always` as `trace` and `diagnose` do.
    pub futex_probes: FutexTier,
    /// While the futex probes are attached, sample hand-offs (at most 100 wakes a second on the
    /// node, each with its waiter) with their user stacks, to name the code that takes a
    /// storm's lock (`stormwatch_lock_storm_call_site`). The agent reads each sampled process's
    /// maps and binaries through `/proc/<pid>`: in a pod, that needs `hostPID` and
    /// `CAP_SYS_PTRACE` (see deploy/README.md); without them the sites are unnamed, saying why.
    pub call_sites: bool,
    /// While the futex probes are attached, ask each JVM whose threads hand off through
    /// futexes for a thread dump (HotSpot's attach mechanism, as `jstack`), at most five a
    /// diagnosis window: what each thread is parked for tells a pool waiting for work from a
    /// lock's queue, which the kernel's figures cannot (a JVM parks every thread on a word of
    /// its own). Each dump stops the JVM's threads for a safepoint (milliseconds). In a pod it
    /// needs `hostPID` (the JVM's `/proc/<pid>/root/tmp`, and `SIGQUIT` to start its attach
    /// listener); a JVM started with `-Xrs` or `-XX:+DisableAttachMechanism` is never signalled.
    /// A JVM with virtual threads is also read for their lock storms, which make no futex
    /// hand-offs, at the same pace: its scheduler's counter (printed by Java code in the JVM,
    /// no handshake with its threads), and a JSON dump where `jvm_virtual_threads` asks.
    pub jvm_thread_dumps: bool,
    /// Whether JVMs with virtual threads are also dumped to judge their lock storms, which make
    /// no futex hand-offs: a JSON thread dump (`jcmd Thread.dump_to_file -format=json`) beside
    /// their scheduler's counter, at the thread dumps' pace. Without it the counter alone is
    /// read (with `jvm_thread_dumps`), which says at most a `possible` storm: it cannot tell a
    /// lock's hand-offs from virtual threads woken for work. Off by default: the JSON
    /// dump crashed a Temurin 25.0.3 JVM serving a virtual thread per request (a fault in the
    /// JVM's thread snapshot, a known one: OpenJDK's JDK-8364343 says the dump "has several
    /// failure modes if invoked while virtual threads are mounting or unmounting", which is
    /// what a storm does all the time; tests/CORPUS.md). Same privileges as
    /// `jvm_thread_dumps`.
    pub jvm_virtual_threads: bool,
    /// Whether PostgreSQL's row and transaction lock waits are counted: two uprobes on its
    /// `postgresql:lock__wait__start`/`done` sites in each binary with them that a process
    /// runs, found through `/proc/<pid>/exe` (needs the host's pids), attached while it runs.
    /// Each lock wait then costs two breakpoint traps, a few microseconds (xtask/BENCHMARKS.md:
    /// what they cost a storm on one row). Off: PostgreSQL's row-lock storms go unjudged (its
    /// backends wait on a latch, out of the futex probes' sight).
    pub postgres_lock_waits: bool,
    /// When the per-packet network probes (transmit and receive) run: for every packet of
    /// every interface, a few percent of a packet-heavy server's CPU. `on-demand` (the
    /// default) attaches them while a network namespace's kernel counters or drops show
    /// packets that did not fit (fragments, "packet too big", drops for size), until a
    /// diagnosis window passes without; `always` as `trace` and `diagnose` do — and only then
    /// are the per-container traffic and per-interface packet figures counted all the time.
    pub net_packet_probes: NetPacketTier,
    /// With `net_packet_probes = "on-demand"`: how often the per-packet probes are attached for
    /// one diagnosis window anyway (the first at start), a survey of the node's interfaces and
    /// of what its containers send — where the agent cannot read the namespaces (the pod,
    /// without CAP_SYS_ADMIN or the host's pids), the interfaces it names are those the probes
    /// saw. 0: never. 600 s with a 30 s window attaches them 5% of the time.
    pub net_packet_survey_seconds: f64,
    /// When the switch program blames run-queue waits on what held the CPU (another
    /// container, the container's own threads, kernel threads, an idle CPU, stolen time): a
    /// ring of each CPU's last runs kept and walked at every context switch. `on-demand` (the
    /// default) while a container's threads wait for CPUs (`runqueue_saturation`), until a
    /// diagnosis window passes without; `always` as `trace` and `diagnose` do.
    pub runqueue_blame: RunqBlameTier,
    /// TLS and basic authentication of the endpoint, in exporter-toolkit's web config format
    /// (`export::web`); none: plain HTTP, open.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub web_config_file: Option<PathBuf>,
    pub http_header_timeout_seconds: f64,
    pub http_request_timeout_seconds: f64,
    pub http_idle_timeout_seconds: f64,
    pub http_max_connections: usize,
    /// The running kernel's BTF, read from this file instead of `/sys/kernel/btf/vmlinux`:
    /// where the agent cannot read that one (a pod without `/sys/kernel/btf` mounted, a kernel
    /// that does not publish it). It must be this kernel's own BTF (a copy of its
    /// `/sys/kernel/btf/vmlinux`, or BTFHub's for this exact kernel build): the agent checks
    /// that each tp_btf program attached where asked and refuses the file otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub btf_file: Option<PathBuf>,
    pub thresholds: Thresholds,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN.parse().expect("valid default address"),
            interval_seconds: DEFAULT_INTERVAL_SECONDS,
            max_cgroups: DEFAULT_MAX_CGROUPS,
            removed_grace_seconds: DEFAULT_REMOVED_GRACE_SECONDS,
            diagnosis_window_seconds: DEFAULT_DIAGNOSIS_WINDOW_SECONDS,
            bpf_stats: false,
            histograms: true,
            wake_kinds: WakeKinds::OnDemand,
            futex_probes: FutexTier::OnDemand,
            call_sites: true,
            jvm_thread_dumps: true,
            jvm_virtual_threads: false,
            postgres_lock_waits: true,
            net_packet_probes: NetPacketTier::OnDemand,
            net_packet_survey_seconds: DEFAULT_NET_PACKET_SURVEY_SECONDS,
            runqueue_blame: RunqBlameTier::OnDemand,
            web_config_file: None,
            http_header_timeout_seconds: DEFAULT_HTTP_HEADER_TIMEOUT_SECONDS,
            http_request_timeout_seconds: DEFAULT_HTTP_REQUEST_TIMEOUT_SECONDS,
            http_idle_timeout_seconds: DEFAULT_HTTP_IDLE_TIMEOUT_SECONDS,
            http_max_connections: DEFAULT_HTTP_MAX_CONNECTIONS,
            btf_file: None,
            thresholds: Thresholds::default(),
        }
    }
}

/// What the command line says (already validated by clap).
#[derive(Clone, Debug, Default)]
pub struct Flags {
    pub listen: Option<SocketAddr>,
    pub interval: Option<f64>,
    pub config: Option<PathBuf>,
    pub web_config_file: Option<PathBuf>,
    pub btf_file: Option<PathBuf>,
}

/// An `IP:PORT` socket address (`0.0.0.0:9847`, `127.0.0.1:9847`, `[::]:9847`).
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    s.trim().parse().map_err(|_| {
        format!("`{s}` is not an IP:PORT address (e.g. 0.0.0.0:9847, 127.0.0.1:9847 or [::]:9847)")
    })
}

/// `listen` as [`parse_listen`] reads it, with its message.
fn listen_address<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let s = String::deserialize(d)?;
    parse_listen(&s).map_err(serde::de::Error::custom)
}

impl Config {
    /// Merges defaults, the file (when `flags.config` names one), the environment (`env` looks
    /// a variable up; empty counts as unset) and the flags, then validates the result.
    pub fn load(flags: &Flags, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<Self> {
        let mut config = match &flags.config {
            Some(path) => Self::from_file(path, &read_file(path)?)?,
            None => Self::default(),
        };
        let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        if let Some(v) = env(ENV_LISTEN) {
            config.listen = parse_listen(&v).map_err(|e| anyhow::anyhow!("{ENV_LISTEN}: {e}"))?;
        }
        if let Some(v) = env(ENV_INTERVAL) {
            config.interval_seconds =
                run_interval(v.trim()).map_err(|e| anyhow::anyhow!("{ENV_INTERVAL}: {e}"))?;
        }
        if let Some(listen) = flags.listen {
            config.listen = listen;
        }
        if let Some(interval) = flags.interval {
            config.interval_seconds = interval;
        }
        if let Some(web) = &flags.web_config_file {
            config.web_config_file = Some(web.clone());
        }
        if let Some(btf) = &flags.btf_file {
            config.btf_file = Some(btf.clone());
        }
        config.validate()?;
        Ok(config)
    }

    /// A config file's text over the defaults; `path` only names it in errors, and is where
    /// its relative paths (`web_config_file`, `btf_file`) start, as exporter-toolkit resolves
    /// the web config's own paths.
    pub fn from_file(path: &Path, text: &str) -> anyhow::Result<Self> {
        let where_ = path.display();
        let mut config: Self = toml::from_str(text).map_err(|e| {
            let at = e
                .span()
                .map(|span| {
                    let (line, column) = line_column(text, span.start);
                    format!(" (line {line}, column {column})")
                })
                .unwrap_or_default();
            anyhow::anyhow!("config file {where_}{at}: {}", one_line(e.message()))
        })?;
        for file in [&mut config.web_config_file, &mut config.btf_file]
            .into_iter()
            .flatten()
        {
            if let Some(dir) = path.parent()
                && file.is_relative()
            {
                *file = dir.join(&*file);
            }
        }
        config
            .validate()
            .with_context(|| format!("config file {where_}"))?;
        Ok(config)
    }

    /// Checks the ranges of every setting.
    pub fn validate(&self) -> anyhow::Result<()> {
        let i = self.interval_seconds;
        if !i.is_finite() || !(MIN_INTERVAL_SECONDS..=MAX_INTERVAL_SECONDS).contains(&i) {
            bail!(
                "interval_seconds must be at least {MIN_INTERVAL_SECONDS} and at most \
                 {MAX_INTERVAL_SECONDS} (got {i})"
            );
        }
        let g = self.removed_grace_seconds;
        if !g.is_finite() || !(0.0..=MAX_GRACE_SECONDS).contains(&g) {
            bail!("removed_grace_seconds must be between 0 and {MAX_GRACE_SECONDS} (got {g})");
        }
        let w = self.diagnosis_window_seconds;
        if !w.is_finite() || w <= 0.0 || w > MAX_WINDOW_SECONDS {
            bail!(
                "diagnosis_window_seconds must be greater than 0 and at most {MAX_WINDOW_SECONDS} \
                 (got {w})"
            );
        }
        let s = self.net_packet_survey_seconds;
        if !s.is_finite() || !(0.0..=MAX_SURVEY_SECONDS).contains(&s) {
            bail!("net_packet_survey_seconds must be between 0 and {MAX_SURVEY_SECONDS} (got {s})");
        }
        for (name, v) in [
            (
                "http_header_timeout_seconds",
                self.http_header_timeout_seconds,
            ),
            (
                "http_request_timeout_seconds",
                self.http_request_timeout_seconds,
            ),
            ("http_idle_timeout_seconds", self.http_idle_timeout_seconds),
        ] {
            if !v.is_finite() || v <= 0.0 || v > MAX_HTTP_SECONDS {
                bail!("{name} must be greater than 0 and at most {MAX_HTTP_SECONDS} (got {v})");
            }
        }
        if self.http_max_connections == 0 || self.http_max_connections as u64 > MAX_HTTP_CONNECTIONS
        {
            bail!(
                "http_max_connections must be between 1 and {MAX_HTTP_CONNECTIONS} (got {})",
                self.http_max_connections
            );
        }
        if self.max_cgroups == 0 || self.max_cgroups as u64 > MAX_CGROUPS_LIMIT {
            bail!(
                "max_cgroups must be between 1 and {MAX_CGROUPS_LIMIT} (got {})",
                self.max_cgroups
            );
        }
        // Every numeric threshold is a rate, share, count or duration: finite, not negative.
        let t = serde_json::to_value(&self.thresholds).context("thresholds")?;
        for (name, value) in t.as_object().into_iter().flatten() {
            let bad = match value {
                serde_json::Value::Number(n) => {
                    !n.as_f64().is_some_and(|v| v.is_finite() && v >= 0.0)
                }
                // serde_json writes non-finite floats as null.
                serde_json::Value::Null => true,
                _ => false,
            };
            if bad {
                bail!("thresholds.{name} must be a finite number >= 0 (got {value})");
            }
        }
        Ok(())
    }

    /// The HTTP server's limits.
    pub fn http_limits(&self) -> crate::export::server::Limits {
        crate::export::server::Limits {
            header_timeout: std::time::Duration::from_secs_f64(self.http_header_timeout_seconds),
            request_timeout: std::time::Duration::from_secs_f64(self.http_request_timeout_seconds),
            idle_timeout: std::time::Duration::from_secs_f64(self.http_idle_timeout_seconds),
            max_connections: self.http_max_connections,
        }
    }

    /// The effective configuration as a config file.
    pub fn to_toml(&self) -> String {
        toml::to_string(self)
            .unwrap_or_else(|e| format!("# cannot render the configuration: {e}\n"))
    }
}

fn read_file(path: &Path) -> anyhow::Result<String> {
    crate::files::read_text(path, crate::files::Kind::Config)
        .map_err(|e| anyhow::anyhow!(e.about("config file", path)))
}

/// 1-based line and column of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// A parser's message on one line, in the words of the file rather than of Rust's types.
fn one_line(s: &str) -> String {
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    [
        ("expected f64", "expected a number"),
        ("expected f32", "expected a number"),
        ("expected u64", "expected a whole number, 0 or more"),
        ("expected u32", "expected a whole number, 0 or more"),
        ("expected usize", "expected a whole number, 0 or more"),
        ("expected i64", "expected a whole number"),
    ]
    .into_iter()
    .fold(s, |s, (rust, plain)| s.replace(rust, plain))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_must_be_positive_and_finite() {
        assert_eq!(positive_seconds("2.5"), Ok(2.5));
        assert!(positive_seconds("0").is_err());
        assert!(positive_seconds("-1").is_err());
        assert!(positive_seconds("nan").is_err());
        assert!(positive_seconds("inf").is_err());
        assert!(positive_seconds("ten").is_err());
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn from_text(text: &str) -> anyhow::Result<Config> {
        Config::from_file(Path::new("/etc/sw.toml"), text)
    }

    #[test]
    fn defaults_without_anything() {
        let c = Config::load(&Flags::default(), no_env).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.listen.to_string(), "0.0.0.0:9847");
        assert_eq!(c.interval_seconds, 5.0);
        assert_eq!(c.max_cgroups, 2000);
        assert_eq!(c.removed_grace_seconds, 60.0);
        assert!(
            !c.bpf_stats,
            "BPF statistics change the host: only when asked"
        );
    }

    #[test]
    fn file_keys_and_partial_thresholds() {
        let c = from_text(
            "listen = \"127.0.0.1:1234\"\ninterval_seconds = 2\nmax_cgroups = 10\n\
             removed_grace_seconds = 0\nbpf_stats = true\nhistograms = false\n\
             wake_kinds = \"always\"\nfutex_probes = \"always\"\ncall_sites = false\npostgres_lock_waits = false\nnet_packet_probes = \"always\"\nnet_packet_survey_seconds = 0\nrunqueue_blame = \"always\"\n[thresholds]\nrunq_min_mean_seconds = 0.002\n",
        )
        .unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:1234");
        assert_eq!(c.interval_seconds, 2.0);
        assert_eq!(c.max_cgroups, 10);
        assert_eq!(c.removed_grace_seconds, 0.0);
        assert!(c.bpf_stats);
        assert!(!c.histograms);
        assert!(Config::default().histograms, "histograms are on by default");
        assert_eq!(c.wake_kinds, WakeKinds::Always);
        assert_eq!(Config::default().wake_kinds, WakeKinds::OnDemand);
        assert_eq!(c.futex_probes, FutexTier::Always);
        assert_eq!(Config::default().futex_probes, FutexTier::OnDemand);
        assert!(!c.call_sites);
        assert!(
            Config::default().call_sites,
            "call sites are sampled by default"
        );
        assert!(!c.postgres_lock_waits);
        assert!(
            Config::default().postgres_lock_waits,
            "PostgreSQL's lock waits are counted by default"
        );
        assert_eq!(c.net_packet_probes, NetPacketTier::Always);
        assert_eq!(Config::default().net_packet_probes, NetPacketTier::OnDemand);
        assert_eq!(c.net_packet_survey_seconds, 0.0);
        assert_eq!(c.runqueue_blame, RunqBlameTier::Always);
        assert_eq!(Config::default().runqueue_blame, RunqBlameTier::OnDemand);
        assert_eq!(c.thresholds.runq_min_mean_seconds, 0.002);
        assert_eq!(
            c.thresholds.runq_min_p99_seconds,
            Thresholds::default().runq_min_p99_seconds
        );
    }

    #[test]
    fn btf_file_is_relative_to_the_config_file_and_the_flag_wins() {
        let c = from_text("btf_file = \"vmlinux.btf\"").unwrap();
        assert_eq!(c.btf_file, Some(PathBuf::from("/etc/vmlinux.btf")));
        let c = from_text("btf_file = \"/var/lib/k.btf\"").unwrap();
        assert_eq!(c.btf_file, Some(PathBuf::from("/var/lib/k.btf")));
        assert_eq!(
            Config::default().btf_file,
            None,
            "the kernel's own by default"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "btf_file = \"/a.btf\"\n").unwrap();
        let flags = Flags {
            config: Some(file),
            btf_file: Some(PathBuf::from("/b.btf")),
            ..Flags::default()
        };
        let c = Config::load(&flags, no_env).unwrap();
        assert_eq!(c.btf_file, Some(PathBuf::from("/b.btf")));
        let back = from_text(&c.to_toml()).unwrap();
        assert_eq!(back.btf_file, c.btf_file, "the effective config keeps it");
    }

    #[test]
    fn unknown_keys_are_named_on_one_line() {
        let e = format!(
            "{:#}",
            from_text("listen = \"1.2.3.4:5\"\nlisten_port = 3\n").unwrap_err()
        );
        assert!(e.contains("listen_port"), "{e}");
        assert!(e.contains("line 2"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let e = format!("{:#}", from_text("[thresholds]\nbogus = 1\n").unwrap_err());
        assert!(e.contains("bogus") && !e.contains('\n'), "{e}");
        let e = format!("{:#}", from_text("interval_seconds = \"x\"").unwrap_err());
        assert!(e.contains("/etc/sw.toml") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn bad_values_are_refused() {
        for text in [
            "listen = \"localhost\"",
            "listen = \"1.2.3.4\"",
            "interval_seconds = 0",
            "interval_seconds = -1",
            "max_cgroups = 0",
            "max_cgroups = -5",
            "removed_grace_seconds = -1",
            "net_packet_survey_seconds = -1",
            "net_packet_survey_seconds = 1e9",
            "net_packet_probes = \"sometimes\"",
            "[thresholds]\nrunq_min_mean_seconds = -1",
            "[thresholds]\nrunq_min_mean_seconds = nan",
            "interval_seconds = inf",
            "interval_seconds = 1e-9",
            "interval_seconds = 0.5",
        ] {
            let e = from_text(text).expect_err(text);
            assert!(!format!("{e:#}").contains('\n'), "{text}: {e:#}");
        }
    }

    #[test]
    fn precedence_is_flags_env_file_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "listen = \"127.0.0.1:1\"\ninterval_seconds = 7\nmax_cgroups = 3\n",
        )
        .unwrap();
        let flags = Flags {
            config: Some(file.clone()),
            ..Flags::default()
        };
        let c = Config::load(&flags, no_env).unwrap();
        assert_eq!(
            (c.listen.port(), c.interval_seconds, c.max_cgroups),
            (1, 7.0, 3)
        );
        let env = |k: &str| match k {
            ENV_LISTEN => Some("127.0.0.1:2".to_owned()),
            ENV_INTERVAL => Some("3".to_owned()),
            _ => None,
        };
        let c = Config::load(&flags, env).unwrap();
        assert_eq!((c.listen.port(), c.interval_seconds), (2, 3.0));
        let flags = Flags {
            listen: Some("127.0.0.1:4".parse().unwrap()),
            interval: Some(1.5),
            ..flags
        };
        let c = Config::load(&flags, env).unwrap();
        assert_eq!(
            (c.listen.port(), c.interval_seconds, c.max_cgroups),
            (4, 1.5, 3)
        );
        let bad_env = |k: &str| (k == ENV_LISTEN).then(|| "nope".to_owned());
        let e = format!(
            "{:#}",
            Config::load(&Flags::default(), bad_env).unwrap_err()
        );
        assert!(e.starts_with(ENV_LISTEN), "{e}");
        let empty_env = |_: &str| Some(String::new());
        assert!(Config::load(&Flags::default(), empty_env).is_ok());
        let missing = Flags {
            config: Some(dir.path().join("missing.toml")),
            ..Flags::default()
        };
        let e = format!("{:#}", Config::load(&missing, no_env).unwrap_err());
        assert!(
            e.contains("cannot read config file") && !e.contains('\n'),
            "{e}"
        );
    }

    #[test]
    fn effective_config_round_trips() {
        let c = from_text("max_cgroups = 9\n[thresholds]\nrunq_min_mean_seconds = 0.5").unwrap();
        let text = c.to_toml();
        let back = from_text(&text).unwrap();
        assert_eq!(back, c, "{text}");
    }
}
