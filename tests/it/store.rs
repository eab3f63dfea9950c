//! The machine-wide build store end to end, through the CLI: the stand-in NCCL tree
//! (tests/native_fixture) built by the native backend with the real nvcc 13 of the
//! oracle wheels (`FDL_TEST_CUDA_HOME_NEWEST`: nvcc with the runtime, crt and nvvm wheels, a
//! home NCCL's compile takes; from `source .ci/fetch-oracles`), which the
//! store key asks for its `--version`. Each test has its own cache (XDG_CACHE_HOME,
//! which holds the store) and projects.

use crate::common;
use crate::native_fixture;
use common::*;
use native_fixture::*;
use std::path::{Path, PathBuf};
use std::process::{Command as Std, Output, Stdio};

const TAG: &str = "v2.27.5-1";

/// A cache (and so a store) shared by the projects of one test, and one source tree.
struct Machine {
    cache: tempfile::TempDir,
    work: tempfile::TempDir,
    cuda_home: PathBuf,
    cuda: String,
}

impl Machine {
    fn new() -> Machine {
        let cuda_home = oracle_input("FDL_TEST_CUDA_HOME_NEWEST");
        let toolkit = fdl::native::discover(Some(&cuda_home), false)
            .toolkit
            .unwrap_or_else(|| panic!("no toolkit at {}", cuda_home.display()));
        let m = Machine {
            cache: tempfile::tempdir().unwrap(),
            work: tempfile::tempdir().unwrap(),
            cuda: format!("{}.{}", toolkit.cuda.major, toolkit.cuda.minor),
            cuda_home,
        };
        standin_tree(&m.tree(), (2, 27, 5));
        m
    }

    fn tree(&self) -> PathBuf {
        self.work.path().join("nccl")
    }

    fn store_dir(&self) -> PathBuf {
        self.cache.path().join("fdl/store")
    }

    /// The store's entries (directories named by a key), sorted.
    fn entries(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.store_dir())
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| !n.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    fn leftovers(&self) -> Vec<String> {
        std::fs::read_dir(self.store_dir())
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `fdl` with this machine's cache and none of the variables that change a build.
    fn fdl(&self) -> Std {
        let mut cmd = Std::new(assert_cmd::cargo::cargo_bin("fdl"));
        for var in [
            "FDL_ROOT",
            "CUDA_HOME",
            "CXX",
            "FDL_NCCL_REPO",
            "FDL_TEST_STALL",
            "FDL_TEST_STALL_SECS",
            "FDL_TEST_KILL_AT",
            "MAKEFLAGS",
        ] {
            cmd.env_remove(var);
        }
        cmd.env("XDG_CACHE_HOME", self.cache.path());
        cmd
    }

    /// `fdl --root ROOT nccl build --json …` of the stand-in tree for `archs`.
    fn build(&self, root: &Path, archs: &str, extra: &[&str]) -> Std {
        let mut cmd = self.fdl();
        cmd.arg("--root")
            .arg(root)
            .args(["nccl", "build", "--backend", "native", "--tag", TAG])
            .args(["--cuda", &self.cuda, "--archs", archs, "--json"])
            .arg("--cuda-home")
            .arg(&self.cuda_home)
            .arg("--source")
            .arg(self.tree())
            .args(extra);
        cmd
    }
}

fn run(mut cmd: Std) -> Output {
    cmd.output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The JSON of a successful command.
fn ok(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "fdl failed:\nstdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every file and link under `dir/lib`, by relative path: the SHA-256 of its bytes, or
/// the link's target.
fn lib_bytes(dir: &Path) -> Vec<(String, String)> {
    fn walk(root: &Path, rel: &Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(root.join(rel))
            .unwrap()
            .flatten()
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let rel = rel.join(e.file_name());
            let t = e.file_type().unwrap();
            let key = rel.display().to_string();
            if t.is_symlink() {
                let target = std::fs::read_link(e.path()).unwrap();
                out.push((key, format!("link {}", target.display())));
            } else if t.is_dir() {
                walk(root, &rel, out);
            } else if key != "lib/pkgconfig/nccl.pc" {
                // nccl.pc names its own directory, which differs per project.
                let bytes = std::fs::read(e.path()).unwrap();
                out.push((key, fdl::digest::sha256_hex(&bytes)));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, Path::new("lib"), &mut out);
    assert!(out.iter().any(|(p, _)| p.starts_with("lib/libnccl.so.2.")));
    out
}

fn build_dir(v: &serde_json::Value) -> PathBuf {
    PathBuf::from(v["build_dir"].as_str().unwrap())
}

/// A PATH with the tools the plan's key asks for (c++) and the probe's loader needs,
/// but no `make`: a compile cannot start.
fn path_without_make() -> tempfile::TempDir {
    let dir = path_of_only(&["g++", "c++", "python3", "git"]);
    assert!(!dir.path().join("make").exists());
    dir
}

#[test]
#[ignore = "needs the real nvcc of the oracle wheels: `source .ci/fetch-oracles`, then `cargo test --test it store:: -- --include-ignored`"]
fn a_second_project_is_served_from_the_store_with_identical_bytes_and_no_make() {
    let m = Machine::new();
    let (a, b) = (ProjectFixture::empty(), ProjectFixture::empty());

    // Before anything is stored, the dry run names the key and says it is a miss.
    let dry = ok(&run(m.build(a.root(), "8.6", &["--dry-run"])));
    assert_eq!(dry["store"]["state"], "miss", "{dry}");
    let key = dry["store"]["key"].as_str().unwrap().to_string();
    assert_eq!(key.len(), 64);
    assert!(m.entries().is_empty(), "a dry run writes nothing");

    let first = ok(&run(m.build(a.root(), "8.6", &[])));
    assert_eq!(first["status"], "built", "{first}");
    assert_eq!(first["manifest"]["store"]["key"], key.as_str());
    assert_eq!(first["manifest"]["store"]["from_store"], false);
    assert_eq!(m.entries(), vec![key.clone()]);

    // The second project's dry run says "from the store", in text too.
    let dry = ok(&run(m.build(b.root(), "8.6", &["--dry-run"])));
    assert_eq!(dry["store"]["state"], "hit", "{dry}");
    let mut cmd = m.fdl();
    cmd.arg("--root")
        .arg(b.root())
        .args(["nccl", "build", "--backend", "native", "--tag", TAG])
        .args(["--cuda", &m.cuda, "--archs", "8.6", "--dry-run"])
        .arg("--cuda-home")
        .arg(&m.cuda_home)
        .arg("--source")
        .arg(m.tree());
    let out_text = run(cmd);
    assert!(out_text.status.success(), "{}", text(&out_text.stderr));
    let shown = text(&out_text.stdout);
    assert!(
        shown.contains(&key) && shown.contains("from the store"),
        "{shown}"
    );

    // No make on PATH: only the store can make this succeed.
    let path = path_without_make();
    let mut second = m.build(b.root(), "8.6", &[]);
    second.env("PATH", path.path());
    let out = run(second);
    let v = ok(&out);
    assert_eq!(v["status"], "installed_from_store", "{v}");
    assert_eq!(v["manifest"]["store"]["from_store"], true);
    assert_eq!(v["manifest"]["store"]["key"], key.as_str());
    let (da, db) = (build_dir(&first), build_dir(&v));
    assert_ne!(da, db);
    assert_eq!(lib_bytes(&da), lib_bytes(&db), "same key, same lib/ bytes");
    // Its nccl.pc names its own directory.
    let pc = std::fs::read_to_string(db.join("lib/pkgconfig/nccl.pc")).unwrap();
    assert!(pc.contains(&format!("prefix={}", db.display())), "{pc}");
    // The installed build is a whole fdl build: `nccl verify` passes on it.
    let out = run({
        let mut c = m.fdl();
        c.arg("--root")
            .arg(b.root())
            .args(["nccl", "verify", "v2.27.5-sm86", "--json"]);
        c
    });
    let verified = ok(&out);
    assert_eq!(verified["passed"], true, "{verified}");

    // Both projects are the entry's users.
    let list = ok(&run({
        let mut c = m.fdl();
        c.args(["store", "list", "--json"]);
        c
    }));
    let entries = list["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{list}");
    let users: Vec<String> = entries[0]["users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["builds_dir"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(users.len(), 2, "{list}");
    assert!(entries[0]["size_bytes"].as_u64().unwrap() > 0);
    assert_eq!(
        entries[0]["record"]["inputs"]["toolchain.cuda"]
            .as_str()
            .unwrap()
            .split('.')
            .take(2)
            .collect::<Vec<_>>()
            .join("."),
        m.cuda
    );
    assert!(m.leftovers().is_empty(), "{:?}", m.leftovers());
}

#[test]
#[ignore = "needs the real nvcc of the oracle wheels: `source .ci/fetch-oracles`, then `cargo test --test it store:: -- --include-ignored`"]
fn a_change_of_archs_or_only_funcs_is_a_miss_and_no_store_skips_it() {
    let m = Machine::new();
    let p = ProjectFixture::empty();
    let first = ok(&run(m.build(p.root(), "8.6", &[])));
    let k1 = first["manifest"]["store"]["key"]
        .as_str()
        .unwrap()
        .to_string();

    // Another arch: another key, compiled.
    let q = ProjectFixture::empty();
    let v = ok(&run(m.build(q.root(), "8.6;12.0", &[])));
    assert_eq!(v["status"], "built", "{v}");
    let k2 = v["manifest"]["store"]["key"].as_str().unwrap().to_string();
    assert_ne!(k1, k2);

    // ONLY_FUNCS: another key, compiled.
    let v = ok(&run(m.build(
        q.root(),
        "8.6",
        &["--only-funcs", "AllReduce Sum f32"],
    )));
    assert_eq!(v["status"], "built", "{v}");
    let k3 = v["manifest"]["store"]["key"].as_str().unwrap().to_string();
    assert!(k3 != k1 && k3 != k2);
    let mut want = vec![k1.clone(), k2, k3];
    want.sort();
    assert_eq!(m.entries(), want);

    // --no-store: compiled although the key is stored, and nothing recorded.
    let r = ProjectFixture::empty();
    let dry = ok(&run(m.build(r.root(), "8.6", &["--no-store", "--dry-run"])));
    assert_eq!(dry["store"]["state"], "skipped");
    let v = ok(&run(m.build(r.root(), "8.6", &["--no-store"])));
    assert_eq!(v["status"], "built", "{v}");
    assert!(v["manifest"].get("store").is_none(), "{v}");
    assert_eq!(m.entries().len(), 3);
}

#[test]
#[ignore = "needs the real nvcc of the oracle wheels: `source .ci/fetch-oracles`, then `cargo test --test it store:: -- --include-ignored`"]
fn killed_during_the_store_write_leaves_no_entry_and_the_next_build_makes_it() {
    let m = Machine::new();
    let p = ProjectFixture::empty();
    let mut killed = m.build(p.root(), "8.6", &[]);
    killed.env("FDL_TEST_KILL_AT", "store:before-rename");
    let out = run(killed);
    assert!(!out.status.success(), "{}", text(&out.stderr));
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(libc::SIGKILL));
    }
    assert!(m.entries().is_empty(), "{:?}", m.entries());
    // What it left is a staging directory, no entry.
    assert!(
        m.leftovers().iter().all(|n| n.starts_with(".staging-")),
        "{:?}",
        m.leftovers()
    );

    let v = ok(&run(m.build(p.root(), "8.6", &[])));
    assert_eq!(v["status"], "built", "{v}");
    let key = v["manifest"]["store"]["key"].as_str().unwrap().to_string();
    assert_eq!(m.entries(), vec![key]);
    assert!(m.leftovers().is_empty(), "{:?}", m.leftovers());
}

#[test]
#[ignore = "needs the real nvcc of the oracle wheels: `source .ci/fetch-oracles`, then `cargo test --test it store:: -- --include-ignored`"]
fn a_modified_entry_is_detected_and_rebuilt_not_installed() {
    let m = Machine::new();
    let (a, b) = (ProjectFixture::empty(), ProjectFixture::empty());
    let first = ok(&run(m.build(a.root(), "8.6", &[])));
    let key = first["manifest"]["store"]["key"]
        .as_str()
        .unwrap()
        .to_string();
    let original = lib_bytes(&build_dir(&first));

    // A file of the entry changed (a new inode, so project a's build is untouched).
    let lib_dir = m.store_dir().join(&key).join("tree/lib");
    let real = std::fs::read_dir(&lib_dir)
        .unwrap()
        .flatten()
        .find(|e| {
            e.file_type().unwrap().is_file()
                && e.file_name().to_string_lossy().starts_with("libnccl.so.2.")
        })
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&real).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0xff;
    std::fs::remove_file(&real).unwrap();
    std::fs::write(&real, &bytes).unwrap();

    let out = run(m.build(b.root(), "8.6", &[]));
    let v = ok(&out);
    assert_eq!(v["status"], "built", "{v}");
    assert_eq!(v["manifest"]["store"]["from_store"], false);
    let err = text(&out.stderr);
    assert!(err.contains("was modified"), "{err}");
    let rebuilt = lib_bytes(&build_dir(&v));
    assert!(
        !rebuilt
            .iter()
            .any(|(_, d)| *d == fdl::digest::sha256_hex(&bytes)),
        "the modified library was installed"
    );
    // Project a's build, made before, is untouched.
    assert_eq!(lib_bytes(&build_dir(&first)), original);
    // The entry was replaced by the rebuild: it serves again, the rebuilt bytes.
    assert_eq!(m.entries(), vec![key.clone()]);
    assert_eq!(lib_bytes(&m.store_dir().join(&key).join("tree")), rebuilt);
    let c = ProjectFixture::empty();
    let v = ok(&run(m.build(c.root(), "8.6", &[])));
    assert_eq!(v["status"], "installed_from_store", "{v}");
    assert_eq!(lib_bytes(&build_dir(&v)), rebuilt);
}

#[test]
#[ignore = "needs the real nvcc of the oracle wheels: `source .ci/fetch-oracles`, then `cargo test --test it store:: -- --include-ignored`"]
fn a_byte_changed_in_place_with_size_and_mtime_kept_is_still_detected() {
    let m = Machine::new();
    let (a, b) = (ProjectFixture::empty(), ProjectFixture::empty());
    let first = ok(&run(m.build(a.root(), "8.6", &[])));
    let key = first["manifest"]["store"]["key"]
        .as_str()
        .unwrap()
        .to_string();
    let lib_dir = m.store_dir().join(&key).join("tree/lib");
    let real = std::fs::read_dir(&lib_dir)
        .unwrap()
        .flatten()
        .find(|e| {
            e.file_type().unwrap().is_file()
                && e.file_name().to_string_lossy().starts_with("libnccl.so.2.")
        })
        .unwrap()
        .path();
    // The same inode, the same size, one byte in the middle flipped, and the mtime put
    // back with `touch -r`: nothing a stat shows tells it apart, only its bytes.
    let stamp = m.work.path().join("stamp");
    std::fs::write(&stamp, "").unwrap();
    let touch = |from: &Path, to: &Path| {
        let st = Std::new("touch")
            .arg("-r")
            .arg(from)
            .arg(to)
            .status()
            .unwrap();
        assert!(st.success(), "touch -r failed");
    };
    touch(&real, &stamp);
    let before = std::fs::metadata(&real).unwrap();
    {
        use std::io::{Read, Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&real)
            .unwrap();
        let at = before.len() / 2;
        let mut byte = [0u8];
        f.seek(SeekFrom::Start(at)).unwrap();
        f.read_exact(&mut byte).unwrap();
        f.seek(SeekFrom::Start(at)).unwrap();
        f.write_all(&[byte[0] ^ 0xff]).unwrap();
    }
    touch(&stamp, &real);
    let after = std::fs::metadata(&real).unwrap();
    {
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            (after.len(), after.ino(), after.mtime(), after.mtime_nsec()),
            (
                before.len(),
                before.ino(),
                before.mtime(),
                before.mtime_nsec()
            )
        );
    }
    let changed = fdl::digest::sha256_hex(&std::fs::read(&real).unwrap());

    let out = run(m.build(b.root(), "8.6", &[]));
    let v = ok(&out);
    let err = text(&out.stderr);
    assert_eq!(v["status"], "built", "{v}\n{err}");
    assert_eq!(v["manifest"]["store"]["from_store"], false);
    assert!(err.contains("was modified"), "{err}");
    assert!(
        !lib_bytes(&build_dir(&v)).iter().any(|(_, d)| *d == changed),
        "the modified library was installed"
    );
}

#[test]
#[ignore = "needs the real nvcc of the oracle wheels: `source .ci/fetch-oracles`, then `cargo test --test it store:: -- --include-ignored`"]
fn two_concurrent_builds_of_one_key_build_it_once() {
    let m = Machine::new();
    let (a, b) = (ProjectFixture::empty(), ProjectFixture::empty());
    let marker = m.work.path().join("compiling");
    // The first build stalls in its compile, holding the key's lock.
    let mut first = m.build(a.root(), "8.6", &[]);
    first
        .env("FDL_TEST_STALL", &marker)
        .env("FDL_TEST_STALL_SECS", "4")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let first = first.spawn().unwrap();
    let start = std::time::Instant::now();
    while !marker.exists() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(120),
            "the first build never reached its compile"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The second starts while the first compiles (its plan is a miss then). Its `make`
    // records every start: it must wait for the first and install what it stored.
    let (path, ran) = path_with_recording_make(m.work.path());
    let mut second = m.build(b.root(), "8.6", &[]);
    second.env("PATH", path);
    let second = run(second);
    let first = first.wait_with_output().unwrap();
    let v1 = ok(&first);
    let v2 = ok(&second);
    assert_eq!(v1["status"], "built", "{v1}");
    assert_eq!(v2["status"], "installed_from_store", "{v2}");
    let err = text(&second.stderr);
    assert!(err.contains("locked by another fdl"), "{err}");
    assert!(!ran.exists(), "the second build ran make");
    assert_eq!(m.entries().len(), 1);
    assert_eq!(lib_bytes(&build_dir(&v1)), lib_bytes(&build_dir(&v2)));
}

/// The same for two first builds of a tag fdl clones (no `--source`): the key is the
/// cloned commit, unknown before the clone, and the first build clones before it looks
/// the key up, so it holds the key's lock while it compiles; the second waits for it and
/// installs its entry without running make.
#[test]
#[ignore = "needs the real nvcc of the oracle wheels: `source .ci/fetch-oracles`, then `cargo test --test it store:: -- --include-ignored`"]
fn two_concurrent_first_builds_of_a_cloned_tag_build_it_once() {
    let m = Machine::new();
    let repo = tagged_repo(&m.work.path().join("repo"), (2, 27, 5), TAG);
    let (a, b) = (ProjectFixture::empty(), ProjectFixture::empty());
    let build = |root: &Path| {
        let mut cmd = m.fdl();
        cmd.arg("--root")
            .arg(root)
            .args(["nccl", "build", "--backend", "native", "--tag", TAG])
            .args(["--cuda", &m.cuda, "--archs", "8.6", "--json"])
            .arg("--cuda-home")
            .arg(&m.cuda_home)
            .env("FDL_NCCL_REPO", &repo);
        cmd
    };
    let marker = m.work.path().join("compiling");
    let mut first = build(a.root());
    first
        .env("FDL_TEST_STALL", &marker)
        .env("FDL_TEST_STALL_SECS", "4")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let first = first.spawn().unwrap();
    let start = std::time::Instant::now();
    while !marker.exists() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(120),
            "the first build never reached its compile"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (path, ran) = path_with_recording_make(m.work.path());
    let mut second = build(b.root());
    second.env("PATH", path);
    let second = run(second);
    let first = first.wait_with_output().unwrap();
    let v1 = ok(&first);
    let v2 = ok(&second);
    assert_eq!(v1["status"], "built", "{v1}");
    assert_eq!(v1["manifest"]["plan"]["native"]["source"]["kind"], "clone");
    assert_eq!(v2["status"], "installed_from_store", "{v2}");
    let err = text(&second.stderr);
    assert!(err.contains("locked by another fdl"), "{err}");
    assert!(!ran.exists(), "the second build ran make");
    assert_eq!(m.entries().len(), 1);
    assert_eq!(lib_bytes(&build_dir(&v1)), lib_bytes(&build_dir(&v2)));
}

/// PATH with a `make` first that touches `<dir>/make-ran` and then runs the real one.
fn path_with_recording_make(dir: &Path) -> (String, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("recording-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let ran = dir.join("make-ran");
    let real = host_tool("make").expect("make is needed for this test");
    let script = bin.join("make");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n: > '{}'\nexec '{}' \"$@\"\n",
            ran.display(),
            real.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (path_with(&bin), ran)
}

#[test]
#[ignore = "needs the real nvcc of the oracle wheels: `source .ci/fetch-oracles`, then `cargo test --test it store:: -- --include-ignored`"]
fn gc_keeps_what_projects_use_and_asks_first() {
    let m = Machine::new();
    let (a, b) = (ProjectFixture::empty(), ProjectFixture::empty());
    let used = ok(&run(m.build(a.root(), "8.6", &[])));
    let used = used["manifest"]["store"]["key"]
        .as_str()
        .unwrap()
        .to_string();
    let gone = ok(&run(m.build(b.root(), "12.0", &[])));
    let gone = gone["manifest"]["store"]["key"]
        .as_str()
        .unwrap()
        .to_string();
    // Project b's build goes; its entry is then used by no one.
    let out = run({
        let mut c = m.fdl();
        c.arg("--root")
            .arg(b.root())
            .args(["nccl", "remove", "v2.27.5-sm120", "--yes"]);
        c
    });
    assert!(out.status.success(), "{}", text(&out.stderr));

    let store = |args: &[&str]| -> Output {
        let mut c = m.fdl();
        c.arg("store").args(args).stdin(Stdio::null());
        run(c)
    };
    // No terminal and no --yes: refused, saying how, and nothing removed.
    let out = store(&["gc"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--yes"), "{}", text(&out.stderr));
    assert_eq!(m.entries().len(), 2);

    let out = store(&["gc", "--yes"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(m.entries(), vec![used.clone()]);
    assert!(!m.entries().contains(&gone));

    // The text list names the user; remove takes a unique prefix; bad keys fail.
    let out = store(&["list"]);
    let listed = text(&out.stdout);
    assert!(
        listed.contains(&used) && listed.contains("used by"),
        "{listed}"
    );
    let out = store(&["remove", "zz"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("not a store key"));
    let out = store(&["remove", "0123456789abcdef0123"]);
    assert!(!out.status.success());
    // An entry a project build uses is removed only when asked to: without a terminal
    // to ask on, --yes.
    let out = store(&["remove", &used[..8]]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("used by") && err.contains("--yes"), "{err}");
    assert_eq!(m.entries(), vec![used.clone()]);
    let out = store(&["remove", &used[..8], "--yes"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(m.entries().is_empty());
    // Project a's build is untouched by the removal of the entry it came from.
    let out = run({
        let mut c = m.fdl();
        c.arg("--root")
            .arg(a.root())
            .args(["nccl", "verify", "v2.27.5-sm86", "--json"]);
        c
    });
    assert_eq!(ok(&out)["passed"], true);
}

/// Issue 28's hostile test "One project's edit changes the others": three projects of
/// one store entry; `cp` over the first one's library (same size, then another size)
/// is named by its `nccl verify`, which exits non-zero, while the second project and the
/// entry itself keep every byte (no project shares an inode with the store).
#[test]
#[ignore = "needs the real nvcc of the oracle wheels: `source .ci/fetch-oracles`, then `cargo test --test it store:: -- --include-ignored`"]
fn one_projects_edit_changes_the_others() {
    let m = Machine::new();
    let (a, b) = (ProjectFixture::empty(), ProjectFixture::empty());
    let first = ok(&run(m.build(a.root(), "8.6", &[])));
    assert_eq!(first["status"], "built", "{first}");
    let second = ok(&run(m.build(b.root(), "8.6", &[])));
    assert_eq!(second["status"], "installed_from_store", "{second}");
    let key = first["manifest"]["store"]["key"]
        .as_str()
        .unwrap()
        .to_string();
    let entry = m.store_dir().join(&key).join("tree");
    let (da, db) = (build_dir(&first), build_dir(&second));
    let (entry_before, b_before) = (lib_bytes(&entry), lib_bytes(&db));
    assert_eq!(lib_bytes(&da), b_before);
    let verify = |root: &Path| {
        let mut c = m.fdl();
        c.arg("--root")
            .arg(root)
            .args(["nccl", "verify", "v2.27.5-sm86"]);
        run(c)
    };
    let out = verify(a.root());
    assert!(out.status.success(), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains("files"),
        "verify does not check the files: {}",
        text(&out.stdout)
    );

    let lib_name = std::fs::read_link(da.join("lib/libnccl.so.2")).unwrap();
    let lib = da.join("lib").join(&lib_name);
    let original = std::fs::read(&lib).unwrap();
    let mut same_size = original.clone();
    let mid = same_size.len() / 2;
    same_size[mid] ^= 0xff;
    let mut longer = original.clone();
    longer.extend_from_slice(b"appended by an editor");
    for (what, bytes) in [("same size", same_size), ("another size", longer)] {
        let edited = m.work.path().join("edited");
        std::fs::write(&edited, &bytes).unwrap();
        // `cp` over an existing file writes into its inode, as an editor or a careless
        // install script would.
        let st = Std::new("cp").arg(&edited).arg(&lib).status().unwrap();
        assert!(st.success());
        let out = verify(a.root());
        let shown = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(!out.status.success(), "{what}: verify passed:\n{shown}");
        assert!(
            shown.contains(&format!("lib/{} changed", lib_name.display())),
            "{what}: the changed file is not named:\n{shown}"
        );
        assert_eq!(
            lib_bytes(&db),
            b_before,
            "{what}: the other project changed"
        );
        assert_eq!(
            lib_bytes(&entry),
            entry_before,
            "{what}: the store entry changed"
        );
        let out = verify(b.root());
        assert!(
            out.status.success(),
            "{what}: the other project fails verify:\n{}",
            text(&out.stdout)
        );
    }
}

/// A manifest written before fdl recorded each file's digest reads as before, and its
/// verify says the bytes are "not recorded", never "ok".
#[test]
#[ignore = "needs the real nvcc of the oracle wheels: `source .ci/fetch-oracles`, then `cargo test --test it store:: -- --include-ignored`"]
fn an_old_manifest_says_not_recorded_not_ok() {
    let m = Machine::new();
    let a = ProjectFixture::empty();
    let dir = build_dir(&ok(&run(m.build(a.root(), "8.6", &["--no-store"]))));
    let path = dir.join("fdl-build.json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let files = json.as_object_mut().unwrap().remove("files");
    assert!(
        files.is_some_and(|f| f.as_array().is_some_and(|a| !a.is_empty())),
        "the manifest records no files"
    );
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
    let mut c = m.fdl();
    c.arg("--root")
        .arg(a.root())
        .args(["nccl", "verify", "v2.27.5-sm86", "--json"]);
    let v = ok(&run(c));
    let check = v["reports"][0]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "files")
        .unwrap_or_else(|| panic!("no files check: {v}"))
        .clone();
    assert_eq!(check["status"], "skipped", "{check}");
    assert!(
        check["detail"]
            .as_str()
            .unwrap()
            .starts_with("not recorded"),
        "{check}"
    );
}

/// `fdl store gc` and `list` say whose store they act on; on an empty store gc says it
/// is empty, not that "every store entry is used" (issue 29).
#[test]
fn gc_and_list_name_the_store_and_say_when_it_is_empty() {
    let cache = tempfile::tempdir().unwrap();
    let dir = cache.path().join("fdl/store");
    for args in [&["store", "gc", "--yes"][..], &["store", "list"][..]] {
        let out = common::fdl()
            .env("XDG_CACHE_HOME", cache.path())
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?}: {text}");
        assert!(
            text.contains(&dir.display().to_string()) && text.contains("is empty"),
            "{args:?}: {text}"
        );
        assert!(!text.contains("Every"), "{args:?}: {text}");
    }
}

/// The toolchain is probed for the store key once per build at most: never where the
/// plan already knew the key, once after the build where the build makes it known (a
/// Docker toolchain's image), and never again where nothing the build does changes it.
/// Runs without the oracle inputs: a backend that copies a prepared tree, counting its
/// probes.
#[test]
fn the_store_key_is_probed_once_per_build_at_most() {
    use fdl::nccl::backend::Backend;
    use fdl::pipeline::{execute, ExecOptions, KeyState};
    use std::cell::Cell;
    use std::collections::BTreeMap;

    /// Its toolchain is named only once a build made it, as a Docker image is.
    struct Counting<'a> {
        tree: &'a Path,
        probes: Cell<u32>,
        built: Cell<bool>,
    }
    impl Backend for Counting<'_> {
        fn build(
            &self,
            _plan: &fdl::nccl::plan::BuildPlan,
            staging: &Path,
            _progress: &fdl::progress::Progress,
        ) -> anyhow::Result<()> {
            let ok = Std::new("cp")
                .arg("-a")
                .arg(format!("{}/.", self.tree.display()))
                .arg(staging)
                .status()?
                .success();
            anyhow::ensure!(ok, "cp failed");
            self.built.set(true);
            Ok(())
        }
        fn toolchain_identity(
            &self,
            _plan: &fdl::nccl::plan::BuildPlan,
        ) -> anyhow::Result<BTreeMap<String, String>> {
            self.probes.set(self.probes.get() + 1);
            anyhow::ensure!(self.built.get(), "the image is not made yet");
            Ok(BTreeMap::from([("image".into(), "sha256:test".into())]))
        }
    }

    let trees = tempfile::tempdir().unwrap();
    let tree = trees.path().join("tree");
    write_nccl_tree(&tree, (2, 27, 5), &[89]);
    let exe = assert_cmd::cargo::cargo_bin("fdl");
    let probe = |lib: &Path| fdl::nccl::verify::probe_in_child(&exe, lib);
    let known = |plan: &fdl::nccl::plan::BuildPlan| {
        let toolchain = BTreeMap::from([("image".into(), "sha256:known".into())]);
        let inputs = fdl::pipeline::key_inputs(plan, "known", &toolchain);
        KeyState::Known(fdl::store::Key::of(&inputs), inputs)
    };
    type Case = (&'static str, u32, bool);
    let cases: [Case; 3] = [
        ("known", 0, true),
        ("after build", 1, true),
        ("unknown", 0, false),
    ];
    for (case, probes, added) in cases {
        let (root, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let plan = docker_plan(root.path(), TAG, "8.9");
        let key = match case {
            "known" => known(&plan),
            "after build" => KeyState::AfterBuild("the image is not made yet".into()),
            _ => KeyState::Unknown("no probe answers".into()),
        };
        let backend = Counting {
            tree: &tree,
            probes: Cell::new(0),
            built: Cell::new(false),
        };
        let store = fdl::store::Store::open_in(&cache.path().join("fdl")).unwrap();
        let ctx = fdl::context::Context::new(
            fdl::context::Env {
                xdg_cache_home: Some(cache.path().into()),
                home: None,
            },
            Box::new(fdl::context::Stderr),
        );
        let opts = ExecOptions {
            probe: Some(&probe),
            ctx: &ctx,
            force: false,
            wait: fdl::lock::Wait::No,
            verbosity: fdl::progress::Verbosity::Quiet,
            store: Some(store),
            key: key.clone(),
        };
        let builds = fdl::nccl::store::BuildStore::new(root.path().join("libtorch/nccl/builds"));
        execute(&plan, &backend, &builds, &opts).unwrap();
        assert_eq!(backend.probes.get(), probes, "{case}");
        let expected = match key {
            KeyState::Known(key, _) => key,
            _ => fdl::pipeline::store_key(&plan, &backend).unwrap().0,
        };
        let store = opts.store.as_ref().unwrap();
        assert_eq!(store.has(&expected), added, "{case}");
    }
}
