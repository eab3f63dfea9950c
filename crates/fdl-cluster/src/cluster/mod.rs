//! Many hosts, one NCCL: the hosts (floDl's cluster file, reached over the user's own
//! OpenSSH, or the nodes of a Slurm allocation, reached through srun), and what each says
//! about itself.

pub mod bootstrap;
pub mod config;
pub mod host;
pub mod plan;
pub mod ps;
pub mod receive;
pub mod rehearse;
pub mod ship;
pub mod slurm;
pub mod ssh;
pub mod status;
pub mod transport;

/// Runs `f` on every item, at most `parallel` at once, calling `on_done` as each ends;
/// the results keep the items' order. Hosts are slow and independent: one that hangs
/// holds only its own thread.
pub fn in_parallel<I: Sync, T: Send>(
    items: &[I],
    parallel: usize,
    f: impl Fn(&I) -> T + Sync,
    on_done: &(dyn Fn(&T) + Sync),
) -> Vec<T> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let results: std::sync::Mutex<Vec<Option<T>>> =
        std::sync::Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..parallel.clamp(1, items.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(item) = items.get(i) else { break };
                let r = f(item);
                on_done(&r);
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .flatten()
        .collect()
}
