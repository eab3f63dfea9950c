//! The store's own check of an entry: a BLAKE3 digest of a whole install tree, read in
//! full at every install. Why not the SHA-256 [`crate::cluster::receive::content_digest`]
//! the record also keeps (for `cluster ship`, which compares those): on the 208 MiB of a
//! released NCCL, SHA-256 took about 0.4 s, several times a plain copy; BLAKE3 (SIMD,
//! chosen at run time) reads and hashes the same bytes in a fraction of that.
//!
//! The walk is `content_digest`'s: every file's content and every link's target, by
//! relative path in order, directories by name; a link is never followed; anything that
//! is not a file, directory or link is refused. Unlike `content_digest` it covers
//! `nccl.pc` too: within one store the prefix in it is the entry's own, so nothing in
//! the tree is left unchecked.

use anyhow::{bail, Context, Result};
use std::io::Read;
use std::path::Path;

/// How much is read per call: large enough that the syscalls cost nothing next to the
/// hashing, small enough to stay in the cache. (Reading beat `mmap` here, and cannot
/// die of a `SIGBUS` when a file shrinks while it is hashed.)
const CHUNK: usize = 1 << 20;

/// The BLAKE3 tree digest of `dir`, as `blake3:<64 hex digits>`.
pub fn tree_blake3(dir: &Path) -> Result<String> {
    let mut buf = vec![0u8; CHUNK];
    let mut text = String::new();
    walk(dir, "", &mut text, &mut buf)?;
    Ok(format!("blake3:{}", blake3::hash(text.as_bytes()).to_hex()))
}

fn walk(dir: &Path, rel: &str, out: &mut String, buf: &mut [u8]) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("cannot read {}", dir.display()))?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        let kind = e
            .file_type()
            .with_context(|| format!("cannot stat {}", e.path().display()))?;
        if kind.is_symlink() {
            let target = std::fs::read_link(e.path())
                .with_context(|| format!("cannot read the link {}", e.path().display()))?;
            out.push_str(&format!("{path}\0link {}\n", target.display()));
        } else if kind.is_dir() {
            out.push_str(&format!("{path}\0dir\n"));
            walk(&e.path(), &path, out, buf)?;
        } else if kind.is_file() {
            out.push_str(&format!("{path}\0file {}\n", file_blake3(&e.path(), buf)?));
        } else {
            bail!(
                "{} is {}: a build holds only files, directories and links",
                e.path().display(),
                crate::fsread::kind_of(&kind)
            );
        }
    }
    Ok(())
}

/// The BLAKE3 of the regular file at `path` (a link there is refused, not followed),
/// read to the size its descriptor had when opened: a file that grows or shrinks while
/// it is read is an error, not an endless or a short read.
fn file_blake3(path: &Path, buf: &mut [u8]) -> Result<String> {
    let f = crate::fsread::open_regular(path, true)?;
    let len = f
        .metadata()
        .with_context(|| format!("cannot stat {}", path.display()))?
        .len();
    let mut hasher = blake3::Hasher::new();
    let mut rest = f.take(len.saturating_add(1));
    let mut seen: u64 = 0;
    loop {
        let n = match rest.read(buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        hasher.update(&buf[..n]);
        seen += n as u64;
    }
    if seen != len {
        bail!(
            "{} changed size while it was read ({len} bytes when opened, {seen} read)",
            path.display()
        );
    }
    Ok(hasher.finalize().to_hex().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sees_every_byte_links_and_nested_dirs_and_refuses_fifos() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        std::fs::create_dir_all(d.join("lib/pkgconfig")).unwrap();
        std::fs::write(d.join("lib/libnccl.so.2.28.9"), vec![7u8; 3 << 20]).unwrap();
        std::fs::write(d.join("lib/pkgconfig/nccl.pc"), "prefix=/a\n").unwrap();
        let first = tree_blake3(d).unwrap();
        assert!(
            first.starts_with("blake3:") && first.len() == 7 + 64,
            "{first}"
        );
        assert_eq!(tree_blake3(d).unwrap(), first, "not deterministic");

        // One byte in the middle of the second chunk, same size.
        let mut bytes = vec![7u8; 3 << 20];
        bytes[(1 << 20) + 12345] = 8;
        std::fs::write(d.join("lib/libnccl.so.2.28.9"), &bytes).unwrap();
        let changed = tree_blake3(d).unwrap();
        assert_ne!(changed, first);

        // nccl.pc, deeper down, counts.
        std::fs::write(d.join("lib/pkgconfig/nccl.pc"), "prefix=/b\n").unwrap();
        let pc = tree_blake3(d).unwrap();
        assert_ne!(pc, changed);

        // A link: its target is what counts, and it is not followed.
        std::os::unix::fs::symlink("libnccl.so.2.28.9", d.join("lib/libnccl.so.2")).unwrap();
        let linked = tree_blake3(d).unwrap();
        assert_ne!(linked, pc);
        std::fs::remove_file(d.join("lib/libnccl.so.2")).unwrap();
        std::os::unix::fs::symlink("libnccl.so.2.28.8", d.join("lib/libnccl.so.2")).unwrap();
        assert_ne!(tree_blake3(d).unwrap(), linked);
        std::fs::remove_file(d.join("lib/libnccl.so.2")).unwrap();
        assert_eq!(tree_blake3(d).unwrap(), pc);

        // An empty nested directory counts, and so does a file moved between directories.
        std::fs::create_dir(d.join("include")).unwrap();
        let with_dir = tree_blake3(d).unwrap();
        assert_ne!(with_dir, pc);
        std::fs::rename(d.join("lib/pkgconfig/nccl.pc"), d.join("include/nccl.pc")).unwrap();
        assert_ne!(tree_blake3(d).unwrap(), with_dir);

        let fifo = d.join("include/fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = tree_blake3(d).unwrap_err().to_string();
        assert!(e.contains("a FIFO"), "{e}");
    }

    #[test]
    fn a_known_answer() {
        // One file "abc" at the top: the tree text is fixed, so is its digest, and the
        // file's own digest is BLAKE3's published test value for "abc".
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("a"), "abc").unwrap();
        let file = "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85";
        let text = format!("a\0file {file}\n");
        assert_eq!(
            tree_blake3(t.path()).unwrap(),
            format!("blake3:{}", blake3::hash(text.as_bytes()).to_hex())
        );
    }
}
