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
//! Flags seen: 0x1000/0x2000/0x8000 compressed (0x2000 is an LZ4 block), 0x10000
//! obfuscated (cuobjdump skips these), 0x100000 arch-specific (`a`), 0x200000 family
//! (`f`). `cuobjdump --list-ptx` names PTX by the header's arch and those two flags;
//! `--list-elf` names a cubin from *the cubin's own ELF header* (`e_flags`), ignoring the
//! header flags. To list exactly what cuobjdump lists, SASS entries therefore read the
//! cubin's first 64 bytes: directly when stored plain, or by decoding just that prefix of
//! an LZ4 block (a few hundred bytes of input at most). Payloads are never decompressed.

use super::source::Source;
use crate::arch::{Arch, GpuTarget, Variant};
use anyhow::Result;
use serde::Serialize;
use std::collections::BTreeMap;

pub const MAGIC: u32 = 0xBA55_ED50;
pub const CONTAINER_HEADER: u64 = 16;
pub const ENTRY_HEADER_MIN: u64 = 64;

pub const KIND_PTX: u16 = 1;
pub const KIND_ELF: u16 = 2;

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
        Ok(())
    }

    fn walk_entries(&mut self, src: &Source<'_>, start: u64, end: u64, what: &str) -> Result<()> {
        let mut q = start;
        // One read takes the entry header and the start of its payload, where a cubin's
        // ELF header (or the LZ4 block that holds it) is: one system call per entry.
        let mut block = [0u8; 512];
        while end - q >= ENTRY_HEADER_MIN {
            let got = src.read_at(q, &mut block[..(end - q).min(512) as usize])?;
            let block = &block[..got];
            let h = block;
            let kind = le16(h, 0);
            let header_size = u64::from(le32(h, 4));
            let payload_size = le64(h, 8);
            let compressed_size = u64::from(le32(h, 16));
            let arch_number = le32(h, 28);
            let flags = le64(h, 40);
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
                match kind {
                    KIND_ELF => {
                        let stored = compressed_size.min(payload_size);
                        let prefix = block.get(header_size as usize..).unwrap_or(&[]);
                        let cubin = cubin_target(src, payload, payload_size, stored, flags, prefix);
                        let target = cubin.unwrap_or_else(|| header_target(arch_number, flags));
                        *self.sass.entry(target).or_default() += 1;
                    }
                    KIND_PTX => {
                        *self
                            .ptx
                            .entry(header_target(arch_number, flags))
                            .or_default() += 1;
                    }
                    _ => self.code.other += 1,
                }
            }
            q = next;
        }
        Ok(())
    }
}

/// The target a header names by itself: arch number plus the `a`/`f` flags.
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
/// prefix cannot be had cheaply (zstd or unknown compression, damaged data).
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
}
