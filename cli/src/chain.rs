//! An error chain told on one line, "loading x: cannot read y: No such file", for the
//! terminal and for what the library records (a failed trial's journal entry). Apart
//! from [`crate::error`], which lists every module's errors, so that any module may use it.

/// The chain on one line, "loading x: cannot read y: No such file", each cause once:
/// errors that already print their source (`{path}: {source}`) are not repeated.
pub fn message(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain() {
        let part = cause.to_string();
        if part.is_empty() || text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read {path}: {source}")]
    struct Read {
        path: &'static str,
        source: std::io::Error,
    }

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file");
        let err = anyhow::Error::new(Read {
            path: "x",
            source: io,
        })
        .context("loading y");
        assert_eq!(message(&err), "loading y: cannot read x: No such file");
    }
}
