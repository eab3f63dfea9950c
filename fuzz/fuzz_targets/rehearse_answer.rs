//! Arbitrary bytes as every worker's answers to `fdl cluster rehearse`: the first line as
//! the bootstrap answer (`cluster bootstrap-self --json`), the rest as the reach answer
//! (`cluster reach-self --json`), through the real controller over a canned transport.
//! A hostile worker must get a finding or an error, never a panic, and nothing it sends
//! may reach a finding's words raw.
#![no_main]
use libfuzzer_sys::fuzz_target;

fn is_raw(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fuzz_target!(|data: &[u8]| {
    let r = fdl::cluster::rehearse::canned_bytes(data);
    for f in &r.findings {
        for text in [f.full(), f.short()] {
            assert!(!text.chars().any(is_raw), "{text:?}");
        }
    }
    let _ = r.state();
    let _ = serde_json::to_string(&r).expect("a rehearsal serializes");
});
