//! Many hosts, one NCCL: floDl's cluster file, the hosts reached over the user's own
//! OpenSSH, and what each says about itself.

pub mod config;
pub mod host;
pub mod ssh;
pub mod status;
