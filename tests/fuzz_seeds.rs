//! The committed seeds of the `interpose_elf` and `cluster_config` fuzz targets, replayed
//! on every test run as the fuzzer feeds them: an answer or an error, never a panic.
//! (`inspect_elf`'s seeds are replayed in tests/inspect_api.rs.)

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
                assert_eq!(parsed.unwrap().schema, 1, "{name}");
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
