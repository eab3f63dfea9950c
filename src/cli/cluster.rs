//! `fdl cluster …`: the cluster file in, per-worker reports over SSH, verdicts out.

use super::{paint, print_json, Color};
use crate::cluster::config::{self, Cluster};
use crate::cluster::host::{self, Facts, SelfQuery};
use crate::cluster::ssh::Transport;
use crate::cluster::status::{self, OwnBinary, WorkerStatus};
use crate::nccl::store::BuildStore;
use crate::project::Project;
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use serde_json::json;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Every worker's GPUs, driver, libtorch and effective NCCL, then whether a
    /// multi-host run can start (exit 1 on any red verdict)
    #[command(after_help = "Example:\n  fdl cluster status --json")]
    Status {
        #[command(flatten)]
        common: Common,
        #[arg(long)]
        json: bool,
    },
    /// For each worker, the `env:` block to paste into fdl.cluster.yml (fdl never writes it)
    #[command(after_help = "Example:\n  fdl cluster env v2.27.5-sm61-sm120")]
    Env {
        /// A build of this project (default: as `fdl nccl env` picks)
        build: Option<String>,
        #[command(flatten)]
        common: Common,
        #[arg(long, value_enum, default_value_t = EnvFormat::Yaml)]
        format: EnvFormat,
    },
    /// This host's report for the controller (run by fdl over SSH)
    #[command(name = "self", hide = true)]
    SelfReport {
        /// The libtorch variant (default: the active one)
        #[arg(long)]
        arch: Option<String>,
        /// The library the worker's env preloads
        #[arg(long)]
        ld_preload: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct Common {
    /// The cluster overlay (default: fdl.cluster.yml in the project root, over fdl.yml)
    #[arg(long, value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// Seconds each worker gets to answer
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
    /// Workers queried at once
    #[arg(long, default_value_t = 16)]
    pub jobs: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EnvFormat {
    Yaml,
    Json,
}

impl ClusterCommand {
    pub(super) fn wants_json(&self) -> bool {
        match self {
            ClusterCommand::Status { json, .. } | ClusterCommand::SelfReport { json, .. } => *json,
            ClusterCommand::Env { format, .. } => *format == EnvFormat::Json,
        }
    }
}

pub(super) fn run(project: &Project, cmd: ClusterCommand) -> Result<()> {
    match cmd {
        ClusterCommand::SelfReport {
            arch,
            ld_preload,
            json: _,
        } => {
            let report = host::report(&SelfQuery {
                root: project.root.clone(),
                arch,
                ld_preload,
            });
            print_json(&serde_json::to_value(&report)?);
            Ok(())
        }
        ClusterCommand::Status { common, json } => status_cmd(project, &common, json),
        ClusterCommand::Env {
            build,
            common,
            format,
        } => env_cmd(project, &common, build.as_deref(), format),
    }
}

fn load(project: &Project, common: &Common) -> Result<Cluster> {
    config::load(&project.root, common.file.as_deref())
}

fn status_cmd(project: &Project, common: &Common, json: bool) -> Result<()> {
    let cluster = load(project, common)?;
    let transport = Transport::new(
        &crate::cache::cache_dir(),
        Duration::from_secs(common.timeout.clamp(1, 60)),
    )?;
    let own = OwnBinary::current()?;
    // One line per host as each answers, on a terminal; nothing otherwise.
    let live = !json && std::io::stderr().is_terminal();
    let done = |w: &WorkerStatus| {
        if live {
            let state = if w.error.is_some() {
                "failed"
            } else {
                "answered"
            };
            eprintln!("  {} ({}): {state}", w.host, w.target);
        }
    };
    let workers = status::query_all(
        &cluster,
        &transport,
        &own,
        Duration::from_secs(common.timeout.max(1)),
        common.jobs,
        &done,
    );
    let verdicts = status::verdicts(&workers);
    let red: Vec<&str> = verdicts.iter().filter(|v| !v.ok).map(|v| v.name).collect();
    if json {
        print_json(&json!({
            "files": cluster.files,
            "workers": workers,
            "verdicts": verdicts,
            "ok": red.is_empty(),
        }));
    } else {
        print!("{}", render_status(&workers));
        println!("Verdicts:");
        for v in &verdicts {
            let mark = if v.ok {
                paint("ok ", Color::Green)
            } else {
                paint("RED", Color::Red)
            };
            println!("  {mark} {:<9} {}", v.name, v.detail);
        }
    }
    if !red.is_empty() {
        let e = anyhow::anyhow!("the cluster is not ready: {}", red.join(", "));
        return Err(if json {
            super::JsonReported(e).into()
        } else {
            e
        });
    }
    Ok(())
}

fn render_status(workers: &[WorkerStatus]) -> String {
    let mut s = String::new();
    for w in workers {
        s.push_str(&format!("{} ({}:{})\n", w.host, w.target, w.path));
        let Some(r) = &w.report else {
            s.push_str(&format!(
                "  {}\n",
                paint(
                    &format!("unreachable: {}", w.error.as_deref().unwrap_or("?")),
                    Color::Red
                )
            ));
            continue;
        };
        let row = |s: &mut String, k: &str, v: String| s.push_str(&format!("  {k:<9} {v}\n"));
        row(
            &mut s,
            "gpus",
            match &r.gpus {
                Facts::Known(g) => g
                    .iter()
                    .map(|g| format!("{}: {} (sm_{})", g.index, g.name, g.compute_cap.number()))
                    .collect::<Vec<_>>()
                    .join(", "),
                Facts::Unknown(why) => why.clone(),
            },
        );
        row(
            &mut s,
            "driver",
            match &r.driver {
                Facts::Known(d) => format!(
                    "{} (CUDA {})",
                    d.version,
                    d.cuda.map(|c| c.to_string()).unwrap_or_else(|| "?".into())
                ),
                Facts::Unknown(why) => why.clone(),
            },
        );
        match &r.libtorch {
            Facts::Known(lt) => {
                let nccl = match &lt.nccl {
                    Facts::Known(n) => format!("NCCL {} ({})", n.version, n.linkage),
                    Facts::Unknown(why) => format!("NCCL unknown: {why}"),
                };
                row(&mut s, "libtorch", format!("{}: {nccl}", lt.variant));
                row(
                    &mut s,
                    "bridge",
                    match &lt.bridge {
                        Facts::Known(b) => format!(
                            "{}: {}",
                            if b.takes_effect {
                                "preload works"
                            } else {
                                "PRELOAD INEFFECTIVE"
                            },
                            b.why
                        ),
                        Facts::Unknown(why) => format!("unknown: {why}"),
                    },
                );
            }
            Facts::Unknown(why) => row(&mut s, "libtorch", why.clone()),
        }
        row(
            &mut s,
            "nccl",
            match &r.effective {
                Facts::Known(n) => format!(
                    "{} {} from {}",
                    n.version,
                    if n.linkage == "preload" {
                        "(LD_PRELOAD)"
                    } else {
                        "(bundled)"
                    },
                    status::short(&n.file, &w.path)
                ),
                Facts::Unknown(why) => why.clone(),
            },
        );
        if !r.coverage.is_empty() {
            row(
                &mut s,
                "coverage",
                r.coverage
                    .iter()
                    .map(|c| {
                        let text = format!("GPU {}: {}", c.index, c.verdict);
                        if c.covered {
                            text
                        } else {
                            paint(
                                &format!("GPU {}: NO CODE for {}", c.index, c.arch),
                                Color::Red,
                            )
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            );
        }
        if w.shipped_fdl {
            row(&mut s, "fdl", "shipped from the controller".into());
        }
    }
    s
}

fn env_cmd(
    project: &Project,
    common: &Common,
    build: Option<&str>,
    format: EnvFormat,
) -> Result<()> {
    let cluster = load(project, common)?;
    let store = BuildStore::new(project.nccl_builds_dir());
    let (name, _, why) = super::manage::pick_build(project, &store, build)?;
    let rel = format!("libtorch/nccl/builds/{name}/lib/libnccl.so.2");
    let mut entries = Vec::new();
    for w in &cluster.workers {
        let path = format!("{}/{rel}", w.path.trim_end_matches('/'));
        if path.chars().any(char::is_control) {
            bail!(
                "worker {}'s path holds a control character: fix `path:` in the cluster file",
                w.host
            );
        }
        entries.push((w, path));
    }
    match format {
        EnvFormat::Json => print_json(&json!({
            "build": name,
            "why": why,
            "workers": entries.iter().map(|(w, p)| json!({
                "host": w.host,
                "env": { "LD_PRELOAD": p },
            })).collect::<Vec<_>>(),
        })),
        EnvFormat::Yaml => {
            println!("# fdl never edits your cluster file: paste each block under its worker.");
            println!("# Build {name} ({why}); it must be at that path on each worker.");
            for (w, p) in &entries {
                println!("\n# worker {}", super::manage::comment_text(&w.host));
                println!("env:\n  LD_PRELOAD: {}", super::manage::yaml_quote(p));
            }
        }
    }
    Ok(())
}
