//! Arbitrary text as fdl.yml and fdl.cluster.yml: YAML parsing, the deep merge, and the
//! field checks. A wrong file must be an error naming where, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    // The first NUL byte, if any, splits the input into the base file and the overlay.
    let (base, overlay) = match text.split_once('\0') {
        Some((b, o)) => (Some(b.to_string()), o.to_string()),
        None => (None, text.to_string()),
    };
    let mut sources = Vec::new();
    if let Some(b) = base {
        sources.push((PathBuf::from("fdl.yml"), b));
    }
    sources.push((PathBuf::from("fdl.cluster.yml"), overlay));
    if let Err(e) = fdl::cluster::config::parse(&sources) {
        let _ = e.to_string();
    }
});
