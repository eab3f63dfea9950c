//! `fdl libtorch list|activate|info` and `fdl gpus` through the CLI.

mod common;
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
        .stdout("  builds/local\n* precompiled/cu128\n");
    let out = fdl_in(p.root())
        .args(["libtorch", "list", "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["active"], "precompiled/cu128");
    assert_eq!(v["variants"][1]["active"], true);
    assert_eq!(v["variants"][0]["active"], false);
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
    assert_eq!(v["gpus"][0]["compute_cap"], "sm_61");
    assert_eq!(v["gpus"][1]["memory_mib"], 16311);
    assert_eq!(v["archs"], serde_json::json!(["sm_61", "sm_120"]));

    // No GPU is an answer, as in JSON (tests/surface.rs).
    let none = fake_nvidia_smi("", 0);
    fdl()
        .env("PATH", path_with(none.path()))
        .arg("gpus")
        .assert()
        .success()
        .stdout(predicate::str::contains("lists no GPU"));
}
