//! Digests: of bytes, of one file, and of a whole directory tree. A ground-floor module:
//! plans name Dockerfiles by SHA-256, `cluster ship` compares builds by their tree
//! digest, the build store checks its entries by the faster BLAKE3 one, and a source
//! tree's digest names it in a store key. One walk serves every tree digest, so they
//! all treat links, special files and files that change under them the same way.
//!
//! A tree's digest is that of a text of one line per entry, by relative path in byte
//! order: `path\0dir`, `path\0link <target>` (never followed) or `path\0file <digest>`.
//! Anything else (a FIFO, a device, a socket) is refused: a tree fdl digests holds only
//! files, directories and links.

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

/// How much is read per call: large enough that the syscalls cost nothing next to the
/// hashing, small enough to stay in the cache. (Reading beat `mmap` here, and cannot
/// die of a `SIGBUS` when a file shrinks while it is hashed.)
pub const CHUNK: usize = 1 << 20;

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex SHA-256 of `bytes`: identities in plans (Dockerfiles) and keys of lock files.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Hex SHA-256 of a file's content, read in a stream (a library or fdl's own binary is
/// tens to hundreds of MiB). Only a regular file, checked on its descriptor, and never
/// through a link at `path` itself: a FIFO there cannot hang fdl, nor a device feed it
/// forever; a file that changes size while it is read is an error.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = crate::fsread::open_regular(path, true)?;
    let mut buf = vec![0u8; CHUNK];
    sha256_of(&mut file, path, &mut buf)
}

/// Hex SHA-256 of what `file` (opened at `path`, for the message) holds, read to the
/// size its descriptor has now.
pub fn sha256_of(file: &mut std::fs::File, path: &Path, buf: &mut [u8]) -> Result<String> {
    let mut hasher = Sha256::new();
    read_sized(file, path, buf, &mut |chunk| hasher.update(chunk))?;
    Ok(hex(&hasher.finalize()))
}

/// The size and hex BLAKE3 of a regular file's content (never through a link at
/// `path`), read in a stream with `buf`: what a build's manifest records of each file.
pub fn blake3_file(path: &Path, buf: &mut [u8]) -> Result<(u64, String)> {
    let mut f = crate::fsread::open_regular(path, true)?;
    let mut hasher = blake3::Hasher::new();
    let mut size = 0u64;
    read_sized(&mut f, path, buf, &mut |chunk| {
        size += chunk.len() as u64;
        hasher.update(chunk);
    })?;
    Ok((size, hasher.finalize().to_hex().to_string()))
}

/// Which hash a tree digest uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hash {
    /// Plain hex: what `cluster ship` compares across hosts and source trees are named by.
    Sha256,
    /// `blake3:<hex>`: the build store's check of an entry at every install (on the
    /// 208 MiB of a released NCCL, SHA-256 took about 0.4 s, several times a plain copy;
    /// BLAKE3 reads and hashes the same bytes in a fraction of that).
    Blake3,
}

/// What a tree digest leaves out.
#[derive(Debug, Clone, Copy, Default)]
pub struct Leave<'a> {
    /// Top-level entries of these names, whatever they are (`.git` of a source tree).
    pub top: &'a [&'a str],
    /// Regular files at these relative paths (a directory of such a name stays in).
    pub files: &'a [&'a str],
}

/// The digest of the tree at `dir`, in `hash`, leaving out what `leave` names. `holds`
/// names the tree in the refusal of a special file ("a build", "an NCCL source tree").
pub fn tree(dir: &Path, hash: Hash, leave: Leave, holds: &str) -> Result<String> {
    tree_knowing(dir, hash, leave, holds, &FileDigests::new())
}

/// Files' BLAKE3 digests (with their sizes) by relative path, taken as the bytes went by
/// (a copy that hashed what it wrote): a walk given them reads none of those files again.
pub type FileDigests = std::collections::BTreeMap<String, (u64, String)>;

/// [`tree`] in BLAKE3, with the digests of the files `known` names taken from it rather
/// than read again; every other file is read. Only for files fdl itself wrote in this
/// run, hashing what it wrote.
pub fn tree_knowing(
    dir: &Path,
    hash: Hash,
    leave: Leave,
    holds: &str,
    known: &FileDigests,
) -> Result<String> {
    let mut walk = Walk {
        hash,
        leave,
        holds,
        buf: vec![0u8; CHUNK],
        text: String::new(),
        known,
    };
    walk.dir(dir)?;
    Ok(match hash {
        Hash::Sha256 => sha256_hex(walk.text.as_bytes()),
        Hash::Blake3 => format!("blake3:{}", blake3::hash(walk.text.as_bytes()).to_hex()),
    })
}

struct Walk<'a> {
    hash: Hash,
    leave: Leave<'a>,
    holds: &'a str,
    buf: Vec<u8>,
    text: String,
    known: &'a FileDigests,
}

impl Walk<'_> {
    fn dir(&mut self, dir: &Path) -> Result<()> {
        crate::fsread::walk_tree(
            dir,
            &mut |e| {
                if e.top && self.leave.top.contains(&e.rel) {
                    return Ok(false);
                }
                let path = e.rel;
                if e.kind.is_symlink() {
                    let target = std::fs::read_link(e.path)
                        .with_context(|| format!("cannot read the link {}", e.path.display()))?;
                    self.text
                        .push_str(&format!("{path}\0link {}\n", target.display()));
                } else if e.kind.is_dir() {
                    self.text.push_str(&format!("{path}\0dir\n"));
                } else if e.kind.is_file() {
                    if self.leave.files.contains(&path) {
                        return Ok(false);
                    }
                    let digest = match (self.hash, self.known.get(path)) {
                        (Hash::Blake3, Some((_, known))) => known.clone(),
                        _ => self.file(e.path)?,
                    };
                    self.text.push_str(&format!("{path}\0file {digest}\n"));
                } else {
                    bail!(
                        "{} is {}: {} holds only files, directories and links",
                        e.path.display(),
                        crate::fsread::kind_of(&e.kind),
                        self.holds
                    );
                }
                Ok(true)
            },
            &|path, why| Err(why.error(path, "read")),
        )
    }

    /// The digest of the regular file at `path` (a link there is refused, not followed).
    fn file(&mut self, path: &Path) -> Result<String> {
        let mut f = crate::fsread::open_regular(path, true)?;
        match self.hash {
            Hash::Sha256 => sha256_of(&mut f, path, &mut self.buf),
            Hash::Blake3 => {
                let mut hasher = blake3::Hasher::new();
                read_sized(&mut f, path, &mut self.buf, &mut |chunk| {
                    hasher.update(chunk);
                })?;
                Ok(hasher.finalize().to_hex().to_string())
            }
        }
    }
}

/// Feeds `f` to `eat`, read to the size its descriptor had when this began: a file that
/// grows or shrinks while it is read is an error, not an endless or a short read.
pub fn read_sized(
    f: &mut std::fs::File,
    path: &Path,
    buf: &mut [u8],
    eat: &mut dyn FnMut(&[u8]),
) -> Result<()> {
    let len = f
        .metadata()
        .with_context(|| format!("cannot stat {}", path.display()))?
        .len();
    let mut rest = f.take(len.saturating_add(1));
    let mut seen: u64 = 0;
    loop {
        let n = match rest.read(buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        eat(&buf[..n]);
        seen += n as u64;
    }
    if seen != len {
        bail!(
            "{} changed size while it was read ({len} bytes when opened, {seen} read)",
            path.display()
        );
    }
    Ok(())
}
