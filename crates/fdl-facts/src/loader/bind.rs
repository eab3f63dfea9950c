//! Following a process's `nccl*` calls to the object that answers them.
//!
//! The calls that matter are the consumer's: the nccl* functions the library asked about
//! (or the program) calls — a function it defines but nothing calls is no call
//! ([`Binding::NeverCalled`]) — or, when it names none but carries NCCL compiled in with
//! hidden symbols, its own calls; and, whatever it does, every other object's imports.
//! Only when there are none: every object that defines and calls its own; else, for a
//! process that can `dlopen`, nothing definite (what it opens later decides); else the
//! objects whose read-only data carry a self-id. An imported (or interposable) call binds
//! to the first object of the global scope that exports the name (`_dl_lookup_symbol_x`);
//! a call bound locally stays in its object; a call that may exist but is unconfirmed
//! ([`Binding::Uncertain`]) leaves the answer unknown where it would add a target. The
//! NCCL that runs is the self-id of the object the calls reach. When a load failure or an
//! unmodelled rule lies at or before that object in the order, something there could
//! define the name first: the answer is then unknown, with the reason.

use super::map::{self, FoundBy, LinkMap};
use super::pin::{self, Pin};
use super::reason::{Doubt, Reached, SelfIdTrouble, Split, SplitPart, Unknown};
use super::search::LoaderEnv;
use crate::inspect::interpose::{self, Binding, DynamicNccl};
use crate::inspect::{self, Linkage, NcclDetection, SelfId};
use anyhow::Result;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The answer to "which NCCL does this process run".
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum Answer {
    /// Every call reaches one object, whose self-id names this NCCL.
    Nccl { detection: NcclDetection },
    /// Nothing in the process defines, calls or carries NCCL, and nothing could load it.
    None { reason: String },
    /// fdl cannot say, and why (`reason` as text; the facts are [`Answer::typed_json`]'s).
    Unknown {
        #[serde(serialize_with = "as_text")]
        reason: Unknown,
    },
    /// The calls reach different objects: two NCCLs in one process.
    Split {
        #[serde(serialize_with = "as_text")]
        reason: Split,
    },
}

/// A reason serialized as its full sentence, as `reason` always was.
fn as_text<T: std::fmt::Display, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

impl Answer {
    pub fn detection(&self) -> Option<&NcclDetection> {
        match self {
            Answer::Nccl { detection } => Some(detection),
            _ => None,
        }
    }

    /// `nccl`, `none`, `unknown` or `split`.
    pub fn kind(&self) -> &'static str {
        match self {
            Answer::Nccl { .. } => "nccl",
            Answer::None { .. } => "none",
            Answer::Unknown { .. } => "unknown",
            Answer::Split { .. } => "split",
        }
    }

    /// The reason whole, as text: what `--json` has as `reason`.
    pub fn reason(&self) -> Option<String> {
        match self {
            Answer::Nccl { .. } => None,
            Answer::None { reason } => Some(reason.clone()),
            Answer::Unknown { reason } => Some(reason.to_string()),
            Answer::Split { reason } => Some(reason.to_string()),
        }
    }

    /// The facts of an unknown or split answer (`{"kind": …}` and the kind's fields),
    /// for `--json` beside the text; `null` otherwise.
    pub fn typed_json(&self) -> serde_json::Value {
        let v = match self {
            Answer::Unknown { reason } => serde_json::to_value(reason),
            Answer::Split { reason } => serde_json::to_value(reason),
            _ => return serde_json::Value::Null,
        };
        // Paths serialize lossily and nothing here is a map with non-string keys.
        v.unwrap_or(serde_json::Value::Null)
    }
}

/// Calls of one object that reach one place.
#[derive(Debug, Clone, Serialize)]
pub struct CallGroup {
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub caller: PathBuf,
    /// The object the calls bind to; `None` when nothing in the process defines them.
    #[serde(serialize_with = "crate::text::json_path::opt")]
    pub object: Option<PathBuf>,
    pub symbols: Vec<String>,
    /// How they bind: "the first definition in the global scope", or why locally.
    pub how: String,
    /// [`CallGroup::how`] as a kind, for a short rendering (`how` says it whole).
    #[serde(skip)]
    pub bound: Bound,
    /// The NCCL of `object`, when it carries a self-id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl: Option<SelfId>,
}

/// How one group of calls binds, as a kind: what a one-line summary names, where
/// [`CallGroup::how`] has the whole sentence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Bound {
    /// By lookup: the first definition in the global scope.
    #[default]
    Global,
    /// Inside the calling object, whatever is preloaded ([`Binding::BoundLocally`]).
    Locally,
    /// Perhaps called directly, inside the object; fdl could not confirm it
    /// ([`Binding::Uncertain`]).
    Perhaps,
    /// NCCL compiled into the object, which names none of its functions: its calls stay
    /// there.
    Carried,
}

impl Bound {
    /// A few words for a summary line.
    pub fn words(self) -> &'static str {
        match self {
            Bound::Global => "global scope",
            Bound::Locally => "bound inside it",
            Bound::Perhaps => "perhaps direct calls",
            Bound::Carried => "compiled in",
        }
    }
}

/// The answer the model gives if what it cannot see defines no `nccl*` function: kept
/// with an [`Answer::Unknown`] whose doubts all lie before the one object every call
/// reaches. The answer stays unknown; this says what it is under which condition, so a
/// caller may act on it and say so.
#[derive(Debug, Clone, Serialize)]
pub struct Conditional {
    /// The NCCL the calls reach under the condition.
    pub detection: NcclDetection,
    /// What is not known before that object, each as a sentence.
    pub unknowns: Vec<String>,
    /// The libraries among those that are not on this host at all (DT_NEEDED names).
    pub missing: Vec<String>,
    /// Whether the libraries missing here are all that is unknown: the one doubt a host
    /// without some of a wheel's CUDA libraries (a login node, a controller) has.
    pub only_missing: bool,
    /// The NCCL the asked library's pip distribution pins, when it pins one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pin: Option<Pin>,
}

impl Conditional {
    /// `assuming none of the 5 libraries missing here defines nccl* (libcublas.so.13, …)`.
    pub fn condition(&self) -> String {
        if !self.only_missing {
            return format!(
                "assuming none of the {} things fdl cannot see defines nccl*",
                self.unknowns.len()
            );
        }
        let mut names: Vec<&str> = self.missing.iter().take(4).map(String::as_str).collect();
        if self.missing.len() > 4 {
            names.push("…");
        }
        match self.missing.len() {
            1 => format!(
                "assuming the library missing here ({}) does not define nccl*",
                names.join(", ")
            ),
            n => format!(
                "assuming none of the {n} libraries missing here defines nccl* ({})",
                names.join(", ")
            ),
        }
    }

    /// Whether the pip pin names the same release as the library found; `None` without one.
    pub fn pin_agrees(&self) -> Option<bool> {
        let (a, b) = (&self.pin.as_ref()?.version, &self.detection.version);
        Some(a.same_release(b))
    }

    /// The pin, said as corroboration or as disagreement; `None` without one.
    pub fn pin_note(&self) -> Option<String> {
        let p = self.pin.as_ref()?;
        Some(match self.pin_agrees()? {
            true => format!(
                "{} pins {}=={}, the same release",
                p.metadata.display(),
                p.distribution,
                p.version
            ),
            false => format!(
                "but {} pins {}=={}, not the {} installed: the pip environment is inconsistent (pip install {}=={} to match)",
                p.metadata.display(),
                p.distribution,
                p.version,
                self.detection.version,
                p.distribution,
                p.version
            ),
        })
    }

    /// `NCCL 2.30.7 from /…/libnccl.so.2.30.7, assuming none of … defines nccl*; …`.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "NCCL {} from {}, {}",
            self.detection.version,
            self.detection.file.display(),
            self.condition()
        );
        if let Some(note) = self.pin_note() {
            s.push_str(&format!("; {note}"));
        }
        s
    }
}

/// The whole answer, with the evidence it rests on.
#[derive(Debug, Clone, Serialize)]
pub struct Which {
    /// The file asked about.
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub target: PathBuf,
    #[serde(flatten)]
    pub answer: Answer,
    pub calls: Vec<CallGroup>,
    pub link_map: LinkMap,
    /// The NCCL a pip distribution pins when its `libnccl` is missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pin: Option<Pin>,
    /// With [`Answer::Unknown`] only: the answer if what is unknown defines no `nccl*`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conditional: Option<Conditional>,
    pub warnings: Vec<String>,
}

/// Which NCCL a process runs whose program is `target`, or that links `target`, in `env`.
pub fn which_nccl(target: &Path, env: &LoaderEnv) -> Result<Which> {
    which_nccl_knowing(target, env, None)
}

/// [`which_nccl`] for a `target` already inspected: the self-ids its read-only data
/// carries (`Inspection::self_ids`) are not searched for again — for a libtorch with NCCL
/// compiled in, that scan is most of the work.
pub fn which_nccl_knowing(
    target: &Path,
    env: &LoaderEnv,
    target_self_ids: Option<&[SelfId]>,
) -> Result<Which> {
    which_nccl_as(target, env, target_self_ids, map::TargetKind::FromHeaders)
}

/// [`which_nccl_knowing`], with what `target` is to the process said by the caller
/// ([`map::TargetKind::Library`] for a libtorch: a program links it).
pub fn which_nccl_as(
    target: &Path,
    env: &LoaderEnv,
    target_self_ids: Option<&[SelfId]>,
    kind: map::TargetKind,
) -> Result<Which> {
    let map = map::load_as(target, env, kind)?;
    let mut r = Resolver::new(target, map, target_self_ids);
    let callers = r.callers();
    let exports = r.exports(&callers.callers);
    let hidden = r.hidden();
    let binds = r.bind(&callers, &exports, &hidden);
    Ok(r.finish(&callers, &binds, &hidden))
}

/// One "which NCCL" question, worked through in phases over one link map: whose calls
/// are the process's ([`Resolver::callers`]), what the global scope exports of the names
/// looked up ([`Resolver::exports`]), what fdl cannot see ([`Resolver::hidden`]), where
/// each call binds ([`Resolver::bind`]), and the answer ([`Resolver::finish`]). What is
/// read of an object is read once and kept here.
struct Resolver<'a> {
    target: &'a Path,
    map: LinkMap,
    /// The object asked about (the program, or the library a program links).
    asked: Option<usize>,
    /// The nccl* symbols of each object, where read.
    facts: Vec<Option<DynamicNccl>>,
    /// Each object's self-id, once asked (for a libtorch, that scan is most of the work).
    self_ids: BTreeMap<usize, Result<Option<SelfId>, SelfIdTrouble>>,
    /// Objects whose symbols fdl cannot read: like failures, they hide definitions.
    blind: Vec<(usize, Doubt)>,
}

/// Whose calls are the process's, and what each calls.
#[derive(Default)]
struct Callers {
    /// Each calling object with the names it calls and how each binds.
    callers: Vec<(usize, Vec<(String, Binding)>)>,
    /// Objects with NCCL compiled in whose calls stay inside them, and why.
    carriers: Vec<(usize, &'static str)>,
    /// Set when nothing loaded at start calls NCCL, an NCCL is there, and the process can
    /// dlopen: the object that calls dlopen, and the first object exporting nccl*.
    opens_later: Option<(PathBuf, Option<usize>)>,
    /// Set when nothing calls NCCL and nothing carries a readable self-id, but an object
    /// exports nccl* functions: an NCCL whose version fdl cannot read, never "no NCCL".
    unnamed_exporter: Option<usize>,
}

/// Calls of one object that reach one place.
struct Group {
    caller: usize,
    /// `None` when nothing in the process defines them.
    target: Option<usize>,
    names: Vec<String>,
    /// How they bind, in words ([`CallGroup::how`]).
    how: String,
    bound: Bound,
}

/// Where the calls bind, and what fdl cannot see before their targets.
#[derive(Default)]
struct Binds {
    groups: Vec<Group>,
    /// What is unknown at or before an object a call looks up, in the order met.
    doubts: Vec<Doubt>,
    /// Targets that something unknown lies before: the answer if that defines nothing.
    provisional: Vec<usize>,
}

impl Binds {
    /// The names that nothing loaded at start defines.
    fn undefined(&self) -> Vec<String> {
        self.groups
            .iter()
            .filter(|g| g.target.is_none())
            .flat_map(|g| g.names.iter().cloned())
            .collect()
    }
}

/// The nccl* functions an object calls (a function it defines but never calls is none).
fn calls_of(f: &DynamicNccl) -> Vec<(String, Binding)> {
    f.symbols
        .iter()
        .filter(|s| s.binding.is_call())
        .map(|s| (s.name.clone(), s.binding.clone()))
        .collect()
}

impl<'a> Resolver<'a> {
    /// Reads the object asked about; `target_self_ids`, when given, are its self-ids.
    fn new(target: &'a Path, map: LinkMap, target_self_ids: Option<&[SelfId]>) -> Self {
        let asked = map
            .objects
            .iter()
            .position(|o| matches!(o.found_by, FoundBy::Program | FoundBy::Asked));
        let n = map.objects.len();
        let mut r = Resolver {
            target,
            map,
            asked,
            facts: vec![None; n],
            self_ids: BTreeMap::new(),
            blind: Vec::new(),
        };
        if let Some(a) = asked {
            r.facts[a] = r.read_facts(a);
            if let Some(ids) = target_self_ids {
                let id = match ids {
                    [] => Ok(None),
                    [one] => Ok(Some(one.clone())),
                    many => Err(SelfIdTrouble::Several {
                        object: target.to_path_buf(),
                        ids: many.to_vec(),
                    }),
                };
                r.self_ids.insert(a, id);
            }
        }
        r
    }

    fn unreadable(&mut self, i: usize, versions: bool, e: anyhow::Error) {
        let object = self.map.objects[i].path.clone();
        self.blind.push((
            i,
            Doubt::Unreadable {
                object,
                versions,
                error: format!("{e:#}"),
            },
        ));
    }

    fn read_facts(&mut self, i: usize) -> Option<DynamicNccl> {
        let o = &self.map.objects[i];
        if o.is_stand_in() {
            return None;
        }
        match interpose::dynamic_nccl(&o.path) {
            Ok(f) => f,
            Err(e) => {
                self.unreadable(i, false, e);
                None
            }
        }
    }

    fn id_of(&mut self, i: usize) -> Result<Option<SelfId>, SelfIdTrouble> {
        let path = &self.map.objects[i].path;
        self.self_ids
            .entry(i)
            .or_insert_with(|| {
                inspect::find_nccl_self_id(path).map_err(|e| SelfIdTrouble::Unreadable {
                    error: format!("{e:#}"),
                })
            })
            .clone()
    }

    fn preloaded(&self, i: usize) -> bool {
        matches!(self.map.objects[i].found_by, FoundBy::Preload { .. })
    }

    /// Object `t` as a reason names it, with its NCCL.
    fn reached(&mut self, t: usize) -> Reached {
        Reached {
            object: shown(&self.map, t),
            nccl: self.id_of(t).ok().flatten().map(|id| id.nccl),
        }
    }

    /// Whose calls are the process's, and what each calls (name, binding):
    /// - the object asked about, for the nccl* functions it calls; or, when it names none
    ///   but carries NCCL compiled in with hidden symbols, its own calls, which stay
    ///   inside it;
    /// - and whatever the asked object does, every other object that imports nccl*
    ///   functions: those bind by scope (a preload is a provider: its own calls are not
    ///   the process's);
    /// - only when neither exists: [`Resolver::own_calls`].
    fn callers(&mut self) -> Callers {
        let mut c = Callers::default();
        if let Some(a) = self.asked {
            if let Some(f) = &self.facts[a] {
                let called = calls_of(f);
                if !called.is_empty() {
                    c.callers.push((a, called));
                }
            }
            let names_none = self.facts[a].as_ref().is_none_or(|f| f.symbols.is_empty());
            if names_none && matches!(self.id_of(a), Ok(Some(_))) {
                c.carriers.push((a, HIDDEN_CARRIER));
            }
        }
        for i in 0..self.map.objects.len() {
            if Some(i) == self.asked || self.map.objects[i].is_stand_in() || self.preloaded(i) {
                continue;
            }
            match interpose::imported_nccl(&self.map.objects[i].path) {
                Ok(names) if !names.is_empty() => c.callers.push((
                    i,
                    names.into_iter().map(|n| (n, Binding::Imported)).collect(),
                )),
                Ok(_) => {}
                Err(e) => self.unreadable(i, false, e),
            }
        }
        if c.callers.is_empty() && c.carriers.is_empty() {
            self.own_calls(&mut c);
        }
        c
    }

    /// When no object's calls are the process's by [`Resolver::callers`]' rules: the
    /// objects that define and call their own; else, for a process that can dlopen,
    /// nothing known (what it opens later is in no file); else the objects whose
    /// read-only data carry a self-id.
    fn own_calls(&mut self, c: &mut Callers) {
        let n = self.map.objects.len();
        for i in 0..n {
            if Some(i) != self.asked {
                self.facts[i] = self.read_facts(i);
            }
        }
        for i in (0..n).filter(|&i| !self.preloaded(i)) {
            if let Some(f) = &self.facts[i] {
                let called = calls_of(f);
                if !called.is_empty() {
                    c.callers.push((i, called));
                }
            }
        }
        if !c.callers.is_empty() {
            return;
        }
        let opener = dlopen_caller(&self.map);
        let exporter = (0..n).find(|&i| {
            self.facts[i]
                .as_ref()
                .is_some_and(|f| !f.exported.is_empty())
        });
        if let (Some(o), Some(_)) = (&opener, exporter) {
            c.opens_later = Some((o.clone(), exporter));
            return;
        }
        for i in 0..n {
            if self.map.objects[i].is_stand_in() || self.preloaded(i) {
                continue;
            }
            if !matches!(self.id_of(i), Ok(Some(_))) {
                continue;
            }
            let names_none = self.facts[i].as_ref().is_none_or(|f| f.symbols.is_empty());
            c.carriers.push((
                i,
                if names_none {
                    HIDDEN_CARRIER
                } else {
                    UNCALLED_CARRIER
                },
            ));
        }
        if let Some(o) = opener.filter(|_| !c.carriers.is_empty()) {
            c.opens_later = Some((o, None));
            c.carriers.clear();
        }
        if c.carriers.is_empty() && c.opens_later.is_none() {
            c.unnamed_exporter = exporter.filter(|&i| !self.preloaded(i));
        }
    }

    /// What each object exports of the names looked up, in the order of the global scope,
    /// up to the first definer of each: through each object's hash table, as the loader
    /// looks them up; `None` where not looked at.
    fn exports(
        &mut self,
        callers: &[(usize, Vec<(String, Binding)>)],
    ) -> Vec<Option<BTreeSet<String>>> {
        let mut exports: Vec<Option<BTreeSet<String>>> = vec![None; self.map.objects.len()];
        let mut wanted: Vec<&str> = Vec::new();
        for (_, called) in callers {
            for (name, b) in called {
                if matches!(b, Binding::Imported | Binding::Interposable)
                    && !wanted.contains(&name.as_str())
                {
                    wanted.push(name);
                }
            }
        }
        // The version the asked object references each name with: a definition of another
        // version is passed over (glibc's `check_match`). Other callers import by name
        // only here, so their lookups are unversioned.
        let refs = match self.asked.filter(|a| callers.iter().any(|(c, _)| c == a)) {
            Some(a) => match interpose::reference_versions(&self.map.objects[a].path, &wanted) {
                Ok(r) => r,
                Err(e) => {
                    self.unreadable(a, true, e);
                    BTreeMap::new()
                }
            },
            None => BTreeMap::new(),
        };
        let mut wanted: Vec<(&str, Option<&interpose::Version>)> = wanted
            .iter()
            .map(|n| (*n, refs.get(*n).and_then(Option::as_ref)))
            .collect();
        for (i, slot) in exports.iter_mut().enumerate() {
            if wanted.is_empty() {
                break;
            }
            let found = if let Some(f) = &self.facts[i] {
                f.exported.clone()
            } else if self.map.objects[i].is_stand_in() {
                BTreeSet::new()
            } else {
                match interpose::exported_among_versioned(&self.map.objects[i].path, &wanted) {
                    Ok(found) => found,
                    Err(e) => {
                        self.unreadable(i, false, e);
                        BTreeSet::new()
                    }
                }
            };
            wanted.retain(|(n, _)| !found.contains(*n));
            *slot = Some(found);
        }
        exports
    }

    /// Everything that hides what lies at or after a place in the order: load failures,
    /// caveats and unreadable objects, by place.
    fn hidden(&self) -> Vec<(usize, Doubt)> {
        let mut hidden: Vec<(usize, Doubt)> = self
            .map
            .failures
            .iter()
            .map(|f| {
                (
                    f.position,
                    Doubt::LoadFailure {
                        needed: f.needed.clone(),
                        needed_by: f.needed_by.clone(),
                        why: f.reason.clone(),
                        absent: f.is_absent(),
                    },
                )
            })
            .chain(self.map.caveats.iter().map(|c| {
                (
                    c.position,
                    Doubt::Caveat {
                        what: c.what.clone(),
                    },
                )
            }))
            .chain(self.blind.iter().cloned())
            .collect();
        hidden.sort_by_key(|(p, _)| *p);
        hidden
    }

    /// Where each call binds: inside its object, or to the first definition in the
    /// global scope, with what is unknown before that.
    fn bind(
        &self,
        c: &Callers,
        exports: &[Option<BTreeSet<String>>],
        hidden: &[(usize, Doubt)],
    ) -> Binds {
        let mut b = Binds::default();
        for (caller, called) in &c.callers {
            let caller = *caller;
            for (name, binding) in called {
                let (target, how, bound) = match binding {
                    Binding::BoundLocally { why } => (Some(caller), why.clone(), Bound::Locally),
                    Binding::Uncertain { why } => (Some(caller), why.clone(), Bound::Perhaps),
                    Binding::NeverCalled => continue,
                    Binding::Imported | Binding::Interposable => {
                        let t = exports
                            .iter()
                            .position(|d| d.as_ref().is_some_and(|d| d.contains(name)));
                        let limit = t.unwrap_or(usize::MAX);
                        for (_, why) in hidden.iter().filter(|(p, _)| *p <= limit) {
                            if !b.doubts.contains(why) {
                                b.doubts.push(why.clone());
                            }
                        }
                        if let Some(t) = t.filter(|&t| hidden.iter().any(|(p, _)| *p <= t)) {
                            b.provisional.push(t);
                        }
                        (t, GLOBAL.to_string(), Bound::Global)
                    }
                };
                match b.groups.iter_mut().find(|g| {
                    g.caller == caller && g.target == target && g.how == how && g.bound == bound
                }) {
                    Some(g) => g.names.push(name.clone()),
                    None => b.groups.push(Group {
                        caller,
                        target,
                        names: vec![name.clone()],
                        how,
                        bound,
                    }),
                }
            }
        }
        // NCCL compiled in with hidden symbols names no function a lookup could reach:
        // its self-id is the trace, and its calls can only stay in its object.
        for &(i, how) in &c.carriers {
            b.groups.push(Group {
                caller: i,
                target: Some(i),
                names: Vec::new(),
                how: how.into(),
                bound: Bound::Carried,
            });
        }
        b
    }

    /// The answer, with its evidence.
    fn finish(mut self, c: &Callers, b: &Binds, hidden: &[(usize, Doubt)]) -> Which {
        let mut calls: Vec<CallGroup> = Vec::new();
        for g in &b.groups {
            let nccl = g.target.and_then(|t| self.id_of(t).ok().flatten());
            calls.push(CallGroup {
                caller: shown(&self.map, g.caller),
                object: g.target.map(|t| shown(&self.map, t)),
                symbols: g.names.clone(),
                how: g.how.clone(),
                bound: g.bound,
                nccl,
            });
        }
        let mut targets: Vec<usize> = b.groups.iter().filter_map(|g| g.target).collect();
        targets.sort_unstable();
        targets.dedup();
        let missing_nccl = self
            .map
            .failures
            .iter()
            .any(|f| f.needed.starts_with("libnccl"));
        let pin = match self.asked {
            Some(a) if missing_nccl => pin::find(&self.map.objects[a].path),
            _ => None,
        };
        let conditional = self.conditional(b, &targets);
        let answer = self.decide(c, b, hidden, &targets, &pin);
        let mut warnings: Vec<String> = Vec::new();
        if matches!(answer, Answer::Nccl { .. } | Answer::Split { .. }) {
            for (_, why) in hidden {
                warnings.push(format!(
                    "the process would not start as laid out here: {why}"
                ));
            }
        }
        for s in &self.map.skipped_preloads {
            warnings.push(format!(
                "{} element '{}' is ignored by the loader: {}",
                s.source, s.entry, s.reason
            ));
        }
        Which {
            target: self.target.to_path_buf(),
            answer,
            calls,
            link_map: self.map,
            pin,
            conditional,
            warnings,
        }
    }

    /// The answer under the condition that nothing unknown defines nccl*: one object
    /// every call reaches, with a self-id, and doubts only before it.
    fn conditional(&mut self, b: &Binds, targets: &[usize]) -> Option<Conditional> {
        if b.doubts.is_empty() || !b.undefined().is_empty() {
            return None;
        }
        let mut reached = b.provisional.clone();
        reached.sort_unstable();
        reached.dedup();
        let ([t], [only]) = (reached.as_slice(), targets) else {
            return None;
        };
        if t != only {
            return None;
        }
        let Ok(Some(id)) = self.id_of(*t) else {
            return None;
        };
        // The library a doubt says is not on this host at all, if that is all it says.
        let absent = |d: &Doubt| match d {
            Doubt::LoadFailure {
                needed,
                absent: true,
                ..
            } => Some(needed.clone()),
            _ => None,
        };
        let mut missing: Vec<String> = b.doubts.iter().filter_map(absent).collect();
        missing.sort();
        missing.dedup();
        Some(Conditional {
            detection: detection_of(&self.map, &b.groups, *t, id),
            only_missing: b.doubts.iter().all(|d| absent(d).is_some()),
            unknowns: b.doubts.iter().map(Doubt::to_string).collect(),
            missing,
            pin: self
                .asked
                .and_then(|a| pin::find(&self.map.objects[a].path)),
        })
    }

    /// Which NCCL, or why fdl cannot say, from where the calls bind.
    fn decide(
        &mut self,
        c: &Callers,
        b: &Binds,
        hidden: &[(usize, Doubt)],
        targets: &[usize],
        pin: &Option<Pin>,
    ) -> Answer {
        let unknown = |reason: Unknown| Answer::Unknown { reason };
        if !b.doubts.is_empty() {
            let mut provisional = b.provisional.clone();
            provisional.sort_unstable();
            provisional.dedup();
            let if_none = match provisional.as_slice() {
                [t] => match self.id_of(*t) {
                    Ok(Some(id)) => Some(Reached {
                        object: shown(&self.map, *t),
                        nccl: Some(id.nccl),
                    }),
                    _ => None,
                },
                _ => None,
            };
            return unknown(Unknown::Hidden {
                missing_pin: pin.clone(),
                doubts: b.doubts.iter().take(3).cloned().collect(),
                // Failures and caveats past the map's caps are counted there, not listed.
                more: b.doubts.len().saturating_sub(3)
                    + self.map.failures_omitted
                    + self.map.caveats_omitted,
                if_none,
            });
        }
        let undefined = b.undefined();
        if !undefined.is_empty() {
            return unknown(Unknown::Undefined { names: undefined });
        }
        // The targets of calls that are certain; a call fdl could not confirm that reaches
        // another object leaves the answer open.
        let certain: Vec<usize> = targets
            .iter()
            .copied()
            .filter(|&t| {
                b.groups
                    .iter()
                    .any(|g| g.target == Some(t) && g.bound != Bound::Perhaps)
            })
            .collect();
        let perhaps = b
            .groups
            .iter()
            .find(|g| g.bound == Bound::Perhaps && g.target.is_some_and(|t| !certain.contains(&t)));
        if let Some(g) = perhaps {
            return unknown(Unknown::PossibleCall {
                at: self.reached(g.caller),
                names: g.names.clone(),
                why: g.how.clone(),
                elsewhere: certain.iter().map(|&t| self.reached(t)).collect(),
            });
        }
        if targets.len() > 1 {
            let mut parts = Vec::new();
            for g in &b.groups {
                if let Some(t) = g.target {
                    parts.push(SplitPart {
                        names: g.names.clone(),
                        caller: shown(&self.map, g.caller),
                        to: self.reached(t),
                    });
                }
            }
            return Answer::Split {
                reason: Split {
                    objects: targets.len(),
                    parts,
                },
            };
        }
        if let Some(&t) = targets.first() {
            return match self.id_of(t) {
                Ok(Some(id)) => Answer::Nccl {
                    detection: detection_of(&self.map, &b.groups, t, id),
                },
                Ok(None) => unknown(Unknown::NoSelfId {
                    object: shown(&self.map, t),
                }),
                Err(e) => unknown(Unknown::SelfIdUnknown(e)),
            };
        }
        if let Some((_, why)) = hidden.first() {
            return unknown(Unknown::Unreadable {
                missing_pin: pin.clone(),
                doubt: why.clone(),
            });
        }
        if let Some((o, first)) = &c.opens_later {
            return unknown(Unknown::OpensLater {
                opener: o.clone(),
                first: first.map(|t| self.reached(t)),
            });
        }
        if let Some(e) = c.unnamed_exporter {
            let names = self.facts[e]
                .as_ref()
                .map(|f| f.exported.iter().take(3).cloned().collect())
                .unwrap_or_default();
            return unknown(Unknown::UnnamedExporter {
                object: shown(&self.map, e),
                names,
                why: self.id_of(e).err(),
            });
        }
        if let Some(o) = dlopen_caller(&self.map) {
            return unknown(Unknown::MayDlopen { opener: o });
        }
        Answer::None {
            reason:
                "no object of the process defines, calls or carries NCCL, and none calls dlopen"
                    .into(),
        }
    }
}

/// What the calls reaching object `t` (whose self-id is `id`) run: its NCCL, its file and
/// how it came into the process.
fn detection_of(map: &LinkMap, groups: &[Group], t: usize, id: SelfId) -> NcclDetection {
    let caller = groups
        .iter()
        .find(|g| g.target == Some(t))
        .map(|g| g.caller);
    let linkage = match &map.objects[t].found_by {
        _ if caller == Some(t) => Linkage::Static,
        FoundBy::Preload { entry, .. } => Linkage::Preload {
            entry: entry.clone(),
        },
        FoundBy::Needed { name, rule, .. } => Linkage::Dynamic {
            needed: name.clone(),
            via: *rule,
        },
        FoundBy::OpenedFirst { name, by, .. } => Linkage::Opened {
            needed: name.clone(),
            by: by.clone(),
        },
        FoundBy::Asked => Linkage::Dynamic {
            needed: map.objects[t].path.to_string_lossy().into_owned(),
            via: super::search::ResolveRule::Path,
        },
        FoundBy::Program | FoundBy::StandInProgram => Linkage::Static,
    };
    let path = &map.objects[t].path;
    NcclDetection {
        version: id.nccl,
        cuda: id.cuda,
        file: path.canonicalize().unwrap_or_else(|_| path.clone()),
        linkage,
    }
}

/// How calls that bind by lookup bind ([`CallGroup::how`]).
const GLOBAL: &str = "the first definition in the global scope";
const HIDDEN_CARRIER: &str =
    "NCCL is compiled in with hidden symbols: its calls stay in the object";
const UNCALLED_CARRIER: &str =
    "nothing loaded at start calls NCCL's functions, and nothing can dlopen: the NCCL this object carries is the one in the process";

fn shown(map: &LinkMap, i: usize) -> PathBuf {
    let o = &map.objects[i];
    if o.is_stand_in() {
        PathBuf::from("(the program)")
    } else {
        o.path.clone()
    }
}

/// The first object of the map that imports `dlopen`.
fn dlopen_caller(map: &LinkMap) -> Option<PathBuf> {
    map.objects
        .iter()
        .filter(|o| !o.is_stand_in())
        .find(|o| interpose::imports(&o.path, "dlopen").unwrap_or(false))
        .map(|o| o.path.clone())
}
