//! GPU architectures (compute capabilities) and what each CUDA release can compile.
//!
//! `Arch` is a compute capability such as 6.1 (`sm_61`). `GpuTarget` adds the
//! arch-specific (`sm_90a`) and family (`sm_100f`) variants that appear in fatbins.
//! The CUDA/arch table lives here and only here, so the plan, the native backend and
//! the coverage verdicts all answer from the same facts.

use crate::version::CudaVersion;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A compute capability, `major.minor`. Displayed as `sm_61`, ordered numerically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arch {
    pub major: u32,
    pub minor: u32,
}

impl Arch {
    pub const fn new(major: u32, minor: u32) -> Self {
        Arch { major, minor }
    }

    /// `sm_120` → 120: the number NVCC and fatbin headers use.
    pub fn number(self) -> u32 {
        self.major * 10 + self.minor
    }

    /// Inverse of [`Arch::number`]; the minor digit is always the last decimal digit.
    pub fn from_number(n: u32) -> Self {
        Arch::new(n / 10, n % 10)
    }

    /// `6.1`
    pub fn capability(self) -> String {
        format!("{}.{}", self.major, self.minor)
    }

    /// `sm61`, the spelling used in build directory names.
    pub fn short(self) -> String {
        format!("sm{}", self.number())
    }

    pub fn is_known(self) -> bool {
        ARCH_TABLE.iter().any(|row| row.arch == self)
    }

    /// The row of the support table for this arch, if it is a known one.
    pub fn support(self) -> Option<&'static ArchSupport> {
        ARCH_TABLE.iter().find(|row| row.arch == self)
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}", self.number())
    }
}

impl Serialize for Arch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Arch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_arch_token(&s).map_err(serde::de::Error::custom)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArchError {
    #[error(
        "malformed architecture '{0}': use a compute capability like 6.1, 61, sm_61 or compute_61"
    )]
    Malformed(String),
    #[error("unknown compute capability '{token}' ({arch}): known ones are {known}")]
    Unknown {
        token: String,
        arch: Arch,
        known: String,
    },
    #[error("no architectures given: pass a list such as --archs \"6.1;12.0\"")]
    Empty,
}

/// Parses one entry: `6.1`, `61`, `120`, `sm_61`, `sm61`, `compute_61`.
/// Rejects capabilities that no GPU has, naming the entry.
pub fn parse_arch_token(token: &str) -> Result<Arch, ArchError> {
    let t = token.trim();
    let malformed = || ArchError::Malformed(t.to_string());
    let lower = t.to_ascii_lowercase();
    let digits = ["compute_", "sm_", "sm"]
        .iter()
        .find_map(|p| lower.strip_prefix(p))
        .unwrap_or(&lower);
    let arch = if let Some((maj, min)) = digits.split_once('.') {
        let ok = |s: &str| !s.is_empty() && s.len() <= 2 && s.bytes().all(|b| b.is_ascii_digit());
        if !ok(maj) || !ok(min) || min.len() != 1 {
            return Err(malformed());
        }
        Arch::new(
            maj.parse().map_err(|_| malformed())?,
            min.parse().map_err(|_| malformed())?,
        )
    } else {
        if digits.len() < 2 || digits.len() > 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(malformed());
        }
        Arch::from_number(digits.parse().map_err(|_| malformed())?)
    };
    if !arch.is_known() {
        return Err(ArchError::Unknown {
            token: t.to_string(),
            arch,
            known: ARCH_TABLE
                .iter()
                .map(|r| r.arch.capability())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    Ok(arch)
}

/// Parses a list separated by `;`, `,` or whitespace, then sorts and deduplicates it.
pub fn parse_arch_list(list: &str) -> Result<Vec<Arch>, ArchError> {
    let mut archs = list
        .split(|c: char| c == ';' || c == ',' || c.is_whitespace())
        .filter(|t| !t.is_empty())
        .map(parse_arch_token)
        .collect::<Result<Vec<_>, _>>()?;
    if archs.is_empty() {
        return Err(ArchError::Empty);
    }
    archs.sort();
    archs.dedup();
    Ok(archs)
}

/// `sm61-sm120`: the arch part of a build's directory name.
pub fn archs_slug(archs: &[Arch]) -> String {
    archs
        .iter()
        .map(|a| a.short())
        .collect::<Vec<_>>()
        .join("-")
}

/// NVCC_GENCODE for SASS of each arch, plus PTX of the highest when `ptx` is set.
pub fn gencode(archs: &[Arch], ptx: bool) -> String {
    let mut parts: Vec<String> = archs
        .iter()
        .map(|a| format!("-gencode=arch=compute_{0},code=sm_{0}", a.number()))
        .collect();
    if let (true, Some(top)) = (ptx, archs.iter().max()) {
        parts.push(format!(
            "-gencode=arch=compute_{0},code=compute_{0}",
            top.number()
        ));
    }
    parts.join(" ")
}

/// What a fatbin entry targets: a plain arch, an arch-specific variant (`sm_90a`, runs on
/// exactly that arch) or a family variant (`sm_100f`, runs on later minors of the major).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GpuTarget {
    pub arch: Arch,
    pub variant: Variant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    Generic,
    /// `a` suffix: arch-specific features, exact arch only.
    Specific,
    /// `f` suffix: family-specific features, same major and a minor at least as high.
    Family,
}

impl GpuTarget {
    pub fn generic(arch: Arch) -> Self {
        GpuTarget {
            arch,
            variant: Variant::Generic,
        }
    }

    /// Whether SASS compiled for this target runs on a GPU of `gpu`'s capability.
    /// CUDA's rule: same major and an equal or higher minor; `a` variants exact only.
    pub fn sass_runs_on(self, gpu: Arch) -> bool {
        match self.variant {
            Variant::Specific => self.arch == gpu,
            Variant::Generic | Variant::Family => {
                self.arch.major == gpu.major && self.arch.minor <= gpu.minor
            }
        }
    }

    /// Whether PTX for this virtual arch can be JIT-compiled for `gpu`: any equal or newer
    /// GPU for plain PTX; variant PTX is bound like its SASS.
    pub fn ptx_runs_on(self, gpu: Arch) -> bool {
        match self.variant {
            Variant::Generic => self.arch <= gpu,
            _ => self.sass_runs_on(gpu),
        }
    }
}

impl fmt::Display for GpuTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let suffix = match self.variant {
            Variant::Generic => "",
            Variant::Specific => "a",
            Variant::Family => "f",
        };
        write!(f, "sm_{}{}", self.arch.number(), suffix)
    }
}

impl Serialize for GpuTarget {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// One row of the support table: which CUDA releases can compile SASS for an arch.
#[derive(Debug, Clone, Copy)]
pub struct ArchSupport {
    pub arch: Arch,
    /// Example GPUs, for messages.
    pub example: &'static str,
    /// First CUDA release whose nvcc targets this arch.
    pub since: (u32, u32),
    /// Last CUDA release whose nvcc still targets it, if support was dropped.
    pub until: Option<(u32, u32)>,
}

const fn row(
    major: u32,
    minor: u32,
    example: &'static str,
    since: (u32, u32),
    until: Option<(u32, u32)>,
) -> ArchSupport {
    ArchSupport {
        arch: Arch::new(major, minor),
        example,
        since,
        until,
    }
}

/// Which CUDA releases compile SASS for which compute capability.
///
/// Sources: the CUDA Toolkit release notes and the CUDA C++ Programming Guide's
/// compute-capability table. Kepler sm_30/32 went in 11.0 and sm_35/37 in 12.0;
/// 12.8 added Blackwell sm_100/101/120; 12.9 added sm_103 and sm_121; 13.0 removed
/// Maxwell, Pascal and Volta (sm_50..sm_72), renamed Thor's sm_101 to sm_110 and added
/// sm_88 (as `nvcc --list-gpu-arch` of 13.0.88 lists it).
pub const ARCH_TABLE: &[ArchSupport] = &[
    row(3, 0, "GTX 680", (6, 0), Some((10, 2))),
    row(3, 2, "Jetson TK1", (6, 0), Some((10, 2))),
    row(3, 5, "Tesla K20/K40", (5, 0), Some((11, 8))),
    row(3, 7, "Tesla K80", (6, 5), Some((11, 8))),
    row(5, 0, "GTX 750", (6, 0), Some((12, 9))),
    row(5, 2, "GTX 980, Titan X", (6, 5), Some((12, 9))),
    row(5, 3, "Jetson Nano", (7, 0), Some((12, 9))),
    row(6, 0, "Tesla P100", (8, 0), Some((12, 9))),
    row(6, 1, "GTX 1060/1080, P40", (8, 0), Some((12, 9))),
    row(6, 2, "Jetson TX2", (8, 0), Some((12, 9))),
    row(7, 0, "Tesla V100", (9, 0), Some((12, 9))),
    row(7, 2, "Jetson Xavier", (10, 0), Some((12, 9))),
    row(7, 5, "RTX 2080, T4", (10, 0), None),
    row(8, 0, "A100", (11, 0), None),
    row(8, 6, "RTX 3090, A40", (11, 1), None),
    row(8, 7, "Jetson Orin", (11, 4), None),
    row(8, 8, "sm_88, first offered by nvcc 13.0", (13, 0), None),
    row(8, 9, "RTX 4090, L40", (11, 8), None),
    row(9, 0, "H100, H200", (11, 8), None),
    row(10, 0, "B200", (12, 8), None),
    row(
        10,
        1,
        "Jetson Thor (pre-13.0 numbering)",
        (12, 8),
        Some((12, 9)),
    ),
    row(10, 3, "B300", (12, 9), None),
    row(11, 0, "Jetson Thor", (13, 0), None),
    row(12, 0, "RTX 5090, RTX 5060 Ti", (12, 8), None),
    row(12, 1, "DGX Spark", (12, 9), None),
];

fn fmt_mm((a, b): (u32, u32)) -> String {
    format!("{a}.{b}")
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("CUDA {cuda} cannot compile {arch} ({example}): {arch} needs {range}. Pick a CUDA version in that range with --cuda, or drop {arch} from --archs")]
pub struct ArchCudaConflict {
    pub arch: Arch,
    pub example: String,
    pub cuda: CudaVersion,
    pub range: String,
}

/// Checks that `cuda` can compile SASS for every arch; the first conflict is returned,
/// naming the arch and a CUDA range that works for it.
pub fn check_archs_for_cuda(archs: &[Arch], cuda: CudaVersion) -> Result<(), ArchCudaConflict> {
    let mm = cuda.major_minor();
    for &arch in archs {
        let Some(s) = arch.support() else { continue };
        let ok = mm >= s.since && s.until.is_none_or(|u| mm <= u);
        if !ok {
            let range = match s.until {
                Some(u) => format!("CUDA {} to {}", fmt_mm(s.since), fmt_mm(u)),
                None => format!("CUDA {} or newer", fmt_mm(s.since)),
            };
            return Err(ArchCudaConflict {
                arch,
                example: s.example.to_string(),
                cuda,
                range,
            });
        }
    }
    Ok(())
}

/// The CUDA release fdl builds with when neither `--cuda` nor the libtorch says one:
/// 12.8 is the oldest release that compiles Blackwell (sm_120) and still compiles Pascal
/// (sm_61), so it serves the mixed rigs fdl is for.
pub const DEFAULT_CUDA: CudaVersion = CudaVersion::new(12, 8);

/// Releases with a published `nvidia/cuda` devel image: `major.minor` → the full version
/// and the Ubuntu the image tag names. Source: the nvidia/cuda image's supported-tags list.
const CUDA_IMAGES: &[((u32, u32), &str, &str)] = &[
    ((11, 8), "11.8.0", "ubuntu22.04"),
    ((12, 0), "12.0.1", "ubuntu22.04"),
    ((12, 1), "12.1.1", "ubuntu22.04"),
    ((12, 2), "12.2.2", "ubuntu22.04"),
    ((12, 3), "12.3.2", "ubuntu22.04"),
    ((12, 4), "12.4.1", "ubuntu22.04"),
    ((12, 5), "12.5.1", "ubuntu22.04"),
    ((12, 6), "12.6.3", "ubuntu22.04"),
    ((12, 8), "12.8.1", "ubuntu22.04"),
    ((12, 9), "12.9.1", "ubuntu22.04"),
    ((13, 0), "13.0.2", "ubuntu24.04"),
    ((13, 1), "13.1.0", "ubuntu24.04"),
];

/// The devel base image for a CUDA release: full version (as the user gave it, else the
/// newest patch we know) and the OS part of the tag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaImage {
    pub cuda_version: String,
    pub os: String,
}

impl CudaImage {
    pub fn reference(&self) -> String {
        format!("nvidia/cuda:{}-devel-{}", self.cuda_version, self.os)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("no nvidia/cuda devel image is known for CUDA {cuda}: known releases are {known}. Pass one of them with --cuda, or bring your own base image with --dockerfile")]
pub struct UnknownCudaImage {
    pub cuda: CudaVersion,
    pub known: String,
}

pub fn cuda_image(cuda: CudaVersion) -> Result<CudaImage, UnknownCudaImage> {
    let found = CUDA_IMAGES
        .iter()
        .find(|(mm, _, _)| *mm == cuda.major_minor());
    match found {
        Some((_, full, os)) => Ok(CudaImage {
            cuda_version: match cuda.patch {
                Some(_) => cuda.to_string(),
                None => full.to_string(),
            },
            os: os.to_string(),
        }),
        None => Err(UnknownCudaImage {
            cuda,
            known: CUDA_IMAGES
                .iter()
                .map(|(mm, _, _)| fmt_mm(*mm))
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_parses_to_the_same_arch() {
        for t in ["6.1", "61", "sm_61", "sm61", "compute_61", "SM_61", " 6.1 "] {
            assert_eq!(parse_arch_token(t).unwrap(), Arch::new(6, 1), "{t}");
        }
        assert_eq!(parse_arch_token("12.0").unwrap(), Arch::new(12, 0));
        assert_eq!(parse_arch_token("sm_120").unwrap(), Arch::new(12, 0));
    }

    #[test]
    fn lists_are_normalized_sorted_and_deduplicated() {
        for list in [
            "6.1;12.0",
            "6.1,12.0",
            "61 120",
            "sm_120;sm61;6.1",
            "compute_120, 61",
        ] {
            let archs = parse_arch_list(list).unwrap();
            assert_eq!(archs, vec![Arch::new(6, 1), Arch::new(12, 0)], "{list}");
        }
    }

    #[test]
    fn malformed_and_unknown_entries_are_named() {
        for bad in ["sm_", "6.", ".1", "x86", "6.1.2", "1234", "6", "sm_6a1"] {
            assert!(
                matches!(parse_arch_token(bad), Err(ArchError::Malformed(ref t)) if t == bad),
                "{bad}: {:?}",
                parse_arch_token(bad)
            );
        }
        let err = parse_arch_list("6.1;9.9").unwrap_err();
        assert!(matches!(err, ArchError::Unknown { ref token, .. } if token == "9.9"));
        assert!(err.to_string().contains("9.9"));
        assert_eq!(parse_arch_list(" ; ,"), Err(ArchError::Empty));
    }

    #[test]
    fn names_and_gencode() {
        let archs = [Arch::new(6, 1), Arch::new(12, 0)];
        assert_eq!(archs_slug(&archs), "sm61-sm120");
        assert_eq!(
            gencode(&archs, false),
            "-gencode=arch=compute_61,code=sm_61 -gencode=arch=compute_120,code=sm_120"
        );
        assert!(gencode(&archs, true).ends_with("-gencode=arch=compute_120,code=compute_120"));
    }

    #[test]
    fn cuda_support_ranges() {
        let mixed = [Arch::new(6, 1), Arch::new(12, 0)];
        assert!(check_archs_for_cuda(&mixed, CudaVersion::new(12, 8)).is_ok());
        let e = check_archs_for_cuda(&mixed, CudaVersion::new(12, 4)).unwrap_err();
        assert_eq!(e.arch, Arch::new(12, 0));
        assert!(e.to_string().contains("CUDA 12.8 or newer"), "{e}");
        let e = check_archs_for_cuda(&mixed, CudaVersion::new(13, 0)).unwrap_err();
        assert_eq!(e.arch, Arch::new(6, 1));
        assert!(e.to_string().contains("CUDA 8.0 to 12.9"), "{e}");
        assert!(check_archs_for_cuda(&[Arch::new(11, 0)], CudaVersion::new(12, 9)).is_err());
        assert!(check_archs_for_cuda(&[Arch::new(10, 1)], CudaVersion::new(13, 0)).is_err());
    }

    #[test]
    fn coverage_rules() {
        let sm86 = GpuTarget::generic(Arch::new(8, 6));
        assert!(sm86.sass_runs_on(Arch::new(8, 9)));
        assert!(!sm86.sass_runs_on(Arch::new(8, 0)));
        assert!(!sm86.sass_runs_on(Arch::new(9, 0)));
        assert!(sm86.ptx_runs_on(Arch::new(12, 0)));
        let sm90a = GpuTarget {
            arch: Arch::new(9, 0),
            variant: Variant::Specific,
        };
        assert!(sm90a.sass_runs_on(Arch::new(9, 0)));
        assert_eq!(sm90a.to_string(), "sm_90a");
        let sm100f = GpuTarget {
            arch: Arch::new(10, 0),
            variant: Variant::Family,
        };
        assert!(sm100f.sass_runs_on(Arch::new(10, 3)));
        assert!(!sm100f.sass_runs_on(Arch::new(12, 0)));
    }

    #[test]
    fn images_for_known_releases() {
        let img = cuda_image(CudaVersion::new(12, 8)).unwrap();
        assert_eq!(img.reference(), "nvidia/cuda:12.8.1-devel-ubuntu22.04");
        let pinned = cuda_image("12.8.0".parse().unwrap()).unwrap();
        assert_eq!(pinned.cuda_version, "12.8.0");
        assert!(cuda_image(CudaVersion::new(12, 7)).is_err());
    }
}
