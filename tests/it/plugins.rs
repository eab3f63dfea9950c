//! `loader::plugins` against the real glibc `dlopen` (gcc stand-ins: a libnccl.so.2 that
//! makes NCCL's `dlopen` call and reports where the loader found the file, loaded by a
//! libtorch_cuda.so through its DT_RPATH) and against the real NCCL wheels' binaries,
//! whose asked entry versions must equal what NCCL's source at the same tag looks up.

use crate::common;

use common::compile_shared;
use fdl::loader::plugins::{self, Kind, Verdict};
use fdl::loader::{self, LoaderEnv};
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the stand-in NCCLs share: the entry names NCCL's dlsym would look up (v10, v9),
/// and `fdl_probe`, which calls `dlopen` as `ncclOsDlopen` does and prints `l_name`.
const PROBE_C: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
const char *fdl_names[] = {"ncclNetPlugin_v10", "ncclNetPlugin_v9"};
int fdl_probe(const char *name) {
  void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!h) { printf("NOTFOUND\n"); return 1; }
  struct link_map *lm;
  dlinfo(h, RTLD_DI_LINKMAP, &lm);
  printf("%s\n", lm->l_name);
  return 0;
}
"#;

/// The stand-in pip NCCL: its self-id and version, and the probe.
fn nccl_c() -> String {
    format!(
        "{PROBE_C}\n{}",
        common::nccl_like_source((2, 27, 5), "12.9")
    )
}

const TORCH_C: &str = r#"
int ncclGetVersion(int *v);
int fdl_probe(const char *name);
int torch_probe(const char *name) { int v; ncclGetVersion(&v); return fdl_probe(name); }
"#;

const MAIN_C: &str = r#"
int torch_probe(const char *name);
int main(int argc, char **argv) { return torch_probe(argv[1]); }
"#;

/// A pip-like layout: torch/lib/libtorch_cuda.so with DT_RPATH
/// `$ORIGIN/../../nvidia/nccl/lib`, the NCCL there, and the program.
struct Layout {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Layout {
    fn new() -> Layout {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let nccl = root.join("nvidia/nccl/lib");
        let torch = root.join("torch/lib");
        std::fs::create_dir_all(&nccl).unwrap();
        std::fs::create_dir_all(&torch).unwrap();
        compile_shared(
            &nccl_c(),
            &nccl.join("libnccl.so.2"),
            &["-Wl,-soname,libnccl.so.2", "-ldl"],
        );
        compile_shared(
            TORCH_C,
            &torch.join("libtorch_cuda.so"),
            &[
                "-Wl,--disable-new-dtags",
                "-Wl,-rpath,$ORIGIN/../../nvidia/nccl/lib",
                "-L",
                nccl.to_str().unwrap(),
                "-l:libnccl.so.2",
            ],
        );
        let src = root.join("main.c");
        std::fs::write(&src, MAIN_C).unwrap();
        let ok = Command::new("cc")
            .arg("-o")
            .arg(root.join("prog"))
            .arg(&src)
            .arg(torch.join("libtorch_cuda.so"))
            .arg(format!("-Wl,--enable-new-dtags,-rpath,{}", torch.display()))
            .status()
            .expect("cc");
        assert!(ok.success());
        Layout { _dir: dir, root }
    }

    fn plugin(&self, at: &Path, versions: &[u32]) {
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        let mut c = String::new();
        for v in versions {
            c.push_str(&format!("int ncclNetPlugin_v{v}[4] = {{{v}}};\n"));
        }
        compile_shared(&c, at, &[]);
    }

    /// Where the real dlopen from the stand-in NCCL finds `name`.
    fn real(&self, name: &str, llp: &str) -> Option<PathBuf> {
        let out = Command::new(self.root.join("prog"))
            .arg(name)
            .env("LD_LIBRARY_PATH", llp)
            .env_remove("LD_PRELOAD")
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (s != "NOTFOUND").then(|| PathBuf::from(s).canonicalize().unwrap())
    }

    fn model(&self, llp: &str, net: Option<&str>) -> plugins::Plugins {
        let mut env = LoaderEnv::from_process();
        env.preload.clear();
        env.ld_so_preload.clear();
        env.ld_library_path = loader::search::split_path_list(llp);
        let lib = self.root.join("torch/lib/libtorch_cuda.so");
        let w = loader::which_nccl(&lib, &env).unwrap();
        let net = net.map(str::to_string);
        let var = move |k: &str| {
            if k == "NCCL_NET_PLUGIN" {
                net.clone()
            } else {
                None
            }
        };
        plugins::plugins(&w, &env, &var).unwrap()
    }
}

fn net_path(p: &plugins::Plugins) -> Option<PathBuf> {
    match &p.kind(Kind::Net).unwrap().verdict {
        Verdict::Loaded { path, .. } => Some(path.canonicalize().unwrap()),
        _ => None,
    }
}

#[test]
fn the_stand_in_nccl_asks_what_its_strings_say() {
    let l = Layout::new();
    let p = l.model("", None);
    let net = p.kind(Kind::Net).unwrap();
    assert_eq!(net.asks, vec![10, 9]);
    assert_eq!(net.verdict, Verdict::NotFound);
    assert_eq!(l.real("libnccl-net.so", ""), None);
}

#[test]
fn next_to_the_pip_nccl_through_libtorchs_rpath_chain() {
    let l = Layout::new();
    let at = l.root.join("nvidia/nccl/lib/libnccl-net.so");
    l.plugin(&at, &[10]);
    let real = l.real("libnccl-net.so", "").expect("glibc finds it");
    assert_eq!(real, at);
    let p = l.model("", None);
    assert_eq!(net_path(&p), Some(real));
    let net = p.kind(Kind::Net).unwrap();
    assert_eq!(net.tries[0].via.as_deref(), Some("rpath"));
    assert!(matches!(net.verdict, Verdict::Loaded { version: 10, .. }));
}

#[test]
fn ld_library_path_and_a_named_path_and_no_common_version() {
    let l = Layout::new();
    let dir = l.root.join("elsewhere");
    l.plugin(&dir.join("libnccl-net.so"), &[8, 7]);
    let llp = dir.to_str().unwrap().to_string();
    let real = l.real("libnccl-net.so", &llp).unwrap();
    let p = l.model(&llp, None);
    let net = p.kind(Kind::Net).unwrap();
    assert_eq!(
        net.tries[0]
            .found
            .as_ref()
            .map(|f| f.canonicalize().unwrap()),
        Some(real)
    );
    assert_eq!(net.tries[0].via.as_deref(), Some("ld_library_path"));
    assert!(
        matches!(&net.verdict, Verdict::NoCommonVersion { exports, .. } if exports == &vec![8, 7]),
        "{:?}",
        net.verdict
    );
    // NCCL_NET_PLUGIN=<path>: the path itself.
    let named = l.root.join("named/libnccl-net-x.so");
    l.plugin(&named, &[9]);
    let real = l.real(named.to_str().unwrap(), "").unwrap();
    let p = l.model("", Some(named.to_str().unwrap()));
    assert_eq!(net_path(&p), Some(real));
    // NCCL_NET_PLUGIN=x: libnccl-net-x.so, searched; none: nothing.
    let p = l.model(l.root.join("named").to_str().unwrap(), Some("x"));
    assert_eq!(net_path(&p), Some(named.clone()));
    let p = l.model("", Some("none"));
    assert_eq!(p.kind(Kind::Net).unwrap().verdict, Verdict::Disabled);
}

#[test]
fn candidate_names_follow_nccl_2_30() {
    let asks = plugins::Asks {
        kinds: vec![(Kind::Net, vec![12])],
        checks_value: true,
        lists: vec![Kind::Net],
    };
    let n = |v| plugins::candidate_names(Kind::Net, v, &asks);
    assert_eq!(n(None), vec![vec!["libnccl-net.so".to_string()]]);
    assert_eq!(
        n(Some("aws-ofi")),
        vec![vec![
            "aws-ofi".to_string(),
            "libnccl-net-aws-ofi.so".to_string()
        ]]
    );
    assert_eq!(n(Some("libfoo.so")), vec![vec!["libfoo.so".to_string()]]);
    assert_eq!(n(Some("/a/b.so")), vec![vec!["/a/b.so".to_string()]]);
    assert!(n(Some("NONE")).is_empty());
    assert!(n(Some("")).is_empty());
    assert_eq!(n(Some("a,,b")).len(), 2);
}

/// Entry names NCCL's source looks up at each tag (`git show <tag>:src/plugin/…`:
/// `dlsym(lib, "ncclNetPlugin_vN")` and the like), newest first — the oracle.
/// One wheel's library variable and the entries its source looks up.
type SourceFacts = (&'static str, &'static [(Kind, &'static [u32])]);

const SOURCE: &[SourceFacts] = &[
    (
        "FDL_TEST_NCCL_LIB_2215",
        &[(Kind::Net, &[8, 7, 6, 5]), (Kind::Tuner, &[2])],
    ),
    (
        "FDL_TEST_NCCL_LIB",
        &[
            (Kind::Net, &[10, 9, 8, 7, 6]),
            (Kind::Tuner, &[4, 3, 2]),
            (Kind::Profiler, &[4, 3, 2, 1]),
        ],
    ),
    (
        "FDL_TEST_NCCL_LIB_CU13",
        &[
            (Kind::Net, &[11, 10, 9, 8, 7, 6]),
            (Kind::Tuner, &[5, 4, 3, 2]),
            (Kind::Profiler, &[5, 4, 3, 2, 1]),
            (Kind::Env, &[1]),
            (Kind::Gin, &[11]),
        ],
    ),
    // The NCCL today's torch (2.15.0) requires: the net ABI v12, gin and rma at v13-v14.
    (
        "FDL_TEST_NCCL_LIB_2307",
        &[
            (Kind::Net, &[12, 11, 10, 9, 8, 7, 6]),
            (Kind::Tuner, &[6, 5, 4, 3, 2]),
            (Kind::Profiler, &[6, 5, 4, 3, 2, 1]),
            (Kind::Env, &[2, 1]),
            (Kind::Gin, &[14, 13]),
            (Kind::Rma, &[14, 13]),
        ],
    ),
];

#[test]
#[ignore = "needs the NCCL wheels (.ci/fetch-oracles)"]
fn real_wheels_ask_what_their_source_looks_up() {
    for (var, want) in SOURCE {
        let lib = std::env::var_os(var).unwrap_or_else(|| panic!("{var} is not set"));
        let asks = plugins::read_asks(Path::new(&lib)).unwrap();
        let got: Vec<(Kind, Vec<u32>)> = asks.kinds.clone();
        let want: Vec<(Kind, Vec<u32>)> = want.iter().map(|(k, v)| (*k, v.to_vec())).collect();
        assert_eq!(got, want, "{var}");
        // 2.21 always tries both names, and its NCCL_NET_PLUGIN is no list.
        let old = *var == "FDL_TEST_NCCL_LIB_2215";
        assert_eq!(asks.checks_value, !old, "{var}");
        assert_eq!(asks.lists.contains(&Kind::Net), !old, "{var}");
    }
}

/// A real NCCL (2.28.9) opens its env plugin with no GPU, at `ncclGetUniqueId`: the file
/// glibc reports (`LD_DEBUG=files`) must be the one fdl's model finds. The stand-in
/// exports only an entry version no NCCL knows, so NCCL closes it without calling it, and
/// fdl must say it is ignored.
#[test]
#[ignore = "needs the NCCL wheels (.ci/fetch-oracles)"]
fn a_real_nccl_opens_the_env_plugin_fdl_finds() {
    let lib =
        PathBuf::from(std::env::var_os("FDL_TEST_NCCL_LIB_CU13").expect("FDL_TEST_NCCL_LIB_CU13"));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let plugins_dir = root.join("plugins");
    std::fs::create_dir_all(&plugins_dir).unwrap();
    let plugin = plugins_dir.join("libnccl-env.so");
    compile_shared("int ncclEnvPlugin_v99[4] = {99};\n", &plugin, &[]);
    let src = root.join("run.c");
    std::fs::write(
        &src,
        r#"#include <dlfcn.h>
#include <stdio.h>
int main(int c, char **v) {
  void *h = dlopen(v[1], RTLD_NOW);
  if (!h) { printf("%s\n", dlerror()); return 2; }
  int (*gu)(void *) = (int (*)(void *))dlsym(h, "ncclGetUniqueId");
  char id[128];
  gu(id);
  return 0;
}
"#,
    )
    .unwrap();
    assert!(Command::new("cc")
        .arg("-o")
        .arg(root.join("run"))
        .arg(&src)
        .arg("-ldl")
        .status()
        .unwrap()
        .success());
    let out = Command::new(root.join("run"))
        .arg(&lib)
        .env("LD_DEBUG", "files")
        .env("LD_LIBRARY_PATH", &plugins_dir)
        .env_remove("NCCL_ENV_PLUGIN")
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let opened = err
        .lines()
        .find(|l| l.contains("libnccl-env.so") && l.contains("dynamically loaded by"))
        .unwrap_or_else(|| panic!("the real NCCL did not open libnccl-env.so:\n{err}"));
    let real = opened
        .split("file=")
        .nth(1)
        .and_then(|r| r.split(" [").next())
        .unwrap()
        .to_string();
    let mut env = LoaderEnv::from_process();
    env.preload.clear();
    env.ld_so_preload.clear();
    env.ld_library_path = vec![plugins_dir.clone()];
    let w = loader::which_nccl(&lib, &env).unwrap();
    let p = plugins::plugins(&w, &env, &|_| None).unwrap();
    let e = p.kind(Kind::Env).expect("2.28.9 opens an env plugin");
    let found = e.tries[0].found.clone().expect("fdl finds it");
    assert_eq!(found, plugin);
    // glibc reports the name searched for in this line, or the path.
    assert!(
        real == "libnccl-env.so" || Path::new(&real) == plugin,
        "{real}"
    );
    assert!(
        err.contains(&format!("{}", plugin.display())),
        "glibc opened another file:\n{err}"
    );
    assert_eq!(
        e.verdict,
        Verdict::NoCommonVersion {
            path: plugin.clone(),
            exports: vec![99]
        }
    );
}

/// A project whose active libtorch loads a pip-style NCCL through its DT_RPATH, with a
/// net plugin next to that NCCL: found today, out of reach of a preloaded build. The
/// plan warns, `nccl env` prints the pin, and glibc's own `dlopen` — from the installed
/// build, preloaded — agrees on both: the plain name is not found, the pin is.
#[test]
fn a_build_that_moves_the_plugin_out_of_reach_is_warned_of_and_kept() {
    use common::{fatbin_c_source, nccl_like_source, BuildsFixture, ProjectFixture};
    let p = ProjectFixture::empty();
    let root = p.root().canonicalize().unwrap();
    let nccl = root.join("pip/nvidia/nccl/lib");
    std::fs::create_dir_all(&nccl).unwrap();
    compile_shared(
        &nccl_c(),
        &nccl.join("libnccl.so.2"),
        &["-Wl,-soname,libnccl.so.2", "-ldl"],
    );
    let lib = p.variant_lib("precompiled/cu129");
    std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
    compile_shared(
        TORCH_C,
        &lib,
        &[
            "-Wl,--disable-new-dtags",
            &format!("-Wl,-rpath,{}", nccl.display()),
            "-L",
            nccl.to_str().unwrap(),
            "-l:libnccl.so.2",
        ],
    );
    let p = p.activate("precompiled/cu129\n");
    let plugin = nccl.join("libnccl-net.so");
    compile_shared("int ncclNetPlugin_v10[4] = {10};\n", &plugin, &[]);
    let f = BuildsFixture::new(p);
    let clean = |mut c: assert_cmd::Command| {
        for v in [
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "NCCL_NET_PLUGIN",
            "NCCL_CONF_FILE",
        ] {
            c.env_remove(v);
        }
        c
    };
    let pin = plugin.display().to_string();

    // The plan, before anything is built.
    let out = clean(f.fdl())
        .args(["nccl", "build", "--dry-run", "--json", "--archs", "8.6"])
        .args(["--backend", "docker"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(v["plan"]["tag"], "v2.27.5-1", "{v}");
    let warned: Vec<&str> = v["plan"]["warnings"]
        .as_array()
        .map(|w| w.iter().filter_map(|w| w.as_str()).collect())
        .unwrap_or_default();
    assert!(
        warned
            .iter()
            .any(|w| w.contains(&format!("the net plugin {pin} (v10)"))
                && w.contains("the DT_RPATH of the objects that load the current NCCL")
                && w.contains("its ranks fall back to NCCL's internal transport")
                && w.contains(&format!("set NCCL_NET_PLUGIN={pin} to keep it"))),
        "{warned:?}"
    );

    // The build, installed: a stand-in NCCL of the same release with the probe, and no
    // search path of its own, as fdl's builds are.
    let tree = f.tree("t", (2, 27, 5), &[86]);
    compile_shared(
        &format!(
            "{PROBE_C}\n{}{}",
            nccl_like_source((2, 27, 5), "12.9"),
            fatbin_c_source(&[86], "fdl_test_fatbin")
        ),
        &tree.join("lib/libnccl.so.2.27.5"),
        &["-Wl,-soname,libnccl.so.2", "-ldl"],
    );
    let name = f.install(&tree, "v2.27.5-1", "8.6").unwrap();
    let build = f.builds().join(&name).join("lib/libnccl.so.2");
    let env = |format: &str| {
        let out = clean(f.fdl())
            .args(["nccl", "env", &name, "--format", format])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = env("shell");
    assert!(
        text.contains(&format!("\nexport NCCL_NET_PLUGIN='{pin}'\n")),
        "{text}"
    );
    let text = env("yaml");
    assert!(
        text.contains(&format!("\n  NCCL_NET_PLUGIN: \"{pin}\"\n")),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&env("json")).unwrap();
    assert_eq!(v["plugins_moved"][0]["kind"], "net", "{v}");
    assert_eq!(v["plugins_moved"][0]["keep"], pin.as_str(), "{v}");
    assert_eq!(
        v["plugins_moved"][0]["after"]["verdict"], "not_found",
        "{v}"
    );

    // glibc agrees: today the plain name is found next to the pip NCCL; from the
    // preloaded build it is not, and the pin is.
    let src = root.join("main.c");
    std::fs::write(&src, MAIN_C).unwrap();
    let prog = root.join("prog");
    assert!(Command::new("cc")
        .arg("-o")
        .arg(&prog)
        .arg(&src)
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.parent().unwrap().display()))
        .status()
        .unwrap()
        .success());
    let real = |name: &str, preload: Option<&Path>| {
        let mut c = Command::new(&prog);
        c.arg(name)
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("LD_PRELOAD");
        if let Some(p) = preload {
            c.env("LD_PRELOAD", p);
        }
        let s = String::from_utf8_lossy(&c.output().unwrap().stdout)
            .trim()
            .to_string();
        (s != "NOTFOUND").then(|| PathBuf::from(s).canonicalize().unwrap())
    };
    assert_eq!(real("libnccl-net.so", None), Some(plugin.clone()));
    assert_eq!(real("libnccl-net.so", Some(&build)), None);
    assert_eq!(real(&pin, Some(&build)), Some(plugin.clone()));
}

/// NCCL asks `dlsym` for the exact name `ncclNetPlugin_v10`: a plugin that exports only
/// `ncclNetPlugin_v010` (or `_v+10`-like spellings) answers no version NCCL asks for.
#[test]
fn an_entry_with_a_leading_zero_is_not_the_version_nccl_asks_for() {
    let l = Layout::new();
    let at = l.root.join("nvidia/nccl/lib/libnccl-net.so");
    std::fs::create_dir_all(at.parent().unwrap()).unwrap();
    compile_shared("int ncclNetPlugin_v010[4] = {10};\n", &at, &[]);
    // The oracle: the exact name NCCL asks for is not there.
    let dl = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import ctypes; l = ctypes.CDLL({:?}); print(hasattr(l, 'ncclNetPlugin_v10'), hasattr(l, 'ncclNetPlugin_v010'))",
            at.display().to_string()
        ))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&dl.stdout).trim(), "False True");
    let p = l.model("", None);
    let net = p.kind(Kind::Net).unwrap();
    assert!(
        matches!(&net.verdict, Verdict::NoCommonVersion { exports, .. } if exports.is_empty()),
        "{:?}",
        net.verdict
    );
}
