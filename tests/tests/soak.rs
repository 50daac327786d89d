//! A soak of `stormwatch run` (default configuration but a 1 s interval, and the futex probes
//! attached all along so that every storm's call sites are sampled), as the DaemonSet runs it
//! for weeks, compressed into minutes of what wears an agent down:
//!
//! - thread churn: thousands of short-lived threads a second contending on a mutex, and child
//!   processes whose non-leader thread execs (the kernel hands it the leader's pid);
//! - cgroups created and removed all along, each with a short lock storm of another program in
//!   it, in turn: a Rust `Mutex`, C's pthread mutex (lockbench, unwound by call-frame
//!   information), Go's `sync.Mutex` (gomutex: the uprobes' finder) and a JVM's monitor (its
//!   perf map, its 20 MB libjvm): each a new process whose stacks the call-site caches read;
//! - /metrics scraped every second all along.
//!
//! Then: no counter ever went backwards between two scrapes; the churning cgroup's switches
//! equal its getrusage (self + waited-for children) within 2% (voluntary) and 5%
//! (involuntary); every cache the agent reports (`stormwatch_agent_cache_*`) stayed within
//! its bound at every scrape, and the call-site caches were filled; the daemon's resident
//! memory did not grow after the warm-up (the last third against the middle one, issue 45);
//! and the lost-event counters are exported for every reason.

use std::{
    collections::HashMap,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use stormwatch_tests::{
    TestCgroup,
    corpus::{built_programs, go_program},
    daemon::{Daemon, sample, tool},
    join_before_exec, num, require_bpf, run_in_cgroup,
    stats::median,
    workload_result,
};

const SOAK: Duration = Duration::from_secs(240);
/// A new cgroup with a short storm every this often.
const CGROUP_EVERY: Duration = Duration::from_secs(4);
/// Memory is judged after this: the caches have met every program of the churn by then.
const WARMUP: Duration = Duration::from_secs(80);
/// How much the median resident memory of the last third may exceed the middle third's, less
/// the bytes of the caches that count theirs (ELF sections, stacks, perf maps: each within its
/// own bound, checked at every scrape, and as large as what the node runs at the moment — a
/// compiler's 7 MB of call-frame information while it is sampled): the allocator's noise, not
/// a slope. Growth of the kind issue 45 measured (13.7 MiB over 150 s) would cross it.
const FLAT_KIB: u64 = 6 * 1024;

/// The short-lived storms, in turn: (name, program and arguments).
fn storm(turn: usize) -> (&'static str, Command) {
    let storm_bin = |name: &str| built_programs().join(name);
    match turn % 4 {
        0 => {
            let mut c = Command::new(env!("CARGO_BIN_EXE_mutex_storm"));
            c.args(["--threads", "8", "--seconds", "2"]);
            ("rust", c)
        }
        1 => {
            let mut c = Command::new(storm_bin("lockbench-nofp"));
            c.args(["--lock", "mutex", "--threads", "8", "--seconds", "2"]);
            ("c", c)
        }
        2 => {
            let mut c = Command::new(go_program("gomutex"));
            c.args(["-goroutines", "16", "-seconds", "2"]);
            ("go", c)
        }
        _ => {
            let mut c = Command::new(tool("java", "apt-get install openjdk-17-jre-headless"));
            c.args(["-XX:+PreserveFramePointer", "-Xmx64m", "-cp"])
                .arg(built_programs())
                .args(["Corpus", "storm", "8", "2"]);
            ("jvm", c)
        }
    }
}

/// One series per cache of a `stormwatch_agent_cache_*` family: cache → value.
fn caches(text: &str, family: &str) -> HashMap<String, f64> {
    let prefix = format!("{family}{{cache=\"");
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let (cache, value) = rest.split_once("\"} ")?;
            Some((cache.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// Asserts every cache within its bounds; returns its entries.
fn caches_within_bounds(text: &str, scrape: usize) -> HashMap<String, f64> {
    let entries = caches(text, "stormwatch_agent_cache_entries");
    for (bound_of, max_of) in [
        (
            "stormwatch_agent_cache_entries",
            "stormwatch_agent_cache_max_entries",
        ),
        (
            "stormwatch_agent_cache_bytes",
            "stormwatch_agent_cache_max_bytes",
        ),
    ] {
        let values = caches(text, bound_of);
        for (cache, max) in caches(text, max_of) {
            let v = values.get(&cache).copied().unwrap_or(0.0);
            assert!(
                v <= max,
                "{bound_of}{{cache=\"{cache}\"}} = {v} is over its bound {max} (scrape {scrape})"
            );
        }
    }
    entries
}

/// Every counter sample of an exposition (counters, histogram sums, counts and buckets), by
/// the series' full name and labels.
fn counters(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let name = series.split('{').next()?;
            let counter = ["_total", "_sum", "_count", "_bucket"]
                .iter()
                .any(|s| name.ends_with(s));
            if !counter {
                return None;
            }
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

fn rss_kib(pid: u32) -> u64 {
    stormwatch_tests::process_status(pid)
        .expect("the daemon's /proc/<pid>/status")
        .vmrss
        .expect("VmRSS")
}

fn switches(text: &str, rel: &str, kind: &str) -> f64 {
    let series = format!(
        "stormwatch_context_switches_total{{namespace=\"\",pod=\"\",container=\"\",\
         cgroup=\"{rel}\",type=\"{kind}\"}}"
    );
    sample(text, &series).unwrap_or_else(|| panic!("{series} is not exported"))
}

#[test]
fn run_stays_right_under_thread_and_cgroup_churn() {
    require_bpf();
    // Built before the daemon starts: the compilers' own storms are not the soak's.
    built_programs();
    let daemon = Daemon::start_configured("futex_probes = \"always\"\n");
    let churn_cgroup = TestCgroup::new("soak-churn");
    let rel = churn_cgroup.rel_path().to_owned();
    let churn = run_in_cgroup(
        Command::new(env!("CARGO_BIN_EXE_churn_exec")).args([
            "--seconds",
            &SOAK.as_secs().to_string(),
            "--threads",
            "2000",
        ]),
        &churn_cgroup,
    );
    let started = Instant::now();
    let mut previous: HashMap<String, f64> = HashMap::new();
    let mut scrapes = 0;
    let mut next_cgroup = started;
    let mut short_lived: Vec<(TestCgroup, std::process::Child)> = Vec::new();
    let mut cgroups_made = 0;
    let mut rss_half = None;
    // Resident memory at each scrape after the warm-up, less the caches' counted bytes (KiB),
    // and each cache's largest size.
    let mut rss_after_warmup: Vec<(Duration, u64)> = Vec::new();
    let mut peaks: HashMap<String, f64> = HashMap::new();
    let mut rss_all: Vec<(u64, u64, u64)> = Vec::new();
    while started.elapsed() < SOAK {
        // A cgroup comes, storms for 2 s, and goes.
        if Instant::now() >= next_cgroup {
            let (kind, mut cmd) = storm(cgroups_made);
            let cg = TestCgroup::new(&format!("soak-{kind}"));
            join_before_exec(&mut cmd, &cg.path().join("cgroup.procs"));
            let child = cmd
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start the {kind} storm: {e}"));
            short_lived.push((cg, child));
            cgroups_made += 1;
            next_cgroup += CGROUP_EVERY;
        }
        let mut still = Vec::new();
        for (cg, mut child) in short_lived.drain(..) {
            if let Some(status) = child.try_wait().expect("waiting for a storm") {
                assert!(
                    status.success(),
                    "a storm in {} failed: {status}",
                    cg.rel_path()
                );
                cg.remove();
            } else {
                still.push((cg, child));
            }
        }
        short_lived = still;

        let text = daemon.metrics();
        scrapes += 1;
        for (cache, n) in caches_within_bounds(&text, scrapes) {
            let peak = peaks.entry(cache).or_default();
            *peak = peak.max(n);
        }
        let counted: f64 = caches(&text, "stormwatch_agent_cache_bytes").values().sum();
        let rss = rss_kib(daemon.child.id());
        rss_all.push((started.elapsed().as_secs(), rss, counted as u64 / 1024));
        if started.elapsed() >= WARMUP {
            rss_after_warmup.push((started.elapsed(), rss.saturating_sub(counted as u64 / 1024)));
        }
        let now = counters(&text);
        for (series, value) in &now {
            if let Some(before) = previous.get(series) {
                assert!(
                    value >= before,
                    "{series} went backwards: {before} → {value} (scrape {scrapes})"
                );
            }
        }
        previous = now;
        if rss_half.is_none() && started.elapsed() >= SOAK / 2 {
            rss_half = Some(rss_kib(daemon.child.id()));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let truth = workload_result(churn);
    for (cg, mut child) in short_lived {
        let status = child.wait().expect("waiting for a storm");
        assert!(
            status.success(),
            "a storm in {} failed: {status}",
            cg.rel_path()
        );
        cg.remove();
    }
    // Two more collections, so that the churn's last switches are in.
    std::thread::sleep(Duration::from_secs(3));
    let text = daemon.metrics();
    let rss_end = rss_kib(daemon.child.id());
    eprintln!(
        "soak: (s, RSS KiB, the caches' counted KiB) every 5 scrapes: {:?}; at the end: {:?}",
        rss_all.iter().step_by(5).collect::<Vec<_>>(),
        text.lines()
            .filter(|l| l.starts_with("stormwatch_agent_cache_") && !l.ends_with(" 0"))
            .collect::<Vec<_>>()
    );
    eprintln!(
        "soak: {}",
        std::fs::read_to_string(format!("/proc/{}/smaps_rollup", daemon.child.id()))
            .unwrap_or_default()
            .replace('\n', "; ")
    );
    let rss_half = rss_half.expect("RSS at half time");

    let lost: Vec<(String, f64)> = text
        .lines()
        .filter(|l| l.starts_with("stormwatch_lost_events_total{"))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect();
    assert!(
        !lost.is_empty(),
        "stormwatch_lost_events_total is exported (pre-set to zero) for every reason"
    );
    let lost_total: f64 = lost.iter().map(|(_, v)| v).sum();
    eprintln!(
        "soak: {scrapes} scrapes, {cgroups_made} short-lived cgroups, {} churn threads, {} exec \
         children; RSS {rss_half} KiB at half time, {rss_end} KiB at the end; lost events: {lost:?}",
        num(&truth, "threads"),
        num(&truth, "children"),
    );
    assert!(
        num(&truth, "threads") >= 1000.0 * SOAK.as_secs_f64() / 2.0,
        "the churn ran: {truth}"
    );

    let (vol, invol) = (
        switches(&text, &rel, "voluntary"),
        switches(&text, &rel, "involuntary"),
    );
    let (want_vol, want_invol) = (num(&truth, "nvcsw"), num(&truth, "nivcsw"));
    let within = |got: f64, want: f64, tolerance: f64| (got - want).abs() <= tolerance * want;
    // A failed per-thread state access on a switch does not lose that switch: the thread's own
    // counters are cumulative, and its next switch-out credits the difference. So the figures
    // must hold whatever the lost-event counters say; they are printed above for the record.
    assert!(
        within(vol, want_vol, 0.02),
        "voluntary switches of the churning cgroup: {vol} vs getrusage {want_vol} (2%); \
         lost events: {lost_total}"
    );
    assert!(
        within(invol, want_invol, 0.05),
        "involuntary switches: {invol} vs getrusage {want_invol} (5%); lost events: {lost_total}"
    );
    // Flat memory is asked below, of the medians of the scrapes' readings: one reading at half
    // time against one at the end compared two points of a series that swings by a tenth
    // between scrapes as the allocator returns memory (24–33 MiB through one run, the caches
    // flat at 3.3 MiB): a CI run failed there at +12.9% (2026-11-29) with the medians flat.

    // The call-site caches were filled (the storms' stacks were read and named), and stayed
    // within their bounds (checked at every scrape above).
    let mut peaks: Vec<(String, f64)> = peaks.into_iter().collect();
    peaks.sort_by(|a, b| a.0.cmp(&b.0));
    eprintln!("soak: the caches' largest sizes: {peaks:?}");
    let peak = |cache: &str| {
        peaks
            .iter()
            .find(|(c, _)| c == cache)
            .map_or(0.0, |(_, n)| *n)
    };
    for cache in ["user_processes", "elf_files", "symbol_names"] {
        assert!(
            peak(cache) > 0.0,
            "the {cache} cache never filled: {peaks:?}"
        );
    }
    // After the warm-up: the last third's median against the middle third's.
    let third = (SOAK - WARMUP) / 2;
    let (middle, last): (Vec<_>, Vec<_>) = rss_after_warmup
        .iter()
        .partition(|(at, _)| *at < WARMUP + third);
    let (middle, last) = (
        median(middle.iter().map(|(_, r)| *r), u64::cmp).unwrap_or(0),
        median(last.iter().map(|(_, r)| *r), u64::cmp).unwrap_or(0),
    );
    eprintln!(
        "soak: RSS less the caches' counted bytes after the warm-up (s, KiB): {:?}",
        rss_after_warmup
            .iter()
            .step_by(10)
            .map(|(at, r)| (at.as_secs(), *r))
            .collect::<Vec<_>>()
    );
    assert!(
        last <= middle + FLAT_KIB,
        "RSS (less the caches' counted bytes) grew after the warm-up: median {middle} KiB from \
         {}s, {last} KiB from {}s (at most {FLAT_KIB} KiB more)",
        WARMUP.as_secs(),
        (WARMUP + third).as_secs()
    );
}
