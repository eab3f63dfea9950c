//! fdl: build, inspect and wire NCCL for libtorch-based training on mixed GPU generations.
//!
//! The data flow is one straight line: inputs (`project`, `libtorch`, `gpu`, `inspect`,
//! `loader`) → a pure [`nccl::plan::BuildPlan`] ([`pipeline::prepare`]) → a backend
//! (`docker`, `native`, or an entry of the machine-wide `store`) → a transactional install
//! (`nccl::store`) → a typed [`pipeline::Report`] that `cli` renders.
//!
//! The modules stand on floors, and a module imports only from its floor or below:
//! 0, the ground floor, shared by all (`text`, `paste`, `digest`, `fsread`, `fswrite`, `cache`,
//! `process`, `lock`, `txn`, `progress`, `step`, `version`, `arch`); 1, facts about this
//! machine and its build store (`gpu`, `inspect`, `loader`, `project`, `libtorch`,
//! `store`); 2, `nccl`; 3, the backends `docker` and `native`; 4, `pipeline` and
//! `launch`; 5,
//! `cluster`; 6, `cli`, which nothing imports. No file imports one that imports it back.
//! `tests/architecture.rs` holds both rules against the table in ARCHITECTURE.md.

pub mod arch;
pub mod cache;
pub mod cli;
pub mod cluster;
pub mod context;
pub mod digest;
pub mod docker;
pub mod fsread;
pub mod fswrite;
pub mod gpu;
pub mod inspect;
pub mod launch;
pub mod libtorch;
pub mod loader;
pub mod lock;
pub mod native;
pub mod nccl;
pub mod paste;
pub mod pipeline;
pub mod process;
pub mod progress;
pub mod project;
pub mod step;
pub mod store;
pub mod text;
pub mod txn;
pub mod version;
