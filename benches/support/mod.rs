//! What the benchmarks share: running a child and reading its own resource use.

use std::process::Command;
use std::time::{Duration, Instant};

/// What one child cost: wall time, its own rusage, and its wait status.
pub struct Reaped {
    pub wall: Duration,
    pub status: libc::c_int,
    pub rusage: libc::rusage,
}

/// Spawns `cmd` (its stdio set by the caller) and reaps it with `wait4`, which reports the
/// child's own peak RSS and CPU time (a `getrusage(RUSAGE_CHILDREN)` would mix runs).
pub fn spawn_and_reap(cmd: &mut Command) -> Result<Reaped, String> {
    let start = Instant::now();
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: a zeroed rusage is a valid value for wait4 to overwrite.
    let mut rusage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `pid` is our own unreaped child; both pointers are to live locals.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut rusage) };
        if r == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(format!("wait4 failed: {e}"));
        }
    }
    let wall = start.elapsed();
    // Reaped above; dropping `Child` neither waits nor kills.
    drop(child);
    Ok(Reaped {
        wall,
        status,
        rusage,
    })
}
