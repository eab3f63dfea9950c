//! libtorch variants under `libtorch/`: `precompiled/<name>` and `builds/<name>`, one of
//! them active (named by `libtorch/.active`), each with optional `.arch` metadata.
//! Discovery and activation here; registering an existing libtorch is in [`add`].

pub mod add;

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

/// The directories under `libtorch/` that hold variants.
pub const VARIANT_KINDS: &[&str] = &["precompiled", "builds"];

#[derive(Debug, Clone)]
pub struct Libtorch {
    pub dir: PathBuf,
}

#[derive(Debug, Clone, Serialize)]
pub struct Variant {
    /// `precompiled/cu128`
    pub name: String,
    pub dir: PathBuf,
}

impl Variant {
    /// The library that carries NCCL (statically) or loads it (pip-style).
    pub fn libtorch_cuda(&self) -> PathBuf {
        self.dir.join("lib").join("libtorch_cuda.so")
    }

    /// What is gone, when the variant's files are: its directory, or the library (a
    /// registered torch whose install was deleted or moved leaves dangling links).
    pub fn missing(&self) -> Option<String> {
        if !self.dir.is_dir() {
            return Some(format!("{} is gone", self.dir.display()));
        }
        let lib = self.libtorch_cuda();
        (!lib.is_file()).then(|| format!("{} is missing", lib.display()))
    }

    /// Whether `meta` (this variant's `.arch`) still describes its files, by the
    /// fingerprints it holds: a size and a time per file, so nothing is re-read.
    pub fn record(&self, meta: &BTreeMap<String, String>) -> Record {
        if meta.is_empty() {
            return Record::None;
        }
        let mut checked = false;
        for (key, file_key) in FINGERPRINTS {
            let Some(then) = meta.get(*key) else { continue };
            let path = match file_key {
                None => self.libtorch_cuda(),
                Some(k) => match meta.get(*k) {
                    Some(p) => PathBuf::from(p),
                    None => continue,
                },
            };
            checked = true;
            match fingerprint(&path) {
                None => {
                    return Record::Stale {
                        why: format!("{} is gone since it was recorded", path.display()),
                    }
                }
                Some(now) if now != *then => {
                    let size = |f: &str| f.split(" bytes").next().unwrap_or("").to_string();
                    let how = if size(&now) != size(then) {
                        format!("{} bytes then, {} now", size(then), size(&now))
                    } else {
                        "same size, modified since".to_string()
                    };
                    return Record::Stale {
                        why: format!("{} changed since it was recorded ({how})", path.display()),
                    };
                }
                Some(_) => {}
            }
        }
        if checked {
            Record::Current
        } else {
            Record::Unchecked
        }
    }

    /// `.arch`: `key=value` lines (torch=, cuda=, archs=, source=). Missing file → empty.
    /// The pip torch this variant was registered from (`.arch`'s `source`), when it is
    /// one a Python interpreter imports: a `torch/` directory with its `__init__.py` in a
    /// `site-packages` or `dist-packages` directory. A job of such a variant is run by
    /// Python; any other libtorch is linked by a program.
    pub fn pip_torch(&self) -> Option<PathBuf> {
        let source = PathBuf::from(self.arch_metadata().ok()?.get("source")?);
        is_pip_torch(&source).then_some(source)
    }

    /// The pip torch a Python process imports when answers are for `process` (`None`: the
    /// variant's own kind): `None` for a program; an error when Python is asked of a
    /// libtorch no interpreter imports.
    pub fn python_torch(
        &self,
        process: Option<crate::loader::python::ProcessKind>,
    ) -> Result<Option<PathBuf>> {
        use crate::loader::python::ProcessKind;
        match (process, self.pip_torch()) {
            (Some(ProcessKind::Program), _) => Ok(None),
            (_, Some(t)) => Ok(Some(t)),
            (Some(ProcessKind::Python), None) => bail!(
                "--process python: libtorch variant {} is not a pip torch (site-packages/torch with its __init__.py), so no Python process imports it as torch; leave out --process",
                self.name
            ),
            (None, None) => Ok(None),
        }
    }

    pub fn arch_metadata(&self) -> Result<BTreeMap<String, String>> {
        let path = self.dir.join(".arch");
        Ok(crate::fsread::read_text_if_present(&path, ARCH_MAX)?
            .map(|text| parse_key_values(&text))
            .unwrap_or_default())
    }
}

/// Whether `dir` is a torch a Python interpreter imports: `…/site-packages/torch` (or
/// `dist-packages`) holding `__init__.py`.
pub fn is_pip_torch(dir: &Path) -> bool {
    let site = dir.parent().and_then(Path::file_name);
    dir.file_name().is_some_and(|n| n == "torch")
        && site.is_some_and(|s| s == "site-packages" || s == "dist-packages")
        && dir.join("__init__.py").is_file()
}

/// The `.arch` keys that hold the fingerprint ([`fingerprint`]) of a file `libtorch add`
/// read, each with the key that names that file (`None`: the variant's libtorch_cuda.so).
pub const FINGERPRINTS: &[(&str, Option<&str>)] = &[
    ("libtorch_cuda_stat", None),
    ("nccl_library_stat", Some("nccl_library")),
];

/// What the size and modification time of `path` are, as `.arch` records them: enough
/// to see that a file changed since it was read, without reading it again (a
/// libtorch_cuda.so is about a gigabyte). `None` when it cannot be read.
pub fn fingerprint(path: &Path) -> Option<String> {
    let m = std::fs::metadata(path).ok()?;
    let t = m
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    Some(format!(
        "{} bytes, modified {}.{:09}",
        m.len(),
        t.as_secs(),
        t.subsec_nanos()
    ))
}

/// Whether a variant's `.arch` still describes its files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Record {
    /// No `.arch` at all.
    None,
    /// An `.arch` without fingerprints (written by hand, by floDl, or by an fdl before
    /// they were recorded): its facts cannot be checked.
    Unchecked,
    /// Every file it fingerprinted is as it was.
    Current,
    /// A file changed or is gone since the record was written.
    Stale { why: String },
}

/// `.arch` is a few `key=value` lines; `.active` one name.
const ARCH_MAX: u64 = 64 << 10;
const ACTIVE_MAX: u64 = 4 << 10;

pub fn parse_key_values(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

impl Libtorch {
    pub fn new(dir: PathBuf) -> Self {
        Libtorch { dir }
    }

    fn active_file(&self) -> PathBuf {
        self.dir.join(".active")
    }

    /// Every variant, sorted by name. A missing `libtorch/` is simply no variants.
    pub fn variants(&self) -> Result<Vec<Variant>> {
        let mut out = Vec::new();
        for kind in VARIANT_KINDS {
            let kind_dir = self.dir.join(kind);
            let entries = match std::fs::read_dir(&kind_dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot list {}", kind_dir.display()))
                }
            };
            for entry in entries {
                let entry = entry?;
                let name = entry.file_name().to_string_lossy().into_owned();
                // `is_dir` follows links: a registered pip torch is a link to its directory.
                if name.starts_with('.') || !entry.path().is_dir() {
                    continue;
                }
                out.push(Variant {
                    name: format!("{kind}/{name}"),
                    dir: entry.path(),
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Resolves a variant name to its directory, refusing anything outside
    /// `libtorch/precompiled` or `libtorch/builds`. A bare name (`cu128`) is taken when
    /// exactly one of the two holds it.
    pub fn variant(&self, name: &str) -> Result<Variant> {
        let name = name.trim().trim_end_matches('/');
        if !name.is_empty() && !name.contains('/') && name != "." && name != ".." {
            let found: Vec<String> = VARIANT_KINDS
                .iter()
                .map(|k| format!("{k}/{name}"))
                .filter(|n| self.dir.join(n).is_dir())
                .collect();
            match found.as_slice() {
                [one] => return self.variant(one),
                // A bare name is accepted: one that names nothing is a missing variant.
                [] if std::fs::symlink_metadata(self.dir.join(name)).is_err() => bail!(
                    "there is no libtorch variant '{name}' in {}. {}",
                    self.dir.display(),
                    self.known_hint()
                ),
                [] => {}
                many => bail!(
                    "'{name}' is ambiguous: it is {}. Name one of them",
                    many.join(" and ")
                ),
            }
        }
        let rel = Path::new(name);
        let mut comps = rel.components();
        let plain = rel.components().all(|c| matches!(c, Component::Normal(_)));
        let kind = comps.next().and_then(|c| c.as_os_str().to_str());
        let valid_kind = kind.is_some_and(|k| VARIANT_KINDS.contains(&k));
        if name.is_empty() || !plain || !valid_kind || rel.components().count() != 2 {
            bail!(
                "'{name}' is not a libtorch variant name: it must be precompiled/<name> or builds/<name> inside {}. See `fdl libtorch list`",
                self.dir.display()
            );
        }
        let dir = self.dir.join(rel);
        if !dir.is_dir() && std::fs::symlink_metadata(&dir).is_err() {
            bail!(
                "libtorch variant '{name}' does not exist (no directory {}). {}",
                dir.display(),
                self.known_hint()
            );
        }
        Ok(Variant {
            name: name.to_string(),
            dir,
        })
    }

    /// The variant `.active` names. Each way this can fail has its own message.
    pub fn active(&self) -> Result<Variant> {
        let file = self.active_file();
        let Some(text) = crate::fsread::read_text_if_present(&file, ACTIVE_MAX)? else {
            return Err(anyhow!(
                "no active libtorch: {} does not exist. {}",
                file.display(),
                self.activate_hint()
            ));
        };
        let name = text.lines().next().unwrap_or("").trim();
        if name.is_empty() {
            bail!("{} is empty. {}", file.display(), self.activate_hint());
        }
        self.variant(name)
            .with_context(|| format!("{} names '{name}'", file.display()))
    }

    /// The variants there are, or, when there are none, how to register one.
    pub fn known_hint(&self) -> String {
        let known: Vec<String> = self
            .variants()
            .unwrap_or_default()
            .into_iter()
            .map(|v| v.name)
            .collect();
        if known.is_empty() {
            "There are no variants yet: register one with `fdl libtorch add NAME PATH` (an unpacked libtorch, or a pip torch's torch/ directory)".to_string()
        } else {
            format!("Known variants: {}", known.join(", "))
        }
    }

    /// How to get an active variant: activate one of those there are, or add the first
    /// (which becomes active).
    fn activate_hint(&self) -> String {
        let known: Vec<String> = self
            .variants()
            .unwrap_or_default()
            .into_iter()
            .map(|v| v.name)
            .collect();
        match known.as_slice() {
            [] => "There are no variants yet: register one with `fdl libtorch add NAME PATH` (the first one becomes active)".to_string(),
            [one] => format!("Run `fdl libtorch activate {one}`"),
            many => format!(
                "Run `fdl libtorch activate VARIANT` with one of: {}",
                many.join(", ")
            ),
        }
    }

    /// The name `.active` holds; `None` where it is missing or empty. Anything there
    /// that is not a small regular file is an error, never a hang.
    pub fn active_name(&self) -> Result<Option<String>> {
        let Some(text) = crate::fsread::read_text_if_present(&self.active_file(), ACTIVE_MAX)?
        else {
            return Ok(None);
        };
        Ok(text
            .lines()
            .next()
            .map(|l| l.trim().to_string())
            .filter(|s| !s.is_empty()))
    }

    /// Deletes variant `name`. A registered variant is a directory of links, so this
    /// deletes the links and its `.arch`, never the torch they point to. The active
    /// variant is not removed.
    pub fn remove(&self, name: &str) -> Result<Variant> {
        let variant = self.variant(name)?;
        if self.active_name()?.as_deref() == Some(variant.name.as_str()) {
            bail!(
                "{} is the active libtorch: activate another one first (`fdl libtorch activate <variant>`)",
                variant.name
            );
        }
        let kind_dir = variant
            .dir
            .parent()
            .ok_or_else(|| anyhow!("{} has no parent", variant.dir.display()))?;
        let aside = tempfile::Builder::new()
            .prefix(".removing-")
            .tempdir_in(kind_dir)?
            .keep();
        std::fs::remove_dir(&aside)?;
        std::fs::rename(&variant.dir, &aside)
            .with_context(|| format!("cannot remove {}", variant.dir.display()))?;
        std::fs::remove_dir_all(&aside).with_context(|| {
            format!(
                "{} is gone from the list, but {} could not be deleted",
                variant.name,
                aside.display()
            )
        })?;
        Ok(variant)
    }

    /// Makes `name` the active variant. `.active` is replaced atomically: a crash leaves
    /// either the old or the new content, never a torn file.
    pub fn activate(&self, name: &str) -> Result<Variant> {
        let variant = self.variant(name)?;
        if let Some(why) = variant.missing() {
            bail!(
                "{} cannot be made active: {why}. Register it again with `fdl libtorch add`, or remove it with `fdl libtorch remove {}`",
                variant.name,
                variant.name
            );
        }
        let mut tmp = tempfile::Builder::new()
            .prefix(".active.")
            .tempfile_in(&self.dir)
            .with_context(|| format!("cannot write in {}", self.dir.display()))?;
        writeln!(tmp, "{}", variant.name)?;
        // A temporary file is private (0600); `.active` is an ordinary project file,
        // readable like every other one fdl writes.
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))?;
        tmp.as_file().sync_all()?;
        tmp.persist(self.active_file())
            .map_err(|e| e.error)
            .with_context(|| format!("cannot replace {}", self.active_file().display()))?;
        Ok(variant)
    }
}

/// The lock for one variant name under `kind_dir` (`precompiled/`), held by `libtorch
/// add` and `libtorch remove` alike: one add of a name at a time, and never a remove of
/// a variant being added. It waits, saying so through `ctx`, for the other holder.
pub fn lock_variant(
    ctx: &crate::context::Context,
    kind_dir: &Path,
    name: &str,
) -> Result<crate::lock::BuildLock> {
    crate::lock::acquire(
        &ctx.cache()?,
        kind_dir,
        &format!("variant-{name}"),
        crate::lock::Wait::Yes,
        &|msg| ctx.say(msg),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> (tempfile::TempDir, Libtorch) {
        let t = tempfile::tempdir().unwrap();
        let lt = t.path().join("libtorch");
        std::fs::create_dir_all(lt.join("precompiled/cu128/lib")).unwrap();
        std::fs::write(lt.join("precompiled/cu128/lib/libtorch_cuda.so"), "elf").unwrap();
        std::fs::create_dir_all(lt.join("builds/local")).unwrap();
        std::fs::create_dir_all(lt.join("nccl/builds")).unwrap();
        (t, Libtorch::new(lt))
    }

    #[test]
    fn lists_and_activates() {
        let (_t, lt) = layout();
        let names: Vec<_> = lt.variants().unwrap().into_iter().map(|v| v.name).collect();
        assert_eq!(names, ["builds/local", "precompiled/cu128"]);
        assert!(lt.active().is_err());
        lt.activate("precompiled/cu128").unwrap();
        assert_eq!(lt.active().unwrap().name, "precompiled/cu128");
        assert_eq!(
            std::fs::read_to_string(lt.dir.join(".active")).unwrap(),
            "precompiled/cu128\n"
        );
    }

    #[test]
    fn refuses_names_outside_libtorch() {
        let (_t, lt) = layout();
        for bad in [
            "../x",
            "/etc",
            "precompiled/../../x",
            "nccl/builds",
            "precompiled",
            "",
            "other/x",
        ] {
            let err = lt.variant(bad).unwrap_err().to_string();
            assert!(err.contains("not a libtorch variant name"), "{bad}: {err}");
        }
        let err = lt.variant("precompiled/nope").unwrap_err().to_string();
        assert!(
            err.contains("does not exist") && err.contains("precompiled/cu128"),
            "{err}"
        );
        assert!(lt.activate("precompiled/nope").is_err());
        assert!(!lt.dir.join(".active").exists());
    }

    #[test]
    fn bare_names_missing_files_and_removal() {
        let (_t, lt) = layout();
        assert_eq!(lt.variant("cu128").unwrap().name, "precompiled/cu128");
        assert_eq!(lt.variant("local").unwrap().name, "builds/local");
        std::fs::create_dir_all(lt.dir.join("builds/cu128")).unwrap();
        let e = lt.variant("cu128").unwrap_err().to_string();
        assert!(e.contains("ambiguous") && e.contains("builds/cu128"), "{e}");
        // builds/local has no library: listed, but not activated.
        let e = lt.activate("builds/local").unwrap_err().to_string();
        assert!(e.contains("is missing"), "{e}");
        lt.activate("precompiled/cu128").unwrap();
        assert!(lt
            .remove("precompiled/cu128")
            .unwrap_err()
            .to_string()
            .contains("active"));
        lt.remove("builds/local").unwrap();
        assert!(!lt.dir.join("builds/local").exists());
    }

    #[test]
    fn arch_metadata_is_key_values() {
        let m = parse_key_values("torch=2.8.0\n# c\ncuda = 12.8\narchs=6.1;12.0\njunk\n");
        assert_eq!(m["cuda"], "12.8");
        assert_eq!(m["archs"], "6.1;12.0");
        assert_eq!(m.len(), 3);
    }
}
