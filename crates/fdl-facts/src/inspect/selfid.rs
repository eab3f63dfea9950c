//! NCCL's self-identification string, `NCCL version X.Y.Z[suffix]+cudaA.B`, which NCCL
//! compiles into every build (init.cc's VERSION_STRING). Only the `+cuda` form counts:
//! PyTorch also carries messages such as "requires NCCL version 2.27.0 or later", which
//! name floors, not the NCCL that is linked in.

use crate::version::{CudaVersion, NcclVersion};
use serde::Serialize;

pub const NEEDLE: &[u8] = b"NCCL version ";

/// What a self-id string says: the NCCL release and the CUDA it was compiled with.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct SelfId {
    pub nccl: NcclVersion,
    pub cuda: CudaVersion,
}

/// Parses the bytes right after [`NEEDLE`]. `None` unless they form a full self-id.
pub fn parse_after_needle(rest: &[u8]) -> Option<SelfId> {
    let mut pos = 0;
    let num = |pos: &mut usize| -> Option<u32> {
        let start = *pos;
        while *pos < rest.len() && rest[*pos].is_ascii_digit() && *pos - start < 6 {
            *pos += 1;
        }
        if *pos == start {
            return None;
        }
        std::str::from_utf8(&rest[start..*pos]).ok()?.parse().ok()
    };
    let expect = |pos: &mut usize, lit: &[u8]| -> Option<()> {
        if rest.get(*pos..*pos + lit.len())? == lit {
            *pos += lit.len();
            Some(())
        } else {
            None
        }
    };
    let major = num(&mut pos)?;
    expect(&mut pos, b".")?;
    let minor = num(&mut pos)?;
    expect(&mut pos, b".")?;
    let patch = num(&mut pos)?;
    // NCCL_SUFFIX: short alphanumeric pre-release tag, e.g. "a0"; never spaces.
    let suffix_start = pos;
    while pos < rest.len() && rest[pos].is_ascii_alphanumeric() && pos - suffix_start < 16 {
        pos += 1;
    }
    let suffix = std::str::from_utf8(&rest[suffix_start..pos])
        .ok()?
        .to_string();
    expect(&mut pos, b"+cuda")?;
    let cuda_major = num(&mut pos)?;
    expect(&mut pos, b".")?;
    let cuda_minor = num(&mut pos)?;
    Some(SelfId {
        nccl: NcclVersion {
            major,
            minor,
            patch,
            suffix,
        },
        cuda: CudaVersion::new(cuda_major, cuda_minor),
    })
}

/// Every distinct self-id in `haystack`, in order of first appearance.
pub fn find_all(haystack: &[u8]) -> Vec<SelfId> {
    let mut found: Vec<SelfId> = Vec::new();
    for at in memchr::memmem::find_iter(haystack, NEEDLE) {
        let rest = &haystack[at + NEEDLE.len()..];
        let rest = &rest[..rest.len().min(64)];
        if let Some(id) = parse_after_needle(rest) {
            if !found.contains(&id) {
                found.push(id);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_id_is_parsed_and_floors_are_not() {
        let blob = b"\0requires NCCL version 2.27.0 or later\0NCCL version %s\0\
                     NCCL version 2.27.5+cuda12.9\0NCCL version 2.4.2 or newer\0";
        let ids = find_all(blob);
        assert_eq!(ids.len(), 1);
        assert_eq!(ids[0].nccl, NcclVersion::new(2, 27, 5));
        assert_eq!(ids[0].cuda, CudaVersion::new(12, 9));
    }

    #[test]
    fn suffix_and_truncation() {
        let id = parse_after_needle(b"2.28.0a0+cuda13.0").unwrap();
        assert_eq!(id.nccl.suffix, "a0");
        assert_eq!(id.nccl.to_string(), "2.28.0a0");
        assert!(parse_after_needle(b"2.28.0+cuda").is_none());
        assert!(parse_after_needle(b"2.28").is_none());
        assert!(find_all(b"NCCL version 2.21.5+cu").is_empty());
    }
}
