//! The witness: this host's own dynamic loader, asked what it binds, without running the
//! program or any of its constructors.
//!
//! The model ([`super::which_nccl`]) reads the files and follows glibc's rules; a model
//! always has one more rule to learn. On the host that runs the process, the loader
//! itself can answer. fdl runs the *system* interpreter (the one that runs fdl itself,
//! never a file's own `PT_INTERP`) in trace mode, as `ldd -r` does:
//! `LD_TRACE_LOADED_OBJECTS=1` with `LD_WARN=yes` and `LD_BIND_NOW=1`, so that glibc lays
//! out the link map, relocates every object (`__RTLD_NOIFUNC`: no IFUNC resolver runs)
//! and exits before any constructor; `LD_DEBUG=bindings` into a private directory says
//! where each `nccl*` reference binds. `ld.so --list` is not used: it turns off the
//! relocation pass (`dl_lazy = -1`) and stops at the first missing library.
//!
//! A library is loaded the way a process loads it: fdl writes a stand-in program into its
//! private directory (0700), whose only `DT_NEEDED` is the library by path and which
//! has no code, so the order is the program, the preloads, the library and its closure —
//! the model's order. Tracing the library as the main object would put it ahead of every
//! preload and let its own definitions win. A program is traced itself.
//!
//! Bounds: [`Limits`] (a few seconds, then the process group is killed; the address space
//! and the debug file's size by `setrlimit`; stdout and stderr read up to a cap). A file
//! under a directory a peer ships into ([`PEER_DIR_PREFIX`]) is never traced.

use super::bind::{Answer, Which};
use super::map::FoundBy;
use super::search::LoaderEnv;
use crate::inspect::SelfId;
use serde::Serialize;
use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The directories a peer's copy arrives in start with this (`cluster receive`'s
/// `.incoming-<name>/`, the same string as `nccl::name::INCOMING_PREFIX`): nothing below
/// one is ever given to the loader.
pub const PEER_DIR_PREFIX: &str = ".incoming-";

/// What one trace may cost.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Wall time, after which the loader's process group is killed.
    pub time: Duration,
    /// The debug file's size (`RLIMIT_FSIZE`): past it the kernel stops the loader.
    pub debug_bytes: u64,
    /// Bytes read from stdout and from stderr each.
    pub output_bytes: usize,
    /// The loader's address space (`RLIMIT_AS`).
    pub memory: u64,
    /// `nccl*` binding lines kept; the rest are counted.
    pub bindings: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            time: Duration::from_secs(5),
            debug_bytes: 256 << 20,
            output_bytes: 8 << 20,
            memory: 64 << 30,
            bindings: 4096,
        }
    }
}

/// Why no loader could be asked: the model answers alone, and says so.
#[derive(Debug, Clone, Serialize)]
pub struct NoWitness {
    pub reason: String,
    /// The loader was not asked because the file (or one it would load) came from a peer.
    pub refused: bool,
}

impl std::fmt::Display for NoWitness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

fn none(reason: impl Into<String>) -> NoWitness {
    NoWitness {
        reason: reason.into(),
        refused: false,
    }
}

/// How the traced process was laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The program itself was traced.
    Program,
    /// fdl's stand-in program, needing the library by path, was traced.
    Library,
}

/// `nccl*` references of the consumer that bind to one object.
#[derive(Debug, Clone, Serialize)]
pub struct Reach {
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub object: PathBuf,
    #[serde(serialize_with = "crate::text::json_path::many")]
    pub callers: Vec<PathBuf>,
    pub symbols: Vec<String>,
}

/// What the loader said.
#[derive(Debug, Clone, Serialize)]
pub struct Witness {
    /// The interpreter that was run.
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub interpreter: PathBuf,
    pub mode: Mode,
    /// The program traced, or the library the stand-in needs.
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub traced: PathBuf,
    /// The consumer's `nccl*` references grouped by the object they bind to (the traced
    /// object's own when it has any, else every object's).
    pub reached: Vec<Reach>,
    /// `nccl*` names the consumer references that nothing in the process defines.
    pub undefined: Vec<String>,
    /// Why the process would not start (a library not found, a fatal load error).
    pub failures: Vec<String>,
    /// The objects the loader listed, in its order.
    #[serde(serialize_with = "crate::text::json_path::many")]
    pub link_map: Vec<PathBuf>,
    /// Binding lines past [`Limits::bindings`], counted only.
    pub bindings_omitted: usize,
    /// When the trace was cut by a bound: what was cut. Its answer is then no answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cut: Option<String>,
    /// The self-id of the one object every reference reaches, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl: Option<SelfId>,
    pub warnings: Vec<String>,
    /// The working directory the paths of the model and the trace are relative to.
    #[serde(skip)]
    pub cwd: PathBuf,
}

/// The loader's answer, in the model's words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Every `nccl*` reference binds to one object.
    Nccl,
    /// The loader binds no `nccl*` reference: any NCCL is bound inside its object when it
    /// was linked, or there is none.
    Local,
    /// References bind to two or more objects.
    Split,
    /// The consumer references `nccl*` names nothing defines.
    Unbound,
    /// The trace was cut by a bound.
    Cut,
}

impl Witness {
    /// A trace of `traced` by `interpreter` that has read nothing yet.
    fn empty(interpreter: PathBuf, mode: Mode, traced: PathBuf, cwd: PathBuf) -> Witness {
        Witness {
            interpreter,
            mode,
            traced,
            reached: Vec::new(),
            undefined: Vec::new(),
            failures: Vec::new(),
            link_map: Vec::new(),
            bindings_omitted: 0,
            cut: None,
            nccl: None,
            warnings: Vec::new(),
            cwd,
        }
    }

    pub fn kind(&self) -> Kind {
        if self.cut.is_some() {
            Kind::Cut
        } else if self.reached.len() > 1 {
            Kind::Split
        } else if self.reached.len() == 1 {
            Kind::Nccl
        } else if !self.undefined.is_empty() {
            Kind::Unbound
        } else {
            Kind::Local
        }
    }

    /// Whether the process would start and its nccl* calls would all resolve.
    pub fn starts(&self) -> bool {
        self.failures.is_empty() && self.undefined.is_empty()
    }

    /// One sentence: what the loader binds.
    pub fn summary(&self) -> String {
        let mut s = match self.kind() {
            Kind::Cut => format!(
                "no answer: the trace was cut ({})",
                self.cut.as_deref().unwrap_or("")
            ),
            Kind::Split => format!(
                "the nccl* references bind to {} objects: {}",
                self.reached.len(),
                self.reached
                    .iter()
                    .map(|r| crate::text::shown(&r.object))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Kind::Nccl => {
                let r = &self.reached[0];
                let id = match &self.nccl {
                    Some(id) => format!("NCCL {} (CUDA {})", id.nccl, id.cuda),
                    None => "an object without an NCCL self-id".to_string(),
                };
                format!(
                    "the nccl* references bind to {} — {id}",
                    crate::text::shown(&r.object)
                )
            }
            Kind::Unbound => format!(
                "nothing in the process defines {}",
                list_some(&self.undefined, 3)
            ),
            Kind::Local => "the loader binds no nccl* reference (any NCCL is bound inside its object at link time)".to_string(),
        };
        if !self.failures.is_empty() {
            s.push_str(&format!(
                "; the process would not start: {}",
                list_some(&self.failures, 2)
            ));
        } else if !self.undefined.is_empty() && self.kind() != Kind::Unbound {
            s.push_str(&format!(
                "; nothing defines {}, so the process fails at that call",
                list_some(&self.undefined, 2)
            ));
        }
        s
    }
}

fn list_some(items: &[String], n: usize) -> String {
    let mut s = items.iter().take(n).cloned().collect::<Vec<_>>().join(", ");
    if items.len() > n {
        s.push_str(&format!(" and {} more", items.len() - n));
    }
    s
}

/// The model's answer set against the loader's.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// The loader confirms the model.
    Agree { why: String },
    /// The loader and the model differ: the loader's answer stands, and the model is
    /// wrong (a bug of fdl's).
    Disagree { model: String, loader: String },
    /// The model could not say; the loader's answer stands.
    ModelUnknown { loader: String },
    /// The trace was cut: the model answers alone.
    Inconclusive { why: String },
}

impl Verdict {
    pub fn is_disagreement(&self) -> bool {
        matches!(self, Verdict::Disagree { .. })
    }
}

/// `(dev, ino)` of a path, following links only to name the file (nothing is opened).
fn id_of(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (id_of(a), id_of(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// Sets the model's answer `which` against the loader's `w`.
pub fn compare(which: &Which, w: &Witness) -> Verdict {
    let same_file = |a: &Path, b: &Path| same_file(&w.cwd.join(a), &w.cwd.join(b));
    let loader = w.summary();
    if w.kind() == Kind::Cut {
        return Verdict::Inconclusive { why: loader };
    }
    let disagree = |model: String| Verdict::Disagree {
        model,
        loader: loader.clone(),
    };
    let model_fails = !which.link_map.failures.is_empty() || which.link_map.failures_omitted > 0;
    let loader_fails = !w.failures.is_empty();
    // The model's objects that the calls reach through the loader (not inside their own
    // object).
    let through_loader: Vec<&Path> = which
        .calls
        .iter()
        .filter_map(|c| {
            let o = c.object.as_deref()?;
            (!same_file(o, &c.caller) || w.reached.iter().any(|r| same_file(&r.object, o)))
                .then_some(o)
        })
        .collect();
    match &which.answer {
        Answer::Unknown { .. } => {
            if let Some(c) = &which.conditional {
                if w.kind() == Kind::Nccl && same_file(&w.reached[0].object, &c.detection.file) {
                    return Verdict::ModelUnknown {
                        loader: format!(
                            "{loader}, the object of the model's conditional answer ({})",
                            c.condition()
                        ),
                    };
                }
            }
            Verdict::ModelUnknown { loader }
        }
        Answer::Nccl { detection } => {
            let model = format!(
                "NCCL {} from {}",
                detection.version,
                detection.file.display()
            );
            if model_fails != loader_fails {
                return disagree(failure_words(which, model));
            }
            if !w.undefined.is_empty() {
                return disagree(model);
            }
            match w.kind() {
                Kind::Nccl if same_file(&w.reached[0].object, &detection.file) => Verdict::Agree {
                    why: format!(
                        "the loader binds the nccl* references to {}, as the model says",
                        w.reached[0].object.display()
                    ),
                },
                Kind::Local if through_loader.is_empty() => Verdict::Agree {
                    why: format!(
                        "the loader binds no nccl* reference: they stay inside {}, as the model says",
                        detection.file.display()
                    ),
                },
                _ => disagree(model),
            }
        }
        Answer::None { reason } => {
            let model = format!("no NCCL ({reason})");
            if model_fails != loader_fails {
                return disagree(failure_words(which, model));
            }
            match w.kind() {
                Kind::Local => Verdict::Agree {
                    why: "the loader binds no nccl* reference, as the model says".into(),
                },
                _ => disagree(model),
            }
        }
        Answer::Split { reason } => {
            let model = format!("two NCCLs ({reason})");
            let objects: Vec<&Path> = which
                .calls
                .iter()
                .filter_map(|c| c.object.as_deref())
                .collect();
            let all_seen = w
                .reached
                .iter()
                .all(|r| objects.iter().any(|o| same_file(o, &r.object)));
            match w.kind() {
                Kind::Split if all_seen => Verdict::Agree {
                    why: "the loader binds the nccl* references to the same objects, as the model says".into(),
                },
                _ => disagree(model),
            }
        }
    }
}

fn failure_words(which: &Which, model: String) -> String {
    match which.link_map.failures.first() {
        Some(f) => format!(
            "{model}; the process does not start ({}: {})",
            f.needed, f.reason
        ),
        None => format!("{model}; the process starts (every library is found)"),
    }
}

/// The interpreter that runs fdl itself: the system's, for fdl's class and machine.
fn system_interpreter() -> Result<PathBuf, NoWitness> {
    // The same PT_INTERP the model's `ld.so --help` comes from: one reading of it.
    let interp = super::search::own_interpreter()
        .ok_or_else(|| none("fdl's own program names no ELF interpreter (a static build)"))?;
    if !interp.is_absolute() || !interp.is_file() {
        return Err(none(format!(
            "the system interpreter {} is not a file",
            interp.display()
        )));
    }
    Ok(interp)
}

/// `(is_64, little_endian, machine)` from an ELF header.
fn elf_kind(p: &Path) -> Option<(bool, bool, u16)> {
    // The system's own interpreter (often a link the distribution made, as the kernel
    // follows it for every program): 20 bytes of its header.
    let mut f = std::fs::File::open(p).ok()?;
    let mut head = [0u8; 20];
    f.read_exact(&mut head).ok()?;
    if !head.starts_with(b"\x7fELF") {
        return None;
    }
    let little = head[5] == 1;
    let m = [head[18], head[19]];
    let machine = if little {
        u16::from_le_bytes(m)
    } else {
        u16::from_be_bytes(m)
    };
    Some((head[4] == 2, little, machine))
}

/// Whether a path lies under a directory a peer ships into.
pub fn from_peer(p: &Path) -> bool {
    let lies_under = |p: &Path| {
        p.components().any(|c| {
            c.as_os_str()
                .to_str()
                .is_some_and(|s| s.starts_with(PEER_DIR_PREFIX))
        })
    };
    lies_under(p) || p.canonicalize().is_ok_and(|c| lies_under(&c))
}

/// Refuses to trace `program` as the main object when glibc would run code of its
/// choosing before the trace: its DT_AUDIT and DT_DEPAUDIT name audit libraries that
/// `rtld.c` loads (`audit_list_add_dynamic_tag` of the main map) and calls (`la_version`,
/// their constructors) before `_dl_trace`. The tags are read again here, just before
/// the loader runs, not taken from the model's earlier reading; a file that cannot be
/// read is not traced either. No other object's tags count: glibc reads the main map's
/// alone, and fdl's stand-in program has none. Relocation in trace mode runs no IFUNC
/// resolver (`__RTLD_NOIFUNC`), and no constructor runs before trace mode exits.
fn refuse_audited(program: &Path) -> Result<(), NoWitness> {
    let refused = |reason: String| NoWitness {
        reason,
        refused: true,
    };
    let audit = crate::inspect::source::Source::with_file(program, |src| {
        Ok(crate::inspect::elf::parse(src)?.dynamic.audit)
    })
    .map_err(|e| {
        refused(format!(
            "{} cannot be read again just before the trace ({}), so the loader is not asked about it",
            crate::text::clean(&program.display().to_string()),
            crate::text::clean(&format!("{e:#}"))
        ))
    })?;
    if audit.is_empty() {
        return Ok(());
    }
    Err(refused(format!(
        "{} names audit libraries ({}), which glibc loads and runs before it traces anything: fdl never traces such a file, so the model answers alone",
        crate::text::clean(&program.display().to_string()),
        super::map::audit_words(&audit)
    )))
}

/// Whether `text`, written raw into the loader's output as glibc writes paths, could
/// split a line or be read as part of the line's own syntax.
fn splits_trace_lines(text: &str) -> bool {
    text.contains(['\n', '\r'])
        || [" [", "] to ", " => ", " (0x", "symbol `"]
            .iter()
            .any(|sep| text.contains(sep))
}

/// Refuses to trace when a path the loader would print could split or forge its output
/// lines (glibc writes paths raw): the traced file, the working directory, the preloads,
/// `LD_LIBRARY_PATH` and every object of the model's link map. What the model did not
/// foresee is caught after the trace: every line must be the loader's own
/// ([`read_list`], [`read_debug`]).
fn refuse_ambiguous(
    traced: &Path,
    which: &Which,
    env: &LoaderEnv,
    preloads: &[super::preload::Element],
) -> Result<(), NoWitness> {
    let paths = std::iter::once(traced.to_string_lossy())
        .chain(std::iter::once(env.cwd.to_string_lossy()))
        .chain(preloads.iter().map(|e| e.name.as_str().into()))
        .chain(env.ld_library_path.iter().map(|d| d.to_string_lossy()))
        .chain(
            which
                .link_map
                .objects
                .iter()
                .map(|o| o.path.to_string_lossy()),
        );
    for p in paths {
        if splits_trace_lines(&p) {
            return Err(NoWitness {
                reason: format!(
                    "{} holds a line break or text the loader's own output uses as a separator, and glibc prints paths raw: its answer could not be read apart from the path, so the loader is not asked (rename the directory to ask it)",
                    crate::text::clean(&p)
                ),
                refused: true,
            });
        }
    }
    Ok(())
}

/// Asks this host's loader about the process the model answered for in `which`, in
/// `env` (its preloads, `LD_LIBRARY_PATH` and working directory; `/etc/ld.so.preload`
/// and `ld.so.cache` are the host's own).
pub fn ask(which: &Which, env: &LoaderEnv) -> Result<Witness, NoWitness> {
    ask_within(which, env, &Limits::default())
}

/// [`ask`] with its own bounds.
pub fn ask_within(which: &Which, env: &LoaderEnv, limits: &Limits) -> Result<Witness, NoWitness> {
    let interpreter = system_interpreter()?;
    if env.system_dirs_from != "ld.so --help" {
        return Err(none(format!(
            "the system interpreter {} is not a glibc 2.33+ loader fdl can ask",
            interpreter.display()
        )));
    }
    let Some((is_64, little, machine)) = elf_kind(&interpreter) else {
        return Err(none(format!(
            "the system interpreter {} is not a readable ELF file",
            interpreter.display()
        )));
    };
    let host = which.link_map.host;
    if host.is_64 != is_64 || host.machine != machine {
        return Err(none(format!(
            "{} is an ELFCLASS{} file for ELF machine {}; this host's loader ({}) loads ELFCLASS{} for machine {}",
            which.target.display(),
            if host.is_64 { 64 } else { 32 },
            host.machine,
            interpreter.display(),
            if is_64 { 64 } else { 32 },
            machine
        )));
    }
    let mode = match which.link_map.objects.first().map(|o| &o.found_by) {
        Some(FoundBy::Program) => Mode::Program,
        Some(FoundBy::StandInProgram) => Mode::Library,
        _ => return Err(none("the model laid out no program to trace")),
    };
    let traced = if which.target.is_absolute() {
        which.target.clone()
    } else {
        env.cwd.join(&which.target)
    };
    // Never a file that arrived from a peer: not the object, not anything it would load.
    let preloads = super::preload::split_ld_preload(&env.preload);
    let peer = std::iter::once(traced.as_path())
        .chain(which.link_map.objects.iter().map(|o| o.path.as_path()))
        .chain(preloads.iter().map(|e| Path::new(e.name.as_str())))
        .find(|p| !p.as_os_str().is_empty() && from_peer(p));
    if let Some(p) = peer {
        return Err(NoWitness {
            reason: format!(
                "{} lies in a directory a peer ships into ({PEER_DIR_PREFIX}…): fdl never gives the loader a file that arrived from another host",
                p.display()
            ),
            refused: true,
        });
    }
    if mode == Mode::Program {
        refuse_audited(&traced)?;
    }
    refuse_ambiguous(&traced, which, env, &preloads)?;
    // From here to the end a signal is handled here, not by exiting on the spot: the
    // trace's wait ends the loader, and the directory below is removed on the way out
    // (it drops before this guard, being made after it).
    let _critical = crate::process::Critical::enter();
    // 0700 whatever the umask: the stand-in and the trace are fdl's alone.
    let dir = tempfile::Builder::new()
        .prefix("fdl-witness-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir()
        .map_err(|e| {
            none(format!(
                "cannot make a private directory for the trace: {e}"
            ))
        })?;
    let program = match mode {
        Mode::Program => traced.clone(),
        Mode::Library => {
            if !little || !is_64 {
                return Err(none(
                    "fdl writes its stand-in program for 64-bit little-endian hosts only",
                ));
            }
            let p = dir.path().join("stand-in");
            let bytes = stand_in_program(traced.as_os_str().as_encoded_bytes(), machine);
            let written = {
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(&p)
                    .and_then(|mut f| f.write_all(&bytes))
            };
            written.map_err(|e| none(format!("cannot write the stand-in program: {e}")))?;
            p
        }
    };
    let debug = dir.path().join("trace");
    let mut cmd = std::process::Command::new(&interpreter);
    cmd.arg(&program)
        .env_clear()
        .env("LD_TRACE_LOADED_OBJECTS", "1")
        .env("LD_WARN", "yes")
        .env("LD_BIND_NOW", "1")
        .env("LD_DEBUG", "bindings")
        .env("LD_DEBUG_OUTPUT", &debug)
        .current_dir(if env.cwd.as_os_str().is_empty() {
            Path::new("/")
        } else {
            env.cwd.as_path()
        });
    if !env.preload.is_empty() {
        cmd.env("LD_PRELOAD", &env.preload);
    }
    if !env.ld_library_path.is_empty() {
        let joined = std::env::join_paths(&env.ld_library_path)
            .map_err(|e| none(format!("LD_LIBRARY_PATH cannot be passed on: {e}")))?;
        cmd.env("LD_LIBRARY_PATH", joined);
    }
    let (mem, fsize) = (limits.memory, limits.debug_bytes);
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
                // The debug file glibc creates (0666 less the umask) is fdl's alone.
                libc::umask(0o077);
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
    let mut w = Witness::empty(interpreter.clone(), mode, traced.clone(), env.cwd.clone());
    let out = match crate::process::output_within_cap(&mut cmd, limits.time, limits.output_bytes) {
        Ok(Some(o)) => o,
        Ok(None) => {
            w.cut = Some(format!(
                "the loader did not finish within {} s, so it was killed (a preload or library that blocks, such as a FIFO?)",
                limits.time.as_secs_f64()
            ));
            return Ok(w);
        }
        Err(e) if crate::process::too_large(&e).is_some() => {
            w.cut = Some(format!("the loader's {}", crate::process::lift(e)));
            return Ok(w);
        }
        Err(e)
            if e.get_ref()
                .is_some_and(|i| i.is::<crate::process::Interrupted>()) =>
        {
            return Err(none("interrupted"));
        }
        Err(e) => return Err(none(format!("cannot run {}: {e}", interpreter.display()))),
    };
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = out.status.signal() {
            w.cut = Some(if sig == libc::SIGXFSZ {
                format!(
                    "the loader's debug output passed {} MiB, so the kernel stopped it",
                    fsize >> 20
                )
            } else {
                format!("the loader was ended by signal {sig}")
            });
            return Ok(w);
        }
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let cwd = env.cwd.clone();
    read_list(&stdout, &cwd, &mut w);
    let consumer = traced.clone();
    read_stderr(&stderr, &consumer, &mut w);
    if !out.status.success() && w.failures.is_empty() {
        w.failures.push(format!(
            "the loader exited with {}{}",
            out.status,
            stderr
                .lines()
                .next()
                .map(|l| format!(": {}", crate::text::clean(l)))
                .unwrap_or_default()
        ));
    }
    read_debug(dir.path(), &consumer, &cwd, limits, &mut w);
    if w.kind() == Kind::Nccl {
        // The model's reading of the same file, when it names it: no second scan.
        let known = which
            .answer
            .detection()
            .or(which.conditional.as_ref().map(|c| &c.detection))
            .filter(|d| same_file(&d.file, &w.reached[0].object))
            .map(|d| SelfId {
                nccl: d.version.clone(),
                cuda: d.cuda,
            });
        w.nccl = match known {
            Some(id) => Some(id),
            None => crate::inspect::find_nccl_self_id(&w.reached[0].object)
                .ok()
                .flatten(),
        };
    }
    if !env.ld_so_preload.trim().is_empty() || Path::new("/etc/ld.so.preload").exists() {
        w.warnings.push(
            "the loader read this host's own /etc/ld.so.preload, whatever the model was given"
                .into(),
        );
    }
    Ok(w)
}

/// The trace's link map: `\tname => path (0x…)`, `\tpath (0x…)`, `\tname => not found`.
fn read_list(stdout: &str, cwd: &Path, w: &mut Witness) {
    for line in stdout.lines() {
        let Some(line) = line.strip_prefix('\t') else {
            // Trace mode writes only `\t`-led lines: another is a path that split one.
            if !line.is_empty() && w.cut.is_none() {
                w.cut = Some(
                    "the loader's list holds a line that is not its own (a path with a line break?)"
                        .into(),
                );
            }
            continue;
        };
        if let Some(name) = line.strip_suffix(" => not found") {
            w.failures
                .push(format!("{}: not found", crate::text::clean(name)));
            continue;
        }
        let entry = match line.rfind(" (0x") {
            Some(at) => &line[..at],
            None => continue,
        };
        let path = match entry.split_once(" => ") {
            Some((_, p)) => p,
            None => entry,
        };
        // The vDSO has no file; a library found through a relative directory is named
        // relative to the working directory.
        if path.contains('/') && w.link_map.len() < 8192 {
            w.link_map.push(cwd.join(path));
        }
    }
}

/// The loader's errors: fatal ones, and `nccl*` names nothing defines.
fn read_stderr(stderr: &str, consumer: &Path, w: &mut Witness) {
    for line in stderr.lines() {
        if let Some(rest) = line.strip_prefix("undefined symbol: ") {
            // `undefined symbol: NAME\t(OBJECT)` or `NAME, version V\t(OBJECT)`.
            let (name, obj) = rest.split_once('\t').unwrap_or((rest, ""));
            let name = name.split(',').next().unwrap_or(name).trim();
            let obj = obj.trim().trim_start_matches('(').trim_end_matches(')');
            let _ = (obj, consumer);
            if name.starts_with("nccl")
                && w.undefined.len() < 256
                && !w.undefined.iter().any(|u| u == name)
            {
                w.undefined.push(crate::text::clean(name));
            }
        } else if (line.contains("error while loading shared libraries")
            || line.contains("symbol lookup error")
            || line.contains("version `"))
            && w.failures.len() < 64
        {
            w.failures.push(crate::text::clean(line));
        }
    }
}

/// `     PID:\tbinding file A [0] to B [0]: normal symbol `ncclX' [VER]`.
fn parse_binding(line: &str) -> Option<(&str, &str, &str)> {
    let rest = &line[line.find("binding file ")? + "binding file ".len()..];
    let (from, rest) = rest.split_once(" [")?;
    let rest = &rest[rest.find("] to ")? + "] to ".len()..];
    let (to, rest) = rest.split_once(" [")?;
    let sym_at = rest.find(" symbol `")? + " symbol `".len();
    let rest = &rest[sym_at..];
    let sym = &rest[..rest.find('\'')?];
    Some((from, to, sym))
}

/// Reads the debug file glibc wrote (`trace.PID`), streaming, at most
/// [`Limits::debug_bytes`] of it, never through a link.
fn read_debug(dir: &Path, consumer: &Path, cwd: &Path, limits: &Limits, w: &mut Witness) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut found = Bindings::default();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("trace.")) else {
            continue;
        };
        let Ok(f) = crate::fsread::open_regular(&e.path(), true) else {
            w.warnings
                .push("the loader's debug file is not a regular file".into());
            continue;
        };
        let r = std::io::BufReader::new(f.take(limits.debug_bytes));
        read_debug_stream(r, pid, limits, &mut found, w);
    }
    found.into_reached(consumer, cwd, w);
}

/// The `nccl*` binding lines of the debug output, as read: (from, to, symbol).
#[derive(Default)]
struct Bindings {
    kept: Vec<(String, String, String)>,
    total: usize,
}

/// Reads one debug stream of the process `pid` (the `trace.PID` file's suffix).
fn read_debug_stream(
    mut r: impl BufRead,
    pid: &str,
    limits: &Limits,
    found: &mut Bindings,
    w: &mut Witness,
) {
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return;
    }
    let prefix = format!("{pid}:");
    let mut line = Vec::new();
    loop {
        line.clear();
        match r.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&line);
        // Every line glibc writes starts with the process's id: another is the rest of a
        // line a path split, and could say anything.
        if !text.trim_start().starts_with(&prefix) {
            if w.cut.is_none() {
                w.cut = Some(
                    "the loader's debug output holds a line that is not its own (a path with a line break?)"
                        .into(),
                );
            }
            continue;
        }
        if !text.contains("symbol `nccl") {
            continue;
        }
        if let Some((from, to, sym)) = parse_binding(&text) {
            found.total += 1;
            if found.kept.len() < limits.bindings {
                found.kept.push((from.into(), to.into(), sym.into()));
            }
        }
    }
}

impl Bindings {
    /// Groups the bindings by the object they reach: the consumer's own, when it has
    /// any, else every object's.
    fn into_reached(self, consumer: &Path, cwd: &Path, w: &mut Witness) {
        w.bindings_omitted = self.total.saturating_sub(self.kept.len());
        let own: Vec<&(String, String, String)> = self
            .kept
            .iter()
            .filter(|(from, _, _)| same_file(&cwd.join(from), consumer))
            .collect();
        let chosen: Vec<&(String, String, String)> = if own.is_empty() {
            self.kept.iter().collect()
        } else {
            own
        };
        for (from, to, sym) in chosen {
            let to_p = cwd.join(to);
            let i = match w.reached.iter().position(|r| same_file(&r.object, &to_p)) {
                Some(i) => i,
                None => {
                    w.reached.push(Reach {
                        object: to_p,
                        callers: Vec::new(),
                        symbols: Vec::new(),
                    });
                    w.reached.len() - 1
                }
            };
            let r = &mut w.reached[i];
            let from_p = cwd.join(from);
            if !r.callers.contains(&from_p) && r.callers.len() < 64 {
                r.callers.push(from_p);
            }
            if !r.symbols.contains(sym) && r.symbols.len() < 256 {
                r.symbols.push(sym.clone());
            }
        }
    }
}

/// What fdl reads from a trace, from text alone: the loader's stdout (its list), its
/// stderr, and one debug stream of the process `pid`, for the consumer `traced`, paths
/// relative to `cwd`. Nothing is run; the fuzz target `witness_output` feeds it.
pub fn read_output(
    traced: &Path,
    stdout: &str,
    stderr: &str,
    pid: &str,
    debug: &[u8],
    cwd: &Path,
) -> Witness {
    let limits = Limits::default();
    let interpreter = PathBuf::from("ld.so");
    let mut w = Witness::empty(
        interpreter,
        Mode::Program,
        traced.to_path_buf(),
        cwd.to_path_buf(),
    );
    read_list(stdout, cwd, &mut w);
    read_stderr(stderr, traced, &mut w);
    let mut found = Bindings::default();
    read_debug_stream(debug, pid, &limits, &mut found, &mut w);
    found.into_reached(traced, cwd, &mut w);
    w
}

/// A program of no code whose only `DT_NEEDED` is `needed` (a path): one read-write
/// `PT_LOAD` holding the headers, the dynamic section, an empty symbol table and the
/// string table; `PT_GNU_STACK` not executable. ELF64, little-endian, `ET_DYN`.
pub fn stand_in_program(needed: &[u8], machine: u16) -> Vec<u8> {
    const EHDR: u64 = 64;
    const PHDR: u64 = 56;
    const PHNUM: u64 = 3;
    let dynamic_at = EHDR + PHDR * PHNUM;
    let dyn_entries: u64 = 6;
    let symtab_at = dynamic_at + dyn_entries * 16;
    let strtab_at = symtab_at + 24;
    let strsz = needed.len() as u64 + 2;
    let total = strtab_at + strsz;
    let mut b: Vec<u8> = Vec::with_capacity(total as usize);
    let h = |b: &mut Vec<u8>, v: u16| b.extend(v.to_le_bytes());
    let wd = |b: &mut Vec<u8>, v: u32| b.extend(v.to_le_bytes());
    let q = |b: &mut Vec<u8>, v: u64| b.extend(v.to_le_bytes());
    b.extend([0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
    b.extend([0u8; 8]);
    h(&mut b, 3); // ET_DYN
    h(&mut b, machine);
    wd(&mut b, 1);
    q(&mut b, 0); // e_entry: never jumped to
    q(&mut b, EHDR);
    q(&mut b, 0);
    wd(&mut b, 0);
    h(&mut b, EHDR as u16);
    h(&mut b, PHDR as u16);
    h(&mut b, PHNUM as u16);
    h(&mut b, 64);
    h(&mut b, 0);
    h(&mut b, 0);
    let phdr = |b: &mut Vec<u8>, ty: u32, flags: u32, off: u64, size: u64, align: u64| {
        wd(b, ty);
        wd(b, flags);
        q(b, off);
        q(b, off);
        q(b, off);
        q(b, size);
        q(b, size);
        q(b, align);
    };
    phdr(&mut b, object::elf::PT_LOAD, 6, 0, total, 0x1000);
    phdr(
        &mut b,
        object::elf::PT_DYNAMIC,
        6,
        dynamic_at,
        dyn_entries * 16,
        8,
    );
    phdr(&mut b, object::elf::PT_GNU_STACK, 6, 0, 0, 16);
    let d = |b: &mut Vec<u8>, tag: u32, val: u64| {
        q(b, tag as u64);
        q(b, val);
    };
    d(&mut b, object::elf::DT_NEEDED, 1);
    d(&mut b, object::elf::DT_STRTAB, strtab_at);
    d(&mut b, object::elf::DT_STRSZ, strsz);
    d(&mut b, object::elf::DT_SYMTAB, symtab_at);
    d(&mut b, object::elf::DT_SYMENT, 24);
    d(&mut b, object::elf::DT_NULL, 0);
    b.extend([0u8; 24]);
    b.push(0);
    b.extend(needed);
    b.push(0);
    debug_assert_eq!(b.len() as u64, total);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binding_lines_are_read() {
        let l = "     17239:\tbinding file /a/libtorch_cuda.so [0] to /b/libnccl.so.2 [0]: normal symbol `ncclGetUniqueId' [NCCL_2]\n";
        assert_eq!(
            parse_binding(l),
            Some(("/a/libtorch_cuda.so", "/b/libnccl.so.2", "ncclGetUniqueId"))
        );
        assert_eq!(parse_binding("binding file x"), None);
        assert_eq!(parse_binding(""), None);
    }

    fn empty_witness() -> Witness {
        let ld = PathBuf::from("/lib64/ld-linux-x86-64.so.2");
        Witness::empty(
            ld,
            Mode::Program,
            PathBuf::from("/a/prog"),
            PathBuf::from("/"),
        )
    }

    /// [`read_debug`] of one debug file `trace.4242` holding `text`.
    fn debug_of(text: &str) -> Witness {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("trace.4242"), text).unwrap();
        let mut w = empty_witness();
        let (consumer, cwd) = (Path::new("/a/prog"), Path::new("/"));
        read_debug(dir.path(), consumer, cwd, &Limits::default(), &mut w);
        w
    }

    /// A path holding a line break splits the loader's lines: the part after it is no
    /// line of the loader's and is never read as a binding, and the trace answers
    /// nothing.
    #[test]
    fn a_split_line_is_never_read_as_the_loaders() {
        let own = "     4242:\tbinding file /a/prog [0] to /b/libnccl.so.2 [0]: normal symbol `ncclGetVersion' [NCCL_2]\n";
        let w = debug_of(own);
        assert_eq!(w.kind(), Kind::Nccl, "{:?}", w.cut);

        let forged = "     4242:\tbinding file /a/x\ndir/prog [0] to /evil/libnccl.so.2 [0]: normal symbol `ncclGetVersion' [NCCL_2]\n";
        let w = debug_of(forged);
        assert_eq!(w.kind(), Kind::Cut);
        assert!(w.reached.iter().all(|r| !r.object.starts_with("/evil")));

        let mut w = empty_witness();
        read_list(
            "\tlibnccl.so.2 => /a/nl\nFORGED => /evil (0x1)\n",
            Path::new("/"),
            &mut w,
        );
        assert_eq!(w.kind(), Kind::Cut);
    }

    #[test]
    fn separators_and_breaks_in_paths_are_refused() {
        for bad in [
            "/a/x\ny",
            "/a/x\ry",
            "/a/x [0] to /b",
            "/a => /b",
            "/a (0x1)",
        ] {
            assert!(splits_trace_lines(bad), "{bad:?}");
        }
        for fine in ["/a/b c/libnccl.so.2", "/a/[x]/y", "/opt/x:y"] {
            assert!(!splits_trace_lines(fine), "{fine:?}");
        }
    }

    #[test]
    fn peer_directories_are_recognised() {
        assert!(from_peer(Path::new(
            "/p/.builds/.incoming-x/lib/libnccl.so.2"
        )));
        assert!(!from_peer(Path::new("/p/.builds/x/lib/libnccl.so.2")));
    }
}
