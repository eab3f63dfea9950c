//! A real Slurm for the `fdl cluster --slurm` tests: Debian's own Slurm 22.05 (from
//! `fdl-test-debian:slurm`, tests/support/slurm-image.sh: this machine's release, made by
//! debootstrap, since no registry is reachable) in four containers on one user-defined
//! Docker network: `ctl` runs slurmctld, `node1`..`node3` run slurmd, all share one munge
//! key made for this cluster, and each has its own filesystem. The daemons are started
//! directly (no systemd); [`Cluster::start`] returns once `sinfo` shows every node idle.
//!
//! Slurm here runs without cgroups (`proctrack/linuxproc`, `task/none`): these engines run
//! cgroup v1 with cgroupfs, which Slurm's cgroup plugins cannot use inside a container.
//! Timeouts are short so that a killed node is noticed within seconds.
//!
//! `ctl` holds the fdl under test, this build's binary bind-mounted read-only (the image's
//! glibc is this machine's: the same Debian release); the nodes have none, so fdl must
//! send its own. Tests in one file run as threads of one process: names are unique
//! (`fdl-test-slurm-<pid>-<nanos>-<role>`), and the containers, network and volume are
//! removed when the [`Cluster`] drops, on panic too. A test process killed outright leaves
//! them behind; they carry the label `fdl-test-host`:
//! `docker rm -f $(docker ps -aq --filter label=fdl-test-host)`, then
//! `docker network prune --filter label=fdl-test-host`.
#![allow(dead_code)]

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub const IMAGE: &str = "fdl-test-debian:slurm";
/// The label on every container, network and volume (the one tests/cluster_fixture uses).
pub const LABEL: &str = "fdl-test-host";
/// How long [`Cluster::start`] waits for every node to be idle.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// The node names (and container hostnames) of the cluster.
pub const NODES: [&str; 3] = ["node1", "node2", "node3"];

// The engine helpers are the ssh fixture's: every binary that uses this one has both.
pub use crate::cluster_fixture::sh_quote;
use crate::cluster_fixture::{docker, docker_ok};

/// Checks the engine answers and makes the image, once per process; every caller panics
/// when either failed (an ignored test run on purpose must fail, not pass, without them).
fn ensure_image() {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    if let Err(e) =
        READY.get_or_init(|| crate::cluster_fixture::make_image("slurm-image.sh", IMAGE))
    {
        panic!("{e}");
    }
}

fn unique(role: &str) -> String {
    crate::cluster_fixture::unique_in("fdl-test-slurm", role)
}

/// One container of the cluster: `host` is its hostname and Slurm name.
pub struct Node {
    pub name: String,
    pub host: String,
}

impl Node {
    /// `sh -c script` in the container as root, whatever its exit.
    pub fn run(&self, script: &str) -> Output {
        docker(&["exec", &self.name, "sh", "-c", script])
    }

    /// [`Node::run`] that panics with stderr on failure and returns stdout.
    pub fn exec(&self, script: &str) -> String {
        let out = self.run(script);
        assert!(
            out.status.success(),
            "on {}: `{script}` failed ({}): {}{}",
            self.host,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Writes `bytes` to `dest` (parent directories made) with `mode`.
    pub fn write(&self, dest: &str, bytes: &[u8], mode: u32) {
        let script = format!(
            "mkdir -p \"$(dirname {d})\" && cat >{d} && chmod {mode:o} {d}",
            d = sh_quote(dest)
        );
        let mut child = Command::new("docker")
            .args(["exec", "-i", &self.name, "sh", "-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot run docker");
        child.stdin.take().unwrap().write_all(bytes).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "on {}: writing {dest} failed: {}",
            self.host,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }

    /// Copies the tree `src` of this machine to `dest` in the container (links kept).
    pub fn put_tree(&self, src: &Path, dest: &str) {
        self.exec(&format!("mkdir -p {}", sh_quote(dest)));
        docker_ok(&[
            "cp",
            &format!("{}/.", src.display()),
            &format!("{}:{dest}", self.name),
        ]);
    }

    pub fn kill(&self) {
        docker_ok(&["kill", &self.name]);
    }

    pub fn logs(&self) -> String {
        let out = self.run("tail -n 40 /var/log/slurm/*.log /var/log/munge/munged.log 2>&1");
        format!(
            "--- {} ---\n{}{}",
            self.host,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }
}

/// The cluster: `ctl` and [`NODES`], removed on drop.
pub struct Cluster {
    pub network: String,
    pub ctl: Node,
    pub nodes: Vec<Node>,
    /// The shared volume, when the cluster has one.
    pub volume: Option<String>,
}

/// slurm.conf for `ctl` and [`NODES`]: no cgroups, no accounting, whole nodes, short
/// timeouts, and a node that comes back is used again (`ReturnToService=2`).
pub fn slurm_conf() -> String {
    let mut c = String::from(
        "# written by tests/slurm_fixture\n\
         ClusterName=fdltest\n\
         SlurmctldHost=ctl\n\
         AuthType=auth/munge\n\
         SlurmUser=root\n\
         SlurmdUser=root\n\
         StateSaveLocation=/var/spool/slurmctld\n\
         SlurmdSpoolDir=/var/spool/slurmd\n\
         SlurmctldPidFile=/run/slurmctld.pid\n\
         SlurmdPidFile=/run/slurmd.pid\n\
         SlurmctldLogFile=/var/log/slurm/slurmctld.log\n\
         SlurmdLogFile=/var/log/slurm/slurmd.log\n\
         ProctrackType=proctrack/linuxproc\n\
         TaskPlugin=task/none\n\
         JobAcctGatherType=jobacct_gather/none\n\
         AccountingStorageType=accounting_storage/none\n\
         SelectType=select/linear\n\
         SchedulerType=sched/backfill\n\
         MpiDefault=none\n\
         ReturnToService=2\n\
         SlurmdTimeout=10\n\
         MessageTimeout=5\n\
         InactiveLimit=0\n\
         KillWait=5\n\
         Waittime=0\n",
    );
    for n in NODES {
        c.push_str(&format!(
            "NodeName={n} NodeHostname={n} CPUs=1 RealMemory=100 State=UNKNOWN\n"
        ));
    }
    c.push_str("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n");
    c
}

impl Cluster {
    /// Starts the cluster; with `shared`, a fresh Docker volume is mounted at that path on
    /// all four containers (a shared project directory, as `$HOME` often is).
    pub fn start(shared: Option<&str>) -> Cluster {
        Cluster::start_with(shared, &[])
    }

    /// [`Cluster::start`], with `node_args` added to each node's `docker run` (not the
    /// controller's): a bind mount of a large file every node reads, say.
    pub fn start_with(shared: Option<&str>, node_args: &[String]) -> Cluster {
        ensure_image();
        let network = unique("net");
        docker_ok(&["network", "create", "--label", LABEL, &network]);
        // Made before the containers, so a panic from here on removes all of it.
        let mut cluster = Cluster {
            network,
            ctl: Node {
                name: unique("ctl"),
                host: "ctl".into(),
            },
            nodes: NODES
                .iter()
                .map(|n| Node {
                    name: unique(n),
                    host: n.to_string(),
                })
                .collect(),
            volume: None,
        };
        if shared.is_some() {
            let v = unique("vol");
            docker_ok(&["volume", "create", "--label", LABEL, &v]);
            cluster.volume = Some(v);
        }
        let fdl = env!("CARGO_BIN_EXE_fdl");
        let fdl_mount = format!("{fdl}:/usr/local/bin/fdl:ro");
        let shared_mount = match (&cluster.volume, shared) {
            (Some(v), Some(at)) => Some(format!("{v}:{at}")),
            _ => None,
        };
        for (node, is_ctl) in
            std::iter::once((&cluster.ctl, true)).chain(cluster.nodes.iter().map(|n| (n, false)))
        {
            let mut args = vec![
                "run",
                "-d",
                "--init",
                "--name",
                &node.name,
                "--hostname",
                &node.host,
                "--label",
                LABEL,
                "--network",
                &cluster.network,
                "--network-alias",
                &node.host,
            ];
            if is_ctl {
                args.extend(["-v", &fdl_mount]);
            }
            if let Some(m) = &shared_mount {
                args.extend(["-v", m]);
            }
            if !is_ctl {
                args.extend(node_args.iter().map(String::as_str));
            }
            args.extend([IMAGE, "sleep", "infinity"]);
            docker_ok(&args);
        }
        // One munge key for this cluster: 1 KiB from this machine's randomness.
        let mut key = vec![0u8; 1024];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key))
            .expect("cannot read /dev/urandom");
        let conf = slurm_conf();
        for node in cluster.all() {
            node.write("/etc/munge/munge.key", &key, 0o400);
            node.write("/etc/slurm/slurm.conf", conf.as_bytes(), 0o644);
            node.exec(
                "chown munge:munge /etc/munge/munge.key && mkdir -p /run/munge /var/log/munge /var/lib/munge \
                 && chown munge:munge /run/munge /var/log/munge /var/lib/munge \
                 && mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm \
                 && runuser -u munge -- /usr/sbin/munged",
            );
        }
        cluster.ctl.exec("/usr/sbin/slurmctld");
        for node in &cluster.nodes {
            node.exec(&format!("/usr/sbin/slurmd -N {}", node.host));
        }
        cluster.wait_idle();
        cluster
    }

    pub fn all(&self) -> impl Iterator<Item = &Node> {
        std::iter::once(&self.ctl).chain(self.nodes.iter())
    }

    pub fn node(&self, host: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.host == host)
            .unwrap_or_else(|| panic!("no node {host}"))
    }

    /// Every node's state as `sinfo` says it: `node1 idle` lines.
    pub fn sinfo(&self) -> String {
        let out = self.ctl.run("sinfo -h -N -o '%N %t'");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until `sinfo` shows every node idle; panics with the daemons' logs if not.
    pub fn wait_idle(&self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last = String::new();
        while Instant::now() < deadline {
            last = self.sinfo();
            let idle = last
                .lines()
                .filter(|l| l.split_whitespace().nth(1) == Some("idle"))
                .count();
            if idle == NODES.len() {
                return;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        let logs: Vec<String> = self.all().map(Node::logs).collect();
        panic!(
            "the Slurm nodes were not all idle within {} s; sinfo says:\n{last}\n{}",
            READY_TIMEOUT.as_secs(),
            logs.join("\n")
        );
    }

    /// `salloc -N3 --no-kill` (a node that fails does not end the job) running `script` on
    /// `ctl` in the allocation, as a user's shell in a job runs it.
    pub fn salloc(&self, script: &str) -> Output {
        self.ctl.run(&format!(
            "salloc -N{} --no-kill -Q sh -c {}",
            NODES.len(),
            sh_quote(script)
        ))
    }

    /// Puts the stand-in `nvidia-smi` of `gpus` first on every node's PATH.
    pub fn plant_gpus(&self, host: &str, smi_script: &str) {
        self.node(host)
            .write("/usr/local/bin/nvidia-smi", smi_script.as_bytes(), 0o755);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in self.all() {
            let _ = Command::new("docker")
                .args(["rm", "-f", &node.name])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = Command::new("docker")
            .args(["network", "rm", &self.network])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if let Some(v) = &self.volume {
            let _ = Command::new("docker")
                .args(["volume", "rm", "-f", v])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}
