//! Maps and helpers used by more than one probe family.
use aya_ebpf::{
    bindings::{BPF_LOCAL_STORAGE_GET_F_CREATE, bpf_map_type, task_struct},
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_task_btf, bpf_task_storage_get},
    macros::map,
    maps::{Array, PerCpuArray, PerCpuHashMap},
};
use stormwatch_common::ProbeError;

#[map(name = "PROBE_ERRORS")]
pub static PROBE_ERRORS: PerCpuArray<u64> = PerCpuArray::with_max_entries(ProbeError::COUNT, 0);

/// Counts one event a probe could not record.
#[inline(always)]
pub fn count_error(kind: ProbeError) {
    count_in(&PROBE_ERRORS, kind as u32);
}

/// Adds one to slot `index` of a per-CPU counter array (each family's lost-event array).
#[inline(always)]
pub fn count_in(counters: &PerCpuArray<u64>, index: u32) {
    if let Some(slot) = counters.get_ptr_mut(index) {
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

/// `cgroup.kn` and `kernfs_node.id`, from BTF: a `struct cgroup`'s id (the scheduler and network
/// probes both go from a cgroup pointer to its id).
#[unsafe(no_mangle)]
pub static CGROUP_KN_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
pub static KERNFS_NODE_ID_OFFSET: u32 = 0;

/// `task_struct.cgroups` and `css_set.dfl_cgrp`: with the two above, from a task to its cgroup
/// v2 id. 1 in `HAVE_TASK_CGROUP_OFFSETS` when all four are set.
#[unsafe(no_mangle)]
pub static TASK_CGROUPS_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
pub static CSS_SET_DFL_CGRP_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
pub static HAVE_TASK_CGROUP_OFFSETS: u32 = 0;

/// The cgroup v2 id of a BTF-typed task: `task->cgroups->dfl_cgrp->kn->id`, what
/// `bpf_get_current_cgroup_id()` returns for `current`, by four direct loads instead of the
/// helper call (which walks the same pointers under `rcu_read_lock`). Without the offsets, the
/// helper: only `current` may be passed here.
#[inline(always)]
pub fn task_cgroup_id(task: *const u8) -> u64 {
    if global_u32(&HAVE_TASK_CGROUP_OFFSETS) != 1 {
        // SAFETY: a helper with no preconditions; callers pass `current` only.
        return unsafe { bpf_get_current_cgroup_id() };
    }
    let cgroup = follow(
        task,
        &[
            global_u32(&TASK_CGROUPS_OFFSET),
            global_u32(&CSS_SET_DFL_CGRP_OFFSET),
            global_u32(&CGROUP_KN_OFFSET),
        ],
    );
    typed(cgroup, global_u32(&KERNFS_NODE_ID_OFFSET))
}

/// Follows a chain of pointer fields from a BTF-typed pointer: each load's result is the next
/// base (the verifier types each from BTF).
#[inline(always)]
pub fn follow<const N: usize>(mut base: *const u8, offsets: &[u32; N]) -> *const u8 {
    for &offset in offsets {
        base = typed(base, offset);
    }
    base
}

/// A field of a BTF-typed kernel pointer (tp_btf arguments, `bpf_get_current_task_btf()`),
/// loaded directly.
#[inline(always)]
pub fn typed<T: Copy>(base: *const u8, offset: u32) -> T {
    // SAFETY: `base` is a BTF-typed kernel pointer and `offset` a field of its type found in the
    // running kernel's BTF; the verifier checks the access against the type and makes the load
    // fault-tolerant.
    unsafe { core::ptr::read_volatile(base.wrapping_add(offset as usize) as *const T) }
}

pub const BPF_NOEXIST: u64 = 1;
/// Map flag: entries allocated on insert rather than all at creation.
pub const BPF_F_NO_PREALLOC: u32 = 1;

/// The per-CPU slot of `key`, created (from `zero`) on first use. `None` means the map is full,
/// which is counted as `full`.
#[inline(always)]
pub fn per_cpu_slot<K, V>(
    map: &PerCpuHashMap<K, V>,
    key: &K,
    zero: &V,
    full: ProbeError,
) -> Option<*mut V> {
    per_cpu_slot_or(map, key, zero, || count_error(full))
}

/// [`per_cpu_slot`], calling `full` to count a map that is full.
#[inline(always)]
pub fn per_cpu_slot_or<K, V>(
    map: &PerCpuHashMap<K, V>,
    key: &K,
    zero: &V,
    full: impl FnOnce(),
) -> Option<*mut V> {
    if let Some(v) = map.get_ptr_mut(key) {
        return Some(v);
    }
    // NOEXIST: another CPU may have created the entry meanwhile; the lookup below finds it.
    let _ = map.insert(key, zero, BPF_NOEXIST);
    let v = map.get_ptr_mut(key);
    if v.is_none() {
        full();
    }
    v
}

/// This CPU's figures of `key` in its direct slot, when the agent placed `key` there
/// (`stormwatch_common::slots`): two inlined array loads instead of a hash lookup. `None`: count
/// in the key's hash entry, as before it was placed.
#[inline(always)]
pub fn placed<V>(dir: &Array<u64>, slots: &PerCpuArray<V>, key: u64) -> Option<*mut V> {
    if key == 0 {
        return None;
    }
    let index = stormwatch_common::slots::slot_of(key);
    if *dir.get(index)? != key {
        return None;
    }
    slots.get_ptr_mut(index)
}

/// A task-local storage map (`BPF_MAP_TYPE_TASK_STORAGE`): one `T` per thread, kept in the
/// thread's own `task_struct` and freed with it. Nothing can evict an entry, and a lookup is an
/// index into the task's storage, not a hash lookup.
///
/// aya-ebpf has no type for it, so this is the BTF map definition libbpf reads from `.maps`
/// (`__uint(type, …)`, `__uint(map_flags, BPF_F_NO_PREALLOC)`, `__type(key, int)`,
/// `__type(value, T)`): each field's *type* carries the value, as an array length or a pointee.
/// aya's loader parses it from the object's BTF and creates the map with the value's BTF type id,
/// which the kernel requires for local storage.
#[repr(C)]
pub struct TaskStorage<T> {
    r#type: *const [i32; bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE as usize],
    key: *const i32,
    value: *const T,
    max_entries: *const [i32; 0],
    map_flags: *const [i32; BPF_F_NO_PREALLOC as usize],
}

// SAFETY: placeholder pointers the loader patches; never dereferenced.
unsafe impl<T> Sync for TaskStorage<T> {}

impl<T> TaskStorage<T> {
    pub const fn new() -> Self {
        Self {
            r#type: core::ptr::null(),
            key: core::ptr::null(),
            value: core::ptr::null(),
            max_entries: core::ptr::null(),
            map_flags: core::ptr::null(),
        }
    }

    /// The storage of `task`, created zeroed when it has none. `None` when the kernel refused:
    /// out of memory, or (on kernels whose storage lock is a trylock) another task-storage
    /// operation in progress on this CPU. The caller counts it.
    #[inline(always)]
    pub fn get_or_create(&self, task: *mut task_struct) -> Option<&mut T> {
        // SAFETY: the map pointer is this map's definition (relocated by the loader); `task` is
        // a BTF task pointer, which the verifier checks.
        let p = unsafe {
            bpf_task_storage_get(
                core::ptr::from_ref(self).cast_mut().cast(),
                task,
                core::ptr::null_mut(),
                BPF_LOCAL_STORAGE_GET_F_CREATE as u64,
            )
        } as *mut T;
        // SAFETY: a non-null pointer from the helper is the task's value, valid for the program.
        unsafe { p.as_mut() }
    }

    /// The storage of `task`, if it has any (`None` also when the kernel refused, as above).
    #[inline(always)]
    pub fn get(&self, task: *mut task_struct) -> Option<&mut T> {
        // SAFETY: as in `get_or_create`.
        let p = unsafe {
            bpf_task_storage_get(
                core::ptr::from_ref(self).cast_mut().cast(),
                task,
                core::ptr::null_mut(),
                0,
            )
        } as *mut T;
        // SAFETY: as in `get_or_create`.
        unsafe { p.as_mut() }
    }
}

/// The current thread, as a BTF pointer that task storage accepts.
#[inline(always)]
pub fn current_task() -> *mut task_struct {
    // SAFETY: a helper with no preconditions.
    unsafe { bpf_get_current_task_btf() }
}

/// `bpf_rdonly_cast(ptr, btf_id)`: `ptr` as a read-only pointer to the kernel struct whose BTF id
/// is `btf_id` (a read-only global: the verifier needs the id as a constant), whose fields then
/// load directly, as a tp_btf argument's do. Emitted as a placeholder call that the agent rewrites
/// before load (`stormwatch_common::kfuncs`); only to be called where the probe checked that the
/// agent made it the kfunc (`HAVE_RDONLY_CAST`), since elsewhere it is a plain move.
#[inline(always)]
pub fn rdonly_cast(ptr: u64, btf_id: u32) -> *const u8 {
    let out: u64;
    // SAFETY: a call (rewritten into the kfunc, which only retypes r1) with the calling
    // convention's registers: arguments in r1 and r2, the result in r0, r1–r5 clobbered.
    unsafe {
        core::arch::asm!(
            "call {marker}",
            marker = const stormwatch_common::kfuncs::RDONLY_CAST_MARKER,
            inout("r1") ptr => _,
            inout("r2") btf_id as u64 => _,
            out("r3") _,
            out("r4") _,
            out("r5") _,
            lateout("r0") out,
            options(nostack, pure, nomem),
        );
    }
    out as *const u8
}
