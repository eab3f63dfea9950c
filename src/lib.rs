//! fdl: build, inspect and wire NCCL for libtorch-based training on mixed GPU generations.
//!
//! The data flow is one straight line: inputs (`project`, `libtorch`, `gpu`, `inspect`)
//! → a pure [`nccl::plan::BuildPlan`] → a backend (`docker`) → a transactional install
//! (`nccl::store`) → a report (`cli`). Lower modules never call higher ones.

pub mod arch;
pub mod inspect;
pub mod version;
