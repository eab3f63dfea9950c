//! `fdl cluster …`: the hosts in (the cluster file's over SSH, or the Slurm allocation's
//! nodes through srun), per-worker reports, verdicts out.

use super::common::print_json;
use crate::cluster::config::{self, Worker};
use crate::cluster::host::{self, Facts, SelfQuery};
use crate::cluster::ps::{self, HostAnswer, HostPs};
use crate::cluster::receive;
use crate::cluster::ship::{self, Outcome, ShipRequest, ShipResult};
use crate::cluster::slurm::{self, Slurm};
use crate::cluster::ssh::Ssh;
use crate::cluster::status::{self, OwnBinary, WorkerStatus};
use crate::cluster::transport::{Transport, Unreached};
use crate::context::Context;
use crate::nccl::store::BuildStore;
use crate::project::Project;
use crate::text::{clean, paint, Color};
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
        /// Print one JSON object (the exit status still says whether it is ready)
        #[arg(long)]
        json: bool,
        /// Do not ask each worker's own loader what it binds (faster; the model alone
        /// answers there)
        #[arg(long)]
        no_witness: bool,
        /// On a worker whose libtorch is a pip torch, run its interpreter importing torch
        /// and read which NCCL the calls reach (seconds and ~0.5 GB per worker)
        #[arg(long, conflicts_with = "no_witness")]
        python_witness: bool,
        /// Answer every worker for this kind of process (default: each variant's own:
        /// python for a pip torch, program for any other)
        #[arg(long, value_enum)]
        process: Option<super::inspect::ProcessArg>,
    },
    /// The one NCCL build for the whole cluster (the tag of the highest libtorch NCCL, the
    /// union of every worker's GPUs, a CUDA every driver runs), printed as `nccl build
    /// --dry-run` prints a plan
    #[command(
        after_help = "Example:\n  fdl cluster plan --json",
        mut_arg("tag", |a| a.help(CLUSTER_TAG_HELP)),
        mut_arg("archs", |a| a.help(CLUSTER_ARCHS_HELP)),
        mut_arg("cuda", |a| a.help(CLUSTER_CUDA_HELP)),
        // A plan is always a dry run.
        mut_arg("dry_run", |a| a.hide(true)),
        mut_arg("json", |a| a.help("Print the plan as one JSON object"))
    )]
    Plan {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        build: super::build::BuildArgs,
    },
    /// Build that plan here, on the controller, with `fdl nccl build`'s backends
    #[command(
        after_help = "Example:\n  fdl cluster build --backend docker",
        mut_arg("tag", |a| a.help(CLUSTER_TAG_HELP)),
        mut_arg("archs", |a| a.help(CLUSTER_ARCHS_HELP)),
        mut_arg("cuda", |a| a.help(CLUSTER_CUDA_HELP))
    )]
    Build {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        build: super::build::BuildArgs,
    },
    /// For each worker, the `env:` block to paste into fdl.cluster.yml (fdl never writes it)
    #[command(after_help = "Example:\n  fdl cluster env v2.27.5-sm61-sm120")]
    Env {
        /// A build of this project (default: as `fdl nccl env` picks)
        #[arg(value_parser = super::common::build_name_arg,
              add = clap_complete::ArgValueCandidates::new(super::complete::builds))]
        build: Option<String>,
        #[command(flatten)]
        common: Common,
        /// How to print the blocks: YAML to paste, or one JSON object
        #[arg(long, value_enum, default_value_t = EnvFormat::Yaml)]
        format: EnvFormat,
        /// The same as --format json
        #[arg(long, conflicts_with = "format")]
        json: bool,
    },
    /// Copy a build to every worker's <path>/libtorch/nccl/builds/<name>/, verify it
    /// there, and install it atomically (a no-op where the same bytes are already there)
    #[command(
        after_help = "Examples:\n  fdl cluster ship v2.27.5-sm61-sm120\n  fdl cluster ship --workers node-a,node-b --dry-run"
    )]
    Ship {
        /// A build of this project (default: as `fdl nccl env` picks)
        #[arg(value_parser = super::common::build_name_arg,
              add = clap_complete::ArgValueCandidates::new(super::complete::builds))]
        build: Option<String>,
        /// Only these workers (their `host:` names, comma-separated)
        #[arg(long, value_delimiter = ',', value_name = "A,B")]
        workers: Vec<String>,
        /// Replace a different build of the same name on a worker
        #[arg(long)]
        force: bool,
        /// Say what would be copied where; change nothing
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        common: Common,
        /// Print one JSON object (the exit status still says whether all got it)
        #[arg(long)]
        json: bool,
    },
    /// Which NCCL each rank of a running job runs: every worker's processes that map an
    /// NCCL (read from /proc: the files mapped and which one the nccl* calls reach), then
    /// whether the ranks agree (exit 1 on any red verdict)
    #[command(
        after_help = "Examples:\n  fdl cluster ps\n  fdl cluster ps --slurm --jobid 4242 --json"
    )]
    Ps {
        /// The build every rank should run (default: as `fdl cluster env` picks; none
        /// when the project has no build)
        #[arg(value_parser = super::common::build_name_arg,
              add = clap_complete::ArgValueCandidates::new(super::complete::builds))]
        build: Option<String>,
        #[command(flatten)]
        common: Common,
        /// Print one JSON object (the exit status still says whether the ranks agree)
        #[arg(long)]
        json: bool,
        /// Do not read the processes' memory (the slots their nccl* calls go through):
        /// answer from the maps and the loader's rules
        #[arg(long)]
        no_memory: bool,
    },
    /// Rehearse NCCL's bootstrap without GPUs: each worker's own NCCL (the one its ranks
    /// load, in its env: block) chooses its bootstrap interface and address, then the
    /// root listens there while every worker connects, and back (exit 1 on a failure a
    /// launch would meet)
    #[command(
        after_help = "Examples:\n  fdl cluster rehearse\n  fdl cluster rehearse --rank0 node-a --within 10 --json"
    )]
    Rehearse {
        #[command(flatten)]
        common: Common,
        /// The worker of rank 0, whose NCCL's address every rank joins (its `host:` name;
        /// default: the first worker). Named so as not to be fdl's `--root`, the project's
        #[arg(long = "rank0", value_name = "HOST")]
        rank0: Option<String>,
        /// Seconds the listen and connect phase may take, 1 to 600 (a pair that has not
        /// connected by then failed)
        #[arg(long, default_value_t = 5, value_name = "SECONDS",
              value_parser = clap::value_parser!(u64).range(1..=600))]
        within: u64,
        /// Print one JSON object (the exit status still says whether it would start)
        #[arg(long)]
        json: bool,
    },
    /// This host's NCCL's bootstrap address, for `cluster rehearse` (run by fdl over SSH)
    #[command(name = "bootstrap-self", hide = true)]
    BootstrapSelf {
        /// The libtorch variant (default: the active one)
        #[arg(long)]
        arch: Option<String>,
        /// The worker's LD_PRELOAD, as its env: block writes it
        #[arg(long)]
        ld_preload: Option<String>,
        /// NAME=VALUE of the worker's env: block: NCCL_*, and what the report reads
        #[arg(long = "env", value_parser = bootstrap_env_arg)]
        env: Vec<(String, String)>,
        /// Seconds NCCL has to answer
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=600))]
        limit: u64,
        /// Print one JSON object (the only form the controller reads)
        #[arg(long)]
        json: bool,
    },
    /// Loads one checked NCCL and calls ncclGetUniqueId (run by `bootstrap-self` only)
    #[command(name = "bootstrap-child", hide = true)]
    BootstrapChild {
        /// The checked library to load
        #[arg(long)]
        library: PathBuf,
    },
    /// Listens and connects for `cluster rehearse` (run by fdl over SSH)
    #[command(name = "reach-self", hide = true)]
    ReachSelf {
        /// This host's name in its hellos
        #[arg(long = "as")]
        me: String,
        /// The rehearsal's nonce
        #[arg(long)]
        nonce: String,
        /// How long it may take, in ms
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=600_000))]
        within_ms: u64,
        /// ADDRESS:PORT to listen on
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// A host whose hello must arrive; repeatable
        #[arg(long)]
        expect: Vec<String>,
        /// NAME=ADDRESS:PORT to connect to; repeatable
        #[arg(long, value_parser = connect_arg)]
        connect: Vec<(String, std::net::SocketAddr)>,
        /// Print one JSON object (the only form the controller reads)
        #[arg(long)]
        json: bool,
    },
    /// This host's processes that map an NCCL, for `cluster ps` (run by fdl over SSH)
    #[command(name = "ps-self", hide = true)]
    PsSelf {
        /// Do not read the processes' memory
        #[arg(long)]
        no_memory: bool,
        /// Print one JSON object (the only form the controller reads)
        #[arg(long)]
        json: bool,
    },
    /// The worker's half of `ship` (run by fdl over SSH)
    #[command(hide = true)]
    Receive {
        /// Say what is at the build's place
        #[arg(long, value_name = "NAME", conflicts_with = "install",
              value_parser = super::common::build_name_arg, allow_hyphen_values = true)]
        state: Option<String>,
        /// With --state: also make .incoming-<name>/ for the copy
        #[arg(long, requires = "state")]
        prepare: bool,
        /// Verify and install the copy in .incoming-<name>/
        #[arg(long, value_name = "NAME", requires = "digest",
              value_parser = super::common::build_name_arg, allow_hyphen_values = true)]
        install: Option<String>,
        /// With --install: the sha256 the copy must have
        #[arg(long)]
        digest: Option<String>,
        /// With --install: replace a different build of that name
        #[arg(long)]
        force: bool,
        /// With --state: also say whether this host's build store has this key
        #[arg(long, value_name = "KEY", requires = "state")]
        store_key: Option<String>,
        /// With --install: the copy holds only the manifest and log; take the rest from
        /// this host's build store entry KEY
        #[arg(long, value_name = "KEY", requires = "install")]
        from_store: Option<String>,
    },
    /// The LD_PRELOAD value for a build on this host, its cache link made where the
    /// build's path holds a space or colon (run by fdl over SSH)
    #[command(hide = true)]
    Link {
        /// The build's name
        #[arg(value_parser = super::common::build_name_arg)]
        build: String,
        /// Print one JSON object
        #[arg(long)]
        json: bool,
    },
    /// This host's report for the controller (run by fdl over SSH)
    #[command(name = "self", hide = true)]
    SelfReport {
        /// The libtorch variant (default: the active one)
        #[arg(long)]
        arch: Option<String>,
        /// The worker's LD_PRELOAD, as its env: block writes it
        #[arg(long)]
        ld_preload: Option<String>,
        /// Do not ask this host's own loader
        #[arg(long)]
        no_witness: bool,
        /// For a pip torch, also run its interpreter importing torch
        #[arg(long)]
        python_witness: bool,
        /// Answer for this kind of process (default: the variant's)
        #[arg(long, value_enum)]
        process: Option<super::inspect::ProcessArg>,
        /// NAME=VALUE: a variable the worker's env: block sets that the loader, NCCL's
        /// plugin search or a Python rank's sys.path reads (LD_LIBRARY_PATH,
        /// NCCL_<KIND>_PLUGIN, PYTHONPATH, …); repeatable
        #[arg(long = "env", value_parser = env_arg)]
        env: Vec<(String, String)>,
        /// Print one JSON object (the only form the controller reads)
        #[arg(long)]
        json: bool,
    },
}

/// `NAME=VALUE` for `cluster self --env`: only the variables its report reads.
fn env_arg(s: &str) -> std::result::Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if host::reported_variable(k) => Ok((k.to_string(), v.to_string())),
        Some((k, _)) => Err(format!(
            "'{}' is not a variable the report reads (LD_LIBRARY_PATH, NCCL_<KIND>_PLUGIN, PYTHONPATH, PYTHONHOME, PYTHONNOUSERSITE, PYTHONSAFEPATH, TORCH_USE_RTLD_GLOBAL)",
            crate::text::clean(k)
        )),
        None => Err("expected NAME=VALUE".into()),
    }
}

/// `NAME=VALUE` for `cluster bootstrap-self --env`: NCCL's variables and the report's.
fn bootstrap_env_arg(s: &str) -> std::result::Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if crate::cluster::bootstrap::rehearsed_variable(k) => {
            Ok((k.to_string(), v.to_string()))
        }
        Some((k, _)) => Err(format!(
            "'{}' is not a variable the rehearsal reads (NCCL_*, LD_LIBRARY_PATH, PYTHONPATH, …)",
            crate::text::clean(k)
        )),
        None => Err("expected NAME=VALUE".into()),
    }
}

/// `NAME=ADDRESS:PORT` for `cluster reach-self --connect`.
fn connect_arg(s: &str) -> std::result::Result<(String, std::net::SocketAddr), String> {
    let (name, addr) = s.split_once('=').ok_or("expected NAME=ADDRESS:PORT")?;
    let addr = addr
        .parse()
        .map_err(|_| format!("'{}' is not an address and port", crate::text::clean(addr)))?;
    Ok((name.to_string(), addr))
}

/// What `cluster plan` and `cluster build` infer, which is not what `nccl build` does.
const CLUSTER_TAG_HELP: &str = "NCCL git tag, e.g. v2.27.5-1 (default: the highest NCCL the workers' libtorch variants bundle)";
const CLUSTER_ARCHS_HELP: &str =
    "GPU architectures, e.g. \"6.1;12.0\" (default: the union of every worker's GPUs)";
const CLUSTER_CUDA_HELP: &str = "CUDA version, e.g. 12.8 (default: the CUDA of that libtorch's NCCL, unless a worker's driver cannot run it)";

/// The longest `--timeout`: a day. Every duration fdl derives from it (a copy's limit is
/// twenty times it) stays far from overflowing.
const MAX_TIMEOUT: u64 = 86_400;

#[derive(Debug, Args)]
pub struct Common {
    /// The cluster overlay (default: fdl.cluster.yml in the project root, over fdl.yml)
    #[arg(long, value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// Seconds each worker gets to answer, 1 to 86400 (a copy gets twenty times as long)
    #[arg(long, default_value_t = 30, value_name = "SECONDS",
          value_parser = clap::value_parser!(u64).range(1..=MAX_TIMEOUT))]
    pub timeout: u64,
    /// Workers reached at once, 1 to 1024
    #[arg(long, default_value_t = 16, value_name = "N",
          value_parser = clap::builder::TypedValueParser::map(
              clap::value_parser!(u16).range(1..=1024), usize::from))]
    pub parallel: usize,
    /// The workers are the nodes of this Slurm allocation, reached through srun (run it
    /// inside `salloc` or an `sbatch` script); the default there when the cluster file
    /// names no workers
    #[arg(long)]
    pub slurm: bool,
    /// With --slurm: only these nodes of the allocation
    #[arg(long, value_delimiter = ',', value_name = "A,B", requires = "slurm")]
    pub nodes: Vec<String>,
    /// With --slurm: the nodes of this running job, reached by steps that overlap it
    /// (`srun --jobid JOBID --overlap`), from outside the job (default: the job fdl runs in)
    #[arg(long, value_name = "JOBID", requires = "slurm")]
    pub jobid: Option<String>,
    /// With --slurm: the project's path on the nodes (default: this project's root)
    #[arg(long, value_name = "PATH", requires = "slurm")]
    pub path: Option<String>,
}

/// The workers, how they are reached, and the files that named them (none for Slurm).
struct Reach {
    workers: Vec<Worker>,
    transport: Box<dyn Transport>,
    own: OwnBinary,
    files: Vec<PathBuf>,
    slurm: bool,
}

impl Common {
    /// The workers and their transport: the Slurm allocation's nodes with --slurm, or
    /// when fdl runs inside an allocation and the cluster file names no workers (said on
    /// stderr); else the cluster file's workers over SSH (ssh's connect timeout is the
    /// per-host one, at most a minute).
    fn reach(&self, ctx: &Context, project: &Project) -> Result<Reach> {
        let own = OwnBinary::current(ctx.cache().ok().as_deref())?;
        let mut slurm = self.slurm;
        let mut cluster = None;
        if !slurm {
            match config::load(&project.root, self.file.as_deref()) {
                Ok(c) if c.workers.is_empty() && slurm::in_allocation() => slurm = true,
                Ok(c) => cluster = Some(c),
                Err(_)
                    if self.file.is_none()
                        && slurm::in_allocation()
                        && !project.root.join(config::CLUSTER_FILE).exists() =>
                {
                    slurm = true
                }
                Err(e) => return Err(e),
            }
            if slurm {
                crate::eprintln_safe!(
                    "note: no workers in {}, and fdl runs inside Slurm job {}: using the allocation's nodes through srun (as --slurm)",
                    config::CLUSTER_FILE,
                    clean(&std::env::var("SLURM_JOB_ID").unwrap_or_default())
                );
            }
        }
        if slurm {
            let limit = Duration::from_secs(self.timeout.max(1));
            let s = match &self.jobid {
                Some(job) => Slurm::for_job(job, limit)?,
                None => Slurm::from_env(limit)?,
            };
            let path = match &self.path {
                Some(p) if p.starts_with('/') && !p.chars().any(char::is_control) => p.clone(),
                Some(p) => bail!(
                    "--path {} is not an absolute path: name the project's checkout on the nodes, like /home/me/flodl",
                    clean(p)
                ),
                None => project.root.display().to_string(),
            };
            return Ok(Reach {
                workers: s.workers(&self.nodes, &path)?,
                transport: Box::new(s),
                own,
                files: Vec::new(),
                slurm: true,
            });
        }
        let cluster = cluster.expect("loaded");
        let transport = Ssh::new(
            &ctx.cache()?,
            Duration::from_secs(self.timeout.clamp(1, 60)),
            self.parallel,
        )?;
        Ok(Reach {
            workers: cluster.workers,
            transport: Box::new(transport),
            own,
            files: cluster.files,
            slurm: false,
        })
    }
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
            ClusterCommand::Env { format, json, .. } => *json || *format == EnvFormat::Json,
            ClusterCommand::Ship { json, .. } | ClusterCommand::Ps { json, .. } => *json,
            ClusterCommand::PsSelf { .. }
            | ClusterCommand::BootstrapSelf { .. }
            | ClusterCommand::BootstrapChild { .. }
            | ClusterCommand::ReachSelf { .. } => true,
            ClusterCommand::Rehearse { json, .. } => *json,
            ClusterCommand::Receive { .. } => true,
            ClusterCommand::Link { json, .. } => *json,
            ClusterCommand::Plan { build, .. } | ClusterCommand::Build { build, .. } => build.json,
        }
    }
}

pub(super) fn run(ctx: &Context, project: &Project, cmd: ClusterCommand) -> Result<()> {
    match cmd {
        ClusterCommand::SelfReport {
            arch,
            ld_preload,
            no_witness,
            python_witness,
            process,
            env,
            json: _,
        } => {
            let report = host::report(&SelfQuery {
                root: project.root.clone(),
                arch,
                ld_preload,
                witness: !no_witness,
                python_witness,
                process: process.map(super::inspect::ProcessArg::kind),
                env,
            });
            // The report's own schema, which the controller checks.
            super::common::print_json_as_is(&serde_json::to_value(&report)?);
            Ok(())
        }
        ClusterCommand::Link { build, json } => {
            crate::nccl::store::BuildName::parse(&build)?;
            let lib = project
                .nccl_builds_dir()
                .join(&build)
                .join("lib")
                .join("libnccl.so.2");
            let path = crate::nccl::preload::preload_path_in(&lib, &build, &ctx.cache()?)?;
            if json {
                print_json(&json!({ "ld_preload": path }));
            } else {
                outln!("{}", path.display());
            }
            Ok(())
        }
        ClusterCommand::Status {
            common,
            json,
            no_witness,
            python_witness,
            process,
        } => {
            let witness = match (no_witness, python_witness) {
                (true, _) => status::Witnesses::None,
                (false, false) => status::Witnesses::Loader,
                (false, true) => status::Witnesses::LoaderAndPython,
            };
            let asked = status::Asked {
                witness,
                process: process.map(super::inspect::ProcessArg::kind),
            };
            status_cmd(ctx, project, &common, json, asked)
        }
        ClusterCommand::Rehearse {
            common,
            rank0,
            within,
            json,
        } => rehearse_cmd(ctx, project, &common, rank0, within, json),
        ClusterCommand::BootstrapSelf {
            arch,
            ld_preload,
            env,
            limit,
            json: _,
        } => {
            let query = SelfQuery {
                root: project.root.clone(),
                arch,
                ld_preload,
                witness: true,
                python_witness: false,
                process: None,
                env,
            };
            let answer = crate::cluster::bootstrap::ask(&crate::cluster::bootstrap::Ask {
                query: &query,
                builds: &project.nccl_builds_dir(),
                limit: Duration::from_secs(limit),
            });
            super::common::print_json_as_is(&serde_json::to_value(&answer)?);
            Ok(())
        }
        ClusterCommand::BootstrapChild { library } => {
            crate::cluster::bootstrap::child_main(&library)
        }
        ClusterCommand::ReachSelf {
            me,
            nonce,
            within_ms,
            listen,
            expect,
            connect,
            json: _,
        } => {
            let answer = crate::cluster::bootstrap::reach(&crate::cluster::bootstrap::ReachAsk {
                me,
                nonce,
                listen,
                expect,
                connect,
                within: Duration::from_millis(within_ms),
            });
            super::common::print_json_as_is(&serde_json::to_value(&answer)?);
            Ok(())
        }
        ClusterCommand::PsSelf { no_memory, json: _ } => {
            let scan = crate::loader::running::scan(&crate::loader::running::Options {
                pids: None,
                no_memory,
                digest_cache: ctx.cache().ok(),
            });
            // The answer's own schema and kind, which the controller checks.
            super::common::print_json_as_is(&json!({
                "schema": ps::PS_SCHEMA,
                "kind": ps::PS_KIND,
                "scan": serde_json::to_value(&scan)?,
            }));
            Ok(())
        }
        ClusterCommand::Ps {
            build,
            common,
            json,
            no_memory,
        } => ps_cmd(ctx, project, &common, build.as_deref(), json, no_memory),
        ClusterCommand::Ship {
            build,
            workers,
            force,
            dry_run,
            common,
            json,
        } => ship_cmd(
            ctx,
            project,
            &common,
            build.as_deref(),
            &workers,
            force,
            dry_run,
            json,
        ),
        ClusterCommand::Receive {
            state,
            prepare,
            install,
            digest,
            force,
            store_key,
            from_store,
        } => {
            let builds = project.nccl_builds_dir();
            if let Some(name) = state {
                print_json(&serde_json::to_value(receive::state(
                    &builds,
                    &name,
                    prepare,
                    store_key.as_deref(),
                    ctx,
                )?)?);
            } else if let (Some(name), Some(digest)) = (install, digest) {
                let done =
                    receive::install(&builds, &name, &digest, force, from_store.as_deref(), ctx)?;
                print_json(&serde_json::to_value(done)?);
            } else {
                bail!("receive needs --state NAME or --install NAME --digest D");
            }
            Ok(())
        }
        ClusterCommand::Plan { common, mut build } => {
            build.dry_run = true;
            build_cmd(ctx, project, &common, build)
        }
        ClusterCommand::Build { common, build } => build_cmd(ctx, project, &common, build),
        ClusterCommand::Env {
            build,
            common,
            format,
            json,
        } => {
            let format = if json { EnvFormat::Json } else { format };
            env_cmd(ctx, project, &common, build.as_deref(), format)
        }
    }
}

/// Every worker's report, one progress line per host as each answers (on a terminal).
/// Every worker's report; `witness`: each asks its own loader too (status's default).
fn reports(reach: &Reach, common: &Common, quiet: bool, asked: status::Asked) -> Vec<WorkerStatus> {
    let live = !quiet && std::io::stderr().is_terminal();
    let done = |w: &WorkerStatus| {
        if live {
            let state = if w.error.is_some() {
                "failed"
            } else {
                "answered"
            };
            crate::eprintln_safe!("  {} ({}): {state}", clean(&w.host), clean(&w.target));
        }
    };
    let workers: Vec<&Worker> = reach.workers.iter().collect();
    status::query_all(
        &workers,
        reach.transport.as_ref(),
        &reach.own,
        Duration::from_secs(common.timeout.max(1)),
        asked,
        &done,
    )
}

fn build_cmd(
    ctx: &Context,
    project: &Project,
    common: &Common,
    build: super::build::BuildArgs,
) -> Result<()> {
    let reach = common.reach(ctx, project)?;
    let workers = reports(
        &reach,
        common,
        build.json || build.quiet,
        status::Asked::PLAIN,
    );
    let infer = |flags| crate::cluster::plan::infer(&workers, flags);
    super::build::run_inferred(ctx, project, build, &infer)
}

fn status_cmd(
    ctx: &Context,
    project: &Project,
    common: &Common,
    json: bool,
    asked: status::Asked,
) -> Result<()> {
    let reach = common.reach(ctx, project)?;
    let workers = reports(&reach, common, json, asked);
    let verdicts = status::verdicts(&workers);
    let red: Vec<&str> = verdicts
        .iter()
        .filter(|v| v.state == status::State::Red)
        .map(|v| v.name)
        .collect();
    let unknown: Vec<&str> = verdicts
        .iter()
        .filter(|v| v.state == status::State::Unknown)
        .map(|v| v.name)
        .collect();
    if json {
        print_json(&json!({
            "files": reach.files,
            "workers": workers,
            "verdicts": verdicts,
            "ok": red.is_empty() && unknown.is_empty(),
            "state": if !red.is_empty() { "red" } else if !unknown.is_empty() { "unknown" } else { "ok" },
        }));
    } else {
        out!("{}", render_status(&workers));
        outln!("Verdicts:");
        for v in &verdicts {
            let mark = match v.state {
                status::State::Ok => paint("ok     ", Color::Green),
                status::State::Red => paint("RED    ", Color::Red),
                status::State::Unknown => paint("unknown", Color::Yellow),
            };
            outln!("  {mark} {:<9} {}", v.name, clean(&v.detail));
        }
    }
    if !red.is_empty() {
        let e = anyhow::anyhow!("the cluster is not ready: {}", red.join(", "));
        return Err(if json {
            super::common::JsonReported(e).into()
        } else {
            e
        });
    }
    if !unknown.is_empty() {
        // Exit 3: not a finding, but not ready either; the verdicts say what is missing.
        return Err(super::common::Undecided(format!(
            "the cluster's readiness is unknown: {} could not be judged",
            unknown.join(", ")
        ))
        .into());
    }
    Ok(())
}

fn rehearse_cmd(
    ctx: &Context,
    project: &Project,
    common: &Common,
    root: Option<String>,
    within: u64,
    json: bool,
) -> Result<()> {
    use crate::cluster::rehearse::{self, State};
    let mut reach = common.reach(ctx, project)?;
    // The listen and connect phase needs every worker at once.
    if !reach.slurm && reach.workers.len() > common.parallel {
        reach.transport = Box::new(Ssh::new(
            &ctx.cache()?,
            Duration::from_secs(common.timeout.clamp(1, 60)),
            reach.workers.len(),
        )?);
    }
    let workers: Vec<&Worker> = reach.workers.iter().collect();
    let live = !json && std::io::stderr().is_terminal();
    let on_phase = |what: &str| {
        if live {
            crate::eprintln_safe!("  {what}");
        }
    };
    let opts = rehearse::Options {
        root,
        within: Duration::from_secs(within),
        timeout: Duration::from_secs(common.timeout.max(1)),
    };
    let r = rehearse::rehearse(
        &workers,
        reach.transport.as_ref(),
        &reach.own,
        &opts,
        &on_phase,
    )?;
    let state = r.state();
    if json {
        let findings: Vec<serde_json::Value> = r
            .findings
            .iter()
            .map(|f| {
                let mut v = serde_json::to_value(f).unwrap_or_default();
                v["text"] = json!(clean(&f.full()));
                v["red"] = json!(f.is_red());
                v
            })
            .collect();
        print_json(&json!({
            "files": reach.files,
            "root": r.root,
            "workers": r.workers,
            "pairs": r.pairs,
            "findings": findings,
            "ok": state == State::Ok,
            "state": state,
        }));
    } else {
        out!("{}", render_rehearsal(&r, within));
    }
    match state {
        State::Ok => Ok(()),
        State::Red => {
            // About the workers' networks and NCCLs, not the project: no root tail.
            let e: anyhow::Error = crate::project::RootIrrelevant(anyhow::anyhow!(
                "NCCL's bootstrap would fail: {}",
                r.findings
                    .iter()
                    .filter(|f| f.is_red())
                    .map(|f| clean(&f.short()))
                    .collect::<Vec<_>>()
                    .join("; ")
            ))
            .into();
            Err(if json {
                super::common::JsonReported(e).into()
            } else {
                e
            })
        }
        State::Unknown => Err(super::common::Undecided(format!(
            "the rehearsal could not judge every worker: {}",
            r.findings
                .iter()
                .map(|f| clean(&f.short()))
                .collect::<Vec<_>>()
                .join("; ")
        ))
        .into()),
    }
}

fn render_rehearsal(r: &crate::cluster::rehearse::Rehearsal, within: u64) -> String {
    use crate::cluster::bootstrap::{Outcome, Reached, Trust};
    use crate::cluster::rehearse::{family_of, State};
    let mut s = format!(
        "NCCL bootstrap rehearsal, root {} (no GPU is touched: each worker's own NCCL only chose its bootstrap address)\n",
        clean(&r.root)
    );
    let width = r
        .workers
        .iter()
        .map(|w| clean(&w.host).len())
        .max()
        .unwrap_or(0);
    for w in &r.workers {
        let host = format!("{:<width$}", clean(&w.host));
        let Some(b) = &w.bootstrap else {
            s.push_str(&format!(
                "  {host}  no answer: {}\n",
                clean(w.error.as_deref().unwrap_or("?"))
            ));
            continue;
        };
        let lib = match &b.library {
            Some(l) => format!(
                "NCCL {} ({})",
                clean(&l.version),
                match &l.trust {
                    Trust::Libtorch => "the libtorch's own".to_string(),
                    Trust::Build { name } => format!("build {}", clean(name)),
                }
            ),
            None => "NCCL not run".to_string(),
        };
        let what = match &b.outcome {
            Outcome::Chosen {
                interface,
                address,
                comm_id,
            } => format!(
                "{} {address} ({}){}",
                clean(interface.as_deref().unwrap_or("?")),
                family_of(address),
                if *comm_id { ", from NCCL_COMM_ID" } else { "" }
            ),
            Outcome::NcclError { code, warn } => format!(
                "error {code}{}",
                warn.as_ref()
                    .map(|w| format!(": {}", clean(w)))
                    .unwrap_or_default()
            ),
            Outcome::Refused { .. } => "not run (see below)".into(),
            Outcome::Failed { reason } => format!("not asked: {}", clean(reason)),
        };
        s.push_str(&format!("  {host}  {lib}  {what}\n"));
    }
    if !r.pairs.is_empty() {
        s.push_str(&format!("Connections (within {within} s):\n"));
        for p in &r.pairs {
            let result = match &p.result {
                Reached::Yes { ms } => paint(&format!("ok ({ms} ms)"), Color::Green),
                _ => paint("FAILED", Color::Red),
            };
            s.push_str(&format!(
                "  {} -> {}  {}  {result}\n",
                clean(&p.from),
                clean(&p.to),
                p.address
            ));
        }
    }
    if !r.findings.is_empty() {
        s.push_str("Findings:\n");
        for f in &r.findings {
            let mark = if f.is_red() {
                paint("RED    ", Color::Red)
            } else {
                paint("unknown", Color::Yellow)
            };
            s.push_str(&format!("  {mark} {}\n", clean(&f.full())));
        }
    }
    s.push_str(&match r.state() {
        State::Ok => format!(
            "{} every worker's NCCL chose an address the root reaches, and each reaches the root's\n",
            paint("ok", Color::Green)
        ),
        State::Red => format!("{} a launch would fail in NCCL's bootstrap\n", paint("RED", Color::Red)),
        State::Unknown => format!(
            "{} not every worker could be rehearsed\n",
            paint("unknown", Color::Yellow)
        ),
    });
    s
}

fn render_status(workers: &[WorkerStatus]) -> String {
    let mut s = String::new();
    for w in workers {
        s.push_str(&format!(
            "{} ({}:{})\n",
            clean(&w.host),
            clean(&w.target),
            clean(&w.path)
        ));
        let Some(r) = &w.report else {
            // The error says what failed ("unreachable over SSH: …"); the hint, what next.
            let error = w.error.as_deref().unwrap_or("no answer");
            let next = match w.unreached {
                Some(Unreached::Ssh) => ". Check the host, or its ssh: block in the cluster file, then rerun `fdl cluster status`",
                Some(Unreached::Slurm) => ". Check the node (`scontrol show node`), or leave it out with --nodes, then rerun `fdl cluster status --slurm`",
                None => "",
            };
            s.push_str(&format!(
                "  {}\n",
                paint(&clean(&format!("{error}{next}")), Color::Red)
            ));
            continue;
        };
        // Every value came from the worker: shown with its control characters escaped.
        let row =
            |s: &mut String, k: &str, v: String| s.push_str(&format!("  {k:<9} {}\n", clean(&v)));
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
                if let Some(python) = &lt.python {
                    // Its ranks are Python processes: the answers below are theirs.
                    row(
                        &mut s,
                        "process",
                        format!(
                            "Python: {} -c … importing torch, started in the checkout (assumed)",
                            python.display()
                        ),
                    );
                }
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
        if let Some(wr) = &r.witness {
            let who = if wr.python {
                "its Python process"
            } else {
                "its loader"
            };
            let text = match wr.verdict.as_str() {
                "agree" => format!("{who} agrees: {}", wr.loader),
                "disagree" => format!(
                    "FDL'S MODEL IS WRONG HERE: it says {}; {who}: {} (its answer is used)",
                    wr.model.as_deref().unwrap_or("?"),
                    wr.loader
                ),
                "model_unknown" => format!("the model cannot say; {who}: {}", wr.loader),
                "inconclusive" => format!("no answer: {}", wr.loader),
                "none" => format!("none on this host: {}", wr.loader),
                "refused" => format!("refused: {}", wr.loader),
                other => format!("{other}: {}", wr.loader),
            };
            let text = clean(&text);
            if wr.disagrees() {
                s.push_str(&format!(
                    "  {:<9} {}\n",
                    "witness",
                    paint(&text, Color::Red)
                ));
            } else {
                s.push_str(&format!("  {:<9} {text}\n", "witness"));
            }
        }
        if !r.coverage.is_empty() {
            let cells = coverage_cells(&r.coverage, "NO CODE");
            s.push_str(&format!("  {:<9} {cells}\n", "coverage"));
        }
        // The libtorch's own kernels per GPU: a rank needs them as much as the NCCL's.
        match &r.torch_coverage {
            Facts::Known(t) if !t.gpus.is_empty() => {
                let cells = coverage_cells(&t.gpus, "NO KERNELS");
                s.push_str(&format!("  {:<9} {cells}\n", "torch"));
            }
            Facts::Known(_) => {}
            Facts::Unknown(why) => row(&mut s, "torch", format!("kernels unknown: {why}")),
        }
        row(
            &mut s,
            "plugins",
            match &r.plugins {
                Facts::Known(ps) => {
                    let loaded: Vec<String> = ps
                        .iter()
                        .filter(|p| p.verdict == "loaded" || p.verdict == "unknown")
                        .map(|p| match &p.path {
                            Some(path) => format!(
                                "{} {} (v{})",
                                p.kind,
                                status::short(path, &w.path),
                                p.version.unwrap_or_default()
                            ),
                            None => format!("{} unknown", p.kind),
                        })
                        .collect();
                    if loaded.is_empty() {
                        "none loaded".into()
                    } else {
                        loaded.join(", ")
                    }
                }
                Facts::Unknown(why) => format!("unknown: {why}"),
            },
        );
        if w.shipped_fdl {
            row(&mut s, "fdl", "shipped from the controller".into());
        }
    }
    s
}

/// The build the ranks should run: the one named, else `cluster env`'s default where the
/// project has builds (asking the workers' reports only then), else none.
fn wanted_build(
    project: &Project,
    reach: &Reach,
    common: &Common,
    build: Option<&str>,
    quiet: bool,
) -> Result<ps::Wanted> {
    let store = BuildStore::new(project.nccl_builds_dir());
    let has_builds = store
        .list()?
        .iter()
        .any(|e| matches!(e, crate::nccl::store::Entry::Build { .. }));
    if build.is_none() && !has_builds {
        return Ok(ps::Wanted::NoBuild);
    }
    let wiring = super::manage::Wiring {
        make: "fdl cluster build",
        this: "fdl cluster ps",
    };
    let hosts = || status::pick_hosts(&reports(reach, common, quiet, status::Asked::PLAIN));
    let choice = match super::manage::pick_build(project, &store, build, &wiring, &hosts) {
        Ok(c) => c,
        // A named build that is not there is the user's error; a default that cannot be
        // picked leaves only that verdict unknown.
        Err(e) if build.is_some() => return Err(e),
        Err(e) => {
            return Ok(ps::Wanted::Unpicked {
                why: clean(&format!("{e:#}")),
            })
        }
    };
    // On stderr, as `cluster env` says it: stdout stays the answer.
    super::manage::announce(&choice);
    Ok(ps::Wanted::Build(ps::ChosenBuild {
        blake3: choice
            .manifest
            .files
            .as_deref()
            .and_then(ps::library_digest),
        name: choice.build,
        why: choice.reason,
    }))
}

fn ps_cmd(
    ctx: &Context,
    project: &Project,
    common: &Common,
    build: Option<&str>,
    json: bool,
    no_memory: bool,
) -> Result<()> {
    let reach = common.reach(ctx, project)?;
    let wanted = wanted_build(project, &reach, common, build, json)?;
    let live = !json && std::io::stderr().is_terminal();
    let done = |h: &HostPs| {
        if live {
            let state = match &h.answer {
                HostAnswer::Answered(a) => format!("{} process(es)", a.processes.len()),
                HostAnswer::Failed { .. } => "failed".into(),
            };
            crate::eprintln_safe!("  {} ({}): {state}", clean(&h.host), clean(&h.target));
        }
    };
    let workers: Vec<&Worker> = reach.workers.iter().collect();
    let hosts = ps::query_all(
        &workers,
        reach.transport.as_ref(),
        &reach.own,
        Duration::from_secs(common.timeout.max(1)),
        no_memory,
        &done,
    );
    let verdicts = ps::verdicts(&hosts, &wanted);
    let red: Vec<&ps::Verdict> = verdicts
        .iter()
        .filter(|v| v.state == ps::State::Red)
        .collect();
    let unknown: Vec<&ps::Verdict> = verdicts
        .iter()
        .filter(|v| v.state == ps::State::Unknown)
        .collect();
    if json {
        print_json(&json!({
            "files": reach.files,
            "build": wanted,
            "workers": hosts,
            "verdicts": verdicts,
            "ok": red.is_empty() && unknown.is_empty(),
            "state": if !red.is_empty() { "red" } else if !unknown.is_empty() { "unknown" } else { "ok" },
        }));
    } else {
        out!("{}", render_ps(&hosts));
        outln!("Verdicts:");
        for v in &verdicts {
            let mark = match v.state {
                ps::State::Ok => paint("ok     ", Color::Green),
                ps::State::Red => paint("RED    ", Color::Red),
                ps::State::Unknown => paint("unknown", Color::Yellow),
                ps::State::Note => paint("note   ", Color::Yellow),
                ps::State::Skipped => "skipped".to_string(),
            };
            // Wrapped on a terminal, one line each when piped (for grep).
            outln!(
                "{}",
                super::common::stdout_row(
                    &format!("  {mark} {:<9} ", v.name),
                    &" ".repeat(20),
                    &clean(&v.detail)
                )
            );
        }
    }
    let named = |vs: &[&ps::Verdict]| {
        vs.iter()
            .map(|v| format!("{} ({})", v.name, clean(&v.blame.join(", "))))
            .collect::<Vec<_>>()
            .join("; ")
    };
    if !red.is_empty() {
        // About the workers' processes, not the project: no root tail.
        let e: anyhow::Error = crate::project::RootIrrelevant(anyhow::anyhow!(
            "the ranks do not agree: {}",
            named(&red)
        ))
        .into();
        return Err(if json {
            super::common::JsonReported(e).into()
        } else {
            e
        });
    }
    if !unknown.is_empty() {
        return Err(super::common::Undecided(format!(
            "whether the ranks agree is unknown: {}",
            named(&unknown)
        ))
        .into());
    }
    Ok(())
}

/// One row per process (host, pid, rank, NCCL version, file, digest, what the calls'
/// answer rests on, plugins), and a line for each worker without one. Every string came
/// from a worker and was cleaned when it was read; it is cleaned again here, as all
/// output is.
fn render_ps(hosts: &[HostPs]) -> String {
    let mut rows: Vec<[String; 8]> = vec![[
        "HOST".into(),
        "PID".into(),
        "RANK".into(),
        "NCCL".into(),
        "FILE".into(),
        "DIGEST".into(),
        "REACHED BY".into(),
        "PLUGINS".into(),
    ]];
    let mut lines = Vec::new();
    for h in hosts {
        let a = match &h.answer {
            HostAnswer::Failed { error } => {
                lines.push(paint(
                    &format!("{}: no answer: {}", clean(&h.host), clean(error)),
                    Color::Red,
                ));
                continue;
            }
            HostAnswer::Answered(a) => a,
        };
        if a.processes.is_empty() {
            lines.push(format!(
                "{}: no process maps an NCCL (looked at {} of its user's)",
                clean(&h.host),
                a.looked_at
            ));
        }
        for c in &a.cut {
            lines.push(format!(
                "{}: its answer was cut: {}",
                clean(&h.host),
                clean(c)
            ));
        }
        for p in &a.processes {
            let (version, file, digest) = match p.reached() {
                Some(n) => (
                    n.version.clone().unwrap_or_else(|| "unread".into()),
                    n.path.clone(),
                    n.blake3
                        .as_deref()
                        .map(|d| ps::short_digest(d).to_string())
                        .unwrap_or_else(|| "-".into()),
                ),
                None => (
                    "?".into(),
                    p.nccl
                        .iter()
                        .map(|n| n.path.as_str())
                        .collect::<Vec<_>>()
                        .join(" + "),
                    "-".into(),
                ),
            };
            let by = match &p.reach {
                ps::PsReach::One { evidence, .. } => evidence.short(),
                ps::PsReach::Split { .. } => "SPLIT: calls reach two NCCLs".into(),
                ps::PsReach::NoNccl => "no NCCL".into(),
                ps::PsReach::Unknown { .. } => "unknown".into(),
            };
            let plugins = p.plugin_set();
            rows.push([
                h.host.clone(),
                p.pid.to_string(),
                p.rank
                    .as_ref()
                    .map(|r| r.value.to_string())
                    .unwrap_or_else(|| "-".into()),
                version,
                file,
                digest,
                by,
                if plugins.is_empty() {
                    "none".into()
                } else {
                    plugins.join(", ")
                },
            ]);
        }
    }
    let rows: Vec<[String; 8]> = rows.into_iter().map(|r| r.map(|c| clean(&c))).collect();
    let mut widths = [0usize; 8];
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(crate::text::columns(c));
        }
    }
    let mut s = String::new();
    if rows.len() > 1 {
        for r in &rows {
            let mut line = String::new();
            for (i, c) in r.iter().enumerate() {
                line.push_str(c);
                if i + 1 < r.len() {
                    line.push_str(&" ".repeat(widths[i] - crate::text::columns(c) + 2));
                }
            }
            s.push_str(line.trim_end());
            s.push('\n');
        }
    }
    for l in lines {
        s.push_str(&l);
        s.push('\n');
    }
    s
}

fn env_cmd(
    ctx: &Context,
    project: &Project,
    common: &Common,
    build: Option<&str>,
    format: EnvFormat,
) -> Result<()> {
    let reach = common.reach(ctx, project)?;
    let store = BuildStore::new(project.nccl_builds_dir());
    let wiring = super::manage::Wiring {
        make: "fdl cluster build",
        this: "fdl cluster env",
    };
    let hosts = || {
        status::pick_hosts(&reports(
            &reach,
            common,
            matches!(format, EnvFormat::Json),
            status::Asked::PLAIN,
        ))
    };
    let choice = super::manage::pick_build(project, &store, build, &wiring, &hosts)?;
    super::manage::announce(&choice);
    let (name, why) = (choice.build.clone(), choice.reason.clone());
    if reach.slurm {
        return slurm_env(&reach, common, &name, &why, format);
    }
    let rel = format!("libtorch/nccl/builds/{name}/lib/libnccl.so.2");
    let mut entries = Vec::new();
    for w in &reach.workers {
        let path = format!("{}/{rel}", w.path.trim_end_matches('/'));
        if path.chars().any(char::is_control) {
            bail!(
                "worker {}'s path holds a control character: fix `path:` in the cluster file",
                clean(&w.host)
            );
        }
        entries.push((w, path));
    }
    // glibc splits LD_PRELOAD at spaces and colons: a worker whose path holds one is
    // named through the link in its own cache, which only it can make and name.
    let needs_link: Vec<usize> = (0..entries.len())
        .filter(|&i| !crate::loader::preload::is_one_element(&entries[i].1))
        .collect();
    if !needs_link.is_empty() {
        let timeout = Duration::from_secs(common.timeout.max(1));
        let ws: Vec<&Worker> = needs_link.iter().map(|&i| entries[i].0).collect();
        let links =
            status::preload_on_all(reach.transport.as_ref(), &ws, &reach.own, &name, timeout);
        let mut failed = Vec::new();
        for (&i, link) in needs_link.iter().zip(links) {
            match link {
                Ok(p) => entries[i].1 = p,
                Err(e) => failed.push(format!("{}: {e:#}", clean(&entries[i].0.host))),
            }
        }
        if !failed.is_empty() {
            bail!(
                "no LD_PRELOAD value the loader honours for {}: the path holds a space or a colon, where glibc splits LD_PRELOAD, and the worker could not make a link without one. Reach the worker and run again, or move its checkout to a path without spaces and colons",
                failed.join("; ")
            );
        }
    }
    match format {
        EnvFormat::Json => print_json(&json!({
            "build": name,
            "why": why,
            "choice": choice,
            "workers": entries.iter().map(|(w, p)| json!({
                "host": w.host,
                "env": { "LD_PRELOAD": p },
            })).collect::<Vec<_>>(),
        })),
        EnvFormat::Yaml => {
            outln!("# fdl never edits your cluster file: paste each block under its worker.");
            outln!("# Build {name} ({why}); it must be at that path on each worker.");
            for (w, p) in &entries {
                outln!("\n# worker {}", super::manage::comment_text(&w.host));
                outln!("env:\n  LD_PRELOAD: {}", super::manage::yaml_quote(p));
            }
        }
    }
    Ok(())
}

/// `env` for a Slurm job: each node's own path for the build (its `cluster link`
/// answers), as the `export` line of a batch script and the per-step `srun` form, one
/// pair per group of nodes that share a path.
fn slurm_env(
    reach: &Reach,
    common: &Common,
    name: &str,
    why: &str,
    format: EnvFormat,
) -> Result<()> {
    let timeout = Duration::from_secs(common.timeout.max(1));
    let ws: Vec<&Worker> = reach.workers.iter().collect();
    let links = status::preload_on_all(reach.transport.as_ref(), &ws, &reach.own, name, timeout);
    let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
    let mut failed = Vec::new();
    for (w, link) in ws.iter().zip(links) {
        match link {
            Ok(p) if !p.chars().any(char::is_control) => {
                match groups.iter_mut().find(|(g, _)| *g == p) {
                    Some((_, nodes)) => nodes.push(&w.host),
                    None => groups.push((p, vec![&w.host])),
                }
            }
            Ok(_) => failed.push(format!("{}: its path holds a control character", w.host)),
            Err(e) => failed.push(format!("{}: {e:#}", w.host)),
        }
    }
    if !failed.is_empty() {
        bail!(
            "no LD_PRELOAD value for {}: ship the build there first (`fdl cluster ship --slurm {name}`), then run this again",
            clean(&failed.join("; "))
        );
    }
    let word = |p: &str| crate::paste::shell(p);
    match format {
        EnvFormat::Json => print_json(&json!({
            "build": name,
            "why": why,
            "groups": groups.iter().map(|(p, nodes)| json!({
                "nodes": nodes,
                "env": { "LD_PRELOAD": p },
                "export": format!("export LD_PRELOAD={}", word(p)),
                "srun": crate::paste::srun("LD_PRELOAD", p),
            })).collect::<Vec<_>>(),
        })),
        EnvFormat::Yaml => {
            outln!("# Build {name} ({why}). Paste into the batch script, before the launch:");
            for (p, nodes) in &groups {
                if groups.len() > 1 {
                    outln!("# nodes {}", super::manage::comment_text(&nodes.join(",")));
                }
                outln!("export LD_PRELOAD={}", word(p));
                outln!(
                    "# or per step: {} <your launcher>",
                    super::manage::comment_text(&crate::paste::srun("LD_PRELOAD", p))
                );
            }
        }
    }
    Ok(())
}

// The command's flags one by one, as `run` unpacks them, and the run's context.
#[allow(clippy::too_many_arguments)]
fn ship_cmd(
    ctx: &Context,
    project: &Project,
    common: &Common,
    build: Option<&str>,
    only: &[String],
    force: bool,
    dry_run: bool,
    json: bool,
) -> Result<()> {
    let reach = common.reach(ctx, project)?;
    for name in only {
        if !reach.workers.iter().any(|w| w.host == *name) {
            bail!(
                "--workers names {name}, which is not a worker of {}: the workers are {}",
                reach
                    .files
                    .last()
                    .map(|f| crate::text::shown(&f))
                    .unwrap_or_else(|| "the allocation".into()),
                reach
                    .workers
                    .iter()
                    .map(|w| w.host.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    let chosen: Vec<&Worker> = reach
        .workers
        .iter()
        .filter(|w| only.is_empty() || only.contains(&w.host))
        .collect();
    let store = BuildStore::new(project.nccl_builds_dir());
    let wiring = super::manage::Wiring {
        make: "fdl cluster build",
        this: "fdl cluster ship",
    };
    let hosts = || status::pick_hosts(&reports(&reach, common, json, status::Asked::PLAIN));
    let choice = super::manage::pick_build(project, &store, build, &wiring, &hosts)?;
    super::manage::announce(&choice);
    let name = choice.build.clone();
    let dir = store.path_of(&name);
    let req = ShipRequest::new(
        &name,
        &dir,
        force,
        dry_run,
        Duration::from_secs(common.timeout.max(1)),
    )?;
    if !dry_run {
        crate::process::set_interrupt_note(
            "the copies under way were stopped (rsync, ssh, srun, sbcast and tar end with fdl). A worker may keep a partial copy in libtorch/nccl/builds/.incoming-<name>/ and installs nothing from it: rerun `fdl cluster ship` to resume",
        );
    }
    let live = !json && std::io::stderr().is_terminal();
    let done = |r: &ShipResult| {
        if live {
            crate::eprintln_safe!("  {}: {}", clean(&r.host), describe(&r.outcome));
        }
    };
    let results = ship::ship_all(&chosen, reach.transport.as_ref(), &reach.own, &req, &done);
    let failed: Vec<&str> = results
        .iter()
        .filter(|r| !r.outcome.ok())
        .map(|r| r.host.as_str())
        .collect();
    if json {
        print_json(&json!({
            "build": name,
            "choice": choice,
            "digest": req.digest,
            "dry_run": dry_run,
            "workers": results,
            "ok": failed.is_empty(),
        }));
    } else {
        outln!("Ship {name} (sha256 {}):", &req.digest[..12]);
        for r in &results {
            let line = format!(
                "  {:<12} {}  {}",
                clean(&r.host),
                describe(&r.outcome),
                clean(&r.dir)
            );
            outln!(
                "{}",
                if r.outcome.ok() {
                    line
                } else {
                    paint(&line, Color::Red)
                }
            );
        }
        if dry_run {
            outln!("Dry run: nothing was copied or changed.");
        }
    }
    // Workers that hold a different build: only --force changes that, so say so.
    let refused: Vec<&str> = results
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Refused { .. }))
        .map(|r| r.host.as_str())
        .collect();
    if !failed.is_empty() && !force && refused.len() == failed.len() {
        let e = anyhow::anyhow!(
            "{} already hold{} something else under {name}: see what in the table. {}Rerun with --force to replace it (`fdl cluster ship {name} --force`)",
            refused.join(", "),
            if refused.len() == 1 { "s" } else { "" },
            if dry_run { "Nothing was copied anywhere. " } else { "" }
        );
        return Err(if json {
            super::common::JsonReported(e).into()
        } else {
            e
        });
    }
    if !failed.is_empty() {
        let e = if dry_run {
            anyhow::anyhow!(
                "a ship would not reach {}: see why in the table. Nothing was copied anywhere; fix that, then rerun `fdl cluster ship --dry-run`",
                failed.join(", ")
            )
        } else if failed.len() == results.len() {
            anyhow::anyhow!(
                "the build reached none of the workers ({}): see why in the table. Fix that, then rerun `fdl cluster ship`",
                failed.join(", ")
            )
        } else {
            anyhow::anyhow!(
                "the build did not reach {}; the others are done. Rerun `fdl cluster ship` to finish: it resumes and skips workers that have it",
                failed.join(", ")
            )
        };
        return Err(if json {
            super::common::JsonReported(e).into()
        } else {
            e
        });
    }
    Ok(())
}

fn describe(o: &Outcome) -> String {
    match o {
        Outcome::AlreadyThere => "already there (same sha256): nothing to do".into(),
        // A worker whose build store had the payload was sent only fdl's files.
        Outcome::Installed {
            replaced,
            copy,
            from_store: true,
        } => format!(
            "{} {copy}, verified there",
            if *replaced { "replaced" } else { "installed" }
        ),
        Outcome::Installed { replaced, copy, .. } => format!(
            "{} (copied with {copy}, verified there)",
            if *replaced { "replaced" } else { "installed" }
        ),
        Outcome::WouldCopy {
            copy,
            replace,
            from_store: true,
        } => format!(
            "would install {copy}{}",
            if *replace {
                " and replace the build there"
            } else {
                ""
            }
        ),
        Outcome::WouldCopy { copy, replace, .. } => format!(
            "would copy with {copy}{}",
            if *replace {
                " and replace the build there"
            } else {
                ""
            }
        ),
        // The worker's words: escaped, so no answer can rewrite the table.
        Outcome::Refused { why } => format!("refused: {}", clean(why)),
        Outcome::Failed { why } => format!("FAILED: {}", clean(why)),
    }
}

/// One cell per GPU: its verdict, or `<missing> for <arch>` in red.
fn coverage_cells(gpus: &[crate::cluster::host::GpuCoverage], missing: &str) -> String {
    gpus.iter()
        .map(|c| {
            if c.covered {
                clean(&format!("GPU {}: {}", c.index, c.verdict))
            } else {
                paint(
                    &clean(&format!("GPU {}: {missing} for {}", c.index, c.arch)),
                    Color::Red,
                )
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::host::WitnessReport;

    /// The `cluster ps` table prints what a worker sent with its controls escaped, even
    /// where a value skipped the cleaning done when answers are read; a worker with no
    /// process and one that failed get a line each.
    #[test]
    fn the_ps_table_escapes_what_workers_sent() {
        let evil = "/x/\u{1b}]0;owned\u{7}libnccl.so.2";
        let answer = serde_json::json!({
            "schema": ps::PS_SCHEMA, "kind": ps::PS_KIND,
            "scan": {"looked_at": 3, "refused": [], "processes": [{
                "pid": 7, "command": "x",
                "rank": {"variable": "RANK", "value": 0},
                "nccl": [{"path": evil, "kind": "library", "version": "2.27.5\u{1b}[2J",
                          "blake3": "ab".repeat(32), "disk": "same", "preloaded": false}],
                "reach": {"answer": "one", "target": {"path": evil, "nccl": 0},
                          "evidence": {"evidence": "memory", "caller": evil, "slots": 3, "bound": 3}},
                "plugins": [{"path": evil, "kinds": ["net\u{1b}[31m"]}],
                "settings": []
            }]}
        });
        let mut a = ps::read_answer(answer.to_string().as_bytes()).unwrap();
        // As if the reading had let one through: the table cleans again.
        a.processes[0].nccl[0].path = evil.into();
        let hosts =
            vec![
            HostPs {
                host: "a".into(),
                target: "a".into(),
                answer: HostAnswer::Answered(a),
            },
            HostPs {
                host: "b".into(),
                target: "b".into(),
                answer: HostAnswer::Answered(ps::read_answer(
                    br#"{"schema": 1, "kind": "cluster-ps-worker", "scan": {"looked_at": 2}}"#,
                ).unwrap()),
            },
            HostPs {
                host: "c".into(),
                target: "c".into(),
                answer: HostAnswer::Failed {
                    error: "unreachable over SSH: \u{1b}[31mno".into(),
                },
            },
        ];
        let text = render_ps(&hosts);
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{text}"
        );
        assert!(text.starts_with("HOST  PID  RANK  NCCL"), "{text}");
        assert!(
            text.contains("\nb: no process maps an NCCL (looked at 2 of its user's)\n"),
            "{text}"
        );
        assert!(
            text.contains("c: no answer: unreachable over SSH"),
            "{text}"
        );
    }

    /// The next step after a worker's error is named from the engine that could not
    /// reach it, never from the error's words.
    #[test]
    fn an_unreached_worker_gets_the_next_step_of_its_engine() {
        let down = |unreached: Option<Unreached>| {
            let mut w = status::test_worker("a", "2.30.7", &[(8, 6)], "13.2");
            w.report = None;
            w.error = Some("unreachable over SSH: Connection refused".into());
            w.unreached = unreached;
            render_status(&[w])
        };
        let ssh = down(Some(Unreached::Ssh));
        assert!(
            ssh.contains("Connection refused. Check the host, or its ssh: block in the cluster file, then rerun `fdl cluster status`"),
            "{ssh}"
        );
        let slurm = down(Some(Unreached::Slurm));
        assert!(
            slurm.contains(". Check the node (`scontrol show node`)"),
            "{slurm}"
        );
        let said = down(None);
        assert!(
            said.contains("Connection refused\n") && !said.contains("Check the"),
            "{said}"
        );
    }

    /// A pip torch's worker says its ranks are Python processes, and its Python witness
    /// is said as the process's, not the loader's.
    #[test]
    fn a_python_workers_rows_say_so() {
        let mut w = status::test_worker("a", "2.30.7", &[(8, 6)], "13.2");
        let report = w.report.as_mut().unwrap();
        if let Facts::Known(lt) = &mut report.libtorch {
            lt.python = Some(std::path::PathBuf::from("/v/bin/python3.11"));
        }
        report.witness = Some(WitnessReport {
            verdict: "agree".into(),
            loader: "all 51 nccl* slots point into /v/libnccl.so.2".into(),
            model: None,
            python: true,
        });
        let text = render_status(&[w]);
        assert!(
            text.contains("  process   Python: /v/bin/python3.11 -c … importing torch, started in the checkout (assumed)\n"),
            "{text}"
        );
        assert!(
            text.contains("  witness   its Python process agrees: all 51"),
            "{text}"
        );
    }
}
