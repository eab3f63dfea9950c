//! `fdl ps`: the running processes of this user that map an NCCL, which NCCL file each
//! one's calls reach and on what evidence, and whether the ranks among them agree (both
//! [`crate::loader::running`]). The files are matched to this project's builds by digest.

use super::common::{print_json, JsonReported, Undecided};
use crate::loader::running::{self, agreement, Agreement, Scan};
use crate::project::Project;
use anyhow::{anyhow, bail, Result};
use serde_json::json;
use std::collections::BTreeMap;

/// `fdl ps`'s flags.
#[derive(clap::Args, Debug)]
pub struct PsArgs {
    /// Only this process (repeat for more); another user's is refused with the reason
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Print one JSON object
    #[arg(long)]
    pub json: bool,
    /// Do not read process memory (/proc/PID/mem): answer from the maps and the loader's
    /// rules only
    #[arg(long)]
    pub no_memory: bool,
    /// One line per process
    #[arg(long, conflicts_with = "json")]
    pub short: bool,
}

/// Names each mapped file that a build of this project holds (by BLAKE3). A project
/// without builds names none.
fn name_builds(project: &Project, scan: &mut Scan) {
    let store = crate::nccl::store::BuildStore::new(project.nccl_builds_dir());
    let Ok(entries) = store.list() else { return };
    let mut by_digest: BTreeMap<String, String> = BTreeMap::new();
    for e in entries {
        if let crate::nccl::store::Entry::Build { name, manifest, .. } = e {
            for f in manifest.files.iter().flatten() {
                if let crate::nccl::files::FileEntry::File { blake3, .. } = f {
                    by_digest.entry(blake3.clone()).or_insert(name.clone());
                }
            }
        }
    }
    for p in &mut scan.processes {
        for n in &mut p.nccl {
            n.build = n.blake3.as_ref().and_then(|d| by_digest.get(d)).cloned();
        }
    }
}

pub(super) fn run(ctx: &crate::context::Context, project: &Project, args: PsArgs) -> Result<()> {
    let mut scan = running::scan(&running::Options {
        pids: (!args.pids.is_empty()).then(|| args.pids.clone()),
        no_memory: args.no_memory,
        digest_cache: ctx.cache().ok(),
    });
    name_builds(project, &mut scan);
    // Asked-for processes that /proc refused: the answer the user wanted is missing.
    if !args.pids.is_empty() && scan.processes.is_empty() {
        let why: Vec<String> = scan
            .refused
            .iter()
            .map(|r| format!("process {}: {}", r.pid, crate::text::clean(&r.reason)))
            .collect();
        bail!(
            "fdl could not read {}: {}",
            if args.pids.len() == 1 {
                "the process asked for"
            } else {
                "any process asked for"
            },
            why.join("; ")
        );
    }
    let verdict = agreement(&scan.processes);
    if args.json {
        print_json(&json!({
            "looked_at": scan.looked_at,
            "processes": scan.processes,
            "refused": scan.refused,
            "ranks": verdict,
        }));
    } else {
        render(&scan, &verdict, args.short, &args.pids);
    }
    match verdict {
        Agreement::Differ { .. } => {
            let e = anyhow!(
                "the ranked processes reach different NCCL files: NCCL refuses a communicator across them"
            );
            Err(if args.json { JsonReported(e).into() } else { e })
        }
        Agreement::Unknown { pids } => Err(Undecided(format!(
            "which NCCL {} reach is unknown",
            pids.iter()
                .map(|p| format!("process {p}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .into()),
        _ => Ok(()),
    }
}

fn render(scan: &Scan, verdict: &Agreement, short: bool, asked: &[u32]) {
    let n = scan.processes.iter().filter(|p| !p.nccl.is_empty()).count();
    outln!(
        "{} of the {} processes looked at map an NCCL.",
        if n == 0 {
            "None".to_string()
        } else {
            n.to_string()
        },
        scan.looked_at
    );
    for p in &scan.processes {
        if short {
            outln!("{}", p.short());
            continue;
        }
        let (head, rows) = p.full();
        outln!();
        outln!("{head}");
        for (label, text) in rows {
            outln!(
                "{}",
                crate::text::wrap(&format!("  {label:<12} "), &" ".repeat(15), &text)
            );
        }
    }
    // A process asked for is named with its reason; of the rest (this user's processes
    // that /proc would not show, such as non-dumpable ones), a count.
    let (asked, others): (Vec<_>, Vec<_>) =
        scan.refused.iter().partition(|r| asked.contains(&r.pid));
    for r in asked {
        outln!(
            "{}",
            crate::text::wrap(
                &format!("process {}: ", r.pid),
                "  ",
                &crate::text::clean(&r.reason)
            )
        );
    }
    if !others.is_empty() {
        outln!(
            "{}",
            crate::text::wrap(
                "",
                "  ",
                &format!(
                    "{} of this user's processes could not be read (pid {}: {}); --json lists them",
                    others.len(),
                    others[0].pid,
                    crate::text::clean(&others[0].reason)
                )
            )
        );
    }
    if !scan.processes.is_empty() {
        outln!();
    }
    match verdict {
        Agreement::NoRanks => {}
        Agreement::Same { ranks, version } => outln!(
            "All {ranks} ranked processes reach the same NCCL file (NCCL {})",
            crate::text::clean(version)
        ),
        Agreement::Differ { groups } => {
            outln!("The ranked processes reach DIFFERENT NCCL files (NCCL refuses a communicator across them):");
            for g in groups {
                outln!(
                    "  NCCL {} (blake3 {}…): {}",
                    crate::text::clean(g.version.as_deref().unwrap_or("unknown")),
                    g.blake3
                        .as_deref()
                        .map_or("unread", |d| &d[..d.len().min(12)]),
                    g.pids
                        .iter()
                        .map(|p| format!("pid {p}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        Agreement::Unknown { pids } => outln!(
            "Unknown for {}: fdl cannot say whether the ranks agree",
            pids.iter()
                .map(|p| format!("pid {p}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
