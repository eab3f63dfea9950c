//! fdl's floor 3, the build backends: `docker` and `native` each turn a plan into an
//! install tree in staging.

pub mod docker;
pub mod native;

// The floors below, under the names the modules have always used (`crate::nccl`).
use fdl_base::{
    arch, cache, digest, eprintln_safe, fsread, fswrite, lock, process, progress, step, text, txn,
    version,
};
use fdl_builds::nccl;
use fdl_facts::project;
