//! The build plan: every decision of `fdl nccl build`, made before anything runs.
//!
//! `BuildPlan::new` is pure — it takes inputs already gathered (flags, what the libtorch
//! says, what the GPUs are) and decides tag, CUDA, archs, names and commands, refusing
//! combinations that cannot work. `--dry-run` prints it; the manifest saves it; a
//! backend executes it. Where each value came from is part of the plan.

use super::finding::{Finding, Findings};
use super::image::{self, ImageError};
use crate::arch::{self, Arch};
use crate::gpu::Gpu;
use crate::nccl::tag::Tag;
use crate::step::{Paths, Step};
use crate::version::{CudaVersion, NcclVersion};
use anyhow::Result;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The repository of every toolchain image fdl builds, so users can find and prune them.
pub const IMAGE_REPO: &str = "flodl-nccl-toolchain";
/// Where the compile container sees NCCL's source (a read-only bind mount).
pub const RUN_SOURCE_DIR: &str = "/fdl/src";
/// Where it sees the work directory: `build/` (NCCL's `BUILDDIR`) and `tmp/` (`TMPDIR`,
/// `HOME`), a bind mount of a directory beside the staging directory.
pub const RUN_WORK_DIR: &str = "/fdl/work";
/// Where it sees the staging directory, NCCL's install `PREFIX` (a bind mount).
pub const RUN_PREFIX_DIR: &str = "/fdl/prefix";
/// The tools the toolchain image must have besides a CUDA toolkit; the embedded
/// Dockerfile installs those of them the base image lacks.
pub const TOOLCHAIN_TOOLS: &[&str] = &["make", "g++", "python3"];

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
        /// Who runs the variant, said when both kinds could (a pip torch): its NCCL is
        /// that process's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        process: Option<crate::loader::python::ProcessKind>,
    },
    /// The highest NCCL among the cluster's workers' libtorch variants.
    Cluster { versions: Vec<HostValue> },
}

/// One worker's answer, as a plan records where a value came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostValue {
    pub host: String,
    pub value: String,
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
    Gpus {
        gpus: Vec<Gpu>,
    },
    /// The union of every worker's GPUs (`value` is the capability list of each).
    Cluster {
        hosts: Vec<HostValue>,
    },
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
    Native,
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendKind::Docker => "docker",
            BackendKind::Native => "native",
        })
    }
}

/// The backend half of a plan. In JSON it is `"backend": "docker"` beside a `"docker"`
/// object (or `"native"` and `"native"`), the shape manifests have always had.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "BackendRepr", into = "BackendRepr")]
pub enum BackendPlan {
    Docker(DockerPlan),
    Native(NativePlan),
}

impl BackendPlan {
    pub fn kind(&self) -> BackendKind {
        match self {
            BackendPlan::Docker(_) => BackendKind::Docker,
            BackendPlan::Native(_) => BackendKind::Native,
        }
    }
}

#[derive(Clone, Serialize, Deserialize)]
struct BackendRepr {
    backend: BackendKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    docker: Option<DockerPlan>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    native: Option<NativePlan>,
}

impl TryFrom<BackendRepr> for BackendPlan {
    type Error = String;
    fn try_from(r: BackendRepr) -> Result<Self, String> {
        match (r.backend, r.docker, r.native) {
            (BackendKind::Docker, Some(d), None) => Ok(BackendPlan::Docker(d)),
            (BackendKind::Native, None, Some(n)) => Ok(BackendPlan::Native(n)),
            (kind, _, _) => Err(format!(
                "a {kind} plan must carry exactly its own `{kind}` section"
            )),
        }
    }
}

impl From<BackendPlan> for BackendRepr {
    fn from(b: BackendPlan) -> Self {
        match b {
            BackendPlan::Docker(d) => BackendRepr {
                backend: BackendKind::Docker,
                docker: Some(d),
                native: None,
            },
            BackendPlan::Native(n) => BackendRepr {
                backend: BackendKind::Native,
                docker: None,
                native: Some(n),
            },
        }
    }
}

/// A CUDA toolkit found on the host, as the native backend will use it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Toolkit {
    pub cuda_home: PathBuf,
    pub nvcc: PathBuf,
    /// From `nvcc --version`, with its patch level.
    pub cuda: CudaVersion,
    /// From `nvcc --list-gpu-arch`, when this nvcc answers it (CUDA ≥ 11.0).
    pub gpu_archs: Option<Vec<Arch>>,
    /// `lib64` (installers) or `lib` (the nvidia-cuda-nvcc wheels' layout).
    pub lib_dir: PathBuf,
}

/// Where the native backend gets NCCL's source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NativeSource {
    /// `--source DIR`: an existing checkout or unpacked release; never modified.
    Dir { path: PathBuf, version: NcclVersion },
    /// A clone of the tag kept in the user's cache and reused.
    Clone { repo: String, cache_dir: PathBuf },
}

/// What the native backend will do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativePlan {
    pub toolkit: Toolkit,
    /// make, c++, python3 and (for clones) git, as found on PATH.
    pub tools: BTreeMap<String, PathBuf>,
    pub source: NativeSource,
    /// Passed to both `make src.build` and `make install`, which depends on the build.
    pub make_vars: Vec<(String, String)>,
    pub allow_cuda_mismatch: bool,
}

/// The backend-specific inputs of a plan.
#[derive(Debug, Clone)]
pub enum BackendInputs {
    Docker {
        dockerfile: DockerfileSpec,
        /// `--base-image`: the user's image instead of the chosen `nvidia/cuda` one.
        base_image: Option<String>,
        source: DockerSource,
        /// The probe of `base_image`, when the engine answered.
        probe: Option<ImageProbe>,
        /// `--toolchain-volumes`, and the engine's storage driver when it answered.
        volumes: VolumesFlag,
        storage_driver: Option<String>,
    },
    Native {
        toolkit: Toolkit,
        tools: BTreeMap<String, PathBuf>,
        source: NativeSource,
        allow_cuda_mismatch: bool,
    },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ToolkitConflict {
    #[error("the CUDA toolkit at {home} is CUDA {toolkit}, but the build asks for CUDA {wanted} ({origin}). Point --cuda-home at a CUDA {wanted} toolkit, pass --cuda {toolkit_mm}, or --allow-cuda-mismatch to build with it anyway")]
    Version {
        home: String,
        toolkit: CudaVersion,
        toolkit_mm: String,
        wanted: CudaVersion,
        origin: String,
    },
    #[error("nvcc at {nvcc} (CUDA {toolkit}) cannot compile {arch}: `nvcc --list-gpu-arch` offers {offered}. Use a toolkit that supports {arch}{nearest}, or drop it from --archs")]
    Arch {
        nvcc: String,
        toolkit: CudaVersion,
        arch: Arch,
        offered: String,
        /// ` (CUDA 12.9 compiles every planned arch)`, where a release does.
        nearest: String,
    },
}

/// Where the Docker build gets NCCL's source. Either way the tree is on the host and the
/// compile container sees it read-only: nothing in the container needs the network.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DockerSource {
    /// The tag, fetched on the host into fdl's cache as the native backend fetches it
    /// (manifests written before `--source` reached Docker builds also say this).
    #[default]
    Clone,
    /// `--source DIR`: the tree itself, mounted read-only (the name is the manifests').
    Context { path: PathBuf, version: NcclVersion },
}

/// What a short `docker run --rm` of the `--base-image` found in it, before any build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageProbe {
    pub image: String,
    /// Where the image's nvcc lives: `$CUDA_HOME`, `/usr/local/cuda`, or nvcc on PATH.
    pub cuda_home: Option<String>,
    /// From that nvcc's `--version`.
    pub cuda: Option<CudaVersion>,
    /// From that nvcc's `--list-gpu-arch`, when it answers.
    pub gpu_archs: Option<Vec<Arch>>,
    /// Of make, g++, python3 and git, those the image lacks (git is no longer needed).
    pub missing: Vec<String>,
    /// Whether the image has apt-get to install what is missing (with network).
    pub apt: bool,
    /// The top-level directories where a toolchain lives (`usr`, `opt`, and `bin`,
    /// `lib`… where they are not links into `/usr`) that the image has: what its
    /// toolchain volumes copy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dirs: Vec<String>,
}

/// Where the compile containers read the toolchain (compiler, headers, CUDA) from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolchainFiles {
    /// The image's own file system, through the engine's storage driver.
    #[default]
    Image,
    /// Docker volumes holding a copy of the image's top-level toolchain directories
    /// (`/usr`, `/opt`, …), made once per toolchain image and mounted read-only: the
    /// engine keeps a volume as a plain directory of the host, so a compile reads its
    /// thousands of headers and tools at the host file system's speed, not through a
    /// slow storage driver.
    Volumes,
}

/// `--toolchain-volumes`: whether the compile reads the toolchain from volumes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum VolumesFlag {
    /// Where the engine's storage driver is fuse-overlayfs (rootless engines, hosts
    /// without kernel overlayfs)
    #[default]
    Auto,
    Always,
    Never,
}

/// The storage drivers whose reads make a compile markedly slower than the host's file
/// system (fuse-overlayfs: every open and read goes through a FUSE daemon; about 10% of
/// an NCCL build here, measured by benches/docker_overhead.rs). Kernel overlay2, btrfs,
/// zfs and vfs read at the backing file system's speed.
pub const SLOW_STORAGE_DRIVERS: &[&str] = &["fuse-overlayfs"];

/// Where the compile reads the toolchain, and why: `--toolchain-volumes`, else the
/// engine's storage driver.
pub fn toolchain_files(flag: VolumesFlag, driver: Option<&str>) -> (ToolchainFiles, String) {
    match (flag, driver) {
        (VolumesFlag::Always, _) => (
            ToolchainFiles::Volumes,
            "--toolchain-volumes always".to_string(),
        ),
        (VolumesFlag::Never, _) => (
            ToolchainFiles::Image,
            "--toolchain-volumes never".to_string(),
        ),
        (VolumesFlag::Auto, Some(d)) if SLOW_STORAGE_DRIVERS.contains(&d) => (
            ToolchainFiles::Volumes,
            format!("the engine stores images with {d}, which is slow to read"),
        ),
        (VolumesFlag::Auto, Some(d)) => (
            ToolchainFiles::Image,
            format!("the engine stores images with {d}, which reads at the host's speed"),
        ),
        (VolumesFlag::Auto, None) => (
            ToolchainFiles::Image,
            "the engine's storage driver is not known".to_string(),
        ),
    }
}

/// What the Docker backend will do: build (or reuse) the toolchain image, then compile
/// in `docker run --rm --network none --read-only` with the source and work directory
/// bind-mounted from the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DockerPlan {
    /// The toolchain image's name; a run tags it `<image>-<digest>`, the digest taken of
    /// the base image's ID, the Dockerfile and its build arguments (see
    /// `docker::toolchain_image`), so a change of any of them builds a new one.
    pub image: String,
    pub base_image: Option<String>,
    pub dockerfile: DockerfileSpec,
    /// The toolchain image's build arguments, in the order they are passed; values
    /// exactly as the Dockerfile receives them.
    pub build_args: Vec<(String, String)>,
    /// Passed to every make of the compile, as the native backend passes them (plus
    /// `CUDA_HOME` and `CUDA_LIB`, found in the image when the container starts).
    #[serde(default)]
    pub make_vars: Vec<(String, String)>,
    #[serde(default)]
    pub source: DockerSource,
    /// What the probe of `--base-image` found, when it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ImageProbe>,
    /// `none` when building the toolchain image needs no network (`docker build
    /// --network none`). The compile itself always runs with `--network none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// Why the build does or does not run without network.
    #[serde(default)]
    pub network_reason: String,
    /// Where the compile reads the toolchain from. Not part of the plan's identity: the
    /// same files either way.
    #[serde(default)]
    pub toolchain_files: ToolchainFiles,
    #[serde(default)]
    pub toolchain_files_reason: String,
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
    pub backend: BackendInputs,
    /// Why this backend: `--backend`, or what `auto` found.
    pub backend_reason: String,
    /// Also embed PTX for the highest arch, so newer GPUs can JIT it.
    pub ptx: bool,
    /// NCCL's ONLY_FUNCS, for quick development builds.
    pub only_funcs: Option<String>,
    /// What the plan's reader should know but does not stop the build.
    pub warnings: Vec<Finding>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildPlan {
    pub tag: Tag,
    pub tag_origin: TagOrigin,
    /// The release the tag names, when it names one (`master` does not).
    pub nccl_version: Option<NcclVersion>,
    /// The CUDA the build compiles with.
    pub cuda: CudaVersion,
    pub cuda_origin: CudaOrigin,
    /// Why the build's CUDA differs from the one asked for, when it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_note: Option<String>,
    pub archs: Vec<Arch>,
    pub arch_origin: ArchOrigin,
    pub gencode: String,
    pub jobs: u32,
    pub jobs_reason: String,
    pub ptx: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub only_funcs: Option<String>,
    /// `v2.27.5-sm61-sm120`: the build's directory name.
    pub name: String,
    pub output_dir: PathBuf,
    /// Which backend, and what it will do: one or the other, never both or neither.
    #[serde(flatten)]
    pub backend: BackendPlan,
    pub backend_reason: String,
    /// What stops this plan, and what its reader should know.
    #[serde(flatten)]
    pub findings: Findings,
}

/// The longest build name: a directory name (NAME_MAX on Linux file systems) less what
/// the names fdl derives from it add ([`crate::nccl::name::BuildName::MAX_BYTES`]).
pub const MAX_NAME_BYTES: usize = crate::nccl::name::BuildName::MAX_BYTES;

/// `-ptx` and `-only-<digest>` mark builds that differ from a plain full build, so such a
/// build can never pass for one.
fn build_name(tag: &Tag, archs: &[Arch], ptx: bool, only_funcs: Option<&str>) -> String {
    let mut name = format!("{}-{}", tag.version_part(), arch::archs_slug(archs));
    if ptx {
        name.push_str("-ptx");
    }
    if let Some(expr) = only_funcs {
        let digest = Sha256::digest(expr.as_bytes());
        name.push_str(&format!(
            "-only-{:02x}{:02x}{:02x}{:02x}",
            digest[0], digest[1], digest[2], digest[3]
        ));
    }
    name
}

impl BuildPlan {
    pub fn new(inputs: PlanInputs) -> Result<BuildPlan> {
        let (mut cuda, cuda_origin) = match (inputs.cuda_flag, inputs.cuda_from_libtorch) {
            (Some(c), _) => (c, CudaOrigin::Flag),
            (None, Some(c)) => (c, CudaOrigin::Libtorch),
            (None, None) => (image::DEFAULT_CUDA, CudaOrigin::Default),
        };
        // Unless --cuda pins it, the CUDA follows what can build: a native build uses its
        // toolkit's own release, and a Docker build a release that compiles every
        // planned arch, as close as can be to the one the libtorch's NCCL names.
        let mut cuda_note = None;
        if cuda_origin != CudaOrigin::Flag {
            match &inputs.backend {
                BackendInputs::Native { toolkit, .. }
                    if toolkit.cuda.major_minor() != cuda.major_minor() =>
                {
                    cuda_note = Some(format!(
                        "the toolkit at {} is CUDA {}; {} asked for {cuda}, so the build uses the toolkit's (pass --cuda to insist)",
                        toolkit.cuda_home.display(),
                        toolkit.cuda,
                        match cuda_origin {
                            CudaOrigin::Libtorch => "the libtorch's NCCL",
                            _ => "fdl's default",
                        }
                    ));
                    cuda = toolkit.cuda;
                }
                BackendInputs::Docker {
                    base_image: None, ..
                } if arch::check_archs_for_cuda(&inputs.archs, cuda).is_err() => {
                    if let Some(fit) = image::closest_cuda_for(&inputs.archs, cuda) {
                        cuda_note = Some(format!(
                            "{cuda} cannot compile every planned arch; {} is the release closest to it that compiles {}",
                            fit,
                            inputs
                                .archs
                                .iter()
                                .map(|a| a.to_string())
                                .collect::<Vec<_>>()
                                .join(" ")
                        ));
                        cuda = fit;
                    }
                }
                _ => {}
            }
        }
        if let Some(expr) = &inputs.only_funcs {
            crate::nccl::only_funcs::check(expr)?;
        }
        let name = build_name(
            &inputs.tag,
            &inputs.archs,
            inputs.ptx,
            inputs.only_funcs.as_deref(),
        );
        // The name becomes a directory: the real build would fail to create it, so no
        // plan (dry or not) is made for one.
        if name.len() > MAX_NAME_BYTES {
            anyhow::bail!(
                "the build's name would be {} bytes ({}…), more than a build name may hold ({MAX_NAME_BYTES}, so that the names made from it fit in a directory entry): {} archs are too many for one build. Build fewer at once with --archs (the archs of the hosts that will load it)",
                name.len(),
                name.chars().take(48).collect::<String>(),
                inputs.archs.len()
            );
        }
        let gencode = arch::gencode(&inputs.archs, inputs.ptx);
        let mut problems = Vec::new();
        let backend = match inputs.backend {
            BackendInputs::Docker {
                dockerfile,
                base_image,
                source,
                probe,
                volumes,
                storage_driver,
            } => {
                let (toolchain_files, toolchain_files_reason) =
                    toolchain_files(volumes, storage_driver.as_deref());
                // CUDA_VERSION names the image's full release when fdl chose the image.
                let mut cuda_arg = cuda.to_string();
                let image = match base_image {
                    Some(img) => {
                        match &probe {
                            Some(found) => {
                                let checked = check_probe(
                                    found,
                                    cuda,
                                    cuda_origin,
                                    &inputs.archs,
                                    &mut problems,
                                );
                                if let Some(image_cuda) = checked {
                                    cuda = image_cuda;
                                    cuda_arg = image_cuda.to_string();
                                    cuda_note = Some(format!(
                                        "the nvcc in --base-image {img} is CUDA {image_cuda} (probed), so the build uses it"
                                    ));
                                }
                            }
                            None => {
                                cuda_note = Some(format!(
                                    "the CUDA inside --base-image {img} was not probed (no Docker engine answered); the built library's self-id names it"
                                ));
                            }
                        }
                        Some(img)
                    }
                    None => match image::choose_image(cuda, &inputs.archs) {
                        // --cuda is a pin: another release's image is a problem to solve,
                        // never a quiet substitute.
                        Ok(choice) if choice.note.is_some() && cuda_origin == CudaOrigin::Flag => {
                            problems.push(Finding::PinnedCudaWithoutImage {
                                cuda,
                                closest: choice.cuda,
                                image: choice.image.reference(),
                            });
                            None
                        }
                        Ok(choice) => {
                            if let Some(note) = choice.note {
                                cuda = choice.cuda;
                                cuda_note = Some(match cuda_note {
                                    Some(first) => format!("{first}. Then: {note}"),
                                    None => note,
                                });
                            }
                            cuda_arg = choice.image.cuda_version.clone();
                            Some(choice.image.reference())
                        }
                        // No image compiles the archs as asked: the plan still shows,
                        // with the problem and the way out.
                        Err(ImageError::Arch(e)) => {
                            problems.push(Finding::CudaCannotCompile {
                                arch: e.arch(),
                                cuda: match &e {
                                    arch::ArchCudaError::Conflict { cuda, .. } => Some(*cuda),
                                    arch::ArchCudaError::Unknown { .. } => None,
                                },
                                why: e.to_string(),
                            });
                            None
                        }
                        // A user's own Dockerfile may start from any image.
                        Err(e @ ImageError::NoImage { .. }) => {
                            if let DockerfileSpec::Embedded { .. } = dockerfile {
                                problems.push(Finding::NoImage {
                                    cuda,
                                    why: e.to_string(),
                                });
                            }
                            None
                        }
                    },
                };
                let (network, network_reason) =
                    docker_network(probe.as_ref(), &dockerfile, image.as_deref());
                BackendPlan::Docker(DockerPlan {
                    image: format!("{IMAGE_REPO}:cuda{cuda}"),
                    build_args: docker_build_args(cuda_arg, image.as_deref()),
                    make_vars: make_vars(&gencode, None, inputs.only_funcs.as_deref()),
                    base_image: image,
                    dockerfile,
                    source,
                    probe,
                    network,
                    network_reason,
                    toolchain_files,
                    toolchain_files_reason,
                })
            }
            BackendInputs::Native {
                toolkit,
                tools,
                source,
                allow_cuda_mismatch,
            } => {
                if let Err(e) = check_toolkit(
                    &toolkit,
                    cuda,
                    cuda_origin,
                    allow_cuda_mismatch,
                    &inputs.archs,
                ) {
                    problems.push(Finding::Toolkit {
                        why: format!("{e:#}"),
                    });
                }
                let make_vars = make_vars(
                    &gencode,
                    Some(&toolkit.cuda_home.display().to_string()),
                    inputs.only_funcs.as_deref(),
                );
                let plan = NativePlan {
                    toolkit,
                    tools,
                    source,
                    make_vars,
                    allow_cuda_mismatch,
                };
                BackendPlan::Native(plan)
            }
        };
        Ok(BuildPlan {
            nccl_version: inputs.tag.version(),
            output_dir: inputs.builds_dir.join(&name),
            tag: inputs.tag,
            tag_origin: inputs.tag_origin,
            cuda,
            cuda_origin,
            cuda_note,
            archs: inputs.archs,
            arch_origin: inputs.arch_origin,
            gencode,
            jobs: inputs.jobs,
            jobs_reason: inputs.jobs_reason,
            ptx: inputs.ptx,
            only_funcs: inputs.only_funcs,
            name,
            backend,
            backend_reason: inputs.backend_reason,
            findings: Findings {
                problems,
                warnings: inputs.warnings,
            },
        })
    }

    /// The fields that decide what gets built. Two plans with equal identity produce the
    /// same build; `jobs` and where values came from do not count.
    pub fn identity(&self) -> BTreeMap<&'static str, String> {
        let mut id = BTreeMap::from([
            ("tag", self.tag.to_string()),
            ("cuda", self.cuda.to_string()),
            ("archs", arch::archs_text(&self.archs)),
            ("gencode", self.gencode.clone()),
            ("only_funcs", self.only_funcs.clone().unwrap_or_default()),
            ("backend", self.backend.kind().to_string()),
        ]);
        id.extend(self.backend.identity());
        id
    }

    /// Human-readable differences between the identities of two plans.
    /// How this plan differs from the one an `existing` build was made from, one line per
    /// identity field, naming each side.
    pub fn differences(&self, existing: &BuildPlan) -> Vec<String> {
        let (ours, theirs) = (self.identity(), existing.identity());
        let keys: std::collections::BTreeSet<&&str> = ours.keys().chain(theirs.keys()).collect();
        keys.into_iter()
            .filter(|k| ours.get(**k) != theirs.get(**k))
            .map(|k| {
                let side = |m: &BTreeMap<&str, String>| {
                    m.get(*k).cloned().unwrap_or_else(|| "(none)".into())
                };
                format!(
                    "{k}: existing build has {}, this plan has {}",
                    side(&theirs),
                    side(&ours)
                )
            })
            .collect()
    }
}

impl BuildPlan {
    /// What else a plan for `archs` would need so that this plan's compiler builds them
    /// all, as a clause for advice ("…pass --archs X" + this): `None` when this plan's
    /// toolchain compiles every one of them, or when fdl cannot know (a `--base-image` not
    /// probed). Judged as the plan judges its own archs: by the toolchain's own `nvcc
    /// --list-gpu-arch` where it answered, else by the support table; the CUDA named is
    /// the release nearest this plan's that compiles all of `archs`.
    pub fn toolchain_gap(&self, archs: &[Arch]) -> Option<String> {
        let not_in = |offered: &[Arch]| -> Vec<Arch> {
            archs
                .iter()
                .copied()
                .filter(|a| !offered.contains(a))
                .collect()
        };
        let by_table = |cuda: CudaVersion| -> Vec<Arch> {
            archs
                .iter()
                .copied()
                .filter(|a| arch::check_archs_for_cuda(&[*a], cuda).is_err())
                .collect()
        };
        // What cannot be compiled, by whom (for the sentence), and at which CUDA.
        let (missing, compiler, cuda) = match &self.backend {
            BackendPlan::Native(n) => {
                let t = &n.toolkit;
                let missing = match &t.gpu_archs {
                    Some(offered) => not_in(offered),
                    None => by_table(t.cuda),
                };
                let who = format!("the toolkit at {} (CUDA {})", t.cuda_home.display(), t.cuda);
                (missing, who, t.cuda)
            }
            BackendPlan::Docker(d) => match (&d.base_image, &d.probe) {
                (Some(img), Some(found)) => {
                    let cuda = found.cuda?;
                    let missing = match &found.gpu_archs {
                        Some(offered) => not_in(offered),
                        None => by_table(cuda),
                    };
                    (
                        missing,
                        format!("the nvcc in --base-image {img} (CUDA {cuda})"),
                        cuda,
                    )
                }
                // A --base-image that was not probed: its CUDA is not known. (The image
                // fdl chose itself is in the plan too, unprobed: it is the one
                // `choose_image` names for the plan's CUDA.)
                (Some(img), None)
                    if image::choose_image(self.cuda, &self.archs)
                        .map_or(true, |c| &c.image.reference() != img) =>
                {
                    return None
                }
                // fdl chooses the image for the archs, unless --cuda pins the release.
                _ if self.cuda_origin != CudaOrigin::Flag => {
                    if image::closest_cuda_for(archs, self.cuda).is_some() {
                        return None;
                    }
                    (
                        by_table(self.cuda),
                        format!("CUDA {}", self.cuda),
                        self.cuda,
                    )
                }
                _ => (
                    by_table(self.cuda),
                    format!("CUDA {} (--cuda)", self.cuda),
                    self.cuda,
                ),
            },
        };
        if missing.is_empty() {
            return None;
        }
        let what = arch::archs_text(&missing);
        let Some(fit) = image::closest_cuda_for(archs, cuda) else {
            return Some(if archs.iter().all(|a| a.support().is_some()) {
                format!(
                    ", but no one CUDA release compiles {} together ({compiler} cannot compile {what}): build {what} separately, with a CUDA that compiles it",
                    arch::archs_text(archs)
                )
            } else {
                format!(
                    ", with a toolchain whose `nvcc --list-gpu-arch` lists {what}: {compiler} cannot compile it"
                )
            });
        };
        let fit = fit.without_patch();
        let also_cuda = if self.cuda_origin == CudaOrigin::Flag {
            format!(" and --cuda {fit}")
        } else {
            String::new()
        };
        Some(match &self.backend {
            BackendPlan::Native(_) => format!(
                " with a CUDA {fit} toolkit (--cuda-home DIR{also_cuda}): {compiler} cannot compile {what}"
            ),
            BackendPlan::Docker(d) if d.probe.is_some() => format!(
                " with an image of CUDA {fit} as --base-image (or no --base-image and --cuda {fit}): {compiler} cannot compile {what}"
            ),
            BackendPlan::Docker(_) => {
                format!(" with --cuda {fit}: {compiler} cannot compile {what}")
            }
        })
    }
}

/// The make variables both backends pass to every make of a build: the gencode, the
/// toolkit's home where the plan knows it (the Docker backend's is found in the image),
/// and ONLY_FUNCS for a development build.
fn make_vars(
    gencode: &str,
    cuda_home: Option<&str>,
    only_funcs: Option<&str>,
) -> Vec<(String, String)> {
    let mut vars = vec![("NVCC_GENCODE".to_string(), gencode.to_string())];
    if let Some(home) = cuda_home {
        vars.push(("CUDA_HOME".to_string(), home.to_string()));
    }
    if let Some(expr) = only_funcs {
        vars.push(("ONLY_FUNCS".to_string(), expr.to_string()));
    }
    vars
}

/// The arguments of one NCCL make, the same for both backends: `-C source [-n] -jN
/// target BUILDDIR=… [PREFIX=…] VARS…`. NCCL's `install` depends on its build, so it gets
/// the same variables — otherwise it would rebuild for its default archs.
pub struct NcclMake<'a> {
    pub source: &'a std::path::Path,
    pub jobs: u32,
    /// `make -n`: a dry run that counts the files to compile.
    pub dry: bool,
    pub target: &'a str,
    pub build_dir: &'a std::path::Path,
    /// `PREFIX`, for `install`.
    pub prefix: Option<&'a std::path::Path>,
    pub vars: &'a [(String, String)],
}

impl NcclMake<'_> {
    pub fn add_to(&self, mut step: Step) -> Step {
        step = step.arg("-C").arg(self.source);
        if self.dry {
            step = step.arg("-n");
        }
        step = step
            .arg(format!("-j{}", self.jobs))
            .arg(self.target)
            .assign("BUILDDIR", self.build_dir);
        if let Some(prefix) = self.prefix {
            step = step.assign("PREFIX", prefix);
        }
        for (k, v) in self.vars {
            step = step.assign(k, v);
        }
        step
    }
}

/// The label of each compile container naming the fdl that runs it, as
/// `<pid>-<start time>` (the start time in clock ticks since boot, from
/// `/proc/<pid>/stat`, so a reused pid is not taken for it).
pub const CONTAINER_OWNER_LABEL: &str = "fdl.owner";

/// Where the compile container finds [`RUN_SCRIPT`]: fdl writes it into the work
/// directory before the first run.
pub const RUN_SCRIPT_PATH: &str = "/fdl/work/fdl-run.sh";

/// What the compile container runs first, with `/bin/sh`: it finds the toolkit as the
/// toolchain contract says (`$CUDA_HOME`, else `/usr/local/cuda`, else the nvcc on PATH;
/// libraries in `lib64/`, else `lib/` as the PyPI wheels lay them out), refuses a home
/// make would split, and runs the make given as its arguments with `CUDA_HOME` and
/// `CUDA_LIB` added and the toolkit's `bin/` first on PATH.
///
/// The make runs in the background, tied to fdl: fdl holds the container's stdin open
/// (`docker run -i`, a pipe whose only write end is fdl's) for as long as it lives, so
/// end of file there means fdl is gone — even by SIGKILL, which leaves no one to remove
/// the container — and a watchdog then kills everything in the container. The shell is
/// the container's PID 1, which ignores SIGTERM unless it traps it: it traps it (the
/// signal `docker run` passes on at Ctrl-C) and kills the make at once, so an interrupt
/// does not wait for `docker stop`'s grace. `kill -KILL -1` reaches every process of
/// the container but PID 1 and the sender.
pub const RUN_SCRIPT: &str = r#"exec 3<&0
trap 'kill -KILL -1 2>/dev/null; exit 143' TERM INT HUP
home=${CUDA_HOME:-}
if [ -z "$home" ]; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then home=/usr/local/cuda
  elif nvcc=$(command -v nvcc); then home=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
  fi
fi
if [ -z "$home" ] || [ ! -x "$home/bin/nvcc" ]; then
  echo "fdl: no nvcc in the toolchain image: set CUDA_HOME in it, install a CUDA toolkit at /usr/local/cuda, or put nvcc on PATH" >&2; exit 127
fi
case $home in *[!A-Za-z0-9/._+-]*) echo "fdl: the toolkit's home '$home' is not a plain path, which NCCL's makefiles cannot take" >&2; exit 2;; esac
lib=$home/lib64
[ -d "$lib" ] || lib=$home/lib
PATH=$home/bin:$PATH
export PATH
{ while IFS= read -r _; do :; done; kill -KILL -1; } <&3 &
"$@" CUDA_HOME="$home" CUDA_LIB="$lib" </dev/null &
wait $!
status=$?
kill -KILL -1 2>/dev/null
exit $status
"#;

/// The Docker backend's steps, by name: the toolchain image's build, then three
/// `docker run`s of it — a dry run of `src.build` that counts the files to compile,
/// `src.build`, then `install` — with the make arguments of [`NcclMake`]. `paths` holds
/// `context` (the private build context, holding only the Dockerfile), `toolchain` (the
/// image's tag, a digest known at run time), `source`, `work` and `staging` (the host
/// directories mounted at [`RUN_SOURCE_DIR`], [`RUN_WORK_DIR`] and [`RUN_PREFIX_DIR`]),
/// `container` (the prefix of the containers' names), `user` (`uid:gid`) and `owner` (the
/// [`CONTAINER_OWNER_LABEL`] value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerSteps {
    pub build: Step,
    pub count: Step,
    pub compile: Step,
    pub install: Step,
}

impl DockerSteps {
    pub const PATHS: &'static [&'static str] = &[
        "context",
        "toolchain",
        "source",
        "work",
        "staging",
        "container",
        "user",
        "owner",
    ];

    /// `volumes`: the toolchain volumes each compile mounts read-only, as (volume,
    /// directory); none where the toolchain is read from the image.
    pub fn new(
        docker: &DockerPlan,
        jobs: u32,
        paths: &Paths,
        volumes: &[(String, String)],
    ) -> DockerSteps {
        let context = paths.get("context");
        let toolchain = paths.get("toolchain");
        let mut build = Step::new(
            "docker build (toolchain image)",
            "docker",
            &format!("the toolchain image <toolchain> ({})", docker.image),
        )
        .arg("build")
        .arg("--tag")
        .arg(toolchain);
        for (k, v) in &docker.build_args {
            build = build.arg("--build-arg").assign(k, v);
        }
        if let Some(network) = &docker.network {
            build = build.arg("--network").arg(network);
        }
        let build = build
            .arg("--file")
            .arg(context.join("Dockerfile"))
            .arg(context);
        let mount = |key: &str, target: &str, ro: bool| {
            let mut m = std::ffi::OsString::from("type=bind,source=");
            m.push(paths.get(key));
            m.push(format!(",target={target}"));
            if ro {
                m.push(",readonly");
            }
            m
        };
        let work = std::path::Path::new(RUN_WORK_DIR);
        let tmp = work.join("tmp");
        let run = |what: &str, produces: &str, suffix: &str, dry: bool, target: &str| {
            let mut name = paths.get("container").as_os_str().to_os_string();
            name.push(format!("-{suffix}"));
            let mut tmp_env = std::ffi::OsString::from("TMPDIR=");
            tmp_env.push(&tmp);
            let mut home_env = std::ffi::OsString::from("HOME=");
            home_env.push(&tmp);
            let mut step = Step::new(what, "docker", produces)
                .arg("run")
                .arg("--rm")
                // Its stdin is a pipe fdl holds: the run script ends the build when it
                // closes (see RUN_SCRIPT).
                .arg("--interactive")
                .arg("--name")
                .arg(name)
                // Whose container it is: the next run removes one whose fdl is gone.
                .arg("--label")
                .arg({
                    let mut l = std::ffi::OsString::from(format!("{CONTAINER_OWNER_LABEL}="));
                    l.push(paths.get("owner"));
                    l
                })
                .arg("--pull")
                .arg("never")
                .arg("--network")
                .arg("none")
                .arg("--read-only")
                .arg("--user")
                .arg(paths.get("user"))
                .arg("--mount")
                .arg(mount("source", RUN_SOURCE_DIR, true))
                .arg("--mount")
                .arg(mount("work", RUN_WORK_DIR, false))
                .arg("--mount")
                .arg(mount("staging", RUN_PREFIX_DIR, false));
            for (volume, dir) in volumes {
                step = step
                    .arg("--mount")
                    .arg(format!("type=volume,source={volume},target={dir},readonly"));
            }
            let step = step
                .arg("--env")
                .arg(tmp_env)
                .arg("--env")
                .arg(home_env)
                .arg("--env")
                .arg("PYTHONDONTWRITEBYTECODE=1")
                .arg("--workdir")
                .arg(RUN_WORK_DIR)
                .arg("--entrypoint")
                .arg("/bin/sh")
                .arg(toolchain)
                .arg(RUN_SCRIPT_PATH)
                .arg("make");
            let prefix = std::path::Path::new(RUN_PREFIX_DIR);
            NcclMake {
                source: std::path::Path::new(RUN_SOURCE_DIR),
                jobs,
                dry,
                target,
                build_dir: &work.join("build"),
                prefix: (target == "install").then_some(prefix),
                vars: &docker.make_vars,
            }
            .add_to(step)
        };
        DockerSteps {
            build,
            count: run(
                "make -n src.build (in the toolchain image)",
                "nothing: it counts the files to compile",
                "count",
                true,
                "src.build",
            ),
            compile: run(
                "make src.build (compiling NCCL in the toolchain image)",
                "NCCL compiled in <work>/build",
                "build",
                false,
                "src.build",
            ),
            install: run(
                "make install (in the toolchain image)",
                "the NCCL install tree in <staging>",
                "install",
                false,
                "install",
            ),
        }
    }

    pub fn all(&self) -> [&Step; 4] {
        [&self.build, &self.count, &self.compile, &self.install]
    }
}

/// The toolchain image's build arguments, in the order they are passed.
fn docker_build_args(cuda_arg: String, base_image: Option<&str>) -> Vec<(String, String)> {
    let mut build_args = vec![
        ("CUDA_VERSION".to_string(), cuda_arg),
        ("TOOLS".to_string(), TOOLCHAIN_TOOLS.join(" ")),
    ];
    if let Some(img) = base_image {
        build_args.push(("BASE_IMAGE".to_string(), img.to_string()));
    }
    build_args
}

/// The tools the toolchain image must have; the source never needs git in the image.
fn needed_tools() -> Vec<&'static str> {
    TOOLCHAIN_TOOLS.to_vec()
}

/// Holds what the probe of a `--base-image` found against the plan: the image must have
/// an nvcc that compiles every planned arch, at the CUDA `--cuda` asks for, and the tools
/// it lacks must be installable. Returns the image's CUDA, which the build will use.
fn check_probe(
    found: &ImageProbe,
    cuda: CudaVersion,
    origin: CudaOrigin,
    archs: &[Arch],
    problems: &mut Vec<Finding>,
) -> Option<CudaVersion> {
    let image = found.image.clone();
    if found.cuda_home.is_none() {
        problems.push(Finding::BaseImageWithoutNvcc { image });
        return None;
    }
    let Some(image_cuda) = found.cuda else {
        problems.push(Finding::BaseImageNvccSilent { image });
        return None;
    };
    if origin == CudaOrigin::Flag && image_cuda.major_minor() != cuda.major_minor() {
        problems.push(Finding::BaseImageOtherCuda {
            image: image.clone(),
            image_cuda,
            asked: cuda,
        });
    }
    if let Some(offered) = &found.gpu_archs {
        for &arch in archs.iter().filter(|a| !offered.contains(a)) {
            problems.push(Finding::BaseImageCannotCompile {
                image: image.clone(),
                image_cuda,
                arch,
                offered: offered.clone(),
                fits: image::closest_cuda_for(archs, image_cuda),
            });
        }
    }
    let lacking: Vec<&str> = needed_tools()
        .into_iter()
        .filter(|t| found.missing.iter().any(|m| m == t))
        .collect();
    if !lacking.is_empty() && !found.apt {
        problems.push(Finding::BaseImageLacksTools {
            image,
            tools: lacking.iter().map(|t| t.to_string()).collect(),
        });
    }
    Some(image_cuda)
}

/// Whether the toolchain image may be built with `--network none`: only when building it
/// cannot need the network — the Dockerfile is fdl's own and the probed image has every
/// tool, so apt never runs. (The compile never has network, whatever this says.)
fn docker_network(
    probe: Option<&ImageProbe>,
    dockerfile: &DockerfileSpec,
    image: Option<&str>,
) -> (Option<String>, String) {
    let image = image.unwrap_or("the base image");
    let why = match (dockerfile, probe) {
        (DockerfileSpec::File { .. }, _) => {
            "a --dockerfile of your own may fetch what it needs".to_string()
        }
        (DockerfileSpec::Embedded { .. }, None) => format!(
            "{image} was not probed, so apt may have to install tools it lacks (give --base-image with the tools for an offline build)"
        ),
        (DockerfileSpec::Embedded { .. }, Some(found)) => {
            let lacking: Vec<&str> = needed_tools()
                .into_iter()
                .filter(|t| found.missing.iter().any(|m| m == t))
                .collect();
            if lacking.is_empty() {
                return (
                    Some("none".to_string()),
                    format!("{image} has every tool: nothing needs the network"),
                );
            }
            format!("{image} lacks {}, which apt installs", lacking.join(", "))
        }
    };
    (None, why)
}

/// ` (CUDA 12.9 compiles every planned arch)`: the release nearest `cuda` that compiles
/// all of `archs`, for a refusal's way out; empty where no one release does.
fn nearest_release(archs: &[Arch], cuda: CudaVersion) -> String {
    image::closest_cuda_for(archs, cuda)
        .map(|fit| {
            format!(
                " (CUDA {} compiles every planned arch)",
                fit.without_patch()
            )
        })
        .unwrap_or_default()
}

/// The native backend compiles with the host's toolkit: its CUDA must be the one asked
/// for (unless allowed otherwise), and it must compile every arch — by its own
/// `--list-gpu-arch` when it answers, else by the support table.
fn check_toolkit(
    toolkit: &Toolkit,
    cuda: CudaVersion,
    origin: CudaOrigin,
    allow_mismatch: bool,
    archs: &[Arch],
) -> Result<()> {
    if toolkit.cuda.major_minor() != cuda.major_minor() && !allow_mismatch {
        return Err(ToolkitConflict::Version {
            home: toolkit.cuda_home.display().to_string(),
            toolkit: toolkit.cuda,
            toolkit_mm: toolkit.cuda.without_patch().to_string(),
            wanted: cuda,
            origin: match origin {
                CudaOrigin::Flag => "--cuda",
                CudaOrigin::Libtorch => "the libtorch's NCCL was built with it",
                CudaOrigin::Default => "fdl's default",
            }
            .to_string(),
        }
        .into());
    }
    match &toolkit.gpu_archs {
        Some(offered) => {
            if let Some(&arch) = archs.iter().find(|a| !offered.contains(a)) {
                return Err(ToolkitConflict::Arch {
                    nvcc: toolkit.nvcc.display().to_string(),
                    toolkit: toolkit.cuda,
                    arch,
                    nearest: nearest_release(archs, toolkit.cuda),
                    offered: offered
                        .iter()
                        .map(|a| a.to_string())
                        .collect::<Vec<_>>()
                        .join(" "),
                }
                .into());
            }
            Ok(())
        }
        // Only toolkits older than CUDA 11 cannot list their archs; then the table judges.
        None => arch::check_archs_for_cuda(archs, toolkit.cuda).map_err(|e| match e {
            arch::ArchCudaError::Unknown { arch } => anyhow::anyhow!(
                "nvcc at {} (CUDA {}) does not answer --list-gpu-arch, and fdl's table does not know {arch}: point --cuda-home at a toolkit whose `nvcc --list-gpu-arch` lists {arch}",
                toolkit.nvcc.display(),
                toolkit.cuda
            ),
            conflict => conflict.into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docker(p: &BuildPlan) -> &DockerPlan {
        match &p.backend {
            BackendPlan::Docker(d) => d,
            other => panic!("not a Docker plan: {other:?}"),
        }
    }

    fn native(p: &BuildPlan) -> &NativePlan {
        match &p.backend {
            BackendPlan::Native(n) => n,
            other => panic!("not a native plan: {other:?}"),
        }
    }

    fn docker_args(p: &BuildPlan) -> BTreeMap<String, String> {
        docker(p).build_args.iter().cloned().collect()
    }

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
            backend: BackendInputs::Docker {
                dockerfile: DockerfileSpec::Embedded {
                    sha256: "abc".into(),
                },
                base_image: None,
                source: DockerSource::Clone,
                probe: None,
                volumes: VolumesFlag::Auto,
                storage_driver: None,
            },
            backend_reason: "test".into(),
            ptx: false,
            only_funcs: None,
            warnings: Vec::new(),
        }
    }

    /// Docker inputs with `--base-image` and the given probe answer and source.
    fn probed_inputs(archs: &[Arch], probe: ImageProbe, source: DockerSource) -> PlanInputs {
        let mut i = inputs("v2.27.5-1", archs);
        i.backend = BackendInputs::Docker {
            dockerfile: DockerfileSpec::Embedded {
                sha256: "abc".into(),
            },
            base_image: Some(probe.image.clone()),
            source,
            probe: Some(probe),
            volumes: VolumesFlag::Auto,
            storage_driver: None,
        };
        i
    }

    fn probe(missing: &[&str], apt: bool) -> ImageProbe {
        ImageProbe {
            image: "mirror.local/cuda:13.5".into(),
            cuda_home: Some("/opt/nvidia/cu13".into()),
            cuda: Some("13.5.37".parse().unwrap()),
            gpu_archs: Some(vec![Arch::new(7, 5), Arch::new(8, 6), Arch::new(12, 0)]),
            missing: missing.iter().map(|m| m.to_string()).collect(),
            apt,
            dirs: vec!["usr".into(), "opt".into()],
        }
    }

    fn context() -> DockerSource {
        DockerSource::Context {
            path: PathBuf::from("/src/nccl-2.27.5"),
            version: "2.27.5".parse().unwrap(),
        }
    }

    #[test]
    fn a_probed_image_decides_the_cuda_and_must_compile_every_arch() {
        let p = BuildPlan::new(probed_inputs(
            &[Arch::new(8, 6)],
            probe(&[], true),
            context(),
        ))
        .unwrap();
        assert_eq!(p.cuda.to_string(), "13.5.37");
        assert!(p.findings.problems.is_empty(), "{:?}", p.findings.problems);
        assert!(docker(&p)
            .build_args
            .contains(&("CUDA_VERSION".into(), "13.5.37".into())));

        let p = BuildPlan::new(probed_inputs(
            &[Arch::new(6, 1), Arch::new(8, 6)],
            probe(&[], true),
            context(),
        ))
        .unwrap();
        assert_eq!(p.findings.problems.len(), 1, "{:?}", p.findings.problems);
        assert!(
            p.findings.problems[0]
                .to_string()
                .contains("cannot compile sm_61"),
            "{:?}",
            p.findings.problems
        );

        let mut i = probed_inputs(&[Arch::new(8, 6)], probe(&[], true), context());
        i.cuda_flag = Some("12.8".parse().unwrap());
        let p = BuildPlan::new(i).unwrap();
        assert!(
            p.findings.problems[0]
                .to_string()
                .contains("holds CUDA 13.5.37, but --cuda asks for 12.8"),
            "{:?}",
            p.findings.problems
        );

        let mut none = probe(&[], true);
        none.cuda_home = None;
        let p = BuildPlan::new(probed_inputs(&[Arch::new(8, 6)], none, context())).unwrap();
        assert!(
            p.findings.problems[0].to_string().contains("has no nvcc"),
            "{:?}",
            p.findings.problems
        );
    }

    /// The advice to cover more archs names what this plan's compiler lacks: a probed
    /// image by its own `--list-gpu-arch`, fdl's chosen image only when --cuda pins it, an
    /// unprobed `--base-image` never (its CUDA is not known), and a set no one release
    /// compiles as such.
    #[test]
    fn the_toolchain_gap_is_judged_as_the_plan_judges_its_own_archs() {
        let pascal = [Arch::new(6, 1), Arch::new(8, 6)];
        let p = BuildPlan::new(probed_inputs(
            &[Arch::new(8, 6)],
            probe(&[], true),
            context(),
        ))
        .unwrap();
        assert_eq!(p.toolchain_gap(&[Arch::new(8, 6), Arch::new(12, 0)]), None);
        let gap = p.toolchain_gap(&pascal).unwrap();
        assert!(
            gap.contains(
                "an image of CUDA 12.9 as --base-image (or no --base-image and --cuda 12.9)"
            ) && gap.contains(
                "--base-image mirror.local/cuda:13.5 (CUDA 13.5.37) cannot compile sm_61"
            ),
            "{gap}"
        );
        let mut unprobed = probed_inputs(&[Arch::new(8, 6)], probe(&[], true), context());
        if let BackendInputs::Docker { probe, .. } = &mut unprobed.backend {
            *probe = None;
        }
        assert_eq!(
            BuildPlan::new(unprobed).unwrap().toolchain_gap(&pascal),
            None
        );

        let chosen = BuildPlan::new(inputs("v2.27.5-1", &[Arch::new(12, 0)])).unwrap();
        assert_eq!(
            chosen.toolchain_gap(&pascal),
            None,
            "fdl picks the CUDA for the archs"
        );
        let mut pinned = inputs("v2.27.5-1", &[Arch::new(12, 0)]);
        pinned.cuda_flag = Some(CudaVersion::new(13, 0));
        let pinned = BuildPlan::new(pinned).unwrap();
        assert_eq!(
            pinned
                .toolchain_gap(&[Arch::new(6, 1), Arch::new(12, 0)])
                .as_deref(),
            Some(" with --cuda 12.9: CUDA 13.0 (--cuda) cannot compile sm_61")
        );
        // Kepler and Blackwell: no one release compiles both.
        let gap = chosen
            .toolchain_gap(&[Arch::new(3, 5), Arch::new(12, 0)])
            .unwrap();
        assert!(
            gap.contains("no one CUDA release compiles sm_35 sm_120 together"),
            "{gap}"
        );
    }

    #[test]
    fn only_a_complete_image_builds_its_toolchain_without_network_and_the_compile_never_has_it() {
        let net = |probe: ImageProbe, source: DockerSource| {
            let p = BuildPlan::new(probed_inputs(&[Arch::new(8, 6)], probe, source)).unwrap();
            let d = docker(&p).clone();
            (d.network, d.network_reason, p.findings.problems)
        };
        let (network, why, problems) = net(probe(&["git"], false), context());
        assert_eq!(network.as_deref(), Some("none"), "{why}");
        assert!(
            problems.is_empty(),
            "git is not needed in the image: {problems:?}"
        );
        // Fetching the tag happens on the host: the image needs no git for it either.
        let (network, why, problems) = net(probe(&["git"], false), DockerSource::Clone);
        assert_eq!(network.as_deref(), Some("none"), "{why}");
        assert!(problems.is_empty(), "{problems:?}");

        let (network, why, problems) = net(probe(&["python3"], true), context());
        assert_eq!(network, None);
        assert!(why.contains("lacks python3, which apt installs"), "{why}");
        assert!(problems.is_empty(), "{problems:?}");

        let (network, _, problems) = net(probe(&["python3", "g++"], false), context());
        assert_eq!(network, None);
        assert!(
            problems[0]
                .to_string()
                .contains("lacks g++, python3 and has no apt-get"),
            "{problems:?}"
        );

        // The flag reaches the image build only when the plan says so; every compile
        // container runs without network, read-only, as the invoking user, with the
        // source mounted read-only.
        let p = BuildPlan::new(probed_inputs(
            &[Arch::new(8, 6)],
            probe(&[], true),
            context(),
        ))
        .unwrap();
        let steps = DockerSteps::new(docker(&p), 4, &Paths::placeholders(DockerSteps::PATHS), &[]);
        assert!(steps.build.render().contains(" --network none "));
        let p = BuildPlan::new(inputs("v2.27.5-1", &[Arch::new(8, 6)])).unwrap();
        let steps = DockerSteps::new(docker(&p), 4, &Paths::placeholders(DockerSteps::PATHS), &[]);
        assert!(!steps.build.render().contains("--network"));
        for run in [&steps.count, &steps.compile, &steps.install] {
            let text = run.render();
            for want in [
                "run --rm --interactive --name '<container>-",
                " --label 'fdl.owner=<owner>' ",
                " --network none --read-only --user '<user>' ",
                "'type=bind,source=<source>,target=/fdl/src,readonly'",
                "'type=bind,source=<work>,target=/fdl/work' ",
                "'type=bind,source=<staging>,target=/fdl/prefix' ",
                " TMPDIR=/fdl/work/tmp ",
                " -C /fdl/src ",
                " BUILDDIR=/fdl/work/build ",
                " '-j4' ",
            ] {
                let want = want.replace("'-j4'", "-j4");
                assert!(text.contains(&want), "{want} not in {text}");
            }
        }
        assert!(steps.count.render().contains(" -n -j4 src.build "));
        assert!(steps
            .install
            .render()
            .contains(" install BUILDDIR=/fdl/work/build PREFIX=/fdl/prefix NVCC_GENCODE="));
    }

    #[test]
    fn a_docker_plan_without_the_new_fields_reads_as_a_clone() {
        let p = BuildPlan::new(inputs("v2.27.5-1", &[Arch::new(8, 6)])).unwrap();
        let mut v = serde_json::to_value(&p).unwrap();
        let d = v["docker"].as_object_mut().unwrap();
        for key in ["source", "probe", "network", "network_reason"] {
            d.remove(key);
        }
        let back: BuildPlan = serde_json::from_value(v).unwrap();
        assert_eq!(docker(&back).source, DockerSource::Clone);
        assert_eq!(back.identity(), p.identity());
    }

    fn native_inputs(
        tag: &str,
        archs: &[Arch],
        toolkit_cuda: &str,
        offered: Option<&[Arch]>,
    ) -> PlanInputs {
        let mut i = inputs(tag, archs);
        i.backend = BackendInputs::Native {
            toolkit: Toolkit {
                cuda_home: PathBuf::from("/opt/cuda"),
                nvcc: PathBuf::from("/opt/cuda/bin/nvcc"),
                cuda: toolkit_cuda.parse().unwrap(),
                gpu_archs: offered.map(<[Arch]>::to_vec),
                lib_dir: PathBuf::from("/opt/cuda/lib64"),
            },
            tools: BTreeMap::new(),
            source: NativeSource::Clone {
                repo: "repo".into(),
                cache_dir: PathBuf::from("/c"),
            },
            allow_cuda_mismatch: false,
        };
        i
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
        assert_eq!(docker(&p).image, "flodl-nccl-toolchain:cuda12.8");
        assert_eq!(p.cuda_origin, CudaOrigin::Default);
        assert_eq!(
            docker(&p).base_image.as_deref(),
            Some("nvidia/cuda:12.8.1-devel-ubuntu22.04")
        );
        let args = docker_args(&p);
        assert_eq!(args["TOOLS"], "make g++ python3");
        assert_eq!(args["CUDA_VERSION"], "12.8.1");
        assert_eq!(args["BASE_IMAGE"], "nvidia/cuda:12.8.1-devel-ubuntu22.04");
        let vars: BTreeMap<_, _> = docker(&p).make_vars.iter().cloned().collect();
        assert_eq!(
            vars["NVCC_GENCODE"],
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
        // A pinned CUDA that cannot compile an arch is a problem the plan carries (a dry
        // run shows it with the plan), not a plan that never forms.
        i.cuda_flag = Some(CudaVersion::new(13, 0));
        let p = BuildPlan::new(i).unwrap();
        assert_eq!(p.cuda, CudaVersion::new(13, 0));
        let err = p
            .findings
            .problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n");
        assert!(err.contains("sm_61") && err.contains("12.9"), "{err}");
    }

    /// A CUDA without a known image still plans: with the newest older image of its
    /// major that fits, or, when none does, as a plan whose problem names the way out.
    #[test]
    fn cuda_without_a_known_image_still_plans() {
        let mut i = inputs("v2.30.7-1", &[Arch::new(8, 0)]);
        i.cuda_from_libtorch = Some(CudaVersion::new(13, 3));
        let p = BuildPlan::new(i.clone()).unwrap();
        assert_eq!(p.cuda.to_string(), "13.2.0");
        assert!(p.cuda_note.as_deref().unwrap().contains("CUDA 13.3"));
        assert!(p.findings.problems.is_empty());
        let args = docker_args(&p);
        assert_eq!(args["BASE_IMAGE"], "nvidia/cuda:13.2.0-devel-ubuntu24.04");
        assert_eq!(args["CUDA_VERSION"], "13.2.0");

        // --base-image overrides the choice; its CUDA is the one asked for.
        if let BackendInputs::Docker { base_image, .. } = &mut i.backend {
            *base_image = Some("mirror.local:5000/cuda:13.3-devel".into());
        }
        let p = BuildPlan::new(i).unwrap();
        assert_eq!(p.cuda.to_string(), "13.3");
        assert_eq!(
            docker_args(&p)["BASE_IMAGE"],
            "mirror.local:5000/cuda:13.3-devel"
        );

        // Pascal under CUDA 13: the closest release that compiles both archs, said so.
        let mut i = inputs("v2.30.7-1", &MIXED);
        i.cuda_from_libtorch = Some(CudaVersion::new(13, 3));
        let p = BuildPlan::new(i.clone()).unwrap();
        assert_eq!(p.cuda.to_string(), "12.9");
        assert!(p
            .cuda_note
            .as_deref()
            .unwrap()
            .contains("13.3 cannot compile every planned arch"));
        assert_eq!(
            docker_args(&p)["BASE_IMAGE"],
            "nvidia/cuda:12.9.1-devel-ubuntu22.04"
        );
        // --cuda pins it: then nothing fits, and the plan says so and how to go on.
        i.cuda_flag = Some(CudaVersion::new(13, 3));
        let p = BuildPlan::new(i.clone()).unwrap();
        assert_eq!(p.findings.problems.len(), 1, "{:?}", p.findings.problems);
        assert!(
            p.findings.problems[0]
                .to_string()
                .contains("--cuda 12.8 or 12.9"),
            "{:?}",
            p.findings.problems
        );
        assert!(!docker_args(&p).contains_key("BASE_IMAGE"));
        // A user's own Dockerfile picks its own base: no problem to report.
        i.backend = BackendInputs::Docker {
            dockerfile: DockerfileSpec::File {
                path: PathBuf::from("/d/Dockerfile"),
                sha256: "abc".into(),
            },
            base_image: None,
            source: DockerSource::Clone,
            probe: None,
            volumes: VolumesFlag::Auto,
            storage_driver: None,
        };
        assert!(BuildPlan::new(i).unwrap().findings.problems.is_empty());
    }

    #[test]
    fn identity_ignores_jobs_and_names_differences() {
        let a = BuildPlan::new(inputs("v2.27.5-1", &MIXED)).unwrap();
        let mut i = inputs("v2.27.5-1", &MIXED);
        i.jobs = 1;
        assert!(a.differences(&BuildPlan::new(i).unwrap()).is_empty());
        let mut i = inputs("v2.27.5-2", &MIXED);
        i.cuda_flag = Some(CudaVersion::new(12, 9));
        let d = BuildPlan::new(i).unwrap().differences(&a);
        assert!(d.iter().any(|s| s.starts_with("tag:")), "{d:?}");
        // Each side named as it is: the existing build's value first.
        assert!(
            d.contains(&"cuda: existing build has 12.8, this plan has 12.9".to_string()),
            "{d:?}"
        );
        // Archs are named as everywhere else, not as in a build's directory name.
        let one = BuildPlan::new(inputs("v2.27.5-1", &[Arch::new(8, 6)])).unwrap();
        assert!(
            one.differences(&a).contains(
                &"archs: existing build has sm_61 sm_120, this plan has sm_86".to_string()
            ),
            "{:?}",
            one.differences(&a)
        );
    }

    /// Volumes where the driver is fuse-overlayfs or the flag says so; the image
    /// otherwise, an unknown driver included. The choice never makes a plan different:
    /// the compile reads the same files.
    #[test]
    fn toolchain_volumes_follow_the_flag_then_the_storage_driver() {
        let choose = |flag, driver: Option<&str>| toolchain_files(flag, driver).0;
        use ToolchainFiles::{Image, Volumes};
        assert_eq!(choose(VolumesFlag::Auto, Some("fuse-overlayfs")), Volumes);
        for fast in ["overlay2", "btrfs", "zfs", "vfs", "a-driver-of-2030"] {
            assert_eq!(choose(VolumesFlag::Auto, Some(fast)), Image, "{fast}");
        }
        assert_eq!(choose(VolumesFlag::Auto, None), Image);
        assert_eq!(choose(VolumesFlag::Always, Some("overlay2")), Volumes);
        assert_eq!(choose(VolumesFlag::Never, Some("fuse-overlayfs")), Image);

        let with = |flag, driver: &str| {
            let mut i = inputs("v2.27.5-1", &MIXED);
            if let BackendInputs::Docker {
                volumes,
                storage_driver,
                ..
            } = &mut i.backend
            {
                *volumes = flag;
                *storage_driver = Some(driver.to_string());
            }
            BuildPlan::new(i).unwrap()
        };
        let a = with(VolumesFlag::Auto, "fuse-overlayfs");
        let b = with(VolumesFlag::Never, "fuse-overlayfs");
        assert_eq!(docker(&a).toolchain_files, Volumes);
        assert_eq!(docker(&b).toolchain_files, Image);
        assert!(a.differences(&b).is_empty());
        // The volumes reach the compile's `docker run`s as read-only mounts.
        let paths = Paths::placeholders(DockerSteps::PATHS);
        let vols = [("v-usr".to_string(), "/usr".to_string())];
        let steps = DockerSteps::new(docker(&a), 2, &paths, &vols);
        for step in [&steps.count, &steps.compile, &steps.install] {
            assert!(
                step.render()
                    .contains("--mount type=volume,source=v-usr,target=/usr,readonly"),
                "{}",
                step.render()
            );
        }
        assert!(!steps.build.render().contains("type=volume"));
    }

    /// The JSON keeps the manifests' shape (`backend` beside its section), and a plan
    /// naming one backend with the other's section, or both, does not read.
    #[test]
    fn backend_sections_read_only_when_they_agree() {
        let p = BuildPlan::new(inputs("v2.27.5-1", &MIXED)).unwrap();
        let mut v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["backend"], "docker");
        assert!(v["docker"].is_object() && v.get("native").is_none());
        v["backend"] = "native".into();
        assert!(serde_json::from_value::<BuildPlan>(v).is_err());
    }

    #[test]
    fn plan_round_trips_through_json() {
        let p = BuildPlan::new(inputs("master", &MIXED)).unwrap();
        assert_eq!(p.name, "master-sm61-sm120");
        let back: BuildPlan = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn ptx_and_only_funcs_mark_the_name() {
        let mut i = inputs("v2.27.5-1", &MIXED);
        i.ptx = true;
        let p = BuildPlan::new(i).unwrap();
        assert_eq!(p.name, "v2.27.5-sm61-sm120-ptx");
        assert!(p
            .gencode
            .ends_with("-gencode=arch=compute_120,code=compute_120"));
        let mut i = inputs("v2.27.5-1", &MIXED);
        i.only_funcs = Some("AllReduce Sum f32".into());
        let p = BuildPlan::new(i).unwrap();
        assert!(p.name.starts_with("v2.27.5-sm61-sm120-only-"), "{}", p.name);
        let vars: BTreeMap<_, _> = docker(&p).make_vars.iter().cloned().collect();
        assert_eq!(vars["ONLY_FUNCS"], "AllReduce Sum f32");
        let full = BuildPlan::new(inputs("v2.27.5-1", &MIXED)).unwrap();
        assert!(full
            .differences(&p)
            .iter()
            .any(|d| d.starts_with("only_funcs:")));
        let mut i = inputs("v2.27.5-1", &MIXED);
        i.only_funcs = Some("  ".into());
        assert!(BuildPlan::new(i)
            .unwrap_err()
            .to_string()
            .contains("--only-funcs is empty"));
    }

    #[test]
    fn native_toolkit_must_match_and_compile_every_arch() {
        let p = BuildPlan::new(native_inputs("v2.27.5-1", &MIXED, "12.8.93", None)).unwrap();
        assert_eq!(p.backend.kind(), BackendKind::Native);
        let vars: BTreeMap<_, _> = native(&p).make_vars.iter().cloned().collect();
        assert_eq!(vars["CUDA_HOME"], "/opt/cuda");

        // Without --cuda the toolkit's own release is used, and said.
        let p = BuildPlan::new(native_inputs("v2.27.5-1", &MIXED, "12.9.1", None)).unwrap();
        assert_eq!(p.cuda.to_string(), "12.9.1");
        assert!(p
            .cuda_note
            .as_deref()
            .unwrap()
            .contains("uses the toolkit's"));
        // --cuda insists: a toolkit of another release is refused unless allowed.
        let mut pinned = native_inputs("v2.27.5-1", &MIXED, "12.9.1", None);
        pinned.cuda_flag = Some(CudaVersion::new(12, 8));
        let err = BuildPlan::new(pinned)
            .unwrap()
            .findings
            .problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            err.contains("is CUDA 12.9.1, but the build asks for CUDA 12.8"),
            "{err}"
        );
        let mut allowed = native_inputs("v2.27.5-1", &MIXED, "12.9.1", None);
        allowed.cuda_flag = Some(CudaVersion::new(12, 8));
        if let BackendInputs::Native {
            allow_cuda_mismatch,
            ..
        } = &mut allowed.backend
        {
            *allow_cuda_mismatch = true;
        }
        assert!(BuildPlan::new(allowed)
            .unwrap()
            .findings
            .problems
            .is_empty());

        let offered = [Arch::new(7, 5), Arch::new(12, 0)];
        let err = BuildPlan::new(native_inputs(
            "v2.27.5-1",
            &MIXED,
            "12.8.93",
            Some(&offered),
        ))
        .unwrap()
        .findings
        .problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n");
        assert!(err.contains("cannot compile sm_61"), "{err}");
        assert!(err.contains("sm_75 sm_120"), "{err}");

        // The toolkit's own list admits archs fdl's table has never heard of.
        let sm107 = [Arch::new(8, 6), Arch::new(10, 7)];
        let offered = [Arch::new(8, 6), Arch::new(10, 7), Arch::new(12, 0)];
        let p = BuildPlan::new(native_inputs(
            "v2.32.3-1",
            &sm107,
            "12.8.93",
            Some(&offered),
        ))
        .unwrap();
        assert_eq!(p.archs, sm107);
        assert!(p.findings.problems.is_empty(), "{:?}", p.findings.problems);
        let err = BuildPlan::new(native_inputs("v2.32.3-1", &sm107, "12.8.93", None))
            .unwrap()
            .findings
            .problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n");
        assert!(err.contains("does not answer --list-gpu-arch"), "{err}");
    }
}
