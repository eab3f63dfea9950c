//! fdl's whole native build against plain make of the same tree, side by side (issue 31).
//!
//! Each round copies the NCCL tree twice and runs plain make — exactly the `make …
//! src.build` command fdl's dry run prints for the plan, in a shell, with nothing of fdl
//! around it — and `fdl nccl build --backend native` in a fresh project with a fresh
//! build store (compile, install, verify, store add, seal, commit). It prints each round,
//! the overhead against the 1% target, and where fdl's time went (`timings` of `fdl nccl
//! build --json`): the backend's make (compile, link, install) and fdl's own (prepare,
//! verify, store, seal).
//!
//! Two ways to share the machine (`FDL_BENCH_MODE`):
//! - `pinned` (the default on two or more CPUs): both sides start at once, each pinned
//!   to a CPU of its own (`taskset`), the CPUs swapped each round. This machine's speed
//!   drifts by more than 1% over a half-hour build (session 12 measured 738 s and 859 s
//!   for the same make in consecutive rounds), so only sides that run at the same time
//!   see the same machine. Each side keeps its CPU when the other ends first, so neither
//!   is sped up by the other's finish, and fdl's own threads (progress reader, digest
//!   walk) run on fdl's CPU and count against it. Both use `FDL_BENCH_JOBS` (default 1:
//!   the one CPU each has).
//! - `alternate`: one side after the other, the order alternating between rounds
//!   (`FDL_BENCH_FIRST=fdl` starts with fdl), each with the whole machine.
//!
//! Each round also prints the steal time of the CPUs used (`/proc/stat`): time the
//! hypervisor gave to others, which no build can account for.
//!
//! Inputs: `FDL_TEST_CUDA_HOME_NEWEST` (the CUDA 13.5 toolchain of the PyPI wheels, from
//! `.ci/fetch-oracles`); `FDL_BENCH_NCCL_TREE`, an unpacked NCCL release (`git archive
//! v2.30.7-1` of NVIDIA/nccl), else a stand-in NCCL-shaped tree whose kernels the real
//! nvcc compiles for many archs (`FDL_BENCH_STANDIN_KERNELS`, default 96: about half
//! a minute on one CPU here). `FDL_BENCH_ARCHS` (real tree: `8.0`;
//! stand-in: every arch from Turing to Blackwell), `FDL_BENCH_ONLY_FUNCS` (real tree:
//! `SendRecv`), `FDL_BENCH_ROUNDS` (default 2), `FDL_BENCH_JOBS` (pinned: 1; alternate:
//! fdl's own choice for this machine, which both sides then use).
//!
//! `cargo bench --bench native_build`; `cargo test` builds it but does not run it. A
//! missed target is a result; a failed or wrong build is a failure.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/native_fixture/mod.rs"]
mod native_fixture;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn fail(msg: &str) -> ! {
    eprintln!("native_build: {msg}");
    std::process::exit(1)
}

struct Inputs {
    tree: PathBuf,
    tag: String,
    cuda_home: PathBuf,
    archs: String,
    only_funcs: Option<String>,
    jobs: u32,
}

/// `cp -a` of the tree into a fresh directory: each build starts from the same files.
fn copy_tree(from: &Path, to: &Path) {
    let ok = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        fail(&format!(
            "cannot copy {} to {}",
            from.display(),
            to.display()
        ));
    }
}

fn fdl_args(i: &Inputs, source: &Path) -> Vec<String> {
    let mut a: Vec<String> = [
        "nccl",
        "build",
        "--backend",
        "native",
        "--tag",
        &i.tag,
        "--archs",
        &i.archs,
        "--jobs",
        &i.jobs.to_string(),
        "--cuda-home",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.push(i.cuda_home.display().to_string());
    a.push("--source".into());
    a.push(source.display().to_string());
    if let Some(f) = &i.only_funcs {
        a.extend(["--only-funcs".to_string(), f.clone()]);
    }
    a
}

/// A command, pinned to one CPU (by `taskset`, which execs it) when `cpu` says so.
fn on_cpu(program: &str, cpu: Option<usize>) -> Command {
    match cpu {
        Some(cpu) => {
            let mut c = Command::new("taskset");
            c.args(["-c", &cpu.to_string(), program]);
            c
        }
        None => Command::new(program),
    }
}

fn fdl(root: &Path, cache: &Path, args: &[String], cpu: Option<usize>) -> std::process::Output {
    on_cpu(env!("CARGO_BIN_EXE_fdl"), cpu)
        .arg("--root")
        .arg(root)
        .args(args)
        .env("XDG_CACHE_HOME", cache)
        .env_remove("CUDA_HOME")
        .output()
        .unwrap()
}

/// Plain make: the build command of fdl's own dry run for the same plan, with the tree
/// and a build directory of its own put in for its placeholders.
fn plain_command(i: &Inputs, source: &Path, build_dir: &Path) -> String {
    let scratch = tempfile::tempdir().unwrap();
    let mut args = fdl_args(i, source);
    args.extend(["--dry-run".into(), "--json".into(), "--no-store".into()]);
    let out = fdl(scratch.path(), scratch.path(), &args, None);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        fail(&format!(
            "the dry run did not answer JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    });
    if !out.status.success() {
        fail(&format!("the plan cannot run: {}", v["plan"]["problems"]));
    }
    let commands: Vec<&str> = v["commands"]
        .as_array()
        .map(|c| c.iter().filter_map(|c| c.as_str()).collect())
        .unwrap_or_default();
    // The count (`make -n`), the build, the install: the build is the one with
    // `src.build` and no `-n`.
    let build = commands
        .iter()
        .find(|c| c.contains(" src.build") && !c.contains(" -n "))
        .unwrap_or_else(|| fail(&format!("no build command among {commands:?}")));
    let quote = |p: &Path| format!("'{}'", p.display());
    build.replace("'<source>'", &quote(source)).replace(
        "'BUILDDIR=<build-dir>'",
        &format!("BUILDDIR={}", quote(build_dir)),
    )
}

fn run_plain(cmd: &str, cpu: Option<usize>) -> Duration {
    let start = Instant::now();
    let out = on_cpu("bash", cpu).args(["-c", cmd]).output().unwrap();
    let took = start.elapsed();
    if !out.status.success() {
        fail(&format!(
            "plain make failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    took
}

/// fdl's whole build in a fresh project and store: its wall time and its timings.
fn run_fdl(i: &Inputs, source: &Path, cpu: Option<usize>) -> (Duration, Vec<(String, f64)>) {
    let root = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let mut args = fdl_args(i, source);
    args.push("--json".into());
    let start = Instant::now();
    let out = fdl(root.path(), cache.path(), &args, cpu);
    let took = start.elapsed();
    if !out.status.success() {
        fail(&format!(
            "fdl's build failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    if v["status"] != "built" {
        fail(&format!(
            "fdl did not compile (status {}): the store was not fresh",
            v["status"]
        ));
    }
    verify_and_reuse(i, source, root.path(), cache.path(), &v);
    let timings = v["timings"]
        .as_array()
        .map(|t| {
            t.iter()
                .map(|t| {
                    (
                        t["phase"].as_str().unwrap_or("?").to_string(),
                        t["seconds"].as_f64().unwrap_or(0.0),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    (took, timings)
}

/// After the timed build: `fdl nccl verify` passes on it, and on the copy a second
/// project gets from the store (a real NCCL ≥ 2.28 installs `include/nccl_device.h`
/// beside `include/nccl_device/`, which the stand-in trees did not always have).
fn verify_and_reuse(
    i: &Inputs,
    source: &Path,
    root: &Path,
    cache: &Path,
    built: &serde_json::Value,
) {
    let name = built["build_dir"]
        .as_str()
        .and_then(|d| Path::new(d).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| fail("fdl's build answer names no build_dir"));
    let verify = |root: &Path| {
        let args = ["nccl", "verify", &name, "--json"].map(String::from);
        let out = fdl(root, cache, &args, None);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if !out.status.success() || v["passed"] != true {
            fail(&format!(
                "fdl nccl verify {name} failed in {}:\n{}{}",
                root.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    };
    verify(root);
    let second = tempfile::tempdir().unwrap();
    let mut args = fdl_args(i, source);
    args.push("--json".into());
    let out = fdl(second.path(), cache, &args, None);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    if v["status"] != "installed_from_store" {
        fail(&format!(
            "a second project was not served from the store (status {}):\n{}",
            v["status"],
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    verify(second.path());
}

/// `n` kernels whose unrolled loops give nvcc (ptxas, once per arch) seconds of work.
fn standin_kernels(n: usize) -> String {
    (0..n.max(1))
        .map(|k| {
            format!(
                "extern \"C\" __global__ void ncclStandinKernel{k}(float *x, float a, int n) {{\n\
                 int i = blockIdx.x * blockDim.x + threadIdx.x;\n\
                 float v = i < n ? x[i] : 0.f;\n\
                 #pragma unroll\n\
                 for (int j = 0; j < 256; j++) v = v * a + __sinf(v + {k}.0f * j);\n\
                 if (i < n) x[i] = v;\n}}\n"
            )
        })
        .collect()
}

/// Steal and all ticks of one `/proc/stat` line (`cpu` for the machine, `cpuN` for one).
fn ticks(name: &str) -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
    else {
        return (0, 0);
    };
    let n: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal guest guest_nice: guest time is
    // already inside user, so all time is the first eight.
    (n.get(7).copied().unwrap_or(0), n.iter().take(8).sum())
}

/// The steal share of `name`'s time since `since`, in percent.
fn steal_since(name: &str, since: (u64, u64)) -> f64 {
    let now = ticks(name);
    let all = now.1.saturating_sub(since.1);
    if all == 0 {
        return 0.0;
    }
    100.0 * now.0.saturating_sub(since.0) as f64 / all as f64
}

/// The first two CPUs this process may run on, by `taskset -pc`'s own list.
fn two_cpus() -> Option<(usize, usize)> {
    let out = Command::new("taskset")
        .args(["-pc", &std::process::id().to_string()])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let list = text.rsplit(':').next()?.trim();
    let mut cpus = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.trim().parse::<usize>().ok()?..=b.trim().parse().ok()?),
            None => cpus.push(part.trim().parse().ok()?),
        }
    }
    (cpus.len() >= 2).then(|| (cpus[0], cpus[1]))
}

/// One round's two sides: their wall times, fdl's timings, and each side's steal share.
struct Round {
    plain: Duration,
    fdl: Duration,
    timings: Vec<(String, f64)>,
    steal: (f64, f64),
    how: String,
}

fn pinned_round(i: &Inputs, cmd: &str, fdl_src: &Path, cpus: (usize, usize)) -> Round {
    let (pc, fc) = (format!("cpu{}", cpus.0), format!("cpu{}", cpus.1));
    let (p0, f0) = (ticks(&pc), ticks(&fc));
    let ((plain, ps), (with_fdl, timings, fs)) = std::thread::scope(|s| {
        let plain = s.spawn(|| {
            let t = run_plain(cmd, Some(cpus.0));
            (t, steal_since(&pc, p0))
        });
        let (t, timings) = run_fdl(i, fdl_src, Some(cpus.1));
        let fdl = (t, timings, steal_since(&fc, f0));
        (plain.join().unwrap(), fdl)
    });
    Round {
        plain,
        fdl: with_fdl,
        timings,
        steal: (ps, fs),
        how: format!(
            "together, plain make on CPU {}, fdl on CPU {}",
            cpus.0, cpus.1
        ),
    }
}

fn alternate_round(i: &Inputs, cmd: &str, fdl_src: &Path, plain_first: bool) -> Round {
    let plain = || {
        let t0 = ticks("cpu");
        let t = run_plain(cmd, None);
        (t, steal_since("cpu", t0))
    };
    let fdl = || {
        let t0 = ticks("cpu");
        let (t, timings) = run_fdl(i, fdl_src, None);
        (t, timings, steal_since("cpu", t0))
    };
    let ((plain, ps), (with_fdl, timings, fs)) = if plain_first {
        let p = plain();
        (p, fdl())
    } else {
        let f = fdl();
        (plain(), f)
    };
    Round {
        plain,
        fdl: with_fdl,
        timings,
        steal: (ps, fs),
        how: format!("{} first", if plain_first { "plain make" } else { "fdl" }),
    }
}

fn main() {
    let cuda_home = var("FDL_TEST_CUDA_HOME_NEWEST").map(PathBuf::from).unwrap_or_else(|| {
        fail("FDL_TEST_CUDA_HOME_NEWEST is not set: `source .ci/setup` first (the CUDA toolchain wheels)")
    });
    let work = tempfile::tempdir().unwrap();
    let rounds: usize = var("FDL_BENCH_ROUNDS")
        .and_then(|r| r.parse().ok())
        .unwrap_or(2);
    let cpus = two_cpus();
    let pinned = match var("FDL_BENCH_MODE").as_deref() {
        None => cpus.is_some(),
        Some("pinned") if cpus.is_none() => {
            fail("FDL_BENCH_MODE=pinned needs two CPUs this process may use (taskset -pc)")
        }
        Some("pinned") => true,
        Some("alternate") => false,
        Some(other) => fail(&format!(
            "FDL_BENCH_MODE={other:?}: say pinned or alternate"
        )),
    };
    let jobs: u32 = var("FDL_BENCH_JOBS")
        .and_then(|j| j.parse().ok())
        .unwrap_or_else(|| {
            if pinned {
                1
            } else {
                fdl::pipeline::default_jobs().0
            }
        });
    let inputs = match var("FDL_BENCH_NCCL_TREE") {
        Some(tree) => {
            let tree = PathBuf::from(tree);
            let master = fdl::nccl::tag::Tag::parse("master").unwrap();
            let version = fdl::native::check_source_dir(&tree, &master)
                .map(|(_, v)| v)
                .unwrap_or_else(|e| fail(&format!("{}: {e:#}", tree.display())));
            Inputs {
                tag: fdl::nccl::tag::Tag::for_release(&version).to_string(),
                tree,
                cuda_home,
                archs: var("FDL_BENCH_ARCHS").unwrap_or_else(|| "8.0".into()),
                only_funcs: Some(var("FDL_BENCH_ONLY_FUNCS").unwrap_or_else(|| "SendRecv".into())),
                jobs,
            }
        }
        None => {
            let tree = work.path().join("standin");
            native_fixture::nvcc_tree(&tree, (2, 27, 5));
            // The fixture's one trivial kernel compiles in about 3 s for all archs: too
            // short to weigh 1%. Kernels of unrolled math give ptxas work per arch.
            let kernels: usize = var("FDL_BENCH_STANDIN_KERNELS")
                .and_then(|k| k.parse().ok())
                .unwrap_or(96);
            std::fs::write(tree.join("src/kernels.cu"), standin_kernels(kernels)).unwrap();
            Inputs {
                tree,
                tag: "v2.27.5-1".into(),
                cuda_home,
                archs: var("FDL_BENCH_ARCHS")
                    .unwrap_or_else(|| "7.5;8.0;8.6;8.9;9.0;10.0;10.3;12.0;12.1".into()),
                only_funcs: var("FDL_BENCH_ONLY_FUNCS"),
                jobs,
            }
        }
    };
    let real = var("FDL_BENCH_NCCL_TREE").is_some();
    println!(
        "native build vs plain make: {} ({}), archs {}, ONLY_FUNCS {}, {} jobs, {} round(s), {}",
        inputs.tree.display(),
        if real { "real NCCL" } else { "stand-in tree" },
        inputs.archs,
        inputs.only_funcs.as_deref().unwrap_or("(all)"),
        inputs.jobs,
        rounds,
        if pinned {
            "both at once, one CPU each"
        } else {
            "one after the other"
        }
    );
    // Which side the first round runs first: a one-round run of each order is a pair
    // of rounds split over two calls.
    let fdl_first = usize::from(var("FDL_BENCH_FIRST").as_deref() == Some("fdl"));
    let (mut plain_sum, mut fdl_sum) = (Duration::ZERO, Duration::ZERO);
    let mut phases: Vec<(String, f64)> = Vec::new();
    for round in 1..=rounds {
        let dir = work.path().join(format!("round-{round}"));
        std::fs::create_dir_all(&dir).unwrap();
        let (plain_src, fdl_src) = (dir.join("plain-src"), dir.join("fdl-src"));
        copy_tree(&inputs.tree, &plain_src);
        copy_tree(&inputs.tree, &fdl_src);
        let cmd = plain_command(&inputs, &plain_src, &dir.join("plain-build"));
        let r = match cpus.filter(|_| pinned) {
            Some((a, b)) if round % 2 == 1 => pinned_round(&inputs, &cmd, &fdl_src, (a, b)),
            Some((a, b)) => pinned_round(&inputs, &cmd, &fdl_src, (b, a)),
            None => alternate_round(&inputs, &cmd, &fdl_src, (round + fdl_first) % 2 == 1),
        };
        let Round {
            plain,
            fdl: with_fdl,
            timings,
            steal,
            how,
        } = r;
        plain_sum += plain;
        fdl_sum += with_fdl;
        for (phase, s) in &timings {
            match phases.iter_mut().find(|(p, _)| p == phase) {
                Some((_, sum)) => *sum += s,
                None => phases.push((phase.clone(), *s)),
            }
        }
        println!(
            "round {round} ({how}): plain make {:.1} s (steal {:.1}%), fdl {:.1} s (steal {:.1}%) ({:+.2}%): {}",
            plain.as_secs_f64(),
            steal.0,
            with_fdl.as_secs_f64(),
            steal.1,
            100.0 * (with_fdl.as_secs_f64() / plain.as_secs_f64() - 1.0),
            timings
                .iter()
                .map(|(p, s)| format!("{p} {s:.1} s"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let make_phases = ["compile", "link", "install"];
    let make: f64 = phases
        .iter()
        .filter(|(p, _)| make_phases.contains(&p.as_str()))
        .map(|(_, s)| s)
        .sum();
    let own: f64 = phases
        .iter()
        .filter(|(p, _)| !make_phases.contains(&p.as_str()))
        .map(|(_, s)| s)
        .sum();
    let overhead = 100.0 * (fdl_sum.as_secs_f64() / plain_sum.as_secs_f64() - 1.0);
    println!();
    println!("| | total over {rounds} round(s) |");
    println!("|---|---|");
    println!("| plain make | {:.1} s |", plain_sum.as_secs_f64());
    println!("| fdl nccl build | {:.1} s |", fdl_sum.as_secs_f64());
    println!("| of which fdl's make (compile, link, install) | {make:.1} s |");
    println!("| of which fdl's own ({}) | {own:.1} s |", {
        phases
            .iter()
            .filter(|(p, _)| !make_phases.contains(&p.as_str()))
            .map(|(p, s)| format!("{p} {s:.1} s"))
            .collect::<Vec<_>>()
            .join(", ")
    });
    println!(
        "fdl's whole build over plain make: {overhead:+.2}% (target: within 1%): {}",
        if overhead <= 1.0 { "MET" } else { "MISSED" }
    );
    println!("machine load after the run: {}", {
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
            .to_string()
    });
}
