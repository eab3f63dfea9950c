//! Speed of `fdl ps`'s scan (`fdl::loader::running::scan`, the library call, no project)
//! on a machine with 1,000 processes of this user alive, 8 of which map a real NCCL, against
//! the ways a user would look without fdl, measured side by side in one run.
//!
//! Run with `source .ci/fetch-oracles; cargo bench --bench ps`. The real NCCL is
//! `FDL_TEST_NCCL_LIB`; without it the benchmark says so and exits non-zero (it measures
//! nothing without a real NCCL mapped).
//!
//! The processes: 8 copies of a small C program compiled here with `cc` that `dlopen`s the
//! real `libnccl.so.2` (`RTLD_GLOBAL`), then a tiny shared object that imports
//! `ncclGetVersion` (`RTLD_NOW`, so its GOT slot is bound to the NCCL and the scan reads it
//! from memory, as for a real caller), says `ready` and blocks reading stdin; and 992
//! `sleep 600`. All are children of this benchmark and are killed and reaped at the end,
//! on an error or a panic too (a guard's `Drop`), and killed by the kernel when the
//! benchmark dies by a signal (`PR_SET_PDEATHSIG`).
//!
//! Contenders, in interleaved rounds (each round runs each once, the order rotated round to
//! round), `WARM` untimed rounds then `RUNS` timed; the median wall time of each:
//! - the scan as `fdl ps` runs it (`digest_cache`: each NCCL's digest kept in a cache of
//!   the benchmark's own by the file's identity, so only the first round hashes), in this
//!   process;
//! - (a) `ps -eo pid,args` (procps), output discarded;
//! - (b) the hand-written way, `sh -c 'grep -l libnccl /proc/[0-9]*/maps'`;
//! - (c) the same scan with `no_memory: true`;
//! - (d) the scan hashing every NCCL file again (`Options::default()`).
//!
//! Before timing, the scan must find the 8 programs, each mapping the NCCL with a version
//! and a digest and its calls reaching it (read from memory), and `grep -l` must list them:
//! a wrong answer is a non-zero exit; a missed target (under 100 ms) is a reported result.
//!
//! Then, when `FDL_TEST_TORCH_VENV` is set, with the 1,000 gone: 2 `python -c 'import torch;
//! …; time.sleep(600)'` of that venv (libtorch_cuda.so, the pip NCCL and ~100 other
//! objects mapped), the scan timed the same way (with and without memory).

use fdl::loader::running::{self, Evidence, Options, Reach};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

const WARM: usize = 3;
const RUNS: usize = 15;
const SLEEPERS: usize = 992;
const NCCL_HOSTS: usize = 8;
const TARGET_MS: f64 = 100.0;

type Res<T> = Result<T, String>;

fn main() -> ExitCode {
    // `cargo test --benches` / clippy builds run this without --bench: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        println!("ps benchmark: not run without --bench (use `cargo bench --bench ps`)");
        return ExitCode::SUCCESS;
    }
    let nccl = match std::env::var_os("FDL_TEST_NCCL_LIB") {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => {
            eprintln!(
                "ps benchmark: FDL_TEST_NCCL_LIB is not set: it names the real libnccl.so.2 the \
                 benchmark's processes map (run `source .ci/fetch-oracles` first)"
            );
            return ExitCode::FAILURE;
        }
    };
    // The digests `fdl ps` keeps go to a cache of the benchmark's own, not the user's.
    let cache = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("ps benchmark: cannot make a temporary cache: {e}");
            return ExitCode::FAILURE;
        }
    };
    std::env::set_var("XDG_CACHE_HOME", cache.path());
    let r = many(&nccl).and_then(|()| match std::env::var_os("FDL_TEST_TORCH_VENV") {
        Some(v) if !v.is_empty() => torch(Path::new(&v)),
        _ => {
            println!("the torch figure skipped: FDL_TEST_TORCH_VENV is not set (source .ci/fetch-oracles)");
            Ok(())
        }
    });
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ps benchmark failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Every child spawned, killed (SIGKILL) and reaped when dropped: at the end, on an error
/// and on a panic alike.
#[derive(Default)]
struct Children(Vec<Child>);

impl Children {
    fn spawn(&mut self, cmd: &mut Command) -> Res<&mut Child> {
        // Killed by the kernel too when this benchmark dies by a signal (Ctrl-C), where no
        // `Drop` runs.
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let c = cmd
            .spawn()
            .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
        self.0.push(c);
        Ok(self.0.last_mut().expect("just pushed"))
    }

    fn pids(&self) -> Vec<u32> {
        self.0.iter().map(|c| c.id()).collect()
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            c.kill().ok();
        }
        for c in &mut self.0 {
            c.wait().ok();
        }
    }
}

/// The C program and the caller object, built in `dir`; the program's path.
fn build_host(dir: &Path) -> Res<PathBuf> {
    let caller_c = dir.join("caller.c");
    let host_c = dir.join("host.c");
    std::fs::write(
        &caller_c,
        "int ncclGetVersion(int *version);\n\
         int fdl_bench_nccl_version(void) { int v = 0; ncclGetVersion(&v); return v; }\n",
    )
    .map_err(|e| e.to_string())?;
    std::fs::write(
        &host_c,
        r#"#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    if (!dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL)) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    if (!dlopen(argv[2], RTLD_NOW)) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    printf("ready\n");
    fflush(stdout);
    char b[64];
    while (read(0, b, sizeof b) > 0) {}
    return 0;
}
"#,
    )
    .map_err(|e| e.to_string())?;
    let caller = dir.join("libfdlbenchcaller.so");
    let host = dir.join("nccl-host");
    cc(Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&caller)
        .arg(&caller_c))?;
    cc(Command::new("cc")
        .arg("-o")
        .arg(&host)
        .arg(&host_c)
        .arg("-ldl"))?;
    Ok(host)
}

fn cc(cmd: &mut Command) -> Res<()> {
    let out = cmd
        .output()
        .map_err(|e| format!("cc (needed for the NCCL host program): {e}"))?;
    out.status.success().then_some(()).ok_or_else(|| {
        format!(
            "cc failed: {}",
            String::from_utf8_lossy(&out.stderr).trim_end()
        )
    })
}

/// Waits for a child's `ready` line on its stdout (the import or dlopen is done).
fn wait_ready(c: &mut Child, what: &str) -> Res<()> {
    let out = c.stdout.take().ok_or("no stdout pipe")?;
    let mut line = String::new();
    BufReader::new(out)
        .read_line(&mut line)
        .map_err(|e| format!("{what}: {e}"))?;
    if line.trim() != "ready" {
        return Err(format!(
            "{what} did not get ready (it said {:?}; its stderr is the benchmark's)",
            line.trim()
        ));
    }
    Ok(())
}

fn many(nccl: &Path) -> Res<()> {
    let nccl = nccl
        .canonicalize()
        .map_err(|e| format!("FDL_TEST_NCCL_LIB {}: {e}", nccl.display()))?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let host = build_host(dir.path())?;
    let caller = dir.path().join("libfdlbenchcaller.so");
    let mut kids = Children::default();
    let t = Instant::now();
    for _ in 0..NCCL_HOSTS {
        kids.spawn(
            Command::new(&host)
                .arg(&nccl)
                .arg(&caller)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .env_remove("LD_PRELOAD"),
        )?;
    }
    for (i, c) in kids.0.iter_mut().enumerate() {
        wait_ready(c, &format!("NCCL host {i}"))?;
    }
    let hosts = kids.pids();
    for _ in 0..SLEEPERS {
        kids.spawn(
            Command::new("sleep")
                .arg("600")
                .stdin(Stdio::null())
                .stdout(Stdio::null()),
        )?;
    }
    println!(
        "{} children alive ({NCCL_HOSTS} mapping {}, {SLEEPERS} sleep 600), started in {:.1} s",
        kids.0.len(),
        nccl.display(),
        t.elapsed().as_secs_f64()
    );

    // Right answers first: the scan finds the 8 and reads their GOT; grep lists them.
    let s = running::scan(&Options::default());
    let found: Vec<&running::Process> = s
        .processes
        .iter()
        .filter(|p| hosts.contains(&p.pid))
        .collect();
    if found.len() != NCCL_HOSTS {
        return Err(format!(
            "the scan found {} of the {NCCL_HOSTS} NCCL hosts (pids {hosts:?}); refused: {:?}",
            found.len(),
            s.refused
        ));
    }
    for p in &found {
        let n = p.nccl.first().ok_or("a host maps no NCCL in the scan")?;
        let by_memory = matches!(
            &p.reach,
            Reach::One {
                target,
                evidence: Evidence::Memory { .. }
            } if target.nccl == Some(0)
        );
        if p.nccl.len() != 1 || n.version.is_none() || n.blake3.is_none() || !by_memory {
            return Err(format!(
                "pid {}: the scan did not read its NCCL and calls: {:?} {:?}",
                p.pid, p.nccl, p.reach
            ));
        }
    }
    // Other processes of this user that map an NCCL (another job, a test) are scanned too,
    // and each distinct NCCL file among them is read and digested once more: say so.
    let mut files: Vec<_> = s
        .processes
        .iter()
        .flat_map(|p| p.nccl.iter().map(|n| n.path.clone()))
        .collect();
    files.sort();
    files.dedup();
    println!(
        "scan: {} of this user's processes looked at, {} map an NCCL ({} distinct NCCL files; the {NCCL_HOSTS} hosts: {}, calls reach it by {})",
        s.looked_at,
        s.processes.len(),
        files.len(),
        found[0].nccl[0].version_words(),
        found[0].reach.evidence().map(|e| e.short()).unwrap_or_default()
    );
    let grep = || {
        let mut c = Command::new("sh");
        c.args(["-c", "grep -l libnccl /proc/[0-9]*/maps"]);
        c
    };
    let listed = output(&mut grep())?;
    for pid in &hosts {
        if !listed.lines().any(|l| l == format!("/proc/{pid}/maps")) {
            return Err(format!("grep -l did not list pid {pid}:\n{listed}"));
        }
    }

    let mut scan_ms = Vec::new();
    let mut nomem_ms = Vec::new();
    let mut ps_ms = Vec::new();
    let mut grep_ms = Vec::new();
    let mut hash_ms = Vec::new();
    // As `fdl ps` scans: each NCCL's digest kept by the file's identity after the first
    // read (the warm-up rounds make it).
    let as_ps = Options {
        digest_cache: fdl::cache::cache_dir().ok(),
        ..Options::default()
    };
    let nomem = Options {
        no_memory: true,
        ..as_ps.clone()
    };
    for round in 0..WARM + RUNS {
        let mut times = [0.0; 5];
        for k in 0..5 {
            let which = (k + round) % 5;
            times[which] = match which {
                0 => in_process(|| running::scan(&as_ps))?,
                1 => in_process(|| running::scan(&nomem))?,
                2 => child(Command::new("ps").args(["-eo", "pid,args"]), &[0])?,
                3 => child(&mut grep(), &[0, 2])?,
                _ => in_process(|| running::scan(&Options::default()))?,
            };
        }
        if round >= WARM {
            scan_ms.push(times[0]);
            nomem_ms.push(times[1]);
            ps_ms.push(times[2]);
            grep_ms.push(times[3]);
            hash_ms.push(times[4]);
        }
    }
    let (scan, nomem, ps, grep, hash) = (
        median(&mut scan_ms),
        median(&mut nomem_ms),
        median(&mut ps_ms),
        median(&mut grep_ms),
        median(&mut hash_ms),
    );
    println!(
        "scan as fdl ps runs it (digests kept): {scan:.2} ms ({:.2} – {:.2}), target under {TARGET_MS:.0} ms: {}",
        scan_ms[0],
        scan_ms[RUNS - 1],
        if scan < TARGET_MS { "met" } else { "MISSED" }
    );
    println!(
        "  (d) scan hashing every NCCL again: {hash:.2} ms ({:.2} – {:.2}), scan/hashing {:.2}",
        hash_ms[0],
        hash_ms[RUNS - 1],
        scan / hash
    );
    println!(
        "  (a) ps -eo pid,args: {ps:.2} ms ({:.2} – {:.2}), scan/ps {:.2}",
        ps_ms[0],
        ps_ms[RUNS - 1],
        scan / ps
    );
    println!(
        "  (b) sh -c 'grep -l libnccl /proc/[0-9]*/maps': {grep:.2} ms ({:.2} – {:.2}), scan/grep {:.2}",
        grep_ms[0],
        grep_ms[RUNS - 1],
        scan / grep
    );
    println!(
        "  (c) scan with no_memory: {nomem:.2} ms ({:.2} – {:.2}), scan/no_memory {:.2}",
        nomem_ms[0],
        nomem_ms[RUNS - 1],
        scan / nomem
    );
    println!("  (median of {RUNS} interleaved rounds, after {WARM} warm-up rounds; ranges are min – max)");
    drop(kids);
    Ok(())
}

/// Two Python processes that imported torch, then the scan timed alone.
fn torch(venv: &Path) -> Res<()> {
    let python = venv.join("bin/python");
    let mut kids = Children::default();
    let t = Instant::now();
    for _ in 0..2 {
        kids.spawn(
            Command::new(&python)
                .args([
                    "-c",
                    "import torch; import time; print('ready', flush=True); time.sleep(600)",
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                // torch warns that numpy is missing: not this benchmark's business.
                .stderr(Stdio::null())
                .env_remove("LD_PRELOAD")
                .env_remove("PYTHONPATH"),
        )?;
    }
    for (i, c) in kids.0.iter_mut().enumerate() {
        wait_ready(c, &format!("python {i} (import torch)"))?;
    }
    let pids = kids.pids();
    println!(
        "2 python processes of {} imported torch in {:.1} s",
        venv.display(),
        t.elapsed().as_secs_f64()
    );
    let s = running::scan(&Options::default());
    let found: Vec<&running::Process> = s
        .processes
        .iter()
        .filter(|p| pids.contains(&p.pid))
        .collect();
    if found.len() != 2 || found.iter().any(|p| p.nccl.is_empty()) {
        return Err(format!(
            "the scan did not find both torch processes with an NCCL: {:?}; refused: {:?}",
            found.iter().map(|p| (p.pid, &p.nccl)).collect::<Vec<_>>(),
            s.refused
        ));
    }
    let p = found[0];
    println!(
        "scan: {} looked at; each python maps {} NCCL file(s): {}; calls reach {}",
        s.looked_at,
        p.nccl.len(),
        p.nccl
            .iter()
            .map(|n| format!("{} {}", n.version_words(), running::file_name(&n.path)))
            .collect::<Vec<_>>()
            .join(", "),
        p.reach_short()
    );
    let as_ps = Options {
        digest_cache: fdl::cache::cache_dir().ok(),
        ..Options::default()
    };
    let nomem = Options {
        no_memory: true,
        ..as_ps.clone()
    };
    let mut scan_ms = Vec::new();
    let mut nomem_ms = Vec::new();
    for round in 0..WARM + RUNS {
        let a = in_process(|| running::scan(&as_ps))?;
        let b = in_process(|| running::scan(&nomem))?;
        if round >= WARM {
            scan_ms.push(a);
            nomem_ms.push(b);
        }
    }
    let (scan, nomem) = (median(&mut scan_ms), median(&mut nomem_ms));
    println!(
        "torch: scan as fdl ps runs it (digests kept) {scan:.2} ms ({:.2} – {:.2}), with no_memory {nomem:.2} ms ({:.2} – {:.2}) (median of {RUNS} interleaved rounds, after {WARM} warm-up rounds)",
        scan_ms[0],
        scan_ms[RUNS - 1],
        nomem_ms[0],
        nomem_ms[RUNS - 1]
    );
    drop(kids);
    Ok(())
}

fn in_process<T>(f: impl FnOnce() -> T) -> Res<f64> {
    let t = Instant::now();
    std::hint::black_box(f());
    Ok(ms(t.elapsed()))
}

/// Runs `cmd` with its output discarded; its wall time in ms. It must exit with one of
/// `ok` (grep exits 2 when a process ended between the glob and its read).
fn child(cmd: &mut Command, ok: &[i32]) -> Res<f64> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let t = Instant::now();
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    let wall = t.elapsed();
    match status.code() {
        Some(c) if ok.contains(&c) => Ok(ms(wall)),
        _ => Err(format!("{:?} failed: {status}", cmd.get_program())),
    }
}

fn output(cmd: &mut Command) -> Res<String> {
    let out = cmd
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Sorts `v` and returns its median.
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
