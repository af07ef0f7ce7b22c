//! Every shipped recipe rendered for every engine, pinned by snapshots: the exact
//! command line, environment, option files and warnings, or the error the engine gives.
//! The recipe's own engine renders at its own release; the others at the newest
//! release sous knows.

use std::path::{Path, PathBuf};

use sous_engine::diagnose::Diagnose;
use sous_engine::launch::{self, RenderContext};
use sous_engine::recipe::{self, EngineKind, Overrides};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn shipped() -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![root().join("recipes")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("recipes directory") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "toml")
                // The hardware table `sous plan` reads is data beside the recipes, not one.
                && !path.ends_with("hardware.toml")
            {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

fn render(path: &Path, kind: EngineKind) -> String {
    let loaded = recipe::load(path, &Overrides::new()).expect("shipped recipes load");
    let mut recipe = loaded.recipe;
    if recipe.engine.kind != kind {
        recipe.engine.kind = kind;
        recipe.engine.version = None;
        recipe.engine.image = None;
    }
    let ctx = RenderContext {
        instance_dir: PathBuf::from("/state").join(&recipe.name),
        hub_cache: PathBuf::from("/hub"),
        native_command: vec![
            "sous".into(),
            "serve".into(),
            "--engine-process".into(),
            "--recipe".into(),
        ],
        weights: None,
        compile_cache: None,
    };
    match launch::render(&recipe, &ctx) {
        Ok(launch) => {
            let mut out = launch.to_shell();
            for w in &launch.warnings {
                out.push_str(&format!("# warning: {}\n", w.message));
            }
            out
        }
        Err(err) => format!("error: {err}\nhint: {}\n", err.hint().unwrap_or_default()),
    }
}

#[test]
fn shipped_recipes_render_for_every_engine() {
    let recipes = shipped();
    assert!(recipes.len() >= 3, "{recipes:?}");
    for path in recipes {
        let relative = path.strip_prefix(root().join("recipes")).expect("under recipes/");
        let stem = relative.with_extension("").to_string_lossy().replace('/', "__");
        for kind in [EngineKind::Vllm, EngineKind::Sglang, EngineKind::Trtllm] {
            insta::assert_snapshot!(format!("{stem}__{kind}"), render(&path, kind));
        }
    }
}

fn render_local_native(sets: &[&str]) -> Result<launch::Launch, launch::RenderError> {
    let mut overrides = Overrides::new();
    for set in sets {
        overrides.set(set).expect("a valid --set");
    }
    let path = root().join("recipes/local/smollm2-135m.toml");
    let recipe = recipe::load(&path, &overrides)
        .expect("the local recipe loads")
        .recipe;
    let ctx = RenderContext {
        instance_dir: std::env::temp_dir().join("sous-render-native-test"),
        hub_cache: PathBuf::from("/hub"),
        native_command: vec!["sous".into()],
        weights: None,
        compile_cache: None,
    };
    launch::render(&recipe, &ctx)
}

/// A setting the native engine would otherwise drop is refused at render time (so by
/// `sous serve --dry-run`, `sous deploy` and `sous serve` alike), naming the key.
#[test]
fn the_native_engine_refuses_settings_it_cannot_honour() {
    let cases = [
        ("memory.kv_cache_dtype=\"fp8\"", "memory.kv_cache_dtype", "f32"),
        (
            "memory.kv_cache_dtype=\"float16\"",
            "memory.kv_cache_dtype",
            "float16",
        ),
        (
            "memory.kv_offload_bytes=\"4GiB\"",
            "memory.kv_offload_bytes",
            "host memory",
        ),
        (
            "serving.tensor_parallel=2",
            "serving.tensor_parallel",
            "one process",
        ),
        (
            "serving.pipeline_parallel=2",
            "serving.pipeline_parallel",
            "one process",
        ),
        ("serving.data_parallel=2", "serving.data_parallel", "one process"),
        (
            "serving.expert_parallel=true",
            "serving.expert_parallel",
            "experts",
        ),
        (
            "serving.reasoning_parser=\"qwen3\"",
            "serving.reasoning_parser",
            "parses no",
        ),
        (
            "serving.tool_call_parser=\"hermes\"",
            "serving.tool_call_parser",
            "parses no",
        ),
        (
            "serving.trust_remote_code=true",
            "serving.trust_remote_code",
            "runs no code",
        ),
    ];
    for (set, key, why) in cases {
        let err = render_local_native(&[set]).expect_err(set);
        assert_eq!(err.key(), Some(key), "{set}: {err}");
        let text = err.to_string();
        assert!(text.contains(key) && text.contains(why), "{set}: {text}");
        assert!(
            err.hint().is_some_and(|h| h.contains(key)),
            "{set}: {:?}",
            err.hint()
        );
    }
    // What it does honour, or what says nothing beyond its default, renders.
    for sets in [
        &[][..],
        &["memory.kv_cache_dtype=\"auto\""],
        &["memory.kv_cache_dtype=\"bfloat16\""],
        &["serving.tensor_parallel=1", "serving.data_parallel=1"],
        &["serving.expert_parallel=false", "serving.trust_remote_code=false"],
        &["serving.auto_tool_choice=false"],
    ] {
        if let Err(err) = render_local_native(sets) {
            panic!("{sets:?}: {err}");
        }
    }
}

/// Every shipped recipe that names the native engine renders for it.
#[test]
fn shipped_native_recipes_render() {
    for path in shipped() {
        let loaded = recipe::load(&path, &Overrides::new()).expect("shipped recipes load");
        if loaded.recipe.engine.kind == EngineKind::Native {
            let out = render(&path, EngineKind::Native);
            assert!(!out.starts_with("error:"), "{}: {out}", path.display());
        }
    }
}

/// The engine process refuses the same settings, should it be given such a recipe
/// without `sous serve` rendering it first.
#[test]
fn the_native_engine_process_refuses_them_too() {
    let path = root().join("recipes/local/smollm2-135m.toml");
    let mut overrides = Overrides::new();
    overrides
        .set("memory.kv_cache_dtype=\"fp8\"")
        .expect("a valid --set");
    let recipe = recipe::load(&path, &overrides)
        .expect("the local recipe loads")
        .recipe;
    let err = sous_engine::native::Settings::from_recipe(&recipe, Path::new("/models/m"))
        .expect_err("an fp8 KV cache is refused");
    assert!(err.to_string().contains("`memory.kv_cache_dtype`"), "{err}");
    assert!(
        err.hint().is_some_and(|h| h.contains("\"bfloat16\"")),
        "{:?}",
        err.hint()
    );
    // A bf16 cache it does hold.
    let mut bf16 = Overrides::new();
    bf16.set("memory.kv_cache_dtype=\"bfloat16\"")
        .expect("a valid --set");
    let recipe = recipe::load(&path, &bf16).expect("loads").recipe;
    let settings =
        sous_engine::native::Settings::from_recipe(&recipe, Path::new("/models/m")).expect("a bf16 cache");
    assert_eq!(settings.kv_dtype, sous_engine::native::KvDtype::Bf16);
    // The shipped recipe serves bf16, so its `auto` cache is bf16 too; in f32, f32.
    let plain = recipe::load(&path, &Overrides::new()).expect("loads").recipe;
    let settings = sous_engine::native::Settings::from_recipe(&plain, Path::new("/models/m"))
        .expect("the shipped recipe is honoured");
    assert_eq!(settings.kv_dtype, sous_engine::native::KvDtype::Bf16);
    let mut f32 = Overrides::new();
    f32.set("serving.dtype=\"float32\"").expect("a valid --set");
    let recipe = recipe::load(&path, &f32).expect("loads").recipe;
    let settings = sous_engine::native::Settings::from_recipe(&recipe, Path::new("/models/m")).expect("f32");
    assert_eq!(settings.kv_dtype, sous_engine::native::KvDtype::F32);
}
