//! The link map: the objects glibc's loader would bring into a process, in its order.
//!
//! The order is the global scope's: the program, the preloads, then the breadth-first
//! closure of DT_NEEDED (`_dl_map_object_deps`), each name searched for the object that
//! needs it (`_dl_map_object`): a name holding `/` is a path; otherwise the DT_RPATH of
//! that object and of the objects that loaded it in turn (unless it has DT_RUNPATH), the
//! program's DT_RPATH, `LD_LIBRARY_PATH`, its own DT_RUNPATH, `ld.so.cache`, the system
//! directories — each directory with its `glibc-hwcaps` subdirectories first. A name
//! already loaded (by the name it was asked for, its path or its soname) or a file already
//! loaded (same inode) is not loaded again. Failures are kept with the place in the order
//! where the object would have been, so that an answer can say whether they matter.
//!
//! The work is bounded whatever the files say: at most [`MAX_OBJECTS`] objects and
//! [`MAX_PROBES`] looks at the file system (a path probed, a directory listed once: a
//! name a listed directory lacks costs none), past which the map stops with a caveat (an unknown
//! answer, never a cut map read as whole); the first [`MAX_FAILURES`] failures and
//! [`MAX_CAVEATS`] caveats are kept and the rest counted, since any one of them already
//! makes the answer unknown and the earliest are the ones an answer names.

use super::preload::{self, Element, PreloadSource};
use super::search::{self, Host, LoaderEnv, Probe, ResolveRule};
use crate::inspect::{elf, symver, Source};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// How an object came into the link map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FoundBy {
    /// The executable asked about.
    Program,
    /// A program that links the library asked about and has no search path of its own:
    /// fdl's stand-in when it is asked about a library.
    StandInProgram,
    /// The library asked about, loaded by its path.
    Asked,
    Preload {
        entry: String,
        source: PreloadSource,
    },
    Needed {
        name: String,
        #[serde(serialize_with = "crate::text::json_path::one")]
        needed_by: PathBuf,
        rule: ResolveRule,
    },
    /// Opened by path before the closure reached its name, which its soname answers
    /// ([`LoaderEnv::opened`]).
    OpenedFirst {
        name: String,
        #[serde(serialize_with = "crate::text::json_path::one")]
        needed_by: PathBuf,
        by: String,
    },
}

impl std::fmt::Display for FoundBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FoundBy::Program => f.write_str("the program"),
            FoundBy::StandInProgram => f.write_str("a program linking the library"),
            FoundBy::Asked => f.write_str("the library asked about"),
            FoundBy::Preload { entry, source } => write!(f, "preloaded by {source} ({entry})"),
            FoundBy::Needed {
                name,
                needed_by,
                rule,
            } => write!(
                f,
                "{name}, needed by {}, found via {rule}",
                needed_by.display()
            ),
            FoundBy::OpenedFirst {
                name,
                needed_by,
                by,
            } => write!(
                f,
                "{name}, needed by {}, already open: {by}",
                needed_by.display()
            ),
        }
    }
}

/// One object of the link map.
#[derive(Debug, Clone, Serialize)]
pub struct Object {
    /// The path the loader opens it by (its `l_name`); empty for the stand-in program.
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub path: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soname: Option<String>,
    pub found_by: FoundBy,
    #[serde(skip)]
    pub(crate) needed: Vec<String>,
    #[serde(skip)]
    rpath: Vec<String>,
    #[serde(skip)]
    runpath: Vec<String>,
    #[serde(skip)]
    nodeflib: bool,
    /// Its `$ORIGIN`: the directory of the path it was opened by, not resolving links
    /// (glibc's `_dl_new_object`); the program's is its real directory.
    #[serde(skip)]
    origin: Option<PathBuf>,
    /// The object whose search loaded it (`l_loader`): DT_RPATH is inherited along these.
    #[serde(skip)]
    loader: Option<usize>,
    #[serde(skip)]
    names: Vec<String>,
    #[serde(skip)]
    id: Option<(u64, u64)>,
    /// Its symbol version tables: what it requires of which file, what it defines.
    #[serde(skip)]
    versions: symver::VersionTables,
}

impl Object {
    /// Whether this is fdl's stand-in program, which has no file.
    pub fn is_stand_in(&self) -> bool {
        self.found_by == FoundBy::StandInProgram
    }
}

/// A preload element the loader ignores, and the loader's reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkippedPreload {
    pub entry: String,
    pub source: PreloadSource,
    pub reason: String,
}

/// A DT_NEEDED the loader cannot load: the process does not start.
#[derive(Debug, Clone, Serialize)]
pub struct LoadFailure {
    pub needed: String,
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub needed_by: PathBuf,
    pub reason: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[serde(serialize_with = "crate::text::json_path::many")]
    pub searched: Vec<PathBuf>,
    /// Where in the order the object would have been.
    #[serde(skip)]
    pub position: usize,
}

/// Why a DT_NEEDED fails when no file of its name is anywhere the loader looks (glibc's
/// own words): the one failure that says "not installed on this host", and nothing more.
pub const NOT_FOUND: &str = "cannot open shared object file: No such file or directory";

impl LoadFailure {
    /// Whether the library is simply not on this host (not unreadable, not the wrong
    /// class, not behind an unknown token).
    pub fn is_absent(&self) -> bool {
        self.reason == NOT_FOUND
    }
}

/// Something the model does not decide (a loader rule it does not follow), placed in the
/// order: it can change any answer that lies at or after `position`.
#[derive(Debug, Clone, Serialize)]
pub struct Caveat {
    pub what: String,
    #[serde(skip)]
    pub position: usize,
}

/// The objects of a process, in the global scope's order.
#[derive(Debug, Clone, Serialize)]
pub struct LinkMap {
    pub objects: Vec<Object>,
    pub skipped_preloads: Vec<SkippedPreload>,
    /// The first [`MAX_FAILURES`], in the order's order.
    pub failures: Vec<LoadFailure>,
    /// Failures past [`MAX_FAILURES`], counted only.
    pub failures_omitted: usize,
    /// The first [`MAX_CAVEATS`] distinct ones.
    pub caveats: Vec<Caveat>,
    /// Caveats past [`MAX_CAVEATS`], counted only.
    pub caveats_omitted: usize,
    /// Paths looked at so far, against [`MAX_PROBES`].
    #[serde(skip)]
    probes: usize,
    #[serde(skip)]
    pub host: Host,
    /// Per search directory: whether it has a `glibc-hwcaps` subdirectory and whether it
    /// has a legacy hwcaps one. The same directories are searched for every name; glibc
    /// remembers this the same way.
    #[serde(skip)]
    subdirs: std::collections::HashMap<PathBuf, (bool, bool)>,
    /// Per directory searched: the names it holds, read once ([`MAX_LISTING`] at most;
    /// `None` when it cannot be listed or holds more). A name it lacks is absent without
    /// a probe: a long chain whose every level inherits the DT_RPATH of all before it
    /// asks each directory for each name, as glibc does with an `open` each.
    #[serde(skip)]
    listings:
        std::collections::HashMap<PathBuf, Option<std::collections::HashSet<std::ffi::OsString>>>,
}

/// Names read from one directory for [`LinkMap::listings`]; a larger one is probed name by
/// name.
const MAX_LISTING: usize = 1 << 16;

/// The names in `dir`, or `None` when it cannot be listed (no read permission, say) or
/// holds more than [`MAX_LISTING`]; a directory that does not exist holds none.
fn listing(dir: &Path) -> Option<std::collections::HashSet<std::ffi::OsString>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(Default::default()),
        Err(_) => return None,
    };
    let mut names = std::collections::HashSet::new();
    for e in rd {
        if names.len() >= MAX_LISTING {
            return None;
        }
        names.insert(e.ok()?.file_name());
    }
    Some(names)
}

/// At most this many objects: a real process loads a few hundred; a hostile closure of
/// generated names must not grow without bound.
const MAX_OBJECTS: usize = 4096;
/// Looks at the file system over the whole map (probes and directory listings): a real
/// process's searches make a few thousand; this keeps hostile search lists (many
/// directories, many names) to a second.
pub const MAX_PROBES: usize = 1 << 18;
/// Failures kept with their details; the rest are counted.
pub const MAX_FAILURES: usize = 16;
/// Caveats kept; the rest are counted.
pub const MAX_CAVEATS: usize = 64;
/// Directories one search goes through, before the cache and the system directories.
const MAX_SEARCH_DIRS: usize = 4096;
/// Paths kept in one failure's `searched`.
const MAX_SEARCHED: usize = 1024;

/// What a `dlopen` from one object of the map finds ([`LinkMap::dlopen`]).
#[derive(Debug, Clone)]
pub enum Dlopened {
    /// `path` as the loader opens it; `already` when an object of the map answers the
    /// name, else `rule` is what found it (`None`: a path).
    Loaded {
        path: PathBuf,
        already: bool,
        rule: Option<ResolveRule>,
        caveats: Vec<String>,
    },
    /// The loader's reason (glibc's words when nothing is found) and the paths tried.
    Failed {
        reason: String,
        searched: Vec<PathBuf>,
        caveats: Vec<String>,
    },
}

/// `(dev, ino)` of the file `p` names (links followed, as the loader's `open` does).
pub(crate) fn search_id(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// A file the loader takes: its path as opened, the rule that found it, its identity.
type Hit = (PathBuf, ResolveRule, (u64, u64));

struct Failed {
    reason: String,
    searched: Vec<PathBuf>,
}

/// What the file asked about is to the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetKind {
    /// Its headers decide: `ET_EXEC`, or `ET_DYN` with `PT_INTERP`, is the program.
    FromHeaders,
    /// A library that a program links, whatever its headers say: a libtorch is never
    /// the main program, even when it was linked as a PIE and carries `PT_INTERP`.
    Library,
}

/// Lays out the link map of a process whose program is `target` (an executable), or of
/// a program that links `target` (a shared library), in `env`.
pub fn load(target: &Path, env: &LoaderEnv) -> Result<LinkMap> {
    load_as(target, env, TargetKind::FromHeaders)
}

/// [`load`], with what `target` is to the process said by the caller.
pub fn load_as(target: &Path, env: &LoaderEnv, kind: TargetKind) -> Result<LinkMap> {
    let (info, program_versions) = Source::with_file(target, |src| {
        if src.is_empty() || !elf::is_elf(src.bytes_clipped(0, 16)) {
            bail!(
                "{} is not an ELF file: pass a shared library such as libtorch_cuda.so, or a program",
                target.display()
            );
        }
        let info = elf::parse(src)?;
        let versions = symver::read(src, &info);
        Ok((info, versions))
    })?;
    let host = Host {
        is_64: info.is_64,
        machine: info.machine,
    };
    let has_interp = info
        .segments
        .iter()
        .any(|s| s.p_type == object::elf::PT_INTERP);
    let is_program = kind == TargetKind::FromHeaders
        && (info.e_type == object::elf::ET_EXEC
            || (info.e_type == object::elf::ET_DYN && has_interp));
    let mut map = LinkMap {
        objects: Vec::new(),
        skipped_preloads: Vec::new(),
        failures: Vec::new(),
        failures_omitted: 0,
        caveats: Vec::new(),
        caveats_omitted: 0,
        probes: 0,
        host,
        subdirs: std::collections::HashMap::new(),
        listings: std::collections::HashMap::new(),
    };
    if is_program {
        if info.dynamic.needed.is_empty() && !has_interp {
            bail!(
                "{} is a statically linked program: no loader runs for it, so no preload or library can change its NCCL",
                target.display()
            );
        }
        map.incomplete(&info.dynamic, target);
        if !info.dynamic.audit.is_empty() {
            // glibc loads these into a namespace of their own and calls them before
            // the program's own objects are even mapped; their la_symbind may send any
            // binding elsewhere. fdl reads them, never models what their code does.
            map.caveat(
                format!(
                    "{} names audit libraries ({}): glibc runs them first, and an audit library may redirect any binding, which fdl does not model",
                    target.display(),
                    audit_words(&info.dynamic.audit)
                ),
                0,
            );
        }
        // The kernel gives the loader the program's real path (/proc/self/exe).
        let real = target
            .canonicalize()
            .unwrap_or_else(|_| absolute(env, target));
        let mut program = new_object(
            PathBuf::from(target),
            FoundBy::Program,
            &info.dynamic,
            real.parent().map(Path::to_path_buf),
            None,
            Vec::new(),
            None,
        );
        program.versions = map.versions_or_caveat(program_versions, target);
        map.objects.push(program);
    } else {
        let path = absolute(env, target);
        // What a real program linking the library needs: the library, then libc.
        let mut needed = vec![path.to_string_lossy().into_owned()];
        needed.extend(env.program_needs.iter().cloned());
        map.objects.push(Object {
            path: PathBuf::new(),
            soname: None,
            found_by: FoundBy::StandInProgram,
            needed,
            rpath: env.program_rpath.clone(),
            runpath: Vec::new(),
            nodeflib: false,
            origin: env.program_origin.clone(),
            loader: None,
            names: Vec::new(),
            id: None,
            versions: symver::VersionTables::default(),
        });
    }
    map.preload(env, preload::split_ld_preload(&env.preload));
    map.preload(env, preload::split_ld_so_preload(&env.ld_so_preload));
    // Breadth first over the list as it grows: the program, the preloads, then each
    // object's DT_NEEDED in order (`_dl_map_object_deps`).
    let mut next = 0;
    'closure: while next < map.objects.len() {
        let needed = map.objects[next].needed.clone();
        for name in needed {
            if map.objects.len() >= MAX_OBJECTS {
                bail!(
                    "{}: more than {MAX_OBJECTS} objects in its closure; the libraries are corrupt or hostile",
                    target.display()
                );
            }
            let position = map.objects.len();
            if map.probes > MAX_PROBES {
                map.caveat(
                    format!("the searches for this process's libraries looked at more than {MAX_PROBES} paths; fdl stopped at {name} (needed by {})", map.display_path(next).display()),
                    position,
                );
                break 'closure;
            }
            // `_dl_map_object_deps` replaces the tokens of a DT_NEEDED name first
            // (`expand_dst`), against the object that needs it.
            let expanded = if search::has_token(&name) {
                search::expand(&name, map.objects[next].origin.as_deref())
                    .map(|p| p.to_string_lossy().into_owned())
            } else {
                Ok(name.clone())
            };
            let mapped = match expanded {
                Ok(expanded) => map.map_object(next, &expanded, env, None),
                Err(token) => Err(Failed {
                    reason: format!(
                        "it uses the dynamic string token {token}, whose value fdl does not know"
                    ),
                    searched: Vec::new(),
                }),
            };
            match mapped {
                Ok(_) => {}
                Err(mut f) => {
                    if map.failures.len() < MAX_FAILURES {
                        f.searched.truncate(MAX_SEARCHED);
                        map.failures.push(LoadFailure {
                            needed: name.clone(),
                            needed_by: map.display_path(next),
                            reason: f.reason,
                            searched: f.searched,
                            position,
                        })
                    } else {
                        map.failures_omitted += 1;
                    }
                }
            }
        }
        next += 1;
    }
    map.check_versions();
    Ok(map)
}

fn absolute(env: &LoaderEnv, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        env.cwd.join(p)
    }
}

fn new_object(
    path: PathBuf,
    found_by: FoundBy,
    d: &elf::DynamicInfo,
    origin: Option<PathBuf>,
    loader: Option<usize>,
    names: Vec<String>,
    id: Option<(u64, u64)>,
) -> Object {
    // glibc ignores DT_RPATH when DT_RUNPATH is present (get-dynamic-info.h).
    let rpath = if d.runpath.is_empty() {
        d.rpath.clone()
    } else {
        Vec::new()
    };
    let mut names = names;
    names.push(path.to_string_lossy().into_owned());
    Object {
        path,
        soname: d.soname.clone(),
        found_by,
        needed: d.needed.clone(),
        rpath,
        runpath: d.runpath.clone(),
        nodeflib: d.flags_1 & u64::from(object::elf::DF_1_NODEFLIB) != 0,
        origin,
        loader,
        names,
        id,
        versions: symver::VersionTables::default(),
    }
}

/// `DT_AUDIT libaudit.so, DT_DEPAUDIT …`: the audit tags of an object, terminal-safe.
pub fn audit_words(audit: &[(&'static str, String)]) -> String {
    audit
        .iter()
        .map(|(tag, name)| format!("{tag} {}", crate::text::clean(name)))
        .collect::<Vec<_>>()
        .join(", ")
}

impl LinkMap {
    /// Records a caveat at `position`, once, up to [`MAX_CAVEATS`] of them.
    fn caveat(&mut self, what: String, position: usize) {
        if self.caveats.iter().any(|c| c.what == what) {
            return;
        }
        if self.caveats.len() < MAX_CAVEATS {
            self.caveats.push(Caveat { what, position });
        } else {
            self.caveats_omitted += 1;
        }
    }

    /// What the dynamic table of the object about to be placed at the end of the order
    /// leaves unknown: a caveat for that object.
    fn incomplete(&mut self, d: &elf::DynamicInfo, path: &Path) {
        let position = self.objects.len();
        for why in &d.incomplete {
            let what = format!("{}: {why}", path.display());
            self.caveat(what, position);
        }
    }

    fn display_path(&self, i: usize) -> PathBuf {
        let o = &self.objects[i];
        if o.is_stand_in() {
            PathBuf::from("(the program)")
        } else {
            o.path.clone()
        }
    }

    fn preload(&mut self, env: &LoaderEnv, elements: Vec<Element>) {
        for e in elements {
            if let Some(why) = e.dropped {
                self.skipped_preloads.push(SkippedPreload {
                    entry: e.name,
                    source: e.source,
                    reason: why.to_string(),
                });
                continue;
            }
            if self.objects.len() >= MAX_OBJECTS {
                return;
            }
            let found_by = FoundBy::Preload {
                entry: e.name.clone(),
                source: e.source,
            };
            if let Err(f) = self.map_object(0, &e.name, env, Some(found_by)) {
                self.skipped_preloads.push(SkippedPreload {
                    entry: e.name,
                    source: e.source,
                    reason: f.reason,
                });
            }
        }
    }

    /// `_dl_map_object`: the index of the object `name` names when `loader` asks for it.
    fn map_object(
        &mut self,
        loader: usize,
        name: &str,
        env: &LoaderEnv,
        preload: Option<FoundBy>,
    ) -> std::result::Result<usize, Failed> {
        if let Some(i) = self
            .objects
            .iter()
            .position(|o| o.names.iter().any(|n| n == name) || o.soname.as_deref() == Some(name))
        {
            return Ok(i);
        }
        // A library the process opened by path before (torch's ctypes loads): its
        // soname answers the name, wherever the closure asks for it.
        let opened = match preload {
            None if !name.contains('/') => env
                .opened
                .iter()
                .find(|o| o.soname.as_deref() == Some(name))
                .and_then(|o| {
                    self.probes += 1;
                    match search::probe(&absolute(env, &o.path), self.host) {
                        Probe::Take { dev, ino } => {
                            Some((o.path.clone(), o.by.clone(), (dev, ino)))
                        }
                        _ => None,
                    }
                }),
            _ => None,
        };
        let (path, rule, id, opened_by) = match opened {
            Some((path, by, id)) => (path, ResolveRule::Path, id, Some(by)),
            None => {
                let (path, rule, id) = self.search(loader, name, env)?;
                (path, rule, id, None)
            }
        };
        if let Some(i) = self.objects.iter().position(|o| o.id == Some(id)) {
            self.objects[i].names.push(name.to_string());
            return Ok(i);
        }
        let info = Source::with_file(&path, |src| {
            let info = elf::parse(src)?;
            let versions = symver::read(src, &info);
            Ok((info, versions))
        })
        .with_context(|| format!("{} cannot be read", path.display()));
        let (dynamic, versions) = match info {
            Ok((i, v)) => {
                self.incomplete(&i.dynamic, &path);
                (i.dynamic, self.versions_or_caveat(v, &path))
            }
            Err(e) => {
                // The loader would read it; fdl cannot, so what it needs is unknown.
                self.caveat(format!("{e:#}"), self.objects.len());
                (
                    elf::DynamicInfo::default(),
                    symver::VersionTables::default(),
                )
            }
        };
        if dynamic.flags_1 & u64::from(object::elf::DF_1_PIE) != 0 {
            // `_dl_map_object_from_fd` refuses a PIE anywhere but as the main program
            // (glibc 2.30+), after the search chose it: no other file is tried.
            return Err(Failed {
                reason: format!(
                    "{}: cannot dynamically load position-independent executable (DF_1_PIE): a program, not a library",
                    path.display()
                ),
                searched: vec![path],
            });
        }
        let found_by = match (preload, opened_by) {
            (Some(p), _) => p,
            (None, Some(by)) => FoundBy::OpenedFirst {
                name: name.to_string(),
                needed_by: self.display_path(loader),
                by,
            },
            (None, None) if self.objects[loader].is_stand_in() => FoundBy::Asked,
            (None, None) => FoundBy::Needed {
                name: name.to_string(),
                needed_by: self.display_path(loader),
                rule,
            },
        };
        // What ctypes opened, the interpreter opened: its DT_RPATH chain is the program's.
        let loader = if matches!(found_by, FoundBy::OpenedFirst { .. }) {
            0
        } else {
            loader
        };
        let origin = Some(
            absolute(env, &path)
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from("/")),
        );
        let mut object = new_object(
            path,
            found_by,
            &dynamic,
            origin,
            Some(loader),
            vec![name.to_string()],
            Some(id),
        );
        object.versions = versions;
        self.objects.push(object);
        Ok(self.objects.len() - 1)
    }

    /// `dlopen(name)` called from the object at `caller` (glibc's `dl_open_worker` hands
    /// `_dl_map_object` the caller's map as the loader): an object already loaded under
    /// that name or file answers; otherwise the search a DT_NEEDED of `caller` would make,
    /// DT_RPATH inherited along `caller`'s loaders included. The map itself is unchanged:
    /// the search runs on a copy, and the caveats it raises are returned with it.
    pub fn dlopen(&self, caller: usize, name: &str, env: &LoaderEnv) -> Dlopened {
        self.clone().dlopen_in(caller, name, env)
    }

    /// `dlopen(name)` called from a library that `LD_PRELOAD` will load by `path` but that
    /// is not there yet, with no search path of its own (no DT_RPATH, no DT_RUNPATH): the
    /// NCCL fdl is about to build, as its wiring will load it. The program loads a preload
    /// (`_dl_map_object` with the main map as loader), so the program's DT_RPATH is all
    /// it inherits; what this map's other objects' DT_RPATH found is out of its reach.
    pub fn dlopen_from_new_preload(&self, path: &Path, name: &str, env: &LoaderEnv) -> Dlopened {
        let mut m = self.clone();
        let caller = m.objects.len();
        m.objects.push(Object {
            path: path.to_path_buf(),
            soname: None,
            found_by: FoundBy::Preload {
                entry: path.to_string_lossy().into_owned(),
                source: PreloadSource::LdPreload,
            },
            needed: Vec::new(),
            rpath: Vec::new(),
            runpath: Vec::new(),
            nodeflib: false,
            origin: path.parent().map(Path::to_path_buf),
            loader: (!m.objects.is_empty()).then_some(0),
            names: Vec::new(),
            id: None,
            versions: symver::VersionTables::default(),
        });
        m.dlopen_in(caller, name, env)
    }

    fn dlopen_in(mut self, caller: usize, name: &str, env: &LoaderEnv) -> Dlopened {
        let m = &mut self;
        let before = m.objects.len();
        let caveats_before = m.caveats.len();
        let result = m.map_object(caller, name, env, None);
        let caveats = m.caveats[caveats_before.min(m.caveats.len())..]
            .iter()
            .map(|c| c.what.clone())
            .collect();
        match result {
            Ok(i) if i < before => Dlopened::Loaded {
                path: m.objects[i].path.clone(),
                already: true,
                rule: None,
                caveats,
            },
            Ok(i) => {
                let rule = match &m.objects[i].found_by {
                    FoundBy::Needed { rule, .. } => Some(*rule),
                    _ => None,
                };
                Dlopened::Loaded {
                    path: m.objects[i].path.clone(),
                    already: false,
                    rule,
                    caveats,
                }
            }
            Err(f) => Dlopened::Failed {
                reason: f.reason,
                searched: f.searched.into_iter().take(MAX_SEARCHED).collect(),
                caveats,
            },
        }
    }

    /// The index of the object opened by `path` (or the same file), if it is loaded.
    pub fn index_of(&self, path: &Path) -> Option<usize> {
        let id = search_id(path);
        self.objects
            .iter()
            .position(|o| !o.is_stand_in() && (o.path == path || (id.is_some() && o.id == id)))
    }

    /// The version tables read for the object about to be placed at the end of the
    /// order; when they cannot be read, empty ones and a caveat for that object.
    fn versions_or_caveat(
        &mut self,
        read: Result<symver::VersionTables>,
        path: &Path,
    ) -> symver::VersionTables {
        read.unwrap_or_else(|e| {
            self.caveat(
                format!(
                    "the symbol version tables of {} cannot be read: {e:#}",
                    path.display()
                ),
                self.objects.len(),
            );
            symver::VersionTables::default()
        })
    }

    /// Keeps a failure, up to [`MAX_FAILURES`] of them.
    fn fail(&mut self, f: LoadFailure) {
        if self.failures.len() < MAX_FAILURES {
            self.failures.push(f);
        } else {
            self.failures_omitted += 1;
        }
    }

    /// glibc's `_dl_check_map_versions` over the whole map, once everything is loaded,
    /// object by object in the order: every version an object requires (DT_VERNEED) of a
    /// file must be defined (DT_VERDEF) by the object loaded under that name, or the
    /// process does not start ("version `X' not found (required by Y)"), a failure placed
    /// at the object that lacks it. A weak requirement only warns, and so does a file
    /// with no version definitions at all (a versioned lookup that reaches a definition
    /// in such a file without a DT_VERSYM fails glibc's assertion: the lookup says so,
    /// `interpose::exported_among_versioned`).
    fn check_versions(&mut self) {
        for i in 0..self.objects.len() {
            if self.objects[i].is_stand_in() {
                continue;
            }
            let requirer = self.display_path(i);
            if let Some(why) = self.objects[i].versions.needs_error.clone() {
                self.fail(LoadFailure {
                    needed: requirer.to_string_lossy().into_owned(),
                    needed_by: requirer.clone(),
                    reason: why,
                    searched: Vec::new(),
                    position: i,
                });
                continue;
            }
            let needs = self.objects[i].versions.needs.clone();
            for need in needs {
                let Some(j) = self.objects.iter().position(|o| {
                    o.names.contains(&need.file) || o.soname.as_deref() == Some(need.file.as_str())
                }) else {
                    // Not loaded: its load failure already says the process does not start.
                    continue;
                };
                let provider = &self.objects[j].versions;
                // No definitions at all: glibc only says "no version information
                // available", and its unversioned symbols answer.
                let Some(defines) = provider.defines.clone() else {
                    continue;
                };
                let defines_error = provider.defines_error.clone();
                for r in &need.versions {
                    let defined = defines
                        .iter()
                        .any(|d| d.hash == r.version.hash && d.name == r.version.name);
                    let reason = match &defines_error {
                        Some(why) => why.clone(),
                        None if defined || r.weak => continue,
                        None => format!(
                            "version `{}' not found (required by {}): the process does not start",
                            r.version.name,
                            requirer.display()
                        ),
                    };
                    self.fail(LoadFailure {
                        needed: need.file.clone(),
                        needed_by: requirer.clone(),
                        reason,
                        searched: Vec::new(),
                        position: j,
                    });
                }
            }
        }
        self.failures.sort_by_key(|f| f.position);
    }

    /// The directories `loader`'s search for a bare name goes through, before the cache.
    fn search_dirs(&mut self, loader: usize, env: &LoaderEnv) -> Vec<(PathBuf, ResolveRule)> {
        let mut dirs = Vec::new();
        let position = self.objects.len();
        let mut unknown = Vec::new();
        let mut push =
            |entries: &[String], origin: Option<&Path>, rule: ResolveRule, whose: &Path| {
                for e in entries {
                    // An empty entry is the working directory (glibc's `fillin_rpath`); one
                    // whose tokens expand to nothing is dropped.
                    if e.is_empty() {
                        dirs.push((PathBuf::from("."), rule));
                        continue;
                    }
                    match search::expand(e, origin) {
                        Ok(d) if d.as_os_str().is_empty() => {}
                        Ok(d) => dirs.push((d, rule)),
                        Err(token) => unknown.push(format!(
                            "{rule} entry '{e}' of {} uses {token}, whose value fdl does not know",
                            whose.display()
                        )),
                    }
                }
            };
        let l = &self.objects[loader];
        if l.runpath.is_empty() {
            let mut did_main = false;
            let mut cur = Some(loader);
            while let Some(i) = cur {
                let o = &self.objects[i];
                if !o.rpath.is_empty() {
                    push(&o.rpath, o.origin.as_deref(), ResolveRule::Rpath, &o.path);
                    did_main |= i == 0;
                }
                cur = o.loader;
            }
            let main = &self.objects[0];
            if !did_main && !main.rpath.is_empty() {
                push(
                    &main.rpath,
                    main.origin.as_deref(),
                    ResolveRule::Rpath,
                    &main.path,
                );
            }
        }
        // $ORIGIN in LD_LIBRARY_PATH is the program's directory. glibc replaces the
        // tokens of the whole variable first, then splits it and replaces each
        // element's again (`_dl_init_paths`, `fillin_rpath`).
        let main_origin = self.objects[0].origin.clone();
        let mut llp_unknown = None;
        let joined = env
            .ld_library_path
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(":");
        let llp: Vec<String> = if search::has_token(&joined) {
            match search::expand(&joined, main_origin.as_deref()) {
                Ok(whole) => search::split_path_list(&whole.to_string_lossy())
                    .into_iter()
                    .map(|p| p.to_string_lossy().into_owned())
                    .collect(),
                Err(token) => {
                    llp_unknown = Some(format!(
                        "LD_LIBRARY_PATH uses {token}, whose value fdl does not know"
                    ));
                    Vec::new()
                }
            }
        } else {
            env.ld_library_path
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect()
        };
        push(
            &llp,
            main_origin.as_deref(),
            ResolveRule::LdLibraryPath,
            Path::new("LD_LIBRARY_PATH"),
        );
        let l = &self.objects[loader];
        push(
            &l.runpath,
            l.origin.as_deref(),
            ResolveRule::Runpath,
            &l.path,
        );
        unknown.extend(llp_unknown);
        for what in unknown {
            self.caveat(what, position);
        }
        dirs
    }

    /// Finds a file for `name` as `loader`'s search would: its path, the rule and its
    /// identity; or why the loader fails.
    fn search(
        &mut self,
        loader: usize,
        name: &str,
        env: &LoaderEnv,
    ) -> std::result::Result<Hit, Failed> {
        let host = self.host;
        let mut searched = Vec::new();
        if name.contains('/') {
            // `_dl_map_object` replaces the tokens of a path (again, for a DT_NEEDED
            // entry) against the object that asks for it.
            let path = match search::expand(name, self.objects[loader].origin.as_deref()) {
                Ok(p) => p,
                Err(token) => {
                    return Err(Failed {
                        reason: format!(
                        "it uses the dynamic string token {token}, whose value fdl does not know"
                    ),
                        searched,
                    })
                }
            };
            let full = absolute(env, &path);
            self.probes += 1;
            return match search::probe(&full, host) {
                Probe::Take { dev, ino } => Ok((path, ResolveRule::Path, (dev, ino))),
                Probe::Absent => Err(Failed {
                    reason: NOT_FOUND.into(),
                    searched: vec![path],
                }),
                Probe::OtherKind(why) | Probe::Fatal(why) => Err(Failed {
                    reason: why,
                    searched: vec![path],
                }),
            };
        }
        let position = self.objects.len();
        let mut dirs = self.search_dirs(loader, env);
        if dirs.len() > MAX_SEARCH_DIRS {
            self.caveat(
                format!("the search for {name} goes through {} directories (DT_RPATH inherited along the loaders, LD_LIBRARY_PATH, DT_RUNPATH); fdl searches the first {MAX_SEARCH_DIRS}", dirs.len()),
                position,
            );
            dirs.truncate(MAX_SEARCH_DIRS);
        }
        let nodeflib = self.objects[loader].nodeflib;
        let mut hit: Option<Hit> = None;
        let mut fatal: Option<String> = None;
        let mut legacy = Vec::new();
        let mut subdirs = std::mem::take(&mut self.subdirs);
        let mut listings = std::mem::take(&mut self.listings);
        // What reached the file system: probes, and each directory listed once.
        let looked = std::cell::Cell::new(0usize);
        let mut try_dir = |dir: &Path,
                           rule: ResolveRule,
                           searched: &mut Vec<PathBuf>,
                           legacy: &mut Vec<PathBuf>|
         -> Option<std::result::Result<Hit, String>> {
            let (hw, old) = *subdirs.entry(dir.to_path_buf()).or_insert_with(|| {
                let full = absolute(env, dir);
                (
                    full.join("glibc-hwcaps").is_dir(),
                    env.legacy_hwcaps.iter().any(|l| full.join(l).is_dir()),
                )
            });
            // glibc-hwcaps subdirectories, best first; then the legacy ones (combinations
            // of their names, not modelled: a file there could be taken first); then the
            // directory itself.
            let mut candidates: Vec<PathBuf> = Vec::new();
            if hw {
                candidates.extend(
                    env.hwcaps
                        .iter()
                        .map(|h| dir.join("glibc-hwcaps").join(h).join(name)),
                );
            }
            if old {
                for a in &env.legacy_hwcaps {
                    let one = dir.join(a);
                    let mut paths = vec![one.join(name)];
                    for b in &env.legacy_hwcaps {
                        paths.push(one.join(b).join(name));
                        for c in &env.legacy_hwcaps {
                            paths.push(one.join(b).join(c).join(name));
                        }
                    }
                    legacy.extend(paths.into_iter().filter(|p| absolute(env, p).exists()));
                }
            }
            candidates.push(dir.join(name));
            for cand in candidates {
                let full = absolute(env, &cand);
                searched.push(cand.clone());
                if let (Some(parent), Some(file)) = (full.parent(), full.file_name()) {
                    let names = listings.entry(parent.to_path_buf()).or_insert_with(|| {
                        looked.set(looked.get() + 1);
                        listing(parent)
                    });
                    if names.as_ref().is_some_and(|n| !n.contains(file)) {
                        continue;
                    }
                }
                looked.set(looked.get() + 1);
                match search::probe(&full, host) {
                    Probe::Take { dev, ino } => return Some(Ok((cand, rule, (dev, ino)))),
                    Probe::Fatal(why) => return Some(Err(format!("{}: {why}", cand.display()))),
                    Probe::Absent | Probe::OtherKind(_) => {}
                }
            }
            None
        };
        for (dir, rule) in &dirs {
            match try_dir(dir, *rule, &mut searched, &mut legacy) {
                Some(Ok(h)) => {
                    hit = Some(h);
                    break;
                }
                Some(Err(why)) => {
                    fatal = Some(why);
                    break;
                }
                None => {}
            }
        }
        let in_system_dir = |p: &Path| env.default_dirs.iter().any(|d| p.starts_with(d));
        if hit.is_none() && fatal.is_none() {
            if let Some(cached) = env.cache_lookup(name) {
                if !(nodeflib && in_system_dir(cached)) {
                    searched.push(cached.to_path_buf());
                    looked.set(looked.get() + 1);
                    match search::probe(cached, host) {
                        Probe::Take { dev, ino } => {
                            hit = Some((cached.to_path_buf(), ResolveRule::LdCache, (dev, ino)))
                        }
                        Probe::Fatal(why) => fatal = Some(format!("{}: {why}", cached.display())),
                        _ => {}
                    }
                }
            }
            if env.cache_hwcaps_names.iter().any(|n| n == name) {
                self.caveat(format!("ld.so.cache lists {name} for a glibc-hwcaps subdirectory too, and fdl does not rank such entries"), position);
            }
        }
        if hit.is_none() && fatal.is_none() && !nodeflib {
            for dir in &env.default_dirs {
                match try_dir(dir, ResolveRule::DefaultDir, &mut searched, &mut legacy) {
                    Some(Ok(h)) => {
                        hit = Some(h);
                        break;
                    }
                    Some(Err(why)) => {
                        fatal = Some(why);
                        break;
                    }
                    None => {}
                }
            }
        }
        self.subdirs = subdirs;
        self.listings = listings;
        for l in legacy {
            self.caveat(
                format!(
                    "{} lies in a legacy hwcaps subdirectory, which glibc before 2.37 may prefer; fdl does not model those",
                    l.display()
                ),
                position,
            );
        }
        self.probes = self.probes.saturating_add(looked.get());
        if let Some(why) = fatal {
            return Err(Failed {
                reason: why,
                searched,
            });
        }
        hit.ok_or(Failed {
            reason: NOT_FOUND.into(),
            searched,
        })
    }
}
