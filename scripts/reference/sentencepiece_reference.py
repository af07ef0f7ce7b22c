#!/usr/bin/env python3
"""A tiny llama GGUF with a SentencePiece vocabulary, and transformers' tokenization of it.

No SentencePiece-vocabulary model ships on PyPI small enough for our tests, so this
writes one with gguf-py: a one-layer llama with random weights (seeded) and a ~330-token
vocabulary laid out as llama.cpp writes Llama 2 files (`<unk>`, `<s>`, `</s>`, 256
`<0xNN>` byte tokens, then pieces with scores and no merges, so merges must be recovered
from the scores; plus a control and a user-defined token). transformers reads it
(`AutoTokenizer.from_pretrained(..., gguf_file=...)`) and we record the ids it gives for a
corpus and the text it decodes them to, and its dequantized state dict (weights.json,
as in smollm2_reference.py). `cli/tests/import/sentencepiece.rs` imports the same file
with sous and checks our tokenizer.json and weights against these.

    /work/venv-ref/bin/python scripts/reference/sentencepiece_reference.py \
        --out tests/fixtures/smollm2/sentencepiece-tiny
"""

import argparse
import json
import os
import sys

import gguf
import numpy as np
import transformers
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from smollm2_reference import tensor_entry

CORPUS = [
    "the world is hello",
    "Hello world",
    "hello  there, the other world",
    " leading space and trailing ",
    "line one\nline two",
    "unknown Ω and 🦀 fall back to bytes",
    "<|im_start|>the world<|im_end|>",
    "think <think>hard</think>",
    "",
]

WORDS = ["the", "world", "hello", "there", "other", "is", "and", "line", "one", "two", "to", "back",
         "fall", "bytes", "space", "leading", "trailing", "think", "hard", "unknown"]


def vocabulary():
    tokens, scores, types = [], [], []

    def add(tok, score, kind=gguf.TokenType.NORMAL):
        tokens.append(tok)
        scores.append(score)
        types.append(kind)

    add("<unk>", 0.0, gguf.TokenType.UNKNOWN)
    add("<s>", 0.0, gguf.TokenType.CONTROL)
    add("</s>", 0.0, gguf.TokenType.CONTROL)
    for b in range(256):
        add(f"<0x{b:02X}>", 0.0, gguf.TokenType.BYTE)
    pieces = []
    for w in WORDS:
        # Every prefix and suffix split of "▁word" and "word", so merges can be built
        # bottom-up from single characters.
        for word in ("\u2581" + w, w):
            for i in range(1, len(word) + 1):
                pieces.append(word[:i])
                pieces.append(word[i - 1:])
    pieces += list("abcdefghijklmnopqrstuvwxyzHEW,.")
    seen = set()
    score = -1.0
    for p in pieces:
        if p in seen:
            continue
        seen.add(p)
        add(p, score)
        # Pairs of pieces with one score, to exercise the tie-breaking order.
        score -= 0.5 if len(seen) % 3 else 0.0
    add("<|im_start|>", 0.0, gguf.TokenType.CONTROL)
    add("<|im_end|>", 0.0, gguf.TokenType.CONTROL)
    add("<think>", 0.0, gguf.TokenType.USER_DEFINED)
    add("</think>", 0.0, gguf.TokenType.USER_DEFINED)
    return tokens, scores, types


def write_gguf(path):
    tokens, scores, types = vocabulary()
    hidden, heads, kv, ffn = 32, 2, 1, 64
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny sentencepiece llama")
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    rng = np.random.default_rng(0)

    def t(name, *shape):
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))

    hd = hidden // heads
    t("token_embd.weight", len(tokens), hidden)
    t("blk.0.attn_norm.weight", hidden)
    t("blk.0.attn_q.weight", hidden, hidden)
    t("blk.0.attn_k.weight", kv * hd, hidden)
    t("blk.0.attn_v.weight", kv * hd, hidden)
    t("blk.0.attn_output.weight", hidden, hidden)
    t("blk.0.ffn_norm.weight", hidden)
    t("blk.0.ffn_gate.weight", ffn, hidden)
    t("blk.0.ffn_up.weight", ffn, hidden)
    t("blk.0.ffn_down.weight", hidden, ffn)
    t("output_norm.weight", hidden)
    t("output.weight", len(tokens), hidden)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    name = "tiny-llama-sentencepiece.gguf"
    path = os.path.join(args.out, name)
    write_gguf(path)
    tok = AutoTokenizer.from_pretrained(args.out, gguf_file=name)
    cases = []
    for text in CORPUS:
        ids = tok(text, add_special_tokens=True)["input_ids"]
        cases.append({"text": text, "ids": ids, "decoded": tok.decode(ids)})
    with open(os.path.join(args.out, "tokenizer_cases.json"), "w", encoding="utf-8") as f:
        json.dump({"made_by": f"transformers {transformers.__version__}, gguf {gguf.__version__ if hasattr(gguf, '__version__') else ''}",
                   "gguf": name, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    # The weights too: a GQA layout (2 query heads, 1 KV head) and an untied output.
    model = AutoModelForCausalLM.from_pretrained(args.out, gguf_file=name, dtype=torch.float32)
    weights = {
        "made_by": f"transformers {transformers.__version__}, torch {torch.__version__}",
        "tie_word_embeddings": bool(model.config.tie_word_embeddings),
        "tensors": [tensor_entry(k, v) for k, v in model.state_dict().items()],
    }
    with open(os.path.join(args.out, "weights.json"), "w", encoding="utf-8") as f:
        json.dump(weights, f, indent=1)
        f.write("\n")
    for c in cases:
        print(c["ids"], repr(c["decoded"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
