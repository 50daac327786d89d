//! A process's executable mappings and a JVM's perf map, as `/proc` gives them.

use std::ops::Range;

use super::files::FileKey;

/// An executable mapping of a process.
#[derive(Clone, Debug)]
pub(super) struct Mapping {
    pub(super) range: Range<u64>,
    /// The file, as the process names it (`None`: anonymous, e.g. JIT code).
    pub(super) path: Option<String>,
    /// The file's key, when it could be read.
    pub(super) file: Option<FileKey>,
    /// Where the file's virtual addresses are in the process: avma = svma + bias.
    pub(super) bias: u64,
}

/// A JVM's perf map: compiled code's ranges and names.
#[derive(Default)]
pub(super) struct PerfMap {
    pub(super) entries: Vec<(u64, u64, String)>,
    /// The file's size and modification time when read.
    pub(super) stamp: Option<(u64, std::time::SystemTime)>,
}

impl PerfMap {
    /// The bytes its entries hold (about).
    pub(super) fn bytes(&self) -> u64 {
        self.entries
            .iter()
            .map(|(_, _, n)| (std::mem::size_of::<(u64, u64, String)>() + n.len()) as u64)
            .sum()
    }

    pub(super) fn lookup(&self, addr: u64) -> Option<&str> {
        let i = self.entries.partition_point(|(start, _, _)| *start <= addr);
        let (start, size, name) = self.entries.get(i.checked_sub(1)?)?;
        (addr < start + size).then_some(name.as_str())
    }
}

/// Parses a perf map (`START SIZE NAME` per line, hexadecimal, with or without `0x`).
pub(super) fn parse_perf_map(text: &str) -> Vec<(u64, u64, String)> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let mut entries: Vec<(u64, u64, String)> = text
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ' ');
            let start = hex(parts.next()?)?;
            let size = hex(parts.next()?)?;
            Some((start, size, parts.next()?.trim().to_owned()))
        })
        .collect();
    entries.sort_by_key(|e| e.0);
    entries
}

/// A line of `/proc/<pid>/maps`.
pub(super) struct MapsLine<'a> {
    pub(super) range: Range<u64>,
    pub(super) exec: bool,
    pub(super) offset: u64,
    pub(super) path: Option<&'a str>,
}

pub(super) fn parse_maps_line(line: &str) -> Option<MapsLine<'_>> {
    let mut parts = line.split_whitespace();
    let (start, end) = parts.next()?.split_once('-')?;
    let perms = parts.next()?;
    let offset = u64::from_str_radix(parts.next()?, 16).ok()?;
    let _dev = parts.next()?;
    let _inode = parts.next()?;
    let path = parts.next();
    Some(MapsLine {
        range: u64::from_str_radix(start, 16).ok()?..u64::from_str_radix(end, 16).ok()?,
        exec: perms.as_bytes().get(2) == Some(&b'x'),
        offset,
        path,
    })
}

/// The load bias of a file mapped at `start` from file offset `offset` (page-aligned): where its
/// virtual addresses are in the process (avma = svma + bias). The mapping holds the segment
/// whose page-aligned file offset is the latest at or before `offset` (an executable segment
/// usually starts inside the page where the read-only one ends, so both "contain" the offset).
pub(super) fn bias_of(segments: &[(u64, u64, u64)], offset: u64, start: u64) -> Option<u64> {
    const PAGE: u64 = 0xfff;
    let (seg_off, seg_addr, _) = segments
        .iter()
        .filter(|(off, _, size)| off & !PAGE <= offset && offset < off + size.max(&1))
        .max_by_key(|(off, _, _)| *off)?;
    // The mapping starts `seg_off - offset` bytes before the segment.
    let svma = seg_addr.checked_sub(seg_off.checked_sub(offset)?)?;
    Some(start.wrapping_sub(svma))
}
