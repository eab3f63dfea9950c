//! Which NCCL a real Python process runs: `python -c` with `import torch` in venvs made
//! by pip (torch 2.15.0 with its nvidia-nccl-cu13 2.30.7 wheel; torch 2.8.0 with
//! nvidia-nccl-cu12 2.27.3), seen from inside the process by tests/support/torch_probe.py:
//! the libnccl.so files mapped, and the file each `nccl*` GOT slot of libtorch_cuda.so
//! points into. torch 2.15's `__init__` preloads `nvidia/nccl/lib/libnccl.so.*` with
//! ctypes from the first sys.path entry holding it, before libtorch_cuda.so loads, so
//! PYTHONPATH and the cwd of `python -c` take part (torch 2.8 does so only when its
//! libtorch_global_deps.so fails to load); then the loader's own rules (LD_PRELOAD,
//! libtorch_cuda's DT_RPATH, LD_LIBRARY_PATH). No GPU is needed: `import torch` runs on the
//! CPU and `torch.cuda.nccl.unique_id()` runs NCCL's bootstrap, which loads the env
//! plugin. These are the oracle facts fdl's answers are held to.
//!
//! They need the venvs of `.ci/fetch-oracles` (FDL_TEST_TORCH_VENV,
//! FDL_TEST_TORCH_VENV_28, and FDL_TEST_NCCL_LIB_CU13_NEWEST, a real NCCL 2.32.3) and are
//! `#[ignore]`d; with `--include-ignored` they fail when an input is missing.

use crate::common;
use common::oracle_input;
use common::torch_process::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The venv's own NCCL, as pip installed it.
fn venv_nccl(venv: &Path) -> String {
    let lib = site_packages(venv).join("nvidia/nccl/lib/libnccl.so.2");
    assert!(lib.is_file(), "{} is missing", lib.display());
    lib.to_str().unwrap().to_string()
}

fn torch215() -> PathBuf {
    oracle_input("FDL_TEST_TORCH_VENV")
}

/// NCCL 2.32.3 (CUDA 13), newer than the 2.30.7 torch 2.15.0 requires.
fn nccl2323() -> PathBuf {
    oracle_input("FDL_TEST_NCCL_LIB_CU13_NEWEST")
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

/// torch imported, every `nccl*` call of libtorch_cuda.so bound, NCCL's bootstrap run.
fn assert_healthy(truth: &ProcessTruth, version: &str) {
    assert_eq!(truth.import_error, None, "{truth}");
    assert_eq!(truth.torch_version.as_deref(), Some(version), "{truth}");
    assert!(
        truth.calls_reach.len() > 30 && truth.unbound.is_empty(),
        "{truth}"
    );
    assert!(truth.unique_id_ok, "{truth}");
}

/// Runs the probe in `launch`, printing what it saw (the table of the report), and holds
/// fdl to it: `fdl nccl detect` (the Python model, no witness) names the file the calls
/// reach, or is unknown when the import fails; `detect --witness` (the Python witness)
/// names the same; `fdl nccl plugins` finds the env plugin the process loaded, or none.
fn probe(case: &str, launch: Launch) -> ProcessTruth {
    let truth = run_probe(&launch);
    eprintln!("=== {case}: {launch:?}\n{truth}");
    fdl_agrees(case, &launch, &truth);
    truth
}

fn fdl_json(launch: &Launch, args: &[&str]) -> (bool, serde_json::Value) {
    let venv = launch.python.parent().unwrap().parent().unwrap();
    let lib = site_packages(venv).join("torch/lib/libtorch_cuda.so");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fdl"));
    cmd.args(["nccl", args[0]])
        .arg(&lib)
        .args(&args[1..])
        .args(["--json", "--cwd"])
        .arg(&launch.cwd)
        .current_dir(&launch.cwd);
    launch.environ(&mut cmd);
    let out = cmd.output().unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "fdl nccl {args:?} printed no JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), v)
}

fn canon(p: &str) -> PathBuf {
    Path::new(p)
        .canonicalize()
        .unwrap_or_else(|_| PathBuf::from(p))
}

fn fdl_agrees(case: &str, launch: &Launch, truth: &ProcessTruth) {
    let conforms = |name: &str, v: &serde_json::Value| {
        let errors = common::schema::validate_against(name, v);
        assert!(errors.is_empty(), "{case}: {name}: {errors:?}\n{v}");
    };
    let (ok, v) = fdl_json(launch, &["detect"]);
    conforms("nccl-detect", &v);
    assert_eq!(v["process"]["kind"], "python", "{case}: {v}");
    match &truth.import_error {
        None => {
            let file = v["nccl"]["detection"]["file"].as_str().unwrap_or_else(|| {
                panic!(
                    "{case}: fdl names no NCCL, the process runs {}: {v}",
                    truth.reached()
                )
            });
            assert!(ok, "{case}: {v}");
            assert_eq!(
                canon(file),
                canon(truth.reached()),
                "{case}: fdl's model: {v}"
            );
        }
        Some(e) => {
            assert!(
                !ok && v["found"] != "nccl",
                "{case}: the import fails ({e}), fdl answers: {v}"
            );
        }
    }
    let (_, w) = fdl_json(launch, &["detect", "--witness"]);
    conforms("nccl-detect", &w);
    match &truth.import_error {
        None => {
            let reached = w["witness"]["reached"][0]["object"]
                .as_str()
                .unwrap_or_else(|| panic!("{case}: the Python witness names no file: {w}"));
            assert_eq!(
                w["witness"]["reached"].as_array().map(Vec::len),
                Some(1),
                "{case}: {w}"
            );
            assert_eq!(
                canon(reached),
                canon(truth.reached()),
                "{case}: the witness: {w}"
            );
            assert_eq!(w["witness"]["verdict"]["verdict"], "agree", "{case}: {w}");
        }
        Some(_) => assert!(
            w["witness"]["asked"] == false && w["witness"]["none"].is_string(),
            "{case}: {w}"
        ),
    }
    if truth.import_error.is_none() {
        let (_, p) = fdl_json(launch, &["plugins"]);
        conforms("nccl-plugins", &p);
        // An NCCL without env plugins (before 2.28) has no such kind: nothing loaded.
        let env = p["kinds"]
            .as_array()
            .and_then(|k| k.iter().find(|k| k["kind"] == "env"));
        let loaded = env
            .filter(|k| k["verdict"] == "loaded")
            .and_then(|k| k["path"].as_str())
            .map(canon);
        assert_eq!(
            loaded,
            truth.env_plugin.as_deref().map(canon),
            "{case}: fdl's env plugin: {p}"
        );
    }
}

#[test]
#[ignore = "needs the torch venvs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn plain_venv_runs_its_own_nccl_wheel() {
    for (venv, version, nccl) in [
        (torch215(), "2.15.0+cu132", 23007),
        (oracle_input("FDL_TEST_TORCH_VENV_28"), "2.8.0+cu128", 22703),
    ] {
        let cwd = tempfile::tempdir().unwrap();
        let truth = probe("plain", Launch::new(&venv, cwd.path()));
        assert_healthy(&truth, version);
        let own = venv_nccl(&venv);
        assert_eq!(truth.reached(), own, "{truth}");
        assert_eq!(truth.mapped_nccl, [own.as_str()], "{truth}");
        assert_eq!(truth.nccl_versions.get(&own), Some(&nccl), "{truth}");
        assert_eq!(truth.sys_path0.as_deref(), Some(""), "{truth}");
        assert_eq!(
            (&truth.env_plugin, &truth.net_plugin),
            (&None, &None),
            "{truth}"
        );
    }
}

/// An NCCL wheel's directory on PYTHONPATH comes before site-packages on sys.path:
/// torch preloads that copy, and libtorch_cuda's NEEDED libnccl.so.2 is it.
#[test]
#[ignore = "needs the torch venvs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn nccl_on_pythonpath_wins_over_the_venvs() {
    let venv = torch215();
    let (dir, cwd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let wheel = nccl_wheel_dir(dir.path(), &nccl2323());
    let copy = s(&wheel.join("nvidia/nccl/lib/libnccl.so.2"));
    let truth = probe(
        "PYTHONPATH",
        Launch::new(&venv, cwd.path()).set("PYTHONPATH", &wheel),
    );
    assert_healthy(&truth, "2.15.0+cu132");
    assert_eq!(truth.reached(), copy, "{truth}");
    assert_eq!(truth.mapped_nccl, [copy.as_str()], "{truth}");
    assert_eq!(truth.nccl_versions.get(&copy), Some(&23203), "{truth}");
}

/// `python -c` puts the cwd first on sys.path: an nvidia/nccl/lib there is preloaded.
#[test]
#[ignore = "needs the torch venvs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn nccl_in_the_cwd_of_python_c_wins_over_the_venvs() {
    let venv = torch215();
    let dir = tempfile::tempdir().unwrap();
    let cwd = nccl_wheel_dir(dir.path(), &nccl2323());
    let copy = s(&cwd.join("nvidia/nccl/lib/libnccl.so.2"));
    let truth = probe("cwd", Launch::new(&venv, &cwd));
    assert_healthy(&truth, "2.15.0+cu132");
    assert_eq!(truth.reached(), copy, "{truth}");
    assert_eq!(truth.mapped_nccl, [copy], "{truth}");
}

/// LD_PRELOAD loads another NCCL before anything: the calls reach it; torch's preload
/// still maps the venv's copy by its path, beside it (a dlopen by path matches no
/// loaded soname). /proc/self/maps lists by address, not load order: compared as sets.
#[test]
#[ignore = "needs the torch venvs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn ld_preload_of_another_nccl_takes_the_calls() {
    let venv = torch215();
    let cwd = tempfile::tempdir().unwrap();
    let other = s(&nccl2323());
    let truth = probe(
        "LD_PRELOAD",
        Launch::new(&venv, cwd.path()).set("LD_PRELOAD", &other),
    );
    assert_healthy(&truth, "2.15.0+cu132");
    assert_eq!(truth.reached(), other, "{truth}");
    assert_eq!(
        truth.mapped_set(),
        BTreeSet::from([other.clone(), venv_nccl(&venv)]),
        "{truth}"
    );
    assert_eq!(truth.nccl_versions.get(&other), Some(&23203), "{truth}");
}

/// glibc splits LD_PRELOAD at spaces and colons both: a path with either in a directory
/// name is two names, neither a file, each skipped with ld.so's message; the process
/// runs the venv's NCCL as if nothing were preloaded.
#[test]
#[ignore = "needs the torch venvs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn ld_preload_path_with_a_space_or_colon_is_split_and_ignored() {
    let venv = torch215();
    let cwd = tempfile::tempdir().unwrap();
    for sep in [" ", ":"] {
        let dir = tempfile::tempdir().unwrap();
        let odd = dir.path().join(format!("my{sep}nccl"));
        std::fs::create_dir(&odd).unwrap();
        let lib = odd.join("libnccl.so.2");
        std::fs::copy(nccl2323(), &lib).unwrap();
        let truth = probe(
            &format!("LD_PRELOAD with {sep:?} in a directory name"),
            Launch::new(&venv, cwd.path()).set("LD_PRELOAD", &lib),
        );
        assert_healthy(&truth, "2.15.0+cu132");
        let own = venv_nccl(&venv);
        assert_eq!(truth.reached(), own, "{truth}");
        assert_eq!(truth.mapped_nccl, [own], "{truth}");
        let head = s(&dir.path().join("my"));
        assert!(
            truth.log.contains(&format!(
                "object '{head}' from LD_PRELOAD cannot be preloaded"
            )),
            "{truth}"
        );
    }
}

/// LD_LIBRARY_PATH holding another libnccl.so.2 changes nothing: torch preloads the
/// venv's copy by its path, and libtorch_cuda's NEEDED libnccl.so.2 is that object
/// (the soname is taken) before any directory is searched; were it not, libtorch_cuda's
/// DT_RPATH (not RUNPATH) names the venv's nvidia/nccl/lib, searched before
/// LD_LIBRARY_PATH (see the torch 2.8 test, which does not preload).
#[test]
#[ignore = "needs the torch venvs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn ld_library_path_nccl_loses_to_torchs_preload() {
    let venv = torch215();
    let cwd = tempfile::tempdir().unwrap();
    let other = nccl2323();
    let truth = probe(
        "LD_LIBRARY_PATH",
        Launch::new(&venv, cwd.path()).set("LD_LIBRARY_PATH", other.parent().unwrap()),
    );
    assert_healthy(&truth, "2.15.0+cu132");
    let own = venv_nccl(&venv);
    assert_eq!(truth.reached(), own, "{truth}");
    assert_eq!(truth.mapped_nccl, [own], "{truth}");
}

/// torch without its NCCL wheel: nothing to preload, and the directory
/// libtorch_cuda.so's DT_RPATH names for NCCL is gone, so `import torch` fails; with an NCCL on LD_LIBRARY_PATH it
/// imports and runs that one.
#[test]
#[ignore = "needs the torch venvs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn venv_without_the_nccl_wheel() {
    let venv = torch215();
    let beside = dir_beside(&venv);
    let bare = venv_without_nccl(&venv, beside.path());
    let cwd = tempfile::tempdir().unwrap();
    let truth = probe("NCCL wheel missing", Launch::new(&bare, cwd.path()));
    let error = truth.import_error.as_deref().unwrap_or_default();
    assert!(error.contains("libnccl.so.2"), "{truth}");
    assert!(
        truth.mapped_nccl.is_empty() && truth.libtorch_cuda.is_none(),
        "{truth}"
    );

    let other = nccl2323();
    let truth = probe(
        "NCCL wheel missing, LD_LIBRARY_PATH",
        Launch::new(&bare, cwd.path()).set("LD_LIBRARY_PATH", other.parent().unwrap()),
    );
    assert_healthy(&truth, "2.15.0+cu132");
    // The hard-linked copy runs as a venv of its own: its torch, not the cached one's.
    let torch_cuda = truth.libtorch_cuda.as_deref().unwrap_or_default();
    assert!(torch_cuda.starts_with(&s(&bare)), "{truth}");
    assert_eq!(truth.reached(), s(&other), "{truth}");
    assert_eq!(truth.mapped_nccl, [s(&other)], "{truth}");
}

/// An env plugin beside the pip NCCL (site-packages/nvidia/nccl/lib) is not found: the
/// NCCL torch loaded with ctypes has no RPATH pointing there. In a directory on
/// LD_LIBRARY_PATH it is loaded by NCCL's bootstrap.
#[test]
#[ignore = "needs the torch venvs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn env_plugin_beside_pip_nccl_is_not_loaded_but_on_ld_library_path_is() {
    let venv = torch215();
    let beside = dir_beside(&venv);
    let copy = venv_copy(&venv, beside.path());
    let plugin = env_plugin(&site_packages(&copy).join("nvidia/nccl/lib"));
    let cwd = tempfile::tempdir().unwrap();
    let truth = probe(
        "env plugin beside the pip NCCL",
        Launch::new(&copy, cwd.path()).set("NCCL_DEBUG", "INFO"),
    );
    assert_healthy(&truth, "2.15.0+cu132");
    assert_eq!(truth.reached(), venv_nccl(&copy), "{truth}");
    assert_eq!(truth.env_plugin, None, "{} {truth}", plugin.display());
    assert!(
        truth
            .log
            .contains("ENV/Plugin: Could not find: libnccl-env.so"),
        "{truth}"
    );

    let dir = tempfile::tempdir().unwrap();
    let plugin = env_plugin(dir.path());
    let truth = probe(
        "env plugin on LD_LIBRARY_PATH",
        Launch::new(&venv, cwd.path())
            .set("LD_LIBRARY_PATH", dir.path())
            .set("NCCL_DEBUG", "INFO"),
    );
    assert_healthy(&truth, "2.15.0+cu132");
    assert_eq!(truth.reached(), venv_nccl(&venv), "{truth}");
    assert_eq!(truth.env_plugin, Some(s(&plugin)), "{truth}");
    assert!(
        truth.log.contains("ENV/Plugin: Using fdl-test-env"),
        "{truth}"
    );
}

/// torch 2.8.0 preloads nothing from sys.path while its libtorch_global_deps.so loads
/// (the preload is its fallback there): an NCCL wheel directory on PYTHONPATH or in the
/// cwd is not even mapped. Nor does LD_LIBRARY_PATH win: libtorch_cuda.so names
/// `$ORIGIN/../../nvidia/nccl/lib` in a DT_RPATH (not RUNPATH), which glibc searches
/// before LD_LIBRARY_PATH. The venv's own NCCL runs in all three.
#[test]
#[ignore = "needs the torch venvs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn torch28_runs_its_own_nccl_over_sys_path_and_ld_library_path() {
    let venv = oracle_input("FDL_TEST_TORCH_VENV_28");
    // NCCL 2.27.5 (CUDA 12), newer than the 2.27.3 torch 2.8.0 requires.
    let cu12 = oracle_input("FDL_TEST_NCCL_LIB");
    let own = venv_nccl(&venv);
    let dir = tempfile::tempdir().unwrap();
    let wheel = nccl_wheel_dir(dir.path(), &cu12);
    let cwd = tempfile::tempdir().unwrap();
    for (case, launch) in [
        (
            "torch 2.8 PYTHONPATH",
            Launch::new(&venv, cwd.path()).set("PYTHONPATH", &wheel),
        ),
        ("torch 2.8 cwd", Launch::new(&venv, &wheel)),
        (
            "torch 2.8 LD_LIBRARY_PATH",
            Launch::new(&venv, cwd.path()).set("LD_LIBRARY_PATH", cu12.parent().unwrap()),
        ),
    ] {
        let truth = probe(case, launch);
        assert_healthy(&truth, "2.8.0+cu128");
        assert_eq!(truth.reached(), own, "{truth}");
        assert_eq!(truth.mapped_nccl, [own.as_str()], "{truth}");
        assert_eq!(truth.nccl_versions.get(&own), Some(&22703), "{truth}");
    }
}

/// A pip torch registered as a variant is answered for Python everywhere: `libtorch add`
/// records who runs it and the NCCL its own import opens; `libtorch info`, `nccl detect`
/// and `nccl plugins` say which process they answer for and follow PYTHONPATH as the
/// process does; `--process program` answers for a program linking it; the build's tag
/// is the torch's own NCCL whatever the caller's PYTHONPATH holds.
#[test]
#[ignore = "needs the torch venvs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn a_pip_variant_is_answered_for_the_python_process() {
    let venv = torch215();
    let torch = site_packages(&venv).join("torch");
    let (proj, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::write(proj.path().join("fdl.yml"), "").unwrap();
    let wheel = nccl_wheel_dir(dir.path(), &nccl2323());
    let copy = s(&wheel.join("nvidia/nccl/lib/libnccl.so.2"));
    let fdl = |pythonpath: Option<&Path>, args: &[&str]| {
        let launch = Launch::new(&venv, proj.path());
        let launch = match pythonpath {
            Some(p) => launch.set("PYTHONPATH", p),
            None => launch,
        };
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fdl"));
        cmd.args(args).current_dir(proj.path());
        launch.environ(&mut cmd);
        cmd.env_remove("FDL_ROOT");
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        (
            out.status.success(),
            stdout,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let json = |name: &str, out: &str| -> serde_json::Value {
        let v: serde_json::Value = serde_json::from_str(out).unwrap();
        let errors = common::schema::validate_against(name, &v);
        assert!(errors.is_empty(), "{name}: {errors:?}\n{v}");
        v
    };

    let (ok, out, err) = fdl(
        None,
        &["libtorch", "add", "pip", torch.to_str().unwrap(), "--json"],
    );
    assert!(ok, "{out}{err}");
    let add = json("libtorch-add", &out);
    assert_eq!(add["arch"]["process"], "python", "{add}");
    assert_eq!(add["arch"]["nccl"], "2.30.7", "{add}");
    let interpreter = add["arch"]["python"].as_str().unwrap();
    assert_eq!(
        canon(interpreter),
        canon(venv.join("bin/python").to_str().unwrap()),
        "{add}"
    );

    // The process's NCCL, as PYTHONPATH makes it.
    for (pythonpath, nccl) in [
        (None, venv_nccl(&venv)),
        (Some(wheel.as_path()), copy.clone()),
    ] {
        let (ok, out, err) = fdl(pythonpath, &["libtorch", "info", "--json"]);
        assert!(ok, "{out}{err}");
        let info = json("libtorch-info", &out);
        assert_eq!(info["process"]["kind"], "python", "{info}");
        assert_eq!(
            canon(info["nccl"]["detection"]["file"].as_str().unwrap()),
            canon(&nccl),
            "{info}"
        );
        let (ok, out, err) = fdl(pythonpath, &["nccl", "detect"]);
        assert!(ok, "{out}{err}");
        assert!(
            out.lines()
                .next()
                .unwrap()
                .starts_with("For a Python process: "),
            "{out}"
        );
        let (ok, out, err) = fdl(pythonpath, &["nccl", "detect", "--json"]);
        assert!(ok, "{out}{err}");
        let v = json("nccl-detect", &out);
        assert_eq!(
            canon(v["detection"]["file"].as_str().unwrap()),
            canon(&nccl),
            "{v}"
        );
        // A build is of the torch's own NCCL, whatever this shell's PYTHONPATH holds.
        let cuda_home = oracle_input("FDL_TEST_CUDA_HOME_NEWEST");
        let (_, out, err) = fdl(
            pythonpath,
            &[
                "nccl",
                "build",
                "--dry-run",
                "--json",
                "--archs",
                "8.6",
                "--backend",
                "native",
                "--cuda-home",
                cuda_home.to_str().unwrap(),
            ],
        );
        let plan: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("no plan ({e}): {out}{err}"));
        assert_eq!(plan["plan"]["tag"], "v2.30.7-1", "{plan}");
        assert_eq!(plan["plan"]["tag_origin"]["process"], "python", "{plan}");
    }
    // A program linking the same library: its DT_RPATH finds the venv's, PYTHONPATH or not.
    let (ok, out, err) = fdl(
        Some(&wheel),
        &["nccl", "detect", "--json", "--process", "program"],
    );
    assert!(ok, "{out}{err}");
    let v = json("nccl-detect", &out);
    assert_eq!(v["process"]["kind"], "program", "{v}");
    assert_eq!(
        canon(v["detection"]["file"].as_str().unwrap()),
        canon(&venv_nccl(&venv)),
        "{v}"
    );
    let (ok, out, _) = fdl(None, &["nccl", "detect", "--process", "program"]);
    assert!(
        ok && out.starts_with("For a program that links libtorch_cuda.so"),
        "{out}"
    );
    // --cwd is for a Python process only, said before anything is answered.
    let (ok, out, err) = fdl(
        None,
        &["nccl", "detect", "--process", "program", "--cwd", "/"],
    );
    assert!(!ok && out.is_empty() && err.contains("--cwd"), "{out}{err}");
}

/// A worker whose variant is a pip torch reports its ranks' NCCL as a Python process's,
/// with the env: block's PYTHONPATH; the loader's trace (status's default witness) is not
/// taken for Python; `--python-witness` imports torch there and agrees with the process.
#[test]
#[ignore = "needs the torch venvs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn a_workers_report_answers_for_its_python_ranks() {
    let venv = torch215();
    let torch = site_packages(&venv).join("torch");
    let (proj, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::write(proj.path().join("fdl.yml"), "").unwrap();
    let wheel = nccl_wheel_dir(dir.path(), &nccl2323());
    let copy = s(&wheel.join("nvidia/nccl/lib/libnccl.so.2"));
    let fdl = |args: &[&str]| -> serde_json::Value {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fdl"));
        cmd.args(args).current_dir(proj.path());
        Launch::new(&venv, proj.path()).environ(&mut cmd);
        cmd.env_remove("FDL_ROOT");
        let out = cmd.output().unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "fdl {args:?}: no JSON ({e}): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    };
    fdl(&["libtorch", "add", "pip", torch.to_str().unwrap(), "--json"]);
    let env = format!("PYTHONPATH={}", wheel.display());
    for (args, nccl) in [
        (vec![], venv_nccl(&venv)),
        (vec!["--env", env.as_str()], copy.clone()),
    ] {
        // The process itself, started in the checkout as the report assumes.
        let mut launch = Launch::new(&venv, proj.path());
        if !args.is_empty() {
            launch = launch.set("PYTHONPATH", &wheel);
        }
        let truth = run_probe(&launch);
        assert_eq!(canon(truth.reached()), canon(&nccl), "{truth}");

        let mut plain = vec!["cluster", "self", "--json"];
        plain.extend(&args);
        let r = fdl(&plain);
        assert_eq!(
            canon(r["effective"]["known"]["file"].as_str().unwrap()),
            canon(&nccl),
            "{r}"
        );
        assert_eq!(
            canon(r["libtorch"]["known"]["python"].as_str().unwrap()),
            canon(venv.join("bin/python").to_str().unwrap()),
            "{r}"
        );
        // The torch's own NCCL, whatever the env: block adds.
        assert_eq!(
            canon(
                r["libtorch"]["known"]["nccl"]["known"]["file"]
                    .as_str()
                    .unwrap()
            ),
            canon(&venv_nccl(&venv)),
            "{r}"
        );
        assert_eq!(r["witness"]["verdict"], "none", "{r}");
        let mut asked = plain.clone();
        asked.push("--python-witness");
        let r = fdl(&asked);
        assert_eq!(r["witness"]["verdict"], "agree", "{r}");
        assert_eq!(r["witness"]["python"], true, "{r}");
        // Asked for a program linking it: the loader's DT_RPATH answer, PYTHONPATH or not,
        // and its loader as the witness.
        let mut program = plain.clone();
        program.extend(["--process", "program"]);
        let rp = fdl(&program);
        assert_eq!(
            canon(rp["effective"]["known"]["file"].as_str().unwrap()),
            canon(&venv_nccl(&venv)),
            "{rp}"
        );
        assert!(rp["libtorch"]["known"].get("python").is_none(), "{rp}");
        assert_eq!(rp["witness"]["verdict"], "agree", "{rp}");
        assert!(rp["witness"].get("python").is_none(), "{rp}");
        assert_eq!(
            canon(r["effective"]["known"]["file"].as_str().unwrap()),
            canon(&nccl),
            "{r}"
        );
    }
}

/// What the model leaves to Python: a `.pth` file's `import` line, which runs code at
/// startup (here, putting an NCCL wheel's directory first on sys.path). fdl never runs it,
/// so its model answers the venv's NCCL and `detect -v` names the file it did not run;
/// the Python witness imports torch as the job does, finds the calls in the other NCCL,
/// and `detect --witness` says the model is wrong here (exit 4), the process's answer
/// standing.
#[test]
#[ignore = "needs the torch venvs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn a_pth_import_line_is_not_run_and_the_witness_catches_what_it_does() {
    let cached = torch215();
    let (beside, dir) = (dir_beside(&cached), tempfile::tempdir().unwrap());
    let venv = venv_copy(&cached, beside.path());
    let wheel = nccl_wheel_dir(dir.path(), &nccl2323());
    let copy = s(&wheel.join("nvidia/nccl/lib/libnccl.so.2"));
    let pth = site_packages(&venv).join("zz-fdl-test.pth");
    std::fs::write(
        &pth,
        format!(
            "import sys; sys.path.insert(0, {:?})\n",
            wheel.to_str().unwrap()
        ),
    )
    .unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let launch = Launch::new(&venv, cwd.path());
    let truth = run_probe(&launch);
    assert_eq!(canon(truth.reached()), canon(&copy), "{truth}");

    let lib = site_packages(&venv).join("torch/lib/libtorch_cuda.so");
    let run = |args: &[&str]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fdl"));
        cmd.args(["nccl", "detect"])
            .arg(&lib)
            .args(args)
            .current_dir(cwd.path());
        launch.environ(&mut cmd);
        cmd.output().unwrap()
    };
    let out = run(&["-v"]);
    let text = String::from_utf8_lossy(&out.stdout).replace("\n            ", " ");
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("zz-fdl-test.pth: its import lines run code"),
        "{text}"
    );
    assert!(text.contains(&venv_nccl(&venv)), "{text}");

    let out = run(&["--witness", "--json"]);
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["witness"]["verdict"]["verdict"], "disagree", "{v}");
    assert_eq!(
        canon(v["witness"]["verdict"]["process"].as_str().unwrap()),
        canon(&copy),
        "{v}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("model of this Python process is wrong here"),
        "{err}"
    );
}

/// An interpreter with a DT_RPATH of its own (conda's Python: `$ORIGIN/../lib`): NCCL,
/// opened by path as torch's ctypes does, inherits the main program's DT_RPATH for its
/// plugin dlopen, so an env plugin in the interpreter's `lib/` is found. The oracle is a
/// program with that DT_RPATH that opens the venv's real NCCL by path and runs its
/// bootstrap (`ncclGetUniqueId`, which loads the env plugin); fdl answers that venv's
/// Python process the same.
#[test]
#[ignore = "needs the torch venvs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn an_interpreters_own_rpath_reaches_the_plugins_of_its_nccl() {
    let cached = torch215();
    let beside = dir_beside(&cached);
    let venv = venv_copy(&cached, beside.path());
    // The venv's interpreter, replaced by a program with conda's DT_RPATH that does what
    // matters here of a Python importing torch: opens NCCL by path, locally.
    let program = venv.join("bin/python3.11");
    std::fs::remove_file(&program).unwrap();
    let src = beside.path().join("interp.c");
    std::fs::write(
        &src,
        r#"#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 2; }
    int (*id)(void *) = (int (*)(void *))dlsym(h, "ncclGetUniqueId");
    char buf[256];
    if (!id || id(buf) != 0) return 3;
    FILE *m = fopen("/proc/self/maps", "r");
    char line[4096];
    while (fgets(line, sizeof line, m))
        if (strstr(line, "libnccl-env")) { fputs(strchr(line, '/'), stdout); break; }
    return 0;
}
"#,
    )
    .unwrap();
    let out = std::process::Command::new("cc")
        .arg(&src)
        .args([
            "-O1",
            "-Wl,--disable-new-dtags",
            "-Wl,-rpath,$ORIGIN/../lib",
            "-o",
        ])
        .arg(&program)
        .arg("-ldl")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plugin = env_plugin(&venv.join("lib"));
    let nccl = venv_nccl(&venv);

    let cwd = tempfile::tempdir().unwrap();
    let launch = Launch::new(&venv, cwd.path());
    let mut cmd = std::process::Command::new(&program);
    cmd.arg(&nccl).current_dir(cwd.path());
    launch.environ(&mut cmd);
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mapped = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(
        canon(&mapped),
        canon(plugin.to_str().unwrap()),
        "the process maps {mapped:?}"
    );

    let (_, p) = fdl_json(&launch, &["plugins"]);
    let env = p["kinds"]
        .as_array()
        .and_then(|k| k.iter().find(|k| k["kind"] == "env"))
        .unwrap_or_else(|| panic!("no env kind: {p}"));
    assert_eq!(env["verdict"], "loaded", "{p}");
    assert_eq!(
        canon(env["path"].as_str().unwrap()),
        canon(plugin.to_str().unwrap()),
        "{p}"
    );
}

/// torch's fallback: the CUDA wheels installed apart from torch (its `nvidia/` directory
/// in another sys.path entry, as a purelib/platlib split leaves it), so that
/// `libtorch_global_deps.so`'s DT_RPATH finds no libcudart and its load fails; torch then
/// preloads every library of its table from sys.path, NCCL among them, and loads it
/// again. Both torches take that path (2.8 preloads NCCL only there), and fdl's model,
/// its witness and the process agree on the NCCL in the other entry.
#[test]
#[ignore = "needs the torch venvs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn cuda_wheels_apart_from_torch_take_its_fallback_preloads() {
    for (venv, version) in [
        (torch215(), "2.15.0+cu132"),
        (oracle_input("FDL_TEST_TORCH_VENV_28"), "2.8.0+cu128"),
    ] {
        let beside = dir_beside(&venv);
        let copy = venv_copy(&venv, beside.path());
        let apart = beside.path().join("platlib");
        std::fs::create_dir_all(&apart).unwrap();
        std::fs::rename(site_packages(&copy).join("nvidia"), apart.join("nvidia")).unwrap();
        let nccl = s(&apart.join("nvidia/nccl/lib/libnccl.so.2"));
        let cwd = tempfile::tempdir().unwrap();
        let truth = probe(
            &format!("torch {version}, CUDA wheels on PYTHONPATH"),
            Launch::new(&copy, cwd.path()).set("PYTHONPATH", &apart),
        );
        assert_healthy(&truth, version);
        assert_eq!(canon(truth.reached()), canon(&nccl), "{truth}");
        // Without that entry, the fallback finds nothing and the import fails; fdl says
        // so rather than naming an NCCL.
        let truth = probe(
            &format!("torch {version}, CUDA wheels nowhere on sys.path"),
            Launch::new(&copy, cwd.path()),
        );
        assert!(truth.import_error.is_some(), "{truth}");
    }
}
