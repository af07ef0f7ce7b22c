//! Chat templates rendered with minijinja against transformers' `apply_chat_template`
//! output (`tests/fixtures/smollm2/chat_template_cases.json`, made by
//! `scripts/reference/smollm2_reference.py`): SmolLM2's own template on several
//! conversations, and small templates that exercise the rest of transformers'
//! environment. Needs no model: the template text is in the fixture.

use std::path::PathBuf;

use minijinja::Value;
use sous_engine::chat::{ChatError, ChatTemplate, ChatTemplates, RenderOptions, SpecialTokens};

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
        ..SpecialTokens::default()
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
        ..RenderOptions::default()
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

/// Model folders saved by transformers 5.17 itself, each with its template(s) in one of
/// the places transformers reads them from (`tests/fixtures/chat-templates/`, made by
/// `scripts/reference/chat_template_folders.py`): the template transformers picks and the
/// text it renders, with and without tools and with template keyword arguments, or its
/// refusal when named templates have no `default`.
#[test]
fn folders_saved_by_transformers_render_as_it_does() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chat-templates");
    let text = std::fs::read_to_string(root.join("cases.json")).expect("cases.json");
    // Messages and tools as minijinja values, which keep the fixture's key order (the
    // tool's schema is printed as transformers printed it).
    let raw: Value = serde_json::from_str(&text).expect("minijinja value");
    let cases: serde_json::Value = serde_json::from_str(&text).expect("json");
    let conversations = raw.get_attr("conversations").expect("conversations");
    let message_of = |name: &str| {
        conversations
            .try_iter()
            .expect("list")
            .find(|c| c.get_attr("name").ok().as_ref().and_then(Value::as_str) == Some(name))
            .and_then(|c| c.get_attr("messages").ok())
            .unwrap_or_else(|| panic!("conversation {name}"))
    };
    let weather = raw.get_attr("weather_tool").expect("tool");
    let folders = cases["folders"].as_object().expect("folders");
    assert_eq!(folders.len(), 7);
    for (name, folder) in folders {
        let dir = root.join(name);
        let config: Option<serde_json::Value> = std::fs::read(dir.join("tokenizer_config.json"))
            .ok()
            .map(|b| serde_json::from_slice(&b).expect("tokenizer_config.json"));
        let templates = ChatTemplates::load(&dir, config.as_ref()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let want_names: Vec<&str> = match folder["chat_template"]["kind"].as_str() {
            Some("dict") => folder["chat_template"]["names"]
                .as_array()
                .expect("names")
                .iter()
                .filter_map(|n| n.as_str())
                .collect(),
            _ => Vec::new(),
        };
        assert_eq!(templates.names(), want_names, "{name}");
        for case in folder["cases"].as_array().expect("cases") {
            let label = format!("{name}: {case}");
            let has_tools = case["tools"].as_bool().expect("tools");
            let mut options = RenderOptions {
                add_generation_prompt: true,
                tools: has_tools.then(|| Value::from_iter([weather.clone()])),
                ..RenderOptions::default()
            };
            for (key, value) in case["kwargs"].as_object().expect("kwargs") {
                options
                    .kwargs
                    .insert(key.clone(), Value::from(minijinja::value::Serde(value)));
            }
            let messages = message_of(case["conversation"].as_str().expect("conversation"));
            let got = templates
                .select(has_tools)
                .and_then(|t| t.render(&messages, &options));
            match (case.get("rendered"), case.get("error")) {
                (Some(want), _) => assert_eq!(got.expect(&label), want.as_str().expect("text"), "{label}"),
                (None, Some(error)) => {
                    let error = error.as_str().expect("error");
                    assert!(error.contains("no default specified"), "{label}");
                    assert!(matches!(got, Err(ChatError::NoDefault(_))), "{label}: {got:?}");
                }
                (None, None) => panic!("{label}: neither `rendered` nor `error`"),
            }
        }
    }
}

#[test]
fn a_folder_without_a_template_says_where_it_looked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = serde_json::json!({"eos_token": "</s>"});
    let err = ChatTemplates::load(dir.path(), Some(&config)).expect_err("no template");
    let message = err.to_string();
    assert!(message.contains("chat_template.jinja"), "{message}");
    assert!(message.contains("tokenizer_config.json"), "{message}");
    // A processor's file is named, with what to do about it.
    std::fs::write(
        dir.path().join("chat_template.json"),
        r#"{"chat_template": "{{ messages }}"}"#,
    )
    .expect("write");
    let message = ChatTemplates::load(dir.path(), Some(&config))
        .expect_err("still none")
        .to_string();
    assert!(
        message.contains("chat_template.json is a processor's file"),
        "{message}"
    );
    // A template that does not parse names its file.
    std::fs::write(dir.path().join("chat_template.jinja"), "{% if %}").expect("write");
    let message = ChatTemplates::load(dir.path(), Some(&config))
        .expect_err("bad template")
        .to_string();
    assert!(message.contains("chat_template.jinja:"), "{message}");
}
