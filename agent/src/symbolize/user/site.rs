//! What a user stack's frames say: the site where a lock is taken or handed on (the first
//! frame outside the lock machinery, with the machinery frame it called), named frames, and
//! what kind of wait a lock function is.

use std::path::PathBuf;

use serde::Serialize;

use super::files::FileKey;

/// Where a contended user-space lock is taken or handed on.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct UserSite {
    /// The first function outside the lock machinery (a Java method as `Class.method`), or
    /// `None` when it could not be named (`unnamed` says why).
    pub function: Option<String>,
    /// The machinery frame it called: `pthread_mutex_lock`, `ReentrantLock.lock`, …
    pub lock_function: Option<String>,
    /// `file:line`, where the binary has DWARF lines.
    pub location: Option<String>,
    /// The binary (file name) the function is in, or `JIT` for a JVM's compiled code.
    pub module: Option<String>,
    /// Why the site has no name, and what would give it one.
    pub unnamed: Option<String>,
}

impl UserSite {
    pub(crate) fn unnamed(why: impl Into<String>) -> Self {
        Self {
            function: None,
            lock_function: None,
            location: None,
            module: None,
            unnamed: Some(why.into()),
        }
    }

    /// `function (file:line)` via `lock_function`, or `unnamed: why`, for a line of text. A
    /// JIT-compiled function says that the code may be a method inlined into it: a frame walk
    /// sees one frame where the JIT may have folded several methods (a perf map names the
    /// outermost).
    pub fn describe(&self) -> String {
        match &self.function {
            Some(f) => {
                let mut s = format!("`{f}`");
                if let Some(loc) = &self.location {
                    s.push_str(&format!(" ({loc})"));
                }
                if self.module.as_deref() == Some("JIT") {
                    s.push_str(" (JIT-compiled: methods may be inlined into it)");
                }
                if let Some(l) = &self.lock_function {
                    s.push_str(&format!(" via `{l}`"));
                }
                s
            }
            None => format!(
                "an unnamed site ({})",
                self.unnamed.as_deref().unwrap_or("unknown")
            ),
        }
    }
}

/// One frame, named as far as it can be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub name: Option<String>,
    pub location: Option<String>,
    /// The file name of the binary, or `JIT` (an anonymous executable mapping).
    pub module: Option<String>,
    /// Where its line can be looked up.
    pub lookup: Option<Lookup>,
}

/// Where a frame's name and line are looked up: the file (by its key, and by a path through
/// `/proc/<pid>/root`) and the address in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lookup {
    pub path: PathBuf,
    pub(super) file: FileKey,
    pub addr: u64,
}

/// A process's runtime, as far as naming its stacks goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Runtime {
    Native,
    /// A HotSpot JVM, and whether it keeps frame pointers in compiled code
    /// (`-XX:+PreserveFramePointer`), without which its compiled frames cannot be walked.
    Jvm {
        frame_pointers: bool,
    },
    Go,
}

/// A perf-map name as a person reads it: HotSpot's `void pkg.Class.method(args)` → `pkg.Class.method`.
pub(super) fn java_name(name: &str) -> String {
    let name = name.split_once('(').map_or(name, |(n, _)| n);
    name.rsplit(' ').next().unwrap_or(name).to_owned()
}

/// Symbol fragments of locking and parking code: frames looked through to reach the caller.
pub(super) fn is_machinery(frame: &Frame, runtime: Runtime) -> bool {
    let module = frame.module.as_deref().unwrap_or("");
    // Named or not (libc's internal functions are in no symbol table a node keeps).
    if module.starts_with("libc.so")
        || module.starts_with("libpthread")
        || module.starts_with("ld-linux")
        || module == "libjvm.so"
    {
        return true;
    }
    let Some(name) = &frame.name else {
        return false;
    };
    // Go: the runtime, and the sync package's slow paths into it (a sync.Mutex's unlocker
    // that finds the runtime's own semaphore lock contended waits on a futex there).
    if runtime == Runtime::Go
        && ["runtime.", "runtime/", "sync.", "internal/sync."]
            .iter()
            .any(|p| name.starts_with(p))
    {
        return true;
    }
    const NATIVE: &[&str] = &[
        "__lll_",
        "pthread_mutex",
        "pthread_rwlock",
        "pthread_cond",
        "___pthread",
        "__pthread",
        "futex",
        "std::sys::sync",
        "std::sync::",
        "parking_lot",
        "lock_api::",
    ];
    // java.util.concurrent whole: its queues, pools and locks all park through LockSupport; the
    // code that called them is the site.
    const JAVA: &[&str] = &[
        "java.util.concurrent.",
        "jdk.internal.misc.Unsafe.",
        "java.lang.Object.wait",
        "java.lang.Thread.sleep",
        "java.lang.invoke.",
    ];
    if module == "JIT" {
        // Stubs and adapters (no `Class.method` shape) are the JVM's own.
        return JAVA.iter().any(|p| name.starts_with(p)) || !name.contains('.');
    }
    NATIVE.iter().any(|p| name.contains(p))
}

/// The site of an unwound stack (innermost frame first): the first frame outside the
/// machinery, with the machinery frame just inside it.
#[cfg(test)]
pub(super) fn pick_site(frames: &[Frame], runtime: Runtime) -> (UserSite, Option<String>) {
    let (site, hint, _) = pick_site_at(frames, runtime);
    (site, hint)
}

/// [`pick_site`], with the index of the site's frame when it has one.
pub(super) fn pick_site_at(
    frames: &[Frame],
    runtime: Runtime,
) -> (UserSite, Option<String>, Option<usize>) {
    let mut machinery = Vec::new();
    for (i, frame) in frames.iter().enumerate() {
        if is_machinery(frame, runtime) {
            if let Some(name) = frame.name.as_deref() {
                machinery.push((
                    short_lock_name(name),
                    frame.module.as_deref() == Some("JIT"),
                ));
            }
            continue;
        }
        let inner = deciding_lock_function(&machinery);
        let Some(name) = &frame.name else {
            let why = match (frame.module.as_deref(), runtime) {
                (Some("JIT"), Runtime::Jvm { .. }) => {
                    "JIT-compiled Java code without a perf map entry"
                }
                (Some("JIT"), _) => "code in an anonymous mapping (JIT) without a perf map",
                _ => "a stripped binary without symbols",
            };
            // The machinery it waited in still says what it waited for (`wait_kind`).
            let site = UserSite {
                lock_function: inner,
                ..UserSite::unnamed(why)
            };
            return (site, hint_for(frame, runtime), None);
        };
        return (
            UserSite {
                function: Some(name.clone()),
                lock_function: inner,
                location: frame.location.clone(),
                module: frame.module.clone(),
                unnamed: None,
            },
            None,
            Some(i),
        );
    }
    let why = match runtime {
        Runtime::Go => {
            "Go's runtime parking its own threads (a sync.Mutex wait is not a futex wait)"
        }
        Runtime::Jvm {
            frame_pointers: false,
        } => "the JVM's compiled frames keep no frame pointer",
        _ if frames.last().is_some_and(is_thread_start) => {
            "every frame is lock, runtime or library code, down to the thread's start (a pool's \
             worker waiting in its library's own code)"
        }
        _ => "the stack ended inside the lock code (no call-frame information past it)",
    };
    let hint = match runtime {
        Runtime::Jvm {
            frame_pointers: false,
        } => Some(
            "start the JVM with -XX:+PreserveFramePointer to name the Java code above its locks"
                .to_owned(),
        ),
        _ => None,
    };
    // What it waited in still says what it waited for (`wait_kind`).
    let site = UserSite {
        lock_function: deciding_lock_function(&machinery),
        ..UserSite::unnamed(why)
    };
    (site, hint, None)
}

/// The lock function of a site, from the named machinery frames inside it (innermost first,
/// each with whether it is JIT-compiled code): the outermost, the API the application called
/// (a glibc condition wait that re-takes its mutex is `pthread_cond_wait`), when [`wait_kind`]
/// reads it. Where it does not — a pool's worker whose outermost machinery frames are its
/// thread's start (a JVM's `ThreadPoolExecutor` worker: every frame down to `start_thread` is
/// the JDK's or the JVM's) — the innermost managed (JIT or interpreted) frame it reads:
/// `ConditionObject.await` under a queue's `take` (waiting for work),
/// `AbstractQueuedSynchronizer.acquire` under `ReentrantLock.lock` (waiting for a lock); a
/// queue's `take` with nothing named inside it (compiled, inlined) is either, so neither. Never
/// the native frames under them: HotSpot parks every wait on the thread's own condition
/// variable, so the `pthread_cond_wait` under `Parker::park` says nothing. The lock a JVM
/// condition wait re-takes when signalled (`acquire` called by `await`) is the condition
/// wait's, as glibc's is.
pub(super) fn deciding_lock_function(machinery: &[(String, bool)]) -> Option<String> {
    let (outermost, _) = machinery.last()?;
    if wait_kind(outermost).is_some() {
        return Some(outermost.clone());
    }
    let mut read = machinery
        .iter()
        .filter(|(n, jit)| *jit && wait_kind(n).is_some())
        .map(|(n, _)| n);
    // A queue's or pool's method with nothing named inside it holds both a lock and a
    // condition wait (C2 inlines `take`'s `lockInterruptibly` and `await` into it, so one name
    // covers both): it says neither.
    let Some(first) = read
        .next()
        .filter(|n| !AMBIGUOUS.iter().any(|a| n.contains(a)))
    else {
        return Some(outermost.clone());
    };
    if first.starts_with("AbstractQueuedSynchronizer.acquire")
        && let Some(wait) = read.next().filter(|n| n.contains(".await"))
    {
        return Some(wait.clone());
    }
    Some(first.clone())
}

/// Managed methods that wait for a lock and for a condition both (a blocking queue's `take`
/// takes its lock, then waits on its condition).
pub(super) const AMBIGUOUS: &[&str] = &["Queue.take", "Queue.poll", "ThreadPoolExecutor.getTask"];

/// A thread's first frame: where the stack rightly ends.
pub(super) fn is_thread_start(frame: &Frame) -> bool {
    frame.name.as_deref().is_some_and(|n| {
        ["start_thread", "clone", "clone3", "__clone", "__clone3"].contains(&n)
            || n.starts_with("thread_native_entry")
    })
}

/// What would name a frame that has none.
pub(super) fn hint_for(frame: &Frame, runtime: Runtime) -> Option<String> {
    match (frame.module.as_deref(), runtime) {
        (Some("JIT"), Runtime::Jvm { .. }) => Some(
            "run `jcmd <pid> Compiler.perfmap` in the container (JDK 17+) to write the JVM's perf \
             map; names then follow within a collection"
                .to_owned(),
        ),
        (Some("JIT"), _) => {
            Some("have the runtime write a perf map (/tmp/perf-<pid>.map)".to_owned())
        }
        _ => Some(
            "keep the binary's symbols (no `strip`), or build it with frame pointers and symbols"
                .to_owned(),
        ),
    }
}

/// What a waiter waited for, from the lock machinery it waited in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitKind {
    /// A lock: a mutex, an rwlock, a JVM monitor's entry, a `java.util.concurrent` lock.
    Lock,
    /// A condition — work to arrive, a signal: a condition variable (its mutex's reacquire
    /// included, which happens inside the wait), `Object.wait`, a blocking queue's `take`.
    Condition,
}

/// What the waiter of a site waited for, from its `lock_function` (the outermost machinery
/// frame that has a name, so the API the application called: a glibc condition wait that
/// reacquires its mutex is `pthread_cond_wait`, a JVM monitor's entry parks through
/// `pthread_cond_wait` inside `ObjectMonitor::enter`, whose callers name it). `None` when the
/// name says neither (a bare `Parker::park`, a raw futex call). Rust's v0 names (the default
/// of recent toolchains) put an inherent method's type in angle brackets
/// (`<std::sys::sync::condvar::futex::Condvar>::wait`): they are read without them, as the
/// legacy names spell the same path.
pub fn wait_kind(lock_function: &str) -> Option<WaitKind> {
    const CONDITION: &[&str] = &[
        "cond_wait",
        "cond_timedwait",
        "cond_clockwait",
        "cnd_wait",
        "cnd_timedwait",
        "condition_variable",
        "Condvar::wait",
        "ObjectMonitor::wait",
        "ObjectSynchronizer::wait",
        "MonitorWait",
        "Object.wait",
        ".await",
        "Queue.take",
        "Queue.poll",
        "ThreadPoolExecutor.getTask",
    ];
    const LOCK: &[&str] = &[
        "mutex_lock",
        "mutex_timedlock",
        "mutex_clocklock",
        "rwlock",
        "lll_lock",
        "ObjectMonitor::enter",
        "ObjectMonitor::EnterI",
        "ObjectSynchronizer::enter",
        "monitorenter",
        "monitor_locking",
        "ReentrantLock",
        "ReentrantReadWriteLock",
        "AbstractQueuedSynchronizer.acquire",
        "Mutex::lock",
        "RwLock::",
        "lock_contended",
        "RawMutex::lock",
        "RawRwLock::",
    ];
    let name: String = lock_function
        .chars()
        .filter(|c| !matches!(c, '<' | '>'))
        .collect();
    if CONDITION.iter().any(|p| name.contains(p)) {
        Some(WaitKind::Condition)
    } else if LOCK.iter().any(|p| name.contains(p)) {
        Some(WaitKind::Lock)
    } else {
        None
    }
}

/// A lock function's name as people call it: `___pthread_mutex_lock` → `pthread_mutex_lock`,
/// `java.util.concurrent.locks.ReentrantLock.lock` → `ReentrantLock.lock`.
pub(super) fn short_lock_name(name: &str) -> String {
    for package in [
        "java.util.concurrent.locks.",
        "java.util.concurrent.",
        "jdk.internal.misc.",
    ] {
        if let Some(rest) = name.strip_prefix(package) {
            return rest.to_owned();
        }
    }
    // C++: without the parameter list (the last parenthesized group, at the end: Go's
    // `sync.(*Mutex).Lock` keeps its receiver).
    let name = match name.strip_suffix(')') {
        Some(_) => {
            let mut depth = 0;
            let mut cut = name.len();
            for (i, c) in name.char_indices().rev() {
                match c {
                    ')' => depth += 1,
                    '(' => {
                        depth -= 1;
                        if depth == 0 {
                            cut = i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            &name[..cut]
        }
        None => name,
    };
    name.trim_start_matches('_')
        .trim_start_matches("GI_")
        .trim_start_matches('_')
        .to_owned()
}
