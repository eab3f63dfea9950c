//! Synthetic ELF shared objects shaped like `libtorch_cuda.so`, for tests, fuzz seeds and
//! benchmarks: a `.rodata` with string constants (optionally NCCL's self-id and the
//! version-floor messages PyTorch carries), a `.dynamic` with SONAME/NEEDED/RPATH/RUNPATH
//! and a `.nv_fatbin` of containers with SASS and PTX entries.
//!
//! Files are streamed: every size is computed up front and the bytes are written in
//! order, so multi-GB files never sit in memory. Cubin payloads start with a real cubin
//! ELF header (the arch in `e_flags`, as nvcc writes it) and compressed entries hold a
//! valid LZ4 block, so `readelf` and `cuobjdump --list-elf/--list-ptx` read the output.

use crate::arch::{GpuTarget, Variant};
use anyhow::{Context, Result};
use std::io::{self, Write};
use std::path::Path;

use super::fatbin::{
    FLAG_64BIT, FLAG_ARCH_SPECIFIC, FLAG_COMPRESS_LZ4, FLAG_FAMILY, FLAG_LINUX, KIND_ELF, KIND_PTX,
    MAGIC,
};

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

/// Bytes an LZ4 literal-only block of `n` bytes takes: token, length bytes, literals.
fn lz4_literal_block_len(n: u64) -> u64 {
    if n < 15 {
        1 + n
    } else {
        1 + (n - 15) / 255 + 1 + n
    }
}

impl Entry {
    fn content_len(&self) -> u64 {
        self.payload_size.max(match self.kind {
            Kind::Sass => CUBIN_HEADER,
            Kind::Ptx => ptx_prologue(self.target).len() as u64 + 1,
        })
    }

    fn stored_len(&self) -> u64 {
        let n = self.content_len();
        if self.compressed {
            lz4_literal_block_len(n)
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

/// Writes `n` bytes of `prologue` followed by filler (`fill`) and, for PTX, a final NUL.
fn write_content(
    w: &mut impl Write,
    prologue: &[u8],
    n: u64,
    fill: u8,
    nul_end: bool,
) -> io::Result<()> {
    let head = (prologue.len() as u64).min(n) as usize;
    w.write_all(&prologue[..head])?;
    let mut left = n - head as u64;
    let tail = if nul_end && left > 0 { 1 } else { 0 };
    left -= tail;
    let buf = [fill; CHUNK];
    while left > 0 {
        let k = left.min(CHUNK as u64) as usize;
        w.write_all(&buf[..k])?;
        left -= k as u64;
    }
    if tail == 1 {
        w.write_all(&[0])?;
    }
    Ok(())
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
            let n = e.content_len();
            let start = w.pos;
            if e.compressed {
                // A literal-only LZ4 block: token, length extension, then the bytes.
                if n < 15 {
                    w.write_all(&[(n as u8) << 4])?;
                } else {
                    w.write_all(&[0xf0])?;
                    let mut rest = n - 15;
                    let ff = [255u8; 4096];
                    while rest >= 255 {
                        let k = (rest / 255).min(4096);
                        w.write_all(&ff[..k as usize])?;
                        rest -= k * 255;
                    }
                    w.write_all(&[rest as u8])?;
                }
            }
            let fill = if e.kind == Kind::Ptx { b' ' } else { 0x5a };
            write_content(&mut w, &e.prologue(), n, fill, e.kind == Kind::Ptx)?;
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
