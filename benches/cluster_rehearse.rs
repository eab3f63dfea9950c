//! `fdl cluster rehearse` on three hosts beside `fdl cluster status` on the same hosts, in
//! one run, interleaved; the target is the rehearsal within 2x status. Reported, never
//! asserted by a test.
//!
//! The hosts are the tests' (tests/cluster_fixture): Debian containers with a real sshd
//! on 127.0.0.1 ports and a stand-in nvidia-smi, all three on one Docker network made
//! here. Each worker's libtorch is laid out as the rehearsal tests' is
//! (tests/cluster_fixture/bootstrap.rs): a small `libtorch_cuda.so` made here, with sm_86
//! kernels so that status judges the coverage, that links the real `libnccl.so.2` of
//! `nvidia-nccl-cu12` 2.27.5 (`FDL_TEST_NCCL_LIB`, from `.ci/fetch-oracles`),
//! bind-mounted where its DT_RPATH finds it, as pip lays torch out. Without that variable
//! the bench says NOT EVALUATED and ends with 0.
//!
//! After a warm-up (status, which ships fdl to the hosts, then the rehearsal), RUNS rounds
//! each run both commands with one cache (`XDG_CACHE_HOME`, so within ControlPersist:
//! warm), then both with a fresh cache each (cold: no shared connection yet), the order
//! alternating from round to round so that background load spreads over both. Every
//! rehearsal must say `state: ok`, with the four connections made and each worker's
//! address its own on the bench's network (NCCL's own choice, read once by the tests'
//! oracle, must agree); status must exit 0. Anything else is a wrong answer: exit 1.
//!
//! Then, to say where the time goes, the workers' parts are timed alone on host a, in
//! one shell there (RUNS rounds, round-robin): an fdl process (`--version`), status's
//! report (`cluster self`), the rehearsal's first part (`cluster bootstrap-self`: the
//! loader model, then its child) and that child alone (`cluster bootstrap-child`: the
//! real NCCL loaded, `ncclGetUniqueId`); and the slowest connection of each warm
//! rehearsal, as its worker reports it.
//!
//! `cargo bench --bench cluster_rehearse`; it needs the Docker engine and debootstrap
//! (the sshd image is made once and kept). `FDL_BENCH_RUNS` sets RUNS (default 7);
//! `FDL_BENCH_FDL` names another fdl binary to measure (a build of a change). Each
//! host's /tmp is a tmpfs of its own; `FDL_BENCH_ROOTFS_TMP=1` leaves it on the
//! container's root file system (see BENCHMARKS.md: on fuse-overlayfs that adds ~0.5 s
//! to each worker's report, status's and the rehearsal's alike).

#[path = "../tests/cluster_fixture/mod.rs"]
mod cluster_fixture;
#[path = "../tests/common/mod.rs"]
mod common;

use cluster_fixture::bootstrap::{self, Network, Parts};
use cluster_fixture::{Host, Keys};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The workers' checkout.
const PATH: &str = "/opt/flodl";

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// A wrong answer: what was wrong, and the command's output.
fn wrong(what: &str, out: &std::process::Output) -> String {
    format!(
        "{what}:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn fdl(root: &Path, cache: &Path, command: &str) -> (Duration, std::process::Output) {
    let fdl = std::env::var_os("FDL_BENCH_FDL").unwrap_or_else(|| env!("CARGO_BIN_EXE_fdl").into());
    let start = Instant::now();
    let out = Command::new(fdl)
        .arg("--root")
        .arg(root)
        .args(["cluster", command, "--json"])
        .env("XDG_CACHE_HOME", cache)
        .output()
        .unwrap();
    (start.elapsed(), out)
}

fn status(root: &Path, cache: &Path) -> Result<Duration, String> {
    let (took, out) = fdl(root, cache, "status");
    if !out.status.success() {
        return Err(wrong("status was not green on healthy hosts", &out));
    }
    Ok(took)
}

/// The rehearsal, checked: green, every pair connected, and each worker's address its
/// own on the bench's network (`addresses`, in the workers' order). `may_ship`: whether
/// shipping fdl is allowed (the warm-up only). Its time, and its slowest connection's
/// (the `ms` the connecting worker reports: its tries, from its start).
fn rehearse(
    root: &Path,
    cache: &Path,
    addresses: &[String],
    may_ship: bool,
) -> Result<(Duration, Duration), String> {
    let (took, out) = fdl(root, cache, "rehearse");
    let v: serde_json::Value = match serde_json::from_slice(&out.stdout) {
        Ok(v) => v,
        Err(_) => return Err(wrong("rehearse gave no JSON", &out)),
    };
    if v["state"] != "ok" || !out.status.success() {
        return Err(wrong(
            "rehearse was not green on three hosts of one network",
            &out,
        ));
    }
    let workers = v["workers"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    if workers.len() != addresses.len() {
        return Err(wrong("rehearse did not answer for every worker", &out));
    }
    for (w, want) in workers.iter().zip(addresses) {
        let outcome = &w["bootstrap"]["outcome"];
        let ip = outcome["address"]
            .as_str()
            .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
            .map(|a| a.ip().to_string());
        if outcome["state"] != "chosen" || ip.as_deref() != Some(want.as_str()) {
            return Err(wrong(
                &format!(
                    "{}'s NCCL did not choose its address on the network ({want})",
                    w["host"]
                ),
                &out,
            ));
        }
        if w["shipped_fdl"] != false && !may_ship {
            return Err(wrong(
                "a timed rehearsal shipped fdl (the warm-up should have)",
                &out,
            ));
        }
    }
    let pairs = v["pairs"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    if pairs.len() != 2 * (addresses.len() - 1)
        || pairs.iter().any(|p| p["result"]["state"] != "yes")
    {
        return Err(wrong("rehearse did not connect every pair", &out));
    }
    let slowest = pairs
        .iter()
        .filter_map(|p| p["result"]["ms"].as_u64())
        .max()
        .unwrap_or(0);
    Ok((took, Duration::from_millis(slowest)))
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("cluster_rehearse: run with `cargo bench --bench cluster_rehearse`");
        return;
    }
    let runs: usize = std::env::var("FDL_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(7);
    let Some(nccl) = std::env::var_os("FDL_TEST_NCCL_LIB").filter(|v| !v.is_empty()) else {
        println!(
            "cluster_rehearse: NOT EVALUATED: FDL_TEST_NCCL_LIB is not set (the real libnccl.so.2 `.ci/fetch-oracles` provides)"
        );
        return;
    };
    let nccl = std::fs::canonicalize(nccl).unwrap();
    // The hosts and their network live in `measure`: dropped (removed) before the exit.
    if let Err(why) = measure(&nccl, runs) {
        eprintln!("cluster_rehearse: {why}");
        std::process::exit(1);
    }
}

fn measure(nccl: &Path, runs: usize) -> Result<(), String> {
    let parts = Parts::new(nccl);
    // The rehearsal tests' libtorch with sm_86 kernels too, so that status judges the
    // coverage (green, not unknown): the same NCCL calls, DT_NEEDED and DT_RPATH.
    let libtorch = parts.dir.path().join("libtorch_cuda_sm86.so");
    common::compile_shared(
        &format!(
            "int ncclGetUniqueId(void *);\nint ncclGetVersion(int *);\n\
             int fdl_test_torch_init(void *id) {{ int v = 0; ncclGetVersion(&v); return ncclGetUniqueId(id) + v * 0; }}\n{}",
            common::fatbin_c_source(&[86], "fdl_bench_fatbin")
        ),
        &libtorch,
        &[
            &nccl.display().to_string(),
            "-Wl,--disable-new-dtags",
            "-Wl,-rpath,$ORIGIN/../../nvidia/nccl/lib",
            "-Wl,-soname,libtorch_cuda.so",
        ],
    );
    let keys = Keys::new();
    // Declared before the hosts: dropped after them.
    let net = Network::new("rehearse-bench", false);
    let mut docker_args: Vec<String> = vec!["--network".into(), net.name.clone()];
    if std::env::var_os("FDL_BENCH_ROOTFS_TMP").is_none() {
        // A /tmp of its own in memory, as on many hosts: on an engine whose storage is
        // fuse-overlayfs, each write to the container's own /tmp crosses FUSE, and the
        // loader witness (on both sides: status's report and the rehearsal's first part)
        // writes its trace there in ~6,000 small writes, ~0.5 s a worker here.
        docker_args.extend(["--tmpfs".into(), "/tmp:rw,exec,size=256m".into()]);
    }
    docker_args.extend(parts.mount_args(PATH));
    let docker_args: Vec<&str> = docker_args.iter().map(String::as_str).collect();
    let gpus: [Vec<(&str, &str, u32)>; 3] = [
        vec![("NVIDIA GeForce RTX 3090", "8.6", 24576)],
        vec![("NVIDIA GeForce RTX 3090", "8.6", 24576)],
        vec![
            ("NVIDIA GeForce RTX 3090", "8.6", 24576),
            ("NVIDIA GeForce RTX 3090", "8.6", 24576),
        ],
    ];
    let hosts: Vec<Host> = ["a", "b", "c"]
        .iter()
        .zip(&gpus)
        .map(|(label, g)| {
            let h = Host::start_with(label, &keys, &docker_args);
            h.fake_nvidia_smi(g, "570.133.07", "12.8");
            parts.install(&h, PATH);
            h.put(
                &libtorch,
                &format!(
                    "{PATH}/libtorch/{}/lib/libtorch_cuda.so",
                    bootstrap::VARIANT
                ),
            );
            h
        })
        .collect();
    let addresses: Vec<String> = hosts.iter().map(|h| net.address_of(h, false)).collect();
    let project = tempfile::tempdir().unwrap();
    let mut yaml =
        String::from("cluster:\n  controller:\n    host: 127.0.0.1\n    path: /c\n  workers:\n");
    for h in &hosts {
        yaml.push_str(&format!(
            "    - host: {}\n      path: {PATH}\n      arch: {}\n",
            h.label,
            bootstrap::VARIANT
        ));
        yaml.push_str(&h.ssh_yaml(&keys, 6));
    }
    std::fs::write(project.path().join("fdl.cluster.yml"), yaml).unwrap();
    std::fs::create_dir_all(project.path().join("libtorch")).unwrap();

    // NCCL's own choice on each host, by the tests' oracle: the address the rehearsal
    // must report.
    for (h, want) in hosts.iter().zip(&addresses) {
        let lib = format!(
            "{PATH}/libtorch/{}/lib/libtorch_cuda.so",
            bootstrap::VARIANT
        );
        let chosen = bootstrap::oracle(h, &lib, &[]);
        if !matches!(&chosen, Ok((_, addr)) if addr == want) {
            let host = &h.label;
            return Err(format!(
                "on {host}, NCCL itself chose {chosen:?}, not {want} (its address on the network)"
            ));
        }
    }

    // Warm-up: ships fdl to the hosts and opens the shared connections; not measured.
    let warm_cache = tempfile::tempdir().unwrap();
    status(project.path(), warm_cache.path())?;
    rehearse(project.path(), warm_cache.path(), &addresses, true)?;

    let (mut st_warm, mut re_warm, mut st_cold, mut re_cold) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut connects = Vec::new();
    for round in 0..runs {
        let rehearse_first = round % 2 == 1;
        let (root, warm) = (project.path(), warm_cache.path());
        let mut warm_rehearsal = || {
            let (took, slowest) = rehearse(root, warm, &addresses, false)?;
            connects.push(slowest);
            Ok::<_, String>(took)
        };
        if rehearse_first {
            re_warm.push(warm_rehearsal()?);
            st_warm.push(status(root, warm)?);
        } else {
            st_warm.push(status(root, warm)?);
            re_warm.push(warm_rehearsal()?);
        }
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        if rehearse_first {
            re_cold.push(rehearse(root, a.path(), &addresses, false)?.0);
            st_cold.push(status(root, b.path())?);
        } else {
            st_cold.push(status(root, a.path())?);
            re_cold.push(rehearse(root, b.path(), &addresses, false)?.0);
        }
    }

    // Where the time goes: the workers' parts, each alone on host a, timed in one shell
    // there (`docker exec` not counted), round-robin.
    let script = format!(
        "cd {PATH} || exit 1; f=$(ls /root/.cache/fdl/bin/fdl-* | grep -v '\\.sum$' | head -n 1); \
         [ -x \"$f\" ] || exit 1; t() {{ date +%s%N; }}; \
         for i in $(seq {runs}); do \
           a=$(t); \"$f\" --version >/dev/null || exit 1; b=$(t); \
           \"$f\" --root \"$PWD\" cluster self --json --arch {v} >/dev/null || exit 1; c=$(t); \
           \"$f\" --root \"$PWD\" cluster bootstrap-self --json --limit 20 --arch {v} >/dev/null || exit 1; d=$(t); \
           env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,BOOTSTRAP,ENV,NET CUDA_VISIBLE_DEVICES= \
             NCCL_NET_PLUGIN=none NCCL_TUNER_PLUGIN=none NCCL_PROFILER_PLUGIN=none \
             NCCL_ENV_PLUGIN=none NCCL_GIN_PLUGIN=none NCCL_RMA_PLUGIN=none \
             \"$f\" cluster bootstrap-child --library {lib} >/dev/null || exit 1; e=$(t); \
           echo \"run $((b - a)) $((c - b)) $((d - c)) $((e - d))\"; \
         done",
        v = bootstrap::VARIANT,
        lib = bootstrap::nccl_path(PATH),
    );
    let text = hosts[0].exec(&script);
    let mut times: [Vec<Duration>; 4] = Default::default();
    for l in text.lines().filter_map(|l| l.strip_prefix("run ")) {
        for (v, f) in times.iter_mut().zip(l.split(' ')) {
            v.push(Duration::from_nanos(f.parse().unwrap()));
        }
    }
    let [version, report, bootstrap_self, child] = times.map(median);

    let (st_warm, re_warm, st_cold, re_cold) = (
        median(st_warm),
        median(re_warm),
        median(st_cold),
        median(re_cold),
    );
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!("| 3 hosts, one network | median of {runs} |");
    println!("|---|---|");
    println!(
        "| `fdl cluster status`, warm (ControlMaster) | {} |",
        ms(st_warm)
    );
    println!(
        "| `fdl cluster rehearse`, warm (ControlMaster) | {} |",
        ms(re_warm)
    );
    println!(
        "| `fdl cluster status`, cold (no shared connection) | {} |",
        ms(st_cold)
    );
    println!(
        "| `fdl cluster rehearse`, cold (no shared connection) | {} |",
        ms(re_cold)
    );
    println!();
    println!("| the parts, alone on host a (one shell there) | median of {runs} |");
    println!("|---|---|");
    println!("| `fdl --version` (one fdl process) | {} |", ms(version));
    println!(
        "| `fdl cluster self --json` (status's part on a worker) | {} |",
        ms(report)
    );
    println!(
        "| `fdl cluster bootstrap-self --json` (the rehearsal's first part on a worker) | {} |",
        ms(bootstrap_self)
    );
    println!(
        "| `fdl cluster bootstrap-child` (its child: NCCL loaded, `ncclGetUniqueId`) | {} |",
        ms(child)
    );
    println!(
        "| the rehearsal's slowest connection (warm runs, as the workers report it) | {} |",
        ms(median(connects))
    );
    let warm = ratio(re_warm, st_warm);
    println!(
        "rehearse / status = {warm:.2}x warm, {:.2}x cold; target within 2x `cluster status`: {}",
        ratio(re_cold, st_cold),
        if warm <= 2.0 { "MET" } else { "MISSED" }
    );
    Ok(())
}
