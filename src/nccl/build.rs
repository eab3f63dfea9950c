//! `fdl nccl build` as a pipeline: gather inputs → [`BuildPlan`] → backend → staged,
//! checked, all-or-nothing install → [`Outcome`].

use crate::arch::{self, Arch};
use crate::gpu::{self, Gpu, GpuError};
use crate::inspect;
use crate::libtorch::Libtorch;
use crate::lock;
use crate::nccl::plan::{ArchOrigin, BackendInputs, BuildPlan, PlanInputs, TagOrigin};
use crate::nccl::store::{BuildName, BuildStore, Existing, Manifest};
use crate::nccl::tag::Tag;
use crate::nccl::verify;
use crate::process;
use crate::progress::{Phase, Progress, Verbosity};
use crate::project::Project;
use crate::version::CudaVersion;
use anyhow::{anyhow, bail, Context, Result};

pub use crate::nccl::tree::BUILD_LOG;
use crate::store::{Key, KeyInputs, StoreRecord};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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

/// What [`store_key`] answers.
pub type KeyAnswer = std::result::Result<(Key, KeyInputs), String>;

/// The store key of `plan` built by `backend`, with its inputs; `Err` says why it is not
/// known (a probe failed, or the tag is not cloned yet).
pub fn store_key(plan: &BuildPlan, backend: &dyn Backend) -> KeyAnswer {
    let source = crate::store::source_identity(plan)?;
    let toolchain = backend
        .toolchain_identity(plan)
        .map_err(|e| format!("{e:#}"))?;
    let inputs = crate::store::key_inputs(plan, &source, &toolchain);
    Ok((Key::of(&inputs), inputs))
}

/// The user's flags common to every backend, unvalidated.
#[derive(Debug, Clone, Default)]
pub struct BuildRequest {
    pub tag: Option<String>,
    pub archs: Option<String>,
    pub cuda: Option<String>,
    pub jobs: Option<u32>,
    pub ptx: bool,
    pub only_funcs: Option<String>,
}

/// Where the inputs come from besides flags; tests swap the GPU source.
pub struct Sources<'a> {
    pub project: &'a Project,
    pub gpus: &'a dyn Fn() -> Result<Vec<Gpu>, GpuError>,
}

/// The flags checked before anything slow runs, so a typo fails fast.
pub struct CheckedFlags {
    pub tag: Option<Tag>,
    pub archs: Option<Vec<Arch>>,
    pub cuda: Option<CudaVersion>,
}

pub fn check_flags(req: &BuildRequest) -> Result<CheckedFlags> {
    let tag = req.tag.as_deref().map(Tag::parse_flag).transpose()?;
    let archs = req
        .archs
        .as_deref()
        .map(arch::parse_arch_list)
        .transpose()?;
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
    Ok(CheckedFlags { tag, archs, cuda })
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
    pub warnings: Vec<String>,
}

/// Infers what the flags leave open: the tag (and CUDA) from the active libtorch, the
/// archs from the GPUs.
pub fn infer(flags: CheckedFlags, src: &Sources) -> Result<Inferred> {
    let CheckedFlags {
        tag: tag_flag,
        archs: archs_flag,
        cuda: cuda_flag,
    } = flags;
    let (tag, tag_origin, cuda_from_libtorch) = match tag_flag {
        Some(t) => (t, TagOrigin::Flag, None),
        None => infer_tag(src.project)?,
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
    let mut warnings = libtorch_gaps(src.project, &archs);
    if arch_origin == ArchOrigin::Flag {
        // `--archs` is for other hosts too; this host's GPUs must still be named, or the
        // build (and `fdl nccl verify` here) will not cover them. No GPUs readable: no word.
        if let Ok(gpus) = (src.gpus)() {
            warnings.extend(left_out(&gpus, &archs));
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
    })
}

/// A warning for each local GPU no planned arch has SASS for.
pub fn left_out(gpus: &[gpu::Gpu], archs: &[Arch]) -> Vec<String> {
    gpus.iter()
        .filter(|g| {
            !archs
                .iter()
                .any(|&a| crate::arch::GpuTarget::generic(a).sass_runs_on(g.compute_cap))
        })
        .map(|g| {
            let mut all: Vec<Arch> = archs.to_vec();
            all.push(g.compute_cap);
            all.sort();
            all.dedup();
            format!(
                "--archs leaves out this host's GPU {} ({}, {}): the build will have no code for it, and `fdl nccl verify` here will say so. To cover it, pass --archs \"{}\"",
                g.index,
                g.name,
                g.compute_cap,
                all.iter().map(|a| a.capability()).collect::<Vec<_>>().join(";")
            )
        })
        .collect()
}

/// A new NCCL does not make training run on a GPU the libtorch itself has no code for
/// (the PyPI torch wheels have none for Pascal): say so, with the remedy.
fn libtorch_gaps(project: &Project, archs: &[Arch]) -> Vec<String> {
    let Ok(variant) = Libtorch::new(project.libtorch_dir()).active() else {
        return Vec::new();
    };
    let Ok(ins) = inspect::inspect(&variant.libtorch_cuda()) else {
        return Vec::new();
    };
    if ins.gpu_code.is_empty() {
        return Vec::new(); // not a CUDA build of libtorch at all; nothing to judge by
    }
    archs
        .iter()
        .filter(|&&a| matches!(inspect::coverage(&ins.gpu_code, a), inspect::Verdict::NotCovered))
        .map(|a| {
            format!(
                "the active libtorch ({}) has no GPU code for {a}: an NCCL built for {a} will not make training run there. Use a libtorch built for {a} (from source with TORCH_CUDA_ARCH_LIST including {}), and register it with `fdl libtorch add`",
                variant.name,
                a.capability()
            )
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
    BuildPlan::new(PlanInputs {
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
    })
}

/// The tag and CUDA version from the active libtorch's NCCL self-id.
fn infer_tag(project: &Project) -> Result<(Tag, TagOrigin, Option<CudaVersion>)> {
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
    let bundled = crate::loader::bundled_nccl(&lib).with_context(|| {
        format!(
            "cannot read the NCCL version from {}; pass --tag to name it yourself",
            lib.display()
        )
    })?;
    let (version, cuda, linkage) = match bundled {
        crate::loader::Bundled::Nccl(found) => {
            let linkage = match &found.linkage {
                inspect::Linkage::Static => "static".to_string(),
                inspect::Linkage::Dynamic { needed, via } => {
                    format!("dynamic: {needed} = {} via {via}", found.file.display())
                }
                inspect::Linkage::Preload { entry } => format!("preload: {entry}"),
            };
            (found.version, Some(found.cuda), linkage)
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
            "no NCCL self-identification ('NCCL version X.Y.Z+cudaA.B') in a process that loads {}: {why}. It may be truncated or not carry NCCL. Pass --tag, e.g. --tag v2.27.5-1",
            lib.display()
        ),
        crate::loader::Bundled::Unknown(why) => bail!(
            "which NCCL {} runs is unknown: {why}. Pass --tag to name the version yourself, e.g. --tag v2.27.5-1",
            lib.display()
        ),
    };
    Ok((
        Tag::for_release(&version),
        TagOrigin::Libtorch {
            variant: variant.name,
            library: lib,
            linkage,
        },
        cuda,
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

#[derive(Debug)]
pub enum Outcome {
    Built {
        manifest: Box<Manifest>,
        dir: PathBuf,
        replaced: bool,
        /// Installed from the machine-wide store, and how its files came over; `None`
        /// when it was compiled.
        from_store: Option<crate::store::Method>,
    },
    AlreadyBuilt {
        manifest: Box<Manifest>,
        dir: PathBuf,
    },
}

/// How `execute` behaves around the build itself.
pub struct ExecOptions<'a> {
    /// fdl's cache directory: locks, and the logs of failed builds.
    pub cache: PathBuf,
    pub force: bool,
    pub wait: lock::Wait,
    pub verbosity: Verbosity,
    /// Loads the staged library to check `ncclGetVersion`; `None` skips that check (and
    /// the manifest says so).
    pub probe: Option<verify::Probe<'a>>,
    /// The machine-wide store to install from and add to; `None` skips it
    /// (`--no-store`).
    pub store: Option<crate::store::Store>,
    /// [`store_key`] of this plan and backend where the caller already asked for it (the
    /// plan view shows it), so that its probes run once per build; `None`: `execute`
    /// asks.
    pub key: Option<KeyAnswer>,
}

/// Why `plan` cannot be installed where `existing` is (without `--force`): a build from
/// another plan, or something at its place that is no readable fdl build. The build
/// refuses with it; a dry run lists it among the plan's problems.
pub fn conflict(
    plan: &BuildPlan,
    existing: Option<&Existing>,
    dir: &Path,
    force: bool,
) -> Option<String> {
    if force {
        return None;
    }
    match existing? {
        Existing::Build(m) => {
            let diff = plan.differences(&m.plan);
            (!diff.is_empty()).then(|| format!(
                "{} already holds a build from a different plan:\n  {}\nPass --force to replace it (the old build is kept until the new one succeeds)",
                dir.display(),
                diff.join("\n  ")
            ))
        }
        Existing::Unreadable(why) => Some(format!(
            "{} holds an fdl build whose manifest cannot be read ({why}). Pass --force to replace it once the new build succeeds, or remove it with `fdl nccl remove {}`",
            dir.display(),
            plan.name
        )),
        Existing::NotABuild(why) => Some(format!(
            "{} exists but is not an fdl build ({why}). Move it away, or pass --force to replace it once the new build succeeds",
            dir.display()
        )),
    }
}

/// A failed build whose log was kept: the error says where, and shows its end.
#[derive(Debug, thiserror::Error)]
#[error("{cause:#}\nThe full build log is kept at {}; its last lines:\n{}", log.display(), tail.join("\n"))]
pub struct BuildFailed {
    pub cause: anyhow::Error,
    pub log: PathBuf,
    pub tail: Vec<String>,
}

const LOG_SUFFIX: &str = ".log";
/// How many bytes a build's log name (`<name>-<seconds>-<pid>.log`) adds to the build's
/// name at most (a u64 of seconds, a u32 pid): what a build name must leave room for
/// ([`crate::nccl::store::BuildName`]).
pub const LOG_NAME_EXTRA: usize = 1 + 20 + 1 + 10 + LOG_SUFFIX.len();

/// Runs the plan: takes the target's lock, compares with what is installed, builds into
/// staging, checks, seals and commits. Any error before the commit leaves the store
/// exactly as it was; the log of a failed build is kept in the cache and named.
pub fn execute(
    plan: &BuildPlan,
    backend: &dyn Backend,
    store: &BuildStore,
    opts: &ExecOptions,
) -> Result<Outcome> {
    if !plan.problems.is_empty() {
        bail!("the plan cannot run:\n  {}", plan.problems.join("\n  "));
    }
    let dir = store.path_of(&plan.name);
    let name = BuildName::parse(&plan.name)?;
    let lock = store.lock(&name, &opts.cache, opts.wait, &|msg| eprintln!("{msg}"))?;
    for done in store.sweep_leftovers(&lock) {
        eprintln!("{done}");
    }
    let existing = store.existing(&plan.name)?;
    if let Some(Existing::Build(m)) = &existing {
        if !opts.force && plan.differences(&m.plan).is_empty() {
            return Ok(Outcome::AlreadyBuilt {
                manifest: m.clone(),
                dir,
            });
        }
    }
    if let Some(why) = conflict(plan, existing.as_ref(), &dir, opts.force) {
        bail!("{why}");
    }
    // Staging first: if it cannot be made, no log file is left behind either.
    let mut staging = store.begin(&lock)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // `logs/` made and checked as every cache directory is: never through a link, never
    // in another user's directory.
    let log_path = crate::cache::subdir(&opts.cache, "logs")?.join(format!(
        "{}-{stamp}-{}{LOG_SUFFIX}",
        plan.name,
        std::process::id()
    ));
    let progress = Progress::new(opts.verbosity, log_path.clone())
        .with_context(|| format!("cannot create the build log {}", log_path.display()))?;
    // The store: with the key's lock held from here to the end, a second build of the
    // same key waits, then finds the entry this one makes.
    let mut keyed = match &opts.store {
        None => None,
        Some(ms) => match match opts.key.clone() {
            Some(Ok(known)) => Ok(known),
            // A clone-source build's key is the cloned tag's commit, unknown before the
            // first clone: the tag is cloned first, so that the key is known and its
            // lock taken before anything compiles — a second first build of that key
            // then waits here and takes this one's entry instead of compiling it again.
            _ => {
                clone_before_lookup(plan, &progress)?;
                store_key(plan, backend)
            }
        } {
            Ok((key, inputs)) => {
                let key_lock = ms.lock(&key, opts.wait, &|msg| eprintln!("{msg}"))?;
                for done in ms.sweep(&key_lock, &key) {
                    progress.note(&done);
                }
                Some((ms, key, inputs, key_lock))
            }
            Err(why) => {
                progress.note(&format!("Not looked up in the build store: {why}"));
                None
            }
        },
    };
    let mut hit = None;
    if let Some((ms, key, _, key_lock)) = &keyed {
        if ms.has(key) {
            match ms.install(key_lock, key, staging.path()) {
                Ok(installed) => hit = Some(installed),
                Err(e) if e.downcast_ref::<process::Interrupted>().is_some() => return Err(e),
                Err(e) => {
                    // Modified files, or anything else that keeps the entry from being
                    // installed (an entry with a FIFO in it, a record that does not
                    // parse): it is removed, and this build makes it again.
                    let msg =
                        format!("warning: {e:#}; removing the store entry and building it instead");
                    // Said even when quiet: a store entry changed behind fdl's back.
                    progress.output(&msg);
                    eprintln!("{msg}");
                    ms.remove(key_lock, key)?;
                    // A fresh staging directory: the failed install's files go with the old.
                    drop(staging);
                    staging = store.begin(&lock)?;
                }
            }
        }
    }
    let built = (|| -> Result<Manifest> {
        match &hit {
            Some(installed) => progress.note(&format!(
                "Installing from the build store: entry {} ({}), made {} for {}",
                installed.record.key,
                installed.method,
                installed.record.created_at,
                installed.record.made_for.display()
            )),
            None => backend.build(plan, staging.path(), &progress)?,
        }
        progress.phase(Phase::Verify);
        let against = verify::Against {
            recorded: None,
            // The build may be meant for another host: only the planned archs must be there.
            gpus: verify::LocalGpus::NotChecked,
            probe: opts.probe,
        };
        let report = verify::verify(&plan.name, staging.path(), plan, &against);
        for c in &report.checks {
            progress.note(&format!("verify {:<8} {}: {}", c.status, c.check, c.detail));
        }
        if !report.passed() {
            let failures: Vec<String> = report
                .failures()
                .iter()
                .map(|c| format!("{}: {}", c.check, c.detail))
                .collect();
            bail!(
                "the build failed verification; nothing was installed:\n  {}",
                failures.join("\n  ")
            );
        }
        // A passed verification includes the layout check.
        let checked = report
            .checked
            .ok_or_else(|| anyhow!("the verification of the staged build recorded no layout"))?;
        let record = if hit.is_some() {
            keyed.as_ref().map(|(_, key, inputs, _)| StoreRecord {
                key: key.clone(),
                inputs: inputs.clone(),
                from_store: true,
            })
        } else {
            store_built(
                plan,
                backend,
                opts,
                &mut keyed,
                staging.path(),
                &log_path,
                &progress,
            )
        };
        let manifest = staging.seal(plan, checked, report.checks, record).context(
            "the build passed verification but could not be sealed; nothing was installed",
        )?;
        // A Ctrl-C that lands after the last child exited still means "do not install".
        if process::interrupted() {
            return Err(process::Interrupted.into());
        }
        Ok(manifest)
    })();
    let manifest = match built {
        Ok(m) => m,
        Err(e) if e.downcast_ref::<process::Interrupted>().is_some() => {
            // "Everything this run started was cleaned up": the log too.
            progress.finish();
            let _ = std::fs::remove_file(&log_path);
            return Err(e);
        }
        Err(cause) => {
            progress.finish();
            return Err(BuildFailed {
                cause,
                tail: progress.tail(crate::progress::TAIL_LINES),
                log: log_path,
            }
            .into());
        }
    };
    progress.finish();
    // The log travels with the build; the copy in the cache is only for failures.
    std::fs::File::open(&log_path)
        .map_err(anyhow::Error::from)
        .and_then(|mut log| {
            crate::nccl::tree::create_new(&staging.path().join(BUILD_LOG), &mut log)
        })
        .with_context(|| format!("cannot keep the build log in {}", staging.path().display()))?;
    staging.commit(existing.is_some())?;
    let _ = std::fs::remove_file(&log_path);
    // The project is a user of the entry it came from or made (none when adding failed).
    if let (Some((ms, key, _, key_lock)), Some(_)) = (&keyed, &manifest.store) {
        let builds_dir = store
            .dir
            .canonicalize()
            .unwrap_or_else(|_| store.dir.clone());
        let user = crate::store::User {
            builds_dir,
            name: plan.name.clone(),
        };
        if ms.has(key) {
            if let Err(e) = ms.add_user(key_lock, key, user) {
                eprintln!("warning: the build store could not record that this project uses entry {key}: {e:#}");
            }
        }
    }
    Ok(Outcome::Built {
        manifest: Box::new(manifest),
        dir,
        replaced: existing.is_some(),
        from_store: hit.map(|h| h.method),
    })
}

/// After a build that passed verification: adds it to the store (the key is computed
/// again if it was not known before the build: a clone or an image the build fetched
/// names it now). A failure to store is said, and leaves the build as it is.
/// Clones the tag of a native clone-source plan into fdl's clone cache when it is not
/// there yet (as the backend would first thing), so that [`store_key`] can name its
/// commit. Other plans' sources are known without it.
fn clone_before_lookup(plan: &BuildPlan, progress: &Progress) -> Result<()> {
    let crate::nccl::plan::BackendPlan::Native(n) = &plan.backend else {
        return Ok(());
    };
    let crate::nccl::plan::NativeSource::Clone { repo, cache_dir } = &n.source else {
        return Ok(());
    };
    if cache_dir.is_dir() {
        return Ok(());
    }
    let git = match n.tools.get("git") {
        Some(git) => git.clone(),
        None => crate::native::on_path("git").ok_or_else(|| {
            anyhow!(
                "git is not on PATH: fdl clones {} with it. Install git, or pass --source DIR with an NCCL tree",
                plan.tag
            )
        })?,
    };
    crate::native::ensure_clone(repo, &plan.tag, cache_dir, &git, progress)?;
    Ok(())
}

fn store_built<'s>(
    plan: &BuildPlan,
    backend: &dyn Backend,
    opts: &'s ExecOptions,
    keyed: &mut Option<(
        &'s crate::store::Store,
        Key,
        KeyInputs,
        crate::lock::BuildLock,
    )>,
    staging: &Path,
    log: &Path,
    progress: &Progress,
) -> Option<StoreRecord> {
    let ms = opts.store.as_ref()?;
    if keyed.is_none() {
        let (key, inputs) = match store_key(plan, backend) {
            Ok(k) => k,
            Err(why) => {
                progress.note(&format!("Not added to the build store: {why}"));
                return None;
            }
        };
        match ms.lock(&key, opts.wait, &|msg| eprintln!("{msg}")) {
            Ok(key_lock) => *keyed = Some((ms, key, inputs, key_lock)),
            Err(e) => {
                progress.note(&format!("Not added to the build store: {e:#}"));
                return None;
            }
        }
    }
    let (ms, key, inputs, key_lock) = keyed.as_ref()?;
    let made_for = plan.output_dir.clone();
    match ms.add(key_lock, key, inputs, staging, Some(log), &made_for) {
        Ok(_) => progress.note(&format!("Added to the build store as entry {key}")),
        Err(e) => progress.note(&format!(
            "warning: the build could not be added to the build store ({e:#}); it is installed all the same"
        )),
    }
    Some(StoreRecord {
        key: key.clone(),
        inputs: inputs.clone(),
        from_store: false,
    })
}
