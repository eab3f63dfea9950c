//! The `LD_PRELOAD` value fdl prints for a build: one the loader honours.
//!
//! glibc splits `LD_PRELOAD` at spaces and colons with no escaping, so a build under a
//! project root such as `/srv/flo dl` cannot be named by its own path: the loader would
//! try `/srv/flo` and `dl/…` and ignore both. Such a build is named through a link in
//! fdl's per-user cache, `<cache>/preload/<build>-<digest of its path>/libnccl.so.2`,
//! which the build (and `cluster receive` on a worker) makes; the digest keeps two
//! projects' builds of one name apart. Where even the cache path would be split, there
//! is no such path: fdl refuses with the reason and the fix.

use crate::loader::preload::is_one_element;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// The path to print for `lib` (a build's `lib/libnccl.so.2`) of build `name`: `lib`
/// itself when the loader reads it as one element, else a link in fdl's cache directory
/// `cache` (made if missing).
pub fn preload_path_in(lib: &Path, name: &str, cache: &Path) -> Result<PathBuf> {
    let text = lib.to_str().with_context(|| {
        format!(
            "{} is not valid UTF-8, so it cannot be written as an LD_PRELOAD value; move the project to a UTF-8 path",
            lib.display()
        )
    })?;
    if is_one_element(text) {
        return Ok(lib.to_path_buf());
    }
    let link = link_path(lib, name, cache);
    let link_text = link.to_string_lossy();
    if !is_one_element(&link_text) {
        bail!(
            "{} holds a space or a colon, where glibc splits LD_PRELOAD (no quoting helps), and so does fdl's cache {}, where fdl would link it from. Set XDG_CACHE_HOME to a directory whose path has neither, or move the project",
            lib.display(),
            cache.display()
        );
    }
    make_link(&link, lib)?;
    Ok(link)
}

/// Where the link for `lib` lives, made or not.
pub fn link_path(lib: &Path, name: &str, cache: &Path) -> PathBuf {
    let digest = crate::digest::sha256_hex(lib.as_os_str().as_encoded_bytes());
    cache
        .join("preload")
        .join(format!("{name}-{}", &digest[..12]))
        .join("libnccl.so.2")
}

/// Makes `link` → `target`, never through anything fdl did not make: each directory is
/// created by fdl or checked to be a real directory of this user, and the link is put in
/// place by rename, which replaces a directory entry and follows nothing.
fn make_link(link: &Path, target: &Path) -> Result<()> {
    let dir = link.parent().expect("a link path has a parent");
    let cache = dir
        .parent()
        .and_then(Path::parent)
        .expect("cache/preload/<name>");
    crate::cache::own_dir(cache)?;
    crate::cache::own_dir(&cache.join("preload"))?;
    crate::cache::own_dir(dir)?;
    if let Ok(current) = std::fs::read_link(link) {
        if current == target {
            return Ok(());
        }
    }
    let tmp = dir.join(format!(".libnccl.so.2.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)
        .with_context(|| format!("cannot make the preload link {}", tmp.display()))?;
    std::fs::rename(&tmp, link).with_context(|| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot put the preload link in place at {}", link.display())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn a_plain_path_is_its_own_preload_and_a_spaced_one_goes_through_a_link() {
        let t = tempfile::tempdir().unwrap();
        let cache = t.path().join("cache");
        let plain = t.path().join("p/lib/libnccl.so.2");
        assert_eq!(preload_path_in(&plain, "b", &cache).unwrap(), plain);
        assert!(!cache.exists(), "nothing made for a plain path");

        let spaced = t.path().join("flo dl:x/lib/libnccl.so.2");
        std::fs::create_dir_all(spaced.parent().unwrap()).unwrap();
        std::fs::write(&spaced, b"lib").unwrap();
        let link = preload_path_in(&spaced, "v2.27.5-sm61", &cache).unwrap();
        assert!(is_one_element(link.to_str().unwrap()));
        assert_eq!(std::fs::read_link(&link).unwrap(), spaced);
        assert_eq!(std::fs::read(&link).unwrap(), b"lib");
        // Again: the same link, untouched.
        assert_eq!(
            preload_path_in(&spaced, "v2.27.5-sm61", &cache).unwrap(),
            link
        );
        let mode = std::fs::metadata(&cache).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }

    #[test]
    fn a_planted_link_or_a_spaced_cache_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let spaced = t.path().join("a b/libnccl.so.2");
        // The cache's preload directory is a link someone planted.
        let cache = t.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700)).unwrap();
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, cache.join("preload")).unwrap();
        let e = preload_path_in(&spaced, "b", &cache)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a directory"), "{e}");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        // A cache whose own path would be split: no honest path exists.
        let e = preload_path_in(&spaced, "b", &t.path().join("my cache"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("XDG_CACHE_HOME"), "{e}");
    }
}
