//! What each BPF program costs per run, from the kernel's own run-time statistics: the noise of
//! a throughput ratio (±10% between minutes on a small VM) hides differences of tens of
//! nanoseconds per event that these show directly.
//!
//! For each workload and tracer: the kernel's statistics are switched on
//! (`kernel.bpf_stats_enabled`, put back as it was afterwards), the tracer is started, the
//! workload starts, and after its warm-up (past the tracer's first collection) every loaded
//! program's run count and run time are read (`bpftool prog show`), and again when it ends.
//! Programs loaded before the tracer started are left out (other software's programs on the
//! host). The statistics add the cost of reading the clock twice to every run: an empty program
//! is the floor to compare with, and it is measured the same way
//! (the `floor` rows).

use std::{collections::HashMap, path::Path, process::Command};

use anyhow::{Context as _, Result, bail};

use crate::{
    bench_common::{self as bench, Starter},
    say,
};

/// One program's run count and total run time, by program id.
#[derive(Clone)]
struct Sample {
    name: String,
    runs: u64,
    ns: u64,
}

/// Every loaded program, from `bpftool -j prog show` (which leaves out the run fields of a
/// program that has not run while statistics were on: zero).
fn snapshot() -> Result<HashMap<u64, Sample>> {
    let out = Command::new("bpftool")
        .args(["-j", "prog", "show"])
        .output()
        .context("cannot run bpftool")?;
    if !out.status.success() {
        bail!(
            "bpftool prog show: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    parse_programs(&out.stdout)
}

fn parse_programs(json: &[u8]) -> Result<HashMap<u64, Sample>> {
    let list: Vec<serde_json::Value> =
        serde_json::from_slice(json).context("bpftool's output is not a JSON list")?;
    let mut out = HashMap::new();
    for p in list {
        let id = p["id"].as_u64().context("a program without an id")?;
        out.insert(
            id,
            Sample {
                name: p["name"].as_str().unwrap_or("?").to_owned(),
                runs: p["run_cnt"].as_u64().unwrap_or(0),
                ns: p["run_time_ns"].as_u64().unwrap_or(0),
            },
        );
    }
    Ok(out)
}

const STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// `kernel.bpf_stats_enabled` on for as long as this lives, then as it was.
struct StatsOn {
    was: String,
}

impl StatsOn {
    fn new() -> Result<Self> {
        let was = std::fs::read_to_string(STATS_SYSCTL)
            .with_context(|| format!("cannot read {STATS_SYSCTL}"))?;
        std::fs::write(STATS_SYSCTL, "1")
            .with_context(|| format!("cannot turn on {STATS_SYSCTL}"))?;
        Ok(Self { was })
    }
}

impl Drop for StatsOn {
    fn drop(&mut self) {
        let _ = std::fs::write(STATS_SYSCTL, self.was.trim());
    }
}

/// Programs that ran fewer times in a measurement are not shown: their mean is a few samples.
const MIN_RUNS: u64 = 1000;

/// A snapshot once the tracer's programs are all loaded: a tracer may say it is ready before
/// the last of them is (bpftrace prints "Attaching" first), so wait until two snapshots 300 ms
/// apart hold the same programs, and new ones.
fn settled(before_tracer: &HashMap<u64, Sample>) -> Result<HashMap<u64, Sample>> {
    let new_ids = |s: &HashMap<u64, Sample>| {
        let mut ids: Vec<u64> = s
            .keys()
            .filter(|id| !before_tracer.contains_key(id))
            .copied()
            .collect();
        ids.sort_unstable();
        ids
    };
    let mut last = snapshot()?;
    for _ in 0..50 {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let now = snapshot()?;
        let ids = new_ids(&now);
        if !ids.is_empty() && ids == new_ids(&last) {
            return Ok(now);
        }
        last = now;
    }
    bail!("the tracer's programs did not settle within 15 s")
}

/// How long each workload runs before its measured seconds: past the tracer's first collection
/// (`stormwatch run`'s is 5 s after its start, `trace`'s here 1 s), at which the agent places
/// the keys it has seen in their direct slots and names each CPU's busiest cgroup for its switch
/// cache. A node's workload runs long before and after: the measured seconds are its steady
/// state, not the tracer's first seconds.
const WARM_UP_SECONDS: u32 = 6;

/// Per program of a tracer: (name, runs, ns) over one run of the workload, after its warm-up.
fn measure(
    bin: &Path,
    start: &Starter,
    workload: &[&str],
    seconds: u32,
) -> Result<Vec<(String, u64, u64)>> {
    let before_tracer = snapshot()?;
    let running = start(bin, seconds)?;
    settled(&before_tracer)?;
    let mut child = Command::new(workload[0])
        .args(&workload[1..])
        .args(["-t", &(WARM_UP_SECONDS + seconds).to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {}", workload[0]))?;
    std::thread::sleep(std::time::Duration::from_secs(WARM_UP_SECONDS.into()));
    let before = snapshot()?;
    let status = child.wait().context("waiting for the workload")?;
    let after = snapshot()?;
    running.stop()?;
    anyhow::ensure!(status.success(), "{workload:?} failed: {status}");
    let mut out: Vec<(String, u64, u64)> = after
        .into_iter()
        .filter(|(id, _)| !before_tracer.contains_key(id))
        .filter_map(|(id, a)| {
            let b = before.get(&id)?;
            let runs = a.runs.checked_sub(b.runs)?;
            (runs >= MIN_RUNS).then(|| (a.name.clone(), runs, a.ns.saturating_sub(b.ns)))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// A tracer's programs over `repeats` runs: per program name, each run's ns per run and the runs
/// per second.
struct Costs {
    tracer: &'static str,
    by_program: Vec<(String, Vec<f64>, Vec<f64>)>,
}

fn costs(
    bin: &Path,
    tracer: &'static str,
    start: &Starter,
    workload: &[&str],
    seconds: u32,
    repeats: u32,
) -> Result<Costs> {
    let mut by_program: Vec<(String, Vec<f64>, Vec<f64>)> = Vec::new();
    for repeat in 1..=repeats {
        say(&format!(
            "programs: {tracer} under {workload:?}, {repeat}/{repeats}"
        ));
        // Several programs of one tracer can share a name (bpftrace's, one per probe): they are
        // summed, as the program name is what the table can show.
        let mut summed: Vec<(String, u64, u64)> = Vec::new();
        for (name, runs, ns) in measure(bin, start, workload, seconds)? {
            match summed.iter_mut().find(|(n, _, _)| *n == name) {
                Some(s) => {
                    s.1 += runs;
                    s.2 += ns;
                }
                None => summed.push((name, runs, ns)),
            }
        }
        for (name, runs, ns) in summed {
            let per_run = ns as f64 / runs as f64;
            let rate = runs as f64 / f64::from(seconds);
            match by_program.iter_mut().find(|(n, _, _)| *n == name) {
                Some(p) => {
                    p.1.push(per_run);
                    p.2.push(rate);
                }
                None => by_program.push((name, vec![per_run], vec![rate])),
            }
        }
    }
    Ok(Costs { tracer, by_program })
}

/// Each of our per-event programs with the empty program on its hook (`bench.rs` of the eBPF
/// crate): the floor its cost is read against.
const FLOOR_OF: &[(&str, &str)] = &[
    ("sched_switch_btf", "bench_empty_switch"),
    ("sched_waking_btf", "bench_empty_waking"),
    ("sched_wakeup_btf", "bench_empty_wakeup"),
    ("sched_wakeup_new_btf", "bench_empty_wakeup_new"),
    ("net_dev_xmit_btf", "bench_empty_xmit"),
    ("net_receive_btf", "bench_empty_receive"),
    ("net_kfree_skb_btf", "bench_empty_kfree_skb"),
    ("lock_contention_begin_btf", "bench_empty_lock_begin"),
    ("lock_contention_end_btf", "bench_empty_lock_end"),
    ("futex_enter", "bench_empty_futex_enter"),
    ("futex_exit", "bench_empty_futex_exit"),
];

/// The median ns per run of `program`'s floor among `rows` (the floor tracer's programs).
fn floor_of(program: &str, rows: &[Costs]) -> Option<f64> {
    let (_, floor) = FLOOR_OF.iter().find(|(p, _)| *p == program)?;
    rows.iter()
        .flat_map(|c| &c.by_program)
        .find(|(name, _, _)| name == floor)
        .map(|(_, per_run, _)| bench::median(per_run))
}

fn table(workload: &str, seconds: u32, repeats: u32, rows: &[Costs]) -> String {
    let mut out = format!(
        "\nPer program under {workload}, {repeats} runs of {seconds} s each (kernel BPF \
         run-time statistics)\n\n\
         | tracer | program | runs/s (median) | ns per run (median) | ns per run (min–max) | \
         × the empty program on its hook |\n\
         |---|---|---:|---:|---:|---:|\n"
    );
    for costs in rows {
        for (name, per_run, rate) in &costs.by_program {
            let lo = per_run.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = per_run.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let median = bench::median(per_run);
            let ratio = floor_of(name, rows)
                .map_or_else(|| "–".to_owned(), |floor| format!("{:.2}", median / floor));
            out.push_str(&format!(
                "| {} | `{name}` | {:.0} | {median:.0} | {lo:.0}–{hi:.0} | {ratio} |\n",
                costs.tracer,
                bench::median(rate),
            ));
        }
    }
    out
}

/// A workload of the per-program table.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Workload {
    /// The switch storm.
    Sched,
    /// The futex stressor.
    Futex,
    /// UDP over loopback.
    Net,
    /// A kernel-lock storm.
    Locks,
}

/// The switch storm and the futex stressor, each with the floor, stormwatch's probes, the daemon
/// as deployed and bpftrace; UDP over loopback with the network probes and the daemon. Only
/// those in `only`, unless it is empty.
pub fn run(bin: &Path, seconds: u32, repeats: u32, only: &[Workload]) -> Result<String> {
    let _stats = StatsOn::new()?;
    let wanted = |w: Workload| only.is_empty() || only.contains(&w);
    let mut out = String::new();
    if wanted(Workload::Sched) {
        out += &sched(bin, seconds, repeats)?;
    }
    if wanted(Workload::Futex) {
        out += &futex(bin, seconds, repeats)?;
    }
    if wanted(Workload::Net) {
        out += &net(bin, seconds, repeats)?;
    }
    if wanted(Workload::Locks) {
        out += &locks(bin, seconds, repeats)?;
    }
    Ok(out)
}

fn sched(bin: &Path, seconds: u32, repeats: u32) -> Result<String> {
    workload(
        bin,
        &["stress-ng", "--switch", "2"],
        vec![
            (
                "empty tp_btf programs (floor)",
                bench::stormwatch("empty-sched"),
            ),
            ("stormwatch --probes sched", bench::stormwatch("sched")),
            (
                "stormwatch --probes sched --no-runqueue-blame",
                bench::stormwatch_with("sched", &["--no-runqueue-blame"]),
            ),
            ("stormwatch run", bench::stormwatch_run()),
            (
                "bpftrace (switch-storm script)",
                bench::bpftrace(bench::BPFTRACE_SCHED),
            ),
        ],
        seconds,
        repeats,
    )
}

fn futex(bin: &Path, seconds: u32, repeats: u32) -> Result<String> {
    workload(
        bin,
        &["stress-ng", "--futex", "2"],
        vec![
            (
                "empty tracepoint programs on sys_enter/exit_futex (floor)",
                bench::stormwatch("empty-futex"),
            ),
            ("stormwatch --probes futex", bench::stormwatch("futex")),
            (
                "stormwatch --probes futex --no-call-sites (no hand-off sampling)",
                bench::stormwatch_with("futex", &["--no-call-sites"]),
            ),
            ("stormwatch run", bench::stormwatch_run()),
            (
                "bpftrace (futex script)",
                bench::bpftrace(bench::BPFTRACE_FUTEX),
            ),
        ],
        seconds,
        repeats,
    )
}

/// Packets over loopback: what the network programs cost per packet (transmit and receive each
/// run once per packet, whichever container sends).
fn net(bin: &Path, seconds: u32, repeats: u32) -> Result<String> {
    workload(
        bin,
        &["stress-ng", "--udp", "2"],
        vec![
            (
                "empty tp_btf programs (floor)",
                bench::stormwatch("empty-net"),
            ),
            ("stormwatch --probes net", bench::stormwatch("net")),
            ("stormwatch run", bench::stormwatch_run()),
        ],
        seconds,
        repeats,
    )
}

/// A kernel-lock storm: what the lock probes cost per contention, begin and end, against empty
/// programs on the same tracepoints (issue #43: a workload the per-program table lacked).
fn locks(bin: &Path, seconds: u32, repeats: u32) -> Result<String> {
    workload(
        bin,
        KERNEL_LOCK_STORM,
        vec![
            (
                "empty tp_btf programs (floor)",
                bench::stormwatch("empty-locks"),
            ),
            ("stormwatch --probes locks", bench::stormwatch("locks")),
            ("stormwatch run", bench::stormwatch_run()),
        ],
        seconds,
        repeats,
    )
}

/// The kernel-lock storm: four processes taking and dropping `flock` on one file, on 2 CPUs.
/// Measured with bpftrace on this 2-vCPU VM (2026-11-29): ~40,000 contentions per second on
/// the file's lock-context spinlock (`flags` 1, spin), ~8,000 on the percpu rwsem of the file
/// locks (`flags` 18), where `--fcntl 4` made 4,000/s and `--futex 4` 11,000/s in all.
const KERNEL_LOCK_STORM: &[&str] = &["stress-ng", "--flock", "4"];

/// One workload's table: each tracer in turn, `repeats` runs each.
fn workload(
    bin: &Path,
    command: &[&str],
    tracers: Vec<(&'static str, Starter)>,
    seconds: u32,
    repeats: u32,
) -> Result<String> {
    let mut rows = Vec::new();
    for (tracer, start) in &tracers {
        rows.push(costs(bin, tracer, start, command, seconds, repeats)?);
    }
    Ok(table(
        &format!("`{}`", command.join(" ")),
        seconds,
        repeats,
        &rows,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_bpftools_list_with_and_without_run_fields() {
        let json = br#"[{"id":7,"type":"tracing","name":"sched_switch_bt","run_time_ns":2450,"run_cnt":10},
                        {"id":9,"type":"tracepoint","name":"futex_exit"}]"#;
        let p = parse_programs(json).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[&7].name, "sched_switch_bt");
        assert_eq!((p[&7].runs, p[&7].ns), (10, 2450));
        assert_eq!((p[&9].runs, p[&9].ns), (0, 0));
        assert!(parse_programs(b"{}").is_err());
    }

    #[test]
    fn a_program_is_read_against_the_empty_one_on_its_hook() {
        let rows = [
            Costs {
                tracer: "floor",
                by_program: vec![(
                    "bench_empty_switch".to_owned(),
                    vec![30.0, 32.0, 31.0],
                    vec![1e5; 3],
                )],
            },
            Costs {
                tracer: "stormwatch",
                by_program: vec![
                    (
                        "sched_switch_btf".to_owned(),
                        vec![62.0, 60.0, 64.0],
                        vec![1e5; 3],
                    ),
                    ("futex_exit".to_owned(), vec![90.0], vec![1e4]),
                ],
            },
        ];
        assert_eq!(floor_of("sched_switch_btf", &rows), Some(31.0));
        assert_eq!(floor_of("futex_exit", &rows), None);
        let t = table("w", 5, 3, &rows);
        assert!(
            t.contains("| stormwatch | `sched_switch_btf` | 100000 | 62 | 60–64 | 2.00 |"),
            "{t}"
        );
        assert!(
            t.contains("| stormwatch | `futex_exit` | 10000 | 90 | 90–90 | – |"),
            "{t}"
        );
    }
}
