//! Which NCCL plugins a process's NCCL would load, found as its `dlopen` finds them.
//!
//! NCCL (`src/plugin/plugin_open.cc`, 2.26 and later; `src/net.cc` and
//! `src/misc/tuner.cc` before) opens each plugin with `dlopen(name, RTLD_NOW | RTLD_LOCAL)`
//! called from libnccl itself, so glibc searches for `name` as for a DT_NEEDED of the NCCL
//! object: the DT_RPATH of NCCL and of the objects that loaded it in turn (unless NCCL has
//! DT_RUNPATH), the program's, `LD_LIBRARY_PATH`, NCCL's DT_RUNPATH, the cache, the system
//! directories ([`super::map::LinkMap::dlopen`]). The names, per kind (`net`, `tuner`, `profiler`,
//! `env`, `gin`, `rma`; variable `NCCL_<KIND>_PLUGIN`, prefix `libnccl-<kind>`):
//! - unset (or empty, for the kinds that are not lists): `libnccl-<kind>.so`;
//! - `none` (any case): no external plugin;
//! - a value: the value itself, then — unless it holds `/` or is itself a `lib….so`
//!   name — `libnccl-<kind>-<value>.so` (before 2.26, always both);
//! - `NCCL_NET_PLUGIN` (2.27 and later), `NCCL_GIN_PLUGIN`, `NCCL_RMA_PLUGIN` are comma
//!   lists, tried in order; set but empty, they name no external plugin.
//!
//! A plugin answers with versioned entry symbols (`ncclNetPlugin_v10`,
//! `ncclTunerPlugin_v4`, `ncclProfiler_v5`, `ncclEnvPlugin_v2`, …), which NCCL looks up
//! with `dlsym`, newest first; a plugin exporting none it knows is ignored and NCCL uses
//! its internal transport (net) or none. What one NCCL knows is read from its own
//! read-only data, where each name it looks up is a string — never from a table of
//! releases. When no tuner library is found, NCCL looks for the tuner's entry in the net
//! plugin (2.26 and later): that is modelled too.

use super::bind::{Answer, Which};
use super::map::Dlopened;
use super::search::LoaderEnv;
use crate::inspect::{elf, interpose, ResolveRule, Source};
use anyhow::Result;
use serde::Serialize;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The kinds of plugin NCCL knows how to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Net,
    Tuner,
    Profiler,
    Env,
    Gin,
    Rma,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::Net,
        Kind::Tuner,
        Kind::Profiler,
        Kind::Env,
        Kind::Gin,
        Kind::Rma,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Net => "net",
            Kind::Tuner => "tuner",
            Kind::Profiler => "profiler",
            Kind::Env => "env",
            Kind::Gin => "gin",
            Kind::Rma => "rma",
        }
    }

    /// The variable that names the plugin.
    pub fn variable(self) -> String {
        format!("NCCL_{}_PLUGIN", self.name().to_ascii_uppercase())
    }

    /// The file-name prefix: `libnccl-net`.
    pub fn prefix(self) -> String {
        format!("libnccl-{}", self.name())
    }

    /// The entry symbol's name before its version number. The profiler's lacks
    /// "Plugin" (`profiler_v*.cc` looks up `ncclProfiler_vN`).
    pub fn entry(self) -> &'static str {
        match self {
            Kind::Net => "ncclNetPlugin_v",
            Kind::Tuner => "ncclTunerPlugin_v",
            Kind::Profiler => "ncclProfiler_v",
            Kind::Env => "ncclEnvPlugin_v",
            Kind::Gin => "ncclGinPlugin_v",
            Kind::Rma => "ncclRmaPlugin_v",
        }
    }
}

/// What one NCCL binary asks of plugins, read from its read-only data.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Asks {
    /// Per kind, the entry versions it looks up, newest first; a kind it does not open
    /// at all is absent.
    pub kinds: Vec<(Kind, Vec<u32>)>,
    /// Whether it makes the second name `libnccl-<kind>-<value>.so` only for a value that
    /// is no path and no `lib….so` name (its format string `%s-%s.so`, 2.26 and later);
    /// else it always tries both.
    pub checks_value: bool,
    /// The kinds whose variable is a comma list here (its message "NCCL_<KIND>_PLUGIN
    /// list contains …").
    pub lists: Vec<Kind>,
}

impl Asks {
    pub fn versions(&self, kind: Kind) -> Option<&[u32]> {
        self.kinds
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, v)| v.as_slice())
    }
}

/// Versions beyond this are not a version number NCCL formats: a corrupt file.
const MAX_VERSION: u32 = 1000;
/// Entry versions kept per kind.
const MAX_VERSIONS: usize = 64;

/// Reads what the NCCL at `path` asks of plugins. Only the regions where its string
/// literals can live are scanned, a window at a time: its read-only data less the GPU
/// code (a real NCCL's fatbins are 400 MB of its 430, and hold no dlsym names).
pub fn read_asks(path: &Path) -> Result<Asks> {
    Source::with_file(path, |src| {
        let info = elf::parse(src)?;
        let mut found: Vec<(Kind, BTreeSet<u32>)> =
            Kind::ALL.iter().map(|k| (*k, BTreeSet::new())).collect();
        let mut checks_value = false;
        let mut lists = BTreeSet::new();
        for (offset, size) in crate::inspect::string_regions(&info) {
            for (kind, set) in found.iter_mut() {
                let needle = kind.entry().as_bytes();
                src.find_iter(offset, size, needle, 8, |at, rest| {
                    // A whole string: NUL before (or the section's start) and digits,
                    // then NUL, after; `ncclProfilerProxyOp…_v4` never matches.
                    let starts = at == offset || src.bytes_clipped(at - 1, 1) == [0];
                    let digits = &rest[needle.len()..];
                    let n = digits.iter().take_while(|b| b.is_ascii_digit()).count();
                    if starts && n > 0 && digits.get(n) == Some(&0) {
                        if let Some(v) = std::str::from_utf8(&digits[..n])
                            .ok()
                            .and_then(exact_version)
                            .filter(|v| *v <= MAX_VERSION)
                        {
                            if set.len() < MAX_VERSIONS {
                                set.insert(v);
                            }
                        }
                    }
                    true
                })?;
                let list = format!("{} list contains", kind.variable());
                src.find_iter(offset, size, list.as_bytes(), 0, |_, _| {
                    lists.insert(*kind);
                    false
                })?;
            }
            src.find_iter(offset, size, b"\0%s-%s.so\0", 0, |_, _| {
                checks_value = true;
                false
            })?;
        }
        src.check_len()?;
        Ok(Asks {
            kinds: found
                .into_iter()
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| (k, v.into_iter().rev().collect()))
                .collect(),
            checks_value,
            lists: lists.into_iter().collect(),
        })
    })
}

/// The names NCCL passes to `dlopen` for `kind`, given its variable's value: one group
/// per element of the list (one for a kind that is not a list), each tried in order
/// until one opens; empty when it opens no external plugin.
pub fn candidate_names(kind: Kind, value: Option<&str>, asks: &Asks) -> Vec<Vec<String>> {
    let prefix = kind.prefix();
    let default = vec![vec![format!("{prefix}.so")]];
    let Some(value) = value else {
        return default;
    };
    if value.eq_ignore_ascii_case("none") {
        return Vec::new();
    }
    let list = asks.lists.contains(&kind);
    let elements: Vec<&str> = if list {
        // strtok_r: empty elements vanish; an empty value names nothing.
        value.split(',').filter(|e| !e.is_empty()).collect()
    } else if value.is_empty() {
        return default;
    } else {
        vec![value]
    };
    elements
        .into_iter()
        .map(|e| {
            let mut group = vec![e.to_string()];
            let lib_so = e.starts_with("lib") && e.len() >= 3 && e.ends_with(".so");
            if !asks.checks_value || (!e.contains('/') && !lib_so) {
                group.push(format!("{prefix}-{e}.so"));
            }
            group
        })
        .collect()
}

/// One name NCCL would `dlopen`, and what the loader finds.
#[derive(Debug, Clone, Serialize)]
pub struct Try {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[serde(serialize_with = "crate::text::json_path::opt")]
    pub found: Option<PathBuf>,
    /// The rule that found it; `already_loaded` when an object of the process answers
    /// the name; `path` for a name holding `/`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    /// With `found`: the entry versions the file exports; `None` when unreadable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exports: Option<Vec<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[serde(serialize_with = "crate::text::json_path::many")]
    pub searched: Vec<PathBuf>,
}

/// What NCCL does with one kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// The plugin at `path` answers with entry version `version`.
    Loaded {
        #[serde(serialize_with = "crate::text::json_path::one")]
        path: PathBuf,
        version: u32,
        /// Set when found inside the net plugin (the tuner's fallback).
        #[serde(skip_serializing_if = "Option::is_none")]
        from_net_plugin: Option<bool>,
    },
    /// Nothing found: NCCL uses its internal implementation (net: IB or sockets).
    NotFound,
    /// Found, but it exports no entry version this NCCL asks for: ignored.
    NoCommonVersion { path: PathBuf, exports: Vec<u32> },
    /// `none`, or an empty list: no external plugin.
    Disabled,
    /// The model cannot say.
    Unknown { reason: String },
}

impl Verdict {
    pub fn word(&self) -> &'static str {
        match self {
            Verdict::Loaded { .. } => "loaded",
            Verdict::NotFound => "not_found",
            Verdict::NoCommonVersion { .. } => "no_common_version",
            Verdict::Disabled => "disabled",
            Verdict::Unknown { .. } => "unknown",
        }
    }
}

/// One kind's answer.
#[derive(Debug, Clone, Serialize)]
pub struct KindReport {
    pub kind: Kind,
    pub variable: String,
    /// The variable's value, as NCCL reads it (`None`: unset).
    pub value: Option<String>,
    /// The entry versions this NCCL asks for, newest first.
    pub asks: Vec<u32>,
    pub tries: Vec<Try>,
    #[serde(flatten)]
    pub verdict: Verdict,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub caveats: Vec<String>,
}

/// The answer for every kind the NCCL opens.
#[derive(Debug, Clone, Serialize)]
pub struct Plugins {
    /// The NCCL object that calls `dlopen`.
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub nccl: PathBuf,
    pub kinds: Vec<KindReport>,
    /// NCCL also reads these variables from `NCCL_CONF_FILE`, `~/.nccl.conf` and
    /// `/etc/nccl.conf` (`initEnv`); the ones that exist are named here.
    #[serde(serialize_with = "crate::text::json_path::many")]
    pub config_files: Vec<PathBuf>,
}

impl KindReport {
    /// The try whose file is `path`: how it was found, and what it exports.
    pub fn try_of(&self, path: &Path) -> Option<&Try> {
        self.tries.iter().find(|t| t.found.as_deref() == Some(path))
    }
}

impl Plugins {
    pub fn kind(&self, kind: Kind) -> Option<&KindReport> {
        self.kinds.iter().find(|k| k.kind == kind)
    }
}

/// The plugins the NCCL of `which` (its answer) would load in `env`, with the plugin
/// variables read through `var`. `Err` says why there is no one NCCL to ask.
pub fn plugins(which: &Which, env: &LoaderEnv, var: &dyn Fn(&str) -> Option<String>) -> Outcome {
    let file = nccl_of(which)?;
    let caller = which
        .link_map
        .index_of(&file)
        .ok_or_else(|| format!("{} is not in the link map", file.display()))?;
    let asks = read_asks(&file).map_err(|e| format!("{e:#}"))?;
    let open = |name: &str| which.link_map.dlopen(caller, name, env);
    Ok(judge_all(file, &asks, &open, env, var))
}

/// What [`plugins`] answers.
pub type Outcome = std::result::Result<Plugins, String>;

/// How the plugin variables are read: a name to its value (`None`: unset).
pub type Vars<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The plugins a build of the same NCCL release as `which`'s would load once `LD_PRELOAD`
/// loads it from `build` (which need not exist yet: fdl's builds carry no search path of
/// their own, [`super::map::LinkMap::dlopen_from_new_preload`]). The release asks for the
/// same entry versions, so they are read from the NCCL `which` names.
pub fn plugins_from_new_preload(
    which: &Which,
    build: &Path,
    env: &LoaderEnv,
    var: &dyn Fn(&str) -> Option<String>,
) -> Outcome {
    let file = nccl_of(which)?;
    let asks = read_asks(&file).map_err(|e| format!("{e:#}"))?;
    let open = |name: &str| which.link_map.dlopen_from_new_preload(build, name, env);
    Ok(judge_all(build.to_path_buf(), &asks, &open, env, var))
}

fn nccl_of(which: &Which) -> std::result::Result<PathBuf, String> {
    match &which.answer {
        Answer::Nccl { detection } => Ok(detection.file.clone()),
        other => Err(format!(
            "fdl cannot say which NCCL this process runs ({}), so not which plugins it loads",
            other.kind()
        )),
    }
}

fn judge_all(
    file: PathBuf,
    asks: &Asks,
    open: &dyn Fn(&str) -> Dlopened,
    env: &LoaderEnv,
    var: &dyn Fn(&str) -> Option<String>,
) -> Plugins {
    let mut kinds = Vec::new();
    let mut net_found: Option<PathBuf> = None;
    for (kind, versions) in &asks.kinds {
        let value = var(&kind.variable());
        let names = candidate_names(*kind, value.as_deref(), asks);
        let mut tries = Vec::new();
        let mut caveats = Vec::new();
        let mut verdict = if names.is_empty() {
            Verdict::Disabled
        } else {
            Verdict::NotFound
        };
        'groups: for group in names {
            for name in group {
                let t = try_name(open(&name), &name, env, kind.entry(), &mut caveats);
                let judged = judge(&t, versions);
                tries.push(t);
                match judged {
                    Some(v @ Verdict::Loaded { .. }) => {
                        verdict = v;
                        break 'groups;
                    }
                    // The name opened, so NCCL keeps this handle for the group; with an
                    // unknown version it moves to the next element of a list.
                    Some(v) => {
                        if matches!(verdict, Verdict::NotFound) {
                            verdict = v;
                        }
                        continue 'groups;
                    }
                    None => {}
                }
            }
        }
        if *kind == Kind::Net {
            if let Verdict::Loaded { path, .. } = &verdict {
                net_found = Some(path.clone());
            }
        }
        // tuner.cc (2.26 and later): no tuner library, then the net plugin's entry.
        if *kind == Kind::Tuner && matches!(verdict, Verdict::NotFound) && asks.checks_value {
            if let Some(net) = &net_found {
                if let Ok(names) = interpose::exported_with_prefixes(net, &[kind.entry()]) {
                    let exports = versions_of(&names, kind.entry());
                    if let Some(v) = versions.iter().find(|v| exports.contains(v)) {
                        verdict = Verdict::Loaded {
                            path: net.clone(),
                            version: *v,
                            from_net_plugin: Some(true),
                        };
                    }
                }
            }
        }
        kinds.push(KindReport {
            kind: *kind,
            variable: kind.variable(),
            value,
            asks: versions.clone(),
            tries,
            verdict,
            caveats,
        });
    }
    let mut config_files = Vec::new();
    if let Some(f) = var("NCCL_CONF_FILE") {
        config_files.push(PathBuf::from(f));
    }
    if let Some(home) = var("HOME") {
        config_files.push(Path::new(&home).join(".nccl.conf"));
    }
    config_files.push(PathBuf::from("/etc/nccl.conf"));
    config_files.retain(|p| p.is_file());
    Plugins {
        nccl: file,
        kinds,
        config_files,
    }
}

/// A plugin the current NCCL loads that a preloaded build would not load from the same
/// file: found through a search path the build does not inherit (libtorch's DT_RPATH
/// next to the pip NCCL, say).
#[derive(Debug, Clone, Serialize)]
pub struct Moved {
    pub kind: Kind,
    pub variable: String,
    /// What loads it today, and how it is found there.
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub path: PathBuf,
    pub version: u32,
    pub via: String,
    /// What the build does instead.
    pub after: Verdict,
    /// The value of `variable` that keeps this file loaded under the build, checked by
    /// the same model; `None` when naming it does not (a comma in a list's path, say).
    pub keep: Option<String>,
}

/// The plugins of `before` that the world of `after` (a function of the plugin
/// variables, so that a fix can be checked in it) loads from another file or not at
/// all, each with the variable's value that keeps it — checked, never assumed.
pub fn moved(
    before: &Plugins,
    after: &dyn Fn(Vars) -> Outcome,
    var: &dyn Fn(&str) -> Option<String>,
    cwd: &Path,
) -> std::result::Result<Vec<Moved>, String> {
    let now = after(var)?;
    let mut out = Vec::new();
    for k in &before.kinds {
        // The tuner inside the net plugin moves, and is kept, with the net plugin.
        let Verdict::Loaded {
            path,
            version,
            from_net_plugin: None,
        } = &k.verdict
        else {
            continue;
        };
        let loads_it = |p: &Plugins| {
            matches!(p.kind(k.kind).map(|r| &r.verdict),
                Some(Verdict::Loaded { path: q, .. }) if same_file(&cwd.join(q), &cwd.join(path)))
        };
        if loads_it(&now) {
            continue;
        }
        let via = k
            .try_of(path)
            .and_then(|t| t.via.clone())
            .unwrap_or_default();
        let pin = cwd.join(path).to_string_lossy().into_owned();
        let variable = k.kind.variable();
        let pinned = |name: &str| {
            if name == variable {
                Some(pin.clone())
            } else {
                var(name)
            }
        };
        let keep = after(&pinned).ok().filter(loads_it).map(|_| pin.clone());
        out.push(Moved {
            kind: k.kind,
            variable,
            path: path.clone(),
            version: *version,
            via,
            after: now
                .kind(k.kind)
                .map_or(Verdict::NotFound, |r| r.verdict.clone()),
            keep,
        });
    }
    Ok(out)
}

/// What preloading the build at `build` changes about the plugins loaded by the NCCL
/// that a process loading `lib` runs in `env`: [`moved`] between today and that world.
/// A build that exists is modelled as the loader will see it, first in `LD_PRELOAD`; a
/// planned one as a preload with no search path of its own that asks what today's
/// NCCL asks. `Err` says why fdl cannot tell (no one NCCL today, say).
pub fn moved_by_preload(
    lib: &Path,
    build: &Path,
    env: &LoaderEnv,
    var: &dyn Fn(&str) -> Option<String>,
) -> std::result::Result<Vec<Moved>, String> {
    let library = super::TargetKind::Library;
    let w = super::which_nccl_as(lib, env, None, library).map_err(|e| format!("{e:#}"))?;
    let before = plugins(&w, env, var)?;
    if !before
        .kinds
        .iter()
        .any(|k| matches!(k.verdict, Verdict::Loaded { .. }))
    {
        return Ok(Vec::new());
    }
    if build.is_file() {
        let mut after_env = env.clone();
        let b = build.to_string_lossy();
        after_env.preload = if env.preload.is_empty() {
            b.into_owned()
        } else {
            format!("{b}:{}", env.preload)
        };
        let wa =
            super::which_nccl_as(lib, &after_env, None, library).map_err(|e| format!("{e:#}"))?;
        moved(&before, &|v| plugins(&wa, &after_env, v), var, &env.cwd)
    } else {
        moved(
            &before,
            &|v| plugins_from_new_preload(&w, build, env, v),
            var,
            &env.cwd,
        )
    }
}

/// One file, by device and inode (a path through a link is the same file).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    a == b || (id(a).is_some() && id(a) == id(b))
}

impl Moved {
    /// The sentence a plan or `nccl env` says about it.
    pub fn sentence(&self) -> String {
        let how = match &self.after {
            Verdict::Loaded { path, version, .. } => {
                format!("loads {} (v{version}) instead", path.display())
            }
            Verdict::NoCommonVersion { path, .. } => {
                format!("finds {} instead, which it ignores", path.display())
            }
            Verdict::Unknown { reason } => format!("may not find it ({reason})"),
            _ => format!(
                "does not find it, so {}",
                if self.kind == Kind::Net {
                    "its ranks fall back to NCCL's internal transport (IB or sockets)"
                } else {
                    "it runs without this plugin"
                }
            ),
        };
        let via = match self.via.as_str() {
            "rpath" => "the DT_RPATH of the objects that load the current NCCL",
            "runpath" => "the current NCCL's DT_RUNPATH",
            "already_loaded" => "an object already loaded",
            "ld_library_path" => "LD_LIBRARY_PATH",
            "ld_cache" => "ld.so.cache",
            "default_dir" => "a system directory",
            "path" => "its path",
            "" => "its search",
            other => other,
        };
        let fix = match &self.keep {
            Some(v) => format!("set {}={v} to keep it", self.variable),
            None => format!(
                "naming its path in {} does not keep it either: put it on LD_LIBRARY_PATH",
                self.variable
            ),
        };
        format!(
            "the {} plugin {} (v{}), found through {via}, is out of a preloaded build's search path: the build {how}; {fix}",
            self.kind.name(),
            self.path.display(),
            self.version
        )
    }
}

/// The version in an entry name's digits, only as NCCL writes it (`%d`: no sign, no
/// leading zero): `ncclNetPlugin_v010` is not the `ncclNetPlugin_v10` NCCL asks `dlsym`
/// for, so it is no version at all.
fn exact_version(digits: &str) -> Option<u32> {
    let plain = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    plain.then(|| digits.parse().ok()).flatten()
}

fn versions_of(names: &BTreeSet<String>, entry: &str) -> Vec<u32> {
    let mut v: Vec<u32> = names
        .iter()
        .filter_map(|n| exact_version(n.strip_prefix(entry)?))
        .collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    v
}

fn try_name(
    opened: Dlopened,
    name: &str,
    env: &LoaderEnv,
    entry: &str,
    caveats: &mut Vec<String>,
) -> Try {
    match opened {
        Dlopened::Loaded {
            path,
            already,
            rule,
            caveats: c,
        } => {
            caveats.extend(c);
            let via = if already {
                "already_loaded".to_string()
            } else {
                match rule {
                    Some(r) => rule_word(r).to_string(),
                    None => "path".to_string(),
                }
            };
            let full = if path.is_absolute() {
                path.clone()
            } else {
                env.cwd.join(&path)
            };
            let (exports, error) = match interpose::exported_with_prefixes(&full, &[entry]) {
                Ok(n) => (Some(versions_of(&n, entry)), None),
                Err(e) => (None, Some(format!("{e:#}"))),
            };
            Try {
                name: name.to_string(),
                found: Some(path),
                via: Some(via),
                exports,
                error,
                searched: Vec::new(),
            }
        }
        Dlopened::Failed {
            reason,
            searched,
            caveats: c,
        } => {
            caveats.extend(c);
            Try {
                name: name.to_string(),
                found: None,
                via: None,
                exports: None,
                error: Some(reason),
                searched,
            }
        }
    }
}

/// What one try means: `None` when nothing is there (the next name is tried).
fn judge(t: &Try, asks: &[u32]) -> Option<Verdict> {
    let path = t.found.clone()?;
    let Some(exports) = &t.exports else {
        return Some(Verdict::Unknown {
            reason: format!(
                "{} cannot be read: {}",
                path.display(),
                t.error.as_deref().unwrap_or("")
            ),
        });
    };
    Some(match asks.iter().find(|v| exports.contains(v)) {
        Some(v) => Verdict::Loaded {
            path,
            version: *v,
            from_net_plugin: None,
        },
        None => Verdict::NoCommonVersion {
            path,
            exports: exports.clone(),
        },
    })
}

/// The JSON word of a rule.
pub fn rule_word(r: ResolveRule) -> &'static str {
    match r {
        ResolveRule::Path => "path",
        ResolveRule::Rpath => "rpath",
        ResolveRule::LdLibraryPath => "ld_library_path",
        ResolveRule::Runpath => "runpath",
        ResolveRule::LdCache => "ld_cache",
        ResolveRule::DefaultDir => "default_dir",
    }
}
