#!/usr/bin/env python3
"""The tiny Qwen3.5 fixtures again, wrapped as the Hub's vision-language checkpoints are.

Real Qwen3.5 checkpoints are `Qwen3_5ForConditionalGeneration` /
`Qwen3_5MoeForConditionalGeneration` (model_type `qwen3_5` / `qwen3_5_moe`): the language
model's settings sit in `text_config` (next to a `vision_config`), its weights under
`model.language_model.`, the vision tower under `model.visual.`, `lm_head.weight` at the top.
This script builds such a model with transformers itself for each of

    qwen3_5     -> qwen3_5-vl      (Qwen3_5ForConditionalGeneration)
    qwen3_5_moe -> qwen3_5_moe-vl  (Qwen3_5MoeForConditionalGeneration)

in OUT (tests/fixtures/architectures/; CI never runs this):

1. text_config = the source directory's config.json (minus architectures, model_type, dtype,
   transformers_version), with `mrope_section` [1, 1, 0] and `mrope_interleaved` true added
   to its rope_parameters as in the real checkpoints (the rotary part of a head is
   16 * 0.25 = 4 dims, 2 frequencies: the sections must add up to 2). The top-level
   tie_word_embeddings is the text model's (transformers ties lm_head by the top-level flag).
   vision_config = VISION (depth 1, hidden 32, 2 heads, patch 4, 16 learned positions,
   out_hidden_size = the text hidden size). The vision special tokens are put on byte values
   that never occur in UTF-8 (vision_start 250, vision_end 251, image 252, video 253), so
   that they are inside the 256-token vocabulary; no reference prompt or greedy token is one
   of them (the script checks).
2. The language model's weights are the source model's, copied tensor by tensor (the source
   is loaded with Qwen3_5[Moe]ForCausalLM.from_pretrained, which drops its `mtp.*` tensors);
   the vision tower's are drawn from a generator seeded with VISION_SEED.
3. `save_pretrained(safe_serialization=True)` in float32 (transformers 5.17 writes the MoE
   experts one tensor per expert, `...mlp.experts.{e}.gate_proj.weight`; Qwen's own
   qwen3_5_moe checkpoints hold them fused, `...mlp.experts.gate_up_proj`).
4. Checks, with the model reloaded from the new directory: every language-model tensor equals
   the source model's; a text-only forward (input_ids only) and `generate` reproduce the
   source's reference.json (`cases`, `layer_outputs` and for MoE `moe_layers` /
   `expert_counts`; token ids exactly, floats within 1e-5, with the weights copied out of the
   memory-mapped file: read in place they take other BLAS paths and move by ~1e-5, which is
   checked within 1e-4 as tiny_architectures.py does); the model before saving must agree too;
   one forward with a 4 x 4-patch image runs and changes the logits after the image.
5. reference.json: those keys copied from the source's reference.json when they agree within
   1e-5 (else the conditional model's own numbers, and the script says so), with its own
   made_by and architecture; no `mtp` key (the source's MTP head is not carried over).

tokenizer.json / tokenizer_config.json come from scripts/reference/byte_tokenizer.py (run it
on the new directories); rerunning this script leaves them.

Pinned versions as for tiny_architectures.py (torch 2.15.0, transformers 5.17.0, CPU, float32,
eager attention and experts). Run after tiny_architectures.py:

    /work/venv-ref/bin/python scripts/reference/tiny_conditional.py tests/fixtures/architectures
    /work/venv-ref/bin/python scripts/reference/byte_tokenizer.py \\
        tests/fixtures/architectures/qwen3_5-vl tests/fixtures/architectures/qwen3_5_moe-vl

Reruns with the same versions give the same bytes.
"""

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open
from transformers import (
    GenerationConfig,
    Qwen3_5Config,
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeForConditionalGeneration,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_architectures import (  # noqa: E402
    MAX_NEW_TOKENS,
    TOP_LOGITS,
    assert_same_reference,
    floats,
    format_json,
    make_prompts,
    prepare_torch,
    remove_weights,
    top2_gaps,
)

SCRIPT = "scripts/reference/tiny_conditional.py"

# new directory -> (source directory, text class, conditional config class, conditional class)
MODELS = {
    "qwen3_5-vl": ("qwen3_5", Qwen3_5ForCausalLM, Qwen3_5Config, Qwen3_5ForConditionalGeneration),
    "qwen3_5_moe-vl": (
        "qwen3_5_moe", Qwen3_5MoeForCausalLM, Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration),
}

# The smallest vision tower that still runs: one block, 2 heads of 16 (the axial rotary needs
# head_dim divisible by 4), 4 x 4 patches, a 4 x 4 grid of learned positions, 2 x 2 merge.
VISION = dict(
    depth=1,
    hidden_size=32,
    intermediate_size=64,
    num_heads=2,
    in_channels=3,
    patch_size=4,
    temporal_patch_size=2,
    spatial_merge_size=2,
    num_position_embeddings=16,
)
# Byte values that are never part of UTF-8 text, and that neither the prompts nor the greedy
# tokens of either reference contain (249 and 254 are among them).
SPECIAL_TOKENS = dict(vision_start_token_id=250, vision_end_token_id=251, image_token_id=252,
                      video_token_id=253)
MROPE = dict(mrope_section=[1, 1, 0], mrope_interleaved=True)
VISION_SEED = 0
IMAGE_SEED = 1
TOLERANCE = 1e-5
TEXT_KEYS = ("cases", "layer_outputs", "moe_layers", "expert_counts")
DROPPED_TEXT_KEYS = ("architectures", "model_type", "dtype", "transformers_version")


def conditional_config(source_dir, config_class):
    text = json.loads((source_dir / "config.json").read_text())
    for key in DROPPED_TEXT_KEYS:
        text.pop(key, None)
    text["rope_parameters"] = {**text["rope_parameters"], **MROPE}
    config = config_class(
        text_config=text,
        vision_config=dict(VISION, out_hidden_size=text["hidden_size"]),
        tie_word_embeddings=text["tie_word_embeddings"],
        **SPECIAL_TOKENS,
    )
    config.dtype = torch.float32
    return config


@torch.no_grad()
def randomize_vision(visual, seed):
    """Matrices and the conv kernel N(0, 1/fan_in) (fan_in = every dimension but the first),
    position embeddings N(0, 1), LayerNorm weights 1 + N(0, 0.1), biases N(0, 0.2)."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in visual.named_parameters():
        noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
        if name == "pos_embed.weight":
            new = noise
        elif name.endswith(".bias"):
            new = noise * 0.2
        elif param.dim() == 1 and "norm" in name:
            new = 1.0 + noise * 0.1
        elif param.dim() >= 2:
            new = noise / math.sqrt(param[0].numel())
        else:
            raise ValueError(f"no rule to draw vision parameter {name} {tuple(param.shape)}")
        param.copy_(new)


def load(model_class, directory, fresh_memory=False):
    """The model in `directory`. With fresh_memory, its weights are copied out of the
    memory-mapped safetensors file: unaligned there, BLAS takes other code paths and float32
    results move by up to ~1e-5 (see tiny_architectures.assert_same_reference); copied, the
    results are those of the model that was saved."""
    model = model_class.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    if fresh_memory:
        with torch.no_grad():
            for param in model.parameters():
                param.data = param.data.clone()
    return model


@torch.no_grad()
def build(source_dir, text_class, config_class, model_class):
    source = load(text_class, source_dir)
    config = conditional_config(source_dir, config_class)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    torch.manual_seed(VISION_SEED)
    model = model_class(config).to(torch.float32).eval()

    text_state = {k.removeprefix("model."): v for k, v in source.state_dict().items()
                  if k.startswith("model.")}
    missing, unexpected = model.model.language_model.load_state_dict(text_state, strict=True)
    assert not missing and not unexpected
    if config.tie_word_embeddings:
        assert model.lm_head.weight is model.model.language_model.embed_tokens.weight
    else:
        model.lm_head.weight.copy_(source.lm_head.weight)
    randomize_vision(model.model.visual, VISION_SEED)
    return source, model


def language_layers(model):
    return model.model.language_model.layers


@torch.no_grad()
def compute_text_reference(model, prompts):
    """reference.json's text keys, as tiny_architectures.compute_reference computes them, for a
    conditional model fed input_ids only."""
    layers = language_layers(model)
    routers = [(i, layer.mlp.gate) for i, layer in enumerate(layers) if hasattr(layer.mlp, "experts")]
    generation_config = GenerationConfig(
        do_sample=False, max_new_tokens=MAX_NEW_TOKENS, use_cache=True,
        eos_token_id=None, bos_token_id=None, pad_token_id=0,
    )
    cases, layer_outputs, expert_counts = [], None, None
    for case_idx, prompt in enumerate(prompts):
        ids = torch.tensor([prompt])
        n = len(prompt)
        handles, captured, routed = [], [], []
        if case_idx == 0:
            for layer in layers:
                handles.append(layer.register_forward_hook(
                    lambda _m, _i, out: captured.append(
                        (out[0] if isinstance(out, tuple) else out).detach().clone())))
            for _i, router in routers:
                handles.append(router.register_forward_hook(
                    lambda m, _i, out: routed.append(
                        torch.bincount(out[2].reshape(-1), minlength=m.num_experts).tolist())))
        logits = model(input_ids=ids, use_cache=False).logits[0].float()
        for handle in handles:
            handle.remove()
        if case_idx == 0:
            layer_outputs = [floats(h[0]) for h in captured]
            expert_counts = routed

        logprobs = F.log_softmax(logits, dim=-1)
        prompt_logprobs = [None] + [float(logprobs[i - 1, prompt[i]]) for i in range(1, n)]
        top = logits[-1].topk(TOP_LOGITS)
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), generation_config=generation_config,
            output_logits=True, return_dict_in_generate=True,
        )
        greedy = out.sequences[0, n:].tolist()
        step_logits = torch.stack(out.logits, dim=1)[0].float()
        if step_logits.argmax(dim=-1).tolist() != greedy:
            raise RuntimeError("greedy tokens are not the argmax of generate's logits")
        step_logprobs = F.log_softmax(step_logits, dim=-1)
        cases.append({
            "prompt": prompt,
            "prompt_logprobs": prompt_logprobs,
            "last_logits_top": [[int(i), float(v)] for v, i in zip(top.values, top.indices)],
            "greedy": greedy,
            "greedy_logprobs": [float(step_logprobs[i, t]) for i, t in enumerate(greedy)],
            "min_top2_gap": float(top2_gaps(step_logits).min()),
        })
    reference = {"cases": cases, "layer_outputs": layer_outputs}
    if routers:
        reference["moe_layers"] = [i for i, _ in routers]
        reference["expert_counts"] = expert_counts
    return reference


@torch.no_grad()
def image_smoke_test(model):
    """One forward with a 4 x 4-patch image (2 x 2 = 4 merged tokens): it must run and change
    the logits of the text after the image. Returns the largest change."""
    config = model.config
    image = config.image_token_id
    ids = [10, config.vision_start_token_id] + [image] * 4 + [config.vision_end_token_id, 20, 30]
    input_ids = torch.tensor([ids])
    vision = config.vision_config
    patch_values = vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2
    gen = torch.Generator().manual_seed(IMAGE_SEED)
    pixel_values = torch.randn((16, patch_values), generator=gen)
    with_image = model(
        input_ids=input_ids, pixel_values=pixel_values, image_grid_thw=torch.tensor([[1, 4, 4]]),
        mm_token_type_ids=(input_ids == image).int(), use_cache=False,
    ).logits[0]
    model.model.rope_deltas = None
    text_only = model(input_ids=input_ids, use_cache=False).logits[0]
    if not torch.isfinite(with_image).all():
        raise RuntimeError("image forward gave non-finite logits")
    if (with_image[:2] - text_only[:2]).abs().max() > TOLERANCE:
        raise RuntimeError("the image changed the logits before it")
    change = (with_image[-3:] - text_only[-3:]).abs().max().item()
    if change < 1e-3:
        raise RuntimeError("the image does not change the logits after it")
    return change


def check_text_tensors(source, reloaded):
    """Every language-model tensor of the reloaded model equals the source model's."""
    reloaded_state = reloaded.state_dict()
    count = 0
    for name, tensor in source.state_dict().items():
        target = name.replace("model.", "model.language_model.", 1) if name.startswith("model.") else name
        if not torch.equal(tensor, reloaded_state[target]):
            raise AssertionError(f"{target} differs from the source's {name}")
        count += 1
    return count


def file_layout(path):
    with safe_open(path, "pt") as f:
        keys = list(f.keys())
    groups = {}
    for key in keys:
        group = ".".join(key.split(".")[:2]) if key.startswith("model.") else key
        groups[group] = groups.get(group, 0) + 1
    experts = ("fused" if any(k.endswith("experts.gate_up_proj") for k in keys)
               else "per-expert" if any(".experts.0." in k for k in keys) else "none")
    return len(keys), experts, groups


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="output folder (tests/fixtures/architectures)")
    parser.add_argument("--only", nargs="*", choices=list(MODELS), help="make only these models")
    args = parser.parse_args()

    prepare_torch()

    prompts = make_prompts()
    for name in args.only or MODELS:
        source_name, text_class, config_class, model_class = MODELS[name]
        source_dir = args.out / source_name
        directory = args.out / name
        source_reference = json.loads((source_dir / "reference.json").read_text())
        if [c["prompt"] for c in source_reference["cases"]] != prompts:
            raise RuntimeError(f"{source_dir}/reference.json has other prompts")
        expected = {k: source_reference[k] for k in TEXT_KEYS if k in source_reference}
        seen = {t for c in source_reference["cases"] for t in c["prompt"] + c["greedy"]}
        if seen & set(SPECIAL_TOKENS.values()):
            raise RuntimeError(f"{source_name}'s reference uses vision token ids {seen & set(SPECIAL_TOKENS.values())}")

        source, model = build(source_dir, text_class, config_class, model_class)
        in_memory_diff = assert_same_reference(
            expected, compute_text_reference(model, prompts), f"{name} in memory", TOLERANCE)

        if directory.exists():
            remove_weights(directory)
        model.save_pretrained(directory, safe_serialization=True)

        reloaded = load(model_class, directory, fresh_memory=True)
        tensors = check_text_tensors(source, reloaded)
        own = compute_text_reference(reloaded, prompts)
        mapped_diff = assert_same_reference(
            expected, compute_text_reference(load(model_class, directory), prompts),
            f"{name} reloaded, memory-mapped", 1e-4)
        try:
            reloaded_diff = assert_same_reference(expected, own, f"{name} reloaded", TOLERANCE)
            text_part, origin = expected, f"copied from {source_name}/reference.json"
        except AssertionError as error:
            print(f"{name}: {error}; writing the conditional model's own numbers")
            reloaded_diff, text_part, origin = None, own, "computed by this script"

        reference = {
            "made_by": {
                "script": SCRIPT,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "python": sys.version.split()[0],
                "text_model": f"tests/fixtures/architectures/{source_name}",
                "vision_seed": VISION_SEED,
            },
            "architecture": model_class.__name__,
            **text_part,
        }
        (directory / "reference.json").write_text(format_json(reference) + "\n")

        change = image_smoke_test(reloaded)
        count, experts, groups = file_layout(directory / "model.safetensors")
        print(f"{name}: {count} tensors ({experts} experts), {groups}; "
              f"{tensors} text tensors equal the source's; text keys {origin}; "
              f"largest float difference to {source_name}: in memory {in_memory_diff:.1e}, "
              f"reloaded {'-' if reloaded_diff is None else f'{reloaded_diff:.1e}'}, "
              f"reloaded memory-mapped {mapped_diff:.1e}; "
              f"image forward changes later logits by up to {change:.2f}")


if __name__ == "__main__":
    main()
