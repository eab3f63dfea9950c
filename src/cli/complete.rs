//! The names dynamic shell completion offers ([`super::complete_from_env`]): at each TAB
//! the shell asks fdl itself, so the arguments that name a libtorch variant or an NCCL
//! build complete to the project's own, which the static `fdl completions SHELL` script
//! cannot know.
//!
//! The candidates are read, never written: the directory listings of the project that
//! `--root`, `$FDL_ROOT` or the working directory names (`libtorch list`'s for variants;
//! at most [`MAX_ENTRIES`] build directories). Only plain names (letters, digits, `.`,
//! `_`, `-`, `+`) are offered, so no byte
//! from the disk reaches the shell's command line raw; any error offers nothing.

use crate::libtorch::Libtorch;
use crate::nccl::store::{leftover_of, BuildName, MANIFEST};
use crate::project::Project;
use clap_complete::engine::CompletionCandidate;
use std::ffi::OsString;
use std::path::PathBuf;

/// How many entries of one directory are looked at, so that a huge directory costs a
/// bounded time at a TAB.
pub const MAX_ENTRIES: usize = 4096;

/// The project's libtorch variants (`precompiled/NAME`, `builds/NAME`); the active one
/// says so where the shell shows help (zsh, fish).
pub(super) fn variants() -> Vec<CompletionCandidate> {
    let Some(project) = project() else {
        return Vec::new();
    };
    let lt = Libtorch::new(project.libtorch_dir());
    let active = lt.active_name().ok().flatten();
    // The listing `fdl libtorch list` reads (links followed: a registered pip torch is
    // a link to its directory), offered by plain names only.
    lt.variants()
        .unwrap_or_default()
        .into_iter()
        .filter(|v| v.name.split_once('/').is_some_and(|(_, n)| plain(n)))
        .map(|v| {
            let help = (active.as_deref() == Some(v.name.as_str())).then(|| "active".into());
            CompletionCandidate::new(v.name).help(help)
        })
        .collect()
}

/// The project's NCCL builds: directories of `libtorch/nccl/builds/` with a build's name
/// and a manifest (not followed through links, as `fdl nccl list` does not).
pub(super) fn builds() -> Vec<CompletionCandidate> {
    let Some(project) = project() else {
        return Vec::new();
    };
    let Ok(rd) = std::fs::read_dir(project.nccl_builds_dir()) else {
        return Vec::new();
    };
    let mut names: Vec<String> = rd
        .take(MAX_ENTRIES)
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let ok = plain(&name)
                && BuildName::parse(&name).is_ok()
                && leftover_of(&name).is_none()
                && std::fs::symlink_metadata(e.path().join(MANIFEST)).is_ok();
            ok.then_some(name)
        })
        .collect();
    names.sort();
    names.into_iter().map(CompletionCandidate::new).collect()
}

/// A name safe to put on a shell's command line as it is, and worth offering: not hidden.
fn plain(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-+".contains(&b))
}

/// The project of the command line being completed: its `--root` (the words after the
/// `--` the shell script passes), else `$FDL_ROOT`, else the working directory's.
fn project() -> Option<Project> {
    let root = root_flag(std::env::args_os());
    Project::from_process(root.as_deref()).ok()
}

/// The value of `--root DIR` or `--root=DIR` among the words being completed (after the
/// first `--`), `~/` expanded as the shell would on running the line.
fn root_flag(args: impl IntoIterator<Item = OsString>) -> Option<PathBuf> {
    let words: Vec<OsString> = args.into_iter().skip_while(|a| a != "--").skip(1).collect();
    let mut value = None;
    for (i, w) in words.iter().enumerate() {
        let w = w.to_string_lossy();
        if w == "--" {
            break;
        }
        if w == "--root" {
            value = words.get(i + 1).map(|v| v.to_string_lossy().into_owned());
        } else if let Some(v) = w.strip_prefix("--root=") {
            value = Some(v.to_string());
        }
    }
    let value = value?;
    let home = || std::env::var_os("HOME").map(PathBuf::from);
    match value.strip_prefix("~/") {
        Some(rest) => home().map(|h| h.join(rest)),
        None if value == "~" => home(),
        None => Some(PathBuf::from(value)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[&str]) -> Vec<OsString> {
        w.iter().map(OsString::from).collect()
    }

    #[test]
    fn root_is_read_after_the_escape() {
        let r = root_flag(words(&[
            "fdl", "--", "fdl", "--root", "/p", "nccl", "env", "",
        ]));
        assert_eq!(r, Some(PathBuf::from("/p")));
        let r = root_flag(words(&["fdl", "--", "fdl", "nccl", "env", "--root=/q", ""]));
        assert_eq!(r, Some(PathBuf::from("/q")));
        // Before the escape is fdl's own command line, not the one being completed.
        assert_eq!(
            root_flag(words(&["fdl", "--root", "/p", "--", "fdl"])),
            None
        );
        // A `--root` still being typed has no value yet.
        assert_eq!(root_flag(words(&["fdl", "--", "fdl", "--root"])), None);
    }

    #[test]
    fn only_plain_names_are_offered() {
        for ok in ["cu128", "torch-2.8+cu128", "v2.27.5-sm61-sm120"] {
            assert!(plain(ok), "{ok}");
        }
        for bad in [
            "",
            ".hidden",
            "-x",
            "a b",
            "a\nb",
            "a\x1b[31m",
            "é",
            "a'b",
            "a$b",
        ] {
            assert!(!plain(bad), "{bad:?}");
        }
    }
}
