//! Maps and helpers used by more than one probe family.
use aya_ebpf::{macros::map, maps::PerCpuArray};
use stormwatch_common::ProbeError;

#[map(name = "PROBE_ERRORS")]
pub static PROBE_ERRORS: PerCpuArray<u64> = PerCpuArray::with_max_entries(ProbeError::COUNT, 0);

/// Counts one event a probe could not record.
#[inline(always)]
pub fn count_error(kind: ProbeError) {
    if let Some(slot) = PROBE_ERRORS.get_ptr_mut(kind as u32) {
        // SAFETY: a per-CPU slot; this program cannot be preempted by itself on this CPU.
        unsafe { *slot += 1 };
    }
}

/// Reads a read-only global that the agent sets before load. `read_volatile` keeps the compiler
/// from folding the placeholder value into the code.
#[inline(always)]
pub fn global_u32(value: &u32) -> u32 {
    // SAFETY: a valid reference to a static.
    unsafe { core::ptr::read_volatile(value) }
}

pub const BPF_ANY: u64 = 0;
pub const BPF_NOEXIST: u64 = 1;
pub const EEXIST: i32 = 17;

/// The per-CPU slot of `key`, created (from `zero`) on first use. `None` means the map is full,
/// which is counted as `full`.
#[inline(always)]
pub fn per_cpu_slot<K, V>(
    map: &aya_ebpf::maps::PerCpuHashMap<K, V>,
    key: &K,
    zero: &V,
    full: ProbeError,
) -> Option<*mut V> {
    if let Some(v) = map.get_ptr_mut(key) {
        return Some(v);
    }
    // NOEXIST: another CPU may have created the entry meanwhile; the lookup below finds it.
    let _ = map.insert(key, zero, BPF_NOEXIST);
    let v = map.get_ptr_mut(key);
    if v.is_none() {
        count_error(full);
    }
    v
}
