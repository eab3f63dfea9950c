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
use super::transport::{
    copy_error, copy_limit, enter_incoming, Script, Transport, Unreachable, Unreached,
};
use crate::step::single_quote;
use anyhow::{anyhow, bail, Context, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

pub use super::transport::{banner, shell_noise, words};

/// How fdl connects: its own settings, after the user's.
#[derive(Debug, Clone)]
pub struct Ssh {
    /// ControlPath directory (`%C` names the socket inside it).
    pub control_dir: PathBuf,
    pub connect_timeout: Duration,
    /// Hosts reached at once.
    pub parallel: usize,
}

impl Ssh {
    pub fn new(cache: &Path, connect_timeout: Duration, parallel: usize) -> Result<Ssh> {
        let control_dir = cache.join("ssh");
        // The sockets give access to live connections: the directory must be this
        // user's alone, made 0700 by fdl or checked to be so (never chmod-ed, which
        // would go through a link planted there to whatever it points to).
        crate::cache::own_dir(cache)?;
        crate::cache::private_dir(&control_dir)?;
        Ok(Ssh {
            control_dir,
            connect_timeout,
            parallel,
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

impl Ssh {
    /// [`Ssh::run`] with ssh's own failure (exit 255) as the error.
    fn run_checked(
        &self,
        worker: &Worker,
        script: &str,
        stdin: Option<&Path>,
        timeout: Duration,
    ) -> Result<Output> {
        let out = self.run(worker, script, stdin, timeout)?;
        if let Some(why) = connection_failure(&out) {
            return Err(Unreachable::error(
                Unreached::Ssh,
                format!("unreachable over SSH: {why}"),
            ));
        }
        Ok(out)
    }
}

impl Transport for Ssh {
    fn via(&self) -> &'static str {
        "over SSH"
    }

    fn one_by_one(&self) -> Option<usize> {
        Some(self.parallel)
    }

    fn run_each(
        &self,
        hosts: &[&Worker],
        script: Script,
        timeout: Duration,
    ) -> Vec<Result<Output>> {
        super::in_parallel(
            hosts,
            self.parallel,
            |w| self.run_checked(w, &script(w), None, timeout),
            &|_| {},
        )
    }

    fn send_file(
        &self,
        hosts: &[(&Worker, String)],
        from: &Path,
        name: &str,
        timeout: Duration,
    ) -> Vec<Result<()>> {
        super::in_parallel(
            hosts,
            self.parallel,
            |(w, dir)| {
                let script = format!(
                    "cd -- {} && cat > {}",
                    single_quote(dir),
                    single_quote(name)
                );
                let out = self.run_checked(w, &script, Some(from), copy_limit(timeout))?;
                if !out.status.success() {
                    bail!(
                        "the copy failed: {}",
                        copy_error(&String::from_utf8_lossy(&out.stderr))
                    );
                }
                Ok(())
            },
            &|_| {},
        )
    }

    fn tree_method(&self, rsync_there: bool) -> String {
        if rsync_there && crate::process::on_path("rsync").is_some() {
            "rsync"
        } else {
            "tar over ssh"
        }
        .into()
    }

    fn send_tree(
        &self,
        hosts: &[(&Worker, &Path, bool)],
        from: &Path,
        timeout: Duration,
    ) -> Vec<Result<String>> {
        super::in_parallel(
            hosts,
            self.parallel,
            |&(w, to, rsync_there)| {
                let method = self.tree_method(rsync_there);
                if method == "rsync" {
                    rsync(self, w, from, to, timeout)?;
                } else {
                    tar_over_ssh(self, w, from, to, timeout)?;
                }
                Ok(method)
            },
            &|_| {},
        )
    }
}

/// The host rsync is given: a fixed name, so no target (a config alias with a `/`, an
/// IPv6 address, a name starting with `-`) is ever read by rsync as a local path, a port
/// or an option. rsync hands it to its `-e` command, which drops it (see [`rsync_shell`]).
pub const RSYNC_HOST: &str = "fdl-worker";

/// The environment variable that carries the worker's real `ssh.target` to
/// [`rsync_shell`]'s command: through the environment it needs no quoting at all.
const TARGET_VAR: &str = "FDL_SSH_TARGET";

/// rsync's `-e`: a `sh -c` that drops the host rsync passes ([`RSYNC_HOST`]) and runs
/// `ssh <the worker's options> -- "$FDL_SSH_TARGET" <rsync's remote command>`. ssh gets
/// the target exactly as `fdl cluster status` gives it (after `--`, so the user's
/// `~/.ssh/config` aliases apply as in their shell). rsync splits `-e` itself, honouring
/// quotes, where a doubled quote inside quotes is a literal one: every word is quoted
/// that way, so any value passes.
fn rsync_shell(t: &Ssh, w: &Worker) -> Result<String> {
    let mut script = String::from("shift; exec ssh");
    for a in t.options(w) {
        let a = a
            .into_string()
            .map_err(|a| anyhow!("{} is not UTF-8", a.to_string_lossy()))?;
        script.push(' ');
        script.push_str(&single_quote(&a));
    }
    script.push_str(&format!(" -T -- \"${TARGET_VAR}\" \"$@\""));
    let rsync_quote = |w: &str| format!("'{}'", w.replace('\'', "''"));
    Ok(format!("sh -c {} fdl-rsh", rsync_quote(&script)))
}

/// The destination for rsync: always [`RSYNC_HOST`], then the path.
fn remote_spec(path: &Path) -> OsString {
    let mut s = OsString::from(format!("{RSYNC_HOST}:"));
    s.push(path);
    s.push("/");
    s
}

fn rsync(t: &Ssh, w: &Worker, from: &Path, to: &Path, timeout: Duration) -> Result<()> {
    let mut src = from.as_os_str().to_os_string();
    src.push("/");
    let mut cmd = Command::new("rsync");
    cmd.args(["-a", "--delete", "--partial", "--protect-args"])
        .arg(format!("--timeout={}", timeout.as_secs().max(5)))
        .arg("-e")
        .arg(rsync_shell(t, w)?)
        // The remote rsync runs inside the checked directory and writes to `.`.
        .arg(format!("--rsync-path={}; exec rsync", enter_incoming(to)?))
        .arg("--")
        .arg(src)
        .arg(remote_spec(Path::new(".")))
        .env(TARGET_VAR, &w.ssh.target);
    let out = crate::process::output_within(&mut cmd, copy_limit(timeout))
        .map_err(crate::process::lift)
        .context("cannot run rsync")?
        .ok_or_else(|| {
            anyhow!("the copy took too long and was stopped (rerun ship to resume it)")
        })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!(
            "the copy failed (rerun ship to resume it): {}",
            copy_error(&err)
        );
    }
    Ok(())
}

fn tar_over_ssh(t: &Ssh, w: &Worker, from: &Path, to: &Path, timeout: Duration) -> Result<()> {
    let enter = enter_incoming(to)?;
    // tar dies with fdl as ssh does: its own process group, watched (see process::spawn).
    let mut tar_cmd = Command::new("tar");
    tar_cmd
        .arg("-C")
        .arg(from)
        .args(["-cf", "-", "."])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let (mut tar, _tar_watch) = crate::process::spawn(&mut tar_cmd).context("cannot run tar")?;
    let stdout = tar.stdout.take().expect("piped");
    let script = format!("{enter}; find . -mindepth 1 -delete && tar -xf -");
    let mut cmd = Command::new("ssh");
    cmd.args(t.args(w)).arg(script).stdin(Stdio::from(stdout));
    let out = crate::process::output_within_keeping_stdin(&mut cmd, copy_limit(timeout));
    let _ = tar.kill();
    let _ = tar.wait();
    let out = out
        .map_err(crate::process::lift)
        .context("cannot run ssh")?
        .ok_or_else(|| anyhow!("the copy took too long and was stopped (rerun ship)"))?;
    if let Some(why) = connection_failure(&out) {
        return Err(Unreachable::error(
            Unreached::Ssh,
            format!("unreachable over SSH during the copy: {why}"),
        ));
    }
    if !out.status.success() {
        bail!(
            "the copy failed (rerun ship): {}",
            copy_error(&String::from_utf8_lossy(&out.stderr))
        );
    }
    Ok(())
}

/// `~/x` in an identity file is the user's home here (ssh would expand it too; fdl
/// passes it as one argument, so expand it the same way).
fn expand_home(p: &str) -> String {
    match (p.strip_prefix("~/"), std::env::var("HOME")) {
        (Some(rest), Ok(home)) => format!("{home}/{rest}"),
        _ => p.to_string(),
    }
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
        let t = Ssh {
            control_dir: PathBuf::from("/c/ssh"),
            connect_timeout: Duration::from_secs(7),
            parallel: 1,
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

    /// rsync's own splitting of `-e`, then `sh -c`, hand ssh every option word as it was
    /// written (quotes, backslashes, `$`) and the target after `--`, whatever it holds.
    #[test]
    fn rsyncs_ssh_gets_the_options_and_the_target_verbatim() {
        assert!(
            crate::process::on_path("rsync").is_some(),
            "this test runs the real rsync: install it (`source .ci/setup` does)"
        );
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("args");
        let ssh = dir.path().join("ssh");
        std::fs::write(
            &ssh,
            format!(
                "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > '{}'\nexit 1\n",
                log.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o755)).unwrap();
        let option = r#"ProxyCommand=nc 'a b' "c d" \e $HOME `x` ''"#;
        let target = "-nodes/a b:'c\"";
        let w = Worker {
            host: "w".into(),
            path: "/srv".into(),
            arch: None,
            ssh: SshSettings {
                target: target.into(),
                options: vec![option.into()],
                ..Default::default()
            },
            env: Default::default(),
            docker: None,
        };
        let t = Ssh {
            control_dir: dir.path().join("c"),
            connect_timeout: Duration::from_secs(5),
            parallel: 1,
        };
        std::fs::create_dir(dir.path().join("src")).unwrap();
        let path = format!(
            "{}:{}",
            dir.path().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let status = Command::new("rsync")
            .args(["-a", "-e", &rsync_shell(&t, &w).unwrap(), "--"])
            .arg(dir.path().join("src/"))
            .arg(remote_spec(Path::new("/x")))
            .env("PATH", path)
            .env(TARGET_VAR, target)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(!status.success());
        let args = std::fs::read_to_string(&log).unwrap();
        let args: Vec<&str> = args.lines().collect();
        assert_eq!(&args[..2], ["-o", option]);
        let dashes = args.iter().position(|a| *a == "--").unwrap();
        assert_eq!(args[dashes + 1], target);
        assert_eq!(args[dashes + 2], "rsync");
        assert!(!args.contains(&RSYNC_HOST));
    }
}
