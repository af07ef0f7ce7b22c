//! YAML that YAML 1.1 readers read back exactly: Kubernetes (sigs.k8s.io/yaml over
//! go-yaml v2) and Docker Compose v1 (PyYAML) both read 1.1, where a plain `no`, `on`
//! or `y` is a boolean and `2026-01-01` a date, so an environment value `"no"` becomes
//! `false` and the object is rejected at apply time.
//!
//! Hand-rolled on purpose: serde_yaml_ng (what the rest of sous writes YAML with)
//! quotes for YAML 1.2 only, and yaml-rust2's emitter leaves dates plain. The value
//! is first serialized by serde_yaml_ng (its `Mapping` keeps field order), then
//! written in block style with a strict rule for scalars: a string is plain only when
//! it is made of letters, digits, `_`, `.`, `/`, `-` and `=`, starts with a letter, `_`,
//! `/` or `--`, and is none of YAML 1.1's boolean and null words; every other string
//! is double-quoted with JSON's escapes (valid in 1.1 and 1.2), or written as a
//! literal block when it spans lines.

use std::fmt::Write as _;

use serde::Serialize;
use serde_yaml_ng::Value;

/// `value` as a YAML document (block style, two-space indentation, `- ` items at the
/// key's indentation as kubectl writes them).
pub fn to_string<T: Serialize>(value: &T) -> Result<String, String> {
    let value = serde_yaml_ng::to_value(value).map_err(|e| e.to_string())?;
    let mut out = String::new();
    match &value {
        Value::Mapping(m) if !m.is_empty() => mapping(m, 0, &mut out),
        Value::Sequence(s) if !s.is_empty() => sequence(s, 0, &mut out),
        other => {
            let _ = writeln!(out, "{}", inline(other));
        }
    }
    Ok(out)
}

fn mapping(map: &serde_yaml_ng::Mapping, indent: usize, out: &mut String) {
    for (key, value) in map {
        let _ = write!(out, "{:indent$}{}:", "", inline(key));
        match value {
            Value::Mapping(m) if !m.is_empty() => {
                out.push('\n');
                mapping(m, indent + 2, out);
            }
            Value::Sequence(s) if !s.is_empty() => {
                out.push('\n');
                sequence(s, indent, out);
            }
            Value::String(s) if s.contains('\n') && block_ok(s) => block(s, indent + 2, out),
            other => {
                let _ = writeln!(out, " {}", inline(other));
            }
        }
    }
}

fn sequence(items: &[Value], indent: usize, out: &mut String) {
    for item in items {
        match item {
            Value::Mapping(m) if !m.is_empty() => {
                // The first key goes on the `- ` line: render at the item's indentation,
                // then put the dash in front.
                let mut inner = String::new();
                mapping(m, indent + 2, &mut inner);
                let _ = write!(out, "{:indent$}- {}", "", &inner[indent + 2..]);
            }
            Value::Sequence(s) if !s.is_empty() => {
                let mut inner = String::new();
                sequence(s, indent + 2, &mut inner);
                let _ = write!(out, "{:indent$}- {}", "", &inner[indent + 2..]);
            }
            Value::String(s) if s.contains('\n') && block_ok(s) => {
                let _ = write!(out, "{:indent$}-", "");
                block(s, indent + 2, out);
            }
            other => {
                let _ = writeln!(out, "{:indent$}- {}", "", inline(other));
            }
        }
    }
}

/// Whether `s` can be a literal block: printable, and its first line does not start
/// with a space (which would need an indentation indicator).
fn block_ok(s: &str) -> bool {
    !s.starts_with([' ', '\n']) && !s.chars().any(|c| c.is_control() && c != '\n' && c != '\t')
}

/// ` |` (or `|-` / `|+` for other endings) and the lines, indented.
fn block(s: &str, indent: usize, out: &mut String) {
    let body = s.trim_end_matches('\n');
    let trailing = s.len() - body.len();
    let chomp = match trailing {
        0 => "-",
        1 => "",
        _ => "+",
    };
    let _ = writeln!(out, " |{chomp}");
    for line in body.split('\n') {
        if line.is_empty() {
            out.push('\n');
        } else {
            let _ = writeln!(out, "{:indent$}{line}", "");
        }
    }
    for _ in 1..trailing {
        out.push('\n');
    }
}

/// A scalar (or an empty collection) on one line.
fn inline(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => scalar(s),
        Value::Sequence(_) => "[]".into(),
        Value::Mapping(_) => "{}".into(),
        Value::Tagged(t) => inline(&t.value),
    }
}

fn scalar(s: &str) -> String {
    if is_plain(s) {
        s.to_owned()
    } else {
        serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
    }
}

/// YAML 1.1's boolean and null words (yaml.org/type/bool.html, null.html).
const AMBIGUOUS: &[&str] = &["y", "yes", "n", "no", "true", "false", "on", "off", "null", "~"];

fn is_plain(s: &str) -> bool {
    let starts_ok = s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_' || c == '/')
        || (s.starts_with("--") && s.len() > 2);
    starts_ok
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-' | '='))
        && !AMBIGUOUS.contains(&s.to_ascii_lowercase().as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn what_yaml_1_1_would_misread_is_quoted() {
        for s in [
            "no",
            "No",
            "ON",
            "off",
            "y",
            "Yes",
            "true",
            "null",
            "~",
            "2026-01-01",
            "1e3",
            "0x10",
            "017",
            "12:30",
            "-1",
            "+1",
            ".inf",
            "",
            " lead",
            "a b",
            "$(VAR)",
            "'q'",
            "=",
        ] {
            assert!(!is_plain(s), "{s:?} would be plain");
        }
        for s in [
            "vllm",
            "--max-model-len",
            "/var/lib/sous",
            "nvidia.com/gpu",
            "v0.27.1",
            "Prune=false",
        ] {
            assert!(is_plain(s), "{s:?} would be quoted");
        }
    }

    #[test]
    fn documents_read_back_as_written() {
        let value = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "data": {"recipe.toml": "# comment\nname = \"x\"\n\n[model]\nrepo = \"a/b\"\n", "no-newline": "a\nb", "two": "a\n\n"},
            "env": [{"name": "A", "value": "no"}, {"name": "B", "value": "2026-01-01"}, {"name": "C", "value": "line\u{1}"}],
            "nested": [[1, 2], ["x"]],
            "empty": {}, "none": [], "n": 0.9, "t": true, "z": null,
            "command": ["vllm", "serve", "--x", "{\"method\":\"mtp\"}", "a b"]
        });
        let text = to_string(&value).expect("yaml");
        let back: serde_json::Value = serde_yaml_ng::from_str(&text).expect("parses");
        assert_eq!(back, value, "{text}");
        assert!(text.contains("value: \"no\""), "{text}");
        assert!(text.contains("recipe.toml: |\n    # comment\n"), "{text}");
    }
}
