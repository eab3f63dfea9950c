//! The one way fdl reads a small file it did not write in this run: a regular file,
//! checked on the open descriptor, opened non-blocking (a FIFO planted in its place cannot
//! hang fdl), and read up to a cap suited to what it is (a link to `/dev/zero` cannot
//! exhaust memory). A link at the path is refused ([`read_regular`]); only a file the
//! user or the system names, read as its own program would read it (a Dockerfile given
//! on the command line, the cluster file, the loader's configuration, a Python install's
//! files), is read through one ([`read_regular_following`]).

use anyhow::{bail, Context, Result};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The contents of the regular file at `path`, refused when larger than `cap` bytes, or
/// when a link is at `path`.
pub fn read_regular(path: &Path, cap: u64) -> Result<Vec<u8>> {
    present(path, read_regular_if_present(path, cap)?)
}

/// [`read_regular`], with `None` where nothing is at `path` (an optional file).
pub fn read_regular_if_present(path: &Path, cap: u64) -> Result<Option<Vec<u8>>> {
    read_bounded(path, cap, true)
}

/// [`read_regular`] through a link at `path`: for a file that the user or the system
/// names, and that its own program reads through links (see the module's doc).
pub fn read_regular_following(path: &Path, cap: u64) -> Result<Vec<u8>> {
    present(path, read_bounded(path, cap, false)?)
}

/// [`read_regular_following`], with `None` where nothing is at `path`.
pub fn read_text_following_if_present(path: &Path, cap: u64) -> Result<Option<String>> {
    Ok(read_bounded(path, cap, false)?.map(|b| String::from_utf8_lossy(&b).into_owned()))
}

/// [`read_regular_following`] as UTF-8 text (invalid bytes replaced).
pub fn read_text_following(path: &Path, cap: u64) -> Result<String> {
    Ok(String::from_utf8_lossy(&read_regular_following(path, cap)?).into_owned())
}

fn present(path: &Path, read: Option<Vec<u8>>) -> Result<Vec<u8>> {
    read.ok_or_else(|| {
        anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::NotFound))
            .context(format!("cannot open {}: it does not exist", path.display()))
    })
}

fn read_bounded(path: &Path, cap: u64, no_follow: bool) -> Result<Option<Vec<u8>>> {
    let f = match open(path, no_follow) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(open_error(e, path, no_follow)),
    };
    let len = check_regular(&f, path)?.len();
    if len > cap {
        bail!(
            "{} is larger than the {cap} bytes fdl reads from such a file ({len} bytes): it is not what fdl expects there",
            path.display()
        );
    }
    let mut out = Vec::new();
    // Bounded again while reading: a file that grows after the check is still cut off.
    f.take(cap.saturating_add(1))
        .read_to_end(&mut out)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if out.len() as u64 > cap {
        bail!(
            "{} is larger than the {cap} bytes fdl reads from such a file: it is not what fdl expects there",
            path.display()
        );
    }
    Ok(Some(out))
}

/// [`read_regular_if_present`] as UTF-8 text (invalid bytes replaced).
pub fn read_text_if_present(path: &Path, cap: u64) -> Result<Option<String>> {
    Ok(read_regular_if_present(path, cap)?.map(|b| String::from_utf8_lossy(&b).into_owned()))
}

/// The regular file at `path`, open for a streamed read of any size (hashing a library
/// of hundreds of MiB): checked on the descriptor like [`read_regular`]. With
/// `no_follow`, a link at `path` itself is refused rather than followed (a walk that
/// saw a file there must not read whatever a link swapped in since points to).
pub fn open_regular(path: &Path, no_follow: bool) -> Result<std::fs::File> {
    let f = open(path, no_follow).map_err(|e| open_error(e, path, no_follow))?;
    check_regular(&f, path)?;
    Ok(f)
}

fn open(path: &Path, no_follow: bool) -> std::io::Result<std::fs::File> {
    // What is there is looked at first, so a device is never even opened (opening some
    // has effects); the descriptor is checked again after, as the entry may change.
    let pre = if no_follow {
        std::fs::symlink_metadata(path)?
    } else {
        std::fs::metadata(path)?
    };
    if !pre.file_type().is_file() && !pre.file_type().is_symlink() {
        return Err(std::io::Error::other(NotRegular(kind_of(&pre.file_type()))));
    }
    let mut flags = libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;
    if no_follow {
        flags |= libc::O_NOFOLLOW;
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)?;
    Ok(f)
}

/// What a pre-check found where a regular file was expected.
#[derive(Debug)]
struct NotRegular(&'static str);

impl std::fmt::Display for NotRegular {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for NotRegular {}

fn not_regular(path: &Path, kind: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{} is not a regular file ({kind}); fdl reads only regular files there",
        path.display()
    )
}

/// An error from [`open`], named for `path`.
fn open_error(e: std::io::Error, path: &Path, no_follow: bool) -> anyhow::Error {
    if let Some(k) = e.get_ref().and_then(|i| i.downcast_ref::<NotRegular>()) {
        return not_regular(path, k.0);
    }
    if no_follow && e.raw_os_error() == Some(libc::ELOOP) {
        return not_regular(path, "a link");
    }
    anyhow::Error::new(e).context(format!("cannot open {}", path.display()))
}

fn check_regular(f: &std::fs::File, path: &Path) -> Result<std::fs::Metadata> {
    let meta = f
        .metadata()
        .with_context(|| format!("cannot stat {}", path.display()))?;
    if !meta.file_type().is_file() {
        return Err(not_regular(path, kind_of(&meta.file_type())));
    }
    Ok(meta)
}

/// [`read_regular`] as UTF-8 text (invalid bytes replaced).
pub fn read_text(path: &Path, cap: u64) -> Result<String> {
    Ok(String::from_utf8_lossy(&read_regular(path, cap)?).into_owned())
}

pub fn kind_of(ft: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() || ft.is_block_device() {
        "a device"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_symlink() {
        "a link"
    } else {
        "not a plain file"
    }
}

/// Bytes of regular files below `dir`, not following links.
pub fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    // A directory that cannot be listed, or an entry that cannot be told, counts nothing.
    let _ = walk_tree(
        dir,
        &mut |e| {
            if e.kind.is_file() {
                total += std::fs::symlink_metadata(e.path).map_or(0, |m| m.len());
            }
            Ok(true)
        },
        &|_, _| Ok(()),
    );
    total
}

/// One entry met by [`walk_tree`].
pub struct TreeEntry<'a> {
    /// Where it is.
    pub path: &'a Path,
    /// Its path below the root, exactly.
    pub rel_path: &'a Path,
    /// The same, as text ('/' between names; a name that is not UTF-8 made lossy): the
    /// key fdl's records and digests name it by.
    pub rel: &'a str,
    /// Directly in the root.
    pub top: bool,
    /// The entry's own type: a link is a link, never what it points to.
    pub kind: std::fs::FileType,
}

/// Walks the tree under `root` depth first, each directory's entries in name order, and
/// never follows a link: `visit` sees every entry, a directory before what it holds, and
/// answers whether to go into a directory. A directory that cannot be listed, or an entry
/// whose type cannot be read, is handed to `unreadable` (with what failed: `list` or
/// `stat`), whose error ends the walk and whose `Ok` skips it. Iterative: a deep tree
/// costs memory, not stack.
pub fn walk_tree(
    root: &Path,
    visit: &mut dyn FnMut(&TreeEntry<'_>) -> Result<bool>,
    unreadable: &dyn Fn(&Path, Unreadable) -> Result<()>,
) -> Result<()> {
    struct Level {
        rel_path: std::path::PathBuf,
        rel: String,
        entries: std::vec::IntoIter<std::fs::DirEntry>,
    }
    let list = |dir: &Path| -> std::io::Result<Vec<std::fs::DirEntry>> {
        let mut entries = std::fs::read_dir(dir)?.collect::<std::io::Result<Vec<_>>>()?;
        entries.sort_by_key(|e| e.file_name());
        Ok(entries)
    };
    let mut stack = match list(root) {
        Ok(entries) => vec![Level {
            rel_path: std::path::PathBuf::new(),
            rel: String::new(),
            entries: entries.into_iter(),
        }],
        Err(e) => return unreadable(root, Unreadable::List(e)),
    };
    while let Some(level) = stack.last_mut() {
        let Some(e) = level.entries.next() else {
            stack.pop();
            continue;
        };
        let path = e.path();
        let name = e.file_name();
        let rel_path = level.rel_path.join(&name);
        let rel = if level.rel.is_empty() {
            name.to_string_lossy().into_owned()
        } else {
            format!("{}/{}", level.rel, name.to_string_lossy())
        };
        let top = stack.len() == 1;
        let kind = match e.file_type() {
            Ok(kind) => kind,
            Err(err) => {
                unreadable(&path, Unreadable::Stat(err))?;
                continue;
            }
        };
        let entry = TreeEntry {
            path: &path,
            rel_path: &rel_path,
            rel: &rel,
            top,
            kind,
        };
        if visit(&entry)? && kind.is_dir() {
            match list(&path) {
                Ok(entries) => stack.push(Level {
                    rel_path,
                    rel,
                    entries: entries.into_iter(),
                }),
                Err(err) => unreadable(&path, Unreadable::List(err))?,
            }
        }
    }
    Ok(())
}

/// What [`walk_tree`] could not read.
#[derive(Debug)]
pub enum Unreadable {
    /// A directory's entries.
    List(std::io::Error),
    /// An entry's type.
    Stat(std::io::Error),
}

impl Unreadable {
    /// The error, with `verb` ("read", "list") saying what a listing was to the caller:
    /// `cannot list DIR` / `cannot stat PATH`.
    pub fn error(self, path: &Path, verb: &str) -> anyhow::Error {
        match self {
            Unreadable::List(e) => {
                anyhow::Error::new(e).context(format!("cannot {verb} {}", path.display()))
            }
            Unreadable::Stat(e) => {
                anyhow::Error::new(e).context(format!("cannot stat {}", path.display()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_walk_goes_in_name_order_and_never_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(root.join("b/c")).unwrap();
        std::fs::create_dir_all(root.join("skip")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret"), "x").unwrap();
        std::fs::write(root.join("b/c/f"), "12345").unwrap();
        std::fs::write(root.join("a"), "1").unwrap();
        std::fs::write(root.join("skip/hidden"), "1").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("b/link")).unwrap();
        let mut seen = Vec::new();
        walk_tree(
            &root,
            &mut |e| {
                let kind = if e.kind.is_symlink() {
                    "link"
                } else if e.kind.is_dir() {
                    "dir"
                } else {
                    "file"
                };
                assert_eq!(e.rel_path, Path::new(e.rel));
                assert_eq!(e.top, !e.rel.contains('/'));
                seen.push(format!("{} {kind}", e.rel));
                Ok(e.rel != "skip")
            },
            &|p, why| Err(why.error(p, "list")),
        )
        .unwrap();
        assert_eq!(
            seen,
            [
                "a file",
                "b dir",
                "b/c dir",
                "b/c/f file",
                "b/link link",
                "skip dir"
            ]
        );
        // Through the link there are 1 more byte; dir_size does not count them.
        assert_eq!(dir_size(&root), 1 + 5 + 1);
        assert_eq!(dir_size(&dir.path().join("none")), 0);
        let e = walk_tree(&dir.path().join("none"), &mut |_| Ok(true), &|p, why| {
            Err(why.error(p, "list"))
        })
        .unwrap_err();
        assert!(format!("{e:#}").starts_with("cannot list "), "{e:#}");
        // The visitor's refusal ends the walk, with its error.
        let e = walk_tree(&root, &mut |_| bail!("no"), &|_, _| Ok(())).unwrap_err();
        assert_eq!(e.to_string(), "no");
    }

    #[test]
    fn fifos_devices_and_oversized_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_regular(&fifo, 10).unwrap_err().to_string();
        assert!(e.contains("a FIFO"), "{e}");
        let e = read_regular(Path::new("/dev/zero"), 10)
            .unwrap_err()
            .to_string();
        assert!(e.contains("a device"), "{e}");
        let big = dir.path().join("big");
        std::fs::write(&big, [b'x'; 11]).unwrap();
        assert!(read_regular(&big, 10)
            .unwrap_err()
            .to_string()
            .contains("larger than"));
        assert_eq!(read_regular(&big, 11).unwrap().len(), 11);
    }

    #[test]
    fn absent_is_none_and_a_link_is_refused_where_links_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read_regular_if_present(&dir.path().join("none"), 10)
            .unwrap()
            .is_none());
        let e = read_regular(&dir.path().join("none"), 10).unwrap_err();
        assert!(format!("{e:#}").contains("does not exist"), "{e:#}");
        let real = dir.path().join("real");
        std::fs::write(&real, "x").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(open_regular(&link, false).is_ok());
        let e = open_regular(&link, true).unwrap_err().to_string();
        assert!(e.contains("(a link)"), "{e}");
        let e = open_regular(dir.path(), false).unwrap_err().to_string();
        assert!(e.contains("(a directory)"), "{e}");
    }

    /// The small reads refuse a link at the path, as ARCHITECTURE.md says of every read
    /// of what fdl did not write; the `_following` ones are for what the user names.
    #[test]
    fn small_reads_refuse_a_link_unless_asked_to_follow_it() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::write(&real, "x").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        for e in [
            read_regular(&link, 10).unwrap_err(),
            read_text(&link, 10).unwrap_err(),
            read_regular_if_present(&link, 10).unwrap_err(),
            read_text_if_present(&link, 10).unwrap_err(),
        ] {
            assert!(e.to_string().contains("(a link)"), "{e}");
        }
        assert_eq!(read_regular(&real, 10).unwrap(), b"x");
        assert_eq!(read_regular_following(&link, 10).unwrap(), b"x");
        assert_eq!(read_text_following(&link, 10).unwrap(), "x");
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("none"), &dangling).unwrap();
        assert!(read_text_following_if_present(&dangling, 10)
            .unwrap()
            .is_none());
        assert!(read_text_if_present(&dangling, 10).is_err());
    }
}
