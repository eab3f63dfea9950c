//! Text that reaches the user's terminal: what came from outside fdl made safe to print
//! ([`clean`] for a field, [`terminal_safe`] as the backstop for whole lines), and fdl's
//! own colours. A ground-floor module: every concern that quotes a file, a library, a
//! worker or an engine in a message uses it, so none of them needs `cli`.

/// The backstop under [`clean`] for whole lines of output: every control character but
/// newline and tab is escaped, except fdl's own colour codes (`ESC [ digits m`, which
/// only colour text). Fields from outside are cleaned where they are printed (that also
/// escapes their newlines, so no line can be forged); this catches the rest, so no
/// output of fdl can retitle, clear or move about the user's terminal.
pub fn terminal_safe(text: &str) -> String {
    let bytes = text.as_bytes();
    let is_sgr = |at: usize| {
        let rest = &bytes[at..];
        rest.len() >= 3 && rest[1] == b'[' && {
            let n = rest[2..]
                .iter()
                .take_while(|b| b.is_ascii_digit() || **b == b';')
                .count();
            rest.get(2 + n) == Some(&b'm')
        }
    };
    let needs = text.char_indices().any(|(i, c)| {
        (c.is_control() && c != '\n' && c != '\t' && !(c == '\x1b' && is_sgr(i)))
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    });
    if !needs {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    for (i, c) in text.char_indices() {
        if c == '\n' || c == '\t' || (c == '\x1b' && is_sgr(i)) {
            out.push(c);
        } else {
            out.push_str(&clean(c.encode_utf8(&mut [0; 4])));
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

/// `text` in `color` when it goes to a terminal on stdout.
/// Text that came from outside fdl (a file, a library, a worker), made safe to print: every
/// control character (escape sequences, carriage returns, bidi controls are not
/// excepted) is written as a visible `\u{…}` escape, so nothing can retitle, clear or
/// forge lines of the user's terminal.
pub fn clean(text: &str) -> String {
    let bad = |c: char| {
        c.is_control()
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
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
    let code = match color {
        Color::Red => 31,
        Color::Yellow => 33,
        Color::Green => 32,
    };
    format!("\x1b[{code}m{text}\x1b[0m")
}
