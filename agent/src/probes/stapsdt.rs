//! A binary's USDT probe sites, from its SystemTap SDT notes
//! (<https://sourceware.org/systemtap/wiki/UserSpaceProbeImplementation>): programs built with
//! them (PostgreSQL's `--enable-dtrace`, for one) mark the places worth watching — a lock wait's
//! start and end — with a `nop` and a note, so that a plain uprobe on that `nop` sees the event
//! without the agent knowing the program's functions.
//!
//! Only the section headers and the notes are read: a binary's symbol and debug tables can be
//! hundreds of megabytes, and the notes are a few kilobytes.

use std::path::Path;

use anyhow::{Context as _, Result, bail};
use aya::programs::uprobe::UProbeAttachLocation;
use object::{
    Endian as _, Endianness, FileKind, ReadRef, elf,
    read::elf::{FileHeader, SectionHeader as _, SectionTable},
};

/// One USDT probe site of a binary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsdtProbe {
    pub provider: String,
    pub name: String,
    /// The site's file offset: where a uprobe on the file attaches.
    pub offset: u64,
    /// The semaphore's virtual address (0: none): a counter the program reads before code
    /// that only a tracer needs (`…_ENABLED()`), raised by each tracer that attaches.
    pub semaphore: u64,
    /// The semaphore's file offset (0: none, or in no section with bytes in the file): a
    /// uprobe's reference counter (`ref_ctr_offset`), which the kernel raises in every process
    /// that maps the file. Two uprobes at one site must agree on it.
    pub semaphore_offset: u64,
    /// The argument spec as the note gives it (e.g. "-4@%r13d 1@14(%r12)").
    pub args: String,
}

const NOTE_SECTION: &[u8] = b".note.stapsdt";
/// Present when the notes' addresses may have been moved by prelink: the notes keep the
/// addresses of link time, this section's header has the one of now.
const BASE_SECTION: &[u8] = b".stapsdt.base";
const NOTE_OWNER: &[u8] = b"stapsdt";
/// Version 3 of the note (the one with the argument spec), the only one `sys/sdt.h` has
/// written since 2010.
const NT_STAPSDT: elf::NoteType = elf::NoteType(3);

/// Every USDT probe site in the ELF file at `path` (empty when it has none); an error when it cannot be read or parsed as ELF.
///
/// Read through a cache of the ranges asked for, so that a multi-gigabyte binary costs its
/// headers and notes, not its size.
pub fn probes(path: &Path) -> Result<Vec<UsdtProbe>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let cache = object::ReadCache::new(file);
    probes_from(&cache).with_context(|| format!("USDT notes of {}", path.display()))
}

/// The same, from the file's bytes.
pub fn probes_in(data: &[u8]) -> Result<Vec<UsdtProbe>> {
    probes_from(data)
}

fn probes_from<'data, R: ReadRef<'data>>(data: R) -> Result<Vec<UsdtProbe>> {
    match FileKind::parse(data).context("not an ELF file")? {
        FileKind::Elf32 => probes_of::<elf::FileHeader32<Endianness>, R>(data),
        FileKind::Elf64 => probes_of::<elf::FileHeader64<Endianness>, R>(data),
        kind => bail!("not an ELF file ({kind:?})"),
    }
}

/// A note record whose framing is broken (a size past the section's end) is an error: where
/// the next record starts is lost, and the file is not what it claims to be. A record that is
/// well framed but not a probe site the agent can use (a descriptor too short or without its
/// strings, a site in no section of the file) is skipped: the other records are still sound.
fn probes_of<'data, Elf, R>(data: R) -> Result<Vec<UsdtProbe>>
where
    Elf: FileHeader<Endian = Endianness>,
    R: ReadRef<'data>,
{
    let header = Elf::parse(data).context("ELF header")?;
    let endian = header.endian().context("ELF header")?;
    let sections = header
        .sections(endian, data)
        .context("ELF section headers")?;
    let word = if header.is_type_64() { 8 } else { 4 };
    let base = sections
        .section_by_name(endian, BASE_SECTION)
        .map(|(_, s)| s.sh_addr(endian).into());
    let mut probes = Vec::new();
    for section in sections.iter() {
        if sections.section_name(endian, section).ok() != Some(NOTE_SECTION) {
            continue;
        }
        let Some(mut notes) = section
            .notes(endian, data)
            .context("the .note.stapsdt section")?
        else {
            continue;
        };
        while let Some(note) = notes.next().context("a note of .note.stapsdt")? {
            if note.name() != NOTE_OWNER || note.n_type(endian) != NT_STAPSDT {
                continue;
            }
            let Some(site) = Site::parse(note.desc(), word, endian) else {
                continue;
            };
            let (pc, semaphore) = match base {
                // Prelink moved the binary by as much as it moved the base section.
                Some(actual) => {
                    let shift = actual.wrapping_sub(site.base);
                    let semaphore = match site.semaphore {
                        0 => 0,
                        s => s.wrapping_add(shift),
                    };
                    (site.pc.wrapping_add(shift), semaphore)
                }
                None => (site.pc, site.semaphore),
            };
            let Some(offset) = file_offset(&sections, endian, pc) else {
                continue;
            };
            let semaphore_offset = match semaphore {
                0 => 0,
                s => file_offset(&sections, endian, s).unwrap_or(0),
            };
            probes.push(UsdtProbe {
                provider: site.provider.to_owned(),
                name: site.name.to_owned(),
                offset,
                semaphore,
                semaphore_offset,
                args: site.args.to_owned(),
            });
        }
    }
    Ok(probes)
}

/// A note's descriptor, as written.
struct Site<'a> {
    pc: u64,
    base: u64,
    semaphore: u64,
    provider: &'a str,
    name: &'a str,
    args: &'a str,
}

impl<'a> Site<'a> {
    /// `None` when the descriptor is not three words and three NUL-terminated UTF-8 strings:
    /// a name that is not text could not be asked for by anyone.
    fn parse(desc: &'a [u8], word: usize, endian: Endianness) -> Option<Self> {
        let read_word = |i: usize| -> Option<u64> {
            let bytes = desc.get(i * word..(i + 1) * word)?;
            Some(match word {
                8 => endian.read_u64(bytes.try_into().ok()?),
                _ => endian.read_u32(bytes.try_into().ok()?).into(),
            })
        };
        let (pc, base, semaphore) = (read_word(0)?, read_word(1)?, read_word(2)?);
        let rest = desc.get(3 * word..)?;
        let (provider, rest) = c_str(rest)?;
        let (name, rest) = c_str(rest)?;
        let (args, _) = c_str(rest)?;
        Some(Self {
            pc,
            base,
            semaphore,
            provider,
            name,
            args,
        })
    }
}

/// The string up to the first NUL, and what follows the NUL.
fn c_str(bytes: &[u8]) -> Option<(&str, &[u8])> {
    let end = bytes.iter().position(|&b| b == 0)?;
    let s = std::str::from_utf8(bytes.get(..end)?).ok()?;
    Some((s, bytes.get(end + 1..)?))
}

/// A uprobe is placed by file offset, and a note gives a virtual address: the two differ by
/// the placement of the section that holds the site. Only sections loaded into memory (and
/// with bytes in the file) can hold one; the others have no address, or no offset.
fn file_offset<'data, Elf, R>(
    sections: &SectionTable<'data, Elf, R>,
    endian: Endianness,
    pc: u64,
) -> Option<u64>
where
    Elf: FileHeader<Endian = Endianness>,
    R: ReadRef<'data>,
{
    sections.iter().find_map(|s| {
        if !s.sh_flags(endian).contains(elf::SHF_ALLOC) || s.sh_type(endian) == elf::SHT_NOBITS {
            return None;
        }
        let address: u64 = s.sh_addr(endian).into();
        let size: u64 = s.sh_size(endian).into();
        if pc < address || pc - address >= size {
            return None;
        }
        let section_offset: u64 = s.sh_offset(endian).into();
        match UProbeAttachLocation::from_virtual_address(pc, address, section_offset) {
            Ok(UProbeAttachLocation::AbsoluteOffset(o)) => Some(o),
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHT_PROGBITS: u32 = 1;
    const SHT_STRTAB: u32 = 3;
    const SHT_NOTE: u32 = 7;
    const SHF_ALLOC: u64 = 2;
    const SHF_EXECINSTR: u64 = 4;

    /// How the synthetic file is laid out: ELF64 or ELF32, little- or big-endian.
    #[derive(Clone, Copy)]
    struct Class {
        is64: bool,
        big: bool,
    }

    const LE64: Class = Class {
        is64: true,
        big: false,
    };

    impl Class {
        fn u16(self, out: &mut Vec<u8>, v: u16) {
            out.extend(if self.big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            });
        }
        fn u32(self, out: &mut Vec<u8>, v: u32) {
            out.extend(if self.big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            });
        }
        /// An address-sized word.
        fn word(self, out: &mut Vec<u8>, v: u64) {
            if self.is64 {
                out.extend(if self.big {
                    v.to_be_bytes()
                } else {
                    v.to_le_bytes()
                });
            } else {
                self.u32(out, u32::try_from(v).expect("a 32-bit word"));
            }
        }
    }

    struct Section {
        name: &'static str,
        sh_type: u32,
        flags: u64,
        addr: u64,
        data: Vec<u8>,
    }

    fn text(addr: u64) -> Section {
        Section {
            name: ".text",
            sh_type: SHT_PROGBITS,
            flags: SHF_ALLOC | SHF_EXECINSTR,
            addr,
            data: vec![0x90; 0x100],
        }
    }

    fn base(addr: u64) -> Section {
        Section {
            name: ".stapsdt.base",
            sh_type: SHT_PROGBITS,
            flags: SHF_ALLOC,
            addr,
            data: vec![0],
        }
    }

    fn notes(data: Vec<u8>) -> Section {
        Section {
            name: ".note.stapsdt",
            sh_type: SHT_NOTE,
            flags: 0,
            addr: 0,
            data,
        }
    }

    fn pad4(out: &mut Vec<u8>) {
        while !out.len().is_multiple_of(4) {
            out.push(0);
        }
    }

    /// One note record: header, owner, descriptor, each padded to 4 bytes.
    fn note(class: Class, owner: &str, n_type: u32, desc: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        class.u32(&mut out, owner.len() as u32 + 1);
        class.u32(&mut out, desc.len() as u32);
        class.u32(&mut out, n_type);
        out.extend(owner.as_bytes());
        out.push(0);
        pad4(&mut out);
        out.extend(desc);
        pad4(&mut out);
        out
    }

    /// A stapsdt descriptor: pc, base, semaphore, provider, name, args.
    fn site(class: Class, pc: u64, base: u64, sema: u64, strings: [&str; 3]) -> Vec<u8> {
        let mut desc = Vec::new();
        for w in [pc, base, sema] {
            class.word(&mut desc, w);
        }
        for s in strings {
            desc.extend(s.as_bytes());
            desc.push(0);
        }
        desc
    }

    fn stapsdt(class: Class, pc: u64, base: u64, sema: u64, strings: [&str; 3]) -> Vec<u8> {
        note(class, "stapsdt", 3, &site(class, pc, base, sema, strings))
    }

    /// An ELF file with these sections (after the null section, before `.shstrtab`), and each
    /// section's file offset in that order.
    fn elf(class: Class, sections: &[Section]) -> (Vec<u8>, Vec<u64>) {
        let (ehsize, shentsize) = if class.is64 { (64, 64) } else { (52, 40) };
        let mut shstrtab = vec![0u8];
        let mut names = Vec::new();
        for s in sections.iter().map(|s| s.name).chain([".shstrtab"]) {
            names.push(shstrtab.len() as u32);
            shstrtab.extend(s.as_bytes());
            shstrtab.push(0);
        }
        let mut body = vec![0u8; ehsize];
        let mut offsets = Vec::new();
        for data in sections.iter().map(|s| &s.data).chain([&shstrtab]) {
            while !body.len().is_multiple_of(8) {
                body.push(0);
            }
            offsets.push(body.len() as u64);
            body.extend(data);
        }
        while !body.len().is_multiple_of(8) {
            body.push(0);
        }
        let shoff = body.len() as u64;
        let shnum = sections.len() as u16 + 2;

        let mut header = vec![0x7f, b'E', b'L', b'F'];
        header.push(if class.is64 { 2 } else { 1 });
        header.push(if class.big { 2 } else { 1 });
        header.push(1);
        header.resize(16, 0);
        class.u16(&mut header, 2); // ET_EXEC
        class.u16(&mut header, if class.is64 { 62 } else { 3 });
        class.u32(&mut header, 1);
        class.word(&mut header, 0); // e_entry
        class.word(&mut header, 0); // e_phoff
        class.word(&mut header, shoff);
        class.u32(&mut header, 0);
        class.u16(&mut header, ehsize as u16);
        class.u16(&mut header, if class.is64 { 56 } else { 32 });
        class.u16(&mut header, 0);
        class.u16(&mut header, shentsize as u16);
        class.u16(&mut header, shnum);
        class.u16(&mut header, shnum - 1);
        assert_eq!(header.len(), ehsize);
        body[..ehsize].copy_from_slice(&header);

        body.extend(vec![0u8; shentsize]);
        let strtab = Section {
            name: ".shstrtab",
            sh_type: SHT_STRTAB,
            flags: 0,
            addr: 0,
            data: Vec::new(),
        };
        for (i, s) in sections.iter().chain([&strtab]).enumerate() {
            let size = if i == sections.len() {
                shstrtab.len()
            } else {
                s.data.len()
            };
            let align = if s.sh_type == SHT_NOTE { 4 } else { 1 };
            class.u32(&mut body, names[i]);
            class.u32(&mut body, s.sh_type);
            class.word(&mut body, s.flags);
            class.word(&mut body, s.addr);
            class.word(&mut body, offsets[i]);
            class.word(&mut body, size as u64);
            class.u32(&mut body, 0);
            class.u32(&mut body, 0);
            class.word(&mut body, align);
            class.word(&mut body, 0);
        }
        (body, offsets)
    }

    const ARGS: &str = "-4@%r13d 1@14(%r12)";

    fn two_sites(class: Class) -> Vec<u8> {
        let mut data = stapsdt(
            class,
            0x401010,
            0x402000,
            0,
            ["postgresql", "lock__wait__start", ARGS],
        );
        // Another owner's note of the same type: not a probe site.
        data.extend(note(class, "GNU", 3, &[0; 20]));
        data.extend(stapsdt(
            class,
            0x401020,
            0x402000,
            0x404000,
            ["postgresql", "lock__wait__done", ""],
        ));
        data
    }

    #[test]
    fn two_probes_with_their_file_offsets_semaphores_and_args() {
        let (file, offsets) = elf(
            LE64,
            &[text(0x401000), base(0x402000), notes(two_sites(LE64))],
        );
        let text_offset = offsets[0];
        assert_ne!(
            text_offset, 0x1000,
            "the offset must differ from the address"
        );
        let probes = probes_in(&file).expect("parsed");
        assert_eq!(
            probes,
            vec![
                UsdtProbe {
                    provider: "postgresql".into(),
                    name: "lock__wait__start".into(),
                    offset: 0x10 + text_offset,
                    semaphore: 0,
                    semaphore_offset: 0,
                    args: ARGS.into(),
                },
                UsdtProbe {
                    provider: "postgresql".into(),
                    name: "lock__wait__done".into(),
                    offset: 0x20 + text_offset,
                    semaphore: 0x404000,
                    // In no section of this file: no counter to give the kernel.
                    semaphore_offset: 0,
                    args: String::new(),
                },
            ]
        );
    }

    #[test]
    fn a_semaphore_in_a_section_has_its_file_offset() {
        let probes_section = Section {
            name: ".probes",
            sh_type: SHT_PROGBITS,
            flags: SHF_ALLOC,
            addr: 0x404000,
            data: vec![0; 8],
        };
        let (file, offsets) = elf(
            LE64,
            &[
                text(0x401000),
                base(0x402000),
                probes_section,
                notes(two_sites(LE64)),
            ],
        );
        let probes = probes_in(&file).expect("parsed");
        assert_eq!(probes[0].semaphore_offset, 0, "no semaphore, no offset");
        assert_eq!(probes[1].semaphore, 0x404000);
        assert_eq!(probes[1].semaphore_offset, offsets[2]);
        assert_ne!(
            offsets[2], 0x404000,
            "the offset must differ from the address"
        );
    }

    #[test]
    fn elf32_big_endian_words_are_four_bytes() {
        let be32 = Class {
            is64: false,
            big: true,
        };
        let (file, offsets) = elf(be32, &[text(0x8000), base(0x9000), notes(two_sites(be32))]);
        // The notes' addresses are those of the ELF64 layout: the base differs, and shifts them.
        let shift = 0x9000u64.wrapping_sub(0x402000);
        let (pc, sema) = (
            0x401020u64.wrapping_add(shift),
            0x404000u64.wrapping_add(shift),
        );
        assert_eq!(pc, 0x8020);
        let probes = probes_in(&file).expect("parsed");
        assert_eq!(probes.len(), 2);
        assert_eq!(probes[1].name, "lock__wait__done");
        assert_eq!(probes[1].offset, 0x20 + offsets[0]);
        assert_eq!(probes[1].semaphore, sema);
        assert_eq!(probes[0].args, ARGS);
    }

    #[test]
    fn prelink_shift_moves_the_pc_and_a_nonzero_semaphore() {
        // Linked with .stapsdt.base at 0x401f00, then moved up by 0x100.
        let mut data = stapsdt(LE64, 0x400f10, 0x401f00, 0x403f00, ["p", "a", ""]);
        data.extend(stapsdt(LE64, 0x400f40, 0x401f00, 0, ["p", "b", ""]));
        let (file, offsets) = elf(LE64, &[text(0x401000), base(0x402000), notes(data)]);
        let probes = probes_in(&file).expect("parsed");
        assert_eq!(probes.len(), 2);
        assert_eq!(probes[0].offset, 0x10 + offsets[0]);
        assert_eq!(probes[0].semaphore, 0x404000);
        assert_eq!(probes[1].offset, 0x40 + offsets[0]);
        assert_eq!(probes[1].semaphore, 0, "no semaphore stays none");
    }

    #[test]
    fn without_a_base_section_addresses_are_taken_as_they_are() {
        let data = stapsdt(LE64, 0x401030, 0x12345, 0x404000, ["p", "a", ""]);
        let (file, offsets) = elf(LE64, &[text(0x401000), notes(data)]);
        let probes = probes_in(&file).expect("parsed");
        assert_eq!(probes.len(), 1);
        assert_eq!(probes[0].offset, 0x30 + offsets[0]);
        assert_eq!(probes[0].semaphore, 0x404000);
    }

    #[test]
    fn a_site_in_no_loaded_section_is_skipped() {
        let mut data = stapsdt(LE64, 0x500000, 0x402000, 0, ["p", "nowhere", ""]);
        // Non-loaded sections have address 0: a site at 0 is in none of them.
        data.extend(stapsdt(LE64, 0x0, 0x402000, 0, ["p", "zero", ""]));
        data.extend(stapsdt(LE64, 0x4010ff, 0x402000, 0, ["p", "last", ""]));
        data.extend(stapsdt(LE64, 0x401100, 0x402000, 0, ["p", "past", ""]));
        let (file, offsets) = elf(LE64, &[text(0x401000), base(0x402000), notes(data)]);
        let probes = probes_in(&file).expect("parsed");
        let names: Vec<&str> = probes.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["last"]);
        assert_eq!(probes[0].offset, 0xff + offsets[0]);
    }

    #[test]
    fn a_file_without_notes_has_no_probes() {
        let (file, _) = elf(LE64, &[text(0x401000)]);
        assert_eq!(probes_in(&file).expect("parsed"), []);
        let (file, _) = elf(LE64, &[]);
        assert_eq!(probes_in(&file).expect("parsed"), []);
        // Only other owners' notes.
        let (file, _) = elf(
            LE64,
            &[text(0x401000), notes(note(LE64, "GNU", 3, &[0; 16]))],
        );
        assert_eq!(probes_in(&file).expect("parsed"), []);
    }

    #[test]
    fn malformed_descriptors_are_skipped() {
        let good = stapsdt(LE64, 0x401010, 0x402000, 0, ["p", "good", ""]);
        let bad_descs: [Vec<u8>; 4] = [
            // Shorter than the three words.
            vec![0; 20],
            // The words, no strings.
            site(LE64, 0x401010, 0x402000, 0, ["p", "n", ""])[..24].to_vec(),
            // The last string without its NUL.
            {
                let mut d = site(LE64, 0x401010, 0x402000, 0, ["p", "n", "args"]);
                d.pop();
                d
            },
            // Not UTF-8.
            {
                let mut d = site(LE64, 0x401010, 0x402000, 0, ["p", "n", ""]);
                d[24] = 0xff;
                d
            },
        ];
        for desc in bad_descs {
            let mut data = note(LE64, "stapsdt", 3, &desc);
            data.extend(&good);
            let (file, _) = elf(LE64, &[text(0x401000), base(0x402000), notes(data)]);
            let probes = probes_in(&file).expect("well framed");
            let names: Vec<&str> = probes.iter().map(|p| p.name.as_str()).collect();
            assert_eq!(names, ["good"], "{desc:?}");
        }
    }

    #[test]
    fn broken_note_framing_is_an_error() {
        let good = stapsdt(LE64, 0x401010, 0x402000, 0, ["p", "good", ""]);
        let mut huge_desc = good.clone();
        huge_desc[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut huge_name = good.clone();
        huge_name[0..4].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
        let mut cut = good.clone();
        cut.truncate(good.len() - 8);
        let header_only = good[..6].to_vec();
        for data in [huge_desc, huge_name, cut, header_only] {
            let (file, _) = elf(LE64, &[text(0x401000), base(0x402000), notes(data)]);
            assert!(probes_in(&file).is_err());
        }
    }

    #[test]
    fn garbage_anywhere_does_not_panic() {
        let (file, offsets) = elf(
            LE64,
            &[text(0x401000), base(0x402000), notes(two_sites(LE64))],
        );
        for len in 0..file.len() {
            let _ = probes_in(&file[..len]);
        }
        // Every byte of the notes and of the headers, set to values that make sizes and
        // addresses extreme.
        let notes_at = offsets[2] as usize;
        let shoff = file.len() - 5 * 64;
        let positions = (0..64)
            .chain(notes_at..notes_at + two_sites(LE64).len())
            .chain(shoff..file.len());
        for i in positions {
            for v in [0x00, 0x01, 0x7f, 0x80, 0xff] {
                let mut bad = file.clone();
                bad[i] = v;
                let _ = probes_in(&bad);
            }
        }
    }

    #[test]
    fn what_is_not_elf_is_an_error() {
        assert!(probes_in(b"").is_err());
        assert!(probes_in(b"#!/bin/sh\necho not a binary\n").is_err());
        let mut bad_class = b"\x7fELF".to_vec();
        bad_class.resize(64, 3);
        assert!(probes_in(&bad_class).is_err());
        let (mut file, _) = elf(LE64, &[text(0x401000)]);
        file[5] = 9; // Neither endianness.
        assert!(probes_in(&file).is_err());
    }

    #[test]
    fn probes_reads_the_file_at_a_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bin");
        let (file, _) = elf(
            LE64,
            &[text(0x401000), base(0x402000), notes(two_sites(LE64))],
        );
        std::fs::write(&path, &file).expect("written");
        assert_eq!(
            probes(&path).expect("parsed"),
            probes_in(&file).expect("parsed")
        );
        assert_eq!(probes(&path).expect("parsed").len(), 2);
        assert!(probes(&dir.path().join("missing")).is_err());
        std::fs::write(&path, b"text").expect("written");
        assert!(probes(&path).is_err());
    }
}
