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
    /// Slots cleared, with the number of syncs done when they were: free at a sync that
    /// starts with more than one more done (the sync they were cleared in, or the first after
    /// them, has ended).
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
        let writes = self.plan(owners);
        self.apply(ebpf, &writes);
        self.syncs += 1;
    }

    /// Clears the slots of the namespaces for which `gone` holds (gone with their containers).
    pub fn release(&mut self, ebpf: &mut Ebpf, gone: impl Fn(u32) -> bool) {
        let writes: Vec<Write> = (0u32..)
            .zip(&self.held)
            .filter(|(_, e)| e.netns != 0 && gone(e.netns))
            .map(|(slot, _)| Write::Clear(slot))
            .collect();
        self.apply(ebpf, &writes);
    }

    fn plan(&mut self, owners: &HashMap<u32, u64>) -> Vec<Write> {
        // Cleared at most during the sync before this one: a collection interval ago, and no
        // program can still be reading the old entry.
        let syncs = self.syncs;
        self.cleared.retain(|(_, at)| *at + 1 > syncs);
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

    /// Writes to the map; what the map refused is not recorded, and tried again later.
    fn apply(&mut self, ebpf: &mut Ebpf, writes: &[Write]) {
        if writes.is_empty() {
            return;
        }
        let Some(Ok(mut map)) = ebpf
            .map_mut(maps::NETNS_OWNER_SLOTS)
            .map(Array::<_, NetnsOwner>::try_from)
        else {
            return;
        };
        for w in writes {
            let (slot, entry) = match *w {
                Write::Place(slot, entry) => (slot, entry),
                Write::Clear(slot) => (slot, NetnsOwner::FREE),
            };
            if map.set(slot, &entry, 0).is_ok() {
                self.record(*w);
            }
        }
    }

    fn record(&mut self, w: Write) {
        match w {
            Write::Place(slot, entry) => self.held[slot as usize] = entry,
            Write::Clear(slot) => {
                self.held[slot as usize] = NetnsOwner::FREE;
                self.cleared.push((slot, self.syncs));
            }
        }
    }
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

    /// `plan`, then the writes taken as the map took them, as `sync` does.
    fn sync(s: &mut OwnerSlots, owners: &[(u32, u64)]) -> Vec<Write> {
        let writes = s.plan(&owners.iter().copied().collect());
        for w in &writes {
            s.record(*w);
        }
        s.syncs += 1;
        writes
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
        s.record(Write::Clear(slot));
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
