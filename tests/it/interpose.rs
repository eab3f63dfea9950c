//! `fdl::inspect::interpose`: does an `LD_PRELOAD`ed libnccl.so.2 take effect for a
//! library? Fixtures are compiled here with `cc` for each way a library can bind its
//! NCCL calls (imported, exported through the PLT, hidden, -Bsymbolic,
//! -Bsymbolic-functions, protected), each checked with `readelf` to be what it claims;
//! the ignored oracle test analyses real libtorch_cuda.so files and compares with
//! `readelf`'s listing.

use crate::common;
use common::{compile_shared, oracle_input};
use fdl::inspect::interpose::{
    analyze, analyze_bytes, exported_nccl_symbols, Binding, Interposition, SymbolBinding, Verdict,
};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const DECLS: &str =
    "int ncclGetVersion(int *v);\nint ncclCommInitRank(void **c, int n, int id, int r);\n";
/// libtorch's side: an exported function calling NCCL.
const CALLER: &str = "int torch_nccl_version(void) { int v = 0; void *c; ncclGetVersion(&v); ncclCommInitRank(&c, 1, 2, 3); return v; }\n";
const BOTH: [&str; 2] = ["ncclCommInitRank", "ncclGetVersion"];

/// The two NCCL functions, each preceded by `attr`.
fn nccl_defs(attr: &str) -> String {
    format!(
        "{attr} int ncclGetVersion(int *v) {{ *v = 22705; return 0; }}\n{attr} int ncclCommInitRank(void **c, int n, int id, int r) {{ *c = 0; return n + id + r; }}\n"
    )
}

/// A libtorch_cuda.so with NCCL compiled in. `-O0`: gcc then calls a default-visibility
/// function of the same file through the PLT, as `-fPIC` code without
/// `-fno-semantic-interposition` may always do.
fn static_lib(dir: &Path, name: &str, attr: &str, link: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let mut extra = vec!["-O0"];
    extra.extend_from_slice(link);
    compile_shared(&format!("{}{CALLER}", nccl_defs(attr)), &out, &extra);
    out
}

/// A stand-in libnccl.so.2 (in `dir`) and a pip-style libtorch_cuda.so importing from it.
fn pip_style(dir: &Path) -> (PathBuf, PathBuf) {
    let stub = dir.join("libnccl.so.2");
    let source = format!(
        "{}{}",
        nccl_defs(""),
        r#"int pncclGetVersion(int *v) { return ncclGetVersion(v); }
__attribute__((visibility("protected"))) int ncclCommDestroy(void *c) { (void)c; return 0; }
__attribute__((visibility("hidden"))) int ncclHiddenHelper(void) { return 1; }
int ncclDebugLevel = 3;
int notNccl(void) { return ncclHiddenHelper(); }
"#
    );
    compile_shared(&source, &stub, &["-Wl,-soname,libnccl.so.2"]);
    let lib = dir.join("libtorch_cuda.so");
    let search = format!("-L{}", dir.display());
    compile_shared(
        &format!("{DECLS}{CALLER}"),
        &lib,
        &["-O0", &search, "-l:libnccl.so.2"],
    );
    (stub, lib)
}

fn readelf(args: &[&str], path: &Path) -> String {
    let out = Command::new("readelf")
        .args(args)
        .arg(path)
        .output()
        .expect("readelf (binutils) is needed for these tests");
    assert!(
        out.status.success(),
        "readelf {args:?} {} failed",
        path.display()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The symbol names `readelf -r -W` shows on relocation lines of type `ty`.
fn relocated_by(path: &Path, ty: &str) -> BTreeSet<String> {
    readelf(&["-r", "-W"], path)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&ty)).then(|| f.get(4).map(|n| strip_version(n).to_string()))?
        })
        .collect()
}

fn strip_version(name: &str) -> &str {
    name.split('@').next().unwrap_or(name)
}

fn all(names: &[&str], binding: Binding) -> Vec<SymbolBinding> {
    names
        .iter()
        .map(|n| SymbolBinding {
            name: n.to_string(),
            binding: binding.clone(),
        })
        .collect()
}

fn bound_locally(why: &str) -> Binding {
    Binding::BoundLocally { why: why.into() }
}

/// Asserts the verdict is PreloadIneffective for exactly `names`, with `why` saying `because`.
fn assert_ineffective(got: &Interposition, names: &[&str], because: &str) {
    match &got.verdict {
        Verdict::PreloadIneffective { bound, why } => {
            assert_eq!(bound, names, "{got:#?}");
            assert!(why.contains(because), "{why}");
        }
        other => panic!("expected PreloadIneffective, got {other:?}: {got:#?}"),
    }
}

/// (a) pip torch: NCCL functions undefined, imported from libnccl.so.2.
#[test]
fn imported_nccl_is_replaced_by_a_preload() {
    let dir = tempfile::tempdir().unwrap();
    let (stub, lib) = pip_style(dir.path());
    assert!(readelf(&["-d"], &lib).contains("[libnccl.so.2]"));
    let got = analyze(&lib).unwrap();
    assert_eq!(got.verdict, Verdict::PreloadTakesEffect, "{got:#?}");
    assert_eq!(got.imported, BOTH);
    assert_eq!(got.symbols, all(&BOTH, Binding::Imported));
    assert!(!got.symbolic && !got.symbolic_functions_hint);
    // The stub offers everything the library needs.
    let offered = exported_nccl_symbols(&stub).unwrap();
    assert!(
        got.imported.iter().all(|n| offered.contains(n)),
        "{offered:?}"
    );
}

/// (b) NCCL compiled in with default visibility, called through the PLT.
#[test]
fn exported_nccl_called_through_the_plt_is_interposable() {
    let dir = tempfile::tempdir().unwrap();
    let lib = static_lib(dir.path(), "libtorch_cuda.so", "", &[]);
    let slots = relocated_by(&lib, "R_X86_64_JUMP_SLOT");
    assert!(
        BOTH.iter().all(|n| slots.contains(*n)),
        "fixture: {slots:?}"
    );
    let got = analyze(&lib).unwrap();
    assert_eq!(got.verdict, Verdict::PreloadTakesEffect, "{got:#?}");
    assert_eq!(got.symbols, all(&BOTH, Binding::Interposable));
    assert!(got.imported.is_empty());
    assert!(!got.symbolic && !got.symbolic_functions_hint);
}

/// (c) NCCL compiled in with hidden visibility, as static libtorch builds do.
#[test]
fn hidden_nccl_is_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let hidden = r#"__attribute__((visibility("hidden")))"#;
    let lib = static_lib(dir.path(), "libtorch_cuda.so", hidden, &[]);
    let dynsyms = readelf(&["--dyn-syms", "-W"], &lib);
    assert!(!dynsyms.contains(" ncclGetVersion"), "fixture: {dynsyms}");
    let got = analyze(&lib).unwrap();
    let why = "not exported (only in .symtab: hidden visibility, static, or local by a version script); calls bind inside the library";
    assert_eq!(got.symbols, all(&BOTH, bound_locally(why)));
    assert_ineffective(&got, &BOTH, why);
    assert!(got.imported.is_empty());
}

/// (c, stripped) Hidden and stripped: no table names NCCL's functions, but its self-id
/// says it is compiled in.
#[test]
fn stripped_hidden_nccl_is_found_by_its_self_id() {
    let dir = tempfile::tempdir().unwrap();
    let source = format!(
        "const char nccl_self_id[] = \"NCCL version 2.27.5+cuda12.9\";\n{}{CALLER}",
        nccl_defs("")
    );
    let lib = dir.path().join("libtorch_cuda.so");
    compile_shared(&source, &lib, &["-O0", "-fvisibility=hidden", "-s"]);
    assert!(!readelf(&["-s", "-W"], &lib).contains("nccl"), "fixture");
    let got = analyze(&lib).unwrap();
    assert!(got.symbols.is_empty());
    assert_ineffective(&got, &[], "NCCL 2.27.5+cuda12.9 is compiled in");
}

/// (d) -Bsymbolic: the linker binds the library's references to its own definitions.
#[test]
fn bsymbolic_keeps_nccl_calls_inside() {
    let dir = tempfile::tempdir().unwrap();
    let lib = static_lib(dir.path(), "libtorch_cuda.so", "", &["-Wl,-Bsymbolic"]);
    let dynamic = readelf(&["-d"], &lib);
    assert!(dynamic.contains("(SYMBOLIC)"), "fixture: {dynamic}");
    let got = analyze(&lib).unwrap();
    assert!(got.symbolic);
    assert!(!got.symbolic_functions_hint);
    assert_ineffective(&got, &BOTH, "-Bsymbolic (DF_SYMBOLIC");
}

/// (e) -Bsymbolic-functions: no flag, but no relocation names the functions either.
#[test]
fn bsymbolic_functions_keeps_nccl_calls_inside() {
    let dir = tempfile::tempdir().unwrap();
    let link = ["-Wl,-Bsymbolic-functions"];
    let lib = static_lib(dir.path(), "libtorch_cuda.so", "", &link);
    assert!(!readelf(&["-d"], &lib).contains("SYMBOLIC"), "fixture");
    assert!(!readelf(&["-r", "-W"], &lib).contains("nccl"), "fixture");
    assert!(readelf(&["--dyn-syms", "-W"], &lib).contains(" ncclGetVersion"));
    let got = analyze(&lib).unwrap();
    assert!(!got.symbolic);
    assert!(got.symbolic_functions_hint);
    // No relocation names them, but the code calls both entries directly.
    let why = "called directly: no relocation names it, and the library's code refers to its entry (a call bound at link time: -Bsymbolic-functions, --dynamic-list or -fno-semantic-interposition)";
    assert_eq!(got.symbols, all(&BOTH, bound_locally(why)));
    assert_ineffective(&got, &BOTH, why);
}

/// (e') Defined and exported, but called by nothing in the library: no relocation, no
/// reference in the code, no address in data. Not a call: a preload has nothing to
/// replace, and no "bound at link time" is claimed.
#[test]
fn exported_but_never_called_is_no_call() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("libtorch_cuda.so");
    let source = format!(
        "{}int ncclCommFinalize(void *c) {{ return c != 0; }}\n{CALLER}",
        nccl_defs("")
    );
    for link in [&[][..], &["-Wl,-Bsymbolic-functions"][..]] {
        let mut extra = vec!["-O0"];
        extra.extend_from_slice(link);
        compile_shared(&source, &lib, &extra);
        assert!(
            !readelf(&["-r", "-W"], &lib).contains("ncclCommFinalize"),
            "fixture"
        );
        let got = analyze(&lib).unwrap();
        let finalize = got.symbols.iter().find(|s| s.name == "ncclCommFinalize");
        assert_eq!(
            finalize.map(|s| &s.binding),
            Some(&Binding::NeverCalled),
            "{link:?}: {got:#?}"
        );
        if link.is_empty() {
            // The two it calls go through the PLT: a preload replaces every call made.
            assert_eq!(got.verdict, Verdict::PreloadTakesEffect, "{got:#?}");
        } else {
            assert_ineffective(&got, &BOTH, "called directly");
            assert!(got.symbolic_functions_hint);
        }
    }
}

/// (f) Protected visibility: exported, but the library's own calls bind locally.
#[test]
fn protected_nccl_is_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let protected = r#"__attribute__((visibility("protected")))"#;
    let lib = static_lib(dir.path(), "libtorch_cuda.so", protected, &[]);
    assert!(readelf(&["--dyn-syms", "-W"], &lib).contains("PROTECTED"));
    let got = analyze(&lib).unwrap();
    assert_ineffective(&got, &BOTH, "protected visibility");
    assert!(!got.symbolic);
}

/// (g) No NCCL: a data object named like NCCL's is not a function.
#[test]
fn library_without_nccl() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("libc10.so");
    compile_shared(
        "int ncclDebugLevel = 3;\nint add(int a, int b) { return a + b + ncclDebugLevel; }\n",
        &lib,
        &[],
    );
    let got = analyze(&lib).unwrap();
    assert_eq!(got.verdict, Verdict::NoNccl, "{got:#?}");
    assert!(got.symbols.is_empty() && got.imported.is_empty());
    assert!(exported_nccl_symbols(&lib).unwrap().is_empty());
}

/// (h) What a preloaded libnccl.so.2 offers: exported functions, default or protected,
/// not hidden ones, not data.
#[test]
fn exported_functions_of_a_libnccl() {
    let dir = tempfile::tempdir().unwrap();
    let (stub, _) = pip_style(dir.path());
    assert_eq!(
        exported_nccl_symbols(&stub).unwrap(),
        [
            "ncclCommDestroy",
            "ncclCommInitRank",
            "ncclGetVersion",
            "pncclGetVersion"
        ]
    );
}

/// Without section headers, the tables are found as the loader finds them: DT_SYMTAB
/// (counted through DT_GNU_HASH or DT_HASH), DT_STRTAB, DT_JMPREL, DT_RELA.
#[test]
fn answers_need_only_the_dynamic_table() {
    let dir = tempfile::tempdir().unwrap();
    let (_, pip) = pip_style(dir.path());
    let mut libs = vec![pip];
    for (name, link) in [
        ("gnu.so", "-Wl,--hash-style=gnu"),
        ("sysv.so", "-Wl,--hash-style=sysv"),
        ("bsf.so", "-Wl,-Bsymbolic-functions"),
        ("bs.so", "-Wl,-Bsymbolic"),
    ] {
        libs.push(static_lib(dir.path(), name, "", &[link]));
    }
    assert!(readelf(&["-d"], &libs[2]).contains("(HASH)"), "fixture");
    assert!(!readelf(&["-d"], &libs[2]).contains("GNU_HASH"), "fixture");
    for lib in libs {
        let with_sections = analyze(&lib).unwrap();
        let mut bytes = std::fs::read(&lib).unwrap();
        // e_shoff, e_shnum, e_shstrndx of an ELF64 header: no section table.
        bytes[0x28..0x30].fill(0);
        bytes[0x3c..0x40].fill(0);
        let without = analyze_bytes(&bytes).unwrap();
        assert_eq!(without, with_sections, "{}", lib.display());
    }
}

/// aarch64 numbers its relocations differently (JUMP_SLOT 1026, GLOB_DAT 1025, ABS64
/// 257): an x86-64 fixture relabelled as aarch64, relocations renumbered, answers alike;
/// relabelled without renumbering, its x86-64 JUMP_SLOTs (7) bind nothing on aarch64.
#[test]
fn aarch64_relocations_are_read_by_their_own_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let lib = static_lib(dir.path(), "libtorch_cuda.so", "", &[]);
    let x86 = analyze(&lib).unwrap();
    assert_eq!(x86.verdict, Verdict::PreloadTakesEffect);
    let bytes = std::fs::read(&lib).unwrap();
    let mut arm = bytes.clone();
    arm[0x12..0x14].copy_from_slice(&183u16.to_le_bytes()); // EM_AARCH64
    let relabelled = arm.clone();
    let rd = |b: &[u8], at: usize, n: usize| {
        b[at..at + n]
            .iter()
            .rev()
            .fold(0u64, |v, &x| v << 8 | u64::from(x)) as usize
    };
    let (shoff, shnum) = (rd(&bytes, 0x28, 8), rd(&bytes, 0x3c, 2));
    let mut renumbered = 0;
    for k in 0..shnum {
        let sh = shoff + k * 64;
        if rd(&bytes, sh + 4, 4) != 4 {
            continue; // not SHT_RELA
        }
        let (off, size) = (rd(&bytes, sh + 0x18, 8), rd(&bytes, sh + 0x20, 8));
        for r in (off..off + size).step_by(24) {
            let ty = match rd(&bytes, r + 8, 4) {
                1 => 257u32, // R_X86_64_64 -> R_AARCH64_ABS64
                6 => 1025,   // GLOB_DAT
                7 => 1026,   // JUMP_SLOT
                8 => 1027,   // RELATIVE
                other => panic!("fixture has relocation type {other}"),
            };
            arm[r + 8..r + 12].copy_from_slice(&ty.to_le_bytes());
            renumbered += 1;
        }
    }
    assert!(renumbered > 0);
    assert_eq!(analyze_bytes(&arm).unwrap(), x86);
    // Relabelled only, no relocation names the functions on aarch64, and the x86-64
    // code read as aarch64 words refers to neither entry: nothing calls them.
    let got = analyze_bytes(&relabelled).unwrap();
    assert_eq!(got.symbols, all(&BOTH, Binding::NeverCalled), "{got:#?}");
    assert_eq!(got.verdict, Verdict::PreloadTakesEffect);
}

/// (j) A stripped library: no symbol covers its padding or its CFI-less code, the unwind
/// tables (`.eh_frame`) still bound every compiled function. Alignment padding before
/// an NCCL entry holds a NOP whose zero displacement reads as `call`-like `rel32 == 0`,
/// a reference to the entry right after it, as in real libnccl.so.2 (`cs nopw` before
/// ncclCommRegister) and gcc's own output (the padding after crtstuff's `frame_dummy`,
/// before the first function): it is padding, so nothing calls ncclCommFinalize or
/// ncclGetVersion. A hand-written function without CFI or symbol that does call
/// ncclCommWindowRegister directly is found by decoding the gap from its start. Before
/// fdl read FDEs, all three were "perhaps called" and the answer unknown.
#[test]
fn stripped_padding_is_no_call_and_cfi_less_code_is_decoded() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("libpadded.so");
    let source = r#"int ncclGetVersion(int *v) { *v = 22705; return 0; }
int helper(int x) { return x * 3 + 1; }
/* The padding as gas writes it before an aligned entry: its last four bytes (the 7-byte
   nopl's displacement) are a rel32 of 0 from the next byte, ncclCommFinalize's entry. */
__asm__(".p2align 4\n\t.byte 0x0f, 0x1f, 0x80, 0, 0, 0, 0\n");
int ncclCommFinalize(void *c) { return c != 0; }
int ncclCommWindowRegister(void *c) { return c == 0; }
/* No .cfi_startproc, no .type/.size, a local label: after strip nothing names it. */
__asm__(".p2align 4\nnocfi_caller:\n\tcall ncclCommWindowRegister\n\tret\n");
"#;
    // In source order, functions unaligned: the padding lies right before the entry.
    // -Bsymbolic-functions turns the asm's call into a direct one.
    compile_shared(
        source,
        &lib,
        &[
            "-fno-toplevel-reorder",
            "-fno-align-functions",
            "-Wl,-Bsymbolic-functions",
        ],
    );
    let strip = Command::new("strip")
        .arg("--strip-all")
        .arg(&lib)
        .status()
        .expect("strip (binutils) is needed for this test");
    assert!(strip.success());
    // The fixture is what it claims: no .symtab, FDEs, no relocation names the three,
    // the padding's displacement sits right before ncclCommFinalize, the asm's call is
    // direct and no FDE covers it.
    assert!(!readelf(&["-S", "-W"], &lib).contains(".symtab"), "fixture");
    let frames = readelf(&["--debug-dump=frames"], &lib);
    assert!(frames.contains(" FDE "), "fixture: {frames}");
    let relocs = readelf(&["-r", "-W"], &lib);
    for name in [
        "ncclCommFinalize",
        "ncclGetVersion",
        "ncclCommWindowRegister",
    ] {
        assert!(!relocs.contains(name), "fixture: {relocs}");
    }
    let entry = |name: &str| -> u64 {
        let syms = readelf(&["--dyn-syms", "-W"], &lib);
        let line = syms
            .lines()
            .find(|l| l.split_whitespace().nth(7) == Some(name))
            .unwrap_or_else(|| panic!("{name} not in {syms}"));
        u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
    };
    let bytes = std::fs::read(&lib).unwrap();
    // .text is mapped at its file offset in a small gcc library.
    let fin = entry("ncclCommFinalize") as usize;
    assert_eq!(
        &bytes[fin - 7..fin],
        [0x0f, 0x1f, 0x80, 0, 0, 0, 0],
        "fixture"
    );
    let fde_starts: Vec<u64> = frames
        .lines()
        .filter_map(|l| l.split("pc=").nth(1))
        .map(|r| u64::from_str_radix(r.split("..").next().unwrap(), 16).unwrap())
        .collect();
    let window = entry("ncclCommWindowRegister");
    let call = (fin..bytes.len() - 5)
        .find(|&i| {
            bytes[i] == 0xe8
                && i64::from(i32::from_le_bytes(bytes[i + 1..i + 5].try_into().unwrap()))
                    == window as i64 - (i as i64 + 5)
        })
        .expect("fixture: the asm's direct call") as u64;
    assert!(!fde_starts.contains(&call), "fixture: {frames}");

    let got = analyze(&lib).unwrap();
    let binding = |name: &str| {
        got.symbols
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.binding.clone())
    };
    assert_eq!(
        binding("ncclCommFinalize"),
        Some(Binding::NeverCalled),
        "{got:#?}"
    );
    assert_eq!(
        binding("ncclGetVersion"),
        Some(Binding::NeverCalled),
        "{got:#?}"
    );
    assert!(
        matches!(
            binding("ncclCommWindowRegister"),
            Some(Binding::BoundLocally { .. })
        ),
        "{got:#?}"
    );
    assert_ineffective(&got, &["ncclCommWindowRegister"], "called directly");
    // Without section headers the unwind tables come from PT_GNU_EH_FRAME: same answer.
    let mut headless = bytes.clone();
    headless[0x28..0x30].fill(0);
    headless[0x3c..0x40].fill(0);
    assert_eq!(analyze_bytes(&headless).unwrap(), got);
}

/// (i) Empty, garbage, 32-bit, truncated and corrupted files: a clear error or an
/// answer, never a panic.
#[test]
fn broken_files_are_refused_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.so");
    std::fs::write(&empty, b"").unwrap();
    let err = format!("{:#}", analyze(&empty).unwrap_err());
    assert!(err.contains("empty (0 bytes)"), "{err}");

    let garbage = dir.path().join("garbage.so");
    let noise: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&garbage, &noise).unwrap();
    let err = format!("{:#}", analyze(&garbage).unwrap_err());
    assert!(err.contains("not an ELF file"), "{err}");
    assert!(exported_nccl_symbols(&garbage).is_err());

    let (_, lib) = pip_style(dir.path());
    let good = std::fs::read(&lib).unwrap();
    let mut class32 = good.clone();
    class32[4] = 1; // ELFCLASS32
    let err = format!("{:#}", analyze_bytes(&class32).unwrap_err());
    assert!(err.contains("32-bit"), "{err}");

    // Every truncation loses at least the section headers at the end of the file.
    let cut = dir.path().join("cut.so");
    for len in (1..good.len()).step_by(97).chain([good.len() - 1]) {
        std::fs::write(&cut, &good[..len]).unwrap();
        let err = analyze(&cut).expect_err("a truncated library must be refused");
        let msg = format!("{err:#}");
        assert!(
            msg.contains("truncated")
                || msg.contains("shorter than")
                || msg.contains("past the end"),
            "{len}: {msg}"
        );
    }

    // Any single corrupted byte: an answer or an error, never a panic.
    for at in 0..good.len() {
        for value in [0x00, 0xff, 0x80] {
            let mut bad = good.clone();
            bad[at] = value;
            let _ = analyze_bytes(&bad);
        }
    }
}

/// Real libtorch_cuda.so files (torch 2.8.0 and 2.15.0 wheels): pip torch imports NCCL
/// from libnccl.so.2, so a preload takes effect. The imported set must equal the UND
/// nccl* functions `readelf --dyn-syms` lists, each must be named by a relocation in
/// `readelf -r`, and the libnccl.so.2 each torch is installed with must export them all.
#[test]
#[ignore = "needs the real NVIDIA inputs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn real_libtorch_imports_nccl_through_the_dynamic_linker() {
    let torch = oracle_input("FDL_TEST_TORCH_LIB");
    let torch13 = oracle_input("FDL_TEST_TORCH_LIB_CU13");
    // torch 2.8's NCCL: the nvidia-nccl-cu12 wheel; torch 2.15's: the one pip put beside it.
    let nccl = oracle_input("FDL_TEST_NCCL_LIB");
    let nccl13 = torch13
        .parent()
        .unwrap()
        .join("../../nvidia/nccl/lib/libnccl.so.2");
    assert!(
        nccl13.is_file(),
        "{} is missing: .ci/fetch-oracles installs torch 2.15 beside its nvidia-nccl-cu13",
        nccl13.display()
    );
    for (lib, its_nccl) in [(torch, nccl), (torch13, nccl13)] {
        let got = analyze(&lib).unwrap();
        eprintln!(
            "{}: {:?}, {} nccl* functions imported",
            lib.display(),
            got.verdict,
            got.imported.len()
        );
        let (und, defined) = readelf_nccl_functions(&lib);
        assert!(
            !und.is_empty(),
            "readelf lists no UND nccl* in {}",
            lib.display()
        );
        let imported: BTreeSet<String> = got.imported.iter().cloned().collect();
        assert_eq!(imported, und, "{}", lib.display());
        let ours_defined: BTreeSet<String> = got
            .symbols
            .iter()
            .filter(|s| s.binding != Binding::Imported)
            .map(|s| s.name.clone())
            .collect();
        assert_eq!(ours_defined, defined, "{}", lib.display());
        assert_eq!(
            got.verdict,
            Verdict::PreloadTakesEffect,
            "{}",
            lib.display()
        );
        assert!(!got.symbolic, "{}", lib.display());
        let dynamic = readelf(&["-d"], &lib);
        assert!(!dynamic.contains("SYMBOLIC"), "{}", lib.display());
        // Each import is called: a PLT slot (or GOT entry) names it.
        let mut named = relocated_by(&lib, "R_X86_64_JUMP_SLOT");
        named.extend(relocated_by(&lib, "R_X86_64_GLOB_DAT"));
        let unnamed: Vec<&String> = imported.iter().filter(|n| !named.contains(*n)).collect();
        assert!(unnamed.is_empty(), "{}: {unnamed:?}", lib.display());

        // exported_nccl_symbols against readelf, and the preload candidate covers all.
        let offered = exported_nccl_symbols(&its_nccl).unwrap();
        let (_, nccl_defined) = readelf_nccl_functions(&its_nccl);
        let offered_set: BTreeSet<String> = offered.iter().cloned().collect();
        assert_eq!(offered_set, nccl_defined, "{}", its_nccl.display());
        let missing: Vec<&String> = imported.difference(&offered_set).collect();
        assert!(
            missing.is_empty(),
            "{} lacks {missing:?}",
            its_nccl.display()
        );
    }
}

/// From `readelf --dyn-syms -W`: the undefined nccl* functions (FUNC or NOTYPE), and the
/// defined exported ones (FUNC or IFUNC, GLOBAL or WEAK, DEFAULT or PROTECTED).
fn readelf_nccl_functions(path: &Path) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut und = BTreeSet::new();
    let mut defined = BTreeSet::new();
    for line in readelf(&["--dyn-syms", "-W"], path).lines() {
        // Num: Value Size Type Bind Vis Ndx Name
        let f: Vec<&str> = line.split_whitespace().collect();
        let [_, _, _, ty, bind, vis, ndx, name, ..] = f.as_slice() else {
            continue;
        };
        let name = strip_version(name);
        if !(name.starts_with("nccl") || name.starts_with("pnccl")) {
            continue;
        }
        if *ndx == "UND" {
            if matches!(*ty, "FUNC" | "NOTYPE" | "IFUNC") {
                und.insert(name.to_string());
            }
        } else if matches!(*ty, "FUNC" | "IFUNC")
            && matches!(*bind, "GLOBAL" | "WEAK")
            && matches!(*vis, "DEFAULT" | "PROTECTED")
        {
            defined.insert(name.to_string());
        }
    }
    (und, defined)
}

/// Real libnccl.so.2 files (2.21.5, 2.27.5, cu13 2.28.9) against binutils. fdl's FDE
/// reader lists the same function ranges as `readelf --debug-dump=frames`, in number and
/// in each `pc=start..end`. And each exported function no relocation names is answered,
/// never "perhaps called": before fdl read FDEs, the `cs nopw` padding before
/// ncclCommRegister, ncclGroupStart and others read as `rel32 == 0` references nothing
/// could decode. The truth is `objdump -d` of the whole library: a function fdl says
/// nothing calls has no call, jump or address load of its entry anywhere in the listing;
/// one fdl says is called directly has one.
#[test]
#[ignore = "needs the real NVIDIA inputs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn real_libnccl_fdes_and_direct_calls_match_binutils() {
    use fdl::inspect::{elf, frames::Frames, source::Source};
    for var in [
        "FDL_TEST_NCCL_LIB_2215",
        "FDL_TEST_NCCL_LIB",
        "FDL_TEST_NCCL_LIB_CU13",
    ] {
        let lib = oracle_input(var);
        // readelf's FDEs of .eh_frame (not .debug_frame, if any).
        let dump = readelf(&["--debug-dump=frames"], &lib);
        let eh = dump
            .split("Contents of the ")
            .find(|s| s.starts_with(".eh_frame section"))
            .unwrap_or_else(|| panic!("{var}: no .eh_frame in readelf's output"));
        let mut want: Vec<(u64, u64)> = eh
            .lines()
            .filter(|l| l.contains(" FDE "))
            .filter_map(|l| l.split("pc=").nth(1))
            .map(|r| {
                let (a, b) = r.trim().split_once("..").unwrap();
                let hex = |s: &str| u64::from_str_radix(s, 16).unwrap();
                (hex(a), hex(b))
            })
            .collect();
        want.sort_unstable();
        assert!(want.len() > 1000, "{var}: {} FDEs", want.len());
        // Through the search table, and by the walk of .eh_frame alone.
        let (got, walked) = Source::with_file(&lib, |src| {
            let info = elf::parse(src)?;
            let frames = Frames::find(&info, src).expect("unwind tables");
            assert!(frames.has_search_table(), "{var}");
            let s = info
                .sections
                .iter()
                .find(|s| s.name == ".eh_frame")
                .unwrap();
            let bytes = src.bytes(s.offset, s.size)?;
            let walk = Frames::new(bytes, s.addr, None, gimli::RunTimeEndian::Little);
            assert!(!walk.has_search_table());
            Ok((
                frames.all().map_err(anyhow::Error::msg)?,
                walk.all().map_err(anyhow::Error::msg)?,
            ))
        })
        .unwrap();
        assert_eq!(got.len(), want.len(), "{var}: FDE count");
        assert_eq!(got, want, "{var}: FDE ranges");
        assert_eq!(walked, want, "{var}: FDE ranges by the walk");

        let answer = analyze(&lib).unwrap();
        let uncertain: Vec<_> = answer
            .symbols
            .iter()
            .filter(|s| matches!(s.binding, Binding::Uncertain { .. }))
            .collect();
        assert!(uncertain.is_empty(), "{var}: {uncertain:#?}");
        let entries: std::collections::BTreeMap<String, u64> = readelf(&["--dyn-syms", "-W"], &lib)
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let (value, ndx, name) = (f.get(1)?, f.get(6)?, f.get(7)?);
                (*ndx != "UND").then(|| {
                    (
                        strip_version(name).to_string(),
                        u64::from_str_radix(value, 16).ok(),
                    )
                })
            })
            .filter_map(|(n, v)| Some((n, v?)))
            .collect();
        let out = Command::new("objdump")
            .args(["-d", "--no-show-raw-insn"])
            .arg(&lib)
            .output()
            .expect("objdump (binutils) is needed for this test");
        assert!(out.status.success());
        let listing = String::from_utf8_lossy(&out.stdout);
        // `call   f5910 <…>`, `jmp …`, and `# f5910 <…>` after a RIP-relative operand;
        // label lines (`00000000000f5910 <…>:`) have no space before the address.
        let referred = |entry: u64| listing.contains(&format!(" {entry:x} <"));
        let (mut never, mut direct) = (0, 0);
        for s in &answer.symbols {
            let entry = entries[&s.name];
            match &s.binding {
                Binding::NeverCalled => {
                    never += 1;
                    assert!(
                        !referred(entry),
                        "{var}: fdl says nothing calls {} ({entry:#x}), objdump shows a reference",
                        s.name
                    );
                }
                Binding::BoundLocally { why } if why.contains("directly") => {
                    direct += 1;
                    assert!(referred(entry), "{var}: {} ({entry:#x}): {why}", s.name);
                }
                _ => {}
            }
        }
        eprintln!(
            "{var}: {} FDEs; {never} exported functions nothing calls, {direct} called directly",
            got.len()
        );
        assert!(never > 0, "{var}: {answer:#?}");
    }
}
