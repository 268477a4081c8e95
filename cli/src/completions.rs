//! `silo completions SHELL` and `silo man`: the shell completion script and
//! the manual page, generated from the same argument definitions the parser
//! uses, so they can never disagree with it. Neither touches `$SILO_HOME`.

use std::io::Write;

use anyhow::Context;
use clap::CommandFactory;
use clap_complete::Shell;

use super::Cli;

#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    shell: Shell,
}

/// Prints the completion script, e.g. `silo completions bash > /etc/bash_completion.d/silo`.
pub fn completions(args: CompletionsArgs) -> anyhow::Result<i32> {
    let mut command = Cli::command();
    let mut stdout = std::io::stdout().lock();
    clap_complete::generate(args.shell, &mut command, "silo", &mut stdout);
    stdout.flush().context("writing the completion script")?;
    Ok(0)
}

/// Prints the manual page (roff), e.g. `silo man | man -l -`.
pub fn man() -> anyhow::Result<i32> {
    let mut page = Vec::new();
    clap_mangen::Man::new(Cli::command())
        .render(&mut page)
        .context("rendering the manual page")?;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(&page)
        .and_then(|()| stdout.flush())
        .context("writing the manual page")?;
    Ok(0)
}
