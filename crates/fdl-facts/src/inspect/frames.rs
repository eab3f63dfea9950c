//! Where functions start and end in a library stripped of its symbols: the unwind tables.
//!
//! Compilers give every function a Frame Description Entry in `.eh_frame` by default on
//! x86-64 and aarch64 (`-fasynchronous-unwind-tables`), and `strip` keeps it: the runtime
//! needs it to unwind through C++ exceptions. An FDE's `[pc_begin, pc_begin + pc_range)`
//! is the exact range of one function's code (or of one part of it: gcc's `.cold`
//! splits get their own), which is what [`super::code_refs`] needs to decode a candidate
//! reference from a function's start where no symbol names the function.
//!
//! Two ways in, cheapest first:
//! - `.eh_frame_hdr`'s binary search table (what glibc's unwinder uses): the FDEs'
//!   initial locations, sorted, each with its FDE's address. A lookup reads a logarithmic
//!   number of rows and parses one FDE (and a few before it), so asking about a handful
//!   of candidates in a 1 GiB library touches a few pages, never the whole table;
//! - without it (`ld --no-eh-frame-hdr`, an empty table), one walk over `.eh_frame`'s
//!   CIEs and FDEs, at most [`MAX_ENTRIES`] of them, done once on the first question.
//!
//! `gimli` parses the entries; every read is bounded by the section's bytes, and a
//! pointer that is indirect, wraps, or lands outside `.eh_frame` is an error, never a
//! panic. An error makes the caller fall back to what it did without unwind tables.
//! The section comes from the section headers (`.eh_frame_hdr`, `.eh_frame`), else from
//! the program headers: `PT_GNU_EH_FRAME` is `.eh_frame_hdr`, whose first pointer gives
//! `.eh_frame`, read up to the end of the load segment that holds it (the walk stops at
//! its zero terminator).

use super::elf::ElfInfo;
use super::source::Source;
use gimli::{
    BaseAddresses, CieOrFde, EhFrame, EhFrameHdr, EhFrameOffset, EndianSlice, ParsedEhFrameHdr,
    RunTimeEndian, UnwindSection,
};
use object::elf;
use std::cell::OnceCell;
use std::collections::HashMap;

type R<'a> = EndianSlice<'a, RunTimeEndian>;

/// The most CIEs and FDEs read by a walk of `.eh_frame` (one without a search table).
/// libtorch_cpu.so of torch 1.13.1 has 389,914, torch 2.15's libtorch_cuda.so 117,725; past
/// the cap the walk fails (the caller then decodes as it would without unwind tables),
/// so a hostile section of millions of tiny entries costs no more than this many steps
/// and 16 bytes of memory each.
pub const MAX_ENTRIES: usize = 1 << 22;
/// How many FDEs before the nearest one a lookup also looks at, for one that overlaps
/// (compilers emit none; a nested range would otherwise be taken for a gap).
const LOOK_BACK: u64 = 8;
/// The most CIEs a walk keeps parsed (a linked library has a handful: ld merges equal
/// ones); past it each further FDE's CIE is parsed again, so memory stays bounded.
const MAX_CACHED_CIES: usize = 1024;
/// The fewest bytes one row of the search table takes (two 2-byte values): the most rows
/// a table of `n` bytes can hold is `n / 4`, whatever count its header claims.
const MIN_ROW: u64 = 4;

/// Where an address lies among the FDEs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// In the function (or function part) whose code is `[start, end)`.
    Function { start: u64, end: u64 },
    /// In no FDE's range; `after` is the end of the nearest FDE below it, if any.
    Gap { after: Option<u64> },
}

/// The FDEs of one object.
pub struct Frames<'a> {
    eh_frame: EhFrame<R<'a>>,
    /// Address of `.eh_frame`, for turning the table's FDE addresses into offsets.
    eh_frame_addr: u64,
    bases: BaseAddresses,
    /// `.eh_frame_hdr` with a non-empty search table, and its size in bytes.
    hdr: Option<ParsedEhFrameHdr<R<'a>>>,
    hdr_len: u64,
    /// The walk's FDE ranges, sorted by start: done on the first question when there is
    /// no table.
    walked: OnceCell<Result<Vec<(u64, u64)>, String>>,
}

impl<'a> Frames<'a> {
    /// From the bytes and addresses of `.eh_frame` and, if present, `.eh_frame_hdr`.
    /// 64-bit addresses.
    pub fn new(
        eh_frame: &'a [u8],
        eh_frame_addr: u64,
        hdr: Option<(&'a [u8], u64)>,
        endian: RunTimeEndian,
    ) -> Frames<'a> {
        let mut bases = BaseAddresses::default().set_eh_frame(eh_frame_addr);
        let mut section = EhFrame::new(eh_frame, endian);
        section.set_address_size(8);
        let hdr_len = hdr.map_or(0, |(bytes, _)| bytes.len() as u64);
        let hdr = hdr.and_then(|(bytes, addr)| {
            bases = bases.clone().set_eh_frame_hdr(addr);
            let parsed = EhFrameHdr::new(bytes, endian).parse(&bases, 8).ok()?;
            // The table must describe this `.eh_frame`, and have rows.
            (parsed.eh_frame_ptr().direct().ok()? == eh_frame_addr && parsed.table().is_some())
                .then_some(parsed)
        });
        Frames {
            eh_frame: section,
            eh_frame_addr,
            bases,
            hdr,
            hdr_len,
            walked: OnceCell::new(),
        }
    }

    /// The unwind tables of a 64-bit ELF object, found through its section headers or,
    /// stripped of those, its program headers. None when it has no `.eh_frame` fdl can
    /// read.
    pub fn find(info: &ElfInfo, src: &'a Source<'_>) -> Option<Frames<'a>> {
        if !info.is_64 {
            return None;
        }
        let endian = if src.bytes(5, 1).ok()?[0] == elf::ELFDATA2MSB {
            RunTimeEndian::Big
        } else {
            RunTimeEndian::Little
        };
        let named = |name: &str| {
            info.sections
                .iter()
                .find(|s| s.name == name && s.has_file_bytes() && s.size > 0)
                .and_then(|s| Some((src.bytes(s.offset, s.size).ok()?, s.addr)))
        };
        let hdr = named(".eh_frame_hdr").or_else(|| {
            let seg = info
                .segments
                .iter()
                .find(|s| s.p_type == elf::PT_GNU_EH_FRAME && s.filesz > 0)?;
            Some((src.bytes(seg.offset, seg.filesz).ok()?, seg.vaddr))
        });
        let eh_frame = named(".eh_frame").or_else(|| {
            // `.eh_frame_hdr`'s first field is `.eh_frame`'s address.
            let (bytes, addr) = hdr?;
            let bases = BaseAddresses::default().set_eh_frame_hdr(addr);
            let at = EhFrameHdr::new(bytes, endian)
                .parse(&bases, 8)
                .ok()?
                .eh_frame_ptr()
                .direct()
                .ok()?;
            let seg = info
                .segments
                .iter()
                .find(|s| s.p_type == elf::PT_LOAD && at >= s.vaddr && at - s.vaddr < s.filesz)?;
            let off = seg.offset.checked_add(at - seg.vaddr)?;
            let len = seg.filesz - (at - seg.vaddr);
            Some((src.bytes(off, len).ok()?, at))
        })?;
        Some(Frames::new(eh_frame.0, eh_frame.1, hdr, endian))
    }

    /// Whether lookups go through `.eh_frame_hdr`'s search table.
    pub fn has_search_table(&self) -> bool {
        self.hdr.is_some()
    }

    /// Where `addr` lies: in which FDE's range, or in a gap after which one. An error
    /// when the tables cannot be read there, or hold no FDE at all.
    pub fn place(&self, addr: u64) -> Result<Place, String> {
        match &self.hdr {
            Some(hdr) => self.place_by_table(hdr, addr),
            None => {
                let ranges = self.walked.get_or_init(|| self.walk());
                place_in(ranges.as_ref().map_err(Clone::clone)?, addr)
            }
        }
    }

    /// Every FDE's `[start, end)`, sorted by start: from the search table's rows when
    /// there is one (each FDE parsed), else the walk's. For checks against other tools.
    pub fn all(&self) -> Result<Vec<(u64, u64)>, String> {
        let Some(hdr) = &self.hdr else {
            return self.walk();
        };
        let table = hdr.table().ok_or("no search table")?;
        let mut out = Vec::new();
        let mut rows = table.iter(&self.bases);
        loop {
            match rows.next() {
                Ok(Some((_, fde))) => {
                    if out.len() >= MAX_ENTRIES {
                        return Err(format!("more than {MAX_ENTRIES} FDEs"));
                    }
                    let fde = fde.direct().map_err(|e| e.to_string())?;
                    out.push(self.fde_at(fde)?);
                }
                Ok(None) => break,
                Err(e) => return Err(format!("unreadable search table: {e}")),
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// The `[start, end)` of the FDE at address `fde` in `.eh_frame`.
    fn fde_at(&self, fde: u64) -> Result<(u64, u64), String> {
        let off = fde
            .checked_sub(self.eh_frame_addr)
            .and_then(|o| usize::try_from(o).ok())
            .ok_or_else(|| format!("an FDE address ({fde:#x}) lies before .eh_frame"))?;
        let entry = self
            .eh_frame
            .fde_from_offset(&self.bases, EhFrameOffset(off), EhFrame::cie_from_offset)
            .map_err(|e| format!("unreadable FDE at {fde:#x}: {e}"))?;
        range_of(entry.initial_address(), entry.len())
    }

    /// Binary search of the table's rows for the last FDE starting at or below `addr`.
    fn place_by_table(&self, hdr: &ParsedEhFrameHdr<R<'a>>, addr: u64) -> Result<Place, String> {
        let table = hdr.table().ok_or("no search table")?;
        let row = |i: u64| -> Result<(u64, u64), String> {
            let i = usize::try_from(i).map_err(|e| e.to_string())?;
            match table.iter(&self.bases).nth(i) {
                Ok(Some((loc, fde))) => Ok((
                    loc.direct().map_err(|e| e.to_string())?,
                    fde.direct().map_err(|e| e.to_string())?,
                )),
                Ok(None) => Err("the search table is shorter than it says".into()),
                Err(e) => Err(format!("unreadable search table: {e}")),
            }
        };
        // The row count the header claims, no more than the section can hold (rows past
        // its end fail to read; the bound keeps row offsets far from overflowing).
        let (mut lo, mut hi) = (0u64, count(&table, &self.bases).min(self.hdr_len / MIN_ROW));
        if hi == 0 {
            return Err("an empty search table".into());
        }
        // Invariant: rows below `lo` start at or below `addr`, rows from `hi` above it.
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if row(mid)?.0 <= addr {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let mut after = None;
        for i in (lo.saturating_sub(LOOK_BACK)..lo).rev() {
            let (start, end) = self.fde_at(row(i)?.1)?;
            if start <= addr && addr < end {
                return Ok(Place::Function { start, end });
            }
            if end <= addr {
                after = after.max(Some(end));
            }
        }
        Ok(Place::Gap { after })
    }

    /// All FDE ranges by one pass over `.eh_frame`, each CIE parsed once.
    fn walk(&self) -> Result<Vec<(u64, u64)>, String> {
        let mut cies = HashMap::new();
        let mut out = Vec::new();
        let mut entries = self.eh_frame.entries(&self.bases);
        let mut seen = 0usize;
        loop {
            let entry = match entries.next() {
                Ok(Some(e)) => e,
                Ok(None) => break,
                Err(e) => return Err(format!("unreadable .eh_frame: {e}")),
            };
            seen += 1;
            if seen > MAX_ENTRIES {
                return Err(format!("more than {MAX_ENTRIES} entries in .eh_frame"));
            }
            if let CieOrFde::Fde(partial) = entry {
                let fde = partial
                    .parse(|section, bases, off: EhFrameOffset<usize>| {
                        if let Some(cie) = cies.get(&off.0) {
                            return Ok(Clone::clone(cie));
                        }
                        let cie = section.cie_from_offset(bases, off)?;
                        if cies.len() < MAX_CACHED_CIES {
                            cies.insert(off.0, cie.clone());
                        }
                        Ok(cie)
                    })
                    .map_err(|e| format!("unreadable FDE in .eh_frame: {e}"))?;
                out.push(range_of(fde.initial_address(), fde.len())?);
            }
        }
        if out.is_empty() {
            return Err(".eh_frame holds no FDE".into());
        }
        out.sort_unstable();
        Ok(out)
    }
}

/// The rows the search table claims: gimli keeps the count private, so it is read as
/// the distance its iterator reports.
fn count(table: &gimli::EhHdrTable<'_, R<'_>>, bases: &BaseAddresses) -> u64 {
    table.iter(bases).size_hint().0 as u64
}

/// `[start, start + len)`, refused when it wraps.
fn range_of(start: u64, len: u64) -> Result<(u64, u64), String> {
    let end = start
        .checked_add(len)
        .ok_or_else(|| format!("an FDE's range ({start:#x} + {len:#x}) wraps"))?;
    Ok((start, end))
}

/// [`Frames::place`] over sorted ranges.
fn place_in(ranges: &[(u64, u64)], addr: u64) -> Result<Place, String> {
    let n = ranges.partition_point(|&(s, _)| s <= addr);
    let mut after = None;
    for &(start, end) in ranges[..n].iter().rev().take(LOOK_BACK as usize) {
        if addr < end {
            return Ok(Place::Function { start, end });
        }
        after = after.max(Some(end));
    }
    Ok(Place::Gap { after })
}

/// `.eh_frame` bytes for tests.
#[cfg(test)]
pub(crate) mod synth {
    /// A CIE (augmentation "zR", FDE pointers pc-relative sdata4) and one FDE per
    /// `(start, len)`, laid out at `addr`, then the zero terminator.
    pub(crate) fn eh_frame(addr: u64, fdes: &[(u64, u32)]) -> (Vec<u8>, Vec<u64>) {
        let mut b = Vec::new();
        // CIE: length, id 0, version 1, "zR\0", code align 1, data align -8, RA 16,
        // augmentation length 1, FDE encoding pcrel|sdata4 (0x1b), padding to 4.
        let cie_body: Vec<u8> = [
            &0u32.to_le_bytes()[..],
            &[1, b'z', b'R', 0, 1, 0x78, 16, 1, 0x1b],
            &[0, 0, 0],
        ]
        .concat();
        b.extend((cie_body.len() as u32).to_le_bytes());
        b.extend(&cie_body);
        let mut at = Vec::new();
        for &(start, len) in fdes {
            let fde_off = b.len();
            at.push(addr + fde_off as u64);
            // length, CIE pointer (distance back to the CIE from this field), pc_begin
            // (pc-relative to its own field), pc_range, augmentation length 0, padding.
            let body_len = 4 + 4 + 4 + 1 + 3;
            b.extend((body_len as u32).to_le_bytes());
            b.extend(((fde_off + 4) as u32).to_le_bytes());
            let field = addr + b.len() as u64;
            b.extend((start.wrapping_sub(field) as i32).to_le_bytes());
            b.extend(len.to_le_bytes());
            b.extend([0, 0, 0, 0]);
        }
        b.extend(0u32.to_le_bytes());
        (b, at)
    }
}

#[cfg(test)]
mod tests {
    use super::synth::eh_frame;
    use super::*;

    const LE: RunTimeEndian = RunTimeEndian::Little;

    /// `.eh_frame_hdr` at `addr` for `.eh_frame` at `frame_addr`, its rows sorted by
    /// start, all datarel sdata4 (0x3b) as ld writes them.
    fn eh_frame_hdr(addr: u64, frame_addr: u64, rows: &[(u64, u64)]) -> Vec<u8> {
        let mut b = vec![1, 0x1b, 0x03, 0x3b];
        let field = addr + 4;
        b.extend((frame_addr.wrapping_sub(field) as i32).to_le_bytes());
        b.extend((rows.len() as u32).to_le_bytes());
        let mut rows = rows.to_vec();
        rows.sort_unstable();
        for (start, fde) in rows {
            b.extend((start.wrapping_sub(addr) as i32).to_le_bytes());
            b.extend((fde.wrapping_sub(addr) as i32).to_le_bytes());
        }
        b
    }

    const FDES: [(u64, u32); 3] = [(0x1000, 0x20), (0x1030, 0x10), (0x1100, 0x40)];

    fn check_places(f: &Frames<'_>) {
        assert_eq!(f.place(0x0fff), Ok(Place::Gap { after: None }));
        assert_eq!(
            f.place(0x1000),
            Ok(Place::Function {
                start: 0x1000,
                end: 0x1020
            })
        );
        assert_eq!(
            f.place(0x1025),
            Ok(Place::Gap {
                after: Some(0x1020)
            })
        );
        assert_eq!(
            f.place(0x103f),
            Ok(Place::Function {
                start: 0x1030,
                end: 0x1040
            })
        );
        assert_eq!(
            f.place(0x1040),
            Ok(Place::Gap {
                after: Some(0x1040)
            })
        );
        assert_eq!(
            f.place(0x2000),
            Ok(Place::Gap {
                after: Some(0x1140)
            })
        );
        assert_eq!(
            f.all(),
            Ok(vec![(0x1000, 0x1020), (0x1030, 0x1040), (0x1100, 0x1140)])
        );
    }

    #[test]
    fn the_walk_and_the_search_table_agree() {
        let (frame, at) = eh_frame(0x5000, &FDES);
        let walked = Frames::new(&frame, 0x5000, None, LE);
        assert!(!walked.has_search_table());
        check_places(&walked);
        let rows: Vec<(u64, u64)> = FDES.iter().map(|f| f.0).zip(at).collect();
        let hdr = eh_frame_hdr(0x4000, 0x5000, &rows);
        let table = Frames::new(&frame, 0x5000, Some((&hdr, 0x4000)), LE);
        assert!(table.has_search_table());
        check_places(&table);
        // A table describing another .eh_frame is not used: the walk answers.
        let other = eh_frame_hdr(0x4000, 0x6000, &rows);
        let f = Frames::new(&frame, 0x5000, Some((&other, 0x4000)), LE);
        assert!(!f.has_search_table());
        check_places(&f);
    }

    #[test]
    fn overlapping_fdes_are_found_by_looking_back() {
        let (frame, _) = eh_frame(0x5000, &[(0x1000, 0x100), (0x1010, 0x10)]);
        let f = Frames::new(&frame, 0x5000, None, LE);
        assert_eq!(
            f.place(0x1050),
            Ok(Place::Function {
                start: 0x1000,
                end: 0x1100
            })
        );
    }

    /// Cut, lengthened, looped and random `.eh_frame` and `.eh_frame_hdr` bytes: errors
    /// or gaps, never a panic, and no more work than the bytes allow.
    #[test]
    fn hostile_tables_never_panic() {
        let (frame, at) = eh_frame(0x5000, &FDES);
        let rows: Vec<(u64, u64)> = FDES.iter().map(|f| f.0).zip(at.clone()).collect();
        let hdr = eh_frame_hdr(0x4000, 0x5000, &rows);
        let probe = |f: &Frames<'_>| {
            for a in [0, 0x1000, 0x1025, 0x1100, u64::MAX] {
                let _ = f.place(a);
            }
            let _ = f.all();
        };
        // Every truncation of either section.
        for n in 0..frame.len() {
            probe(&Frames::new(&frame[..n], 0x5000, None, LE));
            probe(&Frames::new(&frame[..n], 0x5000, Some((&hdr, 0x4000)), LE));
        }
        for n in 0..hdr.len() {
            probe(&Frames::new(&frame, 0x5000, Some((&hdr[..n], 0x4000)), LE));
        }
        // A huge entry length, a 64-bit length escape, a zero length (the terminator:
        // no FDE, so an error), an FDE whose CIE pointer points at itself or before the
        // section, a pc_range that wraps, a row count of u32::MAX.
        let mut huge = frame.clone();
        huge[0..4].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
        let mut escape = frame.clone();
        escape[0..4].copy_from_slice(&0xffff_ffffu32.to_le_bytes());
        let zero = vec![0u8; 16];
        let first_fde = (at[0] - 0x5000) as usize;
        let mut self_cie = frame.clone();
        self_cie[first_fde + 4..first_fde + 8].copy_from_slice(&0u32.to_le_bytes());
        let mut far_cie = frame.clone();
        far_cie[first_fde + 4..first_fde + 8].copy_from_slice(&0x7fff_0000u32.to_le_bytes());
        let mut wrap = frame.clone();
        wrap[first_fde + 12..first_fde + 16].copy_from_slice(&u32::MAX.to_le_bytes());
        for bad in [&huge, &escape, &zero, &self_cie, &far_cie, &wrap] {
            let f = Frames::new(bad, 0x5000, None, LE);
            probe(&f);
            assert!(f.all().is_err() || f.all().unwrap().len() < FDES.len());
            probe(&Frames::new(bad, 0x5000, Some((&hdr, 0x4000)), LE));
        }
        assert!(Frames::new(&zero, 0x5000, None, LE).place(0x1000).is_err());
        let mut many = hdr.clone();
        many[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        probe(&Frames::new(&frame, 0x5000, Some((&many, 0x4000)), LE));
        // A row count of 2^62 (udata8): row offsets would overflow if trusted.
        let mut huge_count = hdr[..8].to_vec();
        huge_count[2] = 0x04;
        huge_count.extend((1u64 << 62).to_le_bytes());
        huge_count.extend(&hdr[12..]);
        let f = Frames::new(&frame, 0x5000, Some((&huge_count, 0x4000)), LE);
        assert!(f.has_search_table());
        probe(&f);
        // A row pointing before .eh_frame, an unsorted table, an indirect encoding.
        let mut before = hdr.clone();
        before[16..20].copy_from_slice(&(-0x10_0000i32).to_le_bytes());
        let mut unsorted = hdr.clone();
        unsorted[12..16].copy_from_slice(&0x7fff_ffffi32.to_le_bytes());
        let mut indirect = hdr.clone();
        indirect[3] = 0x3b | 0x80;
        for bad in [&before, &unsorted, &indirect] {
            probe(&Frames::new(&frame, 0x5000, Some((bad, 0x4000)), LE));
        }
        assert!(Frames::new(&frame, 0x5000, Some((&before, 0x4000)), LE)
            .place(0x1000)
            .is_err());
        // Pseudo-random bytes, seeded: xorshift.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for len in [8usize, 64, 512, 4096] {
            for _ in 0..64 {
                let bytes: Vec<u8> = (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect();
                probe(&Frames::new(&bytes, 0x5000, None, LE));
                probe(&Frames::new(&frame, 0x5000, Some((&bytes, 0x4000)), LE));
                let mut h = bytes.clone();
                h[0] = 1;
                probe(&Frames::new(&frame, 0x5000, Some((&h, 0x4000)), LE));
            }
        }
    }
}
