#!/usr/bin/env python3
"""The W4A4 activation ranges of a tiny MoE model as transformers itself computes them:
the largest magnitude reaching every quantizable Linear's input over sous's calibration
samples, with every token through every expert for the experts' inputs
(llm-compressor's `calibrate_all_experts`), in float32, with the model's own causal
attention. The reference for `sous quantize --scheme nvfp4` where llm-compressor 0.14.0.1
is not one: its sequential pipeline calibrates Qwen3-MoE with attention that sees every
position of a sample (`--check-unmasked` shows that its o_proj scales are those of a
forward with a zero attention mask, exactly), so its ranges are not the model's.

Samples: scripts/bench/data/alice-chapter1.txt tokenized once by the model's tokenizer
without special tokens, the first N windows of exactly L tokens, as `sous quantize
--calibration-format text --samples N --seq-len L` makes them.

    python scripts/reference/causal_calibration.py MODEL_DIR OUT.json [--samples 4] [--seq-len 64]
        [--check-unmasked LLMC_FIXTURE.json]

Needs PyTorch and transformers 5.17 (the venv of moe_nvfp4_reference.py), never CI.
"""

import argparse
import hashlib
import json

import torch
import transformers

TEXT = "scripts/bench/data/alice-chapter1.txt"


def windows(model_dir, samples, seq_len):
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    with open(TEXT, encoding="utf-8") as f:
        text = f.read()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return [ids[i * seq_len : (i + 1) * seq_len] for i in range(samples)]


def ranges(model, samples, mask=None):
    amax = {}

    def raise_to(name, value):
        amax[name] = max(amax.get(name, 0.0), float(value))

    def linear_hook(name):
        return lambda module, args: raise_to(name, args[0].abs().max())

    def experts_hook(name):
        # Every token through every expert: gate/up read the block's input, down reads
        # silu(gate) * up, for each expert whatever the router chose.
        def hook(module, args):
            x = args[0].reshape(-1, args[0].shape[-1])
            experts = module.experts
            for e in range(experts.gate_up_proj.shape[0]):
                gate, up = (x @ experts.gate_up_proj[e].T).chunk(2, dim=-1)
                act = torch.nn.functional.silu(gate) * up
                raise_to(f"{name}.experts.{e}.gate_proj", x.abs().max())
                raise_to(f"{name}.experts.{e}.up_proj", x.abs().max())
                raise_to(f"{name}.experts.{e}.down_proj", act.abs().max())

        return hook

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not name.endswith(("lm_head", "mlp.gate", "shared_expert_gate")):
            if ".linear_attn." not in name:
                module.register_forward_pre_hook(linear_hook(name))
        if hasattr(module, "experts") and hasattr(getattr(module, "experts"), "gate_up_proj"):
            module.register_forward_pre_hook(experts_hook(name))
    with torch.no_grad():
        for sample in samples:
            model(torch.tensor([sample]), attention_mask=mask)
    return amax


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--check-unmasked")
    args = parser.parse_args()
    samples = windows(args.model, args.samples, args.seq_len)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="eager")
    model.eval()
    amax = ranges(model, samples)
    with open(TEXT, "rb") as f:
        text_sha = hashlib.sha256(f.read()).hexdigest()
    fixture = {
        "what": "largest input magnitude of every quantizable Linear (experts: every token through every expert), "
        "transformers' own causal forward in float32",
        "generated_by": "scripts/reference/causal_calibration.py",
        "tools": {"torch": torch.__version__, "transformers": transformers.__version__},
        "calibration": {"file": TEXT, "file_sha256": text_sha, "samples": args.samples, "seq_len": args.seq_len},
        "calibration_input_ids": samples,
        "input_amax": dict(sorted(amax.items())),
    }
    with open(args.out, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    print(f"{len(amax)} modules into {args.out}")
    if args.check_unmasked:
        with open(args.check_unmasked) as f:
            llmc = json.load(f)["global_scales"]
        unmasked = ranges(
            transformers.AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="eager"),
            samples,
            mask=torch.zeros(1, 1, args.seq_len, args.seq_len),
        )
        for name in sorted(n for n in llmc if n.endswith("o_proj")):
            ours = torch.tensor(2688.0) / torch.tensor(unmasked[name])
            print(f"{name}: llm-compressor {llmc[name]['input_global_scale']!r}, unmasked forward "
                  f"{ours.item()!r}, causal forward {(torch.tensor(2688.0) / torch.tensor(amax[name])).item()!r}")


if __name__ == "__main__":
    main()
