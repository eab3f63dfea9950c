use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = fdl::cli::Cli::parse();
    fdl::process::install_interrupt_handler();
    match fdl::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // An interrupt surfaces through whatever step was running; say only that.
        Err(e) => match e.downcast_ref::<fdl::process::Interrupted>() {
            Some(interrupted) => {
                eprintln!("error: {interrupted}");
                ExitCode::from(130)
            }
            None => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}
