//! Every hint a command prints must be runnable as printed: each `--flag` in a command's
//! error (or report) must be one of that command's own flags, per its clap definition.
//! The commands are run into the situations that make them give advice.

use crate::common;
use clap::CommandFactory;
use common::*;
use std::collections::BTreeSet;

/// The long flags of `fdl <path…>`, per clap (global ones included).
fn flags_of(path: &[&str]) -> BTreeSet<String> {
    let mut cmd = fdl::cli::Cli::command();
    cmd.build();
    let mut sub = &cmd;
    let mut flags: BTreeSet<String> = sub
        .get_arguments()
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect();
    for name in path {
        sub = sub
            .find_subcommand(name)
            .unwrap_or_else(|| panic!("no subcommand {name}"));
        flags.extend(
            sub.get_arguments()
                .filter_map(|a| a.get_long().map(|l| format!("--{l}"))),
        );
    }
    flags.insert("--help".into());
    flags
}

/// `--word` tokens in `text`, not counting those inside a backquoted other command
/// (`fdl libtorch activate …`, `nvcc --list-gpu-arch`) that the hint tells to run.
fn flags_in(text: &str) -> BTreeSet<String> {
    let mut own = String::new();
    for (i, part) in text.split('`').enumerate() {
        if i % 2 == 0 {
            own.push_str(part);
            own.push(' ');
        }
    }
    own.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(str::to_string)
        .collect()
}

#[test]
fn every_hint_names_flags_of_its_own_command() {
    let p = ProjectFixture::empty();
    let no_gpu = fake_nvidia_smi("", 0);
    let garbage = fake_nvidia_smi("garbage\n", 0);
    let no_tools = tempfile::tempdir().unwrap();
    let path = |d: &std::path::Path| path_with(d);
    let cases: Vec<(Vec<&str>, Vec<&str>, Option<String>)> = vec![
        (vec!["gpus"], vec![], Some(path(no_gpu.path()))),
        (vec!["gpus"], vec![], Some(path(garbage.path()))),
        (
            vec!["gpus"],
            vec![],
            Some(no_tools.path().display().to_string()),
        ),
        (vec!["libtorch", "info"], vec![], Some(path(no_gpu.path()))),
        (vec!["libtorch", "activate"], vec!["nope"], None),
        (vec!["libtorch", "remove"], vec!["nope", "--yes"], None),
        (
            vec!["nccl", "build"],
            vec!["--dry-run"],
            Some(path(no_gpu.path())),
        ),
        (
            vec!["nccl", "build"],
            vec!["--tag", "v2.27.5-1", "--dry-run"],
            Some(path(garbage.path())),
        ),
        (
            vec!["nccl", "build"],
            vec!["--tag", "v2.27.5-1", "--archs", "6.1", "--cuda", "13.0"],
            None,
        ),
        (vec!["nccl", "detect"], vec![], None),
        (vec!["nccl", "verify"], vec![], None),
        (vec!["nccl", "env"], vec![], None),
        (vec!["nccl", "remove"], vec!["nope", "--yes"], None),
        (vec!["inspect"], vec!["/nonexistent"], None),
    ];
    let mut checked = 0;
    for (command, args, path_env) in cases {
        let mut cmd = fdl_in(p.root());
        cmd.args(&command).args(&args);
        if let Some(pe) = &path_env {
            cmd.env("PATH", pe);
        }
        let out = cmd.output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let own = flags_of(&command);
        for flag in flags_in(&text) {
            assert!(
                own.contains(&flag),
                "`fdl {}` suggests {flag}, which it does not have:\n{text}",
                command.join(" ")
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 5,
        "the situations gave almost no hints ({checked}): the test lost its point"
    );
}

/// Every command a hint tells to run, in backquotes (`fdl libtorch add NAME PATH`), must
/// exist as written: its subcommands in clap's tree, each of its `--flags` one of theirs.
fn assert_runnable(text: &str) {
    let mut cmd = fdl::cli::Cli::command();
    cmd.build();
    for (i, quoted) in text.split('`').enumerate() {
        if i % 2 == 0 || !quoted.starts_with("fdl ") {
            continue;
        }
        let words: Vec<&str> = quoted.split_whitespace().skip(1).collect();
        let mut path = Vec::new();
        let mut sub = &cmd;
        for w in &words {
            match sub.find_subcommand(w) {
                Some(s) if !w.starts_with('-') => {
                    sub = s;
                    path.push(*w);
                }
                _ => break,
            }
        }
        assert!(
            !path.is_empty() && !sub.has_subcommands(),
            "`{quoted}` is no fdl command:\n{text}"
        );
        let own = flags_of(&path);
        for w in words.iter().filter(|w| w.starts_with("--")) {
            let flag = w.split('=').next().unwrap();
            assert!(own.contains(flag), "`{quoted}`: no {flag}:\n{text}");
        }
    }
}

/// The output of `cmd` (stdout then stderr), which must exit non-zero.
fn failing(cmd: &mut assert_cmd::Command) -> String {
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "should have failed:\n{text}");
    text
}

/// `text` names the fix `needle`, and each command and flag it suggests exists; the flags
/// outside backquotes are `command`'s own.
fn names_fix(command: &[&str], text: &str, needle: &str) {
    // A failed build's message ends with its log's last lines: the tools' own words.
    let text = text.split("\nThe full build log is kept").next().unwrap();
    assert!(text.contains(needle), "no {needle:?} in:\n{text}");
    assert_runnable(text);
    let own = flags_of(command);
    for flag in flags_in(text) {
        assert!(
            own.contains(&flag),
            "`fdl {}` has no {flag}:\n{text}",
            command.join(" ")
        );
    }
}

/// A stand-in `docker` whose engine answers and whose image build stops at FROM, as one
/// that can reach no registry does.
fn docker_without_registry() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("docker");
    std::fs::write(
        &script,
        "#!/bin/sh\ncase \"$1\" in\n  version) echo 24.0.0 ;;\n  build) echo 'Step 1/9 : FROM nvidia/cuda:12.8.1-devel-ubuntu22.04'; echo 'Get \"https://registry/v2/\": dial tcp: lookup registry: no such host' >&2; exit 1 ;;\n  *) exit 1 ;;\nesac\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

#[test]
fn a_docker_build_without_a_registry_names_base_image() {
    let b = BuildsFixture::new(ProjectFixture::empty());
    let docker = docker_without_registry();
    let text = failing(b.fdl().env("PATH", path_with(docker.path())).args([
        "nccl",
        "build",
        "--tag",
        "v2.27.5-1",
        "--archs",
        "8.6",
        "--backend",
        "docker",
        "--quiet",
    ]));
    names_fix(&["nccl", "build"], &text, "--base-image IMAGE");
    assert!(!text.contains("--dockerfile"), "{text}");
    assert!(!b.builds().join("v2.27.5-sm86").exists());
}

use crate::native_fixture;

#[test]
fn a_failed_clone_names_source() {
    let b = BuildsFixture::new(ProjectFixture::empty());
    let home = tempfile::tempdir().unwrap();
    native_fixture::cuda_12_8(home.path());
    let text = failing(
        b.fdl()
            .env("FDL_NCCL_REPO", "/nonexistent/nccl.git")
            .env_remove("CUDA_HOME")
            .args([
                "nccl",
                "build",
                "--tag",
                "v2.27.5-1",
                "--archs",
                "8.6",
                "--backend",
                "native",
                "--quiet",
                "--cuda-home",
            ])
            .arg(home.path()),
    );
    names_fix(&["nccl", "build"], &text, "--source DIR");
    assert!(
        text.contains("cannot clone /nonexistent/nccl.git at v2.27.5-1"),
        "{text}"
    );
}

#[test]
fn no_variants_leads_to_libtorch_add() {
    let p = ProjectFixture::empty();
    let add = "`fdl libtorch add NAME PATH`";
    let text = failing(fdl_in(p.root()).args(["libtorch", "activate", "nope"]));
    names_fix(
        &["libtorch", "activate"],
        &text,
        "there is no libtorch variant 'nope'",
    );
    assert!(
        text.contains(add) && !text.contains("not a libtorch variant name"),
        "{text}"
    );
    let text = failing(fdl_in(p.root()).args(["nccl", "build", "--archs", "8.6", "--dry-run"]));
    names_fix(&["nccl", "build"], &text, add);
    let out = fdl_in(p.root())
        .args(["libtorch", "list"])
        .output()
        .unwrap();
    assert!(out.status.success());
    names_fix(
        &["libtorch", "list"],
        &String::from_utf8_lossy(&out.stdout),
        add,
    );
    // With variants, a wrong name lists them, and no active one names the command.
    let p = ProjectFixture::empty()
        .with_compiled_variant("precompiled/cu128", "int x;")
        .with_compiled_variant("builds/mine", "int y;");
    let text = failing(fdl_in(p.root()).args(["libtorch", "activate", "nope"]));
    names_fix(
        &["libtorch", "activate"],
        &text,
        "Known variants: builds/mine, precompiled/cu128",
    );
    let text = failing(fdl_in(p.root()).args(["libtorch", "info"]));
    names_fix(
        &["libtorch", "info"],
        &text,
        "`fdl libtorch activate VARIANT`",
    );
}

#[test]
fn nccl_env_without_an_active_libtorch_says_so() {
    let b = BuildsFixture::new(ProjectFixture::empty());
    let tree = b.tree("t", (2, 27, 5), &[61, 120]);
    b.install(&tree, "v2.27.5-1", "6.1").unwrap();
    b.install(&tree, "v2.27.5-1", "6.1;12.0").unwrap();
    let text = failing(b.fdl().args(["nccl", "env"]));
    names_fix(&["nccl", "env"], &text, "there is no active libtorch");
    assert!(!text.contains("is unknown"), "{text}");
    assert!(text.contains("`fdl nccl env BUILD`"), "{text}");
}

#[test]
fn a_bare_version_as_tag_gets_the_tag_it_means() {
    let p = ProjectFixture::empty();
    for (given, meant) in [("2.27.5", "v2.27.5-1"), ("2.27.5-2", "v2.27.5-2")] {
        let text = failing(fdl_in(p.root()).args([
            "nccl",
            "build",
            "--tag",
            given,
            "--archs",
            "8.6",
            "--dry-run",
        ]));
        names_fix(
            &["nccl", "build"],
            &text,
            &format!("did you mean --tag {meant}?"),
        );
    }
}

const TWO_DOWN: &str = "cluster:\n  controller:\n    host: c\n    path: /c\n  workers:\n    - host: a\n      path: /a\n      ssh:\n        target: 127.0.0.1\n        port: 1\n    - host: b\n      path: /b\n      ssh:\n        target: 127.0.0.1\n        port: 1\n";

#[test]
fn cluster_messages_name_cluster_commands() {
    let b = BuildsFixture::new(ProjectFixture::empty());
    std::fs::write(b.project.root().join("fdl.cluster.yml"), TWO_DOWN).unwrap();
    // No build yet: the cluster's own build command.
    let text = failing(b.fdl().args(["cluster", "env"]));
    names_fix(&["cluster", "env"], &text, "`fdl cluster build`");
    assert!(!text.contains("fdl nccl build"), "{text}");
    let tree = b.tree("t", (2, 27, 5), &[61]);
    b.install(&tree, "v2.27.5-1", "6.1").unwrap();
    // Every worker down: a dry run says nothing was copied, not that "the others are done".
    let text = failing(
        b.fdl()
            .args(["cluster", "ship", "--dry-run", "--timeout", "5"]),
    );
    names_fix(&["cluster", "ship"], &text, "`fdl cluster ship --dry-run`");
    assert!(!text.contains("the others are done"), "{text}");
    assert!(text.contains("Nothing was copied"), "{text}");
    let text = failing(b.fdl().args(["cluster", "ship", "--timeout", "5"]));
    names_fix(&["cluster", "ship"], &text, "reached none of the workers");
    assert!(!text.contains("the others are done"), "{text}");
    // An unreachable worker is said once, with what to do.
    let text = failing(b.fdl().args(["cluster", "status", "--timeout", "5"]));
    names_fix(&["cluster", "status"], &text, "rerun `fdl cluster status`");
    assert!(!text.contains("unreachable: unreachable"), "{text}");
}

/// No cluster file: the error shows the smallest one, which parses to two workers, one
/// with its own port and key, and is the one docs/cluster.md shows.
#[test]
fn no_cluster_file_shows_a_minimal_one_that_works() {
    let p = ProjectFixture::empty();
    let text = failing(fdl_in(p.root()).args(["cluster", "status"]));
    names_fix(
        &["cluster", "status"],
        &text,
        fdl::cluster::config::MINIMAL_EXAMPLE.trim_end(),
    );
    assert!(!text.contains("fdl.cluster.yml.example"), "{text}");
    let (_, workers) = fdl::cluster::config::parse(&[(
        "fdl.cluster.yml".into(),
        fdl::cluster::config::MINIMAL_EXAMPLE.to_string(),
    )])
    .unwrap();
    assert_eq!(workers.len(), 2);
    assert_eq!(workers[1].ssh.port, Some(2222));
    assert!(workers[1].ssh.identity_file.is_some());
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cluster.md")).unwrap();
    assert!(
        readme.contains(&format!(
            "```yaml\n{}```",
            fdl::cluster::config::MINIMAL_EXAMPLE
        )),
        "docs/cluster.md does not show config::MINIMAL_EXAMPLE as a yaml block"
    );
}
