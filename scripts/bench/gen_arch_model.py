"""Generated bf16 models of the MoE and hybrid families at a size worth timing, built and
saved by transformers itself (random weights; only the speed is measured on them), for
scripts/bench/moe_hybrid.sh. Needs PyTorch and transformers 5.17 (the venv of
scripts/reference/requirements.txt):

    python scripts/bench/gen_arch_model.py OUT_DIR --arch qwen3_moe --experts 64

--arch qwen3      dense Qwen3 (the peer of the others: same width, layers and heads)
--arch qwen3_moe  Qwen3-MoE, --experts experts of which 2 are active per token, each
                  half the dense MLP's width, so the active MLP equals the dense one
--arch qwen3_5    the dense Qwen3.5 hybrid: three Gated DeltaNet layers to one gated
                  full-attention layer, the dense MLP of qwen3
"""

import argparse

import torch
import transformers

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 1024, 8, 16, 4, 64, 32000
INTERMEDIATE = 3072


def build(arch, experts):
    common = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    if arch == "qwen3":
        return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(intermediate_size=INTERMEDIATE, **common))
    if arch == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(
            intermediate_size=INTERMEDIATE,
            moe_intermediate_size=INTERMEDIATE // 2,
            num_experts=experts,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            **common,
        )
        return transformers.Qwen3MoeForCausalLM(config)
    if arch == "qwen3_5":
        config = transformers.Qwen3_5TextConfig(
            intermediate_size=INTERMEDIATE,
            linear_num_key_heads=8,
            linear_num_value_heads=16,
            linear_key_head_dim=64,
            linear_value_head_dim=64,
            linear_conv_kernel_dim=4,
            layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"] * (LAYERS // 4),
            **common,
        )
        return transformers.Qwen3_5ForCausalLM(config)
    raise SystemExit(f"unknown --arch {arch}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--arch", required=True)
    parser.add_argument("--experts", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = build(args.arch, args.experts).to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    model.save_pretrained(args.out)
    params = sum(p.numel() for p in model.parameters())
    print(f"{args.out}: {args.arch}, {params / 1e6:.1f} M parameters")


if __name__ == "__main__":
    main()
