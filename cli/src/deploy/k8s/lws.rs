//! One instance across nodes: a LeaderWorkerSet (`leaderworkerset.x-k8s.io/v1`,
//! kubernetes-sigs/lws `api/leaderworkerset/v1/leaderworkerset_types.go`), one group
//! of `nodes` pods per replica, recreated together when one of them restarts, rolled
//! one group at a time without a surge. The engine's own multi-node launch joins the
//! pods, from the addresses LWS gives every pod (`LWS_LEADER_ADDRESS`,
//! `LWS_GROUP_SIZE`, `LWS_WORKER_INDEX`):
//!
//! - vLLM over Ray, as vLLM's LWS guide does (`docs/deployment/frameworks/lws.md`,
//!   with the `examples/online_serving/multi-node-serving.sh` its image ships);
//! - SGLang with `--dist-init-addr`, `--nnodes` and `--node-rank`
//!   (`python/sglang/srt/server_args.py`).
//!
//! TensorRT-LLM (launched by MPI) and the native engine have no such launch here.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use sous_engine::recipe::EngineKind;

use super::Names;
use super::workload::{pod_parts, pod_spec, workload_meta};
use crate::deploy::DeployError;
use crate::deploy::pod::{self, Plan};

/// The label that tells the leader pod (which serves HTTP) from the workers.
pub const ROLE_LABEL: &str = "sous.dev/role";
/// vLLM's helper that starts and joins the Ray cluster, in the vllm-openai image.
const VLLM_RAY_SCRIPT: &str = "/vllm-workspace/examples/online_serving/multi-node-serving.sh";
/// The port SGLang's processes meet on, at the leader.
const SGLANG_DIST_PORT: u16 = 20000;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct LeaderWorkerSet {
    api_version: &'static str,
    kind: &'static str,
    metadata: ObjectMeta,
    spec: Spec,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    replicas: u32,
    leader_worker_template: Template,
    rollout_strategy: RolloutStrategy,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Template {
    size: u32,
    restart_policy: &'static str,
    leader_template: PodTemplateSpec,
    worker_template: PodTemplateSpec,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RolloutStrategy {
    #[serde(rename = "type")]
    type_: &'static str,
    rolling_update_configuration: RollingUpdate,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RollingUpdate {
    max_unavailable: u32,
    max_surge: u32,
}

/// The LeaderWorkerSet of an instance of `nodes` pods with `per_node` GPUs each.
pub(super) fn leader_worker_set(
    plan: &Plan,
    names: &Names,
    nodes: u32,
    per_node: u32,
) -> Result<LeaderWorkerSet, DeployError> {
    let kind = plan.recipe.engine.kind;
    let argv = pod::argv_with(&plan.engine.argv, pod::escape_dollars, |var| format!("$({var})"));
    let (leader, worker) = match kind {
        EngineKind::Vllm => {
            let mut serve = argv;
            serve.extend(["--distributed-executor-backend".into(), "ray".into()]);
            (
                shell(&format!(
                    "bash {VLLM_RAY_SCRIPT} leader --ray_cluster_size=$(LWS_GROUP_SIZE); exec {}",
                    quote(&serve)
                )),
                shell(&format!(
                    "bash {VLLM_RAY_SCRIPT} worker --ray_address=$(LWS_LEADER_ADDRESS)"
                )),
            )
        }
        EngineKind::Sglang => {
            let mut serve = argv;
            serve.extend([
                "--dist-init-addr".into(),
                format!("$(LWS_LEADER_ADDRESS):{SGLANG_DIST_PORT}"),
                "--nnodes".into(),
                "$(LWS_GROUP_SIZE)".into(),
                "--node-rank".into(),
                "$(LWS_WORKER_INDEX)".into(),
            ]);
            (serve.clone(), serve)
        }
        EngineKind::Trtllm | EngineKind::Native => {
            return Err(DeployError::MultiNode {
                engine: kind.display_name(),
                nodes,
            });
        }
    };
    let template = |role: &str, command: Vec<String>, serves: bool| {
        let mut parts = pod_parts(plan, names, per_node);
        parts.engine.command = Some(command);
        if !serves {
            // Workers answer no HTTP: nothing to probe, nothing to route to.
            parts.engine.startup_probe = None;
            parts.engine.readiness_probe = None;
            parts.engine.liveness_probe = None;
            parts.engine.lifecycle = None;
            parts.engine.ports = None;
            // Workers keep the init containers: they load the model too, and wait on
            // the pull's locks while the leader's init container downloads it.
        }
        let mut labels = names.pod_labels.clone();
        labels.insert(ROLE_LABEL.into(), role.into());
        PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(labels),
                annotations: Some(names.pod_annotations.clone()),
                ..Default::default()
            }),
            spec: Some(pod_spec(plan, parts)),
        }
    };
    Ok(LeaderWorkerSet {
        api_version: "leaderworkerset.x-k8s.io/v1",
        kind: "LeaderWorkerSet",
        metadata: workload_meta(plan, names),
        spec: Spec {
            replicas: plan.recipe.deploy.replicas,
            leader_worker_template: Template {
                size: nodes,
                restart_policy: "RecreateGroupOnPodRestart",
                leader_template: template("leader", leader, true),
                worker_template: template("worker", worker, false),
            },
            rollout_strategy: RolloutStrategy {
                type_: "RollingUpdate",
                rolling_update_configuration: RollingUpdate {
                    max_unavailable: 1,
                    max_surge: 0,
                },
            },
        },
    })
}

fn shell(script: &str) -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into(), script.to_owned()]
}

/// The arguments as one shell command line (`$(VAR)` references are expanded by
/// Kubernetes before the shell runs, so they are left unquoted-safe inside quotes).
fn quote(argv: &[String]) -> String {
    shlex::try_join(argv.iter().map(String::as_str)).unwrap_or_else(|_| argv.join(" "))
}
