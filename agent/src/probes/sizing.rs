//! Sizing the maps: how many entries each per-CPU map gets for the host's CPUs and the
//! followed cgroups, within a memory budget.

use super::*;
use stormwatch_common::{HotFutexKey, HotFutexValue, LockSiteKey, LockSiteValue};

/// Kernel memory each preallocated per-CPU map may take. Per-CPU hash maps are preallocated
/// for every possible CPU unless created with `BPF_F_NO_PREALLOC`: `HOT_FUTEXES` at its
/// 8192-entry default is 64 B × 8192 × CPUs. A node agent must not take that on a big host, so
/// the capacity of the preallocated maps shrinks with the CPU count; what does not fit is
/// counted (`hot_futex_full`, `lock_site_full`, …).
pub const PER_CPU_MAP_BUDGET_BYTES: u64 = 16 << 20;

/// No map is made smaller than this many entries, whatever the CPU count.
pub(super) const PER_CPU_MAP_MIN_ENTRIES: u32 = 512;

/// The per-cgroup maps hold at least this many cgroups (and at least `max_cgroups`).
pub const CGROUP_MAP_MIN_ENTRIES: u32 = 4096;

/// `(map, max_entries)` for each per-CPU hash map, given the number of possible CPUs and the
/// most cgroups the agent is asked to follow. The per-cgroup maps always hold at least
/// `max_cgroups`, whatever the CPU count: `CGROUP_FUTEX` is not preallocated (its memory follows
/// the cgroups that exist) and holds `max(max_cgroups, 4096)`; `CGROUP_SCHED` and
/// `CGROUP_LOCKS` must be preallocated (their programs run where the kernel's allocator cannot
/// refill), so they take the budget's fit but never fewer than `max_cgroups`: on a many-CPU
/// host a large `max_cgroups` costs kernel memory (`CGROUP_SCHED`: 856 B per cgroup per CPU).
pub fn per_cpu_map_sizes(cpus: u32, max_cgroups: usize) -> Vec<(&'static str, u32)> {
    plan(cpus, max_cgroups)
        .into_iter()
        .map(|m| (m.name, m.entries))
        .collect()
}

/// The kernel memory the preallocated per-CPU maps take on a host with `cpus` possible CPUs
/// (their values, one per CPU per entry; keys and the kernel's own overhead left out): what
/// `max_cgroups` costs the node before any cgroup exists.
pub fn preallocated_bytes(cpus: u32, max_cgroups: usize) -> u64 {
    plan(cpus, max_cgroups)
        .iter()
        .filter(|m| m.preallocated)
        .map(|m| u64::from(m.entries) * m.per_cpu_bytes as u64 * u64::from(cpus.max(1)))
        .sum::<u64>()
        + slot_bytes_per_cpu() * u64::from(cpus.max(1))
}

/// The direct slots' per-CPU arrays (`stormwatch_common::slots`), per CPU: a fixed
/// [`SLOTS`](stormwatch_common::slots::SLOTS) values each, whatever `max_cgroups`.
fn slot_bytes_per_cpu() -> u64 {
    use std::mem::size_of;
    use stormwatch_common::{FutexStats, LockStats, SchedStats, net, slots::SLOTS};
    let values = size_of::<SchedStats>()
        + size_of::<FutexStats>()
        + size_of::<LockStats>()
        + size_of::<net::CgroupNetStats>()
        + size_of::<net::NetIfStats>()
        + size_of::<net::NetDropStats>();
    u64::from(SLOTS) * values as u64
}

/// One per-CPU hash map's size.
struct MapPlan {
    name: &'static str,
    entries: u32,
    /// Bytes per entry per CPU: the value (keys are stored once).
    per_cpu_bytes: usize,
    /// A per-CPU map allocated whole when it is made (every one but `CGROUP_FUTEX`;
    /// `NET_IFINFO` is not per-CPU).
    preallocated: bool,
}

fn plan(cpus: u32, max_cgroups: usize) -> Vec<MapPlan> {
    use std::mem::size_of;
    use stormwatch_common::{FutexStats, LockStats, SchedStats, net};
    let cgroups = u32::try_from(max_cgroups)
        .unwrap_or(u32::MAX)
        .max(CGROUP_MAP_MIN_ENTRIES);
    let per_cpu = |value: usize, key: usize| value + key / cpus.max(1) as usize;
    // (map, default entries, bytes per entry per CPU: the value; keys are stored once)
    let preallocated = [
        (
            maps::HOT_FUTEXES,
            8192,
            per_cpu(size_of::<HotFutexValue>(), size_of::<HotFutexKey>()),
        ),
        (
            maps::LOCK_SITES,
            4096,
            per_cpu(size_of::<LockSiteValue>(), size_of::<LockSiteKey>()),
        ),
        (
            maps::RUNQ_BLAME,
            4096,
            per_cpu(
                size_of::<stormwatch_common::RunqBlameValue>(),
                size_of::<stormwatch_common::RunqBlameKey>(),
            ),
        ),
        (
            net::maps::CGROUP_NET,
            4096,
            size_of::<net::CgroupNetStats>(),
        ),
        (
            net::maps::NET_IFACES,
            4096,
            per_cpu(size_of::<net::NetIfStats>(), size_of::<net::NetIfKey>()),
        ),
        (
            net::maps::NET_DROPS,
            4096,
            per_cpu(size_of::<net::NetDropStats>(), size_of::<net::NetDropKey>()),
        ),
    ];
    let fit = |default: u32, per_cpu_bytes: usize| {
        let fit = PER_CPU_MAP_BUDGET_BYTES / (per_cpu_bytes as u64 * u64::from(cpus.max(1)));
        fit.clamp(u64::from(PER_CPU_MAP_MIN_ENTRIES), u64::from(default)) as u32
    };
    let max_cgroups = u32::try_from(max_cgroups).unwrap_or(u32::MAX);
    let map = |name, entries, per_cpu_bytes, preallocated| MapPlan {
        name,
        entries,
        per_cpu_bytes,
        preallocated,
    };
    let sched = size_of::<SchedStats>();
    let locks = size_of::<LockStats>();
    [
        map(maps::CGROUP_FUTEX, cgroups, size_of::<FutexStats>(), false),
        map(
            maps::CGROUP_SCHED,
            fit(4096, sched).max(max_cgroups),
            sched,
            true,
        ),
        map(
            maps::CGROUP_LOCKS,
            fit(4096, locks).max(max_cgroups),
            locks,
            true,
        ),
    ]
    .into_iter()
    .chain(
        preallocated
            .iter()
            .map(|&(name, default, bytes)| map(name, fit(default, bytes), bytes, true)),
    )
    // One entry per interface in NET_IFACES: the same bound.
    .chain(
        preallocated
            .iter()
            .find(|p| p.0 == net::maps::NET_IFACES)
            .map(|&(_, default, bytes)| {
                map(
                    net::maps::NET_IFINFO,
                    fit(default, bytes),
                    size_of::<net::NetIfInfo>(),
                    false,
                )
            }),
    )
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(sizes: &[(&str, u32)], map: &str) -> u32 {
        sizes.iter().find(|(m, _)| *m == map).unwrap().1
    }

    #[test]
    fn cgroup_maps_hold_max_cgroups_on_any_cpu_count() {
        for cpus in [1, 2, 56, 1024] {
            for max_cgroups in [10, 2000, 100_000] {
                let sizes = per_cpu_map_sizes(cpus, max_cgroups);
                for map in [maps::CGROUP_SCHED, maps::CGROUP_FUTEX, maps::CGROUP_LOCKS] {
                    let n = entries(&sizes, map);
                    assert!(n as usize >= max_cgroups, "{map} {n} on {cpus} CPUs");
                    assert!(n >= PER_CPU_MAP_MIN_ENTRIES, "{map} {n}");
                }
                let futex = entries(&sizes, maps::CGROUP_FUTEX);
                assert!(futex >= CGROUP_MAP_MIN_ENTRIES, "not preallocated: {futex}");
            }
        }
    }

    #[test]
    fn the_memory_of_max_cgroups_is_its_per_cpu_values() {
        use std::mem::size_of;
        use stormwatch_common::{LockStats, SchedStats};
        // Within the budget's fit, max_cgroups costs nothing more.
        assert_eq!(preallocated_bytes(2, 10), preallocated_bytes(2, 2000));
        // Past it, every cgroup preallocates a SchedStats and a LockStats per CPU.
        let per_cgroup = (size_of::<SchedStats>() + size_of::<LockStats>()) as u64;
        let grown = preallocated_bytes(2, 1_000_000) - preallocated_bytes(2, 100_000);
        assert_eq!(grown, 900_000 * per_cgroup * 2);
        // The figure: 1,000,000 cgroups on 2 CPUs came to 1.85 GB of kernel memory.
        let gb = preallocated_bytes(2, 1_000_000) as f64 / 1e9;
        assert!((1.5..2.2).contains(&gb), "{gb} GB");
    }

    #[test]
    fn the_direct_slots_cost_tens_of_kib_a_cpu() {
        let per_cpu = slot_bytes_per_cpu();
        assert!((16 << 10..256 << 10).contains(&per_cpu), "{per_cpu} B");
        assert_eq!(
            preallocated_bytes(56, 2000) - plan_bytes(56, 2000),
            per_cpu * 56
        );
    }

    fn plan_bytes(cpus: u32, max_cgroups: usize) -> u64 {
        plan(cpus, max_cgroups)
            .iter()
            .filter(|m| m.preallocated)
            .map(|m| u64::from(m.entries) * m.per_cpu_bytes as u64 * u64::from(cpus))
            .sum()
    }

    #[test]
    fn preallocated_maps_shrink_with_the_cpu_count() {
        let small = per_cpu_map_sizes(2, 2000);
        assert!(small.iter().all(|(_, n)| *n >= 4096), "{small:?}");
        let hot = entries(&per_cpu_map_sizes(56, 2000), maps::HOT_FUTEXES);
        assert!((PER_CPU_MAP_MIN_ENTRIES..8192).contains(&hot), "{hot}");
        let bytes = u64::from(hot) * 40 * 56;
        assert!(bytes <= PER_CPU_MAP_BUDGET_BYTES, "{bytes}");
        let huge = entries(&per_cpu_map_sizes(1024, 2000), maps::HOT_FUTEXES);
        assert_eq!(huge, PER_CPU_MAP_MIN_ENTRIES, "never below the floor");
    }
}
