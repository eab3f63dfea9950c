//! The Docker backend against the real engine of this machine. No registry is reachable,
//! so the toolchain images start from the local Debian image of tests/support
//! (`fdl-test-debian:toolchain`: g++, make, python3, git), to which each test adds a
//! stand-in CUDA toolkit (an `nvcc` that answers `--version`, as NCCL's makefiles ask it)
//! in a base image of its own. The NCCL source is the stand-in tree of the native tests
//! (`native_fixture::standin_tree`): NCCL's targets and variables, a small C++ library
//! with prepared GPU code. `fdl nccl build --dockerfile` points at a Dockerfile FROM
//! that base, so the compile really runs in `docker run` on the bind mounts.
//!
//! `#[ignore]`d: a plain `cargo test` counts them as ignored; `.ci/run` runs them with
//! `--include-ignored`, and then an engine that does not answer fails them.

use crate::common;
use crate::native_fixture;
use common::*;
use predicates::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command as Std;

const DEBIAN_IMAGE: &str = "fdl-test-debian:toolchain";

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

fn lines(out: std::process::Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
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

/// The Debian image of tests/support (made once, kept).
fn debian_image() -> &'static str {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/debian-image.sh");
    let out = Std::new("bash")
        .arg(&script)
        .args([DEBIAN_IMAGE, "g++", "make", "python3", "git"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "could not make {DEBIAN_IMAGE}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    DEBIAN_IMAGE
}

/// The engine as one test uses it: the guard that removes what the test made, and the
/// toolchain images that were there before, so those `fdl nccl build` makes are named to
/// the guard as they appear.
struct Engine {
    guard: EngineGuard,
    toolchains_before: BTreeSet<String>,
}

fn toolchain_images() -> BTreeSet<String> {
    lines(docker(&[
        "images",
        "flodl-nccl-toolchain",
        "--format",
        "{{.Repository}}:{{.Tag}}",
    ]))
    .into_iter()
    .collect()
}

impl Engine {
    fn new() -> Engine {
        let mut guard = EngineGuard::new();
        guard.base(DEBIAN_IMAGE);
        Engine {
            guard,
            toolchains_before: toolchain_images(),
        }
    }

    /// A new `XDG_CACHE_HOME` whose toolchain volumes the guard removes.
    fn cache(&mut self) -> GuardedCache {
        self.guard.cache()
    }

    /// Names the toolchain images made since the start to the guard; returns them.
    fn adopt(&mut self) -> Vec<String> {
        let made: Vec<String> = toolchain_images()
            .difference(&self.toolchains_before)
            .cloned()
            .collect();
        for image in &made {
            self.guard.name(image);
        }
        made
    }

    /// A base image: the Debian toolchain plus a stand-in CUDA 12.8 at /opt/fakecuda
    /// (`ENV CUDA_HOME`), made with no network.
    fn fake_cuda_base(&mut self, name: &str) {
        let ctx = tempfile::tempdir().unwrap();
        native_fixture::cuda_12_8(&ctx.path().join("cuda"));
        std::fs::write(
            ctx.path().join("Dockerfile"),
            format!(
                "FROM {}\nCOPY cuda /opt/fakecuda\nENV CUDA_HOME=/opt/fakecuda\n",
                debian_image()
            ),
        )
        .unwrap();
        let out = Std::new("docker")
            .env("DOCKER_BUILDKIT", "0")
            .args(["build", "-q", "--network", "none", "-t", name])
            .arg(ctx.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "base image: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.guard.name(name);
    }
}

/// Whatever happened, the toolchain images made since the start go with the guard.
impl Drop for Engine {
    fn drop(&mut self) {
        self.adopt();
    }
}

/// A user Dockerfile: the toolchain image FROM `from`, with `extra` lines.
fn user_dockerfile(dir: &Path, name: &str, from: &str, extra: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!("ARG CUDA_VERSION\nFROM {from}\nARG TOOLS\n{extra}"),
    )
    .unwrap();
    path
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

/// The stand-in tree at `dir`, with `edit` applied to its Makefile.
fn tree(dir: &Path, version: (u32, u32, u32), edit: impl Fn(String) -> String) -> PathBuf {
    native_fixture::standin_tree(dir, version);
    let makefile = dir.join("Makefile");
    let text = std::fs::read_to_string(&makefile).unwrap();
    std::fs::write(&makefile, edit(text)).unwrap();
    dir.to_path_buf()
}

/// `fdl nccl build --tag v2.27.5-1 --dockerfile D --archs A [--source S]` in `root`.
fn build_cmd(
    root: &Path,
    cache: &Path,
    dockerfile: &Path,
    source: Option<&Path>,
    archs: &str,
) -> assert_cmd::Command {
    let mut cmd = fdl_in(root);
    cmd.env("XDG_CACHE_HOME", cache);
    cmd.args(["nccl", "build", "--tag", "v2.27.5-1", "--archs", archs])
        .arg("--dockerfile")
        .arg(dockerfile);
    if let Some(s) = source {
        cmd.arg("--source").arg(s);
    }
    cmd
}

#[test]
#[ignore = "needs a Docker engine: `cargo test -- --include-ignored`"]
fn builds_installs_and_cleans_up_against_the_real_engine() {
    let _serial = docker_engine_lock();
    if !engine_available() {
        return;
    }
    let unique = unique_suffix();
    // Everything this test makes in the engine goes when it ends, also on failure.
    let mut engine = Engine::new();
    let base = format!("fdl-test-fakecuda:{unique}");
    engine.fake_cuda_base(&base);
    let work = tempfile::tempdir().unwrap();
    // The build records which network interfaces it saw: `--network none` leaves only lo.
    let source = tree(&work.path().join("nccl"), (2, 27, 5), |m| {
        m.replace(
            "install: src.build\n",
            "install: src.build\n\tpython3 -c \"import socket; print('fdl-test-interfaces', sorted(n for _, n in socket.if_nameindex()))\"\n",
        )
    });
    let source_before = snapshot(&source);

    let project = ProjectFixture::empty();
    let root = project.root();
    let builds = root.join("libtorch/nccl/builds");
    let good = user_dockerfile(work.path(), "good.Dockerfile", &base, "");
    let cache = engine.cache();
    let build = |dockerfile: &Path, archs: &str, extra: &[&str]| {
        let mut cmd = build_cmd(root, cache.path(), dockerfile, Some(&source), archs);
        cmd.args(extra);
        cmd
    };

    // 1. A successful build, installed with its manifest; the toolchain read from
    // volumes made for it.
    let out = build(
        &good,
        "6.1;12.0",
        &["--json", "--toolchain-volumes", "always"],
    )
    .output()
    .unwrap();
    engine.adopt();
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
    for want in [
        // The toolchain image is prepared, then the compile runs in a container of it.
        "==> fdl: phase prepare",
        "==> fdl: phase compile",
        "==> fdl: phase install",
        "step: docker build --tag flodl-nccl-toolchain:cuda12.8-",
        "docker run --rm --interactive --name",
        "--network none --read-only --user",
        "target=/fdl/src,readonly",
        "Compiling  src/init.cc",
        "BUILDDIR=/fdl/work/build PREFIX=/fdl/prefix",
        // No interface but loopback: nothing in the compile could reach a network.
        "fdl-test-interfaces ['lo']",
        // The toolchain's directories, copied once into volumes, mounted read-only.
        "==> copying the toolchain image's /usr, /opt into Docker volumes",
        "target=/usr,readonly",
        "target=/opt,readonly",
    ] {
        assert!(log.contains(want), "{want:?} not in {log}");
    }
    // This cache's volumes only: the engine may hold other caches' (another job's).
    let made: Vec<String> = common::toolchain_volumes_of(cache.path())
        .into_iter()
        .collect();
    assert_eq!(made.len(), 2, "{made:?}");
    assert!(
        made.iter().all(|v| v.starts_with("flodl-nccl-toolchain-"))
            && made.iter().any(|v| v.ends_with("-usr"))
            && made.iter().any(|v| v.ends_with("-opt")),
        "{made:?}"
    );
    for v in &made {
        assert!(
            log.contains(&format!("type=volume,source={v},")),
            "{v}: {log}"
        );
    }
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
        "flodl-nccl-toolchain:cuda12.8"
    );
    assert_eq!(manifest["checked"]["library"], "libnccl.so.2.27.5");
    assert!(manifest["built_at"].as_str().unwrap().starts_with("20"));
    assert!(
        fdl_containers(root).is_empty(),
        "a container was left behind"
    );
    assert!(
        stray_entries(&builds).is_empty(),
        "{:?}",
        stray_entries(&builds)
    );
    assert_eq!(snapshot(&source), source_before, "the source tree changed");
    let installed = snapshot(&dir);

    // 2. The same plan again: a no-op that says so.
    build(&good, "6.1;12.0", &[])
        .assert()
        .success()
        .stdout(predicate::str::contains("Already built from the same plan"))
        .stderr(predicate::str::contains("==> toolchain image").not());
    assert_eq!(snapshot(&dir), installed);

    // The library the first build compiled, for the second project below (nccl.pc names
    // its own directory).
    let compiled_lib: BTreeMap<PathBuf, String> = snapshot(&dir.join("lib"))
        .into_iter()
        .filter(|(p, _)| !p.ends_with("nccl.pc"))
        .collect();

    // Another cache on the same engine (another user of the build box, a CI job, a new
    // XDG_CACHE_HOME) builds too, from volumes of its own: their names never meet.
    let other_cache = engine.cache();
    let other = ProjectFixture::empty();
    let out = build_cmd(
        other.root(),
        other_cache.path(),
        &good,
        Some(&source),
        "6.1;12.0",
    )
    .args(["--json", "--toolchain-volumes", "always"])
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "another cache's build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: Vec<String> = common::toolchain_volumes_of(other_cache.path())
        .into_iter()
        .collect();
    assert_eq!(theirs.len(), 2, "{theirs:?} beside {made:?}");
    let other_log = std::fs::read_to_string(
        other
            .root()
            .join("libtorch/nccl/builds/v2.27.5-sm61-sm120/build.log"),
    )
    .unwrap();
    for v in &theirs {
        assert!(
            other_log.contains(&format!("type=volume,source={v},")),
            "{v}: {other_log}"
        );
        assert!(docker(&["volume", "rm", v]).status.success());
    }

    // A volume of the name fdl would use that fdl did not make is neither used nor
    // removed: the build says so and reads the toolchain from the image instead.
    let opt = made.iter().find(|v| v.ends_with("-opt")).unwrap();
    assert!(docker(&["volume", "rm", opt]).status.success());
    let test_label = test_volume_label();
    assert!(docker(&["volume", "create", "--label", &test_label, opt])
        .status
        .success());
    let foreign_build = |what: &str| {
        // Not from the build store: the compile is what reads the toolchain.
        let out = build(
            &good,
            "7.5",
            &["--toolchain-volumes", "always", "--no-store"],
        )
        .output()
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{what}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "a Docker volume named {opt} exists that this cache did not make"
            )) && stderr.contains("reads the toolchain from the image instead"),
            "{what}: {stderr}"
        );
        let sm75 = builds.join("v2.27.5-sm75");
        let log = std::fs::read_to_string(sm75.join("build.log")).unwrap();
        assert!(
            !log.contains("type=volume"),
            "{what}: a volume was mounted: {log}"
        );
        assert!(fdl_containers(root).is_empty());
        std::fs::remove_dir_all(sm75).unwrap();
    };
    foreign_build("an unlabelled volume of fdl's name");
    let label = lines(docker(&[
        "volume",
        "inspect",
        "--format",
        "{{index .Labels \"fdl.toolchain.image\"}}",
        opt,
    ]));
    // No fdl label (the engine prints an empty value or `<no value>` for a missing one).
    assert!(
        label.iter().all(|l| l.is_empty() || l == "<no value>"),
        "the foreign volume was changed: {label:?}"
    );
    assert!(docker(&["volume", "rm", opt]).status.success());

    // Anyone with access to the engine can make a volume of fdl's name with fdl's labels
    // (the image's ID is no secret) and fill it, mark included: it is still not fdl's —
    // fdl did not keep a token for it — so it is neither mounted nor removed.
    let image_id = lines(docker(&[
        "volume",
        "inspect",
        "--format",
        "{{index .Labels \"fdl.toolchain.image\"}}",
        made.iter().find(|v| v.ends_with("-usr")).unwrap(),
    ]))
    .remove(0);
    assert!(image_id.starts_with("sha256:"), "{image_id}");
    let planted = docker(&[
        "volume",
        "create",
        "--label",
        &test_label,
        "--label",
        &format!("fdl.toolchain.image={image_id}"),
        "--label",
        "fdl.toolchain.owner=0000000000000000000000000000000000000000000000000000000000000000",
        opt,
    ]);
    assert!(planted.status.success(), "{planted:?}");
    let fill = docker(&[
        "run",
        "--rm",
        "--network",
        "none",
        "--mount",
        &format!("type=volume,source={opt},target=/v"),
        "--entrypoint",
        "/bin/sh",
        &base,
        "-c",
        &format!("echo planted > /v/planted && echo '{image_id}' > /v/.fdl-toolchain-volume"),
    ]);
    assert!(fill.status.success(), "{fill:?}");
    foreign_build("a volume planted with fdl's labels and mark");
    assert!(
        common::toolchain_volumes().contains(opt.as_str()),
        "the planted volume was removed"
    );
    assert!(docker(&["volume", "rm", opt]).status.success());

    // A volume that carries fdl's image label for an image the engine no longer has,
    // under a name that is not fdl's, is not removed by the stale-volume cleanup.
    let victim = format!("fdl-test-victim-{unique}");
    let gone_image = format!("sha256:{}", "0".repeat(64));
    assert!(docker(&[
        "volume",
        "create",
        "--label",
        &test_label,
        "--label",
        &format!("fdl.toolchain.image={gone_image}"),
        &victim,
    ])
    .status
    .success());

    // A volume whose filling never finished (no mark) is made again, not used; a
    // volume that has one is reused without a copy.
    let usr = made.iter().find(|v| v.ends_with("-usr")).unwrap();
    let unmark = docker(&[
        "run",
        "--rm",
        "--network",
        "none",
        "--mount",
        &format!("type=volume,source={usr},target=/v"),
        "--entrypoint",
        "/bin/rm",
        &base,
        "/v/.fdl-toolchain-volume",
    ]);
    assert!(unmark.status.success(), "{unmark:?}");
    let out = build(&good, "7.5", &["--toolchain-volumes", "always"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = std::fs::read_to_string(builds.join("v2.27.5-sm75/build.log")).unwrap();
    assert!(
        log.contains("were left incomplete (/usr): making them again")
            && log.contains("copying the toolchain image's /opt into Docker volumes")
            && log.contains("copying the toolchain image's /usr into Docker volumes"),
        "{log}"
    );
    assert_eq!(common::toolchain_volumes_of(cache.path()).len(), 2);
    assert!(
        common::toolchain_volumes().contains(&victim),
        "the stale-volume cleanup removed a volume that is not fdl's"
    );
    assert!(docker(&["volume", "rm", &victim]).status.success());
    std::fs::remove_dir_all(builds.join("v2.27.5-sm75")).unwrap();

    // 3. A different plan for the same target is refused, naming the difference.
    let other = user_dockerfile(
        work.path(),
        "other.Dockerfile",
        &base,
        "LABEL variant=other\n",
    );
    let before = snapshot(root);
    build(&other, "6.1;12.0", &[]).assert().failure().stderr(
        predicate::str::contains("different plan")
            .and(predicate::str::contains("dockerfile:"))
            .and(predicate::str::contains("--force")),
    );
    assert_eq!(snapshot(root), before);

    // 4. A failing toolchain image build leaves nothing, not even with --force over the
    // old build, and the log of it is kept outside the project.
    let failing = user_dockerfile(
        work.path(),
        "failing.Dockerfile",
        &base,
        "COPY does-not-exist /nowhere\n",
    );
    for (archs, extra) in [("8.6", &[][..]), ("6.1;12.0", &["--force"][..])] {
        let out = build(&failing, archs, extra).output().unwrap();
        engine.adopt();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("toolchain image build failed"), "{stderr}");
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
        assert!(fdl_containers(root).is_empty());
    }
    // A step that fails while running leaves no container of the builder's either.
    // (Containers of this base or an image made from it: the engine may be shared.)
    let all_containers = || {
        let filter = format!("ancestor={base}");
        docker(&["ps", "-a", "-q", "--filter", &filter]).stdout
    };
    let containers_at_start = all_containers();
    let run_fails = user_dockerfile(work.path(), "runfails.Dockerfile", &base, "RUN false\n");
    let out = build(&run_fails, "8.6", &[]).output().unwrap();
    engine.adopt();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("toolchain image build failed"));
    assert_eq!(
        all_containers(),
        containers_at_start,
        "a build container was left"
    );

    // 5. A compile that fails leaves nothing: no container, no work directory, no build.
    let broken = tree(&work.path().join("broken"), (2, 27, 5), |m| m);
    std::fs::write(broken.join("src/collectives.cc"), "this is not C++\n").unwrap();
    for (archs, extra) in [("9.0", &[][..]), ("6.1;12.0", &["--force"][..])] {
        let mut cmd = build_cmd(root, cache.path(), &good, Some(&broken), archs);
        cmd.args(extra)
            .assert()
            .failure()
            .stderr(predicate::str::contains(
                "the compile in the toolchain image failed",
            ));
        assert_eq!(snapshot(root), before);
        assert!(
            fdl_containers(root).is_empty(),
            "a failed compile left its container"
        );
    }

    // 6. --force with a plan that works replaces the build only after success; this
    // one reads the toolchain from the image.
    build(
        &other,
        "6.1;12.0",
        &["--force", "--toolchain-volumes", "never"],
    )
    .assert()
    .success()
    .stdout(predicate::str::contains("Rebuilt and replaced"));
    engine.adopt();
    let log = std::fs::read_to_string(dir.join("build.log")).unwrap();
    assert!(log.contains("docker run --rm"), "{log}");
    assert!(!log.contains("type=volume"), "{log}");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("fdl-build.json")).unwrap())
            .unwrap();
    assert_eq!(
        manifest["plan"]["docker"]["dockerfile"]["path"],
        other.display().to_string()
    );
    assert!(stray_entries(&builds).is_empty());
    assert!(fdl_containers(root).is_empty());

    // 7. A second project with the first plan is served from the machine's build store:
    // the same key, the same library bytes, and no compile container.
    let second = ProjectFixture::empty();
    let out = build_cmd(
        second.root(),
        cache.path(),
        &good,
        Some(&source),
        "6.1;12.0",
    )
    .arg("--json")
    .output()
    .unwrap();
    engine.adopt();
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "installed_from_store", "{v}");
    let second_dir = second
        .root()
        .join("libtorch/nccl/builds/v2.27.5-sm61-sm120");
    let served: BTreeMap<PathBuf, String> = snapshot(&second_dir.join("lib"))
        .into_iter()
        .filter(|(p, _)| !p.ends_with("nccl.pc"))
        .collect();
    assert_eq!(served, compiled_lib, "the store served other bytes");
    let log = std::fs::read_to_string(second_dir.join("build.log")).unwrap();
    assert!(log.contains("Installing from the build store"), "{log}");
    assert!(!log.contains("docker run"), "a compile ran: {log}");
    let m1: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(second_dir.join("fdl-build.json")).unwrap())
            .unwrap();
    assert!(
        m1["store"]["inputs"]["toolchain.toolchain_image_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("sha256:")),
        "the key names the toolchain image: {m1}"
    );
}

/// Without `--source`, the tag is fetched on the host (here from a local repository,
/// `FDL_NCCL_REPO`) into fdl's cache, as the native backend fetches it, and mounted.
#[test]
#[ignore = "needs a Docker engine: `cargo test -- --include-ignored`"]
fn a_tag_without_source_is_fetched_on_the_host() {
    let _serial = docker_engine_lock();
    if !engine_available() {
        return;
    }
    let mut engine = Engine::new();
    let base = format!("fdl-test-fakecuda:{}", unique_suffix());
    engine.fake_cuda_base(&base);
    let work = tempfile::tempdir().unwrap();
    let repo = native_fixture::tagged_repo(&work.path().join("repo"), (2, 27, 5), "v2.27.5-1");
    let dockerfile = user_dockerfile(work.path(), "Dockerfile", &base, "");
    let project = ProjectFixture::empty();
    let cache = engine.cache();
    let out = build_cmd(project.root(), cache.path(), &dockerfile, None, "8.6")
        .env("FDL_NCCL_REPO", &repo)
        .arg("--json")
        .output()
        .unwrap();
    engine.adopt();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let dir = PathBuf::from(v["build_dir"].as_str().unwrap());
    let log = std::fs::read_to_string(dir.join("build.log")).unwrap();
    assert!(log.contains("==> fdl: phase clone"), "{log}");
    // The clone is in fdl's cache on the host, and it is what the container mounted.
    let clones = cache.path().join("fdl/nccl-src");
    assert!(clones.is_dir(), "no clone under {}", clones.display());
    assert!(
        log.contains(&format!("<source> = {}", cache.path().display())),
        "{log}"
    );
    assert!(fdl_containers(project.root()).is_empty());
}

#[test]
#[ignore = "needs a Docker engine: `cargo test -- --include-ignored`"]
fn a_build_whose_output_fails_the_check_is_not_installed() {
    let _serial = docker_engine_lock();
    if !engine_available() {
        return;
    }
    let mut engine = Engine::new();
    let base = format!("fdl-test-fakecuda:{}-chk", unique_suffix());
    engine.fake_cuda_base(&base);
    let work = tempfile::tempdir().unwrap();
    // version.mk says 2.27.5, as the tag does, but the Makefile builds 2.27.6.
    let source = tree(&work.path().join("nccl"), (2, 27, 5), |m| {
        m.replacen(
            "include makefiles/version.mk\n",
            "include makefiles/version.mk\nNCCL_PATCH := 6\n",
            1,
        )
    });
    let project = ProjectFixture::empty();
    let dockerfile = user_dockerfile(work.path(), "Dockerfile", &base, "");
    let before = snapshot(project.root());
    let cache = engine.cache();
    build_cmd(
        project.root(),
        cache.path(),
        &dockerfile,
        Some(&source),
        "7.5",
    )
    .assert()
    .failure()
    .stderr(predicate::str::contains(
        "asks for NCCL 2.27.5, but the build produced NCCL 2.27.6",
    ));
    engine.adopt();
    assert_eq!(snapshot(project.root()), before);
    assert!(!project.root().join("libtorch").exists());
    assert!(fdl_containers(project.root()).is_empty());
}

/// While the compile runs: its container has a read-only root file system, no network
/// and the invoking user; no object file is in the container's own file system (`docker
/// diff`), while the objects already compiled are on the host, in the bind-mounted work
/// directory, owned by the invoking user. Then SIGINT to fdl stops the container and
/// leaves nothing: no container, no partial build, no work directory.
#[test]
#[ignore = "needs a Docker engine: `cargo test -- --include-ignored`"]
fn the_compile_writes_only_the_host_and_an_interrupt_leaves_nothing() {
    let _serial = docker_engine_lock();
    if !engine_available() {
        return;
    }
    let mut engine = Engine::new();
    let base = format!("fdl-test-fakecuda:{}-int", unique_suffix());
    engine.fake_cuda_base(&base);
    let work = tempfile::tempdir().unwrap();
    // The compile of collectives.cc (after init.cc, with one job) waits a minute.
    let source = tree(&work.path().join("nccl"), (2, 27, 5), |m| {
        let stall = m
            .lines()
            .find(|l| l.contains("FDL_TEST_STALL"))
            .expect("the stand-in's stall line")
            .to_string();
        m.replace(
            &stall,
            "\t@if [ \"$<\" = src/collectives.cc ]; then sleep 120; fi",
        )
    });
    let project = ProjectFixture::empty();
    let builds = project.root().join("libtorch/nccl/builds");
    let dockerfile = user_dockerfile(work.path(), "Dockerfile", &base, "");
    let before = snapshot(project.root());

    let stderr_path = work.path().join("stderr");
    let cache = engine.cache();
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
            "--jobs",
            "1",
            "--verbose",
            "--toolchain-volumes",
            "always",
            "--dockerfile",
        ])
        .arg(&dockerfile)
        .arg("--source")
        .arg(&source)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    while !std::fs::read_to_string(&stderr_path)
        .unwrap()
        .contains("Compiling  src/collectives.cc")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the compile never reached collectives.cc"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "fdl ended before the compile: {}",
            std::fs::read_to_string(&stderr_path).unwrap()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    engine.adopt();

    // The running compile container, as the engine describes it.
    let running = fdl_containers_where(project.root(), &[]);
    assert_eq!(running.len(), 1, "{running:?}");
    let name = &running[0];
    assert!(name.ends_with("-build"), "{name}");
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let config = lines(docker(&[
        "inspect",
        "--format",
        "{{.HostConfig.ReadonlyRootfs}} {{.HostConfig.NetworkMode}} {{.HostConfig.AutoRemove}} {{.Config.User}}",
        name,
    ]));
    assert_eq!(config, [format!("true none true {uid}:{gid}")]);
    // The toolchain comes from read-only volumes: the compile reads no image layer for
    // its compiler and headers.
    let mounts = lines(docker(&[
        "inspect",
        "--format",
        "{{range .Mounts}}{{.Type}} {{.Destination}} {{.RW}}\n{{end}}",
        name,
    ]));
    for want in ["volume /usr false", "volume /opt false"] {
        assert!(mounts.iter().any(|m| m == want), "{want}: {mounts:?}");
    }
    // What the container wrote into its own file system: the mount points at most.
    let diff = lines(docker(&["diff", name]));
    assert!(
        diff.iter()
            .all(|l| !l.ends_with(".o") && !l.contains("/fdl/work/")),
        "the container wrote into its own file system: {diff:?}"
    );
    // The object compiled so far is on the host, the invoking user's.
    let work_dirs: Vec<PathBuf> = std::fs::read_dir(&builds)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".docker-work-v2.27.5-sm80-")
        })
        .collect();
    assert_eq!(work_dirs.len(), 1, "{work_dirs:?}");
    let object = work_dirs[0].join("build/obj/init.o");
    let meta = std::fs::metadata(&object)
        .unwrap_or_else(|e| panic!("{} is not on the host: {e}", object.display()));
    assert_eq!((meta.uid(), meta.gid()), (uid, gid));

    // SIGINT to fdl alone, as `kill -INT` would; fdl must stop the container and roll back.
    let interrupted = std::time::Instant::now();
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let status = child.wait().unwrap();
    let took = interrupted.elapsed();
    // Reported, not held to a tight bound (a loaded machine is slow): the README says
    // within a second, and `docker stop`'s grace (10 s) or a 3 s wait for a container
    // that ignores SIGTERM would show far above this.
    eprintln!("Ctrl-C during the Docker compile: fdl ended after {took:.2?}");
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
    let stderr = std::fs::read_to_string(&stderr_path).unwrap();
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert!(
        fdl_containers(project.root()).is_empty(),
        "the interrupted build left its container"
    );
    assert_eq!(
        snapshot(project.root()),
        before,
        "the interrupted build left files"
    );
}

/// The owner label value of a live process (`<uid>-<pid>-<start time>`), as fdl writes it.
fn owner_label_of(pid: u32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    let start = rest.split_whitespace().nth(19).unwrap();
    format!("{}-{pid}-{start}", unsafe { libc::getuid() })
}

/// SIGKILL of fdl during a Docker compile leaves no compile running: the container's
/// run script sees fdl's pipe close and ends the build, and the engine removes the
/// container (`--rm`) within seconds. And the next build removes compile containers
/// that their label says a dead fdl of this user left, and no other.
#[test]
#[ignore = "needs a Docker engine: `cargo test -- --include-ignored`"]
fn a_killed_fdl_leaves_no_container_running() {
    let _serial = docker_engine_lock();
    if !engine_available() {
        return;
    }
    let mut engine = Engine::new();
    let base = format!("fdl-test-fakecuda:{}-kill", unique_suffix());
    engine.fake_cuda_base(&base);
    let work = tempfile::tempdir().unwrap();
    let source = tree(&work.path().join("nccl"), (2, 27, 5), |m| {
        let stall = m
            .lines()
            .find(|l| l.contains("FDL_TEST_STALL"))
            .expect("the stand-in's stall line")
            .to_string();
        m.replace(
            &stall,
            "\t@if [ \"$<\" = src/collectives.cc ]; then sleep 300; fi",
        )
    });
    let project = ProjectFixture::empty();
    let dockerfile = user_dockerfile(work.path(), "Dockerfile", &base, "");
    let cache = engine.cache();
    let stderr_path = work.path().join("stderr");
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("fdl"))
        .env("XDG_CACHE_HOME", cache.path())
        .arg("--root")
        .arg(project.root())
        .args(["nccl", "build", "--tag", "v2.27.5-1", "--archs", "8.0"])
        .args(["--jobs", "1", "--verbose", "--toolchain-volumes", "never"])
        .arg("--dockerfile")
        .arg(&dockerfile)
        .arg("--source")
        .arg(&source)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    while !std::fs::read_to_string(&stderr_path)
        .unwrap()
        .contains("Compiling  src/collectives.cc")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the compile never reached collectives.cc"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "fdl ended before the compile: {}",
            std::fs::read_to_string(&stderr_path).unwrap()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    engine.adopt();
    let running = fdl_containers_where(project.root(), &[]);
    assert_eq!(running.len(), 1, "{running:?}");
    let owner = lines(docker(&[
        "inspect",
        "--format",
        "{{index .Config.Labels \"fdl.owner\"}}",
        &running[0],
    ]));
    assert_eq!(owner, [owner_label_of(child.id())]);

    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGKILL) }, 0);
    let killed = std::time::Instant::now();
    child.wait().unwrap();
    while !fdl_containers_where(project.root(), &[]).is_empty() {
        assert!(
            killed.elapsed() < std::time::Duration::from_secs(20),
            "the compile container still runs {:?} after fdl was killed",
            killed.elapsed()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    eprintln!(
        "SIGKILL of fdl: its compile container was gone after {:.2?}",
        killed.elapsed()
    );

    // Containers left by a dead fdl (a pid that is no process now) are removed by the
    // next build; one whose owner lives (this test) and one without fdl's name stay.
    let dead = format!("{}-4194999-1", unsafe { libc::getuid() });
    let live = owner_label_of(std::process::id());
    let unique = unique_suffix();
    let make = |name: &str, owner: &str| {
        let out = docker(&[
            "run",
            "-d",
            "--name",
            name,
            "--label",
            &format!("fdl.owner={owner}"),
            "--network",
            "none",
            "--entrypoint",
            "/bin/sleep",
            &base,
            "300",
        ]);
        assert!(out.status.success(), "{out:?}");
    };
    let orphan = format!("fdl-nccl-4194999-{unique}-build");
    let alive = format!("fdl-nccl-{}-{unique}-build", std::process::id());
    let foreign = format!("fdl-test-{unique}-other");
    make(&orphan, &dead);
    make(&alive, &live);
    make(&foreign, &dead);
    let plain = tree(&work.path().join("nccl-plain"), (2, 27, 5), |m| m);
    let out = build_cmd(
        project.root(),
        cache.path(),
        &dockerfile,
        Some(&plain),
        "8.6",
    )
    .args(["--toolchain-volumes", "never"])
    .timeout(std::time::Duration::from_secs(600))
    .output()
    .unwrap();
    let names = lines(docker(&["ps", "-a", "--format", "{{.Names}}"]));
    for name in [&orphan, &alive, &foreign] {
        let _ = docker(&["rm", "--force", name]);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !names.contains(&orphan),
        "the dead fdl's container stayed: {stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "removing container {orphan} left by an fdl that is gone"
        )),
        "{stderr}"
    );
    assert!(names.contains(&alive), "a live fdl's container was removed");
    assert!(
        names.contains(&foreign),
        "a container without fdl's name was removed"
    );
}

/// A `--dockerfile` whose image has no nvcc: refused before anything compiles, saying
/// what the image lacks and where the contract is, and nothing is left behind.
#[test]
#[ignore = "needs a Docker engine: `cargo test -- --include-ignored`"]
fn a_toolchain_image_without_nvcc_is_refused_with_what_it_lacks() {
    let _serial = docker_engine_lock();
    if !engine_available() {
        return;
    }
    let mut engine = Engine::new();
    let work = tempfile::tempdir().unwrap();
    let source = tree(&work.path().join("nccl"), (2, 27, 5), |m| m);
    let dockerfile = user_dockerfile(work.path(), "Dockerfile", debian_image(), "");
    let project = ProjectFixture::empty();
    let before = snapshot(project.root());
    let cache = engine.cache();
    let out = build_cmd(
        project.root(),
        cache.path(),
        &dockerfile,
        Some(&source),
        "8.6",
    )
    .output()
    .unwrap();
    engine.adopt();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for want in [
        format!("--dockerfile {}", dockerfile.display()).as_str(),
        "has no nvcc",
        "CUDA_HOME",
        "fdl nccl dockerfile",
        "Nothing was installed",
    ] {
        assert!(stderr.contains(want), "{want:?} not in {stderr}");
    }
    assert!(!stderr.contains("Compiling"), "{stderr}");
    assert_eq!(snapshot(project.root()), before);
    assert!(fdl_containers(project.root()).is_empty());
}

/// The staged tree is hostile: a compile whose `install` plants `build.log`,
/// `fdl-build.json` and `lib/pkgconfig/nccl.pc` as absolute links to files outside (the
/// bind mount puts them on the host as they are) is refused by verification, naming the
/// link, and the files the links point at are unchanged; nothing is installed.
#[test]
#[ignore = "needs a Docker engine: `cargo test -- --include-ignored`"]
fn planted_links_in_the_installed_tree_write_nothing_outside() {
    let _serial = docker_engine_lock();
    if !engine_available() {
        return;
    }
    let mut engine = Engine::new();
    let base = format!("fdl-test-fakecuda:{}-plant", unique_suffix());
    engine.fake_cuda_base(&base);
    let work = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let project = ProjectFixture::empty();
    let builds = project.root().join("libtorch/nccl/builds");
    let dockerfile = user_dockerfile(work.path(), "Dockerfile", &base, "");
    // One user's cache for every attempt: the toolchain volumes the first makes are
    // fdl's by the token kept there, and the next attempts use them.
    let cache = engine.cache();
    for (plant, victim_name) in [
        ("lib/pkgconfig/nccl.pc", "victim.pc"),
        ("build.log", "victim.log"),
        ("fdl-build.json", "victim.json"),
    ] {
        let victim = outside.path().join(victim_name);
        std::fs::write(&victim, "prefix=/usr/local/nccl\nkeep me\n").unwrap();
        let plant_line = format!(
            "\trm -f $(PREFIX)/{plant} && ln -s {} $(PREFIX)/{plant}\n",
            victim.display()
        );
        let source = tree(
            &work.path().join(format!("tree-{victim_name}")),
            (2, 27, 5),
            |m| {
                let install = "\tcp -R $(INCDIR)/. $(PREFIX)/include/\n";
                assert!(m.contains(install), "the stand-in's install changed: {m}");
                m.replace(install, &format!("{install}{plant_line}"))
            },
        );
        let out = build_cmd(
            project.root(),
            cache.path(),
            &dockerfile,
            Some(&source),
            "8.6",
        )
        .output()
        .unwrap();
        engine.adopt();
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
    assert!(fdl_containers(project.root()).is_empty());
}

/// The guard every Docker test holds removes what the test made — the images it names,
/// the `<none>` layers its failed classic builds leave, its volumes — and nothing of
/// another job on the same engine: a tagged image it did not name (the cached base
/// images of tests/support), an untagged layer of another build, another run's volume,
/// another job's container.
#[test]
#[ignore = "needs a Docker engine: `cargo test -- --include-ignored`"]
fn the_engine_guard_removes_what_a_test_made_and_keeps_cached_images() {
    let _serial = docker_engine_lock();
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
    let mut guard = EngineGuard::new();
    // Made while the guard lives, but tagged and not named: like a cached base image, or
    // another job's image.
    assert!(build(Some(&kept), "FROM scratch\nCOPY a /kept\n")
        .status
        .success());
    let base = format!("fdl-test-base:{unique}");
    assert!(build(Some(&base), "FROM scratch\nCOPY a /base\n")
        .status
        .success());
    guard.base(&base);
    assert!(build(Some(&named), "FROM scratch\nCOPY a /named\n")
        .status
        .success());
    guard.name(&named);
    // A classic build that fails after one step leaves that step's image, untagged: from
    // this test's base and from its named image (ours), and from the kept image (another
    // job's build, made while this test ran).
    let failed = |from: &str, what: &str| {
        let out = build(
            None,
            &format!("FROM {from}\nCOPY a /left-{what}\nCOPY missing /nowhere\n"),
        );
        assert!(!out.status.success());
    };
    let before_theirs = images();
    failed(&kept, "theirs");
    let theirs: Vec<String> = images()
        .lines()
        .filter(|id| !before_theirs.contains(id))
        .map(str::to_string)
        .collect();
    assert_eq!(theirs.len(), 1, "{theirs:?}");
    failed(&base, "base");
    failed(&named, "named");
    // Another job's container and volumes, beside this test's own volume.
    let their_container = format!("fdl-test-theirs-{unique}");
    assert!(docker(&["create", "--name", &their_container, &kept, "/x"])
        .status
        .success());
    let their_volume = format!("fdl-test-theirs-{unique}");
    assert!(docker(&[
        "volume",
        "create",
        "--label",
        &format!("{TEST_VOLUME_LABEL}=another-run"),
        &their_volume
    ])
    .status
    .success());
    let our_volume = format!("fdl-test-ours-{unique}");
    assert!(docker(&[
        "volume",
        "create",
        "--label",
        &test_volume_label(),
        &our_volume
    ])
    .status
    .success());
    let (_, leftovers) = guard.leftovers();
    assert!(leftovers.len() >= 3, "{leftovers:?}");
    assert!(!leftovers.contains(&theirs[0]), "{leftovers:?}");
    assert!(guard.volumes().contains(&our_volume));
    drop(guard);
    let after = images();
    for id in &leftovers {
        assert!(!after.contains(id.as_str()), "{id} is still there");
    }
    let exists = |what: &[&str]| docker(what).status.success();
    assert!(exists(&["image", "inspect", &kept]));
    assert!(exists(&["image", "inspect", &base]));
    assert!(
        exists(&["image", "inspect", &theirs[0]]),
        "another job's layer went"
    );
    assert!(exists(&["container", "inspect", &their_container]));
    assert!(exists(&["volume", "inspect", &their_volume]));
    assert!(!exists(&["volume", "inspect", &our_volume]));
    let _ = docker(&["rm", "--force", &their_container]);
    let _ = docker(&["volume", "rm", &their_volume]);
    let _ = docker(&["rmi", "--force", &theirs[0], &kept, &base]);
}

/// A hostile Docker engine for the real `docker` client: an API endpoint on a Unix
/// socket (`DOCKER_HOST=unix://…`) that answers `_ping` and every call as an engine
/// with no images would, except the one `case` names (`<call>-<hang|flood>`, the call
/// being `version`, `info` or `inspect`): that one never answers, or answers with a
/// 8 MiB value the client then prints (past fdl's 1 MiB cap, quick to make under load). The client is the real one; only the engine
/// behind it is made to fail on cue, which a working engine cannot be.
struct HostileEngine {
    dir: tempfile::TempDir,
    server: std::process::Child,
}

impl HostileEngine {
    fn start(case: &str) -> HostileEngine {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("engine.sock");
        let script = r#"
import http.server, json, os, socketserver, sys, time
sock, case = sys.argv[1], sys.argv[2]
BIG = "9" * (8 << 20)
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def address_string(self): return "engine"
    def send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Api-Version", "1.41")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def act(self, call):
        if case == call + "-hang":
            time.sleep(600)
        return case == call + "-flood"
    def do_HEAD(self): self.do_GET()
    def do_GET(self):
        path = self.path.split("?")[0]
        if path.endswith("/_ping"):
            self.send_response(200)
            self.send_header("Api-Version", "1.41")
            self.send_header("Content-Length", "2")
            self.end_headers()
            if self.command == "GET": self.wfile.write(b"OK")
        elif path.endswith("/version"):
            big = self.act("version")
            self.send(200, {"Version": BIG if big else "27.5.1", "ApiVersion": "1.41",
                            "MinAPIVersion": "1.12", "Os": "linux", "Arch": "amd64"})
        elif path.endswith("/info"):
            big = self.act("info")
            self.send(200, {"Driver": BIG if big else "overlay2", "OSType": "linux"})
        elif "/images/" in path and path.endswith("/json"):
            if self.act("inspect"):
                self.send(200, {"Id": "sha256:" + BIG})
            else:
                self.send(404, {"message": "No such image"})
        else:
            self.send(404, {"message": "page not found"})
class S(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
S(sock, H).serve_forever()
"#;
        let server = Std::new("python3")
            .args(["-c", script])
            .arg(&sock)
            .arg(case)
            .spawn()
            .expect("python3 serves the hostile engine");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !sock.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the hostile engine did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        HostileEngine { dir, server }
    }

    fn host(&self) -> String {
        format!("unix://{}", self.dir.path().join("engine.sock").display())
    }
}

impl Drop for HostileEngine {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// `docker version`, `info` and `inspect` that never answer, or answer without end, cost
/// a dry run a bounded wait and bounded memory: it ends, naming the call and its limit
/// (the hung or flooding client is stopped). The engine calls of the plan share one
/// 15 s deadline, and an engine that did not answer once is not asked again: a dry run
/// against a stuck engine ends within that, plus fdl's own start. The client is the
/// real `docker`, talking to a [`HostileEngine`].
#[test]
#[ignore = "needs the docker client: `cargo test -- --include-ignored`"]
fn engine_calls_that_hang_or_flood_are_bounded_and_named() {
    let work = tempfile::tempdir().unwrap();
    let source = tree(&work.path().join("nccl"), (2, 27, 5), |m| m);
    let cases = [
        ("version-hang", "did not answer within 15 s"),
        ("version-flood", "KiB on its stdout"),
        ("info-hang", "did not answer within 15 s"),
        ("info-flood", "KiB on its stdout"),
        ("inspect-hang", "did not answer within 15 s"),
        ("inspect-flood", "KiB on its stdout"),
    ];
    let runs: Vec<_> = cases
        .iter()
        .map(|(case, _)| {
            let project = ProjectFixture::empty();
            let cache = tempfile::tempdir().unwrap();
            let engine = HostileEngine::start(case);
            let mut cmd = Std::new(assert_cmd::cargo::cargo_bin("fdl"));
            cmd.arg("--root")
                .arg(project.root())
                .args(["nccl", "build", "--tag", "v2.27.5-1"])
                // Chosen by the engine's answer, so that `info` is asked too; a version
                // that never comes must then still be named, so Docker is asked for.
                .args(if case.starts_with("version") {
                    &["--backend", "docker"][..]
                } else {
                    &[]
                })
                .args(["--archs", "8.6", "--cuda", "12.8", "--dry-run", "--source"])
                .arg(&source)
                .env("XDG_CACHE_HOME", cache.path())
                .env("DOCKER_HOST", engine.host())
                .env_remove("DOCKER_CONTEXT")
                .env_remove("FDL_ROOT")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            let start = std::time::Instant::now();
            (cmd.spawn().unwrap(), start, project, cache, engine)
        })
        .collect();
    for ((case, want), (child, start, _project, _cache, _engine)) in cases.iter().zip(runs) {
        let out = child.wait_with_output().unwrap();
        let took = start.elapsed();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let call = match case.split('-').next().unwrap() {
            "inspect" => "docker image inspect",
            "info" => "docker info",
            _ => "docker version",
        };
        assert!(
            text.contains(&format!("`{call}`")) && text.contains(want),
            "{case}: {took:?}\n{text}"
        );
        // Never silent while it waits: a call that hangs is said to be waited for.
        if case.ends_with("-hang") {
            assert!(
                text.contains(&format!("waiting for the Docker engine to answer `{call}`")),
                "{case}: {text}"
            );
        }
        // The plan's engine calls share one 15 s deadline (six dry runs run at once on
        // two CPUs here: the margin is theirs).
        assert!(
            took < std::time::Duration::from_secs(25),
            "{case}: {took:?}"
        );
        assert!(!text.contains("panicked"), "{case}: {text}");
        eprintln!("{case}: {took:.1?}");
    }
}
