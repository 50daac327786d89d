//! The agent's half of `NETNS_OWNER_SLOTS`: the namespaces' owners (what `NETNS_CGROUP` says)
//! placed in direct slots, so that the receive hook finds a pod's namespace's container with
//! one array load instead of a hash lookup per packet.
//!
//! An entry is two words (`NetnsOwner`), which a program loads one after the other and which a
//! map update copies while programs may read it. The agent only writes a whole entry into a
//! free slot (all zeros) or clears a placed one to zeros, and a cleared slot is free again only
//! at a sync that begins after the one it was cleared in (or, cleared between two syncs, after
//! the next one) — a collection interval after it was cleared, long after any program that
//! loaded a word of the old entry has finished. So a program sees one entry,
//! or a mix of it and zeros, whose zero word matches no namespace or names no cgroup: it then
//! asks the hash, which holds every owner.

use std::collections::HashMap;

use aya::{Ebpf, maps::Array};
use stormwatch_common::{
    net::{NetnsOwner, maps, netns_owner_slot},
    slots::SLOTS,
};

/// What is in each slot, as the agent wrote it.
#[derive(Debug)]
pub struct OwnerSlots {
    /// By slot: the entry written there (`NetnsOwner::FREE`: none).
    held: Vec<NetnsOwner>,
    /// Slots cleared, with the number of syncs done when they were: free at the first sync
    /// that starts after one more has ended.
    cleared: Vec<(u32, u64)>,
    syncs: u64,
}

/// One write to the slots map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Write {
    Place(u32, NetnsOwner),
    Clear(u32),
}

impl Default for OwnerSlots {
    fn default() -> Self {
        Self {
            held: vec![NetnsOwner::FREE; SLOTS as usize],
            cleared: Vec::new(),
            syncs: 0,
        }
    }
}

impl OwnerSlots {
    /// Brings the slots in line with `owners` (namespace → cgroup, 0: nobody's; namespaces not
    /// in it stay as they are): a placed owner that changed is cleared, an owner not placed is
    /// placed where its slot is free.
    pub fn sync(&mut self, ebpf: &mut Ebpf, owners: &HashMap<u32, u64>) {
        self.sync_with(owners, map_writer(ebpf));
    }

    /// Clears the slots of the namespaces for which `gone` holds (gone with their containers).
    pub fn release(&mut self, ebpf: &mut Ebpf, gone: impl Fn(u32) -> bool) {
        self.release_with(gone, map_writer(ebpf));
    }

    /// [`OwnerSlots::sync`], each write made by `write` (false: refused, tried again later).
    fn sync_with(
        &mut self,
        owners: &HashMap<u32, u64>,
        write: impl FnMut(u32, &NetnsOwner) -> bool,
    ) {
        let writes = self.plan(owners);
        self.apply(&writes, write);
        self.syncs += 1;
    }

    /// [`OwnerSlots::release`], each write made by `write`.
    fn release_with(
        &mut self,
        gone: impl Fn(u32) -> bool,
        write: impl FnMut(u32, &NetnsOwner) -> bool,
    ) {
        let writes: Vec<Write> = (0u32..)
            .zip(&self.held)
            .filter(|(_, e)| e.netns != 0 && gone(e.netns))
            .map(|(slot, _)| Write::Clear(slot))
            .collect();
        self.apply(&writes, write);
    }

    fn plan(&mut self, owners: &HashMap<u32, u64>) -> Vec<Write> {
        // Free: cleared before the last sync ended, a collection interval ago at least, so no
        // program can still be reading the old entry.
        let syncs = self.syncs;
        self.cleared.retain(|(_, at)| *at == syncs);
        let mut writes = Vec::new();
        let mut taken: Vec<bool> = self.held.iter().map(|e| e.netns != 0).collect();
        for (slot, _) in &self.cleared {
            taken[*slot as usize] = true;
        }
        for (slot, e) in (0u32..).zip(&self.held) {
            if e.netns != 0 && owners.get(&e.netns).is_some_and(|c| *c != e.cgroup) {
                writes.push(Write::Clear(slot));
            }
        }
        let mut sorted: Vec<(u32, u64)> = owners
            .iter()
            .filter(|(netns, cgroup)| **netns != 0 && **cgroup != 0)
            .map(|(n, c)| (*n, *c))
            .collect();
        sorted.sort_unstable();
        for (netns, cgroup) in sorted {
            let slot = netns_owner_slot(netns);
            if taken[slot as usize] {
                continue;
            }
            taken[slot as usize] = true;
            writes.push(Write::Place(
                slot,
                NetnsOwner {
                    netns,
                    _pad: 0,
                    cgroup,
                },
            ));
        }
        writes
    }

    /// Makes `writes`; what `write` refused is not recorded, and tried again later.
    fn apply(&mut self, writes: &[Write], mut write: impl FnMut(u32, &NetnsOwner) -> bool) {
        for w in writes {
            match *w {
                Write::Place(slot, entry) => {
                    if write(slot, &entry) {
                        self.held[slot as usize] = entry;
                    }
                }
                Write::Clear(slot) => {
                    if write(slot, &NetnsOwner::FREE) {
                        self.held[slot as usize] = NetnsOwner::FREE;
                        self.cleared.push((slot, self.syncs));
                    }
                }
            }
        }
    }
}

/// Writes an entry to `NETNS_OWNER_SLOTS` (false when the map is missing or refused it).
fn map_writer(ebpf: &mut Ebpf) -> impl FnMut(u32, &NetnsOwner) -> bool + '_ {
    let mut map = ebpf
        .map_mut(maps::NETNS_OWNER_SLOTS)
        .and_then(|m| Array::<_, NetnsOwner>::try_from(m).ok());
    move |slot, entry| map.as_mut().is_some_and(|m| m.set(slot, entry, 0).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(netns: u32, cgroup: u64) -> NetnsOwner {
        NetnsOwner {
            netns,
            _pad: 0,
            cgroup,
        }
    }

    /// `OwnerSlots::sync` against a map that takes every write: the writes made.
    fn sync(s: &mut OwnerSlots, owners: &[(u32, u64)]) -> Vec<Write> {
        let mut made = Vec::new();
        s.sync_with(&owners.iter().copied().collect(), |slot, entry| {
            made.push(if *entry == NetnsOwner::FREE {
                Write::Clear(slot)
            } else {
                Write::Place(slot, *entry)
            });
            true
        });
        made
    }

    /// Namespaces that share one slot.
    fn colliding(n: usize) -> Vec<u32> {
        let slot = netns_owner_slot(4026531840);
        (4026531840u32..)
            .filter(|ns| netns_owner_slot(*ns) == slot)
            .take(n)
            .collect()
    }

    #[test]
    fn an_owner_is_placed_once_in_a_free_slot() {
        let mut s = OwnerSlots::default();
        let ns = 4026532001;
        let slot = netns_owner_slot(ns);
        assert_eq!(
            sync(&mut s, &[(ns, 7)]),
            vec![Write::Place(slot, owner(ns, 7))]
        );
        assert_eq!(sync(&mut s, &[(ns, 7)]), vec![], "already placed");
        assert_eq!(
            sync(&mut s, &[(ns, 0), (4026532002, 0)]),
            vec![Write::Clear(slot)]
        );
    }

    #[test]
    fn a_changed_owner_is_cleared_and_placed_again_a_sync_later() {
        let mut s = OwnerSlots::default();
        let ns = 4026532001;
        let slot = netns_owner_slot(ns);
        sync(&mut s, &[(ns, 7)]);
        // The owner changes: the slot is cleared, not overwritten in the same sync.
        assert_eq!(sync(&mut s, &[(ns, 8)]), vec![Write::Clear(slot)]);
        // An interval later: free.
        assert_eq!(
            sync(&mut s, &[(ns, 8)]),
            vec![Write::Place(slot, owner(ns, 8))]
        );
    }

    #[test]
    fn a_slot_released_between_syncs_waits_for_the_next_but_one() {
        let mut s = OwnerSlots::default();
        let [a, b] = colliding(2)[..] else {
            unreachable!()
        };
        let slot = netns_owner_slot(a);
        sync(&mut s, &[(a, 7), (b, 9)]);
        assert_eq!(s.held[slot as usize], owner(a, 7), "the first in order");
        // a's container is gone between two syncs.
        s.release_with(|ns| ns == a, |_, _| true);
        assert_eq!(s.held[slot as usize], NetnsOwner::FREE);
        assert_eq!(
            sync(&mut s, &[(b, 9)]),
            vec![],
            "cleared since the last sync began"
        );
        assert_eq!(
            sync(&mut s, &[(b, 9)]),
            vec![Write::Place(slot, owner(b, 9))]
        );
    }

    #[test]
    fn nobodys_and_unknown_namespaces_are_not_placed() {
        let mut s = OwnerSlots::default();
        assert_eq!(sync(&mut s, &[(4026532001, 0), (0, 5)]), vec![]);
    }
}
