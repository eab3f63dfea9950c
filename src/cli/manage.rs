//! `fdl nccl list|remove|env`: seeing, deleting and wiring builds.

use super::common::print_json;
use crate::context::Context;
use crate::lock::Wait;
use crate::nccl::pick::Choice;
use crate::nccl::store::{leftover_of, BuildName, BuildStore, Entry, Existing, Leftover};
use crate::project::Project;
use crate::text::{clean, paint, Color};
use anyhow::{bail, Result};
use clap::ValueEnum;
use serde_json::json;
use std::path::PathBuf;

pub(super) fn list(ctx: &Context, project: &Project, json_out: bool) -> Result<()> {
    let store = BuildStore::new(project.nccl_builds_dir());
    let entries = store.list()?;
    let leftovers = store.leftovers(&ctx.cache()?);
    if json_out {
        // Each build with what its library carries, read from it as the text list does.
        let rows: Vec<serde_json::Value> = entries
            .iter()
            .map(|e| {
                let mut row = json!(e);
                if let Entry::Build { name, manifest, .. } = e {
                    let lib = store
                        .path_of(name)
                        .join("lib")
                        .join(&manifest.checked.library);
                    row["gpu_code"] = match crate::inspect::inspect(&lib) {
                        Ok(ins) => json!(ins.gpu_code),
                        Err(err) => json!({ "error": format!("{err:#}") }),
                    };
                }
                row
            })
            .collect();
        print_json(
            &json!({ "builds_dir": crate::text::json_path::value(&store.dir), "entries": rows, "leftovers": leftovers }),
        );
        return Ok(());
    }
    if let Some(note) = project.fallback_note() {
        outln!("Note: {note}.");
    }
    if entries.is_empty() {
        outln!(
            "No NCCL builds in {}. Make one with `fdl nccl build`.",
            crate::text::shown(&store.dir)
        );
        print_leftovers(&leftovers);
        return Ok(());
    }
    // Rows first, then columns as wide as their widest cell.
    let mut rows: Vec<Vec<String>> = vec![[
        "NAME", "NCCL", "CUDA", "SASS", "PTX", "BACKEND", "SIZE", "BUILT",
    ]
    .map(String::from)
    .to_vec()];
    let mut notes: Vec<(String, String)> = Vec::new();
    for e in &entries {
        match e {
            Entry::Build {
                name,
                manifest,
                size_bytes,
            } => {
                let plan = &manifest.plan;
                // What the library carries, read from its fatbin: the truth, not the plan.
                let lib = store
                    .path_of(name)
                    .join("lib")
                    .join(&manifest.checked.library);
                let (sass, ptx) = match crate::inspect::inspect(&lib) {
                    Ok(ins) => (
                        targets_list(&ins.gpu_code.sass, "sm_"),
                        targets_list(&ins.gpu_code.ptx, "compute_"),
                    ),
                    Err(_) => ("unreadable".to_string(), "?".to_string()),
                };
                let nccl = match &plan.only_funcs {
                    Some(_) => format!("{}*", manifest.checked.header_version),
                    None => manifest.checked.header_version.to_string(),
                };
                rows.push(vec![
                    name.clone(),
                    nccl,
                    plan.cuda.without_patch().to_string(),
                    sass,
                    ptx,
                    plan.backend.kind().to_string(),
                    indicatif::HumanBytes(*size_bytes).to_string(),
                    manifest.built_at.clone(),
                ]
                // From the manifest, a file anyone who could write the build wrote.
                .into_iter()
                .map(|c| clean(&c))
                .collect());
            }
            Entry::Unreadable { name, why } => notes.push((
                clean(name),
                paint(
                    &clean(&format!("unreadable: {why} (remove it with `fdl nccl remove {name}`, or rebuild with --force)")),
                    Color::Red,
                ),
            )),
            Entry::Broken { name, why } => notes.push((
                clean(name),
                paint(&clean(&format!("broken: {why}")), Color::Red),
            )),
        }
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (cell, w))| {
                if c == 6 {
                    format!("{cell:>w$}")
                } else {
                    format!("{cell:<w$}")
                }
            })
            .collect();
        outln!("{}", cells.join("  ").trim_end());
    }
    for (name, note) in notes {
        outln!("{name}  {note}");
    }
    if entries
        .iter()
        .any(|e| matches!(e, Entry::Build { manifest, .. } if manifest.plan.only_funcs.is_some()))
    {
        outln!("* development build (--only-funcs): not a full NCCL");
    }
    print_leftovers(&leftovers);
    Ok(())
}

/// The directories builds left beside the store, after its table: never builds, each
/// with its age, size and what to do about it.
pub(super) fn print_leftovers(leftovers: &[Leftover]) {
    if leftovers.is_empty() {
        return;
    }
    outln!();
    outln!("Leftovers of interrupted builds (not builds):");
    let width = leftovers
        .iter()
        .map(|l| l.name.chars().count())
        .max()
        .unwrap_or(0);
    for l in leftovers {
        let age = l.age_secs.map_or("age unknown".to_string(), |s| {
            format!("{} old", age_text(s))
        });
        outln!(
            "  {:<width$}  {}, {}: {}",
            clean(&l.name),
            indicatif::HumanBytes(l.size_bytes),
            age,
            paint(
                &clean(&format!("{}; {}", l.what, l.advice())),
                Color::Yellow
            )
        );
    }
}

/// `45 s`, `12 min`, `3 h`, `2 days`: how old a leftover is, to the unit that matters.
fn age_text(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s} s"),
        s if s < 2 * 3600 => format!("{} min", s / 60),
        s if s < 2 * 86400 => format!("{} h", s / 3600),
        s => format!("{} days", s / 86400),
    }
}

/// `sm_61,sm_120` (or `compute_…` for PTX); `-` for none.
fn targets_list(entries: &[crate::inspect::CodeEntry], prefix: &str) -> String {
    if entries.is_empty() {
        return "-".into();
    }
    entries
        .iter()
        .map(|e| e.target.to_string().replacen("sm_", prefix, 1))
        .collect::<Vec<_>>()
        .join(",")
}

pub(super) fn remove(
    ctx: &Context,
    project: &Project,
    names: &[String],
    yes: bool,
    no_wait: bool,
) -> Result<()> {
    let store = BuildStore::new(project.nccl_builds_dir());
    // Check every name before deleting any, so a typo removes nothing.
    let mut parsed = Vec::new();
    let cache = ctx.cache()?;
    for name in names {
        // A leftover of an interrupted build: only a real directory, only fdl's names.
        if let Some((build, _)) = leftover_of(name) {
            let path = store.path_of(name);
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => bail!(
                    "{} is not a directory fdl made (fdl never makes a link or a file there); nothing was removed. Delete it by hand if you are sure",
                    crate::text::shown(&path)
                ),
                Err(_) => bail!(
                    "no leftover named '{name}' in {}; nothing was removed. See `fdl nccl list`",
                    crate::text::shown(&store.dir)
                ),
            }
            parsed.push(Removal::Leftover {
                build,
                name: name.clone(),
            });
            continue;
        }
        parsed.push(Removal::Build(BuildName::parse(name)?));
        match store.existing(name)? {
            Some(Existing::Build(_) | Existing::Unreadable(_)) => {}
            Some(Existing::NotABuild(why)) => bail!(
                "{} is not an fdl build ({why}); nothing was removed",
                crate::text::shown(&store.path_of(name))
            ),
            None => bail!(
                "no build named '{name}' in {}; nothing was removed. See `fdl nccl list`",
                crate::text::shown(&store.dir)
            ),
        }
    }
    if !yes
        && !super::common::confirm(&format!(
            "Remove {} from {}?",
            names.join(", "),
            crate::text::shown(&store.dir)
        ))?
    {
        // Declining is an answer, not an error.
        crate::eprintln_safe!("Nothing was removed.");
        return Ok(());
    }
    let wait = if no_wait { Wait::No } else { Wait::Yes };
    for removal in &parsed {
        let build = match removal {
            Removal::Build(b) | Removal::Leftover { build: b, .. } => b,
        };
        // The same lock as a build of this target: never delete one being (re)built, nor
        // the directories a live build is working in.
        let lock = store.lock(build, &cache, wait, &|msg| crate::eprintln_safe!("{msg}"))?;
        match removal {
            Removal::Build(_) => {
                let dir = store.remove(&lock)?;
                store.sweep_leftovers(&lock);
                outln!("Removed {}", crate::text::shown(&dir));
            }
            Removal::Leftover { name, .. } => outln!("{}", store.remove_leftover(&lock, name)?),
        }
    }
    Ok(())
}

/// One name `fdl nccl remove` was given, checked.
enum Removal {
    Build(BuildName),
    /// A directory an interrupted build of `build` left ([`leftover_of`]).
    Leftover {
        build: BuildName,
        name: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EnvFormat {
    /// `export LD_PRELOAD=...` for a shell
    Shell,
    /// The `env:` block of a worker in fdl.cluster.yml
    Yaml,
    Json,
}

/// A build wired for this host: the choice (said on stderr), the `LD_PRELOAD` element
/// that names its library, and the plugins the preload would move (those it cannot keep
/// warned of on stderr). What `fdl nccl env` prints and `fdl launch` sets.
pub(super) struct Wired {
    pub choice: Choice,
    /// The build's `lib/`.
    pub lib_dir: PathBuf,
    pub preload: PathBuf,
    pub moved: Vec<Moved>,
}

pub(super) fn wire(
    ctx: &Context,
    project: &Project,
    build: Option<&str>,
    wiring: &Wiring,
) -> Result<Wired> {
    let store = BuildStore::new(project.nccl_builds_dir());
    let choice = pick_build(project, &store, build, wiring, &this_host)?;
    announce(&choice);
    let lib_dir = store.path_of(&choice.build).join("lib");
    // A path the loader reads as one LD_PRELOAD element: the build's own, or a link in
    // the per-user cache when the project's path holds a space or a colon.
    let preload = crate::nccl::preload::preload_path_in(
        &lib_dir.join("libnccl.so.2"),
        &choice.build,
        &ctx.cache()?,
    )?;
    let moved = plugins_moved(project, &preload);
    for m in moved.iter().filter(|m| m.keep.is_none()) {
        crate::eprintln_safe!("warning: {}", clean(&m.sentence()));
    }
    Ok(Wired {
        choice,
        lib_dir,
        preload,
        moved,
    })
}

pub(super) fn env(
    ctx: &Context,
    project: &Project,
    build: Option<&str>,
    format: EnvFormat,
) -> Result<()> {
    let Wired {
        choice,
        preload,
        moved,
        ..
    } = wire(ctx, project, build, &Wiring::NCCL_ENV)?;
    let (name, manifest, why) = (&choice.build, &choice.manifest, &choice.reason);
    // This output is `eval`ed or pasted: the path is quoted for its format too.
    let path = preload
        .to_str()
        .expect("preload_path_in returns UTF-8 paths");
    let comment = comment_text(&format!(
        "{name}: NCCL {} ({why})",
        manifest.checked.header_version
    ));
    let kept: Vec<&Moved> = moved.iter().filter(|m| m.keep.is_some()).collect();
    match format {
        EnvFormat::Shell => {
            outln!("# {comment}");
            outln!(
                "export LD_PRELOAD={}\"${{LD_PRELOAD:+:$LD_PRELOAD}}\"",
                crate::paste::shell(path)
            );
            for m in &kept {
                outln!("# {}", comment_text(&keeps(m)));
                outln!(
                    "export {}={}",
                    m.variable,
                    crate::paste::shell(m.keep.as_deref().unwrap_or_default())
                );
            }
        }
        EnvFormat::Yaml => {
            outln!("# {comment}");
            for m in &kept {
                outln!("# {}", comment_text(&keeps(m)));
            }
            outln!("env:\n  LD_PRELOAD: {}", yaml_quote(path));
            for m in &kept {
                outln!(
                    "  {}: {}",
                    m.variable,
                    yaml_quote(m.keep.as_deref().unwrap_or_default())
                );
            }
        }
        EnvFormat::Json => print_json(&json!({
            "build": name,
            "nccl_version": manifest.checked.header_version,
            "ld_preload": preload,
            "why": why,
            "choice": choice,
            "plugins_moved": moved,
        })),
    }
    Ok(())
}

use crate::loader::plugins::Moved;

/// The plugins the active libtorch's NCCL loads in this environment that the build,
/// preloaded from `preload`, would not load from the same file. Empty when fdl cannot
/// tell which NCCL runs today: there is nothing it knows to keep.
fn plugins_moved(project: &Project, preload: &std::path::Path) -> Vec<Moved> {
    let Ok(variant) = crate::libtorch::Libtorch::new(project.libtorch_dir()).active() else {
        return Vec::new();
    };
    let env = crate::loader::LoaderEnv::from_process();
    let var = |k: &str| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned());
    crate::loader::plugins::moved_by_preload(&variant.libtorch_cuda(), preload, &env, &var)
        .unwrap_or_default()
}

/// The comment above a line that keeps a plugin loaded.
fn keeps(m: &Moved) -> String {
    format!(
        "keeps the {} plugin {} (v{}) loaded: the preloaded build does not search where it is found today",
        m.kind.name(),
        crate::text::shown(&m.path),
        m.version
    )
}

pub(super) use crate::nccl::pick::Wiring;

/// This host's GPUs and driver, for the default build's choice.
pub(super) fn this_host() -> Vec<crate::nccl::pick::Host> {
    vec![crate::nccl::pick::Host {
        name: "this host".into(),
        gpus: crate::gpu::query()
            .map(|g| crate::gpu::distinct_archs(&g))
            .map_err(|e| e.to_string()),
        driver: crate::gpu::driver().map_err(|e| e.to_string()),
    }]
}

/// The build a wiring command is about ([`crate::nccl::pick::pick`]).
pub(super) fn pick_build(
    project: &Project,
    store: &BuildStore,
    build: Option<&str>,
    wiring: &Wiring,
    hosts: &dyn Fn() -> Vec<crate::nccl::pick::Host>,
) -> Result<Choice> {
    crate::nccl::pick::pick(project, store, build, wiring, hosts)
}

/// A default choice and its reason on stderr (stdout is `eval`ed or pasted), with any
/// check that could not be made.
pub(super) fn announce(choice: &Choice) {
    if choice.by != "named" {
        crate::eprintln_safe!(
            "fdl: chose build {}: {}",
            clean(&choice.build),
            clean(&choice.reason)
        );
    }
    for w in &choice.warnings {
        crate::eprintln_safe!("warning: {}", clean(w));
    }
    if let Some(other) = &choice.other_release {
        crate::eprintln_safe!("warning: build {}: {other}", clean(&choice.build));
    }
}

/// A YAML double-quoted scalar. YAML's double-quoted escapes are a superset of JSON's, so
/// a JSON string literal is one.
pub(super) fn yaml_quote(s: &str) -> String {
    crate::paste::yaml(s)
}

/// Text for a `#` comment line: control characters (a newline would end the comment and
/// make the rest a command) become spaces.
pub(super) fn comment_text(s: &str) -> String {
    crate::paste::comment(s)
}
