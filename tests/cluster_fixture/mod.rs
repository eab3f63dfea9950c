//! Test hosts for the `fdl cluster` tests: real OpenSSH servers, each in its own Docker
//! container (its own filesystem) made from `fdl-test-debian:sshd`
//! (tests/support/sshd-image.sh: this machine's Debian release with openssh-server and
//! rsync, imported, since no registry is reachable). Each is reached only through its
//! port 22 published on 127.0.0.1 at an ephemeral port, as root, by the key of a [`Keys`],
//! and each generates its own host keys, which [`Host::start`] records in that [`Keys`]'
//! `known_hosts`, so ssh runs with `StrictHostKeyChecking=yes`.
//!
//! Tests in one file run as threads of one process: container names are unique per host
//! (`fdl-test-host-<pid>-<nanos>-<label>`), the image is made once per process (and once
//! per machine, by the script's lock), and every container is removed when its [`Host`]
//! drops, on panic too. A test process killed outright leaves its containers behind;
//! they carry the label `fdl-test-host`:
//! `docker rm -f $(docker ps -aq --filter label=fdl-test-host)`.
#![allow(dead_code)]

pub mod bootstrap;

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The image every host runs, made by tests/support/sshd-image.sh.
pub const IMAGE: &str = "fdl-test-debian:sshd";
/// The Docker label on every host's container.
pub const CONTAINER_LABEL: &str = "fdl-test-host";
/// How long [`Host::start`] waits for `ssh … true` to succeed.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// A client key pair and the `known_hosts` file the hosts started with it fill.
pub struct Keys {
    pub dir: tempfile::TempDir,
    /// The private key: ed25519, no passphrase (its public half is `identity` + `.pub`).
    pub identity: PathBuf,
    pub known_hosts: PathBuf,
}

impl Keys {
    pub fn new() -> Keys {
        let dir = tempfile::tempdir().unwrap();
        let identity = dir.path().join("id_ed25519");
        let known_hosts = dir.path().join("known_hosts");
        let out = Command::new("ssh-keygen")
            .args(["-t", "ed25519", "-N", "", "-q", "-C", "fdl-test", "-f"])
            .arg(&identity)
            .output()
            .unwrap_or_else(|e| panic!("cannot run ssh-keygen ({e}): install openssh-client"));
        assert!(
            out.status.success(),
            "ssh-keygen failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(&known_hosts, "").unwrap();
        Keys {
            dir,
            identity,
            known_hosts,
        }
    }

    /// The public key, one `ssh-ed25519 AAAA… comment` line.
    pub fn public_key(&self) -> String {
        let path = self.identity.with_extension("pub");
        std::fs::read_to_string(path).unwrap().trim().to_string()
    }

    /// Appends one line to `known_hosts` in a single write (O_APPEND), so hosts started
    /// from several threads do not interleave.
    fn add_known_host(&self, line: &str) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.known_hosts)
            .unwrap();
        f.write_all(format!("{line}\n").as_bytes()).unwrap();
    }
}

impl Default for Keys {
    fn default() -> Self {
        Keys::new()
    }
}

/// One test host: a running container with sshd, removed on drop.
pub struct Host {
    /// The container's name, unique per test run: `fdl-test-host-<pid>-<nanos>-<label>`.
    pub name: String,
    pub label: String,
    /// The host port on 127.0.0.1 that leads to the container's port 22.
    pub port: u16,
}

/// What the container runs: its own host keys (the image's are shared by every container
/// made from it), root login by key only, the client key authorized, then sshd in the
/// foreground logging to stderr (`docker logs`). `/run/fdl-test-ready` marks the host key
/// as complete.
const STARTUP: &str = r#"set -eu
# Keys of its own, made on the first start only: a restarted host keeps its identity.
if [ ! -e /etc/ssh/.fdl-test-keys ]; then
  rm -f /etc/ssh/ssh_host_*
  ssh-keygen -A >/dev/null
  touch /etc/ssh/.fdl-test-keys
fi
mkdir -p /run/sshd
chmod 755 /run/sshd
cat >/etc/ssh/sshd_config.d/fdl-test.conf <<'EOF'
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
EOF
mkdir -p /root/.ssh
chmod 700 /root/.ssh
printf '%s\n' "$FDL_TEST_AUTHORIZED_KEY" >/root/.ssh/authorized_keys
chmod 600 /root/.ssh/authorized_keys
touch /run/fdl-test-ready
exec /usr/sbin/sshd -D -e
"#;

/// `docker ARGS`, whatever its exit (also for tests/slurm_fixture).
pub fn docker(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run `docker` ({e}): these tests need the Docker CLI and a running engine"
            )
        })
}

/// Runs docker and returns its stdout, panicking with its stderr when it fails.
pub fn docker_ok(args: &[&str]) -> String {
    let out = docker(args);
    assert!(
        out.status.success(),
        "`docker {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Checks the engine answers and makes the image, once per process; every caller panics
/// when either failed (an ignored test run on purpose must fail, not pass, without them).
fn ensure_image() {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    if let Err(e) = READY.get_or_init(|| make_image("sshd-image.sh", IMAGE)) {
        panic!("{e}");
    }
}

/// Checks that the engine answers, then runs `tests/support/<script>`, which makes
/// `image` (and keeps one that exists); the error says which of the two failed.
pub fn make_image(script: &str, image: &str) -> Result<(), String> {
    let version = Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .map_err(|e| format!("cannot run `docker` ({e}): install the Docker CLI"))?;
    if !version.status.success() {
        return Err(format!(
            "the Docker engine is not reachable ({}): start it, or leave out --include-ignored",
            String::from_utf8_lossy(&version.stderr).trim()
        ));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/support")
        .join(script);
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed to make {image}:\n{}",
            script.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// `fdl-test-host-<pid>-<nanos>-<label>`, the nanos strictly increasing within the process
/// so that two threads never get the same name.
fn unique_name(label: &str) -> String {
    unique_in("fdl-test-host", label)
}

/// `<prefix>-<pid>-<nanos>-<label>`, the nanos strictly increasing within the process
/// (shared by every prefix).
pub fn unique_in(prefix: &str, label: &str) -> String {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let prev = LAST
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| {
            Some(now.max(last + 1))
        })
        .unwrap();
    let nanos = now.max(prev + 1);
    format!("{prefix}-{}-{nanos}-{label}", std::process::id())
}

/// Whether `docker run --init` works on this engine (it needs the daemon's docker-init).
static USE_INIT: OnceLock<bool> = OnceLock::new();

impl Host {
    /// Starts a host and waits until `ssh … true` succeeds through [`Host::ssh_argv`].
    pub fn start(label: &str, keys: &Keys) -> Host {
        Host::start_with(label, keys, &[])
    }

    /// [`Host::start`] with extra `docker run` arguments (e.g. `--tmpfs /data:size=2m`).
    pub fn start_with(label: &str, keys: &Keys, docker_args: &[&str]) -> Host {
        assert!(
            !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')),
            "a host label is part of a container name: [A-Za-z0-9_.-]+, not {label:?}"
        );
        ensure_image();
        // Made before the container, so a panic from here on removes whatever was created.
        let mut host = Host {
            name: unique_name(label),
            label: label.to_string(),
            port: 0,
        };
        host.run_container(keys, docker_args);
        host.port = host.published_port();
        host.wait_ready(keys);
        host
    }

    /// Starts a killed host again: its filesystem and host key are kept; the port the
    /// engine publishes may differ, so it is read again (and recorded in known_hosts).
    pub fn restart(&mut self, keys: &Keys) {
        docker_ok(&["start", &self.name]);
        self.port = self.published_port();
        self.wait_ready(keys);
    }

    /// Reads the published port again after the host joined or left a network (the
    /// engine publishes it anew then) and waits until ssh answers there.
    pub fn republished(&mut self, keys: &Keys) {
        self.port = self.published_port();
        self.wait_ready(keys);
    }

    fn published_port(&self) -> u16 {
        let published = docker(&["port", &self.name, "22/tcp"]);
        if !published.status.success() {
            // A container that exited at once has no port any more: say why it exited.
            self.panic_if_stopped();
        }
        let published = String::from_utf8_lossy(&published.stdout);
        published
            .lines()
            .find_map(|l| l.trim().strip_prefix("127.0.0.1:"))
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "no 127.0.0.1 port published for {}: {published:?}",
                    self.name
                )
            })
    }

    fn run_container(&self, keys: &Keys, docker_args: &[&str]) {
        let key_env = format!("FDL_TEST_AUTHORIZED_KEY={}", keys.public_key());
        let run = |init: bool| {
            let mut args = vec!["run", "-d", "--name", &self.name];
            if init {
                args.push("--init");
            }
            args.extend([
                "--hostname",
                &self.label,
                "--label",
                CONTAINER_LABEL,
                "-p",
                "127.0.0.1::22",
                "-e",
                &key_env,
            ]);
            args.extend_from_slice(docker_args);
            args.extend([IMAGE, "sh", "-c", STARTUP]);
            docker(&args)
        };
        let use_init = *USE_INIT.get().unwrap_or(&true);
        let mut out = run(use_init);
        if !out.status.success() && use_init && USE_INIT.get().is_none() {
            // No docker-init on this engine: sshd runs as PID 1 instead (it reaps its own).
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("init") {
                let _ = docker(&["rm", "-f", &self.name]);
                out = run(false);
                if out.status.success() {
                    let _ = USE_INIT.set(false);
                }
            }
        } else if out.status.success() {
            let _ = USE_INIT.set(use_init);
        }
        assert!(
            out.status.success(),
            "`docker run` of host {} failed: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }

    /// Records the host's ed25519 key in `known_hosts` once sshd has it, then waits until a
    /// real `ssh … true` succeeds.
    fn wait_ready(&self, keys: &Keys) {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut host_key: Option<String> = None;
        let mut last_error = String::from("(no ssh attempt yet)");
        loop {
            self.panic_if_stopped();
            if host_key.is_none() {
                let out = docker(&[
                    "exec",
                    &self.name,
                    "sh",
                    "-c",
                    "test -e /run/fdl-test-ready && cat /etc/ssh/ssh_host_ed25519_key.pub",
                ]);
                let text = String::from_utf8_lossy(&out.stdout);
                let mut fields = text.split_whitespace();
                if let (true, Some(kind @ "ssh-ed25519"), Some(key)) =
                    (out.status.success(), fields.next(), fields.next())
                {
                    keys.add_known_host(&format!("[127.0.0.1]:{} {kind} {key}", self.port));
                    host_key = Some(key.to_string());
                }
            }
            if host_key.is_some() {
                let argv = self.ssh_argv(keys);
                let out = Command::new(&argv[0])
                    .args(&argv[1..])
                    .args(["-o", "ConnectTimeout=5", "true"])
                    .stdin(Stdio::null())
                    .output()
                    .unwrap_or_else(|e| {
                        panic!("cannot run ssh ({e}): apt-get install -y openssh-client")
                    });
                if out.status.success() {
                    return;
                }
                last_error = String::from_utf8_lossy(&out.stderr).trim().to_string();
            }
            if Instant::now() > deadline {
                panic!(
                    "host {} ({}, 127.0.0.1:{}) did not answer `ssh … true` within {:?}; \
                     host key read: {}; last ssh error: {last_error}\ndocker logs:\n{}",
                    self.label,
                    self.name,
                    self.port,
                    READY_TIMEOUT,
                    host_key.is_some(),
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn panic_if_stopped(&self) {
        let state = docker(&[
            "inspect",
            "-f",
            "{{.State.Running}} {{.State.ExitCode}}",
            &self.name,
        ]);
        let state = String::from_utf8_lossy(&state.stdout);
        if !state.starts_with("true") {
            panic!(
                "host {} ({}) stopped while starting (running, exit code: {}); docker logs:\n{}",
                self.label,
                self.name,
                state.trim(),
                self.logs()
            );
        }
    }

    /// The container's output so far (sshd logs to it with `-e`).
    pub fn logs(&self) -> String {
        let out = docker(&["logs", &self.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// `ssh` argv (program first) reaching this host as root; append the remote command.
    pub fn ssh_argv(&self, keys: &Keys) -> Vec<String> {
        vec![
            "ssh".to_string(),
            "-p".to_string(),
            self.port.to_string(),
            "-l".to_string(),
            "root".to_string(),
            "-i".to_string(),
            keys.identity.display().to_string(),
            "-o".to_string(),
            format!("UserKnownHostsFile={}", keys.known_hosts.display()),
            "-o".to_string(),
            "StrictHostKeyChecking=yes".to_string(),
            "-o".to_string(),
            "BatchMode=yes".to_string(),
            "-o".to_string(),
            "IdentitiesOnly=yes".to_string(),
            "-T".to_string(),
            "127.0.0.1".to_string(),
        ]
    }

    /// The `ssh:` block of a worker entry in a generated `fdl.cluster.yml`, indented by
    /// `indent` spaces (its fields by two more), ending in a newline. Paths are quoted.
    pub fn ssh_yaml(&self, keys: &Keys, indent: usize) -> String {
        let pad = " ".repeat(indent);
        let quote = |s: String| serde_json::to_string(&s).unwrap();
        let mut y = String::new();
        let _ = writeln!(y, "{pad}ssh:");
        let _ = writeln!(y, "{pad}  target: 127.0.0.1");
        let _ = writeln!(y, "{pad}  port: {}", self.port);
        let _ = writeln!(y, "{pad}  user: root");
        let _ = writeln!(
            y,
            "{pad}  identity_file: {}",
            quote(keys.identity.display().to_string())
        );
        let _ = writeln!(y, "{pad}  options:");
        let _ = writeln!(
            y,
            "{pad}    - {}",
            quote(format!("UserKnownHostsFile={}", keys.known_hosts.display()))
        );
        let _ = writeln!(y, "{pad}    - StrictHostKeyChecking=yes");
        let _ = writeln!(y, "{pad}    - IdentitiesOnly=yes");
        y
    }

    /// Runs `sh -c script` in the container as root (setup and inspection, not what is
    /// under test); panics with its stderr when it fails; returns its stdout.
    pub fn exec(&self, script: &str) -> String {
        let out = docker(&["exec", &self.name, "sh", "-c", script]);
        assert!(
            out.status.success(),
            "on host {}: `{script}` failed ({}): {}",
            self.label,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Copies a file of this machine into the container at `dest` (parent directories
    /// made), its mode kept.
    pub fn put(&self, src: &Path, dest: &str) {
        self.exec(&format!("mkdir -p \"$(dirname {})\"", sh_quote(dest)));
        let target = format!("{}:{dest}", self.name);
        docker_ok(&["cp", &src.display().to_string(), &target]);
    }

    /// Writes `text` to `dest` in the container (parent directories made) with `mode`.
    pub fn write(&self, dest: &str, text: &str, mode: u32) {
        let script = format!(
            "mkdir -p \"$(dirname {d})\" && cat >{d} && chmod {mode:o} {d}",
            d = sh_quote(dest)
        );
        let mut child = Command::new("docker")
            .args(["exec", "-i", &self.name, "sh", "-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot run docker");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "on host {}: writing {dest} failed: {}",
            self.label,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }

    /// A stand-in `/usr/local/bin/nvidia-smi` for these GPUs (name, compute capability like
    /// `"6.1"`, memory in MiB), answering as the real one does (see [`nvidia_smi_script`]).
    pub fn fake_nvidia_smi(&self, gpus: &[(&str, &str, u32)], driver: &str, cuda: &str) {
        self.write(
            "/usr/local/bin/nvidia-smi",
            &nvidia_smi_script(gpus, driver, cuda),
            0o755,
        );
    }

    pub fn kill(&self) {
        docker_ok(&["kill", &self.name]);
    }

    pub fn pause(&self) {
        docker_ok(&["pause", &self.name]);
    }

    pub fn unpause(&self) {
        docker_ok(&["unpause", &self.name]);
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // Works on running, paused, stopped and never-created containers alike.
        let _ = Command::new("docker")
            .args(["rm", "-f", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// `'…'` for sh.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The real `nvidia-smi` banner table (as driver 570 prints it, 91 columns) for these GPUs.
pub fn nvidia_smi_banner(gpus: &[(&str, &str, u32)], driver: &str, cuda: &str) -> String {
    let rule = |c: char, j: char| {
        format!(
            "|{}{j}{}{j}{}|",
            c.to_string().repeat(41),
            c.to_string().repeat(24),
            c.to_string().repeat(22)
        )
    };
    let row = |a: String, b: String, c: String| {
        assert_eq!(
            (a.len(), b.len(), c.len()),
            (41, 24, 22),
            "nvidia-smi cells {a:?} {b:?} {c:?}"
        );
        format!("|{a}|{b}|{c}|")
    };
    let full = "-".repeat(89);
    let mut t = String::new();
    let _ = writeln!(t, "+{full}+");
    let _ = writeln!(
        t,
        "| NVIDIA-SMI {driver:<23}Driver Version: {driver:<15}CUDA Version: {cuda:<9}|"
    );
    let _ = writeln!(t, "{}", rule('-', '+'));
    let _ = writeln!(
        t,
        "{}",
        row(
            format!(" {:<39} ", "GPU  Name                 Persistence-M"),
            " Bus-Id          Disp.A ".into(),
            " Volatile Uncorr. ECC ".into()
        )
    );
    let _ = writeln!(
        t,
        "{}",
        row(
            format!(" {:<39} ", "Fan  Temp   Perf          Pwr:Usage/Cap"),
            "           Memory-Usage ".into(),
            " GPU-Util  Compute M. ".into()
        )
    );
    let _ = writeln!(
        t,
        "{}",
        row(" ".repeat(41), " ".repeat(24), format!("{:>21} ", "MIG M."))
    );
    let _ = writeln!(t, "{}", rule('=', '+'));
    for (i, (name, _cc, mem)) in gpus.iter().enumerate() {
        let name: String = if name.len() > 27 {
            format!("{}...", &name[..24])
        } else {
            name.to_string()
        };
        let _ = writeln!(
            t,
            "{}",
            row(
                format!("{i:>4}  {name:<27}{:>7} ", "Off"),
                format!("{:>19} Off ", format!("00000000:{:02X}:00.0", i + 1)),
                format!("{:>21} ", "N/A")
            )
        );
        let _ = writeln!(
            t,
            "{}",
            row(
                format!("{:<41}", "  0%   35C    P8              6W /  120W "),
                format!("{:>11} / {:>9} ", "1MiB", format!("{mem}MiB")),
                format!("{:>8}{:>13} ", "0%", "Default")
            )
        );
        let _ = writeln!(
            t,
            "{}",
            row(" ".repeat(41), " ".repeat(24), format!("{:>21} ", "N/A"))
        );
        let _ = writeln!(t, "{}", rule('-', '+'));
    }
    let _ = writeln!(t, "{}", " ".repeat(91));
    let _ = writeln!(t, "+{full}+");
    let _ = writeln!(t, "| {:<88}|", "Processes:");
    let _ = writeln!(
        t,
        "| {:<88}|",
        " GPU   GI   CI              PID   Type   Process name                        GPU Memory"
    );
    let _ = writeln!(
        t,
        "| {:<88}|",
        "       ID   ID                                                               Usage"
    );
    let _ = writeln!(t, "|{}|", "=".repeat(89));
    let _ = writeln!(t, "| {:<88}|", " No running processes found");
    let _ = writeln!(t, "+{full}+");
    for line in t.lines() {
        assert_eq!(line.len(), 91, "nvidia-smi banner line {line:?}");
    }
    t
}

/// The stand-in's sh script: with no arguments the banner (after a timestamp line, as the
/// real one prints); `--query-gpu=index,name,compute_cap,memory.total` and
/// `--query-gpu=driver_version` with `--format=csv,noheader[,nounits]` (in any order) the
/// CSV lines; anything else an error on stderr and exit 2.
pub fn nvidia_smi_script(gpus: &[(&str, &str, u32)], driver: &str, cuda: &str) -> String {
    let mut info_units = String::new();
    let mut info_nounits = String::new();
    let mut drivers = String::new();
    for (i, (name, cc, mem)) in gpus.iter().enumerate() {
        let _ = writeln!(info_nounits, "{i}, {name}, {cc}, {mem}");
        let _ = writeln!(info_units, "{i}, {name}, {cc}, {mem} MiB");
        let _ = writeln!(drivers, "{driver}");
    }
    let banner = nvidia_smi_banner(gpus, driver, cuda);
    format!(
        r#"#!/bin/sh
# Stand-in nvidia-smi written by tests/cluster_fixture.
usage() {{
  echo "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help." >&2
  exit 2
}}
if [ $# -eq 0 ]; then
  date '+%a %b %e %H:%M:%S %Y       '
  cat <<'FDL_EOF'
{banner}FDL_EOF
  exit 0
fi
query= format=
for arg in "$@"; do
  case $arg in
    --query-gpu=*) query=${{arg#--query-gpu=}} ;;
    --format=*) format=${{arg#--format=}} ;;
    *) usage ;;
  esac
done
case "$query|$format" in
  "index,name,compute_cap,memory.total|csv,noheader,nounits") cat <<'FDL_EOF'
{info_nounits}FDL_EOF
  ;;
  "index,name,compute_cap,memory.total|csv,noheader") cat <<'FDL_EOF'
{info_units}FDL_EOF
  ;;
  "driver_version|csv,noheader"|"driver_version|csv,noheader,nounits") cat <<'FDL_EOF'
{drivers}FDL_EOF
  ;;
  *) usage ;;
esac
"#
    )
}
