//! The committed seeds of the `interpose_elf`, `cluster_config` and `rehearse_answer` fuzz
//! targets, replayed on every test run as the fuzzer feeds them: an answer or an error,
//! never a panic.
//! (`inspect_elf`'s seeds are replayed in tests/it/inspect_api.rs.)

use std::path::{Path, PathBuf};

fn seeds(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 3, "too few seeds in {}", dir.display());
    files
}

#[test]
fn interpose_seeds_are_analysed_and_the_static_ones_judged() {
    for seed in seeds("interpose_elf") {
        let bytes = std::fs::read(&seed).unwrap();
        let found = fdl::inspect::interpose::analyze_bytes(&bytes)
            .unwrap_or_else(|e| panic!("{}: {e:#}", seed.display()));
        let name = seed.file_name().unwrap().to_string_lossy().into_owned();
        let ineffective = matches!(
            found.verdict,
            fdl::inspect::interpose::Verdict::PreloadIneffective { .. }
        );
        // -Bsymbolic and hidden/protected symbols bind inside the library.
        if name.starts_with("static_bsymbolic") || name.starts_with("static_symfun") {
            assert!(ineffective, "{name}: {:?}", found.verdict);
        }
        // Stripped: its NOP padding before ncclCommFinalize reads as a reference, which
        // the unwind tables show to be padding; its CFI-less asm calls
        // ncclCommWindowRegister directly (tests/it/interpose.rs builds the same library).
        if name == "stripped_padding_fde.so" {
            assert!(ineffective, "{name}: {:?}", found.verdict);
            let finalize = found.symbols.iter().find(|s| s.name == "ncclCommFinalize");
            assert_eq!(
                finalize.map(|s| &s.binding),
                Some(&fdl::inspect::interpose::Binding::NeverCalled),
                "{name}"
            );
        }
        if name == "pip_style.so" {
            assert_eq!(
                found.imported,
                ["ncclCommInitRank", "ncclGetVersion"],
                "{name}"
            );
        }
        // The loader model's lookups through the hash tables agree with the full
        // analysis: a library exports what its .dynsym defines and exports.
        let wanted = ["ncclGetVersion", "ncclCommInitRank", "notNccl"];
        let by_hash = fdl::inspect::interpose::exported_among_bytes(&bytes, &wanted)
            .unwrap_or_else(|e| panic!("{}: {e:#}", seed.display()));
        if name == "nccl_stub.so" || name == "static_default.so" {
            assert!(by_hash.contains("ncclGetVersion"), "{name}: {by_hash:?}");
        }
        if name == "pip_style.so" {
            assert!(
                by_hash.is_empty(),
                "{name} imports, exports none: {by_hash:?}"
            );
        }
    }
}

#[test]
fn cluster_config_seeds_give_their_known_answers() {
    for seed in seeds("cluster_config") {
        let text = std::fs::read_to_string(&seed).unwrap();
        let (base, overlay) = match text.split_once('\0') {
            Some((b, o)) => (Some(b.to_string()), o.to_string()),
            None => (None, text.clone()),
        };
        let mut sources = Vec::new();
        if let Some(b) = base {
            sources.push((PathBuf::from("fdl.yml"), b));
        }
        sources.push((PathBuf::from("fdl.cluster.yml"), overlay));
        let name = seed.file_name().unwrap().to_string_lossy().into_owned();
        match (name.as_str(), fdl::cluster::config::parse(&sources)) {
            ("full.yml", Ok((_, workers))) => assert_eq!(workers.len(), 2),
            ("merge.yml", Ok((c, workers))) => {
                assert_eq!(
                    (c.path.as_str(), workers[0].path.as_str()),
                    ("/over", "/w x")
                )
            }
            ("wrong.yml", Err(e)) => assert!(
                e.to_string()
                    .starts_with("fdl.cluster.yml:2: cluster.controller must be a mapping"),
                "{e}"
            ),
            (other, result) => panic!("{other}: unexpected {:?}", result.map(|(_, w)| w.len())),
        }
    }
}

/// `peer_answer`'s seeds: a genuine report parses, a banner before it is named, and a
/// report full of escape sequences parses (it is shown escaped; see cluster_peer.rs).
#[test]
fn peer_answer_seeds_give_their_known_answers() {
    for seed in seeds("peer_answer") {
        let bytes = std::fs::read(&seed).unwrap();
        let name = seed.file_name().unwrap().to_string_lossy().into_owned();
        let banner = fdl::cluster::ssh::banner(&bytes);
        let parsed = serde_json::from_slice::<fdl::cluster::host::HostReport>(&bytes);
        match name.as_str() {
            "banner.txt" => {
                let why = banner.expect("a banner is named");
                assert!(why.contains("starting 'Welcome to node-a'"), "{why}");
            }
            "report.json" | "escapes.json" => {
                assert!(banner.is_none(), "{name}: {banner:?}");
                assert_eq!(
                    parsed.unwrap().schema,
                    fdl::cluster::host::REPORT_SCHEMA,
                    "{name}"
                );
            }
            other => panic!("{other}: no known answer"),
        }
    }
}

/// `receive_manifest`'s seeds (`<name>\0<manifest>`): the genuine manifest fits its
/// build; one pointing elsewhere or naming another build does not.
#[test]
fn receive_manifest_seeds_give_their_known_answers() {
    for seed in seeds("receive_manifest") {
        let text = std::fs::read_to_string(&seed).unwrap();
        let (build, manifest) = text.split_once('\0').unwrap();
        let m = fdl::nccl::store::parse_manifest(manifest).unwrap();
        let fits = fdl::cluster::receive::manifest_fits(&m, build);
        let name = seed.file_name().unwrap().to_string_lossy().into_owned();
        match name.as_str() {
            "current.txt" => fits.unwrap(),
            "evil-dir.txt" => {
                let e = fits.unwrap_err().to_string();
                assert!(e.contains("output_dir /etc/evil"), "{e}");
            }
            "other-name.txt" => {
                let e = fits.unwrap_err().to_string();
                assert!(e.contains("names build 'v2.27.5-sm61-sm120'"), "{e}");
            }
            other => panic!("{other}: no known answer"),
        }
    }
}

/// The seeds of `loader_map` (`[u32 LE length of A][A][B]`) and `dynamic_tables`
/// (`fdl_synth::dso::Dso::from_fuzz_input`), by name. With `FDL_WRITE_FUZZ_SEEDS` set they
/// are written into `fuzz/seeds/`; otherwise the committed ones must be these bytes.
fn loader_seed_files() -> Vec<(&'static str, String, Vec<u8>)> {
    use fdl_synth::dso::{self, gnu_hash, Dso, Hash, Symbol};
    let sym = |name: &str, defined: bool| Symbol {
        name: name.into(),
        defined,
    };
    let asking = Dso {
        soname: Some("libtorch_cuda.so".into()),
        needed: vec!["libdep.so".into()],
        runpath: Some("$ORIGIN".into()),
        symbols: vec![sym("ncclAllReduce", false), sym("ncclGetVersion", false)],
        ..Dso::default()
    };
    let dep = |hash: Hash| Dso {
        soname: Some("libdep.so".into()),
        symbols: vec![sym("ncclAllReduce", true), sym("ncclGetVersion", true)],
        hash,
        sections: true,
        rodata: b"NCCL version 2.27.5+cuda12.9\0".to_vec(),
        ..Dso::default()
    };
    let pair = |a: &Dso, b: &Dso| {
        let a = a.to_vec();
        let mut out = (a.len() as u32).to_le_bytes().to_vec();
        out.extend(a);
        out.extend(b.to_vec());
        out
    };
    let far = 1u64 << 40;
    let mut out = vec![
        (
            "loader_map",
            "gnu_hash.bin".into(),
            pair(&asking, &dep(Hash::Gnu)),
        ),
        (
            "loader_map",
            "sysv_hash.bin".into(),
            pair(&asking, &dep(Hash::SysV)),
        ),
        (
            "loader_map",
            "hash_loop.bin".into(),
            pair(&asking, &dep(Hash::SysVSelfLoop { nchain: u32::MAX })),
        ),
        (
            "loader_map",
            "strtab_outside.bin".into(),
            pair(
                &Dso {
                    override_tags: vec![(dso::DT_STRTAB, far)],
                    ..asking.clone()
                },
                &dep(Hash::Gnu),
            ),
        ),
        (
            "loader_map",
            "versym_outside.bin".into(),
            pair(
                &asking,
                &Dso {
                    extra_tags: vec![(dso::DT_VERSYM, far)],
                    ..dep(Hash::SysV)
                },
            ),
        ),
    ];
    // dynamic_tables: flags, defined, number of tags, tags, hash words. Three symbols
    // (ncclAllReduce undefined, ncclGetVersion and ncclCommInitRank defined): undefined
    // ones first, so symbols 2 and 3 are the defined ones.
    let input = |flags: u8, tags: &[(u64, u64)], words: &[u32]| {
        let mut v = vec![flags, 0b110, tags.len() as u8];
        for (t, val) in tags {
            v.extend(t.to_le_bytes());
            v.extend(val.to_le_bytes());
        }
        for w in words {
            v.extend(w.to_le_bytes());
        }
        v
    };
    let three = 3 << 2;
    let h = |n: &str| gnu_hash(n.as_bytes()) & !1;
    out.extend([
        (
            "dynamic_tables",
            "sysv.bin".into(),
            input(three, &[], &[1, 4, 1, 0, 2, 3, 0]),
        ),
        (
            "dynamic_tables",
            "gnu.bin".into(),
            input(
                three | 1,
                &[],
                &[
                    1,
                    2,
                    1,
                    6,
                    u32::MAX,
                    u32::MAX,
                    2,
                    h("ncclGetVersion"),
                    h("ncclCommInitRank") | 1,
                ],
            ),
        ),
        (
            "dynamic_tables",
            "sysv_loop_sections.bin".into(),
            input(three | 2, &[], &[1, u32::MAX, 1, 0, 1]),
        ),
        (
            "dynamic_tables",
            "tables_outside.bin".into(),
            input(
                three | 2,
                &[
                    (dso::DT_VERSYM, far),
                    (dso::DT_VERNEED, far),
                    (dso::DT_STRTAB, far),
                ],
                &[1, 4, 1, 0, 2, 3, 0],
            ),
        ),
    ]);
    out
}

#[test]
fn loader_fuzz_seeds_are_what_the_generator_writes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let write = std::env::var_os("FDL_WRITE_FUZZ_SEEDS").is_some();
    for (target, name, bytes) in loader_seed_files() {
        let p = root.join(target).join(&name);
        if write {
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, &bytes).unwrap();
        }
        let committed = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(
            committed == bytes,
            "{} differs from what the generator writes; regenerate with FDL_WRITE_FUZZ_SEEDS=1",
            p.display()
        );
    }
}

/// `loader_map`'s seeds through the loader model, with their known answers.
#[test]
fn loader_map_seeds_give_their_known_answers() {
    for seed in seeds("loader_map") {
        let bytes = std::fs::read(&seed).unwrap();
        let (len, rest) = bytes.split_first_chunk::<4>().unwrap();
        let (a, b) = rest.split_at((u32::from_le_bytes(*len) as usize).min(rest.len()));
        let dir = tempfile::tempdir().unwrap();
        let w = fdl::loader::which_nccl_in_dir(
            dir.path(),
            &[("libtorch_cuda.so", a), ("libdep.so", b)],
        )
        .unwrap_or_else(|e| panic!("{}: {e:#}", seed.display()));
        serde_json::to_string(&w).unwrap();
        let name = seed.file_name().unwrap().to_string_lossy().into_owned();
        let reason = w.answer.reason().unwrap_or_default().to_string();
        match name.as_str() {
            "gnu_hash.bin" | "sysv_hash.bin" => {
                let d = w
                    .answer
                    .detection()
                    .unwrap_or_else(|| panic!("{name}: {reason}"));
                assert_eq!(d.version.to_string(), "2.27.5", "{name}");
            }
            "hash_loop.bin" => assert!(reason.contains("loops"), "{name}: {reason}"),
            "strtab_outside.bin" => assert!(reason.contains("DT_STRTAB"), "{name}: {reason}"),
            "versym_outside.bin" => assert!(reason.contains("DT_VERSYM"), "{name}: {reason}"),
            other => panic!("{other}: no known answer"),
        }
        if name != "gnu_hash.bin" && name != "sysv_hash.bin" {
            assert_eq!(w.answer.kind(), "unknown", "{name}: {reason}");
        }
    }
}

/// `dynamic_tables`' seeds as the target reads them: the honest tables find the two
/// defined NCCL functions by hash; the looping chain and the tables outside the file are
/// errors that say so, never answers.
#[test]
fn dynamic_tables_seeds_give_their_known_answers() {
    use fdl_synth::dso::{Dso, FUZZ_NAMES};
    for seed in seeds("dynamic_tables") {
        let input = std::fs::read(&seed).unwrap();
        let name = seed.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = Dso::from_fuzz_input(&input)
            .expect("a whole input")
            .to_vec();
        let _ = fdl::inspect::inspect_bytes(&bytes);
        let _ = fdl::inspect::interpose::analyze_bytes(&bytes);
        let found = fdl::inspect::interpose::exported_among_bytes(&bytes, &FUZZ_NAMES);
        match name.as_str() {
            "sysv.bin" | "gnu.bin" => assert_eq!(
                found.unwrap_or_else(|e| panic!("{name}: {e:#}")),
                ["ncclCommInitRank", "ncclGetVersion"]
                    .into_iter()
                    .map(String::from)
                    .collect(),
                "{name}"
            ),
            "sysv_loop_sections.bin" => {
                let e = format!("{:#}", found.unwrap_err());
                assert!(e.contains("loops"), "{name}: {e}");
            }
            "tables_outside.bin" => {
                let ins = fdl::inspect::inspect_bytes(&bytes).unwrap();
                assert!(
                    ins.warnings
                        .iter()
                        .any(|w| w.contains("outside the file's loadable segments")),
                    "{name}: {:?}",
                    ins.warnings
                );
            }
            other => panic!("{other}: no known answer"),
        }
    }
}

/// `witness_output`'s seeds, replayed as the fuzz target reads them (stdout, stderr and
/// the debug stream of pid 4242, split at NUL): a real trace of this kind of host answers
/// with its binding; a line a path split, or a forged list line, cuts the trace; no
/// sentence holds a control character.
#[test]
fn witness_output_seeds_give_their_known_answers() {
    use fdl::loader::witness::{read_output, Kind};
    for seed in seeds("witness_output") {
        let bytes = std::fs::read(&seed).unwrap();
        let mut parts = bytes.splitn(3, |b| *b == 0);
        let stdout = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
        let stderr = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
        let debug = parts.next().unwrap_or_default();
        let w = read_output(
            Path::new("/fdl-fuzz/prog"),
            &stdout,
            &stderr,
            "4242",
            debug,
            Path::new("/fdl-fuzz"),
        );
        let name = seed.file_name().unwrap().to_string_lossy().into_owned();
        let summary = w.summary();
        assert!(
            !summary.chars().any(char::is_control),
            "{name}: {summary:?}"
        );
        match name.as_str() {
            "real_trace.bin" => {
                assert_eq!(w.kind(), Kind::Nccl, "{name}: {summary}");
                assert_eq!(
                    w.reached[0].object,
                    Path::new("/fdl-fuzz/lib/libnccl.so.2"),
                    "{name}"
                );
                assert_eq!(w.reached[0].symbols, ["ncclGetVersion"], "{name}");
            }
            "split_line.bin" | "forged_list_and_escape.bin" => {
                assert_eq!(w.kind(), Kind::Cut, "{name}: {summary}");
                assert!(w.reached.iter().all(|r| !r.object.starts_with("/evil")));
            }
            other => panic!("a seed without a known answer: {other}"),
        }
    }
}

/// `rehearse_answer`'s seeds through the real controller: a green rehearsal is green, an
/// NCCL error on every worker is red with each named, and a hostile one's findings hold
/// nothing raw.
#[test]
fn rehearse_answer_seeds_give_their_known_answers() {
    use fdl::cluster::rehearse::{canned_bytes, Finding, State};
    for seed in seeds("rehearse_answer") {
        let name = seed.file_name().unwrap().to_string_lossy().into_owned();
        let r = canned_bytes(&std::fs::read(&seed).unwrap());
        for f in &r.findings {
            for text in [f.full(), f.short()] {
                assert!(
                    !text
                        .chars()
                        .any(|c| c.is_control() || ('\u{202a}'..='\u{202e}').contains(&c)),
                    "{name}: {text:?}"
                );
            }
        }
        match name.as_str() {
            "green.txt" => {
                assert_eq!(r.state(), State::Ok, "{name}: {r:?}");
                assert_eq!(r.pairs.len(), 4, "{name}");
            }
            "nccl_error.txt" => {
                assert_eq!(r.state(), State::Red, "{name}: {r:?}");
                assert_eq!(r.findings.len(), 3, "{name}");
                assert!(r
                    .findings
                    .iter()
                    .all(|f| matches!(f, Finding::NcclError { code: 5, .. })));
            }
            "hostile.txt" => {
                assert_eq!(r.state(), State::Red, "{name}: {r:?}");
                assert!(r
                    .findings
                    .iter()
                    .any(|f| f.short().ends_with("loopback chosen")));
            }
            // Found by the fuzzer: a reach answer no fdl gave, then a shell that answered
            // the ship's questions with it, escape sequences and all.
            "regress-raw-shell-answer.txt" => {
                assert!(r
                    .findings
                    .iter()
                    .any(|f| f.short().ends_with(": no answer")))
            }
            other => panic!("a seed without a known answer: {other}"),
        }
    }
}
