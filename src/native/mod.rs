//! The native backend: builds NCCL with the host's CUDA toolkit, no Docker needed.
//!
//! Discovery (which tools exist) is kept apart from building. The source is either the
//! user's tree (`--source`, never modified) or a clone of the tag cached in the user's
//! cache directory; the build runs out of tree (NCCL's `BUILDDIR`) and installs with
//! NCCL's own `install` target (`PREFIX`) into the staging directory.

use crate::nccl::build::Backend;
use crate::nccl::plan::{BuildPlan, NativeSource, Toolkit};
use crate::nccl::tag::Tag;
use crate::progress::Progress;
use anyhow::{bail, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// NCCL's public repository, cloned when no `--source` is given.
pub const NCCL_REPO: &str = "https://github.com/NVIDIA/nccl.git";

/// What the host offers for a native build, and what it lacks.
#[derive(Debug, Clone, Default)]
pub struct ToolchainReport {
    pub toolkit: Option<Toolkit>,
    /// make, c++, python3, git: each found one.
    pub tools: BTreeMap<String, PathBuf>,
    /// One entry per missing tool, saying what to install or set.
    pub missing: Vec<String>,
}

impl ToolchainReport {
    pub fn is_complete(&self) -> bool {
        self.toolkit.is_some() && self.missing.is_empty()
    }
}

/// Looks for nvcc (`--cuda-home`, else `$CUDA_HOME`, else PATH), make, a C++ compiler,
/// python3 and, when `need_git`, git.
pub fn discover(_cuda_home: Option<&Path>, _need_git: bool) -> ToolchainReport {
    ToolchainReport {
        missing: vec!["native backend: not implemented yet".into()],
        ..Default::default()
    }
}

/// The source for `tag`: `source_dir` checked to be an NCCL tree of the tag's version,
/// or a clone in `cache_root`.
pub fn source_for(
    _source_dir: Option<&Path>,
    _tag: &Tag,
    _cache_root: &Path,
) -> Result<NativeSource> {
    bail!("native backend: not implemented yet")
}

/// The make command lines a native build runs: `src.build` then `install`, with the
/// plan's make variables, the out-of-tree `BUILDDIR` and `PREFIX` set to `staging`.
pub fn make_commands(
    _plan: &BuildPlan,
    _source: &Path,
    _build_dir: &Path,
    _staging: &Path,
) -> Vec<Vec<String>> {
    Vec::new()
}

pub struct NativeBackend;

impl Backend for NativeBackend {
    fn build(&self, _plan: &BuildPlan, _staging: &Path, _progress: &Progress) -> Result<()> {
        bail!("native backend: not implemented yet")
    }
}
