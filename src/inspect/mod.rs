//! Inspection engine: which NCCL and which GPU code a library carries.

pub mod selfid;

use anyhow::{bail, Context, Result};
use std::path::Path;

pub use selfid::SelfId;

/// Finds the NCCL self-id in a file. `Ok(None)` when the file holds none.
/// Several distinct self-ids are an error: the answer would be a guess.
pub fn find_nccl_self_id(path: &Path) -> Result<Option<SelfId>> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    if !meta.is_file() {
        bail!("{} is not a regular file", path.display());
    }
    if meta.len() == 0 {
        return Ok(None);
    }
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: read-only mapping; a file truncated underneath us can SIGBUS, which the
    // bounded ELF-aware reader avoids by checking sizes first.
    let map = unsafe { memmap2::Mmap::map(&file) }
        .with_context(|| format!("cannot map {}", path.display()))?;
    let ids = selfid::find_all(&map);
    match ids.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one.clone())),
        many => bail!(
            "{} carries {} different NCCL self-ids ({}); cannot tell which one is linked",
            path.display(),
            many.len(),
            many.iter()
                .map(|i| format!("{}+cuda{}", i.nccl, i.cuda))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
