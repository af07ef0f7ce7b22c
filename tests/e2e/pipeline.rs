//! The build pipeline driven through the `sous` library, without the command line:
//! a native NVFP4 recipe is built (quantized once, up to date the second time),
//! started under the supervisor, answers a request, blocks a second start, and stops
//! cleanly. Only the native engine's own process is the `sous` binary, as in
//! production.

use std::sync::Arc;
use std::time::Duration;

use sous::hub::config::HubConfig;
use sous::pipeline::{self, PipelineError, Setup, Started};
use sous_engine::recipe::{Overrides, load};
use sous_engine::reporter::{Recorded, Reporter, Said};

use crate::util::{free_port, smollm2};

#[test]
fn the_pipeline_builds_starts_and_stops_a_native_recipe() {
    // No `cpu_exclusive()`: a quantization of the test model and four generated tokens
    // weigh no more than the quantize tests, which run beside the others too.
    let Some(model) = smollm2() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let file = dir.path().join("pipeline.toml");
    std::fs::write(
        &file,
        format!(
            "name = \"pipeline-test\"\n[model]\npath = \"{}\"\nserved_name = \"smollm2\"\n\n\
             [quantize]\nscheme = \"nvfp4a16\"\n\n[engine]\nkind = \"native\"\n\n\
             [memory]\nkv_cache_bytes = \"64MiB\"\n\n[serving]\nmax_model_len = 512\n\n[server]\nhost = \"127.0.0.1\"\nport = {port}\nstop_grace = \"3s\"\n",
            model.display()
        ),
    )
    .expect("recipe");
    let recipe = load(&file, &Overrides::new()).expect("the recipe loads").recipe;
    let setup = Setup {
        hub: HubConfig::from_vars(|name| {
            (name == "HF_HUB_CACHE").then(|| dir.path().join("hub").display().to_string())
        }),
        state_dir: dir.path().join("state"),
        cache_dir: dir.path().join("cache"),
        native_command: vec![
            env!("CARGO_BIN_EXE_sous").into(),
            "serve".into(),
            "--engine-process".into(),
            "--recipe".into(),
        ],
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");

    let first = Arc::new(Recorded::default());
    let reporter: Arc<dyn Reporter> = first.clone();
    let built = runtime
        .block_on(pipeline::build(&recipe, &setup, false, &reporter))
        .expect("the recipe builds");
    assert_eq!(built.recipe, recipe, "the build leaves the recipe as it is");
    assert!(built.weights.given_to_engine);
    assert_eq!(built.weights.dir, setup.quantized_dir(&recipe));
    assert!(built.weights.dir.join("config.json").is_file());
    let said = first.said();
    assert!(
        said.iter()
            .any(|s| matches!(s, Said::Status(w, m) if w == "quantized" && m.contains("weights to"))),
        "{said:?}"
    );

    let again = Arc::new(Recorded::default());
    let reporter: Arc<dyn Reporter> = again.clone();
    let rebuilt = runtime
        .block_on(pipeline::build(&recipe, &setup, false, &reporter))
        .expect("the recipe builds again");
    assert_eq!(rebuilt.weights, built.weights);
    assert!(
        again
            .said()
            .iter()
            .any(|s| matches!(s, Said::Status(w, m) if w == "quantized" && m.ends_with("is up to date"))),
        "{:?}",
        again.said()
    );

    let running = pipeline::running(&recipe, &setup, false, reporter.as_ref()).expect("nothing runs yet");
    assert!(running.is_none());
    let started = runtime
        .block_on(pipeline::start(&built, &setup, running, reporter.clone()))
        .expect("the instance starts");
    let Started::Running(mut instance) = started else {
        panic!("nothing ran before, so something must start")
    };
    let ready = runtime
        .block_on(instance.ready())
        .expect("the instance is ready")
        .clone();
    assert_eq!(ready.url, format!("http://127.0.0.1:{port}"));
    let capacity = ready.capacity.expect("the native engine reports its KV capacity");
    assert!(capacity.tokens > 0, "{capacity:?}");
    assert!(setup.instance_dir(&recipe).join("instance.json").is_file());

    let answer: serde_json::Value = runtime
        .block_on(async {
            reqwest::Client::new()
                .post(format!("{}/v1/completions", ready.url))
                .json(&serde_json::json!({"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}))
                .timeout(Duration::from_secs(60))
                .send()
                .await?
                .json()
                .await
        })
        .expect("a completion");
    assert!(answer["choices"][0]["text"].is_string(), "{answer}");

    match pipeline::running(&recipe, &setup, false, reporter.as_ref()) {
        Err(PipelineError::AlreadyServed { name, pid, .. }) => {
            assert_eq!(name, "pipeline-test");
            assert_eq!(pid, std::process::id(), "this process supervises the instance");
        }
        other => panic!("a second start must be refused, got {other:?}"),
    }

    runtime.block_on(instance.stop()).expect("the instance stops");
    assert!(!setup.instance_dir(&recipe).join("instance.json").exists());
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "nothing listens on the port after the stop"
    );
    let words = again.words();
    assert!(
        words.iter().any(|w| w == "ready") && words.iter().any(|w| w == "stopping"),
        "{words:?}"
    );
}
