//! The one reader of the running kernel's BTF (`/sys/kernel/btf/vmlinux`).
//!
//! aya has no CO-RE relocations for Rust programs, so a program that reads a kernel struct is
//! given the offsets as read-only globals, looked up here at load time: member offsets along
//! paths that go through anonymous members and typedef'd structs (`task_struct.__state`,
//! `net_device.nd_net.net`, where `nd_net` is a `possible_net_t`), enum values
//! (`enum skb_drop_reason`, for drop reason names), and the number of parameters of a
//! tracepoint (whether `tcp_retransmit_skb` passes `err`).
//!
//! The file is read once at start-up ([`super::KernelFacts::probe`]): these bytes are indexed
//! here, and parsed by aya-obj for the loader (`EbpfLoader::btf` is given that parse, so aya does
//! not read the file again). Two parses remain because aya-obj 0.6's `Btf` cannot answer these
//! questions: its one public lookup is `id_by_type_name_kind` (a name to a type id), while the
//! type table (`type_by_id`, `types`), the strings (`string_at`, `type_name`) and the contents of
//! a record (struct and union `members`, enum `variants`, a typedef's target, a `FuncProto`'s
//! `params`) are all `pub(crate)`. The day aya-obj makes them public, this module can go.
//!
//! Lean on memory: the blob is kept as read, with an index of where each type record starts;
//! records are decoded when a lookup needs them (a few dozen lookups at load time), and the
//! index is dropped before the loader runs.

use std::{ops::Range, path::Path};

use thiserror::Error;

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

const BTF_MAGIC: u16 = 0xeb9f;

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Debug, Error)]
pub enum BtfError {
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: crate::files::ReadError,
    },
    #[error("not a BTF blob: {0}")]
    Malformed(&'static str),
    #[error("unknown BTF type kind {0}")]
    UnknownKind(u32),
    #[error("no struct {0} in the kernel's BTF")]
    NoStruct(String),
    #[error("{strukt} has no member {member}")]
    NoMember { strukt: String, member: String },
    #[error("{strukt}.{member} is a bitfield")]
    Bitfield { strukt: String, member: String },
    #[error("{0} is not byte-aligned")]
    Unaligned(String),
}

/// The header of one type record.
#[derive(Clone, Copy)]
struct Record {
    name: u32,
    kind: u32,
    kind_flag: bool,
    vlen: usize,
    size_or_type: u32,
    /// Where the kind-specific data after the 12-byte header starts, in the blob.
    body: usize,
}

/// A BTF blob and an index of its type records.
pub struct Btf {
    data: Vec<u8>,
    strings: Range<usize>,
    /// Where type `id` starts in the blob, at index `id - 1`.
    starts: Vec<u32>,
}

fn le32(data: &[u8], at: usize) -> Result<u32, BtfError> {
    data.get(at..at + 4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        .ok_or(BtfError::Malformed("truncated"))
}

/// The size of a record's kind-specific data.
fn body_len(kind: u32, vlen: usize) -> Result<usize, BtfError> {
    Ok(match kind {
        KIND_STRUCT | KIND_UNION | KIND_ENUM64 | KIND_DATASEC => 12 * vlen,
        KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
        KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
        KIND_ARRAY => 12,
        KIND_PTR | KIND_FWD | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT
        | KIND_FUNC | KIND_FLOAT | KIND_TYPE_TAG => 0,
        other => return Err(BtfError::UnknownKind(other)),
    })
}

impl Btf {
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, BtfError> {
        let path = path.as_ref();
        let data =
            crate::files::read(path, crate::files::Kind::Btf).map_err(|source| BtfError::Read {
                path: path.display().to_string(),
                source,
            })?;
        Self::parse(data)
    }

    /// Indexes a little-endian BTF blob (the host's byte order on every target we build for).
    pub fn parse(data: impl Into<Vec<u8>>) -> Result<Self, BtfError> {
        let data = data.into();
        let magic = data
            .get(0..2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .ok_or(BtfError::Malformed("truncated header"))?;
        if magic != BTF_MAGIC {
            return Err(BtfError::Malformed("bad magic (or big-endian BTF)"));
        }
        let hdr_len = le32(&data, 4)? as usize;
        let (type_off, type_len) = (le32(&data, 8)? as usize, le32(&data, 12)? as usize);
        let (str_off, str_len) = (le32(&data, 16)? as usize, le32(&data, 20)? as usize);
        let types = hdr_len + type_off..hdr_len + type_off + type_len;
        let strings = hdr_len + str_off..hdr_len + str_off + str_len;
        if types.end > data.len() || strings.end > data.len() {
            return Err(BtfError::Malformed("sections out of bounds"));
        }
        if u32::try_from(types.end).is_err() {
            return Err(BtfError::Malformed("blob too large"));
        }
        let mut starts = Vec::new();
        let mut pos = types.start;
        while pos < types.end {
            let info = le32(&data, pos + 4)?;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            starts.push(pos as u32);
            pos += 12 + body_len(kind, vlen)?;
        }
        if pos != types.end {
            return Err(BtfError::Malformed("truncated type section"));
        }
        Ok(Self {
            data,
            strings,
            starts,
        })
    }

    /// How many types the blob has.
    pub fn type_count(&self) -> usize {
        self.starts.len()
    }

    /// The blob as read, for aya's loader to parse the same bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    fn word(&self, at: usize) -> u32 {
        le32(&self.data, at).unwrap_or(0)
    }

    fn record(&self, id: u32) -> Option<Record> {
        let at = *self.starts.get(id.checked_sub(1)? as usize)? as usize;
        let info = self.word(at + 4);
        Some(Record {
            name: self.word(at),
            kind: (info >> 24) & 0x1f,
            kind_flag: info >> 31 == 1,
            vlen: (info & 0xffff) as usize,
            size_or_type: self.word(at + 8),
            body: at + 12,
        })
    }

    fn name(&self, off: u32) -> &str {
        let tail = self
            .data
            .get(self.strings.start + off as usize..self.strings.end)
            .unwrap_or_default();
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        std::str::from_utf8(&tail[..end]).unwrap_or_default()
    }

    /// The first type of one of `kinds` named `name`.
    fn find(&self, kinds: &[u32], name: &str) -> Option<u32> {
        (1..=self.starts.len() as u32).find(|&id| {
            self.record(id).is_some_and(|r| {
                kinds.contains(&r.kind) && r.name != 0 && self.name(r.name) == name
            })
        })
    }

    /// Follows typedefs and qualifiers (not pointers) to the underlying type.
    fn strip(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.record(id) {
                Some(r)
                    if matches!(
                        r.kind,
                        KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG
                    ) =>
                {
                    id = r.size_or_type
                }
                _ => return id,
            }
        }
        id
    }

    /// Finds `member` in composite `id`, looking through anonymous members as C does:
    /// (bit offset, member type, bitfield).
    fn find_member(&self, id: u32, member: &str, depth: u32) -> Option<(u32, u32, bool)> {
        // Anonymous nesting in vmlinux is shallow; the bound stops a malformed blob's cycles.
        if depth > 8 {
            return None;
        }
        let r = self.record(self.strip(id))?;
        if r.kind != KIND_STRUCT && r.kind != KIND_UNION {
            return None;
        }
        for m in 0..r.vlen {
            let at = r.body + 12 * m;
            let (name, ty, off) = (self.word(at), self.word(at + 4), self.word(at + 8));
            let (bit_offset, bitfield) = if r.kind_flag {
                (off & 0x00ff_ffff, off >> 24 != 0)
            } else {
                (off, false)
            };
            if name == 0 {
                if let Some((o, t, bf)) = self.find_member(ty, member, depth + 1) {
                    return Some((bit_offset + o, t, bf));
                }
            } else if self.name(name) == member {
                return Some((bit_offset, ty, bitfield));
            }
        }
        None
    }

    /// The byte offset of `root.path[0].path[1]…`, where `root` names a struct (or a typedef
    /// of one) and each step is a member embedded by value in the previous one.
    pub fn offset_of(&self, root: &str, path: &[&str]) -> Result<u32, BtfError> {
        let mut ty = self
            .find(&[KIND_STRUCT], root)
            .or_else(|| self.find(&[KIND_TYPEDEF], root))
            .ok_or_else(|| BtfError::NoStruct(root.to_owned()))?;
        let mut bits = 0;
        let mut walked = root.to_owned();
        for step in path {
            let (off, next, bitfield) =
                self.find_member(ty, step, 0)
                    .ok_or_else(|| BtfError::NoMember {
                        strukt: walked.clone(),
                        member: (*step).to_owned(),
                    })?;
            if bitfield {
                return Err(BtfError::Bitfield {
                    strukt: walked,
                    member: (*step).to_owned(),
                });
            }
            walked = format!("{walked}.{step}");
            bits += off;
            ty = next;
        }
        if bits % 8 != 0 {
            return Err(BtfError::Unaligned(walked));
        }
        Ok(bits / 8)
    }

    /// The byte offset of `member` in `struct strukt`.
    pub fn member_offset(&self, strukt: &str, member: &str) -> Result<u32, BtfError> {
        self.offset_of(strukt, &[member])
    }

    /// The first of `members` that the struct has, with its offset (for fields renamed across
    /// kernel versions, such as `__state`, which was `state` before 5.14).
    pub fn first_member_offset(&self, strukt: &str, members: &[&str]) -> Result<u32, BtfError> {
        let mut last = None;
        for member in members {
            match self.member_offset(strukt, member) {
                Ok(off) => return Ok(off),
                Err(err) => last = Some(err),
            }
        }
        Err(last.unwrap_or_else(|| BtfError::NoStruct(strukt.to_owned())))
    }

    /// The values of `enum name`, as (name, value).
    pub fn enum_values(&self, name: &str) -> Option<Vec<(String, u64)>> {
        let r = self.record(self.find(&[KIND_ENUM, KIND_ENUM64], name)?)?;
        Some(
            (0..r.vlen)
                .map(|i| {
                    if r.kind == KIND_ENUM64 {
                        let at = r.body + 12 * i;
                        let v = (u64::from(self.word(at + 8)) << 32) | u64::from(self.word(at + 4));
                        (self.name(self.word(at)).to_owned(), v)
                    } else {
                        let at = r.body + 8 * i;
                        let raw = self.word(at + 4);
                        // Signed enums sign-extend; drop reasons are small and positive.
                        let v = if r.kind_flag {
                            raw as i32 as i64 as u64
                        } else {
                            u64::from(raw)
                        };
                        (self.name(self.word(at)).to_owned(), v)
                    }
                })
                .collect(),
        )
    }

    /// The number of parameters of the function (pointer) type named by typedef `name`, such as
    /// `btf_trace_<event>` (whose first parameter is the tracing context).
    pub fn func_params(&self, typedef: &str) -> Option<usize> {
        let mut id = self.find(&[KIND_TYPEDEF], typedef)?;
        for _ in 0..8 {
            let r = self.record(id)?;
            match r.kind {
                KIND_FUNC_PROTO => return Some(r.vlen),
                KIND_PTR | KIND_TYPEDEF | KIND_CONST | KIND_VOLATILE | KIND_TYPE_TAG => {
                    id = r.size_or_type
                }
                _ => return None,
            }
        }
        None
    }

    /// Whether the blob has a struct of this name.
    pub fn has_struct(&self, name: &str) -> bool {
        self.struct_id(name).is_some()
    }

    /// The id of the struct named `name` (what `bpf_rdonly_cast` is given).
    pub fn struct_id(&self, name: &str) -> Option<u32> {
        self.find(&[KIND_STRUCT], name)
    }

    /// The id of the function named `name` (a kfunc's, for a call of it).
    pub fn func_id(&self, name: &str) -> Option<u32> {
        self.find(&[KIND_FUNC], name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// `struct net { int pad; struct ns_common ns; }`, `struct ns_common { long a; int inum; }`,
    /// `typedef struct { struct net *net; } possible_net_t;`,
    /// `struct dev { int mtu; union { int x; struct { int y; possible_net_t nd_net; }; }; }`,
    /// `enum reason { A = 2, B = 3 }`, `typedef void (*btf_trace_ev)(void *, int, int);`.
    fn blob() -> Vec<u8> {
        let names = [
            "int",
            "long",
            "net",
            "pad",
            "ns",
            "ns_common",
            "a",
            "inum",
            "possible_net_t",
            "dev",
            "mtu",
            "x",
            "y",
            "nd_net",
            "reason",
            "A",
            "B",
            "btf_trace_ev",
        ];
        let mut strings = vec![0u8];
        let mut off = HashMap::new();
        for n in names {
            off.insert(n, strings.len() as u32);
            strings.extend_from_slice(n.as_bytes());
            strings.push(0);
        }
        let s = |n: &str| off[n];
        let mut t: Vec<u32> = Vec::new();
        let info = |kind: u32, vlen: u32| (kind << 24) | vlen;
        // 1 int, 2 long
        t.extend([s("int"), info(KIND_INT, 0), 4, 32]);
        t.extend([s("long"), info(KIND_INT, 0), 8, 64]);
        // 3 struct ns_common { long a @0; int inum @64 }
        t.extend([s("ns_common"), info(KIND_STRUCT, 2), 16]);
        t.extend([s("a"), 2, 0, s("inum"), 1, 64]);
        // 4 struct net { int pad @0; struct ns_common ns @64 }
        t.extend([s("net"), info(KIND_STRUCT, 2), 24]);
        t.extend([s("pad"), 1, 0, s("ns"), 3, 64]);
        // 5 ptr -> 4
        t.extend([0, info(KIND_PTR, 0), 4]);
        // 6 anonymous struct { struct net *net @0 }
        t.extend([0, info(KIND_STRUCT, 1), 8]);
        t.extend([s("net"), 5, 0]);
        // 7 typedef possible_net_t -> 6
        t.extend([s("possible_net_t"), info(KIND_TYPEDEF, 0), 6]);
        // 8 anonymous struct { int y @0; possible_net_t nd_net @64 }
        t.extend([0, info(KIND_STRUCT, 2), 16]);
        t.extend([s("y"), 1, 0, s("nd_net"), 7, 64]);
        // 9 anonymous union { int x; struct 8 }
        t.extend([0, info(KIND_UNION, 2), 16]);
        t.extend([s("x"), 1, 0, 0, 8, 0]);
        // 10 struct dev { int mtu @0; union 9 @64 }
        t.extend([s("dev"), info(KIND_STRUCT, 2), 24]);
        t.extend([s("mtu"), 1, 0, 0, 9, 64]);
        // 11 enum reason { A = 2, B = 3 }
        t.extend([s("reason"), info(KIND_ENUM, 2), 4]);
        t.extend([s("A"), 2, s("B"), 3]);
        // 12 func_proto (void *, int, int) -> void
        t.extend([0, info(KIND_FUNC_PROTO, 3), 0]);
        t.extend([0, 5, 0, 1, 0, 1]);
        // 13 ptr -> 12, 14 typedef btf_trace_ev -> 13
        t.extend([0, info(KIND_PTR, 0), 12]);
        t.extend([s("btf_trace_ev"), info(KIND_TYPEDEF, 0), 13]);
        let types: Vec<u8> = t.iter().flat_map(|w| w.to_le_bytes()).collect();
        let mut out = Vec::new();
        out.extend_from_slice(&BTF_MAGIC.to_le_bytes());
        out.extend_from_slice(&[1, 0]);
        for w in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(&types);
        out.extend_from_slice(&strings);
        out
    }

    #[test]
    fn offsets_follow_paths_through_typedefs_and_anonymous_members() {
        let btf = Btf::parse(blob()).unwrap();
        assert_eq!(btf.offset_of("dev", &["mtu"]).unwrap(), 0);
        // dev → anonymous union @8 → anonymous struct → nd_net @8 → (typedef) net @0.
        assert_eq!(btf.offset_of("dev", &["nd_net"]).unwrap(), 16);
        assert_eq!(btf.offset_of("dev", &["nd_net", "net"]).unwrap(), 16);
        assert_eq!(btf.offset_of("net", &["ns", "inum"]).unwrap(), 16);
        assert_eq!(btf.offset_of("possible_net_t", &["net"]).unwrap(), 0);
        assert!(matches!(
            btf.offset_of("dev", &["nope"]),
            Err(BtfError::NoMember { .. })
        ));
        assert_eq!(btf.member_offset("dev", "mtu").unwrap(), 0);
        assert_eq!(
            btf.first_member_offset("dev", &["nope", "nd_net"]).unwrap(),
            16
        );
        assert!(matches!(
            btf.member_offset("nosuch", "x"),
            Err(BtfError::NoStruct(_))
        ));
        assert!(btf.offset_of("nosuch", &["x"]).is_err());
        assert!(btf.has_struct("net"));
    }

    #[test]
    fn enums_and_function_prototypes() {
        let btf = Btf::parse(blob()).unwrap();
        assert_eq!(
            btf.enum_values("reason").unwrap(),
            [("A".to_owned(), 2), ("B".to_owned(), 3)]
        );
        assert_eq!(btf.enum_values("nope"), None);
        assert_eq!(btf.func_params("btf_trace_ev"), Some(3));
        assert_eq!(btf.func_params("nope"), None);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(Btf::parse(Vec::new()).is_err());
        assert!(Btf::parse(vec![0x9f, 0xeb, 1, 0]).is_err());
        let mut b = blob();
        b.truncate(60);
        assert!(Btf::parse(b).is_err());
    }

    #[test]
    fn running_kernel_has_what_the_network_probes_read() {
        // The kernel's BTF is present on every machine we run on; its absence is a failure of
        // the environment, not a reason to pass.
        let btf = Btf::from_file(VMLINUX_BTF).expect("kernel BTF");
        let net = btf.offset_of("net_device", &["nd_net", "net"]).unwrap();
        assert_eq!(net, btf.offset_of("net_device", &["nd_net"]).unwrap());
        btf.offset_of("net", &["ns", "inum"]).unwrap();
        btf.offset_of("sock", &["sk_cgrp_data", "cgroup"]).unwrap();
        btf.offset_of("sk_buff", &["network_header"]).unwrap();
        btf.offset_of("skb_shared_info", &["gso_size"]).unwrap();
        let reasons = btf.enum_values("skb_drop_reason").unwrap();
        assert!(
            reasons
                .iter()
                .any(|(n, v)| n == "SKB_DROP_REASON_NOT_SPECIFIED" && *v == 2),
            "{reasons:?}"
        );
        let params = btf.func_params("btf_trace_tcp_retransmit_skb").unwrap();
        assert!((3..=4).contains(&params), "{params}");
    }

    #[test]
    fn running_kernel_has_task_struct_offsets() {
        // Pure parsing of a real file; the kernel's BTF is there on every machine we run on,
        // and its absence is a failure of this environment, not a reason to pass.
        let btf = Btf::from_file(VMLINUX_BTF).expect("kernel BTF");
        let pid = btf.member_offset("task_struct", "pid").unwrap();
        let tgid = btf.member_offset("task_struct", "tgid").unwrap();
        assert_eq!(tgid, pid + 4, "pid_t pid; pid_t tgid; are adjacent");
        let nv = btf.member_offset("task_struct", "nvcsw").unwrap();
        let niv = btf.member_offset("task_struct", "nivcsw").unwrap();
        assert_eq!(niv, nv + 8);
        btf.first_member_offset("task_struct", &["__state", "state"])
            .unwrap();
        // A path through an embedded struct adds up its steps.
        let se = btf.member_offset("task_struct", "se").unwrap();
        let sum = btf
            .member_offset("sched_entity", "sum_exec_runtime")
            .unwrap();
        assert_eq!(
            btf.offset_of("task_struct", &["se", "sum_exec_runtime"])
                .unwrap(),
            se + sum
        );
        assert!(
            sum > 0,
            "sum_exec_runtime is not sched_entity's first member"
        );
    }
}
