//! A Python process that imports torch: which libraries torch's own `__init__.py` opens
//! before libtorch, and from where.
//!
//! `import torch` loads `torch/lib/libtorch_global_deps.so` and, depending on the torch,
//! walks `sys.path` for `nvidia/<folder>/lib/<pattern>` (and other places) and opens the
//! first match with ctypes, NCCL among them, before `torch._C` brings in
//! `libtorch_cuda.so`; the loader then reuses that copy for `libnccl.so.2` by its soname.
//! So a Python process can run another NCCL than a program linking the same libtorch.
//!
//! What the installed torch does is read from its `__init__.py` ([`TorchLoading::read`]),
//! never taken from a table of torch versions: the preloading functions, their table of
//! `(folder, pattern)` pairs, the places they glob and the conditions on the normal path
//! and the fallback. `sys.path` is the interpreter's ([`SysPath::of`]): the start
//! directory (`python -c`/`-m`: the working directory, which fdl cannot know and so
//! assumes), `PYTHONPATH`, the standard library, the user site, the site directories and
//! their `.pth` path lines (never their `import` lines). Python code is never run here.

use crate::inspect::{elf, Source};
use anyhow::Result;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// The most of `__init__.py` read: torch's is about 100 KiB.
const MAX_INIT: u64 = 8 << 20;
/// The most of one `.pth` file, `pyvenv.cfg` or `version.py` read.
const MAX_SMALL: u64 = 1 << 20;
/// `.pth` files read per site directory, and path lines taken from them.
const MAX_PTH: usize = 512;

/// Which kind of process runs a libtorch: a program linking it, or Python importing a pip
/// torch (whose `__init__.py` may open libraries first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessKind {
    Python,
    Program,
}

/// One segment of a place torch globs under a `sys.path` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum Segment {
    /// A literal directory name (`nvidia`, `lib`).
    Literal(String),
    /// The pair's folder (`nccl`).
    Folder,
    /// `cu<major>` of the CUDA torch was built with (`torch.version.cuda`): prefix, suffix.
    CudaMajor(String, String),
}

/// A `(folder, pattern)` pair torch preloads, and whether a missing one stops the import.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Wanted {
    pub folder: String,
    pub pattern: String,
    pub required: bool,
}

impl Wanted {
    pub fn is_nccl(&self) -> bool {
        self.pattern.starts_with("libnccl.")
    }
}

/// The preloads of one path of `_load_global_deps`, in order, with their condition.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Preloads {
    /// Preloading happens only when the process's maps hold this text (torch reads
    /// `/proc/self/maps` after loading `libtorch_global_deps.so`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub if_mapped: Option<String>,
    pub wanted: Vec<Wanted>,
}

/// What the installed torch's `__init__.py` does before `libtorch_cuda.so` loads.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TorchLoading {
    /// It preloads nothing from `sys.path` that fdl needs: it never names an NCCL.
    NoNccl { init: PathBuf },
    /// `_load_global_deps`: `normal` after `libtorch_global_deps.so` loaded, `fallback`
    /// when that load fails with an error naming one of the CUDA libraries.
    Preloads {
        #[serde(serialize_with = "crate::text::json_path::one")]
        init: PathBuf,
        places: Vec<Vec<Segment>>,
        normal: Preloads,
        fallback: Preloads,
        /// `torch.version.cuda`, for the `cu<major>` place.
        #[serde(skip_serializing_if = "Option::is_none")]
        cuda: Option<String>,
    },
    /// It names NCCL in a way fdl does not read: the Python answer is unknown.
    Unread { init: PathBuf, why: String },
}

impl TorchLoading {
    /// Reads `torch_dir/__init__.py` (and `version.py` for its CUDA).
    pub fn read(torch_dir: &Path) -> Result<TorchLoading> {
        let init = torch_dir.join("__init__.py");
        let text = crate::fsread::read_text_following(&init, MAX_INIT)?;
        let cuda =
            crate::fsread::read_text_following_if_present(&torch_dir.join("version.py"), MAX_SMALL)
                .ok()
                .flatten()
                .and_then(|v| version_cuda(&v));
        Ok(read_init(&text, init, cuda))
    }

    /// The NCCL pattern the normal path preloads, if any.
    pub fn nccl_on_import(&self) -> Option<&Wanted> {
        match self {
            TorchLoading::Preloads { normal, .. } => normal.wanted.iter().find(|w| w.is_nccl()),
            _ => None,
        }
    }

    /// One line: what the installed torch does about NCCL.
    pub fn summary(&self) -> String {
        match self {
            TorchLoading::NoNccl { .. } => {
                "torch's __init__.py preloads no NCCL: libtorch_cuda.so's own link decides".into()
            }
            TorchLoading::Preloads {
                normal, fallback, ..
            } => {
                let n = normal.wanted.iter().find(|w| w.is_nccl());
                let f = fallback.wanted.iter().find(|w| w.is_nccl());
                match (n, &normal.if_mapped, f) {
                    (Some(w), Some(needle), _) => format!(
                        "torch's __init__.py preloads {} from the first sys.path entry holding it (once {needle:?} is mapped)",
                        w.pattern
                    ),
                    (Some(w), None, _) => format!(
                        "torch's __init__.py preloads {} from the first sys.path entry holding it",
                        w.pattern
                    ),
                    (None, _, Some(w)) => format!(
                        "torch's __init__.py preloads {} from sys.path only when libtorch_global_deps.so fails to load",
                        w.pattern
                    ),
                    (None, _, None) => "torch's __init__.py preloads no NCCL".into(),
                }
            }
            TorchLoading::Unread { why, .. } => format!("torch's __init__.py: {why}"),
        }
    }
}

/// `cuda = '13.2'` (or `cuda: Optional[str] = '13.2'`) in `version.py`.
fn version_cuda(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix("cuda")?;
        let rest = rest.trim_start();
        if !(rest.starts_with('=') || rest.starts_with(':')) {
            return None;
        }
        let (_, value) = rest.split_once('=')?;
        string_literal(value.trim()).map(|(s, _)| s)
    })
}

/// A Python string literal at the start of `s` (`'…'` or `"…"`, no escapes read): its
/// value and the rest of `s`.
fn string_literal(s: &str) -> Option<(String, &str)> {
    let q = s.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    let end = s[1..].find(q)? + 1;
    let value = &s[1..end];
    (!value.contains('\\')).then(|| (value.to_string(), &s[end + 1..]))
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The lines of `text`, and where each `def` is (read once: torch's file has hundreds).
struct Code<'a> {
    lines: Vec<&'a str>,
    /// `(name, line)` of every `def NAME(`, in order.
    defs: Vec<(&'a str, usize)>,
}

impl<'a> Code<'a> {
    fn new(text: &'a str) -> Self {
        let lines: Vec<&str> = text.lines().collect();
        let defs = lines
            .iter()
            .enumerate()
            .filter_map(|(i, l)| {
                let rest = l.trim_start().strip_prefix("def ")?;
                let name = rest.split('(').next()?;
                (rest.len() > name.len()).then_some((name, i))
            })
            .collect();
        Code { lines, defs }
    }

    /// The names of the functions defined, in order.
    fn names(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.defs.iter().map(|(n, _)| *n)
    }

    /// `def NAME(params)`: its parameter names and the range of its body's lines.
    fn function(&self, name: &str) -> Option<(Vec<String>, std::ops::Range<usize>)> {
        let at = self.defs.iter().find(|(n, _)| *n == name)?.1;
        let base = indent(self.lines[at]);
        // The parameters, possibly over several lines, up to the closing parenthesis.
        let mut sig = String::new();
        let mut i = at;
        while i < self.lines.len() {
            sig.push_str(self.lines[i]);
            if balanced(&sig) {
                break;
            }
            i += 1;
        }
        let open = sig.find('(')? + 1;
        let close = sig.rfind(')')?;
        let params = split_args(sig.get(open..close)?)
            .into_iter()
            .map(|p| {
                p.split([':', '='])
                    .next()
                    .unwrap_or("")
                    .trim()
                    .trim_start_matches('*')
                    .to_string()
            })
            .filter(|p| !p.is_empty())
            .collect();
        let start = i + 1;
        let mut end = start;
        while end < self.lines.len() {
            let l = self.lines[end];
            if !l.trim().is_empty() && indent(l) <= base {
                break;
            }
            end += 1;
        }
        Some((params, start..end))
    }

    fn body(&self, r: &std::ops::Range<usize>) -> String {
        self.lines[r.clone()].join("\n")
    }
}

/// Parentheses and brackets balanced in `s` (strings are not looked into).
fn balanced(s: &str) -> bool {
    let mut depth = 0i32;
    for c in s.chars() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            _ => {}
        }
    }
    depth <= 0 && s.contains('(')
}

/// Splits a call's argument text at its top-level commas.
fn split_args(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    let mut cur = String::new();
    for c in s.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '(' | '[' | '{') => depth += 1,
            (None, ')' | ']' | '}') => depth -= 1,
            (None, ',') if depth == 0 => {
                out.push(std::mem::take(&mut cur).trim().to_string());
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// The calls `NAME(args)` in `text`, in order: each call's argument text.
fn calls(text: &str, name: &str) -> Vec<(usize, String)> {
    let needle = format!("{name}(");
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find(&needle) {
        let at = from + i;
        from = at + needle.len();
        // Not part of a longer name, not its definition.
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.') {
            continue;
        }
        if text[..at].trim_end().ends_with("def") {
            continue;
        }
        let mut depth = 1;
        let mut end = from;
        for (j, c) in text[from..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = from + j;
                        break;
                    }
                }
                _ => {}
            }
        }
        if depth == 0 {
            out.push((at, text[from..end].to_string()));
        }
    }
    out
}

/// The `(folder, pattern)` pairs of the table literals in `text`: `("a", "b"),` tuples or
/// `"a": "b",` dict entries, and `NAME["a"] = "b"` additions, in order.
fn table_pairs(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        let t = t.strip_prefix('(').unwrap_or(t);
        if let Some((a, rest)) = string_literal(t) {
            let rest = rest.trim_start();
            let rest = rest
                .strip_prefix(',')
                .or_else(|| rest.strip_prefix(':'))
                .map(str::trim_start);
            if let Some((b, _)) = rest.and_then(string_literal) {
                out.push((a, b));
            }
            continue;
        }
        // cuda_libs["cufile"] = "libcufile.so.*[0-9]"
        if let Some(open) = t.find("[") {
            if let Some((a, rest)) = string_literal(&t[open + 1..]) {
                if let Some(rest) = rest.trim_start().strip_prefix(']') {
                    if let Some(v) = rest.trim_start().strip_prefix('=') {
                        if let Some((b, _)) = string_literal(v.trim()) {
                            out.push((a, b));
                        }
                    }
                }
            }
        }
    }
    out
}

/// Reads the text of `__init__.py`.
fn read_init(text: &str, init: PathBuf, cuda: Option<String>) -> TorchLoading {
    if !text.contains("libnccl") {
        return TorchLoading::NoNccl { init };
    }
    let unread = |init: PathBuf, why: &str| TorchLoading::Unread {
        init,
        why: why.to_string(),
    };
    let code = Code::new(text);
    let Some((_, body)) = code.function("_load_global_deps") else {
        return unread(
            init,
            "it names libnccl outside _load_global_deps, which fdl does not read",
        );
    };
    // The normal path runs until the outermost `except OSError`; the fallback after it.
    let base = code.lines[body.clone()]
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| indent(l))
        .min()
        .unwrap_or(0);
    let split = body.clone().find(|&i| {
        let l = code.lines[i];
        indent(l) == base && l.trim_start().starts_with("except OSError")
    });
    let (normal, fallback) = match split {
        Some(s) => (body.start..s, s..body.end),
        None => (body.clone(), body.end..body.end),
    };
    let walkers = Walkers::find(&code);
    if walkers.walkers.is_empty() {
        return unread(
            init,
            "no function of it that walks sys.path and opens a library was read",
        );
    }
    let normal = walkers.preloads(&code, &normal);
    let fallback = walkers.preloads(&code, &fallback);
    let places = walkers.places.clone();
    if places.is_empty() {
        return unread(
            init,
            "the places it globs under each sys.path entry were not read",
        );
    }
    if !normal
        .wanted
        .iter()
        .chain(&fallback.wanted)
        .any(Wanted::is_nccl)
    {
        return unread(
            init,
            "it names libnccl, but in no preload of _load_global_deps that fdl reads",
        );
    }
    TorchLoading::Preloads {
        init,
        places,
        normal,
        fallback,
        cuda,
    }
}

/// The functions that walk `sys.path` and open what they find (`_preload_cuda_lib`, or
/// `_preload_cuda_deps(folder, name)` before torch 2.9), and the places they glob.
struct Walkers {
    /// Name and parameter names (folder, pattern), in the order they are taken.
    walkers: Vec<(String, Vec<String>)>,
    places: Vec<Vec<Segment>>,
}

impl Walkers {
    fn find(code: &Code) -> Walkers {
        let mut walkers = Vec::new();
        let mut places = Vec::new();
        for name in code.names() {
            let Some((params, body)) = code.function(name) else {
                continue;
            };
            let text = code.body(&body);
            if !(text.contains("sys.path") && text.contains("ctypes.CDLL(")) {
                continue;
            }
            // The places: `os.path.join(entry, …)` in this function or the helper it
            // calls with the entry.
            let mut found = join_places(&text, &params);
            if found.is_empty() {
                for (hparams, hbody) in helpers(code, &text) {
                    found = join_places(&code.body(&hbody), &hparams);
                    if !found.is_empty() {
                        break;
                    }
                }
            }
            if places.is_empty() {
                places = found;
            }
            walkers.push((name.to_string(), params));
        }
        Walkers { walkers, places }
    }

    /// The preloads of the lines `range` of `code`, in order.
    fn preloads(&self, code: &Code, range: &std::ops::Range<usize>) -> Preloads {
        let text = code.lines[range.clone()].join("\n");
        let mut out = Preloads::default();
        // `if "libcudart.so" not in _maps: return`
        if let Some(i) = text.find(" not in _maps") {
            let head = text[..i].rsplit("if ").next().unwrap_or("");
            if let Some((needle, _)) = string_literal(head.trim()) {
                out.if_mapped = Some(needle);
            }
        }
        self.expand(code, &text, true, &mut out.wanted, 0);
        out
    }

    /// The pairs loaded by the calls in `text`, in order: a walker called with two
    /// literals loads that pair; one called in a loop over a table loads the table's
    /// pairs; another function of the file is followed into.
    fn expand(&self, code: &Code, text: &str, required: bool, out: &mut Vec<Wanted>, depth: u8) {
        if depth > 4 {
            return;
        }
        let mut events: Vec<(usize, Event)> = Vec::new();
        for (name, _) in &self.walkers {
            for (at, args) in calls(text, name) {
                events.push((at, Event::Walker(args)));
            }
        }
        for name in code.names() {
            if self.walkers.iter().any(|(w, _)| w == name) || !name.starts_with("_preload") {
                continue;
            }
            for (at, args) in calls(text, name) {
                events.push((at, Event::Other(name.to_string(), args)));
            }
        }
        events.sort_by_key(|(at, _)| *at);
        let table = table_pairs(text);
        let mut looped = false;
        for (_, e) in events {
            match e {
                Event::Walker(args) => {
                    let args = split_args(&args);
                    let req =
                        required && !args.iter().any(|a| a.replace(' ', "") == "required=False");
                    match (
                        args.first().and_then(|a| string_literal(a)),
                        args.get(1).and_then(|a| string_literal(a)),
                    ) {
                        (Some((folder, _)), Some((pattern, _))) => out.push(Wanted {
                            folder,
                            pattern,
                            required: req,
                        }),
                        _ if !looped => {
                            looped = true;
                            out.extend(table.iter().map(|(folder, pattern)| Wanted {
                                folder: folder.clone(),
                                pattern: pattern.clone(),
                                required: req,
                            }));
                        }
                        _ => {}
                    }
                }
                Event::Other(name, args) => {
                    let req = required && !args.replace(' ', "").contains("required=False");
                    if let Some((_, body)) = code.function(&name) {
                        let inner = code.body(&body);
                        let mut got = Vec::new();
                        self.expand(code, &inner, req, &mut got, depth + 1);
                        // `required` passed through to the walker inside.
                        for w in &mut got {
                            w.required = w.required && req;
                        }
                        out.extend(got);
                    }
                }
            }
        }
    }
}

enum Event {
    Walker(String),
    Other(String, String),
}

/// The functions of `code` called in `text`.
/// A function of the file: its parameter names and the lines of its body.
type Function = (Vec<String>, std::ops::Range<usize>);

fn helpers(code: &Code, text: &str) -> Vec<Function> {
    let mut out = Vec::new();
    for name in code.names() {
        if !calls(text, name).is_empty() {
            if let Some(f) = code.function(name) {
                out.push(f);
            }
        }
    }
    out
}

/// The places of the `glob.glob(os.path.join(entry, …, pattern))` calls in `text`, whose
/// function takes `params` (the entry, the folder, the pattern, by name).
fn join_places(text: &str, params: &[String]) -> Vec<Vec<Segment>> {
    let mut out = Vec::new();
    let folder = params.iter().find(|p| p.contains("folder"));
    let pattern = params.iter().find(|p| p.contains("name"));
    for (at, args) in calls(text, "os.path.join") {
        // Only what is globbed: `glob.glob(os.path.join(…))`.
        if !text[..at].trim_end().ends_with("glob.glob(") {
            continue;
        }
        let mut args = split_args(&args);
        // torch 2.0: `nvidia_path = os.path.join(path, 'nvidia')`, then
        // `os.path.join(nvidia_path, lib_folder, 'lib', lib_name)`.
        if let Some(base) = args.first().and_then(|a| joined_variable(text, a)) {
            args.splice(0..1, base);
        }
        if args.len() < 3 || Some(&args[args.len() - 1]) != pattern {
            continue;
        }
        let mut segs = Vec::new();
        let mut ok = true;
        for a in &args[1..args.len() - 1] {
            if let Some((s, rest)) = string_literal(a) {
                if rest.trim().is_empty() && !s.contains('/') && s != ".." {
                    segs.push(Segment::Literal(s));
                    continue;
                }
            }
            if Some(a) == folder {
                segs.push(Segment::Folder);
                continue;
            }
            // f"cu{maj_cuda_version}"
            if let Some(inner) = a.strip_prefix('f').and_then(|s| string_literal(s)) {
                let s = inner.0;
                if let (Some(o), Some(c)) = (s.find('{'), s.find('}')) {
                    if o < c {
                        segs.push(Segment::CudaMajor(s[..o].into(), s[c + 1..].into()));
                        continue;
                    }
                }
            }
            ok = false;
        }
        if ok {
            out.push(segs);
        }
    }
    out
}

/// The arguments of `NAME = os.path.join(…)` in `text`, when `name` is assigned so.
fn joined_variable(text: &str, name: &str) -> Option<Vec<String>> {
    if !name.chars().all(|c| c.is_alphanumeric() || c == '_') {
        return None;
    }
    let head = format!("{name} = os.path.join(");
    let line = text.lines().find(|l| l.trim_start().starts_with(&head))?;
    let rest = line.trim_start().strip_prefix(&head)?;
    let inner = rest.trim_end().strip_suffix(')')?;
    Some(split_args(inner))
}

/// Whether `name` matches the glob `pattern` (`*`, `?`, `[…]` with ranges and `!`), as
/// Python's `fnmatch` does for a file name (names starting with `.` never match `*`).
/// Greedy with one backtrack point, so a hostile pattern costs at most
/// `pattern × name` steps.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    if name.starts_with('.') && !pattern.starts_with('.') {
        return false;
    }
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    // One element of the pattern at `i`: whether it takes `c`, and its length.
    let one = |i: usize, c: char| -> Option<(bool, usize)> {
        match p[i] {
            '?' => Some((true, 1)),
            '[' => {
                let close = (i + 2..p.len()).find(|&k| p[k] == ']');
                let Some(close) = close else {
                    return Some((c == '[', 1));
                };
                let set = &p[i + 1..close];
                let (neg, set) = match set.first() {
                    Some('!') => (true, &set[1..]),
                    _ => (false, set),
                };
                let mut hit = false;
                let mut k = 0;
                while k < set.len() {
                    if k + 2 < set.len() && set[k + 1] == '-' {
                        hit |= set[k] <= c && c <= set[k + 2];
                        k += 3;
                    } else {
                        hit |= set[k] == c;
                        k += 1;
                    }
                }
                Some((hit != neg, close + 1 - i))
            }
            '*' => None,
            lit => Some((lit == c, 1)),
        }
    };
    let (mut pi, mut ni) = (0, 0);
    let mut back: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && p[pi] == '*' {
            back = Some((pi + 1, ni));
            pi += 1;
            continue;
        }
        if pi < p.len() {
            if let Some((true, len)) = one(pi, n[ni]) {
                pi += len;
                ni += 1;
                continue;
            }
        }
        match back {
            Some((bp, bn)) => {
                pi = bp;
                ni = bn + 1;
                back = Some((bp, bn + 1));
            }
            None => return false,
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// Why an entry is on `sys.path`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryFrom {
    /// The directory the launch starts in (`python -c`, `-m`), or the script's.
    Start,
    PythonPath,
    Stdlib,
    UserSite,
    Site,
    /// A path line of a `.pth` file in a site directory.
    Pth,
}

impl std::fmt::Display for EntryFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EntryFrom::Start => "the launch's start directory",
            EntryFrom::PythonPath => "PYTHONPATH",
            EntryFrom::Stdlib => "the standard library",
            EntryFrom::UserSite => "the user site",
            EntryFrom::Site => "a site directory",
            EntryFrom::Pth => "a .pth file's path line",
        })
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub path: PathBuf,
    pub from: EntryFrom,
}

/// How the Python process starts: what `sys.path` depends on besides the files.
#[derive(Debug, Clone, Serialize)]
pub struct Launch {
    /// The directory `sys.path[0]` names: the working directory of `python -c`/`-m`, or a
    /// script's directory.
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub start: PathBuf,
    /// Whether `start` was given (`--cwd`) or assumed (fdl's own working directory).
    pub start_assumed: bool,
    pub pythonpath: Option<String>,
    pub pythonhome: Option<String>,
    pub no_user_site: bool,
    /// `PYTHONSAFEPATH`: no start directory on `sys.path`.
    pub safe_path: bool,
    #[serde(serialize_with = "crate::text::json_path::opt")]
    pub home: Option<PathBuf>,
    #[serde(serialize_with = "crate::text::json_path::opt")]
    pub user_base: Option<PathBuf>,
    /// `TORCH_USE_RTLD_GLOBAL`: torch skips `_load_global_deps` and its preloads.
    pub torch_rtld_global: bool,
}

impl Launch {
    /// From this process's environment, starting in `start` (assumed when `None`: the
    /// working directory).
    pub fn from_env(start: Option<PathBuf>) -> Launch {
        let var = |k: &str| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned());
        let set = |k: &str| var(k).is_some_and(|v| !v.is_empty());
        let assumed = start.is_none();
        Launch {
            start: start
                .unwrap_or_else(|| std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"))),
            start_assumed: assumed,
            pythonpath: var("PYTHONPATH").filter(|v| !v.is_empty()),
            pythonhome: var("PYTHONHOME").filter(|v| !v.is_empty()),
            no_user_site: set("PYTHONNOUSERSITE"),
            safe_path: set("PYTHONSAFEPATH"),
            home: var("HOME").map(PathBuf::from),
            user_base: var("PYTHONUSERBASE").map(PathBuf::from),
            torch_rtld_global: set("TORCH_USE_RTLD_GLOBAL"),
        }
    }
}

impl Launch {
    /// What the torch brings by itself: no start directory, no `PYTHONPATH`, no user
    /// site; only the interpreter's own `sys.path` (what `libtorch add` records and a
    /// build's tag is inferred from).
    pub fn bundled() -> Launch {
        Launch {
            start: PathBuf::from("/"),
            start_assumed: false,
            pythonpath: None,
            pythonhome: None,
            no_user_site: true,
            safe_path: true,
            home: None,
            user_base: None,
            torch_rtld_global: false,
        }
    }
}

/// The interpreter a pip torch belongs to, from the files around its site directory.
#[derive(Debug, Clone, Serialize)]
pub struct Interpreter {
    /// `<prefix>/bin/pythonX.Y` (or `python3`): what a job runs.
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub program: PathBuf,
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub prefix: PathBuf,
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub base_prefix: PathBuf,
    /// `(major, minor)` from `lib/pythonX.Y`.
    pub version: Option<(u32, u32)>,
    pub venv: bool,
    pub system_site_packages: bool,
    /// The site directory torch lies in.
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub site: PathBuf,
    /// The interpreter's DT_RPATH (when it has no DT_RUNPATH), with its `$ORIGIN`: a
    /// conda Python's `$ORIGIN/../lib` is searched for every library its process loads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rpath: Option<(Vec<String>, PathBuf)>,
}

impl Interpreter {
    /// The interpreter of the torch at `torch_dir` (`…/lib/pythonX.Y/site-packages/torch`
    /// or `…/dist-packages/torch`); `None` when it does not lie in a site directory.
    pub fn of_torch(torch_dir: &Path) -> Option<Interpreter> {
        let site = torch_dir.parent()?;
        let site_name = site.file_name()?.to_str()?;
        if site_name != "site-packages" && site_name != "dist-packages" {
            return None;
        }
        let libpy = site.parent()?;
        let version = libpy
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("python"))
            .and_then(|v| {
                let (a, b) = v.split_once('.')?;
                Some((a.parse().ok()?, b.parse().ok()?))
            });
        let prefix = libpy.parent()?.parent()?.to_path_buf();
        let cfg =
            crate::fsread::read_text_following_if_present(&prefix.join("pyvenv.cfg"), MAX_SMALL)
                .ok()
                .flatten();
        let (venv, system_site, base_prefix) = match &cfg {
            Some(cfg) => {
                let key = |k: &str| {
                    cfg.lines().find_map(|l| {
                        let (a, b) = l.split_once('=')?;
                        (a.trim() == k).then(|| b.trim().to_string())
                    })
                };
                let home = key("home").map(PathBuf::from);
                let base = home
                    .as_ref()
                    .and_then(|h| h.parent().map(Path::to_path_buf))
                    .unwrap_or_else(|| prefix.clone());
                (
                    true,
                    key("include-system-site-packages").is_some_and(|v| v == "true"),
                    base,
                )
            }
            None => (false, true, prefix.clone()),
        };
        // `/usr/local/lib/python3.Y/dist-packages` is the system interpreter's, whose
        // program is `/usr/bin/python3.Y`.
        let bins = [
            Some(prefix.join("bin")),
            prefix
                .ends_with("local")
                .then(|| prefix.parent().map(|p| p.join("bin")))
                .flatten(),
        ];
        let names: Vec<String> = version
            .map(|(a, b)| format!("python{a}.{b}"))
            .into_iter()
            .chain(["python3".to_string(), "python".to_string()])
            .collect();
        let program = bins
            .iter()
            .flatten()
            .flat_map(|bin| names.iter().map(move |n| bin.join(n)))
            .find(|p| std::fs::symlink_metadata(p).is_ok())
            .unwrap_or_else(|| prefix.join("bin/python3"));
        // The file the kernel runs: a venv's program links to the base interpreter.
        let real = program.canonicalize().ok();
        let rpath = real.as_ref().and_then(|real| {
            let d = Source::with_file(real, |src| Ok(elf::parse(src)?.dynamic)).ok()?;
            (d.runpath.is_empty() && !d.rpath.is_empty()).then(|| {
                (
                    d.rpath,
                    real.parent().map(Path::to_path_buf).unwrap_or_default(),
                )
            })
        });
        Some(Interpreter {
            program,
            prefix,
            base_prefix,
            version,
            venv,
            system_site_packages: system_site,
            site: site.to_path_buf(),
            rpath,
        })
    }
}

/// `sys.path` of the interpreter for `launch`, and the `.pth` import lines it leaves out.
#[derive(Debug, Clone, Serialize)]
pub struct SysPath {
    pub entries: Vec<Entry>,
    /// `.pth` lines that run code (`import …`): Python runs them, fdl never does; they
    /// may change `sys.path`.
    #[serde(serialize_with = "crate::text::json_path::many")]
    pub pth_imports: Vec<PathBuf>,
}

impl SysPath {
    pub fn of(interp: &Interpreter, launch: &Launch) -> SysPath {
        let mut entries: Vec<Entry> = Vec::new();
        let push = |entries: &mut Vec<Entry>, path: PathBuf, from: EntryFrom| {
            if !entries.iter().any(|e| e.path == path) {
                entries.push(Entry { path, from });
            }
        };
        if !launch.safe_path {
            push(&mut entries, launch.start.clone(), EntryFrom::Start);
        }
        for p in launch.pythonpath.iter().flat_map(|v| v.split(':')) {
            let p = launch.start.join(p);
            push(&mut entries, p, EntryFrom::PythonPath);
        }
        let base = launch
            .pythonhome
            .as_ref()
            .map(|h| PathBuf::from(h.split(':').next().unwrap_or(h)))
            .unwrap_or_else(|| interp.base_prefix.clone());
        if let Some((a, b)) = interp.version {
            let lib = base.join("lib");
            push(
                &mut entries,
                lib.join(format!("python{a}{b}.zip")),
                EntryFrom::Stdlib,
            );
            push(
                &mut entries,
                lib.join(format!("python{a}.{b}")),
                EntryFrom::Stdlib,
            );
            push(
                &mut entries,
                lib.join(format!("python{a}.{b}/lib-dynload")),
                EntryFrom::Stdlib,
            );
        }
        let mut pth_imports = Vec::new();
        let user_site = interp.system_site_packages && !launch.no_user_site;
        if user_site {
            if let (Some(base), Some((a, b))) = (
                launch
                    .user_base
                    .clone()
                    .or_else(|| launch.home.as_ref().map(|h| h.join(".local"))),
                interp.version,
            ) {
                let dir = base.join(format!("lib/python{a}.{b}/site-packages"));
                if dir.is_dir() {
                    push(&mut entries, dir.clone(), EntryFrom::UserSite);
                    add_pth(&dir, &mut entries, &mut pth_imports);
                }
            }
        }
        let mut sites = vec![interp.site.clone()];
        if interp.venv && interp.system_site_packages {
            if let Some((a, b)) = interp.version {
                sites.push(
                    interp
                        .base_prefix
                        .join(format!("lib/python{a}.{b}/site-packages")),
                );
            }
        }
        for dir in sites {
            if dir.is_dir() && !entries.iter().any(|e| e.path == dir) {
                push(&mut entries, dir.clone(), EntryFrom::Site);
                add_pth(&dir, &mut entries, &mut pth_imports);
            }
        }
        SysPath {
            entries,
            pth_imports,
        }
    }
}

/// `site.addsitedir`'s `.pth` reading: the files in name order, each line a directory
/// (relative to the site directory) added when it exists; `import` lines are code and
/// are only recorded.
fn add_pth(dir: &Path, entries: &mut Vec<Entry>, imports: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut names: Vec<_> = rd
        .flatten()
        .take(1 << 16)
        .map(|e| e.file_name())
        .filter(|n| {
            let n = n.to_string_lossy();
            n.ends_with(".pth") && !n.starts_with('.')
        })
        .take(MAX_PTH)
        .collect();
    names.sort();
    for n in names {
        let file = dir.join(&n);
        let Ok(Some(text)) = crate::fsread::read_text_following_if_present(&file, MAX_SMALL) else {
            continue;
        };
        for line in text.lines().take(MAX_PTH) {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            if line.starts_with("import ") || line.starts_with("import\t") {
                if !imports.contains(&file) {
                    imports.push(file.clone());
                }
                continue;
            }
            let p = dir.join(line.trim_end());
            if p.is_dir() && !entries.iter().any(|e| e.path == p) {
                entries.push(Entry {
                    path: p,
                    from: EntryFrom::Pth,
                });
            }
        }
    }
}

/// One library torch opens before libtorch: where, from which `sys.path` entry.
#[derive(Debug, Clone, Serialize)]
pub struct Opened {
    pub wanted: Wanted,
    /// The path as torch builds it and hands to `ctypes.CDLL` (relative when the entry is
    /// relative).
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub path: PathBuf,
    pub entry: Entry,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soname: Option<String>,
}

/// What torch's import opens before libtorch, for this interpreter and launch.
#[derive(Debug, Clone, Serialize)]
pub struct PythonProcess {
    pub interpreter: Interpreter,
    pub launch: Launch,
    pub sys_path: SysPath,
    pub loading: TorchLoading,
    /// Which path of `_load_global_deps` runs.
    pub path_taken: PathTaken,
    pub opened: Vec<Opened>,
    /// What makes the answer unknown, when something does.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unknown: Vec<String>,
    /// A required preload that is nowhere on `sys.path`: the import fails.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub import_fails: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PathTaken {
    /// `TORCH_USE_RTLD_GLOBAL`: no preloads.
    RtldGlobal,
    /// `libtorch_global_deps.so` loads, its condition (if any) holds.
    Normal,
    /// It loads, but the maps condition does not hold: nothing preloaded.
    NormalWithoutPreloads,
    /// It fails to load: the fallback preloads run.
    Fallback,
    /// torch preloads no NCCL.
    NoNccl,
}

impl PythonProcess {
    /// The model for the torch at `torch_dir` run by its interpreter in `launch`, with the
    /// loader's environment `env` (for laying out `libtorch_global_deps.so`).
    pub fn model(
        torch_dir: &Path,
        launch: Launch,
        env: &super::search::LoaderEnv,
    ) -> Result<Option<PythonProcess>> {
        let Some(interpreter) = Interpreter::of_torch(torch_dir) else {
            return Ok(None);
        };
        let loading = TorchLoading::read(torch_dir)?;
        let sys_path = SysPath::of(&interpreter, &launch);
        let mut p = PythonProcess {
            interpreter,
            launch,
            sys_path,
            loading,
            path_taken: PathTaken::NoNccl,
            opened: Vec::new(),
            unknown: Vec::new(),
            import_fails: None,
        };
        let (places, normal, fallback, cuda) = match &p.loading {
            TorchLoading::NoNccl { .. } => return Ok(Some(p)),
            TorchLoading::Unread { why, .. } => {
                p.unknown.push(format!("torch's __init__.py: {why}"));
                return Ok(Some(p));
            }
            TorchLoading::Preloads {
                places,
                normal,
                fallback,
                cuda,
                ..
            } => (
                places.clone(),
                normal.clone(),
                fallback.clone(),
                cuda.clone(),
            ),
        };
        if p.launch.torch_rtld_global {
            p.path_taken = PathTaken::RtldGlobal;
            return Ok(Some(p));
        }
        // libtorch_global_deps.so, dlopened by the interpreter: does its closure load, and
        // what does it map?
        let deps = torch_dir.join("lib/libtorch_global_deps.so");
        if !deps.is_file() {
            // ctypes raises an OSError naming no CUDA library: torch re-raises it.
            p.import_fails = Some(format!(
                "torch's import fails: {} is missing",
                deps.display()
            ));
            return Ok(Some(p));
        }
        let mut genv = env.clone();
        genv.cwd = p.launch.start.clone();
        genv.opened.clear();
        let map = super::map::load_as(&deps, &genv, super::map::TargetKind::Library)?;
        let preloads = if map.failures.is_empty() {
            let holds = normal.if_mapped.as_ref().is_none_or(|needle| {
                map.objects.iter().any(|o| {
                    let real = genv
                        .cwd
                        .join(&o.path)
                        .canonicalize()
                        .unwrap_or_else(|_| o.path.clone());
                    real.to_string_lossy().contains(needle.as_str())
                })
            });
            if holds {
                p.path_taken = PathTaken::Normal;
                normal.wanted
            } else {
                p.path_taken = PathTaken::NormalWithoutPreloads;
                Vec::new()
            }
        } else {
            p.path_taken = PathTaken::Fallback;
            fallback.wanted
        };
        let major = cuda
            .as_deref()
            .and_then(|c| c.split('.').next())
            .map(str::to_string);
        for w in preloads {
            match first_match(&p.sys_path, &places, &w, major.as_deref(), &p.launch.start) {
                Ok(Some((path, entry))) => {
                    let soname = Source::with_file(&p.launch.start.join(&path), |src| {
                        Ok(elf::parse(src)?.dynamic.soname)
                    })
                    .ok()
                    .flatten();
                    p.opened.push(Opened {
                        wanted: w,
                        path,
                        entry,
                        soname,
                    });
                }
                Ok(None) if w.required => {
                    // torch raises; on the normal path its `except Exception` swallows it
                    // and preloads nothing more.
                    if p.path_taken == PathTaken::Fallback {
                        p.import_fails = Some(format!(
                            "torch's import fails: {} is on no sys.path entry and libtorch_global_deps.so does not load without it",
                            w.pattern
                        ));
                    }
                    break;
                }
                Ok(None) => {}
                Err(why) => {
                    if w.is_nccl() {
                        p.unknown.push(why);
                    }
                }
            }
        }
        Ok(Some(p))
    }

    /// Why the process's answer is not the loader's: its import fails, or the model could
    /// not read what torch does; `None` when the loader's answer stands.
    pub fn unknown_reason(&self) -> Option<String> {
        self.unknown_answer().map(|u| u.to_string())
    }

    /// [`PythonProcess::unknown_reason`] as the loader model's unknown answer.
    pub fn unknown_answer(&self) -> Option<super::reason::Unknown> {
        let why = match &self.import_fails {
            Some(fails) => vec![fails.clone()],
            None if self.unknown.is_empty() => return None,
            None => self.unknown.clone(),
        };
        Some(super::reason::Unknown::Python { why })
    }

    /// The NCCL torch opens from `sys.path`, if it does.
    pub fn nccl(&self) -> Option<&Opened> {
        self.opened.iter().find(|o| o.wanted.is_nccl())
    }

    /// The loader environment of the process: `env` with torch's ctypes loads and the
    /// interpreter's DT_RPATH.
    pub fn loader_env(&self, env: &super::search::LoaderEnv) -> super::search::LoaderEnv {
        let mut env = env.clone();
        env.cwd = self.launch.start.clone();
        if let Some((rpath, origin)) = &self.interpreter.rpath {
            env.program_rpath = rpath.clone();
            env.program_origin = Some(origin.clone());
        }
        env.opened = self
            .opened
            .iter()
            .map(|o| super::search::OpenedFirst {
                // Absolute, so that fdl reads the file wherever it runs; the loader's
                // name for it may be relative, which changes no search.
                path: self.launch.start.join(&o.path),
                soname: o.soname.clone(),
                by: format!(
                    "torch/__init__.py opens it with ctypes from sys.path entry {} ({})",
                    o.entry.path.display(),
                    o.entry.from
                ),
            })
            .collect();
        env
    }

    /// One line: which process fdl answers for, and its assumption.
    pub fn summary(&self) -> String {
        let start = if self.launch.safe_path {
            "PYTHONSAFEPATH set, so no start directory on sys.path".to_string()
        } else if self.launch.start_assumed {
            format!(
                "started in {} (assumed; --cwd sets it)",
                self.launch.start.display()
            )
        } else {
            format!("started in {}", self.launch.start.display())
        };
        format!(
            "For a Python process: {} -c … importing torch, {start}",
            self.interpreter.program.display()
        )
    }
}

/// The first `sys.path` entry with a match of `w` in one of `places`: the path torch
/// builds and the entry. An entry with two different files matching is unknown: glob
/// returns them in the directory's order.
fn first_match(
    sys_path: &SysPath,
    places: &[Vec<Segment>],
    w: &Wanted,
    major: Option<&str>,
    cwd: &Path,
) -> std::result::Result<Option<(PathBuf, Entry)>, String> {
    for entry in &sys_path.entries {
        let mut found: Vec<PathBuf> = Vec::new();
        for place in places {
            let mut dir = entry_as_given(entry);
            let mut ok = true;
            for seg in place {
                match seg {
                    Segment::Literal(s) => dir.push(s),
                    Segment::Folder => dir.push(&w.folder),
                    Segment::CudaMajor(pre, post) => match major {
                        Some(m) => dir.push(format!("{pre}{m}{post}")),
                        None => ok = false,
                    },
                }
            }
            if !ok {
                continue;
            }
            let Ok(rd) = std::fs::read_dir(cwd.join(&dir)) else {
                continue;
            };
            let mut names: Vec<_> = rd
                .flatten()
                .take(1 << 16)
                .map(|e| e.file_name())
                .filter(|n| glob_match(&w.pattern, &n.to_string_lossy()))
                .collect();
            names.sort();
            found.extend(names.into_iter().map(|n| dir.join(n)));
        }
        if let Some(first) = found.first() {
            let first_id = super::map::search_id(&cwd.join(first));
            if found[1..]
                .iter()
                .any(|f| super::map::search_id(&cwd.join(f)) != first_id || first_id.is_none())
            {
                return Err(format!(
                    "{} matches {} files under sys.path entry {}, and torch takes the first its glob returns, in the directory's order",
                    w.pattern,
                    found.len(),
                    entry.path.display()
                ));
            }
            return Ok(Some((first.clone(), entry.clone())));
        }
    }
    Ok(None)
}

/// The entry as Python holds it: the start directory of `python -c` is `''`, so the paths
/// torch builds from it are relative.
fn entry_as_given(entry: &Entry) -> PathBuf {
    match entry.from {
        EntryFrom::Start => PathBuf::new(),
        _ => entry.path.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_like_fnmatch() {
        assert!(glob_match("libnccl.so.*[0-9]", "libnccl.so.2"));
        assert!(glob_match("libnccl.so.*[0-9]", "libnccl.so.2.30.7"));
        assert!(!glob_match("libnccl.so.*[0-9]", "libnccl.so"));
        assert!(!glob_match("libnccl.so.*[0-9]", "libnccl.so.2.bak"));
        assert!(glob_match("lib[!x]?.so", "liba1.so"));
        assert!(!glob_match("lib[!a]?.so", "liba1.so"));
        assert!(glob_match("libnvrtc.so.*[0-9].*[0-9]", "libnvrtc.so.12.8"));
        assert!(glob_match("*", "x") && !glob_match("*", ".x"));
        assert!(glob_match("a*b*c", "axxbyyc") && !glob_match("a*b*c", "axxbyy"));
        // Many stars against a long name that does not match: no blow-up.
        let hostile = format!("{}b", "*a".repeat(100));
        assert!(!glob_match(&hostile, &"a".repeat(1000)));
    }

    /// The shape of a torch 2.15 `__init__.py`'s loading, cut down.
    const SHAPE: &str = r#"
def _paths(path: str, lib_folder: str, lib_name: str) -> list[str]:
    a = glob.glob(os.path.join(path, "nvidia", lib_folder, "lib", lib_name))
    b = glob.glob(os.path.join(path, lib_folder, "lib", lib_name))
    return a + b

def _walk(lib_folder: str, lib_name: str, required: bool = True) -> None:
    for path in sys.path:
        found = _paths(path, lib_folder, lib_name)
        if found:
            ctypes.CDLL(found[0])
            return

def _preload_all(err=None, required=True):
    libs = [
        ("cublas", "libcublas.so.*[0-9]"),
        ("nccl", "libnccl.so.*[0-9]"),
    ]
    for lib_folder, lib_name in libs:
        _walk(lib_folder, lib_name, required=required)

def _load_global_deps() -> None:
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        try:
            if "libcudart.so" not in _maps:
                return
            _preload_all(required=False)
        except Exception:
            pass
    except OSError as err:
        _preload_all(err)
"#;

    #[test]
    fn reads_the_shape_and_survives_any_cut_of_it() {
        let TorchLoading::Preloads {
            places,
            normal,
            fallback,
            ..
        } = read_init(SHAPE, PathBuf::from("x"), None)
        else {
            panic!("not read");
        };
        assert_eq!(places.len(), 2);
        assert_eq!(normal.if_mapped.as_deref(), Some("libcudart.so"));
        assert_eq!(normal.wanted.len(), 2);
        assert!(normal.wanted.iter().all(|w| !w.required));
        assert!(fallback.wanted.iter().all(|w| w.required));
        assert!(matches!(
            read_init("import os\n", PathBuf::from("x"), None),
            TorchLoading::NoNccl { .. }
        ));
        assert!(matches!(
            read_init("X = 'libnccl.so.2'\n", PathBuf::from("x"), None),
            TorchLoading::Unread { .. }
        ));
        // Every prefix, and the text with any one line dropped: an answer, never a panic.
        for end in 0..SHAPE.len() {
            if SHAPE.is_char_boundary(end) {
                let _ = read_init(&SHAPE[..end], PathBuf::from("x"), None);
            }
        }
        let lines: Vec<&str> = SHAPE.lines().collect();
        for drop in 0..lines.len() {
            let mut l = lines.clone();
            l.remove(drop);
            let _ = read_init(&l.join("\n"), PathBuf::from("x"), None);
        }
    }

    #[test]
    fn reads_string_literals_and_args() {
        assert_eq!(
            string_literal("\"a\", 'b'"),
            Some(("a".to_string(), ", 'b'"))
        );
        assert_eq!(
            split_args("path, \"nvidia\", f\"cu{m}\", \"lib\", lib_name"),
            vec!["path", "\"nvidia\"", "f\"cu{m}\"", "\"lib\"", "lib_name"]
        );
        assert_eq!(
            version_cuda("cuda: Optional[str] = '13.2'\n"),
            Some("13.2".into())
        );
        assert_eq!(version_cuda("cuda = None\n"), None);
    }
}
