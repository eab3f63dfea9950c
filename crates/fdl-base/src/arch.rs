//! GPU architectures (compute capabilities) and what each CUDA release can compile.
//!
//! `Arch` is a compute capability such as 6.1 (`sm_61`). `GpuTarget` adds the
//! arch-specific (`sm_90a`) and family (`sm_100f`) variants that appear in fatbins.
//!
//! Reading is open-world: any well-formed `sm_XY` is an arch, whatever fdl's tables say,
//! because newer toolkits, drivers and libraries write archs fdl has never seen (nvcc 13.5
//! brought sm_107). The CUDA/arch table below only *judges requests*: which CUDA can
//! compile an arch. The `nvidia/cuda` image table that builds on it is `nccl::image`.

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

    /// The row of the support table for this arch, if the table knows it.
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
    #[error("no architectures given: pass a list such as --archs \"6.1;12.0\"")]
    Empty,
    /// `sm_90a`, `9.0a`, `sm_100f`: a real arch with a variant suffix.
    #[error("'{token}' is well-formed ({arch} with the '{suffix}' suffix: {meaning}) but not built by NCCL's makefiles, which compile plain SASS for each arch (code=sm_{number}). Give {capability} instead: its SASS runs on every GPU of compute capability {capability}", number = arch.number(), capability = arch.capability())]
    Variant {
        token: String,
        arch: Arch,
        suffix: char,
        meaning: &'static str,
    },
    /// `6.1+PTX` where a higher arch is in the list too.
    #[error("'{token}' asks for PTX of {arch}, but fdl embeds PTX for the highest arch of a build only ({highest} here), as --ptx does; that PTX is what newer GPUs compile at load time, and the lower archs run their own SASS. Write +PTX on the highest arch ({highest_cap}+PTX) or pass --ptx", highest_cap = highest.capability())]
    PtxNotHighest {
        token: String,
        arch: Arch,
        highest: Arch,
    },
    /// `8.6+PTX` where a list names GPUs, not a build.
    #[error("'{token}': +PTX asks a build for PTX; this list names GPU capabilities only. Give {capability}", capability = arch.capability())]
    PtxNotHere { token: String, arch: Arch },
}

/// What a variant suffix means, for messages: the shape is open (any one letter), the
/// meaning known for the two NVIDIA uses.
fn suffix_meaning(suffix: char) -> &'static str {
    match suffix {
        'a' => "arch-specific features, runs only on exactly that arch",
        'f' => "family-specific features, runs on the later minors of its major",
        _ => "a variant suffix fdl does not know",
    }
}

/// The shape of one entry: an optional `compute_`/`sm_`/`sm` prefix, then `M.m` or the
/// digits nvcc writes (the last one the minor), then at most one letter. No list of
/// known archs is consulted: any capability of that shape is one.
fn parse_shape(token: &str) -> Result<(Arch, Option<char>), ArchError> {
    let t = token.trim();
    let malformed = || ArchError::Malformed(t.chars().take(40).collect());
    let lower = t.to_ascii_lowercase();
    let body = ["compute_", "sm_", "sm"]
        .iter()
        .find_map(|p| lower.strip_prefix(p))
        .unwrap_or(&lower);
    let (digits, suffix) = match body.chars().last() {
        Some(c) if c.is_ascii_alphabetic() => (&body[..body.len() - 1], Some(c)),
        _ => (body, None),
    };
    let number = |s: &str, max_len: usize| -> Option<u32> {
        (!s.is_empty() && s.len() <= max_len && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let arch = if let Some((maj, min)) = digits.split_once('.') {
        match (number(maj, 3), number(min, 1)) {
            (Some(maj), Some(min)) if maj > 0 => Arch::new(maj, min),
            _ => return Err(malformed()),
        }
    } else {
        // `61`, `120`, `1000`: the last digit is the minor, as nvcc numbers them.
        match number(digits, 4) {
            Some(n) if n >= 10 => Arch::from_number(n),
            _ => return Err(malformed()),
        }
    };
    Ok((arch, suffix))
}

/// Parses one entry: `6.1`, `61`, `120`, `sm_61`, `sm61`, `compute_61`. Any well-formed
/// capability is accepted, known to fdl or not; whether it can be built is the plan's
/// question, answered from the toolkit or the support table. A variant (`sm_90a`,
/// `9.0a`, `sm_100f`) is well-formed but no plain arch: [`ArchError::Variant`].
pub fn parse_arch_token(token: &str) -> Result<Arch, ArchError> {
    match parse_shape(token)? {
        (arch, None) => Ok(arch),
        (arch, Some(suffix)) => Err(ArchError::Variant {
            token: token.trim().chars().take(40).collect(),
            arch,
            suffix,
            meaning: suffix_meaning(suffix),
        }),
    }
}

/// One entry of a build's `--archs`: an arch, and whether it ends in `+PTX` (as
/// TORCH_CUDA_ARCH_LIST writes "SASS and PTX"; any case).
fn parse_build_token(token: &str) -> Result<(Arch, bool), ArchError> {
    let t = token.trim();
    let (body, ptx) = match t.len().checked_sub(4) {
        Some(at) if t.is_char_boundary(at) && t[at..].eq_ignore_ascii_case("+ptx") => {
            (&t[..at], true)
        }
        _ => (t, false),
    };
    Ok((parse_arch_token(body)?, ptx))
}

fn tokens(list: &str) -> impl Iterator<Item = &str> {
    list.split(|c: char| c == ';' || c == ',' || c.is_whitespace())
        .filter(|t| !t.is_empty())
}

/// Parses a list separated by `;`, `,` or whitespace, then sorts and deduplicates it.
/// For lists of GPUs (`fdl inspect --archs`): `+PTX` is refused here.
pub fn parse_arch_list(list: &str) -> Result<Vec<Arch>, ArchError> {
    let mut archs = Vec::new();
    for t in tokens(list) {
        match parse_build_token(t)? {
            (arch, true) => {
                return Err(ArchError::PtxNotHere {
                    token: t.chars().take(40).collect(),
                    arch,
                })
            }
            (arch, false) => archs.push(arch),
        }
    }
    if archs.is_empty() {
        return Err(ArchError::Empty);
    }
    archs.sort();
    archs.dedup();
    Ok(archs)
}

/// A build's `--archs`: the sorted, deduplicated archs, and whether PTX was asked for
/// with `+PTX`. fdl embeds PTX for the highest arch only ([`gencode`]), so `+PTX` is
/// taken on the highest arch, where it means what `--ptx` means (`6.1;8.6+PTX` is
/// `--archs "6.1;8.6" --ptx`: the same build, the same name and key), and refused on a
/// lower one, which would be another build under the same name.
pub fn parse_build_archs(list: &str) -> Result<(Vec<Arch>, bool), ArchError> {
    let mut entries = Vec::new();
    for t in tokens(list) {
        let (arch, ptx) = parse_build_token(t)?;
        entries.push((arch, ptx, t));
    }
    let Some(highest) = entries.iter().map(|e| e.0).max() else {
        return Err(ArchError::Empty);
    };
    if let Some((arch, _, t)) = entries.iter().find(|e| e.1 && e.0 != highest) {
        return Err(ArchError::PtxNotHighest {
            token: t.chars().take(40).collect(),
            arch: *arch,
            highest,
        });
    }
    let ptx = entries.iter().any(|e| e.1);
    let mut archs: Vec<Arch> = entries.into_iter().map(|e| e.0).collect();
    archs.sort();
    archs.dedup();
    Ok((archs, ptx))
}

/// `sm_61 sm_120`: archs as every message, plan row and store input names them.
pub fn archs_text(archs: &[Arch]) -> String {
    archs
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `sm61-sm120`: the arch part of a build's directory name (a plain word for make and
/// the shell, so no underscore-and-space list); nothing else uses this form.
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

impl GpuTarget {
    /// The virtual-architecture name PTX for this target goes by: `compute_90a`, as
    /// `cuobjdump --list-ptx` output and nvcc's `arch=` name it.
    pub fn ptx_name(self) -> String {
        self.to_string().replacen("sm_", "compute_", 1)
    }
}

impl std::str::FromStr for GpuTarget {
    type Err = ArchError;

    /// `sm_90a`, `compute_100f`, `sm_107`: any arch, with an optional variant suffix.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let (body, variant) = match t.as_bytes().last() {
            Some(b'a') => (&t[..t.len() - 1], Variant::Specific),
            Some(b'f') => (&t[..t.len() - 1], Variant::Family),
            _ => (t, Variant::Generic),
        };
        if !(body.starts_with("sm_") || body.starts_with("compute_")) {
            return Err(ArchError::Malformed(t.chars().take(40).collect()));
        }
        Ok(GpuTarget {
            arch: parse_arch_token(body)
                .map_err(|_| ArchError::Malformed(t.chars().take(40).collect()))?,
            variant,
        })
    }
}

impl<'de> Deserialize<'de> for GpuTarget {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
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
    /// NVIDIA's name for the architecture generation (Pascal, Blackwell), for messages.
    pub generation: &'static str,
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
    generation: &'static str,
    example: &'static str,
    since: (u32, u32),
    until: Option<(u32, u32)>,
) -> ArchSupport {
    ArchSupport {
        arch: Arch::new(major, minor),
        generation,
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
    row(3, 0, "Kepler", "GTX 680", (6, 0), Some((10, 2))),
    row(3, 2, "Kepler", "Jetson TK1", (6, 0), Some((10, 2))),
    row(3, 5, "Kepler", "Tesla K20/K40", (5, 0), Some((11, 8))),
    row(3, 7, "Kepler", "Tesla K80", (6, 5), Some((11, 8))),
    row(5, 0, "Maxwell", "GTX 750", (6, 0), Some((12, 9))),
    row(5, 2, "Maxwell", "GTX 980, Titan X", (6, 5), Some((12, 9))),
    row(5, 3, "Maxwell", "Jetson Nano", (7, 0), Some((12, 9))),
    row(6, 0, "Pascal", "Tesla P100", (8, 0), Some((12, 9))),
    row(6, 1, "Pascal", "GTX 1060/1080, P40", (8, 0), Some((12, 9))),
    row(6, 2, "Pascal", "Jetson TX2", (8, 0), Some((12, 9))),
    row(7, 0, "Volta", "Tesla V100", (9, 0), Some((12, 9))),
    row(7, 2, "Volta", "Jetson Xavier", (10, 0), Some((12, 9))),
    row(7, 5, "Turing", "RTX 2080, T4", (10, 0), None),
    row(8, 0, "Ampere", "A100", (11, 0), None),
    row(8, 6, "Ampere", "RTX 3090, A40", (11, 1), None),
    row(8, 7, "Ampere", "Jetson Orin", (11, 4), None),
    row(
        8,
        8,
        "Ampere",
        "sm_88, first offered by nvcc 13.0",
        (13, 0),
        None,
    ),
    row(8, 9, "Ada Lovelace", "RTX 4090, L40", (11, 8), None),
    row(9, 0, "Hopper", "H100, H200", (11, 8), None),
    row(10, 0, "Blackwell", "B200", (12, 8), None),
    row(
        10,
        1,
        "Blackwell",
        "Jetson Thor (pre-13.0 numbering)",
        (12, 8),
        Some((12, 9)),
    ),
    row(10, 3, "Blackwell", "B300", (12, 9), None),
    row(11, 0, "Blackwell", "Jetson Thor", (13, 0), None),
    row(12, 0, "Blackwell", "RTX 5090, RTX 5060 Ti", (12, 8), None),
    row(12, 1, "Blackwell", "DGX Spark", (12, 9), None),
];

/// NVIDIA's generation name of `arch` from [`ARCH_TABLE`] (an arch the table lacks takes
/// the name of the table's row of the same major, where there is one).
pub fn generation(arch: &Arch) -> Option<&'static str> {
    ARCH_TABLE
        .iter()
        .find(|r| r.arch == *arch)
        .or_else(|| ARCH_TABLE.iter().find(|r| r.arch.major == arch.major))
        .map(|r| r.generation)
}

/// A `major.minor` pair as CUDA releases are written (`12.8`).
pub fn fmt_mm((a, b): (u32, u32)) -> String {
    format!("{a}.{b}")
}

/// Why a CUDA release cannot be planned for an arch (with the Docker backend, which has
/// only the table to go by; the native backend asks its nvcc).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArchCudaError {
    #[error("CUDA {cuda} cannot compile {arch} ({example}): {arch} needs {range}. Pick a CUDA version in that range with --cuda, or drop {arch} from --archs")]
    Conflict {
        arch: Arch,
        example: String,
        cuda: CudaVersion,
        range: String,
    },
    #[error("fdl's table does not say which CUDA releases compile {arch}, so a Docker build cannot be planned for it. Build natively with a toolkit whose `nvcc --list-gpu-arch` lists {arch} (--backend native --cuda-home DIR), or name a CUDA image that compiles it with --base-image IMAGE")]
    Unknown { arch: Arch },
}

impl ArchCudaError {
    pub fn arch(&self) -> Arch {
        match self {
            ArchCudaError::Conflict { arch, .. } | ArchCudaError::Unknown { arch } => *arch,
        }
    }
}

/// Checks that `cuda` can compile SASS for every arch by the support table; the first
/// arch it cannot (or that the table does not know) is returned.
pub fn check_archs_for_cuda(archs: &[Arch], cuda: CudaVersion) -> Result<(), ArchCudaError> {
    let mm = cuda.major_minor();
    for &arch in archs {
        let Some(s) = arch.support() else {
            return Err(ArchCudaError::Unknown { arch });
        };
        let ok = mm >= s.since && s.until.is_none_or(|u| mm <= u);
        if !ok {
            let range = match s.until {
                Some(u) => format!("CUDA {} to {}", fmt_mm(s.since), fmt_mm(u)),
                None => format!("CUDA {} or newer", fmt_mm(s.since)),
            };
            return Err(ArchCudaError::Conflict {
                arch,
                example: s.example.to_string(),
                cuda,
                range,
            });
        }
    }
    Ok(())
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

    /// Variants are well-formed, and refused as what they are, with what to give.
    #[test]
    fn variants_are_well_formed_but_not_built() {
        for (token, arch, suffix) in [
            ("sm_90a", Arch::new(9, 0), 'a'),
            ("9.0a", Arch::new(9, 0), 'a'),
            ("sm_100f", Arch::new(10, 0), 'f'),
            ("compute_120a", Arch::new(12, 0), 'a'),
            ("sm_107x", Arch::new(10, 7), 'x'),
        ] {
            match parse_arch_token(token) {
                Err(ArchError::Variant {
                    token: t,
                    arch: a,
                    suffix: s,
                    ..
                }) => assert_eq!((t.as_str(), a, s), (token, arch, suffix)),
                other => panic!("{token}: {other:?}"),
            }
            let e = parse_arch_list(token).unwrap_err().to_string();
            assert!(
                e.contains("well-formed")
                    && e.contains("not built by NCCL's makefiles")
                    && e.contains(&format!("Give {}", arch.capability())),
                "{e}"
            );
        }
    }

    /// `+PTX` as TORCH_CUDA_ARCH_LIST writes it: on the highest arch it is --ptx.
    #[test]
    fn plus_ptx_is_ptx_for_the_highest_arch() {
        let (archs, ptx) = parse_build_archs("6.1;8.6+PTX").unwrap();
        assert_eq!((archs, ptx), (vec![Arch::new(6, 1), Arch::new(8, 6)], true));
        assert_eq!(
            parse_build_archs("8.6+ptx 6.1").unwrap(),
            (vec![Arch::new(6, 1), Arch::new(8, 6)], true)
        );
        assert_eq!(
            parse_build_archs("6.1;8.6").unwrap(),
            (vec![Arch::new(6, 1), Arch::new(8, 6)], false)
        );
        // One arch twice, once with +PTX: still the highest, still PTX.
        assert!(parse_build_archs("8.6;8.6+PTX").unwrap().1);
        let e = parse_build_archs("6.1+PTX;8.6").unwrap_err();
        assert_eq!(
            e,
            ArchError::PtxNotHighest {
                token: "6.1+PTX".into(),
                arch: Arch::new(6, 1),
                highest: Arch::new(8, 6)
            }
        );
        assert!(e.to_string().contains("8.6+PTX"), "{e}");
        assert!(matches!(
            parse_build_archs("9.0a+PTX"),
            Err(ArchError::Variant { .. })
        ));
        assert_eq!(
            parse_build_archs("+PTX"),
            Err(ArchError::Malformed("".into()))
        );
        assert!(matches!(
            parse_arch_list("8.6+PTX"),
            Err(ArchError::PtxNotHere { .. })
        ));
    }

    #[test]
    fn malformed_entries_are_named_and_unknown_archs_accepted() {
        for bad in [
            "sm_", "6.", ".1", "x86", "6.1.2", "12345", "6", "sm_6a1", "0.1", "sm_09x",
        ] {
            assert!(
                matches!(parse_arch_token(bad), Err(ArchError::Malformed(ref t)) if t == bad),
                "{bad}: {:?}",
                parse_arch_token(bad)
            );
        }
        // Open world: archs newer toolkits bring, or none has yet.
        assert_eq!(parse_arch_token("sm_107").unwrap(), Arch::new(10, 7));
        assert_eq!(parse_arch_token("13.0").unwrap(), Arch::new(13, 0));
        assert_eq!(parse_arch_token("compute_1000").unwrap(), Arch::new(100, 0));
        assert_eq!(parse_arch_list(" ; ,"), Err(ArchError::Empty));
        let long = "x".repeat(10_000);
        assert!(parse_arch_token(&long).unwrap_err().to_string().len() < 200);
    }

    #[test]
    fn targets_parse_with_variants_and_round_trip() {
        for t in ["sm_90a", "sm_100f", "sm_107", "sm_130", "compute_121a"] {
            let g: GpuTarget = t.parse().unwrap();
            assert_eq!(g.to_string(), t.replace("compute_", "sm_"));
            let json = serde_json::to_string(&g).unwrap();
            assert_eq!(serde_json::from_str::<GpuTarget>(&json).unwrap(), g);
        }
        for bad in ["90a", "sm_", "sm_90x", "sm_90af"] {
            assert!(bad.parse::<GpuTarget>().is_err(), "{bad}");
        }
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
        assert_eq!(e.arch(), Arch::new(12, 0));
        assert!(e.to_string().contains("CUDA 12.8 or newer"), "{e}");
        let e = check_archs_for_cuda(&mixed, CudaVersion::new(13, 0)).unwrap_err();
        assert_eq!(e.arch(), Arch::new(6, 1));
        assert!(e.to_string().contains("CUDA 8.0 to 12.9"), "{e}");
        assert!(check_archs_for_cuda(&[Arch::new(11, 0)], CudaVersion::new(12, 9)).is_err());
        assert!(check_archs_for_cuda(&[Arch::new(10, 1)], CudaVersion::new(13, 0)).is_err());
        // An arch the table has never heard of is not waved through.
        let e = check_archs_for_cuda(&[Arch::new(10, 7)], CudaVersion::new(13, 5)).unwrap_err();
        assert_eq!(
            e,
            ArchCudaError::Unknown {
                arch: Arch::new(10, 7)
            }
        );
        assert!(e.to_string().contains("--backend native"), "{e}");
        assert!(e.to_string().contains("--base-image"), "{e}");
    }

    fn t(s: &str) -> GpuTarget {
        s.parse().unwrap()
    }

    /// Plain SASS: same major, equal or higher minor. Plain PTX: any equal or newer GPU.
    #[test]
    fn coverage_rule_plain() {
        let sm86 = t("sm_86");
        assert!(sm86.sass_runs_on(Arch::new(8, 9)));
        assert!(!sm86.sass_runs_on(Arch::new(8, 0)));
        assert!(!sm86.sass_runs_on(Arch::new(9, 0)));
        assert!(sm86.ptx_runs_on(Arch::new(12, 0)));
        assert!(!sm86.ptx_runs_on(Arch::new(8, 0)));
    }

    /// `a`: this arch only, SASS and PTX alike. An sm_100a-only library does not cover an
    /// sm_103 GPU, though a plain sm_100 one does.
    #[test]
    fn coverage_rule_arch_specific() {
        let sm100a = t("sm_100a");
        assert!(sm100a.sass_runs_on(Arch::new(10, 0)));
        assert!(!sm100a.sass_runs_on(Arch::new(10, 3)));
        assert!(t("sm_100").sass_runs_on(Arch::new(10, 3)));
        assert!(!t("compute_90a").ptx_runs_on(Arch::new(10, 0)));
        assert!(t("compute_90a").ptx_runs_on(Arch::new(9, 0)));
    }

    /// `f`: this major, minor at least as high — for SASS and PTX.
    #[test]
    fn generations_are_named_from_the_table() {
        let g = |s: &str| {
            let n: u32 = s.trim_start_matches("sm_").parse().unwrap();
            generation(&Arch::new(n / 10, n % 10))
        };
        assert_eq!(g("sm_50"), Some("Maxwell"));
        assert_eq!(g("sm_61"), Some("Pascal"));
        assert_eq!(g("sm_75"), Some("Turing"));
        assert_eq!(g("sm_89"), Some("Ada Lovelace"));
        assert_eq!(g("sm_120"), Some("Blackwell"));
        // Not in the table, a major that is: that row's name; another major: none.
        assert_eq!(g("sm_124"), Some("Blackwell"));
        assert_eq!(g("sm_130"), None);
        assert!(ARCH_TABLE.iter().all(|r| !r.generation.is_empty()));
    }

    #[test]
    fn coverage_rule_family() {
        let sm100f = t("sm_100f");
        assert!(sm100f.sass_runs_on(Arch::new(10, 3)));
        assert!(sm100f.sass_runs_on(Arch::new(10, 0)));
        assert!(!sm100f.sass_runs_on(Arch::new(12, 0)));
        assert!(!t("sm_103f").sass_runs_on(Arch::new(10, 0)));
        assert!(t("compute_100f").ptx_runs_on(Arch::new(10, 3)));
        assert!(!t("compute_100f").ptx_runs_on(Arch::new(12, 0)));
    }
}
