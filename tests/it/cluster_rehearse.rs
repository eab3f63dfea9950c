//! `fdl cluster rehearse`: NCCL's bootstrap rehearsed on real hosts, each case judged
//! against the real NCCL's own `NCCL_DEBUG=INFO` lines on that worker (the oracle of
//! tests/cluster_fixture/bootstrap.rs, a C program of its own).
//!
//! The hosts are the sshd containers of tests/cluster_fixture, on Docker networks the
//! test makes: `shared` (IPv4, every host), `private` (IPv4, the root only) and `v6`
//! (IPv6, one worker only). Each worker's libtorch finds the real NCCL 2.27.5 of the
//! `nvidia-nccl-cu12` wheel beside it, as pip lays torch out. Covered: all reachable
//! (green), a worker's `NCCL_SOCKET_IFNAME` naming a missing interface (NCCL's error),
//! the root choosing an interface the others cannot reach (red, naming it), a worker
//! forced to IPv6 among IPv4 hosts (red, the family named), the root on its loopback
//! (red, named so), and a worker whose
//! effective NCCL fdl cannot vouch for (refused, never run). Locally, without Docker:
//! an fdl build is run by its recorded digest, and a changed one is refused.
//!
//! `#[ignore]`d: `.ci/run` runs them with `--include-ignored`; a missing engine or
//! oracle input fails them.

use crate::cluster_fixture::bootstrap::{self, nccl_path, Network, Parts, VARIANT};
use crate::cluster_fixture::{Host, Keys};
use crate::common::*;
use std::path::Path;
use std::process::Output;

/// The checkout on every host.
const PATH: &str = "/opt/flodl";

/// fdl.cluster.yml naming the hosts, each with its `env:` lines (YAML, by index).
fn write_cluster_file(root: &Path, keys: &Keys, hosts: &[&Host], env: &[(usize, &str)]) {
    let mut y = String::from(
        "cluster:\n  controller:\n    host: 127.0.0.1\n    path: /controller\n  workers:\n",
    );
    for (i, host) in hosts.iter().enumerate() {
        y.push_str(&format!(
            "    - host: {}\n      path: {PATH}\n      arch: {VARIANT}\n",
            host.label
        ));
        y.push_str(&host.ssh_yaml(keys, 6));
        let lines: Vec<&str> = env
            .iter()
            .filter(|(w, _)| *w == i)
            .map(|(_, l)| *l)
            .collect();
        if !lines.is_empty() {
            y.push_str("      env:\n");
            for l in lines {
                y.push_str(&format!("        {l}\n"));
            }
        }
    }
    std::fs::write(root.join("fdl.cluster.yml"), y).unwrap();
}

fn worker<'a>(v: &'a serde_json::Value, host: &str) -> &'a serde_json::Value {
    v["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["host"] == host)
        .unwrap_or_else(|| panic!("no worker {host} in {v}"))
}

/// The worker's chosen interface and address (without the port) equal NCCL's own line
/// on that host under the same settings.
fn assert_as_nccl_says(v: &serde_json::Value, host: &Host, env: &[&str]) {
    let w = worker(v, &host.label);
    let said = bootstrap::oracle(host, &nccl_path(PATH), env);
    let outcome = &w["bootstrap"]["outcome"];
    match said {
        Ok((iface, addr)) => {
            assert_eq!(outcome["state"], "chosen", "{}: {w}", host.label);
            assert_eq!(outcome["interface"], iface.as_str(), "{}: {w}", host.label);
            let got: std::net::SocketAddr = outcome["address"].as_str().unwrap().parse().unwrap();
            let want: std::net::IpAddr = addr.parse().unwrap();
            assert_eq!(got.ip(), want, "{}: {w}", host.label);
        }
        Err((code, warn)) => {
            assert_eq!(outcome["state"], "nccl_error", "{}: {w}", host.label);
            assert_eq!(outcome["code"], code, "{}: {w}", host.label);
            assert_eq!(outcome["warn"], warn.as_str(), "{}: {w}", host.label);
        }
    }
}

/// The session docs/cluster.md shows (the block that starts `$ fdl cluster rehearse
/// --within 3`) is this test's output, the engine's addresses, ports and times aside
/// (they differ from run to run), spaces and line breaks run together.
fn docs_show(out: &Output) {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cluster.md")).unwrap();
    let shown: Vec<&str> = doc
        .lines()
        .skip_while(|l| *l != "$ fdl cluster rehearse --within 3")
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .collect();
    assert!(
        !shown.is_empty(),
        "docs/cluster.md shows no rehearsal session"
    );
    let real = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // An IPv4 address (with a port, a prefix or a `)`), a time in ms: N.
    let norm = |w: &str| -> String {
        let core = w.trim_end_matches([')', ',', ';', ':', '.']);
        let addr = core.split([':', '/']).next().unwrap_or("");
        let parts: Vec<&str> = addr.split('.').collect();
        if parts.len() == 4
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        {
            return w.replacen(core, "ADDR", 1);
        }
        if !core.is_empty()
            && core
                .trim_start_matches('(')
                .bytes()
                .all(|b| b.is_ascii_digit())
        {
            return w.replacen(core.trim_start_matches('('), "N", 1);
        }
        w.to_string()
    };
    let join = |lines: Vec<&str>| -> String {
        lines
            .iter()
            .flat_map(|l| l.split_whitespace())
            .map(norm)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(
        join(shown),
        join(real.lines().collect()),
        "docs/cluster.md's rehearsal session is not this run's output (addresses aside):\n{real}"
    );
}

fn finding_texts(v: &serde_json::Value) -> Vec<String> {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["text"].as_str().unwrap().to_string())
        .collect()
}

#[test]
#[ignore = "drives the real Docker engine and OpenSSH, and needs the real NCCL of `source .ci/setup`: `cargo test -- --include-ignored`"]
fn the_rehearsal_says_what_each_workers_nccl_chose_and_which_pairs_fail() {
    let nccl = oracle_input("FDL_TEST_NCCL_LIB");
    let other = oracle_input("FDL_TEST_NCCL_LIB_2215");
    let parts = Parts::new(&nccl);
    // Declared before the hosts: dropped after them.
    let shared = Network::new("shared", false);
    let private = Network::new("private", false);
    let v6 = Network::new("v6", true);
    let keys = Keys::new();
    let mut args = vec!["--network".to_string(), shared.name.clone()];
    args.extend(parts.mount_args(PATH));
    // A real NCCL of another release at a path no libtorch names, for the refusal.
    args.extend([
        "-v".to_string(),
        format!("{}:/opt/other/libnccl.so.2:ro", other.display()),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut hosts: Vec<Host> = std::thread::scope(|s| {
        let started: Vec<_> = ["a", "b", "c"]
            .iter()
            .map(|l| s.spawn(|| Host::start_with(l, &keys, &args)))
            .collect();
        started.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for h in &hosts {
        parts.install(h, PATH);
    }
    let (a, b, c) = (&hosts[0], &hosts[1], &hosts[2]);
    let all = [a, b, c];
    let project = ProjectFixture::empty();
    let cache = tempfile::tempdir().unwrap();
    let fdl = || {
        let mut c = fdl_in(project.root());
        c.env("XDG_CACHE_HOME", cache.path());
        c
    };
    let rehearse = |extra: &[&str]| {
        let out = fdl()
            .args(["cluster", "rehearse", "--json"])
            .args(extra)
            .output()
            .unwrap();
        let v = json_of(&out);
        let errors = crate::common::schema::validate_against("cluster-rehearse", &v);
        assert!(errors.is_empty(), "{errors:?}\n{v}");
        (out.status.code(), v)
    };

    // What listens on each host before (sshd, the engine's DNS): the same after.
    let listening = |h: &Host| {
        h.exec("cat /proc/net/tcp /proc/net/tcp6 | awk '$4 == \"0A\" { print $2 }' | sort")
    };
    let before: Vec<String> = all.iter().map(|h| listening(h)).collect();

    // Green: every NCCL chose eth0 on the shared network, and every pair connects.
    write_cluster_file(project.root(), &keys, &all, &[]);
    let (code, v) = rehearse(&[]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["state"], "ok", "{v}");
    assert_eq!(v["root"], "a");
    for h in all {
        assert_as_nccl_says(&v, h, &[]);
        let w = worker(&v, &h.label);
        assert_eq!(
            w["bootstrap"]["library"]["trust"]["kind"], "libtorch",
            "{w}"
        );
        assert_eq!(w["bootstrap"]["library"]["version"], "2.27.5", "{w}");
        let addr = w["bootstrap"]["outcome"]["address"].as_str().unwrap();
        let ip = addr.rsplit_once(':').unwrap().0;
        assert_eq!(ip, shared.address_of(h, false), "{w}");
    }
    let pairs = v["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 4, "root <-> each worker: {v}");
    assert!(pairs.iter().all(|p| p["result"]["state"] == "yes"), "{v}");
    // Nothing is left listening on any worker.
    for (h, before) in all.iter().zip(&before) {
        assert_eq!(&listening(h), before, "nothing new listens on {}", h.label);
    }
    // The text form says the same, and a root that is no worker is refused.
    let text = fdl()
        .args(["cluster", "rehearse", "--rank0", "b"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&text.stdout);
    assert!(text.status.success(), "{out}");
    assert!(out.contains("root b (no GPU is touched"), "{out}");
    assert!(
        out.contains("every worker's NCCL chose an address"),
        "{out}"
    );
    let wrong = fdl()
        .args(["cluster", "rehearse", "--rank0", "nosuch"])
        .output()
        .unwrap();
    assert_eq!(wrong.status.code(), Some(1));
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        err.contains("--rank0 nosuch is not a worker (the workers: a, b, c)"),
        "{err}"
    );

    // b names an interface it lacks: NCCL's own error, as NCCL says it on b.
    write_cluster_file(
        project.root(),
        &keys,
        &all,
        &[(1, "NCCL_SOCKET_IFNAME: nosuch0")],
    );
    let (code, v) = rehearse(&[]);
    assert_eq!(code, Some(1), "red exits 1: {v}");
    assert_eq!(v["state"], "red");
    assert_as_nccl_says(&v, b, &["NCCL_SOCKET_IFNAME=nosuch0"]);
    let texts = finding_texts(&v);
    assert!(
        texts.iter().any(|t| t.starts_with(
            "b: NCCL 2.27.5 failed its bootstrap setup with error 5 (Bootstrap : no socket interface found) with NCCL_SOCKET_IFNAME=nosuch0; its interfaces: eth0 "
        )),
        "{texts:?}"
    );
    assert_eq!(v["pairs"].as_array().unwrap().len(), 2, "a <-> c only: {v}");

    // The root a on a network of its own, named by NCCL_SOCKET_IFNAME: the others
    // cannot reach it, and the finding names eth1 and why.
    private.connect(&mut hosts[0], &keys);
    let (a, b, c) = (&hosts[0], &hosts[1], &hosts[2]);
    let all = [a, b, c];
    write_cluster_file(
        project.root(),
        &keys,
        &all,
        &[(0, "NCCL_SOCKET_IFNAME: eth1")],
    );
    let (code, v) = rehearse(&["--within", "3"]);
    assert_eq!(code, Some(1), "{v}");
    assert_as_nccl_says(&v, a, &["NCCL_SOCKET_IFNAME=eth1"]);
    let root_ip = private.address_of(a, false);
    let texts = finding_texts(&v);
    for from in ["b", "c"] {
        assert!(
            texts.iter().any(|t| t.starts_with(&format!(
                "{from} cannot reach a's bootstrap address eth1 {root_ip}:"
            )) && t.contains("(IPv4)")
                && t.contains(&format!(
                    "a's NCCL chose eth1, on a network {from} is not on"
                ))),
            "{texts:?}"
        );
    }
    // The text form is the session docs/cluster.md shows.
    let text = fdl()
        .args(["cluster", "rehearse", "--within", "3"])
        .output()
        .unwrap();
    assert_eq!(text.status.code(), Some(1));
    docs_show(&text);
    let failed: Vec<&serde_json::Value> = v["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["result"]["state"] != "yes")
        .collect();
    assert_eq!(failed.len(), 2, "only the two connections to a fail: {v}");
    private.disconnect(&mut hosts[0], &keys);
    let (a, b, c) = (&hosts[0], &hosts[1], &hosts[2]);
    let all = [a, b, c];

    // The root on its loopback: every other host reaches only itself there.
    write_cluster_file(
        project.root(),
        &keys,
        &all,
        &[(0, "NCCL_SOCKET_IFNAME: lo")],
    );
    let (code, v) = rehearse(&["--within", "2"]);
    assert_eq!(code, Some(1), "{v}");
    assert_as_nccl_says(&v, a, &["NCCL_SOCKET_IFNAME=lo"]);
    let texts = finding_texts(&v);
    for from in ["b", "c"] {
        assert!(
            texts.iter().any(|t| t.starts_with(&format!(
                "{from} cannot reach a's bootstrap address lo 127.0.0.1:"
            )) && t.contains("a's NCCL chose the loopback interface lo")),
            "{texts:?}"
        );
    }

    // c forced to IPv6 on a network only it is on, the others IPv4: the root cannot
    // reach c's address, and the finding says the family.
    v6.connect(&mut hosts[2], &keys);
    let (a, b, c) = (&hosts[0], &hosts[1], &hosts[2]);
    let all = [a, b, c];
    write_cluster_file(
        project.root(),
        &keys,
        &all,
        &[(2, "NCCL_SOCKET_FAMILY: AF_INET6")],
    );
    let (code, v) = rehearse(&["--within", "3"]);
    assert_eq!(code, Some(1), "{v}");
    assert_as_nccl_says(&v, c, &["NCCL_SOCKET_FAMILY=AF_INET6"]);
    let c_ip = v6.address_of(c, true);
    let texts = finding_texts(&v);
    assert!(
        texts.iter().any(|t| t.starts_with(&format!(
            "a cannot reach c's bootstrap address eth1 [{c_ip}]:"
        )) && t.contains("(IPv6)")
            && t.contains("an address family mismatch: a has only IPv4 addresses")),
        "{texts:?}"
    );
    let c_to_a = v["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["from"] == "c")
        .unwrap();
    assert_eq!(c_to_a["result"]["state"], "yes", "c reaches a's IPv4: {v}");

    // b preloads an NCCL that is neither an fdl build nor its libtorch's: not run.
    write_cluster_file(
        project.root(),
        &keys,
        &all,
        &[(1, "LD_PRELOAD: /opt/other/libnccl.so.2")],
    );
    let (code, v) = rehearse(&[]);
    assert_eq!(code, Some(3), "refused is not judged: exit 3: {v}");
    assert_eq!(v["state"], "unknown");
    let outcome = &worker(&v, "b")["bootstrap"]["outcome"];
    assert_eq!(outcome["state"], "refused", "{v}");
    assert!(
        outcome["reason"]
            .as_str()
            .unwrap()
            .contains("its effective NCCL /opt/other/libnccl.so.2 (NCCL 2.21.5) is neither an fdl build of this project nor the libtorch's own NCCL"),
        "{v}"
    );
    assert!(worker(&v, "b")["bootstrap"]["library"].is_null());
}

/// Without Docker: the rehearsal's worker half on this machine, for the libtorch's own
/// NCCL, an fdl build (run by its recorded BLAKE3), and that build changed (refused).
#[test]
#[ignore = "needs the real NCCL of `source .ci/setup`: `cargo test -- --include-ignored`"]
fn a_build_runs_by_its_recorded_digest_and_a_changed_one_is_refused() {
    let nccl = oracle_input("FDL_TEST_NCCL_LIB");
    let parts = Parts::new(&nccl);
    let fx = BuildsFixture::new(ProjectFixture::empty());
    let root = fx.project.root();
    let lib = root.join(format!("libtorch/{VARIANT}/lib"));
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::copy(&parts.libtorch_cuda, lib.join("libtorch_cuda.so")).unwrap();
    let beside = root.join("libtorch/precompiled/nvidia/nccl/lib");
    std::fs::create_dir_all(&beside).unwrap();
    std::os::unix::fs::symlink(&nccl, beside.join("libnccl.so.2")).unwrap();
    let ask = |extra: &[&str]| {
        let out = fx
            .fdl()
            .args(["cluster", "bootstrap-self", "--json", "--arch", VARIANT])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        json_of(&out)
    };
    let v = ask(&["--env", "NCCL_SOCKET_IFNAME=lo"]);
    assert_eq!(v["library"]["trust"]["kind"], "libtorch", "{v}");
    assert_eq!(v["outcome"]["interface"], "lo", "{v}");
    assert!(
        v["outcome"]["address"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:"),
        "{v}"
    );
    assert!(
        v["nccl_lines"].as_array().unwrap().iter().any(|l| l
            .as_str()
            .unwrap()
            .contains("NCCL INFO Bootstrap: Using lo:127.0.0.1<0>")),
        "{v}"
    );

    // An fdl build holding the same real library, preloaded.
    let tree = fx.tree("real", (2, 27, 5), &[61]);
    let real = tree.join("lib/libnccl.so.2.27.5");
    std::fs::remove_file(&real).unwrap();
    std::fs::copy(&nccl, &real).unwrap();
    let name = fx.install(&tree, "v2.27.5-1", "6.1").unwrap();
    let preload = fx.builds().join(&name).join("lib/libnccl.so.2");
    let preload = preload.to_str().unwrap();
    let v = ask(&["--ld-preload", preload, "--env", "NCCL_SOCKET_IFNAME=lo"]);
    assert_eq!(v["library"]["trust"]["kind"], "build", "{v}");
    assert_eq!(v["library"]["trust"]["name"], name.as_str(), "{v}");
    assert_eq!(v["outcome"]["state"], "chosen", "{v}");

    // One byte changed after the build: never run.
    let installed = fx.builds().join(&name).join("lib/libnccl.so.2.27.5");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&installed).unwrap().permissions().mode();
    std::fs::set_permissions(&installed, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut bytes = std::fs::read(&installed).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&installed, bytes).unwrap();
    std::fs::set_permissions(&installed, std::fs::Permissions::from_mode(mode)).unwrap();
    let v = ask(&["--ld-preload", preload]);
    assert_eq!(v["outcome"]["state"], "refused", "{v}");
    let reason = v["outcome"]["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!(
            "is not the file build {name}'s manifest records (its BLAKE3 differs)"
        )),
        "{reason}"
    );
    assert!(v["nccl_lines"].as_array().unwrap().is_empty(), "{v}");
}

/// Without Docker: torch 1.13.1's own NCCL 2.14.3, compiled into (and exported from) its
/// `libtorch_cuda_cpp.so`, is rehearsed as the libtorch's own, and its id, which before
/// NCCL 2.16 is the root's `sockaddr` itself (no magic before it), gives the address
/// NCCL's own line says.
#[test]
#[ignore = "needs the real torch 1.13.1 of `source .ci/setup`: `cargo test -- --include-ignored`"]
fn a_static_nccl_before_2_16_is_read_as_its_release_writes_its_id() {
    let lib = oracle_input("FDL_TEST_TORCH113_LIB");
    let torch = lib.parent().unwrap();
    let p = ProjectFixture::empty();
    let cache = tempfile::tempdir().unwrap();
    let fdl = || {
        let mut c = fdl_in(p.root());
        c.env("XDG_CACHE_HOME", cache.path());
        c
    };
    let out = fdl()
        .args(["libtorch", "add", "pip", "--json"])
        .arg(torch)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = fdl()
        .args(["cluster", "bootstrap-self", "--json", "--arch", "pip"])
        .args(["--env", "NCCL_SOCKET_IFNAME=lo"])
        .output()
        .unwrap();
    let v = json_of(&out);
    let nccl = lib.join("libtorch_cuda_cpp.so");
    assert_eq!(v["library"]["file"], nccl.to_str().unwrap(), "{v}");
    assert_eq!(v["library"]["trust"]["kind"], "libtorch", "{v}");
    assert_eq!(v["library"]["version"], "2.14.3", "{v}");
    let work = tempfile::tempdir().unwrap();
    let oracle = bootstrap::compile_oracle(work.path());
    let (iface, addr) =
        bootstrap::oracle_here(&oracle, &nccl, &[("NCCL_SOCKET_IFNAME", "lo")]).unwrap();
    assert_eq!(v["outcome"]["state"], "chosen", "{v}");
    assert_eq!(v["outcome"]["interface"], iface.as_str(), "{v}");
    let got: std::net::SocketAddr = v["outcome"]["address"].as_str().unwrap().parse().unwrap();
    assert_eq!(got.ip().to_string(), addr, "{v}");
    assert_ne!(got.port(), 0, "{v}");
}

/// What the rehearsal's child would load beside the checked NCCL is checked as the NCCL
/// is: a dependency it finds through its own `$ORIGIN` that others may write is refused,
/// named, and nothing is run.
#[test]
fn a_dependency_others_may_write_is_refused_before_anything_loads() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let dep = dir.path().join("libfdltestdep.so");
    compile_shared("int fdl_test_dep(void) { return 1; }\n", &dep, &[]);
    let lib = dir.path().join("libnccl.so.2");
    compile_shared(
        &format!(
            "{}\nint fdl_test_dep(void);\nint fdl_test_uses(void) {{ return fdl_test_dep(); }}\n",
            nccl_like_source((2, 27, 5), "12.8")
        ),
        &lib,
        &[
            "-Wl,-soname,libnccl.so.2",
            "-Wl,--enable-new-dtags,-rpath,$ORIGIN",
            &format!("-L{}", dir.path().display()),
            "-lfdltestdep",
        ],
    );
    fdl::cluster::bootstrap::loads_checked(&lib).unwrap();
    std::fs::set_permissions(&dep, std::fs::Permissions::from_mode(0o666)).unwrap();
    let why = fdl::cluster::bootstrap::loads_checked(&lib).unwrap_err();
    assert!(
        why.contains("libfdltestdep.so, which is not safe to run")
            && why.contains("is writable by others (mode 666)"),
        "{why}"
    );
}

/// The child keeps every plugin out, a kind no release fdl knows included: what it ran
/// with, as a stand-in NCCL of an fdl build (installed through the real pipeline) says
/// it through its own INFO line.
#[test]
fn no_plugin_variable_reaches_the_child_whatever_its_kind() {
    let fx = BuildsFixture::new(ProjectFixture::empty());
    let tree = fx.tree("seen", (2, 27, 5), &[61]);
    let real = tree.join("lib/libnccl.so.2.27.5");
    std::fs::remove_file(&real).unwrap();
    compile_shared(
        &format!(
            r#"{}{}
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static const char *v(const char *k) {{ const char *s = getenv(k); return s ? s : "unset"; }}
int ncclGetUniqueId(unsigned char *id) {{
  printf("h:1:1 [0] NCCL INFO seen FOO=%s NET=%s IFNAME=%s\n", v("NCCL_FOO_PLUGIN"),
         v("NCCL_NET_PLUGIN"), v("NCCL_SOCKET_IFNAME"));
  fflush(stdout);
  memset(id, 0, 128);
  return 5;
}}
"#,
            nccl_like_source((2, 27, 5), "12.8"),
            fatbin_c_source(&[61], "fdl_test_fatbin")
        ),
        &real,
        &["-Wl,-soname,libnccl.so.2"],
    );
    let name = fx.install(&tree, "v2.27.5-1", "6.1").unwrap();
    let lib = fx.project.root().join(format!("libtorch/{VARIANT}/lib"));
    std::fs::create_dir_all(&lib).unwrap();
    compile_shared(
        "int ncclGetUniqueId(void *);\nint fdl_t(void *id) { return ncclGetUniqueId(id); }\n",
        &lib.join("libtorch_cuda.so"),
        &[&format!(
            "{}",
            fx.builds().join(&name).join("lib/libnccl.so.2").display()
        )],
    );
    let preload = fx.builds().join(&name).join("lib/libnccl.so.2");
    let out = fx
        .fdl()
        .env("NCCL_FOO_PLUGIN", "/tmp/inherited.so")
        .args(["cluster", "bootstrap-self", "--json", "--arch", VARIANT])
        .args(["--ld-preload", preload.to_str().unwrap()])
        .args([
            "--env",
            "NCCL_NET_PLUGIN=/tmp/net.so",
            "--env",
            "NCCL_SOCKET_IFNAME=eth9",
        ])
        .args(["--env", "NCCL_FOO_PLUGIN=/tmp/block.so"])
        .output()
        .unwrap();
    let v = json_of(&out);
    assert_eq!(v["library"]["trust"]["kind"], "build", "{v}");
    assert_eq!(v["outcome"]["state"], "nccl_error", "{v}");
    let lines: Vec<&str> = v["nccl_lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(
        lines,
        ["h:1:1 [0] NCCL INFO seen FOO=unset NET=none IFNAME=eth9"],
        "{v}"
    );
}
