//! Stand-ins for the libraries whose loading `tests/loader_matrix` checks, compiled with `cc`
//! into one directory per case (a [`Lab`]): NCCL stand-ins with a self-id and a distinct
//! version each, a `libtorch_cuda.so` calling them, intermediate libraries, and a program
//! whose `main` prints `version=<code>` from `torch_nccl_version()`.
//!
//! Every library is linked against empty link-time stubs (in `.link/`, on no run-time
//! search path) for its `DT_NEEDED` entries, so where each run-time copy lives is decided
//! by the case alone.
#![allow(dead_code)]

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::process::Command;

/// An NCCL version; `code()` is what `ncclGetVersion` returns (X*10000 + Y*100 + Z).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ver(pub u32, pub u32, pub u32);

impl Ver {
    pub fn code(self) -> u32 {
        self.0 * 10000 + self.1 * 100 + self.2
    }

    pub fn dotted(self) -> String {
        format!("{}.{}.{}", self.0, self.1, self.2)
    }

    pub fn from_code(code: u32) -> Ver {
        Ver(code / 10000, code % 10000 / 100, code % 100)
    }
}

/// Which NCCL functions a stand-in defines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Funcs {
    /// `ncclGetVersion` and `ncclCommInitRank`.
    Both,
    /// `ncclGetVersion` only (a partial preload: calls then bind to two objects).
    GetVersionOnly,
}

/// The C source of an NCCL stand-in: the self-id NCCL carries in `.rodata`
/// (`NCCL version X.Y.Z+cudaA.B`) and the functions, each preceded by `attr` (a visibility
/// attribute, or nothing).
pub fn nccl_source(v: Ver, funcs: Funcs, attr: &str) -> String {
    let cuda = format!("12.{}", v.2 % 10);
    let mut s = format!(
        "__attribute__((used)) static const char fdl_nccl_self_id[] = \"NCCL version {}+cuda{cuda}\";\n\
         {attr} int ncclGetVersion(int *v) {{ *v = {}; return 0; }}\n",
        v.dotted(),
        v.code()
    );
    if funcs == Funcs::Both {
        s.push_str(&format!(
            "{attr} int ncclCommInitRank(void **c, int n, int id, int r) {{ *c = 0; return n - 1 + id + r; }}\n"
        ));
    }
    s
}

const NCCL_DECLS: &str =
    "int ncclGetVersion(int *v);\nint ncclCommInitRank(void **c, int n, int id, int r);\n";

/// libtorch's side: an exported function calling both NCCL functions, so that the real
/// loader shows where each binds (lazy binding shows a call only when it is made).
pub const CALLER: &str = "int torch_nccl_version(void) { int v = 0; void *c = 0; ncclGetVersion(&v); ncclCommInitRank(&c, 1, 0, 0); return v; }\n";

/// A libtorch that loads NCCL with `dlopen` at run time, as some builds do: nothing in its
/// dynamic section names libnccl.
pub const DLOPEN_CALLER: &str = r#"#include <dlfcn.h>
#include <stdio.h>
int torch_nccl_version(void) {
  void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return -1; }
  int (*get)(int *) = (int (*)(int *))dlsym(h, "ncclGetVersion");
  if (!get) return -2;
  int v = 0;
  get(&v);
  return v;
}
"#;

const MAIN: &str = "#include <stdio.h>\nint torch_nccl_version(void);\nint main(void) { printf(\"version=%d\\n\", torch_nccl_version()); return 0; }\n";

/// The ELF header of a 32-bit (ELFCLASS32) i386 shared object, padded to 64 bytes: glibc
/// reads `sizeof(Elf64_Ehdr)` = 64 bytes before it looks at the class, and a shorter file
/// is rejected as "file too short" instead (observed with glibc 2.36), which would test
/// something else.
pub fn elf32_header() -> Vec<u8> {
    let mut h = vec![
        0x7f, b'E', b'L', b'F', 1, /* ELFCLASS32 */
        1, /* LSB */
        1, 0,
    ];
    h.extend([0u8; 8]);
    let half = |v: u16| v.to_le_bytes();
    let word = |v: u32| v.to_le_bytes();
    h.extend(half(3)); // e_type ET_DYN
    h.extend(half(3)); // e_machine EM_386
    h.extend(word(1)); // e_version
    h.extend(word(0)); // e_entry
    h.extend(word(0)); // e_phoff
    h.extend(word(0)); // e_shoff
    h.extend(word(0)); // e_flags
    h.extend(half(52)); // e_ehsize
    h.extend(half(32)); // e_phentsize
    h.extend(half(0)); // e_phnum
    h.extend(half(40)); // e_shentsize
    h.extend(half(0)); // e_shnum
    h.extend(half(0)); // e_shstrndx
    assert_eq!(h.len(), 52);
    h.resize(64, 0);
    h
}

/// One case's directory and what was built in it.
pub struct Lab {
    _dir: tempfile::TempDir,
    root: PathBuf,
    stubs: PathBuf,
    made: RefCell<Vec<(Ver, PathBuf)>>,
}

impl Default for Lab {
    fn default() -> Self {
        Self::new()
    }
}

impl Lab {
    pub fn new() -> Lab {
        let dir = tempfile::tempdir().unwrap();
        // Canonical, so paths compare with what the loader and fdl print.
        let root = dir.path().canonicalize().unwrap();
        let stubs = root.join(".link");
        std::fs::create_dir_all(&stubs).unwrap();
        Lab {
            _dir: dir,
            root,
            stubs,
            made: RefCell::new(Vec::new()),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `rel` under the lab (absolute paths and `$ORIGIN…` pass through).
    pub fn path(&self, rel: &str) -> PathBuf {
        if rel.starts_with('/') {
            PathBuf::from(rel)
        } else {
            self.root.join(rel)
        }
    }

    /// `rel` under the lab, as a string for an environment variable.
    pub fn s(&self, rel: &str) -> String {
        self.path(rel).to_str().unwrap().to_string()
    }

    pub fn mkdir(&self, rel: &str) -> PathBuf {
        let p = self.path(rel);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    fn search_list(&self, dirs: &[&str]) -> String {
        dirs.iter()
            .map(|d| {
                if d.starts_with('$') {
                    d.to_string()
                } else {
                    self.s(d)
                }
            })
            .collect::<Vec<_>>()
            .join(":")
    }

    /// Linker flag for a `DT_RPATH` of `dirs` (relative to the lab, or `$ORIGIN…`).
    pub fn rpath(&self, dirs: &[&str]) -> String {
        format!("-Wl,--disable-new-dtags,-rpath,{}", self.search_list(dirs))
    }

    /// Linker flag for a `DT_RUNPATH` of `dirs`.
    pub fn runpath(&self, dirs: &[&str]) -> String {
        format!("-Wl,--enable-new-dtags,-rpath,{}", self.search_list(dirs))
    }

    fn stub(&self, soname: &str) -> PathBuf {
        let p = self.stubs.join(soname);
        if !p.exists() {
            compile(
                "int fdl_link_time_stub;\n",
                &p,
                &["-shared", "-fPIC", &format!("-Wl,-soname,{soname}")],
            );
        }
        p
    }

    /// Compiles a shared library at `rel` from `source`, with `soname` (if any), a
    /// `DT_NEEDED` for each of `needed` in that order, and extra `flags`.
    pub fn lib(
        &self,
        rel: &str,
        soname: Option<&str>,
        source: &str,
        needed: &[&str],
        flags: &[String],
    ) -> PathBuf {
        let out = self.path(rel);
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let mut args: Vec<String> = vec!["-shared".into(), "-fPIC".into()];
        if let Some(so) = soname {
            args.push(format!("-Wl,-soname,{so}"));
        }
        args.extend(flags.iter().cloned());
        args.push(format!("-L{}", self.stubs.display()));
        args.push("-Wl,--no-as-needed".into());
        for n in needed {
            self.stub(n);
            args.push(format!("-l:{n}"));
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        compile(source, &out, &refs);
        out
    }

    /// An NCCL stand-in at `rel` whose soname is its file name, defining both functions.
    pub fn nccl(&self, rel: &str, v: Ver) -> PathBuf {
        let name = Path::new(rel).file_name().unwrap().to_str().unwrap();
        self.nccl_as(rel, v, name, Funcs::Both, &[])
    }

    /// An NCCL stand-in at `rel` with `soname`, defining `funcs`, needing `needed`.
    pub fn nccl_as(
        &self,
        rel: &str,
        v: Ver,
        soname: &str,
        funcs: Funcs,
        needed: &[&str],
    ) -> PathBuf {
        let p = self.lib(
            rel,
            Some(soname),
            &nccl_source(v, funcs, ""),
            needed,
            &["-O1".into()],
        );
        self.record(v, &p);
        p
    }

    fn record(&self, v: Ver, p: &Path) {
        let mut made = self.made.borrow_mut();
        assert!(
            made.iter().all(|(w, _)| *w != v),
            "fixture: version {} used twice in one case",
            v.dotted()
        );
        made.push((v, p.to_path_buf()));
    }

    /// The stand-in built with version `code`, if any.
    pub fn file_of(&self, code: u32) -> Option<PathBuf> {
        self.made
            .borrow()
            .iter()
            .find(|(v, _)| v.code() == code)
            .map(|(_, p)| p.clone())
    }

    /// A libtorch_cuda.so (soname `libtorch_cuda.so`) importing NCCL's functions, with
    /// `needed` and `flags` (search paths).
    pub fn torch(&self, rel: &str, needed: &[&str], flags: &[String]) -> PathBuf {
        let mut f = vec!["-O1".to_string()];
        f.extend(flags.iter().cloned());
        self.lib(
            rel,
            Some("libtorch_cuda.so"),
            &format!("{NCCL_DECLS}{CALLER}"),
            needed,
            &f,
        )
    }

    /// A libtorch_cuda.so with NCCL `v` compiled in, its functions preceded by `attr`,
    /// linked with `link`. `-O0`: gcc then calls a default-visibility function of the same
    /// file through the PLT, as `-fPIC` code may always do.
    pub fn torch_static(&self, rel: &str, v: Ver, attr: &str, link: &[String]) -> PathBuf {
        let mut f = vec!["-O0".to_string()];
        f.extend(link.iter().cloned());
        let source = format!("{}{CALLER}", nccl_source(v, Funcs::Both, attr));
        let p = self.lib(rel, Some("libtorch_cuda.so"), &source, &[], &f);
        self.record(v, &p);
        p
    }

    /// A libtorch_cuda.so (soname `libtorch_cuda.so`) built from `source` as it is, with
    /// `needed` and `flags`; `carries` is the version of the NCCL stand-in compiled into
    /// it (see [`nccl_source`]), if any, so that [`Lab::file_of`] finds it.
    pub fn torch_from(
        &self,
        rel: &str,
        carries: Option<Ver>,
        source: &str,
        needed: &[&str],
        flags: &[String],
    ) -> PathBuf {
        let p = self.lib(rel, Some("libtorch_cuda.so"), source, needed, flags);
        if let Some(v) = carries {
            self.record(v, &p);
        }
        p
    }

    /// A libtorch_cuda.so that `dlopen`s libnccl.so.2, with search `flags`.
    pub fn torch_dlopen(&self, rel: &str, flags: &[String]) -> PathBuf {
        let mut f = vec!["-O1".to_string()];
        f.extend(flags.iter().cloned());
        f.push("-ldl".into());
        self.lib(rel, Some("libtorch_cuda.so"), DLOPEN_CALLER, &[], &f)
    }

    /// The program of library mode: no RPATH/RUNPATH, its first `DT_NEEDED` the library
    /// at `torch` by that very path (ld records a path given on its command line as the
    /// `DT_NEEDED` entry of a library that has no soname, so `torch` is linked through a
    /// soname-less stand-in at that path, then put back).
    pub fn program_by_path(&self, torch: &Path) -> PathBuf {
        let out = self.path("bin/prog");
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let saved = self.path(".link/torch-saved");
        // Whatever is at `torch` (a file or a symlink) is set aside, not followed.
        std::fs::rename(torch, &saved).unwrap();
        compile(
            "int torch_nccl_version(void) { return 0; }\n",
            torch,
            &["-shared", "-fPIC"],
        );
        compile(MAIN, &out, &["-Wl,--no-as-needed", torch.to_str().unwrap()]);
        std::fs::rename(&saved, torch).unwrap();
        let dynamic = readelf_d(&out);
        let first = dynamic
            .lines()
            .find(|l| l.contains("(NEEDED)"))
            .unwrap_or_default();
        assert!(
            first.contains(&format!("[{}]", torch.display())),
            "fixture: the program's first DT_NEEDED is not {}: {dynamic}",
            torch.display()
        );
        assert!(
            !dynamic.contains("RPATH") && !dynamic.contains("RUNPATH"),
            "fixture: {dynamic}"
        );
        out
    }

    /// A program at `rel` needing `libtorch_cuda.so` by soname, linked against the one in
    /// `torch_dir`, with its own search `flags`.
    pub fn program(&self, rel: &str, torch_dir: &str, flags: &[String]) -> PathBuf {
        let out = self.path(rel);
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let mut args: Vec<String> = flags.to_vec();
        args.push(format!("-L{}", self.s(torch_dir)));
        args.push(format!("-Wl,-rpath-link,{}", self.stubs.display()));
        args.push("-Wl,--allow-shlib-undefined".into());
        args.push("-Wl,--no-as-needed".into());
        args.push("-l:libtorch_cuda.so".into());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        compile(MAIN, &out, &refs);
        out
    }

    /// A 32-bit ELF named like `rel` (see [`elf32_header`]).
    pub fn elf32(&self, rel: &str) -> PathBuf {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, elf32_header()).unwrap();
        p
    }
}

/// A program whose `main` `dlopen`s the library at `plugin` (an absolute path) and prints
/// `version=<code>` from its `torch_nccl_version()`: a process that can load code no file
/// names, as Python does.
pub fn dlopen_main(plugin: &Path) -> String {
    format!(
        r#"#include <dlfcn.h>
#include <stdio.h>
int main(void) {{
  void *h = dlopen("{}", RTLD_NOW);
  if (!h) {{ fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }}
  int (*f)(void) = (int (*)(void))dlsym(h, "torch_nccl_version");
  if (!f) return 2;
  printf("version=%d\n", f());
  return 0;
}}
"#,
        plugin.display()
    )
}

/// The symbol names `readelf -r -W` shows on the relocation lines of `path`.
pub fn relocated_names(path: &Path) -> Vec<String> {
    let out = Command::new("readelf")
        .args(["-r", "-W"])
        .arg(path)
        .output()
        .expect("readelf (binutils) is needed for these tests");
    assert!(out.status.success(), "readelf -r {}", path.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .map(|n| n.split('@').next().unwrap_or(n).to_string())
        .collect()
}

/// `cc` on `source` into `out` with `args`; panics with cc's output on failure.
pub fn compile(source: &str, out: &Path, args: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.c");
    std::fs::write(&src, source).unwrap();
    let o = Command::new("cc")
        .arg("-o")
        .arg(out)
        .arg(&src)
        .args(args)
        .output()
        .expect("a C compiler (cc) is needed for these tests");
    assert!(
        o.status.success(),
        "cc {args:?} -o {} failed: {}",
        out.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

pub fn readelf_d(path: &Path) -> String {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(path)
        .output()
        .expect("readelf (binutils) is needed for these tests");
    assert!(out.status.success(), "readelf -d {}", path.display());
    String::from_utf8_lossy(&out.stdout).into_owned()
}
