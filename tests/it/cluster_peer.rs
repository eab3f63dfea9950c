//! `fdl cluster` against a hostile or broken peer, without containers: a stand-in `ssh`
//! first on PATH runs the remote command here, in a second project that plays the
//! worker, and a stand-in `fdl` (first on PATH, or at the worker's cached-binary path)
//! answers as a hostile worker would: endlessly, with escape sequences, after a banner.
//! The stand-in ssh logs the host argument it was given, so the tests also see what
//! rsync and ssh were asked to reach.

use crate::common;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A stand-in `ssh`: skips the options fdl passes, logs the host, and runs the remote
/// command with `sh -c` here (as sshd runs it in the login shell). `FAKE_SSH_BANNER`,
/// when set, is printed first, as a chatty `.bashrc` would.
const FAKE_SSH: &str = r#"#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-l|-i|-F|-J|-E) shift 2 ;;
    --) shift; break ;;
    -*) shift ;;
    *) break ;;
  esac
done
printf '%s\n' "$1" >> "$FAKE_SSH_LOG"
shift
[ -n "$FAKE_SSH_PATH" ] && export PATH="$FAKE_SSH_PATH"
[ -n "$FAKE_SSH_BANNER" ] && printf '%s\n' "$FAKE_SSH_BANNER"
exec sh -c "$*"
"#;

struct Peer {
    /// The controller's project and cache.
    f: BuildsFixture,
    /// The worker's checkout.
    worker: ProjectFixture,
    /// Stand-ins first on PATH: ssh, and whatever a test adds.
    bin: tempfile::TempDir,
    log: PathBuf,
    /// The controller's working directory (where rsync would write a "local" path).
    cwd: tempfile::TempDir,
    /// The worker's PATH, when it differs from the controller's.
    worker_path: Option<tempfile::TempDir>,
}

/// How a ship copies: rsync, or the tar stream fdl falls back to where the worker has
/// no rsync.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Copy {
    Rsync,
    Tar,
}

impl Copy {
    fn words(self) -> &'static str {
        match self {
            Copy::Rsync => "copied with rsync",
            Copy::Tar => "copied with tar over ssh",
        }
    }
}

impl Peer {
    fn new(target: &str) -> Peer {
        let f = BuildsFixture::new(ProjectFixture::empty());
        let worker = ProjectFixture::empty();
        let bin = tempfile::tempdir().unwrap();
        let log = bin.path().join("ssh.log");
        script(&bin.path().join("ssh"), FAKE_SSH);
        let cwd = tempfile::tempdir().unwrap();
        let p = Peer {
            f,
            worker,
            bin,
            log,
            cwd,
            worker_path: None,
        };
        p.write_cluster(target);
        p
    }

    fn write_cluster(&self, target: &str) {
        std::fs::write(
            self.f.project.root().join("fdl.cluster.yml"),
            format!(
                "cluster:\n  controller:\n    host: c\n    path: {}\n  workers:\n    - host: w1\n      path: {}\n      ssh:\n        target: \"{target}\"\n",
                self.f.project.root().display(),
                self.worker.root().display()
            ),
        )
        .unwrap();
    }

    /// The worker's tools without rsync (the system's, linked one by one), so ship
    /// falls back to tar; with `Copy::Rsync`, nothing changes.
    fn copy_with(mut self, copy: Copy) -> Peer {
        if copy == Copy::Tar {
            let dir = tempfile::tempdir().unwrap();
            for sys in ["/usr/local/bin", "/usr/bin", "/bin"] {
                for e in std::fs::read_dir(sys).into_iter().flatten().flatten() {
                    let name = e.file_name();
                    if name != "rsync" && !dir.path().join(&name).exists() {
                        let _ = std::os::unix::fs::symlink(e.path(), dir.path().join(&name));
                    }
                }
            }
            self.worker_path = Some(dir);
        }
        self
    }

    /// A stand-in for a tool on the "worker" (and controller: they share PATH here).
    fn tool(&self, name: &str, body: &str) {
        script(&self.bin.path().join(name), body);
    }

    fn fdl(&self) -> std::process::Command {
        self.fdl_in(self.f.project.root())
    }

    /// fdl in `root` (the worker's checkout, for its half of a command).
    fn fdl_in(&self, root: &Path) -> std::process::Command {
        let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("fdl"));
        cmd.arg("--root")
            .arg(root)
            .current_dir(self.cwd.path())
            .env_remove("FDL_ROOT")
            .env("XDG_CACHE_HOME", self.f.cache.path())
            .env("PATH", path_with(self.bin.path()))
            .env("FAKE_SSH_LOG", &self.log);
        if let Some(dir) = &self.worker_path {
            cmd.env("FAKE_SSH_PATH", dir.path());
        }
        cmd
    }

    fn hosts_reached(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The controller's one build, installed through the real pipeline.
    fn build(&self) -> String {
        let tree = self.f.tree("nccl", (2, 27, 5), &[61, 120]);
        self.f.install(&tree, "v2.27.5-1", "6.1;12.0").unwrap()
    }
}

fn script(path: &Path, body: &str) {
    std::fs::write(path, body).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Bytes under `dir`, recursively.
fn du(dir: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let m = e.metadata().unwrap();
        n += if m.is_dir() { du(&e.path()) } else { m.len() };
    }
    n
}

/// A worker whose fdl answers `cluster self` endlessly: the controller keeps at most its
/// cap in memory, writes nothing to its temp directory, ends the child at once and calls
/// the worker red with "answer too large" — well before the timeout.
#[test]
fn an_endless_answer_is_cut_at_the_cap_and_named() {
    let p = Peer::new("w1");
    p.tool(
        "fdl",
        "#!/bin/sh\nexec yes 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'\n",
    );
    let tmp = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let mut cmd = p.fdl();
    cmd.args(["cluster", "status", "--json", "--timeout", "60"])
        .env("TMPDIR", tmp.path());
    // A regression must fail this test, not exhaust the machine: fdl (and what it
    // starts) gets 4 GiB of address space and may write files of at most 64 MiB.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            let limit = |resource, bytes: u64| {
                let r = libc::rlimit {
                    rlim_cur: bytes,
                    rlim_max: bytes,
                };
                if libc::setrlimit(resource, &r) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            };
            limit(libc::RLIMIT_AS, 4 << 30)?;
            limit(libc::RLIMIT_FSIZE, 64 << 20)
        });
    }
    let out = cmd.output().unwrap();
    let took = start.elapsed();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stderr)));
    let error = v["workers"][0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("answer too large"), "{v}");
    assert_eq!(v["state"], "red", "{v}");
    assert_eq!(out.status.code(), Some(1));
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(du(tmp.path()) < 1 << 20, "temp grew to {}", du(tmp.path()));
}

/// Numbers from the command line are checked when parsed: a timeout that would overflow
/// a duration is a usage error (exit 2), never a panic, for every command that has one.
#[test]
fn numeric_flags_out_of_range_are_usage_errors() {
    let p = Peer::new("w1");
    for args in [
        &["cluster", "ship", "--timeout", "18446744073709551615"][..],
        &["cluster", "status", "--timeout", "0"],
        &["cluster", "status", "--timeout", "86401"],
        &["cluster", "env", "--parallel", "0"],
        &["cluster", "ship", "--parallel", "99999999999999999999"],
        &["cluster", "plan", "--jobs", "0"],
        &["nccl", "build", "--dry-run", "--jobs", "4294967295"],
    ] {
        let out = p.fdl().args(args).output().unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("invalid value"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// An `ssh.target` with a `/` is a valid OpenSSH alias. rsync must not read
/// `nodes/a:/…` as a local path (it would write the build, with --delete, under the
/// controller's working directory): rsync reaches a fixed host name, ssh gets the target.
#[test]
fn a_target_with_a_slash_reaches_the_worker_over_rsync_and_tar() {
    for copy in [Copy::Rsync, Copy::Tar] {
        a_target_with_a_slash_reaches_the_worker(copy);
    }
}

fn a_target_with_a_slash_reaches_the_worker(copy: Copy) {
    let p = Peer::new("nodes/a").copy_with(copy);
    let name = p.build();
    let out = p
        .fdl()
        .args(["cluster", "ship", &name, "--timeout", "30"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains(copy.words()),
        "{}",
        text(&out.stdout)
    );
    let installed = p
        .worker
        .root()
        .join("libtorch/nccl/builds")
        .join(&name)
        .join("lib/libnccl.so.2");
    assert!(installed.exists(), "{}", text(&out.stdout));
    let left: Vec<_> = std::fs::read_dir(p.cwd.path()).unwrap().collect();
    assert!(left.is_empty(), "rsync wrote locally: {left:?}");
    // Every connection, rsync's included, named the target itself to ssh.
    let hosts = p.hosts_reached();
    assert!(!hosts.is_empty());
    assert!(hosts.iter().all(|h| h == "nodes/a"), "{hosts:?}");
}

/// SIGTERM while ship's rsync runs: the rsync ends with fdl (it runs in its own process
/// group under the watchdog, as build steps do), and the message says what happened to
/// the copy instead of claiming that everything was cleaned up.
#[test]
fn sigterm_during_ship_ends_the_copy_and_says_so() {
    for copy in [Copy::Rsync, Copy::Tar] {
        sigterm_during_ship(copy);
    }
}

fn sigterm_during_ship(copy: Copy) {
    let p = Peer::new("w1").copy_with(copy);
    let name = p.build();
    let tool = match copy {
        Copy::Rsync => "rsync",
        Copy::Tar => "tar",
    };
    let pid_file = p.bin.path().join("copy.pid");
    p.tool(
        tool,
        &format!(
            "#!/bin/sh\necho $$ > '{}'\nexec sleep 60\n",
            pid_file.display()
        ),
    );
    let mut child = p
        .fdl()
        .args(["cluster", "ship", &name])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let pid: i32 = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            break pid;
        }
        assert!(Instant::now() < deadline, "{tool} never started");
        assert!(
            child.try_wait().unwrap().is_none(),
            "fdl ended before {tool}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    let err = text(&out.stderr);
    let gone = Instant::now() + Duration::from_secs(5);
    while unsafe { libc::kill(pid, 0) } == 0 {
        assert!(
            Instant::now() < gone,
            "{tool} ({pid}) outlived fdl; fdl said: {err}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !err.contains("everything this run started was cleaned up"),
        "{err}"
    );
    assert!(err.contains("rerun `fdl cluster ship` to resume"), "{err}");
}

/// `receive` installs a copy only as far as its manifest agrees with where it goes: one
/// naming another build, or an `output_dir` outside any `libtorch/nccl/builds/<name>`,
/// is refused and nothing is installed. The unedited copy installs.
#[test]
fn receive_refuses_a_manifest_that_names_another_build_or_place() {
    let p = Peer::new("w1");
    let name = p.build();
    let builds = p.worker.root().join("libtorch/nccl/builds");
    std::fs::create_dir_all(&builds).unwrap();
    let receive = |as_name: &str, edit: &dyn Fn(&mut serde_json::Value)| {
        let incoming = builds.join(format!(".incoming-{as_name}"));
        let _ = std::fs::remove_dir_all(&incoming);
        assert!(std::process::Command::new("cp")
            .arg("-a")
            .arg(p.f.builds().join(&name))
            .arg(&incoming)
            .status()
            .unwrap()
            .success());
        let manifest = incoming.join("fdl-build.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
        edit(&mut v);
        std::fs::write(&manifest, serde_json::to_string_pretty(&v).unwrap()).unwrap();
        let digest = fdl::cluster::receive::content_digest(&incoming).unwrap();
        let out = p
            .fdl_in(p.worker.root())
            .args([
                "cluster",
                "receive",
                "--install",
                as_name,
                "--digest",
                &digest,
            ])
            .output()
            .unwrap();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let (code, _, err) = receive(&name, &|v| v["plan"]["output_dir"] = "/etc/evil".into());
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("its output_dir /etc/evil is not a libtorch/nccl/builds/"),
        "{err}"
    );
    assert!(!builds.join(&name).exists());

    let other = "v2.27.5-sm61";
    let (code, _, err) = receive(other, &|_| {});
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!("it names build '{name}', not '{other}'")),
        "{err}"
    );
    assert!(!builds.join(other).exists());

    let (code, _, err) = receive(&name, &|v| {
        v["plan"]["output_dir"] = "/srv/a/libtorch/nccl/builds/../../../../etc".into()
    });
    assert_eq!(code, Some(1), "{err}");

    let (code, out, err) = receive(&name, &|_| {});
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(builds.join(&name).join("lib/libnccl.so.2").exists());
}

/// `--digest` is checked as a sha256 before it is used: multi-byte characters there end
/// in a clear error, never a panic from slicing inside a character.
#[test]
fn receive_refuses_a_digest_that_is_not_a_sha256() {
    let p = Peer::new("w1");
    let name = p.build();
    let incoming = p.f.builds().join(format!(".incoming-{name}"));
    std::fs::create_dir_all(&incoming).unwrap();
    for digest in ["éééééééééééé", "ab", &"é".repeat(32), &"A".repeat(64)] {
        let out = p
            .fdl()
            .args(["cluster", "receive", "--install", &name, "--digest", digest])
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{digest}: {err}");
        assert!(!err.contains("panicked"), "{digest}: {err}");
        assert!(err.contains("--digest must be a sha256"), "{digest}: {err}");
    }
}

/// A worker whose fdl lies with escape sequences and forged lines in its report (GPU
/// name, driver, libtorch): `cluster status` prints them escaped, so nothing retitles or
/// clears the terminal or adds an "ok" line; JSON carries them as JSON escapes.
#[test]
fn escape_sequences_from_a_worker_are_printed_escaped() {
    let p = Peer::new("w1");
    // A genuine report of this host, as the skeleton of the lie.
    let smi = fake_nvidia_smi("0, NVIDIA GeForce RTX 3090, 8.6, 24576\n", 0);
    let out = p
        .fdl_in(p.worker.root())
        .args(["cluster", "self", "--json"])
        .env("PATH", path_with(smi.path()))
        .output()
        .unwrap();
    let mut report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    report["gpus"]["known"][0]["name"] = "\u{1b}]0;pwned\u{7}RTX\u{1b}[2J".into();
    report["driver"] =
        serde_json::json!({ "known": { "version": "\u{1b}[1A\rok     all good\n", "cuda": null } });
    report["libtorch"] = serde_json::json!({ "unknown": "\u{9b}31m\u{202e}evil" });
    let answer = p.bin.path().join("answer.json");
    std::fs::write(&answer, report.to_string()).unwrap();
    p.tool("fdl", &format!("#!/bin/sh\ncat '{}'\n", answer.display()));
    let out = p.fdl().args(["cluster", "status"]).output().unwrap();
    let stdout = text(&out.stdout);
    assert!(stdout.contains("RTX"), "{stdout}{}", text(&out.stderr));
    for bad in ['\u{1b}', '\u{7}', '\r', '\u{9b}', '\u{202e}'] {
        assert!(!stdout.contains(bad), "{bad:?} in: {stdout:?}");
        assert!(!text(&out.stderr).contains(bad), "{bad:?} in stderr");
    }
    assert!(stdout.contains("\\u{1b}]0;pwned\\u{7}RTX"), "{stdout}");
    assert!(!stdout.contains("\nok     all good"), "{stdout}");
    let out = p
        .fdl()
        .args(["cluster", "status", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["workers"][0]["report"]["gpus"]["known"][0]["name"],
        "\u{1b}]0;pwned\u{7}RTX\u{1b}[2J"
    );
}

/// Strings from the cluster file reach the terminal escaped too: a worker path with an
/// escape sequence, in status's table and ship's.
#[test]
fn escape_sequences_from_the_cluster_file_are_printed_escaped() {
    let p = Peer::new("w1");
    let name = p.build();
    std::fs::write(
        p.f.project.root().join("fdl.cluster.yml"),
        "cluster:\n  controller:\n    host: c\n    path: /c\n  workers:\n    - host: \"w\\e]0;t\\a1\"\n      path: \"/no/such\\e[2J\\rdir\"\n",
    )
    .unwrap();
    for args in [
        &["cluster", "status"][..],
        &["cluster", "ship", &name],
        &["cluster", "ship", &name, "--dry-run"],
    ] {
        let out = p.fdl().args(args).output().unwrap();
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(
            stdout.contains("/no/such\\u{1b}[2J\\u{d}dir"),
            "{args:?}: {stdout}"
        );
        for bad in ['\u{1b}', '\u{7}', '\r'] {
            assert!(!stdout.contains(bad), "{args:?}: {bad:?} in {stdout:?}");
            assert!(!stderr.contains(bad), "{args:?}: {bad:?} in {stderr:?}");
        }
    }
}

/// A banner or motd printed by the worker's shell before fdl's JSON is named as such,
/// for status and ship alike, instead of "no report" and a pointless upload.
#[test]
fn a_banner_before_the_answer_is_named() {
    let p = Peer::new("w1");
    let name = p.build();
    let out = p
        .fdl()
        .args(["cluster", "status", "--json"])
        .env("FAKE_SSH_BANNER", "Welcome to node-a!\nLast login: today")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let error = v["workers"][0]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("printed 2 lines before fdl's answer, starting 'Welcome to node-a!'")
            && error.contains("banner or motd"),
        "{v}"
    );
    assert_eq!(v["workers"][0]["shipped_fdl"], false, "{v}");
    let out = p
        .fdl()
        .args(["cluster", "ship", &name, "--dry-run"])
        .env("FAKE_SSH_BANNER", "Welcome to node-a!")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains("banner or motd"),
        "{}",
        text(&out.stdout)
    );
}

/// A cached remote fdl that is not the controller's bytes (damaged, or planted by
/// someone who can write the worker's cache) is replaced by ship, as status replaces
/// one that does not answer; it is never run.
#[test]
fn ship_replaces_a_cached_fdl_that_fails_its_checksum() {
    let p = Peer::new("w1");
    let name = p.build();
    let own = assert_cmd::cargo::cargo_bin("fdl");
    let sha = fdl::digest::sha256_file(&own).unwrap();
    let cached = p.f.cache.path().join(format!("fdl/bin/fdl-{}", &sha[..16]));
    std::fs::create_dir_all(cached.parent().unwrap()).unwrap();
    let ran = p.bin.path().join("planted-ran");
    script(
        &cached,
        &format!("#!/bin/sh\ntouch '{}'\necho '{{}}'\n", ran.display()),
    );
    let out = p
        .fdl()
        .args(["cluster", "ship", &name, "--dry-run"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(text(&out.stdout).contains("would copy with rsync"));
    assert_eq!(fdl::digest::sha256_file(&cached).unwrap(), sha);
    assert!(!ran.exists(), "the planted fdl was run");
}

/// Build names are checked when the command line is parsed: one over 255 bytes is a
/// usage error before the cluster file, a lock or a plan is touched.
#[test]
fn a_build_name_over_255_bytes_is_a_usage_error() {
    let p = Peer::new("w1");
    std::fs::write(p.f.project.root().join("fdl.cluster.yml"), "not: [valid").unwrap();
    let long = format!("v{}", "a".repeat(300));
    for args in [
        &["cluster", "ship", long.as_str()][..],
        &["cluster", "env", &long],
        &["nccl", "remove", "--yes", &long],
        &["nccl", "verify", &long],
        &["nccl", "env", &long],
    ] {
        let out = p.fdl().args(args).output().unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {err}", args[1]);
        let most = format!("at most {} bytes", fdl::nccl::store::BuildName::MAX_BYTES);
        assert!(err.contains(&most), "{}: {err}", args[1]);
    }
}

/// A build whose name starts with `-` reaches the worker's fdl as a name, never as an
/// option.
#[test]
fn a_name_starting_with_a_dash_reaches_the_worker_as_a_name() {
    let p = Peer::new("w1");
    let name = p.build();
    let dashed = "-x";
    let dir = p.f.builds().join(dashed);
    assert!(std::process::Command::new("cp")
        .arg("-a")
        .arg(p.f.builds().join(&name))
        .arg(&dir)
        .status()
        .unwrap()
        .success());
    let manifest = dir.join("fdl-build.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    v["plan"]["name"] = dashed.into();
    v["plan"]["output_dir"] = dir.to_str().unwrap().into();
    std::fs::write(&manifest, v.to_string()).unwrap();
    let out = p
        .fdl()
        .args(["cluster", "ship", "--dry-run", "--", dashed])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(text(&out.stdout).contains("would copy with rsync"));
}

/// A worker that holds a different build under the name is a refusal only --force
/// changes: ship's final message says --force, not "fix that".
#[test]
fn a_refusal_that_needs_force_says_force() {
    let p = Peer::new("w1");
    let name = p.build();
    let ship = |extra: &[&str]| {
        p.fdl()
            .args(["cluster", "ship", &name])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = ship(&[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let there = p.worker.root().join("libtorch/nccl/builds").join(&name);
    std::fs::write(there.join("include/extra.h"), "// another build\n").unwrap();
    for extra in [&[][..], &["--dry-run"]] {
        let out = ship(extra);
        assert_eq!(out.status.code(), Some(1));
        let err = text(&out.stderr);
        assert!(
            err.contains("w1 already holds something else") && err.contains("Rerun with --force"),
            "{extra:?}: {err}"
        );
    }
    let out = ship(&["--force"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!there.join("include/extra.h").exists());
}

/// A worker whose machine-wide build store holds the build's key is sent only fdl's
/// manifest and log: it fills the rest from its store (checked byte for byte), and ends
/// with a build byte-identical to the controller's, so a second ship is a no-op. Here the
/// "worker" shares the controller's cache, so its store is the one the build was added to.
#[test]
fn a_worker_with_the_key_in_its_store_is_sent_no_library_bytes() {
    for copy in [Copy::Rsync, Copy::Tar] {
        let p = Peer::new("node-a").copy_with(copy);
        let tree = p.f.tree("nccl", (2, 27, 5), &[61, 120]);
        let name = install_build_with(
            p.f.project.root(),
            p.f.cache.path(),
            &tree,
            "v2.27.5-1",
            "6.1;12.0",
            true,
        )
        .unwrap();
        let ours = p.f.project.root().join("libtorch/nccl/builds").join(&name);
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(ours.join("fdl-build.json")).unwrap()).unwrap();
        let key = manifest["store"]["key"]
            .as_str()
            .expect("a store key")
            .to_string();
        let entry_lib =
            p.f.cache
                .path()
                .join("fdl/store")
                .join(&key)
                .join("tree/lib/libnccl.so.2.27.5");
        assert!(entry_lib.is_file(), "{copy:?}: no store entry");

        let dry = p
            .fdl()
            .args(["cluster", "ship", &name, "--dry-run", "--json"])
            .output()
            .unwrap();
        assert!(dry.status.success(), "{}", text(&dry.stderr));
        assert!(
            text(&dry.stdout).contains("from its build store"),
            "{}",
            text(&dry.stdout)
        );

        let out = p
            .fdl()
            .args(["cluster", "ship", &name, "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{copy:?}: {}\n{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let copied = v["workers"][0]["copy"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            copied.starts_with("from its build store; sent only"),
            "{copy:?}: {v}"
        );
        // What went over the wire: the manifest and the log, nothing of lib/.
        let sent: u64 = copied
            .split(", ")
            .nth(1)
            .and_then(|b| b.strip_suffix(" bytes"))
            .and_then(|b| b.parse().ok())
            .expect("the bytes sent are named");
        let fdl_files = ["fdl-build.json", "build.log"]
            .iter()
            .map(|f| std::fs::metadata(ours.join(f)).map_or(0, |m| m.len()))
            .sum::<u64>();
        assert_eq!(sent, fdl_files, "{copy:?}");
        let theirs = p.worker.root().join("libtorch/nccl/builds").join(&name);
        let lib = theirs.join("lib/libnccl.so.2.27.5");
        assert_eq!(
            std::fs::read(&lib).unwrap(),
            std::fs::read(ours.join("lib/libnccl.so.2.27.5")).unwrap()
        );
        assert_eq!(
            std::fs::read(theirs.join("fdl-build.json")).unwrap(),
            std::fs::read(ours.join("fdl-build.json")).unwrap()
        );
        let again = p.fdl().args(["cluster", "ship", &name]).output().unwrap();
        assert!(again.status.success(), "{}", text(&again.stderr));
        assert!(
            text(&again.stdout).to_lowercase().contains("already"),
            "{copy:?}: {}",
            text(&again.stdout)
        );
    }
}

/// A split libtorch (torch 1.x's layout) keeps its kernels in the `libtorch_cuda_cu.so`
/// that `libtorch_cuda.so` loads: a worker's report judges that file's code, so a GPU it
/// covers is covered (no false red on a healthy rig) and one it lacks is not; a split
/// build in which no file holds GPU code is unknown, never "no code".
#[test]
fn a_split_libtorch_is_judged_on_the_code_it_loads() {
    let p = ProjectFixture::empty().activate("precompiled/cu116\n");
    let lib = p.variant_lib("precompiled/cu116");
    let dir = lib.parent().unwrap().to_path_buf();
    std::fs::create_dir_all(&dir).unwrap();
    let split = |archs: &[u32]| {
        let cu = dir.join("libtorch_cuda_cu.so");
        compile_shared(
            &format!(
                "int fdl_test_cu(void) {{ return 1; }}\n{}",
                fatbin_c_source(archs, "fdl_test_cu_fatbin")
            ),
            &cu,
            &["-Wl,-soname,libtorch_cuda_cu.so"],
        );
        let dir_s = dir.display().to_string();
        compile_shared(
            "int fdl_test_cu(void);\nint fdl_test_torch(void) { return fdl_test_cu(); }\n",
            &lib,
            &["-L", &dir_s, "-ltorch_cuda_cu", "-Wl,-rpath,$ORIGIN"],
        );
    };
    let torch_coverage = |gpu: &str| {
        let smi = fake_nvidia_smi(gpu, 0);
        let out = fdl_in(p.root())
            .args(["cluster", "self", "--json"])
            .env("PATH", path_with(smi.path()))
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stderr)));
        v["torch_coverage"].clone()
    };
    split(&[61, 86]);
    let t = torch_coverage("0, NVIDIA GeForce GTX 1060 6GB, 6.1, 6144\n");
    assert_eq!(t["known"]["gpus"][0]["covered"], true, "{t}");
    let files = t["known"]["files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "only the file with code is judged: {t}");
    assert!(
        files[0]["file"]
            .as_str()
            .unwrap()
            .ends_with("/lib/libtorch_cuda_cu.so"),
        "{t}"
    );
    let t = torch_coverage("0, NVIDIA GeForce RTX 2080, 7.5, 8192\n");
    assert_eq!(t["known"]["gpus"][0]["covered"], false, "{t}");
    // No file holds GPU code: what runs is not known.
    split(&[]);
    let t = torch_coverage("0, NVIDIA GeForce GTX 1060 6GB, 6.1, 6144\n");
    let why = t["unknown"].as_str().unwrap_or_else(|| panic!("{t}"));
    assert!(
        why.contains("nor the torch libraries it loads hold GPU code"),
        "{why}"
    );
}
