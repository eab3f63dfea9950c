//! What one host says about itself, for the cluster: its GPUs and driver, its libtorch
//! variant and the NCCL that variant bundles, the NCCL its ranks will really load (the
//! worker's `LD_PRELOAD`, else the bundled one), whether that NCCL has code for each
//! GPU, and whether a preload can take effect at all. `fdl cluster self` prints it as
//! JSON on each worker; the controller only compares reports. Every part that cannot be
//! read carries the reason instead of failing the whole report.

use crate::gpu::{self, Driver, Gpu};
use crate::inspect::{self, interpose, resolve::LoaderEnv, Linkage};
use crate::libtorch::Libtorch;
use crate::version::CudaVersion;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The report's shape; a controller refuses any other (and ships its own fdl).
pub const REPORT_SCHEMA: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostReport {
    pub schema: u32,
    pub fdl_version: String,
    pub hostname: String,
    /// `x86_64`, `aarch64`: what fdl was built for here.
    pub machine: String,
    pub gpus: Facts<Vec<Gpu>>,
    pub driver: Facts<Driver>,
    pub libtorch: Facts<LibtorchFacts>,
    /// What the ranks load: the preload when set, else the bundled NCCL.
    pub effective: Facts<NcclFacts>,
    /// Per GPU: how the effective NCCL runs on it.
    #[serde(default)]
    pub coverage: Vec<GpuCoverage>,
    /// `nccl*` functions the libtorch imports that the effective NCCL does not export.
    #[serde(default)]
    pub missing_symbols: Vec<String>,
}

/// A fact, or why it could not be had.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Facts<T> {
    Known(T),
    Unknown(String),
}

impl<T> Facts<T> {
    pub fn known(&self) -> Option<&T> {
        match self {
            Facts::Known(t) => Some(t),
            Facts::Unknown(_) => None,
        }
    }

    fn from(r: anyhow::Result<T>) -> Self {
        match r {
            Ok(t) => Facts::Known(t),
            Err(e) => Facts::Unknown(format!("{e:#}")),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LibtorchFacts {
    /// `precompiled/cu128`
    pub variant: String,
    pub libtorch_cuda: PathBuf,
    pub nccl: Facts<NcclFacts>,
    /// Whether a preloaded libnccl.so.2 replaces the NCCL this libtorch calls.
    pub bridge: Facts<Bridge>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bridge {
    pub takes_effect: bool,
    /// In words, as status prints it.
    pub why: String,
    /// The `nccl*` functions the library imports (pip-style torch), which any preloaded
    /// NCCL must export.
    pub imports: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NcclFacts {
    pub file: PathBuf,
    pub version: String,
    pub cuda: Option<CudaVersion>,
    /// `static`, `dynamic` (libtorch's view) or `preload`.
    pub linkage: String,
    /// SASS and PTX targets, as `fdl inspect` names them.
    pub sass: Vec<String>,
    pub ptx: Vec<String>,
    /// What the names above come from; coverage is judged on it without reading the
    /// file again.
    #[serde(skip)]
    pub gpu_code: crate::inspect::GpuCode,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuCoverage {
    pub index: u32,
    pub arch: String,
    /// `native sm_86`, `ptx compute_90 (JIT)`, or `none`.
    pub verdict: String,
    pub covered: bool,
}

/// What this host's worker entry tells the report: its libtorch variant and preload.
#[derive(Debug, Clone, Default)]
pub struct SelfQuery {
    pub root: PathBuf,
    pub arch: Option<String>,
    pub ld_preload: Option<PathBuf>,
}

pub fn report(q: &SelfQuery) -> HostReport {
    let gpus = Facts::from(gpu::query().map_err(anyhow::Error::from));
    let driver = Facts::from(gpu::driver().map_err(anyhow::Error::from));
    let libtorch = Facts::from(libtorch_facts(q));
    let effective = Facts::from(effective_nccl(q, libtorch.known()));
    let coverage = match (&gpus, &effective) {
        (Facts::Known(gpus), Facts::Known(nccl)) => coverage(gpus, &nccl.gpu_code),
        _ => Vec::new(),
    };
    let missing_symbols = match (&libtorch, &effective) {
        (Facts::Known(lt), Facts::Known(nccl)) => missing_symbols(lt, nccl),
        _ => Vec::new(),
    };
    HostReport {
        schema: REPORT_SCHEMA,
        fdl_version: env!("CARGO_PKG_VERSION").to_string(),
        hostname: hostname(),
        machine: std::env::consts::ARCH.to_string(),
        gpus,
        driver,
        libtorch,
        effective,
        coverage,
        missing_symbols,
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn libtorch_facts(q: &SelfQuery) -> anyhow::Result<LibtorchFacts> {
    let store = Libtorch::new(q.root.join("libtorch"));
    let variant = match &q.arch {
        Some(name) => store.variant(name)?,
        None => store.active()?,
    };
    if let Some(why) = variant.missing() {
        anyhow::bail!("libtorch variant {}: {why}", variant.name);
    }
    let lib = variant.libtorch_cuda();
    let nccl = Facts::from(nccl_of(&lib));
    let bridge = Facts::from(bridge(&lib));
    Ok(LibtorchFacts {
        variant: variant.name,
        libtorch_cuda: lib,
        nccl,
        bridge,
    })
}

/// The NCCL a libtorch uses, and the GPU code of the file that carries it.
fn nccl_of(lib: &Path) -> anyhow::Result<NcclFacts> {
    let found = inspect::detect_nccl(lib, &LoaderEnv::from_process())?
        .ok_or_else(|| anyhow::anyhow!("{} carries no NCCL and needs none", lib.display()))?;
    let linkage = match found.linkage {
        Linkage::Static => "static",
        Linkage::Dynamic { .. } => "dynamic",
    };
    facts_of(&found.file, linkage)
}

fn facts_of(file: &Path, linkage: &str) -> anyhow::Result<NcclFacts> {
    let ins = inspect::inspect(file)?;
    let id = ins.nccl.clone().ok_or_else(|| {
        anyhow::anyhow!(
            "{} has no NCCL self-id: it is not an NCCL library",
            file.display()
        )
    })?;
    Ok(NcclFacts {
        file: file.to_path_buf(),
        version: id.version.to_string(),
        cuda: Some(id.cuda),
        linkage: linkage.to_string(),
        sass: ins
            .gpu_code
            .sass
            .iter()
            .map(|e| e.target.to_string())
            .collect(),
        ptx: ins
            .gpu_code
            .ptx
            .iter()
            .map(|e| e.target.to_string())
            .collect(),
        gpu_code: ins.gpu_code,
    })
}

fn bridge(lib: &Path) -> anyhow::Result<Bridge> {
    let found = interpose::analyze(lib)?;
    let (takes_effect, why) = match &found.verdict {
        interpose::Verdict::PreloadTakesEffect => (
            true,
            "its nccl* calls go through the dynamic linker: a preloaded libnccl.so.2 replaces them"
                .to_string(),
        ),
        interpose::Verdict::PreloadIneffective { bound, why } => (
            false,
            format!(
                "a preload changes nothing: {} {} bound inside the library ({why})",
                bound.len(),
                if bound.len() == 1 { "is" } else { "are" }
            ),
        ),
        interpose::Verdict::NoNccl => (true, "it calls no nccl* function".to_string()),
    };
    Ok(Bridge {
        takes_effect,
        why,
        imports: found.imported,
    })
}

fn effective_nccl(q: &SelfQuery, libtorch: Option<&LibtorchFacts>) -> anyhow::Result<NcclFacts> {
    if let Some(pre) = &q.ld_preload {
        // A path the worker's env names is resolved on the worker, from its checkout.
        let file = if pre.is_absolute() {
            pre.clone()
        } else {
            q.root.join(pre)
        };
        if !file.is_file() {
            anyhow::bail!(
                "LD_PRELOAD names {}, which does not exist on this host: ship the build there (`fdl cluster ship`) or fix the worker's env",
                file.display()
            );
        }
        return facts_of(&file, "preload");
    }
    match libtorch {
        Some(lt) => match &lt.nccl {
            Facts::Known(n) => Ok(n.clone()),
            Facts::Unknown(why) => {
                anyhow::bail!("no LD_PRELOAD, and the libtorch's NCCL is unknown: {why}")
            }
        },
        None => anyhow::bail!("no LD_PRELOAD, and no libtorch to take NCCL from"),
    }
}

fn coverage(gpus: &[Gpu], code: &inspect::GpuCode) -> Vec<GpuCoverage> {
    gpus.iter()
        .map(|g| {
            let verdict = inspect::coverage(code, g.compute_cap);
            let (text, covered) = match verdict {
                inspect::Verdict::Native { sass } => (format!("native {sass}"), true),
                inspect::Verdict::PtxJit { ptx } => (format!("ptx {ptx} (JIT)"), true),
                inspect::Verdict::NotCovered => ("none".to_string(), false),
            };
            GpuCoverage {
                index: g.index,
                arch: g.compute_cap.to_string(),
                verdict: text,
                covered,
            }
        })
        .collect()
}

/// The libtorch's imports the effective NCCL lacks. A static libtorch imports none.
fn missing_symbols(lt: &LibtorchFacts, nccl: &NcclFacts) -> Vec<String> {
    let Some(bridge) = lt.bridge.known() else {
        return Vec::new();
    };
    if bridge.imports.is_empty() || nccl.file == lt.libtorch_cuda {
        return Vec::new();
    }
    match interpose::exported_nccl_symbols(&nccl.file) {
        Ok(exports) => bridge
            .imports
            .iter()
            .filter(|s| !exports.contains(s))
            .cloned()
            .collect(),
        Err(e) => vec![format!(
            "(cannot read {}'s symbols: {e})",
            nccl.file.display()
        )],
    }
}
