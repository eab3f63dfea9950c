//! The one way fdl reads a small file it did not write in this run: a regular file,
//! checked on the open descriptor, opened non-blocking (a FIFO planted in its place cannot
//! hang fdl), and read up to a cap suited to what it is (a link to `/dev/zero` cannot
//! exhaust memory).

use anyhow::{bail, Context, Result};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The contents of the regular file at `path`, refused when larger than `cap` bytes.
pub fn read_regular(path: &Path, cap: u64) -> Result<Vec<u8>> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let meta = f
        .metadata()
        .with_context(|| format!("cannot stat {}", path.display()))?;
    if !meta.file_type().is_file() {
        bail!(
            "{} is not a regular file ({}); fdl reads only regular files there",
            path.display(),
            kind_of(&meta.file_type())
        );
    }
    let mut out = Vec::new();
    f.take(cap.saturating_add(1))
        .read_to_end(&mut out)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if out.len() as u64 > cap {
        bail!(
            "{} is larger than the {cap} bytes fdl reads from such a file: it is not what fdl expects there",
            path.display()
        );
    }
    Ok(out)
}

/// [`read_regular`] as UTF-8 text (invalid bytes replaced).
pub fn read_text(path: &Path, cap: u64) -> Result<String> {
    Ok(String::from_utf8_lossy(&read_regular(path, cap)?).into_owned())
}

fn kind_of(ft: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() || ft.is_block_device() {
        "a device"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "not a plain file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
