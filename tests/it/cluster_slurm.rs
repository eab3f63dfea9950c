//! `fdl cluster --slurm` on a real Slurm (tests/slurm_fixture: Debian's Slurm 22.05 in four
//! containers, a controller and three nodes with their own filesystems and stand-in
//! `nvidia-smi`s: GTX 1060 sm_61, RTX 3090 sm_86, RTX 5060 Ti sm_120). fdl runs on the
//! controller inside `salloc`, as a user runs it in a job; the nodes have no fdl, so the
//! controller's goes out by `sbcast` and is checked by sha256 there. Each node has the
//! project (a libtorch whose `libtorch_cuda.so` is a real ELF made here, NCCL compiled in)
//! at the controller's path. Covered: status (skew, coverage, a drained node), plan,
//! ship (byte-identical on every node, a no-op the second time, a node killed during it),
//! env and status green after its line, the shared-filesystem no-op, and `--slurm`
//! outside an allocation.
//!
//! `#[ignore]`d: `.ci/run` runs them with `--include-ignored`; a missing engine fails them.

use crate::cluster_fixture;
use crate::common;
use crate::native_fixture;
use crate::slurm_fixture;
use common::*;
use slurm_fixture::{sh_quote, Cluster, Node};
use std::path::Path;
use std::process::Output;

/// `cargo test` runs a file's tests as threads: each starts a cluster of four containers,
/// which the two cores of a CI runner hold one at a time.
static CLUSTERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The project's path on the controller and every node.
const ROOT: &str = "/srv/flodl";
/// The build every ship test ships.
const ARCHS: &[u32] = &[61, 86, 120];

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn json_of(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", text(out)))
}

fn verdict<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == name)
        .unwrap_or_else(|| panic!("no verdict {name} in {v}"))
}

fn worker<'a>(v: &'a serde_json::Value, host: &str) -> &'a serde_json::Value {
    v["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["host"] == host)
        .unwrap_or_else(|| panic!("no worker {host} in {v}"))
}

/// A libtorch_cuda.so with NCCL `version` compiled in (called through the PLT, so a
/// preload replaces it) and SASS for `archs`.
fn libtorch_cuda(dir: &Path, version: (u32, u32, u32), archs: &[u32]) -> std::path::PathBuf {
    let out = dir.join(format!(
        "libtorch_cuda-{}.{}.{}.so",
        version.0, version.1, version.2
    ));
    let src = format!(
        "{}\nint fdl_test_torch_calls_nccl(void) {{ int v = 0; ncclGetVersion(&v); return v; }}\n{}",
        nccl_like_source(version, "12.8"),
        fatbin_c_source(archs, "fdl_test_torch_fatbin")
    );
    compile_shared(&src, &out, &[]);
    out
}

/// A cluster with the project on every node (node3's libtorch bundles NCCL 2.27.3, the
/// others 2.27.5; only node3's, on the sm_120 GPU, has sm_120 kernels, which its
/// libtorch needs as much as its NCCL does) and, on the controller, the project with a
/// build for sm_61, sm_86 and sm_120 installed through the real pipeline.
struct Rig {
    cluster: Cluster,
    name: String,
    /// The controller's project, as made here.
    project: ProjectFixture,
    _work: tempfile::TempDir,
}

const GPUS: [(&str, &str, &str, u32); 3] = [
    ("node1", "NVIDIA GeForce GTX 1060 6GB", "6.1", 6144),
    ("node2", "NVIDIA GeForce RTX 3090", "8.6", 24576),
    ("node3", "NVIDIA GeForce RTX 5060 Ti", "12.0", 16311),
];

impl Rig {
    fn new(shared: Option<&str>) -> Rig {
        let root = shared.map(|s| format!("{s}/flodl")).unwrap_or(ROOT.into());
        let cluster = Cluster::start(shared);
        let work = tempfile::tempdir().unwrap();
        let lt_a = libtorch_cuda(work.path(), (2, 27, 5), &[61, 86]);
        let lt_b = libtorch_cuda(work.path(), (2, 27, 3), &[61, 86, 120]);
        for (host, gpu, cc, mem) in GPUS {
            cluster.plant_gpus(
                host,
                &cluster_fixture::nvidia_smi_script(&[(gpu, cc, mem)], "570.133.07", "12.8"),
            );
        }
        // The controller's project: its libtorch and one build, made here and copied in.
        let project = ProjectFixture::empty();
        let cache = tempfile::tempdir().unwrap();
        let tree = work.path().join("nccl-tree");
        write_nccl_tree(&tree, (2, 27, 5), ARCHS);
        let name = install_build(
            project.root(),
            cache.path(),
            &tree,
            "v2.27.5-1",
            "6.1;8.6;12.0",
        )
        .unwrap();
        let lib = project.root().join("libtorch/precompiled/cu128/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::copy(&lt_a, lib.join("libtorch_cuda.so")).unwrap();
        std::fs::write(
            project.root().join("libtorch/.active"),
            "precompiled/cu128\n",
        )
        .unwrap();
        cluster.ctl.put_tree(project.root(), &root);
        if shared.is_none() {
            for (i, node) in cluster.nodes.iter().enumerate() {
                let lt = if i == 2 { &lt_b } else { &lt_a };
                let dir = work.path().join(format!("node{i}"));
                let lib = dir.join("libtorch/precompiled/cu128/lib");
                std::fs::create_dir_all(&lib).unwrap();
                std::fs::copy(lt, lib.join("libtorch_cuda.so")).unwrap();
                std::fs::write(dir.join("libtorch/.active"), "precompiled/cu128\n").unwrap();
                node.put_tree(&dir, &root);
            }
        }
        for node in &cluster.nodes {
            assert!(
                node.run("command -v fdl").stdout.is_empty(),
                "{} must have no fdl of its own",
                node.host
            );
        }
        Rig {
            cluster,
            name,
            project,
            _work: work,
        }
    }

    /// `fdl ARGS` in the project on the controller, inside `salloc -N3`; `pre` runs first
    /// in the job's shell (an `export` line).
    fn fdl(&self, pre: &str, args: &str) -> Output {
        self.cluster
            .salloc(&format!("cd {ROOT} && {pre} fdl {args}"))
    }
}

/// Every file of the build on `node` with its sha256, sorted (links as their targets).
fn build_digest(node: &Node, dir: &str) -> String {
    node.exec(&format!(
        "cd {} && find . -type f -exec sha256sum {{}} + | sort -k2 && find . -type l -printf '%p -> %l\\n' | sort",
        sh_quote(dir)
    ))
}

fn builds_listing(node: &Node) -> String {
    node.exec(&format!(
        "cd {ROOT}/libtorch/nccl/builds 2>/dev/null && ls -A || echo -"
    ))
    .trim()
    .to_string()
}

/// The whole journey of the issue, in one allocation of three nodes: `--slurm` outside
/// it fails fast; status lists the nodes and is red on the skew; plan takes
/// the union of the archs; ship puts byte-identical builds on every node and is a no-op
/// the second time; env prints the line, and status is green with it pasted.
#[test]
#[ignore = "needs Docker: drives a real Slurm in containers: `cargo test -- --include-ignored`"]
fn status_plan_ship_env_on_the_allocations_nodes() {
    let _one = CLUSTERS.lock().unwrap_or_else(|e| e.into_inner());
    let rig = Rig::new(None);

    // The fixture: a step of the allocation reaches the three nodes.
    let out = rig.cluster.salloc("srun -N3 hostname | sort");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "node1\nnode2\nnode3",
        "{}",
        text(&out)
    );

    // Outside an allocation: at once, naming both ways into one.
    let out = rig
        .cluster
        .ctl
        .run(&format!("cd {ROOT} && fdl cluster status --slurm"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        err.contains("salloc") && err.contains("sbatch") && err.contains("SLURM_JOB_ID"),
        "{err}"
    );

    let out = rig.fdl("", "cluster status --slurm");
    eprintln!("$ salloc -N3 fdl cluster status --slurm\n{}", text(&out));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    for (host, gpu, cc, _) in GPUS {
        assert!(
            shown.contains(&format!("{host} ({host}:{ROOT})")),
            "{shown}"
        );
        assert!(
            shown.contains(&format!("0: {gpu} (sm_{})", cc.replace('.', ""))),
            "{shown}"
        );
    }
    assert!(shown.contains("witness   its loader agrees"), "{shown}");
    let v = json_of(&rig.fdl("", "cluster status --slurm --json"));
    assert_eq!(v["files"], serde_json::json!([]), "{v}");
    // Each node's own loader was asked about its own libtorch, by default, and agrees;
    // --no-witness asks none, and the verdicts stay the same.
    for (host, ..) in GPUS {
        let wit = &worker(&v, host)["report"]["witness"];
        assert_eq!(wit["verdict"], "agree", "{host}: {v}");
    }
    let quick = json_of(&rig.fdl("", "cluster status --slurm --json --no-witness"));
    for (host, ..) in GPUS {
        assert!(
            worker(&quick, host)["report"]["witness"].is_null(),
            "{quick}"
        );
    }
    assert_eq!(quick["verdicts"], v["verdicts"]);
    assert_eq!(verdict(&v, "reach")["state"], "ok", "{v}");
    let skew = verdict(&v, "skew");
    assert_eq!(skew["state"], "red", "{v}");
    assert!(
        skew["detail"].as_str().unwrap().contains("node3 2.27.3"),
        "{skew}"
    );
    // node3's libtorch, NCCL compiled in, has code for its sm_120 (tests/it/cluster_status.rs
    // covers an uncovered GPU over ssh, torch's and NCCL's).
    let coverage = verdict(&v, "coverage");
    assert_eq!(coverage["state"], "ok", "{v}");
    // Every node ran the controller's fdl, sent by sbcast to its own cache.
    for node in &rig.cluster.nodes {
        let cached = node.exec("ls /root/.cache/fdl/bin/");
        assert!(cached.trim().starts_with("fdl-"), "{}: {cached}", node.host);
        assert!(!cached.contains(".incoming"), "{}: {cached}", node.host);
    }

    // No workers in fdl.cluster.yml, inside an allocation: Slurm, said on stderr.
    let out = rig.fdl("", "cluster status --json");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("using the allocation's nodes"),
        "{}",
        text(&out)
    );
    assert_eq!(json_of(&out)["workers"].as_array().unwrap().len(), 3);

    // plan: the union of the nodes' archs.
    let work = tempfile::tempdir().unwrap();
    native_fixture::fake_cuda_home(
        &work.path().join("cuda"),
        "12.8",
        "V12.8.93",
        &[61, 75, 86, 120],
        "lib64",
    );
    native_fixture::standin_tree(&work.path().join("nccl"), (2, 27, 5));
    rig.cluster.ctl.put_tree(work.path(), "/opt/standin");
    let out = rig.fdl(
        "",
        "cluster plan --slurm --json --backend native --cuda-home /opt/standin/cuda --source /opt/standin/nccl",
    );
    let v = json_of(&out);
    assert_eq!(
        v["plan"]["archs"],
        serde_json::json!(["sm_61", "sm_86", "sm_120"]),
        "{v}"
    );
    assert_eq!(v["plan"]["arch_origin"]["from"], "cluster", "{v}");
    assert_eq!(v["plan"]["cuda"], "12.8", "{v}");

    // ship: byte-identical on every node, then a no-op.
    let out = rig.fdl("", &format!("cluster ship --slurm {}", rig.name));
    eprintln!("$ fdl cluster ship --slurm\n{}", text(&out));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .matches("installed (copied with sbcast, verified there)")
            .count(),
        3,
        "{}",
        text(&out)
    );
    let dir = format!("{ROOT}/libtorch/nccl/builds/{}", rig.name);
    // The same bytes on every node; the controller's differ only in nccl.pc, whose
    // prefix `receive` writes for the build's place (the controller's was installed at
    // this machine's temporary path, then copied in).
    let here = build_digest(&rig.cluster.ctl, &dir);
    assert!(here.contains("libnccl.so.2.27.5"), "{here}");
    let but_pc = |d: &str| -> String {
        d.lines()
            .filter(|l| !l.ends_with("pkgconfig/nccl.pc"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let first = build_digest(&rig.cluster.nodes[0], &dir);
    assert_eq!(but_pc(&first), but_pc(&here));
    for node in &rig.cluster.nodes {
        assert_eq!(build_digest(node, &dir), first, "{}", node.host);
        assert_eq!(builds_listing(node), rig.name, "{}", node.host);
        let pc = node.exec(&format!("cat {dir}/lib/pkgconfig/nccl.pc"));
        assert!(pc.contains(&format!("prefix={dir}\n")), "{pc}");
    }
    let v = json_of(&rig.fdl("", "cluster ship --slurm --json"));
    for host in ["node1", "node2", "node3"] {
        assert_eq!(worker(&v, host)["result"], "already_there", "{v}");
    }

    // env: the line to paste, and the srun form; with it pasted, status is green.
    let out = rig.fdl("", "cluster env --slurm");
    let env = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("$ fdl cluster env --slurm\n{env}");
    assert!(out.status.success(), "{}", text(&out));
    let lib = format!("{dir}/lib/libnccl.so.2");
    let export = format!("export LD_PRELOAD='{lib}'");
    assert!(env.lines().any(|l| l == export), "{env}");
    assert!(
        env.contains(&format!(
            "# or per step: LD_PRELOAD='{lib}' srun --export=ALL "
        )),
        "{env}"
    );
    let out = rig.fdl(&format!("{export};"), "cluster status --slurm");
    eprintln!("$ {export}; fdl cluster status --slurm\n{}", text(&out));
    assert!(out.status.success(), "{}", text(&out));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("RED"));
}

/// A drained node gets no step and is named, with its reason, while the others answer;
/// a node killed during ship is named, the others are installed, and none holds a half
/// build.
#[test]
#[ignore = "needs Docker: drives a real Slurm in containers: `cargo test -- --include-ignored`"]
fn a_drained_node_and_a_node_killed_during_ship_are_named() {
    let _one = CLUSTERS.lock().unwrap_or_else(|e| e.into_inner());
    let rig = Rig::new(None);
    let out = rig.fdl(
        "scontrol update nodename=node2 state=drain reason=maintenance &&",
        "cluster status --slurm --json",
    );
    let v = json_of(&out);
    let error = worker(&v, "node2")["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("node2 is") && error.contains("drain") && error.contains("maintenance"),
        "{v}"
    );
    for host in ["node1", "node3"] {
        assert!(worker(&v, host)["report"].is_object(), "{v}");
    }
    assert_eq!(verdict(&v, "reach")["state"], "red", "{v}");
    rig.cluster
        .ctl
        .exec("scontrol update nodename=node2 state=resume");

    // The ship runs in the background; node3 is killed as soon as its copy is prepared.
    let incoming = format!("{ROOT}/libtorch/nccl/builds/.incoming-{}", rig.name);
    let ship = {
        let ctl = rig.cluster.ctl.name.clone();
        let script = format!(
            "salloc -N3 --no-kill -Q sh -c {}",
            sh_quote(&format!(
                "cd {ROOT} && fdl cluster ship --slurm --json --timeout 20"
            ))
        );
        std::thread::spawn(move || {
            std::process::Command::new("docker")
                .args(["exec", &ctl, "sh", "-c", &script])
                .output()
                .unwrap()
        })
    };
    let node3 = rig.cluster.node("node3");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "node3 never got {incoming}"
        );
        if node3.run(&format!("test -d {incoming}")).status.success() {
            node3.kill();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = ship.join().unwrap();
    eprintln!("$ fdl cluster ship --slurm (node3 killed)\n{}", text(&out));
    assert!(!out.status.success(), "{}", text(&out));
    let v = json_of(&out);
    for host in ["node1", "node2"] {
        assert_eq!(worker(&v, host)["result"], "installed", "{v}");
        assert_eq!(builds_listing(rig.cluster.node(host)), rig.name, "{host}");
    }
    let dead = worker(&v, "node3");
    assert_eq!(dead["result"], "failed", "{v}");
    assert!(dead["why"].as_str().unwrap().contains("node3"), "{v}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("did not reach node3"),
        "{}",
        text(&out)
    );
    // Back up, node3 holds no half build: at most the copy's transaction, not the build.
    std::process::Command::new("docker")
        .args(["start", &node3.name])
        .output()
        .unwrap();
    let listing = builds_listing(node3);
    assert!(
        !listing.lines().any(|l| l == rig.name),
        "node3 holds a build it never verified: {listing}"
    );
}

/// The project on a filesystem every node shares (one Docker volume on all four): the
/// nodes see the controller's own bytes, so ship copies nothing.
#[test]
#[ignore = "needs Docker: drives a real Slurm in containers: `cargo test -- --include-ignored`"]
fn a_shared_project_directory_makes_ship_a_no_op() {
    let _one = CLUSTERS.lock().unwrap_or_else(|e| e.into_inner());
    let rig = Rig::new(Some("/shared"));
    let out = rig.cluster.salloc(&format!(
        "cd /shared/flodl && fdl cluster ship --slurm --json {}",
        rig.name
    ));
    assert!(out.status.success(), "{}", text(&out));
    let v = json_of(&out);
    for host in ["node1", "node2", "node3"] {
        assert_eq!(worker(&v, host)["result"], "already_there", "{v}");
        assert_eq!(
            worker(&v, host)["dir"],
            format!("/shared/flodl/libtorch/nccl/builds/{}", rig.name),
            "{v}"
        );
    }
    // --path names the same checkout explicitly, and --nodes picks a subset.
    let out = rig.cluster.salloc(&format!(
        "cd /shared/flodl && fdl cluster ship --slurm --json --nodes node1,node3 --path /shared/flodl {}",
        rig.name
    ));
    let v = json_of(&out);
    assert_eq!(v["workers"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(worker(&v, "node3")["result"], "already_there", "{v}");
}

/// The batch script of docs/cluster.md's Slurm section, as it stands there, run by
/// `sbatch --wait` on the controller: red first, shipped, then green, and the launch
/// sees the build's library preloaded on every node.
#[test]
#[ignore = "needs Docker: drives a real Slurm in containers: `cargo test -- --include-ignored`"]
fn the_readmes_batch_script_ships_and_launches_with_the_preload() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cluster.md")).unwrap();
    let script = readme
        .split_once("<!-- slurm-script -->\n```sh\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(s, _)| s.to_string())
        .expect("docs/cluster.md has no `<!-- slurm-script -->` sh block");
    assert!(script.contains(&format!("cd {ROOT}")), "{script}");
    let _one = CLUSTERS.lock().unwrap_or_else(|e| e.into_inner());
    let rig = Rig::new(None);
    // A batch script runs on the job's first node, not where sbatch was typed: there it
    // needs fdl and the project with its build, as a cluster's shared home gives them.
    // node2 and node3 still have no fdl: the batch host sends its own.
    let node1 = rig.cluster.node("node1");
    node1.put_tree(rig.project.root(), ROOT);
    node1.write(
        "/usr/local/bin/fdl",
        &std::fs::read(env!("CARGO_BIN_EXE_fdl")).unwrap(),
        0o755,
    );
    // The user's program: says where it runs and what it preloads.
    let train = b"#!/bin/sh\necho \"trained on $(hostname) with LD_PRELOAD=$LD_PRELOAD\"\n";
    for node in rig.cluster.all() {
        node.write(&format!("{ROOT}/train.sh"), train, 0o755);
    }
    rig.cluster
        .ctl
        .write("/root/job.sh", script.as_bytes(), 0o755);
    let out = rig
        .cluster
        .ctl
        .run("cd /root && sbatch --wait -o /root/job.out job.sh");
    // The job's output is written where it ran.
    let log = format!("{}{}", text(&out), text(&node1.run("cat /root/job.out")));
    eprintln!("$ sbatch --wait job.sh\n{log}");
    assert!(out.status.success(), "{log}");
    assert!(log.contains("RED     skew"), "{log}");
    let lib = format!("{ROOT}/libtorch/nccl/builds/{}/lib/libnccl.so.2", rig.name);
    for host in ["node1", "node2", "node3"] {
        assert!(
            log.contains(&format!("trained on {host} with LD_PRELOAD={lib}")),
            "{log}"
        );
    }
    assert!(
        log.contains("ok      bridge    the LD_PRELOAD of 3 worker(s) takes effect"),
        "{log}"
    );
}

/// A controller that accepts but never answers (slurmctld stopped with SIGSTOP inside a
/// live allocation) costs `cluster status` the `--timeout` it was given, for its
/// `scontrol` questions and its step alike, and it ends saying so; the real Slurm
/// client tools, not a stand-in. It used to be a fixed 30 s per `scontrol`.
#[test]
#[ignore = "needs Docker: drives a real Slurm in containers: `cargo test -- --include-ignored`"]
fn a_controller_that_never_answers_costs_the_timeout_it_was_given() {
    let rig = Rig::new(None);
    let out = rig.fdl(
        "pid=$(pidof slurmctld) && kill -STOP $pid && trap 'kill -CONT $pid' EXIT && start=$(date +%s) &&",
        "cluster status --slurm --timeout 3; rc=$?; echo \"fdl-took: $(( $(date +%s) - start )) rc: $rc\"",
    );
    let all = text(&out);
    let took: u64 = all
        .split("fdl-took: ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no timing line:\n{all}"));
    assert!(
        !all.contains("rc: 0"),
        "status passed with no controller:\n{all}"
    );
    assert!(
        all.contains("within 3 s"),
        "the timeout it was given is not named:\n{all}"
    );
    // Two scontrol questions run at once, then the step: a few timeouts, never 30 s each.
    assert!(took < 25, "took {took} s with --timeout 3:\n{all}");
}

/// On one allocation, the project on a filesystem every node shares:
/// - a file planted in node1's cache under the controller's fdl's name (other bytes,
///   which would leave a marker) is never run, and is replaced; a cache directory that
///   others may write (node2) is refused, named; fixed, the genuine fdl runs there;
/// - ship to a fresh directory the three nodes share: one copies and installs, the other
///   two see its install as already there (all ok, never "failed on the second node");
/// - a hostile checkout path (`$(…)`, backticks, quotes, a comma that would split
///   `--export=`): the lines `env --slurm` prints, pasted into bash and run through the
///   real srun, give each task the value exactly and run nothing of it.
#[test]
#[ignore = "needs Docker: drives a real Slurm in containers: `cargo test -- --include-ignored`"]
fn planted_binaries_shared_directories_and_hostile_paths_on_slurm() {
    let _one = CLUSTERS.lock().unwrap_or_else(|e| e.into_inner());
    let rig = Rig::new(Some("/shared"));
    let sha = fdl::digest::sha256_file(Path::new(env!("CARGO_BIN_EXE_fdl"))).unwrap();
    let cached = format!("/root/.cache/fdl/bin/fdl-{}", &sha[..16]);
    let node1 = rig.cluster.node("node1");
    let node2 = rig.cluster.node("node2");
    node1.write(
        &cached,
        b"#!/bin/sh\ntouch /tmp/planted-ran\necho '{\"schema\": 1}'\n",
        0o755,
    );
    node1.exec("chmod 700 /root/.cache/fdl /root/.cache/fdl/bin");
    node2.exec("mkdir -p /root/.cache/fdl/bin && chmod 700 /root/.cache/fdl && chmod 770 /root/.cache/fdl/bin");
    let status = |rig: &Rig| {
        json_of(
            &rig.cluster
                .salloc("cd /shared/flodl && fdl cluster status --slurm --json"),
        )
    };
    let v = status(&rig);
    assert_eq!(
        node1
            .exec("test -e /tmp/planted-ran && echo ran || echo no")
            .trim(),
        "no"
    );
    assert!(worker(&v, "node1")["report"].is_object(), "{v}");
    assert_eq!(worker(&v, "node1")["shipped_fdl"], true, "{v}");
    assert!(
        node1.exec(&format!("sha256sum {cached}")).starts_with(&sha),
        "the planted file was not replaced"
    );
    let error = worker(&v, "node2")["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("fdl's cache /root/.cache/fdl/bin on this worker is writable by others (mode drwxrwx---)"),
        "{v}"
    );
    assert_eq!(
        node2.exec("ls -A /root/.cache/fdl/bin").trim(),
        "",
        "nothing sent there"
    );
    node2.exec("chmod 700 /root/.cache/fdl/bin");
    let v = status(&rig);
    for host in ["node1", "node2", "node3"] {
        assert!(worker(&v, host)["report"].is_object(), "{v}");
    }
    assert_eq!(
        worker(&v, "node1")["shipped_fdl"],
        false,
        "the genuine one runs: {v}"
    );

    // Ship into one fresh directory the three nodes share.
    let hostile = "/shared/h,LD_LIBRARY_PATH=/evil$(touch${IFS}/tmp/ran)`touch${IFS}/tmp/ran`'q\"";
    node1.exec(&format!("mkdir -p {}", sh_quote(hostile)));
    let out = rig.cluster.salloc(&format!(
        "cd /shared/flodl && fdl cluster ship --slurm --json --path {} {}",
        sh_quote(hostile),
        rig.name
    ));
    eprintln!(
        "$ fdl cluster ship --slurm --path <shared, hostile>\n{}",
        text(&out)
    );
    assert!(out.status.success(), "{}", text(&out));
    let v = json_of(&out);
    let results: Vec<&str> = ["node1", "node2", "node3"]
        .iter()
        .map(|h| worker(&v, h)["result"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        results.iter().filter(|r| **r == "installed").count(),
        1,
        "{v}"
    );
    assert_eq!(
        results.iter().filter(|r| **r == "already_there").count(),
        2,
        "{v}"
    );
    let builds = rig
        .cluster
        .node("node3")
        .exec(&format!("ls -A {}/libtorch/nccl/builds", sh_quote(hostile)));
    assert_eq!(builds.trim(), rig.name, "one build, no copy left: {builds}");

    let lib = format!(
        "{hostile}/libtorch/nccl/builds/{}/lib/libnccl.so.2",
        rig.name
    );
    let out = rig.cluster.salloc(&format!(
        "cd /shared/flodl && fdl cluster env --slurm --path {}",
        sh_quote(hostile)
    ));
    let env = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("$ fdl cluster env --slurm --path <hostile>\n{env}");
    assert!(out.status.success(), "{}", text(&out));
    let export = env
        .lines()
        .find(|l| l.starts_with("export LD_PRELOAD="))
        .unwrap_or_else(|| panic!("no export line: {env}"));
    let per_step = env
        .lines()
        .find_map(|l| l.strip_prefix("# or per step: "))
        .and_then(|l| l.strip_suffix(" <your launcher>"))
        .unwrap_or_else(|| panic!("no srun line: {env}"));
    let show = "sh -c 'printf \"%s|%s\\n\" \"$LD_PRELOAD\" \"${LD_LIBRARY_PATH-unset}\"'";
    let want = format!("{lib}|unset");
    // The batch-script form, then the per-step form, each through the real srun.
    for line in [
        format!("{export}; srun --export=ALL -N3 {show}"),
        format!("{per_step} -N3 {show}"),
    ] {
        let out = rig.cluster.salloc(&format!(
            "unset LD_LIBRARY_PATH; bash -c {}",
            sh_quote(&line)
        ));
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{line}\n{}", text(&out));
        assert_eq!(said.lines().count(), 3, "{line}\n{said}");
        assert!(said.lines().all(|l| l == want), "{line}\n{said}");
    }
    // The JSON form's strings, as a script would use them.
    let v = json_of(&rig.cluster.salloc(&format!(
        "cd /shared/flodl && fdl cluster env --slurm --json --path {}",
        sh_quote(hostile)
    )));
    let group = &v["groups"][0];
    assert_eq!(group["env"]["LD_PRELOAD"], lib.as_str(), "{v}");
    let srun = group["srun"].as_str().unwrap();
    assert!(!srun.contains("--export=ALL,"), "{srun}");
    let out = rig.cluster.salloc(&format!(
        "unset LD_LIBRARY_PATH; bash -c {}",
        sh_quote(&format!("{srun} -N3 {show}"))
    ));
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .all(|l| l == want),
        "{}",
        text(&out)
    );
    for node in rig.cluster.all() {
        assert_eq!(
            node.exec("ls /tmp/ran /evil 2>/dev/null || echo none")
                .trim(),
            "none",
            "{}: a pasted line ran code",
            node.host
        );
    }

    // The shared project's active libtorch becomes a PIE naming an audit library
    // (DT_AUDIT): `cluster status --slurm` asks every node's own loader, and runs nothing
    // of it on any node (glibc runs only a main program's audit libraries; a libtorch is
    // traced through fdl's stand-in program).
    let work = tempfile::tempdir().unwrap();
    let (torch, audit) =
        audited_pie_libtorch(work.path(), "/shared/audit/libaudit.so", "/tmp/audit-ran");
    let lib = "/shared/flodl/libtorch/precompiled/cu128/lib/libtorch_cuda.so";
    node1.write(
        "/shared/audit/libaudit.so",
        &std::fs::read(&audit).unwrap(),
        0o755,
    );
    node1.write(lib, &std::fs::read(&torch).unwrap(), 0o755);
    node1.exec(&format!("ldd -r {lib} >/dev/null 2>&1; true"));
    assert_eq!(
        node1
            .exec("test -e /tmp/audit-ran && echo ran || echo no")
            .trim(),
        "ran",
        "the audit library does not run under ldd on node1: the check proves nothing"
    );
    node1.exec("rm -f /tmp/audit-ran");
    let v = status(&rig);
    for node in rig.cluster.all() {
        assert_eq!(
            node.exec("test -e /tmp/audit-ran && echo ran || echo no")
                .trim(),
            "no",
            "{}: cluster status ran the libtorch's audit library: {v}",
            node.host
        );
    }
    for host in ["node1", "node2", "node3"] {
        assert!(worker(&v, host)["report"].is_object(), "{v}");
    }
}

/// `cluster rehearse --slurm` in an allocation of the three nodes, each with a libtorch
/// laid out as pip lays torch out (its `libtorch_cuda.so` finds the real NCCL 2.27.5 of
/// the nvidia-nccl-cu12 wheel, bind-mounted): every node's own NCCL chooses the
/// interface and address NCCL itself prints there, the root reaches every other node and
/// each of them the root, and it is green, in JSON and in text.
#[test]
#[ignore = "drives the real Docker engine and Slurm, and needs the real NCCL of `source .ci/setup`: `cargo test -- --include-ignored`"]
fn rehearse_on_the_allocations_nodes_is_green_with_the_address_nccl_chooses() {
    use cluster_fixture::bootstrap::{nccl_path, Parts, VARIANT};
    let nccl = common::oracle_input("FDL_TEST_NCCL_LIB");
    let _one = CLUSTERS.lock().unwrap_or_else(|e| e.into_inner());
    let parts = Parts::new(&nccl);
    let cluster = Cluster::start_with(None, &parts.mount_args(ROOT));
    let torch = std::fs::read(&parts.libtorch_cuda).unwrap();
    let oracle = std::fs::read(&parts.oracle).unwrap();
    for node in cluster.all() {
        node.write(
            &format!("{ROOT}/libtorch/{VARIANT}/lib/libtorch_cuda.so"),
            &torch,
            0o755,
        );
        node.write(
            &format!("{ROOT}/libtorch/.active"),
            format!("{VARIANT}\n").as_bytes(),
            0o644,
        );
    }
    let lib = nccl_path(ROOT);
    let mut chosen = std::collections::BTreeMap::new();
    for node in &cluster.nodes {
        node.write("/usr/local/bin/nccl-oracle", &oracle, 0o755);
        chosen.insert(
            node.host.clone(),
            cluster_fixture::bootstrap::oracle_in(&node.name, &node.host, &lib, &[])
                .unwrap_or_else(|(code, warn)| {
                    panic!("NCCL failed on {} ({code}): {warn}", node.host)
                }),
        );
    }

    let started = std::time::Instant::now();
    let out = cluster.salloc(&format!("cd {ROOT} && fdl cluster rehearse --slurm --json"));
    eprintln!(
        "$ salloc -N3 fdl cluster rehearse --slurm --json ({} ms)\n{}",
        started.elapsed().as_millis(),
        text(&out)
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v = json_of(&out);
    assert_eq!(v["state"], "ok", "{v}");
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["findings"], serde_json::json!([]), "{v}");
    assert_eq!(v["workers"].as_array().unwrap().len(), 3, "{v}");
    let mut at = std::collections::BTreeMap::new();
    for (host, (iface, addr)) in &chosen {
        let w = worker(&v, host);
        assert!(w["error"].is_null(), "{host}: {v}");
        let b = &w["bootstrap"];
        assert_eq!(b["library"]["trust"]["kind"], "libtorch", "{host}: {v}");
        assert_eq!(b["library"]["version"], "2.27.5", "{host}: {v}");
        assert_eq!(b["library"]["file"], lib.as_str(), "{host}: {v}");
        let outcome = &b["outcome"];
        assert_eq!(outcome["state"], "chosen", "{host}: {v}");
        assert_eq!(outcome["interface"], iface.as_str(), "{host}: {v}");
        let address: std::net::SocketAddr = outcome["address"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("{host}: no address in {v}"));
        assert_eq!(address.ip().to_string(), *addr, "{host}: {v}");
        assert_ne!(address.port(), 0, "{host}: {v}");
        at.insert(host.clone(), address.to_string());
    }
    // Three nodes, three addresses.
    let mut ips: Vec<&String> = chosen.values().map(|(_, a)| a).collect();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 3, "{chosen:?}");

    // Every other node to the root and the root to it, each at the address the one
    // listening chose.
    let root = v["root"].as_str().unwrap().to_string();
    assert!(chosen.contains_key(&root), "{v}");
    let pairs = v["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 4, "{v}");
    for host in chosen.keys().filter(|h| **h != root) {
        for (from, to) in [(host, &root), (&root, host)] {
            let p = pairs
                .iter()
                .find(|p| p["from"] == from.as_str() && p["to"] == to.as_str())
                .unwrap_or_else(|| panic!("no pair {from} -> {to} in {v}"));
            assert_eq!(p["result"]["state"], "yes", "{from} -> {to}: {v}");
            assert!(p["result"]["ms"].is_u64(), "{v}");
            assert_eq!(p["address"], at[to.as_str()].as_str(), "{v}");
        }
    }

    let out = cluster.salloc(&format!("cd {ROOT} && fdl cluster rehearse --slurm"));
    eprintln!("$ salloc -N3 fdl cluster rehearse --slurm\n{}", text(&out));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("ok every worker's NCCL chose an address"),
        "{}",
        text(&out)
    );
}
