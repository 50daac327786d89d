//! Reading and pruning the probes' maps: per-CPU hashes folded over CPUs, keys deleted, idle
//! keys of the bounded maps found, the programs' run-time statistics.

use super::*;

/// A BPF program's figures from the kernel's run-time statistics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramStats {
    pub program: String,
    pub runs: u64,
    pub run_ns: u64,
}

impl Probes {
    /// Run counts and times of the loaded programs (the kernel counts them while BPF
    /// statistics are on), by program name. Programs of the object that were not loaded are
    /// left out.
    pub fn program_stats(&self) -> Vec<ProgramStats> {
        let mut out: Vec<ProgramStats> = self
            .ebpf
            .programs()
            .filter_map(|(name, program)| {
                let info = program.info().ok()?;
                Some(ProgramStats {
                    program: name.to_owned(),
                    runs: info.run_count(),
                    run_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
                })
            })
            .collect();
        out.sort_by(|a, b| a.program.cmp(&b.program));
        out
    }

    /// Each network namespace's owning cgroup (the namespace inode → cgroup id the receive
    /// probe counts for), and the interfaces the probes keep figures for.
    pub fn network_keys(
        &self,
    ) -> (
        HashMap<u32, u64>,
        std::collections::HashSet<stormwatch_common::net::NetIfKey>,
    ) {
        (net::netns_owners(&self.ebpf), net::iface_keys(&self.ebpf))
    }
}

/// Reads after which an entry of a bounded map that has not moved is deleted.
pub const IDLE_READS_BEFORE_EVICTION: u32 = 60;

/// For a bounded map the agent prunes: how many reads in a row each key's count stayed put.
#[derive(Debug)]
pub struct IdleKeys<K> {
    seen: HashMap<K, (u64, u32)>,
    limit: u32,
}

impl<K: Copy + Eq + Hash> IdleKeys<K> {
    pub fn new(limit: u32) -> Self {
        Self {
            seen: HashMap::new(),
            limit,
        }
    }

    /// Takes this read's `(key, count)`s; returns the keys idle for `limit` reads in a row
    /// (forgotten here: the caller deletes them). Keys no longer in the map are forgotten too.
    pub fn idle(&mut self, now: impl Iterator<Item = (K, u64)>) -> Vec<K> {
        let mut next = HashMap::new();
        let mut idle = Vec::new();
        for (key, count) in now {
            let reads = match self.seen.get(&key) {
                Some((was, reads)) if *was == count => reads + 1,
                _ => 0,
            };
            if reads >= self.limit {
                idle.push(key);
            } else {
                next.insert(key, (count, reads));
            }
        }
        self.seen = next;
        idle
    }
}

/// Reads named slots of a per-CPU counter array, each summed over CPUs; nothing when the map
/// is missing (its family is not in the object).
pub(crate) fn read_counters(
    ebpf: &Ebpf,
    map: &str,
    slots: impl Iterator<Item = (u32, &'static str)>,
) -> Vec<(&'static str, u64)> {
    let Some(array) = ebpf
        .map(map)
        .and_then(|m| PerCpuArray::<_, u64>::try_from(m).ok())
    else {
        return Vec::new();
    };
    slots
        .map(|(index, name)| {
            let total = array
                .get(&index, 0)
                .map(|values| values.iter().sum())
                .unwrap_or(0);
            (name, total)
        })
        .collect()
}

/// Reads a per-CPU hash map into one value per key, folding the CPUs' values with `fold`.
pub(crate) fn read_per_cpu_hash<K, V>(
    ebpf: &Ebpf,
    name: &str,
    zero: V,
    fold: impl Fn(&mut V, &V),
) -> anyhow::Result<HashMap<K, V>>
where
    K: Pod + Eq + Hash,
    V: Pod,
{
    read_per_cpu_hash_with(ebpf, name, |_, per_cpu: &PerCpuValues<V>| {
        let mut total = zero;
        for v in per_cpu.iter() {
            fold(&mut total, v);
        }
        total
    })
}

/// Reads a per-CPU hash map into one value per key, made by `value` from the key's per-CPU
/// values.
pub(crate) fn read_per_cpu_hash_with<K, V, T>(
    ebpf: &Ebpf,
    name: &str,
    mut value: impl FnMut(&K, &PerCpuValues<V>) -> T,
) -> anyhow::Result<HashMap<K, T>>
where
    K: Pod + Eq + Hash,
    V: Pod,
{
    let map = ebpf
        .map(name)
        .ok_or_else(|| anyhow::anyhow!("map {name} missing from the object"))?;
    let map = PerCpuHashMap::<_, K, V>::try_from(map)?;
    // A few syscalls per map instead of two per key; key by key where the kernel cannot.
    match batch::read_per_cpu_hash_with(aya::maps::IterableMap::map(&map), &mut value) {
        Err(batch::BatchError::Unsupported) => {}
        read => return Ok(read?),
    }
    let mut out = HashMap::new();
    for entry in map.iter() {
        let (key, per_cpu) = entry?;
        let v = value(&key, &per_cpu);
        out.insert(key, v);
    }
    Ok(out)
}

/// Removes the keys matching `gone` from a per-CPU hash map (a walk of the whole map: for
/// predicates; to remove known keys, [`remove_per_cpu_keys`]).
pub(crate) fn remove_per_cpu_matching<K, V>(
    ebpf: &mut Ebpf,
    name: &str,
    gone: impl Fn(&K) -> bool,
) -> usize
where
    K: Pod,
    V: Pod,
{
    let Some(mut map) = per_cpu_hash_mut::<K, V>(ebpf, name) else {
        return 0;
    };
    let doomed: Vec<K> = map
        .keys()
        .filter_map(Result::ok)
        .filter(|k| gone(k))
        .collect();
    doomed.iter().filter(|key| map.remove(key).is_ok()).count()
}

/// A per-CPU hash map of the object, to modify; `None` when its family is not in the object.
pub(super) fn per_cpu_hash_mut<'a, K: Pod, V: Pod>(
    ebpf: &'a mut Ebpf,
    name: &str,
) -> Option<PerCpuHashMap<&'a mut aya::maps::MapData, K, V>> {
    PerCpuHashMap::try_from(ebpf.map_mut(name)?).ok()
}

/// Removes the given keys from a per-CPU hash map, each by key (no walk); returns how many were
/// there.
pub(crate) fn remove_per_cpu_keys<K, V>(ebpf: &mut Ebpf, name: &str, keys: &[K]) -> usize
where
    K: Pod,
    V: Pod,
{
    let Some(mut map) = per_cpu_hash_mut::<K, V>(ebpf, name) else {
        return 0;
    };
    keys.iter().filter(|key| map.remove(key).is_ok()).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_keys_are_those_unchanged_for_the_limit() {
        let mut idle = IdleKeys::new(2);
        assert!(idle.idle([(1, 5), (2, 7)].into_iter()).is_empty());
        assert!(idle.idle([(1, 5), (2, 8)].into_iter()).is_empty());
        // Key 1 unchanged for its second read in a row after the first: idle now.
        assert_eq!(idle.idle([(1, 5), (2, 9)].into_iter()), vec![1]);
        // Forgotten once reported; a key gone from the map is forgotten too.
        assert!(idle.idle([(2, 9)].into_iter()).is_empty());
        assert_eq!(idle.idle([(2, 9)].into_iter()), vec![2]);
    }
}
