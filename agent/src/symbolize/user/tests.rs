use std::sync::Arc;

use super::{
    files::{CachedFile, ElfFile, UNUSED_FILE_TTL},
    site::{pick_site, short_lock_name},
    *,
};

/// This thread's registers and the top of its stack, as the futex probes sample a thread's
/// (x86-64), taken in a function that is not inlined so that it has a frame of its own.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
fn sample_here(stack: &mut [u8]) -> (u64, u64, u64) {
    let (ip, sp, bp): (u64, u64, u64);
    // SAFETY: reads three registers, writes nothing.
    unsafe {
        std::arch::asm!(
            "lea {ip}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            ip = out(reg) ip,
            sp = out(reg) sp,
            bp = out(reg) bp,
        );
        std::ptr::copy_nonoverlapping(sp as *const u8, stack.as_mut_ptr(), stack.len());
    }
    (ip, sp, bp)
}

#[cfg(target_arch = "x86_64")]
#[inline(never)]
fn a_caller_with_a_name(stack: &mut [u8]) -> (u64, u64, u64) {
    let r = sample_here(stack);
    std::hint::black_box(r)
}

#[cfg(target_arch = "x86_64")]
#[test]
fn this_threads_own_stack_unwinds_through_its_named_callers() {
    // On the heap: a copy of this very stack must not be on it.
    let mut stack = vec![0u8; 4096];
    let (ip, sp, bp) = a_caller_with_a_name(&mut stack);
    let mut s = UserSymbolizer::new(true);
    let frames = s
        .frames(&StackSample {
            tgid: std::process::id(),
            ip,
            sp,
            bp,
            stack: &stack,
        })
        .expect("our own process can be read");
    let names: Vec<String> = frames.iter().filter_map(|f| f.name.clone()).collect();
    let at = |needle: &str| names.iter().position(|n| n.contains(needle));
    let (Some(inner), Some(outer)) = (at("sample_here"), at("a_caller_with_a_name")) else {
        panic!("frames: {frames:?}");
    };
    assert!(inner < outer, "{names:?}");
    assert!(
        at("this_threads_own_stack_unwinds").is_some_and(|t| t > outer),
        "{names:?}"
    );
}

fn frame(name: &str, module: &str) -> Frame {
    Frame {
        name: Some(name.to_owned()),
        location: None,
        module: Some(module.to_owned()),
        lookup: None,
    }
}

#[test]
fn the_site_is_the_first_frame_outside_libc_locking() {
    let frames = [
        frame("__GI___lll_lock_wait", "libc.so.6"),
        frame("___pthread_mutex_lock", "libc.so.6"),
        Frame {
            location: Some("lockbench.c:116".to_owned()),
            ..frame("worker", "lockbench")
        },
        frame("start_thread", "libc.so.6"),
    ];
    let (site, hint) = pick_site(&frames, Runtime::Native);
    assert_eq!(site.function.as_deref(), Some("worker"));
    assert_eq!(site.lock_function.as_deref(), Some("pthread_mutex_lock"));
    assert_eq!(site.location.as_deref(), Some("lockbench.c:116"));
    assert_eq!(hint, None);
    assert_eq!(
        site.describe(),
        "`worker` (lockbench.c:116) via `pthread_mutex_lock`"
    );
}

#[test]
fn java_frames_above_the_jvms_parking_code_are_the_site() {
    let frames = [
        frame("__futex_abstimed_wait_common", "libc.so.6"),
        frame("___pthread_cond_wait", "libc.so.6"),
        frame("Parker::park(bool, long)", "libjvm.so"),
        frame("Unsafe_Park", "libjvm.so"),
        frame("jdk.internal.misc.Unsafe.park", "JIT"),
        frame(
            "java.util.concurrent.locks.AbstractQueuedSynchronizer.acquire",
            "JIT",
        ),
        frame("Corpus$Cache.get", "JIT"),
    ];
    let (site, _) = pick_site(
        &frames,
        Runtime::Jvm {
            frame_pointers: true,
        },
    );
    assert_eq!(site.function.as_deref(), Some("Corpus$Cache.get"));
    assert_eq!(
        site.lock_function.as_deref(),
        Some("AbstractQueuedSynchronizer.acquire")
    );
    // Compiled Java code may hold methods the JIT inlined into it: the site says so.
    assert_eq!(
        site.describe(),
        "`Corpus$Cache.get` (JIT-compiled: methods may be inlined into it) via \
         `AbstractQueuedSynchronizer.acquire`"
    );
}

/// A JVM pool worker's stack, innermost first: parked under `inside` (the JDK's own frames),
/// called by the pool's `getTask`, down to the thread's start; not one frame is the
/// application's.
fn jvm_pool_worker(inside: &[&str]) -> Vec<Frame> {
    let mut frames = vec![
        frame("__futex_abstimed_wait_common", "libc.so.6"),
        frame("___pthread_cond_wait", "libc.so.6"),
        frame("Parker::park(bool, long)", "libjvm.so"),
        frame("Unsafe_Park", "libjvm.so"),
        frame("jdk.internal.misc.Unsafe.park", "JIT"),
        frame("java.util.concurrent.locks.LockSupport.park", "JIT"),
    ];
    frames.extend(inside.iter().map(|n| frame(n, "JIT")));
    frames.extend([
        frame("java.util.concurrent.ThreadPoolExecutor.getTask", "JIT"),
        frame("java.util.concurrent.ThreadPoolExecutor.runWorker", "JIT"),
        frame("Interpreter", "JIT"),
        frame("StubRoutines (1)", "JIT"),
        frame("JavaCalls::call_helper(JavaValue*, methodHandle const&, JavaCallArguments*, JavaThread*)", "libjvm.so"),
        frame("thread_native_entry(Thread*)", "libjvm.so"),
        frame("start_thread", "libc.so.6"),
        frame("clone3", "libc.so.6"),
    ]);
    frames
}

#[test]
fn a_jvm_pool_worker_is_told_waiting_for_work_from_waiting_for_its_queues_lock() {
    use super::{WaitKind::*, wait_kind};
    let jvm = Runtime::Jvm {
        frame_pointers: true,
    };
    let await_ = "java.util.concurrent.locks.AbstractQueuedSynchronizer$ConditionObject.await";
    let acquire = "java.util.concurrent.locks.AbstractQueuedSynchronizer.acquire";
    for (inside, lock_function, kind) in [
        // Waiting for work: the queue's condition.
        (
            vec![
                "java.util.concurrent.locks.AbstractQueuedSynchronizer$ConditionNode.block",
                "java.util.concurrent.ForkJoinPool.managedBlock",
                await_,
                "java.util.concurrent.ArrayBlockingQueue.take",
            ],
            "AbstractQueuedSynchronizer$ConditionObject.await",
            Condition,
        ),
        // Signalled, re-taking the queue's lock inside the wait: still the condition wait's.
        (
            vec![
                acquire,
                await_,
                "java.util.concurrent.LinkedBlockingQueue.take",
            ],
            "AbstractQueuedSynchronizer$ConditionObject.await",
            Condition,
        ),
        // Queued for the queue's lock at `take`'s entry: a lock.
        (
            vec![
                acquire,
                "java.util.concurrent.locks.AbstractQueuedSynchronizer.acquireInterruptibly",
                "java.util.concurrent.locks.ReentrantLock$Sync.lockInterruptibly",
                "java.util.concurrent.locks.ReentrantLock.lockInterruptibly",
                "java.util.concurrent.LinkedBlockingQueue.take",
            ],
            "AbstractQueuedSynchronizer.acquire",
            Lock,
        ),
    ] {
        let (site, hint) = pick_site(&jvm_pool_worker(&inside), jvm);
        assert_eq!(site.function, None, "{inside:?}");
        assert_eq!(hint, None);
        assert_eq!(
            site.lock_function.as_deref(),
            Some(lock_function),
            "{inside:?}"
        );
        assert_eq!(wait_kind(lock_function), Some(kind));
        // The stack was whole: it says so, not that the unwinder stopped.
        let why = site.unnamed.unwrap();
        assert!(why.contains("down to the thread's start"), "{why}");
    }
    // Compiled with everything inlined into `take` (what a busy pool's workers show, seen on
    // JDK 17 with a perf map and -XX:+PreserveFramePointer): its lock and its condition under
    // one name, so neither.
    let (site, _) = pick_site(
        &jvm_pool_worker(&["java.util.concurrent.ArrayBlockingQueue.take"]),
        jvm,
    );
    let lock_function = site.lock_function.unwrap();
    assert_eq!(wait_kind(&lock_function), None, "{lock_function}");
}

#[test]
fn a_jvm_without_frame_pointers_names_nothing_and_says_which_flag() {
    let frames = [
        frame("___pthread_cond_wait", "libc.so.6"),
        frame("Unsafe_Park", "libjvm.so"),
        frame("jdk.internal.misc.Unsafe.park", "JIT"),
    ];
    let (site, hint) = pick_site(
        &frames,
        Runtime::Jvm {
            frame_pointers: false,
        },
    );
    assert_eq!(site.function, None);
    assert!(hint.unwrap().contains("-XX:+PreserveFramePointer"));
}

#[test]
fn compiled_java_without_a_perf_map_entry_says_how_to_write_one() {
    let frames = [
        frame("___pthread_cond_wait", "libc.so.6"),
        frame("Parker::park(bool, long)", "libjvm.so"),
        frame("Unsafe_Park", "libjvm.so"),
        Frame {
            name: None,
            location: None,
            module: Some("JIT".to_owned()),
            lookup: None,
        },
    ];
    let (site, hint) = pick_site(
        &frames,
        Runtime::Jvm {
            frame_pointers: true,
        },
    );
    assert_eq!(site.function, None);
    assert!(hint.unwrap().contains("jcmd <pid> Compiler.perfmap"));
    // Only HotSpot's native frames are named: its park is every wait's, so it says neither
    // lock nor condition.
    let lock_function = site.lock_function.unwrap();
    assert_eq!(super::wait_kind(&lock_function), None, "{lock_function}");
}

#[test]
fn go_runtime_parking_is_named_as_such() {
    let frames = [
        frame("runtime.futex", "httpload"),
        frame("runtime.futexsleep", "httpload"),
        frame("runtime.notesleep", "httpload"),
        frame("runtime.stopm", "httpload"),
    ];
    let (site, _) = pick_site(&frames, Runtime::Go);
    assert_eq!(site.function, None);
    assert!(site.unnamed.unwrap().contains("Go's runtime"));
}

#[test]
fn perf_maps_parse_with_or_without_0x_and_look_up_by_range() {
    let entries = parse_perf_map(
        "0x7f0000001000 0x100 void Corpus$Cache.get(int)\n7f0000000000 80 Interpreter\nbad line\n",
    );
    let map = PerfMap {
        entries,
        stamp: None,
    };
    assert_eq!(map.lookup(0x7f0000000010), Some("Interpreter"));
    assert_eq!(map.lookup(0x7f0000000080), None);
    assert_eq!(
        map.lookup(0x7f00000010ff).map(java_name),
        Some("Corpus$Cache.get".to_owned())
    );
    assert_eq!(map.lookup(0x7f0000001100), None);
}

#[test]
fn the_load_bias_comes_from_the_segment_holding_the_mapped_offset() {
    // A PIE's text segment at 0x1000 in the file and in its addresses, mapped at 0x5555_5555_5000.
    let segments = [(0, 0, 0x600), (0x1000, 0x1000, 0x2000)];
    assert_eq!(
        bias_of(&segments, 0x1000, 0x5555_5555_5000),
        Some(0x5555_5555_4000)
    );
    // A segment that starts inside the page where the one before it ends (as rustc's and
    // lld's binaries do): mapped from the page's start.
    let segments = [(0, 0, 0x558a3c), (0x558a40, 0x559a40, 0xfbe1b0)];
    assert_eq!(
        bias_of(&segments, 0x558000, 0x5600_0055_9000),
        Some(0x5600_0000_0000)
    );
    // libc: file offset 0x28000 holds addresses from 0x28000.
    let segments = [(0, 0, 0x28000), (0x28000, 0x28000, 0x15_0000)];
    assert_eq!(
        bias_of(&segments, 0x28000, 0x7f00_0002_8000),
        Some(0x7f00_0000_0000)
    );
}

#[test]
fn maps_lines_parse() {
    let m = parse_maps_line(
        "7f2c1a428000-7f2c1a5bd000 r-xp 00028000 fe:01 1234 /usr/lib/x86_64-linux-gnu/libc.so.6",
    )
    .unwrap();
    assert_eq!(m.range, 0x7f2c1a428000..0x7f2c1a5bd000);
    assert!(m.exec);
    assert_eq!(m.offset, 0x28000);
    assert_eq!(m.path, Some("/usr/lib/x86_64-linux-gnu/libc.so.6"));
    let anon = parse_maps_line("7f2c00000000-7f2c00021000 rwxp 00000000 00:00 0").unwrap();
    assert!(anon.exec);
    assert_eq!(anon.path, None);
}

unsafe extern "C" {
    fn pthread_mutex_lock(m: *mut std::ffi::c_void) -> i32;
}

#[test]
fn an_exported_libc_function_is_named_from_its_symbols() {
    let addr = pthread_mutex_lock as *const () as u64 + 4;
    let mut s = UserSymbolizer::new(true);
    let tgid = std::process::id();
    s.refresh(tgid, addr).expect("our own maps");
    let m = s.processes[&tgid]
        .mapping(addr)
        .cloned()
        .expect("libc is mapped");
    let f = s.name_in_file(tgid, &m, addr);
    // Its exported name, or its internal one where libc's debug information is installed.
    assert_eq!(
        f.name.as_deref().map(short_lock_name).as_deref(),
        Some("pthread_mutex_lock"),
        "{f:?} in {m:?}"
    );
}

#[test]
fn lock_function_names_lose_cpp_parameters_but_keep_go_receivers() {
    assert_eq!(
        short_lock_name(
            "SharedRuntime::complete_monitor_unlocking_C(oopDesc*, BasicLock*, JavaThread*)"
        ),
        "SharedRuntime::complete_monitor_unlocking_C"
    );
    assert_eq!(
        short_lock_name("internal/sync.(*Mutex).lockSlow"),
        "internal/sync.(*Mutex).lockSlow"
    );
    assert_eq!(
        short_lock_name("___pthread_mutex_lock"),
        "pthread_mutex_lock"
    );
    assert_eq!(short_lock_name("__GI___lll_lock_wait"), "lll_lock_wait");
    assert_eq!(
        short_lock_name("java.util.concurrent.locks.ReentrantLock.lock"),
        "ReentrantLock.lock"
    );
}

/// An ELF file whose call-frame sections are `mib` MiB.
fn elf_of(mib: u64) -> Arc<ElfFile> {
    let bytes = Bytes(Arc::new(vec![0; (mib << 20) as usize]));
    Arc::new(ElfFile {
        segments: Vec::new(),
        text: None,
        eh_frame: Some((0..mib << 20, bytes)),
        eh_frame_hdr: None,
        got: None,
        is_go: false,
    })
}

fn cached(cache: &mut FileCache, key: u64, file: &Arc<ElfFile>, used: Instant) {
    cache.bytes += file.bytes();
    cache.files.insert(
        (1, key, 0),
        CachedFile {
            file: file.clone(),
            bytes: file.bytes(),
            used,
        },
    );
}

#[test]
fn files_no_view_maps_go_after_a_while_or_least_recently_used_first_when_room_is_needed() {
    let t0 = Instant::now();
    let mut cache = FileCache::default();
    let (a, b, c) = (elf_of(5), elf_of(5), elf_of(5));
    cached(&mut cache, 1, &a, t0);
    cached(&mut cache, 2, &b, t0 + Duration::from_secs(1));
    cached(&mut cache, 3, &c, t0 + Duration::from_secs(2));
    // A view maps the oldest: it is never dropped while it does.
    let mapped = a.clone();
    drop((a, b, c));
    // Room for 5 more MiB (20 > 16): the least recently used file no view maps goes.
    cache.evict(5 << 20, t0 + Duration::from_secs(3));
    let keys = |c: &FileCache| {
        let mut k: Vec<u64> = c.files.keys().map(|k| k.1).collect();
        k.sort_unstable();
        k
    };
    assert_eq!(keys(&cache), [1, 3]);
    assert_eq!(cache.bytes, 10 << 20);
    assert!(cache.fits(5 << 20));
    // Unused for UNUSED_FILE_TTL: gone, unless mapped.
    cache.evict(0, t0 + Duration::from_secs(2) + UNUSED_FILE_TTL);
    assert_eq!(keys(&cache), [1]);
    drop(mapped);
    cache.evict(0, t0 + Duration::from_secs(2) + UNUSED_FILE_TTL);
    assert!(cache.files.is_empty());
    assert_eq!(cache.bytes, 0);
    // Larger than the whole budget: never fits.
    assert!(!cache.fits(MAX_ELF_BYTES + 1));
}

#[cfg(target_arch = "x86_64")]
#[test]
fn what_was_read_for_a_process_goes_when_it_is_gone() {
    let mut stack = vec![0u8; 4096];
    let (ip, sp, bp) = a_caller_with_a_name(&mut stack);
    let mut s = UserSymbolizer::new(false);
    let sample = StackSample {
        tgid: std::process::id(),
        ip,
        sp,
        bp,
        stack: &stack,
    };
    s.frames(&sample).expect("our own process can be read");
    let size = |s: &UserSymbolizer, name: &str| {
        s.cache_sizes()
            .into_iter()
            .find(|c| c.name == name)
            .expect("a cache of that name")
    };
    assert_eq!(size(&s, "user_processes").entries, 1);
    assert!(size(&s, "elf_files").entries > 0);
    assert!(size(&s, "elf_files").bytes.unwrap() > 0);
    assert!(size(&s, "symbol_names").entries > 0);
    // A second process of the same binary would read nothing again: names are by file.
    let names = size(&s, "symbol_names").entries;
    s.processes.clear();
    s.frames(&sample).expect("read again");
    assert_eq!(size(&s, "symbol_names").entries, names);
    // The process exits: its view goes at once, its files once unused for a while, and their
    // names with them.
    s.retain(|_| false);
    assert_eq!(size(&s, "user_processes").entries, 0);
    s.files
        .evict(0, Instant::now() + UNUSED_FILE_TTL + Duration::from_secs(1));
    s.retain(|_| false);
    for cache in ["elf_files", "symbol_names"] {
        assert_eq!(size(&s, cache).entries, 0, "{cache}");
    }
    assert_eq!(size(&s, "elf_files").bytes, Some(0));
}

#[test]
fn what_a_waiter_waited_for_is_read_from_its_machinery() {
    use super::{WaitKind::*, wait_kind};
    for (name, kind) in [
        ("pthread_cond_wait", Some(Condition)),
        ("pthread_cond_clockwait", Some(Condition)),
        ("cnd_timedwait", Some(Condition)),
        ("std::condition_variable::wait", Some(Condition)),
        ("JVM_MonitorWait", Some(Condition)),
        ("ArrayBlockingQueue.take", Some(Condition)),
        ("ThreadPoolExecutor.getTask", Some(Condition)),
        ("pthread_mutex_lock", Some(Lock)),
        ("pthread_rwlock_rdlock", Some(Lock)),
        (
            "InterpreterRuntime::monitorenter(JavaThread*, BasicObjectLock*)",
            Some(Lock),
        ),
        ("ReentrantReadWriteLock$WriteLock.lock", Some(Lock)),
        ("parking_lot::raw_mutex::RawMutex::lock_slow", Some(Lock)),
        // Rust's v0 names: the type of an inherent method in angle brackets (tokio's idle
        // worker parks in std's condition variable).
        (
            "<std::sys::sync::condvar::futex::Condvar>::wait",
            Some(Condition),
        ),
        (
            "<parking_lot::condvar::Condvar>::wait_until_internal",
            Some(Condition),
        ),
        (
            "<std::sys::sync::rwlock::futex::RwLock>::read_contended",
            Some(Lock),
        ),
        ("<parking_lot::raw_mutex::RawMutex>::lock_slow", Some(Lock)),
        ("Parker::park(bool, long)", None),
        ("sem_wait", None),
        ("futex", None),
    ] {
        assert_eq!(wait_kind(name), kind, "{name}");
    }
}
