//! Where the project lives. The root is `--root`, else `$FDL_ROOT`, else the nearest
//! ancestor of the working directory holding `fdl.yml` or `libtorch/`, else the working
//! directory — so fdl works from any subdirectory of a project, like git does.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

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
            if dir.join("fdl.yml").is_file() || dir.join("libtorch").is_dir() {
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

    pub fn libtorch_dir(&self) -> PathBuf {
        self.root.join("libtorch")
    }

    /// `libtorch/nccl/builds`, where every NCCL build lives.
    pub fn nccl_builds_dir(&self) -> PathBuf {
        self.libtorch_dir().join("nccl").join("builds")
    }
}

fn absolute(p: &Path, cwd: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        cwd.join(p)
    }
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
        std::fs::create_dir_all(proj.join("libtorch")).unwrap();

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
}
