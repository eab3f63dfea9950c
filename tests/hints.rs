//! Every hint a command prints must be runnable as printed: each `--flag` in a command's
//! error (or report) must be one of that command's own flags, per its clap definition.
//! The commands are run into the situations that make them give advice.

mod common;
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
