//! Where the project lives. The root is `--root`, else `$FDL_ROOT`, else the nearest
//! ancestor of the working directory that is a project, else the working directory — so
//! fdl works from any subdirectory of a project, like git does.
//!
//! A project has `fdl.yml`, or a `libtorch/` laid out as floDl lays it (an `.active`
//! file, or `precompiled/`, `builds/` or `nccl/` inside). The official libtorch archive
//! unpacks to a directory named `libtorch/` too, but one holding `lib/libtorch_cuda.so` or
//! `build-version`: that is a libtorch distribution, never a project, so an archive
//! unpacked in `~` does not make `~` a project.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// An error that no project root would change, so the CLI names none beside it: what the
/// command line itself says (a flag's value, such as a malformed `--archs`; a file it
/// names, such as `--source`), or the problems of a plan, which name their own paths.
#[derive(Debug, thiserror::Error)]
#[error("{0:#}")]
pub struct RootIrrelevant(pub anyhow::Error);

impl RootIrrelevant {
    /// Whether `e` is, or wraps, one.
    pub fn is_in(e: &anyhow::Error) -> bool {
        e.chain().any(|c| c.is::<RootIrrelevant>())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootSource {
    Flag,
    Env,
    Marker,
    WorkingDir,
}

#[derive(Debug, Clone)]
pub struct Project {
    pub root: PathBuf,
    pub source: RootSource,
}

impl Project {
    /// Resolves the root from the flag, the environment value and the working directory.
    /// Pure apart from probing the file system for markers.
    pub fn discover(flag: Option<&Path>, env: Option<&Path>, cwd: &Path) -> Project {
        if let Some(p) = flag {
            return Project {
                root: absolute(p, cwd),
                source: RootSource::Flag,
            };
        }
        if let Some(p) = env.filter(|p| !p.as_os_str().is_empty()) {
            return Project {
                root: absolute(p, cwd),
                source: RootSource::Env,
            };
        }
        for dir in cwd.ancestors() {
            if dir.join("fdl.yml").is_file() || is_project_libtorch(&dir.join("libtorch")) {
                return Project {
                    root: dir.to_path_buf(),
                    source: RootSource::Marker,
                };
            }
        }
        Project {
            root: cwd.to_path_buf(),
            source: RootSource::WorkingDir,
        }
    }

    /// The root as the process sees it: `--root`, `$FDL_ROOT`, the working directory.
    pub fn from_process(flag: Option<&Path>) -> Result<Project> {
        let cwd = std::env::current_dir().context("cannot read the working directory")?;
        let env = std::env::var_os("FDL_ROOT").map(PathBuf::from);
        Ok(Project::discover(flag, env.as_deref(), &cwd))
    }

    /// A root named by `--root` or `$FDL_ROOT` must exist: a typo would otherwise read
    /// as an empty project ("No NCCL builds in …").
    pub fn check_exists(&self) -> Result<()> {
        let named = match self.source {
            RootSource::Flag => "--root",
            RootSource::Env => "$FDL_ROOT",
            RootSource::Marker | RootSource::WorkingDir => return Ok(()),
        };
        match std::fs::metadata(&self.root) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => anyhow::bail!(
                "the project root {} ({named}) is not a directory: name the project's directory with {named}",
                self.root.display()
            ),
            Err(_) => anyhow::bail!(
                "the project root {} ({named}) does not exist: name an existing project directory with {named}{}",
                self.root.display(),
                if self.source == RootSource::Env {
                    ", or unset FDL_ROOT to find the project from the working directory"
                } else {
                    ""
                }
            ),
        }
    }

    /// When the root is only the working directory (no project was found above it), a
    /// line saying so: plans and listings show it, since nothing else would.
    pub fn fallback_note(&self) -> Option<String> {
        self.fell_back().then(|| fallback_sentence(&self.root))
    }

    /// The root is the working directory because nothing above it marked a project.
    pub fn fell_back(&self) -> bool {
        self.source == RootSource::WorkingDir
    }

    /// Which root this is and why, for messages.
    pub fn describe(&self) -> String {
        let why = match self.source {
            RootSource::Flag => "from --root",
            RootSource::Env => "from $FDL_ROOT",
            RootSource::Marker => "the nearest directory holding fdl.yml or a project's libtorch/",
            RootSource::WorkingDir => {
                "the working directory: no fdl.yml or project libtorch/ above it"
            }
        };
        format!("{} ({why})", self.root.display())
    }

    pub fn libtorch_dir(&self) -> PathBuf {
        self.root.join("libtorch")
    }

    /// `libtorch/nccl/builds`, where every NCCL build lives.
    pub fn nccl_builds_dir(&self) -> PathBuf {
        self.libtorch_dir().join("nccl").join("builds")
    }
}

/// Whether `dir` is a project's `libtorch/` rather than an unpacked libtorch archive.
fn is_project_libtorch(dir: &Path) -> bool {
    let distribution =
        dir.join("lib/libtorch_cuda.so").exists() || dir.join("build-version").is_file();
    !distribution
        && (dir.join(".active").is_file()
            || ["precompiled", "builds", "nccl"]
                .iter()
                .any(|d| dir.join(d).is_dir()))
}

fn absolute(p: &Path, cwd: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        cwd.join(p)
    }
}

/// The note of a root that fell back to the working directory `root`.
pub fn fallback_sentence(root: &Path) -> String {
    format!(
        "the project root is the working directory {}: no fdl.yml or project libtorch/ was found above it. Pass --root DIR (or set FDL_ROOT) if the project is elsewhere",
        root.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence_flag_env_marker_cwd() {
        let t = tempfile::tempdir().unwrap();
        let proj = t.path().join("proj");
        let deep = proj.join("a/b");
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::create_dir_all(proj.join("libtorch/precompiled")).unwrap();

        let p = Project::discover(Some(Path::new("x")), Some(Path::new("/e")), &deep);
        assert_eq!((p.root, p.source), (deep.join("x"), RootSource::Flag));
        let p = Project::discover(None, Some(Path::new("/e")), &deep);
        assert_eq!((p.root, p.source), (PathBuf::from("/e"), RootSource::Env));
        let p = Project::discover(None, None, &deep);
        assert_eq!((p.root, p.source), (proj.clone(), RootSource::Marker));
        let other = t.path().join("other");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("fdl.yml"), "").unwrap();
        let p = Project::discover(None, Some(Path::new("")), &other);
        assert_eq!(p.source, RootSource::Marker);
    }

    /// An unpacked libtorch archive is a `libtorch/` too, but not a project: a home
    /// holding one is not taken as the root of everything below it.
    #[test]
    fn an_unpacked_libtorch_is_never_a_project() {
        let t = tempfile::tempdir().unwrap();
        let home = t.path();
        std::fs::create_dir_all(home.join("libtorch/lib")).unwrap();
        std::fs::write(home.join("libtorch/lib/libtorch_cuda.so"), "elf").unwrap();
        std::fs::write(home.join("libtorch/build-version"), "2.8.0+cu128\n").unwrap();
        let work = home.join("work/here");
        std::fs::create_dir_all(&work).unwrap();
        let p = Project::discover(None, None, &work);
        assert_eq!(
            (p.root.clone(), p.source),
            (work.clone(), RootSource::WorkingDir)
        );
        assert!(p.describe().contains("no fdl.yml"), "{}", p.describe());
        // An empty libtorch/ is not a project either; one with variants is.
        std::fs::create_dir_all(home.join("work/libtorch")).unwrap();
        assert_eq!(
            Project::discover(None, None, &work).source,
            RootSource::WorkingDir
        );
        std::fs::create_dir_all(home.join("work/libtorch/precompiled")).unwrap();
        let p = Project::discover(None, None, &work);
        assert_eq!((p.root, p.source), (home.join("work"), RootSource::Marker));
    }
}
