//! Lock profiles in pprof's format (`profile.proto`, gzip-compressed), the format `go tool
//! pprof`, Grafana Pyroscope and Parca read: one profile per container of its sampled
//! hand-offs' whole stacks ([`LockStacks`]), both sides in one file.
//!
//! Sample types, one value each per sample:
//!
//! | type | unit | a waiter's stack | a waker's stack |
//! |---|---|---|---|
//! | `waits` | count | the sampled futex waits it stands for | 0 |
//! | `wait_time` | nanoseconds | those waits' time | 0 |
//! | `wakes` | count | 0 | the sampled futex wakes that handed the lock on |
//! | `woken_wait_time` | nanoseconds | 0 | the time of the waits they ended |
//! | `go_contended_locks` | count | Go: sampled `Lock` calls on a held mutex | 0 |
//! | `go_handing_unlocks` | count | 0 | Go: sampled `Unlock` calls handing it on |
//!
//! so `go tool pprof -top FILE` ranks the code that waits for the lock, and
//! `-sample_index=wakes` the code that hands it on. The default type is `waits`, or
//! `go_contended_locks` where the container's Go mutexes were sampled: a Go program's futex
//! waits are its runtime's own parking, and its goroutines wait for a `sync.Mutex` in the Go
//! scheduler, which its uprobes sample (untimed, in bursts). Each sample's leaf is the site (the first
//! frame outside the lock machinery, as `lock_call_sites` names it) and its callers follow; the
//! machinery it called is the `lock` label, the holder's part the `holder` label (`on_cpu`,
//! `preempted`, `asleep`, `preempted_and_asleep`), the side the `side` label (`-tagfocus`,
//! `-tags`). A JIT-compiled frame's file says that methods may be inlined into it.
//!
//! The protobuf is written by hand: a profile is five message types of varints, strings and
//! packed arrays, and this file is its only writer.

use std::{
    collections::{HashMap, HashSet},
    io::Write as _,
    path::{Path, PathBuf},
    time::SystemTime,
};

use crate::symbolize::stacks::{LockStacks, Side, StackFrame};

/// The file a JIT-compiled frame names: a frame walk sees one frame where the JIT may have
/// inlined several methods.
pub const JIT_FILE: &str = "JIT-compiled code (methods may be inlined into this frame)";

/// What a profile is of, for its header.
pub struct ProfileAbout<'a> {
    /// The container, as the reports name it.
    pub container: &'a str,
    /// When the window ended, and how long it was.
    pub end: SystemTime,
    pub duration: std::time::Duration,
}

/// The gzip-compressed `profile.proto` of `stacks`.
pub fn encode(stacks: &LockStacks, about: &ProfileAbout<'_>) -> Vec<u8> {
    let raw = profile(stacks, about);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&raw).expect("writing to a Vec");
    gz.finish().expect("writing to a Vec")
}

/// A container's profile, encoded: its name as the reports give it, its file name
/// (`<name>.lock.pb.gz`, [`file_name`]), and the gzip-compressed profile.
pub struct Encoded {
    pub container: String,
    pub file: String,
    pub gz: Vec<u8>,
}

/// The profiles of the containers of `containers` (cgroup id, name) that have sampled stacks
/// in `stacks`, each under a file name of its own: two names that read the same as files are
/// told apart by the cgroup id.
pub fn encode_all(
    containers: &[(u64, String)],
    stacks: impl Fn(u64) -> Option<LockStacks>,
    end: SystemTime,
    duration: std::time::Duration,
) -> Vec<Encoded> {
    let mut out = Vec::new();
    let mut used = HashSet::new();
    for (id, name) in containers {
        let Some(s) = stacks(*id).filter(|s| !s.is_empty()) else {
            continue;
        };
        let mut stem = file_name(name);
        if !used.insert(stem.clone()) {
            stem = format!("{stem}-{id}");
            used.insert(stem.clone());
        }
        let about = ProfileAbout {
            container: name,
            end,
            duration,
        };
        out.push(Encoded {
            container: name.clone(),
            file: format!("{stem}.lock.pb.gz"),
            gz: encode(&s, &about),
        });
    }
    out
}

/// Writes [`encode_all`]'s profiles into `dir` (made if missing); returns the files written,
/// by container name.
pub fn write_dir(
    dir: &Path,
    containers: &[(u64, String)],
    stacks: impl Fn(u64) -> Option<LockStacks>,
    end: SystemTime,
    duration: std::time::Duration,
) -> std::io::Result<Vec<(String, PathBuf)>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    for e in encode_all(containers, stacks, end, duration) {
        let path = dir.join(&e.file);
        std::fs::write(&path, &e.gz)?;
        written.push((e.container, path));
    }
    Ok(written)
}

/// A container's name as a file name: what is not a letter, digit, `.`, `-` or `_` becomes
/// `_`, and leading `_`/`.` go (no hidden files, no `..`).
pub fn file_name(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let s = s.trim_start_matches(['_', '.']);
    if s.is_empty() {
        "root".to_owned()
    } else {
        s.to_owned()
    }
}

/// Strings by index, the first empty (as the format asks).
#[derive(Default)]
struct Strings {
    index: HashMap<String, u64>,
    table: Vec<String>,
}

impl Strings {
    fn new() -> Self {
        let mut s = Self::default();
        s.get("");
        s
    }

    fn get(&mut self, s: &str) -> u64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as u64;
        self.table.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

/// The one mapping every location is in.
const MAPPING_ID: u64 = 1;

/// The sample types, in the order of each sample's values.
const SAMPLE_TYPES: [(&str, &str); 6] = [
    ("waits", "count"),
    ("wait_time", "nanoseconds"),
    ("wakes", "count"),
    ("woken_wait_time", "nanoseconds"),
    ("go_contended_locks", "count"),
    ("go_handing_unlocks", "count"),
];

fn profile(stacks: &LockStacks, about: &ProfileAbout<'_>) -> Vec<u8> {
    let mut strings = Strings::new();
    let mut out = Vec::new();
    for (ty, unit) in SAMPLE_TYPES {
        let mut m = Vec::new();
        field_varint(&mut m, 1, strings.get(ty));
        field_varint(&mut m, 2, strings.get(unit));
        field_bytes(&mut out, 1, &m);
    }

    // Functions by (name, file), locations by (function, line): the same code shared by every
    // stack it is in.
    let mut functions: HashMap<(String, String), u64> = HashMap::new();
    let mut function_msgs = Vec::new();
    let mut locations: HashMap<(u64, i64), u64> = HashMap::new();
    let mut location_msgs = Vec::new();
    let mut jit = false;
    // Stacks in a stable order, so that the same window writes the same file.
    let mut all: Vec<_> = stacks.stacks.iter().collect();
    all.sort_by(|a, b| a.0.cmp(b.0));
    for (key, v) in all {
        let mut ids = Vec::with_capacity(key.frames.len());
        for f in &key.frames {
            jit |= f.is_jit();
            let (file, line) = file_and_line(f);
            let next = functions.len() as u64 + 1;
            let fid = *functions
                .entry((f.function.clone(), file.clone()))
                .or_insert_with(|| {
                    let mut m = Vec::new();
                    field_varint(&mut m, 1, next);
                    field_varint(&mut m, 2, strings.get(&f.function));
                    field_varint(&mut m, 3, strings.get(&f.function));
                    field_varint(&mut m, 4, strings.get(&file));
                    function_msgs.push(m);
                    next
                });
            let next = locations.len() as u64 + 1;
            let lid = *locations.entry((fid, line)).or_insert_with(|| {
                let mut l = Vec::new();
                field_varint(&mut l, 1, fid);
                field_varint(&mut l, 2, line as u64);
                let mut m = Vec::new();
                field_varint(&mut m, 1, next);
                field_varint(&mut m, 2, MAPPING_ID);
                field_bytes(&mut m, 4, &l);
                location_msgs.push(m);
                next
            });
            ids.push(lid);
        }
        let values = [
            v.waits,
            v.wait_ns,
            v.wakes,
            v.woken_wait_ns,
            v.go_contended_locks,
            v.go_handing_unlocks,
        ];
        let mut m = Vec::new();
        field_packed(&mut m, 1, &ids);
        field_packed(&mut m, 2, &values);
        let side = match key.side {
            Side::Waiter => "waiter",
            Side::Waker => "waker",
        };
        let mut labels = vec![("side", side)];
        if let Some(l) = &key.lock_function {
            labels.push(("lock", l));
        }
        if let Some(h) = key.holder {
            labels.push(("holder", h.label()));
        }
        for (k, s) in labels {
            let mut l = Vec::new();
            field_varint(&mut l, 1, strings.get(k));
            field_varint(&mut l, 2, strings.get(s));
            field_bytes(&mut m, 3, &l);
        }
        field_bytes(&mut out, 2, &m);
    }
    // One mapping that says the frames are named already (pprof tools then ask for no
    // binary), its file the container, which `go tool pprof` shows as the profile's `File`.
    let mut mapping = Vec::new();
    field_varint(&mut mapping, 1, MAPPING_ID);
    field_varint(&mut mapping, 5, strings.get(about.container));
    field_varint(&mut mapping, 7, 1);
    field_varint(&mut mapping, 8, 1);
    field_bytes(&mut out, 3, &mapping);
    for m in &location_msgs {
        field_bytes(&mut out, 4, m);
    }
    for m in &function_msgs {
        field_bytes(&mut out, 5, m);
    }

    let go = stacks.has_go_mutex();
    let default_type = if go { 4 } else { 0 };
    let mut comments = vec![format!(
        "stormwatch lock profile of {}: sampled futex hand-offs, a sample of the waits, not \
         every one; waits and wait_time from the waiters' stacks, wakes and woken_wait_time \
         from the wakers'",
        about.container,
    )];
    if go {
        comments.push(
            "Go sync.Mutex: go_contended_locks and go_handing_unlocks, sampled slow-path \
             entries of Lock and Unlock in the uprobes' bursts (the default type here; the \
             futex waits are the Go runtime's own)"
                .to_owned(),
        );
    }
    if jit {
        comments.push(format!(
            "frames in JIT-compiled code are named by the runtime's perf map, one method per \
             frame: methods inlined into it are not shown (its file says \"{JIT_FILE}\")"
        ));
    }
    if stacks.overflowed() {
        comments.push(format!(
            "more distinct stacks than a profile keeps ({}): the rest are counted under one",
            crate::symbolize::stacks::MAX_STACKS
        ));
    }
    let comment_ids: Vec<u64> = comments.iter().map(|c| strings.get(c)).collect();
    let end_ns = about
        .end
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let duration_ns = about.duration.as_nanos() as u64;
    field_varint(&mut out, 9, end_ns.saturating_sub(duration_ns));
    field_varint(&mut out, 10, duration_ns);
    let (ty, unit) = SAMPLE_TYPES[default_type];
    let mut period_type = Vec::new();
    field_varint(&mut period_type, 1, strings.get(ty));
    field_varint(&mut period_type, 2, strings.get(unit));
    field_bytes(&mut out, 11, &period_type);
    field_varint(&mut out, 12, 1);
    field_packed(&mut out, 13, &comment_ids);
    field_varint(&mut out, 14, strings.get(ty));
    // The string table last: every string above is in it.
    for s in &strings.table {
        field_bytes(&mut out, 6, s.as_bytes());
    }
    out
}

/// A frame's file and line: its `file:line` where looked up, else its binary (or, for JIT
/// code, [`JIT_FILE`]).
fn file_and_line(f: &StackFrame) -> (String, i64) {
    if let Some((file, line)) = f
        .location
        .as_deref()
        .and_then(|l| l.rsplit_once(':'))
        .and_then(|(file, line)| Some((file, line.parse::<i64>().ok()?)))
    {
        return (file.to_owned(), line);
    }
    if f.is_jit() {
        return (JIT_FILE.to_owned(), 0);
    }
    (f.module.clone().unwrap_or_default(), 0)
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A varint field; zero is the default and is left out, as protobuf writers do.
fn field_varint(out: &mut Vec<u8>, field: u64, v: u64) {
    if v != 0 {
        varint(out, field << 3);
        varint(out, v);
    }
}

fn field_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, (field << 3) | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn field_packed(out: &mut Vec<u8>, field: u64, values: &[u64]) {
    if values.is_empty() {
        return;
    }
    let mut packed = Vec::new();
    for &v in values {
        varint(&mut packed, v);
    }
    field_bytes(out, field, &packed);
}

#[cfg(test)]
mod tests;
