//! The command line's surface agrees with itself: every flag and argument is described,
//! completions offer only what a user types, `gpus` answers the same way in text and
//! JSON, `inspect` refuses what is not a library, and the cluster commands describe
//! their own defaults and forms.

use crate::common;
use clap::CommandFactory;
use common::*;
use std::os::unix::fs::PermissionsExt;

/// Every argument of every command (hidden ones too: `--help` still shows them to whoever
/// asks) has a help text.
#[test]
fn every_flag_and_argument_has_help() {
    fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for a in cmd.get_arguments() {
            let id = a.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            let blank = |h: Option<&clap::builder::StyledStr>| {
                h.is_none_or(|h| h.to_string().trim().is_empty())
            };
            if blank(a.get_help()) && blank(a.get_long_help()) {
                missing.push(format!(
                    "{path} {}",
                    a.get_long().map_or(id.to_string(), |l| format!("--{l}"))
                ));
            }
        }
        for s in cmd.get_subcommands() {
            walk(s, &format!("{path} {}", s.get_name()), missing);
        }
    }
    let mut cmd = fdl::cli::Cli::command();
    cmd.build();
    let mut missing = Vec::new();
    walk(&cmd, "fdl", &mut missing);
    assert!(missing.is_empty(), "without help: {missing:#?}");
}

#[test]
fn completions_offer_no_hidden_command_or_flag() {
    for shell in ["bash", "zsh", "fish"] {
        let out = fdl().args(["completions", shell]).output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        for hidden in ["__probe-nccl", "receive", "--ld-preload", "--digest"] {
            assert!(!text.contains(hidden), "{shell} completions offer {hidden}");
        }
        // What is visible is still there.
        // (fish spells a long flag `-l root`.)
        for shown in ["ship", "root", "libtorch", "base-image"] {
            assert!(text.contains(shown), "{shell} completions lack {shown}");
        }
    }
    // `cluster self` is hidden; bash names each command's case after its path.
    let out = fdl().args(["completions", "bash"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("cluster__self"));
}

/// No GPU, or no nvidia-smi at all, is an answer: exit 0 in text and JSON alike, and the
/// text says so.
#[test]
fn gpus_without_a_gpu_answers_in_text_and_json() {
    let no_gpu = fake_nvidia_smi("", 0);
    let no_tools = tempfile::tempdir().unwrap();
    for path in [
        path_with(no_gpu.path()),
        no_tools.path().display().to_string(),
    ] {
        let out = fdl().env("PATH", &path).arg("gpus").output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("No NVIDIA GPU here"), "{stdout}");
        let out = fdl()
            .env("PATH", &path)
            .args(["gpus", "--json"])
            .output()
            .unwrap();
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["gpus"], serde_json::json!([]));
    }
}

#[test]
fn inspect_of_a_file_that_is_not_elf_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let readme = dir.path().join("README.md");
    std::fs::write(&readme, "# not a library\n".repeat(100)).unwrap();
    let out = fdl().arg("inspect").arg(&readme).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is not an ELF file") && err.contains("Give a shared library"),
        "{err}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("NOT COVERED"));
    let out = fdl()
        .arg("inspect")
        .arg(&readme)
        .arg("--json")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["error"].as_str().unwrap().contains("is not an ELF file"),
        "{v}"
    );
}

#[test]
fn the_active_file_is_readable_like_every_other() {
    let p = ProjectFixture::empty()
        .with_compiled_variant("precompiled/a", "int a;")
        .with_compiled_variant("precompiled/b", "int b;");
    fdl_in(p.root())
        .args(["libtorch", "activate", "b"])
        .assert()
        .success();
    let mode = std::fs::metadata(p.root().join("libtorch/.active"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644, "{mode:o}");
}

#[test]
fn cluster_help_shows_cluster_defaults_and_plan_has_no_dry_run() {
    for sub in ["plan", "build"] {
        let out = fdl().args(["cluster", sub, "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        // clap wraps long help lines.
        let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            flat.contains("the union of every worker's GPUs"),
            "{sub}: {help}"
        );
        assert!(
            flat.contains("the highest NCCL the workers' libtorch variants bundle"),
            "{sub}: {help}"
        );
        assert!(!flat.contains("the local GPUs"), "{sub}: {help}");
        let offers_dry_run = help
            .lines()
            .any(|l| l.trim_start().starts_with("--dry-run"));
        assert_eq!(offers_dry_run, sub == "build", "{sub}: {help}");
    }
    // `nccl build` keeps its own.
    let out = fdl().args(["nccl", "build", "--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("the local GPUs"));
}

#[test]
fn cluster_env_has_json() {
    let b = BuildsFixture::new(ProjectFixture::empty());
    let tree = b.tree("t", (2, 27, 5), &[61]);
    let name = b.install(&tree, "v2.27.5-1", "6.1").unwrap();
    std::fs::write(
        b.project.root().join("fdl.cluster.yml"),
        "cluster:\n  controller:\n    host: c\n    path: /c\n  workers:\n    - host: a\n      path: /a\n",
    )
    .unwrap();
    let json = b.fdl().args(["cluster", "env", "--json"]).output().unwrap();
    assert!(
        json.status.success(),
        "{}",
        String::from_utf8_lossy(&json.stderr)
    );
    let format = b
        .fdl()
        .args(["cluster", "env", "--format", "json"])
        .output()
        .unwrap();
    assert_eq!(json.stdout, format.stdout);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["build"], name);
    assert_eq!(
        v["workers"][0]["env"]["LD_PRELOAD"],
        format!("/a/libtorch/nccl/builds/{name}/lib/libnccl.so.2")
    );
}

/// The docs (README.md and docs/*.md together) name every command a user can run
/// (`fdl libtorch remove` was missing), and the README links every docs/ page.
#[test]
fn the_readme_lists_every_command() {
    fn leaves(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        let subs: Vec<_> = cmd
            .get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help")
            .collect();
        if subs.is_empty() {
            out.push(path.to_string());
        }
        for s in subs {
            leaves(s, &format!("{path} {}", s.get_name()), out);
        }
    }
    let mut cmd = fdl::cli::Cli::command();
    cmd.build();
    let mut all = Vec::new();
    leaves(&cmd, "fdl", &mut all);
    assert!(all.len() > 15, "{all:?}");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let mut docs = readme.clone();
    for page in std::fs::read_dir(root.join("docs")).unwrap() {
        let page = page.unwrap().path();
        if page.extension().is_some_and(|e| e == "md") {
            let name = page.file_name().unwrap().to_string_lossy().into_owned();
            // Every page is linked from the README, so the guide leads to it.
            assert!(
                readme.contains(&format!("(docs/{name}")),
                "README.md does not link docs/{name}"
            );
            docs.push_str(&std::fs::read_to_string(&page).unwrap());
        }
    }
    let missing: Vec<&String> = all.iter().filter(|c| !docs.contains(c.as_str())).collect();
    assert!(
        missing.is_empty(),
        "neither README.md nor docs/ names {missing:?}"
    );
}

/// The release binary is what `cargo install` installs and what `cluster ship` copies to
/// every worker: it carries no debug info (45 MB with line tables, under 8 MB without).
#[test]
fn the_release_binary_carries_no_debug_info() {
    let toml = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).unwrap();
    let release = toml
        .split("[profile.release]")
        .nth(1)
        .expect("Cargo.toml has a [profile.release]");
    let release = release.split("\n[").next().unwrap();
    assert!(
        release
            .lines()
            .any(|l| l.trim() == r#"strip = "debuginfo""# || l.trim() == "strip = true"),
        "[profile.release] keeps debug info:{release}"
    );
}
