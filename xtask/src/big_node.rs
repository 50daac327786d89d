//! `cargo xtask big-node`: the daemon's memory on a node with many CPUs, measured in a guest
//! with that many vCPUs (emulated: right for memory and for what the kernel allocates per CPU,
//! not for speed), against the pod's memory sizing formula as deploy/README.md states it.
//!
//! The guest (the kernel matrix's plumbing, [`crate::kernels::Guest`]) runs
//! `exporter_bench --memory-cgroup --maps` with the ConfigMap's `config.toml` (from
//! deploy/daemonset.yaml): N cgroups with a sleeper each, `stormwatch run` alone in a memory
//! cgroup of its own as in its pod, and at the end the daemon's RSS and peak, what the kernel
//! charged to its cgroup (`memory.current`, `memory.peak`, `memory.stat`'s `percpu`) and each
//! BPF map it holds (type, `max_entries`, the kernel's `memlock`). Those are printed beside
//! what the formula says for that many CPUs, a mismatch flagged.

use std::{collections::HashMap, fmt::Write as _, path::Path, time::Duration};

use anyhow::{Context as _, Result, bail};

use crate::{
    bench_daemon::parse_result,
    cargo,
    kernels::{self, Guest, sh_quote},
    root, run_cmd, say,
};

/// The memory sizing as deploy/README.md ("The pod's memory") states it, for the ConfigMap's
/// `max_cgroups` and as many live cgroups. Two parts: what is charged to the pod's memory
/// cgroup (the process, its kernel memory, `CGROUP_FUTEX`'s entries, the binary's page cache)
/// and the preallocated per-CPU maps' values, node memory charged to no cgroup (the kernel
/// allocates them before it records the map's memory cgroup).
#[derive(Clone, Copy, Debug)]
pub struct Formula {
    /// The `max_cgroups` (and live cgroups) the figures are for.
    pub max_cgroups: u32,
    /// The process and the kernel memory charged with it, at peak, MiB.
    pub process_mib: f64,
    /// The binary's page cache, MiB.
    pub page_cache_mib: f64,
    /// The per-CPU maps at these CPU counts: `(CPUs, MiB without, MiB with max_cgroups
    /// cgroups in CGROUP_FUTEX)`, ascending; straight lines between them.
    pub per_cpu_points: &'static [(u32, f64, f64)],
    /// Beyond the last point: MiB per CPU more, without and with `CGROUP_FUTEX` full.
    pub beyond_mib_per_cpu: (f64, f64),
    /// `CGROUP_SCHED` and `CGROUP_LOCKS` together, per cgroup per CPU, KiB (preallocated for
    /// at least `max_cgroups`).
    pub sched_locks_kib_per_cgroup_per_cpu: f64,
    /// `CGROUP_FUTEX`, per cgroup that made futex calls, per CPU, bytes (not preallocated;
    /// charged to the pod).
    pub futex_bytes_per_cgroup_per_cpu: f64,
    /// Every other per-CPU map's cap, MiB.
    pub other_map_cap_mib: f64,
    /// The memory cgroup's per-CPU charge batches in `memory.current` (drained before
    /// reclaim), at most, MiB per CPU.
    pub charge_batch_mib_per_cpu: f64,
    /// The manifests' memory request and limit, MiB.
    pub request_mib: f64,
    pub limit_mib: f64,
}

/// The formula of deploy/README.md, deploy/daemonset.yaml and the chart's values.yaml (a unit
/// test checks that they state these figures).
pub const MANIFEST: Formula = Formula {
    max_cgroups: 1000,
    process_mib: 87.0,
    page_cache_mib: 7.0,
    per_cpu_points: &[
        (2, 16.0, 16.0),
        (16, 64.0, 69.0),
        (64, 126.0, 146.0),
        (96, 156.0, 185.0),
        (192, 270.0, 329.0),
    ],
    beyond_mib_per_cpu: (1.2, 1.5),
    sched_locks_kib_per_cgroup_per_cpu: 0.95,
    futex_bytes_per_cgroup_per_cpu: 320.0,
    other_map_cap_mib: 16.0,
    charge_batch_mib_per_cpu: 0.25,
    request_mib: 192.0,
    limit_mib: 320.0,
};

/// The maps whose size follows `max_cgroups`.
const CGROUP_SCHED: &str = "CGROUP_SCHED";
const CGROUP_LOCKS: &str = "CGROUP_LOCKS";
const CGROUP_FUTEX: &str = "CGROUP_FUTEX";

/// How far a measurement may be from the formula and still match it (either way).
const TOLERANCE: f64 = 0.10;

impl Formula {
    /// The per-CPU maps' values on `cpus` CPUs, `(low, high)` MiB.
    pub fn per_cpu_mib(&self, cpus: u32) -> (f64, f64) {
        let points = self.per_cpu_points;
        let first = points[0];
        let last = points[points.len() - 1];
        if cpus <= first.0 {
            return (first.1, first.2);
        }
        if cpus >= last.0 {
            let more = f64::from(cpus - last.0);
            let (lo, hi) = self.beyond_mib_per_cpu;
            return (last.1 + more * lo, last.2 + more * hi);
        }
        let (a, b) = points
            .windows(2)
            .map(|w| (w[0], w[1]))
            .find(|(a, b)| (a.0..=b.0).contains(&cpus))
            .expect("cpus is within the points");
        let t = f64::from(cpus - a.0) / f64::from(b.0 - a.0);
        (a.1 + t * (b.1 - a.1), a.2 + t * (b.2 - a.2))
    }

    /// `CGROUP_FUTEX` with `max_cgroups` cgroups in it on `cpus` CPUs, MiB.
    pub fn futex_mib(&self, cpus: u32) -> f64 {
        self.futex_bytes_per_cgroup_per_cpu * f64::from(cpus) * f64::from(self.max_cgroups) / MIB
    }

    /// What is charged to the pod on `cpus` CPUs with `max_cgroups` live cgroups, MiB: without
    /// `CGROUP_FUTEX` entries; and with every cgroup in it and the per-CPU charge batches
    /// full (what `memory.peak` may show).
    pub fn pod_mib(&self, cpus: u32) -> (f64, f64) {
        let fixed = self.process_mib + self.page_cache_mib;
        let batches = self.charge_batch_mib_per_cpu * f64::from(cpus);
        (fixed, fixed + self.futex_mib(cpus) + batches)
    }

    /// The per-CPU points as deploy/README.md words them (`13 MiB at 2 CPUs, 63–67 MiB at 16,
    /// …`), or `short` as the YAML comments do (`13 MiB at 2 CPUs, 63-67 at 16, …`).
    fn points_as_worded(&self, short: bool) -> String {
        let (dash, unit) = if short { ("-", "") } else { ("–", " MiB") };
        self.per_cpu_points
            .iter()
            .enumerate()
            .map(|(i, &(cpus, lo, hi))| {
                let unit = if i == 0 { " MiB" } else { unit };
                let range = if lo == hi {
                    format!("{lo:.0}{unit}")
                } else {
                    format!("{lo:.0}{dash}{hi:.0}{unit}")
                };
                if i == 0 {
                    format!("{range} at {cpus} CPUs")
                } else {
                    format!("{range} at {cpus}")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// One `map …` line of `exporter_bench --maps`.
#[derive(Clone, Debug, PartialEq)]
pub struct Map {
    pub name: String,
    pub map_type: String,
    pub value_size: u64,
    pub max_entries: u64,
    pub flags: u64,
    pub memlock: u64,
}

impl Map {
    pub fn per_cpu(&self) -> bool {
        matches!(
            self.map_type.as_str(),
            "percpu_hash" | "percpu_array" | "lru_percpu_hash" | "percpu_cgroup_storage"
        )
    }

    /// Hashes created with `BPF_F_NO_PREALLOC` (flag 1) allocate entries as they are used.
    pub fn preallocated(&self) -> bool {
        self.flags & 1 == 0
    }

    fn mib(&self) -> f64 {
        self.memlock as f64 / MIB
    }
}

const MIB: f64 = 1048576.0;

/// The `map …` lines of `exporter_bench --maps` output.
pub fn parse_maps(stdout: &str) -> Vec<Map> {
    stdout
        .lines()
        .filter_map(|l| {
            let kv: HashMap<&str, &str> = l
                .strip_prefix("map ")?
                .split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .collect();
            let num = |k: &str| -> Option<u64> {
                let v = kv.get(k)?;
                match v.strip_prefix("0x") {
                    Some(hex) => u64::from_str_radix(hex, 16).ok(),
                    None => v.parse().ok(),
                }
            };
            Some(Map {
                name: (*kv.get("name")?).to_owned(),
                map_type: (*kv.get("type")?).to_owned(),
                value_size: num("value")?,
                max_entries: num("max_entries")?,
                flags: num("flags")?,
                memlock: num("memlock")?,
            })
        })
        .collect()
}

/// One comparison of a measured figure with the formula's.
#[derive(Debug)]
pub struct Verdict {
    pub what: String,
    pub measured: String,
    pub formula: String,
    /// `None` when they match; else why not.
    pub mismatch: Option<String>,
}

/// `measured` against the range `lo..=hi`, with [`TOLERANCE`] either way.
fn against(measured: f64, lo: f64, hi: f64) -> Option<String> {
    if measured > hi * (1.0 + TOLERANCE) {
        Some(format!(
            "the formula is {:.0}% BELOW the measurement",
            100.0 * (measured - hi) / measured
        ))
    } else if measured < lo * (1.0 - TOLERANCE) {
        Some(format!(
            "the formula is {:.0}% above the measurement",
            100.0 * (lo - measured) / measured
        ))
    } else {
        None
    }
}

fn range(lo: f64, hi: f64, unit: &str) -> String {
    if (hi - lo).abs() < 0.05 {
        format!("{lo:.1} {unit}")
    } else {
        format!("{lo:.1}–{hi:.1} {unit}")
    }
}

/// What was measured in the guest, against `formula` on `cpus` CPUs with `max_cgroups` (the
/// ConfigMap's) and `cgroups` live.
pub fn compare(
    formula: &Formula,
    cpus: u32,
    max_cgroups: u32,
    result: &HashMap<String, String>,
    maps: &[Map],
) -> Vec<Verdict> {
    let mut out = Vec::new();
    let field = |k: &str| result.get(k).and_then(|v| v.parse::<f64>().ok());
    if max_cgroups != formula.max_cgroups {
        out.push(Verdict {
            what: "max_cgroups".into(),
            measured: max_cgroups.to_string(),
            formula: formula.max_cgroups.to_string(),
            mismatch: Some("the formula's figures are for another max_cgroups".into()),
        });
    }
    let find = |name: &str| maps.iter().find(|m| m.name == name);
    // The per-cgroup maps: preallocated for at least max_cgroups, 0.95 KiB per cgroup per CPU
    // for the two together.
    let mut per_cgroup_cpu = 0.0;
    for name in [CGROUP_SCHED, CGROUP_LOCKS] {
        let Some(m) = find(name) else {
            out.push(Verdict {
                what: name.into(),
                measured: "absent".into(),
                formula: "present".into(),
                mismatch: Some("the daemon holds no such map".into()),
            });
            continue;
        };
        let ok = m.per_cpu() && m.preallocated() && m.max_entries >= u64::from(max_cgroups);
        per_cgroup_cpu += m.memlock as f64 / (m.max_entries.max(1) as f64 * f64::from(cpus));
        out.push(Verdict {
            what: format!("{name} entries"),
            measured: format!(
                "{} ({}, {}preallocated), {:.1} MiB",
                m.max_entries,
                m.map_type,
                if m.preallocated() { "" } else { "not " },
                m.mib()
            ),
            formula: format!("≥ {max_cgroups}, per-CPU, preallocated"),
            mismatch: (!ok).then(|| "not as the formula says".into()),
        });
    }
    let kib = per_cgroup_cpu / 1024.0;
    let f = formula.sched_locks_kib_per_cgroup_per_cpu;
    out.push(Verdict {
        what: format!("{CGROUP_SCHED} + {CGROUP_LOCKS} per cgroup per CPU"),
        measured: format!("{kib:.2} KiB (memlock / max_entries / CPUs)"),
        formula: format!("{f:.2} KiB"),
        mismatch: against(kib, f, f),
    });
    if let Some(m) = find(CGROUP_FUTEX) {
        let b = formula.futex_bytes_per_cgroup_per_cpu;
        let value = m.value_size.div_ceil(8) * 8;
        let mismatch = if m.preallocated() {
            Some("preallocated: the formula says it grows with the active cgroups".into())
        } else {
            against(value as f64, b, b)
        };
        out.push(Verdict {
            what: format!("{CGROUP_FUTEX} per active cgroup per CPU"),
            measured: format!(
                "{value} B (its value; {}preallocated, {:.1} MiB now)",
                if m.preallocated() { "" } else { "not " },
                m.mib()
            ),
            formula: format!("{b:.0} B, not preallocated"),
            mismatch,
        });
    }
    let cap = formula.other_map_cap_mib;
    let others: Vec<&Map> = maps
        .iter()
        .filter(|m| m.per_cpu() && ![CGROUP_SCHED, CGROUP_LOCKS, CGROUP_FUTEX].contains(&&*m.name))
        .collect();
    let biggest = others.iter().max_by_key(|m| m.memlock);
    if let Some(b) = biggest {
        out.push(Verdict {
            what: format!("other per-CPU maps ({}), each", others.len()),
            measured: format!("≤ {:.1} MiB ({})", b.mib(), b.name),
            formula: format!("≤ {cap:.0} MiB"),
            mismatch: (b.mib() > cap * (1.0 + TOLERANCE)).then(|| "above the cap".into()),
        });
    }
    let per_cpu_sum = maps
        .iter()
        .filter(|m| m.per_cpu())
        .map(Map::mib)
        .sum::<f64>();
    let (lo, hi) = formula.per_cpu_mib(cpus);
    let futex = formula.futex_mib(cpus);
    let charged = field("memcg_percpu_mib").filter(|v| v.is_finite());
    out.push(Verdict {
        what: "per-CPU memory charged to the pod's cgroup".into(),
        measured: charged.map_or("not measured".into(), |v| format!("{v:.1} MiB")),
        formula: format!("CGROUP_FUTEX's entries only: 0–{futex:.1} MiB"),
        mismatch: match charged {
            Some(v) if v > futex * (1.0 + TOLERANCE) + 4.0 => {
                Some("more: the preallocated values are charged".into())
            }
            Some(_) => None,
            None => Some("no memory cgroup figures".into()),
        },
    });
    out.push(Verdict {
        what: format!("per-CPU maps, all ({cpus} CPUs)"),
        measured: format!(
            "{per_cpu_sum:.1} MiB memlock; the node's Percpu +{}, the daemon cgroup's percpu {}",
            field("node_percpu_end_mib").map_or("?".into(), |v| format!("{v:.1} MiB")),
            field("memcg_percpu_mib").map_or("?".into(), |v| format!("{v:.1} MiB"))
        ),
        formula: range(lo, hi, "MiB"),
        mismatch: against(per_cpu_sum, lo, hi),
    });
    let (lo, hi) = formula.pod_mib(cpus);
    let formula_text = format!(
        "{:.0} + {:.0} + 0–{futex:.1} (CGROUP_FUTEX) + 0–{:.1} (charge batches) = {}; request \
         {:.0}, limit {:.0} MiB",
        formula.process_mib,
        formula.page_cache_mib,
        formula.charge_batch_mib_per_cpu * f64::from(cpus),
        range(lo, hi, "MiB"),
        formula.request_mib,
        formula.limit_mib
    );
    match field("memcg_peak_mib").filter(|v| v.is_finite()) {
        Some(peak) => {
            let mismatch = if peak > formula.limit_mib {
                Some("above the manifests' memory limit".into())
            } else {
                against(peak, lo, hi)
            };
            out.push(Verdict {
                what: "the pod's memory (its cgroup's memory.peak)".into(),
                measured: format!(
                    "{peak:.1} MiB (now {})",
                    field("memcg_current_mib").map_or("?".into(), |v| format!("{v:.1} MiB"))
                ),
                formula: formula_text,
                mismatch,
            });
        }
        None => out.push(Verdict {
            what: "the pod's memory (its cgroup's memory.peak)".into(),
            measured: "not measured".into(),
            formula: formula_text,
            mismatch: Some("no memory cgroup figures".into()),
        }),
    }
    out
}

/// The report: the daemon's memory, every map, and the verdicts.
pub fn report(
    cpus: u32,
    result: &HashMap<String, String>,
    maps: &[Map],
    verdicts: &[Verdict],
) -> String {
    let v = |k: &str| result.get(k).map_or("?", String::as_str);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{cpus} CPUs, {} cgroups (tracked {}): daemon RSS {} MiB (peak {} MiB); its memory cgroup \
         {} MiB (peak {} MiB): per-CPU {} MiB, other kernel {} MiB, anonymous {} MiB, file {} MiB",
        v("cgroups"),
        v("tracked"),
        v("rss_mib"),
        v("peak_mib"),
        v("memcg_current_mib"),
        v("memcg_peak_mib"),
        v("memcg_percpu_mib"),
        v("memcg_kernel_mib"),
        v("memcg_anon_mib"),
        v("memcg_file_mib"),
    );
    let _ = writeln!(
        s,
        "\n| map | type | value B | max_entries | memlock MiB |\n|---|---|---:|---:|---:|"
    );
    let mut sorted: Vec<&Map> = maps.iter().collect();
    sorted.sort_by_key(|m| std::cmp::Reverse((m.per_cpu(), m.memlock)));
    for m in sorted {
        let _ = writeln!(
            s,
            "| {} | {}{} | {} | {} | {:.2} |",
            m.name,
            m.map_type,
            if m.preallocated() {
                ""
            } else {
                ", no prealloc"
            },
            m.value_size,
            m.max_entries,
            m.mib()
        );
    }
    let _ = writeln!(
        s,
        "\n| what | measured | the formula (deploy/README.md) | |\n|---|---|---|---|"
    );
    for v in verdicts {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            v.what,
            v.measured,
            v.formula,
            v.mismatch
                .as_deref()
                .map_or("ok".to_owned(), |m| format!("**MISMATCH**: {m}"))
        );
    }
    s
}

/// The formula, and what it says for 192 CPUs.
pub fn at_192_cpus(f: &Formula) -> String {
    let (lo, hi) = f.pod_mib(192);
    let (plo, phi) = f.per_cpu_mib(192);
    format!(
        "The formula: the pod {:.0} MiB + {:.0} MiB of page cache + {:.0} B per CPU per cgroup \
         in CGROUP_FUTEX; the node, besides, the per-CPU maps ({}, then {}–{} MiB per CPU). \
         At 192 CPUs: the per-CPU maps {} (node memory), the pod {} (with charge batches); \
         were the per-CPU values charged, {:.0}–{:.0} MiB (limit {:.0} MiB).",
        f.process_mib,
        f.page_cache_mib,
        f.futex_bytes_per_cgroup_per_cpu,
        f.points_as_worded(false),
        f.beyond_mib_per_cpu.0,
        f.beyond_mib_per_cpu.1,
        range(plo, phi, "MiB"),
        range(lo, hi, "MiB"),
        lo + plo,
        lo + phi,
        f.limit_mib
    )
}

/// The ConfigMap's `config.toml`, from the text of deploy/daemonset.yaml.
pub fn configmap_config(daemonset: &str) -> Option<String> {
    let mut lines = daemonset
        .lines()
        .skip_while(|l| l.trim() != "config.toml: |");
    let head = lines.next()?;
    let indent = head.len() - head.trim_start().len() + 2;
    let mut out = String::new();
    for l in lines {
        if l.trim().is_empty() {
            out.push('\n');
            continue;
        }
        if l.len() - l.trim_start().len() < indent {
            break;
        }
        out.push_str(&l[indent..]);
        out.push('\n');
    }
    (!out.trim().is_empty()).then_some(out)
}

/// `max_cgroups = N` of a config file.
fn max_cgroups_of(config: &str) -> Option<u32> {
    config.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == "max_cgroups").then(|| v.trim().parse().ok())?
    })
}

/// The config with the futex probes always attached (`futex_probes = "always"`) instead of on
/// demand: what `CGROUP_FUTEX` takes when every cgroup makes futex calls during a storm.
pub fn with_futex_probes_always(config: &str) -> String {
    let mut out = String::new();
    let mut found = false;
    for l in config.lines() {
        if l.split_once('=')
            .is_some_and(|(k, _)| k.trim() == "futex_probes")
        {
            out.push_str("futex_probes = \"always\"\n");
            found = true;
        } else {
            out.push_str(l);
            out.push('\n');
        }
    }
    if !found {
        out.push_str("futex_probes = \"always\"\n");
    }
    out
}

/// What the guest runs: `exporter_bench` as the pod would run the daemon, outputs into `out`;
/// with `futex`, sleepers that nap in FUTEX_WAIT.
fn script(
    bench: &Path,
    config: &Path,
    out: &Path,
    cgroups: u32,
    seconds: u32,
    futex: bool,
) -> String {
    let q = |p: &Path| sh_quote(&p.display().to_string());
    // Sleepers that wake every 2 s: every cgroup active at every 5 s collection, without
    // 10,000 wake-ups a second to emulate.
    format!(
        "#!/bin/sh\n\
         # Written by `cargo xtask big-node` (xtask/src/big_node.rs).\n\
         OUT={out}\n\
         cd /tmp\n\
         ulimit -n 65536\n\
         uname -r > \"$OUT/uname\"\n\
         cat /proc/self/mountinfo > \"$OUT/mountinfo\"\n\
         cat /sys/devices/system/cpu/possible > \"$OUT/possible\"\n\
         nproc > \"$OUT/nproc\"\n\
         free -m > \"$OUT/free-before\"\n\
         date +%s > \"$OUT/bench.start\"\n\
         timeout -k 10 {timeout} {bench} --cgroups {cgroups} --seconds {seconds} --warmup 10 \
         --interval 5 --scrape-every 15 --sleep-ms 2000 --patience {patience} --memory-cgroup \
         --maps{futex} --config {config} > \"$OUT/bench.out\" 2> \"$OUT/bench.err\"\n\
         echo $? > \"$OUT/bench.rc\"\n\
         date +%s > \"$OUT/bench.end\"\n\
         free -m > \"$OUT/free-after\"\n\
         echo done > \"$OUT/finished\"\n",
        out = q(out),
        bench = q(bench),
        config = q(config),
        timeout = GUEST_BENCH_TIMEOUT.as_secs(),
        patience = PATIENCE.as_secs(),
        futex = if futex { " --futex-sleepers" } else { "" },
    )
}

/// What `cargo xtask big-node` was asked.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub cpus: u32,
    /// QEMU's `-m`.
    pub memory: &'static str,
    pub cgroups: u32,
    pub seconds: u32,
    /// The futex probes always attached and every sleeper in FUTEX_WAIT: `CGROUP_FUTEX` full.
    pub futex: bool,
    /// No guest: the last guest's output judged again.
    pub again: bool,
}

/// How long the daemon may take in the guest to load and to track every cgroup.
const PATIENCE: Duration = Duration::from_secs(40 * 60);
/// How long the benchmark may run in the guest.
const GUEST_BENCH_TIMEOUT: Duration = Duration::from_secs(70 * 60);

/// Builds, boots a guest of `cpus` vCPUs and `memory`, runs the daemon with `cgroups` live
/// cgroups in it, and prints the report; fails when the guest or the benchmark failed (not on
/// a mismatch, which the report flags). With `again`, no guest: the output the last guest of
/// that size left is judged again (after a change of the formula).
pub fn run(series: &'static str, o: Options) -> Result<()> {
    let Options {
        cpus, again, futex, ..
    } = o;
    let kernel = kernels::fetch(series)?;
    let daemonset = std::fs::read_to_string(root().join("deploy/daemonset.yaml"))?;
    let mut config = configmap_config(&daemonset).context("no config.toml in the ConfigMap")?;
    let max_cgroups = max_cgroups_of(&config).context("no max_cgroups in the ConfigMap")?;
    if futex {
        config = with_futex_probes_always(&config);
    }
    let work = kernels::kernels_dir().join("runs").join(format!(
        "big-node-{cpus}{}-{}",
        if futex { "-futex" } else { "" },
        kernel.package
    ));
    let out = work.join("out");
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_default();
    let errors = if again {
        if !out.join("bench.out").is_file() {
            bail!(
                "no output of a guest with {cpus} vCPUs in {}",
                out.display()
            );
        }
        let status = std::os::unix::process::ExitStatusExt::from_raw(0);
        kernels::guest_setup_errors(&out, &status, &work.join("console.log"))
    } else {
        boot(&kernel, &work, &config, o)?
    };
    let stdout = read("bench.out");
    let rc = read("bench.rc");
    if !errors.is_empty() || rc.trim() != "0" {
        let err = read("bench.err");
        let tail: Vec<&str> = err.lines().rev().take(30).collect();
        bail!(
            "{}exporter_bench exited {:?} in the guest; its stdout:\n{stdout}\nthe end of its \
             stderr:\n{}",
            errors.iter().map(|e| format!("{e}\n")).collect::<String>(),
            rc.trim(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    judge(&kernel, &work, o, max_cgroups)
}

/// Builds, then runs the benchmark in a new guest; what is wrong with the guest.
fn boot(kernel: &kernels::Kernel, work: &Path, config: &str, o: Options) -> Result<Vec<String>> {
    let Options {
        cpus,
        memory,
        cgroups,
        seconds,
        futex,
        ..
    } = o;
    say("building stormwatch and exporter_bench (release)");
    run_cmd(cargo().args([
        "build",
        "--release",
        "--package",
        "stormwatch",
        "--package",
        "stormwatch-tests",
        "--bin",
        "stormwatch",
        "--bin",
        "exporter_bench",
        "--bin",
        "sleeper",
    ]))?;
    let out = work.join("out");
    let _ = std::fs::remove_dir_all(work);
    std::fs::create_dir_all(&out)?;
    let config_path = work.join("config.toml");
    std::fs::write(&config_path, config)?;
    let script_path = work.join("guest.sh");
    let bench = root().join("target/release/exporter_bench");
    std::fs::write(
        &script_path,
        script(&bench, &config_path, &out, cgroups, seconds, futex),
    )?;
    let guest = Guest {
        cpus,
        memory,
        timeout: GUEST_BENCH_TIMEOUT + Duration::from_secs(40 * 60),
        // A benchmark of memory, with many vCPUs: a thread each, or it would not boot in time.
        one_host_thread: false,
    };
    let (status, took) = guest.boot(
        kernel,
        work,
        &out,
        &script_path,
        &format!("`stormwatch run` with {cgroups} cgroups"),
    )?;
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_default();
    say(&format!(
        "the guest ran {:.0} s (the benchmark {} s of it)",
        took.as_secs_f64(),
        read("bench.end")
            .trim()
            .parse::<u64>()
            .ok()
            .zip(read("bench.start").trim().parse::<u64>().ok())
            .map_or("?".into(), |(e, s)| e.saturating_sub(s).to_string())
    ));
    Ok(kernels::guest_setup_errors(
        &out,
        &status,
        &work.join("console.log"),
    ))
}

/// The report of a guest's output, against [`MANIFEST`].
fn judge(kernel: &kernels::Kernel, work: &Path, o: Options, max_cgroups: u32) -> Result<()> {
    let Options {
        cpus,
        memory,
        futex,
        ..
    } = o;
    let out = work.join("out");
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_default();
    let stdout = read("bench.out");
    let result = parse_result(&stdout)
        .with_context(|| format!("no `result` line from exporter_bench:\n{stdout}"))?;
    let possible = read("possible");
    let guest_cpus = result
        .get("cpus")
        .and_then(|c| c.parse::<u32>().ok())
        .with_context(|| format!("the guest's CPUs unknown (possible: {possible:?})"))?;
    if guest_cpus != cpus {
        bail!("the guest has {guest_cpus} possible CPUs ({possible:?}), not {cpus}");
    }
    let maps = parse_maps(&stdout);
    let verdicts = compare(&MANIFEST, cpus, max_cgroups, &result, &maps);
    let text = format!(
        "kernel {} ({}), {cpus} vCPUs under emulation, {memory} of memory; the ConfigMap's \
         config (max_cgroups = {max_cgroups}){}\n{}",
        read("uname").trim(),
        kernel.package,
        if futex {
            " but futex_probes = \"always\", every sleeper in FUTEX_WAIT"
        } else {
            ""
        },
        report(cpus, &result, &maps, &verdicts)
    );
    std::fs::write(work.join("report.md"), &text)?;
    println!("{text}");
    println!("{}", at_192_cpus(&MANIFEST));
    let mismatches = verdicts.iter().filter(|v| v.mismatch.is_some()).count();
    say(&format!(
        "{mismatches} mismatch(es) with the formula; the report is also in {}",
        work.join("report.md").display()
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_formula_between_and_beyond_its_points() {
        assert_eq!(MANIFEST.per_cpu_mib(1), (16.0, 16.0));
        assert_eq!(MANIFEST.per_cpu_mib(2), (16.0, 16.0));
        assert_eq!(MANIFEST.per_cpu_mib(96), (156.0, 185.0));
        assert_eq!(MANIFEST.per_cpu_mib(192), (270.0, 329.0));
        let (lo, hi) = MANIFEST.per_cpu_mib(80);
        assert!(
            (lo - 141.0).abs() < 1e-9 && (hi - 165.5).abs() < 1e-9,
            "{lo} {hi}"
        );
        let (lo, hi) = MANIFEST.per_cpu_mib(256);
        assert!(
            (lo - 346.8).abs() < 1e-9 && (hi - 425.0).abs() < 1e-9,
            "{lo} {hi}"
        );
        // 320 B × 96 CPUs × 1,000 cgroups = 29.3 MiB; 0.25 MiB × 96 of charge batches.
        assert!((MANIFEST.futex_mib(96) - 29.297).abs() < 1e-3);
        let (lo, hi) = MANIFEST.pod_mib(96);
        assert!(lo == 94.0 && (hi - 147.297).abs() < 1e-3, "{lo} {hi}");
        let text = at_192_cpus(&MANIFEST);
        assert!(
            text.contains(
                "At 192 CPUs: the per-CPU maps 270.0–329.0 MiB (node memory), the pod \
                           94.0–200.6 MiB (with charge batches); were the per-CPU values \
                           charged, 364–423 MiB (limit 320 MiB)."
            ),
            "{text}"
        );
    }

    /// The figures of [`MANIFEST`] are the ones the manifests state.
    #[test]
    fn the_manifests_state_this_formula() {
        let read = |p: &str| std::fs::read_to_string(root().join(p)).unwrap();
        let readme = read("deploy/README.md").replace('\n', " ");
        let points = MANIFEST.points_as_worded(false);
        assert!(
            readme.contains(&points),
            "deploy/README.md lacks {points:?}"
        );
        let m = &MANIFEST;
        for stated in [
            format!(
                "{:.0} + {:.0} + {:.0} = {:.0} MiB",
                m.process_mib,
                m.per_cpu_mib(96).1,
                m.page_cache_mib,
                m.process_mib + m.per_cpu_mib(96).1 + m.page_cache_mib
            ),
            format!(
                "{}–{} MiB per CPU beyond 192",
                m.beyond_mib_per_cpu.0, m.beyond_mib_per_cpu.1
            ),
            format!(
                "{} KiB per CPU per extra cgroup",
                m.sched_locks_kib_per_cgroup_per_cpu
            ),
            format!(
                "{:.0} B per cgroup per CPU",
                m.futex_bytes_per_cgroup_per_cpu
            ),
            format!(
                "up to 64 pages ({} MiB) per CPU",
                m.charge_batch_mib_per_cpu
            ),
            format!("capped at {:.0} MiB each", m.other_map_cap_mib),
            format!("binary's page cache, {:.0} MiB", m.page_cache_mib),
            format!("requests {:.0}Mi", m.request_mib),
            format!("limited to {:.0}Mi", m.limit_mib),
        ] {
            assert!(
                readme.contains(&stated),
                "deploy/README.md lacks {stated:?}"
            );
        }
        let daemonset = read("deploy/daemonset.yaml");
        let values = read("deploy/helm/stormwatch/values.yaml");
        let short = MANIFEST.points_as_worded(true);
        for (file, text) in [("daemonset.yaml", &daemonset), ("values.yaml", &values)] {
            let flat = text
                .lines()
                .map(|l| l.trim_start().trim_start_matches('#').trim())
                .collect::<Vec<_>>()
                .join(" ");
            assert!(flat.contains(&short), "{file} lacks {short:?}");
            assert!(
                flat.contains(&format!("memory: {:.0}Mi", m.limit_mib)),
                "{file}: the limit"
            );
        }
        let config = configmap_config(&daemonset).expect("the ConfigMap's config.toml");
        assert_eq!(max_cgroups_of(&config), Some(m.max_cgroups));
    }

    #[test]
    fn the_futex_probes_always() {
        let c = "interval_seconds = 5\nfutex_probes = \"on-demand\"\nmax_cgroups = 1000\n";
        assert_eq!(
            with_futex_probes_always(c),
            "interval_seconds = 5\nfutex_probes = \"always\"\nmax_cgroups = 1000\n"
        );
        assert_eq!(
            with_futex_probes_always("max_cgroups = 1000\n"),
            "max_cgroups = 1000\nfutex_probes = \"always\"\n"
        );
        let daemonset = std::fs::read_to_string(root().join("deploy/daemonset.yaml")).unwrap();
        let always = with_futex_probes_always(&configmap_config(&daemonset).unwrap());
        assert_eq!(always.matches("futex_probes").count(), 1, "{always}");
    }

    #[test]
    fn the_configmaps_config() {
        let yaml = "data:\n  # a comment\n  config.toml: |\n    interval_seconds = 5\n    # why\n\n    \
                    max_cgroups = 1000\n---\napiVersion: v1\n";
        let c = configmap_config(yaml).unwrap();
        assert_eq!(c, "interval_seconds = 5\n# why\n\nmax_cgroups = 1000\n");
        assert_eq!(max_cgroups_of(&c), Some(1000));
        assert_eq!(max_cgroups_of("max_cgroups_x = 3\n"), None);
        assert!(configmap_config("data:\n  other: |\n    x\n").is_none());
    }

    const OUT: &str = "\
noise
map id=7 name=CGROUP_SCHED type=percpu_hash key=8 value=856 max_entries=1000 flags=0x0 memlock=82560000
map id=8 name=CGROUP_LOCKS type=percpu_hash key=8 value=112 max_entries=1560 flags=0x0 memlock=16800000
map id=9 name=CGROUP_FUTEX type=percpu_hash key=8 value=320 max_entries=4096 flags=0x1 memlock=66432
map id=10 name=CGROUP_NET type=percpu_hash key=8 value=264 max_entries=662 flags=0x0 memlock=16830000
map id=11 name=TASKS type=task_storage key=4 value=72 max_entries=0 flags=0x1 memlock=480
map id=12 name=HANDOFF_THREADS type=hash key=4 value=40 max_entries=16384 flags=0x1 memlock=263040
result cgroups=1000 tracked=1003 cpus=96 rss_mib=120.5 peak_mib=130.0 memcg_current_mib=230.0 \
memcg_peak_mib=250.0 memcg_percpu_mib=110.0
";

    #[test]
    fn map_lines_and_verdicts() {
        let maps = parse_maps(OUT);
        assert_eq!(maps.len(), 6);
        assert_eq!(
            maps[2],
            Map {
                name: "CGROUP_FUTEX".into(),
                map_type: "percpu_hash".into(),
                value_size: 320,
                max_entries: 4096,
                flags: 1,
                memlock: 66432
            }
        );
        assert!(maps[2].per_cpu() && !maps[2].preallocated());
        assert!(!maps[4].per_cpu() && !maps[5].per_cpu());
        let result = parse_result(OUT).unwrap();
        let v = compare(&MANIFEST, 96, 1000, &result, &maps);
        let find = |w: &str| v.iter().find(|v| v.what.starts_with(w)).unwrap();
        assert!(find("CGROUP_SCHED entries").mismatch.is_none());
        // (82.56e6 / 1000 + 16.8e6 / 1560) / 96 / 1024 = 0.95 KiB, as stated.
        let per = find("CGROUP_SCHED + CGROUP_LOCKS");
        assert!(per.measured.starts_with("0.95 KiB"), "{per:?}");
        assert!(per.mismatch.is_none(), "{per:?}");
        assert!(find("CGROUP_FUTEX").mismatch.is_none());
        assert!(find("other per-CPU maps (1)").mismatch.is_none());
        // 110 MiB of per-CPU memory charged: more than CGROUP_FUTEX could hold (29.3 MiB).
        let charged = find("per-CPU memory charged");
        assert!(
            charged.mismatch.as_deref().unwrap().contains("charged"),
            "{charged:?}"
        );
        // 110.9 MiB of per-CPU maps against 156–185 MiB: the formula is 41% above.
        let all = find("per-CPU maps, all");
        assert!(all.measured.starts_with("110.9 MiB"), "{all:?}");
        assert!(
            all.mismatch.as_deref().unwrap().contains("41% above"),
            "{all:?}"
        );
        // A peak of 250 MiB against 94–147.3 MiB: the formula is 41% below.
        let pod = find("the pod's memory");
        assert!(
            pod.mismatch.as_deref().unwrap().contains("41% BELOW"),
            "{pod:?}"
        );
        let mut low = result.clone();
        low.insert("memcg_peak_mib".into(), "94.3".into());
        low.insert("memcg_percpu_mib".into(), "2.9".into());
        let v = compare(&MANIFEST, 96, 1000, &low, &maps);
        assert!(
            v.iter()
                .filter(|v| v.what.starts_with("the pod's") || v.what.starts_with("per-CPU memory"))
                .all(|v| v.mismatch.is_none()),
            "{v:?}"
        );
        let text = report(96, &result, &maps, &v);
        assert!(
            text.contains("| CGROUP_SCHED | percpu_hash | 856 | 1000 | 78.74 |"),
            "{text}"
        );
        assert!(text.contains("| CGROUP_FUTEX | percpu_hash, no prealloc | 320 | 4096 |"));
        // A peak above the limit is a mismatch whatever the range says.
        let mut over = result.clone();
        over.insert("memcg_peak_mib".into(), "330".into());
        let v = compare(&MANIFEST, 96, 1000, &over, &maps);
        let pod = v.iter().find(|v| v.what.starts_with("the pod's")).unwrap();
        assert!(
            pod.mismatch.as_deref().unwrap().contains("limit"),
            "{pod:?}"
        );
        // Another max_cgroups: said.
        let v = compare(&MANIFEST, 96, 2000, &result, &maps);
        assert!(v[0].what == "max_cgroups" && v[0].mismatch.is_some());
    }
}
