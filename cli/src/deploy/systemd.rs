//! systemd: units that run `sous serve --recipe` on this machine, which pulls,
//! quantizes, supervises and restarts the engine as it does by hand; systemd starts it
//! at boot and restarts sous itself. One unit per replica, each with its own GPUs
//! (`CUDA_VISIBLE_DEVICES`), port and instance name; the resolved recipe beside them.
//! With `[deploy.router]`, a unit for the router on the recipe's port (installed with
//! pip on the machine), the replicas on the ports after it.
//!
//! Secrets come from an `EnvironmentFile` the operator writes (`HF_TOKEN=...`, the API
//! key's variable), never from the rendering. Directives: systemd.exec(5),
//! systemd.service(5), systemd.kill(5) of systemd 252.

use std::fmt::Write as _;

use sous_engine::recipe::Recipe;

use super::pod::{argv_with, check_offload_limit};
use super::router::{self, Workers};
use super::{DeployError, File, Options};

/// Where the units expect the recipe and the secrets.
pub const ETC_DIR: &str = "/etc/sous";
/// Seconds systemd waits beyond `server.stop_grace` before it kills sous itself.
const STOP_MARGIN: u64 = 15;

/// The recipe file and one unit per replica.
pub(super) fn render(recipe: &Recipe, options: &Options) -> Result<Vec<File>, DeployError> {
    let deploy = &recipe.deploy;
    let mut file = recipe.to_file();
    file.deploy = Default::default();
    let toml = toml::to_string(&file).map_err(|e| DeployError::Toml(e.to_string()))?;
    let recipe_file = format!("{}.toml", recipe.name);
    let recipe_path = format!("{ETC_DIR}/{recipe_file}");
    let gpus = recipe.gpus();
    check_offload_limit(recipe)?;
    if let Some(per_node) = deploy.gpus_per_node
        && gpus > per_node
    {
        return Err(DeployError::TargetCannotSpan {
            target: "systemd",
            gpus,
            nodes: gpus.div_ceil(per_node),
        });
    }
    let mut files = vec![File {
        name: recipe_file.clone(),
        contents: format!(
            "# The resolved recipe `{}`, rendered by `sous deploy` for `sous serve`. Install as {recipe_path}.\n{toml}",
            recipe.name
        ),
    }];
    // With a router, it takes the recipe's port and the replicas the ports after it.
    let routed = deploy.router.is_some();
    let mut instances = Vec::new();
    for replica in 0..deploy.replicas {
        let port =
            u16::try_from(u32::from(recipe.server.port) + u32::from(routed) + replica).map_err(|_| {
                DeployError::Ports {
                    port: recipe.server.port,
                    replicas: deploy.replicas,
                }
            })?;
        let (unit, instance) = if deploy.replicas == 1 {
            (format!("sous-{}.service", deploy.name), recipe.name.clone())
        } else {
            (
                format!("sous-{}-{replica}.service", deploy.name),
                format!("{}-{replica}", recipe.name),
            )
        };
        instances.push((unit.clone(), port));
        let mut text = String::new();
        let _ = writeln!(
            text,
            "# Rendered by sous {} from the recipe `{}`. Install as /etc/systemd/system/{unit},\n# with the recipe as {recipe_path}; edit the recipe and render again.",
            env!("CARGO_PKG_VERSION"),
            recipe.name
        );
        let _ = writeln!(text, "[Unit]");
        let description = recipe.description.as_deref().unwrap_or("an LLM server");
        let _ = writeln!(text, "Description=sous serve {instance}: {}", escape(description));
        let _ = writeln!(text, "Documentation=https://github.com/sous-dev/sous");
        let _ = writeln!(text, "Wants=network-online.target");
        let _ = writeln!(text, "After=network-online.target");
        let _ = writeln!(text);
        let _ = writeln!(text, "[Service]");
        let _ = writeln!(text, "Type=exec");
        let _ = writeln!(
            text,
            "# HF_TOKEN=..., and the API key's variable when the recipe names one."
        );
        let _ = writeln!(text, "EnvironmentFile=-{ETC_DIR}/{}.env", deploy.name);
        if gpus > 0 {
            let ids: Vec<String> = (replica * gpus..(replica + 1) * gpus)
                .map(|g| g.to_string())
                .collect();
            let _ = writeln!(text, "Environment=CUDA_VISIBLE_DEVICES={}", ids.join(","));
        }
        let _ = writeln!(text, "Environment=SOUS_STATE_DIR=/var/lib/sous/state");
        let _ = writeln!(text, "Environment=SOUS_CACHE_DIR=/var/cache/sous");
        let _ = writeln!(text, "Environment=HF_HOME=/var/lib/sous/huggingface");
        if let Some(limit) = &deploy.memory_limit {
            // sous and its engine in one cgroup: the limit the recipe gives the pod.
            let _ = writeln!(text, "MemoryMax={}", limit.value as u64);
        }
        let _ = writeln!(text, "StateDirectory=sous");
        let _ = writeln!(text, "CacheDirectory=sous");
        let mut exec = format!("{} serve --recipe {recipe_path}", options.sous_bin);
        if deploy.replicas > 1 {
            let _ = write!(exec, " --set name={instance}");
        }
        if port != recipe.server.port {
            let _ = write!(exec, " --set server.port={port}");
        }
        let _ = writeln!(text, "ExecStart={exec}");
        let _ = writeln!(text, "Restart=on-failure");
        let _ = writeln!(text, "RestartSec=10s");
        // sous stops its engine (SIGTERM, then SIGKILL after stop_grace) before it exits.
        let _ = writeln!(text, "KillMode=mixed");
        let _ = writeln!(
            text,
            "TimeoutStopSec={}s",
            recipe.server.stop_grace.as_secs() + STOP_MARGIN
        );
        let _ = writeln!(text);
        let _ = writeln!(text, "[Install]");
        let _ = writeln!(text, "WantedBy=multi-user.target");
        files.push(File {
            name: unit,
            contents: text,
        });
    }
    if routed {
        files.push(router_unit(recipe, options, &instances));
    }
    Ok(files)
}

/// The router's unit, in front of `instances` (unit, port).
fn router_unit(recipe: &Recipe, options: &Options, instances: &[(String, u16)]) -> File {
    let deploy = &recipe.deploy;
    let unit = format!("sous-{}-router.service", deploy.name);
    // The replicas listen where the recipe says; on every interface, loopback reaches them.
    let host = match recipe.server.host.as_str() {
        "0.0.0.0" | "::" => "127.0.0.1".to_owned(),
        h if h.contains(':') => format!("[{h}]"),
        h => h.to_owned(),
    };
    let workers = Workers::Urls(
        instances
            .iter()
            .map(|(_, port)| format!("http://{host}:{port}"))
            .collect(),
    );
    let program = match &options.router_bin {
        Some(bin) => vec![bin.clone()],
        None => router::program(deploy.router.kind),
    };
    let args = router::args(recipe, &recipe.server.host, &workers);
    let exec: Vec<String> = program
        .into_iter()
        .chain(argv_with(
            &args,
            |a| escape(a).replace('$', "$$"),
            |var| format!("${{{var}}}"),
        ))
        .collect();
    let units: Vec<&str> = instances.iter().map(|(u, _)| u.as_str()).collect();
    let mut text = String::new();
    let _ = writeln!(
        text,
        "# Rendered by sous {} from the recipe `{}`. Install as /etc/systemd/system/{unit};\n# {} {} (`pip install {}=={}`).",
        env!("CARGO_PKG_VERSION"),
        recipe.name,
        deploy.router.kind.as_str(),
        deploy.router.version,
        deploy.router.kind.as_str(),
        deploy.router.version
    );
    let _ = writeln!(text, "[Unit]");
    let _ = writeln!(
        text,
        "Description={} in front of {}",
        deploy.router.kind.as_str(),
        units.join(" ")
    );
    let _ = writeln!(text, "Documentation=https://github.com/sous-dev/sous");
    let _ = writeln!(text, "Wants=network-online.target {}", units.join(" "));
    let _ = writeln!(text, "After=network-online.target {}", units.join(" "));
    let _ = writeln!(text);
    let _ = writeln!(text, "[Service]");
    let _ = writeln!(text, "Type=exec");
    let _ = writeln!(text, "# The API key's variable, when the recipe names one.");
    let _ = writeln!(text, "EnvironmentFile=-{ETC_DIR}/{}.env", deploy.name);
    let _ = writeln!(text, "DynamicUser=yes");
    let _ = writeln!(text, "ExecStart={}", exec.join(" "));
    let _ = writeln!(text, "Restart=on-failure");
    let _ = writeln!(text, "RestartSec=10s");
    let _ = writeln!(text);
    let _ = writeln!(text, "[Install]");
    let _ = writeln!(text, "WantedBy=multi-user.target");
    File {
        name: unit,
        contents: text,
    }
}

/// A value for a unit file: `%` is a specifier there, written `%%`.
fn escape(text: &str) -> String {
    text.replace('%', "%%")
}
