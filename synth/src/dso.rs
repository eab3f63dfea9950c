//! Small hand-laid x86-64 shared objects for the loader model's hostile-input tests: a
//! dynamic table of any shape (repeated tags, tens of thousands of DT_NEEDED, tags that
//! point anywhere), `.dynsym`/`.dynstr`, and SysV or GNU hash tables, honest or not.
//!
//! One PT_LOAD maps the whole file at address 0 (so an address is its file offset) and
//! PT_DYNAMIC points at the dynamic table. Section headers (`.dynsym`, `.dynstr`,
//! `.shstrtab`) are written only when asked, since the loader never reads them and fdl
//! takes the symbol count from them when they are there. Nothing here is clever: the
//! layout is written from the ELF specification, so a reader's mistake is not shared.

use std::path::Path;

pub const DT_NEEDED: u64 = 1;
pub const DT_HASH: u64 = 4;
pub const DT_STRTAB: u64 = 5;
pub const DT_SYMTAB: u64 = 6;
pub const DT_STRSZ: u64 = 10;
pub const DT_SYMENT: u64 = 11;
pub const DT_SONAME: u64 = 14;
pub const DT_RPATH: u64 = 15;
pub const DT_RUNPATH: u64 = 29;
pub const DT_GNU_HASH: u64 = 0x6fff_fef5;
pub const DT_VERSYM: u64 = 0x6fff_fff0;
pub const DT_VERNEED: u64 = 0x6fff_fffe;
pub const DT_VERNEEDNUM: u64 = 0x6fff_ffff;

/// The symbol hash table to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hash {
    /// A correct SysV DT_HASH.
    SysV,
    /// A correct DT_GNU_HASH (one bucket).
    Gnu,
    /// A SysV DT_HASH with one bucket whose chain points at itself forever, claiming
    /// `nchain` chain entries (0xffffffff: far more than the file holds).
    SysVSelfLoop { nchain: u32 },
    /// These words as the table, under DT_GNU_HASH or DT_HASH (fuzzing).
    Raw { gnu: bool, words: Vec<u32> },
}

/// One dynamic symbol: a global default-visibility function, defined (in a section of
/// its own, index 1) or undefined (imported).
#[derive(Debug, Clone)]
pub struct Symbol {
    pub name: String,
    pub defined: bool,
}

#[derive(Debug, Clone)]
pub struct Dso {
    pub soname: Option<String>,
    pub needed: Vec<String>,
    /// One DT_RPATH tag per element, in order.
    pub rpath_tags: Vec<String>,
    pub runpath: Option<String>,
    pub symbols: Vec<Symbol>,
    pub hash: Hash,
    /// Write `.dynsym`, `.dynstr`, `.shstrtab` and `.rodata` section headers.
    pub sections: bool,
    /// Replace the value of these tags where written (e.g. DT_STRTAB past the end).
    pub override_tags: Vec<(u64, u64)>,
    /// Extra tags written before DT_NULL.
    pub extra_tags: Vec<(u64, u64)>,
    /// Bytes appended at the end of the loaded segment (a large file).
    pub padding: u64,
    /// Strings placed in the loaded segment (a self-id, say).
    pub rodata: Vec<u8>,
}

impl Default for Dso {
    fn default() -> Self {
        Dso {
            soname: None,
            needed: Vec::new(),
            rpath_tags: Vec::new(),
            runpath: None,
            symbols: Vec::new(),
            hash: Hash::SysV,
            sections: false,
            override_tags: Vec::new(),
            extra_tags: Vec::new(),
            padding: 0,
            rodata: Vec::new(),
        }
    }
}

/// The SysV ELF hash of `name`.
pub fn sysv_hash(name: &[u8]) -> u32 {
    name.iter().fold(0u32, |h, &c| {
        let h = (h << 4).wrapping_add(u32::from(c));
        let g = h & 0xf000_0000;
        (h ^ (g >> 24)) & !g
    })
}

/// The GNU hash of `name`.
pub fn gnu_hash(name: &[u8]) -> u32 {
    name.iter().fold(5381u32, |h, &c| {
        h.wrapping_mul(33).wrapping_add(u32::from(c))
    })
}

fn align(v: &mut Vec<u8>, a: usize) {
    while !v.len().is_multiple_of(a) {
        v.push(0);
    }
}

impl Dso {
    /// The file's bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        // Undefined symbols first, then defined ones: DT_GNU_HASH covers only a tail.
        let mut syms: Vec<&Symbol> = self.symbols.iter().filter(|s| !s.defined).collect();
        syms.extend(self.symbols.iter().filter(|s| s.defined));

        let mut out = vec![0u8; 64 + 2 * 56];
        // .dynstr
        let strtab = out.len();
        let mut strings: Vec<u8> = vec![0];
        let mut add = |s: &str| -> u64 {
            let at = strings.len() as u64;
            strings.extend_from_slice(s.as_bytes());
            strings.push(0);
            at
        };
        let needed: Vec<u64> = self.needed.iter().map(|n| add(n)).collect();
        let rpaths: Vec<u64> = self.rpath_tags.iter().map(|r| add(r)).collect();
        let runpath = self.runpath.as_deref().map(&mut add);
        let soname = self.soname.as_deref().map(&mut add);
        let sym_names: Vec<u64> = syms.iter().map(|s| add(&s.name)).collect();
        out.extend_from_slice(&strings);
        let strsz = strings.len() as u64;
        let rodata_at = out.len() as u64;
        out.extend_from_slice(&self.rodata);
        align(&mut out, 8);

        // .dynsym: the null symbol, then the symbols.
        let symtab = out.len();
        out.extend_from_slice(&[0u8; 24]);
        for (s, &name) in syms.iter().zip(&sym_names) {
            out.extend_from_slice(&(name as u32).to_le_bytes());
            out.push(0x12); // STB_GLOBAL, STT_FUNC
            out.push(0); // STV_DEFAULT
            out.extend_from_slice(&(if s.defined { 1u16 } else { 0 }).to_le_bytes());
            out.extend_from_slice(&(if s.defined { 0x100u64 } else { 0 }).to_le_bytes());
            out.extend_from_slice(&0u64.to_le_bytes());
        }
        let nsyms = syms.len() + 1;
        align(&mut out, 8);

        // The hash table.
        let hash_at = out.len();
        let words: Vec<u32> = match &self.hash {
            Hash::Raw { words, .. } => words.clone(),
            Hash::SysV => {
                let nbucket = 1u32;
                let mut w = vec![nbucket, nsyms as u32, 0];
                let mut chain = vec![0u32; nsyms];
                // Every symbol in bucket 0, chained in index order.
                if nsyms > 1 {
                    w[2] = 1;
                    for (i, c) in chain.iter_mut().enumerate().take(nsyms - 1).skip(1) {
                        *c = i as u32 + 1;
                    }
                }
                w.extend(chain);
                w
            }
            Hash::SysVSelfLoop { nchain } => vec![1, *nchain, 1, 0, 1],
            Hash::Gnu => {
                let first_defined = syms.iter().position(|s| s.defined).map(|i| i + 1);
                let symoffset = first_defined.unwrap_or(nsyms) as u32;
                // nbuckets, symoffset, bloom_size, bloom_shift, bloom (u64), bucket.
                let mut w = vec![1, symoffset, 1, 6, u32::MAX, u32::MAX];
                w.push(if first_defined.is_some() {
                    symoffset
                } else {
                    0
                });
                let tail = &syms[symoffset as usize - 1..];
                for (i, s) in tail.iter().enumerate() {
                    let h = gnu_hash(s.name.as_bytes()) & !1;
                    w.push(if i + 1 == tail.len() { h | 1 } else { h });
                }
                w
            }
        };
        for w in words {
            out.extend_from_slice(&w.to_le_bytes());
        }
        align(&mut out, 8);

        // The dynamic table.
        let mut tags: Vec<(u64, u64)> = Vec::new();
        tags.extend(needed.iter().map(|&n| (DT_NEEDED, n)));
        tags.extend(rpaths.iter().map(|&r| (DT_RPATH, r)));
        if let Some(r) = runpath {
            tags.push((DT_RUNPATH, r));
        }
        if let Some(s) = soname {
            tags.push((DT_SONAME, s));
        }
        let hash_tag = match self.hash {
            Hash::Gnu | Hash::Raw { gnu: true, .. } => DT_GNU_HASH,
            _ => DT_HASH,
        };
        tags.push((hash_tag, hash_at as u64));
        tags.push((DT_STRTAB, strtab as u64));
        tags.push((DT_SYMTAB, symtab as u64));
        tags.push((DT_STRSZ, strsz));
        tags.push((DT_SYMENT, 24));
        tags.extend(self.extra_tags.iter().copied());
        for (tag, val) in &mut tags {
            if let Some(&(_, v)) = self.override_tags.iter().find(|(t, _)| t == tag) {
                *val = v;
            }
        }
        tags.push((0, 0));
        let dyn_at = out.len();
        for (t, v) in &tags {
            out.extend_from_slice(&t.to_le_bytes());
            out.extend_from_slice(&v.to_le_bytes());
        }
        let dyn_size = out.len() - dyn_at;
        out.resize(out.len() + self.padding as usize, 0);
        align(&mut out, 8);
        let load_size = out.len() as u64;

        // Section headers: null, .dynsym, .dynstr, .shstrtab, .rodata (the strings).
        let (shoff, shnum, shstrndx) = if self.sections {
            let shstr_at = out.len();
            let shstr = b"\0.dynsym\0.dynstr\0.shstrtab\0.rodata\0";
            out.extend_from_slice(shstr);
            align(&mut out, 8);
            let shoff = out.len();
            let sh =
                |name: u32, ty: u32, flags: u64, addr: u64, size: u64, link: u32, entsize: u64| {
                    let mut s = Vec::with_capacity(64);
                    s.extend_from_slice(&name.to_le_bytes());
                    s.extend_from_slice(&ty.to_le_bytes());
                    s.extend_from_slice(&flags.to_le_bytes());
                    s.extend_from_slice(&addr.to_le_bytes());
                    s.extend_from_slice(&addr.to_le_bytes()); // offset = address
                    s.extend_from_slice(&size.to_le_bytes());
                    s.extend_from_slice(&link.to_le_bytes());
                    s.extend_from_slice(&(if ty == 11 { 1u32 } else { 0 }).to_le_bytes());
                    s.extend_from_slice(&8u64.to_le_bytes());
                    s.extend_from_slice(&entsize.to_le_bytes());
                    s
                };
            out.extend_from_slice(&[0u8; 64]);
            out.extend(sh(1, 11, 2, symtab as u64, (nsyms * 24) as u64, 2, 24));
            out.extend(sh(9, 3, 2, strtab as u64, strsz, 0, 0));
            out.extend(sh(17, 3, 0, shstr_at as u64, shstr.len() as u64, 0, 0));
            out.extend(sh(27, 1, 2, rodata_at, self.rodata.len() as u64, 0, 0));
            (shoff as u64, 5u16, 3u16)
        } else {
            (0, 0, 0)
        };

        // ELF header.
        let mut eh = Vec::with_capacity(64);
        eh.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
        eh.extend_from_slice(&[0u8; 8]);
        eh.extend_from_slice(&3u16.to_le_bytes()); // ET_DYN
        eh.extend_from_slice(&62u16.to_le_bytes()); // EM_X86_64
        eh.extend_from_slice(&1u32.to_le_bytes());
        eh.extend_from_slice(&0u64.to_le_bytes()); // e_entry
        eh.extend_from_slice(&64u64.to_le_bytes()); // e_phoff
        eh.extend_from_slice(&shoff.to_le_bytes());
        eh.extend_from_slice(&0u32.to_le_bytes());
        eh.extend_from_slice(&64u16.to_le_bytes());
        eh.extend_from_slice(&56u16.to_le_bytes());
        eh.extend_from_slice(&2u16.to_le_bytes());
        eh.extend_from_slice(&64u16.to_le_bytes());
        eh.extend_from_slice(&shnum.to_le_bytes());
        eh.extend_from_slice(&shstrndx.to_le_bytes());
        out[..64].copy_from_slice(&eh);
        let ph = |ty: u32, flags: u32, off: u64, size: u64, align: u64| {
            let mut p = Vec::with_capacity(56);
            p.extend_from_slice(&ty.to_le_bytes());
            p.extend_from_slice(&flags.to_le_bytes());
            p.extend_from_slice(&off.to_le_bytes());
            p.extend_from_slice(&off.to_le_bytes()); // vaddr = offset
            p.extend_from_slice(&off.to_le_bytes());
            p.extend_from_slice(&size.to_le_bytes());
            p.extend_from_slice(&size.to_le_bytes());
            p.extend_from_slice(&align.to_le_bytes());
            p
        };
        let load = ph(1, 4, 0, load_size, 0x1000);
        let dynamic = ph(2, 6, dyn_at as u64, dyn_size as u64, 8);
        out[64..120].copy_from_slice(&load);
        out[120..176].copy_from_slice(&dynamic);
        out
    }

    /// Writes the file at `path`.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.to_vec())
    }
}

/// The names `from_fuzz_input` gives its symbols, in order.
pub const FUZZ_NAMES: [&str; 7] = [
    "ncclAllReduce",
    "ncclGetVersion",
    "ncclCommInitRank",
    "pncclAllReduce",
    "dlopen",
    "f",
    "",
];

impl Dso {
    /// The `dynamic_tables` fuzz target's reading of its input: byte 0 (bit 0:
    /// DT_GNU_HASH, else DT_HASH; bit 1: section headers; bits 2–4: how many of
    /// [`FUZZ_NAMES`] are symbols), byte 1 (bit i: symbol i is defined), byte 2 (how many
    /// extra tags, up to 7), then 16 bytes per tag (tag, value; little-endian), then the
    /// hash table's u32 words (up to 4096). `None` for an input too short for its tags.
    pub fn from_fuzz_input(data: &[u8]) -> Option<Dso> {
        let [flags, defined, ntags, rest @ ..] = data else {
            return None;
        };
        let ntags = usize::from(ntags % 8);
        let tags = rest.get(..ntags * 16)?;
        let words = &rest[ntags * 16..];
        let extra_tags = tags
            .chunks_exact(16)
            .map(|c| {
                let (t, v) = c.split_at(8);
                (
                    u64::from_le_bytes(t.try_into().expect("8 bytes")),
                    u64::from_le_bytes(v.try_into().expect("8 bytes")),
                )
            })
            .collect();
        let words = words
            .chunks_exact(4)
            .take(4096)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        let symbols = FUZZ_NAMES
            .iter()
            .take(usize::from((flags >> 2) & 7))
            .enumerate()
            .map(|(i, n)| Symbol {
                name: n.to_string(),
                defined: defined & (1 << i) != 0,
            })
            .collect();
        Some(Dso {
            soname: Some("libfuzz.so".into()),
            needed: vec!["libdep.so".into()],
            symbols,
            hash: Hash::Raw {
                gnu: flags & 1 != 0,
                words,
            },
            sections: flags & 2 != 0,
            extra_tags,
            ..Dso::default()
        })
    }
}
