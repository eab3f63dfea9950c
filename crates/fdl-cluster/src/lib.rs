//! fdl's floor 5, many hosts (`cluster`): the cluster file, the OpenSSH and Slurm
//! transports, status, ps, ship, and the worker side.

pub mod cluster;

// The floors below, under the names the modules have always used (`crate::pipeline`).
use fdl_base::{arch, cache, context, digest, fsread, fswrite, lock, process, step, text, version};
use fdl_builds::nccl;
use fdl_facts::{gpu, inspect, libtorch, loader, store};
use fdl_pipeline::pipeline;
