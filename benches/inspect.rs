//! Speed and memory of `fdl nccl detect` and `fdl inspect` against the baselines the
//! issue names, in one run: `grep -c`, a whole-file read with a byte-by-byte scan, and
//! `cuobjdump --list-elf` when it is present.
//!
//! Run with `cargo bench --bench inspect` (full: 0.5 and 2 GB inputs) or
//! `FDL_BENCH_QUICK=1 cargo bench --bench inspect` (64 MB inputs, a smoke run), or with
//! `FDL_BENCH_REAL_ONLY=1` on the real libraries alone. See
//! BENCHMARKS.md for the environment variables and the recorded results.
//!
//! Every contender runs as a child process; wall time is taken around spawn..reap and
//! peak RSS is the child's own `ru_maxrss` from `wait4`. The byte-scan baseline is this
//! very binary re-executed in [`SCAN_MODE`], so it pays for process start like the rest;
//! so is fdl's reader alone ([`READ_MODE`]), once with the zstd front decoder and once
//! with libzstd decoding each zstd cubin's first block, to weigh the former.
//! Files are warm in the page cache: each contender runs once untimed before the timed
//! runs. Speed targets are reported as ratios, never asserted; the exit status is
//! non-zero only when a contender gives a wrong answer.

#[path = "support/mod.rs"]
mod support;

use fdl::arch::{Arch, GpuTarget, Variant};
use fdl_synth as synth;
use std::fmt::Write as _;
use std::fs::File;
use std::hint::black_box;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// First argument that turns this binary into the byte-scan baseline.
const SCAN_MODE: &str = "__byte-scan";
/// First argument that turns this binary into fdl's reader alone, in process:
/// `__read front|libzstd FILE` inspects FILE with the zstd front decoder
/// (`src/inspect/zstd_head.rs`, what `fdl inspect` runs) or with libzstd decoding each
/// zstd cubin's first block, and prints the cubin count and how they were decoded.
const READ_MODE: &str = "__read";
/// First argument that makes this binary write one synthetic input:
/// `__generate SIZE CONTAINERS selfid|noid PATH`.
const GENERATE_MODE: &str = "__generate";
/// What `grep -c` and the byte scan look for.
const NEEDLE: &[u8] = b"NCCL version";
/// The self-id written into the "with self-id" inputs.
const SELF_ID: &str = "2.27.5+cuda12.9";
/// Bumped whenever the input recipe below changes, so cached files are rewritten.
const RECIPE: u32 = 2;
const SASS_ARCHS: &[u32] = &[70, 75, 80, 86, 89, 90, 100, 120];
const PTX_ARCHS: &[u32] = &[120];
/// Floor messages the synthesizer writes ("requires NCCL version 2.27.0 or later" and
/// two more): each holds the needle but is no self-id.
const FLOOR_MATCHES: usize = 3;
const DETECT_OVER_GREP_MAX: f64 = 0.10;
const CUOBJDUMP_OVER_INSPECT_MIN: f64 = 100.0;
const RSS_MAX_MIB: f64 = 32.0;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(SCAN_MODE) {
        return match args.get(1) {
            Some(path) => byte_scan(Path::new(path)),
            None => {
                eprintln!("usage: {SCAN_MODE} FILE");
                ExitCode::FAILURE
            }
        };
    }
    if args.first().map(String::as_str) == Some(READ_MODE) {
        return read_only(&args[1..]);
    }
    if args.first().map(String::as_str) == Some(GENERATE_MODE) {
        return generate(&args[1..]);
    }
    // `cargo bench` passes --bench; `cargo test --benches/--all-targets` does not, and
    // must not spend many minutes writing and timing gigabytes.
    if !args.iter().any(|a| a == "--bench") {
        println!("inspect benchmark: not run without --bench (use `cargo bench --bench inspect`)");
        return ExitCode::SUCCESS;
    }
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("benchmark finished, but some contender gave a wrong answer (see CHECK FAILED above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("benchmark failed: {e}");
            ExitCode::FAILURE
        }
    }
}

type Res<T> = Result<T, String>;

/// [`READ_MODE`]: fdl's reader on one file, with one of the two zstd decoders.
fn read_only(args: &[String]) -> ExitCode {
    let (decoder, path) = match args {
        [d, p] if d == "front" || d == "libzstd" => (d.as_str(), Path::new(p)),
        _ => {
            eprintln!("usage: {READ_MODE} front|libzstd FILE");
            return ExitCode::FAILURE;
        }
    };
    let got = if decoder == "front" {
        fdl::inspect::inspect(path)
    } else {
        fdl::inspect::inspect_libzstd_only(path)
    };
    match got {
        Ok(ins) => {
            let count = |e: &[fdl::inspect::CodeEntry]| e.iter().map(|e| e.count).sum::<usize>();
            println!(
                "sass {} ptx {} zstd-front {} zstd-libzstd {}",
                count(&ins.gpu_code.sass),
                count(&ins.gpu_code.ptx),
                ins.work().zstd.head,
                ins.work().zstd.libzstd
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The naive baseline: read the whole file into memory, then compare byte by byte at
/// every offset. Prints the match count and every distinct `X.Y.Z+cudaA.B`-looking string
/// after a match, which cross-checks fdl's answer independently of fdl's parser.
fn byte_scan(path: &Path) -> ExitCode {
    let data = match std::fs::read(path) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("cannot read {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    };
    // The optimizer must not reason about the contents or skip the loop.
    let data: &[u8] = black_box(&data);
    let needle: &[u8] = black_box(NEEDLE);
    let mut count = 0usize;
    let mut ids: Vec<String> = Vec::new();
    let mut i = 0usize;
    while i + needle.len() <= data.len() {
        let mut j = 0;
        while j < needle.len() && data[i + j] == needle[j] {
            j += 1;
        }
        if j == needle.len() {
            count += 1;
            let rest = &data[i + j..data.len().min(i + j + 48)];
            let rest = rest.strip_prefix(b" ").unwrap_or(rest);
            let end = rest
                .iter()
                .position(|&b| !(b.is_ascii_alphanumeric() || b == b'.' || b == b'+'))
                .unwrap_or(rest.len());
            let word = String::from_utf8_lossy(&rest[..end]).into_owned();
            if word.contains("+cuda")
                && word.starts_with(|c: char| c.is_ascii_digit())
                && !ids.contains(&word)
            {
                ids.push(word);
            }
        }
        i += 1;
    }
    println!("matches {}", black_box(count));
    for id in ids {
        println!("self-id {id}");
    }
    ExitCode::SUCCESS
}

/// The `__generate` mode: writes one input, streaming.
fn generate(args: &[String]) -> ExitCode {
    let parsed = match args {
        [size, containers, kind, path] => size
            .parse::<u64>()
            .ok()
            .zip(containers.parse::<usize>().ok())
            .map(|(s, c)| (s, c, kind == "selfid", PathBuf::from(path))),
        _ => None,
    };
    let Some((size, containers, self_id, path)) = parsed else {
        eprintln!("usage: {GENERATE_MODE} SIZE CONTAINERS selfid|noid PATH");
        return ExitCode::FAILURE;
    };
    match synth::write_file(&torch_like(size, containers, self_id).spec, &path) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One measured child run.
#[derive(Clone, Copy)]
struct Sample {
    wall: Duration,
    cpu: Duration,
    maxrss_kib: u64,
}

/// Spawns `cmd` with stdout/stderr to files, reaps it with `wait4` and returns its own
/// rusage. Fails if the child cannot start or is killed by a signal.
fn run_child(cmd: &mut Command, out: &Path, err: &Path) -> Res<(Sample, i32)> {
    let stdout = File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let stderr = File::create(err).map_err(|e| format!("{}: {e}", err.display()))?;
    cmd.stdin(Stdio::null()).stdout(stdout).stderr(stderr);
    let support::Reaped {
        wall,
        status,
        rusage: ru,
    } = support::spawn_and_reap(cmd)?;
    if libc::WIFSIGNALED(status) {
        return Err(format!(
            "{:?} was killed by signal {}",
            cmd.get_program(),
            libc::WTERMSIG(status)
        ));
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    Ok((
        Sample {
            wall,
            cpu: tv(ru.ru_utime) + tv(ru.ru_stime),
            maxrss_kib: ru.ru_maxrss as u64,
        },
        libc::WEXITSTATUS(status),
    ))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Detect,
    Inspect,
    Grep,
    Scan,
    Cuobjdump,
    /// fdl's reader in process with the zstd front decoder, and with libzstd alone.
    ReadFront,
    ReadLibzstd,
}

struct Contender {
    role: Role,
    label: &'static str,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(&'static str, &'static str)>,
}

impl Contender {
    fn command(&self, file: &Path, cwd: &Path) -> Command {
        let mut c = Command::new(&self.program);
        for a in &self.args {
            if a == "{}" {
                c.arg(file);
            } else {
                c.arg(a);
            }
        }
        c.current_dir(cwd).env("NO_COLOR", "1");
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }
}

fn contenders(fdl: &Path, cuobjdump: Option<&Path>) -> Res<Vec<Contender>> {
    let me = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let mut v = vec![
        Contender {
            role: Role::Detect,
            label: "fdl nccl detect FILE",
            program: fdl.to_path_buf(),
            args: vec!["nccl".into(), "detect".into(), "{}".into()],
            env: vec![],
        },
        Contender {
            role: Role::Inspect,
            label: "fdl inspect FILE --archs 8.6 --json",
            program: fdl.to_path_buf(),
            args: vec![
                "inspect".into(),
                "{}".into(),
                "--archs".into(),
                "8.6".into(),
                "--json".into(),
            ],
            env: vec![],
        },
        Contender {
            role: Role::Grep,
            label: "LC_ALL=C grep -c 'NCCL version' FILE",
            program: PathBuf::from("grep"),
            args: vec![
                "-c".into(),
                String::from_utf8_lossy(NEEDLE).into_owned(),
                "{}".into(),
            ],
            // The C locale is grep's fastest mode: the strictest baseline for fdl.
            env: vec![("LC_ALL", "C")],
        },
        Contender {
            role: Role::Scan,
            label: "read whole file + byte-by-byte scan",
            program: me.clone(),
            args: vec![SCAN_MODE.into(), "{}".into()],
            env: vec![],
        },
    ];
    for (role, label, decoder) in [
        (Role::ReadFront, "fdl's reader, zstd front decoder", "front"),
        (
            Role::ReadLibzstd,
            "fdl's reader, libzstd first block",
            "libzstd",
        ),
    ] {
        v.push(Contender {
            role,
            label,
            program: me.clone(),
            args: vec![READ_MODE.into(), decoder.into(), "{}".into()],
            env: vec![],
        });
    }
    if let Some(c) = cuobjdump {
        v.push(Contender {
            role: Role::Cuobjdump,
            label: "cuobjdump --list-elf FILE",
            program: c.to_path_buf(),
            args: vec!["--list-elf".into(), "{}".into()],
            env: vec![],
        });
    }
    Ok(v)
}

/// What an input is expected to hold, when it is known.
struct Expect {
    self_id: Option<String>,
    sass: usize,
    ptx: usize,
}

struct Input {
    label: String,
    /// File name, for the summary.
    short: String,
    path: PathBuf,
    /// Synthetic, with the answers known; `None` for real libraries.
    expect: Option<Expect>,
    /// One of the 2 GB libraries the detection target is stated for.
    detect_target: bool,
}

/// Results of one contender on one input.
struct Row {
    role: Role,
    label: &'static str,
    samples: Vec<Sample>,
    /// Output of the untimed warm-up run, for the correctness checks.
    stdout: String,
    stderr: String,
    exit: i32,
}

impl Row {
    fn median_wall(&self) -> Duration {
        median(self.samples.iter().map(|s| s.wall))
    }
    fn median_cpu(&self) -> Duration {
        median(self.samples.iter().map(|s| s.cpu))
    }
    fn peak_rss_mib(&self) -> f64 {
        self.samples.iter().map(|s| s.maxrss_kib).max().unwrap_or(0) as f64 / 1024.0
    }
}

fn median(it: impl Iterator<Item = Duration>) -> Duration {
    let mut v: Vec<Duration> = it.collect();
    v.sort();
    match v.len() {
        0 => Duration::ZERO,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2,
    }
}

fn fmt_time(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "MET"
    } else {
        "NOT MET"
    }
}

/// How many timed runs a contender gets, from its warm-up time.
fn runs_for(warm: Duration) -> usize {
    match warm.as_secs_f64() {
        s if s < 0.5 => 11,
        s if s < 5.0 => 5,
        _ => 3,
    }
}

fn bench_input(input: &Input, contenders: &[Contender], work: &Path) -> Res<Vec<Row>> {
    let out = work.join("child.stdout");
    let err = work.join("child.stderr");
    let mut rows = Vec::new();
    // Untimed warm-up: pulls the file into the page cache and gives the output to check.
    for c in contenders {
        let (s, exit) = run_child(&mut c.command(&input.path, work), &out, &err)?;
        rows.push(Row {
            role: c.role,
            label: c.label,
            samples: Vec::with_capacity(runs_for(s.wall)),
            stdout: std::fs::read_to_string(&out).unwrap_or_default(),
            stderr: std::fs::read_to_string(&err).unwrap_or_default(),
            exit,
        });
    }
    // Timed runs, round-robin so that background load spreads over all contenders.
    let want: Vec<usize> = rows.iter().map(|r| r.samples.capacity()).collect();
    let rounds = want.iter().copied().max().unwrap_or(0);
    for round in 0..rounds {
        for (i, c) in contenders.iter().enumerate() {
            if round < want[i] {
                let (s, _) = run_child(&mut c.command(&input.path, work), &out, &err)?;
                rows[i].samples.push(s);
            }
        }
    }
    Ok(rows)
}

/// Correctness of each contender's answer on `input`; returns (all good, report lines).
fn check(input: &Input, rows: &[Row]) -> (bool, Vec<String>) {
    let mut ok = true;
    let mut lines = Vec::new();
    let mut line = |good: bool, text: String| {
        ok &= good;
        lines.push(format!(
            "  {} {text}",
            if good { "ok          " } else { "CHECK FAILED" }
        ));
    };
    let row = |role| rows.iter().find(|r| r.role == role);
    // The two zstd decoders must name the same cubins.
    if let (Some(f), Some(l)) = (row(Role::ReadFront), row(Role::ReadLibzstd)) {
        let counts = |r: &Row| {
            r.stdout
                .split_whitespace()
                .take(4)
                .collect::<Vec<_>>()
                .join(" ")
        };
        line(
            f.exit == 0 && l.exit == 0 && counts(f) == counts(l) && !counts(f).is_empty(),
            format!(
                "fdl's reader with either zstd decoder: {} / {}",
                f.stdout.trim(),
                l.stdout.trim()
            ),
        );
    }
    let scan_ids: Vec<String> = row(Role::Scan)
        .map(|r| {
            r.stdout
                .lines()
                .filter_map(|l| l.strip_prefix("self-id "))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let scan_matches: Option<usize> = row(Role::Scan).and_then(|r| {
        r.stdout
            .lines()
            .find_map(|l| l.strip_prefix("matches "))
            .and_then(|n| n.parse().ok())
    });
    // What the file really carries: known for synthetic inputs, else the byte scan's
    // finding when it is unambiguous.
    let truth: Option<Option<String>> = match &input.expect {
        Some(e) => Some(e.self_id.clone()),
        None if scan_ids.len() <= 1 => Some(scan_ids.first().cloned()),
        None => None,
    };

    let detected = row(Role::Detect).map(|r| (r, parse_detect(&r.stdout)));
    if let Some((r, d)) = &detected {
        let shown = d.clone().unwrap_or_else(|| "not found".into());
        match (&truth, r.exit) {
            (_, code) if code != 0 => line(
                false,
                format!("fdl nccl detect exited {code}: {}", r.stderr.trim()),
            ),
            // A pip-style library loads NCCL: the answer is that libnccl's, which the byte
            // scan of this file alone cannot see.
            (_, _) if r.stdout.contains("linkage   dynamic") => line(
                d.is_some(),
                format!("fdl nccl detect -> {shown} (dynamic: from the libnccl it loads)"),
            ),
            (Some(t), _) => line(
                t == d,
                format!(
                    "fdl nccl detect -> {shown} (expected {})",
                    t.clone().unwrap_or_else(|| "not found".into())
                ),
            ),
            (None, _) => line(true, format!("fdl nccl detect -> {shown}")),
        }
    }

    let mut fdl_sass = None;
    if let Some(r) = row(Role::Inspect) {
        match serde_json::from_str::<serde_json::Value>(&r.stdout) {
            Ok(v) if r.exit == 0 => {
                let total = |key: &str| {
                    v["inspection"]["gpu_code"][key]
                        .as_array()
                        .map(|a| a.iter().filter_map(|e| e["count"].as_u64()).sum::<u64>())
                        .unwrap_or(0) as usize
                };
                let (sass, ptx) = (total("sass"), total("ptx"));
                fdl_sass = Some(sass);
                let nccl = json_self_id(&v["inspection"]["nccl"]);
                let warnings = v["inspection"]["gpu_code"]["warnings"]
                    .as_array()
                    .map_or(0, Vec::len);
                let text = format!(
                    "fdl inspect -> {sass} SASS, {ptx} PTX entries, NCCL {}, {warnings} fatbin warnings",
                    nccl.clone().unwrap_or_else(|| "none".into())
                );
                match &input.expect {
                    Some(e) => line(
                        sass == e.sass && ptx == e.ptx && nccl == e.self_id && warnings == 0,
                        format!(
                            "{text} (expected {} SASS, {} PTX, NCCL {})",
                            e.sass,
                            e.ptx,
                            e.self_id.clone().unwrap_or_else(|| "none".into())
                        ),
                    ),
                    None => match &truth {
                        Some(t) => line(
                            nccl == *t,
                            format!(
                                "{text} (byte scan: NCCL {})",
                                t.clone().unwrap_or_else(|| "none".into())
                            ),
                        ),
                        None => line(true, text),
                    },
                }
            }
            _ => line(
                false,
                format!(
                    "fdl inspect exited {} without valid JSON: {}",
                    r.exit,
                    r.stderr.trim()
                ),
            ),
        }
    }

    if let Some(r) = row(Role::Grep) {
        // grep -c counts lines holding the needle; binary files have few, long "lines".
        let n = r.stdout.trim();
        line(
            r.exit <= 1 && n.parse::<usize>().is_ok(),
            format!("grep -c -> {n} matching lines (exit {})", r.exit),
        );
    }

    if let Some(r) = row(Role::Scan) {
        let text = format!(
            "byte scan -> {} needle matches, self-ids {:?}",
            scan_matches.map_or("?".into(), |n| n.to_string()),
            scan_ids
        );
        match &input.expect {
            Some(e) => {
                let want = FLOOR_MATCHES + usize::from(e.self_id.is_some());
                let ids_ok = scan_ids == e.self_id.iter().cloned().collect::<Vec<_>>();
                line(
                    r.exit == 0 && scan_matches == Some(want) && ids_ok,
                    format!("{text} (expected {want} matches)"),
                );
            }
            None => line(r.exit == 0 && scan_matches.is_some(), text),
        }
    }

    if let Some(r) = row(Role::Cuobjdump) {
        let listed = r
            .stdout
            .lines()
            .filter(|l| l.starts_with("ELF file"))
            .count();
        let same = fdl_sass == Some(listed);
        line(
            r.exit == 0 && same,
            format!(
                "cuobjdump --list-elf -> {listed} cubins (fdl inspect: {}){}",
                fdl_sass.map_or("?".into(), |n| n.to_string()),
                if r.exit != 0 {
                    format!(", exit {}: {}", r.exit, r.stderr.trim())
                } else {
                    String::new()
                }
            ),
        );
    }
    (ok, lines)
}

/// `{"version": "2.27.5", "cuda": "12.9"}` → `2.27.5+cuda12.9` (JSON writes versions
/// as strings); `None` when there is no detection.
fn json_self_id(d: &serde_json::Value) -> Option<String> {
    Some(format!(
        "{}+cuda{}",
        d["version"].as_str()?,
        d["cuda"].as_str()?
    ))
}

/// `NCCL 2.27.5 (built with CUDA 12.9)` → `2.27.5+cuda12.9`; `None` for "No NCCL in".
fn parse_detect(stdout: &str) -> Option<String> {
    let first = stdout.lines().next()?;
    let rest = first.strip_prefix("NCCL ")?;
    let (ver, rest) = rest.split_once(" (built with CUDA ")?;
    Some(format!("{ver}+cuda{}", rest.trim_end_matches(')')))
}

/// A cached synthetic input.
struct SynthSpec {
    size: u64,
    containers: usize,
    name: String,
    label: String,
    spec: synth::Spec,
}

fn torch_like(target_size: u64, containers: usize, self_id: bool) -> SynthSpec {
    let g = |n: u32| GpuTarget {
        arch: Arch::from_number(n),
        variant: Variant::Generic,
    };
    let sass: Vec<GpuTarget> = SASS_ARCHS.iter().map(|&n| g(n)).collect();
    let ptx: Vec<GpuTarget> = PTX_ARCHS.iter().map(|&n| g(n)).collect();
    // ~10% of the file is .rodata strings, the rest the fatbin: entries are sized so the
    // file lands near the target (64-80 byte headers, then LZ4 blocks that decode to
    // `LZ4_EXPANSION` times their size, as real libtorch_cuda.so blocks do).
    let rodata = target_size / 10;
    let entries = (containers * (sass.len() + ptx.len())) as u64;
    let per_entry = (target_size - rodata) / entries;
    let payload = ((per_entry.saturating_sub(96)) as f64 * synth::LZ4_EXPANSION) as u64;
    // PyTorch builds with `-Xfatbin -compress-all`, so entries are LZ4-compressed.
    let mut spec = synth::Spec::torch_like(&sass, &ptx, containers, payload, true);
    spec.rodata_padding = rodata;
    spec.floor_messages = true;
    spec.self_id = self_id.then(|| SELF_ID.to_string());
    let mb = target_size >> 20;
    let tag = if self_id { "selfid" } else { "noid" };
    SynthSpec {
        size: target_size,
        containers,
        name: format!("torch-like-{mb}M-{tag}.so"),
        label: format!(
            "synthetic libtorch_cuda-like, {} MiB, {}",
            mb,
            if self_id {
                format!("self-id {SELF_ID} at the end of .rodata")
            } else {
                "no self-id (floor messages only)".to_string()
            }
        ),
        spec,
    }
}

/// FNV-1a over whatever is written into it, for the cache stamp: hashing a `Debug`
/// rendering as it streams keeps this process (the RSS floor of every child) small.
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

impl std::fmt::Write for Fnv {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.update(s.as_bytes());
        Ok(())
    }
}

/// Describes what a cached file must be: the recipe, the spec, and the synthesizer's
/// current output for a miniature of the same spec (so a change in `synth` that alters
/// the bytes also invalidates the cache).
fn stamp(s: &SynthSpec) -> String {
    let mut mini = s.spec.clone();
    mini.entries.truncate(2 * mini.entries_per_container.max(1));
    for e in &mut mini.entries {
        e.payload_size = e.payload_size.min(2000); // long enough for LZ4 matches
    }
    mini.rodata_padding = mini.rodata_padding.min(1000);
    let mut spec = Fnv::new();
    write!(spec, "{:?}", s.spec).ok();
    let mut bytes = Fnv::new();
    bytes.update(&synth::to_vec(&mini));
    format!(
        "recipe {RECIPE}\nspec {:016x}\nsynth {:016x}\n",
        spec.0, bytes.0
    )
}

/// Writes the file unless an up-to-date copy is cached; returns its path and size.
fn ensure(dir: &Path, s: &SynthSpec) -> Res<(PathBuf, u64)> {
    let path = dir.join(&s.name);
    let stamp_path = dir.join(format!("{}.stamp", s.name));
    let want = stamp(s);
    let size_now = std::fs::metadata(&path).map(|m| m.len()).ok();
    let stamp_now = std::fs::read_to_string(&stamp_path).ok();
    if let (Some(size), Some(st)) = (size_now, &stamp_now) {
        if *st == format!("{want}size {size}\n") {
            println!("  cached     {}", path.display());
            return Ok((path, size));
        }
    }
    print!("  generating {} ...", path.display());
    let _ = std::io::stdout().flush();
    let t = Instant::now();
    let _ = std::fs::remove_file(&stamp_path);
    let tmp = dir.join(format!("{}.tmp", s.name));
    // In a child, so that the write buffers never raise this process's peak RSS.
    let me = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let out = Command::new(me)
        .arg(GENERATE_MODE)
        .arg(s.size.to_string())
        .arg(s.containers.to_string())
        .arg(if s.spec.self_id.is_some() {
            "selfid"
        } else {
            "noid"
        })
        .arg(&tmp)
        .output()
        .map_err(|e| format!("cannot start the generator: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "generating {} failed: {}",
            tmp.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let size = std::fs::metadata(&tmp)
        .map_err(|e| format!("{}: {e}", tmp.display()))?
        .len();
    std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::write(&stamp_path, format!("{want}size {size}\n"))
        .map_err(|e| format!("{}: {e}", stamp_path.display()))?;
    println!(" {} MiB in {}", size >> 20, fmt_time(t.elapsed()));
    Ok((path, size))
}

fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FDL_BENCH_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("fdl-bench");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
    PathBuf::from(home).join(".cache").join("fdl-bench")
}

/// Where `.ci/fetch-oracles` unpacks its wheels: `$FDL_ORACLE_CACHE/unpacked`, by default
/// `~/.cache/fdl-wheels/unpacked`.
fn oracle_dir() -> Option<PathBuf> {
    std::env::var_os("FDL_ORACLE_CACHE")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/fdl-wheels")))
        .map(|d| d.join("unpacked"))
}

const CUOBJDUMP_WHEEL: &str = "cuobjdump-13.5.37/nvidia/cu13/bin/cuobjdump";
/// The real libraries `.ci/fetch-oracles` provides: the variable it exports each one in,
/// and where it unpacks it (under [`oracle_dir`]) for a run without its variables.
/// torch 2.8.0's libtorch_cuda.so (CUDA 12.8, LZ4 fatbin, NCCL loaded from the pip NCCL),
/// torch 2.15.0's (CUDA 13.2, 2,981 cubins) and the NCCL 2.30.7 pip put beside it, NCCL's
/// CUDA 12 build (LZ4) and CUDA 13 builds (zstd), 2.28.9 and the newest, 2.32.3.
const REAL_WHEELS: [(&str, &str); 6] = [
    (
        "FDL_TEST_TORCH_LIB",
        "torch-2.8.0/torch/lib/libtorch_cuda.so",
    ),
    (
        "FDL_TEST_TORCH_LIB_CU13",
        "torch-2.15.0/torch/lib/libtorch_cuda.so",
    ),
    ("", "torch-2.15.0/nvidia/nccl/lib/libnccl.so.2"),
    (
        "FDL_TEST_NCCL_LIB",
        "nccl-2.27.5/nvidia/nccl/lib/libnccl.so.2",
    ),
    (
        "FDL_TEST_NCCL_LIB_CU13",
        "nccl-cu13-2.28.9/nvidia/nccl/lib/libnccl.so.2",
    ),
    (
        "FDL_TEST_NCCL_LIB_CU13_NEWEST",
        "nccl-cu13-2.32.3/nvidia/nccl/lib/libnccl.so.2",
    ),
];

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `FDL_BENCH_CUOBJDUMP`, `FDL_TEST_CUOBJDUMP`, `cuobjdump` on PATH, the pinned wheel.
fn find_cuobjdump() -> Option<PathBuf> {
    for var in ["FDL_BENCH_CUOBJDUMP", "FDL_TEST_CUOBJDUMP"] {
        if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
            return Some(PathBuf::from(p));
        }
    }
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("cuobjdump"))
            .find(|p| is_executable(p))
    });
    on_path.or_else(|| {
        oracle_dir()
            .map(|d| d.join(CUOBJDUMP_WHEEL))
            .filter(|p| is_executable(p))
    })
}

fn real_libraries() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::env::var_os("FDL_BENCH_REAL")
        .map(|s| {
            std::env::split_paths(&s)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default();
    let dir = oracle_dir();
    for (var, wheel) in REAL_WHEELS {
        let from_env = std::env::var_os(var)
            .filter(|p| !var.is_empty() && !p.is_empty())
            .map(PathBuf::from);
        let path = from_env.or_else(|| dir.as_ref().map(|d| d.join(wheel)));
        if let Some(path) = path.filter(|p| p.is_file()) {
            if !v.iter().any(|p| same_file(p, &path)) {
                v.push(path);
            }
        }
    }
    v
}

fn same_file(a: &Path, b: &Path) -> bool {
    matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

/// First line of `prog ARGS` (stdout, else stderr), for the header.
fn tool_version(prog: &Path, args: &[&str], last_line: bool) -> String {
    match Command::new(prog).args(args).output() {
        Ok(o) => {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            let text = String::from_utf8_lossy(&text).into_owned();
            let line = if last_line {
                text.lines().rfind(|l| !l.trim().is_empty())
            } else {
                text.lines().next()
            };
            line.unwrap_or("?").trim().to_string()
        }
        Err(e) => format!("unavailable ({e})"),
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "?".into())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// This process's own peak RSS in KiB. A child spawned by vfork+exec inherits its
/// parent's high-water mark into `ru_maxrss`, so this is the floor of every reading.
fn own_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// UTC date and time, from the system clock (no date crate needed).
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian, 400-year eras).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rem / 3600,
        (rem % 3600) / 60
    )
}

/// Per-input ratios, kept for the summary.
struct Ratios {
    input: String,
    detect_target: bool,
    detect_over_grep: Option<f64>,
    cuobjdump_over_inspect: Option<f64>,
    fdl_rss_mib: f64,
}

fn print_table(rows: &[Row]) {
    println!(
        "  {:<38} {:>4} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "contender", "runs", "median", "min", "max", "cpu(med)", "peak RSS"
    );
    let floor_mib = own_hwm_kib() as f64 / 1024.0;
    let mut at_floor = false;
    for r in rows {
        let min = r.samples.iter().map(|s| s.wall).min().unwrap_or_default();
        let max = r.samples.iter().map(|s| s.wall).max().unwrap_or_default();
        let rss = r.peak_rss_mib();
        let mark = if rss <= floor_mib { "*" } else { "" };
        at_floor |= rss <= floor_mib;
        println!(
            "  {:<38} {:>4} {:>10} {:>10} {:>10} {:>10} {:>6.1} MiB{mark}",
            r.label,
            r.samples.len(),
            fmt_time(r.median_wall()),
            fmt_time(min),
            fmt_time(max),
            fmt_time(r.median_cpu()),
            rss
        );
    }
    if at_floor {
        println!(
            "  * at the floor: the child's ru_maxrss includes this benchmark's own peak ({floor_mib:.1} MiB), so its real peak is at most that"
        );
    }
}

fn ratios(input: &Input, rows: &[Row]) -> Ratios {
    let row = |role| rows.iter().find(|r: &&Row| r.role == role);
    let t = |role| row(role).map(|r| r.median_wall().as_secs_f64());
    let detect_over_grep = match (t(Role::Detect), t(Role::Grep)) {
        (Some(d), Some(g)) if g > 0.0 => Some(d / g),
        _ => None,
    };
    let cuobjdump_over_inspect = match (t(Role::Cuobjdump), t(Role::Inspect)) {
        (Some(c), Some(i)) if i > 0.0 => Some(c / i),
        _ => None,
    };
    let fdl_rss_mib = rows
        .iter()
        .filter(|r| matches!(r.role, Role::Detect | Role::Inspect))
        .map(Row::peak_rss_mib)
        .fold(0.0, f64::max);
    Ratios {
        input: input.short.clone(),
        detect_target: input.detect_target,
        detect_over_grep,
        cuobjdump_over_inspect,
        fdl_rss_mib,
    }
}

fn print_ratios(r: &Ratios) {
    match r.detect_over_grep {
        Some(x) => println!(
            "  detect / grep time       = {x:.3}   (target < {DETECT_OVER_GREP_MAX:.2}{}) {}",
            if r.detect_target {
                ", stated for the 2 GB library"
            } else {
                ""
            },
            verdict(x < DETECT_OVER_GREP_MAX)
        ),
        None => println!("  detect / grep time       = n/a"),
    }
    match r.cuobjdump_over_inspect {
        Some(x) => println!(
            "  cuobjdump / inspect time = {x:.1}x  (target >= {CUOBJDUMP_OVER_INSPECT_MIN:.0}x) {}",
            verdict(x >= CUOBJDUMP_OVER_INSPECT_MIN)
        ),
        None => println!("  cuobjdump / inspect time = n/a (no cuobjdump)"),
    }
    println!(
        "  fdl peak RSS (max of detect, inspect) = {:.1} MiB (target < {RSS_MAX_MIB:.0} MiB) {}",
        r.fdl_rss_mib,
        verdict(r.fdl_rss_mib < RSS_MAX_MIB)
    );
}

/// What the zstd front decoder saves against libzstd decoding each cubin's first
/// block, both in fdl's reader alone (no CLI), on the same input.
fn print_zstd_decoders(rows: &[Row]) {
    let row = |role| rows.iter().find(|r: &&Row| r.role == role);
    if let (Some(front), Some(lib)) = (row(Role::ReadFront), row(Role::ReadLibzstd)) {
        let (f, l) = (front.median_wall(), lib.median_wall());
        println!(
            "  zstd decoders: libzstd first block {} vs front decoder {} wall ({} vs {} cpu): the front decoder saves {} wall",
            fmt_time(l),
            fmt_time(f),
            fmt_time(lib.median_cpu()),
            fmt_time(front.median_cpu()),
            fmt_time(l.saturating_sub(f))
        );
    }
}

fn run() -> Res<bool> {
    let flag = |var: &str| std::env::var_os(var).is_some_and(|v| !v.is_empty() && v != "0");
    let quick = flag("FDL_BENCH_QUICK");
    // Only the real libraries: no generated inputs (and so no verdict on target 1).
    let real_only = flag("FDL_BENCH_REAL_ONLY");
    let fdl = PathBuf::from(env!("CARGO_BIN_EXE_fdl"));
    let cuobjdump = find_cuobjdump();
    let dir = cache_dir();
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let work = dir.join("work");
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;

    println!(
        "fdl inspection benchmark ({} mode)",
        if real_only {
            "REAL-ONLY"
        } else if quick {
            "QUICK"
        } else {
            "full"
        }
    );
    println!("  date       {}", utc_now());
    println!(
        "  machine    {} online CPUs, {}, kernel {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model(),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    println!("  load avg   {} (at start)", loadavg());
    println!(
        "  fdl        {} ({})",
        fdl.display(),
        tool_version(&fdl, &["--version"], false)
    );
    println!(
        "  grep       {}",
        tool_version(Path::new("grep"), &["--version"], false)
    );
    match &cuobjdump {
        Some(c) => println!(
            "  cuobjdump  {} ({})",
            c.display(),
            tool_version(c, &["--version"], true)
        ),
        None => {
            println!("  cuobjdump  not found (set FDL_BENCH_CUOBJDUMP): that contender is skipped")
        }
    }
    println!("  inputs in  {}", dir.display());
    println!(
        "  method     each contender is a child process; wall time spawn..reap, median of the \
         timed runs (11 if the warm-up took < 0.5 s, 5 if < 5 s, else 3), round-robin; \
         peak RSS = max ru_maxrss from wait4 over the runs"
    );
    println!(
        "  caching    files are WARM in the page cache (every contender runs once untimed \
         first); caches are not dropped, so disk speed is not measured"
    );

    let specs: Vec<(SynthSpec, bool)> = if real_only {
        Vec::new()
    } else if quick {
        vec![
            (torch_like(64 << 20, 32, true), false),
            (torch_like(64 << 20, 32, false), false),
        ]
    } else {
        vec![
            (torch_like(512 << 20, 256, true), false),
            (torch_like(512 << 20, 256, false), false),
            (torch_like(2048 << 20, 1024, true), true),
            (torch_like(2048 << 20, 1024, false), true),
        ]
    };
    println!("\ninputs:");
    let mut inputs = Vec::new();
    for (s, detect_target) in &specs {
        let (path, size) = ensure(&dir, s)?;
        let containers = s.spec.entries.len() / s.spec.entries_per_container.max(1);
        inputs.push(Input {
            label: format!(
                "{} ({size} bytes; .rodata {} MiB; {} fatbin entries in {containers} containers, LZ4 blocks decoding to {:.1} GB)",
                s.label,
                s.spec.rodata_padding >> 20,
                s.spec.entries.len(),
                s.spec.entries.iter().map(|e| e.payload_size).sum::<u64>() as f64 / 1e9,
            ),
            short: s.name.clone(),
            path,
            expect: Some(Expect {
                self_id: s.spec.self_id.clone(),
                sass: containers * SASS_ARCHS.len(),
                ptx: containers * PTX_ARCHS.len(),
            }),
            detect_target: *detect_target,
        });
    }
    for p in real_libraries() {
        match std::fs::metadata(&p) {
            Ok(m) => {
                println!("  real       {}", p.display());
                inputs.push(Input {
                    label: format!("real library {} ({} bytes)", p.display(), m.len()),
                    short: format!(
                        "real {}",
                        p.file_name().unwrap_or_default().to_string_lossy()
                    ),
                    path: p,
                    expect: None,
                    detect_target: false,
                });
            }
            Err(e) => println!("  real       {} skipped: {e}", p.display()),
        }
    }

    let contenders = contenders(&fdl, cuobjdump.as_deref())?;
    // Process start alone, for reading the fdl rows: what any fdl run costs at least.
    let start_ref = Contender {
        role: Role::Detect,
        label: "fdl --version",
        program: fdl.clone(),
        args: vec!["--version".into()],
        env: vec![],
    };
    let mut start_samples = Vec::new();
    for _ in 0..12 {
        let (s, _) = run_child(
            &mut start_ref.command(Path::new(""), &work),
            &work.join("child.stdout"),
            &work.join("child.stderr"),
        )?;
        start_samples.push(s);
    }
    start_samples.remove(0);
    println!(
        "\nreference: `fdl --version` (process start, no file) median {} wall, {} cpu, {:.1} MiB peak RSS \
         (this benchmark's own peak, a floor for every RSS reading: {:.1} MiB)",
        fmt_time(median(start_samples.iter().map(|s| s.wall))),
        fmt_time(median(start_samples.iter().map(|s| s.cpu))),
        start_samples.iter().map(|s| s.maxrss_kib).max().unwrap_or(0) as f64 / 1024.0,
        own_hwm_kib() as f64 / 1024.0
    );

    let mut all_ok = true;
    let mut summary = Vec::new();
    for input in &inputs {
        println!("\n== {}", input.label);
        println!("   {}", input.path.display());
        let rows = bench_input(input, &contenders, &work)?;
        print_table(&rows);
        let (ok, lines) = check(input, &rows);
        all_ok &= ok;
        println!("  correctness:");
        for l in lines {
            println!("{l}");
        }
        let r = ratios(input, &rows);
        println!("  ratios:");
        print_ratios(&r);
        print_zstd_decoders(&rows);
        println!("  load avg {}", loadavg());
        summary.push(r);
    }

    println!("\n== summary (worst case over the inputs each target applies to)");
    let mut text = String::new();
    let worst = |f: &dyn Fn(&Ratios) -> Option<f64>, pick_max: bool, only_target: bool| {
        summary
            .iter()
            .filter(|r| !only_target || r.detect_target)
            .filter_map(|r| f(r).map(|x| (x, r.input.clone())))
            .reduce(|a, b| if (b.0 > a.0) == pick_max { b } else { a })
    };
    match worst(&|r| r.detect_over_grep, true, true) {
        Some((x, at)) => writeln!(
            text,
            "  1. NCCL detection on the 2 GB library < {:.0}% of grep's time: {} (worst {:.1}% on {at})",
            DETECT_OVER_GREP_MAX * 100.0,
            verdict(x < DETECT_OVER_GREP_MAX),
            x * 100.0
        ),
        None => writeln!(
            text,
            "  1. NCCL detection on the 2 GB library < {:.0}% of grep's time: NOT EVALUATED (no 2 GB input{})",
            DETECT_OVER_GREP_MAX * 100.0,
            if real_only {
                " with FDL_BENCH_REAL_ONLY"
            } else if quick {
                " in quick mode"
            } else {
                ""
            }
        ),
    }
    .ok();
    match worst(&|r| r.cuobjdump_over_inspect, false, false) {
        Some((x, at)) => writeln!(
            text,
            "  2. architecture listing >= {CUOBJDUMP_OVER_INSPECT_MIN:.0}x faster than cuobjdump --list-elf: {} (worst {x:.1}x on {at})",
            verdict(x >= CUOBJDUMP_OVER_INSPECT_MIN)
        ),
        None => writeln!(
            text,
            "  2. architecture listing >= {CUOBJDUMP_OVER_INSPECT_MIN:.0}x faster than cuobjdump --list-elf: NOT EVALUATED (no cuobjdump)"
        ),
    }
    .ok();
    if let Some((x, at)) = worst(&|r| Some(r.fdl_rss_mib), true, false) {
        writeln!(
            text,
            "  3. fdl peak RSS < {RSS_MAX_MIB:.0} MiB whatever the file size: {} (worst {x:.1} MiB on {at})",
            verdict(x < RSS_MAX_MIB)
        )
        .ok();
    }
    print!("{text}");
    println!(
        "  correctness of every contender's answer: {}",
        if all_ok {
            "all checks ok"
        } else {
            "SOME CHECKS FAILED (see above)"
        }
    );
    println!(
        "  note: ru_maxrss of a child includes the benchmark process's own peak ({:.1} MiB) as a floor",
        own_hwm_kib() as f64 / 1024.0
    );
    println!("  load avg {} (at end)", loadavg());
    Ok(all_ok)
}
