//! The worker's half of `fdl cluster rehearse`: what this host's NCCL chooses for its
//! bootstrap, asked of that NCCL itself, and whether the addresses chosen reach each
//! other.
//!
//! `ncclGetUniqueId` runs NCCL's bootstrap setup without a GPU: it reads the `NCCL_*`
//! settings (environment, `nccl.conf`), picks the interface and address the root listens
//! on, and writes them into the id (the `sockaddr`, after a magic from NCCL 2.16 on).
//! fdl calls it in a child of its own ([`child_main`], `fdl` re-run through
//! `/proc/self/exe`), bounded in time and output, with `NCCL_DEBUG=INFO` and no GPU
//! visible, and reads both the id and NCCL's own lines. The child loads only the
//! effective NCCL as `cluster status` decides it, and only when fdl can vouch for it
//! ([`Trust`]): an fdl build whose file matches its manifest's digest, or the libtorch's
//! own NCCL; both in files only this user or root can change. NCCL's plugins are kept
//! out (their variables set to `none`): the bootstrap needs none, and an env plugin that
//! would load is refused, since it could change the answer.
//!
//! [`reach`] is the second half: listen on the address NCCL chose and connect to the
//! others' within a bound, each side proving itself with the controller's nonce, so a
//! connection that reaches another program is never taken for NCCL's peer.

use crate::cluster::host::{self, Facts, NcclFacts, SelfQuery};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The shape of a worker's bootstrap answer; the controller refuses any other.
pub const BOOTSTRAP_SCHEMA: u32 = 1;
pub const BOOTSTRAP_KIND: &str = "fdl-bootstrap";
/// The shape of a worker's reach answer.
pub const REACH_SCHEMA: u32 = 1;
pub const REACH_KIND: &str = "fdl-reach";

/// The line the child prints after `ncclGetUniqueId` returned: the code and the id.
const ID_MARK: &str = "fdl-bootstrap-id";
/// The most of NCCL's lines an answer keeps, and of one line.
const MAX_LINES: usize = 40;
const LINE_MAX: usize = 300;
/// The most interfaces, and addresses of one, an answer lists.
const MAX_INTERFACES: usize = 64;
const MAX_ADDRESSES: usize = 16;
/// What the child may print (NCCL at INFO says a few lines; a broken library more).
const CHILD_OUTPUT: usize = 256 * 1024;

/// One host's bootstrap, as its NCCL chose it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootstrapAnswer {
    pub schema: u32,
    pub kind: String,
    pub hostname: String,
    /// The NCCL that ran, when one did.
    #[serde(default)]
    pub library: Option<Checked>,
    pub outcome: Outcome,
    /// This host's interfaces and their addresses (`getifaddrs`), for the causes.
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    /// The `NCCL_*` settings the child ran with that its ranks would too (the env:
    /// block over the inherited environment), as `NAME=VALUE`.
    #[serde(default)]
    pub settings: Vec<String>,
    /// NCCL's own `INFO` and `WARN` lines, as printed (the controller cleans them).
    #[serde(default)]
    pub nccl_lines: Vec<String>,
}

/// The NCCL fdl ran, and why it could.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checked {
    pub file: PathBuf,
    pub version: String,
    pub trust: Trust,
}

/// Why fdl runs a library: the only two kinds of NCCL it vouches for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Trust {
    /// An fdl build of this project, its file's BLAKE3 the one its manifest records.
    Build { name: String },
    /// The NCCL the libtorch itself brings (no preload).
    Libtorch,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Outcome {
    /// `ncclGetUniqueId` returned 0: the root would listen at `address`.
    Chosen {
        /// As NCCL's `Bootstrap: Using` line names it (`None`: no such line).
        interface: Option<String>,
        address: SocketAddr,
        /// `NCCL_COMM_ID` named the root's address; NCCL did not choose it.
        comm_id: bool,
    },
    /// NCCL's error: its code and its last `WARN` line.
    NcclError { code: i32, warn: Option<String> },
    /// fdl would not run the library: why.
    Refused { reason: String },
    /// The child did not answer (a crash, a hang, no such function): why.
    Failed { reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    pub name: String,
    /// `address/prefix`, as `ip addr` writes them.
    pub addresses: Vec<IfAddress>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IfAddress {
    pub address: IpAddr,
    pub prefix: u8,
}

impl IfAddress {
    /// Whether `ip` lies on this address's network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.address, ip) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                let bits = u32::from(self.prefix.min(32));
                let mask = if bits == 0 {
                    0
                } else {
                    u32::MAX << (32 - bits)
                };
                u32::from(a) & mask == u32::from(b) & mask
            }
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                let bits = u32::from(self.prefix.min(128));
                let mask = if bits == 0 {
                    0
                } else {
                    u128::MAX << (128 - bits)
                };
                u128::from(a) & mask == u128::from(b) & mask
            }
            _ => false,
        }
    }
}

/// What one host is asked: its report's query, and its env: block's variables that
/// NCCL reads (every `NCCL_*`) or that its search for libraries does.
pub struct Ask<'a> {
    pub query: &'a SelfQuery,
    pub builds: &'a Path,
    pub limit: Duration,
}

/// Whether a variable of a worker's env: block reaches the rehearsal's child: NCCL's own,
/// and what the report already reads (the loader's search path, a Python rank's).
pub fn rehearsed_variable(name: &str) -> bool {
    name.starts_with("NCCL_") || host::reported_variable(name)
}

/// This host's answer: the effective NCCL checked, then asked in a child.
pub fn ask(a: &Ask) -> BootstrapAnswer {
    let settings: Vec<String> = a
        .query
        .env
        .iter()
        .filter(|(k, _)| k.starts_with("NCCL_"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let mut answer = BootstrapAnswer {
        schema: BOOTSTRAP_SCHEMA,
        kind: BOOTSTRAP_KIND.into(),
        hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        library: None,
        outcome: Outcome::Failed {
            reason: "not asked".into(),
        },
        interfaces: interfaces(),
        settings,
        nccl_lines: Vec::new(),
    };
    let checked = match checked_nccl(a) {
        Ok(c) => c,
        Err(reason) => {
            answer.outcome = Outcome::Refused { reason };
            return answer;
        }
    };
    let (outcome, lines) = run_child(&checked.file, &checked.version, &a.query.env, a.limit);
    answer.library = Some(checked);
    answer.outcome = outcome;
    answer.nccl_lines = lines;
    answer
}

/// The effective NCCL, when fdl can vouch for it; else why not.
fn checked_nccl(a: &Ask) -> Result<Checked, String> {
    let eff = host::effective(a.query);
    let nccl = eff
        .nccl
        .map_err(|e| format!("which NCCL its ranks load is not known: {e:#}"))?;
    let lt = eff
        .libtorch
        .known()
        .ok_or("its libtorch is not known, so neither is its NCCL")?;
    let file = a.query.root.join(&nccl.file);
    let real = crate::loader::pywitness::trusted_file(&file).map_err(|(p, why)| {
        format!(
            "its effective NCCL {} is not safe to run: {} {why}",
            file.display(),
            p.display()
        )
    })?;
    let trust = trust_of(&real, &nccl, lt, a)?;
    env_plugin_kept_out(&eff.plugins, &a.query.env)?;
    loads_checked(&real)?;
    Ok(Checked {
        file: real,
        version: nccl.version,
        trust,
    })
}

/// The libtorch's own NCCL (the same file its model answers without a preload), or an
/// fdl build whose file is the one its manifest records; anything else is refused.
fn trust_of(
    real: &Path,
    nccl: &NcclFacts,
    lt: &host::LibtorchFacts,
    a: &Ask,
) -> Result<Trust, String> {
    use std::os::unix::fs::MetadataExt;
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    if let Facts::Known(own) = &lt.nccl {
        let own = id(&a.query.root.join(&own.file));
        if own.is_some() && own == id(real) {
            return Ok(Trust::Libtorch);
        }
    }
    let refused = || {
        format!(
            "its effective NCCL {} (NCCL {}) is neither an fdl build of this project nor the libtorch's own NCCL: fdl runs only libraries it has checked. Ship a build (`fdl cluster ship`) and set the LD_PRELOAD `fdl cluster env` prints",
            real.display(),
            nccl.version
        )
    };
    let builds = std::fs::canonicalize(a.builds).map_err(|_| refused())?;
    let inside = real.strip_prefix(&builds).map_err(|_| refused())?;
    let mut parts = inside.components();
    let name = parts
        .next()
        .and_then(|c| c.as_os_str().to_str())
        .ok_or_else(refused)?
        .to_string();
    let rel = parts.as_path().to_string_lossy().into_owned();
    let manifest = crate::nccl::store::read_manifest(&builds.join(&name)).map_err(|e| {
        format!(
            "{} lies in build {name}, whose manifest cannot be read ({e:#}): fdl runs only libraries it has checked",
            real.display()
        )
    })?;
    let recorded = manifest
        .files
        .iter()
        .flatten()
        .find_map(|f| match f {
            crate::nccl::files::FileEntry::File { path, blake3, .. } if *path == rel => {
                Some(blake3.clone())
            }
            _ => None,
        })
        .ok_or_else(|| {
            format!(
                "build {name}'s manifest records no digest for {rel}: fdl runs only libraries it has checked (`fdl nccl verify {name}` says more)"
            )
        })?;
    let mut buf = vec![0u8; crate::digest::CHUNK];
    let (_, now) = crate::digest::blake3_file(real, &mut buf)
        .map_err(|e| format!("{} cannot be read: {e:#}", real.display()))?;
    if now != recorded {
        return Err(format!(
            "{} is not the file build {name}'s manifest records (its BLAKE3 differs): it was changed after the build; fdl does not run it. `fdl nccl verify {name}` says more; ship the build again (`fdl cluster ship --force`)",
            real.display()
        ));
    }
    Ok(Trust::Build { name })
}

/// Checks every file the child's loader opens for `lib`, as `lib` itself is checked: the
/// library's DT_NEEDED closure as the loader model lays it out in the child's environment
/// (no preload and no search path of the user's; `/etc/ld.so.preload` and the system's
/// directories as this host has them), a compiled-in NCCL's siblings found through its
/// own `$ORIGIN` included. A closure the model cannot complete is left to the child, whose
/// loader then fails by itself on what it cannot find.
pub fn loads_checked(lib: &Path) -> Result<(), String> {
    let mut env = crate::loader::LoaderEnv::from_process();
    env.preload.clear();
    env.ld_library_path.clear();
    let map = crate::loader::map::load_as(lib, &env, crate::loader::TargetKind::Library)
        .map_err(|e| format!("what {} loads cannot be laid out: {e:#}", lib.display()))?;
    for o in map
        .objects
        .iter()
        .filter(|o| !o.path.as_os_str().is_empty())
    {
        crate::loader::pywitness::trusted_file(&env.cwd.join(&o.path)).map_err(|(p, why)| {
            format!(
                "{} loads {}, which is not safe to run: {} {why}",
                lib.display(),
                o.path.display(),
                p.display()
            )
        })?;
    }
    Ok(())
}

/// Refuses when NCCL would load an env plugin (its code could change the answer, and
/// fdl has not checked it); every other plugin is kept out of the child, which changes
/// nothing of the bootstrap.
fn env_plugin_kept_out(
    plugins: &Facts<Vec<host::PluginFacts>>,
    env: &[(String, String)],
) -> Result<(), String> {
    let set = env
        .iter()
        .find(|(k, _)| k == "NCCL_ENV_PLUGIN")
        .map(|(_, v)| v.clone())
        .or_else(|| std::env::var("NCCL_ENV_PLUGIN").ok());
    if let Some(v) = set.filter(|v| !v.eq_ignore_ascii_case("none") && !v.is_empty()) {
        return Err(format!(
            "NCCL_ENV_PLUGIN={v}: NCCL would load that env plugin, whose code fdl has not checked and which may set the bootstrap's variables, so the rehearsal would not say what the ranks do"
        ));
    }
    if let Facts::Known(kinds) = plugins {
        if let Some(p) = kinds
            .iter()
            .find(|p| p.kind == "env" && p.verdict == "loaded")
        {
            return Err(format!(
                "NCCL would load the env plugin {}, whose code fdl has not checked and which may set the bootstrap's variables, so the rehearsal would not say what the ranks do",
                p.path.as_deref().unwrap_or(Path::new("?")).display()
            ));
        }
    }
    Ok(())
}

/// Runs the child on `lib` with the worker's variables and reads what NCCL said.
fn run_child(
    lib: &Path,
    version: &str,
    env: &[(String, String)],
    limit: Duration,
) -> (Outcome, Vec<String>) {
    let mut cmd = std::process::Command::new("/proc/self/exe");
    cmd.args(["cluster", "bootstrap-child", "--library"])
        .arg(lib);
    // Every plugin NCCL names by a variable is kept out, the kinds of releases newer
    // than fdl too (`NCCL_<KIND>_PLUGIN`, whatever KIND): the bootstrap needs none.
    let plugin = |k: &str| k.starts_with("NCCL_") && k.ends_with("_PLUGIN");
    for (k, v) in env
        .iter()
        .filter(|(k, _)| k.starts_with("NCCL_") && !plugin(k))
    {
        cmd.env(k, v);
    }
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(plugin) {
            cmd.env_remove(k);
        }
    }
    // Nothing is preloaded into fdl's own child, and the libraries the checked NCCL
    // needs come from the system's directories only: a directory on a search path may
    // hold what fdl has not checked. The library itself is opened by its path.
    for k in [
        "LD_PRELOAD",
        "LD_AUDIT",
        "LD_LIBRARY_PATH",
        "NCCL_DEBUG_FILE",
    ] {
        cmd.env_remove(k);
    }
    cmd.env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_SUBSYS", "INIT,BOOTSTRAP,ENV,NET")
        // No GPU is visible to the child: the bootstrap needs none, and none is touched.
        .env("CUDA_VISIBLE_DEVICES", "");
    // The kinds fdl knows are named `none`, so that not even their default file loads.
    for kind in crate::loader::plugins::Kind::ALL {
        cmd.env(kind.variable(), "none");
    }
    let out = match crate::process::output_within_cap(&mut cmd, limit, CHILD_OUTPUT) {
        Ok(Some(out)) => out,
        Ok(None) => {
            return (
                Outcome::Failed {
                    reason: format!(
                        "NCCL did not answer within {} s (the child was ended)",
                        limit.as_secs()
                    ),
                },
                Vec::new(),
            )
        }
        Err(e) => {
            return (
                Outcome::Failed {
                    reason: format!("the child could not run: {e}"),
                },
                Vec::new(),
            )
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let lines = nccl_lines(&text);
    let outcome = match read_child(&text) {
        Some((0, id)) => match decode_id_of(version, &id) {
            Some(address) => Outcome::Chosen {
                interface: using_interface(&lines),
                address,
                comm_id: env.iter().any(|(k, _)| k == "NCCL_COMM_ID")
                    || std::env::var_os("NCCL_COMM_ID").is_some(),
            },
            None => Outcome::Failed {
                reason: "NCCL returned an id that holds no IPv4 or IPv6 address".into(),
            },
        },
        Some((code, _)) => Outcome::NcclError {
            code,
            warn: last_warn(&lines),
        },
        None => {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            Outcome::Failed {
                reason: format!(
                    "the child ended ({}) without an answer: {}",
                    out.status,
                    last.chars().take(LINE_MAX).collect::<String>()
                ),
            }
        }
    };
    (outcome, lines)
}

/// NCCL's `INFO`/`WARN` lines of the child's output, bounded.
fn nccl_lines(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.contains(" NCCL INFO ") || l.contains(" NCCL WARN "))
        .take(MAX_LINES)
        .map(|l| l.chars().take(LINE_MAX).collect())
        .collect()
}

/// The interface of NCCL's `Bootstrap: Using eth0:192.0.2.2<0>` line (`Bootstrap :
/// Using` before 2.22).
pub fn using_interface(lines: &[String]) -> Option<String> {
    lines.iter().find_map(|l| {
        let (_, rest) = l.split_once(" NCCL INFO Bootstrap")?;
        let rest = rest.trim_start().strip_prefix(':')?.trim_start();
        let rest = rest.strip_prefix("Using")?.trim_start();
        let (name, _) = rest.split_once(':')?;
        (!name.is_empty() && name.len() <= 64).then(|| name.to_string())
    })
}

/// The text of NCCL's last `WARN` line, after its source position.
pub fn last_warn(lines: &[String]) -> Option<String> {
    lines.iter().rev().find_map(|l| {
        l.split_once(" NCCL WARN ")
            .map(|(_, w)| w.trim().to_string())
    })
}

/// The child's marker line: the code `ncclGetUniqueId` returned and the id's bytes.
fn read_child(text: &str) -> Option<(i32, Vec<u8>)> {
    let line = text.lines().find_map(|l| l.strip_prefix(ID_MARK))?;
    let mut words = line.split_whitespace();
    let code = words.next()?.parse().ok()?;
    let hex = words.next().unwrap_or("");
    let bytes = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some((code, bytes))
}

/// The root's address in the `ncclUniqueId` of NCCL `version`: the `sockaddr` the root
/// listens on (`sockaddr_in` or `sockaddr_in6`, the family in host order, the port and
/// address in network order). From NCCL 2.16 the id is an `ncclBootstrapHandle`, a
/// 64-bit magic and then that `sockaddr` (2.30 adds a rank count after it); before, the
/// id is the `sockaddr` itself (`bootstrapGetUniqueId` of 2.12 to 2.15 copies it to the
/// id's start), as NCCL's `bootstrap.h` and `bootstrap.cc` of each release say.
pub fn decode_id_of(version: &str, id: &[u8]) -> Option<SocketAddr> {
    let handle = version
        .parse::<crate::version::NcclVersion>()
        .map_or(true, |v| (v.major, v.minor) >= (2, 16));
    decode_sockaddr(id.get(if handle { 8 } else { 0 }..)?)
}

fn decode_sockaddr(at: &[u8]) -> Option<SocketAddr> {
    let sa = at.get(..28)?;
    let family = u16::from_ne_bytes([sa[0], sa[1]]);
    let port = u16::from_be_bytes([sa[2], sa[3]]);
    match i32::from(family) {
        libc::AF_INET => {
            let ip = std::net::Ipv4Addr::new(sa[4], sa[5], sa[6], sa[7]);
            Some(SocketAddr::new(IpAddr::V4(ip), port))
        }
        libc::AF_INET6 => {
            let flow = u32::from_be_bytes([sa[4], sa[5], sa[6], sa[7]]);
            let octets: [u8; 16] = sa[8..24].try_into().ok()?;
            let scope = u32::from_ne_bytes([sa[24], sa[25], sa[26], sa[27]]);
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                octets.into(),
                port,
                flow,
                scope,
            )))
        }
        _ => None,
    }
}

/// The child: opens `lib`, calls `ncclGetUniqueId`, prints the marker line and ends
/// without running the library's destructors (NCCL's root thread still runs; the
/// socket it listens on closes with the process).
pub fn child_main(lib: &Path) -> ! {
    use std::os::unix::ffi::OsStrExt;
    let say = |line: String| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    let end = |code: i32| -> ! {
        // SAFETY: flushing C's streams (NCCL prints through them) and ending at once.
        unsafe {
            libc::fflush(std::ptr::null_mut());
            libc::_exit(code)
        }
    };
    let Ok(path) = std::ffi::CString::new(lib.as_os_str().as_bytes()) else {
        eprintln!("the library's path holds a NUL byte");
        end(2)
    };
    // SAFETY: dlopen of a path fdl checked (see `checked_nccl`); RTLD_LOCAL keeps its
    // symbols to itself.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns a NUL-terminated string or null.
        let why = unsafe {
            let e = libc::dlerror();
            if e.is_null() {
                "unknown".to_string()
            } else {
                std::ffi::CStr::from_ptr(e).to_string_lossy().into_owned()
            }
        };
        eprintln!("the library cannot be loaded: {why}");
        end(2)
    }
    // SAFETY: looking a name up in a handle dlopen returned.
    let sym = unsafe { libc::dlsym(handle, c"ncclGetUniqueId".as_ptr()) };
    if sym.is_null() {
        eprintln!("the library exports no ncclGetUniqueId");
        end(2)
    }
    // SAFETY: ncclGetUniqueId(ncclUniqueId*) writes NCCL_UNIQUE_ID_BYTES (128) bytes.
    let get: extern "C" fn(*mut u8) -> i32 = unsafe { std::mem::transmute(sym) };
    let mut id = [0u8; 128];
    let code = get(id.as_mut_ptr());
    // SAFETY: NCCL's lines first, then fdl's.
    unsafe { libc::fflush(std::ptr::null_mut()) };
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    say(format!("{ID_MARK} {code} {hex}"));
    end(0)
}

/// This host's interfaces and their addresses, bounded.
pub fn interfaces() -> Vec<Interface> {
    let mut out: Vec<Interface> = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut at = head;
    let mut seen = 0usize;
    while !at.is_null() && seen < 4096 {
        seen += 1;
        // SAFETY: `at` is an element of the list getifaddrs returned.
        let ifa = unsafe { &*at };
        at = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a NUL-terminated name from getifaddrs.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .chars()
            .take(64)
            .collect::<String>();
        let (Some(address), prefix) = (
            // SAFETY: sockaddrs of the family they say.
            unsafe { sockaddr_ip(ifa.ifa_addr) },
            unsafe { sockaddr_ip(ifa.ifa_netmask) },
        ) else {
            continue;
        };
        let prefix = match prefix {
            Some(IpAddr::V4(m)) => u32::from(m).count_ones() as u8,
            Some(IpAddr::V6(m)) => u128::from(m).count_ones() as u8,
            None => 0,
        };
        let a = IfAddress { address, prefix };
        match out.iter().position(|i| i.name == name) {
            Some(k) if out[k].addresses.len() < MAX_ADDRESSES => out[k].addresses.push(a),
            Some(_) => {}
            None if out.len() < MAX_INTERFACES => out.push(Interface {
                name,
                addresses: vec![a],
            }),
            None => {}
        }
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// # Safety
/// `sa` is null or points to a sockaddr of the family it names.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    match i32::from((*sa).sa_family) {
        libc::AF_INET => {
            let sin = &*(sa as *const libc::sockaddr_in);
            Some(IpAddr::V4(u32::from_be(sin.sin_addr.s_addr).into()))
        }
        libc::AF_INET6 => {
            let sin6 = &*(sa as *const libc::sockaddr_in6);
            Some(IpAddr::V6(sin6.sin6_addr.s6_addr.into()))
        }
        _ => None,
    }
}

/// What one host does in the reach phase.
#[derive(Debug, Clone)]
pub struct ReachAsk {
    /// Its own name in the hellos it sends (the controller's index of it).
    pub me: String,
    pub nonce: String,
    /// Where to listen (the address its NCCL chose), if anywhere.
    pub listen: Option<SocketAddr>,
    /// Whose hellos to wait for.
    pub expect: Vec<String>,
    /// Whom to reach, by name.
    pub connect: Vec<(String, SocketAddr)>,
    pub within: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReachAnswer {
    pub schema: u32,
    pub kind: String,
    /// `None`: not asked to listen; `Some(Err)`: why it could not.
    #[serde(default)]
    pub listen: Option<std::result::Result<SocketAddr, String>>,
    #[serde(default)]
    pub connects: Vec<Connect>,
    /// The hellos that arrived: who, from which address.
    #[serde(default)]
    pub arrivals: Vec<Arrival>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connect {
    pub to: String,
    pub address: SocketAddr,
    pub result: Reached,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Reached {
    /// Connected, and the other side answered with the nonce.
    Yes { ms: u64 },
    /// Every try was refused (a reset: nothing listening, or a firewall rejecting).
    Refused,
    /// No answer to the connection within the bound (a firewall dropping, no route).
    TimedOut,
    /// The kernel said there is no way there (no route, network unreachable).
    Unreachable { why: String },
    /// Something answered there that is not fdl's listener with this nonce.
    Other,
    /// Another error.
    Error { why: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Arrival {
    pub from: String,
    pub peer: SocketAddr,
}

const HELLO: &str = "fdl-rehearse";
/// How long a refused connection waits before it tries again.
const RETRY: Duration = Duration::from_millis(10);
/// The most connections one host tries at once.
const CONNECTING: usize = 64;

/// Listens and connects as asked, all within `within`; ends when every connection is
/// settled and every expected hello came, or at the bound. Nothing listens after.
pub fn reach(a: &ReachAsk) -> ReachAnswer {
    let deadline = Instant::now() + a.within;
    let listener = a.listen.map(|addr| {
        TcpListener::bind(addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| (l, addr)))
            .map_err(|e| format!("cannot listen on {addr}: {e}"))
    });
    let mut answer = ReachAnswer {
        schema: REACH_SCHEMA,
        kind: REACH_KIND.into(),
        listen: listener
            .as_ref()
            .map(|l| l.as_ref().map(|(_, addr)| *addr).map_err(Clone::clone)),
        connects: Vec::new(),
        arrivals: Vec::new(),
    };
    std::thread::scope(|s| {
        let accepting = listener
            .and_then(Result::ok)
            .map(|(l, _)| s.spawn(move || accept_until(&l, a, deadline)));
        // The root reaches every worker: at most CONNECTING at once, each bounded.
        answer.connects = super::in_parallel(
            &a.connect,
            CONNECTING,
            |(to, addr)| Connect {
                to: to.clone(),
                address: *addr,
                result: connect_until(*addr, a, deadline),
            },
            &|_| {},
        );
        if let Some(h) = accepting {
            answer.arrivals = h.join().unwrap_or_default();
        }
    });
    answer
}

fn accept_until(l: &TcpListener, a: &ReachAsk, deadline: Instant) -> Vec<Arrival> {
    let mut came: Vec<Arrival> = Vec::new();
    while Instant::now() < deadline && !a.expect.iter().all(|e| came.iter().any(|c| c.from == *e)) {
        match l.accept() {
            Ok((mut s, peer)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
                let mut buf = [0u8; 256];
                let mut n = 0;
                while n < buf.len() {
                    match s.read(&mut buf[n..]) {
                        Ok(0) | Err(_) => break,
                        Ok(k) => {
                            n += k;
                            if buf[..n].contains(&b'\n') {
                                break;
                            }
                        }
                    }
                }
                let text = String::from_utf8_lossy(&buf[..n]);
                let mut w = text.split_whitespace();
                if let (Some(HELLO), Some(nonce), Some(from)) = (w.next(), w.next(), w.next()) {
                    if nonce == a.nonce && a.expect.iter().any(|e| e == from) {
                        let _ = s.write_all(format!("{HELLO}-ok {}\n", a.nonce).as_bytes());
                        if !came.iter().any(|c| c.from == from) {
                            came.push(Arrival {
                                from: from.to_string(),
                                peer,
                            });
                        }
                    }
                }
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    came
}

fn connect_until(addr: SocketAddr, a: &ReachAsk, deadline: Instant) -> Reached {
    let started = Instant::now();
    let mut last = Reached::TimedOut;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return last;
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(2))) {
            Ok(mut s) => {
                let _ = s.set_read_timeout(Some(left.max(Duration::from_millis(200))));
                let hello = format!("{HELLO} {} {}\n", a.nonce, a.me);
                let mut buf = [0u8; 128];
                let mut n = 0;
                if s.write_all(hello.as_bytes()).is_ok() {
                    while n < buf.len() {
                        match s.read(&mut buf[n..]) {
                            Ok(0) | Err(_) => break,
                            Ok(k) => {
                                n += k;
                                if buf[..n].contains(&b'\n') {
                                    break;
                                }
                            }
                        }
                    }
                }
                let want = format!("{HELLO}-ok {}", a.nonce);
                if String::from_utf8_lossy(&buf[..n]).trim_end() == want {
                    return Reached::Yes {
                        ms: started.elapsed().as_millis() as u64,
                    };
                }
                // Something else listens there (or the listener was not ours yet).
                last = Reached::Other;
            }
            Err(e) => {
                last = match e.raw_os_error() {
                    Some(libc::ECONNREFUSED) => Reached::Refused,
                    Some(libc::ETIMEDOUT) => Reached::TimedOut,
                    Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH) => {
                        Reached::Unreachable { why: e.to_string() }
                    }
                    _ if e.kind() == std::io::ErrorKind::TimedOut => Reached::TimedOut,
                    _ => Reached::Error { why: e.to_string() },
                };
            }
        }
        // The peers start a few ms apart: a refusal is mostly a listener not bound yet,
        // and a long pause here would be most of the phase's time.
        std::thread::sleep(RETRY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(hex: &str) -> Vec<u8> {
        (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn the_id_holds_the_roots_address_as_nccl_writes_it() {
        // Read off NCCL 2.27.5's ncclGetUniqueId here: eth0 192.0.2.2, port 0xd9f5.
        let hex =
            "ed661a74e30488c40200d9f5c0000202000000000000000000000000000000000000000000000000";
        let id = bytes(hex);
        assert_eq!(
            decode_id_of("2.27.5", &id),
            Some("192.0.2.2:55797".parse().unwrap())
        );
        // NCCL_SOCKET_FAMILY=AF_INET6: fd00::2.
        let hex =
            "4417d695e92611660a00a8c900000000fd000000000000000000000000000002000000000000000000";
        let id = bytes(hex);
        assert_eq!(
            decode_id_of("2.27.5", &id),
            Some("[fd00::2]:43209".parse().unwrap())
        );
        // NCCL 2.14.3 (torch 1.13.1's, exported from its libtorch_cuda_cpp.so), with
        // NCCL_SOCKET_IFNAME=lo: the sockaddr at the id's start, no magic.
        let hex =
            "0200e3c37f0000010000000000000000000000000000000000000000000000000000000000000000";
        let id = bytes(hex);
        assert_eq!(
            decode_id_of("2.14.3", &id),
            Some("127.0.0.1:58307".parse().unwrap())
        );
        assert_eq!(
            decode_id_of("2.27.5", &id),
            None,
            "read as a handle: no family"
        );
        assert_eq!(
            decode_id_of("2.27.5", &[0u8; 128]),
            None,
            "an id of zeros holds no address"
        );
        assert_eq!(decode_id_of("2.27.5", &[1, 2, 3]), None);
        assert_eq!(decode_id_of("2.14.3", &[2, 0, 3]), None);
    }

    #[test]
    fn nccl_lines_name_the_interface_and_the_error_in_every_wording() {
        let lines: Vec<String> = [
            "vm:6381:6381 [0] NCCL INFO Bootstrap: Using eth0:192.0.2.2<0>",
            "vm:6385:6385 [32767] NCCL INFO Bootstrap : Using eth1:10.0.0.2<0>",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(using_interface(&lines[..1]), Some("eth0".into()));
        assert_eq!(using_interface(&lines[1..]), Some("eth1".into()));
        let lines: Vec<String> = [
            "vm:1:1 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to nosuch0",
            "[2026-12-06 20:38:47] vm:6391:6391 [0] bootstrap.cc:115 NCCL WARN Bootstrap : no socket interface found",
            "vm:6391:6391 [0] NCCL INFO init.cc:80 -> 5",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(using_interface(&lines), None);
        assert_eq!(
            last_warn(&lines).as_deref(),
            Some("Bootstrap : no socket interface found")
        );
    }

    #[test]
    fn an_address_is_on_a_network_by_its_prefix() {
        let a = IfAddress {
            address: "172.18.0.3".parse().unwrap(),
            prefix: 16,
        };
        assert!(a.contains("172.18.5.9".parse().unwrap()));
        assert!(!a.contains("172.19.0.2".parse().unwrap()));
        assert!(!a.contains("fd00::2".parse().unwrap()));
        let b = IfAddress {
            address: "fd77:1::3".parse().unwrap(),
            prefix: 64,
        };
        assert!(b.contains("fd77:1::9".parse().unwrap()));
        assert!(!b.contains("fd77:2::9".parse().unwrap()));
    }

    #[test]
    fn a_hello_with_the_nonce_reaches_and_nothing_listens_after() {
        let free = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = free.local_addr().unwrap();
        drop(free);
        let listen = ReachAsk {
            me: "0".into(),
            nonce: "n1".into(),
            listen: Some(at),
            expect: vec!["1".into()],
            connect: Vec::new(),
            within: Duration::from_secs(5),
        };
        let dial = ReachAsk {
            me: "1".into(),
            nonce: "n1".into(),
            listen: None,
            expect: Vec::new(),
            connect: vec![("0".into(), at)],
            within: Duration::from_secs(5),
        };
        let (l, d) = std::thread::scope(|s| {
            let l = s.spawn(|| reach(&listen));
            let d = s.spawn(|| reach(&dial));
            (l.join().unwrap(), d.join().unwrap())
        });
        assert_eq!(l.listen, Some(Ok(at)));
        assert_eq!(l.arrivals.len(), 1, "{l:?}");
        assert_eq!(l.arrivals[0].from, "1");
        assert!(matches!(d.connects[0].result, Reached::Yes { .. }), "{d:?}");
        // The listener is gone: a connection now is refused.
        let again = ReachAsk {
            within: Duration::from_millis(400),
            ..dial.clone()
        };
        assert_eq!(reach(&again).connects[0].result, Reached::Refused);
        // Another nonce is another rehearsal's: never taken for this one.
        let other = TcpListener::bind("127.0.0.1:0").unwrap();
        let other_at = other.local_addr().unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                let (mut c, _) = other.accept().unwrap();
                let mut b = [0u8; 64];
                let _ = c.read(&mut b);
                let _ = c.write_all(b"fdl-rehearse-ok n2\n");
            });
            let ask = ReachAsk {
                connect: vec![("0".into(), other_at)],
                within: Duration::from_millis(600),
                ..dial.clone()
            };
            assert_eq!(reach(&ask).connects[0].result, Reached::Other);
        });
    }
}
