//! `fdl launch`: runs a job (torchrun, `python -m torch.distributed.run`, mpirun, srun, a
//! script) in the foreground with a build's `LD_PRELOAD`, and watches that every process
//! of it that maps an NCCL runs that build.
//!
//! The job is fdl's child in a process group of its own, tied to fdl's life
//! ([`crate::process::spawn_job`]); fdl is its subreaper, so a process whose parent ends
//! stays in the tree. SIGINT, SIGTERM and SIGHUP sent to fdl are passed on to that group,
//! as a terminal passes them to its foreground job, and the job's exit status is the
//! answer ([`Status`]). Every few hundred milliseconds fdl lists its descendants (by their
//! parent in `/proc/PID/stat`) and reads those whose mapped files changed with
//! [`running::scan`]: which NCCL files each maps and which one its `nccl*` calls reach.
//! Each is judged against the build ([`Verdict`]): reaching another file than the build's
//! library (by device and inode, or a copy with the manifest's BLAKE3), or an environment
//! whose `LD_PRELOAD` no longer names the build, is a problem, said once with its likely
//! [`Cause`]; with `strict` the job is then stopped. At the end, whatever path it took
//! (the job's own end, a strict stop, an error of fdl), every descendant still there is
//! ended (SIGTERM, then SIGKILL after a grace period) and reaped.
//!
//! All text read from the processes is cleaned ([`crate::text::clean`]) and bounded.

use crate::loader::procmaps;
use crate::loader::running::{self, Evidence, MappedNccl, NcclKind, Process, Rank, Reach};
use anyhow::{Context, Result};
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// At most this many descendants are followed; more are left unread (and still ended).
const MAX_TREE: usize = 4096;
/// At most this many processes are listed from `/proc` to find the descendants.
const MAX_LISTED: usize = 1 << 20;
/// A process whose mapped files did not change is read again after this long (its
/// `nccl*` slots may be bound later, at its first call), then twice as long each time up
/// to [`RECHECK_MAX`].
const RECHECK: Duration = Duration::from_secs(2);
const RECHECK_MAX: Duration = Duration::from_secs(60);
/// The summary names at most this many processes (or ranks) of a kind.
const LISTED: usize = 8;
/// A command as the lines show it, cut to this many columns.
const COMMAND_COLUMNS: usize = 60;
/// What fdl keeps of a command line it reads itself.
const CMDLINE_BYTES: u64 = 4096;

/// The build the job is to run.
#[derive(Debug, Clone)]
pub struct Build {
    pub name: String,
    /// The build's library: its real file, `lib/libnccl.so.X.Y.Z`.
    pub library: PathBuf,
    /// The `LD_PRELOAD` element that names it (the library, or fdl's cache link to it).
    pub preload: PathBuf,
    /// The library's BLAKE3 as the build's manifest records it.
    pub blake3: Option<String>,
    /// More variables to set: those `fdl nccl env` pins to keep plugins loaded.
    pub env: Vec<(String, String)>,
}

impl Build {
    /// The library's `(major, minor, inode)`, as `/proc/PID/maps` names a file.
    fn id(&self) -> Option<(u32, u32, u64)> {
        std::fs::metadata(&self.library)
            .ok()
            .map(|m| (libc::major(m.dev()), libc::minor(m.dev()), m.ino()))
    }

    /// Whether `element` of an `LD_PRELOAD` names the build: the same path as fdl set, or
    /// a file with the library's device and inode.
    fn named_by(&self, element: &str, id: Option<(u32, u32, u64)>) -> bool {
        if Path::new(element) == self.preload || Path::new(element) == self.library {
            return true;
        }
        element.contains('/')
            && std::fs::metadata(element)
                .is_ok_and(|m| Some((libc::major(m.dev()), libc::minor(m.dev()), m.ino())) == id)
    }
}

/// How the job is run and watched.
#[derive(Debug, Clone)]
pub struct Options {
    /// Stop the job at the first process that does not run the build.
    pub strict: bool,
    /// How long the job has between SIGTERM and SIGKILL when fdl ends it.
    pub grace: Duration,
    /// How often the process tree is listed.
    pub poll: Duration,
    /// Do not read the processes' memory (answer by the loader's rules).
    pub no_memory: bool,
    /// fdl's cache directory, where NCCL files' digests are kept by their identity
    /// (`None`: each is hashed when read).
    pub digest_cache: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            strict: false,
            grace: Duration::from_secs(10),
            poll: Duration::from_millis(250),
            digest_cache: None,
            no_memory: false,
        }
    }
}

/// What the supervisor tells as it happens, for the caller to show.
#[derive(Debug)]
pub enum Event<'a> {
    /// The job started as this process (and process group).
    Started { pid: u32 },
    /// A signal fdl received was passed on to the job's process group.
    Forwarded { signal: i32 },
    /// A process's answer is settled and it runs the build (or fdl cannot tell).
    Checked(&'a Check),
    /// A process does not run the build (said once per process).
    Problem(&'a Check),
    /// `strict`: the job is being stopped because of this process.
    Stopping(&'a Check),
    /// The job ended and these descendants were still there: fdl is ending them.
    Ending { left: usize },
}

/// How the job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Exited(i32),
    Signaled(i32),
}

impl Status {
    /// The exit status fdl ends with: the job's, or 128 + the signal that ended it.
    pub fn code(self) -> u8 {
        match self {
            Status::Exited(c) => (c & 0xff) as u8,
            Status::Signaled(s) => (128 + s).min(255) as u8,
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Status::Exited(c) => write!(f, "exited with status {c}"),
            Status::Signaled(s) => write!(f, "was killed by signal {s} ({})", signal_name(*s)),
        }
    }
}

/// `SIGINT` for 2, and the like; `signal N` for others.
pub fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGINT => "SIGINT".into(),
        libc::SIGQUIT => "SIGQUIT".into(),
        libc::SIGABRT => "SIGABRT".into(),
        libc::SIGKILL => "SIGKILL".into(),
        libc::SIGSEGV => "SIGSEGV".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGBUS => "SIGBUS".into(),
        s => format!("signal {s}"),
    }
}

/// One process of the job that maps an NCCL, and what fdl found of it.
#[derive(Debug, Clone)]
pub struct Check {
    pub pid: u32,
    pub ppid: u32,
    pub rank: Option<Rank>,
    /// Its command line, cleaned and cut.
    pub command: String,
    pub verdict: Verdict,
    /// Whether the answer can no longer change: its slots were read from memory, or it is
    /// a problem already.
    pub settled: bool,
}

/// Where a process's `nccl*` calls go, against the build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reached {
    /// The build's library; `copy` when it is another file of the same BLAKE3.
    Build { copy: Option<PathBuf> },
    /// Another NCCL (or a file that is no NCCL and defines `nccl*`).
    Other {
        path: PathBuf,
        version: Option<String>,
        /// NCCL linked into `libtorch_cuda.so`, not a library of its own.
        in_libtorch: bool,
    },
    /// Its bound slots point into different files.
    Split { paths: Vec<PathBuf> },
    /// fdl cannot tell, and why.
    Unknown { reason: String },
}

/// What fdl makes of one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Its calls reach the build, and its `LD_PRELOAD` names it.
    OnBuild {
        copy: Option<PathBuf>,
        /// What the answer rests on, in a few words.
        evidence: String,
    },
    /// It does not run the build: its calls reach another NCCL, or it lost the preload.
    Off {
        reached: Reached,
        evidence: Option<String>,
        /// Its environment has no `LD_PRELOAD` element naming the build.
        preload_lost: bool,
        causes: Vec<Cause>,
    },
    /// fdl cannot tell which NCCL it runs.
    Unknown { reason: String },
}

/// Why a process likely does not run the build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// A launcher between fdl and the process cleans the environment; `by` is the
    /// command fdl saw doing so, when it saw one.
    CleanedEnvironment { by: Option<String> },
    /// The job is started by mpirun, which passes a variable on only when told to.
    Mpirun { program: String },
    /// It runs in another mount namespace than fdl: a container.
    Container,
    /// torch's `__init__` opened a pip wheel's NCCL from `sys.path` before
    /// `libtorch_cuda.so` loaded.
    SysPath { path: PathBuf },
    /// NCCL linked into `libtorch_cuda.so`: a preload does not replace it.
    Static,
}

impl Cause {
    pub fn sentence(&self) -> String {
        match self {
            Cause::CleanedEnvironment { by: Some(by) } => format!(
                "`{by}` cleans the environment of what it starts, LD_PRELOAD included"
            ),
            Cause::CleanedEnvironment { by: None } => "something between fdl and it cleaned the environment: a launcher (`srun --export=NONE`, `env -i`, `sudo`), a container, or the script itself".into(),
            Cause::Mpirun { program } => format!(
                "{program} passes a variable to its ranks only when told: add `-x LD_PRELOAD` (Open MPI) or `-genvlist LD_PRELOAD` (MPICH, Intel MPI)"
            ),
            Cause::Container => "it runs in another mount namespace than fdl (a container): pass LD_PRELOAD in and mount the build at the same path".into(),
            Cause::SysPath { path } => format!(
                "torch's __init__ loaded the pip wheel's NCCL ({}) from sys.path before libtorch_cuda.so, and no preload of the build came first",
                wheel_of(path)
            ),
            Cause::Static => "this torch links NCCL into libtorch_cuda.so, where a preload cannot replace it: use a torch built with a shared NCCL".into(),
        }
    }
}

impl Reached {
    fn words(&self, build: &str) -> String {
        match self {
            Reached::Build { copy: None } => format!("build {build}"),
            Reached::Build { copy: Some(p) } => format!(
                "{}, a copy of build {build}'s library (same BLAKE3)",
                crate::text::shown(p)
            ),
            Reached::Other {
                path,
                version,
                in_libtorch,
            } => {
                let v = version
                    .as_deref()
                    .map(|v| format!("NCCL {}", crate::text::clean(v)))
                    .unwrap_or_else(|| "an NCCL of unknown version".into());
                if *in_libtorch {
                    format!("{v} linked into {}", crate::text::shown(path))
                } else {
                    format!("{v} at {}", crate::text::shown(path))
                }
            }
            Reached::Split { paths } => format!(
                "several files at once ({})",
                paths
                    .iter()
                    .map(crate::text::shown)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Reached::Unknown { reason } => {
                format!("an NCCL fdl cannot name ({})", crate::text::clean(reason))
            }
        }
    }
}

impl Check {
    /// `pid 4242 rank 1 (python -u train.py)`.
    pub fn who(&self) -> String {
        let rank = self
            .rank
            .as_ref()
            .map(|r| format!(" rank {}", r.value))
            .unwrap_or_default();
        format!("pid {}{rank} ({})", self.pid, short_command(&self.command))
    }

    /// One line, whole: who, what it runs instead of the build, and the likely cause.
    pub fn full(&self, build: &str) -> String {
        match &self.verdict {
            Verdict::OnBuild { copy, evidence } => format!(
                "{} runs {} ({evidence})",
                self.who(),
                Reached::Build { copy: copy.clone() }.words(build)
            ),
            Verdict::Unknown { reason } => format!(
                "{}: which NCCL it runs is unknown ({})",
                self.who(),
                crate::text::clean(reason)
            ),
            Verdict::Off {
                reached,
                evidence,
                preload_lost,
                causes,
            } => {
                let mut parts = Vec::new();
                if *preload_lost {
                    parts.push(
                        "it lost LD_PRELOAD (its environment's LD_PRELOAD does not name the build)"
                            .to_string(),
                    );
                }
                let how = evidence
                    .as_deref()
                    .map(|e| format!(", by {e}"))
                    .unwrap_or_default();
                match reached {
                    Reached::Build { copy: None } => {}
                    Reached::Build { copy: Some(p) } => parts.push(format!(
                        "its nccl* calls reach {} (a copy of the build's library: same BLAKE3{how})",
                        crate::text::shown(p)
                    )),
                    r => parts.push(format!("its nccl* calls reach {}{how}", r.words(build))),
                }
                let mut s = format!(
                    "{} does not run build {build}: {}",
                    self.who(),
                    parts.join("; ")
                );
                if !causes.is_empty() {
                    s.push_str(". Likely cause: ");
                    s.push_str(
                        &causes
                            .iter()
                            .map(Cause::sentence)
                            .collect::<Vec<_>>()
                            .join("; "),
                    );
                }
                s
            }
        }
    }

    /// A few words, for the summary: `pid 4242 rank 1: LD_PRELOAD lost, reaches …`.
    pub fn short(&self, build: &str) -> String {
        let rank = self
            .rank
            .as_ref()
            .map(|r| format!(" rank {}", r.value))
            .unwrap_or_default();
        let what = match &self.verdict {
            Verdict::OnBuild { .. } => format!("on build {build}"),
            Verdict::Unknown { .. } => "unknown".into(),
            Verdict::Off {
                reached,
                preload_lost,
                ..
            } => {
                let mut parts = Vec::new();
                if *preload_lost {
                    parts.push("LD_PRELOAD lost".to_string());
                }
                match reached {
                    Reached::Build { copy: None } => {}
                    Reached::Other { path, .. } => {
                        parts.push(format!("reaches {}", crate::text::shown(path)))
                    }
                    Reached::Build { copy: Some(p) } => {
                        parts.push(format!("reaches a copy at {}", crate::text::shown(p)))
                    }
                    Reached::Split { .. } => parts.push("split between NCCLs".into()),
                    Reached::Unknown { .. } => parts.push("reaches an unknown NCCL".into()),
                }
                parts.join(", ")
            }
        };
        format!("pid {}{rank}: {what}", self.pid)
    }

    pub fn is_problem(&self) -> bool {
        matches!(self.verdict, Verdict::Off { .. })
    }
}

/// How the job went.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub status: Status,
    /// The last answer for every process of the job that mapped an NCCL, by pid.
    pub checks: Vec<Check>,
    /// The pids of [`Outcome::checks`] counted as workers (see [`workers`]).
    pub workers: Vec<u32>,
    /// Processes of the job that could not be read (another user's), with why.
    pub unread: Vec<(u32, String)>,
    /// `strict`: the job was stopped because of this process.
    pub stopped: Option<Check>,
    /// The signals passed on to the job.
    pub forwarded: Vec<i32>,
    /// Descendants fdl had to end after the job's own process was gone.
    pub ended: usize,
}

impl Outcome {
    /// The exit status fdl ends with: the job's own (128 + a signal), or 1 after a strict
    /// stop.
    pub fn code(&self) -> u8 {
        if self.stopped.is_some() {
            return 1;
        }
        self.status.code()
    }

    /// One line: how many workers were checked, and whether all run the build (and
    /// which processes could not be read).
    pub fn summary(&self, build: &str) -> String {
        let mut line = self.checked(build);
        if !self.unread.is_empty() {
            let list: Vec<String> = self
                .unread
                .iter()
                .map(|(pid, why)| format!("pid {pid}: {why}"))
                .collect();
            line.push_str(&format!(
                "; {} process{} of the job could not be read ({})",
                list.len(),
                if list.len() == 1 { "" } else { "es" },
                some(&list, "; ")
            ));
        }
        line
    }

    fn checked(&self, build: &str) -> String {
        let workers: Vec<&Check> = self
            .checks
            .iter()
            .filter(|c| self.workers.contains(&c.pid))
            .collect();
        if workers.is_empty() && !self.checks.iter().any(Check::is_problem) {
            return "fdl launch: no worker that maps an NCCL was seen: the job ended before fdl looked, runs no NCCL, or starts its workers outside fdl's process tree (srun's tasks are slurmd's: run `srun fdl launch -- …` instead)".into();
        }
        let n = workers.len();
        let ranks: Vec<String> = workers
            .iter()
            .filter_map(|c| c.rank.as_ref().map(|r| r.value.to_string()))
            .collect();
        let ranks = if ranks.len() == n && n > 0 {
            format!(
                " (rank{} {})",
                if n == 1 { "" } else { "s" },
                ranks.join(", ")
            )
        } else {
            String::new()
        };
        let on = workers
            .iter()
            .filter(|c| matches!(c.verdict, Verdict::OnBuild { .. }))
            .count();
        let unknown = workers
            .iter()
            .filter(|c| matches!(c.verdict, Verdict::Unknown { .. }))
            .count();
        let off: Vec<String> = workers
            .iter()
            .filter(|c| c.is_problem())
            .map(|c| c.short(build))
            .collect();
        let others: Vec<String> = self
            .checks
            .iter()
            .filter(|c| c.is_problem() && !self.workers.contains(&c.pid))
            .map(|c| c.short(build))
            .collect();
        let head = format!(
            "fdl launch: {n} worker{} checked{ranks}",
            if n == 1 { "" } else { "s" }
        );
        let also = if others.is_empty() {
            String::new()
        } else {
            format!(
                "; {} other process{} that map{} an NCCL, not on it either ({})",
                others.len(),
                if others.len() == 1 { "" } else { "es" },
                if others.len() == 1 { "s" } else { "" },
                some(&others, "; ")
            )
        };
        if off.is_empty() && unknown == 0 {
            let all = if n == 0 { "none" } else { "all" };
            return format!("{head}: {all} on build {build}{also}");
        }
        let mut parts = vec![format!("{on} on build {build}")];
        if unknown > 0 {
            parts.push(format!("{unknown} unknown"));
        }
        if !off.is_empty() {
            parts.push(format!("{} NOT on it ({})", off.len(), some(&off, "; ")));
        }
        format!("{head}: {}{also}", parts.join(", "))
    }
}

/// At most [`LISTED`] of `items` joined by `sep`, and how many more.
fn some(items: &[String], sep: &str) -> String {
    let mut s = items[..items.len().min(LISTED)].join(sep);
    if items.len() > LISTED {
        s.push_str(&format!("{sep}and {} more", items.len() - LISTED));
    }
    s
}

/// The processes counted as workers: those with a rank whose parent is not one of the
/// same rank (a worker's own helpers, forked data loaders, carry its rank); with no rank
/// anywhere, those whose answer was read from memory whose parent's was not. A launcher
/// (torchrun's agent, mpirun) that maps an NCCL itself is checked but not counted.
pub fn workers(checks: &[Check]) -> Vec<u32> {
    let by_pid: HashMap<u32, &Check> = checks.iter().map(|c| (c.pid, c)).collect();
    let ranked = checks.iter().any(|c| c.rank.is_some());
    let candidate = |c: &Check| {
        if ranked {
            c.rank.is_some()
        } else {
            c.settled
        }
    };
    checks
        .iter()
        .filter(|c| candidate(c))
        .filter(|c| match by_pid.get(&c.ppid) {
            Some(p) if candidate(p) => {
                ranked && p.rank.as_ref().map(|r| r.value) != c.rank.as_ref().map(|r| r.value)
            }
            _ => true,
        })
        .map(|c| c.pid)
        .collect()
}

/// Runs `command` with the build preloaded and watches it to its end; `on` is told what
/// happens as it happens. Errors only when the job cannot be started; once it runs, its
/// end is the answer.
pub fn run(
    command: &[OsString],
    build: &Build,
    opts: &Options,
    on: &mut dyn FnMut(Event<'_>),
) -> Result<Outcome> {
    let Some((program, args)) = command.split_first() else {
        anyhow::bail!("no command to run: give one after `--`, as in `fdl launch -- torchrun --nproc-per-node 2 train.py`");
    };
    let preload = build.preload.to_str().with_context(|| {
        format!(
            "{} is not valid UTF-8, so it cannot be an LD_PRELOAD element",
            crate::text::shown(&build.preload)
        )
    })?;
    let mut value = OsString::from(preload);
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        value.push(":");
        value.push(old);
    }
    let mut cmd = Command::new(program);
    cmd.args(args).env("LD_PRELOAD", &value);
    for (k, v) in &build.env {
        cmd.env(k, v);
    }
    // Caught before the job starts, so that its watchdog (forked now) inherits a handler
    // that keeps it alive when the job's group is signalled.
    let signals = crate::process::ForwardSignals::install()
        .context("cannot catch SIGINT, SIGTERM and SIGHUP to pass them on")?;
    let (child, watchdog) = crate::process::spawn_job(&mut cmd).with_context(|| {
        format!(
            "cannot start {}",
            crate::text::clean(&program.to_string_lossy())
        )
    })?;
    let mut job = Job {
        pgid: child.id(),
        child,
        watchdog_pid: watchdog.pid(),
        _watchdog: watchdog,
        status: None,
    };
    on(Event::Started { pid: job.pgid });
    let mut watch = Watch::new(build, opts, job.watchdog_pid, command);
    let mut forwarded = Vec::new();
    let mut stopped: Option<Check> = None;
    let mut next_poll = Instant::now() + Duration::from_millis(50);
    let status = loop {
        for sig in signals.take() {
            // SAFETY: signalling the job's own process group.
            unsafe { libc::kill(-(job.pgid as libc::pid_t), sig) };
            forwarded.push(sig);
            on(Event::Forwarded { signal: sig });
        }
        if let Some(st) = job.child.try_wait().context("cannot wait for the job")? {
            break st;
        }
        if Instant::now() >= next_poll {
            let (found, settled) = watch.poll();
            for c in &settled {
                on(Event::Checked(c));
            }
            for c in &found {
                on(Event::Problem(c));
            }
            if opts.strict {
                if let Some(first) = found.into_iter().next() {
                    on(Event::Stopping(&first));
                    stopped = Some(first);
                    let st = job.end(opts.grace, &mut |_| {});
                    break st;
                }
            }
            next_poll = Instant::now() + opts.poll;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    job.status = Some(status);
    // What the job left behind: ended, and reaped.
    let mut ended = 0;
    if stopped.is_none() {
        job.end(opts.grace, &mut |left| {
            ended = left;
            on(Event::Ending { left });
        });
    }
    let status = match (status.code(), status.signal()) {
        (Some(c), _) => Status::Exited(c),
        (None, Some(s)) => Status::Signaled(s),
        (None, None) => Status::Exited(1),
    };
    // Signals that came after the job's end have nothing to go to.
    drop(signals);
    let checks: Vec<Check> = watch.checks.into_values().collect();
    Ok(Outcome {
        status,
        workers: workers(&checks),
        checks,
        unread: watch.refused.into_iter().collect(),
        stopped,
        forwarded,
        ended,
    })
}

/// The running job: its process (the leader of its group), and what ends it.
struct Job {
    child: Child,
    pgid: u32,
    watchdog_pid: u32,
    _watchdog: crate::process::Watchdog,
    status: Option<std::process::ExitStatus>,
}

impl Job {
    /// Ends the job's group and every descendant of fdl still alive: SIGTERM, up to
    /// `grace` for them to go, then SIGKILL; reaps what ends. `left` is told how many
    /// descendants there were (only when there were). Returns the job's exit status.
    fn end(&mut self, grace: Duration, left: &mut dyn FnMut(usize)) -> std::process::ExitStatus {
        let me = std::process::id();
        let alive = |this: &mut Job| -> Vec<u32> {
            this.reap();
            descendants(me, this.watchdog_pid)
                .into_iter()
                .filter(|p| !p.zombie)
                .map(|p| p.pid)
                .collect()
        };
        let first = alive(self);
        if !first.is_empty() {
            left(first.len());
        }
        let leader_gone = self.status.is_some();
        if first.is_empty() && leader_gone {
            return self.status.expect("checked");
        }
        self.signal_all(libc::SIGTERM, &first);
        let deadline = Instant::now() + grace;
        loop {
            let now = alive(self);
            if now.is_empty() && self.status.is_some() {
                break;
            }
            if Instant::now() >= deadline {
                self.signal_all(libc::SIGKILL, &now);
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // After SIGKILL: what is left goes within moments; reap it.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let now = alive(self);
            if now.is_empty() && self.status.is_some() {
                break;
            }
            self.signal_all(libc::SIGKILL, &now);
            std::thread::sleep(Duration::from_millis(20));
        }
        self.status.unwrap_or_else(|| {
            let _ = self.child.kill();
            self.child
                .wait()
                .unwrap_or_else(|_| std::process::ExitStatus::from_raw(libc::SIGKILL))
        })
    }

    fn signal_all(&mut self, sig: libc::c_int, pids: &[u32]) {
        // SAFETY: the job's own group; each pid was just seen as a descendant of fdl
        // (which, as their subreaper, they cannot leave), so no id is a stranger's.
        unsafe {
            libc::kill(-(self.pgid as libc::pid_t), sig);
            for &p in pids {
                libc::kill(p as libc::pid_t, sig);
            }
        }
    }

    /// Reaps the job's process and any descendant re-parented to fdl that has ended.
    fn reap(&mut self) {
        if self.status.is_none() {
            if let Ok(Some(st)) = self.child.try_wait() {
                self.status = Some(st);
            }
        }
        let me = std::process::id();
        for p in descendants(me, self.watchdog_pid) {
            if p.zombie && p.ppid == me && p.pid != self.pgid {
                // SAFETY: a child of fdl that has ended; reaping it frees its slot.
                unsafe { libc::waitpid(p.pid as libc::pid_t, std::ptr::null_mut(), libc::WNOHANG) };
            }
        }
    }
}

impl Drop for Job {
    /// On every path out (an error of fdl, a panic) nothing of the job is left running.
    fn drop(&mut self) {
        if self.status.is_none() || !descendants(std::process::id(), self.watchdog_pid).is_empty() {
            self.end(Duration::from_millis(500), &mut |_| {});
        }
    }
}

/// One process of fdl's tree.
#[derive(Debug, Clone, Copy)]
struct Member {
    pid: u32,
    ppid: u32,
    zombie: bool,
}

/// `(ppid, zombie)` of a process, from `/proc/PID/stat`.
fn stat_of(pid: u32) -> Option<(u32, bool)> {
    use std::io::Read;
    let mut b = Vec::new();
    std::fs::File::open(format!("/proc/{pid}/stat"))
        .ok()?
        .take(4096)
        .read_to_end(&mut b)
        .ok()?;
    let stat = running::parse_stat(&b)?;
    Some((stat.ppid, stat.zombie()))
}

/// Every descendant of `root` but `skip` (and its own), breadth first, bounded.
fn descendants(root: u32, skip: u32) -> Vec<Member> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut children: HashMap<u32, Vec<Member>> = HashMap::new();
    for e in rd.take(MAX_LISTED).flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Some((ppid, zombie)) = stat_of(pid) {
            children
                .entry(ppid)
                .or_default()
                .push(Member { pid, ppid, zombie });
        }
    }
    let mut out = Vec::new();
    let mut queue = std::collections::VecDeque::from([root]);
    while let Some(p) = queue.pop_front() {
        for m in children.get(&p).into_iter().flatten() {
            if m.pid == skip || m.pid == root {
                continue;
            }
            if out.len() >= MAX_TREE {
                return out;
            }
            out.push(*m);
            queue.push_back(m.pid);
        }
    }
    out
}

/// What fdl knows of the job's processes between polls.
struct Watch<'a> {
    build: &'a Build,
    build_id: Option<(u32, u32, u64)>,
    no_memory: bool,
    digest_cache: Option<PathBuf>,
    skip: u32,
    /// The job's program name (`mpirun`), for the cause.
    program: String,
    /// The job's command line as given, cleaned.
    job_command: String,
    /// The files each process mapped when last read, when that was, and how long until
    /// it is read again if they do not change.
    seen: HashMap<u32, (u64, Instant, Duration)>,
    /// The command each process had when first seen (an `env -i` that then execs).
    first_command: HashMap<u32, (u32, String)>,
    checks: BTreeMap<u32, Check>,
    /// The command line each settled process had when its answer settled.
    settled_as: HashMap<u32, String>,
    /// Processes `/proc` would not show (another user's), and why.
    refused: BTreeMap<u32, String>,
    my_mount_ns: Option<PathBuf>,
}

impl<'a> Watch<'a> {
    fn new(build: &'a Build, opts: &Options, skip: u32, command: &[OsString]) -> Watch<'a> {
        Watch {
            build,
            build_id: build.id(),
            no_memory: opts.no_memory,
            digest_cache: opts.digest_cache.clone(),
            skip,
            program: command
                .first()
                .map(|p| {
                    crate::text::clean(&Path::new(p).file_name().unwrap_or(p).to_string_lossy())
                })
                .unwrap_or_default(),
            job_command: command
                .iter()
                .map(|a| crate::text::clean(&a.to_string_lossy()))
                .collect::<Vec<_>>()
                .join(" "),
            seen: HashMap::new(),
            first_command: HashMap::new(),
            checks: BTreeMap::new(),
            settled_as: HashMap::new(),
            refused: BTreeMap::new(),
            my_mount_ns: std::fs::read_link("/proc/self/ns/mnt").ok(),
        }
    }

    /// Lists the tree, reads what changed, and returns the problems found this time
    /// (each process's first) and the other answers that settled.
    fn poll(&mut self) -> (Vec<Check>, Vec<Check>) {
        let now = Instant::now();
        let tree = descendants(std::process::id(), self.skip);
        let mut ask = Vec::new();
        let mut asked_as = HashMap::new();
        for m in tree.iter().filter(|m| !m.zombie) {
            self.first_command
                .entry(m.pid)
                .or_insert_with(|| (m.ppid, read_command(m.pid)));
            // A settled answer holds until the process execs: a launcher's fork is seen
            // before it becomes a worker (same pid, its rank only after the exec).
            if self.checks.get(&m.pid).is_some_and(|c| c.settled) {
                let now_running = read_command(m.pid);
                if self.settled_as.get(&m.pid) == Some(&now_running) || now_running.is_empty() {
                    continue;
                }
                self.checks.remove(&m.pid);
                self.seen.remove(&m.pid);
            }
            // Read again only when its files changed (an import, an exec), or now and
            // then for slots bound at a first call.
            let (print, maps_nccl) = match files_print(m.pid) {
                Ok(p) => p,
                Err(e) => {
                    if matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM)) {
                        self.refused.insert(
                            m.pid,
                            format!(
                                "/proc refuses its maps ({e}): another user's process (sudo, a setuid launcher)"
                            ),
                        );
                    }
                    continue;
                }
            };
            let wait = match self.seen.get(&m.pid) {
                Some((p, at, wait)) if *p == print => {
                    if now.duration_since(*at) < *wait {
                        continue;
                    }
                    (*wait * 2).min(RECHECK_MAX)
                }
                _ => RECHECK,
            };
            self.seen.insert(m.pid, (print, now, wait));
            if maps_nccl {
                ask.push(m.pid);
                // Read before the scan: an exec during the scan then shows as a change.
                asked_as.insert(m.pid, read_command(m.pid));
            }
        }
        if ask.is_empty() {
            return (Vec::new(), Vec::new());
        }
        let scan = running::scan(&running::Options {
            pids: Some(ask),
            no_memory: self.no_memory,
            digest_cache: self.digest_cache.clone(),
        });
        for r in scan.refused {
            // Refused because it ended while read: nothing to say of it.
            if stat_of(r.pid).is_some_and(|(_, zombie)| !zombie) {
                self.refused.insert(r.pid, crate::text::clean(&r.reason));
            }
        }
        let (mut found, mut settled) = (Vec::new(), Vec::new());
        for p in scan.processes {
            self.refused.remove(&p.pid);
            let Some(check) = self.judge(&p) else {
                continue;
            };
            let was_problem = self.checks.get(&p.pid).is_some_and(Check::is_problem);
            if check.is_problem() && !was_problem {
                found.push(check.clone());
            } else if check.settled && !check.is_problem() {
                settled.push(check.clone());
            }
            if check.settled {
                if let Some(command) = asked_as.remove(&p.pid) {
                    self.settled_as.insert(p.pid, command);
                }
            }
            self.checks.insert(p.pid, check);
        }
        (found, settled)
    }

    /// The verdict on one process read by the scan; `None` when it maps no NCCL.
    fn judge(&self, p: &Process) -> Option<Check> {
        let id = self.build_id;
        let is_build = |n: &MappedNccl| -> Option<Option<PathBuf>> {
            if id == Some(n.id) {
                return Some(None);
            }
            match (&n.blake3, &self.build.blake3) {
                (Some(a), Some(b)) if a == b => Some(Some(n.path.clone())),
                _ => None,
            }
        };
        if p.nccl.is_empty() {
            return None;
        }
        let build_mapped = p.nccl.iter().any(|n| is_build(n).is_some());
        let preload_lost = p.environment_unread.is_none()
            && !p.ld_preload.as_deref().is_some_and(|v| {
                crate::loader::preload::split_ld_preload(v)
                    .iter()
                    .any(|e| self.build.named_by(&e.name, id))
            });
        let (reached, evidence, from_memory) = match &p.reach {
            Reach::One { target, evidence } => {
                let memory = matches!(evidence, Evidence::Memory { .. });
                let r = match target.nccl.map(|i| &p.nccl[i]) {
                    Some(n) => match is_build(n) {
                        Some(copy) => Reached::Build { copy },
                        None => Reached::Other {
                            path: n.path.clone(),
                            version: n.version.clone(),
                            in_libtorch: n.kind == NcclKind::InLibtorch,
                        },
                    },
                    None => Reached::Other {
                        path: target.path.clone(),
                        version: None,
                        in_libtorch: false,
                    },
                };
                (r, Some(evidence.short()), memory)
            }
            Reach::Split { targets, evidence } => {
                let all_build = targets.iter().all(|s| {
                    let t = &s.target;
                    t.nccl
                        .is_some_and(|i| is_build(&p.nccl[i]).is_some_and(|c| c.is_none()))
                });
                let r = if all_build {
                    Reached::Build { copy: None }
                } else {
                    Reached::Split {
                        paths: targets.iter().map(|s| s.target.path.clone()).collect(),
                    }
                };
                (r, Some(evidence.short()), true)
            }
            Reach::Unknown { reason } => (
                Reached::Unknown {
                    reason: reason.clone(),
                },
                None,
                false,
            ),
            Reach::NoNccl => return None,
        };
        let off_target = match &reached {
            Reached::Other { .. } | Reached::Split { .. } => true,
            // A copy reached without the preload: the loader found it elsewhere.
            Reached::Build { copy: Some(_) } => preload_lost,
            Reached::Build { copy: None } | Reached::Unknown { .. } => false,
        };
        // Another NCCL answered by the loader's rules while the build is mapped too may
        // still change (its slots not bound yet): wait for memory.
        let off_settled = from_memory || !build_mapped || preload_lost;
        let verdict = if preload_lost || (off_target && off_settled) {
            Verdict::Off {
                causes: self.causes(p, &reached, preload_lost),
                reached,
                evidence,
                preload_lost,
            }
        } else {
            match reached {
                Reached::Build { copy } => Verdict::OnBuild {
                    copy,
                    evidence: evidence.unwrap_or_default(),
                },
                Reached::Unknown { reason } => Verdict::Unknown { reason },
                other => Verdict::Unknown {
                    reason: format!(
                        "{} so far, by the loader's rules; its slots are not bound yet",
                        other.words(&self.build.name)
                    ),
                },
            }
        };
        // Slots read from memory settle the answer once they are a caller's of its own:
        // an NCCL's calls to itself are bound from the start (a preloaded build's in a
        // shell, a Python not yet importing torch), before the object that matters loads.
        let callers_own = matches!(
            p.reach.evidence(),
            Some(Evidence::Memory { caller, .. })
                if caller.file_name().is_some_and(|n| !n.to_string_lossy().starts_with("libnccl"))
        );
        // Without memory the loader's rules are the answer: a preload of the build comes
        // first in the global scope whatever loads later.
        let by_preload = matches!(
            p.reach.evidence(),
            Some(Evidence::Model {
                rule: running::Rule::Preloaded { .. },
                ..
            })
        );
        let settled = matches!(verdict, Verdict::Off { .. })
            || (from_memory && callers_own)
            || (self.no_memory && by_preload && matches!(verdict, Verdict::OnBuild { .. }));
        Some(Check {
            pid: p.pid,
            ppid: p.ppid,
            rank: p.rank.clone(),
            command: p.command.clone(),
            verdict,
            settled,
        })
    }

    /// The likely causes of a process not running the build.
    fn causes(&self, p: &Process, reached: &Reached, preload_lost: bool) -> Vec<Cause> {
        let mut out = Vec::new();
        if preload_lost {
            if matches!(
                self.program.as_str(),
                "mpirun" | "mpiexec" | "orterun" | "prterun"
            ) {
                out.push(Cause::Mpirun {
                    program: self.program.clone(),
                });
            }
            if let Some(by) = self.cleaner_above(p.pid) {
                out.push(Cause::CleanedEnvironment { by: Some(by) });
            }
            let ns = std::fs::read_link(format!("/proc/{}/ns/mnt", p.pid)).ok();
            if ns.is_some() && self.my_mount_ns.is_some() && ns != self.my_mount_ns {
                out.push(Cause::Container);
            }
            if out.is_empty() {
                out.push(Cause::CleanedEnvironment { by: None });
            }
        }
        let path = match reached {
            Reached::Other { path, .. } | Reached::Build { copy: Some(path) } => Some(path),
            _ => None,
        };
        if let Some(path) = path {
            if is_wheel_nccl(path) {
                out.push(Cause::SysPath { path: path.clone() });
            }
        }
        if matches!(
            reached,
            Reached::Other {
                in_libtorch: true,
                ..
            }
        ) {
            out.push(Cause::Static);
        }
        out
    }

    /// The first command from `pid` up to the job's own that cleans an environment:
    /// `env -i`, `env -u LD_PRELOAD`, `srun --export=…` without ALL, as each was first
    /// seen (a launcher that execs its child keeps its pid).
    fn cleaner_above(&self, pid: u32) -> Option<String> {
        if cleans_environment(&self.job_command) {
            return Some(short_command(&self.job_command));
        }
        let mut at = pid;
        for _ in 0..64 {
            let (ppid, command) = self.first_command.get(&at)?;
            if cleans_environment(command) {
                return Some(short_command(command));
            }
            if *ppid == std::process::id() {
                return None;
            }
            at = *ppid;
        }
        None
    }
}

/// A command line as the lines show it: its program's file name and its arguments,
/// cut to a few dozen columns (`python -u train.py`).
pub fn short_command(command: &str) -> String {
    let (program, rest) = command.split_once(' ').unwrap_or((command, ""));
    let program = program.rsplit('/').next().unwrap_or(program);
    let whole = if rest.is_empty() {
        program.to_string()
    } else {
        format!("{program} {rest}")
    };
    crate::text::fit(&whole, COMMAND_COLUMNS).0
}

/// Whether a command line (words joined by spaces) starts a program with a cleaned
/// environment: `env -i|--ignore-environment|-u LD_PRELOAD|--unset=LD_PRELOAD`, or
/// `srun` (or `sbatch`) with an `--export` that does not pass ALL.
pub fn cleans_environment(command: &str) -> bool {
    let words: Vec<&str> = command.split(' ').collect();
    let base = |w: &str| w.rsplit('/').next().unwrap_or(w).to_string();
    for (i, w) in words.iter().enumerate() {
        match base(w).as_str() {
            "env" => {
                // Its options and NAME=VALUE words, up to the program it runs.
                let mut rest = words[i + 1..].iter();
                while let Some(a) = rest.next() {
                    match *a {
                        "-i"
                        | "--ignore-environment"
                        | "-"
                        | "--unset=LD_PRELOAD"
                        | "-uLD_PRELOAD" => return true,
                        "-u" | "--unset" => {
                            if rest.next() == Some(&"LD_PRELOAD") {
                                return true;
                            }
                        }
                        "--" => break,
                        a if a.starts_with("--") || a.contains('=') => {}
                        // Short options run together (`-iv`).
                        a if a.starts_with('-') => {
                            if a[1..].starts_with('u') {
                                continue;
                            }
                            if a.contains('i') {
                                return true;
                            }
                        }
                        _ => break,
                    }
                }
            }
            "srun" | "sbatch" | "salloc" => {
                let rest = &words[i + 1..];
                let export = rest.iter().enumerate().find_map(|(j, a)| {
                    a.strip_prefix("--export=").map(str::to_string).or_else(|| {
                        (*a == "--export")
                            .then(|| rest.get(j + 1).map(|s| s.to_string()))
                            .flatten()
                    })
                });
                if export.is_some_and(|e| !e.split(',').any(|x| x == "ALL")) {
                    return true;
                }
            }
            _ => {}
        }
    }
    false
}

/// `site-packages/nvidia/nccl`, the part of a wheel NCCL's path that says what it is.
fn wheel_of(path: &Path) -> String {
    let shown = crate::text::shown(path);
    shown
        .rfind("-packages/nvidia/nccl")
        .and_then(|i| shown[..i].rfind('/').map(|j| shown[j + 1..].to_string()))
        .unwrap_or(shown)
}

/// Whether a path is a pip wheel's NCCL: `…/site-packages/nvidia/nccl/lib/…` (or
/// `dist-packages`), where torch's `__init__` finds it on `sys.path`.
pub fn is_wheel_nccl(path: &Path) -> bool {
    let parts: Vec<String> = path
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    parts.windows(4).any(|w| {
        (w[0] == "site-packages" || w[0] == "dist-packages")
            && w[1] == "nvidia"
            && w[2] == "nccl"
            && w[3] == "lib"
    })
}

/// The command line of a process, cleaned and cut (empty when unreadable).
fn read_command(pid: u32) -> String {
    use std::io::Read;
    let mut b = Vec::new();
    if std::fs::File::open(format!("/proc/{pid}/cmdline"))
        .and_then(|f| f.take(CMDLINE_BYTES).read_to_end(&mut b))
        .is_err()
    {
        return String::new();
    }
    b.split(|&c| c == 0)
        .filter(|a| !a.is_empty())
        .map(|a| crate::text::clean(&String::from_utf8_lossy(a)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A digest of the set of files a process maps (changes with an exec, an import), and
/// whether one of them may hold an NCCL (the names [`running::scan`] reads as one).
fn files_print(pid: u32) -> std::io::Result<(u64, bool)> {
    use std::hash::{Hash, Hasher};
    use std::io::Read;
    let mut b = Vec::new();
    std::fs::File::open(format!("/proc/{pid}/maps"))?
        .take(16 << 20)
        .read_to_end(&mut b)?;
    let maps = procmaps::parse_maps(&b);
    let mut ids: Vec<((u32, u32), u64)> = maps
        .iter()
        .filter(|m| m.inode != 0)
        .map(|m| (m.dev, m.inode))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    ids.hash(&mut h);
    let nccl = maps
        .iter()
        .filter_map(|m| m.path.as_deref().and_then(Path::file_name))
        .any(|n| running::may_hold_nccl(std::os::unix::ffi::OsStrExt::as_bytes(n)));
    Ok((h.finish(), nccl))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launchers_that_clean_the_environment_are_recognised() {
        for yes in [
            "env -i python train.py",
            "/usr/bin/env -u LD_PRELOAD python -m torch.distributed.run x.py",
            "env --unset=LD_PRELOAD python",
            "srun --export=NONE python train.py",
            "srun --export NIL,FOO python",
            "env -iv A=1 python",
            "env A=1 -u LD_PRELOAD python",
        ] {
            assert!(cleans_environment(yes), "{yes}");
        }
        for no in [
            "env FOO=1 python",
            "env -u OTHER python",
            "env A=1 python -i script.py",
            "env -u OTHER python -u x.py",
            "srun --export=ALL,FOO=1 python",
            "srun python",
            "python train.py",
        ] {
            assert!(!cleans_environment(no), "{no}");
        }
    }

    #[test]
    fn a_wheel_nccl_is_told_by_its_place() {
        assert!(is_wheel_nccl(Path::new(
            "/v/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"
        )));
        assert!(!is_wheel_nccl(Path::new(
            "/p/libtorch/nccl/builds/v2.30.7-sm86/lib/libnccl.so.2.30.7"
        )));
    }

    fn check(pid: u32, ppid: u32, rank: Option<u64>, verdict: Verdict, settled: bool) -> Check {
        Check {
            pid,
            ppid,
            rank: rank.map(|value| Rank {
                variable: "RANK",
                value,
            }),
            command: "python -u train.py".into(),
            verdict,
            settled,
        }
    }

    fn on() -> Verdict {
        Verdict::OnBuild {
            copy: None,
            evidence: "its GOT".into(),
        }
    }

    #[test]
    fn workers_are_the_ranked_processes_not_their_helpers_nor_the_launcher() {
        let checks = vec![
            check(10, 1, None, on(), true),
            check(11, 10, Some(0), on(), true),
            check(12, 10, Some(1), on(), true),
            check(13, 12, Some(1), on(), true),
        ];
        assert_eq!(workers(&checks), vec![11, 12]);
        // No ranks: those read from memory, not their forked children.
        let checks = vec![
            check(10, 1, None, on(), false),
            check(11, 10, None, on(), true),
            check(12, 11, None, on(), true),
        ];
        assert_eq!(workers(&checks), vec![11]);
    }

    #[test]
    fn a_problem_is_one_line_with_pid_rank_command_and_cause_and_a_short_form() {
        let c = check(
            4242,
            10,
            Some(1),
            Verdict::Off {
                reached: Reached::Other {
                    path: "/v/site-packages/nvidia/nccl/lib/libnccl.so.2".into(),
                    version: Some("2.30.7".into()),
                    in_libtorch: false,
                },
                evidence: Some("its GOT".into()),
                preload_lost: true,
                causes: vec![
                    Cause::CleanedEnvironment {
                        by: Some("env -u LD_PRELOAD python".into()),
                    },
                    Cause::SysPath {
                        path: "/v/site-packages/nvidia/nccl/lib/libnccl.so.2".into(),
                    },
                ],
            },
            true,
        );
        let full = c.full("v2.30.7-sm86");
        assert!(!full.contains('\n'));
        for want in [
            "pid 4242 rank 1 (python -u train.py) does not run build v2.30.7-sm86",
            "NCCL 2.30.7 at /v/site-packages/nvidia/nccl/lib/libnccl.so.2",
            "it lost LD_PRELOAD",
            "`env -u LD_PRELOAD python` cleans the environment",
            "sys.path",
        ] {
            assert!(full.contains(want), "{want}: {full}");
        }
        assert_eq!(
            c.short("b"),
            "pid 4242 rank 1: LD_PRELOAD lost, reaches /v/site-packages/nvidia/nccl/lib/libnccl.so.2"
        );
        let outcome = Outcome {
            status: Status::Exited(0),
            checks: vec![check(1, 0, Some(0), on(), true), c],
            workers: vec![1, 4242],
            unread: vec![],
            stopped: None,
            forwarded: vec![],
            ended: 0,
        };
        let mut unread = outcome.clone();
        unread.unread = vec![(77, "/proc refuses its maps".into())];
        assert!(
            unread.summary("b").ends_with(
                "; 1 process of the job could not be read (pid 77: /proc refuses its maps)"
            ),
            "{}",
            unread.summary("b")
        );
        let s = outcome.summary("b");
        assert!(
            s.starts_with("fdl launch: 2 workers checked (ranks 0, 1): 1 on build b, 1 NOT on it (pid 4242 rank 1"),
            "{s}"
        );
    }

    #[test]
    fn an_exit_status_is_kept_and_a_signal_is_128_plus_it() {
        assert_eq!(Status::Exited(7).code(), 7);
        assert_eq!(Status::Signaled(libc::SIGINT).code(), 130);
        assert_eq!(Status::Signaled(libc::SIGKILL).code(), 137);
    }
}
