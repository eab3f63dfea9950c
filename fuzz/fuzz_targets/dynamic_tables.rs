//! A well-formed shared object (laid out by `fdl_synth::dso`) whose hash table and extra
//! dynamic tags come from the input (`Dso::from_fuzz_input` says how), so the fuzzer
//! spends its time inside the tables rather than on the ELF header: the SysV DT_HASH and
//! DT_GNU_HASH lookups and the symbol count they imply, DT_STRTAB/DT_SYMTAB/DT_VERSYM/
//! DT_VERNEED/DT_VERDEF and the relocation tags pointing anywhere, repeated tags. Through
//! `inspect_bytes` (the dynamic table reader), `analyze_bytes` and `exported_among_bytes`
//! (the loader model's lookup). Any panic, hang or out-of-bounds read is a finding.
#![no_main]
use fdl_synth::dso::{Dso, FUZZ_NAMES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(dso) = Dso::from_fuzz_input(data) else {
        return;
    };
    let bytes = dso.to_vec();
    if let Ok(ins) = fdl::inspect::inspect_bytes(&bytes) {
        let _ = serde_json::to_string(&ins);
    }
    if let Ok(found) = fdl::inspect::interpose::analyze_bytes(&bytes) {
        let _ = serde_json::to_string(&found);
    }
    let _ = fdl::inspect::interpose::exported_among_bytes(&bytes, &FUZZ_NAMES);
});
