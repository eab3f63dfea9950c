//! The local GPU inventory, read from `nvidia-smi`'s CSV query interface — the one
//! source that needs no CUDA toolkit and no running CUDA context — and the driver, from
//! its banner, with the one rule for whether a driver runs code of a CUDA version
//! ([`driver_runs`], [`DriverCheck`]), used wherever an NCCL is chosen.

use crate::arch::Arch;
use crate::version::CudaVersion;
use serde::{Deserialize, Serialize};
use std::process::Command;

/// The exact query fdl runs; tests' stand-in `nvidia-smi` answers it.
pub const NVIDIA_SMI_ARGS: &[&str] = &[
    "--query-gpu=index,name,compute_cap,memory.total",
    "--format=csv,noheader,nounits",
];

/// One GPU as nvidia-smi lists it. In JSON (`fdl gpus --json`, a worker's report) its
/// architecture is `arch` in fdl's vocabulary (`"sm_61"`), and `compute_cap` is
/// nvidia-smi's field of that name, as nvidia-smi writes it (`"6.1"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "GpuJson", try_from = "GpuJson")]
pub struct Gpu {
    pub index: u32,
    pub name: String,
    /// nvidia-smi's `compute_cap`, as an architecture.
    pub compute_cap: Arch,
    pub memory_mib: u64,
}

/// [`Gpu`]'s JSON form. Read back (a worker's report), `arch` is the fact and
/// `compute_cap` must agree with it when present.
#[derive(Serialize, Deserialize)]
struct GpuJson {
    index: u32,
    name: String,
    arch: Arch,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    compute_cap: Option<String>,
    memory_mib: u64,
}

impl From<Gpu> for GpuJson {
    fn from(g: Gpu) -> Self {
        GpuJson {
            index: g.index,
            name: g.name,
            arch: g.compute_cap,
            compute_cap: Some(g.compute_cap.capability()),
            memory_mib: g.memory_mib,
        }
    }
}

impl TryFrom<GpuJson> for Gpu {
    type Error = String;
    fn try_from(g: GpuJson) -> Result<Self, String> {
        if let Some(cap) = &g.compute_cap {
            if *cap != g.arch.capability() {
                return Err(format!(
                    "GPU {}: compute_cap {:?} is not its arch {}",
                    g.index, cap, g.arch
                ));
            }
        }
        Ok(Gpu {
            index: g.index,
            name: g.name,
            compute_cap: g.arch,
            memory_mib: g.memory_mib,
        })
    }
}

/// nvidia-smi answers in well under a second; a driver that hangs it must not hang fdl.
pub const NVIDIA_SMI_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("nvidia-smi did not answer within {0} s and was stopped: the NVIDIA driver may be hung. Check `nvidia-smi` by hand")]
    Hung(u64),
    #[error("nvidia-smi was not found on PATH, so the local GPUs cannot be read. Install the NVIDIA driver")]
    NoNvidiaSmi,
    #[error(
        "nvidia-smi failed ({status}): {}. Check the NVIDIA driver",
        sentence(stderr)
    )]
    Failed { status: String, stderr: String },
    /// A driver older than R510: its nvidia-smi has no `compute_cap` field, so it cannot
    /// say which architecture a GPU is. The build commands' way round is `--archs`.
    #[error("{} does not report the GPUs' compute capability (nvidia-smi has it from driver R510 on), so their architectures are unknown. Update the driver", driver.as_deref().map(|v| format!("NVIDIA driver {}", crate::text::clean(v))).unwrap_or_else(|| "this NVIDIA driver".into()))]
    NoComputeCap { driver: Option<String> },
    #[error("nvidia-smi lists no GPU")]
    NoGpu,
    #[error("cannot parse nvidia-smi output line {line_no}: '{line}' ({why})")]
    Unparsable {
        line_no: usize,
        line: String,
        why: String,
    },
}

/// Text quoted inside one of fdl's sentences: one line, without the full stop that
/// fdl's own sentence ends with (nvidia-smi's messages end with one).
/// At most [`QUOTED`] characters of it: the answer of a broken tool can be long.
fn sentence(text: &str) -> String {
    let one = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let one = one.trim_end_matches('.');
    if one.chars().count() <= QUOTED {
        return crate::text::clean(one);
    }
    let cut: String = one.chars().take(QUOTED).collect();
    format!("{}…", crate::text::clean(cut.trim_end()))
}

const QUOTED: usize = 300;

/// Whether nvidia-smi's answer says it has no `compute_cap` field, as the nvidia-smi of
/// a driver older than R510 does: `Field "compute_cap" is not a valid field to query.`
fn lacks_compute_cap(answer: &str) -> bool {
    answer.contains("\"compute_cap\"") && answer.contains("not a valid field")
}

/// What a command that takes `--archs` adds to a [`GpuError`]: the way around it.
pub const ARCHS_HINT: &str =
    "name the architectures yourself with --archs, e.g. --archs \"6.1;12.0\"";

/// Runs `nvidia-smi` from PATH with `args`, within [`NVIDIA_SMI_TIMEOUT`].
fn run_nvidia_smi(args: &[&str]) -> Result<std::process::Output, GpuError> {
    let mut cmd = Command::new("nvidia-smi");
    cmd.args(args);
    match crate::process::query_within(&mut cmd, NVIDIA_SMI_TIMEOUT) {
        Ok(Some(out)) => Ok(out),
        Ok(None) => Err(GpuError::Hung(NVIDIA_SMI_TIMEOUT.as_secs())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(GpuError::NoNvidiaSmi),
        Err(e) => Err(GpuError::Failed {
            status: "could not start".into(),
            stderr: e.to_string(),
        }),
    }
}

/// Runs `nvidia-smi` from PATH and parses its answer.
pub fn query() -> Result<Vec<Gpu>, GpuError> {
    let out = run_nvidia_smi(NVIDIA_SMI_ARGS)?;
    if !out.status.success() {
        // nvidia-smi writes its errors to stdout; stderr is read first in case it moves.
        let text = String::from_utf8_lossy(if out.stderr.is_empty() {
            &out.stdout
        } else {
            &out.stderr
        });
        if lacks_compute_cap(&text) {
            return Err(GpuError::NoComputeCap {
                driver: driver().ok().map(|d| d.version),
            });
        }
        return Err(GpuError::Failed {
            status: out.status.to_string(),
            stderr: text.trim().to_string(),
        });
    }
    parse(&String::from_utf8_lossy(&out.stdout))
}

/// The driver, as the banner of a plain `nvidia-smi` states it: its version and the
/// newest CUDA it runs ("CUDA Version: 12.8"). Read from the banner, not a table of
/// driver branches, so a driver newer than fdl still answers for itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Driver {
    pub version: String,
    pub cuda: Option<CudaVersion>,
}

/// Runs plain `nvidia-smi` and reads its banner.
pub fn driver() -> Result<Driver, GpuError> {
    let out = run_nvidia_smi(&[])?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_banner(&text).ok_or_else(|| GpuError::Failed {
        status: out.status.to_string(),
        stderr: format!(
            "its banner names no driver version: {}",
            text.lines().next().unwrap_or("(no output)")
        ),
    })
}

/// Whether a driver that runs CUDA up to `driver` runs code built with CUDA `built`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverFit {
    Yes,
    /// Same major, older minor: CUDA's minor-version compatibility runs it.
    MinorCompat,
    No,
}

/// The one rule for "is this driver new enough", used wherever an NCCL is chosen
/// (`cluster status`, a build's plan, `nccl verify`, the default build): the driver's
/// own CUDA against the CUDA the code was built with, never a table of driver versions.
pub fn driver_runs(driver: CudaVersion, built: CudaVersion) -> DriverFit {
    if driver.major_minor() >= built.major_minor() {
        DriverFit::Yes
    } else if driver.major == built.major {
        DriverFit::MinorCompat
    } else {
        DriverFit::No
    }
}

/// [`driver_runs`] for this host's driver as `nvidia-smi` states it, in words. A host
/// without a readable driver (a login node, CI) gets `Unknown`: the check could not be
/// made, which is never a finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverCheck {
    Runs(String),
    MinorCompat(String),
    TooOld(String),
    Unknown(String),
}

impl DriverCheck {
    /// `host` names whose driver it is ("this host", a worker), `what` the code ("the
    /// plan", "build v2.28.9-sm120"), `built` its CUDA.
    pub fn of<E: std::fmt::Display>(
        host: &str,
        driver: &Result<Driver, E>,
        built: CudaVersion,
        what: &str,
    ) -> DriverCheck {
        let d = match driver {
            Ok(d) => d,
            Err(e) => {
                return DriverCheck::Unknown(format!(
                "{host}'s driver could not be checked against the CUDA {built} {what} needs: {e}"
            ))
            }
        };
        let Some(runs) = d.cuda else {
            return DriverCheck::Unknown(format!(
                "nvidia-smi names no CUDA version for {host}'s driver {}, so it could not be checked against the CUDA {built} {what} needs",
                d.version
            ));
        };
        match driver_runs(runs, built) {
            DriverFit::Yes => DriverCheck::Runs(format!(
                "driver {} (CUDA {runs}) runs the CUDA {built} {what} needs",
                d.version
            )),
            DriverFit::MinorCompat => DriverCheck::MinorCompat(format!(
                "driver {} (CUDA {runs}) runs the CUDA {built} {what} needs by minor-version compatibility",
                d.version
            )),
            DriverFit::No => DriverCheck::TooOld(format!(
                "{host}'s driver {} runs CUDA up to {runs}, but {what} needs CUDA {built}: update the driver",
                d.version
            )),
        }
    }

    pub fn text(&self) -> &str {
        match self {
            DriverCheck::Runs(s)
            | DriverCheck::MinorCompat(s)
            | DriverCheck::TooOld(s)
            | DriverCheck::Unknown(s) => s,
        }
    }

    pub fn too_old(&self) -> bool {
        matches!(self, DriverCheck::TooOld(_))
    }
}

/// `| NVIDIA-SMI 570.133.07   Driver Version: 570.133.07   CUDA Version: 12.8 |`
pub fn parse_banner(text: &str) -> Option<Driver> {
    let value = |key: &str| {
        text.lines().find_map(|l| {
            let (_, rest) = l.split_once(key)?;
            rest.split_whitespace()
                .next()
                .map(|v| v.trim_end_matches('|').to_string())
        })
    };
    let version = value("Driver Version:").filter(|v| !v.is_empty())?;
    let cuda = value("CUDA Version:").and_then(|v| v.parse().ok());
    Some(Driver { version, cuda })
}

/// Parses `index, name, compute_cap, memory.total` lines. Names may hold commas, so the
/// index is read from the front and the capability and memory from the back.
pub fn parse(csv: &str) -> Result<Vec<Gpu>, GpuError> {
    let mut gpus = Vec::new();
    for (i, raw) in csv.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let bad = |why: &str| GpuError::Unparsable {
            line_no: i + 1,
            line: line.to_string(),
            why: why.to_string(),
        };
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() < 4 {
            return Err(bad("expected 4 comma-separated fields"));
        }
        let index = fields[0]
            .parse()
            .map_err(|_| bad("index is not a number"))?;
        let n = fields.len();
        // A driver's name string reaches terminals and JSON: control characters (an ANSI
        // escape, say) are shown as U+FFFD, never passed through.
        let name: String = fields[1..n - 2]
            .join(",")
            .chars()
            .map(|c| if c.is_control() { '\u{fffd}' } else { c })
            .collect();
        let cap = fields[n - 2];
        let compute_cap = match cap.split_once('.') {
            Some((maj, min)) => match (maj.parse(), min.parse::<u32>()) {
                (Ok(maj), Ok(min)) if min < 10 => Arch::new(maj, min),
                _ => return Err(bad("compute capability is not MAJOR.MINOR")),
            },
            None if cap.contains("N/A") => {
                return Err(bad(
                    "the driver does not report compute_cap (it is too old)",
                ))
            }
            None => return Err(bad("compute capability is not MAJOR.MINOR")),
        };
        let memory_mib = fields[n - 1]
            .parse()
            .map_err(|_| bad("memory.total is not a number of MiB"))?;
        gpus.push(Gpu {
            index,
            name,
            compute_cap,
            memory_mib,
        });
    }
    if gpus.is_empty() {
        return Err(GpuError::NoGpu);
    }
    Ok(gpus)
}

/// The distinct capabilities of `gpus`, sorted.
pub fn distinct_archs(gpus: &[Gpu]) -> Vec<Arch> {
    let mut archs: Vec<Arch> = gpus.iter().map(|g| g.compute_cap).collect();
    archs.sort();
    archs.dedup();
    archs
}

/// A plain-text table of `gpus`, for terminals.
pub fn table(gpus: &[Gpu]) -> String {
    let width = gpus.iter().map(|g| g.name.len()).max().unwrap_or(4).max(4);
    let mut s = format!(
        "{:<5} {:<width$} {:<7} {:>8}\n",
        "GPU", "NAME", "ARCH", "MEMORY"
    );
    for g in gpus {
        s.push_str(&format!(
            "{:<5} {:<width$} {:<7} {:>5} MiB\n",
            g.index,
            g.name,
            g.compute_cap.to_string(),
            g.memory_mib
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_banner_names_the_driver_and_its_cuda() {
        let banner = "Mon Nov 30 05:48:03 2026\n\
+-----------------------------------------------------------------------------------------+\n\
| NVIDIA-SMI 580.142                Driver Version: 580.142        CUDA Version: 13.0     |\n\
|-----------------------------------------+------------------------+----------------------+\n";
        let d = parse_banner(banner).unwrap();
        assert_eq!(d.version, "580.142");
        assert_eq!(d.cuda.unwrap().to_string(), "13.0");
        // A CUDA fdl has never seen is read, not looked up.
        let d = parse_banner("| Driver Version: 999.1   CUDA Version: 14.7 |").unwrap();
        assert_eq!(d.cuda.unwrap().to_string(), "14.7");
        assert!(parse_banner("No devices were found").is_none());
    }

    #[test]
    fn mixed_rig_parses() {
        let csv = "0, NVIDIA GeForce GTX 1060 6GB, 6.1, 6144\n1, NVIDIA GeForce RTX 5060 Ti, 12.0, 16311\n";
        let gpus = parse(csv).unwrap();
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[1].compute_cap, Arch::new(12, 0));
        assert_eq!(gpus[1].memory_mib, 16311);
        assert_eq!(
            distinct_archs(&gpus),
            vec![Arch::new(6, 1), Arch::new(12, 0)]
        );
    }

    #[test]
    fn names_with_commas_and_bad_lines() {
        let gpus = parse("3, Odd, Name, 8.6, 24576").unwrap();
        assert_eq!(gpus[0].name, "Odd,Name");
        assert!(matches!(parse(""), Err(GpuError::NoGpu)));
        assert!(matches!(
            parse("garbage"),
            Err(GpuError::Unparsable { line_no: 1, .. })
        ));
        assert!(matches!(
            parse("0, X, [N/A], 100"),
            Err(GpuError::Unparsable { .. })
        ));
    }

    /// nvidia-smi's own sentence is quoted inside fdl's without its full stop, on one
    /// line, bounded; an old driver's refusal of compute_cap is recognised.
    #[test]
    fn quoted_failures_end_one_sentence() {
        let e = GpuError::Failed {
            status: "exit status: 9".into(),
            stderr: "NVIDIA-SMI has failed because it couldn't communicate.\n\n".into(),
        }
        .to_string();
        assert!(
            e.ends_with("couldn't communicate. Check the NVIDIA driver"),
            "{e}"
        );
        let long = GpuError::Failed {
            status: "x".into(),
            stderr: "y".repeat(100_000),
        }
        .to_string();
        assert!(long.len() < 400, "{}", long.len());
        assert!(lacks_compute_cap(
            "Field \"compute_cap\" is not a valid field to query.\n\n"
        ));
        assert!(!lacks_compute_cap(
            "Field \"clocks.max.sm\" is not a valid field to query."
        ));
    }

    /// JSON names the architecture `arch` ("sm_61") and keeps nvidia-smi's `compute_cap`
    /// as nvidia-smi writes it ("6.1"); a worker's report reads back to the same GPU.
    #[test]
    fn json_says_arch_and_nvidia_smis_compute_cap() {
        let g = parse("0, NVIDIA GeForce GTX 1060 6GB, 6.1, 6144")
            .unwrap()
            .remove(0);
        let v = serde_json::to_value(&g).unwrap();
        assert_eq!(v["arch"], "sm_61");
        assert_eq!(v["compute_cap"], "6.1");
        assert_eq!(serde_json::from_value::<Gpu>(v.clone()).unwrap(), g);
        let mut odd = v;
        odd["compute_cap"] = "8.6".into();
        assert!(serde_json::from_value::<Gpu>(odd).is_err());
    }

    /// Open world: a capability no table knows yet is a GPU like any other; a name's
    /// terminal escapes never reach the terminal.
    #[test]
    fn new_archs_and_hostile_names() {
        let gpus = parse("0, NVIDIA Future \x1b[31mRED\x1b[0m, 13.0, 98304\n").unwrap();
        assert_eq!(gpus[0].compute_cap, Arch::new(13, 0));
        assert!(!gpus[0].name.contains('\x1b'), "{:?}", gpus[0].name);
        assert!(gpus[0].name.contains("RED"));
    }
}
