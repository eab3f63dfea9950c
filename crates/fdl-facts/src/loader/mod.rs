//! Which NCCL a process really runs: a model of glibc's dynamic loader, without loading
//! anything.
//!
//! glibc decides, not any one file: the preloads (`LD_PRELOAD` split at spaces and colons,
//! then `/etc/ld.so.preload`), the breadth-first DT_NEEDED closure with each name searched
//! for the object that needs it ([`search`]), duplicates by name, soname and inode, and
//! symbol binding: a call goes to the first object of the global scope that exports the
//! name, unless the caller binds it locally ([`crate::inspect::interpose`]). [`map`] lays
//! out the link map; [`bind`] follows the `nccl*` calls to the object that answers them
//! and reads that object's self-id. What the model cannot know (a dependency that cannot be
//! found before the answer, `dlopen`, a loader rule it does not model) makes the answer
//! [`Answer::Unknown`] with the reason, never a guess. The search paths, hwcaps
//! subdirectories and system directories come from the machine's own `ld.so --help`.

pub mod bind;
pub mod map;
pub mod pin;
pub mod plugins;
pub mod preload;
pub mod procmaps;
pub mod python;
pub mod pywitness;
pub mod reason;
pub mod running;
pub mod search;
pub mod split;
pub mod witness;

pub use bind::{
    which_nccl, which_nccl_as, which_nccl_knowing, Answer, Bound, CallGroup, Conditional, Which,
};
pub use map::{FoundBy, LinkMap, LoadFailure, Object, SkippedPreload, TargetKind};
pub use search::LoaderEnv;

use crate::inspect::NcclDetection;
use crate::version::NcclVersion;
use std::path::{Path, PathBuf};

/// The NCCL a library brings by itself (no preload): what `libtorch add` records, what a
/// build's tag is inferred from, and what `nccl env` matches builds against. One answer
/// for all three, from [`which_nccl`].
#[derive(Debug, Clone)]
pub enum Bundled {
    Nccl(NcclDetection),
    /// `libnccl` is not installed, but the distribution's metadata pins this one.
    Pinned(pin::Pin),
    /// Unknown, but the calls reach this NCCL if what is unknown defines no `nccl*`
    /// ([`Conditional`]); `reason` is the unknown answer's. Usable as an answer only when
    /// [`Conditional::only_missing`], and then always said with its condition.
    Conditional {
        conditional: Box<Conditional>,
        reason: String,
    },
    None(String),
    Unknown(String),
}

impl Bundled {
    /// The version to act on: a conditional one only when its one doubt is libraries
    /// missing on this host.
    pub fn version(&self) -> Option<&NcclVersion> {
        match self {
            Bundled::Nccl(d) => Some(&d.version),
            Bundled::Pinned(p) => Some(&p.version),
            Bundled::Conditional { conditional, .. } if conditional.only_missing => {
                Some(&conditional.detection.version)
            }
            Bundled::Conditional { .. } | Bundled::None(_) | Bundled::Unknown(_) => None,
        }
    }
}

/// [`which_nccl`] for a process that links `lib`, in this environment without preloads.
pub fn bundled_nccl(lib: &Path) -> anyhow::Result<Bundled> {
    bundled_nccl_in(lib, &LoaderEnv::bundled())
}

/// [`bundled_nccl_in`] for the process that runs `lib`: a Python process importing the pip
/// torch `pip_torch` (its own `sys.path` only: [`python::Launch::bundled`]), else a program
/// linking `lib`.
pub fn bundled_nccl_for(
    lib: &Path,
    pip_torch: Option<&Path>,
    env: &LoaderEnv,
) -> anyhow::Result<Bundled> {
    let Some(torch) = pip_torch else {
        return bundled_nccl_in(lib, env);
    };
    match python::PythonProcess::model(torch, python::Launch::bundled(), env)? {
        Some(p) => {
            if let Some(why) = p.unknown_reason() {
                return Ok(Bundled::Unknown(why));
            }
            bundled_nccl_in(
                &torch.join("lib").join("libtorch_cuda.so"),
                &p.loader_env(env),
            )
        }
        None => bundled_nccl_in(lib, env),
    }
}

/// [`bundled_nccl`] in `env` (its preloads are ignored).
pub fn bundled_nccl_in(lib: &Path, env: &LoaderEnv) -> anyhow::Result<Bundled> {
    let mut env = env.clone();
    env.preload.clear();
    env.ld_so_preload.clear();
    let w = which_nccl_as(lib, &env, None, TargetKind::Library)?;
    Ok(match w.answer {
        Answer::Nccl { detection } => Bundled::Nccl(detection),
        Answer::None { reason } => Bundled::None(reason),
        Answer::Unknown { .. } | Answer::Split { .. } => {
            let reason = w.answer.reason().unwrap_or_default();
            match (w.conditional, w.pin) {
                (Some(c), _) => Bundled::Conditional {
                    conditional: Box::new(c),
                    reason,
                },
                (None, Some(p)) => Bundled::Pinned(p),
                (None, None) => Bundled::Unknown(reason),
            }
        }
    })
}

/// [`which_nccl`] for a process linking the first of `files`, written into `dir` under
/// their names, in a closed environment: `LD_LIBRARY_PATH` is `dir` and nothing else is
/// searched (no preloads, no `ld.so.cache`, no system directories, no hwcaps, and the
/// stand-in program needs nothing besides the library, not even libc). The loader model's entry for bytes from anywhere: the `loader_map` fuzz target and the
/// replay of its seeds feed it arbitrary files. Names must be plain file names.
#[doc(hidden)]
pub fn which_nccl_in_dir(dir: &Path, files: &[(&str, &[u8])]) -> anyhow::Result<Which> {
    let Some((first, _)) = files.first() else {
        anyhow::bail!("no files to lay out");
    };
    for (name, bytes) in files {
        if name.is_empty() || name.contains('/') || *name == "." || *name == ".." {
            anyhow::bail!("'{name}' is not a plain file name");
        }
        std::fs::write(dir.join(name), bytes)?;
    }
    let env = LoaderEnv {
        ld_library_path: vec![dir.to_path_buf()],
        cwd: dir.to_path_buf(),
        system_dirs_from: "none (a closed environment)".into(),
        ..LoaderEnv::default()
    };
    which_nccl(&PathBuf::from(dir).join(first), &env)
}
