//! The agent's half of the direct slots (`stormwatch_common::slots`): per family, which key
//! each slot holds, written to the family's directory map; each placed key's figures read from
//! its slot and added to its hash entry's.
//!
//! At each read a family reads its hash, then [`SlotDirectory::merge`]s: the slots released at
//! the read before are zeroed, then free (no program still counts there for the old key); the
//! placed keys' slots are added to what the hash holds; and the keys without a slot yet are
//! placed, most active first, where their slot is free. A key
//! keeps its slot until it is gone ([`SlotDirectory::release`], from the family's forget):
//! a slot is never taken from a live key, so figures never move between the two places.

use std::collections::HashMap;

use aya::{
    Ebpf, Pod,
    maps::{Array, PerCpuArray, PerCpuValues},
};
use stormwatch_common::slots::{SLOTS, slot_of};

use crate::counters::Counters;

/// One family's directory: the key each slot holds.
#[derive(Debug)]
pub struct SlotDirectory {
    /// The directory map (`Array<u64>`) and the slots' per-CPU array.
    dir_map: &'static str,
    slots_map: &'static str,
    /// By slot: the key placed there (0: free).
    held: Vec<u64>,
    /// Slots released since the last read: zeroed and freed at the next.
    released: Vec<u32>,
}

impl SlotDirectory {
    pub fn new(dir_map: &'static str, slots_map: &'static str) -> Self {
        Self {
            dir_map,
            slots_map,
            held: vec![0; SLOTS as usize],
            released: Vec::new(),
        }
    }

    /// The keys placed, with their slots.
    pub fn placed(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        (0u32..)
            .zip(self.held.iter().copied())
            .filter(|(_, key)| *key != 0)
    }

    /// Where each of `keys` (most active first) would go: free slots, each to the first key
    /// that maps there and has none yet. Released slots are not free until recycled.
    fn plan(&self, keys: impl IntoIterator<Item = u64>) -> Vec<(u32, u64)> {
        let mut taken: Vec<bool> = self.held.iter().map(|k| *k != 0).collect();
        for slot in &self.released {
            taken[*slot as usize] = true;
        }
        let mut out = Vec::new();
        for key in keys {
            let slot = slot_of(key);
            // A placed key is in its own slot: `taken` covers it too.
            if key == 0 || taken[slot as usize] {
                continue;
            }
            taken[slot as usize] = true;
            out.push((slot, key));
        }
        out
    }

    /// Places `keys` (most active first) in their slots where free; a key whose slot another
    /// holds stays in the hash.
    fn place(&mut self, ebpf: &mut Ebpf, keys: impl IntoIterator<Item = u64>) {
        let plan = self.plan(keys);
        if plan.is_empty() {
            return;
        }
        let Some(Ok(mut dir)) = ebpf.map_mut(self.dir_map).map(Array::<_, u64>::try_from) else {
            return;
        };
        for (slot, key) in plan {
            if dir.set(slot, &key, 0).is_ok() {
                self.held[slot as usize] = key;
            }
        }
    }

    /// Releases the slots of the keys for which `gone` holds: the directory forgets them now,
    /// their slots are zeroed and freed at the next read ([`SlotDirectory::merge`]).
    pub fn release(&mut self, ebpf: &mut Ebpf, gone: impl Fn(u64) -> bool) {
        let doomed: Vec<u32> = self
            .placed()
            .filter(|(_, key)| gone(*key))
            .map(|(slot, _)| slot)
            .collect();
        if doomed.is_empty() {
            return;
        }
        let Some(Ok(mut dir)) = ebpf.map_mut(self.dir_map).map(Array::<_, u64>::try_from) else {
            return;
        };
        for slot in doomed {
            if dir.set(slot, &0, 0).is_ok() {
                self.held[slot as usize] = 0;
                self.released.push(slot);
            }
        }
    }

    /// A family's read of one map: `part` holds what its hash map holds; this adds each placed
    /// key's slot (its CPUs' values summed), then places the keys of `part` that have no slot
    /// yet, the most active first. `word` is a key as the directory holds it (0: never placed),
    /// `key` its inverse.
    pub fn merge<K, V>(
        &mut self,
        ebpf: &mut Ebpf,
        part: &mut HashMap<K, V>,
        word: impl Fn(&K) -> u64,
        key: impl Fn(u64) -> K,
        activity: impl Fn(&V) -> u64,
    ) -> anyhow::Result<()>
    where
        K: Eq + std::hash::Hash,
        V: Counters + Pod,
    {
        let busiest = busiest_first(part.iter().map(|(k, v)| (word(k), activity(v))));
        self.merge_each_cpu(ebpf, busiest, |w, values: &[V]| {
            let total = part.entry(key(w)).or_insert(V::ZERO);
            for v in values {
                total.add(v);
            }
        })
    }

    /// [`SlotDirectory::merge`] for a map keyed by cgroup id (a cgroup id is its own word).
    pub fn merge_cgroups<V: Counters + Pod>(
        &mut self,
        ebpf: &mut Ebpf,
        part: &mut HashMap<u64, V>,
        activity: impl Fn(&V) -> u64,
    ) -> anyhow::Result<()> {
        self.merge(ebpf, part, |id| *id, |id| id, activity)
    }

    /// The read behind [`SlotDirectory::merge`], for a family that keeps its figures per CPU:
    /// the slots released at the read before are zeroed and freed; `add` gets each placed
    /// key's word and its slot's values, one per CPU; then `busiest` (words of the keys the
    /// family's hash holds, most active first) are placed where their slot is free.
    pub fn merge_each_cpu<V: Counters + Pod>(
        &mut self,
        ebpf: &mut Ebpf,
        busiest: Vec<u64>,
        mut add: impl FnMut(u64, &[V]),
    ) -> anyhow::Result<()> {
        self.recycle::<V>(ebpf);
        if self.placed().next().is_some() {
            let slots = ebpf
                .map(self.slots_map)
                .ok_or_else(|| anyhow::anyhow!("map {} missing from the object", self.slots_map))?;
            let slots = PerCpuArray::<_, V>::try_from(slots)?;
            for (slot, word) in self.placed() {
                add(word, &slots.get(&slot, 0)?);
            }
        }
        self.place(ebpf, busiest);
        Ok(())
    }

    /// Zeroes the slots released before this read and frees them. A slot whose zeroing fails
    /// stays released (tried again at the next read), never given to another key with the old
    /// one's figures in it.
    fn recycle<V: Counters + Pod>(&mut self, ebpf: &mut Ebpf) {
        if self.released.is_empty() {
            return;
        }
        let Some(Ok(mut slots)) = ebpf
            .map_mut(self.slots_map)
            .map(PerCpuArray::<_, V>::try_from)
        else {
            return;
        };
        let cpus = aya::util::nr_cpus().map_or(1, |n| n.get() as usize);
        self.released.retain(|slot| {
            let Ok(values) = PerCpuValues::try_from(vec![V::ZERO; cpus]) else {
                return true;
            };
            slots.set(*slot, values, 0).is_err()
        });
    }
}

/// Words, most active first, from (word, activity) pairs.
pub fn busiest_first(keys: impl Iterator<Item = (u64, u64)>) -> Vec<u64> {
    let mut keys: Vec<(u64, u64)> = keys.map(|(w, a)| (a, w)).collect();
    keys.sort_unstable_by(|a, b| b.cmp(a));
    keys.into_iter().map(|(_, w)| w).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys that all map to one slot, and one that maps elsewhere.
    fn colliding(n: usize) -> Vec<u64> {
        let target = slot_of(1);
        (1u64..).filter(|k| slot_of(*k) == target).take(n).collect()
    }

    #[test]
    fn a_free_slot_goes_to_the_first_key_that_maps_there() {
        let d = SlotDirectory::new("DIR", "SLOTS");
        let keys = colliding(3);
        let plan = d.plan(keys.clone());
        assert_eq!(plan, vec![(slot_of(keys[0]), keys[0])]);
    }

    #[test]
    fn a_held_slot_is_never_taken_and_a_held_key_not_placed_twice() {
        let mut d = SlotDirectory::new("DIR", "SLOTS");
        let keys = colliding(2);
        d.held[slot_of(keys[0]) as usize] = keys[0];
        assert!(d.plan([keys[1]]).is_empty(), "the slot is held");
        assert!(d.plan([keys[0]]).is_empty(), "already placed");
    }

    #[test]
    fn a_released_slot_is_not_free_until_recycled_and_key_zero_never_placed() {
        let mut d = SlotDirectory::new("DIR", "SLOTS");
        let keys = colliding(2);
        d.released.push(slot_of(keys[1]));
        assert!(d.plan([keys[1]]).is_empty());
        assert!(d.plan([0]).is_empty());
        d.released.clear();
        assert_eq!(d.plan([keys[1]]), vec![(slot_of(keys[1]), keys[1])]);
    }
}
