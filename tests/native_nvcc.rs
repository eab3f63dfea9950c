//! Discovery and the plan's toolkit checks against a real nvcc: the one in NVIDIA's
//! `nvidia-cuda-nvcc` PyPI wheel, which `.ci/fetch-oracles` downloads (pinned), unpacks
//! and names in `FDL_TEST_CUDA_HOME`. It runs on any x86-64 Linux host: `nvcc --version`
//! and `--list-gpu-arch` need no GPU, and `--dry-run` compiles nothing.
//!
//! Without `FDL_TEST_CUDA_HOME` the test says SKIPPED loudly and returns.

mod common;
mod native_fixture;
use common::*;
use fdl::arch::Arch;

#[test]
fn real_nvcc_from_the_pypi_wheel() {
    let Some(home) = oracle_input("FDL_TEST_CUDA_HOME") else {
        return;
    };

    // Discovery: nvcc found in the wheel's layout, its real answers parsed.
    let report = fdl::native::discover(Some(&home), false);
    let toolkit = report.toolkit.clone().unwrap_or_else(|| {
        panic!(
            "no toolkit found at {}: {:?}",
            home.display(),
            report.missing
        )
    });
    assert_eq!(toolkit.nvcc, home.join("bin/nvcc"));
    assert_eq!(toolkit.cuda_home, home);
    assert_eq!(
        toolkit.lib_dir,
        home.join("lib"),
        "the wheels have no lib64/"
    );
    assert!(
        toolkit.cuda.patch.is_some(),
        "the patch level of {} was lost",
        toolkit.cuda
    );
    let archs = toolkit
        .gpu_archs
        .clone()
        .expect("this nvcc answers --list-gpu-arch");
    let names: Vec<String> = archs.iter().map(|a| a.to_string()).collect();
    eprintln!(
        "real nvcc: CUDA {} at {}; --list-gpu-arch: {}",
        toolkit.cuda,
        home.display(),
        names.join(" ")
    );
    assert_eq!(toolkit.cuda.major, 13, "the pinned wheel is CUDA 13");
    for a in [(7, 5), (8, 6), (9, 0), (12, 0)] {
        assert!(
            archs.contains(&Arch::new(a.0, a.1)),
            "sm_{}{} missing: {names:?}",
            a.0,
            a.1
        );
    }
    // CUDA 13 dropped Pascal and Volta.
    assert!(!archs.contains(&Arch::new(6, 1)) && !archs.contains(&Arch::new(7, 0)));

    let project = ProjectFixture::empty();
    let cache = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("nccl");
    native_fixture::standin_tree(&tree, (2, 27, 5));
    let dry_run = |cuda: &str, archs: &str, extra: &[&str]| {
        let mut cmd = fdl_in(project.root());
        cmd.env("XDG_CACHE_HOME", cache.path())
            .env_remove("CUDA_HOME")
            .args([
                "nccl",
                "build",
                "--dry-run",
                "--backend",
                "native",
                "--tag",
                "v2.27.5-1",
            ])
            .args(["--cuda", cuda, "--archs", archs, "--cuda-home"])
            .arg(&home)
            .arg("--source")
            .arg(&tree)
            .args(extra);
        cmd.output().unwrap()
    };
    let mm = format!("{}.{}", toolkit.cuda.major, toolkit.cuda.minor);

    // The toolkit's own CUDA: planned, with what nvcc said.
    let out = dry_run(&mm, "8.6", &["--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let planned = &v["plan"]["native"]["toolkit"];
    assert_eq!(planned["cuda"], toolkit.cuda.to_string());
    assert_eq!(planned["lib_dir"], home.join("lib").display().to_string());
    let commands = v["commands"].to_string();
    assert!(
        commands.contains(&format!("CUDA_LIB={}", home.join("lib").display())),
        "{commands}"
    );

    // Another CUDA: refused, unless allowed.
    let out = dry_run("12.8", "8.6", &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "is CUDA {}, but the build asks for CUDA 12.8",
            toolkit.cuda
        )) && err.contains("--allow-cuda-mismatch"),
        "{err}"
    );
    let out = dry_run("12.8", "8.6", &["--allow-cuda-mismatch"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // An arch this nvcc cannot compile: refused, naming it and what it offers.
    let out = dry_run(&mm, "6.1;8.6", &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot compile sm_61"), "{err}");
    assert!(
        err.contains("--list-gpu-arch") && err.contains("sm_75"),
        "{err}"
    );

    // A dry run writes nothing.
    assert_eq!(std::fs::read_dir(project.root()).unwrap().count(), 0);
}
