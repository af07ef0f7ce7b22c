//! The recipe format, described from its own types: the JSON Schema editors and
//! GitOps validators use (`recipes/recipe.schema.json`) and the reference for people
//! (`docs/recipe.md`), both generated from the doc comments in `file.rs`. A test fails
//! when the committed copies are stale.

use serde_json::Value;

use super::file::RecipeFile;

/// The JSON Schema of a recipe file, pretty-printed with a trailing newline.
pub fn json_schema() -> String {
    let schema = schemars::schema_for!(RecipeFile);
    let mut text = serde_json::to_string_pretty(&schema).unwrap_or_default();
    text.push('\n');
    text
}

fn schema_value() -> Value {
    serde_json::to_value(schemars::schema_for!(RecipeFile)).unwrap_or(Value::Null)
}

/// Every key a recipe may contain, dotted (`serving.max_model_len`), tables included.
pub fn all_keys() -> Vec<String> {
    let root = schema_value();
    let mut keys = Vec::new();
    collect_keys(&root, &root, "", &mut keys);
    keys
}

fn collect_keys(root: &Value, node: &Value, prefix: &str, keys: &mut Vec<String>) {
    let Some(properties) = node.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, property) in properties {
        let key = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        keys.push(key.clone());
        if let Some(section) = object_def(root, property) {
            collect_keys(root, section, &key, keys);
        }
    }
}

/// The definition a property refers to, when it is a table with named keys.
fn object_def<'a>(root: &'a Value, property: &'a Value) -> Option<&'a Value> {
    let target = deref(root, non_null(property));
    target.get("properties").is_some().then_some(target)
}

/// For `Option<T>`, the `T` part of `anyOf: [T, null]`.
fn non_null(property: &Value) -> &Value {
    if let Some(any_of) = property.get("anyOf").and_then(Value::as_array) {
        let rest: Vec<&Value> = any_of
            .iter()
            .filter(|v| v.get("type").and_then(Value::as_str) != Some("null"))
            .collect();
        if let [only] = rest.as_slice() {
            return only;
        }
    }
    property
}

fn deref<'a>(root: &'a Value, node: &'a Value) -> &'a Value {
    match node.get("$ref").and_then(Value::as_str) {
        Some(reference) => {
            let name = reference.rsplit('/').next().unwrap_or_default();
            root.pointer(&format!("/$defs/{name}")).unwrap_or(node)
        }
        None => node,
    }
}

/// The recipe reference, in Markdown.
pub fn markdown() -> String {
    let root = schema_value();
    let mut out = String::new();
    out.push_str("# Recipe reference\n\n");
    out.push_str("<!-- Generated from engine/src/recipe/file.rs by `sous recipe schema --markdown`. Do not edit. -->\n\n");
    out.push_str(
        "A recipe is a TOML file. Every key is optional in a single file: a recipe may take most of its \
         settings from a parent (`extends`), from `SOUS_<TABLE>__<KEY>` environment variables \
         (`SOUS_MEMORY__GPU_UTILIZATION=0.85`) and from `--set table.key=value` on the command line, \
         later layers winning. Unset keys leave the engine's own default; `sous recipe check` prints the \
         result. Editors can validate recipes against [`recipes/recipe.schema.json`](../recipes/recipe.schema.json).\n",
    );
    let mut sections: Vec<(String, &Value)> = Vec::new();
    out.push_str("\n## Top level\n\n");
    write_table(&root, &root, "", &mut out, &mut sections);
    let mut i = 0;
    while i < sections.len() {
        let (path, def) = sections[i].clone();
        out.push_str(&format!("\n## `[{path}]`\n\n"));
        if let Some(description) = def.get("description").and_then(Value::as_str) {
            out.push_str(&one_paragraph(description));
            out.push_str("\n\n");
        }
        let mut nested = Vec::new();
        write_table(&root, def, &path, &mut out, &mut nested);
        // Sub-tables follow their parent.
        for (offset, entry) in nested.into_iter().enumerate() {
            sections.insert(i + 1 + offset, entry);
        }
        i += 1;
    }
    out
}

fn write_table<'a>(
    root: &'a Value,
    node: &'a Value,
    prefix: &str,
    out: &mut String,
    sections: &mut Vec<(String, &'a Value)>,
) {
    out.push_str("| Key | Type | Description |\n|---|---|---|\n");
    let Some(properties) = node.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, property) in properties {
        let key = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        let description = property
            .get("description")
            .and_then(Value::as_str)
            .map(one_paragraph)
            .unwrap_or_default();
        let (ty, values) = describe_type(root, property);
        let mut cell = description;
        if let Some(section) = object_def(root, property) {
            cell.push_str(&format!(" See [`[{key}]`](#{}).", anchor(&key)));
            sections.push((key.clone(), section));
        }
        if !values.is_empty() {
            cell.push_str(" Values: ");
            cell.push_str(&values.join("; "));
            cell.push('.');
        }
        out.push_str(&format!(
            "| `{name}` | {ty} | {} |\n",
            cell.replace('|', "\\|").trim()
        ));
    }
}

fn anchor(key: &str) -> String {
    key.chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .collect()
}

fn one_paragraph(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A short type name, and the documented values of an enumeration.
fn describe_type(root: &Value, property: &Value) -> (String, Vec<String>) {
    let node = deref(root, non_null(property));
    if let Some(variants) = node.get("oneOf").and_then(Value::as_array) {
        let mut names = Vec::new();
        let mut values = Vec::new();
        for variant in variants {
            let name = variant
                .get("const")
                .or_else(|| variant.get("enum").and_then(|e| e.get(0)))
                .and_then(Value::as_str)
                .unwrap_or("?");
            names.push(format!("`\"{name}\"`"));
            if let Some(d) = variant.get("description").and_then(Value::as_str) {
                values.push(format!("`{name}`: {}", one_paragraph(d).trim_end_matches('.')));
            }
        }
        return (names.join(" \\| "), values);
    }
    if node.get("properties").is_some() {
        return ("table".into(), Vec::new());
    }
    if node.get("anyOf").is_some() {
        // ByteSize: an integer or a string with a unit.
        return ("integer or string (size)".into(), Vec::new());
    }
    let ty = match node.get("type") {
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(types)) => types
            .iter()
            .filter_map(Value::as_str)
            .filter(|t| *t != "null")
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "any".into(),
    };
    let ty = match ty.as_str() {
        "array" => {
            let (item, _) = node
                .get("items")
                .map_or(("any".into(), Vec::new()), |i| describe_type(root, i));
            format!("array of {item}")
        }
        "object" => match node
            .get("additionalProperties")
            .and_then(|a| a.get("type"))
            .and_then(Value::as_str)
        {
            Some(t) => format!("table of {t}s"),
            None => "table".into(),
        },
        "number" => "number".into(),
        other => other.to_owned(),
    };
    (ty, Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knows_every_section_key() {
        let keys = all_keys();
        for key in [
            "name",
            "extends",
            "model.repo",
            "memory.kv_cache_bytes",
            "serving.speculative",
            "serving.speculative.tokens",
            "server.api_key_env",
            "env",
        ] {
            assert!(keys.contains(&key.to_owned()), "{key} missing from {keys:?}");
        }
    }

    #[test]
    fn every_key_is_documented() {
        let doc = markdown();
        for key in all_keys() {
            let name = key.rsplit('.').next().unwrap_or_default();
            assert!(doc.contains(&format!("| `{name}` |")), "{key} has no row");
        }
        assert!(!doc.contains("|  |"), "a key lacks a description:\n{doc}");
    }
}
