//! The native backend: builds NCCL with the host's CUDA toolkit, no Docker needed.
//!
//! Discovery ([`discover`]: which tools exist) is kept apart from building. The source is
//! either the user's tree (`--source`, never modified) or a clone of the tag cached in
//! the user's cache directory ([`source`]); the build runs out of tree (NCCL's
//! `BUILDDIR`, a work directory removed in every case) and installs with NCCL's own
//! `install` target (`PREFIX`) into the staging directory, which the pipeline then
//! checks and moves into place.

pub(crate) mod plain;
mod planned;
mod source;
mod toolchain;

pub use source::{
    check_source_dir, ensure_clone, parse_version_mk, repo_key, source_for, tree_version,
    NCCL_REPO, REPO_ENV,
};
pub use toolchain::{discover, parse_gpu_archs, parse_nvcc_version, ToolchainReport};

use crate::nccl::backend::Backend;
use crate::nccl::plan::{BackendPlan, BuildPlan, NativePlan, NativeSource, NcclMake, Toolkit};
use crate::process;
use crate::progress::{self, Phase, Progress};
use crate::step::{EnvChange, Paths, Step};
use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// NCCL's makefiles find the CUDA libraries at `$(CUDA_HOME)/lib64` unless `CUDA_LIB`
/// says otherwise; a toolkit in the wheels' `lib/` layout needs it said. `cuda_home` is
/// the toolkit's home as make will see it (see [`plain`]).
fn cuda_lib(toolkit: &Toolkit, cuda_home: &Path) -> Option<PathBuf> {
    if toolkit.lib_dir == toolkit.cuda_home.join("lib64") {
        return None;
    }
    Some(match toolkit.lib_dir.strip_prefix(&toolkit.cuda_home) {
        Ok(rel) => cuda_home.join(rel),
        Err(_) => toolkit.lib_dir.clone(),
    })
}

/// The native backend's steps, by name: a dry run of `src.build` that counts the files
/// to compile (for progress), `src.build`, then `install`. NCCL's `install` depends on
/// its build, so both get the same variables — otherwise `install` would rebuild for its
/// default archs. `paths` holds `source`, `build-dir` (NCCL's out-of-tree `BUILDDIR`),
/// `staging` (`PREFIX`) and `cuda-home`, as make will see them (see [`plain`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NativeSteps {
    pub count: Step,
    pub build: Step,
    pub install: Step,
}

impl NativeSteps {
    pub const PATHS: &'static [&'static str] = &["source", "build-dir", "staging", "cuda-home"];

    pub fn new(native: &NativePlan, jobs: u32, paths: &Paths) -> NativeSteps {
        let cuda_home = paths.get("cuda-home");
        // The plan's variables, with the toolkit's home as make will see it.
        let mut vars: Vec<(String, String)> = native
            .make_vars
            .iter()
            .map(|(k, v)| match k.as_str() {
                "CUDA_HOME" => (k.clone(), cuda_home.display().to_string()),
                _ => (k.clone(), v.clone()),
            })
            .collect();
        if let Some(lib) = cuda_lib(&native.toolkit, cuda_home) {
            vars.push(("CUDA_LIB".to_string(), lib.display().to_string()));
        }
        let make = |what: &str, produces: &str, dry: bool, target: &str| {
            let step = Step::new(what, tool(native, "make"), produces);
            let step = NcclMake {
                source: paths.get("source"),
                jobs,
                dry,
                target,
                build_dir: paths.get("build-dir"),
                prefix: (target == "install").then(|| paths.get("staging")),
                vars: &vars,
            }
            .add_to(step);
            make_env(native, step)
        };
        NativeSteps {
            count: make(
                "make -n src.build",
                "nothing: it counts the files to compile",
                true,
                "src.build",
            ),
            build: make(
                "make src.build (compiling NCCL)",
                "NCCL compiled in <build-dir>",
                false,
                "src.build",
            ),
            install: make(
                "make install",
                "the NCCL install tree in <staging>",
                false,
                "install",
            ),
        }
    }

    pub fn all(&self) -> [&Step; 3] {
        [&self.count, &self.build, &self.install]
    }
}

/// Prefix of the work directories (NCCL's `BUILDDIR`) made beside the staging directory.
pub(crate) const WORK_PREFIX: &str = crate::nccl::store::NATIVE_WORK_PREFIX;

/// A build's work directory, removed when dropped — after success, failure or Ctrl-C; a
/// removal that fails is said through the run's context.
pub(crate) struct WorkDir(pub(crate) PathBuf, crate::context::Context);

impl WorkDir {
    fn create(ctx: &crate::context::Context, builds_dir: &Path, name: &str) -> Result<WorkDir> {
        WorkDir::create_with(ctx, builds_dir, WORK_PREFIX, name)
    }

    /// A work directory `<prefix><name>-<random>` in `builds_dir` (each backend has its
    /// own prefix, so neither sweeps the other's).
    pub(crate) fn create_with(
        ctx: &crate::context::Context,
        builds_dir: &Path,
        prefix: &str,
        name: &str,
    ) -> Result<WorkDir> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("{prefix}{name}-"))
            .tempdir_in(builds_dir)
            .with_context(|| {
                format!("cannot create a work directory in {}", builds_dir.display())
            })?;
        Ok(WorkDir(dir.keep(), ctx.clone()))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            if e.kind() != std::io::ErrorKind::NotFound {
                self.1.say(&format!(
                    "warning: could not remove the work directory {}: {e}",
                    crate::text::shown(&self.0)
                ));
            }
        }
    }
}

/// Work directories of build `name` left by an fdl that was killed. The caller holds the
/// build's lock, so none of them belongs to a running build.
pub(crate) fn remove_stale_work_dirs(
    builds_dir: &Path,
    work_prefix: &str,
    name: &str,
    progress: &Progress,
) {
    let prefix = format!("{work_prefix}{name}-");
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

/// Builds with this host's toolkit and make; fdl's cache (path aliases) is the run's.
pub struct NativeBackend {
    pub ctx: crate::context::Context,
}

impl Backend for NativeBackend {
    /// A clone-source plan's tag is cloned into fdl's clone cache when it is not there
    /// yet, as the build would first thing, so that its commit names the store key.
    fn before_key(&self, plan: &BuildPlan, progress: &Progress) -> Result<()> {
        let BackendPlan::Native(n) = &plan.backend else {
            return Ok(());
        };
        let NativeSource::Clone { repo, cache_dir } = &n.source else {
            return Ok(());
        };
        if cache_dir.is_dir() {
            return Ok(());
        }
        let git = match n.tools.get("git") {
            Some(git) => git.clone(),
            None => crate::process::on_path("git").ok_or_else(|| {
                anyhow!(
                    "git is not on PATH: fdl clones {} with it. Install git, or pass --source DIR with an NCCL tree",
                    plan.tag
                )
            })?,
        };
        source::ensure_clone(&self.ctx, repo, &plan.tag, cache_dir, &git, progress)?;
        Ok(())
    }

    fn build(&self, plan: &BuildPlan, staging: &Path, progress: &Progress) -> Result<()> {
        let BackendPlan::Native(native) = &plan.backend else {
            bail!(
                "the native backend was given a plan for {}",
                plan.backend.kind()
            );
        };
        // make runs in the source tree: every path it gets must be absolute.
        let staging = std::path::absolute(staging)?;
        let builds_dir = staging
            .parent()
            .ok_or_else(|| anyhow!("the staging directory has no parent"))?;
        remove_stale_work_dirs(builds_dir, WORK_PREFIX, &plan.name, progress);

        let source = match &native.source {
            NativeSource::Dir { path, .. } => {
                // Checked when planning; checked again in case the tree changed since.
                check_source_dir(path, &plan.tag)?.0
            }
            NativeSource::Clone { repo, cache_dir } => {
                let git = tool(native, "git");
                source::ensure_clone(&self.ctx, repo, &plan.tag, cache_dir, &git, progress)?
            }
        };

        let work = WorkDir::create(&self.ctx, builds_dir, &plan.name)?;
        // Every path make puts into a recipe is a plain word, whatever the project root,
        // the source or the toolkit are called.
        let mut aliases = plain::Aliases::new(&self.ctx.cache()?)?;
        let paths = Paths {
            entries: vec![
                ("source", aliases.plain(&source)?),
                ("build-dir", aliases.plain(&work.0)?),
                ("staging", aliases.plain(&staging)?),
                ("cuda-home", aliases.plain(&native.toolkit.cuda_home)?),
            ],
        };
        for (old, new) in aliases.made() {
            progress.output(&format!(
                "==> fdl: make sees {} as {}",
                old.display(),
                new.display()
            ));
        }
        progress.output(&format!("==> fdl: paths: {}", paths.describe()));
        let steps = NativeSteps::new(native, plan.jobs, &paths);

        // make's own dry run is fdl's preparation, not the compile: timed as such.
        let total = count_compiles(&steps.count, progress);
        progress.phase(Phase::Compile);
        if let Some(total) = total {
            progress.set_total(total);
        }
        run_make(&steps.build, progress, total)?;
        progress.phase(Phase::Install);
        run_make(&steps.install, progress, None)?;
        Ok(())
    }

    /// The plan's nvcc (`--version`: its release and build, which name the CUDA it
    /// belongs to) and the host C++ compiler (`--version`'s first line), as make will
    /// run them.
    fn toolchain_identity(&self, plan: &BuildPlan) -> Result<BTreeMap<String, String>> {
        let BackendPlan::Native(native) = &plan.backend else {
            bail!(
                "the native backend was given a plan for {}",
                plan.backend.kind()
            );
        };
        let version = |program: &Path, what: &str| -> Result<String> {
            let text = toolchain::ask(program, "--version", what)?;
            // One line, and no control character from outside (it is printed later).
            Ok(text
                .lines()
                .map(|l| crate::text::clean(l.trim()))
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(" | "))
        };
        let mut id = BTreeMap::new();
        id.insert(
            "nvcc".to_string(),
            version(&native.toolkit.nvcc, "nvcc --version")?,
        );
        id.insert("cuda".to_string(), native.toolkit.cuda.to_string());
        let cxx = tool(native, "c++");
        let cxx_version = version(&cxx, "c++ --version")?;
        id.insert(
            "cxx".to_string(),
            cxx_version
                .split(" | ")
                .next()
                .unwrap_or_default()
                .to_string(),
        );
        Ok(id)
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
fn make_env(native: &NativePlan, mut step: Step) -> Step {
    if let Some(bin) = native.toolkit.nvcc.parent() {
        step = step.env("PATH", EnvChange::PrependPath(bin.to_path_buf()));
    }
    step = step.env(
        "CUDA_HOME",
        EnvChange::Set(native.toolkit.cuda_home.clone().into_os_string()),
    );
    for var in ["MAKEFLAGS", "MFLAGS", "MAKELEVEL"] {
        step = step.env(var, EnvChange::Unset);
    }
    if let Some(cxx) = native.tools.get("c++") {
        step = step.env("CXX", EnvChange::Set(cxx.clone().into_os_string()));
    }
    step
}

/// How many files `src.build` will compile, from a dry run (`make -n`) counting NCCL's
/// `Compiling` lines. `None` when the dry run fails or finds none: the progress then
/// shows a count without a total. Should the count fall short, [`run_make`] raises the
/// total as files go by, so the display never reads "120/100". (Under `-n`, make still
/// remakes included makefiles, such as NCCL's generated kernel lists — into the work
/// directory, where the real build then reuses them.)
pub(crate) fn count_compiles(count: &Step, progress: &Progress) -> Option<u64> {
    count_compiles_with(count, progress, std::process::Stdio::null())
}

/// [`count_compiles`] with the step's stdin given: the Docker backend's is a pipe whose
/// end it holds, which ties the container's life to fdl's.
pub(crate) fn count_compiles_with(
    count: &Step,
    progress: &Progress,
    stdin: std::process::Stdio,
) -> Option<u64> {
    let mut cmd = count.command();
    cmd.stdin(stdin);
    match process::capture(&mut cmd, &count.what) {
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
pub(crate) fn run_make(step: &Step, progress: &Progress, total: Option<u64>) -> Result<()> {
    run_make_with(step, progress, total, std::process::Stdio::null())
}

/// [`run_make`] with the step's stdin given (see [`count_compiles_with`]).
pub(crate) fn run_make_with(
    step: &Step,
    progress: &Progress,
    mut total: Option<u64>,
    stdin: std::process::Stdio,
) -> Result<()> {
    progress.output(&format!("==> fdl: step: {}", step.render()));
    let mut cmd = step.command();
    cmd.stdin(stdin);
    let mut linking = false;
    let mut compiled = 0u64;
    process::stream(&mut cmd, &step.what, &mut |line| {
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
            warnings: Vec::new(),
        })
        .unwrap()
    }

    /// The make steps' words, as strings.
    fn argv(plan: &BuildPlan, cuda_home: &str) -> Vec<Vec<String>> {
        let BackendPlan::Native(native) = &plan.backend else {
            panic!("not native")
        };
        let paths = Paths {
            entries: vec![
                ("source", "/src".into()),
                ("build-dir", "/w".into()),
                ("staging", "/s".into()),
                ("cuda-home", cuda_home.into()),
            ],
        };
        NativeSteps::new(native, plan.jobs, &paths)
            .all()
            .iter()
            .map(|s| {
                std::iter::once(&s.program)
                    .chain(&s.args)
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn make_steps_count_build_then_install_with_the_same_variables() {
        let cmds = argv(&plan("lib64", Some("AllReduce Sum f32")), "/opt/cuda");
        let gencode = "NVCC_GENCODE=-gencode=arch=compute_86,code=sm_86";
        let vars = [
            gencode,
            "CUDA_HOME=/opt/cuda",
            "ONLY_FUNCS=AllReduce Sum f32",
        ];
        let step = |head: &[&str]| -> Vec<String> {
            head.iter().chain(&vars).map(|s| s.to_string()).collect()
        };
        assert_eq!(
            cmds,
            vec![
                step(&[
                    "make",
                    "-C",
                    "/src",
                    "-n",
                    "-j3",
                    "src.build",
                    "BUILDDIR=/w"
                ]),
                step(&["make", "-C", "/src", "-j3", "src.build", "BUILDDIR=/w"]),
                step(&[
                    "make",
                    "-C",
                    "/src",
                    "-j3",
                    "install",
                    "BUILDDIR=/w",
                    "PREFIX=/s"
                ]),
            ]
        );
    }

    #[test]
    fn wheel_layout_names_its_lib_dir() {
        for c in argv(&plan("lib", None), "/opt/cuda") {
            assert_eq!(c.last().unwrap(), "CUDA_LIB=/opt/cuda/lib");
        }
        // As make sees it through a plain alias of the toolkit's home.
        let aliased = argv(&plan("lib", None), "/c/paths/abc");
        assert!(aliased[1].contains(&"CUDA_HOME=/c/paths/abc".to_string()));
        assert_eq!(aliased[1].last().unwrap(), "CUDA_LIB=/c/paths/abc/lib");
    }

    #[test]
    fn work_dir_is_removed_on_drop() {
        let t = tempfile::tempdir().unwrap();
        let ctx = crate::context::Context::from_process();
        let w = WorkDir::create(&ctx, t.path(), "v2.27.5-sm86").unwrap();
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
