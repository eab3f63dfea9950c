//! NCCL git tags. A tag ends up in a directory name, an image tag and a `git clone
//! --branch` argument, so it is validated before anything else sees it.

use crate::version::NcclVersion;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A validated NCCL tag or git ref: `v2.27.5-1`, `v2.28.0-rc1`, `master`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Tag(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TagError {
    #[error("--tag is empty: give an NCCL tag (v<major>.<minor>.<patch>-<revision>, as NCCL's git tags are named), or leave --tag out to infer it from the active libtorch")]
    Blank,
    #[error("invalid tag '{0}': a tag may not start with '-' (it would be read as an option). Use an NCCL tag: v<major>.<minor>.<patch>-<revision>")]
    LeadingDash(String),
    #[error("invalid tag '{0}': a tag may not start with '.'. Use an NCCL tag: v<major>.<minor>.<patch>-<revision>")]
    LeadingDot(String),
    #[error("invalid tag '{0}': '..' is not allowed in a tag. Use an NCCL tag: v<major>.<minor>.<patch>-<revision>")]
    DotDot(String),
    #[error("invalid tag '{tag}': character {ch:?} is not allowed; a tag is an NCCL tag (v<major>.<minor>.<patch>-<revision>) or a git ref made of letters, digits, '.', '_' and '-'")]
    BadChar { tag: String, ch: char },
    #[error("invalid tag '{0}': longer than 64 characters")]
    TooLong(String),
    #[error("--tag {tag} is a version, not one of NCCL's git tags, which start with 'v' and end with a package revision: did you mean --tag {suggestion}?")]
    BareVersion { tag: String, suggestion: String },
    #[error("--tag {tag} is no NCCL tag: NCCL's release tags end with a package revision (-1, -2, …), and {tag} would be built into the same directory as {suggestion}: did you mean {suggestion}?")]
    NoRevision { tag: String, suggestion: String },
}

/// How much of a bad tag an error shows: enough to recognise it, not a 10,000-character
/// echo.
fn shown(s: &str) -> String {
    const MAX: usize = 64;
    if s.chars().count() <= MAX {
        s.to_string()
    } else {
        format!(
            "{}… ({} characters)",
            s.chars().take(MAX).collect::<String>(),
            s.chars().count()
        )
    }
}

impl Tag {
    pub fn parse(s: &str) -> Result<Tag, TagError> {
        let tag = shown(s);
        if s.trim().is_empty() {
            return Err(TagError::Blank);
        }
        if let Some(ch) = s
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(TagError::BadChar { tag, ch });
        }
        if s.starts_with('-') {
            return Err(TagError::LeadingDash(tag));
        }
        if s.starts_with('.') {
            return Err(TagError::LeadingDot(tag));
        }
        if s.contains("..") {
            return Err(TagError::DotDot(tag));
        }
        if s.len() > 64 {
            return Err(TagError::TooLong(tag));
        }
        Ok(Tag(s.to_string()))
    }

    /// A tag as the user typed it in `--tag`: besides [`Tag::parse`]'s rules, a bare
    /// version (`2.27.5`, `2.27.5-1`) and a release without its revision (`v2.27.5`,
    /// `v2.27.5-`) are refused with the tag they most likely mean: NCCL has no such git
    /// ref, and the second would share the build name of `v2.27.5-1`
    /// ([`Tag::version_part`] drops `-1`). So every tag a flag lets through names its
    /// own build directory. (Manifests are read with `parse` alone.)
    pub fn parse_flag(s: &str) -> Result<Tag, TagError> {
        let tag = Tag::parse(s)?;
        if let Some(rest) = s.strip_prefix('v') {
            let (version, revision) = rest.split_once('-').unwrap_or((rest, ""));
            if version.parse::<NcclVersion>().is_ok() && revision.is_empty() {
                return Err(TagError::NoRevision {
                    tag: shown(s),
                    suggestion: format!("v{version}-1"),
                });
            }
        }
        let (version, revision) = s.split_once('-').unwrap_or((s, "1"));
        if version.parse::<NcclVersion>().is_ok() && !revision.is_empty() {
            return Err(TagError::BareVersion {
                tag: shown(s),
                suggestion: format!("v{version}-{revision}"),
            });
        }
        Ok(tag)
    }

    /// The tag NVIDIA uses for a release: `v2.27.5-1`.
    pub fn for_release(v: &NcclVersion) -> Tag {
        Tag(format!("v{}.{}.{}-1", v.major, v.minor, v.patch))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `vX.Y.Z` followed by nothing or by `-<anything>`: the release it builds.
    pub fn version(&self) -> Option<NcclVersion> {
        let rest = self.0.strip_prefix('v')?;
        let (ver, _) = rest.split_once('-').unwrap_or((rest, ""));
        ver.parse().ok()
    }

    /// The version part of a build's name: NVIDIA's usual package revision `-1` is dropped
    /// (`v2.27.5-1` → `v2.27.5`); any other (`v2.27.5-2`, `v2.27.5-rc1`, `master`) stays,
    /// so two different tags never share a build directory or an image.
    pub fn version_part(&self) -> &str {
        match self.0.strip_suffix("-1") {
            Some(head) if self.version().is_some() && !head.contains('-') => head,
            _ => &self.0,
        }
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for Tag {
    type Error = TagError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Tag::parse(&s)
    }
}

impl From<Tag> for String {
    fn from(t: Tag) -> String {
        t.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_tags_and_version_parts() {
        let t = Tag::parse("v2.27.5-1").unwrap();
        assert_eq!(t.version_part(), "v2.27.5");
        assert_eq!(t.version(), Some(NcclVersion::new(2, 27, 5)));
        assert_eq!(
            Tag::parse("v2.27.5-rc1").unwrap().version_part(),
            "v2.27.5-rc1"
        );
        assert_eq!(Tag::parse("master").unwrap().version_part(), "master");
        assert_eq!(Tag::parse("master").unwrap().version(), None);
        assert_eq!(Tag::parse("release-1").unwrap().version_part(), "release-1");
        // Two revisions of one release are two builds.
        assert_eq!(Tag::parse("v2.27.5-2").unwrap().version_part(), "v2.27.5-2");
        assert_eq!(
            Tag::for_release(&NcclVersion::new(2, 21, 5)).as_str(),
            "v2.21.5-1"
        );
    }

    /// `v2.27.5` would plan into `v2.27.5-1`'s directory, and NCCL has no such tag.
    #[test]
    fn a_release_without_its_revision_is_refused_with_the_tag_it_means() {
        for (typed, meant) in [("v2.27.5", "v2.27.5-1"), ("v2.30.7-", "v2.30.7-1")] {
            let e = Tag::parse_flag(typed).unwrap_err();
            assert_eq!(
                e,
                TagError::NoRevision {
                    tag: typed.into(),
                    suggestion: meant.into()
                }
            );
            assert!(
                e.to_string().contains(&format!("did you mean {meant}?")),
                "{e}"
            );
        }
        // Every tag a flag accepts has a build name no other accepted tag has.
        let accepted: Vec<Tag> = [
            "v2.27.5-1",
            "v2.27.5-2",
            "v2.27.5-rc1",
            "master",
            "v2.27.5.x",
        ]
        .iter()
        .filter_map(|t| Tag::parse_flag(t).ok())
        .collect();
        let mut parts: Vec<&str> = accepted.iter().map(|t| t.version_part()).collect();
        parts.sort();
        parts.dedup();
        assert_eq!(parts.len(), accepted.len(), "{parts:?}");
        // Manifests keep reading whatever tag they name.
        assert!(Tag::parse("v2.27.5").is_ok());
    }

    /// The messages describe a tag's shape; none names a fixed release as an example.
    #[test]
    fn no_message_names_a_fixed_tag() {
        for e in [
            Tag::parse("").unwrap_err(),
            Tag::parse("-x").unwrap_err(),
            Tag::parse(".x").unwrap_err(),
            Tag::parse("a..b").unwrap_err(),
            Tag::parse("a b").unwrap_err(),
        ] {
            let text = e.to_string();
            assert!(!text.contains("2.27"), "{text}");
        }
    }

    #[test]
    fn hostile_tags_are_refused() {
        assert_eq!(Tag::parse(""), Err(TagError::Blank));
        assert_eq!(Tag::parse("  "), Err(TagError::Blank));
        assert!(matches!(Tag::parse("-x"), Err(TagError::LeadingDash(_))));
        assert!(matches!(
            Tag::parse("--upload-pack=x"),
            Err(TagError::BadChar { ch: '=', .. })
        ));
        assert!(matches!(Tag::parse("a..b"), Err(TagError::DotDot(_))));
        assert!(matches!(
            Tag::parse("../etc"),
            Err(TagError::BadChar { ch: '/', .. })
        ));
        assert!(matches!(
            Tag::parse("v2/x"),
            Err(TagError::BadChar { ch: '/', .. })
        ));
        assert!(matches!(
            Tag::parse("v2 x"),
            Err(TagError::BadChar { ch: ' ', .. })
        ));
        assert!(matches!(
            Tag::parse(".hidden"),
            Err(TagError::LeadingDot(_))
        ));
        assert!(matches!(
            Tag::parse(&"a".repeat(65)),
            Err(TagError::TooLong(_))
        ));
        // A huge tag is not echoed whole.
        let e = Tag::parse(&"a".repeat(10_000)).unwrap_err().to_string();
        assert!(e.len() < 250 && e.contains("10000 characters"), "{e}");
        let e = Tag::parse(&format!("{}$", "b".repeat(10_000)))
            .unwrap_err()
            .to_string();
        assert!(e.len() < 250, "{e}");
    }
}
