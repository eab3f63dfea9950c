//! The command line: argument definitions and dispatch. Each subcommand module gathers
//! its inputs, calls the library, and renders text or one JSON object.

mod build;
mod gpus;
mod libtorch;

use crate::docker::EMBEDDED_DOCKERFILE;
use crate::project::Project;
use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

pub use build::BuildArgs;
pub use libtorch::LibtorchCommand;

#[derive(Debug, Parser)]
#[command(
    name = "fdl",
    version,
    about = "Build, inspect and wire NCCL for libtorch training on mixed GPU generations",
    after_help = "Example:\n  fdl nccl build --tag v2.27.5-1 --archs \"6.1;12.0\" --dry-run"
)]
pub struct Cli {
    /// Project root (default: $FDL_ROOT, else the nearest ancestor holding fdl.yml or libtorch/)
    #[arg(long, global = true, value_name = "DIR")]
    pub root: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build and inspect NCCL libraries
    #[command(subcommand)]
    Nccl(NcclCommand),
    /// List, activate and describe libtorch variants
    #[command(subcommand)]
    Libtorch(LibtorchCommand),
    /// Show the local GPUs (from nvidia-smi)
    #[command(after_help = "Example:\n  fdl gpus --json")]
    Gpus {
        /// Print one JSON object
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum NcclCommand {
    /// Build libnccl.so.2 from NVIDIA's source for exactly the GPUs of this rig
    #[command(
        long_about = "Build libnccl.so.2 from NVIDIA's NCCL source at the version the active libtorch bundles, \
for exactly the GPU architectures present, and install it under libtorch/nccl/builds/v<X.Y.Z>-<archs>/. \
Without --tag the version is read from the active libtorch; without --archs the GPUs are read from nvidia-smi.",
        after_help = "Examples:\n  fdl nccl build --tag v2.27.5-1 --archs \"6.1;12.0\" --dry-run\n  fdl nccl build            # infer tag from libtorch, archs from nvidia-smi"
    )]
    Build(BuildArgs),
    /// Print the Dockerfile fdl builds NCCL with
    #[command(
        after_help = "Example:\n  fdl nccl dockerfile > Dockerfile.nccl   # edit, then --dockerfile Dockerfile.nccl"
    )]
    Dockerfile,
}

pub fn run(cli: Cli) -> Result<()> {
    let project = Project::from_process(cli.root.as_deref())?;
    match cli.command {
        Command::Nccl(NcclCommand::Build(args)) => build::run(&project, args),
        Command::Nccl(NcclCommand::Dockerfile) => {
            print!("{EMBEDDED_DOCKERFILE}");
            Ok(())
        }
        Command::Libtorch(cmd) => libtorch::run(&project, cmd),
        Command::Gpus { json } => gpus::run(json),
    }
}

pub(crate) fn print_json(value: &serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("JSON values serialize")
    );
}
