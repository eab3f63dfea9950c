//! Which GPU code a fatbin carries, read from container and entry *headers* only.
//!
//! Layout (reverse-engineered by the community and checked here against `cuobjdump`
//! 13.4 on NCCL 2.27.5): a section such as `.nv_fatbin` holds back-to-back containers.
//! Each container is a 16-byte header (magic `0xBA55ED50`, version `1`, header size,
//! size of the entries that follow) and then entries, each a header of at least 64 bytes
//! followed by its payload:
//!
//! | offset | field                                                          |
//! |--------|----------------------------------------------------------------|
//! | 0      | u16 kind: 1 = PTX, 2 = ELF cubin (SASS)                        |
//! | 4      | u32 entry header size (64, 80, 96, 112 seen)                   |
//! | 8      | u64 payload size (padded); the next entry follows the payload  |
//! | 16     | u32 compressed payload size                                    |
//! | 28     | u32 arch number (`sm_XY` → XY)                                 |
//! | 40     | u64 flags                                                      |
//! | 56     | u64 uncompressed size                                          |
//!
//! Flags seen: 0x1000/0x2000/0x8000 compressed (0x2000 is an LZ4 block, 0x8000 a zstd
//! frame), 0x10000 obfuscated (cuobjdump skips these), 0x100000 arch-specific (`a`),
//! 0x200000 family (`f`). `cuobjdump --list-ptx` names PTX by the header's arch and those
//! two flags. `--list-elf` names a cubin from *the cubin itself*: the SM number from the
//! ELF header's `e_flags`, the `a` from the cubin (CUDA 12 cubins set an `e_flags` bit;
//! CUDA 13 cubins no longer do, and mark it only in their `.nv.compat` section), and never
//! an `f` (a family cubin runs where a plain one of its arch runs, so it is listed plain).
//! This was established with cuobjdump 13.5 on nvcc 13.5 fatbins patched field by field:
//! changing the header's arch or `a` flag does not change cuobjdump's name; changing the
//! ELF does.
//!
//! What fdl reads: the SM number from the decoded ELF header of every cubin — stored
//! plain, the first bytes of an LZ4 block (a few hundred bytes of input), or the first
//! block of a zstd frame (CUDA 13; at most 128 KiB) — never a whole payload. The `a` is
//! the `e_flags` bit or the header's 0x100000 flag, which nvcc sets from the same
//! `.nv.compat` attribute: that section lies after the string and symbol tables, megabytes
//! into a large cubin, so reaching it would mean decompressing most of every payload.
//! Across all 5,915 cubins of the oracle libraries (NCCL 2.27.5 and 2.28.9, torch 2.8.0
//! and torch 2.15.0's CUDA 13.2 `libtorch_cuda.so`) this equals cuobjdump's listing; the
//! header's arch number is never trusted, since cuobjdump does not trust it either.

use super::source::Source;
use super::zstd_head;
use crate::arch::{Arch, GpuTarget, Variant};
use anyhow::Result;
use serde::Serialize;
use std::collections::BTreeMap;

pub const MAGIC: u32 = 0xBA55_ED50;
pub const CONTAINER_HEADER: u64 = 16;
pub const ENTRY_HEADER_MIN: u64 = 64;

pub const KIND_PTX: u16 = 1;
pub const KIND_ELF: u16 = 2;
/// nvcc 13.5's `--concat`: one header listing several PTX/cubin members that share one
/// (compressed) payload; see [`Collector::concat_entry`].
pub const KIND_CONCAT: u16 = 0x100;

pub const FLAG_64BIT: u64 = 0x1;
pub const FLAG_LINUX: u64 = 0x10;
pub const FLAG_COMPRESS_OLD: u64 = 0x1000;
pub const FLAG_COMPRESS_LZ4: u64 = 0x2000;
pub const FLAG_COMPRESS_ZSTD: u64 = 0x8000;
pub const FLAG_COMPRESSED_ANY: u64 = FLAG_COMPRESS_OLD | FLAG_COMPRESS_LZ4 | FLAG_COMPRESS_ZSTD;
pub const FLAG_OBFUSCATED: u64 = 0x1_0000;
pub const FLAG_ARCH_SPECIFIC: u64 = 0x10_0000;
pub const FLAG_FAMILY: u64 = 0x20_0000;

/// Cubin `e_flags` layouts. CUDA 12.8 moved to ELF ABI version 8 with the SM number in
/// bits 8..24 and the `a` flag at 0x8; before, the SM was the low byte and `a` was 0x800.
const EF_NEW_ABI_VERSION: u8 = 8;
const EF_NEW_ARCH_SPECIFIC: u32 = 0x8;
const EF_OLD_ARCH_SPECIFIC: u32 = 0x800;

/// At most this many warnings are kept; a hostile file could otherwise produce millions.
const MAX_WARNINGS: usize = 16;

/// One architecture and how many entries target it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CodeEntry {
    pub target: GpuTarget,
    pub count: usize,
}

/// The GPU code in a file: SASS per real architecture and PTX per virtual one, each
/// sorted by target and counted the way `cuobjdump --list-elf` / `--list-ptx` list them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GpuCode {
    pub sass: Vec<CodeEntry>,
    /// PTX, named in JSON by virtual architecture (`compute_120`), as text output is.
    #[serde(serialize_with = "ptx_entries")]
    pub ptx: Vec<CodeEntry>,
    /// Fatbin containers walked.
    pub containers: usize,
    /// Entries whose payload is compressed (counted in `sass`/`ptx` as usual).
    pub compressed: usize,
    /// Obfuscated entries: not listed by cuobjdump, so not in `sass`/`ptx` either.
    pub obfuscated: usize,
    /// Entries of other kinds (neither PTX nor cubin).
    pub other: usize,
    /// What could not be read, when the fatbin is damaged.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

fn ptx_entries<S: serde::Serializer>(entries: &[CodeEntry], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    #[derive(Serialize)]
    struct Ptx {
        target: String,
        count: usize,
    }
    let mut seq = s.serialize_seq(Some(entries.len()))?;
    for e in entries {
        seq.serialize_element(&Ptx {
            target: e.target.ptx_name(),
            count: e.count,
        })?;
    }
    seq.end()
}

impl GpuCode {
    pub fn is_empty(&self) -> bool {
        self.sass.is_empty() && self.ptx.is_empty()
    }

    pub fn sass_total(&self) -> usize {
        self.sass.iter().map(|e| e.count).sum()
    }

    pub fn ptx_total(&self) -> usize {
        self.ptx.iter().map(|e| e.count).sum()
    }
}

/// Accumulates entries over one or more regions, then yields a sorted [`GpuCode`].
#[derive(Default)]
pub struct Collector {
    sass: BTreeMap<GpuTarget, usize>,
    ptx: BTreeMap<GpuTarget, usize>,
    code: GpuCode,
    /// zstd-compressed cubins, named once the walk is done: decoding a zstd block is the
    /// one costly step here (~0.1 ms each), so they are decoded on several threads.
    zstd_cubins: Vec<ZstdCubin>,
    /// Cubins whose ELF header could not be decoded, named from their fatbin header.
    undecoded: usize,
    /// Entry kinds other than PTX, cubin and concatenated ones.
    unknown_kinds: std::collections::BTreeSet<u16>,
    /// Also decode every zstd cubin with libzstd and count disagreements (tests).
    pub(crate) cross_check: bool,
    /// Every zstd cubin decoded by libzstd, the front decoder skipped (the benchmark's
    /// baseline).
    pub(crate) libzstd_only: bool,
    pub(crate) zstd: ZstdStats,
}

/// The fields fdl reads from a fatbin entry's header (at least 64 bytes, little-endian).
struct EntryHeader {
    kind: u16,
    header_size: u64,
    payload_size: u64,
    compressed_size: u64,
    arch_number: u32,
    flags: u64,
}

impl EntryHeader {
    fn parse(h: &[u8]) -> EntryHeader {
        EntryHeader {
            kind: le16(h, 0),
            header_size: u64::from(le32(h, 4)),
            payload_size: le64(h, 8),
            compressed_size: u64::from(le32(h, 16)),
            arch_number: le32(h, 28),
            flags: le64(h, 40),
        }
    }

    /// The payload's length as stored in the file (compressed, when it is).
    fn stored(&self) -> u64 {
        self.compressed_size.min(self.payload_size)
    }
}

/// How the zstd cubins' first bytes were decoded.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZstdStats {
    /// From the front of the block ([`zstd_head`]).
    pub head: usize,
    /// By libzstd, where the front decoder bowed out.
    pub libzstd: usize,
    /// With `cross_check`: cubins whose two decodes differ.
    pub mismatches: usize,
}

impl std::ops::AddAssign for ZstdStats {
    fn add_assign(&mut self, other: ZstdStats) {
        self.head += other.head;
        self.libzstd += other.libzstd;
        self.mismatches += other.mismatches;
    }
}

/// A cubin whose ELF header is inside a zstd frame.
struct ZstdCubin {
    payload: u64,
    /// The frame's stored length.
    stored: u64,
    /// Bytes to read: through the end of the first block when its header was at hand.
    len: u64,
    /// The fatbin header's arch number and flags.
    arch_number: u32,
    flags: u64,
}

impl Collector {
    fn warn(&mut self, msg: String) {
        if self.code.warnings.len() < MAX_WARNINGS {
            self.code.warnings.push(msg);
        } else if self.code.warnings.len() == MAX_WARNINGS {
            self.code
                .warnings
                .push("further fatbin problems not shown".to_string());
        }
    }

    pub fn finish(mut self) -> GpuCode {
        if !self.unknown_kinds.is_empty() {
            let kinds: Vec<String> = self
                .unknown_kinds
                .iter()
                .map(|k| format!("{k:#x}"))
                .collect();
            self.warn(format!(
                "{} fatbin entries are of kinds fdl does not know ({}): a newer toolkit wrote them, and the GPU code they carry is not listed",
                self.code.other,
                kinds.join(", ")
            ));
        }
        if self.undecoded > 0 {
            self.warn(format!(
                "{} cubin(s) could not be decoded and are named from their fatbin header, which cuobjdump does not trust",
                self.undecoded
            ));
        }
        let list = |m: BTreeMap<GpuTarget, usize>| {
            m.into_iter()
                .map(|(target, count)| CodeEntry { target, count })
                .collect()
        };
        self.code.sass = list(self.sass);
        self.code.ptx = list(self.ptx);
        self.code
    }

    /// Walks the fatbin containers in `[offset, offset+len)` of `src`.
    pub fn walk(&mut self, src: &Source<'_>, offset: u64, len: u64, what: &str) -> Result<()> {
        let Some(end) = offset.checked_add(len).filter(|&e| e <= src.len()) else {
            self.warn(format!(
                "{what}: {len} bytes at offset {offset} lie past the end of the file; fatbin not read"
            ));
            return Ok(());
        };
        let mut p = offset;
        let mut head_buf = [0u8; CONTAINER_HEADER as usize];
        while end - p >= CONTAINER_HEADER {
            src.read_at(p, &mut head_buf)?;
            let head = &head_buf[..];
            if le32(head, 0) != MAGIC {
                // Containers may be padded apart; anything else is skipped up to the next
                // magic so one damaged container does not hide the rest.
                match next_magic(src, p + 1, end)? {
                    Some(next) => {
                        if !is_padding(src, p, next - p) {
                            self.warn(format!(
                                "{what}: {} bytes at offset {p:#x} are not a fatbin container; skipped",
                                next - p
                            ));
                        }
                        p = next;
                        continue;
                    }
                    None => {
                        if !is_padding(src, p, end - p) {
                            self.warn(format!(
                                "{what}: {} trailing bytes at offset {p:#x} are not a fatbin container",
                                end - p
                            ));
                        }
                        break;
                    }
                }
            }
            let header_size = u64::from(le16(head, 6));
            let fat_size = le64(head, 8);
            self.code.containers += 1;
            let body = p.checked_add(header_size.max(CONTAINER_HEADER));
            let body_end = body.and_then(|b| b.checked_add(fat_size));
            let (body, body_end) = match (body, body_end) {
                (Some(b), Some(e)) if e <= end => (b, e),
                (Some(b), _) if b <= end => {
                    self.warn(format!(
                        "{what}: the container at offset {p:#x} claims {fat_size} bytes but only {} remain; reading what is there",
                        end - b
                    ));
                    (b, end)
                }
                _ => {
                    self.warn(format!(
                        "{what}: the container at offset {p:#x} has a header running past the section"
                    ));
                    break;
                }
            };
            self.walk_entries(src, body, body_end, what)?;
            // Always advance: an empty container (fat_size 0) still moves past its header.
            p = body_end.max(p + CONTAINER_HEADER);
        }
        self.name_zstd_cubins(src);
        Ok(())
    }

    /// Names the zstd-compressed cubins found by the walk, splitting them over up to
    /// four threads (each with its own decoder).
    fn name_zstd_cubins(&mut self, src: &Source<'_>) {
        let mut jobs = std::mem::take(&mut self.zstd_cubins);
        if jobs.is_empty() {
            return;
        }
        // Largest first: the threads finish together, and each decoder sizes its buffers
        // once instead of growing them entry by entry.
        jobs.sort_by_key(|j| std::cmp::Reverse(j.len));
        // Fewer than 8 per thread is not worth a thread.
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, 4)
            .min(jobs.len().div_ceil(8).max(1));
        // Frames differ in cost (one small block, or a full 128 KiB first block), so the
        // threads take the next cubin from a shared counter rather than fixed halves.
        let next = std::sync::atomic::AtomicUsize::new(0);
        let cross_check = self.cross_check;
        let libzstd_only = self.libzstd_only;
        let name = || -> (Vec<Result<GpuTarget, GpuTarget>>, ZstdStats) {
            let mut zstd = ZstdPrefix::default();
            let mut stats = ZstdStats::default();
            let mut named = Vec::new();
            while let Some(j) = jobs.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
                let mut head = [0u8; 64];
                // The first bytes from the front of the block, in microseconds; libzstd's
                // whole-block decode only where that decoder bows out.
                let read = |off: u64, len: usize| -> Option<Vec<u8>> {
                    let end = off.checked_add(len as u64).filter(|&e| e <= j.stored)?;
                    let mut buf = vec![0u8; len];
                    let got = src.read_at(j.payload + off, &mut buf).ok()?;
                    (got as u64 == end - off).then_some(buf)
                };
                let front = if libzstd_only {
                    None
                } else {
                    zstd_head::decode_prefix(&read, j.stored, &mut head)
                };
                let got = match front {
                    Some(n) if n >= 52 => {
                        stats.head += 1;
                        if cross_check {
                            let mut other = [0u8; 64];
                            let m = zstd.decode(src, j.payload, j.len, &mut other);
                            if m.is_none_or(|m| other[..m.min(n)] != head[..m.min(n)]) {
                                stats.mismatches += 1;
                            }
                        }
                        Some(n)
                    }
                    _ => {
                        stats.libzstd += 1;
                        zstd.decode(src, j.payload, j.len, &mut head)
                    }
                };
                let elf = match got {
                    Some(n) if n >= 52 => cubin_target_from_elf_header(&head),
                    _ => None,
                };
                named.push(sass_target(elf, j.arch_number, j.flags));
            }
            (named, stats)
        };
        let mut stats = ZstdStats::default();
        let targets: Vec<Result<GpuTarget, GpuTarget>> = std::thread::scope(|scope| {
            let others: Vec<_> = (1..threads).map(|_| scope.spawn(name)).collect();
            let mut all = Vec::new();
            let mut add = |(t, s): (Vec<_>, ZstdStats)| {
                all.extend(t);
                stats += s;
            };
            add(name());
            for h in others {
                // A decoder that panicked leaves its entries out; the count then shows it.
                match h.join() {
                    Ok(t) => add(t),
                    Err(_) => self.warn("a zstd-compressed cubin could not be read".into()),
                }
            }
            all
        });
        self.zstd += stats;
        for t in targets {
            self.count_sass(t);
        }
    }

    /// One cubin, named from its ELF header or (`Err`) from the fatbin header alone.
    fn count_sass(&mut self, named: Result<GpuTarget, GpuTarget>) {
        self.undecoded += usize::from(named.is_err());
        *self.sass.entry(named.unwrap_or_else(|f| f)).or_default() += 1;
    }

    fn walk_entries(&mut self, src: &Source<'_>, start: u64, end: u64, what: &str) -> Result<()> {
        let mut q = start;
        // One read takes the entry header and the start of its payload, where a cubin's
        // ELF header (or the LZ4 block that holds it) is: one system call per entry.
        let mut block = [0u8; 512];
        while end - q >= ENTRY_HEADER_MIN {
            let got = src.read_at(q, &mut block[..(end - q).min(512) as usize])?;
            let block = &block[..got];
            let e = EntryHeader::parse(block);
            let EntryHeader {
                header_size,
                payload_size,
                flags,
                ..
            } = e;
            if header_size < ENTRY_HEADER_MIN {
                self.warn(format!(
                    "{what}: entry at offset {q:#x} has a {header_size}-byte header (at least 64 expected); rest of container skipped"
                ));
                return Ok(());
            }
            let payload = q.checked_add(header_size).filter(|&x| x <= end);
            let next = payload.and_then(|x| x.checked_add(payload_size).filter(|&n| n <= end));
            let (Some(payload), Some(next)) = (payload, next) else {
                self.warn(format!(
                    "{what}: entry at offset {q:#x} runs past the end of its container; it is not counted"
                ));
                return Ok(());
            };
            if flags & FLAG_COMPRESSED_ANY != 0 {
                self.code.compressed += 1;
            }
            if flags & FLAG_OBFUSCATED != 0 {
                self.code.obfuscated += 1;
            } else {
                match e.kind {
                    KIND_ELF => {
                        let stored = e.stored();
                        let prefix = block.get(header_size as usize..).unwrap_or(&[]);
                        if flags & FLAG_COMPRESSED_ANY == FLAG_COMPRESS_ZSTD {
                            let prefix = &prefix[..prefix.len().min(stored as usize)];
                            let len = zstd_first_block_end(prefix)
                                .unwrap_or(ZstdPrefix::FIRST_BLOCK_MAX)
                                .min(stored);
                            self.zstd_cubins.push(ZstdCubin {
                                payload,
                                stored,
                                len,
                                arch_number: e.arch_number,
                                flags,
                            });
                        } else {
                            let elf =
                                cubin_target(src, payload, payload_size, stored, flags, prefix);
                            self.count_sass(sass_target(elf, e.arch_number, e.flags));
                        }
                    }
                    KIND_PTX => {
                        *self
                            .ptx
                            .entry(header_target(e.arch_number, flags))
                            .or_default() += 1;
                    }
                    KIND_CONCAT => self.concat_entry(src, q, &e, payload, what)?,
                    kind => {
                        self.code.other += 1;
                        self.unknown_kinds.insert(kind);
                    }
                }
            }
            q = next;
        }
        Ok(())
    }

    /// A `--concat` entry (nvcc 13.5): after the usual 64 header bytes, a u32 member
    /// count and a u32 byte count of the rest of the header, then one header per member.
    /// A member header has the usual layout (kind, arch, flags) except that offset 4
    /// holds where the member starts in the decoded payload and offset 8 its size; it is
    /// 64 bytes, or longer when it carries the `.nv.compat` attributes (an offset/length
    /// pair at 64 pointing inside it), as 80–120-byte entry headers do. All members share
    /// the entry's payload, so a cubin's ELF header is found by decoding the payload up
    /// to its offset; members are checked to follow each other in the payload.
    fn concat_entry(
        &mut self,
        src: &Source<'_>,
        at: u64,
        entry: &EntryHeader,
        payload: u64,
        what: &str,
    ) -> Result<()> {
        let (header_size, flags) = (entry.header_size, entry.flags);
        let bad = |why: &str| {
            format!("{what}: the concatenated entry at offset {at:#x} {why}; its members are not counted")
        };
        let Some(header) = src
            .bytes(at, header_size)
            .ok()
            .filter(|_| header_size <= 1 << 20)
        else {
            self.warn(bad("has a header that cannot be read"));
            return Ok(());
        };
        let count = le32(header, 64) as usize;
        let mut members = Vec::new();
        let mut p = 72usize;
        let mut expect_offset = 0u64;
        while members.len() < count {
            let Some(m) = header.get(p..p + 64) else {
                self.warn(bad("lists more members than its header holds"));
                return Ok(());
            };
            let (kind, offset, size) = (le16(m, 0), u64::from(le32(m, 4)), le64(m, 8));
            if offset != expect_offset {
                self.warn(bad(
                    "has members that do not follow each other in its payload",
                ));
                return Ok(());
            }
            expect_offset = offset.saturating_add(size);
            members.push((kind, offset, le32(m, 28), le64(m, 40)));
            // An attribute block at 64: it ends the member, padded to 8 bytes past a
            // terminating byte, as the 104/112/120-byte entry headers are.
            let ext_at = le32(header, p + 64) as usize;
            let ext_len = le32(header, p + 68) as usize;
            p += if members.len() < count && ext_at == 72 && ext_len < 4096 {
                (ext_at + ext_len + 1).div_ceil(8) * 8
            } else if members.len() == count {
                0
            } else {
                64
            };
        }
        let elf_offsets: Vec<u64> = members
            .iter()
            .filter(|m| m.0 == KIND_ELF)
            .map(|m| m.1)
            .collect();
        let heads = concat_heads(src, payload, entry.stored(), flags, &elf_offsets);
        let mut heads = heads.into_iter();
        for (kind, _, arch, member_flags) in members {
            if flags & FLAG_COMPRESSED_ANY != 0 {
                self.code.compressed += 1;
            }
            match kind {
                KIND_ELF => {
                    let elf = heads
                        .next()
                        .flatten()
                        .and_then(|h| cubin_target_from_elf_header(&h));
                    self.count_sass(sass_target(elf, arch, member_flags));
                }
                KIND_PTX => {
                    *self
                        .ptx
                        .entry(header_target(arch, member_flags))
                        .or_default() += 1
                }
                other => {
                    self.code.other += 1;
                    self.unknown_kinds.insert(other);
                }
            }
        }
        Ok(())
    }
}

/// The 64-byte ELF headers at `offsets` (ascending) of the payload of a concatenated
/// entry, decoding it as far as the last one and no further.
fn concat_heads(
    src: &Source<'_>,
    payload: u64,
    stored: u64,
    flags: u64,
    offsets: &[u64],
) -> Vec<Option<[u8; 64]>> {
    let mut heads = vec![None; offsets.len()];
    let Some(&last) = offsets.last() else {
        return heads;
    };
    let reader = SourceReader {
        src,
        pos: payload,
        end: payload + stored,
    };
    let mut input: Box<dyn std::io::Read> = match flags & FLAG_COMPRESSED_ANY {
        0 => Box::new(reader),
        FLAG_COMPRESS_ZSTD => match zstd::stream::read::Decoder::new(reader) {
            Ok(d) => Box::new(d),
            Err(_) => return heads,
        },
        // LZ4 and the old scheme: no concatenated entry seen with them.
        _ => return heads,
    };
    let mut pos = 0u64;
    let mut buf = vec![0u8; 64 << 10];
    let mut pending: Vec<(usize, [u8; 64], usize)> = Vec::new();
    let mut next = 0usize;
    while pos < last + 64 {
        let n = match input.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        // Headers starting in this chunk, and those begun in an earlier one.
        while next < offsets.len() && offsets[next] < pos + n as u64 {
            pending.push((next, [0u8; 64], 0));
            next += 1;
        }
        pending.retain_mut(|(i, h, filled)| {
            let start = offsets[*i] + *filled as u64;
            let from = start.saturating_sub(pos) as usize;
            let take = (64 - *filled).min(n.saturating_sub(from));
            h[*filled..*filled + take].copy_from_slice(&chunk[from..from + take]);
            *filled += take;
            if *filled == 64 {
                heads[*i] = Some(*h);
                false
            } else {
                true
            }
        });
        pos += n as u64;
    }
    heads
}

/// Reads `[pos, end)` of a [`Source`] as a stream.
struct SourceReader<'s, 'a> {
    src: &'s Source<'a>,
    pos: u64,
    end: u64,
}

impl std::io::Read for SourceReader<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (self.end - self.pos).min(buf.len() as u64) as usize;
        let got = self
            .src
            .read_at(self.pos, &mut buf[..n])
            .map_err(std::io::Error::other)?;
        self.pos += got as u64;
        Ok(got)
    }
}

/// A cubin's name as cuobjdump lists it (see the module docs): the SM number from its ELF
/// header, `a` from that header or the fatbin header's flag, never `f`. `Err` carries the
/// fatbin header's name for a cubin whose ELF header could not be decoded.
fn sass_target(
    elf: Option<GpuTarget>,
    arch_number: u32,
    flags: u64,
) -> Result<GpuTarget, GpuTarget> {
    let specific = flags & FLAG_ARCH_SPECIFIC != 0;
    let variant = |elf_specific: bool| {
        if elf_specific || specific {
            Variant::Specific
        } else {
            Variant::Generic
        }
    };
    match elf {
        Some(t) => Ok(GpuTarget {
            arch: t.arch,
            variant: variant(t.variant == Variant::Specific),
        }),
        None => Err(GpuTarget {
            arch: Arch::from_number(arch_number),
            variant: variant(false),
        }),
    }
}

/// The target a PTX header names: arch number plus the `a`/`f` flags.
fn header_target(arch_number: u32, flags: u64) -> GpuTarget {
    let variant = if flags & FLAG_ARCH_SPECIFIC != 0 {
        Variant::Specific
    } else if flags & FLAG_FAMILY != 0 {
        Variant::Family
    } else {
        Variant::Generic
    };
    GpuTarget {
        arch: Arch::from_number(arch_number),
        variant,
    }
}

/// The target a cubin's own ELF header names, as cuobjdump reports it; `None` when the
/// header cannot be read (unknown compression, damaged data). zstd frames are named
/// apart, by [`Collector::name_zstd_cubins`].
fn cubin_target(
    src: &Source<'_>,
    payload: u64,
    payload_size: u64,
    stored: u64,
    flags: u64,
    prefetched: &[u8],
) -> Option<GpuTarget> {
    let mut head = [0u8; 64];
    let compression = flags & FLAG_COMPRESSED_ANY;
    if compression == 0 {
        let n = payload_size.min(64) as usize;
        if n < 52 {
            return None;
        }
        match prefetched.get(..n) {
            Some(bytes) => head[..n].copy_from_slice(bytes),
            None if src.read_at(payload, &mut head[..n]).ok()? == n => {}
            None => return None,
        }
    } else if compression == FLAG_COMPRESS_LZ4 {
        // A 64-byte ELF header rarely needs more than the few hundred bytes of LZ4 input
        // already read with the entry header; one page is the most ever read.
        let have = &prefetched[..prefetched.len().min(stored as usize)];
        if lz4_prefix(have, &mut head) < 52 {
            if stored <= have.len() as u64 {
                return None;
            }
            let mut input = [0u8; 4096];
            let n = src
                .read_at(payload, &mut input[..stored.min(4096) as usize])
                .ok()?;
            if lz4_prefix(&input[..n], &mut head) < 52 {
                return None;
            }
        }
    } else {
        return None;
    }
    cubin_target_from_elf_header(&head)
}

/// Decodes the first bytes of zstd frames, CUDA 13's fatbin compression, with one
/// decoder context reused across entries. LZ4 blocks can be decoded a sequence at a
/// time ([`lz4_prefix`]); a zstd block only whole, so the first block (at most 128 KiB
/// either way) is read and decoded — still never the whole payload.
#[derive(Default)]
struct ZstdPrefix {
    decoder: Option<zstd::stream::raw::Decoder<'static>>,
    input: Vec<u8>,
}

impl ZstdPrefix {
    /// Frame header (at most 18 bytes), block header (3) and the largest block (128 KiB).
    const FIRST_BLOCK_MAX: u64 = 18 + 3 + (128 << 10);

    /// Fills `out` with the first decoded bytes of the frame whose first `len` bytes are
    /// at `payload`; returns how many it got (fewer on damaged data), `None` if the
    /// decoder cannot be set up or the bytes cannot be read.
    fn decode(
        &mut self,
        src: &Source<'_>,
        payload: u64,
        len: u64,
        out: &mut [u8],
    ) -> Option<usize> {
        use zstd::stream::raw::{Decoder, InBuffer, Operation, OutBuffer};
        let want = len.min(Self::FIRST_BLOCK_MAX) as usize;
        self.input.resize(want, 0);
        let got = src.read_at(payload, &mut self.input[..want]).ok()?;
        let decoder = match &mut self.decoder {
            Some(d) => {
                // Clears whatever state (or error) the previous entry left.
                d.reinit().ok()?;
                d
            }
            None => self.decoder.insert(Decoder::new().ok()?),
        };
        let mut input = InBuffer::around(&self.input[..got]);
        let mut output = OutBuffer::around(out);
        while output.pos() < output.capacity() {
            let before = (input.pos(), output.pos());
            // An error (damaged frame, window over libzstd's limit) keeps what was
            // decoded so far; the caller falls back to the fatbin header.
            if decoder.run(&mut input, &mut output).is_err()
                || (input.pos(), output.pos()) == before
            {
                break;
            }
        }
        Some(output.pos())
    }
}

/// Where the first block of the zstd frame starting with `head` ends, from the frame
/// and block headers (RFC 8878 §3.1.1); `None` if `head` is too short or not a frame.
fn zstd_first_block_end(head: &[u8]) -> Option<u64> {
    if head.get(..4)? != [0x28, 0xb5, 0x2f, 0xfd] {
        return None;
    }
    let fhd = *head.get(4)?;
    let single_segment = fhd & 0x20 != 0;
    let window = u64::from(!single_segment);
    let dict_id = [0, 1, 2, 4][usize::from(fhd & 3)];
    let content_size = match fhd >> 6 {
        0 => u64::from(single_segment),
        1 => 2,
        2 => 4,
        _ => 8,
    };
    let block = 5 + window + dict_id + content_size;
    let b = head.get(block as usize..block as usize + 3)?;
    let bh = u32::from(b[0]) | u32::from(b[1]) << 8 | u32::from(b[2]) << 16;
    // An RLE block stores one byte however long it decodes.
    let body = if (bh >> 1) & 3 == 1 {
        1
    } else {
        u64::from(bh >> 3)
    };
    Some(block + 3 + body)
}

/// Reads the SM number and `a` flag out of a cubin ELF header's `e_flags`.
pub fn cubin_target_from_elf_header(h: &[u8; 64]) -> Option<GpuTarget> {
    if !h.starts_with(b"\x7fELF") || h[5] != 1 {
        return None; // not ELF, or not little-endian (cubins always are)
    }
    let e_flags = match h[4] {
        2 => le32(h, 48),
        1 => le32(h, 36),
        _ => return None,
    };
    let (sm, specific) = if h[8] >= EF_NEW_ABI_VERSION {
        ((e_flags >> 8) & 0xffff, e_flags & EF_NEW_ARCH_SPECIFIC != 0)
    } else {
        (e_flags & 0xff, e_flags & EF_OLD_ARCH_SPECIFIC != 0)
    };
    if sm == 0 {
        return None;
    }
    Some(GpuTarget {
        arch: Arch::from_number(sm),
        variant: if specific {
            Variant::Specific
        } else {
            Variant::Generic
        },
    })
}

/// Decodes the start of an LZ4 block into `out` until it is full; returns the number of
/// bytes produced (less than `out.len()` if the input ends or is malformed). Every step
/// is bounds-checked and each loop consumes input, so hostile input ends quickly.
pub fn lz4_prefix(input: &[u8], out: &mut [u8]) -> usize {
    let mut i = 0usize;
    let mut o = 0usize;
    let read_len = |i: &mut usize, mut n: usize| -> Option<usize> {
        if n == 15 {
            loop {
                let b = *input.get(*i)?;
                *i += 1;
                n = n.checked_add(b as usize)?;
                if b != 255 {
                    break;
                }
            }
        }
        Some(n)
    };
    while o < out.len() {
        let Some(&token) = input.get(i) else { break };
        i += 1;
        let Some(lit) = read_len(&mut i, (token >> 4) as usize) else {
            break;
        };
        let avail = input.len().saturating_sub(i).min(lit);
        let take = avail.min(out.len() - o);
        out[o..o + take].copy_from_slice(&input[i..i + take]);
        o += take;
        if take < lit || o == out.len() {
            break;
        }
        i += lit;
        let (Some(&lo), Some(&hi)) = (input.get(i), input.get(i + 1)) else {
            break;
        };
        i += 2;
        let offset = usize::from(lo) | usize::from(hi) << 8;
        let Some(m) = read_len(&mut i, (token & 15) as usize) else {
            break;
        };
        if offset == 0 || offset > o {
            break; // malformed: reference before the start
        }
        let m = (m + 4).min(out.len() - o);
        for _ in 0..m {
            out[o] = out[o - offset];
            o += 1;
        }
    }
    o
}

/// Whether a gap between containers looks like alignment padding: short and all zero.
fn is_padding(src: &Source<'_>, at: u64, len: u64) -> bool {
    len < 16 && src.bytes_clipped(at, len).iter().all(|&b| b == 0)
}

/// The next container magic at or after `from` (8-byte steps would miss unaligned
/// containers in hand-made files, so every offset is searched).
fn next_magic(src: &Source<'_>, from: u64, end: u64) -> Result<Option<u64>> {
    if from >= end {
        return Ok(None);
    }
    let mut found = None;
    src.find_iter(from, end - from, &MAGIC.to_le_bytes(), 0, |at, _| {
        found = Some(at);
        false
    })?;
    Ok(found)
}

fn le16(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
        .unwrap_or(0)
}

fn le32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .unwrap_or(0)
}

fn le64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .map(|s| {
            let mut a = [0u8; 8];
            a.copy_from_slice(s);
            u64::from_le_bytes(a)
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lz4_prefix_decodes_literals_and_matches() {
        // "abcabcabcX": literals "abc", match offset 3 len 6, then literal "X".
        let block = [0x32, b'a', b'b', b'c', 3, 0, 0x10, b'X'];
        let mut out = [0u8; 10];
        assert_eq!(lz4_prefix(&block, &mut out), 10);
        assert_eq!(&out, b"abcabcabcX");
        let mut short = [0u8; 4];
        assert_eq!(lz4_prefix(&block, &mut short), 4);
        // Hostile: reference before start, truncated lengths.
        let mut out = [0u8; 8];
        assert_eq!(lz4_prefix(&[0x10, b'a', 9, 0], &mut out), 1);
        assert_eq!(lz4_prefix(&[0xf0, 255, 255], &mut out), 0);
        assert_eq!(lz4_prefix(&[], &mut out), 0);
    }

    #[test]
    fn cubin_e_flags_both_layouts() {
        let mut h = [0u8; 64];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = 2;
        h[5] = 1;
        h[7] = 0x41;
        h[8] = 8;
        h[48..52].copy_from_slice(&0x0600_640au32.to_le_bytes());
        assert_eq!(
            cubin_target_from_elf_header(&h).unwrap().to_string(),
            "sm_100a"
        );
        h[7] = 0x33;
        h[8] = 7;
        h[48..52].copy_from_slice(&0x005a_055au32.to_le_bytes());
        assert_eq!(
            cubin_target_from_elf_header(&h).unwrap().to_string(),
            "sm_90"
        );
        h[48..52].copy_from_slice(&0x005a_0d5au32.to_le_bytes());
        assert_eq!(
            cubin_target_from_elf_header(&h).unwrap().to_string(),
            "sm_90a"
        );
    }

    /// A container of SASS entries: (header flags, header arch, stored payload).
    fn container(entries: &[(u64, u32, Vec<u8>)]) -> Vec<u8> {
        let mut body = Vec::new();
        for (flags, arch, payload) in entries {
            let padded = payload.len().div_ceil(8) * 8;
            let mut h = [0u8; 64];
            h[0..2].copy_from_slice(&KIND_ELF.to_le_bytes());
            h[4..8].copy_from_slice(&64u32.to_le_bytes());
            h[8..16].copy_from_slice(&(padded as u64).to_le_bytes());
            h[16..20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
            h[28..32].copy_from_slice(&arch.to_le_bytes());
            h[40..48].copy_from_slice(&flags.to_le_bytes());
            body.extend_from_slice(&h);
            body.extend_from_slice(payload);
            body.resize(body.len() + padded - payload.len(), 0);
        }
        let mut c = Vec::new();
        c.extend_from_slice(&MAGIC.to_le_bytes());
        c.extend_from_slice(&1u16.to_le_bytes());
        c.extend_from_slice(&16u16.to_le_bytes());
        c.extend_from_slice(&(body.len() as u64).to_le_bytes());
        c.extend_from_slice(&body);
        c
    }

    /// A cubin of `len` bytes: a new-layout ELF header naming `e_flags`, then bytes
    /// that compress into several zstd blocks.
    fn cubin(e_flags: u32, len: usize) -> Vec<u8> {
        let mut c = vec![0u8; len];
        c[..4].copy_from_slice(b"\x7fELF");
        c[4] = 2;
        c[5] = 1;
        c[7] = 0x41;
        c[8] = 8;
        c[48..52].copy_from_slice(&e_flags.to_le_bytes());
        let mut x = 0x9e37_79b9u32;
        for b in &mut c[64..] {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *b = (x % 7) as u8; // compressible, but not to nothing
        }
        c
    }

    fn walk(data: &[u8]) -> GpuCode {
        let mut col = Collector::default();
        col.walk(&Source::from_bytes(data), 0, data.len() as u64, "test")
            .unwrap();
        col.finish()
    }

    /// CUDA 13 fatbins compress with zstd, and their headers may say `f` where the cubin
    /// (and cuobjdump) says plain, or plain where it says `a`: every entry is named from
    /// its decoded ELF header, also when the frame spans many blocks and the entries are
    /// spread over threads.
    #[test]
    fn zstd_cubins_are_named_from_their_elf_header() {
        let zstd = FLAG_COMPRESS_ZSTD | FLAG_64BIT | FLAG_LINUX;
        let mut entries = Vec::new();
        for k in 0..20 {
            let len = if k % 2 == 0 { 400_000 } else { 3000 };
            let frame = zstd::bulk::compress(&cubin(0x0600_6402, len), 3).unwrap();
            entries.push((zstd | FLAG_FAMILY, 100, frame));
        }
        let a = zstd::bulk::compress(&cubin(0x0600_5a0a, 300_000), 3).unwrap();
        entries.push((zstd | FLAG_ARCH_SPECIFIC, 90, a));
        // CUDA 13 `a` cubins: the ELF header reads plain, the fatbin header flags `a`.
        // The arch number is the ELF's even where the header says otherwise.
        let a = zstd::bulk::compress(&cubin(0x0600_6402, 200_000), 3).unwrap();
        entries.push((zstd | FLAG_ARCH_SPECIFIC, 100, a.clone()));
        entries.push((zstd | FLAG_ARCH_SPECIFIC, 90, a));
        // Only a frame that cannot be decoded takes the header's name.
        entries.push((zstd, 80, b"not even zstd".to_vec()));
        let code = walk(&container(&entries));
        assert_eq!(code.warnings.len(), 1, "{:?}", code.warnings);
        assert!(code.warnings[0].starts_with("1 cubin(s) could not be decoded"));
        let names: Vec<String> = code
            .sass
            .iter()
            .map(|e| format!("{}x{}", e.target, e.count))
            .collect();
        assert_eq!(names, ["sm_80x1", "sm_90ax1", "sm_100x20", "sm_100ax2"]);
        assert_eq!(code.compressed, 24);
    }

    /// A frame's first block is found from its headers, and reading through it is enough.
    #[test]
    fn zstd_first_block_bounds_the_read() {
        let frame = zstd::bulk::compress(&cubin(0x0600_7802, 600_000), 3).unwrap();
        let end = zstd_first_block_end(&frame).unwrap();
        assert!(end < frame.len() as u64 && end <= ZstdPrefix::FIRST_BLOCK_MAX);
        let mut head = [0u8; 64];
        let got = ZstdPrefix::default()
            .decode(&Source::from_bytes(&frame), 0, end, &mut head)
            .unwrap();
        assert_eq!(got, 64);
        assert_eq!(
            cubin_target_from_elf_header(&head).unwrap().to_string(),
            "sm_120"
        );
        assert_eq!(zstd_first_block_end(&frame[..4]), None);
        assert_eq!(zstd_first_block_end(b"\x28\xb5\x2f\xfd\x00\x00"), None);
        assert_eq!(zstd_first_block_end(b"not zstd"), None);
    }

    /// Damaged frames fall back to the fatbin header's name (never `f`, as cuobjdump never
    /// lists a cubin so) without failing the walk, and say so.
    #[test]
    fn damaged_zstd_frames_fall_back_to_the_header() {
        let zstd = FLAG_COMPRESS_ZSTD | FLAG_64BIT | FLAG_LINUX | FLAG_FAMILY;
        let good = zstd::bulk::compress(&cubin(0x0600_6402, 5000), 3).unwrap();
        let mut cut = good.clone();
        cut.truncate(good.len() / 3);
        let mut flipped = good.clone();
        for b in &mut flipped[8..40] {
            *b ^= 0x5a;
        }
        let mut huge_window = vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, 0xf8];
        huge_window.extend_from_slice(&[0xff; 64]);
        let entries = [
            (zstd, 100, cut),
            (zstd, 100, flipped),
            (zstd, 100, huge_window),
            (zstd, 100, b"\x28\xb5\x2f\xfd".to_vec()),
            (zstd, 100, Vec::new()),
        ];
        let code = walk(&container(&entries));
        assert_eq!(code.sass_total(), 5);
        assert!(
            code.sass.iter().all(|e| e.target.to_string() == "sm_100"),
            "{:?}",
            code.sass
        );
        assert!(
            code.warnings[0].starts_with("5 cubin(s) could not be decoded"),
            "{:?}",
            code.warnings
        );
    }
    /// nvcc 13.5's `--concat` entry with a plain payload: a cubin member, a PTX member
    /// with an (empty) attribute block, and a second cubin; then an entry of a kind no
    /// toolkit wrote yet, which is counted and warned about, never silently dropped.
    #[test]
    fn concatenated_members_and_unknown_kinds() {
        let elf_a = cubin(0x0600_6402, 256); // sm_100
        let elf_b = cubin(0x0600_7802, 128); // sm_120
        let ptx = b"//ptx".to_vec();
        let payload = [elf_a.clone(), ptx.clone(), elf_b.clone()].concat();
        let member = |kind: u16, off: usize, len: usize, arch: u32, flags: u64, ext: bool| {
            let mut m = vec![0u8; 64];
            m[0..2].copy_from_slice(&kind.to_le_bytes());
            m[4..8].copy_from_slice(&(off as u32).to_le_bytes());
            m[8..16].copy_from_slice(&(len as u64).to_le_bytes());
            m[28..32].copy_from_slice(&arch.to_le_bytes());
            m[40..48].copy_from_slice(&flags.to_le_bytes());
            if ext {
                m.extend_from_slice(&72u32.to_le_bytes());
                m.extend_from_slice(&0u32.to_le_bytes());
                m.resize(80, 0);
            }
            m
        };
        let members = [
            member(KIND_ELF, 0, elf_a.len(), 100, FLAG_ARCH_SPECIFIC, false),
            member(KIND_PTX, elf_a.len(), ptx.len(), 100, FLAG_FAMILY, true),
            member(
                KIND_ELF,
                elf_a.len() + ptx.len(),
                elf_b.len(),
                120,
                0,
                false,
            ),
        ]
        .concat();
        let mut h = vec![0u8; 72];
        h[0..2].copy_from_slice(&KIND_CONCAT.to_le_bytes());
        h[64..68].copy_from_slice(&3u32.to_le_bytes());
        h.extend_from_slice(&members);
        let header_size = h.len() as u32;
        h[68..72].copy_from_slice(&(header_size - 64).to_le_bytes());
        h[4..8].copy_from_slice(&header_size.to_le_bytes());
        h[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        h[16..20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        let mut unknown = vec![0u8; 64];
        unknown[0..2].copy_from_slice(&0x0200u16.to_le_bytes());
        unknown[4..8].copy_from_slice(&64u32.to_le_bytes());
        let body = [h, payload, unknown].concat();
        let mut c = MAGIC.to_le_bytes().to_vec();
        c.extend_from_slice(&1u16.to_le_bytes());
        c.extend_from_slice(&16u16.to_le_bytes());
        c.extend_from_slice(&(body.len() as u64).to_le_bytes());
        c.extend_from_slice(&body);
        let code = walk(&c);
        let sass: Vec<String> = code
            .sass
            .iter()
            .map(|e| format!("{}x{}", e.target, e.count))
            .collect();
        assert_eq!(sass, ["sm_100ax1", "sm_120x1"]);
        assert_eq!(code.ptx.len(), 1);
        assert_eq!(code.ptx[0].target.to_string(), "sm_100f");
        assert_eq!(code.other, 1);
        assert!(
            code.warnings
                .iter()
                .any(|w| w.contains("kinds fdl does not know (0x200)")),
            "{:?}",
            code.warnings
        );
    }
}
