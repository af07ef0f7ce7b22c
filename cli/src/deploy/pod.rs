//! What every target runs, decided once: the recipe as deployed (its model on the
//! data volume at a fixed path), the init steps that fill the volume (`sous pull`, then
//! `sous quantize`), the engine's command line and environment from the same adapter
//! `sous serve --dry-run` prints, the files the engine reads, the GPUs, the probes'
//! budget and the content hash that rolls the pods when the recipe changes.
//!
//! Targets (`k8s`, `compose`, `systemd`) only lay this out in their own syntax.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use sous_engine::launch::caches::CacheKey;
use sous_engine::launch::{self, Arg, Launch, RenderContext};
use sous_engine::paths;
use sous_engine::recipe::{CalibrationText, EngineKind, QuantDevice, Recipe, Runtime};
use sous_engine::serve::starts::{Start, slowest};
use sous_engine::serve::{HEALTH_PATH, health_timeout};

use super::DeployError;
use crate::hub::cache::is_commit;

/// Where the data volume is mounted in every container: the Hugging Face cache, the
/// models, the quantized checkpoints and the engines' compile caches.
pub const DATA_DIR: &str = "/var/lib/sous";
/// Where the recipe and the engine's option files are mounted.
pub const CONFIG_DIR: &str = "/etc/sous";
/// The resolved recipe the init containers read, under [`CONFIG_DIR`].
pub const RECIPE_FILE: &str = "recipe.toml";
/// The sous binary in the sous image (the `Dockerfile`'s).
pub const SOUS_IN_IMAGE: &str = "/usr/local/bin/sous";
/// Seconds the pod keeps serving after it is taken out of the Service, before SIGTERM.
pub const PRE_STOP_SECONDS: u64 = 5;
/// The workload annotation that says how to apply the recipe's next
/// `memory.oom_fallback` step, which nothing applies by itself off `sous serve`.
pub const OOM_ANNOTATION: &str = "sous.dev/oom-fallback";

/// The workload annotation that says where the start-up probe's budget comes from.
pub const STARTUP_ANNOTATION: &str = "sous.dev/startup-probe";

/// A measured start-up probe's budget: this many times the slowest start `sous serve`
/// recorded for the engine and release, so that a slower node, a cold page cache or a
/// compile cache to fill still fits, and an engine that hangs is restarted in minutes
/// instead of after the whole `server.startup_timeout`.
const MEASURED_FACTOR: f64 = 3.0;

/// The least budget a measured start gives, seconds.
const MEASURED_FLOOR: f64 = 60.0;
/// The node label that names the GPU model (NVIDIA GPU Feature Discovery's, e.g.
/// `NVIDIA-H100-80GB-HBM3`): where `deploy.node_selector` pins it, the kept compile
/// caches are keyed by it.
pub const GPU_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";

/// The device part of the compile caches' key where the nodes' GPU model is not
/// pinned: which GPU a pod lands on is not known when it is rendered.
const ANY_GPU: &str = "any GPU";

/// The variable the Hub token is read from (huggingface_hub's).
pub const HF_TOKEN: &str = "HF_TOKEN";

/// One init step: a name and the command it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// `pull` or `quantize`.
    pub name: &'static str,
    /// The command, program first.
    pub argv: Vec<String>,
}

/// Where the model directory comes from inside the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelMount {
    /// Inside [`DATA_DIR`]: nothing to mount beside the data volume.
    InData,
    /// Outside it (the recipe's own `model.path`): the data volume again, at this
    /// sub-path, mounted at the model's path.
    DataSubPath {
        /// The recipe's `model.path`.
        mount_path: String,
        /// Its place on the data volume.
        sub_path: String,
    },
    /// A directory of the machine (compose): the recipe's `model.path`, bound at the
    /// same path, read-only when sous does not pull into it.
    Host {
        /// The recipe's `model.path`.
        path: String,
        /// Whether nothing writes to it.
        read_only: bool,
    },
    /// An existing claim that holds the model, read-only at `model.path`.
    Claim {
        /// The claim.
        claim: String,
        /// The recipe's `model.path`.
        mount_path: String,
    },
}

/// What every target runs for one recipe.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The recipe as deployed: its model at a path on the volume, run as a host
    /// process of the container.
    pub recipe: Recipe,
    /// Object, service and unit name (`deploy.name`).
    pub name: String,
    /// Content hash of [`Plan::config`] (12 hex digits).
    pub hash: String,
    /// Files mounted at [`CONFIG_DIR`], by file name: the recipe and the engine's
    /// option files.
    pub config: BTreeMap<String, String>,
    /// Steps that fill the volume before the engine starts.
    pub init: Vec<Step>,
    /// The engine's command line and environment, as `sous serve --dry-run` renders
    /// them for the pod's paths.
    pub engine: Launch,
    /// The image the engine runs in.
    pub image: String,
    /// GPUs of one instance: tensor × pipeline × data parallel; 0 for the native engine.
    pub gpus: u32,
    /// How the model directory reaches the pod.
    pub model_mount: ModelMount,
    /// Environment every container gets: the caches on the data volume.
    pub cache_env: BTreeMap<String, String>,
    /// Legal but risky settings, each with what to do.
    pub warnings: Vec<String>,
    /// The slowest start of this engine and release that `sous serve` recorded on this
    /// machine (seconds from launch to ready), how many there were, and the GPU of the
    /// slowest; set by [`Plan::with_starts`].
    pub measured_start: Option<(f64, usize, Option<String>)>,
}

impl Plan {
    /// The plan with the starts `sous serve` recorded for the recipe on this machine
    /// (`<state>/<name>/starts.jsonl`), which size the start-up probe.
    pub fn with_starts(mut self, starts: &[Start]) -> Plan {
        let (kind, version) = (self.recipe.engine.kind, self.engine.version.as_str());
        self.measured_start = slowest(starts, kind, version).map(|(seconds, count)| {
            let gpu = starts
                .iter()
                .find(|s| s.engine == kind && s.version == version && s.seconds == seconds)
                .and_then(|s| s.gpu.clone());
            (seconds, count, gpu)
        });
        self
    }

    /// Decides what runs for `recipe`; `on_host` when the containers run on one
    /// machine whose directories they can bind (compose), not on a cluster.
    pub fn new(recipe: &Recipe, on_host: bool) -> Result<Plan, DeployError> {
        let deploy = &recipe.deploy;
        let name = deploy.name.clone();
        let mut warnings = Vec::new();
        let mut deployed = recipe.clone();
        // The pod is the container: the engine runs as its process.
        deployed.engine.runtime = Runtime::Host;
        deployed.engine.image = None;
        if deployed.server.host != "0.0.0.0" && deployed.server.host != "::" {
            warnings.push(format!(
                "`server.host` is {}: in a container the engine must listen on every interface, so 0.0.0.0 is rendered",
                deployed.server.host
            ));
            deployed.server.host = "0.0.0.0".into();
        }

        if let Some(q) = deployed.quantize.as_mut()
            && q.device != QuantDevice::Cpu
        {
            warnings.push(format!(
                "`quantize.device` is {}: the quantize init container has no GPU and the sous image no NVRTC, \
                 so it quantizes on the CPU (the same bytes)",
                q.device
            ));
            q.device = QuantDevice::Cpu;
        }
        if let Some(CalibrationText::File(path)) = recipe
            .quantize
            .as_ref()
            .and_then(|q| q.calibration.as_ref())
            .map(|c| &c.text)
        {
            return Err(DeployError::CalibrationFile {
                path: path.display().to_string(),
            });
        }

        let models_dir = Path::new(DATA_DIR).join("models");
        let (model_mount, pulls) = match (&recipe.model.repo, &recipe.model.path, &deploy.model_claim) {
            (None, None, _) => return Err(DeployError::NoModelSource),
            (_, Some(path), _) if on_host => {
                if !path.starts_with('/') {
                    return Err(DeployError::RelativePath { path: path.clone() });
                }
                let pulls = recipe.model.repo.is_some();
                (
                    ModelMount::Host {
                        path: path.clone(),
                        read_only: !pulls,
                    },
                    pulls,
                )
            }
            (None, Some(path), None) => {
                return Err(DeployError::PathWithoutClaim { path: path.clone() });
            }
            (None, Some(path), Some(claim)) => (
                ModelMount::Claim {
                    claim: claim.clone(),
                    mount_path: path.clone(),
                },
                false,
            ),
            (Some(_), _, Some(_)) => return Err(DeployError::ClaimWithRepo),
            (Some(_), None, None) => {
                deployed.model.path = Some(models_dir.join(&name).display().to_string());
                (ModelMount::InData, true)
            }
            (Some(_), Some(path), None) => {
                if !path.starts_with('/') {
                    return Err(DeployError::RelativePath { path: path.clone() });
                }
                let last = Path::new(path)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| name.clone());
                let mount = if Path::new(path).starts_with(DATA_DIR) {
                    ModelMount::InData
                } else {
                    ModelMount::DataSubPath {
                        mount_path: path.clone(),
                        sub_path: format!("models/{last}"),
                    }
                };
                (mount, true)
            }
        };
        // A commit id is pinned: a restart needs no answer from the Hub.
        let pinned = recipe.model.revision.as_deref().is_some_and(is_commit);
        if pulls && !pinned {
            warnings.push(format!(
                "`model.revision` is {}, a branch: every pod start asks the Hub which commit it is, so a new push changes what a restart serves (while the Hub is down, a restart serves the snapshot on the volume); pin a commit id",
                recipe.model.revision.as_deref().unwrap_or("unset (main)")
            ));
        }

        if let Some(first) = recipe.memory.oom_fallback.first() {
            warnings.push(format!(
                "`memory.oom_fallback` is applied by `sous serve` only: here the engine runs by itself, and an out-of-memory start is restarted with the same settings; if it happens, render again with `--set memory.gpu_utilization={first}` (the annotation `{OOM_ANNOTATION}` on the workload says so too)"
            ));
        }
        if recipe.memory.host_floor.is_some() {
            warnings.push(
                "`memory.host_floor` is kept by `sous serve` only: here the engine runs by itself, and nothing stops it before the node's memory runs low; a memory limit on the workload (`deploy.memory_limit`) is what bounds it".into(),
            );
        }
        // The KV cache's host tier lives in the engine's own memory: a limit below it
        // kills the engine once the tier fills; a request that does not count it lets
        // the scheduler place the pod where the memory is not.
        check_offload_limit(recipe)?;
        if let Some(offload) = recipe.memory.kv_offload_bytes {
            let offload_text = sous_engine::size::gib(offload);
            match &deploy.memory_request {
                // Unset: the pods ask for the tier at least, so that the scheduler
                // places them where it fits.
                None => {
                    let floor = sous_engine::recipe::Quantity::gibibytes_at_least(offload);
                    warnings.push(format!(
                        "`memory.kv_offload_bytes` keeps {offload_text} of KV in the engine's host memory: the pods request {} for it; the engine's own memory comes on top, which `deploy.memory_request` should add",
                        floor.text
                    ));
                    deployed.deploy.memory_request = Some(floor);
                }
                Some(r) if r.value < offload as f64 => warnings.push(format!(
                    "`memory.kv_offload_bytes` keeps {offload_text} of KV in the engine's host memory, more than `deploy.memory_request` ({}) asks for: set it to at least that plus the engine's own memory, so the pod lands where the memory is",
                    r.text
                )),
                Some(_) => {}
            }
        }
        let router = &deploy.router;
        if router.is_some() && router.has_default_image() {
            warnings.push(format!(
                "the router image {image} is the one `docker/router.Dockerfile` builds (no official image of {kind} is published): `docker build -f docker/router.Dockerfile --build-arg ROUTER={kind} --build-arg VERSION={version} -t {image} .`, or set `deploy.router.image`",
                image = router.image,
                kind = router.kind.as_str(),
                version = router.version,
            ));
        }
        if !router.is_some() && deploy.replicas > 1 {
            warnings.push(format!(
                "{} replicas with `deploy.router.kind = \"none\"`: a conversation's next turn lands on another replica most of the time and its prefix is computed again; `vllm-router` keeps each conversation where its cache is",
                deploy.replicas
            ));
        }
        if let Some(failures) = deploy.startup_failure_threshold {
            let budget = u64::from(failures) * deploy.startup_period.as_secs();
            let timeout = recipe.server.startup_timeout.as_secs();
            if budget < timeout {
                warnings.push(format!(
                    "the start-up probe gives up after {failures} x {}s = {budget}s, before `server.startup_timeout` ({timeout}s): Kubernetes restarts an engine that `sous serve` would still wait for; raise `deploy.startup_probe.failure_threshold` or lower the timeout",
                    deploy.startup_period.as_secs()
                ));
            }
        }

        let config_dir = PathBuf::from(CONFIG_DIR);
        let recipe_path = config_dir.join(RECIPE_FILE).display().to_string();
        let mut init = Vec::new();
        if pulls {
            init.push(Step {
                name: "pull",
                argv: vec![
                    SOUS_IN_IMAGE.into(),
                    "pull".into(),
                    "--recipe".into(),
                    recipe_path.clone(),
                ],
            });
        }
        let weights = match &recipe.quantize {
            Some(_) => {
                init.push(Step {
                    name: "quantize",
                    argv: vec![
                        SOUS_IN_IMAGE.into(),
                        "quantize".into(),
                        "--recipe".into(),
                        recipe_path.clone(),
                    ],
                });
                Some(paths::quantized_dir_in(
                    &Path::new(DATA_DIR).join("cache"),
                    &recipe.name,
                ))
            }
            None if recipe.engine.kind == EngineKind::Native => {
                deployed.model.path.as_ref().map(PathBuf::from)
            }
            None => None,
        };

        let ctx = RenderContext {
            instance_dir: config_dir.clone(),
            hub_cache: Path::new(DATA_DIR).join("huggingface/hub"),
            native_command: vec![
                SOUS_IN_IMAGE.into(),
                "serve".into(),
                "--engine-process".into(),
                "--recipe".into(),
            ],
            weights,
            // Kept on the data volume across restarts, keyed by the release and, where
            // the recipe pins the nodes' GPU model, by it.
            compile_cache: (deployed.engine.kind != EngineKind::Native).then(|| {
                let gpu = deploy
                    .node_selector
                    .get(GPU_PRODUCT_LABEL)
                    .cloned()
                    .unwrap_or_else(|| ANY_GPU.to_owned());
                CacheKey::new(deployed.engine.kind, &launch::cache_release(recipe), &[gpu])
                    .dir_in(&Path::new(DATA_DIR).join(launch::caches::DIR))
            }),
        };
        let engine = launch::render(&deployed, &ctx)?;
        warnings.extend(engine.warnings.iter().map(|w| w.message.clone()));

        let image = match (recipe.engine.kind, &recipe.engine.image) {
            (EngineKind::Native, _) => deploy.sous_image.clone(),
            (_, Some(image)) => image.clone(),
            (EngineKind::Vllm, None) => {
                let image = format!("vllm/vllm-openai:v{}", engine.version);
                warnings.push(format!(
                    "`engine.image` is not set: {image} is rendered, the official image of the release the flags are rendered for"
                ));
                image
            }
            (kind, None) => {
                return Err(DeployError::NoImage {
                    engine: kind.display_name(),
                });
            }
        };

        let mut config = BTreeMap::new();
        // `[deploy]` is left out: the init steps do not read it, and a change to it (a
        // replica count) must not roll the pods.
        let mut file = deployed.to_file();
        file.deploy = Default::default();
        let recipe_toml = toml::to_string(&file).map_err(|e| DeployError::Toml(e.to_string()))?;
        config.insert(
            RECIPE_FILE.to_owned(),
            format!(
                "# The resolved recipe `{}`, rendered by `sous deploy` for the init containers.\n{recipe_toml}",
                recipe.name
            ),
        );
        for file in &engine.files {
            let Some(file_name) = file.path.file_name() else {
                continue;
            };
            config.insert(file_name.to_string_lossy().into_owned(), file.contents.clone());
        }
        let hash = content_hash(&config);

        let gpus = recipe.gpus();

        let data = |sub: &str| format!("{DATA_DIR}/{sub}");
        let cache_env = BTreeMap::from([
            ("HOME".to_owned(), data("home")),
            ("HF_HOME".to_owned(), data("huggingface")),
            ("HF_HUB_CACHE".to_owned(), ctx.hub_cache.display().to_string()),
            ("SOUS_CACHE_DIR".to_owned(), data("cache")),
            ("SOUS_STATE_DIR".to_owned(), data("state")),
            ("XDG_CACHE_HOME".to_owned(), data("home/.cache")),
        ]);

        Ok(Plan {
            recipe: deployed,
            name,
            hash,
            config,
            init,
            engine,
            image,
            gpus,
            model_mount,
            cache_env,
            warnings,
            measured_start: None,
        })
    }

    /// The variables a secret provides, with whether the pod may start without them:
    /// the Hub token (optional) and the API key (required).
    pub fn secret_vars(&self) -> Vec<(String, bool)> {
        let mut vars = vec![(HF_TOKEN.to_owned(), true)];
        if let Some(var) = &self.recipe.server.api_key_env {
            vars.push((var.clone(), false));
        }
        vars
    }

    /// The engine's port.
    pub fn port(&self) -> u16 {
        self.recipe.server.port
    }

    /// The path the engine answers 200 on once it serves.
    pub fn health_path(&self) -> &'static str {
        HEALTH_PATH
    }

    /// How long one health request may take.
    pub fn health_timeout(&self) -> Duration {
        health_timeout(self.recipe.engine.kind)
    }

    /// Seconds between start-up probes (`deploy.startup_probe.period`).
    pub fn startup_period(&self) -> u64 {
        self.recipe.deploy.startup_period.as_secs().max(1)
    }

    /// Failed start-up probes before a restart: the recipe's; else [`MEASURED_FACTOR`]
    /// times the slowest start of this engine and release `sous serve` recorded here (at
    /// least [`MEASURED_FLOOR`] seconds); else as many as cover `server.startup_timeout`
    /// (180 for the default 30 minutes at 10 s).
    pub fn startup_failure_threshold(&self) -> u64 {
        let period = self.startup_period();
        match (self.recipe.deploy.startup_failure_threshold, &self.measured_start) {
            (Some(n), _) => u64::from(n),
            (None, Some((slowest, _, _))) => {
                ((slowest * MEASURED_FACTOR).max(MEASURED_FLOOR) / period as f64).ceil() as u64
            }
            (None, None) => self
                .recipe
                .server
                .startup_timeout
                .as_secs()
                .div_ceil(period)
                .max(1),
        }
    }

    /// Where the start-up probe's budget comes from, for [`STARTUP_ANNOTATION`].
    pub fn startup_note(&self) -> String {
        let period = self.startup_period();
        let threshold = self.startup_failure_threshold();
        let budget = format!("{threshold} x {period}s = {}s", threshold * period);
        match (self.recipe.deploy.startup_failure_threshold, &self.measured_start) {
            (Some(_), _) => format!("{budget}: deploy.startup_probe.failure_threshold"),
            (None, Some((slowest, count, gpu))) => format!(
                "{budget}: {MEASURED_FACTOR} times the slowest of {count} start(s) of {} {} that sous serve recorded on the machine that rendered this ({slowest:.1}s{})",
                self.recipe.engine.kind.as_str(),
                self.engine.version,
                gpu.as_deref().map(|g| format!(", {g}")).unwrap_or_default()
            ),
            (None, None) => format!(
                "{budget}: covers server.startup_timeout; no start of this engine and release was recorded here (serve the recipe once, or run sous bench coldstart, to size it from measured starts)"
            ),
        }
    }

    /// What the workload's [`OOM_ANNOTATION`] says: the one line that applies the next
    /// `memory.oom_fallback` step, when the recipe has one.
    pub fn oom_fallback_note(&self) -> Option<String> {
        let next = self.recipe.memory.oom_fallback.first()?;
        let now = self
            .recipe
            .memory
            .gpu_utilization
            .map_or_else(|| "unset".to_owned(), |u| u.to_string());
        Some(format!(
            "memory.gpu_utilization is {now}; if the engine runs out of memory at start-up, render again with `sous deploy render --set memory.gpu_utilization={next}` (same --recipe and --out) and apply"
        ))
    }

    /// Seconds between SIGTERM and SIGKILL, the pre-stop pause included.
    pub fn termination_grace(&self) -> u64 {
        self.recipe.server.stop_grace.as_secs() + PRE_STOP_SECONDS
    }

    /// Seconds a rollout may take: the first download, then the start-up.
    pub fn progress_deadline(&self) -> u64 {
        (self.recipe.deploy.download_timeout + self.recipe.server.startup_timeout).as_secs()
    }
}

/// Refuses a `deploy.memory_limit` below `memory.kv_offload_bytes`, for every target:
/// the KV cache's host tier lives in the engine's own memory, and the engine would be
/// killed once it fills.
pub fn check_offload_limit(recipe: &Recipe) -> Result<(), DeployError> {
    match (recipe.memory.kv_offload_bytes, &recipe.deploy.memory_limit) {
        (Some(offload), Some(limit)) if limit.value < offload as f64 => Err(DeployError::OffloadAboveLimit {
            limit: limit.text.clone(),
            offload: sous_engine::size::gib(offload),
        }),
        _ => Ok(()),
    }
}

/// The engine's arguments as strings: a literal written by `literal` (escaped for the
/// target's own expansion), a secret argument by `secret` (a reference to a variable).
pub fn argv_with(
    args: &[Arg],
    literal: impl Fn(&str) -> String,
    secret: impl Fn(&str) -> String,
) -> Vec<String> {
    args.iter()
        .map(|a| match a {
            Arg::Lit(s) => literal(s),
            Arg::FromEnv(var) => secret(var),
        })
        .collect()
}

/// A literal for a field Kubernetes and compose expand (`$(VAR)`, `${VAR}`): each `$`
/// doubled, which both read back as one.
pub fn escape_dollars(text: &str) -> String {
    text.replace('$', "$$")
}

/// A hash of the files, in name order, that changes when any byte of them does: 12
/// hex digits of SHA-256 over `name NUL contents NUL` for each.
pub fn content_hash(files: &BTreeMap<String, String>) -> String {
    let mut hasher = Sha256::new();
    for (name, contents) in files {
        hasher.update(name.as_bytes());
        hasher.update([0]);
        hasher.update(contents.as_bytes());
        hasher.update([0]);
    }
    hex::encode(hasher.finalize())[..12].to_owned()
}
