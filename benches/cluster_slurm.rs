//! `fdl cluster status --slurm` on three nodes, beside plain `srun -N3 true`, in the same
//! allocation.
//!
//! The cluster is the tests' (tests/slurm_fixture: Debian's Slurm 22.05 in a controller
//! and three node containers, stand-in nvidia-smi, a libtorch made here on each node).
//! The targets are status without the witness (`--no-witness`) within 2x one
//! `srun -N3 true`, and status with it within that plus the slowest node's witness timed
//! alone; both are reported, never asserted by a test, beside a breakdown of status's
//! parts. Inside one `salloc -N3`, after a warm-up status (which sends fdl to the nodes
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
    // The script every status runs on a node before fdl's report: it checks the cached
    // fdl (the controller's, sent by the warm-up status) and opens it; timed alone below.
    let fdl_bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_fdl"));
    let own = fdl::cluster::status::OwnBinary {
        sha256: fdl::digest::sha256_file(&fdl_bin).unwrap(),
        path: fdl_bin,
    };
    std::fs::write(
        project.join("check.sh"),
        format!("{}\n[ -n \"$f\" ]\n", own.open_there()),
    )
    .unwrap();
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
    // Beside the two figures the target compares, the parts of status each alone: the
    // two scontrol calls, the step that runs fdl's node report on every node (status
    // less that step is the controller's own work and each node's check of the cached
    // fdl), and, inside each node's task: fdl's report without and with the witness (the
    // witness's cost there is the difference; the bound for status with it is 2x srun
    // plus the slowest node's), fdl's bare start, and the check script alone.
    let script = format!(
        "cd {ROOT} && fdl cluster status --slurm --json >/dev/null || exit 1
         export F='fdl=$(ls -d \"${{XDG_CACHE_HOME:-$HOME/.cache}}\"/fdl/bin/fdl-* | grep -v \"[.]sum$\" | head -n1)'
         t() {{ date +%s%N; }}
         for i in $(seq {RUNS}); do export i
           a=$(t); srun -N3 --overlap true || exit 1; b=$(t)
           fdl cluster status --slurm --json --no-witness >/dev/null || exit 1; c=$(t)
           fdl cluster status --slurm --json >/dev/null || exit 1; d=$(t)
           scontrol show hostnames \"$SLURM_JOB_NODELIST\" >/dev/null; e=$(t)
           scontrol show node -o \"$SLURM_JOB_NODELIST\" >/dev/null; f=$(t)
           srun -N3 --overlap sh -c 'eval \"$F\"; \"$fdl\" --root \"$PWD\" cluster self --json --no-witness >/dev/null' || exit 1; g=$(t)
           srun -N3 --overlap sh -c 'eval \"$F\"; a=$(date +%s%N); sha256sum < \"$fdl\" >/dev/null; b=$(date +%s%N); \"$fdl\" --root \"$PWD\" cluster self --json --no-witness >/dev/null; c=$(date +%s%N); \"$fdl\" --root \"$PWD\" cluster self --json >/dev/null; d=$(date +%s%N); \"$fdl\" --version >/dev/null; e=$(date +%s%N); sh ./check.sh || exit 1; g=$(date +%s%N); echo \"node $i $((c - b)) $((d - c)) $((b - a)) $((e - d)) $((g - e))\"' || exit 1
           echo \"srun $((b - a))\"; echo \"status $((c - b))\"; echo \"witness $((d - c))\"
           echo \"hostnames $((e - d))\"; echo \"states $((f - e))\"; echo \"step $((g - f))\"
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
    // Per run, the slowest node's report without the witness, and the slowest node's
    // witness (its report with the witness less its report without).
    let (mut report, mut trace, mut hash, mut start, mut check) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 1..=RUNS {
        let rows: Vec<(u64, u64, u64, u64, u64)> = text
            .lines()
            .filter_map(|l| {
                let mut w = l.strip_prefix("node ")?.split_whitespace();
                (w.next()?.parse::<usize>().ok()? == i).then_some((
                    w.next()?.parse().ok()?,
                    w.next()?.parse().ok()?,
                    w.next()?.parse().ok()?,
                    w.next()?.parse().ok()?,
                    w.next()?.parse().ok()?,
                ))
            })
            .collect();
        check.push(Duration::from_nanos(
            rows.iter().map(|r| r.4).max().unwrap_or(0),
        ));
        start.push(Duration::from_nanos(
            rows.iter().map(|r| r.3).max().unwrap_or(0),
        ));
        report.push(Duration::from_nanos(
            rows.iter().map(|r| r.0).max().unwrap_or(0),
        ));
        hash.push(Duration::from_nanos(
            rows.iter().map(|r| r.2).max().unwrap_or(0),
        ));
        trace.push(Duration::from_nanos(
            rows.iter()
                .map(|r| r.1.saturating_sub(r.0))
                .max()
                .unwrap_or(0),
        ));
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let srun = median(times("srun "));
    let status = median(times("status "));
    let witness = median(times("witness "));
    let step = median(times("step "));
    let trace = median(trace);
    let ratio = status.as_secs_f64() / srun.as_secs_f64();
    let bound = 2.0 * srun.as_secs_f64() + trace.as_secs_f64();
    let wratio = witness.as_secs_f64() / bound;
    println!("cluster_slurm: 3 nodes, median of {RUNS}, in one salloc -N3");
    println!(
        "  srun -N3 true                          {:>8.0} ms",
        ms(srun)
    );
    println!("  parts of status, each alone:");
    println!(
        "    scontrol show hostnames              {:>8.0} ms",
        ms(median(times("hostnames ")))
    );
    println!(
        "    scontrol show node -o                {:>8.0} ms",
        ms(median(times("states ")))
    );
    println!(
        "    fdl's report on the slowest node     {:>8.0} ms (timed inside its task)",
        ms(median(report))
    );
    println!(
        "    sha256sum of fdl on the slowest node {:>8.0} ms (what each status paid before the kept digest)",
        ms(median(hash))
    );
    println!(
        "    fdl's start on the slowest node      {:>8.0} ms (`fdl --version`, inside its task)",
        ms(median(start))
    );
    println!(
        "    srun -N3 of fdl's report             {:>8.0} ms",
        ms(step)
    );
    println!(
        "    the node's check of the cached fdl   {:>8.0} ms (the script before each report, inside its task)",
        ms(median(check))
    );
    println!(
        "    status less that step                {:>8.0} ms (the controller's own and each node's check)",
        ms(status.saturating_sub(step))
    );
    println!(
        "    the slowest node's witness           {:>8.0} ms",
        ms(trace)
    );
    println!(
        "  status --no-witness                    {:>8.0} ms: {ratio:.2}x srun (target: at most 2x): {}",
        ms(status),
        if ratio <= 2.0 { "met" } else { "MISSED" }
    );
    println!(
        "  status (witness on)                    {:>8.0} ms: {wratio:.2}x of 2x srun + witness ({:.0} ms): {}",
        ms(witness),
        bound * 1e3,
        if wratio <= 1.0 { "met" } else { "MISSED" }
    );
}
