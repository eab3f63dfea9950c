//! `fdl cluster ship`: one build of the controller, copied to every worker's
//! `<path>/libtorch/nccl/builds/<name>/`, verified there and installed atomically.
//!
//! Per worker: the controller's own fdl is made present (by sha256), the worker says
//! what is at the build's place (nothing, the same bytes — a no-op, which covers a
//! shared project directory — or another build, refused without `--force`), the build
//! is copied into `.incoming-<name>/` beside the target, and the worker's fdl verifies
//! and installs it with the local transaction rules. The copy is rsync over the worker's
//! SSH settings (resumable, sending only what differs); where rsync is missing on either
//! end, a tar stream over the same SSH (scp would follow the library's symlink chain and
//! copy it as three files). Workers run in parallel; one failing never stops another.

use super::config::Worker;
use super::receive::{content_digest, Installed, Place, StateReport};
use super::ssh::{self, Transport};
use super::status::{ship_binary, OwnBinary, NO_PATH};
use crate::step::single_quote;
use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Outcome {
    /// The same bytes are already there.
    AlreadyThere,
    Installed {
        replaced: bool,
        copy: String,
    },
    /// `--dry-run`: what would happen.
    WouldCopy {
        copy: String,
        replace: bool,
    },
    /// A different build is there and `--force` was not given.
    Refused {
        why: String,
    },
    Failed {
        why: String,
    },
}

impl Outcome {
    pub fn ok(&self) -> bool {
        matches!(
            self,
            Outcome::AlreadyThere | Outcome::Installed { .. } | Outcome::WouldCopy { .. }
        )
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ShipResult {
    pub host: String,
    pub target: String,
    pub dir: String,
    #[serde(flatten)]
    pub outcome: Outcome,
}

pub struct ShipRequest<'a> {
    pub name: &'a str,
    /// The build on the controller.
    pub dir: &'a Path,
    pub digest: String,
    pub force: bool,
    pub dry_run: bool,
    pub timeout: Duration,
}

impl ShipRequest<'_> {
    pub fn new<'a>(
        name: &'a str,
        dir: &'a Path,
        force: bool,
        dry_run: bool,
        timeout: Duration,
    ) -> Result<ShipRequest<'a>> {
        Ok(ShipRequest {
            name,
            dir,
            digest: content_digest(dir)?,
            force,
            dry_run,
            timeout,
        })
    }
}

/// The worker-side command, from its checkout, with the controller's fdl.
fn receive_script(w: &Worker, own: &OwnBinary, args: &[&str]) -> String {
    let mut all = vec!["cluster", "receive"];
    all.extend_from_slice(args);
    format!(
        "cd -- {} 2>/dev/null || exit {NO_PATH}; exec {} --root \"$PWD\" {}",
        single_quote(&w.path),
        own.remote_path_expr(),
        ssh::words(&all)
    )
}

/// Runs `receive` there and reads its one JSON answer (or its error).
fn receive<T: serde::de::DeserializeOwned>(
    t: &Transport,
    w: &Worker,
    own: &OwnBinary,
    args: &[&str],
    timeout: Duration,
) -> Result<T> {
    let out = t.run(w, &receive_script(w, own, args), None, timeout)?;
    if let Some(why) = ssh::connection_failure(&out) {
        bail!("unreachable over SSH: {why}");
    }
    if out.status.code() == Some(NO_PATH) {
        bail!(
            "its path {} does not exist there (or cannot be entered): fix `path:` or create the checkout",
            w.path
        );
    }
    if let Some(why) = ssh::banner(&out.stdout) {
        bail!("{why}");
    }
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let v: Option<serde_json::Value> = serde_json::from_str(text.trim()).ok();
        let why = v
            .as_ref()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or_else(|| {
                String::from_utf8_lossy(&out.stderr)
                    .trim()
                    .trim_start_matches("error: ")
                    .to_string()
            });
        bail!("{why}");
    }
    serde_json::from_str(text.trim()).with_context(|| {
        format!(
            "the worker's fdl gave no answer: '{}'",
            text.trim().chars().take(200).collect::<String>()
        )
    })
}

/// Makes the controller's fdl present on the worker.
fn ensure_own_fdl(t: &Transport, w: &Worker, own: &OwnBinary, timeout: Duration) -> Result<()> {
    // Present is not enough: a cached copy that is not these bytes (damaged, or planted)
    // is replaced, as `status` replaces one that does not answer.
    let out = t.run(
        w,
        &format!(
            "b={}; test -x \"$b\" && [ \"$(sha256sum < \"$b\" | cut -d' ' -f1)\" = {} ]",
            own.remote_path_expr(),
            single_quote(&own.sha256)
        ),
        None,
        timeout,
    )?;
    if let Some(why) = ssh::connection_failure(&out) {
        bail!("unreachable over SSH: {why}");
    }
    if out.status.success() {
        return Ok(());
    }
    ship_binary(t, w, own, timeout).map_err(|e| anyhow!("fdl could not be put there: {e:#}"))
}

pub fn ship_one(t: &Transport, w: &Worker, own: &OwnBinary, req: &ShipRequest) -> ShipResult {
    let dir = format!(
        "{}/libtorch/nccl/builds/{}",
        w.path.trim_end_matches('/'),
        req.name
    );
    let outcome = match ship_steps(t, w, own, req) {
        Ok(o) => o,
        Err(e) => Outcome::Failed {
            why: format!("{e:#}"),
        },
    };
    ShipResult {
        host: w.host.clone(),
        target: w.ssh.target.clone(),
        dir,
        outcome,
    }
}

fn ship_steps(t: &Transport, w: &Worker, own: &OwnBinary, req: &ShipRequest) -> Result<Outcome> {
    ensure_own_fdl(t, w, own, req.timeout)?;
    // `--state=NAME`: one word, so a name starting with `-` is a value, never an option.
    let state_arg = format!("--state={}", req.name);
    let state: StateReport = receive(t, w, own, &[&state_arg], req.timeout)?;
    let replace = match &state.place {
        Place::Absent => false,
        Place::Build { digest } if *digest == req.digest => return Ok(Outcome::AlreadyThere),
        Place::Build { .. } | Place::Other { .. } if req.force => true,
        Place::Build { .. } => {
            return Ok(Outcome::Refused {
                why: "a different build of that name is there: --force replaces it".into(),
            })
        }
        Place::Other { why } => {
            return Ok(Outcome::Refused {
                why: format!(
                    "something that is not a build of it is there ({why}): --force replaces it"
                ),
            })
        }
    };
    let use_rsync = state.rsync && crate::native::on_path("rsync").is_some();
    let copy = if use_rsync { "rsync" } else { "tar over ssh" }.to_string();
    if req.dry_run {
        return Ok(Outcome::WouldCopy { copy, replace });
    }
    let state: StateReport = receive(t, w, own, &[&state_arg, "--prepare"], req.timeout)?;
    if use_rsync {
        rsync(t, w, req.dir, &state.incoming, req.timeout)?;
    } else {
        tar_over_ssh(t, w, req.dir, &state.incoming, req.timeout)?;
    }
    let install_arg = format!("--install={}", req.name);
    let digest_arg = format!("--digest={}", req.digest);
    let mut args = vec![install_arg.as_str(), digest_arg.as_str()];
    if req.force {
        args.push("--force");
    }
    let installed: Installed = receive(t, w, own, &args, req.timeout.max(Duration::from_secs(60)))?;
    Ok(Outcome::Installed {
        replaced: installed.replaced,
        copy,
    })
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
fn rsync_shell(t: &Transport, w: &Worker) -> Result<String> {
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

/// The worker-side shell words that enter `to`, the directory `receive --prepare` just
/// made (its physical path), and check from inside that it is that directory: a link
/// swapped in at its name since is refused, never followed. Once there, the copy writes
/// relative to that directory, whatever happens to its name.
fn enter_incoming(to: &Path) -> Result<String> {
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

fn rsync(t: &Transport, w: &Worker, from: &Path, to: &Path, timeout: Duration) -> Result<()> {
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

/// The most a copy may take: it moves hundreds of MiB, so far more than one command.
fn copy_limit(timeout: Duration) -> Duration {
    (timeout * 20).max(Duration::from_secs(600))
}

/// The line of a copy tool's stderr that says what went wrong (no space, ...).
fn copy_error(err: &str) -> String {
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

fn tar_over_ssh(
    t: &Transport,
    w: &Worker,
    from: &Path,
    to: &Path,
    timeout: Duration,
) -> Result<()> {
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
    if let Some(why) = ssh::connection_failure(&out) {
        bail!("unreachable over SSH during the copy: {why}");
    }
    if !out.status.success() {
        bail!(
            "the copy failed (rerun ship): {}",
            copy_error(&String::from_utf8_lossy(&out.stderr))
        );
    }
    Ok(())
}

/// Every chosen worker, `parallel` at a time, in the file's order.
pub fn ship_all(
    workers: &[&Worker],
    t: &Transport,
    own: &OwnBinary,
    req: &ShipRequest,
    parallel: usize,
    on_done: &(dyn Fn(&ShipResult) + Sync),
) -> Vec<ShipResult> {
    super::in_parallel(workers, parallel, |w| ship_one(t, w, own, req), on_done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::config::SshSettings;

    /// rsync's own splitting of `-e`, then `sh -c`, hand ssh every option word as it was
    /// written (quotes, backslashes, `$`) and the target after `--`, whatever it holds.
    #[test]
    fn rsyncs_ssh_gets_the_options_and_the_target_verbatim() {
        assert!(
            crate::native::on_path("rsync").is_some(),
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
        let t = Transport {
            control_dir: dir.path().join("c"),
            connect_timeout: Duration::from_secs(5),
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
