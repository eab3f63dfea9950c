use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = fdl::cli::Cli::parse();
    fdl::process::install_interrupt_handler();
    match fdl::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.downcast_ref::<fdl::process::Interrupted>().is_some() {
                ExitCode::from(130)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
