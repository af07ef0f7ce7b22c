//! Running the rendered command in a container (`engine.runtime = "docker"` or
//! `"podman"`): the same argv after `--entrypoint`, with the GPUs, the Hub cache, the
//! model directory, the instance directory (option files), the kept compile caches
//! and the port.
//!
//! Environment values are passed by name (`-e NAME`) with the value set on the
//! container CLI's own environment, so they never appear in `ps` or in a rendering.

use super::{Arg, Launch};
use crate::recipe::{Recipe, Runtime, Warning};

/// Where the Hub cache is mounted inside the container.
pub const CONTAINER_HUB_CACHE: &str = "/root/.cache/huggingface/hub";

pub(super) fn wrap(launch: &mut Launch, recipe: &Recipe, ctx: &super::RenderContext) {
    let runtime = recipe.engine.runtime;
    let Some(image) = recipe.engine.image.clone() else {
        return;
    };
    let mut argv: Vec<Arg> = ["run", "--rm", "--init", "--name"]
        .iter()
        .map(|s| Arg::from(*s))
        .collect();
    argv.insert(0, Arg::from(runtime.as_str()));
    argv.push(Arg::Lit(format!("sous-{}", recipe.name)));
    match runtime {
        Runtime::Podman => argv.extend(["--device", "nvidia.com/gpu=all"].map(Arg::from)),
        _ => argv.extend(["--gpus", "all"].map(Arg::from)),
    }
    // vLLM and SGLang share tensors between processes through /dev/shm.
    argv.extend(["--ipc", "host"].map(Arg::from));
    let port = recipe.server.port;
    argv.push(Arg::from("--publish"));
    argv.push(Arg::Lit(format!("{}:{port}:{port}", recipe.server.host)));
    if recipe.server.host != "0.0.0.0" {
        launch.warnings.push(Warning::new(format!(
            "in a container the engine should listen on 0.0.0.0; `server.host` ({}) is used for the published port",
            recipe.server.host
        )));
    }
    let mut mount = |from: String, to: String, read_only: bool| {
        argv.push(Arg::from("--volume"));
        argv.push(Arg::Lit(format!(
            "{from}:{to}{}",
            if read_only { ":ro" } else { "" }
        )));
    };
    mount(
        ctx.hub_cache.display().to_string(),
        CONTAINER_HUB_CACHE.to_owned(),
        false,
    );
    if let Some(path) = &recipe.model.path {
        mount(path.clone(), path.clone(), true);
    }
    if let Some(dir) = &ctx.compile_cache {
        let dir = dir.display().to_string();
        mount(dir.clone(), dir, false);
    }
    if !launch.files.is_empty() {
        let dir = ctx.instance_dir.display().to_string();
        mount(dir.clone(), dir, true);
    }
    launch
        .env
        .insert("HF_HUB_CACHE".into(), Arg::from(CONTAINER_HUB_CACHE));
    for name in launch.env.keys() {
        argv.push(Arg::from("--env"));
        argv.push(Arg::Lit(name.clone()));
    }
    let mut inner = std::mem::take(&mut launch.argv).into_iter();
    if let Some(program) = inner.next() {
        argv.push(Arg::from("--entrypoint"));
        argv.push(program);
    }
    argv.push(Arg::Lit(image));
    argv.extend(inner);
    launch.argv = argv;
}
