//! Arbitrary bytes into the preload analysis: the dynamic table, .dynsym/.dynstr, the
//! hash tables that size .dynsym and answer the loader model's lookups, and the
//! relocation tables. Any panic, hang or out-of-bounds read is a finding.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(found) = fdl::inspect::interpose::analyze_bytes(data) {
        let _ = serde_json::to_string(&found);
    }
    let _ = fdl::inspect::interpose::exported_among_bytes(
        data,
        &["ncclGetVersion", "ncclCommInitRank", "ncclAllReduce", ""],
    );
});
