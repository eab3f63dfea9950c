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
    pub caller: PathBuf,
    /// The object the calls bind to; `None` when nothing in the process defines them.
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
    let asked = map
        .objects
        .iter()
        .position(|o| matches!(o.found_by, FoundBy::Program | FoundBy::Asked));
    // Objects whose symbols fdl cannot read: like failures, they hide definitions.
    let mut blind: Vec<(usize, Doubt)> = Vec::new();
    let unreadable = |i: usize, versions: bool, e: anyhow::Error| {
        (
            i,
            Doubt::Unreadable {
                object: map.objects[i].path.clone(),
                versions,
                error: format!("{e:#}"),
            },
        )
    };
    let read_facts = |i: usize, blind: &mut Vec<(usize, Doubt)>| -> Option<DynamicNccl> {
        let o = &map.objects[i];
        if o.is_stand_in() {
            return None;
        }
        interpose::dynamic_nccl(&o.path).unwrap_or_else(|e| {
            blind.push(unreadable(i, false, e));
            None
        })
    };
    let n = map.objects.len();
    let preloaded = |i: usize| matches!(map.objects[i].found_by, FoundBy::Preload { .. });
    let mut facts: Vec<Option<DynamicNccl>> = vec![None; n];
    if let Some(a) = asked {
        facts[a] = read_facts(a, &mut blind);
    }
    let mut self_ids: BTreeMap<usize, Result<Option<SelfId>, SelfIdTrouble>> = BTreeMap::new();
    if let (Some(a), Some(ids)) = (asked, target_self_ids) {
        self_ids.insert(
            a,
            match ids {
                [] => Ok(None),
                [one] => Ok(Some(one.clone())),
                many => Err(SelfIdTrouble::Several {
                    object: target.to_path_buf(),
                    ids: many.to_vec(),
                }),
            },
        );
    }
    let mut id_of = |i: usize| -> Result<Option<SelfId>, SelfIdTrouble> {
        self_ids
            .entry(i)
            .or_insert_with(|| {
                inspect::find_nccl_self_id(&map.objects[i].path).map_err(|e| {
                    SelfIdTrouble::Unreadable {
                        error: format!("{e:#}"),
                    }
                })
            })
            .clone()
    };

    // Whose calls are the process's, and what each calls (name, binding):
    // - the object asked about, for the nccl* functions it calls (a function it defines
    //   but never calls is no call); or, when it names none but carries NCCL compiled in
    //   with hidden symbols, its own calls, which stay inside it;
    // - and whatever the asked object does, every other object that imports nccl*
    //   functions: those bind by scope (a preload is a provider: its own calls are not
    //   the process's);
    // - only when neither exists: the objects that define and call their own; else, for
    //   a process that can dlopen, nothing known (what it opens later is in no file);
    //   else the objects whose read-only data carry a self-id.
    let mut callers: Vec<(usize, Vec<(String, Binding)>)> = Vec::new();
    let mut carriers: Vec<(usize, &'static str)> = Vec::new();
    if let Some((a, f)) = asked.and_then(|a| facts[a].as_ref().map(|f| (a, f))) {
        let called: Vec<(String, Binding)> = f
            .symbols
            .iter()
            .filter(|s| s.binding.is_call())
            .map(|s| (s.name.clone(), s.binding.clone()))
            .collect();
        if !called.is_empty() {
            callers.push((a, called));
        }
    }
    if let Some(a) = asked {
        let names_none = facts[a].as_ref().is_none_or(|f| f.symbols.is_empty());
        if names_none && matches!(id_of(a), Ok(Some(_))) {
            carriers.push((a, HIDDEN_CARRIER));
        }
    }
    for i in 0..n {
        if Some(i) == asked || map.objects[i].is_stand_in() || preloaded(i) {
            continue;
        }
        match interpose::imported_nccl(&map.objects[i].path) {
            Ok(names) if !names.is_empty() => callers.push((
                i,
                names.into_iter().map(|n| (n, Binding::Imported)).collect(),
            )),
            Ok(_) => {}
            Err(e) => blind.push(unreadable(i, false, e)),
        }
    }
    // Set when nothing loaded at start calls NCCL, an NCCL is there, and the process can
    // dlopen: the object that calls dlopen, and the first object exporting nccl*.
    let mut opens_later: Option<(PathBuf, Option<usize>)> = None;
    // Set when nothing calls NCCL and nothing carries a readable self-id, but an object
    // exports nccl* functions: an NCCL whose version fdl cannot read, never "no NCCL".
    let mut unnamed_exporter: Option<usize> = None;
    if callers.is_empty() && carriers.is_empty() {
        for (i, slot) in facts.iter_mut().enumerate() {
            if Some(i) != asked {
                *slot = read_facts(i, &mut blind);
            }
        }
        for (i, f) in facts.iter().enumerate() {
            let Some(f) = f.as_ref().filter(|_| !preloaded(i)) else {
                continue;
            };
            let called: Vec<(String, Binding)> = f
                .symbols
                .iter()
                .filter(|s| s.binding.is_call())
                .map(|s| (s.name.clone(), s.binding.clone()))
                .collect();
            if !called.is_empty() {
                callers.push((i, called));
            }
        }
        if callers.is_empty() {
            let opener = dlopen_caller(&map);
            let exporter =
                (0..n).find(|&i| facts[i].as_ref().is_some_and(|f| !f.exported.is_empty()));
            if let (Some(o), Some(_)) = (&opener, exporter) {
                opens_later = Some((o.clone(), exporter));
            } else {
                carriers = (0..n)
                    .filter(|&i| !map.objects[i].is_stand_in() && !preloaded(i))
                    .filter(|&i| matches!(id_of(i), Ok(Some(_))))
                    .map(|i| {
                        let names_none = facts[i].as_ref().is_none_or(|f| f.symbols.is_empty());
                        (
                            i,
                            if names_none {
                                HIDDEN_CARRIER
                            } else {
                                UNCALLED_CARRIER
                            },
                        )
                    })
                    .collect();
                if let Some(o) = opener.filter(|_| !carriers.is_empty()) {
                    opens_later = Some((o, None));
                    carriers.clear();
                }
                if carriers.is_empty() && opens_later.is_none() {
                    unnamed_exporter = exporter.filter(|&i| !preloaded(i));
                }
            }
        }
    }

    // What each object exports of the names looked up, in the order of the global scope,
    // up to the first definer of each: through each object's hash table, as the loader
    // looks them up; `None` where not looked at.
    let mut exports: Vec<Option<BTreeSet<String>>> = vec![None; n];
    let mut wanted: Vec<&str> = Vec::new();
    for (_, called) in &callers {
        for (name, b) in called {
            if matches!(b, Binding::Imported | Binding::Interposable)
                && !wanted.contains(&name.as_str())
            {
                wanted.push(name);
            }
        }
    }
    // The version the asked object references each name with: a definition of another
    // version is passed over (glibc's `check_match`). Other callers import by name only
    // here, so their lookups are unversioned.
    let refs = match asked.filter(|a| callers.iter().any(|(c, _)| c == a)) {
        Some(a) => match interpose::reference_versions(&map.objects[a].path, &wanted) {
            Ok(r) => r,
            Err(e) => {
                blind.push(unreadable(a, true, e));
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
        let found = if let Some(f) = &facts[i] {
            f.exported.clone()
        } else if map.objects[i].is_stand_in() {
            BTreeSet::new()
        } else {
            match interpose::exported_among_versioned(&map.objects[i].path, &wanted) {
                Ok(found) => found,
                Err(e) => {
                    blind.push(unreadable(i, false, e));
                    BTreeSet::new()
                }
            }
        };
        wanted.retain(|(n, _)| !found.contains(*n));
        *slot = Some(found);
    }
    // Everything that hides what lies at or after a place in the order.
    let mut hidden: Vec<(usize, Doubt)> = map
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
        .chain(map.caveats.iter().map(|c| {
            (
                c.position,
                Doubt::Caveat {
                    what: c.what.clone(),
                },
            )
        }))
        .chain(blind.iter().cloned())
        .collect();
    hidden.sort_by_key(|(p, _)| *p);
    // The library a doubt says is not on this host at all, if that is all it says.
    let absent = |d: &Doubt| match d {
        Doubt::LoadFailure {
            needed,
            absent: true,
            ..
        } => Some(needed.clone()),
        _ => None,
    };

    // (caller, target, names, how, how as a kind: Perhaps when only perhaps calls)
    let mut groups: Vec<Group> = Vec::new();
    let mut doubts: Vec<Doubt> = Vec::new();
    // Targets that something unknown lies before: the answer if that defines nothing.
    let mut provisional: Vec<usize> = Vec::new();
    let global = "the first definition in the global scope".to_string();
    for (c, called) in &callers {
        let c = *c;
        for (name, binding) in called {
            let (target, how, bound) = match binding {
                Binding::BoundLocally { why } => (Some(c), why.clone(), Bound::Locally),
                Binding::Uncertain { why } => (Some(c), why.clone(), Bound::Perhaps),
                Binding::NeverCalled => continue,
                Binding::Imported | Binding::Interposable => {
                    let t = (0..exports.len())
                        .find(|&i| exports[i].as_ref().is_some_and(|d| d.contains(name)));
                    let limit = t.unwrap_or(usize::MAX);
                    for (_, why) in hidden.iter().filter(|(p, _)| *p <= limit) {
                        if !doubts.contains(why) {
                            doubts.push(why.clone());
                        }
                    }
                    if let Some(t) = t.filter(|&t| hidden.iter().any(|(p, _)| *p <= t)) {
                        provisional.push(t);
                    }
                    (t, global.clone(), Bound::Global)
                }
            };
            match groups
                .iter_mut()
                .find(|g| g.0 == c && g.1 == target && g.3 == how && g.4 == bound)
            {
                Some(g) => g.2.push(name.clone()),
                None => groups.push((c, target, vec![name.clone()], how, bound)),
            }
        }
    }

    // NCCL compiled in with hidden symbols names no function a lookup could reach: its
    // self-id is the trace, and its calls can only stay in its object.
    for &(i, how) in &carriers {
        groups.push((i, Some(i), Vec::new(), how.into(), Bound::Carried));
    }

    let calls: Vec<CallGroup> = groups
        .iter()
        .map(|(c, t, syms, how, bound)| CallGroup {
            caller: shown(&map, *c),
            object: t.map(|t| shown(&map, t)),
            symbols: syms.clone(),
            how: how.clone(),
            bound: *bound,
            nccl: t.and_then(|t| id_of(t).ok().flatten()),
        })
        .collect();

    let mut warnings: Vec<String> = Vec::new();
    let mut targets: Vec<usize> = groups.iter().filter_map(|g| g.1).collect();
    targets.sort_unstable();
    targets.dedup();
    // The targets of calls that are certain; a call fdl could not confirm that reaches
    // another object leaves the answer open.
    let certain: Vec<usize> = targets
        .iter()
        .copied()
        .filter(|&t| {
            groups
                .iter()
                .any(|g| g.1 == Some(t) && g.4 != Bound::Perhaps)
        })
        .collect();
    let perhaps: Vec<&Group> = groups
        .iter()
        .filter(|g| g.4 == Bound::Perhaps && g.1.is_some_and(|t| !certain.contains(&t)))
        .collect();
    let undefined: Vec<&String> = groups
        .iter()
        .filter(|g| g.1.is_none())
        .flat_map(|g| g.2.iter())
        .collect();

    let missing_nccl = map.failures.iter().any(|f| f.needed.starts_with("libnccl"));
    let pin = if missing_nccl {
        asked.and_then(|a| pin::find(&map.objects[a].path))
    } else {
        None
    };

    // The answer under the condition that nothing unknown defines nccl*: one object every
    // call reaches, with a self-id, and doubts only before it.
    let mut conditional = None;
    if !doubts.is_empty() && undefined.is_empty() {
        let mut reached = provisional.clone();
        reached.sort_unstable();
        reached.dedup();
        if let ([t], [only]) = (reached.as_slice(), targets.as_slice()) {
            if t == only {
                if let Ok(Some(id)) = id_of(*t) {
                    let mut missing: Vec<String> = doubts.iter().filter_map(absent).collect();
                    missing.sort();
                    missing.dedup();
                    conditional = Some(Conditional {
                        detection: detection_of(&map, &groups, *t, id),
                        only_missing: doubts.iter().all(|d| absent(d).is_some()),
                        unknowns: doubts.iter().map(Doubt::to_string).collect(),
                        missing,
                        pin: asked.and_then(|a| pin::find(&map.objects[a].path)),
                    });
                }
            }
        }
    }

    let reached = |id_of: &mut dyn FnMut(usize) -> Result<Option<SelfId>, SelfIdTrouble>,
                   t: usize| Reached {
        object: shown(&map, t),
        nccl: id_of(t).ok().flatten().map(|id| id.nccl),
    };
    let reason = if !doubts.is_empty() {
        // Failures and caveats past the map's caps are counted there, not listed.
        let omitted = map.failures_omitted + map.caveats_omitted;
        provisional.sort_unstable();
        provisional.dedup();
        let if_none = match provisional.as_slice() {
            [t] => match id_of(*t) {
                Ok(Some(id)) => Some(Reached {
                    object: shown(&map, *t),
                    nccl: Some(id.nccl),
                }),
                _ => None,
            },
            _ => None,
        };
        Some(Unknown::Hidden {
            missing_pin: pin.clone(),
            doubts: doubts.iter().take(3).cloned().collect(),
            more: doubts.len().saturating_sub(3) + omitted,
            if_none,
        })
    } else if !undefined.is_empty() {
        Some(Unknown::Undefined {
            names: undefined.iter().map(|s| s.to_string()).collect(),
        })
    } else if let Some((c, _, syms, why, _)) = perhaps.first() {
        Some(Unknown::PossibleCall {
            at: reached(&mut id_of, *c),
            names: syms.clone(),
            why: why.clone(),
            elsewhere: certain.iter().map(|&t| reached(&mut id_of, t)).collect(),
        })
    } else {
        None
    };
    let answer = if let Some(reason) = reason {
        Answer::Unknown { reason }
    } else if targets.len() > 1 {
        let parts: Vec<SplitPart> = groups
            .iter()
            .filter_map(|(c, t, syms, _, _)| {
                Some(SplitPart {
                    names: syms.clone(),
                    caller: shown(&map, *c),
                    to: reached(&mut id_of, (*t)?),
                })
            })
            .collect();
        Answer::Split {
            reason: Split {
                objects: targets.len(),
                parts,
            },
        }
    } else if let Some(&t) = targets.first() {
        match id_of(t) {
            Ok(Some(id)) => Answer::Nccl {
                detection: detection_of(&map, &groups, t, id),
            },
            Ok(None) => Answer::Unknown {
                reason: Unknown::NoSelfId {
                    object: shown(&map, t),
                },
            },
            Err(e) => Answer::Unknown {
                reason: Unknown::SelfIdUnknown(e),
            },
        }
    } else if let Some((_, why)) = hidden.first() {
        Answer::Unknown {
            reason: Unknown::Unreadable {
                missing_pin: pin.clone(),
                doubt: why.clone(),
            },
        }
    } else if let Some((o, first)) = &opens_later {
        Answer::Unknown {
            reason: Unknown::OpensLater {
                opener: o.clone(),
                first: first.map(|t| reached(&mut id_of, t)),
            },
        }
    } else if let Some(e) = unnamed_exporter {
        let names = facts[e]
            .as_ref()
            .map(|f| f.exported.iter().take(3).cloned().collect())
            .unwrap_or_default();
        Answer::Unknown {
            reason: Unknown::UnnamedExporter {
                object: shown(&map, e),
                names,
                why: id_of(e).err(),
            },
        }
    } else if let Some(o) = dlopen_caller(&map) {
        Answer::Unknown {
            reason: Unknown::MayDlopen { opener: o },
        }
    } else {
        Answer::None {
            reason:
                "no object of the process defines, calls or carries NCCL, and none calls dlopen"
                    .into(),
        }
    };

    if matches!(answer, Answer::Nccl { .. } | Answer::Split { .. }) {
        for (_, why) in &hidden {
            warnings.push(format!(
                "the process would not start as laid out here: {why}"
            ));
        }
    }
    for s in &map.skipped_preloads {
        warnings.push(format!(
            "{} element '{}' is ignored by the loader: {}",
            s.source, s.entry, s.reason
        ));
    }
    Ok(Which {
        target: target.to_path_buf(),
        answer,
        calls,
        link_map: map,
        pin,
        conditional,
        warnings,
    })
}

/// What the calls reaching object `t` (whose self-id is `id`) run: its NCCL, its file and
/// how it came into the process.
fn detection_of(map: &LinkMap, groups: &[Group], t: usize, id: SelfId) -> NcclDetection {
    let caller = groups.iter().find(|g| g.1 == Some(t)).map(|g| g.0);
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

/// Calls of one object that reach one place: (caller, target, names, how, how as a kind).
type Group = (usize, Option<usize>, Vec<String>, String, Bound);

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
