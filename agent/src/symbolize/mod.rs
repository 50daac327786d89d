//! Call sites. Kernel: a contended lock's stack, symbolized against /proc/kallsyms (blazesym),
//! reduced to the first frame outside the locking code — the function that wanted the lock.
//! User space ([`user`], [`handoffs`]): the sampled sides of futex hand-offs, unwound with the
//! binaries' call-frame information and named the same way, per cgroup.

pub mod gocode;
pub mod handoffs;
pub mod stacks;
pub mod user;

use std::collections::HashMap;

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer,
    source::{Kernel, Source},
};
use serde::Serialize;

/// Where a contended lock was taken.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct CallSite {
    /// The first function outside the locking code, as `symbol+0xoffset`.
    pub function: String,
    /// The locking function it called (e.g. `_raw_spin_lock_irqsave`), when known.
    pub lock_function: Option<String>,
}

/// Symbol-name fragments of the kernel's locking code: frames to look through.
const LOCK_MACHINERY: &[&str] = &[
    "spin_lock",
    "spin_trylock",
    "read_lock",
    "write_lock",
    "_raw_",
    "queued_",
    "native_queued",
    "pv_queued",
    "__pv_queued",
    "contention",
    "mutex_lock",
    "__mutex",
    "mutex_spin",
    "osq_lock",
    "rwsem",
    "down_read",
    "down_write",
    "__down",
    "down_killable",
    "down_interruptible",
    "down_timeout",
    "rt_mutex",
    "rt_spin",
    "rtlock",
    "percpu_down",
    "__percpu",
    "do_raw_",
    "lock_acquire",
    // The tracing path between the tracepoint and our program.
    "bpf_prog_",
    "bpf_trace_run",
    "__bpf_trace_",
    "__traceiter_",
];

pub fn is_lock_machinery(symbol: &str) -> bool {
    LOCK_MACHINERY.iter().any(|frag| symbol.contains(frag))
}

/// Picks the call site from symbolized frames (innermost first): the first frame whose symbol is
/// not locking code, and the locking frame just inside it. `None` when every frame is locking
/// code or unknown.
pub fn call_site(frames: &[Option<(String, u64)>]) -> Option<CallSite> {
    let mut inner_lock = None;
    for frame in frames {
        let Some((name, offset)) = frame else {
            continue;
        };
        if is_lock_machinery(name) {
            inner_lock = Some(name.clone());
            continue;
        }
        return Some(CallSite {
            function: format!("{name}+{offset:#x}"),
            lock_function: inner_lock,
        });
    }
    None
}

/// Symbolizes kernel addresses, caching each address's answer.
pub struct KernelSymbolizer {
    /// blazesym, with `/proc/kallsyms` parsed (6 MiB on a distribution kernel), and when it
    /// was made: dropped by [`KernelSymbolizer::release`] a minute after, as new addresses are
    /// rare once the node's contended kernel paths are named (and kallsyms is parsed at most
    /// once a minute while they are not).
    symbolizer: Option<(Symbolizer, std::time::Instant)>,
    /// Each address's symbol, as answered once (at most [`MAX_KERNEL_ADDRESSES`]).
    cache: HashMap<u64, Option<(String, u64)>>,
}

/// The most kernel addresses whose symbol is kept (past it, they start over).
pub const MAX_KERNEL_ADDRESSES: usize = 65_536;

impl Default for KernelSymbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl KernelSymbolizer {
    pub fn new() -> Self {
        Self {
            symbolizer: None,
            cache: HashMap::new(),
        }
    }

    /// Drops blazesym and what it parsed (`/proc/kallsyms`) once it is a minute old: the names
    /// answered are kept.
    pub fn release(&mut self) {
        if self
            .symbolizer
            .as_ref()
            .is_some_and(|(_, made)| made.elapsed() >= std::time::Duration::from_secs(60))
        {
            self.symbolizer = None;
        }
    }

    /// The addresses named so far.
    pub fn cache_size(&self) -> crate::memory::CacheSize {
        crate::memory::CacheSize::entries("kernel_symbols", self.cache.len(), MAX_KERNEL_ADDRESSES)
    }

    /// `(symbol, offset)` for each address, `None` where it is not known.
    pub fn symbolize(&mut self, addrs: &[u64]) -> Vec<Option<(String, u64)>> {
        let missing: Vec<u64> = addrs
            .iter()
            .copied()
            .filter(|a| !self.cache.contains_key(a))
            .collect();
        if !missing.is_empty() {
            // kallsyms only: a vmlinux with debug info is rarely on a node, and kallsyms
            // already carries the KASLR-adjusted addresses.
            let kernel = Kernel {
                vmlinux: blazesym::MaybeDefault::None,
                debug_syms: false,
                ..Kernel::default()
            };
            let src = Source::Kernel(kernel);
            let results = self
                .symbolizer
                .get_or_insert_with(|| (Symbolizer::new(), std::time::Instant::now()))
                .0
                .symbolize(&src, Input::AbsAddr(&missing))
                .unwrap_or_default();
            if self.cache.len() + missing.len() > MAX_KERNEL_ADDRESSES {
                self.cache.clear();
            }
            for (i, addr) in missing.iter().enumerate() {
                let answer = match results.get(i) {
                    Some(Symbolized::Sym(sym)) => Some((sym.name.to_string(), sym.offset as u64)),
                    _ => None,
                };
                self.cache.insert(*addr, answer);
            }
        }
        addrs
            .iter()
            .map(|a| self.cache.get(a).cloned().flatten())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &str, off: u64) -> Option<(String, u64)> {
        Some((name.to_owned(), off))
    }

    #[test]
    fn the_call_site_is_the_first_frame_outside_locking_code() {
        let frames = [
            f("bpf_prog_8c3cf402647f6842_lock_contention_begin_btf", 0x2e6),
            f("bpf_trace_run2", 0x103),
            f("__traceiter_contention_begin", 0x2d),
            f("queued_spin_lock_slowpath", 0x1a0),
            f("_raw_spin_lock", 0x2b),
            f("futex_q_lock", 0x31),
            f("futex_wait_setup", 0x5c),
        ];
        assert_eq!(
            call_site(&frames),
            Some(CallSite {
                function: "futex_q_lock+0x31".into(),
                lock_function: Some("_raw_spin_lock".into()),
            })
        );
        let sleeping = [
            None,
            f("rwsem_down_write_slowpath", 0x3c0),
            f("down_write_killable", 0x5a),
            f("vm_mmap_pgoff", 0x8e),
        ];
        assert_eq!(call_site(&sleeping).unwrap().function, "vm_mmap_pgoff+0x8e");
        assert_eq!(call_site(&[f("_raw_spin_lock", 1), None]), None);
        assert_eq!(call_site(&[]), None);
    }

    #[test]
    fn lock_machinery_names() {
        for s in [
            "_raw_spin_lock_irqsave",
            "__mutex_lock.constprop.0",
            "mutex_lock",
            "rwsem_down_read_slowpath",
            "down_write",
            "queued_read_lock_slowpath",
            "percpu_down_write",
        ] {
            assert!(is_lock_machinery(s), "{s}");
        }
        for s in [
            "futex_wait_setup",
            "do_mmap",
            "vfs_write",
            "__x64_sys_futex",
        ] {
            assert!(!is_lock_machinery(s), "{s}");
        }
    }

    #[test]
    fn symbolizes_a_real_kernel_function() {
        // Ground truth from /proc/kallsyms itself: the address of `schedule` must symbolize
        // back to `schedule` at offset 0 (kallsyms shows real addresses to root).
        let kallsyms = std::fs::read_to_string("/proc/kallsyms").expect("kallsyms");
        let addr = kallsyms
            .lines()
            .find_map(|l| {
                let mut it = l.split_whitespace();
                let (a, t, n) = (it.next()?, it.next()?, it.next()?);
                (n == "schedule" && (t == "T" || t == "t"))
                    .then(|| u64::from_str_radix(a, 16).ok())
                    .flatten()
            })
            .expect("schedule in kallsyms");
        assert_ne!(
            addr, 0,
            "kallsyms addresses are hidden: run the tests as root"
        );
        let mut s = KernelSymbolizer::new();
        assert_eq!(s.symbolize(&[addr + 4]), vec![f("schedule", 4)]);
    }
}
