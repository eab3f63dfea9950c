//! The Docker backend: builds NCCL inside an image and copies the installed tree out.
//!
//! The build context is a private temporary directory holding only the Dockerfile —
//! never the project, which may hold gigabytes of libtorch. Artifacts leave the image
//! through `docker create` + `docker cp`; the container is removed by a guard on every
//! path, including errors and Ctrl-C.

use crate::cache::sha256_hex;
use crate::nccl::build::Backend;
use crate::nccl::plan::{
    BackendPlan, BuildPlan, DockerSource, DockerSteps, DockerfileSpec, ImageProbe,
};
use crate::process;
use crate::progress::{Phase, Progress};
use crate::step::{Paths, Step};
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;

/// The Dockerfile compiled into fdl.
pub const EMBEDDED_DOCKERFILE: &str = include_str!("Dockerfile");

#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    #[error("the docker command was not found on PATH. Install Docker (docker.io or docker-ce), or run on a host that has it")]
    NoCommand,
    #[error("the Docker daemon is not reachable: {0}. Start it (e.g. `sudo systemctl start docker`), check DOCKER_HOST, or add your user to the docker group")]
    DaemonUnreachable(String),
}

/// A reachable Docker engine and how to drive it.
#[derive(Debug, Clone)]
pub struct Engine {
    pub server_version: String,
    /// BuildKit is used when the client has buildx; otherwise the classic builder.
    pub buildkit: bool,
}

impl Engine {
    /// Asks the daemon for its version: distinguishes "no docker" from "no daemon".
    pub fn probe() -> Result<Engine, DockerError> {
        let out = Command::new("docker")
            .args(["version", "--format", "{{.Server.Version}}"])
            .output();
        let out = match out {
            Ok(o) => o,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(DockerError::NoCommand)
            }
            Err(e) => return Err(DockerError::DaemonUnreachable(e.to_string())),
        };
        let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() || version.is_empty() {
            let err = String::from_utf8_lossy(&out.stderr);
            let line = err
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no answer");
            return Err(DockerError::DaemonUnreachable(line.trim().to_string()));
        }
        let buildkit = Command::new("docker")
            .args(["buildx", "version"])
            .output()
            .is_ok_and(|o| o.status.success());
        Ok(Engine {
            server_version: version,
            buildkit,
        })
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new("docker");
        // Without buildx a modern client refuses DOCKER_BUILDKIT=1, so say which builder.
        cmd.env("DOCKER_BUILDKIT", if self.buildkit { "1" } else { "0" });
        cmd
    }

    /// A plan's step, run against this engine (which adds only the builder choice, and
    /// BuildKit's plain progress: one line per event, for the log). The image build adds
    /// `--force-rm` for the classic builder (see `DockerBackend::build`).
    fn step(&self, step: &Step) -> Command {
        let mut cmd = step.command();
        cmd.env("DOCKER_BUILDKIT", if self.buildkit { "1" } else { "0" });
        cmd.env("BUILDKIT_PROGRESS", "plain");
        cmd
    }
}

/// What the probe runs in the image, with `/bin/sh`: which tools are there, and the
/// toolkit found as the embedded Dockerfile finds it. Each answer is a line with a
/// `fdl-` word first, so nothing else the image prints can pass for one.
const PROBE_SCRIPT: &str = r#"for t in make g++ python3 git; do command -v "$t" >/dev/null 2>&1 || echo "fdl-missing $t"; done
command -v apt-get >/dev/null 2>&1 && echo fdl-apt
home=${CUDA_HOME:-}
if [ -z "$home" ]; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then home=/usr/local/cuda
  elif nvcc=$(command -v nvcc); then home=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
  fi
fi
if [ -n "$home" ] && [ -x "$home/bin/nvcc" ]; then
  echo "fdl-cuda-home $home"
  "$home/bin/nvcc" --version 2>&1 | while IFS= read -r l; do echo "fdl-version $l"; done
  "$home/bin/nvcc" --list-gpu-arch 2>/dev/null | while IFS= read -r l; do echo "fdl-arch $l"; done
fi
exit 0
"#;

/// How long the probe may take: it starts a container and asks nvcc twice.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Runs a short, network-less container of `image` to learn what the build will find
/// in it. The image must already be in the engine (`--pull never`): the build would
/// otherwise fail later, trying a registry an offline host cannot reach.
pub fn probe_image(image: &str) -> Result<ImageProbe> {
    check_image_reference(image)?;
    let out = process::output_within(
        Command::new("docker").args([
            "run",
            "--rm",
            "--pull",
            "never",
            "--network",
            "none",
            "--entrypoint",
            "/bin/sh",
            image,
            "-c",
            PROBE_SCRIPT,
        ]),
        PROBE_TIMEOUT,
    )
    .context("cannot run docker to probe --base-image")?;
    let Some(out) = out else {
        bail!(
            "probing --base-image {image} took over {} s: check the Docker engine (`docker run --rm {image} true`)",
            PROBE_TIMEOUT.as_secs()
        );
    };
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        if err.contains("No such image") {
            bail!(
                "--base-image {image} is not in the local Docker engine: `docker load` it, or pull it from a registry or mirror you can reach (`docker pull {image}`), then build again"
            );
        }
        if err.contains("/bin/sh") {
            bail!("--base-image {image} has no /bin/sh, so it cannot run the build's steps: give an image with a shell and a CUDA toolkit");
        }
        bail!(
            "probing --base-image {image} failed: {}",
            err.trim().lines().last().unwrap_or("no message")
        );
    }
    Ok(parse_probe(image, &String::from_utf8_lossy(&out.stdout)))
}

/// Reads the probe's answer lines; anything without an `fdl-` word is ignored.
pub fn parse_probe(image: &str, text: &str) -> ImageProbe {
    let mut probe = ImageProbe {
        image: image.to_string(),
        cuda_home: None,
        cuda: None,
        gpu_archs: None,
        missing: Vec::new(),
        apt: false,
    };
    let (mut version, mut archs) = (String::new(), String::new());
    for line in text.lines() {
        let (key, value) = line.split_once(' ').unwrap_or((line, ""));
        match key {
            "fdl-missing" => probe.missing.push(value.trim().to_string()),
            "fdl-apt" => probe.apt = true,
            "fdl-cuda-home" => probe.cuda_home = Some(value.trim().to_string()),
            "fdl-version" => version.push_str(&format!("{value}\n")),
            "fdl-arch" => archs.push_str(&format!("{value}\n")),
            _ => {}
        }
    }
    probe.cuda = crate::native::parse_nvcc_version(&version);
    probe.gpu_archs = crate::native::parse_gpu_archs(&archs);
    probe
}

/// The directory of the build context that the image copies to /src/nccl.
pub const CONTEXT_SOURCE_DIR: &str = "nccl-source";

/// Fills `<context>/nccl-source` with the NCCL tree of `source`, or leaves it empty so
/// the image clones. Only the tree goes in: not `.git` (history the build does not
/// read) nor an earlier `build/` (objects of another configuration). Links are copied as
/// links, never followed, so nothing outside the tree enters the context.
fn fill_context_source(context: &Path, source: &DockerSource) -> Result<()> {
    let dest = context.join(CONTEXT_SOURCE_DIR);
    std::fs::create_dir(&dest).with_context(|| format!("cannot create {}", dest.display()))?;
    if let DockerSource::Context { path, .. } = source {
        copy_tree(path, &dest, true).with_context(|| {
            format!(
                "cannot copy the NCCL tree at {} into the build context",
                path.display()
            )
        })?;
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path, top: bool) -> Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name();
        if top && (name == ".git" || name == "build") {
            continue;
        }
        let (src, dst) = (entry.path(), to.join(&name));
        let kind = entry.file_type()?;
        if kind.is_dir() {
            std::fs::create_dir(&dst)?;
            copy_tree(&src, &dst, false)?;
        } else if kind.is_file() {
            // Opened without following a link swapped in since, checked on the descriptor.
            let mut f = crate::fsread::open_regular(&src, true)?;
            let mode = f.metadata()?.permissions().mode() & 0o777;
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(&dst)
                .with_context(|| format!("cannot create {}", dst.display()))?;
            std::io::copy(&mut f, &mut out)
                .with_context(|| format!("cannot copy {}", src.display()))?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src)?, &dst)?;
        } else {
            bail!(
                "{} is not a file, directory or link (a FIFO, socket or device): remove it from the source tree",
                src.display()
            );
        }
    }
    Ok(())
}

pub struct DockerBackend {
    pub engine: Engine,
    /// The Dockerfile text the plan's digest was taken of.
    pub dockerfile: String,
}

/// Removes the named container when dropped, whatever happened before.
struct ContainerGuard<'a> {
    engine: &'a Engine,
    name: String,
}

impl Drop for ContainerGuard<'_> {
    fn drop(&mut self) {
        let out = self
            .engine
            .command()
            .args(["rm", "--force", &self.name])
            .output();
        let gone = |o: &std::process::Output| {
            o.status.success() || String::from_utf8_lossy(&o.stderr).contains("No such container")
        };
        match out {
            Ok(o) if gone(&o) => {}
            Ok(o) => eprintln!(
                "warning: could not remove container {}: {}. Remove it with `docker rm -f {}`",
                self.name,
                String::from_utf8_lossy(&o.stderr).trim(),
                self.name
            ),
            Err(e) => eprintln!("warning: could not remove container {}: {e}", self.name),
        }
    }
}

/// `--base-image` reaches `docker build` as one argument, never a shell; it is still
/// held to what an image reference can be (`registry:5000/repo/name:tag@sha256:…`), so a
/// typo fails here, plainly, rather than deep in the engine.
pub fn check_image_reference(image: &str) -> Result<()> {
    let ok = !image.is_empty()
        && image.len() <= 255
        && !image.starts_with(['-', '.', ':', '/', '@'])
        && image
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/:@".contains(&b));
    if !ok {
        let shown: String = image.chars().take(80).collect();
        anyhow::bail!("'{shown}' is not an image reference: give one like nvidia/cuda:13.2.0-devel-ubuntu24.04 or mirror.local:5000/cuda:13.2-devel (letters, digits and . _ - / : @)");
    }
    Ok(())
}

/// A Dockerfile is text of a few KiB; anything past this is not one.
const DOCKERFILE_MAX: u64 = 1 << 20;

/// The Dockerfile to build with — the embedded one, or the user's `--dockerfile` —
/// and its digest for the plan. A `--dockerfile` must be a regular file of sane size: a
/// FIFO would hang the read, `/dev/zero` would fill memory.
pub fn dockerfile_spec(path: Option<&Path>) -> Result<(DockerfileSpec, String)> {
    Ok(match path {
        None => (
            DockerfileSpec::Embedded {
                sha256: sha256_hex(EMBEDDED_DOCKERFILE.as_bytes()),
            },
            EMBEDDED_DOCKERFILE.to_string(),
        ),
        Some(path) => {
            let meta = std::fs::metadata(path).with_context(|| {
                format!(
                    "cannot read --dockerfile {}: give the path of a readable Dockerfile",
                    path.display()
                )
            })?;
            if meta.is_file() && meta.len() > DOCKERFILE_MAX {
                bail!(
                    "--dockerfile {} is {} bytes, far more than any Dockerfile: give the path of a Dockerfile",
                    path.display(),
                    meta.len()
                );
            }
            // Checked again on the open descriptor, and read no further than the cap.
            let bytes = crate::fsread::read_regular(path, DOCKERFILE_MAX).with_context(|| {
                format!(
                    "--dockerfile {}: give the path of a Dockerfile",
                    path.display()
                )
            })?;
            let text = String::from_utf8(bytes).map_err(|_| {
                anyhow::anyhow!(
                    "--dockerfile {} is not UTF-8 text: give the path of a Dockerfile",
                    path.display()
                )
            })?;
            let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
            (
                DockerfileSpec::File {
                    path,
                    sha256: sha256_hex(text.as_bytes()),
                },
                text,
            )
        }
    })
}

impl Backend for DockerBackend {
    fn toolchain_identity(
        &self,
        plan: &BuildPlan,
    ) -> Result<std::collections::BTreeMap<String, String>> {
        store_identity(plan, &self.dockerfile)
    }

    fn build(&self, plan: &BuildPlan, staging: &Path, progress: &Progress) -> Result<()> {
        let context = tempfile::Builder::new()
            .prefix("fdl-docker-context-")
            .tempdir()
            .context("cannot create a private build context")?;
        std::fs::write(context.path().join("Dockerfile"), &self.dockerfile)?;
        let container = format!(
            "fdl-nccl-extract-{}-{}",
            std::process::id(),
            context
                .path()
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .rsplit('-')
                .next()
                .unwrap_or("x")
        )
        .to_ascii_lowercase();
        let BackendPlan::Docker(docker) = &plan.backend else {
            bail!(
                "the Docker backend was given a plan for {}",
                plan.backend.kind()
            );
        };
        if let DockerSource::Context { path, .. } = &docker.source {
            progress.note(&format!(
                "==> copying the NCCL tree at {} into the build context",
                path.display()
            ));
        }
        fill_context_source(context.path(), &docker.source)?;
        let paths = Paths {
            entries: vec![
                ("context", context.path().to_path_buf()),
                ("staging", staging.to_path_buf()),
                ("container", container.clone().into()),
            ],
        };
        progress.output(&format!("==> fdl: paths: {}", paths.describe()));
        let steps = DockerSteps::new(docker, &paths);
        progress.note(&format!(
            "==> docker build ({} builder) {}",
            if self.engine.buildkit {
                "BuildKit"
            } else {
                "classic"
            },
            docker.image
        ));
        progress.output(&format!("==> fdl: step: {}", steps.build.render()));
        // Image steps stand in for phases: the base image and tools are prepared, then
        // the clone and the compile happen in RUN steps whose output is the build's.
        progress.phase(Phase::Prepare);
        let mut phase = Phase::Prepare;
        // The step running when the build stopped says what to suggest.
        let mut last_step = String::new();
        let mut on_line = |line: &str| {
            progress.output(line);
            if let Some((done, total)) = crate::progress::docker_step(line) {
                let next = if line.contains("make ") {
                    Phase::Compile
                } else if line.contains("git clone") || line.contains("COPY nccl-source") {
                    Phase::Clone
                } else {
                    phase
                };
                if next != phase {
                    phase = next;
                    progress.phase(phase);
                }
                progress.set_total(total);
                progress.advance(&format!("image step {done}/{total}"));
                last_step = line.to_string();
            }
        };
        let mut build = self.engine.step(&steps.build);
        if !self.engine.buildkit {
            // The classic builder keeps the container of a failed step (and of an
            // interrupted one) unless told otherwise; BuildKit leaves none.
            build.arg("--force-rm");
        }
        let built = process::stream(&mut build, &steps.build.what, &mut on_line);
        if let Err(e) = built {
            let hint = if last_step.contains("FROM") {
                ". The base image could not be had: if no registry is reachable from here, \
                 pass --base-image IMAGE, an image with a CUDA toolkit that this engine \
                 has (a mirror's, or one `docker load`ed): the build starts FROM it"
            } else {
                ""
            };
            return Err(e.context(format!(
                "the image build failed. Nothing was installed{hint}"
            )));
        }

        // The guard exists before `create` runs: an interrupt between the two must not
        // leave a container behind. Removing a container that never came is harmless.
        let _guard = ContainerGuard {
            engine: &self.engine,
            name: container.clone(),
        };
        progress.phase(Phase::Install);
        for step in [&steps.create, &steps.copy] {
            progress.output(&format!("==> fdl: step: {}", step.render()));
        }
        process::capture(&mut self.engine.step(&steps.create), &steps.create.what)?;
        progress.note(&format!(
            "==> docker cp {}:{} → staging",
            container,
            crate::nccl::plan::IMAGE_INSTALL_DIR
        ));
        process::capture(&mut self.engine.step(&steps.copy), &steps.copy.what).context(
            "could not copy the NCCL install tree out of the image; does the Dockerfile install into /usr/local/nccl?",
        )?;
        Ok(())
    }
}

/// The build store's toolchain identity of a Docker build: the engine's ID (a content
/// digest) of the base image the Dockerfile starts from, and the Dockerfile's SHA-256.
/// The image must be there already: before its first build pulls it, the key is not
/// known (and the build computes it after).
fn store_identity(
    plan: &BuildPlan,
    dockerfile: &str,
) -> Result<std::collections::BTreeMap<String, String>> {
    let BackendPlan::Docker(docker) = &plan.backend else {
        bail!(
            "the Docker backend was given a plan for {}",
            plan.backend.kind()
        );
    };
    // `--base-image`, else the Dockerfile's own `ARG BASE_IMAGE=` default.
    let base = match &docker.base_image {
        Some(b) => b.clone(),
        None => dockerfile
            .lines()
            .find_map(|l| l.trim().strip_prefix("ARG BASE_IMAGE="))
            .map(|v| v.trim().to_string())
            .ok_or_else(|| anyhow::anyhow!("the Dockerfile names no default BASE_IMAGE"))?,
    };
    check_image_reference(&base)?;
    let id = process::capture(
        Command::new("docker").args(["image", "inspect", "--format", "{{.Id}}", &base]),
        "docker image inspect",
    )
    .with_context(|| format!("the base image {base} is not in the engine yet"))?;
    let id = id.trim();
    if !id.starts_with("sha256:") || id.len() > 200 || id.chars().any(char::is_control) {
        bail!("docker image inspect gave no image ID for {base}");
    }
    Ok([
        ("base_image".to_string(), base.clone()),
        ("base_image_id".to_string(), id.to_string()),
        (
            "dockerfile_sha256".to_string(),
            sha256_hex(dockerfile.as_bytes()),
        ),
    ]
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Arch;
    use crate::nccl::plan::{
        ArchOrigin, BackendInputs, BackendPlan, BuildPlan, PlanInputs, TagOrigin,
    };
    use crate::nccl::tag::Tag;
    use std::collections::BTreeMap;

    /// The embedded Dockerfile's `ARG`s: name → whether it has a default.
    fn declared() -> BTreeMap<String, bool> {
        EMBEDDED_DOCKERFILE
            .lines()
            .filter_map(|l| l.trim().strip_prefix("ARG "))
            .map(|a| match a.split_once('=') {
                Some((name, _)) => (name.trim().to_string(), true),
                None => (a.trim().to_string(), false),
            })
            .collect()
    }

    fn passed(only_funcs: Option<&str>) -> Vec<String> {
        let plan = BuildPlan::new(PlanInputs {
            tag: Tag::parse("v2.27.5-1").unwrap(),
            tag_origin: TagOrigin::Flag,
            cuda_flag: None,
            cuda_from_libtorch: None,
            archs: vec![Arch::new(8, 6)],
            arch_origin: ArchOrigin::Flag,
            jobs: 2,
            jobs_reason: "test".into(),
            builds_dir: "/p/libtorch/nccl/builds".into(),
            backend: BackendInputs::Docker {
                dockerfile: dockerfile_spec(None).unwrap().0,
                base_image: None,
                source: crate::nccl::plan::DockerSource::Clone,
                probe: None,
            },
            backend_reason: "test".into(),
            ptx: false,
            only_funcs: only_funcs.map(str::to_string),
            warnings: Vec::new(),
        })
        .unwrap();
        let BackendPlan::Docker(d) = plan.backend else {
            panic!("not a Docker plan")
        };
        d.build_args.into_iter().map(|(k, _)| k).collect()
    }

    #[test]
    fn the_probe_answer_is_read_line_by_line() {
        let text = "motd from the image\nfdl-missing git\nfdl-missing python3\nfdl-apt\n\
            fdl-cuda-home /opt/nvidia/cu13\n\
            fdl-version nvcc: NVIDIA (R) Cuda compiler driver\n\
            fdl-version Cuda compilation tools, release 13.5, V13.5.37\n\
            fdl-arch compute_75\nfdl-arch compute_107\nfdl-arch compute_107a\n";
        let p = parse_probe("img:1", text);
        assert_eq!(p.missing, ["git", "python3"]);
        assert!(p.apt);
        assert_eq!(p.cuda_home.as_deref(), Some("/opt/nvidia/cu13"));
        assert_eq!(p.cuda.unwrap().to_string(), "13.5.37");
        assert_eq!(
            p.gpu_archs.unwrap(),
            [Arch::new(7, 5), Arch::from_number(107)]
        );
        // An image with nothing: no toolkit, no apt; lines without `fdl-` count for nothing.
        let p = parse_probe("img:1", "fdl-missingmake\nnvcc 13.5\n");
        assert_eq!((p.cuda_home, p.cuda, p.apt), (None, None, false));
        assert!(p.missing.is_empty());
    }

    #[test]
    fn the_build_context_gets_the_tree_without_history_or_old_objects() {
        let src = tempfile::tempdir().unwrap();
        let ctx = tempfile::tempdir().unwrap();
        let s = src.path();
        for dir in [".git", "build/obj", "src/build", "makefiles"] {
            std::fs::create_dir_all(s.join(dir)).unwrap();
        }
        std::fs::write(s.join(".git/HEAD"), "x").unwrap();
        std::fs::write(s.join("build/obj/a.o"), "x").unwrap();
        std::fs::write(s.join("src/build/kept"), "x").unwrap();
        std::fs::write(s.join("makefiles/version.mk"), "NCCL_MAJOR := 2\n").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", s.join("src/link")).unwrap();
        let source = DockerSource::Context {
            path: s.to_path_buf(),
            version: "2.27.5".parse().unwrap(),
        };
        fill_context_source(ctx.path(), &source).unwrap();
        let copy = ctx.path().join(CONTEXT_SOURCE_DIR);
        assert!(!copy.join(".git").exists() && !copy.join("build").exists());
        assert!(copy.join("src/build/kept").is_file());
        assert_eq!(
            std::fs::read_to_string(copy.join("makefiles/version.mk")).unwrap(),
            "NCCL_MAJOR := 2\n"
        );
        // A link stays a link: what it points at never enters the context.
        let link = copy.join("src/link");
        assert!(link.symlink_metadata().unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_link(link).unwrap(), Path::new("/etc/passwd"));

        // Cloning: the directory is there, empty, for the Dockerfile's COPY.
        let ctx = tempfile::tempdir().unwrap();
        fill_context_source(ctx.path(), &DockerSource::Clone).unwrap();
        let dir = ctx.path().join(CONTEXT_SOURCE_DIR);
        assert_eq!(std::fs::read_dir(dir).unwrap().count(), 0);
    }

    /// The contract between the plan and the embedded Dockerfile: every build argument
    /// the plan passes is declared, and every ARG without a default is passed.
    #[test]
    fn the_plan_passes_exactly_what_the_embedded_dockerfile_declares() {
        let declared = declared();
        for only_funcs in [None, Some("AllReduce Sum f32")] {
            let passed = passed(only_funcs);
            for arg in &passed {
                assert!(
                    declared.contains_key(arg),
                    "the plan passes {arg}, which the Dockerfile does not declare"
                );
            }
            for (arg, has_default) in &declared {
                assert!(
                    *has_default || passed.contains(arg),
                    "the Dockerfile needs {arg}, which the plan does not pass"
                );
            }
        }
        assert!(declared.contains_key("BASE_IMAGE") && declared.contains_key("ONLY_FUNCS"));
    }
}
