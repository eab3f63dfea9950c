//! The Docker backend's half of a plan as the pipeline and the rendering ask about it
//! ([`PlannedBackend`]): its steps with placeholders, its rows in the whole plan, what
//! of it decides the build.

use crate::nccl::plan::{
    BuildPlan, DockerPlan, DockerSource, DockerSteps, DockerfileSpec, NativeSource, ToolchainFiles,
    RUN_PREFIX_DIR, RUN_SCRIPT, RUN_SCRIPT_PATH, RUN_SOURCE_DIR, RUN_WORK_DIR,
};
use crate::step::{Paths, Step};
use crate::{KeyLater, PlannedBackend};

impl PlannedBackend for DockerPlan {
    fn source_identity(&self, plan: &BuildPlan) -> Result<String, String> {
        match &self.source {
            DockerSource::Context { path, .. } => crate::nccl::tree::tree_digest(path)
                .map(|d| format!("tree sha256:{d}"))
                .map_err(|e| format!("{e:#}")),
            // The image clones the tag; the Dockerfile (in the toolchain identity) names
            // the repository.
            DockerSource::Clone => Ok(format!("tag {} cloned by the image", plan.tag)),
        }
    }

    fn key_later(&self) -> KeyLater {
        KeyLater::AfterBuild
    }

    fn steps(&self, plan: &BuildPlan) -> Vec<Step> {
        let paths = Paths::placeholders(DockerSteps::PATHS);
        // The volumes are known when the toolchain image is: one per top-level
        // directory it holds.
        let volumes = match self.toolchain_files {
            ToolchainFiles::Volumes => {
                vec![("<toolchain-volume>".to_string(), "<dir>".to_string())]
            }
            ToolchainFiles::Image => Vec::new(),
        };
        DockerSteps::new(self, plan.jobs, &paths, &volumes)
            .all()
            .into_iter()
            .cloned()
            .collect()
    }

    fn rows(&self, plan: &BuildPlan) -> Vec<(&'static str, String)> {
        let mut rows = vec![(
            "image",
            format!(
                "{}-<digest of the base image's ID, the Dockerfile and its arguments>: the toolchain image, built once, then reused",
                self.image
            ),
        )];
        if let Some(base) = &self.base_image {
            rows.push(("base image", base.clone()));
        }
        rows.push((
            "dockerfile",
            match &self.dockerfile {
                DockerfileSpec::Embedded { sha256 } => {
                    format!("embedded (sha256 {})", &sha256[..12])
                }
                DockerfileSpec::File { path, sha256 } => {
                    format!("{} (sha256 {})", path.display(), &sha256[..12])
                }
            },
        ));
        if let Some(probe) = &self.probe {
            let mut found = match (&probe.cuda_home, probe.cuda) {
                (Some(home), Some(cuda)) => format!("CUDA {cuda} at {home} in the image (probed)"),
                (Some(home), None) => format!("{home} in the image; its nvcc gave no release"),
                (None, _) => "none in the image (probed)".to_string(),
            };
            if !probe.missing.is_empty() {
                found.push_str(&format!(
                    "; lacks {}{}",
                    probe.missing.join(", "),
                    if probe.apt {
                        " (apt can install)"
                    } else {
                        " (no apt)"
                    }
                ));
            }
            rows.push(("toolkit", found));
        }
        rows.push((
            "source",
            match &self.source {
                DockerSource::Context { path, version } => {
                    format!("{} (NCCL {version}), mounted read-only", path.display())
                }
                DockerSource::Clone => format!(
                    "{} fetched on this host into fdl's cache, then mounted read-only",
                    plan.tag
                ),
            },
        ));
        rows.push((
            "network",
            format!(
                "image build: {}  ({}); compile: none",
                self.network.as_deref().unwrap_or("default"),
                self.network_reason
            ),
        ));
        rows.push((
            "mounts",
            format!(
                "<source> at {RUN_SOURCE_DIR}, read-only; <work> (build/, tmp/) at {RUN_WORK_DIR}; <staging> at {RUN_PREFIX_DIR}"
            ),
        ));
        rows.push((
            "toolchain",
            match self.toolchain_files {
                ToolchainFiles::Volumes => format!(
                    "read from Docker volumes mounted read-only, each a copy of one of the image's top-level directories (usr, opt, …) made once per toolchain image  ({})",
                    self.toolchain_files_reason
                ),
                ToolchainFiles::Image => format!(
                    "read from the image  ({})",
                    self.toolchain_files_reason
                ),
            },
        ));
        rows
    }

    fn build_vars(&self) -> &[(String, String)] {
        &self.build_args
    }

    /// The clone the native backend would make of the tag: the Docker build fetches the
    /// tag on the host the same way (the compile has no network).
    fn source_clone(
        &self,
        plan: &BuildPlan,
        cache: Option<&std::path::Path>,
    ) -> Option<(String, std::path::PathBuf)> {
        match &self.source {
            DockerSource::Clone => cache
                .and_then(|cache| crate::native::source_for(None, &plan.tag, cache).ok())
                .and_then(|s| match s {
                    NativeSource::Clone { repo, cache_dir } => Some((repo, cache_dir)),
                    NativeSource::Dir { .. } => None,
                }),
            DockerSource::Context { .. } => None,
        }
    }

    /// By fdl's support table: the image is chosen for the plan's CUDA.
    fn compiles_archs(&self, plan: &BuildPlan) -> Option<bool> {
        Some(crate::arch::check_archs_for_cuda(&plan.archs, plan.cuda).is_ok())
    }

    fn script(&self) -> Option<(&'static str, &'static str)> {
        Some((RUN_SCRIPT_PATH, RUN_SCRIPT))
    }
}
