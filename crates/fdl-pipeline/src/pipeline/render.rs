//! The plan as a person reads it: one row per input with where it came from, the
//! commands it will run, then its warnings and problems. The one text rendering of a
//! [`BuildPlan`]; `--json` prints the plan's own serialization instead.

use super::key::{StoreState, StoreView};
use crate::nccl::finding::Finding;
use crate::nccl::plan::{ArchOrigin, BuildPlan, CudaOrigin, TagOrigin};
use crate::step::Step;
use crate::text::{self, clean, paint, Color};
use fdl_backends::Planned;

/// The steps the plan will run, with placeholders for the private paths a run makes
/// (`<staging>`): the same values a run executes, rendered.
pub fn steps(plan: &BuildPlan) -> Vec<Step> {
    plan.backend.planned().steps(plan)
}

fn host_values(v: &[crate::nccl::plan::HostValue]) -> String {
    v.iter()
        .map(|h| format!("{} {}", h.host, h.value))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a real build shows before it starts (the whole plan is `--dry-run`'s and
/// `-v`'s): what is built, where, with which backend, CUDA and archs, then its warnings.
/// The build adds the path of its log when it opens it.
pub fn header(plan: &BuildPlan, store: &StoreView, wrap: bool) -> String {
    // Warnings first: the build appends its log's row below the rows when it opens it.
    let mut s = warnings(plan, wrap);
    s.push_str(&format!("Building NCCL {}\n", clean(&plan.name)));
    let mut row = |k: &str, v: String| s.push_str(&row_text(k, &v, wrap));
    row(
        "tag",
        match &plan.nccl_version {
            Some(v) => format!("{} (NCCL {v})", plan.tag),
            None => plan.tag.to_string(),
        },
    );
    row("output", plan.output_dir.display().to_string());
    row("backend", plan.backend.kind().to_string());
    row("CUDA", plan.cuda.to_string());
    row("archs", crate::arch::archs_text(&plan.archs));
    if store.state == StoreState::Hit {
        row(
            "store",
            "installed from the build store's entry: nothing is compiled".into(),
        );
    }
    s
}

/// The plan's problems, then its warnings, each under its title; empty when none. The
/// whole plan shows them as made, their lists on lines of their own.
fn problems_and_warnings(plan: &BuildPlan, wrap: bool) -> String {
    let mut s = titled(
        "Problems (the build will not start until they are solved):",
        Color::Red,
        &plan.findings.problems,
        |p| p.to_string(),
        wrap,
    );
    s.push_str(&titled(
        "Warnings:",
        Color::Yellow,
        &plan.findings.warnings,
        |w| w.to_string(),
        wrap,
    ));
    s
}

/// The warnings of a real build's header, each on one line ([`clean`]).
fn warnings(plan: &BuildPlan, wrap: bool) -> String {
    titled(
        "Warnings:",
        Color::Yellow,
        &plan.findings.warnings,
        clean,
        wrap,
    )
}

/// `items` under `title`, each line wrapped to [`text::WIDTH`] when `wrap` (for a
/// terminal: piped output keeps one line per item, for `grep`).
fn titled(
    title: &str,
    color: Color,
    items: &[Finding],
    show: impl Fn(&str) -> String,
    wrap: bool,
) -> String {
    let mut s = String::new();
    if !items.is_empty() {
        s.push_str(&paint(&format!("{title}\n"), color));
        for item in items {
            // Each line of an item (a list under it keeps its own indent) wrapped to
            // the terminal's width, its continuation indented under it.
            for line in show(&item.to_string()).lines() {
                let body = line.trim_start_matches(' ');
                let indent = format!("  {}", &line[..line.len() - body.len()]);
                if wrap {
                    s.push_str(&text::wrap(&indent, &format!("{indent}  "), body));
                } else {
                    s.push_str(&format!("{indent}{body}"));
                }
                s.push('\n');
            }
        }
    }
    s
}

/// One row of a plan: `  key        value`, the value [`clean`]ed and, with `wrap`,
/// wrapped under itself (the gencode, a value to copy, stays whole).
fn row_text(key: &str, value: &str, wrap: bool) -> String {
    let first = format!("  {key:<11}");
    let value = clean(value);
    if !wrap || key == "gencode" {
        return format!("{first}{value}\n");
    }
    let rest = " ".repeat(first.len());
    format!("{}\n", text::wrap(&first, &rest, &value))
}

/// Why the plan's CUDA is the one it is, when neither `--cuda` nor the libtorch named
/// one: said for this plan's archs, from what its toolkit (its `nvcc --list-gpu-arch`)
/// or, for Docker, fdl's support table says compiles them.
fn default_cuda_reason(plan: &BuildPlan) -> String {
    let default = crate::nccl::image::DEFAULT_CUDA;
    if plan.cuda_note.is_some() {
        return format!("fdl's default is {default}");
    }
    let compiles = plan.backend.planned().compiles_archs(plan);
    // The generations of the plan's oldest and newest arch, named from the arch table,
    // when they are far apart (one the newest CUDA dropped, one only a recent CUDA has).
    let oldest = plan.archs.iter().min();
    let newest = plan.archs.iter().max();
    let span = match (oldest, newest) {
        (Some(o), Some(n)) if o.major < 7 && n.major >= 10 => crate::arch::generation(o)
            .zip(crate::arch::generation(n))
            .filter(|(a, b)| a != b),
        _ => None,
    };
    match (compiles, span) {
        (Some(true), Some((old, new))) => format!(
            "fdl's default: it compiles every arch of this plan ({}), being the oldest CUDA that compiles both {old} and {new}",
            crate::arch::archs_text(&plan.archs)
        ),
        (Some(true), None) => format!(
            "fdl's default: it compiles every arch of this plan ({})",
            crate::arch::archs_text(&plan.archs)
        ),
        (Some(false), _) => "fdl's default; it cannot compile every arch of this plan: see the problems".to_string(),
        (None, _) => "fdl's default".to_string(),
    }
}

/// The whole plan as `--dry-run` shows it: its problems and warnings first, then its
/// rows, then the commands it runs: each in full with `verbose` (and the run script
/// the containers run), else one line that says how many and which. With `wrap` (a
/// terminal) prose is wrapped to [`text::WIDTH`]; commands never are.
pub fn plan(
    plan: &BuildPlan,
    cmds: &[String],
    store: &StoreView,
    verbose: bool,
    wrap: bool,
) -> String {
    let tag_from = match &plan.tag_origin {
        TagOrigin::Flag => "from --tag".to_string(),
        TagOrigin::Libtorch {
            variant, process, ..
        } => match process {
            Some(crate::loader::python::ProcessKind::Python) => format!(
                "from the active libtorch, {variant}, for a Python process importing it; --process program for a program linking it"
            ),
            Some(crate::loader::python::ProcessKind::Program) => format!(
                "from the active libtorch, {variant}, for a program linking it"
            ),
            None => format!("from the active libtorch, {variant}"),
        },
        TagOrigin::Cluster { versions } => format!(
            "the highest libtorch NCCL of the workers: {}",
            host_values(versions)
        ),
    };
    let cuda_from = match plan.cuda_origin {
        CudaOrigin::Flag => "from --cuda".to_string(),
        CudaOrigin::Libtorch => "from the libtorch's NCCL self-id".to_string(),
        CudaOrigin::Default => default_cuda_reason(plan),
    };
    let archs_from = match &plan.arch_origin {
        ArchOrigin::Flag => "from --archs".to_string(),
        ArchOrigin::Gpus { gpus } => format!("from nvidia-smi: {} GPU(s)", gpus.len()),
        ArchOrigin::Cluster { hosts } => {
            format!("the union of the workers' GPUs: {}", host_values(hosts))
        }
    };
    let archs = crate::arch::archs_text(&plan.archs);
    let mut s = problems_and_warnings(plan, wrap);
    s.push_str("NCCL build plan\n");
    // Every value is cleaned: it may quote a path, a library or an engine's answer, and a
    // newline there would forge a row. A value of two lines is two rows.
    let mut row = |k: &str, v: String| s.push_str(&row_text(k, &v, wrap));
    row("tag", format!("{}  ({tag_from})", plan.tag));
    if let TagOrigin::Libtorch {
        library, linkage, ..
    } = &plan.tag_origin
    {
        // Where the version was read, on its own lines: the paths are long.
        row("", format!("read from {}", library.display()));
        row("", format!("NCCL linkage: {linkage}"));
    }
    row(
        "NCCL",
        plan.nccl_version
            .as_ref()
            .map_or("(not a release tag)".to_string(), |v| v.to_string()),
    );
    match &plan.cuda_note {
        None => row("CUDA", format!("{}  ({cuda_from})", plan.cuda)),
        Some(note) => {
            row(
                "CUDA",
                format!("{}  ({cuda_from}, then adjusted:)", plan.cuda),
            );
            row("", note.clone());
        }
    }
    row("archs", format!("{archs}  ({archs_from})"));
    row("gencode", plan.gencode.clone());
    row("jobs", format!("{}  ({})", plan.jobs, plan.jobs_reason));
    row("output", plan.output_dir.display().to_string());
    if plan.ptx {
        row(
            "ptx",
            "yes: PTX for the highest arch is embedded too".into(),
        );
    }
    if let Some(expr) = &plan.only_funcs {
        row(
            "only funcs",
            format!("{expr}  (development build: not a full NCCL)"),
        );
    }
    row(
        "backend",
        format!("{}  ({})", plan.backend.kind(), plan.backend_reason),
    );
    for (key, value) in plan.backend.planned().rows(plan) {
        row(key, value);
    }
    match (store.state, &store.key, &store.why) {
        (StoreState::Hit, Some(key), _) => {
            row("store", key.to_string());
            row(
                "",
                "from the store: installed from its entry, nothing is compiled".into(),
            );
        }
        (_, Some(key), _) => {
            row("store", key.to_string());
            row("", "not in the store: built, then added to it".into());
        }
        (StoreState::Skipped, _, _) => row("store", "not used for this build (--no-store)".into()),
        (_, _, why) => row(
            "store",
            format!(
                "key unknown: {}; the build is looked up once it is known",
                why.as_deref().unwrap_or("no reason given")
            ),
        ),
    }
    if verbose {
        s.push_str("Commands:\n");
        for c in cmds {
            s.push_str(&format!("  {c}\n"));
        }
        if let Some((path, script)) = plan.backend.planned().script() {
            s.push_str(&format!(
                "  where {path} is this script, which fdl writes into <work>:\n"
            ));
            for line in script.lines() {
                s.push_str(&format!("    {line}\n"));
            }
        }
    } else if !cmds.is_empty() {
        s.push_str(&format!(
            "Commands:  {} ({}); shown in full with -v (or --json)\n",
            cmds.len(),
            command_kinds(cmds)
        ));
    }
    s
}

/// `docker build, docker run ×3`: the programs of `cmds` (past `env` and its options and
/// assignments), with a Docker subcommand, counted.
fn command_kinds(cmds: &[String]) -> String {
    let mut kinds: Vec<(String, usize)> = Vec::new();
    for c in cmds {
        let mut words = c.split_whitespace();
        let mut program = "";
        while let Some(w) = words.next() {
            if w == "-u" {
                words.next(); // env's `-u NAME`
            } else if w != "env" && !w.starts_with('-') && !w.contains('=') {
                program = w;
                break;
            }
        }
        let program = program.rsplit('/').next().unwrap_or(program);
        let kind = match words.next() {
            Some(sub) if program == "docker" && !sub.starts_with('-') => format!("docker {sub}"),
            _ => program.to_string(),
        };
        match kinds.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => kinds.push((kind, 1)),
        }
    }
    kinds
        .iter()
        .map(|(k, n)| {
            if *n == 1 {
                k.clone()
            } else {
                format!("{k} ×{n}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl::plan::NativeSource;

    #[test]
    fn folded_commands_name_their_programs() {
        let cmds = [
            "docker build --tag '<toolchain>' .".to_string(),
            "docker run --rm x".to_string(),
            "docker run --rm y".to_string(),
            "env -u MAKEFLAGS PATH=/x:\"$PATH\" CXX=/usr/bin/g++ /usr/bin/make -C '<source>' -n"
                .to_string(),
        ];
        assert_eq!(command_kinds(&cmds), "docker build, docker run ×2, make");
    }
    use crate::arch::Arch;
    use crate::nccl::plan::{BackendInputs, PlanInputs, Toolkit};
    use crate::nccl::tag::Tag;
    use std::path::PathBuf;

    /// Issue 29: a real build's header is short (what, where, backend, CUDA, archs; no
    /// commands), and a default CUDA is explained for this plan's archs, not by Pascal
    /// and Blackwell when it holds neither.
    #[test]
    fn a_real_builds_header_is_short_and_the_default_cuda_is_said_for_this_plan() {
        let built = BuildPlan::new(PlanInputs {
            tag: Tag::parse("v2.27.5-1").unwrap(),
            tag_origin: TagOrigin::Flag,
            cuda_flag: None,
            cuda_from_libtorch: None,
            archs: vec![Arch::new(8, 6)],
            arch_origin: ArchOrigin::Flag,
            jobs: 2,
            jobs_reason: "test".into(),
            builds_dir: PathBuf::from("/p/builds"),
            backend: BackendInputs::Native {
                toolkit: Toolkit {
                    cuda_home: PathBuf::from("/opt/cuda"),
                    nvcc: PathBuf::from("/opt/cuda/bin/nvcc"),
                    cuda: "12.8".parse().unwrap(),
                    gpu_archs: Some(vec![Arch::new(7, 5), Arch::new(8, 6)]),
                    lib_dir: PathBuf::from("/opt/cuda/lib64"),
                },
                tools: Default::default(),
                source: NativeSource::Clone {
                    repo: "r".into(),
                    cache_dir: PathBuf::from("/c"),
                },
                allow_cuda_mismatch: false,
            },
            backend_reason: "--backend native".into(),
            ptx: false,
            only_funcs: None,
            warnings: Vec::new(),
        })
        .unwrap();
        let store = StoreView {
            state: StoreState::Skipped,
            key: None,
            inputs: None,
            why: None,
        };
        let head = header(&built, &store, false);
        for want in [
            "Building NCCL v2.27.5-sm86",
            "output     /p/builds/v2.27.5-sm86",
            "backend    native",
            "CUDA       12.8",
            "archs      sm_86",
        ] {
            assert!(head.contains(want), "{want}: {head}");
        }
        assert!(
            head.lines().count() <= 7 && !head.contains("Commands"),
            "{head}"
        );
        let full = plan(&built, &["make …".into()], &store, true, false);
        assert!(
            full.contains("fdl's default: it compiles every arch of this plan (sm_86)")
                && !full.contains("Pascal"),
            "{full}"
        );
    }

    /// A value from outside (here an engine's version string in the backend's reason, and a
    /// toolkit path) cannot forge a row or reach the terminal as an escape sequence.
    #[test]
    fn outside_text_forges_no_row() {
        let hostile = "24.0\n  archs      sm_90  (forged)\x1b[2J";
        let built = BuildPlan::new(PlanInputs {
            tag: Tag::parse("v2.27.5-1").unwrap(),
            tag_origin: TagOrigin::Flag,
            cuda_flag: Some("12.8".parse().unwrap()),
            cuda_from_libtorch: None,
            archs: vec![Arch::new(8, 6)],
            arch_origin: ArchOrigin::Flag,
            jobs: 2,
            jobs_reason: "test".into(),
            builds_dir: PathBuf::from("/p/builds"),
            backend: BackendInputs::Native {
                toolkit: Toolkit {
                    cuda_home: PathBuf::from("/opt/cuda\n  forged"),
                    nvcc: PathBuf::from("/opt/cuda/bin/nvcc"),
                    cuda: "12.8".parse().unwrap(),
                    gpu_archs: None,
                    lib_dir: PathBuf::from("/opt/cuda/lib64"),
                },
                tools: Default::default(),
                source: NativeSource::Clone {
                    repo: "r".into(),
                    cache_dir: PathBuf::from("/c"),
                },
                allow_cuda_mismatch: true,
            },
            backend_reason: format!("auto: the Docker daemon answers (server {hostile})"),
            ptx: false,
            only_funcs: None,
            warnings: Vec::new(),
        })
        .unwrap();
        let store = StoreView {
            state: StoreState::Unknown,
            key: None,
            inputs: None,
            why: Some("\x1b]0;title\x07".into()),
        };
        let text = plan(&built, &[], &store, true, false);
        assert!(!text.contains('\x1b') && !text.contains('\x07'), "{text}");
        assert!(
            !text.lines().any(|l| l.starts_with("  archs      sm_90")),
            "a forged row:\n{text}"
        );
        assert!(
            !text.lines().any(|l| l.trim_start().starts_with("forged")),
            "{text}"
        );
    }
}
