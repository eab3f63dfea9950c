//! fdl's per-user cache (`$XDG_CACHE_HOME/fdl`, else `~/.cache/fdl`, else a directory of
//! this user's alone in the temp directory): build locks, the logs of failed builds,
//! cached NCCL clones, ssh's control sockets. Kept out of projects, so nothing fdl needs
//! for bookkeeping is ever left in one.

use anyhow::{bail, Context, Result};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The cache directory fdl uses: `$XDG_CACHE_HOME/fdl`, else `~/.cache/fdl` (each only
/// as an absolute path, [`cache_base`]). Without either, `<temp>/fdl-<uid>`, made 0700
/// and checked before use to be this user's own directory that no one else can enter (as
/// OpenSSH checks a control path): a shared name in the temp directory could be claimed
/// first by another user, whose directory (or link) would then hold this user's locks
/// and ssh sockets.
///
/// Read from this process's environment: for code not handed a run's context, which
/// resolves it once, from the environment it was given ([`cache_dir_for`]).
pub fn cache_dir() -> Result<PathBuf> {
    cache_dir_for(std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME"))
}

/// [`cache_dir`] for these values of `XDG_CACHE_HOME` and `HOME`.
pub fn cache_dir_for(
    xdg_cache_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Result<PathBuf> {
    let base = cache_base(xdg_cache_home, home);
    if let Some(base) = base {
        return Ok(base.join("fdl"));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let dir = std::env::temp_dir().join(format!("fdl-{me}"));
    private_dir(&dir).context(
        "with neither HOME nor XDG_CACHE_HOME set to an absolute path, fdl keeps its cache in a directory of its own in the temp directory",
    )?;
    Ok(dir)
}

/// `$XDG_CACHE_HOME`, else `$HOME/.cache`, each only where it is an absolute path: the
/// XDG base directory spec says a relative one is invalid and to be ignored, and fdl's
/// locks would otherwise depend on the directory it was started in.
fn cache_base(
    xdg_cache_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    let absolute = |v: std::ffi::OsString| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
    xdg_cache_home
        .and_then(absolute)
        .or_else(|| home.and_then(absolute).map(|h| h.join(".cache")))
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

/// [`crate::digest::sha256_file`] of a file that is hashed often and rarely changes (fdl's own binary,
/// whose digest names its copy on every worker at each `cluster` command: 36 MB, about
/// 80 ms to read). The digest is kept in fdl's cache under the file's identity as its
/// open descriptor reports it: device, inode, size, and the modification and change
/// times to the nanosecond. Any write to the file or change of its metadata moves the
/// change time, which no program can set back, so a kept digest is of these bytes. The
/// cache only spares the read: without one (or with an entry that is not a digest), the
/// file is hashed, and a digest that cannot be kept costs the next run the read again.
pub fn sha256_file_kept(cache: Option<&Path>, path: &Path) -> Result<String> {
    let mut file = crate::fsread::open_regular(path, true)?;
    let meta = file.metadata()?;
    let identity = format!("{}\0{}", path.display(), file_identity(&meta));
    let after = |file: &std::fs::File| file.metadata().ok();
    let (digest, _) = kept_in(cache, &identity, &meta, || {
        let d = crate::digest::sha256_of(&mut file, path, &mut vec![0u8; 1 << 20])?;
        Ok((d, after(&file)))
    })?;
    Ok(digest)
}

/// What names one state of a file: its device, inode, size, and modification and change
/// times to the nanosecond. Any write or metadata change moves the change time, which no
/// program can set back.
pub fn file_identity(meta: &std::fs::Metadata) -> String {
    format!(
        "{}\0{}\0{}\0{}.{}\0{}.{}",
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec()
    )
}

/// A hex digest of the file in the state `identity` names (see [`file_identity`]; `meta`
/// is that state), kept in `<cache>/digests`: the kept one when there is one, else
/// `compute`'s, which also returns the file's metadata once read, and is kept only when
/// the file did not change meanwhile. The second value says whether the digest was kept
/// from an earlier read. An entry that is not a digest is read as none; a digest that
/// cannot be kept costs the next run the read again.
pub fn kept_digest(
    cache: &Path,
    identity: &str,
    meta: &std::fs::Metadata,
    compute: impl FnOnce() -> Result<(String, Option<std::fs::Metadata>)>,
) -> Result<(String, bool)> {
    kept_in(Some(cache), identity, meta, compute)
}

fn kept_in(
    cache: Option<&Path>,
    identity: &str,
    meta: &std::fs::Metadata,
    compute: impl FnOnce() -> Result<(String, Option<std::fs::Metadata>)>,
) -> Result<(String, bool)> {
    let key = crate::digest::sha256_hex(identity.as_bytes());
    let dir = cache.map(|c| c.join("digests"));
    let kept = dir.as_ref().map(|d| d.join(&key[..32]));
    if let (Some(dir), Some(kept)) = (&dir, &kept) {
        if let Ok(text) = crate::fsread::read_text(kept, 128) {
            let text = text.trim();
            if text.len() == 64
                && text
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
                && own_dir(dir).is_ok()
            {
                return Ok((text.to_string(), true));
            }
        }
    }
    let (digest, after) = compute()?;
    // Kept only when the file did not change while it was read.
    let same = after.is_some_and(|after| {
        after.ctime() == meta.ctime()
            && after.ctime_nsec() == meta.ctime_nsec()
            && after.size() == meta.size()
    });
    if let (true, Some(dir), Some(kept)) = (same, &dir, &kept) {
        if dir.parent().is_some_and(|c| own_dir(c).is_ok()) && own_dir(dir).is_ok() {
            // A new file renamed over the name: whatever was there is replaced, never
            // written through.
            use std::io::Write;
            if let Ok(mut tmp) = tempfile::NamedTempFile::new_in(dir) {
                if tmp.write_all(format!("{digest}\n").as_bytes()).is_ok() {
                    let _ = tmp.persist(kept);
                }
            }
        }
    }
    Ok((digest, false))
}

/// `<cache>/<rel>`, every directory on the way made or checked as [`own_dir`] does —
/// `cache` itself first, then each component of `rel` — and returned. The one way fdl
/// gets a directory under its cache (locks, logs, paths, preload, nccl-src, store,
/// volume marks…): a link planted at any of them, or one of them owned by another user or
/// open to others, is refused before anything is created or written in it.
pub fn subdir(cache: &Path, rel: &str) -> Result<PathBuf> {
    own_dir(cache)?;
    let mut dir = cache.to_path_buf();
    for part in Path::new(rel).components() {
        match part {
            std::path::Component::Normal(p) => dir.push(p),
            // Only names below the cache: `..` or an absolute part would leave it.
            _ => bail!("{rel} is not a directory name under fdl's cache"),
        }
        own_dir(&dir)?;
    }
    Ok(dir)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::sha256_file;

    /// A relative (or empty) `XDG_CACHE_HOME` or `HOME` is ignored, as the XDG spec says.
    #[test]
    fn only_absolute_cache_homes_are_taken() {
        let base = |x: &str, h: &str| cache_base(Some(x.into()), Some(h.into()));
        assert_eq!(base("/c", "/h"), Some(PathBuf::from("/c")));
        assert_eq!(base("rel/cache", "/h"), Some(PathBuf::from("/h/.cache")));
        assert_eq!(base("", "/h"), Some(PathBuf::from("/h/.cache")));
        assert_eq!(base("rel", "home"), None);
        assert_eq!(base("", ""), None);
        assert_eq!(cache_base(None, None), None);
    }

    #[test]
    fn a_kept_digest_is_the_files_own_and_is_dropped_when_the_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let file = dir.path().join("fdl");
        std::fs::write(&file, b"first version").unwrap();
        let first = sha256_file_kept(Some(&cache), &file).unwrap();
        assert_eq!(first, sha256_file(&file).unwrap());
        let kept: Vec<_> = std::fs::read_dir(cache.join("digests")).unwrap().collect();
        assert_eq!(kept.len(), 1, "the digest is kept");
        assert_eq!(sha256_file_kept(Some(&cache), &file).unwrap(), first);

        // Same size and the old modification time: only the change time tells, and it
        // does.
        let mtime = std::fs::metadata(&file).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&file, b"other version").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        let second = sha256_file_kept(Some(&cache), &file).unwrap();
        assert_eq!(second, sha256_file(&file).unwrap());
        assert_ne!(second, first);
    }

    #[test]
    fn an_entry_that_is_not_a_digest_is_ignored_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let file = dir.path().join("fdl");
        std::fs::write(&file, b"bytes").unwrap();
        let right = sha256_file_kept(Some(&cache), &file).unwrap();
        let entry = std::fs::read_dir(cache.join("digests"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        for junk in ["not a digest\n", &"A".repeat(64), ""] {
            std::fs::write(&entry, junk).unwrap();
            assert_eq!(sha256_file_kept(Some(&cache), &file).unwrap(), right);
            assert_eq!(
                std::fs::read_to_string(&entry).unwrap(),
                format!("{right}\n")
            );
        }
        // No cache at all: the file is hashed.
        assert_eq!(sha256_file_kept(None, &file).unwrap(), right);
    }
}
