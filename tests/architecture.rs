//! The layout ARCHITECTURE.md draws, held: no file of the library imports one that
//! imports it back (directly or through others), and each top-level module imports only
//! from its own floor or below, as the floors table there says.
//!
//! Imports are read from the tokens of every file under `src/` (macro bodies included,
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

/// The floors table of ARCHITECTURE.md: top-level module → floor.
fn floors(doc: &str) -> BTreeMap<String, u32> {
    let table = doc
        .split("<!-- floors:")
        .nth(1)
        .expect("ARCHITECTURE.md has a `<!-- floors: … -->` table");
    let mut out = BTreeMap::new();
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
        for module in cells[1].split(',') {
            let module = module.trim().trim_matches('`').to_string();
            assert!(
                out.insert(module.clone(), floor).is_none(),
                "ARCHITECTURE.md places {module} on two floors"
            );
        }
    }
    out
}

/// Everything wrong with the tree at `src` against `floors`, one line each.
fn violations(src: &Path, floors: &BTreeMap<String, u32>) -> Vec<String> {
    let files = module_files(src);
    let edges = imports(&files);
    let mut wrong = Vec::new();
    if let Some(cycle) = a_cycle(&edges) {
        let names: Vec<String> = cycle.iter().map(name).collect();
        wrong.push(format!("a module cycle: {}", names.join(" → ")));
    }
    let floor_of = |m: &Module| m.first().and_then(|top| floors.get(top).copied());
    for m in files.keys().filter(|m| m.len() == 1) {
        if floor_of(m).is_none() {
            wrong.push(format!(
                "src/{} is on no floor: add it to the floors table of ARCHITECTURE.md",
                m[0]
            ));
        }
    }
    for (from, tos) in &edges {
        for to in tos {
            if let (Some(f), Some(t)) = (floor_of(from), floor_of(to)) {
                if t > f {
                    wrong.push(format!(
                        "{} (floor {f}) imports {} (floor {t}): a module imports only from its floor or below",
                        name(from),
                        name(to)
                    ));
                }
            }
        }
    }
    wrong
}

#[test]
fn the_library_is_one_straight_line() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let floors = floors(&doc);
    assert!(floors.len() >= 10, "the floors table lists {floors:?}");
    let wrong = violations(&root.join("src"), &floors);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The check itself finds what it is for: a cycle through `super`, a `use` tree and a
/// macro body; an import up a floor; a module on no floor. And a `#[cfg(test)]` import
/// is no edge.
#[test]
fn the_check_finds_cycles_and_imports_up_a_floor() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path();
    let write = |p: &str, text: &str| {
        let p = src.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("lib.rs", "pub mod low;\npub mod high;\n");
    write(
        "low/mod.rs",
        "pub mod a;\npub use a::A;\n#[cfg(test)]\nmod tests { use crate::high::H; }\n",
    );
    write("low/a.rs", "pub struct A;\n");
    write(
        "high.rs",
        "use crate::low::{self, a::A};\npub struct H;\npub(super) fn g() {}\n",
    );
    let floors = BTreeMap::from([("low".to_string(), 0), ("high".to_string(), 1)]);
    assert_eq!(violations(src, &floors), Vec::<String>::new());

    // a.rs reaches its parent through `super`, which reaches a.rs back.
    write("low/a.rs", "pub struct A;\nfn f() { let _ = super::A; }\n");
    let found = violations(src, &floors);
    assert!(
        found
            .iter()
            .any(|w| w.starts_with("a module cycle:") && w.contains("low::a")),
        "{found:?}"
    );

    // Up a floor, inside a macro's arguments.
    write(
        "low/a.rs",
        "pub struct A;\nfn f() { println!(\"{}\", crate::high::H); }\n",
    );
    let found = violations(src, &floors);
    assert!(
        found
            .iter()
            .any(|w| w.contains("low::a (floor 0) imports high (floor 1)")),
        "{found:?}"
    );

    // A new top-level module must be placed.
    write("low/a.rs", "pub struct A;\n");
    write("lib.rs", "pub mod low;\npub mod high;\npub mod new;\n");
    write("new.rs", "");
    let found = violations(src, &floors);
    assert!(
        found.iter().any(|w| w.contains("src/new is on no floor")),
        "{found:?}"
    );
}
