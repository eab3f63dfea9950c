//! Arbitrary bytes as what the host's loader printed in trace mode: its list (stdout),
//! its errors (stderr) and its `LD_DEBUG=bindings` stream, split at the first two NUL
//! bytes. glibc writes paths raw, so a file name controls this text. Whatever it holds,
//! fdl reads an answer or a cut trace, never a panic; a line without the loader's pid
//! is never read as a binding; and the sentence fdl prints holds no control character.
#![no_main]
use fdl::loader::witness::{read_output, Kind};
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |b| *b == 0);
    let stdout = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let stderr = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let debug = parts.next().unwrap_or_default();
    let w = read_output(
        Path::new("/fdl-fuzz/prog"),
        &stdout,
        &stderr,
        "4242",
        debug,
        Path::new("/fdl-fuzz"),
    );
    let summary = w.summary();
    assert!(!summary.chars().any(char::is_control), "{summary:?}");
    // A stream any of whose lines lacks the pid is no answer.
    let foreign = String::from_utf8_lossy(debug)
        .split_inclusive('\n')
        .any(|l| !l.trim_start().starts_with("4242:"));
    if foreign {
        assert_eq!(w.kind(), Kind::Cut, "{summary}");
    }
});
