//! Per-build locks, so two `fdl nccl build`s of one target never interleave and
//! `fdl nccl remove` never deletes a build being replaced. Different targets lock
//! different files and build in parallel.
//!
//! The locks are OS file locks (`flock`): the kernel drops them when their holder dies,
//! so a killed fdl never leaves a lock that blocks forever. The lock files live in the
//! user's cache ([`crate::cache`]), not in the project, so a failed build leaves nothing in
//! the project.

use anyhow::{bail, Context, Result};
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A held lock; released on drop (or by the kernel if the process dies).
#[derive(Debug)]
pub struct BuildLock {
    _file: File,
    pub path: PathBuf,
    /// Whose lock it is: the build's name and the builds directory it lives in.
    pub name: String,
    pub builds_dir: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Wait for the holder, saying so once.
    Yes,
    /// Fail at once with a message naming the holder (`--no-wait`).
    No,
    /// Fail at once, for a command that has no `--no-wait` to name (a worker's
    /// `cluster receive`, run by `cluster ship`).
    Never,
}

/// The lock file of build `name` in the builds directory `builds_dir`, under the cache
/// directory `cache`. The builds directory's path is part of the key so two projects never
/// share a lock.
pub fn lock_path(cache: &Path, builds_dir: &Path, name: &str) -> PathBuf {
    let key =
        crate::digest::sha256_hex(canonical_lenient(builds_dir).as_os_str().as_encoded_bytes());
    cache
        .join(LOCKS_DIR)
        .join(format!("{}-{name}{LOCK_SUFFIX}", &key[..LOCK_KEY_LEN]))
}

/// Where the lock files live, under fdl's cache.
const LOCKS_DIR: &str = "locks";
/// A lock file's name is `<key>-<name>.lock`, the key this many hex digits.
const LOCK_KEY_LEN: usize = 16;
const LOCK_SUFFIX: &str = ".lock";
/// How many bytes a lock file's name adds to the name it locks: what a build name must
/// leave room for (`nccl::store::BuildName`, a floor above).
pub const LOCK_NAME_EXTRA: usize = LOCK_KEY_LEN + "-".len() + LOCK_SUFFIX.len();

/// The canonical form of `path` even when its tail does not exist yet (before the first
/// build, `libtorch/nccl/builds` may not): the longest existing ancestor is resolved and
/// the rest appended, so every spelling of a project maps to one lock.
fn canonical_lenient(path: &Path) -> PathBuf {
    for ancestor in path.ancestors() {
        if let Ok(real) = ancestor.canonicalize() {
            // Joining an empty rest would add a trailing slash and change the key.
            return match path.strip_prefix(ancestor) {
                Ok(rest) if !rest.as_os_str().is_empty() => real.join(rest),
                _ => real,
            };
        }
    }
    path.to_path_buf()
}

/// Takes the lock of build `name`. `on_wait` is called once if another process holds it
/// and `wait` is [`Wait::Yes`].
pub fn acquire(
    cache: &Path,
    builds_dir: &Path,
    name: &str,
    wait: Wait,
    on_wait: &dyn Fn(&str),
) -> Result<BuildLock> {
    let path = lock_path(cache, builds_dir, name);
    // The cache and its `locks/` are made and checked as every cache directory is: a
    // link there, or another user's directory, never gets fdl's lock files.
    crate::cache::subdir(cache, LOCKS_DIR)?;
    // Never through a link, and only a regular file: a FIFO cannot block the open. 0600:
    // the file records the holder's command line.
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
        .with_context(|| {
            format!(
                "cannot open lock file {} (a link there is refused)",
                path.display()
            )
        })?;
    if !file.metadata()?.file_type().is_file() {
        bail!(
            "lock file {} is not a regular file: remove it and run again",
            path.display()
        );
    }
    // One made by an older fdl may be readable by others: narrowed on the descriptor,
    // which no link can redirect.
    use std::os::unix::fs::PermissionsExt;
    if file.metadata()?.permissions().mode() & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("cannot make {} private", path.display()))?;
    }
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let holder = holder_of(&mut file);
            let msg = format!("build {name} is locked by another fdl ({holder})");
            match wait {
                Wait::No => {
                    bail!("{msg}; not waiting because of --no-wait. Try again when it has finished")
                }
                Wait::Never => bail!("{msg}. Try again when it has finished"),
                Wait::Yes => {}
            }
            on_wait(&format!(
                "{msg}; waiting for it to finish (Ctrl-C to stop)…"
            ));
            wait_for(&file)?;
        }
        Err(TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("cannot lock {}", path.display()))
        }
    }
    // Say who holds it, for the message another process will print.
    let _ = file.set_len(0);
    let _ = file.rewind();
    let _ = write!(
        file,
        "pid {} ({})",
        std::process::id(),
        // `args()` panics on an argument that is not UTF-8 (a path may be any bytes).
        std::env::args_os()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let _ = file.flush();
    Ok(BuildLock {
        _file: file,
        path,
        name: name.to_string(),
        builds_dir: builds_dir.to_path_buf(),
    })
}

/// Who holds the lock of build `name` now, if anyone: for a listing that must tell a
/// live build's directories from a killed one's. Opens the lock file only if it is
/// there (never through a link, never creating it) and tests the lock without keeping
/// it, so a build that starts meanwhile waits for at most that instant.
pub fn holder(cache: &Path, builds_dir: &Path, name: &str) -> Option<String> {
    let path = lock_path(cache, builds_dir, name);
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
        .ok()?;
    if !file.metadata().ok()?.file_type().is_file() {
        return None;
    }
    match file.try_lock_shared() {
        Ok(()) => None,
        Err(TryLockError::WouldBlock) => Some(holder_of(&mut file)),
        Err(TryLockError::Error(_)) => None,
    }
}

/// Polls so an interrupt can end the wait; a blocking `lock()` could not be interrupted.
fn wait_for(file: &File) -> Result<()> {
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(TryLockError::WouldBlock) => {
                if crate::process::interrupted() {
                    return Err(crate::process::Interrupted.into());
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(TryLockError::Error(e)) => return Err(e.into()),
        }
    }
}

fn holder_of(file: &mut File) -> String {
    let mut s = String::new();
    let _ = file.rewind();
    let _ = file.take(512).read_to_string(&mut s);
    let s = s.trim();
    if s.is_empty() {
        "unknown process".to_string()
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_of_one_target_fails_without_wait_and_others_are_free() {
        let t = tempfile::tempdir().unwrap();
        let builds = t.path().join("libtorch/nccl/builds");
        std::fs::create_dir_all(&builds).unwrap();
        let held = acquire(t.path(), &builds, "v2.27.5-sm61", Wait::No, &|_| {}).unwrap();
        let err = acquire(t.path(), &builds, "v2.27.5-sm61", Wait::No, &|_| {})
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("locked by another fdl")
                && err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        // A command without --no-wait is not told to use it.
        let err = acquire(t.path(), &builds, "v2.27.5-sm61", Wait::Never, &|_| {})
            .unwrap_err()
            .to_string();
        assert!(err.contains("is locked by another fdl"), "{err}");
        assert!(!err.contains("--no-wait"), "{err}");
        let other = acquire(t.path(), &builds, "v2.27.5-sm90", Wait::No, &|_| {});
        assert!(other.is_ok());
        drop(held);
        assert!(
            comes_true(|| acquire(t.path(), &builds, "v2.27.5-sm61", Wait::No, &|_| {}).is_ok()),
            "the lock stayed held after its holder was dropped"
        );
    }

    /// Whether `f` comes true within 30 s. A child another test thread forks holds a copy
    /// of every descriptor until its exec, the flock's among them, so a dropped lock may
    /// be a moment late to come free: asked again for a bounded while, never waited on
    /// blindly.
    fn comes_true(mut f: impl FnMut() -> bool) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !f() {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        true
    }

    #[test]
    fn holder_names_a_live_lock_and_nothing_else() {
        let t = tempfile::tempdir().unwrap();
        let builds = t.path().join("builds");
        std::fs::create_dir_all(&builds).unwrap();
        assert_eq!(holder(t.path(), &builds, "b"), None, "no lock file yet");
        let held = acquire(t.path(), &builds, "b", Wait::No, &|_| {}).unwrap();
        let who = holder(t.path(), &builds, "b").unwrap();
        assert!(
            who.contains(&format!("pid {}", std::process::id())),
            "{who}"
        );
        drop(held);
        assert!(
            comes_true(|| holder(t.path(), &builds, "b").is_none()),
            "a dropped lock is still named as held"
        );
        // Testing did not keep it: a build takes it (a forked copy of the test's shared
        // lock aside).
        assert!(comes_true(|| acquire(
            t.path(),
            &builds,
            "b",
            Wait::No,
            &|_| {}
        )
        .is_ok()));
    }

    #[test]
    fn one_key_before_and_after_the_builds_directory_exists() {
        let t = tempfile::tempdir().unwrap();
        let builds = t.path().join("libtorch/nccl/builds");
        let before = lock_path(t.path(), &builds, "x");
        std::fs::create_dir_all(&builds).unwrap();
        assert_eq!(
            before.as_os_str(),
            lock_path(t.path(), &builds, "x").as_os_str(),
            "the lock key must not depend on whether the directory exists yet"
        );
    }
}
