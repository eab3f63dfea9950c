//! fdl's floor 4: the build's straight line (`pipeline`: infer, plan, store key, execute,
//! verify, install, report), and a job run with a build preloaded and watched to its end
//! (`launch`).

pub mod launch;
pub mod pipeline;

// The floors below, under the names the modules have always used (`crate::docker`).
use fdl_backends::{docker, native};
use fdl_base::{arch, cache, context, fswrite, lock, process, progress, step, text, version};
use fdl_builds::nccl;
use fdl_facts::{gpu, inspect, libtorch, loader, project, store};
