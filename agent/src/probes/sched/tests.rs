use std::collections::{BTreeMap, VecDeque};

use stormwatch_common::SchedCache;

use super::*;

fn cache(generation: u64, cgroup_id: u64, switches: u64, oncpu_ns: u64) -> SchedCache {
    SchedCache {
        generation,
        cgroup_id,
        stats: SchedStats {
            voluntary_switches: switches,
            oncpu_ns,
            ..SchedStats::ZERO
        },
    }
}

#[test]
fn a_read_counts_only_where_no_flush_came_between() {
    let before = [cache(2, 7, 10, 0), cache(4, 9, 3, 0)];
    // The caches grew between the reads: no flush, the later figures are kept.
    assert!(unchanged(&before, &[cache(2, 7, 15, 0), cache(4, 9, 8, 0)]));
    // A flush came between on CPU 1, or was under way when read.
    assert!(!unchanged(
        &before,
        &[cache(2, 7, 15, 0), cache(6, 8, 0, 0)]
    ));
    assert!(!unchanged(
        &before,
        &[cache(2, 7, 15, 0), cache(5, 9, 8, 0)]
    ));
    let under_way = [cache(2, 7, 10, 0), cache(5, 9, 3, 0)];
    assert!(!unchanged(&under_way, &under_way));
}

#[test]
fn caches_add_to_the_cgroups_they_hold() {
    let mut figures = Figures {
        totals: HashMap::from([(
            7,
            SchedStats {
                voluntary_switches: 100,
                oncpu_ns: 1_000,
                ..SchedStats::ZERO
            },
        )]),
        by_cpu: HashMap::from([(7, vec![600, 400])]),
        switches: HashMap::from([(7, vec![60, 40])]),
    };
    // CPU 0 holds 7, CPU 1 holds 9 (not in the map yet: all its switch-outs were cached).
    let caches = [cache(2, 7, 5, 50), cache(2, 9, 8, 80)];
    merge_caches(&caches, &mut figures);
    assert_eq!(figures.totals[&7].voluntary_switches, 105);
    assert_eq!(figures.totals[&7].oncpu_ns, 1_050);
    assert_eq!(figures.totals[&9].voluntary_switches, 8);
    assert_eq!(figures.by_cpu[&7], vec![650, 400]);
    assert_eq!(figures.by_cpu[&9], vec![0, 80]);
    assert_eq!(figures.switches[&9], vec![0, 8]);
    // An empty cache adds nothing.
    let totals = figures.totals.clone();
    merge_caches(&[cache(2, 0, 0, 0), cache(2, 0, 0, 0)], &mut figures);
    assert_eq!(figures.totals, totals);
}

#[test]
fn flushes_are_ordered_only_where_the_cpu_needs_it_and_the_kernel_can() {
    assert!(!flush_with_barriers("x86_64", "6.18.44-fc"));
    assert!(flush_with_barriers("aarch64", "5.18.0"));
    assert!(flush_with_barriers("aarch64", "6.1.0-28-arm64"));
    assert!(!flush_with_barriers("aarch64", "5.15.0-1051-aws"));
    assert!(!flush_with_barriers("aarch64", "garbage"));
    assert!(kernel_at_least("5.18-rc1", (5, 18)));
    assert!(kernel_at_least("10.0.1", (5, 18)));
    assert!(!kernel_at_least("4.19.0", (5, 18)));
}

/// One store of the probes to the maps (`flush` and a switch-out in
/// `ebpf-probes/kernel/src/sched.rs`), in the order the barriers make every CPU see them.
#[derive(Clone, Copy, Debug)]
enum Store {
    /// `bump`: the generation raised by one.
    Bump { cpu: usize },
    /// The cache's figures added to its cgroup's `CGROUP_SCHED` slot.
    Absorb { cpu: usize },
    /// The cache's figures zeroed.
    Zero { cpu: usize },
    /// The cache given to another cgroup.
    Give { cpu: usize, to: u64 },
    /// A switch-out of a thread of `cgroup`, credited to the cache or to the slot.
    Switch { cpu: usize, cgroup: u64 },
}

/// A flush's stores, in the probes' order.
fn flush_stores(cpu: usize, to: u64) -> [Store; 5] {
    [
        Store::Bump { cpu },
        Store::Absorb { cpu },
        Store::Zero { cpu },
        Store::Give { cpu, to },
        Store::Bump { cpu },
    ]
}

/// The probes' maps on a few CPUs, read one load at a time (a CPU's cache slot in three:
/// generation, cgroup, figures; a cgroup's slot on one CPU in one), with the stores of a
/// plan run before the load they are planned for: any interleaving of the probes' stores
/// with the agent's loads can be played.
#[derive(Clone, Debug)]
struct Sim {
    caches: Vec<SchedCache>,
    slots: BTreeMap<u64, Vec<SchedStats>>,
    /// `(load, store)`, by load: the store runs before that load.
    plan: VecDeque<(usize, Store)>,
    loads: usize,
}

impl Sim {
    fn new(caches: Vec<SchedCache>, slots: &[(u64, &[(u64, u64)])]) -> Self {
        let slots = slots
            .iter()
            .map(|&(id, per_cpu)| {
                let per_cpu = per_cpu
                    .iter()
                    .map(|&(switches, oncpu_ns)| cache(0, 0, switches, oncpu_ns).stats)
                    .collect();
                (id, per_cpu)
            })
            .collect();
        Self {
            caches,
            slots,
            plan: VecDeque::new(),
            loads: 0,
        }
    }

    /// A cgroup's `CGROUP_SCHED` slot on one CPU, made (zero) on first use.
    fn slot(&mut self, id: u64, cpu: usize) -> &mut SchedStats {
        let cpus = self.caches.len();
        &mut self
            .slots
            .entry(id)
            .or_insert_with(|| vec![SchedStats::ZERO; cpus])[cpu]
    }

    fn store(&mut self, store: Store) {
        match store {
            Store::Bump { cpu } => self.caches[cpu].generation += 1,
            Store::Absorb { cpu } => {
                let cache = self.caches[cpu];
                if cache.cgroup_id != 0 {
                    self.slot(cache.cgroup_id, cpu).absorb(&cache.stats);
                }
            }
            Store::Zero { cpu } => self.caches[cpu].stats = SchedStats::ZERO,
            Store::Give { cpu, to } => self.caches[cpu].cgroup_id = to,
            Store::Switch { cpu, cgroup } => {
                let one = cache(0, 0, 1, 1_000).stats;
                if self.caches[cpu].cgroup_id == cgroup {
                    self.caches[cpu].stats.absorb(&one);
                } else {
                    self.slot(cgroup, cpu).absorb(&one);
                }
            }
        }
    }

    /// Runs the stores planned before the next load, and counts it.
    fn load(&mut self) {
        while let Some(&(at, store)) = self.plan.front()
            && at <= self.loads
        {
            self.plan.pop_front();
            self.store(store);
        }
        self.loads += 1;
    }

    /// Runs what is left of the plan.
    fn finish(&mut self) {
        while let Some((_, store)) = self.plan.pop_front() {
            self.store(store);
        }
    }

    /// What each cgroup really has now: its slots and the caches that hold it.
    fn truth(&self) -> BTreeMap<u64, (SchedStats, Vec<u64>)> {
        let mut out: BTreeMap<u64, (SchedStats, Vec<u64>)> = BTreeMap::new();
        let cpus = self.caches.len();
        let mut add = |id: u64, cpu: usize, v: &SchedStats| {
            let e = out
                .entry(id)
                .or_insert_with(|| (SchedStats::ZERO, vec![0; cpus]));
            e.0.absorb(v);
            e.1[cpu] += v.oncpu_ns;
        };
        for (id, per_cpu) in &self.slots {
            per_cpu
                .iter()
                .enumerate()
                .for_each(|(cpu, v)| add(*id, cpu, v));
        }
        for (cpu, c) in self.caches.iter().enumerate() {
            if c.cgroup_id != 0 {
                add(c.cgroup_id, cpu, &c.stats);
            }
        }
        out
    }
}

impl SwitchMaps for Sim {
    fn caches(&mut self) -> anyhow::Result<Vec<SchedCache>> {
        let mut out = Vec::new();
        for cpu in 0..self.caches.len() {
            self.load();
            let generation = self.caches[cpu].generation;
            self.load();
            let cgroup_id = self.caches[cpu].cgroup_id;
            self.load();
            let stats = self.caches[cpu].stats;
            out.push(SchedCache {
                generation,
                cgroup_id,
                stats,
            });
        }
        Ok(out)
    }

    fn cgroups(&mut self, figures: &mut Figures) -> anyhow::Result<()> {
        let ids: Vec<u64> = self.slots.keys().copied().collect();
        for id in ids {
            let mut per_cpu = Vec::new();
            for cpu in 0..self.caches.len() {
                self.load();
                per_cpu.push(self.slots[&id][cpu]);
            }
            let total = figures.add_cgroup(id, &per_cpu);
            figures.totals.insert(id, total);
        }
        Ok(())
    }
}

/// A read as [`read`] returns it: per cgroup, its figures and its on-CPU time per CPU.
fn figures_of(merged: &Merged) -> BTreeMap<u64, (SchedStats, Vec<u64>)> {
    merged
        .totals
        .iter()
        .map(|(id, t)| (*id, (*t, merged.by_cpu[id].clone())))
        .collect()
}

/// Two CPUs: CPU 0's cache holds cgroup 7, which has figures in the map too; CPU 1's holds
/// 9, which has none there yet (all its switch-outs were cached).
fn two_cpus() -> Sim {
    Sim::new(
        vec![cache(2, 7, 50, 5_000), cache(4, 9, 30, 3_000)],
        &[(7, &[(100, 10_000), (20, 2_000)])],
    )
}

/// Every way to place `n` stores before loads `0..=last`, in order (each placement's loads).
fn placements(n: usize, last: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for rest in placements(n - 1, last) {
        let from = rest.last().copied().unwrap_or(0);
        for at in from..=last {
            let mut p = rest.clone();
            p.push(at);
            out.push(p);
        }
    }
    out
}

/// The reader's loads in a read that finds nothing moved: the caches (3 loads per CPU)
/// three times and the map (cgroup 7 on 2 CPUs).
const LOADS_PER_READ: usize = 3 * 6 + 2;

/// Every interleaving of a flush's stores with a read: the read either waits for a quiet
/// moment or returns exactly what the cgroups have (a flush only moves figures), never a
/// cgroup's figures short or doubled. CPU 0 moves its cache from 7 to 9; CPU 1 gives up 9's,
/// whose map entry the flush creates in the middle of the read.
#[test]
fn a_flush_anywhere_in_a_read_moves_no_cgroups_figures() {
    let truth = two_cpus().truth();
    let mut reads = 0;
    for (cpu, to) in [(0, 9), (1, 0)] {
        for at in placements(5, LOADS_PER_READ) {
            let mut sim = two_cpus();
            sim.plan = at.into_iter().zip(flush_stores(cpu, to)).collect();
            let merged = read_merged(&mut sim).expect("a read once the flush is over");
            assert_eq!(
                figures_of(&merged),
                truth,
                "flush of CPU {cpu} to {to}, stores before loads {:?}",
                sim.plan
            );
            sim.finish();
            assert_eq!(sim.truth(), truth);
            reads += 1;
        }
    }
    assert_eq!(
        reads,
        2 * 53_130,
        "every placement of 5 stores before 21 loads"
    );
}

/// The same adversary against the read this replaced (the caches before and after the map,
/// the copy merged the later one): a flush that falls inside one CPU's copy, after its
/// generation and before its figures, makes that cgroup's figures dip. The test above would
/// have caught it.
#[test]
fn the_adversary_catches_a_read_that_checks_the_generation_only_before_the_figures() {
    fn read_once(sim: &mut Sim) -> Option<Figures> {
        let before = sim.caches().unwrap();
        let mut figures = Figures::default();
        sim.cgroups(&mut figures).unwrap();
        let after = sim.caches().unwrap();
        if !unchanged(&before, &after) {
            return None;
        }
        merge_caches(&after, &mut figures);
        Some(figures)
    }
    let truth = two_cpus().truth();
    let dips = placements(5, LOADS_PER_READ)
        .into_iter()
        .filter(|at| {
            let mut sim = two_cpus();
            sim.plan = at.iter().copied().zip(flush_stores(0, 9)).collect();
            read_once(&mut sim).is_some_and(|read| {
                read.totals[&7].voluntary_switches < truth[&7].0.voluntary_switches
            })
        })
        .count();
    assert!(dips > 0, "no interleaving found the old race");
}

/// A long run of switch-outs and flushes on three CPUs, the stores of each flush spread over
/// the reads (a fixed pseudo-random plan): no cgroup's counter, in total or on one CPU,
/// ever goes down from one read to the next, and each read lies between what the cgroups
/// had when it began and when it ended.
#[test]
fn no_cgroups_counters_go_down_while_caches_flush_during_reads() {
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let cgroups = [7, 9, 11];
    let mut sim = Sim::new(
        vec![cache(0, 0, 0, 0); 3],
        &[(7, &[(0, 0); 3]), (9, &[(0, 0); 3])],
    );
    let mut last: BTreeMap<u64, (SchedStats, Vec<u64>)> = BTreeMap::new();
    let (mut reads, mut flushes) = (0, 0);
    for _ in 0..2_000 {
        // Plan the next stretch: switch-outs everywhere, and a flush on some CPU whose
        // stores are spread over the next ~40 loads.
        let start = sim.loads;
        let mut plan: Vec<(usize, Store)> = (0..20)
            .map(|_| {
                let store = Store::Switch {
                    cpu: next(3) as usize,
                    cgroup: cgroups[next(3) as usize],
                };
                (start + next(40) as usize, store)
            })
            .collect();
        let (cpu, to) = (next(3) as usize, [0, 7, 9, 11][next(4) as usize]);
        let mut at: Vec<usize> = (0..5).map(|_| start + next(40) as usize).collect();
        at.sort_unstable();
        plan.extend(at.into_iter().zip(flush_stores(cpu, to)));
        plan.sort_by_key(|(at, _)| *at);
        sim.plan.extend(plan);
        flushes += 1;

        let began = sim.truth();
        let Ok(merged) = read_merged(&mut sim) else {
            continue;
        };
        let ended = sim.truth();
        let read = figures_of(&merged);
        for (id, (stats, by_cpu)) in &read {
            let high = counters(&ended[id].0);
            let low = began.get(id).map(|l| counters(&l.0));
            let was = last.get(id);
            let was_counters = was.map(|w| counters(&w.0));
            for (k, (name, v)) in counters(stats).into_iter().enumerate() {
                assert!(v <= high[k].1, "cgroup {id} {name}: {v} > {}", high[k].1);
                if let Some(low) = low {
                    assert!(v >= low[k].1, "cgroup {id} {name}: {v} < {}", low[k].1);
                }
                if let Some(then) = was_counters {
                    assert!(
                        v >= then[k].1,
                        "cgroup {id} {name} went down: {v} < {}",
                        then[k].1
                    );
                }
            }
            if let Some(was) = was {
                for (cpu, (now, then)) in by_cpu.iter().zip(&was.1).enumerate() {
                    assert!(now >= then, "cgroup {id} on CPU {cpu}: {now} < {then}");
                }
            }
        }
        for id in last.keys() {
            assert!(read.contains_key(id), "cgroup {id} vanished from a read");
        }
        last = read;
        reads += 1;
    }
    sim.finish();
    assert!(
        reads > 1_000,
        "{reads} reads of {flushes} flushes succeeded"
    );
}

/// The counters a read must never take back (those the simulation moves).
fn counters(s: &SchedStats) -> [(&'static str, u64); 2] {
    [
        ("voluntary_switches", s.voluntary_switches),
        ("oncpu_ns", s.oncpu_ns),
    ]
}

#[test]
fn a_cache_follows_the_busiest_cgroup_of_its_cpu_with_hysteresis() {
    let then = HashMap::from([(7, vec![0, 0]), (9, vec![0, 0])]);
    // CPU 0: 7 switched out 5,000 times, 9 only 100; CPU 1: nobody reached the minimum.
    let now = HashMap::from([(7, vec![5_000, 10]), (9, vec![100, 900])]);
    assert_eq!(choose_caches(&[0, 0], &then, &now), vec![7, 0]);
    // Held by 9 on CPU 0: 7 switched out more than twice as often, so the cache moves.
    assert_eq!(choose_caches(&[9, 9], &then, &now), vec![7, 9]);
    // Not when the held one keeps up: 7's 5,000 against 9's 3,000 keeps 9.
    let close = HashMap::from([(7, vec![5_000, 0]), (9, vec![3_000, 0])]);
    assert_eq!(choose_caches(&[9, 0], &then, &close), vec![9, 0]);
    // What counts is the growth since the last read, not the totals.
    let later = HashMap::from([(7, vec![5_200, 10]), (9, vec![4_100, 900])]);
    assert_eq!(choose_caches(&[7, 0], &now, &later), vec![9, 0]);
}
