//! Every `--json` output against docs/json.md: each documented command is run on a
//! fixture project, its object's top-level keys must be exactly the documented ones,
//! stamped with the documented schema, with versions as strings, and the whole object
//! must validate against the JSON Schema file the table names (docs/schemas/).

use crate::common;
use crate::native_fixture;
use common::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// docs/json.md's table rows: `| \`fdl …\` | \`key\`, \`key\` | [name](schemas/F) |` →
/// command → (keys, the schema file's path relative to docs/).
fn documented() -> BTreeMap<String, (BTreeSet<String>, String)> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/json.md")).unwrap();
    let section = readme
        .split("\n## Top-level keys\n")
        .nth(1)
        .expect("docs/json.md has a '## Top-level keys' section");
    let section = section.split("\n## ").next().unwrap();
    let mut out = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `fdl ")) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let command = cells[0].trim_matches('`').to_string();
        let keys = cells[1]
            .split(',')
            .map(|k| k.trim().trim_matches('`').to_string())
            .collect();
        let schema = cells
            .get(2)
            .and_then(|c| {
                c.split_once("](")
                    .map(|(_, r)| r.trim_end_matches(')').to_string())
            })
            .unwrap_or_else(|| panic!("{command}: the table names no schema file"));
        out.insert(command, (keys, schema));
    }
    out
}

/// Whether every version-like field in `v` is a string: the keys fdl writes versions under.
fn versions_are_strings(v: &Value, path: &str, bad: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let here = format!("{path}.{k}");
                let versionish = k == "cuda" || k.ends_with("_version") || k == "version";
                if versionish
                    && !(x.is_string()
                        || x.is_null()
                        || x.is_object() && k == "cuda" && x.get("error").is_some())
                {
                    bad.push(format!("{here} = {x}"));
                }
                versions_are_strings(x, &here, bad);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| versions_are_strings(x, path, bad)),
        _ => {}
    }
}

/// Documented commands that need workers to answer: their tests run them on real hosts
/// and validate each answer against the same schema file (`cluster ps`:
/// tests/it/cluster_ps.rs; `cluster rehearse`: tests/it/cluster_rehearse.rs).
const CHECKED_ON_HOSTS: [&str; 2] = ["fdl cluster ps --json", "fdl cluster rehearse --json"];

#[test]
fn every_json_output_matches_its_documented_schema() {
    let doc = documented();
    assert!(doc.len() >= 11, "too few documented commands: {doc:?}");

    // A project with a pip-style libtorch (its NCCL beside it), one installed build, and
    // a stand-in nvidia-smi with two GPUs.
    let f = BuildsFixture::new(
        ProjectFixture::empty()
            .with_compiled_variant("precompiled/cu128", &nccl_like_source((2, 27, 5), "12.8"))
            .activate("precompiled/cu128\n"),
    );
    let tree = f.tree("nccl", (2, 27, 5), &[61, 120]);
    let build = f.install(&tree, "v2.27.5-1", "6.1;12.0").unwrap();
    // What a killed build of another target left: `list` shows it as a leftover.
    std::fs::create_dir_all(f.builds().join(".native-work-v2.27.5-sm90-AbC123/obj")).unwrap();
    let smi = fake_nvidia_smi(
        "0, NVIDIA GeForce GTX 1060 6GB, 6.1, 6144\n1, NVIDIA GeForce RTX 5060 Ti, 12.0, 16311\n",
        0,
    );
    // For a real build through the native backend: a stand-in toolkit and NCCL tree.
    let work = tempfile::tempdir().unwrap();
    let cuda_home = work.path().join("cuda");
    native_fixture::cuda_12_8(&cuda_home);
    let source = work.path().join("nccl");
    native_fixture::standin_tree(&source, (2, 27, 5));
    let (cuda_home, source) = (cuda_home.to_str().unwrap(), source.to_str().unwrap());
    let lib = f.project.variant_lib("precompiled/cu128");
    let lib = lib.to_str().unwrap();
    let torch_dir = lib.trim_end_matches("/lib/libtorch_cuda.so");

    let mut sleeper = std::process::Command::new("sleep")
        .arg("300")
        .spawn()
        .unwrap();
    let sleeper_pid = sleeper.id().to_string();
    let runs: Vec<(&str, Vec<&str>)> = vec![
        ("fdl gpus --json", vec!["gpus", "--json"]),
        ("fdl inspect --json", vec!["inspect", lib, "--json"]),
        ("fdl nccl detect --json", vec!["nccl", "detect", "--json"]),
        (
            "fdl nccl detect --witness --json",
            vec!["nccl", "detect", "--witness", "--json"],
        ),
        ("fdl nccl plugins --json", vec!["nccl", "plugins", "--json"]),
        (
            "fdl nccl verify --json",
            vec!["nccl", "verify", &build, "--json"],
        ),
        ("fdl nccl list --json", vec!["nccl", "list", "--json"]),
        (
            "fdl nccl env --format json",
            vec!["nccl", "env", &build, "--format", "json"],
        ),
        ("fdl nccl env --json", vec!["nccl", "env", &build, "--json"]),
        (
            "fdl nccl build --dry-run --json",
            vec![
                "nccl",
                "build",
                "--tag",
                "v2.27.5-1",
                "--archs",
                // Not the installed build's archs: a dry run of another plan for its
                // place would be a conflict, and exit non-zero.
                "7.5;12.0",
                "--dry-run",
                "--json",
            ],
        ),
        (
            "fdl nccl build --json",
            vec![
                "nccl",
                "build",
                "--backend",
                "native",
                "--cuda-home",
                cuda_home,
                "--source",
                source,
                "--tag",
                "v2.27.5-1",
                "--archs",
                "8.6",
                "--json",
            ],
        ),
        (
            "fdl libtorch list --json",
            vec!["libtorch", "list", "--json"],
        ),
        (
            "fdl libtorch info --json",
            vec!["libtorch", "info", "--json"],
        ),
        (
            "fdl libtorch add --json",
            vec!["libtorch", "add", "copy", torch_dir, "--json"],
        ),
        // After the native build above, which added its entry.
        ("fdl store list --json", vec!["store", "list", "--json"]),
        // A process of this test's own: other tests' processes are not this test's.
        ("fdl ps --json", vec!["ps", "--pid", &sleeper_pid, "--json"]),
    ];
    let mut seen = BTreeSet::new();
    for (command, args) in runs {
        let out = f
            .fdl()
            .env("PATH", path_with(smi.path()))
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{command}: not one JSON object ({e})"));
        let keys: BTreeSet<String> = v.as_object().unwrap().keys().cloned().collect();
        let (want, schema_file) = doc
            .get(command)
            .unwrap_or_else(|| panic!("{command} is not documented in docs/json.md"));
        assert_eq!(&keys, want, "{command}: keys differ from docs/json.md");
        let schema_path =
            std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/docs")).join(schema_file);
        let schema: Value = serde_json::from_str(
            &std::fs::read_to_string(&schema_path)
                .unwrap_or_else(|e| panic!("{}: {e}", schema_path.display())),
        )
        .unwrap_or_else(|e| panic!("{}: not JSON: {e}", schema_path.display()));
        let errors = common::schema::validate(&schema, &v);
        assert!(
            errors.is_empty(),
            "{command}: the output does not match {}:\n{}\n{v}",
            schema_path.display(),
            errors.join("\n")
        );
        assert_eq!(v["schema"], 1, "{command}");
        let mut bad = Vec::new();
        versions_are_strings(&v, "", &mut bad);
        assert!(
            bad.is_empty(),
            "{command}: versions that are not strings: {bad:?}"
        );
        seen.insert(command.to_string());
    }
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let untested: Vec<&String> = doc
        .keys()
        .filter(|c| !seen.contains(*c) && !CHECKED_ON_HOSTS.contains(&c.as_str()))
        .collect();
    assert!(
        untested.is_empty(),
        "documented but not checked: {untested:?}"
    );
}

/// With --json an error is one object too (`{"error": …}`) on stdout, with a non-zero
/// exit; no GPU is an answer (`[]`, the reason on stderr); `env --json` is
/// `--format json`; a listed build carries the GPU code its library holds, PTX named by
/// virtual architecture.
#[test]
fn json_errors_empty_answers_and_list_contents() {
    let f = BuildsFixture::new(ProjectFixture::empty());
    let tree = f.tree("nccl", (2, 27, 5), &[61, 120]);
    let build = f.install(&tree, "v2.27.5-1", "6.1;12.0").unwrap();

    for args in [
        vec!["nccl", "env", "nope", "--json"],
        vec!["nccl", "verify", "nope", "--json"],
        vec!["libtorch", "info", "--json"],
        vec!["inspect", "/nonexistent", "--json"],
        // No such process (pids never reach u32::MAX).
        vec!["ps", "--pid", "4294967294", "--json"],
    ] {
        let out = f.fdl().args(&args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: stdout is not one JSON object ({e})"));
        assert!(
            v["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{args:?}: {v}"
        );
        assert_eq!(v["schema"], 1);
    }

    let no_tools = tempfile::tempdir().unwrap();
    let out = f
        .fdl()
        .env("PATH", no_tools.path())
        .args(["gpus", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["gpus"], serde_json::json!([]));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nvidia-smi"));

    let a: Value = serde_json::from_slice(
        &f.fdl()
            .args(["nccl", "env", &build, "--json"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let b: Value = serde_json::from_slice(
        &f.fdl()
            .args(["nccl", "env", &build, "--format", "json"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(a, b);

    let list: Value = serde_json::from_slice(
        &f.fdl()
            .args(["nccl", "list", "--json"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let sass: Vec<&str> = list["entries"][0]["gpu_code"]["sass"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["target"].as_str().unwrap())
        .collect();
    assert_eq!(sass, ["sm_61", "sm_120"]);
}

/// The validator finds what it must: a wrong type, a missing required key, a key a
/// closed object does not list, a wrong const, a bad array item, an unknown keyword.
#[test]
fn the_schema_validator_finds_each_kind_of_difference() {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "schema": {"const": 1},
            "name": {"type": "string"},
            "list": {"type": "array", "items": {"type": "integer"}},
            "state": {"enum": ["a", "b"]}
        },
        "required": ["schema", "name"],
        "additionalProperties": false
    });
    let ok = serde_json::json!({"schema": 1, "name": "x", "list": [1, 2], "state": "a"});
    assert_eq!(common::schema::validate(&schema, &ok), Vec::<String>::new());
    for bad in [
        serde_json::json!({"schema": 1, "name": 3}),
        serde_json::json!({"schema": 1}),
        serde_json::json!({"schema": 1, "name": "x", "extra": true}),
        serde_json::json!({"schema": 2, "name": "x"}),
        serde_json::json!({"schema": 1, "name": "x", "list": [1, "2"]}),
        serde_json::json!({"schema": 1, "name": "x", "state": "c"}),
    ] {
        assert!(
            !common::schema::validate(&schema, &bad).is_empty(),
            "{bad} passed"
        );
    }
    let unknown = serde_json::json!({"type": "object", "oneOf": []});
    assert!(!common::schema::validate(&unknown, &ok).is_empty());
}

/// Every schema file is used by a row of the table, so none goes stale unchecked.
#[test]
fn every_schema_file_is_in_the_table() {
    let used: BTreeSet<String> = documented().into_values().map(|(_, s)| s).collect();
    let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/schemas"));
    for e in std::fs::read_dir(dir).unwrap() {
        let name = format!("schemas/{}", e.unwrap().file_name().to_string_lossy());
        assert!(
            used.contains(&name),
            "{name} is in no row of docs/json.md's table"
        );
    }
}

/// `--json` is one object on stdout whatever the answer: `nccl plugins` on a library
/// whose NCCL fdl cannot name (a DT_NEEDED that is nowhere) prints its `unknown` object,
/// valid against the schema, and exits 3.
#[test]
fn plugins_json_says_unknown_as_an_object() {
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("libgone.so");
    compile_shared(
        "int fdl_gone(void) { return 0; }\n",
        &gone,
        &["-Wl,-soname,libgone.so"],
    );
    let lib = dir.path().join("libtorch_cuda.so");
    compile_shared(
        "int ncclGetVersion(int *);\nint f(void) { int v; return ncclGetVersion(&v); }\n",
        &lib,
        &[
            "-Wl,--no-as-needed,--unresolved-symbols=ignore-all",
            &gone.display().to_string(),
        ],
    );
    std::fs::remove_file(&gone).unwrap();
    let out = fdl()
        .args(["nccl", "plugins", "--json"])
        .arg(&lib)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {:?}", out.stdout));
    assert!(v["unknown"].as_str().is_some_and(|s| !s.is_empty()), "{v}");
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/schemas/nccl-plugins.schema.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let errors = common::schema::validate(&schema, &v);
    assert!(errors.is_empty(), "{errors:?}\n{v}");
}

/// A usage error of a command that asked for JSON is one `{"error": …}` object on stdout
/// too (clap still says it on stderr), exit 2; without --json, stdout stays empty.
#[test]
fn a_usage_error_under_json_is_a_json_error() {
    for args in [
        &["inspect", "--json"][..],
        &["nccl", "env", "--format", "json", "--bogus"],
        &["nccl", "verify", "--json", "--no-such-flag"],
    ] {
        let out = fdl().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: not one JSON object ({e})"));
        assert!(
            v["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{args:?}: {v}"
        );
        assert_eq!(v["schema"], 1, "{args:?}");
        assert!(!String::from_utf8_lossy(&out.stderr).is_empty(), "{args:?}");
    }
    let out = fdl().args(["inspect"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    // Help is help, whatever else is there.
    let out = fdl()
        .args(["inspect", "--json", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(serde_json::from_slice::<Value>(&out.stdout).is_err());
}
