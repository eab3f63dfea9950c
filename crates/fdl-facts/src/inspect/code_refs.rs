//! Whether a library's own code or data refers to a function's entry: what tells a call
//! bound at link time (`-Bsymbolic-functions`, `--dynamic-list`, protected visibility,
//! `-fno-semantic-interposition`, `-Bsymbolic`) from a function nothing in the library
//! calls, when no dynamic relocation names the function.
//!
//! A reference is one of:
//! - **code**: a PC-relative reference to the entry — on x86-64 any instruction whose
//!   last four bytes are a 32-bit displacement from its end (`call`/`jmp`/`jcc rel32`,
//!   `lea`/`mov` RIP-relative); on aarch64 `bl`/`b` imm26, `adr`, or `adrp` followed by
//!   `add` of the low 12 bits. Candidates are found by one arithmetic pass over the
//!   executable bytes (the x86-64 filter: `address + 4 + rel32 == entry` at each byte) and
//!   each is **confirmed** by decoding the function that holds it from that function's
//!   start, so that bytes that only look like a reference (inside another instruction,
//!   in data, in padding) are not taken for one;
//! - **data**: a RELATIVE (or IRELATIVE) relocation whose addend is the entry: its address
//!   is stored, and a call through it reaches this definition whatever is preloaded.
//!
//! Where a function starts comes first from the unwind tables ([`super::frames`]): an
//! FDE's range `[pc_begin, pc_begin + pc_range)` is exactly one function's code (or one
//! `.cold` part of it), and compilers give every function one on x86-64 and aarch64,
//! stripped or not. A candidate in an FDE's range is decoded from `pc_begin`, even where a
//! symbol covers it too (a symbol may start elsewhere: an alias inside the function, a
//! size that takes in padding). Outside every FDE, a function symbol of `.symtab` or
//! `.dynsym` covering it gives the start, as it did before fdl read FDEs.
//!
//! Covered by neither, the candidate lies in a gap between functions: alignment padding
//! (gas fills it with multi-byte NOPs, whose zero displacement before a 16-byte-aligned
//! entry reads as `rel32 == 0`, a "reference" to the next function: libnccl.so.2 has
//! several), or code without CFI — crtstuff's `frame_dummy` and friends, `_init`,
//! hand-written assembly. On x86-64 the gap is decoded from its start, the end of the
//! FDE below it (or the start of the executable section), which is an instruction
//! boundary: padding then decodes as the NOPs it is, and a real call from CFI-less code
//! is still found, so the candidate is confirmed or dismissed like one in a function.
//! What would defeat this is data in the gap (a literal pool in hand-written code): it
//! shows as undecodable bytes (unconfirmed), or could put decoding out of step — the same
//! assumption decoding a function from its symbol makes. Where the gap has no known
//! start (no FDE below it in a load segment read without section headers), and on
//! aarch64 (a word shaped like `bl` in a gap may be data; its padding is `nop` words,
//! never a candidate), the candidate stays unconfirmed. An object without `.eh_frame`
//! keeps the symbol rule alone.
//!
//! A candidate that cannot be confirmed (nothing gives its function's start, decoding
//! fails, a cap is reached) is reported as [`Reached::Unconfirmed`], never dropped: the
//! caller treats it as "perhaps called". All work is bounded by caps, whatever sizes the
//! file claims.

use super::frames::{Frames, Place};
use object::elf;
use std::collections::BTreeSet;

/// The most executable bytes scanned for candidates (libtorch_cuda_cpp.so of torch 1.13.1
/// has 6 MB of host code, libtorch_cpu.so of 2.x a few hundred MB): past it, the targets
/// not yet found are unconfirmed.
pub const MAX_SCAN: u64 = 1 << 30;
/// The most bytes decoded from one function's start to a candidate.
pub const MAX_DECODE_ONE: u64 = 4 << 20;
/// The most bytes decoded over all candidates of one file.
pub const MAX_DECODE_ALL: u64 = 64 << 20;
/// The most candidates confirmed per file (coincidences are rare: about one per 4 GiB of
/// code per target).
pub const MAX_CANDIDATES: usize = 4096;

/// The limits of one scan; [`Limits::default`] are the constants above.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub scan: u64,
    pub decode_one: u64,
    pub decode_all: u64,
    pub candidates: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            scan: MAX_SCAN,
            decode_one: MAX_DECODE_ONE,
            decode_all: MAX_DECODE_ALL,
            candidates: MAX_CANDIDATES,
        }
    }
}

/// What refers to one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reached {
    /// An instruction at `at` refers to the entry (a call, a jump, an address taken).
    Code { at: u64 },
    /// A RELATIVE relocation stores the entry's address.
    Data,
    /// Something may refer to it, but fdl could not confirm it: why.
    Unconfirmed(String),
    /// Nothing in the library refers to it.
    Nothing,
}

/// The executable bytes of a library and what is known about its functions.
pub struct Image<'a> {
    pub machine: u16,
    /// `(virtual address, bytes)` of each executable region.
    pub code: Vec<(u64, &'a [u8])>,
    /// `(start, size)` of the function symbols, any order.
    pub functions: Vec<(u64, u64)>,
    /// The addends of RELATIVE/IRELATIVE relocations that equal one of the targets.
    pub data_refs: BTreeSet<u64>,
    /// Why relative relocations could not all be read (e.g. a packed DT_RELR table), if so.
    pub data_unknown: Option<String>,
    /// The object's unwind tables, if it has any: where functions start and end.
    pub frames: Option<Frames<'a>>,
    /// Whether each region of `code` is an executable section, whose start is an
    /// instruction boundary (a load segment's start may be the ELF header).
    pub code_is_sections: bool,
}

/// For each of `targets` (function entries), what refers to it.
pub fn references(image: &Image<'_>, targets: &[u64], limits: Limits) -> Vec<Reached> {
    let mut out: Vec<Reached> = targets
        .iter()
        .map(|t| {
            if image.data_refs.contains(t) {
                Reached::Data
            } else {
                Reached::Nothing
            }
        })
        .collect();
    let open: Vec<(usize, u64)> = targets
        .iter()
        .enumerate()
        .filter(|(i, _)| out[*i] == Reached::Nothing)
        .map(|(i, &t)| (i, t))
        .collect();
    if open.is_empty() {
        return out;
    }
    let mut sorted: Vec<u64> = open.iter().map(|&(_, t)| t).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let functions = Functions::new(&image.functions);
    let bounds = Bounds {
        symbols: &functions,
        frames: image.frames.as_ref(),
        sections: image.code_is_sections,
    };
    let mut state = Scan {
        limits,
        decoded: 0,
        candidates: 0,
        found: Vec::new(),
        unconfirmed: Vec::new(),
        capped: None,
    };
    let mut scanned = 0u64;
    for &(base, bytes) in &image.code {
        let len = bytes.len() as u64;
        if scanned.saturating_add(len) > limits.scan {
            state.capped = Some(format!(
                "the library's code is larger than the {} MiB fdl scans for references",
                limits.scan >> 20
            ));
            break;
        }
        scanned += len;
        match image.machine {
            elf::EM_X86_64 => scan_x86_64(base, bytes, &sorted, &bounds, &mut state),
            elf::EM_AARCH64 => scan_aarch64(base, bytes, &sorted, &bounds, &mut state),
            _ => {
                state.capped = Some(format!(
                    "fdl does not read the code of ELF machine {}",
                    image.machine
                ));
                break;
            }
        }
        if state.capped.is_some() {
            break;
        }
    }
    for &(i, t) in &open {
        out[i] = if let Some(&(_, at)) = state.found.iter().find(|(x, _)| *x == t) {
            Reached::Code { at }
        } else if let Some((_, why)) = state.unconfirmed.iter().find(|(x, _)| *x == t) {
            Reached::Unconfirmed(why.clone())
        } else if let Some(why) = &state.capped {
            Reached::Unconfirmed(why.clone())
        } else if let Some(why) = &image.data_unknown {
            Reached::Unconfirmed(why.clone())
        } else {
            Reached::Nothing
        };
    }
    out
}

struct Scan {
    limits: Limits,
    decoded: u64,
    candidates: usize,
    /// (target, address of the confirming instruction)
    found: Vec<(u64, u64)>,
    /// (target, why a candidate could not be confirmed)
    unconfirmed: Vec<(u64, String)>,
    /// Set when a cap stops the scan.
    capped: Option<String>,
}

impl Scan {
    fn done(&self, t: u64) -> bool {
        self.found.iter().any(|(x, _)| *x == t)
    }

    fn unconfirmed(&mut self, t: u64, why: String) {
        if !self.unconfirmed.iter().any(|(x, _)| *x == t) {
            self.unconfirmed.push((t, why));
        }
    }

    /// Counts one candidate; false (and the scan capped) past the cap.
    fn take_candidate(&mut self) -> bool {
        self.candidates += 1;
        if self.candidates > self.limits.candidates {
            self.capped = Some(format!(
                "more than {} places in its code look like references to NCCL's entries",
                self.limits.candidates
            ));
            return false;
        }
        true
    }
}

/// Function ranges sorted by start, for "which function holds this address".
struct Functions {
    ranges: Vec<(u64, u64)>,
}

impl Functions {
    fn new(list: &[(u64, u64)]) -> Functions {
        let mut ranges: Vec<(u64, u64)> = list
            .iter()
            .filter(|&&(_, size)| size > 0)
            .map(|&(start, size)| (start, start.saturating_add(size)))
            .collect();
        ranges.sort_unstable();
        ranges.dedup();
        Functions { ranges }
    }

    /// The start and end of the function holding `addr`: among those starting at or
    /// before it, the nearest few are looked at (nested or aliased ranges).
    fn holding(&self, addr: u64) -> Option<(u64, u64)> {
        let n = self.ranges.partition_point(|&(s, _)| s <= addr);
        self.ranges[..n]
            .iter()
            .rev()
            .take(64)
            .find(|&&(_, end)| addr < end)
            .copied()
    }
}

/// What tells where the code holding an address starts: the FDEs, the function symbols.
struct Bounds<'f, 'a> {
    symbols: &'f Functions,
    frames: Option<&'f Frames<'a>>,
    sections: bool,
}

/// Where decoding toward a candidate starts.
enum Start {
    /// A function's (or function part's) `[start, end)`, from an FDE or a symbol.
    Function { start: u64, end: u64 },
    /// A gap no FDE or symbol covers, from its start: the end of the FDE below, or the
    /// start of the executable section.
    Gap { start: u64 },
    /// Nothing gives a start: why, for the message.
    Unknown(&'static str),
}

impl Bounds<'_, '_> {
    /// Where decoding toward `at`, in the region `[base, region_end)`, starts.
    fn start(&self, at: u64, base: u64) -> Start {
        let symbol = || {
            self.symbols
                .holding(at)
                .map(|(start, end)| Start::Function { start, end })
        };
        // Unreadable unwind tables count as none: the symbols alone answer.
        match self.frames.map(|f| f.place(at)) {
            Some(Ok(Place::Function { start, end })) => Start::Function { start, end },
            Some(Ok(Place::Gap { after })) => symbol().unwrap_or(match after {
                Some(end) if end >= base => Start::Gap { start: end },
                _ if self.sections => Start::Gap { start: base },
                _ => Start::Unknown("no function symbol or unwind entry (FDE) covers that place, and no FDE below it in its code gives an instruction boundary to decode from"),
            }),
            _ => symbol().unwrap_or(Start::Unknown(
                "no function symbol covers that place, so it cannot be decoded from a function's start",
            )),
        }
    }
}

fn scan_x86_64(base: u64, bytes: &[u8], targets: &[u64], f: &Bounds<'_, '_>, s: &mut Scan) {
    let (Some(&lo), Some(&hi)) = (targets.first(), targets.last()) else {
        return;
    };
    let span = hi - lo;
    for (i, w) in bytes.windows(4).enumerate() {
        let rel = i32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        let end = base.wrapping_add(i as u64 + 4);
        let t = end.wrapping_add(rel as i64 as u64);
        if t.wrapping_sub(lo) > span || targets.binary_search(&t).is_err() || s.done(t) {
            continue;
        }
        if !s.take_candidate() {
            return;
        }
        let at = base.wrapping_add(i as u64);
        confirm_x86_64(base, bytes, at, t, f, s);
    }
}

/// Decodes the code holding the candidate displacement at `at` from its start (a
/// function's, or a gap's) and looks for the instruction that holds it and refers to
/// `t`. No such instruction: the bytes are part of another one (an immediate, a NOP's
/// displacement), a coincidence, and nothing is recorded.
fn confirm_x86_64(base: u64, bytes: &[u8], at: u64, t: u64, f: &Bounds<'_, '_>, s: &mut Scan) {
    use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic};
    let region_end = base.saturating_add(bytes.len() as u64);
    let (start, end, what) = match f.start(at, base) {
        Start::Function { start, end } => (start, end, "the function holding it"),
        Start::Gap { start } => (start, region_end, "the gap between functions holding it"),
        Start::Unknown(why) => {
            s.unconfirmed(t, format!("code at {at:#x} may refer to it, but {why}"));
            return;
        }
    };
    if start < base || start > at || at - start > s.limits.decode_one {
        s.unconfirmed(
            t,
            format!("code at {at:#x} may refer to it, but {what} (at {start:#x}) starts outside the code or too far before it to decode"),
        );
        return;
    }
    // Up to the end of the instruction holding the displacement: at most 15 bytes past.
    let stop = end.min(at.saturating_add(16)).min(region_end);
    let (from, to) = ((start - base) as usize, (stop - base) as usize);
    let Some(window) = bytes.get(from..to) else {
        s.unconfirmed(
            t,
            format!(
                "code at {at:#x} may refer to it, but its function's bytes are not in the file"
            ),
        );
        return;
    };
    s.decoded = s.decoded.saturating_add(window.len() as u64);
    if s.decoded > s.limits.decode_all {
        s.capped = Some(format!(
            "confirming references would decode more than {} MiB of its code",
            s.limits.decode_all >> 20
        ));
        return;
    }
    let mut d = Decoder::with_ip(64, window, start, DecoderOptions::NONE);
    let mut ins = Instruction::default();
    while d.can_decode() {
        d.decode_out(&mut ins);
        let ip = ins.ip();
        if ins.is_invalid() {
            s.unconfirmed(
                t,
                format!("code at {at:#x} may refer to it, but {what} (at {start:#x}) does not decode at {ip:#x}"),
            );
            return;
        }
        let next = ip.wrapping_add(ins.len() as u64);
        if ip <= at && at < next {
            // A NOP's memory operand is never accessed (`nopl 0x0(%rip)` refers to
            // nothing).
            let refers = ins.mnemonic() != Mnemonic::Nop
                && (ins.near_branch_target() == t
                    || (ins.is_ip_rel_memory_operand() && ins.ip_rel_memory_address() == t));
            if refers {
                s.found.push((t, ip));
            }
            // Otherwise the bytes are part of another instruction: a coincidence.
            return;
        }
        if ip > at {
            return;
        }
    }
}

fn scan_aarch64(base: u64, bytes: &[u8], targets: &[u64], f: &Bounds<'_, '_>, s: &mut Scan) {
    let word = |i: usize| -> Option<u32> {
        let b = bytes.get(i..i + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    // Instructions are 4-byte aligned in the address space.
    let skew = ((4 - (base % 4)) % 4) as usize;
    let mut i = skew;
    while let Some(w) = word(i) {
        let pc = base.wrapping_add(i as u64);
        let t = aarch64_target(pc, w, word(i + 4));
        i += 4;
        let Some(t) = t else { continue };
        if targets.binary_search(&t).is_err() || s.done(t) {
            continue;
        }
        if !s.take_candidate() {
            return;
        }
        // Fixed-width: the instruction is the word; what needs confirming is that a
        // function holds it, aligned from that function's start (not data in the code).
        match f.start(pc, base) {
            Start::Function { start, .. } if (pc - start).is_multiple_of(4) => s.found.push((t, pc)),
            Start::Function { start, .. } => s.unconfirmed(
                t,
                format!("code at {pc:#x} may refer to it, but it is not aligned from its function's start ({start:#x})"),
            ),
            // A branch-shaped word between functions: code without CFI, or data.
            Start::Gap { .. } => s.unconfirmed(
                t,
                format!("code at {pc:#x} may refer to it, but no function symbol or unwind entry (FDE) covers that place, so it may be data between functions"),
            ),
            Start::Unknown(why) => s.unconfirmed(
                t,
                format!("code at {pc:#x} may refer to it, but {why}"),
            ),
        }
    }
}

/// The address an aarch64 instruction at `pc` refers to: `b`/`bl` imm26, `adr`, or `adrp`
/// whose next instruction adds the low 12 bits to the same register.
pub(crate) fn aarch64_target(pc: u64, w: u32, next: Option<u32>) -> Option<u64> {
    let sext = |v: u64, bits: u32| -> i64 { ((v << (64 - bits)) as i64) >> (64 - bits) };
    if w & 0x7C00_0000 == 0x1400_0000 {
        // b (0x14) or bl (0x94): imm26 words.
        let off = sext(u64::from(w & 0x03FF_FFFF), 26) << 2;
        return Some(pc.wrapping_add(off as u64));
    }
    let imm21 = || u64::from((w >> 29) & 3) | (u64::from((w >> 5) & 0x7_FFFF) << 2);
    if w & 0x9F00_0000 == 0x1000_0000 {
        // adr
        return Some(pc.wrapping_add(sext(imm21(), 21) as u64));
    }
    if w & 0x9F00_0000 == 0x9000_0000 {
        // adrp, then add Xd, Xn, #imm12 (64-bit, no shift) with Xn = adrp's Xd
        let page = (pc & !0xFFF).wrapping_add((sext(imm21(), 21) << 12) as u64);
        let n = next?;
        let rd = w & 0x1F;
        if n & 0xFFC0_0000 == 0x9100_0000 && (n >> 5) & 0x1F == rd {
            return Some(page.wrapping_add(u64::from((n >> 10) & 0xFFF)));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image<'a>(
        machine: u16,
        code: Vec<(u64, &'a [u8])>,
        functions: Vec<(u64, u64)>,
    ) -> Image<'a> {
        Image {
            machine,
            code,
            functions,
            data_refs: BTreeSet::new(),
            data_unknown: None,
            frames: None,
            code_is_sections: true,
        }
    }

    /// `push rbp; call T; lea rax,[rip+T]; ret` at 0x1000, T = 0x2000.
    fn x86_code() -> Vec<u8> {
        let mut c = vec![0x55];
        // call rel32 at 0x1001: end 0x1006, rel = 0x2000 - 0x1006
        c.push(0xE8);
        c.extend((0x2000i32 - 0x1006).to_le_bytes());
        // lea rax,[rip+d] at 0x1006: 48 8D 05 d32, end 0x100d
        c.extend([0x48, 0x8D, 0x05]);
        c.extend((0x3000i32 - 0x100d).to_le_bytes());
        c.push(0xC3);
        c
    }

    #[test]
    fn x86_calls_and_address_loads_are_found_and_confirmed() {
        let code = x86_code();
        let img = image(
            elf::EM_X86_64,
            vec![(0x1000, &code)],
            vec![(0x1000, code.len() as u64)],
        );
        let got = references(&img, &[0x2000, 0x3000, 0x4000], Limits::default());
        assert_eq!(got[0], Reached::Code { at: 0x1001 });
        assert_eq!(got[1], Reached::Code { at: 0x1006 });
        assert_eq!(got[2], Reached::Nothing);
    }

    #[test]
    fn a_lookalike_inside_another_instruction_is_not_a_reference() {
        // mov eax, imm32 whose immediate bytes happen to be `E8 xx xx xx`-like: the
        // displacement at offset 1 points at the target, but decoding from the
        // function's start shows it is an immediate.
        let target = 0x1000u64 + 5 + 0x10;
        let mut code = vec![0xB8]; // mov eax, imm32 (bytes 1..5)
        code.extend(((target - (0x1000 + 5)) as i32).to_le_bytes());
        code.push(0xC3);
        let img = image(
            elf::EM_X86_64,
            vec![(0x1000, &code)],
            vec![(0x1000, code.len() as u64)],
        );
        assert_eq!(
            references(&img, &[target], Limits::default()),
            [Reached::Nothing]
        );
    }

    #[test]
    fn a_candidate_no_function_covers_is_unconfirmed_not_dropped() {
        let code = x86_code();
        let img = image(elf::EM_X86_64, vec![(0x1000, &code)], vec![]);
        let got = references(&img, &[0x2000], Limits::default());
        assert!(
            matches!(&got[0], Reached::Unconfirmed(w) if w.contains("no function symbol")),
            "{got:?}"
        );
    }

    #[test]
    fn data_references_and_packed_relocations() {
        let code = [0xC3u8];
        let mut img = image(elf::EM_X86_64, vec![(0x1000, &code)], vec![(0x1000, 1)]);
        img.data_refs.insert(0x2000);
        let got = references(&img, &[0x2000, 0x3000], Limits::default());
        assert_eq!(got, [Reached::Data, Reached::Nothing]);
        img.data_unknown = Some("packed".into());
        let got = references(&img, &[0x2000, 0x3000], Limits::default());
        assert_eq!(got, [Reached::Data, Reached::Unconfirmed("packed".into())]);
    }

    #[test]
    fn hostile_sizes_and_truncated_code_neither_panic_nor_run_long() {
        let code = x86_code();
        // A function claiming to reach past the end of everything, one starting before
        // the code, one of size u64::MAX at 0: decoding is clipped to the bytes there.
        for functions in [
            vec![(0x1000, u64::MAX)],
            vec![(0, u64::MAX)],
            vec![(u64::MAX, u64::MAX)],
            vec![(0x1000, 3)],
        ] {
            let img = image(elf::EM_X86_64, vec![(0x1000, &code)], functions.clone());
            let got = references(&img, &[0x2000], Limits::default());
            assert_eq!(got.len(), 1, "{functions:?}");
        }
        // Truncated: the call's displacement cut short is no candidate at all.
        let img = image(
            elf::EM_X86_64,
            vec![(0x1000, &code[..3])],
            vec![(0x1000, 100)],
        );
        assert_eq!(
            references(&img, &[0x2000], Limits::default()),
            [Reached::Nothing]
        );
        // Regions at the top of the address space wrap without panicking.
        let img = image(
            elf::EM_X86_64,
            vec![(u64::MAX - 2, &code)],
            vec![(u64::MAX - 2, 9)],
        );
        let _ = references(&img, &[0x2000, u64::MAX], Limits::default());
        let img = image(
            elf::EM_AARCH64,
            vec![(u64::MAX - 2, &code)],
            vec![(u64::MAX - 2, 9)],
        );
        let _ = references(&img, &[0x2000, u64::MAX], Limits::default());
        // An empty target list, empty code.
        assert!(references(&img, &[], Limits::default()).is_empty());
        let img = image(elf::EM_X86_64, vec![(0, &[])], vec![]);
        assert_eq!(
            references(&img, &[1], Limits::default()),
            [Reached::Nothing]
        );
    }

    #[test]
    fn caps_make_the_answer_unconfirmed() {
        let code = x86_code();
        let img = image(
            elf::EM_X86_64,
            vec![(0x1000, &code)],
            vec![(0x1000, code.len() as u64)],
        );
        let small = Limits {
            scan: 4,
            ..Limits::default()
        };
        assert!(
            matches!(&references(&img, &[0x4000], small)[0], Reached::Unconfirmed(w) if w.contains("MiB"))
        );
        let none = Limits {
            candidates: 0,
            ..Limits::default()
        };
        assert!(
            matches!(&references(&img, &[0x2000], none)[0], Reached::Unconfirmed(w) if w.contains("look like"))
        );
        let no_decode = Limits {
            decode_all: 0,
            ..Limits::default()
        };
        assert!(
            matches!(&references(&img, &[0x2000], no_decode)[0], Reached::Unconfirmed(w) if w.contains("decode"))
        );
        let img = image(elf::EM_PPC64, vec![(0x1000, &code)], vec![]);
        assert!(matches!(
            &references(&img, &[0x2000], Limits::default())[0],
            Reached::Unconfirmed(_)
        ));
    }

    #[test]
    fn undecodable_functions_leave_candidates_unconfirmed() {
        // 0x06 is invalid in 64-bit mode; the call follows it.
        let mut code = vec![0x06];
        code.push(0xE8);
        code.extend((0x2000i32 - 0x1006).to_le_bytes());
        let img = image(
            elf::EM_X86_64,
            vec![(0x1000, &code)],
            vec![(0x1000, code.len() as u64)],
        );
        let got = references(&img, &[0x2000], Limits::default());
        assert!(
            matches!(&got[0], Reached::Unconfirmed(w) if w.contains("does not decode")),
            "{got:?}"
        );
    }

    /// An image whose unwind tables hold one FDE per `(start, len)`.
    fn with_fdes<'a>(
        machine: u16,
        code: Vec<(u64, &'a [u8])>,
        frame: &'a [u8],
        sections: bool,
    ) -> Image<'a> {
        Image {
            frames: Some(Frames::new(
                frame,
                0x8000,
                None,
                gimli::RunTimeEndian::Little,
            )),
            code_is_sections: sections,
            ..image(machine, code, vec![])
        }
    }

    #[test]
    fn an_fde_gives_the_start_where_no_symbol_does() {
        let code = x86_code();
        let (frame, _) = crate::inspect::frames::synth::eh_frame(0x8000, &[(0x1000, 14)]);
        let img = with_fdes(elf::EM_X86_64, vec![(0x1000, &code)], &frame, true);
        let got = references(&img, &[0x2000, 0x3000], Limits::default());
        assert_eq!(
            got,
            [Reached::Code { at: 0x1001 }, Reached::Code { at: 0x1006 }]
        );

        // The lookalike inside `mov eax, imm32`, and a NOP whose RIP-relative operand
        // names the target (never accessed): no reference.
        let target = 0x1000u64 + 5 + 0x10;
        let mut code = vec![0xB8];
        code.extend(((target - (0x1000 + 5)) as i32).to_le_bytes());
        code.extend([0x0F, 0x1F, 0x05]); // nopl [rip+d] at 0x1005, end 0x100c
        code.extend(((target - 0x100c) as i32).to_le_bytes());
        code.push(0xC3);
        let (frame, _) = crate::inspect::frames::synth::eh_frame(0x8000, &[(0x1000, 13)]);
        let img = with_fdes(elf::EM_X86_64, vec![(0x1000, &code)], &frame, true);
        assert_eq!(
            references(&img, &[target], Limits::default()),
            [Reached::Nothing]
        );

        // A symbol starting inside the instruction (an alias, a wrong size) is
        // overruled by the FDE: decoded from the symbol, the immediate's bytes would be
        // read as instructions.
        let img = Image {
            functions: vec![(0x1001, 12)],
            ..with_fdes(elf::EM_X86_64, vec![(0x1000, &code)], &frame, true)
        };
        assert_eq!(
            references(&img, &[target], Limits::default()),
            [Reached::Nothing]
        );
    }

    /// `ret` (an FDE), then the padding gas writes before an aligned entry, then the
    /// entry (another FDE): the padding's zero displacement is a `rel32 == 0` lookalike.
    fn padded() -> Vec<u8> {
        let mut code = vec![0xC3];
        code.extend([0x0F, 0x1F, 0x80, 0, 0, 0, 0]); // nopl 0x0(%rax), 0x1001..0x1008
        code.push(0xC3); // the entry, 0x1008
        code
    }

    #[test]
    fn padding_between_fdes_is_no_reference() {
        let code = padded();
        let (frame, _) =
            crate::inspect::frames::synth::eh_frame(0x8000, &[(0x1000, 1), (0x1008, 1)]);
        for sections in [true, false] {
            let img = with_fdes(elf::EM_X86_64, vec![(0x1000, &code)], &frame, sections);
            assert_eq!(
                references(&img, &[0x1008], Limits::default()),
                [Reached::Nothing],
                "{sections}"
            );
        }
        // Without unwind tables, as before: nothing gives a start.
        let img = image(elf::EM_X86_64, vec![(0x1000, &code)], vec![]);
        assert!(matches!(
            &references(&img, &[0x1008], Limits::default())[0],
            Reached::Unconfirmed(w) if w.contains("no function symbol covers")
        ));
        // Unreadable unwind tables count as none.
        let img = with_fdes(elf::EM_X86_64, vec![(0x1000, &code)], &[0xff; 64], true);
        assert!(matches!(
            &references(&img, &[0x1008], Limits::default())[0],
            Reached::Unconfirmed(w) if w.contains("no function symbol covers")
        ));
    }

    #[test]
    fn code_without_cfi_is_decoded_from_the_gaps_start() {
        // `ret` (an FDE), then CFI-less `call 0x2000; ret` at 0x1001.
        let mut code = vec![0xC3, 0xE8];
        code.extend((0x2000i32 - 0x1006).to_le_bytes());
        code.push(0xC3);
        let (frame, _) = crate::inspect::frames::synth::eh_frame(0x8000, &[(0x1000, 1)]);
        let img = with_fdes(elf::EM_X86_64, vec![(0x1000, &code)], &frame, true);
        assert_eq!(
            references(&img, &[0x2000], Limits::default()),
            [Reached::Code { at: 0x1001 }]
        );
        // No FDE below it: from the section's start, which is an instruction boundary;
        // a load segment's start (the ELF header, perhaps) is not.
        let (frame, _) = crate::inspect::frames::synth::eh_frame(0x8000, &[(0x3000, 1)]);
        let code = &code[1..];
        let img = with_fdes(elf::EM_X86_64, vec![(0x1001, code)], &frame, true);
        assert_eq!(
            references(&img, &[0x2000], Limits::default()),
            [Reached::Code { at: 0x1001 }]
        );
        let img = with_fdes(elf::EM_X86_64, vec![(0x1001, code)], &frame, false);
        assert!(matches!(
            &references(&img, &[0x2000], Limits::default())[0],
            Reached::Unconfirmed(w) if w.contains("instruction boundary")
        ));
        // A gap too long to decode, by the per-candidate cap.
        let short = Limits {
            decode_one: 0,
            ..Limits::default()
        };
        let mut late = vec![0x90];
        late.extend_from_slice(code);
        let img = with_fdes(elf::EM_X86_64, vec![(0x1000, &late)], &frame, true);
        assert!(matches!(
            &references(&img, &[0x2000], short)[0],
            Reached::Unconfirmed(w) if w.contains("gap")
        ));
    }

    #[test]
    fn aarch64_words_in_an_fde_are_code_and_between_fdes_perhaps_data() {
        let mut code = Vec::new();
        code.extend(0xD503_201Fu32.to_le_bytes()); // nop
        code.extend(0x9400_0040u32.to_le_bytes()); // bl pc+0x100 at 0x1004 → 0x1104
        let (frame, _) = crate::inspect::frames::synth::eh_frame(0x8000, &[(0x1000, 8)]);
        let img = with_fdes(elf::EM_AARCH64, vec![(0x1000, &code)], &frame, true);
        assert_eq!(
            references(&img, &[0x1104], Limits::default()),
            [Reached::Code { at: 0x1004 }]
        );
        let (frame, _) = crate::inspect::frames::synth::eh_frame(0x8000, &[(0x1000, 4)]);
        let img = with_fdes(elf::EM_AARCH64, vec![(0x1000, &code)], &frame, true);
        assert!(matches!(
            &references(&img, &[0x1104], Limits::default())[0],
            Reached::Unconfirmed(w) if w.contains("data")
        ));
    }

    #[test]
    fn aarch64_branches_and_address_forms() {
        let pc = 0x10_0000u64;
        // bl +0x100, b -0x8
        assert_eq!(aarch64_target(pc, 0x9400_0040, None), Some(pc + 0x100));
        assert_eq!(aarch64_target(pc, 0x17FF_FFFE, None), Some(pc - 8));
        // adrp x1, +1 page; add x1, x1, #0x123
        let adrp = 0x9000_0001 | (1 << 29); // immlo = 1 → one page
        let add = 0x9100_0000 | (0x123 << 10) | (1 << 5) | 1;
        assert_eq!(aarch64_target(pc, adrp, Some(add)), Some(0x10_1123));
        // add of another register, or nothing after: no reference.
        let add_other = 0x9100_0000 | (0x123 << 10) | (2 << 5) | 1;
        assert_eq!(aarch64_target(pc, adrp, Some(add_other)), None);
        assert_eq!(aarch64_target(pc, adrp, None), None);
        // adr x0, +0x10
        assert_eq!(aarch64_target(pc, 0x1000_0080, None), Some(pc + 0x10));
        // ret: nothing
        assert_eq!(aarch64_target(pc, 0xD65F_03C0, None), None);

        let mut code = Vec::new();
        code.extend(0xD503_201Fu32.to_le_bytes()); // nop
        code.extend(0x9400_0040u32.to_le_bytes()); // bl pc+0x100 at 0x1004 → 0x1104
        let img = image(elf::EM_AARCH64, vec![(0x1000, &code)], vec![(0x1000, 8)]);
        let got = references(&img, &[0x1104, 0x2000], Limits::default());
        assert_eq!(got, [Reached::Code { at: 0x1004 }, Reached::Nothing]);
        let img = image(elf::EM_AARCH64, vec![(0x1000, &code)], vec![]);
        assert!(matches!(
            &references(&img, &[0x1104], Limits::default())[0],
            Reached::Unconfirmed(_)
        ));
    }
}
