//! Running processes: which NCCL files each process maps, and which one its `nccl*` calls
//! reach, read from `/proc` alone. Nothing is attached, signalled or run, so a hung job
//! answers as well as a healthy one.
//!
//! The calls' answer rests on the strongest evidence at hand, and says which
//! ([`Evidence`]): the GOT and PLT slots of each object that imports `nccl*`, read from
//! `/proc/PID/mem` at the load base plus each relocation's offset (what the loader really
//! bound); where memory cannot be read (Yama's `ptrace_scope`, another user's process,
//! `--no-memory`) or no slot is bound yet, the loader's rules over the maps and the
//! process's own `LD_PRELOAD`: a preloaded NCCL is first in the global scope, and an only
//! NCCL is the one. Anything else is [`Reach::Unknown`] with its reason: /proc does not
//! keep the order in which two NCCLs were loaded.
//!
//! Every file is read as the process maps it: by its path when that path still holds the
//! same device and inode, else through `/proc/PID/map_files` (root), else not at all. A
//! mapped file replaced or deleted since is marked ([`Disk`]). Every read is bounded; all
//! text from the process (command line, environment, paths) is cleaned before it is kept.

use super::procmaps::{self, Mapping};
use crate::inspect::{self, interpose, Source};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// At most this much of `/proc/PID/maps` is read (a process with more maps is refused).
const MAPS_BYTES: u64 = 16 << 20;
/// A `/proc` read starts with this much room (it grows when the file is larger).
const PROC_READ_START: u64 = 64 << 10;
/// At most this much of the command line and of the environment.
const CMDLINE_BYTES: u64 = 64 << 10;
const ENVIRON_BYTES: u64 = 4 << 20;
/// At most this many processes are looked at, and this many distinct files per process.
const MAX_PIDS: usize = 1 << 20;
const MAX_OBJECTS: usize = 1 << 14;
/// At most this many `NCCL_*` settings are kept, each value cut at this many characters.
const MAX_SETTINGS: usize = 256;
const SETTING_CHARS: usize = 512;
/// The command line is kept cut at this many characters.
const COMMAND_CHARS: usize = 4096;

/// The variables a launcher sets for a rank's number, in the order they are believed:
/// torchrun's, Slurm's, Open MPI's, then MPICH's and Intel MPI's.
pub const RANK_VARIABLES: [&str; 4] = ["RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"];
/// The same for the rank on its host.
pub const LOCAL_RANK_VARIABLES: [&str; 4] = [
    "LOCAL_RANK",
    "SLURM_LOCALID",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
];

/// What to look at.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Only these processes (of any user: another user's is refused with its reason).
    /// `None`: every process of this user that maps a file [`may_hold_nccl`] names.
    pub pids: Option<Vec<u32>>,
    /// Do not read `/proc/PID/mem`: answer from the maps and the loader's rules.
    pub no_memory: bool,
    /// Keep each NCCL file's digest in this cache directory (fdl's), by the file's
    /// identity, and take it from there while the file is unchanged
    /// ([`crate::cache::kept_digest`]); `None`: hash each time.
    pub digest_cache: Option<PathBuf>,
}

/// Every process looked at, and those `/proc` would not show.
#[derive(Debug, Clone, Serialize)]
pub struct Scan {
    pub processes: Vec<Process>,
    pub refused: Vec<Refused>,
    /// How many processes were looked at (this user's, or the ones asked for).
    pub looked_at: usize,
}

/// A process `/proc` would not show, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Refused {
    pub pid: u32,
    pub reason: String,
}

/// One process that maps an NCCL (or was asked for by pid).
#[derive(Debug, Clone, Serialize)]
pub struct Process {
    pub pid: u32,
    pub ppid: u32,
    pub uid: u32,
    /// The command line, arguments joined by spaces, cleaned and cut.
    pub command: String,
    pub rank: Option<Rank>,
    pub local_rank: Option<Rank>,
    /// Each distinct NCCL file mapped, in address order.
    pub nccl: Vec<MappedNccl>,
    /// Which one the `nccl*` calls reach.
    pub reach: Reach,
    /// The NCCL plugins mapped (objects that export a plugin entry).
    pub plugins: Vec<MappedPlugin>,
    /// `NCCL_*` variables of its environment, by name.
    pub settings: Vec<Setting>,
    /// Its `LD_PRELOAD`, cleaned (`None`: not set, or the environment was unreadable).
    pub ld_preload: Option<String>,
    /// Why the environment could not be read (then rank, settings and preload are unknown).
    pub environment_unread: Option<String>,
    /// Seconds since the Unix epoch when it started.
    pub started: Option<i64>,
}

/// A rank and the variable it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rank {
    pub variable: &'static str,
    pub value: u64,
}

/// One `NCCL_*` setting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Setting {
    pub name: String,
    pub value: String,
}

/// What an NCCL file mapped is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NcclKind {
    /// A `libnccl.so*` of its own.
    Library,
    /// NCCL linked into a libtorch CUDA library (`libtorch_cuda.so`; torch ≤ 1.13's split
    /// build has it in `libtorch_cuda_cpp.so`).
    InLibtorch,
}

/// One NCCL file a process maps.
#[derive(Debug, Clone, Serialize)]
pub struct MappedNccl {
    /// As the kernel names it (cleaned for display only where shown).
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub path: PathBuf,
    pub kind: NcclKind,
    /// Its self-id's NCCL version (`2.27.5`), `None` when unread.
    pub version: Option<String>,
    /// The CUDA it was built with, from the same self-id.
    pub cuda: Option<String>,
    /// BLAKE3 of the mapped file's bytes (as a build's manifest records a file).
    pub blake3: Option<String>,
    /// The digest was kept from an earlier read of this very file, unchanged since (its
    /// device, inode, size, modification and change times are those it had then).
    pub digest_kept: bool,
    pub size: Option<u64>,
    /// Why version and digest are unknown.
    pub unread: Option<String>,
    pub disk: Disk,
    /// Named by an element of the process's `LD_PRELOAD`.
    pub preloaded: bool,
    /// The fdl build whose manifest records a file of this digest; filled by the caller,
    /// which knows the builds (`None` from [`scan`]).
    pub build: Option<String>,
    #[serde(skip)]
    pub id: (u32, u32, u64),
}

/// The file on disk, now, against the one mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Disk {
    /// The path holds the file mapped.
    Same,
    /// The same file, written after the process started (its mtime is later). Not the
    /// ctime: a hard link made to it (uv and pip caches link one file into many venvs)
    /// changes that without touching a byte.
    Modified,
    /// The file mapped was unlinked and the path holds another file now.
    Replaced,
    /// The file mapped was unlinked and nothing is at its path.
    Deleted,
    /// The path holds another file though the kernel says the mapped one is not unlinked:
    /// another mount namespace, or a mount over it since.
    Elsewhere,
    /// The path cannot be looked at from here.
    Unseen,
}

impl Disk {
    pub fn word(self) -> &'static str {
        match self {
            Disk::Same => "same on disk",
            Disk::Modified => "MODIFIED on disk since the process started",
            Disk::Replaced => "REPLACED on disk since it was mapped",
            Disk::Deleted => "DELETED since it was mapped",
            Disk::Elsewhere => "the path shows another file (another mount namespace?)",
            Disk::Unseen => "its path cannot be looked at from here",
        }
    }

    /// Whether the file on disk is no longer what the process runs.
    pub fn differs(self) -> bool {
        matches!(self, Disk::Modified | Disk::Replaced | Disk::Deleted)
    }
}

/// One plugin a process maps.
#[derive(Debug, Clone, Serialize)]
pub struct MappedPlugin {
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub path: PathBuf,
    /// The plugin kinds it exports an entry of (`net`, `tuner`, …).
    pub kinds: Vec<&'static str>,
}

/// Where the calls go: a mapped file, and the NCCL it is (an index into
/// [`Process::nccl`]) when it is one; a file that is no NCCL interposes `nccl*`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Target {
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub path: PathBuf,
    pub nccl: Option<usize>,
}

/// How many bound slots point into one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlotsTo {
    pub target: Target,
    pub slots: usize,
}

/// Which NCCL the `nccl*` calls reach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum Reach {
    /// Every bound slot points into one file.
    One {
        target: Target,
        evidence: Evidence,
    },
    /// Bound slots point into different files.
    Split {
        targets: Vec<SlotsTo>,
        evidence: Evidence,
    },
    /// The process maps no NCCL.
    NoNccl,
    Unknown {
        reason: String,
    },
}

/// What an answer rests on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "evidence", rename_all = "snake_case")]
pub enum Evidence {
    /// The slots of `caller` read from `/proc/PID/mem`: `bound` of `slots` point into a
    /// mapped file (the others are not bound yet).
    Memory {
        #[serde(serialize_with = "crate::text::json_path::one")]
        caller: PathBuf,
        slots: usize,
        bound: usize,
    },
    /// The loader's rules over the maps, and why memory did not answer.
    Model { rule: Rule, memory: String },
}

/// Which rule of the loader the model used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "rule", rename_all = "snake_case")]
pub enum Rule {
    /// This `LD_PRELOAD` element names it: preloads come first in the global scope.
    Preloaded { element: String },
    /// It is the only NCCL mapped.
    OnlyOne,
}

impl Reach {
    /// The NCCL the calls reach, when one does.
    pub fn nccl(&self) -> Option<usize> {
        match self {
            Reach::One { target, .. } => target.nccl,
            _ => None,
        }
    }

    pub fn evidence(&self) -> Option<&Evidence> {
        match self {
            Reach::One { evidence, .. } | Reach::Split { evidence, .. } => Some(evidence),
            _ => None,
        }
    }
}

impl Evidence {
    /// The whole sentence: what was read, and why memory did not answer when it did not.
    pub fn long(&self) -> String {
        match self {
            Evidence::Memory {
                caller,
                slots,
                bound,
            } => format!(
                "its GOT, read from memory: {bound} of the {slots} nccl* slots of {} are bound there",
                file_name(caller)
            ),
            Evidence::Model { memory, .. } => format!(
                "{}; not from memory: {}",
                self.short(),
                crate::text::clean(memory)
            ),
        }
    }

    /// A few words: "read from memory (GOT of libtorch_cuda.so)" or "the loader's rules
    /// (…): memory …".
    pub fn short(&self) -> String {
        match self {
            Evidence::Memory { caller, .. } => format!(
                "its GOT, read from memory (the slots of {})",
                file_name(caller)
            ),
            Evidence::Model { rule, .. } => match rule {
                Rule::Preloaded { element } => format!(
                    "the loader's rules: LD_PRELOAD names it ({})",
                    crate::text::clean(element)
                ),
                Rule::OnlyOne => "the loader's rules: the only NCCL it maps".to_string(),
            },
        }
    }
}

impl MappedNccl {
    /// "NCCL 2.27.5 (CUDA 12.9)", or "an NCCL of unknown version".
    pub fn version_words(&self) -> String {
        match (&self.version, &self.cuda) {
            (Some(v), Some(c)) => format!("NCCL {v} (CUDA {c})"),
            (Some(v), None) => format!("NCCL {v}"),
            _ => "an NCCL of unknown version".to_string(),
        }
    }

    /// What is notable, after the version: digest, build, preload and disk state.
    pub fn tags(&self) -> String {
        let mut s = String::new();
        if self.kind == NcclKind::InLibtorch {
            s.push_str("  (linked into it)");
        }
        if let Some(d) = &self.blake3 {
            s.push_str(&format!("  blake3 {}…", &d[..d.len().min(12)]));
        }
        if let Some(b) = &self.build {
            s.push_str(&format!("  fdl build {}", crate::text::clean(b)));
        }
        if self.preloaded {
            s.push_str("  [LD_PRELOAD]");
        }
        if self.disk != Disk::Same {
            s.push_str(&format!("  [{}]", self.disk.word()));
        }
        if let Some(u) = &self.unread {
            s.push_str(&format!("  (unread: {})", crate::text::clean(u)));
        }
        s
    }

    /// Version and tags, then the path: two lines.
    pub fn lines(&self) -> [String; 2] {
        [
            format!("{}{}", self.version_words(), self.tags()),
            crate::text::shown(&self.path),
        ]
    }
}

impl Process {
    /// "rank 3 (RANK), local 1 (LOCAL_RANK)", or "no rank".
    pub fn rank_words(&self) -> String {
        match (&self.rank, &self.local_rank) {
            (Some(r), Some(l)) => format!(
                "rank {} ({}), local {} ({})",
                r.value, r.variable, l.value, l.variable
            ),
            (Some(r), None) => format!("rank {} ({})", r.value, r.variable),
            (None, Some(l)) => format!("local rank {} ({})", l.value, l.variable),
            (None, None) => "no rank".to_string(),
        }
    }

    /// What the calls reach, in a few words: "NCCL 2.27.5 libnccl.so.2 (memory)".
    pub fn reach_short(&self) -> String {
        match &self.reach {
            Reach::One { target, evidence } => {
                let how = match evidence {
                    Evidence::Memory { .. } => "memory",
                    Evidence::Model { .. } => "model",
                };
                match target.nccl.and_then(|i| self.nccl.get(i)) {
                    Some(n) => format!("{} {} ({how})", n.version_words(), file_name(&n.path)),
                    None => format!(
                        "{} (no NCCL: it interposes nccl*; {how})",
                        file_name(&target.path)
                    ),
                }
            }
            Reach::Split { targets, .. } => format!(
                "SPLIT across {}",
                targets
                    .iter()
                    .map(|t| format!("{} ×{}", file_name(&t.target.path), t.slots))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Reach::NoNccl => "maps no NCCL".to_string(),
            Reach::Unknown { .. } => "unknown".to_string(),
        }
    }

    /// The short rendering: one line.
    pub fn short(&self) -> String {
        format!(
            "pid {}  {}  {}  {}",
            self.pid,
            self.rank_words(),
            self.reach_short(),
            crate::text::fit(&self.command, 40).0
        )
    }

    /// The full rendering: a header line, then `(label, text)` rows.
    pub fn full(&self) -> (String, Vec<(&'static str, String)>) {
        let who = format!("pid {}  {}  ", self.pid, self.rank_words());
        let room = crate::text::WIDTH
            .saturating_sub(crate::text::columns(&who))
            .max(20);
        let head = format!("{who}{}", crate::text::fit(&self.command, room).0);
        let mut rows = Vec::new();
        let reached = self.reach.nccl();
        match &self.reach {
            Reach::One { target, evidence } => {
                match target.nccl.and_then(|i| self.nccl.get(i)) {
                    Some(n) => {
                        let [head, path] = n.lines();
                        rows.push(("calls reach", head));
                        rows.push(("", path));
                    }
                    None => rows.push((
                        "calls reach",
                        format!(
                            "{}, which is no NCCL: it interposes the nccl* calls",
                            crate::text::shown(&target.path)
                        ),
                    )),
                }
                rows.push(("by", evidence.long()));
            }
            Reach::Split { targets, evidence } => {
                for SlotsTo {
                    target: t,
                    slots: n,
                } in targets
                {
                    let what = match t.nccl.and_then(|i| self.nccl.get(i)) {
                        Some(x) => x.version_words(),
                        None => "no NCCL".to_string(),
                    };
                    rows.push(("SPLIT", format!("{n} slots → {what}")));
                    rows.push(("", crate::text::shown(&t.path)));
                }
                rows.push(("by", evidence.long()));
            }
            Reach::NoNccl => rows.push(("calls reach", "no NCCL: it maps none".to_string())),
            Reach::Unknown { reason } => rows.push((
                "calls reach",
                format!("unknown: {}", crate::text::clean(reason)),
            )),
        }
        for (i, n) in self.nccl.iter().enumerate() {
            if Some(i) != reached {
                let [head, path] = n.lines();
                rows.push(("also maps", head));
                rows.push(("", path));
            }
        }
        if !self.plugins.is_empty() {
            let p: Vec<String> = self
                .plugins
                .iter()
                .map(|p| format!("{} ({})", crate::text::shown(&p.path), p.kinds.join(", ")))
                .collect();
            rows.push(("plugins", p.join("; ")));
        }
        if !self.settings.is_empty() {
            let s: Vec<String> = self
                .settings
                .iter()
                .map(|s| format!("{}={}", s.name, s.value))
                .collect();
            rows.push(("NCCL_*", s.join(" ")));
        }
        if let Some(p) = &self.ld_preload {
            rows.push(("LD_PRELOAD", p.clone()));
        }
        if let Some(e) = &self.environment_unread {
            rows.push(("environment", format!("unread: {}", crate::text::clean(e))));
        }
        (head, rows)
    }
}

/// What the ranks among the processes say together.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Agreement {
    /// No process with a rank maps an NCCL.
    NoRanks,
    /// Every ranked process reaches the same file (by digest).
    Same { ranks: usize, version: String },
    /// They reach different NCCL files: `(version or "unknown", digest, pids)`.
    Differ { groups: Vec<Group> },
    /// Some ranked process's answer is unknown or split.
    Unknown { pids: Vec<u32> },
}

/// Ranked processes that reach one NCCL file.
#[derive(Debug, Clone, Serialize)]
pub struct Group {
    pub version: Option<String>,
    pub blake3: Option<String>,
    pub pids: Vec<u32>,
}

/// Which NCCL each ranked process reaches, grouped by the file's digest.
pub fn agreement(processes: &[Process]) -> Agreement {
    let ranked: Vec<&Process> = processes
        .iter()
        .filter(|p| p.rank.is_some() && !p.nccl.is_empty())
        .collect();
    if ranked.is_empty() {
        return Agreement::NoRanks;
    }
    let unknown: Vec<u32> = ranked
        .iter()
        .filter(|p| p.reach.nccl().is_none())
        .map(|p| p.pid)
        .collect();
    if !unknown.is_empty() {
        return Agreement::Unknown { pids: unknown };
    }
    let mut groups: BTreeMap<(Option<String>, Option<String>), Vec<u32>> = BTreeMap::new();
    for p in &ranked {
        let n = &p.nccl[p.reach.nccl().unwrap_or(0)];
        groups
            .entry((n.blake3.clone(), n.version.clone()))
            .or_default()
            .push(p.pid);
    }
    if groups.len() == 1 {
        let ((_, version), pids) = groups.into_iter().next().unwrap_or_default();
        return Agreement::Same {
            ranks: pids.len(),
            version: version.unwrap_or_else(|| "unknown".into()),
        };
    }
    Agreement::Differ {
        groups: groups
            .into_iter()
            .map(|((blake3, version), pids)| Group {
                version,
                blake3,
                pids,
            })
            .collect(),
    }
}

/// The last component of a path, cleaned.
pub fn file_name(p: &Path) -> String {
    crate::text::clean(&p.file_name().unwrap_or(p.as_os_str()).to_string_lossy())
}

/// Whether a mapped file of this name may be or hold an NCCL: `libnccl.so*`, and torch's
/// CUDA libraries (`libtorch_cuda.so`, and `libtorch_cuda_cpp.so` / `libtorch_cuda_cu.so`
/// of torch ≤ 1.13's split build), which may have NCCL linked in. Its self-id decides.
pub fn may_hold_nccl(file_name: &[u8]) -> bool {
    file_name.starts_with(b"libnccl.so") || file_name.starts_with(b"libtorch_cuda")
}

/// Reads every process asked about.
pub fn scan(opts: &Options) -> Scan {
    let me = std::process::id();
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let mut refused = Vec::new();
    let pids: Vec<(u32, bool)> = match &opts.pids {
        Some(p) => p.iter().map(|&p| (p, true)).collect(),
        None => all_pids()
            .into_iter()
            .filter(|&p| p != me)
            .map(|p| (p, false))
            .collect(),
    };
    let ctx = Context::new();
    let mut processes = Vec::new();
    let mut looked_at = 0;
    for (pid, asked) in pids {
        let dir = PathBuf::from(format!("/proc/{pid}"));
        let owner = match std::fs::metadata(&dir) {
            Ok(m) => m.uid(),
            Err(_) => {
                if asked {
                    refused.push(Refused {
                        pid,
                        reason: "no such process is visible: it ended, or /proc hides other users' processes (mounted with hidepid)".into(),
                    });
                }
                continue;
            }
        };
        if !asked && owner != euid {
            continue;
        }
        looked_at += 1;
        match read_process(pid, owner, asked, opts, &ctx) {
            Ok(Some(p)) => processes.push(p),
            Ok(None) => {}
            Err(reason) => {
                if asked || !reason.gone {
                    refused.push(Refused {
                        pid,
                        reason: reason.why,
                    });
                }
            }
        }
    }
    Scan {
        processes,
        refused,
        looked_at,
    }
}

/// The pids `/proc` lists, ascending.
fn all_pids() -> Vec<u32> {
    let mut out: Vec<u32> = std::fs::read_dir("/proc")
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .take(MAX_PIDS)
                .collect()
        })
        .unwrap_or_default();
    out.sort_unstable();
    out
}

/// What the scan learned of files, by `(major, minor, inode)`: each read once.
struct Context {
    objects: std::cell::RefCell<HashMap<(u32, u32, u64), ObjectFacts>>,
    boot: Option<i64>,
    ticks: i64,
}

/// One mapped file's facts, as far as they could be read.
#[derive(Clone, Default)]
struct ObjectFacts {
    /// The path it was read through (the mapped path, or `/proc/PID/map_files/…`).
    read_as: Option<PathBuf>,
    unread: Option<String>,
    imports_nccl: bool,
    plugin_kinds: Vec<&'static str>,
    self_id: Option<crate::inspect::selfid::SelfId>,
    self_id_error: Option<String>,
    blake3: Option<String>,
    digest_kept: bool,
    size: Option<u64>,
}

impl Context {
    fn new() -> Context {
        let boot = crate::fsread::read_text_if_present(Path::new("/proc/stat"), 1 << 20)
            .ok()
            .flatten()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("btime "))
                    .and_then(|v| v.trim().parse().ok())
            });
        // SAFETY: sysconf has no preconditions.
        #[allow(clippy::unnecessary_cast)] // c_long is i32 on 32-bit targets
        let ticks = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
            n if n > 0 => n,
            _ => 100,
        };
        Context {
            objects: Default::default(),
            boot,
            ticks,
        }
    }
}

struct Failure {
    why: String,
    /// The process ended while it was read.
    gone: bool,
}

/// Reads `cap` bytes at most of a `/proc` file; `Ok((bytes, whole))`.
fn read_proc(path: &Path, cap: u64) -> std::io::Result<(Vec<u8>, bool)> {
    // Room for a usual file up front: /proc files report no size, so a read that starts
    // from nothing probes 32 bytes then doubles, one read each (8 reads for a small maps).
    let mut out = Vec::with_capacity(cap.min(PROC_READ_START) as usize + 1);
    std::fs::File::open(path)?
        .take(cap + 1)
        .read_to_end(&mut out)?;
    let whole = out.len() as u64 <= cap;
    out.truncate(cap as usize);
    Ok((out, whole))
}

fn io_failure(pid: u32, what: &str, e: &std::io::Error, owner: u32) -> Failure {
    let gone = e.raw_os_error() == Some(libc::ESRCH) || e.kind() == std::io::ErrorKind::NotFound;
    let why = if gone {
        "it ended while fdl read it".to_string()
    } else if matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM)) {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if owner != me {
            format!("/proc refuses its {what}: it belongs to user {owner}, and only its owner (or root) may read it; run fdl as that user")
        } else {
            format!("/proc refuses its {what} ({e}): the process is not dumpable, or a security module forbids it")
        }
    } else {
        format!("/proc/{pid}/{what} cannot be read: {e}")
    };
    Failure { why, gone }
}

fn read_process(
    pid: u32,
    owner: u32,
    asked: bool,
    opts: &Options,
    ctx: &Context,
) -> Result<Option<Process>, Failure> {
    let dir = PathBuf::from(format!("/proc/{pid}"));
    let (text, whole) =
        read_proc(&dir.join("maps"), MAPS_BYTES).map_err(|e| io_failure(pid, "maps", &e, owner))?;
    if !whole {
        return Err(Failure {
            why: format!(
                "its memory map is larger than the {} MiB fdl reads",
                MAPS_BYTES >> 20
            ),
            gone: false,
        });
    }
    let maps = procmaps::parse_maps(&text);
    let named = |m: &Mapping, prefix: &str| {
        m.path
            .as_deref()
            .and_then(Path::file_name)
            .is_some_and(|n| n.as_bytes().starts_with(prefix.as_bytes()))
    };
    let candidate = |m: &Mapping| {
        m.path
            .as_deref()
            .and_then(Path::file_name)
            .is_some_and(|n| may_hold_nccl(n.as_bytes()))
    };
    if !asked && !maps.iter().any(candidate) {
        return Ok(None);
    }
    let (ppid, started) = read_stat(&dir, ctx);
    let command = read_proc(&dir.join("cmdline"), CMDLINE_BYTES)
        .map(|(b, whole)| command_line(&b, whole))
        .unwrap_or_default();
    let env = read_proc(&dir.join("environ"), ENVIRON_BYTES);
    let (vars, environment_unread) = match env {
        Ok((b, true)) => (parse_environ(&b), None),
        Ok((_, false)) => (
            Vec::new(),
            Some(format!(
                "its environment is larger than the {} MiB fdl reads",
                ENVIRON_BYTES >> 20
            )),
        ),
        Err(e) => (Vec::new(), Some(io_failure(pid, "environ", &e, owner).why)),
    };
    let var = |name: &str| {
        vars.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let rank_of = |names: &[&'static str]| {
        names.iter().find_map(|&n| {
            var(n)
                .and_then(|v| v.trim().parse().ok())
                .map(|value| Rank { variable: n, value })
        })
    };
    let ld_preload = var("LD_PRELOAD").map(crate::text::clean);
    let mut settings: Vec<Setting> = vars
        .iter()
        .filter(|(k, _)| {
            k.starts_with("NCCL_")
                && k.bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        })
        .map(|(k, v)| Setting {
            name: k.clone(),
            value: crate::text::fit(&crate::text::clean(v), SETTING_CHARS).0,
        })
        .collect();
    settings.sort_by(|a, b| a.name.cmp(&b.name));
    settings.dedup_by(|a, b| a.name == b.name);
    settings.truncate(MAX_SETTINGS);

    // Each distinct file once, at its first mapping (the lowest address).
    let mut firsts: Vec<&Mapping> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for m in &maps {
        if m.path.is_some() && m.inode != 0 && seen.insert((m.dev, m.inode)) {
            firsts.push(m);
            if firsts.len() >= MAX_OBJECTS {
                break;
            }
        }
    }
    let preload_elements: Vec<String> = var("LD_PRELOAD")
        .map(|v| {
            super::preload::split_ld_preload(v)
                .into_iter()
                .filter(|e| e.dropped.is_none())
                .map(|e| e.name)
                .collect()
        })
        .unwrap_or_default();
    let mut nccl = Vec::new();
    let mut plugins = Vec::new();
    let mut callers: Vec<(&Mapping, ObjectFacts)> = Vec::new();
    for m in &firsts {
        let (shown_path, deleted) = strip_deleted(m.path.as_deref().unwrap_or(Path::new("")));
        let facts = object_facts(
            pid,
            m,
            &shown_path,
            deleted,
            ctx,
            candidate(m),
            opts.digest_cache.as_deref(),
        );
        let holds_nccl = candidate(m) && facts.self_id.is_some();
        if holds_nccl || (named(m, "libnccl.so") && facts.unread.is_some()) {
            let kind = if named(m, "libnccl.so") {
                NcclKind::Library
            } else {
                NcclKind::InLibtorch
            };
            let disk = disk_state(m, &shown_path, deleted, started);
            nccl.push(MappedNccl {
                preloaded: preload_elements
                    .iter()
                    .any(|e| preload_names(e, &shown_path, m)),
                path: shown_path.clone(),
                kind,
                version: facts.self_id.as_ref().map(|s| s.nccl.to_string()),
                cuda: facts.self_id.as_ref().map(|s| s.cuda.to_string()),
                blake3: facts.blake3.clone(),
                digest_kept: facts.digest_kept,
                size: facts.size,
                unread: facts.unread.clone().or(facts.self_id_error.clone()),
                disk,
                build: None,
                id: (m.dev.0, m.dev.1, m.inode),
            });
        }
        if !facts.plugin_kinds.is_empty() {
            plugins.push(MappedPlugin {
                path: shown_path.clone(),
                kinds: facts.plugin_kinds.clone(),
            });
        }
        // The callers: objects that import nccl*, and a libtorch CUDA library with NCCL
        // linked in (its calls go through its own slots). An NCCL library's slots are its
        // internal calls, not the program's.
        if (facts.imports_nccl && !named(m, "libnccl.so"))
            || (holds_nccl && !named(m, "libnccl.so"))
        {
            callers.push((m, facts));
        }
    }
    let reach = if nccl.is_empty() {
        Reach::NoNccl
    } else {
        reach(pid, &maps, &callers, &nccl, &preload_elements, opts, owner)
    };
    Ok(Some(Process {
        pid,
        ppid,
        uid: owner,
        command,
        rank: rank_of(&RANK_VARIABLES),
        local_rank: rank_of(&LOCAL_RANK_VARIABLES),
        nccl,
        reach,
        plugins,
        settings,
        ld_preload,
        environment_unread,
        started,
    }))
}

/// `(ppid, start time in seconds since the epoch)` from `/proc/PID/stat`.
fn read_stat(dir: &Path, ctx: &Context) -> (u32, Option<i64>) {
    let Some(stat) = read_proc(&dir.join("stat"), 4096)
        .ok()
        .and_then(|(b, _)| parse_stat(&b))
    else {
        return (0, None);
    };
    let started = stat
        .start_ticks
        .zip(ctx.boot)
        .map(|(t, boot)| boot + t / ctx.ticks);
    (stat.ppid, started)
}

/// What fdl reads of a process's `/proc/PID/stat`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// `R`, `S`, `Z` (a zombie), `X` (dead), …
    pub state: String,
    pub ppid: u32,
    /// When it started, in clock ticks after boot (field 22).
    pub start_ticks: Option<i64>,
}

impl Stat {
    /// Ended, not yet reaped (or dead).
    pub fn zombie(&self) -> bool {
        self.state == "Z" || self.state == "X"
    }
}

/// Parses `/proc/PID/stat`: "pid (comm) state ppid …", where comm may hold ')' and
/// spaces, so the last ')' ends it.
pub fn parse_stat(b: &[u8]) -> Option<Stat> {
    let close = b.iter().rposition(|&c| c == b')')?;
    let rest = String::from_utf8_lossy(&b[close + 1..]);
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    Some(Stat {
        state: f.first()?.to_string(),
        ppid: f.get(1)?.parse().ok()?,
        // Field 22 is the 20th after the comm.
        start_ticks: f.get(19).and_then(|v| v.parse().ok()),
    })
}

/// The command line, arguments joined by spaces, cleaned and cut.
fn command_line(b: &[u8], whole: bool) -> String {
    let args: Vec<String> = b
        .split(|&c| c == 0)
        .filter(|a| !a.is_empty())
        .map(|a| crate::text::clean(&String::from_utf8_lossy(a)))
        .collect();
    let mut s = args.join(" ");
    if !whole {
        s.push_str(" …");
    }
    crate::text::fit(&s, COMMAND_CHARS).0
}

/// `NAME=value` pairs of an environment block; entries without `=` are skipped.
fn parse_environ(b: &[u8]) -> Vec<(String, String)> {
    b.split(|&c| c == 0)
        .filter_map(|e| {
            let i = e.iter().position(|&c| c == b'=')?;
            Some((
                String::from_utf8_lossy(&e[..i]).into_owned(),
                String::from_utf8_lossy(&e[i + 1..]).into_owned(),
            ))
        })
        .collect()
}

/// The path without the kernel's ` (deleted)` mark, and whether it had one.
fn strip_deleted(p: &Path) -> (PathBuf, bool) {
    const MARK: &[u8] = b" (deleted)";
    let b = p.as_os_str().as_bytes();
    match b.strip_suffix(MARK) {
        Some(rest) => (PathBuf::from(OsStr::from_bytes(rest)), true),
        None => (p.to_path_buf(), false),
    }
}

/// Whether an `LD_PRELOAD` element names this mapped file: a path equal to it (or one
/// that leads to a regular file with its device and inode: the loader opens the element
/// following links, and a build's `lib/libnccl.so.2`, what `fdl nccl env` preloads, is a
/// link to `libnccl.so.X.Y.Z`), or a bare name equal to its file name (the loader
/// searched for it).
fn preload_names(element: &str, path: &Path, m: &Mapping) -> bool {
    if !element.contains('/') {
        return path
            .file_name()
            .is_some_and(|n| n.as_bytes() == element.as_bytes());
    }
    if Path::new(element) == path {
        return true;
    }
    std::fs::metadata(element).is_ok_and(|md| {
        md.file_type().is_file()
            && (libc::major(md.dev()), libc::minor(md.dev())) == m.dev
            && md.ino() == m.inode
    })
}

fn same_id(md: &std::fs::Metadata, m: &Mapping) -> bool {
    (libc::major(md.dev()), libc::minor(md.dev())) == m.dev && md.ino() == m.inode
}

fn disk_state(m: &Mapping, path: &Path, deleted: bool, started: Option<i64>) -> Disk {
    let now = std::fs::symlink_metadata(path);
    match (deleted, now) {
        (true, Ok(_)) => Disk::Replaced,
        (true, Err(_)) => Disk::Deleted,
        (false, Ok(md)) if same_id(&md, m) => match started {
            Some(s) if md.mtime() > s => Disk::Modified,
            _ => Disk::Same,
        },
        (false, Ok(_)) => Disk::Elsewhere,
        (false, Err(_)) => Disk::Unseen,
    }
}

/// Reads what fdl needs of one mapped file, once per scan. `deep`: also its NCCL self-id
/// and digest (the NCCL candidates).
fn object_facts(
    pid: u32,
    m: &Mapping,
    path: &Path,
    deleted: bool,
    ctx: &Context,
    deep: bool,
    keep: Option<&Path>,
) -> ObjectFacts {
    let key = (m.dev.0, m.dev.1, m.inode);
    if let Some(f) = ctx.objects.borrow().get(&key) {
        if !deep || f.self_id.is_some() || f.self_id_error.is_some() || f.unread.is_some() {
            return f.clone();
        }
    }
    let mut facts = ObjectFacts::default();
    // The mapped path first, when it still holds the mapped file; else the kernel's own
    // handle on the mapping (root only).
    let mut tries = Vec::new();
    if !deleted && std::fs::metadata(path).is_ok_and(|md| same_id(&md, m)) {
        tries.push(path.to_path_buf());
    }
    tries.push(PathBuf::from(format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        m.start, m.end
    )));
    let mut last_err = String::new();
    for t in tries {
        let r = Source::with_file(&t, |src| {
            if src
                .file_id()
                .map(|(d, i)| (libc::major(d), libc::minor(d), i))
                != Some(key)
            {
                anyhow::bail!(
                    "the file at {} is not the one mapped",
                    crate::text::shown(&t)
                );
            }
            read_facts(src, path, deep, keep, &mut facts)
        });
        match r {
            Ok(()) => {
                facts.read_as = Some(t);
                facts.unread = None;
                break;
            }
            Err(e) => {
                last_err = crate::text::clean(&format!("{e:#}"));
            }
        }
    }
    if facts.read_as.is_none() {
        facts.unread = Some(if deleted {
            "the file was unlinked since it was mapped, and only root may read it through /proc/PID/map_files".to_string()
        } else {
            last_err
        });
    }
    ctx.objects.borrow_mut().insert(key, facts.clone());
    facts
}

fn read_facts(
    src: &Source<'_>,
    path: &Path,
    deep: bool,
    keep: Option<&Path>,
    facts: &mut ObjectFacts,
) -> anyhow::Result<()> {
    if !inspect::elf::is_elf(src.bytes_clipped(0, 16)) {
        return Ok(());
    }
    facts.imports_nccl = !interpose::imported_nccl_in(src)?.is_empty();
    let entries: Vec<&'static str> = super::plugins::Kind::ALL
        .iter()
        .map(|k| k.entry())
        .collect();
    let exported = interpose::exported_with_prefixes_in(src, &entries)?;
    for k in super::plugins::Kind::ALL {
        if exported.iter().any(|s| s.starts_with(k.entry())) {
            facts.plugin_kinds.push(k.name());
        }
    }
    if deep {
        match inspect::find_nccl_self_id_in(src, path) {
            Ok(id) => facts.self_id = id,
            Err(e) => facts.self_id_error = Some(crate::text::clean(&format!("{e:#}"))),
        }
        if facts.self_id.is_some() || facts.self_id_error.is_some() {
            let hash = || -> anyhow::Result<String> {
                Ok(blake3_hex(src.bytes(0, src.len())?, cores(), SPLIT_BYTES))
            };
            facts.blake3 = Some(match (keep, src.metadata()) {
                // Kept by the file's identity (device, inode, size, times to the
                // nanosecond): hashing a released NCCL takes longer than the rest of a
                // scan, and its change time, which moves on any write, says the bytes are
                // those hashed before.
                (Some(cache), Some(meta)) => {
                    let identity = format!("blake3\0{}", crate::cache::file_identity(&meta));
                    let (d, kept) = crate::cache::kept_digest(cache, &identity, &meta, || {
                        Ok((hash()?, src.metadata()))
                    })?;
                    facts.digest_kept = kept;
                    d
                }
                _ => hash()?,
            });
            facts.size = Some(src.len());
        }
    }
    Ok(())
}

/// A file is hashed on several cores from this size on, and no piece is smaller.
const SPLIT_BYTES: usize = 16 << 20;

/// The cores this process may run on (1 when unknown).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// BLAKE3 of `bytes` in hex, the subtrees hashed on up to `threads` threads. The input is
/// cut only where BLAKE3's own tree is cut (`hazmat::left_subtree_len`), and the pieces'
/// chaining values are merged as the tree merges them, so the digest is `blake3::hash`'s.
/// An NCCL is 200–450 MB: one core hashes it in 0.15–0.3 s, most of a scan's time.
fn blake3_hex(bytes: &[u8], threads: usize, split: usize) -> String {
    use blake3::hazmat::{left_subtree_len, merge_subtrees_root, Mode};
    if threads < 2 || bytes.len() < split.max(2 * blake3::CHUNK_LEN) {
        return blake3::hash(bytes).to_hex().to_string();
    }
    // Twice as many pieces as threads: the two halves of the tree are unequal (the left
    // one is a power of two of chunks) and the scheduler evens out the rest.
    let depth = (2 * threads).next_power_of_two().trailing_zeros();
    let left = left_subtree_len(bytes.len() as u64) as usize;
    let (l, r) = std::thread::scope(|s| {
        let l = s.spawn(|| subtree(&bytes[..left], 0, depth - 1, split));
        let r = subtree(&bytes[left..], left as u64, depth - 1, split);
        (l.join().expect("a hashing thread panicked"), r)
    });
    merge_subtrees_root(&l, &r, Mode::Hash).to_hex().to_string()
}

/// The chaining value of the subtree `bytes` at `offset` (a valid BLAKE3 subtree: its
/// offset a multiple of a power of two of chunks no shorter than it), split `depth` more
/// times across threads.
fn subtree(bytes: &[u8], offset: u64, depth: u32, split: usize) -> blake3::hazmat::ChainingValue {
    use blake3::hazmat::{left_subtree_len, merge_subtrees_non_root, HasherExt, Mode};
    if depth == 0 || bytes.len() < split.max(2 * blake3::CHUNK_LEN) {
        return blake3::Hasher::new()
            .set_input_offset(offset)
            .update(bytes)
            .finalize_non_root();
    }
    let left = left_subtree_len(bytes.len() as u64) as usize;
    let (l, r) = std::thread::scope(|s| {
        let l = s.spawn(|| subtree(&bytes[..left], offset, depth - 1, split));
        let r = subtree(&bytes[left..], offset + left as u64, depth - 1, split);
        (l.join().expect("a hashing thread panicked"), r)
    });
    merge_subtrees_non_root(&l, &r, Mode::Hash)
}

/// Which NCCL the calls reach: the slots in memory, else the loader's rules.
fn reach(
    pid: u32,
    maps: &[Mapping],
    callers: &[(&Mapping, ObjectFacts)],
    nccl: &[MappedNccl],
    preload: &[String],
    opts: &Options,
    owner: u32,
) -> Reach {
    let memory = if opts.no_memory {
        Err("not read (--no-memory)".to_string())
    } else {
        from_memory(pid, maps, callers, nccl, owner)
    };
    let why_not = match memory {
        Ok(r) => return r,
        Err(why) => why,
    };
    let model = |rule: Rule, i: usize| Reach::One {
        target: Target {
            path: nccl[i].path.clone(),
            nccl: Some(i),
        },
        evidence: Evidence::Model {
            rule,
            memory: why_not.clone(),
        },
    };
    // A preloaded NCCL comes first in the global scope: every call by name reaches it.
    for e in preload {
        if let Some(i) = nccl.iter().position(|n| {
            n.kind == NcclKind::Library && {
                let m = Mapping {
                    start: 0,
                    end: 0,
                    offset: 0,
                    dev: (n.id.0, n.id.1),
                    inode: n.id.2,
                    path: None,
                };
                preload_names(e, &n.path, &m)
            }
        }) {
            return model(Rule::Preloaded { element: e.clone() }, i);
        }
    }
    if nccl.len() == 1 {
        return model(Rule::OnlyOne, 0);
    }
    Reach::Unknown {
        reason: format!(
            "{} NCCL files are mapped and its GOT was not read ({}); which one answers depends on the order they were loaded in, which /proc does not keep",
            nccl.len(),
            why_not
        ),
    }
}

/// The answer of the bound slots, or why memory does not answer.
fn from_memory(
    pid: u32,
    maps: &[Mapping],
    callers: &[(&Mapping, ObjectFacts)],
    nccl: &[MappedNccl],
    owner: u32,
) -> Result<Reach, String> {
    if callers.is_empty() {
        return Err("no mapped object imports nccl*: the calls go through dlsym".into());
    }
    let mem = std::fs::File::open(format!("/proc/{pid}/mem"))
        .map_err(|e| io_failure(pid, "memory", &e, owner).why)?;
    let mut counts: Vec<(Target, usize)> = Vec::new();
    let mut total = 0;
    let mut first_caller = None;
    for (lib, facts) in callers {
        let Some(read_as) = &facts.read_as else {
            continue;
        };
        let slots = match interpose::nccl_slots(read_as) {
            Ok(s) => s,
            Err(e) => return Err(crate::text::clean(&format!("{e:#}"))),
        };
        let lib_path = strip_deleted(lib.path.as_deref().unwrap_or(Path::new(""))).0;
        if slots.slots.is_empty() {
            continue;
        }
        let own = nccl
            .iter()
            .position(|n| n.id == (lib.dev.0, lib.dev.1, lib.inode));
        // A libnccl's slots say where NCCL's calls to itself go, not the program's: a
        // second NCCL mapped and never called (torch's sys.path one behind a preload)
        // binds them to itself, or to the first NCCL in the global scope.
        if own.is_some_and(|i| nccl[i].kind == NcclKind::Library) {
            continue;
        }
        let base = procmaps::load_base(maps, lib, &slots)?;
        first_caller.get_or_insert(lib_path.clone());
        for s in &slots.slots {
            total += 1;
            let Some(at) = base.checked_add(s.vaddr) else {
                continue;
            };
            let mut word = [0u8; 8];
            std::os::unix::fs::FileExt::read_exact_at(&mem, &mut word, at)
                .map_err(|e| io_failure(pid, "memory", &e, owner).why)?;
            // The process runs on this machine: its byte order is fdl's.
            let v = u64::from_ne_bytes(word);
            let Some(m) = maps.iter().find(|m| m.start <= v && v < m.end) else {
                continue;
            };
            let target = if m.same_file(lib) {
                // Into the caller itself: its own NCCL where it holds one; else a lazy
                // PLT slot not bound yet.
                match own {
                    Some(i) => Target {
                        path: nccl[i].path.clone(),
                        nccl: Some(i),
                    },
                    None => continue,
                }
            } else {
                let Some(p) = &m.path else { continue };
                let p = strip_deleted(p).0;
                Target {
                    nccl: nccl
                        .iter()
                        .position(|n| n.id == (m.dev.0, m.dev.1, m.inode)),
                    path: p,
                }
            };
            match counts.iter_mut().find(|(t, _)| *t == target) {
                Some((_, c)) => *c += 1,
                None => counts.push((target, 1)),
            }
        }
    }
    let Some(caller) = first_caller else {
        return Err(
            "no object but an NCCL library has nccl* slots (nothing that calls NCCL is loaded yet, or its calls go through dlsym)"
                .into(),
        );
    };
    let bound: usize = counts.iter().map(|(_, c)| c).sum();
    let evidence = Evidence::Memory {
        caller,
        slots: total,
        bound,
    };
    match counts.len() {
        0 => Err("no nccl* slot is bound yet (lazy binding: no NCCL call was made)".into()),
        1 => Ok(Reach::One {
            target: counts.remove(0).0,
            evidence,
        }),
        _ => {
            counts.sort_by_key(|c| std::cmp::Reverse(c.1));
            Ok(Reach::Split {
                targets: counts
                    .into_iter()
                    .map(|(target, slots)| SlotsTo { target, slots })
                    .collect(),
                evidence,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deleted_mark_is_taken_off() {
        assert_eq!(
            strip_deleted(Path::new("/a/libnccl.so.2 (deleted)")),
            (PathBuf::from("/a/libnccl.so.2"), true)
        );
        assert_eq!(
            strip_deleted(Path::new("/a/libnccl.so.2")),
            (PathBuf::from("/a/libnccl.so.2"), false)
        );
    }

    #[test]
    fn a_stat_line_is_read_past_a_name_with_parentheses_and_spaces() {
        let mut line = b"4242 (evil) S 1 (x) Z 7 ".to_vec();
        line.extend(b"4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1 2 3");
        let stat = parse_stat(&line).unwrap();
        assert_eq!(
            stat,
            Stat {
                state: "Z".into(),
                ppid: 7,
                start_ticks: Some(987654),
            }
        );
        assert!(stat.zombie());
        assert_eq!(parse_stat(b"12 (no close"), None);
        assert_eq!(parse_stat(b"12 (sh) S notanumber"), None);
    }

    #[test]
    fn a_command_line_is_cleaned_and_joined() {
        assert_eq!(
            command_line(b"python\0-c\0import torch\x1b[31m\0", true),
            "python -c import torch?[31m".replace('?', &crate::text::clean("\x1b"))
        );
        assert!(command_line(b"a\0b", false).ends_with(" …"));
    }

    #[test]
    fn an_environment_block_keeps_values_with_equals_signs() {
        assert_eq!(
            parse_environ(b"A=1\0NCCL_X=a=b\0junk\0"),
            vec![
                ("A".to_string(), "1".to_string()),
                ("NCCL_X".to_string(), "a=b".to_string())
            ]
        );
    }

    #[test]
    fn the_digest_on_several_threads_is_blake3s() {
        // Sizes around chunk and subtree edges; pieces as small as 2 chunks.
        let data: Vec<u8> = (0..(1u32 << 20) + 3000)
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        for len in [
            0,
            1,
            1024,
            1025,
            2048,
            2049,
            4096 * 3 + 5,
            65536,
            1 << 20,
            data.len(),
        ] {
            let want = blake3::hash(&data[..len]).to_hex().to_string();
            for threads in [1, 2, 3, 8] {
                assert_eq!(
                    blake3_hex(&data[..len], threads, 2048),
                    want,
                    "{len} bytes, {threads} threads"
                );
            }
        }
    }

    #[test]
    fn this_process_is_read_and_maps_no_nccl() {
        let s = scan(&Options {
            pids: Some(vec![std::process::id()]),
            ..Options::default()
        });
        assert_eq!(s.processes.len(), 1, "{:?}", s.refused);
        assert_eq!(s.processes[0].reach, Reach::NoNccl);
        assert!(s.processes[0].nccl.is_empty());
    }

    #[test]
    fn a_pid_that_does_not_exist_is_refused_with_a_reason() {
        let s = scan(&Options {
            pids: Some(vec![u32::MAX - 1]),
            ..Options::default()
        });
        assert!(s.processes.is_empty());
        assert!(s.refused[0].reason.contains("no such process"));
    }
}
