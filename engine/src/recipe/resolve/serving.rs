//! The recipe's serving settings: sizes that must be positive, settings that
//! contradict each other (chunked prefill, tool parsing) and speculative decoding.
//! They stay a [`ServingSection`] once checked, since every value may be left to the
//! engine's default.

use crate::recipe::{At, Provenance, RecipeError, ServingSection, SpeculativeSection};

use super::Invalid;

pub(super) fn check_serving(
    raw: ServingSection,
    provenance: &Provenance,
    invalid: &Invalid<'_>,
) -> Result<ServingSection, RecipeError> {
    let positive: [(&str, Option<u64>); 6] = [
        ("max_model_len", raw.max_model_len),
        ("max_num_seqs", raw.max_num_seqs.map(u64::from)),
        ("max_batched_tokens", raw.max_batched_tokens),
        ("tensor_parallel", raw.tensor_parallel.map(u64::from)),
        ("pipeline_parallel", raw.pipeline_parallel.map(u64::from)),
        ("data_parallel", raw.data_parallel.map(u64::from)),
    ];
    for (key, value) in positive {
        if value == Some(0) {
            return Err(invalid(&["serving", key], "must be at least 1".into(), None));
        }
    }
    if let (Some(false), Some(batched), Some(len)) =
        (raw.chunked_prefill, raw.max_batched_tokens, raw.max_model_len)
        && batched < len
    {
        return Err(RecipeError::Conflict {
            message: format!(
                "without chunked prefill a whole prompt is scheduled in one step, so `serving.max_batched_tokens` ({batched}) must be at least `serving.max_model_len` ({len})"
            ),
            at: At::from(provenance.locate(&["serving", "max_batched_tokens"], false)),
            hint: Some("enable `serving.chunked_prefill`, raise `serving.max_batched_tokens`, or lower `serving.max_model_len`".into()),
        });
    }
    if raw.auto_tool_choice == Some(true) && raw.tool_call_parser.is_none() {
        return Err(RecipeError::Conflict {
            message:
                "`serving.auto_tool_choice` needs a `serving.tool_call_parser` to read the model's tool calls"
                    .into(),
            at: At::from(provenance.locate(&["serving", "auto_tool_choice"], false)),
            hint: Some("set `serving.tool_call_parser` (e.g. `qwen3_coder`, `hermes`, `llama3_json`)".into()),
        });
    }
    for (key, value) in [
        ("reasoning_parser", &raw.reasoning_parser),
        ("tool_call_parser", &raw.tool_call_parser),
    ] {
        if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
            return Err(invalid(&["serving", key], "the name is empty".into(), None));
        }
    }
    if let Some(spec) = &raw.speculative {
        check_speculative(spec, invalid)?;
    }
    Ok(raw)
}

fn check_speculative(spec: &SpeculativeSection, invalid: &Invalid<'_>) -> Result<(), RecipeError> {
    let key = |k: &'static str| ["serving", "speculative", k];
    let method = spec.method.as_deref().ok_or_else(|| RecipeError::Missing {
        key: "serving.speculative.method".into(),
        message: "speculative decoding needs a method".into(),
        hint: Some("e.g. `speculative = { method = \"mtp\", tokens = 2 }`".into()),
    })?;
    if spec.tokens.is_none() {
        return Err(RecipeError::Missing {
            key: "serving.speculative.tokens".into(),
            message: "speculative decoding needs the number of tokens drafted per step".into(),
            hint: Some(format!(
                "e.g. `speculative = {{ method = \"{method}\", tokens = 2 }}`"
            )),
        });
    }
    if spec.tokens == Some(0) {
        return Err(invalid(&key("tokens"), "must be at least 1".into(), None));
    }
    let needs_model = matches!(method, "eagle" | "eagle3" | "draft_model");
    if needs_model && spec.model.is_none() {
        return Err(RecipeError::Missing {
            key: "serving.speculative.model".into(),
            message: format!("method `{method}` drafts with a separate model"),
            hint: Some("set `serving.speculative.model` to the draft model's Hub id or path".into()),
        });
    }
    if spec.model.is_some() && (method == "ngram" || is_mtp(method)) {
        return Err(invalid(
            &key("model"),
            format!("method `{method}` drafts without a separate model"),
            Some("remove `serving.speculative.model`"),
        ));
    }
    if method != "ngram" && (spec.prompt_lookup_min.is_some() || spec.prompt_lookup_max.is_some()) {
        return Err(invalid(
            &key("prompt_lookup_min"),
            format!("prompt lookup settings apply to `ngram`, not `{method}`"),
            None,
        ));
    }
    if let (Some(min), Some(max)) = (spec.prompt_lookup_min, spec.prompt_lookup_max)
        && min > max
    {
        return Err(invalid(
            &key("prompt_lookup_min"),
            format!("{min} is above `prompt_lookup_max` ({max})"),
            None,
        ));
    }
    Ok(())
}

/// Whether a speculative method is multi-token prediction: `mtp` or a model-specific
/// MTP head (`qwen3_next_mtp`, `deepseek_mtp`, ...).
pub fn is_mtp(method: &str) -> bool {
    method == "mtp" || method.ends_with("_mtp")
}
