//! What every command shares: writing output (a failed write is an error, not a panic),
//! one JSON object per answer, the exit status of an "unknown" answer, confirmations,
//! and the build-name check clap runs on arguments. Commands use it; it uses none of
//! them.

use crate::text::{clean, terminal_safe};
use anyhow::Result;

/// A build name from the command line, checked as clap parses it: a name no build can
/// have (over 255 bytes, a path, a hidden name) is a usage error before any file, lock
/// or plan is touched.
pub(crate) fn build_name_arg(s: &str) -> std::result::Result<String, String> {
    crate::nccl::store::BuildName::parse(s)
        .map(|_| s.to_string())
        .map_err(|e| clean(&e.to_string()))
}

/// A build name, or the name of a directory an interrupted build left beside the builds
/// (`fdl nccl remove` takes both).
pub(crate) fn build_or_leftover_arg(s: &str) -> std::result::Result<String, String> {
    if crate::nccl::store::leftover_of(s).is_some() {
        return Ok(s.to_string());
    }
    build_name_arg(s)
}

/// The exit status of a command whose answer is "unknown" (or a split NCCL): not an
/// error of the input, not a "no". Documented in the README.
pub const EXIT_UNKNOWN: u8 = 3;

/// A command answered, and its answer is that fdl cannot say (or that the process would
/// run two NCCLs): exit [`EXIT_UNKNOWN`]. The answer was printed already.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Undecided(pub String);

/// The exit status of `detect --witness` when this host's loader binds otherwise than
/// fdl's model says: the loader's answer stands, and the model has a bug.
pub const EXIT_MODEL_WRONG: u8 = 4;

/// The loader disagreed with the model (both printed already): exit [`EXIT_MODEL_WRONG`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ModelWrong(pub String);

/// An error whose command already printed its JSON answer (a verify report, an
/// unresolved detection): no second object is printed for it.
#[derive(Debug, thiserror::Error)]
#[error("{0:#}")]
pub struct JsonReported(pub anyhow::Error);

/// Asks `question` on a terminal; `Ok(false)` unless the answer is yes. Without a
/// terminal it refuses, telling the caller to pass --yes.
pub(crate) fn confirm(question: &str) -> Result<bool> {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        anyhow::bail!(
            "cannot ask for confirmation: stdin is not a terminal. Pass --yes to go ahead"
        );
    }
    crate::eprint_safe!("{question} [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

/// The shape of every `--json` output, documented in README.md ("JSON output"). Raised
/// when a field changes meaning or goes away; new fields may appear in any version.
pub const JSON_SCHEMA: u32 = 1;

/// Prints one JSON object, stamped with [`JSON_SCHEMA`].
pub(crate) fn print_json(value: &serde_json::Value) {
    let mut value = value.clone();
    if let Some(obj) = value.as_object_mut() {
        obj.insert("schema".into(), JSON_SCHEMA.into());
    }
    print_json_as_is(&value)
}

/// Prints one JSON object with the `schema` it carries: a worker's report, whose schema
/// is the report's own (`cluster::host::REPORT_SCHEMA`), not [`JSON_SCHEMA`].
pub(crate) fn print_json_as_is(value: &serde_json::Value) {
    let text = serde_json::to_string_pretty(&value).expect("JSON values serialize");
    // serde_json leaves C1 controls and bidi overrides raw inside strings: write them as
    // JSON escapes, so the output is terminal-safe as it is (see terminal_safe).
    let text: String = text
        .chars()
        .map(|c| {
            if (c.is_control() && c != '\n')
                || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
            {
                format!("\\u{:04x}", c as u32)
            } else {
                c.to_string()
            }
        })
        .collect();
    outln!("{text}");
}

/// The first failed write to stdout; later output is dropped.
static STDOUT_ERROR: std::sync::Mutex<Option<std::io::Error>> = std::sync::Mutex::new(None);

/// Writes command output to stdout; a failure is kept for [`finish_stdout`], and nothing
/// more is written after one.
pub(crate) fn write_out(args: std::fmt::Arguments) {
    use std::io::Write;
    let mut failed = STDOUT_ERROR.lock().unwrap_or_else(|e| e.into_inner());
    if failed.is_some() {
        return;
    }
    let text = terminal_safe(&std::fmt::format(args));
    if let Err(e) = std::io::stdout().lock().write_all(text.as_bytes()) {
        *failed = Some(e);
    }
}

/// `text` as a row for stdout: `first`, then `text`, wrapped under itself ([`crate::text::wrap`],
/// `rest` the indent of its continuation lines) when stdout is a terminal; one line when
/// piped, for `grep`.
pub(crate) fn stdout_row(first: &str, rest: &str, text: &str) -> String {
    if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        crate::text::wrap(first, rest, text)
    } else {
        format!("{first}{text}")
    }
}

/// Flushes stdout and says whether all command output was written. A closed pipe never
/// gets here (SIGPIPE ends fdl quietly, as any Unix tool); a full disk or a device that
/// refuses writes does, as an error for `main` to report.
pub fn finish_stdout() -> std::io::Result<()> {
    use std::io::Write;
    let flushed = std::io::stdout().lock().flush();
    match STDOUT_ERROR
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
    {
        Some(e) => Err(e),
        None => flushed,
    }
}
