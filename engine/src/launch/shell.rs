//! A [`Launch`] as a POSIX shell script a person can read, diff and run.
//!
//! Quoting uses `shlex` (the rules of Python's `shlex.quote`), so JSON values such as
//! `--speculative-config` come out single-quoted exactly as people write them.

use super::{Arg, Launch};

pub(super) fn render(launch: &Launch) -> String {
    let mut out = String::new();
    for file in &launch.files {
        let path = quote(&file.path.to_string_lossy());
        // A quoted delimiter keeps the shell from expanding anything inside.
        out.push_str(&format!(
            "mkdir -p \"$(dirname {path})\"\ncat > {path} <<'SOUS_EOF'\n"
        ));
        out.push_str(&file.contents);
        if !file.contents.ends_with('\n') {
            out.push('\n');
        }
        out.push_str("SOUS_EOF\n");
    }
    let mut lines: Vec<String> = launch
        .env
        .iter()
        .map(|(name, value)| format!("{name}={}", arg(value)))
        .collect();

    let mut args = launch.argv.iter().peekable();
    let mut command = Vec::new();
    // The program, its positional arguments and short options (`python3 -m module`)
    // share the first line; each long flag starts a line of its own.
    while let Some(a) = args.next_if(|a| !is_flag(a)) {
        command.push(arg(a));
    }
    lines.push(command.join(" "));
    while let Some(a) = args.next() {
        let mut line = format!("  {}", arg(a));
        if is_flag(a) {
            while let Some(value) = args.next_if(|v| !is_flag(v)) {
                line.push(' ');
                line.push_str(&arg(value));
            }
        }
        lines.push(line);
    }
    out.push_str(&lines.join(" \\\n"));
    out.push('\n');
    out
}

fn is_flag(a: &Arg) -> bool {
    matches!(a, Arg::Lit(s) if s.starts_with("--") && s.len() > 2)
}

fn arg(a: &Arg) -> String {
    match a {
        Arg::Lit(s) => quote(s),
        Arg::FromEnv(var) => format!("\"${var}\""),
    }
}

fn quote(s: &str) -> String {
    shlex::try_quote(s).map_or_else(|_| format!("'{}'", s.replace('\0', "")), |q| q.into_owned())
}
