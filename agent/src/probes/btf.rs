//! Struct member offsets from the running kernel's BTF (`/sys/kernel/btf/vmlinux`).
//!
//! aya has no CO-RE relocations for Rust programs, so a program that reads a kernel struct is
//! given the offsets as read-only globals, looked up here at load time. Only what that needs is
//! parsed: the type table and the string table.

use std::{collections::HashMap, path::Path};

use thiserror::Error;

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;

#[derive(Debug, Error)]
pub enum BtfError {
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("not a BTF blob: {0}")]
    Malformed(&'static str),
    #[error("no struct {0} in the kernel's BTF")]
    NoStruct(String),
    #[error("struct {strukt} has no member {member}")]
    NoMember { strukt: String, member: String },
    #[error("{strukt}.{member} is a bitfield")]
    Bitfield { strukt: String, member: String },
}

#[derive(Clone, Copy, Debug)]
struct Member {
    name_off: u32,
    type_id: u32,
    bit_offset: u32,
    bitfield: bool,
}

#[derive(Clone, Debug)]
enum Type {
    Composite { members: Vec<Member> },
    Other,
}

/// The parts of a BTF blob needed to find struct member offsets.
pub struct Btf {
    strings: Vec<u8>,
    /// Index `id - 1` holds type `id` (type 0 is `void`).
    types: Vec<Type>,
    structs_by_name: HashMap<String, u32>,
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn u32(&mut self) -> Result<u32, BtfError> {
        let bytes = self
            .data
            .get(self.pos..self.pos + 4)
            .ok_or(BtfError::Malformed("truncated type section"))?;
        self.pos += 4;
        Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
    }

    fn skip(&mut self, n: usize) -> Result<(), BtfError> {
        if self.pos + n > self.data.len() {
            return Err(BtfError::Malformed("truncated type section"));
        }
        self.pos += n;
        Ok(())
    }
}

impl Btf {
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, BtfError> {
        let path = path.as_ref();
        let data = std::fs::read(path).map_err(|source| BtfError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&data)
    }

    /// Parses a little-endian BTF blob (the host's byte order on every target we build for).
    pub fn parse(data: &[u8]) -> Result<Self, BtfError> {
        let le32 = |at: usize| -> Result<u32, BtfError> {
            data.get(at..at + 4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
                .ok_or(BtfError::Malformed("truncated header"))
        };
        let magic = data
            .get(0..2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .ok_or(BtfError::Malformed("truncated header"))?;
        if magic != BTF_MAGIC {
            return Err(BtfError::Malformed("bad magic (or big-endian BTF)"));
        }
        let hdr_len = le32(4)? as usize;
        let (type_off, type_len) = (le32(8)? as usize, le32(12)? as usize);
        let (str_off, str_len) = (le32(16)? as usize, le32(20)? as usize);
        let types_start = hdr_len + type_off;
        let strings_start = hdr_len + str_off;
        let type_data = data
            .get(types_start..types_start + type_len)
            .ok_or(BtfError::Malformed("type section out of bounds"))?;
        let strings = data
            .get(strings_start..strings_start + str_len)
            .ok_or(BtfError::Malformed("string section out of bounds"))?
            .to_vec();

        let mut r = Reader {
            data: type_data,
            pos: 0,
        };
        let mut types = Vec::new();
        let mut structs_by_name = HashMap::new();
        while r.pos < type_data.len() {
            let name_off = r.u32()?;
            let info = r.u32()?;
            let _size_or_type = r.u32()?;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 == 1;
            let ty = match kind {
                KIND_STRUCT | KIND_UNION => {
                    let mut members = Vec::with_capacity(vlen);
                    for _ in 0..vlen {
                        let m_name = r.u32()?;
                        let m_type = r.u32()?;
                        let m_off = r.u32()?;
                        let (bit_offset, bitfield) = if kind_flag {
                            (m_off & 0x00ff_ffff, m_off >> 24 != 0)
                        } else {
                            (m_off, false)
                        };
                        members.push(Member {
                            name_off: m_name,
                            type_id: m_type,
                            bit_offset,
                            bitfield,
                        });
                    }
                    Type::Composite { members }
                }
                // INT, VAR, DECL_TAG: one u32.
                1 | 14 | 17 => {
                    r.skip(4)?;
                    Type::Other
                }
                // ARRAY: struct btf_array.
                3 => {
                    r.skip(12)?;
                    Type::Other
                }
                // ENUM, FUNC_PROTO: vlen × 8 bytes.
                6 | 13 => {
                    r.skip(vlen * 8)?;
                    Type::Other
                }
                // DATASEC, ENUM64: vlen × 12 bytes.
                15 | 19 => {
                    r.skip(vlen * 12)?;
                    Type::Other
                }
                // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG: nothing.
                2 | 7 | 8 | 9 | 10 | 11 | 12 | 16 | 18 => Type::Other,
                _ => return Err(BtfError::Malformed("unknown type kind")),
            };
            let id = types.len() as u32 + 1;
            if kind == KIND_STRUCT && name_off != 0 {
                let name = string_at(&strings, name_off).to_owned();
                // The first definition wins; vmlinux has one of each.
                structs_by_name.entry(name).or_insert(id);
            }
            types.push(ty);
        }
        Ok(Self {
            strings,
            types,
            structs_by_name,
        })
    }

    /// The byte offset of `member` in `struct strukt`, looking through anonymous struct and
    /// union members as C does.
    pub fn member_offset(&self, strukt: &str, member: &str) -> Result<u32, BtfError> {
        let id = *self
            .structs_by_name
            .get(strukt)
            .ok_or_else(|| BtfError::NoStruct(strukt.to_owned()))?;
        let no_member = || BtfError::NoMember {
            strukt: strukt.to_owned(),
            member: member.to_owned(),
        };
        let found = self.find_member(id, member, 0, 0).ok_or_else(no_member)?;
        let (bit_offset, bitfield) = found;
        if bitfield || bit_offset % 8 != 0 {
            return Err(BtfError::Bitfield {
                strukt: strukt.to_owned(),
                member: member.to_owned(),
            });
        }
        Ok(bit_offset / 8)
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

    fn find_member(&self, id: u32, member: &str, base: u32, depth: u32) -> Option<(u32, bool)> {
        // Anonymous nesting in vmlinux is shallow; the bound stops a malformed blob's cycles.
        if depth > 8 {
            return None;
        }
        let Type::Composite { members } = self.resolve(id)? else {
            return None;
        };
        for m in members {
            if m.name_off == 0 {
                if let Some(found) =
                    self.find_member(m.type_id, member, base + m.bit_offset, depth + 1)
                {
                    return Some(found);
                }
            } else if string_at(&self.strings, m.name_off) == member {
                return Some((base + m.bit_offset, m.bitfield));
            }
        }
        None
    }

    fn resolve(&self, id: u32) -> Option<&Type> {
        self.types.get(id.checked_sub(1)? as usize)
    }
}

fn string_at(strings: &[u8], off: u32) -> &str {
    let tail = strings.get(off as usize..).unwrap_or_default();
    let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
    std::str::from_utf8(&tail[..end]).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a BTF blob: `struct inner { int a; int b; }`, and
    /// `struct outer { long x; union { struct inner; int y; }; int z; }`, with the anonymous
    /// members that the kernel's structs use.
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0inner\0a\0b\0outer\0x\0y\0z\0long\0".to_vec();
        let s = |name: &str| -> u32 {
            let needle = format!("\0{name}\0");
            strings
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .expect("string") as u32
                + 1
        };
        let mut types = Vec::new();
        let mut push = |words: &[u32]| {
            for w in words {
                types.extend_from_slice(&w.to_le_bytes());
            }
        };
        // 1: int (INT, size 4, encoding word)
        push(&[s("int"), 1 << 24, 4, 32]);
        // 2: long
        push(&[s("long"), 1 << 24, 8, 64]);
        // 3: struct inner { int a @0; int b @32 }
        push(&[s("inner"), (4 << 24) | 2, 8, s("a"), 1, 0, s("b"), 1, 32]);
        // 4: anonymous union { struct inner @0; int y @0 }
        push(&[0, (5 << 24) | 2, 8, 0, 3, 0, s("y"), 1, 0]);
        // 5: struct outer { long x @0; union @64; int z @128 }
        push(&[
            s("outer"),
            (4 << 24) | 3,
            24,
            s("x"),
            2,
            0,
            0,
            4,
            64,
            s("z"),
            1,
            128,
        ]);
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
    fn finds_direct_and_anonymous_members() {
        let btf = Btf::parse(&blob()).expect("parse");
        assert_eq!(btf.member_offset("outer", "x").unwrap(), 0);
        assert_eq!(btf.member_offset("outer", "z").unwrap(), 16);
        assert_eq!(btf.member_offset("outer", "y").unwrap(), 8);
        // Through the anonymous union and then the anonymous `struct inner` member.
        assert_eq!(btf.member_offset("outer", "b").unwrap(), 12);
        assert_eq!(
            btf.first_member_offset("outer", &["nope", "z"]).unwrap(),
            16
        );
    }

    #[test]
    fn reports_what_is_missing() {
        let btf = Btf::parse(&blob()).expect("parse");
        assert!(matches!(
            btf.member_offset("outer", "w"),
            Err(BtfError::NoMember { .. })
        ));
        assert!(matches!(
            btf.member_offset("nosuch", "x"),
            Err(BtfError::NoStruct(_))
        ));
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        assert!(Btf::parse(&[]).is_err());
        assert!(Btf::parse(&[0x9f, 0xeb, 1, 0, 24, 0, 0, 0]).is_err());
        let mut b = blob();
        b.truncate(40);
        assert!(Btf::parse(&b).is_err());
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
    }
}
