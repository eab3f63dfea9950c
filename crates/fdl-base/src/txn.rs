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
    /// From the first directory made to the commit or rollback, an interrupt unwinds
    /// through this transaction instead of ending fdl on the spot.
    _critical: Critical,
}

impl Transaction {
    /// Opens a transaction for `target`: a fresh staging directory named `<prefix>…`
    /// beside it, creating (and recording) the missing parents.
    pub fn begin(target: PathBuf, prefix: &str, label: &'static str) -> Result<Transaction> {
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

    /// Moves the staged content into place; fails, changing nothing, if the target exists.
    pub fn commit(mut self) -> Result<()> {
        if std::fs::symlink_metadata(&self.target).is_ok() {
            bail!(
                "{} appeared meanwhile; nothing was changed",
                self.target.display()
            );
        }
        kill_point(&format!("{}:before-rename", self.label));
        std::fs::rename(&self.staging, &self.target)
            .with_context(|| format!("cannot move into {}", self.target.display()))?;
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
    pub fn commit_replacing(mut self) -> Result<()> {
        if std::fs::symlink_metadata(&self.target).is_err() {
            return self.commit();
        }
        kill_point("replace:before");
        if exchange(&self.staging, &self.target)? {
            self.committed = true;
            kill_point("replace:exchanged");
            // The staging path now holds the old content.
            return std::fs::remove_dir_all(&self.staging).with_context(|| {
                format!(
                    "the new one is in place, but the old one at {} could not be removed",
                    self.staging.display()
                )
            });
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
        std::fs::remove_dir_all(&aside).with_context(|| {
            format!(
                "the new one is in place, but the old one at {} could not be removed",
                aside.display()
            )
        })
    }
}

impl Drop for Transaction {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        if let Err(e) = std::fs::remove_dir_all(&self.staging) {
            if e.kind() != std::io::ErrorKind::NotFound {
                crate::eprintln_safe!(
                    "warning: could not remove staging directory {}: {e}",
                    self.staging.display()
                );
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

/// Swaps two directories atomically with `renameat2(RENAME_EXCHANGE)`; `Ok(false)` where
/// the filesystem (or kernel) cannot, so the caller takes the journalled way.
fn exchange(a: &Path, b: &Path) -> Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    if std::env::var_os("FDL_TEST_NO_EXCHANGE").is_some() {
        return Ok(false);
    }
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

    #[test]
    fn a_dropped_transaction_undoes_everything_it_did() {
        let t = tempfile::tempdir().unwrap();
        let target = t.path().join("a/b/thing");
        let txn = Transaction::begin(target.clone(), ".staging-thing-", "test").unwrap();
        std::fs::write(txn.path().join("x"), "partial").unwrap();
        drop(txn);
        assert!(!t.path().join("a").exists());
    }

    #[test]
    fn commit_and_replace_leave_exactly_the_new_content() {
        let t = tempfile::tempdir().unwrap();
        let target = t.path().join("thing");
        for round in ["one", "two", "three"] {
            let txn = Transaction::begin(target.clone(), ".staging-thing-", "test").unwrap();
            std::fs::write(txn.path().join("v"), round).unwrap();
            if round == "one" {
                txn.commit().unwrap();
            } else {
                txn.commit_replacing().unwrap();
            }
            assert_eq!(std::fs::read_to_string(target.join("v")).unwrap(), round);
            assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 1);
        }
        let txn = Transaction::begin(target.clone(), ".staging-thing-", "test").unwrap();
        assert!(txn.commit().is_err(), "a plain commit never overwrites");
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 1);
    }
}
