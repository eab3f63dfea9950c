//! Oracle checks against NVIDIA's own tools, run when the real artefacts are at hand:
//!
//! * `FDL_TEST_NCCL_LIB` / `FDL_TEST_NCCL_LIB_CU13`: real `libnccl.so.2` files from the
//!   nvidia-nccl-cu12 / nvidia-nccl-cu13 wheels;
//! * `FDL_TEST_CUOBJDUMP`: a `cuobjdump` binary (e.g. from nvidia-cuda-cuobjdump).
//!
//! Our SASS/PTX lists must equal `cuobjdump --list-elf` / `--list-ptx` exactly, and our
//! version must equal what `ncclGetVersion` returns once the library is loaded (done in
//! a child process, compiled with `cc`). Without the variables each test says SKIPPED;
//! under `.ci/run` (`FDL_REQUIRE_ORACLES=1`) it fails instead.

mod common;
use common::oracle_input;
use fdl::arch::{GpuTarget, Variant};
use fdl::inspect::{self, synth, GpuCode};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `cuobjdump --list-elf|--list-ptx` → target name → count. Lines look like
/// `ELF file    1: libnccl.so.1.sm_90.cubin` / `PTX file    1: libnccl.so.1.sm_120.ptx`.
fn cuobjdump_list(cuobjdump: &Path, lib: &Path, flag: &str) -> BTreeMap<String, usize> {
    let out = Command::new(cuobjdump)
        .arg(flag)
        .arg(lib)
        .output()
        .expect("run cuobjdump");
    let text = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() || stderr.contains("No "),
        "cuobjdump {flag} failed: {stderr}"
    );
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let Some((_, name)) = line.split_once(": ") else {
            continue;
        };
        let stem = name
            .trim()
            .trim_end_matches(".cubin")
            .trim_end_matches(".ptx");
        let arch = stem.rsplit('.').next().unwrap_or_default().to_string();
        *m.entry(arch).or_insert(0) += 1;
    }
    m
}

fn ours(list: &[inspect::CodeEntry]) -> BTreeMap<String, usize> {
    list.iter()
        .map(|e| (e.target.to_string(), e.count))
        .collect()
}

fn compare(cuobjdump: &Path, lib: &Path, code: &GpuCode) {
    let elf = cuobjdump_list(cuobjdump, lib, "--list-elf");
    let ptx = cuobjdump_list(cuobjdump, lib, "--list-ptx");
    eprintln!("cuobjdump --list-elf: {elf:?}");
    eprintln!("ours (sass):          {:?}", ours(&code.sass));
    eprintln!("cuobjdump --list-ptx: {ptx:?}");
    eprintln!("ours (ptx):           {:?}", ours(&code.ptx));
    assert_eq!(ours(&code.sass), elf, "SASS list differs from cuobjdump");
    assert_eq!(ours(&code.ptx), ptx, "PTX list differs from cuobjdump");
}

/// The nvidia-nccl-cu12 wheel's library (CUDA 12 build).
#[test]
fn real_nccl_cu12_matches_cuobjdump_and_ncclgetversion() {
    if let (Some(lib), Some(cuobjdump)) = (
        oracle_input("FDL_TEST_NCCL_LIB"),
        oracle_input("FDL_TEST_CUOBJDUMP"),
    ) {
        real_nccl_matches(&lib, &cuobjdump, 12);
    }
}

/// The nvidia-nccl-cu13 wheel's library: a CUDA 13 build, zstd-compressed, without
/// pre-Turing cubins, and with four sm_100 cubins whose fatbin header says family (`f`)
/// where their ELF header (and so cuobjdump) says plain `sm_100`.
#[test]
fn real_nccl_cu13_matches_cuobjdump_and_ncclgetversion() {
    if let (Some(lib), Some(cuobjdump)) = (
        oracle_input("FDL_TEST_NCCL_LIB_CU13"),
        oracle_input("FDL_TEST_CUOBJDUMP"),
    ) {
        real_nccl_matches(&lib, &cuobjdump, 13);
    }
}

fn real_nccl_matches(lib: &Path, cuobjdump: &Path, cuda_major: u32) {
    let lib = lib.to_path_buf();
    let t = std::time::Instant::now();
    let ins = inspect::inspect(&lib).expect("inspect real libnccl");
    eprintln!("inspect took {:?}", t.elapsed());
    assert!(ins.warnings.is_empty(), "{:?}", ins.warnings);
    assert!(
        ins.gpu_code.warnings.is_empty(),
        "{:?}",
        ins.gpu_code.warnings
    );
    compare(cuobjdump, &lib, &ins.gpu_code);

    // Version: what the library itself says once loaded.
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("v.c");
    std::fs::write(
        &c,
        r#"#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) { fprintf(stderr, "%s\n", dlerror()); return 2; }
  int (*get)(int *) = (int (*)(int *))dlsym(h, "ncclGetVersion");
  if (!get) { fprintf(stderr, "no ncclGetVersion\n"); return 3; }
  int v = 0;
  if (get(&v) != 0) return 4;
  printf("%d\n", v);
  return 0;
}
"#,
    )
    .unwrap();
    let exe = dir.path().join("v");
    let st = Command::new("cc")
        .arg(&c)
        .arg("-o")
        .arg(&exe)
        .arg("-ldl")
        .status()
        .expect("cc");
    assert!(st.success());
    let out = Command::new(&exe).arg(&lib).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let code: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let nccl = ins.nccl.expect("self-id found");
    eprintln!(
        "ncclGetVersion: {code}; ours: {} (+cuda{})",
        nccl.version, nccl.cuda
    );
    assert_eq!(nccl.version.code(), code);
    assert_eq!(fdl::version::NcclVersion::from_code(code), nccl.version);
    assert_eq!(nccl.cuda.major, cuda_major, "built for CUDA {}", nccl.cuda);
}

/// Our synthetic libraries must read the same in cuobjdump as in fdl, PTX variants
/// included. SASS `a` targets are left out: cuobjdump names a cubin `a` from its e_flags
/// only together with more of a real cubin than the synthetic minimal one carries (checked
/// by hand on a real sm_100 cubin: flipping e_flags bit 3 alone flips sm_100/sm_100a).
#[test]
fn synth_reads_the_same_in_cuobjdump() {
    let Some(cuobjdump) = oracle_input("FDL_TEST_CUOBJDUMP") else {
        return;
    };
    let t = |n: u32, variant| GpuTarget {
        arch: fdl::arch::Arch::from_number(n),
        variant,
    };
    let sass = [
        t(61, Variant::Generic),
        t(90, Variant::Generic),
        t(100, Variant::Family),
        t(120, Variant::Generic),
    ];
    let ptx = [
        t(90, Variant::Specific),
        t(100, Variant::Family),
        t(120, Variant::Generic),
    ];
    let dir = tempfile::tempdir().unwrap();
    // 3000 bytes: a block of a few sequences; 200,000: hundreds, expanding 5.7x as
    // real blocks do (see `synth::LZ4_EXPANSION`), so cuobjdump decodes them whole.
    let cases = [3000, 200_000]
        .into_iter()
        .flat_map(|p| [(false, p), (true, p)]);
    for (compressed, payload) in cases {
        let spec = synth::Spec::torch_like(&sass, &ptx, 3, payload, compressed);
        let path = dir.path().join(format!("libsynth{compressed}{payload}.so"));
        synth::write_file(&spec, &path).unwrap();
        let ins = inspect::inspect(&path).unwrap();
        compare(&cuobjdump, &path, &ins.gpu_code);
    }
    // cuobjdump's own LZ4 decoder must turn each compressed entry back into the bytes
    // the plain one stores: the synthetic blocks are valid, not just readable headers.
    for payload in [3000, 200_000] {
        let plain = extracted(
            &cuobjdump,
            &dir.path().join(format!("libsynthfalse{payload}.so")),
        );
        let lz4 = extracted(
            &cuobjdump,
            &dir.path().join(format!("libsynthtrue{payload}.so")),
        );
        assert_eq!(plain.len(), 3 * (sass.len() + ptx.len()));
        // PTX text comes out up to its NUL, so every decoded byte is compared; a cubin
        // only as far as its ELF headers reach.
        let whole = plain
            .iter()
            .filter(|b| b.len() as u64 == payload - 1)
            .count();
        assert_eq!(whole, 3 * ptx.len());
        assert!(
            plain == lz4,
            "cuobjdump decodes the LZ4 entries ({payload} B) differently"
        );
    }
}

/// The payloads `cuobjdump -xelf all -xptx all` extracts from `lib`, decoded, in a stable
/// order (its file names differ between libraries, so only the contents are kept).
fn extracted(cuobjdump: &Path, lib: &Path) -> Vec<Vec<u8>> {
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(cuobjdump)
        .args(["-xelf", "all", "-xptx", "all"])
        .arg(lib)
        .current_dir(out.path())
        .output()
        .expect("run cuobjdump");
    assert!(
        run.status.success(),
        "cuobjdump -xelf/-xptx failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let mut names: Vec<PathBuf> = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    names.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

/// `FDL_TEST_TORCH_LIB`: a real `torch/lib/libtorch_cuda.so` from a pip torch wheel. Its
/// GPU code must list as cuobjdump lists it; laid out as pip lays it out beside the real
/// NCCL wheel, `fdl nccl detect` must follow its RPATH to that libnccl.so.2.
#[test]
fn real_libtorch_cuda_matches_cuobjdump_and_finds_its_pip_nccl() {
    let (Some(torch), Some(cuobjdump), Some(nccl)) = (
        oracle_input("FDL_TEST_TORCH_LIB"),
        oracle_input("FDL_TEST_CUOBJDUMP"),
        oracle_input("FDL_TEST_NCCL_LIB"),
    ) else {
        return;
    };
    let ins = inspect::inspect(&torch).unwrap();
    assert!(ins.gpu_code.sass_total() > 1000, "{:?}", ins.gpu_code.sass);
    compare(&cuobjdump, &torch, &ins.gpu_code);

    // site-packages/torch/lib/libtorch_cuda.so + site-packages/nvidia/nccl/lib/libnccl.so.2
    let site = tempfile::tempdir().unwrap();
    let torch_lib = site.path().join("torch/lib");
    let nccl_lib = site.path().join("nvidia/nccl/lib");
    std::fs::create_dir_all(&torch_lib).unwrap();
    std::fs::create_dir_all(&nccl_lib).unwrap();
    std::os::unix::fs::symlink(&torch, torch_lib.join("libtorch_cuda.so")).unwrap();
    std::os::unix::fs::symlink(&nccl, nccl_lib.join("libnccl.so.2")).unwrap();
    // $ORIGIN is the (canonical) directory of the path the library is opened by.
    let found = inspect::detect_nccl(
        &torch_lib.join("libtorch_cuda.so"),
        &inspect::LoaderEnv::bare(),
    )
    .unwrap()
    .expect("libtorch_cuda.so needs libnccl.so.2");
    assert_eq!(
        found.linkage,
        inspect::Linkage::Dynamic {
            needed: "libnccl.so.2".into(),
            via: inspect::ResolveRule::Rpath
        }
    );
    assert_eq!(found.version.to_string(), "2.27.5");
}
