//! `fdl nccl build`: flags → plan → backend → install → report.

use super::{clean, paint, print_json, Color};
use crate::docker::{self, DockerBackend, Engine};
use crate::gpu;
use crate::lock::Wait;
use crate::native;
use crate::nccl::build::{self, Backend, BuildRequest, ExecOptions, Outcome, Sources};
use crate::nccl::plan::{
    ArchOrigin, BackendInputs, BackendPlan, BuildPlan, CudaOrigin, DockerSource, DockerSteps,
    DockerfileSpec, NativeSource, TagOrigin, ToolchainFiles, VolumesFlag,
};
use crate::nccl::store::{BuildStore, Existing};
use crate::nccl::tag::Tag;
use crate::nccl::verify;
use crate::progress::Verbosity;
use crate::project::Project;
use crate::step::{Paths, Step};
use anyhow::{bail, Result};
use clap::Args;
use serde_json::json;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendFlag {
    /// Docker when its daemon answers, else native when the toolchain is complete
    Auto,
    Docker,
    Native,
}

/// `--jobs`, checked as it is parsed with the words the build's own check uses
/// (`nccl::build` checks again for callers of the library).
fn jobs_arg(s: &str) -> std::result::Result<u32, String> {
    let max = crate::nccl::build::MAX_JOBS;
    match s.trim().parse::<u64>() {
        Ok(0) => Err("--jobs must be at least 1".into()),
        Ok(j) if j > u64::from(max) => Err(format!(
            "--jobs {j} is more than any machine can run ({max} at most); each nvcc job of NCCL takes up to ~2 GiB. Leave --jobs out to size it to this machine"
        )),
        Ok(j) => Ok(j as u32),
        Err(_) => Err(format!("--jobs takes a number from 1 to {max}")),
    }
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// NCCL git tag, e.g. v2.27.5-1 (default: from the active libtorch's NCCL)
    #[arg(long)]
    pub tag: Option<String>,
    /// GPU architectures, e.g. "6.1;12.0", "61,120", "sm_61" (default: the local GPUs)
    #[arg(long)]
    pub archs: Option<String>,
    /// CUDA version, e.g. 12.8 or 12.8.1 (default: the libtorch's NCCL's, else 12.8)
    #[arg(long)]
    pub cuda: Option<String>,
    /// Parallel compile jobs (default: cores, at most one per ~2 GiB of memory)
    #[arg(long, value_parser = jobs_arg)]
    pub jobs: Option<u32>,
    /// Where to build
    #[arg(long, value_enum, default_value_t = BackendFlag::Auto)]
    pub backend: BackendFlag,
    /// Docker: the toolchain image's Dockerfile instead of the embedded one (what the
    /// image must hold: `fdl nccl dockerfile`)
    #[arg(long, value_name = "PATH")]
    pub dockerfile: Option<PathBuf>,
    /// Docker: start from this image (local, mirrored or `docker load`ed) instead of the
    /// nvidia/cuda devel image fdl picks for the CUDA version
    #[arg(long, value_name = "IMAGE")]
    pub base_image: Option<String>,
    /// Docker: read the toolchain from Docker volumes holding a copy of the toolchain
    /// image's directories (made once per image), not through the engine's storage
    /// driver; auto does so where that driver is slow to read (fuse-overlayfs)
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = VolumesFlag::Auto)]
    pub toolchain_volumes: VolumesFlag,
    /// Native: the CUDA toolkit to use (default: $CUDA_HOME, else nvcc on PATH)
    #[arg(long, value_name = "DIR")]
    pub cuda_home: Option<PathBuf>,
    /// Build from this NCCL checkout or unpacked release instead of cloning the tag
    /// (offline hosts); Docker mounts it read-only into the compile container
    #[arg(long, value_name = "DIR")]
    pub source: Option<PathBuf>,
    /// Native: build even if the toolkit's CUDA differs from --cuda / the libtorch's
    #[arg(long)]
    pub allow_cuda_mismatch: bool,
    /// Also embed PTX for the highest arch, so newer GPUs still run (by JIT)
    #[arg(long)]
    pub ptx: bool,
    /// Pass NCCL's ONLY_FUNCS for a quick development build (marked in its name)
    #[arg(long, value_name = "EXPR")]
    pub only_funcs: Option<String>,
    /// Replace an existing build of the same name (only after the new one succeeded)
    #[arg(long)]
    pub force: bool,
    /// Fail instead of waiting when another fdl is building the same target
    #[arg(long)]
    pub no_wait: bool,
    /// Print the plan; build nothing and write nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Print the plan or the result as one JSON object
    #[arg(long)]
    pub json: bool,
    /// Show only errors and the result
    #[arg(long, short, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Show the build's full output as it runs
    #[arg(long, short)]
    pub verbose: bool,
    /// Neither install from the machine-wide build store nor add to it, for this build
    #[arg(long)]
    pub no_store: bool,
}

impl BuildArgs {
    fn wants_native(&self) -> Option<&'static str> {
        if self.cuda_home.is_some() {
            Some("--cuda-home")
        } else if self.allow_cuda_mismatch {
            Some("--allow-cuda-mismatch")
        } else {
            None
        }
    }
}

/// The chosen backend, ready to run.
enum Chosen {
    Docker {
        engine: Option<Engine>,
        dockerfile: String,
    },
    /// `missing`: the tools a compile needs that this host lacks (none are needed to
    /// install from the store).
    Native { missing: Vec<String> },
}

/// Picks the backend for `tag` as `--backend` says; `auto` asks the Docker daemon first.
fn choose(args: &BuildArgs, tag: &Tag) -> Result<(BackendInputs, String, Chosen)> {
    let native_flag = args.wants_native();
    let docker_flag = if args.dockerfile.is_some() {
        Some("--dockerfile")
    } else if args.base_image.is_some() {
        Some("--base-image")
    } else {
        None
    };
    if let (Some(flag), Some(dflag)) = (native_flag, docker_flag) {
        bail!("{dflag} is for the Docker backend and {flag} for the native one: give one of them");
    }
    if let Some(img) = &args.base_image {
        docker::check_image_reference(img)?;
    }
    let docker =
        |engine: Option<Engine>, reason: String| -> Result<(BackendInputs, String, Chosen)> {
            let (spec, text) = docker::dockerfile_spec(args.dockerfile.as_deref())?;
            let source = match &args.source {
                Some(dir) => {
                    let (path, version) = native::check_source_dir(dir, tag)?;
                    DockerSource::Context { path, version }
                }
                None => DockerSource::Clone,
            };
            // The image is looked into before anything is built, where an engine answers
            // (a dry run on a machine without one still shows the plan).
            let engine = match engine {
                None if args.base_image.is_some() => Engine::probe().ok(),
                e => e,
            };
            let probe = match (&args.base_image, &engine) {
                (Some(image), Some(_)) => Some(docker::probe_image(image)?),
                _ => None,
            };
            let storage_driver = match (&engine, args.toolchain_volumes) {
                (Some(e), VolumesFlag::Auto) => e.storage_driver(),
                _ => None,
            };
            Ok((
                BackendInputs::Docker {
                    dockerfile: spec,
                    base_image: args.base_image.clone(),
                    source,
                    probe,
                    volumes: args.toolchain_volumes,
                    storage_driver,
                },
                reason,
                Chosen::Docker {
                    engine,
                    dockerfile: text,
                },
            ))
        };
    let native = |report: native::ToolchainReport,
                  reason: String|
     -> Result<(BackendInputs, String, Chosen)> {
        // The toolkit and the C++ compiler name the build's store key; the other tools
        // only compile, so their absence is a problem only when the store has no entry
        // (see `run_with`).
        let (Some(toolkit), true) = (report.toolkit.clone(), report.tools.contains_key("c++"))
        else {
            bail!(
                "the native backend cannot build here:\n  {}",
                report.missing.join("\n  ")
            );
        };
        let source = native::source_for(args.source.as_deref(), tag, &crate::cache::cache_dir()?)?;
        let inputs = BackendInputs::Native {
            toolkit,
            tools: report.tools,
            source,
            allow_cuda_mismatch: args.allow_cuda_mismatch,
        };
        Ok((
            inputs,
            reason,
            Chosen::Native {
                missing: report.missing,
            },
        ))
    };
    let discover = || native::discover(args.cuda_home.as_deref(), args.source.is_none());
    match args.backend {
        BackendFlag::Docker => {
            if let Some(flag) = native_flag {
                bail!("{flag} is for the native backend, but --backend docker was given");
            }
            docker(None, "--backend docker".into())
        }
        BackendFlag::Native => {
            if let Some(flag) = docker_flag {
                bail!("{flag} is for the Docker backend, but --backend native was given");
            }
            native(discover(), "--backend native".into())
        }
        BackendFlag::Auto => {
            if let Some(flag) = native_flag {
                return native(discover(), format!("auto: {flag} given"));
            }
            match Engine::probe() {
                Ok(engine) => {
                    let reason = format!(
                        "auto: the Docker daemon answers (server {})",
                        engine.server_version
                    );
                    docker(Some(engine), reason)
                }
                Err(docker_err) => match docker_flag {
                    Some(flag) if args.dry_run => docker(
                        None,
                        format!("auto: {flag} given; planned for Docker, whose daemon does not answer here ({docker_err})"),
                    ),
                    Some(_) => Err(docker_err.into()),
                    None => {
                        let report = discover();
                    if report.is_complete() {
                        let why = format!(
                            "auto: no Docker ({docker_err}); the native toolchain is complete"
                        );
                        native(report, why)
                    } else if args.dry_run {
                        // A plan is still worth showing on a machine that cannot build,
                        // e.g. to check inputs before moving to the build host.
                        let why = "auto: neither Docker nor a native toolchain is available here; planned for Docker";
                        docker(None, why.to_string())
                    } else {
                        bail!(
                            "no backend can build here.\n  docker: {docker_err}\n  native: {}",
                            report.missing.join("; ")
                        )
                    }
                    }
                },
            }
        }
    }
}

pub(super) fn run(project: &Project, args: BuildArgs) -> Result<()> {
    let quiet_gpus = args.json || args.quiet;
    let infer = |flags: build::CheckedFlags| {
        let sources = Sources {
            project,
            gpus: &|| {
                let gpus = gpu::query()?;
                if !quiet_gpus {
                    eprint!("Local GPUs:\n{}", gpu::table(&gpus));
                }
                Ok(gpus)
            },
        };
        build::infer(flags, &sources)
    };
    run_with(project, args, &infer)
}

/// `fdl nccl build` with what the flags leave open inferred by `infer`: from this host
/// (the libtorch, the GPUs), or from a whole cluster's reports.
pub(super) fn run_with(
    project: &Project,
    args: BuildArgs,
    infer: &dyn Fn(build::CheckedFlags) -> Result<build::Inferred>,
) -> Result<()> {
    let req = BuildRequest {
        tag: args.tag.clone(),
        archs: args.archs.clone(),
        cuda: args.cuda.clone(),
        jobs: args.jobs,
        ptx: args.ptx,
        only_funcs: args.only_funcs.clone(),
    };
    let flags = build::check_flags(&req)?;
    if args.verbose {
        eprintln!("project root: {}", project.describe());
    }
    let inferred = infer(flags)?;
    let (inputs, reason, mut chosen) = choose(&args, &inferred.tag)?;
    let mut plan = build::plan(&req, inferred, project.nccl_builds_dir(), inputs, reason)?;
    plan.warnings.extend(project.fallback_note());
    // The engine the build needs is asked for now, so that a dry run meets what a real
    // run would meet first. A plan is about its inputs, and is sound whichever host it
    // is made on (a dry run on a laptop before the build host, say): a dry run names this
    // host's missing engine as a warning; a real build refuses on it.
    if let Chosen::Docker { engine, .. } = &mut chosen {
        if engine.is_none() {
            match Engine::probe() {
                Ok(e) => *engine = Some(e),
                Err(e) if args.dry_run => plan.warnings.push(format!(
                    "this host cannot run the build: {e}; run it where a Docker engine answers, or with --backend native where a CUDA toolkit is installed"
                )),
                Err(e) => plan.problems.push(format!(
                    "{e}; or build with --backend native where a CUDA toolkit is installed"
                )),
            }
        }
    }
    // The backend, where it can be made: a dry run needs it for the store key's probes.
    let backend: Option<Box<dyn Backend>> = match &chosen {
        Chosen::Docker {
            engine: Some(engine),
            dockerfile,
        } => Some(Box::new(DockerBackend {
            engine: engine.clone(),
            dockerfile: dockerfile.clone(),
        })),
        Chosen::Docker { engine: None, .. } => None,
        Chosen::Native { .. } => Some(Box::new(native::NativeBackend)),
    };
    let (store_view, key) = store_view(&plan, backend.as_deref(), args.no_store);
    if let Chosen::Native { missing } = &chosen {
        if !missing.is_empty() {
            let tools = missing.join("\n  ");
            if store_view.state == "hit" {
                plan.warnings.push(format!(
                    "this host lacks tools a compile needs, but none is needed: the build is installed from the store\n  {tools}"
                ));
            } else {
                plan.problems
                    .push(format!("the native backend cannot build here:\n  {tools}"));
            }
        }
    }
    if args.dry_run {
        // What the build checks first under its lock, checked here without one.
        let store = BuildStore::new(project.nccl_builds_dir());
        let existing = store.existing(&plan.name)?;
        let dir = store.path_of(&plan.name);
        match build::conflict(&plan, existing.as_ref(), &dir, args.force) {
            Some(why) => plan.problems.push(why),
            None => {
                if let Some(Existing::Build(m)) = &existing {
                    if !args.force && plan.differences(&m.plan).is_empty() {
                        plan.warnings.push(format!(
                            "{} already holds a build from this plan ({}): a real run does nothing (--force rebuilds it)",
                            dir.display(),
                            m.built_at
                        ));
                    }
                }
            }
        }
    }
    let steps = plan_steps(&plan);
    let commands: Vec<String> = steps.iter().map(Step::render).collect();
    // One rule for every dry run: the plan, then every problem, then a status that is 0
    // only when a real run would start.
    if args.dry_run {
        if args.json {
            print_json(&json!({
                "dry_run": true,
                "plan": plan,
                "commands": commands,
                "store": store_view,
            }));
        } else {
            out!("{}", render_plan(&plan, &commands, &store_view));
            outln!("Dry run: nothing was built, written or started.");
        }
        if !plan.problems.is_empty() {
            let e = anyhow::anyhow!(
                "the plan cannot run: {} problem(s), listed with the plan",
                plan.problems.len()
            );
            return Err(if args.json {
                super::JsonReported(e).into()
            } else {
                e
            });
        }
        return Ok(());
    }
    if !plan.problems.is_empty() {
        bail!(
            "the plan cannot run (see it with --dry-run):\n  {}",
            plan.problems.join("\n  ")
        );
    }
    let backend: Box<dyn Backend> = match (backend, chosen) {
        (Some(b), _) => b,
        (None, Chosen::Docker { dockerfile, .. }) => Box::new(DockerBackend {
            engine: Engine::probe()?,
            dockerfile,
        }),
        (None, Chosen::Native { .. }) => Box::new(native::NativeBackend),
    };
    if !args.json && !args.quiet {
        eprint!("{}", render_plan(&plan, &commands, &store_view));
    }
    let store = BuildStore::new(project.nccl_builds_dir());
    let exe = std::env::current_exe()?;
    let probe = |lib: &Path| verify::probe_in_child(&exe, lib);
    let opts = ExecOptions {
        probe: Some(&probe),
        cache: crate::cache::cache_dir()?,
        force: args.force,
        wait: if args.no_wait { Wait::No } else { Wait::Yes },
        verbosity: if args.quiet || args.json {
            Verbosity::Quiet
        } else if args.verbose {
            Verbosity::Verbose
        } else {
            Verbosity::Normal
        },
        // A store fdl cannot use (a cache directory others can write, say) costs the
        // speed-up, never the build.
        store: if args.no_store {
            None
        } else {
            match crate::store::Store::open() {
                Ok(store) => Some(store),
                Err(e) => {
                    eprintln!("warning: the build store is not used for this build: {e:#}");
                    None
                }
            }
        },
        key,
    };
    let outcome = build::execute(&plan, backend.as_ref(), &store, &opts)?;
    report(&outcome, args.json);
    Ok(())
}

fn host_values(v: &[crate::nccl::plan::HostValue]) -> String {
    v.iter()
        .map(|h| format!("{} {}", h.host, h.value))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The steps the plan will run, with placeholders for the private paths a run makes
/// (`<staging>`): the same values a run executes, rendered.
fn plan_steps(plan: &BuildPlan) -> Vec<Step> {
    match &plan.backend {
        BackendPlan::Docker(d) => {
            let paths = Paths::placeholders(DockerSteps::PATHS);
            // The volumes are known when the toolchain image is: one per top-level
            // directory it holds.
            let volumes = match d.toolchain_files {
                ToolchainFiles::Volumes => {
                    vec![("<toolchain-volume>".to_string(), "<dir>".to_string())]
                }
                ToolchainFiles::Image => Vec::new(),
            };
            DockerSteps::new(d, plan.jobs, &paths, &volumes)
                .all()
                .into_iter()
                .cloned()
                .collect()
        }
        BackendPlan::Native(n) => {
            let mut paths = Paths::placeholders(native::NativeSteps::PATHS);
            // The toolkit is known now; only its plain alias, if it needs one, is not.
            paths.entries.retain(|(k, _)| *k != "cuda-home");
            paths
                .entries
                .push(("cuda-home", n.toolkit.cuda_home.clone()));
            native::NativeSteps::new(n, plan.jobs, &paths)
                .all()
                .into_iter()
                .cloned()
                .collect()
        }
    }
}

fn report(outcome: &Outcome, json_out: bool) {
    let (status, manifest, dir) = match outcome {
        Outcome::Built {
            manifest,
            dir,
            replaced: false,
            from_store: None,
        } => ("built", manifest, dir),
        Outcome::Built {
            manifest,
            dir,
            replaced: false,
            from_store: Some(_),
        } => ("installed_from_store", manifest, dir),
        Outcome::Built { manifest, dir, .. } => ("replaced", manifest, dir),
        Outcome::AlreadyBuilt { manifest, dir } => ("already_built", manifest, dir),
    };
    let lib = dir.join("lib").join("libnccl.so.2");
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // The value the loader honours (a cache link where the path holds a space or colon);
    // where none exists, the reason stands in for it.
    let preload = crate::nccl::preload::preload_path(&lib, &name).map_err(|e| format!("{e:#}"));
    if json_out {
        let mut v = json!({
            "status": status,
            "build_dir": dir,
            "ld_preload": preload.as_ref().ok(),
            "manifest": manifest,
        });
        if let Err(why) = &preload {
            v["ld_preload_error"] = json!(why);
        }
        print_json(&v);
        return;
    }
    match status {
        "already_built" => outln!(
            "Already built from the same plan ({}): {}\nNothing to do.",
            manifest.built_at,
            dir.display()
        ),
        "replaced" => outln!("Rebuilt and replaced: {}", dir.display()),
        "installed_from_store" => outln!(
            "{} {} (no compile: {})",
            paint(
                &format!(
                    "Installed NCCL {} from the build store:",
                    manifest.checked.header_version
                ),
                Color::Green
            ),
            dir.display(),
            match outcome {
                Outcome::Built {
                    from_store: Some(m),
                    ..
                } => format!("files by {m}"),
                _ => String::new(),
            }
        ),
        _ => outln!(
            "{} {}",
            paint(
                &format!("Built NCCL {}:", manifest.checked.header_version),
                Color::Green
            ),
            dir.display()
        ),
    }
    match &preload {
        Ok(p) => outln!(
            "\nWire it with `eval \"$(fdl nccl env {name})\"`, or in a worker's env: block in fdl.cluster.yml:\n  LD_PRELOAD: {}",
            super::manage::yaml_quote(&p.to_string_lossy())
        ),
        Err(why) => outln!("\nNo LD_PRELOAD value for it: {why}"),
    }
}

/// What the build store will do for a plan, as the plan shows it.
#[derive(Debug, serde::Serialize)]
struct StoreView {
    /// `hit`, `miss`, `unknown` (no key) or `skipped` (`--no-store`).
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<crate::store::Key>,
    #[serde(skip_serializing_if = "Option::is_none")]
    inputs: Option<crate::store::KeyInputs>,
    #[serde(skip_serializing_if = "Option::is_none")]
    why: Option<String>,
}

/// The store's part of the plan: the key and whether the store has it. Reads only: a
/// dry run makes no store directory. Also the key as [`build::store_key`] answered, where
/// it was asked, for the build to use rather than probe the toolchain again.
fn store_view(
    plan: &BuildPlan,
    backend: Option<&dyn Backend>,
    no_store: bool,
) -> (StoreView, Option<build::KeyAnswer>) {
    let unknown = |why: String| StoreView {
        state: "unknown",
        key: None,
        inputs: None,
        why: Some(why),
    };
    if no_store {
        let view = StoreView {
            state: "skipped",
            key: None,
            inputs: None,
            why: Some("--no-store".into()),
        };
        return (view, None);
    }
    let Some(backend) = backend else {
        return (
            unknown("no Docker engine answers to probe the base image".into()),
            None,
        );
    };
    let key = build::store_key(plan, backend);
    let view = match crate::cache::cache_dir().and_then(|c| crate::store::Store::at(&c)) {
        Err(e) => unknown(format!("{e:#}")),
        Ok(store) => match &key {
            Ok((key, inputs)) => StoreView {
                state: if store.has(key) { "hit" } else { "miss" },
                key: Some(key.clone()),
                inputs: Some(inputs.clone()),
                why: None,
            },
            Err(why) => unknown(why.clone()),
        },
    };
    (view, Some(key))
}

fn render_plan(plan: &BuildPlan, cmds: &[String], store: &StoreView) -> String {
    let tag_from = match &plan.tag_origin {
        TagOrigin::Flag => "from --tag".to_string(),
        TagOrigin::Libtorch { variant, .. } => format!("from the active libtorch, {variant}"),
        TagOrigin::Cluster { versions } => format!(
            "the highest libtorch NCCL of the workers: {}",
            host_values(versions)
        ),
    };
    let cuda_from = match plan.cuda_origin {
        CudaOrigin::Flag => "from --cuda".to_string(),
        CudaOrigin::Libtorch => "from the libtorch's NCCL self-id".to_string(),
        CudaOrigin::Default => {
            "default: oldest CUDA that compiles both Pascal and Blackwell".to_string()
        }
    };
    let archs_from = match &plan.arch_origin {
        ArchOrigin::Flag => "from --archs".to_string(),
        ArchOrigin::Gpus { gpus } => format!("from nvidia-smi: {} GPU(s)", gpus.len()),
        ArchOrigin::Cluster { hosts } => {
            format!("the union of the workers' GPUs: {}", host_values(hosts))
        }
    };
    let archs = plan
        .archs
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(" ");
    let mut s = String::from("NCCL build plan\n");
    let mut row = |k: &str, v: String| s.push_str(&format!("  {k:<11}{v}\n"));
    row("tag", format!("{}  ({tag_from})", plan.tag));
    if let TagOrigin::Libtorch {
        library, linkage, ..
    } = &plan.tag_origin
    {
        // Where the version was read, on its own lines: the paths are long.
        row("", format!("read from {}", library.display()));
        row("", format!("NCCL linkage: {linkage}"));
    }
    row(
        "NCCL",
        plan.nccl_version
            .as_ref()
            .map_or("(not a release tag)".to_string(), |v| v.to_string()),
    );
    match &plan.cuda_note {
        None => row("CUDA", format!("{}  ({cuda_from})", plan.cuda)),
        Some(note) => {
            row(
                "CUDA",
                format!("{}  ({cuda_from}, then adjusted:)", plan.cuda),
            );
            row("", note.clone());
        }
    }
    row("archs", format!("{archs}  ({archs_from})"));
    row("gencode", plan.gencode.clone());
    row("jobs", format!("{}  ({})", plan.jobs, plan.jobs_reason));
    row("output", plan.output_dir.display().to_string());
    if plan.ptx {
        row(
            "ptx",
            "yes: PTX for the highest arch is embedded too".into(),
        );
    }
    if let Some(expr) = &plan.only_funcs {
        row(
            "only funcs",
            format!("{expr}  (development build: not a full NCCL)"),
        );
    }
    row(
        "backend",
        format!("{}  ({})", plan.backend.kind(), plan.backend_reason),
    );
    if let BackendPlan::Docker(docker) = &plan.backend {
        row(
            "toolchain",
            format!(
                "{}-<digest of the base image's ID, the Dockerfile and its arguments>: built once, then reused",
                docker.image
            ),
        );
        if let Some(base) = &docker.base_image {
            row("base image", base.clone());
        }
        row(
            "dockerfile",
            match &docker.dockerfile {
                DockerfileSpec::Embedded { sha256 } => {
                    format!("embedded (sha256 {})", &sha256[..12])
                }
                DockerfileSpec::File { path, sha256 } => {
                    format!("{} (sha256 {})", path.display(), &sha256[..12])
                }
            },
        );
        if let Some(probe) = &docker.probe {
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
            row("toolkit", found);
        }
        row(
            "source",
            match &docker.source {
                DockerSource::Context { path, version } => {
                    format!("{} (NCCL {version}), mounted read-only", path.display())
                }
                DockerSource::Clone => format!(
                    "{} fetched on this host into fdl's cache, then mounted read-only",
                    plan.tag
                ),
            },
        );
        row(
            "network",
            format!(
                "image build: {}  ({}); compile: none",
                docker.network.as_deref().unwrap_or("default"),
                docker.network_reason
            ),
        );
        row(
            "mounts",
            format!(
                "<source> at {}, read-only; <work> (build/, tmp/) at {}; <staging> at {}",
                crate::nccl::plan::RUN_SOURCE_DIR,
                crate::nccl::plan::RUN_WORK_DIR,
                crate::nccl::plan::RUN_PREFIX_DIR
            ),
        );
        row(
            "toolchain",
            match docker.toolchain_files {
                ToolchainFiles::Volumes => format!(
                    "read from Docker volumes mounted read-only, each a copy of one of the image's top-level directories (usr, opt, …) made once per toolchain image  ({})",
                    docker.toolchain_files_reason
                ),
                ToolchainFiles::Image => format!(
                    "read from the image  ({})",
                    docker.toolchain_files_reason
                ),
            },
        );
    }
    if let BackendPlan::Native(native) = &plan.backend {
        row(
            "toolkit",
            format!(
                "CUDA {} at {}",
                native.toolkit.cuda,
                native.toolkit.cuda_home.display()
            ),
        );
        row("nvcc", native.toolkit.nvcc.display().to_string());
        row(
            "source",
            match &native.source {
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
        );
    }
    row(
        "store",
        match (store.state, &store.key, &store.why) {
            ("hit", Some(key), _) => format!(
                "{key}\n{:13}from the store: installed from its entry, nothing is compiled",
                ""
            ),
            (_, Some(key), _) => {
                format!("{key}\n{:13}not in the store: built, then added to it", "")
            }
            ("skipped", _, _) => "not used for this build (--no-store)".to_string(),
            (_, _, why) => format!(
                "key unknown: {}; the build is looked up once it is known",
                clean(why.as_deref().unwrap_or("no reason given"))
            ),
        },
    );
    s.push_str("Commands:\n");
    for c in cmds {
        s.push_str(&format!("  {c}\n"));
    }
    if let BackendPlan::Docker(_) = &plan.backend {
        s.push_str(&format!(
            "  where {} is this script, which fdl writes into <work>:\n",
            crate::nccl::plan::RUN_SCRIPT_PATH
        ));
        for line in crate::nccl::plan::RUN_SCRIPT.lines() {
            s.push_str(&format!("    {line}\n"));
        }
    }
    if !plan.warnings.is_empty() {
        s.push_str(&paint("Warnings:\n", Color::Yellow));
        for w in &plan.warnings {
            s.push_str(&format!("  {w}\n"));
        }
    }
    if !plan.problems.is_empty() {
        s.push_str(&paint(
            "Problems (the build will not start until they are solved):\n",
            Color::Red,
        ));
        for p in &plan.problems {
            s.push_str(&format!("  {p}\n"));
        }
    }
    s
}
