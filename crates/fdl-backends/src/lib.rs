//! fdl's floor 3, the build backends: `docker` and `native` each turn a plan into an
//! install tree in staging.

pub mod docker;
pub mod native;

// The floors below, under the names the modules have always used (`crate::nccl`).
use fdl_base::{
    arch, cache, context, digest, fsread, fswrite, lock, process, progress, step, text, txn,
    version,
};
use fdl_builds::nccl;
use fdl_facts::project;

use fdl_base::step::Step;
use fdl_builds::nccl::plan::{BackendPlan, BuildPlan};

/// A backend's half of a plan ([`nccl::plan::DockerPlan`],
/// [`nccl::plan::NativePlan`]), as the rest of fdl asks about it: pure, from the
/// plan alone, nothing run. `plan` is the whole plan this half belongs to.
pub trait PlannedBackend {
    /// The steps a run executes, with placeholders for the private paths a run makes
    /// (`<staging>`): the same values a run executes.
    fn steps(&self, plan: &BuildPlan) -> Vec<Step>;

    /// The rows the whole plan shows for this backend, below its `backend` row, as
    /// (key, value).
    fn rows(&self, plan: &BuildPlan) -> Vec<(&'static str, String)>;

    /// The variables the build receives as they decide its bytes (the store key's
    /// `make_vars`): the make variables, or a Docker toolchain image's build arguments.
    fn build_vars(&self) -> &[(String, String)];

    /// Whether this toolchain compiles every arch of `plan`, where that is known.
    fn compiles_archs(&self, plan: &BuildPlan) -> Option<bool>;

    /// fdl's clone of the tag that the build reads, as (repository, directory in fdl's
    /// cache), where its source is one; `None` for a `--source` tree.
    fn source_clone(
        &self,
        plan: &BuildPlan,
        cache: Option<&std::path::Path>,
    ) -> Option<(String, std::path::PathBuf)>;

    /// What names the plan's NCCL source in its store key: the content digest of a
    /// source tree, the commit of the tag in fdl's clone, or the tag the image clones.
    /// The text is part of every key already made, so it stays byte for byte. `Err` says
    /// why it is not known yet (the tag is not cloned before the first build).
    fn source_identity(&self, plan: &BuildPlan) -> Result<String, String>;

    /// When a store key that cannot be known now may become known.
    fn key_later(&self) -> KeyLater;

    /// A file the steps run that the full plan shows after them: (its path, its text).
    fn script(&self) -> Option<(&'static str, &'static str)> {
        None
    }
}

/// When a plan's store key, not known when the plan is made, may become known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyLater {
    /// Once the build has cloned the tag (its commit is part of the key).
    AfterClone,
    /// Once the build has made what names it (the Docker toolchain's image).
    AfterBuild,
    /// Nothing the build does changes that.
    Never,
}

/// A plan's backend half, to ask instead of matching on the variant. Its implementations
/// are each backend's (`docker::planned`, `native::planned`), beside the steps they
/// render; the floors above reach them through this.
pub trait Planned {
    fn planned(&self) -> &dyn PlannedBackend;
}

impl Planned for BackendPlan {
    fn planned(&self) -> &dyn PlannedBackend {
        match self {
            BackendPlan::Docker(d) => d,
            BackendPlan::Native(n) => n,
        }
    }
}
