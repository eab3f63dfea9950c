//! The loader model's resolution on real shared objects built with `cc`: a pip-style
//! layout (`torch/lib/libtorch_cuda.so` with RUNPATH `$ORIGIN/../../nvidia/nccl/lib`),
//! RPATH vs RUNPATH precedence around LD_LIBRARY_PATH, the cache, a truncated libnccl,
//! and the unresolved case. `tests/loader_matrix/main.rs` holds the model against the real
//! loader case by case.

use fdl::inspect::{self, Linkage, NcclDetection, ResolveRule, TruncatedElf};
use fdl::loader::{which_nccl, Answer, LoaderEnv};
use fdl::version::NcclVersion;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The NCCL the model finds; anything but a definite answer fails the test.
fn nccl_of(lib: &Path, env: &LoaderEnv) -> NcclDetection {
    let w = which_nccl(lib, env).unwrap();
    match w.answer {
        Answer::Nccl { detection } => detection,
        other => panic!("{}: expected an NCCL, got {other:?}", lib.display()),
    }
}

fn cc(args: &[&str]) {
    let out = Command::new("cc").args(args).output().expect("run cc");
    assert!(
        out.status.success(),
        "cc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A stub `libnccl.so.2` in `dir` whose self-id says `version`.
fn stub_nccl(dir: &Path, version: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let c = dir.join("nccl_stub.c");
    std::fs::write(
        &c,
        format!(
            "const char nccl_self_id[] = \"NCCL version {version}+cuda12.9\";\n\
             int ncclGetVersion(int *v) {{ *v = 0; return nccl_self_id[0] == 'N' ? 0 : 1; }}\n"
        ),
    )
    .unwrap();
    let so = dir.join("libnccl.so.2");
    cc(&[
        "-shared",
        "-fPIC",
        "-Wl,-soname,libnccl.so.2",
        "-o",
        so.to_str().unwrap(),
        c.to_str().unwrap(),
    ]);
    std::fs::remove_file(&c).unwrap();
    so
}

/// A library in `dir` that needs libnccl.so.2 (linked against the stub in `link_dir`),
/// with `path_flags` such as `-Wl,--enable-new-dtags,-rpath,...`.
fn consumer(dir: &Path, name: &str, link_dir: &Path, path_flags: &[&str]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let c = dir.join("consumer.c");
    std::fs::write(
        &c,
        "int ncclGetVersion(int *v);\nint torch_nccl_version(void) { int v; ncclGetVersion(&v); return v; }\n",
    )
    .unwrap();
    let so = dir.join(name);
    let link = format!("-L{}", link_dir.display());
    let mut args = vec![
        "-shared",
        "-fPIC",
        "-o",
        so.to_str().unwrap(),
        c.to_str().unwrap(),
        &link,
        "-l:libnccl.so.2",
    ];
    args.extend_from_slice(path_flags);
    cc(&args);
    std::fs::remove_file(&c).unwrap();
    so
}

/// A libnccl.so.2 missing its last 100 bytes still holds its self-id (in a segment that is
/// whole), but its section table, at the end, is gone: every way of asking is an error
/// that says the file is truncated, never a quiet "no NCCL".
#[test]
fn truncated_libnccl_is_reported_as_truncated() {
    let root = tempfile::tempdir().unwrap();
    let sp = root.path().join("site-packages");
    let nccl = stub_nccl(&sp.join("nvidia/nccl/lib"), "2.27.5");
    let torch = consumer(
        &sp.join("torch/lib"),
        "libtorch_cuda.so",
        nccl.parent().unwrap(),
        &["-Wl,--enable-new-dtags,-rpath,$ORIGIN/../../nvidia/nccl/lib"],
    );
    let full = std::fs::read(&nccl).unwrap();
    let kept = full.len() - 100;
    let at = full
        .windows(13)
        .position(|w| w == b"NCCL version ")
        .unwrap();
    assert!(at + 30 < kept, "the self-id must lie in the bytes kept");
    std::fs::write(&nccl, &full[..kept]).unwrap();
    let env = LoaderEnv::bare();
    let said = format!(
        "libnccl.so.2 is truncated: its ELF header says the section headers end at byte {} but the file has {kept} bytes; re-download or re-copy it",
        full.len()
    );
    // `starts` is how the message begins: the file, or the library that loads it.
    let is_truncated = |what: &str, e: anyhow::Error, starts: &str| {
        let msg = format!("{e:#}");
        let t = e
            .downcast_ref::<TruncatedElf>()
            .unwrap_or_else(|| panic!("{what}: not a TruncatedElf: {msg}"));
        assert_eq!((t.end, t.len), (full.len() as u64, kept as u64), "{what}");
        assert!(
            msg.starts_with(starts) && msg.ends_with(&said),
            "{what}: {msg}"
        );
    };
    let direct = format!("{} is truncated", nccl.display());
    is_truncated("inspect", inspect::inspect(&nccl).unwrap_err(), &direct);
    is_truncated(
        "find_nccl_self_id",
        inspect::find_nccl_self_id(&nccl).unwrap_err(),
        &direct,
    );
    is_truncated(
        "which_nccl of the file itself",
        which_nccl(&nccl, &env).unwrap_err(),
        &direct,
    );
    // Through the library that loads it: the answer is unknown, and says why.
    let w = which_nccl(&torch, &env).unwrap();
    match &w.answer {
        Answer::Unknown { reason } => assert!(reason.to_string().contains(&said), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn pip_layout_resolves_through_runpath_origin() {
    let root = tempfile::tempdir().unwrap();
    let sp = root.path().join("site-packages");
    let nccl = stub_nccl(&sp.join("nvidia/nccl/lib"), "2.27.5");
    let torch = consumer(
        &sp.join("torch/lib"),
        "libtorch_cuda.so",
        nccl.parent().unwrap(),
        &["-Wl,--enable-new-dtags,-rpath,$ORIGIN/../../nvidia/nccl/lib"],
    );
    let ins = inspect::inspect(&torch).unwrap();
    assert_eq!(ins.runpath, ["$ORIGIN/../../nvidia/nccl/lib"]);
    assert!(ins.needed.iter().any(|n| n == "libnccl.so.2"));
    assert!(ins.nccl.is_none(), "no NCCL compiled into the consumer");

    let det = nccl_of(&torch, &LoaderEnv::bare());
    assert_eq!(det.version, NcclVersion::new(2, 27, 5));
    assert_eq!(
        det.linkage,
        Linkage::Dynamic {
            needed: "libnccl.so.2".into(),
            via: ResolveRule::Runpath
        }
    );
    assert_eq!(
        std::fs::canonicalize(&det.file).unwrap(),
        std::fs::canonicalize(&nccl).unwrap()
    );

    // The stub itself is detected as static.
    let own = nccl_of(&nccl, &LoaderEnv::bare());
    assert_eq!(own.linkage, Linkage::Static);
}

#[test]
fn rpath_beats_ld_library_path_but_runpath_does_not() {
    let root = tempfile::tempdir().unwrap();
    let a = stub_nccl(&root.path().join("a"), "2.27.5");
    let b = stub_nccl(&root.path().join("b"), "2.26.2");
    let env = LoaderEnv {
        ld_library_path: vec![b.parent().unwrap().to_path_buf()],
        ..LoaderEnv::bare()
    };
    let rpath_flag = format!(
        "-Wl,--disable-new-dtags,-rpath,{}",
        a.parent().unwrap().display()
    );
    let with_rpath = consumer(
        &root.path().join("r"),
        "librp.so",
        a.parent().unwrap(),
        &[&rpath_flag],
    );
    let ins = inspect::inspect(&with_rpath).unwrap();
    assert_eq!(ins.rpath.len(), 1);
    assert!(ins.runpath.is_empty());
    let det = nccl_of(&with_rpath, &env);
    assert_eq!(det.version, NcclVersion::new(2, 27, 5));
    assert!(matches!(
        det.linkage,
        Linkage::Dynamic {
            via: ResolveRule::Rpath,
            ..
        }
    ));

    let runpath_flag = format!(
        "-Wl,--enable-new-dtags,-rpath,{}",
        a.parent().unwrap().display()
    );
    let with_runpath = consumer(
        &root.path().join("n"),
        "librun.so",
        a.parent().unwrap(),
        &[&runpath_flag],
    );
    let det = nccl_of(&with_runpath, &env);
    assert_eq!(det.version, NcclVersion::new(2, 26, 2));
    assert!(matches!(
        det.linkage,
        Linkage::Dynamic {
            via: ResolveRule::LdLibraryPath,
            ..
        }
    ));
    // Without LD_LIBRARY_PATH, RUNPATH finds it.
    let det = nccl_of(&with_runpath, &LoaderEnv::bare());
    assert!(matches!(
        det.linkage,
        Linkage::Dynamic {
            via: ResolveRule::Runpath,
            ..
        }
    ));
}

#[test]
fn cache_and_unresolved() {
    let root = tempfile::tempdir().unwrap();
    let a = stub_nccl(&root.path().join("a"), "2.27.5");
    let lib = consumer(
        &root.path().join("c"),
        "libcons.so",
        a.parent().unwrap(),
        &[],
    );
    // No cache entry and no system directory holds it: the process cannot start, and
    // which NCCL it would run is unknown, naming the library that is missing. (The
    // stand-in program's libc.so.6 comes from the machine's cache.)
    let libc = LoaderEnv::bundled()
        .cache_lookup("libc.so.6")
        .expect("this machine's ld.so.cache lists libc.so.6")
        .to_path_buf();
    let mut env = LoaderEnv {
        default_dirs: vec![a.parent().unwrap().join("none")],
        cache: vec![("libc.so.6".into(), libc.clone())],
        ..LoaderEnv::bare()
    };
    let w = which_nccl(&lib, &env).unwrap();
    assert!(
        matches!(&w.answer, Answer::Unknown { reason } if reason.to_string().contains("libnccl.so.2")),
        "{:?}",
        w.answer
    );
    assert_eq!(w.link_map.failures[0].needed, "libnccl.so.2");

    env.cache = vec![
        ("libnccl.so.2".into(), a.clone()),
        ("libc.so.6".into(), libc),
    ];
    let det = nccl_of(&lib, &env);
    assert!(matches!(
        det.linkage,
        Linkage::Dynamic {
            via: ResolveRule::LdCache,
            ..
        }
    ));

    // A default directory holding it.
    let mut env = LoaderEnv::bare();
    env.default_dirs
        .insert(0, a.parent().unwrap().to_path_buf());
    let det = nccl_of(&lib, &env);
    assert!(matches!(
        det.linkage,
        Linkage::Dynamic {
            via: ResolveRule::DefaultDir,
            ..
        }
    ));

    // A library that does not need NCCL at all.
    let plain = root.path().join("plain.so");
    let c = root.path().join("plain.c");
    std::fs::write(&c, "int f(void) { return 1; }\n").unwrap();
    cc(&[
        "-shared",
        "-fPIC",
        "-o",
        plain.to_str().unwrap(),
        c.to_str().unwrap(),
    ]);
    let w = which_nccl(&plain, &LoaderEnv::bare()).unwrap();
    assert!(matches!(w.answer, Answer::None { .. }), "{:?}", w.answer);
}

#[test]
fn wrong_class_candidates_are_skipped_and_non_elf_ones_stop_the_search() {
    let root = tempfile::tempdir().unwrap();
    let good = stub_nccl(&root.path().join("good"), "2.27.5");
    let lib = consumer(
        &root.path().join("c"),
        "libx.so",
        good.parent().unwrap(),
        &[],
    );
    // An ELF32 "libnccl.so.2" earlier on the path is passed over, as glibc passes it.
    let other = root.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let mut elf32 = b"\x7fELF\x01\x01\x01".to_vec();
    elf32.resize(128, 0);
    std::fs::write(other.join("libnccl.so.2"), &elf32).unwrap();
    let env = LoaderEnv {
        ld_library_path: vec![other.clone(), good.parent().unwrap().to_path_buf()],
        ..LoaderEnv::bare()
    };
    assert_eq!(nccl_of(&lib, &env).file, good.canonicalize().unwrap());
    // A file that is not ELF stops the loader ("file too short", "invalid ELF header"):
    // the process does not start, and the answer says so.
    let bad = root.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("libnccl.so.2"), b"not an ELF file").unwrap();
    let env = LoaderEnv {
        ld_library_path: vec![bad.clone(), good.parent().unwrap().to_path_buf()],
        ..LoaderEnv::bare()
    };
    let w = which_nccl(&lib, &env).unwrap();
    assert!(
        matches!(&w.answer, Answer::Unknown { reason } if reason.to_string().contains("file too short")),
        "{:?}",
        w.answer
    );
}

/// `cc`'s `-shared -fPIC` of `source` into `out` with `extra` flags after the source.
fn shared(out: &Path, source: &str, extra: &[&str]) {
    let c = out.with_extension("c");
    std::fs::write(&c, source).unwrap();
    let mut args = vec![
        "-shared",
        "-fPIC",
        "-o",
        out.to_str().unwrap(),
        c.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    cc(&args);
    std::fs::remove_file(&c).unwrap();
}

/// `fdl ARGS`, with no preload or library path of the test's environment unless `ld`.
fn fdl_out(args: &[&str], ld: Option<&Path>) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fdl"));
    cmd.args(args).env_remove("LD_PRELOAD").env("NO_COLOR", "1");
    match ld {
        Some(d) => cmd.env("LD_LIBRARY_PATH", d),
        None => cmd.env_remove("LD_LIBRARY_PATH"),
    };
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// An unknown answer says its reason once on a screen, shortened: the missing library's
/// error once (in the lines that list what cannot be loaded), never again on stderr,
/// and 32 function names as two and a count; `--json` has the whole reason.
#[test]
fn an_unknown_answer_says_its_reason_once_shortened() {
    let root = tempfile::tempdir().unwrap();
    let names: Vec<String> = (1..=32).map(|i| format!("ncclFunc{i}")).collect();
    let nccl = root.path().join("libnccl.so.2");
    shared(
        &nccl,
        &names
            .iter()
            .map(|n| format!("int {n}(void) {{ return 0; }}\n"))
            .collect::<String>(),
        &["-Wl,-soname,libnccl.so.2"],
    );
    let lib = root.path().join("lib/libtorch_cuda.so");
    std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
    let link = format!("-L{}", root.path().display());
    shared(
        &lib,
        &format!(
            "{}int use(void) {{ return 0{}; }}\n",
            names
                .iter()
                .map(|n| format!("int {n}(void);\n"))
                .collect::<String>(),
            names
                .iter()
                .map(|n| format!(" + {n}()"))
                .collect::<String>()
        ),
        &[&link, "-l:libnccl.so.2"],
    );
    std::fs::remove_file(&nccl).unwrap();
    let lib = lib.to_str().unwrap();
    // The answer wraps at 100 columns: compared with its lines joined.
    let flat = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
    let screen = |o: &str, e: &str| flat(&format!("{o}{e}"));
    let once = |text: &str, what: &str| {
        assert_eq!(text.matches(what).count(), 1, "{what:?}:\n{text}");
    };

    // The library is missing: named in the answer, its error said once, below.
    let (code, out, err) = fdl_out(&["nccl", "detect", lib], None);
    assert_eq!(code, Some(3), "{out}{err}");
    let s = screen(&out, &err);
    assert!(
        flat(&out).contains(
            "not all known, and any of it could define them first: libnccl.so.2 cannot be loaded library"
        ),
        "{out}"
    );
    once(&s, "cannot open shared object file");
    once(&s, "not all known");
    assert_eq!(
        err.trim_end(),
        "unknown: fdl cannot say which NCCL the process runs (exit status 3); the reason is above"
    );
    // inspect gives the short answer (the loader's error is `detect -v`'s), once, and
    // says what it could not judge.
    let (_, out, err) = fdl_out(&["inspect", lib], None);
    once(&screen(&out, &err), "libnccl.so.2 cannot be loaded");
    assert!(flat(&out).contains("is not on this host"), "{out}");

    // Something that defines none of the 32: two names and a count, once; --json has
    // every name.
    let empty = root.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    shared(
        &empty.join("libnccl.so.2"),
        "int other(void) { return 0; }\n",
        &["-Wl,-soname,libnccl.so.2"],
    );
    let (code, out, err) = fdl_out(&["nccl", "detect", lib], Some(&empty));
    assert_eq!(code, Some(3), "{out}{err}");
    let s = screen(&out, &err);
    assert!(
        flat(&out).contains("nothing loaded at start defines ncclFunc1, ncclFunc10 and 30 more: the call fails when made"),
        "{out}"
    );
    once(&s, "nothing loaded at start defines");
    assert!(!s.contains("ncclFunc9"), "{s}");
    assert!(out.contains("`--json` has it all"), "{out}");
    assert!(out.lines().all(|l| l.chars().count() <= 100), "{out}");
    let (_, out, err) = fdl_out(&["nccl", "detect", lib, "--json"], Some(&empty));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let reason = v["reason"].as_str().unwrap();
    assert!(
        names.iter().all(|n| reason.contains(n.as_str())),
        "{reason}"
    );
    assert!(
        err.contains("ncclFunc10 and 30 more") && !err.contains("ncclFunc9"),
        "{err}"
    );
    let (_, out, err) = fdl_out(&["inspect", lib], Some(&empty));
    let s = screen(&out, &err);
    once(&s, "nothing loaded at start defines");
    assert!(!s.contains("ncclFunc9"), "{s}");
    assert!(out.contains("`--json` has it whole"), "{out}");
}
