//! The loader's environment and its file checks: what glibc's `ld.so` would search and
//! whether it would take a file it finds.
//!
//! Everything outside the objects themselves is in [`LoaderEnv`], so a test can describe
//! any environment. The machine's own loader says where it searches: `ld.so --help` (glibc
//! 2.33 and later) lists the system directories, the `glibc-hwcaps` subdirectories it
//! tries in each search directory, and the legacy hwcaps subdirectories; nothing here is a
//! table of what some distribution does. A file is judged as glibc's `open_verify` judges
//! it: a missing or unreadable one, or an ELF file of another class or machine, is passed
//! over and the search goes on; a file that exists but is not a loadable ELF file stops
//! the search with an error, as it stops the loader.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The loader's view of the environment: everything resolution needs besides the files.
#[derive(Debug, Clone, Default)]
pub struct LoaderEnv {
    /// `LD_PRELOAD` as the process would see it (empty: unset).
    pub preload: String,
    /// The contents of `/etc/ld.so.preload` (empty: none).
    pub ld_so_preload: String,
    /// `LD_LIBRARY_PATH`, split; an empty element means the current directory, as in glibc.
    pub ld_library_path: Vec<PathBuf>,
    /// `ld.so.cache` entries usable by this machine, in cache order: soname → path.
    pub cache: Vec<(String, PathBuf)>,
    /// Names the cache also lists for a `glibc-hwcaps` subdirectory: the loader may prefer
    /// those entries, which this model does not rank.
    pub cache_hwcaps_names: Vec<String>,
    /// The system directories, searched last.
    pub default_dirs: Vec<PathBuf>,
    /// `glibc-hwcaps` subdirectories searched in every search directory, best first.
    pub hwcaps: Vec<String>,
    /// Legacy hwcaps subdirectory names the loader searches (glibc before 2.37); their
    /// combinations are not modelled, so a hit below one makes the answer unknown.
    pub legacy_hwcaps: Vec<String>,
    /// The working directory the process would start in (relative paths, empty elements).
    pub cwd: PathBuf,
    /// Where `default_dirs` and the hwcaps lists came from, for reports.
    pub system_dirs_from: String,
    /// What fdl's stand-in program needs after the library it is asked about, in order:
    /// a real `cc prog.c lib.so` program NEEDs the library, then `libc.so.6`
    /// ([`LoaderEnv::bare`] and those built on it). Empty in a closed environment.
    pub program_needs: Vec<String>,
    /// Libraries the process opens by path before the library asked about, in order (a
    /// Python process: what torch's `__init__.py` opens with ctypes). Not in the global
    /// scope; a DT_NEEDED name equal to one's soname is answered by it, where the
    /// closure reaches that name (`_dl_map_object` matches loaded objects by soname).
    pub opened: Vec<OpenedFirst>,
    /// The DT_RPATH of the program the stand-in stands for, with its `$ORIGIN` (a Python
    /// interpreter's, conda's `$ORIGIN/../lib`): searched for every name the process
    /// loads or dlopens, as a main program's DT_RPATH is. Empty: a program with none.
    pub program_rpath: Vec<String>,
    pub program_origin: Option<PathBuf>,
}

/// A library the process opened by path before the closure asked about
/// ([`LoaderEnv::opened`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenedFirst {
    /// As opened: relative paths are the working directory's.
    pub path: PathBuf,
    pub soname: Option<String>,
    /// Who opened it, for reports.
    pub by: String,
}

/// The system directories used when the loader cannot be asked: the common ones of
/// Debian-like (multiarch) and RHEL-like (lib64) systems. Reports say when these stand in.
pub const FALLBACK_DEFAULT_DIRS: &[&str] = &[
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
];

/// What the machine's `ld.so --help` says about its search (glibc 2.33+).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SystemSearch {
    pub default_dirs: Vec<PathBuf>,
    pub hwcaps: Vec<String>,
    pub legacy_hwcaps: Vec<String>,
}

/// Reads `ld.so --help`'s search section. `None` when it has no "system search path"
/// lines (an older glibc, or not glibc).
pub fn parse_ld_so_help(text: &str) -> Option<SystemSearch> {
    #[derive(PartialEq)]
    enum Part {
        Other,
        Dirs,
        Hwcaps,
        Legacy,
    }
    let mut part = Part::Other;
    let mut out = SystemSearch::default();
    for line in text.lines() {
        if !line.starts_with(' ') {
            part = if line.starts_with("Shared library search path") {
                Part::Dirs
            } else if line.starts_with("Subdirectories of glibc-hwcaps") {
                Part::Hwcaps
            } else if line.starts_with("Legacy HWCAP subdirectories") {
                Part::Legacy
            } else {
                Part::Other
            };
            continue;
        }
        let item = line.trim();
        let (name, note) = match item.split_once(" (") {
            Some((n, rest)) => (n, rest.trim_end_matches(')')),
            None => (item, ""),
        };
        let searched = note.split([';', ',']).any(|w| w.trim() == "searched");
        match part {
            Part::Dirs if note == "system search path" => out.default_dirs.push(name.into()),
            Part::Hwcaps if searched => out.hwcaps.push(name.to_string()),
            Part::Legacy if searched && !out.legacy_hwcaps.iter().any(|l| l == name) => {
                out.legacy_hwcaps.push(name.to_string())
            }
            _ => {}
        }
    }
    (!out.default_dirs.is_empty()).then_some(out)
}

/// This machine's loader's search facts: the interpreter that runs fdl itself is the one
/// that runs the training processes beside it. Its `--help` is kept in fdl's cache under
/// the interpreter's identity (path, inode, size, time), so the loader is started once
/// per glibc, not once per question (a start costs about 4 ms).
fn system_search() -> &'static Result<SystemSearch, String> {
    static FACTS: OnceLock<Result<SystemSearch, String>> = OnceLock::new();
    FACTS.get_or_init(|| {
        let interp = own_interpreter().ok_or("fdl's own program names no ELF interpreter")?;
        // Without a usable cache (one fdl refuses as not private), the loader is asked
        // each time: the answer must not depend on the cache.
        let text = match crate::cache::cache_dir() {
            Ok(cache) => cached_help(&interp, &cache)?,
            Err(_) => {
                let out = loader_help(&interp)
                    .map_err(|e| format!("{} --help: {e}", interp.display()))?;
                String::from_utf8_lossy(&out).into_owned()
            }
        };
        parse_ld_so_help(&text).ok_or_else(|| {
            format!(
                "{} --help lists no system search path (glibc older than 2.33?)",
                interp.display()
            )
        })
    })
}

/// `interp --help`, from fdl's cache when this very interpreter answered before.
fn cached_help(interp: &Path, cache: &Path) -> Result<String, String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(interp).map_err(|e| format!("{}: {e}", interp.display()))?;
    let key = crate::digest::sha256_hex(
        format!(
            "{}\0{}\0{}\0{}\0{}",
            interp.display(),
            meta.dev(),
            meta.ino(),
            meta.size(),
            meta.mtime()
        )
        .as_bytes(),
    );
    let dir = cache.join("ld.so");
    let file = dir.join(&key[..32]);
    if let Ok(text) = crate::fsread::read_text_following(&file, 1 << 20) {
        if crate::cache::own_dir(&dir).is_ok() {
            return Ok(text);
        }
    }
    let out = loader_help(interp).map_err(|e| format!("{} --help: {e}", interp.display()))?;
    let text = String::from_utf8_lossy(&out).into_owned();
    // Best effort: a cache that cannot be written only costs the next run a start.
    if crate::cache::own_dir(cache).is_ok() && crate::cache::own_dir(&dir).is_ok() {
        let tmp = dir.join(format!(".{}.{}", &key[..32], std::process::id()));
        if std::fs::write(&tmp, &out).is_ok() && std::fs::rename(&tmp, &file).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(text)
}

/// The loader's `--help` text, at most 1 MiB of it. The loader is the system's own and
/// prints and exits at once; the read is bounded all the same.
fn loader_help(interp: &Path) -> std::io::Result<Vec<u8>> {
    let mut child = std::process::Command::new(interp)
        .arg("--help")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let mut out = Vec::new();
    let read = child
        .stdout
        .take()
        .map(|o| o.take(1 << 20).read_to_end(&mut out));
    let _ = child.kill();
    let _ = child.wait();
    read.transpose()?;
    Ok(out)
}

/// PT_INTERP of the running program.
pub(super) fn own_interpreter() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    crate::inspect::Source::with_file(&exe, |src| {
        let info = crate::inspect::elf::parse(src)?;
        let seg = info
            .segments
            .iter()
            .find(|s| s.p_type == object::elf::PT_INTERP)
            .ok_or_else(|| anyhow::anyhow!("no PT_INTERP"))?;
        let bytes = src.bytes(seg.offset, seg.filesz)?;
        let end = memchr::memchr(0, bytes).unwrap_or(bytes.len());
        Ok(PathBuf::from(
            String::from_utf8_lossy(&bytes[..end]).into_owned(),
        ))
    })
    .ok()
}

/// Reads at most `cap` bytes of a regular file, never blocking on a FIFO or device.
fn read_small(path: &Path, cap: u64) -> Option<Vec<u8>> {
    crate::fsread::read_regular_following(path, cap).ok()
}

impl LoaderEnv {
    /// No preloads, no `LD_LIBRARY_PATH`, no cache: only the system directories.
    pub fn bare() -> Self {
        let mut env = LoaderEnv {
            cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
            program_needs: vec!["libc.so.6".to_string()],
            ..LoaderEnv::default()
        };
        match system_search() {
            Ok(s) => {
                env.default_dirs = s.default_dirs.clone();
                env.hwcaps = s.hwcaps.clone();
                env.legacy_hwcaps = s.legacy_hwcaps.clone();
                env.system_dirs_from = "ld.so --help".into();
            }
            Err(why) => {
                env.default_dirs = FALLBACK_DEFAULT_DIRS.iter().map(PathBuf::from).collect();
                env.system_dirs_from =
                    format!("a common list, since the loader could not be asked ({why})");
            }
        }
        env
    }

    /// What a library brings by itself in this process's environment: `LD_LIBRARY_PATH`
    /// and `/etc/ld.so.cache`, no preload (tag inference, `libtorch add`: the NCCL a
    /// libtorch bundles, whatever the caller's shell has preloaded).
    pub fn bundled() -> Self {
        let mut env = LoaderEnv::bare();
        if let Some(v) = std::env::var_os("LD_LIBRARY_PATH") {
            env.ld_library_path = split_path_list(&v.to_string_lossy());
        }
        if let Some(bytes) = read_small(Path::new("/etc/ld.so.cache"), 64 << 20) {
            let (cache, hw) = parse_ld_so_cache_all(&bytes);
            env.cache = cache;
            env.cache_hwcaps_names = hw;
        }
        env
    }

    /// This process's environment: [`LoaderEnv::bundled`] plus `LD_PRELOAD` and
    /// `/etc/ld.so.preload`. A missing or unreadable cache is an empty one.
    pub fn from_process() -> Self {
        let mut env = LoaderEnv::bundled();
        env.preload = std::env::var_os("LD_PRELOAD")
            .map(|v| v.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Some(bytes) = read_small(Path::new("/etc/ld.so.preload"), 1 << 20) {
            env.ld_so_preload = String::from_utf8_lossy(&bytes).into_owned();
        }
        env
    }

    pub fn cache_lookup(&self, soname: &str) -> Option<&Path> {
        self.cache
            .iter()
            .find(|(name, _)| name == soname)
            .map(|(_, p)| p.as_path())
    }
}

/// `a::b` → `[a, ".", b]`: glibc splits `LD_LIBRARY_PATH` at `:` and `;` and reads an
/// empty element as the working directory.
pub fn split_path_list(s: &str) -> Vec<PathBuf> {
    if s.is_empty() {
        return Vec::new();
    }
    s.split([':', ';'])
        .map(|p| PathBuf::from(if p.is_empty() { "." } else { p }))
        .collect()
}

pub use crate::inspect::ResolveRule;

/// The values of the dynamic string tokens `$LIB` and `$PLATFORM`: the loader's own
/// (`$LIB` is fixed when glibc is built, `$PLATFORM` is the kernel's `AT_PLATFORM`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenValues {
    pub lib: String,
    pub platform: String,
}

/// The length of the token `name` at the start of `input` (just after a `$`), braces
/// included, or 0: glibc's `is_dst`. Plain, the name must not run on into more
/// `[A-Za-z0-9_]`; in braces, the closing brace must follow it.
fn dst_len(input: &[u8], name: &[u8]) -> usize {
    let curly = input.first() == Some(&b'{');
    let body = if curly { &input[1..] } else { input };
    if !body.starts_with(name) {
        return 0;
    }
    let next = body.get(name.len()).copied();
    if curly && next != Some(b'}') {
        return 0;
    }
    if next.is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_') {
        return 0;
    }
    name.len() + if curly { 2 } else { 0 }
}

/// `input` with its dynamic string tokens replaced, as glibc's `_dl_dst_substitute`
/// replaces them (outside secure mode): only `$ORIGIN`, `$LIB` and `$PLATFORM`, plain
/// or in braces, are tokens; any other `$` is a literal character. `value` gives a
/// token's value (`"ORIGIN"`, `"LIB"`, `"PLATFORM"`); `Err(token)` when it has none
/// that fdl knows, and then the loader's result is not known either.
pub fn substitute(
    input: &str,
    value: &mut dyn FnMut(&str) -> Option<String>,
) -> Result<String, String> {
    let bytes = input.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'$' {
            out.push(bytes[i]);
            i += 1;
            continue;
        }
        let rest = &bytes[i + 1..];
        let found = ["ORIGIN", "PLATFORM", "LIB"]
            .into_iter()
            .find_map(|t| Some((t, dst_len(rest, t.as_bytes()))).filter(|(_, n)| *n > 0));
        match found {
            Some((token, len)) => {
                let v = value(token).ok_or_else(|| format!("${token}"))?;
                out.extend_from_slice(v.as_bytes());
                i += 1 + len;
            }
            None => {
                out.push(b'$');
                i += 1;
            }
        }
    }
    // Only whole UTF-8 sequences were copied or inserted.
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Whether `input` holds a dynamic string token (glibc's `_dl_dst_count` > 0).
pub fn has_token(input: &str) -> bool {
    substitute(input, &mut |_| None).is_err()
}

/// `entry` with its tokens replaced: `$ORIGIN` by `origin` (`None`: not known to fdl),
/// `$LIB` and `$PLATFORM` by this machine's loader's values ([`loader_tokens`], asked
/// only when the entry holds one). `Err` names the token whose value is not known.
pub fn expand(entry: &str, origin: Option<&Path>) -> Result<PathBuf, String> {
    substitute(entry, &mut |token| match token {
        "ORIGIN" => origin.map(|o| o.to_string_lossy().into_owned()),
        "LIB" => loader_tokens().as_ref().ok().map(|t| t.lib.clone()),
        "PLATFORM" => loader_tokens().as_ref().ok().map(|t| t.platform.clone()),
        _ => None,
    })
    .map(PathBuf::from)
}

/// `$LIB` and `$PLATFORM` as this machine's loader expands them: it is asked once, with
/// a search path made of the two tokens between markers, and its `LD_DEBUG=libs` report
/// of that search path says what it made of them.
pub fn loader_tokens() -> &'static Result<TokenValues, String> {
    static TOKENS: OnceLock<Result<TokenValues, String>> = OnceLock::new();
    TOKENS.get_or_init(|| {
        let interp = own_interpreter().ok_or("fdl's own program names no ELF interpreter")?;
        let exe = std::env::current_exe().map_err(|e| format!("fdl's own program: {e}"))?;
        let mut child = std::process::Command::new(&interp)
            .arg("--list")
            .arg(&exe)
            .env_clear()
            .env("LD_LIBRARY_PATH", TOKEN_PROBE)
            .env("LD_DEBUG", "libs")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("{} --list: {e}", interp.display()))?;
        let mut out = Vec::new();
        let read = child
            .stderr
            .take()
            .map(|o| o.take(1 << 20).read_to_end(&mut out));
        let _ = child.kill();
        let _ = child.wait();
        if let Some(Err(e)) = read {
            return Err(format!("{} --list: {e}", interp.display()));
        }
        parse_token_probe(&String::from_utf8_lossy(&out)).ok_or_else(|| {
            format!(
                "{} did not report the search path made of $LIB and $PLATFORM",
                interp.display()
            )
        })
    })
}

/// The search path [`loader_tokens`] gives the loader.
const TOKEN_PROBE: &str = "/fdl-token-probe@lib=$LIB@platform=$PLATFORM@end";

/// The values between the markers of [`TOKEN_PROBE`] in a `search path=` line.
fn parse_token_probe(text: &str) -> Option<TokenValues> {
    text.lines()
        .filter_map(|l| l.split_once("search path=").map(|(_, r)| r))
        .flat_map(|r| r.split(':'))
        .find_map(|dir| {
            let rest = dir.trim().strip_prefix("/fdl-token-probe@lib=")?;
            let (lib, rest) = rest.split_once("@platform=")?;
            let (platform, _) = rest.split_once("@end")?;
            (!lib.is_empty() && !platform.is_empty()).then(|| TokenValues {
                lib: lib.to_string(),
                platform: platform.to_string(),
            })
        })
}

/// The host the objects are loaded into: the class and machine every object must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Host {
    pub is_64: bool,
    pub machine: u16,
}

/// What the loader does with a file at a candidate path (glibc's `open_verify`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// Nothing there, or not readable: the search goes on.
    Absent,
    /// An ELF file of another class or machine: passed over, the search goes on.
    OtherKind(String),
    /// The loader takes it; its identity, to spot one file reached by two names.
    Take { dev: u64, ino: u64 },
    /// The loader stops here with this error (not ELF, too short, a directory, …).
    Fatal(String),
}

/// Judges the file at `p` as the loader would, reading at most its ELF header and never
/// opening anything but a regular file (a FIFO would hang the real loader; fdl says so).
pub fn probe(p: &Path, host: Host) -> Probe {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = match std::fs::metadata(p) {
        Ok(m) => m,
        Err(_) => return Probe::Absent,
    };
    let ft = meta.file_type();
    if ft.is_dir() {
        return Probe::Fatal("it is a directory (the loader fails: cannot read file data)".into());
    }
    if ft.is_fifo() || ft.is_char_device() || ft.is_block_device() || ft.is_socket() {
        return Probe::Fatal(
            "it is not a regular file (a FIFO, device or socket): the loader would block or fail on it".into(),
        );
    }
    let Ok(mut f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(p)
    else {
        return Probe::Absent;
    };
    // Checked again on the descriptor: the path may have been swapped since.
    match f.metadata() {
        Ok(m) if m.file_type().is_file() => {}
        _ => return Probe::Fatal("it is not a regular file".into()),
    }
    let mut head = [0u8; 64];
    let mut got = 0;
    while got < head.len() {
        match f.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(_) => return Probe::Fatal("cannot read file data".into()),
        }
    }
    // glibc reads the header first and calls anything shorter than the host's ELF header
    // "too short", whatever its class; only then does it look at the magic.
    let host_header = if host.is_64 { 64 } else { 52 };
    if got < host_header {
        return Probe::Fatal("file too short".into());
    }
    match check_header(&head, host) {
        Ok(()) => {}
        Err(HeaderError::OtherKind(why)) => return Probe::OtherKind(why),
        Err(HeaderError::Fatal(why)) => return Probe::Fatal(why.into()),
    }
    Probe::Take {
        dev: meta.dev(),
        ino: meta.ino(),
    }
}

/// Why `open_verify` refuses a header: passed over, or fatal (glibc's words).
#[derive(Debug, Clone, PartialEq, Eq)]
enum HeaderError {
    OtherKind(String),
    Fatal(&'static str),
}

/// glibc's `open_verify` on the first 64 bytes of a file at least as long as the host's
/// ELF header, test for test in its order. The identification must be the host's
/// (magic, class, byte order, `EV_CURRENT`, OS ABI SYSV or GNU, ABI version, zero
/// padding); where it is not, the first difference decides, and only another class is
/// passed over. Then `e_version`, the machine (another one is passed over), `e_type`
/// and `e_phentsize`. The ABI version is 0, or under glibc's `LIBC_ABI_MAX` for the GNU
/// OS ABI: 4 since glibc 2.28 (`UNIQUE`, `IFUNC`, `ABSOLUTE`), observed with 2.36.
fn check_header(head: &[u8; 64], host: Host) -> Result<(), HeaderError> {
    const LIBC_ABI_MAX: u8 = 4;
    let (osabi_sysv, osabi_gnu) = (0u8, 3u8);
    let class = if host.is_64 { 2 } else { 1 };
    let order = if cfg!(target_endian = "little") { 1 } else { 2 };
    let osabi = head[7];
    let abi_version_ok = head[8] == 0 || (osabi == osabi_gnu && head[8] < LIBC_ABI_MAX);
    let ident_ok = head.starts_with(b"\x7fELF")
        && head[4] == class
        && head[5] == order
        && head[6] == 1
        && (osabi == osabi_sysv || osabi == osabi_gnu)
        && abi_version_ok
        && head[9..16].iter().all(|&b| b == 0);
    if !ident_ok {
        return Err(if !head.starts_with(b"\x7fELF") {
            HeaderError::Fatal("invalid ELF header")
        } else if head[4] != class {
            // glibc names the class that is not the host's, whatever the byte says.
            HeaderError::OtherKind(format!(
                "wrong ELF class: ELFCLASS{}",
                if host.is_64 { 32 } else { 64 }
            ))
        } else if head[5] != order {
            HeaderError::Fatal(if order == 1 {
                "ELF file data encoding not little-endian"
            } else {
                "ELF file data encoding not big-endian"
            })
        } else if head[6] != 1 {
            HeaderError::Fatal("ELF file version ident does not match current one")
        } else if osabi != osabi_sysv && osabi != osabi_gnu {
            HeaderError::Fatal("ELF file OS ABI invalid")
        } else if !abi_version_ok {
            HeaderError::Fatal("ELF file ABI version invalid")
        } else {
            HeaderError::Fatal("nonzero padding in e_ident")
        });
    }
    let little = order == 1;
    let u16_at = |at: usize| {
        let b = [head[at], head[at + 1]];
        if little {
            u16::from_le_bytes(b)
        } else {
            u16::from_be_bytes(b)
        }
    };
    let e_version = {
        let b = [head[20], head[21], head[22], head[23]];
        if little {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        }
    };
    if e_version != 1 {
        return Err(HeaderError::Fatal(
            "ELF file version does not match current one",
        ));
    }
    let machine = u16_at(18);
    if machine != host.machine {
        return Err(HeaderError::OtherKind(format!(
            "ELF machine {machine}, not this host's {}",
            host.machine
        )));
    }
    let e_type = u16_at(16);
    if e_type != object::elf::ET_DYN && e_type != object::elf::ET_EXEC {
        return Err(HeaderError::Fatal("only ET_DYN and ET_EXEC can be loaded"));
    }
    let (phentsize, want) = if host.is_64 {
        (u16_at(54), 56)
    } else {
        (u16_at(42), 32)
    };
    if phentsize != want {
        return Err(HeaderError::Fatal(
            "ELF file's phentsize not the expected size",
        ));
    }
    Ok(())
}

use std::os::unix::fs::OpenOptionsExt;

/// [`parse_ld_so_cache_all`]'s plain entries.
pub fn parse_ld_so_cache(data: &[u8]) -> Vec<(String, PathBuf)> {
    parse_ld_so_cache_all(data).0
}

/// Parses glibc's `ld.so.cache` (the "glibc-ld.so.cache1.1" format, alone or after the
/// old "ld.so-1.7.0" table). Keeps libc6 entries for this machine's arch without hwcaps
/// subdirectory markers, in file order (the loader takes the first match), and the names
/// that also have hwcaps entries. Garbage gives empty lists, never a panic.
pub fn parse_ld_so_cache_all(data: &[u8]) -> (Vec<(String, PathBuf)>, Vec<String>) {
    const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
    const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
    };
    let mut base = 0usize;
    if data.starts_with(OLD_MAGIC) {
        // Old header: 12-byte magic, u32 count, 12-byte entries; the new table follows,
        // 4-byte aligned.
        let Some(n) = u32_at(12) else {
            return (Vec::new(), Vec::new());
        };
        let Some(end) = (n as usize).checked_mul(12).and_then(|x| x.checked_add(16)) else {
            return (Vec::new(), Vec::new());
        };
        base = (end + 3) & !3;
    }
    if data.get(base..base + NEW_MAGIC.len()) != Some(NEW_MAGIC) {
        return (Vec::new(), Vec::new());
    }
    let Some(nlibs) = u32_at(base + 20) else {
        return (Vec::new(), Vec::new());
    };
    let want_arch: Option<i32> = if cfg!(target_arch = "x86_64") {
        Some(0x0300)
    } else if cfg!(target_arch = "aarch64") {
        Some(0x0a00)
    } else {
        None
    };
    let string_at = |off: u32| -> Option<String> {
        let rest = data.get(base.checked_add(off as usize)?..)?;
        let end = memchr::memchr(0, rest)?;
        Some(String::from_utf8_lossy(&rest[..end]).into_owned())
    };
    let mut out = Vec::new();
    let mut hw_names = Vec::new();
    let entries = base + 48;
    for i in 0..nlibs as usize {
        let Some(at) = i.checked_mul(24).and_then(|x| x.checked_add(entries)) else {
            break;
        };
        let Some(e) = data.get(at..at + 24) else {
            break;
        };
        let flags = i32::from_le_bytes([e[0], e[1], e[2], e[3]]);
        let key = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
        let value = u32::from_le_bytes([e[8], e[9], e[10], e[11]]);
        let hwcap = u64::from_le_bytes([e[16], e[17], e[18], e[19], e[20], e[21], e[22], e[23]]);
        let libc6 = flags & 0xff == 0x03;
        let arch_ok = want_arch.is_none_or(|a| flags & 0xff00 == a);
        if !libc6 || !arch_ok {
            continue;
        }
        if hwcap != 0 {
            if let Some(k) = string_at(key) {
                hw_names.push(k);
            }
            continue;
        }
        if let (Some(k), Some(v)) = (string_at(key), string_at(value)) {
            out.push((k, PathBuf::from(v)));
        }
    }
    (out, hw_names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_forms_expand() {
        let o = Path::new("/x/torch/lib");
        assert_eq!(
            expand("$ORIGIN/../../nvidia/nccl/lib", Some(o)),
            Ok(PathBuf::from("/x/torch/lib/../../nvidia/nccl/lib"))
        );
        assert_eq!(
            expand("${ORIGIN}", Some(o)),
            Ok(PathBuf::from("/x/torch/lib"))
        );
        assert_eq!(
            expand("${ORIGIN}x", Some(o)),
            Ok(PathBuf::from("/x/torch/libx"))
        );
        assert_eq!(expand("$ORIGIN/a", None), Err("$ORIGIN".to_string()));
    }

    /// glibc's `is_dst`: only the three names are tokens, plain only when no identifier
    /// character follows, in braces only when closed; every other `$` is a character.
    #[test]
    fn only_glibc_tokens_are_tokens() {
        let mut none = |_: &str| -> Option<String> { None };
        for literal in [
            "/p/$(x)/lib",
            "/p/$ORIGIN_old/lib",
            "$ORIGINX",
            "$ORIGIN1",
            "${ORIGIN",
            "${ORIGINX}",
            "$x",
            "/a$",
            "$$",
            "${}",
            "$LIBRARY",
            "$PLATFORMS",
            "${lib}",
            "$origin",
        ] {
            assert_eq!(substitute(literal, &mut none), Ok(literal.to_string()));
            assert!(!has_token(literal), "{literal}");
        }
        let mut v = |t: &str| Some(format!("<{t}>"));
        for (input, want) in [
            ("$ORIGIN", "<ORIGIN>"),
            ("$ORIGIN/x", "<ORIGIN>/x"),
            ("${ORIGIN}_old", "<ORIGIN>_old"),
            ("$ORIGIN-x", "<ORIGIN>-x"),
            ("a$LIB.b", "a<LIB>.b"),
            ("${PLATFORM}", "<PLATFORM>"),
            ("$$ORIGIN", "$<ORIGIN>"),
            (
                "/p/$(x)/$ORIGIN_old/$ORIGIN",
                "/p/$(x)/$ORIGIN_old/<ORIGIN>",
            ),
        ] {
            assert_eq!(substitute(input, &mut v), Ok(want.to_string()), "{input}");
            assert!(has_token(input), "{input}");
        }
        // The origin's own `$` is copied as it is, never read as a token.
        assert_eq!(
            expand("$ORIGIN/../lib", Some(Path::new("/p/$ORIGIN_old/$(x)"))),
            Ok(PathBuf::from("/p/$ORIGIN_old/$(x)/../lib"))
        );
    }

    #[test]
    fn the_loader_says_what_lib_and_platform_are() {
        let text = "  1:\t search path=/fdl-token-probe@lib=lib/x86_64-linux-gnu@platform=x86_64@end/glibc-hwcaps/x86-64-v3:/fdl-token-probe@lib=lib/x86_64-linux-gnu@platform=x86_64@end\t\t(LD_LIBRARY_PATH)\n";
        assert_eq!(
            parse_token_probe(text),
            Some(TokenValues {
                lib: "lib/x86_64-linux-gnu".into(),
                platform: "x86_64".into()
            })
        );
        assert_eq!(parse_token_probe("search path=/lib:/usr/lib\n"), None);
        // This machine's loader answers, and its $LIB is a relative path.
        let t = loader_tokens()
            .as_ref()
            .expect("the loader reports $LIB and $PLATFORM");
        assert!(!t.lib.starts_with('/') && !t.lib.is_empty(), "{t:?}");
        assert!(!t.platform.is_empty(), "{t:?}");
    }

    /// Each of `open_verify`'s header tests on a patched header, in glibc's words, and
    /// which of them only pass the file over.
    #[test]
    fn header_checks_are_glibcs() {
        let host = Host {
            is_64: true,
            machine: object::elf::EM_X86_64,
        };
        let mut good = [0u8; 64];
        good[..8].copy_from_slice(b"\x7fELF\x02\x01\x01\x00");
        good[16] = 3; // ET_DYN
        good[18] = 62; // EM_X86_64
        good[20] = 1; // e_version
        good[54] = 56; // e_phentsize
        assert_eq!(check_header(&good, host), Ok(()));
        let patched = |at: usize, b: u8| {
            let mut h = good;
            h[at] = b;
            check_header(&h, host)
        };
        let fatal = |s| Err(HeaderError::Fatal(s));
        assert_eq!(patched(7, 3), Ok(()), "ELFOSABI_GNU");
        assert_eq!(patched(7, 1), fatal("ELF file OS ABI invalid"));
        assert_eq!(patched(7, 97), fatal("ELF file OS ABI invalid"));
        assert_eq!(patched(8, 1), fatal("ELF file ABI version invalid"));
        let mut gnu = good;
        gnu[7] = 3;
        for (v, ok) in [(1, true), (3, true), (4, false), (255, false)] {
            let mut h = gnu;
            h[8] = v;
            assert_eq!(check_header(&h, host).is_ok(), ok, "GNU ABI version {v}");
        }
        for at in 9..16 {
            assert_eq!(patched(at, 1), fatal("nonzero padding in e_ident"), "{at}");
        }
        assert_eq!(
            patched(20, 2),
            fatal("ELF file version does not match current one")
        );
        assert_eq!(
            patched(54, 57),
            fatal("ELF file's phentsize not the expected size")
        );
        assert_eq!(
            patched(16, 1),
            fatal("only ET_DYN and ET_EXEC can be loaded")
        );
        assert_eq!(
            patched(5, 2),
            fatal("ELF file data encoding not little-endian")
        );
        assert_eq!(
            patched(6, 0),
            fatal("ELF file version ident does not match current one")
        );
        assert_eq!(patched(0, 0), fatal("invalid ELF header"));
        for class in [0, 1, 3] {
            assert_eq!(
                patched(4, class),
                Err(HeaderError::OtherKind("wrong ELF class: ELFCLASS32".into()))
            );
        }
        // The class decides before the OS ABI; the OS ABI before the machine.
        let mut h = good;
        h[4] = 1;
        h[7] = 9;
        assert!(matches!(
            check_header(&h, host),
            Err(HeaderError::OtherKind(_))
        ));
        let mut h = good;
        h[18] = 183;
        assert!(matches!(
            check_header(&h, host),
            Err(HeaderError::OtherKind(_))
        ));
        h[7] = 9;
        assert_eq!(check_header(&h, host), fatal("ELF file OS ABI invalid"));
        h[7] = 0;
        h[20] = 0;
        assert_eq!(
            check_header(&h, host),
            fatal("ELF file version does not match current one")
        );
    }

    #[test]
    fn ld_library_path_empty_elements_are_cwd() {
        assert_eq!(
            split_path_list("/a::/b"),
            vec![PathBuf::from("/a"), PathBuf::from("."), PathBuf::from("/b")]
        );
        assert!(split_path_list("").is_empty());
    }

    #[test]
    fn cache_parser_survives_garbage_and_reads_the_real_one() {
        assert!(parse_ld_so_cache(b"").is_empty());
        assert!(parse_ld_so_cache(b"glibc-ld.so.cache1.1\xff\xff\xff\xff").is_empty());
        let mut old = b"ld.so-1.7.0\0\xff\xff\xff\xff".to_vec();
        old.extend_from_slice(&[0; 8]);
        assert!(parse_ld_so_cache(&old).is_empty());
        if let Ok(real) = std::fs::read("/etc/ld.so.cache") {
            let entries = parse_ld_so_cache(&real);
            if cfg!(target_arch = "x86_64") {
                assert!(
                    entries.iter().any(|(k, _)| k == "libc.so.6"),
                    "libc.so.6 missing from the parsed cache"
                );
            }
        }
    }
}

#[cfg(test)]
mod help_tests {
    use super::*;

    #[test]
    fn ld_so_help_is_read_for_dirs_and_hwcaps() {
        let text = "Usage: ld.so [OPTION]...\n\nShared library search path:\n  (libraries located via /etc/ld.so.cache)\n  /lib/x86_64-linux-gnu (system search path)\n  /usr/lib (system search path)\n\nSubdirectories of glibc-hwcaps directories, in priority order:\n  x86-64-v4\n  x86-64-v3 (supported, searched)\n  x86-64-v2 (supported, searched)\n\nLegacy HWCAP subdirectories under library search path directories:\n  x86_64 (AT_PLATFORM; supported, searched)\n  tls (supported, searched)\n  avx512_1\n  x86_64 (supported, searched)\n";
        let s = parse_ld_so_help(text).unwrap();
        assert_eq!(
            s.default_dirs,
            [
                PathBuf::from("/lib/x86_64-linux-gnu"),
                PathBuf::from("/usr/lib")
            ]
        );
        assert_eq!(s.hwcaps, ["x86-64-v3", "x86-64-v2"]);
        assert_eq!(s.legacy_hwcaps, ["x86_64", "tls"]);
        assert!(parse_ld_so_help("no such section\n").is_none());
    }

    /// The loader's answer is kept under its identity and read back; a cache fdl cannot
    /// keep private is not written, and the loader is still asked.
    #[test]
    fn the_loader_help_is_cached_under_its_identity() {
        let Some(interp) = own_interpreter() else {
            panic!("the test binary has no ELF interpreter");
        };
        let t = tempfile::tempdir().unwrap();
        let cache = t.path().join("fdl");
        let first = cached_help(&interp, &cache).unwrap();
        assert!(parse_ld_so_help(&first).is_some(), "{first}");
        let entries: Vec<_> = std::fs::read_dir(cache.join("ld.so")).unwrap().collect();
        assert_eq!(entries.len(), 1);
        let file = entries[0].as_ref().unwrap().path();
        std::fs::write(&file, "from the cache").unwrap();
        assert_eq!(cached_help(&interp, &cache).unwrap(), "from the cache");
        // Writable by others: neither read nor written, the loader answers.
        let open = t.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let again = cached_help(&interp, &open).unwrap();
        assert!(parse_ld_so_help(&again).is_some());
        assert!(!open.join("ld.so").exists());
    }

    #[test]
    fn this_machines_loader_is_asked() {
        // glibc 2.33+ (this project's machines): the loader itself lists its directories.
        let env = LoaderEnv::bare();
        assert_eq!(env.system_dirs_from, "ld.so --help", "{env:?}");
        assert!(!env.default_dirs.is_empty());
    }
}
