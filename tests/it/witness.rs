//! The witness (`loader::witness`, `fdl nccl detect --witness`) against the real process:
//! a set of wirings compiled with `cc` ([`loader_fixture`]), each run for real with
//! `LD_DEBUG=bindings` (the oracle: which object `ncclGetVersion` bound to, and the
//! version it printed). For each, the witness must name that object (or see no binding
//! for calls bound at link time), and agree with the model. Then: a model answer broken
//! on purpose is caught; a file that arrived from a peer is refused; a trace that hangs
//! or grows past its bounds is cut and said so; a host whose loader cannot load the
//! object answers with the model alone.

use crate::common;
use crate::loader_fixture;

use fdl::loader::witness::{self, Kind, Limits, Verdict};
use fdl::loader::{self, Answer, LoaderEnv, Which};
use loader_fixture::{Funcs, Lab, Ver};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const V1: Ver = Ver(2, 27, 5);
const V2: Ver = Ver(2, 21, 5);

/// One wiring, built: the real program, what fdl is asked about, the environment.
struct Wiring {
    name: &'static str,
    program: PathBuf,
    object: PathBuf,
    preload: Option<String>,
    library_path: Option<String>,
    /// The process cannot start (exit 127).
    fails: bool,
}

fn canon(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|_| p.to_path_buf())
}

/// What the real process did: exit code, printed version, where each nccl* bound.
struct Real {
    code: Option<i32>,
    version: Option<u32>,
    /// (symbol, canonical object)
    bindings: Vec<(String, PathBuf)>,
    stderr: String,
}

fn run_real(lab: &Lab, w: &Wiring) -> Real {
    let mut cmd = Command::new(&w.program);
    cmd.env_clear().current_dir(lab.root());
    if let Some(p) = &w.preload {
        cmd.env("LD_PRELOAD", p);
    }
    if let Some(p) = &w.library_path {
        cmd.env("LD_LIBRARY_PATH", p);
    }
    cmd.env("LD_DEBUG", "bindings");
    let out = cmd.output().expect("run the wiring's program");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let version = stdout
        .lines()
        .find_map(|l| l.strip_prefix("version="))
        .and_then(|v| v.trim().parse().ok());
    let bindings = stderr
        .lines()
        .filter_map(|l| {
            let rest = l.split_once("binding file ")?.1;
            let rest = rest.split_once("] to ")?.1;
            let (to, rest) = rest.split_once(" [")?;
            let sym = rest.split_once('`')?.1.split_once('\'')?.0;
            sym.starts_with("nccl")
                .then(|| (sym.to_string(), canon(&lab.root().join(to))))
        })
        .collect();
    Real {
        code: out.status.code(),
        version,
        bindings,
        stderr,
    }
}

fn env_of(lab: &Lab, w: &Wiring) -> LoaderEnv {
    let mut env = LoaderEnv::bundled();
    env.cwd = lab.root().to_path_buf();
    env.preload = w.preload.clone().unwrap_or_default();
    env.ld_library_path = match &w.library_path {
        Some(l) => loader::search::split_path_list(l),
        None => Vec::new(),
    };
    env
}

fn lib_mode(lab: &Lab, name: &'static str, torch: PathBuf) -> Wiring {
    Wiring {
        name,
        program: lab.program_by_path(&torch),
        object: torch,
        preload: None,
        library_path: None,
        fails: false,
    }
}

fn bundled(lab: &Lab, v: Ver) -> PathBuf {
    lab.nccl("site/nvidia/nccl/lib/libnccl.so.2", v);
    lab.torch(
        "site/torch/lib/libtorch_cuda.so",
        &["libnccl.so.2"],
        &[lab.runpath(&["$ORIGIN/../../nvidia/nccl/lib"])],
    )
}

fn two_dirs(lab: &Lab) {
    lab.nccl("one/libnccl.so.2", V1);
    lab.nccl("two/libnccl.so.2", V2);
}

type Build = fn(&Lab) -> Wiring;

/// The wirings: preload wins, RPATH against RUNPATH and LD_LIBRARY_PATH, inheritance,
/// calls bound locally, a process that cannot start, a split, a program traced itself.
fn wirings() -> Vec<Build> {
    vec![
        |lab| {
            let t = bundled(lab, V1);
            lib_mode(lab, "pip_layout", t)
        },
        |lab| {
            let t = bundled(lab, V1);
            lab.nccl("two/libnccl.so.2", V2);
            let mut w = lib_mode(lab, "preload_wins", t);
            w.preload = Some(lab.s("two/libnccl.so.2"));
            w
        },
        |lab| {
            // NCCL compiled into libtorch, called through its PLT; a preload defines it
            // first: the preload wins. Tracing the library as the main object would say
            // libtorch (see `tracing_the_library_itself_would_be_wrong`).
            let t = lab.torch_static("lib/libtorch_cuda.so", V1, "", &[]);
            lab.nccl("two/libnccl.so.2", V2);
            let mut w = lib_mode(lab, "preload_beats_compiled_in", t);
            w.preload = Some(lab.s("two/libnccl.so.2"));
            w
        },
        |lab| {
            two_dirs(lab);
            let t = lab.torch(
                "lib/libtorch_cuda.so",
                &["libnccl.so.2"],
                &[lab.rpath(&["one"])],
            );
            let mut w = lib_mode(lab, "rpath_beats_library_path", t);
            w.library_path = Some(lab.s("two"));
            w
        },
        |lab| {
            two_dirs(lab);
            let t = lab.torch(
                "lib/libtorch_cuda.so",
                &["libnccl.so.2"],
                &[lab.runpath(&["one"])],
            );
            let mut w = lib_mode(lab, "library_path_beats_runpath", t);
            w.library_path = Some(lab.s("two"));
            w
        },
        |lab| {
            // DT_RPATH is inherited by the libraries an object loads: libmid finds
            // libnccl through libtorch's.
            two_dirs(lab);
            lab.lib(
                "lib/libmid.so",
                Some("libmid.so"),
                "int mid(void) { return 1; }\n",
                &["libnccl.so.2"],
                &[],
            );
            let t = lab.torch(
                "lib/libtorch_cuda.so",
                &["libmid.so"],
                &[lab.rpath(&["lib", "two"])],
            );
            lib_mode(lab, "rpath_is_inherited", t)
        },
        |lab| {
            two_dirs(lab);
            let t = lab.torch(
                "lib/libtorch_cuda.so",
                &["libnccl.so.2"],
                &[lab.runpath(&["two", "one"])],
            );
            lib_mode(lab, "runpath_in_order", t)
        },
        |lab| {
            // Protected: bound inside libtorch at link time; the preload does not win.
            let t = lab.torch_static(
                "lib/libtorch_cuda.so",
                V1,
                "__attribute__((visibility(\"protected\")))",
                &[],
            );
            lab.nccl("two/libnccl.so.2", V2);
            let mut w = lib_mode(lab, "bound_locally", t);
            w.preload = Some(lab.s("two/libnccl.so.2"));
            w
        },
        |lab| {
            let t = lab.torch("lib/libtorch_cuda.so", &["libnccl.so.2"], &[]);
            let mut w = lib_mode(lab, "cannot_start", t);
            w.fails = true;
            w
        },
        |lab| {
            // A preload with ncclGetVersion only: the calls of one process reach two NCCLs.
            let t = bundled(lab, V1);
            // Another soname: with libnccl.so.2 it would stand for the bundled one.
            lab.nccl_as(
                "two/libnccl-shim.so",
                V2,
                "libnccl-shim.so",
                Funcs::GetVersionOnly,
                &[],
            );
            let mut w = lib_mode(lab, "split", t);
            w.preload = Some(lab.s("two/libnccl-shim.so"));
            w
        },
        |lab| {
            // A preload of soname libnccl.so.2 with ncclGetVersion only stands for the
            // bundled one, which never loads: ncclCommInitRank is bound to nothing.
            let t = bundled(lab, V1);
            lab.nccl_as(
                "two/libnccl.so.2",
                V2,
                "libnccl.so.2",
                Funcs::GetVersionOnly,
                &[],
            );
            let mut w = lib_mode(lab, "preload_same_soname_missing_a_function", t);
            w.preload = Some(lab.s("two/libnccl.so.2"));
            w.fails = true;
            w
        },
        |lab| {
            two_dirs(lab);
            lab.torch(
                "lib/libtorch_cuda.so",
                &["libnccl.so.2"],
                &[lab.runpath(&["one"])],
            );
            let p = lab.program("bin/train", "lib", &[lab.runpath(&["lib"])]);
            Wiring {
                name: "program_traced_itself",
                program: p.clone(),
                object: p,
                preload: None,
                library_path: None,
                fails: false,
            }
        },
        |lab| {
            // A preload by name, found through LD_LIBRARY_PATH.
            let t = bundled(lab, V1);
            lab.nccl("two/libnccl.so.2", V2);
            let mut w = lib_mode(lab, "preload_by_name", t);
            w.preload = Some("libnccl.so.2".into());
            w.library_path = Some(lab.s("two"));
            w
        },
    ]
}

fn model_and_witness(lab: &Lab, w: &Wiring) -> (Which, witness::Witness) {
    let env = env_of(lab, w);
    let which = loader::which_nccl(&w.object, &env).unwrap();
    let wit = witness::ask(&which, &env)
        .unwrap_or_else(|n| panic!("{}: no witness: {}", w.name, n.reason));
    (which, wit)
}

/// Each wiring: the witness names the object the real process bound ncclGetVersion to
/// (or, for calls bound at link time, sees no binding), and agrees with the model.
#[test]
fn the_witness_binds_as_the_real_process_does() {
    let mut errors = Vec::new();
    let all = wirings();
    assert!(all.len() >= 10);
    for build in all {
        let lab = Lab::new();
        let w = build(&lab);
        let real = run_real(&lab, &w);
        let (which, wit) = model_and_witness(&lab, &w);
        let verdict = witness::compare(&which, &wit);
        let name = w.name;
        let mut err = |e: String| {
            errors.push(format!(
                "{name}: {e}\n  witness: {wit:#?}\n  verdict: {verdict:?}\n  real stderr: {}",
                real.stderr
                    .lines()
                    .filter(|l| !l.contains("binding file"))
                    .collect::<Vec<_>>()
                    .join(" | ")
            ))
        };
        if w.fails {
            if real.code != Some(127) {
                err(format!(
                    "the real process was to fail, exited {:?}",
                    real.code
                ));
            }
            if wit.starts() {
                err("the witness says the process starts".into());
            }
            if !matches!(
                verdict,
                Verdict::ModelUnknown { .. } | Verdict::Agree { .. }
            ) {
                err("the verdict is not agreement or the model's unknown".into());
            }
            continue;
        }
        if real.code != Some(0) || real.version.is_none() {
            err(format!("the real process did not run: {:?}", real.code));
            continue;
        }
        let real_gv: Vec<&PathBuf> = real
            .bindings
            .iter()
            .filter(|(s, _)| s == "ncclGetVersion")
            .map(|(_, p)| p)
            .collect();
        let wit_gv: Vec<PathBuf> = wit
            .reached
            .iter()
            .filter(|r| r.symbols.iter().any(|s| s == "ncclGetVersion"))
            .map(|r| canon(&r.object))
            .collect();
        match real_gv.first() {
            Some(obj) => {
                if wit_gv.first() != Some(*obj) {
                    err(format!(
                        "ncclGetVersion bound to {} in the real process, the witness says {wit_gv:?}",
                        obj.display()
                    ));
                }
            }
            None => {
                if !wit_gv.is_empty() {
                    err(format!(
                        "ncclGetVersion bound at link time in the real process; the witness saw {wit_gv:?}"
                    ));
                }
            }
        }
        // Every other nccl* binding of the real run, seen by the witness too.
        for (sym, obj) in &real.bindings {
            if !wit
                .reached
                .iter()
                .any(|r| canon(&r.object) == *obj && r.symbols.contains(sym))
            {
                err(format!(
                    "{sym} → {} of the real run is not in the witness",
                    obj.display()
                ));
            }
        }
        if let (Kind::Nccl, Some(id)) = (wit.kind(), &wit.nccl) {
            let code = id.nccl.major * 10000 + id.nccl.minor * 100 + id.nccl.patch;
            if Some(code) != real.version {
                err(format!(
                    "the witness's NCCL {} is not the printed {:?}",
                    id.nccl, real.version
                ));
            }
        }
        if !matches!(verdict, Verdict::Agree { .. }) {
            err("the witness does not agree with the model".into());
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n\n"));
}

/// The reason a stand-in program is traced: the library as the main object comes before
/// the preload, and its own definition wins — not what the real process does.
#[test]
fn tracing_the_library_itself_would_be_wrong() {
    let lab = Lab::new();
    let w = (wirings()[2])(&lab);
    assert_eq!(w.name, "preload_beats_compiled_in");
    let real = run_real(&lab, &w);
    let preload = canon(&lab.path("two/libnccl.so.2"));
    assert_eq!(real.version, Some(V2.code()), "{}", real.stderr);
    let (_, wit) = model_and_witness(&lab, &w);
    assert_eq!(wit.kind(), Kind::Nccl, "{wit:#?}");
    assert_eq!(canon(&wit.reached[0].object), preload);
    // The same trace with the library as the main object binds to the library itself.
    let dbg = tempfile::tempdir().unwrap();
    let out = Command::new(&wit.interpreter)
        .arg(&w.object)
        .env_clear()
        .env("LD_TRACE_LOADED_OBJECTS", "1")
        .env("LD_WARN", "yes")
        .env("LD_BIND_NOW", "1")
        .env("LD_DEBUG", "bindings")
        .env("LD_DEBUG_OUTPUT", dbg.path().join("t"))
        .env("LD_PRELOAD", w.preload.as_ref().unwrap())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut text = String::new();
    for e in std::fs::read_dir(dbg.path()).unwrap() {
        text.push_str(&std::fs::read_to_string(e.unwrap().path()).unwrap());
    }
    let line = text
        .lines()
        .find(|l| {
            l.contains("symbol `ncclGetVersion'")
                && l.contains(&format!("file {} [", w.object.display()))
        })
        .unwrap_or_else(|| panic!("no binding of ncclGetVersion: {text}"));
    assert!(
        line.contains(&format!("to {} [", w.object.display())),
        "as the main object, libtorch's own definition was to win: {line}"
    );
}

/// A model answer broken on purpose (the preload ignored: the bundled NCCL named) is
/// caught, with both answers.
#[test]
fn a_planted_disagreement_is_caught() {
    let lab = Lab::new();
    let w = (wirings()[1])(&lab);
    assert_eq!(w.name, "preload_wins");
    let (mut which, wit) = model_and_witness(&lab, &w);
    assert!(matches!(
        witness::compare(&which, &wit),
        Verdict::Agree { .. }
    ));
    let bundled = lab.path("site/nvidia/nccl/lib/libnccl.so.2");
    match &mut which.answer {
        Answer::Nccl { detection } => detection.file = bundled.clone(),
        other => panic!("the model was to answer an NCCL: {other:?}"),
    }
    match witness::compare(&which, &wit) {
        Verdict::Disagree { model, loader } => {
            assert!(model.contains(&bundled.display().to_string()), "{model}");
            assert!(loader.contains("two/libnccl.so.2"), "{loader}");
        }
        v => panic!("a broken model answer was not caught: {v:?}"),
    }
    // A model that says "no NCCL" where the loader binds one: caught too.
    which.answer = Answer::None {
        reason: "planted".into(),
    };
    assert!(witness::compare(&which, &wit).is_disagreement());
}

/// Nothing under a directory a peer ships into is given to the loader: not the object,
/// not a preload.
#[test]
fn a_file_received_from_a_peer_is_refused() {
    assert_eq!(
        witness::PEER_DIR_PREFIX,
        fdl::nccl::name::INCOMING_PREFIX,
        "the witness must know the directories a peer ships into"
    );
    let lab = Lab::new();
    let t = bundled(&lab, V1);
    let incoming = lab.mkdir(&format!("builds/{}x/lib", witness::PEER_DIR_PREFIX));
    let copy = incoming.join("libtorch_cuda.so");
    std::fs::copy(&t, &copy).unwrap();
    let env = LoaderEnv {
        cwd: lab.root().to_path_buf(),
        ..LoaderEnv::bundled()
    };
    let which = loader::which_nccl(&copy, &env).unwrap();
    let n = witness::ask(&which, &env).expect_err("a peer's file was traced");
    assert!(n.refused, "{n:?}");
    assert!(n.reason.contains("peer"), "{}", n.reason);
    // The same library named from its own place, with a peer's file preloaded.
    std::fs::copy(
        lab.path("site/nvidia/nccl/lib/libnccl.so.2"),
        incoming.join("libnccl.so.2"),
    )
    .unwrap();
    let mut env = env.clone();
    env.preload = incoming.join("libnccl.so.2").display().to_string();
    let which = loader::which_nccl(&t, &env).unwrap();
    let n = witness::ask(&which, &env).expect_err("a peer's preload was traced");
    assert!(n.refused, "{n:?}");
    // And the command says so, answering with the model alone.
    let out = common::fdl_in(lab.root())
        .args(["nccl", "detect", "--witness"])
        .arg(&copy)
        .env_remove("LD_PRELOAD")
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Witness: refused:"), "{text}");
    // The copy's libnccl is not beside it: the model's own answer, unknown, stands.
    assert_eq!(out.status.code(), Some(3), "{text}");
}

/// A FIFO named like a library: as a preload, it blocks the real loader's open.
fn fifo_preload(lab: &Lab) -> PathBuf {
    let fifo = lab.path("fifo.so");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a plain mkfifo on a path of our own.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    fifo
}

/// A preload that is a FIFO hangs the real loader: the trace is killed at its time bound
/// and reported cut; a trace past its output bounds is cut too, never read whole.
#[test]
fn a_hanging_or_huge_trace_is_cut_and_reported() {
    let lab = Lab::new();
    let t = bundled(&lab, V1);
    let fifo = fifo_preload(&lab);
    let mut env = LoaderEnv::bundled();
    env.cwd = lab.root().to_path_buf();
    env.preload = fifo.display().to_string();
    let which = loader::which_nccl(&t, &env).unwrap();
    let limits = Limits {
        time: Duration::from_millis(800),
        ..Limits::default()
    };
    let start = std::time::Instant::now();
    let wit = witness::ask_within(&which, &env, &limits).unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(wit.kind(), Kind::Cut, "{wit:#?}");
    assert!(
        wit.cut.as_deref().unwrap().contains("did not finish"),
        "{wit:?}"
    );
    assert!(matches!(
        witness::compare(&which, &wit),
        Verdict::Inconclusive { .. }
    ));

    env.preload.clear();
    let which = loader::which_nccl(&t, &env).unwrap();
    let small_debug = Limits {
        debug_bytes: 512,
        ..Limits::default()
    };
    let wit = witness::ask_within(&which, &env, &small_debug).unwrap();
    assert_eq!(wit.kind(), Kind::Cut, "{wit:#?}");
    assert!(
        wit.cut.as_deref().unwrap().contains("debug output"),
        "{wit:?}"
    );
    let small_out = Limits {
        output_bytes: 16,
        ..Limits::default()
    };
    let wit = witness::ask_within(&which, &env, &small_out).unwrap();
    assert_eq!(wit.kind(), Kind::Cut, "{wit:#?}");
    assert!(wit.cut.as_deref().unwrap().contains("too large"), "{wit:?}");
    // Within the default bounds the same layout answers.
    let wit = witness::ask(&which, &env).unwrap();
    assert_eq!(wit.kind(), Kind::Nccl, "{wit:#?}");
}

/// An object this host's loader cannot load (another machine): the model answers alone,
/// and says why — never an error.
#[test]
fn no_loader_to_ask_is_said_not_failed() {
    let lab = Lab::new();
    let t = bundled(&lab, V1);
    let env = LoaderEnv {
        cwd: lab.root().to_path_buf(),
        ..LoaderEnv::bundled()
    };
    let mut which = loader::which_nccl(&t, &env).unwrap();
    which.link_map.host.machine = 183; // AArch64 on this x86-64 host, or x86-64 elsewhere
    if cfg!(target_arch = "aarch64") {
        which.link_map.host.machine = 62;
    }
    let n = witness::ask(&which, &env).expect_err("a foreign object was traced");
    assert!(!n.refused);
    assert!(n.reason.contains("ELF machine"), "{}", n.reason);
}

/// `detect --witness` prints both sides, text and JSON (valid against the schema), and
/// exits as the answer does.
#[test]
fn detect_witness_prints_both_answers() {
    let lab = Lab::new();
    let w = (wirings()[1])(&lab);
    let run = |json: bool| {
        let mut cmd = common::fdl_in(lab.root());
        cmd.args(["nccl", "detect", "--witness"])
            .arg(&w.object)
            .args(["--preload", w.preload.as_deref().unwrap()])
            .env_remove("LD_PRELOAD")
            .env_remove("LD_LIBRARY_PATH")
            .current_dir(lab.root());
        if json {
            cmd.arg("--json");
        }
        cmd.output().unwrap()
    };
    let out = run(false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("Witness: "), "{text}");
    assert!(text.contains("agrees"), "{text}");
    let out = run(true);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["witness"]["asked"], true, "{v:#}");
    assert_eq!(v["witness"]["answer"], "nccl", "{v:#}");
    assert_eq!(v["witness"]["verdict"]["verdict"], "agree", "{v:#}");
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/schemas/nccl-detect.schema.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let errs = common::schema::validate(&schema, &v);
    assert!(errs.is_empty(), "{errs:#?}");
    // The witness's part is described, not only allowed.
    assert!(schema["properties"]["witness"]["properties"]["verdict"].is_object());
}

/// `cc` of a program that calls `ncclGetVersion` from `nccl`, with `extra` flags.
fn compile_caller(out: &Path, nccl: &Path, extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("main.c");
    std::fs::write(
        &src,
        "int ncclGetVersion(int *);\nint main(void) { int v = 0; ncclGetVersion(&v); return v == 0; }\n",
    )
    .unwrap();
    let status = Command::new("cc")
        .arg("-o")
        .arg(out)
        .arg(&src)
        .arg(nccl)
        .arg(format!("-Wl,-rpath,{}", nccl.parent().unwrap().display()))
        .args(extra)
        .status()
        .unwrap();
    assert!(status.success(), "cc failed for {}", out.display());
}

/// glibc loads a program's DT_AUDIT and DT_DEPAUDIT libraries, and runs them, before it
/// traces anything: `detect --witness` refuses to trace such a program (the model answers
/// alone, and says the audit library could redirect any binding), and nothing runs. A
/// libtorch linked as a PIE with DT_AUDIT, as a project's active variant, is a library a
/// program links: it is traced through fdl's stand-in program, and nothing runs either.
#[test]
fn an_audit_library_named_by_the_file_never_runs() {
    let lab = Lab::new();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("MARK");
    // The audit library (it marks `marker` when it runs) and a libtorch linked as a PIE
    // that names it.
    let audit_at = dir.path().join("libaudit.so");
    let (pie_torch, audit) = common::audited_pie_libtorch(
        dir.path(),
        audit_at.to_str().unwrap(),
        marker.to_str().unwrap(),
    );
    let nccl = lab.nccl("audited/libnccl.so.2", V1);
    let detect = |root: &Path, target: Option<&Path>, json: bool| {
        let mut cmd = common::fdl_in(root);
        cmd.args(["nccl", "detect", "--witness"])
            .env_remove("LD_PRELOAD")
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("LD_AUDIT");
        if let Some(t) = target {
            cmd.arg(t);
        }
        if json {
            cmd.arg("--json");
        }
        cmd.output().unwrap()
    };
    // Without fdl, the real loader's trace mode runs it: the marker proves the probe.
    let proof = dir.path().join("proof");
    compile_caller(
        &proof,
        &nccl,
        &[&format!("-Wl,--audit={}", audit.display())],
    );
    let traced = Command::new("ldd").arg("-r").arg(&proof).output().unwrap();
    assert!(traced.status.success());
    assert!(
        std::fs::read_to_string(&marker).is_ok_and(|m| m.contains("ran")),
        "the audit library did not run under ldd: the test proves nothing"
    );
    std::fs::remove_file(&marker).unwrap();

    for tag in ["audit", "depaudit"] {
        let program = dir.path().join(format!("with-{tag}"));
        compile_caller(
            &program,
            &nccl,
            &[&format!("-Wl,--{tag}={}", audit.display())],
        );
        for json in [false, true] {
            let out = detect(lab.root(), Some(&program), json);
            assert!(!marker.exists(), "{tag}: the audit library ran");
            assert_eq!(out.status.code(), Some(3), "{tag}");
            let text = String::from_utf8_lossy(&out.stdout);
            if json {
                let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                assert_eq!(v["witness"]["asked"], false, "{v:#}");
                assert_eq!(v["witness"]["refused"], true, "{v:#}");
                let why = v["witness"]["none"].as_str().unwrap_or_default();
                let upper = format!("DT_{}", tag.to_uppercase());
                assert!(why.contains(&upper), "{why}");
            } else {
                assert!(!text.contains("nothing run"), "{text}");
                assert!(text.contains("Witness: refused"), "{text}");
            }
        }
    }

    // The PIE library with DT_AUDIT as the active libtorch: it is a library a program
    // links, so fdl's stand-in is traced (glibc reads no audit tag but the main map's),
    // and both sides say why no program can link it: glibc refuses a PIE (DF_1_PIE)
    // anywhere but as the main program.
    let project = common::ProjectFixture::empty()
        .with_raw_variant("precompiled/cu128", &std::fs::read(&pie_torch).unwrap())
        .activate("precompiled/cu128");
    let out = detect(project.root(), None, true);
    assert!(!marker.exists(), "the active libtorch's audit library ran");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["witness"]["asked"], true, "{v:#}");
    assert_eq!(v["witness"]["mode"], "library", "{v:#}");
    assert_eq!(v["witness"]["starts"], false, "{v:#}");
    assert!(
        v["witness"]["summary"]
            .as_str()
            .unwrap()
            .contains("cannot dynamically load position-independent executable"),
        "{v:#}"
    );
    assert!(v["reason"].as_str().unwrap().contains("DF_1_PIE"), "{v:#}");
    assert_eq!(v["witness"]["verdict"]["verdict"], "model_unknown", "{v:#}");
    assert_eq!(out.status.code(), Some(3), "{v:#}");
}

/// A directory whose name holds a line break (here one that would print a forged
/// line): the loader is not asked (glibc writes paths raw, so its answer could not be
/// read apart from the name), the model still answers, and no line fdl prints starts
/// with the text after the break.
#[test]
fn a_line_break_in_a_path_neither_splits_the_trace_nor_forges_a_line() {
    let lab = Lab::new();
    let nccl = lab.nccl("x\nFORGED NCCL 9.9.9 verdict agrees/libnccl.so.2", V1);
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("prog");
    compile_caller(&program, &nccl, &[]);
    let run = |json: bool| {
        let mut cmd = common::fdl_in(lab.root());
        cmd.args(["nccl", "detect", "--witness"])
            .arg(&program)
            .env_remove("LD_PRELOAD")
            .env_remove("LD_LIBRARY_PATH");
        if json {
            cmd.arg("--json");
        }
        cmd.output().unwrap()
    };
    let out = run(false);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    for line in stdout.lines().chain(stderr.lines()) {
        assert!(
            !line.starts_with("FORGED"),
            "a forged line: {stdout}{stderr}"
        );
    }
    assert!(stdout.contains("NCCL 2.27.5"), "{stdout}");
    assert!(stdout.contains("Witness: refused"), "{stdout}");
    let v: serde_json::Value = serde_json::from_slice(&run(true).stdout).unwrap();
    assert_eq!(v["witness"]["refused"], true, "{v:#}");
    assert!(
        v["witness"]["none"]
            .as_str()
            .unwrap()
            .contains("line break"),
        "{v:#}"
    );
}

/// The witness's private directory is 0700 and its files 0600, whatever the umask; a
/// SIGTERM while the loader runs ends it, removes the directory and says so.
#[test]
fn a_signal_during_the_trace_leaves_no_directory_and_the_directory_is_private() {
    let lab = Lab::new();
    let t = bundled(&lab, V1);
    let fifo = fifo_preload(&lab);
    let tmp = tempfile::tempdir().unwrap();
    let mut child = Command::new(assert_cmd::cargo::cargo_bin("fdl"))
        .arg("--root")
        .arg(lab.root())
        .args(["nccl", "detect", "--witness"])
        .arg(&t)
        .arg("--preload")
        .arg(&fifo)
        .env("TMPDIR", tmp.path())
        .env_remove("LD_PRELOAD")
        .env_remove("LD_LIBRARY_PATH")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The loader blocks on the FIFO: wait for the directory and its trace to exist.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let dir = loop {
        let found = std::fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().starts_with("fdl-witness-"));
        if let Some(d) = found {
            if std::fs::read_dir(d.path()).is_ok_and(|mut r| r.next().is_some()) {
                break d.path();
            }
        }
        assert!(std::time::Instant::now() < deadline, "no witness directory");
        std::thread::sleep(Duration::from_millis(20));
    };
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700, "{}", dir.display());
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        assert_eq!(mode(&e.path()) & 0o077, 0, "{}", e.path().display());
    }
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    assert!(stderr.contains("interrupted"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// `detect --witness` where the model cannot say and the loader's trace is of a process
/// that cannot start (the real torch 2.8.0 `libtorch_cuda.so` of the oracle cache, whose
/// CUDA libraries are not there): the loader's answer is said once, the verdict is one
/// sentence that says the answer stays unknown, and the exit status is 3, as it says.
#[test]
#[ignore = "needs the real NVIDIA inputs: `source .ci/setup`, then `cargo test -- --include-ignored`"]
fn a_loader_answer_that_settles_nothing_is_said_once_and_exits_unknown() {
    let torch = common::oracle_input("FDL_TEST_TORCH_LIB");
    let out = common::fdl()
        .args(["nccl", "detect", "--witness"])
        .arg(&torch)
        .env_remove("LD_PRELOAD")
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let all = format!("{stdout}{stderr}");
    assert_eq!(out.status.code(), Some(3), "{all}");
    // The loader's answer (its summary) once: on its `loader` line, not again in the
    // verdict or on stderr.
    assert_eq!(all.matches("references bind to").count(), 1, "{all}");
    assert!(!all.contains("the loader's answer stands:"), "{all}");
    let verdict: Vec<&str> = stdout.lines().filter(|l| l.contains("verdict")).collect();
    assert_eq!(verdict.len(), 1, "{stdout}");
    assert!(verdict[0].contains("still unknown"), "{stdout}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("unknown: ") && stderr.contains("exit status 3"),
        "{stderr}"
    );
}
