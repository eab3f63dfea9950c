//! `fdl cluster status --slurm` on three nodes, beside plain `srun -N3 true`, in the same
//! allocation.
//!
//! The cluster is the tests' (tests/slurm_fixture: Debian's Slurm 22.05 in a controller
//! and three node containers, stand-in nvidia-smi, a libtorch made here on each node).
//! The target is status within 2x one `srun -N3 true`; it is reported, never asserted by
//! a test. Inside one `salloc -N3`, after a warm-up status (which sends fdl to the nodes
//! by sbcast), the two alternate RUNS times each, timed on the controller itself; each
//! figure is the median. `cargo bench --bench cluster_slurm`; it needs the Docker engine
//! and debootstrap (the Slurm image is made once and kept).

#[path = "../tests/cluster_fixture/mod.rs"]
mod cluster_fixture;
#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/slurm_fixture/mod.rs"]
mod slurm_fixture;

use std::time::Duration;

const RUNS: usize = 7;
const ROOT: &str = "/srv/flodl";

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let cluster = slurm_fixture::Cluster::start(None);
    let work = tempfile::tempdir().unwrap();
    let project = work.path().join("project");
    let lib = project.join("libtorch/precompiled/cu128/lib");
    std::fs::create_dir_all(&lib).unwrap();
    let src = format!(
        "{}\nint fdl_test_torch_calls_nccl(void) {{ int v = 0; ncclGetVersion(&v); return v; }}\n{}",
        common::nccl_like_source((2, 27, 5), "12.8"),
        common::fatbin_c_source(&[61, 86, 120], "fdl_test_torch_fatbin")
    );
    common::compile_shared(&src, &lib.join("libtorch_cuda.so"), &[]);
    std::fs::write(project.join("libtorch/.active"), "precompiled/cu128\n").unwrap();
    cluster.ctl.put_tree(&project, ROOT);
    let gpus = [("node1", "6.1"), ("node2", "8.6"), ("node3", "12.0")];
    for (node, (host, cc)) in cluster.nodes.iter().zip(gpus) {
        node.put_tree(&project, ROOT);
        cluster.plant_gpus(
            host,
            &cluster_fixture::nvidia_smi_script(&[("NVIDIA GPU", cc, 8192)], "570.133.07", "12.8"),
        );
    }
    // Times in the allocation's own shell, so neither docker exec nor salloc is counted.
    let script = format!(
        "cd {ROOT} && fdl cluster status --slurm --json >/dev/null || exit 1
         for i in $(seq {RUNS}); do
           a=$(date +%s%N); srun -N3 --overlap true || exit 1; b=$(date +%s%N)
           fdl cluster status --slurm --json >/dev/null || exit 1; c=$(date +%s%N)
           echo \"srun $((b - a))\"; echo \"status $((c - b))\"
         done"
    );
    let out = cluster.salloc(&script);
    if !out.status.success() {
        eprintln!(
            "cluster_slurm: the runs failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::process::exit(1);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let times = |what: &str| -> Vec<Duration> {
        text.lines()
            .filter_map(|l| l.strip_prefix(what)?.trim().parse().ok())
            .map(Duration::from_nanos)
            .collect()
    };
    let srun = median(times("srun "));
    let status = median(times("status "));
    let ratio = status.as_secs_f64() / srun.as_secs_f64();
    println!("cluster_slurm: 3 nodes, median of {RUNS}, in one salloc -N3");
    println!(
        "  srun -N3 true                     {:>8.0} ms",
        srun.as_secs_f64() * 1e3
    );
    println!(
        "  fdl cluster status --slurm --json {:>8.0} ms",
        status.as_secs_f64() * 1e3
    );
    println!(
        "  ratio {ratio:.2}x (target: at most 2x): {}",
        if ratio <= 2.0 { "met" } else { "MISSED" }
    );
}
