//! Readiness, the one definition sous has: the engine's `/health` answers 200 and its
//! `/v1/models` lists the served model. A refused connection or a 503 means "still
//! starting" for as long as the process lives: vLLM 0.33 answers 503 until its engine is
//! up (`vllm/entrypoints/serve/instrumentator/health.py`), SGLang 0.5.23 answers 503 until
//! its warm-up request succeeds and then runs a one-token generation per `/health`
//! (`python/sglang/srt/entrypoints/http_server.py`), and trtllm-serve refuses
//! connections until the model is loaded (`tensorrt_llm/serve/openai_server.py`).
//!
//! Not here: what happens when the engine dies while starting (the supervisor's
//! business).

use std::time::Duration;

use super::instance;
use crate::recipe::{EngineKind, Recipe};

/// The path every engine answers 200 on once it serves (and 503, or nothing, before).
pub const HEALTH_PATH: &str = "/health";

/// How long one `/health` request may take: SGLang's runs a one-token generation and
/// may take up to 20 s to answer; the others answer at once.
pub fn health_timeout(engine: EngineKind) -> Duration {
    match engine {
        EngineKind::Sglang => Duration::from_secs(25),
        _ => Duration::from_secs(5),
    }
}

/// Polls until `/health` answers 200 and `/v1/models` lists the served model; with
/// `own_group`, also until a process of that group listens on the recipe's port.
/// Returns the base URL. `recipe` is the recipe as the engine serves it
/// ([`crate::launch::served_recipe`]).
pub(super) async fn wait_ready(recipe: &Recipe, own_group: Option<i32>) -> String {
    let url = recipe.server.local_url();
    let client = reqwest::Client::builder()
        .timeout(health_timeout(recipe.engine.kind))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap_or_default();
    // trtllm-serve before 1.3 reports the model path or its last component.
    let arg = recipe.model.engine_arg();
    let names = [
        recipe.model.served_name.as_str(),
        arg,
        arg.rsplit('/').next().unwrap_or(arg),
    ];
    loop {
        if let Some(pgid) = own_group
            && !instance::group_listens(pgid, recipe.server.port)
        {
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        }
        let healthy = client
            .get(format!("{url}{HEALTH_PATH}"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if healthy {
            let mut request = client.get(format!("{url}/v1/models"));
            if let Some(key) = recipe.server.api_key_env.as_deref().and_then(crate::env::named) {
                request = request.bearer_auth(key);
            }
            if let Ok(response) = request.send().await
                && let Ok(body) = response.json::<serde_json::Value>().await
                && body["data"].as_array().is_some_and(|models| {
                    models
                        .iter()
                        .any(|m| m["id"].as_str().is_some_and(|id| names.contains(&id)))
                })
            {
                return url;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
