//! Text that reaches the user's terminal: what came from outside fdl made safe to print
//! ([`clean`] for a field, [`terminal_safe`] as the backstop for whole lines), and fdl's
//! own colours. A ground-floor module: every concern that quotes a file, a library, a
//! worker or an engine in a message uses it, so none of them needs `cli`.

/// fdl's own colours travel inside its text as private-use characters, which only
/// [`terminal_safe`] turns into escape sequences at the end: so no escape sequence that
/// came from outside (a name in `DT_NEEDED`, a directory, an engine's version string)
/// can pass for one of fdl's, and [`clean`] escapes these characters in outside text
/// too. One character per colour, and one for "back to normal".
const MARK_RESET: char = '\u{F8F0}';
const MARK_RED: char = '\u{F8F1}';
const MARK_GREEN: char = '\u{F8F2}';
const MARK_YELLOW: char = '\u{F8F3}';

fn is_mark(c: char) -> bool {
    matches!(c, '\u{F8F0}'..='\u{F8F3}')
}

/// Characters that change how a terminal shows text: C0 and C1 controls (ESC, so every
/// CSI and OSC sequence, carriage return, backspace, and the C1 CSI itself), and the
/// bidi controls that reorder a line.
fn is_bad(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// The backstop under [`clean`] for whole lines of output: every control character but
/// newline and tab is escaped (ESC included, so any CSI or OSC sequence is printed as
/// inert text), and fdl's own colour marks become colour codes. Fields from outside are
/// cleaned where they are printed (that also escapes their newlines, so no line can be
/// forged); this catches the rest, so no output of fdl can retitle, clear or move about
/// the user's terminal. (A colour mark in outside text that skipped [`clean`] could at
/// most colour it: it becomes a colour code and nothing else.)
pub fn terminal_safe(text: &str) -> String {
    if !text
        .chars()
        .any(|c| (is_bad(c) && c != '\n' && c != '\t') || is_mark(c))
    {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\n' | '\t' => out.push(c),
            MARK_RESET => out.push_str("\x1b[0m"),
            MARK_RED => out.push_str("\x1b[31m"),
            MARK_GREEN => out.push_str("\x1b[32m"),
            MARK_YELLOW => out.push_str("\x1b[33m"),
            c if is_bad(c) => out.push_str(&c.escape_unicode().to_string()),
            c => out.push(c),
        }
    }
    out
}

/// `eprintln!` through [`terminal_safe`]: what fdl writes to stderr (warnings, progress,
/// errors quoting files and workers) is as safe as what it writes to stdout.
#[macro_export]
macro_rules! eprintln_safe {
    () => {
        $crate::text::write_err(format_args!("\n"))
    };
    ($($arg:tt)*) => {{
        $crate::text::write_err(format_args!("{}\n", format_args!($($arg)*)))
    }};
}

/// `eprint!` through [`terminal_safe`]; see [`eprintln_safe!`].
#[macro_export]
macro_rules! eprint_safe {
    ($($arg:tt)*) => {
        $crate::text::write_err(format_args!($($arg)*))
    };
}

/// Writes to stderr through [`terminal_safe`]; a failed write is dropped, as
/// `eprint!`'s would panic instead.
pub fn write_err(args: std::fmt::Arguments) {
    use std::io::Write;
    let mut text = std::fmt::format(args);
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        text = wrap_message(&text);
    }
    let text = terminal_safe(&text);
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// A message for a terminal: each prose line past [`WIDTH`] wrapped ([`wrap`]), going on
/// two spaces in. An indented line (a command to copy, a list under the message) and a
/// progress line (`\r`) keep their lines.
pub fn wrap_message(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        if line.starts_with([' ', '\t']) || line.contains('\r') || columns(line) <= WIDTH {
            out.push_str(line);
        } else {
            out.push_str(&wrap("", "  ", line));
        }
    }
    out
}

#[derive(Debug, Clone, Copy)]
pub enum Color {
    Red,
    Yellow,
    Green,
}

/// Colour only on a terminal, and never when NO_COLOR is set (no-color.org).
fn color_enabled(stream_is_terminal: bool) -> bool {
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()) && stream_is_terminal
}

/// Text that came from outside fdl (a file, a library, a worker), made safe to print: every
/// control character (escape sequences, carriage returns, newlines; bidi controls and
/// fdl's own colour marks are not excepted) is written as a visible `\u{…}` escape, so
/// nothing can retitle, clear, recolour or forge lines of the user's terminal.
pub fn clean(text: &str) -> String {
    let bad = |c: char| is_bad(c) || is_mark(c);
    if !text.chars().any(bad) {
        return text.to_string();
    }
    text.chars()
        .map(|c| {
            if bad(c) {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A path as fdl prints it: [`clean`] of its display form, so a newline or a tab in a
/// directory's name is an escape, never a line of its own.
pub fn shown(path: &(impl AsRef<std::path::Path> + ?Sized)) -> String {
    clean(&path.as_ref().display().to_string())
}

/// `text` in `color` when it goes to a terminal on stdout.
pub fn paint(text: &str, color: Color) -> String {
    use std::io::IsTerminal;
    paint_if(color_enabled(std::io::stdout().is_terminal()), text, color)
}

/// `text` in `color` when it goes to a terminal on stderr.
pub fn paint_err(text: &str, color: Color) -> String {
    use std::io::IsTerminal;
    paint_if(color_enabled(std::io::stderr().is_terminal()), text, color)
}

fn paint_if(enabled: bool, text: &str, color: Color) -> String {
    if !enabled {
        return text.to_string();
    }
    let mark = match color {
        Color::Red => MARK_RED,
        Color::Yellow => MARK_YELLOW,
        Color::Green => MARK_GREEN,
    };
    format!("{mark}{text}{MARK_RESET}")
}

/// The widest line fdl prints to a terminal, in characters: prose is wrapped to it
/// ([`wrap`]); only a path or a command to copy, which is never broken, runs past it.
pub const WIDTH: usize = 100;

/// How many columns `text` takes: fdl's colour marks take none.
pub fn columns(text: &str) -> usize {
    text.chars().filter(|&c| !is_mark(c)).count()
}

/// `text` as lines of at most [`WIDTH`] columns, the first starting with `first`, the
/// others with `rest` (an indent). Lines break at spaces only, never inside a `span in
/// backticks` (a command to copy): a word or span longer than a line (a path, a command)
/// stays whole, on a line of its own.
pub fn wrap(first: &str, rest: &str, text: &str) -> String {
    // Each word with the spaces before it, so that a double space stays one where no line
    // breaks.
    let mut parts: Vec<(&str, &str)> = Vec::new();
    let mut rest_of = text;
    while !rest_of.is_empty() {
        let word_at = rest_of.len() - rest_of.trim_start_matches(' ').len();
        let mut end = rest_of[word_at..]
            .find(' ')
            .map_or(rest_of.len(), |i| word_at + i);
        // A word that opens a backtick span runs to the word that closes it, when one does.
        if rest_of[word_at..end].matches('`').count() % 2 == 1 {
            if let Some(close) = rest_of[end..].find('`') {
                let after = end + close + 1;
                end = rest_of[after..]
                    .find(' ')
                    .map_or(rest_of.len(), |i| after + i);
            }
        }
        if word_at < end {
            parts.push((&rest_of[..word_at], &rest_of[word_at..end]));
        }
        rest_of = &rest_of[end..];
    }
    pack(first, rest, &parts)
}

/// `items` joined by `sep` as [`wrap`] lays out text, breaking only between items (after
/// `sep`, less its trailing spaces): `sm_90 ×393` of a list stays on one line.
pub fn wrap_items(first: &str, rest: &str, items: &[String], sep: &str) -> String {
    let parts: Vec<(&str, &str)> = items
        .iter()
        .enumerate()
        .map(|(i, item)| (if i == 0 { "" } else { sep }, item.as_str()))
        .collect();
    pack(first, rest, &parts)
}

/// Lays out `(joiner, word)` pairs: a line breaks before a word that would pass
/// [`WIDTH`], ending with its joiner less trailing spaces; the next starts with `rest`.
fn pack(first: &str, rest: &str, parts: &[(&str, &str)]) -> String {
    let mut out = String::new();
    let mut line = first.to_string();
    let mut empty = true;
    for (joiner, word) in parts {
        if !empty && columns(&line) + columns(joiner) + columns(word) > WIDTH {
            out.push_str(line.trim_end());
            out.push_str(joiner.trim_end());
            out.push('\n');
            line = rest.to_string();
            empty = true;
        }
        if !empty {
            line.push_str(joiner);
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(line.trim_end());
    out
}

/// `text` cut to at most `max` columns at a space, with `…` where it was cut; the second
/// value says whether it was.
pub fn fit(text: &str, max: usize) -> (String, bool) {
    if columns(text) <= max {
        return (text.to_string(), false);
    }
    let head: String = text.chars().take(max.saturating_sub(1)).collect();
    let head = match head.rfind(' ') {
        Some(i) if i > max / 2 => &head[..i],
        _ => head.as_str(),
    };
    (
        format!("{}…", head.trim_end_matches([' ', ',', ';', ':', '('])),
        true,
    )
}

/// Paths as JSON text, for `#[serde(serialize_with = "…")]` on path fields: a file name
/// need not be UTF-8, and serde refuses such a path (then `json!` panics), while the
/// files fdl is asked about, and what their link maps find, are hostile. Bytes that are
/// not UTF-8 become U+FFFD: the JSON names the file as a reader would see it.
pub mod json_path {
    use serde::Serializer;
    use std::path::{Path, PathBuf};

    pub fn one<S: Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&p.to_string_lossy())
    }

    pub fn opt<S: Serializer>(p: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
        match p {
            Some(p) => s.serialize_some(&p.to_string_lossy()),
            None => s.serialize_none(),
        }
    }

    pub fn many<S: Serializer>(ps: &[PathBuf], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(ps.iter().map(|p| p.to_string_lossy()))
    }

    /// A path for `json!`, which would panic on the path itself.
    pub fn value(p: &Path) -> serde_json::Value {
        serde_json::Value::String(p.to_string_lossy().into_owned())
    }

    /// Paths for `json!`, as an array.
    pub fn values<P: AsRef<Path>>(ps: impl IntoIterator<Item = P>) -> serde_json::Value {
        serde_json::Value::Array(ps.into_iter().map(|p| value(p.as_ref())).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Outside text cannot colour, move or forge: an SGR, a CSI that clears, an OSC that
    /// retitles, a C1 CSI and a forged colour mark are all inert, in a field and on a
    /// whole line; fdl's own colours still come out as colour codes.
    #[test]
    fn only_fdls_own_colours_reach_the_terminal() {
        let hostile = "lib\x1b[31mred\x1b[2J\x1b]0;title\x07\u{9b}31m\rname";
        for shown in [terminal_safe(hostile), clean(hostile)] {
            assert!(
                !shown.contains('\x1b') && !shown.contains('\r') && !shown.contains('\u{9b}'),
                "{shown:?}"
            );
            assert!(!shown.contains('\x07'), "{shown:?}");
        }
        assert!(!clean("\u{F8F1}x\u{F8F0}").chars().any(is_mark));
        assert!(clean("a\nforged line").contains("\\u{a}"));
        let ours = paint_if(true, "ok", Color::Green);
        assert_eq!(terminal_safe(&ours), "\x1b[32mok\x1b[0m");
        // A mark that came from outside and was cleaned stays text.
        let line = format!("{} {}", ours, clean("\u{F8F1}evil"));
        assert_eq!(terminal_safe(&line), "\x1b[32mok\x1b[0m \\u{f8f1}evil");
        assert_eq!(terminal_safe("plain\ttext\n"), "plain\ttext\n");
    }

    /// A message on a terminal: its prose lines wrap two spaces in, a command in backticks
    /// stays whole, an indented line (a command to copy) and a progress line are kept.
    #[test]
    fn messages_wrap_their_prose_only() {
        let cmd = "`fdl nccl build --archs \"6.1;8.6;12.0\" --cuda 12.9 --backend native`";
        let prose = format!("error: {} use {cmd} to fix it", "word ".repeat(18));
        let indented = format!("  sudo apt-get install -y {}", "pkg ".repeat(30));
        let text = format!("{prose}\n{indented}\n");
        let out = wrap_message(&text);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines.len() >= 3, "{out}");
        assert!(out.contains(cmd), "the command was broken: {out}");
        assert!(lines.iter().any(|l| *l == indented), "{out}");
        for l in &lines {
            assert!(
                columns(l) <= WIDTH || *l == indented || l.contains(cmd),
                "{l}"
            );
        }
        assert!(lines[1].starts_with("  "), "{out}");
        assert!(out.ends_with('\n'));
        let progress = format!("\r{}", "x ".repeat(80));
        assert_eq!(wrap_message(&progress), progress);
    }

    /// Prose wraps at spaces within WIDTH; a word longer than a line (a path) stays whole.
    #[test]
    fn wrap_breaks_prose_never_a_path() {
        let long_path = format!("/{}", "d/".repeat(70));
        let text = format!("{} {long_path} and after", "word ".repeat(40));
        let wrapped = wrap("  head ", "       ", &text);
        for l in wrapped.lines() {
            assert!(columns(l) <= WIDTH || l.trim() == long_path, "{l:?}");
        }
        assert!(wrapped.starts_with("  head word"));
        assert!(wrapped.lines().any(|l| l.trim() == long_path));
        assert_eq!(wrap("a ", "  ", "short  text"), "a short  text");
        let items: Vec<String> = (0..30).map(|i| format!("sm_{i} ×393")).collect();
        let listed = wrap_items("  SASS ", "       ", &items, ", ");
        assert!(listed.lines().count() > 1, "{listed}");
        for l in listed.lines() {
            assert!(
                columns(l) <= WIDTH && l.trim_end().ends_with(['3', ',']),
                "{l:?}"
            );
        }
        assert_eq!(fit("short", 10), ("short".to_string(), false));
        let (cut, was) = fit("one two three four five six", 14);
        assert!(was && columns(&cut) <= 14 && cut.ends_with('…'), "{cut}");
    }
}
