//! Version numbers that flow through every stage: the CUDA toolkit version (`12.8`) and the
//! NCCL release (`2.27.5`). Kept apart from where they are found (`inspect`) and where they
//! are used (`nccl`) so both can depend on them without depending on each other.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A CUDA toolkit version, `major.minor` with an optional patch (`12.8` or `12.8.1`).
/// In JSON it is a string, as pip and cargo write versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CudaVersion {
    pub major: u32,
    pub minor: u32,
    /// Only present when the user named a full release, e.g. `--cuda 12.8.1`.
    pub patch: Option<u32>,
}

impl CudaVersion {
    pub const fn new(major: u32, minor: u32) -> Self {
        CudaVersion {
            major,
            minor,
            patch: None,
        }
    }

    /// The `major.minor` pair, which is what compatibility rules are written against.
    pub fn major_minor(self) -> (u32, u32) {
        (self.major, self.minor)
    }

    pub fn without_patch(self) -> Self {
        CudaVersion::new(self.major, self.minor)
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.patch {
            Some(p) => write!(f, "{}.{}.{}", self.major, self.minor, p),
            None => write!(f, "{}.{}", self.major, self.minor),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "invalid CUDA version '{0}': expected MAJOR.MINOR or MAJOR.MINOR.PATCH, e.g. 12.8 or 12.8.1"
)]
pub struct CudaVersionError(pub String);

impl FromStr for CudaVersion {
    type Err = CudaVersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || CudaVersionError(s.to_string());
        let t = s.trim();
        let nums = parse_dotted(t).ok_or_else(err)?;
        match nums.as_slice() {
            [major, minor] => Ok(CudaVersion::new(*major, *minor)),
            [major, minor, patch] => Ok(CudaVersion {
                major: *major,
                minor: *minor,
                patch: Some(*patch),
            }),
            _ => Err(err()),
        }
    }
}

/// An NCCL release number `X.Y.Z` with the optional suffix NCCL appends in pre-releases.
/// In JSON it is a string (`"2.30.7"`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NcclVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
    pub suffix: String,
}

impl NcclVersion {
    pub fn new(major: u32, minor: u32, patch: u32) -> Self {
        NcclVersion {
            major,
            minor,
            patch,
            suffix: String::new(),
        }
    }

    /// Whether `other` is the same release (major, minor and patch; the suffix aside):
    /// what NCCL compares across ranks, and what a tag, a header and a self-id must share.
    pub fn same_release(&self, other: &NcclVersion) -> bool {
        (self.major, self.minor, self.patch) == (other.major, other.minor, other.patch)
    }

    /// The integer `ncclGetVersion` returns for this release (NCCL_VERSION_CODE).
    /// NCCL switched encodings at 2.9: before it was `X*1000 + Y*100 + Z`.
    pub fn code(&self) -> u64 {
        let (x, y, z) = (self.major as u64, self.minor as u64, self.patch as u64);
        if x > 2 || (x == 2 && y >= 9) {
            x * 10000 + y * 100 + z
        } else {
            x * 1000 + y * 100 + z
        }
    }

    /// Inverse of [`NcclVersion::code`].
    pub fn from_code(code: u64) -> Self {
        let (x, y, z) = if code >= 20900 {
            (code / 10000, (code % 10000) / 100, code % 100)
        } else {
            (code / 1000, (code % 1000) / 100, code % 100)
        };
        NcclVersion::new(x as u32, y as u32, z as u32)
    }
}

impl fmt::Display for NcclVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{}.{}{}",
            self.major, self.minor, self.patch, self.suffix
        )
    }
}

impl FromStr for NcclVersion {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        // A pre-release suffix (`2.30.7a0`) follows the patch digits; Display writes it so.
        let digits_end = t
            .rfind('.')
            .map(|dot| dot + 1 + t[dot + 1..].bytes().take_while(u8::is_ascii_digit).count())
            .unwrap_or(t.len());
        let (numbers, suffix) = t.split_at(digits_end);
        let suffix_ok = suffix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-+_.".contains(&b));
        match (parse_dotted(numbers).as_deref(), suffix_ok) {
            (Some([x, y, z]), true) => Ok(NcclVersion {
                suffix: suffix.to_string(),
                ..NcclVersion::new(*x, *y, *z)
            }),
            _ => Err(format!("invalid NCCL version '{s}': expected X.Y.Z")),
        }
    }
}

/// Versions are written as strings. Manifests of fdl 0.1 (schema 1) wrote them as
/// objects (`{"major": 12, "minor": 8}`), so reading accepts both.
#[derive(Deserialize)]
#[serde(untagged)]
enum VersionRepr {
    Text(String),
    Parts {
        major: u32,
        minor: u32,
        patch: Option<u32>,
        #[serde(default)]
        suffix: String,
    },
}

impl Serialize for CudaVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for CudaVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match VersionRepr::deserialize(d)? {
            VersionRepr::Text(t) => t.parse().map_err(serde::de::Error::custom),
            VersionRepr::Parts {
                major,
                minor,
                patch,
                ..
            } => Ok(CudaVersion {
                major,
                minor,
                patch,
            }),
        }
    }
}

impl Serialize for NcclVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for NcclVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match VersionRepr::deserialize(d)? {
            VersionRepr::Text(t) => t.parse().map_err(serde::de::Error::custom),
            VersionRepr::Parts {
                major,
                minor,
                patch,
                suffix,
            } => Ok(NcclVersion {
                major,
                minor,
                patch: patch.unwrap_or(0),
                suffix,
            }),
        }
    }
}

/// `"12.8.1"` → `[12, 8, 1]`; `None` for anything else (empty parts, signs, overflow).
pub(crate) fn parse_dotted(s: &str) -> Option<Vec<u32>> {
    s.split('.')
        .map(|p| {
            if p.is_empty() || p.len() > 6 || !p.bytes().all(|b| b.is_ascii_digit()) {
                None
            } else {
                p.parse().ok()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_parses_two_and_three_parts() {
        assert_eq!(
            "12.8".parse::<CudaVersion>().unwrap(),
            CudaVersion::new(12, 8)
        );
        let full: CudaVersion = "12.8.1".parse().unwrap();
        assert_eq!(full.patch, Some(1));
        assert_eq!(full.to_string(), "12.8.1");
        for bad in ["", "12", "12.", "a.b", "12.8.1.0", "-12.8", "12.+8"] {
            assert!(bad.parse::<CudaVersion>().is_err(), "{bad}");
        }
    }

    /// JSON writes strings; manifests of schema 1 wrote objects, which still read.
    #[test]
    fn versions_are_json_strings_and_read_the_old_objects() {
        let cuda: CudaVersion = "13.3".parse().unwrap();
        assert_eq!(serde_json::to_string(&cuda).unwrap(), r#""13.3""#);
        let full: CudaVersion = "12.8.1".parse().unwrap();
        assert_eq!(serde_json::to_string(&full).unwrap(), r#""12.8.1""#);
        let nccl = NcclVersion::new(2, 30, 7);
        assert_eq!(serde_json::to_string(&nccl).unwrap(), r#""2.30.7""#);
        for (text, want) in [
            (r#""12.8.1""#, full),
            (r#"{"major": 12, "minor": 8, "patch": 1}"#, full),
            (r#"{"major": 13, "minor": 3}"#, cuda),
        ] {
            assert_eq!(serde_json::from_str::<CudaVersion>(text).unwrap(), want);
        }
        for text in [r#""2.30.7""#, r#"{"major": 2, "minor": 30, "patch": 7}"#] {
            assert_eq!(serde_json::from_str::<NcclVersion>(text).unwrap(), nccl);
        }
        let pre: NcclVersion = "2.30.7a0".parse().unwrap();
        assert_eq!(pre.suffix, "a0");
        assert_eq!(
            serde_json::from_str::<NcclVersion>(&serde_json::to_string(&pre).unwrap()).unwrap(),
            pre
        );
        for bad in [r#""2.30""#, r#""x""#, r#""2.30.7 x""#, "7"] {
            assert!(serde_json::from_str::<NcclVersion>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn nccl_code_round_trips_both_encodings() {
        assert_eq!(NcclVersion::new(2, 27, 5).code(), 22705);
        assert_eq!(NcclVersion::new(2, 8, 4).code(), 2804);
        assert_eq!(NcclVersion::from_code(22705), NcclVersion::new(2, 27, 5));
        assert_eq!(NcclVersion::from_code(2804), NcclVersion::new(2, 8, 4));
    }
}
