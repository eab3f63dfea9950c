//! Paths that reach make as plain words.
//!
//! NCCL's Makefiles put `BUILDDIR`, `PREFIX` and `CUDA_HOME` into shell recipes unquoted,
//! so a project root holding a space breaks the build and one holding a backtick or
//! `$(…)` runs it. Such a path reaches make through an alias instead: a symlink with a
//! plain name under fdl's cache, pointing at the real directory. The aliases of one build
//! are removed when it ends ([`Aliases`] is dropped), whatever the outcome.

use crate::digest::sha256_hex;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// What a shell (and make) passes through untouched: letters, digits and `/ . _ - +`.
pub fn is_plain(path: &Path) -> bool {
    path.to_str().is_some_and(|s| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/._-+".contains(&b))
    })
}

/// The aliases made for one build, removed on drop.
pub struct Aliases {
    dir: PathBuf,
    /// (real path, alias)
    made: Vec<(PathBuf, PathBuf)>,
}

impl Aliases {
    /// Aliases live in `<cache>/paths`, which must itself be plain.
    pub fn new(cache: &Path) -> Result<Aliases> {
        let dir = std::path::absolute(cache.join("paths"))?;
        if !is_plain(&dir) {
            bail!(
                "fdl's cache directory {} holds characters a shell would split or expand, so it cannot give plain names to the paths NCCL's Makefiles need. Set XDG_CACHE_HOME to a directory whose path has only letters, digits and / . _ - +",
                dir.display()
            );
        }
        Ok(Aliases {
            dir,
            made: Vec::new(),
        })
    }

    /// `path` itself when it is plain, else a plain symlink to it. `path` must exist.
    pub fn plain(&mut self, path: &Path) -> Result<PathBuf> {
        let path = std::path::absolute(path)?;
        if is_plain(&path) {
            return Ok(path);
        }
        // Made and checked as every cache directory is: an alias is never made through
        // a link, nor in a directory another user could change.
        let cache = self.dir.parent().unwrap_or(Path::new("/"));
        crate::cache::subdir(cache, "paths")?;
        // Random, so that two builds never share (or remove) one alias.
        let name = format!(
            "{}-{}",
            &sha256_hex(path.as_os_str().as_encoded_bytes())[..12],
            std::process::id()
        );
        let alias = tempfile::Builder::new()
            .prefix(&format!("{name}-"))
            .make_in(&self.dir, |p| std::os::unix::fs::symlink(&path, p))
            .with_context(|| format!("cannot make a plain alias for {}", path.display()))?
            .into_temp_path()
            .keep()?;
        self.made.push((path, alias.clone()));
        Ok(alias)
    }

    /// The aliases made so far: (real path, alias).
    pub fn made(&self) -> &[(PathBuf, PathBuf)] {
        &self.made
    }
}

impl Drop for Aliases {
    fn drop(&mut self) {
        for (_, alias) in &self.made {
            let _ = std::fs::remove_file(alias);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_paths_pass_and_others_get_an_alias_that_goes_away() {
        let t = tempfile::tempdir().unwrap();
        let cache = t.path().join("cache");
        let odd = t.path().join("a b'$(x)`y`");
        std::fs::create_dir(&odd).unwrap();
        std::fs::write(odd.join("f"), "here").unwrap();
        let alias;
        {
            let mut a = Aliases::new(&cache).unwrap();
            assert_eq!(
                a.plain(t.path()).unwrap(),
                std::path::absolute(t.path()).unwrap()
            );
            alias = a.plain(&odd).unwrap();
            assert!(is_plain(&alias), "{}", alias.display());
            assert_eq!(std::fs::read_to_string(alias.join("f")).unwrap(), "here");
        }
        assert!(
            std::fs::symlink_metadata(&alias).is_err(),
            "the alias outlived its build"
        );
        assert!(!is_plain(Path::new("/p/with space")) && !is_plain(Path::new("/p/$x")));
    }

    #[test]
    fn a_cache_that_is_not_plain_is_refused_with_the_fix() {
        let e = Aliases::new(Path::new("/home/a b/.cache/fdl"))
            .err()
            .unwrap();
        assert!(e.to_string().contains("XDG_CACHE_HOME"), "{e}");
    }
}
