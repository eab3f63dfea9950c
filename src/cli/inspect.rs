//! `fdl inspect`, `fdl nccl detect` and `fdl nccl verify`: what a library carries, which
//! NCCL a libtorch uses, and whether a build is sound.

use super::common::print_json;
use crate::arch::{self, Arch, GpuTarget};
use crate::context::Context;
use crate::gpu::{self, Gpu};
use crate::inspect::{self, GpuCode, Linkage, NcclDetection, Verdict};
use crate::libtorch::Libtorch;
use crate::loader::reason::{self, Doubt, Unknown};
use crate::loader::split::Followed;
use crate::loader::{self, Answer, LoaderEnv, Which};
use crate::nccl::store::{BuildStore, Entry};
use crate::nccl::verify::{self, Against, LocalGpus, Report, Status};
use crate::project::Project;
use crate::text::{clean, json_path, paint, Color};
use anyhow::{bail, Result};
use serde_json::json;
use std::path::{Path, PathBuf};

/// What coverage is judged for: `--archs`, else the local GPUs.
pub(super) enum Targets {
    Archs(Vec<Arch>),
    Gpus(Vec<Gpu>),
    /// Neither given nor readable; the reason, for the report.
    None(String),
}

pub(super) fn targets(archs: Option<&str>) -> Result<Targets> {
    Ok(match archs {
        Some(list) => Targets::Archs(arch::parse_arch_list(list)?),
        None => match gpu::query() {
            Ok(gpus) => Targets::Gpus(gpus),
            Err(e) => Targets::None(format!("{e}; {}", gpu::ARCHS_HINT)),
        },
    })
}

/// One row of a coverage table.
pub(super) struct CoverageRow {
    pub label: String,
    pub arch: Arch,
    pub verdict: Verdict,
    /// When the verdict is the worst of several libraries' that disagree: each one's.
    pub per_library: Vec<(String, Verdict)>,
}

pub(super) fn coverage_rows(code: &GpuCode, targets: &Targets) -> Vec<CoverageRow> {
    coverage_rows_by(targets, |arch| (inspect::coverage(code, arch), Vec::new()))
}

/// The coverage rows of an inspected library, the files they judge, and the title of
/// their table: its own GPU code, or, when it holds none, that of the libraries of its
/// directory it loads ([`loader::split`]).
pub(super) fn judged_rows(
    ins: &inspect::Inspection,
    targets: &Targets,
) -> (Vec<CoverageRow>, Vec<PathBuf>, String) {
    match loader::split::follow(ins, &LoaderEnv::from_process()).filter(|f| f.found()) {
        Some(f) => (
            followed_rows(&f, targets),
            f.libraries.iter().map(|l| l.path.clone()).collect(),
            followed_title(&f),
        ),
        None => (
            coverage_rows(&ins.gpu_code, targets),
            vec![ins.path.clone()],
            "Coverage:".to_string(),
        ),
    }
}

fn followed_title(f: &Followed) -> String {
    let names: Vec<String> = f.libraries.iter().map(|l| file_name(&l.path)).collect();
    format!("Coverage of {}:", crate::text::clean(&and_list(&names)))
}

/// The rows for a split build's libraries together ([`loader::split::Followed`]).
fn followed_rows(f: &Followed, targets: &Targets) -> Vec<CoverageRow> {
    coverage_rows_by(targets, |arch| {
        let each: Vec<(String, Verdict)> = f
            .libraries
            .iter()
            .map(|l| (file_name(&l.path), inspect::coverage(&l.gpu_code, arch)))
            .collect();
        let disagree = each
            .windows(2)
            .any(|w| std::mem::discriminant(&w[0].1) != std::mem::discriminant(&w[1].1));
        (
            f.coverage(arch).unwrap_or(Verdict::NotCovered),
            if disagree { each } else { Vec::new() },
        )
    })
}

/// Whether two files lie in one directory: the same parent as written, or the same
/// directory by device and inode (a project's `lib` link to a pip torch/lib).
fn same_dir(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Some(pa), Some(pb)) = (a.parent(), b.parent()) else {
        return false;
    };
    if pa == pb {
        return true;
    }
    match (std::fs::metadata(pa), std::fs::metadata(pb)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(
        || crate::text::shown(&p),
        |n| n.to_string_lossy().into_owned(),
    )
}

fn coverage_rows_by(
    targets: &Targets,
    judge: impl Fn(Arch) -> (Verdict, Vec<(String, Verdict)>),
) -> Vec<CoverageRow> {
    let row = |label: String, arch: Arch| {
        let (verdict, per_library) = judge(arch);
        CoverageRow {
            label,
            arch,
            verdict,
            per_library,
        }
    };
    match targets {
        Targets::Archs(archs) => archs.iter().map(|&a| row(a.to_string(), a)).collect(),
        Targets::Gpus(gpus) => gpus
            .iter()
            .map(|g| row(format!("GPU {} {}", g.index, g.name), g.compute_cap))
            .collect(),
        Targets::None(_) => Vec::new(),
    }
}

pub(super) fn verdict_text(v: &Verdict) -> String {
    match v {
        Verdict::Native { .. } => paint(
            &format!("native SASS ({})", v.sass_text().unwrap_or_default()),
            Color::Green,
        ),
        Verdict::PtxJit { ptx } => paint(
            &format!(
                "PTX JIT only ({}): runs, slow first start",
                GpuTarget::ptx_name(*ptx)
            ),
            Color::Yellow,
        ),
        Verdict::NotCovered => paint("NOT COVERED: no GPU code runs here", Color::Red),
    }
}

/// One object per row; the verdict is one field (`native`, `ptx_jit`, `not_covered`) and
/// `code` names what runs, when something does.
pub(super) fn coverage_json(rows: &[CoverageRow]) -> serde_json::Value {
    rows.iter()
        .map(|r| {
            let (verdict, code) = match r.verdict {
                Verdict::Native { sass, .. } => ("native", Some(sass.to_string())),
                Verdict::PtxJit { ptx } => ("ptx_jit", Some(ptx.ptx_name())),
                Verdict::NotCovered => ("not_covered", None),
            };
            json!({ "target": r.label, "arch": r.arch, "verdict": verdict, "code": code })
        })
        .collect()
}

/// PTX is named by its virtual architecture.
fn code_list(entries: &[inspect::CodeEntry], ptx: bool) -> String {
    code_items(entries, ptx).join(", ")
}

/// Each entry as `sm_90 ×393` (`none` for no entry), for [`crate::text::wrap_items`].
fn code_items(entries: &[inspect::CodeEntry], ptx: bool) -> Vec<String> {
    if entries.is_empty() {
        return vec!["none".into()];
    }
    entries
        .iter()
        .map(|e| {
            let name = if ptx {
                GpuTarget::ptx_name(e.target)
            } else {
                e.target.to_string()
            };
            format!("{name} ×{}", e.count)
        })
        .collect()
}

/// Which NCCL a process that links the inspected library runs, in this process's
/// environment, reusing the inspection's self-ids. A non-ELF file has no loader.
pub(super) fn nccl_in(ins: &inspect::Inspection) -> Result<Option<Which>> {
    if !ins.elf {
        return Ok(None);
    }
    loader::which_nccl_knowing(&ins.path, &LoaderEnv::from_process(), Some(&ins.self_ids)).map(Some)
}

/// [`nccl_in`] for the process `target` says (a Python process importing a pip torch).
pub(super) fn nccl_in_for(
    ins: &inspect::Inspection,
    target: &Target,
    env: &LoaderEnv,
) -> Result<Option<Which>> {
    if target.python.is_none() {
        return nccl_in(ins);
    }
    if !ins.elf {
        return Ok(None);
    }
    let mut w = loader::which_nccl_as(
        &target.lib,
        &target.env(env),
        Some(&ins.self_ids),
        target.kind,
    )?;
    if let Some(why) = target.python_unknown() {
        w.answer = Answer::Unknown { reason: why };
    }
    Ok(Some(w))
}

pub(super) fn linkage_text(d: &NcclDetection) -> String {
    match &d.linkage {
        Linkage::Static => "static (compiled into the library)".into(),
        Linkage::Dynamic { needed, via } => {
            format!(
                "dynamic: loads {needed} = {} (found via {via})",
                crate::text::shown(&d.file)
            )
        }
        Linkage::Preload { entry } => format!("preloaded: {entry}"),
        Linkage::Opened { needed, by } => format!(
            "dynamic: {needed} = {}, already open ({by})",
            crate::text::shown(&d.file)
        ),
    }
}

/// The answer in one line, short enough for a terminal row: what is known first (the
/// NCCL and its linkage; the NCCL an unknown answer reaches under its condition; the two
/// NCCLs of a split), rendered from the typed answer. The second value says whether
/// anything was left out (`--json` has the whole reason, `detect -v` says it). NCCL
/// compiled into another file than the one asked about (a split build's bridge calls the
/// NCCL in libtorch_cuda_cpp.so) names that file.
pub(super) fn answer_line(w: &Which) -> (String, bool) {
    match &w.answer {
        Answer::Nccl { detection: d } => {
            let asked = w.link_map.objects.iter().find(|o| {
                matches!(
                    o.found_by,
                    loader::FoundBy::Asked | loader::FoundBy::Program
                )
            });
            let linkage = match (&d.linkage, asked) {
                (Linkage::Static, Some(o)) if o.path != d.file => format!(
                    "static (compiled into {}, which it loads)",
                    // By file name when it lies beside the library asked about.
                    if same_dir(&o.path, &d.file) {
                        file_name(&d.file)
                    } else {
                        crate::text::shown(&d.file)
                    }
                ),
                _ => linkage_text(d),
            };
            (format!("{} (CUDA {}), {linkage}", d.version, d.cuda), false)
        }
        Answer::None { reason } => {
            let (text, cut) = crate::text::fit(reason, ANSWER);
            (format!("none: {text}"), cut)
        }
        Answer::Unknown { .. } | Answer::Split { .. } => {
            let (text, cut) = answer_short(w);
            let head = if matches!(w.answer, Answer::Split { .. }) {
                "TWO NCCLs"
            } else {
                "unknown"
            };
            (format!("{head}: {text}"), cut)
        }
    }
}

/// At most this many characters of an answer's reason on its one line.
const ANSWER: usize = 80;

/// An unknown or split answer in a few words, from its typed parts: the NCCL an unknown
/// answer reaches if what fdl cannot see defines no `nccl*`, the objects with NCCL that a
/// split's calls reach; else its reason, shortened by [`short_reason`]. Whether anything
/// was left out.
fn answer_short(w: &Which) -> (String, bool) {
    if let (Answer::Unknown { .. }, Some(c)) = (&w.answer, &w.conditional) {
        let d = &c.detection;
        let condition = match (c.only_missing, c.missing.as_slice()) {
            (true, [one]) => format!("if {} (missing here) defines no nccl*", clean(one)),
            (true, many) => format!(
                "if none of the {} libraries missing here defines nccl*",
                many.len()
            ),
            (false, _) => format!(
                "if none of the {} things fdl cannot see defines nccl*",
                c.unknowns.len()
            ),
        };
        // Its file is among the evidence (`Loaded by`).
        return (
            format!("NCCL {} (CUDA {}) {condition}", d.version, d.cuda),
            true,
        );
    }
    if let Answer::Split { .. } = &w.answer {
        let mut reached: Vec<String> = Vec::new();
        for c in &w.calls {
            if let (Some(o), Some(id)) = (&c.object, &c.nccl) {
                let one = format!("{} (NCCL {})", brief(w, o), id.nccl);
                if !reached.contains(&one) {
                    reached.push(one);
                }
            }
        }
        if reached.len() > 1 {
            let (text, _) = crate::text::fit(&and_list(&reached), ANSWER);
            return (text, true);
        }
    }
    // No typed short form: the reason as `short_reason` shortens it, wrapped where it is
    // printed, never cut before its point.
    short_reason(&w.answer)
}

/// A file of the link map as a summary names it: by file name where no other object of
/// the map has that name (the full paths are listed with the evidence), else whole.
fn brief(w: &Which, p: &Path) -> String {
    let name = file_name(p);
    let others = w
        .link_map
        .objects
        .iter()
        .filter(|o| !o.is_stand_in() && o.path != p && file_name(&o.path) == name)
        .count();
    if others == 0 {
        clean(&name)
    } else {
        crate::text::shown(p)
    }
}

/// A reason as text output says it, once, from the answer's facts: a library that cannot
/// be loaded is named by its DT_NEEDED name (the `cannot load` lines below say why), a
/// list of more than [`LISTED`] function names keeps its first two and counts the rest,
/// and each clause is at most [`CLAUSE`] characters. The second value says whether
/// anything was left out: then the text points to `--json`, which has the reason whole.
pub(super) fn short_reason(answer: &Answer) -> (String, bool) {
    let mut cut = false;
    let clauses = match answer {
        Answer::Nccl { .. } => Vec::new(),
        Answer::None { reason } => vec![reason.clone()],
        Answer::Unknown { reason } => unknown_clauses(reason, &mut cut),
        Answer::Split { reason } => split_clauses(reason, &mut cut),
    };
    let clauses: Vec<String> = clauses
        .into_iter()
        .map(|c| {
            if c.chars().count() <= CLAUSE {
                return c;
            }
            cut = true;
            let head: String = c.chars().take(CLAUSE).collect();
            format!("{}…", head.trim_end())
        })
        .collect();
    (clauses.join("; "), cut)
}

/// At most this many names of a list are shown by [`short_reason`].
const LISTED: usize = 3;
/// At most this many characters of one clause of a reason are shown by [`short_reason`].
const CLAUSE: usize = 240;

/// `a, b, c, d, e` → `a, b and 3 more`; a list of at most [`LISTED`] whole.
fn listed(names: &[String], cut: &mut bool) -> String {
    match names {
        [a, b, rest @ ..] if names.len() > LISTED => {
            *cut = true;
            format!("{a}, {b} and {} more", rest.len())
        }
        _ => names.join(", "),
    }
}

/// A doubt in a few words: a library that cannot be loaded by its name alone.
fn doubt_short(d: &Doubt) -> String {
    match d {
        Doubt::LoadFailure { needed, .. } => format!("{needed} cannot be loaded"),
        other => other.to_string(),
    }
}

/// The clauses of an unknown answer's short reason, before each is cut to [`CLAUSE`].
fn unknown_clauses(u: &Unknown, cut: &mut bool) -> Vec<String> {
    let pin = |p: &Option<loader::pin::Pin>| p.as_ref().map(reason::missing_pin_words);
    match u {
        Unknown::Hidden {
            missing_pin,
            doubts,
            more,
            if_none,
        } => {
            let mut body: Vec<String> = doubts.iter().map(doubt_short).collect();
            match body.first_mut() {
                Some(first) => *first = format!("{}: {first}", reason::HIDDEN),
                None => body.push(format!("{}: ", reason::HIDDEN)),
            }
            if let Some(last) = body.last_mut() {
                if *more > 0 {
                    last.push_str(&format!(" (and {more} more)"));
                }
                if let Some(r) = if_none {
                    last.push_str(&format!(". {}", reason::if_none_words(r)));
                }
            }
            pin(missing_pin).into_iter().chain(body).collect()
        }
        Unknown::Undefined { names } => vec![reason::undefined_words(&listed(names, cut))],
        Unknown::PossibleCall {
            at,
            names,
            why,
            elsewhere,
        } => {
            let (and, otherwise) = reason::possible_call_tail(elsewhere);
            vec![
                format!(
                    "{}{and}",
                    reason::possible_call_head(at, &listed(names, cut), why)
                ),
                otherwise.to_string(),
            ]
        }
        Unknown::Unreadable { missing_pin, doubt } => pin(missing_pin)
            .into_iter()
            .chain([format!("{}: {}", reason::UNREADABLE, doubt_short(doubt))])
            .collect(),
        Unknown::Python { why } => why.clone(),
        Unknown::NoSelfId { .. }
        | Unknown::SelfIdUnknown(_)
        | Unknown::OpensLater { .. }
        | Unknown::UnnamedExporter { .. }
        | Unknown::MayDlopen { .. } => vec![u.to_string()],
    }
}

/// The clauses of a split answer's short reason: each group of calls, its names listed
/// short.
fn split_clauses(s: &reason::Split, cut: &mut bool) -> Vec<String> {
    let mut parts: Vec<String> = s
        .parts
        .iter()
        .map(|p| p.words(&listed(&p.names, cut)))
        .collect();
    match parts.first_mut() {
        Some(first) => *first = format!("{}: {first}", s.head()),
        None => parts.push(format!("{}: ", s.head())),
    }
    parts
}

/// The answer as JSON: `answer`, `reason`, the `nccl` object scripts read (`found`,
/// `detection`), and the evidence (calls, link map, skipped preloads, failures).
pub(super) fn which_json(w: &Which) -> serde_json::Value {
    json!({
        "answer": w.answer.kind(),
        "reason": w.answer.reason(),
        // The reason's facts beside its text, by the answer's kind.
        "unknown": matches!(w.answer, Answer::Unknown { .. }).then(|| w.answer.typed_json()),
        "split": matches!(w.answer, Answer::Split { .. }).then(|| w.answer.typed_json()),
        "found": w.answer.detection().is_some(),
        "detection": w.answer.detection(),
        "calls": w.calls,
        // The stand-in program is no file: the map lists what is loaded.
        "link_map": w.link_map.objects.iter().filter(|o| !o.is_stand_in()).collect::<Vec<_>>(),
        "skipped_preloads": w.link_map.skipped_preloads,
        "failures": w.link_map.failures,
        "failures_omitted": w.link_map.failures_omitted,
        "caveats": w.link_map.caveats,
        "caveats_omitted": w.link_map.caveats_omitted,
        "pin": w.pin,
        // With an unknown answer: what it is if what is unknown defines no nccl*.
        "conditional": w.conditional,
        "warnings": w.warnings,
    })
}

pub(super) fn inspect_cmd(path: &Path, archs: Option<&str>, json_out: bool) -> Result<()> {
    let ins = inspect::inspect(path)?;
    // A README or a script has no SONAME, NCCL or GPU code to judge: no verdict at all.
    if !ins.elf {
        anyhow::bail!(
            "{} is not an ELF file, so it holds no NCCL or GPU code to inspect. Give a shared library: a libtorch's lib/libtorch_cuda.so, a libnccl.so.2, or any .so",
            crate::text::shown(&path)
        );
    }
    // The file's own facts stand whatever the loader model makes of it (a raw or
    // synthetic ELF file need not be loadable).
    let nccl = nccl_in(&ins).map_err(|e| format!("{e:#}"));
    let static_line = |ins: &inspect::Inspection| match &ins.nccl {
        Some(d) => format!("{} (CUDA {}), {}", d.version, d.cuda, linkage_text(d)),
        None => "none: no NCCL self-id in the file".to_string(),
    };
    let targets = targets(archs)?;
    // A file with no GPU code of its own is judged by the libraries of its directory that
    // it loads (a split build's bridge), when there are any.
    let followed = loader::split::follow(&ins, &LoaderEnv::from_process());
    let judged = followed.as_ref().filter(|f| f.found());
    let rows = match judged {
        Some(f) => followed_rows(f, &targets),
        None => coverage_rows(&ins.gpu_code, &targets),
    };
    if json_out {
        let coverage_of: Vec<&Path> = match judged {
            Some(f) => f.libraries.iter().map(|l| l.path.as_path()).collect(),
            None => vec![ins.path.as_path()],
        };
        let needed_gpu_code = followed.as_ref().map(|f| {
            json!({
                "dir": json_path::value(&f.dir),
                "libraries": f.libraries.iter().map(|l| json!({
                    "path": json_path::value(&l.path),
                    "needed_as": l.needed_as,
                    "needed_by": json_path::value(&l.needed_by),
                    "gpu_code": l.gpu_code,
                    "coverage": coverage_json(&coverage_rows(&l.gpu_code, &targets)),
                })).collect::<Vec<_>>(),
                "warnings": f.warnings,
            })
        });
        print_json(&json!({
            "inspection": ins,
            "coverage_of": json_path::values(&coverage_of),
            "needed_gpu_code": needed_gpu_code,
            "nccl": match &nccl {
                Ok(Some(w)) => which_json(w),
                Err(e) => json!({
                    "answer": "unknown",
                    "reason": e,
                    "found": false,
                    "detection": null,
                }),
                Ok(None) => json!({
                    "answer": if ins.nccl.is_some() { "nccl" } else { "none" },
                    "found": ins.nccl.is_some(),
                    "detection": ins.nccl,
                }),
            },
            "coverage": coverage_json(&rows),
            "coverage_note": match &targets { Targets::None(why) => Some(why.clone()), _ => None },
        }));
        return Ok(());
    }
    let mib = ins.size as f64 / (1024.0 * 1024.0);
    outln!(
        "{}  ({mib:.1} MiB{})",
        crate::text::clean(&ins.path.display().to_string()),
        if ins.elf { ", ELF" } else { ", not ELF" }
    );
    // SONAME, needs, paths and warnings are the library's own strings: shown escaped.
    // A row wraps under its value; a path (or RPATH) longer than a line stays whole.
    let row = |k: &str, v: String| {
        outln!(
            "{}",
            crate::text::wrap(&format!("  {k:<9}"), ROW_INDENT, &crate::text::clean(&v))
        )
    };
    if let Some(s) = &ins.soname {
        row("soname", s.clone());
    }
    // A list breaks between its items only.
    let items = |k: &str, items: Vec<String>, sep: &str| {
        let items: Vec<String> = items.iter().map(|i| crate::text::clean(i)).collect();
        outln!(
            "{}",
            crate::text::wrap_items(&format!("  {k:<9}"), ROW_INDENT, &items, sep)
        )
    };
    if !ins.needed.is_empty() {
        items("needed", ins.needed.clone(), " ");
    }
    if !ins.runpath.is_empty() {
        row("runpath", ins.runpath.join(":"));
    }
    if !ins.rpath.is_empty() {
        row("rpath", ins.rpath.join(":"));
    }
    let (answer, cut) = match &nccl {
        Ok(Some(w)) => answer_line(w),
        Ok(None) => (static_line(&ins), false),
        Err(e) => (
            format!(
                "{}; as a process would load it: cannot tell ({e})",
                static_line(&ins)
            ),
            false,
        ),
    };
    row("nccl", answer);
    if cut {
        outln!("{ROW_INDENT}{WHY_INSPECT}");
    }
    let code = &ins.gpu_code;
    let with_total = |mut list: Vec<String>, total: String| {
        if let Some(last) = list.last_mut() {
            last.push_str(&format!("  ({total})"));
        }
        list
    };
    items(
        "SASS",
        with_total(
            code_items(&code.sass, false),
            format!("{} cubins", code.sass_total()),
        ),
        ", ",
    );
    items(
        "PTX",
        with_total(
            code_items(&code.ptx, true),
            format!("{} entries", code.ptx_total()),
        ),
        ", ",
    );
    for w in ins.warnings.iter().chain(code.warnings.iter()) {
        row("warning", w.clone());
    }
    if let Some(f) = &followed {
        print_followed(f);
    }
    match judged {
        Some(f) => print_coverage_titled(&rows, &targets, &followed_title(f)),
        None => print_coverage(&rows, &targets),
    }
    Ok(())
}

/// The indent of a continuation line of `detect`'s rows (`  library   …`).
const DETECT_INDENT: &str = "            ";
/// The indent of a row's continuation lines: under its value.
const ROW_INDENT: &str = "           ";
/// Where a shortened answer of `inspect` (and `libtorch info`) is said whole.
pub(super) const WHY_INSPECT: &str = "(`fdl nccl detect -v PATH` says why; `--json` has it whole)";

/// `a`, `a and b`, `a, b and c`.
fn and_list(names: &[String]) -> String {
    match names {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// Where a file without GPU code has it: each library of its directory it loads, with
/// its code, or that there is none there either.
fn print_followed(f: &Followed) {
    if !f.found() {
        outln!("  gpu code none in this file, nor in the libraries it loads from its directory");
    } else {
        outln!("  gpu code none in this file; in the libraries it loads from its directory:");
        for l in &f.libraries {
            // Named by file name when it is in the directory of what needs it.
            let by = if l.needed_by.parent() == l.path.parent() {
                file_name(&l.needed_by)
            } else {
                crate::text::shown(&l.needed_by)
            };
            outln!(
                "    {}  (needed by {})",
                clean(&file_name(&l.path)),
                clean(&by)
            );
            let c = &l.gpu_code;
            outln!(
                "      SASS   {}  ({} cubins)",
                code_list(&c.sass, false),
                c.sass_total()
            );
            outln!(
                "      PTX    {}  ({} entries)",
                code_list(&c.ptx, true),
                c.ptx_total()
            );
            for w in &c.warnings {
                outln!("      warning {}", clean(w));
            }
        }
    }
    for w in &f.warnings {
        outln!("  warning  {}", clean(w));
    }
}

pub(super) fn print_coverage(rows: &[CoverageRow], targets: &Targets) {
    print_coverage_titled(rows, targets, "Coverage:")
}

/// [`print_coverage`] under `title` (which ends with a colon).
pub(super) fn print_coverage_titled(rows: &[CoverageRow], targets: &Targets, title: &str) {
    match targets {
        Targets::None(why) => outln!(
            "{}",
            crate::text::wrap(&format!("{title} "), "  ", &format!("not judged — {why}"))
        ),
        _ => {
            outln!("{title}");
            let width = rows.iter().map(|r| r.label.len()).max().unwrap_or(0);
            for r in rows {
                // A GPU's row names its arch too; an arch's row is its own name.
                let arch = r.arch.to_string();
                if r.label == arch {
                    outln!("  {:<width$}  {}", r.label, verdict_text(&r.verdict));
                } else {
                    outln!(
                        "  {:<width$}  {arch:<7}  {}",
                        r.label,
                        verdict_text(&r.verdict)
                    );
                }
                for (name, v) in &r.per_library {
                    outln!("      {}: {}", crate::text::clean(name), verdict_text(v));
                }
            }
        }
    }
}

/// Which kind of process an answer is for (`--process`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProcessArg {
    /// `python` importing torch: torch's own `__init__.py` opens libraries first
    Python,
    /// A program that links libtorch (floDl, C++)
    Program,
}

impl ProcessArg {
    pub fn kind(self) -> loader::python::ProcessKind {
        match self {
            ProcessArg::Python => loader::python::ProcessKind::Python,
            ProcessArg::Program => loader::python::ProcessKind::Program,
        }
    }
}

/// Which process `detect` and `plugins` answer for.
#[derive(Debug, clap::Args)]
pub struct ProcessFlags {
    /// Answer for this kind of process. Default: python for a pip torch (its
    /// site-packages/torch), program for any other libtorch
    #[arg(long, value_enum)]
    process: Option<ProcessArg>,
    /// The directory a Python process starts in (`python -c`/`-m`: its working directory,
    /// the first sys.path entry; `python script.py`: the script's). Default: this one,
    /// said as an assumption
    #[arg(long, value_name = "DIR")]
    cwd: Option<PathBuf>,
}

impl ProcessFlags {
    pub(in crate::cli) fn opts(&self) -> ProcessOpts<'_> {
        ProcessOpts {
            process: self.process,
            cwd: self.cwd.as_deref(),
        }
    }
}

/// The process options of `detect` and `plugins`.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ProcessOpts<'a> {
    pub process: Option<ProcessArg>,
    pub cwd: Option<&'a Path>,
}

/// What `detect` and `plugins` answer for: the file, what it is to the process, and the
/// Python process around it when a Python process is the one asked about.
pub(super) struct Target {
    pub lib: PathBuf,
    kind: loader::TargetKind,
    python: Option<loader::python::PythonProcess>,
    /// A pip torch answered for a program: the other kind is possible.
    pip_as_program: bool,
}

impl Target {
    /// The loader's environment of the process: `env`, with torch's own loads for Python.
    pub fn env(&self, env: &LoaderEnv) -> LoaderEnv {
        match &self.python {
            Some(p) => p.loader_env(env),
            None => env.clone(),
        }
    }

    /// One short line saying which process the answer is for, when two kinds could run it.
    pub fn process_line(&self) -> Option<String> {
        match &self.python {
            Some(p) => Some(format!(
                "{}; --process program for a program linking it",
                p.summary()
            )),
            None if self.pip_as_program => Some(
                "For a program that links libtorch_cuda.so; --process python for a Python process"
                    .into(),
            ),
            None => None,
        }
    }

    pub fn process_json(&self) -> serde_json::Value {
        match &self.python {
            Some(p) => json!({ "kind": "python", "python": p }),
            None => json!({ "kind": "program" }),
        }
    }

    /// What the Python model leaves unknown, or the import's failure: the answer then.
    pub fn python_unknown(&self) -> Option<loader::reason::Unknown> {
        self.python.as_ref()?.unknown_answer()
    }
}

/// `PATH` (a program or a library, as its headers say), else the active libtorch's
/// `libtorch_cuda.so` (a library a program links, whatever its headers say). A pip torch's
/// library is answered for a Python process importing it unless `--process program`.
fn detect_target(
    project: &Project,
    path: Option<&Path>,
    opts: ProcessOpts,
    env: &LoaderEnv,
) -> Result<Target> {
    match path {
        Some(p) => {
            let torch = p
                .parent()
                .and_then(Path::parent)
                .and_then(|t| t.canonicalize().ok())
                .filter(|t| crate::libtorch::is_pip_torch(t));
            target_for(
                p.to_path_buf(),
                loader::TargetKind::FromHeaders,
                torch,
                opts,
                env,
            )
        }
        None => {
            let v = Libtorch::new(project.libtorch_dir()).active()?;
            variant_target(&v, opts, env)
        }
    }
}

/// What a variant's answers are for: its `libtorch_cuda.so` linked by a program, or, for a
/// pip torch, imported by Python (unless `--process program`).
pub(super) fn variant_target(
    v: &crate::libtorch::Variant,
    opts: ProcessOpts,
    env: &LoaderEnv,
) -> Result<Target> {
    target_for(
        v.libtorch_cuda(),
        loader::TargetKind::Library,
        v.pip_torch(),
        opts,
        env,
    )
}

fn target_for(
    lib: PathBuf,
    kind: loader::TargetKind,
    torch: Option<PathBuf>,
    opts: ProcessOpts,
    env: &LoaderEnv,
) -> Result<Target> {
    let python = match (opts.process, &torch) {
        (Some(ProcessArg::Program), _) | (None, None) => None,
        (Some(ProcessArg::Python) | None, Some(t)) => {
            let launch = loader::python::Launch::from_env(opts.cwd.map(Path::to_path_buf));
            loader::python::PythonProcess::model(t, launch, env)?
        }
        (Some(ProcessArg::Python), None) => bail!(
            "{} is not a pip torch's library (site-packages/torch/lib/libtorch_cuda.so beside torch/__init__.py), so no Python process imports it as torch: leave out --process python to answer for a program that links it",
            crate::text::shown(&lib)
        ),
    };
    if opts.cwd.is_some() && python.is_none() {
        bail!("--cwd sets the directory a Python process starts in, and this answer is for a program that links the library: give --process python with a pip torch, or leave out --cwd");
    }
    let lib = match (&python, &torch) {
        // The library as Python opens it: under the torch directory sys.path names.
        (Some(_), Some(t)) => t.join("lib").join("libtorch_cuda.so"),
        _ => lib,
    };
    let kind = if python.is_some() {
        loader::TargetKind::Library
    } else {
        kind
    };
    Ok(Target {
        lib,
        kind,
        pip_as_program: python.is_none() && torch.is_some(),
        python,
    })
}

/// The flags of `nccl detect` besides the path.
pub(super) struct DetectOpts<'a> {
    pub preload: Option<&'a str>,
    pub library_path: Option<&'a str>,
    pub json: bool,
    pub witness: bool,
    pub verbose: bool,
    pub process: ProcessOpts<'a>,
}

pub(super) fn detect_cmd(project: &Project, path: Option<&Path>, o: DetectOpts) -> Result<()> {
    let DetectOpts {
        preload,
        library_path,
        json: json_out,
        witness,
        verbose,
        process: opts,
    } = o;
    let mut env = LoaderEnv::from_process();
    if let Some(p) = preload {
        env.preload = p.to_string();
    }
    if let Some(l) = library_path {
        env.ld_library_path = loader::search::split_path_list(l);
    }
    let target = detect_target(project, path, opts, &env)?;
    let env = target.env(&env);
    let lib = target.lib.clone();
    let mut w = loader::which_nccl_as(&lib, &env, None, target.kind)?;
    if let Some(why) = target.python_unknown() {
        w.answer = Answer::Unknown { reason: why };
    }
    if let (true, Some(p)) = (witness, &target.python) {
        return python_witness(&target, p, &w, &env, json_out, verbose);
    }
    let asked = witness.then(|| {
        let a = loader::witness::ask(&w, &env);
        let v = a.as_ref().ok().map(|x| loader::witness::compare(&w, x));
        (a, v)
    });
    if crate::process::interrupted() {
        // The trace was ended and its directory removed: say so, print no half answer.
        return Err(crate::process::Interrupted.into());
    }
    if json_out {
        let mut v = which_json(&w);
        v["library"] = json_path::value(&lib);
        v["process"] = target.process_json();
        // The object scripts of fdl 0.1 read, kept: `nccl.found`, `nccl.detection`.
        v["nccl"] = json!({ "found": v["found"], "detection": v["detection"] });
        v["environment"] = environment_json(&env);
        if let Some((a, verdict)) = &asked {
            v["witness"] = witness_json(a, verdict.as_ref());
        }
        print_json(&v);
    } else {
        if let Some(line) = target.process_line() {
            say("", "  ", &clean(&line));
        }
        if let (true, Some(p)) = (verbose, &target.python) {
            print_python(p);
        }
        print_which(&lib, &w, verbose);
        if let Some((a, verdict)) = &asked {
            print_witness(a, verdict.as_ref());
        }
    }
    if let Some((Ok(x), Some(verdict))) = &asked {
        match verdict {
            // Both answers are above (or in the JSON): the last line only says what the
            // exit status means, once.
            loader::witness::Verdict::Disagree { model, loader } => {
                return Err(super::common::ModelWrong(if json_out {
                    format!(
                        "fdl's model of the loader is wrong here: it says {}, but this host's loader says {}. The loader's answer stands; please report this",
                        crate::text::clean(model),
                        crate::text::clean(loader)
                    )
                } else {
                    "fdl's model of the loader is wrong here (exit status 4); the loader's answer above stands. Please report this".to_string()
                })
                .into());
            }
            loader::witness::Verdict::ModelUnknown { .. } => {
                return match loader_settles(x) {
                    Settles::Yes => Ok(()),
                    _ if json_out => Err(super::common::Undecided(x.summary()).into()),
                    _ => Err(super::common::Undecided(
                        "fdl cannot say which NCCL the process runs (exit status 3); the reason is above"
                            .to_string(),
                    )
                    .into()),
                };
            }
            _ => {}
        }
    }
    match &w.answer {
        Answer::Nccl { .. } | Answer::None { .. } => Ok(()),
        Answer::Unknown { .. } | Answer::Split { .. } => {
            Err(super::common::Undecided(undecided_line(&w, json_out)).into())
        }
    }
}

/// The loader environment an answer is for, as `detect --json` says it.
fn environment_json(env: &LoaderEnv) -> serde_json::Value {
    json!({
        "ld_preload": env.preload,
        "ld_so_preload": env.ld_so_preload,
        "ld_library_path": json_path::values(&env.ld_library_path),
        "system_dirs": json_path::values(&env.default_dirs),
        "system_dirs_from": env.system_dirs_from,
    })
}

/// `detect --witness` for a Python process: the model's answer, then the job's own
/// interpreter importing torch, read from outside (`loader::pywitness`), and whether the
/// two name the same file. Exit 4 when they differ (the process's answer stands).
fn python_witness(
    target: &Target,
    p: &loader::python::PythonProcess,
    w: &Which,
    env: &LoaderEnv,
    json_out: bool,
    verbose: bool,
) -> Result<()> {
    use loader::pywitness;
    // The job's environment is this one, with the loader flags as asked.
    // (An empty LD_LIBRARY_PATH is an unset one to glibc.)
    let joined = std::env::join_paths(&env.ld_library_path).unwrap_or_default();
    let set = vec![("LD_LIBRARY_PATH".into(), joined)];
    let vars = pywitness::job_env(&set, Some(std::ffi::OsStr::new(&env.preload)));
    let launch = pywitness::PythonLaunch {
        interpreter: p.interpreter.program.clone(),
        torch_dir: p.interpreter.site.join("torch"),
        cwd: p.launch.start.clone(),
        env: vars,
    };
    let asked = pywitness::ask_python(&launch, &pywitness::Limits::default());
    if crate::process::interrupted() {
        return Err(crate::process::Interrupted.into());
    }
    let model = match &w.answer {
        Answer::Nccl { detection } => Some(detection.file.as_path()),
        _ => None,
    };
    let verdict = asked.as_ref().ok().map(|x| pywitness::compare(model, x));
    if json_out {
        let mut v = which_json(w);
        v["library"] = json!(target.lib);
        v["nccl"] = json!({ "found": v["found"], "detection": v["detection"] });
        v["process"] = target.process_json();
        v["environment"] = environment_json(env);
        v["witness"] = match &asked {
            Ok(x) => {
                // The loader witness's shape: the files the calls reach, with their
                // symbols, and the verdict; `python` is the process as read.
                let mut reached: Vec<(PathBuf, Vec<String>)> = Vec::new();
                for c in &x.calls {
                    if let pywitness::Reach::File { path } = &c.reach {
                        match reached.iter_mut().find(|(f, _)| f == path) {
                            Some((_, s)) => s.push(c.symbol.clone()),
                            None => reached.push((path.clone(), vec![c.symbol.clone()])),
                        }
                    }
                }
                let callers: Vec<&PathBuf> = x.libtorch_cuda.iter().collect();
                json!({
                    "asked": true,
                    "kind": "python",
                    "interpreter": json_path::value(&x.interpreter),
                    "summary": clean(&x.summary()),
                    "reached": reached.iter().map(|(f, s)| json!({
                        "object": json_path::value(f), "callers": json_path::values(&callers), "symbols": s,
                    })).collect::<Vec<_>>(),
                    "verdict": match verdict.as_ref().and_then(|v| v.process().map(|p| (v, p))) {
                        Some((v, process)) => json!({
                            "verdict": v.word(),
                            "model": model.map(|m| m.display().to_string()),
                            "process": process,
                        }),
                        None => json!({
                            "verdict": "inconclusive",
                            "why": "the process's nccl* slots do not all point into one file",
                        }),
                    },
                    "python": x,
                })
            }
            Err(e) => json!({
                "asked": false,
                "kind": "python",
                "refused": e.refused(),
                "none": clean(&e.to_string()),
            }),
        };
        print_json(&v);
    } else {
        if let Some(line) = target.process_line() {
            say("", "  ", &clean(&line));
        }
        if verbose {
            print_python(p);
        }
        print_which(&target.lib, w, verbose);
        match &asked {
            Ok(x) => {
                say("Witness:  ", "  ", &clean(&x.summary()));
                if verbose {
                    for line in x.detail() {
                        say("  ", "    ", &clean(&line));
                    }
                }
            }
            Err(e) => say("Witness:  ", "  ", &clean(&format!("none: {e}"))),
        }
    }
    match (verdict, &w.answer) {
        (Some(pywitness::Verdict::Disagree { model, process }), _) => {
            Err(super::common::ModelWrong(format!(
                "fdl's model of this Python process is wrong here: it says {}, but the process's calls reach {}. The process's answer stands; please report this",
                crate::text::shown(&model),
                crate::text::shown(&process)
            ))
            .into())
        }
        (Some(pywitness::Verdict::ModelUnknown { .. }), _) => Ok(()),
        (_, Answer::Nccl { .. } | Answer::None { .. }) => Ok(()),
        (_, Answer::Unknown { .. } | Answer::Split { .. }) => {
            Err(super::common::Undecided(undecided_line(w, json_out)).into())
        }
    }
}

/// `nccl plugins`: for the NCCL the process runs, each plugin kind's names, where the
/// loader finds them (modelled: the witness traces startup, not a dlopen) and the verdict.
pub(super) fn plugins_cmd(
    project: &Project,
    path: Option<&Path>,
    json_out: bool,
    opts: ProcessOpts,
) -> Result<()> {
    let env = LoaderEnv::from_process();
    let target = detect_target(project, path, opts, &env)?;
    let env = target.env(&env);
    let lib = target.lib.clone();
    let mut w = loader::which_nccl_as(&lib, &env, None, target.kind)?;
    if let Some(why) = target.python_unknown() {
        w.answer = Answer::Unknown { reason: why };
    }
    let var = |k: &str| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned());
    let witness = json!({
        "asked": false,
        "none": "the host loader's trace covers a process's startup; NCCL opens plugins later, at communicator init, so this dlopen is fdl's model alone",
    });
    let p = match loader::plugins::plugins(&w, &env, &var) {
        Ok(p) => p,
        Err(why) => {
            // `--json` is one object on stdout whatever the answer: the unknown one too.
            if json_out {
                print_json(
                    &json!({ "library": json_path::value(&lib), "process": target.process_json(), "unknown": why, "witness": witness }),
                );
            }
            return Err(super::common::Undecided(why).into());
        }
    };
    if json_out {
        let mut v = serde_json::to_value(&p).unwrap_or_default();
        v["library"] = json_path::value(&lib);
        v["process"] = target.process_json();
        v["witness"] = witness;
        print_json(&v);
        return Ok(());
    }
    if let Some(line) = target.process_line() {
        say("", "  ", &clean(&line));
    }
    outln!("NCCL      {}", clean(&p.nccl.display().to_string()));
    for k in &p.kinds {
        let value = match &k.value {
            Some(v) => format!("{}={}", k.variable, clean(v)),
            None => format!("{} unset", k.variable),
        };
        let asks: Vec<String> = k.asks.iter().map(|v| format!("v{v}")).collect();
        let verdict = match &k.verdict {
            loader::plugins::Verdict::Loaded {
                path,
                version,
                from_net_plugin,
            } => format!(
                "{} {} with v{version}{}",
                paint("loads", Color::Green),
                clean(&path.display().to_string()),
                if from_net_plugin.is_some() {
                    " (the net plugin's tuner)"
                } else {
                    ""
                }
            ),
            loader::plugins::Verdict::NotFound => {
                "not found: NCCL uses its internal one".to_string()
            }
            loader::plugins::Verdict::NoCommonVersion { path, exports } => {
                let e: Vec<String> = exports.iter().map(|v| format!("v{v}")).collect();
                format!(
                    "{} {} exports {}, none of which this NCCL asks for: ignored",
                    paint("ignored:", Color::Yellow),
                    clean(&path.display().to_string()),
                    if e.is_empty() {
                        "no entry".to_string()
                    } else {
                        e.join(", ")
                    }
                )
            }
            loader::plugins::Verdict::Disabled => "disabled (none)".to_string(),
            loader::plugins::Verdict::Unknown { reason } => {
                format!("{} {}", paint("unknown:", Color::Yellow), clean(reason))
            }
        };
        outln!("{:<9} {verdict}", k.kind.name());
        outln!("          {value}; asks {}", asks.join(", "));
        for t in &k.tries {
            match &t.found {
                Some(f) => outln!(
                    "          dlopen {} → {} ({})",
                    clean(&t.name),
                    clean(&f.display().to_string()),
                    clean(t.via.as_deref().unwrap_or(""))
                ),
                None => outln!(
                    "          dlopen {} → {}",
                    clean(&t.name),
                    clean(t.error.as_deref().unwrap_or(""))
                ),
            }
        }
        for c in &k.caveats {
            outln!("          note: {}", clean(c));
        }
    }
    for f in &p.config_files {
        outln!(
            "note      {} exists: NCCL reads NCCL_*_PLUGIN from it too when unset here",
            clean(&f.display().to_string())
        );
    }
    outln!("witness   none: the host loader's trace covers startup; NCCL opens plugins at communicator init, so these dlopens are fdl's model");
    Ok(())
}

/// The loader's side of `detect --witness`, as JSON: `asked`, then either `none` (why
/// no loader was asked) or the trace and the verdict.
pub(super) fn witness_json(
    a: &Result<loader::witness::Witness, loader::witness::NoWitness>,
    verdict: Option<&loader::witness::Verdict>,
) -> serde_json::Value {
    match a {
        Err(n) => json!({
            "asked": false,
            "refused": n.refused,
            "none": n.reason,
        }),
        Ok(x) => {
            let mut v = serde_json::to_value(x).unwrap_or_default();
            v["asked"] = json!(true);
            v["answer"] = json!(x.kind());
            v["starts"] = json!(x.starts());
            v["summary"] = json!(x.summary());
            v["verdict"] = serde_json::to_value(verdict).unwrap_or_default();
            v
        }
    }
}

/// What the loader's answer settles when the model could not say.
enum Settles {
    /// One NCCL (or none) in a process that starts: the answer stands, exit 0.
    Yes,
    /// Two NCCLs in a process that starts: the answer stands, exit 3 as a split's.
    Split,
    /// The process cannot start here, or a call binds nowhere: still unknown, exit 3.
    No,
}

fn loader_settles(x: &loader::witness::Witness) -> Settles {
    use loader::witness::Kind;
    match x.kind() {
        Kind::Nccl | Kind::Local if x.starts() => Settles::Yes,
        Kind::Split if x.starts() => Settles::Split,
        _ => Settles::No,
    }
}

/// The loader's side of `detect --witness`, as text.
fn print_witness(
    a: &Result<loader::witness::Witness, loader::witness::NoWitness>,
    verdict: Option<&loader::witness::Verdict>,
) {
    let x = match a {
        Err(n) if n.refused => {
            say(
                "Witness: ",
                "  ",
                &format!("{} {}", paint("refused:", Color::Yellow), clean(&n.reason)),
            );
            return;
        }
        Err(n) => {
            say(
                "Witness: ",
                "  ",
                &format!("none on this host: {}", clean(&n.reason)),
            );
            return;
        }
        Ok(x) => x,
    };
    say(
        "Witness: ",
        "  ",
        &format!(
            "{} traced {} (nothing run)",
            clean(&x.interpreter.display().to_string()),
            clean(&x.traced.display().to_string())
        ),
    );
    for r in &x.reached {
        let callers: Vec<String> = r.callers.iter().map(|c| crate::text::shown(&c)).collect();
        say(
            "  ",
            "    ",
            &format!(
                "{} of {} → {}",
                clean(&functions(&r.symbols)),
                clean(&callers.join(", ")),
                clean(&r.object.display().to_string())
            ),
        );
    }
    say("  loader    ", DETECT_INDENT, &clean(&x.summary()));
    match verdict {
        Some(loader::witness::Verdict::Agree { why }) => say(
            "  verdict   ",
            DETECT_INDENT,
            &format!("{}: {}", paint("agrees", Color::Green), clean(why)),
        ),
        // The loader's answer is on the line above; the model's is said here.
        Some(loader::witness::Verdict::Disagree { model, .. }) => say(
            "  verdict   ",
            DETECT_INDENT,
            &format!(
                "{}: it says {}; the loader's answer above stands.",
                paint("fdl's model is wrong here", Color::Red),
                clean(model)
            ),
        ),
        // The loader's answer is on the line above: said once. Whether it stands is the
        // exit status: 0 where it is a process's that starts with one NCCL, else 3.
        Some(loader::witness::Verdict::ModelUnknown { .. }) => say(
            "  verdict   ",
            DETECT_INDENT,
            match loader_settles(x) {
                Settles::Yes => "the model could not say; the loader's answer above stands",
                Settles::Split => {
                    "the model could not say; the loader's answer above stands: two NCCLs"
                }
                Settles::No => {
                    "still unknown: the model could not say, and the process traced here cannot start or fails at a nccl* call"
                }
            },
        ),
        Some(loader::witness::Verdict::Inconclusive { why }) => say(
            "  verdict   ",
            DETECT_INDENT,
            &format!("no witness: {}; the model answers alone", clean(why)),
        ),
        None => {}
    }
    for warn in &x.warnings {
        say("  note      ", DETECT_INDENT, &clean(warn));
    }
}

/// Prints `text` wrapped to the terminal's width ([`crate::text::wrap`]): the first line
/// starts with `first`, the others with `rest`.
fn say(first: &str, rest: &str, text: &str) {
    outln!("{}", crate::text::wrap(first, rest, text));
}

/// `ncclA, ncclB`, or `ncclA, ncclB and 12 more nccl* functions`.
fn functions(symbols: &[String]) -> String {
    if symbols.len() <= 3 {
        symbols.join(", ")
    } else {
        format!(
            "{} and {} more nccl* functions",
            symbols[..2].join(", "),
            symbols.len() - 2
        )
    }
}

/// The answer, then the evidence: the calls, the objects that provide or could provide
/// NCCL, what the loader skipped or could not load. Without `verbose`, the answer is one
/// short line and each caller's calls one line (how each binds, and each library that is
/// not on this host, are said with `-v`; `--json` has everything).
/// `detect -v` for a Python process: what torch's import does, and the `sys.path` it walks.
fn print_python(p: &loader::python::PythonProcess) {
    say("  torch     ", DETECT_INDENT, &clean(&p.loading.summary()));
    if let Some(o) = p.nccl() {
        say(
            "  opens     ",
            DETECT_INDENT,
            &clean(&format!(
                "{} from sys.path entry {} ({})",
                o.path.display(),
                o.entry.path.display(),
                o.entry.from
            )),
        );
    }
    for (i, e) in p.sys_path.entries.iter().enumerate() {
        let head = if i == 0 {
            "  sys.path  "
        } else {
            "            "
        };
        say(
            head,
            DETECT_INDENT,
            &clean(&format!("{} ({})", e.path.display(), e.from)),
        );
    }
    for f in &p.sys_path.pth_imports {
        say(
            "  not run   ",
            DETECT_INDENT,
            &clean(&format!(
                "{}: its import lines run code, which may change sys.path",
                f.display()
            )),
        );
    }
}

fn print_which(lib: &Path, w: &Which, verbose: bool) {
    let path = |p: &Path| clean(&p.display().to_string());
    // What the short form leaves to -v.
    let mut left = false;
    match &w.answer {
        Answer::Nccl { detection: d } => {
            outln!("NCCL {} (built with CUDA {})", d.version, d.cuda);
            say("  library   ", DETECT_INDENT, &path(lib));
            say("  found in  ", DETECT_INDENT, &path(&d.file));
            say("  linkage   ", DETECT_INDENT, &clean(&linkage_text(d)));
        }
        Answer::None { reason } => say(
            "",
            "  ",
            &format!("No NCCL in a process that loads {}: {reason}.", path(lib)),
        ),
        Answer::Unknown { .. } | Answer::Split { .. } => {
            let split = matches!(w.answer, Answer::Split { .. });
            let head = if split {
                paint("Two NCCLs:", Color::Red)
            } else {
                paint("Unknown:", Color::Yellow)
            };
            if verbose {
                let what = if split {
                    "a process that loads it would run two NCCLs".to_string()
                } else {
                    "which NCCL a process that loads it runs".to_string()
                };
                say(
                    &format!("{head} "),
                    "  ",
                    &format!("{what}: {}", clean(&short_reason(&w.answer).0)),
                );
            } else {
                let (text, cut) = answer_short(w);
                left |= cut;
                say(&format!("{head} "), "  ", &clean(&text));
            }
            say("  library   ", DETECT_INDENT, &path(lib));
        }
    }
    if !w.calls.is_empty() {
        outln!("Calls:");
    }
    if verbose {
        for c in &w.calls {
            let what = if c.symbols.is_empty() {
                "its calls".to_string()
            } else {
                functions(&c.symbols)
            };
            let to = match &c.object {
                Some(o) => format!("→ {}", crate::text::shown(&o)),
                None => "→ nothing defines them".into(),
            };
            say(
                "  ",
                "    ",
                &format!(
                    "{} of {} {to}  ({})",
                    clean(&what),
                    path(&c.caller),
                    clean(&c.how)
                ),
            );
        }
    } else {
        // One line per caller and place: how many functions, and how they bind in words.
        let mut pairs: Vec<(&Path, Option<&Path>)> = Vec::new();
        for c in &w.calls {
            let pair = (c.caller.as_path(), c.object.as_deref());
            if !pairs.contains(&pair) {
                pairs.push(pair);
            }
        }
        for (caller, object) in pairs {
            let groups: Vec<&loader::CallGroup> = w
                .calls
                .iter()
                .filter(|c| c.caller == caller && c.object.as_deref() == object)
                .collect();
            let symbols: Vec<String> = groups.iter().flat_map(|c| c.symbols.clone()).collect();
            let what = if symbols.is_empty() {
                "its calls".to_string()
            } else {
                functions(&symbols)
            };
            let mut bound: Vec<&str> = Vec::new();
            for g in &groups {
                if !bound.contains(&g.bound.words()) {
                    bound.push(g.bound.words());
                }
            }
            left |= groups.len() > 1 || groups.iter().any(|g| g.bound != loader::Bound::Global);
            let to = match object {
                Some(o) => brief(w, o),
                None => "nothing defines them".into(),
            };
            say(
                "  ",
                "    ",
                &format!(
                    "{} of {} → {to}  ({})",
                    clean(&what),
                    brief(w, caller),
                    bound.join(", ")
                ),
            );
        }
    }
    let providers: Vec<&loader::Object> = w
        .link_map
        .objects
        .iter()
        .filter(|o| {
            matches!(o.found_by, loader::FoundBy::Preload { .. })
                || w.calls
                    .iter()
                    .any(|c| c.object.as_deref() == Some(o.path.as_path()))
        })
        .collect();
    if !providers.is_empty() {
        outln!("Loaded by:");
        for o in providers {
            say(
                "  ",
                "    ",
                &format!("{}  ({})", path(&o.path), clean(&o.found_by.to_string())),
            );
        }
    }
    for s in &w.link_map.skipped_preloads {
        say(
            "  ",
            "    ",
            &format!(
                "{} {} element '{}': {}",
                paint("skipped", Color::Yellow),
                s.source,
                clean(&s.entry),
                clean(&s.reason)
            ),
        );
    }
    // Without -v, the libraries that are simply not on this host are named on one line.
    let absent: Vec<&loader::LoadFailure> = w
        .link_map
        .failures
        .iter()
        .filter(|f| !verbose && f.is_absent() && !f.needed.starts_with("libnccl"))
        .collect();
    if absent.len() > 1 {
        left = true;
        let names: Vec<String> = absent.iter().map(|f| clean(&f.needed)).collect();
        let shown = if names.len() > 3 {
            format!("{} and {} more", names[..2].join(", "), names.len() - 2)
        } else {
            and_list(&names)
        };
        say(
            "  ",
            "    ",
            &format!(
                "{} {shown}: not found on this host",
                paint("cannot load", Color::Red)
            ),
        );
    }
    for f in &w.link_map.failures {
        if absent.len() > 1 && absent.iter().any(|a| std::ptr::eq(*a, f)) {
            continue;
        }
        say(
            "  ",
            "    ",
            &format!(
                "{} {} (needed by {}): {}",
                paint("cannot load", Color::Red),
                clean(&f.needed),
                path(&f.needed_by),
                clean(&f.reason)
            ),
        );
        if f.needed.starts_with("libnccl") && !f.searched.is_empty() {
            let dirs: Vec<String> = f
                .searched
                .iter()
                .map(|p| path(p.parent().unwrap_or(p)))
                .collect();
            say("    ", "      ", &format!("searched: {}", dirs.join(", ")));
        }
    }
    if w.link_map.failures_omitted > 0 {
        outln!(
            "  {} {} more DT_NEEDED entries (not listed)",
            paint("cannot load", Color::Red),
            w.link_map.failures_omitted
        );
    }
    if let Some(p) = &w.pin {
        say("  ", "    ", &format!("pinned: {}", clean(&p.to_string())));
    }
    outln!(
        "  ({} objects in the link map)",
        w.link_map
            .objects
            .iter()
            .filter(|o| !o.is_stand_in())
            .count()
    );
    if verbose {
        if short_reason(&w.answer).1 {
            outln!("  (the reason is shortened here; `--json` has it whole, every function named)");
        }
    } else if left {
        outln!("  (-v says how each call binds and why; `--json` has it all)");
    }
}

/// The stderr line of an unknown or split answer (after `unknown:`): the text answer
/// above already gave the reason, so it is not said again; with `--json` (nothing on
/// the terminal but the object) it is said once, shortened.
pub(super) fn undecided_line(w: &Which, json_out: bool) -> String {
    let what = match &w.answer {
        Answer::Split { .. } => "the process would run two NCCLs",
        _ => "fdl cannot say which NCCL the process runs",
    };
    match w.answer.reason() {
        Some(_) if json_out => format!("{what}: {}", answer_short(w).0),
        _ => format!("{what} (exit status 3); the reason is above"),
    }
}

pub(super) fn verify_cmd(
    ctx: &Context,
    project: &Project,
    build: Option<&str>,
    json_out: bool,
) -> Result<()> {
    let store = BuildStore::new(project.nccl_builds_dir());
    let entries = store.list()?;
    let chosen: Vec<&Entry> = match build {
        Some(name) => {
            crate::nccl::store::BuildName::parse(name)?;
            match entries.iter().find(|e| e.name() == name) {
                Some(e) => vec![e],
                None => bail!(
                    "no build named '{name}' in {}. See `fdl nccl list`",
                    crate::text::shown(&store.dir)
                ),
            }
        }
        None => entries.iter().collect(),
    };
    // Directories builds left beside the store are not builds: said, never verified.
    let leftovers = match build {
        Some(_) => Vec::new(),
        None => store.leftovers(&ctx.cache()?),
    };
    if chosen.is_empty() {
        super::manage::print_leftovers(&leftovers);
        bail!(
            "no NCCL builds in {} to verify. Make one with `fdl nccl build`",
            crate::text::shown(&store.dir)
        );
    }
    let gpus = gpu::query().ok();
    let driver = gpu::driver();
    let exe = std::env::current_exe()?;
    let probe = |lib: &Path| verify::probe_in_child(&exe, lib);
    let mut reports: Vec<Report> = Vec::new();
    for entry in chosen {
        let report = match entry {
            Entry::Build { name, manifest, .. } => {
                let against = Against {
                    recorded: Some(&manifest.checked),
                    files: manifest.files.as_deref(),
                    gpus: gpus.as_deref().map_or(LocalGpus::Unknown, LocalGpus::Known),
                    driver: Some(&driver),
                    probe: Some(&probe),
                };
                verify::verify(name, &store.path_of(name), &manifest.plan, &against)
            }
            Entry::Broken { name, why: what } => {
                failed_report(&store, name, format!("not a complete build: {what}"))
            }
            Entry::Unreadable { name, why } => {
                failed_report(&store, name, format!("its manifest cannot be read: {why}"))
            }
        };
        reports.push(report);
    }
    let failed: Vec<&str> = reports
        .iter()
        .filter(|r| !r.passed())
        .map(|r| r.build.as_str())
        .collect();
    if json_out {
        print_json(
            &json!({ "passed": failed.is_empty(), "reports": reports, "leftovers": leftovers }),
        );
    } else {
        let width = reports
            .iter()
            .flat_map(|r| {
                r.checks
                    .iter()
                    .chain(&r.host_coverage)
                    .map(|c| c.check.chars().count())
            })
            .max()
            .unwrap_or(0);
        for r in &reports {
            let head = if r.passed() {
                paint("ok", Color::Green)
            } else {
                paint("FAILED", Color::Red)
            };
            outln!("{}  {head}", r.build);
            let line = |c: &verify::Check, fail: &str| {
                let status = match c.status {
                    Status::Pass => paint("ok", Color::Green),
                    Status::Warn => paint("warn", Color::Yellow),
                    Status::Fail => paint(fail, Color::Red),
                    Status::Skipped => paint("skipped", Color::Yellow),
                };
                // Padded by the columns it shows: its colour marks take none.
                let pad = " ".repeat(7usize.saturating_sub(crate::text::columns(&status)));
                let first = format!("  {:<width$}  {status}{pad} ", c.check);
                let rest = " ".repeat(crate::text::columns(&first));
                outln!(
                    "{}",
                    super::common::stdout_row(&first, &rest, &crate::text::clean(&c.detail))
                );
            };
            for c in &r.checks {
                line(c, "FAIL");
            }
            if !r.host_coverage.is_empty() {
                outln!("  this host's GPUs and driver (not part of the build's verdict):");
                for c in &r.host_coverage {
                    line(
                        c,
                        if c.check == "driver" {
                            "TOO OLD"
                        } else {
                            "NOT COVERED"
                        },
                    );
                }
            }
        }
        super::manage::print_leftovers(&leftovers);
    }
    if !failed.is_empty() {
        let e = anyhow::anyhow!("verification failed for {}", failed.join(", "));
        // With --json the report above already says it, for scripts.
        return Err(if json_out {
            super::common::JsonReported(e).into()
        } else {
            e
        });
    }
    Ok(())
}

/// The hidden `fdl __probe-nccl LIB`: load, ask, print. Runs in a child of fdl.
pub(super) fn probe_cmd(lib: &Path) -> Result<()> {
    outln!("{}", verify::probe_in_process(lib)?);
    Ok(())
}

/// A report of one failed check for an entry that cannot be verified at all.
fn failed_report(store: &BuildStore, name: &str, detail: String) -> Report {
    Report {
        build: name.to_string(),
        dir: store.path_of(name),
        checks: vec![verify::Check {
            check: "build".into(),
            status: Status::Fail,
            detail,
        }],
        host_coverage: Vec::new(),
        checked: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::reason::{Reached, Split, SplitPart};
    use std::path::PathBuf;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("nccl{i}")).collect()
    }

    fn failure(needed: &str) -> Doubt {
        Doubt::LoadFailure {
            needed: needed.into(),
            needed_by: PathBuf::from("/venv/torch/lib/libtorch_cuda.so"),
            why: "cannot open shared object file: No such file or directory".into(),
            absent: true,
        }
    }

    #[test]
    fn short_reason_names_a_load_failure_by_its_library_and_counts_the_rest() {
        let answer = Answer::Unknown {
            reason: Unknown::Hidden {
                missing_pin: None,
                doubts: vec![failure("libcublas.so.13"), failure("libcudnn.so.9")],
                more: 2,
                if_none: Some(Reached {
                    object: PathBuf::from("/venv/nvidia/nccl/lib/libnccl.so.2"),
                    nccl: Some("2.27.5".parse().unwrap()),
                }),
            },
        };
        let full = answer.reason().unwrap();
        assert!(
            full.contains("libcublas.so.13 (needed by /venv/torch/lib/libtorch_cuda.so) cannot be loaded: cannot open"),
            "{full}"
        );
        let (short, cut) = short_reason(&answer);
        assert_eq!(
            short,
            format!(
                "{}: libcublas.so.13 cannot be loaded; libcudnn.so.9 cannot be loaded (and 2 more). If none of that defines nccl* functions, the calls bind to /venv/nvidia/nccl/lib/libnccl.so.2 (NCCL 2.27.5)",
                reason::HIDDEN
            )
        );
        // The library's name says which; the lines below say why: nothing is left out.
        assert!(!cut);
    }

    #[test]
    fn short_reason_lists_two_names_of_many_and_says_it_left_some_out() {
        let answer = Answer::Unknown {
            reason: Unknown::Undefined { names: names(5) },
        };
        let (short, cut) = short_reason(&answer);
        assert_eq!(
            short,
            "nothing loaded at start defines nccl0, nccl1 and 3 more: the call fails when made, unless a library loaded later with dlopen provides it"
        );
        assert!(cut);
        // Three are said whole, and the full reason has all five.
        let three = Answer::Unknown {
            reason: Unknown::Undefined { names: names(3) },
        };
        assert_eq!(short_reason(&three), (three.reason().unwrap(), false));
        assert!(answer
            .reason()
            .unwrap()
            .contains("nccl0, nccl1, nccl2, nccl3, nccl4:"));
    }

    #[test]
    fn short_reason_of_a_possible_call_and_a_split_keeps_their_clauses() {
        let at = Reached {
            object: PathBuf::from("/l/libtorch_cuda.so"),
            nccl: None,
        };
        let answer = Answer::Unknown {
            reason: Unknown::PossibleCall {
                at: at.clone(),
                names: names(4),
                why: "a PLT stub fdl cannot decode".into(),
                elsewhere: Vec::new(),
            },
        };
        let full = answer.reason().unwrap();
        assert_eq!(
            full,
            "/l/libtorch_cuda.so may call nccl0, nccl1, nccl2, nccl3 itself, which fdl cannot confirm (a PLT stub fdl cannot decode). If it does, those calls stay in /l/libtorch_cuda.so (no NCCL self-id), and nothing else calls NCCL; if not, nothing loaded at start calls it"
        );
        assert_eq!(
            short_reason(&answer),
            (
                full.replace("nccl0, nccl1, nccl2, nccl3", "nccl0, nccl1 and 2 more"),
                true
            )
        );
        let split = Answer::Split {
            reason: Split {
                objects: 2,
                parts: vec![
                    SplitPart {
                        names: names(6),
                        caller: PathBuf::from("/l/a.so"),
                        to: at.clone(),
                    },
                    SplitPart {
                        names: Vec::new(),
                        caller: PathBuf::from("/l/b.so"),
                        to: Reached {
                            object: PathBuf::from("/l/b.so"),
                            nccl: Some("2.30.7".parse().unwrap()),
                        },
                    },
                ],
            },
        };
        assert_eq!(
            split.reason().unwrap(),
            "NCCL's functions bind to 2 different objects, so the process runs two NCCLs that share no state: nccl0, nccl1, nccl2, nccl3, nccl4, nccl5 of /l/a.so → /l/libtorch_cuda.so (no NCCL self-id); its own calls of /l/b.so → /l/b.so (NCCL 2.30.7)"
        );
        let (short, cut) = short_reason(&split);
        assert!(
            short.contains(": nccl0, nccl1 and 4 more of /l/a.so → "),
            "{short}"
        );
        assert!(cut);
    }

    #[test]
    fn short_reason_cuts_a_long_clause_and_says_so() {
        let answer = Answer::Unknown {
            reason: Unknown::Python {
                why: vec!["x".repeat(300), "short".into()],
            },
        };
        let (short, cut) = short_reason(&answer);
        assert_eq!(short, format!("{}…; short", "x".repeat(CLAUSE)));
        assert!(cut);
    }
}
