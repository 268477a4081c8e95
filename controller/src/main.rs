//! The `silo` command: a thin CLI over the `silo` library.
//!
//! Exit codes: 0 on success, the command's own code for `silo exec`, 1 for a
//! silo error (printed as `silo: <error chain>`), 2 for a usage error.

mod cli;

use clap::Parser;

fn main() {
    let args = cli::Cli::parse();
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("silo: cannot start the async runtime: {error}");
            std::process::exit(1);
        }
    };
    let code = match runtime.block_on(cli::run(args)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("silo: {error:#}");
            1
        }
    };
    // Exit without dropping the runtime: a blocking read of our stdin (exec
    // --stdin) cannot be cancelled and would hold the shutdown forever.
    std::process::exit(code);
}

/// Diagnostics go to stderr, filtered by `SILO_LOG` (default: warnings), in
/// colour only on a terminal and never with `NO_COLOR` set.
fn init_logging() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("SILO_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal() && !no_color)
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .init();
}
