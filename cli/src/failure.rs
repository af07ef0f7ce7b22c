//! The one place errors are rendered, and exit codes decided.
//!
//! 0: success. 1: the user's input or environment is wrong (a recipe, a flag, a file
//! that is not there). 2: sous itself failed (a bug, or an I/O error it cannot
//! explain). `sous serve` passes an engine's own exit code through. Which of these an
//! error means, and its hint, is the error type's own [`Diagnose`] implementation;
//! this module only finds and prints it.

use std::process::ExitCode;

/// The chain on one line, each cause once (the library's, which journals use too).
pub use sous::chain::message;
use sous::error::{Class, Diagnose, diagnosis};

use crate::shell::Shell;

/// An error the user can fix, with an optional next step: the binary's own mistakes
/// about flags and arguments, which belong to no library operation.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct UserError {
    /// What is wrong.
    pub message: String,
    /// What to do.
    pub hint: Option<String>,
}

impl UserError {
    /// An error with a hint.
    pub fn new(message: impl Into<String>, hint: Option<&str>) -> UserError {
        UserError {
            message: message.into(),
            hint: hint.map(str::to_owned),
        }
    }
}

impl Diagnose for UserError {
    fn class(&self) -> Class {
        Class::User
    }

    fn hint(&self) -> Option<String> {
        self.hint.clone()
    }
}

/// An error already reported in detail (e.g. `recipe check` listed every failing file);
/// only the exit code, and an optional summary line, remain to be given.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Reported(pub String);

/// Renders `err` on stderr and picks the exit code.
pub fn report(shell: &Shell, err: &anyhow::Error) -> ExitCode {
    // The reader of stdout went away (`sous list | head`): nothing is wrong and nobody
    // is left to tell, as ripgrep and coreutils behave.
    if err
        .chain()
        .filter_map(|c| c.downcast_ref::<std::io::Error>())
        .any(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    {
        return ExitCode::SUCCESS;
    }
    if let Some(reported) = err.downcast_ref::<Reported>() {
        if !reported.0.is_empty() {
            shell.error(&reported.0, None);
        }
        return ExitCode::from(Class::User.exit_code());
    }
    ExitCode::from(print(shell, err).exit_code())
}

/// Renders `err` on stderr (`error:` and `hint:` lines) and returns its class, for a
/// command that reports a failure and goes on (`recipe check` of several files).
pub fn print(shell: &Shell, err: &anyhow::Error) -> Class {
    let (class, hint) = classify(err);
    shell.error(&message(err), hint.as_deref());
    class
}

/// The class and hint of an error, from the first cause sous knows.
pub fn classify(err: &anyhow::Error) -> (Class, Option<String>) {
    for cause in err.chain() {
        let known = match cause.downcast_ref::<UserError>() {
            Some(e) => Some(e as &dyn Diagnose),
            None => diagnosis(cause),
        };
        if let Some(e) = known {
            return (e.class(), e.hint());
        }
    }
    (
        Class::Internal,
        Some("this is a bug in sous; please report it with the command you ran".into()),
    )
}

/// A command line clap could not parse: help and version go to stdout with code 0,
/// mistakes to stderr with code 1.
pub fn usage(err: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let code = match err.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => 0,
        _ => Class::User.exit_code(),
    };
    // clap picks stdout or stderr itself.
    let _ = err.print();
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_error_is_a_bug_and_a_user_error_is_not() {
        let (class, hint) = classify(&anyhow::anyhow!("boom"));
        assert_eq!(class, Class::Internal);
        assert!(hint.is_some_and(|h| h.contains("bug")));
        let err = anyhow::Error::new(UserError::new("bad flag", Some("fix it"))).context("running");
        assert_eq!(classify(&err), (Class::User, Some("fix it".into())));
    }
}
