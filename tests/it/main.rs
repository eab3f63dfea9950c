//! The integration tests, one binary: each file of the old `tests/` is a module here, so
//! the crate and the shared fixtures compile once, and every test runs in one pool of
//! threads, the Docker, sshd and Slurm tests beside the quick ones. `cargo test --test it
//! MODULE::` runs one file's tests. Three stay binaries of their own: `inspect_rss` and
//! `loader_bounds` measure the process's own peak memory, and `loader_matrix` makes each
//! of its cases a trial of its own (libtest-mimic's harness).

#[path = "../cluster_fixture/mod.rs"]
mod cluster_fixture;
#[path = "../common/mod.rs"]
mod common;
#[path = "../loader_fixture/mod.rs"]
mod loader_fixture;
#[path = "../native_fixture/mod.rs"]
mod native_fixture;
#[path = "../slurm_fixture/mod.rs"]
mod slurm_fixture;

mod architecture;
mod ci_setup;
mod cli_build_plan;
mod cli_cluster;
mod cli_inspect;
mod cli_libtorch_add;
mod cli_libtorch_gpus;
mod cli_manage;
mod cluster_hosts;
mod cluster_peer;
mod cluster_ps;
mod cluster_rehearse;
mod cluster_slurm;
mod cluster_status;
mod doc_examples;
mod docker_backend;
mod docker_offline;
mod first_hour;
mod fuzz_seeds;
mod hints;
mod hostile_fs;
mod inspect_api;
mod inspect_oracle;
mod inspect_resolve;
mod interpose;
mod json_shapes;
mod launch;
mod loader_env;
mod manifests;
mod native_backend;
mod native_nvcc;
mod plugins;
mod project_root;
mod python_model;
mod python_process;
mod python_witness;
mod robustness;
mod running;
mod store;
mod surface;
mod torch113;
mod wheel;
mod witness;
