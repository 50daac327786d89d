//! The command line: one module per subcommand; `main.rs` only parses and dispatches.

pub mod check;
pub mod diagnose;
pub mod run;
pub mod trace;

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::{
    config::positive_seconds,
    diagnose::{
        Thresholds, host_cpus,
        session::{NetworkOptions, SessionOptions},
    },
    pipeline::Pipeline,
    probes::Family,
};

/// Node diagnostics from eBPF: per-container scheduler figures, lock waits and what they mean.
#[derive(Debug, Parser)]
#[command(name = "stormwatch", version, about, long_about = None)]
pub struct Cli {
    /// Log level for messages on stderr (error, warn, info, debug, trace).
    #[arg(long, global = true, env = "STORMWATCH_LOG", default_value = "warn")]
    pub log_level: log::LevelFilter,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Preflight: kernel, BTF, tracepoints, program types and privileges, one line each.
    Check(CheckArgs),
    /// Trace per-container scheduler figures: a live table, or one JSON document at the end.
    Trace(TraceArgs),
    /// Watch the host, then report problems (lock storms, throttling, run-queue saturation,
    /// thread oversubscription) with evidence and what to do. Exit status: 0 no problems,
    /// 3 problems found, 1 error, 2 bad usage.
    Diagnose(DiagnoseArgs),
    /// Run as a daemon: keep the probes attached and serve Prometheus metrics on /metrics
    /// (with /healthz and /readyz). Configuration: flags > environment (STORMWATCH_LISTEN,
    /// STORMWATCH_INTERVAL) > --config file > defaults.
    Run(RunArgs),
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Address to serve on, IP:PORT [default: 0.0.0.0:9847].
    #[arg(long, value_name = "ADDR", value_parser = crate::config::parse_listen)]
    pub listen: Option<std::net::SocketAddr>,

    /// Configuration file (TOML): listen, interval_seconds, max_cgroups,
    /// removed_grace_seconds, diagnosis_window_seconds, bpf_stats, histograms, `[thresholds]`.
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,

    /// Collection interval in seconds [default: 5].
    #[arg(long, value_name = "SECS", value_parser = positive_seconds)]
    pub interval: Option<f64>,

    /// TLS and basic authentication of the endpoint: a web config file in the format of the
    /// Prometheus exporters' exporter-toolkit (tls_server_config, basic_auth_users).
    #[arg(long = "web.config.file", value_name = "FILE")]
    pub web_config_file: Option<std::path::PathBuf>,

    /// Validate the configuration, print the effective one, and exit.
    #[arg(long)]
    pub check_config: bool,

    /// The running kernel's BTF from FILE instead of /sys/kernel/btf/vmlinux (overrides
    /// `btf_file`).
    #[arg(long, value_name = "FILE")]
    pub btf: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct DiagnoseArgs {
    /// How long to watch, in seconds.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = positive_seconds)]
    pub duration: f64,

    /// Print one JSON document instead of the report.
    #[arg(long)]
    pub json: bool,

    /// The running kernel's BTF from FILE instead of /sys/kernel/btf/vmlinux.
    #[arg(long, value_name = "FILE")]
    pub btf: Option<std::path::PathBuf>,

    /// Do not sample hand-offs' user stacks (a lock storm's code is then not named).
    #[arg(long)]
    pub no_call_sites: bool,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Use classic tracepoints even where tp_btf programs would load.
    #[arg(long)]
    pub force_tracepoints: bool,

    /// The running kernel's BTF from FILE instead of /sys/kernel/btf/vmlinux (where the agent
    /// cannot read that one); it must be this kernel's.
    #[arg(long, value_name = "FILE")]
    pub btf: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct TraceArgs {
    /// How long to trace, in seconds. Default: 10 with --json; until interrupted otherwise.
    #[arg(long, value_name = "SECS", value_parser = positive_seconds)]
    pub duration: Option<f64>,

    /// Refresh interval of the table (and collection interval), in seconds.
    #[arg(long, value_name = "SECS", default_value = "1", value_parser = positive_seconds)]
    pub interval: f64,

    /// Only this cgroup and its descendants: a path relative to the cgroup v2 root, or an
    /// absolute path inside it. May be given more than once.
    #[arg(long, value_name = "PATH")]
    pub cgroup: Vec<String>,

    /// Print one JSON document after the duration instead of a live table.
    #[arg(long)]
    pub json: bool,

    /// Use classic tracepoints even where tp_btf programs would load.
    #[arg(long)]
    pub force_tracepoints: bool,

    /// The running kernel's BTF from FILE instead of /sys/kernel/btf/vmlinux.
    #[arg(long, value_name = "FILE")]
    pub btf: Option<std::path::PathBuf>,

    /// Do not sample hand-offs' user stacks (`lock_call_sites` is then null).
    #[arg(long)]
    pub no_call_sites: bool,

    /// Time the run-queue wait and the blocked time from the wake-up programs even where the
    /// kernel keeps `sched_info` (for testing that way, which kernels without it take, and for
    /// measuring both).
    #[arg(long, hide = true)]
    pub waits_from_wakeups: bool,

    /// Probe families to attach (comma-separated). Figures of families left out are null.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "sched,futex,locks,net"
    )]
    pub probes: Vec<Family>,
}

/// The diagnosis session's options for a pipeline: the network rules when its probes are
/// loaded. `span`: the sliding window (`None`: the whole run).
pub fn session_options(
    pipeline: &Pipeline,
    span: Option<Duration>,
    interval: Duration,
    thresholds: Thresholds,
) -> SessionOptions {
    let avail = pipeline.availability().net;
    let with_net = avail != crate::collect::NetAvailability::default();
    SessionOptions {
        span,
        interval,
        thresholds,
        host_cpus: host_cpus(),
        // Pressure over the window is a figure of trace's document; the daemon exports none,
        // so it does not read `cpu.pressure` at every step of every active cgroup.
        window_pressure: span.is_none(),
        network: with_net.then(|| NetworkOptions {
            avail,
            v2_root: pipeline.resolver.root().to_path_buf(),
            host_netns: pipeline.host_netns,
            // A sliding window is the daemon's: it re-reads the inventory at every step.
            inventory_max_age: if span.is_some() {
                INVENTORY_MAX_AGE
            } else {
                Duration::ZERO
            },
        }),
    }
}

/// How long the daemon reuses the namespaces' links and routes while no namespace comes or goes:
/// an MTU changed by hand shows in the inventory within a minute (the probes' per-packet MTU at
/// once).
const INVENTORY_MAX_AGE: Duration = Duration::from_secs(60);

/// Probes attached, of those tried.
pub fn probes_attached(pipeline: &Pipeline) -> (usize, usize) {
    let status = &pipeline.probes.status;
    (status.iter().filter(|s| s.attached()).count(), status.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_trace_flags() {
        let cli = Cli::try_parse_from([
            "stormwatch",
            "trace",
            "--duration",
            "5",
            "--cgroup",
            "/a",
            "--cgroup",
            "b",
            "--json",
        ])
        .unwrap();
        let Command::Trace(t) = cli.command else {
            panic!("not trace")
        };
        assert_eq!(t.duration, Some(5.0));
        assert_eq!(t.interval, 1.0);
        assert_eq!(t.cgroup, ["/a", "b"]);
        assert!(t.json);
        assert!(Cli::try_parse_from(["stormwatch", "trace", "--duration", "0"]).is_err());
        assert!(Cli::try_parse_from(["stormwatch", "trace", "--bogus"]).is_err());
    }
}
