//! The native engine as a process of its own, so that it runs under the same
//! supervisor as the other engines (readiness, restarts with backoff, signals, the log
//! file, `--replace`): the command the binary gives as
//! [`RenderContext::native_command`] (`sous serve --engine-process --recipe`) serves
//! the model in that process, from the resolved recipe written here into the instance
//! directory. That recipe names the model directory the build step produced, so the
//! engine process never pulls or quantizes.

use super::{Arg, Launch, LaunchFile, RenderContext};
use crate::recipe::{EngineKind, Recipe};

/// The resolved recipe the engine process reads.
pub const RECIPE_FILE: &str = "native-recipe.toml";

pub(super) fn render(recipe: &Recipe, ctx: &RenderContext) -> Result<Launch, super::RenderError> {
    if let Some(u) = crate::native::unhonoured(recipe) {
        return Err(super::RenderError::Unsupported {
            engine: "the native engine".into(),
            key: u.key.into(),
            message: u.message,
            hint: Some(u.hint),
        });
    }
    let path = ctx.instance_dir.join(RECIPE_FILE);
    // `[deploy]` is nothing the engine process reads.
    let mut file = recipe.to_file();
    file.deploy = Default::default();
    let contents = toml::to_string(&file).map_err(|e| super::RenderError::Unsupported {
        engine: "the native engine".into(),
        key: "name".into(),
        message: format!("the resolved recipe cannot be written as TOML: {e}"),
        hint: None,
    })?;
    let argv = ctx
        .native_command
        .iter()
        .cloned()
        .chain([path.display().to_string()]);
    Ok(Launch {
        engine: EngineKind::Native,
        version: env!("CARGO_PKG_VERSION").into(),
        version_assumed: false,
        argv: argv.map(Arg::Lit).collect(),
        env: Default::default(),
        files: vec![LaunchFile {
            path,
            contents: format!(
                "# The resolved recipe `{}`, written by `sous serve` for its engine process.\n{contents}",
                recipe.name
            ),
        }],
        image: None,
        warnings: Vec::new(),
    })
}
