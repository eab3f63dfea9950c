//! `fdl nccl verify`: is an installed (or staged) NCCL build what its manifest says, and
//! will it run here?
//!
//! For an installed build, first reads every file again against the digests its manifest
//! recorded at seal ([`files`]), naming each that changed; an older manifest without them
//! gets "not recorded", never "ok". Then checks the layout and versions
//! ([`tree::check_tree`]), that the library holds SASS for
//! every arch of the plan and each local GPU (read from its fatbin headers), and that the
//! library really loads and `ncclGetVersion` answers the expected number. Loading happens
//! in a child process, so a library that crashes on load cannot take fdl down; no GPU is
//! needed for it.

use crate::arch::Arch;
use crate::gpu::{Driver, DriverCheck, Gpu, GpuError};
use crate::inspect::{self, Verdict};
use crate::nccl::files::{self, FileEntry};
use crate::nccl::plan::BuildPlan;
use crate::nccl::tree::{self, CheckedTree};
use crate::version::NcclVersion;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pass,
    /// Works, but not as well as it should (PTX JIT only: slow first start).
    Warn,
    Fail,
    /// Not run, and said so: never counted as a pass.
    Skipped,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(match self {
            Status::Pass => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
            Status::Skipped => "skipped",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub check: String,
    pub status: Status,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub build: String,
    pub dir: PathBuf,
    pub checks: Vec<Check>,
    /// How the build runs on this host's GPUs: a separate question from whether the build
    /// is what its plan says (a build may be made for other hosts), so it never makes
    /// [`Report::passed`] false.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub host_coverage: Vec<Check>,
    /// What the layout check established, when it passed; a build seals its manifest
    /// with it instead of checking the tree again.
    #[serde(skip)]
    pub checked: Option<CheckedTree>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }

    pub fn failures(&self) -> Vec<&Check> {
        self.checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .collect()
    }

    /// Whether every local GPU the report looked at has code in the build.
    pub fn covers_this_host(&self) -> bool {
        self.host_coverage.iter().all(|c| c.status != Status::Fail)
    }

    fn push(&mut self, check: impl Into<String>, status: Status, detail: impl Into<String>) {
        self.checks.push(Check {
            check: check.into(),
            status,
            detail: detail.into(),
        });
    }
}

/// Loads a library and returns what its `ncclGetVersion` answers.
pub type Probe<'a> = &'a dyn Fn(&Path) -> Result<i64>;

/// Which local GPUs to check coverage for.
#[derive(Clone, Copy)]
pub enum LocalGpus<'a> {
    Known(&'a [Gpu]),
    /// Wanted but unknown (no nvidia-smi): reported as skipped.
    Unknown,
    /// Not part of this verification (a build may be made for another host).
    NotChecked,
}

/// What to check a build against beyond its own plan.
pub struct Against<'a> {
    /// What the build's manifest recorded of its tree, when verifying an installed build.
    pub recorded: Option<&'a CheckedTree>,
    /// The manifest's record of every file ([`files`]), read against the tree when
    /// `recorded` is given; `None` there is an older manifest's "not recorded".
    pub files: Option<&'a [FileEntry]>,
    pub gpus: LocalGpus<'a>,
    /// This host's driver as `nvidia-smi` reads it, checked in the host section against
    /// the CUDA the library was built with; `None` when this host is not the question.
    pub driver: Option<&'a std::result::Result<Driver, GpuError>>,
    /// How to load the library; `None` reports the load check as skipped.
    pub probe: Option<Probe<'a>>,
}

/// Verifies the NCCL tree at `dir` built from `plan`.
pub fn verify(name: &str, dir: &Path, plan: &BuildPlan, against: &Against) -> Report {
    let mut r = Report {
        build: name.to_string(),
        dir: dir.to_path_buf(),
        checks: Vec::new(),
        host_coverage: Vec::new(),
        checked: None,
    };
    // A manifest's record means an installed build; without one the tree is staged.
    let stage = match against.recorded {
        Some(_) => tree::Stage::Installed,
        None => tree::Stage::Staged,
    };
    // The bytes first: a file copied over another keeps the names and versions the
    // layout check reads, and whatever else fails, the changed file is named.
    if against.recorded.is_some() {
        match against.files {
            Some(recorded) => match files::compare(dir, recorded) {
                Ok(c) if c.changes.is_empty() => r.push(
                    "files",
                    Status::Pass,
                    format!(
                        "every byte of the {} files ({:.1} MiB) is what the manifest recorded",
                        c.files,
                        c.bytes as f64 / (1024.0 * 1024.0)
                    ),
                ),
                Ok(c) => {
                    let shown: Vec<&str> = c.changes.iter().take(5).map(String::as_str).collect();
                    let more = match c.changes.len().saturating_sub(5) {
                        0 => String::new(),
                        n => format!("; and {n} more"),
                    };
                    r.push(
                        "files",
                        Status::Fail,
                        format!(
                            "changed since the build was sealed: {}{more}. Rebuild it (`fdl nccl build --force` with the same flags; from the build store when it has it)",
                            shown.join("; ")
                        ),
                    )
                }
                Err(e) => r.push("files", Status::Fail, format!("{e:#}")),
            },
            None => r.push(
                "files",
                Status::Skipped,
                "not recorded: this build's manifest was written before fdl recorded each file's digest, so its bytes cannot be checked. Rebuild it (`fdl nccl build --force`) to record them",
            ),
        }
    }
    let checked = match tree::check_tree(dir, plan, stage) {
        Ok(c) => {
            r.push(
                "layout",
                Status::Pass,
                format!(
                    "lib/libnccl.so → libnccl.so.2 → {}; nccl.h says {}; the library identifies as {}",
                    c.library, c.header_version, c.embedded_version
                ),
            );
            c
        }
        Err(e) => {
            r.push("layout", Status::Fail, format!("{e:#}"));
            return r;
        }
    };
    if let Some(recorded) = against.recorded {
        if *recorded == checked {
            r.push(
                "manifest",
                Status::Pass,
                format!(
                    "agrees: NCCL {}, {}",
                    checked.header_version, checked.library
                ),
            );
        } else {
            r.push(
                "manifest",
                Status::Fail,
                format!(
                    "the manifest recorded NCCL {} in {}, the files now say NCCL {} in {}: the build was changed after install",
                    recorded.header_version, recorded.library, checked.header_version, checked.library
                ),
            );
        }
    }
    let lib = dir.join("lib").join(&checked.library);
    match inspect::inspect(&lib) {
        Ok(ins) => {
            for &arch in &plan.archs {
                let (status, detail) = sass_verdict(&ins.gpu_code, arch, true);
                r.push(format!("sass {arch}"), status, detail);
            }
            match against.gpus {
                LocalGpus::Known(gpus) => {
                    for g in gpus {
                        let (status, mut detail) =
                            sass_verdict(&ins.gpu_code, g.compute_cap, false);
                        if status == Status::Fail && !plan.archs.contains(&g.compute_cap) {
                            detail.push_str(&format!(
                                ": the build's plan leaves {} out; for this host, build with --archs naming it",
                                g.compute_cap
                            ));
                        }
                        r.host_coverage.push(Check {
                            check: format!("gpu {} ({})", g.index, g.name),
                            status,
                            detail,
                        });
                    }
                }
                LocalGpus::Unknown => r.host_coverage.push(Check {
                    check: "local gpus".into(),
                    status: Status::Skipped,
                    detail: "not checked: the local GPUs are unknown (nvidia-smi unavailable)"
                        .into(),
                }),
                LocalGpus::NotChecked => {}
            }
            if let Some(driver) = against.driver {
                r.host_coverage.push(driver_verdict(driver, &ins, plan));
            }
        }
        Err(e) => r.push(
            "gpu code",
            Status::Fail,
            format!("cannot read the GPU code of {}: {e:#}", lib.display()),
        ),
    }
    match against.probe {
        Some(probe) => {
            let expected = checked.header_version.code() as i64;
            match probe(&dir.join("lib").join("libnccl.so.2")) {
                Ok(code) if code == expected => r.push(
                    "load",
                    Status::Pass,
                    format!(
                        "loads; ncclGetVersion() = {code} (NCCL {})",
                        NcclVersion::from_code(code as u64)
                    ),
                ),
                Ok(code) => r.push(
                    "load",
                    Status::Fail,
                    format!(
                        "ncclGetVersion() = {code}, expected {expected} for NCCL {}",
                        checked.header_version
                    ),
                ),
                Err(e) => r.push("load", Status::Fail, format!("{e:#}")),
            }
        }
        None => r.push(
            "load",
            Status::Skipped,
            "not run: no way to load the library was given",
        ),
    }
    r.checked = Some(checked);
    r
}

/// This host's driver against the CUDA the library names in its self-id (the plan's
/// when it names none), by the rule every NCCL choice uses ([`DriverCheck`]). A driver
/// that cannot be read is `skipped`: the check was not made, which is no finding.
fn driver_verdict(
    driver: &std::result::Result<Driver, GpuError>,
    ins: &inspect::Inspection,
    plan: &BuildPlan,
) -> Check {
    let cuda = ins.nccl.as_ref().map_or(plan.cuda, |n| n.cuda);
    let check = DriverCheck::of("this host", driver, cuda, "the build");
    let status = match &check {
        DriverCheck::Runs(_) => Status::Pass,
        DriverCheck::MinorCompat(_) => Status::Warn,
        DriverCheck::TooOld(_) => Status::Fail,
        DriverCheck::Unknown(_) => Status::Skipped,
    };
    Check {
        check: "driver".into(),
        status,
        detail: check.text().to_string(),
    }
}

fn sass_verdict(code: &inspect::GpuCode, arch: Arch, planned: bool) -> (Status, String) {
    let verdict = inspect::coverage(code, arch);
    match verdict {
        Verdict::Native { .. } => (
            Status::Pass,
            format!(
                "native SASS ({}) for {arch}",
                verdict.sass_text().unwrap_or_default()
            ),
        ),
        Verdict::PtxJit { ptx } if planned => (
            Status::Fail,
            format!("no SASS for {arch}, which the build was planned for; only PTX {ptx} (JIT)"),
        ),
        Verdict::PtxJit { ptx } => (
            Status::Warn,
            format!("PTX JIT only ({ptx}) for {arch}: works, slow first start"),
        ),
        Verdict::NotCovered => (Status::Fail, format!("no GPU code runs on {arch}")),
    }
}

/// Loads `lib` in this process and calls `ncclGetVersion`. Only for the hidden
/// `fdl __probe-nccl` subcommand, which runs it in a child: a broken library may crash.
pub fn probe_in_process(lib: &Path) -> Result<i64> {
    use std::ffi::{CStr, CString};
    use std::os::unix::ffi::OsStrExt;
    let c_path =
        CString::new(lib.as_os_str().as_bytes()).context("library path holds a NUL byte")?;
    // SAFETY: dlopen/dlsym with valid C strings; the symbol is called with the signature
    // NCCL documents (`ncclResult_t ncclGetVersion(int *version)`).
    unsafe {
        // Rust's runtime handles SIGSEGV/SIGBUS to report stack overflows and lets some
        // faults pass; here any fault of the library must end this (child) process.
        libc::signal(libc::SIGSEGV, libc::SIG_DFL);
        libc::signal(libc::SIGBUS, libc::SIG_DFL);
        let handle = libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if handle.is_null() {
            let err = libc::dlerror();
            let msg = if err.is_null() {
                "unknown error".to_string()
            } else {
                CStr::from_ptr(err).to_string_lossy().into_owned()
            };
            bail!("dlopen failed: {msg}");
        }
        let sym = libc::dlsym(handle, c"ncclGetVersion".as_ptr());
        if sym.is_null() {
            bail!(
                "{} has no ncclGetVersion symbol: not an NCCL library",
                lib.display()
            );
        }
        let get: extern "C" fn(*mut libc::c_int) -> libc::c_int = std::mem::transmute(sym);
        let mut version: libc::c_int = 0;
        let rc = get(&mut version);
        if rc != 0 {
            bail!("ncclGetVersion returned error {rc}");
        }
        Ok(version as i64)
    }
}

/// The hidden subcommand that [`probe_in_child`] runs.
pub const PROBE_SUBCOMMAND: &str = "__probe-nccl";
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `exe __probe-nccl lib` and reads the version it prints. A crash or hang of the
/// library ends the child, not fdl.
pub fn probe_in_child(exe: &Path, lib: &Path) -> Result<i64> {
    use std::os::unix::process::ExitStatusExt;
    let out_file = tempfile::tempfile()?;
    let err_file = tempfile::tempfile()?;
    let mut child = std::process::Command::new(exe)
        .arg(PROBE_SUBCOMMAND)
        .arg(lib)
        .stdin(std::process::Stdio::null())
        .stdout(out_file.try_clone()?)
        .stderr(err_file.try_clone()?)
        .spawn()
        .with_context(|| format!("cannot start {} to load the library", exe.display()))?;
    let start = Instant::now();
    // From 1 ms up to 20 ms: the load takes a few ms, and is seen when it ends.
    let mut pause = Duration::from_millis(1);
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if crate::process::interrupted() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(crate::process::Interrupted.into());
        }
        if start.elapsed() > PROBE_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "loading {} did not finish within {}s",
                lib.display(),
                PROBE_TIMEOUT.as_secs()
            );
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    };
    let read = |mut f: std::fs::File| {
        use std::io::{Read, Seek};
        let mut s = String::new();
        let _ = f.rewind();
        let _ = f.take(64 * 1024).read_to_string(&mut s);
        s
    };
    let (stdout, stderr) = (read(out_file), read(err_file));
    if let Some(sig) = status.signal() {
        bail!(
            "loading {} crashed the loader process (signal {sig})",
            lib.display()
        );
    }
    if !status.success() {
        bail!(
            "cannot load {}: {}",
            lib.display(),
            stderr.trim().trim_start_matches("error: ")
        );
    }
    stdout.trim().parse().map_err(|_| {
        anyhow!(
            "the loader process printed '{}', not a version number",
            stdout.trim()
        )
    })
}
