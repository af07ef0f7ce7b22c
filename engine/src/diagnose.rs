//! What kind of failure an error is and what the user can do about it: one trait,
//! [`Diagnose`], that every error type of sous implements next to its definition.
//! The `sous` binary renders errors in one place and asks this trait for the exit
//! code and the `hint:` line; nothing else decides them.
//!
//! Not here: how errors look on the terminal (the binary's `failure` module).

/// Who has to act, which is what the exit code tells a script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// The input or the environment is wrong (a recipe, a flag, a file, the network,
    /// a full disk): exit code 1.
    User,
    /// sous itself failed (a bug, or an I/O error it cannot explain): exit code 2.
    Internal,
    /// An engine sous ran failed with this exit code, which `sous serve` passes
    /// through.
    Engine(i32),
}

/// The exit code of [`Class::User`].
pub const EXIT_USER: u8 = 1;
/// The exit code of [`Class::Internal`].
pub const EXIT_INTERNAL: u8 = 2;

impl Class {
    /// The process exit code: 1, 2, or the engine's own (1 when it does not fit a
    /// byte or is 0, so that a failure never exits 0).
    pub fn exit_code(self) -> u8 {
        match self {
            Class::User => EXIT_USER,
            Class::Internal => EXIT_INTERNAL,
            Class::Engine(code) => u8::try_from(code).unwrap_or(EXIT_USER).max(1),
        }
    }
}

/// An error that knows its [`Class`] and, when there is an obvious one, the user's
/// next step.
pub trait Diagnose: std::error::Error {
    /// Who has to act.
    fn class(&self) -> Class;

    /// A next step for the user, shown as `hint: ...`.
    fn hint(&self) -> Option<String> {
        None
    }

    /// Whether sous itself is at fault.
    fn is_internal(&self) -> bool {
        self.class() == Class::Internal
    }
}

/// `Class::User` unless `internal`.
pub fn user_unless(internal: bool) -> Class {
    if internal { Class::Internal } else { Class::User }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_never_claim_success() {
        assert_eq!(Class::User.exit_code(), 1);
        assert_eq!(Class::Internal.exit_code(), 2);
        assert_eq!(Class::Engine(3).exit_code(), 3);
        assert_eq!(Class::Engine(0).exit_code(), 1);
        assert_eq!(Class::Engine(-9).exit_code(), 1);
        assert_eq!(Class::Engine(137).exit_code(), 137);
        assert_eq!(Class::Engine(300).exit_code(), 1);
    }
}
