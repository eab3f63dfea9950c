//! fdl as a Python wheel (pyproject.toml, maturin's `bindings = "bin"`), for PyTorch users
//! without a Rust toolchain: built as the README says, installed with pip into a fresh
//! venv with no index to reach, and run from the venv's `bin/`.

use crate::common;
use common::*;
use object::Object;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn ok(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The one wheel in `dir`.
fn the_wheel(dir: &Path) -> PathBuf {
    let wheels: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "whl"))
        .collect();
    assert_eq!(wheels.len(), 1, "{wheels:?}");
    wheels.into_iter().next().unwrap()
}

#[test]
#[ignore = "needs maturin from `source .ci/setup` and a release build (minutes): `cargo test -- --include-ignored`"]
fn the_wheel_installs_with_pip_into_a_fresh_venv_and_runs() {
    let maturin = oracle_input("FDL_TEST_MATURIN");
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("wheels");
    // Inherits CARGO_TARGET_DIR, so CI's `cargo run --release` build is reused.
    ok(
        "maturin build",
        Command::new(&maturin)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["build", "--release", "--locked", "-o"])
            .arg(&out_dir)
            .output()
            .unwrap(),
    );
    let wheel = the_wheel(&out_dir);
    let file = wheel.file_name().unwrap().to_string_lossy().into_owned();
    let prefix = format!("fdl_nccl-{}-py3-none-", env!("CARGO_PKG_VERSION"));
    assert!(
        file.starts_with(&prefix) && file.contains("linux"),
        "{file}"
    );

    let venv = tmp.path().join("venv");
    ok(
        "python3 -m venv",
        Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .output()
            .unwrap(),
    );
    ok(
        "pip install",
        Command::new(venv.join("bin/python"))
            .args(["-m", "pip", "install", "--no-index", "--no-deps"])
            .arg(&wheel)
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
            .output()
            .unwrap(),
    );
    let fdl = venv.join("bin/fdl");

    // The release binary, stripped of debug info only (Cargo.toml's [profile.release]):
    // its symbols stay, so a backtrace names functions.
    let bytes = std::fs::read(&fdl).unwrap();
    let elf = object::File::parse(&*bytes).unwrap();
    assert!(
        elf.section_by_name(".debug_info").is_none(),
        "debug info in the wheel"
    );
    assert!(
        elf.section_by_name(".symtab").is_some(),
        "no symbols in the wheel"
    );

    let version = ok(
        "fdl --version",
        Command::new(&fdl).arg("--version").output().unwrap(),
    );
    assert_eq!(version.trim(), format!("fdl {}", env!("CARGO_PKG_VERSION")));

    // The README's main job, from the venv, in a project of its own.
    let project = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let plan = ok(
        "fdl nccl build --dry-run",
        Command::new(&fdl)
            .arg("--root")
            .arg(project.path())
            .args(["nccl", "build", "--tag", "v2.27.5-1", "--archs", "6.1;12.0"])
            .arg("--dry-run")
            .env_remove("FDL_ROOT")
            .env("XDG_CACHE_HOME", cache.path())
            .output()
            .unwrap(),
    );
    assert!(
        plan.contains("v2.27.5-sm61-sm120") && plan.contains("Dry run: nothing was built"),
        "{plan}"
    );
}
