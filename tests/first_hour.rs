//! The new user's first hour, as a test (issue 29): a fresh `HOME`, the README's main
//! command (read from README.md as `.ci/run` reads it), `fdl libtorch add` of the torch
//! 2.15 wheel the setup downloads, then `nccl build --dry-run` → `nccl env` →
//! `nccl detect`. Every step exits as documented, and every message is one a new user
//! can act on: no doubled period, no control character, no line over 200 characters
//! but a command to paste (paths from this machine are counted as one character).

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

/// The first line of the ```sh (or ```bash) block after the README line that starts
/// with `head`.
fn readme_command(head: &str) -> String {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let mut lines = readme.lines().skip_while(|l| !l.starts_with(head));
    assert!(
        lines.next().is_some(),
        "README.md has no line starting {head:?}"
    );
    let mut lines = lines.skip_while(|l| *l != "```sh" && *l != "```bash");
    lines.next();
    lines
        .next()
        .unwrap_or_else(|| panic!("no ```sh block after {head:?}"))
        .to_string()
}

struct Step {
    code: Option<i32>,
    out: String,
    err: String,
}

/// `sh -c LINE` in `dir` with nothing inherited but a fresh HOME and a PATH of `first`
/// (the stand-in nvidia-smi, if any), fdl's directory and the system's.
fn sh(dir: &Path, home: &Path, first: Option<&Path>, line: &str) -> Step {
    let bin = assert_cmd::cargo::cargo_bin("fdl");
    let mut path = String::new();
    if let Some(f) = first {
        path.push_str(&format!("{}:", f.display()));
    }
    path.push_str(&format!(
        "{}:/usr/local/bin:/usr/bin:/bin",
        bin.parent().unwrap().display()
    ));
    let out = Command::new("sh")
        .arg("-c")
        .arg(line)
        .current_dir(dir)
        .env_clear()
        .env("HOME", home)
        .env("PATH", path)
        .output()
        .unwrap();
    Step {
        code: out.status.code(),
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Every line a new user reads is one they can act on.
fn readable(what: &str, s: &Step, places: &[&Path], plan: bool) {
    for text in [&s.out, &s.err] {
        // `..` in a path (`lib/../../nvidia`) is a path, not a sentence's end.
        let doubled = text
            .match_indices("..")
            .any(|(i, _)| !text[..i].ends_with('/') && !text[i + 2..].starts_with('/'));
        assert!(!doubled, "{what}: a doubled period:\n{text}");
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{what}: a control character:\n{text}"
        );
        assert!(!text.contains("panicked"), "{what}:\n{text}");
        for line in text.lines() {
            let mut short = line.to_string();
            for p in places {
                short = short.replace(&p.display().to_string(), "~");
            }
            let t = short.trim_start();
            // A dry run prints the whole plan on purpose; its indented rows run long
            // today (`network`, `toolchain`: src/pipeline/render.rs, issue 29's
            // "short header" item), so they are the one exception, on stdout only.
            let plan_row = plan && std::ptr::eq(text, &s.out) && line.starts_with("  ");
            // The unknown answer is one sentence of ~400 characters on this layout (left
            // to do: wrap it); bounded here so it cannot grow back to the old 600.
            let answer = line.starts_with("Unknown which NCCL") && short.chars().count() < 500;
            // A Calls row names two objects by their paths as the loader sees them.
            let call = line.contains(" → ") && short.chars().count() < 300;
            let pasted = plan_row
                || answer
                || call
                || [
                    "fdl ",
                    "docker ",
                    "export ",
                    "eval ",
                    "LD_PRELOAD",
                    "-gencode",
                ]
                .iter()
                .any(|c| t.starts_with(c) || t.contains(&format!("`{c}")));
            assert!(
                pasted || short.chars().count() < 200,
                "{what}: a line of {} characters:\n{line}",
                short.chars().count()
            );
        }
    }
}

#[test]
#[ignore = "needs the real wheels of `source .ci/setup` (torch 2.15): `cargo test --test first_hour -- --include-ignored`"]
fn the_new_users_first_hour() {
    let torch_lib = oracle_input("FDL_TEST_TORCH_LIB_CU13");
    let torch = torch_lib.parent().unwrap().parent().unwrap().to_path_buf();
    assert!(
        torch.join("version.py").is_file(),
        "{}: not a pip torch",
        torch.display()
    );
    let home = tempfile::tempdir().unwrap();
    let proj = tempfile::tempdir().unwrap();
    std::fs::write(proj.path().join("fdl.yml"), "").unwrap();
    let places = [proj.path(), home.path(), torch.parent().unwrap()];
    let smi = fake_nvidia_smi(
        "0, NVIDIA GeForce GTX 1060 6GB, 6.1, 6144\n1, NVIDIA GeForce RTX 5060 Ti, 12.0, 16311\n",
        0,
    );

    // The README's main job, as written there, with this build's fdl for `cargo run`.
    let main = readme_command("Run the main job");
    let args = main
        .strip_prefix("cargo run --release -- ")
        .unwrap_or_else(|| {
            panic!("the README's main job is no longer `cargo run --release -- …`: {main}")
        });
    let s = sh(proj.path(), home.path(), None, &format!("fdl {args}"));
    readable("main job", &s, &places, true);
    assert_eq!(s.code, Some(0), "{}{}", s.out, s.err);
    assert!(
        s.out
            .contains("Dry run: nothing was built, written or started."),
        "{}",
        s.out
    );

    // The torch the setup downloaded, registered where it is.
    let before_torch = snapshot(&torch);
    let s = sh(
        proj.path(),
        home.path(),
        None,
        &format!(
            "fdl libtorch add torch215 {}",
            fdl::paste::shell(&torch.to_string_lossy())
        ),
    );
    readable("libtorch add", &s, &places, false);
    assert_eq!(s.code, Some(0), "{}{}", s.out, s.err);
    assert!(
        s.out
            .contains("Active libtorch: precompiled/torch215 (the first variant)"),
        "{}",
        s.out
    );
    assert!(
        s.out
            .lines()
            .any(|l| l.starts_with("  nccl ")
                && l.trim_end().ends_with(|c: char| c.is_ascii_digit())),
        "{}",
        s.out
    );
    assert_eq!(
        snapshot(&torch),
        before_torch,
        "libtorch add wrote into the torch"
    );
    let s = sh(proj.path(), home.path(), None, "fdl libtorch list");
    readable("libtorch list", &s, &places, false);
    assert!(
        s.out.contains("* precompiled/torch215  2.15.0"),
        "{}",
        s.out
    );

    // No GPU driver here: the build says how to go on.
    let s = sh(proj.path(), home.path(), None, "fdl nccl build --dry-run");
    readable(
        "nccl build --dry-run without nvidia-smi",
        &s,
        &places,
        false,
    );
    assert_eq!(s.code, Some(1), "{}{}", s.out, s.err);
    assert!(
        s.err
            .contains("name the architectures yourself with --archs"),
        "{}",
        s.err
    );

    // With this rig's GPUs: the plan, from the libtorch's NCCL and the GPUs.
    let before = snapshot(proj.path());
    let s = sh(
        proj.path(),
        home.path(),
        Some(smi.path()),
        "fdl nccl build --dry-run",
    );
    readable("nccl build --dry-run", &s, &places, true);
    assert_eq!(s.code, Some(0), "{}{}", s.out, s.err);
    assert!(
        s.out
            .contains("(from the active libtorch, precompiled/torch215)"),
        "{}",
        s.out
    );
    assert!(
        s.out
            .contains("archs      sm_61 sm_120  (from nvidia-smi: 2 GPU(s))"),
        "{}",
        s.out
    );
    assert_eq!(
        snapshot(proj.path()),
        before,
        "the dry run wrote into the project"
    );

    // Nothing built yet: env says what to run.
    let s = sh(proj.path(), home.path(), Some(smi.path()), "fdl nccl env");
    readable("nccl env", &s, &places, false);
    assert_eq!(s.code, Some(1), "{}{}", s.out, s.err);
    assert!(
        s.err
            .contains("there are no builds yet. Make one with `fdl nccl build`"),
        "{}",
        s.err
    );

    // The wheel cache holds torch and NCCL, not CUDA's libraries: unknown (exit 3),
    // with the NCCL the calls reach if none of those defines nccl*, said once.
    let s = sh(
        proj.path(),
        home.path(),
        Some(smi.path()),
        "fdl nccl detect",
    );
    readable("nccl detect", &s, &places, false);
    assert_eq!(s.code, Some(3), "{}{}", s.out, s.err);
    assert!(
        s.out
            .contains("If none of that defines nccl* functions, the calls bind to"),
        "{}",
        s.out
    );
    assert_eq!(s.out.matches("not all known").count(), 1, "{}", s.out);
    assert_eq!(
        s.err.trim_end(),
        "unknown: fdl cannot say which NCCL the process runs (exit status 3); the reason is above"
    );
}
