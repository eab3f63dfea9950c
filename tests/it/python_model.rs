//! What fdl reads from real torch wheels' `__init__.py` about the libraries torch opens
//! before libtorch (`loader::python`), checked against what each file's code says (read
//! by eye once, recorded here): torch 1.13.1, 2.0.1, 2.8.0 and 2.15.0.

use crate::common;
use common::oracle_input;
use fdl::loader::python::{Segment, TorchLoading, Wanted};
use std::path::{Path, PathBuf};

/// `torch/__init__.py` and `torch/version.py` of the cached wheel of `version`, in a new
/// `torch/` directory (the wheels are in the oracle cache, beside `unpacked/`).
fn torch_init(version: &str, into: &Path) -> PathBuf {
    let cache = oracle_input("FDL_TEST_TORCH_LIB")
        .ancestors()
        .nth(5)
        .unwrap()
        .to_path_buf();
    let wheel = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            n.starts_with(&format!("torch-{version}-")) && n.ends_with(".whl")
        })
        .unwrap_or_else(|| panic!("no torch {version} wheel in {}", cache.display()));
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys, zipfile\nz = zipfile.ZipFile(sys.argv[1])\nfor n in ('torch/__init__.py', 'torch/version.py'):\n    z.extract(n, sys.argv[2])",
        ])
        .arg(&wheel)
        .arg(into)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    into.join("torch")
}

fn wanted(folder: &str, pattern: &str, required: bool) -> Wanted {
    Wanted {
        folder: folder.into(),
        pattern: pattern.into(),
        required,
    }
}

fn lit(s: &str) -> Segment {
    Segment::Literal(s.into())
}

#[test]
#[ignore = "needs the torch wheels: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn torch_1_13_preloads_no_nccl() {
    let dir = tempfile::tempdir().unwrap();
    let torch = torch_init("1.13.1", dir.path());
    let l = TorchLoading::read(&torch).unwrap();
    assert!(matches!(l, TorchLoading::NoNccl { .. }), "{l:?}");
}

#[test]
#[ignore = "needs the torch wheels: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn torch_2_8_preloads_nccl_only_when_its_global_deps_fail() {
    let dir = tempfile::tempdir().unwrap();
    let torch = torch_init("2.8.0", dir.path());
    let TorchLoading::Preloads {
        places,
        normal,
        fallback,
        cuda,
        ..
    } = TorchLoading::read(&torch).unwrap()
    else {
        panic!("torch 2.8.0's preloads were not read");
    };
    assert_eq!(cuda.as_deref(), Some("12.8"));
    assert_eq!(
        places,
        vec![
            vec![lit("nvidia"), Segment::Folder, lit("lib")],
            vec![Segment::Folder, lit("lib")]
        ]
    );
    assert_eq!(
        normal.if_mapped.as_deref(),
        Some("nvidia/cuda_runtime/lib/libcudart.so")
    );
    assert_eq!(
        normal.wanted,
        vec![
            wanted("cuda_nvrtc", "libnvrtc.so.*[0-9]", true),
            wanted("nvjitlink", "libnvJitLink.so.*[0-9]", true),
        ]
    );
    // The dict of the fallback, in order, cufile added for CUDA 12 and later.
    let folders: Vec<&str> = fallback.wanted.iter().map(|w| w.folder.as_str()).collect();
    assert_eq!(
        folders,
        [
            "cublas",
            "cudnn",
            "cuda_nvrtc",
            "cuda_runtime",
            "cuda_cupti",
            "cufft",
            "curand",
            "nvjitlink",
            "cusparse",
            "cusparselt",
            "cusolver",
            "nccl",
            "cufile"
        ]
    );
    assert!(fallback.wanted.iter().all(|w| w.required));
    assert_eq!(
        fallback.wanted[11],
        wanted("nccl", "libnccl.so.*[0-9]", true)
    );
}

#[test]
#[ignore = "needs the torch wheels: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn torch_2_15_preloads_nccl_on_every_import_with_cudart() {
    let dir = tempfile::tempdir().unwrap();
    let torch = torch_init("2.15.0", dir.path());
    let loading = TorchLoading::read(&torch).unwrap();
    assert_eq!(
        loading.nccl_on_import(),
        Some(&wanted("nccl", "libnccl.so.*[0-9]", false))
    );
    let TorchLoading::Preloads {
        places,
        normal,
        fallback,
        cuda,
        ..
    } = loading
    else {
        unreachable!()
    };
    assert_eq!(cuda.as_deref(), Some("13.2"));
    assert_eq!(
        places,
        vec![
            vec![lit("nvidia"), Segment::Folder, lit("lib")],
            vec![
                lit("nvidia"),
                Segment::CudaMajor("cu".into(), String::new()),
                lit("lib")
            ],
            vec![Segment::Folder, lit("lib")]
        ]
    );
    assert_eq!(normal.if_mapped.as_deref(), Some("libcudart.so"));
    // The list in its order (cublasLt before cublas), then nvtx, optional everywhere.
    let patterns: Vec<&str> = normal.wanted.iter().map(|w| w.pattern.as_str()).collect();
    assert_eq!(patterns[0], "libcublasLt.so.*[0-9]");
    assert_eq!(patterns.last(), Some(&"libnvToolsExt.so.*[0-9]"));
    assert_eq!(normal.wanted.len(), 16);
    assert!(normal.wanted.iter().all(|w| !w.required));
    // The fallback requires each of the list; nvtx stays optional.
    assert_eq!(fallback.wanted.len(), 16);
    assert!(fallback.wanted[..15].iter().all(|w| w.required));
    assert!(!fallback.wanted[15].required);
}

#[test]
#[ignore = "needs the torch wheels: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn torch_2_0_preloads_nccl_only_when_its_global_deps_fail() {
    // `nvidia_path = os.path.join(path, 'nvidia')`, then a glob under it: one place.
    let torch = oracle_input("FDL_TEST_TORCH20_INIT");
    let loading = TorchLoading::read(&torch).unwrap();
    assert_eq!(loading.nccl_on_import(), None);
    let TorchLoading::Preloads {
        places,
        normal,
        fallback,
        ..
    } = loading
    else {
        panic!("torch 2.0.1's preloads were not read");
    };
    assert_eq!(
        places,
        vec![vec![lit("nvidia"), Segment::Folder, lit("lib")]]
    );
    assert!(
        normal.wanted.is_empty() && normal.if_mapped.is_none(),
        "{normal:?}"
    );
    let folders: Vec<&str> = fallback.wanted.iter().map(|w| w.folder.as_str()).collect();
    assert_eq!(
        folders,
        [
            "cublas",
            "cudnn",
            "cuda_nvrtc",
            "cuda_runtime",
            "cuda_cupti",
            "cufft",
            "curand",
            "cusolver",
            "cusparse",
            "nccl",
            "nvtx"
        ]
    );
    assert_eq!(
        fallback.wanted[9],
        wanted("nccl", "libnccl.so.*[0-9]", true)
    );
    assert_eq!(fallback.wanted[2].pattern, "libnvrtc.so.*[0-9].*[0-9]");
}
