//! fdl: build, inspect and wire NCCL for libtorch-based training on mixed GPU generations.
//!
//! The data flow is one straight line: inputs (`project`, `libtorch`, `gpu`, `inspect`)
//! → a pure [`nccl::plan::BuildPlan`] → a backend (`docker`) → a transactional install
//! (`nccl::store`) → a report (`cli`). Lower modules never call higher ones.

pub mod arch;
pub mod cache;
pub mod cli;
pub mod cluster;
pub mod docker;
pub mod fsread;
pub mod gpu;
pub mod inspect;
pub mod libtorch;
pub mod loader;
pub mod lock;
pub mod native;
pub mod nccl;
pub mod paste;
pub mod process;
pub mod progress;
pub mod project;
pub mod step;
pub mod store;
pub mod txn;
pub mod version;
