//! Running external tools (docker, make, git) so that Ctrl-C and SIGTERM end them and
//! still let fdl roll back. Outside a [`Critical`] section a signal ends fdl at once;
//! inside one it sets a flag that every wait polls: the running child and its whole
//! process group are ended, the caller gets an error, and `Drop` guards (staging
//! directory, container, work directory) clean up. Children die with fdl even when it is
//! killed outright (see [`spawn`]).

use anyhow::{bail, Context, Result};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// How many [`Critical`] sections are open: steps that leave something to undo.
static CRITICAL: AtomicUsize = AtomicUsize::new(0);

/// Installs the SIGINT/SIGTERM handler. Called once by the binary.
///
/// Outside a [`Critical`] section nothing needs undoing, so fdl exits at once (130),
/// whatever it is waiting for. Inside one, the flag is set and the section's waits —
/// which all poll it at least every 50 ms — end their child and unwind through the
/// `Drop` guards that roll back.
pub fn install_interrupt_handler() {
    // Failing to install only loses graceful cleanup on Ctrl-C; not worth refusing to run.
    let _ = ctrlc::set_handler(|| {
        INTERRUPTED.store(true, Ordering::SeqCst);
        if CRITICAL.load(Ordering::SeqCst) == 0 {
            crate::eprintln_safe!("error: {Interrupted}");
            std::process::exit(130);
        }
    });
}

/// While alive, an interrupt is handled by the code that holds it (see
/// [`install_interrupt_handler`]) instead of ending fdl on the spot.
#[derive(Debug)]
pub struct Critical(());

impl Critical {
    pub fn enter() -> Critical {
        CRITICAL.fetch_add(1, Ordering::SeqCst);
        Critical(())
    }
}

impl Drop for Critical {
    fn drop(&mut self) {
        CRITICAL.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A point where a test may have fdl kill itself: with `FDL_TEST_KILL_AT` naming it,
/// the process sends itself SIGKILL there, as a power cut or an OOM kill would stop it,
/// so tests can show that every step of an install leaves a usable store behind. Only
/// with the `test-hooks` feature (the tests'); elsewhere it does nothing.
#[cfg(feature = "test-hooks")]
pub fn kill_point(name: &str) {
    if std::env::var_os("FDL_TEST_KILL_AT").is_some_and(|v| v == name) {
        // SAFETY: kill(2) on our own pid; SIGKILL cannot be caught.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

#[cfg(not(feature = "test-hooks"))]
#[inline(always)]
pub fn kill_point(_name: &str) {}

/// Whether a test asks a replace to take the journalled way, as on a filesystem without
/// `RENAME_EXCHANGE` (`FDL_TEST_NO_EXCHANGE`). Only with the `test-hooks` feature.
pub fn no_exchange() -> bool {
    #[cfg(feature = "test-hooks")]
    return std::env::var_os("FDL_TEST_NO_EXCHANGE").is_some();
    #[cfg(not(feature = "test-hooks"))]
    false
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// An interrupt ended fdl. What it says of the aftermath is the running command's (see
/// [`set_interrupt_note`]): by default that every step it started was undone.
#[derive(Debug, thiserror::Error)]
#[error("interrupted; {}", interrupt_note())]
pub struct Interrupted;

static INTERRUPT_NOTE: std::sync::Mutex<Option<&'static str>> = std::sync::Mutex::new(None);

/// What an interrupt leaves behind, in the words of the command now running, for a
/// command whose work is not all undone on the spot (a copy to another host stops, but
/// what arrived there stays).
pub fn set_interrupt_note(note: &'static str) {
    *INTERRUPT_NOTE.lock().unwrap_or_else(|e| e.into_inner()) = Some(note);
}

fn interrupt_note() -> &'static str {
    INTERRUPT_NOTE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .unwrap_or("everything this run started was cleaned up")
}

/// Starts `cmd` in a process group of its own (the terminal's Ctrl-C reaches fdl alone,
/// which then ends the group in order), tied to fdl's life: if fdl dies, even by SIGKILL,
/// a [`Watchdog`] in the group kills the whole group. Without that, a killed fdl left
/// make's jobs compiling on as orphans, recreating directories fdl had cleaned up.
///
/// Started from fdl's main thread, the child also gets SIGTERM from the kernel when fdl
/// dies (`PR_SET_PDEATHSIG`). The kernel ties that signal to the thread that forked, not
/// the process: set from another thread, it would end the child as soon as that thread
/// ends, while fdl lives on. There the watchdog alone ties the child to fdl.
pub fn spawn(cmd: &mut Command) -> std::io::Result<(Child, Watchdog)> {
    use std::os::unix::process::CommandExt;
    // SAFETY: getpid and gettid have no preconditions.
    let parent = unsafe { libc::getpid() };
    let main_thread = unsafe { libc::gettid() } == parent;
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
    // functions (prctl, getppid, _exit).
    unsafe {
        cmd.pre_exec(move || {
            if main_thread {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // fdl may have died between fork and prctl: then nobody would signal us.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
            }
            Ok(())
        });
    }
    let child = cmd.process_group(0).spawn()?;
    let watch = Watchdog::start(child.id() as libc::pid_t);
    Ok((child, watch))
}

/// Starts a foreground job for a supervisor (`fdl launch`): [`spawn`]'s process group,
/// ties to fdl's life and watchdog, with fdl made the job's subreaper first, so a
/// descendant whose parent ends (a worker of a launcher that died, a daemon it started)
/// is re-parented to fdl instead of to init: it stays in the tree fdl watches and ends.
pub fn spawn_job(cmd: &mut Command) -> std::io::Result<(Child, Watchdog)> {
    // SAFETY: prctl with plain integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    spawn(cmd)
}

/// The signals a foreground supervisor passes on to its job, as a terminal passes them to
/// its foreground process group.
pub const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// The signals of [`FORWARDED`] caught and not yet taken, one bit per signal number.
static CAUGHT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

extern "C" fn record_signal(sig: libc::c_int) {
    // An atomic store is async-signal-safe.
    if (0..64).contains(&sig) {
        CAUGHT.fetch_or(1 << sig, Ordering::SeqCst);
    }
}

/// While alive, SIGINT, SIGTERM and SIGHUP do not end fdl (nor go to
/// [`install_interrupt_handler`]'s handler): each is recorded, for the supervisor to pass
/// on ([`ForwardSignals::take`]). Dropping it puts the handlers back as they were.
pub struct ForwardSignals {
    old: Vec<(libc::c_int, libc::sigaction)>,
}

impl ForwardSignals {
    pub fn install() -> std::io::Result<ForwardSignals> {
        let mut old = Vec::new();
        for sig in FORWARDED {
            // SAFETY: a zeroed sigaction is valid; the handler only stores to an atomic.
            unsafe {
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = record_signal as *const () as usize;
                act.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut act.sa_mask);
                let mut was: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, &act, &mut was) != 0 {
                    let e = std::io::Error::last_os_error();
                    drop(ForwardSignals { old });
                    return Err(e);
                }
                old.push((sig, was));
            }
        }
        Ok(ForwardSignals { old })
    }

    /// The signals caught since the last call, in ascending order.
    pub fn take(&self) -> Vec<libc::c_int> {
        let bits = CAUGHT.swap(0, Ordering::SeqCst);
        (0..64).filter(|s| bits & (1 << s) != 0).collect()
    }
}

impl Drop for ForwardSignals {
    fn drop(&mut self) {
        for (sig, was) in self.old.drain(..).rev() {
            // SAFETY: restoring the action sigaction returned.
            unsafe { libc::sigaction(sig, &was, std::ptr::null_mut()) };
        }
    }
}

/// Starts a quick query that ends on its own (nvidia-smi, scontrol) in a process group of
/// its own, so that a timeout or Ctrl-C ends it and what it started, but not tied to
/// fdl's life as [`spawn`] ties a build: if fdl is killed outright, the query finishes
/// by itself and its answer goes nowhere. What that buys is the start: `spawn`'s
/// `pre_exec` forces a `fork` of fdl, whose copied page tables and copy-on-write faults
/// across its threads, with the [`Watchdog`]'s second `fork`, cost more than the query
/// itself (a node's report asks nvidia-smi twice on every `cluster status`, three nodes
/// often sharing a core, issue 31); without them the standard library starts the child
/// by `posix_spawn`, which copies nothing.
fn spawn_query(cmd: &mut Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0).spawn()
}

/// A forked process in a child's process group that kills the group once fdl is gone.
/// It blocks reading a pipe whose only write end fdl holds: the read returns when fdl
/// exits for any reason, SIGKILL included. When the child ends normally fdl kills the
/// watchdog first (on drop), so it never outlives its use.
pub struct Watchdog {
    pid: libc::pid_t,
    write_end: libc::c_int,
}

impl Watchdog {
    /// `None`-like (pid 0) when it cannot be started: the child then runs unwatched.
    fn start(group: libc::pid_t) -> Watchdog {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: plain syscalls; after fork the child calls only async-signal-safe
        // functions (close_range, setpgid, read, kill, _exit), as a forked multi-threaded
        // process must.
        unsafe {
            if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                return Watchdog {
                    pid: 0,
                    write_end: -1,
                };
            }
            let pid = libc::fork();
            if pid == 0 {
                // Hold nothing of fdl's but the pipe: an inherited pipe end or stdout would
                // keep a reader (fdl's own output thread, a `| tee`) waiting for EOF.
                let keep = fds[0] as libc::c_uint;
                if keep > 0 {
                    libc::syscall(libc::SYS_close_range, 0 as libc::c_uint, keep - 1, 0);
                }
                libc::syscall(libc::SYS_close_range, keep + 1, libc::c_uint::MAX, 0);
                libc::setpgid(0, group);
                let mut byte = 0u8;
                while libc::read(fds[0], (&mut byte as *mut u8).cast(), 1) < 0 {}
                libc::kill(-group, libc::SIGKILL);
                libc::_exit(0);
            }
            libc::close(fds[0]);
            if pid < 0 {
                libc::close(fds[1]);
                return Watchdog {
                    pid: 0,
                    write_end: -1,
                };
            }
            Watchdog {
                pid,
                write_end: fds[1],
            }
        }
    }
}

impl Watchdog {
    /// Its pid (0 when it could not be started): a supervisor that walks its own
    /// descendants leaves it to [`Drop`].
    pub fn pid(&self) -> u32 {
        self.pid.max(0) as u32
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if self.pid > 0 {
            // SAFETY: our own child; reaping it keeps no zombie behind.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
                libc::waitpid(self.pid, std::ptr::null_mut(), 0);
            }
        }
        if self.write_end >= 0 {
            // SAFETY: the descriptor is ours and closed once.
            unsafe { libc::close(self.write_end) };
        }
    }
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

/// The most a child may write to stdout or to stderr for [`output_within`]: past it the
/// child (and its process group) is ended and the call fails with [`TooLarge`]. Every
/// answer fdl reads this way (a worker's report, `receive`'s JSON, a copy tool's errors,
/// nvidia-smi) is far smaller.
pub const OUTPUT_CAP: usize = 1 << 20;

/// A child wrote more than [`OUTPUT_CAP`] bytes to one stream: it was stopped.
#[derive(Debug, thiserror::Error)]
#[error("answer too large: more than {} KiB on its {stream}, so it was stopped", limit / 1024)]
pub struct TooLarge {
    pub stream: &'static str,
    pub limit: usize,
}

/// An error of [`output_within`] as fdl reports it: an interrupt stays [`Interrupted`]
/// (so it ends fdl with 130), a [`TooLarge`] keeps its words.
pub fn lift(e: std::io::Error) -> anyhow::Error {
    if e.get_ref().is_some_and(|i| i.is::<Interrupted>()) {
        return Interrupted.into();
    }
    if let Some(t) = too_large(&e) {
        return anyhow::anyhow!("{t}");
    }
    e.into()
}

/// Whether `e` is [`output_within`]'s [`TooLarge`].
pub fn too_large(e: &std::io::Error) -> Option<&TooLarge> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<TooLarge>())
}

/// Runs `cmd` and collects its output, giving up after `timeout` (the child is killed
/// and `Ok(None)` returned). For quick queries that must not hang fdl when the tool does
/// (a hung driver's nvidia-smi) and for every command that reaches a worker.
///
/// The child runs as [`spawn`] starts it (its own process group, ended with fdl). Each
/// stream is read into memory up to [`OUTPUT_CAP`]; a child that writes more is ended at
/// once and the error is [`TooLarge`] (nothing is spooled to disk, so an endless answer
/// costs neither memory nor temp space). An interrupt ends the child and its group and
/// returns [`Interrupted`] as the error.
pub fn output_within(
    cmd: &mut Command,
    timeout: Duration,
) -> std::io::Result<Option<std::process::Output>> {
    output_within_keeping_stdin(cmd.stdin(Stdio::null()), timeout)
}

/// [`output_within`] for a command whose stdin the caller has set (a file to send).
pub fn output_within_keeping_stdin(
    cmd: &mut Command,
    timeout: Duration,
) -> std::io::Result<Option<std::process::Output>> {
    output_capped(cmd, timeout, OUTPUT_CAP, &|| false, Tie::ToFdl)
}

/// [`output_within`] for a quick query that ends on its own (nvidia-smi, scontrol): the
/// same bounds, timeout and interrupt, started as [`spawn_query`] starts it (cheaply,
/// and not tied to fdl's life).
pub fn query_within(
    cmd: &mut Command,
    timeout: Duration,
) -> std::io::Result<Option<std::process::Output>> {
    output_capped(
        cmd.stdin(Stdio::null()),
        timeout,
        OUTPUT_CAP,
        &|| false,
        Tie::Query,
    )
}

/// [`output_within`] with its own bound per stream: for a command that answers for many
/// hosts at once (one `srun` step), each host's share bounded by the caller.
pub fn output_within_cap(
    cmd: &mut Command,
    timeout: Duration,
    cap: usize,
) -> std::io::Result<Option<std::process::Output>> {
    output_capped(
        cmd.stdin(Stdio::null()),
        timeout,
        cap,
        &|| false,
        Tie::ToFdl,
    )
}

/// [`output_within_cap`] that also ends the child, and returns [`Stopped`] as the error,
/// once `stop` says so (asked at each of the wait's wake-ups, 20 ms apart at most): for
/// a step started while what may cancel it is still being asked.
pub fn output_within_cap_unless(
    cmd: &mut Command,
    timeout: Duration,
    cap: usize,
    stop: &dyn Fn() -> bool,
) -> std::io::Result<Option<std::process::Output>> {
    output_capped(cmd.stdin(Stdio::null()), timeout, cap, stop, Tie::ToFdl)
}

/// The error of a command [`output_within_cap_unless`] ended because it was told to.
#[derive(Debug)]
pub struct Stopped;

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stopped by fdl")
    }
}

impl std::error::Error for Stopped {}

/// Whether `e` is [`Stopped`].
pub fn is_stopped(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Stopped>())
}

/// Whether a child of [`output_capped`] is tied to fdl's life ([`spawn`]) or a query
/// that ends on its own ([`spawn_query`]).
#[derive(Clone, Copy)]
enum Tie {
    ToFdl,
    Query,
}

fn output_capped(
    cmd: &mut Command,
    timeout: Duration,
    cap: usize,
    stop: &dyn Fn() -> bool,
    tie: Tie,
) -> std::io::Result<Option<std::process::Output>> {
    use std::sync::{Arc, Mutex};
    let (out_r, out_w) = std::io::pipe()?;
    let (err_r, err_w) = std::io::pipe()?;
    cmd.stdout(out_w).stderr(err_w);
    let spawned = match tie {
        Tie::ToFdl => spawn(cmd).map(|(child, watch)| (child, Some(watch))),
        Tie::Query => spawn_query(cmd).map(|child| (child, None)),
    };
    // The Command holds the write ends: drop them, or the readers never see the end.
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let (mut child, _watch) = spawned?;
    let over: Arc<Mutex<Option<&'static str>>> = Arc::new(Mutex::new(None));
    // Each reader says when it stops (its stream ended, as it does when the child exits,
    // or went over the cap): the wait below wakes then instead of at its next tick.
    let (wake, woken) = std::sync::mpsc::channel::<()>();
    let reader = |mut pipe: std::io::PipeReader, stream: &'static str| {
        let over = Arc::clone(&over);
        let wake = wake.clone();
        let buf = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&buf);
        let (done, ended) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut chunk = [0u8; 64 * 1024];
            loop {
                match pipe.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => {
                        let mut buf = kept.lock().unwrap_or_else(|e| e.into_inner());
                        if buf.len() + n > cap {
                            over.lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .get_or_insert(stream);
                            break;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let _ = done.send(());
            let _ = wake.send(());
        });
        (buf, ended)
    };
    let out = reader(out_r, "stdout");
    let err = reader(err_r, "stderr");
    drop(wake);
    let start = std::time::Instant::now();
    // Between wake-ups the child is polled from 1 ms up to 20 ms: a quick answer (a
    // `scontrol`, nvidia-smi, an `srun` step) is taken when it comes, not at a tick.
    let mut pause = Duration::from_millis(1);
    let is_over = || *over.lock().unwrap_or_else(|e| e.into_inner());
    let status = loop {
        if let Some(stream) = is_over() {
            end_tree(&mut child);
            return Err(std::io::Error::other(TooLarge { stream, limit: cap }));
        }
        if interrupted() {
            end_tree(&mut child);
            return Err(std::io::Error::other(Interrupted));
        }
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if stop() {
            end_tree(&mut child);
            return Err(std::io::Error::other(Stopped));
        }
        if start.elapsed() > timeout {
            end_tree(&mut child);
            return Ok(None);
        }
        match woken.recv_timeout(pause) {
            Ok(()) => pause = Duration::from_millis(1),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                pause = (pause * 2).min(Duration::from_millis(20))
            }
            // Both streams are closed, and the child has not been reaped yet.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
        }
    };
    // The child is gone; what it left in the pipes comes now. A grandchild that keeps a
    // pipe open (a daemon it started) is not waited for beyond a moment: what was read
    // by then is the answer.
    let deadline = std::time::Instant::now() + Duration::from_millis(500);
    let collect = |(buf, ended): (Arc<Mutex<Vec<u8>>>, std::sync::mpsc::Receiver<()>)| {
        let _ = ended.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()));
        std::mem::take(&mut *buf.lock().unwrap_or_else(|e| e.into_inner()))
    };
    let stdout = collect(out);
    let stderr = collect(err);
    if let Some(stream) = is_over() {
        return Err(std::io::Error::other(TooLarge { stream, limit: cap }));
    }
    Ok(Some(std::process::Output {
        status,
        stdout,
        stderr,
    }))
}

/// Runs `cmd` to completion, capturing stdout and stderr; returns stdout, or an error holding stderr.
/// Output goes to unnamed temporary files rather than pipes, so the wait can keep polling
/// for an interrupt without a reader thread.
pub fn capture(cmd: &mut Command, what: &str) -> Result<String> {
    use std::io::{Read, Seek};
    let mut out = tempfile::tempfile().context("cannot create a temporary file")?;
    let mut err = tempfile::tempfile().context("cannot create a temporary file")?;
    cmd.stdout(out.try_clone()?).stderr(err.try_clone()?);
    let (child, _watch) = spawn(cmd).with_context(|| spawn_error(cmd, what))?;
    let status = wait(child)?;
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

/// The longest line [`stream`] hands on; compiler diagnostics are far shorter.
pub const STREAM_LINE_MAX: usize = 64 * 1024;
/// Lines [`stream`] holds between the child and `on_line`.
const STREAM_QUEUE: usize = 4096;

/// Runs `cmd` with stdout and stderr merged into one pipe, handing each line to
/// `on_line` as it comes, while polling for an interrupt. For long builds whose output
/// feeds progress and the log.
pub fn stream(cmd: &mut Command, what: &str, on_line: &mut dyn FnMut(&str)) -> Result<()> {
    use std::io::{BufRead, Read};
    let (reader, writer) = std::io::pipe().context("cannot create a pipe")?;
    cmd.stdout(writer.try_clone()?).stderr(writer);
    let spawned = spawn(cmd);
    // The Command still holds the pipe's write ends; without replacing them the reader
    // would never see the end of the output.
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let (mut child, _watch) = spawned.with_context(|| spawn_error(cmd, what))?;
    // Bounded both ways: a line is cut at STREAM_LINE_MAX bytes (the rest of it is
    // skipped, said once), and the channel holds STREAM_QUEUE lines, so a child that
    // writes faster than `on_line` reads waits on the pipe instead of filling memory.
    let (tx, rx) = std::sync::mpsc::sync_channel::<String>(STREAM_QUEUE);
    let reader_thread = std::thread::spawn(move || {
        let mut reader = std::io::BufReader::new(reader);
        loop {
            // Lines may not be UTF-8 (compiler output in other locales): read bytes.
            let mut buf = Vec::new();
            let Ok(n) = (&mut reader)
                .take(STREAM_LINE_MAX as u64 + 1)
                .read_until(b'\n', &mut buf)
            else {
                break;
            };
            if n == 0 {
                break;
            }
            let cut = buf.len() > STREAM_LINE_MAX && buf.last() != Some(&b'\n');
            let over = buf.len().saturating_sub(STREAM_LINE_MAX) as u64;
            buf.truncate(STREAM_LINE_MAX);
            let mut line = String::from_utf8_lossy(&buf)
                .trim_end_matches(['\n', '\r'])
                .to_string();
            if cut {
                // The rest of the line, up to its end, is read and dropped.
                // Counted without the newline that ends the line.
                let mut skipped = over;
                while let Ok(chunk) = reader.fill_buf() {
                    if chunk.is_empty() {
                        break;
                    }
                    let (used, done) = match memchr::memchr(b'\n', chunk) {
                        Some(i) => (i + 1, true),
                        None => (chunk.len(), false),
                    };
                    reader.consume(used);
                    skipped += (used - usize::from(done)) as u64;
                    if done {
                        break;
                    }
                }
                line.push_str(&format!(
                    " … [fdl: {skipped} more bytes of this line dropped]"
                ));
            }
            if tx.send(line).is_err() {
                break;
            }
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
    // Polled from 1 ms up to 50 ms: a quick child (`nvcc --version`, a few ms) is seen
    // as soon as it ends instead of at the next 50 ms tick, which cost a store hit three
    // such ticks; a long build is still polled only every 50 ms for an interrupt.
    let mut pause = Duration::from_millis(1);
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
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// The first executable `name` on this process's PATH.
pub fn on_path(name: &str) -> Option<std::path::PathBuf> {
    which_in(name, std::env::var_os("PATH").as_deref())
}

/// The first executable `name` in `path` (a PATH value). Empty entries (meaning the
/// current directory) are ignored: what fdl runs should not depend on where it was
/// started.
pub fn which_in(name: &str, path: Option<&std::ffi::OsStr>) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(path?)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child's overlong line is cut, said so, and the lines after it still arrive.
    /// A child started from a thread that then ends lives on with fdl: the tie to fdl's
    /// life is to the process, not to the thread that started it.
    #[test]
    fn a_child_outlives_the_thread_that_started_it() {
        let (mut child, watch) = std::thread::spawn(|| spawn(Command::new("sleep").arg("30")))
            .join()
            .unwrap()
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let status = child.try_wait().unwrap();
        let _ = child.kill();
        let _ = child.wait();
        drop(watch);
        assert_eq!(
            status, None,
            "the child ended with the thread that started it"
        );
    }

    #[test]
    fn stream_bounds_each_line() {
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "head -c 300000 /dev/zero | tr '\\0' x; echo; echo next; printf 'last, no newline'",
        ]);
        let mut lines = Vec::new();
        stream(&mut cmd, "sh", &mut |l| lines.push(l.to_string())).unwrap();
        assert_eq!(
            lines.len(),
            3,
            "{:?}",
            lines.iter().map(|l| l.len()).collect::<Vec<_>>()
        );
        assert!(
            lines[0].starts_with(&"x".repeat(STREAM_LINE_MAX)),
            "cut at the bound"
        );
        assert!(
            lines[0].ends_with(&format!(
                " … [fdl: {} more bytes of this line dropped]",
                300_000 - STREAM_LINE_MAX
            )),
            "{}",
            &lines[0][STREAM_LINE_MAX..]
        );
        assert_eq!(lines[1..], ["next", "last, no newline"]);
    }

    /// A query started without fdl's fork keeps the bounds of every capture: its answer,
    /// the output cap, and a timeout that ends it and what it started (its own group).
    #[test]
    fn a_query_is_bounded_and_ended_with_its_group() {
        let out = query_within(
            Command::new("sh").args(["-c", "echo answer; echo why >&2; exit 3"]),
            Duration::from_secs(10),
        )
        .unwrap()
        .expect("it ends in time");
        assert_eq!(out.stdout, b"answer\n");
        assert_eq!(out.stderr, b"why\n");
        assert_eq!(out.status.code(), Some(3));

        let e = query_within(
            Command::new("sh").args(["-c", "head -c 2000000 /dev/zero"]),
            Duration::from_secs(10),
        )
        .unwrap_err();
        assert!(too_large(&e).is_some(), "{e}");

        let dir = tempfile::tempdir().unwrap();
        let pid = dir.path().join("grandchild");
        let start = std::time::Instant::now();
        let out = query_within(
            Command::new("sh").args([
                "-c",
                &format!("sleep 30 & echo $! > '{}'; wait", pid.display()),
            ]),
            Duration::from_millis(300),
        )
        .unwrap();
        assert!(out.is_none(), "a hung query is given up");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
        let grandchild: libc::pid_t = std::fs::read_to_string(&pid)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Ended, it may linger as a zombie until whatever adopted it reaps it: that
        // counts as gone.
        let gone = (0..100).any(|_| {
            let zombie =
                std::fs::read_to_string(format!("/proc/{grandchild}/stat")).is_ok_and(|s| {
                    s.rsplit(')')
                        .next()
                        .is_some_and(|r| r.trim_start().starts_with('Z'))
                });
            // SAFETY: signal 0 only asks whether the process exists.
            let alive = unsafe { libc::kill(grandchild, 0) } == 0 && !zombie;
            if alive {
                std::thread::sleep(Duration::from_millis(20));
            }
            !alive
        });
        assert!(gone, "the query's own child outlived its timeout");
    }
}
