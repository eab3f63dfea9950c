//! Symbol version tables: `DT_VERNEED` (the versions an object requires, per file),
//! `DT_VERDEF` (the versions it defines) and `DT_VERSYM` (the version of each dynamic
//! symbol), read as glibc's loader reads them (`_dl_check_map_versions`,
//! `check_match`).
//!
//! The tables are found through the dynamic table and the load segments, like the
//! loader finds them. Everything in them is hostile: each chain is walked at most
//! [`MAX_ENTRIES`] steps, each name is read at most [`MAX_NAME`] bytes, a version index
//! is at most `0x7fff`, and a table outside the file is an error, never an empty table.

use super::elf::ElfInfo;
use super::source::Source;
use anyhow::{anyhow, bail, Result};
use object::elf::{
    self, Dyn32, Dyn64, Verdaux, Verdef, Vernaux, Verneed, DT_NULL, DT_STRSZ, DT_STRTAB, DT_VERDEF,
    DT_VERNEED, DT_VERSYM, PT_DYNAMIC, VERSYM_HIDDEN, VERSYM_VERSION, VER_FLG_BASE, VER_FLG_WEAK,
};
use object::pod::{from_bytes, Pod};
use object::Endianness;

/// Entries walked over all chains of one object (a library defines or requires a few
/// dozen versions; glibc's libc about 50).
pub const MAX_ENTRIES: usize = 1 << 14;
/// Bytes of a version or file name read.
const MAX_NAME: usize = 4096;
/// Dynamic table entries read.
const MAX_DYN: usize = 1 << 16;

/// A version, as a lookup compares it: its name and the hash the file stores for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub name: String,
    pub hash: u32,
    /// For a required version, `vna_other`'s hidden bit: then only that very version
    /// matches, never a default one.
    pub hidden: bool,
    /// For a required version, the file it is required of (`vn_file`).
    pub file: Option<String>,
}

/// One version an object requires of a file (a `Vernaux`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Required {
    pub version: Version,
    /// `VER_FLG_WEAK`: missing, it only warns.
    pub weak: bool,
}

/// The versions an object requires of one file (a `Verneed`), by the file's name as
/// its DT_NEEDED says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Needs {
    pub file: String,
    pub versions: Vec<Required>,
}

/// What the version tables of one object say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VersionTables {
    /// `DT_VERNEED`, in its order. `Err` when its record version is not 1: glibc then
    /// refuses to start the process ("unsupported version N of Verneed record").
    pub needs: Vec<Needs>,
    pub needs_error: Option<String>,
    /// `DT_VERDEF`, every definition (the base one too, which `match_symbol` compares
    /// as well): `None` when the object has no DT_VERDEF.
    pub defines: Option<Vec<Version>>,
    /// A definition record whose version is not 1: requiring any version of this file
    /// then fails ("unsupported version N of Verdef record").
    pub defines_error: Option<String>,
    /// `l_versions`: by version index, the version a symbol of that index has; `None`
    /// where no table fills it (index 0 and 1, the base version, and gaps): such a
    /// symbol is unversioned.
    pub by_index: Vec<Option<Version>>,
    /// File offset of `DT_VERSYM`, one `u16` per dynamic symbol.
    versym: Option<u64>,
    little: bool,
}

impl VersionTables {
    /// Whether the object has a `DT_VERSYM` table.
    pub fn has_versym(&self) -> bool {
        self.versym.is_some()
    }

    /// The raw `DT_VERSYM` entry of dynamic symbol `index` (hidden bit included); `None`
    /// without a table. The caller bounds `index` by the symbol table.
    pub fn versym(&self, src: &Source<'_>, index: usize) -> Result<Option<u16>> {
        let Some(base) = self.versym else {
            return Ok(None);
        };
        let at = (index as u64)
            .checked_mul(2)
            .and_then(|o| o.checked_add(base))
            .ok_or_else(|| anyhow!("DT_VERSYM entry {index} lies outside the file"))?;
        let b = src
            .bytes(at, 2)
            .map_err(|_| anyhow!("DT_VERSYM entry {index} lies past the end of the file"))?;
        let b = [b[0], b[1]];
        Ok(Some(if self.little {
            u16::from_le_bytes(b)
        } else {
            u16::from_be_bytes(b)
        }))
    }

    /// The version a symbol whose `DT_VERSYM` entry is `raw` has (`l_versions[raw &
    /// 0x7fff]`), `None` when it is unversioned. An index past every table is an error:
    /// glibc would read past its array there.
    pub fn version_of(&self, raw: u16) -> Result<Option<&Version>> {
        let ndx = usize::from(raw & VERSYM_VERSION);
        if ndx <= 1 {
            return Ok(None);
        }
        match self.by_index.get(ndx) {
            Some(v) => Ok(v.as_ref()),
            None => bail!(
                "a DT_VERSYM entry names version index {ndx}, which no version table defines: the file is corrupt"
            ),
        }
    }

    /// Whether a definition whose `DT_VERSYM` entry is `raw` (`None`: the object has no
    /// DT_VERSYM) answers a reference of version `want` — glibc's `check_match`. With a
    /// version: the same version, or a default (unversioned or base) one not hidden, when
    /// the reference is not hidden. Without one: `Some(true)` for an unversioned, base or
    /// oldest (index 2) definition; `Some(false)` for a later version, which is only taken
    /// when it is the single one not hidden (the caller counts: `None` is returned for those
    /// it must count).
    pub fn matches(&self, raw: Option<u16>, want: Option<&Version>) -> Result<Match> {
        let Some(raw) = raw else {
            return Ok(Match::Yes);
        };
        let hidden = raw & VERSYM_HIDDEN != 0;
        match want {
            Some(v) => {
                let def = self.version_of(raw)?;
                let def_hash = def.map_or(0, |d| d.hash);
                let same = def.is_some_and(|d| d.hash == v.hash && d.name == v.name);
                Ok(if same || !(v.hidden || def_hash != 0 || hidden) {
                    Match::Yes
                } else {
                    Match::No
                })
            }
            None if raw & VERSYM_VERSION >= 3 => Ok(if hidden {
                Match::No
            } else {
                Match::OnlyIfAlone
            }),
            None => Ok(Match::Yes),
        }
    }
}

/// [`VersionTables::matches`]'s answer for one definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    Yes,
    No,
    /// A versioned definition for an unversioned reference: taken only when no other
    /// definition matches and it is the only such one in the object.
    OnlyIfAlone,
}

/// The version tables of the ELF file in `src` (already parsed into `info`); an empty
/// value for a file without a dynamic table or without version tables.
pub fn read(src: &Source<'_>, info: &ElfInfo) -> Result<VersionTables> {
    let little = src.bytes_clipped(5, 1).first() != Some(&2);
    let mut out = VersionTables {
        little,
        ..VersionTables::default()
    };
    let Some(seg) = info.segments.iter().find(|s| s.p_type == PT_DYNAMIC) else {
        return Ok(out);
    };
    let e = if little {
        Endianness::Little
    } else {
        Endianness::Big
    };
    // The dynamic table: the last of each tag counts, up to DT_NULL.
    let entry = if info.is_64 {
        std::mem::size_of::<Dyn64<Endianness>>()
    } else {
        std::mem::size_of::<Dyn32<Endianness>>()
    };
    let table = src.bytes_clipped(seg.offset, seg.filesz);
    let (mut versym, mut verdef, mut verneed, mut strtab, mut strsz) =
        (None, None, None, None, None);
    for d in table.chunks_exact(entry).take(MAX_DYN) {
        let (tag, val) = if info.is_64 {
            let Ok(d) = record::<Dyn64<Endianness>>(d) else {
                break;
            };
            (d.d_tag.get(e), d.d_val.get(e))
        } else {
            let Ok(d) = record::<Dyn32<Endianness>>(d) else {
                break;
            };
            (u64::from(d.d_tag.get(e)), u64::from(d.d_val.get(e)))
        };
        // A tag past u32 is none of these.
        match u32::try_from(tag).unwrap_or(u32::MAX) {
            DT_NULL => break,
            DT_VERSYM => versym = Some(val),
            DT_VERDEF => verdef = Some(val),
            DT_VERNEED => verneed = Some(val),
            DT_STRTAB => strtab = Some(val),
            DT_STRSZ => strsz = Some(val),
            _ => {}
        }
    }
    if versym.is_none() && verdef.is_none() && verneed.is_none() {
        return Ok(out);
    }
    let at = |addr: u64, len: u64, what: &str| -> Result<&[u8]> {
        let off = info.vaddr_to_offset(addr, len).ok_or_else(|| {
            anyhow!("{what} (at address {addr:#x}) lies outside the file's loaded segments: the file is truncated or corrupt")
        })?;
        src.bytes(off, len)
            .map_err(|_| anyhow!("{what} lies past the end of the file"))
    };
    if let Some(addr) = versym {
        out.versym = Some(info.vaddr_to_offset(addr, 2).ok_or_else(|| {
            anyhow!("DT_VERSYM (at address {addr:#x}) lies outside the file's loaded segments: the file is truncated or corrupt")
        })?);
    }
    let strtab_addr = strtab.ok_or_else(|| anyhow!("version tables without a DT_STRTAB"))?;
    let strings = {
        let off = info
            .vaddr_to_offset(strtab_addr, strsz.unwrap_or(0))
            .ok_or_else(|| anyhow!("DT_STRTAB lies outside the file's loaded segments"))?;
        src.bytes_clipped(off, strsz.unwrap_or(u64::MAX))
    };
    let name_at = |off: u32, what: &str| -> Result<String> {
        let rest = strings
            .get(off as usize..)
            .ok_or_else(|| anyhow!("{what} names string {off}, past the string table"))?;
        let rest = &rest[..rest.len().min(MAX_NAME)];
        let end = memchr::memchr(0, rest)
            .ok_or_else(|| anyhow!("{what} names an unterminated or over-long string"))?;
        Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
    };
    let mut steps = 0usize;
    let mut step = |what: &str| -> Result<()> {
        steps += 1;
        if steps > MAX_ENTRIES {
            bail!("its {what} chain runs past {MAX_ENTRIES} entries: the file is corrupt (or its chain loops)");
        }
        Ok(())
    };
    let set_index = |by_index: &mut Vec<Option<Version>>, ndx: u16, v: Version| {
        let ndx = usize::from(ndx & VERSYM_VERSION);
        if by_index.len() <= ndx {
            by_index.resize(ndx + 1, None);
        }
        by_index[ndx] = Some(v);
    };
    let mut by_index: Vec<Option<Version>> = Vec::new();
    let size = |n: usize| n as u64;
    if let Some(mut addr) = verneed {
        let first: &Verneed<Endianness> = record(at(
            addr,
            size(std::mem::size_of::<Verneed<Endianness>>()),
            "DT_VERNEED",
        )?)?;
        if first.vn_version.get(e) != 1 {
            out.needs_error = Some(format!(
                "unsupported version {} of Verneed record",
                first.vn_version.get(e)
            ));
        } else {
            loop {
                step("DT_VERNEED")?;
                let n: &Verneed<Endianness> = record(at(
                    addr,
                    size(std::mem::size_of::<Verneed<Endianness>>()),
                    "a DT_VERNEED record",
                )?)?;
                let file = name_at(n.vn_file.get(e), "a DT_VERNEED record")?;
                let mut needs = Needs {
                    file,
                    versions: Vec::new(),
                };
                let mut aux = addr
                    .checked_add(u64::from(n.vn_aux.get(e)))
                    .ok_or_else(|| anyhow!("a DT_VERNEED record points outside the file"))?;
                loop {
                    step("DT_VERNEED")?;
                    let a: &Vernaux<Endianness> = record(at(
                        aux,
                        size(std::mem::size_of::<Vernaux<Endianness>>()),
                        "a Vernaux record of DT_VERNEED",
                    )?)?;
                    let other = a.vna_other.get(e);
                    let version = Version {
                        name: name_at(a.vna_name.get(e), "a Vernaux record")?,
                        hash: a.vna_hash.get(e),
                        hidden: other & VERSYM_HIDDEN != 0,
                        file: Some(needs.file.clone()),
                    };
                    set_index(&mut by_index, other, version.clone());
                    needs.versions.push(Required {
                        version,
                        weak: a.vna_flags.get(e) & VER_FLG_WEAK != 0,
                    });
                    match a.vna_next.get(e) {
                        0 => break,
                        n => {
                            aux = aux.checked_add(u64::from(n)).ok_or_else(|| {
                                anyhow!("a Vernaux record points outside the file")
                            })?
                        }
                    }
                }
                out.needs.push(needs);
                match n.vn_next.get(e) {
                    0 => break,
                    n => {
                        addr = addr
                            .checked_add(u64::from(n))
                            .ok_or_else(|| anyhow!("a DT_VERNEED record points outside the file"))?
                    }
                }
            }
        }
    }
    if let Some(mut addr) = verdef {
        let mut defines = Vec::new();
        loop {
            step("DT_VERDEF")?;
            let d: &Verdef<Endianness> = record(at(
                addr,
                size(std::mem::size_of::<Verdef<Endianness>>()),
                "a DT_VERDEF record",
            )?)?;
            let version = d.vd_version.get(e);
            if version != 1 {
                out.defines_error = Some(format!("unsupported version {version} of Verdef record"));
                break;
            }
            let aux = addr
                .checked_add(u64::from(d.vd_aux.get(e)))
                .ok_or_else(|| anyhow!("a DT_VERDEF record points outside the file"))?;
            let a: &Verdaux<Endianness> = record(at(
                aux,
                size(std::mem::size_of::<Verdaux<Endianness>>()),
                "a Verdaux record of DT_VERDEF",
            )?)?;
            let version = Version {
                name: name_at(a.vda_name.get(e), "a Verdaux record")?,
                hash: d.vd_hash.get(e),
                hidden: false,
                file: None,
            };
            // The base version (the file's own name) is no symbol's version.
            if d.vd_flags.get(e) & VER_FLG_BASE == 0 {
                set_index(&mut by_index, d.vd_ndx.get(e), version.clone());
            }
            defines.push(version);
            match d.vd_next.get(e) {
                0 => break,
                n => {
                    addr = addr
                        .checked_add(u64::from(n))
                        .ok_or_else(|| anyhow!("a DT_VERDEF record points outside the file"))?
                }
            }
        }
        out.defines = Some(defines);
    }
    out.by_index = by_index;
    Ok(out)
}

/// The SysV ELF hash of a version name (what `vna_hash`/`vd_hash` hold).
pub fn elf_hash(name: &[u8]) -> u32 {
    elf::hash(name)
}

/// `bytes` as the record `T`, in `object`'s layout of it (unaligned fields, any
/// endianness); an error when `bytes` is shorter than the record.
fn record<T: Pod>(bytes: &[u8]) -> Result<&T> {
    from_bytes::<T>(bytes)
        .map(|(r, _)| r)
        .map_err(|()| anyhow!("a version record is truncated"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tables(by_index: Vec<Option<Version>>) -> VersionTables {
        VersionTables {
            by_index,
            ..VersionTables::default()
        }
    }

    fn v(name: &str) -> Version {
        Version {
            name: name.into(),
            hash: elf_hash(name.as_bytes()),
            hidden: false,
            file: None,
        }
    }

    /// glibc's `check_match`, case by case.
    #[test]
    fn check_match_rules() {
        // Index 2: NCCL_1, 3: NCCL_2.
        let t = tables(vec![None, None, Some(v("NCCL_1")), Some(v("NCCL_2"))]);
        let n1 = v("NCCL_1");
        // A versioned reference: its own version, or an unversioned/base definition.
        assert_eq!(t.matches(Some(2), Some(&n1)).unwrap(), Match::Yes);
        assert_eq!(t.matches(Some(3), Some(&n1)).unwrap(), Match::No);
        assert_eq!(t.matches(Some(0x8002), Some(&n1)).unwrap(), Match::Yes);
        assert_eq!(t.matches(Some(1), Some(&n1)).unwrap(), Match::Yes);
        assert_eq!(t.matches(Some(0x8001), Some(&n1)).unwrap(), Match::No);
        let hidden_ref = Version {
            hidden: true,
            ..n1.clone()
        };
        assert_eq!(t.matches(Some(1), Some(&hidden_ref)).unwrap(), Match::No);
        // No DT_VERSYM in the definer: taken.
        assert_eq!(t.matches(None, Some(&n1)).unwrap(), Match::Yes);
        // An unversioned reference: unversioned, base and the oldest version (index 2,
        // even hidden) match; later ones only when alone and not hidden.
        assert_eq!(t.matches(Some(1), None).unwrap(), Match::Yes);
        assert_eq!(t.matches(Some(2), None).unwrap(), Match::Yes);
        assert_eq!(t.matches(Some(0x8002), None).unwrap(), Match::Yes);
        assert_eq!(t.matches(Some(3), None).unwrap(), Match::OnlyIfAlone);
        assert_eq!(t.matches(Some(0x8003), None).unwrap(), Match::No);
        // An index no table defines is corrupt, not a guess.
        assert!(t.matches(Some(9), Some(&n1)).is_err());
        assert!(t.version_of(0x7fff).is_err());
    }

    /// A cc-built library with a version script, then its tables corrupted one way at
    /// a time: each is an error or a bounded answer, never a panic or an endless walk.
    #[test]
    fn corrupt_tables_are_errors_not_panics() {
        use object::{Object as _, ObjectSection as _};
        let dir = tempfile::tempdir().unwrap();
        let (c, map, lib) = (
            dir.path().join("l.c"),
            dir.path().join("l.map"),
            dir.path().join("libv.so"),
        );
        std::fs::write(
            &c,
            "#include <stdio.h>\nint f(void) { return puts(\"x\"); }\n",
        )
        .unwrap();
        std::fs::write(&map, "V_1 { global: f; local: *; };\n").unwrap();
        let ok = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&lib)
            .arg(&c)
            .arg(format!("-Wl,--version-script,{}", map.display()))
            .status()
            .expect("cc")
            .success();
        assert!(ok);
        let good = std::fs::read(&lib).unwrap();
        let read_bytes = |b: &[u8]| {
            let src = Source::from_bytes(b);
            let info = super::super::elf::parse(&src).unwrap();
            read(&src, &info)
        };
        let t = read_bytes(&good).unwrap();
        let defs = t.defines.as_ref().unwrap();
        assert!(defs
            .iter()
            .any(|d| d.name == "V_1" && d.hash == elf_hash(b"V_1")));
        assert!(t.needs.iter().any(|n| n.file == "libc.so.6"), "{t:?}");
        let file = object::File::parse(&*good).unwrap();
        let offset =
            |name: &str| file.section_by_name(name).unwrap().file_range().unwrap().0 as usize;
        let (vd, vn) = (offset(".gnu.version_d"), offset(".gnu.version_r"));
        let patched = |at: usize, bytes: &[u8]| {
            let mut b = good.clone();
            b[at..at + bytes.len()].copy_from_slice(bytes);
            b
        };
        let aux = vn + u32::from_le_bytes(good[vn + 8..vn + 12].try_into().unwrap()) as usize;
        let mut spin = good.clone();
        // A vna_next that leaves the file.
        spin[aux + 12..aux + 16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(read_bytes(&spin).is_err());
        // A name past the string table, an unsupported record version.
        let bad_name = patched(aux + 8, &u32::MAX.to_le_bytes());
        assert!(read_bytes(&bad_name).is_err());
        let t = read_bytes(&patched(vd, &2u16.to_le_bytes())).unwrap();
        assert_eq!(
            t.defines_error.as_deref(),
            Some("unsupported version 2 of Verdef record")
        );
        let t = read_bytes(&patched(vn, &7u16.to_le_bytes())).unwrap();
        assert_eq!(
            t.needs_error.as_deref(),
            Some("unsupported version 7 of Verneed record")
        );
        // A Verdaux offset far outside.
        assert!(read_bytes(&patched(vd + 12, &0x7fff_0000u32.to_le_bytes())).is_err());
    }

    #[test]
    fn elf_hash_is_the_sysv_one() {
        assert_eq!(elf_hash(b"GLIBC_2.2.5"), 0x09691a75);
        assert_eq!(elf_hash(b""), 0);
    }
}
