//! The Docker backend: compiles NCCL in a container of a toolchain image, on the host's
//! files.
//!
//! The image holds only the toolchain (the base image plus the tools it lacks), built
//! once per base image, Dockerfile and arguments and kept by the engine
//! ([`toolchain_image`]). The source (the `--source` tree, or the tag fetched on the host
//! as the native backend fetches it) is mounted read-only; the work directory and the
//! staging directory are bind mounts, so object files and the installed tree are written
//! straight to the host's file system — never through the engine's storage driver, which
//! is slow where it is fuse-overlayfs (rootless engines) — and nothing is copied out of an
//! image. The compile runs in `docker run --rm --network none --read-only` as the
//! invoking user, with the make steps and variables of the native backend; each container
//! is removed by a guard on every path, including errors and Ctrl-C.

mod planned;

use crate::digest::sha256_hex;
use crate::native::{self, WorkDir};
use crate::nccl::backend::Backend;
use crate::nccl::plan::{
    BackendPlan, BuildPlan, DockerPlan, DockerSource, DockerSteps, DockerfileSpec, ImageProbe,
    NativeSource,
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
    #[error("the Docker daemon is not reachable: {}{} Start it (e.g. `sudo systemctl start docker`), check DOCKER_HOST, or add your user to the docker group", .0, end_of(.0))]
    DaemonUnreachable(String),
}

/// Where a cache keeps its volume-name id, beside the volumes' tokens.
const CACHE_ID: &str = ".cache-id";

/// `N` random bytes from the kernel, as hex; `what` names them for the error.
fn random_hex<const N: usize>(what: &str) -> Result<String> {
    let mut bytes = [0u8; N];
    // SAFETY: fills exactly the buffer given.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        bail!("cannot draw {what}: {}", std::io::Error::last_os_error());
    }
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The stop after a quoted sentence: none where it ends with one already (docker's own
/// "Is the docker daemon running?").
fn end_of(sentence: &str) -> &'static str {
    if sentence.trim_end().ends_with(['.', '?', '!']) {
        ""
    } else {
        "."
    }
}

/// A reachable Docker engine and how to drive it.
#[derive(Debug, Clone)]
pub struct Engine {
    pub server_version: String,
    /// BuildKit is used when the client has buildx; otherwise the classic builder.
    pub buildkit: bool,
    /// Where what fdl says while it drives the engine goes (a wait, a container it could
    /// not remove).
    pub ctx: crate::context::Context,
}

/// How long a question to the engine (`version`, `info`, `inspect`, `ls`) may take: an
/// engine answers these in milliseconds, and one that does not within this is stuck.
const QUERY_LIMIT: std::time::Duration = std::time::Duration::from_secs(15);
/// How long a change of the engine's state (`volume create`, `rm`, `tag`) may take.
const CHANGE_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Why one call of the engine gave no answer: it did not end within its limit, or it
/// wrote more than [`process::OUTPUT_CAP`] (it was stopped either way).
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("`{what}` did not answer within {secs} s{}, so it was stopped: the Docker engine is stuck or overloaded. Check it (`docker info`), restart it, or build with --backend native", if *.shared { " (what was left of the time this command's engine calls share)" } else { "" })]
    Timeout {
        what: String,
        secs: u64,
        /// The limit was what was left of a [`QueryBudget`].
        shared: bool,
    },
    /// A later call of an engine that did not answer an earlier one: not made, and
    /// said in the earlier call's words (`what` is kept for the JSON and the log).
    #[error("{first}")]
    Stuck { what: String, first: String },
    #[error("`{what}` answered more than {kib} KiB on its {stream}, far more than the engine ever answers, so it was stopped: check the docker command on PATH and the engine")]
    TooLarge {
        what: String,
        kib: usize,
        stream: &'static str,
    },
}

/// The engine calls of one stretch of fdl's work that share one deadline (see
/// [`QueryBudget`]); `None` outside one.
static BUDGET: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);
/// Set by the first question (a call within [`QUERY_LIMIT`]) that did not answer in time:
/// an engine stuck on one question is not asked another by the same fdl.
static STUCK: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// While alive, every engine call shares one deadline, `total` from the start: a plan
/// asks the engine several questions (version, buildx, storage driver, images), and an
/// engine that answers none must cost the plan `total` in all, not `total` each.
pub struct QueryBudget {
    outer: Option<std::time::Instant>,
}

impl QueryBudget {
    pub fn start(total: std::time::Duration) -> QueryBudget {
        let mut b = BUDGET.lock().unwrap_or_else(|e| e.into_inner());
        let deadline = std::time::Instant::now() + total;
        let outer = *b;
        // A budget inside another keeps the earlier deadline.
        *b = Some(outer.map_or(deadline, |o| o.min(deadline)));
        QueryBudget { outer }
    }
}

impl Drop for QueryBudget {
    fn drop(&mut self) {
        *BUDGET.lock().unwrap_or_else(|e| e.into_inner()) = self.outer;
    }
}

/// How long an engine call runs before fdl says that it waits for it.
const SLOW_ANSWER: std::time::Duration = std::time::Duration::from_secs(2);
/// Whether the wait was said already (once per fdl).
static SAID_WAITING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The planning of a build: every engine question it asks shares this much time.
pub const PLAN_BUDGET: std::time::Duration = QUERY_LIMIT;

/// Runs one call of the engine, bounded in time (`limit`, and the deadline of a
/// [`QueryBudget`] alive) and in output ([`process::OUTPUT_CAP`] per stream), in a
/// process group that dies with fdl. Every call of the engine that is not a build's own
/// output goes through here, so none can hang fdl or fill its memory; the error names
/// the call and the bound it passed. Once a question has not answered in time, later
/// questions fail at once with its error; changes are still tried.
fn engine_call(
    ctx: &crate::context::Context,
    cmd: &mut Command,
    limit: std::time::Duration,
) -> Result<std::process::Output> {
    // The call's words up to its first option: `docker image inspect`, `docker info`.
    let what = std::iter::once(cmd.get_program())
        .chain(
            cmd.get_args()
                .take_while(|a| !a.to_string_lossy().starts_with('-')),
        )
        .take(3)
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    // Questions only: a change (`rm --force` of a compile's container on the way out,
    // say) is still tried, within its own limit, whatever an earlier question met.
    let question = limit <= QUERY_LIMIT;
    if let Some(first) = STUCK.get().filter(|_| question) {
        return Err(CallError::Stuck {
            what,
            first: first.clone(),
        }
        .into());
    }
    let deadline = *BUDGET.lock().unwrap_or_else(|e| e.into_inner());
    let (limit, shared) = match deadline {
        Some(d) => {
            let left = d.saturating_duration_since(std::time::Instant::now());
            // Said only where the share cut the call's own limit short.
            (
                limit.min(left),
                left + std::time::Duration::from_secs(1) < limit,
            )
        }
        None => (limit, false),
    };
    let timeout = |what: String| {
        let e = CallError::Timeout {
            what,
            secs: limit.as_secs_f64().ceil() as u64,
            shared,
        };
        if question {
            let _ = STUCK.set(e.to_string());
        }
        Err(e.into())
    };
    if limit.is_zero() {
        return timeout(what);
    }
    let answered = std::sync::atomic::AtomicBool::new(false);
    let result = std::thread::scope(|scope| {
        // An engine answers in milliseconds: one that has not after a moment is said to
        // be waited for, once per fdl, so that a dry run is never silent while it waits.
        let watcher = scope.spawn(|| {
            let start = std::time::Instant::now();
            // Woken (unparked) as soon as the call ends; a spurious wake just waits on.
            while !answered.load(std::sync::atomic::Ordering::SeqCst) {
                let left = SLOW_ANSWER.saturating_sub(start.elapsed());
                if left.is_zero() || limit <= SLOW_ANSWER {
                    break;
                }
                std::thread::park_timeout(left);
            }
            if !answered.load(std::sync::atomic::Ordering::SeqCst)
                && limit > SLOW_ANSWER
                && !SAID_WAITING.swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                ctx.say(&format!(
                    "waiting for the Docker engine to answer `{what}` (at most {} s more)…",
                    limit.saturating_sub(SLOW_ANSWER).as_secs_f64().ceil() as u64
                ));
            }
        });
        let out = process::output_within(cmd, limit);
        answered.store(true, std::sync::atomic::Ordering::SeqCst);
        watcher.thread().unpark();
        out
    });
    match result {
        Ok(Some(out)) => Ok(out),
        Ok(None) => timeout(what),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(DockerError::NoCommand.into()),
        Err(e) => match process::too_large(&e) {
            Some(t) => Err(CallError::TooLarge {
                what,
                kib: t.limit / 1024,
                stream: t.stream,
            }
            .into()),
            None => Err(process::lift(e)).with_context(|| format!("cannot run `{what}`")),
        },
    }
}

impl Engine {
    /// Asks the daemon for its version: distinguishes "no docker" from "no daemon".
    pub fn probe(ctx: &crate::context::Context) -> Result<Engine, DockerError> {
        let mut cmd = Command::new("docker");
        cmd.args(["version", "--format", "{{.Server.Version}}"]);
        let out = match engine_call(ctx, &mut cmd, QUERY_LIMIT) {
            Ok(o) => o,
            Err(e) => {
                return Err(match e.downcast::<DockerError>() {
                    Ok(d) => d,
                    Err(e) => DockerError::DaemonUnreachable(format!("{e:#}")),
                })
            }
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
        let buildkit = engine_call(
            ctx,
            Command::new("docker").args(["buildx", "version"]),
            QUERY_LIMIT,
        )
        .is_ok_and(|o| o.status.success());
        Ok(Engine {
            server_version: version,
            buildkit,
            ctx: ctx.clone(),
        })
    }

    /// The engine's storage driver (`overlay2`, `fuse-overlayfs`, …), as a plain word;
    /// `None` when it does not answer so.
    pub fn storage_driver(&self) -> Option<String> {
        let mut cmd = Command::new("docker");
        cmd.args(["info", "--format", "{{.Driver}}"]);
        // Only a hint for the plan: an engine that does not answer is named, and the
        // plan is made without it.
        let out = match engine_call(&self.ctx, &mut cmd, QUERY_LIMIT) {
            Ok(out) => out,
            Err(e) => {
                self.ctx.say(&format!(
                    "warning: {}; the storage driver is not known, so the toolchain volumes are chosen without it",
                    crate::text::clean(&format!("{e:#}"))
                ));
                return None;
            }
        };
        let driver = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success()
            && !driver.is_empty()
            && driver.len() <= 64
            && driver
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.'))
        .then_some(driver)
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
for d in usr opt bin sbin lib lib32 lib64 libx32; do
  [ -d "/$d" ] && [ ! -L "/$d" ] && echo "fdl-dir $d"
done
exit 0
"#;

/// The top-level directories a toolchain image keeps its toolchain in, which its
/// toolchain volumes copy (the probe script asks about exactly these). Anything
/// elsewhere is still read from the image, only more slowly.
const VOLUME_DIRS: &[&str] = &[
    "usr", "opt", "bin", "sbin", "lib", "lib32", "lib64", "libx32",
];

/// How long the probe may take: it starts a container and asks nvcc twice.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Runs a short, network-less container of `image` to learn what the build will find
/// in it. The image must already be in the engine (`--pull never`): the build would
/// otherwise fail later, trying a registry an offline host cannot reach.
pub fn probe_image(ctx: &crate::context::Context, image: &str) -> Result<ImageProbe> {
    check_image_reference(image)?;
    let out = engine_call(
        ctx,
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
    .with_context(|| format!("cannot probe --base-image {image}: check the Docker engine (`docker run --rm {image} true`)"))?;
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
        dirs: Vec::new(),
    };
    let (mut version, mut archs) = (String::new(), String::new());
    for line in text.lines() {
        let (key, value) = line.split_once(' ').unwrap_or((line, ""));
        match key {
            "fdl-missing" => probe.missing.push(value.trim().to_string()),
            "fdl-apt" => probe.apt = true,
            // Only the names the script asks about: they become mount targets.
            "fdl-dir" => {
                let d = value.trim();
                if VOLUME_DIRS.contains(&d) && !probe.dirs.iter().any(|x| x == d) {
                    probe.dirs.push(d.to_string());
                }
            }
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

pub struct DockerBackend {
    pub engine: Engine,
    /// The Dockerfile text the plan's digest was taken of.
    pub dockerfile: String,
    /// The run's context: fdl's cache (clones, path aliases, volume marks).
    pub ctx: crate::context::Context,
}

/// Removes the named container when dropped, whatever happened before.
struct ContainerGuard<'a> {
    engine: &'a Engine,
    name: String,
}

impl Drop for ContainerGuard<'_> {
    fn drop(&mut self) {
        let out = engine_call(
            &self.engine.ctx,
            self.engine.command().args(["rm", "--force", &self.name]),
            CHANGE_LIMIT,
        );
        let gone = |o: &std::process::Output| {
            o.status.success() || String::from_utf8_lossy(&o.stderr).contains("No such container")
        };
        match out {
            Ok(o) if gone(&o) => {}
            Ok(o) => self.engine.ctx.say(&format!(
                "warning: could not remove container {}: {}. Remove it with `docker rm -f {}`",
                self.name,
                String::from_utf8_lossy(&o.stderr).trim(),
                self.name
            )),
            Err(e) => self.engine.ctx.say(&format!(
                "warning: could not remove container {}: {e:#}",
                self.name
            )),
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
            let bytes =
                crate::fsread::read_regular_following(path, DOCKERFILE_MAX).with_context(|| {
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

/// A toolchain image, ready in the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Toolchain {
    /// `flodl-nccl-toolchain:cuda13.5.37-<digest>`
    pub tag: String,
    /// The engine's ID of the image (`sha256:…`): what decides the compiler a build ran
    /// with, for a build store's key.
    pub id: String,
    /// Whether this call built it; else the engine already had it.
    pub built: bool,
}

/// The engine's ID of `reference` (`sha256:…`), or `None` when it has no such image.
/// The engine's silence or flood is an error, never "no image": the answer decides what
/// is built, kept and removed.
fn image_id(engine: &Engine, reference: &str) -> Result<Option<String>> {
    let mut cmd = engine.command();
    cmd.args(["image", "inspect", "--format", "{{.Id}}", reference]);
    let out = engine_call(&engine.ctx, &mut cmd, QUERY_LIMIT)?;
    if !out.status.success() {
        return Ok(None);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let id = text.trim();
    Ok((id.starts_with("sha256:")
        && id.len() <= 80
        && id[7..].bytes().all(|b| b.is_ascii_hexdigit()))
    .then(|| id.to_string()))
}

/// The toolchain image's tag: its name and a digest of what decides its content — the
/// base image's ID (when the plan names one; else the Dockerfile's FROM does), the
/// Dockerfile's text and the build arguments.
fn toolchain_tag(docker: &DockerPlan, base_id: &str, dockerfile: &str) -> String {
    let mut key = format!("fdl toolchain image 1\nbase {base_id}\n");
    for (k, v) in &docker.build_args {
        key.push_str(&format!("arg {k}={v}\n"));
    }
    key.push_str("dockerfile\n");
    key.push_str(dockerfile);
    format!("{}-{}", docker.image, &sha256_hex(key.as_bytes())[..16])
}

/// What the toolchain image is built on, as its tag's key names it.
enum Base {
    /// The base image the engine has, by its ID.
    Id(String),
    /// A base image the engine does not have yet: the build pulls it.
    Absent(String),
    /// No `--base-image`: the Dockerfile's own `FROM`.
    FromDockerfile,
}

impl Base {
    /// The line of the toolchain tag's key.
    fn key(&self) -> String {
        match self {
            Base::Id(id) => id.clone(),
            Base::Absent(base) => format!("absent {base}"),
            Base::FromDockerfile => "from the Dockerfile".to_string(),
        }
    }
}

fn base_id(engine: &Engine, docker: &DockerPlan) -> Result<Base> {
    Ok(match &docker.base_image {
        Some(base) => match image_id(engine, base)? {
            Some(id) => Base::Id(id),
            None => Base::Absent(base.clone()),
        },
        None => Base::FromDockerfile,
    })
}

/// Makes sure the toolchain image of `docker` is in the engine, building it only when the
/// engine has no image of that digest, and returns it. `dockerfile` is the text the plan's
/// digest was taken of; the engine's output goes to `on_line`.
pub fn toolchain_image(
    engine: &Engine,
    docker: &DockerPlan,
    dockerfile: &str,
    on_line: &mut dyn FnMut(&str),
) -> Result<Toolchain> {
    if sha256_hex(dockerfile.as_bytes()) != docker.dockerfile.sha256() {
        bail!("the Dockerfile changed since the plan was made: run the build again");
    }
    let base = base_id(engine, docker)?;
    let tag = toolchain_tag(docker, &base.key(), dockerfile);
    if let Some(id) = image_id(engine, &tag)? {
        return Ok(Toolchain {
            tag,
            id,
            built: false,
        });
    }
    let context = tempfile::Builder::new()
        .prefix("fdl-docker-context-")
        .tempdir()
        .context("cannot create a private build context")?;
    std::fs::write(context.path().join("Dockerfile"), dockerfile)?;
    let paths = Paths {
        entries: vec![
            ("context", context.path().to_path_buf()),
            ("toolchain", tag.clone().into()),
        ],
    };
    let step = DockerSteps::new(docker, 1, &paths, &[]).build;
    on_line(&format!("==> fdl: step: {}", step.render()));
    let mut build = engine.step(&step);
    if !engine.buildkit {
        // The classic builder keeps the container of a failed step (and of an
        // interrupted one) unless told otherwise; BuildKit leaves none.
        build.arg("--force-rm");
    }
    let mut last_step = String::new();
    let built = process::stream(&mut build, &step.what, &mut |line| {
        if crate::progress::docker_step(line).is_some() {
            last_step = line.to_string();
        }
        on_line(line);
    });
    if let Err(e) = built {
        let hint = if last_step.contains("FROM") {
            ". The base image could not be had: if no registry is reachable from here, \
             pass --base-image IMAGE, an image with a CUDA toolkit that this engine \
             has (a mirror's, or one `docker load`ed): the toolchain starts FROM it"
        } else {
            ""
        };
        return Err(e.context(format!(
            "the toolchain image build failed. Nothing was installed{hint}"
        )));
    }
    let id = image_id(engine, &tag)?.ok_or_else(|| {
        anyhow::anyhow!("docker build reported success, but {tag} is not in the engine")
    })?;
    // A base image the build pulled has an ID now: tag the image by it as well, so the
    // next build finds it without running the Dockerfile's steps again.
    if let Base::Absent(_) = base {
        let again = toolchain_tag(docker, &base_id(engine, docker)?.key(), dockerfile);
        if again != tag {
            let _ = engine_call(
                &engine.ctx,
                engine.command().args(["tag", &tag, &again]),
                CHANGE_LIMIT,
            );
        }
    }
    Ok(Toolchain {
        tag,
        id,
        built: true,
    })
}

/// The toolchain image must hold what the contract asks (see the embedded Dockerfile):
/// a `--dockerfile` of the user's, or an unprobed base image, is checked here, before
/// anything compiles, so a broken image fails with what it lacks rather than deep in make.
fn check_toolchain(engine: &Engine, tag: &str, docker: &DockerPlan) -> Result<ImageProbe> {
    let found = probe_image(&engine.ctx, tag)?;
    let from = match &docker.dockerfile {
        DockerfileSpec::File { path, .. } => format!("--dockerfile {}", path.display()),
        DockerfileSpec::Embedded { .. } => match &docker.base_image {
            Some(base) => format!("the embedded Dockerfile from {base}"),
            None => "the embedded Dockerfile".to_string(),
        },
    };
    if found.cuda_home.is_none() {
        bail!(
            "the toolchain image {tag} (from {from}) has no nvcc: $CUDA_HOME, /usr/local/cuda and PATH were looked at. Give an image with a CUDA toolkit, set CUDA_HOME in it (ENV), or put nvcc on PATH (`fdl nccl dockerfile` shows what the image must hold). Nothing was installed"
        );
    }
    let lacking: Vec<&str> = crate::nccl::plan::TOOLCHAIN_TOOLS
        .iter()
        .copied()
        .filter(|t| found.missing.iter().any(|m| m == t))
        .collect();
    if !lacking.is_empty() {
        bail!(
            "the toolchain image {tag} (from {from}) lacks {}: install them in it (`fdl nccl dockerfile` shows what the image must hold). Nothing was installed",
            lacking.join(", ")
        );
    }
    Ok(found)
}

/// The label naming the toolchain image (its engine ID) a volume is a copy of.
const VOLUME_LABEL: &str = "fdl.toolchain.image";
/// The label holding the SHA-256 of the volume's ownership token (see [`VolumeMarks`]).
const OWNER_LABEL: &str = "fdl.toolchain.owner";
/// Every toolchain volume's name starts so; fdl never removes a volume whose name does
/// not.
const VOLUME_PREFIX: &str = "flodl-nccl-toolchain-";
/// The file fdl writes at the top of a toolchain volume once the engine has filled it
/// from the image; it holds the image's ID. A volume without it is incomplete.
const VOLUME_MARK: &str = ".fdl-toolchain-volume";

/// What makes a Docker volume fdl's own. Anyone with access to the engine can make a
/// volume of fdl's name with fdl's labels (the image ID is no secret), so neither proves
/// anything: when fdl creates a toolchain volume it draws a random token, keeps it in
/// its private cache (`<cache>/docker-volumes/<volume>`, 0600, in a directory checked as
/// every cache directory is) and puts the token's SHA-256 in the volume's
/// [`OWNER_LABEL`]. A volume is fdl's only when its name, its labels and the kept token
/// all agree; any other is neither mounted nor removed.
struct VolumeMarks {
    dir: std::path::PathBuf,
}

impl VolumeMarks {
    fn open(cache: &Path) -> Result<VolumeMarks> {
        Ok(VolumeMarks {
            dir: crate::cache::subdir(cache, "docker-volumes")?,
        })
    }

    fn path(&self, volume: &str) -> std::path::PathBuf {
        self.dir.join(volume)
    }

    /// This cache's part of every volume name it makes: 16 hex digits of a random id
    /// drawn once and kept beside the tokens (`.cache-id`, 0600). Two caches on one
    /// engine (two users, a CI job, another `XDG_CACHE_HOME`) so never want the same
    /// name; the id proves nothing, the tokens still do.
    fn cache_id(&self) -> Result<String> {
        use std::io::Read;
        let read = || -> Option<String> {
            let f = crate::fsread::open_regular(&self.path(CACHE_ID), true).ok()?;
            let mut text = String::new();
            f.take(128).read_to_string(&mut text).ok()?;
            let id = text.trim();
            (id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_string())
        };
        if let Some(id) = read() {
            return Ok(id);
        }
        let id = random_hex::<8>("an id for this cache's Docker volumes")?;
        // Another build of this cache may have drawn one first: the first kept wins.
        if self.keep(CACHE_ID, &id, true)? {
            return Ok(id);
        }
        read().with_context(|| {
            format!(
                "{} is not an id fdl wrote: remove it and build again",
                self.path(CACHE_ID).display()
            )
        })
    }

    /// A new token for `volume`, kept before the volume is made (a volume made without a
    /// kept token would be no one's); its SHA-256 is what the label carries.
    fn issue(&self, volume: &str) -> Result<String> {
        let token = random_hex::<32>(&format!("a token for the Docker volume {volume}"))?;
        self.keep(volume, &token, false)?;
        Ok(sha256_hex(token.as_bytes()))
    }

    /// Writes `text` as `name` in the marks directory through a new 0600 file renamed
    /// over it, so whatever was there is replaced, never written through; with
    /// `first_wins`, only where nothing is there yet (false: something was).
    fn keep(&self, name: &str, text: &str, first_wins: bool) -> Result<bool> {
        use std::io::Write;
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir)
            .with_context(|| format!("cannot write in {}", self.dir.display()))?;
        tmp.write_all(text.as_bytes())
            .and_then(|()| tmp.as_file().sync_all())
            .with_context(|| format!("cannot write in {}", self.dir.display()))?;
        let to = self.path(name);
        if first_wins {
            return Ok(tmp.persist_noclobber(&to).is_ok());
        }
        tmp.persist(&to)
            .with_context(|| format!("cannot write {}", to.display()))?;
        Ok(true)
    }

    /// Whether `labels` (a volume's) carry the digest of the token kept for `volume`.
    fn owns(&self, volume: &str, labels: &std::collections::BTreeMap<String, String>) -> bool {
        let Some(label) = labels.get(OWNER_LABEL) else {
            return false;
        };
        let kept = crate::fsread::open_regular(&self.path(volume), true).and_then(|f| {
            use std::io::Read;
            let mut text = String::new();
            f.take(128).read_to_string(&mut text)?;
            Ok(text)
        });
        volume.starts_with(VOLUME_PREFIX)
            && labels.contains_key(VOLUME_LABEL)
            && kept.is_ok_and(|t| t.len() == 64 && &sha256_hex(t.as_bytes()) == label)
    }

    fn forget(&self, volume: &str) {
        let _ = std::fs::remove_file(self.path(volume));
    }
}

/// The toolchain volumes of `toolchain`, one per directory of `dirs`, as (volume,
/// directory) for the compile's read-only mounts: made once per toolchain image and
/// kept by the engine. A new volume is filled by the engine itself, which copies the
/// image's directory into an empty named volume when a container mounts it; fdl then
/// marks it with the image's ID. Made under a lock per image (two builds make them
/// once); an unmarked volume (its filling was interrupted) is removed and made again;
/// fdl's own volumes ([`VolumeMarks`]) of toolchain images the engine no longer has are
/// removed.
///
/// `Ok(Err(why))`: a volume of one of these names exists that is not this cache's (made
/// by someone else, with this cache's id in its name): it is neither used nor removed,
/// and the build reads the toolchain from the image instead.
fn toolchain_volumes(
    engine: &Engine,
    toolchain: &Toolchain,
    dirs: &[String],
    cache: &Path,
    progress: &Progress,
) -> Result<std::result::Result<Vec<(String, String)>, String>> {
    if dirs.is_empty() {
        return Ok(Ok(Vec::new()));
    }
    let hex: String = toolchain
        .id
        .trim_start_matches("sha256:")
        .chars()
        .take(16)
        .collect();
    let marks = VolumeMarks::open(cache)?;
    let base = format!("{VOLUME_PREFIX}{}-{hex}", marks.cache_id()?);
    let want: Vec<(String, String)> = dirs
        .iter()
        .map(|d| (format!("{base}-{d}"), format!("/{d}")))
        .collect();
    let _lock = crate::lock::acquire(
        cache,
        &cache.join("docker-toolchain-volumes"),
        &base,
        crate::lock::Wait::Yes,
        &|msg| progress.note(msg),
    )?;
    remove_stale_volumes(engine, &marks, &toolchain.id);
    for attempt in 0..2 {
        // Each name is looked up itself: a volume of that name that fdl did not make for
        // this image is neither used nor removed.
        let mut old = Vec::new();
        let mut new = Vec::new();
        for wanted in &want {
            match volume_labels(engine, &wanted.0)? {
                None => new.push(wanted),
                Some(labels)
                    if marks.owns(&wanted.0, &labels)
                        && labels.get(VOLUME_LABEL) == Some(&toolchain.id) =>
                {
                    old.push(wanted)
                }
                Some(_) => {
                    return Ok(Err(format!(
                        "a Docker volume named {} exists that this cache did not make for {} (its labels and fdl's token for it do not agree): fdl neither uses nor removes it",
                        wanted.0, toolchain.tag
                    )))
                }
            }
        }
        let mut made = VolumesGuard {
            engine,
            marks: &marks,
            names: Vec::new(),
        };
        for (volume, _) in &new {
            let owner = marks.issue(volume)?;
            let out = engine_call(
                &engine.ctx,
                engine.command().args([
                    "volume",
                    "create",
                    "--label",
                    &format!("{VOLUME_LABEL}={}", toolchain.id),
                    "--label",
                    &format!("fdl.toolchain.tag={}", toolchain.tag),
                    "--label",
                    &format!("{OWNER_LABEL}={owner}"),
                    volume,
                ]),
                CHANGE_LIMIT,
            )?;
            if !out.status.success() {
                marks.forget(volume);
                bail!(
                    "docker volume create {volume} failed: {}",
                    crate::text::clean(String::from_utf8_lossy(&out.stderr).trim())
                );
            }
            made.names.push(volume.clone());
            // Made by someone else between the look and the create (`volume create` of
            // an existing name succeeds and changes nothing): not fdl's, so not used.
            match volume_labels(engine, volume)? {
                Some(labels) if marks.owns(volume, &labels) => {}
                _ => {
                    made.names.pop();
                    return Ok(Err(format!(
                        "a Docker volume named {volume} appeared that this cache did not make: fdl neither uses nor removes it"
                    )));
                }
            }
        }
        if !new.is_empty() {
            progress.note(&format!(
                "==> copying the toolchain image's {} into Docker volumes (once per toolchain image)",
                new.iter()
                    .map(|(_, d)| d.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        // One run mounts them all: the engine fills each new (empty) volume from the
        // image before the script starts; the script marks those and reads the marks
        // of the others.
        let words = |list: &[&(String, String)]| {
            list.iter()
                .map(|(_, d)| d.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        };
        let script = format!(
            "for d in {}; do printf '%s\n' '{id}' > \"$d/{VOLUME_MARK}\" || exit 1; done; \
             for d in {}; do [ \"$(cat \"$d/{VOLUME_MARK}\" 2>/dev/null)\" = '{id}' ] || echo \"fdl-unmarked $d\"; done; exit 0",
            words(&new),
            words(&old),
            id = toolchain.id,
        );
        let name = format!("fdl-nccl-volumes-{}-{hex}", std::process::id());
        let _guard = ContainerGuard {
            engine,
            name: name.clone(),
        };
        let mut cmd = engine.command();
        cmd.args([
            "run",
            "--rm",
            "--name",
            &name,
            "--pull",
            "never",
            "--network",
            "none",
            "--read-only",
            "--user",
            "0:0",
        ]);
        for (volume, dir) in &want {
            cmd.arg("--mount")
                .arg(format!("type=volume,source={volume},target={dir}"));
        }
        cmd.args(["--entrypoint", "/bin/sh", &toolchain.tag, "-c", &script]);
        let out = engine_call(&engine.ctx, &mut cmd, std::time::Duration::from_secs(3600))
            .context("filling the toolchain volumes")?;
        if !out.status.success() {
            bail!(
                "filling the toolchain volumes from {} failed: {}",
                toolchain.tag,
                crate::text::clean(String::from_utf8_lossy(&out.stderr).trim())
            );
        }
        made.names.clear();
        let unmarked: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("fdl-unmarked "))
            .map(|d| d.trim().to_string())
            .collect();
        if unmarked.is_empty() {
            return Ok(Ok(want));
        }
        if attempt == 1 {
            break;
        }
        progress.note(&format!(
            "==> the toolchain volumes of {} were left incomplete ({}): making them again",
            toolchain.tag,
            unmarked.join(", ")
        ));
        for (volume, dir) in &want {
            if unmarked.iter().any(|d| d == dir) {
                remove_volume(engine, &marks, volume);
            }
        }
    }
    bail!(
        "the toolchain volumes of {} stay incomplete: remove them (`docker volume rm` the volumes labelled {VOLUME_LABEL}) or build with --toolchain-volumes never",
        toolchain.tag
    )
}

/// The labels of the volume `name`, or `None` when there is no such volume.
fn volume_labels(
    engine: &Engine,
    name: &str,
) -> Result<Option<std::collections::BTreeMap<String, String>>> {
    let mut cmd = engine.command();
    cmd.args(["volume", "inspect", "--format", "{{json .Labels}}", name]);
    let out = engine_call(&engine.ctx, &mut cmd, QUERY_LIMIT)?;
    if out.status.success() {
        let text = String::from_utf8_lossy(&out.stdout);
        let text = text.trim();
        // A volume without labels answers `null`.
        if text == "null" || text.is_empty() {
            return Ok(Some(Default::default()));
        }
        return serde_json::from_str(text)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("docker volume inspect {name} answered no labels ({e})"));
    }
    let err = String::from_utf8_lossy(&out.stderr);
    if err.to_ascii_lowercase().contains("no such volume") {
        return Ok(None);
    }
    bail!(
        "docker volume inspect {name} failed: {}",
        crate::text::clean(err.trim())
    )
}

/// The names of the volumes that carry fdl's image label: candidates only, each still
/// checked by [`VolumeMarks::owns`] before anything is done to it.
fn labelled_volumes(engine: &Engine) -> Vec<String> {
    let mut cmd = engine.command();
    cmd.args([
        "volume",
        "ls",
        "--filter",
        &format!("label={VOLUME_LABEL}"),
        "--format",
        "{{.Name}}",
    ]);
    let Ok(out) = engine_call(&engine.ctx, &mut cmd, QUERY_LIMIT) else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|n| n.starts_with(VOLUME_PREFIX))
        .collect()
}

/// Removes fdl's own toolchain volumes of images the engine no longer has (a toolchain
/// rebuilt from a new base image leaves its old copy behind otherwise). A volume is
/// removed only when fdl made it ([`VolumeMarks::owns`]) and the engine said plainly
/// that its image is gone (an engine that does not answer removes nothing). One in use
/// is left: the engine refuses, and a later build removes it.
fn remove_stale_volumes(engine: &Engine, marks: &VolumeMarks, current: &str) {
    for name in labelled_volumes(engine) {
        let Ok(Some(labels)) = volume_labels(engine, &name) else {
            continue;
        };
        let Some(id) = labels.get(VOLUME_LABEL) else {
            continue;
        };
        if id != current && marks.owns(&name, &labels) && matches!(image_id(engine, id), Ok(None)) {
            remove_volume(engine, marks, &name);
        }
    }
}

/// Removes fdl's volume `name` and its kept token (once the engine removed it).
fn remove_volume(engine: &Engine, marks: &VolumeMarks, name: &str) {
    if engine_call(
        &engine.ctx,
        engine.command().args(["volume", "rm", name]),
        CHANGE_LIMIT,
    )
    .is_ok_and(|o| o.status.success())
    {
        marks.forget(name);
    }
}

/// Removes the volumes this run created when their filling did not finish.
struct VolumesGuard<'a> {
    engine: &'a Engine,
    marks: &'a VolumeMarks,
    names: Vec<String>,
}

impl Drop for VolumesGuard<'_> {
    fn drop(&mut self) {
        for name in &self.names {
            remove_volume(self.engine, self.marks, name);
        }
    }
}

/// The [`crate::nccl::plan::CONTAINER_OWNER_LABEL`] value of the fdl whose pid is `pid`:
/// `<uid>-<pid>-<start time>`, the start time (clock ticks since boot) read from
/// `/proc/<pid>/stat`, so that a pid reused by another process does not pass for it.
/// `None` when there is no such process.
fn owner_of(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: fields are
    // counted after its closing one; the start time is field 22.
    let rest = &stat[stat.rfind(')')? + 1..];
    let start = rest.split_whitespace().nth(19)?;
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    Some(format!("{uid}-{pid}-{start}"))
}

/// Removes the compile containers that an fdl of this user left when it died: those
/// whose owner label names this user and a process that is no longer the one that made
/// them. Their run script ends them once their fdl's pipe closes, but a container an
/// older fdl started, or one the engine kept while the daemon restarted, is removed
/// here. Containers of other users, or without fdl's name and label, are never touched.
fn remove_orphan_containers(engine: &Engine, progress: &Progress) {
    let label = crate::nccl::plan::CONTAINER_OWNER_LABEL;
    let mut cmd = engine.command();
    cmd.args([
        "ps",
        "--all",
        "--filter",
        &format!("label={label}"),
        "--format",
        &format!("{{{{.Names}}}} {{{{.Label \"{label}\"}}}}"),
    ]);
    let Ok(out) = engine_call(&engine.ctx, &mut cmd, QUERY_LIMIT) else {
        return;
    };
    // SAFETY: getuid has no preconditions.
    let me = unsafe { libc::getuid() }.to_string();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((name, owner)) = line.trim().split_once(' ') else {
            continue;
        };
        let mut parts = owner.splitn(3, '-');
        let (Some(uid), Some(pid), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if !name.starts_with("fdl-nccl-") || uid != me || owner_of(pid).as_deref() == Some(owner) {
            continue;
        }
        progress.note(&format!(
            "==> removing container {} left by an fdl that is gone (pid {pid})",
            crate::text::clean(name)
        ));
        let _ = engine_call(
            &engine.ctx,
            engine.command().args(["rm", "--force", name]),
            CHANGE_LIMIT,
        );
    }
}

/// Prefix of the work directories (NCCL's `BUILDDIR` and the container's `TMPDIR`) made
/// beside the staging directory and bind-mounted into the compile container.
pub(crate) const WORK_PREFIX: &str = crate::nccl::store::DOCKER_WORK_PREFIX;

impl Backend for DockerBackend {
    fn toolchain_identity(
        &self,
        plan: &BuildPlan,
    ) -> Result<std::collections::BTreeMap<String, String>> {
        store_identity(&self.engine, plan, &self.dockerfile)
    }

    fn build(&self, plan: &BuildPlan, staging: &Path, progress: &Progress) -> Result<()> {
        let BackendPlan::Docker(docker) = &plan.backend else {
            bail!(
                "the Docker backend was given a plan for {}",
                plan.backend.kind()
            );
        };
        let staging = std::path::absolute(staging)?;
        let builds_dir = staging
            .parent()
            .ok_or_else(|| anyhow::anyhow!("the staging directory has no parent"))?;
        native::remove_stale_work_dirs(builds_dir, WORK_PREFIX, &plan.name, progress);
        remove_orphan_containers(&self.engine, progress);
        let cache = self.ctx.cache()?;

        // 1. The toolchain: its image, built once per base image, Dockerfile and
        // arguments, and where the plan says so its volumes.
        progress.phase(Phase::Prepare);
        let Prepared { toolchain, volumes } =
            prepare(&self.engine, docker, &self.dockerfile, &cache, progress)?;

        // 2. The source, on the host: the compile has no network.
        let source = match &docker.source {
            DockerSource::Context { path, .. } => native::check_source_dir(path, &plan.tag)?.0,
            DockerSource::Clone => {
                progress.phase(Phase::Clone);
                let NativeSource::Clone { repo, cache_dir } =
                    native::source_for(None, &plan.tag, &cache)?
                else {
                    bail!("no source directory was given, yet one was planned");
                };
                let git = crate::process::on_path("git").ok_or_else(|| {
                    anyhow::anyhow!(
                        "git is not on PATH: the Docker backend fetches {} on this host (the compile container has no network). Install git, or pass --source DIR with an NCCL tree",
                        plan.tag
                    )
                })?;
                native::ensure_clone(&self.ctx, &repo, &plan.tag, &cache_dir, &git, progress)?
            }
        };

        // 3. The work directory, beside staging: objects land on the host's file system.
        let work = WorkDir::create_with(&self.ctx, builds_dir, WORK_PREFIX, &plan.name)?;
        for sub in ["build", "tmp"] {
            std::fs::create_dir(work.0.join(sub))
                .with_context(|| format!("cannot create {}", work.0.join(sub).display()))?;
        }
        // The script each run starts with, beside them (the dry run prints it).
        let script = work.0.join(
            Path::new(crate::nccl::plan::RUN_SCRIPT_PATH)
                .file_name()
                .unwrap_or_default(),
        );
        crate::fswrite::create_new(&script, &mut crate::nccl::plan::RUN_SCRIPT.as_bytes())
            .with_context(|| format!("cannot write {}", script.display()))?;
        // Mount sources reach `--mount` as CSV fields: plain words, as for make.
        let mut aliases = native::plain::Aliases::new(&cache)?;
        let random = work
            .0
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .rsplit('-')
            .next()
            .unwrap_or("x")
            .to_ascii_lowercase();
        let container = format!("fdl-nccl-{}-{random}", std::process::id());
        // SAFETY: getuid and getgid cannot fail and touch no memory.
        let user = unsafe { format!("{}:{}", libc::getuid(), libc::getgid()) };
        let paths = Paths {
            entries: vec![
                ("toolchain", toolchain.tag.clone().into()),
                ("source", aliases.plain(&source)?),
                ("work", aliases.plain(&work.0)?),
                ("staging", aliases.plain(&staging)?),
                ("container", container.into()),
                ("user", user.into()),
                (
                    "owner",
                    owner_of(std::process::id()).unwrap_or_default().into(),
                ),
            ],
        };
        progress.output(&format!("==> fdl: paths: {}", paths.describe()));
        let steps = DockerSteps::new(docker, plan.jobs, &paths, &volumes);

        // 4. The compile: three `docker run --rm`s, each removed by its guard whatever
        // happens (an error, Ctrl-C), as the run's `--rm` does on success.
        let guard = |step: &str| ContainerGuard {
            engine: &self.engine,
            name: format!("{}-{step}", paths.get("container").display()),
        };
        // Each run's stdin is a pipe whose only write end fdl holds (dropped after the
        // run): when fdl dies, even by SIGKILL, the container reads end of file and its
        // run script kills the build (see RUN_SCRIPT).
        let lease = || -> Result<(std::io::PipeWriter, std::process::Stdio)> {
            let (r, w) = std::io::pipe().context("cannot create a pipe")?;
            Ok((w, r.into()))
        };
        progress.phase(Phase::Compile);
        let total = {
            let _guard = guard("count");
            let (_held, stdin) = lease()?;
            native::count_compiles_with(&steps.count, progress, stdin)
        };
        if let Some(total) = total {
            progress.set_total(total);
        }
        {
            let _guard = guard("build");
            let (_held, stdin) = lease()?;
            native::run_make_with(&steps.compile, progress, total, stdin)
                .context("the compile in the toolchain image failed. Nothing was installed")?;
        }
        progress.phase(Phase::Install);
        {
            let _guard = guard("install");
            let (_held, stdin) = lease()?;
            native::run_make_with(&steps.install, progress, None, stdin)
                .context("`make install` in the toolchain image failed. Nothing was installed")?;
        }
        Ok(())
    }
}

/// A toolchain ready for the compile: its image, and the volumes (volume, directory)
/// the compile mounts read-only (none where the plan reads the image).
pub struct Prepared {
    pub toolchain: Toolchain,
    pub volumes: Vec<(String, String)>,
}

/// Makes the toolchain of `docker` ready: the image (built when the engine lacks it),
/// checked against the contract, and its volumes where the plan reads them. What a build
/// does first; a benchmark calls it to time the one-time part on its own.
pub fn prepare(
    engine: &Engine,
    docker: &DockerPlan,
    dockerfile: &str,
    cache: &Path,
    progress: &Progress,
) -> Result<Prepared> {
    let toolchain = toolchain_image(engine, docker, dockerfile, &mut |line| {
        progress.output(line)
    })?;
    progress.note(&format!(
        "==> toolchain image {} ({})",
        toolchain.tag,
        if toolchain.built {
            "built"
        } else {
            "cached by the engine"
        }
    ));
    let found = check_toolchain(engine, &toolchain.tag, docker)?;
    let volumes = match docker.toolchain_files {
        crate::nccl::plan::ToolchainFiles::Volumes => {
            let (volumes, said) = match toolchain_volumes(engine, &toolchain, &found.dirs, cache, progress)? {
                Ok(v) if v.is_empty() => (
                    v,
                    format!(
                        "==> toolchain read from the image: {} has none of /{}",
                        toolchain.tag,
                        VOLUME_DIRS.join(", /")
                    ),
                ),
                Ok(v) => {
                    let named: Vec<String> = v.iter().map(|(v, d)| format!("{v} ({d})")).collect();
                    (v, format!("==> toolchain read from volumes {}", named.join(", ")))
                }
                Err(why) => (
                    Vec::new(),
                    format!(
                        "warning: {why}; this build reads the toolchain from the image instead (as with --toolchain-volumes never)"
                    ),
                ),
            };
            progress.note(&said);
            volumes
        }
        crate::nccl::plan::ToolchainFiles::Image => Vec::new(),
    };
    Ok(Prepared { toolchain, volumes })
}

/// The build store's toolchain identity of a Docker build: the engine's ID (a content
/// digest) of the toolchain image the compile runs in. That image is the base image plus
/// the tools the Dockerfile installed, so its ID decides the compiler; the Dockerfile's
/// SHA-256 is named beside it for `fdl store list`. Asking never builds the image: before
/// the first build of a toolchain the key is not known, and the build computes it after.
fn store_identity(
    engine: &Engine,
    plan: &BuildPlan,
    dockerfile: &str,
) -> Result<std::collections::BTreeMap<String, String>> {
    let BackendPlan::Docker(docker) = &plan.backend else {
        bail!(
            "the Docker backend was given a plan for {}",
            plan.backend.kind()
        );
    };
    if sha256_hex(dockerfile.as_bytes()) != docker.dockerfile.sha256() {
        bail!("the Dockerfile changed since the plan was made");
    }

    let tag = toolchain_tag(docker, &base_id(engine, docker)?.key(), dockerfile);
    let id = image_id(engine, &tag)?.ok_or_else(|| {
        anyhow::anyhow!("the toolchain image {tag} is not built yet (the build makes it)")
    })?;
    Ok([
        ("toolchain_image_id".to_string(), id),
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

    #[test]
    fn a_quoted_question_is_not_followed_by_a_stop() {
        let e = DockerError::DaemonUnreachable(
            "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?".into(),
        );
        assert!(e.to_string().contains("running? Start it"), "{e}");
        let e = DockerError::DaemonUnreachable("no answer".into());
        assert!(e.to_string().contains("no answer. Start it"), "{e}");
    }

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

    /// The Docker half of a plan for sm_86 with the embedded Dockerfile.
    fn docker_plan(only_funcs: Option<&str>) -> crate::nccl::plan::DockerPlan {
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
                volumes: crate::nccl::plan::VolumesFlag::Auto,
                storage_driver: None,
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
        d
    }

    fn passed(only_funcs: Option<&str>) -> Vec<String> {
        docker_plan(only_funcs)
            .build_args
            .into_iter()
            .map(|(k, _)| k)
            .collect()
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

    /// The toolchain image's tag changes with each thing that decides its content — the
    /// base image's ID, the Dockerfile, a build argument — and with nothing else.
    #[test]
    fn the_toolchain_tag_is_a_digest_of_base_id_dockerfile_and_arguments() {
        let d = docker_plan(None);
        let tag = toolchain_tag(&d, "sha256:aa", EMBEDDED_DOCKERFILE);
        assert!(tag.starts_with("flodl-nccl-toolchain:cuda12.8-"), "{tag}");
        assert_eq!(tag.len(), "flodl-nccl-toolchain:cuda12.8-".len() + 16);
        assert_eq!(tag, toolchain_tag(&d, "sha256:aa", EMBEDDED_DOCKERFILE));
        assert_ne!(tag, toolchain_tag(&d, "sha256:bb", EMBEDDED_DOCKERFILE));
        let edited = format!("{EMBEDDED_DOCKERFILE}\nLABEL x=y\n");
        assert_ne!(tag, toolchain_tag(&d, "sha256:aa", &edited));
        let mut other = d.clone();
        other.build_args[1].1 = "make g++".into();
        assert_ne!(tag, toolchain_tag(&other, "sha256:aa", EMBEDDED_DOCKERFILE));
        // What the compile is given (archs, ONLY_FUNCS) is not the toolchain's business.
        let mut other = d.clone();
        other
            .make_vars
            .push(("ONLY_FUNCS".into(), "AllReduce".into()));
        assert_eq!(tag, toolchain_tag(&other, "sha256:aa", EMBEDDED_DOCKERFILE));
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
        assert!(declared.contains_key("BASE_IMAGE") && declared.contains_key("TOOLS"));
    }
}
