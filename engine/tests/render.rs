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
