//! What a plan says beside its decisions: the problems that stop it and the warnings its
//! reader should know, as values whose variants carry the facts. `Display` is the one full
//! sentence (what `--dry-run` prints, what a refused build names); the JSON keeps that
//! text in `problems`/`warnings` and gives the facts beside it in
//! `problem_facts`/`warning_facts`. Manifests written before the facts were recorded
//! read back as [`Finding::Said`], with their text.

use crate::arch::Arch;
use crate::version::{CudaVersion, NcclVersion};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::path::PathBuf;

/// One problem or warning of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Finding {
    /// `--cuda` pins a release fdl knows no image for.
    PinnedCudaWithoutImage {
        cuda: CudaVersion,
        closest: CudaVersion,
        image: String,
    },
    /// The CUDA asked for cannot compile an arch, or fdl's table does not know which
    /// releases do (`cuda` is `None` then); `why` is the table's sentence.
    CudaCannotCompile {
        arch: Arch,
        cuda: Option<CudaVersion>,
        why: String,
    },
    /// No image fdl knows fits the CUDA and archs (the image table's sentence).
    NoImage {
        cuda: CudaVersion,
        why: String,
    },
    BaseImageWithoutNvcc {
        image: String,
    },
    BaseImageNvccSilent {
        image: String,
    },
    BaseImageOtherCuda {
        image: String,
        image_cuda: CudaVersion,
        asked: CudaVersion,
    },
    BaseImageCannotCompile {
        image: String,
        image_cuda: CudaVersion,
        arch: Arch,
        offered: Vec<Arch>,
        /// The nearest release that compiles every planned arch, when one is known.
        fits: Option<CudaVersion>,
    },
    BaseImageLacksTools {
        image: String,
        tools: Vec<String>,
    },
    /// The native backend's toolkit does not fit the plan (its own error).
    Toolkit {
        why: String,
    },
    /// A dry run on a host without the engine the build needs.
    NoEngineHere {
        why: String,
    },
    /// A build on a host without the engine it needs.
    NoEngine {
        why: String,
    },
    /// The native backend lacks tools, but the store holds the build.
    ToolsNotNeeded {
        tools: Vec<String>,
    },
    ToolsMissing {
        tools: Vec<String>,
    },
    /// No tree of the tag is here to check it against.
    TagUnchecked {
        tag: String,
        repo: String,
    },
    /// fdl's clone of the tag holds another release.
    CloneOtherRelease {
        tag: String,
        found: NcclVersion,
        clone: PathBuf,
    },
    /// The build's directory holds something the build may not replace.
    Conflict {
        why: String,
    },
    /// The installed build from this plan changed since it was sealed.
    ChangedSinceSealed {
        why: String,
    },
    AlreadyBuilt {
        dir: PathBuf,
        built_at: String,
    },
    /// This host's driver, read or not, against the plan's CUDA (the driver check's
    /// sentence).
    Driver {
        why: String,
    },
    DriverTooOld {
        why: String,
        allowed: bool,
    },
    /// The project root fell back to the working directory.
    RootFallback {
        root: PathBuf,
    },
    /// `--tag` names another release than the active libtorch's NCCL.
    OtherRelease {
        tag: String,
        libtorch: String,
        libtorch_nccl: NcclVersion,
        why: String,
    },
    /// The tag was planned from an answer that holds under a condition.
    ConditionalTag {
        summary: String,
    },
    /// The active libtorch has no GPU code for a planned arch.
    LibtorchWithoutCode {
        libtorch: String,
        arch: Arch,
    },
    /// `--archs` leaves out one of this host's GPUs.
    GpuLeftOut {
        index: u32,
        name: String,
        capability: Arch,
        /// The `--archs` value that covers it.
        archs: Vec<Arch>,
        /// What else the toolchain needs to compile them, as a clause.
        toolchain: Option<String>,
    },
    /// A plugin the libtorch's NCCL loads today that the preloaded build would not.
    PluginMoved {
        variable: String,
        path: PathBuf,
        keep: Option<String>,
        sentence: String,
    },
    /// Some of a cluster's workers did not answer `cluster status`.
    WorkersDown {
        down: usize,
        workers: usize,
        /// `--cuda` was given.
        cuda_flag: bool,
    },
    WorkerDown {
        host: String,
        why: String,
    },
    /// A worker whose libtorch's NCCL is not known did not count for the tag.
    WorkerNcclUnknown {
        host: String,
    },
    /// Workers whose libtorch bundles an older NCCL than the tag's.
    OlderNccl {
        hosts: Vec<(String, NcclVersion)>,
        newest: NcclVersion,
    },
    /// A worker's driver cannot run the CUDA the libtorch's NCCL names.
    DriverOlderThanLibtorch {
        host: String,
        runs: CudaVersion,
        wanted: CudaVersion,
    },
    /// A finding recorded as text only (a manifest of an earlier fdl).
    Said {
        text: String,
    },
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use Finding::*;
        match self {
            PinnedCudaWithoutImage { cuda, closest, image } => write!(
                f,
                "no nvidia/cuda image for CUDA {cuda} is known to fdl, and --cuda pins it. Give an image holding CUDA {cuda} with --base-image IMAGE, pass --cuda {} to use {image} (the closest known image that compiles every planned arch), or build with --backend native and a CUDA {cuda} toolkit (--cuda-home DIR)",
                closest.without_patch()
            ),
            CudaCannotCompile { why, .. } | NoImage { why, .. } | Toolkit { why } | Conflict { why } | ChangedSinceSealed { why } | Driver { why } => {
                f.write_str(why)
            }
            BaseImageWithoutNvcc { image } => write!(
                f,
                "--base-image {image} has no nvcc ($CUDA_HOME, /usr/local/cuda and PATH were looked at): give an image with a CUDA toolkit, or set CUDA_HOME in it"
            ),
            BaseImageNvccSilent { image } => write!(
                f,
                "the nvcc in --base-image {image} did not say its release (`nvcc --version`): check that it runs in the image"
            ),
            BaseImageOtherCuda { image, image_cuda, asked } => write!(
                f,
                "--base-image {image} holds CUDA {image_cuda}, but --cuda asks for {asked}: drop --cuda, or give an image with CUDA {}",
                asked.without_patch()
            ),
            BaseImageCannotCompile { image, image_cuda, arch, offered, fits } => {
                write!(
                    f,
                    "the nvcc in --base-image {image} (CUDA {image_cuda}) cannot compile {arch}: `nvcc --list-gpu-arch` offers {}. Give an image whose CUDA supports {arch}",
                    crate::arch::archs_text(offered)
                )?;
                if let Some(fit) = fits {
                    write!(f, " (CUDA {} compiles every planned arch)", fit.without_patch())?;
                }
                f.write_str(", or drop it from --archs")
            }
            BaseImageLacksTools { image, tools } => write!(
                f,
                "--base-image {image} lacks {} and has no apt-get to install them: give an image that has them",
                tools.join(", ")
            ),
            NoEngineHere { why } => write!(
                f,
                "this host cannot run the build: {why}; run it where a Docker engine answers, or with --backend native where a CUDA toolkit is installed"
            ),
            NoEngine { why } => write!(f, "{why}; or build with --backend native where a CUDA toolkit is installed"),
            ToolsNotNeeded { tools } => write!(
                f,
                "this host lacks tools a compile needs, but none is needed: the build is installed from the store\n  {}",
                tools.join("\n  ")
            ),
            ToolsMissing { tools } => write!(
                f,
                "the native backend cannot build here:\n  {}",
                tools.join("\n  ")
            ),
            TagUnchecked { tag, repo } => write!(
                f,
                "the tag {tag} was not checked against a source: it is not cloned here yet, and fdl keeps no list of NCCL's releases; the build fetches it from {repo} (a tag that does not exist fails there). Give --source DIR with an NCCL tree to check it now"
            ),
            CloneOtherRelease { tag, found, clone } => write!(
                f,
                "fdl's clone of {tag} in {} is NCCL {found}: remove that directory, and the build clones the tag again",
                crate::text::shown(clone)
            ),
            AlreadyBuilt { dir, built_at } => write!(
                f,
                "{} already holds a build from this plan ({built_at}): a real run does nothing (--force rebuilds it)",
                dir.display()
            ),
            DriverTooOld { why, allowed: true } => {
                write!(f, "{why} (--allow-old-driver: built anyway)")
            }
            DriverTooOld { why, allowed: false } => write!(
                f,
                "{why}, or build for an older CUDA (--cuda), or pass --allow-old-driver to build it for another host"
            ),
            RootFallback { root } => f.write_str(&crate::project::fallback_sentence(root)),
            OtherRelease { tag, why, .. } => write!(f, "--tag {tag}: {why}"),
            ConditionalTag { summary } => write!(
                f,
                "the tag is planned from a conditional answer: {summary}. `fdl nccl detect` says unknown here; on a host with every library installed it answers for certain"
            ),
            LibtorchWithoutCode { libtorch, arch } => write!(
                f,
                "the active libtorch ({libtorch}) has no GPU code for {arch}: an NCCL built for {arch} will not make training run there. Use a libtorch built for {arch} (from source with TORCH_CUDA_ARCH_LIST including {}), and register it with `fdl libtorch add`",
                arch.capability()
            ),
            GpuLeftOut { index, name, capability, archs, toolchain } => write!(
                f,
                "--archs leaves out this host's GPU {index} ({name}, {capability}): the build will have no code for it, and `fdl nccl verify` here will say so. To cover it, pass --archs \"{}\"{}",
                archs.iter().map(|a| a.capability()).collect::<Vec<_>>().join(";"),
                toolchain.as_deref().unwrap_or_default()
            ),
            PluginMoved { sentence, .. } => write!(
                f,
                "{sentence}. `fdl nccl env` prints the line once the build is installed"
            ),
            WorkersDown { down, workers, cuda_flag } => write!(
                f,
                "{down} of {workers} workers did not answer (each is named below), so the plan takes its tag and archs from --tag and --archs{}",
                if *cuda_flag {
                    " and its CUDA from --cuda; their drivers were not checked against it"
                } else {
                    "; their drivers were not checked against its CUDA (pass --cuda to choose it)"
                }
            ),
            WorkerDown { host, why } => write!(f, "{host} did not answer: {why}"),
            WorkerNcclUnknown { host } => write!(
                f,
                "{host}: its libtorch's NCCL is unknown, so it did not count for the tag"
            ),
            OlderNccl { hosts, newest } => write!(
                f,
                "{} bundle an older NCCL than {newest}: their libtorch will load {newest}, so `fdl cluster status` must show every symbol it imports exported (the symbols verdict)",
                hosts
                    .iter()
                    .map(|(h, v)| format!("{h} ({v})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            DriverOlderThanLibtorch { host, runs, wanted } => write!(
                f,
                "{host}'s driver runs CUDA up to {runs}, older than the {wanted} the libtorch's NCCL names: the build uses CUDA {runs}"
            ),
            Said { text } => f.write_str(text),
        }
    }
}

/// A plan's problems and warnings, serialized as their sentences (`problems`,
/// `warnings`: what fdl has always written) with their facts beside them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Findings {
    /// What stops the plan from running. A dry run shows the plan with them; a build
    /// refuses to start.
    pub problems: Vec<Finding>,
    /// What the reader should know that does not stop the build (a libtorch without code
    /// for a planned GPU, say).
    pub warnings: Vec<Finding>,
}

impl Serialize for Findings {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        for (name, facts, list) in [
            ("problems", "problem_facts", &self.problems),
            ("warnings", "warning_facts", &self.warnings),
        ] {
            if !list.is_empty() {
                let text: Vec<String> = list.iter().map(Finding::to_string).collect();
                m.serialize_entry(name, &text)?;
                m.serialize_entry(facts, list)?;
            }
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for Findings {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Repr {
            #[serde(default)]
            problems: Vec<String>,
            #[serde(default)]
            problem_facts: Vec<serde_json::Value>,
            #[serde(default)]
            warnings: Vec<String>,
            #[serde(default)]
            warning_facts: Vec<serde_json::Value>,
        }
        let r = Repr::deserialize(d)?;
        Ok(Findings {
            problems: read_back(r.problems, r.problem_facts),
            warnings: read_back(r.warnings, r.warning_facts),
        })
    }
}

/// Each sentence with its facts where they read as a kind this fdl knows and say the same
/// sentence; otherwise the sentence alone (an older or newer fdl wrote it).
fn read_back(text: Vec<String>, facts: Vec<serde_json::Value>) -> Vec<Finding> {
    let mut facts = facts.into_iter();
    text.into_iter()
        .map(|t| {
            facts
                .next()
                .and_then(|v| serde_json::from_value::<Finding>(v).ok())
                .filter(|f| f.to_string() == t)
                .unwrap_or(Finding::Said { text: t })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn v(s: &str) -> CudaVersion {
        s.parse().unwrap()
    }

    #[test]
    fn findings_keep_their_sentences_and_read_back_with_their_facts() {
        let findings = Findings {
            problems: vec![Finding::BaseImageCannotCompile {
                image: "cuda:13".into(),
                image_cuda: v("13.0"),
                arch: Arch::new(6, 1),
                offered: vec![Arch::new(7, 5), Arch::new(8, 0)],
                fits: Some(v("12.8")),
            }],
            warnings: vec![Finding::TagUnchecked {
                tag: "v2.27.5-1".into(),
                repo: "https://example/nccl".into(),
            }],
        };
        let json = serde_json::to_value(&findings).unwrap();
        assert_eq!(
            json["problems"][0],
            "the nvcc in --base-image cuda:13 (CUDA 13.0) cannot compile sm_61: `nvcc --list-gpu-arch` offers sm_75 sm_80. Give an image whose CUDA supports sm_61 (CUDA 12.8 compiles every planned arch), or drop it from --archs"
        );
        assert_eq!(
            json["problem_facts"][0]["kind"],
            "base_image_cannot_compile"
        );
        assert_eq!(json["warning_facts"][0]["tag"], "v2.27.5-1");
        let back: Findings = serde_json::from_value(json).unwrap();
        assert_eq!(back, findings);
    }

    /// One finding of each kind; the match has no catch-all, so a new variant does not
    /// compile until it is here (and then in docs/json.md, which the test below checks).
    fn one_of_each() -> Vec<Finding> {
        use Finding::*;
        let (cuda, arch, nccl) = (v("12.8"), Arch::new(6, 1), NcclVersion::new(2, 27, 5));
        let s = || "s".to_string();
        let all = vec![
            PinnedCudaWithoutImage {
                cuda,
                closest: cuda,
                image: s(),
            },
            CudaCannotCompile {
                arch,
                cuda: None,
                why: s(),
            },
            NoImage { cuda, why: s() },
            BaseImageWithoutNvcc { image: s() },
            BaseImageNvccSilent { image: s() },
            BaseImageOtherCuda {
                image: s(),
                image_cuda: cuda,
                asked: cuda,
            },
            BaseImageCannotCompile {
                image: s(),
                image_cuda: cuda,
                arch,
                offered: vec![],
                fits: None,
            },
            BaseImageLacksTools {
                image: s(),
                tools: vec![s()],
            },
            Toolkit { why: s() },
            NoEngineHere { why: s() },
            NoEngine { why: s() },
            ToolsNotNeeded { tools: vec![s()] },
            ToolsMissing { tools: vec![s()] },
            TagUnchecked {
                tag: s(),
                repo: s(),
            },
            CloneOtherRelease {
                tag: s(),
                found: nccl.clone(),
                clone: PathBuf::from("/c"),
            },
            Conflict { why: s() },
            ChangedSinceSealed { why: s() },
            AlreadyBuilt {
                dir: PathBuf::from("/d"),
                built_at: s(),
            },
            Driver { why: s() },
            DriverTooOld {
                why: s(),
                allowed: false,
            },
            RootFallback {
                root: PathBuf::from("/r"),
            },
            OtherRelease {
                tag: s(),
                libtorch: s(),
                libtorch_nccl: nccl.clone(),
                why: s(),
            },
            ConditionalTag { summary: s() },
            LibtorchWithoutCode {
                libtorch: s(),
                arch,
            },
            GpuLeftOut {
                index: 0,
                name: s(),
                capability: arch,
                archs: vec![arch],
                toolchain: None,
            },
            PluginMoved {
                variable: s(),
                path: PathBuf::from("/p"),
                keep: None,
                sentence: s(),
            },
            WorkersDown {
                down: 1,
                workers: 2,
                cuda_flag: false,
            },
            WorkerDown {
                host: s(),
                why: s(),
            },
            WorkerNcclUnknown { host: s() },
            OlderNccl {
                hosts: vec![(s(), nccl.clone())],
                newest: nccl,
            },
            DriverOlderThanLibtorch {
                host: s(),
                runs: cuda,
                wanted: cuda,
            },
            Said { text: s() },
        ];
        for f in &all {
            match f {
                PinnedCudaWithoutImage { .. }
                | CudaCannotCompile { .. }
                | NoImage { .. }
                | BaseImageWithoutNvcc { .. }
                | BaseImageNvccSilent { .. }
                | BaseImageOtherCuda { .. }
                | BaseImageCannotCompile { .. }
                | BaseImageLacksTools { .. }
                | Toolkit { .. }
                | NoEngineHere { .. }
                | NoEngine { .. }
                | ToolsNotNeeded { .. }
                | ToolsMissing { .. }
                | TagUnchecked { .. }
                | CloneOtherRelease { .. }
                | Conflict { .. }
                | ChangedSinceSealed { .. }
                | AlreadyBuilt { .. }
                | Driver { .. }
                | DriverTooOld { .. }
                | RootFallback { .. }
                | OtherRelease { .. }
                | ConditionalTag { .. }
                | LibtorchWithoutCode { .. }
                | GpuLeftOut { .. }
                | PluginMoved { .. }
                | WorkersDown { .. }
                | WorkerDown { .. }
                | WorkerNcclUnknown { .. }
                | OlderNccl { .. }
                | DriverOlderThanLibtorch { .. }
                | Said { .. } => {}
            }
        }
        all
    }

    #[test]
    fn every_kind_reads_back_and_docs_json_lists_exactly_the_kinds() {
        let mut kinds = Vec::new();
        for f in one_of_each() {
            let v = serde_json::to_value(&f).unwrap();
            kinds.push(v["kind"].as_str().unwrap().to_string());
            assert_eq!(serde_json::from_value::<Finding>(v).unwrap(), f);
        }
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/json.md"),
        )
        .unwrap();
        let list = doc
            .split("The kinds:")
            .nth(1)
            .and_then(|rest| rest.split(")).").next())
            .expect("docs/json.md lists the findings' kinds after \"The kinds:\"");
        let mut documented: Vec<String> = list
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        documented.sort();
        kinds.sort();
        assert_eq!(documented, kinds);
    }

    #[test]
    fn sentences_without_facts_or_with_strange_ones_read_back_as_said() {
        let old = serde_json::json!({"warnings": ["an older fdl's warning"]});
        let back: Findings = serde_json::from_value(old).unwrap();
        assert_eq!(
            back.warnings,
            vec![Finding::Said {
                text: "an older fdl's warning".into()
            }]
        );
        assert!(back.problems.is_empty());
        // A newer fdl's kind, and facts that do not say the sentence: the sentence holds.
        let newer = serde_json::json!({
            "problems": ["from a newer fdl", "edited"],
            "problem_facts": [{"kind": "not_known_yet"}, {"kind": "toolkit", "why": "other"}],
        });
        let back: Findings = serde_json::from_value(newer).unwrap();
        assert_eq!(
            back.problems,
            vec![
                Finding::Said {
                    text: "from a newer fdl".into()
                },
                Finding::Said {
                    text: "edited".into()
                }
            ]
        );
        assert_eq!(
            serde_json::to_value(Findings::default()).unwrap(),
            serde_json::json!({})
        );
    }
}
