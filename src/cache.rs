//! fdl's per-user cache (`$XDG_CACHE_HOME/fdl`, else `~/.cache/fdl`): build locks, the
//! logs of failed builds, cached NCCL clones. Kept out of projects, so nothing fdl needs
//! for bookkeeping is ever left in one.

use sha2::{Digest, Sha256};
use std::path::PathBuf;

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
