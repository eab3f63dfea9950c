//! The per-file record of a build: every directory, every link's target and every
//! file's size and BLAKE3 digest, as the manifest records them when the build is sealed,
//! and the comparison `fdl nccl verify` makes against the files as they are now.
//!
//! Why per file: a `cp` over an installed `libnccl.so.2.X.Y` keeps every name, link and
//! version string the layout check looks at, so only the bytes tell; and a changed build
//! is fixed by knowing which file changed. Every byte is read at each verify: no size,
//! inode or timestamp stands in for reading.
//!
//! Left out: fdl's own manifest (it cannot record itself) and the build log (a record of
//! how the build went, not part of what a launch loads). `lib/pkgconfig/nccl.pc` names
//! the directory it is installed in, which `cluster ship` changes per host: it is
//! recorded with its prefix set to a placeholder ([`tree::pc_with_prefix`]), so
//! everything but that one value is checked.

use crate::nccl::tree;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// One entry of a build's tree, by its path relative to the build's directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FileEntry {
    Dir {
        path: String,
    },
    Link {
        path: String,
        target: String,
    },
    File {
        path: String,
        size: u64,
        blake3: String,
    },
}

impl FileEntry {
    pub fn path(&self) -> &str {
        match self {
            FileEntry::Dir { path }
            | FileEntry::Link { path, .. }
            | FileEntry::File { path, .. } => path,
        }
    }
}

/// More entries than this is no NCCL build (one has about 20): a tree that large is not
/// walked to the end.
const MAX_ENTRIES: usize = 100_000;
/// What stands for the build's directory in the recorded `nccl.pc`.
const PC_PLACEHOLDER: &str = "${fdl_build_dir}";

/// The record of the build at `dir`, sorted by path (byte order of the relative path
/// strings, not walk order: `include/nccl_device.h` before `include/nccl_device/…`).
pub fn record(dir: &Path) -> Result<Vec<FileEntry>> {
    record_knowing(dir, &crate::digest::FileDigests::new())
}

/// [`record`], with the digests of the files `known` names (hashed by fdl as it wrote
/// them into this staging directory, in this run) taken from it instead of read again.
pub fn record_knowing(dir: &Path, known: &crate::digest::FileDigests) -> Result<Vec<FileEntry>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; crate::digest::CHUNK];
    walk(dir, &mut out, &mut buf, known)?;
    // The walk goes depth first, each directory sorted by name, which is not the order of
    // the paths once a directory and a file share a prefix ('/' sorts after '.'). The
    // record is sorted here, once, by the key every reader looks it up with.
    out.sort_by(|a, b| a.path().cmp(b.path()));
    Ok(out)
}

fn walk(
    root: &Path,
    out: &mut Vec<FileEntry>,
    buf: &mut [u8],
    known: &crate::digest::FileDigests,
) -> Result<()> {
    crate::fsread::walk_tree(
        root,
        &mut |e| {
            if out.len() >= MAX_ENTRIES {
                bail!(
                    "{} holds more than {MAX_ENTRIES} entries: it is no NCCL build",
                    root.display()
                );
            }
            if e.top && tree::RESERVED.contains(&e.rel) {
                return Ok(false);
            }
            let path = e.rel.to_string();
            if e.kind.is_symlink() {
                let target = std::fs::read_link(e.path)
                    .with_context(|| format!("cannot read the link {}", e.path.display()))?;
                out.push(FileEntry::Link {
                    path,
                    target: target.to_string_lossy().into_owned(),
                });
            } else if e.kind.is_dir() {
                out.push(FileEntry::Dir { path });
            } else if e.kind.is_file() {
                let (size, blake3) = if path == crate::store::PKG_CONFIG {
                    let text = crate::fsread::read_text(e.path, tree::PC_MAX_BYTES)?;
                    let normal = tree::pc_with_prefix(&text, PC_PLACEHOLDER)
                        .ok_or_else(|| anyhow!("{} has no prefix= line", e.path.display()))?;
                    (
                        normal.len() as u64,
                        blake3::hash(normal.as_bytes()).to_hex().to_string(),
                    )
                } else if let Some(digest) = known.get(&path) {
                    digest.clone()
                } else {
                    crate::digest::blake3_file(e.path, buf)?
                };
                out.push(FileEntry::File { path, size, blake3 });
            } else {
                bail!(
                    "{} is {}: a build holds only files, directories and links",
                    e.path.display(),
                    crate::fsread::kind_of(&e.kind)
                );
            }
            Ok(true)
        },
        &|path, why| Err(why.error(path, "list")),
    )
}

/// What a comparison found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Comparison {
    /// One sentence per path that differs, naming it; empty when all agree.
    pub changes: Vec<String>,
    pub files: usize,
    pub bytes: u64,
}

/// Reads every file of the build at `dir` again and compares it with `recorded`.
///
/// Both sides are looked up by path in maps, so neither the order the manifest holds
/// (older fdl wrote walk order) nor the order of this walk matters.
pub fn compare(dir: &Path, recorded: &[FileEntry]) -> Result<Comparison> {
    let now = record(dir)?;
    let now: BTreeMap<&str, &FileEntry> = now.iter().map(|e| (e.path(), e)).collect();
    let mut was: BTreeMap<&str, &FileEntry> = BTreeMap::new();
    let mut changes = Vec::new();
    for e in recorded {
        if was.insert(e.path(), e).is_some() {
            changes.push(format!(
                "the manifest records {} more than once",
                crate::text::clean(e.path())
            ));
        }
    }
    for (path, was_entry) in &was {
        let shown = crate::text::clean(path);
        match (*was_entry, now.get(path).copied()) {
            (_, None) => changes.push(format!("{shown} is gone")),
            (a, Some(b)) if a == b => {}
            (
                FileEntry::File {
                    size: s0,
                    blake3: d0,
                    ..
                },
                Some(FileEntry::File {
                    size: s1,
                    blake3: d1,
                    ..
                }),
            ) => changes.push(if s0 != s1 {
                format!("{shown} changed: {s1} bytes, the manifest recorded {s0}")
            } else {
                format!(
                    "{shown} changed: same size ({s1} bytes), different bytes (BLAKE3 {}…, recorded {}…)",
                    &d1[..d1.len().min(12)],
                    &d0[..d0.len().min(12)]
                )
            }),
            (FileEntry::Link { target: t0, .. }, Some(FileEntry::Link { target: t1, .. })) => {
                changes.push(format!(
                    "{shown} changed: a link to {}, the manifest recorded one to {}",
                    crate::text::clean(t1),
                    crate::text::clean(t0)
                ))
            }
            (a, Some(b)) => changes.push(format!(
                "{shown} changed: it is a {}, the manifest recorded a {}",
                kind(b),
                kind(a)
            )),
        }
    }
    for (path, e) in &now {
        if !was.contains_key(path) {
            changes.push(format!(
                "{} was added ({}), the manifest records no such entry",
                crate::text::clean(path),
                kind(e)
            ));
        }
    }
    let (files, bytes) = was.values().fold((0, 0), |(n, b), e| match e {
        FileEntry::File { size, .. } => (n + 1, b + *size),
        _ => (n, b),
    });
    Ok(Comparison {
        changes,
        files,
        bytes,
    })
}

fn kind(e: &FileEntry) -> &'static str {
    match e {
        FileEntry::Dir { .. } => "directory",
        FileEntry::Link { .. } => "link",
        FileEntry::File { .. } => "file",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(d: &Path) {
        std::fs::create_dir_all(d.join("lib/pkgconfig")).unwrap();
        std::fs::create_dir_all(d.join("include")).unwrap();
        std::fs::write(d.join("lib/libnccl.so.2.30.7"), vec![7u8; 3 << 20]).unwrap();
        std::os::unix::fs::symlink("libnccl.so.2.30.7", d.join("lib/libnccl.so.2")).unwrap();
        std::fs::write(d.join("include/nccl.h"), "#define NCCL_MAJOR 2\n").unwrap();
        std::fs::write(
            d.join("lib/pkgconfig/nccl.pc"),
            "prefix=/stage\nlibdir=/stage/lib\nName: nccl\n",
        )
        .unwrap();
        std::fs::write(d.join(tree::MANIFEST), "{}").unwrap();
        std::fs::write(d.join(tree::BUILD_LOG), "log").unwrap();
    }

    #[test]
    fn every_change_is_named_and_the_prefix_alone_may_move() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        build(d);
        let rec = record(d).unwrap();
        assert!(rec.iter().all(|e| !tree::RESERVED.contains(&e.path())));
        assert!(compare(d, &rec).unwrap().changes.is_empty());
        // The manifest and the log are not part of the record; the prefix is not either.
        std::fs::write(d.join(tree::BUILD_LOG), "another log").unwrap();
        tree::rewrite_pc_prefix(&d.join("lib/pkgconfig/nccl.pc"), Path::new("/p/b")).unwrap();
        let same = compare(d, &rec).unwrap();
        assert!(same.changes.is_empty(), "{:?}", same.changes);
        assert_eq!(same.files, 3);

        // One byte, same size.
        let mut bytes = vec![7u8; 3 << 20];
        bytes[(2 << 20) + 5] = 8;
        std::fs::write(d.join("lib/libnccl.so.2.30.7"), &bytes).unwrap();
        let c = compare(d, &rec).unwrap().changes;
        assert_eq!(c.len(), 1, "{c:?}");
        assert!(
            c[0].starts_with("lib/libnccl.so.2.30.7 changed: same size"),
            "{c:?}"
        );
        // Another size, a retargeted link, an added file, a gone one, a pc line.
        std::fs::write(d.join("lib/libnccl.so.2.30.7"), b"short").unwrap();
        std::fs::remove_file(d.join("lib/libnccl.so.2")).unwrap();
        std::os::unix::fs::symlink("elsewhere", d.join("lib/libnccl.so.2")).unwrap();
        std::fs::write(d.join("lib/extra.so"), b"x").unwrap();
        std::fs::remove_file(d.join("include/nccl.h")).unwrap();
        let c = compare(d, &rec).unwrap().changes.join("\n");
        for want in [
            "lib/libnccl.so.2.30.7 changed: 5 bytes",
            "lib/libnccl.so.2 changed: a link to elsewhere",
            "lib/extra.so was added",
            "include/nccl.h is gone",
        ] {
            assert!(c.contains(want), "{want}: {c}");
        }
        std::fs::write(
            d.join("lib/pkgconfig/nccl.pc"),
            "prefix=/p/b\nlibdir=/p/b/lib\nName: not nccl\n",
        )
        .unwrap();
        let c = compare(d, &rec).unwrap().changes.join("\n");
        assert!(c.contains("lib/pkgconfig/nccl.pc changed"), "{c}");
    }

    /// Every NCCL since 2.28 installs `include/nccl_device.h` beside `include/nccl_device/`
    /// (the names from the cu13 wheel's `nvidia/nccl/include/`): the walk visits the
    /// directory first, while path order puts the file first.
    fn nccl_228_headers(d: &Path) {
        let inc = d.join("include");
        for dir in ["nccl_device/gin/proxy", "nccl_device/impl"] {
            std::fs::create_dir_all(inc.join(dir)).unwrap();
        }
        for file in [
            "nccl_device.h",
            "nccl_device/gin.h",
            "nccl_device/gin/gin_device_host_common.h",
            "nccl_device/gin/proxy/gin_proxy_device_host_common.h",
            "nccl_device/impl/comm__funcs.h",
            "nccl_device/utility.h",
        ] {
            std::fs::write(inc.join(file), file).unwrap();
        }
    }

    #[test]
    fn a_file_and_a_directory_sharing_a_prefix_verify() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        build(d);
        nccl_228_headers(d);
        let rec = record(d).unwrap();
        let paths: Vec<&str> = rec.iter().map(|e| e.path()).collect();
        let mut sorted = paths.clone();
        sorted.sort();
        assert_eq!(paths, sorted, "the record is not in path order");
        let c = compare(d, &rec).unwrap();
        assert!(c.changes.is_empty(), "{:?}", c.changes);
        assert_eq!(c.files, 3 + 6);

        // A manifest written in walk order (fdl before this fix) verifies the same.
        let mut walk_order = Vec::new();
        walk(
            d,
            &mut walk_order,
            &mut vec![0u8; crate::digest::CHUNK],
            &crate::digest::FileDigests::new(),
        )
        .unwrap();
        assert_ne!(
            walk_order, rec,
            "the fixture no longer tells the orders apart"
        );
        assert!(compare(d, &walk_order).unwrap().changes.is_empty());

        // And a real change there is still seen, once.
        std::fs::remove_file(d.join("include/nccl_device.h")).unwrap();
        let c = compare(d, &rec).unwrap().changes;
        assert_eq!(c, ["include/nccl_device.h is gone"]);

        // A manifest naming one path twice is not taken at its word.
        let mut twice = rec.clone();
        twice.push(rec[0].clone());
        let c = compare(d, &twice).unwrap().changes.join("\n");
        assert!(c.contains("more than once"), "{c}");
    }

    #[test]
    fn records_read_back_as_written() {
        let t = tempfile::tempdir().unwrap();
        build(t.path());
        let rec = record(t.path()).unwrap();
        let text = serde_json::to_string(&rec).unwrap();
        assert!(text.contains(r#""kind":"link""#), "{text}");
        let back: Vec<FileEntry> = serde_json::from_str(&text).unwrap();
        assert_eq!(back, rec);
    }
}
