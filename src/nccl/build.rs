//! `fdl nccl build` as a pipeline: gather inputs → [`BuildPlan`] → backend → staged,
//! checked, all-or-nothing install → [`Outcome`].

use crate::arch::{self, Arch};
use crate::gpu::{self, Gpu, GpuError};
use crate::inspect;
use crate::libtorch::Libtorch;
use crate::nccl::plan::{ArchOrigin, BuildPlan, DockerfileSpec, PlanInputs, TagOrigin};
use crate::nccl::store::{BuildStore, Existing, Manifest};
use crate::nccl::tag::Tag;
use crate::process;
use crate::project::Project;
use crate::version::CudaVersion;
use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Produces an NCCL install tree (lib/, include/) in `staging` as the plan says.
pub trait Backend {
    fn build(&self, plan: &BuildPlan, staging: &Path) -> Result<()>;
}

/// The user's flags, unvalidated.
#[derive(Debug, Clone, Default)]
pub struct BuildRequest {
    pub tag: Option<String>,
    pub archs: Option<String>,
    pub cuda: Option<String>,
    pub jobs: Option<u32>,
    pub dockerfile: Option<PathBuf>,
}

/// Where the inputs come from besides flags; tests swap the GPU source.
pub struct Sources<'a> {
    pub project: &'a Project,
    pub gpus: &'a dyn Fn() -> Result<Vec<Gpu>, GpuError>,
    pub embedded_dockerfile: &'a str,
}

/// Validates the flags, infers what they leave open, and returns the plan plus the
/// Dockerfile text the plan's digest covers. Flags are checked before anything slower
/// (reading libtorch, running nvidia-smi), so a typo fails fast.
pub fn plan(req: &BuildRequest, src: &Sources) -> Result<(BuildPlan, String)> {
    let tag_flag = req.tag.as_deref().map(Tag::parse).transpose()?;
    let archs_flag = req
        .archs
        .as_deref()
        .map(arch::parse_arch_list)
        .transpose()?;
    let cuda_flag = req
        .cuda
        .as_deref()
        .map(str::parse::<CudaVersion>)
        .transpose()?;
    if req.jobs == Some(0) {
        bail!("--jobs must be at least 1");
    }
    let (dockerfile, dockerfile_text) = match &req.dockerfile {
        None => (
            DockerfileSpec::Embedded {
                sha256: sha256_hex(src.embedded_dockerfile.as_bytes()),
            },
            src.embedded_dockerfile.to_string(),
        ),
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| {
                format!(
                    "cannot read --dockerfile {}: give the path of a readable Dockerfile",
                    path.display()
                )
            })?;
            let path = std::path::absolute(path).unwrap_or_else(|_| path.clone());
            (
                DockerfileSpec::File {
                    path,
                    sha256: sha256_hex(text.as_bytes()),
                },
                text,
            )
        }
    };

    let (tag, tag_origin, cuda_from_libtorch) = match tag_flag {
        Some(t) => (t, TagOrigin::Flag, None),
        None => infer_tag(src.project)?,
    };

    let (archs, arch_origin) = match archs_flag {
        Some(a) => (a, ArchOrigin::Flag),
        None => {
            let gpus = (src.gpus)()?;
            (archs_of_gpus(&gpus)?, ArchOrigin::Gpus { gpus })
        }
    };

    let (jobs, jobs_reason) = match req.jobs {
        Some(j) => (j, "from --jobs".to_string()),
        None => default_jobs(),
    };

    let plan = BuildPlan::new(PlanInputs {
        tag,
        tag_origin,
        cuda_flag,
        cuda_from_libtorch,
        archs,
        arch_origin,
        jobs,
        jobs_reason,
        builds_dir: src.project.nccl_builds_dir(),
        dockerfile,
    })?;
    Ok((plan, dockerfile_text))
}

/// The tag and CUDA version from the active libtorch's NCCL self-id.
fn infer_tag(project: &Project) -> Result<(Tag, TagOrigin, Option<CudaVersion>)> {
    let lt = Libtorch::new(project.libtorch_dir());
    let variant = lt.active()?;
    let lib = variant.libtorch_cuda();
    let meta = std::fs::metadata(&lib).map_err(|_| {
        anyhow!(
            "the active libtorch '{}' has no {}: is the variant complete? Pass --tag to name the NCCL version yourself",
            variant.name,
            lib.display()
        )
    })?;
    if meta.len() == 0 {
        bail!(
            "{} is empty (0 bytes): a broken or interrupted download? Reinstall the variant, or pass --tag",
            lib.display()
        );
    }
    let id = inspect::find_nccl_self_id(&lib)
        .with_context(|| format!("cannot read the NCCL version from {}", lib.display()))?
        .ok_or_else(|| {
            anyhow!(
                "no NCCL self-identification ('NCCL version X.Y.Z+cudaA.B') found in {}; it may be truncated or not carry NCCL. Pass --tag, e.g. --tag v2.27.5-1",
                lib.display()
            )
        })?;
    Ok((
        Tag::for_release(&id.nccl),
        TagOrigin::Libtorch {
            variant: variant.name,
            library: lib,
            linkage: "static".into(),
        },
        Some(id.cuda),
    ))
}

fn archs_of_gpus(gpus: &[Gpu]) -> Result<Vec<Arch>> {
    let archs = gpu::distinct_archs(gpus);
    for a in &archs {
        if !a.is_known() {
            bail!(
                "GPU compute capability {} (from nvidia-smi) is not one fdl knows how to build for; name the architectures with --archs",
                a.capability()
            );
        }
    }
    Ok(archs)
}

/// Parallel nvcc jobs: one per core, but no more than one per ~2 GiB of available memory
/// (NCCL's device code compiles take up to that each).
pub fn default_jobs() -> (u32, String) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    const PER_JOB_KIB: u64 = 2 * 1024 * 1024;
    match available_memory_kib() {
        Some(kib) => {
            let by_mem = ((kib / PER_JOB_KIB) as u32).max(1);
            let jobs = cores.min(by_mem);
            (
                jobs,
                format!(
                    "{cores} cores, {:.1} GiB available at ~2 GiB per nvcc job",
                    kib as f64 / (1024.0 * 1024.0)
                ),
            )
        }
        None => (cores, format!("{cores} cores (available memory unknown)")),
    }
}

fn available_memory_kib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[derive(Debug)]
pub enum Outcome {
    Built {
        manifest: Box<Manifest>,
        dir: PathBuf,
        replaced: bool,
    },
    AlreadyBuilt {
        manifest: Box<Manifest>,
        dir: PathBuf,
    },
}

/// Runs the plan: compares with what is installed, builds into staging, checks, seals and
/// commits. Any error before the commit leaves the store exactly as it was.
pub fn execute(
    plan: &BuildPlan,
    backend: &dyn Backend,
    store: &BuildStore,
    force: bool,
) -> Result<Outcome> {
    let dir = store.path_of(&plan.name);
    let existing = store.existing(&plan.name)?;
    match &existing {
        Some(Existing::Build(m)) if !force => {
            let diff = m.plan.differences(plan);
            if diff.is_empty() {
                return Ok(Outcome::AlreadyBuilt {
                    manifest: m.clone(),
                    dir,
                });
            }
            bail!(
                "{} already holds a build from a different plan:\n  {}\nPass --force to replace it (the old build is kept until the new one succeeds)",
                dir.display(),
                diff.join("\n  ")
            );
        }
        Some(Existing::NotABuild(why)) if !force => bail!(
            "{} exists but is not an fdl build ({why}). Move it away, or pass --force to replace it once the new build succeeds",
            dir.display()
        ),
        _ => {}
    }
    let staging = store.begin(&plan.name)?;
    backend.build(plan, staging.path())?;
    let manifest = staging
        .seal(plan)
        .context("the build finished but its output failed the check; nothing was installed")?;
    // A Ctrl-C that lands after the last child exited still means "do not install".
    if process::interrupted() {
        return Err(process::Interrupted.into());
    }
    staging.commit(existing.is_some())?;
    Ok(Outcome::Built {
        manifest: Box::new(manifest),
        dir,
        replaced: existing.is_some(),
    })
}
