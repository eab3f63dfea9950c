//! What a long build shows and keeps: a phase, the elapsed time and, while compiling,
//! files done out of the total when it can be known — as a live line on a terminal, as
//! plain lines at most every few seconds elsewhere — and the full output in a log file.

use indicatif::{ProgressBar, ProgressStyle};
use std::fmt;
use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verbosity {
    /// Errors and the final result only.
    Quiet,
    /// Progress; the build's own output goes to the log.
    Normal,
    /// Progress and the build's own output, line by line.
    Verbose,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Prepare,
    Clone,
    Compile,
    Link,
    Install,
    Verify,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Prepare => "prepare",
            Phase::Clone => "clone",
            Phase::Compile => "compile",
            Phase::Link => "link",
            Phase::Install => "install",
            Phase::Verify => "verify",
        })
    }
}

/// How often a non-terminal gets a progress line.
const PLAIN_EVERY: Duration = Duration::from_secs(5);
/// Lines of the log shown when a build fails.
pub const TAIL_LINES: usize = 40;

struct State {
    phase: Phase,
    done: u64,
    total: Option<u64>,
    detail: String,
    last_plain: Option<Instant>,
}

pub struct Progress {
    verbosity: Verbosity,
    start: Instant,
    bar: Option<ProgressBar>,
    state: Mutex<State>,
    log_path: PathBuf,
    log: Mutex<File>,
}

impl Progress {
    /// Starts a build's progress, logging to a new file at `log_path`.
    pub fn new(verbosity: Verbosity, log_path: PathBuf) -> std::io::Result<Progress> {
        if let Some(dir) = log_path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let log = File::create(&log_path)?;
        let tty = std::io::stderr().is_terminal();
        let bar = (tty && verbosity != Verbosity::Quiet).then(|| {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Ok(Progress {
            verbosity,
            start: Instant::now(),
            bar,
            state: Mutex::new(State {
                phase: Phase::Prepare,
                done: 0,
                total: None,
                detail: String::new(),
                last_plain: None,
            }),
            log_path,
            log: Mutex::new(log),
        })
    }

    /// A progress that logs to a throwaway file and shows nothing (for tests and callers
    /// that need no output).
    pub fn silent() -> std::io::Result<(Progress, tempfile::TempDir)> {
        let dir = tempfile::tempdir()?;
        let p = Progress::new(Verbosity::Quiet, dir.path().join("build.log"))?;
        Ok((p, dir))
    }

    pub fn phase(&self, phase: Phase) {
        {
            let mut s = self.lock_state();
            s.phase = phase;
            s.done = 0;
            s.total = None;
            s.detail.clear();
            s.last_plain = None;
        }
        self.log_line(&format!("==> fdl: phase {phase}"));
        self.render(true);
    }

    /// The number of units (files) the current phase will process, once known.
    pub fn set_total(&self, total: u64) {
        self.lock_state().total = Some(total);
        self.render(false);
    }

    /// One unit of the current phase done, with what it was.
    pub fn advance(&self, detail: &str) {
        {
            let mut s = self.lock_state();
            s.done += 1;
            s.detail = detail.to_string();
        }
        self.render(false);
    }

    /// One line of a tool's output: always to the log; to the terminal when verbose.
    pub fn output(&self, line: &str) {
        self.log_line(line);
        if self.verbosity == Verbosity::Verbose {
            self.print(line);
        }
    }

    /// A message for the user (not in quiet mode), also logged.
    pub fn note(&self, msg: &str) {
        self.log_line(msg);
        if self.verbosity != Verbosity::Quiet {
            self.print(msg);
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if let Ok(mut log) = self.log.lock() {
            let _ = log.flush();
        }
    }

    /// The last `n` lines of the log.
    pub fn tail(&self, n: usize) -> Vec<String> {
        if let Ok(mut log) = self.log.lock() {
            let _ = log.flush();
        }
        let text = std::fs::read(&self.log_path).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..]
            .iter()
            .map(|l| l.to_string())
            .collect()
    }

    fn lock_state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn log_line(&self, line: &str) {
        if let Ok(mut log) = self.log.lock() {
            let _ = writeln!(log, "{line}");
        }
    }

    fn print(&self, line: &str) {
        match &self.bar {
            // The build's own output: shown with its controls escaped.
            Some(bar) => bar.println(crate::text::terminal_safe(line)),
            None => crate::eprintln_safe!("{line}"),
        }
    }

    fn status_line(&self, s: &State) -> String {
        let secs = self.start.elapsed().as_secs();
        let mut line = format!("[{:02}:{:02}] {}", secs / 60, secs % 60, s.phase);
        match (s.done, s.total) {
            (0, _) => {}
            (d, Some(t)) => line.push_str(&format!(" {d}/{t}")),
            (d, None) => line.push_str(&format!(" {d} done")),
        }
        if !s.detail.is_empty() {
            line.push_str(&format!(" {}", s.detail));
        }
        line
    }

    fn render(&self, phase_change: bool) {
        if self.verbosity == Verbosity::Quiet {
            return;
        }
        let mut s = self.lock_state();
        if let Some(bar) = &self.bar {
            let line = self.status_line(&s);
            // The bar shows its own elapsed time.
            bar.set_message(crate::text::terminal_safe(
                &line
                    .split_once(' ')
                    .map_or(line.clone(), |(_, m)| m.to_string()),
            ));
            return;
        }
        let due = s.last_plain.is_none_or(|t| t.elapsed() >= PLAIN_EVERY);
        if phase_change || due {
            s.last_plain = Some(Instant::now());
            let line = self.status_line(&s);
            drop(s);
            crate::eprintln_safe!("{line}");
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

/// `Step 3/9 : RUN ...` (classic builder) or `#7 [3/5] RUN ...` (BuildKit).
pub fn docker_step(line: &str) -> Option<(u64, u64)> {
    let rest = if let Some(r) = line.strip_prefix("Step ") {
        r
    } else {
        let (_, r) = line.strip_prefix('#')?.split_once(" [")?;
        r.split_once(']')?.0.rsplit(' ').next()?
    };
    let (done, rest) = rest.split_once('/')?;
    let total: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((done.trim().parse().ok()?, total.parse().ok()?))
}

/// NCCL's makefiles announce each translation unit with `Compiling <file>` and the
/// library with `Linking <file>`.
pub fn nccl_make_event(line: &str) -> Option<(Phase, String)> {
    let t = line.trim_start();
    if let Some(f) = t.strip_prefix("Compiling") {
        let file = f.split_whitespace().next().unwrap_or("").to_string();
        return Some((Phase::Compile, file));
    }
    if let Some(f) = t.strip_prefix("Linking") {
        return Some((
            Phase::Link,
            f.split_whitespace().next().unwrap_or("").to_string(),
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_steps_of_both_builders() {
        assert_eq!(docker_step("Step 3/9 : RUN make"), Some((3, 9)));
        assert_eq!(docker_step("#7 [3/5] RUN git clone"), Some((3, 5)));
        assert_eq!(docker_step("#7 [stage-1 3/5] RUN x"), Some((3, 5)));
        assert_eq!(docker_step("Sending build context"), None);
        assert_eq!(docker_step("#7 DONE 0.1s"), None);
    }

    #[test]
    fn make_events() {
        assert_eq!(
            nccl_make_event("Compiling  init.cc                             > /b/obj/init.o"),
            Some((Phase::Compile, "init.cc".into()))
        );
        assert_eq!(
            nccl_make_event("Linking    libnccl.so.2.27.5"),
            Some((Phase::Link, "libnccl.so.2.27.5".into()))
        );
        assert_eq!(nccl_make_event("make[1]: Entering directory"), None);
    }

    #[test]
    fn log_keeps_everything_and_tails() {
        let (p, _dir) = Progress::silent().unwrap();
        for i in 0..50 {
            p.output(&format!("line {i}"));
        }
        let tail = p.tail(TAIL_LINES);
        assert_eq!(tail.len(), 40);
        assert_eq!(tail.last().unwrap(), "line 49");
    }
}
