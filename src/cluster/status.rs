//! `fdl cluster status`: every worker's own report, fetched in parallel over SSH, then
//! the verdicts that decide whether a multi-host run can start: one NCCL version
//! everywhere (NCCL refuses to form a communicator otherwise, patch included), code for
//! every GPU, drivers new enough for that NCCL's CUDA, every symbol each libtorch needs,
//! and a preload that takes effect where one is set.

use super::config::{Cluster, Worker};
use super::host::{Facts, HostReport, REPORT_SCHEMA};
use super::ssh::{self, Transport};
use crate::cache::sha256_file;
use crate::version::CudaVersion;
use anyhow::{anyhow, bail, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What the controller knows of one worker.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerStatus {
    pub host: String,
    pub target: String,
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report: Option<HostReport>,
    /// Why there is no report: the SSH failure, or what the remote side said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The controller's fdl was copied there for this query.
    pub shipped_fdl: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

/// The controller's own fdl, to run on workers that lack a compatible one.
#[derive(Debug, Clone)]
pub struct OwnBinary {
    pub path: PathBuf,
    pub sha256: String,
}

impl OwnBinary {
    pub fn current() -> Result<OwnBinary> {
        let path = std::env::current_exe()?;
        Ok(OwnBinary {
            sha256: sha256_file(&path)?,
            path,
        })
    }

    /// Where a worker keeps this binary: named by its digest, so two fdl versions never
    /// share a file and a present file is known to be this one.
    pub(super) fn remote_path_expr(&self) -> String {
        format!(
            "\"${{XDG_CACHE_HOME:-$HOME/.cache}}/fdl/bin/fdl-{}\"",
            &self.sha256[..16]
        )
    }
}

/// Exit codes of the remote script that are fdl's, not the command's.
pub(super) const NO_PATH: i32 = 97;
const NO_FDL: i32 = 96;
const BAD_UPLOAD: i32 = 95;

/// The remote command that prints the worker's report: from its checkout, with the
/// controller's fdl when the worker holds it, else the worker's own.
fn self_script(w: &Worker, own: &OwnBinary) -> String {
    let mut args = vec!["cluster", "self", "--json"];
    if let Some(arch) = &w.arch {
        args.extend(["--arch", arch]);
    }
    if let Some(pre) = w.ld_preload() {
        args.extend(["--ld-preload", pre]);
    }
    format!(
        "cd -- {} 2>/dev/null || exit {NO_PATH}; b={}; \
         if [ -x \"$b\" ]; then f=$b; elif command -v fdl >/dev/null 2>&1; then f=fdl; else exit {NO_FDL}; fi; \
         exec \"$f\" --root \"$PWD\" {}",
        crate::step::single_quote(&w.path),
        own.remote_path_expr(),
        ssh::words(&args)
    )
}

/// The worker's report, shipping the controller's fdl first when the worker has none or
/// one that does not speak this report's schema.
pub fn query(t: &Transport, w: &Worker, own: &OwnBinary, timeout: Duration) -> WorkerStatus {
    let mut status = WorkerStatus {
        host: w.host.clone(),
        target: w.ssh.target.clone(),
        path: w.path.clone(),
        report: None,
        error: None,
        shipped_fdl: false,
    };
    let attempt = |t: &Transport| -> Result<Result<HostReport, String>> {
        let out = t.run(w, &self_script(w, own), None, timeout)?;
        if let Some(why) = ssh::connection_failure(&out) {
            bail!("unreachable over SSH: {why}");
        }
        match out.status.code() {
            Some(NO_PATH) => bail!(
                "its path {} does not exist there (or is not a directory it can enter): fix `path:` or create the checkout",
                w.path
            ),
            Some(NO_FDL) => return Ok(Err("no fdl there".into())),
            _ => {}
        }
        let text = String::from_utf8_lossy(&out.stdout);
        match serde_json::from_str::<HostReport>(text.trim()) {
            Ok(r) if r.schema == REPORT_SCHEMA => Ok(Ok(r)),
            Ok(r) => Ok(Err(format!("its fdl speaks report schema {}", r.schema))),
            Err(_) => Ok(Err(format!(
                "its fdl gave no report ({})",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("no message")
            ))),
        }
    };
    let result = attempt(t).and_then(|first| match first {
        Ok(r) => Ok(r),
        Err(why) => {
            ship_binary(t, w, own, timeout)
                .map_err(|e| anyhow!("{why}, and fdl could not be shipped: {e:#}"))?;
            status.shipped_fdl = true;
            match attempt(t)? {
                Ok(r) => Ok(r),
                Err(again) => Err(anyhow!("{why}; after shipping fdl: {again}")),
            }
        }
    });
    match result {
        Ok(r) => status.report = Some(r),
        Err(e) => status.error = Some(format!("{e:#}")),
    }
    status
}

/// Copies the controller's fdl to the worker's cache, checked by sha256 there before it
/// is renamed into place. A worker of another CPU or libc is refused: the binary would
/// not run there.
pub(super) fn ship_binary(
    t: &Transport,
    w: &Worker,
    own: &OwnBinary,
    timeout: Duration,
) -> Result<()> {
    let out = t.run(
        w,
        "uname -m; getconf GNU_LIBC_VERSION 2>/dev/null || echo 'no-glibc'",
        None,
        timeout,
    )?;
    if let Some(why) = ssh::connection_failure(&out) {
        bail!("unreachable over SSH: {why}");
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let machine = lines.next().unwrap_or("").trim();
    let libc = lines.next().unwrap_or("").trim();
    runs_there(
        machine,
        libc,
        std::env::consts::ARCH,
        local_glibc().as_deref(),
    )?;
    let dest = own.remote_path_expr();
    let script = format!(
        "d=$(dirname {dest}) && mkdir -p \"$d\" && tmp=\"$d/.incoming-$$\" && cat > \"$tmp\" && \
         if [ \"$(sha256sum < \"$tmp\" | cut -d' ' -f1)\" = {sha} ]; then chmod 755 \"$tmp\" && mv -f \"$tmp\" {dest}; \
         else rm -f \"$tmp\"; exit {BAD_UPLOAD}; fi",
        sha = crate::step::single_quote(&own.sha256),
    );
    let out = t.run(w, &script, Some(&own.path), Duration::from_secs(600))?;
    if let Some(why) = ssh::connection_failure(&out) {
        bail!("unreachable over SSH: {why}");
    }
    match out.status.code() {
        Some(0) => Ok(()),
        Some(BAD_UPLOAD) => bail!("the copy arrived damaged (sha256 differs) and was deleted"),
        _ => bail!(
            "the copy failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    }
}

/// Whether this fdl runs on a host whose `uname -m` is `machine` and whose
/// `getconf GNU_LIBC_VERSION` is `libc`: the same CPU, and a glibc at least as new as the
/// one it runs on here (its symbol versions may need it).
fn runs_there(machine: &str, libc: &str, ours: &str, our_glibc: Option<&str>) -> Result<()> {
    if machine != ours {
        bail!("it is a {machine} host and this fdl is built for {ours}: install fdl there for {machine}");
    }
    match (libc.strip_prefix("glibc "), our_glibc) {
        (Some(theirs), Some(ours)) if version_at_least(theirs, ours) => Ok(()),
        (Some(theirs), Some(ours)) => bail!(
            "it has glibc {theirs}, older than the {ours} this fdl runs with: install fdl there"
        ),
        (Some(_), None) => Ok(()),
        (None, _) => bail!("it has no GNU libc ({libc}); this fdl needs one: install fdl there"),
    }
}

fn local_glibc() -> Option<String> {
    // SAFETY: gnu_get_libc_version returns a static NUL-terminated string.
    let v = unsafe { std::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) };
    v.to_str().ok().map(str::to_string)
}

fn version_at_least(have: &str, need: &str) -> bool {
    let parse = |s: &str| -> Vec<u32> { s.split('.').filter_map(|p| p.parse().ok()).collect() };
    parse(have) >= parse(need)
}

/// Every worker, `parallel` at a time; the order of the result is the file's.
pub fn query_all(
    cluster: &Cluster,
    t: &Transport,
    own: &OwnBinary,
    timeout: Duration,
    parallel: usize,
    on_done: &(dyn Fn(&WorkerStatus) + Sync),
) -> Vec<WorkerStatus> {
    super::in_parallel(
        &cluster.workers,
        parallel,
        |w| query(t, w, own, timeout),
        on_done,
    )
}

/// The verdicts for the cluster, in the order status prints them.
pub fn verdicts(workers: &[WorkerStatus]) -> Vec<Verdict> {
    let mut out = Vec::new();
    let down: Vec<String> = workers
        .iter()
        .filter_map(|w| w.error.as_ref().map(|e| format!("{}: {e}", w.host)))
        .collect();
    out.push(Verdict {
        name: "reach",
        ok: down.is_empty(),
        detail: if down.is_empty() {
            format!("all {} workers answered", workers.len())
        } else {
            down.join("; ")
        },
    });
    let reports: Vec<(&str, &HostReport)> = workers
        .iter()
        .filter_map(|w| w.report.as_ref().map(|r| (w.host.as_str(), r)))
        .collect();

    // skew: one effective NCCL version, exactly.
    let mut versions: Vec<(String, &str)> = Vec::new();
    let mut unknown = Vec::new();
    for (host, r) in &reports {
        match &r.effective {
            Facts::Known(n) => versions.push((n.version.clone(), host)),
            Facts::Unknown(why) => unknown.push(format!("{host}: {why}")),
        }
    }
    let mut distinct: Vec<&String> = versions.iter().map(|(v, _)| v).collect();
    distinct.sort();
    distinct.dedup();
    out.push(Verdict {
        name: "skew",
        ok: distinct.len() <= 1 && unknown.is_empty(),
        detail: if !unknown.is_empty() {
            format!("effective NCCL unknown on {}", unknown.join("; "))
        } else if distinct.len() <= 1 {
            format!(
                "every worker loads NCCL {}",
                distinct.first().map(|s| s.as_str()).unwrap_or("?")
            )
        } else {
            format!(
                "NCCL versions differ, so NCCL will refuse to form a communicator: {}",
                versions
                    .iter()
                    .map(|(v, h)| format!("{h} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
    });

    // coverage: every GPU on every host.
    let uncovered: Vec<String> = reports
        .iter()
        .flat_map(|(host, r)| {
            r.coverage
                .iter()
                .filter(|c| !c.covered)
                .map(move |c| format!("{host} GPU {} ({})", c.index, c.arch))
        })
        .collect();
    let no_gpus: Vec<String> = reports
        .iter()
        .filter(|(_, r)| r.gpus.known().is_none())
        .map(|(h, r)| match &r.gpus {
            Facts::Unknown(why) => format!("{h}: {why}"),
            Facts::Known(_) => String::new(),
        })
        .collect();
    out.push(Verdict {
        name: "coverage",
        ok: uncovered.is_empty() && no_gpus.is_empty(),
        detail: if !uncovered.is_empty() {
            format!(
                "the effective NCCL has no code for {}",
                uncovered.join(", ")
            )
        } else if !no_gpus.is_empty() {
            format!("GPUs unknown on {}", no_gpus.join("; "))
        } else {
            "every GPU has code in its host's NCCL".into()
        },
    });

    // driver: each host's driver runs the CUDA its effective NCCL was built with.
    let mut bad = Vec::new();
    let mut notes = Vec::new();
    for (host, r) in &reports {
        let (Some(d), Some(n)) = (r.driver.known(), r.effective.known()) else {
            if let Facts::Unknown(why) = &r.driver {
                bad.push(format!("{host}: driver unknown ({why})"));
            }
            continue;
        };
        let (Some(runs), Some(built)) = (d.cuda, n.cuda) else {
            continue;
        };
        match driver_runs(runs, built) {
            DriverFit::Yes => {}
            DriverFit::MinorCompat => notes.push(format!(
                "{host}: driver {} (CUDA {runs}) runs NCCL's CUDA {built} by minor-version compatibility",
                d.version
            )),
            DriverFit::No => bad.push(format!(
                "{host}: driver {} runs CUDA up to {runs}, but its NCCL was built with CUDA {built}: update the driver",
                d.version
            )),
        }
    }
    out.push(Verdict {
        name: "driver",
        ok: bad.is_empty(),
        detail: if bad.is_empty() {
            if notes.is_empty() {
                "every driver runs its NCCL's CUDA".into()
            } else {
                notes.join("; ")
            }
        } else {
            bad.join("; ")
        },
    });

    // symbols: what each libtorch imports, its effective NCCL exports.
    let missing: Vec<String> = reports
        .iter()
        .filter(|(_, r)| !r.missing_symbols.is_empty())
        .map(|(h, r)| format!("{h} lacks {}", r.missing_symbols.join(", ")))
        .collect();
    out.push(Verdict {
        name: "symbols",
        ok: missing.is_empty(),
        detail: if missing.is_empty() {
            "each effective NCCL exports every nccl* function its libtorch imports".into()
        } else {
            missing.join("; ")
        },
    });

    // bridge: where a preload is set, it must take effect.
    let preloading = reports
        .iter()
        .filter(|(_, r)| r.effective.known().is_some_and(|n| n.linkage == "preload"))
        .count();
    let ineffective: Vec<String> = reports
        .iter()
        .filter(|(_, r)| r.effective.known().is_some_and(|n| n.linkage == "preload"))
        .filter_map(|(h, r)| {
            let lt = r.libtorch.known()?;
            match &lt.bridge {
                Facts::Known(b) if !b.takes_effect => Some(format!("{h}: {}", b.why)),
                Facts::Unknown(why) => Some(format!("{h}: unknown ({why})")),
                _ => None,
            }
        })
        .collect();
    out.push(Verdict {
        name: "bridge",
        ok: ineffective.is_empty(),
        detail: if preloading == 0 {
            "no worker sets LD_PRELOAD: each runs its libtorch's own NCCL".into()
        } else if ineffective.is_empty() {
            format!("the LD_PRELOAD of {preloading} worker(s) takes effect")
        } else {
            format!(
                "LD_PRELOAD is set but replaces nothing, so the bundled NCCL still runs: {}",
                ineffective.join("; ")
            )
        },
    });
    out
}

#[derive(Debug, PartialEq, Eq)]
pub enum DriverFit {
    Yes,
    /// Same major, older minor: CUDA's minor-version compatibility runs it.
    MinorCompat,
    No,
}

pub fn driver_runs(driver: CudaVersion, built: CudaVersion) -> DriverFit {
    if driver.major_minor() >= built.major_minor() {
        DriverFit::Yes
    } else if driver.major == built.major {
        DriverFit::MinorCompat
    } else {
        DriverFit::No
    }
}

/// A path a worker's report names, shown relative to its checkout when inside it.
pub fn short(path: &Path, root: &str) -> String {
    path.strip_prefix(root)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binary_goes_only_where_it_runs() {
        assert!(runs_there("x86_64", "glibc 2.36", "x86_64", Some("2.36")).is_ok());
        assert!(runs_there("x86_64", "glibc 2.39", "x86_64", Some("2.36")).is_ok());
        let e = runs_there("aarch64", "glibc 2.39", "x86_64", Some("2.36")).unwrap_err();
        assert!(e
            .to_string()
            .contains("it is a aarch64 host and this fdl is built for x86_64"));
        let e = runs_there("x86_64", "glibc 2.31", "x86_64", Some("2.36")).unwrap_err();
        assert!(e.to_string().contains("glibc 2.31, older than the 2.36"));
        // 2.4 is older than 2.36: versions compare by number, not text.
        assert!(runs_there("x86_64", "glibc 2.4", "x86_64", Some("2.36")).is_err());
        let e = runs_there("x86_64", "no-glibc", "x86_64", Some("2.36")).unwrap_err();
        assert!(e.to_string().contains("no GNU libc (no-glibc)"));
    }

    #[test]
    fn a_driver_runs_its_cuda_or_an_older_minor_of_the_same_major() {
        let v = |s: &str| s.parse::<CudaVersion>().unwrap();
        assert_eq!(driver_runs(v("12.8"), v("12.8")), DriverFit::Yes);
        assert_eq!(driver_runs(v("13.0"), v("12.8")), DriverFit::Yes);
        assert_eq!(driver_runs(v("12.2"), v("12.8")), DriverFit::MinorCompat);
        assert_eq!(driver_runs(v("12.8"), v("13.0")), DriverFit::No);
    }
}
