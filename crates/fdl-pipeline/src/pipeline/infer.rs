//! Inferring what the flags leave open (the tag and CUDA from the active libtorch, the
//! archs from the GPUs) and making the plan from it: the pure first half of the build.

use crate::arch::{self, Arch};
use crate::gpu::{self, Gpu, GpuError};
use crate::inspect;
use crate::libtorch::Libtorch;
use crate::loader::python::ProcessKind;
use crate::nccl::finding::Finding;
use crate::nccl::plan::{ArchOrigin, BackendInputs, BuildPlan, PlanInputs, TagOrigin};
use crate::nccl::tag::Tag;
use crate::project::Project;
use crate::version::CudaVersion;
use anyhow::{anyhow, bail, Context, Result};

/// The user's flags common to every backend, unvalidated.
#[derive(Debug, Clone, Default)]
pub struct BuildRequest {
    pub tag: Option<String>,
    pub archs: Option<String>,
    pub cuda: Option<String>,
    pub jobs: Option<u32>,
    pub ptx: bool,
    pub only_funcs: Option<String>,
    /// Infer the tag for this kind of process (default: the variant's).
    pub process: Option<ProcessKind>,
}

/// Where the inputs come from besides flags; tests swap the GPU source.
pub struct Sources<'a> {
    pub project: &'a Project,
    pub gpus: &'a dyn Fn() -> Result<Vec<Gpu>, GpuError>,
    /// This host's driver, which a build for this host must be able to run.
    pub driver: &'a dyn Fn() -> Result<gpu::Driver, GpuError>,
}

/// The flags checked before anything slow runs, so a typo fails fast.
pub struct CheckedFlags {
    pub tag: Option<Tag>,
    pub archs: Option<Vec<Arch>>,
    pub cuda: Option<CudaVersion>,
    /// `--ptx`, or `+PTX` on the highest arch of `--archs` (the same request).
    pub ptx: bool,
    pub process: Option<ProcessKind>,
}

pub fn check_flags(req: &BuildRequest) -> Result<CheckedFlags> {
    let tag = req.tag.as_deref().map(Tag::parse_flag).transpose()?;
    let (archs, ptx_in_archs) = match req.archs.as_deref().map(arch::parse_build_archs) {
        Some(parsed) => {
            let (archs, ptx) = parsed?;
            (Some(archs), ptx)
        }
        None => (None, false),
    };
    let cuda = req
        .cuda
        .as_deref()
        .map(str::parse::<CudaVersion>)
        .transpose()?;
    if let Some(expr) = &req.only_funcs {
        crate::nccl::only_funcs::check(expr)?;
    }
    if req.jobs == Some(0) {
        bail!("--jobs must be at least 1");
    }
    if let Some(j) = req.jobs.filter(|&j| j > MAX_JOBS) {
        bail!("--jobs {j} is more than any machine can run ({MAX_JOBS} at most); each nvcc job of NCCL takes up to ~2 GiB. Leave --jobs out to size it to this machine");
    }
    Ok(CheckedFlags {
        tag,
        archs,
        cuda,
        ptx: req.ptx || ptx_in_archs,
        process: req.process,
    })
}

/// What the flags, the active libtorch and the GPUs say, before a backend is chosen
/// (choosing one needs the tag: a native source tree is checked against it).
#[derive(Debug)]
pub struct Inferred {
    pub tag: Tag,
    pub tag_origin: TagOrigin,
    pub cuda_flag: Option<CudaVersion>,
    pub cuda_from_libtorch: Option<CudaVersion>,
    pub archs: Vec<Arch>,
    pub arch_origin: ArchOrigin,
    pub warnings: Vec<Finding>,
    /// This host's GPUs that `--archs` leaves out: warned of once the plan knows its
    /// toolchain, so the advice names what else covering them needs.
    pub left_out: Vec<gpu::Gpu>,
    /// The driver of the host the build is for, when that is this host: the plan's CUDA
    /// is checked against it. `None` for a cluster's build, whose workers' drivers
    /// `cluster status` and `cluster plan` judge.
    pub host_driver: Option<Result<gpu::Driver, GpuError>>,
    /// The active libtorch's `libtorch_cuda.so`, when the build is for this host: the
    /// plan says which NCCL plugins a preloaded build would stop finding for it. `None`
    /// for a cluster's build, whose workers' plugins `cluster status` judges.
    pub plugin_caller: Option<std::path::PathBuf>,
}

/// Infers what the flags leave open: the tag (and CUDA) from the active libtorch, the
/// archs from the GPUs.
pub fn infer(flags: CheckedFlags, src: &Sources) -> Result<Inferred> {
    let CheckedFlags {
        tag: tag_flag,
        archs: archs_flag,
        cuda: cuda_flag,
        ptx: _,
        process,
    } = flags;
    let mut warnings = Vec::new();
    let (tag, tag_origin, cuda_from_libtorch) = match tag_flag {
        Some(t) => {
            warnings.extend(tag_against_libtorch(src.project, &t));
            (t, TagOrigin::Flag, None)
        }
        None => {
            let (tag, origin, cuda, said) = infer_tag(src.project, process)?;
            warnings.extend(said);
            (tag, origin, cuda)
        }
    };
    let (archs, arch_origin) = match archs_flag {
        Some(a) => (a, ArchOrigin::Flag),
        None => {
            let gpus = (src.gpus)().map_err(|e| anyhow!("{e}; {}", gpu::ARCHS_HINT))?;
            // Any capability the driver reports is planned; whether a toolkit can compile
            // it is the plan's question, not nvidia-smi's.
            (gpu::distinct_archs(&gpus), ArchOrigin::Gpus { gpus })
        }
    };
    warnings.extend(libtorch_gaps(src.project, &archs));
    let mut left_out = Vec::new();
    if arch_origin == ArchOrigin::Flag {
        // `--archs` is for other hosts too; this host's GPUs must still be named, or the
        // build (and `fdl nccl verify` here) will not cover them. No GPUs readable: no word.
        if let Ok(gpus) = (src.gpus)() {
            left_out = uncovered(&gpus, &archs);
        }
    }
    Ok(Inferred {
        tag,
        tag_origin,
        cuda_flag,
        cuda_from_libtorch,
        archs,
        arch_origin,
        warnings,
        left_out,
        host_driver: Some((src.driver)()),
        plugin_caller: Libtorch::new(src.project.libtorch_dir())
            .active()
            .ok()
            .map(|v| v.libtorch_cuda())
            .filter(|p| p.is_file()),
    })
}

/// This host's GPUs that no arch of `archs` has SASS for.
fn uncovered(gpus: &[gpu::Gpu], archs: &[Arch]) -> Vec<gpu::Gpu> {
    gpus.iter()
        .filter(|g| {
            !archs
                .iter()
                .any(|&a| crate::arch::GpuTarget::generic(a).sass_runs_on(g.compute_cap))
        })
        .cloned()
        .collect()
}

/// A warning for each of `gpus` the plan leaves out, with advice that would pass: the
/// `--archs` that covers it, and what else the plan's toolchain needs to compile them
/// (CUDA 13 cannot compile Pascal, say).
pub fn left_out(gpus: &[gpu::Gpu], plan: &BuildPlan) -> Vec<Finding> {
    gpus.iter()
        .map(|g| {
            let mut all: Vec<Arch> = plan.archs.clone();
            all.push(g.compute_cap);
            all.sort();
            all.dedup();
            Finding::GpuLeftOut {
                index: g.index,
                name: g.name.clone(),
                capability: g.compute_cap,
                toolchain: plan.toolchain_gap(&all),
                archs: all,
            }
        })
        .collect()
}

/// A `--tag` of another release than the active libtorch's NCCL: preloaded, the build
/// replaces that NCCL in every process of the libtorch, NCCL refuses a communicator whose
/// ranks run different versions (patch included, `src/init.cc`), and the libtorch may
/// call functions the other release lacks. Said, with the tag that matches; nothing is
/// said where the libtorch's NCCL is not known for certain.
fn tag_against_libtorch(project: &Project, tag: &Tag) -> Option<Finding> {
    let other = crate::nccl::pick::other_release(project, None, &tag.version()?)?;
    Some(Finding::OtherRelease {
        tag: tag.to_string(),
        why: other.to_string(),
        libtorch: other.libtorch,
        libtorch_nccl: other.libtorch_nccl,
    })
}

/// A new NCCL does not make training run on a GPU the libtorch itself has no code for
/// (the PyPI torch wheels have none for Pascal): say so, with the remedy.
fn libtorch_gaps(project: &Project, archs: &[Arch]) -> Vec<Finding> {
    let Ok(variant) = Libtorch::new(project.libtorch_dir()).active() else {
        return Vec::new();
    };
    let Ok(ins) = inspect::inspect(&variant.libtorch_cuda()) else {
        return Vec::new();
    };
    // A split build (torch ≤ 1.13) keeps its kernels in the libraries beside
    // libtorch_cuda.so: judged by them, as `fdl inspect` judges it.
    let followed = crate::loader::split::follow(&ins, &crate::loader::LoaderEnv::from_process())
        .filter(|f| f.found());
    let not_covered = |a: Arch| match &followed {
        Some(f) => matches!(f.coverage(a), Some(inspect::Verdict::NotCovered)),
        None => matches!(
            inspect::coverage(&ins.gpu_code, a),
            inspect::Verdict::NotCovered
        ),
    };
    if followed.is_none() && ins.gpu_code.is_empty() {
        return Vec::new(); // not a CUDA build of libtorch at all; nothing to judge by
    }
    archs
        .iter()
        .filter(|&&a| not_covered(a))
        .map(|&arch| Finding::LibtorchWithoutCode {
            libtorch: variant.name.clone(),
            arch,
        })
        .collect()
}

/// The plan, from what was inferred and the chosen backend's inputs.
pub fn plan(
    req: &BuildRequest,
    inferred: Inferred,
    builds_dir: std::path::PathBuf,
    backend: BackendInputs,
    backend_reason: String,
) -> Result<BuildPlan> {
    let (jobs, jobs_reason) = match req.jobs {
        Some(j) => (j, "from --jobs".to_string()),
        None => default_jobs(),
    };
    let left_out_gpus = inferred.left_out;
    let plugin_caller = inferred.plugin_caller;
    let mut plan = BuildPlan::new(PlanInputs {
        tag: inferred.tag,
        tag_origin: inferred.tag_origin,
        cuda_flag: inferred.cuda_flag,
        cuda_from_libtorch: inferred.cuda_from_libtorch,
        archs: inferred.archs,
        arch_origin: inferred.arch_origin,
        jobs,
        jobs_reason,
        builds_dir,
        backend,
        backend_reason,
        ptx: req.ptx,
        only_funcs: req.only_funcs.clone(),
        warnings: inferred.warnings,
    })?;
    let advice = left_out(&left_out_gpus, &plan);
    plan.findings.warnings.extend(advice);
    if let Some(lib) = &plugin_caller {
        let moved = plugins_moved(lib, &plan);
        plan.findings.warnings.extend(moved);
    }
    Ok(plan)
}

/// The plugins the active libtorch's NCCL loads today that the planned build, preloaded,
/// would not: each with the variable's value that keeps it, which `fdl nccl env` prints
/// too. Nothing to say when fdl cannot tell which NCCL runs today (the tag's inference
/// says so already).
fn plugins_moved(lib: &std::path::Path, plan: &BuildPlan) -> Vec<Finding> {
    let env = crate::loader::LoaderEnv::from_process();
    let var = |k: &str| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned());
    let build = plan.output_dir.join("lib").join("libnccl.so.2");
    match crate::loader::plugins::moved_by_preload(lib, &build, &env, &var) {
        Ok(moved) => moved
            .iter()
            .map(|m| Finding::PluginMoved {
                variable: m.variable.clone(),
                path: m.path.clone(),
                keep: m.keep.clone(),
                sentence: m.sentence(),
            })
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The tag and CUDA version from the active libtorch's NCCL self-id, and what the plan
/// must say about how it was found (a conditional answer, with its condition).
fn infer_tag(
    project: &Project,
    process: Option<ProcessKind>,
) -> Result<(Tag, TagOrigin, Option<CudaVersion>, Vec<Finding>)> {
    let lt = Libtorch::new(project.libtorch_dir());
    let variant = lt
        .active()
        .map_err(|e| anyhow!("{e:#}; or pass --tag to name the NCCL version yourself"))?;
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
    // The same answer as `fdl nccl detect` without a preload: static, pip-style through
    // libnccl.so.2, or the version the wheel's metadata pins when that is not installed.
    // For the process that runs it: a pip torch's is Python's, whose torch may open an
    // NCCL itself first, unless a program is asked about.
    let python = variant.python_torch(process)?;
    let process = variant.pip_torch().is_some().then(|| {
        if python.is_some() {
            ProcessKind::Python
        } else {
            ProcessKind::Program
        }
    });
    let bundled = crate::loader::bundled_nccl_for(
        &lib,
        python.as_deref(),
        &crate::loader::LoaderEnv::bundled(),
    )
    .with_context(|| {
        format!(
            "cannot read the NCCL version from {}; pass --tag to name it yourself",
            lib.display()
        )
    })?;
    let linkage_of = |found: &inspect::NcclDetection| match &found.linkage {
        inspect::Linkage::Static => "static".to_string(),
        inspect::Linkage::Dynamic { needed, via } => {
            format!("dynamic: {needed} = {} via {via}", found.file.display())
        }
        inspect::Linkage::Preload { entry } => format!("preload: {entry}"),
        inspect::Linkage::Opened { needed, by } => {
            format!("dynamic: {needed} = {}, {by}", found.file.display())
        }
    };
    let mut said = Vec::new();
    let (version, cuda, linkage) = match bundled {
        crate::loader::Bundled::Nccl(found) => {
            let linkage = linkage_of(&found);
            (found.version, Some(found.cuda), linkage)
        }
        // A login or controller node without some of the wheel's CUDA libraries: the
        // calls still reach one NCCL unless a missing library defines nccl* first. That
        // is planned from, and said with its condition; anything else unknown is not.
        crate::loader::Bundled::Conditional {
            conditional: c,
            reason,
        } => {
            if !c.only_missing {
                bail!(
                    "which NCCL {} runs is unknown: {reason}. If you know that none of it defines nccl*, pass --tag {} (the NCCL the calls reach then)",
                    lib.display(),
                    Tag::for_release(&c.detection.version)
                );
            }
            said.push(Finding::ConditionalTag {
                summary: c.summary(),
            });
            let linkage = format!("{}, {}", linkage_of(&c.detection), c.condition());
            (c.detection.version, Some(c.detection.cuda), linkage)
        }
        crate::loader::Bundled::Pinned(p) => {
            let linkage = format!(
                "dynamic, pinned by {} ({}=={}, not installed)",
                p.metadata.display(),
                p.distribution,
                p.version
            );
            (p.version, None, linkage)
        }
        crate::loader::Bundled::None(why) => bail!(
            "no NCCL self-identification ('NCCL version X.Y.Z+cudaA.B') in a process that loads {}: {why}. It may be truncated or not carry NCCL. Pass --tag with the NCCL tag (vX.Y.Z-N) your training runs",
            lib.display()
        ),
        crate::loader::Bundled::Unknown(why) => bail!(
            "which NCCL {} runs is unknown: {why}. Pass --tag with the NCCL tag (vX.Y.Z-N) your training runs",
            lib.display()
        ),
    };
    Ok((
        Tag::for_release(&version),
        TagOrigin::Libtorch {
            variant: variant.name,
            library: lib,
            linkage,
            process,
        },
        cuda,
        said,
    ))
}

/// The most `--jobs` fdl accepts: 1,024 nvcc jobs would want ~2 TiB of memory.
pub const MAX_JOBS: u32 = 1024;

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
