//! Where a pip-installed torch writes down the NCCL it expects: its distribution's
//! `METADATA` names the wheel and version (`Requires-Dist: nvidia-nccl-cu13==2.30.7; …`).
//! When `libnccl.so.2` cannot be found, that is the answer to "which NCCL would this
//! libtorch run": the one its wheel pins, not installed.

use crate::version::NcclVersion;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// An NCCL version a Python distribution requires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pin {
    /// The wheel that carries it, e.g. `nvidia-nccl-cu13`.
    pub distribution: String,
    pub version: NcclVersion,
    /// The `METADATA` file that says so.
    pub metadata: PathBuf,
}

impl std::fmt::Display for Pin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NCCL {} from {} ({} pins {}=={})",
            self.version,
            self.distribution,
            self.metadata.display(),
            self.distribution,
            self.version
        )
    }
}

/// More directory entries than this in site-packages are not read through.
const MAX_ENTRIES: usize = 100_000;
/// A METADATA larger than this is not one (torch's is about 30 KiB).
const MAX_METADATA: u64 = 4 << 20;

/// The pin written by the distribution that owns `lib`, for a pip layout
/// `site-packages/<pkg>/lib/<lib>` with `site-packages/<pkg>-<version>.dist-info/METADATA`.
pub fn find(lib: &Path) -> Option<Pin> {
    // Where pip put it, whatever link it is reached through (a registered variant's
    // `lib` is a link into site-packages).
    let lib = lib.canonicalize().ok()?;
    let pkg_dir = lib.parent()?.parent()?;
    let pkg = pkg_dir.file_name()?.to_str()?;
    let site = pkg_dir.parent()?;
    let prefix = format!("{pkg}-");
    let mut dist_infos: Vec<PathBuf> = std::fs::read_dir(site)
        .ok()?
        .take(MAX_ENTRIES)
        .filter_map(|e| e.ok())
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.starts_with(&prefix) && n.ends_with(".dist-info")
        })
        .map(|e| e.path())
        .collect();
    dist_infos.sort();
    dist_infos.into_iter().find_map(|d| {
        let metadata = d.join("METADATA");
        let text = crate::fsread::read_text_following(&metadata, MAX_METADATA).ok()?;
        let (distribution, version) = parse_requires(&text)?;
        Some(Pin {
            distribution,
            version,
            metadata,
        })
    })
}

/// The first `Requires-Dist: nvidia-nccl-…==X.Y.Z` of a METADATA text (an environment
/// marker after `;` and the old parenthesised form `nvidia-nccl-cu12 (==2.21.5)` allowed).
pub fn parse_requires(metadata: &str) -> Option<(String, NcclVersion)> {
    // Headers end at the first empty line; the description follows.
    for line in metadata.lines().take_while(|l| !l.trim().is_empty()) {
        let Some(req) = line.strip_prefix("Requires-Dist:") else {
            continue;
        };
        let req = req.split(';').next().unwrap_or("").trim();
        let name_end = req
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.'))
            .unwrap_or(req.len());
        let name = &req[..name_end];
        let normalized = name.to_ascii_lowercase().replace(['_', '.'], "-");
        if !normalized.starts_with("nvidia-nccl-") {
            continue;
        }
        let spec = req[name_end..]
            .trim()
            .trim_start_matches('(')
            .trim_end_matches(')')
            .trim();
        let Some(v) = spec.strip_prefix("==") else {
            continue;
        };
        if let Ok(version) = v.trim().parse::<NcclVersion>() {
            return Some((normalized, version));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requires_dist_forms() {
        let m = "Metadata-Version: 2.1\nName: torch\nRequires-Dist: filelock\nRequires-Dist: nvidia-nccl-cu13==2.30.7; platform_system == \"Linux\"\n\nRequires-Dist: nvidia-nccl-cu12==9.9.9\n";
        let (d, v) = parse_requires(m).unwrap();
        assert_eq!(
            (d.as_str(), v.to_string().as_str()),
            ("nvidia-nccl-cu13", "2.30.7")
        );
        let old = "Name: torch\nRequires-Dist: nvidia_nccl_cu12 (==2.21.5) ; platform_machine == \"x86_64\"\n";
        assert_eq!(parse_requires(old).unwrap().1.to_string(), "2.21.5");
        assert!(parse_requires("Name: torch\nRequires-Dist: nvidia-nccl-cu12>=2.20\n").is_none());
        assert!(
            parse_requires("Name: torch\n\nRequires-Dist: nvidia-nccl-cu12==2.1.1\n").is_none()
        );
    }
}
