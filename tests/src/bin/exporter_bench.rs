//! `exporter_bench [--cgroups N] [--seconds S] [--interval SECS] [--scrape-every SECS]
//! [--warmup SECS] [--config FILE] [--sleep-ms MS] [--futex-sleepers] [--patience SECS]
//! [--memory-cgroup] [--maps]`: the cost of `stormwatch run` with many live cgroups (issue 5's, issue 12's and
//! issue 33's benchmark; not a test).
//!
//! Creates N cgroups, each with a `sleeper` (one thread waking every MS ms, 100 by default:
//! every cgroup is active at every collection; with `--futex-sleepers` in FUTEX_WAIT, so that
//! every cgroup makes futex calls), starts `stormwatch run` on loopback, waits
//! (PATIENCE s at most, 120 by default) until it tracks them all, then:
//! 1. measures the daemon's CPU time and RSS for S seconds without scrapes (the collection
//!    loop alone);
//! 2. scrapes /metrics every SECS (15 by default, Prometheus' usual interval) for S seconds
//!    with the headers Prometheus sends (OpenMetrics preferred, gzip accepted), and reports
//!    the latency of whole responses and the CPU and RSS with scrapes;
//! 3. then (outside the measured phases) fetches both formats uncompressed, for their sizes
//!    and the series per cgroup.
//!
//! With `--memory-cgroup` (cgroup v2 with the memory controller only) the daemon runs alone in
//! a memory cgroup of its own, as in its pod, and the result has what the kernel charged to it
//! (`memory.current` at the end, `memory.peak`, and `memory.stat`'s `percpu`, `kernel`, `anon`
//! and `file`). The values of preallocated per-CPU maps are not in `percpu`, nor anywhere in the
//! cgroup: the kernel allocates them before it records the map's cgroup (deploy/README.md); the
//! node's `Percpu` (/proc/meminfo), read before and after the daemon starts, shows them, and
//! `percpu` holds only what maps allocate later. With `--maps`, one `map …` line per
//! BPF map the daemon holds (type, `max_entries`, the kernel's `memlock`; see
//! `stormwatch_tests::bpf_maps`), and the per-CPU maps' sum in the result.
//!
//! The last line of output is `result key=value ...` for `cargo xtask bench` (and `cargo xtask
//! big-node`, which runs this in a guest with many CPUs).
//!
//! Needs root (cgroups, BPF). Build with `cargo build --release -p stormwatch -p
//! stormwatch-tests`; run `target/release/exporter_bench --cgroups 1000`.

use std::{
    net::{SocketAddr, TcpListener},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use stormwatch_tests::{
    TestCgroup, agent_bin, bpf_maps, cgroupfs, cpu_seconds,
    daemon::{http_get, http_get_bytes},
    join_before_exec, process_status, run_in_cgroup, v2_root,
};

struct Args {
    cgroups: usize,
    seconds: f64,
    interval: f64,
    scrape_every: f64,
    warmup: f64,
    config: Option<String>,
    sleep_ms: u64,
    patience: f64,
    memory_cgroup: bool,
    maps: bool,
    futex_sleepers: bool,
}

fn parse_args() -> Args {
    let mut a = Args {
        cgroups: 500,
        seconds: 30.0,
        interval: 5.0,
        scrape_every: 15.0,
        warmup: 10.0,
        config: None,
        sleep_ms: 100,
        patience: 120.0,
        memory_cgroup: false,
        maps: false,
        futex_sleepers: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--memory-cgroup" => {
                a.memory_cgroup = true;
                continue;
            }
            "--maps" => {
                a.maps = true;
                continue;
            }
            "--futex-sleepers" => {
                a.futex_sleepers = true;
                continue;
            }
            _ => {}
        }
        let value = it
            .next()
            .unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--cgroups" => a.cgroups = num(&flag, &value),
            "--seconds" => a.seconds = num(&flag, &value),
            "--interval" => a.interval = num(&flag, &value),
            "--scrape-every" => a.scrape_every = num(&flag, &value),
            "--warmup" => a.warmup = num(&flag, &value),
            "--config" => a.config = Some(value),
            "--sleep-ms" => a.sleep_ms = num(&flag, &value),
            "--patience" => a.patience = num(&flag, &value),
            _ => usage(&format!("unknown flag {flag}")),
        }
    }
    a
}

fn num<T: std::str::FromStr>(flag: &str, value: &str) -> T {
    value
        .parse()
        .unwrap_or_else(|_| usage(&format!("bad value for {flag}: {value}")))
}

fn usage(why: &str) -> ! {
    eprintln!(
        "exporter_bench: {why}\nusage: exporter_bench [--cgroups N] [--seconds S] \
         [--interval SECS] [--scrape-every SECS] [--warmup SECS] [--config FILE] \
         [--sleep-ms MS] [--futex-sleepers] [--patience SECS] [--memory-cgroup] [--maps]"
    );
    std::process::exit(2)
}

/// Resident set size and its peak (VmRSS, VmHWM) of a process in MiB; 0 once it is gone.
fn rss_mib(pid: u32) -> (f64, f64) {
    let status = process_status(pid);
    let mib = |kib: Option<u64>| kib.map_or(0.0, |kib| kib as f64 / 1024.0);
    (
        mib(status.as_ref().and_then(|s| s.vmrss)),
        mib(status.as_ref().and_then(|s| s.vmhwm)),
    )
}

/// What Prometheus 2.x/3.x sends.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0;q=0.5,\
    application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";

/// GET over a fresh connection; returns (status, body as sent: compressed when gzip).
fn get_body(
    addr: SocketAddr,
    path: &str,
    accept: &str,
    encoding: &str,
) -> std::io::Result<(u16, Vec<u8>)> {
    let headers = [("Accept", accept), ("Accept-Encoding", encoding)];
    http_get_bytes(addr, path, &headers).map(|r| (r.status, r.body))
}

/// GET; returns (status, body length).
fn get(addr: SocketAddr, path: &str, accept: &str) -> std::io::Result<(u16, usize)> {
    get_body(addr, path, accept, "identity").map(|(status, body)| (status, body.len()))
}

/// The value of an unlabelled sample in a classic exposition.
fn sample(addr: SocketAddr, name: &str) -> Option<f64> {
    let text = http_get(addr, "/metrics", None).ok()?.body;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// A cgroup of its own for the daemon, with the memory controller: enabled at the v2 root
/// first (the root's own processes are exempt from the rule that a cgroup with children has
/// none). Panics where v2 has no memory controller (hybrid hosts keep it on v1).
fn daemon_memory_cgroup() -> TestCgroup {
    let root = v2_root();
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    assert!(
        controllers.split_whitespace().any(|c| c == "memory"),
        "--memory-cgroup: no memory controller in {}/cgroup.controllers ({controllers:?}): it is \
         on cgroup v1 here",
        root.display()
    );
    std::fs::write(root.join("cgroup.subtree_control"), "+memory")
        .expect("enabling the memory controller at the v2 root");
    let cg = TestCgroup::new("daemon");
    assert!(
        cg.path().join("memory.current").is_file(),
        "no memory.current in {}",
        cg.path().display()
    );
    cg
}

/// A `/proc/meminfo` field, KiB.
fn meminfo_kib(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(key)?
            .strip_prefix(':')?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()
    })
}

/// What the kernel charged to a v2 memory cgroup, in MiB.
struct CgroupMemory {
    current_mib: f64,
    peak_mib: f64,
    percpu_mib: f64,
    kernel_mib: f64,
    anon_mib: f64,
    file_mib: f64,
}

impl CgroupMemory {
    fn of(dir: &std::path::Path) -> Self {
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
        let mib = |bytes: Option<u64>| bytes.map_or(f64::NAN, |b| b as f64 / 1048576.0);
        let stat = read("memory.stat");
        let field = |k: &str| cgroupfs::memory_stat_field(&stat, k);
        let percpu = field("percpu");
        CgroupMemory {
            current_mib: mib(read("memory.current").trim().parse().ok()),
            // memory.peak: Linux 5.19 and later.
            peak_mib: mib(read("memory.peak").trim().parse().ok()),
            percpu_mib: mib(percpu),
            // `kernel` (5.18 and later) includes `percpu`: the rest of it.
            kernel_mib: mib(field("kernel").map(|k| k.saturating_sub(percpu.unwrap_or(0)))),
            anon_mib: mib(field("anon")),
            file_mib: mib(field("file")),
        }
    }
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

fn main() {
    let args = parse_args();
    let sleeper = std::env::current_exe()
        .expect("current_exe")
        .with_file_name("sleeper");
    assert!(
        sleeper.is_file(),
        "{} is missing: build stormwatch-tests",
        sleeper.display()
    );
    let lifetime = format!("{}", 2.0 * args.seconds + 120.0);
    eprintln!("starting {} cgroups with a sleeper each", args.cgroups);
    let mut cgroups = Vec::with_capacity(args.cgroups);
    let mut sleepers = Vec::with_capacity(args.cgroups);
    for _ in 0..args.cgroups {
        let cg = TestCgroup::new("bench");
        let mut cmd = Command::new(&sleeper);
        cmd.args([
            "--threads",
            "1",
            "--seconds",
            &lifetime,
            "--sleep-ms",
            &args.sleep_ms.to_string(),
        ]);
        if args.futex_sleepers {
            cmd.args(["--futex", "1"]);
        }
        sleepers.push(run_in_cgroup(&mut cmd, &cg));
        cgroups.push(cg);
    }

    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // Declared before the daemon: dropped (removed) after it is stopped.
    let memcg = args.memory_cgroup.then(daemon_memory_cgroup);
    // The node's per-CPU memory before the daemon, the cgroups made: what the daemon adds to it
    // is its maps' per-CPU values, charged to no cgroup when allocated with the map.
    let percpu_before = meminfo_kib("Percpu");
    let mut cmd = Command::new(agent_bin());
    if let Some(cg) = &memcg {
        join_before_exec(&mut cmd, &cg.path().join("cgroup.procs"));
    }
    cmd.args(["run", "--listen", &addr.to_string()])
        .args(["--interval", &args.interval.to_string()]);
    if let Some(config) = &args.config {
        cmd.args(["--config", config]);
    }
    let child = cmd
        .stdin(Stdio::null())
        .spawn()
        .expect("starting stormwatch run");
    let pid = child.id();
    let _daemon = Daemon(child);
    let started = Instant::now();
    let patience = Duration::from_secs_f64(args.patience);
    while !get(addr, "/readyz", "*/*").is_ok_and(|r| r.0 == 200) {
        assert!(started.elapsed() < patience, "not ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    let percpu_ready = meminfo_kib("Percpu");
    eprintln!(
        "ready after {:.2?}; waiting until every cgroup is tracked",
        started.elapsed()
    );
    while sample(addr, "stormwatch_cgroups_tracked").unwrap_or(0.0) < args.cgroups as f64 {
        assert!(started.elapsed() < patience, "cgroups not tracked");
        std::thread::sleep(Duration::from_millis(500));
    }
    let tracked = sample(addr, "stormwatch_cgroups_tracked").unwrap_or(0.0);
    // Past the first reads of every cgroup's limits, which come all at once.
    std::thread::sleep(Duration::from_secs_f64(args.warmup));
    let collections = || {
        (
            sample(addr, "stormwatch_collection_duration_seconds_count").unwrap_or(0.0),
            sample(addr, "stormwatch_collection_duration_seconds_sum").unwrap_or(0.0),
        )
    };
    let c0 = collections();

    // 1. The collection loop alone.
    let (cpu0, t0) = (cpu_seconds(pid), Instant::now());
    std::thread::sleep(Duration::from_secs_f64(args.seconds));
    let idle_cpu = (cpu_seconds(pid) - cpu0) / t0.elapsed().as_secs_f64();
    let (idle_rss, _) = rss_mib(pid);
    let c1 = collections();

    // 2. With scrapes, as Prometheus makes them.
    let period = Duration::from_secs_f64(args.scrape_every);
    let mut latencies = Vec::new();
    let mut scraped_bytes = 0;
    let (cpu1, t1) = (cpu_seconds(pid), Instant::now());
    let mut next = Instant::now();
    while t1.elapsed().as_secs_f64() < args.seconds {
        let s = Instant::now();
        let (status, len) = get_body(addr, "/metrics", PROMETHEUS_ACCEPT, "gzip")
            .map(|(status, body)| (status, body.len()))
            .expect("scrape");
        latencies.push(s.elapsed().as_secs_f64());
        assert_eq!(status, 200);
        scraped_bytes = len;
        next += period;
        match next.checked_duration_since(Instant::now()) {
            Some(wait) if t1.elapsed() + wait < Duration::from_secs_f64(args.seconds) => {
                std::thread::sleep(wait)
            }
            _ => {
                // Wait out the phase: its CPU is divided by its whole length.
                let rest = Duration::from_secs_f64(args.seconds).saturating_sub(t1.elapsed());
                std::thread::sleep(rest);
            }
        }
    }
    let scrape_cpu = (cpu_seconds(pid) - cpu1) / t1.elapsed().as_secs_f64();
    let (rss, hwm) = rss_mib(pid);
    let c2 = collections();
    let memory = memcg.as_ref().map(|cg| CgroupMemory::of(cg.path()));
    let percpu_end = meminfo_kib("Percpu");
    let maps = if args.maps {
        bpf_maps::of_process(pid).expect("the daemon's fdinfo")
    } else {
        Vec::new()
    };
    let render = sample(addr, "stormwatch_render_duration_seconds").unwrap_or(0.0);

    // 3. Sizes, outside the measured phases.
    let (_, classic) =
        get_body(addr, "/metrics", "text/plain;version=0.0.4", "identity").expect("classic");
    let (_, om) = get_body(
        addr,
        "/metrics",
        "application/openmetrics-text;version=1.0.0",
        "identity",
    )
    .expect("OpenMetrics");
    // Series of the benchmark's cgroups (their paths hold the TestCgroup prefix).
    let classic = String::from_utf8_lossy(&classic);
    let bench_series = classic
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains("cgroup=\"") && l.contains("bench"))
        .count();

    latencies.sort_by(f64::total_cmp);
    let ms = |v: f64| v * 1e3;
    let mib = |b: usize| b as f64 / 1048576.0;
    println!(
        "cgroups {} (tracked {tracked}), interval {} s, {} s per phase after {} s of warm-up",
        args.cgroups, args.interval, args.seconds, args.warmup
    );
    let mean = |a: (f64, f64), b: (f64, f64)| ms((b.1 - a.1) / (b.0 - a.0).max(1.0));
    let collection_ms = mean(c0, c1);
    println!(
        "collection: mean {collection_ms:.1} ms ({} collections) without scrapes, {:.1} ms ({}) \
         with; rendering (OpenMetrics) {:.1} ms",
        c1.0 - c0.0,
        mean(c1, c2),
        c2.0 - c1.0,
        ms(render)
    );
    let per_cgroup = bench_series as f64 / args.cgroups as f64;
    println!(
        "exposition: classic {:.2} MiB, OpenMetrics {:.2} MiB, as scraped (OpenMetrics, gzip) \
         {:.2} MiB; {per_cgroup:.1} series per cgroup",
        mib(classic.len()),
        mib(om.len()),
        mib(scraped_bytes),
    );
    println!(
        "/metrics latency over {} scrapes every {} s: p50 {:.2} ms, max {:.2} ms",
        latencies.len(),
        args.scrape_every,
        ms(percentile(&latencies, 0.5)),
        ms(latencies.last().copied().unwrap_or(f64::NAN)),
    );
    println!(
        "daemon CPU: {:.2}% of a CPU without scrapes, {:.2}% with; RSS {idle_rss:.1} MiB \
         without scrapes, {rss:.1} MiB with (peak {hwm:.1} MiB)",
        100.0 * idle_cpu,
        100.0 * scrape_cpu
    );
    let mut extra = String::new();
    if let Some(m) = &memory {
        println!(
            "daemon's memory cgroup: {:.1} MiB now, {:.1} MiB at peak; of which per-CPU {:.1} \
             MiB, other kernel {:.1} MiB, anonymous {:.1} MiB, file {:.1} MiB",
            m.current_mib, m.peak_mib, m.percpu_mib, m.kernel_mib, m.anon_mib, m.file_mib
        );
        extra += &format!(
            " memcg_current_mib={:.1} memcg_peak_mib={:.1} memcg_percpu_mib={:.1} \
             memcg_kernel_mib={:.1} memcg_anon_mib={:.1} memcg_file_mib={:.1}",
            m.current_mib, m.peak_mib, m.percpu_mib, m.kernel_mib, m.anon_mib, m.file_mib
        );
    }
    let grown = |after: Option<u64>| {
        after
            .zip(percpu_before)
            .map_or(f64::NAN, |(a, b)| (a as f64 - b as f64) / 1024.0)
    };
    println!(
        "the node's per-CPU memory (/proc/meminfo Percpu) grew by {:.1} MiB from before the daemon \
         to its readiness, {:.1} MiB to the end",
        grown(percpu_ready),
        grown(percpu_end)
    );
    extra += &format!(
        " node_percpu_ready_mib={:.1} node_percpu_end_mib={:.1}",
        grown(percpu_ready),
        grown(percpu_end)
    );
    if args.maps {
        for m in &maps {
            println!("{m}");
        }
        let sum = |per_cpu: bool| {
            maps.iter()
                .filter(|m| m.per_cpu() == per_cpu)
                .map(|m| m.memlock)
                .sum::<u64>() as f64
                / 1048576.0
        };
        extra += &format!(
            " maps={} percpu_maps_mib={:.1} other_maps_mib={:.1}",
            maps.len(),
            sum(true),
            sum(false)
        );
    }
    println!(
        "result cgroups={} tracked={tracked} cpus={} cpu_idle_pct={:.3} cpu_scraped_pct={:.3} \
         rss_mib={rss:.1} peak_mib={hwm:.1} collection_ms={collection_ms:.2} \
         openmetrics_mib={:.3} classic_mib={:.3} gzip_mib={:.3} series_per_cgroup={per_cgroup:.1} \
         scrape_p50_ms={:.2}{extra}",
        args.cgroups,
        bpf_maps::possible_cpus().map_or_else(|| "?".to_owned(), |n| n.to_string()),
        100.0 * idle_cpu,
        100.0 * scrape_cpu,
        mib(om.len()),
        mib(classic.len()),
        mib(scraped_bytes),
        ms(percentile(&latencies, 0.5)),
    );
    drop(_daemon);
    for s in &mut sleepers {
        let _ = s.kill();
    }
    for mut s in sleepers {
        let _ = s.wait();
    }
    drop(cgroups);
}
