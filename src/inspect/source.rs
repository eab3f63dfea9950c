//! The one place that decides how inspected bytes are reached.
//!
//! Libraries such as `libtorch_cuda.so` are 0.5–2 GB, and fdl must answer with a small,
//! fixed memory footprint. A [`Source`] is either a read-only memory map of a file or a
//! borrowed in-memory buffer (tests, fuzzing). Every read is bounds-checked
//! ([`Source::bytes`]); large regions are scanned window by window
//! ([`Source::find_iter`]) and each window's pages are handed back to the kernel
//! afterwards, because touched pages of a mapping count toward the process's RSS.

use anyhow::{bail, Context, Result};
use memchr::memmem;
use std::fs::File;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// How many bytes one scanning window covers. Small enough that a window's pages are a
/// fraction of the RSS budget, large enough that the per-window syscalls do not matter.
pub const WINDOW: u64 = 4 << 20;

enum Backing<'a> {
    /// A read-only shared mapping of a file, kept with the file it maps so the length can
    /// be re-checked (a file that shrinks under a mapping turns reads into SIGBUS).
    Mapped {
        map: memmap2::Mmap,
        file: File,
    },
    /// An empty file: nothing to map (mapping zero bytes is an error on Linux).
    Empty,
    Memory(&'a [u8]),
}

/// Bytes to inspect, with bounds-checked access and page release after large scans.
pub struct Source<'a> {
    backing: Backing<'a>,
    /// For messages: the file name, or `<memory>`.
    name: PathBuf,
}

impl std::fmt::Debug for Source<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Source({}, {} bytes)", self.name.display(), self.len())
    }
}

impl Source<'static> {
    /// Opens and maps `path` read-only.
    ///
    /// The file type is checked before opening and again on the opened descriptor: a FIFO
    /// or device must never be opened blocking or mapped, and a directory has no bytes.
    /// The open itself uses `O_NONBLOCK` so that a path swapped for a FIFO between the
    /// two checks still cannot hang us.
    pub fn open(path: &Path) -> Result<Source<'static>> {
        let meta = std::fs::metadata(path).with_context(|| {
            format!(
                "cannot inspect {}: the path cannot be read (check that it exists and that you may read it)",
                path.display()
            )
        })?;
        check_kind(path, &meta)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
            .open(path)
            .with_context(|| {
                format!(
                    "cannot open {} for reading: check its permissions",
                    path.display()
                )
            })?;
        let meta = file
            .metadata()
            .with_context(|| format!("cannot stat {}", path.display()))?;
        check_kind(path, &meta)?;
        if meta.len() == 0 {
            return Ok(Source {
                backing: Backing::Empty,
                name: path.to_path_buf(),
            });
        }
        if usize::try_from(meta.len()).is_err() {
            bail!(
                "{} is {} bytes, more than this platform can map",
                path.display(),
                meta.len()
            );
        }
        // SAFETY: the mapping is read-only and private to this process's reads. The one
        // hazard, the file shrinking underneath (SIGBUS on access past the new end), is
        // narrowed by `check_len` before every large access; see the module docs.
        let map = unsafe { memmap2::MmapOptions::new().map(&file) }.with_context(|| {
            format!(
                "cannot memory-map {}: the file system may not support mapping; copy the file to a local disk and retry",
                path.display()
            )
        })?;
        Ok(Source {
            backing: Backing::Mapped { map, file },
            name: path.to_path_buf(),
        })
    }
}

fn check_kind(path: &Path, meta: &std::fs::Metadata) -> Result<()> {
    let ft = meta.file_type();
    if ft.is_dir() {
        bail!(
            "{} is a directory: pass a shared library file such as libnccl.so.2 or libtorch_cuda.so",
            path.display()
        );
    }
    if ft.is_fifo() || ft.is_socket() || ft.is_char_device() || ft.is_block_device() {
        bail!(
            "{} is not a regular file (a pipe, socket or device): pass a shared library file",
            path.display()
        );
    }
    if !ft.is_file() {
        bail!("{} is not a regular file", path.display());
    }
    Ok(())
}

impl<'a> Source<'a> {
    /// Wraps bytes already in memory (fuzzing and tests).
    pub fn from_bytes(data: &'a [u8]) -> Source<'a> {
        Source {
            backing: Backing::Memory(data),
            name: PathBuf::from("<memory>"),
        }
    }

    pub fn name(&self) -> &Path {
        &self.name
    }

    /// The length as of opening.
    pub fn len(&self) -> u64 {
        self.all().len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn all(&self) -> &[u8] {
        match &self.backing {
            Backing::Mapped { map, .. } => map,
            Backing::Empty => &[],
            Backing::Memory(d) => d,
        }
    }

    /// Fails if the file is now shorter than when it was mapped; reading the vanished
    /// tail would kill the process with SIGBUS instead of giving an error.
    pub fn check_len(&self) -> Result<()> {
        if let Backing::Mapped { map, file } = &self.backing {
            let now = file
                .metadata()
                .with_context(|| format!("cannot stat {}", self.name.display()))?
                .len();
            if now < map.len() as u64 {
                bail!(
                    "{} shrank from {} to {} bytes while being inspected: wait until whatever is writing it has finished, then retry",
                    self.name.display(),
                    map.len(),
                    now
                );
            }
        }
        Ok(())
    }

    /// `len` bytes at `offset`, or an error naming what was out of range.
    pub fn bytes(&self, offset: u64, len: u64) -> Result<&[u8]> {
        let all = self.all();
        let end = offset.checked_add(len);
        match end {
            Some(end) if end <= all.len() as u64 => Ok(&all[offset as usize..end as usize]),
            _ => bail!(
                "{}: {} bytes at offset {} lie past the end of the file ({} bytes): the file is truncated or corrupt",
                self.name.display(),
                len,
                offset,
                all.len()
            ),
        }
    }

    /// Copies the bytes at `offset` into `buf`, clipped to the end of the data; returns how
    /// many were copied. For a mapped file this is a `pread`, which touches no page of the
    /// mapping: walking thousands of small headers spread over gigabytes that way costs a
    /// system call each instead of a page fault each, and leaves nothing resident.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let want = buf.len().min(self.len().saturating_sub(offset) as usize);
        match &self.backing {
            Backing::Mapped { file, .. } => {
                use std::os::unix::fs::FileExt;
                let mut done = 0;
                while done < want {
                    match file.read_at(&mut buf[done..want], offset + done as u64) {
                        Ok(0) => bail!(
                            "{} shrank while being inspected (nothing at offset {}): retry once nothing is writing it",
                            self.name.display(),
                            offset + done as u64
                        ),
                        Ok(n) => done += n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            return Err(e).with_context(|| format!("cannot read {}", self.name.display()))
                        }
                    }
                }
                Ok(want)
            }
            _ => {
                buf[..want].copy_from_slice(self.bytes_clipped(offset, want as u64));
                Ok(want)
            }
        }
    }

    /// Like [`Source::bytes`] but clipped to the end of the data instead of failing.
    pub fn bytes_clipped(&self, offset: u64, len: u64) -> &[u8] {
        let all = self.all();
        let start = offset.min(all.len() as u64) as usize;
        let end = offset.saturating_add(len).min(all.len() as u64) as usize;
        &all[start..end]
    }

    /// Hands the pages of `[offset, offset+len)` back to the kernel. Their content stays
    /// in the page cache and reappears unchanged if touched again, so borrowed slices stay
    /// valid; only this process's resident set shrinks.
    pub fn release(&self, offset: u64, len: u64) {
        if let Backing::Mapped { map, .. } = &self.backing {
            let total = map.len() as u64;
            if offset >= total || len == 0 {
                return;
            }
            let len = len.min(total - offset);
            // SAFETY: MADV_DONTNEED on a read-only shared file mapping drops the resident
            // pages; later reads fault the same file bytes back in. Errors only mean the
            // pages stay resident, which is harmless.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    offset as usize,
                    len as usize,
                )
            };
        }
    }

    /// Offsets (absolute) of every occurrence of `needle` in `[offset, offset+len)`,
    /// scanned in [`WINDOW`]-sized windows whose pages are released after each window.
    /// Windows overlap by `needle.len() - 1` bytes so a match straddling a boundary is
    /// found exactly once. `f` sees each match with the bytes from the match to at most
    /// `tail` bytes later (clipped to the region), and may stop the scan by returning false.
    pub fn find_iter(
        &self,
        offset: u64,
        len: u64,
        needle: &[u8],
        tail: usize,
        mut f: impl FnMut(u64, &[u8]) -> bool,
    ) -> Result<()> {
        if needle.is_empty() {
            return Ok(());
        }
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= self.len())
            .with_context(|| {
                format!(
                    "{}: region of {} bytes at {} lies past the end of the file",
                    self.name.display(),
                    len,
                    offset
                )
            })?;
        let finder = memmem::Finder::new(needle);
        let overlap = needle.len() as u64 - 1;
        let mut start = offset;
        while start < end {
            self.check_len()?;
            let win_end = start.saturating_add(WINDOW).min(end);
            // Extend the slice so that matches starting before `win_end` are complete.
            let scan_end = win_end.saturating_add(overlap).min(end);
            let window = self.bytes(start, scan_end - start)?;
            for at in finder.find_iter(window) {
                let abs = start + at as u64;
                if abs >= win_end {
                    break; // found again, whole, by the next window
                }
                let rest = self.bytes_clipped(abs, (needle.len() + tail) as u64);
                let rest = &rest[..rest.len().min((end - abs) as usize)];
                if !f(abs, rest) {
                    self.release(start, scan_end - start);
                    return Ok(());
                }
            }
            self.release(start, scan_end - start);
            start = win_end;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_checked_without_overflow() {
        let data = [1u8, 2, 3, 4];
        let s = Source::from_bytes(&data);
        assert_eq!(s.bytes(1, 2).unwrap(), &[2, 3]);
        assert!(s.bytes(3, 2).is_err());
        assert!(s.bytes(u64::MAX, 2).is_err());
        assert!(s.bytes(2, u64::MAX).is_err());
        assert_eq!(s.bytes_clipped(2, u64::MAX), &[3, 4]);
        assert!(s.bytes_clipped(9, 1).is_empty());
    }

    #[test]
    fn matches_straddling_windows_are_found_once() {
        let w = WINDOW as usize;
        // One match wholly before the boundary, one across it, one in the last window.
        for straddle in [w - 3, w - 1] {
            let mut data = vec![0u8; w * 2 + 10];
            for at in [0, straddle, w * 2 + 4] {
                data[at..at + 6].copy_from_slice(b"needle");
            }
            let s = Source::from_bytes(&data);
            let mut hits = Vec::new();
            s.find_iter(0, data.len() as u64, b"needle", 2, |at, rest| {
                assert!(rest.starts_with(b"needle"));
                hits.push(at);
                true
            })
            .unwrap();
            assert_eq!(hits, vec![0, straddle as u64, (w * 2 + 4) as u64]);
            // A sub-region starting at the match finds it too.
            let mut hits = Vec::new();
            s.find_iter(straddle as u64, 20, b"needle", 0, |at, _| {
                hits.push(at);
                true
            })
            .unwrap();
            assert_eq!(hits, vec![straddle as u64]);
        }
    }
}
