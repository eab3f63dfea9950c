//! `fdl cluster ship`: one build of the controller, copied to every worker's
//! `<path>/libtorch/nccl/builds/<name>/`, verified there and installed atomically.
//!
//! Per worker: the controller's own fdl is made present (by sha256), the worker says
//! what is at the build's place (nothing, the same bytes — a no-op, which covers a
//! shared project directory — or another build, refused without `--force`), the build
//! is copied into `.incoming-<name>/` beside the target, and the worker's fdl verifies
//! and installs it with the local transaction rules. The copy is the transport's
//! (ssh.rs: rsync or a tar stream over SSH; slurm.rs: sbcast of a tar, or a tar stream
//! through srun). Each phase runs on every worker still going at once; one failing never
//! stops another.

use super::config::Worker;
use super::receive::{content_digest, payload_digest, Installed, Place, StateReport};
use super::status::{ensure_fdl, OwnBinary, NOT_THIS_FDL, NO_PATH};
use super::transport::{self, Transport};
use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Outcome {
    /// The same bytes are already there.
    AlreadyThere,
    Installed {
        replaced: bool,
        /// How the files went: the copy method, or the worker's store.
        copy: String,
        /// Whether the worker's build store filled the build (`copy` then says so).
        #[serde(skip)]
        from_store: bool,
    },
    /// `--dry-run`: what would happen.
    WouldCopy {
        copy: String,
        #[serde(skip)]
        from_store: bool,
        replace: bool,
    },
    /// A different build is there and `--force` was not given.
    Refused {
        why: String,
    },
    Failed {
        why: String,
    },
}

impl Outcome {
    pub fn ok(&self) -> bool {
        matches!(
            self,
            Outcome::AlreadyThere | Outcome::Installed { .. } | Outcome::WouldCopy { .. }
        )
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ShipResult {
    pub host: String,
    pub target: String,
    pub dir: String,
    #[serde(flatten)]
    pub outcome: Outcome,
}

pub struct ShipRequest<'a> {
    pub name: &'a str,
    /// The build on the controller.
    pub dir: &'a Path,
    pub digest: String,
    /// The machine-wide store's key of the build (its manifest's) and its payload digest:
    /// a worker whose store has an entry of that key with these bytes is sent only the
    /// manifest and the log.
    pub store: Option<(String, String)>,
    pub force: bool,
    pub dry_run: bool,
    pub timeout: Duration,
}

impl ShipRequest<'_> {
    pub fn new<'a>(
        name: &'a str,
        dir: &'a Path,
        force: bool,
        dry_run: bool,
        timeout: Duration,
    ) -> Result<ShipRequest<'a>> {
        let store = match crate::nccl::store::read_manifest(dir)?.store {
            Some(record) => Some((record.key.as_str().to_string(), payload_digest(dir)?)),
            None => None,
        };
        Ok(ShipRequest {
            name,
            dir,
            digest: content_digest(dir)?,
            store,
            force,
            dry_run,
            timeout,
        })
    }
}

/// The worker-side command, from its checkout, with the controller's fdl.
fn receive_script(w: &Worker, own: &OwnBinary, args: &[String]) -> String {
    let mut all = vec!["cluster", "receive"];
    all.extend(args.iter().map(String::as_str));
    format!(
        "cd -- {} 2>/dev/null || exit {NO_PATH}; {}; [ -n \"$f\" ] || exit {NOT_THIS_FDL}; exec \"$f\" --root \"$PWD\" {}",
        crate::step::single_quote(&w.path),
        own.open_there(),
        transport::words(&all)
    )
}

/// Reads `receive`'s one JSON answer (or its error) from what the worker printed.
fn receive_answer<T: serde::de::DeserializeOwned>(w: &Worker, out: Result<Output>) -> Result<T> {
    let out = out?;
    if out.status.code() == Some(NO_PATH) {
        bail!(
            "its path {} does not exist there (or cannot be entered): fix `path:` or create the checkout",
            w.path
        );
    }
    if let Some(e) = super::status::unsafe_cache(&out) {
        return Err(e);
    }
    if out.status.code() == Some(NOT_THIS_FDL) {
        bail!("the fdl in its cache is no longer this fdl's bytes (it was not run): ship again");
    }
    if let Some(why) = transport::banner(&out.stdout) {
        bail!("{why}");
    }
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let v: Option<serde_json::Value> = serde_json::from_str(text.trim()).ok();
        let why = v
            .as_ref()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or_else(|| {
                String::from_utf8_lossy(&out.stderr)
                    .trim()
                    .trim_start_matches("error: ")
                    .to_string()
            });
        bail!("{why}");
    }
    serde_json::from_str(text.trim()).with_context(|| {
        format!(
            "the worker's fdl gave no answer: '{}'",
            text.trim().chars().take(200).collect::<String>()
        )
    })
}

/// Runs `receive` with `args` on every worker at once.
fn receive_all<T: serde::de::DeserializeOwned>(
    t: &dyn Transport,
    ws: &[&Worker],
    own: &OwnBinary,
    args: &[String],
    timeout: Duration,
) -> Vec<Result<T>> {
    let script = |w: &Worker| receive_script(w, own, args);
    t.run_each(ws, &script, timeout)
        .into_iter()
        .zip(ws)
        .map(|(out, w)| receive_answer(w, out))
        .collect()
}

/// Where a worker stands between phases: still going (with what it needs next), or done.
enum Step {
    /// `from_store`: the worker's build store has the payload, so only fdl's files go.
    Going {
        incoming: PathBuf,
        rsync: bool,
        from_store: bool,
    },
    Done(Outcome),
}

fn failed(e: anyhow::Error) -> Step {
    Step::Done(Outcome::Failed {
        why: format!("{e:#}"),
    })
}

/// Runs `phase` on the workers still going and folds each answer into its step.
fn phase<T>(
    steps: &mut [Step],
    ws: &[&Worker],
    run: impl FnOnce(&[&Worker], &[usize]) -> Vec<Result<T>>,
    mut next: impl FnMut(&mut Step, T),
) {
    let going: Vec<usize> = (0..ws.len())
        .filter(|&i| matches!(steps[i], Step::Going { .. }))
        .collect();
    if going.is_empty() {
        return;
    }
    let sub: Vec<&Worker> = going.iter().map(|&i| ws[i]).collect();
    for (i, r) in going.iter().zip(run(&sub, &going)) {
        match r {
            Ok(v) => next(&mut steps[*i], v),
            Err(e) => steps[*i] = failed(e),
        }
    }
}

/// Every chosen worker, in the given order: fdl made present, the place checked, the
/// copy sent into `.incoming-<name>/`, and the worker's fdl installing it. Where the
/// transport reaches hosts one by one, each worker goes through its steps on its own.
pub fn ship_all(
    workers: &[&Worker],
    t: &dyn Transport,
    own: &OwnBinary,
    req: &ShipRequest,
    on_done: &(dyn Fn(&ShipResult) + Sync),
) -> Vec<ShipResult> {
    match t.one_by_one() {
        Some(parallel) => super::in_parallel(
            workers,
            parallel,
            |w| ship_steps(std::slice::from_ref(w), t, own, req).remove(0),
            on_done,
        ),
        None => {
            let results = ship_steps(workers, t, own, req);
            for r in &results {
                on_done(r);
            }
            results
        }
    }
}

/// How a worker whose build store holds the payload gets the build.
const FROM_STORE: &str = "from its build store";

/// A private directory holding copies of the build's manifest and log, what a worker
/// filling the rest from its build store is sent, and their size in bytes.
fn fdl_files_only(dir: &Path) -> Result<(tempfile::TempDir, u64)> {
    let meta = tempfile::Builder::new()
        .prefix("fdl-ship-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let mut bytes = 0;
    for name in [crate::nccl::tree::MANIFEST, crate::nccl::tree::BUILD_LOG] {
        let from = dir.join(name);
        if std::fs::symlink_metadata(&from).is_err() {
            continue;
        }
        let mut file = crate::fsread::open_regular(&from, true)?;
        crate::fswrite::create_new(&meta.path().join(name), &mut file)?;
        bytes += std::fs::metadata(meta.path().join(name))?.len();
    }
    Ok((meta, bytes))
}

/// One phase's call on a group of workers: the workers, their indices, and whether they
/// fill from their store.
type GroupCall<'a, T> = &'a dyn Fn(&[&Worker], &[usize], bool) -> Vec<Result<T>>;

/// Runs `f` once for the workers of `idx` that fill from their store and once for the
/// others (each group only when not empty), and gives the answers back in `idx`'s order.
fn by_store<T>(
    ws: &[&Worker],
    idx: &[usize],
    from_store: &dyn Fn(usize) -> bool,
    f: GroupCall<T>,
) -> Vec<Result<T>> {
    let mut out: Vec<Option<Result<T>>> = (0..idx.len()).map(|_| None).collect();
    for group in [true, false] {
        let at: Vec<usize> = (0..idx.len())
            .filter(|&k| from_store(idx[k]) == group)
            .collect();
        if at.is_empty() {
            continue;
        }
        let sub_ws: Vec<&Worker> = at.iter().map(|&k| ws[k]).collect();
        let sub_idx: Vec<usize> = at.iter().map(|&k| idx[k]).collect();
        for (k, r) in at.into_iter().zip(f(&sub_ws, &sub_idx, group)) {
            out[k] = Some(r);
        }
    }
    out.into_iter()
        .map(|r| r.unwrap_or_else(|| Err(anyhow!("the transport gave no answer for this worker"))))
        .collect()
}

/// Per worker still going, the earlier worker whose copy directory it shares (the same
/// token in it), if any.
fn sharing(steps: &[Step], places: &[Option<String>]) -> Vec<Option<usize>> {
    let mut shares: Vec<Option<usize>> = vec![None; steps.len()];
    for i in 0..steps.len() {
        if !matches!(steps[i], Step::Going { .. }) || places[i].is_none() {
            continue;
        }
        shares[i] = (0..i).find(|&j| {
            shares[j].is_none() && matches!(steps[j], Step::Going { .. }) && places[j] == places[i]
        });
    }
    shares
}

/// The steps of [`ship_all`], each taken by every worker still going.
fn ship_steps(
    workers: &[&Worker],
    t: &dyn Transport,
    own: &OwnBinary,
    req: &ShipRequest,
) -> Vec<ShipResult> {
    let mut steps: Vec<Step> = workers
        .iter()
        .map(|_| Step::Going {
            incoming: PathBuf::new(),
            rsync: false,
            from_store: false,
        })
        .collect();
    // Present is not enough: a cached copy that is not these bytes is replaced.
    phase(
        &mut steps,
        workers,
        |ws, _| {
            ensure_fdl(t, ws, own, req.timeout)
                .into_iter()
                .map(|r| r.map_err(|e| anyhow!("fdl could not be put there: {e:#}")))
                .collect()
        },
        |_, ()| {},
    );
    // `--state=NAME`: one word, so a name starting with `-` is a value, never an option.
    let state_arg = format!("--state={}", req.name);
    let mut ask = vec![state_arg.clone()];
    if let Some((key, _)) = &req.store {
        ask.push(format!("--store-key={key}"));
    }
    phase(
        &mut steps,
        workers,
        |ws, _| receive_all::<StateReport>(t, ws, own, &ask, req.timeout),
        |step, state| {
            let replace = match &state.place {
                Place::Absent => false,
                Place::Build { digest } if *digest == req.digest => {
                    *step = Step::Done(Outcome::AlreadyThere);
                    return;
                }
                Place::Build { .. } | Place::Other { .. } if req.force => true,
                Place::Build { .. } => {
                    *step = Step::Done(Outcome::Refused {
                        why: "a different build of that name is there: --force replaces it".into(),
                    });
                    return;
                }
                Place::Other { why } => {
                    *step = Step::Done(Outcome::Refused {
                        why: format!(
                            "something that is not a build of it is there ({why}): --force replaces it"
                        ),
                    });
                    return;
                }
            };
            let from_store = matches!((&req.store, &state.store),
                (Some((_, ours)), Some(theirs)) if ours == theirs);
            *step = if req.dry_run {
                Step::Done(Outcome::WouldCopy {
                    copy: if from_store {
                        FROM_STORE.to_string()
                    } else {
                        t.tree_method(state.rsync)
                    },
                    from_store,
                    replace,
                })
            } else {
                Step::Going {
                    incoming: PathBuf::new(),
                    rsync: state.rsync,
                    from_store,
                }
            };
        },
    );
    let prepare = [state_arg.clone(), "--prepare".to_string()];
    let mut places: Vec<Option<String>> = vec![None; workers.len()];
    phase(
        &mut steps,
        workers,
        |ws, idx| {
            receive_all::<StateReport>(t, ws, own, &prepare, req.timeout)
                .into_iter()
                .zip(idx)
                .map(|(r, &i)| r.map(|s| (i, s)))
                .collect()
        },
        |step, (i, state)| {
            places[i] = state.token;
            if let Step::Going { incoming, .. } = step {
                *incoming = state.incoming;
            }
        },
    );
    // Workers that see one directory (a shared filesystem, by the token each found
    // there): the first copies and installs, the others take no step until it is done,
    // then look for the build themselves. Two copies into one directory would race.
    let shares = sharing(&steps, &places);
    for (i, rep) in shares.iter().enumerate() {
        if rep.is_some() {
            steps[i] = Step::Done(Outcome::AlreadyThere);
        }
    }
    let mut methods: Vec<String> = vec![String::new(); workers.len()];
    let targets: Vec<(PathBuf, bool, bool)> = steps
        .iter()
        .map(|s| match s {
            Step::Going {
                incoming,
                rsync,
                from_store,
            } => (incoming.clone(), *rsync, *from_store),
            Step::Done(_) => (PathBuf::new(), false, false),
        })
        .collect();
    // What a worker with the payload in its store is sent: fdl's own files of the build.
    let meta = if targets.iter().any(|t| t.2) {
        match fdl_files_only(req.dir) {
            Ok(m) => Some(m),
            Err(e) => {
                let why = format!("{e:#}");
                for (i, step) in steps.iter_mut().enumerate() {
                    if targets[i].2 {
                        *step = Step::Done(Outcome::Failed { why: why.clone() });
                    }
                }
                None
            }
        }
    } else {
        None
    };
    phase(
        &mut steps,
        workers,
        |ws, idx| {
            by_store(ws, idx, &|i| targets[i].2, &|ws, idx, from_store| {
                let hosts: Vec<(&Worker, &Path, bool)> = ws
                    .iter()
                    .zip(idx)
                    .map(|(w, &i)| (*w, targets[i].0.as_path(), targets[i].1))
                    .collect();
                let (from, via) = match (&meta, from_store) {
                    (Some((dir, bytes)), true) => (
                        dir.path(),
                        Some(format!(
                            "{FROM_STORE}; sent only fdl's manifest and log, {bytes} bytes"
                        )),
                    ),
                    _ => (req.dir, None),
                };
                t.send_tree(&hosts, from, req.timeout)
                    .into_iter()
                    .zip(idx)
                    .map(|(r, &i)| r.map(|m| (i, via.clone().unwrap_or(m))))
                    .collect()
            })
        },
        |_, (i, m)| methods[i] = m,
    );
    let mut install = vec![
        format!("--install={}", req.name),
        format!("--digest={}", req.digest),
    ];
    if req.force {
        install.push("--force".into());
    }
    let mut install_from_store = install.clone();
    if let Some((key, _)) = &req.store {
        install_from_store.push(format!("--from-store={key}"));
    }
    phase(
        &mut steps,
        workers,
        |ws, idx| {
            by_store(ws, idx, &|i| targets[i].2, &|ws, idx, from_store| {
                receive_all::<Installed>(
                    t,
                    ws,
                    own,
                    if from_store {
                        &install_from_store
                    } else {
                        &install
                    },
                    req.timeout.max(Duration::from_secs(60)),
                )
                .into_iter()
                .zip(idx)
                .map(|(r, &i)| r.map(|v| (i, v)))
                .collect()
            })
        },
        |step, (i, installed)| {
            *step = Step::Done(Outcome::Installed {
                replaced: installed.replaced,
                copy: methods[i].clone(),
                from_store: targets[i].2,
            })
        },
    );
    let look: Vec<usize> = (0..workers.len())
        .filter(|&i| shares[i].is_some())
        .collect();
    for &i in &look {
        let rep = shares[i].unwrap_or(i);
        if let Step::Done(o) = &steps[rep] {
            if !o.ok() {
                steps[i] = Step::Done(Outcome::Failed {
                    why: format!(
                        "it shares its directory with {} (one filesystem), whose ship failed",
                        workers[rep].host
                    ),
                });
            }
        }
    }
    let look: Vec<usize> = look
        .into_iter()
        .filter(|&i| matches!(&steps[i], Step::Done(o) if o.ok()))
        .collect();
    if !look.is_empty() {
        let ws: Vec<&Worker> = look.iter().map(|&i| workers[i]).collect();
        let states = receive_all::<StateReport>(t, &ws, own, &ask, req.timeout);
        for (&i, state) in look.iter().zip(states) {
            steps[i] = match state {
                Ok(s) if matches!(&s.place, Place::Build { digest } if *digest == req.digest) => {
                    Step::Done(Outcome::AlreadyThere)
                }
                Ok(_) => Step::Done(Outcome::Failed {
                    why: format!(
                        "it shares its directory with {}, which installed the build, but this worker does not see it there",
                        workers[shares[i].unwrap_or(i)].host
                    ),
                }),
                Err(e) => failed(e),
            };
        }
    }
    workers
        .iter()
        .zip(steps)
        .map(|(w, s)| ShipResult {
            host: w.host.clone(),
            target: w.ssh.target.clone(),
            dir: format!(
                "{}/libtorch/nccl/builds/{}",
                w.path.trim_end_matches('/'),
                req.name
            ),
            outcome: match s {
                Step::Done(o) => o,
                Step::Going { .. } => Outcome::Failed {
                    why: "fdl stopped before this worker was done".into(),
                },
            },
        })
        .collect()
}
