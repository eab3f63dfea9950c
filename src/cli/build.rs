//! `fdl nccl build`: the flags, parsed into a [`pipeline::Request`]; the pipeline's
//! plan and report, rendered in text or JSON.

use super::common::print_json;
use crate::context::Context;
use crate::gpu;
use crate::nccl::plan::VolumesFlag;
use crate::pipeline::{
    self, render, BackendFlag, BackendRequest, BuildRequest, Outcome, Sources, Status,
};
use crate::progress::Verbosity;
use crate::project::Project;
use crate::text::{paint, Color};
use anyhow::Result;
use clap::Args;
use serde_json::json;
use std::io::IsTerminal;
use std::path::PathBuf;

/// `--jobs`, checked as it is parsed with the words the build's own check uses
/// (`pipeline::check_flags` checks again for callers of the library).
fn jobs_arg(s: &str) -> std::result::Result<u32, String> {
    let max = pipeline::MAX_JOBS;
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
    /// Infer the tag from the NCCL this kind of process runs with the active libtorch
    /// (default: python for a pip torch, program for any other; a cluster's workers
    /// answer for their own)
    #[arg(long, value_enum)]
    pub process: Option<super::inspect::ProcessArg>,
    /// GPU architectures, e.g. "6.1;12.0", "61,120", "sm_61"; "12.0+PTX" on the highest is
    /// --ptx (default: the local GPUs)
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
    /// Build although this host's driver is too old for the plan's CUDA (the build is
    /// for other hosts, or the driver is being updated)
    #[arg(long)]
    pub allow_old_driver: bool,
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
    /// The flags as the pipeline takes them.
    fn request(&self) -> pipeline::Request {
        pipeline::Request {
            build: BuildRequest {
                tag: self.tag.clone(),
                archs: self.archs.clone(),
                cuda: self.cuda.clone(),
                jobs: self.jobs,
                ptx: self.ptx,
                only_funcs: self.only_funcs.clone(),
                process: self.process.map(super::inspect::ProcessArg::kind),
            },
            backend: BackendRequest {
                backend: self.backend,
                dockerfile: self.dockerfile.clone(),
                base_image: self.base_image.clone(),
                toolchain_volumes: self.toolchain_volumes,
                cuda_home: self.cuda_home.clone(),
                source: self.source.clone(),
                allow_cuda_mismatch: self.allow_cuda_mismatch,
                dry_run: self.dry_run,
            },
            force: self.force,
            no_wait: self.no_wait,
            dry_run: self.dry_run,
            no_store: self.no_store,
            allow_old_driver: self.allow_old_driver,
            verbosity: if self.quiet || self.json {
                Verbosity::Quiet
            } else if self.verbose {
                Verbosity::Verbose
            } else {
                Verbosity::Normal
            },
        }
    }
}

pub(super) fn run(ctx: &Context, project: &Project, args: BuildArgs) -> Result<()> {
    // The local GPUs are read while planning, and shown once the plan is made, where they
    // help: with a dry run, with -v, or before a build that starts; never before an
    // error that has nothing to do with them.
    let seen: std::cell::RefCell<Option<Vec<gpu::Gpu>>> = Default::default();
    let infer = |flags: pipeline::CheckedFlags| {
        let sources = Sources {
            project,
            gpus: &|| {
                let gpus = gpu::query()?;
                *seen.borrow_mut() = Some(gpus.clone());
                Ok(gpus)
            },
            driver: &gpu::driver,
        };
        pipeline::infer(flags, &sources)
    };
    let (quiet, wanted) = (args.json || args.quiet, args.dry_run || args.verbose);
    let show = |accepted: bool| {
        if quiet || !(wanted || accepted) {
            return;
        }
        if let Some(gpus) = seen.borrow().as_deref() {
            crate::eprint_safe!("Local GPUs:\n{}", gpu::table(gpus));
        }
    };
    run_with(ctx, project, args, &infer, &show)
}

/// `fdl nccl build` with what the flags leave open inferred by `infer`: from this host
/// (the libtorch, the GPUs), or from a whole cluster's reports.
pub(super) fn run_inferred(
    ctx: &Context,
    project: &Project,
    args: BuildArgs,
    infer: &dyn Fn(pipeline::CheckedFlags) -> Result<pipeline::Inferred>,
) -> Result<()> {
    run_with(ctx, project, args, infer, &|_| {})
}

/// `shown(accepted)` is called once the plan is made, before it is printed: `accepted`
/// when a real build is about to start.
fn run_with(
    ctx: &Context,
    project: &Project,
    args: BuildArgs,
    infer: &dyn Fn(pipeline::CheckedFlags) -> Result<pipeline::Inferred>,
    shown: &dyn Fn(bool),
) -> Result<()> {
    if args.verbose {
        crate::eprintln_safe!("project root: {}", project.describe());
    }
    let prepared = pipeline::prepare(ctx, project, &args.request(), infer)?;
    // One rule for every dry run: every problem and warning, the plan, then a status that is 0
    // only when a real run would start.
    if args.dry_run {
        shown(false);
        if args.json {
            print_json(&json!({
                "dry_run": true,
                "plan": prepared.plan,
                "commands": prepared.commands,
                "store": prepared.store,
            }));
        } else {
            out!(
                "{}",
                render::plan(
                    &prepared.plan,
                    &prepared.commands,
                    &prepared.store,
                    args.verbose,
                    std::io::stdout().is_terminal(),
                )
            );
            outln!("Dry run: nothing was built, written or started.");
        }
        if !prepared.plan.findings.problems.is_empty() {
            let e: anyhow::Error = crate::project::RootIrrelevant(anyhow::anyhow!(
                "the plan cannot run: {} problem(s), listed with the plan",
                prepared.plan.findings.problems.len()
            ))
            .into();
            return Err(if args.json {
                super::common::JsonReported(e).into()
            } else {
                e
            });
        }
        return Ok(());
    }
    if let Some(e) = prepared.refusal() {
        shown(false);
        return Err(e);
    }
    shown(true);
    if !args.json && !args.quiet {
        // The whole plan (its commands, the run script) with -v; else what is built,
        // where and how, in a few lines (the log's path follows when the build starts).
        let text = if args.verbose {
            render::plan(
                &prepared.plan,
                &prepared.commands,
                &prepared.store,
                args.verbose,
                std::io::stderr().is_terminal(),
            )
        } else {
            render::header(
                &prepared.plan,
                &prepared.store,
                std::io::stderr().is_terminal(),
            )
        };
        crate::eprint_safe!("{text}");
    }
    report(&prepared.execute()?, args.json, args.quiet);
    Ok(())
}

fn report(report: &pipeline::Report, json_out: bool, quiet: bool) {
    let status = report.status();
    let (manifest, dir) = match &report.outcome {
        Outcome::Built { manifest, dir, .. } | Outcome::AlreadyBuilt { manifest, dir } => {
            (manifest, dir)
        }
    };
    let (outcome, name, preload) = (&report.outcome, &report.name, &report.preload);
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
        if let Outcome::Built { timings, .. } = outcome {
            v["timings"] = json!(timings);
        }
        if let Some(other) = &report.other_release {
            v["other_release"] = json!(other);
        }
        print_json(&v);
        return;
    }
    match status {
        Status::AlreadyBuilt => outln!(
            "Already built from the same plan ({}): {}\nNothing to do.",
            manifest.built_at,
            crate::text::shown(&dir)
        ),
        Status::Replaced => outln!("Rebuilt and replaced: {}", crate::text::shown(&dir)),
        Status::InstalledFromStore => outln!(
            "{} {} (no compile: {})",
            paint(
                &format!(
                    "Installed NCCL {} from the build store:",
                    manifest.checked.header_version
                ),
                Color::Green
            ),
            crate::text::shown(&dir),
            match outcome {
                Outcome::Built {
                    from_store: Some(m),
                    ..
                } => format!("files by {m}"),
                _ => String::new(),
            }
        ),
        Status::Built => outln!(
            "{} {}",
            paint(
                &format!("Built NCCL {}:", manifest.checked.header_version),
                Color::Green
            ),
            crate::text::shown(&dir)
        ),
    }
    if let Some(other) = &report.other_release {
        crate::eprintln_safe!("warning: build {}: {other}", crate::text::clean(name));
    }
    match &preload {
        Ok(p) => outln!(
            "\n{}\n  LD_PRELOAD: {}",
            super::common::stdout_row(
                "",
                "",
                &format!(
                    "Wire it with `eval \"$(fdl nccl env {name})\"`, or in a worker's env: block in fdl.cluster.yml:"
                )
            ),
            super::manage::yaml_quote(&p.to_string_lossy())
        ),
        Err(why) => outln!("\nNo LD_PRELOAD value for it: {why}"),
    }
    // Where the time went, beside the progress lines (stderr), which --quiet silences.
    if let (Outcome::Built { timings, .. }, false) = (outcome, quiet) {
        crate::eprintln_safe!("{}", took(timings));
    }
}

/// `Took 521.3 s: prepare 1.2 s, compile 480.1 s, …`: where a build's time went.
fn took(timings: &[crate::progress::PhaseTime]) -> String {
    let total: f64 = timings.iter().map(|t| t.seconds).sum();
    let parts: Vec<String> = timings
        .iter()
        .map(|t| format!("{} {:.1} s", t.phase, t.seconds))
        .collect();
    format!("Took {total:.1} s: {}", parts.join(", "))
}
