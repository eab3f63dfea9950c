//! The worker's half of `fdl cluster ship`, run there by the controller over SSH as
//! `fdl cluster receive`: what is at the build's place (absent, the same bytes, or
//! another build), and the install of a copy that arrived in `.incoming-<name>/`. The
//! install follows the local rules: the copy is moved into a fresh staging directory,
//! checked like `fdl nccl verify` (layout, versions, SASS, and that it loads), pointed
//! at its final directory (`nccl.pc`), and committed with one rename — or, with
//! `--force`, swapped in crash-safely. Anything that fails leaves no partial build.

use crate::lock::Wait;
use crate::nccl::store::{read_manifest, BuildName, BuildStore, Existing};
use crate::nccl::tree;
use crate::nccl::verify::{self, Against, LocalGpus};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub use crate::nccl::store::INCOMING_PREFIX;

/// A build's bytes, named by one digest: [`crate::store::content_digest`], which the
/// build store also records of its entries.
pub use crate::store::content_digest;

/// The digest of a build's payload, what NCCL's install made (`lib/`, `include/`, …):
/// [`content_digest`] without fdl's manifest and build log. It equals the digest a
/// machine-wide store entry records of its tree, so a worker whose store holds the
/// build's key can be told, before anything is copied, that it has these bytes.
pub fn payload_digest(dir: &Path) -> Result<String> {
    crate::digest::tree(
        dir,
        crate::digest::Hash::Sha256,
        crate::digest::Leave {
            top: &[],
            files: &[crate::store::PKG_CONFIG, tree::MANIFEST, tree::BUILD_LOG],
        },
        "a build",
    )
}

/// What is at a build's place on this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Place {
    Absent,
    /// A build is there; `digest` names its bytes.
    Build {
        digest: String,
    },
    /// Something that is not a readable build.
    Other {
        why: String,
    },
}

/// The answer to `receive --state`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateReport {
    pub schema: u32,
    pub place: Place,
    /// The directory a copy goes to (made only when asked to prepare).
    pub incoming: PathBuf,
    pub rsync: bool,
    /// Asked with a store key: the payload digest this host's machine-wide store records
    /// for that key (see [`payload_digest`]); `None` when it has no such entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// Asked to prepare: the token of the directory the copy goes to (see
    /// [`place_token`]). Hosts that answer the same token share that directory (one
    /// filesystem, an NFS home), so the controller copies and installs through one of
    /// them alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// What is at the place of build `name`. With `prepare`, the directory a copy goes to is
/// made (failing here, before anything is sent, where the path cannot be written);
/// without, nothing on the host changes.
pub fn state(
    builds_dir: &Path,
    name: &str,
    prepare: bool,
    store_key: Option<&str>,
    ctx: &crate::context::Context,
) -> Result<StateReport> {
    BuildName::parse(name)?;
    let in_store = match store_key {
        None => None,
        Some(key) => store_entry_digest(ctx, &crate::store::Key::parse(key)?),
    };
    let store = BuildStore::new(builds_dir.to_path_buf());
    let place = match store.existing(name)? {
        None => Place::Absent,
        Some(Existing::Build(_)) => Place::Build {
            digest: content_digest(&store.path_of(name))?,
        },
        Some(Existing::Unreadable(why)) | Some(Existing::NotABuild(why)) => Place::Other { why },
    };
    let mut incoming = builds_dir.join(format!("{INCOMING_PREFIX}{name}"));
    let mut place_id = None;
    if prepare {
        std::fs::create_dir_all(builds_dir).with_context(|| {
            format!(
                "cannot create {}: is the worker's path writable?",
                builds_dir.display()
            )
        })?;
        prepare_incoming(&incoming)?;
        place_id = Some(place_token(&incoming)?);
        // The physical path: the copy checks, once inside it, that it is where it
        // should be (a link swapped in after this answer is then refused, not followed).
        incoming = incoming
            .canonicalize()
            .with_context(|| format!("cannot resolve {}", incoming.display()))?;
    }
    let rsync = crate::process::on_path("rsync").is_some();
    Ok(StateReport {
        schema: super::host::REPORT_SCHEMA,
        place,
        incoming,
        rsync,
        store: in_store,
        token: place_id,
    })
}

/// The name of the file in `.incoming-<name>/` that holds its [`place_token`]. The copy
/// replaces everything in that directory, this file included, so it is never part of
/// what is installed.
const PLACE_FILE: &str = ".fdl-place";

/// A random token kept in the copy's directory `incoming` (made by fdl, checked by
/// [`prepare_incoming`]): made once, by whichever host gets there first (a new file
/// linked in, never replacing one), and read by every other host that sees the same
/// directory. Equal tokens mean one directory; random ones (128 bits) never collide, so
/// two hosts are never taken for one (as equal inode numbers on two disks could be).
fn place_token(incoming: &Path) -> Result<String> {
    use std::io::{Read, Write};
    let path = incoming.join(PLACE_FILE);
    let read = |path: &Path| -> Option<String> {
        let text = crate::fsread::read_text(path, 128).ok()?;
        let text = text.trim();
        is_sha256(text).then(|| text.to_string())
    };
    if let Some(token) = read(&path) {
        return Ok(token);
    }
    let mut random = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut random))
        .context("cannot read /dev/urandom")?;
    let token = crate::digest::sha256_hex(&random);
    let mut tmp = tempfile::NamedTempFile::new_in(incoming)
        .with_context(|| format!("cannot write in {}", incoming.display()))?;
    tmp.write_all(format!("{token}\n").as_bytes())?;
    match tmp.persist_noclobber(&path) {
        Ok(_) => Ok(token),
        // Another host of this directory made it first: its token is the directory's.
        Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => read(&path)
            .ok_or_else(|| anyhow::anyhow!("{} is not fdl's token: ship again", path.display())),
        Err(e) => Err(e.error).with_context(|| format!("cannot write {}", path.display())),
    }
}

/// What this user's store records of `key`'s entry: its payload digest. Only a look (an
/// entry is checked byte for byte when it is installed); any trouble reading it is "not
/// there", and the build is copied instead.
fn store_entry_digest(ctx: &crate::context::Context, key: &crate::store::Key) -> Option<String> {
    let cache = ctx.cache().ok()?;
    let store = crate::store::Store::at(&cache).ok()?;
    store.lookup(key).ok().flatten().map(|r| r.digest)
}

/// Fills `.incoming-<name>` (which holds the controller's manifest and log, nothing
/// else) with the payload of this host's store entry `key`, checked by its digest as any
/// install from the store is. The entry is cloned into a fresh directory beside it
/// first, then each top-level entry moved in with a rename that never replaces.
fn fill_from_store(builds_dir: &Path, incoming: &Path, key: &str, cache: &Path) -> Result<()> {
    let key = crate::store::Key::parse(key)?;
    let store = crate::store::Store::at(cache)?;
    let lock = store.lock(&key, Wait::Yes, &|_| {})?;
    let fill = tempfile::Builder::new()
        .prefix(".store-fill-")
        .tempdir_in(builds_dir)
        .with_context(|| format!("cannot create a directory in {}", builds_dir.display()))?;
    store
        .install(&lock, &key, fill.path())
        .with_context(|| format!("this host's build store could not give entry {key}"))?;
    for entry in std::fs::read_dir(fill.path())? {
        let entry = entry?;
        let to = incoming.join(entry.file_name());
        if std::fs::symlink_metadata(&to).is_ok() {
            bail!(
                "{} is in the copy already: the controller sent more than its manifest and log",
                to.display()
            );
        }
        std::fs::rename(entry.path(), &to)
            .context("cannot move the store's files into the copy")?;
    }
    Ok(())
}

/// Makes `incoming` a directory only this user can write, that no link leads to: a link,
/// file, FIFO or anything else found there was not made by fdl and is removed (the
/// entry itself: a link's target is never touched) before a fresh directory is made
/// with mode 0700 by a `mkdir` that fails on any existing entry. A directory this user
/// owns that no one else can write is an earlier partial copy, kept so that rsync
/// resumes it; one of another user, or writable by others, is refused.
fn prepare_incoming(incoming: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::symlink_metadata(incoming) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", incoming.display())),
        Ok(m) if m.file_type().is_dir() => {
            // SAFETY: geteuid has no preconditions.
            let me = unsafe { libc::geteuid() };
            if m.uid() != me || m.mode() & 0o022 != 0 {
                bail!(
                    "{} is a directory fdl did not make (owner uid {}, mode {:o}): fdl copies only into a directory of its own. Remove it and ship again",
                    incoming.display(),
                    m.uid(),
                    m.mode() & 0o7777
                );
            }
            return Ok(());
        }
        Ok(m) => {
            std::fs::remove_file(incoming).with_context(|| {
                format!(
                    "{} is {}, not fdl's copy, and cannot be removed",
                    incoming.display(),
                    crate::fsread::kind_of(&m.file_type())
                )
            })?;
        }
    }
    match std::fs::DirBuilder::new().mode(0o700).create(incoming) {
        // Made at this moment by another host sharing the directory: checked as any
        // existing one (the check above, once more).
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let m = std::fs::symlink_metadata(incoming)?;
            // SAFETY: geteuid has no preconditions.
            let me = unsafe { libc::geteuid() };
            if m.file_type().is_dir() && m.uid() == me && m.mode() & 0o022 == 0 {
                Ok(())
            } else {
                bail!(
                    "{} appeared while fdl made it, and is not fdl's: remove it and ship again",
                    incoming.display()
                )
            }
        }
        r => r.with_context(|| format!("cannot create {}", incoming.display())),
    }
}

/// The answer to `receive --install`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Installed {
    /// What the worker's ranks preload (see `fdl cluster env`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ld_preload: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ld_preload_error: Option<String>,
    pub dir: PathBuf,
    pub digest: String,
    pub replaced: bool,
}

/// Installs the copy in `.incoming-<name>` whose digest must be `digest`.
pub fn install(
    builds_dir: &Path,
    name: &str,
    digest: &str,
    force: bool,
    from_store: Option<&str>,
    ctx: &crate::context::Context,
) -> Result<Installed> {
    let cache = &ctx.cache()?;
    let name = BuildName::parse(name)?;
    if !is_sha256(digest) {
        bail!(
            "--digest must be a sha256 (64 lowercase hex digits), not '{}'",
            crate::text::clean(&digest.chars().take(80).collect::<String>())
        );
    }
    let store = BuildStore::new(builds_dir.to_path_buf());
    let incoming = builds_dir.join(format!("{INCOMING_PREFIX}{}", name.as_str()));
    let lock = store.lock(&name, cache, Wait::Never, &|_| {})?;
    // Only the directory `--prepare` made: a link there is never followed (its target's
    // files would be moved out of it).
    let m = std::fs::symlink_metadata(&incoming)
        .with_context(|| format!("cannot read {}: ship again", incoming.display()))?;
    if !m.file_type().is_dir() {
        bail!(
            "{} is {}, not the directory fdl made for the copy: nothing was installed. Ship again",
            incoming.display(),
            crate::fsread::kind_of(&m.file_type())
        );
    }
    if let Some(key) = from_store {
        fill_from_store(builds_dir, &incoming, key, cache)?;
    }
    let got = content_digest(&incoming)?;
    if got != digest {
        bail!(
            "the copy in {} is not the controller's build (digest {}, expected {}): ship again",
            incoming.display(),
            &got[..12],
            &digest[..12]
        );
    }
    let replaced = match store.existing(name.as_str())? {
        None => false,
        Some(Existing::Build(_)) if content_digest(&store.path_of(name.as_str()))? == digest => {
            // Another ship got here first: the same bytes are in place.
            let _ = std::fs::remove_dir_all(&incoming);
            return Ok(installed(
                store.path_of(name.as_str()),
                name.as_str(),
                digest,
                false,
                cache,
            ));
        }
        Some(_) if force => true,
        Some(_) => bail!(
            "{} holds a different build: pass --force to replace it",
            store.path_of(name.as_str()).display()
        ),
    };
    let staging = store.begin(ctx, &lock)?;
    // Same filesystem: moving the copy's entries in is a rename each.
    for entry in std::fs::read_dir(&incoming)? {
        let entry = entry?;
        std::fs::rename(entry.path(), staging.path().join(entry.file_name()))
            .context("cannot move the copy into staging")?;
    }
    std::fs::remove_dir(&incoming).ok();
    let manifest = read_manifest(staging.path())?;
    manifest_fits(&manifest, name.as_str())
        .context("the copy's manifest does not describe this build, so nothing was installed")?;
    let exe = std::env::current_exe()?;
    let probe = |lib: &Path| verify::probe_in_child(&exe, lib);
    let against = Against {
        recorded: Some(&manifest.checked),
        files: manifest.files.as_deref(),
        gpus: LocalGpus::NotChecked,
        driver: None,
        probe: Some(&probe),
    };
    let report = verify::verify(name.as_str(), staging.path(), &manifest.plan, &against);
    if !report.passed() {
        let why: Vec<String> = report
            .failures()
            .iter()
            .map(|c| format!("{}: {}", c.check, c.detail))
            .collect();
        bail!(
            "the copy fails verification here, so nothing was installed: {}",
            why.join("; ")
        );
    }
    tree::rewrite_pc_prefix(
        &staging.path().join("lib/pkgconfig/nccl.pc"),
        &store.path_of(name.as_str()),
    )?;
    // Installed once committed: an old copy left behind is a warning.
    if let Some(warning) = staging.commit(replaced)?.warning() {
        ctx.say(&warning);
    }
    Ok(installed(
        store.path_of(name.as_str()),
        name.as_str(),
        digest,
        replaced,
        cache,
    ))
}

/// Whether `s` is a sha256 as fdl writes one.
fn is_sha256(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether a shipped manifest describes the build it is installed as: a copy is believed
/// only as far as it agrees with where it goes. Its name must be `name`, its
/// `output_dir` an absolute, plain path ending in `libtorch/nccl/builds/<name>` (the
/// controller's checkout may sit elsewhere than this host's, but never name another
/// build or another place), and the library it records a plain file name in `lib/`.
pub fn manifest_fits(manifest: &crate::nccl::store::Manifest, name: &str) -> Result<()> {
    use std::path::Component;
    let plan = &manifest.plan;
    if plan.name != name {
        bail!(
            "it names build '{}', not '{name}'",
            crate::text::clean(&plan.name.chars().take(300).collect::<String>())
        );
    }
    let out = &plan.output_dir;
    let plain = out.is_absolute()
        && out
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    let tail: Vec<_> = out.components().rev().take(4).collect();
    let expected = [name, "builds", "nccl", "libtorch"];
    let ends_right = tail.len() == 4
        && tail
            .iter()
            .zip(expected)
            .all(|(c, e)| c.as_os_str() == std::ffi::OsStr::new(e));
    if !plain || !ends_right {
        bail!(
            "its output_dir {} is not a libtorch/nccl/builds/{name} directory",
            crate::text::clean(&out.display().to_string())
        );
    }
    let lib = &manifest.checked.library;
    if lib.is_empty() || lib.contains('/') || lib == "." || lib == ".." {
        bail!(
            "the library it records ('{}') is not a file name in lib/",
            crate::text::clean(lib)
        );
    }
    Ok(())
}

/// The answer for a build in place at `dir`, with the LD_PRELOAD value this worker's
/// ranks need: the build's path, or a link in this user's cache (made now) where that
/// path holds a space or a colon.
fn installed(dir: PathBuf, name: &str, digest: &str, replaced: bool, cache: &Path) -> Installed {
    let ld_preload =
        crate::nccl::preload::preload_path_in(&dir.join("lib").join("libnccl.so.2"), name, cache)
            .map_err(|e| format!("{e:#}"));
    Installed {
        dir,
        digest: digest.to_string(),
        replaced,
        ld_preload: ld_preload.as_ref().ok().cloned(),
        ld_preload_error: ld_preload.err(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_names_bytes_and_links_but_not_the_pkgconfig_prefix() {
        let a = tempfile::tempdir().unwrap();
        let d = a.path();
        std::fs::create_dir_all(d.join("lib/pkgconfig")).unwrap();
        std::fs::write(d.join("lib/libnccl.so.2.27.5"), "lib").unwrap();
        std::os::unix::fs::symlink("libnccl.so.2.27.5", d.join("lib/libnccl.so.2")).unwrap();
        std::fs::write(d.join("lib/pkgconfig/nccl.pc"), "prefix=/a\n").unwrap();
        let first = content_digest(d).unwrap();
        std::fs::write(d.join("lib/pkgconfig/nccl.pc"), "prefix=/elsewhere\n").unwrap();
        assert_eq!(content_digest(d).unwrap(), first);
        std::fs::write(d.join("lib/libnccl.so.2.27.5"), "other").unwrap();
        assert_ne!(content_digest(d).unwrap(), first);
        std::fs::write(d.join("lib/libnccl.so.2.27.5"), "lib").unwrap();
        std::fs::remove_file(d.join("lib/libnccl.so.2")).unwrap();
        std::os::unix::fs::symlink("elsewhere", d.join("lib/libnccl.so.2")).unwrap();
        assert_ne!(content_digest(d).unwrap(), first);
    }

    #[test]
    fn the_payload_digest_leaves_out_only_fdls_top_level_files() {
        let a = tempfile::tempdir().unwrap();
        let d = a.path();
        std::fs::create_dir_all(d.join("lib")).unwrap();
        std::fs::write(d.join("lib/libnccl.so.2.27.5"), "lib").unwrap();
        let bare = content_digest(d).unwrap();
        assert_eq!(payload_digest(d).unwrap(), bare);
        std::fs::write(d.join(tree::MANIFEST), "{}").unwrap();
        std::fs::write(d.join(tree::BUILD_LOG), "log").unwrap();
        assert_ne!(content_digest(d).unwrap(), bare);
        assert_eq!(payload_digest(d).unwrap(), bare);
        // The same names deeper down are payload.
        std::fs::write(d.join("lib").join(tree::BUILD_LOG), "x").unwrap();
        assert_ne!(payload_digest(d).unwrap(), bare);
    }
}
