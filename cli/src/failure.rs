//! Exit codes and the one place errors are rendered.
//!
//! 0: success. 1: the user's input or environment is wrong (a recipe, a flag, a file
//! that is not there). 2: sous itself failed (a bug, or an I/O error it cannot explain).
//! Later, `serve` passes an engine's own exit code through.

use std::process::ExitCode;

use sous_engine::launch::RenderError;
use sous_engine::recipe::RecipeError;

use crate::hub::api::HubError;
use crate::hub::pull::PullError;
use crate::quantize::QuantizeError;
use crate::shell::Shell;

/// The user's input or environment is wrong.
pub const USER: u8 = 1;
/// sous failed.
pub const INTERNAL: u8 = 2;

/// An error the user can fix, with an optional next step. Commands return it (inside
/// `anyhow`) for mistakes that are not recipe or rendering errors.
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

/// An error already reported in detail (e.g. `recipe check` listed every failing file);
/// only the exit code, and an optional summary line, remain to be given.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Reported(pub String);

/// Renders `err` on stderr and picks the exit code.
pub fn report(shell: &Shell, err: &anyhow::Error) -> ExitCode {
    if let Some(reported) = err.downcast_ref::<Reported>() {
        if !reported.0.is_empty() {
            shell.error(&reported.0, None);
        }
        return ExitCode::from(USER);
    }
    let (code, hint) = classify(err);
    // `{:#}` prints the context chain on one line: "loading x: cannot read ...".
    shell.error(&format!("{err:#}"), hint.as_deref());
    ExitCode::from(code)
}

/// The exit code and hint for an error, from the first cause sous recognises.
pub fn classify(err: &anyhow::Error) -> (u8, Option<String>) {
    for cause in err.chain() {
        if let Some(e) = cause.downcast_ref::<RecipeError>() {
            return (USER, e.hint().map(str::to_owned));
        }
        if let Some(e) = cause.downcast_ref::<RenderError>() {
            return (USER, e.hint());
        }
        if let Some(e) = cause.downcast_ref::<UserError>() {
            return (USER, e.hint.clone());
        }
        if let Some(e) = cause.downcast_ref::<PullError>() {
            return (if e.is_internal() { INTERNAL } else { USER }, e.hint());
        }
        if let Some(e) = cause.downcast_ref::<HubError>() {
            return (USER, e.hint());
        }
        if let Some(e) = cause.downcast_ref::<QuantizeError>() {
            return (if e.is_internal() { INTERNAL } else { USER }, e.hint());
        }
        if let Some(e) = cause.downcast_ref::<crate::bench::logs::LogsError>() {
            return (if e.is_internal() { INTERNAL } else { USER }, e.hint());
        }
    }
    (
        INTERNAL,
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
        _ => USER,
    };
    // clap picks stdout or stderr itself.
    let _ = err.print();
    ExitCode::from(code)
}
