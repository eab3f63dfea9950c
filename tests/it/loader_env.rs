//! Every LD_PRELOAD fdl prints is one the real loader honours: in a project whose root
//! holds a space and a colon (where glibc splits LD_PRELOAD, with no escaping), the line
//! `fdl nccl env` prints is `eval`ed by bash and a real program then runs the build's
//! NCCL; `fdl nccl detect` in that shell says so. The raw path is shown to fail the same
//! way, so the test would catch a regression to printing it.

use crate::common;
use common::{compile_shared, fdl, install_build, nccl_like_source, write_nccl_tree};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A bundled NCCL 2.27.3, a libtorch_cuda.so that calls it (RUNPATH to it), and a
/// program linked to that libtorch printing `version=<ncclGetVersion>`.
fn program(dir: &Path) -> (PathBuf, PathBuf) {
    let nccl_dir = dir.join("nvidia/nccl/lib");
    std::fs::create_dir_all(&nccl_dir).unwrap();
    compile_shared(
        &nccl_like_source((2, 27, 3), "12.8"),
        &nccl_dir.join("libnccl.so.2"),
        &["-Wl,-soname,libnccl.so.2"],
    );
    let torch_dir = dir.join("torch/lib");
    std::fs::create_dir_all(&torch_dir).unwrap();
    let torch = torch_dir.join("libtorch_cuda.so");
    compile_shared(
        "int ncclGetVersion(int *v);\nint torch_nccl_version(void) { int v = 0; ncclGetVersion(&v); return v; }\n",
        &torch,
        &[
            &format!("-L{}", nccl_dir.display()),
            "-Wl,--no-as-needed",
            "-l:libnccl.so.2",
            "-Wl,--enable-new-dtags,-rpath,$ORIGIN/../../nvidia/nccl/lib",
        ],
    );
    let src = dir.join("main.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\nint torch_nccl_version(void);\nint main(void) { printf(\"version=%d\\n\", torch_nccl_version()); return 0; }\n",
    )
    .unwrap();
    let prog = dir.join("prog");
    let ok = Command::new("cc")
        .arg(&src)
        .arg("-o")
        .arg(&prog)
        .arg(format!("-L{}", torch_dir.display()))
        .args(["-Wl,--no-as-needed", "-l:libtorch_cuda.so"])
        .arg(format!("-Wl,-rpath,{}", torch_dir.display()))
        .status()
        .unwrap()
        .success();
    assert!(ok);
    (torch, prog)
}

fn bash(script: &str, env: &[(&str, &Path)]) -> std::process::Output {
    let mut cmd = Command::new("bash");
    cmd.args(["-c", script]).env_remove("LD_PRELOAD");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn the_printed_preload_is_honoured_in_a_root_with_a_space_and_a_colon() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("flo dl:x");
    std::fs::create_dir_all(&root).unwrap();
    let tree = t.path().join("tree");
    write_nccl_tree(&tree, (2, 27, 5), &[61, 120]);
    let cache = t.path().join("cache");
    let name = install_build(&root, &cache, &tree, "v2.27.5-1", "6.1;12.0").unwrap();
    let (torch, prog) = program(&t.path().join("app"));
    let fdl_bin = assert_cmd::cargo::cargo_bin("fdl");

    // Without any preload the program runs the bundled 2.27.3.
    let out = bash("\"$PROG\"", &[("PROG", &prog)]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "version=22703");

    // The build's own path, preloaded as is, is split by glibc and ignored.
    let raw = root
        .join("libtorch/nccl/builds")
        .join(&name)
        .join("lib/libnccl.so.2");
    let out = bash(
        "LD_PRELOAD=\"$RAW\" \"$PROG\"",
        &[("RAW", &raw), ("PROG", &prog)],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "version=22703");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot be preloaded"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // What fdl prints, eval'ed: the build's NCCL runs, and detect in that shell says so.
    let script = "eval \"$(\"$FDL\" --root \"$ROOT\" nccl env \"$NAME\")\" || exit 9; \
                  \"$PROG\"; \"$FDL\" --root \"$ROOT\" nccl detect \"$TORCH\" --json";
    let name_path = PathBuf::from(&name);
    let out = bash(
        script,
        &[
            ("FDL", &fdl_bin),
            ("ROOT", &root),
            ("NAME", &name_path),
            ("PROG", &prog),
            ("TORCH", &torch),
            ("XDG_CACHE_HOME", &cache),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (first, json) = stdout.split_once('\n').unwrap();
    assert_eq!(first, "version=22705", "the real process runs the build");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("cannot be preloaded"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(json).unwrap();
    assert_eq!(v["answer"], "nccl", "{v}");
    assert_eq!(v["detection"]["version"], "2.27.5", "{v}");
    assert_eq!(v["detection"]["linkage"]["kind"], "preload", "{v}");
    let preloaded = v["environment"]["ld_preload"].as_str().unwrap();
    assert!(!preloaded.contains(' '), "{preloaded}");
    assert!(
        preloaded.starts_with(cache.to_str().unwrap()),
        "{preloaded}"
    );
    assert!(v["skipped_preloads"].as_array().unwrap().is_empty(), "{v}");
}

#[test]
fn no_honest_preload_path_is_a_clear_refusal() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("flo dl");
    std::fs::create_dir_all(&root).unwrap();
    let tree = t.path().join("tree");
    write_nccl_tree(&tree, (2, 27, 5), &[61]);
    let name = install_build(&root, &t.path().join("c"), &tree, "v2.27.5-1", "6.1").unwrap();
    // The cache that would hold the link has a space too: there is no path to print.
    let out = fdl()
        .env("XDG_CACHE_HOME", t.path().join("my cache"))
        .arg("--root")
        .arg(&root)
        .args(["nccl", "env", &name])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "nothing to eval on a refusal");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("glibc splits LD_PRELOAD") && err.contains("XDG_CACHE_HOME"),
        "{err}"
    );
}
