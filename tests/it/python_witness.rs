//! The Python witness (`loader::pywitness`) against a real torch: a venv holding torch
//! 2.15.0 and the nvidia-nccl-cu13 it requires (`FDL_TEST_TORCH_VENV`, its root), and
//! another real NCCL (`FDL_TEST_NCCL_LIB_CU13_NEWEST`, 2.32.3) to plant. `.ci/fetch-oracles`
//! names both; a missing one fails the test. The truth each case expects is set up by the
//! test itself (which NCCL it plants where), and the slots the witness reads are checked
//! against `readelf -r`'s listing of the same file.

use crate::common;
use common::oracle_input;
use fdl::loader::pywitness::{ask_python, Limits, NoPythonWitness, PythonLaunch, Reach};
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

struct Venv {
    root: PathBuf,
    site: PathBuf,
}

fn venv() -> Venv {
    let root = oracle_input("FDL_TEST_TORCH_VENV");
    let lib = root.join("lib");
    let site = std::fs::read_dir(&lib)
        .unwrap_or_else(|e| panic!("{}: {e}", lib.display()))
        .flatten()
        .map(|e| e.path().join("site-packages"))
        .find(|p| p.join("torch").is_dir())
        .unwrap_or_else(|| panic!("no site-packages with torch under {}", lib.display()));
    Venv { root, site }
}

impl Venv {
    fn python(&self) -> PathBuf {
        self.root.join("bin/python")
    }
    fn torch(&self) -> PathBuf {
        self.site.join("torch")
    }
    fn nccl(&self) -> PathBuf {
        self.site.join("nvidia/nccl/lib/libnccl.so.2")
    }
    fn launch(&self, cwd: &Path, extra: &[(&str, OsString)]) -> PythonLaunch {
        let mut env: Vec<(OsString, OsString)> = vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            (
                "HOME".into(),
                std::env::var_os("HOME").unwrap_or_else(|| "/".into()),
            ),
        ];
        env.extend(extra.iter().map(|(k, v)| (OsString::from(k), v.clone())));
        PythonLaunch {
            interpreter: self.python(),
            torch_dir: self.torch(),
            cwd: cwd.to_path_buf(),
            env,
        }
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => (x.dev(), x.ino()) == (y.dev(), y.ino()),
        _ => false,
    }
}

/// The `nccl*` symbols of `lib`'s 8-byte GOT/PLT/absolute relocations, by `readelf -rW`.
fn readelf_nccl_slots(lib: &Path) -> BTreeSet<String> {
    let out = std::process::Command::new("readelf")
        .arg("-rW")
        .arg(lib)
        .output()
        .expect("readelf runs");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let ty = *f.get(2)?;
            let name = *f.get(4)?;
            let slot = ty.ends_with("_GLOB_DAT")
                || ty.ends_with("_JUMP_SLOT")
                || ty == "R_X86_64_64"
                || ty == "R_AARCH64_ABS64";
            let name = name.split('@').next()?;
            (slot && (name.starts_with("nccl") || name.starts_with("pnccl")))
                .then(|| name.to_string())
        })
        .collect()
}

/// A `sitecustomize.py` in a fresh directory that writes `marker` when Python starts:
/// put on `PYTHONPATH`, it says whether anything ran.
fn marker_site(marker: &Path) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("sitecustomize.py"),
        format!("open({:?}, 'w').write('ran')\n", marker.to_str().unwrap()),
    )
    .unwrap();
    d
}

fn assert_all_reach(w: &fdl::loader::pywitness::PythonWitness, file: &Path) {
    let m = w.most_reached().expect("a file is reached");
    assert!(m.unanimous(), "{:#?}", w.calls);
    assert!(
        same_file(m.file, file),
        "calls reach {}, expected {}",
        m.file.display(),
        file.display()
    );
    assert!(
        w.mapped_nccl.iter().any(|p| same_file(p, file)),
        "{:?}",
        w.mapped_nccl
    );
}

/// A plain venv: torch's own NCCL from the venv answers, every slot bound to it; the
/// slots are those readelf lists; the marker shows the child ran Python's startup.
#[test]
#[ignore = "needs the torch venv: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn a_plain_venv_calls_its_own_nccl() {
    let v = venv();
    let cwd = tempfile::tempdir().unwrap();
    let marker = cwd.path().join("ran");
    let site = marker_site(&marker);
    let launch = v.launch(cwd.path(), &[("PYTHONPATH", site.path().into())]);
    let t = Instant::now();
    let w = ask_python(&launch, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{} ({:?})", w.summary(), t.elapsed());
    for l in w.detail() {
        eprintln!("  {l}");
    }
    assert!(marker.exists(), "the control marker was written");
    assert_all_reach(&w, &v.nccl());
    let lib = w.libtorch_cuda.clone().expect("libtorch_cuda.so is mapped");
    assert!(same_file(&lib, &v.torch().join("lib/libtorch_cuda.so")));
    let read: BTreeSet<String> = w.calls.iter().map(|c| c.symbol.clone()).collect();
    assert_eq!(read, readelf_nccl_slots(&lib));
    // Python loads extension modules with RTLD_NOW: every slot is bound at import.
    assert!(w
        .calls
        .iter()
        .all(|c| matches!(c.reach, Reach::File { .. })));
    assert!(w.summary().contains("imported torch"));
    assert!(w.summary().contains("no GPU touched"));
}

/// A `PYTHONPATH` entry holding `nvidia/nccl/lib/libnccl.so.2` comes before the venv's
/// site-packages on `sys.path`: torch's `__init__.py` loads that copy, and the calls
/// reach it.
#[test]
#[ignore = "needs the torch venv: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn a_pythonpath_nccl_wins() {
    let v = venv();
    let other = oracle_input("FDL_TEST_NCCL_LIB_CU13_NEWEST");
    let d = tempfile::tempdir().unwrap();
    let lib_dir = d.path().join("nvidia/nccl/lib");
    std::fs::create_dir_all(&lib_dir).unwrap();
    let planted = lib_dir.join("libnccl.so.2");
    std::fs::copy(&other, &planted).unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let launch = v.launch(cwd.path(), &[("PYTHONPATH", d.path().into())]);
    let w = ask_python(&launch, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{}", w.summary());
    assert_all_reach(&w, &planted);
    assert!(!w.mapped_nccl.iter().any(|p| same_file(p, &v.nccl())));
}

/// A preloaded NCCL comes first in the global scope: the calls reach it.
#[test]
#[ignore = "needs the torch venv: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn a_preloaded_nccl_wins() {
    let v = venv();
    let other = oracle_input("FDL_TEST_NCCL_LIB_CU13_NEWEST");
    let cwd = tempfile::tempdir().unwrap();
    let launch = v.launch(cwd.path(), &[("LD_PRELOAD", other.clone().into())]);
    let w = ask_python(&launch, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{}", w.summary());
    assert_all_reach(&w, &other);
}

/// A directory others may write, on the interpreter's path or torch's, is refused before
/// anything runs (the marker's `sitecustomize` never runs).
#[test]
#[ignore = "needs the torch venv: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn a_writable_directory_is_refused_before_anything_runs() {
    let v = venv();
    let cwd = tempfile::tempdir().unwrap();
    let marker = cwd.path().join("ran");
    let site = marker_site(&marker);
    let open = tempfile::tempdir().unwrap();
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o775)).unwrap();
    std::os::unix::fs::symlink(v.python(), open.path().join("python")).unwrap();
    std::os::unix::fs::symlink(v.torch(), open.path().join("torch")).unwrap();
    let base = v.launch(cwd.path(), &[("PYTHONPATH", site.path().into())]);

    let mut launch = base.clone();
    launch.interpreter = open.path().join("python");
    let e = ask_python(&launch, &Limits::default()).unwrap_err();
    assert!(
        matches!(&e, NoPythonWitness::Untrusted { path, .. } if path == open.path()),
        "{e:?}"
    );
    assert!(e.refused());
    assert!(e.to_string().contains("writable by others"), "{e}");

    let mut launch = base.clone();
    launch.torch_dir = open.path().join("torch");
    let e = ask_python(&launch, &Limits::default()).unwrap_err();
    assert!(
        matches!(&e, NoPythonWitness::Untrusted { path, .. } if path == open.path()),
        "{e:?}"
    );
    assert!(!marker.exists(), "nothing ran");
}

/// A `torch` on `PYTHONPATH` that is not the checked one is refused before its code runs;
/// the checked torch whose import fails says so with the child's stderr.
#[test]
#[ignore = "needs the torch venv: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn another_torch_is_refused_and_a_failed_import_is_said() {
    let v = venv();
    let cwd = tempfile::tempdir().unwrap();
    let d = tempfile::tempdir().unwrap();
    let marker = cwd.path().join("fake-ran");
    std::fs::create_dir(d.path().join("torch")).unwrap();
    std::fs::write(
        d.path().join("torch/__init__.py"),
        format!(
            "open({:?}, 'w').write('ran')\nraise ImportError('fake torch')\n",
            marker.to_str().unwrap()
        ),
    )
    .unwrap();
    let launch = v.launch(cwd.path(), &[("PYTHONPATH", d.path().into())]);
    let e = ask_python(&launch, &Limits::default()).unwrap_err();
    match &e {
        NoPythonWitness::OtherTorch { found } => assert!(found.contains("torch"), "{found}"),
        other => panic!("{other:?}"),
    }
    assert!(!marker.exists(), "the fake torch never ran");

    // torch imports typing_extensions first thing: a planted one that fails fails it.
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("typing_extensions.py"),
        "raise ImportError('planted failure \\x1b[2J')\n",
    )
    .unwrap();
    let launch = v.launch(cwd.path(), &[("PYTHONPATH", d.path().into())]);
    let e = ask_python(&launch, &Limits::default()).unwrap_err();
    match &e {
        NoPythonWitness::ImportFailed { stderr_tail, .. } => {
            assert!(stderr_tail.contains("planted failure"), "{stderr_tail}");
            assert!(!stderr_tail.contains('\x1b'), "{stderr_tail}");
        }
        other => panic!("{other:?}"),
    }
}

/// A startup that hangs is killed at the time limit, and no process is left behind.
#[test]
#[ignore = "needs the torch venv: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn a_hang_is_killed_and_nothing_is_left() {
    let v = venv();
    let cwd = tempfile::tempdir().unwrap();
    let d = tempfile::tempdir().unwrap();
    let pid_file = d.path().join("pid");
    std::fs::write(
        d.path().join("sitecustomize.py"),
        format!(
            "import os, time, subprocess\n\
             kid = subprocess.Popen(['sleep', '600'])\n\
             open({:?}, 'w').write('%d %d' % (os.getpid(), kid.pid))\n\
             time.sleep(600)\n",
            pid_file.to_str().unwrap()
        ),
    )
    .unwrap();
    let launch = v.launch(cwd.path(), &[("PYTHONPATH", d.path().into())]);
    let limits = Limits {
        time: Duration::from_secs(3),
        ..Limits::default()
    };
    let t = Instant::now();
    let e = ask_python(&launch, &limits).unwrap_err();
    assert!(matches!(e, NoPythonWitness::TimedOut { .. }), "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    let pids = std::fs::read_to_string(&pid_file).expect("the hang started");
    let pids: Vec<&str> = pids.split_whitespace().collect();
    // The interpreter is fdl's child and reaped: gone at once.
    assert!(
        !Path::new(&format!("/proc/{}", pids[0])).exists(),
        "the interpreter {} is left behind",
        pids[0]
    );
    // Its own child was killed with the group; the init process that inherits it reaps
    // it in its own time, so only a dead one (a zombie) may linger a moment.
    let grandchild = Path::new("/proc").join(pids[1]).join("stat");
    let until = Instant::now() + Duration::from_secs(3);
    while let Ok(stat) = std::fs::read_to_string(&grandchild) {
        let state = stat.rsplit(')').next().unwrap_or("").trim_start();
        if state.starts_with('Z') || Instant::now() > until {
            assert!(state.starts_with('Z'), "{} still runs: {stat}", pids[1]);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A child that passes the address-space bound fails with a typed answer, not a hang.
#[test]
#[ignore = "needs the torch venv: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn the_memory_bound_stops_the_import() {
    let v = venv();
    let cwd = tempfile::tempdir().unwrap();
    let launch = v.launch(cwd.path(), &[]);
    let limits = Limits {
        memory: 512 << 20,
        ..Limits::default()
    };
    let e = ask_python(&launch, &limits).unwrap_err();
    eprintln!("{e}");
    assert!(
        matches!(
            e,
            NoPythonWitness::ImportFailed { .. } | NoPythonWitness::Died { .. }
        ),
        "{e:?}"
    );
}
