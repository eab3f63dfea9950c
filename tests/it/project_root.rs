//! The project root: one named by `--root` or `$FDL_ROOT` must exist, and a root that is
//! only the working directory (no project found above it) is said in every plan and in
//! `nccl list`, since nothing else would show it.

use crate::common;
use common::*;

#[test]
fn a_named_root_that_does_not_exist_is_an_error() {
    let t = tempfile::tempdir().unwrap();
    let missing = t.path().join("no-such-project");
    let out = fdl_in(&missing).args(["nccl", "list"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not exist")
            && err.contains("(--root)")
            && !err.contains("No NCCL builds"),
        "{err}"
    );
    let out = fdl()
        .env("FDL_ROOT", &missing)
        .args(["libtorch", "list"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("($FDL_ROOT)") && err.contains("unset FDL_ROOT"),
        "{err}"
    );
    // A file is no root either.
    let file = t.path().join("f");
    std::fs::write(&file, "").unwrap();
    let out = fdl_in(&file).args(["nccl", "list"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a directory"));
    // Commands that need no project do not care.
    fdl()
        .env("FDL_ROOT", &missing)
        .args(["completions", "bash"])
        .assert()
        .success();
    assert!(!missing.exists());
}

#[test]
fn a_root_taken_from_the_working_directory_is_named() {
    let cwd = tempfile::tempdir().unwrap();
    let note = format!(
        "the project root is the working directory {}",
        cwd.path().display()
    );
    for args in [
        &[
            "nccl",
            "build",
            "--tag",
            "v2.27.5-1",
            "--archs",
            "8.6",
            "--dry-run",
        ][..],
        &[
            "nccl",
            "build",
            "--tag",
            "v2.27.5-1",
            "--archs",
            "8.6",
            "--dry-run",
            "--json",
        ][..],
        &["nccl", "list"][..],
    ] {
        let out = fdl().current_dir(cwd.path()).args(args).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains(&note), "{args:?}: {stdout}");
        assert!(stdout.contains("--root DIR"), "{args:?}: {stdout}");
    }
    // A root that was named is not remarked on.
    let out = fdl_in(cwd.path()).args(["nccl", "list"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("working directory"));
}

/// The root is named beside an error only where it matters to it: an error about the
/// project's variants keeps it; a malformed flag value, a file named on the command line
/// and a clap usage error do not name it.
#[test]
fn the_root_is_named_only_where_it_matters() {
    let t = tempfile::tempdir().unwrap();
    let err = |args: &[&str]| {
        let out = fdl().current_dir(t.path()).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = err(&["libtorch", "activate", "nosuch"]);
    assert!(
        e.contains("no libtorch variant") && e.contains("(project root: "),
        "{e}"
    );
    let e = err(&["nccl", "detect"]);
    assert!(e.contains("(project root: "), "{e}");
    for args in [
        &["nccl", "build", "--archs", "6.x", "--dry-run"][..],
        &[
            "nccl",
            "build",
            "--archs",
            "6.1",
            "--cuda",
            "twelve",
            "--dry-run",
        ],
        &["nccl", "detect", "/nonexistent/libnccl.so.2"],
        &["nccl", "plugins", "/nonexistent/libnccl.so.2"],
        &["nccl", "detect", "--jsn"],
    ] {
        let e = err(args);
        assert!(!e.contains("project root"), "{args:?}: {e}");
    }
    // A file the command line names, a flag that does not fit the backend, a host
    // without a toolkit, a plan's problem: no root would change them.
    for extra in [
        &["--archs", "8.6", "--source", "/nonexistent", "--dry-run"][..],
        &[
            "--archs",
            "8.6",
            "--dockerfile",
            "/nonexistent",
            "--dry-run",
        ],
        &[
            "--archs",
            "8.6",
            "--backend",
            "native",
            "--base-image",
            "x",
            "--dry-run",
        ],
        &[
            "--archs",
            "8.6",
            "--backend",
            "native",
            "--cuda-home",
            "/nonexistent",
        ],
        &[
            "--archs",
            "6.1;12.0",
            "--cuda",
            "13.0",
            "--backend",
            "docker",
            "--dry-run",
        ],
    ] {
        let mut args = vec!["nccl", "build", "--tag", "v2.27.5-1"];
        args.extend_from_slice(extra);
        let e = err(&args);
        assert!(!e.contains("project root"), "{args:?}: {e}");
    }
}
