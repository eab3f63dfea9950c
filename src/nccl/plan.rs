//! The build plan: every decision of `fdl nccl build`, made before anything runs.
//!
//! `BuildPlan::new` is pure — it takes inputs already gathered (flags, what the libtorch
//! says, what the GPUs are) and decides tag, CUDA, archs, names and commands, refusing
//! combinations that cannot work. `--dry-run` prints it; the manifest saves it; a
//! backend executes it. Where each value came from is part of the plan.

use crate::arch::{self, Arch, CudaImage};
use crate::gpu::Gpu;
use crate::nccl::tag::Tag;
use crate::version::{CudaVersion, NcclVersion};
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The prefix of every image fdl builds, so users can find and prune them.
pub const IMAGE_REPO: &str = "flodl-nccl-build";
/// Where the embedded Dockerfile installs NCCL inside the image.
pub const IMAGE_INSTALL_DIR: &str = "/usr/local/nccl";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "from", rename_all = "snake_case")]
pub enum TagOrigin {
    /// `--tag`
    Flag,
    /// NCCL's self-id in the active libtorch.
    Libtorch {
        variant: String,
        library: PathBuf,
        linkage: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CudaOrigin {
    Flag,
    Libtorch,
    Default,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "from", rename_all = "snake_case")]
pub enum ArchOrigin {
    Flag,
    Gpus { gpus: Vec<Gpu> },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DockerfileSpec {
    /// The Dockerfile compiled into fdl (`fdl nccl dockerfile` prints it).
    Embedded { sha256: String },
    /// `--dockerfile PATH`
    File { path: PathBuf, sha256: String },
}

impl DockerfileSpec {
    pub fn sha256(&self) -> &str {
        match self {
            DockerfileSpec::Embedded { sha256 } | DockerfileSpec::File { sha256, .. } => sha256,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    Docker,
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendKind::Docker => "docker",
        })
    }
}

/// What the Docker backend will do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DockerPlan {
    pub image: String,
    pub base_image: Option<String>,
    pub dockerfile: DockerfileSpec,
    /// In the order they are passed; values exactly as the Dockerfile receives them.
    pub build_args: Vec<(String, String)>,
}

/// Everything `BuildPlan::new` needs, already read from flags, libtorch and GPUs.
#[derive(Debug, Clone)]
pub struct PlanInputs {
    pub tag: Tag,
    pub tag_origin: TagOrigin,
    /// `--cuda`
    pub cuda_flag: Option<CudaVersion>,
    /// The CUDA NCCL's self-id names, when the tag came from a libtorch.
    pub cuda_from_libtorch: Option<CudaVersion>,
    pub archs: Vec<Arch>,
    pub arch_origin: ArchOrigin,
    pub jobs: u32,
    pub jobs_reason: String,
    pub builds_dir: PathBuf,
    pub dockerfile: DockerfileSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildPlan {
    pub tag: Tag,
    pub tag_origin: TagOrigin,
    /// The release the tag names, when it names one (`master` does not).
    pub nccl_version: Option<NcclVersion>,
    pub cuda: CudaVersion,
    pub cuda_origin: CudaOrigin,
    pub archs: Vec<Arch>,
    pub arch_origin: ArchOrigin,
    pub gencode: String,
    pub jobs: u32,
    pub jobs_reason: String,
    /// `v2.27.5-sm61-sm120`: the build's directory name.
    pub name: String,
    pub output_dir: PathBuf,
    pub backend: BackendKind,
    pub docker: DockerPlan,
}

impl BuildPlan {
    pub fn new(inputs: PlanInputs) -> Result<BuildPlan> {
        let (cuda, cuda_origin) = match (inputs.cuda_flag, inputs.cuda_from_libtorch) {
            (Some(c), _) => (c, CudaOrigin::Flag),
            (None, Some(c)) => (c, CudaOrigin::Libtorch),
            (None, None) => (arch::DEFAULT_CUDA, CudaOrigin::Default),
        };
        arch::check_archs_for_cuda(&inputs.archs, cuda)?;
        // The embedded Dockerfile needs a published base image; a user's own Dockerfile
        // may use any base, so an unknown release only matters for the embedded one.
        let image_for = arch::cuda_image(cuda);
        let base: Option<CudaImage> = match (&inputs.dockerfile, image_for) {
            (DockerfileSpec::Embedded { .. }, Err(e)) => return Err(e.into()),
            (_, Ok(img)) => Some(img),
            (DockerfileSpec::File { .. }, Err(_)) => None,
        };
        let name = format!(
            "{}-{}",
            inputs.tag.version_part(),
            arch::archs_slug(&inputs.archs)
        );
        let gencode = arch::gencode(&inputs.archs, false);
        let image = format!("{IMAGE_REPO}:{name}-cuda{cuda}");
        let cuda_arg = base
            .as_ref()
            .map(|b| b.cuda_version.clone())
            .unwrap_or_else(|| cuda.to_string());
        let mut build_args = vec![
            ("NCCL_VERSION".to_string(), inputs.tag.to_string()),
            ("NVCC_GENCODE".to_string(), gencode.clone()),
            ("MAX_JOBS".to_string(), inputs.jobs.to_string()),
            ("CUDA_VERSION".to_string(), cuda_arg),
        ];
        if let Some(b) = &base {
            build_args.push(("BASE_OS".to_string(), b.os.clone()));
        }
        Ok(BuildPlan {
            nccl_version: inputs.tag.version(),
            output_dir: inputs.builds_dir.join(&name),
            tag: inputs.tag,
            tag_origin: inputs.tag_origin,
            cuda,
            cuda_origin,
            archs: inputs.archs,
            arch_origin: inputs.arch_origin,
            gencode,
            jobs: inputs.jobs,
            jobs_reason: inputs.jobs_reason,
            name,
            backend: BackendKind::Docker,
            docker: DockerPlan {
                image,
                base_image: match &inputs.dockerfile {
                    DockerfileSpec::Embedded { .. } => base.map(|b| b.reference()),
                    DockerfileSpec::File { .. } => None,
                },
                dockerfile: inputs.dockerfile,
                build_args,
            },
        })
    }

    /// The fields that decide what gets built. Two plans with equal identity produce the
    /// same build; `jobs` and where values came from do not count.
    pub fn identity(&self) -> BTreeMap<&'static str, String> {
        BTreeMap::from([
            ("tag", self.tag.to_string()),
            ("cuda", self.cuda.to_string()),
            ("archs", arch::archs_slug(&self.archs)),
            ("gencode", self.gencode.clone()),
            ("backend", self.backend.to_string()),
            ("image", self.docker.image.clone()),
            ("dockerfile", self.docker.dockerfile.sha256().to_string()),
        ])
    }

    /// Human-readable differences between the identities of two plans.
    pub fn differences(&self, other: &BuildPlan) -> Vec<String> {
        let (a, b) = (self.identity(), other.identity());
        a.iter()
            .filter(|(k, v)| b.get(*k) != Some(v))
            .map(|(k, v)| {
                let theirs = b.get(k).map(String::as_str).unwrap_or("(none)");
                format!("{k}: existing build has {theirs}, this plan has {v}")
            })
            .collect()
    }

    /// The docker command lines the backend runs, with the private paths given.
    pub fn docker_commands(
        &self,
        context: &Path,
        staging: &Path,
        container: &str,
    ) -> Vec<Vec<String>> {
        let mut build = vec![
            "docker".to_string(),
            "build".into(),
            "--tag".into(),
            self.docker.image.clone(),
        ];
        for (k, v) in &self.docker.build_args {
            build.push("--build-arg".into());
            build.push(format!("{k}={v}"));
        }
        build.push("--file".into());
        build.push(context.join("Dockerfile").display().to_string());
        build.push(context.display().to_string());
        vec![
            build,
            vec![
                "docker".into(),
                "create".into(),
                "--name".into(),
                container.to_string(),
                self.docker.image.clone(),
                "fdl-extract".into(),
            ],
            vec![
                "docker".into(),
                "cp".into(),
                format!("{container}:{IMAGE_INSTALL_DIR}/."),
                staging.display().to_string(),
            ],
            vec![
                "docker".into(),
                "rm".into(),
                "--force".into(),
                container.to_string(),
            ],
        ]
    }

    /// `LD_PRELOAD` value for workers.
    pub fn preload_path(&self) -> PathBuf {
        self.output_dir.join("lib").join("libnccl.so.2")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn inputs(tag: &str, archs: &[Arch]) -> PlanInputs {
        PlanInputs {
            tag: Tag::parse(tag).unwrap(),
            tag_origin: TagOrigin::Flag,
            cuda_flag: None,
            cuda_from_libtorch: None,
            archs: archs.to_vec(),
            arch_origin: ArchOrigin::Flag,
            jobs: 4,
            jobs_reason: "test".into(),
            builds_dir: PathBuf::from("/p/libtorch/nccl/builds"),
            dockerfile: DockerfileSpec::Embedded {
                sha256: "abc".into(),
            },
        }
    }

    const MIXED: [Arch; 2] = [Arch::new(6, 1), Arch::new(12, 0)];

    #[test]
    fn names_image_and_args() {
        let p = BuildPlan::new(inputs("v2.27.5-1", &MIXED)).unwrap();
        assert_eq!(p.name, "v2.27.5-sm61-sm120");
        assert_eq!(
            p.output_dir,
            PathBuf::from("/p/libtorch/nccl/builds/v2.27.5-sm61-sm120")
        );
        assert_eq!(
            p.docker.image,
            "flodl-nccl-build:v2.27.5-sm61-sm120-cuda12.8"
        );
        assert_eq!(p.cuda_origin, CudaOrigin::Default);
        assert_eq!(
            p.docker.base_image.as_deref(),
            Some("nvidia/cuda:12.8.1-devel-ubuntu22.04")
        );
        let args: BTreeMap<_, _> = p.docker.build_args.iter().cloned().collect();
        assert_eq!(args["NCCL_VERSION"], "v2.27.5-1");
        assert_eq!(args["MAX_JOBS"], "4");
        assert_eq!(args["CUDA_VERSION"], "12.8.1");
        assert_eq!(
            args["NVCC_GENCODE"],
            "-gencode=arch=compute_61,code=sm_61 -gencode=arch=compute_120,code=sm_120"
        );
    }

    #[test]
    fn cuda_precedence_and_conflicts() {
        let mut i = inputs("v2.27.5-1", &MIXED);
        i.cuda_from_libtorch = Some(CudaVersion::new(12, 9));
        assert_eq!(
            BuildPlan::new(i.clone()).unwrap().cuda,
            CudaVersion::new(12, 9)
        );
        i.cuda_flag = Some(CudaVersion::new(13, 0));
        let err = BuildPlan::new(i).unwrap_err().to_string();
        assert!(err.contains("sm_61") && err.contains("12.9"), "{err}");
        let mut i = inputs("v2.27.5-1", &[Arch::new(8, 6)]);
        i.cuda_flag = Some(CudaVersion::new(12, 7));
        assert!(BuildPlan::new(i)
            .unwrap_err()
            .to_string()
            .contains("no nvidia/cuda devel image"));
    }

    #[test]
    fn identity_ignores_jobs_and_names_differences() {
        let a = BuildPlan::new(inputs("v2.27.5-1", &MIXED)).unwrap();
        let mut i = inputs("v2.27.5-1", &MIXED);
        i.jobs = 1;
        assert!(a.differences(&BuildPlan::new(i).unwrap()).is_empty());
        let mut i = inputs("v2.27.5-2", &MIXED);
        i.cuda_flag = Some(CudaVersion::new(12, 9));
        let d = a.differences(&BuildPlan::new(i).unwrap());
        assert!(d.iter().any(|s| s.starts_with("tag:")), "{d:?}");
        assert!(d.iter().any(|s| s.starts_with("cuda:")), "{d:?}");
    }

    #[test]
    fn plan_round_trips_through_json() {
        let p = BuildPlan::new(inputs("master", &MIXED)).unwrap();
        assert_eq!(p.name, "master-sm61-sm120");
        let back: BuildPlan = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(back, p);
    }
}
