//! The store of NCCL builds under `libtorch/nccl/builds/`, and the transaction that adds
//! one.
//!
//! A build is a directory holding a manifest (`fdl-build.json`). A new build is made in a
//! hidden staging directory beside its target, checked, given its manifest, and only then
//! moved into place with one rename — so a failed or interrupted build never leaves a
//! directory that looks like a build, and never touches an existing one. Like rustup's
//! install transaction, [`Staging`] rolls everything back on `Drop` unless committed.

pub use super::name::{
    leftover_of, BuildName, LeftoverKind, DOCKER_WORK_PREFIX, INCOMING_PREFIX, LOG_NAME_EXTRA,
    LOG_SUFFIX, NATIVE_WORK_PREFIX,
};
use super::name::{REMOVING_PREFIX, STAGING_PREFIX};
use crate::lock::{self, BuildLock};
use crate::nccl::files::{self, FileEntry};
use crate::nccl::plan::BuildPlan;
use crate::nccl::tree::{self, CheckedTree};
use crate::nccl::verify::Check;
use crate::txn::{self, Transaction};
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub use crate::nccl::tree::MANIFEST;
/// The manifest format this fdl writes. 1: fdl 0.1 (no `schema` field, versions as
/// objects); 2: versions as strings, `schema` present. Reading takes any schema whose
/// fields this fdl understands, and ignores fields it does not know.
pub const MANIFEST_SCHEMA: u32 = 2;

/// One entry of the builds directory, as `fdl nccl list` shows it.
#[derive(Debug, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Entry {
    Build {
        name: String,
        manifest: Box<Manifest>,
        size_bytes: u64,
    },
    /// An fdl build (it has a manifest) whose manifest cannot be read: damaged, or
    /// written by a newer fdl. It can be removed, or replaced with `--force`.
    Unreadable { name: String, why: String },
    /// Something at a build's place that is not an fdl build.
    Broken { name: String, why: String },
}

impl Entry {
    pub fn name(&self) -> &str {
        match self {
            Entry::Build { name, .. }
            | Entry::Unreadable { name, .. }
            | Entry::Broken { name, .. } => name,
        }
    }
}

/// A directory fdl made beside a build while it ran ([`LeftoverKind`]): the build's
/// work in progress, or what a killed run left. Never a build, so never verified as one.
#[derive(Debug, Serialize)]
pub struct Leftover {
    pub name: String,
    /// The build it belongs to, whose lock guards it.
    pub build: BuildName,
    pub kind: LeftoverKind,
    pub what: String,
    pub size_bytes: u64,
    /// Seconds since it last changed; `None` where the clock or the file system cannot say.
    pub age_secs: Option<u64>,
    /// Who holds the build's lock now: a live build owns this directory, which must then
    /// be left alone. `None`: no run holds it, so it was left by one that was killed.
    pub held_by: Option<String>,
}

impl Leftover {
    /// How to get rid of it, or why not now.
    pub fn advice(&self) -> String {
        match &self.held_by {
            Some(holder) => format!(
                "in use by a running build ({}): leave it, it goes when that build ends",
                crate::text::clean(holder)
            ),
            None => format!(
                "left by an interrupted build: remove it with `fdl nccl remove {}`; the next build of {} removes it too",
                self.name, self.build
            ),
        }
    }
}

/// What is saved with every build: the plan that made it and what the check found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Absent in schema 1.
    #[serde(default = "schema_1")]
    pub schema: u32,
    pub fdl_version: String,
    /// RFC 3339, UTC.
    pub built_at: String,
    pub plan: BuildPlan,
    pub checked: CheckedTree,
    /// What `fdl nccl verify` found on the staged build before it was installed.
    #[serde(default)]
    pub verification: Vec<Check>,
    /// Every entry of the tree as sealed, each file with its BLAKE3 digest
    /// ([`crate::nccl::files`]): what `fdl nccl verify` reads the build against. Absent
    /// in manifests written before fdl recorded them, whose verify says "not recorded".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<Vec<FileEntry>>,
    /// The machine-wide store's key of this build, and whether it came from there.
    /// Absent in manifests of builds made without the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<crate::store::StoreRecord>,
}

fn schema_1() -> u32 {
    1
}

#[derive(Debug)]
pub enum Existing {
    Build(Box<Manifest>),
    /// An fdl build whose manifest cannot be read.
    Unreadable(String),
    /// Something is there, but not an fdl build (no manifest).
    NotABuild(String),
}

/// What a build directory holds, as far as its manifest tells.
enum Read {
    Build(Box<Manifest>),
    Unreadable(String),
    NotABuild(String),
}

fn read_build(dir: &Path) -> Read {
    let path = dir.join(MANIFEST);
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_file() => {}
        Ok(m) => {
            return Read::Unreadable(format!(
                "{} is not a regular file ({})",
                path.display(),
                crate::fsread::kind_of(&m.file_type())
            ))
        }
        Err(_) => return Read::NotABuild(format!("it has no {MANIFEST}")),
    }
    match read_manifest(dir) {
        Ok(m) => Read::Build(Box::new(m)),
        Err(e) => Read::Unreadable(format!("{e:#}")),
    }
}

#[derive(Debug, Clone)]
pub struct BuildStore {
    pub dir: PathBuf,
}

impl BuildStore {
    pub fn new(dir: PathBuf) -> Self {
        BuildStore { dir }
    }

    pub fn path_of(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Takes the lock of build `name`: the one thing that lets a caller change what is
    /// at its place ([`BuildStore::begin`], [`BuildStore::remove`],
    /// [`BuildStore::sweep_leftovers`] all take the guard).
    pub fn lock(
        &self,
        name: &BuildName,
        cache: &Path,
        wait: lock::Wait,
        on_wait: &dyn Fn(&str),
    ) -> Result<BuildLock> {
        lock::acquire(cache, &self.dir, name.as_str(), wait, on_wait)
    }

    /// The build a lock guards, checked to be one of this store's.
    fn locked<'l>(&self, lock: &'l BuildLock) -> Result<&'l str> {
        if lock.builds_dir != self.dir {
            bail!(
                "the lock of {} guards {}, not {}",
                lock.name,
                lock.builds_dir.display(),
                self.dir.display()
            );
        }
        Ok(&lock.name)
    }

    /// What is at the place of build `name`, if anything.
    pub fn existing(&self, name: &str) -> Result<Option<Existing>> {
        let dir = self.path_of(name);
        if std::fs::symlink_metadata(&dir).is_err() {
            return Ok(None);
        }
        if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
            return Ok(Some(Existing::NotABuild("not a directory".into())));
        }
        Ok(Some(match read_build(&dir) {
            Read::Build(m) => Existing::Build(m),
            Read::Unreadable(why) => Existing::Unreadable(why),
            Read::NotABuild(why) => Existing::NotABuild(why),
        }))
    }

    /// Every entry of the builds directory, sorted by name; none if it does not exist.
    pub fn list(&self) -> Result<Vec<Entry>> {
        let rd = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("cannot list {}", self.dir.display())),
        };
        let mut out = Vec::new();
        for entry in rd {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            // file_type() describes the entry itself: a symlink is never followed.
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if is_dir && leftover_of(&name).is_some() {
                // Listed by `leftovers`, never as a build.
                continue;
            }
            if !is_dir {
                let why = if leftover_of(&name).is_some() {
                    "named like a directory fdl leaves beside a build, but not a directory (fdl never makes a link or a file there): remove it by hand"
                } else {
                    "not a directory"
                };
                out.push(Entry::Broken {
                    name,
                    why: why.into(),
                });
                continue;
            }
            if name.starts_with('.') {
                out.push(Entry::Broken {
                    name,
                    why: "a hidden directory fdl did not make, not a build".into(),
                });
                continue;
            }
            out.push(match read_build(&path) {
                Read::Build(manifest) => Entry::Build {
                    name,
                    manifest,
                    size_bytes: crate::fsread::dir_size(&path),
                },
                Read::Unreadable(why) => Entry::Unreadable { name, why },
                Read::NotABuild(why) => Entry::Broken { name, why },
            });
        }
        out.sort_by(|a, b| a.name().cmp(b.name()));
        Ok(out)
    }

    /// The directories fdl made beside its builds that are still there (a live build's,
    /// or a killed one's: `held_by` tells), sorted by name. Only real directories named
    /// with fdl's own prefixes; a link so named is a broken entry of [`BuildStore::list`].
    /// `cache` is where the builds' locks live.
    pub fn leftovers(&self, cache: &Path) -> Vec<Leftover> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let now = std::time::SystemTime::now();
        let mut out = Vec::new();
        for entry in rd.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some((build, kind)) = leftover_of(&name) else {
                continue;
            };
            let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
                continue;
            };
            if !meta.is_dir() {
                continue;
            }
            let age_secs = meta
                .modified()
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .map(|d| d.as_secs());
            out.push(Leftover {
                size_bytes: crate::fsread::dir_size(&entry.path()),
                held_by: lock::holder(cache, &self.dir, build.as_str()),
                what: kind.what().to_string(),
                name,
                build,
                kind,
                age_secs,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Removes the leftover `name` of the locked build (the lock proves no live run owns
    /// it): only a real directory named with one of fdl's prefixes for that build, never
    /// through a link. An old build set aside by an interrupted replace is put back when
    /// the build itself is missing, as the next build would. Returns what was done.
    pub fn remove_leftover(&self, lock: &BuildLock, name: &str) -> Result<String> {
        let build = self.locked(lock)?;
        let Some((owner, kind)) = leftover_of(name) else {
            bail!(
                "'{}' is not a directory fdl leaves beside a build",
                crate::text::clean(name)
            );
        };
        if owner.as_str() != build {
            bail!("{name} belongs to build {owner}, not {build}");
        }
        let path = self.path_of(name);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => bail!(
                "{} is not a directory (fdl never makes a link or a file there); nothing was removed. Delete it by hand if you are sure",
                path.display()
            ),
            Err(_) => bail!("{} is gone already", path.display()),
        }
        let target = self.path_of(build);
        if kind == LeftoverKind::Replaced && std::fs::symlink_metadata(&target).is_err() {
            std::fs::rename(&path, &target)
                .with_context(|| format!("cannot put {} back", path.display()))?;
            return Ok(format!(
                "Restored {} from {name}: the interrupted replace had left no other build there",
                target.display()
            ));
        }
        std::fs::remove_dir_all(&path)
            .with_context(|| format!("cannot remove {}", path.display()))?;
        Ok(format!("Removed {}", path.display()))
    }

    /// Removes build `name`: it must be an fdl build (it has a manifest, readable or not:
    /// a damaged or too-new manifest must not make a build impossible to remove). The directory is
    /// renamed away first so it disappears at once, then deleted.
    pub fn remove(&self, lock: &BuildLock) -> Result<PathBuf> {
        let name = self.locked(lock)?;
        let dir = self.path_of(name);
        match self.existing(name)? {
            Some(Existing::Build(_) | Existing::Unreadable(_)) => {}
            Some(Existing::NotABuild(why)) => bail!(
                "{} is not an fdl build ({why}); fdl removes only builds it made. Delete it by hand if you are sure",
                dir.display()
            ),
            None => bail!("no build named '{name}' in {}. See `fdl nccl list`", self.dir.display()),
        }
        let aside = tempfile::Builder::new()
            .prefix(&format!("{REMOVING_PREFIX}{name}-"))
            .tempdir_in(&self.dir)?
            .keep();
        std::fs::remove_dir(&aside)?;
        std::fs::rename(&dir, &aside)
            .with_context(|| format!("cannot remove {}", dir.display()))?;
        std::fs::remove_dir_all(&aside).with_context(|| {
            format!(
                "{name} is gone from the store, but {} could not be deleted",
                aside.display()
            )
        })?;
        Ok(dir)
    }

    /// Cleans up after killed runs of build `name`: staging, removal and both backends'
    /// work directories are deleted; an old build set aside by an interrupted replace is renamed back when the
    /// target is missing (it is then the only build there is), deleted otherwise. The
    /// lock proves no live run owns them.
    pub fn sweep_leftovers(&self, lock: &BuildLock) -> Vec<String> {
        let mut done = Vec::new();
        let Ok(name) = self.locked(lock) else {
            return done;
        };
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return done;
        };
        let target = self.path_of(name);
        for entry in rd.flatten() {
            let file_name = entry.file_name().to_string_lossy().into_owned();
            // tempfile's random suffix never holds '-', so a longer name (`<name>-ptx`)
            // is another build, under another lock. A ship's copy is resumed, not swept.
            let ours = leftover_of(&file_name)
                .is_some_and(|(b, k)| b.as_str() == name && k != LeftoverKind::Incoming);
            // Never through a link: only the directories fdl made.
            if !ours || !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if let Some(what) = txn::restore_or_remove(&entry.path(), &target) {
                done.push(what);
            }
        }
        done
    }

    /// Opens a transaction for the locked build: a fresh staging directory beside it.
    pub fn begin(&self, ctx: &crate::context::Context, lock: &BuildLock) -> Result<Staging> {
        let name = self.locked(lock)?;
        let txn = Transaction::begin(
            ctx,
            self.path_of(name),
            &format!("{STAGING_PREFIX}{name}-"),
            "install",
        )?;
        Ok(Staging { txn })
    }
}

/// Manifests are small; anything larger is not one, and is not read into memory.
const MANIFEST_MAX_BYTES: u64 = 4 << 20;

pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    let path = dir.join(MANIFEST);
    let bytes = crate::fsread::read_regular(&path, MANIFEST_MAX_BYTES)?;
    let text = String::from_utf8(bytes).map_err(|_| {
        anyhow!(
            "{} is not UTF-8 text: it is no fdl manifest",
            path.display()
        )
    })?;
    parse_manifest(&text).with_context(|| format!("{} cannot be read", path.display()))
}

/// Parses a manifest of any schema. Unknown fields are ignored; when a newer schema
/// changed a field this fdl needs, the error says the manifest is from a newer fdl.
pub fn parse_manifest(text: &str) -> Result<Manifest> {
    let value: serde_json::Value =
        serde_json::from_str(text).context("it is not valid JSON (damaged or truncated)")?;
    let schema = match value.get("schema") {
        None => 1,
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| anyhow!("its schema is not a number: {v}"))?,
    };
    serde_json::from_value(value).map_err(|e| {
        if schema > MANIFEST_SCHEMA {
            anyhow!("it was written by a newer fdl (manifest schema {schema}; this fdl reads up to {MANIFEST_SCHEMA}) and has a field this fdl cannot read: {e}. Upgrade fdl, or rebuild with --force")
        } else {
            anyhow!("it is not a valid fdl manifest (schema {schema}): {e}")
        }
    })
}

/// An uncommitted build: a [`Transaction`] whose staging directory the backend fills.
/// Dropping it rolls everything back.
#[derive(Debug)]
pub struct Staging {
    txn: Transaction,
}

impl Staging {
    pub fn path(&self) -> &Path {
        self.txn.path()
    }

    /// Points `nccl.pc` at the final directory and writes the manifest: the plan, what
    /// [`check_tree`] established and the verification the tree passed. After this the
    /// staging directory is a complete build.
    pub fn seal(
        &self,
        plan: &BuildPlan,
        checked: CheckedTree,
        verification: Vec<Check>,
        store: Option<crate::store::StoreRecord>,
        known: &crate::digest::FileDigests,
    ) -> Result<Manifest> {
        tree::rewrite_pc_prefix(
            &self.path().join("lib/pkgconfig/nccl.pc"),
            self.txn.target(),
        )?;
        // Recorded from the staged tree itself, as it will be installed: every byte read,
        // once (`known`: what fdl hashed as it copied it into staging, in this run).
        let files =
            files::record_knowing(self.path(), known).context("cannot record the build's files")?;
        let manifest = Manifest {
            schema: MANIFEST_SCHEMA,
            fdl_version: env!("CARGO_PKG_VERSION").to_string(),
            built_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            plan: plan.clone(),
            checked,
            verification,
            files: Some(files),
            store,
        };
        let text = serde_json::to_string_pretty(&manifest)?;
        crate::fswrite::create_new(&self.path().join(MANIFEST), &mut (text + "\n").as_bytes())
            .context("cannot write the build's manifest")?;
        Ok(manifest)
    }

    /// Moves the staged build into place; with `replace`, over an existing build, crash-
    /// safely ([`Transaction::commit_replacing`]).
    pub fn commit(self, replace: bool) -> Result<crate::txn::Committed> {
        if replace {
            self.txn.commit_replacing()
        } else {
            self.txn.commit()?;
            Ok(crate::txn::Committed::Clean)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::txn::REPLACED_PREFIX;

    /// What a killed build left (both backends' work directories and its staging) is
    /// listed apart from the builds, marked held while a live build holds the lock, and
    /// swept by the next build of that name; another build's are left alone.
    #[test]
    fn leftovers_are_listed_apart_and_swept_only_under_their_builds_lock() {
        let t = tempfile::tempdir().unwrap();
        let cache = t.path().join("cache");
        let store = BuildStore::new(t.path().join("builds"));
        std::fs::create_dir_all(&store.dir).unwrap();
        let mine = [
            ".native-work-v1-sm61-AbC123",
            ".docker-work-v1-sm61-Zz9yX8",
            ".staging-v1-sm61-QwErTy",
        ];
        for n in mine.iter().chain(&[".native-work-v1-sm61-ptx-AbC123"]) {
            std::fs::create_dir(store.dir.join(n)).unwrap();
            std::fs::write(store.dir.join(n).join("obj.o"), "12345").unwrap();
        }
        std::os::unix::fs::symlink("/", store.dir.join(".staging-v1-sm61-LiNk00")).unwrap();
        assert!(
            store
                .list()
                .unwrap()
                .iter()
                .all(|e| e.name() == ".staging-v1-sm61-LiNk00"),
            "only the link is an entry (a broken one), no leftover"
        );
        let left = store.leftovers(&cache);
        assert_eq!(left.len(), 4, "{left:?}");
        assert!(left
            .iter()
            .all(|l| l.size_bytes >= 5 && l.age_secs.is_some() && l.held_by.is_none()));
        let name = BuildName::parse("v1-sm61").unwrap();
        let lock = store.lock(&name, &cache, lock::Wait::No, &|_| {}).unwrap();
        let held = store.leftovers(&cache);
        assert!(held
            .iter()
            .filter(|l| l.build == name)
            .all(|l| l.held_by.is_some()));
        assert!(held
            .iter()
            .any(|l| l.build.as_str() == "v1-sm61-ptx" && l.held_by.is_none()));
        assert_eq!(store.sweep_leftovers(&lock).len(), 3);
        let left: Vec<String> = store
            .leftovers(&cache)
            .into_iter()
            .map(|l| l.name)
            .collect();
        assert_eq!(left, [".native-work-v1-sm61-ptx-AbC123"]);
        assert!(std::fs::symlink_metadata(store.dir.join(".staging-v1-sm61-LiNk00")).is_ok());
        assert!(store
            .remove_leftover(&lock, ".staging-v1-sm61-LiNk00")
            .unwrap_err()
            .to_string()
            .contains("not a directory"));
        assert!(store
            .remove_leftover(&lock, ".native-work-v1-sm61-ptx-AbC123")
            .unwrap_err()
            .to_string()
            .contains("belongs to build v1-sm61-ptx"));
    }

    #[test]
    fn failed_transaction_leaves_nothing() {
        let t = tempfile::tempdir().unwrap();
        let store = BuildStore::new(t.path().join("libtorch/nccl/builds"));
        let name = BuildName::parse("v2.27.5-sm61").unwrap();
        let lock = store
            .lock(&name, &t.path().join("cache"), lock::Wait::No, &|_| {})
            .unwrap();
        let staging = store
            .begin(&crate::context::Context::from_process(), &lock)
            .unwrap();
        std::fs::write(staging.path().join("x"), "partial").unwrap();
        drop(staging);
        assert!(!t.path().join("libtorch").exists());
        assert!(BuildName::parse("../etc").is_err() && BuildName::parse(".x").is_err());
    }

    /// The machine-wide store reads a user's manifest by its own name for it.
    #[test]
    fn the_store_names_the_manifest_as_builds_do() {
        assert_eq!(crate::store::USER_MANIFEST, MANIFEST);
    }

    /// The longest name parses, and every name fdl derives from it is made for real
    /// (lock, staging, the set-aside and removal directories, both work directories, the
    /// log); one byte more is refused when parsed, naming the bound, never as "File name
    /// too long" later.
    #[test]
    fn the_longest_build_name_leaves_room_for_every_name_derived_from_it() {
        let longest = "n".repeat(BuildName::MAX_BYTES);
        let err = BuildName::parse(&format!("{longest}n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("at most {} bytes", BuildName::MAX_BYTES)),
            "{err}"
        );
        assert!(BuildName::parse(&"n".repeat(255)).is_err());

        let t = tempfile::tempdir().unwrap();
        let cache = t.path().join("cache");
        let store = BuildStore::new(t.path().join("libtorch/nccl/builds"));
        let name = BuildName::parse(&longest).unwrap();
        let lock = store.lock(&name, &cache, lock::Wait::No, &|_| {}).unwrap();
        let staging = store
            .begin(&crate::context::Context::from_process(), &lock)
            .unwrap();
        std::fs::write(staging.path().join("x"), "built").unwrap();
        let builds = store.dir.clone();
        // Each derived directory is made as its owner makes it: `<prefix><name>-<random>`.
        for prefix in [
            NATIVE_WORK_PREFIX,
            DOCKER_WORK_PREFIX,
            REPLACED_PREFIX,
            REMOVING_PREFIX,
        ] {
            tempfile::Builder::new()
                .prefix(&format!("{prefix}{name}-"))
                .tempdir_in(&builds)
                .unwrap();
        }
        std::fs::create_dir(builds.join(format!("{INCOMING_PREFIX}{name}"))).unwrap();
        let log = format!("{name}-{}-{}.log", u64::MAX, u32::MAX);
        assert_eq!(log.len(), name.as_str().len() + LOG_NAME_EXTRA);
        std::fs::write(t.path().join(log), "").unwrap();
        // The bound is the tightest: the longest derived name is exactly NAME_MAX.
        assert_eq!(
            BuildName::MAX_BYTES + super::super::name::LONGEST_DERIVED,
            255
        );
    }
}
