//! Manifests fdl can always read back: the checked-in `tests/fixtures/manifests/` hold
//! the current format (schema 2, with an arch newer than fdl's tables), fdl 0.1's
//! (schema 1: versions as objects, no schema field), a future fdl's with fields this one
//! has never seen, a future one that changed a field this fdl needs, and one cut short.
//! The first three read; the last two are "unreadable" builds that `list` shows with
//! their reason and `remove` deletes.

use crate::common;
use common::*;
use fdl::nccl::plan::{BackendPlan, BuildPlan, NativePlan};
use fdl::nccl::store::parse_manifest;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/manifests")
        .join(name)
}

fn native(plan: &BuildPlan) -> &NativePlan {
    match &plan.backend {
        BackendPlan::Native(n) => n,
        other => panic!("not a native plan: {other:?}"),
    }
}

fn text(name: &str) -> String {
    std::fs::read_to_string(fixture(name)).unwrap()
}

#[test]
fn current_old_and_compatible_future_manifests_read() {
    let m = parse_manifest(&text("schema2-current.json")).unwrap();
    assert_eq!(m.schema, 2);
    assert_eq!(m.plan.cuda.to_string(), "13.5");
    let archs: Vec<String> = m.plan.archs.iter().map(|a| a.to_string()).collect();
    assert_eq!(archs, ["sm_86", "sm_107"]);
    let offered = native(&m.plan).toolkit.gpu_archs.as_ref().unwrap();
    assert!(offered.iter().any(|a| a.to_string() == "sm_107"));

    let old = parse_manifest(&text("schema1-fdl-0.1.json")).unwrap();
    assert_eq!(old.schema, 1, "a manifest without `schema` is schema 1");
    assert_eq!(old.plan.cuda.to_string(), "12.8");
    assert_eq!(native(&old.plan).toolkit.cuda.to_string(), "12.8.93");
    assert_eq!(old.checked.header_version.to_string(), "2.27.5");

    let future = parse_manifest(&text("schema3-future-compatible.json")).unwrap();
    assert_eq!(future.schema, 3);
    assert_eq!(future.plan.name, m.plan.name);
}

/// What this fdl writes is what it reads: a manifest written now parses back equal.
#[test]
fn the_current_fixture_round_trips() {
    let m = parse_manifest(&text("schema2-current.json")).unwrap();
    let written = serde_json::to_string_pretty(&m).unwrap();
    assert_eq!(parse_manifest(&written).unwrap(), m);
    let fixture: Value = serde_json::from_str(&text("schema2-current.json")).unwrap();
    let ours: Value = serde_json::from_str(&written).unwrap();
    assert_eq!(
        ours, fixture,
        "the checked-in current manifest drifted from what fdl writes"
    );
}

#[test]
fn unreadable_manifests_say_why() {
    let e = format!(
        "{:#}",
        parse_manifest(&text("schema3-future-incompatible.json")).unwrap_err()
    );
    assert!(e.contains("newer fdl") && e.contains("schema 3"), "{e}");
    assert!(e.contains("--force"), "{e}");
    let e = format!(
        "{:#}",
        parse_manifest(&text("damaged-truncated.json")).unwrap_err()
    );
    assert!(e.contains("not valid JSON"), "{e}");
}

/// A builds directory holding each fixture: the readable ones are builds, the others are
/// listed as unreadable with their reason and can be removed; a directory without any
/// manifest is not fdl's to remove.
#[test]
fn list_and_remove_handle_unreadable_builds() {
    let p = ProjectFixture::empty();
    let builds = p.root().join("libtorch/nccl/builds");
    let names = [
        ("schema2-current.json", "v2.27.5-sm86-sm107", "build"),
        ("schema1-fdl-0.1.json", "v2.27.5-sm61-sm120", "build"),
        ("schema3-future-compatible.json", "v2.27.5-sm86", "build"),
        (
            "schema3-future-incompatible.json",
            "v2.30.7-sm90",
            "unreadable",
        ),
        ("damaged-truncated.json", "v2.28.9-sm100", "unreadable"),
    ];
    for (file, name, _) in names {
        let dir = builds.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(fixture(file), dir.join("fdl-build.json")).unwrap();
    }
    std::fs::create_dir_all(builds.join("mine")).unwrap();

    let out = fdl_in(p.root())
        .args(["nccl", "list", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema"], 1);
    for (_, name, state) in names {
        let e = v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing: {v}"));
        assert_eq!(e["state"], state, "{name}: {e}");
        if state == "unreadable" {
            assert!(!e["why"].as_str().unwrap().is_empty());
        }
    }
    let out = fdl_in(p.root()).args(["nccl", "list"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("v2.30.7-sm90  unreadable:") && text.contains("newer fdl"),
        "{text}"
    );
    assert!(text.contains("v2.28.9-sm100  unreadable:"), "{text}");

    fdl_in(p.root())
        .args(["nccl", "remove", "--yes", "v2.30.7-sm90", "v2.28.9-sm100"])
        .assert()
        .success();
    assert!(!builds.join("v2.30.7-sm90").exists() && !builds.join("v2.28.9-sm100").exists());
    fdl_in(p.root())
        .args(["nccl", "remove", "--yes", "mine"])
        .assert()
        .failure()
        .stderr(predicates::str::contains("is not an fdl build"));
    assert!(builds.join("mine").exists());
}
