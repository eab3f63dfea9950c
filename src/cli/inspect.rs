//! `fdl inspect`, `fdl nccl detect` and `fdl nccl verify`: what a library carries, which
//! NCCL a libtorch uses, and whether a build is sound.

use super::{paint, print_json, Color};
use crate::arch::{self, Arch, GpuTarget};
use crate::gpu::{self, Gpu};
use crate::inspect::{self, GpuCode, Linkage, LoaderEnv, NcclDetection, UnresolvedNccl, Verdict};
use crate::libtorch::Libtorch;
use crate::nccl::store::{BuildStore, Entry};
use crate::nccl::verify::{self, Against, LocalGpus, Report, Status};
use crate::project::Project;
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
        Verdict::Native { sass } => paint(&format!("native SASS ({sass})"), Color::Green),
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
                Verdict::Native { sass } => ("native", Some(sass.to_string())),
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

/// NCCL of `lib`, static or through the loader. An unresolvable libnccl is an answer too.
pub(super) enum NcclAnswer {
    Found(NcclDetection),
    NotFound,
    Unresolved(UnresolvedNccl),
}

pub(super) fn nccl_of(lib: &Path) -> Result<NcclAnswer> {
    answer(inspect::detect_nccl(lib, &LoaderEnv::from_process()))
}

/// [`nccl_of`] for a library already inspected.
pub(super) fn nccl_in(ins: &inspect::Inspection) -> Result<NcclAnswer> {
    answer(inspect::detect_nccl_in(ins, &LoaderEnv::from_process()))
}

fn answer(detected: Result<Option<NcclDetection>>) -> Result<NcclAnswer> {
    match detected {
        Ok(Some(d)) => Ok(NcclAnswer::Found(d)),
        Ok(None) => Ok(NcclAnswer::NotFound),
        Err(e) => match e.downcast::<UnresolvedNccl>() {
            Ok(u) => Ok(NcclAnswer::Unresolved(u)),
            Err(e) => Err(e),
        },
    }
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
    }
}

pub(super) fn nccl_json(a: &NcclAnswer) -> serde_json::Value {
    match a {
        NcclAnswer::Found(d) => json!({ "found": true, "detection": d }),
        NcclAnswer::NotFound => json!({ "found": false }),
        NcclAnswer::Unresolved(u) => json!({
            "found": false,
            "unresolved": { "needed": u.needed, "searched": u.searched },
        }),
    }
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
    let nccl = nccl_in(&ins)?;
    let targets = targets(archs)?;
    let rows = coverage_rows(&ins.gpu_code, &targets);
    if json_out {
        print_json(&json!({
            "inspection": ins,
            "nccl": nccl_json(&nccl),
            "coverage": coverage_json(&rows),
            "coverage_note": match &targets { Targets::None(why) => Some(why.clone()), _ => None },
        }));
        return Ok(());
    }
    let mib = ins.size as f64 / (1024.0 * 1024.0);
    println!(
        "{}  ({mib:.1} MiB{})",
        ins.path.display(),
        if ins.elf { ", ELF" } else { ", not ELF" }
    );
    let row = |k: &str, v: String| println!("  {k:<9}{v}");
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
            NcclAnswer::Found(d) => format!("{} (CUDA {}), {}", d.version, d.cuda, linkage_text(d)),
            NcclAnswer::NotFound => "none: no self-id inside and no libnccl needed".into(),
            NcclAnswer::Unresolved(u) => format!("{u}"),
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
        Targets::None(why) => println!("Coverage: not judged — {why}"),
        _ => {
            println!("Coverage:");
            let width = rows.iter().map(|r| r.label.len()).max().unwrap_or(0);
            for r in rows {
                // A GPU's row names its arch too; an arch's row is its own name.
                let arch = r.arch.to_string();
                if r.label == arch {
                    println!("  {:<width$}  {}", r.label, verdict_text(&r.verdict));
                } else {
                    println!(
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

pub(super) fn detect_cmd(project: &Project, path: Option<&Path>, json_out: bool) -> Result<()> {
    let lib = detect_target(project, path)?;
    let answer = nccl_of(&lib)?;
    if json_out {
        print_json(&json!({ "library": lib, "nccl": nccl_json(&answer) }));
        if let NcclAnswer::Unresolved(u) = answer {
            // The object above already says it, for scripts.
            return Err(super::JsonReported(u.into()).into());
        }
        return Ok(());
    }
    match answer {
        NcclAnswer::Found(d) => {
            println!("NCCL {} (built with CUDA {})", d.version, d.cuda);
            println!("  library   {}", lib.display());
            println!("  found in  {}", d.file.display());
            println!("  linkage   {}", linkage_text(&d));
            Ok(())
        }
        NcclAnswer::NotFound => {
            println!(
                "No NCCL in {}: it carries no NCCL self-id and does not load libnccl.",
                lib.display()
            );
            Ok(())
        }
        NcclAnswer::Unresolved(u) => Err(u.into()),
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
    let exe = std::env::current_exe()?;
    let probe = |lib: &Path| verify::probe_in_child(&exe, lib);
    let mut reports: Vec<Report> = Vec::new();
    for entry in chosen {
        let report = match entry {
            Entry::Build { name, manifest, .. } => {
                let against = Against {
                    recorded: Some(&manifest.checked),
                    gpus: gpus.as_deref().map_or(LocalGpus::Unknown, LocalGpus::Known),
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
            .flat_map(|r| r.checks.iter().map(|c| c.check.chars().count()))
            .max()
            .unwrap_or(0);
        for r in &reports {
            let head = if r.passed() {
                paint("ok", Color::Green)
            } else {
                paint("FAILED", Color::Red)
            };
            println!("{}  {head}", r.build);
            for c in &r.checks {
                let status = match c.status {
                    Status::Pass => paint("ok", Color::Green),
                    Status::Warn => paint("warn", Color::Yellow),
                    Status::Fail => paint("FAIL", Color::Red),
                    Status::Skipped => paint("skipped", Color::Yellow),
                };
                println!("  {:<width$}  {status:<7} {}", c.check, c.detail);
            }
        }
    }
    if !failed.is_empty() {
        let e = anyhow::anyhow!("verification failed for {}", failed.join(", "));
        // With --json the report above already says it, for scripts.
        return Err(if json_out {
            super::JsonReported(e).into()
        } else {
            e
        });
    }
    Ok(())
}

/// The hidden `fdl __probe-nccl LIB`: load, ask, print. Runs in a child of fdl.
pub(super) fn probe_cmd(lib: &Path) -> Result<()> {
    println!("{}", verify::probe_in_process(lib)?);
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
        checked: None,
    }
}
