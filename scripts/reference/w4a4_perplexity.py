"""Perplexity on the Alice text (scripts/bench/data/alice-chapter1.txt) as transformers
computes it, for W4A4 checkpoints under compressed-tensors' own fake quantization, and a
check that compressed-tensors' `QuantizationConfig` accepts each checkpoint's config. Run
by hand with the venv of nvfp4_w4a4_reference.py (it needs PyTorch):

    python scripts/reference/w4a4_perplexity.py SOURCE_MODEL [LABEL=CHECKPOINT_DIR ...]

The source model runs in bf16 with eager attention; each checkpoint is loaded with
`CompressedTensorsConfig(run_compressed=False)`: decompressed weights, and every Linear's
input quantized to NVFP4 in the forward (compressed-tensors' `forward_quantize`). The
whole text is one sequence; perplexity = exp(mean NLL of tokens 2..N), as the native
engine's prompt logprobs give it (scripts/bench/native_client.py --perplexity).
"""

import json
import math
import sys
from pathlib import Path

import torch
from compressed_tensors.quantization import QuantizationConfig
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils.quantization_config import CompressedTensorsConfig

ROOT = Path(__file__).resolve().parents[2]


def perplexity(model, ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits.float()
    logprobs = torch.log_softmax(logits[0, :-1], -1).gather(1, torch.tensor(ids[1:])[:, None])
    return math.exp(-logprobs.mean().item())


def main():
    source = sys.argv[1]
    text = (ROOT / "scripts/bench/data/alice-chapter1.txt").read_text(encoding="utf-8")
    ids = AutoTokenizer.from_pretrained(source)(text)["input_ids"]
    print(f"{len(ids)} tokens, {len(ids) - 1} scored")
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16, attn_implementation="eager")
    print(f"bf16 (source): {perplexity(model, ids):.4f}")
    for spec in sys.argv[2:]:
        label, path = spec.split("=", 1)
        config = json.loads((Path(path) / "config.json").read_text())["quantization_config"]
        QuantizationConfig.model_validate(config)
        model = AutoModelForCausalLM.from_pretrained(
            path,
            dtype=torch.bfloat16,
            attn_implementation="eager",
            quantization_config=CompressedTensorsConfig(run_compressed=False),
        )
        scheme = model.model.layers[0].self_attn.q_proj.quantization_scheme
        assert scheme.input_activations is not None, f"{path}: activations are not quantized"
        print(f"{label}: config accepted by QuantizationConfig; perplexity {perplexity(model, ids):.4f}")


if __name__ == "__main__":
    main()
