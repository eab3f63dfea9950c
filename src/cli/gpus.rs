//! `fdl gpus`.

use super::common::print_json;
use crate::gpu;
use anyhow::{anyhow, Result};
use serde_json::json;

pub(super) fn run(json_out: bool) -> Result<()> {
    let gpus = match gpu::query() {
        Ok(g) => g,
        // No GPU is an answer, in text as in JSON: exit 0, an empty list, and why.
        Err(e @ (gpu::GpuError::NoGpu | gpu::GpuError::NoNvidiaSmi)) => {
            if json_out {
                crate::eprintln_safe!("{e}");
                print_json(&json!({ "gpus": [], "archs": [] }));
            } else {
                outln!("No NVIDIA GPU here: {e}");
            }
            return Ok(());
        }
        // An old driver: the GPUs are there, their architectures unknown. The build
        // commands have a way round it, which this command can only name.
        Err(e @ gpu::GpuError::NoComputeCap { .. }) => {
            return Err(anyhow!(
                "{e}.\nUntil then, {} on the commands that take it (`fdl nccl build`, `fdl cluster plan`, `fdl inspect`)",
                gpu::ARCHS_HINT
            ))
        }
        Err(e) => return Err(e.into()),
    };
    if json_out {
        print_json(&json!({ "gpus": gpus, "archs": gpu::distinct_archs(&gpus) }));
    } else {
        out!("{}", gpu::table(&gpus));
    }
    Ok(())
}
