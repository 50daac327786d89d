//! The BPF maps a process holds, as the kernel accounts them: from the fdinfo of its map file
//! descriptors (`map_type`, `key_size`, `value_size`, `max_entries`, `memlock`, `map_id`), with
//! each map's name asked of the kernel by id (`BPF_MAP_GET_FD_BY_ID`, then
//! `BPF_OBJ_GET_INFO_BY_FD`; root). `memlock` is the kernel's own figure of the map's memory
//! (on 6.4 and later `bpf_map_memory_usage`: a per-CPU map's values counted once per possible
//! CPU). For the benchmarks (`exporter_bench --maps`): what the sizing formula is checked
//! against.

use std::{collections::BTreeMap, fmt};

/// One map, as its fdinfo and `bpf_map_info` describe it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MapInfo {
    pub id: u32,
    /// The name the object gave it (at most 15 bytes, as the kernel keeps it); `?` when the
    /// kernel would not tell.
    pub name: String,
    /// `enum bpf_map_type`.
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
    /// Bytes, the kernel's figure.
    pub memlock: u64,
}

/// The names of `enum bpf_map_type` (include/uapi/linux/bpf.h), by value.
const TYPES: [&str; 34] = [
    "unspec",
    "hash",
    "array",
    "prog_array",
    "perf_event_array",
    "percpu_hash",
    "percpu_array",
    "stack_trace",
    "cgroup_array",
    "lru_hash",
    "lru_percpu_hash",
    "lpm_trie",
    "array_of_maps",
    "hash_of_maps",
    "devmap",
    "sockmap",
    "cpumap",
    "xskmap",
    "sockhash",
    "cgroup_storage",
    "reuseport_sockarray",
    "percpu_cgroup_storage",
    "queue",
    "stack",
    "sk_storage",
    "devmap_hash",
    "struct_ops",
    "ringbuf",
    "inode_storage",
    "task_storage",
    "bloom_filter",
    "user_ringbuf",
    "cgrp_storage",
    "arena",
];

/// `BPF_F_NO_PREALLOC`: the map's entries are allocated as they are inserted.
pub const NO_PREALLOC: u32 = 1;

impl MapInfo {
    /// The type's name (`percpu_hash`), or its number when this list does not know it.
    pub fn type_name(&self) -> String {
        TYPES
            .get(self.map_type as usize)
            .map_or_else(|| self.map_type.to_string(), |t| (*t).to_owned())
    }

    /// Whether the map has a value per possible CPU.
    pub fn per_cpu(&self) -> bool {
        matches!(self.map_type, 5 | 6 | 10 | 21)
    }

    /// Whether its entries exist before they are used (hashes without `BPF_F_NO_PREALLOC`,
    /// arrays).
    pub fn preallocated(&self) -> bool {
        match self.map_type {
            1 | 5 | 9 | 10 => self.flags & NO_PREALLOC == 0,
            2 | 6 => true,
            _ => false,
        }
    }
}

/// `map id=… name=… type=… key=… value=… max_entries=… flags=0x… memlock=…`: one line,
/// `key=value` pairs, for a harness to read back.
impl fmt::Display for MapInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "map id={} name={} type={} key={} value={} max_entries={} flags={:#x} memlock={}",
            self.id,
            if self.name.is_empty() {
                "?"
            } else {
                &self.name
            },
            self.type_name(),
            self.key_size,
            self.value_size,
            self.max_entries,
            self.flags,
            self.memlock
        )
    }
}

/// A map's figures from the text of its fd's `/proc/<pid>/fdinfo/<fd>`; `None` for an fd that
/// is not a map's (no `map_type`/`map_id`).
pub fn parse_fdinfo(text: &str) -> Option<MapInfo> {
    let fields: BTreeMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim(), v.trim()))
        .collect();
    let num = |k: &str| -> Option<u64> {
        let v = fields.get(k)?;
        match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => v.parse().ok(),
        }
    };
    let small = |k: &str| num(k).and_then(|v| u32::try_from(v).ok());
    Some(MapInfo {
        id: small("map_id")?,
        name: String::new(),
        map_type: small("map_type")?,
        key_size: small("key_size").unwrap_or(0),
        value_size: small("value_size").unwrap_or(0),
        max_entries: small("max_entries").unwrap_or(0),
        flags: small("map_flags").unwrap_or(0),
        memlock: num("memlock").unwrap_or(0),
    })
}

/// Every map `pid` holds a descriptor of, once each, by id; named when the kernel tells.
pub fn of_process(pid: u32) -> std::io::Result<Vec<MapInfo>> {
    let mut maps = BTreeMap::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))?.flatten() {
        // An fd closed meanwhile: not a map any more.
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        if let Some(mut map) = parse_fdinfo(&text) {
            map.name = name_of(map.id).unwrap_or_default();
            maps.insert(map.id, map);
        }
    }
    Ok(maps.into_values().collect())
}

/// The number of CPUs in a kernel CPU list (`0-95`, `0,2-3`): what
/// `/sys/devices/system/cpu/possible` holds, the count every per-CPU map's values are allocated
/// for. `None` when it is not such a list.
pub fn count_cpu_list(list: &str) -> Option<u32> {
    let mut n = 0;
    for part in list.trim().split(',') {
        n += match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?);
                b.checked_sub(a)? + 1
            }
            None => {
                part.parse::<u32>().ok()?;
                1
            }
        };
    }
    Some(n)
}

/// The possible CPUs of this machine (`/sys/devices/system/cpu/possible`).
pub fn possible_cpus() -> Option<u32> {
    count_cpu_list(&std::fs::read_to_string("/sys/devices/system/cpu/possible").ok()?)
}

const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

/// The map's name from `struct bpf_map_info` (its `name` field is at byte 24).
fn name_of(id: u32) -> Option<String> {
    // union bpf_attr for BPF_MAP_GET_FD_BY_ID: map_id, next_id, open_flags.
    let by_id: [u32; 4] = [id, 0, 0, 0];
    // SAFETY: bpf(2) reads `size_of_val(&by_id)` bytes of the attribute, which lives for the
    // call; the fd it returns is closed below.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_GET_FD_BY_ID,
            by_id.as_ptr(),
            std::mem::size_of_val(&by_id),
        )
    };
    if fd < 0 {
        return None;
    }
    let mut info = [0u8; 128];
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let attr = InfoAttr {
        bpf_fd: fd as u32,
        info_len: info.len() as u32,
        info: info.as_mut_ptr() as u64,
    };
    // SAFETY: the kernel writes at most `info_len` bytes into `info`, which outlives the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &attr as *const InfoAttr,
            std::mem::size_of::<InfoAttr>(),
        )
    };
    // SAFETY: our own fd.
    unsafe { libc::close(fd as i32) };
    if rc < 0 {
        return None;
    }
    let name = &info[24..40];
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Some(String::from_utf8_lossy(&name[..end]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_per_cpu_hash_from_its_fdinfo() {
        let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t2061\nmap_type:\t5\n\
                    key_size:\t8\nvalue_size:\t856\nmax_entries:\t1000\nmap_flags:\t0x0\n\
                    map_extra:\t0x0\nmemlock:\t82575360\nmap_id:\t41\nfrozen:\t0\n";
        let mut m = parse_fdinfo(text).expect("a map");
        assert_eq!(
            m,
            MapInfo {
                id: 41,
                name: String::new(),
                map_type: 5,
                key_size: 8,
                value_size: 856,
                max_entries: 1000,
                flags: 0,
                memlock: 82_575_360,
            }
        );
        assert!(m.per_cpu() && m.preallocated());
        assert_eq!(m.type_name(), "percpu_hash");
        m.name = "CGROUP_SCHED".into();
        assert_eq!(
            m.to_string(),
            "map id=41 name=CGROUP_SCHED type=percpu_hash key=8 value=856 max_entries=1000 \
             flags=0x0 memlock=82575360"
        );
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(count_cpu_list("0-95\n"), Some(96));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("0,2-3,8-15"), Some(11));
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list(""), None);
        assert_eq!(count_cpu_list("0-x"), None);
    }

    #[test]
    fn not_a_map_and_unknown_types() {
        // A BPF link's and a socket's fdinfo: no map_type/map_id.
        assert!(parse_fdinfo("pos:\t0\nflags:\t02\nlink_type:\ttracing\nlink_id:\t3\n").is_none());
        assert!(parse_fdinfo("pos:\t0\nflags:\t02\nmnt_id:\t9\nino:\t1\n").is_none());
        let m = parse_fdinfo("map_type:\t1\nmap_flags:\t0x1\nmap_id:\t2\nmemlock:\t4096\n")
            .expect("a map");
        assert_eq!((m.type_name().as_str(), m.per_cpu()), ("hash", false));
        assert!(!m.preallocated(), "BPF_F_NO_PREALLOC");
        let future = MapInfo { map_type: 99, ..m };
        assert_eq!(future.type_name(), "99");
        assert!(format!("{future}").contains(" name=? type=99 "));
    }
}
