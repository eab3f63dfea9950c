//! Whether an `LD_PRELOAD`ed `libnccl.so.2` replaces the NCCL that a library such as
//! `libtorch_cuda.so` calls.
//!
//! A preload wins only for references the dynamic linker resolves by name: `nccl*`
//! functions the library imports, or defines with default visibility, exports and reaches
//! through a relocation naming them. Hidden, local and protected definitions, and calls
//! bound at link time (`-Bsymbolic`, `-Bsymbolic-functions`, direct calls), stay inside the
//! library. A definition no relocation names is a call only where the library's code or
//! data refers to its entry ([`super::code_refs`]): otherwise nothing in the library calls
//! it ([`Binding::NeverCalled`]), which is no call at all. The answer comes from the
//! dynamic table, `.dynsym` and the dynamic relocation tables — plus `.symtab` and
//! `.rodata` when nothing is exported, and the code only for definitions no relocation
//! names — never the whole file.

use super::code_refs::{self, Reached};
use super::elf::{self as fdl_elf, ElfInfo};
use super::frames::Frames;
use super::selfid;
use super::source::Source;
use super::symver;
pub use super::symver::Version;
use anyhow::{anyhow, bail, Context, Result};
use object::elf;
use object::read::elf::{
    Dyn as _, FileHeader, Relr as _, RelrIterator, SectionHeader, SectionTable, Sym as _,
};
use object::{Endian as _, Endianness};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;

type Sym = elf::Sym64<Endianness>;
type Rela = elf::Rela64<Endianness>;
type Rel = elf::Rel64<Endianness>;
type Dyn = elf::Dyn64<Endianness>;
type Header = elf::FileHeader64<Endianness>;
type Relr = elf::Relr64<Endianness>;

const SYM_SIZE: u64 = std::mem::size_of::<Sym>() as u64;
/// Packed relative relocations (glibc 2.36, `-z pack-relative-relocs`); not in `object`.
const DT_RELRSZ: u32 = 35;
const DT_RELR: u32 = 36;
/// The most function symbols read to find the function holding a candidate reference.
const MAX_FUNCTIONS: usize = 1 << 24;
/// The most addresses a DT_RELR table may relocate before fdl stops reading it.
const MAX_RELR: u64 = 1 << 26;
/// Names longer than this are not NCCL's (its longest API name is under 40 bytes); the
/// bound also keeps an unterminated hostile string table from being scanned per symbol.
const MAX_NAME: usize = 256;
/// More `nccl*` functions than this in one symbol table is a corrupt file (libnccl.so.2
/// 2.30.7 exports 165, `pnccl*` aliases included); refusing keeps memory bounded whatever
/// the symbol tables claim.
const MAX_NAMES: usize = 1 << 14;
/// More dynamic symbols than this is not a library (libtorch_cuda.so has about 100,000):
/// the count a hash table implies is refused past it, so no walk over `.dynsym` or a
/// hash chain is longer.
const MAX_DYNSYM: u64 = 1 << 22;

/// How one `nccl*` function the library uses is bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Binding {
    /// Undefined here: the dynamic linker looks it up, a preload first.
    Imported,
    /// Defined and exported with default visibility, reached through a relocation that
    /// names it: a preloaded definition wins.
    Interposable,
    /// The library's references reach its own definition whatever is preloaded.
    BoundLocally { why: String },
    /// Defined and exported, but nothing in the library calls it: no relocation names it,
    /// no instruction refers to its entry, no data holds its address. Not a call (other
    /// objects' imports of the name still bind by scope).
    NeverCalled,
    /// No relocation names it, and something in the code may refer to its entry, but fdl
    /// could not confirm it (`why`): perhaps a call bound at link time, perhaps none.
    Uncertain { why: String },
}

impl Binding {
    /// Whether the library calls the function at all (or may): every binding but
    /// [`Binding::NeverCalled`].
    pub fn is_call(&self) -> bool {
        !matches!(self, Binding::NeverCalled)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SymbolBinding {
    pub name: String,
    pub binding: Binding,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// every nccl* symbol the library uses goes through the dynamic linker
    PreloadTakesEffect,
    /// some or all are bound inside the library: a preload does not replace them
    PreloadIneffective { bound: Vec<String>, why: String },
    /// the library neither imports nor defines any nccl* function
    NoNccl,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Interposition {
    /// DF_SYMBOLIC in DT_FLAGS, or DT_SYMBOLIC present (`-Bsymbolic`).
    pub symbolic: bool,
    /// No DT flag, but every exported default-visibility `nccl*` definition lacks a
    /// relocation naming it: what GNU ld's `-Bsymbolic-functions` (which sets no flag)
    /// leaves behind. Direct calls compiled with `-fno-semantic-interposition` look alike.
    pub symbolic_functions_hint: bool,
    /// Sorted by name. The `.dynsym` functions; only when `.dynsym` has none, the
    /// definitions `.symtab` lists (hidden or local ones, which no preload reaches).
    pub symbols: Vec<SymbolBinding>,
    pub verdict: Verdict,
    /// Undefined `nccl*` names the library needs: the set a preloaded NCCL must export.
    pub imported: Vec<String>,
}

const WHY_LOCAL: &str = "local binding (STB_LOCAL): the dynamic linker never sees it";
const WHY_HIDDEN: &str =
    "hidden visibility (STV_HIDDEN/STV_INTERNAL): not exported, calls bind inside the library";
const WHY_PROTECTED: &str =
    "protected visibility (STV_PROTECTED): the library's own references bind to its own definition";
const WHY_SYMBOLIC: &str =
    "linked with -Bsymbolic (DF_SYMBOLIC/DT_SYMBOLIC): the library's references bind to its own definitions";
const WHY_DIRECT: &str =
    "called directly: no relocation names it, and the library's code refers to its entry (a call bound at link time: -Bsymbolic-functions, --dynamic-list or -fno-semantic-interposition)";
const WHY_IN_DATA: &str =
    "its address is stored by a RELATIVE relocation (bound at link time, e.g. -Bsymbolic-functions): calls through it reach the library's own definition";
const WHY_NOT_EXPORTED: &str =
    "not exported (only in .symtab: hidden visibility, static, or local by a version script); calls bind inside the library";

/// Analyses the library at `path`.
pub fn analyze(path: &Path) -> Result<Interposition> {
    Source::with_file(path, analyze_source)
}

/// [`analyze`] on bytes in memory (robustness tests, fuzzing).
#[doc(hidden)]
pub fn analyze_bytes(data: &[u8]) -> Result<Interposition> {
    analyze_source(&Source::from_bytes(data))
}

/// The defined, exported (global or weak, default or protected visibility) `nccl*`
/// functions in `.dynsym` of the library at `path`, sorted: what a preloaded
/// `libnccl.so.2` offers, to compare with [`Interposition::imported`].
pub fn exported_nccl_symbols(path: &Path) -> Result<Vec<String>> {
    Source::with_file(path, exported_nccl_symbols_in)
}

fn exported_nccl_symbols_in(src: &Source<'_>) -> Result<Vec<String>> {
    let t = Tables::read(src)?;
    let mut out = BTreeSet::new();
    for (_, c) in t.dynamic_candidates()? {
        let exported = matches!(c.bind, elf::STB_GLOBAL | elf::STB_WEAK)
            && matches!(c.vis, elf::STV_DEFAULT | elf::STV_PROTECTED);
        if c.defined && exported {
            out.insert(c.name);
        }
    }
    src.check_len()?;
    Ok(out.into_iter().collect())
}

/// The defined, exported (global or weak, default or protected visibility) `nccl*`
/// symbols of any type in `.dynsym` of the library at `path` whose names start with one
/// of `prefixes`, sorted: a plugin's versioned entry points (`ncclNetPlugin_v10`, data
/// objects, not functions), which NCCL looks up with `dlsym`. A file without dynamic
/// symbols exports none.
pub fn exported_with_prefixes(path: &Path, prefixes: &[&str]) -> Result<BTreeSet<String>> {
    Source::with_file(path, |src| exported_with_prefixes_in(src, prefixes))
}

/// [`exported_with_prefixes`] of a file already open.
pub fn exported_with_prefixes_in(src: &Source<'_>, prefixes: &[&str]) -> Result<BTreeSet<String>> {
    {
        let Some(t) = tables_if_dynamic(src)? else {
            return Ok(BTreeSet::new());
        };
        let e = t.endian;
        let mut out = BTreeSet::new();
        for s in t.dynsym.iter().skip(1) {
            let Some(name) = nccl_name(t.dynstr, s.st_name(e)) else {
                continue;
            };
            if !prefixes.iter().any(|p| name.starts_with(p)) {
                continue;
            }
            let exported = s.st_shndx(e) != elf::SHN_UNDEF
                && matches!(s.st_bind(), elf::STB_GLOBAL | elf::STB_WEAK)
                && matches!(s.st_visibility(), elf::STV_DEFAULT | elf::STV_PROTECTED);
            if exported {
                if out.len() >= MAX_NAMES {
                    bail!(
                        "{}: more than {MAX_NAMES} plugin entry symbols in .dynsym; the file is corrupt",
                        src.name().display()
                    );
                }
                out.insert(name.to_string());
            }
        }
        src.check_len()?;
        Ok(out)
    }
}

/// The file has no dynamic table or no dynamic symbol table: it exports and imports
/// nothing, which for a link map is an answer ("no symbols"), not an unreadable object.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NoDynamicSymbols(String);

/// [`Tables::read`] for the loader model: `None` for a file without dynamic symbols.
fn tables_if_dynamic<'a>(src: &'a Source<'a>) -> Result<Option<Tables<'a>>> {
    match Tables::read(src) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.downcast_ref::<NoDynamicSymbols>().is_some() => Ok(None),
        Err(e) => Err(e),
    }
}

/// What one object of a link map says about `nccl*` functions in its dynamic tables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DynamicNccl {
    /// Defined and exported (global or weak, default or protected visibility): a lookup
    /// from any object can bind here.
    pub exported: BTreeSet<String>,
    /// Each `nccl*` function the object refers to or defines, and how its own calls bind.
    pub symbols: Vec<SymbolBinding>,
    /// DF_SYMBOLIC / DT_SYMBOLIC: lookups from this object try itself first.
    pub symbolic: bool,
}

/// The `nccl*` facts of `.dynsym` alone — no `.symtab`, no `.rodata` — for walking a whole
/// closure: `None` when `.dynsym` names no `nccl*` function (most objects), without
/// reading any relocation.
pub fn dynamic_nccl(path: &Path) -> Result<Option<DynamicNccl>> {
    Source::with_file(path, dynamic_nccl_in)
}

fn dynamic_nccl_in(src: &Source<'_>) -> Result<Option<DynamicNccl>> {
    let Some(t) = tables_if_dynamic(src)? else {
        return Ok(None);
    };
    let candidates = t.dynamic_candidates()?;
    if candidates.is_empty() {
        return Ok(None);
    }
    let bound = bind_candidates(&t, &candidates)?;
    let mut out = DynamicNccl {
        symbolic: t.symbolic,
        ..DynamicNccl::default()
    };
    for (_, c) in &candidates {
        let exported = matches!(c.bind, elf::STB_GLOBAL | elf::STB_WEAK)
            && matches!(c.vis, elf::STV_DEFAULT | elf::STV_PROTECTED);
        if c.defined && exported {
            out.exported.insert(c.name.clone());
        }
    }
    let by_name = bound.by_name;
    out.symbols = by_name
        .into_iter()
        .map(|(name, binding)| SymbolBinding { name, binding })
        .collect();
    src.check_len()?;
    Ok(Some(out))
}

/// Which of `names` the object at `path` exports as a symbol lookup can bind to: defined,
/// global or weak, default or protected visibility. Found through the object's symbol
/// hash table (DT_GNU_HASH, else DT_HASH) as the loader finds them — a few probes per name
/// instead of reading a `.dynsym` of 100,000 entries — and by a scan only when there is
/// no hash table. The references are unversioned: [`exported_among_versioned`].
pub fn exported_among(path: &Path, names: &[&str]) -> Result<BTreeSet<String>> {
    let wanted: Vec<(&str, Option<&Version>)> = names.iter().map(|n| (*n, None)).collect();
    exported_among_versioned(path, &wanted)
}

/// [`exported_among`] for references that may name a symbol version: each name is
/// looked up as glibc's `do_lookup_x` looks it up for a reference of that version
/// ([`symver::VersionTables::matches`]): the first definition of the chain that matches
/// decides, and for an unversioned reference a later version is taken only when it is
/// the object's only one. The definition taken must then bind globally (not local, not
/// hidden), or the object is passed over.
pub fn exported_among_versioned(
    path: &Path,
    wanted: &[(&str, Option<&Version>)],
) -> Result<BTreeSet<String>> {
    Source::with_file(path, |src| exported_among_source(src, wanted))
}

/// [`exported_among`] on bytes in memory (fuzzing, robustness tests).
#[doc(hidden)]
pub fn exported_among_bytes(data: &[u8], names: &[&str]) -> Result<BTreeSet<String>> {
    let wanted: Vec<(&str, Option<&Version>)> = names.iter().map(|n| (*n, None)).collect();
    exported_among_source(&Source::from_bytes(data), &wanted)
}

fn exported_among_source(
    src: &Source<'_>,
    wanted: &[(&str, Option<&Version>)],
) -> Result<BTreeSet<String>> {
    let Some(t) = tables_if_dynamic(src)? else {
        return Ok(BTreeSet::new());
    };
    let e = t.endian;
    let versions = symver::read(src, &t.info)
        .with_context(|| format!("{}: its symbol version tables", src.name().display()))?;
    // `check_match`'s first tests: a definition with a value, of a code or data type.
    let defines = |s: &Sym| {
        s.st_shndx(e) != elf::SHN_UNDEF
            && !(s.st_value(e) == 0 && s.st_shndx(e) != elf::SHN_ABS && s.st_type() != elf::STT_TLS)
            && matches!(
                s.st_type(),
                elf::STT_NOTYPE
                    | elf::STT_OBJECT
                    | elf::STT_FUNC
                    | elf::STT_COMMON
                    | elf::STT_TLS
                    | elf::STT_GNU_IFUNC
            )
    };
    // Then `do_lookup_x`: hidden and local definitions are passed over with their object.
    let binds_globally = |s: &Sym| {
        matches!(
            s.st_bind(),
            elf::STB_GLOBAL | elf::STB_WEAK | elf::STB_GNU_UNIQUE
        ) && matches!(s.st_visibility(), elf::STV_DEFAULT | elf::STV_PROTECTED)
    };
    let name_is = |s: &Sym, want: &[u8]| {
        usize::try_from(s.st_name(e))
            .ok()
            .and_then(|o| t.dynstr.get(o..))
            .is_some_and(|rest| rest.starts_with(want) && rest.get(want.len()) == Some(&0))
    };
    let mut out = BTreeSet::new();
    for (name, version) in wanted {
        let want = name.as_bytes();
        let chain: Box<dyn Iterator<Item = usize>> = match t.hash_lookup(want)? {
            Some(candidates) => Box::new(candidates.into_iter()),
            None => Box::new(1..t.dynsym.len()),
        };
        let mut taken = None;
        let mut alone = None;
        let mut versioned = 0usize;
        for i in chain {
            let Some(s) = t.dynsym.get(i) else { continue };
            if !name_is(s, want) || !defines(s) {
                continue;
            }
            // A versioned reference reaching a definition in the very file it requires
            // the version of, when that file has no DT_VERSYM: glibc's `check_match`
            // asserts, and the process dies.
            if let Some(v) = version.filter(|v| !versions.has_versym() && v.file.is_some()) {
                if v.file == t.info.dynamic.soname {
                    bail!(
                        "a lookup of {name}@{} reaches its definition here, in the file it requires that version of, which has no symbol version table (DT_VERSYM): glibc's check_match fails its assertion and the process dies",
                        v.name
                    );
                }
            }
            match versions.matches(versions.versym(src, i)?, *version)? {
                symver::Match::Yes => {
                    taken = Some(s);
                    break;
                }
                symver::Match::No => {}
                symver::Match::OnlyIfAlone => {
                    versioned += 1;
                    if versioned == 1 {
                        alone = Some(s);
                    }
                }
            }
        }
        let taken = taken.or(if versioned == 1 { alone } else { None });
        if taken.is_some_and(binds_globally) {
            out.insert(name.to_string());
        }
    }
    src.check_len()?;
    Ok(out)
}

/// The version each of `names` is referenced with by the object at `path`: its first
/// `.dynsym` entry of that name, through `DT_VERSYM` to the version it requires; `None`
/// for an unversioned reference (or a name the object does not have).
pub fn reference_versions(
    path: &Path,
    names: &[&str],
) -> Result<BTreeMap<String, Option<Version>>> {
    Source::with_file(path, |src| {
        let mut out: BTreeMap<String, Option<Version>> =
            names.iter().map(|n| (n.to_string(), None)).collect();
        let Some(t) = tables_if_dynamic(src)? else {
            return Ok(out);
        };
        let versions = symver::read(src, &t.info)
            .with_context(|| format!("{}: its symbol version tables", src.name().display()))?;
        if !versions.has_versym() {
            return Ok(out);
        }
        let e = t.endian;
        let mut left: BTreeSet<&str> = names.iter().copied().collect();
        for (i, s) in t.dynsym.iter().enumerate().skip(1) {
            if left.is_empty() {
                break;
            }
            let Some(n) = usize::try_from(s.st_name(e))
                .ok()
                .and_then(|o| t.dynstr.get(o..))
                .and_then(|rest| {
                    let rest = &rest[..rest.len().min(MAX_NAME + 1)];
                    std::str::from_utf8(&rest[..memchr::memchr(0, rest)?]).ok()
                })
            else {
                continue;
            };
            if !left.remove(n) {
                continue;
            }
            if let Some(raw) = versions.versym(src, i)? {
                // A version whose hash is 0 is looked up unversioned (`RESOLVE_MAP`).
                let v = versions.version_of(raw)?.filter(|v| v.hash != 0).cloned();
                out.insert(n.to_string(), v);
            }
        }
        src.check_len()?;
        Ok(out)
    })
}

/// One 8-byte word the dynamic linker fills with the address of a `nccl*` symbol it looks
/// up by name: a GOT entry (`GLOB_DAT`), a PLT slot (`JUMP_SLOT`) or an absolute address
/// (`R_X86_64_64`, `R_AARCH64_ABS64`). What a running process holds there says where its
/// calls go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NcclSlot {
    pub name: String,
    /// The slot's link-time virtual address (`r_offset`): add the load base.
    pub vaddr: u64,
    /// `GLOB_DAT`, `JUMP_SLOT` or `ABS64`.
    pub kind: &'static str,
}

/// The `nccl*` slots of one library, and what places them in a process.
#[derive(Debug, Clone)]
pub struct NcclSlots {
    /// In the relocation tables' order, at most [`MAX_NAMES`] × 4.
    pub slots: Vec<NcclSlot>,
    /// `(p_offset, p_vaddr)` of the first `PT_LOAD`: the mapping of the page holding
    /// `p_offset` starts at the load base plus `p_vaddr`'s page.
    pub first_load: Option<(u64, u64)>,
    /// `(st_dev, st_ino)` of the file read, from its open descriptor.
    pub file_id: Option<(u64, u64)>,
}

/// The slots in the library at `path` that the dynamic linker fills with a `nccl*`
/// symbol's address ([`NcclSlot`]), read from its dynamic relocation tables. A file
/// without dynamic symbols has none.
pub fn nccl_slots(path: &Path) -> Result<NcclSlots> {
    Source::with_file(path, |src| {
        let file_id = src.file_id();
        let Some(t) = tables_if_dynamic(src)? else {
            return Ok(NcclSlots {
                slots: Vec::new(),
                first_load: None,
                file_id,
            });
        };
        let out = t.nccl_slots()?;
        src.check_len()?;
        Ok(NcclSlots {
            slots: out,
            first_load: t
                .info
                .segments
                .iter()
                .find(|s| s.p_type == elf::PT_LOAD)
                .map(|s| (s.offset, s.vaddr)),
            file_id,
        })
    })
}

/// The 8-byte slot kinds of [`NcclSlot`], by machine.
fn slot_kind(machine: u16, r_type: u32) -> Option<&'static str> {
    match (machine, r_type) {
        (elf::EM_X86_64, elf::R_X86_64_GLOB_DAT) | (elf::EM_AARCH64, elf::R_AARCH64_GLOB_DAT) => {
            Some("GLOB_DAT")
        }
        (elf::EM_X86_64, elf::R_X86_64_JUMP_SLOT) | (elf::EM_AARCH64, elf::R_AARCH64_JUMP_SLOT) => {
            Some("JUMP_SLOT")
        }
        (elf::EM_X86_64, elf::R_X86_64_64) | (elf::EM_AARCH64, elf::R_AARCH64_ABS64) => {
            Some("ABS64")
        }
        _ => None,
    }
}

/// Whether the object at `path` imports the function `name` (an undefined `.dynsym`
/// entry), e.g. `dlopen`: what says it can load code no file names.
pub fn imports(path: &Path, name: &str) -> Result<bool> {
    Source::with_file(path, |src| imports_in(src, name))
}

/// The `nccl*` functions the object at `path` imports (undefined `.dynsym` functions):
/// the calls it makes that bind by scope. Reads `.dynsym` alone.
pub fn imported_nccl(path: &Path) -> Result<BTreeSet<String>> {
    Source::with_file(path, imported_nccl_in)
}

/// [`imported_nccl`] of a file already open.
pub fn imported_nccl_in(src: &Source<'_>) -> Result<BTreeSet<String>> {
    {
        let Some(t) = tables_if_dynamic(src)? else {
            return Ok(BTreeSet::new());
        };
        // Undefined first: most symbols of a large library are definitions, and the name
        // is looked at only for the rest.
        let e = t.endian;
        let mut out = BTreeSet::new();
        for s in t.dynsym.iter().skip(1) {
            if s.st_shndx(e) != elf::SHN_UNDEF
                || !matches!(
                    s.st_type(),
                    elf::STT_FUNC | elf::STT_NOTYPE | elf::STT_GNU_IFUNC
                )
            {
                continue;
            }
            if let Some(name) = nccl_name(t.dynstr, s.st_name(e)) {
                if out.len() >= MAX_NAMES && !out.contains(name) {
                    bail!(
                        "{}: more than {MAX_NAMES} nccl* functions in .dynsym; the file is corrupt",
                        t.name()
                    );
                }
                out.insert(name.to_string());
            }
        }
        src.check_len()?;
        Ok(out)
    }
}

fn imports_in(src: &Source<'_>, name: &str) -> Result<bool> {
    let Some(t) = tables_if_dynamic(src)? else {
        return Ok(false);
    };
    let e = t.endian;
    let want = name.as_bytes();
    Ok(t.dynsym.iter().skip(1).any(|s| {
        s.st_shndx(e) == elf::SHN_UNDEF
            && usize::try_from(s.st_name(e))
                .ok()
                .and_then(|o| t.dynstr.get(o..))
                .is_some_and(|rest| rest.starts_with(want) && rest.get(want.len()) == Some(&0))
    }))
}

fn analyze_source(src: &Source<'_>) -> Result<Interposition> {
    let t = Tables::read(src)?;
    let candidates = t.dynamic_candidates()?;
    let Bound {
        mut by_name,
        exported_default,
        exported_default_relocated,
        linked_directly,
    } = bind_candidates(&t, &candidates)?;
    let imported: Vec<String> = candidates
        .iter()
        .filter(|(_, c)| !c.defined)
        .map(|(_, c)| c.name.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    // A static NCCL built with hidden visibility exports nothing: its functions are
    // only in .symtab (if not stripped). When .dynsym has any nccl* function, the
    // library's NCCL calls are those; .symtab's hidden nccl* helpers are then NCCL's
    // internals, which a preload need not replace, so they are not consulted.
    if by_name.is_empty() {
        // The linker turns hidden definitions into local ones in .symtab (visibility
        // reset to default), so hidden, static and version-script-local look alike:
        // one reason covers them.
        for name in t.symtab_definitions()? {
            let why = WHY_NOT_EXPORTED.to_string();
            merge(&mut by_name, name, Binding::BoundLocally { why });
        }
    }
    let symbols: Vec<SymbolBinding> = by_name
        .into_iter()
        .map(|(name, binding)| SymbolBinding { name, binding })
        .collect();

    let verdict = if symbols.is_empty() {
        // Stripped and hidden: nothing names NCCL's functions, but its self-id says it
        // is compiled in, and then its calls can only bind inside the library.
        match t.self_id()? {
            Some(id) => Verdict::PreloadIneffective {
                bound: Vec::new(),
                why: format!(
                    "NCCL {}+cuda{} is compiled in (its self-id is in .rodata) but no nccl* function is exported or listed: its symbols are hidden and stripped, so its calls bind inside the library",
                    id.nccl, id.cuda
                ),
            },
            None => Verdict::NoNccl,
        }
    } else {
        verdict_for(&symbols)
    };
    src.check_len()?;
    Ok(Interposition {
        symbolic: t.symbolic,
        symbolic_functions_hint: !t.symbolic
            && exported_default > 0
            && exported_default_relocated == 0
            && linked_directly > 0,
        symbols,
        verdict,
        imported,
    })
}

/// How strongly a binding keeps calls inside the library; when one name has several
/// symbols (versions), the strongest is reported.
fn rank(b: &Binding) -> u8 {
    match b {
        Binding::NeverCalled => 0,
        Binding::Imported => 1,
        Binding::Interposable => 2,
        Binding::Uncertain { .. } => 3,
        Binding::BoundLocally { .. } => 4,
    }
}

fn merge(map: &mut BTreeMap<String, Binding>, name: String, b: Binding) {
    match map.get_mut(&name) {
        Some(old) if rank(&b) > rank(old) => *old = b,
        Some(_) => {}
        None => {
            map.insert(name, b);
        }
    }
}

/// The `.dynsym` candidates' bindings by name, with the counts behind
/// [`Interposition::symbolic_functions_hint`].
struct Bound {
    by_name: BTreeMap<String, Binding>,
    /// Defined, exported, default visibility.
    exported_default: usize,
    /// Of those, the ones a relocation names.
    exported_default_relocated: usize,
    /// Of those, the ones reached only by code or data bound at link time.
    linked_directly: usize,
}

/// Whether a definition's calls can be bound at link time, so that where no relocation
/// names it only its code and data can tell whether it is called.
fn exported_definition(c: &Candidate) -> bool {
    c.defined && c.bind != elf::STB_LOCAL && matches!(c.vis, elf::STV_DEFAULT | elf::STV_PROTECTED)
}

fn bind_candidates(t: &Tables<'_>, candidates: &[(u32, Candidate)]) -> Result<Bound> {
    let relocated = t.relocated(candidates)?;
    // The code is read only for definitions no relocation names, and only for them.
    let unnamed: Vec<u64> = candidates
        .iter()
        .filter(|(i, c)| exported_definition(c) && !relocated.contains(i))
        .map(|(_, c)| c.value)
        .collect();
    let reached = if unnamed.is_empty() {
        BTreeMap::new()
    } else {
        t.references(&unnamed)?
    };
    let mut out = Bound {
        by_name: BTreeMap::new(),
        exported_default: 0,
        exported_default_relocated: 0,
        linked_directly: 0,
    };
    for (index, c) in candidates {
        let has_reloc = relocated.contains(index);
        let r = reached
            .get(&c.value)
            .filter(|_| !has_reloc && exported_definition(c));
        if c.defined && c.bind != elf::STB_LOCAL && c.vis == elf::STV_DEFAULT {
            out.exported_default += 1;
            out.exported_default_relocated += usize::from(has_reloc);
            out.linked_directly +=
                usize::from(matches!(r, Some(Reached::Code { .. } | Reached::Data)));
        }
        merge(
            &mut out.by_name,
            c.name.clone(),
            dynsym_binding(c, t.symbolic, has_reloc, r),
        );
    }
    Ok(out)
}

/// The binding of a `.dynsym` function: `st_bind`/`st_other` of the symbol, whether the
/// library is `-Bsymbolic`, whether a dynamic relocation names it, and, where none does,
/// what in the library refers to its entry (`None`: not looked for).
fn dynsym_binding(
    c: &Candidate,
    symbolic: bool,
    relocated: bool,
    reached: Option<&Reached>,
) -> Binding {
    let why = if !c.defined {
        return Binding::Imported;
    } else if c.bind == elf::STB_LOCAL {
        WHY_LOCAL
    } else if matches!(c.vis, elf::STV_HIDDEN | elf::STV_INTERNAL) {
        WHY_HIDDEN
    } else if !relocated {
        // What the relocations cannot show, the code and data do.
        let direct = match reached {
            Some(Reached::Code { .. }) => WHY_DIRECT,
            Some(Reached::Data) => WHY_IN_DATA,
            Some(Reached::Unconfirmed(why)) => {
                return Binding::Uncertain {
                    why: format!("no relocation names it, and it may be called directly: {why}"),
                }
            }
            Some(Reached::Nothing) | None => return Binding::NeverCalled,
        };
        if c.vis == elf::STV_PROTECTED {
            WHY_PROTECTED
        } else if symbolic {
            WHY_SYMBOLIC
        } else {
            direct
        }
    } else if c.vis == elf::STV_PROTECTED {
        WHY_PROTECTED
    } else if symbolic {
        WHY_SYMBOLIC
    } else {
        return Binding::Interposable;
    };
    Binding::BoundLocally {
        why: why.to_string(),
    }
}

fn verdict_for(symbols: &[SymbolBinding]) -> Verdict {
    let mut bound = Vec::new();
    let mut reasons: Vec<&str> = Vec::new();
    // A function the library never calls is no call a preload must replace; one it may
    // call directly (unconfirmed) is counted as bound, with the doubt as its reason.
    let calls = symbols.iter().filter(|s| s.binding.is_call()).count();
    for s in symbols {
        if let Binding::BoundLocally { why } | Binding::Uncertain { why } = &s.binding {
            bound.push(s.name.clone());
            if !reasons.contains(&why.as_str()) {
                reasons.push(why);
            }
        }
    }
    if bound.is_empty() {
        return Verdict::PreloadTakesEffect;
    }
    Verdict::PreloadIneffective {
        why: format!(
            "{} of {} nccl* functions bind inside the library, so a preloaded libnccl.so.2 does not replace them: {}",
            bound.len(),
            calls,
            reasons.join("; ")
        ),
        bound,
    }
}

/// The name at `offset` in a string table if it is an NCCL function name (`nccl*`, or
/// `pnccl*`, NCCL's profiling aliases). Looks at most [`MAX_NAME`] bytes.
fn nccl_name(strtab: &[u8], offset: u32) -> Option<&str> {
    let rest = strtab.get(usize::try_from(offset).ok()?..)?;
    // The prefix first: most names are not NCCL's, and then no terminator is looked for.
    if !(rest.starts_with(b"nccl") || rest.starts_with(b"pnccl")) {
        return None;
    }
    let rest = &rest[..rest.len().min(MAX_NAME + 1)];
    let name = &rest[..memchr::memchr(0, rest)?];
    if !(name.starts_with(b"nccl") || name.starts_with(b"pnccl")) {
        return None;
    }
    std::str::from_utf8(name).ok()
}

/// Whether a relocation of this type has the dynamic linker look its symbol up and bind
/// to the result — what lets a preloaded definition win. GOT, PLT and absolute address
/// relocations do; on x86-64 so do the text relocations a non-PIC call leaves.
fn binds_by_name(machine: u16, r_type: u32) -> bool {
    match machine {
        elf::EM_X86_64 => matches!(
            r_type,
            elf::R_X86_64_64
                | elf::R_X86_64_PC32
                | elf::R_X86_64_32
                | elf::R_X86_64_32S
                | elf::R_X86_64_PC64
                | elf::R_X86_64_GLOB_DAT
                | elf::R_X86_64_JUMP_SLOT
        ),
        elf::EM_AARCH64 => matches!(
            r_type,
            elf::R_AARCH64_ABS64 | elf::R_AARCH64_GLOB_DAT | elf::R_AARCH64_JUMP_SLOT
        ),
        _ => false,
    }
}

/// The number of symbols a DT_GNU_HASH table covers: past the highest bucket's chain,
/// whose last entry has its low bit set. Reads only `table`, so a hostile one ends the
/// walk at its end.
fn gnu_hash_count(table: &[u8], endian: Endianness) -> Option<u64> {
    let word = |i: u64| -> Option<u32> {
        let at = usize::try_from(i.checked_mul(4)?).ok()?;
        let b = table.get(at..at.checked_add(4)?)?;
        Some(endian.read_u32_bytes([b[0], b[1], b[2], b[3]]))
    };
    let nbuckets = u64::from(word(0)?);
    let symoffset = u64::from(word(1)?);
    // Bloom words are 64-bit in ELF64: two u32 each.
    let buckets = 4u64.checked_add(u64::from(word(2)?).checked_mul(2)?)?;
    let chains = buckets.checked_add(nbuckets)?;
    let mut last = 0u64;
    for b in 0..nbuckets {
        last = last.max(u64::from(word(buckets + b)?));
    }
    if last < symoffset {
        return Some(symoffset);
    }
    let mut i = last;
    // Bounded by the table's end (`word` fails there) and by the symbol cap.
    while i - symoffset <= MAX_DYNSYM {
        if word(chains.checked_add(i - symoffset)?)? & 1 != 0 {
            return i.checked_add(1);
        }
        i += 1;
    }
    None
}

/// The entries of a DT_RELR table up to the one that would carry an address past
/// `u64::MAX`: an address entry relocates its own word, and each bitmap after it the 63
/// words that follow, which `object`'s iterator counts without wrapping.
fn relr_without_overflow(relr: &[Relr], e: Endianness) -> &[Relr] {
    let mut next = 0u64;
    for (i, r) in relr.iter().enumerate() {
        let entry = r.get(e);
        let last = if entry & 1 == 0 {
            next = entry;
            Some(entry)
        } else {
            next.checked_add(63 * 8).inspect(|&n| next = n)
        };
        if last.is_none() {
            return &relr[..i];
        }
    }
    relr
}

/// Byte ranges `(offset, length)` merged where they overlap, so that hostile tables
/// claiming the same bytes many times are read once.
fn merged(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.retain(|&(off, len)| len > 0 && off.checked_add(len).is_some());
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (off, len) in ranges {
        if let Some(last) = out.last_mut() {
            let end = last.0 + last.1;
            if off < end {
                last.1 = end.max(off + len) - last.0;
                continue;
            }
        }
        out.push((off, len));
    }
    out
}

/// A `nccl*` function symbol of `.dynsym`.
struct Candidate {
    name: String,
    defined: bool,
    bind: u8,
    vis: u8,
    /// `st_value`: the entry (for an IFUNC, its resolver).
    value: u64,
}

/// The dynamic-table entries the analysis needs.
#[derive(Default)]
struct DynTags {
    symbolic: bool,
    symtab: Option<u64>,
    strtab: Option<u64>,
    strsz: Option<u64>,
    hash: Option<u64>,
    gnu_hash: Option<u64>,
    jmprel: Option<u64>,
    pltrelsz: Option<u64>,
    pltrel: Option<u64>,
    rela: Option<u64>,
    relasz: Option<u64>,
    rel: Option<u64>,
    relsz: Option<u64>,
    relr: Option<u64>,
    relrsz: Option<u64>,
}

/// The tables of one 64-bit ELF library, found as the loader finds them: through the
/// dynamic table, with the section headers only where it says nothing.
struct Tables<'a> {
    src: &'a Source<'a>,
    data: &'a [u8],
    endian: Endianness,
    machine: u16,
    info: ElfInfo,
    sections: Option<SectionTable<'a, Header>>,
    tags: DynTags,
    symbolic: bool,
    dynsym: &'a [Sym],
    dynstr: &'a [u8],
    /// Index of the SHT_DYNSYM section, to match relocation sections to it.
    dynsym_section: Option<usize>,
}

impl<'a> Tables<'a> {
    fn read(src: &'a Source<'a>) -> Result<Tables<'a>> {
        let name = src.name().display().to_string();
        if src.is_empty() {
            bail!("{name} is empty (0 bytes), not a shared library: the download or copy was probably interrupted; fetch it again");
        }
        src.check_len()?;
        let head = src.bytes_clipped(0, 16);
        if head.len() < 16 && elf::ELFMAG.starts_with(&head[..head.len().min(4)]) {
            bail!("{name} is truncated: {} bytes, shorter than an ELF identification; re-download or re-copy it", head.len());
        }
        if !fdl_elf::is_elf(head) {
            bail!("{name} is not an ELF file (no ELF magic): pass a shared library such as libtorch_cuda.so or libnccl.so.2");
        }
        match head.get(4) {
            Some(&elf::ELFCLASS64) => {}
            Some(&elf::ELFCLASS32) => bail!(
                "{name} is a 32-bit ELF file: interposition analysis supports 64-bit libraries (x86-64, aarch64) only"
            ),
            _ => bail!("{name}: unknown ELF class: the file is corrupt or not a Linux shared library"),
        }
        // Section, segment and truncation checks, shared with inspection.
        let info = fdl_elf::parse(src)?;
        if !matches!(info.machine, elf::EM_X86_64 | elf::EM_AARCH64) {
            bail!(
                "{name} is for ELF machine {}: interposition analysis knows the relocations of x86-64 and aarch64 only",
                info.machine
            );
        }
        let data = src.bytes(0, src.len())?;
        let bad = |what: &str, e: object::read::Error| {
            anyhow!("{name}: {what}: {e}; the file is corrupt")
        };
        let header = Header::parse(data).map_err(|e| bad("bad ELF header", e))?;
        let endian = header.endian().map_err(|e| bad("bad ELF byte order", e))?;
        let sections = header.sections(endian, data).ok().filter(|s| !s.is_empty());
        let mut t = Tables {
            src,
            data,
            endian,
            machine: info.machine,
            info,
            sections,
            tags: DynTags::default(),
            symbolic: false,
            dynsym: &[],
            dynstr: &[],
            dynsym_section: None,
        };
        t.tags = t.dyn_tags()?;
        t.symbolic = t.tags.symbolic;
        t.read_dynsym()?;
        Ok(t)
    }

    fn name(&self) -> String {
        self.src.name().display().to_string()
    }

    /// `len` bytes at virtual address `addr`, through the load segments.
    fn at_addr(&self, addr: u64, len: u64, what: &str) -> Result<&'a [u8]> {
        let off = self.info.vaddr_to_offset(addr, len).with_context(|| {
            format!(
                "{}: {what} ({len} bytes at address {addr:#x}) lies outside the file's loaded segments: the file is truncated or corrupt",
                self.name()
            )
        })?;
        self.src.bytes(off, len)
    }

    fn dyn_tags(&self) -> Result<DynTags> {
        // PT_DYNAMIC is what the loader reads; the section is the fallback.
        let region = self
            .info
            .segments
            .iter()
            .find(|s| s.p_type == elf::PT_DYNAMIC)
            .map(|s| (s.offset, s.filesz))
            .or_else(|| {
                self.info
                    .sections
                    .iter()
                    .find(|s| s.sh_type == elf::SHT_DYNAMIC)
                    .map(|s| (s.offset, s.size))
            });
        let Some((off, size)) = region else {
            return Err(NoDynamicSymbols(format!(
                "{} has no dynamic table: it is not a shared library (or is statically linked), so LD_PRELOAD cannot interpose anything in it",
                self.name()
            ))
            .into());
        };
        let bytes = self.src.bytes(off, size).with_context(|| {
            format!(
                "{}: the dynamic table lies past the end of the file",
                self.name()
            )
        })?;
        let count = bytes.len() / std::mem::size_of::<Dyn>();
        let (entries, _) = object::pod::slice_from_bytes::<Dyn>(bytes, count)
            .map_err(|()| anyhow!("{}: the dynamic table is unreadable", self.name()))?;
        let e = self.endian;
        let mut t = DynTags::default();
        for d in entries {
            let val: u64 = d.d_val(e);
            let Some(tag) = d.tag32(e) else { continue };
            match tag {
                elf::DT_NULL => break,
                elf::DT_SYMBOLIC => t.symbolic = true,
                elf::DT_FLAGS if val & u64::from(elf::DF_SYMBOLIC) != 0 => t.symbolic = true,
                elf::DT_SYMTAB => t.symtab = Some(val),
                elf::DT_STRTAB => t.strtab = Some(val),
                elf::DT_STRSZ => t.strsz = Some(val),
                elf::DT_HASH => t.hash = Some(val),
                elf::DT_GNU_HASH => t.gnu_hash = Some(val),
                elf::DT_JMPREL => t.jmprel = Some(val),
                elf::DT_PLTRELSZ => t.pltrelsz = Some(val),
                elf::DT_PLTREL => t.pltrel = Some(val),
                elf::DT_RELA => t.rela = Some(val),
                elf::DT_RELASZ => t.relasz = Some(val),
                elf::DT_REL => t.rel = Some(val),
                elf::DT_RELSZ => t.relsz = Some(val),
                DT_RELRSZ => t.relrsz = Some(val),
                DT_RELR => t.relr = Some(val),
                _ => {}
            }
        }
        Ok(t)
    }

    /// Finds `.dynsym` and its string table: DT_SYMTAB/DT_STRTAB, with the symbol count
    /// from the section at that address, else DT_HASH, else DT_GNU_HASH (the dynamic
    /// table does not say it); without DT_SYMTAB, the SHT_DYNSYM section.
    fn read_dynsym(&mut self) -> Result<()> {
        let name = self.name();
        let e = self.endian;
        let dynsym_section = self.sections.as_ref().and_then(|table| {
            table
                .iter()
                .enumerate()
                .find(|(_, s)| s.sh_type(e) == elf::SHT_DYNSYM)
        });
        self.dynsym_section = dynsym_section.map(|(i, _)| i);
        let Some(addr) = self.tags.symtab else {
            let Some((_, sh)) = dynsym_section else {
                return Err(NoDynamicSymbols(format!("{name} has no dynamic symbol table (neither DT_SYMTAB nor .dynsym): it exports and imports nothing")).into());
            };
            let table = self.sections.as_ref().expect("a section was found in it");
            self.dynsym = sh
                .data_as_array(e, self.data)
                .map_err(|err| anyhow!("{name}: .dynsym is unreadable: {err}"))?;
            self.dynstr = table
                .section(object::SectionIndex(sh.sh_link(e) as usize))
                .ok()
                .and_then(|s| s.data(e, self.data).ok())
                .with_context(|| format!("{name}: the string table of .dynsym is unreadable"))?;
            return Ok(());
        };
        let from_section = dynsym_section
            .filter(|(_, s)| s.sh_addr(e) == addr)
            .map(|(_, s)| s.sh_size(e) / SYM_SIZE);
        let count = match from_section {
            Some(n) => n,
            None => self.count_from_hash()?,
        };
        if count > MAX_DYNSYM {
            bail!("{name}: the dynamic symbol table claims {count} symbols, more than the {MAX_DYNSYM} fdl reads; the file is corrupt");
        }
        let len = count.checked_mul(SYM_SIZE).with_context(|| {
            format!("{name}: the dynamic symbol table claims {count} symbols; the file is corrupt")
        })?;
        let bytes = self.at_addr(addr, len, "the dynamic symbol table (DT_SYMTAB)")?;
        self.dynsym = object::pod::slice_from_bytes::<Sym>(bytes, count as usize)
            .map(|(s, _)| s)
            .map_err(|()| anyhow!("{name}: the dynamic symbol table is unreadable"))?;
        let strtab = self
            .tags
            .strtab
            .with_context(|| format!("{name}: the dynamic table has no DT_STRTAB"))?;
        self.dynstr = match self.tags.strsz {
            Some(size) => self.at_addr(strtab, size, "the dynamic string table (DT_STRTAB)")?,
            // Without a size, up to the end of the file; names are read bounded anyway.
            None => {
                let off = self
                    .info
                    .vaddr_to_offset(strtab, 0)
                    .with_context(|| format!("{name}: DT_STRTAB points outside the file"))?;
                self.src.bytes_clipped(off, u64::MAX)
            }
        };
        Ok(())
    }

    /// The `.dynsym` indices the object's hash table lists under `name`'s hash: `None`
    /// when it has no hash table (the caller then scans). A hash table the dynamic table
    /// names but that cannot be read, or whose chain loops, is an error: the loader would
    /// fault or never finish its lookup there, so no answer can rest on it.
    ///
    /// A chain walk is bounded by the symbols `.dynsym` holds (a chain never lists more)
    /// and by the chain entries the file holds, so it costs at most what the file is.
    fn hash_lookup(&self, name: &[u8]) -> Result<Option<Vec<usize>>> {
        let e = self.endian;
        let obj = self.name();
        let words = |addr: u64, tag: &str| -> Result<&'a [u8]> {
            let off = self.info.vaddr_to_offset(addr, 16).with_context(|| {
                format!("{obj}: its {tag} table (at address {addr:#x}) lies outside the file's loaded segments: the file is truncated or corrupt")
            })?;
            Ok(self.src.bytes_clipped(off, u64::MAX))
        };
        let word = |table: &[u8], i: u64| -> Option<u32> {
            let at = usize::try_from(i.checked_mul(4)?).ok()?;
            let b = table.get(at..at.checked_add(4)?)?;
            Some(e.read_u32_bytes([b[0], b[1], b[2], b[3]]))
        };
        let symbols = self.dynsym.len() as u64;
        if let Some(addr) = self.tags.gnu_hash {
            let table = words(addr, "DT_GNU_HASH")?;
            let corrupt = || anyhow!("{obj}: its DT_GNU_HASH table is truncated or corrupt");
            let h = elf::gnu_hash(name);
            let nbuckets = u64::from(word(table, 0).ok_or_else(corrupt)?);
            let symoffset = u64::from(word(table, 1).ok_or_else(corrupt)?);
            let bloom_words = u64::from(word(table, 2).ok_or_else(corrupt)?);
            if nbuckets == 0 {
                return Ok(Some(Vec::new()));
            }
            // The Bloom filter (64-bit words in ELF64) only speeds up misses; the chains
            // decide, so it is not consulted.
            let buckets = bloom_words
                .checked_mul(2)
                .and_then(|b| b.checked_add(4))
                .ok_or_else(corrupt)?;
            let chains = buckets.checked_add(nbuckets).ok_or_else(corrupt)?;
            let mut i =
                u64::from(word(table, buckets + u64::from(h) % nbuckets).ok_or_else(corrupt)?);
            let mut out = Vec::new();
            if i < symoffset {
                return Ok(Some(out));
            }
            // A chain ends at an entry with its low bit set; a hostile one that never does
            // ends where the table or the symbol count does.
            while i < symbols {
                let Some(h2) = chains
                    .checked_add(i - symoffset)
                    .and_then(|at| word(table, at))
                else {
                    break;
                };
                if h2 | 1 == h | 1 {
                    out.push(i as usize);
                }
                if h2 & 1 != 0 {
                    break;
                }
                i += 1;
            }
            return Ok(Some(out));
        }
        if let Some(addr) = self.tags.hash {
            let table = words(addr, "DT_HASH")?;
            let corrupt = || anyhow!("{obj}: its DT_HASH table is truncated or corrupt");
            // SysV hash: nbucket, nchain, buckets, chains.
            let h = elf::hash(name);
            let nbucket = u64::from(word(table, 0).ok_or_else(corrupt)?);
            let nchain = u64::from(word(table, 1).ok_or_else(corrupt)?);
            if nbucket == 0 {
                return Ok(Some(Vec::new()));
            }
            // The chain entries that exist: claimed, in the file, and one per symbol.
            let in_file = (table.len() as u64 / 4).saturating_sub(2 + nbucket);
            let entries = nchain.min(in_file).min(symbols);
            let mut i = u64::from(word(table, 2 + u64::from(h) % nbucket).ok_or_else(corrupt)?);
            let mut out = Vec::new();
            while i != 0 && i < entries {
                // Each step lists a different symbol, or the chain has come round.
                if out.len() as u64 >= entries {
                    bail!(
                        "{obj}: a chain of its DT_HASH table loops (it passes symbol {i} again after {} steps): the loader would never finish looking up a name there",
                        out.len()
                    );
                }
                out.push(i as usize);
                i = u64::from(word(table, 2 + nbucket + i).ok_or_else(corrupt)?);
            }
            return Ok(Some(out));
        }
        Ok(None)
    }

    fn count_from_hash(&self) -> Result<u64> {
        let name = self.name();
        let rest = |addr: u64| -> Result<&'a [u8]> {
            let tag = if self.tags.hash == Some(addr) {
                "DT_HASH"
            } else {
                "DT_GNU_HASH"
            };
            let off = self.info.vaddr_to_offset(addr, 16).with_context(|| {
                format!(
                    "{name}: the symbol hash table ({tag}) lies outside the file's loaded segments"
                )
            })?;
            Ok(self.src.bytes_clipped(off, u64::MAX))
        };
        if let Some(addr) = self.tags.hash {
            // nbucket, nchain: one chain entry per symbol.
            let nchain = rest(addr)?
                .get(4..8)
                .with_context(|| format!("{name}: the symbol hash table (DT_HASH) is truncated"))?;
            let nchain = [nchain[0], nchain[1], nchain[2], nchain[3]];
            return Ok(u64::from(self.endian.read_u32_bytes(nchain)));
        }
        if let Some(addr) = self.tags.gnu_hash {
            return gnu_hash_count(rest(addr)?, self.endian).with_context(|| {
                format!("{name}: the GNU hash table is corrupt; cannot tell how many dynamic symbols there are")
            });
        }
        bail!("{name}: neither a .dynsym section nor a hash table says how many dynamic symbols there are")
    }

    /// The `nccl*` function symbols of `.dynsym`, by index.
    fn dynamic_candidates(&self) -> Result<Vec<(u32, Candidate)>> {
        let e = self.endian;
        let mut out = Vec::new();
        // Index 0 is the null symbol.
        for (index, s) in self.dynsym.iter().enumerate().skip(1) {
            let Some(name) = nccl_name(self.dynstr, s.st_name(e)) else {
                continue;
            };
            let defined = s.st_shndx(e) != elf::SHN_UNDEF;
            let function = match s.st_type() {
                elf::STT_FUNC | elf::STT_GNU_IFUNC => true,
                elf::STT_NOTYPE => !defined,
                _ => false,
            };
            if !function {
                continue;
            }
            // Counting entries, not names: repeats of one long name must not grow
            // memory beyond the bound either.
            if out.len() >= MAX_NAMES {
                bail!(
                    "{}: more than {MAX_NAMES} nccl* functions in .dynsym; the file is corrupt",
                    self.name()
                );
            }
            out.push((
                index as u32,
                Candidate {
                    name: name.to_string(),
                    defined,
                    bind: s.st_bind(),
                    vis: s.st_visibility(),
                    value: s.st_value(e),
                },
            ));
        }
        Ok(out)
    }

    /// The dynamic relocation tables as (offset, length, is RELA): from DT_JMPREL,
    /// DT_RELA and DT_REL, else from the allocated SHT_RELA/SHT_REL sections that
    /// relocate against `.dynsym`.
    fn relocation_tables(&self) -> Result<Vec<(u64, u64, bool)>> {
        let t = &self.tags;
        let mut tables = Vec::new();
        let mut by_addr = |addr: Option<u64>, size: Option<u64>, rela: bool, what: &str| {
            if let (Some(addr), Some(size)) = (addr, size) {
                let off = self.info.vaddr_to_offset(addr, size).with_context(|| {
                    format!(
                        "{}: {what} ({size} bytes at {addr:#x}) lies outside the file's loaded segments: the file is truncated or corrupt",
                        self.name()
                    )
                })?;
                tables.push((off, size, rela));
            }
            anyhow::Ok(())
        };
        let plt_rela = t.pltrel != Some(u64::from(elf::DT_REL));
        by_addr(
            t.jmprel,
            t.pltrelsz,
            plt_rela,
            "the PLT relocations (DT_JMPREL)",
        )?;
        by_addr(t.rela, t.relasz, true, "the RELA relocations (DT_RELA)")?;
        by_addr(t.rel, t.relsz, false, "the REL relocations (DT_REL)")?;
        if tables.is_empty() {
            if let (Some(sections), Some(dynsym)) = (&self.sections, self.dynsym_section) {
                let e = self.endian;
                for sh in sections.iter() {
                    let ty = sh.sh_type(e);
                    if (ty == elf::SHT_RELA || ty == elf::SHT_REL)
                        && sh.sh_flags(e) & u64::from(elf::SHF_ALLOC) != 0
                        && sh.sh_link(e) as usize == dynsym
                    {
                        tables.push((sh.sh_offset(e), sh.sh_size(e), ty == elf::SHT_RELA));
                    }
                }
            }
        }
        // Each format's tables merged, so no byte is read twice for one format.
        let mut out = Vec::new();
        for rela in [true, false] {
            let ranges = tables
                .iter()
                .filter(|&&(_, _, r)| r == rela)
                .map(|&(off, len, _)| (off, len))
                .collect();
            out.extend(merged(ranges).into_iter().map(|(o, l)| (o, l, rela)));
        }
        Ok(out)
    }

    /// The [`NcclSlot`]s of the dynamic relocation tables, at most [`MAX_NAMES`] × 4.
    fn nccl_slots(&self) -> Result<Vec<NcclSlot>> {
        let e = self.endian;
        let mut out = Vec::new();
        for (off, len, rela) in self.relocation_tables()? {
            let bytes = self.src.bytes(off, len).with_context(|| {
                format!(
                    "{}: a dynamic relocation table lies past the end of the file",
                    self.name()
                )
            })?;
            let mut add = |sym: u32, ty: u32, vaddr: u64| -> Result<()> {
                let Some(kind) = slot_kind(self.machine, ty) else {
                    return Ok(());
                };
                let Some(s) = usize::try_from(sym).ok().and_then(|i| self.dynsym.get(i)) else {
                    return Ok(());
                };
                let Some(name) = nccl_name(self.dynstr, s.st_name(e)) else {
                    return Ok(());
                };
                if out.len() >= MAX_NAMES * 4 {
                    bail!(
                        "{}: more than {} nccl* relocations; the file is corrupt",
                        self.name(),
                        MAX_NAMES * 4
                    );
                }
                out.push(NcclSlot {
                    name: name.to_string(),
                    vaddr,
                    kind,
                });
                Ok(())
            };
            if rela {
                let n = bytes.len() / std::mem::size_of::<Rela>();
                let (relocs, _) = object::pod::slice_from_bytes::<Rela>(bytes, n)
                    .map_err(|()| anyhow!("{}: unreadable RELA table", self.name()))?;
                for r in relocs {
                    add(r.r_sym(e, false), r.r_type(e, false), r.r_offset.get(e))?;
                }
            } else {
                let n = bytes.len() / std::mem::size_of::<Rel>();
                let (relocs, _) = object::pod::slice_from_bytes::<Rel>(bytes, n)
                    .map_err(|()| anyhow!("{}: unreadable REL table", self.name()))?;
                for r in relocs {
                    add(r.r_sym(e), r.r_type(e), r.r_offset.get(e))?;
                }
            }
        }
        Ok(out)
    }

    /// The indices among `candidates` that a dynamic relocation resolved by symbol
    /// lookup names.
    fn relocated(&self, candidates: &[(u32, Candidate)]) -> Result<BTreeSet<u32>> {
        let wanted: HashSet<u32> = candidates
            .iter()
            .filter(|(_, c)| c.defined)
            .map(|(i, _)| *i)
            .collect();
        let mut found = BTreeSet::new();
        if wanted.is_empty() {
            return Ok(found);
        }
        let e = self.endian;
        for (off, len, rela) in self.relocation_tables()? {
            let bytes = self.src.bytes(off, len).with_context(|| {
                format!(
                    "{}: a dynamic relocation table lies past the end of the file",
                    self.name()
                )
            })?;
            let mut check = |sym: u32, ty: u32| {
                if sym != 0 && wanted.contains(&sym) && binds_by_name(self.machine, ty) {
                    found.insert(sym);
                }
            };
            if rela {
                let n = bytes.len() / std::mem::size_of::<Rela>();
                let (relocs, _) = object::pod::slice_from_bytes::<Rela>(bytes, n)
                    .map_err(|()| anyhow!("{}: unreadable RELA table", self.name()))?;
                for r in relocs {
                    check(r.r_sym(e, false), r.r_type(e, false));
                }
            } else {
                let n = bytes.len() / std::mem::size_of::<Rel>();
                let (relocs, _) = object::pod::slice_from_bytes::<Rel>(bytes, n)
                    .map_err(|()| anyhow!("{}: unreadable REL table", self.name()))?;
                for r in relocs {
                    check(r.r_sym(e), r.r_type(e));
                }
            }
        }
        Ok(found)
    }

    /// What in the library refers to each of `targets` (entries of definitions no
    /// relocation names): its code, a RELATIVE relocation, or nothing.
    fn references(&self, targets: &[u64]) -> Result<BTreeMap<u64, Reached>> {
        let e = self.endian;
        // Executable sections, else executable load segments.
        let mut code: Vec<(u64, &[u8])> = Vec::new();
        let exec_sections: Vec<_> = self
            .info
            .sections
            .iter()
            .filter(|s| s.flags & u64::from(elf::SHF_EXECINSTR) != 0 && s.has_file_bytes())
            .map(|s| (s.addr, s.offset, s.size))
            .collect();
        let code_is_sections = !exec_sections.is_empty();
        let regions: Vec<(u64, u64, u64)> = if exec_sections.is_empty() {
            self.info
                .segments
                .iter()
                .filter(|s| s.p_type == elf::PT_LOAD && s.flags & elf::PF_X != 0)
                .map(|s| (s.vaddr, s.offset, s.filesz))
                .collect()
        } else {
            exec_sections
        };
        for (addr, off, len) in regions {
            // What lies past the end of the file is not code fdl can read.
            code.push((addr, self.src.bytes_clipped(off, len)));
        }
        // Function ranges: .dynsym's, then .symtab's when there is one.
        let mut functions: Vec<(u64, u64)> = Vec::new();
        let mut add = |s: &Sym| {
            if s.st_shndx(e) != elf::SHN_UNDEF
                && matches!(s.st_type(), elf::STT_FUNC | elf::STT_GNU_IFUNC)
                && functions.len() < MAX_FUNCTIONS
            {
                functions.push((s.st_value(e), s.st_size(e)));
            }
        };
        self.dynsym.iter().for_each(&mut add);
        if let Some(sections) = &self.sections {
            // In file order, each byte once (hostile headers may name one table many
            // times), and no further than the cap.
            let mut tables: Vec<_> = sections
                .iter()
                .filter(|s| s.sh_type(e) == elf::SHT_SYMTAB)
                .collect();
            tables.sort_by_key(|s| s.sh_offset(e));
            let mut read_up_to = 0u64;
            for sh in tables {
                if sh.sh_offset(e) < read_up_to {
                    continue;
                }
                if let Ok(syms) = sh.data_as_array::<Sym, _>(e, self.data) {
                    read_up_to = sh.sh_offset(e).saturating_add(sh.sh_size(e));
                    for s in syms.iter().take(MAX_FUNCTIONS) {
                        add(s);
                    }
                }
            }
        }
        let wanted: BTreeSet<u64> = targets.iter().copied().collect();
        let (data_refs, data_unknown) = self.relative_addends(&wanted)?;
        let image = code_refs::Image {
            machine: self.machine,
            code,
            functions,
            data_refs,
            data_unknown,
            // Read only when a candidate needs a function's start.
            frames: Frames::find(&self.info, self.src),
            code_is_sections,
        };
        let found = code_refs::references(&image, targets, code_refs::Limits::default());
        Ok(targets.iter().copied().zip(found).collect())
    }

    /// The RELATIVE and IRELATIVE relocations' addends that are among `wanted`, and why
    /// some could not be read, if so.
    fn relative_addends(&self, wanted: &BTreeSet<u64>) -> Result<(BTreeSet<u64>, Option<String>)> {
        let e = self.endian;
        let (relative, irelative) = match self.machine {
            elf::EM_AARCH64 => (elf::R_AARCH64_RELATIVE, elf::R_AARCH64_IRELATIVE),
            _ => (elf::R_X86_64_RELATIVE, elf::R_X86_64_IRELATIVE),
        };
        let mut found = BTreeSet::new();
        let mut unknown = None;
        // The 8-byte word at a virtual address: the addend a REL or RELR entry keeps there.
        let word_at = |addr: u64| -> Option<u64> {
            let off = self.info.vaddr_to_offset(addr, 8)?;
            let b = self.src.bytes(off, 8).ok()?;
            Some(e.read_u64_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
        };
        for (off, len, rela) in self.relocation_tables()? {
            let Ok(bytes) = self.src.bytes(off, len) else {
                continue;
            };
            if rela {
                let n = bytes.len() / std::mem::size_of::<Rela>();
                let Ok((relocs, _)) = object::pod::slice_from_bytes::<Rela>(bytes, n) else {
                    continue;
                };
                for r in relocs {
                    let ty = r.r_type(e, false);
                    let addend = r.r_addend.get(e) as u64;
                    if (ty == relative || ty == irelative) && wanted.contains(&addend) {
                        found.insert(addend);
                    }
                }
            } else {
                let n = bytes.len() / std::mem::size_of::<Rel>();
                let Ok((relocs, _)) = object::pod::slice_from_bytes::<Rel>(bytes, n) else {
                    continue;
                };
                for r in relocs {
                    let ty = r.r_type(e);
                    if ty == relative || ty == irelative {
                        if let Some(v) = word_at(r.r_offset.get(e)).filter(|v| wanted.contains(v)) {
                            found.insert(v);
                        }
                    }
                }
            }
        }
        if let (Some(addr), Some(size)) = (self.tags.relr, self.tags.relrsz) {
            let table = self
                .info
                .vaddr_to_offset(addr, size)
                .and_then(|off| self.src.bytes(off, size).ok());
            match table {
                None => {
                    unknown = Some(format!(
                        "its packed relative relocations (DT_RELR, {size} bytes at {addr:#x}) lie outside the file, so whether data holds its address is not known"
                    ))
                }
                Some(table) => {
                    let n = table.len() / std::mem::size_of::<Relr>();
                    let relr = object::pod::slice_from_bytes::<Relr>(table, n).map_or(&[][..], |(r, _)| r);
                    let mut visited = 0u64;
                    for a in RelrIterator::<Header>::new(e, relr_without_overflow(relr, e)) {
                        visited += 1;
                        if let Some(v) = word_at(a).filter(|v| wanted.contains(v)) {
                            found.insert(v);
                        }
                        if visited > MAX_RELR {
                            unknown = Some(format!(
                                "its packed relative relocations (DT_RELR) relocate more than {MAX_RELR} places, more than fdl reads"
                            ));
                            break;
                        }
                    }
                }
            }
        }
        Ok((found, unknown))
    }

    /// The `nccl*` functions `.symtab` defines. Consulted only when `.dynsym` has none,
    /// so none of them is exported.
    fn symtab_definitions(&self) -> Result<BTreeSet<String>> {
        let mut out = BTreeSet::new();
        let Some(sections) = &self.sections else {
            return Ok(out);
        };
        let e = self.endian;
        // Symbol tables in file order; one overlapping bytes already read is skipped,
        // so hostile section headers cannot make the same bytes be read many times.
        let mut tables: Vec<_> = sections
            .iter()
            .filter(|s| s.sh_type(e) == elf::SHT_SYMTAB)
            .collect();
        tables.sort_by_key(|s| s.sh_offset(e));
        let mut read_up_to = 0u64;
        for sh in tables {
            if sh.sh_offset(e) < read_up_to {
                continue;
            }
            // A symbol table that cannot be read is like a stripped one.
            let Ok(syms) = sh.data_as_array::<Sym, _>(e, self.data) else {
                continue;
            };
            read_up_to = sh.sh_offset(e).saturating_add(sh.sh_size(e));
            let Some(strtab) = sections
                .section(object::SectionIndex(sh.sh_link(e) as usize))
                .ok()
                .and_then(|s| s.data(e, self.data).ok())
            else {
                continue;
            };
            for s in syms {
                if s.st_shndx(e) == elf::SHN_UNDEF
                    || !matches!(s.st_type(), elf::STT_FUNC | elf::STT_GNU_IFUNC)
                {
                    continue;
                }
                let Some(name) = nccl_name(strtab, s.st_name(e)) else {
                    continue;
                };
                if out.insert(name.to_string()) && out.len() > MAX_NAMES {
                    bail!(
                        "{}: more than {MAX_NAMES} distinct nccl* functions in .symtab; the file is corrupt",
                        self.name()
                    );
                }
            }
        }
        Ok(out)
    }

    /// NCCL's self-id in the `.rodata` sections (or, without a section table, the
    /// read-only load segments), scanned window by window; the first one found.
    fn self_id(&self) -> Result<Option<selfid::SelfId>> {
        let mut regions: Vec<(u64, u64)> = self
            .info
            .sections
            .iter()
            .filter(|s| s.name.starts_with(".rodata") && s.has_file_bytes())
            .map(|s| (s.offset, s.size))
            .collect();
        if self.info.sections.is_empty() {
            regions = self
                .info
                .segments
                .iter()
                .filter(|s| s.p_type == elf::PT_LOAD)
                .filter(|s| s.flags & (elf::PF_W | elf::PF_X) == 0)
                .map(|s| (s.offset, s.filesz))
                .collect();
        }
        let mut found = None;
        for (off, len) in merged(regions) {
            if off.checked_add(len).is_none_or(|end| end > self.src.len()) {
                continue;
            }
            self.src
                .find_iter(off, len, selfid::NEEDLE, 64, |_, rest| {
                    found = rest
                        .get(selfid::NEEDLE.len()..)
                        .and_then(selfid::parse_after_needle);
                    found.is_none()
                })?;
            if found.is_some() {
                break;
            }
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_names_are_recognised_within_bounds() {
        let strtab = b"\0ncclAllReduce\0pncclAllReduce\0torch_x\0_Z4ncclv\0nccl";
        assert_eq!(nccl_name(strtab, 1), Some("ncclAllReduce"));
        assert_eq!(nccl_name(strtab, 15), Some("pncclAllReduce"));
        assert_eq!(nccl_name(strtab, 30), None);
        assert_eq!(
            nccl_name(strtab, 38),
            None,
            "mangled C++ is not NCCL's C API"
        );
        assert_eq!(nccl_name(strtab, 47), None, "unterminated");
        assert_eq!(nccl_name(strtab, 4000), None);
        assert_eq!(nccl_name(strtab, u32::MAX), None);
        let mut long = b"\0nccl".to_vec();
        long.extend(std::iter::repeat_n(b'x', MAX_NAME));
        long.push(0);
        assert_eq!(nccl_name(&long, 1), None, "longer than any NCCL name");
    }

    #[test]
    fn relocation_types_by_machine() {
        for ty in [1, 6, 7] {
            assert!(binds_by_name(elf::EM_X86_64, ty));
        }
        assert!(!binds_by_name(elf::EM_X86_64, elf::R_X86_64_RELATIVE));
        assert!(!binds_by_name(elf::EM_X86_64, elf::R_X86_64_NONE));
        assert!(!binds_by_name(elf::EM_X86_64, elf::R_X86_64_IRELATIVE));
        for ty in [257, 1025, 1026] {
            assert!(binds_by_name(elf::EM_AARCH64, ty));
            assert!(!binds_by_name(elf::EM_X86_64, ty));
        }
        assert!(!binds_by_name(elf::EM_AARCH64, elf::R_AARCH64_RELATIVE));
        assert!(
            !binds_by_name(elf::EM_AARCH64, 7),
            "x86-64's JUMP_SLOT number"
        );
        assert!(!binds_by_name(elf::EM_PPC64, 21));
    }

    fn candidate(defined: bool, bind: u8, vis: u8) -> Candidate {
        Candidate {
            name: "ncclAllReduce".into(),
            defined,
            bind,
            vis,
            value: 0x1000,
        }
    }

    #[test]
    fn bindings_follow_the_linker_rules() {
        use elf::{STB_GLOBAL, STB_LOCAL, STB_WEAK, STV_DEFAULT, STV_HIDDEN, STV_PROTECTED};
        let bound = |why: &str| Binding::BoundLocally { why: why.into() };
        let code = Reached::Code { at: 0x2000 };
        let nothing = Reached::Nothing;
        let unsure = Reached::Unconfirmed("x".into());
        let undef = candidate(false, STB_GLOBAL, STV_DEFAULT);
        assert_eq!(dynsym_binding(&undef, true, false, None), Binding::Imported);
        let global = candidate(true, STB_GLOBAL, STV_DEFAULT);
        assert_eq!(
            dynsym_binding(&global, false, true, None),
            Binding::Interposable
        );
        // No relocation: what the code and data say.
        assert_eq!(
            dynsym_binding(&global, false, false, Some(&code)),
            bound(WHY_DIRECT)
        );
        assert_eq!(
            dynsym_binding(&global, false, false, Some(&Reached::Data)),
            bound(WHY_IN_DATA)
        );
        assert_eq!(
            dynsym_binding(&global, false, false, Some(&nothing)),
            Binding::NeverCalled
        );
        assert!(matches!(
            dynsym_binding(&global, false, false, Some(&unsure)),
            Binding::Uncertain { why } if why.ends_with(": x")
        ));
        assert_eq!(
            dynsym_binding(&global, true, true, None),
            bound(WHY_SYMBOLIC)
        );
        assert_eq!(
            dynsym_binding(&global, true, false, Some(&code)),
            bound(WHY_SYMBOLIC)
        );
        assert_eq!(
            dynsym_binding(&global, true, false, Some(&nothing)),
            Binding::NeverCalled
        );
        let weak = candidate(true, STB_WEAK, STV_DEFAULT);
        assert_eq!(
            dynsym_binding(&weak, false, true, None),
            Binding::Interposable
        );
        let protected = candidate(true, STB_GLOBAL, STV_PROTECTED);
        assert_eq!(
            dynsym_binding(&protected, false, true, None),
            bound(WHY_PROTECTED)
        );
        assert_eq!(
            dynsym_binding(&protected, false, false, Some(&code)),
            bound(WHY_PROTECTED)
        );
        assert_eq!(
            dynsym_binding(&protected, false, false, Some(&nothing)),
            Binding::NeverCalled
        );
        let hidden = candidate(true, STB_GLOBAL, STV_HIDDEN);
        assert_eq!(
            dynsym_binding(&hidden, false, true, None),
            bound(WHY_HIDDEN)
        );
        let local = candidate(true, STB_LOCAL, STV_DEFAULT);
        assert_eq!(dynsym_binding(&local, false, true, None), bound(WHY_LOCAL));
    }

    #[test]
    fn verdict_lists_the_bound_names_and_reasons() {
        let s = |name: &str, binding: Binding| SymbolBinding {
            name: name.into(),
            binding,
        };
        let ok = [
            s("ncclA", Binding::Imported),
            s("ncclB", Binding::Interposable),
        ];
        assert_eq!(verdict_for(&ok), Verdict::PreloadTakesEffect);
        let mixed = [
            s("ncclA", Binding::Imported),
            s("ncclB", Binding::BoundLocally { why: "x".into() }),
            s("ncclC", Binding::BoundLocally { why: "x".into() }),
        ];
        match verdict_for(&mixed) {
            Verdict::PreloadIneffective { bound, why } => {
                assert_eq!(bound, ["ncclB", "ncclC"]);
                assert!(why.starts_with("2 of 3 nccl* functions"), "{why}");
                assert!(why.ends_with(": x"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        // Versions of one name: the strongest binding is kept.
        let mut map = BTreeMap::new();
        merge(&mut map, "ncclA".into(), Binding::Interposable);
        merge(&mut map, "ncclA".into(), Binding::Imported);
        assert_eq!(map["ncclA"], Binding::Interposable);
        merge(
            &mut map,
            "ncclA".into(),
            Binding::BoundLocally { why: "y".into() },
        );
        assert_eq!(map["ncclA"], Binding::BoundLocally { why: "y".into() });
    }

    #[test]
    fn relr_tables_decode_as_glibc_does_and_never_overflow() {
        let e = Endianness::Little;
        let relr = |w: &[u64]| -> Vec<Relr> {
            w.iter()
                .map(|&x| elf::Relr64(object::U64::new(e, x)))
                .collect()
        };
        let decode = |t: &[Relr]| -> Vec<u64> {
            RelrIterator::<Header>::new(e, relr_without_overflow(t, e)).collect()
        };
        // An address relocates its own word; a bitmap's bit k (from bit 1) the k-th word
        // after; the next bitmap goes on 63 words further.
        let t = relr(&[0x1000, 0b1011, 1 | 1 << 63, 0x2000]);
        assert_eq!(
            decode(&t),
            [0x1000, 0x1008, 0x1018, 0x1000 + 63 * 8 + 63 * 8, 0x2000]
        );
        // An address near the top: the bitmap that would carry it past u64::MAX, and
        // everything after, is left out rather than wrapped (or panicking).
        let top = u64::MAX - 7;
        let t = relr(&[0x1000, top, 0b11, 0x3000]);
        assert_eq!(decode(&t), [0x1000, top]);
        assert!(decode(&relr(&[])).is_empty());
    }

    fn words(w: &[u32]) -> Vec<u8> {
        w.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn gnu_hash_counts_past_the_last_chain() {
        // 2 buckets, symoffset 3, 1 bloom word (2 u32), shift 0; buckets 3 and 5;
        // chains for symbols 3..: 3 (continues), 4 (ends), 5 (continues), 6 (ends).
        let t = words(&[2, 3, 1, 0, 0, 0, 3, 5, 10, 11, 20, 21]);
        assert_eq!(gnu_hash_count(&t, Endianness::Little), Some(7));
        // All buckets empty: only the symbols before symoffset.
        let t = words(&[1, 4, 1, 0, 0, 0, 0]);
        assert_eq!(gnu_hash_count(&t, Endianness::Little), Some(4));
        // A chain that never ends, hostile sizes, short tables: None, no panic.
        let t = words(&[1, 1, 1, 0, 0, 0, 1, 2, 2, 2]);
        assert_eq!(gnu_hash_count(&t, Endianness::Little), None);
        let t = words(&[u32::MAX, 0, u32::MAX, 0]);
        assert_eq!(gnu_hash_count(&t, Endianness::Little), None);
        assert_eq!(gnu_hash_count(&[1, 2], Endianness::Little), None);
        // Bucket value below symoffset is ignored, not underflowed.
        let t = words(&[1, 5, 1, 0, 0, 0, 2]);
        assert_eq!(gnu_hash_count(&t, Endianness::Little), Some(5));
    }

    #[test]
    fn ranges_merge_where_they_overlap() {
        let r = vec![(100, 50), (0, 10), (100, 50), (110, 10), (150, 5), (9, 2)];
        assert_eq!(merged(r), [(0, 11), (100, 50), (150, 5)]);
        assert!(merged(vec![(u64::MAX, 2), (5, 0)]).is_empty());
    }
}
