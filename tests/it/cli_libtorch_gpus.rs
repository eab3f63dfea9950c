//! `fdl libtorch list|activate|info` and `fdl gpus` through the CLI.

use crate::common;
use common::*;
use predicates::prelude::*;
use serde_json::Value;

fn project_with_two_variants() -> ProjectFixture {
    let p = ProjectFixture::empty()
        .with_compiled_variant(
            "precompiled/cu128",
            &format!(
                "{}{}",
                nccl_like_source((2, 27, 5), "12.8"),
                fatbin_c_source(&[61, 120], "torch_fatbin")
            ),
        )
        .with_raw_variant("builds/local", b"not a library");
    std::fs::write(
        p.root().join("libtorch/precompiled/cu128/.arch"),
        "torch=2.8.0\ncuda=12.8\narchs=6.1;12.0\nsource=download\n",
    )
    .unwrap();
    p
}

#[test]
fn list_marks_the_active_variant() {
    let p = project_with_two_variants().activate("precompiled/cu128\n");
    fdl_in(p.root())
        .args(["libtorch", "list"])
        .assert()
        .success()
        .stdout(
            "  VARIANT            TORCH  CUDA  NCCL  LINKAGE\n  builds/local       -      -     -     -        (no .arch: nothing recorded)\n* precompiled/cu128  2.8.0  12.8  -     -\n",
        );
    let out = fdl_in(p.root())
        .args(["libtorch", "list", "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["active"], "precompiled/cu128");
    assert_eq!(v["variants"][1]["active"], true);
    assert_eq!(v["variants"][0]["active"], false);
    // An .arch written by hand records no fingerprint: its facts are shown, unchecked.
    assert_eq!(v["variants"][1]["arch"]["torch"], "2.8.0");
    assert_eq!(v["variants"][1]["record"]["state"], "unchecked");
    assert_eq!(v["variants"][0]["record"]["state"], "none");
}

#[test]
fn activate_requires_an_existing_variant_and_writes_one_line() {
    let p = project_with_two_variants();
    fdl_in(p.root())
        .args(["libtorch", "activate", "builds/local"])
        .assert()
        .success()
        .stdout(predicate::str::contains("Active libtorch: builds/local"));
    assert_eq!(
        std::fs::read_to_string(p.root().join("libtorch/.active")).unwrap(),
        "builds/local\n"
    );
    let before = snapshot(p.root());
    for bad in ["precompiled/nope", "../outside", "/etc"] {
        fdl_in(p.root())
            .args(["libtorch", "activate", bad])
            .assert()
            .failure()
            .stderr(predicate::str::contains(bad));
        assert_eq!(snapshot(p.root()), before, "{bad}");
    }
}

#[test]
fn info_shows_metadata_and_bundled_nccl() {
    let p = project_with_two_variants().activate("precompiled/cu128");
    fdl_in(p.root())
        .args(["libtorch", "info"])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("precompiled/cu128")
                .and(predicate::str::contains("torch   2.8.0"))
                .and(predicate::str::contains("archs   6.1;12.0"))
                .and(predicate::str::contains("2.27.5")),
        );
    let out = fdl_in(p.root())
        .args(["libtorch", "info", "builds/local", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["variant"], "builds/local");
    assert_eq!(v["nccl"]["found"], false);
}

#[test]
fn info_judges_coverage_for_the_local_gpus() {
    let p = project_with_two_variants().activate("precompiled/cu128");
    let smi = fake_nvidia_smi(
        "0, NVIDIA GeForce GTX 1060 6GB, 6.1, 6144\n1, NVIDIA GeForce RTX 5060 Ti, 12.0, 16311\n2, NVIDIA H200, 9.0, 143771\n",
        0,
    );
    fdl_in(p.root())
        .env("PATH", path_with(smi.path()))
        .args(["libtorch", "info"])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("static (compiled into the library)")
                .and(
                    predicate::str::is_match(
                        r"GPU 0 NVIDIA GeForce GTX 1060 6GB +sm_61 +native SASS \(sm_61\)",
                    )
                    .unwrap(),
                )
                .and(
                    predicate::str::is_match(
                        r"GPU 1 NVIDIA GeForce RTX 5060 Ti +sm_120 +native SASS \(sm_120\)",
                    )
                    .unwrap(),
                )
                .and(predicate::str::is_match(r"GPU 2 NVIDIA H200 +sm_90 +NOT COVERED").unwrap()),
        );
    let out = fdl_in(p.root())
        .env("PATH", path_with(smi.path()))
        .args(["libtorch", "info", "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["nccl"]["detection"]["linkage"]["kind"], "static");
    assert_eq!(v["coverage"][0]["verdict"], "native");
    assert_eq!(v["coverage"][2]["verdict"], "not_covered");
    assert_eq!(v["gpu_code"]["sass"][1]["target"], "sm_120");
}

#[test]
fn gpus_prints_the_stand_in_inventory() {
    let smi = fake_nvidia_smi(
        "0, NVIDIA GeForce GTX 1060 6GB, 6.1, 6144\n1, NVIDIA GeForce RTX 5060 Ti, 12.0, 16311\n",
        0,
    );
    fdl()
        .env("PATH", path_with(smi.path()))
        .arg("gpus")
        .assert()
        .success()
        .stdout(
            predicate::str::contains("NVIDIA GeForce RTX 5060 Ti")
                .and(predicate::str::contains("sm_120")),
        );
    let out = fdl()
        .env("PATH", path_with(smi.path()))
        .args(["gpus", "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    // fdl's vocabulary names the architecture; nvidia-smi's field keeps its own spelling.
    assert_eq!(v["gpus"][0]["arch"], "sm_61");
    assert_eq!(v["gpus"][0]["compute_cap"], "6.1");
    assert_eq!(v["gpus"][1]["arch"], "sm_120");
    assert_eq!(v["gpus"][1]["compute_cap"], "12.0");
    assert_eq!(v["gpus"][1]["memory_mib"], 16311);
    assert_eq!(v["archs"], serde_json::json!(["sm_61", "sm_120"]));

    // No GPU is an answer, as in JSON (tests/it/surface.rs).
    let none = fake_nvidia_smi("", 0);
    fdl()
        .env("PATH", path_with(none.path()))
        .arg("gpus")
        .assert()
        .success()
        .stdout(predicate::str::contains("lists no GPU"));
}

/// The nvidia-smi of a driver older than R510, as it answers: the banner of its branch,
/// and for a query naming `compute_cap` the line it prints on stdout (then an empty
/// line) with exit status 2.
fn old_nvidia_smi() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("nvidia-smi");
    std::fs::write(
        &script,
        r#"#!/bin/sh
if [ $# -eq 0 ]; then
  cat <<'FDL_EOF'
Mon Sep 11 10:02:13 2023
+-----------------------------------------------------------------------------+
| NVIDIA-SMI 470.182.03   Driver Version: 470.182.03   CUDA Version: 11.4     |
|-------------------------------+----------------------+----------------------+
FDL_EOF
  exit 0
fi
case "$*" in
  *compute_cap*) printf 'Field "compute_cap" is not a valid field to query.\n\n'; exit 2 ;;
esac
echo "unexpected arguments: $*"; exit 2
"#,
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// An old driver: `fdl gpus` says the driver does not report compute capability and
/// that --archs is the way round it, with no doubled period and not nvidia-smi's raw
/// words; a build names --archs too.
#[test]
fn an_old_driver_without_compute_cap_is_named_with_the_way_round() {
    let smi = old_nvidia_smi();
    let out = fdl()
        .env("PATH", path_with(smi.path()))
        .arg("gpus")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("NVIDIA driver 470.182.03 does not report the GPUs' compute capability")
            && err.contains("from driver R510 on")
            && err.contains("--archs \"6.1;12.0\" on the commands that take it"),
        "{err}"
    );
    assert!(!err.contains(".."), "{err}");
    assert!(!err.contains("not a valid field"), "{err}");
    let out = fdl()
        .env("PATH", path_with(smi.path()))
        .args(["gpus", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("does not report the GPUs' compute capability"),
        "{v}"
    );

    let p = ProjectFixture::empty();
    let out = fdl_in(p.root())
        .env("PATH", path_with(smi.path()))
        .args(["nccl", "build", "--tag", "v2.27.5-1", "--dry-run"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not report the GPUs' compute capability")
            && err.contains("name the architectures yourself with --archs"),
        "{err}"
    );
    assert!(!err.contains(".."), "{err}");
}
