//! The recipe's `[deploy]` section, checked: names Kubernetes accepts, quantities it
//! parses, a memory request not above its limit, tolerations it knows. Rendering the
//! objects is `sous deploy`'s concern; what is checked here is what a cluster would
//! reject later, at apply time, far from the line of the recipe that caused it.
//!
//! The rules mirror Kubernetes' own validation (kubernetes/apimachinery, release 1.33):
//! `pkg/util/validation/validation.go` (DNS-1123 labels and subdomains, qualified
//! names, label values) and `pkg/api/resource/quantity.go` (quantities).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::recipe::RecipeError;
use crate::recipe::file::{AccessMode, DeploySection, EngineKind, StartupProbeSection, TolerationSection};

use super::Invalid;
use super::router::{Router, resolve_router};

/// The sous image the init containers run in when `deploy.sous_image` is unset: the
/// tag the repository's `Dockerfile` is built with in the README.
pub fn default_sous_image() -> String {
    format!("sous:{}", env!("CARGO_PKG_VERSION"))
}

/// Default `deploy.shm_size`: what vLLM's Kubernetes guide mounts
/// (vllm-project/vllm, `docs/deployment/k8s.md`).
pub const DEFAULT_SHM_SIZE: &str = "2Gi";

/// Default `deploy.download_timeout`.
pub const DEFAULT_DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(3600);

/// Default `deploy.container_name`.
pub const DEFAULT_CONTAINER_NAME: &str = "engine";

/// Default `deploy.startup_probe.period`: vLLM's Kubernetes guide probes every 10 s
/// (vllm-project/vllm, `docs/deployment/k8s.md`).
pub const DEFAULT_STARTUP_PERIOD: Duration = Duration::from_secs(10);

/// `[deploy]`, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Deploy {
    /// Name of the objects, the compose service and the unit (a DNS-1123 label).
    pub name: String,
    /// Namespace, when the recipe fixes one.
    pub namespace: Option<String>,
    /// Identical instances.
    pub replicas: u32,
    /// GPUs per node, when the recipe says.
    pub gpus_per_node: Option<u32>,
    /// The sous image of the init containers.
    pub sous_image: String,
    /// `runtimeClassName`.
    pub runtime_class: Option<String>,
    /// `nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations, as written (checked).
    pub tolerations: Vec<TolerationSection>,
    /// Memory request of the engine container.
    pub memory_request: Option<Quantity>,
    /// Memory limit of the engine container.
    pub memory_limit: Option<Quantity>,
    /// The engine container's name.
    pub container_name: String,
    /// Time between start-up probes.
    pub startup_period: Duration,
    /// Failed start-up probes before a restart, when the recipe fixes it (otherwise
    /// enough to cover `server.startup_timeout`).
    pub startup_failure_threshold: Option<u32>,
    /// Size of `/dev/shm`.
    pub shm_size: Quantity,
    /// Longest first download (and quantization).
    pub download_timeout: Duration,
    /// Render a ServiceMonitor.
    pub service_monitor: bool,
    /// The router in front of the replicas.
    pub router: Router,
    /// The cache volume.
    pub storage: Storage,
    /// An existing claim holding a path-only model.
    pub model_claim: Option<String>,
    /// The Secret holding `HF_TOKEN` and the API key.
    pub secret: String,
    /// Extra labels.
    pub labels: BTreeMap<String, String>,
    /// Extra annotations.
    pub annotations: BTreeMap<String, String>,
}

/// `[deploy.storage]`, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Storage {
    /// Size of the claim sous creates; `None`: computed from the model at render time.
    pub size: Option<Quantity>,
    /// Storage class.
    pub class: Option<String>,
    /// An existing claim used instead of a new one.
    pub existing_claim: Option<String>,
    /// Access mode of a new claim.
    pub access_mode: AccessMode,
}

/// A Kubernetes quantity: its text, kept as written, and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Quantity {
    /// As written in the recipe (and in the rendering).
    pub text: String,
    /// Its value in base units (bytes for memory and storage).
    pub value: f64,
}

impl Quantity {
    /// Parses a quantity: a decimal number followed by a binary suffix (`Ki` .. `Ei`),
    /// a decimal one (`m`, `k`, `M` .. `E`) or an exponent (`e3`, `E-2`).
    pub fn parse(text: &str) -> Result<Quantity, String> {
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
            .unwrap_or(text.len());
        let (number, suffix) = text.split_at(split);
        let digits = number.strip_prefix(['+', '-']).unwrap_or(number);
        let well_formed = !digits.is_empty()
            && digits.chars().filter(|&c| c == '.').count() <= 1
            && digits.chars().any(|c| c.is_ascii_digit())
            && digits.chars().all(|c| c.is_ascii_digit() || c == '.');
        let bad = || format!("`{text}` is not a Kubernetes quantity");
        if !well_formed {
            return Err(bad());
        }
        let number: f64 = number.parse().map_err(|_| bad())?;
        let scale = match suffix {
            "" => 1.0,
            "Ki" => 1024f64,
            "Mi" => 1024f64.powi(2),
            "Gi" => 1024f64.powi(3),
            "Ti" => 1024f64.powi(4),
            "Pi" => 1024f64.powi(5),
            "Ei" => 1024f64.powi(6),
            "m" => 1e-3,
            "k" => 1e3,
            "M" => 1e6,
            "G" => 1e9,
            "T" => 1e12,
            "P" => 1e15,
            "E" => 1e18,
            exponent if exponent.starts_with(['e', 'E']) => {
                let power: i32 = exponent[1..].parse().map_err(|_| bad())?;
                10f64.powi(power)
            }
            _ => return Err(bad()),
        };
        Ok(Quantity {
            text: text.to_owned(),
            value: number * scale,
        })
    }

    /// A whole number of GiB, at least `bytes` (`41Gi`).
    pub fn gibibytes_at_least(bytes: u64) -> Quantity {
        let gib = bytes.div_ceil(1 << 30).max(1);
        Quantity {
            text: format!("{gib}Gi"),
            value: (gib << 30) as f64,
        }
    }
}

/// Whether `name` is a DNS-1123 label: at most 63 lower-case letters, digits and `-`,
/// starting and ending with a letter or digit (Service, container and port names).
pub fn is_dns_label(name: &str) -> bool {
    let edges_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    name.len() <= 63
        && edges_ok(name.chars().next())
        && edges_ok(name.chars().last())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// Whether `name` is a DNS-1123 subdomain: at most 253 characters, labels joined by `.`
/// (claim, ConfigMap and storage-class names, label-key prefixes).
pub fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(is_dns_label)
}

/// Whether `value` is a label value: empty, or at most 63 letters, digits, `-`, `_` and
/// `.`, starting and ending with a letter or digit.
pub fn is_label_value(value: &str) -> bool {
    value.is_empty() || is_qualified_part(value)
}

/// Whether `key` is a label or annotation key: `[prefix/]name`, the prefix a DNS-1123
/// subdomain, the name a label value that is not empty.
pub fn is_qualified_name(key: &str) -> bool {
    match key.rsplit_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_qualified_part(name),
        None => is_qualified_part(key),
    }
}

fn is_qualified_part(name: &str) -> bool {
    let edges_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    name.len() <= 63
        && edges_ok(name.chars().next())
        && edges_ok(name.chars().last())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The default object name: the recipe's name with `.` and `_` as `-`.
fn default_name(recipe_name: &str) -> String {
    recipe_name.replace(['.', '_'], "-")
}

pub(super) fn resolve_deploy(
    raw: DeploySection,
    recipe_name: &str,
    engine: EngineKind,
    invalid: &Invalid<'_>,
) -> Result<Deploy, RecipeError> {
    let name = raw.name.unwrap_or_else(|| default_name(recipe_name));
    if !is_dns_label(&name) {
        return Err(invalid(
            &["deploy", "name"],
            format!("`{name}` is not a DNS-1123 label, which Kubernetes requires of Service names"),
            Some(
                "set `deploy.name` to at most 63 lower-case letters, digits and `-`, starting and ending with a letter or digit",
            ),
        ));
    }
    for (key, value) in [
        ("namespace", &raw.namespace),
        ("runtime_class", &raw.runtime_class),
        ("container_name", &raw.container_name),
    ] {
        if let Some(value) = value
            && !is_dns_label(value)
        {
            return Err(invalid(
                &["deploy", key],
                format!("`{value}` is not a DNS-1123 label"),
                Some("use at most 63 lower-case letters, digits and `-`"),
            ));
        }
    }
    for (path, value) in [
        (&["deploy", "model_claim"][..], &raw.model_claim),
        (&["deploy", "secret"][..], &raw.secret),
        (
            &["deploy", "storage", "existing_claim"][..],
            &raw.storage.existing_claim,
        ),
        (&["deploy", "storage", "class"][..], &raw.storage.class),
    ] {
        if let Some(value) = value
            && !is_dns_subdomain(value)
        {
            return Err(invalid(
                path,
                format!("`{value}` is not a Kubernetes object name (a DNS-1123 subdomain)"),
                Some("use lower-case letters, digits, `-` and `.`"),
            ));
        }
    }
    for (key, what) in [("replicas", raw.replicas), ("gpus_per_node", raw.gpus_per_node)] {
        if what == Some(0) {
            return Err(invalid(
                &["deploy", key],
                "0 is not allowed here".into(),
                Some("use 1 or more"),
            ));
        }
    }
    let quantity = |path: &[&str], text: &Option<String>| -> Result<Option<Quantity>, RecipeError> {
        let Some(text) = text else { return Ok(None) };
        let q = Quantity::parse(text)
            .map_err(|m| invalid(path, m, Some("write e.g. `120Gi`, `64Gi` or `500M`")))?;
        if q.value <= 0.0 {
            return Err(invalid(path, format!("`{text}` is not a positive size"), None));
        }
        Ok(Some(q))
    };
    let memory_request = quantity(&["deploy", "memory_request"], &raw.memory_request)?;
    let memory_limit = quantity(&["deploy", "memory_limit"], &raw.memory_limit)?;
    if let (Some(request), Some(limit)) = (&memory_request, &memory_limit)
        && request.value > limit.value
    {
        return Err(invalid(
            &["deploy", "memory_request"],
            format!(
                "the request ({}) is above the limit ({})",
                request.text, limit.text
            ),
            Some(
                "Kubernetes refuses a request above its limit: lower the request or raise `deploy.memory_limit`",
            ),
        ));
    }
    let shm_size = quantity(&["deploy", "shm_size"], &raw.shm_size)?.unwrap_or_else(|| {
        Quantity::parse(DEFAULT_SHM_SIZE).unwrap_or(Quantity {
            text: DEFAULT_SHM_SIZE.to_owned(),
            value: (2u64 << 30) as f64,
        })
    });
    let size = quantity(&["deploy", "storage", "size"], &raw.storage.size)?;
    if size.is_some() && raw.storage.existing_claim.is_some() {
        return Err(invalid(
            &["deploy", "storage", "size"],
            "`storage.size` sizes a claim sous creates, but `storage.existing_claim` is set".into(),
            Some("remove one of the two"),
        ));
    }
    let startup_period = match &raw.startup_probe.period {
        None => DEFAULT_STARTUP_PERIOD,
        Some(text) => {
            let period = humantime::parse_duration(text).map_err(|e| {
                invalid(
                    &["deploy", "startup_probe", "period"],
                    format!("`{text}` is not a duration ({e})"),
                    Some("write e.g. `10s` or `20s`"),
                )
            })?;
            if period.as_secs() == 0 || period.subsec_nanos() != 0 {
                return Err(invalid(
                    &["deploy", "startup_probe", "period"],
                    format!(
                        "`{text}` is not a whole number of seconds, which is all a probe's period can be"
                    ),
                    Some("write e.g. `10s` or `20s`"),
                ));
            }
            period
        }
    };
    if raw.startup_probe.failure_threshold == Some(0) {
        return Err(invalid(
            &["deploy", "startup_probe", "failure_threshold"],
            "0 is not allowed here".into(),
            Some("use 1 or more"),
        ));
    }
    let download_timeout = match &raw.download_timeout {
        None => DEFAULT_DOWNLOAD_TIMEOUT,
        Some(text) => humantime::parse_duration(text).map_err(|e| {
            invalid(
                &["deploy", "download_timeout"],
                format!("`{text}` is not a duration ({e})"),
                Some("write e.g. `30m` or `2h`"),
            )
        })?,
    };
    for (table, map) in [
        ("labels", &raw.labels),
        ("annotations", &raw.annotations),
        ("node_selector", &raw.node_selector),
    ] {
        for (key, value) in map {
            if !is_qualified_name(key) {
                return Err(invalid(
                    &["deploy", table, key],
                    format!("`{key}` is not a Kubernetes label or annotation key"),
                    Some("write `name` or `prefix.example.com/name`: letters, digits, `-`, `_`, `.`"),
                ));
            }
            if table != "annotations" && !is_label_value(value) {
                return Err(invalid(
                    &["deploy", table, key],
                    format!("`{value}` is not a label value"),
                    Some(
                        "at most 63 letters, digits, `-`, `_` and `.`, starting and ending with a letter or digit",
                    ),
                ));
            }
        }
    }
    for (i, t) in raw.tolerations.iter().enumerate() {
        let index = i.to_string();
        let path = ["deploy", "tolerations", index.as_str()];
        let operator = t.operator.as_deref().unwrap_or("Equal");
        if !matches!(operator, "Equal" | "Exists") {
            return Err(invalid(
                &path,
                format!("operator `{operator}` is not `Equal` or `Exists`"),
                None,
            ));
        }
        if let Some(effect) = &t.effect
            && !matches!(effect.as_str(), "NoSchedule" | "PreferNoSchedule" | "NoExecute")
        {
            return Err(invalid(
                &path,
                format!("effect `{effect}` is not `NoSchedule`, `PreferNoSchedule` or `NoExecute`"),
                None,
            ));
        }
        if operator == "Exists" && t.value.is_some() {
            return Err(invalid(
                &path,
                "`operator = \"Exists\"` takes no `value`".into(),
                None,
            ));
        }
        if operator == "Equal" && t.key.is_none() {
            return Err(invalid(
                &path,
                "`operator = \"Equal\"` needs a `key`".into(),
                None,
            ));
        }
    }
    let secret = raw.secret.unwrap_or_else(|| format!("{name}-secrets"));
    let replicas = raw.replicas.unwrap_or(1);
    let router = resolve_router(raw.router, replicas, engine, invalid)?;
    Ok(Deploy {
        name,
        namespace: raw.namespace,
        replicas,
        gpus_per_node: raw.gpus_per_node,
        sous_image: raw.sous_image.unwrap_or_else(default_sous_image),
        runtime_class: raw.runtime_class,
        node_selector: raw.node_selector,
        tolerations: raw.tolerations,
        memory_request,
        memory_limit,
        container_name: raw
            .container_name
            .unwrap_or_else(|| DEFAULT_CONTAINER_NAME.to_owned()),
        startup_period,
        startup_failure_threshold: raw.startup_probe.failure_threshold,
        shm_size,
        download_timeout,
        service_monitor: raw.service_monitor.unwrap_or(false),
        router,
        storage: Storage {
            size,
            class: raw.storage.class,
            existing_claim: raw.storage.existing_claim,
            access_mode: raw.storage.access_mode.unwrap_or(AccessMode::ReadWriteOnce),
        },
        model_claim: raw.model_claim,
        secret,
        labels: raw.labels,
        annotations: raw.annotations,
    })
}

impl Deploy {
    /// Back to the recipe's section, defaults written out.
    pub fn to_section(&self) -> DeploySection {
        use crate::recipe::file::StorageSection;
        DeploySection {
            name: Some(self.name.clone()),
            namespace: self.namespace.clone(),
            replicas: Some(self.replicas),
            gpus_per_node: self.gpus_per_node,
            sous_image: Some(self.sous_image.clone()),
            runtime_class: self.runtime_class.clone(),
            node_selector: self.node_selector.clone(),
            tolerations: self.tolerations.clone(),
            memory_request: self.memory_request.as_ref().map(|q| q.text.clone()),
            memory_limit: self.memory_limit.as_ref().map(|q| q.text.clone()),
            container_name: Some(self.container_name.clone()),
            startup_probe: StartupProbeSection {
                period: Some(humantime::format_duration(self.startup_period).to_string()),
                failure_threshold: self.startup_failure_threshold,
            },
            shm_size: Some(self.shm_size.text.clone()),
            download_timeout: Some(humantime::format_duration(self.download_timeout).to_string()),
            service_monitor: Some(self.service_monitor),
            router: self.router.to_section(),
            storage: StorageSection {
                size: self.storage.size.as_ref().map(|q| q.text.clone()),
                class: self.storage.class.clone(),
                existing_claim: self.storage.existing_claim.clone(),
                access_mode: Some(self.storage.access_mode),
            },
            model_claim: self.model_claim.clone(),
            secret: Some(self.secret.clone()),
            labels: self.labels.clone(),
            annotations: self.annotations.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_as_kubernetes_reads_them() {
        let bytes = |t: &str| Quantity::parse(t).map(|q| q.value);
        assert_eq!(bytes("120Gi"), Ok(120.0 * (1u64 << 30) as f64));
        assert_eq!(bytes("64Gi"), Ok(64.0 * (1u64 << 30) as f64));
        assert_eq!(bytes("500M"), Ok(5e8));
        assert_eq!(bytes("1.5Gi"), Ok(1.5 * (1u64 << 30) as f64));
        assert_eq!(bytes("100m"), Ok(0.1));
        assert_eq!(bytes("12e3"), Ok(12000.0));
        assert_eq!(bytes("2048"), Ok(2048.0));
        for bad in ["", "Gi", "12GB", "1.2.3Gi", "12 Gi", "ten", "1Gib", "-", "."] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(Quantity::gibibytes_at_least(1).text, "1Gi");
        assert_eq!(Quantity::gibibytes_at_least(40 << 30).text, "40Gi");
        assert_eq!(Quantity::gibibytes_at_least((40 << 30) + 1).text, "41Gi");
    }

    #[test]
    fn names_follow_kubernetes_rules() {
        assert!(is_dns_label("qwen3-8-27b-dgx-spark"));
        assert!(!is_dns_label("qwen3.8-27b"));
        assert!(!is_dns_label("-a"));
        assert!(!is_dns_label("a-"));
        assert!(!is_dns_label("Upper"));
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(is_dns_label(&"a".repeat(63)));
        assert!(is_dns_subdomain("local-path"));
        assert!(is_dns_subdomain("fast.ssd"));
        assert!(!is_dns_subdomain("fast..ssd"));
        assert!(is_qualified_name("app.kubernetes.io/name"));
        assert!(is_qualified_name("team"));
        assert!(!is_qualified_name("bad key"));
        assert!(!is_qualified_name("/name"));
        assert!(is_label_value(""));
        assert!(is_label_value("v0.27.1"));
        assert!(!is_label_value("vllm/vllm-openai"));
        assert_eq!(default_name("qwen3.8-27b_dgx"), "qwen3-8-27b-dgx");
    }
}
