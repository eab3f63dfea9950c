//! fdl's per-user cache (`$XDG_CACHE_HOME/fdl`, else `~/.cache/fdl`, else a directory of
//! this user's alone in the temp directory): build locks, the logs of failed builds,
//! cached NCCL clones, ssh's control sockets. Kept out of projects, so nothing fdl needs
//! for bookkeeping is ever left in one.

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The cache directory fdl uses: `$XDG_CACHE_HOME/fdl`, else `~/.cache/fdl`. Without
/// either, `<temp>/fdl-<uid>`, made 0700 and checked before use to be this user's own
/// directory that no one else can enter (as OpenSSH checks a control path): a shared
/// name in the temp directory could be claimed first by another user, whose directory
/// (or link) would then hold this user's locks and ssh sockets.
pub fn cache_dir() -> Result<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        });
    if let Some(base) = base {
        return Ok(base.join("fdl"));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let dir = std::env::temp_dir().join(format!("fdl-{me}"));
    private_dir(&dir).context(
        "with neither HOME nor XDG_CACHE_HOME set, fdl keeps its cache in a directory of its own in the temp directory",
    )?;
    Ok(dir)
}

/// [`own_dir`], and closed to everyone else (mode 0700 or narrower): for what gives
/// access to this user's live connections (ssh control sockets) or stands in for a home.
pub fn private_dir(dir: &Path) -> Result<()> {
    own_dir(dir)?;
    let mode = std::fs::symlink_metadata(dir)?.mode() & 0o7777;
    if mode & 0o077 != 0 {
        bail!(
            "{} is open to other users (mode {mode:o}): fdl keeps it to this user alone. Run `chmod 700 {}` if it is yours",
            dir.display(),
            dir.display()
        );
    }
    Ok(())
}

/// Hex SHA-256 of a file's content, read in a stream (a library or fdl's own binary is
/// tens to hundreds of MiB). Only a regular file, checked on its descriptor, and never
/// through a link at `path` itself: a FIFO there cannot hang fdl, nor a device feed it
/// forever.
pub fn sha256_file(path: &std::path::Path) -> Result<String> {
    let mut hasher = Sha256::new();
    std::io::copy(&mut crate::fsread::open_regular(path, true)?, &mut hasher)
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Hex SHA-256 of `bytes`: identities in plans (Dockerfiles) and keys of lock files.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `dir` exists as a real directory owned by this user, writable by no one else; it is
/// created (0700) when missing. A link or another user's directory is refused: another
/// user could otherwise choose what fdl's links point to.
pub fn own_dir(dir: &Path) -> Result<()> {
    match std::fs::symlink_metadata(dir) {
        Err(_) => {
            std::fs::create_dir_all(dir.parent().unwrap_or(Path::new("/")))
                .with_context(|| format!("cannot create {}", dir.display()))?;
            // 0700 from the start (no chmod after, which a swap could redirect); a
            // `mkdir` fails on any entry there, a link included.
            match std::fs::DirBuilder::new().mode(0o700).create(dir) {
                Ok(()) => {}
                // Made by a concurrent fdl: checked below like any existing one.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot create {}", dir.display()))
                }
            }
            check_own(dir)
        }
        Ok(_) => check_own(dir),
    }
}

fn check_own(dir: &Path) -> Result<()> {
    let meta =
        std::fs::symlink_metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !meta.file_type().is_dir() {
        bail!(
            "{} is not a directory (a link or a file is there): fdl will not write through it. Remove it and run again",
            dir.display()
        );
    }
    if meta.uid() != me {
        bail!(
            "{} belongs to another user (uid {}): fdl keeps its links only in directories of its own. Remove it, or set XDG_CACHE_HOME to a directory of yours",
            dir.display(),
            meta.uid()
        );
    }
    if meta.mode() & 0o022 != 0 {
        bail!(
            "{} is writable by others (mode {:o}): fdl keeps its links only where no one else can change them. Run `chmod go-w {}`",
            dir.display(),
            meta.mode() & 0o7777,
            dir.display()
        );
    }
    Ok(())
}
