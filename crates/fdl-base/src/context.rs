//! What fdl takes from around it, read once and handed down the line: the environment it
//! reads ([`Env`]), its cache directory (resolved from that environment once, on first
//! use), and where the messages said below the CLI go ([`Reporter`]: the CLI's prints to
//! stderr, a test's collects them). As cargo's `GlobalContext` and rustup's `Process`: a
//! module that needs one of these is handed the [`Context`] instead of reaching for the
//! process's environment or its stderr, so a test can give it other ones.

use anyhow::Result;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// The environment variables fdl's own behaviour depends on (not those it passes on to
/// the tools it runs), read once.
#[derive(Debug, Clone, Default)]
pub struct Env {
    pub xdg_cache_home: Option<OsString>,
    pub home: Option<OsString>,
}

impl Env {
    /// This process's.
    pub fn from_process() -> Env {
        Env {
            xdg_cache_home: std::env::var_os("XDG_CACHE_HOME"),
            home: std::env::var_os("HOME"),
        }
    }
}

/// Where a line that code below the CLI has to say goes: a warning, or what was done
/// beside the answer (a leftover removed, a wait for a lock). The line is fdl's own
/// sentence; paths in it are the caller's to clean.
pub trait Reporter: Send + Sync {
    fn say(&self, line: &str);
}

/// Says each line on stderr, made terminal-safe: the CLI's reporter.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stderr;

impl Reporter for Stderr {
    fn say(&self, line: &str) {
        crate::eprintln_safe!("{line}");
    }
}

/// One run's context, cheap to clone (shared).
#[derive(Clone)]
pub struct Context(Arc<Inner>);

struct Inner {
    env: Env,
    /// Resolved on first use: a command that never needs the cache never fails for it.
    cache: OnceLock<std::result::Result<PathBuf, String>>,
    reporter: Box<dyn Reporter>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("env", &self.0.env)
            .field("cache", &self.0.cache.get())
            .finish_non_exhaustive()
    }
}

impl Context {
    pub fn new(env: Env, reporter: Box<dyn Reporter>) -> Context {
        Context(Arc::new(Inner {
            env,
            cache: OnceLock::new(),
            reporter,
        }))
    }

    /// This process's environment, saying on stderr: what the binary runs with.
    pub fn from_process() -> Context {
        Context::new(Env::from_process(), Box::new(Stderr))
    }

    pub fn env(&self) -> &Env {
        &self.0.env
    }

    /// fdl's cache directory ([`crate::cache::cache_dir_for`]), resolved once per run.
    pub fn cache(&self) -> Result<PathBuf> {
        self.0
            .cache
            .get_or_init(|| {
                let env = &self.0.env;
                crate::cache::cache_dir_for(env.xdg_cache_home.clone(), env.home.clone())
                    .map_err(|e| format!("{e:#}"))
            })
            .clone()
            .map_err(|e| anyhow::anyhow!(e))
    }

    /// Says `line` through the reporter.
    pub fn say(&self, line: &str) {
        self.0.reporter.say(line);
    }

    pub fn reporter(&self) -> &dyn Reporter {
        self.0.reporter.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Collects what is said, for a test to read.
    #[derive(Default)]
    struct Collect(Arc<Mutex<Vec<String>>>);

    impl Reporter for Collect {
        fn say(&self, line: &str) {
            self.0.lock().unwrap().push(line.to_string());
        }
    }

    #[test]
    fn the_cache_comes_from_the_given_environment_once_and_lines_go_to_the_reporter() {
        let said = Arc::new(Mutex::new(Vec::new()));
        let env = Env {
            xdg_cache_home: Some("/somewhere/cache".into()),
            home: Some("/home/else".into()),
        };
        let ctx = Context::new(env, Box::new(Collect(said.clone())));
        assert_eq!(ctx.cache().unwrap(), PathBuf::from("/somewhere/cache/fdl"));
        let other = ctx.clone();
        assert_eq!(
            other.cache().unwrap(),
            PathBuf::from("/somewhere/cache/fdl")
        );
        other.say("warning: one");
        assert_eq!(*said.lock().unwrap(), ["warning: one"]);
        let home_only = Context::new(
            Env {
                xdg_cache_home: Some("relative".into()),
                home: Some("/home/me".into()),
            },
            Box::new(Stderr),
        );
        assert_eq!(
            home_only.cache().unwrap(),
            PathBuf::from("/home/me/.cache/fdl")
        );
    }
}
