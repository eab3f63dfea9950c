//! Reaching a worker: the user's own OpenSSH client as a subprocess, so `~/.ssh/config`,
//! the agent, ProxyJump, certificates and known_hosts behave exactly as in their shell.
//!
//! The worker's `ssh.options` come first on the command line, since OpenSSH keeps the
//! first value it sees for an option; fdl's own settings follow and so never override
//! the user's. fdl never turns host-key checking off. Connections are shared through a
//! ControlMaster socket under fdl's cache. Remote commands are built from words each
//! quoted for the remote shell, so no value from the cluster file is ever interpolated
//! unquoted.

use super::config::Worker;
use crate::step::single_quote;
use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// How fdl connects: its own settings, after the user's.
#[derive(Debug, Clone)]
pub struct Transport {
    /// ControlPath directory (`%C` names the socket inside it).
    pub control_dir: PathBuf,
    pub connect_timeout: Duration,
}

impl Transport {
    pub fn new(cache: &Path, connect_timeout: Duration) -> Result<Transport> {
        let control_dir = cache.join("ssh");
        // The sockets give access to live connections: the directory must be this
        // user's alone, made 0700 by fdl or checked to be so (never chmod-ed, which
        // would go through a link planted there to whatever it points to).
        crate::cache::own_dir(cache)?;
        crate::cache::private_dir(&control_dir)?;
        Ok(Transport {
            control_dir,
            connect_timeout,
        })
    }

    /// The `ssh` arguments reaching `worker` (without the remote command).
    pub fn args(&self, worker: &Worker) -> Vec<OsString> {
        let mut a = self.options(worker);
        a.push("-T".into());
        a.push("--".into());
        a.push(worker.ssh.target.clone().into());
        a
    }

    /// The options alone, for tools that name the host themselves (rsync's `-e`).
    pub fn options(&self, worker: &Worker) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        for opt in &worker.ssh.options {
            a.push("-o".into());
            a.push(opt.into());
        }
        if let Some(port) = worker.ssh.port {
            a.push("-p".into());
            a.push(port.to_string().into());
        }
        if let Some(user) = &worker.ssh.user {
            a.push("-l".into());
            a.push(user.into());
        }
        if let Some(id) = &worker.ssh.identity_file {
            a.push("-i".into());
            a.push(expand_home(id).into());
        }
        let mut control = OsString::from("ControlPath=");
        control.push(self.control_dir.join("%C"));
        for opt in [
            "BatchMode=yes".into(),
            format!("ConnectTimeout={}", self.connect_timeout.as_secs().max(1)).into(),
            "ServerAliveInterval=5".into(),
            "ServerAliveCountMax=3".into(),
            "ControlMaster=auto".into(),
            control,
            "ControlPersist=60".into(),
        ] {
            a.push("-o".into());
            a.push(opt);
        }
        a
    }

    /// `ssh … target 'script'`: runs `script` (already quoted where it needs to be) in
    /// the worker's login shell, with `stdin` fed to it, within `timeout`.
    pub fn run(
        &self,
        worker: &Worker,
        script: &str,
        stdin: Option<&Path>,
        timeout: Duration,
    ) -> Result<Output> {
        let mut cmd = Command::new("ssh");
        cmd.args(self.args(worker)).arg(script);
        if let Some(file) = stdin {
            cmd.stdin(Stdio::from(crate::fsread::open_regular(file, false)?));
        }
        match crate::process::output_within_keeping_stdin(&mut cmd, timeout) {
            Ok(Some(out)) => Ok(out),
            Ok(None) => bail!(
                "no answer from {} within {} s (stopped)",
                worker.ssh.target,
                timeout.as_secs()
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                bail!("the ssh command was not found: install the OpenSSH client (openssh-client)")
            }
            // An answer past the cap, or an interrupt: the child is ended already.
            Err(e) if e.get_ref().is_some() => Err(crate::process::lift(e)),
            Err(e) => Err(e).context("cannot start ssh"),
        }
    }
}

/// `~/x` in an identity file is the user's home here (ssh would expand it too; fdl
/// passes it as one argument, so expand it the same way).
fn expand_home(p: &str) -> String {
    match (p.strip_prefix("~/"), std::env::var("HOME")) {
        (Some(rest), Ok(home)) => format!("{home}/{rest}"),
        _ => p.to_string(),
    }
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
        crate::cli::clean(&first)
    ))
}

/// What ssh's exit tells about the connection itself: 255 is ssh's own failure (no route,
/// refused, key, host key); its last stderr line says which.
pub fn connection_failure(out: &Output) -> Option<String> {
    if out.status.code() != Some(255) {
        return None;
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("@@@"))
        .collect();
    if err.contains("REMOTE HOST IDENTIFICATION HAS CHANGED") {
        let offending = lines
            .iter()
            .find(|l| l.starts_with("Offending"))
            .copied()
            .unwrap_or("");
        return Some(format!(
            "its host key has CHANGED since it was recorded in known_hosts: refused. If the host was reinstalled, check the new key and remove the old one (`ssh-keygen -R <host>`). {offending}"
        ));
    }
    Some(
        lines
            .last()
            .map(|l| l.to_string())
            .unwrap_or_else(|| "ssh failed (exit 255) without a message".into()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::config::SshSettings;

    fn worker(ssh: SshSettings) -> Worker {
        Worker {
            host: "node-b".into(),
            path: "/srv/flo dl".into(),
            arch: None,
            ssh,
            env: Default::default(),
            docker: None,
        }
    }

    #[test]
    fn the_users_options_come_first_and_host_keys_stay_checked() {
        let t = Transport {
            control_dir: PathBuf::from("/c/ssh"),
            connect_timeout: Duration::from_secs(7),
        };
        let w = worker(SshSettings {
            target: "10.0.0.2".into(),
            port: Some(2222),
            user: Some("ubuntu".into()),
            identity_file: Some("/k/id".into()),
            options: vec!["ProxyJump=bastion".into(), "ConnectTimeout=30".into()],
        });
        let args: Vec<String> = t
            .args(&w)
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            &args[..10],
            [
                "-o",
                "ProxyJump=bastion",
                "-o",
                "ConnectTimeout=30",
                "-p",
                "2222",
                "-l",
                "ubuntu",
                "-i",
                "/k/id"
            ]
        );
        // The user's ConnectTimeout comes before fdl's, so it is the one OpenSSH keeps.
        let user = args.iter().position(|a| a == "ConnectTimeout=30").unwrap();
        let ours = args.iter().position(|a| a == "ConnectTimeout=7").unwrap();
        assert!(user < ours);
        assert!(args.contains(&"BatchMode=yes".to_string()));
        assert!(args.contains(&"ControlPath=/c/ssh/%C".to_string()));
        assert!(!args.iter().any(|a| a.contains("StrictHostKeyChecking")));
        assert_eq!(&args[args.len() - 3..], ["-T", "--", "10.0.0.2"]);
    }

    #[test]
    fn remote_words_are_quoted_one_by_one() {
        assert_eq!(
            words(&["fdl", "--root", "/srv/it's $(here) `x`"]),
            r#"'fdl' '--root' '/srv/it'\''s $(here) `x`'"#
        );
    }
}
