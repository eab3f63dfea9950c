//! Finding what a native build needs: the CUDA toolkit (through its nvcc), make, a C++
//! compiler, python3 and, for clones, git. Nothing here builds; it looks at the host and
//! asks nvcc two questions (`--version`, `--list-gpu-arch`), so the plan can refuse a
//! toolkit that does not fit before anything slow starts.
//!
//! The lookups read the environment through [`HostEnv`], so the unit tests can give each
//! case its own PATH and CUDA_HOME without touching the test process's environment.

use crate::arch::Arch;
use crate::nccl::plan::Toolkit;
use crate::process;
use crate::version::CudaVersion;
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The parts of the environment discovery reads.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostEnv {
    pub path: Option<OsString>,
    pub cuda_home: Option<OsString>,
    /// `$CXX`: the user's choice of C++ compiler wins over our guesses.
    pub cxx: Option<OsString>,
}

impl HostEnv {
    pub fn current() -> HostEnv {
        let non_empty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        HostEnv {
            path: non_empty("PATH"),
            cuda_home: non_empty("CUDA_HOME"),
            cxx: non_empty("CXX"),
        }
    }
}

/// What the host offers for a native build, and what it lacks.
#[derive(Debug, Clone, Default)]
pub struct ToolchainReport {
    pub toolkit: Option<Toolkit>,
    /// make, c++, python3, git: each found one.
    pub tools: std::collections::BTreeMap<String, PathBuf>,
    /// One entry per missing tool, saying what to install or set.
    pub missing: Vec<String>,
}

impl ToolchainReport {
    pub fn is_complete(&self) -> bool {
        self.toolkit.is_some() && self.missing.is_empty()
    }
}

/// Looks for nvcc (`--cuda-home`, else `$CUDA_HOME`, else PATH), make, a C++ compiler,
/// python3 and, when `need_git`, git.
pub fn discover(cuda_home: Option<&Path>, need_git: bool) -> ToolchainReport {
    discover_in(&HostEnv::current(), cuda_home, need_git)
}

pub(crate) fn discover_in(
    env: &HostEnv,
    cuda_home: Option<&Path>,
    need_git: bool,
) -> ToolchainReport {
    let mut report = ToolchainReport::default();
    match find_toolkit(env, cuda_home) {
        Ok(toolkit) => {
            report.missing.extend(compile_needs(&toolkit));
            report.toolkit = Some(toolkit);
        }
        Err(why) => report.missing.push(why),
    }
    let mut found = |key: &str, result: Result<PathBuf, String>| match result {
        Ok(path) => {
            report.tools.insert(key.to_string(), path);
        }
        Err(why) => report.missing.push(why),
    };
    found(
        "make",
        which("make", env).ok_or_else(|| {
            "make: not found on PATH. Install GNU make (e.g. `apt install make`)".to_string()
        }),
    );
    found("c++", find_cxx(env));
    found(
        "python3",
        which("python3", env).ok_or_else(|| {
            "python3: not found on PATH. NCCL 2.19 and later generate their kernel sources with it; install Python 3 (e.g. `apt install python3`)".to_string()
        }),
    );
    if need_git {
        found(
            "git",
            which("git", env).ok_or_else(|| {
                "git: not found on PATH, and it is needed to clone NCCL. Install git (e.g. `apt install git`), or pass --source DIR with an NCCL checkout or unpacked release".to_string()
            }),
        );
    }
    report
}

/// What NCCL's makefiles (`makefiles/common.mk`) take from the toolkit besides nvcc:
/// the headers under `CUDA_INC=$(CUDA_HOME)/include` (`cuda.h`, `cuda_runtime.h`, and
/// the `crt/` headers nvcc itself includes), `-lcudart_static` from `CUDA_LIB` (the
/// directory fdl passes, [`lib_dir`]), and nvcc's device front end (`nvvm/bin/cicc`).
/// Each file is looked for; a missing one is named with the package that provides it
/// (as the `nvidia-cuda-*` wheels split a toolkit), so a home holding only
/// `nvidia-cuda-nvcc` is refused when planned, not in the compiler tens of seconds in.
pub(crate) fn compile_needs(toolkit: &Toolkit) -> Vec<String> {
    let home = &toolkit.cuda_home;
    let lib = &toolkit.lib_dir;
    let has = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_file());
    let has_cudart = has(&lib.join("libcudart_static.a"))
        || std::fs::read_dir(lib).is_ok_and(|rd| {
            rd.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("libcudart.so"))
        });
    // (what is missing, what provides it)
    let mut lacks: Vec<(String, &str)> = Vec::new();
    let runtime = "the CUDA runtime: the `nvidia-cuda-runtime` wheel (`nvidia-cuda-runtime-cu12` for CUDA 12) or the toolkit's cudart package (e.g. `cuda-cudart-dev`)";
    for header in ["cuda_runtime.h", "cuda.h"] {
        if !has(&home.join("include").join(header)) {
            lacks.push((format!("include/{header}"), runtime));
        }
    }
    if !has_cudart {
        lacks.push((
            format!(
                "{}/libcudart_static.a (or libcudart.so)",
                lib.strip_prefix(home).unwrap_or(lib).display()
            ),
            runtime,
        ));
    }
    if !has(&home.join("include/crt/host_config.h")) {
        lacks.push((
            "include/crt/host_config.h".into(),
            "nvcc's own headers: the `nvidia-cuda-crt` wheel (in CUDA 12 they come with `nvidia-cuda-nvcc-cu12`) or the toolkit's `cuda-crt` package",
        ));
    }
    if !has(&home.join("nvvm/bin/cicc")) {
        lacks.push((
            "nvvm/bin/cicc".into(),
            "nvcc's device compiler: the `nvidia-nvvm` wheel (in CUDA 12 it comes with `nvidia-cuda-nvcc-cu12`) or the toolkit's `cuda-nvvm` package",
        ));
    }
    let mut by_provider: Vec<(&str, Vec<String>)> = Vec::new();
    for (file, provider) in lacks {
        match by_provider.iter_mut().find(|(p, _)| *p == provider) {
            Some((_, files)) => files.push(file),
            None => by_provider.push((provider, vec![file])),
        }
    }
    by_provider
        .into_iter()
        .map(|(provider, files)| {
            format!(
                "CUDA toolkit at {}: lacks {}, which NCCL's compile needs; install {provider} into the same directory (pip puts every `nvidia-cuda-*` wheel of one CUDA in one), or point --cuda-home at a complete toolkit",
                home.display(),
                files.join(", ")
            )
        })
        .collect()
}

/// `$CXX` when set (as NCCL's makefiles would use it), else the usual names. The one
/// found is handed to make as `CXX`, so nvcc's `-ccbin $(CXX)` and the host compiles use
/// the compiler that was checked here rather than make's built-in `g++`.
fn find_cxx(env: &HostEnv) -> Result<PathBuf, String> {
    if let Some(cxx) = &env.cxx {
        let name = Path::new(cxx);
        let found = if name.components().count() > 1 {
            is_executable(name).then(|| name.to_path_buf())
        } else {
            which(&cxx.to_string_lossy(), env)
        };
        return found.ok_or_else(|| {
            format!(
                "c++: $CXX is '{}', which is not an executable on PATH. Set CXX to your C++ compiler, or unset it to use g++/c++/clang++",
                cxx.to_string_lossy()
            )
        });
    }
    ["g++", "c++", "clang++"]
        .iter()
        .find_map(|name| which(name, env))
        .ok_or_else(|| {
            "c++: no C++ compiler (g++, c++ or clang++) on PATH. Install one (e.g. `apt install g++`), or set CXX".to_string()
        })
}

/// The toolkit around the nvcc that `--cuda-home`, `$CUDA_HOME` or PATH names, in that
/// order. An explicit directory without nvcc is an error, not a reason to look further:
/// building with another toolkit than the one named would be a surprise.
fn find_toolkit(env: &HostEnv, flag: Option<&Path>) -> Result<Toolkit, String> {
    let (home, nvcc) = if let Some(dir) = flag {
        let home = absolute(dir);
        check_home(&home, "--cuda-home", "point --cuda-home at")?
    } else if let Some(dir) = &env.cuda_home {
        let home = absolute(Path::new(dir));
        check_home(
            &home,
            "$CUDA_HOME",
            "fix or unset CUDA_HOME, or pass --cuda-home with",
        )?
    } else if let Some(found) = which("nvcc", env) {
        // /usr/local/bin/nvcc is often a link into the toolkit: its real place says
        // where the toolkit (and its include/ and lib dirs) is.
        let real = std::fs::canonicalize(&found).unwrap_or(found);
        let home = real
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .ok_or_else(|| format!("nvcc: {} is not inside a toolkit", real.display()))?;
        (home, real)
    } else {
        return Err("nvcc: not found. Pass --cuda-home DIR (a CUDA toolkit, with DIR/bin/nvcc), set CUDA_HOME, or put nvcc on PATH; NVIDIA's CUDA installer provides one, and so does `pip install nvidia-cuda-nvcc nvidia-cuda-runtime nvidia-cuda-crt nvidia-nvvm nvidia-cuda-cccl` (all five: nvcc alone compiles no NCCL; CUDA_HOME is then site-packages/nvidia/cu13)".to_string());
    };
    let version_text = ask(&nvcc, "--version", &format!("{} --version", nvcc.display()))
        .map_err(|e| format!("nvcc: {e:#}. Is {} a working CUDA toolkit?", home.display()))?;
    let cuda = parse_nvcc_version(&version_text).ok_or_else(|| {
        format!(
            "nvcc: `{} --version` did not say which CUDA release it is (no 'release X.Y' line); is it really nvcc?",
            nvcc.display()
        )
    })?;
    // Old nvcc (before CUDA 11) has no --list-gpu-arch; the plan then falls back to the
    // support table, so a failure here is not an error.
    let gpu_archs = ask(&nvcc, "--list-gpu-arch", "nvcc --list-gpu-arch")
        .ok()
        .and_then(|text| parse_gpu_archs(&text));
    Ok(Toolkit {
        lib_dir: lib_dir(&home),
        cuda_home: home,
        nvcc,
        cuda,
        gpu_archs,
    })
}

/// What `program arg` prints (stdin closed), asked once per process for one file: the
/// plan's discovery and the store key both ask nvcc `--version`, and the plan view and
/// the build both want the key. The answer is kept for the program's file as it is now
/// (device, inode, size, mtime), so a compiler replaced in between is asked again; only
/// answers of a successful run are kept.
pub fn ask(program: &Path, arg: &'static str, what: &str) -> anyhow::Result<String> {
    use std::collections::HashMap;
    use std::os::unix::fs::MetadataExt;
    use std::sync::{Mutex, OnceLock};
    type Asked = HashMap<(PathBuf, &'static str, u64, u64, u64, i64, i64), String>;
    static ASKED: OnceLock<Mutex<Asked>> = OnceLock::new();
    // A bare name is found on PATH by the run itself: not kept.
    let id = std::fs::metadata(program).ok().map(|m| {
        (
            program.to_path_buf(),
            arg,
            m.dev(),
            m.ino(),
            m.len(),
            m.mtime(),
            m.mtime_nsec(),
        )
    });
    let asked = ASKED.get_or_init(Default::default);
    if let Some(id) = &id {
        let known = asked.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(text) = known.get(id) {
            return Ok(text.clone());
        }
    }
    let mut cmd = Command::new(program);
    cmd.arg(arg).stdin(std::process::Stdio::null());
    let text = process::capture(&mut cmd, what)?;
    if let Some(id) = id {
        asked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, text.clone());
    }
    Ok(text)
}

fn check_home(home: &Path, origin: &str, fix: &str) -> Result<(PathBuf, PathBuf), String> {
    let nvcc = home.join("bin").join("nvcc");
    if !home.is_dir() {
        return Err(format!(
            "nvcc: {origin} is {}, which is not a directory; {fix} a CUDA toolkit (the directory holding bin/nvcc)",
            home.display()
        ));
    }
    if !is_executable(&nvcc) {
        return Err(format!(
            "nvcc: {origin} is {}, but {} is missing or not executable; {fix} a CUDA toolkit (the directory holding bin/nvcc)",
            home.display(),
            nvcc.display()
        ));
    }
    Ok((home.to_path_buf(), nvcc))
}

/// NVIDIA's installers put the libraries in `lib64/`; the `nvidia-cuda-*` PyPI wheels
/// (and some distributions) in `lib/`. The nvcc wheel alone has neither — the runtime
/// wheel adds `lib/` beside it — so anything without `lib64/` is taken as that layout.
fn lib_dir(home: &Path) -> PathBuf {
    let lib64 = home.join("lib64");
    if lib64.is_dir() {
        lib64
    } else {
        home.join("lib")
    }
}

/// `Cuda compilation tools, release 12.8, V12.8.93` → 12.8.93. The `V` part carries the
/// patch level; when it is missing or disagrees with the release, the release wins.
pub fn parse_nvcc_version(text: &str) -> Option<CudaVersion> {
    let line = text.lines().find(|l| l.contains("release "))?;
    let after = line.split_once("release ")?.1;
    let (release, rest) = after.split_once(',').unwrap_or((after, ""));
    let release: CudaVersion = release.trim().parse().ok()?;
    let full = rest
        .trim()
        .strip_prefix('V')
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<CudaVersion>().ok())
        .filter(|v| v.major_minor() == release.major_minor() && v.patch.is_some());
    Some(full.unwrap_or(release))
}

/// `nvcc --list-gpu-arch` prints one `compute_XY` per line. Entries with a suffix
/// (`compute_90a`) are variants of an arch listed plainly too, so they are skipped.
/// Archs fdl does not know yet are kept: the list is what this nvcc offers.
pub fn parse_gpu_archs(text: &str) -> Option<Vec<Arch>> {
    let mut archs: Vec<Arch> = text
        .split_whitespace()
        .filter_map(|t| t.strip_prefix("compute_"))
        .filter(|d| (2..=3).contains(&d.len()) && d.bytes().all(|b| b.is_ascii_digit()))
        .filter_map(|d| d.parse().ok())
        .map(Arch::from_number)
        .collect();
    archs.sort();
    archs.dedup();
    (!archs.is_empty()).then_some(archs)
}

/// The first executable `name` in the PATH of `env` ([`crate::process::which_in`]).
pub(crate) fn which(name: &str, env: &HostEnv) -> Option<PathBuf> {
    crate::process::which_in(name, env.path.as_deref())
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NVCC_12_8: &str = "nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2025 NVIDIA Corporation\nBuilt on Fri_Feb_21_20:23:50_PST_2025\nCuda compilation tools, release 12.8, V12.8.93\nBuild cuda_12.8.r12.8/compiler.35583870_0\n";

    #[test]
    fn nvcc_version_with_and_without_patch() {
        assert_eq!(
            parse_nvcc_version(NVCC_12_8).unwrap().to_string(),
            "12.8.93"
        );
        assert_eq!(
            parse_nvcc_version("Cuda compilation tools, release 11.0, V11.0.221")
                .unwrap()
                .to_string(),
            "11.0.221"
        );
        // A V part that disagrees with the release is not trusted.
        assert_eq!(
            parse_nvcc_version("Cuda compilation tools, release 12.4, V12.5.1")
                .unwrap()
                .to_string(),
            "12.4"
        );
        assert_eq!(
            parse_nvcc_version("Cuda compilation tools, release 10.2")
                .unwrap()
                .to_string(),
            "10.2"
        );
        assert_eq!(parse_nvcc_version("gcc (Debian 12.2.0-14) 12.2.0"), None);
        assert_eq!(parse_nvcc_version("release twelve, V1"), None);
    }

    #[test]
    fn gpu_arch_list() {
        let text = "compute_75\ncompute_80\ncompute_86\ncompute_90\ncompute_90a\ncompute_100\ncompute_120\ncompute_121\n";
        let archs = parse_gpu_archs(text).unwrap();
        let names: Vec<String> = archs.iter().map(|a| a.to_string()).collect();
        assert_eq!(
            names,
            ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "sm_121"]
        );
        assert_eq!(
            parse_gpu_archs("nvcc fatal : Unknown option '--list-gpu-arch'"),
            None
        );
        assert_eq!(parse_gpu_archs(""), None);
    }

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    fn fake_toolkit(home: &Path, lib: &str) {
        fake_nvcc_only(home, lib);
        for file in [
            "include/cuda_runtime.h",
            "include/cuda.h",
            "include/crt/host_config.h",
            "nvvm/bin/cicc",
        ] {
            std::fs::create_dir_all(home.join(file).parent().unwrap()).unwrap();
            std::fs::write(home.join(file), "").unwrap();
        }
        std::fs::write(home.join(lib).join("libcudart.so.12"), "").unwrap();
    }

    /// A toolkit holding nvcc and nothing else, as the `nvidia-cuda-nvcc` wheel alone.
    fn fake_nvcc_only(home: &Path, lib: &str) {
        std::fs::create_dir_all(home.join("bin")).unwrap();
        std::fs::create_dir_all(home.join(lib)).unwrap();
        script(
            &home.join("bin"),
            "nvcc",
            "case \"$1\" in\n--version) echo 'Cuda compilation tools, release 12.8, V12.8.93' ;;\n--list-gpu-arch) printf 'compute_75\\ncompute_86\\n' ;;\n*) exit 1 ;;\nesac",
        );
    }

    #[test]
    fn tools_are_found_on_path_and_missing_ones_named() {
        let t = tempfile::tempdir().unwrap();
        let bin = t.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        for tool in ["make", "clang++", "python3"] {
            script(&bin, tool, "exit 0");
        }
        // Not executable: must not count.
        std::fs::write(bin.join("git"), "").unwrap();
        let home = t.path().join("cuda");
        fake_toolkit(&home, "lib64");
        let env = HostEnv {
            path: Some(bin.clone().into_os_string()),
            cuda_home: Some(home.clone().into_os_string()),
            cxx: None,
        };
        let r = discover_in(&env, None, true);
        let tk = r.toolkit.as_ref().unwrap();
        assert_eq!(tk.cuda.to_string(), "12.8.93");
        assert_eq!(tk.nvcc, home.join("bin/nvcc"));
        assert_eq!(tk.lib_dir, home.join("lib64"));
        assert_eq!(tk.gpu_archs.as_ref().unwrap().len(), 2);
        assert_eq!(r.tools["c++"], bin.join("clang++"));
        assert_eq!(r.missing.len(), 1, "{:?}", r.missing);
        assert!(r.missing[0].starts_with("git:"), "{:?}", r.missing);
        assert!(!r.is_complete());
        // Without git needed, it is complete.
        assert!(discover_in(&env, None, false).is_complete());

        // Nothing on PATH: every tool is named.
        let empty = HostEnv {
            path: Some(t.path().join("nowhere").into_os_string()),
            ..HostEnv::default()
        };
        let r = discover_in(&empty, None, true);
        let names: Vec<&str> = r
            .missing
            .iter()
            .map(|m| m.split(':').next().unwrap())
            .collect();
        assert_eq!(names, ["nvcc", "make", "c++", "python3", "git"]);
        assert!(r.missing[0].contains("--cuda-home"), "{}", r.missing[0]);
    }

    /// A home with nvcc alone cannot compile NCCL: each missing file is named with the
    /// package that provides it, one line per package, and the report is incomplete.
    #[test]
    fn a_toolkit_without_what_the_compile_needs_is_incomplete_and_says_what_to_install() {
        let t = tempfile::tempdir().unwrap();
        let bin = t.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        for tool in ["make", "g++", "python3"] {
            script(&bin, tool, "exit 0");
        }
        let home = t.path().join("cu13");
        fake_nvcc_only(&home, "lib");
        let env = HostEnv {
            path: Some(bin.into_os_string()),
            cuda_home: None,
            cxx: None,
        };
        let r = discover_in(&env, Some(&home), false);
        assert!(r.toolkit.is_some(), "nvcc itself is found");
        assert!(!r.is_complete());
        assert_eq!(r.missing.len(), 3, "{:#?}", r.missing);
        assert!(
            r.missing[0].contains("include/cuda_runtime.h, include/cuda.h, lib/libcudart_static.a")
                && r.missing[0].contains("`nvidia-cuda-runtime`"),
            "{}",
            r.missing[0]
        );
        assert!(
            r.missing[1].contains("crt/host_config.h")
                && r.missing[1].contains("`nvidia-cuda-crt`")
        );
        assert!(r.missing[2].contains("nvvm/bin/cicc") && r.missing[2].contains("`nvidia-nvvm`"));
        fake_toolkit(&home, "lib");
        assert!(discover_in(&env, Some(&home), false).is_complete());
    }

    #[test]
    fn toolkit_precedence_and_layouts() {
        let t = tempfile::tempdir().unwrap();
        let flag_home = t.path().join("flag");
        fake_toolkit(&flag_home, "lib");
        let env_home = t.path().join("env");
        std::fs::create_dir_all(&env_home).unwrap();
        let env = HostEnv {
            path: None,
            cuda_home: Some(env_home.clone().into_os_string()),
            cxx: None,
        };
        // --cuda-home wins over $CUDA_HOME; the wheels' lib/ layout is recognized.
        let tk = find_toolkit(&env, Some(&flag_home)).unwrap();
        assert_eq!(tk.cuda_home, flag_home);
        assert_eq!(tk.lib_dir, flag_home.join("lib"));
        // A $CUDA_HOME without nvcc is reported, not skipped.
        let err = find_toolkit(&env, None).unwrap_err();
        assert!(
            err.contains("$CUDA_HOME") && err.contains("bin/nvcc"),
            "{err}"
        );
        // nvcc on PATH, through a symlink: the toolkit is where the link points.
        let links = t.path().join("links");
        std::fs::create_dir_all(&links).unwrap();
        std::os::unix::fs::symlink(flag_home.join("bin/nvcc"), links.join("nvcc")).unwrap();
        let env = HostEnv {
            path: Some(links.into_os_string()),
            ..HostEnv::default()
        };
        let tk = find_toolkit(&env, None).unwrap();
        assert_eq!(tk.cuda_home, flag_home.canonicalize().unwrap());
        // An nvcc that is not one.
        let bad = t.path().join("bad");
        std::fs::create_dir_all(bad.join("bin")).unwrap();
        script(&bad.join("bin"), "nvcc", "echo hello");
        let err = find_toolkit(&HostEnv::default(), Some(&bad)).unwrap_err();
        assert!(err.contains("did not say which CUDA release"), "{err}");
    }

    #[test]
    fn cxx_from_the_environment() {
        let t = tempfile::tempdir().unwrap();
        let cc = script(t.path(), "my-g++", "exit 0");
        let env = HostEnv {
            path: Some(t.path().as_os_str().to_owned()),
            cuda_home: None,
            cxx: Some("my-g++".into()),
        };
        assert_eq!(find_cxx(&env).unwrap(), cc);
        let env = HostEnv {
            cxx: Some(cc.clone().into_os_string()),
            ..HostEnv::default()
        };
        assert_eq!(find_cxx(&env).unwrap(), cc);
        let env = HostEnv {
            cxx: Some("no-such-compiler".into()),
            ..env
        };
        assert!(find_cxx(&env)
            .unwrap_err()
            .contains("$CXX is 'no-such-compiler'"));
    }
}
