//! A stand-in NCCL source tree, as the README's tour builds it: NCCL's Makefile targets
//! and variables, its install layout and self-id, prepared GPU code for every arch, and
//! every `nccl*` function a `libtorch_cuda.so` imports (each returning 0). It builds in a
//! second where NVIDIA's tree takes tens of minutes, so the tour runs on any machine; it
//! is the tests' own stand-in (tests/native_fixture), and it runs no collective.
//!
//!     cargo run --example standin-nccl -- DIR X.Y.Z LIBTORCH_CUDA_SO

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/native_fixture/mod.rs"]
mod native_fixture;

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: cargo run --example standin-nccl -- DIR X.Y.Z LIBTORCH_CUDA_SO\n  e.g. cargo run --example standin-nccl -- ~/src/nccl-2.30.7-1 2.30.7 ~/site-packages/torch/lib/libtorch_cuda.so";

fn main() -> ExitCode {
    match run(std::env::args_os().skip(1).collect()) {
        Ok(dir) => {
            println!(
                "A stand-in NCCL tree at {}: build it with `fdl nccl build --backend native --source {}`",
                fdl::text::shown(&dir),
                fdl::text::shown(&dir)
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            // The fixture quotes the library and nm: shown with their controls escaped.
            eprintln!("error: {}", fdl::text::terminal_safe(&e));
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<std::ffi::OsString>) -> Result<PathBuf, String> {
    let [dir, version, lib] = args.as_slice() else {
        return Err(format!("three arguments are needed\n{USAGE}"));
    };
    let dir = PathBuf::from(dir);
    let version = version.to_string_lossy();
    let parsed: Vec<u32> = version
        .split('.')
        .map(|p| p.parse::<u32>())
        .collect::<Result<_, _>>()
        .map_err(|_| format!("{version:?} is not a version X.Y.Z\n{USAGE}"))?;
    let [x, y, z] = parsed.as_slice() else {
        return Err(format!("{version:?} is not a version X.Y.Z\n{USAGE}"));
    };
    if dir.symlink_metadata().is_ok() {
        return Err(format!(
            "{} exists: give a new directory (nothing was written)",
            fdl::text::shown(&dir)
        ));
    }
    let lib = PathBuf::from(lib);
    if !lib.is_file() {
        return Err(format!("{} is not a file\n{USAGE}", fdl::text::shown(&lib)));
    }
    std::fs::create_dir(&dir)
        .map_err(|e| format!("cannot make {}: {e}", fdl::text::shown(&dir)))?;
    // The fixture's writes panic on an I/O error (disk full): said as an error, and the
    // half-written tree removed.
    std::panic::set_hook(Box::new(|_| {}));
    let version = (*x, *y, *z);
    let made = std::panic::catch_unwind(|| native_fixture::standin_tree_for(&dir, version, &lib))
        .unwrap_or_else(|_| {
            Err(format!(
                "could not write the tree into {}",
                fdl::text::shown(&dir)
            ))
        });
    if let Err(e) = made {
        let _ = std::fs::remove_dir_all(&dir);
        return Err(e);
    }
    Ok(dir)
}
