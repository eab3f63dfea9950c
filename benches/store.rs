//! A build-store hit against `cp -a` of the same build directory.
//!
//! The build is a released NCCL of real size: a stand-in source tree (NCCL's targets
//! and variables) whose `install` puts the NCCL 2.28.9+cuda13.0 library of the PyPI
//! wheel (`FDL_TEST_NCCL_LIB_CU13`, 208 MiB) in place, built natively with the CUDA 13.0
//! nvcc of the wheels (`FDL_TEST_CUDA_HOME`), both from `source .ci/fetch-oracles`. The
//! first project builds it (a miss: it is added to the store). Each timed hit is a whole
//! `fdl nccl build` of the same plan in a fresh project — plan, key, lock, install,
//! digest check, verification (the library loaded in a child), commit — run with a PATH
//! that has no `make`, and with an `nvcc` that records each call: only `--version` and
//! `--list-gpu-arch` may appear, never a compile. The baseline is `cp -a` of the first
//! project's build directory. Prints the medians and their ratio against the 2× target.
//!
//! `cargo bench --bench store` (`FDL_BENCH_RUNS`, default 5); `cargo test` builds it but
//! does not run it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn fail(msg: &str) -> ! {
    eprintln!("store bench: {msg}");
    std::process::exit(1)
}

fn input(var: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => fail(&format!(
            "{var} is not set: this benchmark needs the real NVIDIA inputs. Run `source .ci/fetch-oracles` first"
        )),
    }
}

fn host_tool(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

fn write_exec(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A stand-in NCCL 2.28.9 tree whose install copies `lib` and its header.
fn source_tree(dir: &Path, lib: &Path, header: &Path) {
    std::fs::create_dir_all(dir.join("makefiles")).unwrap();
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(
        dir.join("makefiles/version.mk"),
        "NCCL_MAJOR := 2\nNCCL_MINOR := 28\nNCCL_PATCH := 9\nNCCL_SUFFIX :=\nPKG_REVISION := 1\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("src/README"),
        "stand-in: install copies a released library\n",
    )
    .unwrap();
    let makefile = format!(
        "BUILDDIR ?= build\nPREFIX ?= /usr/local\n\
src.build:\n\t@echo 'Compiling  nothing: the released library is installed as it is'\n\
install: src.build\n\
\tmkdir -p $(PREFIX)/lib/pkgconfig $(PREFIX)/include\n\
\tcp {lib} $(PREFIX)/lib/libnccl.so.2.28.9\n\
\tln -sf libnccl.so.2.28.9 $(PREFIX)/lib/libnccl.so.2\n\
\tln -sf libnccl.so.2 $(PREFIX)/lib/libnccl.so\n\
\tar rc $(PREFIX)/lib/libnccl_static.a\n\
\tcp {header} $(PREFIX)/include/nccl.h\n\
\tprintf 'prefix=$(PREFIX)\\nlibdir=$${{prefix}}/lib\\nincludedir=$${{prefix}}/include\\n\\nName: nccl\\nVersion: 2.28.9\\nLibs: -L$${{libdir}} -lnccl\\n' > $(PREFIX)/lib/pkgconfig/nccl.pc\n\
.PHONY: src.build install\n",
        lib = lib.display(),
        header = header.display()
    );
    std::fs::write(dir.join("Makefile"), makefile).unwrap();
}

/// A CUDA home like `real` whose `bin/nvcc` appends its arguments to `log`, then runs
/// the real one.
fn recording_cuda_home(real: &Path, at: &Path, log: &Path) {
    std::fs::create_dir_all(at.join("bin")).unwrap();
    for e in std::fs::read_dir(real).unwrap().flatten() {
        if e.file_name() != "bin" {
            std::os::unix::fs::symlink(e.path(), at.join(e.file_name())).unwrap();
        }
    }
    for e in std::fs::read_dir(real.join("bin")).unwrap().flatten() {
        if e.file_name() != "nvcc" {
            std::os::unix::fs::symlink(e.path(), at.join("bin").join(e.file_name())).unwrap();
        }
    }
    write_exec(
        &at.join("bin/nvcc"),
        &format!(
            "#!/bin/sh\necho \"$*\" >> '{}'\nexec '{}' \"$@\"\n",
            log.display(),
            real.join("bin/nvcc").display()
        ),
    );
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return; // `cargo test --benches` asks for a list: this bench has no unit tests.
    }
    let runs: usize = std::env::var("FDL_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(5);
    let real_home = input("FDL_TEST_CUDA_HOME");
    let lib = input("FDL_TEST_NCCL_LIB_CU13");
    let header = lib
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("include/nccl.h"))
        .filter(|h| h.is_file())
        .unwrap_or_else(|| fail(&format!("no include/nccl.h beside {}", lib.display())));

    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let tree = work.path().join("nccl");
    source_tree(&tree, &lib, &header);
    let nvcc_log = work.path().join("nvcc-calls");
    let home = work.path().join("cuda");
    recording_cuda_home(&real_home, &home, &nvcc_log);
    // The hits' PATH: what the plan and the key ask for, and no make.
    let no_make = work.path().join("bin");
    std::fs::create_dir_all(&no_make).unwrap();
    for t in ["g++", "c++", "python3", "git", "ar"] {
        if let Some(p) = host_tool(t) {
            std::os::unix::fs::symlink(p, no_make.join(t)).unwrap();
        }
    }
    if host_tool("make").is_none() {
        fail("make is needed for the first (miss) build");
    }

    let build = |root: &Path, path: Option<&Path>| -> (Duration, serde_json::Value) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fdl"));
        cmd.arg("--root")
            .arg(root)
            .args(["nccl", "build", "--backend", "native", "--tag", "v2.28.9-1"])
            .args(["--cuda", "13.0", "--archs", "8.6", "--json", "--cuda-home"])
            .arg(&home)
            .arg("--source")
            .arg(&tree)
            .env("XDG_CACHE_HOME", &cache)
            .env_remove("CUDA_HOME")
            .env_remove("CXX")
            .env_remove("FDL_ROOT");
        if let Some(p) = path {
            cmd.env("PATH", p);
        }
        let start = Instant::now();
        let out = cmd.output().unwrap();
        let took = start.elapsed();
        if !out.status.success() {
            fail(&format!(
                "fdl nccl build failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        (took, serde_json::from_slice(&out.stdout).unwrap())
    };

    let first = tempfile::tempdir_in(work.path()).unwrap();
    let (took, v) = build(first.path(), None);
    if v["status"] != "built" {
        fail(&format!("the first build was not a miss: {v}"));
    }
    let source_dir = PathBuf::from(v["build_dir"].as_str().unwrap());
    let size = fdl::fsread::dir_size(&source_dir);
    eprintln!(
        "miss (make install of the released library, then stored): {:.2} s; build directory {:.0} MiB",
        took.as_secs_f64(),
        size as f64 / (1024.0 * 1024.0)
    );
    let _ = std::fs::remove_file(&nvcc_log);

    let mut hits = Vec::new();
    let mut method = String::new();
    for i in 0..runs {
        let project = tempfile::tempdir_in(work.path()).unwrap();
        let (took, v) = build(project.path(), Some(&no_make));
        if v["status"] != "installed_from_store" {
            fail(&format!("run {i} was not a store hit: {v}"));
        }
        let dir = PathBuf::from(v["build_dir"].as_str().unwrap());
        // A hit is a new file, never the store's or another project's inode.
        let id_of = |d: &Path| {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(d.join("lib/libnccl.so.2.28.9")).unwrap();
            (m.dev(), m.ino())
        };
        if id_of(&dir) == id_of(&source_dir) {
            fail("a hit shares the library's inode with the first project's build");
        }
        method = "reflink or copy".into();
        hits.push(took);
    }
    let calls = std::fs::read_to_string(&nvcc_log).unwrap_or_default();
    let compiles: Vec<&str> = calls
        .lines()
        .filter(|l| *l != "--version" && *l != "--list-gpu-arch")
        .collect();
    if !compiles.is_empty() {
        fail(&format!("a hit ran nvcc to compile: {compiles:?}"));
    }

    let mut copies = Vec::new();
    for _ in 0..runs {
        let dest = tempfile::tempdir_in(work.path()).unwrap();
        let start = Instant::now();
        let ok = Command::new("cp")
            .arg("-a")
            .arg(&source_dir)
            .arg(dest.path().join("copy"))
            .status()
            .unwrap()
            .success();
        copies.push(start.elapsed());
        if !ok {
            fail("cp -a failed");
        }
    }
    let (hit, copy) = (median(hits.clone()), median(copies.clone()));
    let ratio = hit.as_secs_f64() / copy.as_secs_f64();
    println!(
        "store hit (whole `fdl nccl build`, files by {method}): median {:.3} s of {runs} {:?}",
        hit.as_secs_f64(),
        hits.iter()
            .map(|d| format!("{:.3}", d.as_secs_f64()))
            .collect::<Vec<_>>()
    );
    println!(
        "cp -a of the build directory ({:.0} MiB): median {:.3} s {:?}",
        size as f64 / (1024.0 * 1024.0),
        copy.as_secs_f64(),
        copies
            .iter()
            .map(|d| format!("{:.3}", d.as_secs_f64()))
            .collect::<Vec<_>>()
    );
    println!(
        "ratio {ratio:.2}x (target: within 2x) — {}",
        if ratio <= 2.0 { "met" } else { "MISSED" }
    );
    println!(
        "no make on PATH during the hits; nvcc calls during them: {} (--version / --list-gpu-arch only, no compile)",
        calls.lines().count()
    );
}
