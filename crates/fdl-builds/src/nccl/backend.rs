//! What a backend is: something that turns a [`BuildPlan`] into an NCCL install tree in
//! a staging directory. The Docker and native backends implement it; the pipeline
//! calls it. It sits with the plan, below both, so that neither backend needs the
//! pipeline.

use crate::nccl::plan::BuildPlan;
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
}
