//! One transaction for everything fdl installs: NCCL builds, `libtorch add` variants,
//! cached NCCL clones.
//!
//! In the spirit of rustup's `dist/component/transaction.rs`: the new thing is made in a
//! hidden staging directory beside its target, and every change is recorded (the parent
//! directories it had to create, the staging directory itself). [`Transaction::commit`]
//! moves it into place with one rename; dropping an uncommitted transaction undoes every
//! recorded change, so a failure or an interrupt leaves the tree as it was. A replace is
//! crash-safe: whenever fdl is killed, the target holds the old or the new content, and
//! what a killed run leaves beside it is named so the next run can finish or undo it.

use crate::process::{kill_point, Critical};
use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};

/// Prefix of an old tree set aside by a replace where the filesystem cannot exchange.
pub const REPLACED_PREFIX: &str = ".replaced-";

#[derive(Debug)]
pub struct Transaction {
    staging: PathBuf,
    target: PathBuf,
    /// Directories created for the staging directory, outermost first.
    created: Vec<PathBuf>,
    committed: bool,
    /// Names the kill points of this kind of install (`install`, `replace`, `variant`).
    label: &'static str,
    /// Says what a rollback could not undo.
    ctx: crate::context::Context,
    /// From the first directory made to the commit or rollback, an interrupt unwinds
    /// through this transaction instead of ending fdl on the spot.
    _critical: Critical,
}

impl Transaction {
    /// Opens a transaction for `target`: a fresh staging directory named `<prefix>…`
    /// beside it, creating (and recording) the missing parents.
    pub fn begin(
        ctx: &crate::context::Context,
        target: PathBuf,
        prefix: &str,
        label: &'static str,
    ) -> Result<Transaction> {
        let critical = Critical::enter();
        let parent = target
            .parent()
            .ok_or_else(|| anyhow!("{} has no parent directory", target.display()))?
            .to_path_buf();
        let mut missing: Vec<&Path> = parent.ancestors().take_while(|p| !p.exists()).collect();
        missing.reverse();
        let mut created = Vec::new();
        for dir in missing {
            if let Err(e) = std::fs::create_dir(dir) {
                remove_created(&created);
                return Err(e).with_context(|| format!("cannot create {}", dir.display()));
            }
            created.push(dir.to_path_buf());
        }
        let staging = match tempfile::Builder::new().prefix(prefix).tempdir_in(&parent) {
            Ok(s) => s.keep(),
            Err(e) => {
                remove_created(&created);
                return Err(e).with_context(|| {
                    format!("cannot create a staging directory in {}", parent.display())
                });
            }
        };
        Ok(Transaction {
            staging,
            target,
            created,
            committed: false,
            label,
            ctx: ctx.clone(),
            _critical: critical,
        })
    }

    /// Where the new content is assembled.
    pub fn path(&self) -> &Path {
        &self.staging
    }

    /// Where it will be once committed.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Moves the staged content into place; fails, changing nothing, if the target exists
    /// (whatever it is, an empty directory too: the kernel checks, in the rename itself).
    pub fn commit(mut self) -> Result<()> {
        kill_point(&format!("{}:before-rename", self.label));
        match rename_noreplace(&self.staging, &self.target) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => bail!(
                "{} appeared meanwhile; nothing was changed",
                self.target.display()
            ),
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot move into {}", self.target.display()))
            }
        }
        self.committed = true;
        kill_point(&format!("{}:after-rename", self.label));
        Ok(())
    }

    /// Like [`Transaction::commit`], but an existing target is replaced, crash-safely:
    /// - where the filesystem has it, one `renameat2(RENAME_EXCHANGE)` swaps the two
    ///   directories atomically; the old content then sits at the staging path and is
    ///   deleted (a kill before that leaves it there, under the staging prefix, for the
    ///   next run to delete);
    /// - elsewhere the old content is renamed to `.replaced-<name>-…` first; a kill before
    ///   the second rename leaves the target missing, and [`restore_or_remove`] puts the
    ///   old content back rather than delete it.
    ///
    /// Once the new content is in place the replace has happened, whatever follows: an
    /// old tree that cannot be deleted is [`Committed::OldLeft`], for the caller to warn
    /// of, never an error (the caller goes on with what a commit entails).
    pub fn commit_replacing(self) -> Result<Committed> {
        let try_exchange = !crate::process::no_exchange();
        self.replace(try_exchange, &|p| std::fs::remove_dir_all(p))
    }

    fn replace(
        mut self,
        try_exchange: bool,
        remove: &dyn Fn(&Path) -> std::io::Result<()>,
    ) -> Result<Committed> {
        if std::fs::symlink_metadata(&self.target).is_err() {
            self.commit()?;
            return Ok(Committed::Clean);
        }
        kill_point("replace:before");
        if try_exchange && exchange(&self.staging, &self.target)? {
            self.committed = true;
            kill_point("replace:exchanged");
            // The staging path now holds the old content.
            return Ok(Committed::removing(&self.staging, remove));
        }
        let parent = self.target.parent().unwrap_or(Path::new("."));
        let name = self
            .target
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let aside = tempfile::Builder::new()
            .prefix(&format!("{REPLACED_PREFIX}{name}-"))
            .tempdir_in(parent)?
            .keep();
        std::fs::remove_dir(&aside)?;
        std::fs::rename(&self.target, &aside)
            .with_context(|| format!("cannot move {} aside", self.target.display()))?;
        kill_point("replace:set-aside");
        if let Err(e) = std::fs::rename(&self.staging, &self.target) {
            let _ = std::fs::rename(&aside, &self.target);
            return Err(e).with_context(|| format!("cannot move into {}", self.target.display()));
        }
        self.committed = true;
        kill_point("replace:renamed");
        Ok(Committed::removing(&aside, remove))
    }
}

/// A replace that happened: the new content is in place. What is left to say of the old.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "an old tree left behind is the caller's to warn of"]
pub enum Committed {
    /// Nothing of the old content is left.
    Clean,
    /// The old content could not be deleted; it stays at `path`, under a transaction
    /// prefix, where the next run of the same install sweeps it.
    OldLeft { path: PathBuf, error: String },
}

impl Committed {
    fn removing(old: &Path, remove: &dyn Fn(&Path) -> std::io::Result<()>) -> Committed {
        match remove(old) {
            Ok(()) => Committed::Clean,
            Err(e) => Committed::OldLeft {
                path: old.to_path_buf(),
                error: e.to_string(),
            },
        }
    }

    /// The warning to give, where there is one.
    pub fn warning(&self) -> Option<String> {
        match self {
            Committed::Clean => None,
            Committed::OldLeft { path, error } => Some(format!(
                "warning: the new one is in place, but the old one at {} could not be removed: {}",
                path.display(),
                crate::text::clean(error)
            )),
        }
    }
}

impl Drop for Transaction {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        if let Err(e) = std::fs::remove_dir_all(&self.staging) {
            if e.kind() != std::io::ErrorKind::NotFound {
                self.ctx.say(&format!(
                    "warning: could not remove staging directory {}: {e}",
                    self.staging.display()
                ));
            }
        }
        remove_created(&self.created);
    }
}

/// What a killed run left beside `target`: an old tree set aside by a replace is renamed
/// back when the target is missing (it is then the only one there is), deleted otherwise;
/// anything else (a staging directory) is deleted. `leftover` must be named with one of
/// the transaction's own prefixes; the caller holds whatever lock proves no live run owns
/// it. Returns what was done, for the user.
pub fn restore_or_remove(leftover: &Path, target: &Path) -> Option<String> {
    let is_replaced = leftover
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with(REPLACED_PREFIX));
    if is_replaced && std::fs::symlink_metadata(target).is_err() {
        return std::fs::rename(leftover, target).ok().map(|()| {
            format!(
                "restored {} from {}, where a killed replace had left it",
                target.display(),
                leftover.display()
            )
        });
    }
    std::fs::remove_dir_all(leftover).ok().map(|()| {
        format!(
            "removed {}, left by an earlier run that was killed",
            leftover.display()
        )
    })
}

/// Renames `from` to `to` only where nothing is at `to`, in one step:
/// `renameat2(RENAME_NOREPLACE)`. A plain `rename` silently replaces an empty directory,
/// so a check before it leaves a window in which one appearing at `to` is lost. Where the
/// filesystem (or kernel) has no such rename, the check and the rename are made apart, as
/// close together as they can be.
fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
    };
    let (cf, ct) = (c(from)?, c(to)?);
    // SAFETY: both are valid NUL-terminated paths; AT_FDCWD resolves them as given.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            cf.as_ptr(),
            libc::AT_FDCWD,
            ct.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => {
            if std::fs::symlink_metadata(to).is_ok() {
                return Err(std::io::ErrorKind::AlreadyExists.into());
            }
            std::fs::rename(from, to)
        }
        _ => Err(err),
    }
}

/// Swaps two directories atomically with `renameat2(RENAME_EXCHANGE)`; `Ok(false)` where
/// the filesystem (or kernel) cannot, so the caller takes the journalled way.
fn exchange(a: &Path, b: &Path) -> Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes());
    let (ca, cb) = (c(a)?, c(b)?);
    // SAFETY: both are valid NUL-terminated paths; AT_FDCWD resolves them as given.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => Ok(false),
        _ => Err(err).with_context(|| format!("cannot swap {} into {}", a.display(), b.display())),
    }
}

fn remove_created(created: &[PathBuf]) {
    for dir in created.iter().rev() {
        // Only empty directories: something else may have been put there meanwhile.
        let _ = std::fs::remove_dir(dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> crate::context::Context {
        crate::context::Context::from_process()
    }

    #[test]
    fn a_dropped_transaction_undoes_everything_it_did() {
        let t = tempfile::tempdir().unwrap();
        let target = t.path().join("a/b/thing");
        let txn = Transaction::begin(&ctx(), target.clone(), ".staging-thing-", "test").unwrap();
        std::fs::write(txn.path().join("x"), "partial").unwrap();
        drop(txn);
        assert!(!t.path().join("a").exists());
    }

    #[test]
    fn commit_and_replace_leave_exactly_the_new_content() {
        let t = tempfile::tempdir().unwrap();
        let target = t.path().join("thing");
        for round in ["one", "two", "three"] {
            let txn =
                Transaction::begin(&ctx(), target.clone(), ".staging-thing-", "test").unwrap();
            std::fs::write(txn.path().join("v"), round).unwrap();
            if round == "one" {
                txn.commit().unwrap();
            } else {
                assert_eq!(txn.commit_replacing().unwrap(), Committed::Clean);
            }
            assert_eq!(std::fs::read_to_string(target.join("v")).unwrap(), round);
            assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 1);
        }
        let txn = Transaction::begin(&ctx(), target.clone(), ".staging-thing-", "test").unwrap();
        assert!(txn.commit().is_err(), "a plain commit never overwrites");
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 1);
    }

    /// A directory that appears at the target after any check fdl could make is never
    /// replaced: the rename itself refuses it, and both stay as they were.
    #[test]
    fn a_commit_never_replaces_what_is_at_the_target_even_an_empty_directory() {
        let t = tempfile::tempdir().unwrap();
        let (from, to) = (t.path().join("staged"), t.path().join("target"));
        std::fs::create_dir(&from).unwrap();
        std::fs::write(from.join("v"), "new").unwrap();
        std::fs::create_dir(&to).unwrap();
        let e = rename_noreplace(&from, &to).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{e}");
        assert_eq!(std::fs::read_dir(&to).unwrap().count(), 0);
        assert!(from.join("v").exists());
        std::fs::remove_dir(&to).unwrap();
        rename_noreplace(&from, &to).unwrap();
        assert!(to.join("v").exists() && !from.exists());
    }

    /// Once the new tree is in place, an old one that cannot be deleted is a warning: the
    /// replace succeeded (the caller goes on to record it), by exchange or by setting aside.
    #[test]
    fn an_old_tree_that_cannot_be_removed_after_the_swap_is_a_warning_not_a_failure() {
        for try_exchange in [true, false] {
            let t = tempfile::tempdir().unwrap();
            let target = t.path().join("thing");
            std::fs::create_dir(&target).unwrap();
            std::fs::write(target.join("v"), "old").unwrap();
            let txn =
                Transaction::begin(&ctx(), target.clone(), ".staging-thing-", "test").unwrap();
            std::fs::write(txn.path().join("v"), "new").unwrap();
            let refuse = |_: &Path| Err(std::io::Error::from_raw_os_error(libc::EBUSY));
            let done = txn.replace(try_exchange, &refuse).unwrap();
            assert_eq!(std::fs::read_to_string(target.join("v")).unwrap(), "new");
            let Committed::OldLeft { path, .. } = &done else {
                panic!("{done:?}");
            };
            assert_eq!(std::fs::read_to_string(path.join("v")).unwrap(), "old");
            let warning = done.warning().unwrap();
            assert!(
                warning.starts_with("warning: the new one is in place"),
                "{warning}"
            );
        }
    }
}
