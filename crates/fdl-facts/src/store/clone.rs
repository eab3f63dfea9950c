//! Copying a build tree into a new, independent one: each file by reflink (the
//! `FICLONE` ioctl: shared extents, copy-on-write) where the filesystem has it, else by
//! a byte copy. Never by hard link: a hard link shares the inode, so an edit of one
//! project's library would be an edit of the store's entry and of every other project
//! installed from it. Every file made here is a new inode, written only by fdl.
//!
//! Only directories, regular files and links are copied; a link is made again with the
//! same target, never followed, and a file is opened without following links.

use crate::digest::FileDigests;
use anyhow::{bail, Context, Result};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// How the files of a tree were brought over; the weakest method any file needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Method {
    Reflink,
    Copy,
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Method::Reflink => "reflink",
            Method::Copy => "copy",
        })
    }
}

/// `FICLONE` from linux/fs.h: `_IOW(0x94, 9, int)`.
const FICLONE: libc::c_ulong = 0x4004_9409;

/// Copies the tree at `src` into the existing, empty directory `dst`.
pub fn clone_tree(src: &Path, dst: &Path) -> Result<Method> {
    Ok(clone_tree_hashed(src, dst)?.0)
}

/// [`clone_tree`], and the BLAKE3 digest and size of each file it copied byte by byte,
/// hashed from the very bytes it wrote (a reflinked file shares extents and is not read,
/// so it has none): whoever checks the copy need not read those files again.
pub fn clone_tree_hashed(src: &Path, dst: &Path) -> Result<(Method, FileDigests)> {
    let mut state = State {
        reflink: true,
        used: Method::Reflink,
        digests: FileDigests::new(),
        buf: Vec::new(),
    };
    walk(src, dst, &mut state)?;
    Ok((state.used, state.digests))
}

struct State {
    /// Whether reflink is still worth trying: one refusal (another filesystem, no
    /// reflink support) holds for the whole tree.
    reflink: bool,
    used: Method,
    digests: FileDigests,
    buf: Vec<u8>,
}

fn walk(src: &Path, dst: &Path, state: &mut State) -> Result<()> {
    crate::fsread::walk_tree(
        src,
        &mut |e| {
            let to = dst.join(e.rel_path);
            if e.kind.is_symlink() {
                let target = std::fs::read_link(e.path)?;
                std::os::unix::fs::symlink(&target, &to)
                    .with_context(|| format!("cannot create {}", to.display()))?;
            } else if e.kind.is_dir() {
                std::fs::create_dir(&to)
                    .with_context(|| format!("cannot create {}", to.display()))?;
            } else if e.kind.is_file() {
                let method = file(e.path, &to, e.rel, state)?;
                state.used = state.used.max(method);
            } else {
                bail!(
                    "{} is {}: a build holds only files, directories and links",
                    e.path.display(),
                    crate::fsread::kind_of(&e.kind)
                );
            }
            Ok(true)
        },
        &|path, why| Err(why.error(path, "read")),
    )
}

fn file(from: &Path, to: &Path, rel: &str, state: &mut State) -> Result<Method> {
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
    let mut dst = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(to)
        .with_context(|| format!("cannot create {}", to.display()))?;
    // One read: what is written is hashed as it goes, so the copy's check reads nothing
    // again. The size the source had when opened is all that is copied.
    use std::io::Write;
    if state.buf.is_empty() {
        state.buf = vec![0u8; crate::digest::CHUNK];
    }
    let mut hasher = blake3::Hasher::new();
    let mut size = 0u64;
    let mut failed = None;
    let mut src = src;
    crate::digest::read_sized(&mut src, from, &mut state.buf, &mut |chunk| {
        if failed.is_none() {
            match dst.write_all(chunk) {
                Ok(()) => {
                    hasher.update(chunk);
                    size += chunk.len() as u64;
                }
                Err(e) => failed = Some(e),
            }
        }
    })?;
    if let Some(e) = failed {
        return Err(e)
            .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()));
    }
    std::fs::set_permissions(to, mode)?;
    state.digests.insert(
        rel.to_string(),
        (size, hasher.finalize().to_hex().to_string()),
    );
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

    /// A copy is never the same file: an edit of one side leaves the other as it was.
    #[test]
    fn every_file_is_a_new_inode() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        std::fs::create_dir_all(src.join("lib")).unwrap();
        std::fs::write(src.join("lib/libnccl.so.2.30.7"), vec![1u8; 1 << 16]).unwrap();
        let dst = t.path().join("dst");
        std::fs::create_dir(&dst).unwrap();
        clone_tree(&src, &dst).unwrap();
        let (a, b) = (
            std::fs::metadata(src.join("lib/libnccl.so.2.30.7")).unwrap(),
            std::fs::metadata(dst.join("lib/libnccl.so.2.30.7")).unwrap(),
        );
        assert_ne!((a.dev(), a.ino()), (b.dev(), b.ino()));
        assert_eq!(b.nlink(), 1);
        std::fs::OpenOptions::new()
            .write(true)
            .open(dst.join("lib/libnccl.so.2.30.7"))
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"edited"))
            .unwrap();
        assert_eq!(
            std::fs::read(src.join("lib/libnccl.so.2.30.7")).unwrap(),
            vec![1u8; 1 << 16]
        );
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

    /// What a byte copy hashed as it wrote is the digest of the file it wrote: the check
    /// of an install may take it instead of reading the copy again.
    #[test]
    fn a_copys_digests_are_those_of_the_files_it_wrote() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        std::fs::create_dir_all(src.join("lib")).unwrap();
        let big: Vec<u8> = (0..(3u32 << 20) + 17).map(|i| (i % 251) as u8).collect();
        std::fs::write(src.join("lib/libx.so.1.2"), &big).unwrap();
        std::fs::write(src.join("top"), b"x").unwrap();
        let dst = t.path().join("dst");
        std::fs::create_dir(&dst).unwrap();
        let (method, digests) = clone_tree_hashed(&src, &dst).unwrap();
        let mut buf = vec![0u8; crate::digest::CHUNK];
        for rel in ["lib/libx.so.1.2", "top"] {
            let written = crate::digest::blake3_file(&dst.join(rel), &mut buf).unwrap();
            match method {
                // Shared extents: nothing was read, so nothing is claimed.
                Method::Reflink => assert!(!digests.contains_key(rel)),
                _ => assert_eq!(digests.get(rel), Some(&written), "{rel}"),
            }
        }
    }
}
