//! What the rehearsal tests put on a worker, and their oracle.
//!
//! A worker's libtorch is laid out as pip lays torch out: `libtorch_cuda.so` in
//! `<variant>/lib`, whose DT_RPATH `$ORIGIN/../../nvidia/nccl/lib` finds the real
//! `libnccl.so.2` of the `nvidia-nccl-cu12` wheel (bind-mounted read-only: 430 MB copied
//! to every host would cost more than the test). The `libtorch_cuda.so` is a small ELF
//! made here that links that very file and calls `ncclGetUniqueId` and `ncclGetVersion`
//! through the PLT, as torch's does: the loader model, and the host's own loader, find
//! the real NCCL there.
//!
//! The oracle is NCCL itself: [`ORACLE_C`], a C program that `dlopen`s a library, calls
//! `ncclGetUniqueId` and prints its code; with `NCCL_DEBUG=INFO` NCCL prints its own
//! `Bootstrap: Using IF:ADDR<0>` line or its `WARN`. [`oracle`] runs it on a host in a
//! given environment and reads those lines, never fdl's.
#![allow(dead_code)]

use super::{docker, Host};
use std::path::{Path, PathBuf};

/// Where a worker's libtorch variant lies below its checkout.
pub const VARIANT: &str = "precompiled/cu128";

/// The oracle: NCCL's own answer for a library, under the caller's environment.
pub const ORACLE_C: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
  if (argc != 2) return 64;
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) { printf("oracle-dlopen-failed %s\n", dlerror()); return 2; }
  int (*get)(unsigned char *) = (int (*)(unsigned char *))dlsym(h, "ncclGetUniqueId");
  if (!get) { printf("oracle-no-symbol\n"); return 2; }
  unsigned char id[128];
  int rc = get(id);
  fflush(stdout);
  printf("oracle-rc %d\n", rc);
  fflush(stdout);
  _exit(0);
}
"#;

/// The oracle and the stand-in libtorch, compiled once per process against the real
/// NCCL at `nccl`.
pub struct Parts {
    pub dir: tempfile::TempDir,
    pub oracle: PathBuf,
    pub libtorch_cuda: PathBuf,
    pub nccl: PathBuf,
}

impl Parts {
    pub fn new(nccl: &Path) -> Parts {
        let dir = tempfile::tempdir().unwrap();
        let oracle = compile_oracle(dir.path());
        let libtorch_cuda = dir.path().join("libtorch_cuda.so");
        let lib_src = dir.path().join("torch.c");
        std::fs::write(
            &lib_src,
            "int ncclGetUniqueId(void *);\nint ncclGetVersion(int *);\n\
             int fdl_test_torch_init(void *id) { int v = 0; ncclGetVersion(&v); return ncclGetUniqueId(id) + v * 0; }\n",
        )
        .unwrap();
        let status = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&libtorch_cuda)
            .arg(&lib_src)
            .arg(nccl)
            .args([
                "-Wl,--disable-new-dtags",
                "-Wl,-rpath,$ORIGIN/../../nvidia/nccl/lib",
                "-Wl,-soname,libtorch_cuda.so",
            ])
            .status()
            .expect("a C compiler (cc) is needed for these tests");
        assert!(status.success(), "cc failed for the stand-in libtorch");
        Parts {
            dir,
            oracle,
            libtorch_cuda,
            nccl: nccl.to_path_buf(),
        }
    }

    /// The `docker run` arguments that mount the real NCCL where the worker's libtorch
    /// at checkout `path` finds it.
    pub fn mount_args(&self, path: &str) -> Vec<String> {
        vec![
            "-v".into(),
            format!("{}:{}:ro", self.nccl.display(), nccl_path(path)),
        ]
    }

    /// Puts the stand-in libtorch and the oracle on `host` (its NCCL is mounted by
    /// [`Parts::mount_args`] when it starts).
    pub fn install(&self, host: &Host, path: &str) {
        host.put(
            &self.libtorch_cuda,
            &format!("{path}/libtorch/{VARIANT}/lib/libtorch_cuda.so"),
        );
        host.put(&self.oracle, "/usr/local/bin/nccl-oracle");
    }
}

/// The oracle ([`ORACLE_C`]) compiled into `dir`.
pub fn compile_oracle(dir: &Path) -> PathBuf {
    let oracle = dir.join("nccl-oracle");
    let src = dir.join("oracle.c");
    std::fs::write(&src, ORACLE_C).unwrap();
    let status = std::process::Command::new("cc")
        .arg("-o")
        .arg(&oracle)
        .arg(&src)
        .arg("-ldl")
        .status()
        .expect("a C compiler (cc) is needed for these tests");
    assert!(status.success(), "cc failed for the oracle");
    oracle
}

/// The real NCCL's place on a worker whose checkout is `path`.
pub fn nccl_path(path: &str) -> String {
    format!("{path}/libtorch/precompiled/nvidia/nccl/lib/libnccl.so.2")
}

/// What NCCL itself says on `host` for library `lib` under `env` (NAME=VALUE each):
/// `Ok((interface, address))` from its `Bootstrap: Using` line, or `Err((code, warn))`.
pub fn oracle(host: &Host, lib: &str, env: &[&str]) -> Result<(String, String), (i32, String)> {
    oracle_in(&host.name, &host.label, lib, env)
}

/// [`oracle`] in any container (a Slurm node's), by its name; `label` names it in a
/// failure.
pub fn oracle_in(
    container: &str,
    label: &str,
    lib: &str,
    env: &[&str],
) -> Result<(String, String), (i32, String)> {
    let mut args: Vec<String> = vec!["exec".into()];
    for e in env.iter().copied().chain([
        "NCCL_DEBUG=INFO",
        "NCCL_DEBUG_SUBSYS=INIT,BOOTSTRAP,ENV,NET",
    ]) {
        args.extend(["-e".into(), e.to_string()]);
    }
    args.extend([
        container.to_string(),
        "/usr/local/bin/nccl-oracle".into(),
        lib.to_string(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = docker(&args);
    read_oracle(label, &String::from_utf8_lossy(&out.stdout))
}

/// [`oracle`] on this machine: the compiled `oracle` run on `lib` under `env`.
pub fn oracle_here(
    oracle: &Path,
    lib: &Path,
    env: &[(&str, &str)],
) -> Result<(String, String), (i32, String)> {
    let out = std::process::Command::new(oracle)
        .arg(lib)
        .envs(env.iter().copied())
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_SUBSYS", "INIT,BOOTSTRAP,ENV,NET")
        .output()
        .expect("the oracle runs");
    read_oracle("this machine", &String::from_utf8_lossy(&out.stdout))
}

/// The oracle's output read: NCCL's `Bootstrap: Using IF:ADDR<0>` line, or its code and
/// last `WARN`.
fn read_oracle(label: &str, text: &str) -> Result<(String, String), (i32, String)> {
    let rc: i32 = text
        .lines()
        .find_map(|l| l.strip_prefix("oracle-rc "))
        .unwrap_or_else(|| panic!("the oracle gave no code on {label}:\n{text}"))
        .trim()
        .parse()
        .unwrap();
    if rc != 0 {
        let warn = text
            .lines()
            .filter_map(|l| {
                l.split_once(" NCCL WARN ")
                    .map(|(_, w)| w.trim().to_string())
            })
            .next_back()
            .unwrap_or_default();
        return Err((rc, warn));
    }
    let using = text
        .lines()
        .find_map(|l| {
            let i = l.find("Bootstrap")?;
            let rest = &l[i..];
            let u = rest.find("Using")?;
            Some(rest[u + "Using".len()..].trim().to_string())
        })
        .unwrap_or_else(|| panic!("NCCL said no Bootstrap line on {label}:\n{text}"));
    // `eth0:172.18.0.2<0>`: the interface, then the address up to `<`.
    let (iface, rest) = using.split_once(':').unwrap();
    let addr = rest.rsplit_once('<').map(|(a, _)| a).unwrap_or(rest);
    Ok((iface.to_string(), addr.to_string()))
}

/// A Docker network made for one test, labelled, removed when dropped (after the hosts
/// on it, which the test declares after it).
pub struct Network {
    pub name: String,
}

impl Network {
    /// `ipv6`: with an IPv6 subnet of its own (a ULA made from the name's nanos), as
    /// the engine has no pool for one.
    pub fn new(label: &str, ipv6: bool) -> Network {
        let name = super::unique_in("fdl-test-net", label);
        let mut args = vec![
            "network".to_string(),
            "create".into(),
            "--label".into(),
            super::CONTAINER_LABEL.into(),
        ];
        if ipv6 {
            let nanos: u64 = name
                .rsplit('-')
                .nth(1)
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let pid = std::process::id();
            args.extend([
                "--ipv6".into(),
                "--subnet".into(),
                format!(
                    "fd{:02x}:{:04x}:{:04x}::/64",
                    (nanos >> 32) as u8,
                    (nanos & 0xffff) as u16,
                    (pid & 0xffff) as u16
                ),
            ]);
        }
        args.push(name.clone());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        super::docker_ok(&args);
        Network { name }
    }

    /// Attaches a running host (its next interface, `eth1` after `eth0`); the engine
    /// publishes its ssh port anew, which the host reads again.
    pub fn connect(&self, host: &mut Host, keys: &super::Keys) {
        super::docker_ok(&["network", "connect", &self.name, &host.name]);
        host.republished(keys);
    }

    pub fn disconnect(&self, host: &mut Host, keys: &super::Keys) {
        super::docker_ok(&["network", "disconnect", &self.name, &host.name]);
        host.republished(keys);
    }

    /// The host's address on this network.
    pub fn address_of(&self, host: &Host, v6: bool) -> String {
        let field = if v6 { "GlobalIPv6Address" } else { "IPAddress" };
        super::docker_ok(&[
            "inspect",
            "-f",
            &format!(
                "{{{{(index .NetworkSettings.Networks \"{}\").{field}}}}}",
                self.name
            ),
            &host.name,
        ])
        .trim()
        .to_string()
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["network", "rm", &self.name])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}
