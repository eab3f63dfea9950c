//! How the controller reaches its workers: one small interface that `status`, `ship` and
//! `env` call, implemented by OpenSSH (ssh.rs, the hosts of fdl.cluster.yml) and by Slurm
//! (slurm.rs, the nodes of the current allocation). A third engine is one more file.
//!
//! Every call takes many hosts at once, so an engine that reaches them all in one step
//! (one `srun` across the allocation) can, and one that reaches them one by one (ssh)
//! runs them in parallel. Outcomes are per host: one host failing never hides another's
//! answer. What runs there is the same for every engine (fdl's own `cluster self`,
//! `receive`, `link`): only the way there differs.

use super::config::Worker;
use crate::step::single_quote;
use anyhow::{anyhow, Result};
use std::path::Path;
use std::process::Output;
use std::time::Duration;

/// The engine that could not reach a worker: what to check next differs (the host and
/// its `ssh:` block, or the node in Slurm).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreached {
    Ssh,
    Slurm,
}

/// An engine's failure to reach a worker, in its words, with its kind: carried in the
/// `anyhow` chain so that a caller names the next step from the kind, never the words.
#[derive(Debug)]
pub struct Unreachable {
    pub by: Unreached,
    pub what: String,
}

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.what)
    }
}

impl std::error::Error for Unreachable {}

impl Unreachable {
    pub fn error(by: Unreached, what: String) -> anyhow::Error {
        Unreachable { by, what }.into()
    }

    /// The kind of the first failure to reach the worker in `e`'s chain, if any.
    pub fn kind_in(e: &anyhow::Error) -> Option<Unreached> {
        e.chain()
            .find_map(|c| c.downcast_ref::<Unreachable>())
            .map(|u| u.by)
    }
}

/// A script for each host, built from its own settings (its path, its arch).
pub type Script<'a> = &'a (dyn Fn(&Worker) -> String + Sync);

pub trait Transport: Sync {
    /// How hosts are reached, for messages: "over SSH", "through srun".
    fn via(&self) -> &'static str;

    /// `Some(n)` when hosts are reached one by one (n at once): then a many-step job
    /// (ship) runs each host's steps on its own, so a slow host holds only itself.
    /// `None` when one call reaches them all (one srun step): then each step is taken
    /// by all hosts at once.
    fn one_by_one(&self) -> Option<usize>;

    /// Runs each host's script in a POSIX shell there, all within `timeout`. One result
    /// per host, in order: `Err` says the engine could not run it there (the host is
    /// unreachable, down, drained, or did not answer in time); `Ok` is the script's own
    /// exit and output, each stream bounded by [`crate::process::OUTPUT_CAP`].
    fn run_each(&self, hosts: &[&Worker], script: Script, timeout: Duration)
        -> Vec<Result<Output>>;

    /// Puts the controller's file `from` on each host as `dir/name`, where `dir` is the
    /// directory that host named (an absolute path it made for fdl). The bytes are not
    /// trusted yet: the caller checks their sha256 there before using them.
    fn send_file(
        &self,
        hosts: &[(&Worker, String)],
        from: &Path,
        name: &str,
        timeout: Duration,
    ) -> Vec<Result<()>>;

    /// How [`Transport::send_tree`] would copy to a host (for `--dry-run` and the
    /// report); `rsync_there` says whether the host has rsync.
    fn tree_method(&self, rsync_there: bool) -> String;

    /// Copies the tree `from` into each host's directory (the `.incoming-<name>/` that
    /// `receive --prepare` made, entered through [`enter_incoming`]), replacing what is
    /// in it. Returns per host how it was copied.
    fn send_tree(
        &self,
        hosts: &[(&Worker, &Path, bool)],
        from: &Path,
        timeout: Duration,
    ) -> Vec<Result<String>>;
}

/// A remote shell command from words, each single-quoted: `cd -- '<path>' && …`.
pub fn words(words: &[&str]) -> String {
    words
        .iter()
        .map(|w| single_quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Text a worker's shell printed before fdl's JSON answer (a banner or motd from its
/// startup files), named as such: fdl's answer is the whole of stdout, and anything
/// before it is refused rather than skipped, since rsync breaks on it too.
pub fn banner(stdout: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(stdout);
    let trimmed = text.trim_start();
    if trimmed.is_empty() || trimmed.starts_with('{') {
        return None;
    }
    let json_at = text.find("\n{")?;
    shell_noise(&text[..json_at])
}

/// The message for `before`, text a worker's shell printed ahead of the answer of a
/// command fdl ran there; `None` when it is only blank.
pub fn shell_noise(before: &str) -> Option<String> {
    let before: Vec<&str> = before
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let first: String = before.first()?.chars().take(80).collect();
    Some(format!(
        "the worker's shell printed {} line{} before fdl's answer, starting '{}': a banner or motd from its startup files (.bashrc, .profile). A non-interactive shell must print nothing else: print it only for interactive shells (rsync needs that too)",
        before.len(),
        if before.len() == 1 { "" } else { "s" },
        crate::text::clean(&first)
    ))
}

/// The worker-side shell words that enter `to`, the directory `receive --prepare` just
/// made (its physical path), and check from inside that it is that directory: a link
/// swapped in at its name since is refused, never followed. Once there, the copy writes
/// relative to that directory, whatever happens to its name.
pub fn enter_incoming(to: &Path) -> Result<String> {
    let to = to
        .to_str()
        .ok_or_else(|| anyhow!("{} is not UTF-8", to.display()))?;
    let q = single_quote(to);
    Ok(format!(
        "cd -P -- {q} && test \"$(pwd -P)\" = {q} || {{ echo {} >&2; exit 1; }}",
        single_quote(&format!(
            "{to} is not the directory fdl made for the copy (a link or something else is there now): nothing was copied"
        ))
    ))
}

/// The most a copy may take: it moves hundreds of MiB, so far more than one command.
pub fn copy_limit(timeout: Duration) -> Duration {
    (timeout * 20).max(Duration::from_secs(600))
}

/// The line of a copy tool's stderr that says what went wrong (no space, ...).
pub fn copy_error(err: &str) -> String {
    let lines: Vec<&str> = err
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines
        .iter()
        .find(|l| l.contains("No space left") || l.contains("Disk quota"))
        .or_else(|| lines.iter().find(|l| l.contains("Permission denied")))
        .or_else(|| lines.first())
        .map(|l| l.to_string())
        .unwrap_or_else(|| "no message".into())
}

/// A transport whose every command answers, exit 0, with what the function gives as its
/// stdout for that worker and script; copies fail. For tests and fuzz targets that feed
/// a controller what workers could send.
#[cfg(any(test, feature = "test-support"))]
pub struct Canned<'a>(pub &'a (dyn Fn(&Worker, &str) -> Vec<u8> + Sync));

#[cfg(any(test, feature = "test-support"))]
impl Transport for Canned<'_> {
    fn via(&self) -> &'static str {
        "in a test"
    }

    fn one_by_one(&self) -> Option<usize> {
        None
    }

    fn run_each(&self, hosts: &[&Worker], script: Script, _: Duration) -> Vec<Result<Output>> {
        hosts
            .iter()
            .map(|w| {
                Ok(Output {
                    status: std::os::unix::process::ExitStatusExt::from_raw(0),
                    stdout: (self.0)(w, &script(w)),
                    stderr: Vec::new(),
                })
            })
            .collect()
    }

    fn send_file(
        &self,
        hosts: &[(&Worker, String)],
        _: &Path,
        _: &str,
        _: Duration,
    ) -> Vec<Result<()>> {
        hosts
            .iter()
            .map(|_| Err(anyhow!("a canned transport copies nothing")))
            .collect()
    }

    fn tree_method(&self, _: bool) -> String {
        "none".into()
    }

    fn send_tree(
        &self,
        hosts: &[(&Worker, &Path, bool)],
        _: &Path,
        _: Duration,
    ) -> Vec<Result<String>> {
        hosts
            .iter()
            .map(|_| Err(anyhow!("a canned transport copies nothing")))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kind_of_a_failure_to_reach_a_worker_survives_context_and_its_words_do_not_change() {
        let e = Unreachable::error(Unreached::Slurm, "a: Slurm runs no step there".into());
        let e = e.context("no fdl there, and fdl could not be shipped");
        assert_eq!(Unreachable::kind_in(&e), Some(Unreached::Slurm));
        assert_eq!(
            format!("{e:#}"),
            "no fdl there, and fdl could not be shipped: a: Slurm runs no step there"
        );
        // Words alone are no kind: a message that says "unreachable over SSH" but was
        // not made by the engine names no next step.
        let said = anyhow!("unreachable over SSH: made up");
        assert_eq!(Unreachable::kind_in(&said), None);
    }
}
