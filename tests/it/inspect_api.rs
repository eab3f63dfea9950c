//! The inspection API on synthetic libraries: round trips through `synth`, coverage
//! verdicts, and hostile inputs (truncations, bad offsets, odd file types).

use fdl::arch::{Arch, GpuTarget, Variant};
use fdl::inspect::{self, coverage, Verdict};
use fdl::version::{CudaVersion, NcclVersion};
use fdl_synth as synth;
use std::path::Path;

fn t(n: u32, variant: Variant) -> GpuTarget {
    GpuTarget {
        arch: Arch::from_number(n),
        variant,
    }
}

fn sample_spec(compressed: bool) -> synth::Spec {
    let mut spec = synth::Spec::torch_like(
        &[
            t(61, Variant::Generic),
            t(86, Variant::Generic),
            t(90, Variant::Specific),
            t(120, Variant::Generic),
        ],
        &[t(90, Variant::Specific), t(120, Variant::Generic)],
        3,
        700,
        compressed,
    );
    spec.self_id = Some("2.27.5+cuda12.9".into());
    spec.floor_messages = true;
    spec.runpath = Some("$ORIGIN/../../nvidia/nccl/lib".into());
    spec.rodata_padding = 10_000;
    spec
}

fn listed(list: &[inspect::CodeEntry]) -> Vec<(String, usize)> {
    list.iter()
        .map(|e| (e.target.to_string(), e.count))
        .collect()
}

#[test]
fn synth_round_trip() {
    for compressed in [false, true] {
        let bytes = synth::to_vec(&sample_spec(compressed));
        let ins = inspect::inspect_bytes(&bytes).unwrap();
        assert!(ins.elf);
        assert_eq!(ins.soname.as_deref(), Some("libtorch_cuda.so"));
        assert_eq!(ins.needed, ["libc10_cuda.so", "libcudart.so.12"]);
        assert_eq!(ins.runpath, ["$ORIGIN/../../nvidia/nccl/lib"]);
        assert!(ins.rpath.is_empty());
        let nccl = ins.nccl.clone().expect("self-id");
        assert_eq!(nccl.version, NcclVersion::new(2, 27, 5));
        assert_eq!(nccl.cuda, CudaVersion::new(12, 9));
        assert_eq!(nccl.linkage, inspect::Linkage::Static);
        assert_eq!(
            listed(&ins.gpu_code.sass),
            [
                ("sm_61".to_string(), 3),
                ("sm_86".into(), 3),
                ("sm_90a".into(), 3),
                ("sm_120".into(), 3)
            ]
        );
        assert_eq!(
            listed(&ins.gpu_code.ptx),
            [("sm_90a".to_string(), 3), ("sm_120".into(), 3)]
        );
        assert_eq!(ins.gpu_code.containers, 3);
        assert_eq!(ins.gpu_code.compressed, if compressed { 18 } else { 0 });
        assert!(
            ins.gpu_code.warnings.is_empty(),
            "{:?}",
            ins.gpu_code.warnings
        );
        assert!(ins.warnings.is_empty(), "{:?}", ins.warnings);
        serde_json::to_string(&ins).unwrap();
    }
}

#[test]
fn floors_alone_are_not_a_self_id() {
    let mut spec = sample_spec(false);
    spec.self_id = None;
    let ins = inspect::inspect_bytes(&synth::to_vec(&spec)).unwrap();
    assert!(ins.nccl.is_none());
    assert!(ins.self_ids.is_empty());
}

#[test]
fn file_api_and_find_self_id() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("libtorch_cuda.so");
    let n = synth::write_file(&sample_spec(true), &p).unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().len(), n);
    let ins = inspect::inspect(&p).unwrap();
    assert_eq!(ins.size, n);
    assert_eq!(ins.path, p);
    let id = inspect::find_nccl_self_id(&p).unwrap().unwrap();
    assert_eq!(id.nccl.to_string(), "2.27.5");
    // Non-ELF input: whole-file scan.
    let raw = dir.path().join("blob.bin");
    std::fs::write(&raw, b"xx\0NCCL version 2.21.5+cuda12.4\0yy").unwrap();
    let ins = inspect::inspect(&raw).unwrap();
    assert!(!ins.elf);
    assert_eq!(ins.nccl.unwrap().version, NcclVersion::new(2, 21, 5));
}

/// The best fitting cubin's target of a native verdict.
fn native_sass(v: Verdict) -> Option<GpuTarget> {
    match v {
        Verdict::Native { sass, .. } => Some(sass),
        _ => None,
    }
}

#[test]
fn coverage_verdicts() {
    let spec = sample_spec(false);
    let code = inspect::inspect_bytes(&synth::to_vec(&spec))
        .unwrap()
        .gpu_code;
    let v = |major, minor| coverage(&code, Arch::new(major, minor));
    assert_eq!(native_sass(v(6, 1)), Some(t(61, Variant::Generic)));
    // sm_86 cubin runs on 8.9; sm_90a runs on 9.0 only and beats nothing else there.
    assert_eq!(native_sass(v(8, 9)), Some(t(86, Variant::Generic)));
    assert_eq!(native_sass(v(9, 0)), Some(t(90, Variant::Specific)));
    // 10.0: no cubin; sm_90a PTX is bound to 9.0, so no PTX either.
    assert_eq!(v(10, 0), Verdict::NotCovered);
    assert_eq!(native_sass(v(12, 1)), Some(t(120, Variant::Generic)));
    assert_eq!(v(7, 0), Verdict::NotCovered);
    let ptx_only = inspect::GpuCode {
        ptx: vec![inspect::CodeEntry {
            target: t(80, Variant::Generic),
            count: 1,
        }],
        ..Default::default()
    };
    assert_eq!(
        coverage(&ptx_only, Arch::new(12, 0)),
        Verdict::PtxJit {
            ptx: t(80, Variant::Generic)
        }
    );
    assert_eq!(coverage(&ptx_only, Arch::new(7, 5)), Verdict::NotCovered);
}

/// A GPU that runs one arch-specific cubin natively but most kernels from another
/// arch's cubins: the verdict says both, with the counts the inspection made.
#[test]
fn coverage_names_what_most_kernels_run() {
    let entry = |n, variant, count| inspect::CodeEntry {
        target: t(n, variant),
        count,
    };
    let code = inspect::GpuCode {
        sass: vec![
            entry(120, Variant::Generic, 476),
            entry(121, Variant::Specific, 1),
        ],
        ..Default::default()
    };
    let v = coverage(&code, Arch::new(12, 1));
    assert_eq!(native_sass(v), Some(t(121, Variant::Specific)));
    assert_eq!(
        v.sass_text().as_deref(),
        Some("sm_121a ×1 natively, sm_120 ×476")
    );
    // On sm_120 only one target fits: it is named alone.
    let v = coverage(&code, Arch::new(12, 0));
    assert_eq!(v.sass_text().as_deref(), Some("sm_120"));
    // The best target holding the most cubins is named alone (libtorch 2.8 on sm_90:
    // 393 sm_90, 4 sm_90a).
    let code = inspect::GpuCode {
        sass: vec![
            entry(90, Variant::Generic, 393),
            entry(90, Variant::Specific, 4),
        ],
        ..Default::default()
    };
    assert_eq!(
        coverage(&code, Arch::new(9, 0)).sass_text().as_deref(),
        Some("sm_90")
    );
}

/// Every prefix of a valid library: never a panic, and never a count from cut entries.
/// Once the ELF header is whole, every prefix is reported as truncated (the section
/// table is the file's last bytes), never read as a library without NCCL or GPU code.
#[test]
fn truncations_never_panic() {
    let bytes = synth::to_vec(&sample_spec(true));
    let full = inspect::inspect_bytes(&bytes).unwrap();
    for len in (0..bytes.len()).step_by(7).chain([bytes.len() - 1]) {
        match inspect::inspect_bytes(&bytes[..len]) {
            Ok(ins) => {
                assert!(len < 64, "{len} bytes read as a whole file");
                assert!(ins.gpu_code.sass_total() <= full.gpu_code.sass_total());
            }
            Err(e) if len >= 64 => {
                let t = e
                    .downcast_ref::<inspect::TruncatedElf>()
                    .unwrap_or_else(|| panic!("{len} bytes: {e:#}"));
                assert_eq!(t.len, len as u64);
                assert!(e.to_string().contains("is truncated"), "{e}");
            }
            Err(_) => {}
        }
    }
}

/// Without a section table, the loadable segments say where the file must reach: a file
/// ending inside one is truncated, and its self-id is not searched for in what is left.
#[test]
fn truncated_segments_without_a_section_table_are_reported() {
    let mut bytes = synth::to_vec(&sample_spec(false));
    bytes[40..48].fill(0); // e_shoff
    bytes[60..64].fill(0); // e_shnum, e_shstrndx
    let whole = inspect::inspect_bytes(&bytes).unwrap();
    assert!(whole.nccl.is_some());
    // The writable segment (.dynamic) is the last one; cut inside it.
    let (_, dyn_off, dyn_size) = section_header(&synth::to_vec(&sample_spec(false)), 4);
    let cut = (dyn_off + dyn_size / 2) as usize;
    let e = inspect::inspect_bytes(&bytes[..cut]).unwrap_err();
    let t = e
        .downcast_ref::<inspect::TruncatedElf>()
        .unwrap_or_else(|| panic!("{e:#}"));
    assert_eq!((t.end, t.len), (dyn_off + dyn_size, cut as u64));
    assert!(
        e.to_string()
            .contains("its program headers say a loadable segment's bytes end at byte"),
        "{e}"
    );
}

fn le64_at(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Offsets of the section header of `name` in a synth file (ELF64).
fn shdr_of(bytes: &[u8], index: usize) -> usize {
    let shoff = u64::from_le_bytes(bytes[40..48].try_into().unwrap()) as usize;
    shoff + index * 64
}

/// `bytes` (an ELF64 synth file) with its section header table moved to the end and
/// `extra` headers appended to it: what a hostile or broken linker could write.
fn with_extra_section_headers(bytes: &[u8], extra: &[[u8; 64]]) -> Vec<u8> {
    let shoff = u64::from_le_bytes(bytes[40..48].try_into().unwrap()) as usize;
    let shnum = u16::from_le_bytes(bytes[60..62].try_into().unwrap()) as usize;
    let count = shnum + extra.len();
    assert!(
        count < 0xff00,
        "more headers need e_shnum 0 and sh_size of header 0"
    );
    let mut out = bytes.to_vec();
    out.resize(out.len().div_ceil(8) * 8, 0);
    let new_shoff = out.len() as u64;
    out.extend_from_slice(&bytes[shoff..shoff + shnum * 64]);
    for h in extra {
        out.extend_from_slice(h);
    }
    out[40..48].copy_from_slice(&new_shoff.to_le_bytes());
    out[60..62].copy_from_slice(&(count as u16).to_le_bytes());
    out
}

/// Section header `index` of a synth file, and its (sh_offset, sh_size).
fn section_header(bytes: &[u8], index: usize) -> ([u8; 64], u64, u64) {
    let at = shdr_of(bytes, index);
    let h: [u8; 64] = bytes[at..at + 64].try_into().unwrap();
    let field = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap());
    (h, field(24), field(32))
}

/// A copy of section header `h` describing `size` bytes at `offset`.
fn moved(h: &[u8; 64], offset: u64, size: u64) -> [u8; 64] {
    let mut h = *h;
    h[24..32].copy_from_slice(&offset.to_le_bytes());
    h[32..40].copy_from_slice(&size.to_le_bytes());
    h
}

/// Synth section indexes (see `synth::write_to`).
const RODATA: usize = 2;
const NV_FATBIN: usize = 3;

/// The synth file `good` with `count` more read-only data headers over its self-id,
/// each starting `k` bytes into `.rodata` and running to its end, and `count` copies of
/// its `.nv_fatbin` header.
fn overlapping_headers_file(good: &[u8], count: u64) -> Vec<u8> {
    let (ro, ro_off, ro_size) = section_header(good, RODATA);
    let (fb, _, _) = section_header(good, NV_FATBIN);
    assert!(count < ro_size);
    let mut extra: Vec<[u8; 64]> = (0..count)
        .map(|k| moved(&ro, ro_off + k, ro_size - k))
        .collect();
    extra.extend((0..count).map(|_| fb));
    with_extra_section_headers(good, &extra)
}

/// Thousands of overlapping string-region headers are scanned as their union: the
/// self-id is reported once, and no byte of `.rodata` is searched twice.
#[test]
fn overlapping_string_regions_are_scanned_once() {
    let good = synth::to_vec(&sample_spec(false));
    let (ro, ro_off, ro_size) = section_header(&good, RODATA);
    let single = inspect::inspect_bytes(&good).unwrap();
    assert_eq!(single.work().string_regions, 1);
    assert_eq!(single.work().string_bytes, ro_size);
    let extra: Vec<[u8; 64]> = (0..5000)
        .map(|k| moved(&ro, ro_off + k, ro_size - k))
        .collect();
    let bytes = with_extra_section_headers(&good, &extra);
    let ins = inspect::inspect_bytes(&bytes).unwrap();
    assert_eq!(ins.self_ids.len(), 1, "{:?}", ins.self_ids);
    assert_eq!(
        ins.nccl.as_ref().expect("self-id").version,
        NcclVersion::new(2, 27, 5)
    );
    let work = ins.work();
    assert_eq!(work.string_regions, 1);
    assert_eq!(work.string_bytes, ro_size);
    assert!(work.string_bytes <= bytes.len() as u64);
    assert_eq!(ins.gpu_code, single.gpu_code);
}

/// A duplicated `.nv_fatbin` header, and ranges nested in or partly overlapping it, are
/// walked once: the counts are those of the file with a single header.
#[test]
fn duplicated_fatbin_headers_count_each_cubin_once() {
    for compressed in [false, true] {
        let good = synth::to_vec(&sample_spec(compressed));
        let (fb, fb_off, fb_size) = section_header(&good, NV_FATBIN);
        let single = inspect::inspect_bytes(&good).unwrap();
        assert_eq!(single.gpu_code.sass_total(), 12);
        assert_eq!(single.work().fatbin_ranges, 1);
        assert_eq!(single.work().fatbin_bytes, fb_size);
        // The second container's offset: a range starting there is nested in the section.
        let magic = 0xBA55_ED50u32.to_le_bytes();
        let second = fb_off as usize
            + 1
            + good[fb_off as usize + 1..]
                .windows(4)
                .position(|w| w == magic)
                .unwrap();
        let cases: Vec<(&str, Vec<[u8; 64]>)> = vec![
            ("one duplicate", vec![fb]),
            ("a thousand duplicates", vec![fb; 1000]),
            (
                "nested from the second container",
                vec![moved(&fb, second as u64, fb_off + fb_size - second as u64)],
            ),
            (
                "the first half, cutting a container",
                vec![moved(&fb, fb_off, fb_size / 2)],
            ),
            (
                "overlapping the second half",
                vec![moved(&fb, fb_off + fb_size / 3, fb_size - fb_size / 3)],
            ),
        ];
        for (what, extra) in cases {
            let ins = inspect::inspect_bytes(&with_extra_section_headers(&good, &extra)).unwrap();
            assert_eq!(
                listed(&ins.gpu_code.sass),
                listed(&single.gpu_code.sass),
                "{what}"
            );
            assert_eq!(ins.gpu_code, single.gpu_code, "{what}");
            assert_eq!(ins.work().fatbin_ranges, 1, "{what}");
            assert_eq!(ins.work().fatbin_bytes, fb_size, "{what}");
        }
    }
}

/// The work is linear in the file's size, however many headers describe the same bytes:
/// the bytes searched for self-ids and walked for fatbins are each at most the file's
/// size, while the headers claim far more (reading each would be quadratic).
#[test]
fn inspection_work_is_bounded_by_the_file_size() {
    let good = synth::to_vec(&sample_spec(false));
    for count in [500u64, 2000, 8000] {
        let bytes = overlapping_headers_file(&good, count);
        let size = bytes.len() as u64;
        let claimed: u64 = {
            let shoff = u64::from_le_bytes(bytes[40..48].try_into().unwrap()) as usize;
            let shnum = u16::from_le_bytes(bytes[60..62].try_into().unwrap()) as usize;
            (0..shnum)
                .map(|i| {
                    let h = &bytes[shoff + i * 64..shoff + i * 64 + 64];
                    u64::from_le_bytes(h[32..40].try_into().unwrap())
                })
                .sum()
        };
        assert!(
            claimed > 20 * size,
            "{count}: the headers claim {claimed} bytes"
        );
        let ins = inspect::inspect_bytes(&bytes).unwrap();
        assert_eq!(ins.self_ids.len(), 1);
        assert_eq!(ins.gpu_code.sass_total(), 12);
        let work = ins.work();
        assert!(
            work.string_bytes <= size && work.fatbin_bytes <= size,
            "{count} headers: {work:?} for a {size}-byte file"
        );
        assert_eq!((work.string_regions, work.fatbin_ranges), (1, 1));
    }
    // The committed fuzz seed of this shape stays bounded too.
    let seed = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds/inspect_elf/regress-overlapping-headers.so");
    let bytes = std::fs::read(&seed).unwrap();
    let ins = inspect::inspect_bytes(&bytes).unwrap();
    assert_eq!(ins.self_ids.len(), 1);
    assert!(ins.work().string_bytes + ins.work().fatbin_bytes <= bytes.len() as u64);
}

#[test]
fn hostile_tables_give_errors_or_warnings() {
    let good = synth::to_vec(&sample_spec(false));
    // Section table past the end: falls back to program headers.
    let mut b = good.clone();
    le64_at(&mut b, 40, u64::MAX - 8);
    let ins = inspect::inspect_bytes(&b).unwrap();
    assert!(!ins.warnings.is_empty());
    // .nv_fatbin (section 3) with offset+size overflowing.
    let mut b = good.clone();
    let sh = shdr_of(&b, 3);
    le64_at(&mut b, sh + 24, u64::MAX - 4);
    let ins = inspect::inspect_bytes(&b).unwrap();
    assert!(ins.gpu_code.is_empty());
    assert!(!ins.gpu_code.warnings.is_empty());
    // .dynamic with a size running past the end.
    let mut b = good.clone();
    let sh = shdr_of(&b, 4);
    le64_at(&mut b, sh + 32, u64::MAX / 2);
    let ins = inspect::inspect_bytes(&b).unwrap();
    assert!(
        ins.warnings.iter().any(|w| w.contains("dynamic")),
        "{:?}",
        ins.warnings
    );
    // Unknown ELF class.
    let mut b = good.clone();
    b[4] = 9;
    let e = inspect::inspect_bytes(&b).unwrap_err();
    assert!(e.to_string().contains("ELF class"), "{e}");
}

/// A hand-made fatbin: entries with zero or oversized header/payload sizes, and a
/// container claiming more bytes than exist.
#[test]
fn hostile_fatbins() {
    let entry = |kind: u16, hs: u32, size: u64, arch: u32| {
        let mut e = vec![0u8; 64];
        e[0..2].copy_from_slice(&kind.to_le_bytes());
        e[4..8].copy_from_slice(&hs.to_le_bytes());
        e[8..16].copy_from_slice(&size.to_le_bytes());
        e[28..32].copy_from_slice(&arch.to_le_bytes());
        e
    };
    let container = |entries: &[Vec<u8>], claimed: Option<u64>| {
        let body: Vec<u8> = entries.concat();
        let mut c = Vec::new();
        c.extend_from_slice(&0xBA55_ED50u32.to_le_bytes());
        c.extend_from_slice(&1u16.to_le_bytes());
        c.extend_from_slice(&16u16.to_le_bytes());
        c.extend_from_slice(&claimed.unwrap_or(body.len() as u64).to_le_bytes());
        c.extend_from_slice(&body);
        c
    };
    // Zero-length payloads are fine and counted; zero header size stops the container.
    let ok = container(&[entry(1, 64, 0, 80), entry(1, 64, 0, 80)], None);
    let ins = inspect::inspect_bytes(&ok).unwrap();
    assert_eq!(ins.gpu_code.ptx_total(), 2);
    let zero_hs = container(&[entry(1, 0, 0, 80)], None);
    let ins = inspect::inspect_bytes(&zero_hs).unwrap();
    assert_eq!(ins.gpu_code.ptx_total(), 0);
    assert!(!ins.gpu_code.warnings.is_empty());
    // Payload size that overflows, and one pointing back into itself via wraparound.
    for size in [u64::MAX, u64::MAX - 63] {
        let bad = container(&[entry(2, 64, size, 90)], None);
        let ins = inspect::inspect_bytes(&bad).unwrap();
        assert_eq!(ins.gpu_code.sass_total(), 0);
    }
    // A container claiming far more than exists: what is there is read.
    let mut many = Vec::new();
    for _ in 0..1000 {
        many.push(entry(1, 64, 0, 75));
    }
    let huge = container(&many, Some(u64::MAX - 100));
    let ins = inspect::inspect_bytes(&huge).unwrap();
    assert_eq!(ins.gpu_code.ptx_total(), 1000);
    // Garbage between containers is skipped with a warning; later containers count.
    let mut two = ok.clone();
    two.extend_from_slice(b"garbage garbage garbage");
    two.extend_from_slice(&ok);
    let ins = inspect::inspect_bytes(&two).unwrap();
    assert_eq!(ins.gpu_code.ptx_total(), 4);
    assert_eq!(ins.gpu_code.containers, 2);
}

#[test]
fn odd_files_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let e = inspect::inspect(dir.path()).unwrap_err().to_string();
    assert!(e.contains("is a directory"), "{e}");

    let empty = dir.path().join("empty.so");
    std::fs::write(&empty, b"").unwrap();
    let e = inspect::inspect(&empty).unwrap_err().to_string();
    assert!(e.contains("empty"), "{e}");

    let missing = dir.path().join("missing.so");
    let e = format!("{:#}", inspect::inspect(&missing).unwrap_err());
    assert!(e.contains("missing.so"), "{e}");

    // A FIFO must be refused without blocking (nobody ever writes to it).
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: plain libc call with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let e = inspect::inspect(&fifo).unwrap_err().to_string();
    assert!(e.contains("not a regular file"), "{e}");

    // Unreadable: permissions do not stop root, so only check as another user.
    let locked = dir.path().join("locked.so");
    std::fs::write(&locked, synth::to_vec(&sample_spec(false))).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        eprintln!(
            "SKIPPED (partly): running as root, which reads mode-000 files; the unreadable-file error is not exercised"
        );
    } else {
        let e = inspect::inspect(&locked).unwrap_err().to_string();
        assert!(e.contains("permissions"), "{e}");
    }
}

#[test]
fn shrinking_file_is_an_error_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("lib.so");
    synth::write_file(&sample_spec(false), &p).unwrap();
    let e = inspect::Source::with_file(&p, |src| {
        src.check_len().unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(100)
            .unwrap();
        let e = src.check_len().unwrap_err().to_string();
        assert!(e.contains("shrank"), "{e}");
        let e = inspect::inspect_source(src).unwrap_err().to_string();
        assert!(
            e.contains("shrank") || e.contains("while being read"),
            "{e}"
        );
        Ok(())
    })
    .unwrap_err()
    .to_string();
    // Whatever the reader returned, the file changed: that is the answer.
    assert!(
        e.contains("shrank") || e.contains("while being read"),
        "{e}"
    );
}

/// The committed fuzz seeds are what this generator writes: it writes them into a
/// scratch directory and each must equal its committed copy. With FDL_WRITE_FUZZ_SEEDS
/// set it writes them there instead, to regenerate the corpus (see fuzz/README.md).
#[test]
fn fuzz_seeds_are_what_the_generator_writes() {
    let scratch = tempfile::tempdir().unwrap();
    let regenerate = std::env::var_os("FDL_WRITE_FUZZ_SEEDS");
    let dir = regenerate.as_deref().map_or(scratch.path(), Path::new);
    std::fs::create_dir_all(dir).unwrap();
    write_fuzz_seeds(dir);
    if regenerate.is_none() {
        let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/inspect_elf");
        let mut n = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name();
            assert_eq!(
                std::fs::read(entry.path()).unwrap(),
                std::fs::read(committed.join(&name)).unwrap_or_default(),
                "fuzz/seeds/inspect_elf/{} differs from what the generator writes; regenerate with FDL_WRITE_FUZZ_SEEDS",
                name.to_string_lossy()
            );
            n += 1;
        }
        assert!(n >= 10, "only {n} seeds written");
    }
}

fn write_fuzz_seeds(dir: &Path) {
    let mut small = synth::Spec::torch_like(
        &[t(80, Variant::Generic), t(90, Variant::Specific)],
        &[t(90, Variant::Generic), t(100, Variant::Family)],
        2,
        96,
        false,
    );
    small.self_id = Some("2.27.5+cuda12.9".into());
    small.floor_messages = true;
    small.runpath = Some("$ORIGIN/../lib".into());
    let plain = synth::to_vec(&small);
    small.entries.iter_mut().for_each(|e| e.compressed = true);
    small.rpath = Some("/opt/nccl/lib".into());
    let lz = synth::to_vec(&small);
    std::fs::write(dir.join("synth_plain.so"), &plain).unwrap();
    std::fs::write(dir.join("synth_lz4.so"), &lz).unwrap();
    for cut in [64, 300, plain.len() / 2, plain.len() - 100] {
        std::fs::write(dir.join(format!("synth_plain_cut{cut}.so")), &plain[..cut]).unwrap();
    }
    // The raw fatbin of the compressed file, alone.
    let ins_off = lz
        .windows(4)
        .position(|w| w == 0xBA55_ED50u32.to_le_bytes())
        .unwrap();
    std::fs::write(
        dir.join("raw.fatbin"),
        &lz[ins_off..ins_off + 2000.min(lz.len() - ins_off)],
    )
    .unwrap();
    // LZ4 blocks long enough for match sequences, as real ones have.
    small.entries.iter_mut().for_each(|e| e.payload_size = 1500);
    std::fs::write(dir.join("synth_lz4_long.so"), synth::to_vec(&small)).unwrap();
    std::fs::write(dir.join("raw_zstd.fatbin"), zstd_fatbin()).unwrap();
    // Overlapping string regions and duplicated fatbin headers (kept small: the
    // regression tests above use thousands).
    std::fs::write(
        dir.join("regress-overlapping-headers.so"),
        overlapping_headers_file(&plain, 64),
    )
    .unwrap();
}

/// A raw fatbin of zstd-compressed cubins, as CUDA 13 writes them: one whole frame, one
/// cut short, one with a damaged frame header.
fn zstd_fatbin() -> Vec<u8> {
    let mut cubin = vec![0u8; 600];
    cubin[..9].copy_from_slice(b"\x7fELF\x02\x01\x01\x41\x08");
    cubin[48..52].copy_from_slice(&0x0600_640au32.to_le_bytes());
    let frame = zstd::bulk::compress(&cubin, 3).unwrap();
    let mut bad = frame.clone();
    bad[4] |= 0x08; // the frame header's reserved bit: libzstd refuses the frame
    let mut body = Vec::new();
    for payload in [frame.clone(), frame[..frame.len() / 2].to_vec(), bad] {
        let mut h = [0u8; 64];
        h[0] = 2; // cubin
        h[4] = 64; // header size
        h[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        h[16..20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        h[28] = 100; // sm_100
        h[40..48].copy_from_slice(&0x0020_8011u64.to_le_bytes()); // zstd, family
        body.extend_from_slice(&h);
        body.extend_from_slice(&payload);
    }
    let mut fatbin = 0xBA55_ED50u32.to_le_bytes().to_vec();
    fatbin.extend_from_slice(&[1, 0, 16, 0]);
    fatbin.extend_from_slice(&(body.len() as u64).to_le_bytes());
    fatbin.extend_from_slice(&body);
    fatbin
}

/// Raw fatbins are read too; CUDA 13's zstd entries are named from their cubin.
#[test]
fn raw_zstd_fatbin_names_cubins_from_their_elf_header() {
    let ins = inspect::inspect_bytes(&zstd_fatbin()).unwrap();
    let sass: Vec<String> = ins
        .gpu_code
        .sass
        .iter()
        .map(|e| format!("{}x{}", e.target, e.count))
        .collect();
    // The whole frame names sm_100a; the damaged ones fall back to the header's name,
    // plain as cuobjdump would list a family cubin, and a warning says so.
    assert_eq!(sass, ["sm_100x2", "sm_100ax1"]);
    assert!(
        ins.gpu_code
            .warnings
            .iter()
            .any(|w| w.starts_with("2 cubin(s) could not be decoded")),
        "{:?}",
        ins.gpu_code.warnings
    );
}

/// The committed fuzz seeds (including inputs that once crashed) never panic.
#[test]
fn fuzz_seeds_do_not_panic() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/inspect_elf");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        let _ = inspect::inspect_bytes(&bytes);
        n += 1;
    }
    assert!(n > 0, "no seeds in {}", dir.display());
}
