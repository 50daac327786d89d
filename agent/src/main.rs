use std::process::ExitCode;

use clap::Parser as _;
use stormwatch::cli::{self, Cli, Command};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            use clap::error::ErrorKind;
            if matches!(
                err.kind(),
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
            ) {
                let _ = err.print();
                return ExitCode::SUCCESS;
            }
            eprintln!("stormwatch: {} (see --help)", cli::usage_error(&err));
            return ExitCode::from(2);
        }
    };
    env_logger::Builder::new()
        .filter_level(cli.log_level)
        .format_target(false)
        .init();

    let result = match cli.command {
        Command::Check(args) => {
            return if cli::check::run(&args) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            };
        }
        Command::Trace(args) => runtime()
            .and_then(|rt| rt.block_on(cli::trace::run(args)))
            .map(|()| 0),
        Command::Diagnose(args) => runtime().and_then(|rt| rt.block_on(cli::diagnose::run(args))),
        Command::Run(args) => cli::run::run(args),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("stormwatch: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}
