//! Arbitrary files through the loader model (`fdl::loader::which_nccl_in_dir`): the
//! input is `[u32 LE length of A][A][B]`, A laid out as `libtorch_cuda.so` (the library
//! asked about) and B as `libdep.so` beside it, in a closed environment. Covers the
//! dynamic table as the loader reads it (DT_NEEDED, DT_RPATH/DT_RUNPATH with `$ORIGIN`,
//! the table tags that must lie in the file, the caps), the link map's searches, the
//! binding walk with its hash-table lookups (DT_HASH, DT_GNU_HASH) in B, and the answer's
//! JSON. Any panic, hang or out-of-bounds read is a finding.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::OnceLock;

fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("fdl-fuzz-loader-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((len, rest)) = data.split_first_chunk::<4>() else {
        return;
    };
    let len = (u32::from_le_bytes(*len) as usize).min(rest.len());
    let (a, b) = rest.split_at(len);
    if let Ok(w) = fdl::loader::which_nccl_in_dir(
        dir(),
        &[("libtorch_cuda.so", a), ("libdep.so", b)],
    ) {
        let _ = serde_json::to_string(&w);
    }
});
