//! compose: the [`Plan`] as a `docker-compose.yml` for one machine, in the Compose
//! Specification's terms (compose-spec/compose-spec, `spec.md`) as Docker Compose
//! and podman-compose read it: the init steps as one-shot services the engine
//! waits for (`service_completed_successfully`), one engine service per replica with
//! its own GPUs (`device_ids`) and host port, the caches on a named volume, the
//! recipe files bound read-only from the rendered directory, a health check on the
//! engine's `/health`; with `[deploy.router]`, the router as one more service on the
//! recipe's port, given the replicas by their service names, which move to the ports
//! after it.
//!
//! Every service sets `entrypoint` to its program and `command` to the arguments:
//! compose's `command` alone replaces only the image's `CMD` and runs after its
//! `ENTRYPOINT` (`vllm serve` in the official vLLM image, `sous` in ours), so the
//! container would run the program twice. With `entrypoint` set, compose drops the
//! image's `ENTRYPOINT` and `CMD` (compose-spec `spec.md`, `entrypoint`), and the
//! container runs the command line `sous serve --dry-run` prints.
//!
//! Secrets are `${NAME}` references, filled in by compose from its environment or an
//! `.env` file beside the compose file; no value is ever written here. A literal `$`
//! is written `$$`, as compose requires.

use std::collections::BTreeMap;

use serde::Serialize;
use sous_engine::launch::Arg;
use sous_engine::recipe::EngineKind;

use super::pod::{self, CONFIG_DIR, DATA_DIR, ModelMount, Plan};
use super::router::{self, Workers};
use super::{DeployError, File};

/// The compose file's name.
pub const COMPOSE_FILE: &str = "docker-compose.yml";
/// The label carrying the recipe's content hash (the pods' annotation on Kubernetes).
const HASH_LABEL: &str = "sous.dev/recipe-hash";

#[derive(Serialize)]
struct Compose {
    services: BTreeMap<String, Service>,
    volumes: BTreeMap<String, Volume>,
}

#[derive(Serialize)]
struct Volume {
    name: String,
}

#[derive(Serialize, Default)]
struct Service {
    image: String,
    /// The content hash of the bound files: a changed recipe changes the service, so
    /// `docker compose up -d` recreates it (a changed bound file alone would not).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    labels: BTreeMap<String, String>,
    /// The program: it replaces the image's `ENTRYPOINT` (and its `CMD`).
    entrypoint: Vec<String>,
    /// The program's arguments.
    command: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    environment: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    volumes: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    ports: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    depends_on: BTreeMap<String, Dependency>,
    #[serde(skip_serializing_if = "Option::is_none")]
    shm_size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mem_limit: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mem_reservation: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    healthcheck: Option<Healthcheck>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_grace_period: Option<String>,
    /// Unset for the one-shot init services (compose's default, `"no"`, which YAML
    /// 1.1 readers such as PyYAML would take for `false` if written unquoted).
    #[serde(skip_serializing_if = "Option::is_none")]
    restart: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deploy: Option<DeploySpec>,
}

#[derive(Serialize)]
struct Dependency {
    condition: &'static str,
}

#[derive(Serialize)]
struct Healthcheck {
    test: Vec<String>,
    interval: String,
    timeout: String,
    retries: u32,
    start_period: String,
}

#[derive(Serialize)]
struct DeploySpec {
    resources: Resources,
}

#[derive(Serialize)]
struct Resources {
    reservations: Reservations,
}

#[derive(Serialize)]
struct Reservations {
    devices: Vec<Device>,
}

#[derive(Serialize)]
struct Device {
    driver: &'static str,
    device_ids: Vec<String>,
    capabilities: Vec<&'static str>,
}

/// The compose file and the files it binds.
pub(super) fn render(plan: &Plan, warnings: &mut Vec<String>) -> Result<Vec<File>, DeployError> {
    let deploy = &plan.recipe.deploy;
    if let Some(per_node) = deploy.gpus_per_node
        && plan.gpus > per_node
    {
        return Err(DeployError::TargetCannotSpan {
            target: "compose",
            gpus: plan.gpus,
            nodes: plan.gpus.div_ceil(per_node),
        });
    }
    let volume = format!("{}-data", plan.name);
    let mut volumes = vec![format!("{volume}:{DATA_DIR}")];
    for file in plan.config.keys() {
        volumes.push(format!("./{file}:{CONFIG_DIR}/{file}:ro"));
    }
    match &plan.model_mount {
        ModelMount::Host { path, read_only } => {
            volumes.push(format!("{path}:{path}{}", if *read_only { ":ro" } else { "" }));
        }
        ModelMount::InData | ModelMount::DataSubPath { .. } | ModelMount::Claim { .. } => {}
    }
    let cache_env: BTreeMap<String, String> = plan
        .cache_env
        .iter()
        .map(|(k, v)| (k.clone(), escape(v)))
        .collect();
    let secret = |var: &str, optional: bool| {
        if optional {
            format!("${{{var}:-}}")
        } else {
            format!("${{{var}:?set {var} in the environment or in .env beside the compose file}}")
        }
    };

    let mut services = BTreeMap::new();
    let mut previous: Option<String> = None;
    for step in &plan.init {
        let name = format!("{}-{}", plan.name, step.name);
        let mut environment = cache_env.clone();
        environment.insert(pod::HF_TOKEN.into(), secret(pod::HF_TOKEN, true));
        services.insert(
            name.clone(),
            Service {
                image: deploy.sous_image.clone(),
                entrypoint: step.argv.iter().take(1).map(|a| escape(a)).collect(),
                command: step.argv.iter().skip(1).map(|a| escape(a)).collect(),
                environment,
                volumes: volumes.clone(),
                depends_on: completed(previous.as_deref()),
                ..Default::default()
            },
        );
        previous = Some(name);
    }

    let mut environment = cache_env;
    for (name, value) in &plan.engine.env {
        let value = match value {
            Arg::Lit(v) => escape(v),
            Arg::FromEnv(var) => secret(var, false),
        };
        environment.insert(name.clone(), value);
    }
    for (var, optional) in plan.secret_vars() {
        environment
            .entry(var.clone())
            .or_insert_with(|| secret(&var, optional));
    }
    let mut command = pod::argv_with(&plan.engine.argv, escape, |var| secret(var, false));
    let entrypoint: Vec<String> = command.drain(..1.min(command.len())).collect();
    let port = plan.port();
    let url = format!("http://127.0.0.1:{port}{}", plan.health_path());
    let timeout = plan.health_timeout().as_secs();
    let test = match plan.recipe.engine.kind {
        // The sous image carries curl for this.
        EngineKind::Native => vec!["CMD".into(), "curl".into(), "-fsS".into(), url],
        // Every engine image has Python; not every one has curl.
        _ => vec![
            "CMD".into(),
            "python3".into(),
            "-c".into(),
            format!("import urllib.request; urllib.request.urlopen('{url}', timeout={timeout})"),
        ],
    };
    // With a router, it takes the recipe's port and the replicas the ports after it.
    let routed = deploy.router.is_some();
    let first_port = u32::from(port) + u32::from(routed);
    let mut instances = Vec::new();
    for replica in 0..deploy.replicas {
        let name = if deploy.replicas == 1 {
            plan.name.clone()
        } else {
            format!("{}-{replica}", plan.name)
        };
        instances.push(name.clone());
        let host_port = first_port + replica;
        if host_port > u32::from(u16::MAX) {
            return Err(DeployError::Ports {
                port,
                replicas: deploy.replicas,
            });
        }
        let gpus: Vec<String> = (replica * plan.gpus..(replica + 1) * plan.gpus)
            .map(|g| g.to_string())
            .collect();
        services.insert(
            name,
            Service {
                image: plan.image.clone(),
                labels: BTreeMap::from([(HASH_LABEL.to_owned(), plan.hash.clone())]),
                entrypoint: entrypoint.clone(),
                command: command.clone(),
                environment: environment.clone(),
                volumes: volumes.clone(),
                ports: vec![format!("{host_port}:{port}")],
                depends_on: completed(previous.as_deref()),
                shm_size: Some(deploy.shm_size.value as u64),
                mem_limit: deploy.memory_limit.as_ref().map(|q| q.value as u64),
                mem_reservation: deploy.memory_request.as_ref().map(|q| q.value as u64),
                healthcheck: Some(Healthcheck {
                    test: test.clone(),
                    interval: "10s".into(),
                    timeout: format!("{timeout}s"),
                    retries: 3,
                    start_period: format!("{}s", plan.recipe.server.startup_timeout.as_secs()),
                }),
                stop_grace_period: Some(format!("{}s", plan.termination_grace())),
                restart: Some("unless-stopped"),
                deploy: (plan.gpus > 0).then(|| DeploySpec {
                    resources: Resources {
                        reservations: Reservations {
                            devices: vec![Device {
                                driver: "nvidia",
                                device_ids: gpus,
                                capabilities: vec!["gpu"],
                            }],
                        },
                    },
                }),
            },
        );
    }
    if deploy.replicas > 1 && plan.gpus > 0 {
        warnings.push(format!(
            "compose gives each of the {} replicas {} GPU(s) of its own, in order from GPU 0, and host port {first_port}, {first_port}+1, ...: this machine needs {} GPUs",
            deploy.replicas,
            plan.gpus,
            plan.gpus * deploy.replicas
        ));
    }
    if routed {
        // The replicas by their service names on the compose network.
        let workers = Workers::Urls(instances.iter().map(|n| format!("http://{n}:{port}")).collect());
        let args = router::args(&plan.recipe, "0.0.0.0", &workers);
        let mut environment = BTreeMap::new();
        for arg in &args {
            if let Arg::FromEnv(var) = arg {
                environment.insert(var.clone(), secret(var, false));
            }
        }
        services.insert(
            format!("{}-router", plan.name),
            Service {
                image: deploy.router.image.clone(),
                entrypoint: router::program(deploy.router.kind),
                command: pod::argv_with(&args, escape, |var| secret(var, false)),
                environment,
                ports: vec![format!("{port}:{port}")],
                depends_on: instances
                    .iter()
                    .map(|n| {
                        (
                            n.clone(),
                            Dependency {
                                condition: "service_started",
                            },
                        )
                    })
                    .collect(),
                restart: Some("unless-stopped"),
                ..Default::default()
            },
        );
    }

    let compose = Compose {
        services,
        volumes: BTreeMap::from([(volume.clone(), Volume { name: volume })]),
    };
    let yaml = super::yaml::to_string(&compose).map_err(|message| DeployError::Serialize {
        what: COMPOSE_FILE.into(),
        message,
    })?;
    let mut files = vec![File {
        name: COMPOSE_FILE.into(),
        contents: format!(
            "# Rendered by sous {} from the recipe `{}`. Edit the recipe and render again\n# (`sous deploy render --target compose --out DIR`); changes made here are overwritten.\n{yaml}",
            env!("CARGO_PKG_VERSION"),
            plan.recipe.name
        ),
    }];
    files.extend(plan.config.iter().map(|(name, contents)| File {
        name: name.clone(),
        contents: contents.clone(),
    }));
    Ok(files)
}

fn completed(service: Option<&str>) -> BTreeMap<String, Dependency> {
    service
        .map(|s| {
            BTreeMap::from([(
                s.to_owned(),
                Dependency {
                    condition: "service_completed_successfully",
                },
            )])
        })
        .unwrap_or_default()
}

/// A literal for compose, which interpolates `$`.
fn escape(text: &str) -> String {
    pod::escape_dollars(text)
}
