//! The layout ARCHITECTURE.md draws, held. The floors are crates, so Cargo already refuses
//! an import up a floor once each crate depends only on the crates below it: this checks
//! that the crates' dependencies (from `cargo metadata`) and their top-level modules are
//! the floors table's, and what Cargo cannot see: that no module of a crate imports one
//! that imports it back (directly or through others).
//!
//! Imports are read from the tokens of every file under a crate's `src/` (macro bodies included,
//! comments and `#[cfg(test)]` items not): every path that starts with `crate`, `super`,
//! `self` or the name of a child module, `use` trees expanded, resolved to the deepest
//! module it names. That is what `cargo modules dependencies --lib --acyclic` checks,
//! without a tool to install.

use proc_macro2::{Delimiter, TokenStream, TokenTree};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

fn name(m: &Module) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// Every module file under `src` (not the binary's `main.rs`), by module path.
fn module_files(src: &Path) -> BTreeMap<Module, PathBuf> {
    fn walk(dir: &Path, src: &Path, out: &mut BTreeMap<Module, PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, src, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(src).unwrap().with_extension("");
                let mut m: Module = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if m == ["main"] {
                    continue;
                }
                if matches!(m.last().map(String::as_str), Some("mod" | "lib")) {
                    m.pop();
                }
                out.insert(m, p);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, src, &mut out);
    out
}

/// A path as written: its segments, from the first.
type Written = Vec<String>;

/// The paths `tokens` write, with `#[cfg(test)]` items left out.
fn paths(tokens: TokenStream, out: &mut Vec<Written>) {
    let toks: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < toks.len() {
        // `#[cfg(test)] <item>`: skip to the end of the item (its body or its `;`).
        if let (TokenTree::Punct(p), Some(TokenTree::Group(g))) = (&toks[i], toks.get(i + 1)) {
            if p.as_char() == '#'
                && g.delimiter() == Delimiter::Bracket
                && g.stream().to_string().replace(' ', "") == "cfg(test)"
            {
                i += 2;
                while i < toks.len() {
                    match &toks[i] {
                        TokenTree::Group(g) if g.delimiter() == Delimiter::Brace => break,
                        TokenTree::Punct(p) if p.as_char() == ';' => break,
                        _ => i += 1,
                    }
                }
                i += 1;
                continue;
            }
        }
        // `mod child;` declares a module: it owns it, it does not use it.
        if let (TokenTree::Ident(id), Some(TokenTree::Ident(_))) = (&toks[i], toks.get(i + 1)) {
            if id == "mod" {
                i += 2;
                continue;
            }
        }
        // `pub(super)`, `pub(crate)`, `pub(in path)` say who may see an item: no import.
        if let (TokenTree::Ident(id), Some(TokenTree::Group(g))) = (&toks[i], toks.get(i + 1)) {
            if id == "pub" && g.delimiter() == Delimiter::Parenthesis {
                i += 2;
                continue;
            }
        }
        match &toks[i] {
            TokenTree::Group(g) => {
                paths(g.stream(), out);
                i += 1;
            }
            TokenTree::Ident(id) => {
                // A path starts at an identifier not itself after `::`.
                let after_colons = i >= 2
                    && matches!(&toks[i - 1], TokenTree::Punct(p) if p.as_char() == ':')
                    && matches!(&toks[i - 2], TokenTree::Punct(p) if p.as_char() == ':');
                if after_colons {
                    i += 1;
                    continue;
                }
                i = read_path(&toks, i, vec![id.to_string()], out);
            }
            _ => i += 1,
        }
    }
}

/// Reads `:: seg` after `toks[at]`, with `prefix` already read; `::{ … }` expands each
/// branch of a `use` tree. Returns the index after the path.
fn read_path(toks: &[TokenTree], at: usize, prefix: Written, out: &mut Vec<Written>) -> usize {
    let mut path = prefix;
    let mut i = at + 1;
    loop {
        let colons = matches!(toks.get(i), Some(TokenTree::Punct(p)) if p.as_char() == ':')
            && matches!(toks.get(i + 1), Some(TokenTree::Punct(p)) if p.as_char() == ':');
        if !colons {
            break;
        }
        match toks.get(i + 2) {
            Some(TokenTree::Ident(id)) => {
                path.push(id.to_string());
                i += 3;
            }
            Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Brace => {
                let inner: Vec<TokenTree> = g.stream().into_iter().collect();
                for branch in
                    inner.split(|t| matches!(t, TokenTree::Punct(p) if p.as_char() == ','))
                {
                    if let Some(TokenTree::Ident(first)) = branch.first() {
                        let mut p = path.clone();
                        if first != "self" {
                            p.push(first.to_string());
                        }
                        read_path(branch, 0, p, out);
                    } else {
                        // `*` or an empty branch: the path so far.
                        out.push(path.clone());
                    }
                }
                return i + 3;
            }
            _ => {
                i += 2;
                break;
            }
        }
    }
    out.push(path);
    i
}

/// The module a written path in module `from` names, if it names one of `modules`.
fn resolve(from: &Module, written: &Written, modules: &BTreeSet<Module>) -> Option<Module> {
    let mut base: Module;
    let mut rest = written.as_slice();
    match rest.first()?.as_str() {
        "crate" => {
            base = Vec::new();
            rest = &rest[1..];
        }
        "super" => {
            base = from.clone();
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        "self" => {
            base = from.clone();
            rest = &rest[1..];
        }
        child => {
            // A child module of `from`, named relatively.
            let mut m = from.clone();
            m.push(child.to_string());
            if !modules.contains(&m) {
                return None;
            }
            base = from.clone();
        }
    }
    // `super` and `self` name a module themselves.
    let mut deepest = Some(base.clone());
    for seg in rest {
        base.push(seg.clone());
        if modules.contains(&base) {
            deepest = Some(base.clone());
        } else {
            break;
        }
    }
    deepest
}

/// Edges `from → to` between distinct modules, with one place each was seen.
fn imports(files: &BTreeMap<Module, PathBuf>) -> BTreeMap<Module, BTreeSet<Module>> {
    let modules: BTreeSet<Module> = files.keys().cloned().collect();
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (m, path) in files {
        let text = std::fs::read_to_string(path).unwrap();
        let tokens: TokenStream = text
            .parse()
            .unwrap_or_else(|e| panic!("{} does not tokenize: {e:?}", path.display()));
        let mut written = Vec::new();
        paths(tokens, &mut written);
        let to: BTreeSet<Module> = written
            .iter()
            .filter_map(|w| resolve(m, w, &modules))
            .filter(|t| t != m && !t.is_empty())
            .collect();
        edges.insert(m.clone(), to);
    }
    edges
}

/// One cycle of `edges`, if there is any, as the modules along it (first = last).
fn a_cycle(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        m: &Module,
        edges: &BTreeMap<Module, BTreeSet<Module>>,
        marks: &mut BTreeMap<Module, Mark>,
        stack: &mut Vec<Module>,
    ) -> Option<Vec<Module>> {
        match marks.get(m) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let at = stack.iter().position(|s| s == m).unwrap();
                let mut cycle = stack[at..].to_vec();
                cycle.push(m.clone());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(m.clone(), Mark::Open);
        stack.push(m.clone());
        for to in edges.get(m).into_iter().flatten() {
            if let Some(c) = visit(to, edges, marks, stack) {
                return Some(c);
            }
        }
        stack.pop();
        marks.insert(m.clone(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for m in edges.keys() {
        if let Some(c) = visit(m, edges, &mut marks, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

/// One row of the floors table of ARCHITECTURE.md.
#[derive(Debug, Clone, PartialEq)]
struct Floor {
    floor: u32,
    krate: String,
    modules: BTreeSet<String>,
}

/// The floors table of ARCHITECTURE.md, a row per crate.
fn floors(doc: &str) -> Vec<Floor> {
    let table = doc
        .split("<!-- floors:")
        .nth(1)
        .expect("ARCHITECTURE.md has a `<!-- floors: … -->` table");
    let mut out: Vec<Floor> = Vec::new();
    for line in table.lines().skip(1) {
        let line = line.trim();
        if !line.starts_with('|') {
            if out.is_empty() {
                continue;
            }
            break;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let Ok(floor) = cells[0].parse::<u32>() else {
            continue; // the header and its rule
        };
        let unquote = |c: &str| c.trim().trim_matches('`').to_string();
        let row = Floor {
            floor,
            krate: unquote(cells[1]),
            modules: cells[2].split(',').map(unquote).collect(),
        };
        for m in &row.modules {
            assert!(
                !out.iter().any(|f| f.modules.contains(m)),
                "ARCHITECTURE.md places {m} on two floors"
            );
        }
        out.push(row);
    }
    out
}

/// A workspace crate as Cargo sees it: its name, its `src/` and the workspace crates it
/// depends on for its library (dev-dependencies are not edges of the product).
#[derive(Debug, Clone)]
struct Krate {
    name: String,
    src: PathBuf,
    depends_on: BTreeSet<String>,
}

/// The workspace's crates, from `cargo metadata`.
fn workspace() -> Vec<Krate> {
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = meta["packages"].as_array().unwrap();
    let names: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    packages
        .iter()
        .map(|p| {
            let manifest = PathBuf::from(p["manifest_path"].as_str().unwrap());
            Krate {
                name: p["name"].as_str().unwrap().to_string(),
                src: manifest.parent().unwrap().join("src"),
                depends_on: p["dependencies"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|d| d["kind"].is_null())
                    .map(|d| d["name"].as_str().unwrap().to_string())
                    .filter(|d| names.contains(d))
                    .collect(),
            }
        })
        .collect()
}

/// The dev-only crate of test and benchmark inputs: in the workspace, on no floor, and no
/// floor's crate may depend on it.
const DEV_ONLY: &str = "fdl-synth";

/// Everything wrong with `crates` against `floors`, one line each.
fn violations(crates: &[Krate], floors: &[Floor]) -> Vec<String> {
    let mut wrong = Vec::new();
    let floor_of = |c: &str| floors.iter().find(|f| f.krate == c).map(|f| f.floor);
    for k in crates {
        if k.name == DEV_ONLY {
            continue;
        }
        let Some(f) = floor_of(&k.name) else {
            wrong.push(format!(
                "the crate {} is on no floor: add it to the floors table of ARCHITECTURE.md",
                k.name
            ));
            continue;
        };
        for d in &k.depends_on {
            match floor_of(d) {
                Some(t) if t < f => {}
                Some(t) => wrong.push(format!(
                    "{} (floor {f}) depends on {d} (floor {t}): a crate depends only on the floors below it",
                    k.name
                )),
                None => wrong.push(format!(
                    "{} (floor {f}) depends on {d}, which is on no floor",
                    k.name
                )),
            }
        }
        let files = module_files(&k.src);
        let top: BTreeSet<String> = files
            .keys()
            .filter(|m| m.len() == 1)
            .map(|m| m[0].clone())
            .collect();
        let row = floors.iter().find(|r| r.krate == k.name).unwrap();
        for m in top.difference(&row.modules) {
            wrong.push(format!(
                "{}/{m} is on no floor: add it to {}'s row of the floors table in ARCHITECTURE.md",
                k.name, k.name
            ));
        }
        for m in row.modules.difference(&top) {
            wrong.push(format!(
                "ARCHITECTURE.md places {m} in {}, which has no such module",
                k.name
            ));
        }
        if let Some(cycle) = a_cycle(&imports(&files)) {
            let names: Vec<String> = cycle.iter().map(name).collect();
            wrong.push(format!(
                "a module cycle in {}: {}",
                k.name,
                names.join(" → ")
            ));
        }
    }
    for row in floors {
        if !crates.iter().any(|k| k.name == row.krate) {
            wrong.push(format!(
                "ARCHITECTURE.md names the crate {}, which the workspace lacks",
                row.krate
            ));
        }
    }
    wrong
}

#[test]
fn the_floors_are_crates_and_each_is_one_straight_line() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let floors = floors(&doc);
    assert!(floors.len() >= 7, "the floors table lists {floors:?}");
    let crates = workspace();
    assert!(crates.len() >= 8, "cargo metadata lists {crates:?}");
    let wrong = violations(&crates, &floors);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The check itself finds what it is for: a cycle through `super`, a `use` tree and a
/// macro body; a dependency up a floor; a crate or a module on no floor. And a
/// `#[cfg(test)]` import is no edge.
#[test]
fn the_check_finds_cycles_and_dependencies_up_a_floor() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("high/src");
    let write = |p: &str, text: &str| {
        let p = src.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("lib.rs", "pub mod a;\npub mod b;\n");
    write(
        "a/mod.rs",
        "pub mod x;\npub use x::X;\n#[cfg(test)]\nmod tests { use crate::b::B; }\n",
    );
    write("a/x.rs", "pub struct X;\n");
    write(
        "b.rs",
        "use crate::a::{self, x::X};\npub struct B;\npub(super) fn g() {}\n",
    );
    let low = Krate {
        name: "low".into(),
        src: t.path().join("low/src"),
        depends_on: BTreeSet::new(),
    };
    std::fs::create_dir_all(&low.src).unwrap();
    std::fs::write(low.src.join("lib.rs"), "pub mod l;\n").unwrap();
    std::fs::write(low.src.join("l.rs"), "").unwrap();
    let high = Krate {
        name: "high".into(),
        src: src.clone(),
        depends_on: BTreeSet::from(["low".to_string()]),
    };
    let floors = vec![
        Floor {
            floor: 0,
            krate: "low".into(),
            modules: BTreeSet::from(["l".to_string()]),
        },
        Floor {
            floor: 1,
            krate: "high".into(),
            modules: BTreeSet::from(["a".to_string(), "b".to_string()]),
        },
    ];
    let crates = vec![low.clone(), high.clone()];
    assert_eq!(violations(&crates, &floors), Vec::<String>::new());

    // x.rs reaches its parent through `super`, which reaches x.rs back.
    write("a/x.rs", "pub struct X;\nfn f() { let _ = super::X; }\n");
    let found = violations(&crates, &floors);
    assert!(
        found
            .iter()
            .any(|w| w.starts_with("a module cycle in high:") && w.contains("a::x")),
        "{found:?}"
    );
    // Between top-level modules, inside a macro's arguments.
    write(
        "a/x.rs",
        "pub struct X;\nfn f() { println!(\"{}\", crate::b::B); }\n",
    );
    let found = violations(&crates, &floors);
    assert!(
        found
            .iter()
            .any(|w| w.starts_with("a module cycle in high:")),
        "{found:?}"
    );
    write("a/x.rs", "pub struct X;\n");

    // A dependency up a floor.
    let mut low_up = low.clone();
    low_up.depends_on.insert("high".into());
    let found = violations(&[low_up, high.clone()], &floors);
    assert!(
        found
            .iter()
            .any(|w| w.contains("low (floor 0) depends on high (floor 1)")),
        "{found:?}"
    );

    // A new top-level module, and a new crate, must be placed.
    write("lib.rs", "pub mod a;\npub mod b;\npub mod new;\n");
    write("new.rs", "");
    let stray = Krate {
        name: "stray".into(),
        src: t.path().join("stray/src"),
        depends_on: BTreeSet::new(),
    };
    std::fs::create_dir_all(&stray.src).unwrap();
    std::fs::write(stray.src.join("lib.rs"), "").unwrap();
    let found = violations(&[low, high, stray], &floors);
    assert!(
        found.iter().any(|w| w.contains("high/new is on no floor")),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|w| w.contains("the crate stray is on no floor")),
        "{found:?}"
    );
}
