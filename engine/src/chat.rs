//! Chat templates: the Jinja templates a model folder ships, found where transformers
//! looks for them and rendered with minijinja, so that a conversation becomes exactly the
//! prompt text transformers' `apply_chat_template` would give.
//!
//! Where they are (transformers 5.17 `tokenization_utils_base.py`, `_from_pretrained` and
//! `save_chat_templates`; the same since 4.52): `chat_template.jinja` (the `default`
//! template: every `save_pretrained` since 4.52 writes it there and no longer in
//! `tokenizer_config.json`) and `additional_chat_templates/NAME.jinja` (named ones). When
//! any of those files exists, `tokenizer_config.json`'s `chat_template` is ignored;
//! otherwise that key holds the template as a string, or named templates as a list of
//! `{name, template}`. `chat_template.json` belongs to processors (multimodal models):
//! transformers' tokenizer never reads it, and neither does vLLM for a text-only model.
//!
//! Which one a conversation uses (`get_chat_template`): a single template always; of named
//! ones, `tool_use` when the request has tools and the model has it, else `default`, and
//! no template at all when there is no `default`.
//!
//! transformers renders templates in a Jinja2 sandbox with `trim_blocks` and
//! `lstrip_blocks`, the `loopcontrols` extension, and a few globals
//! (`utils/chat_template_utils.py`, `_cached_compile_jinja_template`): `raise_exception`,
//! `strftime_now`, and a `tojson` filter that is Python's `json.dumps` (no HTML
//! escaping, `ensure_ascii=False`), plus the special tokens (`bos_token`, `eos_token`,
//! ...) and any keyword arguments of the call in the context (vLLM passes a request's
//! `chat_template_kwargs` there). We mirror that environment (its Python side is in
//! `python`); Python string and dict methods (`.strip()`, `.items()`) come from
//! minijinja-contrib's `pycompat`.
//!
//! Not here: tokenizing the rendered text, and transformers' conversation rewriting
//! before rendering (reasoning-field aliasing, `continue_final_message`) or its
//! `{% generation %}` tag, which no template we ship uses.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use minijinja::Environment;
use minijinja::value::Value;
use serde::Serialize;

mod python;
#[cfg(test)]
mod tests;

pub use python::python_float_repr;
use python::{python_formatter, raise_exception, strftime_now, tojson};

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
    /// The model folder has no chat template anywhere transformers looks.
    #[error("the model has no chat template: {0}")]
    Missing(String),
    /// The model has named templates, none of them `default`, and the conversation
    /// does not select one (`tool_use` with tools).
    #[error(
        "the model has several chat templates and none is named `default` ({}): transformers refuses to choose",
        .0.join(", ")
    )]
    NoDefault(Vec<String>),
    /// A template file, or `tokenizer_config.json`, could not be read or is not what
    /// transformers writes.
    #[error("{}: {message}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
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
    /// Separator.
    pub sep_token: Option<String>,
    /// Classifier.
    pub cls_token: Option<String>,
    /// Mask.
    pub mask_token: Option<String>,
}

impl SpecialTokens {
    /// The special tokens of a `tokenizer_config.json` (strings, or `{"content": ...}`
    /// objects as older transformers wrote them).
    pub fn from_tokenizer_config(config: &serde_json::Value) -> SpecialTokens {
        let token = |key: &str| match config.get(key) {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(obj) => obj.get("content").and_then(|c| c.as_str()).map(str::to_owned),
            None => None,
        };
        SpecialTokens {
            bos_token: token("bos_token"),
            eos_token: token("eos_token"),
            unk_token: token("unk_token"),
            pad_token: token("pad_token"),
            sep_token: token("sep_token"),
            cls_token: token("cls_token"),
            mask_token: token("mask_token"),
        }
    }

    fn pairs(&self) -> [(&'static str, &Option<String>); 7] {
        [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
            ("unk_token", &self.unk_token),
            ("sep_token", &self.sep_token),
            ("pad_token", &self.pad_token),
            ("cls_token", &self.cls_token),
            ("mask_token", &self.mask_token),
        ]
    }
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
    /// Further variables for the template (`apply_chat_template(**kwargs)`; a request's
    /// `chat_template_kwargs` in vLLM, e.g. `enable_thinking`). They may shadow a special
    /// token, as in transformers, but not the four variables above.
    pub kwargs: BTreeMap<String, Value>,
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

    /// Renders a conversation: `messages` is a list of `{"role", "content", ...}` maps
    /// (anything serde serializes that way).
    pub fn render(&self, messages: &impl Serialize, options: &RenderOptions) -> Result<String, ChatError> {
        let template = self
            .env
            .get_template(TEMPLATE)
            .map_err(|e| ChatError::Render(describe(&e)))?;
        // transformers' order (`apply_chat_template`, `render_jinja_template`): the special
        // tokens that are set (so `bos_token is defined` sees the same thing), then the
        // keyword arguments over them, then the conversation's own variables.
        let mut ctx: BTreeMap<&str, Value> = BTreeMap::new();
        for (name, token) in self.special.pairs() {
            if let Some(token) = token {
                ctx.insert(name, Value::from(token.as_str()));
            }
        }
        for (name, value) in &options.kwargs {
            ctx.insert(name.as_str(), value.clone());
        }
        ctx.insert("messages", Value::from(minijinja::value::Serde(messages)));
        ctx.insert(
            "add_generation_prompt",
            Value::from(options.add_generation_prompt),
        );
        ctx.insert("tools", options.tools.clone().unwrap_or(Value::from(())));
        ctx.insert("documents", options.documents.clone().unwrap_or(Value::from(())));
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

/// The file transformers 4.52 and later save the default template to.
pub const TEMPLATE_FILE: &str = "chat_template.jinja";
/// The folder they save named templates to, one `NAME.jinja` each.
pub const TEMPLATES_DIR: &str = "additional_chat_templates";
/// A processor's template file, which the tokenizer does not read.
const PROCESSOR_TEMPLATE_FILE: &str = "chat_template.json";
/// The named template transformers picks for a conversation with tools.
const TOOL_USE: &str = "tool_use";
/// The named template it picks otherwise.
const DEFAULT: &str = "default";

/// The chat templates of a model folder: one, or several by name, compiled.
#[derive(Debug)]
pub struct ChatTemplates {
    templates: Templates,
    /// Where they were read, e.g. `chat_template.jinja` (for messages).
    origin: String,
}

#[derive(Debug)]
enum Templates {
    One(Box<ChatTemplate>),
    Named(BTreeMap<String, ChatTemplate>),
}

impl ChatTemplates {
    /// Reads the templates of the folder `dir` as transformers' `AutoTokenizer` does,
    /// with the special tokens of its `tokenizer_config.json` (`config`, already read;
    /// `None` when the folder has none). [`ChatError::Missing`] says where it looked
    /// when there is no template anywhere.
    pub fn load(dir: &Path, config: Option<&serde_json::Value>) -> Result<ChatTemplates, ChatError> {
        let special = config
            .map(SpecialTokens::from_tokenizer_config)
            .unwrap_or_default();
        let compile = |source: &str, path: &Path| {
            ChatTemplate::new(source, special.clone()).map_err(|e| ChatError::File {
                path: path.to_owned(),
                message: e.to_string(),
            })
        };
        // The files first: any of them makes the config's template irrelevant.
        let mut files: BTreeMap<String, (PathBuf, String)> = BTreeMap::new();
        let default_file = dir.join(TEMPLATE_FILE);
        if let Some(source) = read_optional(&default_file)? {
            files.insert(DEFAULT.to_owned(), (default_file, source));
        }
        let extras = dir.join(TEMPLATES_DIR);
        let mut extra_names = Vec::new();
        if extras.is_dir() {
            let entries = std::fs::read_dir(&extras).map_err(|e| ChatError::File {
                path: extras.clone(),
                message: e.to_string(),
            })?;
            let mut paths: Vec<PathBuf> = entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "jinja") && p.is_file())
                .collect();
            paths.sort();
            for path in paths {
                let Some(name) = path.file_stem().map(|n| n.to_string_lossy().into_owned()) else {
                    continue;
                };
                if let Some(source) = read_optional(&path)? {
                    extra_names.push(name.clone());
                    // An extra `default.jinja` replaces chat_template.jinja, as the
                    // later assignment does in transformers.
                    files.insert(name, (path, source));
                }
            }
        }
        if !files.is_empty() {
            let origin = if extra_names.is_empty() {
                TEMPLATE_FILE.to_owned()
            } else if files.len() > extra_names.len() {
                format!("{TEMPLATE_FILE} and {TEMPLATES_DIR}/")
            } else {
                format!("{TEMPLATES_DIR}/")
            };
            if extra_names.is_empty() {
                let (path, source) = &files[DEFAULT];
                return Ok(ChatTemplates {
                    templates: Templates::One(Box::new(compile(source, path)?)),
                    origin,
                });
            }
            let mut named = BTreeMap::new();
            for (name, (path, source)) in &files {
                named.insert(name.clone(), compile(source, path)?);
            }
            return Ok(ChatTemplates {
                templates: Templates::Named(named),
                origin,
            });
        }

        let config_path = dir.join("tokenizer_config.json");
        let bad = |message: &str| ChatError::File {
            path: config_path.clone(),
            message: message.to_owned(),
        };
        match config.and_then(|c| c.get("chat_template")) {
            Some(serde_json::Value::String(source)) => Ok(ChatTemplates {
                templates: Templates::One(Box::new(compile(source, &config_path)?)),
                origin: "tokenizer_config.json".to_owned(),
            }),
            Some(serde_json::Value::Array(list)) => {
                let mut named = BTreeMap::new();
                for entry in list {
                    let name = entry.get("name").and_then(|n| n.as_str());
                    let source = entry.get("template").and_then(|t| t.as_str());
                    let (Some(name), Some(source)) = (name, source) else {
                        return Err(bad(
                            "`chat_template` is a list whose entries are not `{\"name\": ..., \"template\": ...}`",
                        ));
                    };
                    named.insert(name.to_owned(), compile(source, &config_path)?);
                }
                if named.is_empty() {
                    return Err(ChatError::Missing(
                        "`chat_template` in tokenizer_config.json is an empty list".into(),
                    ));
                }
                Ok(ChatTemplates {
                    templates: Templates::Named(named),
                    origin: "tokenizer_config.json".to_owned(),
                })
            }
            Some(serde_json::Value::Null) | None => {
                let mut why = format!(
                    "no {TEMPLATE_FILE}, no {TEMPLATES_DIR}/ and no `chat_template` in tokenizer_config.json"
                );
                if config.is_none() {
                    why = format!("no {TEMPLATE_FILE}, no {TEMPLATES_DIR}/ and no tokenizer_config.json");
                }
                if dir.join(PROCESSOR_TEMPLATE_FILE).is_file() {
                    why.push_str(&format!(
                        "; {PROCESSOR_TEMPLATE_FILE} is a processor's file (multimodal models), which transformers' tokenizer and vLLM do not read for a text model: save the template as {TEMPLATE_FILE}"
                    ));
                }
                Err(ChatError::Missing(why))
            }
            Some(_) => Err(bad(
                "`chat_template` is neither a string nor a list of named templates",
            )),
        }
    }

    /// The template for a conversation, as `get_chat_template(None, tools)` chooses it.
    pub fn select(&self, has_tools: bool) -> Result<&ChatTemplate, ChatError> {
        match &self.templates {
            Templates::One(t) => Ok(t),
            Templates::Named(named) => {
                if has_tools && let Some(t) = named.get(TOOL_USE) {
                    return Ok(t);
                }
                named
                    .get(DEFAULT)
                    .ok_or_else(|| ChatError::NoDefault(named.keys().cloned().collect()))
            }
        }
    }

    /// Where the templates were read: `chat_template.jinja`, `tokenizer_config.json`, ...
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The names of named templates (empty for a single one).
    pub fn names(&self) -> Vec<&str> {
        match &self.templates {
            Templates::One(_) => Vec::new(),
            Templates::Named(named) => named.keys().map(String::as_str).collect(),
        }
    }
}

/// A UTF-8 file's text, or `None` where there is no such file.
fn read_optional(path: &Path) -> Result<Option<String>, ChatError> {
    match std::fs::read(path) {
        Ok(bytes) => String::from_utf8(bytes).map(Some).map_err(|_| ChatError::File {
            path: path.to_owned(),
            message: "not UTF-8 text".into(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ChatError::File {
            path: path.to_owned(),
            message: e.to_string(),
        }),
    }
}

/// A minijinja error with its line, on one line.
fn describe(err: &minijinja::Error) -> String {
    match err.line() {
        Some(line) => format!("{} (line {line})", err.detail().unwrap_or(&err.to_string())),
        None => err.to_string(),
    }
}

impl crate::diagnose::Diagnose for ChatError {
    /// A chat template from the model, or a conversation from a client.
    fn class(&self) -> crate::diagnose::Class {
        crate::diagnose::Class::User
    }
}
