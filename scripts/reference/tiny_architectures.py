#!/usr/bin/env python3
"""Tiny random MoE and hybrid (Gated DeltaNet) models with reference outputs, made by transformers.

What it writes under OUT (tests/fixtures/architectures/ in the repository; CI never runs this):

- one directory per architecture (qwen3_moe, qwen2_moe, mixtral, qwen3_next, qwen3_5,
  qwen3_5_moe): the files `model.save_pretrained(dir, safe_serialization=True)` writes
  (config.json, generation_config.json, model.safetensors; float32), for a model that
  transformers itself builds from a small config, plus reference.json.
- for each MoE model, a second directory with the experts in the other layout than the one
  save_pretrained wrote. transformers 5 holds experts fused in memory
  (`mlp.experts.gate_up_proj` [experts, 2 * intermediate, hidden], gate rows first, and
  `mlp.experts.down_proj` [experts, hidden, intermediate]) and save_pretrained converts them
  back to the original checkpoints' one-tensor-per-expert names, so the variant
  `<name>-fused` holds the model's own state dict (fused experts, in-memory names). Same
  config.json and reference.json; the script loads the variant with transformers and checks
  that it gives the same numbers.

The weights are not transformers' initialisation (near-uniform logits, zero or one norm
weights, degenerate routing): every parameter is redrawn from a seeded generator, and seeds
are tried in turn until the model passes the checks in `experts_spread` and `problems`
(spread logits, a top-2 logit gap above 1e-3 at every greedy step, a router top-k logit margin
above 1e-3, every expert chosen by some but not all of case 0's tokens in every MoE layer).
reference.json's made_by.seed is the seed that passed.

reference.json, computed in float32 with eager attention on the CPU:

- cases: two prompts (9 and 21 random ids from a seeded generator) with the log-probability
  of each prompt token given the ones before it (full forward, no cache; null for the first),
  the top 5 logits at the last prompt position, 12 greedy tokens from `model.generate`
  (KV / recurrent cache on, no EOS) with their log-probabilities, and the smallest top-2
  logit gap over the greedy steps.
- layer_outputs: for case 0, the hidden state each decoder layer outputs, flattened
  row-major [tokens * hidden].
- expert_counts (MoE only): for case 0 and each MoE layer (moe_layers lists their indices),
  how many prompt tokens chose each expert.

The script also reloads every directory it wrote with `from_pretrained` and checks that the
reloaded model reproduces reference.json, and that cached generation agrees with a full
forward over prompt + greedy tokens.

Set-up and run (outside the repository's build; pinned versions: torch 2.15.0,
transformers 5.17.0, safetensors 0.8.0, numpy 2.4.6; no GPU or network needed):

    python3 -m venv /work/venv-ref
    /work/venv-ref/bin/pip install torch==2.15.0 transformers==5.17.0 safetensors numpy
    /work/venv-ref/bin/python scripts/reference/tiny_architectures.py tests/fixtures/architectures

Reruns with the same versions give the same bytes.
"""

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import (
    GenerationConfig,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3_5ForCausalLM,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

SCRIPT = "scripts/reference/tiny_architectures.py"
REQUIRED_TRANSFORMERS = "5.17.0"

VOCAB = 256
HIDDEN = 64

# Sizes shared by every model. qwen2_moe leaves head_dim out (its config has no such field;
# hidden_size / num_attention_heads = 16 is what it uses).
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=4,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)
HEAD_DIM = dict(head_dim=16)
DENSE_MLP = dict(intermediate_size=96)
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
LINEAR_ATTENTION = dict(
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
)
ROPE = dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0})

# directory name -> (config class, model class, config arguments)
MODELS = {
    "qwen3_moe": (
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
        dict(**COMMON, **HEAD_DIM, **DENSE_MLP, **MOE, **ROPE,
             norm_topk_prob=True, mlp_only_layers=[1], decoder_sparse_step=1),
    ),
    "qwen2_moe": (
        Qwen2MoeConfig,
        Qwen2MoeForCausalLM,
        dict(**COMMON, **DENSE_MLP, **MOE, **ROPE,
             norm_topk_prob=False, shared_expert_intermediate_size=48, decoder_sparse_step=1),
    ),
    # Mixtral's experts are intermediate_size wide (it has no dense MLP).
    "mixtral": (
        MixtralConfig,
        MixtralForCausalLM,
        dict(**COMMON, **HEAD_DIM, **ROPE,
             intermediate_size=32, num_local_experts=8, num_experts_per_tok=2),
    ),
    # The hybrids keep their default partial_rotary_factor (0.25) and full_attention_interval
    # (4): layer_types = 3 x linear_attention, then full_attention.
    "qwen3_next": (
        Qwen3NextConfig,
        Qwen3NextForCausalLM,
        dict(**COMMON, **HEAD_DIM, **DENSE_MLP, **MOE, **LINEAR_ATTENTION,
             norm_topk_prob=True, shared_expert_intermediate_size=48, mlp_only_layers=[1],
             decoder_sparse_step=1),
    ),
    "qwen3_5": (
        Qwen3_5TextConfig,
        Qwen3_5ForCausalLM,
        dict(**{**COMMON, "tie_word_embeddings": True}, **HEAD_DIM, **DENSE_MLP, **LINEAR_ATTENTION),
    ),
    "qwen3_5_moe": (
        Qwen3_5MoeTextConfig,
        Qwen3_5MoeForCausalLM,
        dict(**COMMON, **HEAD_DIM, **MOE, **LINEAR_ATTENTION, shared_expert_intermediate_size=48),
    ),
}

PROMPT_SEED = 1234
PROMPT_LENGTHS = (9, 21)
MAX_NEW_TOKENS = 12
TOP_LOGITS = 5

# What a model must pass to be kept (see find_model).
MIN_TOP2_GAP = 1e-3
MIN_ROUTER_GAP = 1e-3
MIN_LOGIT_STD = 1.0
MAX_SEEDS = 20000

# How the weights are redrawn (see perturb).
NORM_NOISE = 0.1
BIAS_STD = 0.2
ROUTER_SCALE = 2.0
LM_HEAD_SCALE = 2.0
TIED_EMBEDDING_STD = 0.35


def build(name, seed):
    """transformers' own model for `name`, with every parameter redrawn from `seed`."""
    config_class, model_class, kwargs = MODELS[name]
    config = config_class(**kwargs)
    config.dtype = torch.float32
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"  # the per-expert loop, not grouped_mm
    torch.manual_seed(seed)
    model = model_class(config).to(torch.float32).eval()
    perturb(model, seed)
    return model


@torch.no_grad()
def perturb(model, seed):
    """Redraws every parameter so that norms, routing, decay and gates all matter.

    Matrices (and stacked expert matrices, and the depthwise conv1d [channels, 1, kernel])
    are N(0, 1/fan_in) with fan_in the last dimension; routers are ROUTER_SCALE times that
    (decisive top-k), lm_head LM_HEAD_SCALE times (logit std about 2). Norm weights are their
    default (0 for the zero-centred (1 + w) norms, 1 for plain ones) + N(0, NORM_NOISE).
    A_log = log(U(0.1, 1)) and dt_bias ~ N(0, 0.5) put the DeltaNet decay exp(g) between about
    0.1 and 0.99 (median about 0.7), and beta = sigmoid(b) between about 0.05 and 0.97.
    """
    gen = torch.Generator().manual_seed(seed)
    tied = model.config.tie_word_embeddings

    def randn(shape):
        return torch.randn(shape, generator=gen, dtype=torch.float32)

    for name, param in model.named_parameters():  # tied lm_head is not listed separately
        leaf = name.rsplit(".", 1)[-1]
        shape = param.shape
        if name.endswith("embed_tokens.weight"):
            new = randn(shape) * (TIED_EMBEDDING_STD if tied else 1.0)
        elif name == "lm_head.weight":
            new = randn(shape) * (LM_HEAD_SCALE / math.sqrt(shape[-1]))
        elif leaf == "A_log":
            new = torch.empty(shape).uniform_(0.1, 1.0, generator=gen).log()
        elif leaf == "dt_bias":
            new = randn(shape) * 0.5
        elif leaf == "bias":
            new = randn(shape) * BIAS_STD
        elif param.dim() == 1 and "norm" in name:
            new = param + randn(shape) * NORM_NOISE
        elif param.dim() >= 2:
            scale = ROUTER_SCALE if name.endswith("mlp.gate.weight") else 1.0
            new = randn(shape) * (scale / math.sqrt(shape[-1]))
        else:
            raise ValueError(f"no rule to redraw parameter {name} {tuple(shape)}")
        param.copy_(new)


def moe_routers(model):
    """(layer index, router module) for every MoE layer."""
    return [
        (i, layer.mlp.gate)
        for i, layer in enumerate(model.model.layers)
        if hasattr(layer.mlp, "experts")
    ]


def make_prompts():
    gen = torch.Generator().manual_seed(PROMPT_SEED)
    return [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def floats(tensor):
    """Exact float32 values as Python floats (JSON numbers that round-trip to the same f32)."""
    return [float(x) for x in tensor.detach().to(torch.float32).reshape(-1).tolist()]


def top2_gaps(logits):
    top2 = logits.topk(2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


@torch.no_grad()
def compute_reference(model, prompts):
    """Everything reference.json holds, plus the statistics find_model checks."""
    routers = moe_routers(model)
    num_experts = routers[0][1].num_experts if routers else 0
    top_k = routers[0][1].top_k if routers else 0
    router_log = []  # (layer index, router logits, chosen experts), every forward
    handles = []
    for layer_idx, router in routers:
        def hook(_module, _inputs, output, layer_idx=layer_idx):
            router_logits, _scores, indices = output
            router_log.append((layer_idx, router_logits.detach().clone(), indices.detach().clone()))
        handles.append(router.register_forward_hook(hook))

    generation_config = GenerationConfig(
        do_sample=False,
        max_new_tokens=MAX_NEW_TOKENS,
        use_cache=True,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=0,
    )

    cases = []
    stats = {"min_logit_std": math.inf, "max_cache_vs_full_logprob_diff": 0.0}
    layer_outputs = None
    expert_counts = None
    try:
        for case_idx, prompt in enumerate(prompts):
            ids = torch.tensor([prompt])
            n = len(prompt)

            # Full forward, no cache.
            layer_hooks, captured = [], []
            if case_idx == 0:
                for layer in model.model.layers:
                    layer_hooks.append(layer.register_forward_hook(
                        lambda _m, _i, out: captured.append(
                            (out[0] if isinstance(out, tuple) else out).detach().clone())))
            first_router_entry = len(router_log)
            logits = model(ids, use_cache=False).logits[0].float()
            for handle in layer_hooks:
                handle.remove()
            if case_idx == 0:
                layer_outputs = [floats(h[0]) for h in captured]
                expert_counts = [
                    torch.bincount(indices.reshape(-1), minlength=num_experts).tolist()
                    for _layer, _logits, indices in router_log[first_router_entry:]
                ]
            stats["min_logit_std"] = min(stats["min_logit_std"], logits.std(dim=-1).min().item())

            logprobs = F.log_softmax(logits, dim=-1)
            prompt_logprobs = [None] + [float(logprobs[i - 1, prompt[i]]) for i in range(1, n)]
            top = logits[-1].topk(TOP_LOGITS)
            last_logits_top = [[int(i), float(v)] for v, i in zip(top.values, top.indices)]

            # Greedy generation with the cache on.
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                generation_config=generation_config,
                output_logits=True,
                return_dict_in_generate=True,
            )
            greedy = out.sequences[0, n:].tolist()
            if len(greedy) != MAX_NEW_TOKENS:
                raise RuntimeError(f"generate stopped after {len(greedy)} tokens")
            step_logits = torch.stack(out.logits, dim=1)[0].float()  # [steps, vocab]
            if step_logits.argmax(dim=-1).tolist() != greedy:
                raise RuntimeError("greedy tokens are not the argmax of generate's logits")
            step_logprobs = F.log_softmax(step_logits, dim=-1)
            greedy_logprobs = [float(step_logprobs[i, t]) for i, t in enumerate(greedy)]

            # The same positions again with a full forward: the cached path must agree.
            full = torch.tensor([prompt + greedy[:-1]])
            full_logprobs = F.log_softmax(model(full, use_cache=False).logits[0, n - 1:].float(), dim=-1)
            if full_logprobs.argmax(dim=-1).tolist() != greedy:
                raise RuntimeError("cached generation and a full forward disagree on the argmax")
            stats["max_cache_vs_full_logprob_diff"] = max(
                stats["max_cache_vs_full_logprob_diff"],
                (full_logprobs - step_logprobs).abs().max().item(),
            )

            cases.append({
                "prompt": prompt,
                "prompt_logprobs": prompt_logprobs,
                "last_logits_top": last_logits_top,
                "greedy": greedy,
                "greedy_logprobs": greedy_logprobs,
                "min_top2_gap": float(top2_gaps(step_logits).min()),
            })
    finally:
        for handle in handles:
            handle.remove()

    if routers:
        # The margin between the k-th and (k+1)-th router logit, over every token that any
        # forward above (full or cached) routed.
        all_router_logits = torch.cat([router_logits for _layer, router_logits, _indices in router_log])
        sorted_logits = all_router_logits.sort(dim=-1, descending=True).values
        stats["min_router_gap"] = (sorted_logits[:, top_k - 1] - sorted_logits[:, top_k]).min().item()

    reference = {
        "made_by": {
            "script": SCRIPT,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": sys.version.split()[0],
        },
        "architecture": type(model).__name__,
        "cases": cases,
        "layer_outputs": layer_outputs,
    }
    if routers:
        reference["moe_layers"] = [i for i, _ in routers]
        reference["expert_counts"] = expert_counts
    return reference, stats


def problems(reference, stats, prompts):
    """Why this model is not good enough as a reference ([] if it is)."""
    found = []
    gap = min(case["min_top2_gap"] for case in reference["cases"])
    if gap <= MIN_TOP2_GAP:
        found.append(f"top-2 logit gap {gap:.2e}")
    if stats["min_logit_std"] < MIN_LOGIT_STD:
        found.append(f"logit std {stats['min_logit_std']:.2f}")
    if "min_router_gap" in stats and stats["min_router_gap"] <= MIN_ROUTER_GAP:
        found.append(f"router top-k gap {stats['min_router_gap']:.2e}")
    for layer, counts in zip(reference.get("moe_layers", []), reference.get("expert_counts", [])):
        if min(counts) == 0 or max(counts) == len(prompts[0]):
            found.append(f"layer {layer} expert counts {counts}")
    return found


def experts_spread(model, prompt):
    """Whether every expert of every MoE layer is chosen by some but not all of prompt's tokens
    (a quick first check, so that most seeds are turned down without generating)."""
    counts = []
    handles = [
        router.register_forward_hook(
            lambda _m, _i, out: counts.append(torch.bincount(out[2].reshape(-1), minlength=_m.num_experts)))
        for _layer, router in moe_routers(model)
    ]
    try:
        with torch.no_grad():
            model(torch.tensor([prompt]), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return all(c.min() > 0 and c.max() < len(prompt) for c in counts)


def find_model(name, prompts):
    """The first seed whose model passes `problems`, with its reference."""
    for seed in range(MAX_SEEDS):
        model = build(name, seed)
        if not experts_spread(model, prompts[0]):
            continue
        reference, stats = compute_reference(model, prompts)
        if not problems(reference, stats, prompts):
            return seed, model, reference, stats
    raise RuntimeError(f"{name}: no seed below {MAX_SEEDS} passes the checks")


def expert_layout(path):
    """'per-expert' or 'fused', from the tensor names in a safetensors file."""
    with safe_open(path, "pt") as f:
        keys = list(f.keys())
    if any(k.endswith("experts.gate_up_proj") for k in keys):
        return "fused"
    if any(".experts.0." in k for k in keys):
        return "per-expert"
    raise ValueError(f"{path}: no expert tensors")


def remove_weights(directory):
    """Deletes the weight files of an earlier run; other files (such as the tokenizer that
    scripts/reference/byte_tokenizer.py adds) stay."""
    for path in directory.glob("model*.safetensors*"):
        path.unlink()


def write_fused_variant(model, source_dir, variant_dir):
    """The model's own (fused-expert) state dict, with source_dir's other files."""
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    variant_dir.mkdir(parents=True, exist_ok=True)
    remove_weights(variant_dir)
    save_file(state, variant_dir / "model.safetensors", metadata={"format": "pt"})
    for file in ("config.json", "generation_config.json", "reference.json"):
        shutil.copyfile(source_dir / file, variant_dir / file)


def format_json(value, indent=0):
    """JSON with one line per list of numbers (the layer outputs are long)."""
    pad = " " * indent
    if isinstance(value, dict):
        items = [f'{pad}  {json.dumps(k)}: {format_json(v, indent + 2)}' for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        items = [f"{pad}  {format_json(v, indent + 2)}" for v in value]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    return json.dumps(value)


def assert_same_reference(expected, actual, what, tolerance=1e-4):
    """Token ids must match exactly, floats within tolerance; returns the largest float difference.

    A model loaded from the files computes with the same weights, but they sit unaligned in the
    memory-mapped safetensors file and BLAS takes other code paths: differences up to ~1e-5
    are float32 rounding (with the weights copied to fresh memory the results are identical)."""
    worst = 0.0

    def walk(a, b, where):
        nonlocal worst
        if isinstance(a, dict):
            if a.keys() != b.keys():
                raise AssertionError(f"{what}: keys differ at {where}")
            for k in a:
                if k != "made_by":
                    walk(a[k], b[k], f"{where}.{k}")
        elif isinstance(a, list):
            if len(a) != len(b):
                raise AssertionError(f"{what}: lengths differ at {where}")
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{where}[{i}]")
        elif isinstance(a, float):
            worst = max(worst, abs(a - b))
            if abs(a - b) > tolerance:
                raise AssertionError(f"{what}: {where} is {b}, expected {a}")
        elif a != b:
            raise AssertionError(f"{what}: {where} is {b}, expected {a}")

    walk(expected, actual, "")
    return worst


def load(name, directory):
    _config_class, model_class, _kwargs = MODELS[name]
    return model_class.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()


def prepare_torch():
    """The pinned transformers, deterministic single-threaded torch, quiet logs."""
    if transformers.__version__ != REQUIRED_TRANSFORMERS:
        sys.exit(f"transformers {REQUIRED_TRANSFORMERS} is required, found {transformers.__version__}")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="output folder (tests/fixtures/architectures)")
    parser.add_argument("--only", nargs="*", choices=list(MODELS), help="make only these models")
    args = parser.parse_args()

    prepare_torch()

    prompts = make_prompts()
    for name in args.only or MODELS:
        seed, model, reference, stats = find_model(name, prompts)
        directory = args.out / name
        if directory.exists():
            remove_weights(directory)
        model.save_pretrained(directory, safe_serialization=True)
        reference["made_by"]["seed"] = seed
        (directory / "reference.json").write_text(format_json(reference) + "\n")

        reloaded_diff = assert_same_reference(
            reference, compute_reference(load(name, directory), prompts)[0], f"{name} reloaded")
        summary = (f"{name}: seed {seed}, min top-2 gap "
                   f"{min(c['min_top2_gap'] for c in reference['cases']):.4f}, "
                   f"min logit std {stats['min_logit_std']:.2f}, "
                   f"cache vs full {stats['max_cache_vs_full_logprob_diff']:.1e}, "
                   f"reloaded diff {reloaded_diff:.1e}")
        if "min_router_gap" in stats:
            summary += f", router gap {stats['min_router_gap']:.4f}"

        if "moe_layers" in reference:
            layout = expert_layout(directory / "model.safetensors")
            if layout != "per-expert":
                raise RuntimeError(f"{name}: save_pretrained wrote {layout} experts; "
                                   "this script only writes a fused variant of per-expert ones")
            variant = args.out / f"{name}-fused"
            write_fused_variant(model, directory, variant)
            variant_diff = assert_same_reference(
                reference, compute_reference(load(name, variant), prompts)[0], f"{name}-fused")
            summary += f"; {name}-fused loads, diff {variant_diff:.1e}"
        print(summary)


if __name__ == "__main__":
    main()
