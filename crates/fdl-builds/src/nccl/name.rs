//! A build's name, and every name fdl derives from it (the directories beside the build,
//! its lock and log): one module, so that the bound on a name covers them all. Below
//! both the plan (which names its build) and the project store (which makes those
//! directories).

use crate::txn::REPLACED_PREFIX;
use anyhow::{bail, Result};

/// Where a new build is staged beside its target: `.staging-<name>-XXXXXX`.
pub const STAGING_PREFIX: &str = ".staging-";
/// Where a removed build is moved before it is deleted: `.removing-<name>-XXXXXX`.
pub const REMOVING_PREFIX: &str = ".removing-";

/// Where `fdl cluster ship` lands a copy before installing it; a rerun resumes it.
pub const INCOMING_PREFIX: &str = ".incoming-";

/// A build's name: a plain directory name under the builds directory, never a path,
/// checked once when it comes in (from the user or a plan).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(transparent)]
pub struct BuildName(String);

/// The longest file name Linux file systems take (NAME_MAX).
const NAME_MAX: usize = 255;
/// What `tempfile` appends to a prefix: `-` then six random characters.
const RANDOM_TAIL: usize = 1 + 6;

/// The prefixes of the backends' work directories beside a build (`<prefix><name>-…`):
/// named here, with every other name derived from a build's, so that [`BuildName`]'s
/// bound covers them.
pub const NATIVE_WORK_PREFIX: &str = ".native-work-";
pub const DOCKER_WORK_PREFIX: &str = ".docker-work-";

/// What kind of leftover a name beside the builds is: a directory fdl makes for a build
/// while it runs (named `<prefix><build>-<random>`, or `.incoming-<build>`), left behind
/// when that run was killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeftoverKind {
    Staging,
    Replaced,
    Removing,
    NativeWork,
    DockerWork,
    Incoming,
}

impl LeftoverKind {
    /// What it is and what becomes of it, for the user.
    pub fn what(self) -> &'static str {
        match self {
            LeftoverKind::Staging => "the staging directory of an interrupted build",
            LeftoverKind::Replaced => "an old build set aside by an interrupted replace; the next build of it puts it back if the new one never arrived",
            LeftoverKind::Removing => "a build whose removal was interrupted",
            LeftoverKind::NativeWork => "the work directory of an interrupted native build",
            LeftoverKind::DockerWork => "the work directory of an interrupted Docker build",
            LeftoverKind::Incoming => "a copy from `fdl cluster ship` that was not installed; the next ship resumes it",
        }
    }
}

/// The build a leftover's name belongs to, and what kind of leftover it is; `None` for
/// any name fdl does not make beside a build (only fdl's own prefixes, and only with a
/// valid build name and tempfile's random tail, which never holds a '-').
pub fn leftover_of(name: &str) -> Option<(BuildName, LeftoverKind)> {
    if let Some(rest) = name.strip_prefix(INCOMING_PREFIX) {
        return BuildName::parse(rest)
            .ok()
            .map(|b| (b, LeftoverKind::Incoming));
    }
    let kinds = [
        (STAGING_PREFIX, LeftoverKind::Staging),
        (REPLACED_PREFIX, LeftoverKind::Replaced),
        (REMOVING_PREFIX, LeftoverKind::Removing),
        (NATIVE_WORK_PREFIX, LeftoverKind::NativeWork),
        (DOCKER_WORK_PREFIX, LeftoverKind::DockerWork),
    ];
    let (rest, kind) = kinds
        .into_iter()
        .find_map(|(p, k)| name.strip_prefix(p).map(|rest| (rest, k)))?;
    let (build, random) = rest.rsplit_once('-')?;
    if random.is_empty() || !random.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    BuildName::parse(build).ok().map(|b| (b, kind))
}

/// A build's log in the cache is `<name>-<seconds>-<pid>.log`.
pub const LOG_SUFFIX: &str = ".log";
/// How many bytes a build's log name adds to the build's name at most (a u64 of
/// seconds, a u32 pid).
pub const LOG_NAME_EXTRA: usize = 1 + 20 + 1 + 10 + LOG_SUFFIX.len();

/// The most bytes any name fdl derives from a build's name adds to it: the directories
/// beside the build (`.staging-<name>-XXXXXX`, `.replaced-…`, `.removing-…`,
/// `.incoming-<name>`, the backends' work directories), its lock file in the cache and
/// its log. Each comes from the constant its maker uses, so a longer one moves the bound.
pub(crate) const LONGEST_DERIVED: usize = {
    let extras = [
        STAGING_PREFIX.len() + RANDOM_TAIL,
        REPLACED_PREFIX.len() + RANDOM_TAIL,
        REMOVING_PREFIX.len() + RANDOM_TAIL,
        INCOMING_PREFIX.len(),
        NATIVE_WORK_PREFIX.len() + RANDOM_TAIL,
        DOCKER_WORK_PREFIX.len() + RANDOM_TAIL,
        crate::lock::LOCK_NAME_EXTRA,
        LOG_NAME_EXTRA,
    ];
    let mut most = 0;
    let mut i = 0;
    while i < extras.len() {
        if extras[i] > most {
            most = extras[i];
        }
        i += 1;
    }
    most
};

impl BuildName {
    /// The longest build name: one whose every derived name (see [`LONGEST_DERIVED`])
    /// is still a file name, so a long name is refused here rather than as "File name
    /// too long" halfway through a build.
    pub const MAX_BYTES: usize = NAME_MAX - LONGEST_DERIVED;

    pub fn parse(name: &str) -> Result<BuildName> {
        if name.len() > Self::MAX_BYTES {
            bail!(
                "'{}…' ({} bytes) is not a build name: a build name has at most {} bytes, so that the names fdl makes from it (`.staging-<name>-…`, `.incoming-<name>`, its lock and log) fit in a directory entry ({NAME_MAX} bytes). Give a shorter name",
                crate::text::clean(&name.chars().take(40).collect::<String>()),
                name.len(),
                Self::MAX_BYTES
            );
        }
        let ok = !name.is_empty()
            && !name.starts_with('.')
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !ok {
            let shown: String = name.chars().take(80).collect();
            bail!("'{shown}' is not a build name: give a directory name under libtorch/nccl/builds/ as `fdl nccl list` shows it");
        }
        Ok(BuildName(name.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for BuildName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftover_names_are_only_fdls_own() {
        let (b, k) = leftover_of(".native-work-v2.27.5-sm61-AbC123").unwrap();
        assert_eq!((b.as_str(), k), ("v2.27.5-sm61", LeftoverKind::NativeWork));
        let (b, k) = leftover_of(".staging-v2.27.5-sm90-x1Y2z3").unwrap();
        assert_eq!((b.as_str(), k), ("v2.27.5-sm90", LeftoverKind::Staging));
        let (b, k) = leftover_of(".incoming-v2.27.5-sm90").unwrap();
        assert_eq!((b.as_str(), k), ("v2.27.5-sm90", LeftoverKind::Incoming));
        for not_ours in [
            ".staging-x",
            ".staging--AbC123",
            ".staging-../x-AbC123",
            ".cache-v1-AbC123",
            "v2.27.5-sm61",
            ".native-work-v2-",
        ] {
            assert!(leftover_of(not_ours).is_none(), "{not_ours}");
        }
    }
}
