//! What one host says about itself, for the cluster: its GPUs and driver, its libtorch
//! variant and the NCCL that variant bundles, the NCCL its ranks will really load (the
//! worker's `LD_PRELOAD`, else the bundled one), whether that NCCL and the libtorch
//! itself have code for each GPU (a rank needs both), and whether a preload can take
//! effect at all. `fdl cluster self` prints it as
//! JSON on each worker; the controller only compares reports. Every part that cannot be
//! read carries the reason instead of failing the whole report.

use crate::gpu::{self, Driver, Gpu};
use crate::inspect::{self, interpose, Linkage};
use crate::libtorch::Libtorch;
use crate::loader::{self, Answer, LoaderEnv};
use crate::version::CudaVersion;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The report's shape; a controller refuses any other (and ships its own fdl). 2: the
/// worker's own loader's answer (`witness`), and a GPU's architecture is `arch`
/// (`"sm_61"`) with `compute_cap` nvidia-smi's `"6.1"`. 3: the NCCL plugins its ranks
/// load (`plugins`).
pub const REPORT_SCHEMA: u32 = 3;

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
    /// Whether `effective` is unknown because the calls reach two NCCLs: a finding (the
    /// skew verdict is red), where any other unknown leaves the verdicts unknown.
    #[serde(default)]
    pub effective_split: bool,
    /// Per GPU: how the effective NCCL runs on it.
    #[serde(default)]
    pub coverage: Vec<GpuCoverage>,
    /// Per GPU: how the libtorch's own kernels run on it. A report without it (an older
    /// fdl) leaves the verdict unknown, never green.
    #[serde(default = "torch_not_reported")]
    pub torch_coverage: Facts<TorchCoverage>,
    /// `nccl*` functions the libtorch imports that the effective NCCL does not export.
    #[serde(default)]
    pub missing_symbols: Vec<String>,
    /// What the worker's own loader binds for its libtorch in its effective environment
    /// (`None`: not asked, `--no-witness`).
    #[serde(default)]
    pub witness: Option<WitnessReport>,
    /// Per plugin kind the effective NCCL opens, what it loads there (`loader::plugins`).
    #[serde(default = "plugins_not_reported")]
    pub plugins: Facts<Vec<PluginFacts>>,
}

/// One plugin kind on one host, as `fdl nccl plugins` answers it there, in short.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginFacts {
    /// `net`, `tuner`, …
    pub kind: String,
    /// Its variable's value in the ranks' environment (`None`: unset).
    #[serde(default)]
    pub value: Option<String>,
    /// `loaded`, `not_found`, `no_common_version`, `disabled`, `unknown`.
    pub verdict: String,
    /// The file NCCL opens (loaded or ignored).
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// With `loaded`: the entry version NCCL takes.
    #[serde(default)]
    pub version: Option<u32>,
    /// The entry versions the file exports.
    #[serde(default)]
    pub exports: Vec<u32>,
    /// The entry versions this NCCL asks for, newest first.
    #[serde(default)]
    pub asks: Vec<u32>,
    /// With `unknown`: why.
    #[serde(default)]
    pub reason: Option<String>,
}

impl PluginFacts {
    fn of(k: &loader::plugins::KindReport) -> PluginFacts {
        use loader::plugins::Verdict as V;
        let (path, version, exports, reason) = match &k.verdict {
            V::Loaded { path, version, .. } => {
                let exports = k
                    .try_of(path)
                    .and_then(|t| t.exports.clone())
                    .unwrap_or_default();
                (Some(path.clone()), Some(*version), exports, None)
            }
            V::NoCommonVersion { path, exports } => {
                (Some(path.clone()), None, exports.clone(), None)
            }
            V::Unknown { reason } => (None, None, Vec::new(), Some(reason.clone())),
            V::NotFound | V::Disabled => (None, None, Vec::new(), None),
        };
        PluginFacts {
            kind: k.kind.name().to_string(),
            value: k.value.clone(),
            verdict: k.verdict.word().to_string(),
            path,
            version,
            exports,
            asks: k.asks.clone(),
            reason,
        }
    }
}

fn plugins_not_reported() -> Facts<Vec<PluginFacts>> {
    Facts::Unknown("this worker's fdl does not report its NCCL plugins".into())
}

/// The worker's loader set against fdl's model there (`loader::witness`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WitnessReport {
    /// `agree`, `disagree` (the model is wrong there: `effective` is the loader's answer),
    /// `model_unknown` (the loader's answer stands), `inconclusive` (the trace was cut),
    /// `none` (no loader to ask), `refused` (a file came from a peer).
    pub verdict: String,
    /// The loader's answer in words, or why it was not asked.
    pub loader: String,
    /// With `disagree`: what the model said.
    #[serde(default)]
    pub model: Option<String>,
    /// Whether the witness was the worker's Python process (`--python-witness`: its
    /// interpreter importing torch), not its loader.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub python: bool,
}

impl WitnessReport {
    pub fn disagrees(&self) -> bool {
        self.verdict == "disagree"
    }
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
    /// For a pip torch: the interpreter its ranks run (they are Python processes, and
    /// `nccl` is what torch's own import opens by itself). Absent: a program links it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<PathBuf>,
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

/// The GPU code of the libtorch a rank loads, and what it runs on each GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TorchCoverage {
    /// The files whose code was judged: `libtorch_cuda.so`, and the split libraries it
    /// loads (`libtorch_cuda_cu.so`, `libtorch_cuda_cpp.so`: torch 1.x's layout) that
    /// hold GPU code.
    pub files: Vec<TorchFile>,
    pub gpus: Vec<GpuCoverage>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TorchFile {
    pub file: PathBuf,
    /// SASS and PTX targets, as `fdl inspect` names them.
    pub sass: Vec<String>,
    pub ptx: Vec<String>,
}

fn torch_not_reported() -> Facts<TorchCoverage> {
    Facts::Unknown(
        "its fdl does not report the libtorch's GPU code (an older fdl): update fdl there".into(),
    )
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
    /// The worker's `LD_PRELOAD`, as its env: block writes it (split as glibc splits it).
    pub ld_preload: Option<String>,
    /// Ask this host's own loader too (`loader::witness`).
    pub witness: bool,
    /// For a pip torch: run its interpreter importing torch (`--python-witness`).
    pub python_witness: bool,
    /// Answer for this kind of process (`None`: the variant's, Python for a pip torch).
    pub process: Option<loader::python::ProcessKind>,
    /// What the worker's env: block sets of the variables the loader and NCCL's plugin
    /// search read (`LD_LIBRARY_PATH`, `NCCL_<KIND>_PLUGIN`): the ranks see these, over
    /// what this process inherited.
    pub env: Vec<(String, String)>,
}

/// The variables of a worker's env: block that its report must see: the loader's search
/// path, NCCL's plugin names, and what decides a Python rank's `sys.path`.
pub fn reported_variable(name: &str) -> bool {
    name == "LD_LIBRARY_PATH"
        || PYTHON_VARIABLES.contains(&name)
        || loader::plugins::Kind::ALL
            .iter()
            .any(|k| k.variable() == name)
}

/// What a pip torch's Python ranks read that changes which NCCL they open
/// (`loader::python`).
pub const PYTHON_VARIABLES: &[&str] = &[
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONNOUSERSITE",
    "PYTHONSAFEPATH",
    "TORCH_USE_RTLD_GLOBAL",
];

pub fn report(q: &SelfQuery) -> HostReport {
    // The two nvidia-smi calls and the libtorch's side (its inspection, the effective
    // NCCL, the loader's witness, the plugins) depend on nothing of each other: asked at
    // once, the report costs the slowest of them (nvidia-smi takes tens of ms on a real
    // driver, more without persistence mode), not their sum.
    let (gpus, driver, libtorch, (effective, witness, plugins)) = std::thread::scope(|s| {
        let gpus = s.spawn(|| Facts::from(gpu::query().map_err(anyhow::Error::from)));
        let driver = s.spawn(|| Facts::from(gpu::driver().map_err(anyhow::Error::from)));
        let libtorch = Facts::from(libtorch_facts(q));
        let effective = effective_nccl(q, libtorch.known());
        (joined(gpus), joined(driver), libtorch, effective)
    });
    let effective_split = effective
        .as_ref()
        .err()
        .is_some_and(|e| e.downcast_ref::<TwoNcclsError>().is_some());
    let effective = Facts::from(effective);
    let coverage = match (&gpus, &effective) {
        (Facts::Known(gpus), Facts::Known(nccl)) => coverage(gpus, &nccl.gpu_code),
        _ => Vec::new(),
    };
    let torch_coverage = match (&gpus, &libtorch) {
        (Facts::Known(gpus), Facts::Known(lt)) => {
            Facts::from(torch_coverage(gpus, &lt.libtorch_cuda))
        }
        (Facts::Unknown(why), _) => Facts::Unknown(format!("the GPUs are unknown: {why}")),
        (_, Facts::Unknown(why)) => Facts::Unknown(format!("the libtorch is unknown: {why}")),
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
        effective_split,
        coverage,
        torch_coverage,
        missing_symbols,
        witness,
        plugins,
    }
}

/// The libtorch and the NCCL its ranks load, as [`report`] decides them (the worker's
/// preload, its loader's witness), without the GPU side: what `cluster rehearse` runs.
pub struct Effective {
    pub libtorch: Facts<LibtorchFacts>,
    pub nccl: anyhow::Result<NcclFacts>,
    pub plugins: Facts<Vec<PluginFacts>>,
}

pub fn effective(q: &SelfQuery) -> Effective {
    let libtorch = Facts::from(libtorch_facts(q));
    let (nccl, _, plugins) = effective_nccl(q, libtorch.known());
    Effective {
        libtorch,
        nccl,
        plugins,
    }
}

/// A query's facts from its thread; one that panicked is a failed query, not a report
/// lost.
fn joined<T>(h: std::thread::ScopedJoinHandle<'_, Facts<T>>) -> Facts<T> {
    h.join()
        .unwrap_or_else(|_| Facts::from(Err(anyhow::anyhow!("the query failed"))))
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
    let pip = variant.python_torch(q.process)?;
    let nccl = Facts::from(nccl_of(&lib, pip.as_deref()));
    let bridge = Facts::from(bridge(&lib));
    let python = pip
        .as_deref()
        .and_then(loader::python::Interpreter::of_torch)
        .map(|i| i.program);
    Ok(LibtorchFacts {
        variant: variant.name,
        libtorch_cuda: lib,
        nccl,
        bridge,
        python,
    })
}

/// The NCCL a libtorch brings, and the GPU code of the file that carries it: the loader
/// model's answer without a preload, for a Python process when it is a pip torch.
fn nccl_of(lib: &Path, pip_torch: Option<&Path>) -> anyhow::Result<NcclFacts> {
    let env = LoaderEnv::bundled();
    let python = match pip_torch {
        Some(torch) => {
            loader::python::PythonProcess::model(torch, loader::python::Launch::bundled(), &env)?
        }
        None => None,
    };
    let Some(p) = python else {
        return answer_facts(loader::which_nccl_as(
            lib,
            &env,
            None,
            loader::TargetKind::Library,
        )?);
    };
    if let Some(why) = p.unknown_reason() {
        anyhow::bail!("unknown: {why}");
    }
    answer_facts(loader::which_nccl_as(
        &p.interpreter.site.join("torch/lib/libtorch_cuda.so"),
        &p.loader_env(&env),
        None,
        loader::TargetKind::Library,
    )?)
}

/// How an effective NCCL that is two NCCLs is said.
pub const SPLIT: &str = "two NCCLs in one process";

/// An effective NCCL that is two NCCLs: the error [`answer_facts`] gives, which the
/// report marks as [`HostReport::effective_split`] for status to read as a finding.
#[derive(Debug)]
struct TwoNcclsError(String);

impl std::fmt::Display for TwoNcclsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{SPLIT}: {}", self.0)
    }
}

impl std::error::Error for TwoNcclsError {}

/// A known NCCL as facts; anything else is the reason it is not known.
fn answer_facts(w: loader::Which) -> anyhow::Result<NcclFacts> {
    match w.answer {
        Answer::Nccl { detection } => {
            let linkage = match detection.linkage {
                Linkage::Static => "static",
                Linkage::Dynamic { .. } | Linkage::Opened { .. } => "dynamic",
                Linkage::Preload { .. } => "preload",
            };
            facts_of(&detection.file, linkage)
        }
        Answer::None { reason } => anyhow::bail!("no NCCL: {reason}"),
        Answer::Unknown { reason } => anyhow::bail!("unknown: {reason}"),
        Answer::Split { reason } => Err(TwoNcclsError(reason.to_string()).into()),
    }
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

/// What a rank really runs: the loader model's answer for the libtorch with the worker's
/// `LD_PRELOAD` (relative paths from its checkout, where its ranks start), and, when
/// asked, the host's own loader's: where the two differ, or the model cannot say and the
/// loader can, the loader's answer is the effective NCCL.
fn effective_nccl(
    q: &SelfQuery,
    libtorch: Option<&LibtorchFacts>,
) -> (
    anyhow::Result<NcclFacts>,
    Option<WitnessReport>,
    Facts<Vec<PluginFacts>>,
) {
    let unknown = |why: &str| Facts::Unknown(format!("its effective NCCL is unknown ({why})"));
    let Some(lt) = libtorch else {
        return (
            Err(anyhow::anyhow!(
                "no libtorch, so nothing says which NCCL a rank loads"
            )),
            None,
            unknown("no libtorch"),
        );
    };
    let mut env = LoaderEnv::from_process();
    env.preload = q.ld_preload.clone().unwrap_or_default();
    env.cwd = q.root.clone();
    let set = |name: &str| {
        q.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    if let Some(llp) = set("LD_LIBRARY_PATH") {
        env.ld_library_path = loader::search::split_path_list(&llp);
    }
    // A pip torch's ranks are Python processes: torch's own import may open an NCCL
    // first, from the sys.path of a job started in the checkout (the model's assumption).
    let python = match python_process(q, lt, &set) {
        Ok(p) => p,
        Err(e) => return (Err(e), None, unknown("the Python model failed")),
    };
    let (lib, env) = match &python {
        Some(p) => (
            p.interpreter.site.join("torch/lib/libtorch_cuda.so"),
            p.loader_env(&env),
        ),
        None => (lt.libtorch_cuda.clone(), env),
    };
    let w = match loader::which_nccl_as(&lib, &env, None, loader::TargetKind::Library) {
        Ok(w) => w,
        Err(e) => return (Err(e), None, unknown("the loader model failed")),
    };
    let mut w = w;
    if let Some(why) = python.as_ref().and_then(|p| p.unknown_answer()) {
        w.answer = Answer::Unknown { reason: why };
    }
    // NCCL reads its plugin variables from the ranks' environment: the env: block's,
    // else what this process inherited, as a rank started the same way would.
    let var = |name: &str| {
        set(name).or_else(|| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    };
    let plugins = || match loader::plugins::plugins(&w, &env, &var) {
        Ok(p) => Facts::Known(p.kinds.iter().map(PluginFacts::of).collect()),
        Err(why) => Facts::Unknown(why),
    };
    let skipped: Vec<String> = w
        .link_map
        .skipped_preloads
        .iter()
        .map(|s| format!("'{}' ({})", s.entry, s.reason))
        .collect();
    let preloaded = w
        .link_map
        .objects
        .iter()
        .any(|o| matches!(o.found_by, loader::FoundBy::Preload { .. }));
    let witness = match &python {
        Some(p) if q.python_witness => Some(witnessed_python(&w, p, q)),
        // The loader's trace answers for a program linking the library, not for Python.
        Some(_) if q.witness => Some((
            WitnessReport {
                verdict: "none".into(),
                loader: "a pip torch's ranks are Python processes, whose torch opens libraries itself; the loader's trace answers for a program. `fdl cluster status --python-witness` imports torch on each worker".into(),
                model: None,
                python: false,
            },
            None,
        )),
        Some(_) => None,
        None => q.witness.then(|| witnessed(&w, &env)),
    };
    if q.ld_preload.is_some() && !preloaded {
        // Not one element loads: the ranks run the bundled NCCL, and the env is wrong.
        return (
            Err(anyhow::anyhow!(
                "LD_PRELOAD loads nothing on this host: the loader ignores {}. Ship the build there (`fdl cluster ship`) and paste `fdl cluster env`'s line",
                skipped.join(", ")
            )),
            witness.map(|(r, _)| r),
            unknown("its LD_PRELOAD loads nothing"),
        );
    }
    match witness {
        Some((report, Some(object))) => {
            let same = |o: &Path| {
                use std::os::unix::fs::MetadataExt;
                let id = |p: &Path| {
                    std::fs::metadata(env.cwd.join(p))
                        .ok()
                        .map(|m| (m.dev(), m.ino()))
                };
                id(o).is_some() && id(o) == id(&object)
            };
            let linkage = if same(&lt.libtorch_cuda) {
                "static"
            } else if w
                .link_map
                .objects
                .iter()
                .any(|o| matches!(o.found_by, loader::FoundBy::Preload { .. }) && same(&o.path))
            {
                "preload"
            } else {
                "dynamic"
            };
            // The model searched from its own answer; where the loader's answer is
            // another file, that search says nothing of what the ranks open.
            let modelled = match &w.answer {
                Answer::Nccl { detection } => same(&detection.file),
                _ => false,
            };
            let plugins = if modelled {
                plugins()
            } else {
                Facts::Unknown("the host's loader named another NCCL than fdl's model, so the plugin search from it is not modelled".into())
            };
            (facts_of(&object, linkage), Some(report), plugins)
        }
        Some((report, None)) if report.disagrees() => (
            Err(anyhow::anyhow!(
                "fdl's model is wrong on this host: it says {}, but the loader says {}",
                report.model.as_deref().unwrap_or("?"),
                report.loader
            )),
            Some(report),
            unknown("fdl's model is wrong on this host"),
        ),
        other => {
            let plugins = plugins();
            (answer_facts(w), other.map(|(r, _)| r), plugins)
        }
    }
}

/// The Python process a rank of this worker's variant is, when the variant is a pip torch:
/// started in the checkout, with the env: block's `PYTHONPATH` (else this process's).
fn python_process(
    q: &SelfQuery,
    lt: &LibtorchFacts,
    set: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Option<loader::python::PythonProcess>> {
    let Some(dir) = lt.libtorch_cuda.parent().and_then(Path::parent) else {
        return Ok(None);
    };
    let variant = crate::libtorch::Variant {
        name: lt.variant.clone(),
        dir: dir.to_path_buf(),
    };
    let Some(torch) = variant.python_torch(q.process)? else {
        return Ok(None);
    };
    let mut launch = loader::python::Launch::from_env(Some(q.root.clone()));
    launch.start_assumed = true;
    for (name, value) in [
        ("PYTHONPATH", &mut launch.pythonpath),
        ("PYTHONHOME", &mut launch.pythonhome),
    ] {
        if let Some(v) = set(name) {
            *value = Some(v).filter(|v| !v.is_empty());
        }
    }
    if let Some(v) = set("PYTHONNOUSERSITE") {
        launch.no_user_site = !v.is_empty();
    }
    if let Some(v) = set("PYTHONSAFEPATH") {
        launch.safe_path = !v.is_empty();
    }
    if let Some(v) = set("TORCH_USE_RTLD_GLOBAL") {
        launch.torch_rtld_global = !v.is_empty();
    }
    loader::python::PythonProcess::model(&torch, launch, &LoaderEnv::from_process())
}

/// The Python witness for a pip torch's rank (asked only with `--witness`: it imports
/// torch, seconds and half a gigabyte on every worker): the interpreter run in the
/// checkout with the ranks' environment, and the file its nccl* slots reach.
fn witnessed_python(
    w: &loader::Which,
    p: &loader::python::PythonProcess,
    q: &SelfQuery,
) -> (WitnessReport, Option<PathBuf>) {
    use loader::pywitness;
    let set: Vec<(std::ffi::OsString, std::ffi::OsString)> =
        q.env.iter().map(|(k, v)| (k.into(), v.into())).collect();
    let vars = pywitness::job_env(&set, q.ld_preload.as_deref().map(std::ffi::OsStr::new));
    let launch = pywitness::PythonLaunch {
        interpreter: p.interpreter.program.clone(),
        torch_dir: p.interpreter.site.join("torch"),
        cwd: q.root.clone(),
        env: vars,
    };
    let x = match pywitness::ask_python(&launch, &pywitness::Limits::default()) {
        Ok(x) => x,
        Err(n) => {
            return (
                WitnessReport {
                    verdict: if n.refused() { "refused" } else { "none" }.into(),
                    loader: crate::text::clean(&n.to_string()),
                    model: None,
                    python: true,
                },
                None,
            )
        }
    };
    let loader = crate::text::clean(&x.summary());
    let model = match &w.answer {
        Answer::Nccl { detection } => Some(detection.file.as_path()),
        _ => None,
    };
    let verdict = pywitness::compare(model, &x);
    let report = |model: Option<String>| WitnessReport {
        verdict: verdict.word().into(),
        loader: loader.clone(),
        model,
        python: true,
    };
    match &verdict {
        pywitness::Verdict::Agree { .. } | pywitness::Verdict::Inconclusive => (report(None), None),
        pywitness::Verdict::Disagree { model, process } => (
            report(Some(model.display().to_string())),
            Some(process.clone()),
        ),
        pywitness::Verdict::ModelUnknown { process } => (report(None), Some(process.clone())),
    }
}

/// The host's loader on `w`, and the object its answer names when that answer replaces
/// the model's (a disagreement, or a model that cannot say).
fn witnessed(w: &loader::Which, env: &LoaderEnv) -> (WitnessReport, Option<PathBuf>) {
    use loader::witness::{self, Kind, Verdict};
    let x = match witness::ask(w, env) {
        Ok(x) => x,
        Err(n) => {
            return (
                WitnessReport {
                    verdict: if n.refused { "refused" } else { "none" }.into(),
                    loader: n.reason,
                    model: None,
                    python: false,
                },
                None,
            )
        }
    };
    let stands = x.kind() == Kind::Nccl && x.starts();
    let object = stands.then(|| x.reached[0].object.clone());
    match witness::compare(w, &x) {
        Verdict::Agree { why } => (
            WitnessReport {
                verdict: "agree".into(),
                loader: why,
                model: None,
                python: false,
            },
            None,
        ),
        Verdict::Disagree { model, loader } => (
            WitnessReport {
                verdict: "disagree".into(),
                loader,
                model: Some(model),
                python: false,
            },
            object,
        ),
        Verdict::ModelUnknown { loader } => (
            WitnessReport {
                verdict: "model_unknown".into(),
                loader,
                model: None,
                python: false,
            },
            object,
        ),
        Verdict::Inconclusive { why } => (
            WitnessReport {
                verdict: "inconclusive".into(),
                loader: why,
                model: None,
                python: false,
            },
            None,
        ),
    }
}

fn coverage(gpus: &[Gpu], code: &inspect::GpuCode) -> Vec<GpuCoverage> {
    gpus.iter().map(|g| gpu_coverage(g, code)).collect()
}

fn gpu_coverage(g: &Gpu, code: &inspect::GpuCode) -> GpuCoverage {
    let verdict = inspect::coverage(code, g.compute_cap);
    let (text, covered) = match verdict {
        inspect::Verdict::Native { .. } => (
            format!("native {}", verdict.sass_text().unwrap_or_default()),
            true,
        ),
        inspect::Verdict::PtxJit { ptx } => (format!("ptx {ptx} (JIT)"), true),
        inspect::Verdict::NotCovered => ("none".to_string(), false),
    };
    GpuCoverage {
        index: g.index,
        arch: g.compute_cap.to_string(),
        verdict: text,
        covered,
    }
}

/// What the libtorch's own kernels run on each GPU. Its code lives in `libtorch_cuda.so`
/// or, in a split build (torch 1.x), in the `libtorch_cuda*` libraries it needs beside
/// it; each file that holds GPU code has its own kernels, so a GPU is covered only when
/// every one of them runs there. A libtorch in which no file holds code fdl can read is
/// an error (the verdict is then unknown), never "no code": a false red on a healthy rig
/// is as wrong as a green on a broken one.
fn torch_coverage(gpus: &[Gpu], lib: &Path) -> anyhow::Result<TorchCoverage> {
    let ins = inspect::inspect(lib)?;
    let mut judged = vec![(lib.to_path_buf(), ins.gpu_code.clone())];
    let dir = lib.parent().unwrap_or(Path::new("."));
    let mut unread = Vec::new();
    for needed in ins.needed.iter().filter(|n| n.starts_with("libtorch_cuda")) {
        // A name with a slash is not a sibling; the loader's search is not modelled here.
        if needed.contains('/') {
            continue;
        }
        let path = dir.join(needed);
        match inspect::inspect(&path) {
            Ok(i) => judged.push((path, i.gpu_code)),
            Err(e) => unread.push(format!("{needed}: {e:#}")),
        }
    }
    let has_code = |c: &inspect::GpuCode| !c.sass.is_empty() || !c.ptx.is_empty();
    judged.retain(|(_, code)| has_code(code));
    if judged.is_empty() {
        anyhow::bail!(
            "neither {} nor the torch libraries it loads hold GPU code fdl can read{}, so what runs on each GPU is not known",
            lib.display(),
            if unread.is_empty() {
                String::new()
            } else {
                format!(" ({})", unread.join("; "))
            }
        );
    }
    let files = judged
        .iter()
        .map(|(file, code)| TorchFile {
            file: file.clone(),
            sass: code.sass.iter().map(|e| e.target.to_string()).collect(),
            ptx: code.ptx.iter().map(|e| e.target.ptx_name()).collect(),
        })
        .collect();
    let gpus = gpus
        .iter()
        .map(|g| {
            let per_file: Vec<GpuCoverage> = judged
                .iter()
                .map(|(file, code)| {
                    let mut c = gpu_coverage(g, code);
                    if judged.len() > 1 {
                        let name = file.file_name().unwrap_or_default().to_string_lossy();
                        c.verdict = format!("{name}: {}", c.verdict);
                    }
                    c
                })
                .collect();
            GpuCoverage {
                index: g.index,
                arch: g.compute_cap.to_string(),
                covered: per_file.iter().all(|c| c.covered),
                verdict: per_file
                    .iter()
                    .map(|c| c.verdict.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            }
        })
        .collect();
    Ok(TorchCoverage { files, gpus })
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
