//! Which build a wiring command means when it is given no name (`fdl nccl env`,
//! `fdl cluster env`, `fdl cluster ship`): one whose NCCL is the active libtorch's (NCCL
//! refuses a communicator across versions), whose code runs on every GPU it is for (this
//! host's, or every worker's) and whose CUDA every driver there runs. The newest such
//! build is taken; when none fits, the choice is refused with the closest build, what it
//! lacks and the build command that would fit. Coverage is read from each build's
//! library (its fatbin), never from its name or plan; drivers by [`DriverCheck`], the
//! rule of every NCCL choice. What cannot be read (no `nvidia-smi`, a silent worker) is
//! a warning that the check was not made, never a reason to refuse. A build *named* of
//! another release than the active libtorch's is taken as asked, with [`OtherRelease`]:
//! the functions the libtorch imports that it lacks (what `nccl build` also says of a
//! build it made).
//!
//! The facts are handed in ([`Host`]): the CLI reads this host's, `cluster` its workers'.

use crate::arch::Arch;
use crate::gpu::{Driver, DriverCheck};
use crate::inspect::{self, GpuCode, Verdict};
use crate::libtorch::Libtorch;
use crate::nccl::store::{BuildName, BuildStore, Entry, Existing, Manifest};
use crate::project::Project;
use crate::version::NcclVersion;
use anyhow::{bail, Result};
use serde::Serialize;

/// Which command asks for a build, so that its hints name the commands that fix things
/// in its own world: `fdl nccl build` for one host, `fdl cluster build` for a cluster.
pub struct Wiring {
    /// Makes a build: `fdl nccl build`.
    pub make: &'static str,
    /// This command, to be given a build's name: `fdl nccl env`.
    pub this: &'static str,
}

impl Wiring {
    pub const NCCL_ENV: Wiring = Wiring {
        make: "fdl nccl build",
        this: "fdl nccl env",
    };
    /// `fdl launch` runs a job with the build `fdl nccl env` would wire.
    pub const LAUNCH: Wiring = Wiring {
        make: "fdl nccl build",
        this: "fdl launch --build",
    };
}

/// One host the build is for: its name as messages say it ("this host", a worker), its
/// GPUs' capabilities and its driver, or why they are not known.
pub struct Host {
    pub name: String,
    pub gpus: std::result::Result<Vec<Arch>, String>,
    pub driver: std::result::Result<Driver, String>,
}

/// The build chosen, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Choice {
    pub build: String,
    /// `named` (given by the user) or `default` (chosen here).
    pub by: &'static str,
    pub reason: String,
    /// Checks that could not be made (no GPUs or driver readable), and PTX-only GPUs.
    pub warnings: Vec<String>,
    /// A named build of another NCCL release than the active libtorch's.
    pub other_release: Option<OtherRelease>,
    #[serde(skip)]
    pub manifest: Manifest,
}

/// The build a wiring command is about: the one named, else the default (see the module
/// docs); `hosts` is asked only for a default.
pub fn pick(
    project: &Project,
    store: &BuildStore,
    build: Option<&str>,
    wiring: &Wiring,
    hosts: &dyn Fn() -> Vec<Host>,
) -> Result<Choice> {
    match build {
        Some(name) => {
            BuildName::parse(name)?;
            match store.existing(name)? {
                Some(Existing::Build(m)) => Ok(Choice {
                    build: name.to_string(),
                    by: "named",
                    reason: "named".into(),
                    warnings: Vec::new(),
                    other_release: other_release(
                        project,
                        Some(&store.path_of(name).join("lib").join(&m.checked.library)),
                        &m.checked.header_version,
                    ),
                    manifest: *m,
                }),
                Some(Existing::Unreadable(why)) => bail!(
                    "the manifest of build '{name}' cannot be read ({why}); rebuild it with `{} --force`",
                    wiring.make
                ),
                Some(Existing::NotABuild(why)) => bail!(
                    "{} is not an fdl build ({why})",
                    store.path_of(name).display()
                ),
                None => bail!("no build named '{name}'. {}", builds_hint(store, wiring)?),
            }
        }
        None => default_build(project, store, wiring, &hosts()),
    }
}

/// An NCCL of another release than the active libtorch's: preloaded into the libtorch's
/// processes, it replaces that NCCL in every one of them, and NCCL refuses a
/// communicator whose ranks run different versions (patch included).
#[derive(Debug, Clone, Serialize)]
pub struct OtherRelease {
    /// The active libtorch variant.
    pub libtorch: String,
    /// The NCCL it brings.
    pub libtorch_nccl: NcclVersion,
    /// The build's (or the `--tag`'s) NCCL.
    pub nccl: NcclVersion,
    /// The `nccl*` functions the libtorch imports that the build does not export
    /// (loading the libtorch with it preloaded fails on the first: `undefined symbol`);
    /// `None` when there is no library to read yet (a plan).
    pub lacking: Option<Vec<String>>,
    /// The tag that builds the libtorch's release.
    pub matching_tag: String,
}

impl std::fmt::Display for OtherRelease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let release = |v: &NcclVersion| format!("{}.{}.{}", v.major, v.minor, v.patch);
        let (nccl, theirs) = (release(&self.nccl), release(&self.libtorch_nccl));
        write!(
            f,
            "NCCL {nccl} is not the active libtorch's ({}: NCCL {theirs}): preloaded, it replaces that NCCL in every process, and NCCL refuses a communicator whose ranks run different versions (patch included)",
            crate::text::clean(&self.libtorch)
        )?;
        match self.lacking.as_deref() {
            Some([]) => {}
            Some(names) => {
                const SHOWN: usize = 4;
                let mut list = names[..names.len().min(SHOWN)].join(", ");
                if names.len() > SHOWN {
                    list.push_str(&format!(" and {} more", names.len() - SHOWN));
                }
                write!(
                    f,
                    "; it lacks {} function(s) the libtorch calls ({list}): loading the libtorch with it fails (`undefined symbol`)",
                    names.len()
                )?;
            }
            None => write!(f, "; the libtorch may call functions NCCL {nccl} lacks")?,
        }
        write!(f, ". To match it, build --tag {}", self.matching_tag)
    }
}

/// [`OtherRelease`] when `nccl` is another release than the active libtorch's NCCL;
/// `lib` is the build's library, read for the functions it lacks. `None` when they match,
/// or when there is no active libtorch or its NCCL is not known (nothing to compare).
pub fn other_release(
    project: &Project,
    lib: Option<&std::path::Path>,
    nccl: &NcclVersion,
) -> Option<OtherRelease> {
    let variant = Libtorch::new(project.libtorch_dir()).active().ok()?;
    let caller = variant.libtorch_cuda();
    let theirs = crate::loader::bundled_nccl_for(
        &caller,
        variant.pip_torch().as_deref(),
        &crate::loader::LoaderEnv::bundled(),
    )
    .ok()?
    .version()?
    .clone();
    if nccl.same_release(&theirs) {
        return None;
    }
    // Unread (either file) is not known, never "lacks every function".
    let lacking = lib.and_then(|lib| {
        let imported = inspect::interpose::imported_nccl(&caller).ok()?;
        let names: Vec<&str> = imported.iter().map(String::as_str).collect();
        let exported = inspect::interpose::exported_among(lib, &names).ok()?;
        Some(
            imported
                .into_iter()
                .filter(|n| !exported.contains(n))
                .map(|n| crate::text::clean(&n))
                .collect(),
        )
    });
    Some(OtherRelease {
        libtorch: variant.name,
        matching_tag: crate::nccl::tag::Tag::for_release(&theirs)
            .as_str()
            .to_string(),
        libtorch_nccl: theirs,
        nccl: nccl.clone(),
        lacking,
    })
}

/// The builds there are, as `name (NCCL x.y.z)`.
fn candidates(store: &BuildStore) -> Result<Vec<String>> {
    Ok(store
        .list()?
        .into_iter()
        .filter_map(|e| match e {
            Entry::Build { name, manifest, .. } => {
                Some(format!("{name} (NCCL {})", manifest.checked.header_version))
            }
            _ => None,
        })
        .collect())
}

/// What to say about the builds there are: their names, or that there are none yet.
fn builds_hint(store: &BuildStore, wiring: &Wiring) -> Result<String> {
    let names = candidates(store)?;
    Ok(if names.is_empty() {
        format!("There are no builds yet: make one with `{}`", wiring.make)
    } else {
        format!("Builds: {}", names.join(", "))
    })
}

/// A build, its library's GPU code (or why it cannot be read), and what it lacks.
struct Judged {
    name: String,
    manifest: Manifest,
    lacks: Vec<String>,
    /// The archs it has no code for, for the command that would cover them.
    uncovered: Vec<Arch>,
    /// The oldest CUDA a driver it is for runs, when one cannot run this build.
    driver_cuda: Option<crate::version::CudaVersion>,
    notes: Vec<String>,
}

fn judge(name: &str, manifest: &Manifest, code: &Result<GpuCode>, hosts: &[Host]) -> Judged {
    let mut j = Judged {
        name: name.to_string(),
        manifest: manifest.clone(),
        lacks: Vec::new(),
        uncovered: Vec::new(),
        driver_cuda: None,
        notes: Vec::new(),
    };
    for h in hosts {
        // The GPUs and the driver unreadable for one reason (no nvidia-smi): one sentence
        // says both, and the driver's own check below is left unsaid.
        let said = matches!((&h.gpus, &h.driver), (Err(g), Err(d)) if g == d);
        match (&h.gpus, code) {
            (Ok(archs), Ok(code)) => {
                for &a in archs {
                    match inspect::coverage(code, a) {
                        Verdict::Native { .. } => {}
                        Verdict::PtxJit { ptx } => j.notes.push(format!(
                            "{name} runs on {}'s {a} only by PTX JIT ({}): slow first start",
                            h.name,
                            ptx.ptx_name()
                        )),
                        Verdict::NotCovered => {
                            j.lacks.push(format!("code for {}'s {a}", h.name));
                            if !j.uncovered.contains(&a) {
                                j.uncovered.push(a);
                            }
                        }
                    }
                }
            }
            (Err(why), _) if said => j.notes.push(format!(
                "whether {name} has code for {host}'s GPUs, and whether {host}'s driver runs its CUDA {}, were not checked: {why}",
                manifest.plan.cuda,
                host = h.name
            )),
            (Err(why), _) => j.notes.push(format!(
                "whether {name} has code for {}'s GPUs was not checked: {why}",
                h.name
            )),
            (_, Err(e)) => j.lacks.push(format!("a readable library ({e:#})")),
        }
        let built = manifest.plan.cuda;
        match DriverCheck::of(&h.name, &h.driver, built, &format!("build {name}")) {
            DriverCheck::Runs(_) => {}
            DriverCheck::Unknown(_) if said => {}
            // The sentence names the host.
            DriverCheck::Unknown(why) => j.notes.push(why),
            DriverCheck::MinorCompat(why) => j.notes.push(format!("{}: {why}", h.name)),
            DriverCheck::TooOld(why) => {
                j.lacks
                    .push(format!("a driver on {} that runs it ({why})", h.name));
                if let Ok(Driver {
                    cuda: Some(runs), ..
                }) = &h.driver
                {
                    if j.driver_cuda
                        .is_none_or(|c| runs.major_minor() < c.major_minor())
                    {
                        j.driver_cuda = Some(*runs);
                    }
                }
            }
        }
    }
    // A library that cannot be read is named once, not per host.
    j.lacks.dedup();
    j
}

/// The archs of every host's GPUs, sorted, for the build command that covers them.
fn all_archs(hosts: &[Host]) -> Vec<Arch> {
    let mut archs: Vec<Arch> = hosts
        .iter()
        .filter_map(|h| h.gpus.as_ref().ok())
        .flatten()
        .copied()
        .collect();
    archs.sort();
    archs.dedup();
    archs
}

fn hosts_words(hosts: &[Host]) -> String {
    match hosts {
        [one] => format!("{}'s GPUs", one.name),
        _ => "every worker's GPUs".to_string(),
    }
}

/// The newest full build whose NCCL version is the active libtorch's and which runs on
/// every host's GPUs and drivers.
fn default_build(
    project: &Project,
    store: &BuildStore,
    wiring: &Wiring,
    hosts: &[Host],
) -> Result<Choice> {
    let builds: Vec<(String, Manifest)> = store
        .list()?
        .into_iter()
        .filter_map(|e| match e {
            Entry::Build { name, manifest, .. } if manifest.plan.only_funcs.is_none() => {
                Some((name, *manifest))
            }
            _ => None,
        })
        .collect();
    let lt = Libtorch::new(project.libtorch_dir());
    let active = lt.active();
    let wanted: Option<(String, NcclVersion)> = active.as_ref().ok().cloned().and_then(|v| {
        let lib = v.libtorch_cuda();
        // The NCCL it brings (static, pip-style, or pinned): the same answer as `fdl nccl
        // detect` without a preload.
        crate::loader::bundled_nccl_for(
            &lib,
            v.pip_torch().as_deref(),
            &crate::loader::LoaderEnv::bundled(),
        )
        .ok()
        .and_then(|b| b.version().cloned())
        .map(|version| (v.name, version))
    });
    let (matching, nccl_words): (Vec<&(String, Manifest)>, String) = match &wanted {
        Some((variant, version)) => {
            let same = |m: &Manifest| m.checked.header_version.same_release(version);
            let matching: Vec<_> = builds.iter().filter(|(_, m)| same(m)).collect();
            if matching.is_empty() {
                if builds.is_empty() {
                    bail!(
                        "no build matches the active libtorch {variant} (NCCL {version}): there are no builds yet. Make one with `{}`",
                        wiring.make
                    );
                }
                bail!(
                    "no build matches the active libtorch {variant} (NCCL {version}): make one with `{}`, or name one (`{} BUILD`). {}",
                    wiring.make,
                    wiring.this,
                    builds_hint(store, wiring)?
                );
            }
            (matching, format!("matching {variant}'s NCCL {version}"))
        }
        None => match builds.as_slice() {
            [only] => (vec![only], "the only build".to_string()),
            _ => {
                let why = match &active {
                    // No libtorch to match: say that, not that its NCCL is unknown.
                    Err(e) => format!("there is no active libtorch to match ({e:#})"),
                    Ok(v) => format!(
                        "the NCCL version of the active libtorch {} is unknown (`fdl nccl detect` says why)",
                        v.name
                    ),
                };
                let name_one = if builds.is_empty() {
                    String::new()
                } else {
                    format!(". Name one: `{} BUILD`", wiring.this)
                };
                bail!(
                    "cannot choose a build: {why}. {}{name_one}",
                    builds_hint(store, wiring)?
                )
            }
        },
    };
    let judged: Vec<Judged> = matching
        .iter()
        .map(|(name, m)| {
            let lib = store.path_of(name).join("lib").join(&m.checked.library);
            let code = inspect::inspect(&lib).map(|i| i.gpu_code);
            judge(name, m, &code, hosts)
        })
        .collect();
    // `built_at` counts whole seconds: two builds sealed in one second are told apart by
    // when their manifests were written (to the nanosecond), then by name, so the choice
    // never rests on the order the directory lists them in.
    let sealed = |j: &Judged| {
        std::fs::symlink_metadata(store.path_of(&j.name).join(crate::nccl::store::MANIFEST))
            .and_then(|m| m.modified())
            .ok()
    };
    let newest = |a: &&Judged, b: &&Judged| {
        (a.manifest.built_at.as_str(), sealed(a), b.name.as_str()).cmp(&(
            b.manifest.built_at.as_str(),
            sealed(b),
            a.name.as_str(),
        ))
    };
    if let Some(best) = judged.iter().filter(|j| j.lacks.is_empty()).max_by(newest) {
        let archs = all_archs(hosts);
        let covers = if archs.is_empty() {
            String::new()
        } else {
            format!(
                ", with code for {} ({})",
                hosts_words(hosts),
                archs
                    .iter()
                    .map(|a| a.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            )
        };
        let newest_words = if nccl_words == "the only build" {
            nccl_words
        } else {
            format!("newest build {nccl_words}")
        };
        return Ok(Choice {
            build: best.name.clone(),
            by: "default",
            reason: format!("{newest_words}{covers}"),
            warnings: best.notes.clone(),
            // Chosen for matching it.
            other_release: None,
            manifest: best.manifest.clone(),
        });
    }
    // None fits: the closest is the one that lacks least (the newest among equals).
    let closest = judged
        .iter()
        .min_by(|a, b| a.lacks.len().cmp(&b.lacks.len()).then(newest(b, a)))
        .expect("matching builds are not empty");
    let mut command = wiring.make.to_string();
    let archs = all_archs(hosts);
    if !closest.uncovered.is_empty() && !archs.is_empty() {
        command.push_str(&format!(
            " --archs \"{}\"",
            archs
                .iter()
                .map(|a| a.capability())
                .collect::<Vec<_>>()
                .join(";")
        ));
    }
    if let Some(cuda) = closest.driver_cuda {
        command.push_str(&format!(" --cuda {cuda}"));
    }
    bail!(
        "no build {nccl_words} runs on {}: the closest, {}, lacks {}. Build one that does with `{command}`, or name a build (`{} BUILD`)",
        hosts_words(hosts),
        closest.name,
        closest.lacks.join(", "),
        wiring.this
    )
}
