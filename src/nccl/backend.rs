//! What a backend is: something that turns a [`BuildPlan`] into an NCCL install tree in
//! a staging directory ([`Backend`]), and what its half of a plan says of itself
//! ([`PlannedBackend`]). The Docker and native backends implement both; the pipeline
//! calls them. They sit with the plan, below both backends, so that neither backend
//! needs the pipeline, and the pipeline asks a plan's backend instead of matching on
//! which one it is.

use crate::nccl::plan::{BackendPlan, BuildPlan};
use crate::progress::Progress;
use crate::step::Step;
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
}

/// A backend's half of a plan ([`crate::nccl::plan::DockerPlan`],
/// [`crate::nccl::plan::NativePlan`]), as the rest of fdl asks about it: pure, from the
/// plan alone, nothing run. `plan` is the whole plan this half belongs to.
pub trait PlannedBackend {
    /// The steps a run executes, with placeholders for the private paths a run makes
    /// (`<staging>`): the same values a run executes.
    fn steps(&self, plan: &BuildPlan) -> Vec<Step>;

    /// The rows the whole plan shows for this backend, below its `backend` row, as
    /// (key, value).
    fn rows(&self, plan: &BuildPlan) -> Vec<(&'static str, String)>;

    /// What besides the plan's common fields decides this backend's build
    /// ([`BuildPlan::identity`]).
    fn identity(&self) -> Vec<(&'static str, String)>;

    /// The variables the build receives as they decide its bytes (the store key's
    /// `make_vars`): the make variables, or a Docker toolchain image's build arguments.
    fn build_vars(&self) -> &[(String, String)];

    /// Whether this toolchain compiles every arch of `plan`, where that is known.
    fn compiles_archs(&self, plan: &BuildPlan) -> Option<bool>;

    /// fdl's clone of the tag that the build reads, as (repository, directory in fdl's
    /// cache), where its source is one; `None` for a `--source` tree.
    fn source_clone(&self, plan: &BuildPlan) -> Option<(String, std::path::PathBuf)>;

    /// A file the steps run that the full plan shows after them: (its path, its text).
    fn script(&self) -> Option<(&'static str, &'static str)> {
        None
    }
}

impl BackendPlan {
    /// This plan's backend half, to ask instead of matching on the variant.
    pub fn planned(&self) -> &dyn PlannedBackend {
        match self {
            BackendPlan::Docker(d) => d,
            BackendPlan::Native(n) => n,
        }
    }
}
