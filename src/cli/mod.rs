//! The command line: argument definitions and dispatch. Each subcommand module gathers
//! its inputs, calls the library, and renders text or one JSON object.

/// `print!` for command output: a failed write (a full disk, `> /dev/full`) is recorded
/// by [`common::write_out`] instead of panicking, and ends fdl with an error (see
/// [`finish_stdout`]).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::common::write_out(format_args!($($arg)*))
    };
}

/// `println!` for command output; see [`out!`].
macro_rules! outln {
    () => {
        $crate::cli::common::write_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {{
        $crate::cli::common::write_out(format_args!($($arg)*));
        $crate::cli::common::write_out(format_args!("\n"));
    }};
}

mod build;
mod cluster;
pub mod common;
mod complete;
mod gpus;
mod inspect;
mod launch;
mod libtorch;
mod manage;
mod ps;
mod store;

use crate::context::Context;
use crate::docker::EMBEDDED_DOCKERFILE;
use crate::project::Project;
use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

pub use build::BuildArgs;
use clap_complete::ArgValueCandidates;
use common::{build_name_arg, print_json};
pub use common::{
    finish_stdout, JsonReported, ModelWrong, Undecided, EXIT_MODEL_WRONG, EXIT_UNKNOWN, JSON_SCHEMA,
};
pub use launch::{JobStatus, LaunchArgs};
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
    #[command(
        subcommand,
        after_help = "Examples:\n  fdl nccl build --dry-run\n  fdl nccl detect\n  fdl nccl list"
    )]
    Nccl(NcclCommand),
    /// List, activate, add and describe libtorch variants
    #[command(
        subcommand,
        after_help = "Examples:\n  fdl libtorch list\n  fdl libtorch activate precompiled/cu128"
    )]
    Libtorch(LibtorchCommand),
    /// What an ELF library carries: SONAME, needs, NCCL, GPU code, and coverage per GPU
    #[command(
        after_help = "Examples:\n  fdl inspect libtorch/precompiled/cu128/lib/libtorch_cuda.so\n  fdl inspect libnccl.so.2 --archs \"6.1;12.0\" --json"
    )]
    Inspect {
        /// The ELF shared library to read (libtorch_cuda.so, libnccl.so.2, any .so)
        path: PathBuf,
        /// Judge coverage for these archs instead of the local GPUs
        #[arg(long)]
        archs: Option<String>,
        /// Print one JSON object
        #[arg(long)]
        json: bool,
    },
    /// Loads a library and prints ncclGetVersion (run by fdl in a child process)
    #[command(name = "__probe-nccl", hide = true)]
    ProbeNccl {
        /// The libnccl.so.2 to load
        path: PathBuf,
    },
    /// Many hosts, one NCCL: read fdl.cluster.yml and check every worker over SSH (or,
    /// with --slurm, the nodes of this Slurm allocation through srun)
    #[command(
        subcommand,
        after_help = "Examples:\n  fdl cluster status\n  fdl cluster env v2.27.5-sm61-sm120\n  salloc -N3 fdl cluster status --slurm"
    )]
    Cluster(cluster::ClusterCommand),
    /// Print a static shell completion script (commands and flags)
    #[command(
        after_help = "Example:\n  fdl completions bash > ~/.local/share/bash-completion/completions/fdl\n\nTo complete this project's variant and build names too, use the dynamic script instead:\n  source <(COMPLETE=bash fdl)      # in ~/.bashrc; zsh alike, fish: COMPLETE=fish fdl | source"
    )]
    Completions {
        /// The shell to complete for
        shell: clap_complete::Shell,
    },
    /// The machine-wide store of NCCL builds, shared by every project of this user
    #[command(
        subcommand,
        after_help = "Examples:\n  fdl store list\n  fdl store gc --yes"
    )]
    Store(store::StoreCommand),
    /// Which NCCL each running process of yours calls, and whether the ranks agree
    ///
    /// The processes of this user that map an NCCL, read from /proc alone (a hung job
    /// answers too): which file each one's calls reach and on what evidence (its GOT in
    /// memory, else the loader's rules), its rank, plugins and NCCL_* settings. Exit 1 when
    /// the ranks reach different NCCL files, 3 when a rank's answer is unknown.
    #[command(after_help = "Examples:\n  fdl ps\n  fdl ps --pid 4242 --json")]
    Ps(ps::PsArgs),
    /// Run a job (torchrun, mpirun, a script) with a build preloaded, and say which of its
    /// processes do not run it
    #[command(
        long_about = "Run COMMAND in the foreground with the build `fdl nccl env` would wire (or --build) in its \
LD_PRELOAD. fdl passes SIGINT, SIGTERM and SIGHUP on to the job's process group and exits with its status \
(128+N for a death by signal N). While it runs, fdl reads from /proc every process of the job that maps an \
NCCL and says on stderr, once per process, any that reaches another NCCL or lost LD_PRELOAD, with the likely \
cause; at the end, one line says how many workers were checked. Nothing of the job is left running when fdl ends.",
        after_help = "Examples:\n  fdl launch -- torchrun --nproc-per-node 2 train.py\n  fdl launch --strict --build v2.27.5-sm61-sm120 -- python -m torch.distributed.run --nproc-per-node 2 train.py\n  fdl launch -- mpirun -x LD_PRELOAD -np 4 python train.py\n  srun fdl launch -- python train.py   # one fdl per task: srun's tasks are not fdl's children"
    )]
    Launch(LaunchArgs),
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
    /// Which NCCL a process runs, as glibc's loader decides: preloads, the DT_NEEDED
    /// closure, symbol binding
    #[command(
        after_help = "Answers for a process started with your environment (LD_PRELOAD, LD_LIBRARY_PATH), so\n`eval \"$(fdl nccl env)\"; fdl nccl detect` shows whether the preload takes.\nExit status: 0 when it answers (an NCCL, or none), 3 when it cannot say or the\nprocess would run two NCCLs, 4 when --witness finds the loader disagreeing with\nfdl's model (the loader's answer stands), 1 on an error.\nA pip torch (site-packages/torch) is answered for a Python process importing it:\ntorch's own __init__.py may open an NCCL from sys.path first (--process, --cwd);\n--witness then runs its interpreter importing torch (no GPU) and reads the process.\n\nExamples:\n  fdl nccl detect              # the active libtorch's libtorch_cuda.so\n  fdl nccl detect --witness    # and what this host's own loader binds\n  fdl nccl detect site-packages/torch/lib/libtorch_cuda.so --json\n  fdl nccl detect ./train --preload /path/libnccl.so.2   # a program, another preload"
    )]
    Detect {
        /// A shared library (answered for a program that links it) or a program.
        /// Default: the active libtorch's lib/libtorch_cuda.so
        path: Option<PathBuf>,
        /// Answer for this LD_PRELOAD instead of yours ('' for none); split as glibc does
        #[arg(long, value_name = "LIST")]
        preload: Option<String>,
        /// Answer for this LD_LIBRARY_PATH instead of yours ('' for none)
        #[arg(long, value_name = "DIRS")]
        library_path: Option<String>,
        /// Print one JSON object: the answer, the calls, the link map
        #[arg(long)]
        json: bool,
        /// Also ask this host's own loader (traced, nothing run) and print both answers;
        /// exit 4 when they differ
        #[arg(long)]
        witness: bool,
        /// Say how each call binds, why, and every library that cannot be loaded (the
        /// answer is otherwise one short line, the calls one line per caller)
        #[arg(long, short)]
        verbose: bool,
        #[command(flatten)]
        process: inspect::ProcessFlags,
    },
    /// Which plugins (net, tuner, profiler, env, gin, rma) the process's NCCL would dlopen,
    /// where the loader finds them, and whether their entry versions fit this NCCL
    #[command(
        after_help = "Reads NCCL_<KIND>_PLUGIN from your environment and searches as a dlopen from the\nNCCL object does. The loader's own trace covers startup only, so a dlopen is\nmodelled, not witnessed.\n\nExamples:\n  fdl nccl plugins\n  fdl nccl plugins site-packages/torch/lib/libtorch_cuda.so --json"
    )]
    Plugins {
        /// A shared library (answered for a program that links it) or a program.
        /// Default: the active libtorch's lib/libtorch_cuda.so
        path: Option<PathBuf>,
        /// Print one JSON object
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        process: inspect::ProcessFlags,
    },
    /// Check builds: layout, versions, manifest, SASS per arch and GPU, and that it loads
    #[command(
        after_help = "Examples:\n  fdl nccl verify\n  fdl nccl verify v2.27.5-sm61-sm120 --json"
    )]
    Verify {
        /// Default: every build
        #[arg(value_parser = build_name_arg, add = ArgValueCandidates::new(complete::builds))]
        build: Option<String>,
        /// Print one JSON object (the exit status still says whether all passed)
        #[arg(long)]
        json: bool,
    },
    /// List every NCCL build, and anything partial or broken beside them
    #[command(after_help = "Example:\n  fdl nccl list --json")]
    List {
        /// Print one JSON object
        #[arg(long)]
        json: bool,
    },
    /// Remove NCCL builds (asks on a terminal unless --yes)
    #[command(after_help = "Example:\n  fdl nccl remove v2.27.5-sm61-sm120 --yes")]
    Remove {
        /// Build names as `fdl nccl list` shows them, or leftovers of interrupted builds
        #[arg(required = true, value_parser = common::build_or_leftover_arg,
              add = ArgValueCandidates::new(complete::builds))]
        builds: Vec<String>,
        /// Do not ask
        #[arg(long, short)]
        yes: bool,
        /// Fail instead of waiting when a build of that target is running
        #[arg(long)]
        no_wait: bool,
    },
    /// Print the LD_PRELOAD wiring for a build (default: newest matching the active libtorch)
    #[command(
        after_help = "Examples:\n  eval \"$(fdl nccl env)\"\n  fdl nccl env v2.27.5-sm61-sm120 --format yaml   # for fdl.cluster.yml"
    )]
    Env {
        /// A build as `fdl nccl list` names it (default: the newest matching the active
        /// libtorch's NCCL)
        #[arg(value_parser = build_name_arg, add = ArgValueCandidates::new(complete::builds))]
        build: Option<String>,
        /// How to print it: shell `export` lines, a YAML env: block, or JSON
        #[arg(long, value_enum, default_value_t = manage::EnvFormat::Shell)]
        format: manage::EnvFormat,
        /// The same as --format json
        #[arg(long, conflicts_with = "format")]
        json: bool,
    },
}

/// An error from a command that works in a project: it says which root was used and
/// why, since a wrong guess is the commonest cause of a surprising "not found".
#[derive(Debug, thiserror::Error)]
#[error("{cause:#}\n  (project root: {root})")]
pub struct InProject {
    cause: anyhow::Error,
    root: String,
}

impl Command {
    /// Whether the command reads the project (its libtorch/ variants, its builds,
    /// fdl.yml): then an error says which root was taken ([`InProject`]). `nccl detect`
    /// and `nccl plugins` given a PATH read that file and nothing of the project.
    fn reads_project(&self) -> bool {
        match self {
            Command::Nccl(NcclCommand::Detect { path, .. })
            | Command::Nccl(NcclCommand::Plugins { path, .. }) => path.is_none(),
            Command::Nccl(_) | Command::Libtorch(_) | Command::Cluster(_) | Command::Launch(_) => {
                true
            }
            Command::Inspect { .. }
            | Command::ProbeNccl { .. }
            | Command::Completions { .. }
            | Command::Store(_)
            | Command::Ps(_)
            | Command::Gpus { .. } => false,
        }
    }

    /// Whether the user asked for one JSON object: then an error is one too.
    fn wants_json(&self) -> bool {
        match self {
            Command::Inspect { json, .. } | Command::Gpus { json } => *json,
            Command::Nccl(n) => match n {
                NcclCommand::Build(args) => args.json,
                NcclCommand::Detect { json, .. }
                | NcclCommand::Plugins { json, .. }
                | NcclCommand::Verify { json, .. }
                | NcclCommand::List { json } => *json,
                NcclCommand::Env { json, format, .. } => {
                    *json || matches!(format, manage::EnvFormat::Json)
                }
                NcclCommand::Dockerfile | NcclCommand::Remove { .. } => false,
            },
            Command::Libtorch(l) => l.wants_json(),
            Command::Cluster(c) => c.wants_json(),
            Command::Store(s) => s.wants_json(),
            Command::Ps(a) => a.json,
            Command::ProbeNccl { .. } | Command::Completions { .. } | Command::Launch(_) => false,
        }
    }
}

/// The command line, parsed. A usage error of a command that asked for JSON (`--json`,
/// `--format json`) is also one `{"error": …}` object on stdout, as every other error
/// of such a command is, before clap says it on stderr and exits 2; help and version
/// print as clap prints them.
pub fn parse() -> Cli {
    use clap::Parser;
    match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            let asks_json = || {
                // Lossy: `args()` panics on an argument that is not UTF-8.
                let args: Vec<String> = std::env::args_os()
                    .skip(1)
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect();
                args.iter().any(|a| a == "--json" || a == "--format=json")
                    || args
                        .windows(2)
                        .any(|w| w[0] == "--format" && w[1] == "json")
            };
            let shown = !matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion);
            if shown && asks_json() {
                // clap's message on one line: its lines joined, the blank ones left out.
                let text = e.render().to_string();
                let text = text
                    .trim_start_matches("error: ")
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .collect::<Vec<_>>()
                    .join(" ");
                print_json(&serde_json::json!({ "error": text }));
                let _ = finish_stdout();
            }
            e.exit()
        }
    }
}

/// Answers a shell's completion request and exits when `$COMPLETE` names a shell (the
/// script `source <(COMPLETE=bash fdl)` registers sets it); otherwise returns, and fdl
/// runs as usual. Variant and build names come from [`complete`].
pub fn complete_from_env() {
    // What the static script offers: fdl's own plumbing stays out of completions.
    clap_complete::CompleteEnv::with_factory(|| visible(&<Cli as clap::CommandFactory>::command()))
        .complete();
}

pub fn run(cli: Cli) -> Result<()> {
    let project = Project::from_process(cli.root.as_deref())?;
    // The one context of this run: the environment read once, messages from below the
    // CLI said on stderr.
    let ctx = &Context::from_process();
    let uses_project = matches!(
        cli.command,
        Command::Nccl(_) | Command::Libtorch(_) | Command::Cluster(_) | Command::Launch(_)
    );
    let json_errors = cli.command.wants_json();
    let reads_project = cli.command.reads_project();
    let result = if uses_project {
        project
            .check_exists()
            .and_then(|()| dispatch(cli, &project, ctx))
    } else {
        dispatch(cli, &project, ctx)
    };
    if let (Err(e), true) = (&result, json_errors) {
        // Scripts read stdout: the error is there as one object too (stderr still says it).
        if e.downcast_ref::<crate::process::Interrupted>().is_none()
            && e.downcast_ref::<JsonReported>().is_none()
            && e.downcast_ref::<Undecided>().is_none()
            && e.downcast_ref::<ModelWrong>().is_none()
            && e.downcast_ref::<JobStatus>().is_none()
        {
            print_json(&serde_json::json!({ "error": format!("{e:#}") }));
        }
    }
    match result {
        // The root is named where it is part of the error: a command that reads the
        // project, and an error that is not the command line's own (a malformed flag).
        Err(cause)
            if reads_project
                && !crate::project::RootIrrelevant::is_in(&cause)
                && cause
                    .downcast_ref::<crate::process::Interrupted>()
                    .is_none()
                && cause.downcast_ref::<Undecided>().is_none()
                && cause.downcast_ref::<ModelWrong>().is_none()
                && cause.downcast_ref::<JobStatus>().is_none() =>
        {
            Err(InProject {
                cause,
                root: project.describe(),
            }
            .into())
        }
        other => other,
    }
}

fn dispatch(cli: Cli, project: &Project, ctx: &Context) -> Result<()> {
    match cli.command {
        Command::Nccl(NcclCommand::Build(args)) => build::run(ctx, project, args),
        Command::Nccl(NcclCommand::Dockerfile) => {
            out!("{EMBEDDED_DOCKERFILE}");
            Ok(())
        }
        Command::Nccl(NcclCommand::List { json }) => manage::list(ctx, project, json),
        Command::Nccl(NcclCommand::Detect {
            path,
            preload,
            library_path,
            json,
            witness,
            verbose,
            process,
        }) => inspect::detect_cmd(
            project,
            path.as_deref(),
            inspect::DetectOpts {
                preload: preload.as_deref(),
                library_path: library_path.as_deref(),
                json,
                witness,
                verbose,
                process: process.opts(),
            },
        ),
        Command::Nccl(NcclCommand::Plugins {
            path,
            json,
            process,
        }) => inspect::plugins_cmd(project, path.as_deref(), json, process.opts()),
        Command::Nccl(NcclCommand::Verify { build, json }) => {
            inspect::verify_cmd(ctx, project, build.as_deref(), json)
        }
        Command::Inspect { path, archs, json } => {
            inspect::inspect_cmd(&path, archs.as_deref(), json)
        }
        Command::ProbeNccl { path } => inspect::probe_cmd(&path),
        Command::Nccl(NcclCommand::Remove {
            builds,
            yes,
            no_wait,
        }) => manage::remove(ctx, project, &builds, yes, no_wait),
        Command::Nccl(NcclCommand::Env {
            build,
            format,
            json,
        }) => {
            let format = if json {
                manage::EnvFormat::Json
            } else {
                format
            };
            manage::env(ctx, project, build.as_deref(), format)
        }
        Command::Libtorch(cmd) => libtorch::run(ctx, project, cmd),
        Command::Cluster(cmd) => cluster::run(ctx, project, cmd),
        Command::Store(cmd) => store::run(ctx, cmd),
        Command::Completions { shell } => {
            // clap_complete panics on a failed write: generate in memory, write as all output.
            let mut script = Vec::new();
            clap_complete::generate(
                shell,
                &mut visible(&<Cli as clap::CommandFactory>::command()),
                "fdl",
                &mut script,
            );
            out!("{}", String::from_utf8_lossy(&script));
            Ok(())
        }
        Command::Gpus { json } => gpus::run(json),
        Command::Ps(args) => ps::run(ctx, project, args),
        Command::Launch(args) => launch::run(ctx, project, args),
    }
}

/// `cmd` without its hidden subcommands and arguments (fdl's own plumbing, such as
/// `__probe-nccl` or `cluster self`): what completions offer. clap's generators list
/// hidden ones too.
pub fn visible(cmd: &clap::Command) -> clap::Command {
    let mut out = clap::Command::new(cmd.get_name().to_string())
        .args(cmd.get_arguments().filter(|a| !a.is_hide_set()).cloned())
        .subcommands(
            cmd.get_subcommands()
                .filter(|s| !s.is_hide_set())
                .map(visible),
        );
    if let Some(v) = cmd.get_version() {
        out = out.version(v.to_string());
    }
    if let Some(about) = cmd.get_about() {
        out = out.about(about.clone());
    }
    out
}
