use clap::Parser;
use fdl::cli::{paint_err, Color};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = fdl::cli::Cli::parse();
    fdl::process::install_interrupt_handler();
    match fdl::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // An interrupt surfaces through whatever step was running; say only that.
        Err(e) => match e.downcast_ref::<fdl::process::Interrupted>() {
            Some(interrupted) => {
                eprintln!("{} {interrupted}", paint_err("error:", Color::Red));
                ExitCode::from(130)
            }
            None => {
                eprintln!("{} {e:#}", paint_err("error:", Color::Red));
                ExitCode::FAILURE
            }
        },
    }
}
