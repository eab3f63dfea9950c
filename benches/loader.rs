//! Speed and memory of `fdl nccl detect LIB --json` against `ldd LIB` on the real torch 2.8
//! wheel laid out as pip installs it (`FDL_TEST_TORCH_LIB`, from `source
//! .ci/fetch-oracles`): both answer "which libnccl.so.2 does this library load".
//!
//! Run with `cargo bench --bench loader` (cargo builds the fdl binary in the bench
//! profile and passes its path as `CARGO_BIN_EXE_fdl`). Without `FDL_TEST_TORCH_LIB` it
//! prints that it was skipped and exits 0 — a benchmark, not a test.
//!
//! The layout is built in a temporary directory: `site/torch/lib/libtorch_cuda.so` and
//! `site/nvidia/nccl/lib/libnccl.so.2` are symlinks to the wheel's files (a library's
//! `$ORIGIN` is the directory of the path it was opened by, so the RPATH resolves inside
//! the layout), and each other `DT_NEEDED` that `ldd` reports `not found` gets an empty
//! stub with that soname, compiled with `cc` into `site/torch/lib`, so both contenders
//! resolve a complete closure. Each contender runs 3 times untimed (warm page cache),
//! then 15 timed runs; the median wall time is reported, and fdl's peak RSS is the
//! largest `ru_maxrss` that `wait4` returned for its runs. The exit status is non-zero
//! only when the layout cannot be built or fdl names another libnccl.so.2 than `ldd`.
//!
//! Then the witness: `fdl nccl detect LIB --witness --json` (the model and this host's
//! loader's trace) against the loader's own trace of the same layout, `LD_DEBUG=bindings
//! ldd -r LIB` into a debug file, timed the same way; non-zero when the witness does not
//! confirm the model's libnccl.so.2.

#[path = "support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

const WARM: usize = 3;
const RUNS: usize = 15;

type Res<T> = Result<T, String>;

fn main() -> ExitCode {
    // `cargo test --benches` / clippy builds run this without --bench: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        println!("loader benchmark: not run without --bench (use `cargo bench --bench loader`)");
        return ExitCode::SUCCESS;
    }
    let lib = match std::env::var_os("FDL_TEST_TORCH_LIB") {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => {
            println!(
                "loader benchmark skipped: FDL_TEST_TORCH_LIB is not set (source .ci/fetch-oracles)"
            );
            return ExitCode::SUCCESS;
        }
    };
    let python = match std::env::var_os("FDL_TEST_TORCH_VENV") {
        Some(v) if !v.is_empty() => python_process(Path::new(&v)),
        _ => {
            println!("the Python answer's benchmark skipped: FDL_TEST_TORCH_VENV is not set (source .ci/fetch-oracles)");
            Ok(())
        }
    };
    match run(&lib).and(python) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loader benchmark failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(real_torch: &Path) -> Res<()> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let torch = layout(real_torch, dir.path())?;
    let fdl = PathBuf::from(env!("CARGO_BIN_EXE_fdl"));
    let root = dir.path().join("fdl-root");
    std::fs::create_dir_all(&root).map_err(|e| e.to_string())?;

    let detect = || {
        let mut c = Command::new(&fdl);
        c.arg("--root")
            .arg(&root)
            .args(["nccl", "detect"])
            .arg(&torch)
            .arg("--json")
            .env_remove("LD_PRELOAD")
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("FDL_ROOT");
        c
    };
    let ldd = || {
        let mut c = Command::new("ldd");
        c.arg(&torch)
            .env_remove("LD_PRELOAD")
            .env_remove("LD_LIBRARY_PATH");
        c
    };

    // Both must name the same file before their speeds mean anything.
    let by_ldd = ldd_nccl(&output(&mut ldd())?)?;
    let json = output(&mut detect())?;
    let v: serde_json::Value = serde_json::from_str(&json)
        .map_err(|e| format!("fdl's output is not JSON ({e}): {json}"))?;
    let det = &v["nccl"]["detection"];
    let by_fdl = det["file"]
        .as_str()
        .ok_or_else(|| format!("fdl found no NCCL: {json}"))?;
    let (a, b) = (canon(&by_ldd), canon(Path::new(by_fdl)));
    if a != b {
        return Err(format!(
            "fdl names {} but ldd resolves libnccl.so.2 to {}",
            b.display(),
            a.display()
        ));
    }
    println!(
        "libnccl.so.2 => {} (NCCL {}): fdl and ldd agree",
        a.display(),
        det["version"].as_str().unwrap_or("?")
    );

    let (detect_ms, rss_kib) = time(detect)?;
    let (ldd_ms, _) = time(ldd)?;
    println!(
        "detect: {detect_ms:.2} ms, ldd: {ldd_ms:.2} ms, ratio {:.2} (median of {RUNS}, after {WARM} warm-up runs)",
        detect_ms / ldd_ms
    );
    println!("fdl peak RSS: {:.1} MiB", rss_kib as f64 / 1024.0);

    // The witness: `detect --witness` (the model, then this host's loader traced with
    // the nccl* bindings) against the loader's own trace of the same layout, as a user
    // would type it: `LD_DEBUG=bindings ldd -r LIB` into a debug file.
    let witness = || {
        let mut c = detect();
        c.arg("--witness");
        c
    };
    let json = output(&mut witness())?;
    let v: serde_json::Value = serde_json::from_str(&json)
        .map_err(|e| format!("fdl's output is not JSON ({e}): {json}"))?;
    let w = &v["witness"];
    let reached = w["reached"][0]["object"].as_str().unwrap_or("");
    if w["verdict"]["verdict"] != "agree" || canon(Path::new(reached)) != a {
        return Err(format!("the witness does not confirm {}: {w}", a.display()));
    }
    println!(
        "witness: {} binds libtorch's nccl* references to {}: it agrees with the model",
        w["interpreter"].as_str().unwrap_or("?"),
        a.display()
    );
    let traces = dir.path().join("ldd-r");
    std::fs::create_dir_all(&traces).map_err(|e| e.to_string())?;
    let ldd_r = || {
        let mut c = Command::new("ldd");
        c.arg("-r")
            .arg(&torch)
            .env_remove("LD_PRELOAD")
            .env_remove("LD_LIBRARY_PATH")
            .env("LD_DEBUG", "bindings")
            .env("LD_DEBUG_OUTPUT", traces.join("trace"));
        c
    };
    let (witness_ms, rss_kib) = time(witness)?;
    let (trace_ms, _) = time(ldd_r)?;
    println!(
        "detect --witness: {witness_ms:.2} ms, LD_DEBUG=bindings ldd -r: {trace_ms:.2} ms, ratio {:.2} (median of {RUNS}, after {WARM} warm-up runs)",
        witness_ms / trace_ms
    );
    println!(
        "fdl --witness peak RSS: {:.1} MiB (the loader's own is its child's)",
        rss_kib as f64 / 1024.0
    );
    Ok(())
}

/// The Python answer (torch's `__init__.py` read, `sys.path` made, its preloads found)
/// against today's answer for a program linking the same library, on the real torch 2.15
/// venv: `detect --process python` against `detect --process program`, side by side.
fn python_process(venv: &Path) -> Res<()> {
    let site = std::fs::read_dir(venv.join("lib"))
        .map_err(|e| format!("{}: {e}", venv.display()))?
        .flatten()
        .map(|e| e.path().join("site-packages"))
        .find(|p| p.is_dir())
        .ok_or_else(|| format!("no site-packages under {}", venv.display()))?;
    let lib = site.join("torch/lib/libtorch_cuda.so");
    let fdl = PathBuf::from(env!("CARGO_BIN_EXE_fdl"));
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let detect = |kind: &'static str| {
        let lib = lib.clone();
        let fdl = fdl.clone();
        let root = dir.path().to_path_buf();
        move || {
            let mut c = Command::new(&fdl);
            c.arg("--root")
                .arg(&root)
                .args(["nccl", "detect"])
                .arg(&lib)
                .args(["--json", "--process", kind])
                .current_dir(&root)
                .env_remove("LD_PRELOAD")
                .env_remove("LD_LIBRARY_PATH")
                .env_remove("PYTHONPATH")
                .env_remove("FDL_ROOT");
            c
        }
    };
    for kind in ["python", "program"] {
        let json = output(&mut detect(kind)())?;
        let v: serde_json::Value = serde_json::from_str(&json)
            .map_err(|e| format!("fdl's output is not JSON ({e}): {json}"))?;
        if v["nccl"]["detection"]["file"].as_str().is_none() {
            return Err(format!("fdl found no NCCL for a {kind} process: {json}"));
        }
    }
    let (python_ms, python_kib) = time(detect("python"))?;
    let (program_ms, program_kib) = time(detect("program"))?;
    println!(
        "torch 2.15 venv: detect for a Python process {python_ms:.2} ms ({:.1} MiB), for a program {program_ms:.2} ms ({:.1} MiB), ratio {:.2} (median of {RUNS}, after {WARM} warm-up runs)",
        python_kib as f64 / 1024.0,
        program_kib as f64 / 1024.0,
        python_ms / program_ms
    );
    Ok(())
}

/// Builds the pip layout under `dir`; returns the path of its libtorch_cuda.so.
fn layout(real_torch: &Path, dir: &Path) -> Res<PathBuf> {
    let real_nccl = real_torch
        .parent()
        .ok_or("FDL_TEST_TORCH_LIB has no parent directory")?
        .join("../../nvidia/nccl/lib/libnccl.so.2");
    let lib = dir.join("site/torch/lib");
    let nccl = dir.join("site/nvidia/nccl/lib");
    for d in [&lib, &nccl] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let link = |target: &Path, at: &Path| {
        let target = target
            .canonicalize()
            .map_err(|e| format!("{}: {e}", target.display()))?;
        std::os::unix::fs::symlink(target, at).map_err(|e| format!("{}: {e}", at.display()))
    };
    let torch = lib.join("libtorch_cuda.so");
    link(real_torch, &torch)?;
    link(&real_nccl, &nccl.join("libnccl.so.2"))?;
    for _ in 0..3 {
        let listing = output(
            Command::new("ldd")
                .arg(&torch)
                .env_remove("LD_PRELOAD")
                .env_remove("LD_LIBRARY_PATH"),
        )?;
        let missing: Vec<&str> = listing
            .lines()
            .filter_map(|l| l.trim().strip_suffix(" => not found"))
            .collect();
        if missing.is_empty() {
            return Ok(torch);
        }
        for name in missing {
            stub(&lib.join(name), name)?;
        }
    }
    Err("the layout's closure still has unresolved libraries after 3 rounds of stubs".into())
}

/// An empty shared library with `soname`.
fn stub(out: &Path, soname: &str) -> Res<()> {
    let src = out.with_extension("stub.c");
    std::fs::write(&src, "int fdl_empty_stub;\n").map_err(|e| e.to_string())?;
    let ok = Command::new("cc")
        .args(["-shared", "-fPIC", &format!("-Wl,-soname,{soname}"), "-o"])
        .arg(out)
        .arg(&src)
        .status()
        .map_err(|e| format!("cc (needed for the stubs): {e}"))?
        .success();
    std::fs::remove_file(&src).ok();
    ok.then_some(())
        .ok_or_else(|| format!("cc failed for the stub {soname}"))
}

fn output(cmd: &mut Command) -> Res<String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if !out.status.success() {
        return Err(format!(
            "{:?} failed ({}): {}",
            cmd.get_program(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The path `ldd` resolves libnccl.so.2 to.
fn ldd_nccl(listing: &str) -> Res<PathBuf> {
    listing
        .lines()
        .find_map(|l| l.trim().strip_prefix("libnccl.so.2 => "))
        .and_then(|r| r.rsplit_once(" (0x"))
        .map(|(p, _)| PathBuf::from(p))
        .ok_or_else(|| format!("ldd did not resolve libnccl.so.2:\n{listing}"))
}

fn canon(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|_| p.to_path_buf())
}

/// Median wall time in ms of `RUNS` runs after `WARM` untimed ones, and the largest
/// `ru_maxrss` (KiB) of all of them.
fn time(make: impl Fn() -> Command) -> Res<(f64, u64)> {
    let mut walls = Vec::with_capacity(RUNS);
    let mut rss = 0;
    for i in 0..WARM + RUNS {
        let (wall, maxrss) = run_child(&mut make())?;
        rss = rss.max(maxrss);
        if i >= WARM {
            walls.push(wall);
        }
    }
    walls.sort();
    Ok((walls[RUNS / 2].as_secs_f64() * 1000.0, rss))
}

/// Runs `cmd` (output discarded), reaps it with `wait4`; its wall time and own peak RSS.
fn run_child(cmd: &mut Command) -> Res<(Duration, u64)> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let support::Reaped {
        wall,
        status,
        rusage: ru,
    } = support::spawn_and_reap(cmd)?;
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        return Err(format!(
            "{:?} did not exit 0 (wait status {status:#x})",
            cmd.get_program()
        ));
    }
    Ok((wall, ru.ru_maxrss as u64))
}
