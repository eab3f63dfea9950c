//! A plan's store key: the inputs that decide a build's bytes, read from the plan and
//! from the backend's toolchain probes, and what the store will do for the plan. The
//! store itself ([`crate::store`]) only hashes and looks up what it is handed.
//!
//! The inputs are a flat map of named strings, versioned twice: `key_schema`
//! ([`KEY_SCHEMA`]) names this layout, `recipe` names how fdl builds
//! ([`BUILD_RECIPE_VERSION`]). `jobs`, paths and where a value came from decide no bytes
//! and are left out, so two projects with the same inputs share one entry.

use crate::nccl::backend::Backend;
use crate::nccl::plan::BuildPlan;
use crate::store::{Key, KeyInputs};
use fdl_backends::{KeyLater, Planned};
use std::collections::BTreeMap;

/// How fdl turns a plan into a build. Raise it whenever a change to fdl (the make
/// invocation, the Dockerfile's recipe, what is installed) can change a build's bytes
/// for the same inputs: every older entry then stops matching.
pub const BUILD_RECIPE_VERSION: u32 = 1;

/// The layout of [`KeyInputs`]; a change to which inputs exist, or to how one is
/// written, raises it. 2: `archs` is written `sm_80 sm_120`, as everything else names
/// archs (schema 1 wrote the build name's `sm80-sm120`); entries made under 1 are no
/// longer hit, and `fdl store gc` removes them once no project uses them.
pub const KEY_SCHEMA: u32 = 2;

/// What [`store_key`] answers.
pub type KeyAnswer = std::result::Result<(Key, KeyInputs), String>;

/// A build's store key as far as the plan knows it, carried from [`super::prepare`] to
/// the build so that the toolchain is probed for it once per build: asked when the plan
/// is made, and asked again only where the build itself makes it known.
#[derive(Debug, Clone)]
pub enum KeyState {
    /// Known from the plan; the build uses it as it is.
    Known(Key, KeyInputs),
    /// A clone-source native build's tag is not cloned yet, and its commit is part of
    /// the key: the build clones it first and asks once, before anything compiles.
    AfterClone(String),
    /// Not known before the build makes what names it (the Docker toolchain's image):
    /// asked once, after the build, to add the build to the store.
    AfterBuild(String),
    /// Not known, and nothing the build does changes that: never asked again.
    Unknown(String),
}

impl KeyState {
    /// What [`store_key`] answered for `plan`, placed: when its answer could change.
    pub fn of(plan: &BuildPlan, answer: KeyAnswer) -> KeyState {
        let why = match answer {
            Ok((key, inputs)) => return KeyState::Known(key, inputs),
            Err(why) => why,
        };
        match plan.backend.planned().key_later() {
            KeyLater::AfterClone => KeyState::AfterClone(why),
            KeyLater::AfterBuild => KeyState::AfterBuild(why),
            KeyLater::Never => KeyState::Unknown(why),
        }
    }
}

/// The store key of `plan` built by `backend`, with its inputs; `Err` says why it is not
/// known (a probe failed, or the tag is not cloned yet).
pub fn store_key(plan: &BuildPlan, backend: &dyn Backend) -> KeyAnswer {
    let source = plan.backend.planned().source_identity(plan)?;
    let toolchain = backend
        .toolchain_identity(plan)
        .map_err(|e| format!("{e:#}"))?;
    let inputs = key_inputs(plan, &source, &toolchain);
    Ok((Key::of(&inputs), inputs))
}

/// Whether the build store has a plan's build, as `--json` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreState {
    /// The store has the key's entry: the build is installed from it.
    Hit,
    /// It has not: the build compiles, then adds it.
    Miss,
    /// No key (a probe failed, the tag is not cloned yet): looked up once known.
    Unknown,
    /// `--no-store`.
    Skipped,
}

/// What the build store will do for a plan, as the plan shows it.
#[derive(Debug, serde::Serialize)]
pub struct StoreView {
    pub state: StoreState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<crate::store::Key>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inputs: Option<crate::store::KeyInputs>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// The store's part of the plan: the key and whether the store has it. Reads only: a
/// dry run makes no store directory. Also the key as [`store_key`] answered, for the
/// build to use rather than probe the toolchain again.
pub fn store_view(
    ctx: &crate::context::Context,
    plan: &BuildPlan,
    backend: Option<&dyn Backend>,
    no_store: bool,
) -> (StoreView, KeyState) {
    let unknown = |why: String| StoreView {
        state: StoreState::Unknown,
        key: None,
        inputs: None,
        why: Some(why),
    };
    if no_store {
        let view = StoreView {
            state: StoreState::Skipped,
            key: None,
            inputs: None,
            why: Some("--no-store".into()),
        };
        return (view, KeyState::Unknown("--no-store".into()));
    }
    let Some(backend) = backend else {
        let why = "no Docker engine answers to probe the base image".to_string();
        return (unknown(why.clone()), KeyState::AfterBuild(why));
    };
    let key = store_key(plan, backend);
    let view = match ctx.cache().and_then(|c| crate::store::Store::at(&c)) {
        Err(e) => unknown(format!("{e:#}")),
        Ok(store) => match &key {
            Ok((key, inputs)) => StoreView {
                state: if store.has(key) {
                    StoreState::Hit
                } else {
                    StoreState::Miss
                },
                key: Some(key.clone()),
                inputs: Some(inputs.clone()),
                why: None,
            },
            Err(why) => unknown(why.clone()),
        },
    };
    (view, KeyState::of(plan, key))
}

/// The key inputs of `plan`: what the plan says, `source` (see [`fdl_backends::PlannedBackend::source_identity`]) and
/// the backend's `toolchain` identity (each entry stored as `toolchain.<name>`).
pub fn key_inputs(
    plan: &BuildPlan,
    source: &str,
    toolchain: &BTreeMap<String, String>,
) -> KeyInputs {
    let mut m = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        m.insert(k.to_string(), v);
    };
    put("key_schema", KEY_SCHEMA.to_string());
    put("recipe", BUILD_RECIPE_VERSION.to_string());
    put("tag", plan.tag.to_string());
    put("source", source.to_string());
    put("archs", crate::arch::archs_text(&plan.archs));
    put("gencode", plan.gencode.clone());
    put("ptx", plan.ptx.to_string());
    put("only_funcs", plan.only_funcs.clone().unwrap_or_default());
    put("cuda", plan.cuda.to_string());
    put("backend", plan.backend.kind().to_string());
    put("make_vars", make_vars(plan));
    for (k, v) in toolchain {
        m.insert(format!("toolchain.{k}"), v.clone());
    }
    KeyInputs(m)
}

/// The variables fdl passes to the build, one `NAME=value` a line, less those that name
/// a place or a parallelism (`CUDA_HOME`, `MAX_JOBS`): the toolchain's identity stands
/// for the former, and the latter changes no byte.
fn make_vars(plan: &BuildPlan) -> String {
    plan.backend
        .planned()
        .build_vars()
        .iter()
        .filter(|(k, _)| k != "CUDA_HOME" && k != "MAX_JOBS")
        .map(|(k, v)| format!("{k}={v}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Arch;
    use crate::nccl::plan::{
        ArchOrigin, BackendInputs, DockerfileSpec, PlanInputs, TagOrigin, Toolkit,
    };
    use crate::nccl::plan::{DockerSource, NativeSource};
    use crate::nccl::tag::Tag;
    use crate::nccl::tree::tree_digest;
    use std::path::{Path, PathBuf};

    /// The inputs a test varies, one at a time.
    #[derive(Clone)]
    struct In {
        tag: &'static str,
        archs: Vec<Arch>,
        ptx: bool,
        only_funcs: Option<&'static str>,
        cuda: &'static str,
        docker: bool,
        cuda_home: &'static str,
        builds_dir: &'static str,
        jobs: u32,
        source: &'static str,
        nvcc: &'static str,
        cxx: &'static str,
        /// A Docker backend's identity of its toolchain image (`toolchain.toolchain_image_id`).
        image_id: &'static str,
    }

    fn base() -> In {
        In {
            tag: "v2.27.5-1",
            archs: vec![Arch::new(8, 6)],
            ptx: false,
            only_funcs: None,
            cuda: "12.8",
            docker: false,
            cuda_home: "/opt/cuda",
            builds_dir: "/p/builds",
            jobs: 4,
            source: "tree sha256:aaaa",
            nvcc: "Cuda compilation tools, release 12.8, V12.8.93",
            cxx: "c++ (GCC) 12.2.0",
            image_id: "",
        }
    }

    fn key_of(i: &In) -> Key {
        let backend = if i.docker {
            BackendInputs::Docker {
                dockerfile: DockerfileSpec::Embedded {
                    sha256: "d".repeat(64),
                },
                base_image: None,
                source: DockerSource::Clone,
                probe: None,
                volumes: crate::nccl::plan::VolumesFlag::Auto,
                storage_driver: None,
            }
        } else {
            BackendInputs::Native {
                toolkit: Toolkit {
                    cuda_home: PathBuf::from(i.cuda_home),
                    nvcc: PathBuf::from(i.cuda_home).join("bin/nvcc"),
                    cuda: i.cuda.parse().unwrap(),
                    gpu_archs: None,
                    lib_dir: PathBuf::from(i.cuda_home).join("lib64"),
                },
                tools: BTreeMap::new(),
                source: NativeSource::Clone {
                    repo: "r".into(),
                    cache_dir: PathBuf::from("/c"),
                },
                allow_cuda_mismatch: true,
            }
        };
        let plan = BuildPlan::new(PlanInputs {
            tag: Tag::parse(i.tag).unwrap(),
            tag_origin: TagOrigin::Flag,
            cuda_flag: Some(i.cuda.parse().unwrap()),
            cuda_from_libtorch: None,
            archs: i.archs.clone(),
            arch_origin: ArchOrigin::Flag,
            jobs: i.jobs,
            jobs_reason: "test".into(),
            builds_dir: PathBuf::from(i.builds_dir),
            backend,
            backend_reason: "test".into(),
            ptx: i.ptx,
            only_funcs: i.only_funcs.map(str::to_string),
            warnings: Vec::new(),
        })
        .unwrap();
        let mut toolchain = BTreeMap::from([
            ("nvcc".to_string(), i.nvcc.to_string()),
            ("cxx".to_string(), i.cxx.to_string()),
        ]);
        if !i.image_id.is_empty() {
            toolchain.insert("toolchain_image_id".to_string(), i.image_id.to_string());
        }
        Key::of(&key_inputs(&plan, i.source, &toolchain))
    }

    #[test]
    fn every_input_that_decides_the_bytes_changes_the_key() {
        let b = base();
        let k = key_of(&b);
        assert_eq!(k, key_of(&base()), "the key is deterministic");
        type Change = fn(&mut In);
        let cases: &[(&str, Change)] = &[
            ("tag", |i| i.tag = "v2.27.6-1"),
            ("source", |i| i.source = "tree sha256:bbbb"),
            ("archs", |i| {
                i.archs = vec![Arch::new(8, 6), Arch::new(12, 0)]
            }),
            ("ptx", |i| i.ptx = true),
            ("only_funcs", |i| i.only_funcs = Some("AllReduce Sum f32")),
            ("cuda", |i| i.cuda = "12.9"),
            ("backend", |i| i.docker = true),
            ("nvcc --version", |i| {
                i.nvcc = "Cuda compilation tools, release 12.8, V12.8.61"
            }),
            ("c++ --version", |i| i.cxx = "c++ (GCC) 13.1.0"),
            ("Docker toolchain image", |i| {
                i.docker = true;
                i.image_id = "sha256:1111";
            }),
            ("Docker toolchain image, rebuilt", |i| {
                i.docker = true;
                i.image_id = "sha256:2222";
            }),
        ];
        let mut seen = std::collections::BTreeSet::from([k.clone()]);
        for (what, change) in cases {
            let mut i = base();
            change(&mut i);
            let other = key_of(&i);
            assert_ne!(other, k, "a change of {what} must change the key");
            assert!(seen.insert(other), "{what} collides with another case");
        }
        // What decides no byte leaves the key as it is: where the project or the
        // toolkit is, and how many jobs compile.
        let same: &[(&str, Change)] = &[
            ("builds dir", |i| i.builds_dir = "/other/project/builds"),
            ("jobs", |i| i.jobs = 64),
            ("cuda home", |i| i.cuda_home = "/usr/local/cuda-12.8"),
        ];
        for (what, change) in same {
            let mut i = base();
            change(&mut i);
            assert_eq!(key_of(&i), k, "{what} must not change the key");
        }
    }

    #[test]
    fn the_recipe_and_schema_versions_are_inputs() {
        let mut inputs = KeyInputs(BTreeMap::from([
            ("recipe".to_string(), BUILD_RECIPE_VERSION.to_string()),
            ("key_schema".to_string(), KEY_SCHEMA.to_string()),
        ]));
        let k = Key::of(&inputs);
        inputs
            .0
            .insert("recipe".into(), (BUILD_RECIPE_VERSION + 1).to_string());
        assert_ne!(Key::of(&inputs), k);
    }

    /// A clone's identity is the tag's commit: moving the tag to another commit is
    /// another key; the same commit is the same key, wherever it is cloned.
    #[test]
    fn a_clone_is_named_by_its_commit() {
        let t = tempfile::tempdir().unwrap();
        let git = |dir: &Path, args: &[&str]| {
            let ok = std::process::Command::new("git")
                .arg("-C")
                .arg(dir)
                .args(["-c", "user.name=t", "-c", "user.email=t@fdl.invalid"])
                .args(args)
                .output()
                .expect("git is needed for this test")
                .status
                .success();
            assert!(ok, "git {args:?}");
        };
        let clone = t.path().join("clone");
        std::fs::create_dir(&clone).unwrap();
        git(&clone, &["init", "-q"]);
        std::fs::write(clone.join("f"), "1").unwrap();
        git(&clone, &["add", "-A"]);
        git(&clone, &["commit", "-q", "-m", "one"]);
        git(&clone, &["tag", "v2.27.5-1"]);
        let plan = |cache_dir: PathBuf| {
            let i = base();
            let backend = BackendInputs::Native {
                toolkit: Toolkit {
                    cuda_home: PathBuf::from("/opt/cuda"),
                    nvcc: PathBuf::from("/opt/cuda/bin/nvcc"),
                    cuda: "12.8".parse().unwrap(),
                    gpu_archs: None,
                    lib_dir: PathBuf::from("/opt/cuda/lib64"),
                },
                tools: BTreeMap::new(),
                source: NativeSource::Clone {
                    repo: "r".into(),
                    cache_dir,
                },
                allow_cuda_mismatch: true,
            };
            BuildPlan::new(PlanInputs {
                tag: Tag::parse(i.tag).unwrap(),
                tag_origin: TagOrigin::Flag,
                cuda_flag: None,
                cuda_from_libtorch: None,
                archs: i.archs,
                arch_origin: ArchOrigin::Flag,
                jobs: 1,
                jobs_reason: "test".into(),
                builds_dir: PathBuf::from("/p"),
                backend,
                backend_reason: "test".into(),
                ptx: false,
                only_funcs: None,
                warnings: Vec::new(),
            })
            .unwrap()
        };
        let source_identity = |p: &BuildPlan| p.backend.planned().source_identity(p);
        let missing = source_identity(&plan(t.path().join("absent"))).unwrap_err();
        assert!(missing.contains("known once it is cloned"), "{missing}");
        let first = source_identity(&plan(clone.clone())).unwrap();
        assert!(first.starts_with("git r "), "{first}");
        std::fs::write(clone.join("f"), "2").unwrap();
        git(&clone, &["commit", "-q", "-am", "two"]);
        git(&clone, &["tag", "-f", "v2.27.5-1"]);
        let second = source_identity(&plan(clone)).unwrap();
        assert_ne!(first, second);
    }

    #[test]
    fn tree_digest_sees_content_and_links_but_not_git_or_build() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        std::fs::create_dir_all(d.join("src")).unwrap();
        std::fs::write(d.join("src/a.cc"), "int a;").unwrap();
        let first = tree_digest(d).unwrap();
        std::fs::create_dir_all(d.join(".git")).unwrap();
        std::fs::write(d.join(".git/HEAD"), "x").unwrap();
        std::fs::create_dir_all(d.join("build")).unwrap();
        std::fs::write(d.join("build/a.o"), "obj").unwrap();
        assert_eq!(tree_digest(d).unwrap(), first);
        std::fs::write(d.join("src/a.cc"), "int b;").unwrap();
        let second = tree_digest(d).unwrap();
        assert_ne!(second, first);
        std::os::unix::fs::symlink("a.cc", d.join("src/l")).unwrap();
        assert_ne!(tree_digest(d).unwrap(), second);
        // `build` deeper down is source, not an earlier build.
        let third = tree_digest(d).unwrap();
        std::fs::create_dir_all(d.join("src/build")).unwrap();
        assert_ne!(tree_digest(d).unwrap(), third);
    }
}
