//! NCCL builds: the tag, the plan, the install store and the build pipeline.

pub mod build;
pub mod only_funcs;
pub mod plan;
pub mod preload;
pub mod store;
pub mod tag;
pub mod tree;
pub mod verify;
