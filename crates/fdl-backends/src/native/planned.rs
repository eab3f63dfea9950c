//! The native backend's half of a plan as the pipeline and the rendering ask about it
//! ([`PlannedBackend`]): its steps with placeholders, its rows in the whole plan, what
//! of it decides the build.

use super::NativeSteps;
use crate::nccl::plan::{BuildPlan, NativePlan, NativeSource};
use crate::step::{Paths, Step};
use crate::PlannedBackend;

impl PlannedBackend for NativePlan {
    fn steps(&self, plan: &BuildPlan) -> Vec<Step> {
        let mut paths = Paths::placeholders(NativeSteps::PATHS);
        // The toolkit is known now; only its plain alias, if it needs one, is not.
        paths.entries.retain(|(k, _)| *k != "cuda-home");
        paths
            .entries
            .push(("cuda-home", self.toolkit.cuda_home.clone()));
        NativeSteps::new(self, plan.jobs, &paths)
            .all()
            .into_iter()
            .cloned()
            .collect()
    }

    fn rows(&self, plan: &BuildPlan) -> Vec<(&'static str, String)> {
        vec![
            (
                "toolkit",
                format!(
                    "CUDA {} at {}",
                    self.toolkit.cuda,
                    self.toolkit.cuda_home.display()
                ),
            ),
            ("nvcc", self.toolkit.nvcc.display().to_string()),
            (
                "source",
                match &self.source {
                    NativeSource::Dir { path, version } => {
                        format!("{} (NCCL {version})", path.display())
                    }
                    // Said as it is now: a dry run before the first build clones nothing.
                    NativeSource::Clone { repo, cache_dir } if cache_dir.is_dir() => format!(
                        "{repo} at {} (already cloned in {}: reused)",
                        plan.tag,
                        cache_dir.display()
                    ),
                    NativeSource::Clone { repo, cache_dir } => format!(
                        "{repo} at {} (to be cloned into {}, then reused)",
                        plan.tag,
                        cache_dir.display()
                    ),
                },
            ),
        ]
    }

    fn build_vars(&self) -> &[(String, String)] {
        &self.make_vars
    }

    fn source_clone(
        &self,
        _plan: &BuildPlan,
        _cache: Option<&std::path::Path>,
    ) -> Option<(String, std::path::PathBuf)> {
        match &self.source {
            NativeSource::Clone { repo, cache_dir } => Some((repo.clone(), cache_dir.clone())),
            NativeSource::Dir { .. } => None,
        }
    }

    /// By the toolkit's own `nvcc --list-gpu-arch`, where it answers.
    fn compiles_archs(&self, plan: &BuildPlan) -> Option<bool> {
        self.toolkit
            .gpu_archs
            .as_ref()
            .map(|offered| plan.archs.iter().all(|a| offered.contains(a)))
    }
}
