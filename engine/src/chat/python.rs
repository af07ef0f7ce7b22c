//! What chat templates get from Python in transformers' Jinja2 environment, mirrored
//! for minijinja: values printed as Python's `str()` prints them, `raise_exception`,
//! `strftime_now`, and the `tojson` filter as `json.dumps` writes (CPython's float
//! repr, separators and escapes). Finding and rendering the templates is the parent's.

use std::fmt::Write as _;

use minijinja::ErrorKind;
use minijinja::value::{Kwargs, Value, ValueKind};

use super::Raised;

/// Prints values as Jinja2 does, through Python's `str()`: `True`, `False`, `None`,
/// and floats in Python's repr, where minijinja would print `true`, `false`, `none`.
pub(super) fn python_formatter(
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
pub(super) fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

/// `strftime_now(format)`: the local time, formatted like Python's `datetime.strftime`
/// (chrono's specifiers are C's, as Python's are).
pub(super) fn strftime_now(format: String) -> Result<Value, minijinja::Error> {
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
pub(super) fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
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
