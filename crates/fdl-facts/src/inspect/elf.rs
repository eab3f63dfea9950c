//! The few ELF facts inspection needs: the section and segment tables (to find where
//! strings and fatbins live without reading the rest) and the dynamic table (SONAME,
//! DT_NEEDED, DT_RPATH, DT_RUNPATH). Parsing goes through `object`'s bounds-checked
//! raw readers; everything here only reads headers, never section contents in bulk.
//!
//! Every count the dynamic table implies is bounded twice: by what the file holds (the
//! table and its strings must lie in it) and by a fixed cap ([`MAX_DYN_ENTRIES`],
//! [`MAX_NEEDED`], [`MAX_PATH_ENTRIES`]). What a cap or an unreadable table leaves out is
//! recorded in [`DynamicInfo::incomplete`], which the loader model turns into an unknown
//! answer with that reason: a cut list is never read as the whole list.

use super::source::Source;
use anyhow::{anyhow, bail, Context, Result};
use object::elf;
use object::read::elf::{Dyn, FileHeader, ProgramHeader, SectionHeader};
use object::Endianness;

/// More sections or segments than this is not a real library; refuse rather than
/// allocate per-entry for a hostile table (real libtorch_cuda.so has ~50 sections).
const MAX_TABLE_ENTRIES: usize = 1 << 16;
/// Dynamic-table strings longer than this are cut (real ones are well under 1 KiB).
const MAX_DYN_STRING: usize = 4096;
/// Dynamic-table entries read before DT_NULL (a real library has under 100).
pub const MAX_DYN_ENTRIES: usize = 1 << 16;
/// DT_NEEDED entries followed per object (a real library has under 100; the loader
/// model's whole closure is capped at 4096 objects anyway).
pub const MAX_NEEDED: usize = 4096;
/// Directories of one DT_RPATH or DT_RUNPATH list, after duplicates are dropped (a
/// 4096-byte string holds at most 2049 elements).
pub const MAX_PATH_ENTRIES: usize = 1024;
/// DT_RELR and DT_RELRSZ (glibc 2.36), which `object` 0.36 does not name.
const DT_RELRSZ: u32 = 35;
const DT_RELR: u32 = 36;
/// The dynamic tags whose value is the address of a table in the file: each must lie in
/// a loadable segment's file bytes, or the object cannot be read as the loader reads it.
const TABLE_TAGS: &[(u32, &str)] = &[
    (elf::DT_STRTAB, "DT_STRTAB"),
    (elf::DT_SYMTAB, "DT_SYMTAB"),
    (elf::DT_HASH, "DT_HASH"),
    (elf::DT_GNU_HASH, "DT_GNU_HASH"),
    (elf::DT_VERSYM, "DT_VERSYM"),
    (elf::DT_VERNEED, "DT_VERNEED"),
    (elf::DT_VERDEF, "DT_VERDEF"),
    (elf::DT_JMPREL, "DT_JMPREL"),
    (elf::DT_RELA, "DT_RELA"),
    (elf::DT_REL, "DT_REL"),
    (DT_RELR, "DT_RELR"),
];

#[derive(Debug, Clone)]
pub struct Section {
    pub name: String,
    pub sh_type: u32,
    pub flags: u64,
    pub addr: u64,
    pub offset: u64,
    pub size: u64,
}

impl Section {
    /// Whether the section's bytes are in the file (not SHT_NOBITS such as .bss).
    pub fn has_file_bytes(&self) -> bool {
        self.sh_type != elf::SHT_NOBITS && self.sh_type != elf::SHT_NULL
    }

    /// Allocated, neither writable nor executable: where string literals end up.
    pub fn is_readonly_data(&self) -> bool {
        self.sh_type == elf::SHT_PROGBITS
            && self.flags & u64::from(elf::SHF_ALLOC) != 0
            && self.flags & u64::from(elf::SHF_WRITE | elf::SHF_EXECINSTR) == 0
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Segment {
    pub p_type: u32,
    pub flags: u32,
    pub offset: u64,
    pub vaddr: u64,
    pub filesz: u64,
}

/// What the dynamic table says about linking.
#[derive(Debug, Clone, Default)]
pub struct DynamicInfo {
    pub soname: Option<String>,
    pub needed: Vec<String>,
    /// DT_RPATH and DT_RUNPATH split at `:`, empty elements kept: glibc reads an empty
    /// element as the process's working directory.
    pub rpath: Vec<String>,
    pub runpath: Vec<String>,
    /// DT_FLAGS_1 (DF_1_NODEFLIB keeps the cache and default directories out of the
    /// searches this object starts).
    pub flags_1: u64,
    /// DT_AUDIT and DT_DEPAUDIT, by tag name: the audit libraries glibc loads, and whose
    /// code it runs, before anything else when this object is the main program.
    pub audit: Vec<(&'static str, String)>,
    /// Why the lists above are not the whole story: the table could not be read, a table
    /// it names lies outside the file, or a cap cut a list. Empty for a sound table.
    pub incomplete: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct ElfInfo {
    pub is_64: bool,
    pub machine: u16,
    /// ET_DYN, ET_EXEC, …
    pub e_type: u16,
    pub sections: Vec<Section>,
    pub segments: Vec<Segment>,
    pub dynamic: DynamicInfo,
    /// Problems that did not stop inspection (a broken dynamic table, say).
    pub warnings: Vec<String>,
}

impl ElfInfo {
    /// File offset of virtual address `addr` with `len` bytes available there, via the
    /// PT_LOAD segments (what the loader maps), else via the section table.
    pub fn vaddr_to_offset(&self, addr: u64, len: u64) -> Option<u64> {
        let within = |start: u64, size: u64| {
            addr >= start
                && addr
                    .checked_add(len)
                    .is_some_and(|e| e <= start.saturating_add(size))
        };
        self.segments
            .iter()
            .filter(|s| s.p_type == elf::PT_LOAD)
            .find(|s| within(s.vaddr, s.filesz))
            .and_then(|s| s.offset.checked_add(addr - s.vaddr))
            .or_else(|| {
                self.sections
                    .iter()
                    .filter(|s| s.has_file_bytes() && s.flags & u64::from(elf::SHF_ALLOC) != 0)
                    .find(|s| within(s.addr, s.size))
                    .and_then(|s| s.offset.checked_add(addr - s.addr))
            })
    }
}

/// The file ends before the bytes its own ELF header or program headers place in it:
/// a download or copy that stopped short. Such a file must not be read as "no NCCL, no
/// GPU code" (its section table, at the end, is the first thing lost), so inspection
/// stops with this error. Distinguishable with `err.downcast_ref::<TruncatedElf>()`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{} is truncated: its {claim} end at byte {end} but the file has {len} bytes; re-download or re-copy it", .path.display())]
pub struct TruncatedElf {
    pub path: std::path::PathBuf,
    /// What says the file goes on, e.g. "ELF header says the section headers".
    pub claim: String,
    /// The byte offset that claim ends at.
    pub end: u64,
    /// The file's size.
    pub len: u64,
}

/// Whether the data starts like an ELF file.
pub fn is_elf(head: &[u8]) -> bool {
    head.starts_with(&elf::ELFMAG)
}

/// Parses the tables of the ELF file in `src`.
pub fn parse(src: &Source<'_>) -> Result<ElfInfo> {
    let ident = src
        .bytes(0, 16)
        .context("the file starts like ELF but is shorter than an ELF identification")?;
    // e_ident[EI_CLASS]
    match ident[4] {
        elf::ELFCLASS64 => parse_as::<elf::FileHeader64<Endianness>>(src),
        elf::ELFCLASS32 => parse_as::<elf::FileHeader32<Endianness>>(src),
        other => bail!(
            "{}: unknown ELF class {other}: the file is corrupt or not a Linux shared library",
            src.name().display()
        ),
    }
}

fn parse_as<Elf: FileHeader<Endian = Endianness>>(src: &Source<'_>) -> Result<ElfInfo> {
    let name = src.name().display().to_string();
    let bad = |what: &str, e: object::read::Error| {
        anyhow!("{name}: {what}: {e}; the file is truncated or not a valid ELF shared library")
    };
    // `object` reads from the mapping through bounds-checked slices; it only touches the
    // file header and the tables it is asked for.
    let data = src.bytes(0, src.len())?;
    let header = Elf::parse(data).map_err(|e| bad("bad ELF header", e))?;
    let endian = header.endian().map_err(|e| bad("bad ELF byte order", e))?;
    check_complete(src, header, endian, data)?;
    let mut warnings = Vec::new();

    let mut sections = Vec::new();
    match header.sections(endian, data) {
        Ok(table) => {
            if table.len() > MAX_TABLE_ENTRIES {
                bail!(
                    "{name}: the section table claims {} sections; the file is corrupt",
                    table.len()
                );
            }
            for sh in table.iter() {
                let sec_name = table
                    .section_name(endian, sh)
                    .map(|n| String::from_utf8_lossy(&n[..n.len().min(256)]).into_owned())
                    .unwrap_or_default();
                sections.push(Section {
                    name: sec_name,
                    sh_type: sh.sh_type(endian),
                    flags: sh.sh_flags(endian).into(),
                    addr: sh.sh_addr(endian).into(),
                    offset: sh.sh_offset(endian).into(),
                    size: sh.sh_size(endian).into(),
                });
            }
        }
        Err(e) => warnings.push(format!(
            "section table unreadable ({e}); falling back to program headers"
        )),
    }

    let mut segments = Vec::new();
    match header.program_headers(endian, data) {
        Ok(phdrs) => {
            if phdrs.len() > MAX_TABLE_ENTRIES {
                bail!("{name}: the program header table is implausibly large; the file is corrupt");
            }
            for ph in phdrs {
                segments.push(Segment {
                    p_type: ph.p_type(endian),
                    flags: ph.p_flags(endian),
                    offset: ph.p_offset(endian).into(),
                    vaddr: ph.p_vaddr(endian).into(),
                    filesz: ph.p_filesz(endian).into(),
                });
            }
        }
        Err(e) => warnings.push(format!("program headers unreadable ({e})")),
    }

    let mut info = ElfInfo {
        is_64: header.is_type_64(),
        machine: header.e_machine(endian),
        e_type: header.e_type(endian),
        sections,
        segments,
        dynamic: DynamicInfo::default(),
        warnings,
    };
    match read_dynamic::<Elf>(&info, endian, data) {
        Ok(d) => info.dynamic = d,
        Err(e) => info
            .dynamic
            .incomplete
            .push(format!("dynamic table unreadable: {e:#}")),
    }
    info.warnings
        .extend(info.dynamic.incomplete.iter().cloned());
    Ok(info)
}

/// Fails with [`TruncatedElf`] when the tables the ELF header places in the file, or
/// the loadable segments the program headers place there, end past its end. Offsets so
/// large that the end overflows are corruption, not truncation, and are left to the
/// readers' own checks (which fall back to the program headers, with a warning).
fn check_complete<Elf: FileHeader<Endian = Endianness>>(
    src: &Source<'_>,
    header: &Elf,
    endian: Endianness,
    data: &[u8],
) -> Result<()> {
    let len = data.len() as u64;
    let past_end = |claim: &str, end: Option<u64>| match end {
        Some(end) if end > len => Err(TruncatedElf {
            path: src.name().to_path_buf(),
            claim: claim.to_string(),
            end,
            len,
        }),
        _ => Ok(()),
    };
    let table_end = |off: u64, count: u64, entry: usize| {
        count
            .checked_mul(entry as u64)
            .and_then(|n| off.checked_add(n))
    };
    // The section headers, usually the last bytes of the file. With e_shnum 0 the count
    // is the first header's sh_size (more than 65,279 sections); if even that header is
    // missing, the table needs at least it.
    let shoff: u64 = header.e_shoff(endian).into();
    if shoff != 0 {
        let count = match header.e_shnum(endian) {
            0 => match header.section_0(endian, data) {
                Ok(Some(s0)) => s0.sh_size(endian).into(),
                _ => 1,
            },
            n => u64::from(n),
        };
        past_end(
            "ELF header says the section headers",
            table_end(shoff, count, std::mem::size_of::<Elf::SectionHeader>()),
        )?;
    }
    let phoff: u64 = header.e_phoff(endian).into();
    if phoff != 0 {
        let count = header
            .phnum(endian, data)
            .map_or(u64::from(header.e_phnum(endian)), |n| n as u64);
        past_end(
            "ELF header says the program headers",
            table_end(phoff, count, std::mem::size_of::<Elf::ProgramHeader>()),
        )?;
        // What the loader maps must be there; a file without a section table (stripped
        // of it) is otherwise complete as far as anything says.
        if let Ok(phdrs) = header.program_headers(endian, data) {
            for ph in phdrs.iter().filter(|ph| ph.p_type(endian) == elf::PT_LOAD) {
                let off: u64 = ph.p_offset(endian).into();
                let size: u64 = ph.p_filesz(endian).into();
                past_end(
                    "program headers say a loadable segment's bytes",
                    off.checked_add(size),
                )?;
            }
        }
    }
    Ok(())
}

fn read_dynamic<Elf: FileHeader<Endian = Endianness>>(
    info: &ElfInfo,
    endian: Endianness,
    data: &[u8],
) -> Result<DynamicInfo> {
    // Prefer the section (sh_link names its string table); fall back to PT_DYNAMIC with
    // DT_STRTAB translated through the load segments, as the loader does.
    let dyn_region = info
        .sections
        .iter()
        .find(|s| s.sh_type == elf::SHT_DYNAMIC)
        .map(|s| (s.offset, s.size))
        .or_else(|| {
            info.segments
                .iter()
                .find(|s| s.p_type == elf::PT_DYNAMIC)
                .map(|s| (s.offset, s.filesz))
        });
    let Some((off, size)) = dyn_region else {
        return Ok(DynamicInfo::default()); // static executable or object file
    };
    let entry_size = std::mem::size_of::<Elf::Dyn>() as u64;
    let end = off
        .checked_add(size)
        .filter(|&e| e <= data.len() as u64)
        .context("the dynamic table lies past the end of the file")?;
    let count = ((end - off) / entry_size) as usize;
    let entries: &[Elf::Dyn] = object::pod::slice_from_bytes(&data[off as usize..], count)
        .map(|(s, _)| s)
        .map_err(|_| anyhow!("the dynamic table is misaligned or truncated"))?;
    // Up to DT_NULL, and at most MAX_DYN_ENTRIES of it.
    let live = entries
        .iter()
        .position(|d| {
            let tag: u64 = d.d_tag(endian).into();
            tag == u64::from(elf::DT_NULL)
        })
        .unwrap_or(entries.len());
    let mut incomplete = Vec::new();
    if live > MAX_DYN_ENTRIES {
        incomplete.push(format!(
            "its dynamic table has {live} entries, more than the {MAX_DYN_ENTRIES} fdl reads"
        ));
    }
    let entries = &entries[..live.min(MAX_DYN_ENTRIES)];
    let tag_of = |d: &Elf::Dyn| -> (u64, u64) { (d.d_tag(endian).into(), d.d_val(endian).into()) };

    // The last of each tag counts, as in glibc's `elf_get_dynamic_info`, which keeps one
    // entry per tag (DT_NEEDED alone is read as a list).
    let last = |want: u32| -> Option<u64> {
        entries
            .iter()
            .rev()
            .map(tag_of)
            .find(|&(t, _)| t == u64::from(want))
            .map(|(_, v)| v)
    };
    let strtab_addr = last(elf::DT_STRTAB);
    let strsz = last(elf::DT_STRSZ);
    // Every table the loader would read must be in the file: one placed past its end is
    // a file fdl cannot read as the loader does, never an empty table.
    let sized = |tag: u32| -> u64 {
        let size_tag = match tag {
            elf::DT_STRTAB => elf::DT_STRSZ,
            elf::DT_JMPREL => elf::DT_PLTRELSZ,
            elf::DT_RELA => elf::DT_RELASZ,
            elf::DT_REL => elf::DT_RELSZ,
            DT_RELR => DT_RELRSZ,
            _ => return 1,
        };
        last(size_tag).unwrap_or(1).max(1)
    };
    for &(tag, tag_name) in TABLE_TAGS {
        if let Some(addr) = last(tag) {
            if info.vaddr_to_offset(addr, sized(tag)).is_none() {
                bail!(
                    "{tag_name} places its table ({} bytes at address {addr:#x}) outside the file's loadable segments: the file is truncated or corrupt",
                    sized(tag)
                );
            }
        }
    }
    // The string table, by address through the segments (what the loader uses).
    let strtab: &[u8] = match strtab_addr {
        Some(addr) => {
            let size: u64 = strsz.unwrap_or(0);
            let off = info
                .vaddr_to_offset(addr, size)
                .or_else(|| info.vaddr_to_offset(addr, 0))
                .context("DT_STRTAB points outside the file")?;
            let avail = (data.len() as u64).saturating_sub(off);
            let len = if size == 0 { avail } else { size.min(avail) };
            usize::try_from(off)
                .ok()
                .and_then(|o| data.get(o..o.checked_add(len as usize)?))
                .context("DT_STRTAB points past the end of the file")?
        }
        None => bail!("the dynamic table has no DT_STRTAB"),
    };
    let string_at = |v: u64| -> Option<String> {
        let rest = strtab.get(usize::try_from(v).ok()?..)?;
        let end = memchr::memchr(0, rest).unwrap_or(rest.len());
        let s = &rest[..end.min(MAX_DYN_STRING)];
        Some(String::from_utf8_lossy(s).into_owned())
    };
    // A colon-separated list, kept whole (the loader model reads an empty element as
    // the working directory, as glibc does), each directory once: glibc's
    // `fillin_rpath` drops repeats too.
    let path_list = |tag: u32, tag_name: &str, incomplete: &mut Vec<String>| -> Vec<String> {
        let Some(s) = last(tag).and_then(string_at) else {
            return Vec::new();
        };
        let mut out: Vec<String> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for e in s.split(':') {
            if seen.insert(e) {
                if out.len() == MAX_PATH_ENTRIES {
                    incomplete.push(format!(
                        "its {tag_name} lists more than {MAX_PATH_ENTRIES} directories; fdl follows the first {MAX_PATH_ENTRIES}"
                    ));
                    break;
                }
                out.push(e.to_string());
            }
        }
        out
    };

    let mut out = DynamicInfo {
        flags_1: last(elf::DT_FLAGS_1).unwrap_or(0),
        soname: last(elf::DT_SONAME).and_then(string_at),
        rpath: path_list(elf::DT_RPATH, "DT_RPATH", &mut incomplete),
        runpath: path_list(elf::DT_RUNPATH, "DT_RUNPATH", &mut incomplete),
        ..DynamicInfo::default()
    };
    for (tag, tag_name) in [
        (elf::DT_AUDIT, "DT_AUDIT"),
        (elf::DT_DEPAUDIT, "DT_DEPAUDIT"),
    ] {
        if let Some(v) = last(tag) {
            // A value that names no string is still the tag: it is never traced past.
            out.audit
                .push((tag_name, string_at(v).unwrap_or_else(|| "?".into())));
        }
    }
    let mut needed = entries
        .iter()
        .map(tag_of)
        .filter(|&(t, _)| t == u64::from(elf::DT_NEEDED));
    for (_, v) in needed.by_ref().take(MAX_NEEDED) {
        if let Some(s) = string_at(v) {
            out.needed.push(s);
        }
    }
    let rest = needed.count();
    if rest > 0 {
        incomplete.push(format!(
            "it lists {} DT_NEEDED entries; fdl follows the first {MAX_NEEDED}",
            MAX_NEEDED + rest
        ));
    }
    out.incomplete = incomplete;
    Ok(out)
}
