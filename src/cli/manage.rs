//! `fdl nccl list|remove|env`: seeing, deleting and wiring builds.

use super::common::print_json;
use crate::libtorch::Libtorch;
use crate::lock::Wait;
use crate::nccl::store::{BuildName, BuildStore, Entry, Existing, Manifest};
use crate::project::Project;
use crate::text::{clean, paint, Color};
use anyhow::{bail, Result};
use clap::ValueEnum;
use serde_json::json;
use std::path::PathBuf;

pub(super) fn list(project: &Project, json_out: bool) -> Result<()> {
    let store = BuildStore::new(project.nccl_builds_dir());
    let entries = store.list()?;
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
        print_json(&json!({ "builds_dir": store.dir, "entries": rows }));
        return Ok(());
    }
    if let Some(note) = project.fallback_note() {
        outln!("Note: {note}.");
    }
    if entries.is_empty() {
        outln!(
            "No NCCL builds in {}. Make one with `fdl nccl build`.",
            store.dir.display()
        );
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
            Entry::Partial { name, what } => notes.push((
                clean(name),
                paint(&clean(&format!("partial: {what}")), Color::Yellow),
            )),
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
    Ok(())
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

pub(super) fn remove(project: &Project, names: &[String], yes: bool, no_wait: bool) -> Result<()> {
    let store = BuildStore::new(project.nccl_builds_dir());
    // Check every name before deleting any, so a typo removes nothing.
    let mut parsed = Vec::new();
    for name in names {
        parsed.push(BuildName::parse(name)?);
        match store.existing(name)? {
            Some(Existing::Build(_) | Existing::Unreadable(_)) => {}
            Some(Existing::NotABuild(why)) => bail!(
                "{} is not an fdl build ({why}); nothing was removed",
                store.path_of(name).display()
            ),
            None => bail!(
                "no build named '{name}' in {}; nothing was removed. See `fdl nccl list`",
                store.dir.display()
            ),
        }
    }
    if !yes
        && !super::common::confirm(&format!(
            "Remove {} from {}?",
            names.join(", "),
            store.dir.display()
        ))?
    {
        // Declining is an answer, not an error.
        crate::eprintln_safe!("Nothing was removed.");
        return Ok(());
    }
    let wait = if no_wait { Wait::No } else { Wait::Yes };
    for name in &parsed {
        // The same lock as a build of this target: never delete one being (re)built.
        let lock = store.lock(name, &crate::cache::cache_dir()?, wait, &|msg| {
            crate::eprintln_safe!("{msg}")
        })?;
        let dir = store.remove(&lock)?;
        store.sweep_leftovers(&lock);
        outln!("Removed {}", dir.display());
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EnvFormat {
    /// `export LD_PRELOAD=...` for a shell
    Shell,
    /// The `env:` block of a worker in fdl.cluster.yml
    Yaml,
    Json,
}

pub(super) fn env(project: &Project, build: Option<&str>, format: EnvFormat) -> Result<()> {
    let store = BuildStore::new(project.nccl_builds_dir());
    let (name, manifest, why) = pick_build(project, &store, build, &Wiring::NCCL_ENV)?;
    let lib: PathBuf = store.path_of(&name).join("lib").join("libnccl.so.2");
    // A path the loader reads as one LD_PRELOAD element: the build's own, or a link in
    // the per-user cache when the project's path holds a space or a colon.
    let preload = crate::nccl::preload::preload_path(&lib, &name)?;
    // This output is `eval`ed or pasted: the path is quoted for its format too.
    let path = preload.to_str().expect("preload_path returns UTF-8 paths");
    let comment = comment_text(&format!(
        "{name}: NCCL {} ({why})",
        manifest.checked.header_version
    ));
    match format {
        EnvFormat::Shell => {
            outln!("# {comment}");
            outln!(
                "export LD_PRELOAD={}\"${{LD_PRELOAD:+:$LD_PRELOAD}}\"",
                crate::paste::shell(path)
            );
        }
        EnvFormat::Yaml => {
            outln!("# {comment}");
            outln!("env:\n  LD_PRELOAD: {}", yaml_quote(path));
        }
        EnvFormat::Json => print_json(&json!({
            "build": name,
            "nccl_version": manifest.checked.header_version,
            "ld_preload": preload,
            "why": why,
        })),
    }
    Ok(())
}

/// Which command asks for a build, so that its hints name the commands that fix things
/// in its own world: `fdl nccl build` for one host, `fdl cluster build` for a cluster.
pub(super) struct Wiring {
    /// Makes a build: `fdl nccl build`.
    pub make: &'static str,
    /// This command, to be given a build's name: `fdl nccl env`.
    pub this: &'static str,
}

impl Wiring {
    pub const NCCL_ENV: Wiring = Wiring {
        make: "fdl nccl build",
        this: "fdl nccl env",
    };
}

/// The build a wiring command is about: the one named, else the default (newest
/// matching the active libtorch), with why it was picked.
pub(super) fn pick_build(
    project: &Project,
    store: &BuildStore,
    build: Option<&str>,
    wiring: &Wiring,
) -> Result<(String, Manifest, String)> {
    Ok(match build {
        Some(name) => {
            BuildName::parse(name)?;
            match store.existing(name)? {
                Some(Existing::Build(m)) => (name.to_string(), *m, "named".to_string()),
                Some(Existing::Unreadable(why)) => bail!(
                    "the manifest of build '{name}' cannot be read ({why}); rebuild it with `{} --force`",
                    wiring.make
                ),
                Some(Existing::NotABuild(why)) => bail!(
                    "{} is not an fdl build ({why})",
                    store.path_of(name).display()
                ),
                None => bail!("no build named '{name}'. {}", builds_hint(store, wiring)?),
            }
        }
        None => default_build(project, store, wiring)?,
    })
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

/// The builds there are, as `name (NCCL x.y.z)`.
fn candidates(store: &BuildStore) -> Result<Vec<String>> {
    Ok(store
        .list()?
        .into_iter()
        .filter_map(|e| match e {
            Entry::Build { name, manifest, .. } => {
                Some(format!("{name} (NCCL {})", manifest.checked.header_version))
            }
            _ => None,
        })
        .collect())
}

/// What to say about the builds there are: their names, or that there are none yet.
fn builds_hint(store: &BuildStore, wiring: &Wiring) -> Result<String> {
    let names = candidates(store)?;
    Ok(if names.is_empty() {
        format!("There are no builds yet: make one with `{}`", wiring.make)
    } else {
        format!("Builds: {}", names.join(", "))
    })
}

/// The newest full build whose NCCL version is the active libtorch's.
fn default_build(
    project: &Project,
    store: &BuildStore,
    wiring: &Wiring,
) -> Result<(String, Manifest, String)> {
    let builds: Vec<(String, Manifest)> = store
        .list()?
        .into_iter()
        .filter_map(|e| match e {
            Entry::Build { name, manifest, .. } if manifest.plan.only_funcs.is_none() => {
                Some((name, *manifest))
            }
            _ => None,
        })
        .collect();
    let lt = Libtorch::new(project.libtorch_dir());
    let active = lt.active();
    let wanted = active.as_ref().ok().cloned().and_then(|v| {
        let lib = v.libtorch_cuda();
        // The NCCL it brings (static, pip-style, or pinned): the same answer as `fdl nccl
        // detect` without a preload.
        crate::loader::bundled_nccl(&lib)
            .ok()
            .and_then(|b| b.version().cloned())
            .map(|version| (v.name, version))
    });
    let Some((variant, version)) = wanted else {
        return match builds.as_slice() {
            [(name, m)] => Ok((name.clone(), m.clone(), "the only build".into())),
            _ => {
                let why = match &active {
                    // No libtorch to match: say that, not that its NCCL is unknown.
                    Err(e) => format!("there is no active libtorch to match ({e:#})"),
                    Ok(v) => format!(
                        "the NCCL version of the active libtorch {} is unknown (`fdl nccl detect` says why)",
                        v.name
                    ),
                };
                let name_one = if builds.is_empty() {
                    String::new()
                } else {
                    format!(". Name one: `{} BUILD`", wiring.this)
                };
                bail!(
                    "cannot choose a build: {why}. {}{name_one}",
                    builds_hint(store, wiring)?
                )
            }
        };
    };
    let same = |m: &Manifest| {
        let h = &m.checked.header_version;
        (h.major, h.minor, h.patch) == (version.major, version.minor, version.patch)
    };
    let newest = builds
        .iter()
        .filter(|(_, m)| same(m))
        .max_by(|(_, a), (_, b)| a.built_at.cmp(&b.built_at));
    match newest {
        Some((name, m)) => Ok((
            name.clone(),
            m.clone(),
            format!("newest build matching {variant}'s NCCL {version}"),
        )),
        None if builds.is_empty() => bail!(
            "no build matches the active libtorch {variant} (NCCL {version}): there are no builds yet. Make one with `{}`",
            wiring.make
        ),
        None => bail!(
            "no build matches the active libtorch {variant} (NCCL {version}): make one with `{}`, or name one (`{} BUILD`). {}",
            wiring.make,
            wiring.this,
            builds_hint(store, wiring)?
        ),
    }
}
