//! Preload lists, split exactly as glibc's `rtld.c` splits them.
//!
//! `LD_PRELOAD`: elements end at a space or a colon, with no quoting or escaping (ld.so(8));
//! empty elements are skipped, and so, silently, is an element of `PATH_MAX` (4096) bytes
//! or more. `/etc/ld.so.preload`: `#` starts a comment to the end of the line, and
//! elements end at spaces, tabs, newlines and colons. An element holding `/` is opened as
//! a path; a bare name is searched like a DT_NEEDED of the program.

use serde::Serialize;

/// glibc's `SECURE_PATH_LIMIT` (PATH_MAX): longer `LD_PRELOAD` elements are dropped.
pub const PATH_LIMIT: usize = 4096;

/// Where a preload element came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PreloadSource {
    LdPreload,
    EtcLdSoPreload,
}

impl std::fmt::Display for PreloadSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PreloadSource::LdPreload => "LD_PRELOAD",
            PreloadSource::EtcLdSoPreload => "/etc/ld.so.preload",
        })
    }
}

/// One element of a preload list, and whether the loader even tries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element {
    pub name: String,
    pub source: PreloadSource,
    /// Dropped before any attempt to load it, and why (glibc says nothing).
    pub dropped: Option<&'static str>,
}

/// `LD_PRELOAD`'s elements in order; empty ones are left out, as glibc leaves them out.
pub fn split_ld_preload(list: &str) -> Vec<Element> {
    list.split([' ', ':'])
        .filter(|e| !e.is_empty())
        .map(|e| Element {
            name: e.to_string(),
            source: PreloadSource::LdPreload,
            dropped: (e.len() >= PATH_LIMIT)
                .then_some("4096 bytes or longer: glibc drops such an element without a word"),
        })
        .collect()
}

/// `/etc/ld.so.preload`'s elements in order.
pub fn split_ld_so_preload(file: &str) -> Vec<Element> {
    file.lines()
        .map(|line| line.split('#').next().unwrap_or(""))
        .flat_map(|line| line.split([' ', '\t', ':']))
        .filter(|e| !e.is_empty())
        .map(|e| Element {
            name: e.to_string(),
            source: PreloadSource::EtcLdSoPreload,
            dropped: None,
        })
        .collect()
}

/// Whether `path` survives `LD_PRELOAD`'s splitting as one element: no space, no colon,
/// not empty, shorter than [`PATH_LIMIT`]. What fdl prints for `LD_PRELOAD` must pass.
pub fn is_one_element(path: &str) -> bool {
    !path.is_empty() && !path.contains([' ', ':']) && path.len() < PATH_LIMIT
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[Element]) -> Vec<&str> {
        v.iter().map(|e| e.name.as_str()).collect()
    }

    #[test]
    fn ld_preload_splits_at_spaces_and_colons_without_escapes() {
        let v = split_ld_preload("::/srv/flo dl/libnccl.so.2  :libx.so:'/a b'\\ c");
        assert_eq!(
            names(&v),
            ["/srv/flo", "dl/libnccl.so.2", "libx.so", "'/a", "b'\\", "c"]
        );
        assert!(split_ld_preload("").is_empty());
        assert!(split_ld_preload(" : ").is_empty());
        let long = "/x".repeat(PATH_LIMIT);
        assert!(split_ld_preload(&long)[0].dropped.is_some());
        assert!(split_ld_preload(&"/x".repeat(100))[0].dropped.is_none());
    }

    #[test]
    fn ld_so_preload_has_comments_and_whitespace() {
        let v = split_ld_so_preload("# a comment\n/lib/a.so\tlibb.so # tail\n:/c.so\n");
        assert_eq!(names(&v), ["/lib/a.so", "libb.so", "/c.so"]);
    }

    #[test]
    fn one_element_paths() {
        assert!(is_one_element(
            "/home/u/.cache/fdl/preload/v2.27.5/libnccl.so.2"
        ));
        assert!(!is_one_element("/srv/flo dl/libnccl.so.2"));
        assert!(!is_one_element("/srv/a:b/libnccl.so.2"));
        assert!(!is_one_element(""));
    }
}
