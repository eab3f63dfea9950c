//! The one NCCL build for a cluster, from the workers' reports: the tag of the highest
//! NCCL their libtorch variants bundle, the union of their GPU architectures, and a CUDA
//! every driver runs. The result feeds the same [`BuildPlan`](crate::nccl::plan) that
//! `fdl nccl build` makes, so `cluster plan` prints what `nccl build --dry-run` would.

use super::host::Facts;
use super::status::{driver_runs, DriverFit, WorkerStatus};
use crate::arch::Arch;
use crate::nccl::finding::Finding;
use crate::nccl::plan::{ArchOrigin, HostValue, TagOrigin};
use crate::nccl::tag::Tag;
use crate::pipeline::{CheckedFlags, Inferred};
use crate::text::clean;
use crate::version::{CudaVersion, NcclVersion};
use anyhow::{bail, Result};

/// Fills what the flags leave open from every worker's report. A silent worker's GPUs
/// and libtorch are unknown, so a plan for part of the cluster would miss them: without
/// workers answering, only a plan whose tag and archs both come from the flags is made,
/// with a warning that names the silent workers (their drivers are not checked).
pub fn infer(workers: &[WorkerStatus], flags: CheckedFlags) -> Result<Inferred> {
    if flags.process.is_some() {
        bail!("--process picks the process this host's libtorch is answered for; a cluster's workers answer for their own ranks (a pip torch's as Python): leave out --process");
    }
    let down: Vec<(String, String)> = workers
        .iter()
        .filter_map(|w| w.error.as_ref().map(|e| (clean(&w.host), clean(&short(e)))))
        .collect();
    let mut warnings = Vec::new();
    if !down.is_empty() {
        let missing: Vec<&str> = [
            ("--tag", flags.tag.is_none()),
            ("--archs", flags.archs.is_none()),
        ]
        .into_iter()
        .filter_map(|(f, m)| m.then_some(f))
        .collect();
        if !missing.is_empty() {
            bail!(
                "cannot plan for the cluster while workers do not answer (`fdl cluster status` shows them):\n  {}\nFix them, or pass {} to plan without them",
                down.iter()
                    .map(|(h, e)| format!("{h}: {e}"))
                    .collect::<Vec<_>>()
                    .join("\n  "),
                missing.join(" and ")
            );
        }
        warnings.push(Finding::WorkersDown {
            down: down.len(),
            workers: workers.len(),
            cuda_flag: flags.cuda.is_some(),
        });
        warnings.extend(down.iter().map(|(h, e)| Finding::WorkerDown {
            host: h.clone(),
            why: e.clone(),
        }));
    }
    let reports: Vec<(&str, &super::host::HostReport)> = workers
        .iter()
        .filter_map(|w| w.report.as_ref().map(|r| (w.host.as_str(), r)))
        .collect();

    // Tag and the CUDA that NCCL was built with: the highest libtorch NCCL.
    let mut found: Vec<(String, NcclVersion, Option<CudaVersion>)> = Vec::new();
    for (host, r) in &reports {
        let nccl = r.libtorch.known().and_then(|lt| lt.nccl.known());
        match nccl.and_then(|n| n.version.parse::<NcclVersion>().ok().map(|v| (v, n.cuda))) {
            Some((v, cuda)) => found.push((host.to_string(), v, cuda)),
            None => warnings.push(Finding::WorkerNcclUnknown {
                host: host.to_string(),
            }),
        }
    }
    let highest = found
        .iter()
        .max_by(|a, b| (a.1.major, a.1.minor, a.1.patch).cmp(&(b.1.major, b.1.minor, b.1.patch)))
        .cloned();
    let (tag, tag_origin, libtorch_cuda) = match (flags.tag, &highest) {
        (Some(t), _) => (t, TagOrigin::Flag, None),
        (None, Some((_, v, cuda))) => (
            Tag::for_release(v),
            TagOrigin::Cluster {
                versions: found
                    .iter()
                    .map(|(h, v, _)| HostValue {
                        host: h.clone(),
                        value: v.to_string(),
                    })
                    .collect(),
            },
            *cuda,
        ),
        (None, None) => {
            bail!("no worker's libtorch names its NCCL, so the cluster has no tag to build: pass --tag with the NCCL tag the training runs (`fdl nccl detect` on a worker's libtorch says which)")
        }
    };
    if let Some((_, top, _)) = &highest {
        let older: Vec<(String, NcclVersion)> = found
            .iter()
            .filter(|(_, v, _)| v != top)
            .map(|(h, v, _)| (h.clone(), v.clone()))
            .collect();
        if !older.is_empty() {
            warnings.push(Finding::OlderNccl {
                hosts: older,
                newest: top.clone(),
            });
        }
    }

    // Archs: every GPU of every worker.
    let (archs, arch_origin) = match flags.archs {
        Some(a) => (a, ArchOrigin::Flag),
        None => {
            let mut archs: Vec<Arch> = Vec::new();
            let mut hosts = Vec::new();
            for (host, r) in &reports {
                match &r.gpus {
                    Facts::Known(gpus) => {
                        let mine = crate::gpu::distinct_archs(gpus);
                        hosts.push(HostValue {
                            host: host.to_string(),
                            value: mine
                                .iter()
                                .map(|a| a.to_string())
                                .collect::<Vec<_>>()
                                .join("+"),
                        });
                        archs.extend(mine);
                    }
                    Facts::Unknown(why) => bail!(
                        "{host}'s GPUs are unknown ({why}), so the cluster's archs are too: fix nvidia-smi there, or pass --archs"
                    ),
                }
            }
            archs.sort();
            archs.dedup();
            (archs, ArchOrigin::Cluster { hosts })
        }
    };

    // CUDA: the libtorch NCCL's, unless some driver cannot run it even by minor-version
    // compatibility; then the oldest driver's.
    let oldest_driver = reports
        .iter()
        .filter_map(|(h, r)| r.driver.known().and_then(|d| d.cuda).map(|c| (*h, c)))
        .min_by_key(|(_, c)| c.major_minor());
    let mut cuda_from_libtorch = libtorch_cuda;
    if let (Some(wanted), Some((host, runs))) = (libtorch_cuda, oldest_driver) {
        if driver_runs(runs, wanted) == DriverFit::No {
            warnings.push(Finding::DriverOlderThanLibtorch {
                host: host.to_string(),
                runs,
                wanted,
            });
            cuda_from_libtorch = Some(runs);
        }
    }
    Ok(Inferred {
        tag,
        tag_origin,
        cuda_flag: flags.cuda,
        cuda_from_libtorch,
        archs,
        arch_origin,
        warnings,
        // The workers' GPUs are the archs themselves; no one host's GPU is left out.
        left_out: Vec::new(),
        host_driver: None,
        plugin_caller: None,
    })
}

/// A worker's error on one line, at most [`SHORT_ERROR`] characters: the warning names
/// each silent worker, and `fdl cluster status` shows the whole error.
fn short(e: &str) -> String {
    let one: String = e.split_whitespace().collect::<Vec<_>>().join(" ");
    if one.chars().count() <= SHORT_ERROR {
        return one;
    }
    let cut: String = one.chars().take(SHORT_ERROR).collect();
    format!("{}…", cut.trim_end())
}

const SHORT_ERROR: usize = 160;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::status::test_worker as worker;

    fn no_flags() -> CheckedFlags {
        CheckedFlags {
            tag: None,
            archs: None,
            cuda: None,
            ptx: false,
            process: None,
        }
    }

    #[test]
    fn the_highest_nccl_and_the_union_of_archs() {
        let w = [
            worker("a", "2.27.5", &[(6, 1)], "12.8"),
            worker("b", "2.27.3", &[(12, 0)], "12.9"),
            worker("c", "2.27.5", &[(8, 6), (12, 0)], "13.0"),
        ];
        let i = infer(&w, no_flags()).unwrap();
        assert_eq!(i.tag.to_string(), "v2.27.5-1");
        assert_eq!(
            i.archs,
            [Arch::new(6, 1), Arch::new(8, 6), Arch::new(12, 0)]
        );
        assert_eq!(i.cuda_from_libtorch.unwrap().to_string(), "12.8");
        assert!(
            i.warnings[0]
                .to_string()
                .starts_with("b (2.27.3) bundle an older NCCL"),
            "{:?}",
            i.warnings
        );
        // Flags still win.
        let mut f = no_flags();
        f.tag = Some(Tag::parse("v2.28.9-1").unwrap());
        f.archs = Some(vec![Arch::new(8, 6)]);
        let i = infer(&w, f).unwrap();
        assert_eq!((i.tag.to_string(), i.archs.len()), ("v2.28.9-1".into(), 1));
        assert_eq!(i.tag_origin, TagOrigin::Flag);
    }

    #[test]
    fn a_driver_too_old_for_the_libtorch_cuda_lowers_it_and_a_silent_worker_stops_it() {
        let w = [
            worker("a", "2.27.5", &[(6, 1)], "11.8"),
            worker("b", "2.27.5", &[(8, 6)], "12.8"),
        ];
        let i = infer(&w, no_flags()).unwrap();
        assert_eq!(i.cuda_from_libtorch.unwrap().to_string(), "11.8");
        assert!(i
            .warnings
            .iter()
            .any(|x| x.to_string().contains("a's driver runs CUDA up to 11.8")));

        let mut down = worker("b", "2.27.5", &[(8, 6)], "12.8");
        down.report = None;
        down.error = Some("unreachable over SSH: Connection refused".into());
        let err = infer(
            &[worker("a", "2.27.5", &[(6, 1)], "12.8"), down],
            no_flags(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("b: unreachable over SSH"), "{err}");
        assert!(err.contains("pass --tag and --archs"), "{err}");
    }

    /// Every input given by flags: the plan is made without the silent workers, and the
    /// warning names each of them, once, with its error on one line.
    #[test]
    fn tag_and_archs_from_flags_plan_without_silent_workers() {
        let mut down = worker("b", "2.27.5", &[(8, 6)], "12.8");
        down.report = None;
        down.error = Some(format!("unreachable over SSH:\n{}", "x".repeat(400)));
        let w = [worker("a", "2.27.5", &[(6, 1)], "12.8"), down];
        // Which process this host's libtorch is answered for means nothing to workers.
        let asked = CheckedFlags {
            process: Some(crate::loader::python::ProcessKind::Program),
            ..no_flags()
        };
        let err = infer(&w[..1], asked).unwrap_err().to_string();
        assert!(err.contains("leave out --process"), "{err}");
        let tag_only = || CheckedFlags {
            tag: Some(Tag::parse("v2.28.9-1").unwrap()),
            ..no_flags()
        };
        let err = infer(&w, tag_only()).unwrap_err().to_string();
        assert!(err.contains("pass --archs to plan"), "{err}");
        let mut f = tag_only();
        f.archs = Some(vec![Arch::new(8, 6), Arch::new(12, 0)]);
        let i = infer(&w, f).unwrap();
        assert_eq!(i.tag.to_string(), "v2.28.9-1");
        assert_eq!(i.archs, [Arch::new(8, 6), Arch::new(12, 0)]);
        assert!(
            i.warnings[0]
                .to_string()
                .starts_with("1 of 2 workers did not answer"),
            "{:?}",
            i.warnings
        );
        assert!(
            i.warnings[0].to_string().contains("pass --cuda"),
            "{:?}",
            i.warnings
        );
        let s = &i.warnings[1].to_string();
        assert!(
            s.starts_with("b did not answer: unreachable over SSH: xxx"),
            "{s}"
        );
        assert!(!s.contains('\n') && s.chars().count() < 400, "{s}");
    }
}
