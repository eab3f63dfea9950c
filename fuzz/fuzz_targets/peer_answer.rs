//! Arbitrary bytes as a worker's answer to `fdl cluster self --json`: the banner check,
//! the `HostReport` parser, the verdicts that compare reports, and the escaping of every
//! string before it reaches a terminal. A hostile worker must get an error or a verdict,
//! never a panic, and nothing it sends may reach the terminal raw.
#![no_main]
use fdl::cluster::host::HostReport;
use fdl::cluster::status::{verdicts, WorkerStatus};
use libfuzzer_sys::fuzz_target;

fn is_raw(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fuzz_target!(|data: &[u8]| {
    if let Some(why) = fdl::cluster::ssh::banner(data) {
        assert!(!why.chars().any(is_raw), "{why:?}");
    }
    let text = String::from_utf8_lossy(data);
    let Ok(report) = serde_json::from_str::<HostReport>(text.trim()) else {
        return;
    };
    let worker = |host: &str, report: Option<HostReport>| WorkerStatus {
        host: host.into(),
        target: host.into(),
        path: "/w".into(),
        report,
        error: None,
        unreached: None,
        shipped_fdl: false,
        ld_preload: None,
    };
    // The report against itself and against a worker that did not answer.
    let workers = [
        worker("a", Some(report.clone())),
        worker("b", Some(report)),
        WorkerStatus {
            error: Some(text.chars().take(64).collect()),
            ..worker("c", None)
        },
    ];
    for v in verdicts(&workers) {
        let shown = fdl::text::clean(&v.detail);
        assert!(!shown.chars().any(|c| is_raw(c) || c == '\n'), "{shown:?}");
    }
    let json = serde_json::to_string(&workers[0]).expect("a report serializes");
    let safe = fdl::text::terminal_safe(&json);
    assert!(!safe.chars().any(is_raw), "{safe:?}");
});
