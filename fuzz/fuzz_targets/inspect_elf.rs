//! Arbitrary bytes through the whole in-memory inspection path: ELF tables, dynamic
//! table, self-id scan, fatbin walk (including the LZ4 prefix decoder) and coverage.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(ins) = fdl::inspect::inspect_bytes(data) {
        for gpu in [fdl::arch::Arch::new(9, 0), fdl::arch::Arch::new(12, 0)] {
            let _ = fdl::inspect::coverage(&ins.gpu_code, gpu);
        }
        // The JSON report must always serialize.
        serde_json::to_string(&ins).expect("inspection serializes");
    }
});
