//! The host context of `trace --json` and `diagnose --json` on this machine, each part against
//! a source that does not share the agent's code: the hypervisor against systemd's detection
//! (and the kernel's boot message when the log still has it), the CPUs against glibc, the
//! kernel against `uname`, the NUMA nodes against sysfs's node directories, and steal against
//! `/proc/stat` read by the test around the run, in the unit `getconf CLK_TCK` gives.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use stormwatch_tests::{
    Agent,
    daemon::{Daemon, sample, wait_for},
    report::{self, Diagnosis, Host, Trace},
    require_bpf,
};

/// The output of a command the project's setup installs; panics with how to install it.
fn command_output(program: &str, args: &[&str], package: &str) -> (bool, String) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run `{program}` ({e}); install it with `apt-get install -y {package}` \
                 (`cargo xtask setup` does)"
            )
        });
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
    )
}

/// The hypervisor by systemd's `systemd-detect-virt --vm`, in the agent's names: systemd says
/// `microsoft` and `oracle` for what the agent calls `hyperv` and `virtualbox`, and names the
/// KVM-based clouds (`amazon`, `google`) by their vendor; `none` is bare metal (null).
fn systemd_hypervisor() -> Option<String> {
    let (_, name) = command_output("systemd-detect-virt", &["--vm"], "systemd");
    match name.as_str() {
        "" => panic!("systemd-detect-virt --vm printed nothing"),
        "none" => None,
        "microsoft" => Some("hyperv".into()),
        "oracle" => Some("virtualbox".into()),
        "amazon" | "google" => Some("kvm".into()),
        "vm-other" => Some("unknown".into()),
        other => Some(other.to_owned()),
    }
}

/// What the kernel said at boot (`Hypervisor detected: KVM`, x86), in the agent's names, when
/// the kernel log still holds the line and names a hypervisor the agent names the same way.
fn kernel_hypervisor() -> Option<String> {
    let out = Command::new("dmesg").output().ok()?;
    let log = String::from_utf8_lossy(&out.stdout);
    let name = log
        .lines()
        .find_map(|l| l.split_once("Hypervisor detected: ").map(|(_, n)| n.trim()))?;
    Some(
        match name {
            "KVM" => "kvm",
            "Microsoft Hyper-V" => "hyperv",
            "VMware" => "vmware",
            n if n.starts_with("Xen") => "xen",
            "ACRN" => "acrn",
            _ => return None,
        }
        .to_owned(),
    )
}

/// The test's own reading of the host's steal counter, in clock ticks.
fn steal_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").expect("reading /proc/stat");
    let line = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .expect("a cpu line in /proc/stat");
    // user nice system idle iowait irq softirq steal …
    line.split_whitespace()
        .nth(8)
        .expect("a steal column")
        .parse()
        .expect("a number")
}

fn clock_ticks_per_second() -> f64 {
    let (ok, hz) = command_output("getconf", &["CLK_TCK"], "libc-bin");
    assert!(ok, "getconf CLK_TCK failed");
    hz.parse().expect("CLK_TCK is a number")
}

/// Runs `stormwatch <command> --json --duration <d>` and brackets its steal window with the
/// test's own readings: `lower` is steal between two instants surely inside the agent's window
/// (after it said it was attached — its window had begun — and half the duration later, well
/// before it can end), `upper` is steal from before the agent started to after it exited.
fn run_bracketed(command: &str, duration: Duration) -> (Host, f64, f64) {
    require_bpf();
    let before = steal_ticks();
    let d = format!("{}", duration.as_secs_f64());
    let agent = Agent::start(&[command, "--json", "--duration", &d]);
    let inside_from = steal_ticks();
    let attached_at = Instant::now();
    std::thread::sleep(duration / 2);
    let inside_to = steal_ticks();
    // The agent's window ends `duration` after it began, and it began before it said so.
    assert!(
        attached_at.elapsed() < duration,
        "the test was too slow to take its inner reading inside the agent's window"
    );
    let out = agent.finish_output();
    let after = steal_ticks();
    assert!(
        out.status.code() == Some(0) || (command == "diagnose" && out.status.code() == Some(3)),
        "stormwatch {command} failed ({}): {}",
        out.status,
        out.stderr.join("\n")
    );
    let what = format!("{command} --json");
    let host = match command {
        "trace" => report::parse::<Trace>(&what, &out.stdout_text()).host,
        "diagnose" => report::parse::<Diagnosis>(&what, &out.stdout_text()).host,
        _ => panic!("no document of `stormwatch {command}`"),
    };
    let hz = clock_ticks_per_second();
    let lower = inside_to.saturating_sub(inside_from) as f64 / hz;
    let upper = after.saturating_sub(before) as f64 / hz;
    eprintln!(
        "{command}: steal inside the window >= {lower:.2} s, around the run <= {upper:.2} s; \
         the agent says {:?}",
        host.steal_seconds
    );
    (host, lower, upper)
}

/// The static parts of `"host"` against their independent sources.
fn check_static(host: &Host) {
    let want = systemd_hypervisor();
    assert_eq!(
        host.hypervisor, want,
        "hypervisor: the agent says {:?}, systemd-detect-virt --vm says {want:?}",
        host.hypervisor
    );
    if let Some(kernel_says) = kernel_hypervisor() {
        assert_eq!(host.hypervisor.as_deref(), Some(kernel_says.as_str()));
    }

    let (ok, online) = command_output("getconf", &["_NPROCESSORS_ONLN"], "libc-bin");
    assert!(ok);
    assert_eq!(host.cpus, online.parse::<u64>().unwrap(), "{host:?}");

    let (ok, release) = command_output("uname", &["-r"], "coreutils");
    assert!(ok);
    assert_eq!(host.kernel, release);

    // One directory per node the kernel registered (what the agent reads is the `online` list).
    let nodes = std::fs::read_dir("/sys/devices/system/node")
        .expect("reading /sys/devices/system/node")
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("node"))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .count();
    assert_eq!(host.numa_nodes, Some(nodes as u64), "{host:?}");
}

/// Steal within the bracket, to one clock tick (the agent's readings are ticks too).
fn check_steal(host: &Host, lower: f64, upper: f64) {
    let tick = 1.0 / clock_ticks_per_second();
    let steal = host
        .steal_seconds
        .unwrap_or_else(|| panic!("no steal_seconds: {host:?}"));
    assert!(
        steal >= lower - tick && steal <= upper + tick,
        "steal_seconds {steal} outside [{lower}, {upper}] measured from /proc/stat"
    );
}

#[test]
fn trace_json_names_this_hosts_hypervisor_cpus_kernel_and_steal() {
    let (host, lower, upper) = run_bracketed("trace", Duration::from_secs(6));
    check_static(&host);
    check_steal(&host, lower, upper);
}

#[test]
fn diagnose_json_has_the_same_host() {
    let (host, lower, upper) = run_bracketed("diagnose", Duration::from_secs(6));
    check_static(&host);
    check_steal(&host, lower, upper);
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
fn metrics_carry_the_host_and_its_steal_counter() {
    require_bpf();
    let daemon = Daemon::start(&[]);
    // The test reads the steal counter, then waits for a collection made after that reading
    // (`stormwatch_last_collection_timestamp_seconds` is set just after the daemon reads
    // /proc/stat), then reads it again after the scrape: the daemon's value lies between.
    let before = (steal_ticks(), unix_now());
    let (text, after) = wait_for(
        "a collection after the test's /proc/stat reading",
        Duration::from_secs(60),
        || {
            let text = daemon.metrics();
            let collected_at = sample(&text, "stormwatch_last_collection_timestamp_seconds")?;
            (collected_at > before.1).then(|| (text, steal_ticks()))
        },
    );
    let hz = clock_ticks_per_second();
    let (low, high) = (before.0 as f64 / hz, after as f64 / hz);
    let steal = sample(&text, "stormwatch_host_steal_seconds_total ")
        .unwrap_or_else(|| panic!("no stormwatch_host_steal_seconds_total in:\n{text}"));
    assert!(
        steal >= low - 1.0 / hz && steal <= high + 1.0 / hz,
        "steal counter {steal} s outside [{low}, {high}] s from /proc/stat around the collection"
    );

    let hypervisor = systemd_hypervisor().unwrap_or_else(|| "none".to_owned());
    let info = format!("stormwatch_host_info{{hypervisor=\"{hypervisor}\",kernel=\"");
    assert_eq!(sample(&text, &info), Some(1.0), "want {info}… in:\n{text}");
    let (_, online) = command_output("getconf", &["_NPROCESSORS_ONLN"], "libc-bin");
    assert_eq!(
        sample(&text, "stormwatch_host_cpus "),
        Some(online.parse().unwrap())
    );
}
