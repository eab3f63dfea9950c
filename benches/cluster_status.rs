//! `fdl cluster status` on three healthy hosts, beside plain `ssh host true` × 3.
//!
//! The hosts are the tests' (tests/cluster_fixture): Debian containers with a real sshd
//! on 127.0.0.1 ports, a stand-in nvidia-smi and a libtorch made here. The target is
//! status under 2 s; it is reported, never asserted by a test. Measured:
//! - `ssh true` to each host, one after another, and all three at once;
//! - status cold: a fresh cache, so no shared SSH connection exists yet (fdl is already
//!   on the hosts: the warm-up run shipped it);
//! - status warm: a second run within ControlPersist, reusing the connections.
//!
//! Each figure is the median of 5 runs. `cargo bench --bench cluster_status`; it needs
//! the Docker engine and debootstrap (the sshd image is made once and kept).

#[path = "../tests/cluster_fixture/mod.rs"]
mod cluster_fixture;
#[path = "../tests/common/mod.rs"]
mod common;

use cluster_fixture::{Host, Keys};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RUNS: usize = 5;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ssh_true(host: &Host, keys: &Keys) {
    let argv = host.ssh_argv(keys);
    let ok = Command::new(&argv[0])
        .args(&argv[1..])
        .arg("true")
        .stdin(Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(ok, "ssh true failed on {}", host.label);
}

fn status(root: &Path, cache: &Path) -> Duration {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_fdl"))
        .arg("--root")
        .arg(root)
        .args(["cluster", "status", "--json"])
        .env("XDG_CACHE_HOME", cache)
        .output()
        .unwrap();
    let took = start.elapsed();
    if !out.status.success() {
        eprintln!(
            "cluster_status: status was not green on healthy hosts:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::process::exit(1);
    }
    took
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("cluster_status: run with `cargo bench --bench cluster_status`");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let lib = work.path().join("libtorch_cuda.so");
    common::compile_shared(
        &format!(
            "{}\nint fdl_bench_calls_nccl(void) {{ int v = 0; ncclGetVersion(&v); return v; }}\n{}",
            common::nccl_like_source((2, 27, 5), "12.8"),
            common::fatbin_c_source(&[61, 86, 120], "fdl_bench_fatbin")
        ),
        &lib,
        &[],
    );
    let keys = Keys::new();
    let gpus: [Vec<(&str, &str, u32)>; 3] = [
        vec![("NVIDIA GeForce GTX 1060 6GB", "6.1", 6144)],
        vec![("NVIDIA GeForce RTX 5060 Ti", "12.0", 16311)],
        vec![
            ("NVIDIA GeForce RTX 3090", "8.6", 24576),
            ("NVIDIA GeForce RTX 3090", "8.6", 24576),
        ],
    ];
    let hosts: Vec<Host> = ["a", "b", "c"]
        .iter()
        .zip(&gpus)
        .map(|(label, g)| {
            let h = Host::start(label, &keys);
            h.fake_nvidia_smi(g, "570.133.07", "12.8");
            h.put(
                &lib,
                "/opt/flodl/libtorch/precompiled/cu128/lib/libtorch_cuda.so",
            );
            h
        })
        .collect();
    let project = tempfile::tempdir().unwrap();
    let mut yaml =
        String::from("cluster:\n  controller:\n    host: 127.0.0.1\n    path: /c\n  workers:\n");
    for h in &hosts {
        yaml.push_str(&format!(
            "    - host: {}\n      path: /opt/flodl\n      arch: precompiled/cu128\n",
            h.label
        ));
        yaml.push_str(&h.ssh_yaml(&keys, 6));
    }
    std::fs::write(project.path().join("fdl.cluster.yml"), yaml).unwrap();
    std::fs::create_dir_all(project.path().join("libtorch")).unwrap();

    // Warm-up: ships fdl to the hosts; not measured.
    let warm_cache = tempfile::tempdir().unwrap();
    status(project.path(), warm_cache.path());

    let sequential = median(
        (0..RUNS)
            .map(|_| {
                let t = Instant::now();
                for h in &hosts {
                    ssh_true(h, &keys);
                }
                t.elapsed()
            })
            .collect(),
    );
    let parallel = median(
        (0..RUNS)
            .map(|_| {
                let t = Instant::now();
                std::thread::scope(|s| {
                    for h in &hosts {
                        let keys = &keys;
                        s.spawn(move || ssh_true(h, keys));
                    }
                });
                t.elapsed()
            })
            .collect(),
    );
    let cold = median(
        (0..RUNS)
            .map(|_| {
                let fresh = tempfile::tempdir().unwrap();
                status(project.path(), fresh.path())
            })
            .collect(),
    );
    let warm = median(
        (0..RUNS)
            .map(|_| status(project.path(), warm_cache.path()))
            .collect(),
    );
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
    println!("| 3 healthy hosts | median of {RUNS} |");
    println!("|---|---|");
    println!(
        "| `ssh host true` × 3, one after another | {} |",
        ms(sequential)
    );
    println!("| `ssh host true` × 3, at once | {} |", ms(parallel));
    println!(
        "| `fdl cluster status`, cold (no shared connection) | {} |",
        ms(cold)
    );
    println!(
        "| `fdl cluster status`, warm (ControlMaster) | {} |",
        ms(warm)
    );
    println!(
        "status cold = {:.2}× sequential ssh true; target under 2 s: {}",
        cold.as_secs_f64() / sequential.as_secs_f64(),
        if cold < Duration::from_secs(2) {
            "MET"
        } else {
            "MISSED"
        }
    );
}
