//! Why the loader model cannot name one NCCL, as facts: what [`super::Answer::Unknown`]
//! and [`super::Answer::Split`] carry. `Display` says each whole (the text `--json` has as
//! `reason`); a shorter rendering is the CLI's, built from the same facts, so that no
//! caller ever reads fdl's own sentence back to shorten or classify it.

use super::pin::Pin;
use crate::inspect::SelfId;
use crate::version::NcclVersion;
use serde::Serialize;
use std::fmt;
use std::path::PathBuf;

/// One thing fdl cannot see that lies in the order before (or at) an object: anything
/// there could define `nccl*` functions first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Doubt {
    /// A DT_NEEDED entry the loader cannot load.
    LoadFailure {
        needed: String,
        #[serde(serialize_with = "crate::text::json_path::one")]
        needed_by: PathBuf,
        why: String,
        /// Whether no file of that name is anywhere the loader looks: "not on this host".
        absent: bool,
    },
    /// A loader rule the model does not follow, in its own words.
    Caveat { what: String },
    /// An object whose symbols (or their versions) fdl cannot read.
    Unreadable {
        #[serde(serialize_with = "crate::text::json_path::one")]
        object: PathBuf,
        /// The symbol versions, rather than the symbols.
        versions: bool,
        error: String,
    },
}

impl fmt::Display for Doubt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Doubt::LoadFailure {
                needed,
                needed_by,
                why,
                ..
            } => write!(
                f,
                "{needed} (needed by {}) cannot be loaded: {why}",
                needed_by.display()
            ),
            Doubt::Caveat { what } => f.write_str(what),
            Doubt::Unreadable {
                object,
                versions,
                error,
            } => write!(
                f,
                "the {} of {} cannot be read: {error}",
                if *versions {
                    "symbol versions"
                } else {
                    "symbols"
                },
                object.display()
            ),
        }
    }
}

/// An object that calls reach, with the NCCL its self-id names (`None`: it carries none
/// fdl can read).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reached {
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub object: PathBuf,
    pub nccl: Option<NcclVersion>,
}

impl Reached {
    /// `NCCL 2.27.5`, or `no NCCL self-id`.
    pub fn nccl_words(&self) -> String {
        match &self.nccl {
            Some(v) => format!("NCCL {v}"),
            None => "no NCCL self-id".into(),
        }
    }
}

impl fmt::Display for Reached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.object.display(), self.nccl_words())
    }
}

/// Why fdl cannot say which NCCL a process runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Unknown {
    /// What comes before the object that defines the called functions is not all known.
    Hidden {
        /// The NCCL the asked library's pip distribution pins, which is not installed.
        #[serde(skip_serializing_if = "Option::is_none")]
        missing_pin: Option<Pin>,
        /// The first few doubts, in the order's order.
        doubts: Vec<Doubt>,
        /// How many more there are (counted, not listed).
        more: usize,
        /// The one object the calls bind to if none of that defines `nccl*`, with a
        /// self-id.
        #[serde(skip_serializing_if = "Option::is_none")]
        if_none: Option<Reached>,
    },
    /// Nothing loaded at start defines these called functions.
    Undefined { names: Vec<String> },
    /// `at` may call `names` itself, which fdl could not confirm (`why`).
    PossibleCall {
        at: Reached,
        names: Vec<String>,
        why: String,
        /// What the other, certain, calls reach.
        elsewhere: Vec<Reached>,
    },
    /// The calls reach an object without an NCCL self-id: not an NCCL build.
    NoSelfId { object: PathBuf },
    /// The self-id of the object the calls reach cannot be told.
    SelfIdUnknown(SelfIdTrouble),
    /// Nothing readable defines or calls NCCL, but something could not be read.
    Unreadable {
        #[serde(skip_serializing_if = "Option::is_none")]
        missing_pin: Option<Pin>,
        doubt: Doubt,
    },
    /// NCCL is loaded at start, nothing calls it, and `opener` calls dlopen; `first` is
    /// the first definition a library opened later would bind to (`None`: the NCCL is
    /// compiled in with hidden symbols).
    OpensLater {
        #[serde(serialize_with = "crate::text::json_path::one")]
        opener: PathBuf,
        #[serde(skip_serializing_if = "Option::is_none")]
        first: Option<Reached>,
    },
    /// `object` exports `nccl*` functions (the first few are `names`) but its self-id
    /// cannot be read (`why`; `None`: it carries none fdl can read).
    UnnamedExporter {
        #[serde(serialize_with = "crate::text::json_path::one")]
        object: PathBuf,
        names: Vec<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        why: Option<SelfIdTrouble>,
    },
    /// Nothing at start has NCCL, but `opener` calls dlopen.
    MayDlopen { opener: PathBuf },
    /// What the Python model of the process leaves unknown, or why the import fails.
    Python { why: Vec<String> },
}

/// Why an object's self-id cannot be told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "trouble", rename_all = "snake_case")]
pub enum SelfIdTrouble {
    /// It carries several different ones.
    Several { object: PathBuf, ids: Vec<SelfId> },
    /// Its read-only data cannot be read.
    Unreadable { error: String },
}

impl fmt::Display for SelfIdTrouble {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SelfIdTrouble::Several { object, ids } => write!(
                f,
                "{} carries {} different NCCL self-ids ({}); cannot tell which one is linked",
                object.display(),
                ids.len(),
                ids.iter()
                    .map(|i| format!("{}+cuda{}", i.nccl, i.cuda))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            SelfIdTrouble::Unreadable { error } => f.write_str(error),
        }
    }
}

/// `expects NCCL … (pip install d==v)`: the first clause of a reason whose pip pin is not
/// installed.
pub fn missing_pin_words(p: &Pin) -> String {
    format!(
        "expects {p}, which is not installed (pip install {}=={})",
        p.distribution, p.version
    )
}

fn pin_head(f: &mut fmt::Formatter<'_>, pin: &Option<Pin>) -> fmt::Result {
    match pin {
        Some(p) => write!(f, "{}; ", missing_pin_words(p)),
        None => Ok(()),
    }
}

impl fmt::Display for Unknown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unknown::Hidden {
                missing_pin,
                doubts,
                more,
                if_none,
            } => {
                pin_head(f, missing_pin)?;
                write!(f, "{HIDDEN}: ")?;
                for (i, d) in doubts.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{d}")?;
                }
                if *more > 0 {
                    write!(f, " (and {more} more)")?;
                }
                if let Some(r) = if_none {
                    write!(f, ". {}", if_none_words(r))?;
                }
                Ok(())
            }
            Unknown::Undefined { names } => write!(f, "{}", undefined_words(&names.join(", "))),
            Unknown::PossibleCall {
                at,
                names,
                why,
                elsewhere,
            } => {
                let (and, otherwise) = possible_call_tail(elsewhere);
                write!(
                    f,
                    "{}{and}; {otherwise}",
                    possible_call_head(at, &names.join(", "), why)
                )
            }
            Unknown::NoSelfId { object } => write!(
                f,
                "NCCL's functions bind to {}, which carries no NCCL self-id: it is not an NCCL build (a shim?), so its version is unknown",
                object.display()
            ),
            Unknown::SelfIdUnknown(t) => write!(f, "{t}"),
            Unknown::Unreadable { missing_pin, doubt } => {
                pin_head(f, missing_pin)?;
                write!(f, "{UNREADABLE}: {doubt}")
            }
            Unknown::OpensLater { opener, first } => {
                write!(
                    f,
                    "NCCL is loaded at start but nothing there calls it, and {} calls dlopen: what it opens later is in no file fdl reads, and that decides which NCCL runs",
                    opener.display()
                )?;
                // A library opened later looks up the global scope first: the program,
                // the preloads, the start-up closure.
                match first {
                    Some(r) => write!(
                        f,
                        ". A library opened later that imports nccl* functions binds them to the first definition in the global scope, {r}"
                    ),
                    None => f.write_str(
                        ". The NCCL loaded at start is compiled in with hidden symbols: a library opened later that imports nccl* functions finds no definition there",
                    ),
                }
            }
            Unknown::UnnamedExporter { object, names, why } => write!(
                f,
                "{} defines NCCL's functions ({}) but its NCCL self-id cannot be read ({}): an NCCL of unknown version",
                object.display(),
                names.join(", "),
                match why {
                    Some(t) => t.to_string(),
                    None => "it carries no self-id fdl can read".into(),
                }
            ),
            Unknown::MayDlopen { opener } => write!(
                f,
                "no object loaded at start defines, calls or carries NCCL, but {} calls dlopen: NCCL may be loaded at run time, which no file says",
                opener.display()
            ),
            Unknown::Python { why } => f.write_str(&why.join("; ")),
        }
    }
}

/// The head of [`Unknown::Hidden`], before its doubts.
pub const HIDDEN: &str = "what comes before the object that defines NCCL's functions is not all known, and any of it could define them first";
/// The head of [`Unknown::Unreadable`], before its doubt.
pub const UNREADABLE: &str =
    "no object that could be read defines or calls NCCL, but not everything could be";

/// `If none of that defines nccl* functions, the calls bind to …`.
pub fn if_none_words(r: &Reached) -> String {
    format!(
        "If none of that defines nccl* functions, the calls bind to {}",
        r
    )
}

/// [`Unknown::Undefined`] with its names said as `names`.
pub fn undefined_words(names: &str) -> String {
    format!(
        "nothing loaded at start defines {names}: the call fails when made, unless a library loaded later with dlopen provides it"
    )
}

/// The first clause of [`Unknown::PossibleCall`], with its names said as `names`.
pub fn possible_call_head(at: &Reached, names: &str, why: &str) -> String {
    format!(
        "{} may call {names} itself, which fdl cannot confirm ({why}). If it does, those calls stay in {at}",
        at.object.display()
    )
}

/// The rest of [`Unknown::PossibleCall`]: what the other calls do, to end the first
/// clause, and what happens if the object does not call its own (the second clause).
pub fn possible_call_tail(elsewhere: &[Reached]) -> (String, &'static str) {
    if elsewhere.is_empty() {
        (
            ", and nothing else calls NCCL".to_string(),
            "if not, nothing loaded at start calls it",
        )
    } else {
        (
            format!(
                ", while the other calls reach {}: two NCCLs in one process",
                elsewhere
                    .iter()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "if not, only the latter",
        )
    }
}

/// One group of calls of a split: `names` of `caller` reach `to` (`names` empty: the
/// object's own calls, NCCL compiled in).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SplitPart {
    pub names: Vec<String>,
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub caller: PathBuf,
    pub to: Reached,
}

/// The calls reach different objects: two NCCLs in one process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Split {
    /// How many different objects the calls reach.
    pub objects: usize,
    pub parts: Vec<SplitPart>,
}

impl Split {
    /// The head of the sentence, before its parts.
    pub fn head(&self) -> String {
        format!(
            "NCCL's functions bind to {} different objects, so the process runs two NCCLs that share no state",
            self.objects
        )
    }
}

impl SplitPart {
    /// The part, with its names said as `names` (`its own calls` when it names none).
    pub fn words(&self, names: &str) -> String {
        format!(
            "{} of {} → {}",
            if self.names.is_empty() {
                "its own calls"
            } else {
                names
            },
            self.caller.display(),
            self.to
        )
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.head())?;
        for (i, p) in self.parts.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            f.write_str(&p.words(&p.names.join(", ")))?;
        }
        Ok(())
    }
}
