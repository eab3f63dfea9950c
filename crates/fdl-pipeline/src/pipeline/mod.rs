//! The build pipeline, one straight line: infer → plan → store key → execute (backend
//! build or store install) → verify → install → report. [`prepare`] does everything up
//! to a plan that can be shown, checked and saved, without writing anything;
//! [`Prepared::execute`] runs it and returns a typed [`Report`]. `cli` only turns flags
//! into a [`Request`] and renders what comes back; `cluster build` calls the same two
//! functions with inputs inferred from every worker.
//!
//! It sits above the concerns it joins (`nccl` for the plan and the install, `store`,
//! `docker`, `native`, `libtorch`, `gpu`) and below `cluster` and `cli`.

pub mod choose;
pub mod execute;
pub mod infer;
pub mod key;
pub mod render;

pub use choose::{BackendFlag, BackendRequest};
pub use execute::{conflict, execute, BuildFailed, ExecOptions, Outcome};
pub use infer::{
    check_flags, default_jobs, infer, left_out, plan, BuildRequest, CheckedFlags, Inferred,
    Sources, MAX_JOBS,
};
pub use key::{key_inputs, store_key, KeyAnswer, KeyState, StoreState, StoreView};

use crate::docker::{DockerBackend, Engine};
use crate::lock::Wait;
use crate::native;
use crate::nccl::backend::Backend;
use crate::nccl::finding::Finding;
use crate::nccl::plan::BuildPlan;
use crate::nccl::store::{BuildStore, Existing};
use crate::nccl::verify;
use crate::progress::Verbosity;
use crate::project::Project;
use crate::step::Step;
use anyhow::Result;
use choose::Chosen;
use fdl_backends::Planned;
use std::path::{Path, PathBuf};

/// Everything a build was asked, typed.
#[derive(Debug, Clone)]
pub struct Request {
    pub build: BuildRequest,
    pub backend: BackendRequest,
    /// Replace an existing build of the same name (only after the new one succeeded).
    pub force: bool,
    /// Fail instead of waiting when another fdl is building the same target.
    pub no_wait: bool,
    /// Plan only: the problems a real run would meet first are added to the plan.
    pub dry_run: bool,
    /// Neither install from the machine-wide store nor add to it.
    pub no_store: bool,
    /// Build for this host although its driver cannot run the plan's CUDA (for a driver
    /// update under way, or a build that only ships): a warning instead of a problem.
    pub allow_old_driver: bool,
    pub verbosity: Verbosity,
}

/// A plan with what it will run and what the store will do: all a dry run shows, and
/// all a real run needs.
pub struct Prepared {
    pub plan: BuildPlan,
    /// The run's context, for the build.
    ctx: crate::context::Context,
    /// The commands the plan runs, rendered ([`render::steps`]).
    pub commands: Vec<String>,
    pub store: StoreView,
    backend: Option<Box<dyn Backend>>,
    chosen: Chosen,
    /// The store key, asked once here ([`KeyState`]).
    key: KeyState,
    request: Request,
    /// Where the build goes, and whose active libtorch it is judged against once made.
    project: Project,
}

/// `inferred` the plan's inputs (from this host, or from a whole cluster's reports),
/// made into a plan for the backend `req` chooses, with every problem a real run would
/// meet first. Writes nothing: no build, no store directory, no lock.
pub fn prepare(
    ctx: &crate::context::Context,
    project: &Project,
    req: &Request,
    infer: &dyn Fn(CheckedFlags) -> Result<Inferred>,
) -> Result<Prepared> {
    // A malformed flag is the command line's error, whatever the project holds.
    let flags = check_flags(&req.build).map_err(crate::project::RootIrrelevant)?;
    // `+PTX` in --archs is --ptx: the plan sees one request, whichever way it was said.
    let build = BuildRequest {
        ptx: flags.ptx,
        ..req.build.clone()
    };
    let mut inferred = infer(flags)?;
    let host_driver = inferred.host_driver.take();
    // Every question the plan asks the Docker engine shares one deadline: a stuck engine
    // costs a plan (a dry run) this much in all, not this much per question.
    let _engine_budget = crate::docker::QueryBudget::start(crate::docker::PLAN_BUDGET);
    let (inputs, reason, mut chosen) = choose::choose(ctx, &req.backend, &inferred.tag)?;
    let mut plan = plan(&build, inferred, project.nccl_builds_dir(), inputs, reason)?;
    if project.fell_back() {
        plan.findings.warnings.push(Finding::RootFallback {
            root: project.root.clone(),
        });
    }
    if let Some(driver) = &host_driver {
        driver_check(&mut plan, driver, req.allow_old_driver);
    }
    // The engine the build needs is asked for now, so that a dry run meets what a real
    // run would meet first. A plan is about its inputs, and is sound whichever host it
    // is made on (a dry run on a laptop before the build host, say): a dry run names this
    // host's missing engine as a warning; a real build refuses on it.
    if let Chosen::Docker { engine, .. } = &mut chosen {
        if engine.is_none() {
            match Engine::probe(ctx) {
                Ok(e) => *engine = Some(e),
                Err(e) if req.dry_run => plan
                    .findings
                    .warnings
                    .push(Finding::NoEngineHere { why: e.to_string() }),
                Err(e) => plan
                    .findings
                    .problems
                    .push(Finding::NoEngine { why: e.to_string() }),
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
            ctx: ctx.clone(),
        })),
        Chosen::Docker { engine: None, .. } => None,
        Chosen::Native { .. } => Some(Box::new(native::NativeBackend { ctx: ctx.clone() })),
    };
    let (store, key) = key::store_view(ctx, &plan, backend.as_deref(), req.no_store);
    if let Chosen::Native { missing } = &chosen {
        if !missing.is_empty() {
            let tools = missing.clone();
            if store.state == StoreState::Hit {
                plan.findings
                    .warnings
                    .push(Finding::ToolsNotNeeded { tools });
            } else {
                plan.findings.problems.push(Finding::ToolsMissing { tools });
            }
        }
    }
    if req.dry_run {
        match tag_check(ctx, &plan) {
            TagCheck::Checked => {}
            TagCheck::Unchecked(note) => plan.findings.warnings.push(note),
            TagCheck::Mismatch(why) => plan.findings.problems.push(why),
        }
        // What the build checks first under its lock, checked here without one.
        let builds = BuildStore::new(project.nccl_builds_dir());
        let existing = builds.existing(&plan.name)?;
        let dir = builds.path_of(&plan.name);
        match conflict(&plan, existing.as_ref(), &dir, req.force) {
            Some(why) => plan.findings.problems.push(Finding::Conflict { why }),
            None => {
                if let Some(Existing::Build(m)) = &existing {
                    let same = !req.force && plan.differences(&m.plan).is_empty();
                    if let Some(why) = same
                        .then(|| execute::changed_since_sealed(&plan.name, &dir, m))
                        .transpose()?
                        .flatten()
                    {
                        plan.findings
                            .problems
                            .push(Finding::ChangedSinceSealed { why });
                    } else if same {
                        plan.findings.warnings.push(Finding::AlreadyBuilt {
                            dir: dir.clone(),
                            built_at: m.built_at.clone(),
                        });
                    }
                }
            }
        }
    }
    let commands = render::steps(&plan).iter().map(Step::render).collect();
    Ok(Prepared {
        ctx: ctx.clone(),
        plan,
        commands,
        store,
        backend,
        chosen,
        key,
        request: req.clone(),
        project: project.clone(),
    })
}

/// What a dry run could check of the tag against a source.
enum TagCheck {
    /// A `--source` tree's `version.mk` (checked when the plan was made), or fdl's clone.
    Checked,
    /// No tree of the tag is here yet, and fdl keeps no list of NCCL's releases.
    Unchecked(Finding),
    /// fdl's clone of the tag holds another release.
    Mismatch(Finding),
}

/// Reads what a dry run can of the tag's source: a clone already in fdl's cache is read
/// here; a clone not made yet leaves the tag unchecked, which is said.
fn tag_check(ctx: &crate::context::Context, plan: &BuildPlan) -> TagCheck {
    let cache = ctx.cache().ok();
    let clone = plan.backend.planned().source_clone(plan, cache.as_deref());
    let Some((repo, cache_dir)) = clone else {
        return TagCheck::Checked;
    };
    if std::fs::symlink_metadata(&cache_dir).is_ok() {
        let want = plan.tag.version();
        return match native::tree_version(&cache_dir) {
            Ok(v) if want.as_ref().is_some_and(|w| !w.same_release(&v)) => {
                TagCheck::Mismatch(Finding::CloneOtherRelease {
                    tag: plan.tag.to_string(),
                    found: v,
                    clone: cache_dir,
                })
            }
            // A damaged clone is found and replaced by the build itself.
            _ => TagCheck::Checked,
        };
    }
    TagCheck::Unchecked(Finding::TagUnchecked {
        tag: plan.tag.to_string(),
        repo: crate::text::clean(&repo),
    })
}

/// The plan's CUDA against this host's driver, by the one rule `cluster status` uses
/// ([`crate::gpu::DriverCheck`]): a driver too old is a problem (the library would not
/// load its kernels: `cudaErrorInsufficientDriver`) unless `allow` says otherwise; a
/// driver that cannot be read (no `nvidia-smi`: a login node, CI) is a warning, since
/// the check could not be made.
fn driver_check(
    plan: &mut BuildPlan,
    driver: &std::result::Result<crate::gpu::Driver, crate::gpu::GpuError>,
    allow: bool,
) {
    use crate::gpu::DriverCheck;
    let check = DriverCheck::of("this host", driver, plan.cuda, "the plan");
    match check {
        DriverCheck::Runs(_) => {}
        DriverCheck::MinorCompat(why) | DriverCheck::Unknown(why) => {
            plan.findings.warnings.push(Finding::Driver { why })
        }
        DriverCheck::TooOld(why) if allow => plan
            .findings
            .warnings
            .push(Finding::DriverTooOld { why, allowed: true }),
        DriverCheck::TooOld(why) => plan.findings.problems.push(Finding::DriverTooOld {
            why,
            allowed: false,
        }),
    }
}

/// What a build did, and how to wire it.
#[derive(Debug)]
pub struct Report {
    pub outcome: Outcome,
    /// The build's directory name.
    pub name: String,
    /// The `LD_PRELOAD` value the loader honours for it (a cache link where its path
    /// holds a space or a colon), or why there is none.
    pub preload: std::result::Result<PathBuf, String>,
    /// The build is another NCCL release than the active libtorch's.
    pub other_release: Option<crate::nccl::pick::OtherRelease>,
}

/// What a build did, in one word: `--json`'s `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Compiled and installed.
    Built,
    /// Installed from the build store's entry, nothing compiled.
    InstalledFromStore,
    /// Built again over a build of the same name.
    Replaced,
    /// The same plan was built already: nothing done.
    AlreadyBuilt,
}

impl Report {
    pub fn status(&self) -> Status {
        match &self.outcome {
            Outcome::Built {
                replaced: false,
                from_store: None,
                ..
            } => Status::Built,
            Outcome::Built {
                replaced: false,
                from_store: Some(_),
                ..
            } => Status::InstalledFromStore,
            Outcome::Built { .. } => Status::Replaced,
            Outcome::AlreadyBuilt { .. } => Status::AlreadyBuilt,
        }
    }
}

impl Prepared {
    /// The plan's problems as one error, for a run that must not start.
    pub fn refusal(&self) -> Option<anyhow::Error> {
        let problems = &self.plan.findings.problems;
        (!problems.is_empty()).then(|| {
            let lines: Vec<String> = problems.iter().map(Finding::to_string).collect();
            crate::project::RootIrrelevant(anyhow::anyhow!(
                "the plan cannot run (see it with --dry-run):\n  {}",
                lines.join("\n  ")
            ))
            .into()
        })
    }

    /// Runs the plan: the backend's build (or the store's entry) into staging, checked,
    /// installed all or nothing.
    pub fn execute(self) -> Result<Report> {
        if let Some(e) = self.refusal() {
            return Err(e);
        }
        let req = &self.request;
        let backend: Box<dyn Backend> = match (self.backend, self.chosen) {
            (Some(b), _) => b,
            (None, Chosen::Docker { dockerfile, .. }) => Box::new(DockerBackend {
                engine: Engine::probe(&self.ctx)?,
                dockerfile,
                ctx: self.ctx.clone(),
            }),
            (None, Chosen::Native { .. }) => Box::new(native::NativeBackend {
                ctx: self.ctx.clone(),
            }),
        };
        let builds = BuildStore::new(self.project.nccl_builds_dir());
        let exe = std::env::current_exe()?;
        let probe = |lib: &Path| verify::probe_in_child(&exe, lib);
        let ctx = &self.ctx;
        let cache = ctx.cache()?;
        let opts = ExecOptions {
            probe: Some(&probe),
            ctx,
            force: req.force,
            wait: if req.no_wait { Wait::No } else { Wait::Yes },
            verbosity: req.verbosity,
            // A store fdl cannot use (a cache directory others can write, say) costs the
            // speed-up, never the build.
            store: if req.no_store {
                None
            } else {
                match crate::store::Store::open_in(&cache) {
                    Ok(store) => Some(store),
                    Err(e) => {
                        ctx.say(&format!(
                            "warning: the build store is not used for this build: {e:#}"
                        ));
                        None
                    }
                }
            },
            key: self.key,
        };
        let outcome = execute(&self.plan, backend.as_ref(), &builds, &opts)?;
        let dir = match &outcome {
            Outcome::Built { dir, .. } | Outcome::AlreadyBuilt { dir, .. } => dir.clone(),
        };
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let lib = dir.join("lib").join("libnccl.so.2");
        let preload = crate::nccl::preload::preload_path_in(&lib, &name, &cache)
            .map_err(|e| format!("{e:#}"));
        let version = match &outcome {
            Outcome::Built { manifest, .. } | Outcome::AlreadyBuilt { manifest, .. } => {
                &manifest.checked.header_version
            }
        };
        let other_release = crate::nccl::pick::other_release(&self.project, Some(&lib), version);
        Ok(Report {
            outcome,
            name,
            preload,
            other_release,
        })
    }
}
