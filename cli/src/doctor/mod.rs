//! `sous doctor`: what this machine can run. The GPUs and their driver, the engines
//! and container runtimes on `PATH`, the Hub, the free space of the caches, and which
//! recipes can be served here and why not.
//!
//! Every fact comes from a program on `PATH` (`nvidia-smi`, `vllm`, `python3`,
//! `trtllm-serve`, `docker`, `podman`), a file (`/proc/cpuinfo`, CDI specifications),
//! the CUDA driver library, or one request to the Hub; programs run concurrently, each
//! with a time limit. The parsers are plain functions of the programs' output, tested
//! on what the real programs print.
//!
//! - [`gpu`]: `nvidia-smi`'s CSV or the driver API; native FP4 and unified memory.
//! - [`engines`]: vLLM, SGLang, TensorRT-LLM versions; the native engine's CPU.
//! - [`containers`]: Docker and Podman, and whether their containers get GPUs.
//! - [`hub`]: the endpoint's answer and where the token comes from (never the token).
//! - [`disk`]: free space in the Hub cache and sous's cache and state.
//! - [`recipes`]: each recipe's `can_run` and reasons.

pub mod containers;
pub mod disk;
pub mod engines;
pub mod exec;
pub mod gpu;
pub mod hub;
pub mod recipes;

use std::path::PathBuf;

use serde::Serialize;

use crate::hub::config::HubConfig;
pub use exec::SearchPath;
pub use recipes::RecipeCheck;

/// What the machine has.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// The NVIDIA GPUs.
    pub gpus: Vec<gpu::Gpu>,
    /// Their driver, or why none was found.
    pub driver: gpu::Driver,
    /// The serving engines.
    pub engines: engines::Engines,
    /// Docker and Podman.
    pub containers: containers::Containers,
    /// The Hub.
    pub hub: hub::Hub,
    /// Free space where sous writes.
    pub disk: Vec<disk::Disk>,
}

/// The whole report, as `sous doctor --json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The machine.
    #[serde(flatten)]
    pub machine: Machine,
    /// The recipes checked.
    pub recipes: Vec<RecipeCheck>,
    /// The first problem that stops this machine from being used as asked.
    #[serde(serialize_with = "message_only")]
    pub blocking: Option<Blocking>,
}

/// A problem that makes `sous doctor` fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocking {
    /// What.
    pub message: String,
    /// What to do.
    pub hint: Option<String>,
}

fn message_only<S: serde::Serializer>(blocking: &Option<Blocking>, s: S) -> Result<S::Ok, S::Error> {
    match blocking {
        Some(b) => s.serialize_str(&b.message),
        None => s.serialize_none(),
    }
}

/// Where to look: `PATH`, the Hub settings, sous's directories.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The `PATH` programs are looked up in.
    pub search: SearchPath,
    /// The Hub settings.
    pub hub: HubConfig,
    /// Where the Hub token comes from.
    pub token: hub::TokenSource,
    /// sous's cache (`SOUS_CACHE_DIR`).
    pub cache_dir: PathBuf,
    /// sous's state (`SOUS_STATE_DIR`).
    pub state_dir: PathBuf,
}

impl Setup {
    /// From the process's environment.
    pub fn from_env() -> Setup {
        Setup {
            search: SearchPath::from_env(),
            hub: HubConfig::from_env(),
            token: hub::token_source(sous_engine::env::lookup),
            cache_dir: sous_engine::paths::cache_dir(),
            state_dir: sous_engine::paths::state_dir(),
        }
    }
}

/// Looks at the machine: every probe at once.
pub async fn examine(setup: &Setup) -> Machine {
    let ((gpus, driver), engines, containers, hub) = tokio::join!(
        gpu::probe(&setup.search),
        engines::probe(&setup.search),
        containers::probe(&setup.search),
        hub::probe(&setup.hub, setup.token.clone()),
    );
    let disk = vec![
        disk::probe("Hub cache", &setup.hub.cache_dir),
        disk::probe("sous cache", &setup.cache_dir),
        disk::probe("sous state", &setup.state_dir),
    ];
    Machine {
        gpus,
        driver,
        engines,
        containers,
        hub,
        disk,
    }
}

/// The first blocking problem: a recipe named by `--recipe` that cannot run, else no
/// recipe checked can run, else a cache with less than [`disk::LOW_SPACE`] free.
pub fn blocking(machine: &Machine, recipes: &[RecipeCheck]) -> Option<Blocking> {
    if let Some(r) = recipes.iter().find(|r| r.explicit && !r.can_run) {
        return Some(Blocking {
            message: format!("{} cannot run here: {}", r.path, r.reasons.join("; ")),
            hint: r.hint.clone(),
        });
    }
    if let Some(first) = recipes.first()
        && recipes.iter().all(|r| !r.can_run)
    {
        let message = if recipes.len() == 1 {
            format!("{} cannot run here: {}", first.path, first.reasons.join("; "))
        } else {
            format!(
                "none of the {} recipes checked can run here (the first, {}: {})",
                recipes.len(),
                first.path,
                first.reasons.first().map_or("", String::as_str)
            )
        };
        return Some(Blocking {
            message,
            hint: first.hint.clone(),
        });
    }
    machine.disk.iter().find(|d| d.low).map(|d| Blocking {
        message: format!(
            "the {} ({}) has {} free, less than {}",
            d.what,
            d.path,
            sous_engine::size::gib(d.available_bytes.unwrap_or(0)),
            sous_engine::size::gib(disk::LOW_SPACE)
        ),
        hint: Some(
            "free space there, or move the directory: HF_HUB_CACHE (models), SOUS_CACHE_DIR, SOUS_STATE_DIR"
                .into(),
        ),
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use sous_engine::recipe::{Overrides, Recipe};

    use super::*;

    fn recipe(path: &str) -> Recipe {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        sous_engine::recipe::load(&root.join(path), &Overrides::new())
            .expect("the shipped recipe loads")
            .recipe
    }

    fn machine(gpus: &str, vllm: Option<&str>) -> Machine {
        let (gpus, driver) = gpu::parse_query(gpus).expect("CSV");
        let driver = gpu::Driver {
            source: (!gpus.is_empty()).then_some("nvidia-smi"),
            version: driver,
            cuda: None,
            problem: gpus
                .is_empty()
                .then(|| "no NVIDIA GPU found (nvidia-smi not on PATH, libcuda.so not loadable)".into()),
        };
        let installed = |version: Option<&str>, missing: &str| engines::Installed {
            available: version.is_some(),
            path: version.map(|_| "/usr/bin/engine".into()),
            version: version.map(str::to_owned),
            problem: version.is_none().then(|| missing.to_owned()),
        };
        let absent = containers::ContainerRuntime {
            problem: Some("not on PATH".into()),
            ..Default::default()
        };
        Machine {
            gpus,
            driver,
            engines: engines::Engines {
                vllm: installed(vllm, "`vllm` not on PATH"),
                sglang: installed(None, "python3 not on PATH"),
                trtllm: installed(None, "`trtllm-serve` not on PATH"),
                native: engines::native(),
            },
            containers: containers::Containers {
                docker: absent.clone(),
                podman: absent,
            },
            hub: hub::Hub {
                endpoint: "http://127.0.0.1:9".into(),
                offline: false,
                reachable: Some(false),
                status: None,
                latency_ms: None,
                error: Some("cannot connect".into()),
                token: hub::TokenSource {
                    present: false,
                    source: None,
                },
            },
            disk: Vec::new(),
        }
    }

    fn check(machine: &Machine, path: &str, explicit: bool) -> RecipeCheck {
        let hub = HubConfig::from_vars(|name| (name == "HF_HUB_CACHE").then(|| "/nonexistent".into()));
        let search = SearchPath::new("");
        let cx = recipes::Context {
            machine,
            search: &search,
            hub: &hub,
        };
        recipes::check(Path::new(path), &recipe(path), &cx, explicit)
    }

    const SMOLLM2: &str = "recipes/local/smollm2-135m.toml";
    const SPARK: &str = "recipes/dgx-spark/qwen3.8-27b-nvfp4.toml";
    const TITAN: &str = "recipes/titan/qwen3.8-flash-next.toml";

    #[test]
    fn a_cpu_machine_runs_native_recipes_only() {
        let cpu = machine("", None);
        let native = check(&cpu, SMOLLM2, false);
        assert!(native.can_run, "{native:?}");
        // The model is not in the (empty) cache and the Hub does not answer.
        assert!(
            native.warnings.iter().any(|w| w.contains("not on disk")),
            "{native:?}"
        );
        let spark = check(&cpu, SPARK, false);
        assert!(!spark.can_run);
        assert_eq!(spark.reasons.len(), 2, "{spark:?}");
        assert!(spark.reasons[0].contains("needs an NVIDIA GPU"), "{spark:?}");
        assert!(
            spark.reasons[1].contains("vLLM is not installed: `vllm` not on PATH"),
            "{spark:?}"
        );
        assert!(spark.hint.as_deref().is_some_and(|h| h.contains("NVIDIA GPU")));
        assert_eq!(blocking(&cpu, &[native.clone(), spark.clone()]), None);
        let b = blocking(&cpu, &[spark.clone(), spark.clone()]).expect("blocks");
        assert!(
            b.message
                .starts_with("none of the 2 recipes checked can run here"),
            "{b:?}"
        );
        let named = RecipeCheck {
            explicit: true,
            ..spark
        };
        let b = blocking(&cpu, &[native, named]).expect("blocks");
        assert!(
            b.message
                .starts_with(&format!("{SPARK} cannot run here: vLLM needs an NVIDIA GPU")),
            "{b:?}"
        );
    }

    #[test]
    fn a_gpu_with_vllm_runs_the_vllm_recipes_and_says_which_release() {
        let h200 = machine("0, NVIDIA H200, 143771, 9.0, 580.159.04\n", Some("0.33.0"));
        let spark = check(&h200, SPARK, false);
        assert!(spark.can_run, "{spark:?}");
        assert!(
            spark
                .warnings
                .iter()
                .any(|w| w.contains("written for vLLM 0.27.1") && w.contains("0.33.0")),
            "{spark:?}"
        );
        let same = machine("0, NVIDIA H200, 143771, 9.0, 580.159.04\n", Some("0.27.1"));
        assert!(
            check(&same, SPARK, false)
                .warnings
                .iter()
                .all(|w| !w.contains("written for"))
        );
        // /model is not there and nothing says where to get it.
        let titan = check(&h200, TITAN, false);
        assert!(!titan.can_run);
        assert!(
            titan.reasons[0].contains("`model.path` /model does not exist"),
            "{titan:?}"
        );
    }

    #[test]
    fn a_full_cache_blocks() {
        let mut cpu = machine("", None);
        cpu.disk.push(disk::Disk {
            what: "Hub cache",
            path: "/hub".into(),
            measured_at: Some("/".into()),
            available_bytes: Some(200 << 20),
            low: true,
            problem: None,
        });
        let b = blocking(&cpu, &[]).expect("blocks");
        assert_eq!(
            b.message,
            "the Hub cache (/hub) has 0.20 GiB free, less than 1.00 GiB"
        );
    }

    #[test]
    fn the_json_has_the_documented_keys() {
        let report = Report {
            machine: machine("", None),
            recipes: Vec::new(),
            blocking: Some(Blocking {
                message: "m".into(),
                hint: Some("h".into()),
            }),
        };
        let json = serde_json::to_value(&report).expect("serializes");
        let keys: Vec<&str> = json
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        for key in [
            "gpus",
            "driver",
            "engines",
            "containers",
            "hub",
            "disk",
            "recipes",
            "blocking",
        ] {
            assert!(keys.contains(&key), "{key} in {keys:?}");
        }
        assert_eq!(json["blocking"], "m");
    }
}
