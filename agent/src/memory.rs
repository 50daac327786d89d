//! Giving the allocator's free memory back to the system, and the sizes of the agent's caches.
//!
//! glibc's malloc keeps the pages of freed blocks mapped for reuse, and only trims the top of the
//! main heap on its own: the agent's resident memory would follow the largest allocation it ever
//! made (the kernel's BTF at load time, the largest collection and exposition since), not what it
//! holds now. Issue 12 bounds the agent's resident memory, so the two moments that free megabytes
//! (after the load, after each exposition replaces the previous one) hand them back. Measured
//! with `exporter_bench --cgroups 300` (1,300 cgroups tracked on the shared test VM): 39–50 MiB
//! resident with the trims, 50–61 MiB without.
//!
//! `malloc_trim(3)` is a glibc function, not a system call: neither rustix nor nix wraps it (they
//! wrap the kernel's interface, and the allocator is not part of it), hence the one `unsafe` call.

/// Returns the allocator's free pages to the kernel. Costs well under a millisecond; a no-op
/// with other C libraries (malloc_trim is glibc's).
pub fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim has no preconditions: it only releases memory no block holds.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Makes every thread allocate from the main heap. glibc gives each thread that allocates
/// concurrently an arena of its own and trims them apart: the daemon's HTTP worker renders the
/// exposition in its arena while the collection thread works in the main heap, so each keeps
/// the high-water mark of its own work. Measured with `exporter_bench --cgroups 1000`: the HTTP
/// worker's arena alone held 10 MiB of the daemon's 42 MiB. The daemon has two threads and
/// hands work between them once a scrape: a shared arena costs nothing in contention. Called
/// before any thread is started.
pub fn one_arena() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt has no preconditions; M_ARENA_MAX takes effect for arenas made later.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// The size of one of the agent's caches, as `stormwatch_agent_cache_*` exports it: what it
/// holds now and the bound it is kept within. Every cache of what the node runs (processes,
/// files, threads, cgroups) forgets an entry when what it describes is gone, and keeps at most
/// `max_entries` (and `max_bytes`, where its bytes are counted) whatever the churn; a cache
/// without `max_entries` holds only what is alive (or still in the diagnosis window).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheSize {
    /// The cache, as the `cache` label names it.
    pub name: &'static str,
    pub entries: u64,
    pub max_entries: Option<u64>,
    /// The bytes its entries hold, where counted (the large ones: sections, stacks, maps).
    pub bytes: Option<u64>,
    pub max_bytes: Option<u64>,
}

impl CacheSize {
    /// A cache whose bytes are not counted.
    pub const fn entries(name: &'static str, entries: usize, max_entries: usize) -> Self {
        Self {
            name,
            entries: entries as u64,
            max_entries: Some(max_entries as u64),
            bytes: None,
            max_bytes: None,
        }
    }

    /// A cache of what is alive, bound by it alone.
    pub const fn live(name: &'static str, entries: usize) -> Self {
        Self {
            name,
            entries: entries as u64,
            max_entries: None,
            bytes: None,
            max_bytes: None,
        }
    }
}
