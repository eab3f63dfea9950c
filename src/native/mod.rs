//! The native backend: builds NCCL with the host's CUDA toolkit, no Docker needed.
//!
//! Discovery ([`discover`]: which tools exist) is kept apart from building. The source is
//! either the user's tree (`--source`, never modified) or a clone of the tag cached in
//! the user's cache directory ([`source`]); the build runs out of tree (NCCL's
//! `BUILDDIR`, a work directory removed in every case) and installs with NCCL's own
//! `install` target (`PREFIX`) into the staging directory, which the pipeline then
//! checks and moves into place.

mod plain;
mod source;
mod toolchain;

pub use source::{check_source_dir, parse_version_mk, repo_key, source_for, NCCL_REPO, REPO_ENV};
pub use toolchain::{discover, parse_gpu_archs, parse_nvcc_version};

use crate::nccl::build::Backend;
use crate::nccl::plan::{BuildPlan, NativePlan, NativeSource, Toolkit};
use crate::process;
use crate::progress::{self, Phase, Progress};
use anyhow::{anyhow, Context, Result};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the host offers for a native build, and what it lacks.
#[derive(Debug, Clone, Default)]
pub struct ToolchainReport {
    pub toolkit: Option<Toolkit>,
    /// make, c++, python3, git: each found one.
    pub tools: BTreeMap<String, PathBuf>,
    /// One entry per missing tool, saying what to install or set.
    pub missing: Vec<String>,
}

impl ToolchainReport {
    pub fn is_complete(&self) -> bool {
        self.toolkit.is_some() && self.missing.is_empty()
    }
}

/// NCCL's makefiles find the CUDA libraries at `$(CUDA_HOME)/lib64` unless `CUDA_LIB`
/// says otherwise; a toolkit in the wheels' `lib/` layout needs it said. `cuda_home` is
/// the toolkit's home as make will see it (see [`plain`]).
fn cuda_lib_var(toolkit: &Toolkit, cuda_home: &Path) -> Option<String> {
    if toolkit.lib_dir == toolkit.cuda_home.join("lib64") {
        return None;
    }
    let lib = match toolkit.lib_dir.strip_prefix(&toolkit.cuda_home) {
        Ok(rel) => cuda_home.join(rel),
        Err(_) => toolkit.lib_dir.clone(),
    };
    Some(format!("CUDA_LIB={}", lib.display()))
}

/// The make command lines a native build runs: `src.build` then `install`, with the
/// plan's make variables, the out-of-tree `BUILDDIR` and `PREFIX` set to `staging`.
/// NCCL's `install` depends on its build, so it gets the same variables — otherwise it
/// would rebuild for its default archs. Empty for plans of another backend. The paths
/// are given as make will see them: a build passes plain aliases ([`plain`]).
pub fn make_commands(
    plan: &BuildPlan,
    source: &Path,
    build_dir: &Path,
    staging: &Path,
    cuda_home: &Path,
) -> Vec<Vec<String>> {
    let Some(native) = &plan.native else {
        return Vec::new();
    };
    let vars: Vec<String> = native
        .make_vars
        .iter()
        .map(|(k, v)| match k.as_str() {
            "CUDA_HOME" => format!("{k}={}", cuda_home.display()),
            _ => format!("{k}={v}"),
        })
        .chain(cuda_lib_var(&native.toolkit, cuda_home))
        .collect();
    let make = |target: &str, extra: &[String]| -> Vec<String> {
        let mut argv = vec![
            "make".to_string(),
            "-C".into(),
            source.display().to_string(),
            format!("-j{}", plan.jobs),
            target.into(),
            format!("BUILDDIR={}", build_dir.display()),
        ];
        argv.extend_from_slice(extra);
        argv.extend(vars.iter().cloned());
        argv
    };
    vec![
        make("src.build", &[]),
        make("install", &[format!("PREFIX={}", staging.display())]),
    ]
}

/// Prefix of the work directories (NCCL's `BUILDDIR`) made beside the staging directory.
const WORK_PREFIX: &str = ".native-work-";

/// A build's work directory, removed when dropped — after success, failure or Ctrl-C.
struct WorkDir(PathBuf);

impl WorkDir {
    fn create(builds_dir: &Path, name: &str) -> Result<WorkDir> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("{WORK_PREFIX}{name}-"))
            .tempdir_in(builds_dir)
            .with_context(|| {
                format!("cannot create a work directory in {}", builds_dir.display())
            })?;
        Ok(WorkDir(dir.keep()))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!(
                    "warning: could not remove the work directory {}: {e}",
                    self.0.display()
                );
            }
        }
    }
}

/// Work directories of build `name` left by an fdl that was killed. The caller holds the
/// build's lock, so none of them belongs to a running build.
fn remove_stale_work_dirs(builds_dir: &Path, name: &str, progress: &Progress) {
    let prefix = format!("{WORK_PREFIX}{name}-");
    let Ok(entries) = std::fs::read_dir(builds_dir) else {
        return;
    };
    for e in entries.flatten() {
        let file_name = e.file_name();
        // What follows the prefix is tempfile's random part, which has no '-'; a longer
        // name (`<name>-ptx`) is another build, under another lock, and is left alone.
        let ours = file_name
            .to_string_lossy()
            .strip_prefix(&prefix)
            .is_some_and(|rest| !rest.is_empty() && !rest.contains('-'));
        if ours {
            progress.output(&format!(
                "==> fdl: removing the work directory of an earlier, killed build: {}",
                e.path().display()
            ));
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

pub struct NativeBackend;

impl Backend for NativeBackend {
    fn build(&self, plan: &BuildPlan, staging: &Path, progress: &Progress) -> Result<()> {
        let native = plan
            .native
            .as_ref()
            .ok_or_else(|| anyhow!("the native backend was given a plan for {}", plan.backend))?;
        // make runs in the source tree: every path it gets must be absolute.
        let staging = std::path::absolute(staging)?;
        let builds_dir = staging
            .parent()
            .ok_or_else(|| anyhow!("the staging directory has no parent"))?;
        remove_stale_work_dirs(builds_dir, &plan.name, progress);

        let source = match &native.source {
            NativeSource::Dir { path, .. } => {
                // Checked when planning; checked again in case the tree changed since.
                check_source_dir(path, &plan.tag)?.0
            }
            NativeSource::Clone { repo, cache_dir } => {
                let git = tool(native, "git");
                source::ensure_clone(repo, &plan.tag, cache_dir, &git, progress)?
            }
        };

        let work = WorkDir::create(builds_dir, &plan.name)?;
        // Every path make puts into a recipe is a plain word, whatever the project root,
        // the source or the toolkit are called.
        let mut aliases = plain::Aliases::new(&crate::cache::cache_dir())?;
        let commands = make_commands(
            plan,
            &aliases.plain(&source)?,
            &aliases.plain(&work.0)?,
            &aliases.plain(&staging)?,
            &aliases.plain(&native.toolkit.cuda_home)?,
        );
        for (old, new) in aliases.made() {
            progress.output(&format!(
                "==> fdl: make sees {} as {}",
                old.display(),
                new.display()
            ));
        }
        let env = make_env(native);

        progress.phase(Phase::Compile);
        let total = count_compiles(native, &commands[0], &env, progress);
        if let Some(total) = total {
            progress.set_total(total);
        }
        run_make(
            native,
            &commands[0],
            &env,
            progress,
            total,
            "make src.build (compiling NCCL)",
        )?;
        progress.phase(Phase::Install);
        run_make(native, &commands[1], &env, progress, None, "make install")?;
        Ok(())
    }
}

/// The discovered path of `name`, or the bare name for PATH to resolve.
fn tool(native: &NativePlan, name: &str) -> PathBuf {
    native
        .tools
        .get(name)
        .cloned()
        .unwrap_or_else(|| PathBuf::from(name))
}

/// The environment changes for make: the toolkit's nvcc first on PATH and its CUDA_HOME,
/// so NCCL's own `$(shell nvcc ...)` probes see the same toolkit the plan checked; the
/// C++ compiler discovery found as `CXX`; and no `MAKEFLAGS` of an outer make, whose
/// flags (`-n`, `-k`, a jobserver) would change what this build does.
fn make_env(native: &NativePlan) -> Vec<(OsString, Option<OsString>)> {
    let mut path: Vec<PathBuf> = native
        .toolkit
        .nvcc
        .parent()
        .map(Path::to_path_buf)
        .into_iter()
        .collect();
    if let Some(current) = std::env::var_os("PATH") {
        path.extend(std::env::split_paths(&current));
    }
    let mut env = vec![
        (OsString::from("PATH"), std::env::join_paths(path).ok()),
        (
            "CUDA_HOME".into(),
            Some(native.toolkit.cuda_home.clone().into_os_string()),
        ),
        ("MAKEFLAGS".into(), None),
        ("MFLAGS".into(), None),
        ("MAKELEVEL".into(), None),
    ];
    if let Some(cxx) = native.tools.get("c++") {
        env.push(("CXX".into(), Some(cxx.clone().into_os_string())));
    }
    env
}

fn command(native: &NativePlan, argv: &[String], env: &[(OsString, Option<OsString>)]) -> Command {
    let mut cmd = Command::new(tool(native, "make"));
    cmd.args(&argv[1..]);
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    cmd
}

/// How many files `src.build` will compile, from a dry run (`make -n`) counting NCCL's
/// `Compiling` lines. `None` when the dry run fails or finds none: the progress then
/// shows a count without a total. Should the count fall short, [`run_make`] raises the
/// total as files go by, so the display never reads "120/100". (Under `-n`, make still
/// remakes included makefiles, such as NCCL's generated kernel lists — into the work
/// directory, where the real build then reuses them.)
fn count_compiles(
    native: &NativePlan,
    build: &[String],
    env: &[(OsString, Option<OsString>)],
    progress: &Progress,
) -> Option<u64> {
    let mut argv = build.to_vec();
    argv.insert(1, "-n".into());
    let mut cmd = command(native, &argv, env);
    cmd.stdin(std::process::Stdio::null());
    match process::capture(&mut cmd, "make -n src.build") {
        Ok(text) => {
            let n = text
                .lines()
                .filter(|l| {
                    l.split_whitespace()
                        .any(|w| w.trim_matches('"') == "Compiling")
                })
                .count() as u64;
            progress.output(&format!("==> fdl: make -n counts {n} files to compile"));
            (n > 0).then_some(n)
        }
        Err(e) => {
            progress.output(&format!(
                "==> fdl: cannot count the files to compile ({e:#}); progress shows no total"
            ));
            None
        }
    }
}

/// Runs one make command, its output to the log (and the terminal when verbose), its
/// `Compiling`/`Linking` lines to the progress.
fn run_make(
    native: &NativePlan,
    argv: &[String],
    env: &[(OsString, Option<OsString>)],
    progress: &Progress,
    mut total: Option<u64>,
    what: &str,
) -> Result<()> {
    progress.output(&format!("==> fdl: {}", argv.join(" ")));
    let mut cmd = command(native, argv, env);
    cmd.stdin(std::process::Stdio::null());
    let mut linking = false;
    let mut compiled = 0u64;
    process::stream(&mut cmd, what, &mut |line| {
        progress.output(line);
        match progress::nccl_make_event(line) {
            Some((Phase::Compile, file)) if !linking => {
                compiled += 1;
                if total.is_some_and(|t| compiled > t) {
                    total = Some(compiled);
                    progress.set_total(compiled);
                }
                progress.advance(&file);
            }
            // NCCL links once everything is compiled; the phase stays at link after
            // that even if a helper is compiled late.
            Some((Phase::Link, file)) if !linking => {
                linking = true;
                progress.phase(Phase::Link);
                progress.advance(&file);
            }
            Some((_, file)) => progress.advance(&file),
            None => {}
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Arch;
    use crate::nccl::plan::{ArchOrigin, BackendInputs, PlanInputs, TagOrigin};
    use crate::nccl::tag::Tag;

    fn plan(lib: &str, only_funcs: Option<&str>) -> BuildPlan {
        BuildPlan::new(PlanInputs {
            tag: Tag::parse("v2.27.5-1").unwrap(),
            tag_origin: TagOrigin::Flag,
            cuda_flag: None,
            cuda_from_libtorch: None,
            archs: vec![Arch::new(8, 6)],
            arch_origin: ArchOrigin::Flag,
            jobs: 3,
            jobs_reason: "test".into(),
            builds_dir: PathBuf::from("/p/builds"),
            backend: BackendInputs::Native {
                toolkit: Toolkit {
                    cuda_home: PathBuf::from("/opt/cuda"),
                    nvcc: PathBuf::from("/opt/cuda/bin/nvcc"),
                    cuda: "12.8.93".parse().unwrap(),
                    gpu_archs: None,
                    lib_dir: PathBuf::from("/opt/cuda").join(lib),
                },
                tools: BTreeMap::new(),
                source: NativeSource::Clone {
                    repo: "r".into(),
                    cache_dir: PathBuf::from("/c"),
                },
                allow_cuda_mismatch: false,
            },
            backend_reason: "test".into(),
            ptx: false,
            only_funcs: only_funcs.map(str::to_string),
        })
        .unwrap()
    }

    #[test]
    fn make_commands_build_then_install_with_the_same_variables() {
        let cmds = make_commands(
            &plan("lib64", Some("AllReduce Sum f32")),
            Path::new("/src"),
            Path::new("/w"),
            Path::new("/s"),
            Path::new("/opt/cuda"),
        );
        let gencode = "NVCC_GENCODE=-gencode=arch=compute_86,code=sm_86";
        assert_eq!(
            cmds,
            vec![
                vec![
                    "make",
                    "-C",
                    "/src",
                    "-j3",
                    "src.build",
                    "BUILDDIR=/w",
                    gencode,
                    "CUDA_HOME=/opt/cuda",
                    "ONLY_FUNCS=AllReduce Sum f32"
                ],
                vec![
                    "make",
                    "-C",
                    "/src",
                    "-j3",
                    "install",
                    "BUILDDIR=/w",
                    "PREFIX=/s",
                    gencode,
                    "CUDA_HOME=/opt/cuda",
                    "ONLY_FUNCS=AllReduce Sum f32"
                ],
            ]
        );
    }

    #[test]
    fn wheel_layout_names_its_lib_dir() {
        let cmds = make_commands(
            &plan("lib", None),
            Path::new("/src"),
            Path::new("/w"),
            Path::new("/s"),
            Path::new("/opt/cuda"),
        );
        for c in &cmds {
            assert_eq!(c.last().unwrap(), "CUDA_LIB=/opt/cuda/lib");
        }
        // As make sees it through a plain alias of the toolkit's home.
        let aliased = make_commands(
            &plan("lib", None),
            Path::new("/src"),
            Path::new("/w"),
            Path::new("/s"),
            Path::new("/c/paths/abc"),
        );
        assert!(aliased[0].contains(&"CUDA_HOME=/c/paths/abc".to_string()));
        assert_eq!(aliased[0].last().unwrap(), "CUDA_LIB=/c/paths/abc/lib");
    }

    #[test]
    fn work_dir_is_removed_on_drop() {
        let t = tempfile::tempdir().unwrap();
        let w = WorkDir::create(t.path(), "v2.27.5-sm86").unwrap();
        std::fs::write(w.0.join("x.o"), "obj").unwrap();
        assert!(w
            .0
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(".native-work-v2.27.5-sm86-"));
        drop(w);
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 0);
    }
}
