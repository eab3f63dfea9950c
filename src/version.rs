//! Version numbers that flow through every stage: the CUDA toolkit version (`12.8`) and the
//! NCCL release (`2.27.5`). Kept apart from where they are found (`inspect`) and where they
//! are used (`nccl`) so both can depend on them without depending on each other.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A CUDA toolkit version, `major.minor` with an optional patch (`12.8` or `12.8.1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CudaVersion {
    pub major: u32,
    pub minor: u32,
    /// Only present when the user named a full release, e.g. `--cuda 12.8.1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NcclVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
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
        match parse_dotted(s.trim()).as_deref() {
            Some([x, y, z]) => Ok(NcclVersion::new(*x, *y, *z)),
            _ => Err(format!("invalid NCCL version '{s}': expected X.Y.Z")),
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

    #[test]
    fn nccl_code_round_trips_both_encodings() {
        assert_eq!(NcclVersion::new(2, 27, 5).code(), 22705);
        assert_eq!(NcclVersion::new(2, 8, 4).code(), 2804);
        assert_eq!(NcclVersion::from_code(22705), NcclVersion::new(2, 27, 5));
        assert_eq!(NcclVersion::from_code(2804), NcclVersion::new(2, 8, 4));
    }
}
