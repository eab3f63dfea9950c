//! `fdl launch -- COMMAND…` with real processes: a job run with a build preloaded, its
//! signals, its exit status, and what fdl says of the processes that map an NCCL.
//!
//! The torchrun cases run `python -m torch.distributed.run` of the torch 2.15.0 venv of
//! `.ci/fetch-oracles` (FDL_TEST_TORCH_VENV; its NCCL 2.30.7 comes from the
//! nvidia-nccl wheel on sys.path), two workers joining a gloo group on this host (no
//! GPU), with a build made of that same libnccl.so.2. They are `#[ignore]`d; with
//! `--include-ignored` a missing venv fails them. The others need only a C compiler.

use crate::common;
use common::torch_process::site_packages;
use common::{fake_nvidia_smi, oracle_input, path_with, BuildsFixture, ProjectFixture};
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long any one `fdl launch` may run before the test kills it and fails.
const LIMIT: Duration = Duration::from_secs(240);

/// A project with one build, and a scratch directory for the job's files.
struct Setup {
    fx: BuildsFixture,
    build: String,
    work: tempfile::TempDir,
    /// A stand-in nvidia-smi: one GPU the build has code for.
    smi: tempfile::TempDir,
    venv: Option<PathBuf>,
}

/// A build of a stand-in NCCL (compiled here): enough for jobs that run no torch.
fn standin() -> Setup {
    let fx = BuildsFixture::new(ProjectFixture::empty());
    let tree = fx.tree("nccl-2.27.5", (2, 27, 5), &[80]);
    let build = fx.install(&tree, "v2.27.5-1", "8.0").unwrap();
    Setup {
        fx,
        build,
        work: tempfile::tempdir().unwrap(),
        smi: fake_nvidia_smi("0, NVIDIA A100-SXM4-40GB, 8.0, 40960\n", 0),
        venv: None,
    }
}

/// The torch 2.15.0 venv as the active libtorch, and a build of its own NCCL 2.30.7
/// (the wheel's libnccl.so.2): the build `fdl nccl env` chooses.
fn torch() -> Setup {
    let venv = oracle_input("FDL_TEST_TORCH_VENV");
    let fx = BuildsFixture::new(ProjectFixture::empty());
    let sp = site_packages(&venv);
    let out = fx
        .fdl()
        .args(["libtorch", "add", "torch215"])
        .arg(sp.join("torch"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = fx.tree("nccl-2.30.7", (2, 30, 7), &[80]);
    let real = tree.join("lib/libnccl.so.2.30.7");
    std::fs::remove_file(&real).unwrap();
    std::fs::copy(sp.join("nvidia/nccl/lib/libnccl.so.2"), &real).unwrap();
    let build = fx.install(&tree, "v2.30.7-1", "8.0").unwrap();
    let s = Setup {
        fx,
        build,
        work: tempfile::tempdir().unwrap(),
        smi: fake_nvidia_smi("0, NVIDIA A100-SXM4-40GB, 8.0, 40960\n", 0),
        venv: Some(venv),
    };
    std::fs::write(s.work.path().join("job.py"), JOB).unwrap();
    s
}

/// Each worker joins a gloo group by env://, records its pid, holds for $HOLD seconds
/// and leaves.
const JOB: &str = r#"
import os, sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
with open(os.path.join(os.environ["PIDS"], "rank%s" % os.environ["RANK"]), "w") as f:
    f.write(str(os.getpid()))
time.sleep(float(os.environ.get("HOLD", "3")))
dist.destroy_process_group()
"#;

/// A TCP port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Setup {
    /// `fdl --root … launch ARGS`, in the test's environment without its LD_*, PYTHON*
    /// and NCCL_* variables.
    fn launch(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fdl"));
        for (k, _) in std::env::vars() {
            if ["LD_", "PYTHON", "NCCL_", "FDL_ROOT"]
                .iter()
                .any(|p| k.starts_with(p))
            {
                cmd.env_remove(k);
            }
        }
        cmd.arg("--root")
            .arg(self.fx.project.root())
            .arg("launch")
            .args(args)
            .env("XDG_CACHE_HOME", self.fx.cache.path())
            .env("PATH", path_with(self.smi.path()))
            .env("CUDA_VISIBLE_DEVICES", "")
            .env("PIDS", self.work.path())
            .current_dir(self.work.path());
        cmd
    }

    fn python(&self) -> String {
        self.venv
            .as_ref()
            .unwrap()
            .join("bin/python")
            .to_str()
            .unwrap()
            .to_string()
    }

    /// `python -m torch.distributed.run --nproc-per-node 2 --master-port P job.py`.
    fn torchrun(&self) -> Vec<String> {
        vec![
            self.python(),
            "-m".into(),
            "torch.distributed.run".into(),
            "--nproc-per-node".into(),
            "2".into(),
            "--master-port".into(),
            free_port().to_string(),
            "job.py".into(),
        ]
    }

    /// The pids the workers recorded.
    fn worker_pids(&self) -> Vec<i32> {
        (0..2)
            .filter_map(|r| std::fs::read_to_string(self.work.path().join(format!("rank{r}"))).ok())
            .map(|s| s.trim().parse().unwrap())
            .collect()
    }
}

/// What an `fdl launch` run did.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl std::fmt::Display for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs `cmd` to its end (killed past [`LIMIT`]); `during` is called with its pid once
/// it runs and may signal it.
fn run(cmd: &mut Command, during: &mut dyn FnMut(u32)) -> Ran {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let reader = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = reader(Box::new(child.stdout.take().unwrap()));
    let err = reader(Box::new(child.stderr.take().unwrap()));
    during(child.id());
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "fdl launch ran past {LIMIT:?}; stderr so far:\n{}",
                err.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Ran {
        code: status.code(),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

fn summary(ran: &Ran) -> &str {
    ran.stderr
        .lines()
        .rev()
        .find(|l| {
            l.starts_with("fdl launch: ") && (l.contains(" checked") || l.contains("no worker"))
        })
        .unwrap_or_else(|| panic!("no summary line:\n{ran}"))
}

/// Whether `pid` still runs (a zombie counts as ended).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// The pids whose process group is `pgid`, zombies left out.
fn in_group(pgid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                let rest: Vec<&str> = s
                    .rsplit_once(')')
                    .map(|(_, r)| r.split_whitespace().collect())
                    .unwrap_or_default();
                rest.first() != Some(&"Z") && rest.get(2) == Some(&pgid.to_string().as_str())
            })
        })
        .collect()
}

/// The job's pid, from fdl's first line.
fn job_pid(stderr: &str) -> u32 {
    let line = stderr
        .lines()
        .find(|l| l.contains("the job is pid "))
        .unwrap_or_else(|| panic!("no start line:\n{stderr}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Waits up to `limit` for `f`.
fn wait_for(limit: Duration, f: &mut dyn FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    f()
}

/// torchrun with the build `fdl nccl env` chooses: both workers are read, both reach the
/// build, and the job's status (0) is fdl's.
#[test]
#[ignore = "needs the torch 2.15.0 venv of `.ci/fetch-oracles` (FDL_TEST_TORCH_VENV): `cargo test -- --include-ignored`"]
fn torchrun_workers_are_checked_and_on_the_build() {
    let s = torch();
    let job = s.torchrun();
    let mut args = vec!["-v", "--"];
    args.extend(job.iter().map(String::as_str));
    let ran = run(&mut s.launch(&args), &mut |_| {});
    eprintln!("{ran}");
    assert_eq!(ran.code, Some(0), "{ran}");
    // Each worker's answer rests on its GOT, read from memory.
    for rank in 0..2 {
        assert!(
            ran.stderr.lines().any(|l| l.contains(&format!(
                " rank {rank} (python -u job.py) runs build {}",
                s.build
            )) && l.contains("read from memory")),
            "{ran}"
        );
    }
    assert!(
        ran.stderr
            .contains(&format!("fdl: chose build {}", s.build)),
        "the choice of `fdl nccl env`:\n{ran}"
    );
    assert_eq!(
        summary(&ran),
        format!(
            "fdl launch: 2 workers checked (ranks 0, 1): all on build {}",
            s.build
        ),
        "{ran}"
    );
    assert!(!ran.stderr.contains("does not run build"), "{ran}");
    assert_eq!(s.worker_pids().len(), 2, "{ran}");
}

/// `--no-memory`: the loader's rules answer, and the build's `lib/libnccl.so.2` (a link)
/// in LD_PRELOAD is the preload that comes first.
#[test]
#[ignore = "needs the torch 2.15.0 venv of `.ci/fetch-oracles` (FDL_TEST_TORCH_VENV): `cargo test -- --include-ignored`"]
fn without_memory_the_loaders_rules_answer() {
    let s = torch();
    let job = s.torchrun();
    let mut args = vec!["-v", "--no-memory", "--"];
    args.extend(job.iter().map(String::as_str));
    let ran = run(&mut s.launch(&args), &mut |_| {});
    eprintln!("{ran}");
    assert_eq!(ran.code, Some(0), "{ran}");
    for rank in 0..2 {
        assert!(
            ran.stderr.lines().any(|l| l.contains(&format!(
                " rank {rank} (python -u job.py) runs build {} (the loader's rules: LD_PRELOAD names it (",
                s.build
            ))),
            "{ran}"
        );
    }
    assert_eq!(
        summary(&ran),
        format!(
            "fdl launch: 2 workers checked (ranks 0, 1): all on build {}",
            s.build
        ),
        "{ran}"
    );
}

/// A launcher that drops LD_PRELOAD (`env -u LD_PRELOAD` in a wrapper script): each
/// worker is named, with its pid, and the cause; `--strict` stops the job and fails.
#[test]
#[ignore = "needs the torch 2.15.0 venv of `.ci/fetch-oracles` (FDL_TEST_TORCH_VENV): `cargo test -- --include-ignored`"]
fn a_launcher_that_drops_ld_preload_is_caught_and_strict_stops_the_job() {
    let s = torch();
    let wrapper = s.work.path().join("wrapper.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec env -u LD_PRELOAD {} \"$@\"\n",
            s.torchrun()[..7].join(" ")
        ),
    )
    .unwrap();
    let job = [wrapper.to_str().unwrap(), "job.py"];
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();

    let mut args = vec!["--"];
    args.extend(job);
    let ran = run(s.launch(&args).env("HOLD", "4"), &mut |_| {});
    eprintln!("{ran}");
    assert_eq!(
        ran.code,
        Some(0),
        "without --strict the job runs on:\n{ran}"
    );
    let pids = s.worker_pids();
    assert_eq!(pids.len(), 2, "{ran}");
    for pid in &pids {
        let line = ran
            .stderr
            .lines()
            .find(|l| l.contains(&format!("pid {pid} rank ")) && l.contains("does not run build"))
            .unwrap_or_else(|| panic!("worker {pid} is not named:\n{ran}"));
        assert!(
            line.contains("it lost LD_PRELOAD")
                && line
                    .contains("Likely cause: something between fdl and it cleaned the environment")
                && line.contains("sys.path"),
            "{line}"
        );
    }
    let sum = summary(&ran);
    assert!(
        sum.starts_with("fdl launch: 2 workers checked (ranks 0, 1): 0 on build")
            && sum.contains("2 NOT on it")
            && sum.contains("LD_PRELOAD lost"),
        "{sum}"
    );

    // --strict: the first finding stops the job, which would otherwise hold a minute.
    for f in ["rank0", "rank1"] {
        let _ = std::fs::remove_file(s.work.path().join(f));
    }
    // The launcher is the command itself here: the cause names it.
    let direct: Vec<String> = ["env", "-u", "LD_PRELOAD"]
        .into_iter()
        .map(String::from)
        .chain(s.torchrun())
        .collect();
    let mut args = vec!["--strict", "--grace", "3", "--"];
    args.extend(direct.iter().map(String::as_str));
    let start = Instant::now();
    let ran = run(s.launch(&args).env("HOLD", "60"), &mut |_| {});
    eprintln!("{ran}");
    assert_eq!(ran.code, Some(1), "{ran}");
    assert!(start.elapsed() < Duration::from_secs(55), "{ran}");
    assert!(
        ran.stderr.contains("Likely cause: `env -u LD_PRELOAD ")
            && ran
                .stderr
                .contains("` cleans the environment of what it starts"),
        "{ran}"
    );
    assert!(
        ran.stderr.contains("--strict: stopping the job for pid ")
            && ran
                .stderr
                .contains("error: stopped the job (--strict): pid "),
        "{ran}"
    );
    let pgid = job_pid(&ran.stderr);
    assert!(!ran.stderr.contains("project root"), "{ran}");
    assert_eq!(in_group(pgid), Vec::<u32>::new(), "{ran}");
    for pid in s.worker_pids() {
        assert!(!alive(pid), "worker {pid} outlived the strict stop");
    }
}

/// Ctrl-C (SIGINT to fdl) reaches torchrun, which ends its workers; nothing of the job
/// is left running, and fdl exits with the job's status.
#[test]
#[ignore = "needs the torch 2.15.0 venv of `.ci/fetch-oracles` (FDL_TEST_TORCH_VENV): `cargo test -- --include-ignored`"]
fn sigint_reaches_the_workers_and_nothing_is_left_running() {
    let s = torch();
    let job = s.torchrun();
    let mut args = vec!["--"];
    args.extend(job.iter().map(String::as_str));
    let mut seen = Vec::new();
    let ran = run(s.launch(&args).env("HOLD", "120"), &mut |fdl| {
        assert!(
            wait_for(Duration::from_secs(120), &mut || s.worker_pids().len() == 2),
            "the workers did not start"
        );
        seen = s.worker_pids();
        // SAFETY: signalling the fdl this test started.
        unsafe { libc::kill(fdl as i32, libc::SIGINT) };
    });
    eprintln!("{ran}");
    assert!(ran.stderr.contains("passed SIGINT on to the job"), "{ran}");
    // torchrun passed it on in turn: each worker was interrupted, not killed by fdl.
    for rank in 0..2 {
        assert!(
            ran.stderr
                .contains(&format!("[rank{rank}]: KeyboardInterrupt")),
            "{ran}"
        );
    }
    assert_ne!(ran.code, Some(0), "{ran}");
    let pgid = job_pid(&ran.stderr);
    assert_eq!(in_group(pgid), Vec::<u32>::new(), "{ran}");
    for pid in seen {
        assert!(!alive(pid), "worker {pid} outlived fdl:\n{ran}");
    }
}

/// The job's exit status is fdl's; a death by signal N is 128+N.
#[test]
fn the_jobs_exit_status_is_kept() {
    let s = standin();
    let ran = run(
        &mut s.launch(&["--build", &s.build, "--", "sh", "-c", "exit 7"]),
        &mut |_| {},
    );
    assert_eq!(ran.code, Some(7), "{ran}");
    assert!(!ran.stderr.contains("error:"), "{ran}");
    let ran = run(
        &mut s.launch(&["--build", &s.build, "--", "sh", "-c", "kill -TERM $$"]),
        &mut |_| {},
    );
    assert_eq!(ran.code, Some(128 + libc::SIGTERM), "{ran}");
    // The job sees the build first in its LD_PRELOAD, and its stdout is its own.
    let ran = run(
        s.launch(&[
            "--build",
            &s.build,
            "--",
            "sh",
            "-c",
            "echo \"$LD_PRELOAD\"",
        ])
        .env("LD_PRELOAD", "/nonexistent/libother.so"),
        &mut |_| {},
    );
    assert_eq!(ran.code, Some(0), "{ran}");
    let want =
        s.fx.builds()
            .join(&s.build)
            .join("lib/libnccl.so.2")
            .display()
            .to_string();
    assert_eq!(
        ran.stdout.trim(),
        format!("{want}:/nonexistent/libother.so"),
        "{ran}"
    );
}

/// SIGINT and SIGTERM to fdl go on to the job's process group; what the job started in
/// a session of its own (as torchrun starts its workers) is ended too, and fdl exits with
/// the job's status.
#[test]
fn signals_go_to_the_job_and_nothing_is_left_running() {
    let s = standin();
    for (sig, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM")] {
        let pids = s.work.path().join(format!("pids-{name}"));
        let script = format!(
            "setsid sleep 300 & echo $! > {p}.detached; sleep 300 & echo $! > {p}.child; trap 'echo got {name}; exit 5' {trap}; echo ready > {p}; wait",
            p = pids.display(),
            trap = &name[3..]
        );
        let mut recorded = Vec::new();
        let ran = run(
            &mut s.launch(&[
                "--build", &s.build, "--grace", "2", "--", "sh", "-c", &script,
            ]),
            &mut |fdl| {
                assert!(wait_for(Duration::from_secs(30), &mut || pids.exists()));
                for ext in ["detached", "child"] {
                    let p = std::fs::read_to_string(pids.with_extension(ext)).unwrap();
                    recorded.push(p.trim().parse::<i32>().unwrap());
                }
                // SAFETY: signalling the fdl this test started.
                unsafe { libc::kill(fdl as i32, sig) };
            },
        );
        assert_eq!(ran.code, Some(5), "{name}: {ran}");
        assert!(ran.stdout.contains(&format!("got {name}")), "{ran}");
        assert!(
            ran.stderr.contains(&format!("passed {name} on to the job")),
            "{ran}"
        );
        assert_eq!(in_group(job_pid(&ran.stderr)), Vec::<u32>::new(), "{ran}");
        for pid in recorded {
            assert!(!alive(pid), "{name}: {pid} outlived fdl:\n{ran}");
        }
    }
}

/// No command, an unknown build, a command that cannot start: a clear message and a
/// non-zero exit, and nothing run.
#[test]
fn bad_input_is_refused_clearly() {
    let s = standin();
    let ran = run(&mut s.launch(&["--build", &s.build]), &mut |_| {});
    assert_eq!(ran.code, Some(2), "{ran}");
    assert!(
        ran.stderr.contains("required arguments were not provided")
            && ran.stderr.contains("<COMMAND>"),
        "{ran}"
    );
    let ran = run(
        &mut s.launch(&["--build", "v9.9.9-sm80", "--", "sh", "-c", "echo ran"]),
        &mut |_| {},
    );
    assert_eq!(ran.code, Some(1), "{ran}");
    assert!(
        ran.stderr.contains("no build named 'v9.9.9-sm80'")
            && ran.stderr.contains(&s.build)
            && !ran.stdout.contains("ran"),
        "{ran}"
    );
    let ran = run(
        &mut s.launch(&["--build", &s.build, "--", "/nonexistent/torchrun"]),
        &mut |_| {},
    );
    assert_eq!(ran.code, Some(1), "{ran}");
    assert!(
        ran.stderr.contains("cannot start /nonexistent/torchrun"),
        "{ran}"
    );
}

/// A launcher's fork is seen before it execs into a worker (same pid, its rank set only
/// at the exec): the answer given to the fork does not stand for the worker. `--no-memory`
/// settles a preloaded process at first sight, so the fork is answered before the exec.
#[test]
fn a_fork_that_execs_into_a_worker_is_read_again() {
    let s = standin();
    let job = ["sh", "-c", "(sleep 1; exec env RANK=0 sleep 2); echo done"];
    let mut args = vec!["--build", &s.build, "--no-memory", "-v", "--"];
    args.extend(job);
    let ran = run(&mut s.launch(&args), &mut |_| {});
    assert_eq!(ran.code, Some(0), "{ran}");
    assert!(
        ran.stderr
            .lines()
            .any(|l| l.contains(&format!(" rank 0 (sleep 2) runs build {}", s.build))),
        "the worker after its exec:\n{ran}"
    );
    assert_eq!(
        summary(&ran),
        format!(
            "fdl launch: 1 worker checked (rank 0): all on build {}",
            s.build
        ),
        "{ran}"
    );
}

/// A job whose process runs another NCCL without the build's preload, started by a
/// program named mpirun: named with its pid and the `-x LD_PRELOAD` cause, and with
/// `--strict` stopped at once (no venv needed: stand-in NCCLs).
#[test]
fn another_nccl_under_mpirun_is_named_and_strict_stops_it() {
    let s = standin();
    let other = s.fx.tree("other-2.28.3", (2, 28, 3), &[80]);
    let other_lib = other.join("lib/libnccl.so.2");
    let bin = s.work.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let mpirun = bin.join("mpirun");
    // An mpirun that, as Open MPI does without -x, starts its rank without our variable.
    std::fs::write(
        &mpirun,
        format!(
            "#!/bin/sh\nLD_PRELOAD={} exec \"$@\"\n",
            other_lib.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&mpirun, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let job = [mpirun.to_str().unwrap(), "sleep", "3"];
    let mut args = vec!["--build", &s.build, "--"];
    args.extend(job);
    let ran = run(&mut s.launch(&args), &mut |_| {});
    assert_eq!(ran.code, Some(0), "{ran}");
    let line = ran
        .stderr
        .lines()
        .find(|l| l.contains("(sleep 3) does not run build"))
        .unwrap_or_else(|| panic!("not named:\n{ran}"));
    assert!(
        line.contains("it lost LD_PRELOAD")
            && line.contains(&format!(
                "NCCL 2.28.3 at {}",
                other.join("lib/libnccl.so.2.28.3").display()
            ))
            && line.contains(
                "mpirun passes a variable to its ranks only when told: add `-x LD_PRELOAD`"
            ),
        "{line}"
    );

    let mut args = vec!["--build", &s.build, "--strict", "--grace", "1", "--"];
    args.extend(job);
    let ran = run(&mut s.launch(&args), &mut |_| {});
    assert_eq!(ran.code, Some(1), "{ran}");
    assert!(
        ran.stderr
            .contains("error: stopped the job (--strict): pid ")
            && ran.stderr.contains("it was killed by signal 15 (SIGTERM)"),
        "{ran}"
    );
}

/// fdl killed outright (SIGKILL, no chance to clean up): the job's process group goes
/// with it, by the watchdog in the group.
#[test]
fn a_killed_fdl_takes_the_jobs_process_group_with_it() {
    let s = standin();
    let pidfile = s.work.path().join("sleeper");
    let script = format!("sleep 300 & echo $! > {}; wait", pidfile.display());
    let mut sleeper = 0;
    let ran = run(
        &mut s.launch(&["--build", &s.build, "--", "sh", "-c", &script]),
        &mut |fdl| {
            assert!(wait_for(Duration::from_secs(30), &mut || pidfile.exists()
                && !std::fs::read_to_string(&pidfile)
                    .unwrap()
                    .trim()
                    .is_empty()));
            sleeper = std::fs::read_to_string(&pidfile)
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            // SAFETY: killing the fdl this test started.
            unsafe { libc::kill(fdl as i32, libc::SIGKILL) };
        },
    );
    assert_eq!(ran.code, None, "{ran}");
    assert!(
        wait_for(Duration::from_secs(10), &mut || !alive(sleeper)),
        "the job's sleep outlived a killed fdl"
    );
}

/// What a process says of itself is hostile: a command line carrying terminal escapes
/// reaches fdl's lines escaped, never raw.
#[test]
fn a_hostile_command_line_is_shown_escaped() {
    let s = standin();
    let other = s.fx.tree("other-2.28.3", (2, 28, 3), &[80]);
    let script = format!(
        "LD_PRELOAD={} exec -a \"$(printf 'evil\\033[2J\\033]0;pwned\\007')\" sleep 2",
        other.join("lib/libnccl.so.2").display()
    );
    let ran = run(
        &mut s.launch(&["--build", &s.build, "--", "bash", "-c", &script]),
        &mut |_| {},
    );
    assert_eq!(ran.code, Some(0), "{ran}");
    assert!(
        !ran.stderr.contains('\u{1b}') && !ran.stderr.contains('\u{7}'),
        "{ran}"
    );
    assert!(
        ran.stderr
            .lines()
            .any(|l| l.contains("(evil\\u{1b}[2J\\u{1b}]0;pwned\\u{7}")
                && l.contains("does not run build")),
        "{ran}"
    );
}
