"""A generated Llama-layout bf16 model of a given size, for quantizing at scale on a
machine where no real model can be downloaded (scripts/gpu-check.sh). Random normal
weights (std 0.02, a few outliers), norms at 1, a config.json the quantizer reads.
Uses PyTorch (on the GPU when there is one) and safetensors:

    python3 scripts/bench/gen_model.py OUT_DIR [--gb 8.5] [--shards 4] [--seed 0]

The default shape is Llama-3-8B's. For decode at the memory wall (benchmarks/native.md, issue 59)
the Llama-3.2-1B-like and 3B-like shapes with SmolLM2's vocabulary and tied embeddings:

    python3 scripts/bench/gen_model.py OUT --shape 1b --shards 1
    python3 scripts/bench/gen_model.py OUT --shape 3b --shards 2
"""

import argparse
import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file


# hidden, MLP width, heads, KV heads, vocabulary, tied embeddings; "layers" fixes the
# depth, otherwise --gb sets it.
SHAPES = {
    "8b": dict(hidden=4096, inter=14336, heads=32, kv_heads=8, vocab=32000, tied=False),
    "1b": dict(hidden=2048, inter=8192, heads=32, kv_heads=8, vocab=49152, tied=True, layers=16),
    "3b": dict(hidden=3072, inter=8192, heads=24, kv_heads=8, vocab=49152, tied=True, layers=28),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--gb", type=float, default=8.5)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    hidden, inter, heads, kv_heads, vocab = (shape[k] for k in ("hidden", "inter", "heads", "kv_heads", "vocab"))
    tied = shape["tied"]
    head_dim = hidden // heads
    per_layer = 2 * (hidden * hidden * 2 + 2 * kv_heads * head_dim * hidden + 3 * hidden * inter)
    fixed = 2 * (1 if tied else 2) * vocab * hidden
    layers = shape.get("layers") or max(1, math.ceil((args.gb * 1e9 - fixed) / per_layer))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(args.seed)

    def weight(rows, cols):
        w = torch.randn(rows, cols, generator=gen, device=device, dtype=torch.float32) * 0.02
        w[::97, ::89] *= 20.0  # outliers, as trained weights have
        return w.to(torch.bfloat16).cpu()

    specs = [("model.embed_tokens.weight", (vocab, hidden))]
    for l in range(layers):
        p = f"model.layers.{l}"
        specs += [
            (f"{p}.input_layernorm.weight", (hidden,)),
            (f"{p}.self_attn.q_proj.weight", (hidden, hidden)),
            (f"{p}.self_attn.k_proj.weight", (kv_heads * head_dim, hidden)),
            (f"{p}.self_attn.v_proj.weight", (kv_heads * head_dim, hidden)),
            (f"{p}.self_attn.o_proj.weight", (hidden, hidden)),
            (f"{p}.post_attention_layernorm.weight", (hidden,)),
            (f"{p}.mlp.gate_proj.weight", (inter, hidden)),
            (f"{p}.mlp.up_proj.weight", (inter, hidden)),
            (f"{p}.mlp.down_proj.weight", (hidden, inter)),
        ]
    specs += [("model.norm.weight", (hidden,))]
    if not tied:
        specs += [("lm_head.weight", (vocab, hidden))]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    per_shard = math.ceil(len(specs) / args.shards)
    index = {"metadata": {"total_size": 0}, "weight_map": {}}
    for s in range(args.shards):
        name = f"model-{s + 1:05d}-of-{args.shards:05d}.safetensors"
        tensors = {}
        for key, shape in specs[s * per_shard : (s + 1) * per_shard]:
            tensors[key] = torch.ones(shape, dtype=torch.bfloat16) if len(shape) == 1 else weight(*shape)
            index["weight_map"][key] = name
            index["metadata"]["total_size"] += tensors[key].numel() * 2
        save_file(tensors, str(out / name), metadata={"format": "pt"})
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": tied,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    print(json.dumps({"layers": layers, "bytes": index["metadata"]["total_size"], "shards": args.shards}))


if __name__ == "__main__":
    main()
