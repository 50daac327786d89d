use std::{io::Read as _, time::Duration};

use super::*;
use crate::symbolize::{
    stacks::{Holder, StackValues},
    user::{Frame, UserSite},
};

/// A protobuf message's fields, by number: varints as numbers, length-delimited as bytes.
#[derive(Debug)]
enum Value {
    Int(u64),
    Bytes(Vec<u8>),
}

fn read_varint(b: &[u8], i: &mut usize) -> u64 {
    let (mut v, mut shift) = (0u64, 0);
    loop {
        let byte = b[*i];
        *i += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return v;
        }
        shift += 7;
    }
}

fn fields(b: &[u8]) -> Vec<(u64, Value)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let key = read_varint(b, &mut i);
        let v = match key & 7 {
            0 => Value::Int(read_varint(b, &mut i)),
            2 => {
                let n = read_varint(b, &mut i) as usize;
                i += n;
                Value::Bytes(b[i - n..i].to_vec())
            }
            w => panic!("wire type {w} is not written here"),
        };
        out.push((key >> 3, v));
    }
    out
}

fn ints(m: &[(u64, Value)], field: u64) -> Vec<u64> {
    m.iter()
        .filter(|(f, _)| *f == field)
        .flat_map(|(_, v)| match v {
            Value::Int(n) => vec![*n],
            Value::Bytes(b) => {
                let mut i = 0;
                let mut out = Vec::new();
                while i < b.len() {
                    out.push(read_varint(b, &mut i));
                }
                out
            }
        })
        .collect()
}

fn int(m: &[(u64, Value)], field: u64) -> u64 {
    ints(m, field).first().copied().unwrap_or(0)
}

fn messages(m: &[(u64, Value)], field: u64) -> Vec<Vec<(u64, Value)>> {
    m.iter()
        .filter(|(f, _)| *f == field)
        .map(|(_, v)| match v {
            Value::Bytes(b) => fields(b),
            Value::Int(_) => panic!("field {field} is a message"),
        })
        .collect()
}

/// A decoded sample: its frame names (leaf first), values and labels.
type Sample = (Vec<String>, Vec<u64>, Vec<(String, String)>);

/// A decoded profile: its samples, the sample types, the default one, the comments, and each
/// function's file by name.
struct Decoded {
    samples: Vec<Sample>,
    types: Vec<(String, String)>,
    default_type: String,
    comments: Vec<String>,
    files: HashMap<String, String>,
    duration_ns: u64,
}

fn decode(gz: &[u8]) -> Decoded {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut raw)
        .expect("gzip");
    let p = fields(&raw);
    let strings: Vec<String> = p
        .iter()
        .filter(|(f, _)| *f == 6)
        .map(|(_, v)| match v {
            Value::Bytes(b) => String::from_utf8(b.clone()).unwrap(),
            Value::Int(_) => panic!("a string"),
        })
        .collect();
    assert_eq!(strings[0], "", "the string table starts empty");
    let s = |i: u64| strings[i as usize].clone();
    let functions: HashMap<u64, (String, String)> = messages(&p, 5)
        .iter()
        .map(|f| (int(f, 1), (s(int(f, 2)), s(int(f, 4)))))
        .collect();
    let locations: HashMap<u64, u64> = messages(&p, 4)
        .iter()
        .map(|l| (int(l, 1), int(&messages(l, 4)[0], 1)))
        .collect();
    let samples = messages(&p, 2)
        .iter()
        .map(|m| {
            let frames = ints(m, 1)
                .iter()
                .map(|l| functions[&locations[l]].0.clone())
                .collect();
            let labels = messages(m, 3)
                .iter()
                .map(|l| (s(int(l, 1)), s(int(l, 2))))
                .collect();
            (frames, ints(m, 2), labels)
        })
        .collect();
    Decoded {
        samples,
        types: messages(&p, 1)
            .iter()
            .map(|t| (s(int(t, 1)), s(int(t, 2))))
            .collect(),
        default_type: s(int(&p, 14)),
        comments: ints(&p, 13).into_iter().map(s).collect(),
        files: functions.into_values().collect(),
        duration_ns: int(&p, 10),
    }
}

fn frame(name: &str, module: &str) -> Frame {
    Frame {
        name: Some(name.to_owned()),
        location: None,
        module: Some(module.to_owned()),
        lookup: None,
    }
}

fn site(lock: &str) -> UserSite {
    UserSite {
        function: Some("worker".into()),
        lock_function: Some(lock.into()),
        location: None,
        module: None,
        unnamed: None,
    }
}

#[test]
fn both_sides_decode_with_their_values_labels_and_frames() {
    let mut s = LockStacks::default();
    let mut worker = frame("worker", "lockbench");
    worker.location = Some("lockbench.c:42".into());
    let waiter = [worker, frame("start_thread", "libc.so.6")];
    let waker = [
        frame("release", "lockbench"),
        frame("start_thread", "libc.so.6"),
    ];
    for _ in 0..3 {
        s.record(
            Side::Waiter,
            &site("pthread_mutex_lock"),
            &waiter,
            Some(Holder::Preempted),
            StackValues {
                waits: 1,
                wait_ns: 1000,
                ..Default::default()
            },
        );
        s.record(
            Side::Waker,
            &site("pthread_mutex_unlock"),
            &waker,
            Some(Holder::Preempted),
            StackValues {
                wakes: 1,
                woken_wait_ns: 1000,
                ..Default::default()
            },
        );
    }
    let about = ProfileAbout {
        container: "default/web/app",
        end: SystemTime::UNIX_EPOCH + Duration::from_secs(100),
        duration: Duration::from_secs(10),
    };
    let d = decode(&encode(&s, &about));
    assert_eq!(
        d.types,
        [
            ("waits".into(), "count".into()),
            ("wait_time".into(), "nanoseconds".into()),
            ("wakes".into(), "count".into()),
            ("woken_wait_time".into(), "nanoseconds".into()),
            ("go_contended_locks".into(), "count".into()),
            ("go_handing_unlocks".into(), "count".into()),
        ]
    );
    assert_eq!(d.default_type, "waits");
    assert_eq!(d.duration_ns, 10_000_000_000);
    assert!(
        d.comments[0].contains("default/web/app"),
        "{:?}",
        d.comments
    );
    assert_eq!(d.samples.len(), 2);
    let by_side = |side: &str| {
        d.samples
            .iter()
            .find(|(_, _, l)| l.contains(&("side".into(), side.into())))
            .unwrap()
    };
    let (frames, values, labels) = by_side("waiter");
    assert_eq!(frames, &["worker", "start_thread"], "the site is the leaf");
    assert_eq!(values, &[3, 3000, 0, 0, 0, 0]);
    assert!(labels.contains(&("lock".into(), "pthread_mutex_lock".into())));
    assert!(labels.contains(&("holder".into(), "preempted".into())));
    let (frames, values, _) = by_side("waker");
    assert_eq!(frames, &["release", "start_thread"]);
    assert_eq!(values, &[0, 0, 3, 3000, 0, 0]);
    // The site's file:line is its function's file; the others name their binary.
    assert_eq!(d.files["worker"], "lockbench.c");
    assert_eq!(d.files["start_thread"], "libc.so.6");
    // The same frame in two stacks is one function.
    assert_eq!(d.files.len(), 3);
}

#[test]
fn jit_frames_say_methods_may_be_inlined_into_them() {
    let mut s = LockStacks::default();
    s.record(
        Side::Waiter,
        &site("ReentrantLock.lock"),
        &[frame("Corpus.work", "JIT"), frame("Corpus.run", "JIT")],
        None,
        StackValues {
            waits: 2,
            ..Default::default()
        },
    );
    let about = ProfileAbout {
        container: "jvm",
        end: SystemTime::now(),
        duration: Duration::from_secs(1),
    };
    let d = decode(&encode(&s, &about));
    assert_eq!(d.files["Corpus.work"], JIT_FILE);
    assert!(
        d.comments.iter().any(|c| c.contains("inlined")),
        "{:?}",
        d.comments
    );
    let (_, values, labels) = &d.samples[0];
    assert_eq!(values, &[2, 0, 0, 0, 0, 0]);
    assert_eq!(d.default_type, "waits");
    assert!(
        !labels.iter().any(|(k, _)| k == "holder"),
        "no hold on record"
    );
}

#[test]
fn an_empty_window_writes_no_file_and_names_are_safe_file_names() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = LockStacks::default();
    s.record(
        Side::Waiter,
        &site("pthread_mutex_lock"),
        &[frame("worker", "bin")],
        None,
        StackValues {
            waits: 1,
            ..Default::default()
        },
    );
    let containers = vec![
        (1, "default/web/app".to_owned()),
        (2, "/quiet.slice".to_owned()),
        (3, "default_web/app".to_owned()),
    ];
    let written = write_dir(
        dir.path(),
        &containers,
        |id| (id != 2).then(|| s.clone()),
        SystemTime::now(),
        Duration::from_secs(1),
    )
    .unwrap();
    let files: Vec<String> = written
        .iter()
        .map(|(_, p)| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    // Two names that read the same as files are told apart by the cgroup id.
    assert_eq!(
        files,
        ["default_web_app.lock.pb.gz", "default_web_app-3.lock.pb.gz"]
    );
    assert_eq!(file_name("/../x"), "x");
    assert_eq!(file_name("/"), "root");
    assert_eq!(
        decode(&std::fs::read(&written[0].1).unwrap()).samples.len(),
        1
    );
}

#[test]
fn a_go_programs_profile_defaults_to_its_mutex_samples() {
    let mut s = LockStacks::default();
    let go_site = UserSite {
        lock_function: Some("sync.(*Mutex).Lock".into()),
        ..site("")
    };
    s.record(
        Side::Waiter,
        &go_site,
        &[frame("main.worker", "gomutex")],
        None,
        StackValues {
            go_contended_locks: 5,
            ..Default::default()
        },
    );
    s.record(
        Side::Waiter,
        &UserSite::unnamed("Go's runtime parking its own threads"),
        &[frame("runtime.futex", "gomutex")],
        Some(Holder::OnCpu),
        StackValues {
            waits: 50,
            wait_ns: 7,
            ..Default::default()
        },
    );
    let about = ProfileAbout {
        container: "go",
        end: SystemTime::now(),
        duration: Duration::from_secs(1),
    };
    let d = decode(&encode(&s, &about));
    assert_eq!(d.default_type, "go_contended_locks");
    let go = d
        .samples
        .iter()
        .find(|(f, _, _)| f[0] == "main.worker")
        .unwrap();
    assert_eq!(go.1, [0, 0, 0, 0, 5, 0]);
    assert!(go.2.contains(&("lock".into(), "sync.(*Mutex).Lock".into())));
    assert!(d.comments.iter().any(|c| c.contains("Go sync.Mutex")));
}
