//! `fdl cluster` on bad input, which needs no host: no cluster file, a wrong shape, an
//! unknown `--workers` name. Each is a clear error with a non-zero exit, before any SSH,
//! and leaves the project as it was. `cluster env` needs no host either.

use crate::common;
use common::*;

const CLUSTER: &str = "cluster:\n  controller:\n    host: 10.0.0.1\n    path: /c\n  workers:\n    - host: node-a\n      path: /opt/flodl\n    - host: node-b\n      path: \"/srv/it's-here\"\n";

fn run(f: &BuildsFixture, args: &[&str]) -> std::process::Output {
    f.fdl().args(args).output().unwrap()
}

#[test]
fn no_cluster_file_and_wrong_shapes_are_clear_errors() {
    let f = BuildsFixture::new(ProjectFixture::empty());
    let before = snapshot(f.project.root());
    let out = run(&f, &["cluster", "status"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no cluster file at") && err.contains("identity_file:"),
        "{err}"
    );
    assert_eq!(snapshot(f.project.root()), before);

    std::fs::write(
        f.project.root().join("fdl.cluster.yml"),
        "cluster:\n  controller:\n    host: c\n    path: /c\n  workers:\n    - host: a\n      path: [1]\n",
    )
    .unwrap();
    let before = snapshot(f.project.root());
    for args in [
        &["cluster", "status", "--json"][..],
        &["cluster", "plan"][..],
        &["cluster", "ship", "--dry-run"][..],
        &["cluster", "env"][..],
    ] {
        let out = run(&f, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("fdl.cluster.yml:7: cluster.workers[0].path must be a plain value, but it is a list"),
            "{args:?}: {err}"
        );
    }
    // --json: the error is one object on stdout too.
    let out = run(&f, &["cluster", "status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["error"]
        .as_str()
        .unwrap()
        .contains("cluster.workers[0].path"));
    assert_eq!(snapshot(f.project.root()), before);
}

#[test]
fn env_blocks_need_no_host_and_ship_refuses_an_unknown_worker_before_connecting() {
    let f = BuildsFixture::new(ProjectFixture::empty());
    let tree = f.tree("nccl", (2, 27, 5), &[61, 120]);
    let name = f.install(&tree, "v2.27.5-1", "6.1;12.0").unwrap();
    std::fs::write(f.project.root().join("fdl.cluster.yml"), CLUSTER).unwrap();

    let out = run(&f, &["cluster", "env"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!(
        "# worker node-a\nenv:\n  LD_PRELOAD: \"/opt/flodl/libtorch/nccl/builds/{name}/lib/libnccl.so.2\""
    )), "{text}");
    assert!(
        text.contains(&format!(
            "LD_PRELOAD: \"/srv/it's-here/libtorch/nccl/builds/{name}/lib/libnccl.so.2\""
        )),
        "{text}"
    );
    // A worker whose path holds a space would have its LD_PRELOAD split by glibc: only a
    // link the worker makes in its own cache names the build honestly, and a worker that
    // cannot be reached cannot make one. A clear refusal, nothing to paste.
    std::fs::write(
        f.project.root().join("fdl.cluster.yml"),
        CLUSTER.replace("it's-here", "it's here"),
    )
    .unwrap();
    let out = run(&f, &["cluster", "env", "--timeout", "5"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("node-b") && err.contains("glibc splits LD_PRELOAD"),
        "{err}"
    );
    std::fs::write(f.project.root().join("fdl.cluster.yml"), CLUSTER).unwrap();

    let before = snapshot(f.project.root());
    let out = run(&f, &["cluster", "ship", "--workers", "node-a,node-c"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--workers names node-c, which is not a worker")
            && err.contains("node-a, node-b"),
        "{err}"
    );
    let out = run(&f, &["cluster", "ship", "v9.9.9-sm61"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no build named 'v9.9.9-sm61'"));
    assert_eq!(snapshot(f.project.root()), before);
}

/// A key written twice is refused, naming both lines, in a worker and at the top level;
/// a UTF-8 byte-order mark at the start of the file is accepted.
#[test]
fn duplicate_keys_are_refused_and_a_bom_is_accepted() {
    let f = BuildsFixture::new(ProjectFixture::empty());
    let file = f.project.root().join("fdl.cluster.yml");
    std::fs::write(
        &file,
        "cluster:\n  controller:\n    host: c\n    path: /c\n  workers:\n    - host: a\n      path: /one\n      path: /two\n",
    )
    .unwrap();
    let out = run(&f, &["cluster", "env"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the key `path` appears twice in one mapping (lines 7 and 8)"),
        "{err}"
    );
    std::fs::write(&file, format!("{CLUSTER}cluster:\n  workers: []\n")).unwrap();
    let out = run(&f, &["cluster", "env"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the key `cluster` appears twice in one mapping (lines 1 and 10)"),
        "{err}"
    );

    let tree = f.tree("nccl", (2, 27, 5), &[61, 120]);
    f.install(&tree, "v2.27.5-1", "6.1;12.0").unwrap();
    std::fs::write(&file, format!("\u{feff}{CLUSTER}")).unwrap();
    let out = run(&f, &["cluster", "env"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `cluster plan` with every input given by flags plans without workers that do not
/// answer (here: a port nothing listens on), and its warnings name each silent worker;
/// without `--archs` it still refuses, naming the flag that would let it plan.
#[test]
fn plan_from_flags_when_workers_do_not_answer() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let f = BuildsFixture::new(ProjectFixture::empty());
    std::fs::write(
        f.project.root().join("fdl.cluster.yml"),
        format!(
            "cluster:\n  controller:\n    host: c\n    path: /c\n  workers:\n    - host: 127.0.0.1\n      path: /w\n      ssh:\n        port: {port}\n    - host: localhost\n      path: /w\n      ssh:\n        port: {port}\n"
        ),
    )
    .unwrap();
    let before = snapshot(f.project.root());
    let out = run(
        &f,
        &["cluster", "plan", "--tag", "v2.27.5-1", "--timeout", "10"],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot plan for the cluster while workers do not answer")
            && err.contains("127.0.0.1: unreachable over SSH")
            && err.contains("pass --archs to plan without them"),
        "{err}"
    );

    let args = [
        "cluster",
        "plan",
        "--tag",
        "v2.27.5-1",
        "--archs",
        "8.6;12.0",
        "--timeout",
        "10",
    ];
    let out = run(&f, &[&args[..], &["--json"]].concat());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let plan = &v["plan"];
    assert_eq!(plan["tag"], "v2.27.5-1", "{v}");
    assert_eq!(plan["archs"], serde_json::json!(["sm_86", "sm_120"]), "{v}");
    let warnings: Vec<&str> = plan["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert!(
        warnings[0].starts_with("2 of 2 workers did not answer")
            && warnings[0].contains("pass --cuda"),
        "{warnings:?}"
    );
    for host in ["127.0.0.1", "localhost"] {
        let said: Vec<_> = warnings
            .iter()
            .filter(|w| w.starts_with(&format!("{host} did not answer: unreachable over SSH")))
            .collect();
        assert_eq!(said.len(), 1, "{host}: {warnings:?}");
    }
    // The workers' silence is no problem of the plan: it runs when the backend does.
    // (absent when there are none)
    let problems = plan["problems"].as_array().cloned().unwrap_or_default();
    assert!(
        problems
            .iter()
            .all(|p| !p.as_str().unwrap().contains("answer")),
        "{problems:?}"
    );
    assert_eq!(out.status.success(), problems.is_empty(), "{v}");
    // Text: the plan, the warnings, the dry run's last line.
    let out = run(&f, &args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("2 of 2 workers did not answer")
            && text.contains("localhost did not answer: unreachable over SSH")
            && text.contains("Dry run: nothing was built"),
        "{text}"
    );
    assert_eq!(snapshot(f.project.root()), before);
}
