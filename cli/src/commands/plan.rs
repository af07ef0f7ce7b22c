//! `sous plan --recipe FILE [--gpu NAME | --gpu-memory SIZE] [--json]`: whether the
//! recipe fits the machine, the KV cache its engine will size (tokens and concurrency,
//! as the engine's start-up line will print them), and a ceiling on single-stream
//! decode, from the model's config and safetensors headers, without a GPU and without
//! the weights. Planned for this machine (no `--gpu`), the GPU is the one the driver
//! reports, and the memory fraction is checked against what is free now, as `sous
//! serve` checks it before a launch.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use serde_json::json;
use sous::hub::config::HubConfig;
use sous_engine::device::Preflight;
use sous_engine::plan::{self, Hardware, Plan};
use sous_engine::recipe::EngineKind;
use sous_engine::size::{ByteSize, gib};

use super::{OverrideArgs, RecipeArg, display, load_recipe};
use crate::failure::UserError;
use crate::shell::Shell;

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  sous plan --recipe recipes/local/smollm2-135m.toml\n  sous plan --recipe recipes/dgx-spark/qwen3.8-27b-nvfp4.toml --gpu dgx-spark\n  sous plan --recipe recipes/titan/qwen3.8-flash-next.toml --gpu-memory 96GiB --json"
)]
pub struct PlanArgs {
    #[command(flatten)]
    recipe: RecipeArg,
    /// The machine, by name: gb10 (dgx-spark), rtx-pro-6000, rtx-5090, h100, h200, b200,
    /// gb200, or cpu (this machine's RAM). Default: this machine, its GPU as the driver
    /// reports it now (free memory included), or cpu for the native engine.
    #[arg(long, value_name = "NAME", conflicts_with = "gpu_memory")]
    gpu: Option<String>,
    /// A GPU sous has no entry for, by its memory: `48GiB`, `80GB`.
    #[arg(long, value_name = "SIZE")]
    gpu_memory: Option<ByteSize>,
    /// The host memory one instance may use (RAM per GPU), which a host tier of the KV
    /// cache (`memory.kv_offload_bytes`) is checked against: `100GiB`.
    #[arg(long, value_name = "SIZE")]
    host_memory: Option<ByteSize>,
    /// Print the plan as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    overrides: OverrideArgs,
}

/// `hardware` with its read bandwidth measured when it is this machine's CPU (the native
/// engine's probe, `SOUS_READ_BANDWIDTH`), for the decode ceiling.
fn measured(hardware: Hardware) -> Hardware {
    if !hardware.cpu {
        return hardware;
    }
    let bandwidth_gbs = sous_engine::native::read_bandwidth().map(|b| b.median_gb_per_s);
    Hardware {
        bandwidth_gbs,
        ..hardware
    }
}

pub fn exec(args: PlanArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let loaded = load_recipe(&args.recipe.recipe, &args.overrides)?;
    for w in &loaded.warnings {
        shell.warn(&w.message);
    }
    let recipe = loaded.recipe;
    // Planned for this machine (no --gpu, no --gpu-memory): its GPUs as the driver
    // reports them now, and the memory fraction checked against what is free.
    let mut devices = Vec::new();
    let this_machine = args.gpu.is_none() && args.gpu_memory.is_none();
    let hardware = match (&args.gpu, args.gpu_memory) {
        (Some(name), _) => measured(Hardware::named(name)?),
        (None, Some(size)) => Hardware::with_memory(size.0),
        (None, None) if recipe.engine.kind == EngineKind::Native => measured(Hardware::this_cpu()?),
        (None, None) => {
            let why = match sous::devices::for_recipe(&recipe) {
                Ok(found) if !found.is_empty() => {
                    devices = found;
                    String::new()
                }
                Ok(_) => "the driver lists no GPU here".to_owned(),
                Err(why) => why,
            };
            match devices.iter().min_by_key(|d| d.free_bytes) {
                Some(device) => Hardware::from_device(device),
                None => {
                    return Err(UserError::new(
                        format!("which machine? a plan needs its memory, and this one's GPU cannot be asked ({why})"),
                        Some(&format!(
                            "pass --gpu NAME ({}) or --gpu-memory SIZE",
                            plan::hardware::names().join(", ")
                        )),
                    )
                    .into());
                }
            }
        }
    };
    let preflight = if this_machine {
        sous_engine::serve::preflight::preflight(&recipe, &devices)?
    } else {
        None
    };
    let hardware = match args.host_memory {
        Some(size) => hardware.with_host_memory(size.0),
        None => hardware,
    };
    let runtime = super::runtime()?;
    let hub = HubConfig::from_env();
    let files = runtime
        .block_on(sous::plan::model_files(&recipe, &hub))
        .with_context(|| format!("recipe {}", display(&args.recipe.recipe)))?;
    let model = sous::plan::model(&files, &recipe)?;
    let plan = plan::plan(&recipe, &model, &hardware)?;
    if args.json {
        let mut value = serde_json::to_value(&plan)?;
        value["recipe"] = json!(recipe.name);
        value["model"] = json!(files.from);
        value["devices"] = json!(devices);
        value["preflight"] = json!(preflight);
        shell.data(&serde_json::to_string_pretty(&value)?)?;
    } else {
        shell.data(&render(
            &recipe.name,
            &files.from,
            &hardware,
            &plan,
            preflight.as_ref(),
        ))?;
    }
    for w in &plan.warnings {
        shell.warn(w);
    }
    // `sous serve` would refuse to start: no fraction fits what is free now.
    let refused = preflight
        .as_ref()
        .is_some_and(|p| !p.fits && p.fallback.is_none());
    Ok(if plan.fits && !refused {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The plan as a table and a sentence.
fn render(
    recipe: &str,
    from: &str,
    hardware: &Hardware,
    plan: &Plan,
    preflight: Option<&Preflight>,
) -> String {
    let mut rows: Vec<(String, String)> = vec![
        ("recipe".into(), format!("{recipe}, {}", plan.engine)),
        (
            "machine".into(),
            format!(
                "{} ({}, {}{})",
                hardware.name,
                hardware.description,
                gib(hardware.memory),
                if hardware.unified && !hardware.cpu {
                    " of unified memory, shared with the CPU and the OS"
                } else {
                    ""
                }
            ),
        ),
        ("model".into(), from.to_owned()),
        (
            "layers".into(),
            format!(
                "{} ({} with a cache that grows with the context)",
                plan.layers, plan.growing_layers
            ),
        ),
        (
            "weights".into(),
            format!(
                "{}{}{}",
                gib(plan.weight_bytes),
                if hardware.cpu { "" } else { " per GPU" },
                if plan.host_weight_bytes > 0 {
                    format!(
                        ", and {} in host memory (`memory.host_weights`)",
                        gib(plan.host_weight_bytes)
                    )
                } else {
                    String::new()
                }
            ),
        ),
    ];
    if let Some(p) = preflight {
        rows.push(("memory now".into(), p.describe()));
    }
    let budget = if plan.budget.exact { "" } else { " (estimated)" };
    rows.push((
        "KV budget".into(),
        format!("{}{budget}", gib(plan.budget.kv_bytes)),
    ));
    for step in &plan.budget.steps {
        rows.push((String::new(), format!("  {step}")));
    }
    rows.push((
        "KV per token".into(),
        format!(
            "{} B per layer × {} layers = {} B per token",
            group(plan.bytes_per_token_per_layer),
            plan.growing_layers,
            group(plan.bytes_per_token_per_layer * plan.growing_layers as u64)
        ),
    ));
    rows.push(("block".into(), format!("{} tokens", plan.block_size)));
    for (i, step) in plan.layout.iter().enumerate() {
        rows.push((if i == 0 { "layout".into() } else { String::new() }, step.clone()));
    }
    rows.push((
        "KV cache".into(),
        format!(
            "{} tokens; maximum concurrency for {} tokens per request: {:.2}x",
            group(plan.kv_tokens),
            group(plan.max_model_len),
            plan.max_concurrency
        ),
    ));
    if let Some(tier) = &plan.host_tier {
        rows.push((
            "host tier".into(),
            format!(
                "{} tokens more in {} of host memory (`memory.kv_offload_bytes`): prefixes the GPU's cache evicts are loaded back from there instead of computed again",
                group(tier.kv_tokens),
                gib(tier.kv_bytes)
            ),
        ));
        rows.push((
            String::new(),
            format!(
                "a request of {} tokens runs from the GPU's cache; its prefix, once evicted, is {} to load back",
                group(plan.max_model_len),
                gib(tier.request_bytes)
            ),
        ));
    }
    let host_kv = plan.host_tier.as_ref().map_or(0, |t| t.kv_bytes);
    if host_kv + plan.host_weight_bytes > 0 {
        let parts: Vec<String> = [
            (host_kv, "the host tier"),
            (plan.host_weight_bytes, "the host-side weights"),
        ]
        .iter()
        .filter(|(bytes, _)| *bytes > 0)
        .map(|(bytes, what)| format!("{} for {what}", gib(*bytes)))
        .collect();
        rows.push((
            "host memory".into(),
            match hardware.host_memory {
                Some(host) => format!(
                    "{} per instance, of {}; the engine's own memory comes on top",
                    join_and(&parts),
                    gib(host)
                ),
                None => format!(
                    "{} per instance; the machine's is unknown (`--host-memory`)",
                    join_and(&parts)
                ),
            },
        ));
    }
    if let Some(ceiling) = plan.decode_ceiling_tok_s {
        rows.push((
            "decode".into(),
            match (hardware.cpu, hardware.bandwidth_gbs) {
                (true, Some(b)) => format!(
                    "at most {ceiling:.0} tok/s single stream at a full context (read bandwidth {b:.1} GB/s, measured now)"
                ),
                _ => format!("at most {ceiling:.0} tok/s single stream at a full context (memory bandwidth bound)"),
            },
        ));
    }
    if let Some(ceiling) = plan.decode_ceiling_speculative_tok_s {
        rows.push((
            String::new(),
            format!(
                "at most {ceiling:.0} tok/s with speculative decoding if every drafted token were accepted"
            ),
        ));
    }
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out: String = rows.iter().map(|(k, v)| format!("{k:width$}  {v}\n")).collect();
    out.push('\n');
    if let Some(short) = &plan.shortfall {
        let parts: Vec<String> = short
            .parts
            .iter()
            .map(|p| {
                format!(
                    "{} {}{}",
                    p.what,
                    gib(p.bytes),
                    if p.estimated { " (estimated)" } else { "" }
                )
            })
            .collect();
        out.push_str(&format!(
            "Does not fit: {} need {}, {} more than the {} of {}.\n",
            join_and(&parts),
            gib(short.needed_bytes),
            gib(short.needed_bytes - short.memory_bytes),
            gib(short.memory_bytes),
            if hardware.cpu {
                "this machine's RAM"
            } else {
                "one GPU"
            }
        ));
    } else if plan.fits {
        out.push_str(&format!(
            "Fits: {} tokens of KV cache hold {:.2} requests of {} tokens at once.\n",
            group(plan.kv_tokens),
            plan.max_concurrency,
            group(plan.max_model_len)
        ));
    } else {
        out.push_str(&format!(
            "Does not fit: one request of {} tokens needs more KV cache than the {} there is.\n",
            group(plan.max_model_len),
            gib(plan.budget.kv_bytes)
        ));
    }
    for advice in &plan.advice {
        out.push_str(&format!("  - {advice}\n"));
    }
    out.trim_end().to_owned()
}

/// `a`, `a and b`, `a, b and c`.
fn join_and(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// `604705` → `604,705`, as the engines log it.
fn group(n: u64) -> String {
    sous_engine::dialect::log::vllm::thousands(n as usize)
}
