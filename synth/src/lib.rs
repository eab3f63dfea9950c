//! Synthetic ELF shared objects shaped like `libtorch_cuda.so`, for tests, fuzz seeds and
//! benchmarks: a `.rodata` with string constants (optionally NCCL's self-id and the
//! version-floor messages PyTorch carries), a `.dynamic` with SONAME/NEEDED/RPATH/RUNPATH
//! and a `.nv_fatbin` of containers with SASS and PTX entries.
//!
//! Files are streamed: every size is computed up front and the bytes are written in
//! order, so multi-GB files never sit in memory. Cubin payloads start with a real cubin
//! ELF header (the arch in `e_flags`, as nvcc writes it) and compressed entries hold a
//! valid LZ4 block, so `readelf` and `cuobjdump --list-elf/--list-ptx` read the output.

pub mod dso;

use anyhow::{Context, Result};
use fdl::arch::{GpuTarget, Variant};
use std::io::{self, Write};
use std::path::Path;

// The fatbin format as this writer knows it, written down here rather than taken from
// fdl's reader, so that a mistake in one is not silently shared by the other. The
// community's reverse-engineered layout; cuobjdump reading what this crate writes is the
// check (`tests/it/inspect_oracle.rs`).
const MAGIC: u32 = 0xBA55_ED50;
const KIND_PTX: u16 = 1;
const KIND_ELF: u16 = 2;
const FLAG_64BIT: u64 = 0x1;
const FLAG_LINUX: u64 = 0x10;
const FLAG_COMPRESS_LZ4: u64 = 0x2000;
const FLAG_ARCH_SPECIFIC: u64 = 0x10_0000;
const FLAG_FAMILY: u64 = 0x20_0000;

/// What an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sass,
    Ptx,
}

/// One fatbin entry to synthesize.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    pub target: GpuTarget,
    /// Stored as an LZ4 block (flag 0x2000) instead of plain.
    pub compressed: bool,
    /// Size of the (uncompressed) cubin or PTX text; at least a header's worth is used.
    pub payload_size: u64,
}

/// The file to synthesize.
#[derive(Debug, Clone, Default)]
pub struct Spec {
    pub soname: Option<String>,
    pub needed: Vec<String>,
    pub rpath: Option<String>,
    pub runpath: Option<String>,
    /// Extra NUL-terminated strings at the start of `.rodata`.
    pub strings: Vec<String>,
    /// `"2.27.5+cuda12.9"` writes NCCL's self-id `NCCL version 2.27.5+cuda12.9`, placed
    /// at the very end of `.rodata` so a scan must cover all of it.
    pub self_id: Option<String>,
    /// Adds the "requires NCCL version X or later" style messages that must not count.
    pub floor_messages: bool,
    /// Filler bytes in `.rodata` (text without the NCCL needle), for large files.
    pub rodata_padding: u64,
    pub entries: Vec<Entry>,
    /// Entries per fatbin container (nvcc writes one container per translation unit);
    /// 0 puts all entries in one container.
    pub entries_per_container: usize,
}

impl Spec {
    /// A libtorch_cuda-like library: `copies` containers, each with one SASS entry per
    /// target in `sass` and one PTX entry per target in `ptx`, all `payload_size` bytes.
    pub fn torch_like(
        sass: &[GpuTarget],
        ptx: &[GpuTarget],
        copies: usize,
        payload_size: u64,
        compressed: bool,
    ) -> Spec {
        let mut entries = Vec::new();
        for _ in 0..copies {
            for &target in sass {
                entries.push(Entry {
                    kind: Kind::Sass,
                    target,
                    compressed,
                    payload_size,
                });
            }
            for &target in ptx {
                entries.push(Entry {
                    kind: Kind::Ptx,
                    target,
                    compressed,
                    payload_size,
                });
            }
        }
        Spec {
            soname: Some("libtorch_cuda.so".into()),
            needed: vec!["libc10_cuda.so".into(), "libcudart.so.12".into()],
            strings: vec!["CUDA error: %s".into(), "c10::cuda".into()],
            entries_per_container: sass.len() + ptx.len(),
            entries,
            ..Spec::default()
        }
    }
}

const FLOOR_MESSAGES: &[&str] = &[
    "ProcessGroupNCCL requires NCCL version 2.27.0 or later",
    "NCCL version %d.%d.%d",
    "NCCL version 2.4.2 or newer is required for this feature",
];
const FILLER: &[u8] = b"c10 cuda kernel launch failed; tensor shape mismatch at dim \
    %d; cublas handle; cudnn workspace; torch.distributed backend; ";
/// A cubin's minimal valid prefix: ELF header, `.shstrtab` and two section headers
/// (cuobjdump rejects a cubin without a section table).
const CUBIN_HEADER: u64 = 208;
const ENTRY_HEADER: u64 = 64;
const CHUNK: usize = 64 * 1024;

fn align(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// How compressed entries are shaped. nvcc's LZ4 blocks (PyTorch builds with
/// `-Xfatbin -compress-all`) open with a short literal run and expand several-fold: torch
/// 2.8.0's `libtorch_cuda.so` stores 0.91 GB that decompress to 5.17 GB (5.7×), NCCL
/// 2.27.5's `libnccl.so.2` 3.2×, and both start every block with a 10-byte literal run.
/// A block here is the prologue plus [`LZ4_LITERALS`] filler bytes, then pairs of a
/// [`LZ4_MATCH`]-byte match at offset 1 and [`LZ4_LITERALS`] more literals, then at least
/// [`LZ4_TAIL`] literals (LZ4 ends every block with literals, the last match 12 bytes or
/// more before the end). It decodes to exactly the bytes of the plain entry, and costs a
/// reader that decompresses (cuobjdump) what a real block of that size costs it.
pub const LZ4_LITERALS: u64 = 64;
/// Chosen so that a middle sequence (70 stored bytes for 399 decoded) expands 5.7×.
pub const LZ4_MATCH: u64 = 335;
pub const LZ4_TAIL: u64 = 16;
/// Decoded bytes per stored byte of a long synthesized block.
pub const LZ4_EXPANSION: f64 =
    (LZ4_LITERALS + LZ4_MATCH) as f64 / lz4_sequence_len(LZ4_LITERALS, LZ4_MATCH) as f64;

/// Extra length bytes LZ4 spends on a count of `x` after the token's 4 bits.
const fn lz4_len_bytes(x: u64) -> u64 {
    if x < 15 {
        0
    } else {
        (x - 15) / 255 + 1
    }
}

/// Stored bytes of one sequence: token, literal length, literals, and for a match its
/// offset and length (`matched` 0: the final, literal-only sequence).
const fn lz4_sequence_len(literals: u64, matched: u64) -> u64 {
    let m = if matched == 0 {
        0
    } else {
        2 + lz4_len_bytes(matched - 4)
    };
    1 + lz4_len_bytes(literals) + literals + m
}

/// The sequences of a block of `n` decoded bytes whose first `prologue` bytes are the
/// prologue: `Some((matches, last literals))`, or `None` when too short for one match
/// (then the block is literals only).
fn lz4_shape(n: u64, prologue: u64) -> Option<(u64, u64)> {
    let body = n.checked_sub(prologue + LZ4_TAIL)?;
    let matches = body / (LZ4_LITERALS + LZ4_MATCH);
    (matches > 0).then(|| (matches, n - prologue - matches * (LZ4_LITERALS + LZ4_MATCH)))
}

/// Stored bytes of the LZ4 block for `n` decoded bytes (see [`LZ4_EXPANSION`]).
fn lz4_block_len(n: u64, prologue: u64) -> u64 {
    match lz4_shape(n, prologue) {
        None => lz4_sequence_len(n, 0),
        Some((matches, last)) => {
            lz4_sequence_len(prologue + LZ4_LITERALS, LZ4_MATCH)
                + (matches - 1) * lz4_sequence_len(LZ4_LITERALS, LZ4_MATCH)
                + lz4_sequence_len(last, 0)
        }
    }
}

impl Entry {
    fn prologue_len(&self) -> u64 {
        match self.kind {
            Kind::Sass => CUBIN_HEADER,
            Kind::Ptx => ptx_prologue(self.target).len() as u64,
        }
    }

    fn content_len(&self) -> u64 {
        // PTX text ends with a NUL after its prologue.
        self.payload_size
            .max(self.prologue_len() + u64::from(self.kind == Kind::Ptx))
    }

    /// Bytes the payload takes in the file (the LZ4 block when compressed), before the
    /// padding to 8.
    fn stored_len(&self) -> u64 {
        let n = self.content_len();
        if self.compressed {
            lz4_block_len(n, self.prologue_len())
        } else {
            n
        }
    }

    fn padded_len(&self) -> u64 {
        align(self.stored_len(), 8)
    }

    /// PTX entries carry a 16-byte extension (an empty ptxas-options block, pointed to
    /// from offset 20); cuobjdump rejects PTX entries without it.
    fn header_len(&self) -> u64 {
        match self.kind {
            Kind::Sass => ENTRY_HEADER,
            Kind::Ptx => ENTRY_HEADER + 16,
        }
    }

    fn header(&self) -> Vec<u8> {
        let mut h = vec![0u8; self.header_len() as usize];
        let (kind, minor, major) = match self.kind {
            Kind::Sass => (KIND_ELF, 8u16, 1u16),
            Kind::Ptx => (KIND_PTX, 8, 8),
        };
        let mut flags = FLAG_64BIT | FLAG_LINUX;
        if self.compressed {
            flags |= FLAG_COMPRESS_LZ4;
        }
        flags |= match self.target.variant {
            Variant::Generic => 0,
            Variant::Specific => FLAG_ARCH_SPECIFIC,
            Variant::Family => FLAG_FAMILY,
        };
        h[0..2].copy_from_slice(&kind.to_le_bytes());
        h[2..4].copy_from_slice(&0x0101u16.to_le_bytes());
        h[4..8].copy_from_slice(&(self.header_len() as u32).to_le_bytes());
        h[8..16].copy_from_slice(&self.padded_len().to_le_bytes());
        if self.compressed {
            h[16..20].copy_from_slice(&(self.stored_len() as u32).to_le_bytes());
            h[56..64].copy_from_slice(&self.content_len().to_le_bytes());
        }
        h[24..26].copy_from_slice(&minor.to_le_bytes());
        h[26..28].copy_from_slice(&major.to_le_bytes());
        h[28..32].copy_from_slice(&self.target.arch.number().to_le_bytes());
        h[40..48].copy_from_slice(&flags.to_le_bytes());
        if self.kind == Kind::Ptx {
            h[20..24].copy_from_slice(&0x40u32.to_le_bytes());
            h[64..68].copy_from_slice(&0x48u32.to_le_bytes()); // options at 72, 0 bytes
        }
        h
    }

    /// The first bytes of the content: a cubin ELF header, or the PTX prologue.
    fn prologue(&self) -> Vec<u8> {
        match self.kind {
            Kind::Sass => cubin_header(self.target).to_vec(),
            Kind::Ptx => ptx_prologue(self.target).into_bytes(),
        }
    }
}

/// A cubin ELF header in the CUDA 12.8+ layout (ELF ABI version 8): SM in bits 8..24 of
/// `e_flags`, 0x8 for `a` targets, as cuobjdump reads them.
fn cubin_header(t: GpuTarget) -> [u8; CUBIN_HEADER as usize] {
    let mut h = [0u8; CUBIN_HEADER as usize];
    h[..4].copy_from_slice(b"\x7fELF");
    h[4] = 2; // ELFCLASS64
    h[5] = 1; // little-endian
    h[6] = 1; // EV_CURRENT
    h[7] = 0x41; // CUDA OSABI of the new layout
    h[8] = 8; // ABI version 8
    h[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    h[18..20].copy_from_slice(&190u16.to_le_bytes()); // EM_CUDA
    h[20..24].copy_from_slice(&1u32.to_le_bytes());
    let specific = if t.variant == Variant::Specific {
        0x8
    } else {
        0
    };
    let e_flags: u32 = 0x0600_0000 | (t.arch.number() << 8) | 0x2 | specific;
    h[48..52].copy_from_slice(&e_flags.to_le_bytes());
    h[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
    h[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
    h[40..48].copy_from_slice(&80u64.to_le_bytes()); // e_shoff
    h[58..60].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
    h[60..62].copy_from_slice(&2u16.to_le_bytes()); // e_shnum
    h[62..64].copy_from_slice(&1u16.to_le_bytes()); // e_shstrndx
    h[64..75].copy_from_slice(b"\0.shstrtab\0");
    // Section 0 is all zeros (80..144); section 1 is .shstrtab (144..208).
    h[144..148].copy_from_slice(&1u32.to_le_bytes()); // sh_name
    h[148..152].copy_from_slice(&3u32.to_le_bytes()); // SHT_STRTAB
    h[168..176].copy_from_slice(&64u64.to_le_bytes()); // sh_offset
    h[176..184].copy_from_slice(&11u64.to_le_bytes()); // sh_size
    h[192..200].copy_from_slice(&1u64.to_le_bytes()); // sh_addralign
    h
}

fn ptx_prologue(t: GpuTarget) -> String {
    let suffix = match t.variant {
        Variant::Generic => "",
        Variant::Specific => "a",
        Variant::Family => "f",
    };
    format!(
        "//\n// Synthesized by fdl for tests\n//\n\n.version 8.8\n.target sm_{}{}\n.address_size 64\n\n",
        t.arch.number(),
        suffix
    )
}

/// An entry's decoded bytes: the prologue, then filler, and for PTX a final NUL.
struct Content<'a> {
    prologue: &'a [u8],
    len: u64,
    fill: u8,
    nul_end: bool,
}

impl Content<'_> {
    /// Writes the decoded bytes `[from, to)`.
    fn write_range(&self, w: &mut impl Write, from: u64, to: u64) -> io::Result<()> {
        let head_end = (self.prologue.len() as u64).min(to);
        if from < head_end {
            w.write_all(&self.prologue[from as usize..head_end as usize])?;
        }
        let nul_at = if self.nul_end { self.len - 1 } else { self.len };
        let mut at = from.max(head_end);
        let buf = [self.fill; CHUNK];
        while at < to.min(nul_at) {
            let k = (to.min(nul_at) - at).min(CHUNK as u64) as usize;
            w.write_all(&buf[..k])?;
            at += k as u64;
        }
        if at < to {
            w.write_all(&[0])?; // the NUL
        }
        Ok(())
    }

    /// Writes the bytes stored plain.
    fn write_plain(&self, w: &mut impl Write) -> io::Result<()> {
        self.write_range(w, 0, self.len)
    }

    /// Writes the LZ4 block that decodes to these bytes (shaped as [`LZ4_EXPANSION`]
    /// describes; [`lz4_block_len`] is its length).
    fn write_lz4(&self, w: &mut impl Write) -> io::Result<()> {
        let p = self.prologue.len() as u64;
        let Some((matches, last)) = lz4_shape(self.len, p) else {
            return self.write_sequence(w, 0, self.len, 0);
        };
        let mut at = 0;
        for k in 0..matches {
            let literals = if k == 0 {
                p + LZ4_LITERALS
            } else {
                LZ4_LITERALS
            };
            // Offset 1 repeats the literal just written, a filler byte.
            self.write_sequence(w, at, literals, LZ4_MATCH)?;
            at += literals + LZ4_MATCH;
        }
        self.write_sequence(w, at, last, 0)
    }

    /// One LZ4 sequence: `literals` decoded bytes from `at`, then (unless `matched` is
    /// 0) a match of `matched` bytes at offset 1.
    fn write_sequence(
        &self,
        w: &mut impl Write,
        at: u64,
        literals: u64,
        matched: u64,
    ) -> io::Result<()> {
        let m = matched.saturating_sub(4);
        let token = (literals.min(15) as u8) << 4 | if matched > 0 { m.min(15) as u8 } else { 0 };
        w.write_all(&[token])?;
        write_lz4_len(w, literals)?;
        self.write_range(w, at, at + literals)?;
        if matched > 0 {
            w.write_all(&1u16.to_le_bytes())?;
            write_lz4_len(w, m)?;
        }
        Ok(())
    }
}

/// The length bytes that follow a token nibble for a count of `x`.
fn write_lz4_len(w: &mut impl Write, x: u64) -> io::Result<()> {
    if x < 15 {
        return Ok(());
    }
    let mut rest = x - 15;
    let ff = [255u8; 4096];
    while rest >= 255 {
        let k = (rest / 255).min(ff.len() as u64);
        w.write_all(&ff[..k as usize])?;
        rest -= k * 255;
    }
    w.write_all(&[rest as u8])
}

/// Writes `n` bytes of the filler text (which never contains "NCCL version").
fn write_filler(w: &mut impl Write, mut n: u64) -> io::Result<()> {
    let mut buf = Vec::with_capacity(CHUNK);
    while buf.len() + FILLER.len() <= CHUNK {
        buf.extend_from_slice(FILLER);
    }
    while n > 0 {
        let k = n.min(buf.len() as u64) as usize;
        w.write_all(&buf[..k])?;
        n -= k as u64;
    }
    Ok(())
}

struct Layout {
    dynstr: Vec<u8>,
    dyn_entries: Vec<(u64, u64)>,
    rodata_head: Vec<u8>,
    rodata_tail: Vec<u8>,
    containers: Vec<std::ops::Range<usize>>,
    off_dynstr: u64,
    off_rodata: u64,
    size_rodata: u64,
    off_fatbin: u64,
    size_fatbin: u64,
    off_dynamic: u64,
    size_dynamic: u64,
    off_shstrtab: u64,
    shstrtab: Vec<u8>,
    shstr_names: [u32; 6],
    off_shdrs: u64,
    total: u64,
}

const PHDRS: u64 = 3;
const SHDRS: u64 = 6;

fn layout(spec: &Spec) -> Layout {
    let mut dynstr = vec![0u8];
    let mut add = |s: &str| {
        let at = dynstr.len() as u64;
        dynstr.extend_from_slice(s.as_bytes());
        dynstr.push(0);
        at
    };
    let mut dyn_entries = Vec::new();
    for n in &spec.needed {
        dyn_entries.push((u64::from(object::elf::DT_NEEDED), add(n)));
    }
    if let Some(s) = &spec.soname {
        dyn_entries.push((u64::from(object::elf::DT_SONAME), add(s)));
    }
    if let Some(s) = &spec.rpath {
        dyn_entries.push((u64::from(object::elf::DT_RPATH), add(s)));
    }
    if let Some(s) = &spec.runpath {
        dyn_entries.push((u64::from(object::elf::DT_RUNPATH), add(s)));
    }

    let mut rodata_head = vec![0u8];
    for s in &spec.strings {
        rodata_head.extend_from_slice(s.as_bytes());
        rodata_head.push(0);
    }
    if spec.floor_messages {
        for s in FLOOR_MESSAGES {
            rodata_head.extend_from_slice(s.as_bytes());
            rodata_head.push(0);
        }
    }
    let mut rodata_tail = Vec::new();
    if let Some(id) = &spec.self_id {
        rodata_tail.extend_from_slice(b"\0NCCL version ");
        rodata_tail.extend_from_slice(id.as_bytes());
        rodata_tail.push(0);
    }

    let per = if spec.entries_per_container == 0 {
        spec.entries.len().max(1)
    } else {
        spec.entries_per_container
    };
    let containers: Vec<std::ops::Range<usize>> = (0..spec.entries.len())
        .step_by(per)
        .map(|s| s..(s + per).min(spec.entries.len()))
        .collect();
    let size_fatbin: u64 = containers
        .iter()
        .map(|r| {
            16 + spec.entries[r.clone()]
                .iter()
                .map(|e| e.header_len() + e.padded_len())
                .sum::<u64>()
        })
        .sum();

    let off_dynstr = 64 + PHDRS * 56;
    let off_rodata = align(off_dynstr + dynstr.len() as u64, 32);
    let size_rodata = rodata_head.len() as u64 + spec.rodata_padding + rodata_tail.len() as u64;
    let off_fatbin = align(off_rodata + size_rodata, 8);
    // The writable segment must start on its own page (as in a real library).
    let off_dynamic = align(off_fatbin + size_fatbin, 4096);
    let size_dynamic = (dyn_entries.len() as u64 + 3) * 16; // + STRTAB, STRSZ, NULL
    let off_shstrtab = off_dynamic + size_dynamic;
    let mut shstrtab = vec![0u8];
    let mut shstr_names = [0u32; 6];
    for (i, n) in [
        "",
        ".dynstr",
        ".rodata",
        ".nv_fatbin",
        ".dynamic",
        ".shstrtab",
    ]
    .iter()
    .enumerate()
    {
        if n.is_empty() {
            continue;
        }
        shstr_names[i] = shstrtab.len() as u32;
        shstrtab.extend_from_slice(n.as_bytes());
        shstrtab.push(0);
    }
    let off_shdrs = align(off_shstrtab + shstrtab.len() as u64, 8);
    let total = off_shdrs + SHDRS * 64;
    Layout {
        dynstr,
        dyn_entries,
        rodata_head,
        rodata_tail,
        containers,
        off_dynstr,
        off_rodata,
        size_rodata,
        off_fatbin,
        size_fatbin,
        off_dynamic,
        size_dynamic,
        off_shstrtab,
        shstrtab,
        shstr_names,
        off_shdrs,
        total,
    }
}

/// Counts bytes so padding can be computed from the running position.
struct Counting<W> {
    inner: W,
    pos: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(b)?;
        self.pos += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<W: Write> Counting<W> {
    fn pad_to(&mut self, at: u64) -> io::Result<()> {
        let zeros = [0u8; 4096];
        while self.pos < at {
            let k = (at - self.pos).min(4096) as usize;
            self.write_all(&zeros[..k])?;
        }
        Ok(())
    }
}

/// Writes the library to `w`; returns its size in bytes.
pub fn write_to(spec: &Spec, w: impl Write) -> io::Result<u64> {
    let l = layout(spec);
    let mut w = Counting { inner: w, pos: 0 };
    let le16 = |v: u16| v.to_le_bytes();
    let le32 = |v: u32| v.to_le_bytes();
    let le64 = |v: u64| v.to_le_bytes();

    // ELF header.
    let mut eh = Vec::with_capacity(64);
    eh.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
    eh.extend_from_slice(&le16(3)); // ET_DYN
    eh.extend_from_slice(&le16(62)); // EM_X86_64
    eh.extend_from_slice(&le32(1));
    eh.extend_from_slice(&le64(0)); // e_entry
    eh.extend_from_slice(&le64(64)); // e_phoff
    eh.extend_from_slice(&le64(l.off_shdrs));
    eh.extend_from_slice(&le32(0));
    eh.extend_from_slice(&le16(64));
    eh.extend_from_slice(&le16(56));
    eh.extend_from_slice(&le16(PHDRS as u16));
    eh.extend_from_slice(&le16(64));
    eh.extend_from_slice(&le16(SHDRS as u16));
    eh.extend_from_slice(&le16(5)); // e_shstrndx
    w.write_all(&eh)?;

    // Program headers; virtual addresses equal file offsets.
    let phdr = |p_type: u32, flags: u32, off: u64, size: u64, align: u64| {
        let mut p = Vec::with_capacity(56);
        p.extend_from_slice(&le32(p_type));
        p.extend_from_slice(&le32(flags));
        p.extend_from_slice(&le64(off));
        p.extend_from_slice(&le64(off));
        p.extend_from_slice(&le64(off));
        p.extend_from_slice(&le64(size));
        p.extend_from_slice(&le64(size));
        p.extend_from_slice(&le64(align));
        p
    };
    let ro_end = l.off_fatbin + l.size_fatbin;
    w.write_all(&phdr(
        object::elf::PT_LOAD,
        object::elf::PF_R,
        0,
        ro_end,
        4096,
    ))?;
    w.write_all(&phdr(
        object::elf::PT_LOAD,
        object::elf::PF_R | object::elf::PF_W,
        l.off_dynamic,
        l.size_dynamic,
        4096,
    ))?;
    w.write_all(&phdr(
        object::elf::PT_DYNAMIC,
        object::elf::PF_R | object::elf::PF_W,
        l.off_dynamic,
        l.size_dynamic,
        8,
    ))?;

    w.pad_to(l.off_dynstr)?;
    w.write_all(&l.dynstr)?;
    w.pad_to(l.off_rodata)?;
    w.write_all(&l.rodata_head)?;
    write_filler(&mut w, spec.rodata_padding)?;
    w.write_all(&l.rodata_tail)?;

    w.pad_to(l.off_fatbin)?;
    for r in &l.containers {
        let entries = &spec.entries[r.clone()];
        let body: u64 = entries
            .iter()
            .map(|e| e.header_len() + e.padded_len())
            .sum();
        w.write_all(&le32(MAGIC))?;
        w.write_all(&le16(1))?;
        w.write_all(&le16(16))?;
        w.write_all(&le64(body))?;
        for e in entries {
            w.write_all(&e.header())?;
            let start = w.pos;
            let prologue = e.prologue();
            let content = Content {
                prologue: &prologue,
                len: e.content_len(),
                fill: if e.kind == Kind::Ptx { b' ' } else { 0x5a },
                nul_end: e.kind == Kind::Ptx,
            };
            if e.compressed {
                content.write_lz4(&mut w)?;
            } else {
                content.write_plain(&mut w)?;
            }
            debug_assert_eq!(w.pos - start, e.stored_len());
            w.pad_to(start + e.padded_len())?;
        }
    }

    w.pad_to(l.off_dynamic)?;
    for &(tag, val) in &l.dyn_entries {
        w.write_all(&le64(tag))?;
        w.write_all(&le64(val))?; // an offset into .dynstr
    }
    w.write_all(&le64(u64::from(object::elf::DT_STRTAB)))?;
    w.write_all(&le64(l.off_dynstr))?;
    w.write_all(&le64(u64::from(object::elf::DT_STRSZ)))?;
    w.write_all(&le64(l.dynstr.len() as u64))?;
    w.write_all(&[0u8; 16])?;

    w.pad_to(l.off_shstrtab)?;
    w.write_all(&l.shstrtab)?;
    w.pad_to(l.off_shdrs)?;
    let shdr = |name: u32,
                ty: u32,
                flags: u64,
                off: u64,
                size: u64,
                link: u32,
                align: u64,
                entsize: u64| {
        let mut s = Vec::with_capacity(64);
        s.extend_from_slice(&le32(name));
        s.extend_from_slice(&le32(ty));
        s.extend_from_slice(&le64(flags));
        let addr = if flags & u64::from(object::elf::SHF_ALLOC) != 0 {
            off
        } else {
            0
        };
        s.extend_from_slice(&le64(addr));
        s.extend_from_slice(&le64(off));
        s.extend_from_slice(&le64(size));
        s.extend_from_slice(&le32(link));
        s.extend_from_slice(&le32(0));
        s.extend_from_slice(&le64(align));
        s.extend_from_slice(&le64(entsize));
        s
    };
    let alloc = u64::from(object::elf::SHF_ALLOC);
    let write = u64::from(object::elf::SHF_WRITE);
    let n = &l.shstr_names;
    w.write_all(&[0u8; 64])?;
    w.write_all(&shdr(
        n[1],
        object::elf::SHT_STRTAB,
        alloc,
        l.off_dynstr,
        l.dynstr.len() as u64,
        0,
        1,
        0,
    ))?;
    w.write_all(&shdr(
        n[2],
        object::elf::SHT_PROGBITS,
        alloc,
        l.off_rodata,
        l.size_rodata,
        0,
        32,
        0,
    ))?;
    w.write_all(&shdr(
        n[3],
        object::elf::SHT_PROGBITS,
        alloc,
        l.off_fatbin,
        l.size_fatbin,
        0,
        8,
        0,
    ))?;
    w.write_all(&shdr(
        n[4],
        object::elf::SHT_DYNAMIC,
        alloc | write,
        l.off_dynamic,
        l.size_dynamic,
        1,
        8,
        16,
    ))?;
    w.write_all(&shdr(
        n[5],
        object::elf::SHT_STRTAB,
        0,
        l.off_shstrtab,
        l.shstrtab.len() as u64,
        0,
        1,
        0,
    ))?;
    w.flush()?;
    debug_assert_eq!(w.pos, l.total);
    Ok(w.pos)
}

/// Writes the library to `path`, streaming; returns its size.
pub fn write_file(spec: &Spec, path: &Path) -> Result<u64> {
    let f =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let n = write_to(spec, io::BufWriter::with_capacity(1 << 20, f))
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(n)
}

/// The library as bytes (small specs only).
pub fn to_vec(spec: &Spec) -> Vec<u8> {
    let mut v = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = write_to(spec, &mut v);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use fdl::arch::Arch;
    use fdl::inspect::fatbin::lz4_prefix;

    /// Every shape of block — literal-only, one match, many, PTX with its NUL — decodes
    /// (with the reader's own LZ4 decoder) to the plain bytes, at the predicted length.
    #[test]
    fn lz4_blocks_decode_to_the_plain_bytes() {
        let t = GpuTarget {
            arch: Arch::from_number(90),
            variant: Variant::Generic,
        };
        for kind in [Kind::Sass, Kind::Ptx] {
            for payload_size in [0, 300, 700, 1000, 1500, 20_000, 200_000] {
                let e = Entry {
                    kind,
                    target: t,
                    compressed: true,
                    payload_size,
                };
                let prologue = e.prologue();
                let content = Content {
                    prologue: &prologue,
                    len: e.content_len(),
                    fill: b' ',
                    nul_end: kind == Kind::Ptx,
                };
                let mut plain = Vec::new();
                content.write_plain(&mut plain).unwrap();
                let mut block = Vec::new();
                content.write_lz4(&mut block).unwrap();
                assert_eq!(plain.len() as u64, e.content_len());
                assert_eq!(
                    block.len() as u64,
                    e.stored_len(),
                    "{kind:?} {payload_size}"
                );
                let mut out = vec![0u8; plain.len()];
                assert_eq!(lz4_prefix(&block, &mut out), plain.len());
                assert!(out == plain, "{kind:?} {payload_size}");
                assert!(plain.starts_with(&prologue));
                // LZ4's end rules: at least 5 literals close the block.
                let last_token_literals = lz4_shape(plain.len() as u64, prologue.len() as u64)
                    .map_or(plain.len() as u64, |(_, last)| last);
                assert!(last_token_literals >= 5);
            }
        }
    }

    #[test]
    fn long_blocks_expand_like_real_fatbins() {
        assert!((LZ4_EXPANSION - 5.7).abs() < 0.01, "{LZ4_EXPANSION}");
        let n = 1_000_000;
        let ratio = n as f64 / lz4_block_len(n, CUBIN_HEADER) as f64;
        assert!((ratio - LZ4_EXPANSION).abs() < 0.05, "{ratio}");
        // The cubin header is decodable from the first few hundred stored bytes, as in
        // nvcc's blocks, so a reader needs one small read per entry.
        let mut block = Vec::new();
        let prologue = cubin_header(GpuTarget {
            arch: Arch::from_number(80),
            variant: Variant::Generic,
        });
        Content {
            prologue: &prologue,
            len: n,
            fill: 0x5a,
            nul_end: false,
        }
        .write_lz4(&mut block)
        .unwrap();
        let mut head = [0u8; 64];
        assert_eq!(lz4_prefix(&block[..300], &mut head), 64);
        assert_eq!(&head[..], &prologue[..64]);
    }
}
