//! Chat templates: the Jinja template a model ships in `tokenizer_config.json`
//! (`chat_template`) rendered with minijinja, so that a conversation becomes exactly the
//! prompt text transformers' `apply_chat_template` would give.
//!
//! transformers renders templates in a Jinja2 sandbox with `trim_blocks` and
//! `lstrip_blocks`, the `loopcontrols` extension, and a few globals
//! (`utils/chat_template_utils.py`, `_cached_compile_jinja_template`): `raise_exception`,
//! `strftime_now`, and a `tojson` filter that is Python's `json.dumps` (no HTML
//! escaping, `ensure_ascii=False`), plus the special tokens (`bos_token`, `eos_token`,
//! ...) in the context. We mirror that environment; Python string and dict methods
//! (`.strip()`, `.items()`) come from minijinja-contrib's `pycompat`.
//!
//! Not here: tokenizing the rendered text, and transformers' conversation rewriting
//! before rendering (reasoning-field aliasing, `continue_final_message`) or its
//! `{% generation %}` tag, which no template we ship uses.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, ErrorKind};
use serde::Serialize;

/// Name under which the template is stored in the environment.
const TEMPLATE: &str = "chat_template";

/// Why a chat template could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The template does not parse.
    #[error("the chat template does not parse: {0}")]
    Syntax(String),
    /// The template called `raise_exception(message)`: the conversation is one the
    /// model's authors refuse (e.g. roles that do not alternate).
    #[error("the chat template refused the conversation: {0}")]
    Raised(String),
    /// Rendering failed for another reason (an undefined attribute, a bad argument).
    #[error("rendering the chat template failed: {0}")]
    Render(String),
    /// `tokenizer_config.json` has no usable `chat_template`.
    #[error("tokenizer_config.json has no chat template{0}")]
    Missing(String),
}

/// The special tokens a template may print, as transformers puts them in its context.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Beginning of sequence.
    pub bos_token: Option<String>,
    /// End of sequence (or of turn).
    pub eos_token: Option<String>,
    /// Unknown token.
    pub unk_token: Option<String>,
    /// Padding.
    pub pad_token: Option<String>,
}

/// What to render besides the messages.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    /// End with the header of an assistant turn, for the model to complete.
    pub add_generation_prompt: bool,
    /// Tool (function) schemas, passed to the template as `tools`.
    pub tools: Option<Value>,
    /// Documents for retrieval templates, passed as `documents`.
    pub documents: Option<Value>,
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    special: SpecialTokens,
}

/// A marker that a template called `raise_exception`, so the error can be told apart.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

impl ChatTemplate {
    /// Compiles `source` with transformers' environment.
    pub fn new(source: &str, special: SpecialTokens) -> Result<ChatTemplate, ChatError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| ChatError::Syntax(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.set_formatter(python_formatter);
        env.add_template_owned(TEMPLATE, source.to_owned())
            .map_err(|e| ChatError::Syntax(describe(&e)))?;
        Ok(ChatTemplate { env, special })
    }

    /// The template and special tokens of a `tokenizer_config.json` (special tokens may
    /// be strings or `{"content": ...}` objects, as transformers writes either).
    pub fn from_tokenizer_config(config: &serde_json::Value) -> Result<ChatTemplate, ChatError> {
        let template = match config.get("chat_template") {
            Some(serde_json::Value::String(s)) => s.as_str(),
            Some(serde_json::Value::Array(named)) => named
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(|t| t.as_str())
                .ok_or_else(|| ChatError::Missing(" named `default`".to_owned()))?,
            _ => return Err(ChatError::Missing(String::new())),
        };
        let token = |key: &str| match config.get(key) {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(obj) => obj.get("content").and_then(|c| c.as_str()).map(str::to_owned),
            None => None,
        };
        let special = SpecialTokens {
            bos_token: token("bos_token"),
            eos_token: token("eos_token"),
            unk_token: token("unk_token"),
            pad_token: token("pad_token"),
        };
        ChatTemplate::new(template, special)
    }

    /// Renders a conversation: `messages` is a list of `{"role", "content", ...}` maps
    /// (anything serde serializes that way).
    pub fn render(&self, messages: &impl Serialize, options: &RenderOptions) -> Result<String, ChatError> {
        let template = self
            .env
            .get_template(TEMPLATE)
            .map_err(|e| ChatError::Render(describe(&e)))?;
        let special = &self.special;
        let mut ctx: Vec<(&str, Value)> = vec![
            ("messages", Value::from(minijinja::value::Serde(messages))),
            (
                "add_generation_prompt",
                Value::from(options.add_generation_prompt),
            ),
            ("tools", options.tools.clone().unwrap_or(Value::from(()))),
            ("documents", options.documents.clone().unwrap_or(Value::from(()))),
        ];
        // transformers passes only the special tokens that are set, so a template's
        // `bos_token is defined` sees the same thing here.
        for (name, token) in [
            ("bos_token", &special.bos_token),
            ("eos_token", &special.eos_token),
            ("unk_token", &special.unk_token),
            ("pad_token", &special.pad_token),
        ] {
            if let Some(token) = token {
                ctx.push((name, Value::from(token.as_str())));
            }
        }
        template.render(Value::from_pairs(ctx)).map_err(|e| {
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            while let Some(err) = source {
                if let Some(raised) = err.downcast_ref::<Raised>() {
                    return ChatError::Raised(raised.0.clone());
                }
                source = err.source();
            }
            ChatError::Render(describe(&e))
        })
    }
}

/// A minijinja error with its line, on one line.
fn describe(err: &minijinja::Error) -> String {
    match err.line() {
        Some(line) => format!("{} (line {line})", err.detail().unwrap_or(&err.to_string())),
        None => err.to_string(),
    }
}

/// Prints values as Jinja2 does, through Python's `str()`: `True`, `False`, `None`,
/// and floats in Python's repr, where minijinja would print `true`, `false`, `none`.
fn python_formatter(
    out: &mut minijinja::Output,
    state: &mut minijinja::State,
    value: &Value,
) -> Result<(), minijinja::Error> {
    let text = match value.kind() {
        ValueKind::Bool => if value.is_true() { "True" } else { "False" }.to_owned(),
        ValueKind::None => "None".to_owned(),
        ValueKind::Number if !value.is_integer() => {
            let f = f64::try_from(value.clone())?;
            match python_float_repr(f).as_str() {
                "NaN" => "nan".to_owned(),
                "Infinity" => "inf".to_owned(),
                "-Infinity" => "-inf".to_owned(),
                repr => repr.to_owned(),
            }
        }
        _ => return minijinja::escape_formatter(out, state, value),
    };
    out.write_str(&text)
        .map_err(|_| minijinja::Error::new(ErrorKind::WriteFailure, "cannot write the rendered template"))
}

/// `raise_exception(message)`: aborts rendering with the template's own message.
fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

/// `strftime_now(format)`: the local time, formatted like Python's `datetime.strftime`
/// (chrono's specifiers are C's, as Python's are).
fn strftime_now(format: String) -> Result<Value, minijinja::Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item<'_>> = StrftimeItems::new(&format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format `{format}`"),
        ));
    }
    let mut out = String::new();
    write!(
        out,
        "{}",
        chrono::Local::now().format_with_items(items.into_iter())
    )
    .map_err(|_| {
        minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: cannot format `{format}`"),
        )
    })?;
    Ok(Value::from(out))
}

/// The `tojson` filter of transformers: Python's `json.dumps(x, ensure_ascii=False,
/// indent=indent, separators=separators, sort_keys=sort_keys)`. minijinja's own `tojson`
/// escapes `<`, `>`, `&` and `'` for HTML, which would change prompts.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.kind() {
            ValueKind::Number => Some(" ".repeat(usize::try_from(v)?)),
            ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
            _ => return Err(bad_arg("tojson: indent must be an integer or a string")),
        },
    };
    let (item_sep, key_sep) = match separators {
        Some(seps) if !seps.is_none() => {
            let parts: Vec<String> = seps
                .try_iter()?
                .map(|p| p.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| bad_arg("tojson: separators must be two strings"))?;
            match <[String; 2]>::try_from(parts) {
                Ok([item, key]) => (item, key),
                Err(_) => return Err(bad_arg("tojson: separators must be two strings")),
            }
        }
        // json.dumps: (', ', ': '), or (',', ': ') when indenting.
        _ if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        _ => (", ".to_owned(), ": ".to_owned()),
    };
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    style.write(&mut out, &value, 0)?;
    Ok(Value::from(out))
}

fn bad_arg(message: &str) -> minijinja::Error {
    minijinja::Error::new(ErrorKind::InvalidOperation, message.to_owned())
}

/// How `json.dumps` lays text out. Written here because the output must match CPython's
/// `json` module byte for byte (float repr, separators, escapes), which no JSON crate
/// promises.
struct JsonStyle {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl JsonStyle {
    fn write(&self, out: &mut String, value: &Value, depth: usize) -> Result<(), minijinja::Error> {
        match value.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number if value.is_integer() => {
                let _ = write!(out, "{value}");
            }
            ValueKind::Number => out.push_str(&python_float_repr(f64::try_from(value.clone())?)),
            ValueKind::String => self.write_str(out, value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.write_container(out, '[', ']', depth, items.len(), |out, i| {
                    self.write(out, &items[i], depth + 1)
                })?;
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                self.write_container(out, '{', '}', depth, keys.len(), |out, i| {
                    let key = &keys[i];
                    let key_text = match key.kind() {
                        ValueKind::String => key.as_str().unwrap_or_default().to_owned(),
                        ValueKind::None => "null".to_owned(),
                        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_owned(),
                        ValueKind::Number => key.to_string(),
                        _ => return Err(bad_arg("tojson: keys must be str, int, float, bool or None")),
                    };
                    self.write_str(out, &key_text);
                    out.push_str(&self.key_sep);
                    self.write(out, &value.get_item(key)?, depth + 1)
                })?;
            }
            ValueKind::Undefined => {
                return Err(bad_arg(
                    "tojson: Object of type Undefined is not JSON serializable",
                ));
            }
            _ => {
                return Err(bad_arg(&format!(
                    "tojson: Object of type {} is not JSON serializable",
                    value.kind()
                )));
            }
        }
        Ok(())
    }

    fn write_container(
        &self,
        out: &mut String,
        open: char,
        close: char,
        depth: usize,
        len: usize,
        mut item: impl FnMut(&mut String, usize) -> Result<(), minijinja::Error>,
    ) -> Result<(), minijinja::Error> {
        out.push(open);
        if len == 0 {
            out.push(close);
            return Ok(());
        }
        for i in 0..len {
            if i > 0 {
                out.push_str(&self.item_sep);
            }
            if let Some(indent) = &self.indent {
                out.push('\n');
                out.push_str(&indent.repeat(depth + 1));
            }
            item(out, i)?;
        }
        if let Some(indent) = &self.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth));
        }
        out.push(close);
        Ok(())
    }

    fn write_str(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c if self.ensure_ascii && !c.is_ascii() => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// CPython's `repr(float)`: the shortest digits that round-trip, positional when the
/// decimal exponent is in [-4, 16), scientific (`1e-05`, `1.5e+16`) otherwise, and
/// always with a `.0` for integral positional values. NaN and infinities as `json`
/// writes them.
pub fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    // Rust's `{:e}` prints the shortest round-trip digits, e.g. `1.5e-5`.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if f.is_sign_negative() { "-" } else { "" };
    // CPython `format_float_short`: decpt = exp + 1; exponent form when decpt <= -4
    // or decpt > 16.
    let decpt = exp + 1;
    if decpt <= -4 || decpt > 16 {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{frac}e{esign}{:02}", exp.abs());
    }
    let body = if decpt <= 0 {
        format!("0.{}{digits}", "0".repeat(decpt.unsigned_abs() as usize))
    } else if decpt as usize >= digits.len() {
        format!("{digits}{}.0", "0".repeat(decpt as usize - digits.len()))
    } else {
        let (int, frac) = digits.split_at(decpt as usize);
        format!("{int}.{frac}")
    };
    format!("{sign}{body}")
}

impl crate::diagnose::Diagnose for ChatError {
    /// A chat template from the model, or a conversation from a client.
    fn class(&self) -> crate::diagnose::Class {
        crate::diagnose::Class::User
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_cpython() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1.5e-7, "1.5e-07"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123.456, "123.456"),
            (-0.0, "-0.0"),
            (0.1 + 0.2, "0.30000000000000004"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(python_float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn tojson_is_json_dumps() -> Result<(), ChatError> {
        let t = ChatTemplate::new(
            "{{ messages | tojson }}|{{ messages | tojson(indent=2) }}|{{ messages[0] | tojson(sort_keys=true) }}",
            SpecialTokens::default(),
        )?;
        let messages: Value =
            serde_json::from_str::<Value>(r#"[{"z": "<a & b>", "a": [1, 2.5, null, true], "é": "\n"}]"#)
                .map_err(|e| ChatError::Render(e.to_string()))?;
        let out = t.render(&messages, &RenderOptions::default())?;
        assert_eq!(
            out,
            "[{\"z\": \"<a & b>\", \"a\": [1, 2.5, null, true], \"é\": \"\\n\"}]|[\n  {\n    \"z\": \"<a & b>\",\n    \"a\": [\n      1,\n      2.5,\n      null,\n      true\n    ],\n    \"é\": \"\\n\"\n  }\n]|{\"a\": [1, 2.5, null, true], \"z\": \"<a & b>\", \"é\": \"\\n\"}"
        );
        Ok(())
    }

    #[test]
    fn values_print_as_python_str() -> Result<(), ChatError> {
        let t = ChatTemplate::new(
            "{{ true }} {{ false }} {{ none }} {{ 1.0 }} {{ 1e-7 }} {{ 3 }} {{ undefined_name }}.",
            SpecialTokens::default(),
        )?;
        assert_eq!(
            t.render(&Vec::<Value>::new(), &RenderOptions::default())?,
            "True False None 1.0 1e-07 3 ."
        );
        Ok(())
    }

    #[test]
    fn only_set_special_tokens_are_defined() -> Result<(), ChatError> {
        let special = SpecialTokens {
            eos_token: Some("</s>".to_owned()),
            ..SpecialTokens::default()
        };
        let t = ChatTemplate::new("{{ bos_token is defined }} {{ eos_token }}", special)?;
        assert_eq!(
            t.render(&Vec::<Value>::new(), &RenderOptions::default())?,
            "False </s>"
        );
        Ok(())
    }

    #[test]
    fn raise_exception_is_its_own_error() -> Result<(), ChatError> {
        let t = ChatTemplate::new(
            "{{ raise_exception('roles must alternate') }}",
            SpecialTokens::default(),
        )?;
        match t.render(&Vec::<Value>::new(), &RenderOptions::default()) {
            Err(ChatError::Raised(message)) => assert_eq!(message, "roles must alternate"),
            other => panic!("expected Raised, got {other:?}"),
        }
        Ok(())
    }

    #[test]
    fn strftime_now_formats_the_year() -> Result<(), ChatError> {
        let t = ChatTemplate::new("{{ strftime_now('%Y-%m') }}", SpecialTokens::default())?;
        let out = t.render(&Vec::<Value>::new(), &RenderOptions::default())?;
        assert_eq!(out.len(), 7, "{out}");
        assert!(out[..4].chars().all(|c| c.is_ascii_digit()), "{out}");
        assert!(matches!(
            ChatTemplate::new("{{ strftime_now('%Q') }}", SpecialTokens::default())?
                .render(&Vec::<Value>::new(), &RenderOptions::default()),
            Err(ChatError::Render(_))
        ));
        Ok(())
    }

    #[test]
    fn syntax_errors_name_the_line() {
        match ChatTemplate::new("line one\n{% if %}", SpecialTokens::default()) {
            Err(ChatError::Syntax(message)) => assert!(message.contains("line 2"), "{message}"),
            other => panic!("expected a syntax error, got {other:?}"),
        }
    }
}
