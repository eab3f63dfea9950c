//! Inspection engine: which NCCL and which GPU code a library carries.
//!
//! Answers come from the few places they can be, never from reading whole files:
//! the ELF tables ([`elf`]), the read-only data sections where NCCL's self-id literal
//! lives ([`selfid`]), the fatbin container headers in `.nv_fatbin` ([`fatbin`]), and,
//! for a library that links NCCL dynamically, [`crate::loader`] finds the file glibc's
//! loader would bind. All reads go through [`source::Source`], which keeps memory bounded
//! (windowed scans, released pages) whatever the file size. A file with no GPU code of
//! its own (a split build's bridge library) has it judged in the libraries of its
//! directory that it loads ([`split`]).

pub mod code_refs;
pub mod elf;
pub mod fatbin;
pub mod frames;
pub mod interpose;
pub mod selfid;
pub mod source;
pub mod symver;
#[doc(hidden)]
pub(crate) mod zstd_head;

use crate::arch::{Arch, GpuTarget, Variant};
use crate::version::{CudaVersion, NcclVersion};
use anyhow::{bail, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};

pub use elf::TruncatedElf;
pub use fatbin::{CodeEntry, GpuCode};
pub use selfid::SelfId;
pub use source::Source;

/// Sections that are read-only data but hold GPU code or unwind tables, never strings
/// worth scanning; skipping them keeps scans of libtorch_cuda.so to its real .rodata.
const NOT_STRING_SECTIONS: &[&str] = &[
    ".nv_fatbin",
    "__nv_relfatbin",
    "__nv_module_id",
    ".nvFatBinSegment",
    ".eh_frame",
    ".eh_frame_hdr",
    ".gcc_except_table",
];

/// Everything fdl reports about one file.
#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub path: PathBuf,
    pub size: u64,
    pub elf: bool,
    pub soname: Option<String>,
    pub needed: Vec<String>,
    pub rpath: Vec<String>,
    pub runpath: Vec<String>,
    /// NCCL compiled into this file (its self-id is in the file's read-only data).
    /// Which NCCL a process runs is [`crate::loader`]'s answer, which consults the environment.
    pub nccl: Option<NcclDetection>,
    /// Every distinct self-id found; more than one makes `nccl` ambiguous and `None`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub self_ids: Vec<SelfId>,
    pub gpu_code: GpuCode,
    /// Problems that did not stop inspection.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    #[serde(skip)]
    work: Work,
}

impl Inspection {
    /// How much of the file the inspection read in bulk (for tests that bound it).
    #[doc(hidden)]
    pub fn work(&self) -> Work {
        self.work
    }
}

/// The bulk reading an inspection did, which a hostile file must not be able to inflate
/// beyond its own size: each byte of the string regions is searched once however many
/// section headers describe it, and each `.nv_fatbin` byte is walked at most once.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Work {
    /// String regions searched, after overlapping and adjacent ones were merged.
    pub string_regions: usize,
    /// Bytes handed to the self-id search. Beyond the regions' union, only the few bytes
    /// a 16 MiB scan piece reads past its end to complete a self-id straddling it.
    pub string_bytes: u64,
    /// `.nv_fatbin` byte ranges walked, after overlapping ones were merged.
    pub fatbin_ranges: usize,
    /// Bytes of those ranges.
    pub fatbin_bytes: u64,
    /// How zstd cubins were decoded.
    pub zstd: fatbin::ZstdStats,
}

/// Which NCCL a library uses and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NcclDetection {
    pub version: NcclVersion,
    pub cuda: CudaVersion,
    /// The file carrying the self-id: the library itself, or the libnccl it loads.
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub file: PathBuf,
    pub linkage: Linkage,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Linkage {
    /// NCCL is compiled into the file.
    Static,
    /// The file's DT_NEEDED names `needed`, found through rule `via`.
    Dynamic { needed: String, via: ResolveRule },
    /// Preloaded: `entry` of `LD_PRELOAD` or `/etc/ld.so.preload`.
    Preload { entry: String },
    /// The file's DT_NEEDED names `needed`, answered by a library the process had opened
    /// by path before (`by`: torch's `__init__.py` with ctypes, in a Python process).
    Opened { needed: String, by: String },
}

/// Which loader rule found a library.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResolveRule {
    /// DT_NEEDED held a path (contains `/`).
    Path,
    Rpath,
    LdLibraryPath,
    Runpath,
    LdCache,
    DefaultDir,
}

impl std::fmt::Display for ResolveRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ResolveRule::Path => "path in DT_NEEDED",
            ResolveRule::Rpath => "DT_RPATH",
            ResolveRule::LdLibraryPath => "LD_LIBRARY_PATH",
            ResolveRule::Runpath => "DT_RUNPATH",
            ResolveRule::LdCache => "ld.so.cache",
            ResolveRule::DefaultDir => "system directory",
        })
    }
}

/// Inspects the file at `path`.
pub fn inspect(path: &Path) -> Result<Inspection> {
    Source::with_file(path, inspect_source)
}

/// Inspects bytes already in memory: the same reader as [`inspect`], for fuzzing.
pub fn inspect_bytes(data: &[u8]) -> Result<Inspection> {
    inspect_source(&Source::from_bytes(data))
}

/// Inspects `path` while decoding every zstd cubin twice, from the front of its block
/// and with libzstd, counting disagreements in [`Inspection::work`] (the oracle tests).
#[doc(hidden)]
pub fn inspect_cross_checking_zstd(path: &Path) -> Result<Inspection> {
    Source::with_file(path, |src| inspect_with(src, true, false))
}

/// Inspects `path` with every zstd cubin decoded by libzstd alone: the baseline the
/// front decoder is measured against (`benches/inspect.rs`).
#[doc(hidden)]
pub fn inspect_libzstd_only(path: &Path) -> Result<Inspection> {
    Source::with_file(path, |src| inspect_with(src, false, true))
}

/// Inspects whatever `src` holds.
pub fn inspect_source(src: &Source<'_>) -> Result<Inspection> {
    inspect_with(src, false, false)
}

fn inspect_with(src: &Source<'_>, cross_check: bool, libzstd_only: bool) -> Result<Inspection> {
    if src.is_empty() {
        bail!(
            "{} is empty (0 bytes), not a shared library: the download or copy was probably interrupted; fetch it again",
            src.name().display()
        );
    }
    // A file that shrank since it was mapped would turn the reads below into SIGBUS.
    src.check_len()?;
    let head = src.bytes_clipped(0, 16);
    let mut ins = Inspection {
        path: src.name().to_path_buf(),
        size: src.len(),
        elf: elf::is_elf(head),
        soname: None,
        needed: Vec::new(),
        rpath: Vec::new(),
        runpath: Vec::new(),
        nccl: None,
        self_ids: Vec::new(),
        gpu_code: GpuCode::default(),
        warnings: Vec::new(),
        work: Work::default(),
    };
    let mut collector = fatbin::Collector::default();
    collector.cross_check = cross_check;
    collector.libzstd_only = libzstd_only;
    if ins.elf {
        let info = elf::parse(src)?;
        ins.soname = info.dynamic.soname.clone();
        ins.needed = info.dynamic.needed.clone();
        ins.rpath = info.dynamic.rpath.clone();
        ins.runpath = info.dynamic.runpath.clone();
        ins.warnings.extend(info.warnings.iter().cloned());
        // cuobjdump lists `.nv_fatbin` only; `__nv_relfatbin` holds relocatable device
        // code for device linking, which never runs as is. The walk runs while the other
        // thread scans strings, then joins the scan.
        let (outside, fatbins) = fatbin_ranges(src, &info);
        ins.work.fatbin_ranges = fatbins.len();
        ins.work.fatbin_bytes = fatbins.iter().map(|&(_, len)| len).sum();
        let (ids, walked) = scan_self_ids_while(
            src,
            &readable_string_regions(src, &info),
            &mut ins.work,
            || {
                // Ranges past the end of the file are not read; walking them only warns.
                outside
                    .iter()
                    .chain(&fatbins)
                    .try_for_each(|&(off, len)| collector.walk(src, off, len, ".nv_fatbin"))
            },
        );
        walked?;
        ins.self_ids = ids?;
        if info.sections.is_empty() {
            ins.warnings.push(
                "no section table: GPU code is only found through the .nv_fatbin section"
                    .to_string(),
            );
        }
    } else {
        // Not ELF: a raw fatbin (what `nvcc -fatbin` writes) or anything else. Self-ids
        // are searched in the whole file, window by window.
        if head.len() >= 4
            && u32::from_le_bytes([head[0], head[1], head[2], head[3]]) == fatbin::MAGIC
        {
            collector.walk(src, 0, src.len(), "fatbin")?;
        }
        let (ids, ()) = scan_self_ids_while(src, &[(0, src.len())], &mut ins.work, || ());
        ins.self_ids = ids?;
    }
    ins.work.zstd = collector.zstd;
    ins.gpu_code = collector.finish();
    match ins.self_ids.as_slice() {
        [one] => {
            ins.nccl = Some(NcclDetection {
                version: one.nccl.clone(),
                cuda: one.cuda,
                file: ins.path.clone(),
                linkage: Linkage::Static,
            })
        }
        [] => {}
        many => ins.warnings.push(ambiguous(src.name(), many)),
    }
    src.check_len()?;
    Ok(ins)
}

fn ambiguous(path: &Path, ids: &[SelfId]) -> String {
    format!(
        "{} carries {} different NCCL self-ids ({}); cannot tell which one is linked",
        path.display(),
        ids.len(),
        ids.iter()
            .map(|i| format!("{}+cuda{}", i.nccl, i.cuda))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The read-only data regions of an ELF file where a string literal can live: its
/// read-only PROGBITS sections (`.rodata` and kin) minus GPU code and unwind tables.
/// Without a section table, the loadable segments that are neither writable nor
/// executable stand in.
pub(crate) fn string_regions(info: &elf::ElfInfo) -> Vec<(u64, u64)> {
    let from_sections: Vec<(u64, u64)> = info
        .sections
        .iter()
        .filter(|s| s.is_readonly_data() && !NOT_STRING_SECTIONS.contains(&s.name.as_str()))
        .map(|s| (s.offset, s.size))
        .collect();
    if !info.sections.is_empty() {
        return from_sections;
    }
    info.segments
        .iter()
        .filter(|s| s.p_type == object::elf::PT_LOAD)
        .filter(|s| s.flags & (object::elf::PF_W | object::elf::PF_X) == 0)
        .map(|s| (s.offset, s.filesz))
        .collect()
}

fn readable_string_regions(src: &Source<'_>, info: &elf::ElfInfo) -> Vec<(u64, u64)> {
    string_regions(info)
        .into_iter()
        .filter(|&(off, len)| off.checked_add(len).is_some_and(|e| e <= src.len()))
        .collect()
}

/// A byte range of the file: (offset, length).
type Span = (u64, u64);

/// The `.nv_fatbin` byte ranges to walk: those lying (partly) past the end of the file,
/// each once (walking one only warns), and the union of those inside it.
///
/// A walk follows a chain of containers from its range's start, each container header
/// saying where the next one begins. Sections of a sound file never overlap, so overlap
/// comes only from duplicated or hostile section headers, and each choice was weighed by
/// what it does to the counts:
/// - walking every header's range counts the shared bytes' cubins once per header (and
///   lets 65,536 headers make one file walked 65,536 times);
/// - cutting overlapping ranges into disjoint pieces cuts containers at arbitrary offsets
///   and loses the entries of every cut one;
/// - walking the union once passes every container of each range's chain (a range nested
///   in another starts on a container of the outer chain, or is found again from the next
///   magic), so each is counted once, as a single header would count it.
///
/// Ranges that only touch are not joined: two real sections each end their chain at their
/// own end, and joined, a container claiming more than its section holds would swallow
/// the next section's first container.
fn fatbin_ranges(src: &Source<'_>, info: &elf::ElfInfo) -> (Vec<Span>, Vec<Span>) {
    let (inside, mut outside): (Vec<Span>, Vec<Span>) = info
        .sections
        .iter()
        .filter(|s| s.name == ".nv_fatbin" && s.has_file_bytes())
        .map(|s| (s.offset, s.size))
        .partition(|&(off, len)| off.checked_add(len).is_some_and(|e| e <= src.len()));
    outside.sort_unstable();
    outside.dedup();
    (outside, union_of(inside, false))
}

/// The sorted, disjoint ranges covering the bytes of `ranges` (offset, length): ranges
/// that overlap are merged, and so are ranges that touch when `touching` is set. Empty
/// ranges and ranges whose end overflows are dropped (callers keep ranges in the file).
fn union_of(mut ranges: Vec<Span>, touching: bool) -> Vec<Span> {
    ranges.retain(|&(off, len)| len > 0 && off.checked_add(len).is_some());
    ranges.sort_unstable();
    let mut out: Vec<Span> = Vec::with_capacity(ranges.len());
    for (off, len) in ranges {
        if let Some(last) = out.last_mut() {
            let last_end = last.0 + last.1;
            if off < last_end || (touching && off == last_end) {
                last.1 = last_end.max(off + len) - last.0;
                continue;
            }
        }
        out.push((off, len));
    }
    out
}

fn self_ids_in_elf(src: &Source<'_>, info: &elf::ElfInfo) -> Result<Vec<SelfId>> {
    scan_self_ids(src, &readable_string_regions(src, info))
}

/// Every distinct self-id in the regions, in order of first appearance.
fn scan_self_ids(src: &Source<'_>, regions: &[(u64, u64)]) -> Result<Vec<SelfId>> {
    scan_self_ids_while(src, regions, &mut Work::default(), || ()).0
}

/// Scan pieces: large enough that the per-piece overhead vanishes, small enough that two
/// threads finish together.
const SCAN_PIECE: u64 = 16 << 20;
/// At most this many distinct self-ids are collected: a hostile file could hold millions,
/// and a few already make the answer ambiguous.
const MAX_SELF_IDS: usize = 16;

/// [`scan_self_ids`] on two threads: one scans from the start while this one runs
/// `first`, then both take the remaining pieces. Scanning is bound by memory traffic, and
/// on a 2-core machine the second core halves it — or hides the fatbin walk (`first`).
/// `work` gets the number of regions searched and of bytes handed to the search.
fn scan_self_ids_while<R: Send>(
    src: &Source<'_>,
    regions: &[(u64, u64)],
    work: &mut Work,
    first: impl FnOnce() -> R + Send,
) -> (Result<Vec<SelfId>>, R) {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    // Regions of a hostile file may overlap (up to 65,536 section headers over the same
    // bytes): their union is searched, so each byte is searched once. Touching regions
    // are joined too, which lets a self-id straddling them be read whole, as it is in the
    // file; distinct self-ids are kept apart by the NUL that ends each string.
    let regions = union_of(regions.to_vec(), true);
    work.string_regions = regions.len();
    // (start, length, end of its region): a piece may read past its end into its own
    // region, never past it.
    let pieces: Vec<(u64, u64, u64)> = regions
        .iter()
        .flat_map(|&(off, len)| {
            (0..len.div_ceil(SCAN_PIECE)).map(move |k| {
                let start = off + k * SCAN_PIECE;
                (start, SCAN_PIECE.min(off + len - start), off + len)
            })
        })
        .collect();
    let next = AtomicUsize::new(0);
    let scanned = AtomicU64::new(0);
    let worker = || -> Result<Vec<(u64, SelfId)>> {
        let mut hits: Vec<(u64, SelfId)> = Vec::new();
        let reach = (selfid::NEEDLE.len() + 64) as u64;
        loop {
            let k = next.fetch_add(1, Ordering::Relaxed);
            let Some(&(start, len, region_end)) = pieces.get(k) else {
                break;
            };
            // Overlap into the next piece (within the region) so that a self-id crossing
            // the boundary is read whole; it counts for the piece it starts in.
            let scan_len = (len + reach).min(region_end - start);
            scanned.fetch_add(scan_len, Ordering::Relaxed);
            src.find_iter(start, scan_len, selfid::NEEDLE, 64, |at, rest| {
                if at < start + len {
                    if let Some(id) = rest
                        .get(selfid::NEEDLE.len()..)
                        .and_then(selfid::parse_after_needle)
                    {
                        if !hits.iter().any(|(_, h)| *h == id) {
                            hits.push((at, id));
                        }
                    }
                }
                hits.len() < MAX_SELF_IDS
            })?;
            if hits.len() >= MAX_SELF_IDS {
                break;
            }
        }
        Ok(hits)
    };
    let out = std::thread::scope(|scope| {
        let other = scope.spawn(worker);
        let r = first();
        let mine = worker();
        let theirs = other
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the string scan panicked")));
        let merged = mine.and_then(|mut a| {
            a.extend(theirs?);
            // Order of first appearance in the file, whichever thread saw it.
            a.sort_by_key(|(at, _)| *at);
            let mut ids: Vec<SelfId> = Vec::new();
            for (_, id) in a {
                if !ids.contains(&id) && ids.len() < MAX_SELF_IDS {
                    ids.push(id);
                }
            }
            Ok(ids)
        });
        (merged, r)
    });
    work.string_bytes = scanned.into_inner();
    out
}

/// Finds the NCCL self-id in a file. `Ok(None)` when the file holds none.
/// Several distinct self-ids are an error: the answer would be a guess.
pub fn find_nccl_self_id(path: &Path) -> Result<Option<SelfId>> {
    Source::with_file(path, |src| find_nccl_self_id_in(src, path))
}

/// [`find_nccl_self_id`] on a file already open (a caller that must check which file it
/// read, by [`Source::file_id`], before it trusts the answer).
pub fn find_nccl_self_id_in(src: &Source<'_>, path: &Path) -> Result<Option<SelfId>> {
    if src.is_empty() {
        return Ok(None);
    }
    src.check_len()?;
    let ids = if elf::is_elf(src.bytes_clipped(0, 16)) {
        let info = elf::parse(src)?;
        self_ids_in_elf(src, &info)?
    } else {
        scan_self_ids(src, &[(0, src.len())])?
    };
    match ids.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one.clone())),
        many => bail!(ambiguous(path, many)),
    }
}

/// Whether code in a library can run on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// A cubin runs as is: `sass` is the best fitting target, with `count` cubins. When
    /// another fitting target holds more cubins (a GPU that runs one `sm_121a` cubin
    /// natively but 476 `sm_120` ones for everything else), `mostly` names it: most
    /// kernels run that code, and a verdict naming only `sass` would misdescribe them.
    Native {
        sass: GpuTarget,
        count: usize,
        mostly: Option<(GpuTarget, usize)>,
    },
    /// No cubin fits, but this PTX JIT-compiles for the GPU (slow first start).
    PtxJit {
        ptx: GpuTarget,
    },
    NotCovered,
}

impl Verdict {
    /// What runs natively, in words: `sm_80`, or both targets when most kernels come
    /// from another one than the best: `sm_121a ×1 natively, sm_120 ×476`. Counts are
    /// cubins per target, as the inspection counted them.
    pub fn sass_text(&self) -> Option<String> {
        match self {
            Verdict::Native {
                sass, mostly: None, ..
            } => Some(sass.to_string()),
            Verdict::Native {
                sass,
                count,
                mostly: Some((most, n)),
            } => Some(format!("{sass} ×{count} natively, {most} ×{n}")),
            _ => None,
        }
    }
}

/// The verdict for `gpu` by CUDA's rules (see [`GpuTarget::sass_runs_on`] and
/// [`GpuTarget::ptx_runs_on`]). Among fitting cubins the best is the highest arch, and
/// at equal arch the plain target, then `f`, then `a`: a library's kernels are mostly
/// plain (libtorch_cuda.so 2.8: 393 `sm_90` cubins, 4 `sm_90a`), so naming the variant
/// would misdescribe what runs. Among fitting PTX, the highest.
pub fn coverage(code: &GpuCode, gpu: Arch) -> Verdict {
    let rank = |t: &GpuTarget| {
        let v = match t.variant {
            Variant::Generic => 2,
            Variant::Family => 1,
            Variant::Specific => 0,
        };
        (t.arch, v)
    };
    let fitting: Vec<&CodeEntry> = code
        .sass
        .iter()
        .filter(|e| e.target.sass_runs_on(gpu))
        .collect();
    if let Some(best) = fitting.iter().max_by_key(|e| rank(&e.target)) {
        // The fitting target most cubins come from; ties go to the best one.
        let most = fitting
            .iter()
            .max_by_key(|e| (e.count, e.target == best.target))
            .filter(|m| m.target != best.target && m.count > best.count);
        return Verdict::Native {
            sass: best.target,
            count: best.count,
            mostly: most.map(|m| (m.target, m.count)),
        };
    }
    if let Some(best) = code
        .ptx
        .iter()
        .map(|e| e.target)
        .filter(|t| t.ptx_runs_on(gpu))
        .max_by_key(rank)
    {
        return Verdict::PtxJit { ptx: best };
    }
    Verdict::NotCovered
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_ids_across_scan_pieces_are_found_once_in_file_order() {
        let id_a = b"NCCL version 2.27.5+cuda12.9";
        let id_b = b"NCCL version 2.21.5+cuda12.4";
        let piece = SCAN_PIECE as usize;
        let mut data = vec![b'x'; piece * 3 + 100];
        // One straddling the first piece boundary, one at the very end, and a repeat of
        // the first inside the third piece (counted once, in order of first appearance).
        data[piece - 7..piece - 7 + id_a.len()].copy_from_slice(id_a);
        let end = data.len() - id_b.len();
        data[end..].copy_from_slice(id_b);
        data[piece * 2 + 10..piece * 2 + 10 + id_a.len()].copy_from_slice(id_a);
        let src = Source::from_bytes(&data);
        let (ids, ()) =
            scan_self_ids_while(&src, &[(0, data.len() as u64)], &mut Work::default(), || ());
        let ids = ids.unwrap();
        let names: Vec<String> = ids.iter().map(|i| i.nccl.to_string()).collect();
        assert_eq!(names, ["2.27.5", "2.21.5"]);
        // A region ending inside a self-id does not read past it.
        let (ids, ()) =
            scan_self_ids_while(&src, &[(0, piece as u64 - 1)], &mut Work::default(), || ());
        assert!(ids.unwrap().is_empty());
    }

    #[test]
    fn ranges_are_merged_into_their_union() {
        // Identical, nested, overlapping, touching, disjoint, empty and overflowing.
        let ranges = vec![
            (100, 50),
            (0, 10),
            (100, 50),
            (110, 10),
            (140, 30),
            (170, 5),
            (200, 0),
            (300, 1),
            (u64::MAX, 2),
        ];
        assert_eq!(
            union_of(ranges.clone(), true),
            [(0, 10), (100, 75), (300, 1)]
        );
        assert_eq!(
            union_of(ranges, false),
            [(0, 10), (100, 70), (170, 5), (300, 1)]
        );
        assert!(union_of(Vec::new(), true).is_empty());
    }

    /// Thousands of overlapping regions are searched as their union: once per byte, and
    /// the self-id they all hold is reported once.
    #[test]
    fn overlapping_regions_are_searched_once() {
        let mut data = vec![b'x'; 100_000];
        let id = b"\0NCCL version 2.27.5+cuda12.9\0";
        data[90_000..90_000 + id.len()].copy_from_slice(id);
        let src = Source::from_bytes(&data);
        let regions: Vec<(u64, u64)> = (0..5000).map(|k| (k * 7, 100_000 - k * 7)).collect();
        let mut work = Work::default();
        let (ids, ()) = scan_self_ids_while(&src, &regions, &mut work, || ());
        assert_eq!(ids.unwrap().len(), 1);
        assert_eq!(work.string_regions, 1);
        assert_eq!(work.string_bytes, 100_000);
    }
}
