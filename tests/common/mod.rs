//! Shared fixtures for the CLI tests: project layouts, real shared libraries compiled
//! with the system C compiler, a stand-in `nvidia-smi`, and a file-tree snapshot to prove
//! a failed command wrote nothing.
#![allow(dead_code)]

pub mod oracle;
pub mod schema;
pub mod torch_process;

use assert_cmd::Command;
use fdl::arch::parse_arch_list;
use fdl::lock::Wait;
use fdl::nccl::backend::Backend;
use fdl::nccl::plan::{
    ArchOrigin, BackendInputs, BuildPlan, DockerfileSpec, PlanInputs, TagOrigin,
};
use fdl::nccl::store::BuildStore;
use fdl::nccl::tag::Tag;
use fdl::pipeline::{execute, ExecOptions};
use fdl::progress::{Progress, Verbosity};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub fn fdl() -> Command {
    let mut cmd = Command::cargo_bin("fdl").unwrap();
    cmd.env_remove("FDL_ROOT");
    cmd
}

/// A command's stdout as JSON; a panic that shows both streams otherwise.
pub fn json_of(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}):\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// `fdl --root ROOT …`
pub fn fdl_in(root: &Path) -> Command {
    let mut cmd = fdl();
    cmd.arg("--root").arg(root);
    cmd
}

/// Compiles `c_source` into a shared library at `out` with the system C compiler.
pub fn compile_shared(c_source: &str, out: &Path, extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("lib.c");
    std::fs::write(&src, c_source).unwrap();
    let status = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(out)
        .arg(&src)
        .args(extra)
        .status()
        .expect("a C compiler (cc) is needed for these tests");
    assert!(status.success(), "cc failed for {}", out.display());
}

/// C source of a library that identifies itself like NCCL does.
pub fn nccl_like_source(version: (u32, u32, u32), cuda: &str) -> String {
    let (x, y, z) = version;
    format!(
        r#"const char fdl_test_version_string[] = "NCCL version {x}.{y}.{z}+cuda{cuda}";
int ncclGetVersion(int *v) {{ *v = {code}; return 0; }}
"#,
        code = x * 10000 + y * 100 + z
    )
}

/// C source of a `.nv_fatbin` section holding one SASS cubin per arch number (`61`,
/// `120`), made by fdl's own synthesizer — the layout cuobjdump reads — so a library
/// compiled from it carries GPU code fdl's inspection finds, as nvcc-built ones do.
pub fn fatbin_c_source(archs: &[u32], symbol: &str) -> String {
    use fdl::arch::{Arch, GpuTarget};
    use fdl_synth::{self as synth, Entry, Kind, Spec};
    use object::{Object, ObjectSection};
    let spec = Spec {
        entries: archs
            .iter()
            .map(|&n| Entry {
                kind: Kind::Sass,
                target: GpuTarget::generic(Arch::from_number(n)),
                compressed: false,
                payload_size: 256,
            })
            .collect(),
        ..Spec::default()
    };
    let elf = synth::to_vec(&spec);
    let file = object::File::parse(&*elf).unwrap();
    let bytes = file.section_by_name(".nv_fatbin").unwrap().data().unwrap();
    let body: Vec<String> = bytes.iter().map(|b| b.to_string()).collect();
    format!(
        "__attribute__((section(\".nv_fatbin\"), used, aligned(8)))\nconst unsigned char {symbol}[] = {{{}}};\n",
        body.join(",")
    )
}

/// The headers, besides `nccl.h`, that NCCL `version` installs under `include/`: none
/// before 2.28; from 2.28 on, `nccl_device.h` beside the `nccl_device/` tree, named as
/// the real 2.30.7 wheel holds them (tests/fixtures/nccl-2.30.7-include.txt).
pub fn nccl_extra_headers(version: (u32, u32, u32)) -> Vec<&'static str> {
    if version < (2, 28, 0) {
        return Vec::new();
    }
    include_str!("../fixtures/nccl-2.30.7-include.txt")
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#') && *l != "nccl.h")
        .collect()
}

/// Writes [`nccl_extra_headers`] of `version` under `include`, each a small header
/// that names itself.
pub fn write_nccl_headers(include: &Path, version: (u32, u32, u32)) {
    for rel in nccl_extra_headers(version) {
        let path = include.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, format!("/* stand-in of NCCL's {rel} */\n")).unwrap();
    }
}

/// Writes an NCCL install tree as `make install PREFIX=/usr/local/nccl` lays it out:
/// headers (as that version installs them), real library (with SASS for `archs`) plus
/// symlink chain, static library and pkg-config file.
pub fn write_nccl_tree(root: &Path, version: (u32, u32, u32), archs: &[u32]) {
    let (x, y, z) = version;
    let lib = root.join("lib");
    std::fs::create_dir_all(lib.join("pkgconfig")).unwrap();
    std::fs::create_dir_all(root.join("include")).unwrap();
    write_nccl_headers(&root.join("include"), version);
    std::fs::write(
        root.join("include/nccl.h"),
        format!("#ifndef NCCL_H_\n#define NCCL_H_\n#define NCCL_MAJOR {x}\n#define NCCL_MINOR {y}\n#define NCCL_PATCH {z}\n#define NCCL_SUFFIX \"\"\n#endif\n"),
    )
    .unwrap();
    let real = format!("libnccl.so.{x}.{y}.{z}");
    let source = format!(
        "{}{}",
        nccl_like_source(version, "12.8"),
        fatbin_c_source(archs, "fdl_test_fatbin")
    );
    compile_shared(&source, &lib.join(&real), &["-Wl,-soname,libnccl.so.2"]);
    std::os::unix::fs::symlink(&real, lib.join("libnccl.so.2")).unwrap();
    std::os::unix::fs::symlink("libnccl.so.2", lib.join("libnccl.so")).unwrap();
    // A static archive: `ar` of one object is enough for the layout check.
    let obj = root.join("nccl.o");
    let src = root.join("nccl.c");
    std::fs::write(&src, nccl_like_source(version, "12.8")).unwrap();
    assert!(std::process::Command::new("cc")
        .args(["-c", "-fPIC", "-o"])
        .arg(&obj)
        .arg(&src)
        .status()
        .unwrap()
        .success());
    assert!(std::process::Command::new("ar")
        .arg("rcs")
        .arg(lib.join("libnccl_static.a"))
        .arg(&obj)
        .status()
        .unwrap()
        .success());
    std::fs::remove_file(obj).unwrap();
    std::fs::remove_file(src).unwrap();
    std::fs::write(
        lib.join("pkgconfig/nccl.pc"),
        format!("prefix=/usr/local/nccl\nexec_prefix=${{prefix}}\nlibdir=${{exec_prefix}}/lib\nincludedir=${{prefix}}/include\n\nName: nccl\nDescription: Optimized primitives for collective multi-GPU communication\nVersion: {x}.{y}.{z}\nLibs: -L${{libdir}} -lnccl\nCflags: -I${{includedir}}\n"),
    )
    .unwrap();
}

/// A project with one libtorch variant whose `libtorch_cuda.so` is built from `c_source`
/// (or written as raw `bytes`), made active.
pub struct ProjectFixture {
    pub dir: tempfile::TempDir,
}

impl ProjectFixture {
    pub fn empty() -> Self {
        ProjectFixture {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn variant_lib(&self, variant: &str) -> PathBuf {
        self.root()
            .join("libtorch")
            .join(variant)
            .join("lib/libtorch_cuda.so")
    }

    /// Adds a variant whose libtorch_cuda.so is compiled from `c_source`.
    pub fn with_compiled_variant(self, variant: &str, c_source: &str) -> Self {
        let lib = self.variant_lib(variant);
        std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
        compile_shared(c_source, &lib, &[]);
        self
    }

    pub fn with_raw_variant(self, variant: &str, bytes: &[u8]) -> Self {
        let lib = self.variant_lib(variant);
        std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
        std::fs::write(lib, bytes).unwrap();
        self
    }

    pub fn activate(self, text: &str) -> Self {
        std::fs::create_dir_all(self.root().join("libtorch")).unwrap();
        std::fs::write(self.root().join("libtorch/.active"), text).unwrap();
        self
    }
}

/// Every path under `root` with its size (or link target): equal snapshots mean
/// nothing was created, removed or changed in size.
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<PathBuf, String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            if meta.file_type().is_symlink() {
                out.insert(
                    rel,
                    format!("-> {}", std::fs::read_link(&p).unwrap().display()),
                );
            } else if meta.is_dir() {
                out.insert(rel, "dir".into());
                walk(&p, root, out);
            } else {
                let content = std::fs::read(&p).unwrap();
                out.insert(rel, format!("{} bytes, {:x}", meta.len(), fnv(&content)));
            }
        }
    }
    walk(root, root, &mut out);
    out
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100000001b3)
    })
}

/// A directory holding a stand-in `nvidia-smi` that prints `stdout` and exits `code`,
/// meant to be put first on PATH. Plain `nvidia-smi` prints the banner of driver
/// 580.95.05 (CUDA 13.0), which runs any CUDA up to 13.0.
pub fn fake_nvidia_smi(stdout: &str, code: i32) -> tempfile::TempDir {
    fake_nvidia_smi_driver(stdout, code, "580.95.05", "13.0")
}

/// [`fake_nvidia_smi`] whose banner names `driver` and the newest CUDA it runs, in the
/// format of the real banner's version line (what `fdl::gpu::parse_banner` reads).
pub fn fake_nvidia_smi_driver(
    stdout: &str,
    code: i32,
    driver: &str,
    cuda: &str,
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("nvidia-smi");
    let versions =
        format!("| NVIDIA-SMI {driver:<22} Driver Version: {driver:<14} CUDA Version: {cuda:<9}|");
    let body = format!(
        "#!/bin/sh\n# Answers only the queries fdl makes, like the real tool.\nif [ $# -eq 0 ]; then\n  date '+%a %b %e %H:%M:%S %Y'\n  cat <<'FDL_EOF'\n+-----------------------------------------------------------------------------------------+\n{versions}\n|-----------------------------------------+------------------------+----------------------+\nFDL_EOF\n  exit 0\nfi\ncase \"$*\" in\n  *--query-gpu=index,name,compute_cap,memory.total*--format=csv,noheader,nounits*) ;;\n  *) echo \"unexpected arguments: $*\" >&2; exit 2 ;;\nesac\ncat <<'FDL_EOF'\n{stdout}FDL_EOF\nexit {code}\n"
    );
    std::fs::write(&script, body).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// PATH with `first` in front of the current PATH.
pub fn path_with(first: &Path) -> String {
    format!(
        "{}:{}",
        first.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// A backend for library-level tests: produces the build by copying a prepared install
/// tree. Everything around it — lock, staging, verification (with the real loader
/// probe), seal and commit — is fdl's own pipeline.
pub struct CopyTree<'a>(&'a Path);

impl Backend for CopyTree<'_> {
    fn build(&self, _plan: &BuildPlan, staging: &Path, progress: &Progress) -> anyhow::Result<()> {
        progress.output("copying the prepared tree");
        let ok = std::process::Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", self.0.display()))
            .arg(staging)
            .status()?
            .success();
        anyhow::ensure!(ok, "cp failed");
        Ok(())
    }
}

/// The plan of a Docker build of `tag` for `archs` into `root`'s builds, as the install
/// helpers below execute it.
pub fn docker_plan(root: &Path, tag: &str, archs: &str) -> BuildPlan {
    BuildPlan::new(PlanInputs {
        tag: Tag::parse(tag).unwrap(),
        tag_origin: TagOrigin::Flag,
        cuda_flag: None,
        cuda_from_libtorch: None,
        archs: parse_arch_list(archs).unwrap(),
        arch_origin: ArchOrigin::Flag,
        jobs: 1,
        jobs_reason: "test".into(),
        builds_dir: root.join("libtorch/nccl/builds"),
        backend: BackendInputs::Docker {
            dockerfile: DockerfileSpec::Embedded {
                sha256: "test".into(),
            },
            base_image: None,
            source: fdl::nccl::plan::DockerSource::Clone,
            probe: None,
            volumes: fdl::nccl::plan::VolumesFlag::Auto,
            storage_driver: None,
        },
        backend_reason: "test".into(),
        ptx: false,
        only_funcs: None,
        warnings: Vec::new(),
    })
    .unwrap()
}

pub fn install_build(
    root: &Path,
    cache: &Path,
    tree: &Path,
    tag: &str,
    archs: &str,
) -> anyhow::Result<String> {
    install_build_with(root, cache, tree, tag, archs, false)
}

/// [`install_build`], and with `stored` also added to the machine-wide build store under
/// `cache` (`$XDG_CACHE_HOME`), with a key of its plan, as a real build would be.
pub fn install_build_with(
    root: &Path,
    cache: &Path,
    tree: &Path,
    tag: &str,
    archs: &str,
    stored: bool,
) -> anyhow::Result<String> {
    let plan = docker_plan(root, tag, archs);
    let store = BuildStore::new(root.join("libtorch/nccl/builds"));
    // The real loader check, through fdl's hidden probe subcommand.
    let exe = assert_cmd::cargo::cargo_bin("fdl");
    let probe = |lib: &Path| fdl::nccl::verify::probe_in_child(&exe, lib);
    // The run's context, its cache under `cache` (as `XDG_CACHE_HOME` says for the CLI).
    let ctx = fdl::context::Context::new(
        fdl::context::Env {
            xdg_cache_home: Some(cache.into()),
            home: None,
        },
        Box::new(fdl::context::Stderr),
    );
    let opts = ExecOptions {
        probe: Some(&probe),
        ctx: &ctx,
        force: false,
        wait: Wait::No,
        verbosity: Verbosity::Quiet,
        store: None,
        key: fdl::pipeline::KeyState::Unknown("no store".into()),
    };
    let opts = if stored {
        let toolchain = BTreeMap::from([("test".to_string(), "copy of a tree".to_string())]);
        let inputs = fdl::pipeline::key_inputs(&plan, &tree.display().to_string(), &toolchain);
        ExecOptions {
            store: Some(fdl::store::Store::open_in(&cache.join("fdl"))?),
            key: fdl::pipeline::KeyState::Known(fdl::store::Key::of(&inputs), inputs),
            ..opts
        }
    } else {
        opts
    };
    execute(&plan, &CopyTree(tree), &store, &opts)?;
    Ok(plan.name)
}

/// A project with its own fdl cache and a scratch directory for NCCL trees, into which
/// builds are installed through the real pipeline (see [`install_build`]).
pub struct BuildsFixture {
    pub project: ProjectFixture,
    pub cache: tempfile::TempDir,
    trees: tempfile::TempDir,
}

impl BuildsFixture {
    pub fn new(project: ProjectFixture) -> BuildsFixture {
        BuildsFixture {
            project,
            cache: tempfile::tempdir().unwrap(),
            trees: tempfile::tempdir().unwrap(),
        }
    }

    /// A compiled stand-in NCCL tree named `name` (see [`write_nccl_tree`]).
    pub fn tree(&self, name: &str, version: (u32, u32, u32), archs: &[u32]) -> PathBuf {
        let dir = self.trees.path().join(name);
        write_nccl_tree(&dir, version, archs);
        dir
    }

    /// Installs `tree` as the build of `tag` for `archs`; returns the build's name.
    pub fn install(&self, tree: &Path, tag: &str, archs: &str) -> anyhow::Result<String> {
        install_build(self.project.root(), self.cache.path(), tree, tag, archs)
    }

    /// `fdl --root PROJECT` with this fixture's cache.
    pub fn fdl(&self) -> Command {
        let mut cmd = fdl_in(self.project.root());
        cmd.env("XDG_CACHE_HOME", self.cache.path());
        cmd
    }

    pub fn builds(&self) -> PathBuf {
        self.project.root().join("libtorch/nccl/builds")
    }

    /// Moves the build time the installed build `name` records back by `secs` seconds:
    /// fdl records RFC 3339 seconds, so two builds made within one second order only
    /// once one is made older (rather than waiting for the next second).
    pub fn backdate(&self, name: &str, secs: u64) {
        let path = self.builds().join(name).join(fdl::nccl::tree::MANIFEST);
        let mut manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let at = humantime::parse_rfc3339(manifest["built_at"].as_str().unwrap()).unwrap();
        let earlier = at - std::time::Duration::from_secs(secs);
        manifest["built_at"] = humantime::format_rfc3339_seconds(earlier)
            .to_string()
            .into();
        // The sealed build's manifest is read-only: writable for the rewrite, then as it was.
        let mode = std::fs::metadata(&path).unwrap().permissions();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(
            &path,
            serde_json::to_string_pretty(&manifest).unwrap() + "\n",
        )
        .unwrap();
        std::fs::set_permissions(&path, mode).unwrap();
    }
}

/// A child's stderr, read by a thread as it comes (so the child never blocks on a full
/// pipe): [`ChildStderr::wait_for`] returns once it has printed a given text.
pub struct ChildStderr {
    seen: String,
    chunks: std::sync::mpsc::Receiver<String>,
}

impl ChildStderr {
    /// Takes `child`'s stderr (which must be piped).
    pub fn of(child: &mut std::process::Child) -> ChildStderr {
        let mut pipe = child.stderr.take().expect("the child's stderr is piped");
        let (tx, chunks) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = std::io::Read::read(&mut pipe, &mut buf) {
                if tx
                    .send(String::from_utf8_lossy(&buf[..n]).into_owned())
                    .is_err()
                {
                    break;
                }
            }
        });
        ChildStderr {
            seen: String::new(),
            chunks,
        }
    }

    /// Waits until the child has printed `needle` (a minute at most, then panics with
    /// what it printed): the point it says it reached, such as waiting for a lock.
    pub fn wait_for(&mut self, needle: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !self.seen.contains(needle) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.chunks.recv_timeout(left) {
                Ok(chunk) => self.seen.push_str(&chunk),
                Err(e) => panic!("the child never printed {needle:?} ({e}): {}", self.seen),
            }
        }
    }

    /// Everything the child printed on stderr, once it has closed it.
    pub fn all(mut self) -> String {
        for chunk in self.chunks {
            self.seen.push_str(&chunk);
        }
        self.seen
    }
}

/// The path in `var`, an input `.ci/fetch-oracles` provides (a real NVIDIA library or
/// tool, or maturin). The tests that need one are `#[ignore]`d, so a plain `cargo test`
/// counts them as ignored; run with `--include-ignored`, a missing input fails the test —
/// a check that did not run never reads as passed.
pub fn oracle_input(var: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => panic!(
            "{var} is not set: this test needs an input that `source .ci/setup` provides (a real NVIDIA library or tool, or maturin); it is #[ignore]d unless asked for with --include-ignored"
        ),
    }
}

/// A directory of empty shared libraries, one for each DT_NEEDED of `lib`'s closure that
/// the real loader (`ldd`) cannot find, each with that soname: put on `LD_LIBRARY_PATH`, it
/// completes a partial pip layout (the oracle cache holds `libtorch_cuda.so` and NCCL, not
/// cuDNN or cuBLAS) so the whole closure resolves, as on a real install. The stubs define
/// nothing, so they cannot change which NCCL the calls bind to.
pub fn stubs_for_missing(lib: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for _round in 0..4 {
        let out = std::process::Command::new("ldd")
            .arg(lib)
            .env("LD_LIBRARY_PATH", dir.path())
            .output()
            .expect("ldd (glibc) is needed for this test");
        let text = String::from_utf8_lossy(&out.stdout);
        let missing: Vec<&str> = text
            .lines()
            .filter_map(|l| l.trim().strip_suffix("=> not found"))
            .map(str::trim)
            .collect();
        if missing.is_empty() {
            return dir;
        }
        for name in missing {
            compile_shared(
                "int fdl_empty_stub;\n",
                &dir.path().join(name),
                &[&format!("-Wl,-soname,{name}")],
            );
        }
    }
    panic!("{}: ldd still reports missing libraries", lib.display());
}

/// What one test makes in the Docker engine, removed when the guard drops — also when the
/// test fails — and nothing else, whatever other work shares the engine:
/// - the images it names (`fdl nccl build`'s, its own bases) and the containers made
///   from them;
/// - the untagged images that appeared while it lived *and descend from an image it
///   named or declared as a base* ([`EngineGuard::base`]): a failed classic build leaves
///   its last layer as a `<none>` image, a rebuild under the same tag the old one;
/// - fdl's toolchain volumes of the caches it handed out ([`EngineGuard::cache`]: their
///   names carry the cache's id), and the volumes labelled with this run's
///   [`test_volume_label`].
///
/// Tagged images it did not name stay (the cached base images of tests/support), and so
/// does every container, image and volume of another job: an untagged image from another
/// base, another cache's volumes, another run's labelled volumes.
pub struct EngineGuard {
    images_before: std::collections::BTreeSet<String>,
    containers_before: std::collections::BTreeSet<String>,
    named: Vec<String>,
    bases: Vec<String>,
    caches: Vec<tempfile::TempDir>,
}

/// The tests that build with the real Docker engine run one at a time: each names the
/// toolchain images made while it runs as its own (they are content-addressed, and carry
/// no mark of who made them), so two such tests side by side would take each other's.
/// `cargo test` runs them as threads of this one process, serialized by this lock
/// (nextest runs them as processes, serialized by the `docker-engine` test group).
pub fn docker_engine_lock() -> std::sync::MutexGuard<'static, ()> {
    static ENGINE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ENGINE.lock().unwrap_or_else(|e| e.into_inner())
}

/// fdl's toolchain volumes in the engine (`--toolchain-volumes`), by name.
pub fn toolchain_volumes() -> std::collections::BTreeSet<String> {
    volumes_labelled("fdl.toolchain.image")
}

/// fdl's toolchain volumes made for the fdl cache under `xdg_cache` (the test's
/// `XDG_CACHE_HOME`): their names carry the id that cache keeps, so another cache's
/// volumes on the same engine (another job's) are never counted.
pub fn toolchain_volumes_of(xdg_cache: &Path) -> std::collections::BTreeSet<String> {
    let id = std::fs::read_to_string(xdg_cache.join("fdl/docker-volumes/.cache-id"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    if id.is_empty() {
        return Default::default();
    }
    let prefix = format!("flodl-nccl-toolchain-{id}-");
    toolchain_volumes()
        .into_iter()
        .filter(|v| v.starts_with(&prefix))
        .collect()
}

/// The label key a test puts on a volume it makes itself; [`test_volume_label`] gives it
/// this run's value.
pub const TEST_VOLUME_LABEL: &str = "fdl-test-volume";

/// `fdl-test-volume=<run>`: the label of the volumes this test process makes, so that its
/// [`EngineGuard`] removes them and never another run's.
pub fn test_volume_label() -> String {
    static RUN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let run = RUN.get_or_init(|| {
        let mut bytes = [0u8; 8];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
            .expect("/dev/urandom");
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    });
    format!("{TEST_VOLUME_LABEL}={run}")
}

fn volumes_labelled(label: &str) -> std::collections::BTreeSet<String> {
    let filter = format!("label={label}");
    docker_lines(&["volume", "ls", "-q", "--filter", &filter])
        .into_iter()
        .collect()
}

fn docker_lines(args: &[&str]) -> Vec<String> {
    std::process::Command::new("docker")
        .args(args)
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The ID of `image` (a tag or an ID), when the engine has it.
fn image_id(image: &str) -> Option<String> {
    docker_lines(&["image", "inspect", "--format", "{{.Id}}", image])
        .into_iter()
        .next()
        .filter(|id| !id.is_empty())
}

impl EngineGuard {
    pub fn new() -> EngineGuard {
        EngineGuard {
            images_before: docker_lines(&["images", "-a", "-q", "--no-trunc"])
                .into_iter()
                .collect(),
            containers_before: docker_lines(&["ps", "-a", "-q", "--no-trunc"])
                .into_iter()
                .collect(),
            named: Vec::new(),
            bases: Vec::new(),
            caches: Vec::new(),
        }
    }

    /// An image (by tag) this test makes, or that `fdl nccl build` makes for it.
    pub fn name(&mut self, image: &str) {
        self.named.push(image.to_string());
    }

    /// An image this test builds from but keeps (a cached base of tests/support): the
    /// untagged layers a build of this test leaves on it are removed, the base stays.
    pub fn base(&mut self, image: &str) {
        self.bases.push(image.to_string());
    }

    /// A new directory for the test's `XDG_CACHE_HOME`, kept until the guard drops, so
    /// that the toolchain volumes fdl makes for that cache are known to be this test's.
    pub fn cache(&mut self) -> GuardedCache {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        self.caches.push(dir);
        GuardedCache(path)
    }

    /// What the guard would remove now: the new containers made from its images, and its
    /// images (named, or untagged, new and descended from a named image or a base).
    pub fn leftovers(&self) -> (Vec<String>, Vec<String>) {
        let images = self.images();
        let mut containers = Vec::new();
        for image in self.named.iter().chain(&images) {
            let filter = format!("ancestor={image}");
            for c in docker_lines(&["ps", "-a", "-q", "--no-trunc", "--filter", &filter]) {
                if !self.containers_before.contains(&c) && !containers.contains(&c) {
                    containers.push(c);
                }
            }
        }
        (containers, images)
    }

    /// The volumes the guard answers for.
    pub fn volumes(&self) -> std::collections::BTreeSet<String> {
        let mut all = volumes_labelled(&test_volume_label());
        for cache in &self.caches {
            all.extend(toolchain_volumes_of(cache.path()));
        }
        all
    }

    fn images(&self) -> Vec<String> {
        let roots: std::collections::BTreeSet<String> = self
            .named
            .iter()
            .chain(&self.bases)
            .filter_map(|i| image_id(i))
            .collect();
        let mut ours = Vec::new();
        for line in docker_lines(&[
            "images",
            "-a",
            "--no-trunc",
            "--format",
            "{{.ID}} {{.Repository}}:{{.Tag}}",
        ]) {
            let Some((id, tag)) = line.split_once(' ') else {
                continue;
            };
            if self.named.iter().any(|n| n == tag) {
                ours.push(id.to_string());
                continue;
            }
            if tag != "<none>:<none>" || self.images_before.contains(id) {
                continue;
            }
            // Up the parent chain (classic builds record it) to an image of this test.
            let mut at = id.to_string();
            for _ in 0..128 {
                let parent = docker_lines(&["image", "inspect", "--format", "{{.Parent}}", &at])
                    .into_iter()
                    .next()
                    .unwrap_or_default();
                if parent.is_empty() {
                    break;
                }
                if roots.contains(&parent) {
                    ours.push(id.to_string());
                    break;
                }
                at = parent;
            }
        }
        ours
    }
}

/// A cache directory an [`EngineGuard`] handed out (and removes when it drops).
pub struct GuardedCache(PathBuf);

impl GuardedCache {
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Default for EngineGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for EngineGuard {
    fn drop(&mut self) {
        let (containers, untagged) = self.leftovers();
        for c in &containers {
            let _ = std::process::Command::new("docker")
                .args(["rm", "--force", c])
                .output();
        }
        for image in &self.named {
            let _ = std::process::Command::new("docker")
                .args(["rmi", "--force", image])
                .output();
        }
        // The untagged ones, as found before the named went, children before parents:
        // without --force the engine refuses a parent of a kept image, or one a container
        // still uses, so nothing else is touched.
        let mut left = untagged;
        for _ in 0..32 {
            let before = left.len();
            left.retain(|id| {
                !std::process::Command::new("docker")
                    .args(["rmi", id.as_str()])
                    .output()
                    .is_ok_and(|o| o.status.success())
            });
            if left.is_empty() || left.len() == before {
                break;
            }
        }
        // The toolchain volumes of this test's caches, and its own labelled ones.
        for volume in self.volumes() {
            let _ = std::process::Command::new("docker")
                .args(["volume", "rm", &volume])
                .output();
        }
    }
}

/// A libtorch_cuda.so linked as a PIE (it has `PT_INTERP` and `DF_1_PIE`) that calls an
/// NCCL 2.27.5 compiled in and names `audit_at` as its DT_AUDIT library, and that audit
/// library, which appends to `marker` when glibc loads it (`la_version`) or runs its
/// constructor: (libtorch, audit library), both written under `dir`.
pub fn audited_pie_libtorch(dir: &Path, audit_at: &str, marker: &str) -> (PathBuf, PathBuf) {
    let audit = dir.join("libaudit.so");
    compile_shared(
        &format!(
            "#include <stdio.h>\nstatic void mark(void) {{ FILE *f = fopen({marker:?}, \"a\"); if (f) {{ fputs(\"ran\\n\", f); fclose(f); }} }}\nunsigned int la_version(unsigned int v) {{ mark(); return v; }}\n__attribute__((constructor)) static void ctor(void) {{ mark(); }}\n"
        ),
        &audit,
        &[],
    );
    let torch = dir.join("libtorch_cuda.so");
    let src = dir.join("torch.c");
    std::fs::write(
        &src,
        format!(
            "{}\nint fdl_test_torch_calls_nccl(void) {{ int v = 0; ncclGetVersion(&v); return v; }}\nint main(void) {{ return fdl_test_torch_calls_nccl() == 0; }}\n",
            nccl_like_source((2, 27, 5), "12.8")
        ),
    )
    .unwrap();
    let ok = std::process::Command::new("cc")
        .args(["-pie", "-fPIE", "-Wl,-E", "-o"])
        .arg(&torch)
        .arg(&src)
        .arg(format!("-Wl,--audit={audit_at}"))
        .status()
        .unwrap();
    assert!(ok.success(), "cc failed for {}", torch.display());
    (torch, audit)
}

/// fdl's compile containers (`fdl-nccl-…`) that `extra` (`ps` flags: `-a` for every
/// state) lists and that mount a directory below `root`: the ones a test's own builds
/// made, whatever else runs on a shared engine.
pub fn fdl_containers_where(root: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["ps"];
    args.extend_from_slice(extra);
    args.extend(["--filter", "name=fdl-nccl-", "--format", "{{.Names}}"]);
    docker_lines(&args)
        .into_iter()
        .filter(|name| {
            let mounts = docker_lines(&[
                "inspect",
                "--format",
                "{{range .Mounts}}{{.Source}}\n{{end}}",
                name,
            ]);
            mounts.iter().any(|m| Path::new(m).starts_with(root))
        })
        .collect()
}

/// [`fdl_containers_where`] in every state.
pub fn fdl_containers(root: &Path) -> Vec<String> {
    fdl_containers_where(root, &["-a"])
}
