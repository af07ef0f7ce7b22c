#!/usr/bin/env python3
"""llama.cpp's perplexity over a text, computed the way native_client.py --perplexity does.

    target/bench-py/bin/python scripts/bench/llamacpp_perplexity.py MODEL.gguf TEXTFILE \
        [--label NAME] [--threads N] [--out RESULT.json]

The whole text is one sequence (tokenized by llama.cpp without BOS, like a /v1/completions
prompt), evaluated once with logits for every position (llama-cpp-python's Llama with
logits_all); perplexity = exp(-mean log p(token i | tokens < i)) over tokens 2..N, the
same tokens a server's prompt_logprobs scores. The JSON has native_client.py's shape, so
native_compare.py tables it.

Why not the server: llama-server returns no prompt logprobs, and llama_cpp.server's
OpenAI `echo` + `logprobs` pairs token i with the distribution after token i (one off)
when the prompt does not start with BOS, as SmolLM2's prompts do not (0.3.36).
"""

import argparse
import json
import math
import os
import sys

import numpy as np
from llama_cpp import Llama


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("--label", default="llama.cpp")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out")
    args = ap.parse_args()

    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    llm = Llama(model_path=args.model, n_ctx=4096, n_batch=512, n_threads=args.threads,
                n_threads_batch=args.threads, logits_all=True, verbose=False)
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    if len(tokens) > llm.n_ctx():
        raise SystemExit(f"{len(tokens)} tokens do not fit in n_ctx {llm.n_ctx()}")
    llm.eval(tokens)
    logits = np.asarray(llm.scores[: len(tokens) - 1], dtype=np.float64)  # row i predicts token i+1
    m = logits.max(axis=1, keepdims=True)
    logz = (m + np.log(np.exp(logits - m).sum(axis=1, keepdims=True)))[:, 0]
    target = np.asarray(tokens[1:])
    lps = logits[np.arange(len(target)), target] - logz
    nll = float(-lps.mean())
    res = {
        "label": args.label,
        "model": os.path.basename(args.model),
        "perplexity": {"file": os.path.relpath(args.text), "method": "llama-cpp-python logits_all",
                       "scored_tokens": int(len(lps)), "prompt_tokens": len(tokens),
                       "mean_nll": nll, "perplexity": math.exp(nll)},
    }
    doc = json.dumps(res, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(doc + "\n")
    print(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
