//! What an NCCL install tree must look like, checked without trusting it.
//!
//! A staged tree comes out of a build (a container's make install writes through a bind
//! mount whatever it likes, absolute symlinks included), so it is hostile until checked:
//! every entry is looked at with `symlink_metadata`, the only symlinks allowed are the
//! `lib/` chain (relative, inside `lib/`), special files and names fdl itself writes are
//! refused, and fdl's own writes into it ([`rewrite_pc_prefix`], the manifest and log in
//! `store`) never go through a link. Shared by `store` (sealing) and `verify`
//! (checking), so neither needs the other.

use crate::inspect;
use crate::nccl::plan::BuildPlan;
use crate::version::NcclVersion;
use anyhow::{anyhow, bail, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The build's manifest, which `store` writes and reads.
pub const MANIFEST: &str = "fdl-build.json";
/// The build's full output, kept in its directory.
pub const BUILD_LOG: &str = "build.log";

/// Names fdl writes into a build; a staged tree that already has them is refused, so
/// nothing a build produced can stand in for fdl's own record.
pub const RESERVED: &[&str] = &[MANIFEST, BUILD_LOG];

/// Whose tree is checked: one a build just produced, or one fdl installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Must not hold the names fdl writes: nothing a build made may pass for them.
    Staged,
    /// Holds them, as regular files.
    Installed,
}

/// Walks the whole tree without following links: directories and regular files only,
/// except symlinks in `lib/` whose target is a plain name in `lib/`. The first offending
/// entry is named.
pub fn check_entries(dir: &Path, stage: Stage) -> Result<()> {
    for name in RESERVED {
        let meta = std::fs::symlink_metadata(dir.join(name));
        match (stage, meta) {
            (Stage::Staged, Ok(_)) => bail!(
                "the build's tree already holds {name}, a name fdl writes itself: refusing to trust it"
            ),
            (Stage::Installed, Ok(m)) if !m.file_type().is_file() => {
                bail!("{name} is not a regular file")
            }
            _ => {}
        }
    }
    walk(dir)
}

fn walk(root: &Path) -> Result<()> {
    crate::fsread::walk_tree(
        root,
        &mut |e| {
            let rel = e.rel_path;
            if e.kind.is_symlink() {
                let target = std::fs::read_link(e.path)?;
                let in_lib = rel.parent() == Some(Path::new("lib"));
                let plain = target
                    .to_str()
                    .is_some_and(|t| !t.is_empty() && !t.contains('/') && t != "." && t != "..");
                if !in_lib || !plain {
                    bail!(
                        "{} is a symlink to {}: the only links a build may hold are lib/'s library chain, relative and inside lib/",
                        rel.display(),
                        target.display()
                    );
                }
            } else if !e.kind.is_dir() && !e.kind.is_file() {
                bail!(
                    "{} is a special file (FIFO, socket or device), which no NCCL build holds",
                    rel.display()
                );
            }
            Ok(true)
        },
        &|path, why| Err(why.error(path, "list")),
    )
}

/// Whether `p` is a regular file itself (not a link to one).
fn is_regular(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_file())
}

/// Facts established by [`check_tree`] about an installed NCCL tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckedTree {
    /// `libnccl.so.2.27.5`: the real file at the end of the symlink chain.
    pub library: String,
    /// NCCL_MAJOR/MINOR/PATCH from `include/nccl.h`.
    pub header_version: NcclVersion,
    /// The version in the library's self-id string.
    pub embedded_version: NcclVersion,
}

/// Checks an installed NCCL tree: the symlink chain `lib/libnccl.so → libnccl.so.2 →
/// libnccl.so.X.Y.Z` ends in a real file inside `lib/`, the static library, pkg-config
/// file and header exist, and header, file name and embedded self-id agree with each
/// other and with the tag when the tag names a release.
pub fn check_tree(dir: &Path, plan: &BuildPlan, stage: Stage) -> Result<CheckedTree> {
    check_entries(dir, stage)?;
    let lib = dir.join("lib");
    let header = parse_header_version(&dir.join("include/nccl.h"))?;
    let real = follow_chain(&lib, "libnccl.so")?;
    let expected_file = format!(
        "libnccl.so.{}.{}.{}",
        header.major, header.minor, header.patch
    );
    if real != expected_file {
        bail!("the library chain ends in lib/{real}, but nccl.h says {header}: expected lib/{expected_file}");
    }
    for required in ["libnccl_static.a", "pkgconfig/nccl.pc"] {
        let p = lib.join(required);
        if !is_regular(&p) {
            bail!("the build has no lib/{required}: NCCL's install target was incomplete");
        }
    }
    let embedded = inspect::find_nccl_self_id(&lib.join(&real))?
        .ok_or_else(|| {
            anyhow!("lib/{real} carries no NCCL self-id string: it is not an NCCL library")
        })?
        .nccl;
    let same = |a: &NcclVersion, b: &NcclVersion| a.same_release(b);
    if !same(&embedded, &header) {
        bail!("lib/{real} identifies as NCCL {embedded} but nccl.h says {header}");
    }
    if let Some(want) = &plan.nccl_version {
        if !same(want, &header) {
            bail!(
                "tag {} asks for NCCL {want}, but the build produced NCCL {header}",
                plan.tag
            );
        }
    }
    Ok(CheckedTree {
        library: real,
        header_version: header,
        embedded_version: embedded,
    })
}

/// Follows symlinks from `lib/<start>` within `lib/` to a regular file; returns its name.
fn follow_chain(lib: &Path, start: &str) -> Result<String> {
    let mut name = start.to_string();
    for _ in 0..8 {
        let p = lib.join(&name);
        let meta =
            std::fs::symlink_metadata(&p).map_err(|_| anyhow!("the build has no lib/{name}"))?;
        if meta.file_type().is_file() {
            return Ok(name);
        }
        if !meta.file_type().is_symlink() {
            bail!("lib/{name} is neither a file nor a symlink");
        }
        let target = std::fs::read_link(&p)?;
        let next = target.to_str().unwrap_or("");
        if next.is_empty() || next.contains('/') || next == "." || next == ".." {
            bail!(
                "lib/{name} points to '{}', outside lib/: the build would break once moved",
                target.display()
            );
        }
        name = next.to_string();
    }
    bail!("lib/{start} is a symlink loop")
}

/// Reads `#define NCCL_MAJOR 2` etc. from `nccl.h`.
pub fn parse_header_version(path: &Path) -> Result<NcclVersion> {
    // NCCL's header is tens of KiB.
    let text = crate::fsread::read_text_if_present(path, 4 << 20)?
        .ok_or_else(|| anyhow!("the build has no include/nccl.h"))?;
    let get = |key: &str| -> Result<u32> {
        text.lines()
            .filter_map(|l| l.trim().strip_prefix("#define"))
            .filter_map(|l| l.trim().strip_prefix(key))
            .filter(|rest| rest.starts_with(char::is_whitespace))
            .find_map(|rest| rest.trim().parse().ok())
            .ok_or_else(|| anyhow!("include/nccl.h does not define {key}"))
    };
    Ok(NcclVersion::new(
        get("NCCL_MAJOR")?,
        get("NCCL_MINOR")?,
        get("NCCL_PATCH")?,
    ))
}

/// NCCL writes its install prefix (e.g. /usr/local/nccl) into `nccl.pc`; point it at
/// the build's final directory so `pkg-config` works on the host.
pub fn rewrite_pc_prefix(pc: &Path, prefix: &Path) -> Result<()> {
    if !is_regular(pc) {
        bail!("{} is not a regular file", pc.display());
    }
    let text = crate::fsread::read_text(pc, PC_MAX_BYTES)?;
    let out = pc_with_prefix(&text, &prefix.display().to_string())
        .ok_or_else(|| anyhow!("{} has no prefix= line", pc.display()))?;
    crate::fswrite::replace_file(pc, out.as_bytes())
}

/// A pkg-config file is a few hundred bytes; more is not one.
pub const PC_MAX_BYTES: u64 = 1 << 20;

/// `nccl.pc`'s text with its prefix (the `prefix=` line, and variable lines that spell
/// the old prefix out) set to `new`; `None` when it has no `prefix=` line. Rewriting
/// twice is rewriting once with the last prefix, which is what lets a manifest record
/// the file with a placeholder prefix ([`crate::nccl::files`]).
pub fn pc_with_prefix(text: &str, new: &str) -> Option<String> {
    let old = text
        .lines()
        .find_map(|l| l.strip_prefix("prefix="))
        .map(str::trim)?
        .to_string();
    let mut out = String::with_capacity(text.len() + new.len());
    for line in text.lines() {
        if line.starts_with("prefix=") {
            out.push_str(&format!("prefix={new}"));
        } else if !old.is_empty() && line.contains('=') && !line.contains(':') {
            // Variable lines that spelled the old prefix out instead of ${prefix}.
            out.push_str(&line.replace(&old, new));
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    Some(out)
}

/// The digest of an NCCL source tree's content: each file's bytes and each link's
/// target by relative path, directories by name; the top-level `.git` and `build/` (an
/// earlier in-tree build, which an out-of-tree build never reads) are left out, as the
/// Docker build context leaves them out. Links are never followed.
pub fn tree_digest(dir: &Path) -> Result<String> {
    let leave = crate::digest::Leave {
        top: &[".git", "build"],
        files: &[],
    };
    crate::digest::tree(
        dir,
        crate::digest::Hash::Sha256,
        leave,
        "an NCCL source tree",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pc_prefix_is_rewritten() {
        let t = tempfile::tempdir().unwrap();
        let pc = t.path().join("nccl.pc");
        std::fs::write(
            &pc,
            "prefix=/usr/local/nccl\nexec_prefix=${prefix}\nlibdir=/usr/local/nccl/lib\n\nName: nccl\nLibs: -L${libdir} -lnccl\n",
        )
        .unwrap();
        rewrite_pc_prefix(&pc, Path::new("/p/builds/v2")).unwrap();
        let text = std::fs::read_to_string(&pc).unwrap();
        assert!(
            text.starts_with(
                "prefix=/p/builds/v2\nexec_prefix=${prefix}\nlibdir=/p/builds/v2/lib\n"
            ),
            "{text}"
        );
        assert!(!text.contains("/usr/local/nccl"));
    }

    #[test]
    fn header_version() {
        let t = tempfile::tempdir().unwrap();
        let h = t.path().join("nccl.h");
        std::fs::write(&h, "#define NCCL_MAJOR 2\n#define NCCL_MINOR 27\n#define NCCL_PATCH 5\n#define NCCL_SUFFIX \"\"\n").unwrap();
        assert_eq!(
            parse_header_version(&h).unwrap(),
            NcclVersion::new(2, 27, 5)
        );
        std::fs::write(&h, "#define NCCL_MAJOR 2\n").unwrap();
        assert!(parse_header_version(&h)
            .unwrap_err()
            .to_string()
            .contains("NCCL_MINOR"));
    }

    fn tree_with(extra: impl FnOnce(&Path)) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("lib/pkgconfig")).unwrap();
        std::fs::create_dir_all(t.path().join("include")).unwrap();
        std::fs::write(t.path().join("lib/libnccl.so.2.27.5"), "elf").unwrap();
        std::os::unix::fs::symlink("libnccl.so.2.27.5", t.path().join("lib/libnccl.so.2")).unwrap();
        std::os::unix::fs::symlink("libnccl.so.2", t.path().join("lib/libnccl.so")).unwrap();
        extra(t.path());
        t
    }

    #[test]
    fn the_lib_chain_is_the_only_link_allowed() {
        assert!(check_entries(tree_with(|_| {}).path(), Stage::Staged).is_ok());
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        type Plant<'a> = Box<dyn Fn(&Path) + 'a>;
        let cases: Vec<(Plant, &str)> = vec![
            (
                Box::new(|d: &Path| {
                    std::os::unix::fs::symlink(&victim, d.join("lib/pkgconfig/nccl.pc")).unwrap()
                }),
                "lib/pkgconfig/nccl.pc is a symlink",
            ),
            (
                Box::new(|d: &Path| {
                    std::os::unix::fs::symlink(&victim, d.join("lib/libx.so")).unwrap()
                }),
                "lib/libx.so is a symlink",
            ),
            (
                Box::new(|d: &Path| {
                    std::os::unix::fs::symlink("../include", d.join("lib/inc")).unwrap()
                }),
                "lib/inc is a symlink",
            ),
            (
                Box::new(|d: &Path| {
                    std::os::unix::fs::symlink(&victim, d.join("build.log")).unwrap()
                }),
                "build.log, a name fdl writes",
            ),
            (
                Box::new(|d: &Path| std::fs::write(d.join("fdl-build.json"), "{}").unwrap()),
                "fdl-build.json, a name fdl writes",
            ),
            (
                Box::new(|d: &Path| {
                    nix_mkfifo(&d.join("include/pipe"));
                }),
                "include/pipe is a special file",
            ),
        ];
        for (plant, needle) in cases {
            let t = tree_with(|d| plant(d));
            let e = check_entries(t.path(), Stage::Staged)
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{needle}: {e}");
        }
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        // An installed build holds fdl's own files, as regular files only.
        let t = tree_with(|d| std::fs::write(d.join("build.log"), "log").unwrap());
        assert!(check_entries(t.path(), Stage::Installed).is_ok());
        let t = tree_with(|d| std::os::unix::fs::symlink(&victim, d.join("build.log")).unwrap());
        assert!(check_entries(t.path(), Stage::Installed).is_err());
    }

    fn nix_mkfifo(p: &Path) {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    /// A linked nccl.pc is refused, and its target is left alone.
    #[test]
    fn pc_rewrite_never_writes_through_a_link() {
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim.pc");
        std::fs::write(&victim, "prefix=/usr/local/nccl\n").unwrap();
        let t = tempfile::tempdir().unwrap();
        let pc = t.path().join("nccl.pc");
        std::os::unix::fs::symlink(&victim, &pc).unwrap();
        assert!(rewrite_pc_prefix(&pc, Path::new("/p/b")).is_err());
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "prefix=/usr/local/nccl\n"
        );
    }
}
