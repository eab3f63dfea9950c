//! `fdl gpus`.

use super::print_json;
use crate::gpu;
use anyhow::Result;
use serde_json::json;

pub(super) fn run(json_out: bool) -> Result<()> {
    let gpus = gpu::query()?;
    if json_out {
        print_json(&json!({ "gpus": gpus, "archs": gpu::distinct_archs(&gpus) }));
    } else {
        print!("{}", gpu::table(&gpus));
    }
    Ok(())
}
