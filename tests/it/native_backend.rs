//! The native backend end to end, through the CLI, on this machine: a stand-in NCCL tree
//! (NCCL's targets and variables, a real C++ library) and a stand-in nvcc in a fake
//! CUDA_HOME, so no GPU toolchain is needed. Every test has its own cache directory
//! (XDG_CACHE_HOME), project and sources, and checks what is left behind.

use crate::common;
use crate::native_fixture;
use common::*;
use native_fixture::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Std, Stdio};
use std::time::{Duration, Instant};

const TAG: &str = "v2.27.5-1";

/// What one test works with: a project, a cache, a toolkit and the stand-in sources.
struct Env {
    project: ProjectFixture,
    cache: tempfile::TempDir,
    work: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let env = Env {
            project: ProjectFixture::empty(),
            cache: tempfile::tempdir().unwrap(),
            work: tempfile::tempdir().unwrap(),
        };
        cuda_12_8(&env.cuda_home());
        env
    }

    fn root(&self) -> &Path {
        self.project.root()
    }

    fn builds(&self) -> PathBuf {
        self.root().join("libtorch/nccl/builds")
    }

    fn cuda_home(&self) -> PathBuf {
        self.work.path().join("cuda")
    }

    /// A stand-in NCCL tree of `version` (made once per name).
    fn tree(&self, name: &str, version: (u32, u32, u32)) -> PathBuf {
        let dir = self.work.path().join(name);
        if !dir.exists() {
            standin_tree(&dir, version);
        }
        dir
    }

    fn repo(&self) -> PathBuf {
        let dir = self.work.path().join("repo");
        if !dir.exists() {
            tagged_repo(&dir, (2, 27, 5), TAG);
        }
        dir
    }

    /// Where the clone of TAG from the stand-in repository is cached.
    fn src_cache(&self) -> PathBuf {
        self.cache
            .path()
            .join("fdl/nccl-src")
            .join(fdl::native::repo_key(&self.repo().display().to_string()))
            .join(TAG)
    }

    /// `fdl --root P nccl build --backend native --tag TAG --archs ARCHS --cuda-home H`,
    /// with a clean environment of its own.
    fn build(&self, archs: &str, extra: &[&str]) -> assert_cmd::Command {
        assert_cmd::Command::from_std(self.std_build(archs, extra))
    }

    fn std_build(&self, archs: &str, extra: &[&str]) -> Std {
        let mut cmd = self.base();
        cmd.args(["--archs", archs])
            .arg("--cuda-home")
            .arg(self.cuda_home())
            .args(extra);
        cmd
    }

    /// `fdl --root P nccl build --backend native --tag TAG` with this test's cache and
    /// none of the variables that would change the build inherited.
    fn base(&self) -> Std {
        let mut cmd = Std::new(assert_cmd::cargo::cargo_bin("fdl"));
        for var in [
            "FDL_ROOT",
            "CUDA_HOME",
            "CXX",
            "FDL_NCCL_REPO",
            "FDL_TEST_STALL",
            "FDL_TEST_STALL_SECS",
            "MAKEFLAGS",
        ] {
            cmd.env_remove(var);
        }
        cmd.env("XDG_CACHE_HOME", self.cache.path())
            .arg("--root")
            .arg(self.root())
            .args(["nccl", "build", "--backend", "native", "--tag", TAG]);
        cmd
    }

    fn stray_entries(&self) -> Vec<String> {
        std::fs::read_dir(self.builds())
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json_of(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "fdl failed:\nstdout: {}\nstderr: {}",
        stdout_of(out),
        stderr_of(out)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn contains_bytes(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Checks an installed stand-in build of 2.27.5 at `dir`, built for `gencode`.
fn assert_installed(dir: &Path, gencode: &str) {
    let lib = dir.join("lib");
    assert_eq!(
        std::fs::read_link(lib.join("libnccl.so")).unwrap(),
        Path::new("libnccl.so.2")
    );
    assert_eq!(
        std::fs::read_link(lib.join("libnccl.so.2")).unwrap(),
        Path::new("libnccl.so.2.27.5")
    );
    let real = std::fs::read(lib.join("libnccl.so.2.27.5")).unwrap();
    assert!(real.starts_with(b"\x7fELF"), "not a shared library");
    assert!(
        contains_bytes(&real, "NCCL version 2.27.5+cuda12.8"),
        "no self-id"
    );
    assert!(
        contains_bytes(&real, &format!("gencode:{gencode}")),
        "NVCC_GENCODE did not reach the build"
    );
    assert!(std::fs::read(lib.join("libnccl_static.a"))
        .unwrap()
        .starts_with(b"!<arch>\n"));
    let header = std::fs::read_to_string(dir.join("include/nccl.h")).unwrap();
    assert!(header.contains("#define NCCL_MINOR 27"), "{header}");
    let pc = std::fs::read_to_string(lib.join("pkgconfig/nccl.pc")).unwrap();
    assert!(
        pc.starts_with(&format!("prefix={}\n", dir.display())),
        "nccl.pc prefix not rewritten:\n{pc}"
    );
}

/// The checked-out files of a git working tree and the commit it is at (`.git`'s own
/// files change with every git command, e.g. the index's timestamps).
fn checkout_state(dir: &Path) -> (String, Vec<(PathBuf, String)>) {
    let files = snapshot(dir)
        .into_iter()
        .filter(|(p, _)| !p.starts_with(".git"))
        .collect();
    (git(dir, &["rev-parse", "HEAD"]), files)
}

fn manifest_of(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("fdl-build.json")).unwrap()).unwrap()
}

/// A build of another NCCL release than the active libtorch's is warned of in the plan,
/// after the build (beside the line to wire it) and in `--json`, with the tag that
/// matches (issue 43); a build of the libtorch's release is not.
#[test]
fn a_build_of_another_release_than_the_libtorchs_is_warned_of_when_made() {
    let mut env = Env::new();
    env.project = ProjectFixture::empty()
        .with_compiled_variant("precompiled/cu128", &nccl_like_source((2, 30, 7), "12.8"))
        .activate("precompiled/cu128\n");
    let tree = env.tree("nccl", (2, 27, 5));
    let out = env.build("8.6", &["--source"]).arg(&tree).output().unwrap();
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert!(out.status.success(), "{stderr}");
    let said = "NCCL 2.27.5 is not the active libtorch's (precompiled/cu128: NCCL 2.30.7)";
    // Once in the plan's header (for the --tag), once for the build made.
    assert_eq!(stderr.matches(said).count(), 2, "{stderr}");
    assert!(
        stderr.contains(&format!("warning: build v2.27.5-sm86: {said}"))
            && stderr.contains("To match it, build --tag v2.30.7-1"),
        "{stderr}"
    );
    assert!(stdout.contains("Wire it with"), "{stdout}");

    let out = env
        .build("8.6", &["--json", "--force", "--source"])
        .arg(&tree)
        .output()
        .unwrap();
    let v = json_of(&out);
    assert_eq!(v["other_release"]["libtorch_nccl"], "2.30.7", "{v}");
    assert_eq!(v["other_release"]["nccl"], "2.27.5", "{v}");
    // The libtorch has its NCCL compiled in: it imports no nccl* function to lack.
    assert_eq!(v["other_release"]["lacking"], serde_json::json!([]), "{v}");

    env.project = ProjectFixture::empty()
        .with_compiled_variant("precompiled/cu128", &nccl_like_source((2, 27, 5), "12.8"))
        .activate("precompiled/cu128\n");
    let out = env
        .build("8.6", &["--json", "--source"])
        .arg(&tree)
        .output()
        .unwrap();
    let v = json_of(&out);
    assert!(v.get("other_release").is_none(), "{v}");
    assert!(!stderr_of(&out).contains("not the active libtorch's"));
}

#[test]
fn builds_from_a_source_tree_without_touching_it() {
    let env = Env::new();
    let tree = env.tree("nccl", (2, 27, 5));
    let before = snapshot(&tree);

    let out = env
        .build("8.6", &["--json", "--jobs", "2", "--source"])
        .arg(&tree)
        .output()
        .unwrap();
    let result = json_of(&out);
    assert_eq!(result["status"], "built");
    let dir = env.builds().join("v2.27.5-sm86");
    assert_installed(&dir, "-gencode=arch=compute_86,code=sm_86");

    let manifest = manifest_of(&dir);
    let plan = &manifest["plan"];
    assert_eq!(plan["backend"], "native");
    assert_eq!(plan["native"]["source"]["kind"], "dir");
    assert_eq!(
        plan["native"]["source"]["path"],
        tree.canonicalize().unwrap().display().to_string()
    );
    assert_eq!(plan["native"]["toolkit"]["cuda"], "12.8.93");
    assert_eq!(
        plan["native"]["toolkit"]["lib_dir"],
        env.cuda_home().join("lib64").display().to_string()
    );
    assert_eq!(manifest["checked"]["library"], "libnccl.so.2.27.5");

    // The log travels with the build: the make commands, their output, the count.
    let log = std::fs::read_to_string(dir.join("build.log")).unwrap();
    for expected in [
        "==> fdl: phase compile",
        "==> fdl: make -n counts 4 files to compile",
        "Compiling  src/init.cc",
        "Linking    libnccl.so.2.27.5",
        "==> fdl: phase install",
        "src.build BUILDDIR=",
        "install BUILDDIR=",
    ] {
        assert!(
            log.contains(expected),
            "build.log lacks {expected:?}:\n{log}"
        );
    }

    assert_eq!(snapshot(&tree), before, "the --source tree was modified");
    assert!(
        env.stray_entries().is_empty(),
        "left behind: {:?}",
        env.stray_entries()
    );
    assert!(
        !env.cache.path().join("fdl/nccl-src").exists(),
        "a --source build must not clone"
    );

    // Same plan again: nothing to do, nothing changed.
    let project_before = snapshot(env.root());
    let out = env.build("8.6", &["--source"]).arg(&tree).output().unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        stdout_of(&out).contains("Already built"),
        "{}",
        stdout_of(&out)
    );
    assert_eq!(snapshot(env.root()), project_before);
    assert_eq!(snapshot(&tree), before);

    // ONLY_FUNCS reaches NCCL's make too, and marks a build of its own.
    let out = env
        .build(
            "8.6",
            &["--json", "--only-funcs", "AllReduce Sum f32", "--source"],
        )
        .arg(&tree)
        .output()
        .unwrap();
    let dir = PathBuf::from(json_of(&out)["build_dir"].as_str().unwrap());
    assert!(dir
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("v2.27.5-sm86-only-"));
    let lib = std::fs::read(dir.join("lib/libnccl.so.2.27.5")).unwrap();
    assert!(contains_bytes(&lib, "only_funcs:AllReduce Sum f32"));
    assert_eq!(snapshot(&tree), before);
}

/// The build log kept with the build at `dir`.
fn log_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("build.log")).unwrap()
}

#[test]
fn clones_the_tag_once_and_reuses_the_cache() {
    let env = Env::new();
    let repo = env.repo();
    let out = env
        .build("8.6", &["--json"])
        .env("FDL_NCCL_REPO", &repo)
        .output()
        .unwrap();
    assert_eq!(json_of(&out)["status"], "built");
    let first = env.builds().join("v2.27.5-sm86");
    assert_installed(&first, "-gencode=arch=compute_86,code=sm_86");
    let plan = &manifest_of(&first)["plan"];
    assert_eq!(plan["native"]["source"]["kind"], "clone");
    assert_eq!(plan["native"]["source"]["repo"], repo.display().to_string());
    assert!(log_of(&first).contains("==> fdl: phase clone"));

    // The clone is a checkout of the tag, complete, and nothing else is in the cache.
    let cached = env.src_cache();
    assert_eq!(
        git(&cached, &["rev-parse", "HEAD"]),
        git(&repo, &["rev-parse", "v2.27.5-1^{commit}"])
    );
    let names: Vec<String> = std::fs::read_dir(cached.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| n == TAG || n == ".v2.27.5-1.lock"),
        "{names:?}"
    );
    let cache_before = snapshot(&cached);

    // Another arch of the same tag from the same repository: no second clone — the
    // repository is not even reachable now — and the cached tree is untouched.
    let away = env.work.path().join("repo-away");
    std::fs::rename(&repo, &away).unwrap();
    let out = env
        .build("9.0", &["--json"])
        .env("FDL_NCCL_REPO", &repo)
        .output()
        .unwrap();
    std::fs::rename(&away, &repo).unwrap();
    assert_eq!(json_of(&out)["status"], "built");
    let second = env.builds().join("v2.27.5-sm90");
    assert_installed(&second, "-gencode=arch=compute_90,code=sm_90");
    let log = log_of(&second);
    assert!(
        !log.contains("phase clone") && !log.contains("git clone"),
        "{log}"
    );
    assert!(log.contains("Using the cached NCCL source"), "{log}");
    assert_eq!(snapshot(&cached), cache_before);
    assert!(env.stray_entries().is_empty(), "{:?}", env.stray_entries());

    // The same tag from another repository is never served from that cache: it is
    // cloned from where it was asked for, and the record names that repository's clone.
    let fork = env.work.path().join("fork");
    tagged_repo(&fork, (2, 27, 5), TAG);
    let out = env
        .build("8.0", &["--json"])
        .env("FDL_NCCL_REPO", &fork)
        .output()
        .unwrap();
    assert_eq!(json_of(&out)["status"], "built");
    let third = env.builds().join("v2.27.5-sm80");
    assert!(log_of(&third).contains("==> fdl: phase clone"));
    let source = &manifest_of(&third)["plan"]["native"]["source"];
    assert_eq!(source["repo"], fork.display().to_string());
    let fork_cache = source["cache_dir"].as_str().unwrap();
    assert_ne!(fork_cache, cached.display().to_string());
    assert_eq!(
        git(
            Path::new(fork_cache),
            &["config", "--get", "remote.origin.url"]
        ),
        fork.display().to_string()
    );
    assert_eq!(snapshot(&cached), cache_before);
}

#[test]
fn damaged_cache_entries_are_detected_and_replaced() {
    let env = Env::new();
    let repo = env.repo();
    let cached = env.src_cache();
    let build = |archs: &str| {
        // --no-store: each build must go through the (damaged) clone, not the store.
        env.build(archs, &["--json", "--force", "--no-store"])
            .env("FDL_NCCL_REPO", &repo)
            .output()
            .unwrap()
    };
    assert_eq!(json_of(&build("8.6"))["status"], "built");
    let healthy = checkout_state(&cached);

    type Damage = Box<dyn Fn(&Path)>;
    let damages: Vec<(&str, Damage, &str)> = vec![
        (
            "a deleted source file",
            Box::new(|c: &Path| std::fs::remove_file(c.join("src/init.cc")).unwrap()),
            "its files differ from v2.27.5-1",
        ),
        (
            "another version in version.mk",
            Box::new(|c: &Path| {
                std::fs::write(
                    c.join("makefiles/version.mk"),
                    "NCCL_MAJOR := 2\nNCCL_MINOR := 26\nNCCL_PATCH := 2\n",
                )
                .unwrap()
            }),
            "its version.mk says NCCL 2.26.2, not 2.27.5",
        ),
        (
            "no git checkout",
            Box::new(|c: &Path| std::fs::remove_dir_all(c.join(".git")).unwrap()),
            "it is not a git checkout",
        ),
        (
            "another commit checked out",
            Box::new(|c: &Path| {
                git(c, &["commit", "-q", "--allow-empty", "-m", "local change"]);
            }),
            "checked out at another commit than v2.27.5-1",
        ),
        (
            "a file instead of a directory",
            Box::new(|c: &Path| {
                std::fs::remove_dir_all(c).unwrap();
                std::fs::write(c, "junk").unwrap();
            }),
            "it is not a directory",
        ),
        (
            "an emptied directory",
            Box::new(|c: &Path| {
                std::fs::remove_dir_all(c).unwrap();
                std::fs::create_dir(c).unwrap();
            }),
            "it is not a git checkout",
        ),
    ];
    for (i, (what, damage, reason)) in damages.iter().enumerate() {
        damage(&cached);
        let archs = if i % 2 == 0 { "9.0" } else { "8.6" };
        let out = build(archs);
        let result = json_of(&out);
        assert!(
            stderr_of(&out).contains(reason) || {
                let dir = Path::new(result["build_dir"].as_str().unwrap());
                log_of(dir).contains(reason)
            },
            "{what}: the damage was not named ({reason}):\n{}",
            stderr_of(&out)
        );
        let dir = Path::new(result["build_dir"].as_str().unwrap());
        assert!(
            log_of(dir).contains("==> fdl: phase clone"),
            "{what}: not cloned again"
        );
        assert_eq!(
            checkout_state(&cached),
            healthy,
            "{what}: the cache was not restored"
        );
    }

    // A partial clone left by a killed fdl is removed, and a good entry is kept.
    let leftover = cached.parent().unwrap().join(".v2.27.5-1.partial-Xy12Zq");
    std::fs::create_dir_all(leftover.join("src")).unwrap();
    let out = build("9.0");
    let dir = PathBuf::from(json_of(&out)["build_dir"].as_str().unwrap());
    assert!(!leftover.exists(), "the partial clone was left");
    assert!(!log_of(&dir).contains("phase clone"));
    assert_eq!(checkout_state(&cached), healthy);
}

#[test]
fn refuses_a_source_tree_of_another_version_or_no_nccl_tree() {
    let env = Env::new();
    let old = env.tree("nccl-2.26.2", (2, 26, 2));
    let out = env.build("8.6", &["--source"]).arg(&old).output().unwrap();
    assert!(!out.status.success());
    let err = stderr_of(&out);
    assert!(
        err.contains("is NCCL 2.26.2") && err.contains("tag v2.27.5-1 is NCCL 2.27.5"),
        "{err}"
    );
    assert!(err.contains("--tag v2.26.2-1"), "{err}");

    let not_nccl = env.work.path().join("empty");
    std::fs::create_dir_all(not_nccl.join("src")).unwrap();
    let out = env
        .build("8.6", &["--source"])
        .arg(&not_nccl)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr_of(&out);
    assert!(
        err.contains("is not an NCCL source tree") && err.contains("makefiles/version.mk"),
        "{err}"
    );

    // Nothing was written: not in the project, not in the cache.
    assert_eq!(std::fs::read_dir(env.root()).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(env.cache.path()).unwrap().count(), 0);
}

#[test]
fn names_each_missing_tool() {
    let env = Env::new();
    let tree = env.tree("nccl", (2, 27, 5));
    let all = ["make", "g++", "python3", "git"];
    // (tool left out, whether --source is given, what the message must name)
    let cases = [
        ("make", true, "make: not found on PATH"),
        ("g++", true, "c++: no C++ compiler"),
        ("python3", true, "python3: not found on PATH"),
        ("git", false, "git: not found on PATH"),
    ];
    for (left_out, with_source, expected) in cases {
        let tools: Vec<&str> = all.iter().copied().filter(|t| *t != left_out).collect();
        let path = path_of_only(&tools);
        let mut cmd = if with_source {
            let mut c = env.build("8.6", &["--source"]);
            c.arg(&tree);
            c
        } else {
            env.build("8.6", &[])
        };
        let out = cmd.env("PATH", path.path()).output().unwrap();
        assert!(!out.status.success(), "built without {left_out}");
        let err = stderr_of(&out);
        assert!(err.contains(expected), "without {left_out}: {err}");
        assert!(
            err.contains("the native backend cannot build here"),
            "{err}"
        );
        // Only the missing tool is named.
        assert_eq!(
            err.matches(": not found on PATH").count() + err.matches("no C++ compiler").count(),
            1,
            "{err}"
        );
    }

    // No nvcc anywhere: no --cuda-home, no CUDA_HOME, none on PATH.
    let path = path_of_only(&all);
    let out = env
        .base()
        .env("PATH", path.path())
        .args(["--archs", "8.6", "--source"])
        .arg(&tree)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr_of(&out);
    assert!(
        err.contains("nvcc: not found") && err.contains("--cuda-home"),
        "{err}"
    );
    // The wheels it names are the set that compiles NCCL (the set .ci/fetch-oracles
    // unpacks for the real native build), never nvcc's alone.
    for wheel in [
        "nvidia-cuda-nvcc",
        "nvidia-cuda-runtime",
        "nvidia-cuda-crt",
        "nvidia-nvvm",
        "nvidia-cuda-cccl",
    ] {
        assert!(err.contains(wheel), "{wheel}: {err}");
    }

    // A --cuda-home without nvcc is named as such.
    let out = env
        .base()
        .args(["--archs", "8.6", "--source"])
        .arg(&tree)
        .arg("--cuda-home")
        .arg(env.work.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr_of(&out);
    assert!(
        err.contains("bin/nvcc is missing or not executable"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(env.root()).unwrap().count(), 0);
}

/// Waits until `marker` exists (the stand-in Makefile is then inside a compile step),
/// failing if `child` ends first or it takes too long.
fn wait_for_marker(marker: &Path, child: &mut Child) {
    let start = Instant::now();
    while !marker.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                use std::io::Read;
                let _ = e.read_to_string(&mut err);
            }
            panic!("fdl ended ({status}) before the build started compiling: {err}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the build never started compiling"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts a build of sm_86 from `tree` that stalls `secs` in its first compile step.
fn stalling_build(env: &Env, tree: &Path, marker: &Path, secs: u32, extra: &[&str]) -> Child {
    let mut cmd = env.std_build("8.6", extra);
    // It must compile (and stall there), not install from the store.
    cmd.arg("--no-store")
        .arg("--source")
        .arg(tree)
        .env("FDL_TEST_STALL", marker)
        .env("FDL_TEST_STALL_SECS", secs.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn().unwrap()
}

fn no_work_dirs_anywhere(env: &Env) {
    let found: Vec<String> = env
        .stray_entries()
        .into_iter()
        .filter(|n| n.starts_with(".native-work-"))
        .collect();
    assert!(found.is_empty(), "work directories left: {found:?}");
}

#[test]
fn interrupted_build_leaves_nothing_and_releases_the_lock() {
    let env = Env::new();
    let tree = env.tree("nccl", (2, 27, 5));
    let before = snapshot(&tree);
    let marker = env.work.path().join("compiling");
    let mut child = stalling_build(&env, &tree, &marker, 20, &[]);
    wait_for_marker(&marker, &mut child);
    // SIGINT to fdl alone, as `kill -INT` would send it.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "stderr: {}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("interrupted"),
        "{}",
        stderr_of(&out)
    );

    // Nothing in the project — no build, no staging, no work directory, not even the
    // builds directory fdl created for it — and the source is as it was.
    let left: Vec<_> = std::fs::read_dir(env.root())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "left in the project: {left:?}");
    assert_eq!(snapshot(&tree), before);

    // The lock was released: a new build does not wait.
    let out = env
        .build("8.6", &["--no-wait", "--json", "--source"])
        .arg(&tree)
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert_eq!(json_of(&out)["status"], "built");
    assert_installed(
        &env.builds().join("v2.27.5-sm86"),
        "-gencode=arch=compute_86,code=sm_86",
    );
}

#[test]
fn concurrent_builds_of_one_target_wait_or_fail_naming_the_holder() {
    let env = Env::new();
    let tree = env.tree("nccl", (2, 27, 5));
    let marker = env.work.path().join("compiling");
    let mut first = stalling_build(&env, &tree, &marker, 4, &["--json"]);
    wait_for_marker(&marker, &mut first);

    // --no-wait: fails at once, naming the process that holds the lock.
    let out = env
        .build("8.6", &["--no-wait", "--source"])
        .arg(&tree)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert!(
        err.contains("locked by another fdl") && err.contains(&format!("pid {}", first.id())),
        "{err}"
    );
    assert!(err.contains("--no-wait"), "{err}");

    // Without it: says it waits, then finds the first one's build.
    let second = env
        .std_build("8.6", &["--source"])
        .arg(&tree)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let first_out = first.wait_with_output().unwrap();
    assert_eq!(json_of(&first_out)["status"], "built");
    let second_out = second.wait_with_output().unwrap();
    assert!(second_out.status.success(), "{}", stderr_of(&second_out));
    assert!(
        stderr_of(&second_out).contains("waiting for it to finish"),
        "{}",
        stderr_of(&second_out)
    );
    assert!(
        stdout_of(&second_out).contains("Already built"),
        "{}",
        stdout_of(&second_out)
    );
    assert!(env.stray_entries().is_empty(), "{:?}", env.stray_entries());
}

#[test]
fn a_killed_builds_lock_and_work_dir_do_not_block_the_next_build() {
    let env = Env::new();
    let tree = env.tree("nccl", (2, 27, 5));
    let marker = env.work.path().join("compiling");
    // Its own process group, so the kill takes make and the compiler with it, like
    // `kill -9` of a whole job would.
    let mut cmd = env.std_build("8.6", &["--source"]);
    cmd.arg(&tree)
        .env("FDL_TEST_STALL", &marker)
        .env("FDL_TEST_STALL_SECS", "30")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut holder = cmd.spawn().unwrap();
    wait_for_marker(&marker, &mut holder);
    assert_eq!(
        unsafe { libc::kill(-(holder.id() as i32), libc::SIGKILL) },
        0
    );
    holder.wait().unwrap();
    // The killed build had no chance to clean up.
    assert!(env
        .stray_entries()
        .iter()
        .any(|n| n.starts_with(".native-work-")));

    let start = Instant::now();
    let out = env
        .build("8.6", &["--no-wait", "--json", "--source"])
        .arg(&tree)
        .output()
        .unwrap();
    assert_eq!(json_of(&out)["status"], "built");
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "it waited for the dead holder"
    );
    // The dead build's work directory went with the next build of the same target.
    no_work_dirs_anywhere(&env);
}

#[test]
fn a_failing_compile_is_reported_with_its_log_and_leaves_nothing() {
    let env = Env::new();
    let tree = env.tree("nccl", (2, 27, 5));
    std::fs::write(tree.join("src/collectives.cc"), "this is not C++\n").unwrap();
    let out = env.build("8.6", &["--source"]).arg(&tree).output().unwrap();
    assert!(!out.status.success());
    let err = stderr_of(&out);
    assert!(
        err.contains("make src.build (compiling NCCL) failed"),
        "{err}"
    );
    // The compiler's own complaint is in the tail shown, and the whole log is kept.
    assert!(err.contains("src/collectives.cc"), "{err}");
    assert!(err.contains("The full build log is kept at"), "{err}");
    let left: Vec<_> = std::fs::read_dir(env.root())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "left in the project: {left:?}");
}

#[test]
fn remove_waits_for_a_rebuild_of_its_target() {
    let env = Env::new();
    let tree = env.tree("nccl", (2, 27, 5));
    let out = env
        .build("8.6", &["--json", "--source"])
        .arg(&tree)
        .output()
        .unwrap();
    assert_eq!(json_of(&out)["status"], "built", "{}", stderr_of(&out));
    let name = "v2.27.5-sm86";

    // A forced rebuild of the same target holds its lock while it compiles.
    let marker = env.work.path().join("compiling");
    let mut rebuild = stalling_build(&env, &tree, &marker, 3, &["--json", "--force"]);
    wait_for_marker(&marker, &mut rebuild);
    let remove = |extra: &[&str]| {
        let mut cmd = Std::new(assert_cmd::cargo::cargo_bin("fdl"));
        cmd.env("XDG_CACHE_HOME", env.cache.path())
            .env_remove("FDL_ROOT")
            .arg("--root")
            .arg(env.root())
            .args(["nccl", "remove", "--yes", name])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    };
    let out = remove(&["--no-wait"]).output().unwrap();
    assert!(!out.status.success());
    assert!(
        stderr_of(&out).contains("locked by another fdl"),
        "{}",
        stderr_of(&out)
    );
    assert!(env.builds().join(name).exists());

    // Without --no-wait, remove waits for the rebuild, then removes its result.
    let waiting = remove(&[]).spawn().unwrap();
    let rebuilt = rebuild.wait_with_output().unwrap();
    assert_eq!(
        json_of(&rebuilt)["status"],
        "replaced",
        "{}",
        stderr_of(&rebuilt)
    );
    let removed = waiting.wait_with_output().unwrap();
    assert!(removed.status.success(), "{}", stderr_of(&removed));
    assert!(
        stderr_of(&removed).contains("waiting for it to finish"),
        "{}",
        stderr_of(&removed)
    );
    assert!(!env.builds().join(name).exists());
    assert!(env.stray_entries().is_empty(), "{:?}", env.stray_entries());
}

#[test]
fn quiet_normal_and_verbose_show_what_they_promise() {
    let env = Env::new();
    let tree = env.tree("nccl", (2, 27, 5));
    // Off a terminal, normal mode prints phase lines, not the compiler's output.
    let out = env.build("8.6", &["--source"]).arg(&tree).output().unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert!(
        err.contains("] compile") && err.contains("] install") && err.contains("] verify"),
        "{err}"
    );
    assert!(!err.contains("Compiling  src/init.cc"), "{err}");
    // Verbose streams the build's own lines too.
    let out = env
        .build("8.6", &["--force", "--verbose", "--no-store", "--source"])
        .arg(&tree)
        .output()
        .unwrap();
    assert!(
        stderr_of(&out).contains("Compiling  src/init.cc"),
        "{}",
        stderr_of(&out)
    );
    // Quiet: only the result.
    let out = env
        .build("8.6", &["--force", "--quiet", "--source"])
        .arg(&tree)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(
        stderr_of(&out).trim().is_empty(),
        "quiet printed: {}",
        stderr_of(&out)
    );
    assert!(stdout_of(&out).contains("Rebuilt and replaced"));
}

/// nvcc 13.5 lists sm_107, which no table of fdl's knew: a build with such a toolkit
/// (recording its list in the manifest), and one *for* sm_107, must read back as builds
/// that list, env, verify, rebuild and remove handle like any other.
#[test]
fn a_toolkit_with_archs_newer_than_fdls_table_makes_ordinary_builds() {
    let env = Env::new();
    fake_cuda_home(
        &env.cuda_home(),
        "13.5",
        "V13.5.37",
        &[75, 80, 86, 87, 88, 89, 90, 100, 110, 103, 120, 121, 107],
        "lib",
    );
    let tree = env.tree("nccl", (2, 27, 5));
    let fdl = |args: &[&str]| {
        let mut cmd = fdl_in(env.root());
        cmd.env("XDG_CACHE_HOME", env.cache.path()).args(args);
        cmd.output().unwrap()
    };
    for (archs, name) in [("8.6", "v2.27.5-sm86"), ("8.6;10.7", "v2.27.5-sm86-sm107")] {
        let out = env
            .build(archs, &["--cuda", "13.5", "--json", "--source"])
            .arg(&tree)
            .output()
            .unwrap();
        assert_eq!(json_of(&out)["status"], "built");
        let dir = env.builds().join(name);
        let manifest = manifest_of(&dir);
        assert_eq!(manifest["schema"], 2);
        assert!(
            manifest["plan"]["native"]["toolkit"]["gpu_archs"]
                .as_array()
                .unwrap()
                .contains(&serde_json::json!("sm_107")),
            "{manifest}"
        );

        let list = json_of(&fdl(&["nccl", "list", "--json"]));
        let entry = list["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("{name} not listed: {list}"))
            .clone();
        assert_eq!(entry["state"], "build", "{entry}");
        let text = stdout_of(&fdl(&["nccl", "list"]));
        assert!(
            !text.contains("broken") && !text.contains("unreadable"),
            "{text}"
        );

        let verify = json_of(&fdl(&["nccl", "verify", name, "--json"]));
        assert_eq!(verify["passed"], true, "{verify}");
        let envs = fdl(&["nccl", "env", name]);
        assert!(envs.status.success(), "{}", stderr_of(&envs));
        assert!(stdout_of(&envs).contains(&dir.join("lib/libnccl.so.2").display().to_string()));

        // Same plan again: nothing to do; --force rebuilds it in place.
        let again = env
            .build(archs, &["--cuda", "13.5", "--json", "--source"])
            .arg(&tree)
            .output()
            .unwrap();
        assert_eq!(json_of(&again)["status"], "already_built");
        let forced = env
            .build(archs, &["--cuda", "13.5", "--json", "--force", "--source"])
            .arg(&tree)
            .output()
            .unwrap();
        assert_eq!(json_of(&forced)["status"], "replaced");
    }
    let sass = stdout_of(&fdl(&["nccl", "list"]));
    assert!(sass.contains("sm_86,sm_107"), "{sass}");

    // A build whose manifest was damaged: refused without --force, replaced with it.
    let manifest = env.builds().join("v2.27.5-sm86/fdl-build.json");
    std::fs::write(&manifest, "{\"schema\": 2, \"plan\": ").unwrap();
    let out = env
        .build("8.6", &["--cuda", "13.5", "--source"])
        .arg(&tree)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr_of(&out).contains("manifest cannot be read"),
        "{}",
        stderr_of(&out)
    );
    let out = env
        .build("8.6", &["--cuda", "13.5", "--json", "--force", "--source"])
        .arg(&tree)
        .output()
        .unwrap();
    assert_eq!(json_of(&out)["status"], "replaced");
    assert_eq!(manifest_of(&env.builds().join("v2.27.5-sm86"))["schema"], 2);
    for name in ["v2.27.5-sm86", "v2.27.5-sm86-sm107"] {
        let out = fdl(&["nccl", "remove", "--yes", name]);
        assert!(out.status.success(), "{}", stderr_of(&out));
    }
    assert!(env.stray_entries().is_empty());
    assert_eq!(std::fs::read_dir(env.builds()).unwrap().count(), 0);
}

/// NCCL's Makefiles (and the stand-in's) put BUILDDIR, PREFIX and CUDA_HOME into shell
/// recipes unquoted. A project root, a --source tree and a --cuda-home whose paths hold
/// spaces, quotes, `$(…)` and backticks still build — through plain aliases in fdl's
/// cache, gone afterwards — nothing in the paths runs, and the source tree is untouched.
#[test]
fn paths_a_shell_would_split_or_expand_build_and_run_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let odd = "p q'\"$(touch ran1)`touch ran2`";
    let root = tmp.path().join(format!("root {odd}"));
    let tree = tmp.path().join(format!("src {odd}"));
    let cuda = tmp.path().join(format!("cuda {odd}"));
    std::fs::create_dir_all(&root).unwrap();
    standin_tree(&tree, (2, 27, 5));
    cuda_12_8(&cuda);
    let before = snapshot(&tree);
    let out = Std::new(assert_cmd::cargo::cargo_bin("fdl"))
        .env_remove("CUDA_HOME")
        .env_remove("MAKEFLAGS")
        .env("XDG_CACHE_HOME", cache.path())
        .current_dir(tmp.path())
        .arg("--root")
        .arg(&root)
        .args([
            "nccl",
            "build",
            "--backend",
            "native",
            "--tag",
            TAG,
            "--archs",
            "8.6;12.0",
            "--json",
        ])
        .arg("--cuda-home")
        .arg(&cuda)
        .arg("--source")
        .arg(&tree)
        .output()
        .unwrap();
    let result = json_of(&out);
    assert_eq!(result["status"], "built");
    let dir = root.join("libtorch/nccl/builds/v2.27.5-sm86-sm120");
    assert_installed(
        &dir,
        "-gencode=arch=compute_86,code=sm_86 -gencode=arch=compute_120,code=sm_120",
    );
    for marker in ["ran1", "ran2"] {
        for place in [tmp.path(), root.as_path(), tree.as_path()] {
            assert!(
                !place.join(marker).exists(),
                "{marker} ran in {}",
                place.display()
            );
        }
    }
    assert_eq!(before, snapshot(&tree), "the --source tree was changed");
    let aliases = cache.path().join("fdl/paths");
    let left: Vec<_> = std::fs::read_dir(&aliases)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "aliases left behind: {left:?}");
    // The build log says which aliases make saw.
    let log = std::fs::read_to_string(dir.join("build.log")).unwrap();
    assert!(log.contains("make sees"), "{log}");
}

/// fdl killed (SIGKILL, through its `FDL_TEST_KILL_AT` hook) at every step of a first
/// install and of a `--force` replace, by exchange and by the journalled rename: the next
/// run leaves exactly one valid build — the old one or the new one, never neither — and
/// nothing else.
#[test]
fn a_kill_at_any_install_step_leaves_one_valid_build() {
    use std::os::unix::process::ExitStatusExt;
    let env = Env::new();
    let tree = env.tree("nccl", (2, 27, 5));
    let dir = env.builds().join("v2.27.5-sm86");
    let run = |extra: &[&str], kill_at: Option<&str>, no_exchange: bool| {
        // --no-store: the project's own transaction is under test (tests/it/store.rs kills
        // the store's).
        let mut cmd = env.std_build(
            "8.6",
            &[extra, &["--json", "--no-store", "--source"][..]].concat(),
        );
        cmd.arg(&tree);
        if let Some(point) = kill_at {
            cmd.env("FDL_TEST_KILL_AT", point);
        }
        if no_exchange {
            cmd.env("FDL_TEST_NO_EXCHANGE", "1");
        }
        cmd.output().unwrap()
    };
    let one_valid_build = |when: &str| {
        let out = run(&[], None, false);
        let status = json_of(&out)["status"].clone();
        assert!(
            status == "already_built" || status == "built",
            "{when}: {status}"
        );
        let verify = fdl_in(env.root())
            .env("XDG_CACHE_HOME", env.cache.path())
            .args(["nccl", "verify", "v2.27.5-sm86", "--json"])
            .output()
            .unwrap();
        assert_eq!(json_of(&verify)["passed"], true, "{when}");
        assert!(
            env.stray_entries().is_empty(),
            "{when}: {:?}",
            env.stray_entries()
        );
        assert_eq!(
            std::fs::read_dir(env.builds()).unwrap().count(),
            1,
            "{when}"
        );
    };
    for point in ["install:before-rename", "install:after-rename"] {
        let out = run(&[], Some(point), false);
        assert_eq!(
            out.status.signal(),
            Some(9),
            "{point}: not killed: {}",
            stderr_of(&out)
        );
        one_valid_build(point);
        std::fs::remove_dir_all(&dir).unwrap();
    }
    assert_eq!(json_of(&run(&[], None, false))["status"], "built");
    for (point, no_exchange) in [
        ("replace:before", false),
        ("replace:exchanged", false),
        ("replace:before", true),
        ("replace:set-aside", true),
        ("replace:renamed", true),
    ] {
        let out = run(&["--force"], Some(point), no_exchange);
        assert_eq!(
            out.status.signal(),
            Some(9),
            "{point}: not killed: {}",
            stderr_of(&out)
        );
        if point == "replace:set-aside" {
            // The one moment the target is missing: the old build waits beside it.
            assert!(!dir.exists());
            assert_eq!(env.stray_entries().len(), 2, "{:?}", env.stray_entries());
        }
        one_valid_build(point);
    }
}

/// The processes whose command line mentions `needle`: (pid, process group).
fn processes_mentioning(needle: &str) -> Vec<(i32, i32)> {
    all_processes()
        .into_iter()
        .filter(|&(pid, _)| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .contains(needle)
            })
        })
        .collect()
}

/// Every process: (pid, process group), from /proc/PID/stat.
fn all_processes() -> Vec<(i32, i32)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // pid (comm) state ppid pgrp …: comm may hold spaces, so split after ')'.
            let rest = &stat[stat.rfind(')')? + 2..];
            let pgrp = rest.split_whitespace().nth(2)?.parse().ok()?;
            Some((pid, pgrp))
        })
        .collect()
}

/// SIGKILL to fdl alone (not its group) mid-compile: make and every job it runs (the
/// stalled recipe's shell and its `sleep` here) go too, instead of running on as orphans.
#[test]
fn build_children_die_with_fdl() {
    let env = Env::new();
    let tree = env.tree("nccl-orphans", (2, 27, 5));
    let marker = env.work.path().join("compiling");
    let mut cmd = env.std_build("8.6", &["--source"]);
    cmd.arg(&tree)
        .env("FDL_TEST_STALL", &marker)
        .env("FDL_TEST_STALL_SECS", "60")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut fdl = cmd.spawn().unwrap();
    wait_for_marker(&marker, &mut fdl);
    // fdl's make leads its own group; a child make forks shows make's command line too
    // until it execs, so only the leader counts.
    let make: Vec<(i32, i32)> = processes_mentioning(&format!("make -C {}", tree.display()))
        .into_iter()
        .filter(|(pid, group)| pid == group)
        .collect();
    let &[(_, group)] = make.as_slice() else {
        panic!("expected one make leading its group: {make:?}");
    };
    let in_group = || -> Vec<i32> {
        all_processes()
            .into_iter()
            .filter(|p| p.1 == group)
            .map(|p| p.0)
            .collect()
    };
    assert!(in_group().len() > 1, "make runs no job: {:?}", in_group());
    fdl.kill().unwrap();
    fdl.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !in_group().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        in_group().is_empty(),
        "still running after fdl died: {:?}",
        in_group()
    );
}

/// The steps `--dry-run` shows are the steps a build runs: the run logs the private
/// paths it used (`<staging> = …`) and each step it executed, and with those paths put
/// in for the placeholders, the dry run's lines are exactly the run's.
#[test]
fn the_steps_a_dry_run_shows_are_the_steps_that_run() {
    let env = Env::new();
    let tree = env.tree("nccl", (2, 27, 5));
    let dry = env
        .build("8.6", &["--dry-run", "-v", "--source"])
        .arg(&tree)
        .output()
        .unwrap();
    assert!(dry.status.success(), "{}", stderr_of(&dry));
    let shown: Vec<String> = stdout_of(&dry)
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .map(|l| l.trim().to_string())
        .collect();
    assert_eq!(shown.len(), 3, "count, build, install: {shown:?}");

    let out = env
        .build("8.6", &["--json", "--source"])
        .arg(&tree)
        .output()
        .unwrap();
    assert_eq!(json_of(&out)["status"], "built");
    let log = log_of(&env.builds().join("v2.27.5-sm86"));
    let paths = log
        .lines()
        .find_map(|l| l.strip_prefix("==> fdl: paths: "))
        .expect("the run names its paths");
    let ran: Vec<&str> = log
        .lines()
        .filter_map(|l| l.strip_prefix("==> fdl: step: "))
        .collect();
    // Word by word, each placeholder put back to the path the run used.
    let pairs: Vec<(&str, &str)> = paths
        .split(", ")
        .map(|p| p.split_once(" = ").unwrap())
        .collect();
    let expected: Vec<Vec<String>> = shown
        .iter()
        .map(|l| {
            words(l)
                .into_iter()
                .map(|w| pairs.iter().fold(w, |w, (ph, real)| w.replace(ph, real)))
                .collect()
        })
        .collect();
    let ran: Vec<Vec<String>> = ran.iter().map(|l| words(l)).collect();
    // The counting dry run (`make -n`) is logged as its count; the other two verbatim.
    assert!(expected[0].contains(&"-n".to_string()), "{:?}", expected[0]);
    assert_eq!(ran, expected[1..], "shown:\n{}", shown.join("\n"));
}

/// A rendered shell line's words, single quotes undone.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '\'' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// A dry run says what is true now: before the first build the tag is still to be
/// cloned; after it, the clone in the cache is reused.
#[test]
fn a_dry_run_says_whether_the_source_is_cloned_yet() {
    let env = Env::new();
    let repo = env.repo();
    let dry_run = || {
        env.build("8.6", &["--dry-run"])
            .env("FDL_NCCL_REPO", &repo)
            .output()
            .unwrap()
    };
    let dry = || stdout_of(&dry_run());
    let text = dry();
    assert!(text.contains("(to be cloned into "), "{text}");
    assert!(!text.contains("already cloned"), "{text}");
    // Nothing checked the tag yet, and the plan says so: fdl keeps no list of releases.
    assert!(
        text.contains(&format!("the tag {TAG} was not checked against a source")),
        "{text}"
    );
    env.build("8.6", &["--quiet"])
        .env("FDL_NCCL_REPO", &repo)
        .assert()
        .success();
    let text = dry();
    assert!(text.contains("(already cloned in "), "{text}");
    assert!(
        text.contains("already holds a build from this plan"),
        "{text}"
    );
    assert!(!text.contains("was not checked against a source"), "{text}");
    // The clone is read: one that holds another release is a problem of the plan.
    let mk = env.src_cache().join("makefiles/version.mk");
    let was = std::fs::read_to_string(&mk).unwrap();
    std::fs::write(&mk, was.replace("NCCL_MINOR   := 27", "NCCL_MINOR   := 26")).unwrap();
    let out = dry_run();
    assert_eq!(out.status.code(), Some(1), "{}", stdout_of(&out));
    assert!(
        stdout_of(&out).contains("is NCCL 2.26.5"),
        "{}",
        stdout_of(&out)
    );
}

/// Every NCCL since 2.28 installs `include/nccl_device.h` beside `include/nccl_device/`,
/// where walk order and path order disagree: a build of that layout verifies, text and
/// JSON, and so does the copy a second project gets from the store.
#[test]
fn a_228_header_layout_verifies_and_so_does_its_store_copy() {
    let env = Env::new();
    let tree = env.tree("nccl-2.30.7", (2, 30, 7));
    let second = ProjectFixture::empty();
    let fdl = |root: &Path, args: &[&str]| {
        let mut cmd = Std::new(assert_cmd::cargo::cargo_bin("fdl"));
        for var in ["FDL_ROOT", "CUDA_HOME", "CXX", "FDL_NCCL_REPO", "MAKEFLAGS"] {
            cmd.env_remove(var);
        }
        cmd.env("XDG_CACHE_HOME", env.cache.path())
            .arg("--root")
            .arg(root)
            .args(args)
            .output()
            .unwrap()
    };
    let build = |root: &Path| {
        let mut args = vec!["nccl", "build", "--backend", "native", "--tag", "v2.30.7-1"];
        args.extend(["--archs", "8.6", "--json"]);
        let home = env.cuda_home().display().to_string();
        let source = tree.display().to_string();
        let out = fdl(
            root,
            &[&args[..], &["--cuda-home", &home, "--source", &source]].concat(),
        );
        assert!(out.status.success(), "{}", stderr_of(&out));
        json_of(&out)
    };
    let name = "v2.30.7-sm86";

    let first = build(env.root());
    assert_eq!(first["status"], "built", "{first}");
    let dir = env.builds().join(name);
    // The layout under test is there: the file sorts before the directory's entries.
    assert!(dir.join("include/nccl_device.h").is_file());
    assert!(dir
        .join("include/nccl_device/gin/proxy/gin_proxy_device_host_common.h")
        .is_file());
    let recorded = manifest_of(&dir)["files"].as_array().unwrap().len();
    assert!(recorded > 60, "{recorded} entries recorded");

    for root in [env.root(), second.root()] {
        if root == second.root() {
            let v = build(root);
            assert_eq!(v["status"], "installed_from_store", "{v}");
        }
        let out = fdl(root, &["nccl", "verify", name]);
        assert!(
            out.status.success(),
            "{}{}",
            stdout_of(&out),
            stderr_of(&out)
        );
        let v = json_of(&fdl(root, &["nccl", "verify", name, "--json"]));
        assert_eq!(v["passed"], true, "{v}");
    }

    // A change under that layout is still named, and only it.
    std::fs::remove_file(dir.join("include/nccl_device.h")).unwrap();
    let out = fdl(env.root(), &["nccl", "verify", name]);
    assert!(!out.status.success());
    let text = stdout_of(&out);
    assert!(text.contains("include/nccl_device.h is gone"), "{text}");
    assert!(!text.contains("nccl_device/gin.h"), "{text}");
}

/// The stand-in's header layout is the real wheel's, name for name.
#[test]
#[ignore = "needs the real NCCL 2.30.7 wheel: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn the_standin_headers_are_the_real_wheels() {
    let lib = oracle_input("FDL_TEST_NCCL_LIB_2307");
    let include = lib.parent().unwrap().parent().unwrap().join("include");
    let mut real = Vec::new();
    let mut stack = vec![include.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                let rel = e.path().strip_prefix(&include).unwrap().to_owned();
                real.push(rel.display().to_string());
            }
        }
    }
    real.sort();
    let mut ours: Vec<String> = nccl_extra_headers((2, 30, 7))
        .into_iter()
        .map(String::from)
        .chain(["nccl.h".to_string()])
        .collect();
    ours.sort();
    assert_eq!(
        ours, real,
        "tests/fixtures/nccl-2.30.7-include.txt differs from the wheel"
    );
    assert!(nccl_extra_headers((2, 27, 5)).is_empty());
}

/// The same plan again skips the build only when what is installed is still what was
/// sealed: a build changed since (one byte of its library) is named, with the fix, and
/// `--force` rebuilds it.
#[test]
fn the_same_plan_over_a_changed_build_is_refused_not_skipped() {
    let env = Env::new();
    let tree = env.tree("nccl", (2, 27, 5));
    let build = |extra: &[&str]| {
        env.build(
            "8.6",
            &[&["--source", tree.to_str().unwrap()][..], extra].concat(),
        )
        .output()
        .unwrap()
    };
    assert!(build(&[]).status.success());
    let again = build(&[]);
    assert!(
        stdout_of(&again).contains("Already built"),
        "{}",
        stdout_of(&again)
    );
    let lib = env.builds().join("v2.27.5-sm86/lib/libnccl.so.2.27.5");
    let mut bytes = std::fs::read(&lib).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&lib, &bytes).unwrap();
    // The dry run says what the build would: a problem, exit 1.
    let dry = build(&["--dry-run"]);
    assert_eq!(dry.status.code(), Some(1), "{}", stdout_of(&dry));
    assert!(
        stdout_of(&dry).contains("changed since it was sealed"),
        "{}",
        stdout_of(&dry)
    );
    let out = build(&[]);
    let err = stderr_of(&out);
    assert!(
        !out.status.success(),
        "a changed build was skipped: {}",
        stdout_of(&out)
    );
    assert!(
        err.contains("lib/libnccl.so.2.27.5 changed") && err.contains("--force"),
        "{err}"
    );
    let out = build(&["--force"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let out = env
        .build("8.6", &["--source", tree.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        stdout_of(&out).contains("Already built"),
        "{}",
        stdout_of(&out)
    );
}
