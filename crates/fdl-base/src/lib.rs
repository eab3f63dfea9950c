//! fdl's ground floor: terminal-safe text, quoting for the parser that reads a pasted line
//! (`paste`), digests, link-safe reads and writes, fdl's cache, child processes, locks,
//! transactions, progress, versions and GPU archs. Every floor above may use it; it knows
//! nothing of NCCL builds, and Cargo holds that: this crate depends on no other of fdl's.

pub mod arch;
pub mod cache;
pub mod context;
pub mod digest;
pub mod fsread;
pub mod fswrite;
pub mod lock;
pub mod paste;
pub mod process;
pub mod progress;
pub mod step;
pub mod text;
pub mod txn;
pub mod version;
