//! `fdl nccl build`: flags → plan → backend → install → report.

use super::print_json;
use crate::docker::{DockerBackend, Engine, EMBEDDED_DOCKERFILE};
use crate::gpu;
use crate::nccl::build::{self, BuildRequest, Outcome, Sources};
use crate::nccl::plan::{ArchOrigin, BuildPlan, CudaOrigin, DockerfileSpec, TagOrigin};
use crate::nccl::store::BuildStore;
use crate::project::Project;
use anyhow::Result;
use clap::Args;
use serde_json::json;
use std::path::{Path, PathBuf};

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
    #[arg(long)]
    pub jobs: Option<u32>,
    /// Build with this Dockerfile instead of the embedded one
    #[arg(long, value_name = "PATH")]
    pub dockerfile: Option<PathBuf>,
    /// Replace an existing build of the same name (only after the new one succeeded)
    #[arg(long)]
    pub force: bool,
    /// Print the plan; touch neither Docker nor the disk
    #[arg(long)]
    pub dry_run: bool,
    /// Print the plan or the result as one JSON object
    #[arg(long)]
    pub json: bool,
}

pub(super) fn run(project: &Project, args: BuildArgs) -> Result<()> {
    let req = BuildRequest {
        tag: args.tag,
        archs: args.archs,
        cuda: args.cuda,
        jobs: args.jobs,
        dockerfile: args.dockerfile,
    };
    let sources = Sources {
        project,
        gpus: &|| {
            let gpus = gpu::query()?;
            if !args.json {
                eprint!("Local GPUs:\n{}", gpu::table(&gpus));
            }
            Ok(gpus)
        },
        embedded_dockerfile: EMBEDDED_DOCKERFILE,
    };
    let (plan, dockerfile_text) = build::plan(&req, &sources)?;
    let placeholders = (
        Path::new("<build-context>"),
        Path::new("<staging>"),
        "<container>",
    );
    if args.dry_run {
        let cmds = plan.docker_commands(placeholders.0, placeholders.1, placeholders.2);
        if args.json {
            print_json(&json!({ "dry_run": true, "plan": plan, "commands": cmds }));
        } else {
            print!("{}", render_plan(&plan, &cmds));
            println!("Dry run: nothing was built, written or started.");
        }
        return Ok(());
    }
    let engine = Engine::probe()?;
    let backend = DockerBackend {
        engine,
        dockerfile: dockerfile_text,
    };
    if !args.json {
        let cmds = plan.docker_commands(placeholders.0, placeholders.1, placeholders.2);
        eprint!("{}", render_plan(&plan, &cmds));
    }
    let store = BuildStore::new(project.nccl_builds_dir());
    let outcome = build::execute(&plan, &backend, &store, args.force)?;
    report(&outcome, args.json);
    Ok(())
}

fn report(outcome: &Outcome, json_out: bool) {
    let (status, manifest, dir) = match outcome {
        Outcome::Built {
            manifest,
            dir,
            replaced: false,
        } => ("built", manifest, dir),
        Outcome::Built { manifest, dir, .. } => ("replaced", manifest, dir),
        Outcome::AlreadyBuilt { manifest, dir } => ("already_built", manifest, dir),
    };
    let preload = dir.join("lib").join("libnccl.so.2");
    if json_out {
        print_json(&json!({
            "status": status,
            "build_dir": dir,
            "ld_preload": preload,
            "manifest": manifest,
        }));
        return;
    }
    match status {
        "already_built" => println!(
            "Already built from the same plan ({}): {}\nNothing to do.",
            manifest.built_at,
            dir.display()
        ),
        "replaced" => println!("Rebuilt and replaced: {}", dir.display()),
        _ => println!(
            "Built NCCL {}: {}",
            manifest.checked.header_version,
            dir.display()
        ),
    }
    println!(
        "\nFor a worker's env: block in fdl.cluster.yml:\n  LD_PRELOAD: {}",
        preload.display()
    );
}

fn render_plan(plan: &BuildPlan, cmds: &[Vec<String>]) -> String {
    let tag_from = match &plan.tag_origin {
        TagOrigin::Flag => "from --tag".to_string(),
        TagOrigin::Libtorch {
            variant,
            library,
            linkage,
        } => format!("from {variant}: {} ({linkage} NCCL)", library.display()),
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
    };
    let dockerfile = match &plan.docker.dockerfile {
        DockerfileSpec::Embedded { sha256 } => format!("embedded (sha256 {})", &sha256[..12]),
        DockerfileSpec::File { path, sha256 } => {
            format!("{} (sha256 {})", path.display(), &sha256[..12])
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
    row(
        "NCCL",
        plan.nccl_version
            .as_ref()
            .map_or("(not a release tag)".to_string(), |v| v.to_string()),
    );
    row("CUDA", format!("{}  ({cuda_from})", plan.cuda));
    row("archs", format!("{archs}  ({archs_from})"));
    row("gencode", plan.gencode.clone());
    row("jobs", format!("{}  ({})", plan.jobs, plan.jobs_reason));
    row("output", plan.output_dir.display().to_string());
    row("backend", plan.backend.to_string());
    row("image", plan.docker.image.clone());
    if let Some(base) = &plan.docker.base_image {
        row("base image", base.clone());
    }
    row("dockerfile", dockerfile);
    s.push_str("Docker commands:\n");
    for c in cmds {
        s.push_str(&format!("  {}\n", shell_words(c)));
    }
    s
}

/// Joins argv for display, quoting what a shell would split.
fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if !a.is_empty()
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_=.,:/<>@+".contains(&b))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}
