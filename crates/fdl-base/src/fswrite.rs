//! The ways fdl writes a file, none of them through a link it did not make: a new file
//! that must not exist yet (not even as a dangling link), or a whole file replaced by a
//! rename. A ground-floor module beside [`crate::fsread`]: the manifest and log of a
//! build, the store's records, a variant's notes and a Docker run script all go through
//! it.

use anyhow::{anyhow, Context, Result};
use std::path::Path;

/// Creates `path`, which must not exist yet (not even as a dangling link), from `from`.
pub fn create_new(path: &Path, from: &mut dyn std::io::Read) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    std::io::copy(from, &mut f).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Writes `contents` to `path` through a temporary file in the same directory and a
/// rename: whatever was at `path` (a link included) is replaced, never written through.
pub fn replace_file(path: &Path, contents: &[u8]) -> Result<()> {
    use std::io::Write;
    let dir = path
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent directory", path.display()))?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("cannot write in {}", dir.display()))?;
    tmp.write_all(contents)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}
