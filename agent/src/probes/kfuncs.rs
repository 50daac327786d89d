//! The probes' kfunc calls, made real before the object is loaded
//! (`stormwatch_common::kfuncs`): each placeholder call to [`RDONLY_CAST_MARKER`] becomes a call
//! of `bpf_rdonly_cast` by its id in the running kernel's BTF, or `r0 = r1` where the kernel
//! has no such kfunc (its path in the probes is then dead code, by [`globals::HAVE_RDONLY_CAST`]
//! at 0). Rewritten in a copy of the object's bytes: aya takes an object whose kfunc calls it
//! can resolve only from BTF the Rust toolchain does not emit.

use stormwatch_common::kfuncs::{RDONLY_CAST_MARKER, globals};

use super::btf::Btf;

/// `BPF_JMP | BPF_CALL`.
const CALL: u8 = 0x85;
/// `BPF_ALU64 | BPF_MOV | BPF_X`.
const MOV64_REG: u8 = 0xbf;
/// A call's `src_reg` that makes its immediate a kernel function's BTF id.
const PSEUDO_KFUNC_CALL: u8 = 2;

/// What the cast needs from the running kernel's own BTF: the kfunc's id and the ids of the
/// structs the network probes read through it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdonlyCast {
    kfunc: u32,
    skb_shared_info: u32,
    iphdr: u32,
    udphdr: u32,
}

impl RdonlyCast {
    /// Found in `btf` when it is the running kernel's own (a BTF file given for a kernel
    /// without one describes types, but the kernel, with no BTF of its own, cannot resolve a
    /// kfunc) and has the kfunc (Linux 6.2+) and every struct.
    pub fn find(btf: &Btf, kernels_own: bool) -> Option<Self> {
        if !kernels_own {
            return None;
        }
        Some(Self {
            kfunc: btf.func_id("bpf_rdonly_cast")?,
            skb_shared_info: btf.struct_id("skb_shared_info")?,
            iphdr: btf.struct_id("iphdr")?,
            udphdr: btf.struct_id("udphdr")?,
        })
    }

    /// The read-only globals that turn the probes' cast paths on (all 0 without the cast).
    pub fn globals(cast: Option<&Self>) -> Vec<(&'static str, u32)> {
        let Some(c) = cast else {
            return vec![(globals::HAVE_RDONLY_CAST, 0)];
        };
        vec![
            (globals::HAVE_RDONLY_CAST, 1),
            (globals::SKB_SHARED_INFO_BTF_ID, c.skb_shared_info),
            (globals::IPHDR_BTF_ID, c.iphdr),
            (globals::UDPHDR_BTF_ID, c.udphdr),
        ]
    }
}

/// A copy of an object's bytes, 8-byte aligned as the ELF parser wants them.
pub struct Object {
    words: Vec<u64>,
    len: usize,
}

impl Object {
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialized bytes, and u8 has no alignment or
        // validity requirement; the slice borrows `self`.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, borrowed mutably from `self`.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }
}

/// `object` with every placeholder call in its code sections rewritten.
pub fn rewrite(object: &[u8], cast: Option<&RdonlyCast>) -> Result<Object, String> {
    use object::{Object as _, ObjectSection as _, SectionKind};

    let mut copy = Object {
        words: vec![0; object.len().div_ceil(8)],
        len: object.len(),
    };
    copy.bytes_mut().copy_from_slice(object);
    let code: Vec<(usize, usize)> = {
        let file = object::File::parse(object).map_err(|e| format!("the probes' object: {e}"))?;
        file.sections()
            .filter(|s| s.kind() == SectionKind::Text)
            .filter_map(|s| s.file_range())
            .map(|(at, len)| (at as usize, len as usize))
            .collect()
    };
    let bytes = copy.bytes_mut();
    for (at, len) in code {
        let Some(section) = bytes.get_mut(at..at + len) else {
            return Err("a code section lies outside the object".to_owned());
        };
        for insn in section.chunks_exact_mut(8) {
            rewrite_insn(insn, cast);
        }
    }
    Ok(copy)
}

/// Rewrites one instruction if it is the placeholder call.
fn rewrite_insn(insn: &mut [u8], cast: Option<&RdonlyCast>) -> bool {
    let imm = i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
    if insn[0] != CALL || insn[1] != 0 || imm != RDONLY_CAST_MARKER {
        return false;
    }
    match cast {
        // src_reg in the high nibble of the register byte; off 0: vmlinux's BTF.
        Some(c) => insn.copy_from_slice(&call_kfunc(c.kfunc)),
        // r0 = r1 (dst r0, src r1): the cast's value, as the verifier makes the kfunc.
        None => insn.copy_from_slice(&[MOV64_REG, 0x10, 0, 0, 0, 0, 0, 0]),
    }
    true
}

fn call_kfunc(id: u32) -> [u8; 8] {
    let imm = id.to_le_bytes();
    [
        CALL,
        PSEUDO_KFUNC_CALL << 4,
        0,
        0,
        imm[0],
        imm[1],
        imm[2],
        imm[3],
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARKER_CALL: [u8; 8] = {
        let imm = RDONLY_CAST_MARKER.to_le_bytes();
        [CALL, 0, 0, 0, imm[0], imm[1], imm[2], imm[3]]
    };

    fn cast() -> RdonlyCast {
        RdonlyCast {
            kfunc: 0x0001_2345,
            skb_shared_info: 7,
            iphdr: 8,
            udphdr: 9,
        }
    }

    #[test]
    fn the_placeholder_becomes_the_kfunc_call_or_a_move() {
        let mut insn = MARKER_CALL;
        assert!(rewrite_insn(&mut insn, Some(&cast())));
        assert_eq!(insn, [0x85, 0x20, 0, 0, 0x45, 0x23, 0x01, 0x00]);
        let mut insn = MARKER_CALL;
        assert!(rewrite_insn(&mut insn, None));
        assert_eq!(insn, [0xbf, 0x10, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn other_calls_are_left_alone() {
        // bpf_probe_read_kernel (113), a BPF-to-BPF call (src_reg 1) with the marker's
        // immediate, and a move.
        for original in [
            [0x85, 0, 0, 0, 113, 0, 0, 0],
            {
                let mut i = MARKER_CALL;
                i[1] = 0x10;
                i
            },
            [0xbf, 0x61, 0, 0, 0, 0, 0, 0],
        ] {
            let mut insn = original;
            assert!(!rewrite_insn(&mut insn, Some(&cast())));
            assert_eq!(insn, original);
        }
    }

    #[test]
    fn globals_turn_the_cast_on_only_with_every_id() {
        assert_eq!(
            RdonlyCast::globals(None),
            vec![(globals::HAVE_RDONLY_CAST, 0)]
        );
        let on = RdonlyCast::globals(Some(&cast()));
        assert!(on.contains(&(globals::HAVE_RDONLY_CAST, 1)));
        assert!(on.contains(&(globals::IPHDR_BTF_ID, 8)));
        assert!(on.contains(&(globals::UDPHDR_BTF_ID, 9)));
        assert!(on.contains(&(globals::SKB_SHARED_INFO_BTF_ID, 7)));
    }

    /// The probes as built: every placeholder is in a code section and is rewritten, and the
    /// rewritten object still parses.
    #[test]
    fn the_built_probes_have_their_placeholders_rewritten() {
        let object = super::super::load::PROBES_OBJECT;
        let markers = |bytes: &[u8]| bytes.windows(8).filter(|w| *w == MARKER_CALL).count();
        let kfunc_calls = |bytes: &[u8]| {
            let call = call_kfunc(cast().kfunc);
            bytes.windows(8).filter(|w| *w == call).count()
        };
        let n = markers(object);
        assert!(n >= 3, "{n} placeholders built");
        let copy = rewrite(object, Some(&cast())).expect("rewrite");
        assert_eq!(markers(copy.bytes()), 0, "a placeholder left");
        assert_eq!(kfunc_calls(copy.bytes()), n);
        assert_eq!(copy.bytes().len(), object.len());
        let copy = rewrite(object, None).expect("rewrite");
        assert_eq!(markers(copy.bytes()), 0);
        assert_eq!(kfunc_calls(copy.bytes()), 0);
    }
}
