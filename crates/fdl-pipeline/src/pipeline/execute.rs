//! Executing a plan: the target's lock, the machine-wide store (install from it, or add
//! to it), the backend's build into staging, verification, and the all-or-nothing
//! install that commits it. Any error before the commit leaves the project exactly as
//! it was.

use super::key::{store_key, KeyState};
use crate::lock;
use crate::nccl::backend::Backend;
use crate::nccl::plan::BuildPlan;
use crate::nccl::store::{BuildName, BuildStore, Existing, Manifest, LOG_SUFFIX};
use crate::nccl::tree::BUILD_LOG;
use crate::nccl::verify;
use crate::process;
use crate::progress::{Phase, Progress, Verbosity};
use crate::store::{Key, KeyInputs, StoreRecord};
use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub enum Outcome {
    Built {
        manifest: Box<Manifest>,
        dir: PathBuf,
        replaced: bool,
        /// Installed from the machine-wide store, and how its files came over; `None`
        /// when it was compiled.
        from_store: Option<crate::store::Method>,
        /// Where the time went, phase by phase ([`Progress::timings`]).
        timings: Vec<crate::progress::PhaseTime>,
    },
    AlreadyBuilt {
        manifest: Box<Manifest>,
        dir: PathBuf,
    },
}

/// The store entry of a build's key, with the key's lock held; or why there is none.
type Keyed<'s> = std::result::Result<
    (
        &'s crate::store::Store,
        Key,
        KeyInputs,
        crate::lock::BuildLock,
    ),
    String,
>;

/// How `execute` behaves around the build itself.
pub struct ExecOptions<'a> {
    /// The run's context: fdl's cache directory (locks, and the logs of failed builds),
    /// and where what the build says beside its progress goes (waits for a lock,
    /// leftovers swept, warnings).
    pub ctx: &'a crate::context::Context,
    pub force: bool,
    pub wait: lock::Wait,
    pub verbosity: Verbosity,
    /// Loads the staged library to check `ncclGetVersion`; `None` skips that check (and
    /// the manifest says so).
    pub probe: Option<verify::Probe<'a>>,
    /// The machine-wide store to install from and add to; `None` skips it
    /// (`--no-store`).
    pub store: Option<crate::store::Store>,
    /// The store key of this plan and backend as the plan knows it (the plan view shows
    /// it): `execute` asks [`store_key`] only where [`KeyState`] says the build makes it
    /// known, once.
    pub key: KeyState,
}

/// Why `plan` cannot be installed where `existing` is (without `--force`): a build from
/// another plan, or something at its place that is no readable fdl build. The build
/// refuses with it; a dry run lists it among the plan's problems.
pub fn conflict(
    plan: &BuildPlan,
    existing: Option<&Existing>,
    dir: &Path,
    force: bool,
) -> Option<String> {
    if force {
        return None;
    }
    match existing? {
        Existing::Build(m) => {
            let diff = plan.differences(&m.plan);
            (!diff.is_empty()).then(|| format!(
                "{} already holds a build from a different plan:\n  {}\nPass --force to replace it (the old build is kept until the new one succeeds)",
                dir.display(),
                diff.join("\n  ")
            ))
        }
        Existing::Unreadable(why) => Some(format!(
            "{} holds an fdl build whose manifest cannot be read ({why}). Pass --force to replace it once the new build succeeds, or remove it with `fdl nccl remove {}`",
            dir.display(),
            plan.name
        )),
        Existing::NotABuild(why) => Some(format!(
            "{} exists but is not an fdl build ({why}). Move it away, or pass --force to replace it once the new build succeeds",
            dir.display()
        )),
    }
}

/// A failed build whose log was kept: the error says where, and shows its end.
#[derive(Debug, thiserror::Error)]
#[error("{cause:#}\nThe full build log is kept at {}; its last lines:\n{}", log.display(), tail.join("\n"))]
pub struct BuildFailed {
    pub cause: anyhow::Error,
    pub log: PathBuf,
    pub tail: Vec<String>,
}

/// What a build of the same plan that would be skipped has become since it was sealed:
/// every byte read against its manifest's record, as `fdl nccl verify` reads it, so a
/// changed build is never "nothing to do". `None` when it is as sealed (or its manifest,
/// from an fdl before the record, has none to read against).
pub(crate) fn changed_since_sealed(
    name: &str,
    dir: &std::path::Path,
    m: &crate::nccl::store::Manifest,
) -> Result<Option<String>> {
    let Some(recorded) = &m.files else {
        return Ok(None);
    };
    let c = crate::nccl::files::compare(dir, recorded)?;
    if c.changes.is_empty() {
        return Ok(None);
    }
    let shown: Vec<&str> = c.changes.iter().take(3).map(String::as_str).collect();
    let more = c.changes.len() - shown.len();
    Ok(Some(format!(
        "{} holds a build of the same plan, but it changed since it was sealed: {}{}. Rebuild it with --force and the same flags (`fdl nccl verify {name}` shows every change)",
        crate::text::shown(dir),
        shown.join("; "),
        if more > 0 { format!("; and {more} more") } else { String::new() },
    )))
}

/// Runs the plan: takes the target's lock, compares with what is installed, builds into
/// staging, checks, seals and commits. Any error before the commit leaves the store
/// exactly as it was; the log of a failed build is kept in the cache and named.
pub fn execute(
    plan: &BuildPlan,
    backend: &dyn Backend,
    store: &BuildStore,
    opts: &ExecOptions,
) -> Result<Outcome> {
    if !plan.findings.problems.is_empty() {
        bail!(
            "the plan cannot run:\n  {}",
            plan.findings
                .problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n  ")
        );
    }
    let dir = store.path_of(&plan.name);
    let name = BuildName::parse(&plan.name)?;
    let cache = opts.ctx.cache()?;
    let lock = store.lock(&name, &cache, opts.wait, &|msg| opts.ctx.say(msg))?;
    for done in store.sweep_leftovers(&lock) {
        opts.ctx.say(&done);
    }
    let existing = store.existing(&plan.name)?;
    if let Some(Existing::Build(m)) = &existing {
        if !opts.force && plan.differences(&m.plan).is_empty() {
            if let Some(why) = changed_since_sealed(&plan.name, &dir, m)? {
                bail!("{why}");
            }
            return Ok(Outcome::AlreadyBuilt {
                manifest: m.clone(),
                dir,
            });
        }
    }
    if let Some(why) = conflict(plan, existing.as_ref(), &dir, opts.force) {
        bail!("{why}");
    }
    // Staging first: if it cannot be made, no log file is left behind either.
    let mut staging = store.begin(opts.ctx, &lock)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // `logs/` made and checked as every cache directory is: never through a link, never
    // in another user's directory.
    let log_path = crate::cache::subdir(&cache, "logs")?.join(format!(
        "{}-{stamp}-{}{LOG_SUFFIX}",
        plan.name,
        std::process::id()
    ));
    let progress = Progress::new(opts.verbosity, log_path.clone())
        .with_context(|| format!("cannot create the build log {}", log_path.display()))?;
    // The last line of the build's header (`render::header`): where its whole output goes.
    progress.note(&format!("  log        {}", log_path.display()));
    // The store: with the key's lock held from here to the end, a second build of the
    // same key waits, then finds the entry this one makes.
    // The key's entry, locked; or why there is none (said again if the build is not
    // added to the store).
    let mut keyed: Keyed = match &opts.store {
        None => Err("--no-store".into()),
        Some(ms) => {
            let answer = match &opts.key {
                KeyState::Known(key, inputs) => Ok((key.clone(), inputs.clone())),
                // A clone-source build's key is the cloned tag's commit, unknown before
                // the first clone: the tag is cloned first, so that the key is known and
                // its lock taken before anything compiles — a second first build of that
                // key then waits here and takes this one's entry instead of compiling it
                // again.
                KeyState::AfterClone(_) => {
                    backend.before_key(plan, &progress)?;
                    store_key(plan, backend)
                }
                KeyState::AfterBuild(why) | KeyState::Unknown(why) => Err(why.clone()),
            };
            match answer {
                Ok((key, inputs)) => {
                    let key_lock = ms.lock(&key, opts.wait, &|msg| opts.ctx.say(msg))?;
                    for done in ms.sweep(&key_lock, &key) {
                        progress.note(&done);
                    }
                    Ok((ms, key, inputs, key_lock))
                }
                Err(why) => {
                    progress.note(&format!("Not looked up in the build store: {why}"));
                    Err(why)
                }
            }
        }
    };
    let mut hit = None;
    if let Ok((ms, key, _, key_lock)) = &keyed {
        if ms.has(key) {
            match ms.install(key_lock, key, staging.path()) {
                Ok(installed) => hit = Some(installed),
                Err(e) if e.downcast_ref::<process::Interrupted>().is_some() => return Err(e),
                Err(e) => {
                    // Modified files, or anything else that keeps the entry from being
                    // installed (an entry with a FIFO in it, a record that does not
                    // parse): it is removed, and this build makes it again.
                    let msg =
                        format!("warning: {e:#}; removing the store entry and building it instead");
                    // Said even when quiet: a store entry changed behind fdl's back.
                    progress.output(&msg);
                    opts.ctx.say(&msg);
                    ms.remove(key_lock, key)?;
                    // A fresh staging directory: the failed install's files go with the old.
                    drop(staging);
                    staging = store.begin(opts.ctx, &lock)?;
                }
            }
        }
    }
    let built = (|| -> Result<Manifest> {
        match &hit {
            Some(installed) => progress.note(&format!(
                "Installing from the build store: entry {} ({}), made {} for {}",
                installed.record.key,
                installed.method,
                installed.record.created_at,
                installed.record.made_for.display()
            )),
            None => backend.build(plan, staging.path(), &progress)?,
        }
        progress.phase(Phase::Verify);
        let against = verify::Against {
            recorded: None,
            files: None,
            // The build may be meant for another host: only the planned archs must be there.
            gpus: verify::LocalGpus::NotChecked,
            driver: None,
            probe: opts.probe,
        };
        let report = verify::verify(&plan.name, staging.path(), plan, &against);
        for c in &report.checks {
            progress.note(&format!("verify {:<8} {}: {}", c.status, c.check, c.detail));
        }
        if !report.passed() {
            let failures: Vec<String> = report
                .failures()
                .iter()
                .map(|c| format!("{}: {}", c.check, c.detail))
                .collect();
            bail!(
                "the build failed verification; nothing was installed:\n  {}",
                failures.join("\n  ")
            );
        }
        // A passed verification includes the layout check.
        let checked = report
            .checked
            .ok_or_else(|| anyhow!("the verification of the staged build recorded no layout"))?;
        if hit.is_none() && opts.store.is_some() {
            progress.phase(Phase::Store);
        }
        let record = if hit.is_some() {
            keyed.as_ref().ok().map(|(_, key, inputs, _)| StoreRecord {
                key: key.clone(),
                inputs: inputs.clone(),
                from_store: true,
            })
        } else {
            store_built(
                plan,
                backend,
                opts,
                &mut keyed,
                staging.path(),
                &log_path,
                &progress,
            )
        };
        progress.phase(Phase::Seal);
        let known = hit.as_ref().map(|h| h.digests.clone()).unwrap_or_default();
        let manifest = staging
            .seal(plan, checked, report.checks, record, &known)
            .context(
                "the build passed verification but could not be sealed; nothing was installed",
            )?;
        // A Ctrl-C that lands after the last child exited still means "do not install".
        if process::interrupted() {
            return Err(process::Interrupted.into());
        }
        Ok(manifest)
    })();
    let manifest = match built {
        Ok(m) => m,
        Err(e) if e.downcast_ref::<process::Interrupted>().is_some() => {
            // "Everything this run started was cleaned up": the log too.
            progress.finish();
            let _ = std::fs::remove_file(&log_path);
            return Err(e);
        }
        Err(cause) => {
            progress.finish();
            return Err(BuildFailed {
                cause,
                tail: progress.tail(crate::progress::TAIL_LINES),
                log: log_path,
            }
            .into());
        }
    };
    progress.finish();
    // The log travels with the build; the copy in the cache is only for failures.
    std::fs::File::open(&log_path)
        .map_err(anyhow::Error::from)
        .and_then(|mut log| crate::fswrite::create_new(&staging.path().join(BUILD_LOG), &mut log))
        .with_context(|| format!("cannot keep the build log in {}", staging.path().display()))?;
    let committed = staging.commit(existing.is_some())?;
    // Installed from here on: what fails after the commit is a warning, and the project
    // is still recorded as the store entry's user below.
    if let Some(warning) = committed.warning() {
        opts.ctx.say(&warning);
    }
    let _ = std::fs::remove_file(&log_path);
    // The project is a user of the entry it came from or made (none when adding failed).
    if let (Ok((ms, key, _, key_lock)), Some(_)) = (&keyed, &manifest.store) {
        let builds_dir = store
            .dir
            .canonicalize()
            .unwrap_or_else(|_| store.dir.clone());
        let user = crate::store::User {
            builds_dir,
            name: plan.name.clone(),
        };
        if ms.has(key) {
            if let Err(e) = ms.add_user(key_lock, key, user) {
                opts.ctx.say(&format!("warning: the build store could not record that this project uses entry {key}: {e:#}"));
            }
        }
    }
    Ok(Outcome::Built {
        manifest: Box::new(manifest),
        dir,
        replaced: existing.is_some(),
        from_store: hit.map(|h| h.method),
        timings: progress.timings(),
    })
}

/// After a build that passed verification: adds it to the store. The key is asked here
/// only where the plan says the build makes it known ([`KeyState::AfterBuild`]: an image
/// the build fetched names it now). A failure to store is said, and leaves the build as
/// it is.
fn store_built<'s>(
    plan: &BuildPlan,
    backend: &dyn Backend,
    opts: &'s ExecOptions,
    keyed: &mut Keyed<'s>,
    staging: &Path,
    log: &Path,
    progress: &Progress,
) -> Option<StoreRecord> {
    let ms = opts.store.as_ref()?;
    if let Err(why) = &keyed {
        let answer = match &opts.key {
            KeyState::AfterBuild(_) => store_key(plan, backend),
            _ => Err(why.clone()),
        };
        let (key, inputs) = match answer {
            Ok(k) => k,
            Err(why) => {
                progress.note(&format!("Not added to the build store: {why}"));
                return None;
            }
        };
        match ms.lock(&key, opts.wait, &|msg| opts.ctx.say(msg)) {
            Ok(key_lock) => *keyed = Ok((ms, key, inputs, key_lock)),
            Err(e) => {
                progress.note(&format!("Not added to the build store: {e:#}"));
                return None;
            }
        }
    }
    let (ms, key, inputs, key_lock) = keyed.as_ref().ok()?;
    let made_for = plan.output_dir.clone();
    match ms.add(opts.ctx, key_lock, key, inputs, staging, Some(log), &made_for) {
        Ok(_) => progress.note(&format!("Added to the build store as entry {key}")),
        Err(e) => progress.note(&format!(
            "warning: the build could not be added to the build store ({e:#}); it is installed all the same"
        )),
    }
    Some(StoreRecord {
        key: key.clone(),
        inputs: inputs.clone(),
        from_store: false,
    })
}
