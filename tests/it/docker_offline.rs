//! The embedded Dockerfile, run for real and offline: `fdl nccl build --backend docker
//! --base-image IMAGE --source TREE` against this machine's engine, with no registry and
//! no network inside any container: the toolchain image is built with `--network none`,
//! the compile runs in `docker run --network none --read-only` on bind mounts.
//!
//! The base image is made here: `debootstrap --variant=minbase` of this machine's Debian
//! release with g++, make, python3 and git (tests/support/debian-image.sh), then the CUDA
//! 13.5 toolchain of the PyPI wheels (`FDL_TEST_CUDA_HOME_NEWEST`, from
//! `.ci/fetch-oracles`) copied in, in the wheels' own `lib/` layout with nvcc found on
//! PATH. Both images are kept and rebuilt only when missing. The NCCL tree is the
//! stand-in whose kernel the image's nvcc compiles, so the library carries real SASS.
//!
//! `#[ignore]`d: `.ci/run` runs them with `--include-ignored`, and then a missing engine
//! or input fails them.

use crate::common;
use crate::native_fixture;
use common::oracle::{assert_lists_like_cuobjdump, listing, nccl_get_version};
use common::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command as Std, Output};

const DEBIAN_IMAGE: &str = "fdl-test-debian:toolchain";
const CUDA_IMAGE: &str = "fdl-test-cuda:13.5.37";

fn docker(args: &[&str]) -> Output {
    Std::new("docker").args(args).output().unwrap()
}

/// The CUDA image (tests/support/cuda-image.sh), made once and kept.
fn cuda_image() -> &'static str {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/cuda-image.sh");
    let out = Std::new("bash")
        .arg(&script)
        .arg(CUDA_IMAGE)
        .arg(oracle_input("FDL_TEST_CUDA_HOME_NEWEST"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "could not make {CUDA_IMAGE}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    CUDA_IMAGE
}

/// The toolchain images in the engine, by tag.
fn toolchain_images() -> Vec<String> {
    let out = docker(&[
        "images",
        "flodl-nccl-toolchain",
        "--format",
        "{{.Repository}}:{{.Tag}}",
    ]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

struct Env {
    project: ProjectFixture,
    cache: GuardedCache,
    work: tempfile::TempDir,
}

impl Env {
    /// A project and an fdl cache whose toolchain volumes `engine` removes.
    fn new(engine: &mut EngineGuard) -> Env {
        Env {
            project: ProjectFixture::empty(),
            cache: engine.cache(),
            work: tempfile::tempdir().unwrap(),
        }
    }

    fn fdl(&self, args: &[&str]) -> Output {
        let mut cmd = fdl_in(self.project.root());
        for var in ["CUDA_HOME", "MAKEFLAGS", "FDL_NCCL_REPO"] {
            cmd.env_remove(var);
        }
        cmd.env("XDG_CACHE_HOME", self.cache.path());
        cmd.args(args).output().unwrap()
    }
}

fn stdout_of(what: &str, out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "fdl {what} failed:\nstdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The stdout of a dry run whose plan has problems: it shows the plan with them, and its
/// status says a real run would not start.
fn problems_of(what: &str, out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        !out.status.success() && stdout.contains("Problems"),
        "fdl {what} should show the plan with its problems and fail:\nstdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `needle` occurs in the library's bytes (the stand-in records what make received).
fn contains(lib: &Path, needle: &str) -> bool {
    let bytes = std::fs::read(lib).unwrap();
    memchr::memmem::find(&bytes, needle.as_bytes()).is_some()
}

#[test]
#[ignore = "drives the real Docker engine and needs the CUDA wheels: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn offline_build_through_the_embedded_dockerfile() {
    let _engine = docker_engine_lock();
    let image = cuda_image();
    // The CUDA image stays (made once, reused); what this test builds goes, also on
    // failure.
    let mut engine = EngineGuard::new();
    engine.base(image);
    let cuobjdump = oracle_input("FDL_TEST_CUOBJDUMP");
    let env = Env::new(&mut engine);
    let tree = env.work.path().join("nccl-2.27.5");
    native_fixture::nvcc_tree(&tree, (2, 27, 5));
    // What must not reach the image: history, and objects of an earlier build that make
    // would take as up to date.
    std::fs::create_dir_all(tree.join(".git")).unwrap();
    std::fs::write(tree.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::create_dir_all(tree.join("build/lib")).unwrap();
    std::fs::write(tree.join("build/lib/libnccl.so.2.27.5"), "stale").unwrap();
    let before = common::snapshot(&tree);
    let only = "AllReduce Sum f32";
    let tree_arg = tree.display().to_string();
    let args = [
        "nccl",
        "build",
        "--backend",
        "docker",
        "--base-image",
        image,
        "--source",
        &tree_arg,
        "--tag",
        "v2.27.5-1",
        "--archs",
        "8.6;12.0",
        "--jobs",
        "3",
        "--only-funcs",
        only,
    ];

    // The plan: the probe found the toolkit and every tool, so the build runs offline.
    let mut dry = args.to_vec();
    dry.extend(["--dry-run", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout_of("dry run", &env.fdl(&dry))).unwrap();
    let docker_plan = &v["plan"]["docker"];
    assert_eq!(docker_plan["network"], "none", "{v}");
    assert_eq!(docker_plan["source"]["kind"], "context", "{v}");
    assert_eq!(docker_plan["probe"]["cuda_home"], "/opt/nvidia/cu13", "{v}");
    assert_eq!(
        docker_plan["probe"]["missing"],
        serde_json::json!([]),
        "{v}"
    );
    assert_eq!(v["plan"]["cuda"], "13.5.37", "{v}");
    let commands = v["commands"].to_string();
    assert!(commands.contains("--network none"), "{commands}");

    // The toolchain images this test makes are its own (the guard removes them).
    let toolchains_before = toolchain_images();

    let mut run = args.to_vec();
    run.push("--json");
    let out = env.fdl(&run);
    let v: serde_json::Value = serde_json::from_str(&stdout_of("nccl build", &out)).unwrap();
    assert_eq!(v["status"], "built", "{v}");
    let dir = std::path::PathBuf::from(v["build_dir"].as_str().unwrap());
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("v2.27.5-sm86-sm120-only-"), "{v}");
    // The engine's own messages stay in the log and the progress line.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("DEPRECATED"), "{stderr}");
    assert_eq!(
        dir,
        env.project.root().join("libtorch/nccl/builds").join(&name)
    );
    let lib = dir.join("lib/libnccl.so.2.27.5");
    let made: Vec<String> = toolchain_images()
        .into_iter()
        .filter(|i| !toolchains_before.contains(i))
        .collect();
    for image in &made {
        engine.name(image);
    }

    // Real SASS for exactly the planned archs, as cuobjdump lists it.
    let ins = fdl::inspect::inspect(&lib).unwrap();
    let want: BTreeMap<String, usize> =
        [("sm_86".to_string(), 1), ("sm_120".to_string(), 1)].into();
    assert_eq!(listing(&ins.gpu_code.sass), want);
    assert_lists_like_cuobjdump(&cuobjdump, &lib, &ins.gpu_code);
    let id = ins.nccl.expect("self-id");
    assert_eq!(
        (id.version.to_string(), id.cuda.to_string()),
        ("2.27.5".into(), "13.5".into())
    );
    assert_eq!(nccl_get_version(&lib), 22705);
    // What make received inside the image: the plan's gencode, ONLY_FUNCS and jobs.
    assert!(
        contains(
            &lib,
            "gencode:-gencode=arch=compute_86,code=sm_86 -gencode=arch=compute_120,code=sm_120"
        ),
        "NVCC_GENCODE did not reach make"
    );
    assert!(
        contains(&lib, &format!("only_funcs:{only}")),
        "ONLY_FUNCS did not reach make"
    );
    let bytes = std::fs::read(&lib).unwrap();
    let at = memchr::memmem::find(&bytes, b"makeflags:").expect("MAKEFLAGS recorded");
    let flags = String::from_utf8_lossy(&bytes[at..at + 64.min(bytes.len() - at)]);
    assert!(flags.contains("-j3"), "--jobs did not reach make: {flags}");

    // The compile ran with no network, on a read-only root, the tree mounted read-only
    // (not a clone), and apt never ran.
    let log = std::fs::read_to_string(dir.join("build.log")).unwrap();
    for want in [
        "--network none --read-only --user",
        "target=/fdl/src,readonly",
        "==> toolchain image flodl-nccl-toolchain:cuda13.5.37-",
    ] {
        assert!(log.contains(want), "{want} not in {log}");
    }
    // (The log echoes each RUN's text, so look for what the steps print, not run.)
    assert!(
        !log.lines().any(|l| l.starts_with("fdl: installing")),
        "{log}"
    );
    assert!(!log.contains("Cloning into"), "{log}");
    // The stale build/ of the tree was not taken as up to date: the objects are new.
    assert_ne!(std::fs::read(&lib).unwrap(), b"stale");
    assert_eq!(common::snapshot(&tree), before, "the source tree changed");
    // Only the containers this build made count: the engine may run other work.
    assert!(
        common::fdl_containers(env.project.root()).is_empty(),
        "a container was left behind"
    );

    // The toolchain image the build ran in, as its log names it.
    let toolchain_of = |log: &str| {
        log.lines()
            .find_map(|l| l.strip_prefix("==> toolchain image "))
            .and_then(|rest| rest.split_whitespace().next())
            .map(str::to_string)
            .unwrap_or_else(|| panic!("the log names no toolchain image:\n{log}"))
    };
    let first_toolchain = toolchain_of(&std::fs::read_to_string(dir.join("build.log")).unwrap());

    // The manifest keeps the plan, so verify and a rebuild see the same build.
    let text = stdout_of("nccl verify", &env.fdl(&["nccl", "verify"]));
    assert!(text.contains("ok"), "{text}");
    let mut again = args.to_vec();
    again.push("--json");
    let v: serde_json::Value =
        serde_json::from_str(&stdout_of("rebuild", &env.fdl(&again))).unwrap();
    assert_eq!(v["status"], "already_built", "{v}");
    // A forced rebuild as a person runs it (layers from the cache): the result is
    // printed, and none of the engine's own output (the classic builder's DEPRECATED
    // notice, its steps) reaches the terminal.
    let mut force = args.to_vec();
    force.push("--force");
    // A compile, not the build store's copy of the first build (tests/it/store.rs has those).
    force.push("--no-store");
    let out = env.fdl(&force);
    let text = stdout_of("rebuild --force", &out);
    assert!(text.contains("Rebuilt and replaced"), "{text}");
    // The toolchain image is the engine's to keep: the rebuild ran no image build at all.
    let log = std::fs::read_to_string(dir.join("build.log")).unwrap();
    assert!(log.contains("(cached by the engine)"), "{log}");
    assert!(!log.contains("step: docker build"), "{log}");
    assert_eq!(
        toolchain_of(&log),
        first_toolchain,
        "the rebuild ran in another toolchain image"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    for leak in ["DEPRECATED", "Step 1/", "Sending build context"] {
        assert!(
            !text.contains(leak) && !stderr.contains(leak),
            "{leak} leaked:\nstdout: {text}\nstderr: {stderr}"
        );
    }
}

/// An image without nvcc, or not in the engine at all: the plan says so before anything
/// is built, and nothing is left behind.
#[test]
#[ignore = "drives the real Docker engine: `cargo test -- --include-ignored`"]
fn base_images_that_cannot_build_are_refused_before_the_build() {
    let _engine = docker_engine_lock();
    cuda_image();
    let mut engine = EngineGuard::new();
    engine.base(CUDA_IMAGE);
    engine.base(DEBIAN_IMAGE);
    let env = Env::new(&mut engine);
    let tree = env.work.path().join("nccl");
    native_fixture::nvcc_tree(&tree, (2, 27, 5));
    let tree_arg = tree.display().to_string();
    let build = |image: &str, archs: &str, extra: &[&str]| {
        let mut args = vec![
            "nccl",
            "build",
            "--backend",
            "docker",
            "--base-image",
            image,
            "--source",
            &tree_arg,
            "--tag",
            "v2.27.5-1",
            "--archs",
            archs,
        ];
        args.extend_from_slice(extra);
        env.fdl(&args)
    };
    let before = common::snapshot(env.project.root());

    // No nvcc: a problem in the plan, and a build that refuses to start.
    let out = build(DEBIAN_IMAGE, "8.6", &["--dry-run"]);
    let text = problems_of("dry run", &out);
    assert!(
        text.contains(&format!("--base-image {DEBIAN_IMAGE} has no nvcc")),
        "{text}"
    );
    let out = build(DEBIAN_IMAGE, "8.6", &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("has no nvcc"), "{err}");

    // An arch the image's nvcc cannot compile.
    let out = build(CUDA_IMAGE, "3.5", &["--dry-run"]);
    let text = problems_of("dry run", &out);
    assert!(text.contains("cannot compile sm_35"), "{text}");

    // --cuda against the image's CUDA.
    let out = build(CUDA_IMAGE, "8.6", &["--cuda", "12.8", "--dry-run"]);
    let text = problems_of("dry run", &out);
    assert!(
        text.contains("holds CUDA 13.5.37, but --cuda asks for 12.8"),
        "{text}"
    );

    // Not in the engine: no pull is tried, and the message says what to do.
    let out = build("fdl-test-no-such-image:1", "8.6", &["--dry-run"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is not in the local Docker engine") && err.contains("docker load"),
        "{err}"
    );
    assert_eq!(common::snapshot(env.project.root()), before);
}
