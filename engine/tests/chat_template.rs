//! Chat templates rendered with minijinja against transformers' `apply_chat_template`
//! output (`tests/fixtures/smollm2/chat_template_cases.json`, made by
//! `scripts/reference/smollm2_reference.py`): SmolLM2's own template on several
//! conversations, and small templates that exercise the rest of transformers'
//! environment. Needs no model: the template text is in the fixture.

use std::path::PathBuf;

use minijinja::Value;
use sous_engine::chat::{ChatError, ChatTemplate, RenderOptions, SpecialTokens};

fn fixture() -> serde_json::Value {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/smollm2/chat_template_cases.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn special(fixture: &serde_json::Value) -> SpecialTokens {
    let get = |k: &str| fixture["special_tokens"][k].as_str().map(str::to_owned);
    SpecialTokens {
        bos_token: get("bos_token"),
        eos_token: get("eos_token"),
        unk_token: get("unk_token"),
        pad_token: get("pad_token"),
    }
}

fn raw_fixture_value(index: usize, section: &str, key: &str) -> Option<Value> {
    // serde_json without `preserve_order` loses key order, so read the file again
    // straight into minijinja values, which keep it.
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/smollm2/chat_template_cases.json");
    let text = std::fs::read_to_string(path).expect("fixture");
    let all: Value = serde_json::from_str(&text).expect("minijinja value");
    let item = all.get_attr(section).ok()?.get_item(&Value::from(index)).ok()?;
    let value = item.get_attr(key).ok()?;
    (!value.is_undefined() && !value.is_none()).then_some(value)
}

fn options(case: &serde_json::Value, tools: Option<Value>) -> RenderOptions {
    RenderOptions {
        add_generation_prompt: case["add_generation_prompt"]
            .as_bool()
            .expect("add_generation_prompt"),
        tools,
        documents: None,
    }
}

#[test]
fn smollm2_template_renders_like_transformers() {
    let fixture = fixture();
    let template = ChatTemplate::new(fixture["template"].as_str().expect("template"), special(&fixture))
        .expect("compiles");
    let cases = fixture["cases"].as_array().expect("cases");
    assert!(cases.len() >= 5);
    for (i, case) in cases.iter().enumerate() {
        let messages = raw_fixture_value(i, "cases", "messages").expect("messages");
        let got = template.render(&messages, &options(case, None)).expect("renders");
        assert_eq!(
            got,
            case["rendered"].as_str().expect("rendered"),
            "{}",
            case["name"]
        );
    }
}

#[test]
fn environment_matches_transformers() {
    let fixture = fixture();
    for (i, case) in fixture["extra_templates"]
        .as_array()
        .expect("extra templates")
        .iter()
        .enumerate()
    {
        let name = case["name"].as_str().expect("name");
        let template =
            ChatTemplate::new(case["template"].as_str().expect("template"), special(&fixture)).expect(name);
        let messages = raw_fixture_value(i, "extra_templates", "messages").expect("messages");
        let tools = raw_fixture_value(i, "extra_templates", "tools");
        let got = template.render(&messages, &options(case, tools));
        match (case.get("rendered"), case.get("error")) {
            (Some(want), _) => assert_eq!(got.expect(name), want.as_str().expect("rendered"), "{name}"),
            (None, Some(err)) => match got {
                Err(ChatError::Raised(message)) => {
                    assert_eq!(message, err.as_str().expect("error"), "{name}")
                }
                other => panic!("{name}: expected the template's exception, got {other:?}"),
            },
            (None, None) => panic!("{name}: fixture has neither `rendered` nor `error`"),
        }
    }
}

#[test]
fn key_order_survives_the_round_trip() {
    // Guards `raw_fixture_value`: minijinja maps read from JSON keep insertion order.
    let direct: Value = serde_json::from_str(r#"{"z": 1, "a": 2}"#).expect("value");
    let keys: Vec<String> = direct.try_iter().expect("iter").map(|k| k.to_string()).collect();
    assert_eq!(keys, ["z", "a"]);
}
