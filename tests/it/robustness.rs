//! fdl at the edges of a Unix process's life: a closed stdout, Ctrl-C or SIGTERM while
//! it waits on a tool that hangs, a tool that never answers, and files given as flags
//! that are not files.

use crate::common;
use common::*;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A stand-in nvidia-smi that hangs, as one on a wedged driver does.
fn hanging_nvidia_smi() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("nvidia-smi");
    std::fs::write(&script, "#!/bin/sh\nexec sleep 120\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    dir
}

/// A closed stdout ends fdl quietly (SIGPIPE, as for any Unix tool), never a panic.
#[test]
fn a_closed_stdout_ends_fdl_quietly() {
    let p = ProjectFixture::empty();
    for args in [
        &["completions", "bash"][..],
        &["nccl", "dockerfile"],
        &["nccl", "list"],
    ] {
        let mut child = Command::new(assert_cmd::cargo::cargo_bin("fdl"))
            .arg("--root")
            .arg(p.root())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // the reader is gone before fdl writes
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        let status = child.wait().unwrap();
        assert!(
            status.success() || status.signal() == Some(libc::SIGPIPE),
            "{args:?}: {status:?}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// Ctrl-C and SIGTERM end fdl within a second even while it waits on a hung tool.
#[test]
fn interrupts_end_fdl_within_a_second_anywhere() {
    let smi = hanging_nvidia_smi();
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let mut child = Command::new(assert_cmd::cargo::cargo_bin("fdl"))
            .arg("gpus")
            .env("PATH", path_with(smi.path()))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
        let sent = Instant::now();
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        let deadline = sent + Duration::from_secs(5);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "fdl ignored signal {signal}");
            std::thread::sleep(Duration::from_millis(20));
        };
        let took = sent.elapsed();
        assert_eq!(status.code(), Some(130), "signal {signal}");
        assert!(
            took < Duration::from_secs(1),
            "signal {signal}: took {took:?}"
        );
    }
}

/// A hung nvidia-smi is stopped after its timeout and named, not waited on forever.
#[test]
fn a_hung_nvidia_smi_is_named_not_waited_on() {
    let smi = hanging_nvidia_smi();
    let start = Instant::now();
    let out = Command::new(assert_cmd::cargo::cargo_bin("fdl"))
        .arg("gpus")
        .env("PATH", path_with(smi.path()))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nvidia-smi did not answer within"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(30));
}

/// --dockerfile must be a regular file of sane size: a FIFO would hang the read and
/// /dev/zero would fill memory.
#[test]
fn flag_files_that_are_not_files_are_refused_at_once() {
    let p = ProjectFixture::empty();
    let fifo = p.root().join("Dockerfile.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let dry_run_with = |dockerfile: &std::path::Path| {
        let mut cmd = fdl_in(p.root());
        cmd.args([
            "nccl",
            "build",
            "--tag",
            "v2.27.5-1",
            "--archs",
            "8.6",
            "--dry-run",
        ])
        .args(["--backend", "docker", "--dockerfile"])
        .arg(dockerfile)
        .timeout(Duration::from_secs(20));
        cmd
    };
    for file in [fifo.as_path(), std::path::Path::new("/dev/zero"), p.root()] {
        let start = Instant::now();
        let out = dry_run_with(file).output().unwrap();
        assert!(!out.status.success(), "{}", file.display());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("is not a regular file"),
            "{}: {err}",
            file.display()
        );
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{}",
            file.display()
        );
    }
    let big = p.root().join("Dockerfile.big");
    std::fs::write(&big, vec![b'#'; 2 << 20]).unwrap();
    dry_run_with(&big)
        .assert()
        .failure()
        .stderr(predicates::str::contains("far more than any Dockerfile"));
}

/// A stdout that refuses writes (a full disk: `> /dev/full`) ends fdl with a clear error
/// and exit 1, never a panic; the command's output is not silently lost.
#[test]
fn a_full_stdout_is_an_error_not_a_panic() {
    let p = ProjectFixture::empty();
    let lib = p.root().join("libnccl.so.2");
    compile_shared(
        &nccl_like_source((2, 27, 5), "12.8"),
        &lib,
        &["-Wl,-soname,libnccl.so.2"],
    );
    let lib = lib.to_str().unwrap().to_string();
    for args in [
        &["inspect", lib.as_str()][..],
        &["inspect", lib.as_str(), "--json"],
        &["nccl", "dockerfile"],
        &["completions", "bash"],
        &["nccl", "list"],
    ] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = Command::new(assert_cmd::cargo::cargo_bin("fdl"))
            .arg("--root")
            .arg(p.root())
            .args(args)
            .stdout(full)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(
            err.contains("cannot write the output to stdout") && err.contains("No space left"),
            "{args:?}: {err}"
        );
    }
}

/// A library's own strings (here a SONAME with an escape sequence and a newline) are
/// printed escaped by `fdl inspect`: no terminal control, no forged line.
#[test]
fn a_librarys_strings_are_printed_escaped() {
    let p = ProjectFixture::empty();
    let lib = p.root().join("libodd.so");
    compile_shared(
        &nccl_like_source((2, 27, 5), "12.8"),
        &lib,
        &["-Wl,-soname,lib\u{1b}]0;pwned\u{7}\nnccl     2.99.9 (forged).so"],
    );
    let out = Command::new(assert_cmd::cargo::cargo_bin("fdl"))
        .arg("inspect")
        .arg(&lib)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("soname   lib\\u{1b}]0;pwned\\u{7}\\u{a}nccl     2.99.9 (forged).so"),
        "{text}"
    );
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "{text:?}"
    );
    assert!(!text.contains("\nnccl     2.99.9"), "{text}");
}

/// A colour sequence in a name that came from a file (a `DT_NEEDED` entry here) does not
/// reach the terminal as one: the old filter let `ESC [ … m` through as if it were
/// fdl's own colour. Neither `inspect` nor `nccl detect` (whose "unknown:" line names
/// the missing library) prints an escape character, on stdout or stderr.
#[test]
fn a_colour_sequence_in_a_needed_name_stays_text() {
    let p = ProjectFixture::empty();
    let dep = p.root().join("libdep.so");
    compile_shared(
        "int dep_fn(void) { return 1; }\n",
        &dep,
        &["-Wl,-soname,libx\u{1b}[31mred\u{1b}[0m\u{1b}[2J.so"],
    );
    let user = p.root().join("libuser.so");
    compile_shared(
        "int dep_fn(void); int user_fn(void) { return dep_fn(); }\n",
        &user,
        &["-Wl,--no-as-needed", dep.to_str().unwrap()],
    );
    std::fs::remove_file(&dep).unwrap();
    for args in [&["inspect"][..], &["nccl", "detect"][..]] {
        let out = Command::new(assert_cmd::cargo::cargo_bin("fdl"))
            .args(args)
            .arg(&user)
            .env("LD_LIBRARY_PATH", "")
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            stdout.contains("libx\\u{1b}[31mred") || stderr.contains("libx\\u{1b}[31mred"),
            "{args:?} does not name the library:\n{stdout}\n{stderr}"
        );
        assert!(
            !stdout.contains('\u{1b}') && !stderr.contains('\u{1b}'),
            "{args:?}: {stdout:?}\n{stderr:?}"
        );
    }
}
