//! `fdl cluster ps` on three hosts over SSH beside plain `ssh host true` × 3, and on three
//! Slurm nodes (`--slurm --jobid J`, from outside the job) beside `srun --jobid=J
//! --overlap -N3 true`, in one run.
//!
//! The hosts are the tests' (tests/cluster_fixture, tests/slurm_fixture); on each, one
//! rank runs: a small C program (compiled here) that `dlopen`s the real `libnccl.so.2` of
//! `nvidia-nccl-cu12` 2.27.5 (`FDL_TEST_NCCL_LIB`, from `.ci/fetch-oracles`) and sleeps;
//! on Slurm the three are the tasks of one running `sbatch` job. After a warm-up (which
//! ships fdl to every worker), each figure is the median of RUNS runs; over SSH both
//! contenders are timed here, on Slurm both in one shell on the controller (neither
//! `docker exec` nor the shell counted). Reported, never asserted by a test.
//! `cargo bench --bench cluster_ps`; it needs the Docker engine and debootstrap (the
//! images are made once and kept).

#[path = "../tests/cluster_fixture/mod.rs"]
mod cluster_fixture;
#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/slurm_fixture/mod.rs"]
mod slurm_fixture;

use cluster_fixture::{docker_ok, Host, Keys};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RUNS: usize = 7;
const NCCL_AT: &str = "/opt/nccl/lib/libnccl.so.2";
const RANK_AT: &str = "/opt/ranks/rank";

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn rank_program(dir: &Path) -> PathBuf {
    let c = dir.join("rank.c");
    std::fs::write(
        &c,
        "#include <dlfcn.h>\n#include <unistd.h>\nint main(int argc, char **argv) {\n  if (argc < 2 || !dlopen(argv[1], RTLD_NOW | RTLD_LOCAL)) return 2;\n  for (;;) pause();\n}\n",
    )
    .unwrap();
    let exe = dir.join("rank");
    assert!(Command::new("cc")
        .arg(&c)
        .arg("-o")
        .arg(&exe)
        .arg("-ldl")
        .status()
        .expect("cc")
        .success());
    exe
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

fn ps(root: &Path, cache: &Path) -> Duration {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_fdl"))
        .arg("--root")
        .arg(root)
        .args(["cluster", "ps", "--json"])
        .env("XDG_CACHE_HOME", cache)
        .output()
        .unwrap();
    let took = start.elapsed();
    if !out.status.success() {
        eprintln!(
            "cluster_ps: ps was not green on three ranks of one NCCL:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::process::exit(1);
    }
    took
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("cluster_ps: run with `cargo bench --bench cluster_ps`");
        return;
    }
    let nccl = std::fs::canonicalize(common::oracle_input("FDL_TEST_NCCL_LIB")).unwrap();
    let work = tempfile::tempdir().unwrap();
    let prog = rank_program(work.path());
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);

    // Over SSH.
    let keys = Keys::new();
    let hosts: Vec<Host> = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(i, label)| {
            let h = Host::start(label, &keys);
            h.put(&nccl, NCCL_AT);
            h.put(&prog, RANK_AT);
            h.exec("mkdir -p /opt/flodl");
            docker_ok(&[
                "exec",
                "-d",
                "-e",
                &format!("RANK={i}"),
                &h.name,
                RANK_AT,
                NCCL_AT,
            ]);
            h.exec(&format!(
                "for i in $(seq 100); do grep -qs {NCCL_AT} /proc/[0-9]*/maps && exit 0; sleep 0.1; done; exit 1"
            ));
            h
        })
        .collect();
    let project = tempfile::tempdir().unwrap();
    let mut yaml =
        String::from("cluster:\n  controller:\n    host: 127.0.0.1\n    path: /c\n  workers:\n");
    for h in &hosts {
        yaml.push_str(&format!(
            "    - host: {}\n      path: /opt/flodl\n",
            h.label
        ));
        yaml.push_str(&h.ssh_yaml(&keys, 6));
    }
    std::fs::write(project.path().join("fdl.cluster.yml"), yaml).unwrap();
    let warm_cache = tempfile::tempdir().unwrap();
    ps(project.path(), warm_cache.path());
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
                ps(project.path(), fresh.path())
            })
            .collect(),
    );
    let warm = median(
        (0..RUNS)
            .map(|_| ps(project.path(), warm_cache.path()))
            .collect(),
    );
    drop(hosts);

    // Through Slurm: a running job of three tasks, reached from outside it.
    let cluster = slurm_fixture::Cluster::start(None);
    let bytes = std::fs::read(&nccl).unwrap();
    let prog = std::fs::read(&prog).unwrap();
    for node in &cluster.nodes {
        node.write(NCCL_AT, &bytes, 0o755);
        node.write(RANK_AT, &prog, 0o755);
        node.exec("mkdir -p /srv/flodl");
    }
    cluster.ctl.exec("mkdir -p /srv/flodl");
    let job = cluster
        .ctl
        .exec(&format!(
            "sbatch --parsable -N3 --wrap 'srun -N3 --ntasks-per-node=1 {RANK_AT} {NCCL_AT}'"
        ))
        .trim()
        .to_string();
    for node in &cluster.nodes {
        node.exec(&format!(
            "for i in $(seq 300); do grep -qs {NCCL_AT} /proc/[0-9]*/maps && exit 0; sleep 0.1; done; exit 1"
        ));
    }
    let script = format!(
        "cd /srv/flodl && t() {{ date +%s%N; }}; \
         fdl cluster ps --slurm --jobid {job} --json >/dev/null || exit 1; \
         for i in $(seq {RUNS}); do \
           a=$(t); srun --jobid={job} --overlap -N3 --ntasks-per-node=1 true || exit 1; b=$(t); \
           fdl cluster ps --slurm --jobid {job} --json >/dev/null || exit 1; c=$(t); \
           echo \"run $((b - a)) $((c - b))\"; \
         done"
    );
    let out = cluster.ctl.run(&script);
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        eprintln!(
            "cluster_ps: the Slurm runs failed:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::process::exit(1);
    }
    let (mut srun, mut sps) = (Vec::new(), Vec::new());
    for l in text.lines().filter_map(|l| l.strip_prefix("run ")) {
        let f: Vec<u64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
        srun.push(Duration::from_nanos(f[0]));
        sps.push(Duration::from_nanos(f[1]));
    }
    let (srun, sps) = (median(srun), median(sps));
    cluster.ctl.run(&format!("scancel {job}"));

    println!("cluster_ps: 3 workers, one rank each, median of {RUNS}");
    println!("| contender | median |");
    println!("|---|---|");
    println!(
        "| `ssh host true` × 3, one after another | {} |",
        ms(sequential)
    );
    println!("| `ssh host true` × 3, at once | {} |", ms(parallel));
    println!(
        "| `fdl cluster ps`, cold (no shared connection) | {} |",
        ms(cold)
    );
    println!("| `fdl cluster ps`, warm (ControlMaster) | {} |", ms(warm));
    println!("| `srun --jobid=J --overlap -N3 true` | {} |", ms(srun));
    println!("| `fdl cluster ps --slurm --jobid J` | {} |", ms(sps));
    println!(
        "ssh: ps cold = {:.2}x sequential ssh true, warm = {:.2}x parallel ssh true; slurm: ps = {:.2}x srun -N3 true",
        cold.as_secs_f64() / sequential.as_secs_f64(),
        warm.as_secs_f64() / parallel.as_secs_f64(),
        sps.as_secs_f64() / srun.as_secs_f64()
    );
}
