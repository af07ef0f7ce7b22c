//! The tokenizer: `tokenizer.json` (Hugging Face `tokenizers` format) rebuilt from the
//! `tokenizer.ggml.*` metadata, and `tokenizer_config.json` with the special tokens and
//! the chat template. Not here: rendering chat templates (`sous_engine::chat`).
//!
//! The rebuild follows transformers (`integrations/gguf/gguf_tokenizer_mapping.py`,
//! `byte_level_tokenizer`, `add_gguf_special_tokens`, `set_split_regex`), so the ids
//! are the ones transformers gives for the same file: a byte-level BPE model from the
//! vocabulary and merges, ByteLevel pre-tokenizer and decoder, control tokens added as
//! special tokens, user-defined tokens as plain added tokens, and a split regex for
//! the pre-tokenizer families transformers knows. The objects are built with the
//! `tokenizers` crate and serialized by it, so what we write is what it reads.
//!
//! Two vocabulary kinds are supported: `tokenizer.ggml.model = "gpt2"` (byte-level BPE:
//! GPT-2, Llama 3, SmolLM, Qwen, Mistral Tekken), built here, and `llama`
//! (SentencePiece: Llama 2, Mistral v0.x), built in `sentencepiece`. Others (`t5`,
//! `bert`, `rwkv`) are refused by name.

use serde_json::{Map, Value, json};
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use super::ImportError;
use super::gguf::Gguf;

/// `tokenizer.ggml.token_type` values (llama.cpp `llama_token_type`).
const TOKEN_TYPE_CONTROL: i64 = 3;
/// A token added by the model's authors that is matched whole but is not special.
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// The Llama 3 split (also Falcon 3, DBRX, Smaug), as transformers `_LLAMA3_SPLIT`.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Mistral's Tekken split (Nemo, Pixtral), as transformers `_TEKKEN_SPLIT`.
const TEKKEN_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The split regex for a `tokenizer.ggml.pre` value, for the pre-tokenizers of llama
/// architecture files that transformers maps (`GGUF_PRE_TOKENIZER_SPLITS`). Others,
/// `smollm` and `gpt2` included, use the GPT-2 regex built into `ByteLevel`.
///
/// Known divergence, kept to give transformers' ids: llama.cpp splits digits singly
/// first for `smollm`, so a run of two or more spaces before a digit tokenizes
/// differently there (transformers: `Ġ` `Ġ` `1`, llama.cpp: `ĠĠ` `1`).
fn split_regex(pre: &str) -> Option<&'static str> {
    match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "dbrx" | "smaug-bpe" | "pixtral" => {
            Some(LLAMA3_SPLIT)
        }
        "tekken" => Some(TEKKEN_SPLIT),
        _ => None,
    }
}

/// A tokenizer rebuilt from GGUF metadata.
pub struct Rebuilt {
    model: String,
    tokenizer_json: String,
    config: Value,
    vocab_size: usize,
    chat_template: bool,
}

impl Rebuilt {
    /// Rebuilds the tokenizer described by `gguf`'s metadata.
    pub fn from_gguf(gguf: &Gguf) -> Result<Rebuilt, ImportError> {
        let fail = |reason: String| ImportError::Tokenizer {
            path: gguf.path().to_owned(),
            reason,
        };
        let model = gguf.string("tokenizer.ggml.model")?.to_owned();
        let tokens = gguf.strings("tokenizer.ggml.tokens")?;
        let types = token_types(gguf, tokens.len())?;
        let merges = match gguf.get("tokenizer.ggml.merges") {
            None => None,
            Some(_) => Some(
                gguf.strings("tokenizer.ggml.merges")?
                    .into_iter()
                    .map(|m| {
                        m.split_once(' ')
                            .map(|(a, b)| (a.to_owned(), b.to_owned()))
                            .ok_or_else(|| {
                                fail(format!("merge `{m}` is not two tokens separated by a space"))
                            })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        let byte_level = match model.as_str() {
            "gpt2" => true,
            "llama" => false,
            _ => {
                return Err(ImportError::Unsupported {
                    path: gguf.path().to_owned(),
                    what: format!(
                        "tokenizer model `{model}` (sous rebuilds `gpt2` byte-level BPE and `llama` \
                         SentencePiece vocabularies)"
                    ),
                });
            }
        };
        let alphabet = byte_alphabet();
        let in_alphabet: std::collections::HashSet<char> = alphabet.iter().copied().collect();
        let mut tokenizer = if byte_level {
            let merges = merges.ok_or_else(|| fail("`tokenizer.ggml.merges` is missing".to_owned()))?;
            let pre = gguf.opt_string("tokenizer.ggml.pre")?.unwrap_or("default");
            byte_level_bpe(&tokens, merges, pre, &alphabet).map_err(fail)?
        } else {
            let scores = match gguf.get("tokenizer.ggml.scores") {
                None => None,
                Some(_) => Some(scores(gguf, tokens.len())?),
            };
            super::sentencepiece::build(&tokens, scores.as_deref(), merges).map_err(fail)?
        };

        // llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise;
        // transformers does the same (`get_gguf_tokenizer`).
        let add_bos = gguf
            .opt_bool("tokenizer.ggml.add_bos_token")?
            .unwrap_or(!byte_level);
        let add_eos = gguf.opt_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
        let token_at = |key: &str| -> Result<Option<(u32, String)>, ImportError> {
            let Some(id) = gguf.opt_uint(key)? else {
                return Ok(None);
            };
            let token = usize::try_from(id)
                .ok()
                .and_then(|i| tokens.get(i))
                .ok_or_else(|| fail(format!("`{key}` is {id}, past the {} tokens", tokens.len())))?;
            Ok(Some((id as u32, (*token).to_owned())))
        };
        let bos = token_at("tokenizer.ggml.bos_token_id")?;
        let eos = token_at("tokenizer.ggml.eos_token_id")?;
        let unk = token_at("tokenizer.ggml.unknown_token_id")?;
        let pad = token_at("tokenizer.ggml.padding_token_id")?;
        tokenizer.with_post_processor(Some(
            post_processor(
                add_bos.then_some(&bos).and_then(Option::as_ref),
                add_eos.then_some(&eos).and_then(Option::as_ref),
            )
            .map_err(fail)?,
        ));

        let mut decoder_entries = Map::new();
        let mut special = Vec::new();
        let mut user = Vec::new();
        for (id, (token, kind)) in tokens.iter().zip(&types).enumerate() {
            let is_special = match *kind {
                // A control token spelled outside the byte alphabet in a byte-level
                // vocabulary is a llama.cpp mislabel; transformers skips it too.
                TOKEN_TYPE_CONTROL if !byte_level || token.chars().all(|c| in_alphabet.contains(&c)) => true,
                TOKEN_TYPE_USER_DEFINED => false,
                _ => continue,
            };
            let added = AddedToken::from((*token).to_owned(), is_special).normalized(false);
            if is_special {
                special.push(added);
            } else {
                user.push(added);
            }
            decoder_entries.insert(
                id.to_string(),
                json!({
                    "content": token,
                    "lstrip": false,
                    "normalized": false,
                    "rstrip": false,
                    "single_word": false,
                    "special": is_special,
                }),
            );
        }
        tokenizer
            .add_special_tokens(special)
            .map_err(|e| fail(format!("adding the control tokens: {e}")))?;
        tokenizer
            .add_tokens(user)
            .map_err(|e| fail(format!("adding the user-defined tokens: {e}")))?;

        let tokenizer_json = tokenizer
            .to_string(true)
            .map_err(|e| fail(format!("serializing tokenizer.json: {e}")))?;

        let chat_template = gguf.opt_string("tokenizer.chat_template")?;
        let mut config = Map::new();
        config.insert("add_bos_token".into(), json!(add_bos));
        config.insert("add_eos_token".into(), json!(add_eos));
        config.insert("added_tokens_decoder".into(), Value::Object(decoder_entries));
        for (name, token) in [
            ("bos_token", &bos),
            ("eos_token", &eos),
            ("unk_token", &unk),
            ("pad_token", &pad),
        ] {
            config.insert(name.into(), json!(token.as_ref().map(|(_, t)| t)));
        }
        if let Some(template) = chat_template {
            config.insert("chat_template".into(), json!(template));
        }
        config.insert("clean_up_tokenization_spaces".into(), json!(false));
        let arch = gguf.string("general.architecture")?;
        if let Some(len) = gguf.opt_uint(&format!("{arch}.context_length"))? {
            config.insert("model_max_length".into(), json!(len));
        }
        // The class that reads `tokenizer.json` as is, in transformers 4 and 5 alike.
        config.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));

        Ok(Rebuilt {
            model,
            tokenizer_json,
            config: Value::Object(config),
            vocab_size: tokens.len(),
            chat_template: chat_template.is_some(),
        })
    }

    /// `tokenizer.ggml.model`.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Whether the file had a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.chat_template
    }

    /// The `tokenizer.json` text.
    pub fn tokenizer_json(&self) -> &str {
        &self.tokenizer_json
    }

    /// The `tokenizer_config.json` value.
    pub fn tokenizer_config(&self) -> Value {
        self.config.clone()
    }
}

/// The byte-level BPE model and its pre-tokenizer and decoder.
fn byte_level_bpe(
    tokens: &[&str],
    merges: Vec<(String, String)>,
    pre: &str,
    alphabet: &[char],
) -> Result<Tokenizer, String> {
    // Byte-level vocabularies spell every token in GPT-2's byte alphabet; a token that
    // is not (some files store special tokens with raw spaces or UTF-8) is respelled
    // from its bytes, as transformers `byte_level_tokenizer` does.
    let in_alphabet: std::collections::HashSet<char> = alphabet.iter().copied().collect();
    let mut vocab: Vocab = Vocab::default();
    for (id, token) in tokens.iter().enumerate() {
        let id = u32::try_from(id).map_err(|_| "more than 2^32 tokens".to_owned())?;
        let spelled: String = if token.chars().all(|c| in_alphabet.contains(&c)) {
            (*token).to_owned()
        } else {
            token.bytes().map(|b| alphabet[usize::from(b)]).collect()
        };
        // A repeated spelling keeps its last id, as transformers' dict does.
        vocab.insert(spelled, id);
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| format!("the BPE model: {e}"))?;
    let mut tokenizer = Tokenizer::new(bpe);
    match split_regex(pre) {
        Some(regex) => {
            let split = Split::new(
                SplitPattern::Regex(regex.to_owned()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| format!("the `{pre}` split regex: {e}"))?;
            tokenizer.with_pre_tokenizer(Some(Sequence::new(vec![
                split.into(),
                ByteLevel::new(false, true, false).into(),
            ])));
        }
        None => {
            tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        }
    }
    tokenizer.with_decoder(Some(ByteLevel::default()));
    Ok(tokenizer)
}

/// `tokenizer.ggml.scores`, one per token.
fn scores(gguf: &Gguf, count: usize) -> Result<Vec<f32>, ImportError> {
    let values = gguf.array("tokenizer.ggml.scores")?;
    if values.len() != count {
        return Err(ImportError::Tokenizer {
            path: gguf.path().to_owned(),
            reason: format!("{} scores for {count} tokens", values.len()),
        });
    }
    values
        .iter()
        .map(|v| match *v {
            candle_core::quantized::gguf_file::Value::F32(f) => Ok(f),
            ref other => Err(ImportError::BadValue {
                path: gguf.path().to_owned(),
                key: "tokenizer.ggml.scores".to_owned(),
                expected: "32-bit floats".to_owned(),
                found: format!("{other:?}"),
            }),
        })
        .collect()
}

/// `tokenizer.ggml.token_type`, or all normal when absent.
fn token_types(gguf: &Gguf, count: usize) -> Result<Vec<i64>, ImportError> {
    let Some(_) = gguf.get("tokenizer.ggml.token_type") else {
        return Ok(vec![1; count]);
    };
    let values = gguf.array("tokenizer.ggml.token_type")?;
    if values.len() != count {
        return Err(ImportError::Tokenizer {
            path: gguf.path().to_owned(),
            reason: format!("{} token types for {count} tokens", values.len()),
        });
    }
    values
        .iter()
        .map(|v| match *v {
            candle_core::quantized::gguf_file::Value::I32(t) => Ok(i64::from(t)),
            ref other => super::gguf::as_uint(other)
                .map(|t| t as i64)
                .ok_or_else(|| ImportError::BadValue {
                    path: gguf.path().to_owned(),
                    key: "tokenizer.ggml.token_type".to_owned(),
                    expected: "integers".to_owned(),
                    found: format!("{other:?}"),
                }),
        })
        .collect()
}

/// BOS/EOS insertion as transformers' `TemplateProcessing` for GGUF tokenizers: nothing
/// when the file adds neither.
fn post_processor(
    bos: Option<&(u32, String)>,
    eos: Option<&(u32, String)>,
) -> Result<TemplateProcessing, String> {
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut specials = Vec::new();
    if let Some((id, token)) = bos {
        single.push(token.clone());
        pair.push(token.clone());
        specials.push((token.clone(), *id));
    }
    single.push("$A".to_owned());
    pair.push("$A".to_owned());
    if let Some((id, token)) = eos {
        single.push(token.clone());
        pair.push(token.clone());
        specials.push((token.clone(), *id));
    }
    if let Some((_, token)) = bos {
        pair.push(format!("{token}:1"));
    }
    pair.push("$B:1".to_owned());
    if let Some((_, token)) = eos {
        pair.push(format!("{token}:1"));
    }
    specials.dedup();
    TemplateProcessing::builder()
        .try_single(single.join(" "))
        .and_then(|b| b.try_pair(pair.join(" ")))
        .map_err(|e| format!("the post-processor template: {e}"))?
        .special_tokens(specials)
        .build()
        .map_err(|e| format!("the post-processor: {e}"))
}

/// GPT-2's byte alphabet: every byte spelled as a printable character, printable
/// Latin-1 bytes as themselves and the rest as U+0100 upwards in byte order
/// (`bytes_to_unicode` in GPT-2's `encoder.py`). `tokenizers` keeps its copy private,
/// so this 10-line table is ours.
fn byte_alphabet() -> Vec<char> {
    let printable =
        |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
    let mut next = 0x100;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap_or('?')
            } else {
                let c = char::from_u32(next).unwrap_or('?');
                next += 1;
                c
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_matches_gpt2() {
        let a = byte_alphabet();
        assert_eq!(a[usize::from(b' ')], 'Ġ');
        assert_eq!(a[usize::from(b'\n')], 'Ċ');
        assert_eq!(a[usize::from(b'A')], 'A');
        let distinct: std::collections::HashSet<char> = a.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }

    #[test]
    fn template_without_bos_keeps_ids() -> Result<(), String> {
        let p = post_processor(None, None)?;
        let json = serde_json::to_value(&p).map_err(|e| e.to_string())?;
        assert_eq!(json["single"], json!([{"Sequence": {"id": "A", "type_id": 0}}]));
        Ok(())
    }
}
