//! Oracle checks against NVIDIA's own tools, run when the real artefacts are at hand
//! (`.ci/fetch-oracles` fetches them, pinned, and names them in these variables):
//!
//! * `FDL_TEST_NCCL_LIB`, `FDL_TEST_NCCL_LIB_CU13`, `FDL_TEST_NCCL_LIB_CU13_NEWEST`: real
//!   `libnccl.so.2` files from the nvidia-nccl-cu12 (2.27.5) and nvidia-nccl-cu13 (2.28.9,
//!   and the newest, 2.32.3) wheels;
//! * `FDL_TEST_TORCH_LIB`, `FDL_TEST_TORCH_LIB_CU13`: real `libtorch_cuda.so` files from
//!   the torch 2.8.0 (CUDA 12.8) and torch 2.15.0 (CUDA 13.2) wheels, the latter laid out
//!   as pip installs it, beside the nvidia-nccl-cu13 it requires;
//! * `FDL_TEST_CUDA_HOME_NEWEST`: the newest nvcc (CUDA 13.5), to compile fatbins for
//!   every kind of target, an oracle that owes nothing to fdl or to any library's build;
//! * `FDL_TEST_CUOBJDUMP`: a `cuobjdump` binary (nvidia-cuda-cuobjdump 13.5).
//!
//! Our SASS/PTX lists must equal `cuobjdump --list-elf` / `--list-ptx` exactly, and our
//! version must equal what `ncclGetVersion` returns once the library is loaded (done in
//! a child process, compiled with `cc`). The tests are `#[ignore]`d: a plain `cargo test`
//! counts them as ignored, never as passed; `.ci/run` runs them with `--include-ignored`
//! after fetching the inputs, and a missing input then fails its test.

use crate::common;
use common::oracle::{assert_lists_like_cuobjdump, cuobjdump_mismatch, listing, nccl_get_version};
use common::oracle_input;
use fdl::arch::{GpuTarget, Variant};
use fdl::inspect::{self, Linkage, NcclDetection, ResolveRule};
use fdl_synth as synth;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The nvidia-nccl-cu12 wheel's library (CUDA 12 build).
#[test]
#[ignore = "needs the real NVIDIA inputs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn real_nccl_cu12_matches_cuobjdump_and_ncclgetversion() {
    real_nccl_from("FDL_TEST_NCCL_LIB", 12);
}

/// The nvidia-nccl-cu13 wheel's library: a CUDA 13 build, zstd-compressed, without
/// pre-Turing cubins, and with four sm_100 cubins whose fatbin header says family (`f`)
/// where their ELF header (and so cuobjdump) says plain `sm_100`.
#[test]
#[ignore = "needs the real NVIDIA inputs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn real_nccl_cu13_matches_cuobjdump_and_ncclgetversion() {
    real_nccl_from("FDL_TEST_NCCL_LIB_CU13", 13);
}

/// The newest nvidia-nccl-cu13 (2.32.3, built with CUDA 13.4): SASS for sm_107 too.
#[test]
#[ignore = "needs the real NVIDIA inputs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn real_nccl_cu13_newest_matches_cuobjdump_and_ncclgetversion() {
    real_nccl_from("FDL_TEST_NCCL_LIB_CU13_NEWEST", 13);
}

fn real_nccl_from(var: &str, cuda_major: u32) {
    let (lib, cuobjdump) = (oracle_input(var), oracle_input("FDL_TEST_CUOBJDUMP"));
    real_nccl_matches(&lib, &cuobjdump, cuda_major);
}

/// A real libnccl: its GPU code lists as cuobjdump lists it, and the version fdl reads
/// from its self-id is the one its `ncclGetVersion` returns. Returns that detection.
fn real_nccl_matches(lib: &Path, cuobjdump: &Path, cuda_major: u32) -> NcclDetection {
    let t = std::time::Instant::now();
    let ins = inspect::inspect_cross_checking_zstd(lib).expect("inspect real libnccl");
    zstd_decoders_agree(&ins);
    eprintln!("inspect of {} took {:?}", lib.display(), t.elapsed());
    assert!(ins.warnings.is_empty(), "{:?}", ins.warnings);
    assert!(
        ins.gpu_code.warnings.is_empty(),
        "{:?}",
        ins.gpu_code.warnings
    );
    assert_lists_like_cuobjdump(cuobjdump, lib, &ins.gpu_code);

    // Version: what the library itself says once loaded.
    let code = nccl_get_version(lib);
    let nccl = ins.nccl.expect("self-id found");
    eprintln!(
        "ncclGetVersion: {code}; ours: {} (+cuda{})",
        nccl.version, nccl.cuda
    );
    assert_eq!(nccl.version.code(), code);
    assert_eq!(fdl::version::NcclVersion::from_code(code), nccl.version);
    assert_eq!(nccl.cuda.major, cuda_major, "built for CUDA {}", nccl.cuda);
    nccl
}

/// Our synthetic libraries must read the same in cuobjdump as in fdl, PTX variants
/// included. SASS `a` targets are left out: cuobjdump names a cubin `a` from its e_flags
/// only together with more of a real cubin than the synthetic minimal one carries (checked
/// by hand on a real sm_100 cubin: flipping e_flags bit 3 alone flips sm_100/sm_100a).
#[test]
#[ignore = "needs the real NVIDIA inputs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn synth_reads_the_same_in_cuobjdump() {
    let cuobjdump = oracle_input("FDL_TEST_CUOBJDUMP");
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
        assert_lists_like_cuobjdump(&cuobjdump, &path, &ins.gpu_code);
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

/// `FDL_TEST_TORCH_LIB`: torch 2.8.0's `libtorch_cuda.so` (CUDA 12.8), laid out here as
/// pip lays it out beside the nvidia-nccl-cu12 wheel's `libnccl.so.2`.
#[test]
#[ignore = "needs the real NVIDIA inputs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn real_libtorch_cuda_matches_cuobjdump_and_finds_its_pip_nccl() {
    let (torch, cuobjdump, nccl) = (
        oracle_input("FDL_TEST_TORCH_LIB"),
        oracle_input("FDL_TEST_CUOBJDUMP"),
        oracle_input("FDL_TEST_NCCL_LIB"),
    );
    // site-packages/torch/lib/libtorch_cuda.so + site-packages/nvidia/nccl/lib/libnccl.so.2
    let site = tempfile::tempdir().unwrap();
    let torch_lib = site.path().join("torch/lib");
    let nccl_lib = site.path().join("nvidia/nccl/lib");
    std::fs::create_dir_all(&torch_lib).unwrap();
    std::fs::create_dir_all(&nccl_lib).unwrap();
    std::os::unix::fs::symlink(&torch, torch_lib.join("libtorch_cuda.so")).unwrap();
    std::os::unix::fs::symlink(&nccl, nccl_lib.join("libnccl.so.2")).unwrap();
    real_libtorch_matches(
        &torch_lib.join("libtorch_cuda.so"),
        &cuobjdump,
        "2.27.5",
        12,
    );
}

/// `FDL_TEST_TORCH_LIB_CU13`: today's torch, 2.15.0 (CUDA 13.2), as pip installs it:
/// `a` cubins for sm_90a, sm_100a, sm_120a and sm_121a among 2,981, and its NCCL in the
/// nvidia-nccl-cu13 wheel (2.30.7) it requires. What `fdl libtorch add` would write for it
/// comes from the same files and its `version.py`.
#[test]
#[ignore = "needs the real NVIDIA inputs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn real_libtorch_cuda13_matches_cuobjdump_and_finds_its_pip_nccl() {
    let (torch, cuobjdump) = (
        oracle_input("FDL_TEST_TORCH_LIB_CU13"),
        oracle_input("FDL_TEST_CUOBJDUMP"),
    );
    let nccl = real_libtorch_matches(&torch, &cuobjdump, "2.30.7", 13);

    let torch_dir = torch.parent().and_then(Path::parent).unwrap();
    let stubs = common::stubs_for_missing(&torch);
    let env = fdl::loader::LoaderEnv {
        ld_library_path: vec![stubs.path().to_path_buf()],
        ..fdl::loader::LoaderEnv::bare()
    };
    let arch: BTreeMap<&str, String> = fdl::libtorch::add::describe_in(torch_dir, &torch, &env)
        .unwrap()
        .into_iter()
        .collect();
    eprintln!(".arch: {arch:?}");
    assert_eq!(arch["torch"], "2.15.0+cu132");
    assert_eq!(arch["cuda"], "13.2");
    assert_eq!(arch["nccl"], "2.30.7");
    assert_eq!(arch["nccl_linkage"], "dynamic");
    assert!(same_file(Path::new(&arch["nccl_library"]), &nccl.file));
    for target in ["8.0", "8.6", "9.0", "10.0", "10.3", "12.0"] {
        assert!(
            arch["archs"].split(';').any(|a| a == target),
            "{target} missing: {}",
            arch["archs"]
        );
    }
}

/// A real pip `libtorch_cuda.so` at `site-packages/torch/lib/`: its GPU code lists as
/// cuobjdump lists it; fdl follows its RPATH (`$ORIGIN/../../nvidia/nccl/lib`) to the
/// `libnccl.so.2` pip put beside it, and that library is held to cuobjdump and
/// `ncclGetVersion` like any other. Returns the detection.
fn real_libtorch_matches(
    torch: &Path,
    cuobjdump: &Path,
    nccl: &str,
    cuda_major: u32,
) -> NcclDetection {
    let ins = inspect::inspect_cross_checking_zstd(torch).unwrap();
    zstd_decoders_agree(&ins);
    assert!(ins.gpu_code.sass_total() > 1000, "{:?}", ins.gpu_code.sass);
    assert!(
        ins.gpu_code.warnings.is_empty(),
        "{:?}",
        ins.gpu_code.warnings
    );
    assert_lists_like_cuobjdump(cuobjdump, torch, &ins.gpu_code);

    // $ORIGIN is the directory of the path the library is opened by. The libraries the
    // oracle cache lacks (cuDNN, cuBLAS, …) come from stubs on LD_LIBRARY_PATH, searched
    // after libtorch's RPATH, so the whole closure resolves as on a full install.
    let stubs = common::stubs_for_missing(torch);
    let env = fdl::loader::LoaderEnv {
        ld_library_path: vec![stubs.path().to_path_buf()],
        ..fdl::loader::LoaderEnv::bare()
    };
    let which = fdl::loader::which_nccl(torch, &env).unwrap();
    let found = which
        .answer
        .detection()
        .unwrap_or_else(|| panic!("no NCCL answer for {}: {:?}", torch.display(), which.answer))
        .clone();
    assert_eq!(
        found.linkage,
        Linkage::Dynamic {
            needed: "libnccl.so.2".into(),
            via: ResolveRule::Rpath
        }
    );
    let site = torch.ancestors().nth(3).unwrap();
    assert!(
        same_file(&found.file, &site.join("nvidia/nccl/lib/libnccl.so.2")),
        "found {}, not the libnccl.so.2 pip put in {}",
        found.file.display(),
        site.display()
    );
    assert_eq!(found.version.to_string(), nccl);
    let own = real_nccl_matches(&found.file, cuobjdump, cuda_major);
    assert_eq!((own.version, own.cuda), (found.version.clone(), found.cuda));
    found
}

fn same_file(a: &Path, b: &Path) -> bool {
    matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

/// A kernel for nvcc to compile: small, but real device code for every target.
const KERNEL: &str = r#"extern "C" __global__ void fdl_scale(float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}
"#;

/// One nvcc output to hold against cuobjdump: a name, nvcc's arguments, and the SASS and
/// PTX lists expected, spelled as cuobjdump spells them (an `f` cubin lists as plain
/// `sm_100`, `f` PTX as `sm_100f`).
struct NvccCase {
    name: String,
    args: Vec<String>,
    sass: Vec<&'static str>,
    ptx: Vec<&'static str>,
}

fn gencode(spec: &str) -> String {
    format!("-gencode=arch={spec}")
}

/// What the newest nvcc writes for each kind of target, compiled here: `a` and `f` cubins
/// and PTX, plain ones, and one multi-target fatbin in each compression nvcc offers. fdl's
/// lists must be cuobjdump's, and the ones nvcc was asked for.
#[test]
#[ignore = "needs the real NVIDIA inputs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn nvcc_fatbins_list_like_cuobjdump() {
    let (home, cuobjdump) = (
        oracle_input("FDL_TEST_CUDA_HOME_NEWEST"),
        oracle_input("FDL_TEST_CUOBJDUMP"),
    );
    let single = [
        ("compute_90a,code=sm_90a", vec!["sm_90a"], vec![]),
        ("compute_100a,code=sm_100a", vec!["sm_100a"], vec![]),
        ("compute_100f,code=sm_100f", vec!["sm_100"], vec![]),
        ("compute_103f,code=sm_103f", vec!["sm_103"], vec![]),
        ("compute_110f,code=sm_110f", vec!["sm_110"], vec![]),
        ("compute_121a,code=sm_121a", vec!["sm_121a"], vec![]),
        ("compute_100,code=sm_100", vec!["sm_100"], vec![]),
        ("compute_120,code=sm_120", vec!["sm_120"], vec![]),
        // New in CUDA 13.5's --list-gpu-arch.
        ("compute_88,code=sm_88", vec!["sm_88"], vec![]),
        ("compute_107,code=sm_107", vec!["sm_107"], vec![]),
        ("compute_100f,code=compute_100f", vec![], vec!["sm_100f"]),
        ("compute_100a,code=compute_100a", vec![], vec!["sm_100a"]),
        (
            "compute_120,code=[sm_120,compute_120]",
            vec!["sm_120"],
            vec!["sm_120"],
        ),
    ];
    let mut cases: Vec<NvccCase> = single
        .into_iter()
        .map(|(spec, sass, ptx)| NvccCase {
            name: spec.replace(['=', ',', '[', ']'], "_"),
            args: vec![gencode(spec)],
            sass,
            ptx,
        })
        .collect();
    for (name, flags) in [
        ("default", &[][..]),
        ("compress-all", &["-Xfatbin", "-compress-all"][..]),
        ("mode-default", &["--compress-mode=default"][..]),
        ("mode-size", &["--compress-mode=size"][..]),
        ("mode-speed", &["--compress-mode=speed"][..]),
        ("mode-balance", &["--compress-mode=balance"][..]),
        ("mode-none", &["--compress-mode=none"][..]),
        ("no-compress", &["--no-compress"][..]),
    ] {
        cases.push(multi_target(&format!("multi-{name}"), flags));
    }
    let failures = check_nvcc_cases(&home, &cuobjdump, &cases);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// CUDA 13.5's `nvcc --concat` ("concatenated fatbin entries for improved compression of
/// multi-architecture builds") stores several entries behind one header of a new kind;
/// cuobjdump lists each of them, so fdl must too.
#[test]
#[ignore = "needs the real NVIDIA inputs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn nvcc_concat_fatbins_list_like_cuobjdump() {
    let (home, cuobjdump) = (
        oracle_input("FDL_TEST_CUDA_HOME_NEWEST"),
        oracle_input("FDL_TEST_CUOBJDUMP"),
    );
    let cases = [
        multi_target("concat", &["--concat"]),
        multi_target(
            "concat-compress-all",
            &["--concat", "-Xfatbin", "-compress-all"],
        ),
        multi_target("concat-mode-size", &["--concat", "--compress-mode=size"]),
    ];
    let failures = check_nvcc_cases(&home, &cuobjdump, &cases);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// One fatbin for seven targets — `a`, `f` and plain cubins, `a` and plain PTX — with
/// nvcc's `flags` (compression) added.
fn multi_target(name: &str, flags: &[&str]) -> NvccCase {
    let mut args: Vec<String> = [
        "compute_75,code=sm_75",
        "compute_90a,code=sm_90a",
        "compute_100f,code=sm_100f",
        "compute_103f,code=sm_103f",
        "compute_120,code=sm_120",
        "compute_100a,code=compute_100a",
        "compute_120,code=compute_120",
    ]
    .iter()
    .map(|s| gencode(s))
    .collect();
    args.extend(flags.iter().map(|f| f.to_string()));
    NvccCase {
        name: name.to_string(),
        args,
        sass: vec!["sm_75", "sm_90a", "sm_100", "sm_103", "sm_120"],
        ptx: vec!["sm_100a", "sm_120"],
    }
}

/// Compiles each case with nvcc to a fatbin and, for multi-target cases, also to a shared
/// library (the `.nv_fatbin` section of an ELF file); returns what went wrong, per file.
fn check_nvcc_cases(home: &Path, cuobjdump: &Path, cases: &[NvccCase]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let cu = dir.path().join("kernel.cu");
    std::fs::write(&cu, KERNEL).unwrap();
    let mut failures = Vec::new();
    for case in cases {
        let mut outputs = vec![(dir.path().join(format!("{}.fatbin", case.name)), "-fatbin")];
        if case.args.len() > 1 {
            outputs.push((dir.path().join(format!("lib{}.so", case.name)), "-shared"));
        }
        for (out, mode) in outputs {
            let run = Command::new(home.join("bin/nvcc"))
                .arg(mode)
                .args(["-Xcompiler", "-fPIC"])
                .args(&case.args)
                .arg("-o")
                .arg(&out)
                .arg(&cu)
                .output()
                .expect("run nvcc");
            assert!(
                run.status.success(),
                "nvcc {mode} {:?}: {}",
                case.args,
                String::from_utf8_lossy(&run.stderr)
            );
            let ins = inspect::inspect(&out).unwrap();
            let code = &ins.gpu_code;
            // `nvcc -shared` device-links too: a second cubin per SASS target, from nvlink.
            let cubins = if mode == "-shared" { 2 } else { 1 };
            let want = |v: &[&str], n: usize| -> BTreeMap<String, usize> {
                v.iter().map(|s| (s.to_string(), n)).collect()
            };
            eprintln!(
                "{} ({} bytes): SASS {:?}, PTX {:?}, {} compressed, {} other",
                out.file_name().unwrap().to_string_lossy(),
                std::fs::metadata(&out).unwrap().len(),
                listing(&code.sass),
                listing(&code.ptx),
                code.compressed,
                code.other
            );
            if let Some(diff) = cuobjdump_mismatch(cuobjdump, &out, code) {
                failures.push(format!("{}: differs from cuobjdump: {diff}", case.name));
            } else if (listing(&code.sass), listing(&code.ptx))
                != (want(&case.sass, cubins), want(&case.ptx, 1))
            {
                failures.push(format!(
                    "{}: fdl and cuobjdump agree on SASS {:?} PTX {:?}, but nvcc was asked for SASS {:?} PTX {:?}",
                    out.display(),
                    listing(&code.sass),
                    listing(&code.ptx),
                    case.sass,
                    case.ptx
                ));
            }
            if !code.warnings.is_empty() {
                failures.push(format!("{}: warnings {:?}", out.display(), code.warnings));
            }
        }
    }
    failures
}

/// fdl decodes a zstd cubin's ELF header from the front of its first block, without
/// libzstd; on a real library every such decode must equal libzstd's, and the fallback
/// to libzstd must be the exception.
fn zstd_decoders_agree(ins: &inspect::Inspection) {
    let z = ins.work().zstd;
    eprintln!(
        "zstd cubins: {} decoded from the block front, {} by libzstd",
        z.head, z.libzstd
    );
    assert_eq!(
        z.mismatches, 0,
        "the front decoder disagreed with libzstd: {z:?}"
    );
    assert!(
        z.libzstd * 10 <= z.head,
        "too many fallbacks to libzstd: {z:?}"
    );
}
