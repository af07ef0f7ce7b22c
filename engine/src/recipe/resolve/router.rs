//! `[deploy.router]`, checked: which router stands in front of the replicas, its
//! policy and release, and the settings that policy reads. The routers' own defaults
//! and choices are those of their launchers: vllm-project/router 0.1.17
//! (`py_src/vllm_router/router_args.py`) and sgl-project's `sglang-router` 0.3.2
//! (`sglang_router/router_args.py`).

use crate::recipe::RecipeError;
use crate::recipe::file::{EngineKind, RouterKind, RouterPolicy, RouterSection};

use super::Invalid;

/// The `vllm-router` release rendered when `deploy.router.version` is unset.
pub const VLLM_ROUTER_VERSION: &str = "0.1.17";
/// The `sglang-router` release rendered when `deploy.router.version` is unset.
pub const SGLANG_ROUTER_VERSION: &str = "0.3.2";

/// `[deploy.router]`, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Router {
    /// Which router; [`RouterKind::None`] for none.
    pub kind: RouterKind,
    /// Its policy.
    pub policy: RouterPolicy,
    /// Its release.
    pub version: String,
    /// The image it runs in.
    pub image: String,
    /// `--cache-threshold`, when set.
    pub cache_threshold: Option<f64>,
    /// `--balance-abs-threshold`, when set.
    pub balance_abs_threshold: Option<u32>,
    /// `--balance-rel-threshold`, when set.
    pub balance_rel_threshold: Option<f64>,
}

impl Router {
    /// Whether a router is rendered.
    pub fn is_some(&self) -> bool {
        self.kind != RouterKind::None
    }

    /// The image rendered when `deploy.router.image` is unset: `KIND:VERSION`, built
    /// from the repository's `docker/router.Dockerfile`.
    pub fn default_image(kind: RouterKind, version: &str) -> String {
        match kind {
            RouterKind::SglangRouter => format!("sglang-router:{version}"),
            _ => format!("vllm-router:{version}"),
        }
    }

    /// Whether the image is that default one (which no registry publishes).
    pub fn has_default_image(&self) -> bool {
        self.image == Router::default_image(self.kind, &self.version)
    }

    /// Back to the recipe's section, defaults written out (of a router that is not
    /// there, only that).
    pub fn to_section(&self) -> RouterSection {
        if !self.is_some() {
            return RouterSection {
                kind: Some(RouterKind::None),
                ..Default::default()
            };
        }
        RouterSection {
            kind: Some(self.kind),
            policy: Some(self.policy),
            version: Some(self.version.clone()),
            image: Some(self.image.clone()),
            cache_threshold: self.cache_threshold,
            balance_abs_threshold: self.balance_abs_threshold,
            balance_rel_threshold: self.balance_rel_threshold,
        }
    }
}

/// The router a deployment gets when the recipe names none: nothing for one replica;
/// for more, the engine's own, since a plain Service spreads a conversation's turns
/// over replicas whose prefix caches have not seen it.
pub fn default_router(replicas: u32, engine: EngineKind) -> RouterKind {
    match (replicas, engine) {
        (0 | 1, _) => RouterKind::None,
        (_, EngineKind::Sglang) => RouterKind::SglangRouter,
        _ => RouterKind::VllmRouter,
    }
}

pub(super) fn resolve_router(
    raw: RouterSection,
    replicas: u32,
    engine: EngineKind,
    invalid: &Invalid<'_>,
) -> Result<Router, RecipeError> {
    fn at(key: &str) -> [&str; 3] {
        ["deploy", "router", key]
    }
    let kind = raw.kind.unwrap_or_else(|| default_router(replicas, engine));
    let policy = raw.policy.unwrap_or(RouterPolicy::CacheAware);
    if kind == RouterKind::SglangRouter && policy == RouterPolicy::ConsistentHash {
        return Err(invalid(
            &at("policy"),
            "`sglang-router` has no `consistent_hash` policy".into(),
            Some("use `cache_aware`, `round_robin`, `power_of_two` or `random`, or `kind = \"vllm-router\"`"),
        ));
    }
    if let Some(t) = raw.cache_threshold
        && !(0.0..=1.0).contains(&t)
    {
        return Err(invalid(
            &at("cache_threshold"),
            format!("{t} is outside [0, 1]"),
            Some("it is the share of a prompt that must match a replica's cache"),
        ));
    }
    if let Some(r) = raw.balance_rel_threshold
        && r < 1.0
    {
        return Err(invalid(
            &at("balance_rel_threshold"),
            format!("{r} is below 1: the busiest replica is never less loaded than the idlest"),
            None,
        ));
    }
    let tuned = raw.cache_threshold.is_some()
        || raw.balance_abs_threshold.is_some()
        || raw.balance_rel_threshold.is_some();
    if tuned && policy != RouterPolicy::CacheAware {
        return Err(invalid(
            &at("policy"),
            format!(
                "the cache and balance thresholds are read by `cache_aware` only, not by `{}`",
                policy.as_str()
            ),
            Some("remove the thresholds, or set `policy = \"cache_aware\"`"),
        ));
    }
    let version = match (&raw.version, kind) {
        (Some(v), _) => {
            if v.is_empty()
                || !v
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'))
            {
                return Err(invalid(
                    &at("version"),
                    format!("`{v}` is not a release number"),
                    Some("write it as on PyPI, e.g. `0.1.17`"),
                ));
            }
            v.clone()
        }
        (None, RouterKind::SglangRouter) => SGLANG_ROUTER_VERSION.to_owned(),
        (None, _) => VLLM_ROUTER_VERSION.to_owned(),
    };
    let image = raw.image.unwrap_or_else(|| Router::default_image(kind, &version));
    Ok(Router {
        kind,
        policy,
        version,
        image,
        cache_threshold: raw.cache_threshold,
        balance_abs_threshold: raw.balance_abs_threshold,
        balance_rel_threshold: raw.balance_rel_threshold,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_replicas_get_their_engines_router() {
        assert_eq!(default_router(1, EngineKind::Vllm), RouterKind::None);
        assert_eq!(default_router(3, EngineKind::Vllm), RouterKind::VllmRouter);
        assert_eq!(default_router(2, EngineKind::Native), RouterKind::VllmRouter);
        assert_eq!(default_router(2, EngineKind::Sglang), RouterKind::SglangRouter);
        assert_eq!(default_router(2, EngineKind::Trtllm), RouterKind::VllmRouter);
    }
}
