#!/usr/bin/env python3
"""Reference values for the SmolLM2 test model, made once with transformers.

What it writes to tests/fixtures/smollm2/ (the Rust tests read these; CI never runs this):

- weights.json: transformers' dequantized state dict of the GGUF (float32), one entry per
  tensor: shape, SHA-256 of its float32 bytes and of its bfloat16 bytes (PyTorch's
  round-to-nearest-even cast), the float64 sum, and 8 sampled values.
- tokenizer_cases.json: a corpus (English, code, accents, emoji, CJK, chat special
  tokens, whitespace and digit edge cases) with the ids transformers' GGUF tokenizer
  gives and the text it decodes them back to.
- chat_template_cases.json: `apply_chat_template` output for conversations with the
  GGUF's own template, and for small templates that exercise the environment (tojson,
  raise_exception, namespace, loop controls, Python string methods, whitespace control).
- generation.json: for three prompts, the greedy continuation (48 tokens, EOS not
  special-cased) and the top-5 next-token ids and logits, computed by transformers on the
  GGUF and on the directories `sous import gguf` wrote (float32 and bfloat16 weights,
  both upcast to float32 and computed in float32), with whether they agree. Every greedy
  run also lists `near_ties`: the steps whose top-2 logit gap is below 1e-3 (an argmax
  there may legitimately flip between implementations) and the smallest gap seen.
  Under "batch_prompts": eight short plain-text prompts (no chat template) with their
  input_ids and 48 greedy ids each on the imported directories (greedy_text decodes the
  bfloat16 one, which is what target/models/ holds), for testing that batched generation
  gives what per-prompt generation gives. The float32 and bfloat16 imports may part ways
  on a long continuation ("imported_agree" says whether they did); each is its own
  reference.

It also loads the imported directories' tokenizer with transformers and checks that it
gives the same ids and the same chat prompts as transformers' GGUF tokenizer.

Set-up (outside the repository; versions in requirements.txt):

    python3 -m venv /work/venv-ref
    /work/venv-ref/bin/pip install -r scripts/reference/requirements.txt
    scripts/fetch-test-model.sh          # the GGUF lands in target/cache/
    cargo build --bin sous
    /work/venv-ref/bin/python scripts/reference/smollm2_reference.py \
        --gguf target/cache/SmolLM2-135M-Instruct.Q4_1.gguf \
        --sous target/debug/sous --out tests/fixtures/smollm2
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

TOKENIZER_CORPUS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say it's John's, won't they?",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    'fn main() {\n\tprintln!("{}", 42);\n}\n',
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "HTTPServerError vs. http_server_error vs. httpServerError",
    "Café crème brûlée, naïve façade — São Paulo, Zürich, Ångström, Øresund.",
    "I love 🦀 and 🐍! 👩‍💻🎉 ❤️",
    "机器学习是人工智能的一个分支。日本語のテキストです。한국어 문장입니다.",
    "مرحبا بالعالم — नमस्ते दुनिया — Привет, мир!",
    "The year 2024 had 366 days; pi ≈ 3.14159 and e ≈ 2.71828.",
    "x =  1 and y =   22",
    "  leading spaces\tand\ttabs\n\n\nnewlines   trailing  ",
    "zero\u200bwidth and\u00a0no-break space",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "end<|endoftext|>start",
    "<repo_name>sous<file_sep>cli/src/main.rs<|im_end|>",
    "<|im_start|><|im_end|><|im_start|>",
    "",
]

CONVERSATIONS = [
    {
        "name": "user only, generation prompt",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "add_generation_prompt": True,
    },
    {
        "name": "system and user",
        "messages": [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name three primes."},
        ],
        "add_generation_prompt": True,
    },
    {
        "name": "multi-turn",
        "messages": [
            {"role": "system", "content": "You answer in French."},
            {"role": "user", "content": "Hello!"},
            {"role": "assistant", "content": "Bonjour !"},
            {"role": "user", "content": "How are you?"},
        ],
        "add_generation_prompt": True,
    },
    {
        "name": "multi-turn ending with the assistant, no generation prompt",
        "messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
        ],
        "add_generation_prompt": False,
    },
    {
        "name": "unicode, newlines and braces in content",
        "messages": [
            {"role": "user", "content": "Écris {{ ceci }} et {% cela %}\nligne 2 🦀 机器"},
        ],
        "add_generation_prompt": True,
    },
]

# Templates that exercise the environment transformers renders in, beyond what the
# SmolLM2 template uses.
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city <with> 'quotes' & \"escapes\"",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "maximum": 7}},
                "required": ["city"],
            },
            "temperature": 0.7,
            "big": 1e20,
            "small": 1e-7,
            "count": 3,
            "ok": True,
            "none": None,
        },
    }
]
EXTRA_TEMPLATES = [
    {
        "name": "tojson",
        "template": "{% for m in messages %}{{ m | tojson }}\n{% endfor %}{{ tools | tojson }}\n{{ tools | tojson(indent=2) }}\n{{ tools[0] | tojson(sort_keys=true) }}",
        "messages": [{"role": "user", "content": "é \"q\" <b> \n\t end"}],
        "tools": TOOLS,
        "add_generation_prompt": False,
    },
    {
        "name": "python string and dict methods",
        "template": "{{ messages[0]['content'].strip().upper() }}|{{ messages[0].content.split(' ') | length }}|{% for k, v in messages[0].items() %}{{ k }}={{ v.title() }};{% endfor %}|{{ messages[0].content.startswith('  hi') }}|{{ messages[0].content.replace('hi', 'yo') }}",
        "messages": [{"role": "user", "content": "  hi there friend  "}],
        "add_generation_prompt": False,
    },
    {
        "name": "special tokens, namespace, loop controls",
        "template": "{{ bos_token }}{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'assistant' %}{% continue %}{% endif %}{% set ns.n = ns.n + 1 %}{{ m.role }}{% if loop.last %}{% break %}{% endif %},{% endfor %}:{{ ns.n }}{{ eos_token }}{{ pad_token }}{{ unk_token }}",
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ],
        "add_generation_prompt": False,
    },
    {
        "name": "trim_blocks and lstrip_blocks",
        "template": "{% for message in messages %}\n    {% if message.role == 'user' %}\n    U: {{ message.content }}\n    {% else %}\n    A: {{ message.content }}\n    {% endif %}\n{% endfor %}\n{% if add_generation_prompt %}\n    A:\n{% endif %}\n",
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        "add_generation_prompt": True,
    },
    {
        "name": "raise_exception",
        "template": "{% if messages[0]['role'] != 'system' %}{{ raise_exception('Conversations must start with a system message') }}{% endif %}ok",
        "messages": [{"role": "user", "content": "hi"}],
        "add_generation_prompt": False,
    },
]

PROMPTS = [
    {"name": "chat", "messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {"name": "code", "text": "def fibonacci(n):"},
    {"name": "prose", "text": "The three primary colors are"},
]

# Short, diverse plain-text prompts of different lengths (batched generation pads or packs
# them, so the lengths must differ).
BATCH_PROMPTS = [
    "Once upon a time",
    "The capital of Japan is",
    "import numpy as np\nimport",
    "1, 2, 3, 5, 8, 13,",
    "Water boils at a temperature of",
    "In the year 1905, Albert Einstein published",
    "Q: What is the largest planet in the solar system?\nA:",
    "<html>\n<head>\n<title>",
]

GREEDY_TOKENS = 48
# A greedy step whose top-2 logits are closer than this is reported as a near tie.
NEAR_TIE = 1e-3


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tensor_entry(name, t):
    t = t.detach().contiguous()
    f32 = t.to(torch.float32).contiguous()
    bf16 = f32.to(torch.bfloat16).contiguous()
    flat = f32.reshape(-1)
    n = flat.numel()
    # Fixed, spread-out indices (Knuth's multiplicative hash), first and last included.
    idx = sorted({0, n - 1, *((k * 2654435761) % n for k in range(1, 7))})
    return {
        "name": name,
        "shape": list(t.shape),
        "sha256_f32": hashlib.sha256(f32.numpy().astype("<f4").tobytes()).hexdigest(),
        "sha256_bf16": hashlib.sha256(bf16.view(torch.int16).numpy().astype("<i2").tobytes()).hexdigest(),
        "sum": float(f32.to(torch.float64).sum()),
        "samples": [[i, float(flat[i])] for i in idx],
    }


def weights_fixture(model, gguf_sha):
    sd = model.state_dict()
    tied = bool(model.config.tie_word_embeddings)
    entries = []
    for name, t in sd.items():
        if tied and name == "lm_head.weight":
            continue
        entries.append(tensor_entry(name, t))
    return {
        "made_by": f"transformers {transformers.__version__}, torch {torch.__version__}",
        "gguf_sha256": gguf_sha,
        "tie_word_embeddings": tied,
        "tensors": entries,
    }


def tokenizer_fixture(tok):
    cases = []
    for text in TOKENIZER_CORPUS:
        ids = tok(text, add_special_tokens=True)["input_ids"]
        cases.append({"text": text, "ids": ids, "decoded": tok.decode(ids)})
    return {"made_by": f"transformers {transformers.__version__}", "cases": cases}


def render(tok, template, case):
    kwargs = dict(tokenize=False, add_generation_prompt=case["add_generation_prompt"])
    if template is not None:
        kwargs["chat_template"] = template
    if case.get("tools") is not None:
        kwargs["tools"] = case["tools"]
    try:
        return {"rendered": tok.apply_chat_template(case["messages"], **kwargs)}
    except Exception as e:  # the template's raise_exception
        return {"error": str(e)}


def chat_fixture(tok):
    return {
        "made_by": f"transformers {transformers.__version__}",
        "template": tok.chat_template,
        "special_tokens": {
            "bos_token": tok.bos_token,
            "eos_token": tok.eos_token,
            "unk_token": tok.unk_token,
            "pad_token": tok.pad_token,
        },
        "cases": [dict(case, **render(tok, None, case)) for case in CONVERSATIONS],
        "extra_templates": [dict(case, **render(tok, case["template"], case)) for case in EXTRA_TEMPLATES],
    }


def prompt_ids(tok, prompt):
    if "messages" in prompt:
        text = tok.apply_chat_template(prompt["messages"], tokenize=False, add_generation_prompt=True)
    else:
        text = prompt["text"]
    return text, tok(text, add_special_tokens=True)["input_ids"]


@torch.no_grad()
def run_model(model, ids):
    """Top-5 of the next token after `ids`, and GREEDY_TOKENS argmax steps (no KV cache, so
    every step is one plain forward pass)."""
    x = torch.tensor([ids])
    logits = model(x).logits[0, -1].to(torch.float32)
    top = torch.topk(logits, 5)
    greedy, near_ties, min_gap = [], [], float("inf")
    for step in range(GREEDY_TOKENS):
        step_logits = model(x).logits[0, -1].to(torch.float32)
        top2 = torch.topk(step_logits, 2)
        gap = float(top2.values[0] - top2.values[1])
        min_gap = min(min_gap, gap)
        if gap < NEAR_TIE:
            near_ties.append(step)
        nxt = int(top2.indices[0])
        greedy.append(nxt)
        x = torch.cat([x, torch.tensor([[nxt]])], dim=1)
    return {
        "top5_ids": [int(i) for i in top.indices],
        "top5_logits": [round(float(v), 4) for v in top.values],
        "greedy_ids": greedy,
        "near_ties": near_ties,
        "min_top2_gap": round(min_gap, 6),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--sous", required=True, help="the sous binary, to import the GGUF")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    gguf_dir, gguf_name = os.path.split(os.path.abspath(args.gguf))
    gguf_sha = sha256_file(args.gguf)
    os.makedirs(args.out, exist_ok=True)

    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32).eval()

    def write(name, value):
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            json.dump(value, f, ensure_ascii=False, indent=1)
            f.write("\n")

    write("weights.json", weights_fixture(model, gguf_sha))
    write("tokenizer_cases.json", tokenizer_fixture(tok))
    chat = chat_fixture(tok)
    write("chat_template_cases.json", chat)

    with tempfile.TemporaryDirectory() as tmp:
        imported = {}
        for dtype in ("f32", "bf16"):
            out = os.path.join(tmp, dtype)
            subprocess.run([args.sous, "import", "gguf", args.gguf, "--out", out, "--dtype", dtype], check=True)
            imported[dtype] = out

        # Our tokenizer files, read by transformers, must give the same ids and prompts.
        ours = AutoTokenizer.from_pretrained(imported["bf16"])
        tokenizer_agrees = all(
            ours(c, add_special_tokens=True)["input_ids"] == tok(c, add_special_tokens=True)["input_ids"]
            for c in TOKENIZER_CORPUS
        )
        template_agrees = all(render(ours, None, case) == render(tok, None, case) for case in CONVERSATIONS)

        models = {"gguf": model}
        for dtype, path in imported.items():
            models[f"imported_{dtype}"] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

        prompts = []
        for prompt in PROMPTS:
            text, ids = prompt_ids(tok, prompt)
            entry = {"name": prompt["name"], "text": text, "input_ids": ids}
            for label, m in models.items():
                entry[label] = run_model(m, ids)
            g = entry["gguf"]
            for label in models:
                if label != "gguf":
                    o = entry[label]
                    entry[f"{label}_agrees"] = o["greedy_ids"] == g["greedy_ids"] and o["top5_ids"] == g["top5_ids"]
            entry["greedy_text"] = tok.decode(g["greedy_ids"])
            entry["near_ties"] = sorted({s for label in models for s in entry[label]["near_ties"]})
            prompts.append(entry)

        # Plain-text prompts for batched generation, on the imported directories only.
        batch_prompts = []
        for text in BATCH_PROMPTS:
            ids = tok(text, add_special_tokens=True)["input_ids"]
            entry = {"text": text, "input_ids": ids}
            for label in ("imported_f32", "imported_bf16"):
                entry[label] = run_model(models[label], ids)
            entry["imported_agree"] = entry["imported_f32"]["greedy_ids"] == entry["imported_bf16"]["greedy_ids"]
            entry["greedy_text"] = tok.decode(entry["imported_bf16"]["greedy_ids"])
            entry["near_ties"] = sorted(
                {s for label in ("imported_f32", "imported_bf16") for s in entry[label]["near_ties"]}
            )
            batch_prompts.append(entry)

    write(
        "generation.json",
        {
            "made_by": f"transformers {transformers.__version__}, torch {torch.__version__}, float32 compute",
            "gguf_sha256": gguf_sha,
            "greedy_tokens": GREEDY_TOKENS,
            "imported_tokenizer_agrees": tokenizer_agrees,
            "imported_chat_template_agrees": template_agrees,
            "near_tie_threshold": NEAR_TIE,
            "prompts": prompts,
            "batch_prompts": batch_prompts,
        },
    )
    summary = {
        p["name"]: {k: v for k, v in p.items() if k.endswith("_agrees")} for p in prompts
    }
    batch = {p["text"]: {"imported_agree": p["imported_agree"], "near_ties": p["near_ties"]} for p in batch_prompts}
    near = {p["name"]: p["near_ties"] for p in prompts}
    print(json.dumps({"tokenizer": tokenizer_agrees, "template": template_agrees, "prompts": summary,
                      "near_ties": near, "batch_prompts": batch}, indent=1))
    if not (tokenizer_agrees and template_agrees and all(all(v.values()) for v in summary.values())):
        print("MISMATCH between transformers on the GGUF and on the imported model", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
