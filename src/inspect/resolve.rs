//! Finding a DT_NEEDED library the way glibc's loader would, without loading anything.
//!
//! Order (glibc `_dl_map_object`): a name containing `/` is used as is; otherwise the
//! requiring object's DT_RPATH (only when it has no DT_RUNPATH), `LD_LIBRARY_PATH`, its
//! DT_RUNPATH, the `/etc/ld.so.cache` entries, then the default directories. `$ORIGIN`
//! expands to the requiring library's directory. Like the loader, a candidate of the
//! wrong ELF class or machine is skipped and the search goes on. Everything outside the
//! file itself comes from [`LoaderEnv`], so tests can describe any environment.

use anyhow::Result;
use serde::Serialize;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Which loader rule found a library.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResolveRule {
    /// DT_NEEDED held a path (contains `/`).
    Path,
    Rpath,
    LdLibraryPath,
    Runpath,
    LdCache,
    DefaultDir,
}

impl std::fmt::Display for ResolveRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ResolveRule::Path => "path in DT_NEEDED",
            ResolveRule::Rpath => "DT_RPATH",
            ResolveRule::LdLibraryPath => "LD_LIBRARY_PATH",
            ResolveRule::Runpath => "DT_RUNPATH",
            ResolveRule::LdCache => "ld.so.cache",
            ResolveRule::DefaultDir => "default library directory",
        })
    }
}

/// The loader's view of the environment: everything resolution needs besides the file.
#[derive(Debug, Clone, Default)]
pub struct LoaderEnv {
    /// `LD_LIBRARY_PATH`, split; an empty element means the current directory, as in glibc.
    pub ld_library_path: Vec<PathBuf>,
    /// `ld.so.cache` entries usable by this machine, in cache order: soname → path.
    pub cache: Vec<(String, PathBuf)>,
    /// Trusted directories searched last.
    pub default_dirs: Vec<PathBuf>,
}

/// The loader's built-in directories. Debian's multiarch ones first (their ld.so.conf
/// puts them first), then the RHEL-style lib64 ones, then the plain ones.
pub const DEFAULT_DIRS: &[&str] = &[
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
];

impl LoaderEnv {
    /// An environment with no LD_LIBRARY_PATH and no cache, only the default directories.
    pub fn bare() -> Self {
        LoaderEnv {
            ld_library_path: Vec::new(),
            cache: Vec::new(),
            default_dirs: DEFAULT_DIRS.iter().map(PathBuf::from).collect(),
        }
    }

    /// This process's environment: `LD_LIBRARY_PATH` and `/etc/ld.so.cache`. A missing
    /// or unreadable cache is an empty one (containers often have none).
    pub fn from_process() -> Self {
        let mut env = LoaderEnv::bare();
        if let Some(v) = std::env::var_os("LD_LIBRARY_PATH") {
            env.ld_library_path = split_path_list(&v.to_string_lossy());
        }
        if let Ok(bytes) = std::fs::read("/etc/ld.so.cache") {
            env.cache = parse_ld_so_cache(&bytes);
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

/// `a::b` → `[a, ".", b]`: glibc reads empty elements of LD_LIBRARY_PATH as the cwd.
pub fn split_path_list(s: &str) -> Vec<PathBuf> {
    if s.is_empty() {
        return Vec::new();
    }
    s.split([':', ';'])
        .map(|p| PathBuf::from(if p.is_empty() { "." } else { p }))
        .collect()
}

/// What the requiring library contributes to the search.
#[derive(Debug, Clone)]
pub struct Requirer<'a> {
    pub path: &'a Path,
    pub is_64: bool,
    pub machine: u16,
    pub rpath: &'a [String],
    pub runpath: &'a [String],
}

/// A successful resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub path: PathBuf,
    pub via: ResolveRule,
}

/// Outcome of a search: the hit, or every path tried (for the error message).
#[derive(Debug, Clone)]
pub enum Resolution {
    Found(Resolved),
    NotFound { searched: Vec<PathBuf> },
}

/// Expands `$ORIGIN` / `${ORIGIN}` against `origin`. Other tokens (`$LIB`, `$PLATFORM`)
/// are left as they are, so such an entry simply matches nothing.
pub fn expand_origin(entry: &str, origin: &Path) -> PathBuf {
    let o = origin.to_string_lossy();
    PathBuf::from(entry.replace("${ORIGIN}", &o).replace("$ORIGIN", &o))
}

/// Resolves `needed` for `req` in `env`.
pub fn resolve(needed: &str, req: &Requirer<'_>, env: &LoaderEnv) -> Result<Resolution> {
    let mut searched = Vec::new();
    let try_path = |p: PathBuf, via: ResolveRule, searched: &mut Vec<PathBuf>| {
        let ok = acceptable(&p, req.is_64, req.machine);
        searched.push(p.clone());
        ok.then_some(Resolved { path: p, via })
    };
    if needed.contains('/') {
        let p = PathBuf::from(needed);
        return Ok(match try_path(p, ResolveRule::Path, &mut searched) {
            Some(r) => Resolution::Found(r),
            None => Resolution::NotFound { searched },
        });
    }
    // $ORIGIN is the directory the library lives in, with symlinked directories resolved;
    // a relative input path is made absolute first.
    let dir = req
        .path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let origin = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());

    let mut dirs: Vec<(PathBuf, ResolveRule)> = Vec::new();
    if req.runpath.is_empty() {
        dirs.extend(
            req.rpath
                .iter()
                .map(|e| (expand_origin(e, &origin), ResolveRule::Rpath)),
        );
    }
    dirs.extend(
        env.ld_library_path
            .iter()
            .map(|d| (d.clone(), ResolveRule::LdLibraryPath)),
    );
    dirs.extend(
        req.runpath
            .iter()
            .map(|e| (expand_origin(e, &origin), ResolveRule::Runpath)),
    );
    for (dir, via) in dirs {
        if let Some(r) = try_path(dir.join(needed), via, &mut searched) {
            return Ok(Resolution::Found(r));
        }
    }
    if let Some(p) = env.cache_lookup(needed) {
        if let Some(r) = try_path(p.to_path_buf(), ResolveRule::LdCache, &mut searched) {
            return Ok(Resolution::Found(r));
        }
    }
    for dir in &env.default_dirs {
        if let Some(r) = try_path(dir.join(needed), ResolveRule::DefaultDir, &mut searched) {
            return Ok(Resolution::Found(r));
        }
    }
    Ok(Resolution::NotFound { searched })
}

/// Whether the loader would take `p`: a regular file (after symlinks) that is ELF of the
/// requiring object's class and machine. Never opens anything but regular files, so a
/// FIFO planted on the search path cannot block us.
fn acceptable(p: &Path, is_64: bool, machine: u16) -> bool {
    let Ok(meta) = std::fs::metadata(p) else {
        return false;
    };
    if !meta.is_file() {
        return false;
    }
    let mut head = [0u8; 20];
    let Ok(mut f) = std::fs::File::open(p) else {
        return false;
    };
    if f.read_exact(&mut head).is_err() || !head.starts_with(b"\x7fELF") {
        return false;
    }
    let class_ok = head[4] == if is_64 { 2 } else { 1 };
    let m = if head[5] == 2 {
        u16::from_be_bytes([head[18], head[19]])
    } else {
        u16::from_le_bytes([head[18], head[19]])
    };
    class_ok && m == machine
}

/// Parses glibc's `ld.so.cache` (the "glibc-ld.so.cache1.1" format, alone or after the
/// old "ld.so-1.7.0" table). Keeps libc6 entries for this machine's arch without hwcaps
/// subdirectory markers, in file order (the loader takes the first match). Garbage gives
/// an empty list, never a panic.
pub fn parse_ld_so_cache(data: &[u8]) -> Vec<(String, PathBuf)> {
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
            return Vec::new();
        };
        let Some(end) = (n as usize).checked_mul(12).and_then(|x| x.checked_add(16)) else {
            return Vec::new();
        };
        base = (end + 3) & !3;
    }
    if data.get(base..base + NEW_MAGIC.len()) != Some(NEW_MAGIC) {
        return Vec::new();
    }
    let Some(nlibs) = u32_at(base + 20) else {
        return Vec::new();
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
        if !libc6 || !arch_ok || hwcap != 0 {
            continue;
        }
        if let (Some(k), Some(v)) = (string_at(key), string_at(value)) {
            out.push((k, PathBuf::from(v)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_forms_expand() {
        let o = Path::new("/x/torch/lib");
        assert_eq!(
            expand_origin("$ORIGIN/../../nvidia/nccl/lib", o),
            PathBuf::from("/x/torch/lib/../../nvidia/nccl/lib")
        );
        assert_eq!(expand_origin("${ORIGIN}", o), PathBuf::from("/x/torch/lib"));
        assert_eq!(expand_origin("$LIB/a", o), PathBuf::from("$LIB/a"));
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
