//! The `silo` command: a thin CLI over the `silo` library.
//!
//! This crate owns argument parsing, output (tables, JSON, progress bars)
//! and the embedded agent; everything a command does is a library call.
//! One file per subcommand; all printing goes through [`output::Output`].
//!
//! Exit codes: 0 on success, the command's own code for `silo exec`, 1 for a
//! silo error (printed as `silo: <error chain>`), 2 for a usage error.

mod cat;
mod completions;
mod cp;
mod create;
mod demo;
mod diff;
mod doctor;
mod events;
mod exec;
mod fork;
mod gc;
mod hosts;
mod image;
mod ls;
mod ls_files;
mod mv;
mod network;
mod output;
mod pause;
mod pool;
mod ps;
mod push;
mod rewind;
mod rm;
mod session;
mod shell;
mod snapshot;
mod snapshots;
mod spec_args;
mod start;
mod stop;
mod terminal;
mod timeout;
mod up;
mod watch;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use silo::{Silo, SiloOptions};

use output::Output;

/// Sandboxes for AI agent harnesses.
#[derive(Debug, Parser)]
#[command(name = "silo", version, about)]
pub struct Cli {
    /// State directory (default: ~/.local/share/silo).
    #[arg(long, global = true, env = "SILO_HOME", value_name = "DIR")]
    home: Option<PathBuf>,
    /// silo-agent binary to run instead of the built-in one.
    #[arg(long, global = true, env = "SILO_AGENT", value_name = "PATH")]
    agent: Option<PathBuf>,
    /// The Kubernetes namespace of sandboxes made on the kubernetes backend
    /// (default: the kubeconfig context's).
    #[arg(
        long,
        global = true,
        env = "SILO_KUBERNETES_NAMESPACE",
        value_name = "NS"
    )]
    namespace: Option<String>,
    /// Print machine-readable JSON instead of tables (the same as `-o json`).
    #[arg(long, global = true)]
    json: bool,
    /// How to print results: `table` for people (the default) or `json`.
    #[arg(
        short = 'o',
        long = "output",
        global = true,
        value_enum,
        value_name = "FORMAT"
    )]
    format: Option<Format>,
    #[command(subcommand)]
    command: Command,
}

/// The output formats every command offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    /// Tables and sentences.
    Table,
    /// One JSON document.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print files of a sandbox to stdout.
    Cat(cat::Args),
    /// Copy files and directories between the host and a sandbox (docker cp syntax).
    Cp(cp::Args),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(completions::CompletionsArgs),
    /// Print the manual page (roff): `silo man | man -l -`.
    Man,
    /// Create a sandbox and start it.
    Create(create::Args),
    /// A guided tour: create a sandbox, run commands, resume it from a second process.
    Demo(demo::Args),
    /// What differs between a sandbox's files and a snapshot, path by path.
    Diff(diff::Args),
    /// Check the host: engine, agent binary, home, disk space; with a fix for each problem.
    Doctor(doctor::Args),
    /// Run a command in a sandbox, streaming its output.
    Exec(exec::Args),
    /// Make a new sandbox from a snapshot.
    Fork(fork::Args),
    /// Remove expired sandboxes, orphaned containers and unneeded snapshot blobs.
    Gc(gc::Args),
    /// List the hosts sharing this state, with the sandboxes each made.
    Hosts(hosts::Args),
    /// Build images: bake the agent into one, or make a registry-free base.
    Image(image::Args),
    /// List sandboxes.
    Ls(ls::Args),
    /// List a directory in a sandbox: name, kind, size, mode, modification time.
    LsFiles(ls_files::Args),
    /// Rename a path in a sandbox in one step (atomic, within one file system).
    Mv(mv::Args),
    /// Show a sandbox's outbound rules, or change them in place (e2b, daytona).
    Network(network::Args),
    /// List the commands running in a sandbox (`--all`: also those that ended).
    Ps(ps::Args),
    /// Push a directory's files to a mount path in sandboxes, atomically.
    Push(push::Args),
    /// Keep started sandboxes of a spec ready for `silo up NAME --pool POOL`.
    Pool(pool::Args),
    /// Put a sandbox's file system back to one of its snapshots.
    Rewind(rewind::Args),
    /// Remove sandboxes (their event history is kept).
    Rm(rm::Args),
    /// Show a sandbox's event history.
    Events(events::Args),
    /// List, interrupt or close a sandbox's shell sessions.
    Session(session::Args),
    /// Open an interactive shell in a sandbox (a pseudo-terminal).
    Shell(shell::Args),
    /// Snapshot a sandbox's file system (`snapshot rm ID` deletes one).
    Snapshot(snapshot::Args),
    /// List snapshots.
    Snapshots(snapshots::Args),
    /// Pause a sandbox with its memory and processes (e2b); `resume` continues it.
    Pause(pause::Args),
    /// Resume a paused sandbox (the same as `start`).
    Resume(pause::Args),
    /// Start a stopped sandbox.
    Start(start::Args),
    /// Stop a sandbox, keeping it for a later start.
    Stop(stop::Args),
    /// Print a directory's changes in a sandbox as they happen.
    Watch(watch::Args),
    /// Show, set or clear the time after which a sandbox stops, whatever runs.
    Timeout(timeout::Args),
    /// Open a sandbox by name, or create it: attach, start, or make it fresh.
    Up(up::Args),
}

/// Runs the parsed command; returns the process exit code.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    let json = match cli.format {
        Some(format) => format == Format::Json,
        None => cli.json,
    };
    // A process this one starts in the background (a pool refill) uses the
    // same agent.
    let agent = cli.agent.clone();
    let kubernetes = cli
        .namespace
        .as_deref()
        .map(silo::KubernetesConfig::in_namespace)
        .transpose()?;
    let options = SiloOptions {
        home: cli.home,
        agent: cli.agent,
        kubernetes,
        ..SiloOptions::default()
    };
    // These need no home, or report on it rather than failing with it.
    match cli.command {
        Command::Completions(args) => return completions::completions(args),
        Command::Man => return completions::man(),
        Command::Doctor(args) => return doctor::run(options, &Output::new(json), args).await,
        _ => {}
    }
    let home_hint = options.home.clone();
    let silo = Silo::open_with(options).with_context(|| match home_hint {
        Some(home) => format!("opening silo home {}", home.display()),
        None => "opening silo home".to_owned(),
    })?;
    let out = Output::new(json);
    match cli.command {
        // Answered above, before the home was opened.
        Command::Completions(_) | Command::Man | Command::Doctor(_) => Ok(0),
        Command::Cat(args) => cat::run(&silo, &out, args).await,
        Command::Cp(args) => cp::run(&silo, &out, args).await,
        Command::Create(args) => create::run(&silo, &out, args).await,
        Command::Demo(args) => demo::run(&silo, &out, args).await,
        Command::Diff(args) => diff::run(&silo, &out, args).await,
        Command::Exec(args) => exec::run(&silo, args).await,
        Command::Fork(args) => fork::run(&silo, &out, agent.as_deref(), args).await,
        Command::Gc(args) => gc::run(&silo, &out, args).await,
        Command::Hosts(args) => hosts::run(&silo, &out, args).await,
        Command::Image(args) => image::run(&silo, &out, args).await,
        Command::Ls(args) => ls::run(&silo, &out, args).await,
        Command::LsFiles(args) => ls_files::run(&silo, &out, args).await,
        Command::Mv(args) => mv::run(&silo, &out, args).await,
        Command::Ps(args) => ps::run(&silo, &out, args).await,
        Command::Timeout(args) => timeout::run(&silo, &out, args).await,
        Command::Watch(args) => watch::run(&silo, &out, args).await,
        Command::Push(args) => push::run(&silo, &out, args).await,
        Command::Rewind(args) => rewind::run(&silo, &out, args).await,
        Command::Rm(args) => rm::run(&silo, &out, args).await,
        Command::Events(args) => events::run(&silo, &out, args),
        Command::Session(args) => session::run(&silo, &out, args).await,
        Command::Shell(args) => shell::run(&silo, args).await,
        Command::Snapshot(args) => snapshot::run(&silo, &out, args).await,
        Command::Snapshots(args) => snapshots::run(&silo, &out, args).await,
        Command::Network(args) => network::run(&silo, &out, args).await,
        Command::Pause(args) => pause::pause(&silo, &out, args).await,
        Command::Resume(args) => pause::resume(&silo, &out, args).await,
        Command::Start(args) => start::run(&silo, &out, args).await,
        Command::Stop(args) => stop::run(&silo, &out, args).await,
        Command::Up(args) => up::run(&silo, &out, agent.as_deref(), args).await,
        Command::Pool(args) => pool::run(&silo, &out, agent.as_deref(), args).await,
    }
}

/// Parses `KEY=VALUE`.
fn parse_key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {text:?}")),
    }
}

fn main() {
    let args = Cli::parse();
    init_logging();
    // One thread: a command is one request after another (its concurrent
    // parts are I/O, and blocking work goes to the blocking pool), so worker
    // threads only add their start and a cross-thread wake-up per await.
    // Measured in docs/benchmarks.md ("What a CLI call costs").
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("silo: cannot start the async runtime: {error}");
            std::process::exit(1);
        }
    };
    let code = match runtime.block_on(run(args)) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn key_values_need_a_key() {
        assert_eq!(parse_key_value("A=b=c"), Ok(("A".into(), "b=c".into())));
        assert_eq!(parse_key_value("A="), Ok(("A".into(), String::new())));
        assert!(parse_key_value("=x").is_err());
        assert!(parse_key_value("x").is_err());
    }

    #[test]
    fn exec_takes_the_command_after_dashes_or_directly() {
        for argv in [
            &["silo", "exec", "a", "--", "ls", "-l"][..],
            &["silo", "exec", "a", "ls", "-l"][..],
        ] {
            let cli = Cli::try_parse_from(argv).unwrap();
            let Command::Exec(args) = cli.command else {
                panic!("not exec");
            };
            assert_eq!(args.command, ["ls", "-l"]);
        }
    }
}
