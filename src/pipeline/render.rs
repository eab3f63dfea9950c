//! The plan as a person reads it: one row per input with where it came from, the
//! commands it will run, then its warnings and problems. The one text rendering of a
//! [`BuildPlan`]; `--json` prints the plan's own serialization instead.

use super::key::StoreView;
use crate::native;
use crate::nccl::plan::{
    ArchOrigin, BackendPlan, BuildPlan, CudaOrigin, DockerSource, DockerSteps, DockerfileSpec,
    NativeSource, TagOrigin, ToolchainFiles,
};
use crate::step::{Paths, Step};
use crate::text::{clean, paint, Color};

/// The steps the plan will run, with placeholders for the private paths a run makes
/// (`<staging>`): the same values a run executes, rendered.
pub fn steps(plan: &BuildPlan) -> Vec<Step> {
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

fn host_values(v: &[crate::nccl::plan::HostValue]) -> String {
    v.iter()
        .map(|h| format!("{} {}", h.host, h.value))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn plan(plan: &BuildPlan, cmds: &[String], store: &StoreView) -> String {
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
