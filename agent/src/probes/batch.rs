//! Batched reads of per-CPU hash maps with `BPF_MAP_LOOKUP_BATCH` (Linux 5.6).
//!
//! aya 0.16 reads a map one key at a time: a `BPF_MAP_GET_NEXT_KEY` and a
//! `BPF_MAP_LOOKUP_ELEM` syscall per key, so 1,000 cgroups in four maps cost 8,000 syscalls per
//! collection. One `BPF_MAP_LOOKUP_BATCH` copies up to `count` keys and their per-CPU values
//! at once: a handful of syscalls per map. aya has no wrapper for it, so this module calls
//! bpf(2) itself; the one `unsafe` block is the syscall, on buffers sized from the map's own
//! key and value sizes.
//!
//! Like the per-key walk, a batch read is not a snapshot: the probes keep updating the map
//! while it is read, and each value is read whole per CPU (a 64-bit counter is never torn).

use std::{
    cell::RefCell,
    collections::HashMap,
    hash::Hash,
    os::fd::{AsFd as _, AsRawFd as _},
};

use aya::{
    Pod,
    maps::{MapData, PerCpuValues},
};

/// `BPF_MAP_LOOKUP_BATCH` from `enum bpf_cmd` (include/uapi/linux/bpf.h).
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// The kernel's internal "not supported" (`ENOTSUPP`, not in libc): what an old map type
/// without a batch operation answers.
const ENOTSUPP: i32 = 524;
/// Bytes of keys and values one syscall may copy: bounds the buffer on hosts with many CPUs
/// (a per-CPU value takes its size times the CPU count).
const BATCH_BYTES: usize = 256 * 1024;
/// Fewest entries per syscall: a hash batch copies whole buckets, and a bucket larger than the
/// batch fails with `ENOSPC` (then the batch grows).
const MIN_BATCH: usize = 64;

thread_local! {
    /// The key and value buffers of the last batch read on this thread, kept for the next: a
    /// collection reads several maps every interval, and buffers allocated afresh each time
    /// (a quarter of a MiB, above malloc's mmap threshold) are page-faulted in afresh each time
    /// (seen as a tenth of the daemon's CPU time with 1,000 cgroups).
    static SCRATCH: RefCell<(Vec<u8>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// The kernel or the map type has no batch lookup: read key by key instead.
    #[error("BPF_MAP_LOOKUP_BATCH is not supported here")]
    Unsupported,
    #[error("reading the map's info")]
    Info(#[source] aya::maps::MapError),
    #[error("counting the possible CPUs ({path})")]
    Cpus {
        path: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the map has {map} byte keys and {value} byte values; expected {want_key} and {want_value}"
    )]
    Sizes {
        map: u32,
        value: u32,
        want_key: usize,
        want_value: usize,
    },
    #[error("BPF_MAP_LOOKUP_BATCH")]
    Syscall(#[source] std::io::Error),
    #[error("per-CPU values")]
    Values(#[source] std::io::Error),
}

/// Reads every key of a per-CPU hash map into one value per key, made by `value` from the
/// key's per-CPU values: the same result as iterating with aya's `PerCpuHashMap`, in fewer
/// syscalls.
pub fn read_per_cpu_hash_with<K, V, T>(
    map: &MapData,
    value: impl FnMut(&K, &PerCpuValues<V>) -> T,
) -> Result<HashMap<K, T>, BatchError>
where
    K: Pod + Eq + Hash,
    V: Pod,
{
    read_in_batches(map, value, None)
}

/// [`read_per_cpu_hash_with`] with `first_batch` entries per syscall to begin with (tests), or
/// as many as fit [`BATCH_BYTES`].
fn read_in_batches<K, V, T>(
    map: &MapData,
    value: impl FnMut(&K, &PerCpuValues<V>) -> T,
    first_batch: Option<usize>,
) -> Result<HashMap<K, T>, BatchError>
where
    K: Pod + Eq + Hash,
    V: Pod,
{
    SCRATCH.with_borrow_mut(|(keys, values)| {
        read_in_batches_into(map, value, first_batch, keys, values)
    })
}

fn read_in_batches_into<K, V, T>(
    map: &MapData,
    mut value: impl FnMut(&K, &PerCpuValues<V>) -> T,
    first_batch: Option<usize>,
    keys: &mut Vec<u8>,
    values: &mut Vec<u8>,
) -> Result<HashMap<K, T>, BatchError>
where
    K: Pod + Eq + Hash,
    V: Pod,
{
    let info = map.info().map_err(BatchError::Info)?;
    let (key_size, value_size) = (size_of::<K>(), size_of::<V>());
    if info.key_size() as usize != key_size || info.value_size() as usize != value_size {
        return Err(BatchError::Sizes {
            map: info.key_size(),
            value: info.value_size(),
            want_key: key_size,
            want_value: value_size,
        });
    }
    let cpus = aya::util::nr_cpus()
        .map_err(|(path, source)| BatchError::Cpus { path, source })?
        .get() as usize;
    // The kernel lays out a key's per-CPU values one per possible CPU, each rounded up to 8.
    let stride = value_size.next_multiple_of(8);
    let entry_bytes = key_size + stride * cpus;
    let max_entries = (info.max_entries() as usize).max(1);
    let mut batch = first_batch.unwrap_or_else(|| {
        (BATCH_BYTES / entry_bytes).clamp(MIN_BATCH, max_entries.max(MIN_BATCH))
    });
    // The kernel writes what it returns; the contents left from the last read are never read.
    keys.resize(batch * key_size, 0);
    values.resize(batch * stride * cpus, 0);
    // The position token: a bucket index (u32) for hash maps, a key for the generic batch.
    let mut token = vec![0u8; key_size.max(8)];
    let mut next = vec![0u8; key_size.max(8)];
    let fd = map.fd().as_fd().as_raw_fd() as u32;
    let mut out = HashMap::new();
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { token.as_ptr() as u64 },
            out_batch: next.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: batch as u32,
            map_fd: fd,
            ..BatchAttr::default()
        };
        // SAFETY: bpf(2) with a `bpf_attr` prefix the size of `BatchAttr` (the kernel reads
        // no further); the kernel writes at most `count` keys of `key_size` bytes into `keys`,
        // `count` times `cpus` values of `stride` bytes into `values`, and a token of at most
        // `key_size` bytes into `next`, all sized above and alive across the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                size_of::<BatchAttr>() as u32,
            )
        };
        let done = if rc < 0 {
            let err = std::io::Error::last_os_error();
            match err.raw_os_error() {
                // The end of the map: the entries copied so far are in `count`.
                Some(libc::ENOENT) => true,
                // A bucket holds more entries than the batch: retry larger.
                Some(libc::ENOSPC) if batch < max_entries.max(MIN_BATCH) => {
                    batch *= 2;
                    keys.resize(batch * key_size, 0);
                    values.resize(batch * stride * cpus, 0);
                    continue;
                }
                Some(libc::EINVAL | libc::EOPNOTSUPP | ENOTSUPP) if first => {
                    return Err(BatchError::Unsupported);
                }
                _ => return Err(BatchError::Syscall(err)),
            }
        } else {
            false
        };
        for i in 0..attr.count as usize {
            // SAFETY: `K: Pod` is valid for any bytes; the slice has `key_size` bytes.
            let key: K =
                unsafe { std::ptr::read_unaligned(keys[i * key_size..].as_ptr().cast::<K>()) };
            let per_cpu: Vec<V> = values[i * stride * cpus..(i + 1) * stride * cpus]
                .chunks_exact(stride)
                // SAFETY: as above, `V: Pod` and `stride >= value_size`.
                .map(|cpu| unsafe { std::ptr::read_unaligned(cpu.as_ptr().cast::<V>()) })
                .collect();
            let per_cpu = PerCpuValues::try_from(per_cpu).map_err(BatchError::Values)?;
            let v = value(&key, &per_cpu);
            out.insert(key, v);
        }
        if done {
            return Ok(out);
        }
        std::mem::swap(&mut token, &mut next);
        first = false;
    }
}

#[cfg(test)]
mod tests {
    use aya::maps::{IterableMap as _, PerCpuHashMap};

    use super::*;

    /// A 12-byte value: not a multiple of 8, to check the per-CPU stride.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct Odd {
        a: u32,
        b: u32,
        c: u32,
    }
    // SAFETY: three u32, no padding: any bytes are a valid value.
    unsafe impl Pod for Odd {}

    fn is_root() -> bool {
        rustix::process::geteuid().is_root()
    }

    /// Fills a real per-CPU hash map (many keys, so that several batches and bucket
    /// collisions happen) and compares the batched read with aya's key-by-key iteration.
    #[test]
    fn batched_read_equals_per_key_read() {
        // Creating a BPF map needs CAP_BPF; the project's tests run as root. Without it this
        // fails loudly rather than passing unchecked.
        assert!(
            is_root(),
            "this test creates a BPF map: run it as root (cargo test as root)"
        );
        let cpus = aya::util::nr_cpus().unwrap().get() as usize;
        for n in [0usize, 1, 63, 64, 65, 1000, 3000] {
            let mut map = PerCpuHashMap::<MapData, u64, Odd>::create(4096, 0)
                .expect("creating a per-CPU hash map");
            for k in 0..n as u64 {
                let per_cpu: Vec<Odd> = (0..cpus as u64)
                    .map(|c| Odd {
                        a: (k * 1000 + c) as u32,
                        b: (k as u32) ^ (c as u32 + 7),
                        c: 0xfeed_0000 | c as u32,
                    })
                    .collect();
                map.insert(
                    &k.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                    PerCpuValues::try_from(per_cpu).unwrap(),
                    0,
                )
                .unwrap();
            }
            let fold = |t: &mut Odd, v: &Odd| {
                t.a += v.a;
                t.b ^= v.b;
                t.c = t.c.wrapping_mul(31).wrapping_add(v.c);
            };
            let zero = Odd { a: 0, b: 0, c: 0 };
            let mut per_key = HashMap::new();
            for entry in map.iter() {
                let (k, vs) = entry.unwrap();
                let mut t = zero;
                for v in vs.iter() {
                    fold(&mut t, v);
                }
                per_key.insert(k, t);
            }
            assert_eq!(per_key.len(), n);
            let total = |_: &u64, vs: &PerCpuValues<Odd>| {
                let mut t = zero;
                for v in vs.iter() {
                    fold(&mut t, v);
                }
                t
            };
            let batched = read_per_cpu_hash_with(map.map(), total).expect("batched read");
            assert_eq!(batched, per_key, "{n} keys");
            // Many batches, and batches smaller than a bucket (which must grow, not fail).
            for first in [1, 7, 64] {
                let batched = read_in_batches(map.map(), total, Some(first)).expect("batched read");
                assert_eq!(batched, per_key, "{n} keys, batches of {first}");
            }
        }
    }

    #[test]
    fn wrong_sizes_are_refused() {
        assert!(is_root(), "this test creates a BPF map: run it as root");
        let map = PerCpuHashMap::<MapData, u64, u64>::create(8, 0).unwrap();
        let r = read_per_cpu_hash_with(map.map(), |_: &u32, _: &PerCpuValues<u64>| 0u64);
        assert!(matches!(r, Err(BatchError::Sizes { .. })), "{r:?}");
    }
}
