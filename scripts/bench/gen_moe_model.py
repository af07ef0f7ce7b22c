#!/usr/bin/env python3
"""A generated MoE model of Qwen3-30B-A3B's shape, for quantizing at scale where no real
one can be downloaded (scripts/bench/moe_scale.sh). Never committed.

The shape is Qwen3-30B-A3B's config.json (hidden 2048, 48 layers, 32 query and 4 key/value
heads of 128, 128 experts of width 768 with 8 active, vocabulary 151,936, untied), saved
as transformers 5 saves MoE layers: experts fused in 3-D tensors
(`mlp.experts.gate_up_proj` [128, 1536, 2048], `mlp.experts.down_proj` [128, 2048, 768]),
as the Hub's Qwen3.5-MoE checkpoints hold them. bf16, in safetensors shards of about
5 GB with an index.

    python3 scripts/bench/gen_moe_model.py OUT_DIR [--layers N] [--sparse]

Weights: random bytes made into bf16 values of magnitude 2^-7 to 2^-5 with a random sign
(the exponent fixed, sign and mantissa random), norms at 1: only the quantizer's speed and
memory are measured on them. `--layers N` writes the first N of the 48 layers (the full
model is 61 GB). `--sparse` writes every tensor's data as a hole (all zeros, no disk
blocks): the full-size model's memory bound can be measured on a disk that cannot hold it,
though its read rate is then the page cache's zero pages, not the disk's. Needs numpy only.
"""

import argparse
import json
import os
import struct

import numpy as np

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 2048, 48, 32, 4, 128
EXPERTS, ACTIVE, WIDTH, VOCAB = 128, 8, 768, 151936
SHARD_BYTES = 5_000_000_000


def specs(layers):
    out = [("model.embed_tokens.weight", [VOCAB, HIDDEN])]
    for i in range(layers):
        p = f"model.layers.{i}"
        out += [
            (f"{p}.input_layernorm.weight", [HIDDEN]),
            (f"{p}.self_attn.q_proj.weight", [HEADS * HEAD_DIM, HIDDEN]),
            (f"{p}.self_attn.k_proj.weight", [KV_HEADS * HEAD_DIM, HIDDEN]),
            (f"{p}.self_attn.v_proj.weight", [KV_HEADS * HEAD_DIM, HIDDEN]),
            (f"{p}.self_attn.o_proj.weight", [HIDDEN, HEADS * HEAD_DIM]),
            (f"{p}.self_attn.q_norm.weight", [HEAD_DIM]),
            (f"{p}.self_attn.k_norm.weight", [HEAD_DIM]),
            (f"{p}.post_attention_layernorm.weight", [HIDDEN]),
            (f"{p}.mlp.gate.weight", [EXPERTS, HIDDEN]),
            (f"{p}.mlp.experts.gate_up_proj", [EXPERTS, 2 * WIDTH, HIDDEN]),
            (f"{p}.mlp.experts.down_proj", [EXPERTS, HIDDEN, WIDTH]),
        ]
    out += [("model.norm.weight", [HIDDEN]), ("lm_head.weight", [VOCAB, HIDDEN])]
    return out


def shards(all_specs):
    groups, current, size = [], [], 0
    for name, shape in all_specs:
        n = 2 * int(np.prod(shape))
        if current and size + n > SHARD_BYTES:
            groups.append(current)
            current, size = [], 0
        current.append((name, shape))
        size += n
    groups.append(current)
    return groups


def write_shard(path, tensors, rng, sparse):
    header, offset = {}, 0
    for name, shape in tensors:
        n = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        if sparse:
            f.truncate(8 + len(blob) + offset)
            return
        for name, shape in tensors:
            count = int(np.prod(shape))
            if len(shape) == 1:
                f.write(np.full(count, 0x3F80, dtype="<u2").tobytes())  # 1.0
                continue
            for start in range(0, count, 1 << 26):
                bits = rng.integers(0, 1 << 16, size=min(1 << 26, count - start), dtype=np.uint16)
                f.write(((bits & 0x80FF) | 0x3C00).astype("<u2").tobytes())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--sparse", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    groups = shards(specs(args.layers))
    weight_map, total = {}, 0
    for i, tensors in enumerate(groups):
        name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        write_shard(os.path.join(args.out, name), tensors, rng, args.sparse)
        for tensor, shape in tensors:
            weight_map[tensor] = name
            total += 2 * int(np.prod(shape))
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    config = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": HIDDEN,
        "num_hidden_layers": args.layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "num_experts": EXPERTS,
        "num_experts_per_tok": ACTIVE,
        "moe_intermediate_size": WIDTH,
        "intermediate_size": 6144,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "vocab_size": VOCAB,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    print(f"{args.out}: {args.layers} layers, {total / 1e9:.2f} GB in {len(groups)} shards{' (sparse)' if args.sparse else ''}")


if __name__ == "__main__":
    main()
