//! `fdl libtorch add NAME PATH` for an unpacked libtorch archive and a pip torch.

use crate::common;
use common::*;
use predicates::prelude::*;
use std::path::Path;

/// An unpacked libtorch archive: lib/libtorch_cuda.so with NCCL inside, build-version.
fn archive(dir: &Path) {
    std::fs::create_dir_all(dir.join("lib")).unwrap();
    std::fs::create_dir_all(dir.join("include/torch")).unwrap();
    std::fs::write(dir.join("build-version"), "2.8.0+cu128\n").unwrap();
    compile_shared(
        &format!(
            "{}{}",
            nccl_like_source((2, 27, 3), "12.8"),
            fatbin_c_source(&[61, 86, 120], "torch_fatbin")
        ),
        &dir.join("lib/libtorch_cuda.so"),
        &[],
    );
}

/// site-packages/torch loading site-packages/nvidia/nccl/lib/libnccl.so.2.
fn pip_torch(site: &Path) -> std::path::PathBuf {
    let nccl_dir = site.join("nvidia/nccl/lib");
    let torch = site.join("torch");
    std::fs::create_dir_all(&nccl_dir).unwrap();
    std::fs::create_dir_all(torch.join("lib")).unwrap();
    std::fs::write(
        torch.join("version.py"),
        "from typing import Optional\n__version__ = '2.9.1+cu130'\ncuda: Optional[str] = '13.0'\n",
    )
    .unwrap();
    compile_shared(
        &nccl_like_source((2, 28, 9), "13.0"),
        &nccl_dir.join("libnccl.so.2"),
        &["-Wl,-soname,libnccl.so.2"],
    );
    compile_shared(
        &format!("extern int ncclGetVersion(int*); int f(void) {{ int v; return ncclGetVersion(&v); }}\n{}", fatbin_c_source(&[75, 120], "fb")),
        &torch.join("lib/libtorch_cuda.so"),
        &["-L", nccl_dir.to_str().unwrap(), "-l:libnccl.so.2", "-Wl,--enable-new-dtags,-rpath,$ORIGIN/../../nvidia/nccl/lib"],
    );
    torch
}

#[test]
fn registers_an_archive_as_links_with_arch_from_the_binaries() {
    let p = ProjectFixture::empty();
    let src = tempfile::tempdir().unwrap();
    archive(src.path());
    let before_src = snapshot(src.path());
    fdl_in(p.root())
        .args(["libtorch", "add", "cu128"])
        .arg(src.path())
        .assert()
        .success()
        .stdout(predicate::str::contains("Registered precompiled/cu128"));
    let dir = p.root().join("libtorch/precompiled/cu128");
    assert!(std::fs::symlink_metadata(dir.join("lib"))
        .unwrap()
        .file_type()
        .is_symlink());
    let arch = std::fs::read_to_string(dir.join(".arch")).unwrap();
    for line in [
        "torch=2.8.0+cu128",
        "cuda=12.8",
        "archs=6.1;8.6;12.0",
        "nccl=2.27.3",
        "nccl_linkage=static",
    ] {
        assert!(
            arch.lines().any(|l| l == line),
            "{line} missing in:\n{arch}"
        );
    }
    assert_eq!(
        snapshot(src.path()),
        before_src,
        "the registered libtorch was modified"
    );
    // It is a variant like any other.
    fdl_in(p.root())
        .args(["libtorch", "activate", "precompiled/cu128"])
        .assert()
        .success();
    let out = fdl_in(p.root())
        .args(["nccl", "build", "--archs", "8.6", "--dry-run", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["plan"]["tag"], "v2.27.3-1");
}

/// A pip torch whose nvidia-nccl wheel is not installed: the loader cannot find
/// libnccl.so.2, and the version torch's METADATA pins is the answer everywhere —
/// `libtorch add` records it as pinned, `nccl detect` says unknown and names it (exit 3),
/// and the build's tag is inferred from it.
#[test]
fn a_pip_torch_without_its_nccl_wheel_answers_with_the_pinned_version_everywhere() {
    let p = ProjectFixture::empty();
    let site = tempfile::tempdir().unwrap();
    let torch = pip_torch(site.path());
    std::fs::remove_dir_all(site.path().join("nvidia")).unwrap();
    let dist = site.path().join("torch-2.9.1.dist-info");
    std::fs::create_dir_all(&dist).unwrap();
    std::fs::write(
        dist.join("METADATA"),
        "Metadata-Version: 2.1\nName: torch\nVersion: 2.9.1\nRequires-Dist: filelock\nRequires-Dist: nvidia-nccl-cu13==2.28.9; platform_system == \"Linux\"\n\nA description mentioning Requires-Dist: nvidia-nccl-cu13==9.9.9\n",
    )
    .unwrap();
    let out = fdl_in(p.root())
        .env_remove("LD_LIBRARY_PATH")
        .args(["libtorch", "add", "pip", "--json"])
        .arg(&torch)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["arch"]["nccl"], "2.28.9", "{v}");
    assert_eq!(
        v["arch"]["nccl_linkage"], "pinned by nvidia-nccl-cu13, not installed",
        "{v}"
    );
    let lib = p
        .root()
        .join("libtorch/precompiled/pip/lib/libtorch_cuda.so");
    let out = fdl_in(p.root())
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("LD_PRELOAD")
        .args(["nccl", "detect", "--json"])
        .arg(&lib)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["answer"], "unknown");
    assert_eq!(v["pin"]["version"], "2.28.9", "{v}");
    assert_eq!(v["pin"]["distribution"], "nvidia-nccl-cu13", "{v}");
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.contains("pip install nvidia-nccl-cu13==2.28.9"),
        "{reason}"
    );
    let out = fdl_in(p.root())
        .env_remove("LD_LIBRARY_PATH")
        .args(["nccl", "build", "--archs", "8.6", "--dry-run", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["plan"]["tag"], "v2.28.9-1", "{v}");
    assert!(
        v["plan"]["tag_origin"]["linkage"]
            .as_str()
            .unwrap()
            .contains("nvidia-nccl-cu13==2.28.9"),
        "{v}"
    );
}

#[test]
fn registers_a_pip_torch_with_dynamic_nccl() {
    let p = ProjectFixture::empty();
    let site = tempfile::tempdir().unwrap();
    let torch = pip_torch(site.path());
    let out = fdl_in(p.root())
        .env_remove("LD_LIBRARY_PATH")
        .args(["libtorch", "add", "pip", "--json"])
        .arg(&torch)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["arch"]["torch"], "2.9.1+cu130");
    assert_eq!(v["arch"]["cuda"], "13.0");
    assert_eq!(v["arch"]["archs"], "7.5;12.0");
    assert_eq!(v["arch"]["nccl"], "2.28.9");
    assert_eq!(v["arch"]["nccl_linkage"], "dynamic");
    assert!(v["arch"]["nccl_library"]
        .as_str()
        .unwrap()
        .ends_with("nvidia/nccl/lib/libnccl.so.2"));
    // Detection through the registered variant still finds the pip NCCL.
    fdl_in(p.root())
        .env_remove("LD_LIBRARY_PATH")
        .args(["nccl", "detect"])
        .arg(
            p.root()
                .join("libtorch/precompiled/pip/lib/libtorch_cuda.so"),
        )
        .assert()
        .success()
        .stdout(predicate::str::contains("NCCL 2.28.9").and(predicate::str::contains("dynamic")));
}

#[test]
fn bad_names_and_paths_write_nothing() {
    let p = ProjectFixture::empty();
    let src = tempfile::tempdir().unwrap();
    archive(src.path());
    let not_torch = tempfile::tempdir().unwrap();
    for (name, path, needle) in [
        ("../x", src.path().to_path_buf(), "not a variant name"),
        ("a/b", src.path().to_path_buf(), "not a variant name"),
        (
            "ok",
            not_torch.path().to_path_buf(),
            "has no lib/libtorch_cuda.so",
        ),
        ("ok", src.path().join("missing"), "cannot open"),
    ] {
        fdl_in(p.root())
            .args(["libtorch", "add", name])
            .arg(&path)
            .assert()
            .failure()
            .stderr(predicate::str::contains(needle));
        assert!(
            !p.root().join("libtorch").exists(),
            "{name} {}",
            path.display()
        );
    }
    fdl_in(p.root())
        .args(["libtorch", "add", "cu128"])
        .arg(src.path())
        .assert()
        .success();
    let before = snapshot(p.root());
    fdl_in(p.root())
        .args(["libtorch", "add", "cu128"])
        .arg(src.path())
        .assert()
        .failure()
        .stderr(predicate::str::contains("already exists"));
    assert_eq!(snapshot(p.root()), before);
}

/// fdl killed (SIGKILL) before and after `libtorch add` renames its variant into place:
/// the next run leaves exactly one complete variant and nothing beside it.
#[test]
fn a_kill_during_add_leaves_one_variant_or_none_to_redo() {
    use std::os::unix::process::ExitStatusExt;
    let src = tempfile::tempdir().unwrap();
    archive(src.path());
    let cache = tempfile::tempdir().unwrap();
    for point in ["variant:before-rename", "variant:after-rename"] {
        let p = ProjectFixture::empty();
        let precompiled = p.root().join("libtorch/precompiled");
        let add = |kill: Option<&str>| {
            let mut cmd = fdl_in(p.root());
            cmd.env("XDG_CACHE_HOME", cache.path())
                .args(["libtorch", "add", "cu128"])
                .arg(src.path());
            if let Some(k) = kill {
                cmd.env("FDL_TEST_KILL_AT", k);
            }
            cmd.output().unwrap()
        };
        let out = add(Some(point));
        assert_eq!(out.status.signal(), Some(9), "{point}: not killed");
        let out = add(None);
        let err = String::from_utf8_lossy(&out.stderr);
        if point == "variant:before-rename" {
            assert!(out.status.success(), "{point}: {err}");
            assert!(
                err.contains("left by an earlier run that was killed"),
                "{err}"
            );
        } else {
            assert!(err.contains("already exists"), "{point}: {err}");
        }
        let names: Vec<String> = std::fs::read_dir(&precompiled)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["cu128"], "{point}");
        let arch = std::fs::read_to_string(precompiled.join("cu128/.arch")).unwrap();
        assert!(arch.contains("nccl=2.27.3"), "{point}: {arch}");
        assert!(
            precompiled.join("cu128/lib/libtorch_cuda.so").is_file(),
            "{point}"
        );
    }
}

/// The official libtorch zip unpacks to `libtorch/`; one in a home directory does not make
/// the home a project, so `libtorch add` never writes into the unpacked archive.
#[test]
fn an_unpacked_libtorch_above_the_working_dir_is_not_taken_for_a_project() {
    let home = tempfile::tempdir().unwrap();
    let unpacked = home.path().join("libtorch");
    archive(&unpacked);
    let before = snapshot(&unpacked);
    let work = home.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let cache = tempfile::tempdir().unwrap();
    fdl()
        .current_dir(&work)
        .env("XDG_CACHE_HOME", cache.path())
        .args(["libtorch", "add", "cu128"])
        .arg(&unpacked)
        .assert()
        .success();
    assert_eq!(
        before,
        snapshot(&unpacked),
        "the unpacked libtorch was written into"
    );
    assert!(work.join("libtorch/precompiled/cu128/.arch").is_file());
    // Errors say which root was taken, and why.
    fdl()
        .current_dir(home.path().join("work"))
        .args(["libtorch", "activate", "nope"])
        .assert()
        .failure()
        .stderr(predicate::str::contains(format!(
            "(project root: {} (the nearest directory holding fdl.yml or a project's libtorch/))",
            work.display()
        )));
}

/// One name for a variant: `add NAME` registers precompiled/NAME, and info, activate and
/// remove take NAME as well; the first variant added becomes the active one; a variant
/// whose files are gone is listed as such and cannot be activated.
#[test]
fn a_variant_is_known_by_its_bare_name() {
    let p = ProjectFixture::empty();
    let src = tempfile::tempdir().unwrap();
    archive(src.path());
    let other = tempfile::tempdir().unwrap();
    archive(other.path());
    let cache = tempfile::tempdir().unwrap();
    let fdl = || {
        let mut c = fdl_in(p.root());
        c.env("XDG_CACHE_HOME", cache.path());
        c
    };
    fdl()
        .args(["libtorch", "add", "cu128"])
        .arg(src.path())
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "Active libtorch: precompiled/cu128 (the first variant)",
        ));
    fdl()
        .args(["libtorch", "add", "other"])
        .arg(other.path())
        .assert()
        .success()
        .stdout(predicate::str::contains("Make it active with"));
    fdl().args(["libtorch", "info", "cu128"]).assert().success();
    fdl()
        .args(["libtorch", "activate", "other"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "Active libtorch: precompiled/other",
        ));
    // The registered torch goes away: listed as missing, and not activated.
    drop(src);
    fdl()
        .args(["libtorch", "list"])
        .assert()
        .success()
        .stdout(predicate::str::is_match(r"\n  precompiled/cu128 .*  \(files missing: ").unwrap());
    fdl()
        .args(["libtorch", "activate", "cu128"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("cannot be made active"));
    fdl()
        .args(["libtorch", "remove", "other", "--yes"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("is the active libtorch"));
    fdl()
        .args(["libtorch", "remove", "cu128", "--yes"])
        .assert()
        .success();
    assert!(!p.root().join("libtorch/precompiled/cu128").exists());
    assert!(
        other.path().join("lib/libtorch_cuda.so").is_file(),
        "removal reached the torch itself"
    );
}

/// `libtorch info` keeps what `.arch` recorded apart from the NCCL read now, aligns its
/// keys (never `nccl_linkagedynamic`), says `none` for an empty field, and a coverage row
/// for an arch names it once.
#[test]
fn info_reads_as_a_table() {
    let p = ProjectFixture::empty();
    let src = tempfile::tempdir().unwrap();
    archive(src.path());
    let cache = tempfile::tempdir().unwrap();
    let fdl = || {
        let mut c = fdl_in(p.root());
        c.env("XDG_CACHE_HOME", cache.path());
        c
    };
    fdl()
        .args(["libtorch", "add", "cu128"])
        .arg(src.path())
        .assert()
        .success();
    let out = fdl()
        .args(["libtorch", "info", "cu128", "--archs", "6.1;7.0"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("recorded in .arch when it was added:"),
        "{text}"
    );
    assert!(text.contains("  NCCL now: 2.27.3"), "{text}");
    for line in text.lines().filter(|l| l.starts_with("    ")) {
        let mut words = line.split_whitespace();
        let (key, value) = (words.next().unwrap(), words.next());
        assert!(
            value.is_some(),
            "key without a value (or glued to it): {line:?}"
        );
        assert!(
            !key.contains("dynamic") && !key.contains("static"),
            "{line:?}"
        );
    }
    assert!(text.contains("\n  sm_61  native SASS (sm_61)"), "{text}");
    assert!(text.contains("\n  sm_70  NOT COVERED"), "{text}");
}

/// Lays out `site` as pip installs torch 2.15 from the oracle wheels: the real
/// `libtorch_cuda.so`, `version.py`, the NCCL wheel's `libnccl.so.2` and dist-info, and
/// torch's own `METADATA` from its wheel; every other library torch needs is an empty
/// stand-in, except `missing`, which are left out as on a login or controller node.
fn pip_torch_215(site: &Path, missing: &[&str]) -> std::path::PathBuf {
    let real = oracle_input("FDL_TEST_TORCH_LIB_CU13");
    let unpacked = real.ancestors().nth(3).unwrap().to_path_buf();
    for rel in [
        "torch/lib/libtorch_cuda.so",
        "torch/version.py",
        "nvidia/nccl/lib/libnccl.so.2",
    ] {
        let to = site.join(rel);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(unpacked.join(rel), &to)
            .unwrap_or_else(|e| panic!("{}: {e}", unpacked.join(rel).display()));
    }
    for e in std::fs::read_dir(&unpacked).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".dist-info") {
            std::fs::create_dir_all(site.join(&name)).unwrap();
            std::fs::copy(e.path().join("METADATA"), site.join(&name).join("METADATA")).unwrap();
        }
    }
    let cache = std::env::var_os("FDL_ORACLE_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(&std::env::var_os("HOME").unwrap()).join(".cache/fdl-wheels"));
    let wheel = cache.join("torch-2.15.0-cp311-cp311-manylinux_2_28_x86_64.whl");
    assert!(
        wheel.is_file(),
        "{}: the torch 2.15.0 wheel is missing; run `source .ci/setup`",
        wheel.display()
    );
    let dist = site.join("torch-2.15.0.dist-info");
    std::fs::create_dir_all(&dist).unwrap();
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read('torch-2.15.0.dist-info/METADATA')[:4<<20])"])
        .arg(&wheel)
        .output()
        .expect("python3 is needed for this test");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(dist.join("METADATA"), &out.stdout).unwrap();
    let lib = site.join("torch/lib/libtorch_cuda.so");
    let stubs = stubs_for_missing(&lib);
    let mut left_out = 0;
    for e in std::fs::read_dir(stubs.path()).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if missing.contains(&name.as_str()) {
            left_out += 1;
            continue;
        }
        let to = site.join("torch/lib").join(&name);
        std::fs::copy(e.path(), &to).unwrap();
    }
    assert_eq!(
        left_out,
        missing.len(),
        "not all of {missing:?} are missing on this machine"
    );
    site.join("torch")
}

/// A pip torch whose CUDA libraries are not all installed here: the NCCL the calls reach
/// is found, and everything that acts on it uses it with its condition said; `detect`
/// still answers unknown. The torch wheel's dist-info pin, which agrees, is named.
#[test]
#[ignore = "needs the real torch 2.15 wheel of `source .ci/setup`: `cargo test --test it cli_libtorch_add:: -- --include-ignored`"]
fn a_torch_with_cuda_libraries_missing_here_plans_from_the_conditional_answer() {
    // Five of the libraries libtorch_cuda.so needs before libnccl.so.2.
    let missing = [
        "libcudart.so.13",
        "libcusparse.so.12",
        "libcufft.so.12",
        "libcufile.so.0",
        "libcusparseLt.so.0",
    ];
    let site = tempfile::tempdir().unwrap();
    let torch = pip_torch_215(site.path(), &missing);
    let nccl = fdl::inspect::find_nccl_self_id(&site.path().join("nvidia/nccl/lib/libnccl.so.2"))
        .unwrap()
        .expect("the NCCL wheel's library has a self-id")
        .nccl
        .to_string();
    let p = ProjectFixture::empty();
    let out = fdl_in(p.root())
        .env_remove("LD_LIBRARY_PATH")
        .args(["libtorch", "add", "pip", "--json"])
        .arg(&torch)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["arch"]["nccl"], nccl.as_str(), "{v}");
    assert_eq!(v["arch"]["nccl_linkage"], "dynamic", "{v}");
    assert_eq!(
        v["arch"]["nccl_condition"],
        format!("assuming none of the 5 libraries missing here defines nccl* (libcudart.so.13, libcufft.so.12, libcufile.so.0, libcusparse.so.12, …)"),
        "{v}"
    );
    let pin = v["arch"]["nccl_pin"].as_str().unwrap_or_default();
    assert!(
        pin.contains(&format!("nvidia-nccl-cu13=={nccl}, the same release")),
        "{v}"
    );

    // detect keeps answering unknown (exit 3), with the conditional answer.
    let lib = p
        .root()
        .join("libtorch/precompiled/pip/lib/libtorch_cuda.so");
    let out = fdl_in(p.root())
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("LD_PRELOAD")
        .args(["nccl", "detect", "--json"])
        .arg(&lib)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(d["answer"], "unknown");
    assert_eq!(
        d["conditional"]["detection"]["version"],
        nccl.as_str(),
        "{d}"
    );
    assert_eq!(d["conditional"]["only_missing"], true, "{d}");
    assert_eq!(
        d["conditional"]["missing"].as_array().unwrap().len(),
        5,
        "{d}"
    );

    // The build plans from it, and says so as a warning.
    let out = fdl_in(p.root())
        .env_remove("LD_LIBRARY_PATH")
        .args(["nccl", "build", "--archs", "8.6", "--dry-run", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let b: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(b["plan"]["tag"], format!("v{nccl}-1"), "{b}");
    let warnings = b["plan"]["warnings"].to_string();
    assert!(
        warnings.contains(&format!("NCCL {nccl} from "))
            && warnings.contains("assuming none of the 5 libraries missing here defines nccl*")
            && warnings.contains("the same release"),
        "{warnings}"
    );
    assert!(
        b["plan"]["tag_origin"]["linkage"]
            .as_str()
            .unwrap()
            .contains("assuming none of the 5 libraries missing here"),
        "{b}"
    );
}

/// `libtorch list` shows each variant's torch, CUDA, NCCL and linkage as `libtorch add`
/// recorded them, and says when the record is stale (the library changed since), with
/// pasteable commands, rather than inspecting the library again.
#[test]
fn list_shows_the_recorded_facts_and_says_when_they_are_stale() {
    let p = ProjectFixture::empty();
    let src = tempfile::tempdir().unwrap();
    archive(&src.path().join("it's here"));
    let site = tempfile::tempdir().unwrap();
    let torch = pip_torch(site.path());
    for (name, path) in [
        ("cu128", src.path().join("it's here")),
        ("pip", torch.clone()),
    ] {
        fdl_in(p.root())
            .args(["libtorch", "add", name])
            .arg(&path)
            .assert()
            .success()
            // The fingerprints are recorded, not shown.
            .stdout(predicate::str::contains("_stat").not());
    }
    let list = |json: bool| {
        let mut cmd = fdl_in(p.root());
        cmd.args(["libtorch", "list"]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let text = list(false);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0], "  VARIANT            TORCH        CUDA  NCCL    LINKAGE",
        "{text}"
    );
    assert_eq!(
        lines[1], "* precompiled/cu128  2.8.0+cu128  12.8  2.27.3  static",
        "{text}"
    );
    assert_eq!(
        lines[2], "  precompiled/pip    2.9.1+cu130  13.0  2.28.9  dynamic",
        "{text}"
    );
    assert_eq!(lines.len(), 3, "{text}");
    let v: serde_json::Value = serde_json::from_str(&list(true)).unwrap();
    assert_eq!(v["variants"][1]["arch"]["nccl"], "2.28.9");
    assert_eq!(v["variants"][1]["record"]["state"], "current");
    assert!(
        v["variants"][1]["arch"]["nccl_library_stat"].is_string(),
        "{v}"
    );

    // Both libraries change after they were added: each record is stale, its facts still
    // the recorded ones, and the way to record them again is a line to paste.
    let lib = src.path().join("it's here/lib/libtorch_cuda.so");
    let mut bytes = std::fs::read(&lib).unwrap();
    bytes.extend_from_slice(b"appended");
    std::fs::write(&lib, bytes).unwrap();
    std::fs::remove_file(site.path().join("nvidia/nccl/lib/libnccl.so.2")).unwrap();
    let text = list(false);
    assert!(
        text.contains(
            "* precompiled/cu128  2.8.0+cu128  12.8  2.27.3  static   (stale: see below)"
        ),
        "{text}"
    );
    assert!(
        text.contains("precompiled/cu128 is stale: ")
            && text.contains("libtorch_cuda.so changed since it was recorded"),
        "{text}"
    );
    assert!(
        text.contains("precompiled/pip is stale: ")
            && text.contains("libnccl.so.2 is gone since it was recorded"),
        "{text}"
    );
    assert!(
        text.contains("  Its facts as they are now: fdl libtorch info 'precompiled/cu128'"),
        "{text}"
    );
    // The active one cannot be removed, so only the inactive one is offered to redo.
    let redo = format!(
        "  Record them again: fdl libtorch remove 'precompiled/pip' --yes && fdl libtorch add 'pip' '{}'",
        torch.canonicalize().unwrap().display()
    );
    assert!(text.contains(&redo), "{text}");
    assert_eq!(text.matches("Record them again").count(), 1, "{text}");
    let v: serde_json::Value = serde_json::from_str(&list(true)).unwrap();
    assert_eq!(v["variants"][0]["record"]["state"], "stale");
    assert_eq!(v["variants"][0]["arch"]["nccl"], "2.27.3");
    assert!(v["variants"][1]["record"]["why"]
        .as_str()
        .unwrap()
        .contains("libnccl.so.2"));

    // The pasted line works, with the quote in the path, and the record is current.
    fdl_in(p.root())
        .args(["libtorch", "activate", "pip"])
        .assert()
        .success();
    let text = list(false);
    let redo = text
        .lines()
        .find_map(|l| l.strip_prefix("  Record them again: "))
        .unwrap_or_else(|| panic!("{text}"))
        .to_string();
    assert!(redo.contains("'\\''"), "{redo}");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(&redo)
        .current_dir(p.root())
        .env(
            "PATH",
            path_with(assert_cmd::cargo::cargo_bin("fdl").parent().unwrap()),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{redo}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&list(true)).unwrap();
    assert_eq!(v["variants"][0]["record"]["state"], "current", "{v}");
}

/// `libtorch add NAME …/torch/lib` names the directory above, in a command that works
/// when pasted (quoted, here with a space and a quote in the path), and writes nothing.
#[test]
fn the_lib_directory_itself_suggests_its_parent_as_a_pasteable_command() {
    let p = ProjectFixture::empty();
    let site = tempfile::tempdir().unwrap();
    let site = site.path().join("it's a site");
    let torch = pip_torch(&site);
    let out = fdl_in(p.root())
        .args(["libtorch", "add", "pip"])
        .arg(torch.join("lib"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("holds libtorch_cuda.so itself: it is the libtorch's lib/ directory"),
        "{err}"
    );
    assert!(!p.root().join("libtorch").exists());
    let line = err
        .lines()
        .find_map(|l| l.strip_prefix("  fdl libtorch add "))
        .unwrap_or_else(|| panic!("no command in: {err}"));
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("fdl libtorch add {line}"))
        .current_dir(p.root())
        .env(
            "PATH",
            path_with(assert_cmd::cargo::cargo_bin("fdl").parent().unwrap()),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{line}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Registered precompiled/pip"));
    let arch = std::fs::read_to_string(p.root().join("libtorch/precompiled/pip/.arch")).unwrap();
    assert!(arch.contains("nccl=2.28.9"), "{arch}");
}

/// `libtorch add` of a torch tree without `version.py` (the setup's torch 2.8.0+cu128
/// keeps only `libtorch_cuda.so`, whose NCCL 2.27.5 wheel was built with CUDA 12.9)
/// records torch's own CUDA as far as its libraries say it: the major version of the
/// libcudart it links (`readelf`'s NEEDED), never its NCCL's CUDA (issue 43).
#[test]
#[ignore = "needs the real wheels of `source .ci/setup` (torch 2.8.0): `cargo test -- --include-ignored`"]
fn a_torch_without_its_version_records_its_own_cuda_not_its_nccls() {
    let lib = oracle_input("FDL_TEST_TORCH_LIB");
    let torch = lib.parent().unwrap().parent().unwrap();
    assert!(!torch.join("version.py").exists(), "{}", torch.display());
    let needed = std::process::Command::new("readelf")
        .arg("-d")
        .arg(&lib)
        .output()
        .expect("readelf (binutils) is needed for this test");
    let needed = String::from_utf8_lossy(&needed.stdout);
    let major = needed
        .lines()
        .find_map(|l| l.split("[libcudart.so.").nth(1))
        .and_then(|rest| rest.split(']').next())
        .unwrap_or_else(|| panic!("no libcudart in NEEDED: {needed}"))
        .to_string();
    let p = ProjectFixture::empty();
    let out = fdl()
        .arg("--root")
        .arg(p.root())
        .args(["libtorch", "add", "t28", "--json"])
        .arg(torch)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["arch"]["cuda"], major.as_str(), "{v}");
    // Its NCCL's CUDA is another: what was recorded before.
    let nccl = fdl()
        .args(["inspect", "--json"])
        .arg(v["arch"]["nccl_library"].as_str().unwrap())
        .output()
        .unwrap();
    let nccl: serde_json::Value = serde_json::from_slice(&nccl.stdout).unwrap();
    assert_eq!(nccl["inspection"]["nccl"]["cuda"], "12.9", "{nccl}");
    assert_ne!(major, "12.9");
}

/// A project, a libtorch and the files asked about may sit under a directory whose name
/// is not UTF-8 (a path is any bytes): every command still answers, `--json` ones with
/// one object naming those paths with U+FFFD, and none panics (`json!` would on the path
/// itself, `env::args` on the argument).
#[test]
fn paths_that_are_not_utf8_are_shown_never_fatal() {
    use std::os::unix::ffi::OsStrExt;
    let t = tempfile::tempdir().unwrap();
    let bad = t.path().join(std::ffi::OsStr::from_bytes(b"bad\xffdir"));
    let lt = bad.join("libtorch");
    archive(&lt);
    let root = bad.join("proj");
    std::fs::create_dir_all(&root).unwrap();
    let lib = lt.join("lib/libtorch_cuda.so");
    let cache = t.path().join("cache");
    let run = |args: &[&std::ffi::OsStr]| {
        let out = fdl_in(&root)
            .env("XDG_CACHE_HOME", &cache)
            .args(args)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.code().is_some_and(|c| c != 101) && !text.contains("panicked"),
            "fdl {args:?} failed badly ({}):\n{text}",
            out.status
        );
        out
    };
    let os = |s: &'static str| std::ffi::OsStr::new(s);
    let out = run(&[os("libtorch"), os("add"), os("cu128"), lt.as_os_str()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let asks: Vec<Vec<&std::ffi::OsStr>> = vec![
        vec![os("inspect"), os("--json"), lib.as_os_str()],
        vec![os("nccl"), os("detect"), os("--json"), lib.as_os_str()],
        vec![os("nccl"), os("plugins"), os("--json"), lib.as_os_str()],
        vec![os("libtorch"), os("info"), os("--json")],
        vec![os("libtorch"), os("list"), os("--json")],
        vec![os("nccl"), os("list"), os("--json")],
        vec![
            os("nccl"),
            os("build"),
            os("--dry-run"),
            os("--json"),
            os("--archs"),
            os("8.0"),
        ],
    ];
    for args in asks {
        let out = run(&args);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("fdl {args:?}: not one JSON object ({e})"));
        assert!(
            v.to_string().contains("bad\u{FFFD}dir"),
            "fdl {args:?} names no path of the project: {v}"
        );
    }
    // Text answers too.
    for args in [
        vec![os("inspect"), lib.as_os_str()],
        vec![os("nccl"), os("detect"), lib.as_os_str()],
        vec![os("libtorch"), os("info")],
    ] {
        run(&args);
    }
}
