//! `sous completions SHELL`: a completion script on stdout, generated from the same
//! clap definition the binary parses with.

use std::process::ExitCode;

use clap::{Args, CommandFactory};
use clap_complete::Shell as Target;

use super::Cli;
use crate::shell::Shell;

/// Arguments of `sous completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, powershell or elvish. Install e.g. with
    /// `sous completions bash > ~/.local/share/bash-completion/completions/sous`.
    shell: Target,
}

pub fn exec(args: CompletionsArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let mut buffer = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "sous", &mut buffer);
    shell.data(&String::from_utf8_lossy(&buffer))?;
    Ok(ExitCode::SUCCESS)
}
