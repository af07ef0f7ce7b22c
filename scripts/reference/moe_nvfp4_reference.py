#!/usr/bin/env python3
"""NVFP4 reference fixtures for `sous quantize` on the tiny MoE and hybrid models, made
once with the real llm-compressor.

For each model directory of tests/fixtures/architectures/ given on the command line
(qwen3_moe, qwen3_next, qwen3_5, qwen3_5_moe and their `-fused` twins), `a16` quantizes
it the way llm-compressor's own examples quantize that family: `oneshot(model,
recipe=QuantizationModifier(targets="Linear", scheme="NVFP4A16", ignore=FAMILY_IGNORE))`
then `save_pretrained(save_compressed=True)`, and writes
OUT_DIR/<model>.llmcompressor.json holding:

- `tools`: the versions used; `source`: SHA-256 of the model's files;
- `load`: how the model was loaded (function, class, the dtype asked for and the dtype the
  parameters had) and a comparison of the loaded parameters with the checkpoint's tensors
  (a checkpoint tensor that did not reach the model is listed, not hidden);
- `ignore` and `ignore_from`: the ignore list and the upstream example it is copied from;
- `quantization_config`: what config.json says;
- `tensor_set`: every tensor of the output, name -> [dtype, shape];
- `tensors`: SHA-256 of each `weight_packed`, `weight_scale`, `weight_global_scale`;
- `unquantized_sha256`: SHA-256 of every other tensor's bytes;
- `findings`: facts read off the output (expert tensor naming, whether experts, MTP
  tensors and the full-attention q_proj are quantized, which gate/up and q/k/v share a
  `weight_global_scale`, which unquantized tensors differ from the checkpoint's bytes:
  the zero-centred `(1 + w)` RMSNorm weights of the hybrids come back as f32((w + 1) - 1),
  from llm-compressor's norm calibration context).

No calibration data: NVFP4A16 is weight-only, as in llm-compressor's NVFP4A16 examples.

Load: `AutoModelForCausalLM.from_pretrained(model_dir)` with no `dtype`, as the 0.14.0.1
examples for these families do, so transformers 5 uses the checkpoint's dtype (`auto`:
config.json's `dtype`, float32 for these models; nothing is rounded to bf16). MoE models
whose checkpoint holds one tensor per expert are loaded inside
`llmcompressor.utils.load_context()`, as every MoE example of 0.14.0.1 does
(qwen_30b_a3b.py, qwen3_next_example.py, qwen3_5_example.py); the dense qwen3_5 is loaded
without it, as nvfp4/qwen3.5_example.py does. The `-fused` checkpoints (3-D
`experts.gate_up_proj` / `experts.down_proj`) are loaded without it too: under
load_context() llm-compressor 0.14.0.1 registers a per-expert load mapping for qwen3_moe
and qwen3_next, so transformers reports the fused tensors UNEXPECTED and the per-expert
Linears MISSING and initialises them at random. Loaded plainly, transformers holds the
experts fused and oneshot linearizes them itself (its post-load fallback). The script
compares the loaded parameters with the checkpoint and refuses to write a fixture when
any (other than `mtp.*`, which transformers does not load) did not arrive intact.
`--load plain|context` overrides the choice. The examples for Qwen3.5 load
`Qwen3_5*ForConditionalGeneration`; these test models are the text-only `*ForCausalLM`,
so AutoModelForCausalLM is used throughout. Each model should run in its own process
(load_context() registers conversion mappings process-wide).

`w4a4` (one model): the NVFP4 scheme (FP4 weights and activations) with the same ignore
list and the same load, calibrated with `moe_calibrate_all_experts=True` (oneshot's argument
in 0.14.0.1, its default: every token through every expert for the observers, routing
unchanged), and the same fixture plus every module's `input_global_scale` and
`weight_global_scale` as floats, the calibration token ids (`calibration_input_ids`) and
how they were made (`calibration`).

Calibration samples, `--format text` (the default): the text file `--text`
(scripts/bench/data/alice-chapter1.txt, UTF-8; its SHA-256 goes into the fixture)
tokenized ONCE by the model directory's own tokenizer,
`AutoTokenizer.from_pretrained(model_dir)(text, add_special_tokens=False)["input_ids"]`,
cut into consecutive windows of exactly `--seq-len` L tokens, the first `--samples` N of
them (a tail shorter than L is dropped); one sample per forward (batch size 1), no padding,
`shuffle_calibration_samples=False`. This is how `sous quantize --scheme nvfp4
--calibration-format text --samples N --seq-len L` makes its samples (module doc of
cli/src/quantize/calibrate.rs), and what nvfp4_w4a4_reference.py --format text does for
the dense model, so sous can calibrate on exactly these ids. (oneshot's LengthAwareSampler
orders samples by descending length; with equal lengths the order may differ from the
file's, which does not matter to the static min/max observers; the order the embedding saw
is recorded under `calibration.embed_tokens_order`.) `--format sentences`: the four fixed
sentences of CALIBRATION_TEXTS, one sample each, as UTF-8 bytes (the first W4A4 fixture's
calibration; sous does not make such samples).

The w4a4 fixture leaves out the wall-clock `seconds` (printed instead), so that two runs
write identical bytes.

Needs PyTorch, so CI never runs it. Pinned tools (llmcompressor 0.14.0.1 requires
torch<=2.14.0, so torch is 2.14.0, not the 2.15.0 that made the test models):

    python3 -m venv /work/venv-llmc
    /work/venv-llmc/bin/pip install llmcompressor==0.14.0.1 compressed-tensors==0.19.0 \\
        torch==2.14.0 transformers==5.17.0
    /work/venv-llmc/bin/pip install torchvision torch==2.14.0   # got torchvision 0.29.2

Usage:

    moe_nvfp4_reference.py a16 MODEL_DIR... [--out-dir DIR] [--work DIR] [--load auto|plain|context]
    moe_nvfp4_reference.py w4a4 MODEL_DIR FIXTURE.json [--work DIR] [--load auto|plain|context]
        [--format text|sentences] [--samples N] [--seq-len L] [--text FILE] [--pipeline P]

e.g. from the repository root:

    for m in qwen3_moe qwen3_moe-fused qwen3_next qwen3_next-fused qwen3_5 qwen3_5_moe qwen3_5_moe-fused; do
        /work/venv-llmc/bin/python scripts/reference/moe_nvfp4_reference.py a16 \\
            tests/fixtures/architectures/$m --out-dir tests/fixtures/nvfp4/architectures
    done
    for m in qwen3_moe qwen3_next qwen3_5_moe; do
        /work/venv-llmc/bin/python scripts/reference/moe_nvfp4_reference.py w4a4 \\
            tests/fixtures/architectures/$m tests/fixtures/nvfp4/architectures/$m.w4a4.llmcompressor.json \\
            --format text --samples 4 --seq-len 64
    done

(torchvision must be installed too: load_context() makes transformers 5.17 import every
model module, and some import torchvision; without it loading fails with
`ModuleNotFoundError: No module named 'torchvision'`.)
"""

import argparse
import hashlib
import json
import os
import platform
import re
import struct
import sys
import tempfile
import time

# The same readers as the dense reference, which imports nothing but the standard library
# at its top level.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nvfp4_reference import safetensors_tensors, sha256_file  # noqa: E402

QUANT_SUFFIXES = (".weight_packed", ".weight_scale", ".weight_global_scale")

# The ignore list of llm-compressor 0.14.0.1's own example for each family (files of the
# llmcompressor-0.14.0.1 sdist on PyPI), keyed by config.json's model_type.
FAMILIES = {
    "qwen3_moe": (
        ["lm_head", "re:.*mlp.gate$"],
        "examples/quantization_w4a4_fp4/qwen_30b_a3b.py (Qwen/Qwen3-30B-A3B, scheme NVFP4; "
        "0.14.0.1 has no NVFP4A16 example for Qwen3-MoE)",
        True,
    ),
    "qwen3_next": (
        ["lm_head", "re:.*mlp.gate$", "re:.*mlp.shared_expert_gate$", "re:.*linear_attn.*"],
        "examples/quantization_w4a4_fp4/qwen3_next_example.py (Qwen/Qwen3-Next-80B-A3B-Instruct, "
        "scheme NVFP4; 0.14.0.1 has no NVFP4A16 example for Qwen3-Next)",
        True,
    ),
    "qwen3_5_text": (
        ["lm_head", "re:.*visual.*", "re:.*linear_attn.*"],
        "examples/quantization_w4a16_fp4/nvfp4/qwen3.5_example.py (Qwen/Qwen3.5-27B, scheme NVFP4A16)",
        False,
    ),
    "qwen3_5_moe_text": (
        [
            "re:.*lm_head",
            "re:visual.*",
            "re:model.visual.*",
            "re:.*mlp.gate$",
            "re:.*embed_tokens$",
            "re:.*shared_expert_gate$",
            "re:.*linear_attn.*",
        ],
        "examples/quantization_w4a4_fp4/qwen3_5_example.py (Qwen/Qwen3.5-122B-A10B, scheme NVFP4; "
        "qwen3_6_example.py has the same list; 0.14.0.1 has no NVFP4A16 example for Qwen3.5-MoE)",
        True,
    ),
}

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_TEXT = os.path.join(ROOT, "scripts", "bench", "data", "alice-chapter1.txt")

# `w4a4 --format sentences` calibration ids: the UTF-8 bytes of these sentences (the test models'
# tokenizer maps byte b to token id b), each one sample.
CALIBRATION_TEXTS = [
    "The quick brown fox jumps over the lazy dog, and the dog does not mind at all.",
    "Alice was beginning to get very tired of sitting by her sister on the bank.",
    "In 1865 the book was printed twice; the first printing was withdrawn.",
    "Sphinx of black quartz, judge my vow! 0123456789 +-*/ = ?",
]


def text_windows(model_dir, count, seq_len, path):
    """The first `count` consecutive windows of exactly `seq_len` tokens of the text file,
    tokenized once by the model's own tokenizer without special tokens (as
    nvfp4_w4a4_reference.py --format text and `sous quantize --calibration-format text`)."""
    from transformers import AutoTokenizer

    with open(path, encoding="utf-8") as f:
        text = f.read()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    out = [ids[i * seq_len : (i + 1) * seq_len] for i in range(len(ids) // seq_len)][:count]
    if len(out) < count:
        sys.exit(f"{path}: {len(ids)} tokens hold {len(out)} windows of {seq_len}, fewer than {count}")
    return out, {
        "format": "text",
        "file": os.path.relpath(os.path.abspath(path), ROOT),
        "file_sha256": sha256_file(path),
        "tokenizer": f"AutoTokenizer.from_pretrained(model_dir) -> {type(tokenizer).__name__}",
        "tokenize": 'tokenizer(text, add_special_tokens=False)["input_ids"], once over the whole file',
        "text_tokens": len(ids),
        "samples": count,
        "seq_len": seq_len,
        "windows": f"ids[i*{seq_len}:(i+1)*{seq_len}] for i in 0..{count}",
        "sous": f"sous quantize --scheme nvfp4 --calibration-format text --samples {count} --seq-len {seq_len}",
    }


def w4a4_args(calib):
    if calib["format"] == "sentences":
        return "w4a4 --format sentences"
    args = f"w4a4 --format text --samples {calib['samples']} --seq-len {calib['seq_len']}"
    if os.path.abspath(calib["text"]) != DEFAULT_TEXT:
        args += f" --text {os.path.relpath(os.path.abspath(calib['text']), ROOT)}"
    if calib["pipeline"] is not None:
        args += f" --pipeline {calib['pipeline']}"
    return args


def tools():
    import compressed_tensors
    import llmcompressor
    import torch
    import torchvision
    import transformers

    return {
        "llmcompressor": llmcompressor.__version__,
        "compressed_tensors": compressed_tensors.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torchvision": torchvision.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "device": "cpu",
    }


def load_model(model_dir, load):
    """Load as the family's upstream example does; returns (model, description)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    if config.model_type not in FAMILIES:
        sys.exit(f"{model_dir}: model_type {config.model_type} has no ignore list here")
    _, _, is_moe = FAMILIES[config.model_type]
    fused = checkpoint_has_fused_experts(model_dir)
    if load == "auto":
        use_context = is_moe and not fused
        why = (
            "MoE checkpoint with one tensor per expert: load_context(), as the family's example"
            if use_context
            else "dense model: plain from_pretrained, as the family's example"
            if not is_moe
            else "fused 3-D experts: plain from_pretrained, and oneshot linearizes the experts after "
            "loading (its fallback). Under load_context() llm-compressor 0.14.0.1 registers a "
            "per-expert load mapping for qwen3_moe and qwen3_next, so the fused checkpoint tensors "
            "are UNEXPECTED, the per-expert Linears MISSING and newly initialised (random experts)"
        )
    else:
        use_context = load == "context"
        why = f"--load {load}"
    if use_context:
        from llmcompressor.utils import load_context

        with load_context():
            model = AutoModelForCausalLM.from_pretrained(model_dir)
        how = "with llmcompressor.utils.load_context(): AutoModelForCausalLM.from_pretrained(model_dir)"
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        how = "AutoModelForCausalLM.from_pretrained(model_dir)"
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
    described = {
        "call": how,
        "why": why,
        "checkpoint_experts": "fused 3-D" if fused else "per expert" if is_moe else "none",
        "dtype_argument": None,
        "parameter_dtypes": dtypes,
        "class": type(model).__name__,
        "model_type": config.model_type,
        "config_dtype": str(getattr(config, "dtype", None)).removeprefix("torch."),
    }
    return model, described


def checkpoint_has_fused_experts(model_dir):
    from safetensors import safe_open

    for shard in sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors")):
        with safe_open(os.path.join(model_dir, shard), "pt") as f:
            if any(n.endswith(".experts.gate_up_proj") for n in f.keys()):
                return True
    return False


def compare_with_checkpoint(model, model_dir):
    """Which checkpoint tensors reached the model unchanged. Fused 3-D experts are matched
    against per-expert Linears and the other way round."""
    import torch
    from safetensors import safe_open

    state = {k: v.detach() for k, v in model.state_dict().items()}
    same, differ, absent = [], [], []
    for shard in sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors")):
        with safe_open(os.path.join(model_dir, shard), "pt") as f:
            for name in f.keys():
                want = f.get_tensor(name)
                pieces = {}
                if name in state:
                    pieces[name] = (state[name], want)
                elif name.endswith(".experts.gate_up_proj") and f"{name[:-len('gate_up_proj')]}0.gate_proj.weight" in state:
                    prefix = name[: -len("gate_up_proj")]
                    inter = want.shape[1] // 2
                    for e in range(want.shape[0]):
                        pieces[f"{prefix}{e}.gate_proj.weight"] = (state.get(f"{prefix}{e}.gate_proj.weight"), want[e, :inter])
                        pieces[f"{prefix}{e}.up_proj.weight"] = (state.get(f"{prefix}{e}.up_proj.weight"), want[e, inter:])
                elif name.endswith(".experts.down_proj") and f"{name[:-len('down_proj')]}0.down_proj.weight" in state:
                    prefix = name[: -len("down_proj")]
                    for e in range(want.shape[0]):
                        pieces[f"{prefix}{e}.down_proj.weight"] = (state.get(f"{prefix}{e}.down_proj.weight"), want[e])
                else:
                    m = re.match(r"(.*\.experts\.)(\d+)\.(gate|up|down)_proj\.weight$", name)
                    if m and f"{m.group(1)}gate_up_proj" in state:
                        e, kind = int(m.group(2)), m.group(3)
                        if kind == "down":
                            got = state[f"{m.group(1)}down_proj"][e]
                        else:
                            fused = state[f"{m.group(1)}gate_up_proj"][e]
                            inter = fused.shape[0] // 2
                            got = fused[:inter] if kind == "gate" else fused[inter:]
                        pieces[name] = (got, want)
                if not pieces:
                    absent.append(name)
                    continue
                ok = all(
                    got is not None and got.shape == w.shape and torch.equal(got.to(w.dtype), w)
                    for got, w in pieces.values()
                )
                (same if ok else differ).append(name)
    return {
        "equal": len(same),
        "different": sorted(differ),
        "not_in_model": sorted(absent),
    }


def shared_global_scales(raw):
    """How many gate_proj/up_proj pairs and q_proj/k_proj/v_proj triples of one parent
    module hold byte-equal `weight_global_scale`s (llm-compressor gives fused layers one)."""
    scale = {n[: -len(".weight_global_scale")]: b for n, (_, _, b) in raw.items() if n.endswith(".weight_global_scale")}
    pairs = [(m, m[: -len("gate_proj")] + "up_proj") for m in scale if m.endswith(".gate_proj")]
    triples = [(m, m[: -len("q_proj")] + "k_proj", m[: -len("q_proj")] + "v_proj") for m in scale if m.endswith(".q_proj")]
    return {
        "gate_up_pairs_equal": sum(all(x in scale for x in p) and scale[p[0]] == scale[p[1]] for p in pairs),
        "gate_up_pairs": len(pairs),
        "q_k_v_triples_equal": sum(all(x in scale for x in t) and scale[t[0]] == scale[t[1]] == scale[t[2]] for t in triples),
        "q_k_v_triples": len(triples),
    }


def passthrough(model_dir, raw, quantized):
    """Compare each unquantized output tensor with the checkpoint's tensor of that name.
    llm-compressor's norm calibration context turns zero-centred `(1 + w)` RMSNorms into
    `w + 1` for calibration and back afterwards, so their f32 bytes can come back as
    f32((w + 1) - 1) rather than w: say which."""
    import numpy as np

    source = safetensors_tensors(model_dir)
    changed, offset_round_trip = [], []
    equal = 0
    for name, (dtype, shape, data) in sorted(raw.items()):
        if name in quantized or name not in source:
            continue
        if source[name][2] == data:
            equal += 1
            continue
        changed.append(name)
        if dtype == "F32" and source[name][0] == "F32":
            w = np.frombuffer(source[name][2], dtype=np.float32)
            one = np.float32(1)
            if ((w + one) - one).astype(np.float32).tobytes() == data:
                offset_round_trip.append(name)
    return {
        "unquantized_equal_to_source": equal,
        "unquantized_changed": changed,
        "changed_equal_to_f32_w_plus_1_minus_1": offset_round_trip,
        "output_tensors_not_in_source": sorted(n for n in raw if n not in quantized and n not in source),
    }


def findings(model_dir, tensors, ignore):
    """Facts read off the output's tensor names."""
    names = sorted(tensors)
    modules_q = sorted({n.rsplit(".", 1)[0] for n in names if n.endswith(".weight_packed")})
    expert_names = [n for n in names if ".experts." in n]
    per_expert = sorted({re.sub(r"\.experts\.\d+\.", ".experts.{e}.", n) for n in expert_names if re.search(r"\.experts\.\d+\.", n)})
    fused = sorted(n for n in expert_names if not re.search(r"\.experts\.\d+\.", n))
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    full_layers = [i for i, t in enumerate(config.get("layer_types", [])) if t == "full_attention"]
    q_proj = {}
    for i in full_layers:
        module = f"model.layers.{i}.self_attn.q_proj"
        q_proj[module] = {
            "quantized": module in modules_q,
            "weight_packed_shape": tensors.get(f"{module}.weight_packed", (None, None))[1],
            "weight_shape": tensors.get(f"{module}.weight", (None, None))[1],
        }
    return {
        "quantized_modules": len(modules_q),
        "expert_tensor_patterns_per_expert": sorted({re.sub(r"model\.layers\.\d+\.", "model.layers.{i}.", n) for n in per_expert}),
        "expert_tensors_fused_3d": fused,
        "expert_modules_quantized": len([m for m in modules_q if ".experts." in m]),
        "expert_weights_left_unquantized": sorted(n for n in expert_names if n.endswith(".weight") or n.endswith("_proj")),
        "mtp_tensors_in_output": sorted(n for n in names if n.startswith("mtp.")),
        "full_attention_q_proj": q_proj,
        "quantized_module_patterns": sorted({re.sub(r"\.\d+\.", ".{n}.", m) for m in modules_q}),
        "ignore": ignore,
    }


def run(model_dir, fixture_path, work, load, scheme, allow_mismatch=False, calib=None):
    import torch

    torch.manual_seed(0)
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    model_dir = model_dir.rstrip("/")
    name = os.path.basename(model_dir)
    sources = sorted(f for f in os.listdir(model_dir) if f != "reference.json")
    out_dir = os.path.join(work, f"{name}.{scheme}")
    started = time.time()
    model, loaded_how = load_model(model_dir, load)
    loaded_how["checkpoint_comparison"] = compare_with_checkpoint(model, model_dir)
    comparison = loaded_how["checkpoint_comparison"]
    lost = comparison["different"] + [n for n in comparison["not_in_model"] if not n.startswith("mtp.")]
    if lost and not allow_mismatch:
        sys.exit(f"{model_dir}: the loaded model does not hold these checkpoint tensors as saved: "
                 f"{lost[:8]}{' ...' if len(lost) > 8 else ''} (--allow-mismatch writes the fixture anyway)")
    loaded = time.time()
    ignore, ignore_from, _ = FAMILIES[loaded_how["model_type"]]
    recipe = QuantizationModifier(targets="Linear", scheme=scheme, ignore=ignore)
    extra = {}
    calibration = None
    if scheme == "NVFP4A16":
        oneshot(model=model, recipe=recipe)
        call = f'oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme="NVFP4A16", ignore={ignore}))'
    else:
        from datasets import Dataset

        if calib["format"] == "text":
            calibration, described = text_windows(model_dir, calib["samples"], calib["seq_len"], calib["text"])
            seq_len = calib["seq_len"]
        else:
            calibration = [list(t.encode("utf-8")) for t in CALIBRATION_TEXTS]
            seq_len = max(len(ids) for ids in calibration)
            described = {"format": "sentences", "texts": CALIBRATION_TEXTS, "tokenize": "UTF-8 bytes"}
        dataset = Dataset.from_dict(
            {"input_ids": calibration, "attention_mask": [[1] * len(ids) for ids in calibration]}
        )
        # What reaches the embedding during oneshot, to check the samples arrive unchanged.
        seen = []
        embed = model.get_input_embeddings()
        hook = embed.register_forward_pre_hook(lambda _m, args: seen.append(args[0].tolist()))
        pipeline = {} if calib["pipeline"] is None else {"pipeline": calib["pipeline"]}
        oneshot(
            model=model,
            dataset=dataset,
            recipe=recipe,
            max_seq_length=seq_len,
            num_calibration_samples=len(calibration),
            shuffle_calibration_samples=False,
            moe_calibrate_all_experts=True,
            **pipeline,
        )
        hook.remove()
        order = []
        for batch in seen:
            for ids in batch:
                index = calibration.index(ids) if ids in calibration else None
                if index is None:
                    sys.exit(f"{model_dir}: the embedding saw ids that are no calibration sample: {ids[:16]}...")
                order.append(index)
        if sorted(set(order)) != list(range(len(calibration))):
            sys.exit(f"{model_dir}: the embedding saw samples {order}, not all of 0..{len(calibration)}")
        described["embed_tokens_order"] = order
        described["batch_shapes_seen"] = sorted({f"{len(b)}x{len(b[0])}" for b in seen})
        call = (
            f'oneshot(model=model, dataset=Dataset.from_dict({{"input_ids": calibration_input_ids, '
            f'"attention_mask": ones}}), recipe=QuantizationModifier(targets="Linear", scheme="{scheme}", '
            f"ignore={ignore}), max_seq_length={seq_len}, num_calibration_samples={len(calibration)}, "
            f"shuffle_calibration_samples=False, moe_calibrate_all_experts=True"
            + "".join(f", {k}={v!r}" for k, v in pipeline.items())
            + ")"
        )
    quantized = time.time()
    in_memory_expert_classes = sorted(
        {type(m).__name__ for n, m in model.named_modules() if n.endswith(".mlp.experts")}
    )
    model.save_pretrained(out_dir, save_compressed=True)
    saved = time.time()

    tensors = safetensors_tensors(out_dir)
    with open(os.path.join(out_dir, "config.json")) as f:
        config = json.load(f)
    digests = {
        n: {"dtype": d, "shape": s, "sha256": hashlib.sha256(b).hexdigest()}
        for n, (d, s, b) in sorted(tensors.items())
        if n.endswith(QUANT_SUFFIXES)
    }
    if scheme != "NVFP4A16":
        scales = {}
        for n, (d, s, b) in sorted(tensors.items()):
            module, _, kind = n.rpartition(".")
            if kind in ("input_global_scale", "weight_global_scale"):
                assert d == "F32" and s == [1], (n, d, s)
                scales.setdefault(module, {})[kind] = struct.unpack("<f", b)[0]
        extra["global_scales"] = scales
        extra["calibration_input_ids"] = calibration
        extra["calibration"] = described
    fixture = {
        "what": f"llm-compressor oneshot(scheme={scheme}) on tests/fixtures/architectures/{name}, "
        "with the ignore list of llm-compressor's example for the family: SHA-256 of each "
        "quantized tensor's safetensors bytes, the tensor set, the config's quantization_config",
        "generated_by": "scripts/reference/moe_nvfp4_reference.py "
        + ("a16" if scheme == "NVFP4A16" else w4a4_args(calib)),
        "model": name,
        "tools": tools(),
        "source": {f: sha256_file(os.path.join(model_dir, f)) for f in sources},
        "load": loaded_how,
        "scheme": scheme,
        "oneshot_call": call,
        "ignore": ignore,
        "ignore_from": f"llmcompressor-0.14.0.1 sdist: {ignore_from}",
        "in_memory_expert_classes_after_oneshot": in_memory_expert_classes,
        "quantization_config": config.get("quantization_config"),
        "tensor_set": {n: [d, s] for n, (d, s, _) in sorted(tensors.items())},
        "tensors": digests,
        "unquantized_sha256": {
            n: hashlib.sha256(b).hexdigest() for n, (_, _, b) in sorted(tensors.items()) if n not in digests
        },
        "findings": {
            **findings(model_dir, {n: (d, s) for n, (d, s, _) in tensors.items()}, ignore),
            "weight_global_scale_sharing": shared_global_scales(tensors),
            "passthrough": passthrough(model_dir, tensors, digests),
        },
        **extra,
    }
    seconds = {
        "load": round(loaded - started, 2),
        "oneshot": round(quantized - loaded, 2),
        "save": round(saved - quantized, 2),
    }
    if scheme == "NVFP4A16":
        fixture["seconds"] = seconds
    print(f"{name}: seconds {seconds}")
    os.makedirs(os.path.dirname(os.path.abspath(fixture_path)), exist_ok=True)
    with open(fixture_path, "w") as f:
        json.dump(fixture, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{name}: {len(digests)} quantized tensors, {len(tensors)} in all -> {fixture_path}; output kept in {out_dir}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    a16 = sub.add_parser("a16")
    a16.add_argument("models", nargs="+")
    a16.add_argument("--out-dir", default="tests/fixtures/nvfp4/architectures")
    a16.add_argument("--work")
    a16.add_argument("--load", choices=["auto", "plain", "context"], default="auto")
    a16.add_argument("--allow-mismatch", action="store_true")
    w4 = sub.add_parser("w4a4")
    w4.add_argument("model")
    w4.add_argument("fixture")
    w4.add_argument("--work")
    w4.add_argument("--load", choices=["auto", "plain", "context"], default="auto")
    w4.add_argument("--allow-mismatch", action="store_true")
    w4.add_argument("--format", choices=["text", "sentences"], default="text",
                    help="consecutive windows of the tokenized text file (default), or the four fixed sentences")
    w4.add_argument("--samples", type=int, default=4, help="--format text: windows to take")
    w4.add_argument("--seq-len", type=int, default=64, help="--format text: tokens per window")
    w4.add_argument("--text", default=DEFAULT_TEXT, help="--format text: the UTF-8 text file")
    w4.add_argument("--pipeline", default=None,
                    help="oneshot's pipeline argument (left out: oneshot's default, 'independent')")
    args = parser.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="moe-nvfp4-reference-")
    if args.command == "a16":
        for model in args.models:
            fixture = os.path.join(args.out_dir, f"{os.path.basename(model.rstrip('/'))}.llmcompressor.json")
            run(model, fixture, work, args.load, "NVFP4A16", args.allow_mismatch)
        return 0
    calib = {"format": args.format, "samples": args.samples, "seq_len": args.seq_len, "text": args.text,
             "pipeline": args.pipeline}
    return run(args.model, args.fixture, work, args.load, "NVFP4", args.allow_mismatch, calib)


if __name__ == "__main__":
    sys.exit(main())
