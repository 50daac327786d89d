//! What the always-on agent costs ordinary workloads while nothing storms: `stormwatch run` as
//! deployed (default configuration) against no agent, in interleaved rounds, on
//!
//! - Redis over loopback: `redis-benchmark` SET and GET, 50 clients (requests/s);
//! - Redis SET across a veth pair, the server in a network namespace of its own as a pod's is
//!   (every request and reply crosses two interfaces the network probes count);
//! - one system call: `perf bench syscall basic` (getppid in a loop; ns per call);
//! - an HTTP server at a fixed request rate: a Go net/http server (tests/corpus/httpserver)
//!   loaded open-loop at `HTTP_RATE` requests/s over `HTTP_CONNECTIONS` keep-alive
//!   connections, each request's latency counted from when it was due (so a stall delays the
//!   requests behind it, as users see it), p50 and p99 — as coroot measures agents.
//!
//! The servers run in cgroups of their own, as containers do (the load generators in the
//! bench's). Each round runs every workload without the agent, then with it (the agent started
//! fresh for the round and stopped after it). Not a test: xtask/BENCHMARKS.md carries the table.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    bench_common::{Running, free_port, go_corpus_program, median, start_run},
    build_release, say,
};

const REDIS_REQUESTS: u32 = 400_000;
const HTTP_RATE: u32 = 2_000;
const HTTP_CONNECTIONS: u32 = 8;
const SYSCALL_LOOPS: u64 = 50_000_000;

/// A server in a cgroup of its own (under the cgroup v2 root), both gone on drop.
pub(crate) struct Server(Child, PathBuf);

impl Server {
    pub(crate) fn start(name: &str, cmd: &mut Command) -> Result<Self> {
        use std::os::unix::process::CommandExt as _;
        let unified = Path::new("/sys/fs/cgroup/unified");
        let root = if unified.join("cgroup.procs").exists() {
            unified
        } else {
            Path::new("/sys/fs/cgroup")
        };
        let dir = root.join(format!("sw-bench-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let procs = dir.join("cgroup.procs");
        // SAFETY: between fork and exec the child only writes its own pid's "0" to a file.
        unsafe {
            cmd.pre_exec(move || std::fs::write(&procs, "0"));
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {cmd:?}"))?;
        Ok(Self(child, dir))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        for _ in 0..100 {
            if std::fs::remove_dir(&self.1).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A network namespace joined to the host by a veth pair: the host end 10.231.7.1/30, the
/// namespace's 10.231.7.2/30 (a pod's interface). Gone on drop, its veth with it.
struct PodNetns(String);

impl PodNetns {
    const HOST: &str = "10.231.7.1";
    const POD: &str = "10.231.7.2";

    fn create() -> Result<Self> {
        let name = format!("sw-bench-{}", std::process::id());
        let ns = Self(name.clone());
        let host_if = format!("swbh{}", std::process::id() % 100_000);
        let steps: [&[&str]; 7] = [
            &["netns", "add", &name],
            &[
                "link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns", &name,
            ],
            &[
                "addr",
                "add",
                &format!("{}/30", Self::HOST),
                "dev",
                &host_if,
            ],
            &["link", "set", &host_if, "up"],
            &[
                "-n",
                &name,
                "addr",
                "add",
                &format!("{}/30", Self::POD),
                "dev",
                "eth0",
            ],
            &["-n", &name, "link", "set", "eth0", "up"],
            &["-n", &name, "link", "set", "lo", "up"],
        ];
        for args in steps {
            let status = Command::new("ip")
                .args(args)
                .status()
                .context("cannot run ip (apt-get install iproute2)")?;
            if !status.success() {
                bail!("ip {} failed: {status}", args.join(" "));
            }
        }
        Ok(ns)
    }
}

impl Drop for PodNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn wait_for_port(addr: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(addr).is_err() {
        if Instant::now() > deadline {
            bail!("nothing listens on {addr}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// `redis-benchmark -t <test>` against `host`: requests per second.
fn redis(host: &str, port: u16, test: &str) -> Result<f64> {
    let out = Command::new("redis-benchmark")
        .args([
            "-h",
            host,
            "-p",
            &port.to_string(),
            "-c",
            "50",
            "-t",
            test,
            "--csv",
        ])
        .args(["-n", &REDIS_REQUESTS.to_string()])
        .stderr(Stdio::null())
        .output()
        .context("cannot run redis-benchmark (apt-get install redis-tools)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "test","rps","avg_latency_ms",… then "SET","123456.79",…
    text.lines()
        .find(|l| l.starts_with(&format!("\"{}\"", test.to_uppercase())))
        .and_then(|l| l.split(',').nth(1))
        .and_then(|v| v.trim_matches('"').parse().ok())
        .with_context(|| format!("no {test} line in redis-benchmark's output: {text}"))
}

/// `perf bench syscall basic`: nanoseconds per getppid call.
fn syscall_ns() -> Result<f64> {
    let out = Command::new("perf")
        .args([
            "bench",
            "syscall",
            "basic",
            "-l",
            &SYSCALL_LOOPS.to_string(),
        ])
        .stderr(Stdio::null())
        .output()
        .context("cannot run perf bench (apt-get install linux-perf)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.trim().strip_suffix("usecs/op"))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|us| us * 1000.0)
        .with_context(|| format!("no usecs/op in perf bench's output: {text}"))
}

/// Latencies of requests sent open-loop at `rate`/s over `conns` connections for `seconds`;
/// returns (p50, p99) in microseconds and the rate achieved.
fn http_fixed_rate(addr: &str, rate: u32, conns: u32, seconds: u32) -> Result<(f64, f64, f64)> {
    let per_conn = Duration::from_secs_f64(f64::from(conns) / f64::from(rate));
    let requests = u64::from(rate / conns) * u64::from(seconds);
    let start = Instant::now() + Duration::from_millis(100);
    let handles: Vec<_> = (0..conns)
        .map(|c| {
            let addr = addr.to_owned();
            std::thread::spawn(move || -> Result<Vec<f64>> {
                let mut stream = TcpStream::connect(&addr)?;
                stream.set_nodelay(true)?;
                let mut reader = BufReader::new(stream.try_clone()?);
                // The connections' schedules are staggered evenly.
                let offset = per_conn.mul_f64(f64::from(c) / f64::from(conns));
                let mut lat = Vec::with_capacity(requests as usize);
                for i in 0..requests {
                    let due = start + offset + per_conn.mul_f64(i as f64);
                    let now = Instant::now();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                    stream.write_all(b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n")?;
                    let mut length = 0usize;
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line)? == 0 {
                            bail!("the server closed the connection");
                        }
                        let l = line.trim_end();
                        if l.is_empty() {
                            break;
                        }
                        if let Some(v) = l
                            .to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().to_owned())
                        {
                            length = v.parse()?;
                        }
                    }
                    let mut body = vec![0; length];
                    reader.read_exact(&mut body)?;
                    lat.push(due.elapsed().as_secs_f64() * 1e6);
                }
                Ok(lat)
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(
            h.join()
                .map_err(|_| anyhow::anyhow!("a load thread panicked"))??,
        );
    }
    let took = start.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    let pct = |p: f64| all[((all.len() - 1) as f64 * p).round() as usize];
    Ok((pct(0.50), pct(0.99), all.len() as f64 / took))
}

/// One round's figures of one configuration.
#[derive(Default)]
struct Figures {
    set: Vec<f64>,
    get: Vec<f64>,
    veth_set: Vec<f64>,
    syscall_ns: Vec<f64>,
    http_p50_us: Vec<f64>,
    http_p99_us: Vec<f64>,
    http_rate: Vec<f64>,
}

/// The ordinary-workloads table.
pub fn run(rounds: u32, seconds: u32) -> Result<String> {
    let bin = build_release()?;
    let server = go_corpus_program("httpserver")?;
    let redis_port = 6390u16;
    // Memory only: no snapshots, no append-only file.
    let redis_args = [
        "--port",
        &redis_port.to_string(),
        "--save",
        "",
        "--appendonly",
        "no",
    ];
    let redis_server = Server::start("redis", Command::new("redis-server").args(redis_args))?;
    wait_for_port(&format!("127.0.0.1:{redis_port}"))?;
    let pod = PodNetns::create()?;
    let _pod_redis = Server::start(
        "redis-pod",
        Command::new("ip")
            .args(["netns", "exec", &pod.0, "redis-server"])
            .args(redis_args)
            // Reached from the host's end of the veth, as a pod's server is from others.
            .args(["--bind", PodNetns::POD, "--protected-mode", "no"]),
    )?;
    wait_for_port(&format!("{}:{redis_port}", PodNetns::POD))?;
    let http_addr = "127.0.0.1:8089";
    let _http = Server::start("http", Command::new(&server).args(["-listen", http_addr]))?;
    wait_for_port(http_addr)?;
    let mut none = Figures::default();
    let mut agent = Figures::default();
    for round in 1..=rounds {
        for (with_agent, f) in [(false, &mut none), (true, &mut agent)] {
            say(&format!(
                "ordinary workloads: round {round}/{rounds}, {}",
                if with_agent { "stormwatch run" } else { "none" }
            ));
            let running = with_agent
                .then(|| stormwatch_run_after_survey(&bin))
                .transpose()?;
            f.set.push(redis("127.0.0.1", redis_port, "set")?);
            f.get.push(redis("127.0.0.1", redis_port, "get")?);
            f.veth_set.push(redis(PodNetns::POD, redis_port, "set")?);
            f.syscall_ns.push(syscall_ns()?);
            let (p50, p99, rate) =
                http_fixed_rate(http_addr, HTTP_RATE, HTTP_CONNECTIONS, seconds)?;
            f.http_p50_us.push(p50);
            f.http_p99_us.push(p99);
            f.http_rate.push(rate);
            if let Some((r, _)) = running {
                r.stop()?;
            }
        }
    }
    say("ordinary workloads: BPF time per Redis SET request");
    let accounting = redis_accounting(&bin, redis_port, &redis_server.1)?;
    Ok(table(&none, &agent, rounds, seconds) + &accounting)
}

/// What the daemon's programs cost a Redis SET request, free of this VM's throughput noise: the
/// kernel's BPF run-time statistics (turned on for this pass only: they cost every program two
/// clock reads a run, so the rounds above run without them) summed over the daemon's programs
/// during one redis-benchmark SET run, per request, against the CPU time the server's cgroup
/// used per request (`cpu.stat` `usage_usec`). Their ratio bounds the share of the server's work
/// the agent adds from above: all of the programs' time is counted, also what ran on the
/// clients' CPU. Not counted: the few nanoseconds of entering a program.
fn redis_accounting(bin: &Path, redis_port: u16, server_cgroup: &Path) -> Result<String> {
    const STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";
    let was = std::fs::read_to_string(STATS).context("reading kernel.bpf_stats_enabled")?;
    std::fs::write(STATS, "1").context("turning kernel.bpf_stats_enabled on")?;
    let measured = (|| -> Result<_> {
        let (running, _) = stormwatch_run_after_survey(bin)?;
        // The programs' run time straight from the kernel (the daemon's program fds), at the
        // same instants as the server's CPU time: the daemon's own counters are refreshed once
        // a collection (5 s), longer than some runs of redis-benchmark here.
        let read = || -> Result<(f64, BTreeMap<String, f64>, f64)> {
            let usage = std::fs::read_to_string(server_cgroup.join("cpu.stat"))?
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec "))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .context("no usage_usec in the server's cpu.stat")?;
            Ok((
                usage * 1e3,
                program_seconds(running.pid())?,
                machine_busy_ns()?,
            ))
        };
        let (cpu0, bpf0, busy0) = read()?;
        redis("127.0.0.1", redis_port, "set")?;
        let (cpu1, bpf1, busy1) = read()?;
        running.stop()?;
        let per_program: Vec<(String, f64)> = bpf1
            .iter()
            .map(|(p, s)| (p.clone(), (s - bpf0.get(p).unwrap_or(&0.0)) * 1e9))
            .filter(|(_, ns)| *ns > 0.0)
            .collect();
        Ok((cpu1 - cpu0, busy1 - busy0, per_program))
    })();
    std::fs::write(STATS, was.trim()).context("restoring kernel.bpf_stats_enabled")?;
    let (server_ns, busy_ns, per_program) = measured?;
    let n = f64::from(REDIS_REQUESTS);
    let bpf_ns: f64 = per_program.iter().map(|(_, ns)| ns).sum();
    let mut out = format!(
        "\nBPF time per Redis SET request over loopback (`stormwatch run` as deployed, after its \
         start-up survey; {REDIS_REQUESTS} requests): {:.0} ns of the daemon's programs against \
         {:.0} ns of the server's CPU ({:.2}%: a bound from above on the share of the server's \
         work, as all of the programs' time is counted) and {:.0} ns of the whole machine's busy \
         CPU, server and clients ({:.2}%: what a CPU-bound run loses) ({}).\n",
        bpf_ns / n,
        server_ns / n,
        100.0 * bpf_ns / server_ns,
        busy_ns / n,
        100.0 * bpf_ns / busy_ns,
        per_program
            .iter()
            .map(|(p, ns)| format!("{p} {:.0} ns", ns / n))
            .collect::<Vec<_>>()
            .join(", ")
    );
    out.push('\n');
    Ok(out)
}

/// The CPU time the whole machine has been busy, in ns: `/proc/stat`'s `cpu` line, the sum of
/// user, nice, system, irq and softirq (not idle, iowait or time stolen by the hypervisor), in
/// USER_HZ ticks (100 a second on Linux, whatever the kernel's HZ).
fn machine_busy_ns() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let ticks: Vec<f64> = stat
        .lines()
        .find_map(|l| l.strip_prefix("cpu "))
        .context("no cpu line in /proc/stat")?
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    anyhow::ensure!(ticks.len() >= 7, "short cpu line in /proc/stat");
    let busy = ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6];
    Ok(busy * 1e7)
}

/// The run time of each BPF program process `pid` holds, in seconds, by program name: from
/// `/proc/<pid>/fdinfo` (each program fd's `prog_id` and `run_time_ns`, which the kernel keeps
/// while `kernel.bpf_stats_enabled` is on), named by `bpftool prog show`.
fn program_seconds(pid: u32) -> Result<BTreeMap<String, f64>> {
    let mut run_ns: BTreeMap<u64, f64> = BTreeMap::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let Ok(text) = std::fs::read_to_string(entry?.path()) else {
            continue; // closed meanwhile
        };
        if let Some((id, ns)) = program_run_ns(&text) {
            run_ns.insert(id, ns as f64);
        }
    }
    let out = Command::new("bpftool")
        .args(["-j", "prog", "show"])
        .output()
        .context("cannot run bpftool")?;
    anyhow::ensure!(out.status.success(), "bpftool prog show: {}", out.status);
    let programs: Vec<serde_json::Value> =
        serde_json::from_slice(&out.stdout).context("bpftool's JSON")?;
    let mut by_name = BTreeMap::new();
    for p in programs {
        if let (Some(id), Some(name)) = (p["id"].as_u64(), p["name"].as_str())
            && let Some(ns) = run_ns.get(&id)
        {
            *by_name.entry(name.to_owned()).or_insert(0.0) += ns / 1e9;
        }
    }
    Ok(by_name)
}

/// A program fd's id and run time from its fdinfo; `None` for any other fd, a link fd included
/// (it names its program too, without the run time).
fn program_run_ns(fdinfo: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        fdinfo
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    Some((field("prog_id:")?, field("run_time_ns:")?))
}

/// `stormwatch run` as deployed (default configuration), once its start-up survey is over: the
/// per-packet network probes attach for the first diagnosis window (30 s) and then for one
/// window every 10 minutes, or while packets do not fit. Measured here is the rest of the time,
/// 95% of a node's day; during a survey packets pay what `--programs net` shows.
fn stormwatch_run_after_survey(bin: &Path) -> Result<(Running, u16)> {
    let port = free_port()?;
    let running = start_run(bin, port)?;
    let xmit = "stormwatch_probe_attached{tracepoint=\"net:net_dev_start_xmit\",kind=\"\"} 0";
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut surveyed = false;
    loop {
        let text = scrape(port).unwrap_or_default();
        let detached = text.lines().any(|l| l == xmit);
        surveyed |= !detached && text.contains("net:net_dev_start_xmit");
        if surveyed && detached {
            return Ok((running, port));
        }
        if Instant::now() > deadline {
            running.stop()?;
            anyhow::bail!("stormwatch run: no end of the start-up survey within 120 s");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `/metrics` of the daemon on `port`, as text (with ureq, the tests' HTTP client).
fn scrape(port: u16) -> Result<String> {
    let client: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let mut response = client
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .call()?;
    Ok(response
        .body_mut()
        .with_config()
        .limit(u64::MAX)
        .read_to_string()?)
}

fn table(none: &Figures, agent: &Figures, rounds: u32, seconds: u32) -> String {
    let row = |name: &str, unit: &str, a: &[f64], b: &[f64], higher_is_better: bool| {
        let (ma, mb) = (median(a), median(b));
        let ratios: Vec<f64> = b.iter().zip(a).map(|(b, a)| b / a).collect();
        let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!(
            "| {name} | {ma:.1} {unit} | {mb:.1} {unit} | {:.3} | {lo:.3}–{hi:.3} | {} |\n",
            mb / ma,
            if higher_is_better {
                "throughput: ≥ 0.99 is the goal"
            } else {
                "cost: ≤ 1.02 is the goal"
            }
        )
    };
    let mut out = format!(
        "\nOrdinary workloads, nothing storming: `stormwatch run` as deployed (default \
         configuration) against no agent, {rounds} interleaved rounds (HTTP {seconds} s at \
         {HTTP_RATE} requests/s over {HTTP_CONNECTIONS} connections; Redis {REDIS_REQUESTS} \
         requests, 50 clients; perf bench syscall basic, {SYSCALL_LOOPS} calls)\n\n\
         | workload | none (median) | stormwatch run (median) | ratio | ratio per round \
         (min–max) | reading |\n|---|---:|---:|---:|---:|---|\n"
    );
    out.push_str(&row("Redis SET", "req/s", &none.set, &agent.set, true));
    out.push_str(&row("Redis GET", "req/s", &none.get, &agent.get, true));
    out.push_str(&row(
        "Redis SET across a veth pair (server in a pod's namespace)",
        "req/s",
        &none.veth_set,
        &agent.veth_set,
        true,
    ));
    out.push_str(&row(
        "getppid (perf bench syscall basic)",
        "ns",
        &none.syscall_ns,
        &agent.syscall_ns,
        false,
    ));
    out.push_str(&row(
        "HTTP p50 latency",
        "µs",
        &none.http_p50_us,
        &agent.http_p50_us,
        false,
    ));
    out.push_str(&row(
        "HTTP p99 latency",
        "µs",
        &none.http_p99_us,
        &agent.http_p99_us,
        false,
    ));
    out.push_str(&row(
        "HTTP rate achieved",
        "req/s",
        &none.http_rate,
        &agent.http_rate,
        true,
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_fds_give_their_run_time_and_links_do_not() {
        // As /proc/<pid>/fdinfo has them on 6.18, for a program fd and for its link's fd.
        let program = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t2071\n\
                       prog_type:\t26\nprog_jited:\t1\nprog_tag:\tdec8cdb02a6c078a\n\
                       memlock:\t8192\nprog_id:\t2180\nrun_time_ns:\t555957\n\
                       run_cnt:\t391\nrecursion_misses:\t0\nverified_insns:\t1201\n";
        assert_eq!(program_run_ns(program), Some((2180, 555_957)));
        let link = "pos:\t0\nflags:\t02000000\nmnt_id:\t15\nino:\t2071\n\
                    link_type:\ttracing\nlink_id:\t77\nprog_tag:\tdec8cdb02a6c078a\n\
                    prog_id:\t2180\nattach_type:\t23\n";
        assert_eq!(program_run_ns(link), None);
        assert_eq!(program_run_ns("pos:\t0\nflags:\t02\n"), None);
    }
}
