//! Which of a Go program's sampled stacks are in its `sync.Mutex`'s code: the on-CPU sampler's
//! samples (`probes::gocpu`) named against the binary's symbol table, for the share of its CPU
//! the mutex costs (the Go storm's cost, `diagnose::rules::gostorm`).
//!
//! Only the mutex's functions are kept of a binary's symbols (their address ranges); a sample
//! is the mutex's when any of its frames falls in one. Go keeps frame pointers, so the kernel's
//! walk of the user stack reaches `lockSlow` from what it runs (its spin, the semaphore).

use std::{collections::HashMap, path::Path, sync::Arc};

use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};

use crate::files::{exe_id, exe_load_bias};

/// Binaries whose mutex code is kept, and processes.
const MAX_BINARIES: usize = 1024;
const MAX_PROCESSES: usize = 4096;

/// Whether a Go function is the mutex's code: `sync.Mutex`'s and `RWMutex`'s methods (the
/// `Lock` fast path is inlined into its callers: a sample there is not counted), and the
/// runtime functions only their slow paths call (spinning, the semaphore queue). Go 1.24 moved
/// `sync.Mutex` into `internal/sync`.
pub fn is_mutex_code(name: &str) -> bool {
    const PREFIXES: [&str; 6] = [
        "sync.(*Mutex).",
        "internal/sync.(*Mutex).",
        "sync.(*RWMutex).",
        "sync.runtime_SemacquireMutex",
        "sync.runtime_SemacquireRWMutex",
        "internal/sync.runtime_SemacquireMutex",
    ];
    const SPIN: [&str; 4] = [
        "sync.runtime_canSpin",
        "sync.runtime_doSpin",
        "internal/sync.runtime_canSpin",
        "internal/sync.runtime_doSpin",
    ];
    PREFIXES.iter().any(|p| name.starts_with(p)) || SPIN.contains(&name)
}

/// The address ranges (in the binary) of its mutex code, sorted.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MutexCode {
    ranges: Vec<(u64, u64)>,
    pie: bool,
    first_vaddr: u64,
}

impl MutexCode {
    /// From an ELF's bytes: `None` where it has no symbol table or no mutex code.
    pub fn of(data: &[u8]) -> Option<Self> {
        let file = object::File::parse(data).ok()?;
        let mut ranges: Vec<(u64, u64)> = file
            .symbols()
            .filter(|s| s.size() > 0 && s.name().is_ok_and(is_mutex_code))
            .map(|s| (s.address(), s.address() + s.size()))
            .collect();
        if ranges.is_empty() {
            return None;
        }
        ranges.sort_unstable();
        Some(Self {
            ranges,
            pie: file.kind() == object::ObjectKind::Dynamic,
            first_vaddr: file.segments().map(|s| s.address()).min().unwrap_or(0),
        })
    }

    /// Whether `addr` (in the binary) is in its mutex code.
    pub fn contains(&self, addr: u64) -> bool {
        let i = self.ranges.partition_point(|&(start, _)| start <= addr);
        i > 0 && addr < self.ranges[i - 1].1
    }

    /// Whether a sample's frames (run-time addresses, innermost first) reach the mutex's code;
    /// a return address is looked up one byte back (the call it returns from).
    pub fn sample_is_mutex(&self, bias: u64, ips: &[u64]) -> bool {
        ips.iter().enumerate().any(|(i, &ip)| {
            let at = if i == 0 { ip } else { ip.wrapping_sub(1) };
            self.contains(at.wrapping_sub(bias))
        })
    }
}

/// Each sampled process's binary's mutex code and load bias, kept while the process is
/// sampled.
#[derive(Debug, Default)]
pub struct GoCodeNamer {
    binaries: HashMap<(u64, u64), Option<Arc<MutexCode>>>,
    processes: HashMap<u32, Option<(Arc<MutexCode>, u64)>>,
}

impl GoCodeNamer {
    /// Whether a sample of `tgid` (its user frames, innermost first) is in the mutex's code;
    /// `false` where its binary cannot be read or has no symbols.
    pub fn is_mutex(&mut self, tgid: u32, ips: &[u64]) -> bool {
        if self.processes.len() >= MAX_PROCESSES && !self.processes.contains_key(&tgid) {
            self.processes.clear();
        }
        if self.binaries.len() >= MAX_BINARIES {
            self.binaries.clear();
        }
        let binaries = &mut self.binaries;
        let process = self.processes.entry(tgid).or_insert_with(|| {
            let exe = exe_id(tgid)?;
            let code = binaries
                .entry(exe)
                .or_insert_with(|| {
                    let data = std::fs::read(format!("/proc/{tgid}/exe")).ok()?;
                    MutexCode::of(&data).map(Arc::new)
                })
                .clone()?;
            let bias = if code.pie {
                exe_load_bias(Path::new(&format!("/proc/{tgid}")), exe, code.first_vaddr)?
            } else {
                0
            };
            Some((code, bias))
        });
        process
            .as_ref()
            .is_some_and(|(code, bias)| code.sample_is_mutex(*bias, ips))
    }

    /// Forgets the processes no longer sampled, and the binaries none of them runs.
    pub fn retain(&mut self, sampled: impl Fn(u32) -> bool) {
        self.processes.retain(|t, _| sampled(*t));
        let used: std::collections::HashSet<*const MutexCode> = self
            .processes
            .values()
            .flatten()
            .map(|(c, _)| Arc::as_ptr(c))
            .collect();
        self.binaries
            .retain(|_, c| c.as_ref().is_some_and(|c| used.contains(&Arc::as_ptr(c))));
    }

    /// The sizes of what it keeps.
    pub fn cache_sizes(&self) -> [crate::memory::CacheSize; 2] {
        use crate::memory::CacheSize;
        [
            CacheSize::entries("go_code_processes", self.processes.len(), MAX_PROCESSES),
            CacheSize::entries("go_code_binaries", self.binaries.len(), MAX_BINARIES),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mutex_code_is_the_slow_paths_and_what_only_they_run() {
        for name in [
            "sync.(*Mutex).lockSlow",
            "internal/sync.(*Mutex).lockSlow",
            "internal/sync.(*Mutex).unlockSlow",
            "sync.(*RWMutex).RLock",
            "sync.runtime_SemacquireMutex",
            "internal/sync.runtime_canSpin",
            "sync.runtime_doSpin",
        ] {
            assert!(is_mutex_code(name), "{name}");
        }
        // The runtime's own locks, the semaphore of other waits, the scheduler and a
        // sync.Cond's or WaitGroup's waits are not the mutex's.
        for name in [
            "runtime.lock2",
            "runtime.semacquire1",
            "runtime.procyieldAsm.abi0",
            "runtime.schedule",
            "sync.(*Cond).Wait",
            "sync.(*WaitGroup).Wait",
            "sync.runtime_notifyListWait",
            "main.worker",
        ] {
            assert!(!is_mutex_code(name), "{name}");
        }
    }

    #[test]
    fn a_sample_is_the_mutexs_when_a_frame_is_in_its_code() {
        let code = MutexCode {
            ranges: vec![(0x1000, 0x1100), (0x2000, 0x2040)],
            pie: false,
            first_vaddr: 0,
        };
        assert!(code.contains(0x1000) && code.contains(0x10ff) && code.contains(0x2000));
        assert!(!code.contains(0x0fff) && !code.contains(0x1100) && !code.contains(0x2040));
        // The leaf is the address itself; a caller's frame is its return address, looked up
        // a byte back: a call that is the last instruction of lockSlow returns past its end.
        assert!(code.sample_is_mutex(0, &[0x5000, 0x1100]));
        assert!(!code.sample_is_mutex(0, &[0x1100]));
        assert!(code.sample_is_mutex(0x400000, &[0x401010]));
        assert!(!code.sample_is_mutex(0, &[0x5000, 0x6000]));
        assert!(!code.sample_is_mutex(0, &[]));
    }
}
