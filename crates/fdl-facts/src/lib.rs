//! fdl's floor 1, facts about this machine: its GPUs (`gpu`), what a library holds
//! (`inspect`), what the loader would bind and what a running process maps (`loader`), the
//! project and its libtorch variants, and the machine-wide build store (`store`), which is
//! handed typed keys and trees and never learns what a plan is.
//!
//! Inside the crate, `loader` stands on `inspect` and never the other way round
//! (`tests/it/architecture.rs` checks that no module here imports one that imports it back).

pub mod gpu;
pub mod inspect;
pub mod libtorch;
pub mod loader;
pub mod project;
pub mod store;

// The ground floor, under the names the modules have always used (`crate::text`).
use fdl_base::{
    arch, cache, context, digest, fsread, fswrite, lock, paste, process, text, txn, version,
};
