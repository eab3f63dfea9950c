//! Where a native build's NCCL source comes from: the user's tree (`--source`, checked
//! against the tag and never written to), or a shallow clone of the tag kept in the
//! user's cache (`<cache>/nccl-src/<tag>`) and reused by every later build of that tag.
//!
//! A cache entry is trusted only after checking it is a clean git checkout of the tag
//! whose `makefiles/version.mk` matches; anything else is replaced. Clones go to a
//! temporary directory beside the entry and are renamed into place when complete, so an
//! interrupted clone never looks like a finished one. A per-entry file lock keeps two
//! fdl processes (building different archs of one tag) from cloning over each other.

use crate::nccl::plan::NativeSource;
use crate::nccl::tag::Tag;
use crate::process;
use crate::progress::{Phase, Progress};
use crate::txn::Transaction;
use crate::version::NcclVersion;
use anyhow::{anyhow, bail, Context, Result};
use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::process::Command;

/// NCCL's public repository, cloned when no `--source` is given.
pub const NCCL_REPO: &str = "https://github.com/NVIDIA/nccl.git";
/// Overrides [`NCCL_REPO`]: a mirror, a fork, or a local repository in tests.
pub const REPO_ENV: &str = "FDL_NCCL_REPO";
/// The clone cache's directory under fdl's cache: `<cache>/nccl-src/<repo>/<tag>`.
const CLONE_CACHE_DIR: &str = "nccl-src";

/// Names of leftovers of an unfinished clone of `tag` in the cache.
fn partial_prefix(tag: &Tag) -> String {
    format!(".{tag}.partial-")
}

/// Reads `NCCL_MAJOR := 2` etc. from the text of NCCL's `makefiles/version.mk`.
pub fn parse_version_mk(text: &str) -> Result<NcclVersion, String> {
    let value = |key: &str| -> Option<String> {
        text.lines().find_map(|line| {
            let (name, value) = line.split_once('=')?;
            // `:=`, `?=` and `=` all set it; the name is what comes before the operator.
            let name = name.trim().trim_end_matches([':', '?', '+']).trim();
            (name == key).then(|| value.trim().to_string())
        })
    };
    let number = |key: &str| -> Result<u32, String> {
        let v = value(key).ok_or_else(|| format!("it does not set {key}"))?;
        v.parse()
            .map_err(|_| format!("its {key} is '{v}', not a number"))
    };
    let mut version = NcclVersion::new(
        number("NCCL_MAJOR")?,
        number("NCCL_MINOR")?,
        number("NCCL_PATCH")?,
    );
    version.suffix = value("NCCL_SUFFIX").unwrap_or_default();
    Ok(version)
}

/// The version of the NCCL tree at `dir`, or why it is not one.
pub fn tree_version(dir: &Path) -> Result<NcclVersion, String> {
    let mk = dir.join("makefiles").join("version.mk");
    // NCCL's is a few lines; a FIFO, a device or a huge file there is named as such.
    let text = match crate::fsread::read_text_if_present(&mk, 64 << 10) {
        Ok(Some(text)) => text,
        Ok(None) => return Err("it has no makefiles/version.mk".to_string()),
        Err(e) => return Err(format!("{e:#}")),
    };
    let version = parse_version_mk(&text).map_err(|e| format!("makefiles/version.mk: {e}"))?;
    for needed in ["Makefile", "src"] {
        if !dir.join(needed).exists() {
            return Err(format!("it has makefiles/version.mk but no {needed}"));
        }
    }
    Ok(version)
}

/// The source for `tag`: `source_dir` checked to be an NCCL tree of the tag's version,
/// or where the clone of the tag lives in `cache_root`. Cheap: it clones nothing.
pub fn source_for(source_dir: Option<&Path>, tag: &Tag, cache_root: &Path) -> Result<NativeSource> {
    match source_dir {
        Some(dir) => {
            let (path, version) =
                check_source_dir(dir, tag).map_err(crate::project::RootIrrelevant)?;
            Ok(NativeSource::Dir { path, version })
        }
        None => {
            let repo = std::env::var(REPO_ENV)
                .ok()
                .filter(|r| !r.trim().is_empty())
                .unwrap_or_else(|| NCCL_REPO.to_string());
            Ok(NativeSource::Clone {
                cache_dir: cache_root
                    .join(CLONE_CACHE_DIR)
                    .join(repo_key(&repo))
                    .join(tag.as_str()),
                repo,
            })
        }
    }
}

/// The cache directory of one repository: a readable slug of its URL and a digest of
/// the whole URL, so clones of the same tag from two repositories never mix, and the
/// record of a build names the clone it was really made from.
pub fn repo_key(repo: &str) -> String {
    let slug: String = repo
        .trim_end_matches('/')
        .trim_end_matches(".git")
        .rsplit(['/', ':'])
        .take(2)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("-")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(48)
        .collect();
    format!(
        "{slug}-{}",
        &crate::digest::sha256_hex(repo.as_bytes())[..12]
    )
}

/// Checks a `--source` tree: it exists, is NCCL, and is the release the tag names.
/// Returns its absolute path (make runs in other directories) and its version.
pub fn check_source_dir(dir: &Path, tag: &Tag) -> Result<(PathBuf, NcclVersion)> {
    let path = dir.canonicalize().map_err(|_| {
        anyhow!(
            "--source {} does not exist. Give the top directory of an NCCL checkout or unpacked release",
            dir.display()
        )
    })?;
    if !path.is_dir() {
        bail!("--source {} is not a directory. Give the top directory of an NCCL checkout or unpacked release", dir.display());
    }
    let version = tree_version(&path).map_err(|why| {
        anyhow!(
            "--source {} is not an NCCL source tree: {why}. Give the top directory of an NCCL checkout (git clone {NCCL_REPO}) or of an unpacked release",
            dir.display()
        )
    })?;
    if let Some(want) = tag.version() {
        if !want.same_release(&version) {
            bail!(
                "--source {} is NCCL {version} (makefiles/version.mk), but tag {tag} is NCCL {want}. Pass --tag {} to build that tree, or point --source at an NCCL {want} tree",
                dir.display(),
                Tag::for_release(&version)
            );
        }
    }
    Ok((path, version))
}

/// Why the cache entry at `dir` cannot be used for `tag`, or `None` when it can.
fn cache_entry_problem(dir: &Path, repo: &str, tag: &Tag, git: &Path) -> Option<String> {
    if !dir.is_dir() {
        return Some("it is not a directory".into());
    }
    if !dir.join(".git").exists() {
        return Some("it is not a git checkout".into());
    }
    let version = match tree_version(dir) {
        Ok(v) => v,
        Err(why) => return Some(format!("it is not a complete NCCL tree: {why}")),
    };
    if let Some(want) = tag.version() {
        if !want.same_release(&version) {
            return Some(format!("its version.mk says NCCL {version}, not {want}"));
        }
    }
    let git_out = |args: &[&str]| {
        process::capture(
            Command::new(git)
                .arg("-C")
                .arg(dir)
                .args(args)
                .env("GIT_TERMINAL_PROMPT", "0"),
            &format!("git {}", args.join(" ")),
        )
        .map(|s| s.trim().to_string())
    };
    // The entry's key comes from the URL, but a clone moved or copied by hand would not.
    match git_out(&["config", "--get", "remote.origin.url"]) {
        Ok(origin) if origin == repo => {}
        Ok(origin) => return Some(format!("it was cloned from {origin}, not {repo}")),
        Err(_) => return Some("it names no origin".into()),
    }
    let head = match git_out(&["rev-parse", "--verify", "HEAD^{commit}"]) {
        Ok(h) => h,
        Err(e) => return Some(format!("git cannot read it ({e:#})")),
    };
    match git_out(&["rev-parse", "--verify", &format!("{tag}^{{commit}}")]) {
        Ok(at_tag) if at_tag == head => {}
        Ok(_) => return Some(format!("it is checked out at another commit than {tag}")),
        Err(_) => return Some(format!("it has no {tag}")),
    }
    // Deleted or edited tracked files: the checkout is incomplete or was changed.
    match git_out(&["status", "--porcelain", "--untracked-files=no"]) {
        Ok(s) if s.is_empty() => None,
        Ok(s) => Some(format!(
            "its files differ from {tag} ({})",
            s.lines().take(3).collect::<Vec<_>>().join("; ")
        )),
        Err(e) => Some(format!("git cannot check it ({e:#})")),
    }
}

/// Makes sure `cache_dir` holds a usable clone of `tag` from `repo` and returns it:
/// reuses a good entry, replaces a damaged one, clones when there is none.
pub fn ensure_clone(
    ctx: &crate::context::Context,
    repo: &str,
    tag: &Tag,
    cache_dir: &Path,
    git: &Path,
    progress: &Progress,
) -> Result<PathBuf> {
    let parent = cache_dir
        .parent()
        .ok_or_else(|| anyhow!("the source cache {} has no parent", cache_dir.display()))?;
    // `<cache>/nccl-src/<repo>/` made and checked as every cache directory is (never
    // through a link, never another user's): the cache is found above the layout that
    // [`source_for`] gives.
    let root = parent
        .ancestors()
        .find(|a| a.file_name().is_some_and(|n| n == CLONE_CACHE_DIR))
        .and_then(Path::parent)
        .ok_or_else(|| {
            anyhow!(
                "the source cache {} is not under fdl's {CLONE_CACHE_DIR}/",
                cache_dir.display()
            )
        })?;
    let rel = parent.strip_prefix(root).unwrap_or(parent);
    crate::cache::subdir(root, &rel.to_string_lossy())
        .with_context(|| format!("cannot use the source cache {}", parent.display()))?;
    let _lock = lock_entry(&parent.join(format!(".{tag}.lock")), progress)?;

    // Under the lock nobody else is cloning this tag: any partial clone is a leftover of
    // an fdl that was killed.
    let prefix = partial_prefix(tag);
    if let Ok(entries) = std::fs::read_dir(parent) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                progress.output(&format!(
                    "==> fdl: removing an unfinished clone {}",
                    e.path().display()
                ));
                remove_any(&e.path())?;
            }
        }
    }

    if std::fs::symlink_metadata(cache_dir).is_ok() {
        match cache_entry_problem(cache_dir, repo, tag, git) {
            None => {
                progress.note(&format!(
                    "Using the cached NCCL source at {}",
                    cache_dir.display()
                ));
                return Ok(cache_dir.to_path_buf());
            }
            Some(why) => {
                progress.note(&format!(
                    "The cached NCCL source at {} is damaged ({why}); cloning it again",
                    cache_dir.display()
                ));
                remove_any(cache_dir)?;
            }
        }
    }

    progress.phase(Phase::Clone);
    // Rolled back on drop, so a failed or interrupted clone leaves nothing behind.
    let txn = Transaction::begin(ctx, cache_dir.to_path_buf(), &prefix, "clone")?;
    let mut cmd = Command::new(git);
    cmd.args(["-c", "advice.detachedHead=false", "clone", "--depth", "1"])
        .arg("--branch")
        .arg(tag.as_str())
        .arg("--")
        .arg(repo)
        .arg(txn.path())
        // A wrong URL must fail, not wait for a password nobody will type.
        .env("GIT_TERMINAL_PROMPT", "0");
    progress.output(&format!(
        "==> fdl: git clone --depth 1 --branch {tag} {repo}"
    ));
    process::stream(
        &mut cmd,
        &format!("git clone of {repo} at {tag}"),
        &mut |l| progress.output(l),
    )
    .map_err(|e| {
        if e.downcast_ref::<process::Interrupted>().is_some() {
            return e;
        }
        e.context(format!(
            "cannot clone {repo} at {tag}. Without access to it, build from a copy of NCCL's source: unpack the {tag} release tarball (or any checkout of that tag) and pass it with --source DIR"
        ))
    })?;
    if let Some(why) = cache_entry_problem(txn.path(), repo, tag, git) {
        bail!("the clone of {repo} at {tag} cannot be built: {why}");
    }
    txn.commit()
        .with_context(|| format!("cannot move the clone into {}", cache_dir.display()))?;
    Ok(cache_dir.to_path_buf())
}

fn remove_any(path: &Path) -> Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if meta.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    }
    .with_context(|| format!("cannot remove {}", path.display()))
}

/// Takes the cache entry's lock, waiting (interruptibly) while another fdl holds it.
fn lock_entry(path: &Path, progress: &Progress) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    // Never through a link, never blocked by a FIFO, and private as every lock is.
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .with_context(|| format!("cannot open lock file {}", path.display()))?;
    let mut said = false;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(TryLockError::WouldBlock) => {
                if !said {
                    progress.note("Another fdl is preparing the same NCCL source; waiting for it…");
                    said = true;
                }
                if process::interrupted() {
                    return Err(process::Interrupted.into());
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("cannot lock {}", path.display()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VERSION_MK: &str = "##### version\nNCCL_MAJOR   := 2\nNCCL_MINOR   := 27\nNCCL_PATCH   := 5\nNCCL_SUFFIX  :=\nPKG_REVISION := 1\n";

    #[test]
    fn version_mk() {
        let v = parse_version_mk(VERSION_MK).unwrap();
        assert_eq!(v, NcclVersion::new(2, 27, 5));
        // Old trees: other assignment operators, a suffix, CUDA lines around.
        let old = "NCCL_MAJOR = 2\nNCCL_MINOR ?= 1\nNCCL_PATCH := 0\nNCCL_SUFFIX  := ~a0\nCUDA_MAJOR = $(shell echo 1)\n";
        assert_eq!(parse_version_mk(old).unwrap().to_string(), "2.1.0~a0");
        assert_eq!(
            parse_version_mk("NCCL_MAJOR := 2\nNCCL_MINOR := 27\n").unwrap_err(),
            "it does not set NCCL_PATCH"
        );
        assert!(
            parse_version_mk("NCCL_MAJOR := 2\nNCCL_MINOR := x\nNCCL_PATCH := 1")
                .unwrap_err()
                .contains("NCCL_MINOR is 'x'")
        );
        // A longer name that starts like the key is not the key.
        assert!(parse_version_mk("NCCL_MAJORX := 3\nNCCL_MINOR := 1\nNCCL_PATCH := 1").is_err());
    }

    fn tree(dir: &Path, mk: &str) {
        std::fs::create_dir_all(dir.join("makefiles")).unwrap();
        std::fs::create_dir_all(dir.join("src")).unwrap();
        std::fs::write(dir.join("Makefile"), "all:\n").unwrap();
        std::fs::write(dir.join("makefiles/version.mk"), mk).unwrap();
    }

    #[test]
    fn source_dir_must_be_nccl_of_the_tag() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("nccl");
        tree(&dir, VERSION_MK);
        let tag = Tag::parse("v2.27.5-1").unwrap();
        match source_for(Some(&dir), &tag, Path::new("/c")).unwrap() {
            NativeSource::Dir { path, version } => {
                assert_eq!(path, dir.canonicalize().unwrap());
                assert_eq!(version, NcclVersion::new(2, 27, 5));
            }
            other => panic!("{other:?}"),
        }
        // Not a release tag: any NCCL tree goes.
        assert!(source_for(Some(&dir), &Tag::parse("master").unwrap(), Path::new("/c")).is_ok());
        let other = Tag::parse("v2.26.2-1").unwrap();
        let err = source_for(Some(&dir), &other, Path::new("/c"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("is NCCL 2.27.5") && err.contains("is NCCL 2.26.2"),
            "{err}"
        );
        assert!(err.contains("--tag v2.27.5-1"), "{err}");
        let err = source_for(Some(t.path()), &tag, Path::new("/c"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("not an NCCL source tree") && err.contains("makefiles/version.mk"),
            "{err}"
        );
        let err = source_for(Some(&t.path().join("nope")), &tag, Path::new("/c"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not exist"), "{err}");
    }

    #[test]
    fn clone_goes_to_the_cache() {
        let tag = Tag::parse("v2.27.5-1").unwrap();
        match source_for(None, &tag, Path::new("/home/u/.cache/fdl")).unwrap() {
            NativeSource::Clone { cache_dir, repo } => assert_eq!(
                cache_dir,
                Path::new("/home/u/.cache/fdl/nccl-src")
                    .join(repo_key(&repo))
                    .join("v2.27.5-1")
            ),
            other => panic!("{other:?}"),
        }
    }

    /// Clones of one tag from two repositories live apart; keys are plain names.
    #[test]
    fn repositories_have_keys_of_their_own() {
        let a = repo_key(NCCL_REPO);
        assert!(a.starts_with("NVIDIA-nccl-"), "{a}");
        let b = repo_key("git@example.org:fork/nccl.git");
        let c = repo_key("/srv/mirror/nccl $(x)");
        assert!(a != b && b != c && a != c);
        for k in [&a, &b, &c] {
            assert!(
                k.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b)),
                "{k}"
            );
        }
    }
}
