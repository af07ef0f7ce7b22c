//! `sous plan`'s inputs: a recipe's model as the planner needs it (its `config.json`
//! and the safetensors headers: names, shapes and sizes, never the weights), from the
//! recipe's directory, the Hub cache, or the Hub itself (the config, then each shard's
//! header by two range requests), and the weights a planned `[quantize]` will write,
//! sized by the quantizer's own decisions and layout. The arithmetic is
//! [`sous_engine::plan`].

use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use sous_engine::checkpoint::index::Shards;
use sous_engine::diagnose::{Class, Diagnose};
use sous_engine::native::{self, KvDtype, Settings};
use sous_engine::plan::{Model, Shape, ShapeError};
use sous_engine::recipe::{
    DEFAULT_REVISION, EmbeddingDtype, EngineKind, Recipe, host_weight_glob, is_host_weight,
};

use crate::hub::api::{HubClient, HubError};
use crate::hub::cache::RepoCache;
use crate::hub::config::HubConfig;
use crate::quantize::{self, QuantizeError, SourceTensor, header_tensors};

/// The safetensors crate's own limit on a header.
const MAX_HEADER: u64 = 100_000_000;

/// A model's config and tensor list, and where they were read.
#[derive(Debug, Clone)]
pub struct ModelFiles {
    /// `config.json`.
    pub config: Map<String, Value>,
    /// Every tensor of every shard (sizes and shapes only).
    pub tensors: Vec<SourceTensor>,
    /// Where they came from: a directory, or `repo@commit` on the Hub.
    pub from: String,
    /// The directory, when the files are on this machine.
    pub dir: Option<PathBuf>,
}

/// Why the model could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Nowhere to read it from.
    #[error("the recipe's model is not on this machine{}", if *.offline { " and the Hub is offline" } else { "" })]
    Missing {
        /// Whether the Hub was not asked because of `HF_HUB_OFFLINE`.
        offline: bool,
    },
    /// A file that is not what it should be.
    #[error("{path}: {message}")]
    Bad {
        /// The file or URL.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// Reading a local file.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The Hub.
    #[error(transparent)]
    Hub(#[from] HubError),
    /// The config.
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// Sizing a planned quantization.
    #[error(transparent)]
    Quantize(#[from] QuantizeError),
}

impl Diagnose for ModelError {
    fn class(&self) -> Class {
        match self {
            ModelError::Hub(e) => e.class(),
            ModelError::Quantize(e) => e.class(),
            _ => Class::User,
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            ModelError::Missing { .. } => Some(
                "set `model.path` to a directory with config.json and *.safetensors, run `sous pull --recipe FILE`, or let sous reach the Hub (it reads the config and the headers only)".into(),
            ),
            ModelError::Hub(e) => e.hint(),
            ModelError::Quantize(e) => e.hint(),
            _ => None,
        }
    }
}

/// Reads the model of `recipe`: its directory, else the Hub cache, else the Hub.
pub async fn model_files(recipe: &Recipe, hub: &HubConfig) -> Result<ModelFiles, ModelError> {
    if let Some(path) = &recipe.model.path
        && Path::new(path).join("config.json").is_file()
    {
        return local(Path::new(path));
    }
    let Some(repo) = &recipe.model.repo else {
        return Err(ModelError::Missing { offline: false });
    };
    let revision = recipe.model.revision.as_deref().unwrap_or(DEFAULT_REVISION);
    let cache = RepoCache::new(&hub.cache_dir, repo);
    if let Some(commit) = cache.read_ref(revision) {
        let dir = cache.snapshot(&commit);
        if dir.join("config.json").is_file() {
            return local(&dir);
        }
    }
    if hub.offline {
        return Err(ModelError::Missing { offline: true });
    }
    remote(&HubClient::new(hub.clone())?, repo.as_str(), revision).await
}

fn local(dir: &Path) -> Result<ModelFiles, ModelError> {
    let config = read_config(
        &std::fs::read(dir.join("config.json")).map_err(|source| ModelError::Io {
            path: dir.join("config.json"),
            source,
        })?,
        &dir.join("config.json").display().to_string(),
    )?;
    let shards = Shards::find(dir).map_err(|e| ModelError::Bad {
        path: dir.display().to_string(),
        message: e.to_string(),
    })?;
    let mut tensors = Vec::new();
    for (i, name) in shards.files.iter().enumerate() {
        let path = dir.join(name);
        let io = |source| ModelError::Io {
            path: path.clone(),
            source,
        };
        let mut file = std::fs::File::open(&path).map_err(io)?;
        let mut len = [0u8; 8];
        file.read_exact(&mut len).map_err(io)?;
        let name = path.display().to_string();
        let n = header_length(u64::from_le_bytes(len), &name)?;
        let mut header = vec![0u8; n as usize];
        file.read_exact(&mut header).map_err(io)?;
        tensors.append(&mut shard_tensors(&header, i, &name)?);
    }
    Ok(ModelFiles {
        config,
        tensors,
        from: dir.display().to_string(),
        dir: Some(dir.to_path_buf()),
    })
}

async fn remote(client: &HubClient, repo: &str, revision: &str) -> Result<ModelFiles, ModelError> {
    let commit = client.revision(repo, revision).await?.sha;
    let tree = client.tree(repo, &commit).await?;
    let get = |path: &str, range: Option<(u64, u64)>| {
        let url = client.resolve_url(repo, &commit, path);
        let mut request = client.authorize(client.http().get(&url));
        if let Some((from, to)) = range {
            request = request.header(reqwest::header::RANGE, format!("bytes={from}-{to}"));
        }
        async move {
            let response = request.send().await.map_err(|e| ModelError::Bad {
                path: url.clone(),
                message: e.to_string(),
            })?;
            if !response.status().is_success() {
                return Err(ModelError::Bad {
                    message: format!("the Hub answered {}", response.status()),
                    path: url,
                });
            }
            response.bytes().await.map_err(|e| ModelError::Bad {
                path: url,
                message: e.to_string(),
            })
        }
    };
    let config = read_config(
        &get("config.json", None).await?,
        &format!("{repo}@{commit}/config.json"),
    )?;
    let mut shards: Vec<&str> = tree
        .iter()
        .filter(|e| e.kind == "file" && e.path.ends_with(".safetensors") && !e.path.contains('/'))
        .map(|e| e.path.as_str())
        .collect();
    shards.sort_unstable();
    let mut tensors = Vec::new();
    for (i, shard) in shards.iter().enumerate() {
        let len = get(shard, Some((0, 7))).await?;
        let n = <[u8; 8]>::try_from(&len[..])
            .map(u64::from_le_bytes)
            .map_err(|_| ModelError::Bad {
                path: (*shard).to_owned(),
                message: "the Hub did not answer the range request for the header's length".into(),
            })?;
        let n = header_length(n, shard)?;
        let header = get(shard, Some((8, 8 + n - 1))).await?;
        tensors.append(&mut shard_tensors(&header, i, shard)?);
    }
    Ok(ModelFiles {
        config,
        tensors,
        from: format!("{repo}@{}", &commit[..commit.len().min(12)]),
        dir: None,
    })
}

/// A safetensors header length, refused past the safetensors crate's own limit.
fn header_length(n: u64, path: &str) -> Result<u64, ModelError> {
    if n > MAX_HEADER {
        return Err(ModelError::Bad {
            path: path.to_owned(),
            message: "not a safetensors file (bad header length)".into(),
        });
    }
    Ok(n)
}

/// The tensors of shard `index`, from its header (data after the 8 + header bytes).
fn shard_tensors(header: &[u8], index: usize, path: &str) -> Result<Vec<SourceTensor>, ModelError> {
    let data_start = 8 + header.len() as u64;
    header_tensors(header, index, data_start)
        .map(|(tensors, _)| tensors)
        .map_err(|message| ModelError::Bad {
            path: path.to_owned(),
            message,
        })
}

fn read_config(bytes: &[u8], path: &str) -> Result<Map<String, Value>, ModelError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ModelError::Bad {
            path: path.to_owned(),
            message: "not a JSON object".into(),
        }),
        Err(e) => Err(ModelError::Bad {
            path: path.to_owned(),
            message: e.to_string(),
        }),
    }
}

/// What the planner needs from `files` for `recipe`: the layers, the weights the
/// engine will load (what a planned `[quantize]` will write), and the native engine's
/// bytes per token.
pub fn model(files: &ModelFiles, recipe: &Recipe) -> Result<Model, ModelError> {
    let native_kv = (recipe.engine.kind == EngineKind::Native).then(|| native::kv_dtype(recipe));
    model_with(files, recipe, native_kv)
}

/// [`model`], with the native engine's KV dtype already resolved: `native_kv` is `None`
/// for another engine, which has no native bytes per token.
fn model_with(files: &ModelFiles, recipe: &Recipe, native_kv: Option<KvDtype>) -> Result<Model, ModelError> {
    let config = Value::Object(files.config.clone());
    let shape = Shape::from_config(&config)?;
    let original: u64 = files.tensors.iter().map(|t| t.len).sum();
    let experts: u64 = files
        .tensors
        .iter()
        .filter(|t| t.name.contains(".experts.") && !t.name.contains("shared_expert"))
        .map(|t| t.len)
        .sum();
    let mut weight_bytes = match &recipe.quantize {
        Some(q) => quantize::planned_bytes(&files.config, &files.tensors, q.format, &q.ignore)?,
        None => original,
    };
    if recipe.engine.kind == EngineKind::Native && recipe.memory.embedding_dtype == Some(EmbeddingDtype::Q8_0)
    {
        weight_bytes = weight_bytes.saturating_sub(q8_0_saving(files, recipe)?);
    }
    // Weights the engine keeps on the host, as the checkpoint stores them: the
    // quantizer keeps embeddings and the like, which is what engines offload, in 16 bits.
    let globs: Vec<_> = recipe
        .memory
        .host_weights
        .iter()
        .filter_map(|g| host_weight_glob(g).ok())
        .collect();
    let host_weight_bytes = files
        .tensors
        .iter()
        .filter(|t| is_host_weight(&globs, &t.name))
        .map(|t| t.len)
        .sum::<u64>()
        .min(weight_bytes);
    weight_bytes -= host_weight_bytes;
    let expert_bytes = if original == 0 {
        0
    } else {
        (experts as f64 * weight_bytes as f64 / original as f64) as u64
    };
    let native_config =
        native::config::ModelConfig::parse(&config.to_string(), Path::new("config.json")).ok();
    // Drafting with the checkpoint's MTP head adds its layer's keys and values.
    let mtp = recipe
        .serving
        .speculative
        .as_ref()
        .and_then(|s| s.method.as_deref())
        .is_some_and(sous_engine::recipe::is_mtp)
        && files.tensors.iter().any(|t| t.name == "mtp.fc.weight");
    let native_kv_per_token = native_kv.and_then(|dtype| {
        native_config.as_ref().map(|c| {
            native::model::kv_bytes_per_token(c, dtype)
                + if mtp {
                    native::model::kv_bytes_per_layer(c, dtype)
                } else {
                    0
                }
        })
    });
    let native_state_per_sequence = native_config
        .as_ref()
        .and_then(|c| c.linear.as_ref())
        .map_or(0, native::model::LinearStates::bytes_per_sequence);
    Ok(Model {
        shape,
        weight_bytes,
        expert_bytes,
        native_kv_per_token,
        native_state_per_sequence,
        host_weight_bytes,
    })
}

/// The bytes the native engine saves with `memory.embedding_dtype = "q8_0"`: it holds
/// the token embedding, and an lm_head stored apart that the quantization leaves in
/// floats, as Q8_0 (`Packed::q8_0`) instead of as stored. A matrix whose rows are not
/// whole blocks of 32 saves nothing here (the engine refuses it at load).
fn q8_0_saving(files: &ModelFiles, recipe: &Recipe) -> Result<u64, ModelError> {
    const EMBED: &str = "model.embed_tokens.weight";
    const HEAD: &str = "lm_head.weight";
    let kept = match &recipe.quantize {
        Some(q) => quantize::planned_kept(&files.config, &files.tensors, &q.ignore)?,
        None => files.tensors.iter().map(|t| t.name.clone()).collect(),
    };
    let float = |t: &&SourceTensor| {
        use safetensors::Dtype;
        matches!(t.dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16)
            && t.shape.len() == 2
            && t.shape[1].is_multiple_of(sous_kernels::formats::q8::BLOCK)
    };
    Ok(files
        .tensors
        .iter()
        .filter(|t| t.name == EMBED || (t.name == HEAD && kept.contains(&t.name)))
        .filter(float)
        .map(|t| {
            t.len
                .saturating_sub(sous_kernels::gemm::Packed::q8_0_bytes(t.shape[0], t.shape[1]))
        })
        .sum())
}

/// The KV tokens `sous plan` predicts for the native engine serving the checkpoint in
/// `settings.model_dir` with `settings` (resolved once by the build step, which the
/// engine's own start-up resolves alike), for `sous serve` to show beside the engine's
/// own figure; `None` where the prediction would be a guess (a budget that depends on
/// the weights' size in memory).
pub fn predicted_native_tokens(recipe: &Recipe, settings: &Settings) -> Option<u64> {
    let kv = settings.kv();
    if kv.memory_fraction.is_some() {
        return None;
    }
    let files = local(&settings.model_dir).ok()?;
    let mut served = recipe.clone();
    served.quantize = None;
    let model = model_with(&files, &served, Some(kv.dtype)).ok()?;
    let hardware = sous_engine::plan::Hardware::this_cpu().ok()?;
    sous_engine::plan::plan_with(&served, &kv, &model, &hardware)
        .ok()
        .map(|p| p.kv_tokens)
}
