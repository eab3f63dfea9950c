//! The examples README.md and docs/*.md show are fdl's real output.
//!
//! An example is a fenced block (```` ``` ```` or ```` ```console ````) right after a
//! line `<!-- example: NAME -->`: `$ ` lines are commands (a line ending in `\` goes on
//! with the next), the lines up to the next `$ ` line their output (stdout and stderr
//! together, in the order fdl wrote them). Each block runs as one bash script, in a fresh
//! fixture (see [`Fixture`]): a HOME of its own, shown as `/home/me`, a project at
//! `/home/me/proj` (the working directory), pip layouts of the oracle torch wheels, a
//! stand-in `nvidia-smi` first on PATH and the built `fdl` beside it. In the docs, `…`
//! matches any text within a line, and a line holding only `…` any number of lines.
//!
//! Every block with a `$ fdl` line must be marked, so no example can escape the check;
//! the only exceptions are [`TRANSCRIPTS`], named one by one with what they need.

use crate::common;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Blocks showing `$ fdl` lines that this test does not run, each with why. Marked
/// `<!-- transcript: NAME -->`; any other unmarked block fails
/// [`every_block_with_an_fdl_command_is_an_example`].
const TRANSCRIPTS: &[(&str, &str)] = &[];

/// The GPUs the stand-in `nvidia-smi` reports, in its CSV format.
const GPUS: &str =
    "0, NVIDIA GeForce RTX 3090, 8.6, 24576\n1, NVIDIA GeForce RTX 5060 Ti, 12.0, 16311\n";

#[derive(Debug)]
struct Example {
    file: String,
    line: usize,
    name: String,
    /// (command, expected output lines)
    steps: Vec<(String, Vec<String>)>,
}

fn doc_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// Every fenced block of `text`: (line of its fence, info string, body lines, the
/// nearest non-empty line before the fence).
fn blocks(text: &str) -> Vec<(usize, String, Vec<String>, String)> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        if let Some(info) = lines[i].strip_prefix("```") {
            let start = i;
            let before = lines[..i]
                .iter()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or(&"")
                .to_string();
            let mut body = Vec::new();
            i += 1;
            while i < lines.len() && !lines[i].starts_with("```") {
                body.push(lines[i].to_string());
                i += 1;
            }
            out.push((start + 1, info.trim().to_string(), body, before));
        }
        i += 1;
    }
    out
}

fn is_fdl_command(line: &str) -> bool {
    line.starts_with("$ ") && line[2..].split_whitespace().any(|w| w == "fdl")
}

/// (marked examples, marked transcripts, unmarked blocks with an fdl command)
fn collect() -> (Vec<Example>, Vec<(String, String)>, Vec<String>) {
    let (mut examples, mut transcripts, mut unmarked) = (Vec::new(), Vec::new(), Vec::new());
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let rel = file
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap()
            .display()
            .to_string();
        for (line, info, body, before) in blocks(&text) {
            let console = info.is_empty() || info == "console";
            let marker = |kind: &str| {
                before
                    .trim()
                    .strip_prefix(&format!("<!-- {kind}: "))
                    .and_then(|r| r.strip_suffix(" -->"))
                    .map(str::to_string)
            };
            if let Some(name) = marker("transcript") {
                transcripts.push((rel.clone(), name));
                continue;
            }
            let Some(name) = marker("example") else {
                if console && body.iter().any(|l| is_fdl_command(l)) {
                    unmarked.push(format!("{rel}:{line}"));
                }
                continue;
            };
            assert!(
                console,
                "{rel}:{line}: example {name} is not a ``` or ```console block"
            );
            let mut steps: Vec<(String, Vec<String>)> = Vec::new();
            let mut lines = body.into_iter();
            while let Some(l) = lines.next() {
                if let Some(cmd) = l.strip_prefix("$ ") {
                    let mut cmd = cmd.to_string();
                    while cmd.ends_with('\\') {
                        cmd.pop();
                        let next = lines.next().unwrap_or_default();
                        cmd.push(' ');
                        cmd.push_str(next.trim_start());
                    }
                    steps.push((cmd, Vec::new()));
                } else {
                    let (_, out) = steps.last_mut().unwrap_or_else(|| {
                        panic!("{rel}:{line}: example {name} does not start with a `$ ` line")
                    });
                    out.push(l);
                }
            }
            examples.push(Example {
                file: rel.clone(),
                line,
                name,
                steps,
            });
        }
    }
    (examples, transcripts, unmarked)
}

#[test]
fn every_block_with_an_fdl_command_is_an_example() {
    let (examples, transcripts, unmarked) = collect();
    assert!(
        unmarked.is_empty(),
        "blocks that show `$ fdl` but are not marked `<!-- example: NAME -->` (so tests/it/doc_examples.rs would not run them): {unmarked:?}"
    );
    assert!(examples.len() >= 10, "too few examples: {examples:?}");
    let mut names: Vec<&str> = examples.iter().map(|e| e.name.as_str()).collect();
    names.sort();
    let before = names.len();
    names.dedup();
    assert_eq!(before, names.len(), "two examples share a name: {names:?}");
    let mut marked: Vec<&str> = transcripts.iter().map(|(_, n)| n.as_str()).collect();
    marked.sort();
    let mut known: Vec<&str> = TRANSCRIPTS.iter().map(|(n, _)| *n).collect();
    known.sort();
    assert_eq!(
        marked, known,
        "the `<!-- transcript: NAME -->` blocks must be exactly the ones TRANSCRIPTS names, with why"
    );
}

/// The matcher itself: `…` within a line, a `…` line for any lines, and a mismatch found.
#[test]
fn the_matcher_takes_placeholders_and_finds_differences() {
    let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert!(matches(&v(&["a …", "…", "z"]), &v(&["a 1", "b", "c", "z"])));
    assert!(matches(&v(&["a …", "…", "z"]), &v(&["a 1", "z"])));
    assert!(matches(&v(&["x … y … z"]), &v(&["x 1 y 22 z"])));
    assert!(!matches(&v(&["a …", "z"]), &v(&["a 1", "b", "z"])));
    assert!(!matches(&v(&["a"]), &v(&["a", "b"])));
    assert!(!matches(&v(&["x … y"]), &v(&["x 1 z"])));
    // A line broken elsewhere matches once both are unwrapped; other words never do.
    let (want, got) = (v(&["a b c", "  d …"]), v(&["a b", "  c d e"]));
    assert!(!matches(&want, &got) && matches(&unwrapped(&want), &unwrapped(&got)));
    assert!(!matches(
        &unwrapped(&v(&["a b"])),
        &unwrapped(&v(&["a", "c"]))
    ));
}

/// Whether one line matches its pattern: `…` stands for any text.
fn line_matches(pattern: &str, line: &str) -> bool {
    let parts: Vec<&str> = pattern.split('…').collect();
    if parts.len() == 1 {
        return pattern == line;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !line.starts_with(first) || line.len() < first.len() + last.len() || !line.ends_with(last) {
        return false;
    }
    let mut rest = &line[first.len()..line.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

/// Whether `got` matches `want`, where a line holding only `…` matches any lines.
fn matches(want: &[String], got: &[String]) -> bool {
    match want.first() {
        None => got.is_empty(),
        Some(w) if w.trim() == "…" => (0..=got.len()).any(|k| matches(&want[1..], &got[k..])),
        Some(w) => !got.is_empty() && line_matches(w, &got[0]) && matches(&want[1..], &got[1..]),
    }
}

/// `lines` as one line, every run of white space one space: fdl wraps prose at 100
/// columns, and a path of the test's machine (`<base>/home/me/…`) is longer than the
/// `/home/me/…` the docs show, so a line may break elsewhere there; the words must match.
fn unwrapped(lines: &[String]) -> Vec<String> {
    vec![lines
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")]
}

/// A fresh machine for one example, under a temporary directory `base` that every path
/// of its output is shown without (so `<base>/home/me` reads `/home/me`):
/// * `~/proj`, the project (it has `fdl.yml`), the working directory;
/// * `~/site-packages`: torch 2.15.0 (CUDA 13.2) as pip installs it, beside the
///   `nvidia-nccl-cu13` 2.30.7 it requires, from the oracle wheels;
/// * `~/torch-2.8/site-packages`: the same for torch 2.8.0 and `nvidia-nccl-cu12` 2.27.5;
///   in both, torch's other libraries (cuDNN, cuBLAS, libc10…, which the oracle cache does
///   not hold) are empty stand-ins of their sonames, which define no function, so the
///   link map is whole as on a real install and the answer is the same;
/// * `~/.cache/fdl-wheels`: the oracle cache (`$FDL_ORACLE_CACHE`), its real path shown
///   as this one;
/// * `~/src/nccl-2.30.7-1` and `~/src/nccl-2.27.5-1`: stand-in NCCL trees made by the
///   README's command (`cargo run --example standin-nccl`, tests/native_fixture) that
///   build in a second where NVIDIA's take tens of minutes;
/// * on PATH first: a stand-in `nvidia-smi` reporting [`GPUS`] (its banner: driver
///   580.95.05, CUDA 13.0), and the built `fdl`.
struct Fixture {
    base: tempfile::TempDir,
    oracle_cache: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let torch13 = oracle_input("FDL_TEST_TORCH_LIB_CU13");
        let torch12 = oracle_input("FDL_TEST_TORCH_LIB");
        let cuda_home = oracle_input("FDL_TEST_CUDA_HOME");
        // The toolkit the native examples build with, in the same cache (the nvcc-only
        // home above is the one the plan refuses).
        oracle_input("FDL_TEST_CUDA_HOME_NEWEST");
        // The venv docs/inspect.md's Python example asks about, under the same cache.
        oracle_input("FDL_TEST_TORCH_VENV");
        // <cache>/unpacked/nvcc-13.0.88/nvidia/cu13
        let oracle_cache = cuda_home.ancestors().nth(4).unwrap().to_path_buf();
        assert!(
            oracle_cache.join("unpacked").is_dir(),
            "{} is not the oracle cache",
            oracle_cache.display()
        );
        let base = tempfile::tempdir().unwrap();
        let home = base.path().join("home/me");
        std::fs::create_dir_all(home.join("proj")).unwrap();
        std::fs::write(home.join("proj/fdl.yml"), "").unwrap();
        std::fs::create_dir_all(home.join(".cache")).unwrap();
        std::os::unix::fs::symlink(&oracle_cache, home.join(".cache/fdl-wheels")).unwrap();
        pip_layout(&torch13, &home.join("site-packages"));
        pip_layout(&torch12, &home.join("torch-2.8/site-packages"));
        // As the README says a user makes one: the example program.
        std::fs::create_dir_all(home.join("src")).unwrap();
        standin_example(&home.join("src/nccl-2.30.7-1"), "2.30.7", &torch13);
        standin_example(&home.join("src/nccl-2.27.5-1"), "2.27.5", &torch12);
        let bin = home.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_fdl"), bin.join("fdl")).unwrap();
        let smi = fake_nvidia_smi(GPUS, 0);
        std::fs::copy(smi.path().join("nvidia-smi"), bin.join("nvidia-smi")).unwrap();
        Fixture { base, oracle_cache }
    }

    fn home(&self) -> PathBuf {
        self.base.path().join("home/me")
    }

    /// Runs the example's commands as one bash script; each command's output, as shown.
    fn run(&self, ex: &Example) -> Vec<Vec<String>> {
        let mut script = String::from("cd ~/proj\n");
        for (i, (cmd, _)) in ex.steps.iter().enumerate() {
            script.push_str(&format!("printf '\\036{i}\\n'\n{{ {cmd}\n}} 2>&1\n"));
        }
        let home = self.home();
        let path = format!(
            "{}:{}",
            home.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(&script)
            .env_clear()
            .env("HOME", &home)
            .env("PATH", path)
            .env("LANG", "C.UTF-8")
            .env("NO_COLOR", "1")
            .current_dir(&home)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let text = text
            .replace(
                &self.oracle_cache.display().to_string(),
                "/home/me/.cache/fdl-wheels",
            )
            .replace(&self.base.path().display().to_string(), "");
        let mut parts: Vec<Vec<String>> = text
            .split('\u{1e}')
            .skip(1)
            .map(|p| {
                let p = p.split_once('\n').map(|(_, r)| r).unwrap_or("");
                p.lines().map(|l| l.trim_end().to_string()).collect()
            })
            .collect();
        parts.resize(ex.steps.len(), Vec::new());
        parts
    }
}

/// `cargo run --example standin-nccl -- DIR VERSION TORCH_LIB`, the README's command for
/// the tour's NCCL tree, run as cargo built it for this test run (`cargo test` builds the
/// examples before it runs any test).
fn standin_example(dir: &Path, version: &str, torch_lib: &Path) {
    let me = std::env::current_exe().unwrap();
    let example = me
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("examples/standin-nccl");
    assert!(
        example.is_file(),
        "{} is missing: build the examples (`cargo test` does; `cargo build --examples`)",
        example.display()
    );
    let out = std::process::Command::new(&example)
        .arg(dir)
        .arg(version)
        .arg(torch_lib)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        example.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Lays out `site` as pip installs torch: `torch/lib/libtorch_cuda.so`, `torch/version.py`,
/// `nvidia/nccl/lib/libnccl.so.2` and the NCCL wheel's dist-info, from the oracle wheel
/// unpacked around `torch_lib` (hard links where they can be, else copies), and an empty
/// stand-in for every other library torch needs that the system does not have.
fn pip_layout(torch_lib: &Path, site: &Path) {
    let unpacked = torch_lib.ancestors().nth(3).unwrap();
    let link = |from: &Path, to: &Path| {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        if std::fs::hard_link(from, to).is_err() {
            std::fs::copy(from, to).unwrap();
        }
    };
    for rel in [
        "torch/lib/libtorch_cuda.so",
        "torch/version.py",
        "nvidia/nccl/lib/libnccl.so.2",
    ] {
        let from = unpacked.join(rel);
        if from.exists() {
            link(&from, &site.join(rel));
        }
    }
    assert!(
        site.join("nvidia/nccl/lib/libnccl.so.2").is_file(),
        "{}: the oracle cache lacks the NCCL wheel beside torch",
        unpacked.display()
    );
    for entry in std::fs::read_dir(unpacked).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".dist-info") {
            let dir = site.join(&name);
            std::fs::create_dir_all(&dir).unwrap();
            for f in std::fs::read_dir(entry.path()).unwrap() {
                let f = f.unwrap();
                if f.file_type().unwrap().is_file() {
                    std::fs::copy(f.path(), dir.join(f.file_name())).unwrap();
                }
            }
        }
    }
    // torch's other libraries: found through its DT_RPATH's $ORIGIN, as the real ones
    // are in torch/lib (libc10.so …) or by the same RPATH in nvidia/*/lib.
    let lib = site.join("torch/lib/libtorch_cuda.so");
    let stubs = stubs_for_missing(&lib);
    for entry in std::fs::read_dir(stubs.path()).unwrap() {
        let entry = entry.unwrap();
        let to = site.join("torch/lib").join(entry.file_name());
        std::fs::copy(entry.path(), &to).unwrap();
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

#[test]
#[ignore = "needs the real NVIDIA inputs of `source .ci/setup`: `cargo test -- --include-ignored`"]
fn the_docs_examples_are_real_output() {
    let (examples, _, _) = collect();
    let only = std::env::var("FDL_DOC_EXAMPLE").ok();
    let mut failures = Vec::new();
    let mut ran = 0;
    for ex in examples
        .iter()
        .filter(|e| only.as_ref().is_none_or(|o| *o == e.name))
    {
        let fixture = Fixture::new();
        let got = fixture.run(ex);
        ran += 1;
        for ((cmd, want), got) in ex.steps.iter().zip(&got) {
            if !matches(want, got) && !matches(&unwrapped(want), &unwrapped(got)) {
                failures.push(format!(
                    "{}:{} example {}: `$ {cmd}` printed:\n{}\n--- where the docs show:\n{}\n",
                    ex.file,
                    ex.line,
                    ex.name,
                    got.join("\n"),
                    want.join("\n")
                ));
            }
        }
    }
    assert!(ran > 0, "no example ran (FDL_DOC_EXAMPLE={only:?})");
    assert!(
        failures.is_empty(),
        "{} of the examples' commands differ:\n\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces
/// as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (outside fenced blocks).
fn anchors(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.push(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// Every relative link of README.md and docs/*.md names a file that exists, and every
/// `#anchor` a heading of the page it points at.
#[test]
fn every_internal_link_resolves() {
    assert_eq!(
        anchor("Which NCCL a process runs: how fdl decides"),
        "which-nccl-a-process-runs-how-fdl-decides"
    );
    let mut broken = Vec::new();
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let dir = file.parent().unwrap();
        for (_, target) in text.match_indices("](").map(|(i, _)| {
            let rest = &text[i + 2..];
            (i, &rest[..rest.find(')').unwrap_or(rest.len())])
        }) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, frag) = target.split_once('#').unwrap_or((target, ""));
            let page = if path.is_empty() {
                file.clone()
            } else {
                dir.join(path)
            };
            if !page.exists() {
                broken.push(format!("{}: {target}: no such file", file.display()));
                continue;
            }
            if !frag.is_empty() {
                let text = std::fs::read_to_string(&page).unwrap();
                if !anchors(&text).iter().any(|a| a == frag) {
                    broken.push(format!("{}: {target}: no such heading", file.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links: {broken:#?}");
}
