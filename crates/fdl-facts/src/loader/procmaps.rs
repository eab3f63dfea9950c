//! `/proc/PID/maps` and the load base of a mapped library: what both readers of a live
//! process share (`pywitness`, which reads its own child, and `running`, which reads any
//! process of this user).

use crate::inspect::interpose::NcclSlots;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    /// `(major, minor)`.
    pub dev: (u32, u32),
    pub inode: u64,
    /// The file, when the mapping has one (a path, not `[heap]` and the like). The
    /// kernel escapes a newline in it as `\012`; a deleted file ends ` (deleted)`.
    pub path: Option<PathBuf>,
}

impl Mapping {
    pub fn file_name_starts(&self, prefix: &str) -> bool {
        self.path
            .as_deref()
            .and_then(Path::file_name)
            .is_some_and(|n| n.as_bytes().starts_with(prefix.as_bytes()))
    }

    pub fn same_file(&self, o: &Mapping) -> bool {
        self.inode != 0 && self.dev == o.dev && self.inode == o.inode
    }
}

/// Reads `/proc/PID/maps` text; lines that do not parse are skipped. Never panics.
pub fn parse_maps(text: &[u8]) -> Vec<Mapping> {
    text.split(|&b| b == b'\n')
        .filter_map(parse_maps_line)
        .collect()
}

fn parse_maps_line(line: &[u8]) -> Option<Mapping> {
    // address perms offset dev inode [path]; the path may hold spaces.
    let mut rest = line;
    let mut field = || -> Option<&[u8]> {
        let start = rest.iter().position(|&b| b != b' ')?;
        let r = &rest[start..];
        let end = r.iter().position(|&b| b == b' ').unwrap_or(r.len());
        let f = &r[..end];
        rest = &r[end..];
        Some(f)
    };
    let hex = |b: &[u8]| u64::from_str_radix(std::str::from_utf8(b).ok()?, 16).ok();
    let range = field()?;
    let _perms = field()?;
    let offset = hex(field()?)?;
    let dev = field()?;
    let inode = std::str::from_utf8(field()?).ok()?.parse::<u64>().ok()?;
    let (s, e) = split_once(range, b'-')?;
    let (ma, mi) = split_once(dev, b':')?;
    let (start, end) = (hex(s)?, hex(e)?);
    if end < start {
        return None;
    }
    let dev = (u32::try_from(hex(ma)?).ok()?, u32::try_from(hex(mi)?).ok()?);
    let p = rest.iter().position(|&b| b != b' ').map(|i| &rest[i..]);
    let path = p
        .filter(|p| p.starts_with(b"/"))
        .map(|p| PathBuf::from(OsStr::from_bytes(p)));
    Some(Mapping {
        start,
        end,
        offset,
        dev,
        inode,
        path,
    })
}

fn split_once(b: &[u8], sep: u8) -> Option<(&[u8], &[u8])> {
    let i = b.iter().position(|&c| c == sep)?;
    Some((&b[..i], &b[i + 1..]))
}

/// Where a library is loaded: the mapping of its first `PT_LOAD`'s page, less
/// that segment's page address. The file read must be the one mapped (device and inode).
pub fn load_base(maps: &[Mapping], lib: &Mapping, slots: &NcclSlots) -> Result<u64, String> {
    let bad = |why: String| why;
    let shown = crate::text::shown(lib.path.as_deref().unwrap_or(Path::new("")));
    let Some((dev, ino)) = slots.file_id else {
        return Err(bad(format!("{shown} could not be identified when read")));
    };
    let read_dev = (libc::major(dev), libc::minor(dev));
    if (read_dev, ino) != (lib.dev, lib.inode) {
        return Err(bad(format!(
            "{shown} as read (device {:x}:{:x}, inode {ino}) is not the file the process maps (device {:x}:{:x}, inode {}): it was replaced, or the file system shows another view of it",
            read_dev.0, read_dev.1, lib.dev.0, lib.dev.1, lib.inode
        )));
    }
    let Some((off, vaddr)) = slots.first_load else {
        return Err(bad(format!("{shown} has no loadable segment")));
    };
    // SAFETY: sysconf has no preconditions.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as u64,
        _ => 4096,
    };
    let down = |x: u64| x & !(page - 1);
    let first = maps
        .iter()
        .filter(|m| m.same_file(lib) && m.offset == down(off))
        .map(|m| m.start)
        .min()
        .ok_or_else(|| bad(format!("no mapping of {shown} holds its first segment")))?;
    first
        .checked_sub(down(vaddr))
        .ok_or_else(|| bad(format!("{shown} is mapped below its own first address")))
}
