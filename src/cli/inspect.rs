//! `fdl inspect`, `fdl nccl detect` and `fdl nccl verify`: what a library carries, which
//! NCCL a libtorch uses, and whether a build is sound.

use super::common::print_json;
use crate::arch::{self, Arch, GpuTarget};
use crate::gpu::{self, Gpu};
use crate::inspect::{self, GpuCode, Linkage, NcclDetection, Verdict};
use crate::libtorch::Libtorch;
use crate::loader::{self, Answer, LoaderEnv, Which};
use crate::nccl::store::{BuildStore, Entry};
use crate::nccl::verify::{self, Against, LocalGpus, Report, Status};
use crate::project::Project;
use crate::text::{paint, Color};
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
}

pub(super) fn coverage_rows(code: &GpuCode, targets: &Targets) -> Vec<CoverageRow> {
    let row = |label: String, arch: Arch| CoverageRow {
        label,
        arch,
        verdict: inspect::coverage(code, arch),
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
    if entries.is_empty() {
        return "none".into();
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
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which NCCL a process that links the inspected library runs, in this process's
/// environment, reusing the inspection's self-ids. A non-ELF file has no loader.
pub(super) fn nccl_in(ins: &inspect::Inspection) -> Result<Option<Which>> {
    if !ins.elf {
        return Ok(None);
    }
    loader::which_nccl_knowing(&ins.path, &LoaderEnv::from_process(), Some(&ins.self_ids)).map(Some)
}

pub(super) fn linkage_text(d: &NcclDetection) -> String {
    match &d.linkage {
        Linkage::Static => "static (compiled into the library)".into(),
        Linkage::Dynamic { needed, via } => {
            format!(
                "dynamic: loads {needed} = {} (found via {via})",
                d.file.display()
            )
        }
        Linkage::Preload { entry } => format!("preloaded: {entry}"),
    }
}

/// The answer in one line, its reason shortened ([`short_reason`]).
pub(super) fn answer_line(w: &Which) -> String {
    match &w.answer {
        Answer::Nccl { detection: d } => {
            format!("{} (CUDA {}), {}", d.version, d.cuda, linkage_text(d))
        }
        Answer::None { reason } => format!("none: {reason}"),
        Answer::Unknown { reason } => format!("unknown: {}", short_with_pointer(w, reason)),
        Answer::Split { reason } => format!("TWO NCCLs: {}", short_with_pointer(w, reason)),
    }
}

/// [`short_reason`] on one line, saying where the whole reason is when it was shortened.
fn short_with_pointer(w: &Which, reason: &str) -> String {
    match short_reason(w, reason, false) {
        (text, true) => format!("{text} (shortened: `--json` has the whole reason)"),
        (text, false) => text,
    }
}

/// A reason as text output says it, once: a library that cannot be loaded is named by
/// its DT_NEEDED name when `failures_below` (the lines below say why), a list of more
/// than [`LISTED`] function names keeps its first two and counts the rest, and each
/// clause is at most [`CLAUSE`] characters. The second value says whether anything was
/// left out: then the text points to `--json`, which has the reason whole.
pub(super) fn short_reason(w: &Which, reason: &str, failures_below: bool) -> (String, bool) {
    let mut text = reason.to_string();
    let mut cut = false;
    for f in &w.link_map.failures {
        let sentence = format!(
            "{} (needed by {}) cannot be loaded: {}",
            f.needed,
            f.needed_by.display(),
            f.reason
        );
        if !text.contains(&sentence) {
            continue;
        }
        let short = if failures_below {
            // The `cannot load` lines below say why.
            format!("{} cannot be loaded", f.needed)
        } else {
            // The needing library by its file name; `--json` has its path.
            let by = f.needed_by.file_name().map(std::path::Path::new);
            let by = by.unwrap_or(&f.needed_by);
            cut |= by != f.needed_by;
            format!(
                "{} (needed by {}) cannot be loaded: {}",
                f.needed,
                by.display(),
                f.reason
            )
        };
        text = text.replace(&sentence, &short);
    }
    let clauses: Vec<String> = text
        .split("; ")
        .map(|clause| {
            let (c, listed) = collapse_lists(clause);
            cut |= listed;
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

/// `a, b, c, d, e` (names: letters, digits, `_`) → `a, b and 3 more`.
fn collapse_lists(clause: &str) -> (String, bool) {
    let is_name = |t: &str| {
        !t.is_empty()
            && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && t.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
    };
    let parts: Vec<&str> = clause.split(", ").collect();
    let mut out: Vec<String> = Vec::new();
    let mut changed = false;
    let mut i = 0;
    while i < parts.len() {
        // A run of names: the first may follow other words ("defines ncclA"), the last
        // may be followed by some ("ncclZ: the call fails").
        let first = parts[i].rsplit(' ').next().unwrap_or("");
        let mut j = i + 1;
        while j < parts.len() && is_name(parts[j]) {
            j += 1;
        }
        let tail_ok = j < parts.len() && is_name(parts[j].split([' ', ':']).next().unwrap_or(""));
        let run = j - i + usize::from(tail_ok);
        if is_name(first) && run > LISTED {
            let last = if tail_ok { j } else { j - 1 };
            let rest = if tail_ok {
                let p = parts[j];
                let name_len = p.find([' ', ':']).unwrap_or(p.len());
                &p[name_len..]
            } else {
                ""
            };
            out.push(format!(
                "{}, {} and {} more{rest}",
                parts[i],
                parts[i + 1],
                last - i - 1
            ));
            changed = true;
            i = last + 1;
        } else {
            out.push(parts[i].to_string());
            i += 1;
        }
    }
    (out.join(", "), changed)
}

/// The answer as JSON: `answer`, `reason`, the `nccl` object scripts read (`found`,
/// `detection`), and the evidence (calls, link map, skipped preloads, failures).
pub(super) fn which_json(w: &Which) -> serde_json::Value {
    json!({
        "answer": w.answer.kind(),
        "reason": w.answer.reason(),
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
            path.display()
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
    let rows = coverage_rows(&ins.gpu_code, &targets);
    if json_out {
        print_json(&json!({
            "inspection": ins,
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
    let row = |k: &str, v: String| outln!("  {k:<9}{}", crate::text::clean(&v));
    if let Some(s) = &ins.soname {
        row("soname", s.clone());
    }
    if !ins.needed.is_empty() {
        row("needed", ins.needed.join(" "));
    }
    if !ins.runpath.is_empty() {
        row("runpath", ins.runpath.join(":"));
    }
    if !ins.rpath.is_empty() {
        row("rpath", ins.rpath.join(":"));
    }
    row(
        "nccl",
        match &nccl {
            Ok(Some(w)) => answer_line(w),
            Ok(None) => static_line(&ins),
            Err(e) => format!(
                "{}; as a process would load it: cannot tell ({e})",
                static_line(&ins)
            ),
        },
    );
    let code = &ins.gpu_code;
    row(
        "SASS",
        format!(
            "{}  ({} cubins)",
            code_list(&code.sass, false),
            code.sass_total()
        ),
    );
    row(
        "PTX",
        format!(
            "{}  ({} entries)",
            code_list(&code.ptx, true),
            code.ptx_total()
        ),
    );
    for w in ins.warnings.iter().chain(code.warnings.iter()) {
        row("warning", w.clone());
    }
    print_coverage(&rows, &targets);
    Ok(())
}

pub(super) fn print_coverage(rows: &[CoverageRow], targets: &Targets) {
    match targets {
        Targets::None(why) => outln!("Coverage: not judged — {why}"),
        _ => {
            outln!("Coverage:");
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
            }
        }
    }
}

/// `PATH`, else the active libtorch's `libtorch_cuda.so`.
fn detect_target(project: &Project, path: Option<&Path>) -> Result<PathBuf> {
    Ok(match path {
        Some(p) => p.to_path_buf(),
        None => Libtorch::new(project.libtorch_dir())
            .active()?
            .libtorch_cuda(),
    })
}

pub(super) fn detect_cmd(
    project: &Project,
    path: Option<&Path>,
    preload: Option<&str>,
    library_path: Option<&str>,
    json_out: bool,
) -> Result<()> {
    let lib = detect_target(project, path)?;
    let mut env = LoaderEnv::from_process();
    if let Some(p) = preload {
        env.preload = p.to_string();
    }
    if let Some(l) = library_path {
        env.ld_library_path = loader::search::split_path_list(l);
    }
    let w = loader::which_nccl(&lib, &env)?;
    if json_out {
        let mut v = which_json(&w);
        v["library"] = json!(lib);
        // The object scripts of fdl 0.1 read, kept: `nccl.found`, `nccl.detection`.
        v["nccl"] = json!({ "found": v["found"], "detection": v["detection"] });
        v["environment"] = json!({
            "ld_preload": env.preload,
            "ld_so_preload": env.ld_so_preload,
            "ld_library_path": env.ld_library_path,
            "system_dirs": env.default_dirs,
            "system_dirs_from": env.system_dirs_from,
        });
        print_json(&v);
    } else {
        print_which(&lib, &w);
    }
    match &w.answer {
        Answer::Nccl { .. } | Answer::None { .. } => Ok(()),
        Answer::Unknown { .. } | Answer::Split { .. } => {
            Err(super::common::Undecided(undecided_line(&w, json_out)).into())
        }
    }
}

/// The answer, then the evidence: the calls, the objects that provide or could provide
/// NCCL, what the loader skipped or could not load.
fn print_which(lib: &Path, w: &Which) {
    let clean = crate::text::clean;
    match &w.answer {
        Answer::Nccl { detection: d } => {
            outln!("NCCL {} (built with CUDA {})", d.version, d.cuda);
            outln!("  library   {}", clean(&lib.display().to_string()));
            outln!("  found in  {}", clean(&d.file.display().to_string()));
            outln!("  linkage   {}", clean(&linkage_text(d)));
        }
        Answer::None { reason } => {
            outln!(
                "No NCCL in a process that loads {}: {reason}.",
                clean(&lib.display().to_string())
            )
        }
        Answer::Unknown { reason } => outln!(
            "{} which NCCL a process that loads {} runs: {}",
            paint("Unknown", Color::Yellow),
            clean(&lib.display().to_string()),
            clean(&short_reason(w, reason, true).0)
        ),
        Answer::Split { reason } => {
            outln!(
                "{} {}",
                paint("Two NCCLs:", Color::Red),
                clean(&short_reason(w, reason, true).0)
            )
        }
    }
    if !w.calls.is_empty() {
        outln!("Calls:");
        for c in &w.calls {
            let what = if c.symbols.is_empty() {
                "its calls".to_string()
            } else if c.symbols.len() <= 3 {
                c.symbols.join(", ")
            } else {
                format!(
                    "{} and {} more nccl* functions",
                    c.symbols[..2].join(", "),
                    c.symbols.len() - 2
                )
            };
            let to = match &c.object {
                Some(o) => format!("→ {}", o.display()),
                None => "→ nothing defines them".into(),
            };
            outln!(
                "  {} of {} {to}  ({})",
                clean(&what),
                clean(&c.caller.display().to_string()),
                clean(&c.how)
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
            outln!(
                "  {}  ({})",
                clean(&o.path.display().to_string()),
                clean(&o.found_by.to_string())
            );
        }
    }
    for s in &w.link_map.skipped_preloads {
        outln!(
            "  {} {} element '{}': {}",
            paint("skipped", Color::Yellow),
            s.source,
            clean(&s.entry),
            clean(&s.reason)
        );
    }
    for f in &w.link_map.failures {
        outln!(
            "  {} {} (needed by {}): {}",
            paint("cannot load", Color::Red),
            clean(&f.needed),
            clean(&f.needed_by.display().to_string()),
            clean(&f.reason)
        );
        if f.needed.starts_with("libnccl") && !f.searched.is_empty() {
            let dirs: Vec<String> = f
                .searched
                .iter()
                .map(|p| clean(&p.parent().unwrap_or(p).display().to_string()))
                .collect();
            outln!("    searched: {}", dirs.join(", "));
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
        outln!("  pinned: {}", clean(&p.to_string()));
    }
    outln!(
        "  ({} objects in the link map)",
        w.link_map
            .objects
            .iter()
            .filter(|o| !o.is_stand_in())
            .count()
    );
    if let Some(reason) = w.answer.reason() {
        if short_reason(w, reason, true).1 {
            outln!("  (the reason is shortened here; `--json` has it whole, every function named)");
        }
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
        Some(reason) if json_out => format!("{what}: {}", short_reason(w, reason, false).0),
        _ => format!("{what} (exit status 3); the reason is above"),
    }
}

pub(super) fn verify_cmd(project: &Project, build: Option<&str>, json_out: bool) -> Result<()> {
    let store = BuildStore::new(project.nccl_builds_dir());
    let entries = store.list()?;
    let chosen: Vec<&Entry> = match build {
        Some(name) => {
            crate::nccl::store::BuildName::parse(name)?;
            match entries.iter().find(|e| e.name() == name) {
                Some(e) => vec![e],
                None => bail!(
                    "no build named '{name}' in {}. See `fdl nccl list`",
                    store.dir.display()
                ),
            }
        }
        None => entries.iter().collect(),
    };
    if chosen.is_empty() {
        bail!(
            "no NCCL builds in {} to verify. Make one with `fdl nccl build`",
            store.dir.display()
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
            Entry::Partial { name, what } | Entry::Broken { name, why: what } => {
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
        print_json(&json!({ "passed": failed.is_empty(), "reports": reports }));
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
                outln!(
                    "  {:<width$}  {status:<7} {}",
                    c.check,
                    crate::text::clean(&c.detail)
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
