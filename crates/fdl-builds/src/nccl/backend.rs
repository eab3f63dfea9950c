//! What a backend is: something that turns a [`BuildPlan`] into an NCCL install tree in
//! a staging directory ([`Backend`]). The Docker and native backends implement it; the
//! pipeline calls them. It sits with the plan, below both backends, so that neither
//! backend needs the pipeline. What a backend's half of a plan says of itself is the
//! backends' own trait (`fdl_backends::PlannedBackend`), since it renders their steps.

use crate::nccl::plan::{BackendPlan, BuildPlan, DockerSource, NativeSource};
use crate::progress::Progress;
use anyhow::{bail, Result};
use std::collections::BTreeMap;
use std::path::Path;

/// Produces an NCCL install tree (lib/, include/) in `staging` as the plan says,
/// reporting its output and phases to `progress`.
pub trait Backend {
    fn build(&self, plan: &BuildPlan, staging: &Path, progress: &Progress) -> Result<()>;

    /// What identifies the toolchain this backend would build `plan` with, for the
    /// build's store key ([`crate::store::key`]): each named probe's answer (a
    /// compiler's `--version`, an image's ID). `Err` says why it is not known; the build
    /// then neither looks in the store nor adds to it. Cheap: no compile.
    fn toolchain_identity(&self, _plan: &BuildPlan) -> Result<BTreeMap<String, String>> {
        bail!("this backend names no toolchain identity")
    }

    /// Does first what the build would do first where that makes `plan`'s store key
    /// known (the native backend clones the tag, whose commit is part of the key), so
    /// the key's lock is taken before anything compiles. Nothing, for most.
    fn before_key(&self, _plan: &BuildPlan, _progress: &Progress) -> Result<()> {
        Ok(())
    }
}

impl BackendPlan {
    /// What besides the plan's common fields decides this backend's build
    /// ([`BuildPlan::identity`]): plain data of the plan, so it is answered here, below
    /// the backends that render the rest (`fdl_backends::PlannedBackend`).
    pub fn identity(&self) -> Vec<(&'static str, String)> {
        match self {
            BackendPlan::Docker(d) => {
                let mut id = vec![
                    ("image", d.image.clone()),
                    ("dockerfile", d.dockerfile.sha256().to_string()),
                ];
                if let DockerSource::Context { path, version } = &d.source {
                    id.push(("source", format!("{} (NCCL {version})", path.display())));
                }
                id
            }
            BackendPlan::Native(n) => vec![
                (
                    "toolkit",
                    format!(
                        "CUDA {} at {}",
                        n.toolkit.cuda,
                        n.toolkit.cuda_home.display()
                    ),
                ),
                (
                    "source",
                    match &n.source {
                        NativeSource::Dir { path, version } => {
                            format!("{} (NCCL {version})", path.display())
                        }
                        NativeSource::Clone { repo, .. } => repo.clone(),
                    },
                ),
            ],
        }
    }
}
