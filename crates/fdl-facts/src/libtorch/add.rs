//! `fdl libtorch add NAME PATH`: registers a libtorch that already exists on disk (an
//! unpacked libtorch archive, or a pip torch's `torch/` directory) as
//! `precompiled/NAME`, without copying it.
//!
//! The variant is a directory of symlinks to PATH's entries plus an `.arch` of our own,
//! written from the binaries — so nothing is written into the user's torch install. It is
//! assembled in a [`Transaction`] and renamed into place, so a failure leaves nothing.

use crate::arch::Arch;
use crate::inspect::{self, Linkage};
use crate::libtorch::{Libtorch, Variant};
use crate::loader::{self, Bundled};
use crate::txn::Transaction;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::Path;

/// What `.arch` will say, in the order it is written.
pub type ArchFile = Vec<(&'static str, String)>;

/// Registers `path` as `precompiled/<name>` and returns the variant and its `.arch`.
pub fn add(
    ctx: &crate::context::Context,
    lt: &Libtorch,
    name: &str,
    path: &Path,
) -> Result<(Variant, ArchFile)> {
    check_name(name)?;
    let source = path.canonicalize().with_context(|| {
        format!(
            "cannot open {}: give the directory of an unpacked libtorch or a pip torch",
            path.display()
        )
    })?;
    if !source.is_dir() {
        bail!(
            "{} is not a directory: give the directory that holds lib/libtorch_cuda.so",
            source.display()
        );
    }
    let lib = source.join("lib").join("libtorch_cuda.so");
    if !lib.is_file() && source.join("libtorch_cuda.so").is_file() {
        // `…/torch/lib` itself: the variant is its parent, which holds lib/.
        let parent = source.parent().unwrap_or(&source);
        bail!(
            "{} holds libtorch_cuda.so itself: it is the libtorch's lib/ directory, and fdl wants the directory above it. Run:\n  fdl libtorch add {} {}",
            source.display(),
            crate::paste::shell(name),
            crate::paste::shell(&parent.to_string_lossy())
        );
    }
    if !lib.is_file() {
        bail!(
            "{} has no lib/libtorch_cuda.so: give an unpacked libtorch archive (the directory holding lib/ and include/) or a pip torch's torch/ directory (site-packages/torch)",
            source.display()
        );
    }
    let target = lt.dir.join("precompiled").join(name);
    if std::fs::symlink_metadata(&target).is_ok() {
        bail!(
            "{} already exists: pick another name, or remove that variant first",
            target.display()
        );
    }
    let arch = describe(&source, &lib)?;

    let parent = lt.dir.join("precompiled");
    // One add of a name at a time; a killed one's staging directory is ours to remove.
    let _lock = crate::libtorch::lock_variant(ctx, &parent, name)?;
    let prefix = format!("{ADDING_PREFIX}{name}-");
    if let Ok(rd) = std::fs::read_dir(&parent) {
        for e in rd.flatten() {
            let leftover = e
                .file_name()
                .to_string_lossy()
                .strip_prefix(&prefix)
                .is_some_and(|rest| !rest.contains('-'));
            if leftover {
                if let Some(what) = crate::txn::restore_or_remove(&e.path(), &target) {
                    ctx.say(&what);
                }
            }
        }
    }
    let registered = (|| -> Result<()> {
        let txn = Transaction::begin(ctx, target.clone(), &prefix, "variant")?;
        for entry in std::fs::read_dir(&source)? {
            let entry = entry?;
            let file_name = entry.file_name();
            if file_name == ".arch" {
                continue;
            }
            std::os::unix::fs::symlink(entry.path(), txn.path().join(&file_name))?;
        }
        let text: String = arch.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
        crate::fswrite::create_new(&txn.path().join(".arch"), &mut text.as_bytes())?;
        txn.commit()
    })();
    match registered {
        Ok(()) => Ok((
            Variant {
                name: format!("precompiled/{name}"),
                dir: target,
            },
            arch,
        )),
        Err(e) => Err(e.context(format!(
            "cannot register {} as precompiled/{name}",
            source.display()
        ))),
    }
}

/// Prefix of a variant being assembled.
const ADDING_PREFIX: &str = ".adding-";

fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !ok {
        bail!("'{name}' is not a variant name: use letters, digits, '.', '_' and '-', e.g. cu128 or torch-2.8-pip");
    }
    Ok(())
}

/// `.arch` from the files themselves: the torch version (pip's `version.py` or the
/// archive's `build-version`), CUDA (the version's `+cuXYZ`, else the major version of
/// the libcudart it needs), SASS/PTX archs and NCCL with its linkage.
pub fn describe(source: &Path, lib: &Path) -> Result<ArchFile> {
    describe_in(source, lib, &loader::LoaderEnv::bundled())
}

/// [`describe`] with the loader environment given (tests describe a partial install
/// completed by stubs on `LD_LIBRARY_PATH`).
pub fn describe_in(source: &Path, lib: &Path, env: &loader::LoaderEnv) -> Result<ArchFile> {
    let ins = inspect::inspect(lib)?;
    // The same answer as `fdl nccl detect` without a preload: found, pinned by the wheel's
    // metadata, or none.
    // For the process that runs it: a pip torch is imported by Python, whose torch may
    // open an NCCL itself before libtorch_cuda.so.
    let pip = crate::libtorch::is_pip_torch(source).then_some(source);
    let bundled = loader::bundled_nccl_for(lib, pip, env)?;
    // A conditional answer whose one doubt is libraries missing on this host is recorded
    // as the version, with its condition beside it; any other is unknown.
    let nccl = match &bundled {
        Bundled::Nccl(d) => Some(d.clone()),
        Bundled::Conditional { conditional, .. } if conditional.only_missing => {
            Some(conditional.detection.clone())
        }
        _ => None,
    };
    let torch = torch_version(source)?;
    // Torch's own CUDA, never its NCCL's (a pip NCCL is built with a CUDA of its own:
    // torch 2.8.0+cu128 brings an NCCL of CUDA 12.9). Without the local version, the
    // libcudart it links gives the major version, and nothing is guessed past it.
    let cuda = torch
        .as_deref()
        .and_then(cuda_from_local_version)
        .or_else(|| {
            ins.needed.iter().find_map(|n| {
                n.strip_prefix("libcudart.so.")
                    .map(|major| major.to_string())
            })
        });
    let caps = |entries: &[inspect::CodeEntry]| -> String {
        let mut archs: Vec<Arch> = entries.iter().map(|e| e.target.arch).collect();
        archs.sort();
        archs.dedup();
        archs
            .iter()
            .map(|a| a.capability())
            .collect::<Vec<_>>()
            .join(";")
    };
    // A split build's bridge (torch ≤ 1.13) holds no GPU code: its archs are those every
    // library of its directory that it loads has code for (what the package runs on).
    let (sass, ptx) = match loader::split::follow(&ins, env).filter(|f| f.found()) {
        Some(f) => {
            let every = |pick: fn(&inspect::GpuCode) -> &[inspect::CodeEntry]| {
                let mut lists = f.libraries.iter().map(|l| caps(pick(&l.gpu_code)));
                let first = lists.next().unwrap_or_default();
                let mut keep: Vec<String> = first.split(';').map(str::to_string).collect();
                for other in lists {
                    let other: Vec<&str> = other.split(';').collect();
                    keep.retain(|a| other.contains(&a.as_str()));
                }
                keep.retain(|a| !a.is_empty());
                keep.join(";")
            };
            (every(|c| &c.sass), every(|c| &c.ptx))
        }
        None => (caps(&ins.gpu_code.sass), caps(&ins.gpu_code.ptx)),
    };
    let mut out: ArchFile = vec![
        ("torch", torch.unwrap_or_else(|| "unknown".into())),
        ("cuda", cuda.unwrap_or_else(|| "unknown".into())),
        ("archs", sass),
        ("ptx", ptx),
    ];
    match (&nccl, &bundled) {
        (Some(n), _) => {
            out.push(("nccl", n.version.to_string()));
            out.push((
                "nccl_linkage",
                match &n.linkage {
                    Linkage::Static => "static".to_string(),
                    Linkage::Dynamic { .. } | Linkage::Opened { .. } => "dynamic".to_string(),
                    Linkage::Preload { .. } => "preload".to_string(),
                },
            ));
            if let Linkage::Dynamic { .. } = n.linkage {
                out.push(("nccl_library", n.file.display().to_string()));
            }
            if let Bundled::Conditional { conditional, .. } = &bundled {
                out.push(("nccl_condition", conditional.condition()));
                if let Some(note) = conditional.pin_note() {
                    out.push(("nccl_pin", note));
                }
            }
        }
        (None, Bundled::Pinned(p)) => {
            out.push(("nccl", p.version.to_string()));
            out.push((
                "nccl_linkage",
                format!("pinned by {}, not installed", p.distribution),
            ));
        }
        (None, Bundled::Unknown(why) | Bundled::Conditional { reason: why, .. }) => {
            out.push(("nccl", "unknown".into()));
            out.push(("nccl_unknown", why.clone()));
        }
        (None, _) => out.push(("nccl", "none".into())),
    }
    out.push(("source", source.display().to_string()));
    // A pip torch is run by Python: its NCCL above is that process's.
    if let Some(i) = pip.and_then(loader::python::Interpreter::of_torch) {
        out.push(("process", "python".into()));
        out.push(("python", i.program.display().to_string()));
    }
    // What was read, as it was: `libtorch list` says when a file changed since.
    if let Some(f) = crate::libtorch::fingerprint(lib) {
        out.push(("libtorch_cuda_stat", f));
    }
    if let Some(n) = nccl
        .as_ref()
        .filter(|n| matches!(n.linkage, Linkage::Dynamic { .. }))
    {
        if let Some(f) = crate::libtorch::fingerprint(&n.file) {
            out.push(("nccl_library_stat", f));
        }
    }
    Ok(out)
}

/// `2.8.0+cu128` from `version.py` (pip) or `build-version` (libtorch archive).
fn torch_version(source: &Path) -> Result<Option<String>> {
    // torch's version.py is a few lines; build-version one. Missing is fine; a FIFO, a
    // device or a huge file there is an error.
    if let Some(text) =
        crate::fsread::read_text_following_if_present(&source.join("version.py"), 64 << 10)?
    {
        let kv: BTreeMap<&str, &str> = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().split(':').next().unwrap_or("").trim(), v.trim()))
            .collect();
        if let Some(v) = kv.get("__version__") {
            return Ok(Some(v.trim_matches(['\'', '"']).to_string()));
        }
    }
    let text =
        crate::fsread::read_text_following_if_present(&source.join("build-version"), 4 << 10)?;
    Ok(text.map(|t| t.trim().to_string()).filter(|s| !s.is_empty()))
}

/// `+cu128` → `12.8`, `+cu118` → `11.8`.
fn cuda_from_local_version(v: &str) -> Option<String> {
    let local = v.split_once('+')?.1;
    let digits = local.strip_prefix("cu")?;
    if digits.len() < 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (major, minor) = digits.split_at(digits.len() - 1);
    Some(format!("{major}.{minor}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_from_torch_local_versions() {
        assert_eq!(
            cuda_from_local_version("2.8.0+cu128").as_deref(),
            Some("12.8")
        );
        assert_eq!(
            cuda_from_local_version("2.1.0+cu118").as_deref(),
            Some("11.8")
        );
        assert_eq!(
            cuda_from_local_version("2.9.0+cu130").as_deref(),
            Some("13.0")
        );
        assert_eq!(cuda_from_local_version("2.8.0+cpu"), None);
        assert_eq!(cuda_from_local_version("2.8.0"), None);
    }

    #[test]
    fn names_are_plain() {
        for bad in ["", ".x", "-x", "a/b", "../x", "a b"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        assert!(check_name("torch-2.8_pip.cu128").is_ok());
    }
}
