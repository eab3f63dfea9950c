//! NCCL builds: the tag, the plan, what a backend is, the install store of a project
//! (`libtorch/nccl/builds/`), its tree checks and verification. The pipeline that runs a
//! plan is `pipeline`, on a floor above this one.

pub mod backend;
pub mod files;
pub mod finding;
pub mod image;
pub mod name;
pub mod only_funcs;
pub mod pick;
pub mod plan;
pub mod preload;
pub mod store;
pub mod tag;
pub mod tree;
pub mod verify;
