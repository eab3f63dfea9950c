//! Reaching the nodes of a Slurm allocation: `srun` steps inside the job the user is in
//! (`salloc`, `sbatch`), never ssh, which clusters often forbid outside a job.
//!
//! The hosts are the job's nodes (`SLURM_JOB_ID`, `scontrol show hostnames
//! "$SLURM_JOB_NODELIST"`), each with the project at one absolute path. A command runs on
//! all of them in one step (`srun --nodes=N --ntasks-per-node=1 --overlap --label`), so
//! asking three nodes costs about one `srun`; each task prints its node name first and its
//! exit last, and the labelled output is split back per node, each bounded by
//! [`OUTPUT_CAP`]. A node Slurm calls drained, down or not responding gets no step and is
//! named; a node that dies during one is named by what srun said, and the others finish.
//! The states (`scontrol show node -o`) are asked when fdl starts and come while the
//! first step runs; a step holding a node they call unusable is stopped and run again
//! without it.
//! Files go out by `sbcast` (one broadcast to the job's nodes), or, where sbcast is
//! missing or fails, as a stream into one `srun` task per node.

use super::config::Worker;
use super::transport::{
    copy_error, copy_limit, enter_incoming, Script, Transport, Unreachable, Unreached,
};
use crate::process::OUTPUT_CAP;
use crate::step::single_quote;
use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// The allocation fdl runs in.
#[derive(Debug)]
pub struct Slurm {
    pub job: String,
    /// Its nodes, in scontrol's order.
    pub nodes: Vec<String>,
    /// The nodes' states, asked at the start: the first step runs while they come
    /// instead of after; every later step asks afresh.
    states: Pending,
    /// How long one `scontrol` may take: the command's `--timeout`, never a fixed time
    /// of fdl's own (a hung slurmctld would otherwise cost that whatever the user asked).
    scontrol_limit: Duration,
}

/// The unusable nodes among the job's, by name, with why; `None`: scontrol gave no answer.
type States = Option<BTreeMap<String, String>>;

/// The states asked when fdl starts, answered by a thread of their own: `scontrol` takes
/// about a third of an `srun -N3 true`, so the first step does not wait for it.
#[derive(Debug)]
struct Pending {
    asking: std::sync::Mutex<Option<std::thread::JoinHandle<States>>>,
    answer: std::sync::OnceLock<States>,
    /// Whether a step has taken this answer (later ones ask afresh).
    taken: std::sync::atomic::AtomicBool,
}

impl Pending {
    fn ask(list: String, timeout: Duration) -> Pending {
        Pending {
            asking: std::sync::Mutex::new(Some(std::thread::spawn(move || {
                node_states(&list, timeout)
            }))),
            answer: std::sync::OnceLock::new(),
            taken: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The answer if it has come, without waiting.
    fn ready(&self) -> Option<&States> {
        if let Some(a) = self.answer.get() {
            return Some(a);
        }
        // The answer is set while the lock is held, so `wait` never misses it.
        let mut asking = self.asking.lock().unwrap_or_else(|e| e.into_inner());
        if asking.as_ref().is_some_and(|h| h.is_finished()) {
            let h = asking.take().expect("checked above");
            let _ = self.answer.set(h.join().ok().flatten());
        }
        self.answer.get()
    }

    /// The answer, waiting for it (scontrol is bounded by `--timeout`).
    fn wait(&self) -> &States {
        {
            let mut asking = self.asking.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(h) = asking.take() {
                let _ = self.answer.set(h.join().ok().flatten());
            }
        }
        self.answer.get_or_init(|| None)
    }

    /// Whether this is the first step's turn (and takes it).
    fn first(&self) -> bool {
        !self.taken.swap(true, std::sync::atomic::Ordering::SeqCst)
    }
}

/// A step fdl stopped because a node of it turned out unusable: its nodes are asked
/// again, without that node.
#[derive(Debug)]
struct StepStopped;

impl std::fmt::Display for StepStopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the step was stopped: a node of it is unusable")
    }
}

impl std::error::Error for StepStopped {}

/// The first line each task prints: its node's name.
const NODE_MARK: &str = "fdl-node:";
/// The last line each task prints: the script's exit status.
const EXIT_MARK: &str = "fdl-exit:";
/// The name sbcast gives the build's tar inside `.incoming-<name>/`.
const SHIP_TAR: &str = ".fdl-ship.tar";

/// A word Slurm gave that fdl puts on a command line: letters, digits, `-_.`.
fn plain(word: &str) -> bool {
    !word.is_empty()
        && !word.starts_with('-')
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Whether fdl runs inside a Slurm allocation.
pub fn in_allocation() -> bool {
    std::env::var_os("SLURM_JOB_ID").is_some_and(|v| !v.is_empty())
}

impl Slurm {
    /// The allocation of this environment, or the reason there is none; `timeout` (the
    /// command's `--timeout`) bounds each `scontrol` asked.
    pub fn from_env(timeout: Duration) -> Result<Slurm> {
        let job = std::env::var("SLURM_JOB_ID").unwrap_or_default();
        if job.is_empty() {
            bail!(
                "--slurm needs a Slurm allocation, and SLURM_JOB_ID is not set: run fdl inside one, with `salloc -N3 fdl cluster status --slurm` or from an `sbatch` script"
            );
        }
        if !plain(&job) {
            bail!(
                "SLURM_JOB_ID is '{}', not a job id",
                crate::text::clean(&job)
            );
        }
        let list = std::env::var("SLURM_JOB_NODELIST")
            .or_else(|_| std::env::var("SLURM_NODELIST"))
            .map_err(|_| anyhow!("Slurm job {job} has no SLURM_JOB_NODELIST in this environment: run fdl in the job's own shell (salloc, sbatch)"))?;
        // The states are asked at once, and answer while fdl goes on. A list in the
        // common form (`node[1-3,7],gpu05`) is expanded here; any other form is
        // scontrol's to expand. Either way the names are the same (the unit tests hold
        // scontrol 22.05's answers for these forms).
        let states = Pending::ask(list.clone(), timeout);
        let nodes = match expand_hostlist(&list) {
            Some(names) => names,
            None => scontrol_hostnames(&list, timeout)?,
        };
        Ok(Slurm {
            job,
            nodes,
            states,
            scontrol_limit: timeout,
        })
    }

    /// The allocation of the running job `job`, named by `--jobid` rather than this
    /// environment's: its nodes, from `squeue`, reached by steps that overlap the job's
    /// own (`srun --jobid=JOB --overlap`), as a user's own shell may do from a login node
    /// while the job runs.
    pub fn for_job(job: &str, timeout: Duration) -> Result<Slurm> {
        if !plain(job) {
            bail!(
                "--jobid '{}' is not a job id (digits, as squeue lists them)",
                crate::text::clean(job)
            );
        }
        let mut cmd = Command::new("squeue");
        cmd.args(["--noheader", "--format=%T %N"])
            .arg(format!("--jobs={job}"));
        let out = crate::process::query_within(&mut cmd, timeout)
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    anyhow!("squeue was not found: run fdl where Slurm's client tools are on PATH")
                } else {
                    crate::process::lift(e)
                }
            })?
            .ok_or_else(|| {
                anyhow!(
                    "`squeue --jobs={job}` gave no answer within {} s (--timeout): is slurmctld up? Run `scontrol ping`, or give a longer --timeout",
                    timeout.as_secs()
                )
            })?;
        if !out.status.success() {
            bail!(
                "Slurm knows no job {job}: {}",
                crate::text::clean(String::from_utf8_lossy(&out.stderr).trim())
            );
        }
        let (state, list) = job_state(&String::from_utf8_lossy(&out.stdout)).ok_or_else(|| {
            anyhow!("Slurm lists no job {job} (it ended, or it is another cluster's)")
        })?;
        if state != "RUNNING" {
            bail!(
                "job {job} is {}, not running: it has no processes to look at",
                crate::text::clean(&state.to_ascii_lowercase())
            );
        }
        let states = Pending::ask(list.clone(), timeout);
        let nodes = match expand_hostlist(&list) {
            Some(names) => names,
            None => scontrol_hostnames(&list, timeout)?,
        };
        Ok(Slurm {
            job: job.to_string(),
            nodes,
            states,
            scontrol_limit: timeout,
        })
    }

    /// The workers: the allocation's nodes (or the `only` ones of them), each with the
    /// project at `path`, and the job's `LD_PRELOAD` as their preload (srun hands the
    /// job's environment to every task).
    pub fn workers(&self, only: &[String], path: &str) -> Result<Vec<Worker>> {
        for name in only {
            if !self.nodes.contains(name) {
                bail!(
                    "--nodes names {}, which is not a node of job {}: its nodes are {}",
                    crate::text::clean(name),
                    self.job,
                    self.nodes.join(",")
                );
            }
        }
        let mut env = BTreeMap::new();
        if let Ok(pre) = std::env::var("LD_PRELOAD") {
            env.insert("LD_PRELOAD".to_string(), pre);
        }
        Ok(self
            .nodes
            .iter()
            .filter(|n| only.is_empty() || only.contains(n))
            .map(|n| Worker {
                host: n.clone(),
                path: path.to_string(),
                arch: None,
                ssh: super::config::SshSettings {
                    target: n.clone(),
                    ..Default::default()
                },
                env: env.clone(),
                docker: None,
            })
            .collect())
    }

    /// `srun` for one step on `nodes` of the job, each task one `sh -c script`, its
    /// output lines prefixed with the task's number when `label`.
    fn srun(&self, nodes: &[&str], script: &str, label: bool) -> Command {
        let mut cmd = Command::new("srun");
        if label {
            cmd.arg("--label");
        }
        cmd.arg(format!("--jobid={}", self.job))
            .arg(format!("--nodes={}", nodes.len()))
            .arg(format!("--ntasks={}", nodes.len()))
            .args(["--ntasks-per-node=1", "--overlap", "--kill-on-bad-exit=0"])
            .arg(format!("--nodelist={}", nodes.join(",")))
            .args(["--", "/bin/sh", "-c", script])
            // The job's preload is for the ranks, not for fdl and the shells it runs.
            .env_remove("LD_PRELOAD");
        cmd
    }

    /// One step across `nodes`, the answers split per node, and whether it timed out.
    /// `stop` (asked while it runs, with the step's nodes) ends it early: each node's
    /// answer is then [`StepStopped`].
    fn step(
        &self,
        nodes: &[&str],
        script: &str,
        timeout: Duration,
        stop: &(dyn Fn(&[&str]) -> bool + Sync),
    ) -> (Vec<Result<Output>>, bool) {
        let wrapped = format!(
            "printf '{NODE_MARK}%s\\n' \"$SLURMD_NODENAME\"; ( {script}\n); printf '\\n{EXIT_MARK}%s\\n' \"$?\""
        );
        let mut cmd = self.srun(nodes, &wrapped, true);
        let out = match capture_step(&mut cmd, nodes.len(), timeout, &|| stop(nodes)) {
            Ok(Some(out)) => out,
            Ok(None) => {
                let outs = nodes
                    .iter()
                    .map(|n| {
                        Err(Unreachable::error(
                            Unreached::Slurm,
                            format!(
                                "no answer from {n} through srun within {} s (the step was stopped)",
                                timeout.as_secs()
                            ),
                        ))
                    })
                    .collect();
                return (outs, true);
            }
            Err(e) if crate::process::is_stopped(&e) => {
                return (
                    nodes.iter().map(|_| Err(StepStopped.into())).collect(),
                    false,
                );
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let why = "srun was not found: run fdl where Slurm's client tools are on PATH";
                return (nodes.iter().map(|_| Err(anyhow!(why))).collect(), true);
            }
            Err(e) => {
                let why = format!("{:#}", crate::process::lift(e).context("srun failed"));
                return (nodes.iter().map(|_| Err(anyhow!("{why}"))).collect(), true);
            }
        };
        (demux(nodes, &out), false)
    }

    /// The nodes among `nodes` Slurm will run no step on, with why: the first caller
    /// takes the states asked at the start, every later one asks afresh.
    fn unusable(&self, nodes: &[&str]) -> BTreeMap<String, String> {
        let read = if self.states.first() {
            self.states.wait().clone()
        } else {
            None
        };
        read.or_else(|| node_states(&nodes.join(","), self.scontrol_limit))
            .map(|m| among(m, nodes))
            .unwrap_or_default()
    }

    /// sbcast of `from` to `dest` on the job's nodes; `Err` when sbcast is missing or
    /// reports a failure (then the caller streams the file instead).
    fn sbcast(&self, from: &Path, dest: &str, timeout: Duration) -> Result<()> {
        let mut cmd = Command::new("sbcast");
        cmd.arg("--force")
            .arg(format!("--jobid={}", self.job))
            .arg(format!("--timeout={}", timeout.as_secs().max(1)))
            .arg("--")
            .arg(from)
            .arg(dest);
        let out = crate::process::output_within(&mut cmd, copy_limit(timeout))
            .map_err(crate::process::lift)?
            .ok_or_else(|| anyhow!("sbcast took too long"))?;
        if !out.status.success() {
            bail!(
                "sbcast failed: {}",
                copy_error(&String::from_utf8_lossy(&out.stderr))
            );
        }
        Ok(())
    }

    /// `script` on `node` alone, its stdin the file `input`: the stream where sbcast
    /// cannot serve.
    fn stream_to(&self, node: &str, script: &str, input: &Path, timeout: Duration) -> Result<()> {
        let mut cmd = self.srun(&[node], script, false);
        cmd.stdin(Stdio::from(crate::fsread::open_regular(input, false)?));
        let out = crate::process::output_within_keeping_stdin(&mut cmd, copy_limit(timeout))
            .map_err(crate::process::lift)
            .context("cannot run srun")?
            .ok_or_else(|| {
                anyhow!("the copy to {node} took too long and was stopped (rerun ship)")
            })?;
        if !out.status.success() {
            return Err(Unreachable::error(
                Unreached::Slurm,
                format!(
                    "the copy to {node} through srun failed (rerun ship): {}",
                    copy_error(&String::from_utf8_lossy(&out.stderr))
                ),
            ));
        }
        Ok(())
    }

    /// Runs per group of equal directories: sbcast once, or the stream per node.
    fn send_by_dir(
        &self,
        hosts: &[(&Worker, String)],
        from: &Path,
        name: &str,
        timeout: Duration,
        after: &(dyn Fn(&str) -> String + Sync),
    ) -> Vec<Result<String>> {
        let mut results: Vec<Option<Result<String>>> = hosts.iter().map(|_| None).collect();
        let sha = match crate::digest::sha256_file(from) {
            Ok(s) => s,
            Err(e) => {
                let why = format!("cannot read {}: {e:#}", from.display());
                return hosts.iter().map(|_| Err(anyhow!("{why}"))).collect();
            }
        };
        let mut dirs: Vec<&String> = hosts.iter().map(|(_, d)| d).collect();
        dirs.sort();
        dirs.dedup();
        for dir in dirs {
            let idx: Vec<usize> = (0..hosts.len()).filter(|&i| hosts[i].1 == *dir).collect();
            let ws: Vec<&Worker> = idx.iter().map(|&i| hosts[i].0).collect();
            let dest = format!("{}/{name}", dir.trim_end_matches('/'));
            // sbcast reaches every node of the job: used when those are the nodes asked
            // for, else a node outside them (drained, or one with no such directory)
            // fails it as a whole. Its exit is not the nodes' answer either (one dead
            // node fails it, and it may leave partial files behind): each node checks
            // the bytes it got, and one without them gets the stream.
            let everyone = self.nodes.iter().all(|n| ws.iter().any(|w| w.host == *n));
            let sbcast = everyone && crate::process::on_path("sbcast").is_some() && {
                let _ = self.sbcast(from, &dest, timeout);
                true
            };
            let script = format!(
                "cd -P -- {} && [ \"$(sha256sum < {} | cut -d' ' -f1)\" = {} ] && {{ {}\n}}",
                single_quote(dir),
                single_quote(name),
                single_quote(&sha),
                after(dir)
            );
            let outs = if sbcast {
                Some(self.run_each(&ws, &|_| script.clone(), timeout))
            } else {
                None
            };
            if let Some(outs) = outs {
                let mut retry = Vec::new();
                for (&i, out) in idx.iter().zip(outs) {
                    match out {
                        Ok(o) if o.status.success() => results[i] = Some(Ok("sbcast".into())),
                        // The node answered without the file: it gets the stream.
                        Ok(_) => retry.push(i),
                        // The node itself failed: the stream would fail as well.
                        Err(e) => results[i] = Some(Err(e)),
                    }
                }
                if retry.is_empty() {
                    continue;
                }
                self.stream_each(hosts, &retry, from, name, timeout, after, &mut results);
            } else {
                self.stream_each(hosts, &idx, from, name, timeout, after, &mut results);
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(anyhow!("no answer"))))
            .collect()
    }

    /// The hosts `idx` of `hosts`, one step per distinct script (one in all for a project
    /// at one path), in order of `idx`.
    fn steps(
        &self,
        hosts: &[&Worker],
        idx: &[usize],
        script: Script,
        timeout: Duration,
        stop: &(dyn Fn(&[&str]) -> bool + Sync),
    ) -> Vec<Result<Output>> {
        let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
        for (k, &i) in idx.iter().enumerate() {
            let s = script(hosts[i]);
            match groups.iter_mut().find(|(g, _)| *g == s) {
                Some((_, ks)) => ks.push(k),
                None => groups.push((s, vec![k])),
            }
        }
        let answers = super::in_parallel(
            &groups,
            groups.len().max(1),
            |(s, ks)| {
                let nodes: Vec<&str> = ks.iter().map(|&k| hosts[idx[k]].host.as_str()).collect();
                let (mut outs, timed_out) = self.step(&nodes, s, timeout, stop);
                // A node that dies aborts the whole step: Slurm kills the other tasks
                // too. Each node left without an answer gets a step of its own, so only
                // the dead one stays failed (not after a timeout: that would double it,
                // nor after fdl stopped it).
                let lost: Vec<usize> = (0..nodes.len())
                    .filter(|&j| outs[j].as_ref().is_err_and(|e| !e.is::<StepStopped>()))
                    .collect();
                if nodes.len() > 1 && !timed_out && !lost.is_empty() {
                    let again = super::in_parallel(
                        &lost,
                        lost.len(),
                        |&j| self.step(&[nodes[j]], s, timeout, stop).0.remove(0),
                        &|_| {},
                    );
                    for (j, out) in lost.into_iter().zip(again) {
                        outs[j] = out;
                    }
                }
                outs
            },
            &|_| {},
        );
        let mut out: Vec<Option<Result<Output>>> = idx.iter().map(|_| None).collect();
        for ((_, ks), outs) in groups.iter().zip(answers) {
            for (&k, o) in ks.iter().zip(outs) {
                out[k] = Some(o);
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(anyhow!("no answer"))))
            .collect()
    }

    #[allow(clippy::too_many_arguments)]
    fn stream_each(
        &self,
        hosts: &[(&Worker, String)],
        idx: &[usize],
        from: &Path,
        name: &str,
        timeout: Duration,
        after: &(dyn Fn(&str) -> String + Sync),
        results: &mut [Option<Result<String>>],
    ) {
        // A node Slurm has marked down since is named, not waited on.
        let names: Vec<&str> = idx.iter().map(|&i| hosts[i].0.host.as_str()).collect();
        let bad = self.unusable(&names);
        let idx: Vec<usize> = idx
            .iter()
            .copied()
            .filter(|&i| match bad.get(&hosts[i].0.host) {
                Some(why) => {
                    results[i] = Some(Err(Unreachable::error(
                        Unreached::Slurm,
                        format!("{why}: Slurm runs no step there"),
                    )));
                    false
                }
                None => true,
            })
            .collect();
        let done = super::in_parallel(
            &idx,
            16,
            |&i| {
                let (w, dir) = &hosts[i];
                let script = format!(
                    "cd -P -- {} && cat > {} && {{ {}\n}}",
                    single_quote(dir),
                    single_quote(name),
                    after(dir)
                );
                self.stream_to(&w.host, &script, from, timeout)
                    .map(|()| "a stream through srun".to_string())
            },
            &|_| {},
        );
        for (i, r) in idx.into_iter().zip(done) {
            results[i] = Some(r);
        }
    }
}

impl Transport for Slurm {
    fn via(&self) -> &'static str {
        "through srun"
    }

    fn one_by_one(&self) -> Option<usize> {
        None
    }

    fn run_each(
        &self,
        hosts: &[&Worker],
        script: Script,
        timeout: Duration,
    ) -> Vec<Result<Output>> {
        let names: Vec<&str> = hosts.iter().map(|w| w.host.as_str()).collect();
        let mut results: Vec<Option<Result<Output>>> = hosts.iter().map(|_| None).collect();
        let all: Vec<usize> = (0..hosts.len()).collect();
        let todo = if self.states.ready().is_none() && self.states.first() {
            // The first step runs while the states come: stopped as soon as they name
            // one of its nodes, and a node they name gets no answer but why, as if it
            // had been left out from the start.
            let stop = |nodes: &[&str]| {
                self.states
                    .ready()
                    .and_then(Option::as_ref)
                    .is_some_and(|m| nodes.iter().any(|n| m.contains_key(*n)))
            };
            let outs = self.steps(hosts, &all, script, timeout, &stop);
            let bad = self.states.wait().clone().map(|m| among(m, &names));
            let mut again = Vec::new();
            for (i, out) in outs.into_iter().enumerate() {
                match bad.as_ref().and_then(|b| b.get(names[i])) {
                    Some(why) => results[i] = Some(Err(anyhow!("{why}: Slurm runs no step there"))),
                    None if out.as_ref().is_err_and(|e| e.is::<StepStopped>()) => again.push(i),
                    None => results[i] = Some(out),
                }
            }
            again
        } else {
            let bad = self.unusable(&names);
            all.into_iter()
                .filter(|&i| match bad.get(names[i]) {
                    Some(why) => {
                        results[i] = Some(Err(Unreachable::error(
                            Unreached::Slurm,
                            format!("{why}: Slurm runs no step there"),
                        )));
                        false
                    }
                    None => true,
                })
                .collect()
        };
        if !todo.is_empty() {
            let outs = self.steps(hosts, &todo, script, timeout, &|_| false);
            for (&i, out) in todo.iter().zip(outs) {
                results[i] = Some(out);
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(anyhow!("no answer"))))
            .collect()
    }

    fn send_file(
        &self,
        hosts: &[(&Worker, String)],
        from: &Path,
        _name: &str,
        timeout: Duration,
    ) -> Vec<Result<()>> {
        let name = _name;
        self.send_by_dir(hosts, from, name, timeout, &|_| "true".into())
            .into_iter()
            .map(|r| r.map(|_| ()))
            .collect()
    }

    fn tree_method(&self, _rsync_there: bool) -> String {
        if crate::process::on_path("sbcast").is_some() {
            "sbcast"
        } else {
            "a stream through srun"
        }
        .into()
    }

    fn send_tree(
        &self,
        hosts: &[(&Worker, &Path, bool)],
        from: &Path,
        timeout: Duration,
    ) -> Vec<Result<String>> {
        let tar = match tar_of(from) {
            Ok(t) => t,
            Err(e) => {
                let why = format!("{e:#}");
                return hosts.iter().map(|_| Err(anyhow!("{why}"))).collect();
            }
        };
        let mut dirs: Vec<(&Worker, String)> = Vec::new();
        for (w, to, _) in hosts {
            match to.to_str() {
                Some(d) => dirs.push((*w, d.to_string())),
                None => dirs.push((*w, String::new())),
            }
        }
        // Once the tar is in `.incoming-<name>/`: entered as checked, emptied but for the
        // tar, unpacked, and the tar removed, so only the build is left to verify.
        let after = |dir: &str| {
            let enter = enter_incoming(Path::new(dir)).unwrap_or_else(|_| "exit 1".into());
            format!(
                "{enter}; find . -mindepth 1 ! -name {t} -delete && tar -xf {t} && rm -f {t}",
                t = SHIP_TAR
            )
        };
        self.send_by_dir(&dirs, tar.path(), SHIP_TAR, timeout, &after)
    }
}

/// The build as one tar file (links kept as links), for sbcast or a stream.
fn tar_of(dir: &Path) -> Result<tempfile::NamedTempFile> {
    let file = tempfile::Builder::new()
        .prefix("fdl-ship-")
        .suffix(".tar")
        .tempfile()
        .context("cannot make a temporary file for the build's tar")?;
    let mut cmd = Command::new("tar");
    cmd.arg("-C").arg(dir).arg("-cf").arg(file.path()).arg(".");
    let out = crate::process::output_within(&mut cmd, Duration::from_secs(600))
        .map_err(crate::process::lift)
        .context("cannot run tar")?
        .ok_or_else(|| anyhow!("tar of the build took too long"))?;
    if !out.status.success() {
        bail!(
            "tar of the build failed: {}",
            copy_error(&String::from_utf8_lossy(&out.stderr))
        );
    }
    Ok(file)
}

/// The most one step's output may hold in all (per stream), whatever its node count:
/// each node's share is bounded by [`OUTPUT_CAP`] when it is split ([`demux`]), and the
/// whole by this, so an endless stream from a step of thousands of nodes costs at most
/// this much memory, not a MiB per node.
pub const STEP_CAP: usize = 64 << 20;

/// The bound of a step of `nodes` tasks: a MiB per node (and one for srun's own lines),
/// at most [`STEP_CAP`] in all.
fn step_cap(nodes: usize) -> usize {
    OUTPUT_CAP
        .saturating_mul(nodes.saturating_add(1))
        .min(STEP_CAP)
}

/// Runs one step's `srun` and collects what it printed, bounded by [`step_cap`]: past it,
/// the step is stopped and the error says so.
fn capture_step(
    cmd: &mut Command,
    nodes: usize,
    timeout: Duration,
    stop: &dyn Fn() -> bool,
) -> std::io::Result<Option<Output>> {
    crate::process::output_within_cap_unless(cmd, timeout, step_cap(nodes), stop)
}

/// The entries of `states` for `nodes`.
fn among(states: BTreeMap<String, String>, nodes: &[&str]) -> BTreeMap<String, String> {
    states
        .into_iter()
        .filter(|(n, _)| nodes.contains(&n.as_str()))
        .collect()
}

/// The unusable nodes among `list` (names or a Slurm host list) by `scontrol show node
/// -o`; `None` when scontrol gave no answer (then every node is tried).
fn node_states(list: &str, timeout: Duration) -> Option<BTreeMap<String, String>> {
    let mut cmd = Command::new("scontrol");
    cmd.args(["show", "node", "-o", list]);
    let Ok(Some(out)) = crate::process::query_within(&mut cmd, timeout) else {
        return None;
    };
    Some(parse_node_states(&String::from_utf8_lossy(&out.stdout)))
}

/// A job's state and node list from `squeue --format='%T %N'`: its one line.
fn job_state(text: &str) -> Option<(String, String)> {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let (state, list) = line.split_once(' ')?;
    let list = list.trim();
    (!state.is_empty() && !list.is_empty() && !list.chars().any(char::is_whitespace))
        .then(|| (state.to_string(), list.to_string()))
}

/// The names of a Slurm host list, by `scontrol show hostnames`.
fn scontrol_hostnames(list: &str, timeout: Duration) -> Result<Vec<String>> {
    let mut cmd = Command::new("scontrol");
    cmd.args(["show", "hostnames", list]);
    let out = crate::process::query_within(&mut cmd, timeout)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                anyhow!("scontrol was not found: run fdl where Slurm's client tools are on PATH")
            } else {
                crate::process::lift(e)
            }
        })?
        .ok_or_else(|| {
            anyhow!(
                "`scontrol show hostnames` gave no answer within {} s (--timeout): is slurmctld up? Run `scontrol ping`, or give a longer --timeout",
                timeout.as_secs()
            )
        })?;
    if !out.status.success() {
        bail!(
            "`scontrol show hostnames` failed: {}",
            crate::text::clean(String::from_utf8_lossy(&out.stderr).trim())
        );
    }
    parse_hostnames(&String::from_utf8_lossy(&out.stdout))
}

/// The most names [`expand_hostlist`] makes of one list; a longer one is scontrol's.
const EXPAND_MAX: usize = 1 << 16;

/// A Slurm host list of the common form expanded as `scontrol show hostnames` does:
/// comma-separated terms, each a plain name or `prefix[ranges]suffix` with one bracket
/// group of `a`, `a-b` (`a`'s digits give the width: `01-10`) joined by commas. `None`
/// for anything else (two groups, a step `a-b:2`, a range backwards, a name that is not
/// a plain word, more than [`EXPAND_MAX`] names): then scontrol expands it.
pub fn expand_hostlist(list: &str) -> Option<Vec<String>> {
    let mut names: Vec<String> = Vec::new();
    // Seen names in a set: a list of 65,536 names is not 65,536² comparisons.
    let mut seen = std::collections::HashSet::new();
    let mut push = |name: String, names: &mut Vec<String>| -> Option<()> {
        if !plain(&name) || names.len() >= EXPAND_MAX {
            return None;
        }
        if seen.insert(name.clone()) {
            names.push(name);
        }
        Some(())
    };
    // Terms split at the commas outside brackets.
    let mut terms = Vec::new();
    let (mut depth, mut from) = (0usize, 0usize);
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.checked_sub(1)?,
            ',' if depth == 0 => {
                terms.push(&list[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return None;
    }
    terms.push(&list[from..]);
    for term in terms {
        let Some((prefix, rest)) = term.split_once('[') else {
            push(term.to_string(), &mut names)?;
            continue;
        };
        let (ranges, suffix) = rest.split_once(']')?;
        if suffix.contains(['[', ']']) {
            return None;
        }
        for range in ranges.split(',') {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            if a.is_empty()
                || b.is_empty()
                || !(a.bytes().chain(b.bytes())).all(|c| c.is_ascii_digit())
            {
                return None;
            }
            let (lo, hi): (u64, u64) = (a.parse().ok()?, b.parse().ok()?);
            if lo > hi || hi - lo >= EXPAND_MAX as u64 {
                return None;
            }
            for n in lo..=hi {
                push(
                    format!("{prefix}{n:0width$}{suffix}", width = a.len()),
                    &mut names,
                )?;
            }
        }
    }
    (!names.is_empty()).then_some(names)
}

/// `scontrol show hostnames`' answer: one node name a line, each a plain word.
pub fn parse_hostnames(text: &str) -> Result<Vec<String>> {
    // A list naming a node twice (`node[1,1]`) is that node once: one worker, one task.
    let mut nodes: Vec<String> = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if !nodes.iter().any(|n| n == line) {
            nodes.push(line.to_string());
        }
    }
    if let Some(bad) = nodes.iter().find(|n| !plain(n)) {
        bail!(
            "Slurm names a node '{}': fdl passes node names to srun as plain words (letters, digits, -_.)",
            crate::text::clean(bad)
        );
    }
    if nodes.is_empty() {
        bail!("the allocation has no nodes (scontrol show hostnames answered nothing)");
    }
    Ok(nodes)
}

/// From `scontrol show node -o`: each node Slurm will not start a step on (drained,
/// draining, down, failed, not responding), with a line saying so and why.
pub fn parse_node_states(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let field = |key: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .map(str::to_string)
        };
        let (Some(name), Some(state)) = (field("NodeName="), field("State=")) else {
            continue;
        };
        // A state is a base and flags joined by `+`; a trailing `*` means not responding.
        let mut words: Vec<String> = Vec::new();
        for part in state.split('+') {
            let word = part.trim_end_matches(|c: char| !c.is_ascii_alphanumeric() && c != '_');
            if word.len() != part.len() && part.ends_with('*') {
                words.push("NOT_RESPONDING".into());
            }
            words.push(word.to_ascii_uppercase());
        }
        let bad = words.iter().any(|w| {
            w.starts_with("DRAIN")
                || w.starts_with("DOWN")
                || w.starts_with("FAIL")
                || w == "NOT_RESPONDING"
        });
        if !bad {
            continue;
        }
        let reason = line
            .split_once("Reason=")
            .map(|(_, r)| r.trim().to_string())
            .filter(|r| !r.is_empty() && r != "(null)");
        out.insert(
            name.clone(),
            format!(
                "{} is {}{}",
                crate::text::clean(&name),
                crate::text::clean(&state.to_ascii_lowercase()),
                reason
                    .map(|r| format!(" (reason: {})", crate::text::clean(&r)))
                    .unwrap_or_default()
            ),
        );
    }
    out
}

/// Splits a labelled step's output per node: task `N`'s lines are its own; the node
/// name and exit are the lines the wrapper printed. A node with no exit line did not
/// finish: what srun said of it is its error.
fn demux(nodes: &[&str], out: &Output) -> Vec<Result<Output>> {
    #[derive(Default)]
    struct Task {
        node: Option<String>,
        exit: Option<i32>,
        stdout: Vec<u8>,
        stderr: Vec<u8>,
    }
    let mut tasks: BTreeMap<usize, Task> = BTreeMap::new();
    let mut srun_said: Vec<String> = Vec::new();
    let split = |line: &str| -> Option<(usize, String)> {
        let (label, rest) = line.split_once(": ")?;
        let id = label.trim().parse().ok()?;
        Some((id, rest.to_string()))
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        match split(line) {
            Some((id, rest)) => {
                let t = tasks.entry(id).or_default();
                if let Some(n) = rest.strip_prefix(NODE_MARK).filter(|_| t.node.is_none()) {
                    t.node = Some(n.trim().to_string());
                } else if let Some(code) = rest.strip_prefix(EXIT_MARK) {
                    t.exit = code.trim().parse().ok();
                    // The wrapper's newline before the exit line: not the script's.
                    if t.stdout.ends_with(b"\n\n") || t.stdout == b"\n" {
                        t.stdout.pop();
                    }
                } else if t.stdout.len() <= OUTPUT_CAP {
                    t.stdout.extend_from_slice(rest.as_bytes());
                    t.stdout.push(b'\n');
                }
            }
            None => srun_said.push(line.to_string()),
        }
    }
    for line in String::from_utf8_lossy(&out.stderr).lines() {
        match split(line) {
            Some((id, rest)) if !line.starts_with("srun:") => {
                let t = tasks.entry(id).or_default();
                if t.stderr.len() <= OUTPUT_CAP {
                    t.stderr.extend_from_slice(rest.as_bytes());
                    t.stderr.push(b'\n');
                }
            }
            _ => srun_said.push(line.to_string()),
        }
    }
    let mut by_node: BTreeMap<String, Task> = BTreeMap::new();
    for (_, t) in tasks {
        if let Some(n) = t.node.clone() {
            by_node.insert(n, t);
        }
    }
    nodes
        .iter()
        .map(|node| {
            let said = || {
                srun_said
                    .iter()
                    .map(|l| l.trim())
                    .filter(|l| !l.is_empty())
                    .find(|l| {
                        l.split(|c: char| !plain(&c.to_string()))
                            .any(|w| w == *node)
                    })
                    .or_else(|| srun_said.iter().map(|l| l.trim()).rfind(|l| !l.is_empty()))
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("srun exited with {}", out.status))
            };
            match by_node.remove(*node) {
                Some(t) if t.stdout.len() > OUTPUT_CAP || t.stderr.len() > OUTPUT_CAP => {
                    Err(anyhow!(
                        "answer too large: more than {} KiB from {node}, so it was not read",
                        OUTPUT_CAP / 1024
                    ))
                }
                Some(Task {
                    exit: Some(code),
                    stdout,
                    stderr,
                    ..
                }) => Ok(Output {
                    status: exit_status(code),
                    stdout,
                    stderr,
                }),
                Some(_) => Err(anyhow!(
                    "{node} did not finish its step through srun: {}",
                    crate::text::clean(&said())
                )),
                None => Err(anyhow!(
                    "{node} gave no answer through srun: {}",
                    crate::text::clean(&said())
                )),
            }
        })
        .collect()
}

fn exit_status(code: i32) -> std::process::ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    std::process::ExitStatus::from_raw((code & 0xff) << 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jobs_state_and_nodes_are_read_from_squeue() {
        assert_eq!(
            job_state("RUNNING node[1-3]\n"),
            Some(("RUNNING".into(), "node[1-3]".into()))
        );
        assert_eq!(job_state(""), None);
        assert_eq!(job_state("PENDING"), None);
        assert_eq!(job_state("RUNNING a b"), None);
    }

    #[test]
    fn a_jobid_that_is_no_plain_word_is_refused_before_anything_runs() {
        for bad in ["", "-1", "1 2", "1;rm", "$(x)"] {
            let e = Slurm::for_job(bad, Duration::from_secs(1)).unwrap_err();
            assert!(format!("{e}").contains("is not a job id"), "{bad}: {e}");
        }
    }

    #[test]
    fn hostnames_are_read_as_given_and_must_be_plain_words() {
        assert_eq!(
            parse_hostnames("gpu-a100-01\nnode7.cluster\n\n").unwrap(),
            ["gpu-a100-01", "node7.cluster"]
        );
        assert_eq!(
            parse_hostnames("node1\nnode2\nnode1\n").unwrap(),
            ["node1", "node2"],
            "a node named twice is one worker"
        );
        assert!(parse_hostnames("node1\n$(rm -rf)\n").is_err());
        assert!(parse_hostnames("-oProxy\n").is_err());
        assert!(parse_hostnames("").is_err());
    }

    /// The forms `scontrol show hostnames` (22.05) expands, and its answers; the rest
    /// are left to it.
    #[test]
    fn common_host_lists_are_expanded_as_scontrol_does_and_the_rest_left_to_it() {
        let x = |l: &str| expand_hostlist(l);
        assert_eq!(x("node[1-3]").unwrap(), ["node1", "node2", "node3"]);
        assert_eq!(x("node1").unwrap(), ["node1"]);
        assert_eq!(
            x("gpu[08-11,20],login-1,n[7]-ib").unwrap(),
            ["gpu08", "gpu09", "gpu10", "gpu11", "gpu20", "login-1", "n7-ib"]
        );
        assert_eq!(x("node[9-10]").unwrap(), ["node9", "node10"]);
        assert_eq!(x("node[1,1-2]").unwrap(), ["node1", "node2"]);
        for other in [
            "",
            "rack[1-2]-node[1-4]",
            "node[1-4:2]",
            "node[3-1]",
            "node[1-3",
            "node1-3]",
            "node[]",
            "node[a-b]",
            "$(reboot)[1-2]",
            "-o[1-2]",
            "n[0-99999999]",
            "a,,b",
        ] {
            assert_eq!(x(other), None, "{other}");
        }
    }

    /// A step of 3,000 nodes whose output never ends: stopped at the total bound (not at
    /// a MiB per node, 3 GB), and said to be too large.
    #[test]
    fn an_endless_step_is_stopped_at_a_total_bound_whatever_its_node_count() {
        let mut cmd = Command::new("yes");
        cmd.arg("0: fdl-node:node1");
        let e = capture_step(&mut cmd, 3000, Duration::from_secs(300), &|| false).unwrap_err();
        let t = crate::process::too_large(&e).expect("stopped for its size");
        assert!(t.limit <= STEP_CAP, "stopped only at {} MiB", t.limit >> 20);
        assert_eq!(
            step_cap(2),
            3 * OUTPUT_CAP,
            "a small step keeps a MiB per node"
        );
    }

    #[test]
    fn drained_down_and_silent_nodes_are_named_with_their_reason() {
        let text = "NodeName=node1 Arch=x86_64 State=ALLOCATED ThreadsPerCore=1\n\
                    NodeName=node2 Arch=x86_64 State=ALLOCATED+DRAIN ThreadsPerCore=1 Reason=test [root@2026-12-01T15:46:43]\n\
                    NodeName=node3 State=DOWN+NOT_RESPONDING Reason=Not responding\n\
                    NodeName=node4 State=IDLE* Weight=1\n\
                    NodeName=node5 State=MIXED+PLANNED_NEWSTATE Weight=1\n";
        let bad = parse_node_states(text);
        assert_eq!(bad.len(), 3, "{bad:?}");
        assert_eq!(
            bad["node2"],
            "node2 is allocated+drain (reason: test [root@2026-12-01T15:46:43])"
        );
        assert!(bad["node3"].starts_with("node3 is down+not_responding"));
        assert!(bad["node4"].starts_with("node4 is idle*"));
    }

    #[test]
    fn a_labelled_step_is_split_per_node_and_a_silent_node_is_named() {
        let out = Output {
            status: exit_status(0),
            stdout: b" 0: fdl-node:node1\n 1: fdl-node:node2\n 0: {\"a\":\n 0: 1}\n 0: \n 0: fdl-exit:0\n 1: partial\n 1: fdl-exit:97\n 2: fdl-node:node3\n 2: started\n".to_vec(),
            stderr: b" 1: oops\x1b[2J\nsrun: error: Node failure on node3\n".to_vec(),
        };
        let r = demux(&["node1", "node2", "node3", "node4"], &out);
        let a = r[0].as_ref().unwrap();
        assert_eq!(a.status.code(), Some(0));
        assert_eq!(String::from_utf8_lossy(&a.stdout), "{\"a\":\n1}\n");
        let b = r[1].as_ref().unwrap();
        assert_eq!(b.status.code(), Some(97));
        assert_eq!(String::from_utf8_lossy(&b.stdout), "partial\n");
        assert_eq!(String::from_utf8_lossy(&b.stderr), "oops\x1b[2J\n");
        let c = r[2].as_ref().unwrap_err().to_string();
        assert_eq!(
            c,
            "node3 did not finish its step through srun: srun: error: Node failure on node3"
        );
        let d = r[3].as_ref().unwrap_err().to_string();
        assert!(d.starts_with("node4 gave no answer through srun"), "{d}");
    }
}
