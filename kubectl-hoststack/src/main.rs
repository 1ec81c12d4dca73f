//! `kubectl-hoststack`: on PATH, kubectl runs it as `kubectl hoststack ...`.

use std::process::ExitCode;

use clap::Parser;
use kubectl_hoststack::cli::Cli;
use kubectl_hoststack::commands;
use kubectl_hoststack::error::EXIT_ERROR;

fn main() -> ExitCode {
    // Usage errors exit 2 and --help/--version 0, as clap decides.
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
