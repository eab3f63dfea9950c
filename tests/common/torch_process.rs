//! Real `python -c 'import torch'` processes, and what they show from inside: which
//! libnccl.so files are mapped and which one libtorch_cuda.so's `nccl*` calls reach
//! (its GOT slots, read in the process). The probe is tests/support/torch_probe.py; the
//! venvs are made by `.ci/fetch-oracles` (FDL_TEST_TORCH_VENV, FDL_TEST_TORCH_VENV_28).
//! Also the fixtures those processes run against: an NCCL laid out as its wheel is, a
//! minimal NCCL env plugin, and hard-linked copies of a venv to change without touching
//! the cached one.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The probe run inside the process (see its header for what it reports).
pub const PROBE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/torch_probe.py");

/// How long one probe may run before it is killed and the test fails.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(120);

/// One `python -c` process to launch.
#[derive(Clone, Debug)]
pub struct Launch {
    /// The venv's `bin/python`.
    pub python: PathBuf,
    /// Its working directory: `python -c` puts `''` (this directory) first on sys.path.
    pub cwd: PathBuf,
    /// Variables set for it (after the test's own PYTHON*, LD_* and NCCL_* are cleared).
    pub env: Vec<(String, String)>,
    /// Further variables removed from the test's environment.
    pub remove: Vec<String>,
}

impl Launch {
    /// `venv/bin/python` run in `cwd` with nothing added to its environment.
    pub fn new(venv: &Path, cwd: &Path) -> Launch {
        Launch {
            python: venv.join("bin/python"),
            cwd: cwd.to_path_buf(),
            env: Vec::new(),
            remove: Vec::new(),
        }
    }

    /// Gives `cmd` the launch's environment: the test's own PYTHON*, LD_* and NCCL_*
    /// cleared, then the launch's variables (fdl is asked in the same environment).
    pub fn environ(&self, cmd: &mut Command) {
        for (key, _) in std::env::vars_os() {
            if let Some(key) = key.to_str() {
                if inherited_knob(key) {
                    cmd.env_remove(key);
                }
            }
        }
        for key in &self.remove {
            cmd.env_remove(key);
        }
        for (key, value) in &self.env {
            cmd.env(key, value);
        }
    }

    pub fn set(mut self, key: &str, value: impl AsRef<std::ffi::OsStr>) -> Launch {
        let value = value
            .as_ref()
            .to_str()
            .expect("a UTF-8 environment value")
            .to_string();
        self.env.push((key.to_string(), value));
        self
    }
}

/// What the probe saw in the process: the fields of its JSON object, and the process's
/// stdout and stderr (NCCL's log with NCCL_DEBUG set) to show when an assertion fails.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ProcessTruth {
    pub import_error: Option<String>,
    pub torch_version: Option<String>,
    pub torch_file: Option<String>,
    pub python: String,
    pub sys_path0: Option<String>,
    pub mapped_nccl: Vec<String>,
    pub libtorch_cuda: Option<String>,
    /// `nccl*` symbol imported by libtorch_cuda.so → the file its GOT slot points into.
    pub calls_reach: BTreeMap<String, String>,
    /// Slots that were not bound to one mapped file (the probe says why); empty when
    /// every call is bound.
    pub unbound: Vec<String>,
    /// ncclGetVersion of each mapped libnccl.so file, as 23007 for 2.30.7.
    pub nccl_versions: BTreeMap<String, u32>,
    pub unique_id_ok: bool,
    pub unique_id_error: Option<String>,
    pub env_plugin: Option<String>,
    pub net_plugin: Option<String>,
    #[serde(skip)]
    pub log: String,
}

impl ProcessTruth {
    /// [`ProcessTruth::mapped_nccl`] as a set: /proc/self/maps lists mappings by address,
    /// which says nothing of the order they were loaded in.
    pub fn mapped_set(&self) -> std::collections::BTreeSet<String> {
        self.mapped_nccl.iter().cloned().collect()
    }

    /// The one file all of libtorch_cuda's `nccl*` calls reach; panics (with the whole
    /// truth) when they are unbound, split over several files, or there are none.
    pub fn reached(&self) -> &str {
        let files: std::collections::BTreeSet<&str> =
            self.calls_reach.values().map(String::as_str).collect();
        assert!(
            self.unbound.is_empty() && files.len() == 1,
            "libtorch_cuda's nccl* calls do not all reach one file: {files:?}, unbound {:?}\n{self}",
            self.unbound
        );
        files.into_iter().next().unwrap()
    }
}

impl std::fmt::Display for ProcessTruth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "python {} (sys.path[0] {:?}), torch {:?}, import error {:?}",
            self.python, self.sys_path0, self.torch_version, self.import_error
        )?;
        writeln!(f, "mapped libnccl.so: {:?}", self.mapped_nccl)?;
        writeln!(f, "versions: {:?}", self.nccl_versions)?;
        let files: std::collections::BTreeSet<&String> = self.calls_reach.values().collect();
        writeln!(
            f,
            "{} nccl* calls of {:?} reach {files:?}; unbound {:?}",
            self.calls_reach.len(),
            self.libtorch_cuda,
            self.unbound
        )?;
        writeln!(
            f,
            "unique_id ok {} (error {:?}); env plugin {:?}; net plugin {:?}",
            self.unique_id_ok, self.unique_id_error, self.env_plugin, self.net_plugin
        )?;
        write!(f, "--- the process's output ---\n{}", self.log)
    }
}

/// True for the variables a probe never inherits from the test: they change which
/// libraries Python, the loader and NCCL pick, and each case sets its own.
fn inherited_knob(key: &str) -> bool {
    ["PYTHON", "LD_", "NCCL_"]
        .iter()
        .any(|prefix| key.starts_with(prefix))
}

/// Runs the probe in a fresh `python -c` as `launch` describes and returns what it saw;
/// panics when the process does not write its answer (a crash) or runs past
/// [`PROBE_TIMEOUT`] (killed).
pub fn run_probe(launch: &Launch) -> ProcessTruth {
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("truth.json");
    // A JSON string is a Python string literal too.
    let probe = serde_json::to_string(PROBE).unwrap();
    let mut cmd = Command::new(&launch.python);
    cmd.arg("-c")
        .arg(format!(
            "exec(compile(open({probe}).read(), {probe}, 'exec'))"
        ))
        .current_dir(&launch.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    launch.environ(&mut cmd);
    cmd.env("FDL_PROBE_OUT", &out);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", launch.python.display()));
    let reader = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let stdout = reader(Box::new(child.stdout.take().unwrap()));
    let stderr = reader(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = format!(
        "{}{}",
        stdout.join().unwrap_or_default(),
        stderr.join().unwrap_or_default()
    );
    let Some(status) = status else {
        panic!("the probe ran past {PROBE_TIMEOUT:?} and was killed: {launch:?}\n{log}",);
    };
    let text = std::fs::read_to_string(&out).unwrap_or_else(|e| {
        panic!("the probe wrote no answer ({e}; exit {status}): {launch:?}\n{log}")
    });
    let mut truth: ProcessTruth = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("the probe's answer is not its JSON ({e}): {text}\n{log}"));
    assert!(
        status.success(),
        "the probe answered but exited {status}: {launch:?}\n{log}"
    );
    truth.log = log;
    truth
}

/// A probe process kept alive after it answered (`FDL_PROBE_HOLD`): what it saw from
/// inside, and the process itself for a reader from outside. Dropping it closes its stdin,
/// kills and reaps it.
pub struct HeldProbe {
    pub child: std::process::Child,
    pub truth: ProcessTruth,
    _dir: tempfile::TempDir,
}

impl HeldProbe {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for HeldProbe {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the probe as [`run_probe`] does, but returns once it has answered, with the
/// process still running (waiting on its stdin).
pub fn hold_probe(launch: &Launch) -> HeldProbe {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("truth.json");
    let probe = serde_json::to_string(PROBE).unwrap();
    let log = dir.path().join("log");
    let mut cmd = Command::new(&launch.python);
    cmd.arg("-c")
        .arg(format!(
            "exec(compile(open({probe}).read(), {probe}, 'exec'))"
        ))
        .current_dir(&launch.cwd)
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(dir.path().join("err")).unwrap());
    launch.environ(&mut cmd);
    cmd.env("FDL_PROBE_OUT", &out).env("FDL_PROBE_HOLD", "1");
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", launch.python.display()));
    let mut held = HeldProbe {
        child,
        truth: ProcessTruth::default(),
        _dir: dir,
    };
    let deadline = Instant::now() + PROBE_TIMEOUT;
    loop {
        if let Ok(text) = std::fs::read_to_string(&out) {
            held.truth = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("the probe's answer is not its JSON ({e}): {text}"));
            return held;
        }
        if let Some(status) = held.child.try_wait().unwrap() {
            let err = std::fs::read_to_string(held._dir.path().join("err")).unwrap_or_default();
            panic!("the probe exited {status} before it answered: {launch:?}\n{err}");
        }
        assert!(
            Instant::now() < deadline,
            "the probe did not answer within {PROBE_TIMEOUT:?}: {launch:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `dest/nvidia/nccl/lib/libnccl.so.2`, a copy of the real `libnccl`: an NCCL laid out
/// as its wheel installs it, for a sys.path entry (PYTHONPATH, the cwd). Returns `dest`.
pub fn nccl_wheel_dir(dest: &Path, libnccl: &Path) -> PathBuf {
    let lib = dest.join("nvidia/nccl/lib");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::copy(libnccl, lib.join("libnccl.so.2"))
        .unwrap_or_else(|e| panic!("copy {}: {e}", libnccl.display()));
    dest.to_path_buf()
}

/// C source of an NCCL env plugin: `ncclEnvPlugin_v1`, the symbol NCCL's loader looks
/// up in `libnccl-env.so` (src/plugin/env: ncclEnv_v1_t is { name, init(major, minor,
/// patch, suffix), finalize(), getEnv(name) }; NCCL 2.30 and later look for v2 first,
/// then v1), whose init accepts and whose getEnv answers from the process environment.
pub const ENV_PLUGIN_SOURCE: &str = r#"#include <stdint.h>
#include <stdlib.h>
typedef struct {
  const char* name;
  int (*init)(uint8_t major, uint8_t minor, uint8_t patch, const char* suffix);
  int (*finalize)(void);
  const char* (*getEnv)(const char* name);
} ncclEnv_v1_t;
static int fdl_init(uint8_t major, uint8_t minor, uint8_t patch, const char* suffix) {
  (void)major; (void)minor; (void)patch; (void)suffix;
  return 0; /* ncclSuccess */
}
static int fdl_finalize(void) { return 0; }
static const char* fdl_get_env(const char* name) { return getenv(name); }
ncclEnv_v1_t ncclEnvPlugin_v1 = { "fdl-test-env", fdl_init, fdl_finalize, fdl_get_env };
"#;

/// Compiles [`ENV_PLUGIN_SOURCE`] into `dir/libnccl-env.so` and returns its path.
pub fn env_plugin(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let out = dir.join("libnccl-env.so");
    super::compile_shared(ENV_PLUGIN_SOURCE, &out, &[]);
    out
}

/// The venv's `lib/pythonX.Y/site-packages`.
pub fn site_packages(venv: &Path) -> PathBuf {
    let lib = venv.join("lib");
    let found: Vec<PathBuf> = std::fs::read_dir(&lib)
        .unwrap_or_else(|e| panic!("{}: {e}", lib.display()))
        .map(|e| e.unwrap().path().join("site-packages"))
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(found.len(), 1, "one lib/python*/site-packages in {lib:?}");
    found.into_iter().next().unwrap()
}

/// A temporary directory beside `venv` (same filesystem, so [`venv_copy`] can hard-link
/// into it), removed when dropped.
pub fn dir_beside(venv: &Path) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(".fdl-test-venv-")
        .tempdir_in(venv.parent().expect("a venv has a parent"))
        .unwrap()
}

/// `dest/venv`, a copy of `venv` made of hard links (`cp -al`): its files are the
/// cached venv's, its directories its own, so files can be added to it or removed from
/// it without touching the cached one (never write into a file of it). `dest` must be
/// on the venv's filesystem ([`dir_beside`]). The copy is still a venv: its pyvenv.cfg
/// sits beside bin/, and bin/python links to the base interpreter by absolute path.
pub fn venv_copy(venv: &Path, dest: &Path) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let dev = |p: &Path| std::fs::metadata(p).unwrap().dev();
    assert_eq!(
        dev(venv),
        dev(dest),
        "{} and {} are on different filesystems: hard links cannot join them",
        venv.display(),
        dest.display()
    );
    let copy = dest.join("venv");
    let status = Command::new("cp")
        .arg("-al")
        .arg(venv)
        .arg(&copy)
        .status()
        .expect("cp");
    assert!(
        status.success(),
        "cp -al {} {}",
        venv.display(),
        copy.display()
    );
    assert!(copy.join("pyvenv.cfg").is_file() && copy.join("bin/python").exists());
    copy
}

/// [`venv_copy`] minus `site-packages/nvidia/nccl`: torch installed without its NCCL
/// wheel. Returns the copy's root.
pub fn venv_without_nccl(venv: &Path, dest: &Path) -> PathBuf {
    let copy = venv_copy(venv, dest);
    let nccl = site_packages(&copy).join("nvidia/nccl");
    std::fs::remove_dir_all(&nccl).unwrap_or_else(|e| panic!("{}: {e}", nccl.display()));
    copy
}
