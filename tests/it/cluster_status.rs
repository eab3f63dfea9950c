//! `fdl cluster` against real hosts: containers on this machine's Docker engine, each
//! with its own filesystem and a real OpenSSH server published on 127.0.0.1
//! (tests/cluster_fixture), reached through the `ssh:` settings of a generated
//! fdl.cluster.yml. None has fdl: the controller ships its own binary, checked by
//! sha256, and runs it there. Each host has a stand-in `nvidia-smi` (the real CSV and
//! banner of different GPUs) and its own libtorch variant whose `libtorch_cuda.so` is a
//! real ELF made here, NCCL compiled in. Covered: status (skew, coverage, a host down, a
//! changed host key), plan, build, ship (and its faults: a host killed, hung, out of
//! disk, read-only; reruns that finish), env, and status green.
//!
//! `#[ignore]`d: `.ci/run` runs them with `--include-ignored`; a missing engine fails them.

use crate::cluster_fixture;
use crate::common;
use crate::native_fixture;
use cluster_fixture::{Host, Keys};
use common::*;
use std::path::Path;
use std::process::Output;

/// `cargo test` runs a file's tests as threads: they share the engine's port space and
/// CPU, and each starts three hosts.
static HOSTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

struct Rig {
    keys: Keys,
    hosts: Vec<(Host, String)>,
    project: ProjectFixture,
    cache: tempfile::TempDir,
    work: tempfile::TempDir,
}

/// A libtorch_cuda.so with NCCL `version` compiled in and SASS for `archs`.
fn libtorch_cuda(dir: &Path, version: (u32, u32, u32), archs: &[u32]) -> std::path::PathBuf {
    let out = dir.join(format!(
        "libtorch_cuda-{}.{}.{}-{}.so",
        version.0,
        version.1,
        version.2,
        archs
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join("-")
    ));
    // NCCL compiled in with default visibility and called through the PLT, as a
    // preload can replace it (tests/it/interpose.rs covers the other linkages).
    let src = format!(
        "{}\nint fdl_test_torch_calls_nccl(void) {{ int v = 0; ncclGetVersion(&v); return v; }}\n{}",
        nccl_like_source(version, "12.8"),
        fatbin_c_source(archs, "fdl_test_torch_fatbin")
    );
    compile_shared(&src, &out, &[]);
    out
}

/// A host's label, checkout path, GPUs (name, compute capability, MiB) and libtorch.
type HostSpec<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str, u32)>, &'a Path);

impl Rig {
    /// pascal: GTX 1060 (sm_61), NCCL 2.27.5 with sm_61 + sm_86 code;
    /// blackwell: RTX 5060 Ti (sm_120), the same libtorch (no sm_120 code);
    /// duo: two GPUs (sm_86, sm_86), a libtorch whose NCCL is 2.27.3.
    /// The paths hold a space and a quote, as real ones may.
    fn new() -> Rig {
        let keys = Keys::new();
        let work = tempfile::tempdir().unwrap();
        let lt_a = libtorch_cuda(work.path(), (2, 27, 5), &[61, 86]);
        let lt_b = libtorch_cuda(work.path(), (2, 27, 3), &[61, 86]);
        let specs: [HostSpec; 3] = [
            (
                "pascal",
                "/opt/flodl",
                vec![("NVIDIA GeForce GTX 1060 6GB", "6.1", 6144)],
                &lt_a,
            ),
            (
                "blackwell",
                "/srv/flo dl",
                vec![("NVIDIA GeForce RTX 5060 Ti", "12.0", 16311)],
                &lt_a,
            ),
            (
                "duo",
                "/home/it's here",
                vec![
                    ("NVIDIA GeForce RTX 3090", "8.6", 24576),
                    ("NVIDIA GeForce RTX 3090", "8.6", 24576),
                ],
                &lt_b,
            ),
        ];
        let mut hosts = Vec::new();
        for (label, path, gpus, lib) in specs {
            let host = Host::start(label, &keys);
            host.fake_nvidia_smi(&gpus, "570.133.07", "12.8");
            if label == "duo" {
                // An fdl of another report schema on PATH: not used, the controller's is.
                host.write(
                    "/usr/local/bin/fdl",
                    "#!/bin/sh\necho '{\"schema\": 99}'\n",
                    0o755,
                );
            }
            host.put(
                lib,
                &format!("{path}/libtorch/precompiled/cu128/lib/libtorch_cuda.so"),
            );
            hosts.push((host, path.to_string()));
        }
        let rig = Rig {
            keys,
            hosts,
            project: ProjectFixture::empty(),
            cache: tempfile::tempdir().unwrap(),
            work,
        };
        rig.write_cluster_file(&[]);
        rig
    }

    /// fdl.cluster.yml for the rig; `env` adds an `env:` block per worker (by index).
    fn write_cluster_file(&self, env: &[(usize, String)]) {
        let hosts: Vec<(&Host, &str)> = self.hosts.iter().map(|(h, p)| (h, p.as_str())).collect();
        write_cluster_file(self.project.root(), &self.keys, &hosts, env);
    }

    /// Gives blackwell a libtorch with sm_120 kernels (its NCCL, compiled in, still
    /// 2.27.5), as the coverage verdict asks.
    fn torch_for_blackwell(&self) {
        let lt = libtorch_cuda(self.work.path(), (2, 27, 5), &[61, 86, 120]);
        let (blackwell, path) = &self.hosts[1];
        blackwell.put(
            &lt,
            &format!("{path}/libtorch/precompiled/cu128/lib/libtorch_cuda.so"),
        );
    }

    fn fdl(&self, args: &[&str]) -> Output {
        let mut cmd = fdl_in(self.project.root());
        cmd.env("XDG_CACHE_HOME", self.cache.path());
        cmd.args(args).output().unwrap()
    }
}

/// Writes `root/fdl.cluster.yml` naming `hosts` (each with its checkout path) as
/// workers, reached through their published ports; `env` adds an `env:` block per
/// worker (by index).
fn write_cluster_file(root: &Path, keys: &Keys, hosts: &[(&Host, &str)], env: &[(usize, String)]) {
    let mut y = String::from(
        "# generated by the test; fdl must never rewrite it\ncluster:\n  controller:\n    host: 127.0.0.1\n    path: /controller\n  workers:\n",
    );
    for (i, (host, path)) in hosts.iter().enumerate() {
        y.push_str(&format!(
            "    - host: {}\n      path: {}\n      arch: precompiled/cu128\n      local_devices: all\n",
            host.label,
            serde_json::to_string(path).unwrap()
        ));
        y.push_str(&host.ssh_yaml(keys, 6));
        for (_, block) in env.iter().filter(|(w, _)| *w == i) {
            for line in block.lines() {
                y.push_str(&format!("      {line}\n"));
            }
        }
    }
    std::fs::write(root.join("fdl.cluster.yml"), y).unwrap();
}

/// `fdl cluster status --json` in `root` with its own cache: the exit code and answer.
fn status_json(root: &Path, cache: &Path) -> (Option<i32>, serde_json::Value) {
    let out = fdl_in(root)
        .env("XDG_CACHE_HOME", cache)
        .args(["cluster", "status", "--json"])
        .output()
        .unwrap();
    (out.status.code(), json_of(&out))
}

/// The top-level keys of a JSON answer, as README.md's Cluster section lists them.
fn assert_keys(v: &serde_json::Value, keys: &[&str]) {
    let got: std::collections::BTreeSet<&str> =
        v.as_object().unwrap().keys().map(String::as_str).collect();
    let want: std::collections::BTreeSet<&str> = keys.iter().copied().collect();
    assert_eq!(got, want, "{v}");
}

fn verdict<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == name)
        .unwrap_or_else(|| panic!("no verdict {name} in {v}"))
}

#[test]
#[ignore = "drives the real Docker engine and OpenSSH: `cargo test -- --include-ignored`"]
fn status_reports_the_patch_level_skew_and_the_uncovered_gpu() {
    let _hosts = HOSTS.lock().unwrap_or_else(|e| e.into_inner());
    let rig = Rig::new();
    let file_before = std::fs::read(rig.project.root().join("fdl.cluster.yml")).unwrap();

    let out = rig.fdl(&["cluster", "status", "--json"]);
    assert_eq!(out.status.code(), Some(1), "red verdicts exit 1");
    let v = json_of(&out);
    assert_keys(
        &v,
        &["schema", "files", "workers", "verdicts", "ok", "state"],
    );
    assert_eq!(v["state"], "red");
    let workers = v["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 3);
    for w in workers {
        assert!(w["error"].is_null(), "{w}");
        // Two hosts had no fdl and one an fdl of another schema: the controller's went to
        // all three.
        assert_eq!(w["shipped_fdl"], true, "{w}");
    }
    let report = |i: usize| &workers[i]["report"];
    assert_eq!(report(0)["gpus"]["known"][0]["arch"], "sm_61");
    assert_eq!(report(0)["gpus"]["known"][0]["compute_cap"], "6.1");
    assert_eq!(report(2)["gpus"]["known"].as_array().unwrap().len(), 2);
    assert_eq!(report(0)["driver"]["known"]["version"], "570.133.07");
    assert_eq!(report(0)["effective"]["known"]["version"], "2.27.5");
    assert_eq!(report(2)["effective"]["known"]["version"], "2.27.3");
    assert_eq!(
        report(1)["libtorch"]["known"]["variant"],
        "precompiled/cu128"
    );

    assert_eq!(verdict(&v, "reach")["ok"], true);
    let skew = verdict(&v, "skew");
    assert_eq!(skew["ok"], false);
    let detail = skew["detail"].as_str().unwrap();
    assert!(
        detail.contains("pascal 2.27.5") && detail.contains("duo 2.27.3"),
        "{detail}"
    );
    let coverage = verdict(&v, "coverage");
    assert_eq!(coverage["ok"], false);
    let detail = coverage["detail"].as_str().unwrap();
    // Its NCCL is compiled into its libtorch: neither has sm_120 code, and both are named.
    assert!(
        detail.starts_with("the effective NCCL has no code for blackwell GPU 0 (sm_120); blackwell GPU 0 (sm_120) has no kernels in its libtorch precompiled/cu128"),
        "{detail}"
    );
    assert_eq!(verdict(&v, "driver")["ok"], true);
    // Each worker's own loader was asked, by default, about its own libtorch, and agrees
    // with the model there: the calls, through the PLT, bind to the libtorch itself.
    for w in workers {
        let wit = &w["report"]["witness"];
        assert_eq!(wit["verdict"], "agree", "{w}");
        assert!(
            wit["loader"].as_str().unwrap().contains("libtorch_cuda.so"),
            "{wit}"
        );
    }
    // --no-witness: not asked, and the verdicts are the same.
    let quick = json_of(&rig.fdl(&["cluster", "status", "--json", "--no-witness"]));
    for w in quick["workers"].as_array().unwrap() {
        assert!(w["report"]["witness"].is_null(), "{w}");
    }
    assert_eq!(quick["verdicts"], v["verdicts"]);

    // The text form says the same, and a second run reuses the shipped fdl.
    let out = rig.fdl(&["cluster", "status"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("RED") && text.contains("skew"), "{text}");
    assert!(text.contains("GPU 0: NO CODE for sm_120"), "{text}");
    assert!(text.contains("witness   its loader agrees"), "{text}");
    assert!(!text.contains("shipped from the controller"), "{text}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the cluster is not ready: skew, coverage"),
        "{err}"
    );

    // fdl never writes the user's cluster file.
    assert_eq!(
        std::fs::read(rig.project.root().join("fdl.cluster.yml")).unwrap(),
        file_before
    );
}

#[test]
#[ignore = "drives the real Docker engine and OpenSSH: `cargo test -- --include-ignored`"]
fn a_host_that_is_down_or_changed_its_key_is_named_and_the_others_still_answer() {
    let _hosts = HOSTS.lock().unwrap_or_else(|e| e.into_inner());
    let rig = Rig::new();
    rig.hosts[1].0.kill();
    // The third host's key changes: its known_hosts line now belongs to another key.
    rig.hosts[2]
        .0
        .exec("rm -f /etc/ssh/ssh_host_* && ssh-keygen -A >/dev/null && kill -HUP \"$(cat /run/sshd.pid)\"");
    let out = rig.fdl(&["cluster", "status", "--json", "--timeout", "10"]);
    assert_eq!(out.status.code(), Some(1));
    let v = json_of(&out);
    let w = v["workers"].as_array().unwrap();
    assert!(w[0]["error"].is_null(), "{}", w[0]);
    let down = w[1]["error"].as_str().unwrap();
    assert!(down.contains("unreachable over SSH"), "{down}");
    let changed = w[2]["error"].as_str().unwrap();
    assert!(changed.contains("host key has CHANGED"), "{changed}");
    let reach = verdict(&v, "reach");
    assert_eq!(reach["ok"], false);
    assert!(reach["detail"].as_str().unwrap().contains("blackwell:"));
    // The facts of the two silent workers are missing: no verdict that needs them is ok.
    for name in ["skew", "coverage", "driver", "symbols", "bridge", "plugins"] {
        let verdict = verdict(&v, name);
        assert_eq!(verdict["state"], "unknown", "{name}: {verdict}");
        assert_eq!(verdict["ok"], false, "{name}");
        assert!(
            verdict["detail"]
                .as_str()
                .unwrap()
                .contains("did not answer"),
            "{name}: {verdict}"
        );
    }
}

#[test]
#[ignore = "drives the real Docker engine and OpenSSH: `cargo test -- --include-ignored`"]
fn env_blocks_use_each_workers_own_path_and_status_then_loads_that_library() {
    let _hosts = HOSTS.lock().unwrap_or_else(|e| e.into_inner());
    let rig = Rig::new();
    rig.torch_for_blackwell();
    // A build of this project, installed through the real pipeline.
    let tree = rig.work.path().join("nccl-tree");
    write_nccl_tree(&tree, (2, 27, 5), &[61, 86, 120]);
    let name = install_build(
        rig.project.root(),
        rig.cache.path(),
        &tree,
        "v2.27.5-1",
        "6.1;8.6;12.0",
    )
    .unwrap();
    assert_eq!(name, "v2.27.5-sm61-sm86-sm120");
    let name = name.as_str();

    let out = rig.fdl(&["cluster", "env", name, "--format", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json_of(&out);
    assert_keys(&v, &["schema", "build", "why", "choice", "workers"]);
    let preload = |i: usize| {
        v["workers"][i]["env"]["LD_PRELOAD"]
            .as_str()
            .unwrap()
            .to_string()
    };
    // A path without spaces or colons is its own LD_PRELOAD value. '/srv/flo dl' and
    // "/home/it's here" would be split by glibc at the space, so those workers name the
    // build through a link each made in its own cache, asked over SSH.
    let raw = |i: usize| {
        format!(
            "{}/libtorch/nccl/builds/{name}/lib/libnccl.so.2",
            rig.hosts[i].1
        )
    };
    assert_eq!(preload(0), raw(0));
    for i in [1, 2] {
        let p = preload(i);
        assert!(!p.contains([' ', ':']), "{p}");
        assert!(p.contains("/fdl/preload/"), "{p}");
        let target = rig.hosts[i].0.exec(&format!("readlink '{p}'"));
        assert_eq!(target.trim(), raw(i), "worker {i}'s link");
    }
    let text = String::from_utf8_lossy(&rig.fdl(&["cluster", "env", name]).stdout).into_owned();
    assert!(
        text.contains(&format!("LD_PRELOAD: \"{}\"", preload(2))),
        "{text}"
    );
    assert!(!text.contains("it's here"), "{text}");

    // Put the build where each block says (as a copy would), paste the blocks, and the
    // workers now load it: one version, every GPU covered.
    let build_dir = rig.project.root().join("libtorch/nccl/builds").join(name);
    for (host, path) in &rig.hosts {
        for file in ["lib/libnccl.so.2.27.5", "include/nccl.h"] {
            host.put(
                &build_dir.join(file),
                &format!("{path}/libtorch/nccl/builds/{name}/{file}"),
            );
        }
        host.exec(&format!(
            "cd '{}/libtorch/nccl/builds/{name}/lib' && ln -sf libnccl.so.2.27.5 libnccl.so.2",
            path.replace('\'', "'\\''")
        ));
    }
    let blocks: Vec<(usize, String)> = (0..3)
        .map(|i| {
            (
                i,
                format!(
                    "env:\n  LD_PRELOAD: {}",
                    serde_json::to_string(&preload(i)).unwrap()
                ),
            )
        })
        .collect();
    rig.write_cluster_file(&blocks);
    let out = rig.fdl(&["cluster", "status", "--json"]);
    let v = json_of(&out);
    for name in ["skew", "coverage", "driver", "symbols"] {
        assert_eq!(verdict(&v, name)["ok"], true, "{name}: {v}");
    }
    let eff = &v["workers"][2]["report"]["effective"]["known"];
    assert_eq!(eff["linkage"], "preload", "{v}");
    assert_eq!(eff["version"], "2.27.5");
    // Its libtorch calls NCCL through the PLT: the preload takes effect.
    assert_eq!(verdict(&v, "bridge")["ok"], true, "{v}");
    assert_eq!(v["ok"], true, "{v}");
    assert!(out.status.success());
}

/// The README's session: status red, then plan, build, ship, env pasted, status green;
/// a second ship changes nothing.
#[test]
#[ignore = "drives the real Docker engine and OpenSSH: `cargo test -- --include-ignored`"]
fn plan_build_ship_then_status_is_green() {
    let _hosts = HOSTS.lock().unwrap_or_else(|e| e.into_inner());
    let rig = Rig::new();
    let toolkit = rig.work.path().join("cuda");
    native_fixture::fake_cuda_home(&toolkit, "12.8", "V12.8.93", &[61, 75, 86, 120], "lib64");
    let tree = rig.work.path().join("nccl-2.27.5");
    native_fixture::standin_tree(&tree, (2, 27, 5));
    let (toolkit, tree) = (toolkit.display().to_string(), tree.display().to_string());
    let backend = [
        "--backend",
        "native",
        "--cuda-home",
        &toolkit,
        "--source",
        &tree,
    ];

    let out = rig.fdl(&["cluster", "status"]);
    assert_eq!(out.status.code(), Some(1));
    eprintln!(
        "$ fdl cluster status\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // As the coverage verdict says, no NCCL makes blackwell's libtorch run on its sm_120.
    rig.torch_for_blackwell();

    let mut args = vec!["cluster", "plan", "--json"];
    args.extend(backend);
    let out = rig.fdl(&args);
    let v = json_of(&out);
    let plan = &v["plan"];
    assert_eq!(plan["tag"], "v2.27.5-1", "{v}");
    assert_eq!(plan["tag_origin"]["from"], "cluster", "{v}");
    assert_eq!(
        plan["archs"],
        serde_json::json!(["sm_61", "sm_86", "sm_120"]),
        "{v}"
    );
    assert_eq!(plan["arch_origin"]["from"], "cluster", "{v}");
    assert_eq!(plan["cuda"], "12.8", "{v}");
    assert!(
        plan["warnings"][0]
            .as_str()
            .unwrap()
            .starts_with("duo (2.27.3) bundle an older NCCL than 2.27.5"),
        "{v}"
    );
    let text = String::from_utf8_lossy(
        &rig.fdl(&[&["cluster", "plan"][..], &backend].concat())
            .stdout,
    )
    .into_owned();
    eprintln!("$ fdl cluster plan --backend native ...\n{text}");
    assert!(
        text.contains("the highest libtorch NCCL of the workers: pascal 2.27.5"),
        "{text}"
    );

    // Build and ship as a person runs them (the session the README shows).
    let mut args = vec!["cluster", "build", "--quiet"];
    args.extend(backend);
    let out = rig.fdl(&args);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("$ fdl cluster build --quiet ...\n{text}");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let name = "v2.27.5-sm61-sm86-sm120";
    assert!(
        text.contains("Built NCCL 2.27.5: ") && text.contains(name),
        "{text}"
    );

    let out = rig.fdl(&["cluster", "ship"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("$ fdl cluster ship\n{text}");
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        text.matches("installed (copied with rsync, verified there)")
            .count(),
        3,
        "{text}"
    );
    // Installed on each host, verified, at its own path, with nothing left beside it.
    for (host, path) in &rig.hosts {
        let listing = host.exec(&format!(
            "ls -A '{}/libtorch/nccl/builds'",
            path.replace('\'', "'\\''")
        ));
        assert_eq!(listing.trim(), name, "{}", host.label);
        let pc = host.exec(&format!(
            "cat '{}/libtorch/nccl/builds/{name}/lib/pkgconfig/nccl.pc'",
            path.replace('\'', "'\\''")
        ));
        assert!(
            pc.contains(&format!("prefix={path}/libtorch/nccl/builds/{name}")),
            "{pc}"
        );
    }

    eprintln!(
        "$ fdl cluster env\n{}",
        String::from_utf8_lossy(&rig.fdl(&["cluster", "env"]).stdout)
    );
    let v = json_of(&rig.fdl(&["cluster", "env", "--format", "json"]));
    let blocks: Vec<(usize, String)> = (0..3)
        .map(|i| {
            let p = v["workers"][i]["env"]["LD_PRELOAD"].as_str().unwrap();
            (
                i,
                format!("env:\n  LD_PRELOAD: {}", serde_json::to_string(p).unwrap()),
            )
        })
        .collect();
    rig.write_cluster_file(&blocks);
    let out = rig.fdl(&["cluster", "status"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("$ fdl cluster status\n{text}");
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("RED"), "{text}");

    let v = json_of(&rig.fdl(&["cluster", "ship", "--json"]));
    for w in v["workers"].as_array().unwrap() {
        assert_eq!(w["result"], "already_there", "{w}");
    }
}

/// A build of a fresh project for the ship tests: (project, its cache, build name).
fn shippable_build(work: &Path) -> (ProjectFixture, tempfile::TempDir, String) {
    shippable_build_of(work, (2, 27, 5))
}

/// [`shippable_build`] of NCCL `version`, laid out as that release installs itself.
fn shippable_build_of(
    work: &Path,
    version: (u32, u32, u32),
) -> (ProjectFixture, tempfile::TempDir, String) {
    let project = ProjectFixture::empty();
    let cache = tempfile::tempdir().unwrap();
    let tree = work.join("nccl-tree");
    write_nccl_tree(&tree, version, &[61, 86, 120]);
    let (x, y, z) = version;
    let name = install_build(
        project.root(),
        cache.path(),
        &tree,
        &format!("v{x}.{y}.{z}-1"),
        "6.1;8.6;12.0",
    )
    .unwrap();
    (project, cache, name)
}

/// NCCL 2.28 and later install `include/nccl_device.h` beside `include/nccl_device/`:
/// such a build verifies here, each worker's own verify of its copy passes (over rsync
/// and over a tar stream), and the next ship finds it there, unchanged.
#[test]
#[ignore = "drives the real Docker engine and OpenSSH: `cargo test -- --include-ignored`"]
fn a_228_header_layout_verifies_here_and_on_every_worker() {
    let _hosts = HOSTS.lock().unwrap_or_else(|e| e.into_inner());
    let work = tempfile::tempdir().unwrap();
    let (project, cache, name) = shippable_build_of(work.path(), (2, 30, 7));
    let build = project.root().join("libtorch/nccl/builds").join(&name);
    assert!(build.join("include/nccl_device.h").is_file());
    assert!(build.join("include/nccl_device/gin/proxy").is_dir());
    let out = fdl_at(project.root(), cache.path(), &["nccl", "verify", &name]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let keys = Keys::new();
    let synced = Host::start("synced", &keys);
    synced.exec("mkdir -p /opt/flodl");
    let bare = Host::start("bare", &keys);
    bare.exec("mkdir -p /opt/flodl && rm -f /usr/bin/rsync");
    write_cluster_file(
        project.root(),
        &keys,
        &[(&synced, "/opt/flodl"), (&bare, "/opt/flodl")],
        &[],
    );
    let ship = || {
        let out = fdl_at(
            project.root(),
            cache.path(),
            &["cluster", "ship", name.as_str(), "--json"],
        );
        (out.status.success(), json_of(&out))
    };
    let (ok, v) = ship();
    assert!(ok, "{v}");
    for (host, copy) in [("synced", "rsync"), ("bare", "tar over ssh")] {
        let r = result_of(&v, host);
        assert_eq!(r["result"], "installed", "{r}");
        assert_eq!(r["copy"], copy, "{r}");
    }
    for host in [&synced, &bare] {
        let there = host.exec(&format!(
            "cd /opt/flodl/libtorch/nccl/builds/{name}/include && ls -d nccl_device.h nccl_device/gin/proxy"
        ));
        assert_eq!(there.split_whitespace().count(), 2, "{there}");
    }
    let (ok, v) = ship();
    assert!(ok, "{v}");
    assert_eq!(result_of(&v, "synced")["result"], "already_there", "{v}");
    assert_eq!(result_of(&v, "bare")["result"], "already_there", "{v}");
}

fn fdl_at(root: &Path, cache: &Path, args: &[&str]) -> Output {
    let mut cmd = fdl_in(root);
    cmd.env("XDG_CACHE_HOME", cache);
    cmd.args(args).output().unwrap()
}

fn result_of<'a>(v: &'a serde_json::Value, host: &str) -> &'a serde_json::Value {
    v["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["host"] == host)
        .unwrap_or_else(|| panic!("no result for {host} in {v}"))
}

/// What is in a worker's builds directory (`ls -A`), or `-` when it does not exist.
fn builds_listing(host: &Host, path: &str) -> String {
    host.exec(&format!(
        "cd {}/libtorch/nccl/builds 2>/dev/null && ls -A || echo -",
        cluster_fixture::sh_quote(path)
    ))
    .trim()
    .to_string()
}

/// Six workers, five faults: one killed before the ship, one killed during its copy,
/// one that hangs (paused), one whose disk fills during the copy (a small tmpfs at its
/// path), one whose path cannot be written. The healthy one is installed, every other one fails with its reason and
/// holds no partial build, and after each fault is undone a rerun finishes the job.
#[test]
#[ignore = "drives the real Docker engine and OpenSSH: `cargo test -- --include-ignored`"]
fn ship_faults_leave_nothing_half_installed_and_a_rerun_finishes() {
    let _hosts = HOSTS.lock().unwrap_or_else(|e| e.into_inner());
    let work = tempfile::tempdir().unwrap();
    let (project, cache, name) = shippable_build(work.path());
    let build_bytes = {
        let out = std::process::Command::new("du")
            .args(["-sk"])
            .arg(project.root().join("libtorch/nccl/builds").join(&name))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    };
    // Room for the fdl binary's cache elsewhere, but not for the build.
    let tmpfs = format!("/data:size={}k,exec", (build_bytes / 2 / 1024).max(8));
    let ro = work.path().join("ro");
    std::fs::create_dir_all(ro.join("proj")).unwrap();
    let ro_mount = format!("{}:/ro:ro", ro.display());
    let keys = Keys::new();
    let steady = Host::start("steady", &keys);
    let hung = Host::start("hung", &keys);
    let full = Host::start_with(
        "full",
        &keys,
        &["--tmpfs", &tmpfs, "--cap-add", "SYS_ADMIN"],
    );
    let readonly = Host::start_with("readonly", &keys, &["-v", &ro_mount]);
    let mut gone = Host::start("gone", &keys);
    let mut dies = Host::start("dies", &keys);
    for h in [&steady, &hung, &gone, &dies] {
        h.exec("mkdir -p /opt/flodl");
    }
    full.exec("mkdir -p /data/proj");
    // A slow link to `dies`: its rsync says when the copy starts, then waits, so the
    // host can be killed while the copy is under way.
    dies.exec(
        "mv /usr/bin/rsync /usr/bin/rsync.real && \
         printf '#!/bin/sh\\ntouch /tmp/copy-started\\nsleep 4\\nexec /usr/bin/rsync.real \"$@\"\\n' >/usr/bin/rsync && \
         chmod 755 /usr/bin/rsync",
    );
    let paths = [
        "/opt/flodl",
        "/opt/flodl",
        "/data/proj",
        "/ro/proj",
        "/opt/flodl",
        "/opt/flodl",
    ];
    let write = |gone: &Host, dies: &Host| {
        let hosts = [&steady, &hung, &full, &readonly, gone, dies];
        let list: Vec<(&Host, &str)> = hosts.iter().copied().zip(paths).collect();
        write_cluster_file(project.root(), &keys, &list, &[]);
    };
    write(&gone, &dies);
    gone.kill();
    hung.pause();

    let started = std::time::Instant::now();
    let out = std::thread::scope(|s| {
        let ship = s.spawn(|| {
            fdl_at(
                project.root(),
                cache.path(),
                &["cluster", "ship", &name, "--json", "--timeout", "5"],
            )
        });
        // Down during the ship: killed once its copy has started.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !std::process::Command::new("docker")
            .args(["exec", &dies.name, "test", "-e", "/tmp/copy-started"])
            .status()
            .unwrap()
            .success()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the copy to dies never started"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        dies.kill();
        ship.join().unwrap()
    });
    let took = started.elapsed();
    let v = json_of(&out);
    assert_eq!(out.status.code(), Some(1), "{v}");
    assert_eq!(result_of(&v, "steady")["result"], "installed", "{v}");
    let why = |host: &str| {
        let r = result_of(&v, host);
        assert_eq!(r["result"], "failed", "{r}");
        r["why"].as_str().unwrap().to_string()
    };
    let hung_why = why("hung");
    assert!(
        hung_why.contains("no answer") || hung_why.contains("timed out"),
        "{hung_why}"
    );
    assert!(
        why("full").contains("No space left on device"),
        "{}",
        why("full")
    );
    let ro_why = why("readonly");
    assert!(
        ro_why.contains("Read-only file system") && ro_why.contains("writable"),
        "{ro_why}"
    );
    assert!(
        why("gone").contains("unreachable over SSH"),
        "{}",
        why("gone")
    );
    // The per-host timeout, not the hung host, bounds the run.
    assert!(took < std::time::Duration::from_secs(90), "{took:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the build did not reach hung, full, readonly, gone, dies"),
        "{err}"
    );
    let dies_why = why("dies");
    assert!(
        dies_why.contains("copy failed") || dies_why.contains("unreachable"),
        "{dies_why}"
    );
    // Nothing half-installed: no build directory where the copy failed.
    assert_eq!(builds_listing(&steady, "/opt/flodl"), name);
    let on_full = builds_listing(&full, "/data/proj");
    assert!(!on_full.lines().any(|l| l == name), "{on_full}");
    assert_eq!(std::fs::read_dir(ro.join("proj")).unwrap().count(), 0);

    // Undo the faults (the read-only path stays read-only) and ship again.
    hung.unpause();
    full.exec("mount -o remount,size=64m /data");
    gone.restart(&keys);
    dies.restart(&keys);
    // What the killed copy left: at most the resumable .incoming, never the build.
    let on_dies = builds_listing(&dies, "/opt/flodl");
    assert!(!on_dies.lines().any(|l| l == name), "{on_dies}");
    write(&gone, &dies);
    let out = fdl_at(
        project.root(),
        cache.path(),
        &[
            "cluster",
            "ship",
            &name,
            "--json",
            "--workers",
            "steady,hung,full,gone,dies",
        ],
    );
    let v = json_of(&out);
    assert!(out.status.success(), "{v}");
    assert_eq!(result_of(&v, "steady")["result"], "already_there", "{v}");
    for host in ["hung", "full", "gone", "dies"] {
        assert_eq!(result_of(&v, host)["result"], "installed", "{v}");
    }
    for (h, p) in [
        (&hung, "/opt/flodl"),
        (&full, "/data/proj"),
        (&gone, "/opt/flodl"),
        (&dies, "/opt/flodl"),
    ] {
        assert_eq!(builds_listing(h, p), name, "{}", h.label);
    }
}

/// The same bytes are a no-op, even where the worker's path is the controller's own
/// directory; different bytes are refused unless --force; --dry-run changes nothing.
#[test]
#[ignore = "drives the real Docker engine and OpenSSH: `cargo test -- --include-ignored`"]
fn ship_skips_what_is_there_and_refuses_a_different_build_without_force() {
    let _hosts = HOSTS.lock().unwrap_or_else(|e| e.into_inner());
    let work = tempfile::tempdir().unwrap();
    let (project, cache, name) = shippable_build(work.path());
    let keys = Keys::new();
    let shared_mount = format!("{}:/shared", project.root().display());
    let shared = Host::start_with("shared", &keys, &["-v", &shared_mount]);
    let other = Host::start("other", &keys);
    other.exec("mkdir -p /opt/flodl");
    // No rsync on this one: the copy falls back to a tar stream over ssh.
    let bare = Host::start("bare", &keys);
    bare.exec("mkdir -p /opt/flodl && rm -f /usr/bin/rsync");
    write_cluster_file(
        project.root(),
        &keys,
        &[
            (&shared, "/shared"),
            (&other, "/opt/flodl"),
            (&bare, "/opt/flodl"),
        ],
        &[],
    );
    let ship = |extra: &[&str]| {
        let mut args = vec!["cluster", "ship", name.as_str(), "--json"];
        args.extend_from_slice(extra);
        let out = fdl_at(project.root(), cache.path(), &args);
        (out.status.success(), json_of(&out))
    };
    let before = snapshot(project.root());
    let (ok, v) = ship(&["--dry-run"]);
    assert!(ok, "{v}");
    assert_keys(
        &v,
        &[
            "schema", "build", "choice", "digest", "dry_run", "workers", "ok",
        ],
    );
    assert_eq!(result_of(&v, "shared")["result"], "already_there", "{v}");
    assert_eq!(result_of(&v, "other")["result"], "would_copy", "{v}");
    assert_eq!(builds_listing(&other, "/opt/flodl"), "-");

    let (ok, v) = ship(&[]);
    assert!(ok, "{v}");
    assert_eq!(result_of(&v, "shared")["result"], "already_there", "{v}");
    assert_eq!(result_of(&v, "other")["result"], "installed", "{v}");
    assert_eq!(result_of(&v, "other")["copy"], "rsync", "{v}");
    assert_eq!(result_of(&v, "bare")["result"], "installed", "{v}");
    assert_eq!(result_of(&v, "bare")["copy"], "tar over ssh", "{v}");
    // The library's link chain arrived as links (the worker's verify checked it too).
    let chain = bare.exec(&format!(
        "readlink /opt/flodl/libtorch/nccl/builds/{name}/lib/libnccl.so.2"
    ));
    assert_eq!(chain.trim(), "libnccl.so.2.27.5");
    // The controller's own build was never touched through the shared path.
    assert_eq!(snapshot(project.root()), before);

    // Someone changed the build on the worker: refused, then replaced with --force.
    other.exec(&format!(
        "echo changed >> /opt/flodl/libtorch/nccl/builds/{name}/build.log"
    ));
    let (ok, v) = ship(&[]);
    assert!(!ok);
    let r = result_of(&v, "other");
    assert_eq!(r["result"], "refused", "{r}");
    assert!(r["why"].as_str().unwrap().contains("--force"), "{r}");
    let (ok, v) = ship(&["--force"]);
    assert!(ok, "{v}");
    assert_eq!(result_of(&v, "other")["result"], "installed", "{v}");
    assert_eq!(result_of(&v, "other")["replaced"], true, "{v}");
    assert_eq!(builds_listing(&other, "/opt/flodl"), name);
}

/// Hostile workers over real OpenSSH: one whose fdl (a stand-in first on its PATH)
/// answers endlessly, one whose fdl lies with escape sequences in a well-formed report.
/// The first is stopped at the cap and red with "answer too large", well within the
/// timeout; the second is printed escaped; the honest third still answers.
#[test]
#[ignore = "drives the real Docker engine and OpenSSH: `cargo test -- --include-ignored`"]
fn hostile_workers_are_bounded_and_printed_escaped() {
    let _hosts = HOSTS.lock().unwrap_or_else(|e| e.into_inner());
    let rig = Rig::new();
    rig.hosts[0].0.write(
        "/usr/local/bin/fdl",
        "#!/bin/sh\nexec yes 'an endless answer from a hostile worker'\n",
        0o755,
    );
    // A well-formed report (this machine's), made to lie.
    let here = ProjectFixture::empty();
    let smi = fake_nvidia_smi("0, NVIDIA GeForce RTX 3090, 8.6, 24576\n", 0);
    let out = fdl_in(here.root())
        .args(["cluster", "self", "--json"])
        .env("PATH", path_with(smi.path()))
        .output()
        .unwrap();
    let mut report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    report["gpus"]["known"][0]["name"] = "\u{1b}]0;pwned\u{7}RTX\u{1b}[2J".into();
    report["libtorch"] = serde_json::json!({ "unknown": "\r\u{1b}[1Aok all good\u{9b}" });
    rig.hosts[1]
        .0
        .write("/tmp/answer.json", &report.to_string(), 0o644);
    rig.hosts[1].0.write(
        "/usr/local/bin/fdl",
        "#!/bin/sh\ncat /tmp/answer.json\n",
        0o755,
    );
    let start = std::time::Instant::now();
    let out = rig.fdl(&["cluster", "status", "--json", "--timeout", "60"]);
    assert!(start.elapsed() < std::time::Duration::from_secs(45));
    let v = json_of(&out);
    let w = v["workers"].as_array().unwrap();
    let too_large = w[0]["error"].as_str().unwrap_or_default();
    assert!(too_large.contains("answer too large"), "{}", w[0]);
    assert_eq!(
        w[1]["report"]["gpus"]["known"][0]["name"],
        "\u{1b}]0;pwned\u{7}RTX\u{1b}[2J"
    );
    assert!(w[2]["error"].is_null(), "{}", w[2]);
    let out = rig.fdl(&["cluster", "status", "--timeout", "60"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\\u{1b}]0;pwned\\u{7}RTX"), "{text}");
    for bad in ['\u{1b}', '\u{7}', '\r', '\u{9b}'] {
        assert!(!text.contains(bad), "{bad:?} in {text:?}");
    }
}

/// A file planted in a worker's cache under the controller's fdl's name (other bytes,
/// which would leave a marker) is never run: status ships the genuine one over it and
/// runs that. A cache directory others may write is refused and named, nothing is sent
/// into it; fixed, the genuine fdl runs there and is not shipped again.
#[test]
#[ignore = "drives the real Docker engine and OpenSSH: `cargo test -- --include-ignored`"]
fn a_planted_fdl_in_a_workers_cache_never_runs() {
    let _hosts = HOSTS.lock().unwrap_or_else(|e| e.into_inner());
    let rig = Rig::new();
    let sha = fdl::digest::sha256_file(Path::new(env!("CARGO_BIN_EXE_fdl"))).unwrap();
    let cached = format!("/root/.cache/fdl/bin/fdl-{}", &sha[..16]);
    let (pascal, blackwell) = (&rig.hosts[0].0, &rig.hosts[1].0);
    pascal.write(
        &cached,
        "#!/bin/sh\ntouch /tmp/planted-ran\necho '{\"schema\": 1}'\n",
        0o755,
    );
    pascal.exec("chmod 700 /root/.cache/fdl /root/.cache/fdl/bin");
    blackwell.exec(
        "mkdir -p /root/.cache/fdl/bin && chmod 700 /root/.cache/fdl && chmod 775 /root/.cache/fdl/bin",
    );
    let v = json_of(&rig.fdl(&["cluster", "status", "--json"]));
    let workers = v["workers"].as_array().unwrap();
    assert_eq!(
        pascal
            .exec("test -e /tmp/planted-ran && echo ran || echo no")
            .trim(),
        "no",
        "the planted file ran"
    );
    assert!(workers[0]["report"].is_object(), "{v}");
    assert_eq!(workers[0]["shipped_fdl"], true, "{v}");
    assert!(
        pascal
            .exec(&format!("sha256sum {cached}"))
            .starts_with(&sha),
        "the planted file was not replaced"
    );
    let error = workers[1]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(
            "fdl's cache /root/.cache/fdl/bin on this worker is writable by others (mode drwxrwxr-x)"
        ),
        "{v}"
    );
    assert_eq!(blackwell.exec("ls -A /root/.cache/fdl/bin").trim(), "");

    blackwell.exec("chmod 755 /root/.cache/fdl/bin");
    let v = json_of(&rig.fdl(&["cluster", "status", "--json"]));
    let workers = v["workers"].as_array().unwrap();
    for w in workers {
        assert!(w["report"].is_object(), "{w}");
    }
    assert_eq!(
        workers[0]["shipped_fdl"], false,
        "the genuine one runs: {v}"
    );
    assert_eq!(workers[1]["shipped_fdl"], true, "{v}");
}

/// Coverage judges the libtorch a rank runs, not only its NCCL: a worker with the real
/// PyPI torch 2.8.0 `libtorch_cuda.so` (no sm_61 kernels) and its real NCCL 2.27.5 (which
/// has sm_61 code) is red on a GTX 1060, naming the libtorch and what would cover it; the
/// same worker on an RTX 3090 (sm_86, which torch covers) is green.
#[test]
#[ignore = "drives the real Docker engine and OpenSSH, and needs the real torch 2.8 and NCCL of `source .ci/setup`: `cargo test -- --include-ignored`"]
fn coverage_judges_the_libtorch_the_worker_loads() {
    let torch = oracle_input("FDL_TEST_TORCH_LIB");
    let nccl = oracle_input("FDL_TEST_NCCL_LIB");
    let _hosts = HOSTS.lock().unwrap_or_else(|e| e.into_inner());
    let keys = Keys::new();
    let host = Host::start("torch28", &keys);
    let path = "/opt/flodl";
    // torch's DT_RPATH finds its NCCL at $ORIGIN/../../nvidia/nccl/lib, as pip lays it out,
    // and its other libraries beside it (empty stand-ins of their sonames).
    let lib_dir = format!("{path}/libtorch/precompiled/cu128/lib");
    host.put(&torch, &format!("{lib_dir}/libtorch_cuda.so"));
    host.put(
        &nccl,
        &format!("{path}/libtorch/precompiled/nvidia/nccl/lib/libnccl.so.2"),
    );
    let stubs = stubs_for_missing(&torch);
    for entry in std::fs::read_dir(stubs.path()).unwrap() {
        let entry = entry.unwrap();
        host.put(
            &entry.path(),
            &format!("{lib_dir}/{}", entry.file_name().to_string_lossy()),
        );
    }
    let project = ProjectFixture::empty();
    write_cluster_file(project.root(), &keys, &[(&host, path)], &[]);
    let cache = tempfile::tempdir().unwrap();
    let status = || status_json(project.root(), cache.path());

    host.fake_nvidia_smi(
        &[("NVIDIA GeForce GTX 1060 6GB", "6.1", 6144)],
        "570.133.07",
        "12.8",
    );
    let (code, v) = status();
    let report = &v["workers"][0]["report"];
    assert_eq!(report["effective"]["known"]["version"], "2.27.5", "{v}");
    assert_eq!(
        report["coverage"][0]["covered"], true,
        "the NCCL has sm_61: {v}"
    );
    assert_eq!(
        report["torch_coverage"]["known"]["gpus"][0]["covered"], false,
        "{v}"
    );
    let coverage = verdict(&v, "coverage");
    assert_eq!(coverage["state"], "red", "{v}");
    let detail = coverage["detail"].as_str().unwrap();
    assert!(
        detail.contains("torch28 GPU 0 (sm_61) has no kernels in its libtorch precompiled/cu128")
            && detail.contains(
                "/opt/flodl/libtorch/precompiled/cu128/lib/libtorch_cuda.so holds SASS sm_70 "
            )
            && detail.contains("TORCH_CUDA_ARCH_LIST including 6.1"),
        "{detail}"
    );
    assert!(!detail.contains("effective NCCL"), "{detail}");
    assert_eq!(code, Some(1), "red exits 1: {v}");

    host.fake_nvidia_smi(
        &[("NVIDIA GeForce RTX 3090", "8.6", 24576)],
        "570.133.07",
        "12.8",
    );
    let (_, v) = status();
    let coverage = verdict(&v, "coverage");
    assert_eq!(coverage["state"], "ok", "{v}");
    assert_eq!(
        coverage["detail"],
        "every GPU has code in its host's NCCL and libtorch"
    );
    assert_eq!(
        v["workers"][0]["report"]["torch_coverage"]["known"]["gpus"][0]["verdict"],
        "native sm_86"
    );
}

/// Two workers with the same libtorch (NCCL compiled in, asking for net plugin v10 and
/// v9) and the same env: block, which puts /opt/plugins on LD_LIBRARY_PATH; only pascal
/// has a net plugin there. Status is red and names what each loads; the env: block's
/// NCCL_NET_PLUGIN=none, the fix it names, makes them agree. Then the plugin in a
/// directory only ld.so.cache lists, on both: each worker's model finds it where that
/// host's own dlopen does, and they agree.
#[test]
#[ignore = "drives the real Docker engine and OpenSSH: `cargo test -- --include-ignored`"]
fn a_net_plugin_on_one_worker_only_is_red_and_names_both() {
    let _hosts = HOSTS.lock().unwrap_or_else(|e| e.into_inner());
    let keys = Keys::new();
    let work = tempfile::tempdir().unwrap();
    let lib = work.path().join("libtorch_cuda.so");
    compile_shared(
        &format!(
            "{}\nconst char *fdl_names[] = {{\"ncclNetPlugin_v10\", \"ncclNetPlugin_v9\"}};\nint fdl_test_torch_calls_nccl(void) {{ int v = 0; ncclGetVersion(&v); return v; }}\n{}",
            nccl_like_source((2, 27, 5), "12.8"),
            fatbin_c_source(&[86], "fdl_test_torch_fatbin")
        ),
        &lib,
        &[],
    );
    let plugin = work.path().join("libnccl-net.so");
    compile_shared("int ncclNetPlugin_v10[4] = {10};\n", &plugin, &[]);
    let path = "/opt/flodl";
    let hosts: Vec<Host> = ["pascal", "blackwell"]
        .iter()
        .map(|label| {
            let h = Host::start(label, &keys);
            h.fake_nvidia_smi(
                &[("NVIDIA GeForce RTX 3090", "8.6", 24576)],
                "570.133.07",
                "12.8",
            );
            h.put(
                &lib,
                &format!("{path}/libtorch/precompiled/cu128/lib/libtorch_cuda.so"),
            );
            h
        })
        .collect();
    hosts[0].put(&plugin, "/opt/plugins/libnccl-net.so");
    let project = ProjectFixture::empty();
    let cache = tempfile::tempdir().unwrap();
    let status = |env: &str| {
        write_cluster_file(
            project.root(),
            &keys,
            &[(&hosts[0], path), (&hosts[1], path)],
            &[(0, env.to_string()), (1, env.to_string())],
        );
        status_json(project.root(), cache.path())
    };

    let (code, v) = status("env:\n  LD_LIBRARY_PATH: /opt/plugins");
    let plugins = verdict(&v, "plugins");
    assert_eq!(plugins["state"], "red", "{v}");
    let detail = plugins["detail"].as_str().unwrap();
    assert!(
        detail.contains("pascal loads /opt/plugins/libnccl-net.so (v10)")
            && detail.contains("blackwell loads none (none found)")
            && detail.contains("NCCL_NET_PLUGIN=none"),
        "{detail}"
    );
    let net = &v["workers"][0]["report"]["plugins"]["known"][0];
    assert_eq!(net["kind"], "net", "{v}");
    assert_eq!(net["asks"], serde_json::json!([10, 9]), "{v}");
    assert_eq!(net["exports"], serde_json::json!([10]), "{v}");
    for name in ["skew", "coverage", "driver", "symbols", "bridge"] {
        assert_eq!(verdict(&v, name)["state"], "ok", "{name}: {v}");
    }
    assert_eq!(code, Some(1), "red exits 1: {v}");
    let text = fdl_in(project.root())
        .env("XDG_CACHE_HOME", cache.path())
        .args(["cluster", "status"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("plugins   net /opt/plugins/libnccl-net.so (v10)")
            && text.contains("plugins   none loaded"),
        "{text}"
    );

    let (code, v) = status("env:\n  LD_LIBRARY_PATH: /opt/plugins\n  NCCL_NET_PLUGIN: none");
    let plugins = verdict(&v, "plugins");
    assert_eq!(plugins["state"], "ok", "{v}");
    assert_eq!(plugins["detail"], "no worker's NCCL loads a plugin", "{v}");
    assert_eq!(code, Some(0), "{v}");

    // The cache rule: the plugin in a directory only ld.so.cache lists, on both hosts.
    // Each worker's model finds it there, as that host's own dlopen does.
    let probe = work.path().join("probe");
    let src = work.path().join("probe.c");
    std::fs::write(
        &src,
        "#define _GNU_SOURCE\n#include <dlfcn.h>\n#include <link.h>\n#include <stdio.h>\nint main(int c, char **v) { void *h = dlopen(v[1], RTLD_NOW | RTLD_LOCAL); if (!h) { puts(\"NOTFOUND\"); return 1; } struct link_map *m; dlinfo(h, RTLD_DI_LINKMAP, &m); puts(m->l_name); return 0; }\n",
    )
    .unwrap();
    assert!(std::process::Command::new("cc")
        .arg("-o")
        .arg(&probe)
        .arg(&src)
        .arg("-ldl")
        .status()
        .unwrap()
        .success());
    for h in &hosts {
        h.put(&plugin, "/opt/cached/libnccl-net.so");
        h.put(&probe, "/usr/local/bin/fdl-probe");
        h.exec("echo /opt/cached > /etc/ld.so.conf.d/fdl-plugin.conf && ldconfig && chmod 755 /usr/local/bin/fdl-probe");
        assert_eq!(
            h.exec("fdl-probe libnccl-net.so").trim(),
            "/opt/cached/libnccl-net.so",
            "the host's own dlopen"
        );
    }
    let (code, v) = status("");
    for w in v["workers"].as_array().unwrap() {
        let net = &w["report"]["plugins"]["known"][0];
        assert_eq!(net["path"], "/opt/cached/libnccl-net.so", "{v}");
        assert_eq!(net["verdict"], "loaded", "{v}");
    }
    let plugins = verdict(&v, "plugins");
    assert_eq!(plugins["state"], "ok", "{v}");
    assert_eq!(
        plugins["detail"], "every worker loads the same plugins: net libnccl-net.so",
        "{v}"
    );
    assert_eq!(code, Some(0), "{v}");
}

/// A worker whose active libtorch was linked as a PIE naming an audit library
/// (DT_AUDIT): `cluster status`, which asks each worker's own loader by default, runs
/// nothing of it there (glibc runs a main program's audit libraries before it traces;
/// a libtorch is traced as the library it is, through fdl's stand-in program), and the
/// worker still answers.
#[test]
#[ignore = "drives the real Docker engine and OpenSSH: `cargo test -- --include-ignored`"]
fn an_audit_library_of_a_workers_libtorch_never_runs() {
    let _hosts = HOSTS.lock().unwrap_or_else(|e| e.into_inner());
    let keys = Keys::new();
    let work = tempfile::tempdir().unwrap();
    let (torch, audit) =
        audited_pie_libtorch(work.path(), "/opt/audit/libaudit.so", "/tmp/audit-ran");
    let host = Host::start("audited", &keys);
    host.fake_nvidia_smi(
        &[("NVIDIA GeForce RTX 3090", "8.6", 24576)],
        "570.133.07",
        "12.8",
    );
    host.put(&audit, "/opt/audit/libaudit.so");
    let path = "/opt/flodl";
    host.put(
        &torch,
        &format!("{path}/libtorch/precompiled/cu128/lib/libtorch_cuda.so"),
    );
    // The probe: the worker's own `ldd -r` of the file does run it.
    host.exec(&format!(
        "ldd -r {path}/libtorch/precompiled/cu128/lib/libtorch_cuda.so >/dev/null 2>&1; true"
    ));
    assert_eq!(
        host.exec("test -e /tmp/audit-ran && echo ran || echo no")
            .trim(),
        "ran",
        "the audit library does not run under ldd on the worker: the test proves nothing"
    );
    host.exec("rm -f /tmp/audit-ran");

    let project = ProjectFixture::empty();
    write_cluster_file(project.root(), &keys, &[(&host, path)], &[]);
    let cache = tempfile::tempdir().unwrap();
    let (_, v) = status_json(project.root(), cache.path());
    assert_eq!(
        host.exec("test -e /tmp/audit-ran && echo ran || echo no")
            .trim(),
        "no",
        "cluster status ran the audit library on the worker: {v}"
    );
    assert!(v["workers"][0]["report"].is_object(), "{v}");
}
