//! A step of a build: one external command, as a value.
//!
//! Backends turn their part of a plan into named steps; `--dry-run` renders them and the
//! run executes the very same values, so what is shown is what runs. Arguments are
//! `OsString`s all the way to `exec`, so no path is altered on the way.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;

/// How a step changes one environment variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvChange {
    Set(OsString),
    Unset,
    /// Put a directory in front of the inherited `PATH`.
    PrependPath(PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// What the step is, for progress and errors: `docker build`, `make install`.
    pub what: String,
    pub program: OsString,
    pub args: Vec<OsString>,
    pub env: Vec<(String, EnvChange)>,
    pub cwd: Option<PathBuf>,
    /// What it leaves behind, for the plan's reader.
    pub produces: String,
}

impl Step {
    pub fn new(what: &str, program: impl Into<OsString>, produces: &str) -> Step {
        Step {
            what: what.to_string(),
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: None,
            produces: produces.to_string(),
        }
    }

    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Step {
        self.args.push(a.as_ref().to_os_string());
        self
    }

    /// `KEY=VALUE` as one argument (make variables, docker build args).
    pub fn assign(self, key: &str, value: impl AsRef<OsStr>) -> Step {
        let mut a = OsString::from(key);
        a.push("=");
        a.push(value);
        self.arg(a)
    }

    pub fn env(mut self, key: &str, change: EnvChange) -> Step {
        self.env.push((key.to_string(), change));
        self
    }

    /// The command that runs this step.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        for (k, change) in &self.env {
            match change {
                EnvChange::Set(v) => {
                    cmd.env(k, v);
                }
                EnvChange::Unset => {
                    cmd.env_remove(k);
                }
                EnvChange::PrependPath(dir) => {
                    let mut dirs = vec![dir.clone()];
                    if let Some(current) = std::env::var_os(k) {
                        dirs.extend(std::env::split_paths(&current));
                    }
                    if let Ok(joined) = std::env::join_paths(dirs) {
                        cmd.env(k, joined);
                    }
                }
            }
        }
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        cmd
    }

    /// The step as one shell line, every word quoted where a shell would split or
    /// expand it. Environment changes lead (`env -u X K=V … program …`).
    pub fn render(&self) -> String {
        let mut words: Vec<String> = Vec::new();
        if let Some(dir) = &self.cwd {
            words.push("cd".into());
            words.push(quote(dir.as_os_str()));
            words.push("&&".into());
        }
        let unset: Vec<&String> = self
            .env
            .iter()
            .filter(|(_, c)| *c == EnvChange::Unset)
            .map(|(k, _)| k)
            .collect();
        if !unset.is_empty() {
            words.push("env".into());
            for k in unset {
                words.push("-u".into());
                words.push(k.clone());
            }
        }
        for (k, c) in &self.env {
            match c {
                EnvChange::Set(v) => words.push(format!("{k}={}", quote(v))),
                EnvChange::PrependPath(dir) => {
                    words.push(format!("{k}={}:\"${k}\"", quote(dir.as_os_str())))
                }
                EnvChange::Unset => {}
            }
        }
        words.push(quote(&self.program));
        words.extend(self.args.iter().map(|a| quote(a)));
        words.join(" ")
    }
}

/// One shell word for `s`: as is when every character is one no POSIX shell treats
/// specially, else single-quoted with each `'` written `'\''`. Bytes that are not UTF-8
/// are shown as U+FFFD (the step itself keeps them).
pub fn quote(s: &OsStr) -> String {
    let text = s.to_string_lossy();
    let plain = !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_@%+=:,./-".contains(&b));
    if plain {
        text.into_owned()
    } else {
        single_quote(&text)
    }
}

/// One POSIX shell word, always quoted: single quotes, each `'` written as `'\''`.
/// Nothing inside single quotes is expanded, newlines included.
pub fn single_quote(s: &str) -> String {
    crate::paste::shell(s)
}

/// The private paths a step runs with, named in a dry run (`<staging>`) and real in a
/// run; a run prints the mapping, so its steps can be read against the dry run's.
#[derive(Debug, Clone)]
pub struct Paths {
    pub entries: Vec<(&'static str, PathBuf)>,
}

impl Paths {
    /// Placeholders named after each key: `<staging>`.
    pub fn placeholders(keys: &[&'static str]) -> Paths {
        Paths {
            entries: keys
                .iter()
                .map(|k| (*k, PathBuf::from(format!("<{k}>"))))
                .collect(),
        }
    }

    pub fn get(&self, key: &str) -> &Path {
        self.entries
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, p)| p.as_path())
            .unwrap_or_else(|| Path::new("<?>"))
    }

    /// `<staging> = /p/…, <build-dir> = …`: how a run's steps read against a dry run's.
    pub fn describe(&self) -> String {
        self.entries
            .iter()
            .map(|(k, p)| format!("<{k}> = {}", quote(p.as_os_str())))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_what_a_shell_would_run() {
        let s = Step::new("make install", "make", "the tree")
            .arg("-C")
            .arg("/src dir")
            .assign("PREFIX", "/p/$(x)")
            .env("MAKEFLAGS", EnvChange::Unset)
            .env("CUDA_HOME", EnvChange::Set("/opt/cuda".into()))
            .env("PATH", EnvChange::PrependPath("/opt/cuda/bin".into()));
        assert_eq!(
            s.render(),
            "env -u MAKEFLAGS CUDA_HOME=/opt/cuda PATH=/opt/cuda/bin:\"$PATH\" make -C '/src dir' 'PREFIX=/p/$(x)'"
        );
        assert_eq!(quote(OsStr::new("it's")), r"'it'\''s'");
        let cmd = s.command();
        assert_eq!(cmd.get_program(), "make");
        assert_eq!(cmd.get_args().count(), 3);
    }
}
