//! The two digests the store records of an entry's tree, both by the one walk of
//! [`crate::digest::tree`]:
//! - [`tree_blake3`], checked in full at every install (BLAKE3: on the 208 MiB of a
//!   released NCCL, SHA-256 took about 0.4 s, several times a plain copy). It covers
//!   `nccl.pc` too: within one store the prefix in it is the entry's own, so nothing in
//!   the tree is left unchecked.
//! - [`content_digest`], the SHA-256 that `cluster ship` compares across hosts: it leaves
//!   `nccl.pc` out, since its `prefix=` names the directory the build is in, which
//!   differs per host.

use crate::digest::{self, Hash, Leave};
use anyhow::Result;
use std::path::Path;

/// Where a build's pkg-config file is: its `prefix=` is the one line of a build that
/// depends on where it is installed.
pub const PKG_CONFIG: &str = "lib/pkgconfig/nccl.pc";

/// The BLAKE3 tree digest of `dir`, as `blake3:<64 hex digits>`.
pub fn tree_blake3(dir: &Path) -> Result<String> {
    digest::tree(dir, Hash::Blake3, Leave::default(), "a build")
}

/// [`tree_blake3`] of a copy fdl just made, taking the digests the copy hashed as it
/// wrote ([`crate::store::clone::clone_tree_hashed`]) and reading only the other files.
pub fn tree_blake3_knowing(dir: &Path, known: &digest::FileDigests) -> Result<String> {
    digest::tree_knowing(dir, Hash::Blake3, Leave::default(), "a build", known)
}

/// A build's bytes, named by one digest: every file's content, every link's target, by
/// relative path in order, but for [`PKG_CONFIG`].
pub fn content_digest(dir: &Path) -> Result<String> {
    let leave = Leave {
        top: &[],
        files: &[PKG_CONFIG],
    };
    digest::tree(dir, Hash::Sha256, leave, "a build")
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
