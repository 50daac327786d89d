//! Direct slots: per-CPU arrays that hold the figures of the keys (cgroups, interfaces) the
//! agent placed there, in front of the per-CPU hash maps that hold everyone's.
//!
//! A per-CPU hash lookup hashes its key and walks a bucket (~15–25 ns an event, issue #43's
//! measurements); an array lookup the verifier inlines is an index. Each family that keeps
//! per-key figures in a per-CPU hash can have a directory (`Array<u64>`, [`SLOTS`] entries:
//! slot `i` holds the key placed there, 0 when free) and a per-CPU array of [`SLOTS`] values
//! beside it. A program looks at the key's one slot ([`slot_of`]); when the directory holds
//! its key there it counts in the slot, else in the hash as before.
//!
//! The agent is the directory's only writer. It places a key that the hash already holds (so
//! every key's first event goes through the hash) in its slot when that slot is free, and never
//! moves counts from one place to the other: a key's figures are its hash entry's plus its
//! slot's, each event in exactly one of them, so a read taken while a key is placed neither
//! loses nor doubles anything. A released slot (its key gone) is zeroed only at the agent's next
//! read, a collection interval later, long after any program that saw the old key has finished,
//! and only then given to another key.

/// Slots per directory: a power of two.
pub const SLOTS: u32 = 128;
const SLOT_BITS: u32 = SLOTS.trailing_zeros();

/// The one slot where `key` may be placed (Fibonacci hashing: the top bits of the product).
/// `key` 0 is no key: a free slot's directory entry.
#[inline(always)]
pub const fn slot_of(key: u64) -> u32 {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SLOT_BITS)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_in_range_and_spread() {
        assert!(SLOTS.is_power_of_two());
        let mut used = [0u32; SLOTS as usize];
        // Consecutive cgroup ids (as the kernel hands them out) and interface keys.
        for id in 1000u64..1000 + u64::from(SLOTS) {
            used[slot_of(id) as usize] += 1;
        }
        let distinct = used.iter().filter(|n| **n > 0).count();
        // Fibonacci hashing spreads consecutive keys over most slots.
        assert!(
            distinct as u32 >= SLOTS / 2,
            "{distinct} of {SLOTS} slots used"
        );
        assert!(used.iter().all(|n| *n <= 3), "{used:?}");
    }
}
