//! The router on Kubernetes: a Deployment of one router pod that finds the engine
//! pods itself (the router's Kubernetes discovery, by the engine pods' labels), the
//! ServiceAccount, Role and RoleBinding that discovery needs (`get`, `list` and `watch`
//! on pods of the namespace, nothing else), and the Service clients call, under the
//! recipe's name; the engines' own Service becomes `NAME-engine`.
//!
//! Discovery rather than a static list: replicas of a Deployment have no stable
//! names, and the Service's single virtual IP would hide them from the router. One
//! router pod: the cache-aware policy learns from the prompts it routes, and two
//! routers would each learn half of them.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, ObjectFieldSelector, PodSpec,
    PodTemplateSpec, Probe, SecretKeySelector, Service, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sous_engine::launch::Arg;

use super::{Names, PORT_NAME};
use crate::deploy::pod::{self, Plan};
use crate::deploy::router::{self, Workers};

/// The variable the router's namespace comes from when the recipe fixes none.
const NAMESPACE_VAR: &str = "POD_NAMESPACE";
/// The router's metrics port's name.
const METRICS_PORT_NAME: &str = "metrics";

/// The router's objects, named and labelled apart from the engine's.
pub(super) struct RouterObjects {
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub deployment: Deployment,
    pub service: Service,
}

/// The router's name: `NAME-router`.
pub(super) fn name(plan: &Plan) -> String {
    format!("{}-router", plan.name)
}

/// The router's objects; `engines` selects the pods that serve HTTP (a multi-node
/// instance's leaders only).
pub(super) fn objects(plan: &Plan, names: &Names, engines: &BTreeMap<String, String>) -> RouterObjects {
    let name = name(plan);
    let deploy = &plan.recipe.deploy;
    let selector = BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), name.clone()),
        ("app.kubernetes.io/component".to_owned(), "router".to_owned()),
    ]);
    let mut labels = selector.clone();
    labels.insert("app.kubernetes.io/managed-by".into(), "sous".into());
    labels.insert("app.kubernetes.io/part-of".into(), plan.name.clone());
    labels.insert("sous.dev/router".into(), deploy.router.kind.as_str().into());
    labels.extend(deploy.labels.clone());
    let meta = |object: &str| ObjectMeta {
        labels: Some(labels.clone()),
        ..names.meta(object)
    };

    let (namespace, mut env) = match &deploy.namespace {
        Some(ns) => (Arg::Lit(ns.clone()), Vec::new()),
        None => (
            Arg::FromEnv(NAMESPACE_VAR.into()),
            vec![EnvVar {
                name: NAMESPACE_VAR.into(),
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "metadata.namespace".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }],
        ),
    };
    let workers = Workers::Discover {
        selector: engines.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        namespace,
        port: plan.port(),
    };
    let mut command = router::program(deploy.router.kind);
    // Kubernetes expands `$(NAME)` in a command from the container's environment.
    let args = router::args(&plan.recipe, "0.0.0.0", &workers);
    command.extend(pod::argv_with(&args, pod::escape_dollars, |var| {
        format!("$({var})")
    }));
    for arg in args {
        if let Arg::FromEnv(var) = arg
            && var != NAMESPACE_VAR
        {
            env.push(EnvVar {
                name: var.clone(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: deploy.secret.clone(),
                        key: var,
                        optional: Some(false),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
    }
    let health = |period: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(router::HEALTH_PATH.into()),
            port: IntOrString::String(PORT_NAME.into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(5),
        ..Default::default()
    };
    let container = Container {
        name: "router".into(),
        image: Some(deploy.router.image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(command),
        env: (!env.is_empty()).then_some(env),
        ports: Some(vec![
            ContainerPort {
                name: Some(PORT_NAME.into()),
                container_port: i32::from(plan.port()),
                protocol: Some("TCP".into()),
                ..Default::default()
            },
            ContainerPort {
                name: Some(METRICS_PORT_NAME.into()),
                container_port: i32::from(router::METRICS_PORT),
                protocol: Some("TCP".into()),
                ..Default::default()
            },
        ]),
        // Ready once a replica is: the router answers /health when a worker does. No
        // liveness probe: while every engine loads, a restart would help nothing.
        readiness_probe: Some(health(10)),
        ..Default::default()
    };
    let deployment = Deployment {
        metadata: meta(&name),
        spec: Some(DeploymentSpec {
            replicas: Some(1),
            selector: LabelSelector {
                match_labels: Some(selector.clone()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels.clone()),
                    annotations: (!deploy.annotations.is_empty()).then(|| deploy.annotations.clone()),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(name.clone()),
                    containers: vec![container],
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    let service = super::service(plan, meta(&plan.name), selector);
    RouterObjects {
        service_account: ServiceAccount {
            metadata: meta(&name),
            ..Default::default()
        },
        role: Role {
            metadata: meta(&name),
            rules: Some(vec![PolicyRule {
                api_groups: Some(vec![String::new()]),
                resources: Some(vec!["pods".into()]),
                verbs: vec!["get".into(), "list".into(), "watch".into()],
                ..Default::default()
            }]),
        },
        role_binding: RoleBinding {
            metadata: meta(&name),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: name.clone(),
            },
            // Without a namespace, a RoleBinding's ServiceAccount is the one of the
            // binding's own namespace.
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: name.clone(),
                namespace: deploy.namespace.clone(),
                ..Default::default()
            }]),
        },
        deployment,
        service,
    }
}
