//! `fdl nccl detect` against glibc's own dynamic loader: a generated matrix of layouts
//! (search paths, preloads, breadth-first order, local binding, dlopen, …), each compiled
//! with `cc` into a temporary directory and run for real. The real process is the oracle:
//! it prints the version `ncclGetVersion` returned (every stand-in NCCL carries a distinct
//! one) and `LD_DEBUG=bindings` says which object the call bound to.
//!
//! Each case is a trial of its own (`case::<name>`, run side by side by libtest-mimic's
//! harness, `cargo test --test loader_matrix -- case::NAME` runs one), and its real process
//! runs once. It checks, in this order:
//! 1. the real process did what the case claims (so the fixture is what it says: e.g.
//!    that a RUNPATH really was not inherited): a failure here is the fixture's, said as
//!    such;
//! 2. fdl's `nccl.detection.version` is the printed version and its `file` the object
//!    LD_DEBUG names (or, for calls bound at link time, the object holding that version);
//! 3. where the process cannot start or loads NCCL with dlopen, fdl answers `unknown`
//!    with exit status 3 (split bindings: `split`, exit 3);
//! 4. fdl's `skipped_preloads` entries are the ones glibc printed as ignored;
//!    and fdl's `link_map`, restricted to the case's files, is the real load order
//!    (`LD_TRACE_LOADED_OBJECTS=1`).
//!
//! The evidence of each case (status, stdout, the nccl* binding lines, glibc's preload
//! errors, the traced link map, fdl's answer) is written to
//! `$CARGO_TARGET_TMPDIR/loader-matrix/<case>.log` and is part of every failure message.

#[path = "../common/mod.rs"]
mod common;
#[path = "../loader_fixture/mod.rs"]
mod loader_fixture;

use common::{fdl_in, oracle_input};
use libtest_mimic::{Arguments, Trial};
use loader_fixture::{compile, dlopen_main, relocated_names, Funcs, Lab, Ver};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

const V1: Ver = Ver(2, 27, 5);
const V2: Ver = Ver(2, 21, 5);
const V3: Ver = Ver(2, 30, 7);
const V4: Ver = Ver(2, 27, 3);

/// How a call reaches the object that answers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum How {
    /// Resolved by the loader at run time: LD_DEBUG prints a binding line for it.
    Runtime,
    /// Bound when the library was linked (hidden, protected, -Bsymbolic-functions): no
    /// relocation, so LD_DEBUG prints nothing for it.
    LinkTime,
}

/// What the real process does, written by hand per case.
#[derive(Clone, Debug)]
enum Expect {
    /// Runs, prints `version`, and `ncclGetVersion` (and every other nccl* call) is
    /// answered by `file`.
    Binds {
        version: Ver,
        file: PathBuf,
        how: How,
    },
    /// Runs, prints `version` from `get_version`, while `ncclCommInitRank` binds to
    /// `comm_init`, another object.
    Split {
        version: Ver,
        get_version: PathBuf,
        comm_init: PathBuf,
    },
    /// Exits `code` (127; 1 for a missing symbol version) without printing a version:
    /// the loader could not start it (or could not resolve a call); its error contains
    /// `stderr`.
    Fails { stderr: String, code: i32 },
    /// Runs and prints `version`, which it found with dlopen at run time in `file`.
    Dlopen { version: Ver, file: PathBuf },
    /// Runs and prints `version` from `local`, whose `ncclGetVersion` is bound at link time
    /// (no LD_DEBUG line), while `ncclCommInitRank`, called by name, binds to `comm_init`:
    /// two NCCLs in one process.
    SplitLocal {
        version: Ver,
        local: PathBuf,
        comm_init: PathBuf,
    },
    /// Runs and prints `version`: a library it `dlopen`s at run time (in no file's
    /// DT_NEEDED) calls `ncclGetVersion`, which binds to `file`, loaded at start.
    Later { version: Ver, file: PathBuf },
}

/// One case, built: what to run, how, and what must happen.
struct Setup {
    program: PathBuf,
    /// What fdl is given: the library (library mode) or the program (executable mode).
    object: PathBuf,
    preload: Option<String>,
    library_path: Option<String>,
    cwd: Option<PathBuf>,
    /// The preload elements glibc prints as ignored, in order.
    ignored: Vec<String>,
    /// Elements glibc drops without a word (over-long ones); fdl may list them or not.
    silently_dropped: Vec<String>,
    /// What fdl's `reason` must contain (for unknown answers).
    reason: Vec<&'static str>,
    /// nccl* functions defined but never called: not even `LD_BIND_NOW=1` binds them.
    never_called: Vec<&'static str>,
    expect: Expect,
}

impl Setup {
    /// Library mode: a program without RPATH/RUNPATH needing `torch` by path.
    fn library(lab: &Lab, torch: PathBuf, expect: Expect) -> Setup {
        let program = lab.program_by_path(&torch);
        Setup::new(program, torch, expect)
    }

    /// Executable mode: fdl is given the program itself.
    fn executable(program: PathBuf, expect: Expect) -> Setup {
        Setup::new(program.clone(), program, expect)
    }

    fn new(program: PathBuf, object: PathBuf, expect: Expect) -> Setup {
        Setup {
            program,
            object,
            preload: None,
            library_path: None,
            cwd: None,
            ignored: Vec::new(),
            silently_dropped: Vec::new(),
            reason: Vec::new(),
            never_called: Vec::new(),
            expect,
        }
    }

    fn preload(mut self, s: impl Into<String>) -> Self {
        self.preload = Some(s.into());
        self
    }

    fn library_path(mut self, s: impl Into<String>) -> Self {
        self.library_path = Some(s.into());
        self
    }

    fn cwd(mut self, dir: PathBuf) -> Self {
        self.cwd = Some(dir);
        self
    }

    fn ignored(mut self, entries: &[String]) -> Self {
        self.ignored = entries.to_vec();
        self
    }

    fn never_called(mut self, names: &[&'static str]) -> Self {
        self.never_called = names.to_vec();
        self
    }

    fn reason(mut self, parts: &[&'static str]) -> Self {
        self.reason = parts.to_vec();
        self
    }
}

type Build = Box<dyn Fn(&Lab) -> Setup>;

struct Case {
    name: String,
    claim: String,
    build: Build,
}

fn case(
    name: impl Into<String>,
    claim: impl Into<String>,
    build: impl Fn(&Lab) -> Setup + 'static,
) -> Case {
    Case {
        name: name.into(),
        claim: claim.into(),
        build: Box::new(build),
    }
}

fn binds(lab: &Lab, v: Ver, how: How) -> Expect {
    let file = lab
        .file_of(v.code())
        .unwrap_or_else(|| panic!("fixture: no stand-in of version {}", v.dotted()));
    Expect::Binds {
        version: v,
        file,
        how,
    }
}

fn fails(stderr: &str) -> Expect {
    fails_with(127, stderr)
}

fn fails_with(code: i32, stderr: &str) -> Expect {
    Expect::Fails {
        stderr: stderr.to_string(),
        code,
    }
}

const NOT_FOUND: &str = "libnccl.so.2: cannot open shared object file";

/// The pip layout: site/torch/lib/libtorch_cuda.so with RUNPATH
/// `$ORIGIN/../../nvidia/nccl/lib`, where the libnccl.so.2 of version `v` lies.
fn bundled(lab: &Lab, v: Ver) -> PathBuf {
    lab.nccl("site/nvidia/nccl/lib/libnccl.so.2", v);
    lab.torch(
        "site/torch/lib/libtorch_cuda.so",
        &["libnccl.so.2"],
        &[lab.runpath(&["$ORIGIN/../../nvidia/nccl/lib"])],
    )
}

/// Two directories, `one` (NCCL V1) and `two` (NCCL V2).
fn two_dirs(lab: &Lab) {
    lab.nccl("one/libnccl.so.2", V1);
    lab.nccl("two/libnccl.so.2", V2);
}

fn ver_of(dir: &str) -> Ver {
    if dir == "one" {
        V1
    } else {
        V2
    }
}

/// `dir/././…/libnccl.so.2`, exactly `len` bytes long.
fn padded_path(dir: &Path, len: usize) -> String {
    let head = dir.to_str().unwrap();
    let tail = "/libnccl.so.2";
    let room = len.checked_sub(head.len() + tail.len()).unwrap();
    let mut s = head.to_string();
    s.push_str(&"/.".repeat(room / 2));
    if room % 2 == 1 {
        s.push('/');
    }
    s.push_str(tail);
    assert_eq!(s.len(), len);
    s
}

fn cases() -> Vec<Case> {
    let mut c = Vec::new();

    // NCCL compiled in: into libtorch itself, one and two DT_NEEDED levels down.
    c.push(case(
        "static_in_libtorch",
        "NCCL compiled into libtorch_cuda.so, no libnccl: its own calls (through its PLT) bind to itself",
        |lab| {
            let torch = lab.torch_static("lib/libtorch_cuda.so", V1, "", &[]);
            Setup::library(lab, torch, binds(lab, V1, How::Runtime))
        },
    ));
    c.push(case(
        "static_one_level_down",
        "libtorch imports nccl*, libmid.so (its DT_NEEDED) has NCCL compiled in",
        |lab| {
            lab.nccl_as("lib/libmid.so", V1, "libmid.so", Funcs::Both, &[]);
            let torch = lab.torch(
                "lib/libtorch_cuda.so",
                &["libmid.so"],
                &[lab.runpath(&["$ORIGIN"])],
            );
            Setup::library(lab, torch, binds(lab, V1, How::Runtime))
        },
    ));
    c.push(case(
        "static_two_levels_down",
        "libtorch → libmid.so → libdeep.so, which has NCCL compiled in",
        |lab| {
            lab.nccl_as("lib/libdeep.so", V1, "libdeep.so", Funcs::Both, &[]);
            lab.lib(
                "lib/libmid.so",
                Some("libmid.so"),
                "int mid(void) { return 1; }\n",
                &["libdeep.so"],
                &[lab.runpath(&["$ORIGIN"])],
            );
            let torch = lab.torch(
                "lib/libtorch_cuda.so",
                &["libmid.so"],
                &[lab.runpath(&["$ORIGIN"])],
            );
            Setup::library(lab, torch, binds(lab, V1, How::Runtime))
        },
    ));

    // Search-path precedence, each pair both ways round.
    for (first, second) in [("one", "two"), ("two", "one")] {
        c.push(case(
            format!("rpath_beats_library_path_{first}"),
            format!("libtorch's DT_RPATH {first} is searched before LD_LIBRARY_PATH={second}"),
            move |lab| {
                two_dirs(lab);
                let torch = lab.torch(
                    "lib/libtorch_cuda.so",
                    &["libnccl.so.2"],
                    &[lab.rpath(&[first])],
                );
                Setup::library(lab, torch, binds(lab, ver_of(first), How::Runtime))
                    .library_path(lab.s(second))
            },
        ));
        c.push(case(
            format!("library_path_beats_runpath_{second}"),
            format!("LD_LIBRARY_PATH={second} is searched before libtorch's DT_RUNPATH {first}"),
            move |lab| {
                two_dirs(lab);
                let torch = lab.torch(
                    "lib/libtorch_cuda.so",
                    &["libnccl.so.2"],
                    &[lab.runpath(&[first])],
                );
                Setup::library(lab, torch, binds(lab, ver_of(second), How::Runtime))
                    .library_path(lab.s(second))
            },
        ));
        c.push(case(
            format!("library_path_in_order_{first}"),
            format!("LD_LIBRARY_PATH={first}:{second}: the first directory holding it wins"),
            move |lab| {
                two_dirs(lab);
                let torch = lab.torch("lib/libtorch_cuda.so", &["libnccl.so.2"], &[]);
                let llp = format!("{}:{}", lab.s(first), lab.s(second));
                Setup::library(lab, torch, binds(lab, ver_of(first), How::Runtime))
                    .library_path(llp)
            },
        ));
        c.push(case(
            format!("runpath_in_order_{first}"),
            format!("DT_RUNPATH {first}:{second}: the first directory holding it wins"),
            move |lab| {
                two_dirs(lab);
                let torch = lab.torch(
                    "lib/libtorch_cuda.so",
                    &["libnccl.so.2"],
                    &[lab.runpath(&[first, second])],
                );
                Setup::library(lab, torch, binds(lab, ver_of(first), How::Runtime))
            },
        ));
    }
    c.push(case(
        "library_path_semicolon_separates",
        "LD_LIBRARY_PATH is split at ';' as well as ':' (empty;two finds two's)",
        |lab| {
            two_dirs(lab);
            lab.mkdir("empty");
            let torch = lab.torch("lib/libtorch_cuda.so", &["libnccl.so.2"], &[]);
            let llp = format!("{};{}", lab.s("empty"), lab.s("two"));
            Setup::library(lab, torch, binds(lab, V2, How::Runtime)).library_path(llp)
        },
    ));
    c.push(case(
        "library_path_empty_element_is_cwd",
        "an empty LD_LIBRARY_PATH element (\":two\") is the current directory, searched first",
        |lab| {
            lab.nccl("two/libnccl.so.2", V2);
            lab.nccl("work/libnccl.so.2", V3);
            let torch = lab.torch("lib/libtorch_cuda.so", &["libnccl.so.2"], &[]);
            Setup::library(lab, torch, binds(lab, V3, How::Runtime))
                .library_path(format!(":{}", lab.s("two")))
                .cwd(lab.path("work"))
        },
    ));
    c.push(case(
        "origin_in_rpath",
        "libtorch's DT_RPATH $ORIGIN/../nccl is relative to libtorch's directory",
        |lab| {
            lab.nccl("nccl/libnccl.so.2", V1);
            let torch = lab.torch(
                "lib/libtorch_cuda.so",
                &["libnccl.so.2"],
                &[lab.rpath(&["$ORIGIN/../nccl"])],
            );
            Setup::library(lab, torch, binds(lab, V1, How::Runtime))
        },
    ));
    c.push(case(
        "origin_of_a_symlinked_library_is_the_link_directory",
        "libtorch opened through a symlink: $ORIGIN is the directory of the path it was opened by, not of the target",
        |lab| {
            lab.nccl("store/nccl/libnccl.so.2", V3);
            lab.nccl("site/nccl/libnccl.so.2", V4);
            let real = lab.torch("store/lib/libtorch_cuda.so", &["libnccl.so.2"], &[lab.rpath(&["$ORIGIN/../nccl"])]);
            let link = lab.mkdir("site/lib").join("libtorch_cuda.so");
            std::os::unix::fs::symlink(&real, &link).unwrap();
            Setup::library(lab, link, binds(lab, V4, How::Runtime))
        },
    ));

    // Inheritance: DT_RPATH applies to what its object's dependencies need, DT_RUNPATH not.
    c.push(case(
        "runpath_not_inherited_by_grandchildren",
        "libtorch's DT_RUNPATH finds libmid.so but not libmid's libnccl.so.2 (in the same directory): the process cannot start",
        |lab| {
            lab.nccl("dir/libnccl.so.2", V1);
            lab.lib("dir/libmid.so", Some("libmid.so"), "int mid(void) { return 1; }\n", &["libnccl.so.2"], &[]);
            let torch = lab.torch("lib/libtorch_cuda.so", &["libmid.so"], &[lab.runpath(&["dir"])]);
            Setup::library(lab, torch, fails(NOT_FOUND))
        },
    ));
    c.push(case(
        "runpath_not_inherited_library_path_finds_it",
        "the same, with LD_LIBRARY_PATH=two: libmid's libnccl.so.2 comes from two, not from libtorch's DT_RUNPATH",
        |lab| {
            lab.nccl("dir/libnccl.so.2", V1);
            lab.nccl("two/libnccl.so.2", V2);
            lab.lib("dir/libmid.so", Some("libmid.so"), "int mid(void) { return 1; }\n", &["libnccl.so.2"], &[]);
            let torch = lab.torch("lib/libtorch_cuda.so", &["libmid.so"], &[lab.runpath(&["dir"])]);
            Setup::library(lab, torch, binds(lab, V2, How::Runtime)).library_path(lab.s("two"))
        },
    ));
    c.push(case(
        "rpath_inherited_by_grandchildren",
        "libtorch's DT_RPATH also finds libmid's libnccl.so.2",
        |lab| {
            lab.nccl("dir/libnccl.so.2", V1);
            lab.lib(
                "dir/libmid.so",
                Some("libmid.so"),
                "int mid(void) { return 1; }\n",
                &["libnccl.so.2"],
                &[],
            );
            let torch = lab.torch(
                "lib/libtorch_cuda.so",
                &["libmid.so"],
                &[lab.rpath(&["dir"])],
            );
            Setup::library(lab, torch, binds(lab, V1, How::Runtime))
        },
    ));
    c.push(case(
        "inherited_rpath_beats_library_path",
        "for libmid's libnccl.so.2, libtorch's (inherited) DT_RPATH comes before LD_LIBRARY_PATH",
        |lab| {
            lab.nccl("dir/libnccl.so.2", V1);
            lab.nccl("two/libnccl.so.2", V2);
            lab.lib(
                "dir/libmid.so",
                Some("libmid.so"),
                "int mid(void) { return 1; }\n",
                &["libnccl.so.2"],
                &[],
            );
            let torch = lab.torch(
                "lib/libtorch_cuda.so",
                &["libmid.so"],
                &[lab.rpath(&["dir"])],
            );
            Setup::library(lab, torch, binds(lab, V1, How::Runtime)).library_path(lab.s("two"))
        },
    ));
    c.push(case(
        "own_runpath_disables_inherited_rpath",
        "libmid has a DT_RUNPATH of its own (two): libtorch's DT_RPATH (one) is then not used for libmid's needs",
        |lab| {
            two_dirs(lab);
            lab.lib(
                "one/libmid.so",
                Some("libmid.so"),
                "int mid(void) { return 1; }\n",
                &["libnccl.so.2"],
                &[lab.runpath(&["two"])],
            );
            let torch = lab.torch("lib/libtorch_cuda.so", &["libmid.so"], &[lab.rpath(&["one"])]);
            Setup::library(lab, torch, binds(lab, V2, How::Runtime))
        },
    ));

    // The executable's own search paths (fdl is given the program).
    c.push(case(
        "exe_rpath_applies_to_indirect_deps",
        "the program's DT_RPATH (tlib:one) also finds libtorch's libnccl.so.2",
        |lab| {
            lab.nccl("one/libnccl.so.2", V1);
            lab.torch("tlib/libtorch_cuda.so", &["libnccl.so.2"], &[]);
            let prog = lab.program("bin/prog", "tlib", &[lab.rpath(&["tlib", "one"])]);
            Setup::executable(prog, binds(lab, V1, How::Runtime))
        },
    ));
    c.push(case(
        "exe_runpath_not_for_indirect_deps",
        "the program's DT_RUNPATH (tlib:one) finds libtorch but not libtorch's libnccl.so.2: the process cannot start",
        |lab| {
            lab.nccl("one/libnccl.so.2", V1);
            lab.torch("tlib/libtorch_cuda.so", &["libnccl.so.2"], &[]);
            let prog = lab.program("bin/prog", "tlib", &[lab.runpath(&["tlib", "one"])]);
            Setup::executable(prog, fails(NOT_FOUND))
        },
    ));
    c.push(case(
        "exe_rpath_beats_library_path_for_indirect_deps",
        "the program's DT_RPATH (tlib:one) is searched before LD_LIBRARY_PATH=two for libtorch's libnccl.so.2",
        |lab| {
            two_dirs(lab);
            lab.torch("tlib/libtorch_cuda.so", &["libnccl.so.2"], &[]);
            let prog = lab.program("bin/prog", "tlib", &[lab.rpath(&["tlib", "one"])]);
            Setup::executable(prog, binds(lab, V1, How::Runtime)).library_path(lab.s("two"))
        },
    ));
    c.push(case(
        "exe_rpath_unused_when_the_library_has_runpath",
        "libtorch has a DT_RUNPATH (two): the program's DT_RPATH (tlib:one) is not searched for libtorch's needs",
        |lab| {
            two_dirs(lab);
            lab.torch("tlib/libtorch_cuda.so", &["libnccl.so.2"], &[lab.runpath(&["two"])]);
            let prog = lab.program("bin/prog", "tlib", &[lab.rpath(&["tlib", "one"])]);
            Setup::executable(prog, binds(lab, V2, How::Runtime))
        },
    ));
    c.push(case(
        "exe_origin_through_a_symlink_is_the_target_directory",
        "a program run through a symlink: its $ORIGIN comes from /proc/self/exe, the target's directory (unlike a library's)",
        |lab| {
            lab.nccl("realbin/lib/libnccl.so.2", V3);
            lab.nccl("linkbin/lib/libnccl.so.2", V4);
            lab.torch("realbin/lib/libtorch_cuda.so", &["libnccl.so.2"], &[]);
            lab.torch("linkbin/lib/libtorch_cuda.so", &["libnccl.so.2"], &[]);
            let real = lab.program("realbin/prog", "realbin/lib", &[lab.rpath(&["$ORIGIN/lib"])]);
            let link = lab.path("linkbin/prog");
            std::os::unix::fs::symlink(&real, &link).unwrap();
            Setup::executable(link, binds(lab, V3, How::Runtime))
        },
    ));

    // A candidate of the wrong ELF class is skipped and the search goes on.
    c.push(case(
        "wrong_class_skipped_in_library_path",
        "LD_LIBRARY_PATH=w32:two, w32 holding a 32-bit libnccl.so.2: skipped, two's is used",
        |lab| {
            lab.elf32("w32/libnccl.so.2");
            lab.nccl("two/libnccl.so.2", V2);
            let torch = lab.torch("lib/libtorch_cuda.so", &["libnccl.so.2"], &[]);
            let llp = format!("{}:{}", lab.s("w32"), lab.s("two"));
            Setup::library(lab, torch, binds(lab, V2, How::Runtime)).library_path(llp)
        },
    ));
    c.push(case(
        "wrong_class_skipped_in_runpath",
        "DT_RUNPATH w32:two, w32 holding a 32-bit libnccl.so.2: skipped, two's is used",
        |lab| {
            lab.elf32("w32/libnccl.so.2");
            lab.nccl("two/libnccl.so.2", V2);
            let torch = lab.torch(
                "lib/libtorch_cuda.so",
                &["libnccl.so.2"],
                &[lab.runpath(&["w32", "two"])],
            );
            Setup::library(lab, torch, binds(lab, V2, How::Runtime))
        },
    ));
    c.push(case(
        "wrong_class_only",
        "only a 32-bit libnccl.so.2 on the path: the process cannot start",
        |lab| {
            lab.elf32("w32/libnccl.so.2");
            let torch = lab.torch(
                "lib/libtorch_cuda.so",
                &["libnccl.so.2"],
                &[lab.runpath(&["w32"])],
            );
            Setup::library(
                lab,
                torch,
                fails("libnccl.so.2: wrong ELF class: ELFCLASS32"),
            )
        },
    ));

    // LD_PRELOAD, over the pip layout (bundled NCCL V1).
    c.push(case(
        "preload_absolute_path",
        "a preloaded libnccl.so.2 by absolute path answers libtorch's calls",
        |lab| {
            let torch = bundled(lab, V1);
            lab.nccl("pre/libnccl.so.2", V3);
            Setup::library(lab, torch, binds(lab, V3, How::Runtime))
                .preload(lab.s("pre/libnccl.so.2"))
        },
    ));
    c.push(case(
        "preload_bare_name_via_library_path",
        "LD_PRELOAD=libnccl.so.2 is searched like a DT_NEEDED (found in LD_LIBRARY_PATH); libtorch's DT_NEEDED then reuses it by soname",
        |lab| {
            let torch = bundled(lab, V1);
            lab.nccl("pre/libnccl.so.2", V3);
            Setup::library(lab, torch, binds(lab, V3, How::Runtime))
                .preload("libnccl.so.2")
                .library_path(lab.s("pre"))
        },
    ));
    c.push(case(
        "preload_bare_other_name_via_library_path",
        "LD_PRELOAD=libnccl-shim.so.2 found in LD_LIBRARY_PATH: the bundled libnccl.so.2 loads too, the preload answers",
        |lab| {
            let torch = bundled(lab, V1);
            lab.nccl("pre/libnccl-shim.so.2", V3);
            Setup::library(lab, torch, binds(lab, V3, How::Runtime))
                .preload("libnccl-shim.so.2")
                .library_path(lab.s("pre"))
        },
    ));
    c.push(case(
        "preload_bare_name_not_found",
        "LD_PRELOAD=libnccl.so.2 with nothing on the main program's path: ignored (libtorch's RUNPATH is not searched for it)",
        |lab| {
            let torch = bundled(lab, V1);
            Setup::library(lab, torch, binds(lab, V1, How::Runtime))
                .preload("libnccl.so.2")
                .ignored(&["libnccl.so.2".into()])
        },
    ));
    c.push(case(
        "preload_path_with_a_space",
        "a preload path with a space is split there: every piece is ignored, the bundled NCCL runs",
        |lab| {
            let torch = bundled(lab, V1);
            lab.nccl("dir with space/libnccl.so.2", V3);
            let work = lab.mkdir("work");
            Setup::library(lab, torch, binds(lab, V1, How::Runtime))
                .preload(lab.s("dir with space/libnccl.so.2"))
                .cwd(work)
                .ignored(&[lab.s("dir"), "with".into(), "space/libnccl.so.2".into()])
        },
    ));
    c.push(case(
        "preload_split_piece_found_relative_to_cwd",
        "the same split, where the last piece (space/libnccl.so.2) exists relative to the current directory: it is preloaded",
        |lab| {
            let torch = bundled(lab, V1);
            lab.nccl("dir with space/libnccl.so.2", V3);
            lab.nccl("work/space/libnccl.so.2", V4);
            Setup::library(lab, torch, binds(lab, V4, How::Runtime))
                .preload(lab.s("dir with space/libnccl.so.2"))
                .cwd(lab.path("work"))
                .ignored(&[lab.s("dir"), "with".into()])
        },
    ));
    c.push(case(
        "preload_after_a_missing_entry",
        "LD_PRELOAD=/nonexistent/libx.so:PRE: the missing one is ignored, PRE answers",
        |lab| {
            let torch = bundled(lab, V1);
            lab.nccl("pre/libnccl.so.2", V3);
            Setup::library(lab, torch, binds(lab, V3, How::Runtime))
                .preload(format!(
                    "/nonexistent/libx.so:{}",
                    lab.s("pre/libnccl.so.2")
                ))
                .ignored(&["/nonexistent/libx.so".into()])
        },
    ));
    c.push(case(
        "preload_with_empty_elements",
        "LD_PRELOAD='::PRE  :/nonexistent/b.so': empty elements are skipped silently",
        |lab| {
            let torch = bundled(lab, V1);
            lab.nccl("pre/libnccl.so.2", V3);
            Setup::library(lab, torch, binds(lab, V3, How::Runtime))
                .preload(format!(
                    "::{}  :/nonexistent/b.so",
                    lab.s("pre/libnccl.so.2")
                ))
                .ignored(&["/nonexistent/b.so".into()])
        },
    ));
    c.push(case(
        "preload_of_the_wrong_class",
        "a 32-bit libnccl.so.2 preloaded by path: ignored (wrong ELF class), the bundled NCCL runs",
        |lab| {
            let torch = bundled(lab, V1);
            let w = lab.elf32("w32/libnccl.so.2");
            Setup::library(lab, torch, binds(lab, V1, How::Runtime))
                .preload(lab.s("w32/libnccl.so.2"))
                .ignored(&[w.to_str().unwrap().to_string()])
        },
    ));
    c.push(case(
        "preload_bare_name_of_the_wrong_class",
        "LD_PRELOAD=libnccl.so.2 with only a 32-bit one in LD_LIBRARY_PATH: ignored; libtorch's own search skips it too",
        |lab| {
            let torch = bundled(lab, V1);
            lab.elf32("w32/libnccl.so.2");
            Setup::library(lab, torch, binds(lab, V1, How::Runtime))
                .preload("libnccl.so.2")
                .library_path(lab.s("w32"))
                .ignored(&["libnccl.so.2".into()])
        },
    ));
    c.push(case(
        "preload_first_of_two_wins",
        "LD_PRELOAD='PRE PRE2' (same soname, two files): both load, the first answers",
        |lab| {
            let torch = bundled(lab, V1);
            lab.nccl("pre/libnccl.so.2", V3);
            lab.nccl("pre2/libnccl.so.2", V4);
            Setup::library(lab, torch, binds(lab, V3, How::Runtime)).preload(format!(
                "{} {}",
                lab.s("pre/libnccl.so.2"),
                lab.s("pre2/libnccl.so.2")
            ))
        },
    ));
    c.push(case(
        "preload_longest_element_loads",
        "a preload element of 4095 bytes (PATH_MAX - 1) is preloaded",
        |lab| {
            let torch = bundled(lab, V1);
            lab.nccl("pre/libnccl.so.2", V3);
            let elem = padded_path(&lab.path("pre"), 4095);
            Setup::library(lab, torch, binds(lab, V3, How::Runtime)).preload(elem)
        },
    ));
    c.push(case(
        "preload_overlong_element_dropped_silently",
        "a preload element of 4096 bytes (PATH_MAX) is dropped without any message; the bundled NCCL runs",
        |lab| {
            let torch = bundled(lab, V1);
            lab.nccl("pre/libnccl.so.2", V3);
            let elem = padded_path(&lab.path("pre"), 4096);
            let mut s = Setup::library(lab, torch, binds(lab, V1, How::Runtime)).preload(elem.clone());
            s.silently_dropped = vec![elem];
            s
        },
    ));

    // Breadth-first order of the global scope, and a soname reached twice.
    c.push(case(
        "breadth_first_level_one_beats_level_two",
        "libtorch NEEDs liba.so then libb.so; liba's libdeep1.so (level 2) and libb (level 1) both define nccl*: libb wins",
        |lab| {
            lab.nccl_as("lib/libdeep1.so", V1, "libdeep1.so", Funcs::Both, &[]);
            lab.lib("lib/liba.so", Some("liba.so"), "int a_fn(void) { return 1; }\n", &["libdeep1.so"], &[lab.runpath(&["$ORIGIN"])]);
            lab.nccl_as("lib/libb.so", V2, "libb.so", Funcs::Both, &[]);
            let torch = lab.torch("lib/libtorch_cuda.so", &["liba.so", "libb.so"], &[lab.runpath(&["$ORIGIN"])]);
            Setup::library(lab, torch, binds(lab, V2, How::Runtime))
        },
    ));
    c.push(case(
        "breadth_first_earlier_needed_wins",
        "liba.so and libb.so, both level 1, both define nccl*: the earlier DT_NEEDED (liba) wins",
        |lab| {
            lab.nccl_as("lib/liba.so", V1, "liba.so", Funcs::Both, &[]);
            lab.nccl_as("lib/libb.so", V2, "libb.so", Funcs::Both, &[]);
            let torch = lab.torch(
                "lib/libtorch_cuda.so",
                &["liba.so", "libb.so"],
                &[lab.runpath(&["$ORIGIN"])],
            );
            Setup::library(lab, torch, binds(lab, V1, How::Runtime))
        },
    ));
    for (first, second) in [("a", "b"), ("b", "a")] {
        c.push(case(
            format!("same_soname_reached_twice_{first}_first"),
            format!("lib{first}.so and lib{second}.so each need libnccl.so.2 from their own RUNPATH; the one loaded first (lib{first}'s) is reused by soname"),
            move |lab| {
                lab.nccl("lib/a/libnccl.so.2", V1);
                lab.nccl("lib/b/libnccl.so.2", V2);
                for x in ["a", "b"] {
                    lab.lib(
                        &format!("lib/lib{x}.so"),
                        Some(&format!("lib{x}.so")),
                        &format!("int {x}_fn(void) {{ return 1; }}\n"),
                        &["libnccl.so.2"],
                        &[lab.runpath(&[&format!("$ORIGIN/{x}")])],
                    );
                }
                let needed = [format!("lib{first}.so"), format!("lib{second}.so")];
                let needed: Vec<&str> = needed.iter().map(String::as_str).collect();
                let torch = lab.torch("lib/libtorch_cuda.so", &needed, &[lab.runpath(&["$ORIGIN"])]);
                let v = if first == "a" { V1 } else { V2 };
                Setup::library(lab, torch, binds(lab, v, How::Runtime))
            },
        ));
    }

    // Bound locally, or not, with a preloaded libnccl.so.2 (V3) present.
    let local: [(&str, &str, &str, How); 4] = [
        (
            "hidden_with_self_id",
            r#"__attribute__((visibility("hidden")))"#,
            "",
            How::LinkTime,
        ),
        (
            "protected",
            r#"__attribute__((visibility("protected")))"#,
            "",
            How::LinkTime,
        ),
        // ld binds the calls itself (no PLT relocation is left), and sets DF_SYMBOLIC.
        ("bsymbolic", "", "-Wl,-Bsymbolic", How::LinkTime),
        (
            "bsymbolic_functions",
            "",
            "-Wl,-Bsymbolic-functions",
            How::LinkTime,
        ),
    ];
    for (name, attr, link, how) in local {
        c.push(case(
            format!("{name}_ignores_preload"),
            format!("NCCL compiled into libtorch ({name}): its calls stay inside, a preloaded libnccl.so.2 loads but does not answer"),
            move |lab| {
                let link: Vec<String> = [link].iter().filter(|l| !l.is_empty()).map(|l| l.to_string()).collect();
                let torch = lab.torch_static("lib/libtorch_cuda.so", V1, attr, &link);
                lab.nccl("pre/libnccl.so.2", V3);
                Setup::library(lab, torch, binds(lab, V1, how)).preload(lab.s("pre/libnccl.so.2"))
            },
        ));
    }
    c.push(case(
        "default_visibility_preload_wins",
        "NCCL compiled into libtorch with default visibility, called through the PLT: a preloaded libnccl.so.2 answers",
        |lab| {
            let torch = lab.torch_static("lib/libtorch_cuda.so", V1, "", &[]);
            lab.nccl("pre/libnccl.so.2", V3);
            Setup::library(lab, torch, binds(lab, V3, How::Runtime)).preload(lab.s("pre/libnccl.so.2"))
        },
    ));

    // Not knowable statically, or not runnable: fdl must answer unknown.
    c.push(case(
        "dlopen_at_run_time",
        "libtorch dlopens libnccl.so.2 (found through its RUNPATH) and calls it through dlsym",
        |lab| {
            lab.nccl("site/nvidia/nccl/lib/libnccl.so.2", V1);
            let torch = lab.torch_dlopen(
                "site/torch/lib/libtorch_cuda.so",
                &[lab.runpath(&["$ORIGIN/../../nvidia/nccl/lib"])],
            );
            let file = lab.file_of(V1.code()).unwrap();
            Setup::library(lab, torch, Expect::Dlopen { version: V1, file })
        },
    ));
    c.push(case(
        "unresolvable_needed_before_nccl",
        "libtorch NEEDs libfdl-missing.so, then libnccl.so.2 (which resolves): the process cannot start",
        |lab| {
            lab.nccl("site/nvidia/nccl/lib/libnccl.so.2", V1);
            let torch = lab.torch(
                "site/torch/lib/libtorch_cuda.so",
                &["libfdl-missing.so", "libnccl.so.2"],
                &[lab.runpath(&["$ORIGIN/../../nvidia/nccl/lib"])],
            );
            Setup::library(lab, torch, fails("libfdl-missing.so: cannot open shared object file"))
        },
    ));
    c.push(case(
        "pip_dist_info_pin_without_the_wheel",
        "pip layout whose torch dist-info pins nvidia-nccl-cu13==2.30.7, but that wheel is not installed: the process cannot start",
        |lab| {
            let torch = lab.torch(
                "site-packages/torch/lib/libtorch_cuda.so",
                &["libnccl.so.2"],
                &[lab.rpath(&["$ORIGIN/../../nvidia/nccl/lib"])],
            );
            let info = lab.mkdir("site-packages/torch-2.15.0.dist-info");
            std::fs::write(
                info.join("METADATA"),
                "Metadata-Version: 2.1\nName: torch\nVersion: 2.15.0\nRequires-Dist: filelock\nRequires-Dist: nvidia-nccl-cu13==2.30.7; platform_system == \"Linux\"\n",
            )
            .unwrap();
            let mut s = Setup::library(lab, torch, fails(NOT_FOUND));
            s.reason = vec!["2.30.7", "nvidia-nccl-cu13"];
            s
        },
    ));
    c.push(case(
        "preload_same_soname_missing_a_function",
        "a preload with soname libnccl.so.2 defining only ncclGetVersion stands for the bundled one, which never loads: the call to ncclCommInitRank fails",
        |lab| {
            let torch = bundled(lab, V1);
            let pre = lab.nccl_as("pre/libnccl.so.2", V3, "libnccl.so.2", Funcs::GetVersionOnly, &[]);
            Setup::library(lab, torch, fails("symbol lookup error")).preload(pre.to_str().unwrap().to_string())
        },
    ));
    c.push(case(
        "split_between_preload_and_bundled",
        "a preload (libnccl-shim.so) defining only ncclGetVersion: that call binds to it, ncclCommInitRank to the bundled libnccl.so.2",
        |lab| {
            let torch = bundled(lab, V1);
            // Another soname: a preload with soname libnccl.so.2 would stand for the
            // bundled one (see preload_same_soname_missing_a_function).
            let pre = lab.nccl_as("pre/libnccl-shim.so", V3, "libnccl-shim.so", Funcs::GetVersionOnly, &[]);
            let comm_init = lab.file_of(V1.code()).unwrap();
            Setup::library(
                lab,
                torch,
                Expect::Split {
                    version: V3,
                    get_version: pre.clone(),
                    comm_init,
                },
            )
            .preload(pre.to_str().unwrap().to_string())
        },
    ));

    // issue 26: loader rules
    {
        // Dynamic string tokens: only $ORIGIN, $LIB, $PLATFORM (plain or braced) are
        // tokens, the plain form only when no [A-Za-z0-9_] follows; any other `$` is a
        // character. Each case has a decoy where a wrong reading would look.
        c.push(case(
            "token_origin_old_is_a_literal_directory",
            "RUNPATH '$ORIGIN_old/lib' is no token: the relative directory named '$ORIGIN_old/lib' (from the working directory) answers, not <libtorch's dir>_old/lib",
            |lab| {
                lab.nccl("$ORIGIN_old/lib/libnccl.so.2", V1);
                lab.nccl("lib_old/lib/libnccl.so.2", V2);
                let torch = lab.torch("lib/libtorch_cuda.so", &["libnccl.so.2"], &[lab.runpath(&["$ORIGIN_old/lib"])]);
                Setup::library(lab, torch, binds(lab, V1, How::Runtime))
            },
        ));
        c.push(case(
            "token_braced_origin",
            "RPATH '${ORIGIN}/lib' is $ORIGIN in braces: libtorch's directory's lib answers, not a directory literally named '${ORIGIN}'",
            |lab| {
                lab.nccl("t/lib/libnccl.so.2", V1);
                lab.nccl("${ORIGIN}/lib/libnccl.so.2", V2);
                let torch = lab.torch("t/libtorch_cuda.so", &["libnccl.so.2"], &[lab.rpath(&["${ORIGIN}/lib"])]);
                Setup::library(lab, torch, binds(lab, V1, How::Runtime))
            },
        ));
        c.push(case(
            "token_dollar_x_directory_in_rpath",
            "RPATH naming a directory literally called '$x' (an absolute path): it is searched like any other",
            |lab| {
                lab.nccl("$x/libnccl.so.2", V1);
                let torch = lab.torch("lib/libtorch_cuda.so", &["libnccl.so.2"], &[lab.rpath(&[&lab.s("$x")])]);
                Setup::library(lab, torch, binds(lab, V1, How::Runtime))
            },
        ));
        c.push(case(
            "token_originx_is_not_origin",
            "RUNPATH '$ORIGINX' is no token (an identifier character follows): the relative directory '$ORIGINX' answers, not <libtorch's dir>X",
            |lab| {
                lab.nccl("$ORIGINX/libnccl.so.2", V1);
                lab.nccl("libX/libnccl.so.2", V2);
                let torch = lab.torch("lib/libtorch_cuda.so", &["libnccl.so.2"], &[lab.runpath(&["$ORIGINX"])]);
                Setup::library(lab, torch, binds(lab, V1, How::Runtime))
            },
        ));
        c.push(case(
            "token_origin_value_holding_dollars",
            "the pip layout under 'p$(x)/$ORIGIN_old/': $ORIGIN's value holds '$', which is copied, never read as a token",
            |lab| {
                lab.nccl("p$(x)/$ORIGIN_old/site/nvidia/nccl/lib/libnccl.so.2", V1);
                let torch = lab.torch(
                    "p$(x)/$ORIGIN_old/site/torch/lib/libtorch_cuda.so",
                    &["libnccl.so.2"],
                    &[lab.runpath(&["$ORIGIN/../../nvidia/nccl/lib"])],
                );
                Setup::library(lab, torch, binds(lab, V1, How::Runtime))
            },
        ));
        c.push(case(
            "token_dollar_directory_in_library_path",
            "LD_LIBRARY_PATH naming a directory literally called '$(x)' (library mode): searched like any other",
            |lab| {
                lab.nccl("$(x)/libnccl.so.2", V1);
                let torch = lab.torch("lib/libtorch_cuda.so", &["libnccl.so.2"], &[]);
                Setup::library(lab, torch, binds(lab, V1, How::Runtime)).library_path(lab.s("$(x)"))
            },
        ));

        // open_verify's header check: a libnccl.so.2 with one patched header byte lies
        // first on libtorch's RUNPATH, a good one after it.
        fn patch(path: &Path, at: usize, byte: u8) {
            let mut b = std::fs::read(path).unwrap();
            b[at] = byte;
            std::fs::write(path, b).unwrap();
        }
        let headers: [(&str, usize, u8, Option<&str>); 7] = [
            ("osabi_invalid", 7, 1, Some("ELF file OS ABI invalid")),
            (
                "abi_version_invalid",
                8,
                1,
                Some("ELF file ABI version invalid"),
            ),
            ("nonzero_padding", 12, 1, Some("nonzero padding in e_ident")),
            (
                "e_version",
                20,
                2,
                Some("ELF file version does not match current one"),
            ),
            (
                "phentsize",
                54,
                57,
                Some("ELF file's phentsize not the expected size"),
            ),
            ("osabi_gnu_taken", 7, 3, None),
            ("class_byte_3_passed_over", 4, 3, None),
        ];
        for (name, at, byte, error) in headers {
            c.push(case(
                format!("header_{name}"),
                format!(
                    "the first libnccl.so.2 on RUNPATH has byte {at} patched to {byte}: {}",
                    match error {
                        Some(e) => format!("the loader stops with '{e}'"),
                        None if at == 7 =>
                            "the loader takes it (ELFOSABI_GNU is valid)".to_string(),
                        None => "the loader passes it over (another class) and takes the next"
                            .to_string(),
                    }
                ),
                move |lab| {
                    let bad = lab.nccl("bad/libnccl.so.2", V3);
                    patch(&bad, at, byte);
                    lab.nccl("good/libnccl.so.2", V1);
                    let torch = lab.torch(
                        "lib/libtorch_cuda.so",
                        &["libnccl.so.2"],
                        &[lab.runpath(&["bad", "good"])],
                    );
                    let expect = match error {
                        Some(e) => fails(e),
                        None if at == 7 => binds(lab, V3, How::Runtime),
                        None => binds(lab, V1, How::Runtime),
                    };
                    Setup::library(lab, torch, expect)
                },
            ));
        }
        c.push(case(
            "header_abi_version_under_gnu_osabi_taken",
            "a libnccl.so.2 with ELFOSABI_GNU and ABI version 3 (under LIBC_ABI_MAX): the loader takes it",
            |lab| {
                let p = lab.nccl("bad/libnccl.so.2", V3);
                patch(&p, 7, 3);
                patch(&p, 8, 3);
                lab.nccl("good/libnccl.so.2", V1);
                let torch = lab.torch("lib/libtorch_cuda.so", &["libnccl.so.2"], &[lab.runpath(&["bad", "good"])]);
                Setup::library(lab, torch, binds(lab, V3, How::Runtime))
            },
        ));
        c.push(case(
            "header_bad_preload_ignored",
            "a preloaded libnccl.so.2 with an invalid OS ABI: ignored with the loader's error, the bundled NCCL runs",
            |lab| {
                let torch = bundled(lab, V1);
                let pre = lab.nccl("pre/libnccl.so.2", V3);
                patch(&pre, 7, 1);
                Setup::library(lab, torch, binds(lab, V1, How::Runtime))
                    .preload(lab.s("pre/libnccl.so.2"))
                    .ignored(&[lab.s("pre/libnccl.so.2")])
            },
        ));

        // Library mode: the stand-in program needs the library, then libc.so.6, as a
        // real `cc prog.c lib.so` program does.
        c.push(case(
            "nodeflib_library_needing_libc_first",
            "libtorch linked -z nodefaultlib NEEDs libc.so.6 (first) and libnccl.so.2 (RUNPATH): the program already loaded libc, so the process starts",
            |lab| {
                lab.nccl("site/nvidia/nccl/lib/libnccl.so.2", V1);
                let torch = lab.torch(
                    "site/torch/lib/libtorch_cuda.so",
                    &["libc.so.6", "libnccl.so.2"],
                    &[lab.runpath(&["$ORIGIN/../../nvidia/nccl/lib"]), "-Wl,-z,nodefaultlib".into()],
                );
                let d = loader_fixture::readelf_d(&torch);
                let needed: Vec<&str> = d.lines().filter(|l| l.contains("(NEEDED)")).collect();
                assert!(needed.len() == 2 && needed[0].contains("[libc.so.6]") && d.contains("NODEFLIB"), "fixture: {d}");
                Setup::library(lab, torch, binds(lab, V1, How::Runtime))
            },
        ));

        // Symbol versions. `versioned` builds an NCCL stand-in whose functions carry the
        // versions a version script gives them; `torch_against` links libtorch against a
        // given libnccl.so.2, so that its references carry that library's versions.
        fn versioned(
            lab: &Lab,
            rel: &str,
            v: Ver,
            soname: &str,
            script: &str,
            source: Option<String>,
        ) -> PathBuf {
            let map = lab.path(&format!("{rel}.map"));
            std::fs::create_dir_all(map.parent().unwrap()).unwrap();
            std::fs::write(&map, script).unwrap();
            let source = source.unwrap_or_else(|| loader_fixture::nccl_source(v, Funcs::Both, ""));
            lab.lib(
                rel,
                Some(soname),
                &source,
                &[],
                &[format!("-Wl,--version-script,{}", map.display())],
            )
        }
        fn torch_against(lab: &Lab, nccl: &Path, flags: &[String]) -> PathBuf {
            let mut f = vec![
                "-O1".to_string(),
                format!("-L{}", nccl.parent().unwrap().display()),
                format!("-l:{}", nccl.file_name().unwrap().to_str().unwrap()),
            ];
            f.extend(flags.iter().cloned());
            let source = format!(
                "int ncclGetVersion(int *v);\nint ncclCommInitRank(void **c, int n, int id, int r);\n{}",
                loader_fixture::CALLER
            );
            lab.lib(
                "site/torch/lib/libtorch_cuda.so",
                Some("libtorch_cuda.so"),
                &source,
                &[],
                &f,
            )
        }
        fn at(file: PathBuf, v: Ver) -> Expect {
            Expect::Binds {
                version: v,
                file,
                how: How::Runtime,
            }
        }
        const NCCL_1: &str = "NCCL_1 { global: ncclGetVersion; ncclCommInitRank; local: *; };\n";
        const NCCL_2: &str = "NCCL_2 { global: ncclGetVersion; ncclCommInitRank; local: *; };\n";
        let runpath = |lab: &Lab| lab.runpath(&["$ORIGIN/../../nvidia/nccl/lib"]);
        c.push(case(
            "version_preload_of_another_version_passed_over",
            "libtorch needs ncclGetVersion@NCCL_1 of libnccl.so.2; a preload (libnccl-pre.so) exporting ncclGetVersion@@NCCL_2 is passed over: the bundled NCCL answers",
            move |lab| {
                let nccl = versioned(lab, "site/nvidia/nccl/lib/libnccl.so.2", V1, "libnccl.so.2", NCCL_1, None);
                let torch = torch_against(lab, &nccl, &[runpath(lab)]);
                let pre = versioned(lab, "pre/libnccl-pre.so", V3, "libnccl-pre.so", NCCL_2, None);
                Setup::library(lab, torch, at(nccl, V1)).preload(pre.to_str().unwrap().to_string())
            },
        ));
        c.push(case(
            "version_required_missing_fails_to_start",
            "libtorch was linked against a libnccl.so.2 defining NCCL_1; the one it finds defines only NCCL_2: the process does not start (exit 1)",
            move |lab| {
                let link = versioned(lab, ".link/v/libnccl.so.2", V2, "libnccl.so.2", NCCL_1, Some("int ncclGetVersion(int *v) { return 0; }\nint ncclCommInitRank(void **c, int n, int id, int r) { return 0; }\n".into()));
                let torch = torch_against(lab, &link, &[runpath(lab)]);
                versioned(lab, "site/nvidia/nccl/lib/libnccl.so.2", V1, "libnccl.so.2", NCCL_2, None);
                Setup::library(lab, torch, fails_with(1, "version `NCCL_1' not found"))
            },
        ));
        c.push(case(
            "version_required_of_a_library_without_definitions_runs",
            "libtorch requires NCCL_1 of libnccl.so.2; the one it finds defines no versions but has a DT_VERSYM (its libc references): a warning only, its unversioned definitions answer",
            move |lab| {
                let link = versioned(lab, ".link/v/libnccl.so.2", V2, "libnccl.so.2", NCCL_1, Some("int ncclGetVersion(int *v) { return 0; }\nint ncclCommInitRank(void **c, int n, int id, int r) { return 0; }\n".into()));
                let torch = torch_against(lab, &link, &[runpath(lab)]);
                let nccl = lab.nccl("site/nvidia/nccl/lib/libnccl.so.2", V1);
                let d = loader_fixture::readelf_d(&nccl);
                assert!(d.contains("(VERSYM)") && !d.contains("(VERDEF)"), "fixture: {d}");
                Setup::library(lab, torch, binds(lab, V1, How::Runtime))
            },
        ));
        c.push(case(
            "version_required_of_a_library_without_versym_aborts",
            "libtorch requires NCCL_1 of libnccl.so.2; the one it finds has no version tables at all (-nostdlib): glibc's lookup fails its assertion and the process dies",
            move |lab| {
                let link = versioned(lab, ".link/v/libnccl.so.2", V2, "libnccl.so.2", NCCL_1, Some("int ncclGetVersion(int *v) { return 0; }\nint ncclCommInitRank(void **c, int n, int id, int r) { return 0; }\n".into()));
                let torch = torch_against(lab, &link, &[runpath(lab)]);
                let nccl = lab.lib("site/nvidia/nccl/lib/libnccl.so.2", Some("libnccl.so.2"), &loader_fixture::nccl_source(V1, Funcs::Both, ""), &[], &["-nostdlib".into()]);
                let d = loader_fixture::readelf_d(&nccl);
                assert!(!d.contains("(VERSYM)"), "fixture: {d}");
                Setup::library(lab, torch, fails("Inconsistency detected by ld.so"))
            },
        ));
        c.push(case(
            "version_ref_unversioned_preload_taken",
            "libtorch needs ncclGetVersion@NCCL_1; a preload without any version tables defines it: taken (check_match accepts an object without DT_VERSYM)",
            move |lab| {
                let nccl = versioned(lab, "site/nvidia/nccl/lib/libnccl.so.2", V1, "libnccl.so.2", NCCL_1, None);
                let torch = torch_against(lab, &nccl, &[runpath(lab)]);
                let pre = lab.nccl_as("pre/libnccl-pre.so", V3, "libnccl-pre.so", Funcs::Both, &[]);
                Setup::library(lab, torch, at(pre.clone(), V3)).preload(pre.to_str().unwrap().to_string())
            },
        ));
        // An unversioned reference (libtorch linked against the plain stub) against a
        // preload whose definitions are versioned.
        let symver_source = |v: Ver, node: &str| {
            format!(
                "__attribute__((used)) static const char fdl_nccl_self_id[] = \"NCCL version {}+cuda12.{}\";\n\
                 int gv(int *v) {{ *v = {}; return 0; }}\n\
                 int ci(void **c, int n, int id, int r) {{ *c = 0; return n - 1 + id + r; }}\n\
                 __asm__(\".symver gv,ncclGetVersion@{node}\");\n__asm__(\".symver ci,ncclCommInitRank@{node}\");\n",
                v.dotted(),
                v.2 % 10,
                v.code()
            )
        };
        for (name, node, script, preload_wins) in [
            (
                "version_unversioned_ref_default_later_version_taken",
                "",
                "NCCL_A { global: fdl_pre_a; local: *; };\nNCCL_B { global: ncclGetVersion; ncclCommInitRank; };\n",
                true,
            ),
            (
                "version_unversioned_ref_hidden_later_version_passed_over",
                "NCCL_B",
                "NCCL_A { global: fdl_pre_a; local: *; };\nNCCL_B { global: fdl_pre_b; ncclGetVersion; ncclCommInitRank; };\n",
                false,
            ),
            (
                "version_unversioned_ref_hidden_oldest_version_taken",
                "NCCL_A",
                "NCCL_A { global: fdl_pre_a; ncclGetVersion; ncclCommInitRank; local: *; };\nNCCL_B { global: fdl_pre_b; };\n",
                true,
            ),
        ] {
            c.push(case(
                name,
                format!("libtorch's references are unversioned; the preload defines nccl* only as {}: {}", if node.is_empty() { "the default version NCCL_B (index 3, its only one)".to_string() } else { format!("the non-default version {node}") }, if preload_wins { "the preload answers" } else { "passed over, the bundled NCCL answers" }),
                move |lab| {
                    let torch = bundled(lab, V1);
                    let source = if node.is_empty() {
                        format!("int fdl_pre_a;\n{}", loader_fixture::nccl_source(V3, Funcs::Both, ""))
                    } else {
                        format!("int fdl_pre_a;\nint fdl_pre_b;\n{}", symver_source(V3, node))
                    };
                    let pre = versioned(lab, "pre/libnccl-pre.so", V3, "libnccl-pre.so", script, Some(source));
                    let syms = Command::new("readelf").arg("--dyn-syms").arg("-W").arg(&pre).output().unwrap();
                    let syms = String::from_utf8_lossy(&syms.stdout);
                    let want = if node.is_empty() { "ncclGetVersion@@NCCL_B".to_string() } else { format!("ncclGetVersion@{node}") };
                    assert!(syms.lines().any(|l| l.contains(" FUNC ") && l.trim_end().ends_with(&want)), "fixture: no {want} in {syms}");
                    let expect = if preload_wins { at(pre.clone(), V3) } else { binds(lab, V1, How::Runtime) };
                    Setup::library(lab, torch, expect).preload(pre.to_str().unwrap().to_string())
                },
            ));
        }
    }

    // issue 26: calls
    // A function that no relocation names is a call only where the library's own code or
    // data refers to its entry; otherwise nothing calls it, and it decides nothing.
    for preload in [false, true] {
        let (name, v) = if preload {
            ("uncalled_exports_with_a_preload", V3)
        } else {
            ("uncalled_exports_without_a_preload", V1)
        };
        c.push(case(
            name,
            format!("the torch-1.13 shape: NCCL compiled into libtorch, exported; ncclGetVersion and ncclCommInitRank called through the PLT, ncclCommFinalize and ncclCommCuDevice called by nothing{}", if preload { "; a preloaded libnccl.so.2 answers every call made" } else { "" }),
            move |lab| {
                let torch = uncalled_exports(lab, "", &[]);
                lab.nccl("pre/libnccl.so.2", V3);
                let s = Setup::library(lab, torch, binds(lab, v, How::Runtime))
                    .never_called(&["ncclCommFinalize", "ncclCommCuDevice"]);
                if preload { s.preload(lab.s("pre/libnccl.so.2")) } else { s }
            },
        ));
    }
    c.push(case(
        "uncalled_protected_export_with_a_preload",
        "as above, the never-called ncclCommFinalize with protected visibility: still no call, the preload answers",
        |lab| {
            let torch = uncalled_exports(lab, r#"__attribute__((visibility("protected")))"#, &[]);
            lab.nccl("pre/libnccl.so.2", V3);
            Setup::library(lab, torch, binds(lab, V3, How::Runtime))
                .never_called(&["ncclCommFinalize", "ncclCommCuDevice"])
                .preload(lab.s("pre/libnccl.so.2"))
        },
    ));
    for preload in [false, true] {
        c.push(case(
            format!("bsymbolic_functions_direct_and_uncalled{}", if preload { "_with_a_preload" } else { "" }),
            format!("libtorch (-Bsymbolic-functions, NCCL compiled in) calls ncclGetVersion directly and never calls ncclCommFinalize; its libmid.so calls ncclCommInitRank by name{}", if preload { ": the preload answers libmid's call, libtorch's own stays inside — two NCCLs" } else { ", which binds to libtorch's: one NCCL" }),
            move |lab| {
                let torch = symbolic_with_mid(lab, SourceRef::Direct);
                let pre = lab.nccl("pre/libnccl.so.2", V3);
                if preload {
                    let expect = Expect::SplitLocal { version: V1, local: torch.clone(), comm_init: pre.clone() };
                    Setup::library(lab, torch, expect)
                        .never_called(&["ncclCommFinalize"])
                        .preload(pre.to_str().unwrap().to_string())
                } else {
                    Setup::library(lab, torch, binds(lab, V1, How::LinkTime)).never_called(&["ncclCommFinalize"])
                }
            },
        ));
    }
    c.push(case(
        "bsymbolic_functions_address_in_data_with_a_preload",
        "libtorch (-Bsymbolic-functions) calls ncclGetVersion only through a pointer in its data (a RELATIVE relocation); libmid.so calls ncclCommInitRank by name, which the preload answers: two NCCLs",
        |lab| {
            let torch = symbolic_with_mid(lab, SourceRef::Pointer);
            let pre = lab.nccl("pre/libnccl.so.2", V3);
            let expect = Expect::SplitLocal { version: V1, local: torch.clone(), comm_init: pre.clone() };
            Setup::library(lab, torch, expect).preload(pre.to_str().unwrap().to_string())
        },
    ));
    c.push(case(
        "hidden_nccl_in_the_library_and_another_nccl_imported",
        "libtorch has NCCL compiled in with hidden symbols; its libmid.so imports ncclCommInitRank from libnccl.so.2 (another NCCL): two NCCLs",
        |lab| {
            let hidden = r#"__attribute__((visibility("hidden")))"#;
            let source = format!("{}{MID_CALLER}", loader_fixture::nccl_source(V1, Funcs::Both, hidden));
            let nccl = lab.nccl("lib/nccl/libnccl.so.2", V2);
            lab.lib("lib/libmid.so", Some("libmid.so"), MID, &["libnccl.so.2"], &[lab.runpath(&["$ORIGIN/nccl"])]);
            let torch = lab.torch_from("lib/libtorch_cuda.so", Some(V1), &source, &["libmid.so"], &["-O1".into(), lab.runpath(&["$ORIGIN"])]);
            let expect = Expect::SplitLocal { version: V1, local: torch.clone(), comm_init: nccl };
            Setup::library(lab, torch, expect)
        },
    ));
    c.push(case(
        "dlopen_capable_program_with_an_uncalled_nccl",
        "a program that links libnccl.so.2 but calls none of it, and dlopens a library calling nccl* by name: which NCCL runs is decided by what it opens, which no file names",
        |lab| {
            let nccl = lab.nccl("nccl/libnccl.so.2", V1);
            let plugin = lab.torch("plugin/libplugin.so", &[], &[]);
            let prog = lab.path("bin/prog");
            std::fs::create_dir_all(prog.parent().unwrap()).unwrap();
            let link = [
                format!("-L{}", lab.s("nccl")),
                "-Wl,--no-as-needed".to_string(),
                "-l:libnccl.so.2".to_string(),
                lab.runpath(&["nccl"]),
                "-ldl".to_string(),
            ];
            let refs: Vec<&str> = link.iter().map(String::as_str).collect();
            compile(&dlopen_main(&plugin), &prog, &refs);
            Setup::executable(prog, Expect::Later { version: V1, file: nccl })
                .reason(&["dlopen", "2.27.5"])
        },
    ));
    c
}

/// libmid.so's side: calls ncclCommInitRank by name (it defines none).
const MID: &str = "int ncclCommInitRank(void **c, int n, int id, int r);\nint mid_init(void) { void *c = 0; return ncclCommInitRank(&c, 1, 0, 0); }\n";
/// libtorch's side when libmid.so makes the ncclCommInitRank call.
const MID_CALLER: &str = "int mid_init(void);\nint torch_nccl_version(void) { int v = 0; ncclGetVersion(&v); mid_init(); return v; }\n";

/// A libtorch_cuda.so with NCCL V1 compiled in and exported, built `-O0` (its own calls
/// go through the PLT), defining ncclCommFinalize (preceded by `attr`) and
/// ncclCommCuDevice, which nothing calls — as torch 1.13.1's libtorch_cuda_cpp.so defines
/// 3 of its 26 exported nccl* functions. Checked: no relocation names those two.
fn uncalled_exports(lab: &Lab, attr: &str, link: &[String]) -> PathBuf {
    let source = format!(
        "{}{attr} int ncclCommFinalize(void *c) {{ return c != 0; }}\nint ncclCommCuDevice(void *c, int *d) {{ *d = 0; return c != 0; }}\n{}",
        loader_fixture::nccl_source(V1, Funcs::Both, ""),
        loader_fixture::CALLER
    );
    let mut flags = vec!["-O0".to_string()];
    flags.extend(link.iter().cloned());
    let torch = lab.torch_from("lib/libtorch_cuda.so", Some(V1), &source, &[], &flags);
    let named = relocated_names(&torch);
    for f in ["ncclGetVersion", "ncclCommInitRank"] {
        assert!(
            named.iter().any(|n| n == f),
            "fixture: no relocation names {f}: {named:?}"
        );
    }
    for f in ["ncclCommFinalize", "ncclCommCuDevice"] {
        assert!(
            !named.iter().any(|n| n == f),
            "fixture: a relocation names {f}: {named:?}"
        );
    }
    torch
}

/// How libtorch reaches its own ncclGetVersion in [`symbolic_with_mid`].
#[derive(Clone, Copy)]
enum SourceRef {
    /// A direct call.
    Direct,
    /// Through a function pointer initialised in its data.
    Pointer,
}

/// `lib/libtorch_cuda.so` with NCCL V1 compiled in, linked `-Bsymbolic-functions`, needing
/// `lib/libmid.so` (which calls ncclCommInitRank by name); ncclCommFinalize is defined and
/// called by nothing. Checked: no relocation of libtorch names an nccl* function, and
/// with a pointer, a RELATIVE relocation stores ncclGetVersion's address.
fn symbolic_with_mid(lab: &Lab, how: SourceRef) -> PathBuf {
    let caller = match how {
        SourceRef::Direct => MID_CALLER.to_string(),
        SourceRef::Pointer => "int mid_init(void);\n__attribute__((used)) static int (*fdl_get_version)(int *) = ncclGetVersion;\nint torch_nccl_version(void) { int v = 0; fdl_get_version(&v); mid_init(); return v; }\n".to_string(),
    };
    let source = format!(
        "{}int ncclCommFinalize(void *c) {{ return c != 0; }}\n{caller}",
        loader_fixture::nccl_source(V1, Funcs::Both, "")
    );
    lab.lib("lib/libmid.so", Some("libmid.so"), MID, &[], &[]);
    let flags = [
        "-O0".to_string(),
        "-Wl,-Bsymbolic-functions".to_string(),
        lab.runpath(&["$ORIGIN"]),
    ];
    let torch = lab.torch_from(
        "lib/libtorch_cuda.so",
        Some(V1),
        &source,
        &["libmid.so"],
        &flags,
    );
    let named = relocated_names(&torch);
    assert!(
        !named.iter().any(|n| n.starts_with("nccl")),
        "fixture: a relocation names nccl*: {named:?}"
    );
    if let SourceRef::Pointer = how {
        let out = Command::new("readelf")
            .args(["-r", "-W"])
            .arg(&torch)
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("R_X86_64_RELATIVE"),
            "fixture: no RELATIVE relocation"
        );
    }
    torch
}

/// One `binding file FROM [n] to TO [n]: normal symbol `NAME'` line of LD_DEBUG.
#[derive(Debug, Clone)]
struct Binding {
    to: PathBuf,
    symbol: String,
}

fn parse_binding(line: &str) -> Option<Binding> {
    let rest = line.split_once("binding file ")?.1;
    let rest = rest.split_once("] to ")?.1;
    let (to, rest) = rest.split_once(" [")?;
    let symbol = rest.split_once('`')?.1.split_once('\'')?.0;
    Some(Binding {
        to: PathBuf::from(to),
        symbol: symbol.to_string(),
    })
}

/// X of each `ERROR: ld.so: object 'X' from LD_PRELOAD cannot be preloaded (…): ignored.`
fn parse_ignored(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("ERROR: ld.so: object '")?;
            let (x, _) = rest.rsplit_once("' from LD_PRELOAD cannot be preloaded (")?;
            Some(x.to_string())
        })
        .collect()
}

/// The files `LD_TRACE_LOADED_OBJECTS=1` lists, in its order, canonical (`not found`
/// and the vDSO, which is no file, left out). A library found through an empty
/// LD_LIBRARY_PATH element or a relative preload is listed by a relative name.
fn parse_trace(stdout: &str, cwd: &Path) -> Vec<PathBuf> {
    stdout
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l.split_once(" => ").map_or(l, |(_, r)| r);
            let (path, _) = l.rsplit_once(" (0x")?;
            cwd.join(path).canonicalize().ok()
        })
        .collect()
}

/// `p` canonical, a relative `p` taken from `cwd` (the loader names a library it found
/// through a relative directory by a relative path).
fn canon_in(cwd: &Path, p: &Path) -> PathBuf {
    let full = cwd.join(p);
    full.canonicalize().unwrap_or(full)
}

fn canon(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|_| p.to_path_buf())
}

/// What the real process did.
struct Observed {
    cwd: PathBuf,
    code: Option<i32>,
    stdout: String,
    stderr: String,
    version: Option<u32>,
    bindings: Vec<Binding>,
    ignored: Vec<String>,
    trace: Vec<PathBuf>,
    trace_text: String,
    /// The bindings of a run with `LD_BIND_NOW=1` (every relocation bound at start); only
    /// for cases that name functions never called.
    bind_now: Vec<Binding>,
}

impl Observed {
    /// Distinct canonical objects `symbol` bound to.
    fn targets(&self, symbol: &str) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = Vec::new();
        for b in self.bindings.iter().filter(|b| b.symbol == symbol) {
            let t = canon_in(&self.cwd, &b.to);
            if !out.contains(&t) {
                out.push(t);
            }
        }
        out
    }

    fn nccl_targets(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = Vec::new();
        for b in self
            .bindings
            .iter()
            .filter(|b| b.symbol.starts_with("nccl"))
        {
            let t = canon_in(&self.cwd, &b.to);
            if !out.contains(&t) {
                out.push(t);
            }
        }
        out
    }
}

/// The directory a case runs in: its own, or the lab.
fn case_cwd(lab: &Lab, s: &Setup) -> PathBuf {
    s.cwd.clone().unwrap_or_else(|| lab.root().to_path_buf())
}

fn loader_env(cmd: &mut Command, s: &Setup, cwd: &Path) {
    cmd.env_clear().current_dir(cwd);
    if let Some(p) = &s.preload {
        cmd.env("LD_PRELOAD", p);
    }
    if let Some(p) = &s.library_path {
        cmd.env("LD_LIBRARY_PATH", p);
    }
}

fn observe(lab: &Lab, s: &Setup) -> Observed {
    let cwd = case_cwd(lab, s);
    let mut cmd = Command::new(&s.program);
    loader_env(&mut cmd, s, &cwd);
    cmd.env("LD_DEBUG", "bindings");
    let out = cmd.output().expect("run the case's program");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let version = stdout
        .lines()
        .find_map(|l| l.strip_prefix("version="))
        .and_then(|v| v.trim().parse().ok());
    let bindings = stderr.lines().filter_map(parse_binding).collect();
    let ignored = parse_ignored(&stderr);

    let mut cmd = Command::new(&s.program);
    loader_env(&mut cmd, s, &cwd);
    cmd.env("LD_TRACE_LOADED_OBJECTS", "1");
    let traced = cmd.output().expect("trace the case's program");
    let trace_text = String::from_utf8_lossy(&traced.stdout).into_owned();
    let mut bind_now = Vec::new();
    if !s.never_called.is_empty() {
        let mut cmd = Command::new(&s.program);
        loader_env(&mut cmd, s, &cwd);
        cmd.env("LD_DEBUG", "bindings").env("LD_BIND_NOW", "1");
        let out = cmd
            .output()
            .expect("run the case's program with LD_BIND_NOW=1");
        bind_now = String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter_map(parse_binding)
            .collect();
    }
    Observed {
        bind_now,
        trace: parse_trace(&trace_text, &cwd),
        cwd,
        code: out.status.code(),
        stdout,
        stderr,
        version,
        bindings,
        ignored,
        trace_text,
    }
}

fn evidence(case: &Case, s: &Setup, o: &Observed) -> String {
    let mut e = format!(
        "case: {}\nclaim: {}\nexpect: {:?}\nprogram: {}\nfdl is given: {}\ncwd: {}\nLD_PRELOAD: {:?}\nLD_LIBRARY_PATH: {:?}\n\
         --- real process (LD_DEBUG=bindings) ---\nexit status: {:?}\nstdout: {}\n",
        case.name,
        case.claim,
        s.expect,
        s.program.display(),
        s.object.display(),
        o.cwd.display(),
        s.preload,
        s.library_path,
        o.code,
        o.stdout.trim(),
    );
    e.push_str("stderr, nccl* bindings and loader errors:\n");
    for l in o.stderr.lines() {
        let keep = parse_binding(l).is_some_and(|b| b.symbol.starts_with("nccl"))
            || l.starts_with("ERROR: ld.so")
            || l.contains("error while loading shared libraries")
            || l.contains("symbol lookup error")
            || l.starts_with("dlopen:");
        if keep {
            e.push_str("  ");
            e.push_str(l.trim());
            e.push('\n');
        }
    }
    e.push_str("--- LD_TRACE_LOADED_OBJECTS=1 ---\n");
    e.push_str(&o.trace_text);
    e
}

/// The ground truth for fdl: what the process printed and the object LD_DEBUG says
/// answered it (for calls bound at link time, which LD_DEBUG does not show: the object
/// holding the printed version — every stand-in's is distinct).
struct Truth {
    version: u32,
    file: PathBuf,
}

/// Checks the real process against the case's expectation.
fn check_oracle(lab: &Lab, s: &Setup, o: &Observed) -> Result<Option<Truth>, Vec<String>> {
    let mut errs = Vec::new();
    if o.ignored != s.ignored {
        errs.push(format!(
            "glibc ignored the preloads {:?}, the case says {:?}",
            o.ignored, s.ignored
        ));
    }
    let gv = o.targets("ncclGetVersion");
    let mut truth = None;
    for name in &s.never_called {
        let bound: Vec<&Binding> = o.bind_now.iter().filter(|b| b.symbol == *name).collect();
        if !bound.is_empty() {
            errs.push(format!(
                "{name} should be called by nothing, but LD_BIND_NOW=1 binds it: {bound:?}"
            ));
        }
    }
    if !s.never_called.is_empty() && o.bind_now.is_empty() {
        errs.push("the LD_BIND_NOW=1 run printed no binding at all".into());
    }
    match &s.expect {
        Expect::Binds { version, file, how } => {
            if o.code != Some(0) || o.version != Some(version.code()) {
                errs.push(format!(
                    "the process should print version={} (exit 0), it printed {:?} (exit {:?})",
                    version.code(),
                    o.version,
                    o.code
                ));
            }
            match how {
                How::Runtime => {
                    if gv != [canon(file)] {
                        errs.push(format!(
                            "LD_DEBUG should bind ncclGetVersion to {} only, it shows {gv:?}",
                            file.display()
                        ));
                    }
                    let all = o.nccl_targets();
                    if all.len() != 1 {
                        errs.push(format!("the nccl* calls bind to several objects: {all:?}"));
                    }
                }
                How::LinkTime => {
                    if !gv.is_empty() {
                        errs.push(format!(
                            "ncclGetVersion should be bound at link time (no LD_DEBUG line), LD_DEBUG shows {gv:?}"
                        ));
                    }
                }
            }
            if !o.trace.contains(&canon(file)) {
                errs.push(format!("{} is not in the traced link map", file.display()));
            }
            if let Some(v) = o.version {
                // Runtime: the LD_DEBUG target; link time: the stand-in of that version.
                let file = gv.first().cloned().or_else(|| lab.file_of(v));
                truth = file.map(|file| Truth { version: v, file });
            }
        }
        Expect::Split {
            version,
            get_version,
            comm_init,
        } => {
            if o.code != Some(0) || o.version != Some(version.code()) {
                errs.push(format!(
                    "the process should print version={}, it printed {:?} (exit {:?})",
                    version.code(),
                    o.version,
                    o.code
                ));
            }
            if gv != [canon(get_version)] {
                errs.push(format!(
                    "ncclGetVersion should bind to {}, LD_DEBUG shows {gv:?}",
                    get_version.display()
                ));
            }
            let ci = o.targets("ncclCommInitRank");
            if ci != [canon(comm_init)] {
                errs.push(format!(
                    "ncclCommInitRank should bind to {}, LD_DEBUG shows {ci:?}",
                    comm_init.display()
                ));
            }
        }
        Expect::Fails { stderr, code } => {
            if o.code != Some(*code) || o.version.is_some() || !o.stderr.contains(stderr.as_str()) {
                errs.push(format!(
                    "the process should fail to start (exit {code}) with {stderr:?}; it exited {:?}, printed {:?}",
                    o.code, o.version
                ));
                if let Some(sys) = system_libnccl() {
                    errs.push(format!(
                        "note: this machine's default library path holds {sys}, which the real loader falls back to"
                    ));
                }
            }
        }
        Expect::SplitLocal {
            version,
            local,
            comm_init,
        } => {
            if o.code != Some(0) || o.version != Some(version.code()) {
                errs.push(format!(
                    "the process should print version={} (from {}), it printed {:?} (exit {:?})",
                    version.code(),
                    local.display(),
                    o.version,
                    o.code
                ));
            }
            if !gv.is_empty() {
                errs.push(format!(
                    "ncclGetVersion should be bound at link time (no LD_DEBUG line), LD_DEBUG shows {gv:?}"
                ));
            }
            let ci = o.targets("ncclCommInitRank");
            if ci != [canon(comm_init)] {
                errs.push(format!(
                    "ncclCommInitRank should bind to {}, LD_DEBUG shows {ci:?}",
                    comm_init.display()
                ));
            }
            if canon(local) == canon(comm_init) {
                errs.push("fixture: the two sides of the split are one file".into());
            }
        }
        Expect::Later { version, file } => {
            if o.code != Some(0) || o.version != Some(version.code()) {
                errs.push(format!(
                    "the process should print version={} (from a library it dlopens), it printed {:?} (exit {:?})",
                    version.code(),
                    o.version,
                    o.code
                ));
            }
            if gv != [canon(file)] {
                errs.push(format!(
                    "the dlopened library's ncclGetVersion should bind to {}, LD_DEBUG shows {gv:?}",
                    file.display()
                ));
            }
            if !o.trace.contains(&canon(file)) {
                errs.push(format!("{} is not loaded at start", file.display()));
            }
        }
        Expect::Dlopen { version, file } => {
            if o.code != Some(0) || o.version != Some(version.code()) {
                errs.push(format!(
                    "the process should print version={} (found by dlopen), it printed {:?} (exit {:?})",
                    version.code(),
                    o.version,
                    o.code
                ));
            }
            // Not in the link map at start: nothing but running it tells which NCCL.
            if o.trace.contains(&canon(file)) {
                errs.push(format!(
                    "{} is loaded at start, not by dlopen",
                    file.display()
                ));
            }
        }
    }
    if errs.is_empty() {
        Ok(truth)
    } else {
        Err(errs)
    }
}

/// A libnccl.so.2 the loader's default search (ld.so.cache) would find, if any.
fn system_libnccl() -> Option<String> {
    let out = Command::new("ldconfig").arg("-p").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.trim_start().starts_with("libnccl.so.2 "))
        .map(|l| l.trim().to_string())
}

struct FdlRun {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn run_fdl(lab: &Lab, s: &Setup) -> FdlRun {
    let root = tempfile::tempdir().unwrap();
    let mut cmd = fdl_in(root.path());
    cmd.env_remove("LD_PRELOAD")
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("FDL_ROOT")
        .args(["nccl", "detect"])
        .arg(&s.object)
        .arg("--preload")
        .arg(s.preload.as_deref().unwrap_or(""))
        .arg("--library-path")
        .arg(s.library_path.as_deref().unwrap_or(""))
        .arg("--json")
        .current_dir(case_cwd(lab, s));
    let out = cmd.output().expect("run fdl");
    FdlRun {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Checks fdl's answer against the real process.
fn check_fdl(lab: &Lab, s: &Setup, o: &Observed, truth: Option<&Truth>, f: &FdlRun) -> Vec<String> {
    let mut errs = Vec::new();
    let v: Value = match serde_json::from_str(&f.stdout) {
        Ok(v) => v,
        Err(e) => {
            return vec![format!(
                "fdl's stdout is not one JSON object ({e}); exit {:?}",
                f.code
            )]
        }
    };
    let answer = v["answer"].as_str().unwrap_or("(missing)");

    // 4. skipped preloads: glibc's printed list, plus any it drops silently.
    let mut entries: Vec<String> = v["skipped_preloads"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| e["entry"].as_str().unwrap_or("(no entry)").to_string())
                .collect()
        })
        .unwrap_or_default();
    if !v["skipped_preloads"].is_array() {
        errs.push("fdl's JSON has no skipped_preloads array".into());
    }
    for d in &s.silently_dropped {
        if let Some(i) = entries.iter().position(|e| e == d) {
            entries.remove(i);
        }
    }
    if entries != o.ignored {
        errs.push(format!(
            "skipped_preloads entries {entries:?}, glibc ignored {:?}",
            o.ignored
        ));
    }

    let want_exit = |errs: &mut Vec<String>, code: i32| {
        if f.code != Some(code) {
            errs.push(format!("fdl exited {:?}, should be {code}", f.code));
        }
    };
    match &s.expect {
        Expect::Binds { .. } => {
            want_exit(&mut errs, 0);
            if answer != "nccl" {
                errs.push(format!("answer {answer:?}, the process ran NCCL"));
            }
            match truth {
                Some(t) => {
                    let det = &v["nccl"]["detection"];
                    let want = Ver::from_code(t.version).dotted();
                    if v["nccl"]["found"] != true || det["version"] != want.as_str() {
                        errs.push(format!(
                            "nccl.detection.version {}, the process printed {} ({want})",
                            det["version"], t.version
                        ));
                    }
                    let file = det["file"].as_str().map(|p| canon(Path::new(p)));
                    if file.as_deref() != Some(t.file.as_path()) {
                        errs.push(format!(
                            "nccl.detection.file {:?}, the call bound to {}",
                            det["file"],
                            t.file.display()
                        ));
                    }
                }
                None => errs.push("no ground truth (the oracle failed)".into()),
            }
            check_link_map(lab, s, o, &v, &mut errs);
        }
        Expect::Split { .. } | Expect::SplitLocal { .. } => {
            want_exit(&mut errs, 3);
            if answer != "split" {
                errs.push(format!("answer {answer:?}, the calls bind to two objects"));
            }
            check_link_map(lab, s, o, &v, &mut errs);
        }
        Expect::Fails { .. } | Expect::Dlopen { .. } | Expect::Later { .. } => {
            want_exit(&mut errs, 3);
            if answer != "unknown" {
                errs.push(format!("answer {answer:?}, should be \"unknown\""));
            }
            let reason = v["reason"].as_str().unwrap_or("");
            for want in &s.reason {
                if !reason.contains(want) {
                    errs.push(format!("reason {reason:?} does not contain {want:?}"));
                }
            }
        }
    }
    errs
}

/// fdl's link map, restricted to the case's own files (not the program), is the order in
/// which the real loader loaded them.
fn check_link_map(lab: &Lab, s: &Setup, o: &Observed, v: &Value, errs: &mut Vec<String>) {
    let program = canon(&s.program);
    let ours = |p: PathBuf| -> Option<PathBuf> {
        let c = canon_in(&o.cwd, &p);
        (c.exists() && c.starts_with(lab.root()) && c != program).then_some(c)
    };
    let Some(list) = v["link_map"].as_array() else {
        errs.push("fdl's JSON has no link_map array".into());
        return;
    };
    let fdl: Vec<PathBuf> = list
        .iter()
        .filter_map(|e| e["path"].as_str().map(PathBuf::from))
        .filter_map(ours)
        .collect();
    let real: Vec<PathBuf> = o.trace.iter().cloned().filter_map(ours).collect();
    if fdl != real {
        errs.push(format!(
            "link_map (the case's files) {fdl:#?}\nthe real loader loaded {real:#?}"
        ));
    }
}

fn log_dir(sub: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(sub);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Writes `text` to `dir/name.log` whole (through a rename), returning its path.
fn write_log(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(format!("{name}.log"));
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path
}

fn run_case(name: &str) -> Result<(), String> {
    let cases = cases();
    let case = cases
        .iter()
        .find(|c| c.name == name)
        .ok_or_else(|| format!("no case {name}"))?;
    let logs = log_dir("loader-matrix");
    let lab = Lab::new();
    let setup = (case.build)(&lab);
    let observed = observe(&lab, &setup);
    let mut text = evidence(case, &setup, &observed);
    let mut errs = Vec::new();
    let oracle = check_oracle(&lab, &setup, &observed);
    match &oracle {
        Ok(_) => text.push_str("--- the real process did what the case claims ---\n"),
        Err(e) => {
            errs.extend(e.iter().map(|e| format!("fixture: {e}")));
            text.push_str("--- the real process did NOT do what the case claims ---\n");
        }
    }
    let f = run_fdl(&lab, &setup);
    text.push_str(&format!(
        "--- fdl nccl detect (exit {:?}) ---\nstdout: {}\nstderr: {}\n",
        f.code,
        f.stdout.trim(),
        f.stderr.trim()
    ));
    if let Ok(truth) = &oracle {
        errs.extend(check_fdl(&lab, &setup, &observed, truth.as_ref(), &f));
    }
    let log = write_log(&logs, &case.name, &text);
    if errs.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{}\n--- evidence ({}) ---\n{text}",
        errs.join("\n"),
        log.display()
    ))
}

/// The answer a correct fdl gives, made from what the real loader did.
fn ideal_answer(s: &Setup, o: &Observed, truth: Option<&Truth>) -> Value {
    let answer = match s.expect {
        Expect::Binds { .. } => "nccl",
        Expect::Split { .. } | Expect::SplitLocal { .. } => "split",
        Expect::Fails { .. } | Expect::Dlopen { .. } | Expect::Later { .. } => "unknown",
    };
    let nccl = match truth {
        Some(t) => json!({"found": true, "detection": {
            "version": Ver::from_code(t.version).dotted(), "cuda": "12.9", "file": t.file}}),
        None => json!({"found": false}),
    };
    let skipped: Vec<Value> = o
        .ignored
        .iter()
        .chain(&s.silently_dropped)
        .map(|e| json!({"entry": e, "reason": "as glibc"}))
        .collect();
    let link_map: Vec<Value> = o
        .trace
        .iter()
        .map(|p| json!({"path": p, "found_by": "as glibc"}))
        .collect();
    json!({"answer": answer, "nccl": nccl, "reason": s.reason.join(" "),
           "skipped_preloads": skipped, "link_map": link_map})
}

fn as_run(v: &Value, code: i32) -> FdlRun {
    FdlRun {
        code: Some(code),
        stdout: v.to_string(),
        stderr: String::new(),
    }
}

/// The fdl-side checks accept a right answer and reject each kind of wrong one, so a
/// pass of `fdl_agrees_with_the_real_loader` means something.
fn the_checks_accept_the_right_answer_and_reject_wrong_ones() {
    let picked = [
        "preload_after_a_missing_entry",
        "library_path_empty_element_is_cwd",
        "preload_overlong_element_dropped_silently",
        "same_soname_reached_twice_b_first",
        "split_between_preload_and_bundled",
        "pip_dist_info_pin_without_the_wheel",
    ];
    let cases = cases();
    for name in picked {
        let case = cases.iter().find(|c| c.name == name).unwrap();
        let lab = Lab::new();
        let s = (case.build)(&lab);
        let o = observe(&lab, &s);
        let truth = match check_oracle(&lab, &s, &o) {
            Ok(t) => t,
            Err(e) => panic!("{name}: fixture: {e:?}"),
        };
        let good = ideal_answer(&s, &o, truth.as_ref());
        let code = if good["answer"] == "nccl" { 0 } else { 3 };
        let errs = check_fdl(&lab, &s, &o, truth.as_ref(), &as_run(&good, code));
        assert!(
            errs.is_empty(),
            "{name}: the right answer was rejected: {errs:?}\n{good:#}"
        );

        let mut wrong: Vec<(&str, Value, i32)> =
            vec![("exit status", good.clone(), if code == 0 { 3 } else { 0 })];
        let mut w = good.clone();
        w["answer"] = json!(if good["answer"] == "unknown" {
            "nccl"
        } else {
            "unknown"
        });
        wrong.push(("answer", w, code));
        let mut w = good.clone();
        w["skipped_preloads"]
            .as_array_mut()
            .unwrap()
            .insert(0, json!({"entry": "/bogus.so", "reason": "x"}));
        wrong.push(("an extra skipped preload", w, code));
        if let Some(t) = &truth {
            let mut w = good.clone();
            w["nccl"]["detection"]["version"] = json!(Ver::from_code(t.version + 1).dotted());
            wrong.push(("version", w, code));
            let mut w = good.clone();
            w["nccl"]["detection"]["file"] = json!(s.program);
            wrong.push(("file", w, code));
        }
        let lab_files = o.trace.iter().filter(|p| p.starts_with(lab.root())).count();
        if lab_files >= 1 && good["answer"] != "unknown" {
            let mut w = good.clone();
            let list = w["link_map"].as_array_mut().unwrap();
            if lab_files >= 2 {
                list.reverse();
                wrong.push(("link map order", w, code));
            } else {
                list.clear();
                wrong.push(("link map", w, code));
            }
        }
        if !s.ignored.is_empty() {
            let mut w = good.clone();
            w["skipped_preloads"].as_array_mut().unwrap().remove(0);
            wrong.push(("a missing skipped preload", w, code));
        }
        if !s.reason.is_empty() {
            let mut w = good.clone();
            w["reason"] = json!("no idea");
            wrong.push(("reason", w, code));
        }
        for (what, w, c) in wrong {
            let errs = check_fdl(&lab, &s, &o, truth.as_ref(), &as_run(&w, c));
            assert!(
                !errs.is_empty(),
                "{name}: a wrong {what} was accepted:\n{w:#}"
            );
        }
    }
}

fn the_matrix_is_large_and_named_uniquely() {
    let cases = cases();
    assert!(cases.len() >= 30, "only {} cases", cases.len());
    let mut names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    names.sort();
    let before = names.len();
    names.dedup();
    assert_eq!(before, names.len(), "case names repeat");
}

/// A real torch wheel's libtorch_cuda.so laid out as pip installs it, resolved by the
/// real loader.
struct RealLayout {
    lab: Lab,
    torch: PathBuf,
    /// The path the loader names for libnccl.so.2 (before canonicalization).
    resolved: PathBuf,
    version: u32,
    trace: String,
}

/// Lays out `var`'s libtorch_cuda.so (see [`real_pip_layouts_match_the_loader`]) and asks
/// the real loader where its libnccl.so.2 comes from, and that file's ncclGetVersion.
fn real_layout(var: &str) -> RealLayout {
    let real_torch = oracle_input(var);
    let real_nccl = real_torch
        .parent()
        .unwrap()
        .join("../../nvidia/nccl/lib/libnccl.so.2");
    assert!(
        real_nccl.exists(),
        "{var}: {} has no ../../nvidia/nccl/lib/libnccl.so.2 beside it",
        real_torch.display()
    );
    let lab = Lab::new();
    let torch = lab.mkdir("site/torch/lib").join("libtorch_cuda.so");
    let nccl = lab.mkdir("site/nvidia/nccl/lib").join("libnccl.so.2");
    std::os::unix::fs::symlink(canon(&real_nccl), &nccl).unwrap();
    std::os::unix::fs::symlink(canon(&real_torch), &torch).unwrap();
    let program = lab.program_by_path(&torch);

    let run_trace = || -> String {
        let out = Command::new(&program)
            .env_clear()
            .current_dir(lab.root())
            .env("LD_TRACE_LOADED_OBJECTS", "1")
            .output()
            .unwrap();
        assert!(out.status.success(), "{var}: trace failed: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Stub what is missing until the whole closure resolves (stubs need nothing).
    let mut trace = run_trace();
    for _ in 0..3 {
        let missing: Vec<String> = trace
            .lines()
            .filter_map(|l| l.trim().strip_suffix(" => not found").map(str::to_string))
            .collect();
        if missing.is_empty() {
            break;
        }
        for name in &missing {
            compile(
                "int fdl_empty_stub;\n",
                &torch.parent().unwrap().join(name),
                &["-shared", "-fPIC", &format!("-Wl,-soname,{name}")],
            );
        }
        trace = run_trace();
    }
    assert!(
        !trace.contains("not found"),
        "{var}: still unresolved:\n{trace}"
    );
    let resolved = trace
        .lines()
        .find_map(|l| l.trim().strip_prefix("libnccl.so.2 => "))
        .and_then(|r| r.rsplit_once(" (0x"))
        .map(|(p, _)| PathBuf::from(p))
        .unwrap_or_else(|| panic!("{var}: the loader did not load libnccl.so.2:\n{trace}"));
    // $ORIGIN was the symlink's directory: the path the loader names lies in the layout.
    assert!(
        resolved.starts_with(lab.root().join("site/torch/lib")),
        "{var}: $ORIGIN did not stay in the layout: {}\n{trace}",
        resolved.display()
    );
    assert_eq!(canon(&resolved), canon(&real_nccl), "{var}");
    let version = common::oracle::nccl_get_version(&resolved) as u32;
    RealLayout {
        lab,
        torch,
        resolved,
        version,
        trace,
    }
}

/// The real torch wheels (`.ci/fetch-oracles`), laid out as pip installs them, through
/// the real loader and through fdl.
///
/// Layout, observed with glibc 2.36: a library's `$ORIGIN` is the directory of the path
/// it was opened by, symlinks not resolved (`ldd site/torch/lib/libtorch_cuda.so`, a
/// symlink to the wheel's file, resolves `$ORIGIN/../../nvidia/nccl/lib` under `site/`,
/// not beside the target; the matrix case
/// `origin_of_a_symlinked_library_is_the_link_directory` checks the same on a stand-in).
/// So symlinks make a complete layout without copying 0.5–1 GB files:
/// `site/torch/lib/libtorch_cuda.so` and `site/nvidia/nccl/lib/libnccl.so.2` link to the
/// real files, and every other `DT_NEEDED` missing from it (libcudart, libc10, …) gets an
/// empty stub with that soname in `site/torch/lib` (`$ORIGIN`, on libtorch's RPATH).
/// (An executable differs: run directly, its `$ORIGIN` comes from /proc/self/exe, the
/// symlink's target — case `exe_origin_through_a_symlink_is_the_target_directory`.)
/// The oracle is `LD_TRACE_LOADED_OBJECTS=1` on a program needing that libtorch by path
/// (fdl's library mode exactly), then `ncclGetVersion` of the file it names.
/// Needs the real wheels (`source .ci/fetch-oracles`): ignored unless asked for.
fn real_pip_layouts_match_the_loader() {
    // Both layouts first, so a broken input shows before any disagreement of fdl's.
    let vars = ["FDL_TEST_TORCH_LIB", "FDL_TEST_TORCH_LIB_CU13"];
    let layouts: Vec<RealLayout> = vars.iter().map(|v| real_layout(v)).collect();
    let mut failures = Vec::new();
    for (var, l) in vars.iter().zip(&layouts) {
        let want = Ver::from_code(l.version).dotted();
        let root = tempfile::tempdir().unwrap();
        let out = fdl_in(root.path())
            .env_remove("LD_PRELOAD")
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("FDL_ROOT")
            .current_dir(l.lab.root())
            .args(["nccl", "detect"])
            .arg(&l.torch)
            .args(["--preload", "", "--library-path", "", "--json"])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let evidence = format!(
            "{var}: the loader resolved libnccl.so.2 to {} = {} (ncclGetVersion {}, {want})\n\
             --- fdl nccl detect (exit {:?}) ---\n{stdout}\n{}\n--- LD_TRACE_LOADED_OBJECTS=1 ---\n{}",
            l.resolved.display(),
            canon(&l.resolved).display(),
            l.version,
            out.status.code(),
            String::from_utf8_lossy(&out.stderr),
            l.trace
        );
        let log = write_log(
            &log_dir("loader-matrix"),
            &format!("real-pip-{var}"),
            &evidence,
        );
        eprintln!(
            "{var}: libnccl.so.2 => {} ({want}); evidence in {}",
            canon(&l.resolved).display(),
            log.display()
        );
        let mut errs = Vec::new();
        match serde_json::from_str::<Value>(&stdout) {
            Err(e) => errs.push(format!("fdl's stdout is not JSON: {e}")),
            Ok(v) => {
                if out.status.code() != Some(0) || v["answer"] != "nccl" {
                    errs.push(format!(
                        "answer {} (exit {:?}), should be \"nccl\" (exit 0)",
                        v["answer"],
                        out.status.code()
                    ));
                }
                let det = &v["nccl"]["detection"];
                if det["version"] != want.as_str() {
                    errs.push(format!(
                        "nccl.detection.version {}, the loader's NCCL is {want}",
                        det["version"]
                    ));
                }
                let file = det["file"].as_str().map(|p| canon(Path::new(p)));
                if file != Some(canon(&l.resolved)) {
                    errs.push(format!(
                        "nccl.detection.file {}, the loader's is {}",
                        det["file"],
                        canon(&l.resolved).display()
                    ));
                }
            }
        }
        if !errs.is_empty() {
            failures.push(format!(
                "=== {var} ===\n{}\n--- evidence ({}) ---\n{evidence}",
                errs.join("\n"),
                log.display()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// A trial that runs `f`: its error, or its panic (an assertion's), is the failure.
fn trial(
    name: impl Into<String>,
    f: impl FnOnce() -> Result<(), String> + Send + std::panic::UnwindSafe + 'static,
) -> Trial {
    Trial::test(name, move || {
        let outcome = std::panic::catch_unwind(f).unwrap_or_else(|p| {
            Err(p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".to_string()))
        });
        outcome.map_err(Into::into)
    })
}

/// [`trial`] of a check that asserts.
fn asserting(name: &str, f: fn()) -> Trial {
    trial(name, move || {
        f();
        Ok(())
    })
}

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    let mut trials = vec![
        asserting(
            "the_checks_accept_the_right_answer_and_reject_wrong_ones",
            the_checks_accept_the_right_answer_and_reject_wrong_ones,
        ),
        asserting(
            "the_matrix_is_large_and_named_uniquely",
            the_matrix_is_large_and_named_uniquely,
        ),
        asserting(
            "real_pip_layouts_match_the_loader",
            real_pip_layouts_match_the_loader,
        )
        .with_ignored_flag(true),
    ];
    for case in cases() {
        let name = case.name.clone();
        trials.push(trial(format!("case::{name}"), move || run_case(&name)));
    }
    libtest_mimic::run(&args, trials).exit_code()
}
