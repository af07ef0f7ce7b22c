//! Kubernetes: the [`Plan`] as typed objects (`k8s-openapi`, Kubernetes 1.33 and
//! later), serialized to YAML in a fixed order: the model volume's claim, the recipe's
//! ConfigMap (its name carries the content hash, so a changed recipe rolls the pods
//! and an unchanged one changes nothing), the workload (a Deployment, or a
//! LeaderWorkerSet when one instance spans nodes), the Service, an opt-in
//! ServiceMonitor, and a `kustomization.yaml` listing them for Flux, Argo CD and
//! `kubectl apply -k`.

mod lws;
mod router;
mod workload;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, PersistentVolumeClaimSpec, Service, ServicePort, ServiceSpec,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;
use sous_engine::dialect::Family;
use sous_engine::recipe::{AccessMode, EngineKind, Quantity as RecipeQuantity};

use super::pod::Plan;
use super::{DeployError, File, Options};

/// The kustomization's file name.
pub const KUSTOMIZATION: &str = "kustomization.yaml";
/// The engine container's port name, which probes, the Service and the monitor use.
pub const PORT_NAME: &str = "http";
/// The pod-template annotation carrying the recipe's content hash.
pub const HASH_ANNOTATION: &str = "sous.dev/recipe-hash";
/// Keeps the model volume when Flux prunes (a pruned `local-path` claim deletes the
/// model): Flux's `kustomize.toolkit.fluxcd.io/prune`, Argo CD's sync option.
const NO_PRUNE: [(&str, &str); 2] = [
    ("kustomize.toolkit.fluxcd.io/prune", "disabled"),
    ("argocd.argoproj.io/sync-options", "Prune=false"),
];

/// Names and labels every object shares.
pub(super) struct Names {
    /// Namespace, if fixed.
    pub namespace: Option<String>,
    /// The model volume's claim.
    pub claim: String,
    /// The recipe's ConfigMap.
    pub config_map: String,
    /// Labels of every object.
    pub labels: BTreeMap<String, String>,
    /// The selector of the pods.
    pub selector: BTreeMap<String, String>,
    /// Labels of the pods.
    pub pod_labels: BTreeMap<String, String>,
    /// Annotations of every object.
    pub annotations: BTreeMap<String, String>,
    /// Annotations of the pods: the content hash too.
    pub pod_annotations: BTreeMap<String, String>,
}

impl Names {
    fn new(plan: &Plan) -> Names {
        let deploy = &plan.recipe.deploy;
        let selector = BTreeMap::from([("app.kubernetes.io/name".to_owned(), plan.name.clone())]);
        let mut labels = selector.clone();
        labels.insert("app.kubernetes.io/managed-by".into(), "sous".into());
        labels.insert("sous.dev/engine".into(), plan.recipe.engine.kind.as_str().into());
        labels.extend(deploy.labels.clone());
        let mut pod_annotations = deploy.annotations.clone();
        pod_annotations.insert(HASH_ANNOTATION.into(), plan.hash.clone());
        Names {
            namespace: deploy.namespace.clone(),
            claim: deploy
                .storage
                .existing_claim
                .clone()
                .unwrap_or_else(|| format!("{}-models", plan.name)),
            config_map: format!("{}-recipe-{}", plan.name, plan.hash),
            pod_labels: labels.clone(),
            labels,
            selector,
            annotations: deploy.annotations.clone(),
            pod_annotations,
        }
    }

    /// Metadata of an object named `name`.
    pub fn meta(&self, name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_owned()),
            namespace: self.namespace.clone(),
            labels: Some(self.labels.clone()),
            annotations: (!self.annotations.is_empty()).then(|| self.annotations.clone()),
            ..Default::default()
        }
    }
}

/// The files of a Kubernetes rendering.
pub(super) fn render(
    plan: &Plan,
    options: &Options,
    warnings: &mut Vec<String>,
) -> Result<Vec<File>, DeployError> {
    let names = Names::new(plan);
    let deploy = &plan.recipe.deploy;
    let mut files = Vec::new();

    if deploy.storage.existing_claim.is_none() {
        let size = match &deploy.storage.size {
            Some(q) => q.clone(),
            None => volume_size(plan, options.model_bytes.ok_or(DeployError::NoStorageSize)?),
        };
        files.push(yaml(plan, "pvc.yaml", &claim(plan, &names, &size))?);
        match deploy.storage.class.as_deref() {
            None | Some("local-path") => warnings.push(format!(
                "the claim `{}` uses {}: on K3s `local-path` deletes the model with the claim; it carries Flux's and Argo CD's no-prune annotations, so never delete or rename it by hand",
                names.claim,
                deploy
                    .storage
                    .class
                    .as_deref()
                    .map_or("the cluster's default storage class".to_owned(), |c| format!("`{c}`"))
            )),
            Some(_) => {}
        }
    }
    files.push(yaml(plan, "configmap.yaml", &config_map(plan, &names))?);

    let per_node = deploy.gpus_per_node.unwrap_or(u32::MAX);
    let mut service_selector = names.selector.clone();
    if plan.gpus > per_node {
        if !plan.gpus.is_multiple_of(per_node) {
            return Err(DeployError::GpusAcrossNodes {
                gpus: plan.gpus,
                per_node,
            });
        }
        let nodes = plan.gpus / per_node;
        // Every pod of the group loads the model from the volume.
        if deploy.storage.existing_claim.is_none() && deploy.storage.access_mode == AccessMode::ReadWriteOnce
        {
            return Err(DeployError::MultiNodeClaim { nodes });
        }
        // Only the leader serves HTTP.
        service_selector.insert(lws::ROLE_LABEL.into(), "leader".into());
        files.push(yaml(
            plan,
            "leaderworkerset.yaml",
            &lws::leader_worker_set(plan, &names, nodes, per_node)?,
        )?);
    } else {
        files.push(yaml(
            plan,
            "deployment.yaml",
            &workload::deployment(plan, &names),
        )?);
    }
    if deploy.router.is_some() {
        // Clients call the router under the recipe's name; the engines' Service stays
        // for scraping and for calling one replica.
        let r = router::objects(plan, &names, &service_selector);
        let engine_service = service(
            plan,
            names.meta(&format!("{}-engine", plan.name)),
            service_selector,
        );
        files.push(yaml(plan, "service.yaml", &engine_service)?);
        files.push(yaml(plan, "router-serviceaccount.yaml", &r.service_account)?);
        files.push(yaml(plan, "router-role.yaml", &r.role)?);
        files.push(yaml(plan, "router-rolebinding.yaml", &r.role_binding)?);
        files.push(yaml(plan, "router-deployment.yaml", &r.deployment)?);
        files.push(yaml(plan, "router-service.yaml", &r.service)?);
    } else {
        files.push(yaml(
            plan,
            "service.yaml",
            &service(plan, names.meta(&plan.name), service_selector),
        )?);
    }
    if deploy.service_monitor {
        files.push(yaml(plan, "servicemonitor.yaml", &service_monitor(plan, &names))?);
    }

    if plan.gpus > 0 && deploy.memory_limit.is_some() {
        warnings.push(
            "on unified-memory nodes (DGX Spark / GB10, GH200) CUDA allocations may not count against the pod's memory limit (vLLM issue 56824): there `deploy.memory_limit` does not protect the node; `memory.gpu_utilization` does".into(),
        );
    }
    if deploy.replicas > 1
        && deploy.storage.access_mode == AccessMode::ReadWriteOnce
        && deploy.storage.existing_claim.is_none()
    {
        warnings.push(format!(
            "{} replicas share a ReadWriteOnce claim: they all run on the node that mounts it; set `deploy.storage.access_mode = \"ReadWriteMany\"` to spread them",
            deploy.replicas
        ));
    }

    let resources: Vec<String> = files.iter().map(|f| f.name.clone()).collect();
    files.push(File {
        name: KUSTOMIZATION.into(),
        contents: format!(
            "{}# Flux: set the Kustomization's `spec.timeout` above {} (download, then start-up);\n# its default is its interval, and a slow first start then reports as failed.\n{}",
            header(plan),
            humantime::format_duration(std::time::Duration::from_secs(plan.progress_deadline())),
            to_yaml(
                "kustomization",
                &Kustomization {
                    api_version: "kustomize.config.k8s.io/v1beta1",
                    kind: "Kustomization",
                    resources,
                }
            )?
        ),
    });
    Ok(files)
}

/// The claim's size: the model (twice with `[quantize]`, which keeps the source), plus
/// a quarter for the engines' compile caches, in whole GiB.
fn volume_size(plan: &Plan, model_bytes: u64) -> RecipeQuantity {
    let copies = if plan.recipe.quantize.is_some() { 2 } else { 1 };
    let bytes = model_bytes.saturating_mul(copies);
    RecipeQuantity::gibibytes_at_least(bytes.saturating_add(bytes / 4))
}

fn claim(plan: &Plan, names: &Names, size: &RecipeQuantity) -> PersistentVolumeClaim {
    let deploy = &plan.recipe.deploy;
    let mut meta = names.meta(&names.claim);
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    for (k, v) in NO_PRUNE {
        annotations.insert(k.into(), v.into());
    }
    PersistentVolumeClaim {
        metadata: meta,
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec![deploy.storage.access_mode.as_str().into()]),
            storage_class_name: deploy.storage.class.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity(size.text.clone()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn config_map(plan: &Plan, names: &Names) -> ConfigMap {
    ConfigMap {
        metadata: names.meta(&names.config_map),
        data: Some(plan.config.clone()),
        immutable: Some(true),
        ..Default::default()
    }
}

/// A Service named by `metadata` in front of the pods `selector` picks, on the
/// recipe's port.
fn service(plan: &Plan, metadata: ObjectMeta, selector: BTreeMap<String, String>) -> Service {
    Service {
        metadata,
        spec: Some(ServiceSpec {
            selector: Some(selector),
            ports: Some(vec![ServicePort {
                name: Some(PORT_NAME.into()),
                port: i32::from(plan.port()),
                target_port: Some(IntOrString::String(PORT_NAME.into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A Prometheus Operator ServiceMonitor (`monitoring.coreos.com/v1`), which
/// `k8s-openapi` does not type: the fields sous writes, from prometheus-operator's
/// `pkg/apis/monitoring/v1/servicemonitor_types.go`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ServiceMonitor {
    api_version: &'static str,
    kind: &'static str,
    metadata: ObjectMeta,
    spec: ServiceMonitorSpec,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ServiceMonitorSpec {
    selector: LabelSelector,
    endpoints: Vec<MonitorEndpoint>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MonitorEndpoint {
    port: &'static str,
    path: &'static str,
    interval: &'static str,
}

fn service_monitor(plan: &Plan, names: &Names) -> ServiceMonitor {
    ServiceMonitor {
        api_version: "monitoring.coreos.com/v1",
        kind: "ServiceMonitor",
        metadata: names.meta(&plan.name),
        spec: ServiceMonitorSpec {
            selector: LabelSelector {
                match_labels: Some(names.selector.clone()),
                ..Default::default()
            },
            endpoints: vec![MonitorEndpoint {
                port: PORT_NAME,
                path: Family::of_engine(plan.recipe.engine.kind).metrics_path(),
                interval: "15s",
            }],
        },
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Kustomization {
    api_version: &'static str,
    kind: &'static str,
    resources: Vec<String>,
}

/// The comment at the top of every file.
fn header(plan: &Plan) -> String {
    let engine = match plan.recipe.engine.kind {
        EngineKind::Native => "the native engine".to_owned(),
        kind => format!("{} {}", kind.display_name(), plan.engine.version),
    };
    format!(
        "# Rendered by sous {} from the recipe `{}` ({engine}). Edit the recipe and render\n# again (`sous deploy render`); changes made here are overwritten.\n",
        env!("CARGO_PKG_VERSION"),
        plan.recipe.name
    )
}

fn to_yaml<T: Serialize>(what: &str, value: &T) -> Result<String, DeployError> {
    super::yaml::to_string(value).map_err(|message| DeployError::Serialize {
        what: what.to_owned(),
        message,
    })
}

fn yaml<T: Serialize>(plan: &Plan, name: &str, value: &T) -> Result<File, DeployError> {
    Ok(File {
        name: name.to_owned(),
        contents: format!("{}{}", header(plan), to_yaml(name, value)?),
    })
}
