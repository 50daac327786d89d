//! The command line: one module per subcommand; `main.rs` only parses and dispatches.

pub mod check;
pub mod diagnose;
pub mod run;
pub mod trace;

use clap::{Args, Parser, Subcommand};

use crate::{config::positive_seconds, pipeline::Pipeline, probes::Family};

/// Node diagnostics from eBPF: per-container scheduler figures, lock waits and what they mean.
#[derive(Debug, Parser)]
#[command(name = "stormwatch", version, about, long_about = None)]
pub struct Cli {
    /// Log level for messages on stderr (off, error, warn, info, debug, trace).
    #[arg(
        long,
        global = true,
        env = "STORMWATCH_LOG",
        default_value = "warn",
        value_parser = clap::builder::TypedValueParser::try_map(
            clap::builder::PossibleValuesParser::new(LOG_LEVELS),
            |s: String| log_level(&s),
        ),
    )]
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
    /// Watch the host, then report problems with evidence and what to do. Rules: lock_storm,
    /// cpu_throttling, runqueue_saturation, thread_oversubscription, runtime_sizing,
    /// mtu_mismatch. Exit status: 0 no problems, 3 problems found, 1 error, 2 bad usage,
    /// 130 interrupted.
    Diagnose(DiagnoseArgs),
    /// Run as a daemon: keep the probes attached and serve Prometheus metrics on /metrics
    /// (with /healthz and /readyz). Configuration: flags > environment (STORMWATCH_LISTEN,
    /// STORMWATCH_INTERVAL) > --config file > defaults.
    Run(RunArgs),
}

/// A usage error as one line, not clap's usage block: what is wrong, the valid values where
/// there is a list of them, and the environment variable when the value came from there.
pub fn usage_error(err: &clap::Error) -> String {
    use clap::{
        CommandFactory as _,
        error::{ContextKind, ContextValue, ErrorKind},
    };
    let subcommands = || {
        Cli::command()
            .get_subcommands()
            .map(|s| s.get_name().to_owned())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match err.kind() {
        ErrorKind::MissingSubcommand | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            return format!("a subcommand is missing: one of {}", subcommands());
        }
        ErrorKind::InvalidSubcommand => {
            let given = match err.get(ContextKind::InvalidSubcommand) {
                Some(ContextValue::String(s)) => s.as_str(),
                _ => "?",
            };
            return format!("unknown subcommand `{given}`: one of {}", subcommands());
        }
        _ => {}
    }
    let text = err.render().to_string();
    let first = text.lines().next().unwrap_or("invalid arguments");
    let mut line = first.strip_prefix("error: ").unwrap_or(first).to_owned();
    if let Some(ContextValue::Strings(valid)) = err.get(ContextKind::ValidValue)
        && !line.contains("possible values")
    {
        line.push_str(&format!("; valid values: {}", valid.join(", ")));
    }
    if let Some(ContextValue::String(arg)) = err.get(ContextKind::InvalidArg)
        && let Some(var) = env_of(arg)
        && std::env::var_os(&var).is_some()
        && !std::env::args().any(|a| arg.starts_with(a.split('=').next().unwrap_or(&a)))
    {
        line.push_str(&format!(" (from the environment variable {var})"));
    }
    line
}

/// The environment variable of a flag as clap names it in an error (`--log-level <LEVEL>`).
fn env_of(arg: &str) -> Option<String> {
    use clap::CommandFactory as _;
    let long = arg.split_whitespace().next()?.strip_prefix("--")?;
    let command = Cli::command();
    std::iter::once(&command)
        .chain(command.get_subcommands())
        .flat_map(|c| c.get_arguments())
        .find(|a| a.get_long() == Some(long))
        .and_then(|a| a.get_env())
        .and_then(|v| v.to_str())
        .map(str::to_owned)
}

/// A cgroup path for `--cgroup`: not empty (an empty one would trace the whole host, which is
/// what leaving the flag out does).
fn cgroup_path(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err(
            "an empty path: name a cgroup, or leave --cgroup out to trace every cgroup \
                    of the host"
                .to_owned(),
        );
    }
    Ok(s.to_owned())
}

/// `--log-level`: one of the levels, named in the error when it is not.
fn log_level(s: &str) -> Result<log::LevelFilter, String> {
    s.parse().map_err(|_| format!("`{s}` is not a log level"))
}

/// `trace --interval`: seconds, at least a tenth of one (each interval reads every probe map).
fn trace_interval(s: &str) -> Result<f64, String> {
    let v = positive_seconds(s)?;
    if v < 0.1 {
        return Err(format!("must be at least 0.1 (got `{s}`)"));
    }
    Ok(v)
}

/// The log levels `--log-level` takes.
const LOG_LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Address to serve on, IP:PORT [default: 0.0.0.0:9847].
    #[arg(long, value_name = "ADDR", value_parser = crate::config::parse_listen)]
    pub listen: Option<std::net::SocketAddr>,

    /// Configuration file (TOML; agent/CLI.md and deploy/daemonset.yaml's ConfigMap say what
    /// each key does): listen, interval_seconds, max_cgroups, removed_grace_seconds,
    /// diagnosis_window_seconds, bpf_stats, histograms, wake_kinds, futex_probes, call_sites,
    /// jvm_thread_dumps, jvm_virtual_threads, postgres_lock_waits, net_packet_probes,
    /// net_packet_survey_seconds,
    /// runqueue_blame,
    /// web_config_file, http_header_timeout_seconds, http_request_timeout_seconds,
    /// http_idle_timeout_seconds, http_max_connections, btf_file, `[thresholds]`. Unknown keys
    /// are refused.
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,

    /// Collection interval in seconds, at least 1 [default: 5].
    #[arg(
        long,
        value_name = "SECS",
        value_parser = crate::config::run_interval,
        allow_negative_numbers = true
    )]
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
    #[arg(
        long,
        value_name = "SECS",
        default_value = "10",
        value_parser = positive_seconds,
        allow_negative_numbers = true
    )]
    pub duration: f64,

    /// Print one JSON document instead of the report.
    #[arg(long)]
    pub json: bool,

    /// The running kernel's BTF from FILE instead of /sys/kernel/btf/vmlinux.
    #[arg(long, value_name = "FILE")]
    pub btf: Option<std::path::PathBuf>,

    /// Do not sample hand-offs' user stacks (a lock storm's code is then not named).
    #[arg(long, conflicts_with = "pprof")]
    pub no_call_sites: bool,

    /// Do not ask JVMs for thread dumps (HotSpot's attach mechanism, as `jstack`): a JVM's
    /// pool waiting for work is then told from a lock's queue by the kernel's figures alone.
    #[arg(long)]
    pub no_jvm_thread_dumps: bool,

    /// Also dump JVMs' virtual threads to judge their lock storms (a JSON thread dump, `jcmd
    /// Thread.dump_to_file`, beside their scheduler's counter, which alone says at most a
    /// possible storm). Off unless asked: the JSON dump crashed a Temurin 25.0.3 JVM under
    /// load.
    #[arg(long, conflicts_with = "no_jvm_thread_dumps")]
    pub jvm_virtual_threads: bool,

    /// Do not attach uprobes to PostgreSQL's lock-wait sites: its row-lock storms then go
    /// unjudged.
    #[arg(long)]
    pub no_postgres_lock_waits: bool,

    /// Also write each container's lock profile over the window into DIR, in pprof's format
    /// (`<container>.lock.pb.gz`: the sampled hand-offs' waiter and waker stacks, for `go
    /// tool pprof`, Pyroscope or Parca).
    #[arg(long, value_name = "DIR")]
    pub pprof: Option<std::path::PathBuf>,
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
    #[arg(long, value_name = "SECS", value_parser = positive_seconds, allow_negative_numbers = true)]
    pub duration: Option<f64>,

    /// Refresh interval of the table (and collection interval), in seconds.
    #[arg(
        long,
        value_name = "SECS",
        default_value = "1",
        value_parser = trace_interval,
        allow_negative_numbers = true
    )]
    pub interval: f64,

    /// Only this cgroup and its descendants: a path relative to the cgroup v2 root, or an
    /// absolute path inside it. May be given more than once.
    #[arg(long, value_name = "PATH", value_parser = cgroup_path)]
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
    #[arg(long, conflicts_with = "pprof")]
    pub no_call_sites: bool,

    /// Do not ask JVMs for thread dumps (HotSpot's attach mechanism, as `jstack`): a JVM's
    /// pool waiting for work is then told from a lock's queue by the kernel's figures alone.
    #[arg(long)]
    pub no_jvm_thread_dumps: bool,

    /// Also dump JVMs' virtual threads to judge their lock storms (a JSON thread dump, `jcmd
    /// Thread.dump_to_file`, beside their scheduler's counter, which alone says at most a
    /// possible storm). Off unless asked: the JSON dump crashed a Temurin 25.0.3 JVM under
    /// load.
    #[arg(long, conflicts_with = "no_jvm_thread_dumps")]
    pub jvm_virtual_threads: bool,

    /// Do not attach uprobes to PostgreSQL's lock-wait sites: its row-lock storms then go
    /// unjudged.
    #[arg(long)]
    pub no_postgres_lock_waits: bool,

    /// Also write each container's lock profile over the whole trace into DIR at its end, in
    /// pprof's format (`<container>.lock.pb.gz`: the sampled hand-offs' waiter and waker
    /// stacks, for `go tool pprof`, Pyroscope or Parca).
    #[arg(long, value_name = "DIR")]
    pub pprof: Option<std::path::PathBuf>,

    /// Time the run-queue wait and the blocked time from the wake-up programs even where the
    /// kernel keeps `sched_info` (for testing that way, which kernels without it take, and for
    /// measuring both).
    #[arg(long, hide = true)]
    pub waits_from_wakeups: bool,

    /// Do not blame run-queue waits on what held the CPU (`runqueue_blame` is then null): the
    /// switch program keeps no ring of each CPU's runs.
    #[arg(long)]
    pub no_runqueue_blame: bool,

    /// Probe families to attach (comma-separated). Figures of families left out are null.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "sched,futex,locks,net"
    )]
    pub probes: Vec<Family>,
}

/// Writes the lock profile of each container of `rows` with sampled stacks in `window` into
/// `dir` (`report::pprof`), and says on stderr what was written.
pub fn write_lock_profiles(
    dir: &std::path::Path,
    pipeline: &Pipeline,
    window: &crate::collect::Window,
    rows: &[crate::report::ContainerReport],
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    if !pipeline.names_handoff_sites() {
        eprintln!(
            "stormwatch: no lock profiles: hand-offs are not sampled here (the futex probes, \
             or their user stacks on this architecture, are missing)"
        );
        return Ok(());
    }
    let containers: Vec<(u64, String)> = rows
        .iter()
        .map(|r| (r.cgroup_id, trace::workload_name(r)))
        .collect();
    let written = crate::report::pprof::write_dir(
        dir,
        &containers,
        |id| window.handoff_sites.get(&id).map(|s| s.stacks.clone()),
        std::time::SystemTime::now(),
        window.duration,
    )
    .with_context(|| format!("writing lock profiles into {}", dir.display()))?;
    eprintln!(
        "stormwatch: wrote {} lock profile{} into {}",
        written.len(),
        if written.len() == 1 { "" } else { "s" },
        dir.display()
    );
    for (name, path) in &written {
        eprintln!("  {name}: {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    /// A document of the repository, read from the workspace root.
    fn doc(path: &str) -> String {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// Argument `id` of subcommand `sub`.
    fn arg_of(sub: &str, id: &str) -> clap::Arg {
        Cli::command()
            .find_subcommand(sub)
            .and_then(|s| s.get_arguments().find(|a| a.get_id() == id).cloned())
            .unwrap_or_else(|| panic!("{sub} has no argument {id}"))
    }

    /// The help of subcommand `sub`, or of its argument `arg`.
    fn help_of(sub: &str, arg: Option<&str>) -> String {
        match arg {
            None => Cli::command()
                .find_subcommand(sub)
                .and_then(|s| s.get_about())
                .expect("an about")
                .to_string(),
            Some(id) => arg_of(sub, id).get_help().expect("a help").to_string(),
        }
    }

    #[test]
    fn every_rule_is_in_diagnose_help_and_the_readme() {
        let help = help_of("diagnose", None);
        let readme = doc("README.md");
        for rule in crate::diagnose::RULES {
            let name = rule.kind.as_str();
            assert!(help.contains(name), "diagnose --help misses {name}: {help}");
            assert!(
                readme.contains(&format!("| `{name}` |")),
                "README.md's rule table misses {name}"
            );
        }
    }

    #[test]
    fn every_config_key_is_in_run_help_and_deploy_readme() {
        // Every key, the optional paths included.
        let config = crate::config::Config {
            web_config_file: Some("w".into()),
            btf_file: Some("b".into()),
            ..Default::default()
        };
        let keys = serde_json::to_value(config).unwrap();
        let keys: Vec<&String> = keys.as_object().unwrap().keys().collect();
        assert!(keys.len() > 15, "{keys:?}");
        let help = help_of("run", Some("config"));
        let deploy = doc("deploy/README.md");
        for key in keys {
            let key = if key == "thresholds" {
                "[thresholds]"
            } else {
                key
            };
            assert!(help.contains(key), "run --help's --config misses {key}");
            assert!(
                deploy.contains(&format!("`{key}`")),
                "deploy/README.md's configuration misses `{key}`"
            );
        }
    }

    #[test]
    fn cli_md_shows_traces_default_probes() {
        let probes = arg_of("trace", "probes")
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(",");
        assert!(
            doc("agent/CLI.md").contains(&format!("[--probes {probes}]")),
            "agent/CLI.md's trace synopsis should show --probes {probes}"
        );
    }

    fn usage_of(args: &[&str]) -> String {
        usage_error(&Cli::try_parse_from(args).expect_err("a usage error"))
    }

    #[test]
    fn usage_errors_are_one_clear_line() {
        let line = usage_of(&["stormwatch"]);
        assert_eq!(
            line,
            "a subcommand is missing: one of check, trace, diagnose, run"
        );
        let line = usage_of(&["stormwatch", "diagnose", "--duration", "-1"]);
        assert!(line.contains("must be greater than zero"), "{line}");
        let line = usage_of(&["stormwatch", "trace", "--cgroup", ""]);
        assert!(line.contains("an empty path"), "{line}");
        let line = usage_of(&["stormwatch", "trace", "--probes", "bogus"]);
        assert!(
            line.ends_with("valid values: sched, futex, locks, net"),
            "{line}"
        );
        let line = usage_of(&["stormwatch", "--log-level", "loud", "check"]);
        assert!(
            line.contains("off, error, warn, info, debug, trace"),
            "{line}"
        );
        let line = usage_of(&["stormwatch", "run", "--interval", "1e-9"]);
        assert!(line.contains("at least 1"), "{line}");
        let line = usage_of(&["stormwatch", "trace", "--interval", "0.01"]);
        assert!(line.contains("at least 0.1"), "{line}");
        for line in [
            usage_of(&["stormwatch", "--log-level", "loud", "check"]),
            usage_of(&["stormwatch", "bogus"]),
        ] {
            assert!(!line.contains('\n'), "{line}");
            // No Rust type names.
            for rust in ["LevelFilter", "f64", "AttachWhen", "PathBuf"] {
                assert!(!line.contains(rust), "{line}");
            }
        }
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
