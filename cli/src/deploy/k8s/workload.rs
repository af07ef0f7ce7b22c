//! The pod that runs a [`Plan`]: init containers that fill the volume (`sous pull`,
//! `sous quantize`, each a no-op once done), the engine container with the exact
//! command line `sous serve --dry-run` renders, probes whose budget covers
//! `server.startup_timeout`, `/dev/shm` in memory, caches on the volume, secrets only
//! by reference; and the Deployment around it, whose strategy never deadlocks on a
//! node with no GPU to spare.
//!
//! What the fields mean and why: vLLM's `docs/deployment/k8s.md` (probes, `/dev/shm`),
//! vLLM PR 19377 and KServe 5062 (start-up probes that killed long loads),
//! NVIDIA NIM Operator (`maxSurge: 0` for GPU rollouts).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, Lifecycle, LifecycleHandler, PersistentVolumeClaimVolumeSource, PodSecurityContext,
    PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SecretKeySelector, SleepAction, Toleration,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sous_engine::launch::Arg;
use sous_engine::recipe::Deploy;

use super::{Names, PORT_NAME};
use crate::deploy::pod::{self, CONFIG_DIR, DATA_DIR, ModelMount, PRE_STOP_SECONDS, Plan};

/// The group the sous image's user belongs to; the pod's volumes are made writable
/// for it.
pub const SOUS_GID: i64 = 10001;
/// The GPU resource of NVIDIA's device plugin.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// The engine container and the init containers, and the pod's volumes.
pub(super) struct PodParts {
    pub init: Vec<Container>,
    pub engine: Container,
    pub volumes: Vec<Volume>,
}

/// Builds the containers and volumes of one pod; `gpus` is what this pod requests.
pub(super) fn pod_parts(plan: &Plan, names: &Names, gpus: u32) -> PodParts {
    let deploy = &plan.recipe.deploy;
    let mut mounts = vec![
        mount("data", DATA_DIR, false, None),
        mount("config", CONFIG_DIR, true, None),
    ];
    let mut volumes = vec![
        Volume {
            name: "data".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: names.claim.clone(),
                read_only: None,
            }),
            ..Default::default()
        },
        Volume {
            name: "config".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: names.config_map.clone(),
                ..Default::default()
            }),
            ..Default::default()
        },
    ];
    match &plan.model_mount {
        // A Kubernetes plan never binds the node's directories.
        ModelMount::InData | ModelMount::Host { .. } => {}
        ModelMount::DataSubPath { mount_path, sub_path } => {
            mounts.push(mount("data", mount_path, false, Some(sub_path)));
        }
        ModelMount::Claim { claim, mount_path } => {
            mounts.push(mount("model", mount_path, true, None));
            volumes.push(Volume {
                name: "model".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.clone(),
                    read_only: Some(true),
                }),
                ..Default::default()
            });
        }
    }

    let secret = |var: &str, optional: bool| EnvVar {
        name: var.to_owned(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: deploy.secret.clone(),
                key: var.to_owned(),
                optional: Some(optional),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    // Kubernetes expands `$(NAME)` in values and commands: literals double their `$`.
    let literal = |name: &str, value: &str| EnvVar {
        name: name.to_owned(),
        value: Some(pod::escape_dollars(value)),
        ..Default::default()
    };
    let cache_env: Vec<EnvVar> = plan.cache_env.iter().map(|(k, v)| literal(k, v)).collect();
    let init_env = {
        let mut env = cache_env.clone();
        env.push(secret(pod::HF_TOKEN, true));
        env
    };
    let init = plan
        .init
        .iter()
        .map(|step| Container {
            name: step.name.to_owned(),
            image: Some(deploy.sous_image.clone()),
            image_pull_policy: Some("IfNotPresent".into()),
            command: Some(step.argv.iter().map(|a| pod::escape_dollars(a)).collect()),
            env: Some(init_env.clone()),
            volume_mounts: Some(mounts.clone()),
            ..Default::default()
        })
        .collect();

    // The engine's environment: the caches, then the adapter's variables (a secret
    // by reference), then every secret variable the command line refers to.
    let mut env: BTreeMap<String, EnvVar> = plan
        .cache_env
        .iter()
        .map(|(k, v)| (k.clone(), literal(k, v)))
        .collect();
    for (name, value) in &plan.engine.env {
        let var = match value {
            Arg::Lit(v) => literal(name, v),
            Arg::FromEnv(from) => EnvVar {
                name: name.clone(),
                ..secret(from, false)
            },
        };
        env.insert(name.clone(), var);
    }
    for (var, optional) in plan.secret_vars() {
        env.entry(var.clone()).or_insert_with(|| secret(&var, optional));
    }
    // Kubernetes expands `$(NAME)` in a command from the container's environment.
    let command = pod::argv_with(&plan.engine.argv, pod::escape_dollars, |var| format!("$({var})"));

    let mut limits = BTreeMap::new();
    let mut requests = BTreeMap::new();
    if gpus > 0 {
        limits.insert(GPU_RESOURCE.to_owned(), Quantity(gpus.to_string()));
        requests.insert(GPU_RESOURCE.to_owned(), Quantity(gpus.to_string()));
    }
    if let Some(q) = &deploy.memory_limit {
        limits.insert("memory".into(), Quantity(q.text.clone()));
    }
    if let Some(q) = &deploy.memory_request {
        requests.insert("memory".into(), Quantity(q.text.clone()));
    }
    let health = |period: u64, failures: u64| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(plan.health_path().to_owned()),
            port: IntOrString::String(PORT_NAME.into()),
            ..Default::default()
        }),
        period_seconds: Some(period as i32),
        failure_threshold: Some(failures.min(i32::MAX as u64) as i32),
        timeout_seconds: Some(plan.health_timeout().as_secs() as i32),
        ..Default::default()
    };
    let mut engine_mounts = mounts;
    engine_mounts.push(mount("shm", "/dev/shm", false, None));
    volumes.push(Volume {
        name: "shm".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: Some(Quantity(deploy.shm_size.text.clone())),
        }),
        ..Default::default()
    });
    let engine = Container {
        name: deploy.container_name.clone(),
        image: Some(plan.image.clone()),
        command: Some(command),
        env: Some(env.into_values().collect()),
        ports: Some(vec![ContainerPort {
            name: Some(PORT_NAME.into()),
            container_port: i32::from(plan.port()),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        resources: (!limits.is_empty() || !requests.is_empty()).then(|| ResourceRequirements {
            limits: (!limits.is_empty()).then_some(limits),
            requests: (!requests.is_empty()).then_some(requests),
            ..Default::default()
        }),
        // The recipe's threshold, or sized from the starts `sous serve` recorded, or
        // covering `server.startup_timeout` (`Plan::startup_failure_threshold`).
        startup_probe: Some(health(plan.startup_period(), plan.startup_failure_threshold())),
        readiness_probe: Some(health(10, 3)),
        liveness_probe: Some(health(30, 3)),
        lifecycle: Some(Lifecycle {
            // Out of the Service's endpoints before SIGTERM, so no request lands on an
            // engine that is stopping.
            pre_stop: Some(LifecycleHandler {
                sleep: Some(SleepAction {
                    seconds: PRE_STOP_SECONDS as i64,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        volume_mounts: Some(engine_mounts),
        ..Default::default()
    };
    PodParts {
        init,
        engine,
        volumes,
    }
}

/// The pod's spec around its containers.
pub(super) fn pod_spec(plan: &Plan, parts: PodParts) -> PodSpec {
    let deploy: &Deploy = &plan.recipe.deploy;
    PodSpec {
        init_containers: (!parts.init.is_empty()).then_some(parts.init),
        containers: vec![parts.engine],
        volumes: Some(parts.volumes),
        runtime_class_name: deploy.runtime_class.clone(),
        node_selector: (!deploy.node_selector.is_empty()).then(|| deploy.node_selector.clone()),
        tolerations: (!deploy.tolerations.is_empty()).then(|| {
            deploy
                .tolerations
                .iter()
                .map(|t| Toleration {
                    key: t.key.clone(),
                    operator: t.operator.clone(),
                    value: t.value.clone(),
                    effect: t.effect.clone(),
                    ..Default::default()
                })
                .collect()
        }),
        termination_grace_period_seconds: Some(plan.termination_grace() as i64),
        security_context: Some(PodSecurityContext {
            fs_group: Some(SOUS_GID),
            fs_group_change_policy: Some("OnRootMismatch".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn mount(volume: &str, path: &str, read_only: bool, sub_path: Option<&str>) -> VolumeMount {
    VolumeMount {
        name: volume.to_owned(),
        mount_path: path.to_owned(),
        read_only: read_only.then_some(true),
        sub_path: sub_path.map(str::to_owned),
        ..Default::default()
    }
}

/// The Deployment of a single-node instance.
pub(super) fn deployment(plan: &Plan, names: &Names) -> Deployment {
    let deploy = &plan.recipe.deploy;
    let parts = pod_parts(plan, names, plan.gpus);
    // One instance that holds every GPU it can get: a surge pod would wait for a GPU
    // that only the old pod can free, forever. Recreate stops the old one first.
    // Several instances: replace them one at a time, never adding one.
    let strategy = if deploy.replicas == 1 && plan.gpus > 0 {
        DeploymentStrategy {
            type_: Some("Recreate".into()),
            rolling_update: None,
        }
    } else {
        DeploymentStrategy {
            type_: Some("RollingUpdate".into()),
            rolling_update: Some(RollingUpdateDeployment {
                max_surge: Some(IntOrString::Int(0)),
                max_unavailable: Some(IntOrString::Int(1)),
            }),
        }
    };
    Deployment {
        metadata: workload_meta(plan, names),
        spec: Some(DeploymentSpec {
            replicas: Some(deploy.replicas as i32),
            selector: LabelSelector {
                match_labels: Some(names.selector.clone()),
                ..Default::default()
            },
            strategy: Some(strategy),
            progress_deadline_seconds: Some(plan.progress_deadline().min(i32::MAX as u64) as i32),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(names.pod_labels.clone()),
                    annotations: Some(names.pod_annotations.clone()),
                    ..Default::default()
                }),
                spec: Some(pod_spec(plan, parts)),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The workload's metadata: the shared one, where the start-up probe's budget comes
/// from ([`pod::STARTUP_ANNOTATION`]), and where the recipe has an OOM fallback, the one
/// line that applies it ([`pod::OOM_ANNOTATION`]).
pub(super) fn workload_meta(plan: &Plan, names: &Names) -> ObjectMeta {
    let mut meta = names.meta(&plan.name);
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    if let Some(note) = plan.oom_fallback_note() {
        annotations.insert(pod::OOM_ANNOTATION.into(), note);
    }
    annotations.insert(pod::STARTUP_ANNOTATION.into(), plan.startup_note());
    meta
}
