//! `fdl ps` against real running processes, no GPU: `python -c 'import torch'` of the
//! oracle torch (its own NCCL, a preloaded copy beside it, another NCCL on sys.path), C
//! programs that dlopen real `libnccl.so.2` files, a process whose NCCL was replaced or
//! deleted after it mapped it, and processes of another user. Each answer is held against
//! what the process finds from inside: the probe's own reading of libtorch_cuda.so's GOT
//! (tests/support/torch_probe.py), or the C program's `ncclGetVersion` and `dladdr`.
//! The tests run as root, who may read any process's memory: the answer without memory is
//! asked for with `--no-memory`, and an unprivileged user (uid 65534, through `setpriv`)
//! reads its own processes and is refused another user's.

use crate::common;
use common::torch_process::*;
use common::{fdl, oracle_input};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn torch215() -> PathBuf {
    oracle_input("FDL_TEST_TORCH_VENV")
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

/// `fdl ps --pid PID --json [extra]`, checked against its schema: (exit code, object).
fn ps_json(pid: u32, extra: &[&str]) -> (i32, Value) {
    let out = fdl()
        .args(["ps", "--pid", &pid.to_string(), "--json"])
        .args(extra)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not one JSON object ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let errors = common::schema::validate_against("ps", &v);
    assert!(errors.is_empty(), "{}\n{v:#}", errors.join("\n"));
    (out.status.code().unwrap_or(-1), v)
}

/// The one process of a `ps --pid` answer.
fn the_process(v: &Value) -> &Value {
    let ps = v["processes"].as_array().unwrap();
    assert_eq!(ps.len(), 1, "{v:#}");
    &ps[0]
}

/// The path the calls reach, and the evidence's kind.
fn reached(p: &Value) -> (String, String) {
    assert_eq!(p["reach"]["answer"], "one", "{p:#}");
    (
        p["reach"]["target"]["path"].as_str().unwrap().to_string(),
        p["reach"]["evidence"]["evidence"]
            .as_str()
            .unwrap()
            .to_string(),
    )
}

fn mapped_paths(p: &Value) -> std::collections::BTreeSet<String> {
    p["nccl"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap().to_string())
        .collect()
}

fn nccl_entry<'a>(p: &'a Value, path: &str) -> &'a Value {
    p["nccl"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["path"] == path)
        .unwrap_or_else(|| panic!("{path} is not among the mapped NCCLs: {p:#}"))
}

/// "2.30.7" for 23007 (NCCL ≥ 2.9's code: major×10000 + minor×100 + patch).
fn version_of_code(code: u32) -> String {
    format!("{}.{}.{}", code / 10000, code / 100 % 100, code % 100)
}

/// fdl's answer for a held probe, from memory and then without it, both against the
/// probe's own reading of its GOT: the file reached, the NCCLs mapped, their versions.
/// Returns the answer from memory.
fn fdl_agrees_with_probe(held: &HeldProbe) -> Value {
    let truth = &held.truth;
    assert_eq!(truth.import_error, None, "{truth}");
    let want = truth.reached().to_string();
    let (code, v) = ps_json(held.pid(), &[]);
    assert_eq!(code, 0, "{v:#}");
    let p = the_process(&v).clone();
    assert_eq!(
        reached(&p),
        (want.clone(), "memory".into()),
        "{truth}\n{p:#}"
    );
    assert_eq!(mapped_paths(&p), truth.mapped_set(), "{truth}\n{p:#}");
    for (path, code) in &truth.nccl_versions {
        assert_eq!(
            nccl_entry(&p, path)["version"],
            version_of_code(*code),
            "{path}"
        );
    }
    assert_eq!(
        p["reach"]["evidence"]["bound"].as_u64().unwrap() as usize,
        truth.calls_reach.len(),
        "every slot the probe read is bound, in fdl's reading too: {p:#}"
    );
    let (_, model) = ps_json(held.pid(), &["--no-memory"]);
    let m = the_process(&model);
    assert_eq!(reached(m), (want, "model".into()), "{truth}\n{m:#}");
    p
}

#[test]
#[ignore = "needs the oracle wheels: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn a_torch_process_reaches_its_wheels_nccl_as_its_got_says() {
    let venv = torch215();
    let cwd = tempfile::tempdir().unwrap();
    let held = hold_probe(
        &Launch::new(&venv, cwd.path())
            .set("RANK", "3")
            .set("LOCAL_RANK", "1")
            .set("NCCL_SOCKET_IFNAME", "lo"),
    );
    let p = fdl_agrees_with_probe(&held);
    let wheel = site_packages(&venv).join("nvidia/nccl/lib/libnccl.so.2");
    assert_eq!(reached(&p).0, s(&wheel));
    assert_eq!(p["rank"]["value"], 3);
    assert_eq!(p["rank"]["variable"], "RANK");
    assert_eq!(p["local_rank"]["value"], 1);
    assert!(
        p["settings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["name"] == "NCCL_SOCKET_IFNAME" && s["value"] == "lo"),
        "{p:#}"
    );
    assert_eq!(
        p["reach"]["evidence"]["caller"]
            .as_str()
            .unwrap()
            .rsplit('/')
            .next(),
        Some("libtorch_cuda.so")
    );
    // The digest is the file's.
    let digest = blake3::hash(&std::fs::read(&wheel).unwrap())
        .to_hex()
        .to_string();
    assert_eq!(nccl_entry(&p, &s(&wheel))["blake3"], digest);
    assert_eq!(nccl_entry(&p, &s(&wheel))["disk"], "same");

    // The text says the same, and a listing of every process of this user holds it.
    let out = fdl()
        .args(["ps", "--pid", &held.pid().to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("calls reach  NCCL 2.30.7"), "{text}");
    assert!(
        text.contains("rank 3 (RANK), local 1 (LOCAL_RANK)"),
        "{text}"
    );
    assert!(text.contains("read from memory"), "{text}");
    assert!(text.contains(&s(&wheel)), "{text}");
    assert!(
        text.lines()
            .all(|l| l.chars().count() <= 100 || l.trim_start().starts_with('/')),
        "{text}"
    );
    let all = fdl().args(["ps", "--json"]).output().unwrap();
    let v: Value = serde_json::from_slice(&all.stdout).unwrap();
    assert!(
        v["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["pid"] == held.pid()),
        "{v:#}"
    );
}

/// A copy of the wheel's NCCL in LD_PRELOAD: torch still opens its wheel's file by path,
/// so two NCCLs are mapped; the preload, first in the global scope, answers every call.
#[test]
#[ignore = "needs the oracle wheels: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn a_preloaded_nccl_is_reached_while_torch_maps_its_own_too() {
    let venv = torch215();
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("libnccl.so.2");
    std::fs::copy(
        site_packages(&venv).join("nvidia/nccl/lib/libnccl.so.2"),
        &copy,
    )
    .unwrap();
    let held = hold_probe(&Launch::new(&venv, dir.path()).set("LD_PRELOAD", &copy));
    assert_eq!(held.truth.mapped_nccl.len(), 2, "{}", held.truth);
    let p = fdl_agrees_with_probe(&held);
    assert_eq!(reached(&p).0, s(&copy));
    assert_eq!(nccl_entry(&p, &s(&copy))["preloaded"], true);
    let (_, model) = ps_json(held.pid(), &["--no-memory"]);
    assert_eq!(
        the_process(&model)["reach"]["evidence"]["rule"]["rule"],
        "preloaded"
    );
}

/// An NCCL wheel directory on PYTHONPATH: torch preloads that one, and only it is mapped.
#[test]
#[ignore = "needs the oracle wheels: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn another_nccl_on_sys_path_is_the_one_reached() {
    let venv = torch215();
    let (dir, cwd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let wheel = nccl_wheel_dir(dir.path(), &oracle_input("FDL_TEST_NCCL_LIB_CU13_NEWEST"));
    let held = hold_probe(&Launch::new(&venv, cwd.path()).set("PYTHONPATH", &wheel));
    let p = fdl_agrees_with_probe(&held);
    let copy = s(&wheel.join("nvidia/nccl/lib/libnccl.so.2"));
    assert_eq!(reached(&p).0, copy);
    assert_eq!(nccl_entry(&p, &copy)["version"], "2.32.3");
}

/// C source of a program that dlopens each library named on its command line
/// (RTLD_LOCAL), prints for each `ncclGetVersion` and the file `dladdr` places it in, one
/// line each, then waits for its stdin to close.
const DLOPEN_SOURCE: &str = r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    void *h = dlopen(argv[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    int (*get)(int *) = (int (*)(int *))dlsym(h, "ncclGetVersion");
    int v = 0; Dl_info info;
    if (!get || get(&v) != 0 || !dladdr((void *)get, &info)) return 2;
    printf("%d %s\n", v, info.dli_fname);
  }
  fflush(stdout);
  while (getchar() != EOF) {}
  return 0;
}
"#;

/// C source of a program that dlopens one library (RTLD_LOCAL) and prints the
/// `ncclGetVersion` a call by name from the global scope reaches (a preload's), else the
/// library's own, with the file `dladdr` places it in; then waits for its stdin to close.
const GLOBAL_SCOPE_SOURCE: &str = r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
  int (*get)(int *) = (int (*)(int *))dlsym(RTLD_DEFAULT, "ncclGetVersion");
  if (!get) get = (int (*)(int *))dlsym(h, "ncclGetVersion");
  int v = 0; Dl_info info;
  if (!get || get(&v) != 0 || !dladdr((void *)get, &info)) return 2;
  printf("%d %s\n", v, info.dli_fname);
  fflush(stdout);
  while (getchar() != EOF) {}
  return 0;
}
"#;

/// torch 1.13.1's split build links NCCL 2.14.3 into `libtorch_cuda_cpp.so` and exports
/// it: a process that loads it runs that copy, its own slots bound to itself; with NCCL
/// 2.21.5 in LD_PRELOAD the same slots are bound to the preload.
#[test]
#[ignore = "needs the oracle wheels: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn torch113s_linked_in_nccl_and_a_preload_over_it() {
    let lib = oracle_input("FDL_TEST_TORCH113_LIB").join("libtorch_cuda_cpp.so");
    let preload = oracle_input("FDL_TEST_NCCL_LIB_2215");
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("g.c");
    std::fs::write(&src, GLOBAL_SCOPE_SOURCE).unwrap();
    let prog = dir.path().join("g");
    assert!(Command::new("cc")
        .arg("-o")
        .arg(&prog)
        .arg(&src)
        .arg("-ldl")
        .status()
        .unwrap()
        .success());
    let own = hold_dlopen(&mut Command::new(&prog), &[&lib]);
    assert_eq!(own.inside[0], (21403, s(&lib)));
    let (_, v) = ps_json(own.child.id(), &[]);
    let p = the_process(&v);
    assert_eq!(reached(p), (s(&lib), "memory".into()), "{p:#}");
    assert_eq!(nccl_entry(p, &s(&lib))["kind"], "in_libtorch");
    assert_eq!(nccl_entry(p, &s(&lib))["version"], "2.14.3");

    let over = hold_dlopen(Command::new(&prog).env("LD_PRELOAD", &preload), &[&lib]);
    assert_eq!(over.inside[0], (22105, s(&preload)));
    let (_, v) = ps_json(over.child.id(), &[]);
    let p = the_process(&v);
    assert_eq!(reached(p), (s(&preload), "memory".into()), "{p:#}");
    assert_eq!(mapped_paths(p).len(), 2, "{p:#}");
    let (_, v) = ps_json(over.child.id(), &["--no-memory"]);
    assert_eq!(reached(the_process(&v)), (s(&preload), "model".into()));
}

/// The dlopen program, compiled into `dir` (readable and runnable by any user).
fn dlopen_program(dir: &Path) -> PathBuf {
    let src = dir.join("dl.c");
    std::fs::write(&src, DLOPEN_SOURCE).unwrap();
    let out = dir.join("dl");
    let status = Command::new("cc")
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .arg("-ldl")
        .status()
        .expect("cc");
    assert!(status.success());
    out
}

/// A running dlopen program and what it said from inside: (version code, file) per library.
struct Held {
    child: Child,
    inside: Vec<(u32, String)>,
}

impl Drop for Held {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn hold_dlopen(cmd: &mut Command, libs: &[&Path]) -> Held {
    let mut child = cmd
        .args(libs)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // A file's name need not be UTF-8: read as bytes, shown as fdl shows it (lossy).
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let inside = libs
        .iter()
        .map(|_| {
            let mut line = Vec::new();
            out.read_until(b'\n', &mut line).unwrap();
            let l = String::from_utf8_lossy(&line).trim_end().to_string();
            assert!(!l.is_empty(), "the program answered");
            let (code, file) = l.split_once(' ').unwrap();
            (code.parse().unwrap(), file.to_string())
        })
        .collect();
    Held { child, inside }
}

/// A directory any user may enter, with a copy of `lib` in it.
fn open_dir_with(lib: &Path) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = dir.path().join("libnccl.so.2");
    std::fs::copy(lib, &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644)).unwrap();
    (dir, copy)
}

#[test]
#[ignore = "needs the oracle wheels: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn a_program_that_dlopens_nccl_runs_the_file_it_opened() {
    let (dir, copy) = open_dir_with(&oracle_input("FDL_TEST_NCCL_LIB"));
    let prog = dlopen_program(dir.path());
    let held = hold_dlopen(&mut Command::new(&prog), &[&copy]);
    let (code, file) = held.inside[0].clone();
    let (rc, v) = ps_json(held.child.id(), &[]);
    assert_eq!(rc, 0);
    let p = the_process(&v);
    // dlsym, not a GOT: the model answers, and says why.
    assert_eq!(reached(p), (file.clone(), "model".into()), "{p:#}");
    assert_eq!(p["reach"]["evidence"]["rule"]["rule"], "only_one");
    assert!(p["reach"]["evidence"]["memory"]
        .as_str()
        .unwrap()
        .contains("dlsym"));
    assert_eq!(nccl_entry(p, &file)["version"], version_of_code(code));
}

/// Two NCCLs opened side by side and called through dlsym: no slot and no loader rule
/// says which one "the calls" reach, so the answer is unknown (exit 3), never a guess.
#[test]
#[ignore = "needs the oracle wheels: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn two_nccls_without_a_rule_between_them_are_unknown() {
    let (dir, a) = open_dir_with(&oracle_input("FDL_TEST_NCCL_LIB"));
    let b = dir.path().join("other/libnccl.so.2");
    std::fs::create_dir(dir.path().join("other")).unwrap();
    std::fs::copy(oracle_input("FDL_TEST_NCCL_LIB_CU13"), &b).unwrap();
    let prog = dlopen_program(dir.path());
    let held = hold_dlopen(&mut Command::new(&prog), &[&a, &b]);
    let (rc, v) = ps_json(held.child.id(), &[]);
    let p = the_process(&v);
    assert_eq!(p["reach"]["answer"], "unknown", "{p:#}");
    assert_eq!(rc, 0, "no rank: the verdict is the process's own answer");
    for (code, file) in &held.inside {
        assert_eq!(nccl_entry(p, file)["version"], version_of_code(*code));
    }
    // With a rank, the unknown answer decides the verdict: exit 3.
    let held = hold_dlopen(Command::new(&prog).env("RANK", "0"), &[&a, &b]);
    let (rc, v) = ps_json(held.child.id(), &[]);
    assert_eq!(rc, 3, "{v:#}");
    assert_eq!(v["ranks"]["verdict"], "unknown");
}

/// The NCCL file written in place, replaced (renamed over) and then deleted after the
/// process mapped it:
/// marked each time, and still read as the process maps it (root reads it through
/// /proc/PID/map_files).
#[test]
#[ignore = "needs the oracle wheels: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn a_replaced_or_deleted_nccl_is_marked_and_read_as_mapped() {
    let (dir, copy) = open_dir_with(&oracle_input("FDL_TEST_NCCL_LIB"));
    let digest = blake3::hash(&std::fs::read(&copy).unwrap())
        .to_hex()
        .to_string();
    let prog = dlopen_program(dir.path());
    let held = hold_dlopen(&mut Command::new(&prog), &[&copy]);
    let (_, v) = ps_json(held.child.id(), &[]);
    assert_eq!(nccl_entry(the_process(&v), &s(&copy))["disk"], "same");
    // Written in place (the same bytes, so the idle process is safe) a second after it
    // started: the same inode, a later mtime.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&copy).unwrap();
        f.write_all_at(b"\x7fELF", 0).unwrap();
    }
    let (_, v) = ps_json(held.child.id(), &[]);
    assert_eq!(nccl_entry(the_process(&v), &s(&copy))["disk"], "modified");
    let new = dir.path().join("new.so");
    std::fs::copy(oracle_input("FDL_TEST_NCCL_LIB_CU13"), &new).unwrap();
    std::fs::rename(&new, &copy).unwrap();
    let (_, v) = ps_json(held.child.id(), &[]);
    let n = nccl_entry(the_process(&v), &s(&copy)).clone();
    assert_eq!(n["disk"], "replaced", "{n:#}");
    assert_eq!(n["version"], version_of_code(held.inside[0].0));
    assert_eq!(n["blake3"], digest);
    let text = fdl()
        .args(["ps", "--pid", &held.child.id().to_string()])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("REPLACED on disk since it was mapped"));
    std::fs::remove_file(&copy).unwrap();
    let (_, v) = ps_json(held.child.id(), &[]);
    assert_eq!(nccl_entry(the_process(&v), &s(&copy))["disk"], "deleted");
}

/// A mapped file whose name is not UTF-8 (any process may map one): the answer still
/// comes, the name shown with U+FFFD where its bytes are not UTF-8.
#[test]
#[ignore = "needs the oracle wheels: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn a_path_that_is_not_utf8_is_shown_not_fatal() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join(std::ffi::OsStr::from_bytes(b"odd\xffname"));
    std::fs::create_dir(&odd).unwrap();
    let lib = odd.join("libnccl.so.2");
    let real = oracle_input("FDL_TEST_NCCL_LIB");
    if std::fs::hard_link(&real, &lib).is_err() {
        std::fs::copy(&real, &lib).unwrap();
    }
    let prog = dlopen_program(dir.path());
    let held = hold_dlopen(&mut Command::new(&prog), &[&lib]);
    let (rc, v) = ps_json(held.child.id(), &[]);
    assert_eq!(rc, 0, "{v:#}");
    let p = the_process(&v);
    let shown = lib.to_string_lossy().into_owned();
    assert!(shown.contains('\u{fffd}'));
    assert_eq!(reached(p).0, shown, "{p:#}");
    assert_eq!(
        nccl_entry(p, &shown)["version"],
        version_of_code(held.inside[0].0)
    );
    let text = fdl()
        .args(["ps", "--pid", &held.child.id().to_string()])
        .output()
        .unwrap();
    assert!(
        text.status.success(),
        "{}",
        String::from_utf8_lossy(&text.stderr)
    );
}

/// uid 65534 runs fdl from a copy any user may run.
fn as_nobody(fdl_dir: &Path) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(fdl_dir.join("fdl"))
        .env_remove("FDL_ROOT")
        .env("HOME", fdl_dir);
    cmd
}

fn fdl_for_anyone() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_fdl"), dir.path().join("fdl")).unwrap();
    std::fs::set_permissions(
        dir.path().join("fdl"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    dir
}

/// An unprivileged user: refused another user's process with a clear line (exit 1);
/// answers for its own, and where the file it maps was replaced, says that only root can
/// read it now.
#[test]
#[ignore = "needs the oracle wheels: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn an_unprivileged_user_reads_its_own_processes_and_is_refused_others() {
    let bin = fdl_for_anyone();
    let (dir, copy) = open_dir_with(&oracle_input("FDL_TEST_NCCL_LIB"));
    let prog = dlopen_program(dir.path());
    // root's process, asked about by uid 65534.
    let roots = hold_dlopen(&mut Command::new(&prog), &[&copy]);
    let out = as_nobody(bin.path())
        .args(["ps", "--pid", &roots.child.id().to_string()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("belongs to user 0") && err.contains("run fdl as that user"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    // Its own process.
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&prog);
    let own = hold_dlopen(&mut cmd, &[&copy]);
    let out = as_nobody(bin.path())
        .args(["ps", "--pid", &own.child.id().to_string(), "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = the_process(&v);
    assert_eq!(reached(p).0, own.inside[0].1);
    assert_eq!(
        nccl_entry(p, &s(&copy))["version"],
        version_of_code(own.inside[0].0)
    );
    // Replaced: the process still runs the old bytes, which only root may read now.
    let new = dir.path().join("new.so");
    std::fs::copy(oracle_input("FDL_TEST_NCCL_LIB_CU13"), &new).unwrap();
    std::fs::rename(&new, &copy).unwrap();
    let out = as_nobody(bin.path())
        .args(["ps", "--pid", &own.child.id().to_string(), "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let n = nccl_entry(the_process(&v), &s(&copy)).clone();
    assert_eq!(n["disk"], "replaced", "{n:#}");
    assert_eq!(n["version"], Value::Null, "{n:#}");
    assert!(n["unread"].as_str().unwrap().contains("only root"), "{n:#}");
}
