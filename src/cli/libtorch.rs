//! `fdl libtorch list|activate|add|remove|info`.

use super::common::print_json;
use super::inspect as ins;
use crate::context::Context;
use crate::inspect;
use crate::libtorch::Libtorch;
use crate::project::Project;
use anyhow::Result;
use clap::Subcommand;
use clap_complete::ArgValueCandidates;
use serde_json::json;

#[derive(Debug, Subcommand)]
pub enum LibtorchCommand {
    /// List the variants with the torch, CUDA and NCCL recorded when each was added (and
    /// whether that record is stale); the active one is marked
    #[command(after_help = "Example:\n  fdl libtorch list")]
    List {
        /// Print one JSON object
        #[arg(long)]
        json: bool,
    },
    /// Make a variant the active one
    #[command(after_help = "Example:\n  fdl libtorch activate precompiled/cu128")]
    Activate {
        /// precompiled/<name>, builds/<name>, or a bare name
        #[arg(add = ArgValueCandidates::new(super::complete::variants))]
        variant: String,
    },
    /// Register an existing libtorch (unpacked archive or pip torch/) as precompiled/NAME
    #[command(
        long_about = "Register an existing libtorch — an unpacked libtorch archive, or a pip torch's torch/ directory — \
as precompiled/NAME. Nothing is copied: the variant links to PATH, and its .arch is written from the binaries \
(torch and CUDA version, SASS archs, NCCL version and linkage).",
        after_help = "Examples:\n  fdl libtorch add cu128 ~/Downloads/libtorch\n  fdl libtorch add pip-cu128 .venv/lib/python3.12/site-packages/torch"
    )]
    Add {
        /// The variant's name under precompiled/
        name: String,
        /// The libtorch directory (holding lib/libtorch_cuda.so)
        path: std::path::PathBuf,
        /// Print one JSON object
        #[arg(long)]
        json: bool,
    },
    /// Remove a variant (a registered one's links only, never the torch they point to)
    #[command(after_help = "Example:\n  fdl libtorch remove pip-cu128 --yes")]
    Remove {
        /// precompiled/<name>, builds/<name>, or a bare name
        #[arg(add = ArgValueCandidates::new(super::complete::variants))]
        variant: String,
        /// Do not ask
        #[arg(long, short)]
        yes: bool,
    },
    /// Show a variant's .arch metadata and the NCCL it bundles
    #[command(after_help = "Example:\n  fdl libtorch info precompiled/cu128")]
    Info {
        /// Default: the active variant
        #[arg(add = ArgValueCandidates::new(super::complete::variants))]
        variant: Option<String>,
        /// Judge coverage for these archs instead of the local GPUs
        #[arg(long)]
        archs: Option<String>,
        /// Print one JSON object
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        process: super::inspect::ProcessFlags,
    },
}

impl LibtorchCommand {
    pub(super) fn wants_json(&self) -> bool {
        match self {
            LibtorchCommand::List { json }
            | LibtorchCommand::Add { json, .. }
            | LibtorchCommand::Info { json, .. } => *json,
            LibtorchCommand::Activate { .. } | LibtorchCommand::Remove { .. } => false,
        }
    }
}

pub(super) fn run(ctx: &Context, project: &Project, cmd: LibtorchCommand) -> Result<()> {
    let lt = Libtorch::new(project.libtorch_dir());
    match cmd {
        LibtorchCommand::List { json } => list(&lt, json),
        LibtorchCommand::Add { name, path, json } => {
            let (v, arch) = crate::libtorch::add::add(ctx, &lt, &name, &path)?;
            // The first variant of a project is the one it uses.
            let first_variant = lt.active_name()?.is_none();
            if first_variant {
                lt.activate(&v.name)?;
            }
            if json {
                let arch: serde_json::Map<String, serde_json::Value> = arch
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.into()))
                    .collect();
                print_json(&json!({ "variant": v.name, "dir": v.dir, "arch": arch }));
            } else {
                outln!("Registered {} → {}", v.name, crate::text::shown(&path));
                // The fingerprints are for `libtorch list` (and --json), not for reading.
                let shown = arch.iter().filter(|(k, _)| !is_fingerprint(k));
                // One space at least after the longest key (nccl_condition is 14 long).
                let width = shown.clone().map(|(k, _)| k.len() + 1).max().unwrap_or(0);
                let width = width.max(13);
                for (k, val) in shown {
                    let val = if val.is_empty() { "none" } else { val.as_str() };
                    let first = format!("  {k:<width$}");
                    let indent = " ".repeat(first.len());
                    outln!(
                        "{}",
                        crate::text::wrap(&first, &indent, &crate::text::clean(val))
                    );
                }
                if first_variant {
                    outln!("Active libtorch: {} (the first variant)", v.name);
                } else {
                    outln!("Make it active with `fdl libtorch activate {}`.", v.name);
                }
            }
            Ok(())
        }
        LibtorchCommand::Remove { variant, yes } => {
            let v = lt.variant(&variant)?;
            if !yes && !super::common::confirm(&format!("Remove the libtorch variant {}?", v.name))?
            {
                crate::eprintln_safe!("Nothing was removed.");
                return Ok(());
            }
            // The lock `libtorch add` takes for this name: never remove one being added.
            let kind_dir = v.dir.parent().unwrap_or(&lt.dir);
            let base = v.name.rsplit('/').next().unwrap_or(&v.name);
            let _lock = crate::libtorch::lock_variant(ctx, kind_dir, base)?;
            let v = lt.remove(&v.name)?;
            outln!("Removed {}", v.name);
            Ok(())
        }
        LibtorchCommand::Activate { variant } => {
            let v = lt.activate(&variant)?;
            outln!("Active libtorch: {}", v.name);
            Ok(())
        }
        LibtorchCommand::Info {
            variant,
            archs,
            json,
            process,
        } => {
            let v = match variant {
                Some(name) => lt.variant(&name)?,
                None => lt.active()?,
            };
            let meta = v.arch_metadata()?;
            let lib = v.libtorch_cuda();
            // "NCCL now" is the answer for the process that runs the variant.
            let env = crate::loader::LoaderEnv::from_process();
            let target = ins::variant_target(&v, process.opts(), &env)?;
            // Each part answers on its own: a damaged library still shows its metadata.
            let targets = ins::targets(archs.as_deref())?;
            let (nccl, code, judged) = if lib.is_file() {
                match inspect::inspect(&lib) {
                    // One read of the library answers both; only a dynamic NCCL needs more.
                    Ok(found) => {
                        let judged = ins::judged_rows(&found, &targets);
                        (
                            Some(
                                ins::nccl_in_for(&found, &target, &env)
                                    .map_err(|e| format!("{e:#}")),
                            ),
                            Some(Ok(found.gpu_code)),
                            Some(judged),
                        )
                    }
                    Err(e) => {
                        let why = format!("{e:#}");
                        (Some(Err(why.clone())), Some(Err(why)), None)
                    }
                }
            } else {
                (None, None, None)
            };
            let (rows, coverage_of, title) = judged.unwrap_or_default();
            if json {
                print_json(&json!({
                    "variant": v.name,
                    "process": target.process_json(),
                    "dir": crate::text::json_path::value(&v.dir),
                    "arch": meta,
                    "libtorch_cuda": crate::text::json_path::value(&lib),
                    "nccl": match &nccl {
                        Some(Ok(Some(w))) => ins::which_json(w),
                        Some(Ok(None)) => json!({
                            "answer": "none",
                            "found": false,
                            "reason": "not an ELF file: no process loads it",
                        }),
                        Some(Err(e)) => json!({ "error": e }),
                        None => json!(null),
                    },
                    "gpu_code": match &code {
                        Some(Ok(c)) => json!(c),
                        Some(Err(e)) => json!({ "error": e }),
                        None => json!(null),
                    },
                    "coverage": ins::coverage_json(&rows),
                    "coverage_of": crate::text::json_path::values(&coverage_of),
                }));
                return Ok(());
            }
            outln!(
                "{}  ({})",
                crate::text::clean(&v.name),
                crate::text::clean(&v.dir.display().to_string())
            );
            if let Some(line) = target.process_line() {
                outln!(
                    "{}",
                    crate::text::wrap("  ", "    ", &crate::text::clean(&line))
                );
            }
            if !meta.is_empty() {
                match v.record(&meta) {
                    crate::libtorch::Record::Stale { why } => outln!(
                        "  recorded in .arch when it was added (stale: {}):",
                        crate::text::clean(&why)
                    ),
                    _ => outln!("  recorded in .arch when it was added:"),
                }
                let shown = meta.iter().filter(|(k, _)| !is_fingerprint(k));
                let width = shown.clone().map(|(k, _)| k.len()).max().unwrap_or(0);
                for (k, val) in shown {
                    let val = if val.is_empty() { "none" } else { val.as_str() };
                    // .arch is a file in the project: its text is shown escaped.
                    let (k, val) = (crate::text::clean(k), crate::text::clean(val));
                    let first = format!("    {k:<width$}  ");
                    let indent = " ".repeat(first.len());
                    outln!("{}", crate::text::wrap(&first, &indent, &val));
                }
            }
            match &nccl {
                Some(Ok(Some(w))) => {
                    let (answer, cut) = ins::answer_line(w);
                    outln!(
                        "{}",
                        crate::text::wrap(
                            "  NCCL now: ",
                            "            ",
                            &crate::text::clean(&answer)
                        )
                    );
                    if cut {
                        outln!("            {}", ins::WHY_INSPECT);
                    }
                }
                Some(Ok(None)) => {
                    outln!(
                        "  NCCL now: none: {} is not an ELF file",
                        crate::text::shown(&lib)
                    )
                }
                Some(Err(e)) => outln!(
                    "  NCCL now: cannot tell: {}",
                    crate::text::clean(&e.to_string())
                ),
                None => outln!("  NCCL now: no {}", crate::text::shown(&lib)),
            }
            match &code {
                Some(Ok(_)) => ins::print_coverage_titled(&rows, &targets, &title),
                Some(Err(e)) => {
                    outln!(
                        "  gpu code cannot be read: {}",
                        crate::text::clean(&e.to_string())
                    )
                }
                None => {}
            }
            Ok(())
        }
    }
}

/// `fdl libtorch list`: each variant with what its `.arch` records, read as recorded
/// (never by inspecting the libraries again), and whether the record is stale.
fn list(lt: &Libtorch, json: bool) -> Result<()> {
    use crate::libtorch::Record;
    use crate::text::clean;
    let active = lt.active_name()?;
    let variants = lt.variants()?;
    // A variant whose .arch cannot be read is listed with the reason, not dropped.
    let rows: Vec<_> = variants
        .iter()
        .map(|v| {
            let meta = v.arch_metadata().map_err(|e| format!("{e:#}"));
            let record = match &meta {
                Ok(m) => v.record(m),
                Err(why) => Record::Stale {
                    why: format!("its .arch cannot be read: {why}"),
                },
            };
            (v, meta.unwrap_or_default(), record)
        })
        .collect();
    if json {
        let rows: Vec<_> = rows
            .iter()
            .map(|(v, meta, record)| {
                json!({
                    "name": v.name,
                    "dir": crate::text::json_path::value(&v.dir),
                    "active": Some(&v.name) == active.as_ref(),
                    "missing": v.missing(),
                    "arch": meta,
                    "record": record,
                })
            })
            .collect();
        print_json(
            &json!({ "libtorch_dir": crate::text::json_path::value(&lt.dir), "active": active, "variants": rows }),
        );
        return Ok(());
    }
    if variants.is_empty() {
        outln!(
            "No libtorch variants under {} (expected precompiled/<name> or builds/<name>).\nRegister one with `fdl libtorch add NAME PATH` (an unpacked libtorch, or a pip torch's torch/ directory).",
            clean(&lt.dir.display().to_string())
        );
        return Ok(());
    }
    // .arch is a file in the project: its text is shown escaped.
    let get = |meta: &std::collections::BTreeMap<String, String>, k: &str| {
        meta.get(k)
            .filter(|v| !v.is_empty())
            .map(|v| clean(v))
            .unwrap_or_else(|| "-".into())
    };
    let table: Vec<[String; 5]> = rows
        .iter()
        .map(|(v, meta, _)| {
            [
                clean(&v.name),
                get(meta, "torch"),
                get(meta, "cuda"),
                get(meta, "nccl"),
                get(meta, "nccl_linkage"),
            ]
        })
        .collect();
    let head = ["VARIANT", "TORCH", "CUDA", "NCCL", "LINKAGE"];
    let width = |i: usize| {
        table
            .iter()
            .map(|r| r[i].chars().count())
            .chain([head[i].len()])
            .max()
            .unwrap_or(0)
    };
    let w: Vec<usize> = (0..5).map(width).collect();
    let line = |mark: &str, r: &[String]| {
        format!(
            "{mark} {:<w0$}  {:<w1$}  {:<w2$}  {:<w3$}  {:<w4$}",
            r[0],
            r[1],
            r[2],
            r[3],
            r[4],
            w0 = w[0],
            w1 = w[1],
            w2 = w[2],
            w3 = w[3],
            w4 = w[4]
        )
    };
    let head: Vec<String> = head.iter().map(|h| h.to_string()).collect();
    outln!("{}", line(" ", &head).trim_end());
    let mut stale = Vec::new();
    for ((v, meta, record), r) in rows.iter().zip(&table) {
        let mark = if Some(&v.name) == active.as_ref() {
            "*"
        } else {
            " "
        };
        let mut text = line(mark, r);
        if let Some(why) = v.missing() {
            text.push_str(&format!("  (files missing: {})", clean(&why)));
        } else {
            match record {
                Record::None => text.push_str("  (no .arch: nothing recorded)"),
                Record::Stale { .. } => {
                    text.push_str("  (stale: see below)");
                    stale.push((v, meta, record));
                }
                Record::Unchecked | Record::Current => {}
            }
        }
        outln!("{}", text.trim_end());
    }
    for (v, meta, record) in stale {
        let Record::Stale { why } = record else {
            continue;
        };
        outln!("{} is stale: {}.", clean(&v.name), clean(why));
        outln!(
            "  Its facts as they are now: fdl libtorch info {}",
            crate::paste::shell(&v.name)
        );
        let base = v.name.strip_prefix("precompiled/");
        let is_active = Some(&v.name) == active.as_ref();
        if let (Some(base), Some(source), false) = (base, meta.get("source"), is_active) {
            outln!(
                "  Record them again: fdl libtorch remove {} --yes && fdl libtorch add {} {}",
                crate::paste::shell(&v.name),
                crate::paste::shell(base),
                crate::paste::shell(source)
            );
        }
    }
    Ok(())
}

/// A `.arch` key that holds a file's fingerprint ([`crate::libtorch::FINGERPRINTS`]).
fn is_fingerprint(key: &str) -> bool {
    crate::libtorch::FINGERPRINTS.iter().any(|(k, _)| *k == key)
}
