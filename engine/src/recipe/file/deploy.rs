//! `[deploy]` of the raw recipe: what `sous deploy render` needs beyond the recipe to
//! run it on Kubernetes, with compose or under systemd (storage, the router, the
//! startup probe, tolerations). As the rest of `file`, only what the TOML may say; the
//! doc comments are the user documentation.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::is_default;

/// `[deploy]`: what `sous deploy render` needs beyond the recipe to run it on
/// Kubernetes, with compose or under systemd. Sizes and memory are Kubernetes
/// quantities (`120Gi`, `64Gi`, `500M`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeploySection {
    /// Name of the Kubernetes objects, compose service and systemd unit. Default: the
    /// recipe's name with `.` and `_` turned into `-` (a DNS-1123 label).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,

    /// Kubernetes namespace of every object. Unset: none is written, and the namespace
    /// comes from `kubectl apply -n`, the kustomization or the GitOps tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,

    /// Identical instances behind one Service (compose: one service per instance,
    /// each with its own GPUs and port). Default: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,

    /// GPUs one node offers. A recipe whose parallelism (tensor × pipeline × data)
    /// needs more is deployed across nodes as a LeaderWorkerSet. Unset: one node
    /// holds the whole instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<u32>,

    /// The sous image the init containers run `sous pull` and `sous quantize` in (and
    /// the native engine's container). Default: `sous:VERSION`, the tag the
    /// repository's `Dockerfile` is built with in the README.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sous_image: Option<String>,

    /// `runtimeClassName` of the pods, e.g. `nvidia` on K3s, where GPU pods need it
    /// unless the node's default runtime was changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class: Option<String>,

    /// Node labels the pods must run on (`nodeSelector`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,

    /// Taints the pods tolerate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<TolerationSection>,

    /// Memory the engine container requests (scheduling), e.g. `64Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_request: Option<String>,

    /// Memory limit of the engine container, e.g. `120Gi`. On unified-memory machines
    /// (DGX Spark, GB10) CUDA allocations may not be counted against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<String>,

    /// Name of the engine's container in the pod (what `kubectl logs -c` takes).
    /// Default: `engine`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_name: Option<String>,

    /// The engine container's start-up probe. Default: every `10s`, as many failures as
    /// cover `server.startup_timeout`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub startup_probe: StartupProbeSection,

    /// Size of the in-memory `/dev/shm` the engine gets (NCCL, tensor parallelism).
    /// Default: `2Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_size: Option<String>,

    /// How long the first start may take to download (and quantize) the model, on top
    /// of `server.startup_timeout`: sets the rollout's `progressDeadlineSeconds`. `30m`,
    /// `2h`. Default: `1h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download_timeout: Option<String>,

    /// Also render a Prometheus Operator `ServiceMonitor` that scrapes `/metrics`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_monitor: Option<bool>,

    /// What sits in front of the replicas: a prefix-cache-aware router, or nothing.
    #[serde(default, skip_serializing_if = "is_default")]
    pub router: RouterSection,

    /// The volume the model, the Hugging Face cache, the quantized checkpoint and the
    /// engine's compile cache live on.
    #[serde(default, skip_serializing_if = "is_default")]
    pub storage: StorageSection,

    /// An existing claim that already holds a `model.path` model without `model.repo`,
    /// mounted read-only at `model.path` (sous cannot fill a volume it has no source
    /// for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_claim: Option<String>,

    /// The Kubernetes Secret the pods read `HF_TOKEN` (optional) and the API key of
    /// `server.api_key_env` from, each under its variable's name as the key. No secret
    /// value is ever written into a rendering. Default: `<deploy.name>-secrets`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,

    /// Extra labels on every object and pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,

    /// Extra annotations on every object and pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// `[deploy.storage]`: the model cache volume.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StorageSection {
    /// Size of the claim sous creates, e.g. `100Gi`. Default: the model's files on
    /// disk or on the Hub (twice that with `[quantize]`), plus a quarter for the
    /// engine's caches, rounded up to a GiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,

    /// Storage class of the claim. Unset: the cluster's default (`local-path` on K3s,
    /// which deletes the data with the claim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,

    /// Use this existing claim instead of creating one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub existing_claim: Option<String>,

    /// Access mode of the claim sous creates: `ReadWriteOnce` (default: every replica
    /// on one node) or `ReadWriteMany` (replicas on several nodes share it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_mode: Option<AccessMode>,
}

/// `[deploy.router]`: the router in front of the replicas. sous renders an existing
/// router (vllm-project/router's `vllm-router`, sgl-project's `sglang-router`, both on
/// PyPI); it never routes itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RouterSection {
    /// `vllm-router`, `sglang-router` or `none` (one Service, which balances by
    /// connection). Default: `none` for one replica; for more, the engine's own router
    /// (`sglang-router` for SGLang, `vllm-router` otherwise), because behind a plain
    /// Service a conversation's next turn lands on another replica, whose prefix cache
    /// has never seen it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<RouterKind>,

    /// How a request picks its replica. Default: `cache_aware` (the replica whose
    /// recent prompts share the longest prefix with it, unless the load is uneven).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<RouterPolicy>,

    /// The router's release, as on PyPI. Default: `0.1.17` (`vllm-router`), `0.3.2`
    /// (`sglang-router`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,

    /// The image the router runs in (Kubernetes, compose). Default:
    /// `vllm-router:VERSION` or `sglang-router:VERSION`, built from the repository's
    /// `docker/router.Dockerfile`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,

    /// `cache_aware`: the share of a prompt (0..1) that must match a replica's cache
    /// for it to win. Unset: the router's default (0.3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_threshold: Option<f64>,

    /// `cache_aware`: requests of difference between the busiest and the idlest replica
    /// above which load wins over cache. Unset: the router's default (64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance_abs_threshold: Option<u32>,

    /// `cache_aware`: ratio of the busiest to the idlest replica's load above which load
    /// wins over cache (with `balance_abs_threshold`). Unset: the router's default (1.5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance_rel_threshold: Option<f64>,
}

/// The routers sous renders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RouterKind {
    /// No router: the replicas behind one Service.
    None,
    /// vLLM's router (vllm-project/router, `vllm-router` on PyPI).
    VllmRouter,
    /// SGLang's router (sgl-project/sglang `sgl-router`, `sglang-router` on PyPI).
    SglangRouter,
}

impl RouterKind {
    /// The spelling in recipes, and the PyPI package.
    pub fn as_str(self) -> &'static str {
        match self {
            RouterKind::None => "none",
            RouterKind::VllmRouter => "vllm-router",
            RouterKind::SglangRouter => "sglang-router",
        }
    }
}

/// Routing policies, as both routers spell them (`--policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RouterPolicy {
    /// The replica with the longest shared prefix, unless the load is uneven.
    CacheAware,
    /// A hash of the session (vllm-router only).
    ConsistentHash,
    /// Each replica in turn.
    RoundRobin,
    /// The less loaded of two replicas drawn at random.
    PowerOfTwo,
    /// A replica drawn at random.
    Random,
}

impl RouterPolicy {
    /// The spelling on the routers' command lines.
    pub fn as_str(self) -> &'static str {
        match self {
            RouterPolicy::CacheAware => "cache_aware",
            RouterPolicy::ConsistentHash => "consistent_hash",
            RouterPolicy::RoundRobin => "round_robin",
            RouterPolicy::PowerOfTwo => "power_of_two",
            RouterPolicy::Random => "random",
        }
    }
}

/// `[deploy.startup_probe]`: how Kubernetes waits for a loading engine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartupProbeSection {
    /// Time between probes: `10s`, `20s`. Default: `10s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<String>,

    /// Failed probes before the pod is restarted. Default: as many as cover
    /// `server.startup_timeout` (180 for the default 30 minutes at `10s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<u32>,
}

/// Access modes of a volume claim, as Kubernetes spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum AccessMode {
    /// Mounted read-write by the pods of one node.
    ReadWriteOnce,
    /// Mounted read-write by pods on many nodes.
    ReadWriteMany,
}

impl AccessMode {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            AccessMode::ReadWriteOnce => "ReadWriteOnce",
            AccessMode::ReadWriteMany => "ReadWriteMany",
        }
    }
}

/// A Kubernetes toleration: `{ key = "nvidia.com/gpu", operator = "Exists", effect =
/// "NoSchedule" }`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TolerationSection {
    /// The taint's key; unset with `operator = "Exists"` tolerates every taint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `Equal` (default) or `Exists`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
    /// The taint's value, with `Equal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`; unset: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<String>,
}
