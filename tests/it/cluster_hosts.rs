//! The test hosts of the `fdl cluster` tests (tests/cluster_fixture), checked on their own.
//!
//! Each host is a real OpenSSH server in its own Docker container, with its own
//! filesystem and its own host keys, made from `fdl-test-debian:sshd`: this machine's
//! Debian release (debootstrap minbase from the mirror its apt sources name) with
//! openssh-server and rsync, `docker import`ed by tests/support/sshd-image.sh, since no
//! registry is reachable. The image is made once (about a minute and a half) and kept.
//! Hosts are reached only through port 22 published on 127.0.0.1 at an ephemeral port, as
//! root, with a per-test key and `known_hosts` and `StrictHostKeyChecking=yes`; every
//! container is removed when its `Host` drops, on panic too.
//!
//! They need a Docker engine and, for the first image build, debootstrap and the Debian
//! mirror, so they are `#[ignore]`d: a plain `cargo test` counts them as ignored, and
//! `cargo test --test it cluster_hosts:: -- --include-ignored` runs them, failing (never
//! passing) when the engine, the image or ssh is missing.

use crate::cluster_fixture;
use cluster_fixture::*;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const GPUS: &[(&str, &str, u32)] = &[
    ("NVIDIA GeForce GTX 1060 6GB", "6.1", 6144),
    ("NVIDIA GeForce RTX 5060 Ti", "12.0", 16311),
];

/// Runs `remote` on the host over ssh with the fixture's argv.
fn ssh(host: &Host, keys: &Keys, remote: &str) -> Output {
    ssh_with(&host.ssh_argv(keys), remote)
}

fn ssh_with(argv: &[String], remote: &str) -> Output {
    Command::new(&argv[0])
        .args(&argv[1..])
        .arg(remote)
        .stdin(Stdio::null())
        .output()
        .expect("cannot run ssh: apt-get install -y openssh-client")
}

/// `remote`'s stdout, which must succeed.
fn ssh_ok(host: &Host, keys: &Keys, remote: &str) -> String {
    let out = ssh(host, keys, remote);
    assert!(
        out.status.success(),
        "ssh to {} `{remote}` failed ({}): {}",
        host.label,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn container_names() -> Vec<String> {
    let out = Command::new("docker")
        .args(["ps", "-a", "--format", "{{.Names}}"])
        .output()
        .expect("cannot run docker");
    assert!(out.status.success(), "docker ps: {}", stderr(&out));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
#[ignore = "drives the real Docker engine: `cargo test -- --include-ignored`"]
fn three_hosts_answer_over_ssh_each_with_its_own_filesystem_and_gpus() {
    let keys = Keys::new();
    let t = Instant::now();
    let hosts: Vec<Host> = std::thread::scope(|s| {
        let started: Vec<_> = ["a", "b", "c"]
            .iter()
            .map(|label| s.spawn(|| Host::start(label, &keys)))
            .collect();
        started.into_iter().map(|h| h.join().unwrap()).collect()
    });
    eprintln!("three hosts up in {:?}", t.elapsed());

    let mut ports: Vec<u16> = hosts.iter().map(|h| h.port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 3, "each host has its own port: {ports:?}");
    for host in &hosts {
        assert!(host.name.starts_with("fdl-test-host-") && host.name.ends_with(&host.label));
        let out = ssh(host, &keys, "true");
        assert!(out.status.success(), "ssh true: {}", stderr(&out));
        assert_eq!(ssh_ok(host, &keys, "hostname").trim(), host.label);
        assert_eq!(ssh_ok(host, &keys, "id -u").trim(), "0");
        ssh_ok(host, &keys, "rsync --version >/dev/null");
        let marker = format!("/root/only-on-{}", host.label);
        ssh_ok(host, &keys, &format!("echo {} >{marker}", host.label));
    }
    // Each host sees its own marker and none of the others'.
    for host in &hosts {
        for other in &hosts {
            let marker = format!("/root/only-on-{}", other.label);
            let out = ssh(host, &keys, &format!("test -e {marker}"));
            assert_eq!(
                out.status.success(),
                host.label == other.label,
                "{marker} on host {}",
                host.label
            );
        }
    }

    // The stand-in nvidia-smi, on one host only, answering as the real one over ssh.
    let (a, b) = (&hosts[0], &hosts[1]);
    a.fake_nvidia_smi(GPUS, "570.133.07", "12.8");
    let query =
        "nvidia-smi --query-gpu=index,name,compute_cap,memory.total --format=csv,noheader,nounits";
    assert_eq!(
        ssh_ok(a, &keys, query),
        "0, NVIDIA GeForce GTX 1060 6GB, 6.1, 6144\n1, NVIDIA GeForce RTX 5060 Ti, 12.0, 16311\n"
    );
    assert_eq!(
        ssh_ok(
            a,
            &keys,
            "nvidia-smi --query-gpu=driver_version --format=csv,noheader"
        ),
        "570.133.07\n570.133.07\n"
    );
    let banner = ssh_ok(a, &keys, "nvidia-smi");
    eprintln!("{banner}");
    let lines: Vec<&str> = banner.lines().collect();
    assert!(lines.len() > 10, "{banner}");
    assert_eq!(lines[1], format!("+{}+", "-".repeat(89)));
    assert_eq!(
        lines[2],
        "| NVIDIA-SMI 570.133.07             Driver Version: 570.133.07     CUDA Version: 12.8     |"
    );
    assert!(banner.contains("Driver Version:") && banner.contains("CUDA Version:"));
    assert!(
        banner.contains("|   1  NVIDIA GeForce RTX 5060 Ti "),
        "{banner}"
    );
    assert!(banner.contains("16311MiB"), "{banner}");
    let wrong = ssh(a, &keys, "nvidia-smi --bogus");
    assert_eq!(wrong.status.code(), Some(2), "{}", stderr(&wrong));
    assert!(stderr(&wrong).contains("Invalid combination of input arguments"));
    let missing = ssh(b, &keys, "command -v nvidia-smi");
    assert!(!missing.status.success(), "host b has no nvidia-smi");

    // put() keeps the mode, write() sets it; exec() sees what ssh sees.
    let local = keys.dir.path().join("tool.sh");
    std::fs::write(&local, "#!/bin/sh\necho tool-ran\n").unwrap();
    std::fs::set_permissions(&local, std::fs::Permissions::from_mode(0o750)).unwrap();
    b.put(&local, "/opt/fdl test/bin/tool.sh");
    assert_eq!(
        ssh_ok(
            b,
            &keys,
            "stat -c %a '/opt/fdl test/bin/tool.sh'; '/opt/fdl test/bin/tool.sh'"
        ),
        "750\ntool-ran\n"
    );
    b.write("/etc/fdl-note", "hello\n", 0o640);
    assert_eq!(
        b.exec("stat -c %a /etc/fdl-note; cat /etc/fdl-note"),
        "640\nhello\n"
    );

    // The yaml block is a working connection: read it back and ssh with what it says.
    let yaml = format!("workers:\n  - host: c\n{}", hosts[2].ssh_yaml(&keys, 4));
    let doc = marked_yaml::parse_yaml(0, &yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    let s = doc.as_mapping().unwrap().get_sequence("workers").unwrap()[0]
        .as_mapping()
        .unwrap()
        .get_mapping("ssh")
        .unwrap();
    let field = |k: &str| s.get_scalar(k).unwrap().as_str().to_string();
    assert_eq!(field("port"), hosts[2].port.to_string());
    let mut argv = vec![
        "ssh".to_string(),
        "-p".into(),
        field("port"),
        "-l".into(),
        field("user"),
        "-i".into(),
        field("identity_file"),
        "-o".into(),
        "BatchMode=yes".into(),
    ];
    for o in s.get_sequence("options").unwrap().iter() {
        argv.extend([
            "-o".to_string(),
            o.as_scalar().unwrap().as_str().to_string(),
        ]);
    }
    argv.extend(["-T".to_string(), field("target")]);
    let out = ssh_with(&argv, "hostname");
    assert!(out.status.success(), "{argv:?}: {}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "c");
}

#[test]
#[ignore = "drives the real Docker engine: `cargo test -- --include-ignored`"]
fn a_changed_host_key_is_refused() {
    let keys = Keys::new();
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| Host::start("keyed-a", &keys));
        let b = s.spawn(|| Host::start("keyed-b", &keys));
        (a.join().unwrap(), b.join().unwrap())
    });
    let known = std::fs::read_to_string(&keys.known_hosts).unwrap();
    let key_of = |host: &Host| {
        let prefix = format!("[127.0.0.1]:{} ssh-ed25519 ", host.port);
        let line = known
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no key for {} in:\n{known}", host.label));
        line[prefix.len()..].to_string()
    };
    let (key_a, key_b) = (key_of(&a), key_of(&b));
    assert_ne!(key_a, key_b, "each container has its own host key");

    // Host b presenting a key other than the one known for its port: a's.
    let forged = keys.dir.path().join("forged_known_hosts");
    std::fs::write(
        &forged,
        format!("[127.0.0.1]:{} ssh-ed25519 {key_a}\n", b.port),
    )
    .unwrap();
    let known_opt = format!("UserKnownHostsFile={}", keys.known_hosts.display());
    let forged_opt = format!("UserKnownHostsFile={}", forged.display());
    let argv: Vec<String> = b
        .ssh_argv(&keys)
        .into_iter()
        .map(|a| {
            if a == known_opt {
                forged_opt.clone()
            } else {
                a
            }
        })
        .collect();
    assert!(argv.contains(&forged_opt));
    let out = ssh_with(&argv, "touch /tmp/ran");
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("REMOTE HOST IDENTIFICATION HAS CHANGED")
            && err.contains("Host key verification failed"),
        "{err}"
    );
    assert_eq!(
        b.exec("test -e /tmp/ran && echo ran || echo not-run"),
        "not-run\n"
    );

    // Host a regenerating its keys (sshd re-executes itself on SIGHUP, reading them anew).
    a.exec(
        "rm -f /etc/ssh/ssh_host_*; ssh-keygen -A >/dev/null; kill -HUP \"$(cat /run/sshd.pid)\"",
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let err = loop {
        let out = ssh(&a, &keys, "touch /tmp/ran");
        assert!(!out.status.success(), "ssh accepted a changed host key");
        let err = stderr(&out);
        if err.contains("Host key verification failed") {
            break err;
        }
        assert!(
            Instant::now() < deadline,
            "sshd did not come back with new keys: {err}\n{}",
            a.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        err.contains("REMOTE HOST IDENTIFICATION HAS CHANGED"),
        "{err}"
    );
    assert_ne!(
        a.exec("cut -d' ' -f2 /etc/ssh/ssh_host_ed25519_key.pub")
            .trim(),
        key_a
    );
    assert_eq!(
        a.exec("test -e /tmp/ran && echo ran || echo not-run"),
        "not-run\n"
    );
    // The known file was not touched, and b still answers through it.
    assert_eq!(std::fs::read_to_string(&keys.known_hosts).unwrap(), known);
    assert_eq!(ssh_ok(&b, &keys, "hostname").trim(), "keyed-b");
}

#[test]
#[ignore = "drives the real Docker engine: `cargo test -- --include-ignored`"]
fn dropped_hosts_leave_no_container() {
    let keys = Keys::new();
    let mut names = Vec::new();
    {
        let t = Instant::now();
        let running = Host::start("drop-running", &keys);
        eprintln!("one host up in {:?}", t.elapsed());
        let paused = Host::start_with("drop-paused", &keys, &["--tmpfs", "/data:size=2m"]);
        let killed = Host::start("drop-killed", &keys);
        assert_eq!(
            paused.exec("df -k /data | tail -n 1 | awk '{print $2}'"),
            "2048\n"
        );
        paused.pause();
        killed.kill();
        // A paused host answers no ssh (the connection is accepted, nothing more).
        let mut argv = paused.ssh_argv(&keys);
        argv.splice(1..1, ["-o".to_string(), "ConnectTimeout=2".to_string()]);
        let out = ssh_with(&argv, "true");
        assert!(!out.status.success());
        paused.unpause();
        assert!(ssh(&paused, &keys, "true").status.success());
        paused.pause();
        for h in [&running, &paused, &killed] {
            names.push(h.name.clone());
        }
        let present = container_names();
        assert!(names.iter().all(|n| present.contains(n)), "{present:?}");
    }
    // A test that panics while holding a host removes it too.
    let (tx, rx) = std::sync::mpsc::channel();
    let keys_ref = &keys;
    let panicked = std::thread::scope(|s| {
        s.spawn(move || {
            let host = Host::start("drop-panicked", keys_ref);
            tx.send(host.name.clone()).unwrap();
            panic!("a test failing with its host up");
        })
        .join()
    });
    assert!(panicked.is_err());
    names.push(rx.recv().unwrap());

    let present = container_names();
    for name in &names {
        assert!(
            !present.contains(name),
            "{name} is still there: {present:?}"
        );
    }
}

#[test]
#[ignore = "drives the real Docker engine: `cargo test -- --include-ignored`"]
fn a_host_that_cannot_start_fails_clearly_and_leaves_no_container() {
    let keys = Keys::new();
    let failed = std::thread::scope(|s| {
        s.spawn(|| {
            // Nothing of the startup runs: the container exits at once.
            let _ = Host::start_with("wont-start", &keys, &["--entrypoint", "false"]);
        })
        .join()
    });
    let message = failed.expect_err("a host whose sshd never runs must not start");
    let message = message
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(message.contains("stopped while starting"), "{message}");
    let present = container_names();
    assert!(
        !present.iter().any(|n| n.ends_with("-wont-start") && n.contains(&format!("-{}-", std::process::id()))),
        "{present:?}"
    );
}
