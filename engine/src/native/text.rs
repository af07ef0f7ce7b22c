//! Text in and out of the engine: the tokenizer, the chat template, generation-config
//! defaults, incremental detokenization and stop strings.

use std::path::Path;

use serde_json::Value;
use tokenizers::Tokenizer;

use super::NativeError;
use crate::chat::ChatTemplates;

/// Everything text-related about a model directory.
pub struct TextModel {
    /// The tokenizer (`tokenizer.json`).
    pub tokenizer: Tokenizer,
    /// The chat templates, if the model has any (read as transformers reads them).
    pub chat: Option<ChatTemplates>,
    /// Why there is no chat template, if there is none.
    pub chat_missing: Option<String>,
    /// End-of-sequence ids: the generation config's, the model config's and the
    /// tokenizer's.
    pub eos: Vec<u32>,
    /// Sampling defaults from `generation_config.json` (vLLM's `--generation-config
    /// auto`): used for the fields a request leaves out.
    pub defaults: GenerationDefaults,
    /// What vLLM's `/tokenizer_info` answers: `tokenizer_config.json` with special
    /// tokens as their text, the chat template, and `tokenizer_class`.
    pub info: Value,
}

impl std::fmt::Debug for TextModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextModel").field("eos", &self.eos).finish()
    }
}

/// Sampling defaults a model ships.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationDefaults {
    /// `temperature`.
    pub temperature: Option<f32>,
    /// `top_p`.
    pub top_p: Option<f32>,
    /// `top_k`.
    pub top_k: Option<i64>,
    /// `min_p`.
    pub min_p: Option<f32>,
    /// `repetition_penalty`.
    pub repetition_penalty: Option<f32>,
}

fn read_json(path: &Path) -> Result<Option<Value>, NativeError> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| NativeError::Config {
                path: path.to_owned(),
                message: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(NativeError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

fn ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|n| n as u32).collect(),
        _ => Vec::new(),
    }
}

impl TextModel {
    /// Reads `tokenizer.json`, `tokenizer_config.json`, the chat templates and
    /// `generation_config.json` of `dir`; `config_eos` are the model config's
    /// end-of-sequence ids.
    pub fn load(dir: &Path, config_eos: &[u32]) -> Result<TextModel, NativeError> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Err(NativeError::Config {
                path,
                message: "the model has no tokenizer.json; the native engine needs one".into(),
            });
        }
        let tokenizer = Tokenizer::from_file(&path).map_err(|e| NativeError::Config {
            path: path.clone(),
            message: format!("not a readable tokenizer: {e}"),
        })?;
        let tokenizer_config = read_json(&dir.join("tokenizer_config.json"))?;
        // A model without a usable template still serves text completions.
        let (chat, chat_missing) = match ChatTemplates::load(dir, tokenizer_config.as_ref()) {
            Ok(t) => (Some(t), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let generation = read_json(&dir.join("generation_config.json"))?.unwrap_or(Value::Null);
        let mut eos = ids(generation.get("eos_token_id"));
        eos.extend(config_eos);
        if let Some(token) = tokenizer_config.as_ref().and_then(|c| c.get("eos_token")) {
            let text = token
                .as_str()
                .or_else(|| token.get("content").and_then(Value::as_str));
            if let Some(id) = text.and_then(|t| tokenizer.token_to_id(t)) {
                eos.push(id);
            }
        }
        eos.sort_unstable();
        eos.dedup();
        let float = |k: &str| generation.get(k).and_then(Value::as_f64).map(|v| v as f32);
        let defaults = GenerationDefaults {
            temperature: float("temperature"),
            top_p: float("top_p"),
            top_k: generation.get("top_k").and_then(Value::as_i64),
            min_p: float("min_p"),
            repetition_penalty: float("repetition_penalty"),
        };
        let info = tokenizer_info(tokenizer_config.as_ref(), dir);
        Ok(TextModel {
            tokenizer,
            chat,
            chat_missing,
            eos,
            defaults,
            info,
        })
    }

    /// Token ids of `text`; `special` adds the tokenizer's BOS/EOS decorations (plain
    /// completions do, chat prompts already carry them from the template).
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>, String> {
        self.tokenizer
            .encode(text, special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| format!("the prompt could not be tokenized: {e}"))
    }

    /// The text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids, true).unwrap_or_default()
    }

    /// The text of one token as the tokenizer spells it (special tokens included).
    pub fn token_text(&self, id: u32) -> String {
        self.tokenizer.decode(&[id], false).unwrap_or_default()
    }
}

/// The tokenizer's settings as vLLM's `/tokenizer_info` gives them
/// (`vllm@0.33.0:vllm/entrypoints/serve/tokenize/serving.py`, `TokenizerInfoResponse`):
/// the keys of `tokenizer_config.json` without the added-token table, special tokens
/// written as their text (the file may hold them as `{"content": ...}` objects), the chat
/// template of `chat_template.jinja` where the file has none, and `tokenizer_class`.
/// lm-evaluation-harness reads `eos_token` and the template from it.
fn tokenizer_info(config: Option<&Value>, dir: &Path) -> Value {
    let mut info = serde_json::Map::new();
    if let Some(Value::Object(map)) = config {
        for (key, value) in map {
            if key == "added_tokens_decoder" {
                continue;
            }
            let value = match value.get("content").and_then(Value::as_str) {
                Some(text) if key.ends_with("_token") => Value::String(text.to_owned()),
                _ => value.clone(),
            };
            info.insert(key.clone(), value);
        }
    }
    if !info.contains_key("chat_template")
        && let Ok(template) = std::fs::read_to_string(dir.join(crate::chat::TEMPLATE_FILE))
    {
        info.insert("chat_template".into(), Value::String(template));
    }
    info.entry("tokenizer_class")
        .or_insert_with(|| Value::String("PreTrainedTokenizerFast".into()));
    Value::Object(info)
}

/// Turns a stream of token ids into a stream of text, a piece at a time, never cutting a
/// multi-byte character (the prefix/read offsets of vLLM's `detokenize_incrementally`).
#[derive(Debug, Default)]
pub struct Detokenizer {
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
}

impl Detokenizer {
    /// Adds a token; returns the text it completes (possibly empty).
    pub fn push(&mut self, text: &TextModel, id: u32) -> String {
        self.ids.push(id);
        let before = text.decode(&self.ids[self.prefix..self.read]);
        let now = text.decode(&self.ids[self.prefix..]);
        if now.len() > before.len() && !now.ends_with('\u{FFFD}') {
            let delta = now
                .get(before.len()..)
                .map(str::to_owned)
                .unwrap_or_else(|| now.chars().skip(before.chars().count()).collect());
            self.prefix = self.read;
            self.read = self.ids.len();
            delta
        } else {
            String::new()
        }
    }
}

/// Watches generated text for stop strings, holding back what could be the start of one.
#[derive(Debug, Default)]
pub struct StopWatch {
    stops: Vec<String>,
    text: String,
    sent: usize,
}

impl StopWatch {
    /// A watcher for these stop strings (empty ones ignored).
    pub fn new(stops: Vec<String>) -> StopWatch {
        StopWatch {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            text: String::new(),
            sent: 0,
        }
    }

    /// Adds generated text. Returns the text that may be sent now and whether a stop
    /// string was found (the text is then cut before it, and everything left is sent).
    pub fn push(&mut self, delta: &str) -> (String, bool) {
        let search_from = self.text.len().saturating_sub(self.longest().saturating_sub(1));
        let search_from = floor_boundary(&self.text, search_from);
        self.text.push_str(delta);
        let found = self
            .stops
            .iter()
            .filter_map(|s| self.text[search_from..].find(s.as_str()).map(|i| search_from + i))
            .min();
        if let Some(at) = found {
            self.text.truncate(at);
            return (self.flush(), true);
        }
        // Hold back a tail that is a prefix of some stop string.
        let mut keep = self.text.len();
        for s in &self.stops {
            for len in (1..s.len().min(self.text.len() + 1)).rev() {
                if s.is_char_boundary(len) && self.text.ends_with(&s[..len]) {
                    keep = keep.min(self.text.len() - len);
                    break;
                }
            }
        }
        let keep = floor_boundary(&self.text, keep.max(self.sent));
        let out = self.text[self.sent..keep].to_owned();
        self.sent = keep;
        (out, false)
    }

    /// Everything not sent yet (at the end of generation).
    pub fn flush(&mut self) -> String {
        let out = self.text[self.sent..].to_owned();
        self.sent = self.text.len();
        out
    }

    /// All text so far (stop string excluded).
    pub fn text(&self) -> &str {
        &self.text
    }

    fn longest(&self) -> usize {
        self.stops.iter().map(String::len).max().unwrap_or(0)
    }
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_cut_and_hold_back() {
        let mut w = StopWatch::new(vec!["\nUser:".into()]);
        assert_eq!(w.push("Hello"), ("Hello".into(), false));
        // "\nUs" could start the stop string: held back.
        assert_eq!(w.push(" there\nUs"), (" there".into(), false));
        assert_eq!(w.push("er: hi"), (String::new(), true));
        assert_eq!(w.text(), "Hello there");
        let mut w = StopWatch::new(vec!["END".into()]);
        assert_eq!(w.push("a E"), ("a ".into(), false));
        assert_eq!(w.push("x"), ("Ex".into(), false));
        assert_eq!(w.flush(), "");
    }

    #[test]
    fn no_stop_strings_pass_everything() {
        let mut w = StopWatch::new(Vec::new());
        assert_eq!(w.push("héllo"), ("héllo".into(), false));
    }
}
