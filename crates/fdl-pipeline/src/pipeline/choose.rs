//! Choosing the backend: `--backend auto|docker|native` and the flags that imply one,
//! asked of this host (does a Docker daemon answer? is the native toolchain complete?),
//! with the reason the plan shows.

use crate::docker::{self, Engine};
use crate::native;
use crate::nccl::plan::{BackendInputs, DockerSource, VolumesFlag};
use crate::nccl::tag::Tag;
use crate::project::RootIrrelevant;
use anyhow::{bail, Result};
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendFlag {
    /// Docker when its daemon answers, else native when the toolchain is complete
    Auto,
    Docker,
    Native,
}

/// What the user asked of the backend.
#[derive(Debug, Clone)]
pub struct BackendRequest {
    pub backend: BackendFlag,
    pub dockerfile: Option<PathBuf>,
    pub base_image: Option<String>,
    pub toolchain_volumes: VolumesFlag,
    pub cuda_home: Option<PathBuf>,
    pub source: Option<PathBuf>,
    pub allow_cuda_mismatch: bool,
    /// A dry run plans for Docker even where its daemon does not answer.
    pub dry_run: bool,
}

impl BackendRequest {
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
pub(crate) enum Chosen {
    Docker {
        engine: Option<Engine>,
        dockerfile: String,
    },
    /// `missing`: the tools a compile needs that this host lacks (none are needed to
    /// install from the store).
    Native { missing: Vec<String> },
}

/// Picks the backend for `tag` as `--backend` says; `auto` asks the Docker daemon first.
pub(crate) fn choose(
    ctx: &crate::context::Context,
    req: &BackendRequest,
    tag: &Tag,
) -> Result<(BackendInputs, String, Chosen)> {
    let native_flag = req.wants_native();
    let docker_flag = if req.dockerfile.is_some() {
        Some("--dockerfile")
    } else if req.base_image.is_some() {
        Some("--base-image")
    } else {
        None
    };
    if let (Some(flag), Some(dflag)) = (native_flag, docker_flag) {
        bail!("{dflag} is for the Docker backend and {flag} for the native one: give one of them");
    }
    if let Some(img) = &req.base_image {
        docker::check_image_reference(img).map_err(RootIrrelevant)?;
    }
    let docker = |engine: Option<Engine>,
                  reason: String|
     -> Result<(BackendInputs, String, Chosen)> {
        // What is wrong with a file the command line names is the command line's.
        let (spec, text) =
            docker::dockerfile_spec(req.dockerfile.as_deref()).map_err(RootIrrelevant)?;
        let source = match &req.source {
            Some(dir) => {
                let (path, version) = native::check_source_dir(dir, tag).map_err(RootIrrelevant)?;
                DockerSource::Context { path, version }
            }
            None => DockerSource::Clone,
        };
        // The image is looked into before anything is built, where an engine answers
        // (a dry run on a machine without one still shows the plan).
        let engine = match engine {
            None if req.base_image.is_some() => Engine::probe(ctx).ok(),
            e => e,
        };
        let probe = match (&req.base_image, &engine) {
            (Some(image), Some(_)) => Some(docker::probe_image(ctx, image)?),
            _ => None,
        };
        let storage_driver = match (&engine, req.toolchain_volumes) {
            (Some(e), VolumesFlag::Auto) => e.storage_driver(),
            _ => None,
        };
        Ok((
            BackendInputs::Docker {
                dockerfile: spec,
                base_image: req.base_image.clone(),
                source,
                probe,
                volumes: req.toolchain_volumes,
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
            // About this host's toolkit, not the project.
            return Err(RootIrrelevant(anyhow::anyhow!(
                "the native backend cannot build here:\n  {}",
                report.missing.join("\n  ")
            ))
            .into());
        };
        let source = native::source_for(req.source.as_deref(), tag, &ctx.cache()?)?;
        let inputs = BackendInputs::Native {
            toolkit,
            tools: report.tools,
            source,
            allow_cuda_mismatch: req.allow_cuda_mismatch,
        };
        Ok((
            inputs,
            reason,
            Chosen::Native {
                missing: report.missing,
            },
        ))
    };
    let discover = || native::discover(req.cuda_home.as_deref(), req.source.is_none());
    match req.backend {
        BackendFlag::Docker => {
            if let Some(flag) = native_flag {
                bail!("{flag} is for the native backend, but --backend docker was given");
            }
            // The engine is asked now, as auto asks it: its storage driver decides the
            // toolchain volumes, and its answer whether a real run can start.
            docker(Engine::probe(ctx).ok(), "--backend docker".into())
        }
        BackendFlag::Native => {
            if let Some(flag) = docker_flag {
                return Err(RootIrrelevant(anyhow::anyhow!(
                    "{flag} is for the Docker backend, but --backend native was given"
                ))
                .into());
            }
            native(discover(), "--backend native".into())
        }
        BackendFlag::Auto => {
            if let Some(flag) = native_flag {
                return native(discover(), format!("auto: {flag} given"));
            }
            match Engine::probe(ctx) {
                Ok(engine) => {
                    let reason = format!(
                        "auto: the Docker daemon answers (server {})",
                        engine.server_version
                    );
                    docker(Some(engine), reason)
                }
                Err(docker_err) => match docker_flag {
                    Some(flag) if req.dry_run => docker(
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
                    } else if req.dry_run {
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
