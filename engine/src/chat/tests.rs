//! Tests of chat-template rendering and of the Python behaviour it mirrors.

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
