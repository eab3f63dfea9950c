//! `fdl libtorch list|activate|add|remove|info`.

use super::common::print_json;
use super::inspect as ins;
use crate::inspect;
use crate::libtorch::Libtorch;
use crate::project::Project;
use anyhow::Result;
use clap::Subcommand;
use serde_json::json;

#[derive(Debug, Subcommand)]
pub enum LibtorchCommand {
    /// List the variants; the active one is marked
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
        variant: String,
        /// Do not ask
        #[arg(long, short)]
        yes: bool,
    },
    /// Show a variant's .arch metadata and the NCCL it bundles
    #[command(after_help = "Example:\n  fdl libtorch info precompiled/cu128")]
    Info {
        /// Default: the active variant
        variant: Option<String>,
        /// Judge coverage for these archs instead of the local GPUs
        #[arg(long)]
        archs: Option<String>,
        /// Print one JSON object
        #[arg(long)]
        json: bool,
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

pub(super) fn run(project: &Project, cmd: LibtorchCommand) -> Result<()> {
    let lt = Libtorch::new(project.libtorch_dir());
    match cmd {
        LibtorchCommand::List { json } => {
            let active = lt.active_name()?;
            let variants = lt.variants()?;
            if json {
                let rows: Vec<_> = variants
                    .iter()
                    .map(|v| json!({"name": v.name, "dir": v.dir, "active": Some(&v.name) == active.as_ref(), "missing": v.missing()}))
                    .collect();
                print_json(&json!({ "libtorch_dir": lt.dir, "active": active, "variants": rows }));
            } else if variants.is_empty() {
                outln!(
                    "No libtorch variants under {} (expected precompiled/<name> or builds/<name>).\nRegister one with `fdl libtorch add NAME PATH` (an unpacked libtorch, or a pip torch's torch/ directory).",
                    lt.dir.display()
                );
            } else {
                for v in &variants {
                    let mark = if Some(&v.name) == active.as_ref() {
                        "*"
                    } else {
                        " "
                    };
                    match v.missing() {
                        None => outln!("{mark} {}", crate::text::clean(&v.name)),
                        Some(why) => outln!(
                            "{mark} {}  (files missing: {})",
                            crate::text::clean(&v.name),
                            crate::text::clean(&why.to_string())
                        ),
                    }
                }
            }
            Ok(())
        }
        LibtorchCommand::Add { name, path, json } => {
            let (v, arch) = crate::libtorch::add::add(&lt, &name, &path)?;
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
                outln!("Registered {} → {}", v.name, path.display());
                for (k, val) in &arch {
                    let val = if val.is_empty() { "none" } else { val.as_str() };
                    outln!("  {k:<13}{val}");
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
            let _lock = crate::libtorch::lock_variant(kind_dir, base)?;
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
        } => {
            let v = match variant {
                Some(name) => lt.variant(&name)?,
                None => lt.active()?,
            };
            let meta = v.arch_metadata()?;
            let lib = v.libtorch_cuda();
            // Each part answers on its own: a damaged library still shows its metadata.
            let targets = ins::targets(archs.as_deref())?;
            let (nccl, code, judged) = if lib.is_file() {
                match inspect::inspect(&lib) {
                    // One read of the library answers both; only a dynamic NCCL needs more.
                    Ok(found) => {
                        let judged = ins::judged_rows(&found, &targets);
                        (
                            Some(ins::nccl_in(&found).map_err(|e| format!("{e:#}"))),
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
                    "dir": v.dir,
                    "arch": meta,
                    "libtorch_cuda": lib,
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
                    "coverage_of": coverage_of,
                }));
                return Ok(());
            }
            outln!(
                "{}  ({})",
                crate::text::clean(&v.name),
                crate::text::clean(&v.dir.display().to_string())
            );
            if !meta.is_empty() {
                outln!("  recorded in .arch when it was added:");
                let width = meta.keys().map(String::len).max().unwrap_or(0);
                for (k, val) in &meta {
                    let val = if val.is_empty() { "none" } else { val.as_str() };
                    // .arch is a file in the project: its text is shown escaped.
                    let (k, val) = (crate::text::clean(k), crate::text::clean(val));
                    outln!("    {k:<width$}  {val}");
                }
            }
            match &nccl {
                Some(Ok(Some(w))) => {
                    outln!("  NCCL now: {}", crate::text::clean(&ins::answer_line(w)))
                }
                Some(Ok(None)) => {
                    outln!("  NCCL now: none: {} is not an ELF file", lib.display())
                }
                Some(Err(e)) => outln!(
                    "  NCCL now: cannot tell: {}",
                    crate::text::clean(&e.to_string())
                ),
                None => outln!("  NCCL now: no {}", lib.display()),
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
