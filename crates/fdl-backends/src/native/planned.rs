//! The native backend's half of a plan as the pipeline and the rendering ask about it
//! ([`PlannedBackend`]): its steps with placeholders, its rows in the whole plan, what
//! of it decides the build.

use super::NativeSteps;
use crate::nccl::plan::{BuildPlan, NativePlan, NativeSource};
use crate::step::{Paths, Step};
use crate::{KeyLater, PlannedBackend};

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

    fn source_identity(&self, plan: &BuildPlan) -> Result<String, String> {
        match &self.source {
            NativeSource::Dir { path, .. } => crate::nccl::tree::tree_digest(path)
                .map(|d| format!("tree sha256:{d}"))
                .map_err(|e| format!("{e:#}")),
            NativeSource::Clone { repo, cache_dir } => {
                if !cache_dir.is_dir() {
                    return Err(format!(
                        "the commit of {} is known once it is cloned (a build clones it into {})",
                        plan.tag,
                        cache_dir.display()
                    ));
                }
                let git = self
                    .tools
                    .get("git")
                    .map_or(std::path::Path::new("git"), |p| p.as_path());
                let commit = crate::process::capture(
                    std::process::Command::new(git)
                        .arg("-C")
                        .arg(cache_dir)
                        .args(["rev-parse", "--verify"])
                        .arg(format!("{}^{{commit}}", plan.tag))
                        .env("GIT_TERMINAL_PROMPT", "0"),
                    "git rev-parse",
                )
                .map_err(|e| format!("cannot read the commit of {}: {e:#}", plan.tag))?;
                let commit = commit.trim();
                if commit.len() < 40 || !commit.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!(
                        "git named no commit for {} in {}",
                        plan.tag,
                        cache_dir.display()
                    ));
                }
                Ok(format!("git {repo} {commit}"))
            }
        }
    }

    fn key_later(&self) -> KeyLater {
        match &self.source {
            NativeSource::Clone { cache_dir, .. } if !cache_dir.is_dir() => KeyLater::AfterClone,
            _ => KeyLater::Never,
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
