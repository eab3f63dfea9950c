//! The Docker backend's overhead over a native build of the same plan, on real NCCL.
//!
//! Opt-in and slow (three real NCCL compiles a round, `FDL_BENCH_ROUNDS` rounds, default
//! 2): `FDL_BENCH_NCCL_TREE` names an unpacked NCCL release tree (e.g. `git archive
//! v2.30.7-1` of NVIDIA/nccl). The builds use the CUDA
//! 13.5 toolchain of the PyPI wheels (`FDL_TEST_CUDA_HOME_NEWEST`, from
//! `.ci/fetch-oracles`): natively as the host's toolkit, and in Docker inside the image
//! `tests/support/cuda-image.sh` makes of it, through the embedded Dockerfile with
//! `--source` and `--base-image`: the toolchain image, then `docker run --network none
//! --read-only` on bind mounts. Same tag, arch, ONLY_FUNCS and jobs; each result is
//! checked (status, SASS for the arch, the same SASS from all). Prints the times, the
//! overhead against the 5% target, the engine's storage driver, and whether the Docker
//! build made its toolchain image or found it cached (the image is kept, as a user's
//! engine keeps it); a missed target is a result, a wrong build a failure. The toolchain
//! (image, and volumes where the plan reads them) is prepared before the timed builds
//! and timed on its own; a third build reads the toolchain from the image
//! (`--toolchain-volumes never`), so what the volumes save is measured in the same run.
//!
//! `cargo bench --bench docker_overhead`; `cargo test` builds it but does not run it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const IMAGE: &str = "fdl-test-cuda:13.5.37";

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn fail(msg: &str) -> ! {
    eprintln!("docker_overhead: {msg}");
    std::process::exit(1)
}

/// One build in a fresh project: its wall time, the SASS it carries (after checking that
/// it has the planned arch) and its build log. Real NCCL adds targets of its own (2.30's FP8 LDMC
/// kernels are always built for sm_100f), so the two backends are compared with each
/// other rather than with the plan alone.
fn build(
    label: &str,
    backend_args: &[String],
    common: &[String],
    arch: &str,
) -> (Duration, Vec<String>, String) {
    let root = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_fdl"))
        .arg("--root")
        .arg(root.path())
        .args(["nccl", "build", "--json"])
        .args(backend_args)
        .args(common)
        .env("XDG_CACHE_HOME", cache.path())
        .env_remove("CUDA_HOME")
        .output()
        .unwrap();
    let took = start.elapsed();
    if !out.status.success() {
        fail(&format!(
            "the {label} build failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let dir = PathBuf::from(v["build_dir"].as_str().unwrap());
    let ins = fdl::inspect::inspect(&dir.join("lib/libnccl.so.2")).unwrap();
    let sass: Vec<String> = ins
        .gpu_code
        .sass
        .iter()
        .map(|e| format!("{} x{}", e.target, e.count))
        .collect();
    let want = format!("sm_{} ", arch.replace('.', ""));
    if !sass.iter().any(|a| a.starts_with(&want)) {
        fail(&format!(
            "the {label} build carries SASS {sass:?}, none for {}",
            want.trim()
        ));
    }
    eprintln!(
        "{label}: built {} in {:.1} s",
        dir.file_name().unwrap().to_string_lossy(),
        took.as_secs_f64()
    );
    let log = std::fs::read_to_string(dir.join("build.log")).unwrap_or_default();
    (took, sass, log)
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("docker_overhead: run with `cargo bench --bench docker_overhead`");
        return;
    }
    let Some(tree) = var("FDL_BENCH_NCCL_TREE") else {
        fail("set FDL_BENCH_NCCL_TREE to an unpacked NCCL release tree (e.g. `git archive v2.30.7-1` of NVIDIA/nccl)");
    };
    let home = var("FDL_TEST_CUDA_HOME_NEWEST")
        .unwrap_or_else(|| fail("set FDL_TEST_CUDA_HOME_NEWEST: `source .ci/setup`"));
    let mk = std::fs::read_to_string(Path::new(&tree).join("makefiles/version.mk"))
        .unwrap_or_else(|e| fail(&format!("{tree} is not an NCCL tree: {e}")));
    let version = fdl::native::parse_version_mk(&mk).unwrap_or_else(|e| fail(&e));
    let tag = format!("v{}.{}.{}-1", version.major, version.minor, version.patch);
    let arch = var("FDL_BENCH_ARCH").unwrap_or_else(|| "8.6".into());
    let only = var("FDL_BENCH_ONLY_FUNCS").unwrap_or_else(|| "AllReduce Sum f32".into());
    let jobs = var("FDL_BENCH_JOBS").unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            .to_string()
    });

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/cuda-image.sh");
    let made = Command::new("bash")
        .arg(script)
        .args([IMAGE, &home])
        .status()
        .unwrap();
    if !made.success() {
        fail(&format!("could not make the image {IMAGE}"));
    }
    let common: Vec<String> = [
        "--source",
        &tree,
        "--tag",
        &tag,
        "--archs",
        &arch,
        "--only-funcs",
        &only,
        "--jobs",
        &jobs,
    ]
    .map(String::from)
    .to_vec();
    let native_args: Vec<String> = ["--backend", "native", "--cuda-home", &home]
        .map(String::from)
        .to_vec();
    let docker_args: Vec<String> = ["--backend", "docker", "--base-image", IMAGE]
        .map(String::from)
        .to_vec();

    // The toolchain (its image, and its volumes where the plan reads them) is made once
    // per machine and kept, as a user's engine keeps it: made here first and timed on
    // its own, so the Docker build below is a build on a machine that built before.
    let plan_out = Command::new(env!("CARGO_BIN_EXE_fdl"))
        .arg("--root")
        .arg(tempfile::tempdir().unwrap().path())
        .args(["nccl", "build", "--dry-run", "--json"])
        .args(&docker_args)
        .args(&common)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&plan_out.stdout).unwrap_or_else(|_| {
        fail(&format!(
            "the Docker dry run failed: {}",
            String::from_utf8_lossy(&plan_out.stderr)
        ))
    });
    let plan: fdl::nccl::plan::BuildPlan = serde_json::from_value(v["plan"].clone())
        .unwrap_or_else(|e| fail(&format!("the dry run's plan does not read back: {e}")));
    let fdl::nccl::plan::BackendPlan::Docker(docker_plan) = &plan.backend else {
        fail("the dry run planned no Docker build");
    };
    let engine = fdl::docker::Engine::probe(&fdl::context::Context::from_process())
        .unwrap_or_else(|e| fail(&e.to_string()));
    let (progress, _log) = fdl::progress::Progress::silent().unwrap();
    let start = Instant::now();
    let prepared = fdl::docker::prepare(
        &engine,
        docker_plan,
        fdl::docker::EMBEDDED_DOCKERFILE,
        &fdl::cache::cache_dir().unwrap_or_else(|e| fail(&format!("{e:#}"))),
        &progress,
    )
    .unwrap_or_else(|e| fail(&format!("preparing the toolchain failed: {e:#}")));
    let preparation = start.elapsed();
    eprintln!(
        "toolchain {} ready in {:.1} s ({}; volumes: {})",
        prepared.toolchain.tag,
        preparation.as_secs_f64(),
        if prepared.toolchain.built {
            "image built"
        } else {
            "image cached"
        },
        if prepared.volumes.is_empty() {
            "none, read from the image".to_string()
        } else {
            prepared
                .volumes
                .iter()
                .map(|(_, d)| d.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        }
    );

    // Rounds of the three builds in turn, so that a slow spell of a shared machine falls
    // on every kind alike; each kind's time is its total over the rounds.
    let rounds: usize = var("FDL_BENCH_ROUNDS")
        .and_then(|r| r.parse().ok())
        .filter(|&r| r >= 1)
        .unwrap_or(2);
    eprintln!(
        "NCCL {version} ({tag}), {arch}, ONLY_FUNCS={only:?}, {jobs} jobs, {rounds} round(s) of: native, Docker, Docker reading the toolchain from the image"
    );
    // The same Docker build reading its toolchain through the storage driver: what the
    // volumes save, measured in this run.
    let mut image_args = docker_args.clone();
    image_args.extend(["--toolchain-volumes".to_string(), "never".to_string()]);
    let (mut native, mut docker, mut image_read) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut per_round = Vec::new();
    let mut native_sass = Vec::new();
    let mut docker_log = String::new();
    for round in 1..=rounds {
        let (n, n_sass, _) = build(
            &format!("round {round}: native"),
            &native_args,
            &common,
            &arch,
        );
        let (d, d_sass, d_log) = build(
            &format!("round {round}: docker"),
            &docker_args,
            &common,
            &arch,
        );
        let (i, i_sass, _) = build(
            &format!("round {round}: docker, toolchain from the image"),
            &image_args,
            &common,
            &arch,
        );
        if n_sass != d_sass || n_sass != i_sass {
            fail(&format!(
                "the builds differ: native SASS {n_sass:?}, Docker SASS {d_sass:?}, Docker (toolchain from the image) SASS {i_sass:?}"
            ));
        }
        native += n;
        docker += d;
        image_read += i;
        per_round.push((n, d, i));
        native_sass = n_sass;
        docker_log = d_log;
    }
    println!("All builds carry SASS {}", native_sass.join(", "));

    // A build that wrote through the engine's storage driver paid for it where the
    // driver is a userspace one (fuse-overlayfs); the compile now writes to bind mounts.
    let driver = Command::new("docker")
        .args(["info", "--format", "{{.Driver}}"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    println!("Docker storage driver: {driver}");
    let toolchain = docker_log
        .lines()
        .find(|l| l.starts_with("==> toolchain image "))
        .unwrap_or("==> toolchain image: not named in the log")
        .trim_start_matches("==> ");
    println!("Docker build's {toolchain}");
    let files = docker_log
        .lines()
        .find(|l| l.starts_with("==> toolchain read from volumes"))
        .map(|_| "toolchain read from volumes (one-time copy of the image's directories)")
        .unwrap_or("toolchain read from the image");
    println!("Docker build's {files}");
    println!(
        "one-time toolchain preparation (image {}, volumes): {:.1} s, before the timed builds",
        if prepared.toolchain.built {
            "built"
        } else {
            "cached"
        },
        preparation.as_secs_f64()
    );
    let overhead = docker.as_secs_f64() / native.as_secs_f64() - 1.0;
    for (k, (n, d, i)) in per_round.iter().enumerate() {
        println!(
            "round {}: native {:.1} s, Docker {:.1} s ({:+.1}%), Docker toolchain from the image {:.1} s ({:+.1}%)",
            k + 1,
            n.as_secs_f64(),
            d.as_secs_f64(),
            (d.as_secs_f64() / n.as_secs_f64() - 1.0) * 100.0,
            i.as_secs_f64(),
            (i.as_secs_f64() / n.as_secs_f64() - 1.0) * 100.0
        );
    }
    println!("| build (total of {rounds} round(s)) | wall time |");
    println!("|---|---|");
    println!("| native | {:.1} s |", native.as_secs_f64());
    println!(
        "| Docker (bind mounts, --network none --read-only, storage driver {driver}, {files}) | {:.1} s |",
        docker.as_secs_f64()
    );
    println!(
        "| Docker, --toolchain-volumes never (toolchain read through {driver}) | {:.1} s |",
        image_read.as_secs_f64()
    );
    println!(
        "Docker overhead over native: {:+.1}% (target: within 5%): {}",
        overhead * 100.0,
        if overhead <= 0.05 { "MET" } else { "MISSED" }
    );
    println!(
        "Docker with the toolchain read from the image: {:+.1}% over native",
        (image_read.as_secs_f64() / native.as_secs_f64() - 1.0) * 100.0
    );
    println!(
        "A machine's first Docker build, with the one-time toolchain preparation: {:+.1}% over native",
        ((docker / rounds as u32 + preparation).as_secs_f64()
            / (native / rounds as u32).as_secs_f64()
            - 1.0)
            * 100.0
    );
    if driver != "overlay2" {
        println!(
            "overlay2: not measured: this engine uses {driver}; run this benchmark against an engine with the overlay2 driver for that row"
        );
    }
}
