//! Text fdl prints for the user to paste or `eval`: one quoting function per parser that
//! reads it, used by every command that prints such a line (`nccl env`, `cluster env`,
//! the build report). A value from outside (a project path, a worker's answer) must
//! reach that parser as one literal value, or not be printed at all.
//!
//! - [`shell`]: a POSIX shell word (bash, sh, a batch script), single-quoted.
//! - [`yaml`]: a YAML double-quoted scalar (a worker's `env:` block).
//! - [`comment`]: text on a `#` line, which no parser reads but a newline would end.
//! - [`srun`]: the per-step form for Slurm, whose `--export=` list no quoting protects
//!   (it splits at commas after the shell has unquoted it), so the value never goes in
//!   it: the shell sets it for srun, and `--export=ALL` hands it to every task.

/// `s` as one word of a POSIX shell: single quotes keep everything literal (`$(…)`,
/// backticks, `\`, `!`, newlines), and a single quote is closed, escaped and reopened.
pub fn shell(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `s` as a YAML double-quoted scalar: `"` and `\` escaped, and every character YAML
/// does not allow raw or would read as a line break (C0 and C1 controls, DEL, the BOM,
/// U+2028/U+2029) written as an escape, so the scalar is one line whatever `s` holds.
pub fn yaml(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() || c == '\u{feff}' || c == '\u{2028}' || c == '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Text for a `#` comment line: control characters (a newline would end the comment and
/// make the rest a command) become spaces.
pub fn comment(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// The Slurm per-step line that runs a launcher with `LD_PRELOAD=value` in every task:
/// `LD_PRELOAD='…' srun --export=ALL`. srun reads `--export=` as a comma-separated list
/// of names and `NAME=value`s, so a value there with a comma would set a second variable
/// (`,LD_LIBRARY_PATH=/evil`); set by the shell, the value is never in that list.
pub fn srun(var: &str, value: &str) -> String {
    format!("{var}={} srun --export=ALL", shell(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each form, given to the parser it is for, gives back the value exactly, and runs
    /// nothing of it: `bash -c` on the shell and srun lines, a YAML reader on the scalar.
    #[test]
    fn each_form_gives_its_parser_the_value_and_runs_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let ran = dir.path().join("ran");
        let hostile = format!(
            "/p/$(touch {r})/`touch {r}`/'q'/\"d\"/a,LD_LIBRARY_PATH=/evil/sp ace/\\$HOME/!x/\nnext\t|;&",
            r = ran.display()
        );
        let line = format!(
            "export LD_PRELOAD={}; printf %s \"$LD_PRELOAD\"",
            shell(&hostile)
        );
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(&line)
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), hostile);
        // The srun form as bash parses it: the words bash would run srun with, and the
        // environment it would hand srun (the real srun is run in tests/it/cluster_slurm.rs).
        let probe = format!(
            "{}; printf '%s\\0' \"$@\"",
            srun("LD_PRELOAD", &hostile).replacen(" srun ", " printenv LD_PRELOAD; set -- ", 1)
        );
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(&probe)
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("{hostile}\n--export=ALL\0")
        );
        assert!(!srun("LD_PRELOAD", &hostile).contains("--export=ALL,"));
        assert!(!ran.exists(), "a quoted line ran code");

        let text = format!(
            "env:\n  LD_PRELOAD: {}\n",
            yaml(&format!("{hostile}\u{7f}\u{85}\"\\"))
        );
        assert_eq!(text.lines().count(), 2, "{text}");
        let doc = marked_yaml::parse_yaml(0, &text).unwrap();
        let got = doc
            .as_mapping()
            .and_then(|m| m.get_mapping("env"))
            .and_then(|m| m.get_scalar("LD_PRELOAD"))
            .map(|s| s.as_str().to_string());
        assert_eq!(got, Some(format!("{hostile}\u{7f}\u{85}\"\\")));

        assert_eq!(comment("a\nrm -rf x\rb"), "a rm -rf x b");
    }
}
