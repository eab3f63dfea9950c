//! `fdl nccl build` planning: every numbered rule that can be checked without Docker,
//! and every bad input — each must fail with one clear message and write nothing.

use crate::common;
use common::*;
use predicates::prelude::*;
use serde_json::Value;

const MIXED_SMI: &str = "0, NVIDIA GeForce GTX 1060 6GB, 6.1, 6144\n1, NVIDIA GeForce RTX 5060 Ti, 12.0, 16311\n2, NVIDIA GeForce GTX 1060 3GB, 6.1, 3072\n";

fn floors() -> &'static str {
    r#"const char *fdl_floor1 = "ProcessGroupNCCL requires NCCL version 2.27.0 or later";
const char *fdl_floor2 = "NCCL version %s";
const char *fdl_floor3 = "Using NCCL version 2.4.2 or newer is recommended";
"#
}

fn json_plan(args: &[&str], project: &std::path::Path) -> Value {
    dry_json(args, project, true)
}

/// The plan of a dry run that must exit as `runnable` says: 0 exactly when a real run
/// would start (no problems), and one JSON object on stdout either way.
fn dry_json(args: &[&str], project: &std::path::Path, runnable: bool) -> Value {
    let out = fdl()
        .args(["--root"])
        .arg(project)
        .args(["nccl", "build", "--dry-run", "--json"])
        .args(args)
        .output()
        .unwrap();
    assert_eq!(
        out.status.success(),
        runnable,
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON object");
    assert_eq!(
        v["plan"]["problems"]
            .as_array()
            .is_none_or(|p| p.is_empty()),
        runnable,
        "{v}"
    );
    v["plan"].clone()
}

/// Runs a build that must fail; asserts the message (on either stream: a dry run shows a
/// plan's problems with the plan on stdout) and that the project is untouched.
fn fails_cleanly(project: &std::path::Path, args: &[&str], needle: &str) {
    let before = snapshot(project);
    let out = fdl_in(project)
        .args(["nccl", "build"])
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(text.contains(needle), "no {needle:?} in:\n{text}");
    assert_eq!(
        before,
        snapshot(project),
        "a failed command changed the project"
    );
}

#[test]
fn explicit_inputs_make_the_documented_names() {
    let p = ProjectFixture::empty();
    let plan = json_plan(&["--tag", "v2.27.5-1", "--archs", "6.1;12.0"], p.root());
    assert_eq!(plan["name"], "v2.27.5-sm61-sm120");
    assert_eq!(plan["tag"], "v2.27.5-1");
    assert_eq!(plan["tag_origin"]["from"], "flag");
    assert_eq!(plan["cuda"], "12.8");
    assert_eq!(plan["cuda_origin"], "default");
    assert_eq!(plan["archs"], serde_json::json!(["sm_61", "sm_120"]));
    assert_eq!(
        plan["gencode"],
        "-gencode=arch=compute_61,code=sm_61 -gencode=arch=compute_120,code=sm_120"
    );
    assert_eq!(plan["docker"]["image"], "flodl-nccl-toolchain:cuda12.8");
    let out = plan["output_dir"].as_str().unwrap();
    assert!(
        out.ends_with("libtorch/nccl/builds/v2.27.5-sm61-sm120"),
        "{out}"
    );
    // Non-numeric revisions and refs keep their whole name.
    let plan = json_plan(&["--tag", "v2.27.5-rc1", "--archs", "8.6"], p.root());
    assert_eq!(plan["name"], "v2.27.5-rc1-sm86");
    let plan = json_plan(&["--tag", "master", "--archs", "8.6"], p.root());
    assert_eq!(plan["name"], "master-sm86");
    assert!(plan["nccl_version"].is_null());
}

#[test]
fn every_arch_spelling_normalizes() {
    let p = ProjectFixture::empty();
    for archs in [
        "6.1;12.0",
        "6.1,12.0",
        "61 120",
        "sm_120 sm_61",
        "sm61,sm120",
        "compute_61;compute_120;6.1",
    ] {
        let plan = json_plan(&["--tag", "v2.27.5-1", "--archs", archs], p.root());
        assert_eq!(
            plan["archs"],
            serde_json::json!(["sm_61", "sm_120"]),
            "{archs}"
        );
    }
}

#[test]
fn tag_and_cuda_are_inferred_from_the_active_libtorch() {
    let src = format!("{}{}", floors(), nccl_like_source((2, 27, 5), "12.9"));
    let p = ProjectFixture::empty()
        .with_compiled_variant("precompiled/cu129", &src)
        .activate("precompiled/cu129\n");
    let plan = json_plan(&["--archs", "8.6"], p.root());
    assert_eq!(plan["tag"], "v2.27.5-1");
    assert_eq!(plan["tag_origin"]["from"], "libtorch");
    assert_eq!(plan["tag_origin"]["variant"], "precompiled/cu129");
    assert_eq!(plan["cuda"], "12.9");
    assert_eq!(plan["cuda_origin"], "libtorch");
    // --cuda wins over the libtorch's.
    let plan = json_plan(&["--archs", "8.6", "--cuda", "12.8"], p.root());
    assert_eq!(plan["cuda_origin"], "flag");
}

/// torch 2.15's pip NCCL is 2.30.7 built with CUDA 13.3, newer than any nvidia/cuda image
/// fdl knows: the plan still forms, on the newest 13.x image, and says why. A mix that
/// no 13.x image compiles still shows its plan in a dry run, with the problem and the way
/// out, and exits non-zero; the build itself refuses before touching anything.
#[test]
fn a_libtorch_newer_than_the_image_table_still_plans() {
    let src = format!("{}{}", floors(), nccl_like_source((2, 30, 7), "13.3"));
    let p = ProjectFixture::empty()
        .with_compiled_variant("precompiled/pip-cu132", &src)
        .activate("precompiled/pip-cu132\n");
    let plan = json_plan(&["--archs", "8.0", "--backend", "docker"], p.root());
    assert_eq!(plan["tag"], "v2.30.7-1");
    assert_eq!(plan["nccl_version"], "2.30.7");
    assert_eq!(plan["cuda"], "13.2.0");
    assert!(
        plan["cuda_note"].as_str().unwrap().contains("CUDA 13.3"),
        "{plan}"
    );
    assert_eq!(
        plan["docker"]["base_image"],
        "nvidia/cuda:13.2.0-devel-ubuntu24.04"
    );

    // A GTX 1060 beside it: CUDA 13 compiles no Pascal, so the plan takes the closest
    // release that compiles both archs, and says why.
    let plan = json_plan(&["--archs", "6.1;12.0", "--backend", "docker"], p.root());
    assert_eq!(plan["cuda"], "12.9");
    assert!(
        plan["cuda_note"]
            .as_str()
            .unwrap()
            .contains("13.3 cannot compile every planned arch"),
        "{plan}"
    );
    // With --cuda 13.3 pinned nothing fits: the dry run shows the plan and the way out,
    // and the build refuses before touching anything.
    let pinned = [
        "--archs",
        "6.1;12.0",
        "--backend",
        "docker",
        "--cuda",
        "13.3",
    ];
    let plan = dry_json(&pinned, p.root(), false);
    let problems = plan["problems"].to_string();
    assert!(problems.contains("--cuda 12.8 or 12.9"), "{problems}");
    fails_cleanly(p.root(), &pinned, "the plan cannot run");
}

#[test]
fn floors_alone_are_never_taken_for_the_version() {
    let p = ProjectFixture::empty()
        .with_compiled_variant("precompiled/cu128", floors())
        .activate("precompiled/cu128");
    fails_cleanly(
        p.root(),
        &["--archs", "8.6", "--dry-run"],
        "no NCCL self-identification",
    );
    fails_cleanly(p.root(), &["--archs", "8.6", "--dry-run"], "--tag");
}

#[test]
fn each_libtorch_failure_has_its_own_message() {
    let p = ProjectFixture::empty();
    std::fs::create_dir_all(p.root().join("libtorch/precompiled/cu128/lib")).unwrap();
    fails_cleanly(
        p.root(),
        &["--archs", "8.6", "--dry-run"],
        "no active libtorch",
    );

    let p = p.activate("precompiled/missing\n");
    fails_cleanly(p.root(), &["--archs", "8.6", "--dry-run"], "does not exist");

    for outside in ["../../etc", "/etc", "precompiled/../../x", "nccl/builds"] {
        std::fs::write(p.root().join("libtorch/.active"), outside).unwrap();
        fails_cleanly(
            p.root(),
            &["--archs", "8.6", "--dry-run"],
            "not a libtorch variant name",
        );
    }

    std::fs::write(p.root().join("libtorch/.active"), "precompiled/cu128").unwrap();
    fails_cleanly(p.root(), &["--archs", "8.6", "--dry-run"], "has no");

    let p = p.with_raw_variant("precompiled/cu128", b"");
    fails_cleanly(p.root(), &["--archs", "8.6", "--dry-run"], "is empty");
}

#[test]
fn truncated_libtorch_cuda_is_refused() {
    let p = ProjectFixture::empty()
        .with_compiled_variant("precompiled/cu128", &nccl_like_source((2, 27, 5), "12.8"))
        .activate("precompiled/cu128");
    let lib = p.variant_lib("precompiled/cu128");
    let full = std::fs::read(&lib).unwrap();
    let at = full
        .windows(13)
        .position(|w| w == b"NCCL version ")
        .unwrap();
    // Cut inside the self-id: what is left must not be read as a version.
    std::fs::write(&lib, &full[..at + 16]).unwrap();
    fails_cleanly(
        p.root(),
        &["--archs", "8.6", "--dry-run"],
        "libtorch_cuda.so",
    );
}

#[test]
fn bad_tags_are_refused() {
    let p = ProjectFixture::empty();
    for (tag, needle) in [
        ("", "--tag is empty"),
        ("   ", "--tag is empty"),
        ("v2/../../x", "'/' is not allowed"),
        ("a/b", "'/' is not allowed"),
        ("v2..7", "'..' is not allowed"),
        ("-v2.27.5-1", "may not start with '-'"),
        ("v2.27.5 -1", "' ' is not allowed"),
    ] {
        fails_cleanly(
            p.root(),
            &[&format!("--tag={tag}"), "--archs", "8.6", "--dry-run"],
            needle,
        );
    }
}

/// NCCL has no `v2.27.5`, and it would plan into `v2.27.5-1`'s directory.
#[test]
fn a_release_tag_without_its_revision_is_refused() {
    let p = ProjectFixture::empty();
    for (tag, meant) in [("v2.27.5", "v2.27.5-1"), ("v2.30.7-", "v2.30.7-1")] {
        fails_cleanly(
            p.root(),
            &["--tag", tag, "--archs", "8.6", "--dry-run"],
            &format!("did you mean {meant}?"),
        );
    }
}

/// Variants are well-formed and refused as such, with the plain arch to give.
#[test]
fn arch_variants_are_refused_as_well_formed_but_not_built() {
    let p = ProjectFixture::empty();
    for (archs, plain) in [("sm_90a", "9.0"), ("8.6;9.0a", "9.0"), ("sm_100f", "10.0")] {
        fails_cleanly(
            p.root(),
            &["--tag", "v2.27.5-1", "--archs", archs, "--dry-run"],
            "well-formed",
        );
        fails_cleanly(
            p.root(),
            &["--tag", "v2.27.5-1", "--archs", archs, "--dry-run"],
            &format!("not built by NCCL's makefiles, which compile plain SASS for each arch (code=sm_{}). Give {plain} instead", plain.replace('.', "")),
        );
    }
}

/// `8.6+PTX` (TORCH_CUDA_ARCH_LIST's spelling) is --ptx on the highest arch: the same
/// plan, name and gencode; on a lower arch it is refused.
#[test]
fn plus_ptx_on_the_highest_arch_is_ptx() {
    let p = ProjectFixture::empty();
    let plus = json_plan(&["--tag", "v2.27.5-1", "--archs", "6.1;8.6+PTX"], p.root());
    let flag = json_plan(
        &["--tag", "v2.27.5-1", "--archs", "6.1;8.6", "--ptx"],
        p.root(),
    );
    assert_eq!(plus["name"], "v2.27.5-sm61-sm86-ptx");
    assert_eq!(plus["ptx"], true);
    assert_eq!(plus["name"], flag["name"]);
    assert_eq!(plus["gencode"], flag["gencode"]);
    assert!(
        plus["gencode"]
            .as_str()
            .unwrap()
            .ends_with("-gencode=arch=compute_86,code=compute_86"),
        "{plus}"
    );
    let plain = json_plan(&["--tag", "v2.27.5-1", "--archs", "6.1;8.6"], p.root());
    assert_ne!(plain["name"], plus["name"]);
    fails_cleanly(
        p.root(),
        &["--tag", "v2.27.5-1", "--archs", "6.1+PTX;8.6", "--dry-run"],
        "fdl embeds PTX for the highest arch of a build only",
    );
}

#[test]
fn bad_archs_are_named() {
    let p = ProjectFixture::empty();
    fails_cleanly(
        p.root(),
        &["--tag", "v2.27.5-1", "--archs", "6.1;sm_x", "--dry-run"],
        "malformed architecture 'sm_x'",
    );
    fails_cleanly(
        p.root(),
        &["--tag", "v2.27.5-1", "--archs", "6.1;9.9", "--dry-run"],
        "fdl's table does not say which CUDA releases compile sm_99",
    );
    // An arch newer than the table is a request the Docker backend cannot judge; the
    // message says which backend or flag can.
    for needle in ["--backend native", "--base-image"] {
        fails_cleanly(
            p.root(),
            &[
                "--tag",
                "v2.32.3-1",
                "--archs",
                "10.7",
                "--backend",
                "docker",
                "--dry-run",
            ],
            needle,
        );
    }
    fails_cleanly(
        p.root(),
        &["--tag", "v2.27.5-1", "--archs", ";", "--dry-run"],
        "no architectures given",
    );
}

#[test]
fn archs_the_cuda_cannot_compile_are_refused() {
    let p = ProjectFixture::empty();
    let args = ["--tag", "v2.27.5-1", "--archs", "6.1;12.0", "--dry-run"];
    for (cuda, needle) in [
        ("13.0", "CUDA 13.0 cannot compile sm_61"),
        ("13.0", "CUDA 8.0 to 12.9"),
        ("12.4", "sm_120 needs CUDA 12.8 or newer"),
        ("twelve", "invalid CUDA version"),
    ] {
        fails_cleanly(p.root(), &[&args[..], &["--cuda", cuda]].concat(), needle);
    }
    fails_cleanly(
        p.root(),
        &[
            "--tag",
            "v2.27.5-1",
            "--archs",
            "8.6",
            "--jobs",
            "0",
            "--dry-run",
        ],
        "--jobs must be at least 1",
    );
}

/// `--archs` plans for other hosts too, but a GPU of this host it leaves out gets a
/// warning naming the --archs that would cover it (dry run and JSON alike); a build and
/// `fdl nccl verify` here would otherwise disagree about that GPU without a word.
#[test]
fn archs_that_leave_out_a_local_gpu_are_warned_about() {
    let p = ProjectFixture::empty();
    let smi = fake_nvidia_smi(MIXED_SMI, 0);
    let out = fdl_in(p.root())
        .env("PATH", path_with(smi.path()))
        .args([
            "nccl",
            "build",
            "--tag",
            "v2.27.5-1",
            "--archs",
            "12.0",
            "--dry-run",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let warnings: Vec<&str> = v["plan"]["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        // The tag's own note (nothing here cloned it) is another test's.
        .filter(|w| !w.contains("was not checked against a source"))
        .collect();
    // Both GTX 1060s (GPUs 0 and 2) are left out; the RTX 5060 Ti is covered.
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0]
            .contains("--archs leaves out this host's GPU 0 (NVIDIA GeForce GTX 1060 6GB, sm_61)")
            && warnings[0].contains("--archs \"6.1;12.0\""),
        "{warnings:?}"
    );
    assert!(
        warnings[1].contains("GPU 2 (NVIDIA GeForce GTX 1060 3GB"),
        "{warnings:?}"
    );
    // Naming every local arch: no warning.
    let out = fdl_in(p.root())
        .env("PATH", path_with(smi.path()))
        .args([
            "nccl",
            "build",
            "--tag",
            "v2.27.5-1",
            "--archs",
            "6.1;12.0",
            "--dry-run",
            "--json",
        ])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    // No warning but the tag's own note (nothing here cloned it).
    let others: Vec<&Value> = v["plan"]["warnings"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|w| {
                    !w.as_str()
                        .unwrap_or("")
                        .contains("was not checked against a source")
                })
                .collect()
        })
        .unwrap_or_default();
    assert!(others.is_empty(), "{v}");
}

/// The advice to cover a left-out GPU is a plan that passes: where the plan's CUDA cannot
/// compile the GPU's arch (CUDA 13 and Pascal), it names the CUDA that can, and following
/// the advice word for word plans with no problem and no GPU left out.
#[test]
fn the_advice_to_cover_a_left_out_gpu_is_a_plan_that_passes() {
    let p = ProjectFixture::empty();
    let smi = fake_nvidia_smi(MIXED_SMI, 0);
    let plan = |args: &[&str]| -> Value {
        let out = fdl_in(p.root())
            .env("PATH", path_with(smi.path()))
            .args(["nccl", "build", "--backend", "docker", "--tag", "v2.27.5-1"])
            .args(args)
            .args(["--dry-run", "--json"])
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
        })
    };
    let warnings = |v: &Value| -> Vec<String> {
        v["plan"]["warnings"]
            .as_array()
            .map(|w| {
                w.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    // The flags the advice says to pass: --archs "…" and, where it names one, --cuda X.
    let advised = |warning: &str| -> Vec<String> {
        let rest = &warning[warning.find("To cover it, pass --archs \"").unwrap() + 26..];
        let archs = &rest[..rest.find('"').unwrap()];
        let mut args = vec!["--archs".to_string(), archs.to_string()];
        if let Some(at) = rest.find("--cuda ") {
            let cuda: String = rest[at + 7..]
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            args.extend(["--cuda".to_string(), cuda]);
        }
        args
    };
    for (given, names_cuda) in [
        (&["--archs", "12.0", "--cuda", "13.0"][..], Some("12.9")),
        (&["--archs", "12.0"][..], None),
    ] {
        let v = plan(given);
        let w = warnings(&v);
        let left: Vec<&String> = w.iter().filter(|w| w.contains("leaves out")).collect();
        assert_eq!(left.len(), 2, "{given:?}: {w:?}");
        let args = advised(left[0]);
        match names_cuda {
            Some(cuda) => {
                assert!(
                    left[0].contains(&format!(
                        "with --cuda {cuda}: CUDA 13.0 (--cuda) cannot compile sm_61"
                    )),
                    "{given:?}: {}",
                    left[0]
                );
                assert_eq!(args[2..], ["--cuda", cuda], "{}", left[0]);
            }
            None => assert_eq!(args.len(), 2, "no CUDA is needed: {}", left[0]),
        }
        // Followed, the advice plans with no problem, and leaves no GPU out.
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let followed = plan(&args);
        assert!(
            followed["plan"]["problems"].is_null(),
            "{args:?}: {}",
            followed["plan"]
        );
        assert!(
            warnings(&followed)
                .iter()
                .all(|w| !w.contains("leaves out")),
            "{args:?}: {:?}",
            warnings(&followed)
        );
    }
}

#[test]
fn gpus_come_from_nvidia_smi() {
    let p = ProjectFixture::empty();
    let smi = fake_nvidia_smi(MIXED_SMI, 0);
    let out = fdl_in(p.root())
        .env("PATH", path_with(smi.path()))
        .args(["nccl", "build", "--tag", "v2.27.5-1", "--dry-run"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("sm_61 sm_120  (from nvidia-smi: 3 GPU(s))"),
        "{stdout}"
    );
    // The GPUs are printed before the plan.
    assert!(String::from_utf8_lossy(&out.stderr).contains("RTX 5060 Ti"));

    let one = fake_nvidia_smi("0, NVIDIA H200, 9.0, 143771\n", 0);
    let out = fdl_in(p.root())
        .env("PATH", path_with(one.path()))
        .args(["nccl", "build", "--tag", "v2.27.5-1", "--dry-run", "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["plan"]["archs"], serde_json::json!(["sm_90"]));
    assert_eq!(v["plan"]["arch_origin"]["gpus"][0]["name"], "NVIDIA H200");
}

#[test]
fn missing_or_broken_nvidia_smi_suggests_archs() {
    let p = ProjectFixture::empty();
    let base = ["--tag", "v2.27.5-1", "--dry-run"];
    for (stdout, code, needle) in [
        ("", 0, "lists no GPU"),
        (
            "this is not csv at all\n",
            0,
            "cannot parse nvidia-smi output",
        ),
        ("0, GPU, 6.1\n", 0, "cannot parse nvidia-smi output"),
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
            9,
            "nvidia-smi failed",
        ),
    ] {
        let smi = fake_nvidia_smi(stdout, code);
        let before = snapshot(p.root());
        fdl_in(p.root())
            .env("PATH", path_with(smi.path()))
            .args(["nccl", "build"])
            .args(base)
            .assert()
            .failure()
            .stderr(predicate::str::contains(needle).and(predicate::str::contains("--archs")));
        assert_eq!(before, snapshot(p.root()));
    }
    let empty_path = tempfile::tempdir().unwrap();
    fdl_in(p.root())
        .env("PATH", empty_path.path())
        .args(["nccl", "build"])
        .args(base)
        .assert()
        .failure()
        .stderr(
            predicate::str::contains("nvidia-smi was not found")
                .and(predicate::str::contains("--archs")),
        );
}

/// Without Docker (and no toolkit) a dry run still shows the whole plan and, since the
/// plan itself is sound, exits 0 — the README's main command works on such a machine —
/// naming this host's missing engine as a warning. The real build refuses on it
/// (`docker_missing_is_named`).
#[test]
fn dry_run_without_docker_shows_the_plan_then_the_warning_and_writes_nothing() {
    let p = ProjectFixture::empty();
    let no_tools = tempfile::tempdir().unwrap();
    let before = snapshot(p.root());
    let out = fdl_in(p.root())
        .env("PATH", no_tools.path())
        .args([
            "nccl",
            "build",
            "--tag",
            "v2.27.5-1",
            "--archs",
            "6.1;12.0",
            "--dry-run",
            "-v",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "docker build --tag '<toolchain>' --build-arg CUDA_VERSION=12.8.1",
        "docker run --rm --interactive --name '<container>-build' --label 'fdl.owner=<owner>' --pull never --network none --read-only --user '<user>'",
        "--mount 'type=bind,source=<source>,target=/fdl/src,readonly'",
        "--mount 'type=bind,source=<staging>,target=/fdl/prefix'",
        "'<toolchain>' /fdl/work/fdl-run.sh make -C /fdl/src -j",
        "where /fdl/work/fdl-run.sh is this script",
        "\"$@\" CUDA_HOME=\"$home\" CUDA_LIB=\"$lib\" </dev/null &",
        "install BUILDDIR=/fdl/work/build PREFIX=/fdl/prefix",
        "this host cannot run the build",
        "docker command was not found",
        "Dry run: nothing was built",
    ] {
        assert!(stdout.contains(needle), "no {needle:?} in:\n{stdout}");
    }
    assert!(!stdout.contains("Problems"), "{stdout}");
    // The warning comes first, then the plan (issue 43: it came after ~40 lines).
    assert!(
        stdout.find("this host cannot run") < stdout.find("NCCL build plan"),
        "{stdout}"
    );
    // Without -v the commands are one line: how many, and which.
    let out = fdl_in(p.root())
        .env("PATH", no_tools.path())
        .args(["nccl", "build", "--tag", "v2.27.5-1", "--archs", "6.1;12.0"])
        .arg("--dry-run")
        .output()
        .unwrap();
    let short = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{short}");
    assert!(
        short.contains("Commands:  4 (docker build, docker run ×3); shown in full with -v"),
        "{short}"
    );
    assert!(
        !short.contains("--mount") && !short.contains("fdl-run.sh is this script"),
        "{short}"
    );
    assert!(short.lines().count() < 30, "{short}");
    assert_eq!(before, snapshot(p.root()));
    assert!(!p.root().join("libtorch").exists());
}

/// `--cuda X.Y` is a pin: with no image for it the plan keeps X.Y and says what would
/// work (`--base-image`, the closest image's `--cuda`, `--backend native`), never
/// "then adjusted".
#[test]
fn cuda_is_a_pin() {
    let p = ProjectFixture::empty();
    let args = [
        "--tag",
        "v2.30.7-1",
        "--cuda",
        "13.3",
        "--archs",
        "12.0",
        "--backend",
        "docker",
    ];
    let plan = dry_json(&args, p.root(), false);
    assert_eq!(plan["cuda"], "13.3", "{plan}");
    assert_eq!(plan["cuda_origin"], "flag");
    assert!(plan["cuda_note"].is_null(), "{plan}");
    let problems = plan["problems"].to_string();
    for needle in [
        "--cuda pins it",
        "--base-image IMAGE",
        "--cuda 13.2",
        "nvidia/cuda:13.2",
        "--backend native",
    ] {
        assert!(problems.contains(needle), "no {needle:?} in {problems}");
    }
    fails_cleanly(p.root(), &args, "--cuda pins it");
    // The text form: plan first, the problem after, no "adjusted".
    let out = fdl_in(p.root())
        .args(["nccl", "build", "--dry-run"])
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    assert!(
        stdout.contains("CUDA       13.3  (from --cuda)"),
        "{stdout}"
    );
    assert!(!stdout.contains("adjusted"), "{stdout}");
    // A --cuda an image exists for is used as asked.
    let plan = json_plan(
        &[
            "--tag",
            "v2.30.7-1",
            "--cuda",
            "13.2",
            "--archs",
            "12.0",
            "--backend",
            "docker",
        ],
        p.root(),
    );
    assert_eq!(plan["cuda"], "13.2", "{plan}");
}

/// Every dry run follows one rule: the plan, then every problem, then exit 0 only when a
/// real run would start. A CUDA that cannot compile an arch is such a problem.
#[test]
fn a_cuda_that_cannot_compile_an_arch_still_shows_the_plan() {
    let p = ProjectFixture::empty();
    let out = fdl_in(p.root())
        .args([
            "nccl",
            "build",
            "--tag",
            "v2.27.5-1",
            "--cuda",
            "13.0",
            "--archs",
            "6.1;12.0",
            "--backend",
            "docker",
            "--dry-run",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    // The problems first, then the plan.
    assert!(stdout.starts_with("Problems"), "{stdout}");
    assert!(stdout.contains("\nNCCL build plan\n"), "{stdout}");
    let problems = &stdout[..stdout.find("NCCL build plan").unwrap()];
    assert!(
        problems.contains("CUDA 13.0 cannot compile sm_61"),
        "{stdout}"
    );
    assert!(problems.contains("--cuda"), "{stdout}");
}

/// A dry run checks what the build checks first: a build from another plan at the same
/// place is a problem (exit non-zero, the message named), the same plan a no-op warning.
#[test]
fn a_dry_run_reports_a_conflict_with_an_existing_build() {
    let b = BuildsFixture::new(ProjectFixture::empty());
    let tree = b.tree("t", (2, 27, 5), &[61, 120]);
    b.install(&tree, "v2.27.5-1", "6.1;12.0").unwrap();
    let before = snapshot(b.project.root());
    let out = b
        .fdl()
        .args([
            "nccl",
            "build",
            "--tag",
            "v2.27.5-1",
            "--archs",
            "6.1;12.0",
            "--backend",
            "docker",
            "--dry-run",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.contains("already holds a build from a different plan"),
        "{stdout}"
    );
    assert!(stdout.contains("--force"), "{stdout}");
    // --force would replace it: then the dry run has nothing against it.
    let out = b
        .fdl()
        .args([
            "nccl",
            "build",
            "--tag",
            "v2.27.5-1",
            "--archs",
            "6.1;12.0",
            "--backend",
            "docker",
            "--dry-run",
            "--force",
        ])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("already holds"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(before, snapshot(b.project.root()));
}

/// A name longer than a directory name may be fails before any plan, dry or not.
#[test]
fn a_build_name_over_255_bytes_is_refused_at_once() {
    let p = ProjectFixture::empty();
    let archs: Vec<String> = (1..=9)
        .flat_map(|m| (0..=9).map(move |n| format!("{m}.{n}")))
        .collect();
    let archs = archs.join(";");
    for extra in [&["--dry-run"][..], &[]] {
        fails_cleanly(
            p.root(),
            &[
                &["--tag", "v2.27.5-1", "--archs", archs.as_str()][..],
                extra,
            ]
            .concat(),
            &format!(
                "more than a build name may hold ({}, so that the names made from it fit",
                fdl::nccl::store::BuildName::MAX_BYTES
            ),
        );
    }
}

#[test]
fn docker_missing_is_named() {
    let p = ProjectFixture::empty();
    let no_tools = tempfile::tempdir().unwrap();
    let before = snapshot(p.root());
    fdl_in(p.root())
        .env("PATH", no_tools.path())
        .args(["nccl", "build", "--tag", "v2.27.5-1", "--archs", "8.6"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("docker command was not found"));
    assert_eq!(before, snapshot(p.root()));
}

/// A docker client whose daemon does not answer is told apart from no docker at all.
#[test]
#[ignore = "needs a docker client: `cargo test -- --include-ignored`"]
fn docker_daemon_unreachable_is_named() {
    assert!(which("docker"), "no docker client on PATH");
    let p = ProjectFixture::empty();
    let before = snapshot(p.root());
    fdl_in(p.root())
        .env("DOCKER_HOST", "unix:///nonexistent/fdl-test.sock")
        .args(["nccl", "build", "--tag", "v2.27.5-1", "--archs", "8.6"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("Docker daemon is not reachable"));
    assert_eq!(before, snapshot(p.root()));
}

fn which(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
}

#[test]
fn root_is_accepted_before_or_after_the_subcommand() {
    let p = ProjectFixture::empty();
    fdl()
        .args([
            "nccl",
            "build",
            "--tag",
            "v2.27.5-1",
            "--archs",
            "8.6",
            "--dry-run",
            "--root",
        ])
        .arg(p.root())
        .assert()
        .success()
        .stdout(predicate::str::contains(
            p.root()
                .join("libtorch/nccl/builds/v2.27.5-sm86")
                .display()
                .to_string(),
        ));
    fdl()
        .env("FDL_ROOT", p.root())
        .args([
            "nccl",
            "build",
            "--tag",
            "v2.27.5-1",
            "--archs",
            "8.6",
            "--dry-run",
        ])
        .current_dir(std::env::temp_dir())
        .assert()
        .success()
        .stdout(predicate::str::contains(p.root().display().to_string()));
}

#[test]
fn every_command_has_help_with_an_example() {
    // Walk the real command tree, so a new command cannot be forgotten here.
    fn paths(cmd: &clap::Command, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        out.push(prefix.clone());
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            let mut p = prefix.clone();
            p.push(sub.get_name().to_string());
            paths(sub, p, out);
        }
    }
    let mut all = Vec::new();
    paths(
        &<fdl::cli::Cli as clap::CommandFactory>::command(),
        Vec::new(),
        &mut all,
    );
    assert!(all.len() > 15, "{all:?}");
    for path in all {
        fdl()
            .args(&path)
            .arg("--help")
            .assert()
            .success()
            .stdout(predicate::str::contains("Example"));
    }
}

#[test]
fn embedded_dockerfile_is_printed_and_classic_builder_safe() {
    let out = fdl().args(["nccl", "dockerfile"]).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    for arg in ["ARG BASE_IMAGE", "ARG CUDA_VERSION", "ARG TOOLS"] {
        assert!(text.contains(arg), "{arg}");
    }
    // The image is only the toolchain: no source, no compile; its contract is printed.
    let instructions: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect();
    assert!(!instructions.contains("git") && !instructions.contains("make -C"));
    for contract in [
        "--network none --read-only",
        "target=/fdl/src,readonly",
        "CUDA_HOME",
        "/usr/local/cuda",
        "POSIX /bin/sh",
        "make, a C++ compiler",
    ] {
        assert!(text.contains(contract), "{contract}");
    }
    assert!(!text.starts_with("# syntax"));
    assert!(!instructions.contains("--mount") && !instructions.contains("<<"));
}

/// NCCL's Makefile hands ONLY_FUNCS to a shell: payloads are refused before a plan
/// forms, and nothing they name runs, in a dry run or a real one.
#[test]
fn only_funcs_payloads_are_refused_before_anything_runs() {
    let p = ProjectFixture::empty();
    let marker = p.root().join("pwned");
    let m = marker.display();
    for payload in [
        format!("x\"; touch {m}; \""),
        format!("$(shell touch {m})"),
        format!("AllReduce `touch {m}`"),
    ] {
        for dry in [true, false] {
            let mut args = vec![
                "--tag",
                "v2.27.5-1",
                "--archs",
                "8.6",
                "--only-funcs",
                &payload,
            ];
            if dry {
                args.push("--dry-run");
            }
            fails_cleanly(p.root(), &args, "--only-funcs may hold only NCCL names");
        }
    }
    assert!(!marker.exists());
}

#[test]
fn absurd_job_counts_are_refused() {
    let p = ProjectFixture::empty();
    fails_cleanly(
        p.root(),
        &[
            "--tag",
            "v2.27.5-1",
            "--archs",
            "8.6",
            "--jobs",
            "99999",
            "--dry-run",
        ],
        "--jobs 99999 is more than any machine can run",
    );
}

/// A libtorch without code for a planned GPU (the PyPI wheels have none for Pascal): a
/// new NCCL will not make training run there, and the plan says so with the remedy.
#[test]
fn the_plan_warns_when_the_libtorch_itself_cannot_run_on_a_gpu() {
    let src = format!(
        "{}{}",
        nccl_like_source((2, 30, 7), "13.3"),
        fatbin_c_source(&[75, 120], "torch_fatbin")
    );
    let p = ProjectFixture::empty()
        .with_compiled_variant("precompiled/pip-cu132", &src)
        .activate("precompiled/pip-cu132\n");
    // This host has no nvidia-smi: its driver could not be checked, which is said too.
    let libtorch_warnings = |plan: &Value| -> Vec<String> {
        plan["warnings"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|w| w.as_str().map(String::from))
                    .collect::<Vec<String>>()
            })
            .unwrap_or_default()
            .into_iter()
            .filter(|w: &String| {
                !w.contains("driver could not be checked")
                    && !w.contains("was not checked against a source")
            })
            .collect()
    };
    let plan = json_plan(&["--archs", "6.1;12.0", "--backend", "docker"], p.root());
    let warnings = libtorch_warnings(&plan);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let w = &warnings[0];
    assert!(
        w.contains("no GPU code for sm_61") && w.contains("TORCH_CUDA_ARCH_LIST"),
        "{w}"
    );
    let plan = json_plan(&["--archs", "12.0", "--backend", "docker"], p.root());
    assert!(libtorch_warnings(&plan).is_empty(), "{plan}");
}

/// The plan's CUDA is checked against this host's driver, as `nvidia-smi`'s banner states
/// it (the rule `cluster status` uses): a CUDA 13.0 plan on a driver that runs CUDA up to
/// 12.8 cannot run here, so the dry run exits non-zero and names the driver;
/// `--allow-old-driver` makes it a warning. A host without nvidia-smi is no finding: the
/// check says it could not be made.
#[test]
fn a_plan_needing_a_newer_driver_than_this_hosts_is_a_problem() {
    let p = ProjectFixture::empty();
    let smi = fake_nvidia_smi_driver(MIXED_SMI, 0, "570.133.07", "12.8");
    let plan = |extra: &[&str], path: &str| {
        let before = snapshot(p.root());
        let out = fdl_in(p.root())
            .env("PATH", path)
            .args(["nccl", "build", "--tag", "v2.28.9-1", "--archs", "12.0"])
            .args(["--cuda", "13.0", "--dry-run", "--json"])
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(before, snapshot(p.root()), "a dry run writes nothing");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
        });
        (out.status.code(), v)
    };
    let texts = |v: &Value, key: &str| -> Vec<String> {
        v["plan"][key]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (code, v) = plan(&[], &path_with(smi.path()));
    assert_eq!(code, Some(1), "{v}");
    let problems = texts(&v, "problems");
    assert!(
        problems.iter().any(|p| p.contains(
            "this host's driver 570.133.07 runs CUDA up to 12.8, but the plan needs CUDA 13.0: update the driver"
        ) && p.contains("--allow-old-driver")),
        "{problems:?}"
    );
    // Allowed: a warning, and the plan can run.
    let (code, v) = plan(&["--allow-old-driver"], &path_with(smi.path()));
    assert_eq!(code, Some(0), "{v}");
    assert!(texts(&v, "problems").is_empty(), "{v}");
    assert!(
        texts(&v, "warnings")
            .iter()
            .any(|w| w.contains("driver 570.133.07") && w.contains("--allow-old-driver")),
        "{v}"
    );
    // A driver that runs it: no word.
    let new = fake_nvidia_smi_driver(MIXED_SMI, 0, "580.95.05", "13.0");
    let (code, v) = plan(&[], &path_with(new.path()));
    assert_eq!(code, Some(0), "{v}");
    assert!(
        !texts(&v, "warnings").iter().any(|w| w.contains("driver")),
        "{v}"
    );
    // No nvidia-smi (a login node): the check could not be made, which is a warning.
    let empty = tempfile::tempdir().unwrap();
    let path = format!("{}:/usr/bin:/bin", empty.path().display());
    let (code, v) = plan(&[], &path);
    assert_eq!(code, Some(0), "{v}");
    assert!(
        texts(&v, "warnings")
            .iter()
            .any(|w| w.contains("could not be checked") && w.contains("nvidia-smi was not found")),
        "{v}"
    );
}

/// `--backend docker` asks the engine for its storage driver as `auto` does, so both
/// plan the same toolchain files (the volumes, on a fuse-overlayfs engine); it used to
/// say "the engine's storage driver is not known" and read the toolchain from the image.
#[test]
#[ignore = "needs a Docker engine: `cargo test -- --include-ignored`"]
fn backend_docker_asks_the_engine_for_its_storage_driver_as_auto_does() {
    let p = ProjectFixture::empty();
    let plan = |backend: &str| -> serde_json::Value {
        let out = fdl_in(p.root())
            .args(["nccl", "build", "--tag", "v2.27.5-1", "--archs", "8.6"])
            .args(["--backend", backend, "--dry-run", "--json"])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        v["plan"]["docker"].clone()
    };
    let (auto, docker) = (plan("auto"), plan("docker"));
    assert!(
        auto["toolchain_files"].is_string(),
        "auto did not plan for Docker here (is the engine up?): {auto}"
    );
    assert_eq!(
        docker["toolchain_files"], auto["toolchain_files"],
        "{docker}"
    );
    assert_eq!(
        docker["toolchain_files_reason"],
        auto["toolchain_files_reason"]
    );
    assert!(
        !docker["toolchain_files_reason"]
            .as_str()
            .unwrap()
            .contains("not known"),
        "{docker}"
    );
}

/// A project whose path holds `$(x)` and `$ORIGIN_old`, neither of them a dynamic string
/// token: its libtorch finds its NCCL through DT_RUNPATH `$ORIGIN/../nccl`, where
/// `$ORIGIN`'s value holds those `$` as characters (glibc copies it as it is), and the
/// tag is inferred from that NCCL.
#[test]
fn a_project_path_holding_dollars_still_infers_its_tag() {
    let dir = tempfile::Builder::new()
        .prefix("fdl-p$(x)-$ORIGIN_old-")
        .tempdir()
        .unwrap();
    let p = ProjectFixture { dir }.activate("precompiled/cu129\n");
    let lib = p.variant_lib("precompiled/cu129");
    let nccl_dir = lib.parent().unwrap().parent().unwrap().join("nccl");
    std::fs::create_dir_all(&nccl_dir).unwrap();
    compile_shared(
        &nccl_like_source((2, 27, 5), "12.9"),
        &nccl_dir.join("libnccl.so.2"),
        &["-Wl,-soname,libnccl.so.2"],
    );
    std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
    let caller = format!(
        "{}int ncclGetVersion(int *v);\nint torch_nccl(void) {{ int v = 0; ncclGetVersion(&v); return v; }}\n",
        floors()
    );
    compile_shared(
        &caller,
        &lib,
        &[
            &format!("-L{}", nccl_dir.display()),
            "-l:libnccl.so.2",
            "-Wl,--enable-new-dtags,-rpath,$ORIGIN/../nccl",
        ],
    );
    let plan = json_plan(&["--archs", "8.6"], p.root());
    assert_eq!(plan["tag"], "v2.27.5-1", "{plan}");
    assert_eq!(plan["tag_origin"]["from"], "libtorch", "{plan}");
    assert_eq!(plan["cuda"], "12.9", "{plan}");
}

/// The default CUDA's reason names the generations of the plan's oldest and newest arch
/// from the arch table: sm_50 is Maxwell, not Pascal.
#[test]
fn the_default_cudas_reason_names_generations_from_the_arch_table() {
    let p = ProjectFixture::empty();
    for (archs, want, not) in [
        ("5.0;12.0", "compiles both Maxwell and Blackwell", "Pascal"),
        ("6.1;12.0", "compiles both Pascal and Blackwell", "Maxwell"),
    ] {
        let out = fdl()
            .arg("--root")
            .arg(p.root())
            .args(["nccl", "build", "--tag", "v2.27.5-1", "--archs", archs])
            .args(["--backend", "docker", "--dry-run"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with("CUDA "))
            .unwrap_or_else(|| panic!("{archs}: no CUDA row in {text}"));
        assert!(
            line.contains(want) && !line.contains(not),
            "{archs}: {line}"
        );
    }
}

/// A `--tag` of another release than the active libtorch's NCCL is warned of, with the
/// tag that matches; the matching tag is not.
#[test]
fn a_tag_other_than_the_libtorchs_nccl_is_warned_of() {
    let p = ProjectFixture::empty()
        .with_compiled_variant("precompiled/cu128", &nccl_like_source((2, 27, 5), "12.8"))
        .activate("precompiled/cu128\n");
    let warned = |tag: &str| -> Vec<String> {
        let plan = json_plan(
            &["--tag", tag, "--archs", "8.6", "--backend", "docker"],
            p.root(),
        );
        plan["warnings"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|w| w.as_str())
                    .filter(|w| w.starts_with("--tag "))
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    };
    let w = warned("v2.28.9-1");
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("(precompiled/cu128: NCCL 2.27.5)")
            && w[0].contains("refuses a communicator")
            && w[0].ends_with("build --tag v2.27.5-1"),
        "{}",
        w[0]
    );
    assert!(warned("v2.27.5-1").is_empty());
}

/// On a terminal (a pty from util-linux `script`) the dry run's prose is wrapped to 100
/// columns: problems, warnings and rows; the gencode (a value to copy) stays whole, and
/// piped output keeps one line per item (issue 43: rows and warnings of 300 characters).
#[test]
fn a_dry_run_on_a_terminal_fits_100_columns() {
    let p = ProjectFixture::empty();
    let fdl = assert_cmd::cargo::cargo_bin("fdl");
    let line = format!(
        "{} --root {} nccl build --tag v2.27.5-1 --archs '6.1;12.0' --backend docker --dry-run",
        fdl::paste::shell(&fdl.to_string_lossy()),
        fdl::paste::shell(&p.root().to_string_lossy())
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env("NO_COLOR", "1")
        .env("COLUMNS", "200")
        .output()
        .expect("script (util-linux) is needed for this test");
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    assert!(text.contains("NCCL build plan"), "{text}");
    let long: Vec<&str> = text
        .lines()
        .filter(|l| l.chars().count() > 100 && !l.trim_start().starts_with("gencode"))
        .collect();
    assert!(
        long.is_empty(),
        "lines past 100 columns on a terminal: {long:#?}"
    );
    // Wrapped, not cut: the default CUDA's reason goes on below its row.
    assert!(text.contains("\n             "), "{text}");
    // An error on a terminal too: its prose wraps, the command it names stays whole.
    let no_smi = tempfile::tempdir().unwrap();
    let line = format!(
        "env PATH={} {} --root {} nccl build --tag v2.27.5-1 --backend docker --dry-run",
        fdl::paste::shell(&no_smi.path().to_string_lossy()),
        fdl::paste::shell(&fdl.to_string_lossy()),
        fdl::paste::shell(&p.root().to_string_lossy())
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    assert!(
        text.contains("error: nvidia-smi was not found on PATH"),
        "{text}"
    );
    assert!(text.contains("--archs \"6.1;12.0\""), "{text}");
    assert!(
        text.lines().all(|l| l.chars().count() <= 100),
        "an error line past 100 columns on a terminal: {text}"
    );
    // Piped, a warning is one line.
    let piped = fdl_in(p.root())
        .args(["nccl", "build", "--tag", "v2.27.5-1", "--archs", "6.1;12.0"])
        .args(["--backend", "docker", "--dry-run"])
        .output()
        .unwrap();
    let piped = String::from_utf8_lossy(&piped.stdout);
    assert!(piped.lines().any(|l| l.chars().count() > 100), "{piped}");
}
