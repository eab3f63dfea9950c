//! The one place that decides how inspected bytes are reached.
//!
//! Libraries such as `libtorch_cuda.so` are 0.5–2 GB, and fdl must answer with a small,
//! fixed memory footprint. A [`Source`] is either a read-only memory map of a file or a
//! borrowed in-memory buffer (tests, fuzzing). Every read is bounds-checked
//! ([`Source::bytes`]); large regions are scanned window by window
//! ([`Source::find_iter`]) and each window's pages are handed back to the kernel
//! afterwards, because touched pages of a mapping count toward the process's RSS.
//!
//! A mapped file that shrinks while it is read (someone truncates or rewrites it) turns
//! a read past its new end into SIGBUS. Positional reads into owned buffers would avoid
//! that, but the ELF readers (`object`'s) and the scans work on borrowed slices of the
//! whole file, and copying gigabytes of `libtorch_cuda.so` would give up the fixed
//! memory footprint; so the mapping stays, and a SIGBUS handler makes the hazard an
//! error instead: a fault inside a live mapping of ours maps zero pages over the rest of
//! it and marks it damaged, the read goes on with zeros, and the damage is reported when
//! the read ends. [`Source::with_file`] is the only way to open a file, and it checks
//! after its reader has returned, whatever that returned: no answer read from a file that
//! changed underneath reaches a caller. Faults anywhere else go to the handler that was
//! there before (Rust's stack-overflow handler, or the default action). This is the only
//! mapping fdl makes of a file it did not create.

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
        /// Declared first: dropped (unregistered) before the mapping is unmapped.
        guard: guard::Guard,
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

/// The SIGBUS handler's view of the live mappings: where each starts and how long it
/// is, and whether a fault hit it (and where). A handler may only touch atomics, so this
/// is a fixed table; [`MAPPINGS`] live mappings at once is far more than fdl holds (one
/// per file being read, in each thread).
mod guard {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Mutex, Once};

    pub const MAPPINGS: usize = 64;

    struct Slot {
        start: AtomicUsize,
        len: AtomicUsize,
        faulted: AtomicBool,
        /// The first faulting offset in the mapping.
        at: AtomicUsize,
    }

    #[allow(clippy::declare_interior_mutable_const)]
    const EMPTY: Slot = Slot {
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        faulted: AtomicBool::new(false),
        at: AtomicUsize::new(0),
    };
    static SLOTS: [Slot; MAPPINGS] = [EMPTY; MAPPINGS];
    /// Serialises claiming and freeing slots (never taken by the handler).
    static CLAIM: Mutex<()> = Mutex::new(());
    static INSTALL: Once = Once::new();
    static PAGE: AtomicUsize = AtomicUsize::new(4096);
    /// The disposition before ours, written once before ours is installed.
    static mut PREVIOUS: Option<libc::sigaction> = None;

    /// A registered mapping; freed on drop (before the mapping is unmapped).
    pub struct Guard(usize);

    /// Registers `[start, start + len)`; `None` when every slot is taken.
    pub fn register(start: usize, len: usize) -> Option<Guard> {
        INSTALL.call_once(install);
        let _held = CLAIM.lock().unwrap_or_else(|e| e.into_inner());
        let i = SLOTS
            .iter()
            .position(|s| s.start.load(Ordering::Acquire) == 0)?;
        let s = &SLOTS[i];
        s.faulted.store(false, Ordering::Relaxed);
        s.len.store(len, Ordering::Relaxed);
        s.start.store(start, Ordering::Release);
        Some(Guard(i))
    }

    impl Guard {
        /// The offset of the first read that found no file behind it, if any did.
        pub fn fault(&self) -> Option<usize> {
            let s = &SLOTS[self.0];
            s.faulted
                .load(Ordering::Acquire)
                .then(|| s.at.load(Ordering::Relaxed))
        }
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            let _held = CLAIM.lock().unwrap_or_else(|e| e.into_inner());
            SLOTS[self.0].start.store(0, Ordering::Release);
        }
    }

    fn install() {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            PAGE.store(page as usize, Ordering::Relaxed);
        }
        // SAFETY: a zeroed sigaction is a valid value; the previous disposition is
        // stored before the handler that reads it can run, and never written again.
        unsafe {
            let mut ours: libc::sigaction = std::mem::zeroed();
            ours.sa_sigaction = on_sigbus as *const () as usize;
            ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut ours.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                return;
            }
            PREVIOUS = Some(old);
            libc::sigaction(libc::SIGBUS, &ours, std::ptr::null_mut());
        }
    }

    extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
        let addr = unsafe { (*info).si_addr() } as usize;
        let page = PAGE.load(Ordering::Relaxed);
        for s in &SLOTS {
            let start = s.start.load(Ordering::Acquire);
            let len = s.len.load(Ordering::Relaxed);
            if start == 0 || addr < start || addr - start >= len {
                continue;
            }
            // The file no longer has this page: zeros from here to the mapping's end
            // (a truncation takes the whole tail), so the read goes on and ends.
            let from = addr & !(page - 1);
            let end = (start + len).div_ceil(page) * page;
            // SAFETY: [from, end) lies within our own live mapping (registered until
            // it is unmapped); MAP_FIXED replaces those pages with anonymous zeros.
            let p = unsafe {
                libc::mmap(
                    from as *mut libc::c_void,
                    end - from,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                if !s.faulted.load(Ordering::Relaxed) {
                    s.at.store(addr - start, Ordering::Relaxed);
                }
                s.faulted.store(true, Ordering::Release);
                return;
            }
            break;
        }
        // Not ours (or not repairable): what was there before decides.
        // SAFETY: PREVIOUS was written before this handler was installed.
        let prev = unsafe { *std::ptr::addr_of!(PREVIOUS) };
        match prev {
            Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
                // SAFETY: calling the previous handler as it was registered.
                unsafe {
                    if p.sa_flags & libc::SA_SIGINFO != 0 {
                        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                            std::mem::transmute(p.sa_sigaction);
                        f(sig, info, ctx);
                    } else {
                        let f: extern "C" fn(libc::c_int) = std::mem::transmute(p.sa_sigaction);
                        f(sig);
                    }
                }
            }
            _ => {
                // The default action: restore it and return; the faulting access runs
                // again and the signal ends the process as it would have.
                // SAFETY: a zeroed sigaction with SIG_DFL is valid.
                unsafe {
                    let mut dfl: libc::sigaction = std::mem::zeroed();
                    dfl.sa_sigaction = libc::SIG_DFL;
                    libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
                }
            }
        }
    }
}

impl Source<'static> {
    /// Opens `path` (see [`Source::open`]), runs `read` on it, and then fails if the file
    /// shrank or a read found no file behind a page, whatever `read` returned: an answer
    /// read from a file that changed underneath never reaches the caller. The one way
    /// fdl opens a file to inspect.
    pub fn with_file<T>(path: &Path, read: impl FnOnce(&Source<'_>) -> Result<T>) -> Result<T> {
        let src = Source::open(path)?;
        let out = read(&src);
        src.check_len()?;
        out
    }

    /// Opens and maps `path` read-only.
    ///
    /// The file type is checked before opening and again on the opened descriptor: a FIFO
    /// or device must never be opened blocking or mapped, and a directory has no bytes.
    /// The open itself uses `O_NONBLOCK` so that a path swapped for a FIFO between the
    /// two checks still cannot hang us.
    fn open(path: &Path) -> Result<Source<'static>> {
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
        // caught by the guard registered below; see the module docs.
        let map = unsafe { memmap2::MmapOptions::new().map(&file) }.with_context(|| {
            format!(
                "cannot memory-map {}: the file system may not support mapping; copy the file to a local disk and retry",
                path.display()
            )
        })?;
        let guard = guard::register(map.as_ptr() as usize, map.len()).with_context(|| {
            format!(
                "cannot inspect {}: more than {} files are being read at once",
                path.display(),
                guard::MAPPINGS
            )
        })?;
        Ok(Source {
            backing: Backing::Mapped { guard, map, file },
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
    /// `(st_dev, st_ino)` of the file these bytes were read from, taken on the open
    /// descriptor (what a caller compares with another view of the same file, such as a
    /// process's `/proc/PID/maps`); `None` for bytes in memory or an empty file.
    pub fn file_id(&self) -> Option<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        match &self.backing {
            Backing::Mapped { file, .. } => file.metadata().ok().map(|m| (m.dev(), m.ino())),
            Backing::Empty | Backing::Memory(_) => None,
        }
    }

    /// The metadata of the file these bytes are read from, taken on the open descriptor
    /// now; `None` for bytes in memory or an empty file.
    pub fn metadata(&self) -> Option<std::fs::Metadata> {
        match &self.backing {
            Backing::Mapped { file, .. } => file.metadata().ok(),
            Backing::Empty | Backing::Memory(_) => None,
        }
    }

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
        if let Backing::Mapped { guard, .. } = &self.backing {
            if let Some(at) = guard.fault() {
                bail!(
                    "{} was truncated while being read (nothing behind offset {at} any more): wait until whatever is writing it has finished, then retry",
                    self.name.display()
                );
            }
        }
        if let Backing::Mapped { map, file, .. } = &self.backing {
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

    /// A file truncated under the mapping: the vanished pages read as zeros instead of
    /// killing the process with SIGBUS, and the read ends with an error that says so,
    /// whatever the reader returned.
    #[test]
    fn a_file_truncated_under_the_mapping_is_an_error_not_sigbus() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lib.so");
        let len = 16 * 4096;
        std::fs::write(&p, vec![0xa5u8; len]).unwrap();
        let e = Source::with_file(&p, |src| {
            let all = src.bytes(0, src.len())?;
            assert_eq!(all[len - 1], 0xa5);
            std::fs::OpenOptions::new()
                .write(true)
                .open(&p)
                .unwrap()
                .set_len(4096)
                .unwrap();
            // Pages past the new end: read without the length check a scan makes.
            // SAFETY: a volatile read of a byte inside a live borrowed slice.
            let far = unsafe { std::ptr::read_volatile(&all[len - 1]) };
            let mid = unsafe { std::ptr::read_volatile(&all[5 * 4096]) };
            assert_eq!((far, mid), (0, 0), "vanished pages read as zeros");
            assert_eq!(all[100], 0xa5, "pages still in the file keep their bytes");
            Ok("an answer from a changed file")
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("truncated while being read"), "{e}");
        // The slot is free again and a fresh read of the short file works.
        let n = Source::with_file(&p, |src| Ok(src.len())).unwrap();
        assert_eq!(n, 4096);
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
