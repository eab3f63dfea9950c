//! fdl's floor 2: NCCL builds as values (`nccl`): the tag, the `BuildPlan`, what a backend
//! is, a build's name and every name derived from it, a project's builds and their install
//! transaction, tree checks and verification, and which build a wiring command means.

pub mod nccl;

// The floors below, under the names the modules have always used (`crate::inspect`).
use fdl_base::{
    arch, cache, context, digest, fsread, fswrite, lock, process, progress, step, text, txn,
    version,
};
use fdl_facts::{gpu, inspect, libtorch, loader, project, store};
