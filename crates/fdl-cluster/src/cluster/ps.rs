//! `fdl cluster ps`: which NCCL each rank of a running job runs, asked of every worker
//! (its own `cluster ps-self`, the scan of [`crate::loader::running`]), and whether the
//! ranks agree: one NCCL version and one file (its BLAKE3) everywhere, the project's
//! chosen build where it has one, the same plugins, no rank number twice, and every
//! process's answer known. `NCCL_*` settings that differ across ranks are named.
//!
//! A worker's answer is hostile: it is read from JSON of bounded size (the transport's
//! cap), every list is cut at a bound, and every string is cleaned and cut when it is
//! read, so nothing a worker says reaches the terminal or the JSON output raw.

use super::config::Worker;
use super::status::{self, OwnBinary};
use super::transport::Transport;
use crate::nccl::files::FileEntry;
use crate::text::{clean, fit};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// The schema of a worker's `cluster ps-self --json` answer.
pub const PS_SCHEMA: u32 = 1;
/// What a worker's answer says it is, beside its schema.
pub const PS_KIND: &str = "cluster-ps-worker";

/// Bounds on what one worker's answer may hold; more is cut, and the cut is said.
const MAX_PROCESSES: usize = 4096;
const MAX_REFUSED: usize = 256;
const MAX_NCCL: usize = 16;
const MAX_PLUGINS: usize = 64;
const MAX_KINDS: usize = 16;
const MAX_SETTINGS: usize = 256;
/// Characters kept of a command line, of a path, and of any other string.
const COMMAND_CHARS: usize = 1024;
const PATH_CHARS: usize = 1024;
const WORD_CHARS: usize = 512;

/// A string from a worker: cleaned, then cut.
fn tame(s: &str, max: usize) -> String {
    fit(&clean(s), max).0
}

fn tame_opt(s: &Option<String>, max: usize) -> Option<String> {
    s.as_deref().map(|s| tame(s, max))
}

/// A rank and the variable it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PsRank {
    pub variable: String,
    pub value: u64,
}

/// One `NCCL_*` setting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PsSetting {
    pub name: String,
    pub value: String,
}

/// One NCCL file a process maps.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PsNccl {
    pub path: String,
    /// `library` or `in_libtorch`.
    pub kind: String,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub cuda: Option<String>,
    #[serde(default)]
    pub blake3: Option<String>,
    #[serde(default)]
    pub size: Option<u64>,
    #[serde(default)]
    pub unread: Option<String>,
    /// The file on disk against the one mapped (`same`, `modified`, `replaced`, …).
    #[serde(default)]
    pub disk: String,
    #[serde(default)]
    pub preloaded: bool,
}

/// One plugin a process maps.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PsPlugin {
    pub path: String,
    #[serde(default)]
    pub kinds: Vec<String>,
}

/// Where the calls go: a mapped file, and the NCCL it is when it is one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PsTarget {
    pub path: String,
    #[serde(default)]
    pub nccl: Option<usize>,
}

/// What an answer rests on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "evidence", rename_all = "snake_case")]
pub enum PsEvidence {
    /// The `nccl*` slots of `caller`, read from the process's memory.
    Memory {
        caller: String,
        slots: usize,
        bound: usize,
    },
    /// The loader's rules over the maps, and why memory did not answer.
    Model { rule: PsRule, memory: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "snake_case")]
pub enum PsRule {
    Preloaded { element: String },
    OnlyOne,
}

/// Which NCCL a process's `nccl*` calls reach, as its worker said.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum PsReach {
    One {
        target: PsTarget,
        evidence: PsEvidence,
    },
    Split {
        targets: Vec<(PsTarget, usize)>,
        evidence: PsEvidence,
    },
    NoNccl,
    Unknown {
        reason: String,
    },
}

/// One process of a worker that maps an NCCL.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PsProcess {
    pub pid: u32,
    #[serde(default)]
    pub ppid: u32,
    #[serde(default)]
    pub uid: u32,
    #[serde(default)]
    pub command: String,
    #[serde(default)]
    pub rank: Option<PsRank>,
    #[serde(default)]
    pub local_rank: Option<PsRank>,
    #[serde(default)]
    pub nccl: Vec<PsNccl>,
    pub reach: PsReach,
    #[serde(default)]
    pub plugins: Vec<PsPlugin>,
    #[serde(default)]
    pub settings: Vec<PsSetting>,
    #[serde(default)]
    pub ld_preload: Option<String>,
    #[serde(default)]
    pub environment_unread: Option<String>,
}

/// A process the worker's /proc would not show, and why.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PsRefused {
    pub pid: u32,
    pub reason: String,
}

/// The scan as a worker sends it.
#[derive(Debug, Clone, Deserialize)]
struct WireScan {
    #[serde(default)]
    processes: Vec<PsProcess>,
    #[serde(default)]
    refused: Vec<PsRefused>,
    #[serde(default)]
    looked_at: usize,
}

#[derive(Debug, Clone, Deserialize)]
struct WireAnswer {
    schema: u32,
    kind: String,
    scan: WireScan,
}

impl PsEvidence {
    fn tamed(&self) -> PsEvidence {
        match self {
            PsEvidence::Memory {
                caller,
                slots,
                bound,
            } => PsEvidence::Memory {
                caller: tame(caller, PATH_CHARS),
                slots: *slots,
                bound: *bound,
            },
            PsEvidence::Model { rule, memory } => PsEvidence::Model {
                rule: match rule {
                    PsRule::Preloaded { element } => PsRule::Preloaded {
                        element: tame(element, PATH_CHARS),
                    },
                    PsRule::OnlyOne => PsRule::OnlyOne,
                },
                memory: tame(memory, WORD_CHARS),
            },
        }
    }

    /// "reached by", in a few words.
    pub fn short(&self) -> String {
        match self {
            PsEvidence::Memory { caller, .. } => format!("GOT of {}", file_name(caller)),
            PsEvidence::Model { rule, .. } => match rule {
                PsRule::Preloaded { .. } => "LD_PRELOAD (loader's rules)".into(),
                PsRule::OnlyOne => "only NCCL mapped (loader's rules)".into(),
            },
        }
    }
}

/// The last component of a path.
pub fn file_name(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

impl PsProcess {
    /// The process with every string cleaned and cut and every list bounded; `cut` says
    /// what was left out.
    fn tamed(mut self, cut: &mut Vec<String>) -> PsProcess {
        let pid = self.pid;
        let mut bound = |what: &str, len: usize, max: usize| {
            if len > max {
                cut.push(format!("pid {pid}: {} of {len} {what} kept", max));
            }
        };
        bound("NCCL files", self.nccl.len(), MAX_NCCL);
        bound("plugins", self.plugins.len(), MAX_PLUGINS);
        bound("settings", self.settings.len(), MAX_SETTINGS);
        self.nccl.truncate(MAX_NCCL);
        self.plugins.truncate(MAX_PLUGINS);
        self.settings.truncate(MAX_SETTINGS);
        self.command = tame(&self.command, COMMAND_CHARS);
        for r in [&mut self.rank, &mut self.local_rank].into_iter().flatten() {
            r.variable = tame(&r.variable, 64);
        }
        for n in &mut self.nccl {
            n.path = tame(&n.path, PATH_CHARS);
            n.kind = tame(&n.kind, 32);
            n.version = tame_opt(&n.version, 32);
            n.cuda = tame_opt(&n.cuda, 32);
            // A digest is hex; anything else stands for none.
            n.blake3 = n
                .blake3
                .take()
                .filter(|d| d.len() == 64 && d.bytes().all(|c| c.is_ascii_hexdigit()));
            n.unread = tame_opt(&n.unread, WORD_CHARS);
            n.disk = tame(&n.disk, 32);
        }
        for p in &mut self.plugins {
            p.path = tame(&p.path, PATH_CHARS);
            p.kinds.truncate(MAX_KINDS);
            for k in &mut p.kinds {
                *k = tame(k, 32);
            }
        }
        for s in &mut self.settings {
            s.name = tame(&s.name, 128);
            s.value = tame(&s.value, WORD_CHARS);
        }
        self.ld_preload = tame_opt(&self.ld_preload, WORD_CHARS);
        self.environment_unread = tame_opt(&self.environment_unread, WORD_CHARS);
        let n = self.nccl.len();
        let target = |t: &PsTarget| PsTarget {
            path: tame(&t.path, PATH_CHARS),
            // An index past the list names no NCCL.
            nccl: t.nccl.filter(|&i| i < n),
        };
        self.reach = match &self.reach {
            PsReach::One {
                target: t,
                evidence,
            } => PsReach::One {
                target: target(t),
                evidence: evidence.tamed(),
            },
            PsReach::Split { targets, evidence } => PsReach::Split {
                targets: targets
                    .iter()
                    .take(MAX_NCCL)
                    .map(|(t, c)| (target(t), *c))
                    .collect(),
                evidence: evidence.tamed(),
            },
            PsReach::NoNccl => PsReach::NoNccl,
            PsReach::Unknown { reason } => PsReach::Unknown {
                reason: tame(reason, WORD_CHARS),
            },
        };
        self
    }

    /// The NCCL file the calls reach, when one does.
    pub fn reached(&self) -> Option<&PsNccl> {
        match &self.reach {
            PsReach::One { target, .. } => target.nccl.and_then(|i| self.nccl.get(i)),
            _ => None,
        }
    }

    /// The `kind file-name` of each plugin mapped, sorted: what ranks compare.
    pub fn plugin_set(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .plugins
            .iter()
            .flat_map(|p| {
                p.kinds
                    .iter()
                    .map(|k| format!("{k} {}", file_name(&p.path)))
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// Reads a worker's answer: `Ok(Err(why))` when it is no answer of this fdl's (then the
/// controller ships its own and asks again).
pub fn read_answer(stdout: &[u8]) -> Result<Answered, String> {
    let text = String::from_utf8_lossy(stdout);
    let wire: WireAnswer = match serde_json::from_str(text.trim()) {
        Ok(w) => w,
        Err(_) => return Err("its fdl gave no process scan".into()),
    };
    if wire.schema != PS_SCHEMA || wire.kind != PS_KIND {
        return Err(format!(
            "its fdl speaks process scan schema {} ({})",
            wire.schema,
            tame(&wire.kind, 64)
        ));
    }
    let mut cut = Vec::new();
    let WireScan {
        mut processes,
        mut refused,
        looked_at,
    } = wire.scan;
    if processes.len() > MAX_PROCESSES {
        cut.push(format!(
            "{MAX_PROCESSES} of {} processes kept",
            processes.len()
        ));
        processes.truncate(MAX_PROCESSES);
    }
    if refused.len() > MAX_REFUSED {
        cut.push(format!(
            "{MAX_REFUSED} of {} refused processes kept",
            refused.len()
        ));
        refused.truncate(MAX_REFUSED);
    }
    let processes = processes.into_iter().map(|p| p.tamed(&mut cut)).collect();
    for r in &mut refused {
        r.reason = tame(&r.reason, WORD_CHARS);
    }
    Ok(Answered {
        processes,
        refused,
        looked_at,
        cut,
        shipped_fdl: false,
    })
}

/// What one worker said.
#[derive(Debug, Clone, Serialize)]
pub struct Answered {
    pub processes: Vec<PsProcess>,
    pub refused: Vec<PsRefused>,
    /// How many processes of its user it looked at.
    pub looked_at: usize,
    /// What of its answer was left out (beyond fdl's bounds).
    pub cut: Vec<String>,
    /// The controller's fdl was copied there for this query.
    pub shipped_fdl: bool,
}

/// One worker's answer, or why there is none.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum HostAnswer {
    Answered(Answered),
    Failed { error: String },
}

#[derive(Debug, Clone, Serialize)]
pub struct HostPs {
    pub host: String,
    pub target: String,
    #[serde(flatten)]
    pub answer: HostAnswer,
}

/// The worker-side arguments of the scan.
fn worker_args(no_memory: bool) -> Vec<String> {
    let mut a: Vec<String> = ["cluster", "ps-self", "--json"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if no_memory {
        a.push("--no-memory".into());
    }
    a
}

/// Every worker's processes, the workers reached all at once; the order is the workers'.
pub fn query_all(
    workers: &[&Worker],
    t: &dyn Transport,
    own: &OwnBinary,
    timeout: Duration,
    no_memory: bool,
    on_done: &(dyn Fn(&HostPs) + Sync),
) -> Vec<HostPs> {
    let parse = |out: &std::process::Output| read_answer(&out.stdout);
    let args = |_: &Worker| worker_args(no_memory);
    status::run_fdl_all(t, workers, own, &args, timeout, &parse)
        .into_iter()
        .zip(workers)
        .map(|(r, w)| {
            let answer = match r {
                Ok((mut a, shipped)) => {
                    a.shipped_fdl = shipped;
                    HostAnswer::Answered(a)
                }
                Err(e) => HostAnswer::Failed {
                    error: tame(&format!("{e:#}"), 2 * WORD_CHARS),
                },
            };
            let h = HostPs {
                host: w.host.clone(),
                target: w.ssh.target.clone(),
                answer,
            };
            on_done(&h);
            h
        })
        .collect()
}

/// The project's build the ranks should run, and the BLAKE3 its manifest records for
/// `lib/libnccl.so.2` (`None`: the manifest records no file digests).
#[derive(Debug, Clone, Serialize)]
pub struct ChosenBuild {
    pub name: String,
    pub why: String,
    pub blake3: Option<String>,
}

/// The BLAKE3 a build's file record gives `lib/libnccl.so.2`, its links followed within
/// `lib/` (at most a few).
pub fn library_digest(files: &[FileEntry]) -> Option<String> {
    let mut path = "lib/libnccl.so.2".to_string();
    for _ in 0..8 {
        match files.iter().find(|f| f.path() == path)? {
            FileEntry::File { blake3, .. } => return Some(blake3.clone()),
            FileEntry::Link { target, .. } => {
                let (dir, _) = path.rsplit_once('/').unwrap_or(("", ""));
                if target.starts_with('/') || target.contains("..") {
                    return None;
                }
                path = if dir.is_empty() {
                    target.clone()
                } else {
                    format!("{dir}/{target}")
                };
            }
            FileEntry::Dir { .. } => return None,
        }
    }
    None
}

/// The build the ranks should run, as `cluster env` picks it.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Wanted {
    /// The project has no build: there is nothing to compare with.
    NoBuild,
    Build(ChosenBuild),
    /// The project has builds, and none could be picked (why).
    Unpicked {
        why: String,
    },
}

/// A verdict's state: `ok` rests on every fact it needs; `unknown` where some are
/// missing; `note` names a difference that need not stop a job; `skipped` where there
/// is nothing to judge against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Ok,
    Red,
    Unknown,
    Note,
    Skipped,
}

/// A process, by where it runs and its rank.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct At {
    pub host: String,
    pub pid: u32,
    pub rank: Option<u64>,
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.rank {
            Some(r) => write!(f, "{} rank {r} (pid {})", self.host, self.pid),
            None => write!(f, "{} pid {} (no rank)", self.host, self.pid),
        }
    }
}

/// The facts a verdict rests on.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "finding", rename_all = "snake_case")]
pub enum Finding {
    /// A worker that gave no answer.
    Unreachable { host: String, error: String },
    /// A worker that runs no process mapping an NCCL.
    NoProcess { host: String, looked_at: usize },
    /// Processes grouped by a value that should be one (a version, a digest, a plugin
    /// set, a setting); `value: None` where the process has none or it is unread.
    Differ { what: String, groups: Vec<Group> },
    /// Processes whose NCCL is not the chosen build's file.
    NotTheBuild {
        build: String,
        at: At,
        blake3: Option<String>,
    },
    /// Two or more processes with one rank number.
    SameRank { rank: u64, at: Vec<At> },
    /// A process whose calls' NCCL is not known, and why.
    Unknown { at: At, reason: String },
    /// A process whose calls reach two NCCLs.
    Split { at: At, files: Vec<String> },
}

#[derive(Debug, Clone, Serialize)]
pub struct Group {
    pub value: Option<String>,
    pub at: Vec<At>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub name: &'static str,
    pub state: State,
    pub detail: String,
    pub findings: Vec<Finding>,
    /// The processes (and hosts) a red or unknown verdict names.
    pub blame: Vec<String>,
}

/// Every process of every worker that answered, with where it is.
fn all_processes(hosts: &[HostPs]) -> Vec<(At, &PsProcess)> {
    let mut out = Vec::new();
    for h in hosts {
        if let HostAnswer::Answered(a) = &h.answer {
            for p in &a.processes {
                out.push((
                    At {
                        host: h.host.clone(),
                        pid: p.pid,
                        rank: p.rank.as_ref().map(|r| r.value),
                    },
                    p,
                ));
            }
        }
    }
    out
}

/// Groups by value, the largest group first (ties: the first seen).
fn group(values: Vec<(At, Option<String>)>) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for (at, v) in values {
        match groups.iter_mut().find(|g| g.value == v) {
            Some(g) => g.at.push(at),
            None => groups.push(Group {
                value: v,
                at: vec![at],
            }),
        }
    }
    groups.sort_by_key(|g| std::cmp::Reverse(g.at.len()));
    groups
}

fn list(at: &[At]) -> String {
    at.iter().map(At::to_string).collect::<Vec<_>>().join(", ")
}

/// The groups in words: `2.27.5 on a rank 0 (pid 1), b rank 1 (pid 2); 2.28.9 on …`.
fn groups_words(groups: &[Group], none: &str) -> String {
    groups
        .iter()
        .map(|g| format!("{} on {}", g.value.as_deref().unwrap_or(none), list(&g.at)))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Who a split into groups blames: every process outside the largest group; when the
/// largest is not larger than the next, every process.
fn outliers(groups: &[Group]) -> Vec<At> {
    let tie = groups.len() > 1 && groups[0].at.len() == groups[1].at.len();
    groups
        .iter()
        .skip(if tie { 0 } else { 1 })
        .flat_map(|g| g.at.clone())
        .collect()
}

fn verdict(
    name: &'static str,
    state: State,
    detail: String,
    findings: Vec<Finding>,
    blame: Vec<String>,
) -> Verdict {
    Verdict {
        name,
        state,
        detail,
        findings,
        blame,
    }
}

/// The short form of a digest, as the table shows it.
pub fn short_digest(d: &str) -> &str {
    &d[..d.len().min(12)]
}

/// The verdicts, in the order `cluster ps` prints them. `build`: the project's build
/// the ranks should run (`None`: the project has none, and that verdict is skipped).
pub fn verdicts(hosts: &[HostPs], wanted: &Wanted) -> Vec<Verdict> {
    let mut out = Vec::new();
    // Where some processes carry a rank, the others (a launcher such as torchrun's agent,
    // which imports torch but starts no communicator) are no ranks: they are named, not
    // held to the ranks' plugins and settings. Where none does, every process is judged.
    let (procs, launchers): (Vec<_>, Vec<_>) = {
        let all = all_processes(hosts);
        if all.iter().any(|(at, _)| at.rank.is_some()) {
            all.into_iter().partition(|(at, _)| at.rank.is_some())
        } else {
            (all, Vec::new())
        }
    };

    // reach: every worker answered.
    let failed: Vec<(&str, &str)> = hosts
        .iter()
        .filter_map(|h| match &h.answer {
            HostAnswer::Failed { error } => Some((h.host.as_str(), error.as_str())),
            HostAnswer::Answered(_) => None,
        })
        .collect();
    out.push(if failed.is_empty() {
        verdict(
            "reach",
            State::Ok,
            format!("all {} workers answered", hosts.len()),
            vec![],
            vec![],
        )
    } else {
        verdict(
            "reach",
            State::Red,
            failed
                .iter()
                .map(|(h, e)| format!("{h}: {e}"))
                .collect::<Vec<_>>()
                .join("; "),
            failed
                .iter()
                .map(|(h, e)| Finding::Unreachable {
                    host: h.to_string(),
                    error: e.to_string(),
                })
                .collect(),
            failed.iter().map(|(h, _)| h.to_string()).collect(),
        )
    });

    // processes: every worker that answered runs one.
    let idle: Vec<(&str, usize)> = hosts
        .iter()
        .filter_map(|h| match &h.answer {
            HostAnswer::Answered(a) if a.processes.is_empty() => {
                Some((h.host.as_str(), a.looked_at))
            }
            _ => None,
        })
        .collect();
    out.push(if hosts.is_empty() {
        verdict(
            "processes",
            State::Unknown,
            "no workers".into(),
            vec![],
            vec![],
        )
    } else if idle.is_empty() {
        verdict(
            "processes",
            if procs.is_empty() { State::Unknown } else { State::Ok },
            format!(
                "{} process{} map{} an NCCL",
                procs.len(),
                if procs.len() == 1 { "" } else { "es" },
                if procs.len() == 1 { "s" } else { "" }
            ),
            vec![],
            vec![],
        )
    } else {
        verdict(
            "processes",
            State::Unknown,
            idle.iter()
                .map(|(h, n)| {
                    format!(
                        "{h} runs no process that maps an NCCL (it looked at {n} process{} of its user)",
                        if *n == 1 { "" } else { "es" }
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
            idle.iter()
                .map(|(h, n)| Finding::NoProcess {
                    host: h.to_string(),
                    looked_at: *n,
                })
                .collect(),
            idle.iter().map(|(h, _)| h.to_string()).collect(),
        )
    });

    // answer: every process's calls reach one known NCCL.
    let mut findings = Vec::new();
    let mut red = false;
    for (at, p) in &procs {
        match &p.reach {
            PsReach::One { target, .. } if target.nccl.is_none() => {
                findings.push(Finding::Unknown {
                    at: at.clone(),
                    reason: format!(
                        "its nccl* calls reach {}, which is no NCCL it maps (an interposer)",
                        target.path
                    ),
                })
            }
            PsReach::One { .. } => {}
            PsReach::Split { targets, .. } => {
                red = true;
                findings.push(Finding::Split {
                    at: at.clone(),
                    files: targets.iter().map(|(t, _)| t.path.clone()).collect(),
                })
            }
            PsReach::NoNccl => findings.push(Finding::Unknown {
                at: at.clone(),
                reason: "it maps no NCCL".into(),
            }),
            PsReach::Unknown { reason } => findings.push(Finding::Unknown {
                at: at.clone(),
                reason: reason.clone(),
            }),
        }
    }
    let words: Vec<String> = findings
        .iter()
        .map(|f| match f {
            Finding::Unknown { at, reason } => format!("{at}: unknown: {reason}"),
            Finding::Split { at, files } => format!(
                "{at}: its nccl* calls reach {} different files ({})",
                files.len(),
                files.join(", ")
            ),
            _ => String::new(),
        })
        .collect();
    let blame: Vec<String> = findings
        .iter()
        .filter_map(|f| match f {
            Finding::Unknown { at, .. } | Finding::Split { at, .. } => Some(at.to_string()),
            _ => None,
        })
        .collect();
    out.push(match (findings.is_empty(), red) {
        (true, _) => verdict(
            "answer",
            if procs.is_empty() {
                State::Unknown
            } else {
                State::Ok
            },
            if procs.is_empty() {
                "no process to answer for".into()
            } else {
                "each process's nccl* calls reach one NCCL file".into()
            },
            vec![],
            vec![],
        ),
        (false, true) => verdict("answer", State::Red, words.join("; "), findings, blame),
        (false, false) => verdict("answer", State::Unknown, words.join("; "), findings, blame),
    });

    // ranks: no rank number twice.
    let mut by_rank: BTreeMap<u64, Vec<At>> = BTreeMap::new();
    let mut rankless = Vec::new();
    for (at, _) in &procs {
        match at.rank {
            Some(r) => by_rank.entry(r).or_default().push(at.clone()),
            None => rankless.push(at.clone()),
        }
    }
    let twice: Vec<(u64, Vec<At>)> = by_rank
        .iter()
        .filter(|(_, v)| v.len() > 1)
        .map(|(r, v)| (*r, v.clone()))
        .collect();
    let mut note = if rankless.is_empty() {
        String::new()
    } else {
        format!(
            "; no rank variable ({}) in {}",
            crate::loader::running::RANK_VARIABLES.join(", "),
            list(&rankless)
        )
    };
    if !launchers.is_empty() {
        let at: Vec<At> = launchers.iter().map(|(at, _)| at.clone()).collect();
        note.push_str(&format!(
            "; not judged as ranks (no rank variable, as a launcher has none): {}",
            list(&at)
        ));
    }
    out.push(if twice.is_empty() {
        verdict(
            "ranks",
            if procs.is_empty() {
                State::Unknown
            } else {
                State::Ok
            },
            format!("{} distinct rank number(s){note}", by_rank.len()),
            vec![],
            vec![],
        )
    } else {
        verdict(
            "ranks",
            State::Red,
            format!(
                "{}{note}",
                twice
                    .iter()
                    .map(|(r, at)| format!(
                        "rank {r} is run by {} processes: {}",
                        at.len(),
                        list(at)
                    ))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            twice
                .iter()
                .map(|(r, at)| Finding::SameRank {
                    rank: *r,
                    at: at.clone(),
                })
                .collect(),
            twice
                .iter()
                .flat_map(|(_, at)| at.iter().map(At::to_string))
                .collect(),
        )
    });

    // version and digest: of the NCCL each process's calls reach.
    let reached: Vec<(At, &PsNccl)> = procs
        .iter()
        .filter_map(|(at, p)| p.reached().map(|n| (at.clone(), n)))
        .collect();
    for (name, what, differ, same, get) in [
        (
            "version",
            "NCCL version",
            "NCCL versions differ across ranks",
            "every rank runs NCCL",
            (|n: &PsNccl| n.version.clone()) as fn(&PsNccl) -> Option<String>,
        ),
        (
            "digest",
            "NCCL file (BLAKE3)",
            "the NCCL files differ across ranks (BLAKE3)",
            "every rank runs one NCCL file, BLAKE3",
            |n: &PsNccl| n.blake3.clone(),
        ),
    ] {
        let groups = group(reached.iter().map(|(at, n)| (at.clone(), get(n))).collect());
        let unread: Vec<&At> = groups
            .iter()
            .filter(|g| g.value.is_none())
            .flat_map(|g| g.at.iter())
            .collect();
        let known: Vec<Group> = groups
            .iter()
            .filter(|g| g.value.is_some())
            .cloned()
            .collect();
        let shown = |g: &[Group]| {
            let g: Vec<Group> = g
                .iter()
                .map(|g| Group {
                    value: g.value.as_deref().map(|v| {
                        if name == "digest" {
                            short_digest(v).to_string()
                        } else {
                            v.to_string()
                        }
                    }),
                    at: g.at.clone(),
                })
                .collect();
            groups_words(&g, "unread")
        };
        out.push(if known.len() > 1 {
            let odd = outliers(&known);
            verdict(
                name,
                State::Red,
                format!("{differ}: {}", shown(&known)),
                vec![Finding::Differ {
                    what: what.into(),
                    groups,
                }],
                odd.iter().map(At::to_string).collect(),
            )
        } else if !unread.is_empty() || reached.is_empty() {
            verdict(
                name,
                State::Unknown,
                if reached.is_empty() {
                    "no process's NCCL is known".into()
                } else {
                    format!(
                        "the {what} of {} is unread",
                        unread
                            .iter()
                            .map(|a| a.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                },
                vec![Finding::Differ {
                    what: what.into(),
                    groups: groups.clone(),
                }],
                unread.iter().map(|a| a.to_string()).collect(),
            )
        } else {
            verdict(
                name,
                State::Ok,
                format!(
                    "{same} {}",
                    shown(&known[..1]).split(" on ").next().unwrap_or_default()
                ),
                vec![],
                vec![],
            )
        });
    }

    // build: the chosen build's file, by its manifest's digest.
    out.push(match wanted {
        Wanted::NoBuild => verdict(
            "build",
            State::Skipped,
            "this project has no build to compare with".into(),
            vec![],
            vec![],
        ),
        Wanted::Unpicked { why } => verdict(
            "build",
            State::Unknown,
            format!("no build was picked to compare with: {why} (name one: `fdl cluster ps BUILD`)"),
            vec![],
            vec![],
        ),
        Wanted::Build(b) => match &b.blake3 {
            None => verdict(
                "build",
                State::Unknown,
                format!(
                    "build {}'s manifest records no digest of lib/libnccl.so.2 (a build of an older fdl): rebuild it",
                    b.name
                ),
                vec![],
                vec![],
            ),
            Some(want) => {
                let off: Vec<(At, Option<String>)> = reached
                    .iter()
                    .filter(|(_, n)| n.blake3.as_deref() != Some(want.as_str()))
                    .map(|(at, n)| (at.clone(), n.blake3.clone()))
                    .collect();
                if reached.is_empty() {
                    verdict(
                        "build",
                        State::Unknown,
                        "no process's NCCL is known".into(),
                        vec![],
                        vec![],
                    )
                } else if off.is_empty() {
                    verdict(
                        "build",
                        State::Ok,
                        format!(
                            "every rank runs build {} ({}: {})",
                            b.name,
                            b.why,
                            short_digest(want)
                        ),
                        vec![],
                        vec![],
                    )
                } else {
                    verdict(
                        "build",
                        State::Red,
                        format!(
                            "not build {} ({}; its libnccl.so.2 is {}): {}",
                            b.name,
                            b.why,
                            short_digest(want),
                            off.iter()
                                .map(|(at, d)| format!(
                                    "{at} runs {}",
                                    d.as_deref().map(short_digest).unwrap_or("an unread file")
                                ))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                        off.iter()
                            .map(|(at, d)| Finding::NotTheBuild {
                                build: b.name.clone(),
                                at: at.clone(),
                                blake3: d.clone(),
                            })
                            .collect(),
                        off.iter().map(|(at, _)| at.to_string()).collect(),
                    )
                }
            }
        },
    });

    // plugins: one plugin set everywhere.
    let groups = group(
        procs
            .iter()
            .map(|(at, p)| {
                let set = p.plugin_set();
                (
                    at.clone(),
                    Some(if set.is_empty() {
                        "none".to_string()
                    } else {
                        set.join(", ")
                    }),
                )
            })
            .collect(),
    );
    out.push(if groups.len() > 1 {
        verdict(
            "plugins",
            State::Red,
            format!(
                "the ranks map different NCCL plugins: {}",
                groups_words(&groups, "none")
            ),
            vec![Finding::Differ {
                what: "plugins".into(),
                groups: groups.clone(),
            }],
            outliers(&groups).iter().map(At::to_string).collect(),
        )
    } else {
        verdict(
            "plugins",
            if procs.is_empty() {
                State::Unknown
            } else {
                State::Ok
            },
            match groups.first().and_then(|g| g.value.as_deref()) {
                Some("none") | None => "no rank maps an NCCL plugin".into(),
                Some(set) => format!("every rank maps the same plugins: {set}"),
            },
            vec![],
            vec![],
        )
    });

    // settings: NCCL_* variables whose values differ across ranks, named.
    let mut names: Vec<&str> = procs
        .iter()
        .flat_map(|(_, p)| p.settings.iter().map(|s| s.name.as_str()))
        .collect();
    names.sort();
    names.dedup();
    let unread: Vec<String> = procs
        .iter()
        .filter(|(_, p)| p.environment_unread.is_some())
        .map(|(at, p)| {
            format!(
                "{at}: environment unread ({})",
                p.environment_unread.as_deref().unwrap_or_default()
            )
        })
        .collect();
    let mut findings = Vec::new();
    let mut words = Vec::new();
    for name in names {
        let groups = group(
            procs
                .iter()
                .filter(|(_, p)| p.environment_unread.is_none())
                .map(|(at, p)| {
                    (
                        at.clone(),
                        p.settings
                            .iter()
                            .find(|s| s.name == name)
                            .map(|s| s.value.clone()),
                    )
                })
                .collect(),
        );
        if groups.len() > 1 {
            words.push(format!("{name}: {}", groups_words(&groups, "unset")));
            findings.push(Finding::Differ {
                what: name.to_string(),
                groups,
            });
        }
    }
    let differing: Vec<String> = findings
        .iter()
        .filter_map(|f| match f {
            Finding::Differ { what, .. } => Some(what.clone()),
            _ => None,
        })
        .collect();
    out.push(if !findings.is_empty() {
        let mut detail = format!("NCCL_* settings differ across ranks: {}", words.join("; "));
        if !unread.is_empty() {
            detail.push_str(&format!("; {}", unread.join("; ")));
        }
        verdict("settings", State::Note, detail, findings, differing)
    } else if !unread.is_empty() {
        verdict(
            "settings",
            State::Unknown,
            unread.join("; "),
            vec![],
            vec![],
        )
    } else {
        verdict(
            "settings",
            if procs.is_empty() {
                State::Unknown
            } else {
                State::Ok
            },
            "every rank has the same NCCL_* settings".into(),
            vec![],
            vec![],
        )
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(c: char) -> String {
        c.to_string().repeat(64)
    }

    fn process(pid: u32, rank: Option<u64>, version: &str, d: char) -> PsProcess {
        PsProcess {
            pid,
            ppid: 1,
            uid: 0,
            command: "python train.py".into(),
            rank: rank.map(|value| PsRank {
                variable: "RANK".into(),
                value,
            }),
            local_rank: None,
            nccl: vec![PsNccl {
                path: "/opt/nccl/lib/libnccl.so.2".into(),
                kind: "library".into(),
                version: Some(version.into()),
                cuda: Some("12.8".into()),
                blake3: Some(digest(d)),
                size: Some(1),
                unread: None,
                disk: "same".into(),
                preloaded: false,
            }],
            reach: PsReach::One {
                target: PsTarget {
                    path: "/opt/nccl/lib/libnccl.so.2".into(),
                    nccl: Some(0),
                },
                evidence: PsEvidence::Model {
                    rule: PsRule::OnlyOne,
                    memory: "not read".into(),
                },
            },
            plugins: vec![],
            settings: vec![],
            ld_preload: None,
            environment_unread: None,
        }
    }

    fn host(name: &str, processes: Vec<PsProcess>) -> HostPs {
        HostPs {
            host: name.into(),
            target: name.into(),
            answer: HostAnswer::Answered(Answered {
                processes,
                refused: vec![],
                looked_at: 7,
                cut: vec![],
                shipped_fdl: false,
            }),
        }
    }

    fn get<'a>(v: &'a [Verdict], name: &str) -> &'a Verdict {
        v.iter().find(|x| x.name == name).unwrap()
    }

    #[test]
    fn one_version_everywhere_is_green() {
        let hosts = vec![
            host("a", vec![process(10, Some(0), "2.27.5", 'a')]),
            host("b", vec![process(11, Some(1), "2.27.5", 'a')]),
            host("c", vec![process(12, Some(2), "2.27.5", 'a')]),
        ];
        let v = verdicts(&hosts, &Wanted::NoBuild);
        for x in &v {
            assert!(
                matches!(x.state, State::Ok | State::Skipped),
                "{}: {:?} {}",
                x.name,
                x.state,
                x.detail
            );
        }
        let b = ChosenBuild {
            name: "v2.27.5-sm90".into(),
            why: "named".into(),
            blake3: Some(digest('a')),
        };
        assert_eq!(
            get(&verdicts(&hosts, &Wanted::Build(b)), "build").state,
            State::Ok
        );
    }

    #[test]
    fn the_odd_version_is_red_naming_its_host_and_rank() {
        let hosts = vec![
            host("a", vec![process(10, Some(0), "2.27.5", 'a')]),
            host("b", vec![process(11, Some(1), "2.27.5", 'a')]),
            host("c", vec![process(12, Some(2), "2.28.9", 'b')]),
        ];
        let v = verdicts(&hosts, &Wanted::NoBuild);
        let version = get(&v, "version");
        assert_eq!(version.state, State::Red);
        assert_eq!(version.blame, vec!["c rank 2 (pid 12)".to_string()]);
        assert!(
            version.detail.contains("2.28.9 on c rank 2"),
            "{}",
            version.detail
        );
        assert_eq!(get(&v, "digest").state, State::Red);
        let b = ChosenBuild {
            name: "v2.27.5-sm90".into(),
            why: "named".into(),
            blake3: Some(digest('a')),
        };
        let build = verdicts(&hosts, &Wanted::Build(b));
        let build = get(&build, "build");
        assert_eq!(build.state, State::Red);
        assert_eq!(build.blame, vec!["c rank 2 (pid 12)".to_string()]);
    }

    #[test]
    fn a_rank_twice_an_unknown_answer_and_an_idle_host_are_named() {
        let mut unknown = process(13, Some(3), "2.27.5", 'a');
        unknown.reach = PsReach::Unknown {
            reason: "2 NCCL files are mapped".into(),
        };
        let hosts = vec![
            host("a", vec![process(10, Some(0), "2.27.5", 'a'), unknown]),
            host("b", vec![process(11, Some(0), "2.27.5", 'a')]),
            host("c", vec![]),
        ];
        let v = verdicts(&hosts, &Wanted::NoBuild);
        let ranks = get(&v, "ranks");
        assert_eq!(ranks.state, State::Red);
        assert!(
            ranks
                .detail
                .contains("rank 0 is run by 2 processes: a rank 0 (pid 10), b rank 0 (pid 11)"),
            "{}",
            ranks.detail
        );
        let answer = get(&v, "answer");
        assert_eq!(answer.state, State::Unknown);
        assert_eq!(answer.blame, vec!["a rank 3 (pid 13)".to_string()]);
        let procs = get(&v, "processes");
        assert_eq!(procs.state, State::Unknown);
        assert!(
            procs
                .detail
                .starts_with("c runs no process that maps an NCCL"),
            "{}",
            procs.detail
        );
    }

    #[test]
    fn a_launcher_without_a_rank_is_named_not_judged() {
        let mut agent = process(9, None, "2.27.5", 'a');
        agent.settings = vec![PsSetting {
            name: "NCCL_ALGO".into(),
            value: "Tree".into(),
        }];
        let mut a = process(10, Some(0), "2.27.5", 'a');
        a.plugins = vec![PsPlugin {
            path: "/x/libnccl-net.so".into(),
            kinds: vec!["net".into()],
        }];
        let mut b = process(11, Some(1), "2.27.5", 'a');
        b.plugins = a.plugins.clone();
        let v = verdicts(
            &[host("a", vec![agent, a]), host("b", vec![b])],
            &Wanted::NoBuild,
        );
        for x in &v {
            assert!(
                matches!(x.state, State::Ok | State::Skipped),
                "{}: {:?} {}",
                x.name,
                x.state,
                x.detail
            );
        }
        assert!(
            get(&v, "ranks").detail.ends_with(
                "not judged as ranks (no rank variable, as a launcher has none): a pid 9 (no rank)"
            ),
            "{}",
            get(&v, "ranks").detail
        );
    }

    #[test]
    fn differing_settings_and_plugins_are_named() {
        let mut a = process(10, Some(0), "2.27.5", 'a');
        a.settings = vec![PsSetting {
            name: "NCCL_ALGO".into(),
            value: "Ring".into(),
        }];
        a.plugins = vec![PsPlugin {
            path: "/x/libnccl-net.so".into(),
            kinds: vec!["net".into()],
        }];
        let b = process(11, Some(1), "2.27.5", 'a');
        let v = verdicts(&[host("a", vec![a]), host("b", vec![b])], &Wanted::NoBuild);
        let s = get(&v, "settings");
        assert_eq!(s.state, State::Note);
        assert_eq!(s.blame, vec!["NCCL_ALGO".to_string()]);
        assert!(s.detail.contains("Ring on a rank 0"), "{}", s.detail);
        assert!(s.detail.contains("unset on b rank 1"), "{}", s.detail);
        let p = get(&v, "plugins");
        assert_eq!(p.state, State::Red);
        assert!(
            p.detail.contains("net libnccl-net.so on a rank 0"),
            "{}",
            p.detail
        );
    }

    #[test]
    fn a_hostile_answer_is_cleaned_and_bounded() {
        let mut p = serde_json::to_value(process(10, Some(0), "2.27.5\u{1b}[31m", 'a')).unwrap();
        p["command"] = serde_json::json!("x\u{1b}]0;pwned\u{7}".repeat(1000));
        p["nccl"][0]["blake3"] = serde_json::json!("not hex");
        p["reach"]["target"]["nccl"] = serde_json::json!(5);
        let many: Vec<serde_json::Value> = (0..MAX_PROCESSES + 3).map(|_| p.clone()).collect();
        let answer = serde_json::json!({
            "schema": PS_SCHEMA, "kind": PS_KIND,
            "scan": {"processes": many, "refused": [], "looked_at": 9}
        });
        let a = read_answer(answer.to_string().as_bytes()).unwrap();
        assert_eq!(a.processes.len(), MAX_PROCESSES);
        assert!(a.cut[0].contains("processes kept"), "{:?}", a.cut);
        let p = &a.processes[0];
        assert!(!p.command.contains('\u{1b}') && !p.command.contains('\u{7}'));
        assert!(p.command.chars().count() <= COMMAND_CHARS);
        assert!(!p.nccl[0].version.as_deref().unwrap().contains('\u{1b}'));
        assert_eq!(p.nccl[0].blake3, None);
        assert!(
            p.reached().is_none(),
            "an index past the list names no NCCL"
        );
        assert!(read_answer(b"{\"schema\": 1, \"error\": \"x\"}").is_err());
        assert!(
            read_answer(b"{\"schema\": 2, \"kind\": \"cluster-ps-worker\", \"scan\": {}}")
                .unwrap_err()
                .contains("schema 2")
        );
    }

    #[test]
    fn the_library_digest_follows_the_records_links() {
        let files = vec![
            FileEntry::Link {
                path: "lib/libnccl.so.2".into(),
                target: "libnccl.so.2.27.5".into(),
            },
            FileEntry::File {
                path: "lib/libnccl.so.2.27.5".into(),
                size: 3,
                blake3: digest('c'),
            },
        ];
        assert_eq!(library_digest(&files), Some(digest('c')));
        assert_eq!(library_digest(&files[..1]), None);
    }
}
