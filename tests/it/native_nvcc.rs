//! Discovery and the plan's toolkit checks against a real nvcc: the one in NVIDIA's
//! `nvidia-cuda-nvcc` PyPI wheel, which `.ci/fetch-oracles` downloads (pinned), unpacks
//! and names in `FDL_TEST_CUDA_HOME`. It runs on any x86-64 Linux host: `nvcc --version`
//! and `--list-gpu-arch` need no GPU, and `--dry-run` compiles nothing.
//!
//! `#[ignore]`d unless asked for (`--include-ignored`); then a missing input fails.
//!
//! The newest toolkit (`FDL_TEST_CUDA_HOME_NEWEST`: CUDA 13.5's nvcc, cicc, headers and
//! cudart from their wheels, as one CUDA_HOME) really compiles: a whole native build of a
//! stand-in NCCL whose kernel nvcc compiles for the planned archs, then every command
//! that manages builds, on it. nvcc needs no GPU, nor does loading the library.

use crate::common;
use crate::native_fixture;
use common::oracle::{assert_lists_like_cuobjdump, listing, nccl_get_version};
use common::*;
use fdl::arch::Arch;
use std::collections::BTreeMap;
use std::process::Output;

#[test]
#[ignore = "needs the real NVIDIA inputs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn real_nvcc_from_the_pypi_wheel() {
    let home = oracle_input("FDL_TEST_CUDA_HOME");

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

    // The nvcc wheel alone cannot compile NCCL (no cuda_runtime.h, no libcudart, no
    // crt/ headers, no cicc): the plan is refused, naming each wheel that provides them.
    let out = dry_run(&mm, "8.6", &[]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{said}");
    for needle in [
        "lacks include/cuda_runtime.h",
        "`nvidia-cuda-runtime` wheel",
        "include/crt/host_config.h",
        "`nvidia-cuda-crt` wheel",
        "nvvm/bin/cicc",
        "`nvidia-nvvm` wheel",
    ] {
        assert!(said.contains(needle), "{needle}: {said}");
    }

    // With the other wheels of one CUDA beside it (the newest toolchain of the oracle
    // cache), the home compiles: the checks below are on it.
    let home = oracle_input("FDL_TEST_CUDA_HOME_NEWEST");
    let toolkit = fdl::native::discover(Some(&home), false).toolkit.unwrap();
    let mm = format!("{}.{}", toolkit.cuda.major, toolkit.cuda.minor);
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
    // The store's inputs name archs as the plan does (`sm_86`), not as a build's
    // directory name does (`sm86`).
    assert_eq!(v["store"]["inputs"]["archs"], "sm_86", "{}", v["store"]);
    assert_eq!(planned["lib_dir"], home.join("lib").display().to_string());
    let commands = v["commands"].to_string();
    assert!(
        commands.contains(&format!("CUDA_LIB={}", home.join("lib").display())),
        "{commands}"
    );

    // Another CUDA: refused, unless allowed.
    let out = dry_run("12.8", "8.6", &[]);
    assert!(!out.status.success());
    // The plan's problems are shown with the plan, on stdout.
    let err = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
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
    // The plan's problems are shown with the plan, on stdout.
    let err = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(err.contains("cannot compile sm_61"), "{err}");
    assert!(
        err.contains("--list-gpu-arch") && err.contains("sm_75"),
        "{err}"
    );

    // A GPU of this host that --archs leaves out: the advice to cover it names what this
    // toolkit lacks. CUDA 13.5 cannot compile the GTX 1060's sm_61, so the advice also
    // names the CUDA that compiles it with the rest (the nearest release, 12.9); the
    // RTX 3090's sm_86 it compiles, so that advice is --archs alone.
    for (smi_out, gpu, clause) in [
        (
            "0, NVIDIA GeForce GTX 1060 6GB, 6.1, 6144\n1, NVIDIA GeForce RTX 5060 Ti, 12.0, 16311\n",
            "GPU 0 (NVIDIA GeForce GTX 1060 6GB, sm_61)",
            Some(format!(
                "pass --archs \"6.1;12.0\" with a CUDA 12.9 toolkit (--cuda-home DIR and --cuda 12.9): the toolkit at {} (CUDA {}) cannot compile sm_61",
                home.display(),
                toolkit.cuda
            )),
        ),
        (
            "0, NVIDIA GeForce RTX 3090, 8.6, 24576\n1, NVIDIA GeForce RTX 5060 Ti, 12.0, 16311\n",
            "GPU 0 (NVIDIA GeForce RTX 3090, sm_86)",
            None,
        ),
    ] {
        let smi = fake_nvidia_smi(smi_out, 0);
        let out = fdl_in(project.root())
            .env("XDG_CACHE_HOME", cache.path())
            .env("PATH", path_with(smi.path()))
            .env_remove("CUDA_HOME")
            .args(["nccl", "build", "--dry-run", "--json", "--backend", "native"])
            .args(["--tag", "v2.27.5-1", "--cuda", &mm, "--archs", "12.0"])
            .arg("--cuda-home")
            .arg(&home)
            .arg("--source")
            .arg(&tree)
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let warning = v["plan"]["warnings"]
            .as_array()
            .and_then(|w| w.iter().filter_map(|w| w.as_str()).find(|w| w.contains(gpu)))
            .unwrap_or_else(|| panic!("no warning for {gpu}: {v}"))
            .to_string();
        match clause {
            Some(clause) => assert!(warning.ends_with(&clause), "{warning}\nwanted: {clause}"),
            None => assert!(
                warning.ends_with("pass --archs \"8.6;12.0\""),
                "this toolkit compiles sm_86: {warning}"
            ),
        }
    }

    // A dry run writes nothing.
    assert_eq!(std::fs::read_dir(project.root()).unwrap().count(), 0);
}

/// `fdl nccl build --backend native` with the real newest nvcc, for two archs from its
/// `--list-gpu-arch`, then `list` (text and JSON), `env`, `verify`, the same build again
/// (a no-op), `--force`, and `remove`: each must succeed on the build it made, whose
/// library holds SASS for exactly the planned archs, as fdl and cuobjdump read it.
#[test]
#[ignore = "needs the real NVIDIA inputs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn real_native_build_with_the_newest_nvcc() {
    let (home, cuobjdump) = (
        oracle_input("FDL_TEST_CUDA_HOME_NEWEST"),
        oracle_input("FDL_TEST_CUOBJDUMP"),
    );
    let toolkit = fdl::native::discover(Some(&home), false)
        .toolkit
        .unwrap_or_else(|| panic!("no toolkit found at {}", home.display()));
    let offered = toolkit.gpu_archs.clone().expect("nvcc --list-gpu-arch");
    eprintln!(
        "newest nvcc: CUDA {}; --list-gpu-arch: {}",
        toolkit.cuda,
        offered
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    for a in [Arch::new(8, 6), Arch::new(12, 0)] {
        assert!(offered.contains(&a), "{a} is not in {offered:?}");
    }
    let cuda = format!("{}.{}", toolkit.cuda.major, toolkit.cuda.minor);

    let project = ProjectFixture::empty();
    let cache = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("nccl");
    native_fixture::nvcc_tree(&tree, (2, 27, 5));
    let fdl = |args: &[&str]| -> Output {
        let mut cmd = fdl_in(project.root());
        for var in ["CUDA_HOME", "CXX", "MAKEFLAGS", "FDL_NCCL_REPO"] {
            cmd.env_remove(var);
        }
        cmd.env("XDG_CACHE_HOME", cache.path());
        cmd.args(args).output().unwrap()
    };
    let ok = |what: &str, out: &Output| -> String {
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "fdl {what} failed:\nstdout: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let build = |extra: &[&str]| -> Output {
        let (home, tree) = (home.display().to_string(), tree.display().to_string());
        let mut args = vec![
            "nccl",
            "build",
            "--backend",
            "native",
            "--cuda-home",
            &home,
            "--source",
            &tree,
            "--tag",
            "v2.27.5-1",
            "--cuda",
            &cuda,
            "--archs",
            "8.6;12.0",
        ];
        args.extend_from_slice(extra);
        fdl(&args)
    };

    let v: serde_json::Value =
        serde_json::from_str(&ok("nccl build", &build(&["--json"]))).unwrap();
    assert_eq!(v["status"], "built", "{v}");
    let name = "v2.27.5-sm86-sm120";
    let dir = project.root().join("libtorch/nccl/builds").join(name);
    assert_eq!(v["build_dir"], dir.display().to_string());
    let check_library = || {
        let lib = dir.join("lib/libnccl.so.2.27.5");
        let ins = fdl::inspect::inspect(&lib).unwrap();
        let want: BTreeMap<String, usize> =
            [("sm_86".to_string(), 1), ("sm_120".to_string(), 1)].into();
        assert_eq!(
            listing(&ins.gpu_code.sass),
            want,
            "SASS of {}",
            lib.display()
        );
        assert!(ins.gpu_code.ptx.is_empty(), "{:?}", ins.gpu_code.ptx);
        assert_lists_like_cuobjdump(&cuobjdump, &lib, &ins.gpu_code);
        let id = ins.nccl.expect("self-id");
        assert_eq!(
            (id.version.to_string(), id.cuda.to_string()),
            ("2.27.5".to_string(), cuda.clone())
        );
        assert_eq!(nccl_get_version(&lib), 22705);
    };
    check_library();

    let text = ok("nccl list", &fdl(&["nccl", "list"]));
    assert!(
        text.contains(name) && text.contains("sm_86") && text.contains("sm_120"),
        "{text}"
    );
    assert!(!text.contains("broken"), "{text}");
    let v: serde_json::Value =
        serde_json::from_str(&ok("nccl list --json", &fdl(&["nccl", "list", "--json"]))).unwrap();
    let states: Vec<(&str, &str)> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["state"].as_str().unwrap()))
        .collect();
    assert_eq!(states, [(name, "build")], "{v}");

    let text = ok("nccl env", &fdl(&["nccl", "env", name]));
    assert!(
        text.contains(&dir.join("lib/libnccl.so.2").display().to_string()),
        "{text}"
    );
    let text = ok("nccl verify", &fdl(&["nccl", "verify", name]));
    assert!(text.contains("load") && !text.contains("FAIL"), "{text}");

    // The same plan again: nothing to do. Forced: built anew, replacing it, and as right.
    let text = ok("nccl build (again)", &build(&[]));
    assert!(text.contains("Already built"), "{text}");
    let v: serde_json::Value =
        serde_json::from_str(&ok("nccl build --force", &build(&["--json", "--force"]))).unwrap();
    assert_eq!(v["status"], "replaced", "{v}");
    check_library();

    ok("nccl remove", &fdl(&["nccl", "remove", "--yes", name]));
    assert!(!dir.exists(), "{} is still there", dir.display());
}
