//! Running external tools (docker, make, git) so that Ctrl-C and SIGTERM end them and
//! still let fdl roll back: the signal only sets a flag; the running child and its whole
//! process group are ended, the caller gets an error, and `Drop` guards (staging
//! directory, container, work directory) clean up.

use anyhow::{bail, Context, Result};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Installs the SIGINT/SIGTERM handler. Called once by the binary.
pub fn install_interrupt_handler() {
    // Failing to install only loses graceful cleanup on Ctrl-C; not worth refusing to run.
    let _ = ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst));
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

#[derive(Debug, thiserror::Error)]
#[error("interrupted; everything this run started was cleaned up")]
pub struct Interrupted;

/// Runs `cmd` to completion with its output going where `cmd` says, polling for an
/// interrupt. `what` names the step in errors.
pub fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let status = wait(spawn(cmd).with_context(|| spawn_error(cmd, what))?)?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// Starts `cmd` as the leader of its own process group, so an interrupt can end the
/// whole tree it starts (make's compilers, docker's helpers), not just the child.
fn spawn(cmd: &mut Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0).spawn()
}

/// Ends `child` and everything in its process group: SIGTERM first so tools can clean
/// up, SIGKILL for what is still there after a grace period.
fn end_tree(child: &mut Child) {
    let pgid = child.id() as libc::pid_t;
    // SAFETY: signalling a process group we created; a stale id only yields ESRCH.
    unsafe { libc::kill(-pgid, libc::SIGTERM) };
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Grandchildren may outlive the leader; the group id still reaches them.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    let _ = child.wait();
}

/// Like [`run`] but captures stdout and stderr; returns stdout, or an error holding stderr.
/// Output goes to unnamed temporary files rather than pipes, so the wait can keep polling
/// for an interrupt without a reader thread.
pub fn capture(cmd: &mut Command, what: &str) -> Result<String> {
    use std::io::{Read, Seek};
    let mut out = tempfile::tempfile().context("cannot create a temporary file")?;
    let mut err = tempfile::tempfile().context("cannot create a temporary file")?;
    cmd.stdout(out.try_clone()?).stderr(err.try_clone()?);
    let status = wait(spawn(cmd).with_context(|| spawn_error(cmd, what))?)?;
    let read = |f: &mut std::fs::File| -> Result<String> {
        let mut buf = Vec::new();
        f.rewind()?;
        f.take(1 << 20).read_to_end(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    if !status.success() {
        bail!("{what} failed ({status}): {}", read(&mut err)?.trim());
    }
    read(&mut out)
}

/// Runs `cmd` with stdout and stderr merged into one pipe, handing each line to
/// `on_line` as it comes, while polling for an interrupt. For long builds whose output
/// feeds progress and the log.
pub fn stream(cmd: &mut Command, what: &str, on_line: &mut dyn FnMut(&str)) -> Result<()> {
    use std::io::BufRead;
    let (reader, writer) = std::io::pipe().context("cannot create a pipe")?;
    cmd.stdout(writer.try_clone()?).stderr(writer);
    let spawned = spawn(cmd);
    // The Command still holds the pipe's write ends; without replacing them the reader
    // would never see the end of the output.
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = spawned.with_context(|| spawn_error(cmd, what))?;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader_thread = std::thread::spawn(move || {
        let mut reader = std::io::BufReader::new(reader);
        let mut buf = Vec::new();
        // Lines may not be UTF-8 (compiler output in other locales): read bytes.
        while reader
            .read_until(b'\n', &mut buf)
            .map(|n| n > 0)
            .unwrap_or(false)
        {
            let line = String::from_utf8_lossy(&buf)
                .trim_end_matches(['\n', '\r'])
                .to_string();
            if tx.send(line).is_err() {
                break;
            }
            buf.clear();
        }
    });
    let status = loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(line) => on_line(&line),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                // Output closed; the child is ending (or left a grandchild holding it).
                break wait(child)?;
            }
        }
        if interrupted() {
            end_tree(&mut child);
            return Err(Interrupted.into());
        }
        if let Some(status) = child.try_wait()? {
            // Drain what is buffered; a grandchild may keep the pipe open, so do not wait
            // for the end of the stream beyond that.
            while let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) {
                on_line(&line);
            }
            break status;
        }
    };
    drop(rx);
    if reader_thread.is_finished() {
        let _ = reader_thread.join();
    }
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

fn spawn_error(cmd: &Command, what: &str) -> String {
    format!(
        "{what}: cannot start {}",
        cmd.get_program().to_string_lossy()
    )
}

fn wait(mut child: Child) -> Result<ExitStatus> {
    loop {
        if let Some(status) = child.try_wait()? {
            if interrupted() {
                return Err(Interrupted.into());
            }
            return Ok(status);
        }
        if interrupted() {
            // The child runs in its own process group, out of reach of the terminal's
            // Ctrl-C, so fdl ends it — and what it started — itself.
            end_tree(&mut child);
            return Err(Interrupted.into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `Stdio` that writes to fdl's stderr, so a child's output streams to the terminal
/// without mixing into `--json` on stdout.
pub fn stderr_stdio() -> Stdio {
    use std::os::fd::AsFd;
    match std::io::stderr().as_fd().try_clone_to_owned() {
        Ok(fd) => Stdio::from(fd),
        Err(_) => Stdio::inherit(),
    }
}
