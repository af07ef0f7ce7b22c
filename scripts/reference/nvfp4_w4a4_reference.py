"""The W4A4 NVFP4 reference for sous: llm-compressor's `oneshot` with the NVFP4 scheme
(FP4 weights and FP4 activations) on the SmolLM2 test model, calibrated on fixed token
ids, and what it wrote: every Linear's `input_global_scale` and `weight_global_scale`,
digests of `weight_packed` and `weight_scale`, and the `quantization_config` of
config.json. Run by hand, never in CI (it needs PyTorch):

    python scripts/reference/nvfp4_w4a4_reference.py MODEL_DIR OUT.json [--samples N] [--seq-len L] [--dtype D]
        [--format chat|text]

with llmcompressor==0.14.0.1, compressed-tensors==0.19.0, torch==2.14.0 and
transformers==5.17.0 (llmcompressor's pins).

Calibration samples (`--format chat`, the default): the paragraphs of
scripts/bench/data/alice-chapter1.txt (Lewis Carroll, 1865, public domain), each as one user
message through the model's own chat template (`apply_chat_template(tokenize=False)`, then
the tokenizer with `add_special_tokens=False`, truncated to L tokens), as llm-compressor's
`examples/quantization_w4a4_fp4/llama3_example.py` prepares ultrachat. `--format text`: the
whole text tokenized once without special tokens and cut into consecutive windows of exactly
L tokens, the first N of them (how calibration on a plain corpus is prepared: AutoAWQ's
`get_calib_dataset` concatenates and splits into blocks of the sequence length). The token
ids go into the fixture, so sous calibrates on exactly the same ids.

`--dtype float32` loads the bf16 weights widened to float32 (exactly), so the model runs,
and its scales are computed, in f32 arithmetic: the reference for sous calibrating a
float32 copy of the same weights, where both tools do the same arithmetic and differ only
in the order of their sums. The default, bfloat16, is how llm-compressor's examples run.
"""

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch
from datasets import Dataset
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

import compressed_tensors
import llmcompressor
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import QuantizationModifier

ROOT = Path(__file__).resolve().parents[2]


def windows(tokenizer, count, seq_len, path):
    text = Path(path).read_text(encoding="utf-8")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    out = [ids[i * seq_len : (i + 1) * seq_len] for i in range(len(ids) // seq_len)][:count]
    if len(out) < count:
        sys.exit(f"{path}: {len(ids)} tokens hold {len(out)} windows of {seq_len}, fewer than {count}")
    return out


def samples(tokenizer, count, seq_len, path):
    text = Path(path).read_text(encoding="utf-8")
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n")]
    paragraphs = [p for p in paragraphs if len(p) > 200]
    out = []
    for paragraph in paragraphs[:count]:
        chat = tokenizer.apply_chat_template([{"role": "user", "content": paragraph}], tokenize=False)
        ids = tokenizer(chat, add_special_tokens=False, truncation=True, max_length=seq_len)["input_ids"]
        out.append(ids)
    if len(out) < count:
        sys.exit(f"only {len(out)} paragraphs long enough for {count} samples")
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--work", default=str(ROOT / "target/nvfp4-w4a4-reference"))
    parser.add_argument("--text", default=str(ROOT / "scripts/bench/data/alice-chapter1.txt"),
                        help="calibration text (paragraphs split at blank lines), as `sous quantize --calibration`")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                        help="the dtype the model is loaded in (and so calibrated and quantized in)")
    parser.add_argument("--format", choices=["chat", "text"], default="chat",
                        help="paragraphs through the chat template, or consecutive windows of the plain text")
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prepare = windows if args.format == "text" else samples
    ids = prepare(tokenizer, args.samples, args.seq_len, args.text)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype))
    dataset = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(i) for i in ids]})
    recipe = QuantizationModifier(targets="Linear", scheme="NVFP4", ignore=["lm_head"])
    oneshot(
        model=model,
        dataset=dataset,
        recipe=recipe,
        max_seq_length=args.seq_len,
        num_calibration_samples=len(ids),
        shuffle_calibration_samples=False,
    )
    work = Path(args.work)
    model.save_pretrained(work, save_compressed=True)

    tensors = {}
    tensor_set = {}
    for shard in sorted(work.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            for name in f.keys():
                piece = f.get_slice(name)
                tensor_set[name] = [piece.get_dtype(), list(piece.get_shape())]
                t = f.get_tensor(name)
                module, _, kind = name.rpartition(".")
                entry = tensors.setdefault(module, {})
                if kind in ("input_global_scale", "weight_global_scale"):
                    entry[kind] = float(t.float().item())
                elif kind in ("weight_packed", "weight_scale"):
                    raw = t.view(torch.uint8) if t.dtype != torch.uint8 else t
                    entry[kind + "_sha256"] = hashlib.sha256(raw.contiguous().numpy().tobytes()).hexdigest()
                    entry[kind + "_shape"] = list(t.shape)
    tensors = {k: v for k, v in tensors.items() if "input_global_scale" in v}
    config = json.loads((work / "config.json").read_text())
    fixture = {
        "made_by": (
            f"scripts/reference/nvfp4_w4a4_reference.py: llmcompressor {llmcompressor.__version__}, "
            f"compressed-tensors {compressed_tensors.__version__}, torch {torch.__version__}, {args.dtype} model, "
            f"{len(ids)} {args.format} samples of at most {args.seq_len} tokens, one per forward"
        ),
        "calibration_input_ids": ids,
        "quantization_config": config["quantization_config"],
        "tensor_set": tensor_set,
        "tensors": tensors,
    }
    Path(args.out).write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")
    print(f"{len(tensors)} quantized Linears, {sum(len(i) for i in ids)} calibration tokens -> {args.out}")


if __name__ == "__main__":
    main()
