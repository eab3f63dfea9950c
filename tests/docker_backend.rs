//! The Docker backend against the real engine of this machine. No registry is reachable,
//! so each test builds its own base image `FROM scratch` holding an NCCL install tree made
//! here with the C compiler, and points `fdl nccl build --dockerfile` at it.
//!
//! `#[ignore]`d: a plain `cargo test` counts them as ignored; `.ci/run` runs them with
//! `--include-ignored`, and then an engine that does not answer fails them.

mod common;
use common::*;
use predicates::prelude::*;
use std::path::Path;
use std::process::Command as Std;

/// `cargo test` runs tests as threads of one process: serialize them here (nextest runs
/// them as processes, serialized by the `docker-engine` test group).
static ENGINE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// These tests are `#[ignore]`d, so they run only when asked for; then the engine must
/// answer, and a test without one fails rather than passing without running.
fn engine_available() -> bool {
    let ok = Std::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "the Docker engine is not reachable: start it, or leave out --include-ignored"
    );
    ok
}

fn docker(args: &[&str]) -> std::process::Output {
    Std::new("docker").args(args).output().unwrap()
}

/// Builds `FROM scratch` + `COPY tree /usr/local/nccl` (or an image without NCCL).
fn base_image(name: &str, tree: Option<&Path>, images: &mut EngineGuard) {
    let ctx = tempfile::tempdir().unwrap();
    let dockerfile = match tree {
        Some(tree) => {
            copy_tree(tree, &ctx.path().join("nccl"));
            "FROM scratch\nCOPY nccl /usr/local/nccl\n"
        }
        None => {
            std::fs::write(ctx.path().join("marker"), "no nccl here").unwrap();
            "FROM scratch\nCOPY marker /marker\n"
        }
    };
    std::fs::write(ctx.path().join("Dockerfile"), dockerfile).unwrap();
    let out = Std::new("docker")
        .env("DOCKER_BUILDKIT", "0")
        .args(["build", "-q", "-t", name])
        .arg(ctx.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "base image: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    images.name(name);
}

/// A suffix no other test run uses, for image names.
fn unique_suffix() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

fn copy_tree(from: &Path, to: &Path) {
    let status = Std::new("cp").arg("-a").arg(from).arg(to).status().unwrap();
    assert!(status.success());
}

/// A user Dockerfile in the shape fdl expects: takes the build args, ends with NCCL in
/// /usr/local/nccl.
fn user_dockerfile(dir: &Path, name: &str, from: &str, extra: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!("ARG CUDA_VERSION\nFROM {from}\nARG NCCL_VERSION\nARG NVCC_GENCODE\nARG MAX_JOBS\n{extra}"),
    )
    .unwrap();
    path
}

fn fdl_containers() -> Vec<String> {
    let out = docker(&[
        "ps",
        "-a",
        "--filter",
        "name=fdl-nccl-extract",
        "--format",
        "{{.Names}}",
    ]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn stray_entries(builds: &Path) -> Vec<String> {
    std::fs::read_dir(builds)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
#[ignore = "needs a Docker engine: `cargo test -- --include-ignored`"]
fn builds_installs_and_cleans_up_against_the_real_engine() {
    let _serial = ENGINE.lock().unwrap_or_else(|e| e.into_inner());
    if !engine_available() {
        return;
    }
    let unique = unique_suffix();
    // Everything this test makes in the engine goes when it ends, also on failure.
    let mut images = EngineGuard::new();
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("tree");
    write_nccl_tree(&tree, (2, 27, 5), &[61, 120]);
    let good_base = format!("fdl-test-nccl-base:{unique}");
    base_image(&good_base, Some(&tree), &mut images);
    let empty_base = format!("fdl-test-empty-base:{unique}");
    base_image(&empty_base, None, &mut images);

    let project = ProjectFixture::empty();
    let root = project.root();
    let builds = root.join("libtorch/nccl/builds");
    let good = user_dockerfile(work.path(), "good.Dockerfile", &good_base, "");
    let containers_before = fdl_containers();
    let cache = tempfile::tempdir().unwrap();
    let build = |dockerfile: &Path, archs: &str, extra: &[&str]| {
        let mut cmd = fdl_in(root);
        cmd.env("XDG_CACHE_HOME", cache.path());
        cmd.args([
            "nccl",
            "build",
            "--tag",
            "v2.27.5-1",
            "--archs",
            archs,
            "--dockerfile",
        ])
        .arg(dockerfile)
        .args(extra);
        cmd
    };
    // fdl names the image after the plan; remember it so the test leaves no image.
    images.name("flodl-nccl-build:v2.27.5-sm61-sm120-cuda12.8");
    images.name("flodl-nccl-build:v2.27.5-sm86-cuda12.8");
    images.name("flodl-nccl-build:v2.27.5-sm90-cuda12.8");

    // 1. A successful build, installed with its manifest.
    let out = build(&good, "6.1;12.0", &["--json"]).output().unwrap();
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "built");
    let dir = builds.join("v2.27.5-sm61-sm120");
    assert_eq!(
        result["ld_preload"],
        dir.join("lib/libnccl.so.2").display().to_string()
    );
    assert_eq!(
        std::fs::read_link(dir.join("lib/libnccl.so"))
            .unwrap()
            .to_str(),
        Some("libnccl.so.2")
    );
    assert_eq!(
        std::fs::read_link(dir.join("lib/libnccl.so.2"))
            .unwrap()
            .to_str(),
        Some("libnccl.so.2.27.5")
    );
    assert!(dir.join("lib/libnccl.so.2.27.5").is_file());
    assert!(dir.join("lib/libnccl_static.a").is_file());
    assert!(dir.join("include/nccl.h").is_file());
    let log = std::fs::read_to_string(dir.join("build.log")).unwrap();
    assert!(
        log.contains("Successfully built") || log.contains("naming to"),
        "{log}"
    );
    // Preparing an image is not compiling: this one has no make step at all.
    assert!(log.contains("==> fdl: phase prepare"), "{log}");
    assert!(!log.contains("==> fdl: phase compile"), "{log}");
    let pc = std::fs::read_to_string(dir.join("lib/pkgconfig/nccl.pc")).unwrap();
    assert!(
        pc.starts_with(&format!("prefix={}\n", dir.display())),
        "{pc}"
    );
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("fdl-build.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["plan"]["tag"], "v2.27.5-1");
    assert_eq!(manifest["plan"]["backend"], "docker");
    assert_eq!(
        manifest["plan"]["archs"],
        serde_json::json!(["sm_61", "sm_120"])
    );
    assert_eq!(
        manifest["plan"]["docker"]["image"],
        "flodl-nccl-build:v2.27.5-sm61-sm120-cuda12.8"
    );
    assert_eq!(manifest["checked"]["library"], "libnccl.so.2.27.5");
    assert!(manifest["built_at"].as_str().unwrap().starts_with("20"));
    assert_eq!(
        fdl_containers(),
        containers_before,
        "a container was left behind"
    );
    assert!(
        stray_entries(&builds).is_empty(),
        "{:?}",
        stray_entries(&builds)
    );
    let installed = snapshot(&dir);

    // 2. The same plan again: a no-op that says so.
    build(&good, "6.1;12.0", &[])
        .assert()
        .success()
        .stdout(predicate::str::contains("Already built from the same plan"))
        .stderr(predicate::str::contains("docker build (").not());
    assert_eq!(snapshot(&dir), installed);

    // 3. A different plan for the same target is refused, naming the difference.
    let other = user_dockerfile(
        work.path(),
        "other.Dockerfile",
        &good_base,
        "LABEL variant=other\n",
    );
    let before = snapshot(root);
    build(&other, "6.1;12.0", &[]).assert().failure().stderr(
        predicate::str::contains("different plan")
            .and(predicate::str::contains("dockerfile:"))
            .and(predicate::str::contains("--force")),
    );
    assert_eq!(snapshot(root), before);

    // 4. A failing image build leaves nothing, not even with --force over the old build.
    let failing = user_dockerfile(
        work.path(),
        "failing.Dockerfile",
        &good_base,
        "COPY does-not-exist /nowhere\n",
    );
    for (archs, extra) in [("8.6", &[][..]), ("6.1;12.0", &["--force"][..])] {
        let out = build(&failing, archs, extra).output().unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("image build failed"), "{stderr}");
        // The log of the failed build is kept outside the project and its end is shown.
        let kept = stderr
            .split("The full build log is kept at ")
            .nth(1)
            .and_then(|r| r.split(';').next())
            .expect("the log path is named");
        assert!(
            kept.starts_with(&cache.path().display().to_string()),
            "{kept}"
        );
        let log = std::fs::read_to_string(kept).unwrap();
        assert!(log.contains("does-not-exist"), "{log}");
        assert!(
            stderr.contains("does-not-exist"),
            "the log's last lines are shown: {stderr}"
        );
        assert_eq!(
            snapshot(root),
            before,
            "failing build with {archs} {extra:?}"
        );
        assert_eq!(fdl_containers(), containers_before);
    }
    // A step that fails while running (the base has no shell) leaves no container of
    // the builder's either.
    // (Containers of this base or an image made from it: the engine may be shared.)
    let all_containers = || {
        let filter = format!("ancestor={good_base}");
        docker(&["ps", "-a", "-q", "--filter", &filter]).stdout
    };
    let containers_at_start = all_containers();
    let run_fails = user_dockerfile(
        work.path(),
        "runfails.Dockerfile",
        &good_base,
        "RUN false\n",
    );
    let out = build(&run_fails, "8.6", &[]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("image build failed"));
    assert_eq!(
        all_containers(),
        containers_at_start,
        "a build container was left"
    );

    // 5. A failing copy (no /usr/local/nccl in the image) leaves nothing and no container.
    let no_nccl = user_dockerfile(work.path(), "nonccl.Dockerfile", &empty_base, "");
    for (archs, extra) in [("9.0", &[][..]), ("6.1;12.0", &["--force"][..])] {
        build(&no_nccl, archs, extra)
            .assert()
            .failure()
            .stderr(predicate::str::contains("docker cp failed"));
        assert_eq!(snapshot(root), before);
        assert_eq!(
            fdl_containers(),
            containers_before,
            "a failed copy left its container"
        );
    }

    // 6. --force with a plan that works replaces the build only after success.
    build(&other, "6.1;12.0", &["--force"])
        .assert()
        .success()
        .stdout(predicate::str::contains("Rebuilt and replaced"));
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("fdl-build.json")).unwrap())
            .unwrap();
    assert_eq!(
        manifest["plan"]["docker"]["dockerfile"]["path"],
        other.display().to_string()
    );
    assert!(stray_entries(&builds).is_empty());
    assert_eq!(fdl_containers(), containers_before);
}

#[test]
#[ignore = "needs a Docker engine: `cargo test -- --include-ignored`"]
fn a_build_whose_output_fails_the_check_is_not_installed() {
    let _serial = ENGINE.lock().unwrap_or_else(|e| e.into_inner());
    if !engine_available() {
        return;
    }
    let unique = format!("{}-chk", std::process::id());
    // Everything this test makes in the engine goes when it ends, also on failure.
    let mut images = EngineGuard::new();
    let work = tempfile::tempdir().unwrap();
    // The tree claims 2.27.6 in its header while the tag asks for 2.27.5.
    let tree = work.path().join("tree");
    write_nccl_tree(&tree, (2, 27, 6), &[75]);
    let base = format!("fdl-test-nccl-base:{unique}");
    base_image(&base, Some(&tree), &mut images);
    images.name("flodl-nccl-build:v2.27.5-sm75-cuda12.8");
    let project = ProjectFixture::empty();
    let dockerfile = user_dockerfile(work.path(), "Dockerfile", &base, "");
    let before = snapshot(project.root());
    let cache = tempfile::tempdir().unwrap();
    fdl_in(project.root())
        .env("XDG_CACHE_HOME", cache.path())
        .args([
            "nccl",
            "build",
            "--tag",
            "v2.27.5-1",
            "--archs",
            "7.5",
            "--dockerfile",
        ])
        .arg(&dockerfile)
        .assert()
        .failure()
        .stderr(predicate::str::contains(
            "asks for NCCL 2.27.5, but the build produced NCCL 2.27.6",
        ));
    assert_eq!(snapshot(project.root()), before);
    assert!(!project.root().join("libtorch").exists());
}

#[test]
#[ignore = "needs a Docker engine: `cargo test -- --include-ignored`"]
fn an_interrupted_build_leaves_nothing_behind() {
    let _serial = ENGINE.lock().unwrap_or_else(|e| e.into_inner());
    if !engine_available() {
        return;
    }
    let unique = format!("{}-int", std::process::id());
    // Everything this test makes in the engine goes when it ends, also on failure.
    let mut images = EngineGuard::new();
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("tree");
    write_nccl_tree(&tree, (2, 27, 5), &[61, 120]);
    // Enough payload that `docker cp` is still running when the signal comes.
    let big = std::fs::File::create(tree.join("lib/payload")).unwrap();
    let mut big = std::io::BufWriter::new(big);
    let chunk: Vec<u8> = (0..1u64 << 20).map(|i| (i * 7919 % 251) as u8).collect();
    for _ in 0..384 {
        std::io::Write::write_all(&mut big, &chunk).unwrap();
    }
    drop(big);
    let base = format!("fdl-test-nccl-base:{unique}");
    base_image(&base, Some(&tree), &mut images);
    images.name("flodl-nccl-build:v2.27.5-sm80-cuda12.8");
    let project = ProjectFixture::empty();
    let dockerfile = user_dockerfile(work.path(), "Dockerfile", &base, "");
    let containers_before = fdl_containers();
    let before = snapshot(project.root());

    let stderr_path = work.path().join("stderr");
    let cache = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("fdl"))
        .env("XDG_CACHE_HOME", cache.path())
        .arg("--root")
        .arg(project.root())
        .args([
            "nccl",
            "build",
            "--tag",
            "v2.27.5-1",
            "--archs",
            "8.0",
            "--dockerfile",
        ])
        .arg(&dockerfile)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !std::fs::read_to_string(&stderr_path)
        .unwrap()
        .contains("==> docker cp")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the copy step never started"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "fdl ended before the copy step"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // SIGINT to fdl alone, as `kill -INT` would; fdl must stop its child and roll back.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let status = child.wait().unwrap();
    let stderr = std::fs::read_to_string(&stderr_path).unwrap();
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert_eq!(
        fdl_containers(),
        containers_before,
        "the interrupted build left its container"
    );
    assert_eq!(
        snapshot(project.root()),
        before,
        "the interrupted build left files"
    );
}

/// The staged tree is hostile: an image whose NCCL tree plants `build.log`,
/// `fdl-build.json` and `lib/pkgconfig/nccl.pc` as absolute links to files outside
/// (`docker cp` keeps them) is refused by verification, naming the link, and the files
/// the links point at are unchanged; nothing is installed.
#[test]
#[ignore = "needs a Docker engine: `cargo test -- --include-ignored`"]
fn planted_links_in_an_images_tree_write_nothing_outside() {
    let _serial = ENGINE.lock().unwrap_or_else(|e| e.into_inner());
    if !engine_available() {
        return;
    }
    let unique = unique_suffix();
    let mut images = EngineGuard::new();
    images.name("flodl-nccl-build:v2.27.5-sm86-cuda12.8");
    let work = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let project = ProjectFixture::empty();
    let builds = project.root().join("libtorch/nccl/builds");
    for (plant, victim_name) in [
        ("lib/pkgconfig/nccl.pc", "victim.pc"),
        ("build.log", "victim.log"),
        ("fdl-build.json", "victim.json"),
    ] {
        let victim = outside.path().join(victim_name);
        std::fs::write(&victim, "prefix=/usr/local/nccl\nkeep me\n").unwrap();
        let tree = work.path().join(format!("tree-{victim_name}"));
        write_nccl_tree(&tree, (2, 27, 5), &[86]);
        let at = tree.join(plant);
        let _ = std::fs::remove_file(&at);
        std::os::unix::fs::symlink(&victim, &at).unwrap();
        let base = format!(
            "fdl-test-planted-{}:{unique}",
            victim_name.replace('.', "-")
        );
        base_image(&base, Some(&tree), &mut images);
        let dockerfile =
            user_dockerfile(work.path(), &format!("{victim_name}.Dockerfile"), &base, "");
        let cache = tempfile::tempdir().unwrap();
        let out = fdl_in(project.root())
            .env("XDG_CACHE_HOME", cache.path())
            .args([
                "nccl",
                "build",
                "--tag",
                "v2.27.5-1",
                "--archs",
                "8.6",
                "--dockerfile",
            ])
            .arg(&dockerfile)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{plant}: the build was accepted");
        assert!(stderr.contains(plant), "{plant}: {stderr}");
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "prefix=/usr/local/nccl\nkeep me\n",
            "{plant}: a file outside the project was changed"
        );
        assert!(!builds.join("v2.27.5-sm86").exists());
        assert!(
            stray_entries(&builds).is_empty(),
            "{:?}",
            stray_entries(&builds)
        );
    }
    assert!(fdl_containers().is_empty());
}

/// The guard every Docker test holds removes what the test made — the images it names
/// and the `<none>` layer a failed classic build leaves — and keeps a tagged image it
/// did not name (the cached base images of tests/support).
#[test]
#[ignore = "needs a Docker engine: `cargo test -- --include-ignored`"]
fn the_engine_guard_removes_what_a_test_made_and_keeps_cached_images() {
    let _serial = ENGINE.lock().unwrap_or_else(|e| e.into_inner());
    if !engine_available() {
        return;
    }
    let unique = unique_suffix();
    let kept = format!("fdl-test-kept:{unique}");
    let named = format!("fdl-test-named:{unique}");
    let ctx = tempfile::tempdir().unwrap();
    std::fs::write(ctx.path().join("a"), &unique).unwrap();
    let build = |tag: Option<&str>, dockerfile: &str| {
        std::fs::write(ctx.path().join("Dockerfile"), dockerfile).unwrap();
        let mut cmd = Std::new("docker");
        cmd.env("DOCKER_BUILDKIT", "0").args(["build", "-q"]);
        if let Some(t) = tag {
            cmd.args(["-t", t]);
        }
        cmd.arg(ctx.path()).output().unwrap()
    };
    let images = || {
        String::from_utf8_lossy(&docker(&["images", "-a", "-q", "--no-trunc"]).stdout).into_owned()
    };
    let guard = EngineGuard::new();
    // Made while the guard lives, but tagged and not named: like a cached base image.
    assert!(build(Some(&kept), "FROM scratch\nCOPY a /kept\n")
        .status
        .success());
    let mut guard = guard;
    assert!(build(Some(&named), "FROM scratch\nCOPY a /named\n")
        .status
        .success());
    guard.name(&named);
    // A classic build that fails after one step leaves that step's image, untagged.
    let failed = build(None, "FROM scratch\nCOPY a /left\nCOPY missing /nowhere\n");
    assert!(!failed.status.success());
    let (_, leftovers) = guard.leftovers();
    assert!(leftovers.len() >= 2, "{leftovers:?}");
    drop(guard);
    let after = images();
    for id in &leftovers {
        assert!(!after.contains(id.as_str()), "{id} is still there");
    }
    assert!(docker(&["image", "inspect", &kept]).status.success());
    let _ = docker(&["rmi", "--force", &kept]);
}
