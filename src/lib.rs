//! fdl: build, inspect and wire NCCL for libtorch-based training on mixed GPU generations.
//!
//! The data flow is one straight line: inputs (`project`, `libtorch`, `gpu`, `inspect`,
//! `loader`) → a pure [`nccl::plan::BuildPlan`] ([`pipeline::prepare`]) → a backend
//! (`docker`, `native`, or an entry of the machine-wide `store`) → a transactional install
//! (`nccl::store`) → a typed [`pipeline::Report`] that `cli` renders.
//!
//! The floors are crates, and a crate depends only on those below it, so an import up a
//! floor does not compile: 0 `fdl-base`, the ground floor; 1 `fdl-facts`, facts about this
//! machine and its build store; 2 `fdl-builds` (`nccl`); 3 `fdl-backends` (`docker`,
//! `native`); 4 `fdl-pipeline` (`pipeline`, `launch`); 5 `fdl-cluster`; 6 this crate,
//! `cli`, which nothing imports. This crate names every module of the floors below at its
//! root, so the binary, the tests and the benchmarks reach them as `fdl::loader` and so on.
//! ARCHITECTURE.md holds the table; `tests/it/architecture.rs` checks it against Cargo.

pub mod cli;

pub use fdl_backends::{docker, native};
pub use fdl_base::{
    arch, cache, context, digest, eprint_safe, eprintln_safe, fsread, fswrite, lock, paste,
    process, progress, step, text, txn, version,
};
pub use fdl_builds::nccl;
pub use fdl_cluster::cluster;
pub use fdl_facts::{gpu, inspect, libtorch, loader, project, store};
pub use fdl_pipeline::{launch, pipeline};
