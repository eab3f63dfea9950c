//! The Python witness: which NCCL a Python process that imports torch really calls,
//! read from a live interpreter.
//!
//! The loader model is not enough for Python: torch's `__init__.py` loads an NCCL with
//! `ctypes` from the first `sys.path` entry holding `nvidia/nccl/lib/libnccl.so.*`
//! before `libtorch_cuda.so` loads, so the process may run another NCCL than a program
//! linking the same libtorch. [`ask_python`] runs the variant's own interpreter as
//! `python -c` (so `sys.path[0]` is the working directory, as a `python -c` job has) in
//! the job's environment with `CUDA_VISIBLE_DEVICES` empty, imports torch — torch's own
//! code, which the job runs anyway, and nothing else: no CUDA call — and, while the
//! child waits on its stdin, reads from outside which NCCL files it maps
//! (`/proc/PID/maps`) and where `libtorch_cuda.so`'s `nccl*` GOT and PLT slots point
//! (`/proc/PID/mem` of fdl's own child, at the load base plus each relocation's
//! `r_offset`, read from the file whose device and inode the mapping names). Then the
//! child's process group is killed and reaped, on every path ([`ChildGuard`]).
//!
//! Trust: only an interpreter and a torch that belong to this user or root and that no
//! one else can write are run ([`NoPythonWitness::Untrusted`]); the interpreter must
//! import exactly that torch ([`NoPythonWitness::OtherTorch`], checked in the child with
//! `importlib.util.find_spec` before torch's code runs). Bounds: [`Limits`].

pub use super::procmaps::{parse_maps, Mapping};
use crate::inspect::interpose::{self, NcclSlots};
use serde::Serialize;
use std::ffi::{OsStr, OsString};
use std::io::{BufRead, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What the child prints on its stdout once torch is imported.
const READY: &str = "fdl-pywitness: ready";
/// What the child prints when `torch` would not be the checked one (then the origin it
/// found, `repr`-ed, on the next line) before exiting with [`OTHER_TORCH_EXIT`].
const OTHER_TORCH: &str = "fdl-pywitness: other torch";
const OTHER_TORCH_EXIT: i32 = 86;

/// What one Python witness may cost.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// From the start to the ready line; then the child is killed (its process group).
    pub time: Duration,
    /// The child's address space (`RLIMIT_AS`). Importing torch 2.15 (CUDA 13, x86-64)
    /// maps about 3 GiB of address space and 0.5–0.65 GiB resident, measured; 32 GiB
    /// leaves a tenfold margin for other builds and allocators while still stopping a
    /// runaway. `RLIMIT_DATA` is not used: glibc's malloc arenas and torch's own reserve
    /// `mmap`s count there too, and the figure is no easier to bound.
    pub memory: u64,
    /// Bytes of stdout read before the ready line, and of stderr's tail kept.
    pub output_bytes: usize,
    /// Bytes of `/proc/PID/maps` read (torch maps a few thousand lines, ~0.5 MiB).
    pub maps_bytes: u64,
    /// The largest file the child may write (`RLIMIT_FSIZE`).
    pub file_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            time: Duration::from_secs(120),
            memory: 32 << 30,
            output_bytes: 64 << 10,
            maps_bytes: 64 << 20,
            file_bytes: 64 << 20,
        }
    }
}

/// How to start the job's interpreter.
#[derive(Debug, Clone)]
pub struct PythonLaunch {
    /// The variant's interpreter, as the job names it (a venv's `bin/python`, usually a
    /// link to the base interpreter: run by this name, so the venv is found).
    pub interpreter: PathBuf,
    /// `…/site-packages/torch`: the torch that must be imported.
    pub torch_dir: PathBuf,
    pub cwd: PathBuf,
    /// The child's whole environment (`CUDA_VISIBLE_DEVICES` and
    /// `PYTHONDONTWRITEBYTECODE` are set over it).
    pub env: Vec<(OsString, OsString)>,
}

/// Where one slot of `libtorch_cuda.so` points in the running process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reach {
    /// Into this mapped file.
    File { path: PathBuf },
    /// Into `libtorch_cuda.so` itself: a lazy PLT slot not yet bound (its first call
    /// binds it), or a definition of its own.
    Unbound,
    /// Into no file mapping (anonymous memory, or nothing).
    Unmapped { address: u64 },
}

/// One `nccl*` slot of `libtorch_cuda.so` and where it points.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Call {
    pub symbol: String,
    /// `GLOB_DAT`, `JUMP_SLOT` or `ABS64`.
    pub slot: &'static str,
    pub reach: Reach,
}

/// What the live interpreter showed.
#[derive(Debug, Clone, Serialize)]
pub struct PythonWitness {
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub interpreter: PathBuf,
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub torch_dir: PathBuf,
    /// Files mapped whose name starts `libnccl.so`, in maps order, each once.
    #[serde(serialize_with = "crate::text::json_path::many")]
    pub mapped_nccl: Vec<PathBuf>,
    /// The `libtorch_cuda.so` mapped, if any (a CPU-only torch has none).
    #[serde(serialize_with = "crate::text::json_path::opt")]
    pub libtorch_cuda: Option<PathBuf>,
    /// Its `nccl*` slots, in its relocation tables' order.
    pub calls: Vec<Call>,
    /// Mapped `libnccl-net*`, `libnccl-tuner*`, `libnccl-profiler*`, `libnccl-env*`.
    #[serde(serialize_with = "crate::text::json_path::many")]
    pub plugins: Vec<PathBuf>,
    /// From the start to the ready line.
    pub elapsed_ms: u64,
    /// The child's peak resident set (`VmHWM`) when it was read, in KiB.
    pub peak_rss_kib: Option<u64>,
}

/// The file most calls reach ([`PythonWitness::most_reached`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Majority<'a> {
    pub file: &'a Path,
    pub calls: usize,
    pub total: usize,
}

impl Majority<'_> {
    /// Every slot points into this file.
    pub fn unanimous(&self) -> bool {
        self.calls == self.total
    }
}

/// Why no Python witness answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NoPythonWitness {
    /// Refused before anything ran: `path` (the interpreter, torch, a preload or a
    /// directory above one) belongs to someone else or others may write it.
    Untrusted {
        #[serde(serialize_with = "crate::text::json_path::one")]
        path: PathBuf,
        why: String,
    },
    /// The interpreter would import another torch than the checked one (`found`, as
    /// Python named it, cleaned): refused before that torch's code ran.
    OtherTorch {
        found: String,
    },
    /// The `libtorch_cuda.so` mapped does not lie under the checked torch.
    TorchOutside {
        #[serde(serialize_with = "crate::text::json_path::one")]
        libtorch_cuda: PathBuf,
    },
    /// `import torch` failed: the exit status and the tail of stderr (cleaned).
    ImportFailed {
        status: String,
        stderr_tail: String,
    },
    /// No ready line within the time limit; the child was killed.
    TimedOut {
        after_s: u64,
        stderr_tail: String,
    },
    /// The child ended otherwise (a signal, the memory limit, too much output).
    Died {
        why: String,
        stderr_tail: String,
    },
    /// `/proc/PID/maps` or `/proc/PID/mem` could not be read.
    ProcUnreadable {
        why: String,
    },
    /// `libtorch_cuda.so`'s relocations could not be read, or the file read is not the
    /// one mapped.
    Libtorch {
        why: String,
    },
    /// The interpreter could not be started.
    Spawn {
        why: String,
    },
    Interrupted,
}

impl NoPythonWitness {
    /// Refused by fdl (nothing of the job's ran, or only up to the torch check), rather
    /// than a failure of the child.
    pub fn refused(&self) -> bool {
        matches!(
            self,
            NoPythonWitness::Untrusted { .. } | NoPythonWitness::OtherTorch { .. }
        )
    }
}

impl std::fmt::Display for NoPythonWitness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::text::{clean, shown};
        let tail = |t: &str| {
            if t.trim().is_empty() {
                String::new()
            } else {
                format!(": {t}")
            }
        };
        match self {
            NoPythonWitness::Untrusted { path, why } => write!(
                f,
                "{} {why}: fdl runs only an interpreter and a torch that no one else can change, so it did not run Python",
                shown(path)
            ),
            NoPythonWitness::OtherTorch { found } => write!(
                f,
                "the interpreter would import torch from {} rather than the checked one, so fdl stopped it before that torch ran",
                clean(found)
            ),
            NoPythonWitness::TorchOutside { libtorch_cuda } => write!(
                f,
                "the process mapped {}, which is not under the checked torch",
                shown(libtorch_cuda)
            ),
            NoPythonWitness::ImportFailed {
                status,
                stderr_tail,
            } => write!(f, "import torch failed ({status}){}", tail(stderr_tail)),
            NoPythonWitness::TimedOut {
                after_s,
                stderr_tail,
            } => write!(
                f,
                "import torch did not finish within {after_s} s, so fdl killed it{}",
                tail(stderr_tail)
            ),
            NoPythonWitness::Died { why, stderr_tail } => {
                write!(f, "the interpreter {why}{}", tail(stderr_tail))
            }
            NoPythonWitness::ProcUnreadable { why } => {
                write!(f, "cannot read the child's memory map: {why}")
            }
            NoPythonWitness::Libtorch { why } => write!(f, "{why}"),
            NoPythonWitness::Spawn { why } => write!(f, "cannot run the interpreter: {why}"),
            NoPythonWitness::Interrupted => f.write_str("interrupted"),
        }
    }
}

impl std::error::Error for NoPythonWitness {}

impl PythonWitness {
    /// The file most `nccl*` slots point into, and how many do; `None` when no slot
    /// points into a file other than `libtorch_cuda.so`.
    pub fn most_reached(&self) -> Option<Majority<'_>> {
        let mut counts: Vec<(&Path, usize)> = Vec::new();
        for c in &self.calls {
            if let Reach::File { path } = &c.reach {
                match counts.iter_mut().find(|(p, _)| *p == path.as_path()) {
                    Some((_, n)) => *n += 1,
                    None => counts.push((path, 1)),
                }
            }
        }
        // The first in slot order wins a tie.
        let mut best: Option<(&Path, usize)> = None;
        for (p, n) in counts {
            if best.is_none_or(|(_, m)| n > m) {
                best = Some((p, n));
            }
        }
        best.map(|(file, calls)| Majority {
            file,
            calls,
            total: self.calls.len(),
        })
    }

    fn ran(&self) -> String {
        format!(
            "fdl ran {} and imported torch in it (CUDA_VISIBLE_DEVICES empty: no GPU touched)",
            crate::text::shown(&self.interpreter)
        )
    }

    /// One sentence: what fdl ran, and where the calls go.
    pub fn summary(&self) -> String {
        let ran = self.ran();
        let Some(lib) = &self.libtorch_cuda else {
            return format!("{ran}: it maps no libtorch_cuda.so (a CPU-only torch), so it calls no NCCL through torch");
        };
        let total = self.calls.len();
        match self.most_reached() {
            _ if total == 0 => format!(
                "{ran}: {} has no nccl* slots",
                crate::text::shown(lib)
            ),
            Some(m) if m.unanimous() => format!(
                "{ran}: all {total} nccl* slots of libtorch_cuda.so point into {}",
                crate::text::shown(m.file)
            ),
            Some(m) => format!(
                "{ran}: {} of {total} nccl* slots of libtorch_cuda.so point into {}, the rest elsewhere",
                m.calls,
                crate::text::shown(m.file)
            ),
            None => format!(
                "{ran}: none of the {total} nccl* slots of libtorch_cuda.so is bound to another file yet"
            ),
        }
    }

    /// The whole reading, one line each, terminal-safe.
    pub fn detail(&self) -> Vec<String> {
        use crate::text::shown;
        let mut out = vec![format!("{}.", self.ran())];
        out.push(format!("torch: {}", shown(&self.torch_dir)));
        out.push(match &self.libtorch_cuda {
            Some(p) => format!("libtorch_cuda.so: {}", shown(p)),
            None => "libtorch_cuda.so: not mapped".into(),
        });
        if self.mapped_nccl.is_empty() {
            out.push("NCCL files mapped: none".into());
        }
        for p in &self.mapped_nccl {
            out.push(format!("NCCL file mapped: {}", shown(p)));
        }
        // Slots grouped by where they point, in order of first appearance.
        let mut groups: Vec<(&Reach, Vec<&str>)> = Vec::new();
        for c in &self.calls {
            match groups.iter_mut().find(|(r, _)| *r == &c.reach) {
                Some((_, names)) => names.push(&c.symbol),
                None => groups.push((&c.reach, vec![&c.symbol])),
            }
        }
        for (reach, names) in groups {
            let to = match reach {
                Reach::File { path } => shown(path),
                Reach::Unbound => "libtorch_cuda.so itself (not bound yet)".into(),
                Reach::Unmapped { address } => format!("no file (address {address:#x})"),
            };
            let some: Vec<String> = names
                .iter()
                .take(3)
                .map(|n| crate::text::clean(n))
                .collect();
            let more = if names.len() > 3 {
                format!(" and {} more", names.len() - 3)
            } else {
                String::new()
            };
            out.push(format!(
                "{} slot(s) point into {to}: {}{more}",
                names.len(),
                some.join(", ")
            ));
        }
        for p in &self.plugins {
            out.push(format!("NCCL plugin mapped: {}", shown(p)));
        }
        let rss = self
            .peak_rss_kib
            .map(|k| format!(", peak RSS {} MiB", k / 1024))
            .unwrap_or_default();
        out.push(format!(
            "import took {:.1} s{rss}",
            self.elapsed_ms as f64 / 1000.0
        ));
        out
    }
}

/// The process's answer against the model's file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every slot reaches the file the model names.
    Agree { process: PathBuf },
    /// The process reaches another file: the model is wrong here, the process stands.
    Disagree { model: PathBuf, process: PathBuf },
    /// The model could not say; the process's file stands.
    ModelUnknown { process: PathBuf },
    /// The slots do not all reach one file (or none is bound): nothing settled.
    Inconclusive,
}

impl Verdict {
    pub fn word(&self) -> &'static str {
        match self {
            Verdict::Agree { .. } => "agree",
            Verdict::Disagree { .. } => "disagree",
            Verdict::ModelUnknown { .. } => "model_unknown",
            Verdict::Inconclusive => "inconclusive",
        }
    }

    /// The file the process's calls reach, when it settles one.
    pub fn process(&self) -> Option<&Path> {
        match self {
            Verdict::Agree { process }
            | Verdict::Disagree { process, .. }
            | Verdict::ModelUnknown { process } => Some(process),
            Verdict::Inconclusive => None,
        }
    }
}

/// Compares `x` with the file the model's answer names (`None`: the model could not say).
/// Files are compared by their real paths.
pub fn compare(model: Option<&Path>, x: &PythonWitness) -> Verdict {
    let canon = |f: &Path| f.canonicalize().unwrap_or_else(|_| f.to_path_buf());
    let Some(m) = x.most_reached().filter(Majority::unanimous) else {
        return Verdict::Inconclusive;
    };
    let process = canon(m.file);
    match model.map(canon) {
        Some(f) if f == process => Verdict::Agree { process },
        Some(model) => Verdict::Disagree { model, process },
        None => Verdict::ModelUnknown { process },
    }
}

/// The child's environment: this process's, with the job's variables (`set`) over it and
/// `LD_PRELOAD` as given (`None`: unset).
pub fn job_env(set: &[(OsString, OsString)], preload: Option<&OsStr>) -> Vec<(OsString, OsString)> {
    let mut vars: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| k != "LD_PRELOAD" && !set.iter().any(|(n, _)| n == k))
        .collect();
    vars.extend(set.iter().filter(|(k, _)| k != "LD_PRELOAD").cloned());
    if let Some(p) = preload.filter(|p| !p.is_empty()) {
        vars.push(("LD_PRELOAD".into(), p.to_os_string()));
    }
    vars
}

/// Asks the job's own interpreter, importing its torch, which NCCL `libtorch_cuda.so`'s
/// calls reach.
pub fn ask_python(
    launch: &PythonLaunch,
    limits: &Limits,
) -> Result<PythonWitness, NoPythonWitness> {
    let abs = |p: &Path| {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            launch.cwd.join(p)
        }
    };
    let interpreter = abs(&launch.interpreter);
    let torch_dir = abs(&launch.torch_dir);
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    check_path(&interpreter, me, Want::File)?;
    let torch_real = check_path(&torch_dir, me, Want::Dir)?;
    check_tree(&torch_real, me)?;
    let init = torch_real.join("__init__.py");
    check_path(&init, me, Want::File)?;
    for (k, v) in &launch.env {
        if k == "LD_PRELOAD" {
            // glibc skips an element that names no file; only what it loads is checked.
            for p in preload_paths(v) {
                let p = abs(&p);
                if std::fs::symlink_metadata(&p).is_ok() {
                    check_path(&p, me, Want::File)?;
                }
            }
        }
    }

    let _critical = crate::process::Critical::enter();
    let mut cmd = Command::new(&interpreter);
    cmd.arg("-c")
        .arg(snippet(&init))
        .env_clear()
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .env("CUDA_VISIBLE_DEVICES", "")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(&launch.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (mem, fsize) = (limits.memory, limits.file_bytes);
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let set = |what, n: u64| {
                    let r = libc::rlimit {
                        rlim_cur: n as libc::rlim_t,
                        rlim_max: n as libc::rlim_t,
                    };
                    libc::setrlimit(what, &r)
                };
                if set(libc::RLIMIT_AS, mem) != 0
                    || set(libc::RLIMIT_FSIZE, fsize) != 0
                    || set(libc::RLIMIT_CORE, 0) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let start = Instant::now();
    let (child, watch) = crate::process::spawn(&mut cmd).map_err(|e| NoPythonWitness::Spawn {
        why: format!("{}: {e}", crate::text::shown(&interpreter)),
    })?;
    let mut guard = ChildGuard {
        child,
        _watch: Some(watch),
    };
    let (events, stderr_tail) = guard.read_streams(limits.output_bytes);
    let tail = || {
        let t = stderr_tail.lock().unwrap_or_else(|e| e.into_inner());
        last_lines(&String::from_utf8_lossy(&t), 12)
    };
    // Waits for the ready line, the child's end, the timeout or an interrupt.
    loop {
        if crate::process::interrupted() {
            return Err(NoPythonWitness::Interrupted);
        }
        match events.recv_timeout(Duration::from_millis(50)) {
            Ok(Event::Ready) => break,
            Ok(Event::OtherTorch(found)) => {
                return Err(NoPythonWitness::OtherTorch {
                    found: crate::text::clean(&found),
                })
            }
            Ok(Event::TooMuch) => {
                return Err(NoPythonWitness::Died {
                    why: format!(
                        "wrote more than {} KiB to stdout before importing torch, so fdl killed it",
                        limits.output_bytes >> 10
                    ),
                    stderr_tail: tail(),
                })
            }
            Ok(Event::Ended) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                // Stdout closed: the child is ending; wait a moment for its status.
                let status = guard.wait_briefly();
                // Give stderr's reader a moment to take the last words.
                std::thread::sleep(Duration::from_millis(50));
                return Err(ended(status, tail(), limits));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if let Ok(Some(status)) = guard.child.try_wait() {
            std::thread::sleep(Duration::from_millis(50));
            return Err(ended(Some(status), tail(), limits));
        }
        if start.elapsed() > limits.time {
            return Err(NoPythonWitness::TimedOut {
                after_s: limits.time.as_secs(),
                stderr_tail: tail(),
            });
        }
    }
    let elapsed_ms = start.elapsed().as_millis() as u64;
    let pid = guard.child.id();
    let w = read_process(pid, &interpreter, &torch_real, limits, elapsed_ms);
    drop(guard);
    w
}

/// What the child's end says, as a refusal.
fn ended(
    status: Option<std::process::ExitStatus>,
    stderr_tail: String,
    limits: &Limits,
) -> NoPythonWitness {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Some(s) if s.signal().is_some() => NoPythonWitness::Died {
            why: format!(
                "was ended by signal {}{}",
                s.signal().unwrap_or(0),
                if s.signal() == Some(libc::SIGXFSZ) {
                    format!(" (it wrote a file past {} MiB)", limits.file_bytes >> 20)
                } else {
                    String::new()
                }
            ),
            stderr_tail,
        },
        Some(s) => NoPythonWitness::ImportFailed {
            status: s.to_string(),
            stderr_tail,
        },
        None => NoPythonWitness::Died {
            why: "closed its stdout without importing torch".into(),
            stderr_tail,
        },
    }
}

/// The fixed program the child runs: check which torch `import torch` would load (without
/// running it), import it, say so, and wait on stdin until fdl kills it. `init` is
/// passed as hex, so no path can break out of the string.
fn snippet(init: &Path) -> String {
    let hex: String = init
        .as_os_str()
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!(
        "import sys, os, importlib.util as u\n\
         e = os.fsdecode(bytes.fromhex('{hex}'))\n\
         s = u.find_spec('torch')\n\
         o = s.origin if s is not None else None\n\
         try:\n    same = o is not None and os.path.samefile(o, e)\n\
         except Exception:\n    same = False\n\
         if not same:\n    \
             sys.stdout.write('\\n{OTHER_TORCH}\\n' + repr(o)[:1024] + '\\n'); sys.stdout.flush(); os._exit({OTHER_TORCH_EXIT})\n\
         import torch\n\
         sys.stdout.write('\\n{READY}\\n'); sys.stdout.flush()\n\
         sys.stdin.read()\n"
    )
}

/// The paths of an `LD_PRELOAD` value that name a file by path (a bare name is searched
/// for in the system's directories).
fn preload_paths(v: &OsStr) -> Vec<PathBuf> {
    v.as_bytes()
        .split(|b| matches!(b, b':' | b' ' | b'\t' | b'\n'))
        .filter(|p| p.contains(&b'/'))
        .map(|p| PathBuf::from(OsStr::from_bytes(p)))
        .collect()
}

enum Event {
    Ready,
    OtherTorch(String),
    TooMuch,
    Ended,
}

/// The child, killed with its process group and reaped when dropped: on success, error,
/// timeout or panic alike.
struct ChildGuard {
    child: Child,
    _watch: Option<crate::process::Watchdog>,
}

impl ChildGuard {
    /// Starts the readers: stdout's lines until the ready line (at most `cap` bytes),
    /// stderr's last `cap` bytes.
    fn read_streams(
        &mut self,
        cap: usize,
    ) -> (
        mpsc::Receiver<Event>,
        std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    ) {
        let (tx, rx) = mpsc::channel();
        if let Some(out) = self.child.stdout.take() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut r = std::io::BufReader::new(out.take(cap as u64 + 1));
                let mut line = Vec::new();
                let mut read = 0usize;
                loop {
                    line.clear();
                    match r.read_until(b'\n', &mut line) {
                        Ok(0) | Err(_) => {
                            let _ = tx.send(if read > cap {
                                Event::TooMuch
                            } else {
                                Event::Ended
                            });
                            return;
                        }
                        Ok(n) => read += n,
                    }
                    let text = String::from_utf8_lossy(&line);
                    let text = text.trim_end_matches('\n');
                    if text == READY {
                        let _ = tx.send(Event::Ready);
                        return;
                    }
                    if text == OTHER_TORCH {
                        line.clear();
                        let _ = r.read_until(b'\n', &mut line);
                        let found = String::from_utf8_lossy(&line).trim_end().to_string();
                        let _ = tx.send(Event::OtherTorch(found));
                        return;
                    }
                }
            });
        }
        let tail = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        if let Some(mut err) = self.child.stderr.take() {
            let kept = std::sync::Arc::clone(&tail);
            std::thread::spawn(move || {
                let mut chunk = [0u8; 16 << 10];
                loop {
                    match err.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            let mut t = kept.lock().unwrap_or_else(|e| e.into_inner());
                            t.extend_from_slice(&chunk[..n]);
                            if t.len() > cap {
                                let cut = t.len() - cap;
                                t.drain(..cut);
                            }
                        }
                    }
                }
            });
        }
        (rx, tail)
    }

    /// The child's status once it exits, waiting up to a second.
    fn wait_briefly(&mut self) -> Option<std::process::ExitStatus> {
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let pgid = self.child.id() as libc::pid_t;
        // SAFETY: the group fdl created for this child (`process::spawn`); the leader is
        // not reaped yet, so its id names no other process.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last `n` lines of `text`, cleaned, joined by ` | `.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let from = lines.len().saturating_sub(n);
    lines[from..]
        .iter()
        .map(|l| crate::text::clean(l))
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Reads the ready child's maps and slots.
fn read_process(
    pid: u32,
    interpreter: &Path,
    torch_real: &Path,
    limits: &Limits,
    elapsed_ms: u64,
) -> Result<PythonWitness, NoPythonWitness> {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let unreadable = |what: &str, e: std::io::Error| NoPythonWitness::ProcUnreadable {
        why: format!("{what}: {e}"),
    };
    let mut text = Vec::new();
    std::fs::File::open(proc_dir.join("maps"))
        .and_then(|f| f.take(limits.maps_bytes).read_to_end(&mut text))
        .map_err(|e| unreadable("/proc/PID/maps", e))?;
    if text.len() as u64 >= limits.maps_bytes {
        return Err(NoPythonWitness::ProcUnreadable {
            why: format!(
                "/proc/PID/maps is larger than the {} MiB fdl reads",
                limits.maps_bytes >> 20
            ),
        });
    }
    let maps = parse_maps(&text);
    let peak_rss_kib = crate::fsread::read_text_if_present(&proc_dir.join("status"), 1 << 20)
        .ok()
        .flatten()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        });
    let mut w = PythonWitness {
        interpreter: interpreter.to_path_buf(),
        torch_dir: torch_real.to_path_buf(),
        mapped_nccl: Vec::new(),
        libtorch_cuda: None,
        calls: Vec::new(),
        plugins: Vec::new(),
        elapsed_ms,
        peak_rss_kib,
    };
    const PLUGINS: [&str; 4] = [
        "libnccl-net",
        "libnccl-tuner",
        "libnccl-profiler",
        "libnccl-env",
    ];
    for m in &maps {
        let Some(p) = &m.path else { continue };
        if m.file_name_starts("libnccl.so") && !w.mapped_nccl.contains(p) {
            w.mapped_nccl.push(p.clone());
        }
        if PLUGINS.iter().any(|k| m.file_name_starts(k)) && !w.plugins.contains(p) {
            w.plugins.push(p.clone());
        }
    }
    let Some(lib) = maps
        .iter()
        .find(|m| m.file_name_starts("libtorch_cuda.so"))
        .cloned()
    else {
        return Ok(w);
    };
    let lib_path = lib.path.clone().unwrap_or_default();
    if !lib_path.starts_with(torch_real) {
        return Err(NoPythonWitness::TorchOutside {
            libtorch_cuda: lib_path,
        });
    }
    w.libtorch_cuda = Some(lib_path.clone());
    let slots = interpose::nccl_slots(&lib_path).map_err(|e| NoPythonWitness::Libtorch {
        why: format!(
            "cannot read the relocations of {}: {}",
            crate::text::shown(&lib_path),
            crate::text::clean(&format!("{e:#}"))
        ),
    })?;
    let base = load_base(&maps, &lib, &slots)?;
    let mem =
        std::fs::File::open(proc_dir.join("mem")).map_err(|e| unreadable("/proc/PID/mem", e))?;
    for s in &slots.slots {
        let at = base
            .checked_add(s.vaddr)
            .ok_or_else(|| NoPythonWitness::Libtorch {
                why: format!("the slot of {} lies past the address space", s.name),
            })?;
        let mut word = [0u8; 8];
        std::os::unix::fs::FileExt::read_exact_at(&mem, &mut word, at)
            .map_err(|e| unreadable("/proc/PID/mem", e))?;
        // The child runs on this machine: its byte order is fdl's.
        let v = u64::from_ne_bytes(word);
        let reach = match maps.iter().find(|m| m.start <= v && v < m.end) {
            Some(m) if m.same_file(&lib) => Reach::Unbound,
            Some(Mapping {
                path: Some(path), ..
            }) => Reach::File { path: path.clone() },
            _ => Reach::Unmapped { address: v },
        };
        w.calls.push(Call {
            symbol: s.name.clone(),
            slot: s.kind,
            reach,
        });
    }
    Ok(w)
}

fn load_base(maps: &[Mapping], lib: &Mapping, slots: &NcclSlots) -> Result<u64, NoPythonWitness> {
    super::procmaps::load_base(maps, lib, slots).map_err(|why| NoPythonWitness::Libtorch { why })
}

/// What the end of a checked path must be.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    File,
    Dir,
}

/// Whether an entry with this owner and mode may stand in a trusted path: this user's or
/// root's, and no one else may write it — except a root-owned sticky directory such as
/// `/tmp`, where others may add entries but only an entry's owner (or root) may rename
/// or remove it, so an entry of this user's or root's below it stays theirs.
fn trusted_entry(uid: u32, mode: u32, is_dir: bool, me: u32) -> Result<(), String> {
    if uid != me && uid != 0 {
        return Err(format!("belongs to another user (uid {uid})"));
    }
    if mode & 0o022 != 0 && !(is_dir && uid == 0 && mode & 0o1000 != 0) {
        return Err(format!("is writable by others (mode {:o})", mode & 0o7777));
    }
    Ok(())
}

/// A file fdl may load into a child of its own: `path` and every directory above it,
/// through each link it passes, belong to this user or root and no one else may write
/// them (as the Python witness wants of torch). Returns the path with every link
/// resolved, or the entry refused and why.
pub fn trusted_file(path: &Path) -> Result<PathBuf, (PathBuf, String)> {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    check_path(path, me, Want::File).map_err(|e| match e {
        NoPythonWitness::Untrusted { path, why } => (path, why),
        other => (path.to_path_buf(), other.to_string()),
    })
}

/// Checks every directory from `/` down to `path`, and `path` itself, following each
/// link only after checking the directory that holds it and then checking what it names
/// the same way (at most 40 links). Returns the path with every link resolved.
fn check_path(path: &Path, me: u32, want: Want) -> Result<PathBuf, NoPythonWitness> {
    use std::os::unix::fs::MetadataExt;
    let untrusted = |p: &Path, why: String| NoPythonWitness::Untrusted {
        path: p.to_path_buf(),
        why,
    };
    if !path.is_absolute() {
        return Err(untrusted(path, "is not an absolute path".into()));
    }
    let check = |p: &Path, is_dir: bool| -> Result<std::fs::Metadata, NoPythonWitness> {
        let m = std::fs::symlink_metadata(p)
            .map_err(|e| untrusted(p, format!("cannot be read ({e})")))?;
        if !m.file_type().is_symlink() {
            trusted_entry(m.uid(), m.mode(), is_dir && m.is_dir(), me)
                .map_err(|why| untrusted(p, why))?;
        }
        Ok(m)
    };
    check(Path::new("/"), true)?;
    let mut todo: std::collections::VecDeque<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect();
    let mut at = PathBuf::from("/");
    let mut links = 0;
    while let Some(name) = todo.pop_front() {
        if name == ".." {
            at.pop();
            continue;
        }
        let next = at.join(&name);
        let m = check(&next, true)?;
        if m.file_type().is_symlink() {
            links += 1;
            if links > 40 {
                return Err(untrusted(path, "passes more than 40 links".into()));
            }
            let target = std::fs::read_link(&next)
                .map_err(|e| untrusted(&next, format!("cannot be read ({e})")))?;
            let parts: Vec<OsString> = target
                .components()
                .filter_map(|c| match c {
                    Component::Normal(n) => Some(n.to_os_string()),
                    Component::ParentDir => Some(OsString::from("..")),
                    _ => None,
                })
                .collect();
            for p in parts.into_iter().rev() {
                todo.push_front(p);
            }
            if target.is_absolute() {
                at = PathBuf::from("/");
            }
            continue;
        }
        if !todo.is_empty() && !m.is_dir() {
            return Err(untrusted(&next, "is not a directory".into()));
        }
        at = next;
    }
    let m = std::fs::symlink_metadata(&at)
        .map_err(|e| untrusted(&at, format!("cannot be read ({e})")))?;
    match want {
        Want::File if !m.is_file() => Err(untrusted(&at, "is not a regular file".into())),
        Want::Dir if !m.is_dir() => Err(untrusted(&at, "is not a directory".into())),
        _ => Ok(at),
    }
}

/// The most entries of torch's tree looked at (torch 2.15 holds about 16,000).
const MAX_TREE: usize = 1 << 18;

/// Every entry below torch's directory (links not followed) is this user's or root's and
/// writable by no one else: torch's `.py` files and libraries all run on import.
fn check_tree(root: &Path, me: u32) -> Result<(), NoPythonWitness> {
    use std::os::unix::fs::MetadataExt;
    let mut stack = vec![root.to_path_buf()];
    let mut seen = 0usize;
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| NoPythonWitness::Untrusted {
            path: dir.clone(),
            why: format!("cannot be listed ({e})"),
        })?;
        for e in entries {
            let e = e.map_err(|e| NoPythonWitness::Untrusted {
                path: dir.clone(),
                why: format!("cannot be listed ({e})"),
            })?;
            seen += 1;
            if seen > MAX_TREE {
                return Err(NoPythonWitness::Untrusted {
                    path: root.to_path_buf(),
                    why: format!("holds more than {MAX_TREE} entries"),
                });
            }
            let p = e.path();
            let m = std::fs::symlink_metadata(&p).map_err(|err| NoPythonWitness::Untrusted {
                path: p.clone(),
                why: format!("cannot be read ({err})"),
            })?;
            if m.file_type().is_symlink() {
                continue;
            }
            trusted_entry(m.uid(), m.mode(), false, me).map_err(|why| {
                NoPythonWitness::Untrusted {
                    path: p.clone(),
                    why,
                }
            })?;
            if m.is_dir() {
                stack.push(p);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_are_read() {
        let text =
            b"7f0000000000-7f0000001000 r--p 00000000 fe:00 10134182 /a b/libtorch_cuda.so\n\
7f0000001000-7f0000002000 r-xp 00001000 fe:00 10134182 /a b/libtorch_cuda.so\n\
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]\n\
55d000000000-55d000001000 rw-p 00000000 00:00 0 \n\
garbage\n\
ffff-0 r--p 0 0:0 0 /x\n\
1-2 r--p zz 0:0 0 /x\n";
        let m = parse_maps(text);
        assert_eq!(m.len(), 4, "{m:?}");
        assert_eq!(
            m[0].path.as_deref(),
            Some(Path::new("/a b/libtorch_cuda.so"))
        );
        assert_eq!(m[0].dev, (0xfe, 0));
        assert_eq!(m[1].offset, 0x1000);
        assert_eq!(m[2].path, None);
        assert_eq!(m[3].path, None);
        assert!(m[0].same_file(&m[1]));
        assert!(!m[2].same_file(&m[3]), "anonymous mappings are no file");
        // Hostile bytes never panic.
        for cut in 0..text.len() {
            let _ = parse_maps(&text[..cut]);
        }
        let _ = parse_maps(b"\xff\xfe - - - - \n-\n--\n 1-2 3 4 5:6 7 \x00");
    }

    #[test]
    fn ownership_and_write_bits_decide() {
        assert!(trusted_entry(1000, 0o755, true, 1000).is_ok());
        assert!(trusted_entry(0, 0o755, true, 1000).is_ok());
        assert!(trusted_entry(1001, 0o755, true, 1000).is_err());
        assert!(trusted_entry(1000, 0o775, true, 1000).is_err());
        assert!(trusted_entry(1000, 0o757, false, 1000).is_err());
        // /tmp: root's and sticky.
        assert!(trusted_entry(0, 0o1777, true, 1000).is_ok());
        assert!(trusted_entry(1000, 0o1777, true, 1000).is_err());
        assert!(trusted_entry(0, 0o777, true, 1000).is_err());
    }

    #[test]
    fn links_are_checked_where_they_lead() {
        use std::os::unix::fs::PermissionsExt;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let d = tempfile::tempdir().unwrap();
        let good = d.path().join("good");
        let open = d.path().join("open");
        std::fs::create_dir(&good).unwrap();
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o775)).unwrap();
        std::fs::write(good.join("python"), "").unwrap();
        std::fs::write(open.join("python"), "").unwrap();
        std::os::unix::fs::symlink(open.join("python"), good.join("to-open")).unwrap();
        std::os::unix::fs::symlink("python", good.join("rel")).unwrap();
        std::os::unix::fs::symlink("../good/python", good.join("up")).unwrap();
        assert_eq!(
            check_path(&good.join("rel"), me, Want::File).unwrap(),
            good.join("python")
        );
        assert_eq!(
            check_path(&good.join("up"), me, Want::File).unwrap(),
            good.join("python")
        );
        let e = check_path(&good.join("to-open"), me, Want::File).unwrap_err();
        assert!(
            matches!(&e, NoPythonWitness::Untrusted { path, .. } if path == &open),
            "{e}"
        );
        assert!(check_path(&open.join("python"), me, Want::File).is_err());
        assert!(check_path(&good, me, Want::File).is_err());
        assert!(check_path(Path::new("rel/python"), me, Want::File).is_err());
        std::os::unix::fs::symlink("loop", good.join("loop")).unwrap();
        assert!(check_path(&good.join("loop"), me, Want::File).is_err());
    }

    #[test]
    fn the_snippet_holds_the_path_as_hex_only() {
        let s = snippet(Path::new("/x/'); import evil #\n/__init__.py"));
        assert!(!s.contains("evil"));
        assert!(s.contains("importlib.util"));
        assert!(s.contains(READY));
    }

    #[test]
    fn preload_paths_are_split_as_glibc_splits() {
        let v = OsStr::new("libfoo.so /a/b.so:/c/d.so\t./e.so");
        assert_eq!(
            preload_paths(v),
            vec![
                PathBuf::from("/a/b.so"),
                PathBuf::from("/c/d.so"),
                PathBuf::from("./e.so")
            ]
        );
    }

    fn witness(calls: Vec<Call>) -> PythonWitness {
        PythonWitness {
            interpreter: "/v/bin/python".into(),
            torch_dir: "/v/torch".into(),
            mapped_nccl: vec!["/v/nccl/libnccl.so.2".into()],
            libtorch_cuda: Some("/v/torch/lib/libtorch_cuda.so".into()),
            calls,
            plugins: vec![],
            elapsed_ms: 1500,
            peak_rss_kib: Some(600 << 10),
        }
    }

    #[test]
    fn the_majority_and_the_renderings() {
        let call = |n: &str, reach: Reach| Call {
            symbol: n.into(),
            slot: "JUMP_SLOT",
            reach,
        };
        let a = || Reach::File {
            path: "/v/nccl/libnccl.so.2".into(),
        };
        let w = witness(vec![call("ncclSend", a()), call("ncclRecv", a())]);
        let m = w.most_reached().unwrap();
        assert!(m.unanimous());
        assert!(w.summary().contains("all 2 nccl* slots"), "{}", w.summary());
        assert!(w.summary().contains("imported torch"));
        let w = witness(vec![
            call("ncclSend", Reach::Unbound),
            call("ncclRecv", a()),
            call("ncclBad\x1b[2J", Reach::Unmapped { address: 16 }),
        ]);
        let m = w.most_reached().unwrap();
        assert_eq!((m.calls, m.total, m.unanimous()), (1, 3, false));
        for l in w.detail() {
            assert!(!l.contains('\x1b'), "{l}");
        }
        assert!(witness(vec![call("x", Reach::Unbound)])
            .most_reached()
            .is_none());
    }
}
