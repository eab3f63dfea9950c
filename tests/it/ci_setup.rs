//! `.ci/setup`, the first half of the README's test command, on a machine that lacks
//! what the tests call: it installs the missing packages with apt-get when it can, and
//! otherwise stops — before anything compiles or downloads — with the exact command to
//! run. Run against stand-ins for `id`, `apt-get` and the tools, with nothing else on PATH.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

fn script(dir: &Path, name: &str, body: &str) {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A PATH holding only bash, env and the given stand-ins; runs `source .ci/setup` there.
fn setup_with(uid: u32, extra: &dyn Fn(&Path)) -> (std::process::Output, tempfile::TempDir) {
    let bin = tempfile::tempdir().unwrap();
    for tool in ["bash", "env"] {
        let real = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("no {tool}"));
        std::os::unix::fs::symlink(real, bin.path().join(tool)).unwrap();
    }
    script(bin.path(), "id", &format!("echo {uid}"));
    extra(bin.path());
    let cache = bin.path().join("wheel-cache");
    let out = Command::new(bin.path().join("bash"))
        .current_dir(REPO)
        .env_clear()
        .env("PATH", bin.path())
        .env("HOME", bin.path())
        .env("FDL_ORACLE_CACHE", &cache)
        .args(["-c", "source .ci/setup"])
        .output()
        .unwrap();
    assert!(
        !cache.exists(),
        "the wheels were fetched although setup stopped"
    );
    (out, bin)
}

#[test]
fn without_root_or_sudo_it_stops_with_the_command_to_run() {
    let (out, _bin) = setup_with(1000, &|_| {});
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("sudo apt-get update && sudo apt-get install -y --no-install-recommends debootstrap openssh-client rsync gcc g++ binutils make git python3"),
        "{err}"
    );
}

#[test]
fn as_root_it_installs_the_missing_packages_with_apt() {
    let (out, bin) = setup_with(0, &|bin| {
        let log = bin.join("apt.log");
        script(
            bin,
            "apt-get",
            &format!("echo \"$*\" >> '{}'", log.display()),
        );
    });
    let err = String::from_utf8_lossy(&out.stderr);
    let log = std::fs::read_to_string(bin.path().join("apt.log")).unwrap_or_default();
    assert!(log.starts_with("update -qq\n"), "{log}");
    assert!(
        log.contains("install -y --no-install-recommends debootstrap openssh-client rsync"),
        "{log}"
    );
    // The stand-in installed nothing, and there is no docker: it still stops, saying how.
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("sudo apt-get install -y docker.io"), "{err}");
}

/// CI runs the README's test command as the README writes it, and that command is the
/// one that sets the machine up.
#[test]
fn the_readme_test_command_sets_the_machine_up() {
    let readme = std::fs::read_to_string(Path::new(REPO).join("README.md")).unwrap();
    assert!(
        readme.contains(
            "Run the tests:\n\n```bash\nsource .ci/setup && cargo test --no-fail-fast -- --include-ignored\n```"
        ),
        "README's test command changed: update .ci/setup's header and this test"
    );
    let run = std::fs::read_to_string(Path::new(REPO).join(".ci/run")).unwrap();
    assert!(
        run.contains("readme_command \"Run the tests\"")
            && run.contains("readme_command \"Run the main job\"")
    );
}
