//! fdl's per-user cache (`$XDG_CACHE_HOME/fdl`, else `~/.cache/fdl`): build locks, the
//! logs of failed builds, cached NCCL clones. Kept out of projects, so nothing fdl needs
//! for bookkeeping is ever left in one.

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The cache directory fdl uses: `$XDG_CACHE_HOME/fdl`, else `~/.cache/fdl`.
pub fn cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("fdl")
}

/// Hex SHA-256 of a file's content, read in a stream (a library or fdl's own binary is
/// tens to hundreds of MiB).
pub fn sha256_file(path: &std::path::Path) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    std::io::copy(&mut std::fs::File::open(path)?, &mut hasher)?;
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
            match std::fs::create_dir(dir) {
                Ok(()) => {
                    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                        .with_context(|| format!("cannot set the mode of {}", dir.display()))?;
                }
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
