//! Copying a build tree cheaply: each file by reflink (the `FICLONE` ioctl: shared
//! extents, copy-on-write), else by hard link, else by a byte copy. A reflink or a copy
//! gives an independent file; a hard link shares the inode, which is why the store
//! checks an entry's digest every time it installs from it.
//!
//! Only directories, regular files and links are copied; a link is made again with the
//! same target, never followed, and a file is opened without following links.

use anyhow::{bail, Context, Result};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// How the files of a tree were brought over; the weakest method any file needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Method {
    Reflink,
    Hardlink,
    Copy,
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Method::Reflink => "reflink",
            Method::Hardlink => "hard link",
            Method::Copy => "copy",
        })
    }
}

/// `FICLONE` from linux/fs.h: `_IOW(0x94, 9, int)`.
const FICLONE: libc::c_ulong = 0x4004_9409;

/// Copies the tree at `src` into the existing, empty directory `dst`.
pub fn clone_tree(src: &Path, dst: &Path) -> Result<Method> {
    let mut state = State {
        reflink: true,
        hardlink: true,
        used: Method::Reflink,
    };
    walk(src, dst, &mut state)?;
    Ok(state.used)
}

struct State {
    /// Whether the method is still worth trying: one refusal (another filesystem, no
    /// reflink support) holds for the whole tree.
    reflink: bool,
    hardlink: bool,
    used: Method,
}

fn walk(src: &Path, dst: &Path, state: &mut State) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(src)
        .with_context(|| format!("cannot read {}", src.display()))?
        .collect::<std::io::Result<_>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let from = e.path();
        let to = dst.join(e.file_name());
        let kind = e.file_type()?;
        if kind.is_symlink() {
            let target = std::fs::read_link(&from)?;
            std::os::unix::fs::symlink(&target, &to)
                .with_context(|| format!("cannot create {}", to.display()))?;
        } else if kind.is_dir() {
            std::fs::create_dir(&to).with_context(|| format!("cannot create {}", to.display()))?;
            walk(&from, &to, state)?;
        } else if kind.is_file() {
            let method = file(&from, &to, state)?;
            state.used = state.used.max(method);
        } else {
            bail!(
                "{} is {}: a build holds only files, directories and links",
                from.display(),
                crate::fsread::kind_of(&kind)
            );
        }
    }
    Ok(())
}

fn file(from: &Path, to: &Path, state: &mut State) -> Result<Method> {
    let src = crate::fsread::open_regular(from, true)?;
    let mode = src.metadata()?.permissions();
    if state.reflink {
        let dst = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(to)
            .with_context(|| format!("cannot create {}", to.display()))?;
        // SAFETY: both descriptors are open for the duration of the call; FICLONE takes
        // the source descriptor as its argument and changes only the destination file.
        let rc = unsafe { libc::ioctl(dst.as_raw_fd(), FICLONE as _, src.as_raw_fd()) };
        if rc == 0 {
            std::fs::set_permissions(to, mode)?;
            return Ok(Method::Reflink);
        }
        // Any refusal (EOPNOTSUPP, EXDEV, EINVAL on filesystems without it) means
        // "not here": the next method is tried, and reflink not again.
        state.reflink = false;
        drop(dst);
        std::fs::remove_file(to).with_context(|| format!("cannot remove {}", to.display()))?;
    }
    if state.hardlink {
        match std::fs::hard_link(from, to) {
            Ok(()) => {
                // The link must be the file that was checked: a swap of `from` between
                // the check and the link would otherwise bring in anything.
                let linked = std::fs::symlink_metadata(to)?;
                let checked = src.metadata()?;
                use std::os::unix::fs::MetadataExt;
                if linked.ino() == checked.ino() && linked.dev() == checked.dev() {
                    return Ok(Method::Hardlink);
                }
                std::fs::remove_file(to)?;
                bail!("{} changed while it was linked", from.display());
            }
            Err(_) => state.hardlink = false,
        }
    }
    let mut dst = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(to)
        .with_context(|| format!("cannot create {}", to.display()))?;
    std::io::copy(&mut &src, &mut dst)
        .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
    std::fs::set_permissions(to, mode)?;
    Ok(Method::Copy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_is_cloned_with_its_links_and_modes() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        std::fs::create_dir_all(src.join("lib")).unwrap();
        std::fs::write(src.join("lib/libx.so.1.2"), b"elf").unwrap();
        std::fs::set_permissions(
            src.join("lib/libx.so.1.2"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::os::unix::fs::symlink("libx.so.1.2", src.join("lib/libx.so.1")).unwrap();
        let dst = t.path().join("dst");
        std::fs::create_dir(&dst).unwrap();
        let method = clone_tree(&src, &dst).unwrap();
        assert_eq!(std::fs::read(dst.join("lib/libx.so.1.2")).unwrap(), b"elf");
        assert_eq!(
            std::fs::read_link(dst.join("lib/libx.so.1")).unwrap(),
            Path::new("libx.so.1.2")
        );
        let mode = std::fs::metadata(dst.join("lib/libx.so.1.2"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755, "{method}");
    }

    #[test]
    fn a_fifo_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        std::fs::create_dir(&src).unwrap();
        let c = std::ffi::CString::new(src.join("p").to_str().unwrap()).unwrap();
        // SAFETY: a valid C string; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let dst = t.path().join("dst");
        std::fs::create_dir(&dst).unwrap();
        let e = clone_tree(&src, &dst).unwrap_err().to_string();
        assert!(e.contains("a FIFO"), "{e}");
    }
}
