//! Loading a recipe: the file, its `extends` chain, `SOUS_*` environment variables and
//! `--set` overrides, merged with figment (later wins), then checked key by key.
//!
//! Each file is parsed and checked on its own first, so that an unknown key or a wrong
//! type is reported with its file and line (figment forgets positions once values are
//! merged). The merged layers are then extracted again, which catches mistakes made in
//! the environment or on the command line. `Provenance` remembers every layer so that
//! later checks (`resolve.rs`) can point at the layer a value came from.

use std::fs;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Format, Toml};
use figment::value::Value;
use toml_edit::{ImDocument, Item, TableLike};

use super::error::{At, Location, RecipeError, closest};
use super::file::RecipeFile;
use super::schema;

/// Environment variables whose name starts with this and contains `__` override
/// recipe keys: `SOUS_MEMORY__GPU_UTILIZATION=0.85` sets `memory.gpu_utilization`.
pub const ENV_PREFIX: &str = "SOUS_";

/// One recipe file of a chain, parsed.
#[derive(Debug)]
pub struct SourceFile {
    /// The path as the user (or the `extends` that named it) wrote it.
    pub path: PathBuf,
    text: String,
    doc: ImDocument<String>,
    /// The file's own settings.
    pub raw: RecipeFile,
}

impl SourceFile {
    fn parse(path: PathBuf, text: String) -> Result<SourceFile, RecipeError> {
        let doc = ImDocument::parse(text.clone()).map_err(|e| RecipeError::Syntax {
            message: e.message().trim().to_owned(),
            at: e
                .span()
                .map(|span| Location::in_file(path.clone(), &text, span))
                .into(),
        })?;
        let mut file = SourceFile {
            path,
            text,
            doc,
            raw: RecipeFile::default(),
        };
        file.raw = Figment::from(Toml::string(&file.text))
            .extract::<RecipeFile>()
            .map_err(|e| file_error(e, &|path, key| file.locate(path, key)))?;
        Ok(file)
    }

    /// The location of a dotted key in this file: the key itself when `key`, else its value.
    fn locate(&self, path: &[&str], key: bool) -> Option<Location> {
        let (last, parents) = path.split_last()?;
        let mut table: &dyn TableLike = self.doc.as_table();
        for segment in parents {
            table = table.get(segment)?.as_table_like()?;
        }
        let (k, item) = table.get_key_value(last)?;
        let span = if key {
            k.span()
        } else {
            item_span(item).or_else(|| k.span())
        }?;
        Some(Location::in_file(self.path.clone(), &self.text, span))
    }
}

fn item_span(item: &Item) -> Option<std::ops::Range<usize>> {
    match item {
        Item::Value(value) => value.span(),
        Item::Table(table) => table.span(),
        Item::ArrayOfTables(array) => array.span(),
        Item::None => None,
    }
}

/// Where an override came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OverrideOrigin {
    /// A `SOUS_*` environment variable (its name).
    Env(String),
    /// A `--set key=value` argument (as written).
    Set(String),
}

/// One `key.path = value` laid over the recipe files.
#[derive(Debug, Clone)]
pub struct Override {
    origin: OverrideOrigin,
    key: String,
    value: Value,
}

/// The overrides laid over a recipe's files, in increasing precedence.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    entries: Vec<Override>,
}

impl Overrides {
    /// No overrides.
    pub fn new() -> Overrides {
        Overrides::default()
    }

    /// Adds the recipe overrides among environment variables: `SOUS_SECTION__KEY=value`.
    /// Other `SOUS_*` variables are settings of sous itself and are left alone.
    pub fn with_env(mut self, vars: impl IntoIterator<Item = (String, String)>) -> Overrides {
        let mut found: Vec<Override> = vars
            .into_iter()
            .filter_map(|(name, value)| {
                let rest = name.strip_prefix(ENV_PREFIX)?;
                if !rest.contains("__") {
                    return None;
                }
                let mut segments = rest.split("__");
                let section = segments.next()?.to_ascii_lowercase();
                // `[env]` keys are environment variable names: keep their case.
                let tail: Vec<String> = segments
                    .map(|s| {
                        if section == "env" {
                            s.to_owned()
                        } else {
                            s.to_ascii_lowercase()
                        }
                    })
                    .collect();
                let key = std::iter::once(section).chain(tail).collect::<Vec<_>>().join(".");
                Some(Override {
                    value: parse_value(&key, &value),
                    origin: OverrideOrigin::Env(name),
                    key,
                })
            })
            .collect();
        found.sort_by(|a, b| a.key.cmp(&b.key));
        self.entries.extend(found);
        self
    }

    /// Adds a `--set key.path=value` argument.
    pub fn set(&mut self, arg: &str) -> Result<(), RecipeError> {
        let (key, value) = arg
            .split_once('=')
            .filter(|(k, _)| !k.trim().is_empty() && !k.contains(char::is_whitespace))
            .ok_or_else(|| RecipeError::MalformedOverride { arg: arg.to_owned() })?;
        self.entries.push(Override {
            origin: OverrideOrigin::Set(arg.to_owned()),
            key: key.to_owned(),
            value: parse_value(key, value),
        });
        Ok(())
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Override values are read like TOML values (`8`, `0.85`, `true`, `[0.85, 0.8]`),
/// falling back to a plain string (`qwen3`); `[env]` values are always strings.
fn parse_value(key: &str, text: &str) -> Value {
    if key.starts_with("env.") {
        return Value::from(text.to_owned());
    }
    text.parse().unwrap_or_else(|_| Value::from(text.to_owned()))
}

/// Every layer a recipe was built from, to say where a value came from.
#[derive(Debug)]
pub struct Provenance {
    /// The files, from the root of the `extends` chain to the file that was named.
    pub files: Vec<SourceFile>,
    overrides: Vec<Override>,
}

impl Provenance {
    /// Where the value of a dotted key was set: the last layer that sets it wins, as
    /// it does for the value itself. `key` locates the key rather than its value.
    pub fn locate(&self, path: &[&str], key: bool) -> Option<Location> {
        let dotted = path.join(".");
        if let Some(o) = self.overrides.iter().rev().find(|o| {
            o.key == dotted
                || o.key.starts_with(&format!("{dotted}."))
                || dotted.starts_with(&format!("{}.", o.key))
        }) {
            return Some(match &o.origin {
                OverrideOrigin::Env(var) => Location::Env(var.clone()),
                OverrideOrigin::Set(arg) => Location::Set(arg.clone()),
            });
        }
        self.files.iter().rev().find_map(|f| f.locate(path, key))
    }

    /// The file that was named (the end of the chain).
    pub fn leaf(&self) -> &Path {
        self.files.last().map_or(Path::new(""), |f| f.path.as_path())
    }
}

/// Reads a recipe file and its `extends` chain and merges them with the overrides.
pub fn load_layers(path: &Path, overrides: &Overrides) -> Result<(RecipeFile, Provenance), RecipeError> {
    let files = read_chain(path)?;
    let mut figment = Figment::new();
    for file in &files {
        figment = figment.merge(Toml::string(&file.text));
    }
    for o in &overrides.entries {
        figment = figment.merge((o.key.as_str(), o.value.clone()));
    }
    let provenance = Provenance {
        files,
        overrides: overrides.entries.clone(),
    };
    let merged = figment
        .extract::<RecipeFile>()
        .map_err(|e| file_error(e, &|path, key| provenance.locate(path, key)))?;
    Ok((merged, provenance))
}

fn read_chain(leaf: &Path) -> Result<Vec<SourceFile>, RecipeError> {
    let mut chain: Vec<SourceFile> = Vec::new();
    let mut seen: Vec<PathBuf> = Vec::new();
    let mut next = Some((leaf.to_path_buf(), None));
    while let Some((path, named_at)) = next.take() {
        let text = fs::read_to_string(&path).map_err(|error| RecipeError::Read {
            path: path.clone(),
            error,
            at: At::from(named_at),
        })?;
        let canonical = fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if seen.contains(&canonical) {
            let mut cycle: Vec<PathBuf> = chain.iter().map(|f| f.path.clone()).collect();
            cycle.push(path);
            return Err(RecipeError::CyclicExtends { chain: cycle });
        }
        let file = SourceFile::parse(path, text)?;
        if let Some(parent) = &file.raw.extends {
            let dir = file.path.parent().unwrap_or(Path::new(""));
            next = Some((dir.join(parent), file.locate(&["extends"], false)));
        }
        seen.push(canonical);
        chain.push(file);
    }
    chain.reverse();
    Ok(chain)
}

/// Turns figment's error into ours, located by `locate`.
fn file_error(error: figment::Error, locate: &dyn Fn(&[&str], bool) -> Option<Location>) -> RecipeError {
    use figment::error::Kind;
    let path: Vec<&str> = error.path.iter().map(String::as_str).collect();
    let dotted = path.join(".");
    match &error.kind {
        Kind::UnknownField(field, expected) => {
            // Figment puts the unknown key itself at the end of the path.
            let mut path = path.clone();
            if path.last() == Some(&field.as_str()) {
                path.pop();
            }
            let dotted = path.join(".");
            let mut full = path.clone();
            full.push(field);
            let section = if path.is_empty() {
                "the top level".to_owned()
            } else {
                format!("`[{dotted}]`")
            };
            RecipeError::UnknownKey {
                key: field.clone(),
                section,
                at: locate(&full, true).into(),
                hint: unknown_key_hint(&path, field, expected),
            }
        }
        Kind::UnknownVariant(value, expected) => RecipeError::UnknownVariant {
            key: dotted,
            value: value.clone(),
            expected: expected.iter().map(|s| (*s).to_owned()).collect(),
            at: locate(&path, false).into(),
            hint: closest(value, expected.iter().copied()).map(|s| format!("did you mean `{s}`?")),
        },
        Kind::InvalidType(actual, expected) => RecipeError::InvalidValue {
            message: format!("expected {}, found {actual}", plain_type(expected)),
            at: locate(&path, false).into(),
            hint: None,
            key: dotted,
        },
        Kind::InvalidValue(actual, expected) => RecipeError::InvalidValue {
            message: format!("expected {expected}, found {actual}"),
            at: locate(&path, false).into(),
            hint: None,
            key: dotted,
        },
        Kind::Message(message) => RecipeError::InvalidValue {
            message: message.clone(),
            at: locate(&path, false).into(),
            hint: None,
            key: dotted,
        },
        _ => RecipeError::InvalidValue {
            message: error.kind.to_string(),
            at: locate(&path, false).into(),
            hint: None,
            key: dotted,
        },
    }
}

/// serde's Rust type names in words people use.
fn plain_type(expected: &str) -> &str {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" => "a whole number",
        "i8" | "i16" | "i32" | "i64" | "isize" => "an integer",
        "f32" | "f64" => "a number",
        "a boolean" | "bool" => "`true` or `false`",
        other => other,
    }
}

/// Engine flags people carry over from command lines, and the recipe key for each.
const ENGINE_FLAG_NAMES: &[(&str, &str)] = &[
    ("gpu_memory_utilization", "memory.gpu_utilization"),
    ("mem_fraction_static", "memory.gpu_utilization"),
    ("free_gpu_memory_fraction", "memory.gpu_utilization"),
    ("kv_cache_memory_bytes", "memory.kv_cache_bytes"),
    ("kv_cache_memory", "memory.kv_cache_bytes"),
    ("kv_offloading_size", "memory.kv_offload_bytes"),
    ("enable_prefix_caching", "serving.prefix_caching"),
    ("enable_chunked_prefill", "serving.chunked_prefill"),
    ("max_num_batched_tokens", "serving.max_batched_tokens"),
    ("tensor_parallel_size", "serving.tensor_parallel"),
    ("pipeline_parallel_size", "serving.pipeline_parallel"),
    ("data_parallel_size", "serving.data_parallel"),
    ("enable_expert_parallel", "serving.expert_parallel"),
    ("enable_auto_tool_choice", "serving.auto_tool_choice"),
    ("speculative_config", "serving.speculative"),
    ("context_length", "serving.max_model_len"),
    ("max_seq_len", "serving.max_model_len"),
    ("served_model_name", "model.served_name"),
    ("api_key", "server.api_key_env"),
];

fn unknown_key_hint(section: &[&str], field: &str, expected: &[&str]) -> Option<String> {
    if let Some(s) = closest(field, expected.iter().copied()) {
        return Some(format!("did you mean `{s}`?"));
    }
    let normalized = field.to_ascii_lowercase().replace('-', "_");
    if let Some((_, key)) = ENGINE_FLAG_NAMES.iter().find(|(flag, _)| *flag == normalized) {
        return Some(format!(
            "recipes use semantic names, not engine flags: `{field}` is `{key}`"
        ));
    }
    // A valid key in another table (e.g. `gpu_utilization` under `[serving]`).
    let here = section.join(".");
    let elsewhere: Vec<String> = schema::all_keys()
        .into_iter()
        .filter(|k| {
            let (table, name) = k.rsplit_once('.').unwrap_or(("", k.as_str()));
            name == normalized && table != here
        })
        .collect();
    match elsewhere.first() {
        Some(key) => {
            let table = key
                .rsplit_once('.')
                .map_or("the top level".to_owned(), |(t, _)| format!("`[{t}]`"));
            Some(format!("`{field}` belongs in {table} (`{key}`)"))
        }
        None if expected.is_empty() => None,
        None => Some(format!(
            "valid keys here: {}",
            expected
                .iter()
                .map(|e| format!("`{e}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}
