//! `fdl inspect`, `fdl nccl detect`, `fdl nccl verify`, and the verification a build runs
//! before it installs — through the CLI, on libraries compiled in the test.

use crate::common;
use common::*;
use fdl::arch::{Arch, GpuTarget};
use fdl_synth::{self as synth, Entry, Kind, Spec};
use predicates::prelude::*;
use serde_json::Value;
use std::path::Path;

fn lib_with(dir: &Path, name: &str, version: (u32, u32, u32), archs: &[u32]) -> std::path::PathBuf {
    let path = dir.join(name);
    let src = format!(
        "{}{}",
        nccl_like_source(version, "12.8"),
        fatbin_c_source(archs, "fatbin")
    );
    compile_shared(&src, &path, &[]);
    path
}

#[test]
fn inspect_lists_code_and_judges_coverage() {
    let t = tempfile::tempdir().unwrap();
    let lib = lib_with(t.path(), "libx.so", (2, 27, 5), &[61, 120]);
    fdl()
        .arg("inspect")
        .arg(&lib)
        .args(["--archs", "6.1;8.6;12.1"])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("2.27.5 (CUDA 12.8), static")
                .and(predicate::str::contains("sm_61 ×1, sm_120 ×1  (2 cubins)"))
                .and(predicate::str::is_match(r"sm_61 +native SASS \(sm_61\)").unwrap())
                .and(predicate::str::is_match(r"sm_86 +NOT COVERED").unwrap())
                .and(predicate::str::is_match(r"sm_121 +native SASS \(sm_120\)").unwrap()),
        );
    // PTX only: JIT, named by its virtual arch.
    let ptx = t.path().join("ptx.so");
    let spec = Spec {
        entries: vec![Entry {
            kind: Kind::Ptx,
            target: GpuTarget::generic(Arch::new(9, 0)),
            compressed: false,
            payload_size: 512,
        }],
        ..Spec::default()
    };
    synth::write_file(&spec, &ptx).unwrap();
    let out = fdl()
        .arg("inspect")
        .arg(&ptx)
        .args(["--archs", "10.0", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["coverage"][0]["verdict"], "ptx_jit");
    assert!(v["coverage"][0]["code"]
        .as_str()
        .unwrap()
        .starts_with("compute_"));
    assert_eq!(
        v["inspection"]["gpu_code"]["ptx"][0]["target"],
        "compute_90"
    );
    assert_eq!(v["nccl"]["found"], false);
    fdl()
        .arg("inspect")
        .arg(&ptx)
        .args(["--archs", "10.0"])
        .assert()
        .stdout(predicate::str::contains("PTX JIT only (compute_90)"));
}

#[test]
fn inspect_without_gpus_or_archs_says_coverage_was_not_judged() {
    let t = tempfile::tempdir().unwrap();
    let lib = lib_with(t.path(), "libx.so", (2, 27, 5), &[61]);
    let no_tools = tempfile::tempdir().unwrap();
    fdl()
        .env("PATH", no_tools.path())
        .arg("inspect")
        .arg(&lib)
        .assert()
        .success()
        .stdout(
            predicate::str::contains("Coverage: not judged")
                .and(predicate::str::contains("--archs")),
        );
}

#[test]
fn hostile_paths_get_clear_errors() {
    let t = tempfile::tempdir().unwrap();
    let empty = t.path().join("empty.so");
    std::fs::write(&empty, b"").unwrap();
    let fifo = t.path().join("fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let lib = lib_with(t.path(), "libx.so", (2, 27, 5), &[61]);
    let bytes = std::fs::read(&lib).unwrap();
    let cut = t.path().join("cut.so");
    std::fs::write(&cut, &bytes[..100]).unwrap();
    for (path, needle) in [
        (t.path().to_path_buf(), "directory"),
        (fifo, "not a regular file"),
        (empty, "empty"),
        (t.path().join("missing.so"), "missing.so"),
    ] {
        fdl()
            .arg("inspect")
            .arg(&path)
            .args(["--archs", "8.6"])
            .timeout(std::time::Duration::from_secs(20))
            .assert()
            .failure()
            .stderr(predicate::str::contains(needle));
    }
    // A truncated ELF never crashes fdl: it answers or fails with a message.
    let out = fdl()
        .arg("inspect")
        .arg(&cut)
        .args(["--archs", "8.6"])
        .output()
        .unwrap();
    assert!(out.status.code().is_some(), "fdl was killed by a signal");
    if !out.status.success() {
        assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: "));
    }
}

/// `site-packages/torch/lib/libtorch_cuda.so` loading `../../nvidia/nccl/lib/libnccl.so.2`.
fn pip_layout(site: &Path, nccl: (u32, u32, u32)) -> std::path::PathBuf {
    let nccl_dir = site.join("nvidia/nccl/lib");
    let torch_lib = site.join("torch/lib");
    std::fs::create_dir_all(&nccl_dir).unwrap();
    std::fs::create_dir_all(&torch_lib).unwrap();
    compile_shared(
        &nccl_like_source(nccl, "12.6"),
        &nccl_dir.join("libnccl.so.2"),
        &["-Wl,-soname,libnccl.so.2"],
    );
    let torch = torch_lib.join("libtorch_cuda.so");
    compile_shared(
        "extern int ncclGetVersion(int*); int torch_uses_nccl(void) { int v; return ncclGetVersion(&v); }\n",
        &torch,
        &[
            "-L",
            nccl_dir.to_str().unwrap(),
            "-l:libnccl.so.2",
            "-Wl,--enable-new-dtags,-rpath,$ORIGIN/../../nvidia/nccl/lib",
        ],
    );
    torch
}

#[test]
fn detect_follows_a_pip_torch_to_its_libnccl() {
    let t = tempfile::tempdir().unwrap();
    let torch = pip_layout(&t.path().join("site-packages"), (2, 21, 5));
    fdl()
        .env_remove("LD_LIBRARY_PATH")
        .args(["nccl", "detect"])
        .arg(&torch)
        .assert()
        .success()
        .stdout(
            predicate::str::contains("NCCL 2.21.5 (built with CUDA 12.6)")
                .and(predicate::str::contains("dynamic: loads libnccl.so.2"))
                .and(predicate::str::contains("DT_RUNPATH")),
        );
    // `fdl nccl build` infers from the same detection.
    let project = ProjectFixture::empty();
    let variant = project.root().join("libtorch/precompiled/pip");
    std::fs::create_dir_all(variant.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(t.path().join("site-packages/torch"), &variant).unwrap();
    let project = project.activate("precompiled/pip");
    let out = fdl_in(project.root())
        .env_remove("LD_LIBRARY_PATH")
        .args(["nccl", "build", "--archs", "8.6", "--dry-run", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["plan"]["tag"], "v2.21.5-1");
    assert!(v["plan"]["tag_origin"]["linkage"]
        .as_str()
        .unwrap()
        .starts_with("dynamic"));
    assert_eq!(v["plan"]["cuda"], "12.6");

    // The libnccl it needs is gone: the answer is "unknown" (exit 3), naming the missing
    // library and where the loader looked.
    std::fs::remove_file(t.path().join("site-packages/nvidia/nccl/lib/libnccl.so.2")).unwrap();
    fdl()
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("LD_PRELOAD")
        .args(["nccl", "detect"])
        .arg(&torch)
        .assert()
        .code(3)
        .stdout(
            predicate::str::contains("cannot load libnccl.so.2")
                .and(predicate::str::contains("nvidia/nccl/lib")),
        )
        .stderr(predicate::str::contains("unknown:"));
}

/// A library missing its last 100 bytes (its section table) is an error naming the
/// truncation, with a non-zero exit, from `fdl inspect` and `fdl nccl detect` alike;
/// never "No NCCL".
#[test]
fn a_truncated_library_is_reported_as_truncated() {
    let t = tempfile::tempdir().unwrap();
    let lib = lib_with(t.path(), "libnccl.so.2", (2, 27, 5), &[61]);
    fdl()
        .args(["nccl", "detect"])
        .arg(&lib)
        .assert()
        .success()
        .stdout(predicate::str::contains("2.27.5"));
    let full = std::fs::read(&lib).unwrap();
    let kept = full.len() - 100;
    std::fs::write(&lib, &full[..kept]).unwrap();
    let want = format!(
        "{} is truncated: its ELF header says the section headers end at byte {} but the file has {kept} bytes; re-download or re-copy it",
        lib.display(),
        full.len()
    );
    let runs: [&[&str]; 4] = [
        &["inspect", "--archs", "8.6"],
        &["inspect", "--archs", "8.6", "--json"],
        &["nccl", "detect"],
        &["nccl", "detect", "--json"],
    ];
    for args in runs {
        let (cmd, rest) = args.split_at(if args[0] == "nccl" { 2 } else { 1 });
        fdl()
            .args(cmd)
            .arg(&lib)
            .args(rest)
            .assert()
            .failure()
            .stderr(predicate::str::contains(&want))
            .stdout(predicate::str::contains("No NCCL").not());
    }
}

#[test]
fn detect_says_plainly_when_there_is_no_nccl() {
    let t = tempfile::tempdir().unwrap();
    let plain = t.path().join("libplain.so");
    compile_shared("int f(void) { return 1; }\n", &plain, &[]);
    fdl()
        .args(["nccl", "detect"])
        .arg(&plain)
        .assert()
        .success()
        .stdout(predicate::str::contains("No NCCL in"));
    let out = fdl()
        .args(["nccl", "detect", "--json"])
        .arg(&plain)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["nccl"]["found"], false);

    // fdl's synthetic libraries (the benchmark inputs) have a dynamic table but no
    // dynamic symbols: that is "no symbols", an answer, not an unreadable object.
    for (id, answer) in [(None, "none"), (Some("2.27.5+cuda12.9"), "nccl")] {
        let lib = t.path().join(format!("synth-{answer}.so"));
        let spec = fdl_synth::Spec {
            self_id: id.map(String::from),
            ..fdl_synth::Spec::default()
        };
        fdl_synth::write_file(&spec, &lib).unwrap();
        let out = fdl()
            .env_remove("LD_PRELOAD")
            .args(["nccl", "detect", "--json"])
            .arg(&lib)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["answer"], answer, "{v}");
    }
}

#[test]
fn verify_passes_a_sound_build_and_judges_local_gpus() {
    let b = BuildsFixture::new(ProjectFixture::empty());
    let tree = b.tree("t", (2, 27, 5), &[61, 120]);
    let name = b.install(&tree, "v2.27.5-1", "6.1;12.0").unwrap();
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(b.builds().join(&name).join("fdl-build.json")).unwrap(),
    )
    .unwrap();
    let load = manifest["verification"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "load")
        .unwrap();
    assert_eq!(
        load["status"], "pass",
        "the build ran the loader check: {load}"
    );

    let rig = fake_nvidia_smi(
        "0, NVIDIA GeForce GTX 1060 6GB, 6.1, 6144\n1, NVIDIA GeForce RTX 5060 Ti, 12.0, 16311\n",
        0,
    );
    b.fdl()
        .env("PATH", path_with(rig.path()))
        .args(["nccl", "verify"])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("ncclGetVersion() = 22705")
                .and(predicate::str::is_match(r"sass sm_61 +ok").unwrap())
                .and(
                    predicate::str::is_match(r"gpu 1 \(NVIDIA GeForce RTX 5060 Ti\) +ok").unwrap(),
                ),
        );
    // A GPU the build has no code for is named on its own line, apart from the build's
    // verdict: the build is what its plan says (it passes), and this host is not covered.
    let h200 = fake_nvidia_smi("0, NVIDIA H200, 9.0, 143771\n", 0);
    b.fdl()
        .env("PATH", path_with(h200.path()))
        .args(["nccl", "verify", &name])
        .assert()
        .success()
        .stdout(
            predicate::str::contains(
                "this host's GPUs and driver (not part of the build's verdict)",
            )
            .and(predicate::str::contains("NOT COVERED"))
            .and(predicate::str::contains("no GPU code runs on sm_90"))
            .and(predicate::str::contains("--archs naming it")),
        );
    let out = b
        .fdl()
        .env("PATH", path_with(h200.path()))
        .args(["nccl", "verify", &name, "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["passed"], true, "{v}");
    assert_eq!(v["reports"][0]["host_coverage"][0]["status"], "fail", "{v}");
    // Without nvidia-smi the GPU check is reported as skipped, never as passed.
    let no_tools = tempfile::tempdir().unwrap();
    let out = b
        .fdl()
        .env("PATH", no_tools.path())
        .args(["nccl", "verify", "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let checks = v["reports"][0]["host_coverage"].as_array().unwrap();
    assert!(checks
        .iter()
        .any(|c| c["check"] == "local gpus" && c["status"] == "skipped"));
    // Nor is the driver: it could not be checked, which is no finding.
    assert!(
        checks.iter().any(|c| c["check"] == "driver"
            && c["status"] == "skipped"
            && c["detail"]
                .as_str()
                .unwrap()
                .contains("could not be checked")),
        "{checks:?}"
    );
}

/// The host section checks this host's driver against the CUDA the library was built
/// with, by `nvidia-smi`'s banner (the rule `cluster status` uses): a driver of an older
/// CUDA major cannot run it, which is named with the remedy; one that runs it is `ok`.
#[test]
fn verify_checks_this_hosts_driver_against_the_builds_cuda() {
    let b = BuildsFixture::new(ProjectFixture::empty());
    let tree = b.tree("t", (2, 27, 5), &[86]);
    let name = b.install(&tree, "v2.27.5-1", "8.6").unwrap();
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(b.builds().join(&name).join("fdl-build.json")).unwrap(),
    )
    .unwrap();
    let cuda = manifest["plan"]["cuda"].as_str().unwrap().to_string();
    let driver_check = |driver: &str, runs: &str| {
        let smi =
            fake_nvidia_smi_driver("0, NVIDIA GeForce RTX 3090, 8.6, 24576\n", 0, driver, runs);
        let out = b
            .fdl()
            .env("PATH", path_with(smi.path()))
            .args(["nccl", "verify", &name, "--json"])
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["reports"][0]["host_coverage"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"] == "driver")
            .cloned()
            .unwrap_or_else(|| panic!("no driver check in {v}"))
    };
    let old = driver_check("470.256.02", "11.4");
    assert_eq!(old["status"], "fail", "{old}");
    let detail = old["detail"].as_str().unwrap();
    assert!(
        detail.contains("driver 470.256.02 runs CUDA up to 11.4")
            && detail.contains(&format!("needs CUDA {cuda}"))
            && detail.contains("update the driver"),
        "{detail}"
    );
    let new = driver_check("999.1", "99.0");
    assert_eq!(new["status"], "pass", "{new}");
}

#[test]
fn verify_catches_a_tampered_build_and_a_crashing_library() {
    let b = BuildsFixture::new(ProjectFixture::empty());
    let tree = b.tree("t", (2, 27, 5), &[86]);
    let name = b.install(&tree, "v2.27.5-1", "8.6").unwrap();
    let lib = b.builds().join(&name).join("lib/libnccl.so.2.27.5");
    // Replaced by a library whose constructor crashes: fdl survives and says so.
    compile_shared(
        &format!(
            // A real fault through a pointer the compiler cannot see is null.
            "{}{}__attribute__((constructor)) static void boom(void) {{ int *volatile p = 0; *(volatile int *)p = 1; }}\n",
            nccl_like_source((2, 27, 5), "12.8"),
            fatbin_c_source(&[86], "fatbin")
        ),
        &lib,
        &[],
    );
    b.fdl()
        .args(["nccl", "verify", "--json"])
        .assert()
        .failure()
        .stdout(predicate::str::contains(
            "crashed the loader process (signal 11)",
        ));
    // Replaced by another NCCL version: the manifest no longer agrees.
    compile_shared(
        &format!(
            "{}{}",
            nccl_like_source((2, 27, 6), "12.8"),
            fatbin_c_source(&[86], "fatbin")
        ),
        &lib,
        &[],
    );
    b.fdl()
        .args(["nccl", "verify", &name])
        .assert()
        .failure()
        .stdout(predicate::str::contains(
            "identifies as NCCL 2.27.6 but nccl.h says 2.27.5",
        ));
    b.fdl()
        .args(["nccl", "verify", "nope"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("no build named 'nope'"));
    // Cut short by 100 bytes: verify fails and says the library is truncated.
    let full = std::fs::read(&lib).unwrap();
    std::fs::write(&lib, &full[..full.len() - 100]).unwrap();
    let out = b.fdl().args(["nccl", "verify", &name]).output().unwrap();
    assert!(!out.status.success());
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("libnccl.so.2.27.5 is truncated") && text.contains("re-download"),
        "{text}"
    );
}

#[test]
fn a_build_without_code_for_a_planned_arch_is_not_installed() {
    let b = BuildsFixture::new(ProjectFixture::empty());
    let tree = b.tree("t", (2, 27, 5), &[61]);
    let err = b.install(&tree, "v2.27.5-1", "6.1;12.0").unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("failed verification") && msg.contains("sass sm_120"),
        "{msg}"
    );
    let left: Vec<_> = std::fs::read_dir(b.builds())
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

/// A library that is an NCCL (soname libnccl.so.2, defines ncclGetVersion) but whose
/// self-id fdl cannot read (an escape inside it; a 1 MB version number) is an NCCL of unknown
/// version, exit 3, never "No NCCL".
#[test]
fn an_nccl_whose_self_id_cannot_be_read_is_unknown_not_none() {
    let dir = tempfile::tempdir().unwrap();
    let long = "9".repeat(1 << 20);
    for (name, id) in [
        (
            "escaped",
            "NCCL version \\x1b[31m2.27.5+cuda12.8".to_string(),
        ),
        ("long", format!("NCCL version {long}.27.5+cuda12.8")),
    ] {
        let lib = dir.path().join(name).join("libnccl.so.2");
        std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
        common::compile_shared(
            &format!(
                "const char fdl_id[] = \"{id}\";\nint ncclGetVersion(int *v) {{ *v = 22705; return 0; }}\n"
            ),
            &lib,
            &["-Wl,-soname,libnccl.so.2"],
        );
        let out = common::fdl()
            .args(["nccl", "detect"])
            .arg(&lib)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(3), "{name}: {text}");
        assert!(!text.contains("No NCCL"), "{name}: {text}");
        assert!(text.contains("unknown version"), "{name}: {text}");
        let out = common::fdl()
            .args(["nccl", "detect", "--json"])
            .arg(&lib)
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["answer"], "unknown", "{name}: {v}");
    }
}

/// Whether a line of terminal output fits: at most 100 columns, or longer only by what
/// must stay whole to be copied — each word holding a `/` (a path) counts as one column.
fn fits_a_terminal(line: &str) -> bool {
    let prose: usize = line
        .split(' ')
        .map(|w| {
            if w.contains('/') {
                1
            } else {
                w.chars().count()
            }
        })
        .sum::<usize>()
        + line.matches(' ').count();
    line.chars().count() <= 100 || prose <= 100
}

/// On the real libraries of the setup (two `libnccl.so.2`, the torch 2.8.0
/// `libtorch_cuda.so`, and a project whose variant is that pip torch), `inspect`,
/// `nccl detect` and `libtorch info` print no line past 100 columns but for paths; the
/// disassembly detail of how NCCL's own calls bind is `-v`'s (and `--json`'s), and an
/// unknown answer says first what is known: the NCCL it reaches, and on what condition.
#[test]
#[ignore = "needs the real NVIDIA inputs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn real_outputs_fit_a_terminal_and_detail_is_verbose() {
    let nccl = oracle_input("FDL_TEST_NCCL_LIB");
    let nccl13 = oracle_input("FDL_TEST_NCCL_LIB_CU13");
    let torch = oracle_input("FDL_TEST_TORCH_LIB");
    let project = tempfile::tempdir().unwrap();
    std::fs::write(project.path().join("fdl.yml"), "").unwrap();
    let torch_dir = torch.parent().unwrap().parent().unwrap();
    fdl_in(project.path())
        .args(["libtorch", "add", "pip"])
        .arg(torch_dir)
        .assert()
        .success();
    let run = |args: &[&std::ffi::OsStr]| {
        let out = fdl_in(project.path())
            .args(args)
            .env_remove("LD_PRELOAD")
            .env_remove("LD_LIBRARY_PATH")
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let os = |s: &'static str| std::ffi::OsStr::new(s);
    let mut shown = Vec::new();
    for lib in [&nccl, &nccl13] {
        let (code, text) = run(&[os("nccl"), os("detect"), lib.as_os_str()]);
        assert_eq!(code, Some(0), "{text}");
        // No disassembly detail, and one line of calls per caller.
        assert!(!text.contains("no function symbol covers"), "{text}");
        let calls = text
            .lines()
            .skip_while(|l| *l != "Calls:")
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .filter(|l| !l.starts_with("    "))
            .count();
        assert_eq!(calls, 1, "{text}");
        shown.push(text);
        let (_, verbose) = run(&[os("nccl"), os("detect"), os("-v"), lib.as_os_str()]);
        shown.push(verbose);
    }
    // -v says how each call binds, in full (since the code scan reads function bounds
    // from .eh_frame, no call of a real libnccl.so.2 is left to disassembly's doubt).
    assert!(
        shown.iter().any(|t| t
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .contains("(the first definition in the global scope)")),
        "-v shows how each call binds: {shown:#?}"
    );
    let (code, text) = run(&[os("inspect"), torch.as_os_str()]);
    assert_eq!(code, Some(0), "{text}");
    let nccl_row = text.lines().find(|l| l.starts_with("  nccl ")).unwrap();
    assert!(
        nccl_row.contains("unknown: NCCL 2.27.5") && nccl_row.contains("if none of the"),
        "{text}"
    );
    shown.push(text);
    let (code, text) = run(&[os("nccl"), os("detect"), torch.as_os_str()]);
    assert_eq!(code, Some(3), "{text}");
    shown.push(text);
    let (code, text) = run(&[os("libtorch"), os("info")]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("NCCL now: unknown: NCCL 2.27.5"), "{text}");
    shown.push(text);
    for text in &shown {
        for line in text.lines() {
            assert!(
                fits_a_terminal(line),
                "{} columns: {line}\n{text}",
                line.chars().count()
            );
        }
    }
    // --json keeps every reason whole: the unknown answer's, cut on the terminal.
    let (_, json) = run(&[os("nccl"), os("detect"), os("--json"), torch.as_os_str()]);
    // (stdout's object, then stderr's `unknown:` line)
    let v: Value = serde_json::Deserializer::from_str(&json)
        .into_iter()
        .next()
        .unwrap()
        .unwrap();
    assert!(v["reason"].as_str().unwrap().len() > 100, "{v:#}");
}
