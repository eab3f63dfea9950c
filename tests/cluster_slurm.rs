//! `fdl cluster --slurm` on a real Slurm (tests/slurm_fixture: Debian's Slurm 22.05 in four
//! containers, one controller and three nodes with their own filesystems and stand-in
//! `nvidia-smi`s of different GPUs). fdl runs on the controller inside `salloc`, as a user
//! runs it in a job; the nodes have no fdl, so the controller's goes out by `sbcast`.
//!
//! `#[ignore]`d: `.ci/run` runs them with `--include-ignored`; a missing engine fails them.

mod slurm_fixture;
use slurm_fixture::Cluster;

/// `cargo test` runs a file's tests as threads: each starts a cluster of four containers,
/// which the two cores of a CI runner hold one at a time.
static CLUSTERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The fixture itself: an allocation of three nodes whose steps reach all three.
#[test]
#[ignore = "needs Docker: drives a real Slurm in containers: `cargo test -- --include-ignored`"]
fn an_allocation_reaches_the_three_nodes() {
    let _one = CLUSTERS.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::start(None);
    let out = cluster.salloc("srun -N3 hostname | sort");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "node1\nnode2\nnode3",
        "{}",
        text(&out)
    );
}
