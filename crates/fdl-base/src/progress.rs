//! What a long build shows and keeps: a phase, the elapsed time and, while compiling,
//! files done out of the total when it can be known — as a live line on a terminal, as
//! plain lines elsewhere — and the full output in a log file.
//!
//! Off a terminal (nohup, CI) the plain lines keep a [`Pace`]: a phase change is printed
//! at once; other updates at most every [`Pace::gap`], an update that came too soon
//! printed at the end of its gap (delayed, never dropped); and a silent stretch (one long
//! compile) gets a heartbeat line every [`Pace::heartbeat`], so a log that stops means
//! the build stopped.

use indicatif::{ProgressBar, ProgressStyle};
use std::fmt;
use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
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
    /// Adding the verified build to the machine-wide store.
    Store,
    /// Sealing the staged build with its manifest and committing it.
    Seal,
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
            Phase::Store => "store",
            Phase::Seal => "seal",
        })
    }
}

/// How plain (non-terminal) progress lines are paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// The least time between two lines of updates within a phase.
    pub gap: Duration,
    /// The most time without a line: a silent stretch gets the current state again.
    pub heartbeat: Duration,
}

impl Default for Pace {
    fn default() -> Pace {
        Pace {
            gap: Duration::from_secs(5),
            heartbeat: Duration::from_secs(30),
        }
    }
}

/// Where plain progress lines go: stderr (cleaned) unless a caller gives its own.
pub type Sink = Box<dyn Fn(&str) + Send + Sync>;

/// Lines of the log shown when a build fails.
pub const TAIL_LINES: usize = 40;

struct State {
    phase: Phase,
    done: u64,
    total: Option<u64>,
    detail: String,
    last_plain: Option<Instant>,
    /// An update not yet printed, held back by the gap.
    pending: bool,
    stop: bool,
}

/// What the build's threads and the heartbeat share.
struct Shared {
    start: Instant,
    state: Mutex<State>,
    /// Wakes the heartbeat: a held-back update, or the end.
    wake: Condvar,
    pace: Pace,
    sink: Sink,
}

impl Shared {
    fn lock_state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
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

    /// Prints the current state as a plain line now.
    fn emit(&self, s: &mut State) {
        s.last_plain = Some(Instant::now());
        s.pending = false;
        (self.sink)(&self.status_line(s));
    }

    /// The heartbeat thread: prints a held-back update at the end of its gap, and the
    /// current state after each heartbeat without a line, until told to stop.
    fn beat(&self) {
        let mut s = self.lock_state();
        while !s.stop {
            let last = s.last_plain.unwrap_or(self.start);
            let due = last
                + if s.pending {
                    self.pace.gap
                } else {
                    self.pace.heartbeat
                };
            let now = Instant::now();
            if now >= due {
                self.emit(&mut s);
                continue;
            }
            s = self
                .wake
                .wait_timeout(s, due - now)
                .map_or_else(|e| e.into_inner().0, |(g, _)| g);
        }
    }
}

pub struct Progress {
    verbosity: Verbosity,
    bar: Option<ProgressBar>,
    shared: Arc<Shared>,
    heartbeat: Option<std::thread::JoinHandle<()>>,
    log_path: PathBuf,
    log: Mutex<File>,
    /// When each phase began, in order: the build's time, phase by phase
    /// ([`Progress::timings`]).
    marks: Mutex<Vec<(Phase, Instant)>>,
}

/// How long one phase of a build took.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PhaseTime {
    pub phase: String,
    pub seconds: f64,
}

impl Progress {
    /// Starts a build's progress, logging to a new file at `log_path`.
    pub fn new(verbosity: Verbosity, log_path: PathBuf) -> std::io::Result<Progress> {
        let tty = std::io::stderr().is_terminal();
        let plain = (!tty).then(|| {
            let sink: Sink = Box::new(|line: &str| crate::eprintln_safe!("{line}"));
            (Pace::default(), sink)
        });
        Progress::with(verbosity, log_path, plain)
    }

    /// Plain lines only (as off a terminal), paced by `pace`, each handed to `sink`.
    pub fn plain(
        verbosity: Verbosity,
        log_path: PathBuf,
        pace: Pace,
        sink: Sink,
    ) -> std::io::Result<Progress> {
        Progress::with(verbosity, log_path, Some((pace, sink)))
    }

    /// `plain`: the pace and sink of plain lines; `None` for the live line of a terminal.
    fn with(
        verbosity: Verbosity,
        log_path: PathBuf,
        plain: Option<(Pace, Sink)>,
    ) -> std::io::Result<Progress> {
        if let Some(dir) = log_path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        // A new file, never one already there: a name taken (a link planted in the
        // cache included, dangling or not) fails instead of being written through.
        let log = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&log_path)?;
        let tty = plain.is_none();
        let (pace, sink) = plain.unwrap_or_else(|| (Pace::default(), Box::new(|_: &str| {})));
        let bar = (tty && verbosity != Verbosity::Quiet).then(|| {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        let shared = Arc::new(Shared {
            start: Instant::now(),
            state: Mutex::new(State {
                phase: Phase::Prepare,
                done: 0,
                total: None,
                detail: String::new(),
                last_plain: None,
                pending: false,
                stop: false,
            }),
            wake: Condvar::new(),
            pace,
            sink,
        });
        let heartbeat = (!tty && verbosity != Verbosity::Quiet)
            .then(|| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name("fdl-progress".into())
                    .spawn(move || shared.beat())
                    .ok()
            })
            .flatten();
        Ok(Progress {
            verbosity,
            bar,
            shared,
            heartbeat,
            log_path,
            log: Mutex::new(log),
            marks: Mutex::new(vec![(Phase::Prepare, Instant::now())]),
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
        if let Ok(mut marks) = self.marks.lock() {
            marks.push((phase, Instant::now()));
        }
        {
            let mut s = self.lock_state();
            s.phase = phase;
            s.done = 0;
            s.total = None;
            s.detail.clear();
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
        self.shared.lock_state().stop = true;
        self.shared.wake.notify_all();
        if let Ok(mut log) = self.log.lock() {
            let _ = log.flush();
        }
    }

    /// Each phase's time, from its start to the next phase's (the last to now), in
    /// order; a phase entered twice is summed where it was. `prepare` is fdl's own work
    /// before the backend compiles (locks, the store's look-up, make's count).
    pub fn timings(&self) -> Vec<PhaseTime> {
        let marks = self.marks.lock().map(|m| m.clone()).unwrap_or_default();
        let end = Instant::now();
        let mut out: Vec<PhaseTime> = Vec::new();
        for (i, (phase, at)) in marks.iter().enumerate() {
            let until = marks.get(i + 1).map_or(end, |next| next.1);
            let seconds = until.saturating_duration_since(*at).as_secs_f64();
            let name = phase.to_string();
            match out.iter_mut().find(|t| t.phase == name) {
                Some(t) => t.seconds += seconds,
                None => out.push(PhaseTime {
                    phase: name,
                    seconds,
                }),
            }
        }
        out
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
        self.shared.lock_state()
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

    fn render(&self, phase_change: bool) {
        if self.verbosity == Verbosity::Quiet {
            return;
        }
        let mut s = self.lock_state();
        if let Some(bar) = &self.bar {
            let line = self.shared.status_line(&s);
            // The bar shows its own elapsed time.
            bar.set_message(crate::text::terminal_safe(
                &line
                    .split_once(' ')
                    .map_or(line.clone(), |(_, m)| m.to_string()),
            ));
            return;
        }
        if s.stop {
            return;
        }
        let due = s
            .last_plain
            .is_none_or(|t| t.elapsed() >= self.shared.pace.gap);
        if phase_change || due {
            self.shared.emit(&mut s);
        } else {
            // Held back, not dropped: the heartbeat prints it when its gap ends.
            s.pending = true;
            self.shared.wake.notify_all();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
        if let Some(beat) = self.heartbeat.take() {
            let _ = beat.join();
        }
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

    /// Each phase's time runs from its start to the next one's, in order, a phase entered
    /// again adding to its first entry; `prepare` is the time before the first phase.
    #[test]
    fn timings_follow_the_phases() {
        let (p, _dir) = Progress::silent().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        p.phase(Phase::Compile);
        std::thread::sleep(Duration::from_millis(40));
        p.phase(Phase::Link);
        p.phase(Phase::Compile);
        std::thread::sleep(Duration::from_millis(10));
        p.phase(Phase::Verify);
        let t = p.timings();
        let names: Vec<&str> = t.iter().map(|t| t.phase.as_str()).collect();
        assert_eq!(names, ["prepare", "compile", "link", "verify"]);
        assert!(t[0].seconds >= 0.02, "{t:?}");
        assert!(t[1].seconds >= 0.05, "both compile stretches: {t:?}");
        let total: f64 = t.iter().map(|t| t.seconds).sum();
        assert!(total >= 0.07, "{t:?}");
    }

    /// The log is a new file: a link planted at its name is not written through.
    #[test]
    fn the_log_is_never_written_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "kept").unwrap();
        let log = dir.path().join("build.log");
        std::os::unix::fs::symlink(&target, &log).unwrap();
        assert!(Progress::new(Verbosity::Quiet, log.clone()).is_err());
        std::fs::remove_file(&log).unwrap();
        std::os::unix::fs::symlink(dir.path().join("dangling"), &log).unwrap();
        assert!(Progress::new(Verbosity::Quiet, log).is_err());
        assert!(!dir.path().join("dangling").exists());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "kept");
    }

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

    /// Off a terminal (issue 29): a phase is printed at once; updates that come within
    /// the gap are held back and the last of them printed when it ends (never dropped);
    /// a silent stretch gets heartbeat lines with phase, count and elapsed time.
    #[test]
    fn plain_lines_delay_updates_and_beat_through_silence() {
        let dir = tempfile::tempdir().unwrap();
        let lines = Arc::new(Mutex::new(Vec::<(Instant, String)>::new()));
        let sink_lines = Arc::clone(&lines);
        let pace = Pace {
            gap: Duration::from_millis(300),
            heartbeat: Duration::from_millis(900),
        };
        let p = Progress::plain(
            Verbosity::Normal,
            dir.path().join("build.log"),
            pace,
            Box::new(move |l: &str| sink_lines.lock().unwrap().push((Instant::now(), l.into()))),
        )
        .unwrap();
        let t0 = Instant::now();
        p.phase(Phase::Compile);
        p.set_total(10);
        p.advance("a.cc");
        p.advance("b.cc");
        let got = |n: usize| {
            lines
                .lock()
                .unwrap()
                .iter()
                .map(|(_, l)| l.clone())
                .take(n)
                .collect::<Vec<_>>()
        };
        assert_eq!(got(9), ["[00:00] compile"], "updates within the gap wait");
        std::thread::sleep(Duration::from_millis(600));
        assert_eq!(
            got(9),
            ["[00:00] compile", "[00:00] compile 2/10 b.cc"],
            "the last update of the gap is printed at its end"
        );
        // Silence: heartbeats, each the current state, about one per heartbeat.
        std::thread::sleep(Duration::from_millis(2200));
        drop(p);
        let all = lines.lock().unwrap().clone();
        let beats: Vec<&(Instant, String)> = all[2..].iter().collect();
        assert!((2..=3).contains(&beats.len()), "{all:?}");
        for (at, line) in &beats {
            assert!(line.ends_with("compile 2/10 b.cc"), "{line}");
            assert!(*at - t0 >= pace.heartbeat, "{all:?}");
        }
        for w in all.windows(2).skip(1) {
            assert!(
                w[1].0 - w[0].0 >= pace.heartbeat - Duration::from_millis(50),
                "{all:?}"
            );
        }
        // Nothing after the end.
        let n = lines.lock().unwrap().len();
        std::thread::sleep(Duration::from_millis(1000));
        assert_eq!(lines.lock().unwrap().len(), n);
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
