//! `fdl launch -- COMMAND…`: runs a job with the build `fdl nccl env` would wire (or
//! `--build`), preloaded, and says on stderr which of its processes do not run it
//! ([`crate::launch`] supervises; this module turns flags into its inputs and renders).

use super::common::build_name_arg;
use super::complete;
use super::manage::{wire, Wired, Wiring};
use crate::context::Context;
use crate::launch::{Build, Event, Options};
use crate::nccl::files::FileEntry;
use crate::project::{Project, RootIrrelevant};
use crate::text::{clean, paint_err, Color};
use anyhow::Result;
use clap_complete::ArgValueCandidates;
use std::ffi::OsString;
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct LaunchArgs {
    /// The build to preload, as `fdl nccl list` names it (default: the one `fdl nccl env`
    /// chooses: the newest matching the active libtorch's NCCL and this host's GPUs)
    #[arg(long, value_parser = build_name_arg, add = ArgValueCandidates::new(complete::builds))]
    pub build: Option<String>,
    /// Stop the job at the first process that does not run the build (SIGTERM to its
    /// process group, SIGKILL after --grace) and exit 1
    #[arg(long)]
    pub strict: bool,
    /// Seconds the job has between SIGTERM and SIGKILL when fdl ends it
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    pub grace: u64,
    /// Do not read the processes' memory (their GOT): answer by the loader's rules
    #[arg(long)]
    pub no_memory: bool,
    /// Also say each process found on the build, and what the answer rests on
    #[arg(long, short)]
    pub verbose: bool,
    /// The command to run, after `--`: torchrun, python -m torch.distributed.run,
    /// mpirun, a script
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// The error that ends fdl with the job's own exit status, said by nothing else.
#[derive(Debug, thiserror::Error)]
#[error("the job exited with status {0}")]
pub struct JobStatus(pub u8);

pub(super) fn run(ctx: &Context, project: &Project, args: LaunchArgs) -> Result<()> {
    let Wired {
        choice,
        lib_dir,
        preload,
        moved,
    } = wire(ctx, project, args.build.as_deref(), &Wiring::LAUNCH)?;
    let library = lib_dir.join(&choice.manifest.checked.library);
    let want = format!("lib/{}", choice.manifest.checked.library);
    let blake3 = choice
        .manifest
        .files
        .iter()
        .flatten()
        .find_map(|f| match f {
            FileEntry::File { path, blake3, .. } if *path == want => Some(blake3.clone()),
            _ => None,
        });
    let build = Build {
        name: choice.build.clone(),
        library,
        preload,
        blake3,
        env: moved
            .iter()
            .filter_map(|m| Some((m.variable.to_string(), m.keep.clone()?)))
            .collect(),
    };
    let opts = Options {
        strict: args.strict,
        grace: Duration::from_secs(args.grace),
        no_memory: args.no_memory,
        digest_cache: ctx.cache().ok(),
        ..Options::default()
    };
    let name = clean(&build.name);
    let tag = || paint_err("fdl launch:", Color::Yellow);
    let mut on = |e: Event<'_>| {
        match e {
        Event::Started { pid } => crate::eprintln_safe!(
            "{} build {name} preloaded (LD_PRELOAD={}); the job is pid {pid}",
            tag(),
            crate::text::shown(&build.preload)
        ),
        Event::Forwarded { signal } => crate::eprintln_safe!(
            "{} passed {} on to the job",
            tag(),
            crate::launch::signal_name(signal)
        ),
        Event::Checked(c) => {
            if args.verbose {
                crate::eprintln_safe!("{} {}", tag(), c.full(&name))
            }
        }
        Event::Problem(c) => crate::eprintln_safe!(
            "{} {}",
            paint_err("fdl launch:", Color::Red),
            c.full(&name)
        ),
        Event::Stopping(c) => crate::eprintln_safe!(
            "{} --strict: stopping the job for pid {} (SIGTERM to its processes, SIGKILL after {} s)",
            paint_err("fdl launch:", Color::Red),
            c.pid,
            args.grace
        ),
        Event::Ending { left } => crate::eprintln_safe!(
            "{} the job's command ended; ending the {left} process(es) it left running",
            tag()
        ),
    }
    };
    let outcome =
        crate::launch::run(&args.command, &build, &opts, &mut on).map_err(RootIrrelevant)?;
    crate::eprintln_safe!("{}", outcome.summary(&name));
    if let Some(c) = &outcome.stopped {
        // The job's own story: the project root has nothing to add to it.
        return Err(RootIrrelevant(anyhow::anyhow!(
            "stopped the job (--strict): {}; it {}",
            c.short(&name),
            outcome.status
        ))
        .into());
    }
    match outcome.code() {
        0 => Ok(()),
        code => Err(JobStatus(code).into()),
    }
}
