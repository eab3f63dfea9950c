//! `fdl cluster ps` against real hosts and a real Slurm: on each host a running process
//! (a small C program compiled here, this machine's glibc being the images') `dlopen`s a
//! real `libnccl.so.2` from the oracle cache (`nvidia-nccl-cu12` 2.27.5, or
//! `nvidia-nccl-cu13` 2.28.9 for the odd one) and sleeps, with its rank in its
//! environment. Over SSH (tests/cluster_fixture: three sshd containers; none has fdl, so
//! the controller ships its own): one host on the other version is red, naming that host
//! and its rank; all three on one version are green, and on the project's build of that
//! very file too; a host with no such process says so. Through Slurm
//! (tests/slurm_fixture): `--slurm --jobid J` from outside the job reaches the three
//! tasks of a running `srun` step and names the node whose NCCL differs.
//!
//! `#[ignore]`d: `.ci/run` runs them with `--include-ignored`; a missing engine or oracle
//! fails them. Every container, network and volume carries the fixtures' label
//! (`fdl-test-host`) and is removed when its test ends, on panic too.

use crate::cluster_fixture;
use crate::common;
use crate::slurm_fixture;
use cluster_fixture::{docker_ok, Host, Keys};
use common::*;
use std::path::{Path, PathBuf};
use std::process::Output;

/// Tests in this file share the engine's ports and the runner's cores: one rig at a time.
static RIGS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Where each host keeps the NCCL and the program.
const NCCL_AT: &str = "/opt/nccl/lib/libnccl.so.2";
const OTHER_NCCL_AT: &str = "/opt/nccl-other/lib/libnccl.so.2";
const RANK_AT: &str = "/opt/ranks/rank";

/// A program that `dlopen`s the NCCL its first argument names, calls `ncclGetVersion`
/// (no GPU needed), then sleeps until killed: a rank, as far as /proc can tell.
fn rank_program(dir: &Path) -> PathBuf {
    let c = dir.join("rank.c");
    std::fs::write(
        &c,
        r#"#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
  if (argc < 2) return 1;
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) { fprintf(stderr, "%s\n", dlerror()); return 2; }
  int (*get)(int *) = (int (*)(int *))dlsym(h, "ncclGetVersion");
  int v = 0;
  if (!get || get(&v) != 0) return 3;
  for (;;) pause();
}
"#,
    )
    .unwrap();
    let exe = dir.join("rank");
    let st = std::process::Command::new("cc")
        .arg(&c)
        .arg("-o")
        .arg(&exe)
        .arg("-ldl")
        .status()
        .expect("cc");
    assert!(st.success());
    exe
}

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

fn schema_ok(v: &serde_json::Value) {
    let errors = common::schema::validate_against("cluster-ps", v);
    assert!(errors.is_empty(), "{}\n{v}", errors.join("\n"));
}

/// The real NCCLs: 2.27.5 (cu12) and 2.28.9 (cu13), as files (not links).
fn nccls() -> (PathBuf, PathBuf) {
    let a = std::fs::canonicalize(oracle_input("FDL_TEST_NCCL_LIB")).unwrap();
    let b = std::fs::canonicalize(oracle_input("FDL_TEST_NCCL_LIB_CU13")).unwrap();
    (a, b)
}

struct Rig {
    keys: Keys,
    hosts: Vec<Host>,
    project: ProjectFixture,
    cache: tempfile::TempDir,
    _work: tempfile::TempDir,
}

impl Rig {
    /// Three hosts, a, b and c, each with both NCCLs and the program, and the project's
    /// checkout path made; no rank runs yet.
    fn new() -> Rig {
        let (nccl, other) = nccls();
        let keys = Keys::new();
        let work = tempfile::tempdir().unwrap();
        let prog = rank_program(work.path());
        let mut hosts = Vec::new();
        for label in ["a", "b", "c"] {
            let host = Host::start(label, &keys);
            host.put(&nccl, NCCL_AT);
            host.put(&other, OTHER_NCCL_AT);
            host.put(&prog, RANK_AT);
            host.exec("mkdir -p /opt/flodl");
            hosts.push(host);
        }
        let project = ProjectFixture::empty();
        let mut y = String::from(
            "cluster:\n  controller:\n    host: 127.0.0.1\n    path: /controller\n  workers:\n",
        );
        for h in &hosts {
            y.push_str(&format!(
                "    - host: {}\n      path: /opt/flodl\n",
                h.label
            ));
            y.push_str(&h.ssh_yaml(&keys, 6));
        }
        std::fs::write(project.root().join("fdl.cluster.yml"), y).unwrap();
        Rig {
            keys,
            hosts,
            project,
            cache: tempfile::tempdir().unwrap(),
            _work: work,
        }
    }

    fn host(&self, label: &str) -> &Host {
        self.hosts.iter().find(|h| h.label == label).unwrap()
    }

    /// Starts a rank on `label` running the NCCL at `nccl`, with `RANK=rank`, and waits
    /// until it maps it.
    fn start_rank(&self, label: &str, rank: u32, nccl: &str) {
        let h = self.host(label);
        docker_ok(&[
            "exec",
            "-d",
            "-e",
            &format!("RANK={rank}"),
            "-e",
            &format!("NCCL_DEBUG={}", if rank == 0 { "WARN" } else { "INFO" }),
            &h.name,
            RANK_AT,
            nccl,
        ]);
        h.exec(&format!(
            "for i in $(seq 100); do grep -qs {} /proc/[0-9]*/maps && exit 0; sleep 0.1; done; exit 1",
            cluster_fixture::sh_quote(nccl)
        ));
    }

    fn stop_ranks(&self, label: &str) {
        // The image is minbase: no pkill. The ranks are the processes running RANK_AT.
        self.host(label).exec(&format!(
            "ranks() {{ for p in /proc/[0-9]*; do [ \"$(readlink $p/exe)\" = {RANK_AT} ] && echo ${{p#/proc/}}; done; }}; \
             kill $(ranks) 2>/dev/null; for i in $(seq 50); do [ -z \"$(ranks)\" ] && exit 0; sleep 0.1; done; exit 1"
        ));
    }

    fn fdl(&self, args: &[&str]) -> Output {
        let _ = &self.keys;
        fdl_in(self.project.root())
            .env("XDG_CACHE_HOME", self.cache.path())
            .args(args)
            .output()
            .unwrap()
    }
}

/// The session docs/cluster.md shows (the block that starts `$ fdl cluster ps`) is this
/// test's real output, pids aside (they differ from run to run), spaces and line breaks
/// run together.
fn docs_show(out: &Output) {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cluster.md")).unwrap();
    let shown: Vec<&str> = doc
        .lines()
        .skip_while(|l| *l != "$ fdl cluster ps")
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .collect();
    assert!(
        !shown.is_empty(),
        "docs/cluster.md shows no `$ fdl cluster ps` session"
    );
    let real = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let real: Vec<&str> = real.lines().collect();
    let norm = |line: &str| -> String {
        let words: Vec<&str> = line.split_whitespace().collect();
        let row = matches!(words.first(), Some(&"a" | &"b" | &"c"));
        words
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let digits = w.trim_end_matches([')', ',', ';']);
                let is_pid = !digits.is_empty()
                    && digits.bytes().all(|b| b.is_ascii_digit())
                    && ((row && i == 1) || (i > 0 && matches!(words[i - 1], "pid" | "(pid")));
                if is_pid {
                    w.replacen(digits, "N", 1)
                } else {
                    w.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    // Lines as one text: where a verdict's line breaks depends on the pids' widths.
    let (shown, real): (String, String) = (
        shown.iter().map(|l| norm(l)).collect::<Vec<_>>().join(" "),
        real.iter().map(|l| norm(l)).collect::<Vec<_>>().join(" "),
    );
    assert_eq!(
        shown, real,
        "docs/cluster.md's `fdl cluster ps` session is not this run's output (pids aside)"
    );
}

/// (1) one host on another NCCL: red, naming it and its rank; (2) all on one: green, and
/// on the project's build of that file; (3) a host without a rank says so; a rank
/// number twice is red.
#[test]
#[ignore = "drives the real Docker engine and OpenSSH, and needs the real NCCLs of `source .ci/setup`: `cargo test -- --include-ignored`"]
fn cluster_ps_over_ssh_names_the_odd_rank_then_is_green() {
    let _one = RIGS.lock().unwrap_or_else(|e| e.into_inner());
    let rig = Rig::new();
    rig.start_rank("a", 0, NCCL_AT);
    rig.start_rank("b", 1, NCCL_AT);
    rig.start_rank("c", 2, OTHER_NCCL_AT);

    // (1) c runs 2.28.9, the others 2.27.5.
    let out = rig.fdl(&["cluster", "ps", "--json"]);
    let v = json_of(&out);
    schema_ok(&v);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(v["state"], "red", "{v}");
    let version = verdict(&v, "version");
    assert_eq!(version["state"], "red", "{v}");
    assert_eq!(
        version["blame"],
        serde_json::json!([version["blame"][0].clone()])
    );
    let blamed = version["blame"][0].as_str().unwrap();
    assert!(blamed.starts_with("c rank 2 (pid "), "{v}");
    let detail = version["detail"].as_str().unwrap();
    assert!(
        detail.contains("2.27.5 on a rank 0") && detail.contains("2.28.9 on c rank 2"),
        "{detail}"
    );
    assert_eq!(verdict(&v, "digest")["state"], "red", "{v}");
    assert_eq!(verdict(&v, "build")["state"], "skipped", "{v}");
    let settings = verdict(&v, "settings");
    assert_eq!(settings["state"], "note", "{v}");
    assert_eq!(settings["blame"], serde_json::json!(["NCCL_DEBUG"]), "{v}");
    for w in v["workers"].as_array().unwrap() {
        assert_eq!(w["state"], "answered", "{w}");
        assert_eq!(w["shipped_fdl"], true, "no host has fdl: {w}");
        let p = &w["processes"][0];
        assert_eq!(p["rank"]["variable"], "RANK", "{w}");
        assert_eq!(p["reach"]["answer"], "one", "{w}");
        assert_eq!(p["nccl"][0]["kind"], "library", "{w}");
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the ranks do not agree: version (c rank 2 (pid "),
        "{err}"
    );

    // The same in text: the table and the verdicts.
    let out = rig.fdl(&["cluster", "ps"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(
        t.contains("HOST  PID") && t.contains("REACHED BY") && t.contains("PLUGINS"),
        "{t}"
    );
    let row = t
        .lines()
        .find(|l| l.starts_with("c  "))
        .unwrap_or_else(|| panic!("{t}"));
    assert!(
        row.contains(" 2  ") && row.contains("2.28.9") && row.contains(OTHER_NCCL_AT),
        "{row}"
    );
    assert!(t.contains("RED     version"), "{t}");
    eprintln!("{t}");
    docs_show(&out);

    // (2) c on 2.27.5 too: green, its fdl already there.
    rig.stop_ranks("c");
    rig.start_rank("c", 2, NCCL_AT);
    let out = rig.fdl(&["cluster", "ps", "--json"]);
    let v = json_of(&out);
    schema_ok(&v);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(v["state"], "ok", "{v}");
    assert_eq!(
        verdict(&v, "version")["detail"],
        "every rank runs NCCL 2.27.5",
        "{v}"
    );
    assert_eq!(v["workers"][2]["shipped_fdl"], false, "{v}");
    // Without reading memory: the loader's rules answer, the only NCCL mapped.
    let out = rig.fdl(&["cluster", "ps", "--json", "--no-memory"]);
    let v = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for w in v["workers"].as_array().unwrap() {
        let e = &w["processes"][0]["reach"]["evidence"];
        assert_eq!(e["evidence"], "model", "{w}");
        assert_eq!(e["rule"]["rule"], "only_one", "{w}");
        assert_eq!(e["memory"], "not read (--no-memory)", "{w}");
    }

    // On the project's build whose lib/libnccl.so.2 is that very file: ok; named, since
    // a default would ask every worker's GPUs.
    let (nccl, _) = nccls();
    let tree = tempfile::tempdir().unwrap();
    write_nccl_tree(tree.path(), (2, 27, 5), &[80]);
    std::fs::copy(&nccl, tree.path().join("lib/libnccl.so.2.27.5")).unwrap();
    let name = install_build(
        rig.project.root(),
        rig.cache.path(),
        tree.path(),
        "v2.27.5-1",
        "8.0",
    )
    .unwrap();
    let out = rig.fdl(&["cluster", "ps", "--json", &name]);
    let v = json_of(&out);
    schema_ok(&v);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(verdict(&v, "build")["state"], "ok", "{v}");
    assert_eq!(v["build"]["name"], name.as_str(), "{v}");
    // Not named: `cluster env`'s default (here the only build, asked of the workers'
    // reports first), said on stderr.
    let out = rig.fdl(&["cluster", "ps", "--json"]);
    let v = json_of(&out);
    schema_ok(&v);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(v["build"]["state"], "build", "{v}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains(&format!("fdl: chose build {name}: the only build")),
        "{}",
        text(&out)
    );
    assert_eq!(v["build"]["name"], name.as_str(), "{v}");
    assert_eq!(verdict(&v, "build")["state"], "ok", "{v}");

    // (3) b runs nothing: it says so (exit 3, unknown), and a rank 0 twice is red.
    rig.stop_ranks("b");
    let out = rig.fdl(&["cluster", "ps", "--json"]);
    let v = json_of(&out);
    schema_ok(&v);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let procs = verdict(&v, "processes");
    assert_eq!(procs["state"], "unknown", "{v}");
    assert_eq!(procs["blame"], serde_json::json!(["b"]), "{v}");
    assert!(
        procs["detail"]
            .as_str()
            .unwrap()
            .starts_with("b runs no process that maps an NCCL"),
        "{v}"
    );
    let t = String::from_utf8_lossy(&rig.fdl(&["cluster", "ps"]).stdout).into_owned();
    assert!(t.contains("b: no process maps an NCCL"), "{t}");

    rig.start_rank("b", 0, NCCL_AT);
    let out = rig.fdl(&["cluster", "ps", "--json"]);
    let v = json_of(&out);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let ranks = verdict(&v, "ranks");
    assert_eq!(ranks["state"], "red", "{v}");
    let detail = ranks["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("rank 0 is run by 2 processes: a rank 0 (pid ")
            && detail.contains("b rank 0 (pid "),
        "{detail}"
    );
}

/// (4) `--slurm --jobid J` from outside the job: the three tasks of its running step,
/// their ranks Slurm's own (`SLURM_PROCID`), node3's NCCL another release: red, naming
/// node3 and rank 2.
#[test]
#[ignore = "needs Docker: drives a real Slurm in containers, and the real NCCLs of `source .ci/setup`: `cargo test -- --include-ignored`"]
fn cluster_ps_slurm_reaches_a_running_jobs_tasks() {
    let _one = RIGS.lock().unwrap_or_else(|e| e.into_inner());
    let (nccl, other) = nccls();
    let work = tempfile::tempdir().unwrap();
    let prog = std::fs::read(rank_program(work.path())).unwrap();
    let cluster = slurm_fixture::Cluster::start(None);
    for node in &cluster.nodes {
        let lib = if node.host == "node3" { &other } else { &nccl };
        node.write(NCCL_AT, &std::fs::read(lib).unwrap(), 0o755);
        node.write(RANK_AT, &prog, 0o755);
        node.exec("mkdir -p /srv/flodl");
    }
    cluster.ctl.exec("mkdir -p /srv/flodl");
    let job = cluster
        .ctl
        .exec(&format!(
            "sbatch --parsable -N3 --wrap {}",
            slurm_fixture::sh_quote(&format!("srun -N3 --ntasks-per-node=1 {RANK_AT} {NCCL_AT}"))
        ))
        .trim()
        .to_string();
    assert!(job.bytes().all(|b| b.is_ascii_digit()), "{job}");
    for node in &cluster.nodes {
        let out = node.run(&format!(
            "for i in $(seq 300); do grep -qs {NCCL_AT} /proc/[0-9]*/maps && exit 0; sleep 0.1; done; exit 1"
        ));
        assert!(
            out.status.success(),
            "the job's task never ran on {}:\n{}\n{}",
            node.host,
            cluster
                .ctl
                .run(&format!("squeue; scontrol show job {job}"))
                .status,
            node.logs()
        );
    }
    let out = cluster.ctl.run(&format!(
        "cd /srv/flodl && fdl cluster ps --slurm --jobid {job} --json"
    ));
    let v = json_of(&out);
    schema_ok(&v);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let hosts: Vec<&str> = v["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["host"].as_str().unwrap())
        .collect();
    assert_eq!(hosts, ["node1", "node2", "node3"], "{v}");
    for (i, w) in v["workers"].as_array().unwrap().iter().enumerate() {
        let procs = w["processes"].as_array().unwrap_or_else(|| panic!("{w}"));
        assert_eq!(procs.len(), 1, "only the task maps an NCCL: {w}");
        assert_eq!(procs[0]["rank"]["variable"], "SLURM_PROCID", "{w}");
        assert_eq!(procs[0]["rank"]["value"], i, "{w}");
    }
    let version = verdict(&v, "version");
    assert_eq!(version["state"], "red", "{v}");
    assert!(
        version["blame"][0]
            .as_str()
            .unwrap()
            .starts_with("node3 rank 2 (pid "),
        "{v}"
    );
    assert_eq!(verdict(&v, "ranks")["state"], "ok", "{v}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("version (node3 rank 2 (pid "), "{err}");

    // A job that is not running is refused at once, naming it.
    let out = cluster
        .ctl
        .run("cd /srv/flodl && fdl cluster ps --slurm --jobid 999999");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("999999"), "{}", text(&out));
    cluster.ctl.run(&format!("scancel {job}"));
}
