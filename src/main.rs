use fdl::text::{paint_err, Color};
use std::process::ExitCode;

fn main() -> ExitCode {
    // A closed stdout (`fdl nccl list | head -1`) ends fdl quietly, as it ends any Unix
    // tool, instead of a panic in println!.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // `COMPLETE=bash fdl …`: the shell asking for completions (see docs/manage.md).
    fdl::cli::complete_from_env();
    let cli = fdl::cli::parse();
    fdl::process::install_interrupt_handler();
    let result = fdl::cli::run(cli);
    // Output that could not be written (`> /dev/full`) is a failure of the command, said
    // once, whatever else happened.
    if let Err(e) = fdl::cli::finish_stdout() {
        fdl::eprintln_safe!(
            "{} cannot write the output to stdout: {e}",
            paint_err("error:", Color::Red)
        );
        if result.is_ok() {
            return ExitCode::FAILURE;
        }
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // An interrupt surfaces through whatever step was running; say only that.
        Err(e) => match e.downcast_ref::<fdl::process::Interrupted>() {
            Some(interrupted) => {
                fdl::eprintln_safe!("{} {interrupted}", paint_err("error:", Color::Red));
                ExitCode::from(130)
            }
            // `fdl launch`: the job's own exit status, which the job has explained.
            None if e.downcast_ref::<fdl::cli::JobStatus>().is_some() => {
                ExitCode::from(e.downcast_ref::<fdl::cli::JobStatus>().map_or(1, |s| s.0))
            }
            None if e.downcast_ref::<fdl::cli::ModelWrong>().is_some() => {
                fdl::eprintln_safe!("{} {e:#}", paint_err("fdl bug:", Color::Red));
                ExitCode::from(fdl::cli::EXIT_MODEL_WRONG)
            }
            None if e.downcast_ref::<fdl::cli::Undecided>().is_some() => {
                // Errors quote files and workers: eprintln_safe escapes their controls.
                fdl::eprintln_safe!("{} {e:#}", paint_err("unknown:", Color::Yellow));
                ExitCode::from(fdl::cli::EXIT_UNKNOWN)
            }
            None => {
                fdl::eprintln_safe!("{} {e:#}", paint_err("error:", Color::Red));
                ExitCode::FAILURE
            }
        },
    }
}
