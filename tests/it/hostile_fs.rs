//! A hostile filesystem: every file fdl reads that it did not write in this run, with a
//! FIFO, a device and an oversized file planted in its place, must be a prompt, clear
//! error naming the path and what is there — never a hang, never unbounded memory. And
//! what fdl creates (a ship's `.incoming-<name>`, its cache, ssh's control directory) is
//! never reached through a link it did not make.
//!
//! fdl runs under an address-space limit (`ulimit -v`) and a timeout: a regression fails
//! the test instead of hanging it or exhausting the machine.

use crate::common;
use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Address space fdl may use here: far above what any of these commands needs, far below
/// what an unbounded read of `/dev/zero` reaches.
const AS_LIMIT_KIB: u64 = 4 << 20;

/// What is planted where fdl expects a small regular file.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Plant {
    Fifo,
    /// A link to `/dev/zero`, as the issue reproduced it.
    ZeroLink,
    /// A character device node itself (`mknod`, root only), where a link is not followed.
    Device,
    /// A sparse file far larger than any such file.
    Oversized,
    Directory,
}

impl Plant {
    /// What the message must say (one of these): what is there, in fdl's words. A
    /// link where fdl does not follow links is named as a link.
    fn expected(self) -> &'static [&'static str] {
        match self {
            Plant::Fifo => &["a FIFO", "(FIFO, socket or device)"],
            Plant::ZeroLink => &["a device", "a link", "symlink to /dev/zero"],
            Plant::Device => &["a device", "(FIFO, socket or device)"],
            Plant::Oversized => &["larger than"],
            Plant::Directory => &["a directory"],
        }
    }
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string; mkfifo only creates the node.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o600) },
        0,
        "{}",
        path.display()
    );
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Replaces whatever is at `path` with `what`. `false` where this cannot be made here
/// (a device node needs root).
fn plant(path: &Path, what: Plant) -> bool {
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if m.is_dir() {
            std::fs::remove_dir_all(path).unwrap();
        } else {
            std::fs::remove_file(path).unwrap();
        }
    }
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    match what {
        Plant::Fifo => mkfifo(path),
        Plant::ZeroLink => std::os::unix::fs::symlink("/dev/zero", path).unwrap(),
        Plant::Device => {
            if !is_root() {
                return false;
            }
            let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
            // SAFETY: a valid C string; the node is /dev/zero's (1, 5).
            let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 5)) };
            if rc != 0 {
                return false;
            }
        }
        Plant::Oversized => {
            let f = std::fs::File::create(path).unwrap();
            f.set_len(64 << 20).unwrap();
        }
        Plant::Directory => std::fs::create_dir(path).unwrap(),
    }
    true
}

/// `fdl ARGS` in `root` under the address-space limit and a timeout; (exit code, stdout
/// and stderr together, how long it took).
fn run_limited(
    root: &Path,
    env: &[(&str, &Path)],
    args: &[&str],
) -> (Option<i32>, String, Duration) {
    let mut cmd = assert_cmd::Command::new("sh");
    cmd.arg("-c")
        .arg(format!("ulimit -v {AS_LIMIT_KIB} && exec \"$0\" \"$@\""))
        .arg(assert_cmd::cargo::cargo_bin("fdl"))
        .arg("--root")
        .arg(root)
        .args(args)
        .env_remove("FDL_ROOT")
        // A blocked open never returns: the kill at this bound (no exit code) is what tells
        // it, and a machine loaded with other builds still answers well within it.
        .timeout(Duration::from_secs(60));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let start = Instant::now();
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text, start.elapsed())
}

/// One read path: how to set a project up, which file to plant, which command reads it,
/// and which plants apply (a walk that hashes large files in a stream has no cap, and a
/// link there is a link, not followed).
struct ReadPath {
    what: &'static str,
    plants: &'static [Plant],
    setup: fn(&BuildsFixture) -> (PathBuf, Vec<String>),
}

const SMALL_FILE: &[Plant] = &[
    Plant::Fifo,
    Plant::ZeroLink,
    Plant::Oversized,
    Plant::Directory,
];
const TREE_FILE: &[Plant] = &[Plant::Fifo, Plant::Device];

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// A project with one installed build (a stand-in NCCL tree through the real pipeline).
fn with_build(f: &BuildsFixture) -> String {
    let tree = f.tree("nccl", (2, 27, 5), &[61]);
    f.install(&tree, "v2.27.5-1", "6.1").unwrap()
}

const CLUSTER: &str = "cluster:\n  controller:\n    host: c\n    path: /c\n  workers:\n    - host: node-a\n      path: /nonexistent/fdl-test\n      ssh:\n        target: fdl-test.invalid\n";

/// An NCCL source tree's shape, its `makefiles/version.mk` left to plant.
fn nccl_source_without_version(f: &BuildsFixture) -> PathBuf {
    let src = f.project.root().join("nccl-src");
    std::fs::create_dir_all(src.join("src")).unwrap();
    std::fs::create_dir_all(src.join("makefiles")).unwrap();
    std::fs::write(src.join("Makefile"), "all:\n").unwrap();
    src
}

fn read_paths() -> Vec<ReadPath> {
    vec![
        ReadPath {
            what: "libtorch/.active (libtorch list)",
            plants: SMALL_FILE,
            setup: |f| {
                let lt = f.project.root().join("libtorch");
                std::fs::create_dir_all(lt.join("precompiled/v")).unwrap();
                (lt.join(".active"), strings(&["libtorch", "list"]))
            },
        },
        ReadPath {
            what: ".arch of a variant (libtorch info)",
            plants: SMALL_FILE,
            setup: |f| {
                let v = f.project.root().join("libtorch/precompiled/v");
                std::fs::create_dir_all(&v).unwrap();
                (v.join(".arch"), strings(&["libtorch", "info", "v"]))
            },
        },
        ReadPath {
            what: "makefiles/version.mk of --source (docker backend)",
            plants: SMALL_FILE,
            setup: |f| {
                let src = nccl_source_without_version(f);
                let args = strings(&[
                    "nccl",
                    "build",
                    "--tag",
                    "v2.27.5-1",
                    "--archs",
                    "8.6",
                    "--dry-run",
                    "--backend",
                    "docker",
                    "--source",
                ]);
                let mut args = args;
                args.push(src.to_str().unwrap().to_string());
                (src.join("makefiles/version.mk"), args)
            },
        },
        ReadPath {
            what: "makefiles/version.mk of --source (native backend)",
            plants: SMALL_FILE,
            setup: |f| {
                let src = nccl_source_without_version(f);
                // A stand-in toolkit: the dry run asks nvcc its version, nothing more.
                let cuda = f.project.root().join("cuda");
                std::fs::create_dir_all(cuda.join("bin")).unwrap();
                let nvcc = cuda.join("bin/nvcc");
                std::fs::write(
                    &nvcc,
                    "#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n",
                )
                .unwrap();
                std::fs::set_permissions(&nvcc, std::fs::Permissions::from_mode(0o755)).unwrap();
                let mut args = strings(&[
                    "nccl",
                    "build",
                    "--tag",
                    "v2.27.5-1",
                    "--archs",
                    "8.6",
                    "--dry-run",
                    "--backend",
                    "native",
                    "--cuda-home",
                ]);
                args.push(cuda.to_str().unwrap().to_string());
                args.push("--source".into());
                args.push(src.to_str().unwrap().to_string());
                (src.join("makefiles/version.mk"), args)
            },
        },
        ReadPath {
            what: "a build's fdl-build.json (nccl verify)",
            plants: SMALL_FILE,
            setup: |f| {
                let name = with_build(f);
                (
                    f.builds().join(&name).join("fdl-build.json"),
                    strings(&["nccl", "verify", &name]),
                )
            },
        },
        ReadPath {
            what: "a build's include/nccl.h (nccl verify)",
            plants: SMALL_FILE,
            setup: |f| {
                let name = with_build(f);
                (
                    f.builds().join(&name).join("include/nccl.h"),
                    strings(&["nccl", "verify", &name]),
                )
            },
        },
        ReadPath {
            what: "fdl.cluster.yml (cluster env)",
            plants: SMALL_FILE,
            setup: |f| {
                (
                    f.project.root().join("fdl.cluster.yml"),
                    strings(&["cluster", "env"]),
                )
            },
        },
        ReadPath {
            what: "a file inside the build being shipped (ship --dry-run hashes it)",
            plants: TREE_FILE,
            setup: |f| {
                let name = with_build(f);
                std::fs::write(f.project.root().join("fdl.cluster.yml"), CLUSTER).unwrap();
                (
                    f.builds().join(&name).join("lib/planted"),
                    strings(&["cluster", "ship", &name, "--dry-run", "--timeout", "5"]),
                )
            },
        },
        ReadPath {
            what: "a file inside a worker's .incoming copy (receive --install)",
            plants: TREE_FILE,
            setup: |f| {
                let incoming = f.builds().join(".incoming-b");
                std::fs::create_dir_all(incoming.join("lib")).unwrap();
                std::fs::write(incoming.join("lib/real"), "x").unwrap();
                (
                    incoming.join("lib/planted"),
                    strings(&[
                        "cluster",
                        "receive",
                        "--install",
                        "b",
                        "--digest",
                        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                    ]),
                )
            },
        },
        ReadPath {
            what: "a torch's build-version (libtorch add)",
            plants: SMALL_FILE,
            setup: |f| {
                let torch = f.project.root().join("torch-archive");
                std::fs::create_dir_all(torch.join("lib")).unwrap();
                compile_shared(
                    &nccl_like_source((2, 27, 3), "12.8"),
                    &torch.join("lib/libtorch_cuda.so"),
                    &[],
                );
                let mut args = strings(&["libtorch", "add", "t"]);
                args.push(torch.to_str().unwrap().to_string());
                (torch.join("build-version"), args)
            },
        },
    ]
}

/// Every read path, with every plant that applies: a prompt failure whose message names
/// the file and says what is there.
#[test]
fn every_read_path_refuses_fifos_devices_and_oversized_files_promptly() {
    let mut failures = Vec::new();
    for path in read_paths() {
        for &what in path.plants {
            let f = BuildsFixture::new(ProjectFixture::empty());
            let (file, args) = (path.setup)(&f);
            if !plant(&file, what) {
                // A case that cannot be set up is a failure, never a silent pass: a device
                // node needs root, as the README's test command runs on CI.
                failures.push(format!(
                    "{} with {what:?}: the plant cannot be made here (a device node needs root)",
                    path.what
                ));
                continue;
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (code, text, took) = run_limited(
                f.project.root(),
                &[("XDG_CACHE_HOME", f.cache.path())],
                &args,
            );
            let name = file.file_name().unwrap().to_str().unwrap();
            let ok = code == Some(1)
                && text.contains(name)
                && what.expected().iter().any(|e| text.contains(e))
                && !text.contains("panicked");
            if !ok {
                failures.push(format!(
                    "{} with {what:?}: exit {code:?} after {took:?}, expected one of {:?} naming {name}:\n{text}",
                    path.what,
                    what.expected()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n---\n"));
}

/// nccl.pc is rewritten on install (receive): an oversized one is refused, not read
/// into memory; a FIFO is refused without blocking.
#[test]
fn the_pkgconfig_rewrite_reads_only_a_small_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    let pc = dir.path().join("nccl.pc");
    for what in [Plant::Oversized, Plant::Fifo] {
        plant(&pc, what);
        let (tx, rx) = std::sync::mpsc::channel();
        let p = pc.clone();
        std::thread::spawn(move || {
            let _ = tx.send(fdl::nccl::tree::rewrite_pc_prefix(&p, Path::new("/b")));
        });
        let got = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the rewrite hung");
        let e = format!("{:#}", got.unwrap_err());
        assert!(e.contains("nccl.pc"), "{e}");
        let said = match what {
            Plant::Oversized => "larger than",
            _ => "not a regular file",
        };
        assert!(e.contains(said), "{what:?}: {e}");
    }
}

// ---- what fdl creates: .incoming-<name> on a worker ----

/// A directory of someone else's files, and what it held, to prove it untouched.
fn victim() -> (tempfile::TempDir, BTreeMapSnapshot) {
    let v = tempfile::tempdir().unwrap();
    std::fs::write(v.path().join("precious"), "keep me").unwrap();
    std::fs::create_dir(v.path().join("sub")).unwrap();
    std::fs::write(v.path().join("sub/also"), "keep me too").unwrap();
    let snap = snapshot(v.path());
    (v, snap)
}

type BTreeMapSnapshot = std::collections::BTreeMap<PathBuf, String>;

/// `receive --state NAME --prepare` with a link planted at `.incoming-NAME`: the link is
/// never followed; the entry is made afresh as fdl's own directory (0700) and the link's
/// target keeps every file and its mode.
#[test]
fn prepare_replaces_a_planted_link_and_never_follows_it() {
    let f = BuildsFixture::new(ProjectFixture::empty());
    let builds = f.builds();
    std::fs::create_dir_all(&builds).unwrap();
    let (v, before) = victim();
    std::fs::set_permissions(v.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let incoming = builds.join(".incoming-b");
    std::os::unix::fs::symlink(v.path(), &incoming).unwrap();
    let out = f
        .fdl()
        .args(["cluster", "receive", "--state", "b", "--prepare"])
        .timeout(Duration::from_secs(30))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = std::fs::symlink_metadata(&incoming).unwrap();
    assert!(m.is_dir(), "the link is still there");
    assert_eq!(m.mode() & 0o777, 0o700);
    // Only the place token fdl itself writes there (cluster::receive): nothing of the
    // link's target came along.
    let names: Vec<String> = std::fs::read_dir(&incoming)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| n == ".fdl-place"), "{names:?}");
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        Path::new(answer["incoming"].as_str().unwrap()),
        incoming.canonicalize().unwrap()
    );
    assert_eq!(snapshot(v.path()), before);
    assert_eq!(std::fs::metadata(v.path()).unwrap().mode() & 0o777, 0o755);

    // A FIFO there is replaced the same way; a directory others can write is refused.
    std::fs::remove_dir_all(&incoming).unwrap();
    mkfifo(&incoming);
    let out = f
        .fdl()
        .args(["cluster", "receive", "--state", "b", "--prepare"])
        .timeout(Duration::from_secs(30))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::symlink_metadata(&incoming).unwrap().is_dir());
    std::fs::set_permissions(&incoming, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = f
        .fdl()
        .args(["cluster", "receive", "--state", "b", "--prepare"])
        .timeout(Duration::from_secs(30))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("a directory fdl did not make"), "{text}");
}

/// `receive --install` with `.incoming-NAME` a link to a directory holding a copy: the
/// link is not followed, nothing is moved out of its target, nothing is installed.
#[test]
fn install_refuses_an_incoming_that_is_a_link() {
    let f = BuildsFixture::new(ProjectFixture::empty());
    let name = with_build(&f);
    let build = f.builds().join(&name);
    // The victim holds an exact copy of the build, so the digest would match.
    let v = tempfile::tempdir().unwrap();
    let copy = v.path().join("copy");
    assert!(std::process::Command::new("cp")
        .arg("-a")
        .arg(&build)
        .arg(&copy)
        .status()
        .unwrap()
        .success());
    let before = snapshot(&copy);
    let digest = fdl::cluster::receive::content_digest(&build).unwrap();
    std::fs::remove_dir_all(&build).unwrap();
    let incoming = f.builds().join(format!(".incoming-{name}"));
    std::os::unix::fs::symlink(&copy, &incoming).unwrap();
    let out = f
        .fdl()
        .args([
            "cluster",
            "receive",
            "--install",
            &name,
            "--digest",
            &digest,
        ])
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("is a link, not the directory fdl made"),
        "{text}"
    );
    assert_eq!(snapshot(&copy), before);
    assert!(!build.exists());
}

// ---- the cache and ssh's control directory ----

fn cluster_status(
    f: &BuildsFixture,
    env: &[(&str, &Path)],
    remove: &[&str],
) -> (Option<i32>, String) {
    std::fs::write(f.project.root().join("fdl.cluster.yml"), CLUSTER).unwrap();
    let mut cmd = fdl_in(f.project.root());
    cmd.args(["cluster", "status", "--timeout", "2"])
        .timeout(Duration::from_secs(60));
    for k in remove {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Without HOME and XDG_CACHE_HOME the cache is `<temp>/fdl-<uid>`: a link planted
/// there, or a directory others may enter, is refused, and the link's target keeps its
/// mode; a missing one is made 0700.
#[test]
fn the_fallback_cache_is_this_users_alone() {
    let f = BuildsFixture::new(ProjectFixture::empty());
    let tmp = tempfile::tempdir().unwrap();
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let cache = tmp.path().join(format!("fdl-{uid}"));
    let env = [("TMPDIR", tmp.path())];
    let unset = ["HOME", "XDG_CACHE_HOME"];

    let (v, before) = victim();
    std::fs::set_permissions(v.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::os::unix::fs::symlink(v.path(), &cache).unwrap();
    let (code, text) = cluster_status(&f, &env, &unset);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains(&format!("fdl-{uid} is not a directory")),
        "{text}"
    );
    assert_eq!(std::fs::metadata(v.path()).unwrap().mode() & 0o777, 0o777);
    assert_eq!(snapshot(v.path()), before);

    std::fs::remove_file(&cache).unwrap();
    std::fs::create_dir(&cache).unwrap();
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (code, text) = cluster_status(&f, &env, &unset);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("is writable by others"), "{text}");
    assert_eq!(std::fs::metadata(&cache).unwrap().mode() & 0o777, 0o777);

    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (code, text) = cluster_status(&f, &env, &unset);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("is open to other users"), "{text}");

    std::fs::remove_dir(&cache).unwrap();
    let _ = cluster_status(&f, &env, &unset);
    let m = std::fs::symlink_metadata(&cache).unwrap();
    assert!(m.is_dir());
    assert_eq!(m.mode() & 0o777, 0o700);
    assert_eq!(m.uid(), uid);
}

/// `<cache>/ssh` holds the control sockets: a link planted there is refused and its
/// target is not chmod-ed; a directory others may enter is refused.
#[test]
fn the_ssh_control_directory_is_never_reached_through_a_link() {
    let f = BuildsFixture::new(ProjectFixture::empty());
    let xdg = tempfile::tempdir().unwrap();
    let cache = xdg.path().join("fdl");
    std::fs::create_dir(&cache).unwrap();
    let (v, before) = victim();
    std::fs::set_permissions(v.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink(v.path(), cache.join("ssh")).unwrap();
    let env = [("XDG_CACHE_HOME", xdg.path())];
    let (code, text) = cluster_status(&f, &env, &[]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("ssh is not a directory"), "{text}");
    assert_eq!(std::fs::metadata(v.path()).unwrap().mode() & 0o777, 0o755);
    assert_eq!(snapshot(v.path()), before);

    std::fs::remove_file(cache.join("ssh")).unwrap();
    std::fs::create_dir(cache.join("ssh")).unwrap();
    std::fs::set_permissions(cache.join("ssh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (code, text) = cluster_status(&f, &env, &[]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("is open to other users"), "{text}");
    assert_eq!(
        std::fs::metadata(cache.join("ssh")).unwrap().mode() & 0o777,
        0o755
    );
}

// ---- a whole ship, over rsync and over tar, to a worker that swaps its .incoming ----

/// A stand-in `ssh` that runs the remote command here (the worker is a directory of
/// this machine), after `$FDL_TEST_SSH_HOOK` when set: a hostile worker's moves.
const FAKE_SSH: &str = r#"#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-l|-i|-F|-J|-S) shift 2 ;;
    --) shift; break ;;
    -*) shift ;;
    *) break ;;
  esac
done
shift
if [ -n "$FDL_TEST_SSH_HOOK" ]; then sh -c "$FDL_TEST_SSH_HOOK" hook "$*" || exit 1; fi
exec sh -c "$*"
"#;

/// A PATH whose `ssh` is [`FAKE_SSH`], with every other tool of this system but, when
/// `rsync` is false, rsync (so ship takes its tar fallback).
fn fake_path(rsync: bool) -> tempfile::TempDir {
    let bin = tempfile::tempdir().unwrap();
    let ssh = bin.path().join("ssh");
    std::fs::write(&ssh, FAKE_SSH).unwrap();
    std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o755)).unwrap();
    for dir in [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            if name == "ssh" || (!rsync && name == "rsync") {
                continue;
            }
            let _ = std::os::unix::fs::symlink(e.path(), bin.path().join(&name));
        }
    }
    bin
}

/// Ships the fixture's build to a worker directory over `rsync` or tar, with `hook` run
/// by the worker's "ssh" before each command; (exit code, output, worker's builds dir).
fn ship_to_local_worker(
    f: &BuildsFixture,
    name: &str,
    worker: &Path,
    rsync: bool,
    hook: &str,
) -> (Option<i32>, String) {
    let bin = fake_path(rsync);
    std::fs::write(
        f.project.root().join("fdl.cluster.yml"),
        format!(
            "cluster:\n  controller:\n    host: c\n    path: /c\n  workers:\n    - host: w\n      path: {}\n      ssh:\n        target: fdl-test-worker\n",
            worker.display()
        ),
    )
    .unwrap();
    let out = f
        .fdl()
        .args(["cluster", "ship", name, "--timeout", "30"])
        .env("PATH", bin.path())
        .env("FDL_TEST_SSH_HOOK", hook)
        .timeout(Duration::from_secs(300))
        .output()
        .unwrap();
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Over both transports: a plain ship installs the build; a worker that swaps
/// `.incoming-<name>` for a link to a directory of files after `--prepare` made it gets
/// nothing written through the link — the copy is refused, the link's target intact.
#[test]
fn ship_never_writes_through_a_link_swapped_in_at_incoming() {
    let f = BuildsFixture::new(ProjectFixture::empty());
    let name = with_build(&f);
    let digest = fdl::cluster::receive::content_digest(&f.builds().join(&name)).unwrap();
    for rsync in [true, false] {
        let worker = tempfile::tempdir().unwrap();
        let (code, text) = ship_to_local_worker(&f, &name, worker.path(), rsync, "");
        assert_eq!(code, Some(0), "rsync {rsync}: {text}");
        let how = if rsync { "rsync" } else { "tar over ssh" };
        assert!(
            text.contains(&format!("installed (copied with {how}")),
            "{text}"
        );
        let installed = worker.path().join("libtorch/nccl/builds").join(&name);
        assert_eq!(
            fdl::cluster::receive::content_digest(&installed).unwrap(),
            digest,
            "rsync {rsync}"
        );

        let worker = tempfile::tempdir().unwrap();
        let (v, before) = victim();
        let incoming = worker
            .path()
            .join("libtorch/nccl/builds")
            .join(format!(".incoming-{name}"));
        // The copy's own command (rsync's server, or tar) finds a link in its place.
        let hook = format!(
            "case \"$1\" in *--server*|*'tar -xf'*) rm -rf '{i}' && ln -s '{v}' '{i}' ;; esac",
            i = incoming.display(),
            v = v.path().display()
        );
        let (code, text) = ship_to_local_worker(&f, &name, worker.path(), rsync, &hook);
        assert_ne!(code, Some(0), "rsync {rsync}: {text}");
        assert!(
            text.contains("is not the directory fdl made for the copy"),
            "rsync {rsync}: {text}"
        );
        assert_eq!(snapshot(v.path()), before, "rsync {rsync}");
        assert!(!worker
            .path()
            .join("libtorch/nccl/builds")
            .join(&name)
            .exists());
    }
}

// ---- what fdl creates under its cache: every directory checked as the store's is ----

use crate::native_fixture;

/// A native build of the stand-in NCCL tree (stand-in nvcc, no GPU toolchain) with its
/// own cache at `xdg`; `source` is the tree, or `None` to clone the tag from `repo`.
fn cache_build(
    xdg: &Path,
    work: &Path,
    source: Option<&Path>,
    repo: Option<&Path>,
) -> (Option<i32>, String) {
    let cuda = work.join("cuda");
    if !cuda.exists() {
        native_fixture::cuda_12_8(&cuda);
    }
    let project = work.join("project");
    std::fs::create_dir_all(project.join("libtorch/nccl/builds")).unwrap();
    let mut cmd = assert_cmd::Command::cargo_bin("fdl").unwrap();
    for var in ["FDL_ROOT", "CUDA_HOME", "CXX", "FDL_NCCL_REPO", "MAKEFLAGS"] {
        cmd.env_remove(var);
    }
    cmd.env("XDG_CACHE_HOME", xdg)
        .arg("--root")
        .arg(&project)
        .args(["nccl", "build", "--backend", "native", "--tag", "v2.27.5-1"])
        .args(["--archs", "8.6", "--cuda-home"])
        .arg(&cuda)
        .timeout(Duration::from_secs(120));
    if let Some(s) = source {
        cmd.arg("--source").arg(s);
    }
    if let Some(r) = repo {
        cmd.env("FDL_NCCL_REPO", r);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A link planted at any directory fdl keeps under its cache — build locks, the logs,
/// the plain aliases of paths, the clone cache, the store — is refused by name before
/// anything is made in it: the build fails, and the link's target keeps exactly what it
/// held. A directory there that others may write is refused the same way.
#[test]
fn a_link_at_any_cache_directory_is_refused_and_its_target_untouched() {
    for sub in ["locks", "logs", "paths", "nccl-src", "store"] {
        let xdg = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        // A source path with a space: the build needs a plain alias of it in `paths/`.
        let tree = work.path().join("with space/nccl");
        native_fixture::standin_tree(&tree, (2, 27, 5));
        let repo = native_fixture::tagged_repo(&work.path().join("repo"), (2, 27, 5), "v2.27.5-1");
        let cache = xdg.path().join("fdl");
        std::fs::create_dir(&cache).unwrap();
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700)).unwrap();
        let (v, before) = victim();
        std::os::unix::fs::symlink(v.path(), cache.join(sub)).unwrap();
        let (source, from) = if sub == "nccl-src" {
            (None, Some(repo.as_path()))
        } else {
            (Some(tree.as_path()), None)
        };
        // The store alone is optional: a build goes on without it, saying why.
        let must_fail = sub != "store";
        let (code, text) = cache_build(xdg.path(), work.path(), source, from);
        assert!(code == Some(1) || !must_fail, "{sub}: {text}");
        assert!(
            text.contains(&format!("{} is not a directory", cache.join(sub).display())),
            "{sub}: {text}"
        );
        assert_eq!(
            snapshot(v.path()),
            before,
            "{sub}: the link's target was written"
        );
        assert!(
            !must_fail || project_builds(work.path()).is_empty(),
            "{sub}: a build was installed or left: {:?}",
            project_builds(work.path())
        );
        let _ = std::fs::remove_dir_all(work.path().join("project"));

        // A real directory that others may write: refused, nothing made in it.
        std::fs::remove_file(cache.join(sub)).unwrap();
        std::fs::create_dir(cache.join(sub)).unwrap();
        std::fs::set_permissions(cache.join(sub), std::fs::Permissions::from_mode(0o777)).unwrap();
        let (code, text) = cache_build(xdg.path(), work.path(), source, from);
        assert!(code == Some(1) || !must_fail, "{sub}: {text}");
        assert!(text.contains("is writable by others"), "{sub}: {text}");
        assert_eq!(
            std::fs::read_dir(cache.join(sub)).unwrap().count(),
            0,
            "{sub}: something was made in a directory others can write"
        );
    }
}

fn project_builds(work: &Path) -> Vec<String> {
    std::fs::read_dir(work.join("project/libtorch/nccl/builds"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A cache directory of another user's: refused before anything is made in it (no
/// `locks/`, no `logs/`), naming the owner. And the lock files fdl makes are 0600, since
/// they record the command line.
#[test]
fn another_users_cache_gets_nothing_and_lock_files_are_private() {
    assert!(
        is_root(),
        "this test gives a directory to another user (chown), which needs root"
    );
    let xdg = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("nccl");
    native_fixture::standin_tree(&tree, (2, 27, 5));
    let cache = xdg.path().join("fdl");
    std::fs::create_dir(&cache).unwrap();
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&cache, Some(65534), Some(65534)).unwrap();
    let (code, text) = cache_build(xdg.path(), work.path(), Some(&tree), None);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("belongs to another user (uid 65534)"),
        "{text}"
    );
    let made: Vec<_> = std::fs::read_dir(&cache).unwrap().flatten().collect();
    assert!(made.is_empty(), "made in another user's cache: {made:?}");

    // This user's own cache: the build runs, and its lock files are this user's alone.
    std::fs::remove_dir(&cache).unwrap();
    let (code, text) = cache_build(xdg.path(), work.path(), Some(&tree), None);
    assert_eq!(code, Some(0), "{text}");
    let locks: Vec<_> = std::fs::read_dir(cache.join("locks"))
        .unwrap()
        .flatten()
        .collect();
    assert!(!locks.is_empty(), "the build took no lock");
    for lock in locks {
        let mode = lock.metadata().unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", lock.path().display());
    }
}
