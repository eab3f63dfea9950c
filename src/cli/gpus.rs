//! `fdl gpus`.

use super::print_json;
use crate::gpu;
use anyhow::Result;
use serde_json::json;

pub(super) fn run(json_out: bool) -> Result<()> {
    let gpus = match gpu::query() {
        Ok(g) => g,
        // No GPU is an answer: an empty list, and why on stderr.
        Err(e @ (gpu::GpuError::NoGpu | gpu::GpuError::NoNvidiaSmi)) if json_out => {
            eprintln!("{e}");
            print_json(&json!({ "gpus": [], "archs": [] }));
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    if json_out {
        print_json(&json!({ "gpus": gpus, "archs": gpu::distinct_archs(&gpus) }));
    } else {
        print!("{}", gpu::table(&gpus));
    }
    Ok(())
}
